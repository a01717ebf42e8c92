//! What writing a bundle shares: its errors, the checksum file and signature, the tar headers,
//! and whole-file gzip. The tar itself is laid out and filled by `bundle::writer`: checksum file
//! and signature first (so a reader can check the signature before anything else), then the
//! bundle manifest, the OCI layout files, chart, CRDs and the blobs in digest order, in a
//! temporary file beside the output, fsynced and renamed: an interrupted or failed build never
//! leaves a file at the output path.

use super::checksums::Checksums;
use crate::oci::Digest;
use koord_splitset::AtomicFile;
use minisign::SecretKey;
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};

/// Optional whole-file compression (layers are already compressed; plain tar is the default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Plain tar.
    None,
    /// gzip.
    Gzip,
}

/// Pack failures.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// Writing the output failed (disk full, permissions); no file was left at the output path.
    #[error("writing the bundle {path} failed: {source} (nothing was left at that path; the cache is intact)")]
    Write {
        /// Output path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The plan cannot be a bundle at all: sizes beyond what a file holds, a bundle larger than
    /// the whole file system it is to be written to, a blob planned with two sizes. Nothing
    /// was written.
    #[error("bundle {path} cannot be written: {reason}")]
    Plan {
        /// Output path.
        path: PathBuf,
        /// Why, with the sizes (and the largest blob and its image, when known).
        reason: String,
    },
    /// A cached blob no longer matches its digest.
    #[error("cached blob {digest} is corrupt (digest {actual}); it was removed from the cache: run the build again to fetch it")]
    CorruptCache {
        /// Expected.
        digest: Digest,
        /// Actual.
        actual: Digest,
    },
    /// Signing failed.
    #[error(transparent)]
    Sign(#[from] super::sign::SignError),
}

impl crate::exit::Classify for PackError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        use crate::exit::ExitClass as C;
        match self {
            // A `.partial` hard-linked to another file is the user's to remove.
            PackError::Write { source, .. } if crate::store::file::HardLinked::is(source) => {
                Some(C::Input)
            }
            // The output and the cache are ours: a failure there is the machine's.
            PackError::Write { .. } | PackError::CorruptCache { .. } => Some(C::Machine),
            // Sizes no file or disk holds: what the registries declared.
            PackError::Plan { .. } => Some(C::Input),
            PackError::Sign(s) => crate::exit::Classify::exit_class(s),
        }
    }
}

/// Sizes of what was written.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PackStats {
    /// Bytes of the bundle file.
    pub bytes: u64,
    /// Files in the tar.
    pub files: usize,
}

/// Checksums of `files` and `blobs` and their signature: (SHA256SUMS, signature).
pub fn checksum_and_sign(
    files: &[(String, Vec<u8>)],
    blobs: &[(Digest, u64)],
    tools: &[(String, Digest, u64)],
    signer: Option<(&SecretKey, &str)>,
) -> Result<(Vec<u8>, Option<Vec<u8>>), PackError> {
    let mut sums = Checksums::default();
    for (p, b) in files {
        sums.0.insert(p.clone(), Digest::of(b));
    }
    for (d, _) in blobs {
        sums.0.insert(d.layout_path(), d.clone());
    }
    for (p, d, _) in tools {
        sums.0.insert(p.clone(), d.clone());
    }
    let text = sums.render().into_bytes();
    let sig = match signer {
        Some((sk, comment)) => Some(super::sign::sign(sk, &text, comment)?.into_bytes()),
        None => None,
    };
    Ok((text, sig))
}

/// The header of a regular file or directory entry (the path is set by whoever appends it).
pub(crate) fn header(size: u64, mtime: u64, dir: bool) -> tar::Header {
    header_mode(size, mtime, dir, if dir { 0o755 } else { 0o644 })
}

/// [`header`] with a mode of its own (0755 for the programs a bundle carries).
pub(crate) fn header_mode(size: u64, mtime: u64, dir: bool, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_size(size);
    h.set_mtime(mtime);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mode(mode);
    h.set_entry_type(if dir {
        tar::EntryType::Directory
    } else {
        tar::EntryType::Regular
    });
    let _ = h.set_username("");
    let _ = h.set_groupname("");
    h
}

/// Compress the plain bundle `plain` into `out` (whole-file gzip): returns the compressed size.
pub fn gzip(plain: &std::fs::File, out: &AtomicFile, dest: &Path) -> Result<u64, PackError> {
    let werr = |source: io::Error| PackError::Write {
        path: dest.to_path_buf(),
        source,
    };
    let mut src =
        io::BufReader::with_capacity(1 << 20, crate::store::file::Positioned::new(plain, 0));
    let file = out.file().try_clone().map_err(werr)?;
    let mut gz = flate2::write::GzEncoder::new(
        BufWriter::with_capacity(1 << 20, file),
        flate2::Compression::default(),
    );
    io::copy(&mut src, &mut gz).map_err(werr)?;
    let buf = gz.finish().map_err(werr)?;
    buf.into_inner().map_err(|e| werr(e.into_error()))?;
    Ok(out.file().metadata().map_err(werr)?.len())
}
