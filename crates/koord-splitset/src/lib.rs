#![doc = include_str!("../README.md")]
//!
//! ## The modules
//!
//! Lowest first:
//! - `parity`: the erasure code (reed-solomon-simd, GF(2^16)), sliced to bound memory;
//! - `set`: the set format v2 — the header, the block table (BLAKE3-128 per block), the
//!   writer ([`split`]), readers that repair on the fly ([`SetReader`]), [`repair`], and the
//!   set-wide code of `spread` sets;
//! - `parts`: a bundle on disk, one file or a set of parts (v1 sets still read), [`join`];
//! - `atomic`: files written to a temporary name and renamed over their destination when
//!   complete ([`AtomicFile`]), and a bundle's resumable temporary file ([`PartialFile`]).
//!
//! Every error type says its exit class ([`koord_base::exit::Classify`]).
#![deny(missing_docs)]

mod atomic;
mod parity;
mod parts;
mod set;

// koord-base's modules, at the paths this crate's code names them by.
use koord_base::{bounded, fsio, oci, sign, text};

pub use atomic::{leftovers, partial_path, AtomicFile, PartialFile};
pub use parity::ParityError;
pub use parts::{join, parse_size, BundleFile, PartsError};
pub use set::{
    is_plain_file_name, looks_like_part, open, repair, split, split_open, Note, PartInfo, Repair,
    Set, SetError, SetReader, SplitOptions,
};
// The types the functions and fields above hand out.
pub use atomic::Leftover;
pub use parts::{PartsReader, Segment};
pub use set::{DamageReport, HeaderCopyDamage, OtherSet, PartDamage, PartRepairs, Repaired, Seen};

/// The format's names and limits (`bundle-spec/README.md` §8 states them; koord-bundle's
/// `tests/it/spec.rs` checks the two agree) and its headers, for readers of the format.
pub mod format {
    pub use crate::parts::{SplitHeader, MAX_HEADER, MAX_LINE, MIN_PART_SIZE};
    pub use crate::set::{
        PartEntry, SetHeader, TableInfo, BLOCK_DIGEST, CODE, CODE_SPREAD, FORMAT, MAGIC, MAX_BLOCK,
        MAX_FILE_NAME, MAX_JSON, MAX_LENGTH_LINE, MAX_MAGIC_LINE, MAX_PARTS, MAX_PART_LINE,
        MAX_SCAN, MAX_SIG, MAX_SPREAD_BLOCK, MAX_TABLE, MIN_BLOCK, STRIPE_BUDGET,
    };
}

/// The class of one error of a chain when its type is one of this crate's or koord-base's:
/// `Some(decision)`; `None` for another crate's type (see [`koord_base::exit::code_of`]).
pub fn class_of(
    e: &(dyn std::error::Error + 'static),
) -> Option<Option<koord_base::exit::ExitClass>> {
    koord_base::exit_classes!(e;
        crate::parity::ParityError,
        crate::parts::PartsError,
        crate::set::SetError,
    )
    .or_else(|| koord_base::class::class_of(e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use koord_base::exit::{Classify as _, ExitClass};
    use std::io::{Error, ErrorKind};
    use std::path::PathBuf;

    /// Each error says its class where it is defined (what `set_code` and `parts_code` of
    /// koord-bundle's `cmd` said): the input's, the machine's, or its cause's (`None`).
    #[test]
    fn every_error_says_its_class() {
        let p = || PathBuf::from("b.tar.part000");
        let io = SetError::Io {
            path: p(),
            source: Error::from(ErrorKind::NotFound),
        };
        assert_eq!(io.exit_class(), None, "the io::Error decides");
        let bad_name = SetError::BadName { bundle: p() };
        assert_eq!(bad_name.exit_class(), Some(ExitClass::Input));
        let coder = || SetError::Parity {
            path: p(),
            source: ParityError::Coder("bug".into()),
        };
        assert_eq!(coder().exit_class(), Some(ExitClass::Machine), "a bug");
        let too_few = SetError::Parity {
            path: p(),
            source: ParityError::TooFew { have: 1, need: 2 },
        };
        assert_eq!(too_few.exit_class(), Some(ExitClass::Input));
        let sig = SetError::Signature {
            path: p(),
            source: koord_base::sign::SignError::Sign("no".into()),
        };
        assert_eq!(
            sig.exit_class(),
            Some(ExitClass::Machine),
            "the signature's own"
        );
        assert_eq!(
            PartsError::Set(coder()).exit_class(),
            Some(ExitClass::Machine),
            "a set's error inside a parts error keeps its class"
        );
        assert_eq!(
            PartsError::BadSize("x".into()).exit_class(),
            Some(ExitClass::Input)
        );
    }
}
