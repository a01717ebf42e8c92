//! Writing the bundle tar: checksum file and signature first (so a reader can check the
//! signature before anything else), then the bundle manifest, the OCI layout files, chart, CRDs
//! and the blobs in digest order. Written to a temporary file beside the output, fsynced and
//! renamed: an interrupted or failed build never leaves a file at the output path.

use super::atomic::AtomicFile;
use super::checksums::Checksums;
use super::{CHECKSUMS_FILE, SIGNATURE_FILE};
use crate::oci::{Digest, Sha256Writer};
use crate::store::BlobCache;
use minisign::SecretKey;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
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

/// What goes into the tar.
pub struct PackInput<'a> {
    /// Small files held in memory, by path.
    pub files: Vec<(String, Vec<u8>)>,
    /// Blobs, from the cache.
    pub blobs: Vec<(Digest, u64)>,
    /// The cache.
    pub cache: &'a BlobCache,
    /// Modification time of every entry (seconds since the epoch).
    pub mtime: u64,
    /// Blobs whose digest was checked in this run: copied without hashing them again. Every
    /// other blob (reused from the cache) is re-hashed as it is copied.
    pub verified: &'a std::collections::BTreeSet<Digest>,
    /// Signing key and trusted comment; `None` writes an unsigned bundle.
    pub signer: Option<(&'a SecretKey, String)>,
    /// Compression.
    pub compress: Compression,
}

/// Sizes of what was written.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PackStats {
    /// Bytes of the bundle file.
    pub bytes: u64,
    /// Files in the tar.
    pub files: usize,
    /// sha256 of the bundle file, to compare copies across sites.
    pub sha256: Digest,
}

/// The tar's byte sink: the file, hashed and counted, optionally behind gzip.
enum Sink {
    Plain(Sha256Writer<BufWriter<File>>),
    Gzip(flate2::write::GzEncoder<Sha256Writer<BufWriter<File>>>),
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sink::Plain(w) => w.write(buf),
            Sink::Gzip(w) => w.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sink::Plain(w) => w.flush(),
            Sink::Gzip(w) => w.flush(),
        }
    }
}

impl Sink {
    /// Finish compression and flush every buffer, surfacing write errors (disk full).
    fn finish(self) -> io::Result<(Digest, u64)> {
        let w = match self {
            Sink::Plain(w) => w,
            Sink::Gzip(g) => g.finish()?,
        };
        let (digest, n, buf) = w.finish();
        buf.into_inner().map_err(|e| e.into_error())?;
        Ok((digest, n))
    }
}

/// Checksums and signature over `files` and `blobs`; returns (SHA256SUMS, signature).
pub fn checksum_and_sign(input: &PackInput<'_>) -> Result<(Vec<u8>, Option<Vec<u8>>), PackError> {
    let mut sums = Checksums::default();
    for (p, b) in &input.files {
        sums.0.insert(p.clone(), Digest::of(b));
    }
    for (d, _) in &input.blobs {
        sums.0.insert(d.layout_path(), d.clone());
    }
    let text = sums.render().into_bytes();
    let sig = match &input.signer {
        Some((sk, comment)) => Some(super::sign::sign(sk, &text, comment)?.into_bytes()),
        None => None,
    };
    Ok((text, sig))
}

fn header(path: &str, size: u64, mtime: u64, dir: bool) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_size(size);
    h.set_mtime(mtime);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mode(if dir { 0o755 } else { 0o644 });
    h.set_entry_type(if dir {
        tar::EntryType::Directory
    } else {
        tar::EntryType::Regular
    });
    let _ = h.set_username("");
    let _ = h.set_groupname("");
    // Path is set by append_data.
    let _ = path;
    h
}

/// A reader that hashes what passes through it.
struct HashingReader<R> {
    inner: R,
    hasher: sha2::Sha256,
}
impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use sha2::Digest as _;
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Write the bundle to `output` atomically. `on_bytes` is told of blob bytes written.
pub fn pack(
    input: &PackInput<'_>,
    output: &Path,
    on_bytes: &dyn Fn(u64),
) -> Result<PackStats, PackError> {
    let werr = |source: io::Error| PackError::Write {
        path: output.to_path_buf(),
        source,
    };
    let out = AtomicFile::create(output).map_err(werr)?;
    let stats = pack_into(input, &out, on_bytes)?;
    out.commit().map_err(werr)?;
    Ok(stats)
}

/// Write the bundle into `out` (not committed: the caller renames it into place, or reads it
/// and drops it).
pub fn pack_into(
    input: &PackInput<'_>,
    out: &AtomicFile,
    on_bytes: &dyn Fn(u64),
) -> Result<PackStats, PackError> {
    let (sums, sig) = checksum_and_sign(input)?;
    let werr = |source: io::Error| PackError::Write {
        path: out.path().to_path_buf(),
        source,
    };
    let file = out.file().try_clone().map_err(werr)?;
    let counting = Sha256Writer::new(BufWriter::with_capacity(1 << 20, file));
    let sink = match input.compress {
        Compression::None => Sink::Plain(counting),
        Compression::Gzip => Sink::Gzip(flate2::write::GzEncoder::new(
            counting,
            flate2::Compression::default(),
        )),
    };
    let mut tar = tar::Builder::new(sink);
    tar.mode(tar::HeaderMode::Deterministic);
    let mut count = 0usize;
    let add = |tar: &mut tar::Builder<Sink>, path: &str, data: &[u8]| -> io::Result<()> {
        let mut h = header(path, data.len() as u64, input.mtime, false);
        tar.append_data(&mut h, path, data)
    };
    add(&mut tar, CHECKSUMS_FILE, &sums).map_err(werr)?;
    if let Some(sig) = &sig {
        add(&mut tar, SIGNATURE_FILE, sig).map_err(werr)?;
    }
    count += 1 + sig.is_some() as usize;
    let mut dirs_done = std::collections::BTreeSet::new();
    let mut ensure_dirs = |tar: &mut tar::Builder<Sink>, path: &str| -> io::Result<()> {
        let mut acc = String::new();
        let parts: Vec<&str> = path.split('/').collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            acc.push_str(part);
            acc.push('/');
            if dirs_done.insert(acc.clone()) {
                let mut h = header(&acc, 0, input.mtime, true);
                tar.append_data(&mut h, &acc, io::empty())?;
            }
        }
        Ok(())
    };
    for (p, b) in &input.files {
        ensure_dirs(&mut tar, p).map_err(werr)?;
        add(&mut tar, p, b).map_err(werr)?;
        count += 1;
    }
    let mut blobs = input.blobs.clone();
    blobs.sort();
    blobs.dedup();
    for (d, size) in &blobs {
        let path = d.layout_path();
        ensure_dirs(&mut tar, &path).map_err(werr)?;
        let cached = input.cache.path(d);
        let f = File::open(&cached).map_err(werr)?;
        let on_disk = f.metadata().map_err(werr)?.len();
        let mut h = header(&path, *size, input.mtime, false);
        if input.verified.contains(d) && on_disk == *size {
            tar.append_data(&mut h, &path, f.take(*size))
                .map_err(werr)?;
        } else {
            let mut r = HashingReader {
                inner: f.take(*size),
                hasher: sha2::Sha256::default(),
            };
            tar.append_data(&mut h, &path, &mut r).map_err(werr)?;
            let actual = Digest::from_hasher(r.hasher);
            if &actual != d || on_disk != *size {
                let _ = std::fs::remove_file(&cached);
                return Err(PackError::CorruptCache {
                    digest: d.clone(),
                    actual,
                });
            }
        }
        on_bytes(*size);
        count += 1;
    }
    let sink = tar.into_inner().map_err(werr)?;
    let (sha256, bytes) = sink.finish().map_err(werr)?;
    Ok(PackStats {
        bytes,
        files: count,
        sha256,
    })
}
