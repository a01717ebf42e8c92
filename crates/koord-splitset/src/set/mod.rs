//! Split sets, format v2 (`koord-bundle-split v2`, normative text in `bundle-spec/README.md`
//! §8): parts for media with a size limit, each starting with a copy of the set's signed
//! header, optionally followed by parity parts of Reed–Solomon recovery data ([`crate::parity`]).
//!
//! - **Every part carries the header** (and says which part it is and of which set), so any
//!   surviving part opens the set, and a renamed, swapped or foreign part is recognised by its
//!   content, not by its name ([`open`]).
//! - **Every block is digested in the header** (the first 16 bytes of its BLAKE3 hash, 128-bit
//!   second-preimage resistance; about 4× faster than sha256 here, which took 41 % of `split`'s
//!   time): damage is found where it is, and one damaged block costs one block of the stripe,
//!   not a part.
//! - **Stripes**: block `j` of every data part and of every parity part form stripe `j`; with
//!   `n` parity parts any `n` damaged or missing blocks of a stripe are rebuilt. A data part
//!   shorter than the first one counts as zeros beyond its end (never damaged, never stored).
//! - **Or one code over the whole set** (`split --spread`, [`spread`]): any `n` parts' worth of
//!   damaged blocks are rebuilt wherever they are, as par2 does, at the price of speed (a
//!   rebuild reads the whole set, and a reader rebuilds every damaged block on the first one it
//!   meets).
//! - **Readers repair on the fly** ([`Set::read_block`], [`SetReader`]) and keep a log of what
//!   they rebuilt ([`Set::repairs`]); [`repair`] writes damaged parts back whole; damage beyond
//!   `n` in a stripe is refused with a [`DamageReport`] naming the parts and blocks.
//!
//! # Block size and header size
//!
//! The block size `B` is the power of two nearest above 1/2048 of a data part, at least 4 KiB
//! (a page, two DVD sectors) and at most 1 MiB (16 DVD ECC blocks, 16 Blu-ray clusters: a read
//! error on a disc loses whole ECC blocks, so smaller blocks would find no finer damage there),
//! halved while a stripe, `(k + n) × B`, exceeds [`STRIPE_BUDGET`]. The block table holds 16
//! bytes per block of every part and is in every part's header: a set of 25 GB Blu-ray parts
//! has 23,842 blocks of 1 MiB per part, 373 KiB of table per part of the set (1.8 MiB of table
//! for 4 discs and 1 parity disc, in each of them: 0.007 % of a disc); a 470 MiB bundle in 47 MiB
//! parts with 2 parity parts has 32 KiB blocks and a 282 KiB table (0.6 %).
//!
//! # Memory
//!
//! Whatever the bundle size: readers hold one stripe at most, `(k + n) × B ≤ 64 MiB`, to
//! rebuild a block; the writer and [`repair`] hold two groups of whole stripes (one being read
//! or written by a thread of its own while the other is coded), together at most
//! [`STRIPE_BUDGET`] (64 MiB), plus the coder's slice (at most
//! [`crate::parity::SLICE_BUDGET`], 32 MiB), plus the block table (at most [`MAX_TABLE`],
//! 16 MiB): at most 112 MiB.

pub(crate) mod header;
mod open;
mod pass;
mod read;
pub(crate) mod spread;
mod write;

pub use header::MAGIC;
pub(crate) use open::has_v2_siblings;
pub use open::{open, Note, MAX_SCAN};
pub(crate) use pass::check;
pub use pass::{repair, HeaderCopyDamage, Repaired};
pub use read::{PartRepairs, Repair, SetReader};
pub use write::{split, split_open, SplitOptions};

use crate::oci::Digest;
use crate::parity::ParityError;
use crate::sign::SignError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The `format` of the header JSON.
pub const FORMAT: &str = "koord-bundle-split/v2";
/// The name of the erasure code in the header: per stripe (block `j` of every part).
pub const CODE: &str = "reed-solomon-gf16-leopard";
/// The name of the set-wide erasure code (`split --spread`): every block of the set is one
/// shard of a single code.
pub const CODE_SPREAD: &str = "reed-solomon-gf16-leopard-set";
/// Largest block of a set-wide code (the code takes at most 65536 blocks, data and parity:
/// with 20 % parity, about 3 TiB of bundle).
pub const MAX_SPREAD_BLOCK: u64 = 64 << 20;
/// The block digest: the first 16 bytes of the block's BLAKE3 hash.
pub const BLOCK_DIGEST: &str = "blake3-128";
/// Bytes of a block digest.
pub(crate) const DIGEST_LEN: usize = 16;
/// Smallest and largest block size.
pub const MIN_BLOCK: u64 = 4096;
/// See [`MIN_BLOCK`].
pub const MAX_BLOCK: u64 = 1 << 20;
/// Bytes of one stripe at most (a group of whole stripes when writing and repairing).
pub const STRIPE_BUDGET: u64 = 64 << 20;
/// Largest block table.
pub const MAX_TABLE: u64 = 16 << 20;
/// Most parts in a set (`STRIPE_BUDGET / MIN_BLOCK`: a stripe of 4 KiB blocks within the
/// budget): 1 GiB in parts of the 64 KiB minimum, 75 TB in DVDs.
pub const MAX_PARTS: usize = (STRIPE_BUDGET / MIN_BLOCK) as usize;
/// Largest header JSON.
pub const MAX_JSON: u64 = 16 << 20;
/// Largest header signature.
pub const MAX_SIG: usize = 4096;
/// Longest magic line read, its `\n` included.
pub const MAX_MAGIC_LINE: u64 = 64;
/// Longest part line read, its `\n` included (a longer one names no part).
pub const MAX_PART_LINE: u64 = 256;
/// Longest length line read (of the JSON, the signature, the block table), its `\n` included.
pub const MAX_LENGTH_LINE: u64 = 24;
/// Longest file name of the bundle and of a part, in bytes.
pub const MAX_FILE_NAME: usize = 255;
/// The header area is padded to a multiple of this (so data starts on a sector boundary).
pub(crate) const ALIGN: u64 = 4096;

/// A file and its content's size and digest.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PartInfo {
    /// File name (no directory).
    pub file: String,
    /// Bytes.
    pub size: u64,
    /// sha256.
    pub sha256: Digest,
}

/// A file name with no directory part: not empty, not `.` or `..`, no `/`, `\\` or control
/// characters (NUL included), not starting with `-` (so it is never read as an option). Names that
/// come from inside a bundle or a part header must pass this before they touch the file system.
pub fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.starts_with('-')
        && name.len() <= MAX_FILE_NAME
        && !name
            .chars()
            .any(|c| c == '/' || c == '\\' || c.is_control())
}

/// The header of a v2 split set (JSON; its sha256 is the set's identity).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetHeader {
    /// [`FORMAT`].
    pub format: String,
    /// The whole bundle: its file name, size and sha256.
    pub bundle: PartInfo,
    /// The part size asked for: no part file is larger.
    pub part_size: u64,
    /// Where the data starts in every part file (the header area before it, padded).
    pub data_offset: u64,
    /// Bytes of a block.
    pub block_size: u64,
    /// Data parts (`k`): the bundle's bytes in order.
    pub data_parts: usize,
    /// Parity parts (`n`): recovery data, after the data parts.
    pub parity_parts: usize,
    /// [`CODE`].
    pub code: String,
    /// Every part, data parts first: its file name and the bytes of data it carries.
    pub parts: Vec<PartEntry>,
    /// [`BLOCK_DIGEST`].
    pub block_digest: String,
    /// The block table that follows the signature: its size and sha256.
    pub block_table: TableInfo,
}

/// One part in the header.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PartEntry {
    /// File name (no directory).
    pub file: String,
    /// Bytes of data (after the header area).
    pub size: u64,
}

/// The block table's size and digest.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TableInfo {
    /// Bytes.
    pub size: u64,
    /// sha256.
    pub sha256: Digest,
}

/// Failures of v2 split sets.
#[derive(Debug, thiserror::Error)]
pub enum SetError {
    /// I/O on a file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A header copy is malformed (and no other part of its set has an intact one).
    #[error("{path}: not a valid split header ({reason}), and no other part of {} next to it has an intact one{}{}", seen.want.as_deref().map(|w| format!("its set ({w}, as its part line says)")).unwrap_or_else(|| "a set that names it as its part".into()), tried_list(&seen.tried), others_list(&seen.others))]
    Header {
        /// The part named.
        path: PathBuf,
        /// Why its own copy is refused.
        reason: String,
        /// What was seen next to it.
        seen: Box<Seen>,
    },
    /// The header's signature does not verify (in any part's copy).
    #[error("{path}: split header signature: {source}")]
    Signature {
        /// The part named.
        path: PathBuf,
        /// Why.
        source: SignError,
    },
    /// More damage than the parity parts can rebuild.
    #[error("{0}")]
    Beyond(Box<DamageReport>),
    /// A block that cannot be rebuilt, met while reading ([`repair`] reports the whole picture).
    #[error("split set {set}: block {block} of {file} is damaged and cannot be rebuilt: its stripe has {} damaged blocks ({}) and the set has {parity} parity part{}", damaged.len(), damaged.join(", "), if *parity == 1 { "" } else { "s" })]
    Stripe {
        /// The part named.
        set: PathBuf,
        /// The part whose block was read.
        file: String,
        /// The block.
        block: u64,
        /// The parts whose block of that stripe is damaged.
        damaged: Vec<String>,
        /// Parity parts.
        parity: usize,
    },
    /// `repair` would write over a file of another set.
    #[error("{path} belongs to another split set{}: move it away (repair writes part {part} of this set there), then run repair again", bundle.as_deref().map(|b| format!(" (of {})", crate::text::printable(b))).unwrap_or_default())]
    Foreign {
        /// The file.
        path: PathBuf,
        /// The part that goes there.
        part: usize,
        /// Its set's bundle.
        bundle: Option<String>,
    },
    /// Parts this small leave no room for the header.
    #[error("parts of {size} bytes are too small for {bundle} ({total} bytes): every part starts with the set's header, which needs {header} bytes here; give a larger size")]
    HeaderTooLarge {
        /// The bundle.
        bundle: PathBuf,
        /// The part size asked for.
        size: u64,
        /// The bundle's size.
        total: u64,
        /// Room the header needs.
        header: u64,
    },
    /// Too many parts.
    #[error("{bundle}: {parts} parts of {size} bytes are too many ({what}): give a larger size")]
    TooManyParts {
        /// The bundle.
        bundle: PathBuf,
        /// Parts it would take.
        parts: usize,
        /// The part size asked for.
        size: u64,
        /// The limit.
        what: String,
    },
    /// A block rebuilt from parity does not match the block table: the parity parts do not
    /// code this data (a forged or mis-made set; only an unsigned header can say so).
    #[error("{path}: block {block}, rebuilt from parity, does not match its digest in the header: the parity parts do not belong to this data (a forged or mis-made set); nothing was written")]
    Rebuilt {
        /// The part the block belongs to.
        path: PathBuf,
        /// The block.
        block: u64,
    },
    /// A bundle whose file name its parts cannot be named after.
    #[error("{}: its file name has a control character, a slash or a leading '-', or is too long: a split set's parts are named after the bundle, and readers refuse such names; rename the bundle first", crate::text::printable(&bundle.display().to_string()))]
    BadName {
        /// The bundle.
        bundle: PathBuf,
    },
    /// The erasure code cannot take this shape.
    #[error("{path}: {source}")]
    Parity {
        /// The bundle or part.
        path: PathBuf,
        /// Why.
        source: ParityError,
    },
}

impl koord_base::exit::Classify for SetError {
    fn exit_class(&self) -> Option<koord_base::exit::ExitClass> {
        match self {
            // Reading a part: missing, a directory (the input) or the disk (the machine).
            SetError::Io { .. } => None,
            SetError::Signature { source, .. } => source.exit_class(),
            SetError::Parity { source, .. } => source.exit_class(),
            // Damage beyond repair, a bad header, parts too small or too many, a file of
            // another set.
            _ => Some(koord_base::exit::ExitClass::Input),
        }
    }
}

/// What was seen next to a part whose header is damaged, looking for another copy.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Files of its set tried (their copies damaged too).
    pub(crate) tried: Vec<PathBuf>,
    /// The set its part line names, when that line is intact.
    pub(crate) want: Option<String>,
    /// Parts of other sets (never read as its set).
    pub(crate) others: Vec<OtherSet>,
}

/// A part of another split set, seen next to a part whose header is damaged.
#[derive(Debug, Clone)]
pub struct OtherSet {
    /// The file.
    pub(crate) path: PathBuf,
    /// Its set id.
    pub(crate) set: String,
    /// Its set's bundle, when its header was read.
    pub(crate) bundle: Option<String>,
}

fn others_list(others: &[OtherSet]) -> String {
    if others.is_empty() {
        return String::new();
    }
    let named = others.iter().map(|o| {
        format!(
            "{} (set {}{})",
            o.path.display(),
            o.set,
            o.bundle
                .as_deref()
                .map(|b| format!(", of {}", crate::text::printable(b)))
                .unwrap_or_default()
        )
    });
    format!(
        "; next to it {} of other split sets, never read as its set: {}; copy the part again, or name a part of the set you mean",
        if others.len() == 1 { "is a part" } else { "are parts" },
        bounded_list(named, "parts", ", ")
    )
}

fn tried_list(tried: &[PathBuf]) -> String {
    if tried.is_empty() {
        return String::new();
    }
    let names: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
    format!(" (tried {})", names.join(", "))
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SetError + '_ {
    move |source| SetError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where everything is: sizes and block counts derived from a header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Header area (data offset in every part).
    pub(crate) data_offset: u64,
    /// Block size.
    pub(crate) block: u64,
    /// Data parts.
    pub(crate) k: usize,
    /// Parity parts.
    pub(crate) n: usize,
    /// Bytes of data in each part (data parts, then parity parts).
    pub(crate) sizes: Vec<u64>,
    /// Where each part's digests start in the block table (in blocks), and the total.
    starts: Vec<u64>,
    /// The parity parts hold a set-wide code ([`CODE_SPREAD`]): every block of the set is a
    /// shard (its index is its place in the block table), each parity part is whole blocks.
    pub(crate) spread: bool,
}

impl Geometry {
    /// The layout of a bundle of `total` bytes in data parts of `stride` bytes (the last
    /// shorter) with `n` parity parts, blocks of `block` bytes.
    pub(crate) fn new(total: u64, stride: u64, n: usize, block: u64, data_offset: u64) -> Geometry {
        let mut sizes = Geometry::data_sizes(total, stride);
        let k = sizes.len();
        let parity = sizes[0].next_multiple_of(2);
        sizes.extend(std::iter::repeat_n(parity, n));
        Geometry::from_sizes(sizes, k, n, block, data_offset)
    }

    /// [`Geometry::new`] for a set-wide code: every parity part holds as many whole blocks as
    /// the first data part has blocks (so `n` parity parts rebuild `n` lost data parts).
    pub(crate) fn new_spread(
        total: u64,
        stride: u64,
        n: usize,
        block: u64,
        data_offset: u64,
    ) -> Geometry {
        let mut sizes = Geometry::data_sizes(total, stride);
        let k = sizes.len();
        let whole = sizes[0].div_ceil(block) * block;
        sizes.extend(std::iter::repeat_n(whole, n));
        Geometry {
            spread: true,
            ..Geometry::from_sizes(sizes, k, n, block, data_offset)
        }
    }

    /// Bytes of each data part: `total` in parts of `stride` (the last shorter; one part at
    /// least).
    fn data_sizes(total: u64, stride: u64) -> Vec<u64> {
        let stride = stride.max(1);
        let k = total.div_ceil(stride).max(1);
        (0..k)
            .map(|i| (total - (i * stride).min(total)).min(stride))
            .collect()
    }

    /// A set-wide code: its original shards (every block of the data parts).
    pub(crate) fn originals(&self) -> usize {
        self.starts[self.k] as usize
    }

    /// A set-wide code: its recovery shards (every block of the parity parts).
    pub(crate) fn recovery(&self) -> usize {
        (self.starts[self.sizes.len()] - self.starts[self.k]) as usize
    }

    /// A set-wide code: the part and block of shard `i`.
    pub(crate) fn shard_block(&self, i: usize) -> (usize, u64) {
        let i = i as u64;
        let p = self.starts.partition_point(|&s| s <= i) - 1;
        (p, i - self.starts[p])
    }

    /// The block size of a set-wide code of `total` bytes in data parts of `stride` bytes with
    /// `n` parity parts: the power of two nearest above 1/4096 of the bundle (about twice as
    /// many blocks as par2 makes by default: damage is found and rebuilt at least as finely), at
    /// least 4 KiB, doubled while the code would have more shards than it can take
    /// (reed-solomon-simd 3: the power of two at or above the parity blocks, plus the data
    /// blocks, at most 65536). `None` when even [`MAX_SPREAD_BLOCK`] is too small, or a block
    /// would be larger than a part.
    pub(crate) fn spread_block_for(total: u64, stride: u64, n: usize) -> Option<u64> {
        let mut b = total.div_ceil(4096).next_power_of_two().max(MIN_BLOCK);
        loop {
            if b > MAX_SPREAD_BLOCK || b > stride.max(MIN_BLOCK) {
                return None;
            }
            let g = Geometry::new_spread(total, stride, n, b, 0);
            if crate::parity::Coder::new(g.originals(), g.recovery()).is_ok() {
                return Some(b);
            }
            b *= 2;
        }
    }

    fn from_sizes(sizes: Vec<u64>, k: usize, n: usize, block: u64, data_offset: u64) -> Geometry {
        let mut starts = Vec::with_capacity(sizes.len() + 1);
        let mut at = 0u64;
        for s in &sizes {
            starts.push(at);
            at += s.div_ceil(block);
        }
        starts.push(at);
        Geometry {
            data_offset,
            block,
            k,
            n,
            sizes,
            starts,
            spread: false,
        }
    }

    /// Parts in all.
    pub fn parts(&self) -> usize {
        self.k + self.n
    }

    /// Bundle bytes per data part (the first data part's size).
    pub(crate) fn stride(&self) -> u64 {
        self.sizes[0]
    }

    /// Blocks of part `p`.
    pub(crate) fn blocks(&self, p: usize) -> u64 {
        self.starts[p + 1] - self.starts[p]
    }

    /// Stripes: the first data part's blocks.
    pub(crate) fn stripes(&self) -> u64 {
        self.blocks(0)
    }

    /// Blocks in the whole set (entries of the block table).
    pub(crate) fn total_blocks(&self) -> u64 {
        self.starts[self.sizes.len()]
    }

    /// Index of block `b` of part `p` in the block table.
    pub(crate) fn table_index(&self, p: usize, b: u64) -> usize {
        (self.starts[p] + b) as usize
    }

    /// Bytes of block `b` of part `p` (0 beyond its end).
    pub(crate) fn block_len(&self, p: usize, b: u64) -> u64 {
        self.sizes[p].saturating_sub(b * self.block).min(self.block)
    }

    /// Bytes of every shard of stripe `j` (a block, the last one padded to an even length).
    pub(crate) fn shard_len(&self, j: u64) -> u64 {
        self.block_len(0, j).next_multiple_of(2)
    }

    /// Size of part `p`'s file.
    pub(crate) fn file_len(&self, p: usize) -> u64 {
        self.data_offset + self.sizes[p]
    }

    /// Which data part and offset in it hold byte `offset` of the bundle.
    pub(crate) fn locate(&self, offset: u64) -> (usize, u64) {
        let stride = self.stride().max(1);
        let p = ((offset / stride) as usize).min(self.k - 1);
        (p, offset - p as u64 * stride)
    }

    /// Groups for a pass over parts `0..count` that works on one group while a thread of its
    /// own reads or writes another. A group is at most `STRIPE_BUDGET / share` (at least one
    /// block): whole stripes when a stripe fits, which a code per stripe needs (its stripes are
    /// within the budget: [`header::geometry_of`]); for a set-wide code, whose pass codes
    /// nothing, a stripe of many large blocks (200 blocks of 64 MiB: 12.5 GiB) is cut into
    /// runs of parts. Two sets of group buffers, or one when a group takes more than half the
    /// budget, so the buffers stay within [`STRIPE_BUDGET`] for every geometry a header can
    /// describe.
    pub(crate) fn groups(&self, count: usize, share: u64) -> Groups {
        let cap = STRIPE_BUDGET / share;
        let stripe = count as u64 * self.block;
        let (per, chunk) = if stripe <= cap || !self.spread {
            ((cap / stripe.max(1)).max(1), count)
        } else {
            (1, ((cap / self.block).max(1) as usize).min(count))
        };
        let bytes = chunk as u64 * per * self.block;
        Groups {
            per,
            chunk,
            sets: if 2 * bytes <= STRIPE_BUDGET { 2 } else { 1 },
        }
    }

    /// The block size for data parts of `stride` bytes in a set of `parts` parts: see the
    /// module docs.
    pub(crate) fn block_for(stride: u64, parts: usize) -> u64 {
        let mut b = stride
            .div_ceil(2048)
            .next_power_of_two()
            .clamp(MIN_BLOCK, MAX_BLOCK);
        while b > MIN_BLOCK && (parts as u64).saturating_mul(b) > STRIPE_BUDGET {
            b /= 2;
        }
        b
    }
}

/// How a pass over a set is cut ([`Geometry::groups`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Groups {
    /// Stripes per group.
    pub(crate) per: u64,
    /// Parts per group (all of them, unless a stripe is larger than a group).
    pub(crate) chunk: usize,
    /// Sets of group buffers.
    pub(crate) sets: usize,
}

/// One group of a pass: stripes `j0..j1` of parts `q0..q1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unit {
    pub(crate) j0: u64,
    pub(crate) j1: u64,
    pub(crate) q0: usize,
    pub(crate) q1: usize,
}

impl Groups {
    /// Bytes of one part's buffer in a group.
    pub(crate) fn buffer(&self, g: &Geometry) -> usize {
        (self.per * g.block) as usize
    }

    /// A set of group buffers.
    pub(crate) fn buffers(&self, g: &Geometry) -> Vec<Vec<u8>> {
        vec![vec![0u8; self.buffer(g)]; self.chunk]
    }

    /// The groups of a pass over parts `0..count`, a run of parts at a time (each part's
    /// stripes in order, so it is read and written front to back).
    pub(crate) fn units(self, g: &Geometry, count: usize) -> impl Iterator<Item = Unit> + '_ {
        (0..count).step_by(self.chunk.max(1)).flat_map(move |q0| {
            let q1 = (q0 + self.chunk).min(count);
            // A code per stripe codes every stripe of the set; a run of parts has its own.
            let stripes = if q1 - q0 == count {
                g.stripes()
            } else {
                (q0..q1).map(|q| g.blocks(q)).max().unwrap_or(0)
            };
            (0..stripes).step_by(self.per as usize).map(move |j0| Unit {
                j0,
                j1: (j0 + self.per).min(stripes),
                q0,
                q1,
            })
        })
    }
}

/// What is damaged in a set, and whether the parity parts can rebuild it.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DamageReport {
    /// The set (the part named).
    pub(crate) set: PathBuf,
    /// Parity parts of the set.
    pub(crate) parity: usize,
    /// A set-wide code (`split --spread`): the damaged blocks it rebuilds, wherever they are
    /// (its recovery blocks); `None` for a code per stripe.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) spread: Option<u64>,
    /// Damaged blocks in all.
    pub(crate) damaged_blocks: u64,
    /// Damaged parts.
    pub parts: Vec<PartDamage>,
    /// Stripes with more damaged blocks than parity parts: (stripe, damaged blocks).
    pub(crate) beyond: Vec<(u64, usize)>,
    /// How many more parity parts would have rebuilt everything.
    pub(crate) more_parity_needed: usize,
    /// Parts to copy again so that every stripe can be rebuilt (fewest first found).
    pub(crate) copy_again: Vec<String>,
    /// What was found when the parts were looked for (short, renamed, foreign parts...).
    pub(crate) notes: Vec<String>,
}

/// The damage of one part.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PartDamage {
    /// Index in the set.
    pub(crate) index: usize,
    /// Its file name.
    pub(crate) file: String,
    /// It is missing (every block).
    pub(crate) missing: bool,
    /// Damaged blocks (all of them when missing).
    pub(crate) blocks: Vec<u64>,
    /// Blocks it has.
    pub(crate) of: u64,
}

impl DamageReport {
    /// True when every stripe can be rebuilt (a set-wide code: when there are no more damaged
    /// blocks than recovery blocks).
    pub(crate) fn repairable(&self) -> bool {
        match self.spread {
            Some(r) => self.damaged_blocks <= r,
            None => self.beyond.is_empty(),
        }
    }

    /// Work out `beyond`, `more_parity_needed` and `copy_again` from `parts`.
    fn conclude(&mut self) {
        use std::collections::BTreeMap;
        self.damaged_blocks = self.parts.iter().map(|p| p.blocks.len() as u64).sum();
        if let Some(r) = self.spread {
            self.conclude_spread(r);
            return;
        }
        let mut per_stripe: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for (i, p) in self.parts.iter().enumerate() {
            for &b in &p.blocks {
                per_stripe.entry(b).or_default().push(i);
            }
        }
        self.beyond = per_stripe
            .iter()
            .filter(|(_, v)| v.len() > self.parity)
            .map(|(&j, v)| (j, v.len()))
            .collect();
        self.more_parity_needed = self
            .beyond
            .iter()
            .map(|&(_, d)| d - self.parity)
            .max()
            .unwrap_or(0);
        // Greedy, in one pass (issue 30 item 6: recomputing the scores after every choice was
        // quadratic in the parts, 29 s for one forged part claiming 4,095): the parts in the
        // most over-budget stripes first (then the most damaged, a missing one, then the
        // first), each taken while a stripe it is in has more damaged blocks than parity parts.
        // Every over-budget stripe is brought within budget: all its parts are looked at.
        let parity = self.parity;
        let over: Vec<Vec<usize>> = per_stripe
            .into_values()
            .filter(|v| v.len() > parity)
            .collect();
        let mut excess: Vec<usize> = over.iter().map(|v| v.len() - parity).collect();
        let mut stripes_of: Vec<Vec<usize>> = vec![Vec::new(); self.parts.len()];
        for (s, v) in over.iter().enumerate() {
            for &i in v {
                stripes_of[i].push(s);
            }
        }
        let damage = |i: usize| self.parts[i].blocks.len();
        let mut order: Vec<usize> = (0..self.parts.len())
            .filter(|&i| !stripes_of[i].is_empty())
            .collect();
        order.sort_by_key(|&i| {
            (
                std::cmp::Reverse(stripes_of[i].len()),
                std::cmp::Reverse(damage(i)),
                i,
            )
        });
        let mut chosen = Vec::new();
        for i in order {
            if stripes_of[i].iter().any(|&s| excess[s] > 0) {
                chosen.push(i);
                for &s in &stripes_of[i] {
                    excess[s] = excess[s].saturating_sub(1);
                }
            }
        }
        chosen.sort_unstable();
        self.copy_again = chosen
            .into_iter()
            .map(|i| self.parts[i].file.clone())
            .collect();
    }

    /// Every damaged block as a shard of a set-wide code (its place in the block table), in order.
    pub(crate) fn shards(&self, g: &Geometry) -> Vec<usize> {
        let mut out: Vec<usize> = self
            .parts
            .iter()
            .flat_map(|d| d.blocks.iter().map(move |&b| g.table_index(d.index, b)))
            .collect();
        out.sort_unstable();
        out
    }

    /// [`DamageReport::conclude`] for a set-wide code of `r` recovery blocks: the parity parts
    /// missing are the excess in parity parts' worth of blocks; copied again, the most damaged
    /// parts first, until what is left is within `r`.
    fn conclude_spread(&mut self, r: u64) {
        let over = self.damaged_blocks.saturating_sub(r);
        let per = if self.parity == 0 {
            1
        } else {
            (r / self.parity as u64).max(1)
        };
        self.more_parity_needed = over.div_ceil(per) as usize;
        let mut order: Vec<usize> = (0..self.parts.len()).collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(self.parts[i].blocks.len()), i));
        let mut left = self.damaged_blocks;
        let mut chosen = Vec::new();
        for i in order {
            if left <= r {
                break;
            }
            left -= self.parts[i].blocks.len() as u64;
            chosen.push(i);
        }
        chosen.sort_unstable();
        self.copy_again = chosen
            .into_iter()
            .map(|i| self.parts[i].file.clone())
            .collect();
    }
}

/// Most items of one list in a message.
const MAX_LISTED: usize = 12;

/// The first [`MAX_LISTED`] items joined by `sep`, then how many more `what` there are.
fn bounded_list<T: fmt::Display>(
    items: impl ExactSizeIterator<Item = T>,
    what: &str,
    sep: &str,
) -> String {
    let n = items.len();
    let mut out: Vec<String> = items.take(MAX_LISTED).map(|i| i.to_string()).collect();
    if n > MAX_LISTED {
        out.push(format!("… and {} more {what}", n - MAX_LISTED));
    }
    out.join(sep)
}

/// `3, 7, 10-14` for sorted block numbers.
fn ranges(blocks: &[u64]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < blocks.len() {
        let start = blocks[i];
        let mut end = start;
        while i + 1 < blocks.len() && blocks[i + 1] == end + 1 {
            i += 1;
            end = blocks[i];
        }
        out.push(if end == start {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        if out.len() == 12 {
            out.push("…".into());
            break;
        }
        i += 1;
    }
    out.join(", ")
}

impl fmt::Display for PartDamage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.missing {
            let blocks = if self.of == 1 { "block" } else { "blocks" };
            write!(f, "{}: missing ({} {blocks})", self.file, self.of)
        } else {
            write!(
                f,
                "{}: {} of {} blocks damaged (block {})",
                self.file,
                self.blocks.len(),
                self.of,
                ranges(&self.blocks)
            )
        }
    }
}

impl fmt::Display for DamageReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Bounded: a forged header can claim 16,384 parts, every one missing.
        let parts = bounded_list(self.parts.iter(), "damaged parts", "; ");
        let stripes: Vec<u64> = self.beyond.iter().map(|&(j, _)| j).collect();
        let worst = self.beyond.iter().map(|&(_, d)| d).max().unwrap_or(0);
        let found = if self.notes.is_empty() {
            String::new()
        } else {
            format!(
                " (found: {})",
                bounded_list(self.notes.iter(), "notes", "; ")
            )
        };
        if let Some(r) = self.spread {
            return write!(
                f,
                "split set {}: damage beyond repair: {}{found}; {} damaged blocks in all, and the {} parity part{} (a code over the whole set) {} at most {r} blocks wherever they are: {} more parity part{} would have been needed; copy again {} (then the rest can be rebuilt)",
                self.set.display(),
                parts,
                self.damaged_blocks,
                self.parity,
                if self.parity == 1 { "" } else { "s" },
                if self.parity == 1 { "rebuilds" } else { "rebuild" },
                self.more_parity_needed,
                if self.more_parity_needed == 1 { "" } else { "s" },
                bounded_list(self.copy_again.iter(), "parts", ", "),
            );
        }
        if self.parity == 0 {
            return write!(
                f,
                "split set {}: {}{found}: the set has no parity parts to rebuild from: copy again {} (split with --parity N for sets that rebuild lost or damaged parts)",
                self.set.display(),
                parts,
                bounded_list(self.copy_again.iter(), "parts", ", "),
            );
        }
        write!(
            f,
            "split set {}: damage beyond repair: {}{found}; {} stripe{} ({}) {} up to {worst} damaged blocks, and the {} parity part{} {} at most {} per stripe: {} more parity part{} would have been needed; copy again {} (then every stripe can be rebuilt)",
            self.set.display(),
            parts,
            stripes.len(),
            if stripes.len() == 1 { "" } else { "s" },
            ranges(&stripes),
            if stripes.len() == 1 { "has" } else { "have" },
            self.parity,
            if self.parity == 1 { "" } else { "s" },
            if self.parity == 1 { "rebuilds" } else { "rebuild" },
            self.parity,
            self.more_parity_needed,
            if self.more_parity_needed == 1 { "" } else { "s" },
            bounded_list(self.copy_again.iter(), "parts", ", "),
        )
    }
}

/// One part as opened: where it was found, if anywhere.
#[derive(Debug)]
pub(crate) struct Slot {
    /// Where it is (or would be: the header's name next to the part named).
    pub(crate) path: PathBuf,
    /// The open file, when found.
    pub(crate) file: Option<File>,
    /// Its length on disk.
    pub(crate) len: u64,
    /// Its header area needs writing again (damaged, or it is not where the header puts it).
    pub(crate) rewrite: bool,
}

/// An opened v2 set: the header trusted so far, every part found, and what was repaired.
pub struct Set {
    /// The part named.
    pub path: PathBuf,
    /// The header.
    pub header: SetHeader,
    /// Its JSON (the set's identity is its sha256).
    pub(crate) json: Vec<u8>,
    /// The signature of the JSON, when signed (from the copy that was used).
    pub(crate) signature: Option<Vec<u8>>,
    /// The block table.
    pub(crate) table: Vec<u8>,
    /// The layout.
    pub(crate) geometry: Geometry,
    /// What was found when the parts were looked for.
    pub notes: Vec<Note>,
    pub(crate) slots: Vec<Slot>,
    pub(crate) log: Mutex<read::Log>,
    pub(crate) observer: Mutex<Option<Observer>>,
    /// The coder of the last block rebuilt while reading, kept for the next one (it keeps the
    /// coefficients of its erasure pattern: a lost part is the same pattern in every stripe).
    pub(crate) coder: Mutex<Option<crate::parity::Coder>>,
    /// A set-wide code: the damaged data blocks, rebuilt all at once on the first damaged
    /// block read ([`spread::Spill`]).
    pub(crate) spill: Mutex<Option<Arc<spread::Spill>>>,
}

/// Told of every block rebuilt while reading.
pub(crate) type Observer = Arc<dyn Fn(&Repair) + Send + Sync>;

impl fmt::Debug for Set {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Set")
            .field("path", &self.path)
            .field("parts", &self.slots.len())
            .field("geometry", &self.geometry)
            .finish()
    }
}

impl Set {
    /// The set's identity: the first 16 bytes of the header JSON's sha256, in hex.
    pub(crate) fn id(&self) -> String {
        header::set_id(&self.json)
    }

    /// Parts of the set (data and parity).
    pub fn part_count(&self) -> usize {
        self.slots.len()
    }

    /// Data parts: parts `0..data_parts()`; the parity parts follow.
    pub fn data_parts(&self) -> usize {
        self.geometry.k
    }

    /// Bytes of data in parts `parts` (the bundle's bytes in data parts, the code's in parity
    /// parts; the headers not counted): what reading them takes.
    pub fn data_bytes(&self, parts: std::ops::Range<usize>) -> u64 {
        self.geometry.sizes.get(parts).map_or(0, |s| s.iter().sum())
    }

    /// Where part `p` is (or would be).
    pub(crate) fn part_path(&self, p: usize) -> &Path {
        &self.slots[p].path
    }

    /// Whether part `p` was found (a part missing, or of another set in its place, was not).
    pub fn found(&self, p: usize) -> bool {
        self.slots.get(p).is_some_and(|s| s.file.is_some())
    }

    /// The expected digest of block `b` of part `p`.
    pub(crate) fn expected(&self, p: usize, b: u64) -> &[u8] {
        let i = self.geometry.table_index(p, b) * DIGEST_LEN;
        &self.table[i..i + DIGEST_LEN]
    }

    /// Check the header's signature with `pk`: this copy's, else any other part's copy of the
    /// same header (a signature damaged in one part is read from another). Returns whether the
    /// header is signed.
    pub(crate) fn verify_header(&self, pk: &minisign::PublicKey) -> Result<bool, SetError> {
        Ok(header::verify_any(self, pk)?.is_some())
    }

    /// The header's signature that `pk` verifies, from whichever part's copy holds it intact
    /// (the header's minisign signature); `None` when unsigned.
    pub fn good_signature(&self, pk: &minisign::PublicKey) -> Result<Option<Vec<u8>>, SetError> {
        header::verify_any(self, pk)
    }
}

/// The file name of part `i` of a set of `k` data parts of the bundle `name`: data parts
/// `NAME.partNNN`, parity parts `NAME.parityNNN` (numbered from 0 among the parity parts), at
/// least three digits. A part's name comes from these and nothing else: a header naming a part
/// otherwise is refused ([`header::geometry_of`]), so no header can point a writer at another file.
pub(crate) fn part_file_name(name: &str, i: usize, k: usize) -> String {
    if i < k {
        format!("{name}.part{i:03}")
    } else {
        format!("{name}.parity{:03}", i - k)
    }
}

/// Whether `file` is the name part `i` may have: [`part_file_name`], or (a parity part of a set
/// written before parity parts had a name of their own) `NAME.partNNN`.
pub(crate) fn is_part_file_name(file: &str, name: &str, i: usize, k: usize) -> bool {
    file == part_file_name(name, i, k) || (i >= k && file == format!("{name}.part{i:03}"))
}

/// Whether `path` is named like a part: `NAME.partNNN` or `NAME.parityNNN`.
pub fn looks_like_part(path: &Path) -> bool {
    let numbered = |(stem, num): (&str, &str)| {
        !stem.is_empty() && num.len() >= 3 && num.bytes().all(|b| b.is_ascii_digit())
    };
    path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
        n.rsplit_once(".part").is_some_and(numbered)
            || n.rsplit_once(".parity").is_some_and(numbered)
    })
}

/// The first 16 bytes of the BLAKE3 hash of `bytes`.
pub(crate) fn block_digest(bytes: &[u8]) -> [u8; DIGEST_LEN] {
    let full = blake3::hash(bytes);
    let mut out = [0u8; DIGEST_LEN];
    out.copy_from_slice(&full.as_bytes()[..DIGEST_LEN]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_of_a_set() {
        // 1 000 000 bytes in parts of 300 000, 2 parity parts, 4 KiB blocks.
        let g = Geometry::new(1_000_000, 300_000, 2, 4096, 8192);
        assert_eq!(g.k, 4);
        assert_eq!(
            g.sizes,
            vec![300_000, 300_000, 300_000, 100_000, 300_000, 300_000]
        );
        assert_eq!(g.stripes(), 74);
        assert_eq!(g.blocks(3), 25);
        assert_eq!(g.block_len(0, 73), 300_000 - 73 * 4096);
        assert_eq!(g.block_len(3, 30), 0);
        assert_eq!(g.shard_len(73), (300_000 - 73 * 4096) as u64);
        assert_eq!(g.total_blocks(), 74 * 5 + 25);
        assert_eq!(g.locate(650_000), (2, 50_000));
        assert_eq!(g.locate(999_999), (3, 99_999));
        // An odd first part: the parity parts round it up to an even length.
        let g = Geometry::new(1001, 1001, 1, 4096, 4096);
        assert_eq!(g.sizes, vec![1001, 1002]);
        assert_eq!(g.shard_len(0), 1002);
    }

    #[test]
    fn groups_stay_within_the_stripe_budget() {
        let gr = |per, chunk, sets| Groups { per, chunk, sets };
        // 6 parts of 4 KiB blocks: groups of an eighth of the budget, two sets.
        let g = Geometry::new(1_000_000, 300_000, 2, 4096, 8192);
        assert_eq!(g.groups(6, 8), gr((8 << 20) / (6 * 4096), 6, 2));
        // 64 parts of 1 MiB blocks: one stripe is the whole budget, one set of one stripe.
        let g = Geometry::new(64 << 20, 1 << 20, 0, 1 << 20, 4096);
        assert_eq!(g.groups(64, 4), gr(1, 64, 1));
        // 20 parts of 1 MiB: one stripe per group, two sets of 20 MiB.
        let g = Geometry::new(20 << 20, 1 << 20, 0, 1 << 20, 4096);
        assert_eq!(g.groups(20, 8), gr(1, 20, 2));
        // A set-wide code of 200 blocks of 64 MiB (a stripe of 12.5 GiB): one block at a time,
        // one set of buffers.
        let g = Geometry::new_spread(199 << 26, 1 << 26, 1, 1 << 26, 4096);
        let plan = g.groups(g.parts(), 8);
        assert_eq!(plan, gr(1, 1, 1));
        assert_eq!(plan.units(&g, g.parts()).count(), 200);
        // 1367 parts of 3 blocks of 128 KiB (split --spread of 512 MiB into 512 KiB parts): runs
        // of 64 parts, two sets of 8 MiB, every block of every part in exactly one group.
        let g = Geometry::new_spread((1366 * 3) << 17, 3 << 17, 1, 1 << 17, 4096);
        let plan = g.groups(g.parts(), 8);
        assert_eq!(plan, gr(1, 64, 2));
        let mut seen = vec![0u64; g.parts()];
        for u in plan.units(&g, g.parts()) {
            assert!(u.q1 - u.q0 <= plan.chunk && u.j1 - u.j0 <= plan.per);
            for s in &mut seen[u.q0..u.q1] {
                *s += u.j1 - u.j0;
            }
        }
        assert!((0..g.parts()).all(|q| seen[q] == g.blocks(q)), "{seen:?}");
        let plan = g.groups(g.parts(), 4);
        assert!(plan.sets as u64 * plan.chunk as u64 * plan.per * g.block <= STRIPE_BUDGET);
    }

    #[test]
    fn block_sizes_follow_the_part_size() {
        assert_eq!(Geometry::block_for(60 * 1024, 30), 4096);
        assert_eq!(Geometry::block_for(47 << 20, 12), 32 * 1024);
        assert_eq!(Geometry::block_for(4_700_000_000, 8), 1 << 20);
        assert_eq!(Geometry::block_for(25_000_000_000, 5), 1 << 20);
        // Many parts: a stripe stays within the budget.
        assert_eq!(Geometry::block_for(4_700_000_000, 200), 256 * 1024);
    }

    #[test]
    fn damage_report_names_what_to_copy_again() {
        let part = |index: usize, blocks: Vec<u64>, missing: bool| PartDamage {
            index,
            file: format!("b.part{index:03}"),
            missing,
            blocks,
            of: 10,
        };
        let mut r = DamageReport {
            set: "b.part000".into(),
            parity: 2,
            parts: vec![
                part(1, (0..10).collect(), true),
                part(4, vec![3, 7], false),
                part(6, vec![3, 4, 5], false),
                part(7, vec![9], false),
            ],
            ..Default::default()
        };
        r.conclude();
        assert_eq!(r.beyond, vec![(3, 3)]);
        assert_eq!(r.more_parity_needed, 1);
        assert_eq!(r.copy_again, vec!["b.part001".to_string()]);
        let text = r.to_string();
        assert!(text.contains("b.part001: missing (10 blocks)"), "{text}");
        assert!(
            text.contains("b.part006: 3 of 10 blocks damaged (block 3-5)"),
            "{text}"
        );
        assert!(text.contains("1 more parity part would"), "{text}");
        r.parity = 3;
        r.conclude();
        assert!(r.repairable());
    }
}
