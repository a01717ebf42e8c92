//! The content-addressed blob cache: `ROOT/blobs/sha256/<hex>` holds only verified blobs;
//! `ROOT/partial/<hex>` holds downloads in progress, resumed on the next run. A blob is written
//! to its partial file, checked for size and digest, fsynced and renamed; a mismatch deletes the
//! partial file and is an error, so nothing unverified ever reaches `blobs/`. Blobs are not
//! fsynced one by one; a reused blob is re-hashed when a bundle is written.

use koord_base::oci::{BlobCheck, BlobMismatch, Digest};
use sha2::{Digest as _, Sha256};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// The cache directory.
#[derive(Debug, Clone)]
pub struct BlobCache {
    root: PathBuf,
}

/// Failures of the cache.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// File system error on a path.
    #[error("cache I/O on {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Content does not match its digest; it was not kept.
    #[error("blob {expected} has digest {actual} (received {size} bytes): refused, not written to the cache")]
    DigestMismatch {
        /// Digest the descriptor names.
        expected: Digest,
        /// Digest of what arrived.
        actual: Digest,
        /// Bytes received.
        size: u64,
    },
    /// More or fewer bytes than the descriptor says.
    #[error("blob {digest} should be {expected} bytes but {actual} arrived: refused, not written to the cache")]
    SizeMismatch {
        /// The blob.
        digest: Digest,
        /// Size the descriptor names.
        expected: u64,
        /// Bytes that arrived (so far).
        actual: u64,
    },
}

impl koord_base::exit::Classify for CacheError {
    fn exit_class(&self) -> Option<koord_base::exit::ExitClass> {
        use koord_base::exit::ExitClass as C;
        match self {
            // The cache is koord-bundle's own: an I/O failure there is the machine's.
            CacheError::Io { .. } => Some(C::Machine),
            // Content that does not match its digest was refused: what the source served.
            CacheError::DigestMismatch { .. } | CacheError::SizeMismatch { .. } => Some(C::Input),
        }
    }
}

impl CacheError {
    /// What [`BlobCheck`] found wrong with blob `digest`, as the cache says it.
    fn mismatch(digest: &Digest, m: BlobMismatch) -> Self {
        match m {
            BlobMismatch::Size { expected, actual } => CacheError::SizeMismatch {
                digest: digest.clone(),
                expected,
                actual,
            },
            BlobMismatch::Digest {
                expected,
                actual,
                size,
            } => CacheError::DigestMismatch {
                expected,
                actual,
                size,
            },
        }
    }
}

impl super::StoreFailure for CacheError {
    fn as_error(&self) -> &(dyn std::error::Error + 'static) {
        self
    }
}

impl From<CacheError> for super::StoreError {
    fn from(e: CacheError) -> Self {
        super::StoreError::Failed(super::Failure::new(e))
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CacheError + '_ {
    move |source| CacheError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl BlobCache {
    /// Open (creating) the cache at `root`.
    pub fn open(root: &Path) -> Result<Self, CacheError> {
        for sub in ["blobs/sha256", "partial"] {
            let p = root.join(sub);
            fs::create_dir_all(&p).map_err(io_err(&p))?;
        }
        Ok(BlobCache {
            root: root.to_path_buf(),
        })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Path of a verified blob.
    pub fn path(&self, d: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(d.hex())
    }

    /// Is the blob present with this size?
    pub fn has(&self, d: &Digest, size: u64) -> bool {
        fs::metadata(self.path(d))
            .map(|m| m.is_file() && m.len() == size)
            .unwrap_or(false)
    }

    /// Store small content held in memory (manifests, configs), after checking its digest.
    pub fn put_bytes(&self, d: &Digest, bytes: &[u8]) -> Result<(), CacheError> {
        // Small: compare with what is there rather than trust its size.
        if std::fs::read(self.path(d)).is_ok_and(|on_disk| on_disk == bytes) {
            return Ok(());
        }
        let mut p = self.begin(d, bytes.len() as u64)?;
        p.restart()?;
        p.write(bytes)?;
        p.commit()
    }

    /// Read a small verified blob (a manifest or config) back, re-checking its digest.
    pub fn read_small(&self, d: &Digest, max: u64) -> Result<Vec<u8>, CacheError> {
        let path = self.path(d);
        let mut buf = Vec::new();
        File::open(&path)
            .map_err(io_err(&path))?
            .take(max + 1)
            .read_to_end(&mut buf)
            .map_err(io_err(&path))?;
        let actual = Digest::of(&buf);
        if &actual != d {
            let _ = fs::remove_file(&path);
            return Err(CacheError::DigestMismatch {
                expected: d.clone(),
                actual,
                size: buf.len() as u64,
            });
        }
        Ok(buf)
    }

    /// Start or resume writing a blob: the partial file is opened and what it already holds is
    /// hashed, so the download can continue at [`PartialBlob::offset`].
    pub fn begin(&self, d: &Digest, size: u64) -> Result<PartialBlob, CacheError> {
        let tee = self.tee(d, size)?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 256 * 1024];
        // The prefix from its start (the cursor then ends where the next write goes).
        std::io::Seek::seek(&mut &tee.file, std::io::SeekFrom::Start(0))
            .map_err(io_err(&tee.path))?;
        loop {
            let n = (&tee.file).read(&mut buf).map_err(io_err(&tee.path))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        let check = BlobCheck::resumed(d, size, hasher, tee.written);
        Ok(PartialBlob { tee, check })
    }

    /// Where a download of `d` in progress is kept.
    fn partial_path(&self, d: &Digest) -> PathBuf {
        self.root.join("partial").join(d.hex())
    }
}

/// A blob being written to the cache, hashed here as it is written.
pub struct PartialBlob {
    tee: Tee,
    check: BlobCheck,
}

impl PartialBlob {
    /// Bytes already held (resume offset).
    pub fn offset(&self) -> u64 {
        self.tee.written
    }

    /// Throw away what is held and start at zero.
    pub fn restart(&mut self) -> Result<(), CacheError> {
        self.tee.restart()?;
        self.check.restart();
        Ok(())
    }

    /// Append a chunk; more bytes than the descriptor's size is an error (and the partial file
    /// is discarded).
    pub fn write(&mut self, chunk: &[u8]) -> Result<(), CacheError> {
        if let Err(m) = self.check.update(chunk) {
            let _ = fs::remove_file(&self.tee.path);
            return Err(CacheError::mismatch(self.check.digest(), m));
        }
        self.tee.write(chunk)
    }

    /// Check size and digest, and move into `blobs/`. On mismatch the partial file is deleted
    /// and nothing is kept.
    pub fn commit(self) -> Result<(), CacheError> {
        let digest = self.check.digest().clone();
        if let Err(m) = self.check.finish() {
            self.tee.discard();
            return Err(CacheError::mismatch(&digest, m));
        }
        // No fsync per blob: a blob torn by a power loss is caught when it is reused (the pack
        // re-hashes every blob it did not verify on arrival in the same run).
        self.tee.commit()
    }
}

/// A blob appended to the cache's partial file as a writer that hashes it itself receives it
/// (not hashed twice): committed when that writer's digest check passed.
#[derive(Debug)]
pub struct Tee {
    file: File,
    path: PathBuf,
    final_path: PathBuf,
    written: u64,
}

impl BlobCache {
    /// Bytes of a partial download of `d`, if there is one.
    pub fn partial_len(&self, d: &Digest) -> Option<u64> {
        fs::metadata(self.partial_path(d))
            .ok()
            .map(|m| m.len())
            .filter(|&n| n > 0)
    }

    /// Continue (or start) the partial download of `d` without hashing it here.
    pub fn tee(&self, d: &Digest, size: u64) -> Result<Tee, CacheError> {
        let path = self.partial_path(d);
        // Never through a link, never a special file (issue 30: a link planted at
        // `partial/<hex>` in a shared cache had its target truncated, and was then renamed
        // into `blobs/`): what is there and is not a regular file is removed and replaced.
        let (mut file, _) = super::file::open_or_replace(&path).map_err(io_err(&path))?;
        let mut written = file.metadata().map_err(io_err(&path))?.len();
        if written > size {
            file.set_len(0).map_err(io_err(&path))?;
            written = 0;
        }
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(written)).map_err(io_err(&path))?;
        Ok(Tee {
            file,
            path,
            final_path: self.path(d),
            written,
        })
    }
}

impl Tee {
    /// Bytes already held.
    pub fn offset(&self) -> u64 {
        self.written
    }

    /// The partial file (to read its prefix).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Throw away what is held.
    pub fn restart(&mut self) -> Result<(), CacheError> {
        self.file.set_len(0).map_err(io_err(&self.path))?;
        std::io::Seek::seek(&mut self.file, std::io::SeekFrom::Start(0))
            .map_err(io_err(&self.path))?;
        self.written = 0;
        Ok(())
    }

    /// Append a chunk.
    pub fn write(&mut self, chunk: &[u8]) -> Result<(), CacheError> {
        self.file.write_all(chunk).map_err(io_err(&self.path))?;
        self.written += chunk.len() as u64;
        Ok(())
    }

    /// The writer checked size and digest: the blob joins the cache.
    ///
    /// What was renamed must be the file written here: another program that swapped the
    /// name between the open and the rename (a link in a shared cache) gets its thing removed
    /// from `blobs/` again, and the blob is not cached.
    pub fn commit(self) -> Result<(), CacheError> {
        use std::os::unix::fs::MetadataExt as _;
        fs::rename(&self.path, &self.final_path).map_err(io_err(&self.final_path))?;
        let ours = self.file.metadata().map_err(io_err(&self.path))?;
        match fs::symlink_metadata(&self.final_path) {
            Ok(m) if m.is_file() && m.dev() == ours.dev() && m.ino() == ours.ino() => Ok(()),
            _ => {
                let _ = fs::remove_file(&self.final_path);
                Err(io_err(&self.final_path)(std::io::Error::other(
                    "what was renamed into the cache is not the file written (its name was replaced while it was written)",
                )))
            }
        }
    }

    /// The content did not match: nothing of it is kept.
    pub fn discard(self) {
        let _ = fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn verifies_resumes_and_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let c = BlobCache::open(dir.path()).unwrap();
        let data = b"hello world, a blob";
        let d = Digest::of(data);
        let mut p = c.begin(&d, data.len() as u64).unwrap();
        p.write(&data[..5]).unwrap();
        drop(p);
        let mut p = c.begin(&d, data.len() as u64).unwrap();
        assert_eq!(p.offset(), 5);
        p.write(&data[5..]).unwrap();
        p.commit().unwrap();
        assert!(c.has(&d, data.len() as u64));
        assert_eq!(c.read_small(&d, 100).unwrap(), data);

        let bad = Digest::of(b"other");
        let mut p = c.begin(&bad, data.len() as u64).unwrap();
        p.write(data).unwrap();
        assert!(matches!(p.commit(), Err(CacheError::DigestMismatch { .. })));
        assert!(!c.path(&bad).exists());
        let mut p = c.begin(&bad, 3).unwrap();
        assert!(matches!(
            p.write(data),
            Err(CacheError::SizeMismatch { .. })
        ));
    }
}
