//! The bundle writer, a [`Sink`]: the tar is laid out before any blob arrives (every size and
//! digest is known once the manifests are resolved), so the checksum file and its signature go
//! first, as readers expect, and each blob is written once, straight to its final offset,
//! whatever order blobs arrive in, hashed as it is received.
//!
//! With a blob cache: a blob the cache holds is copied from it (and hashed); a blob it does not
//! hold is also appended to the cache's partial file as it arrives (not hashed twice: the
//! writer's hash decides), so a killed build resumes where it stopped, and the next build reuses
//! it. The layout is byte for byte what a sequential tar writer gives (`tar` with deterministic
//! headers): checksum file, signature, the small files with their directories, then the blobs
//! in digest order, then two zero blocks.

use super::atomic::AtomicFile;
use super::pack::{header, PackError, PackStats};
use super::{CHECKSUMS_FILE, SIGNATURE_FILE};
use crate::oci::{Descriptor, Digest};
use crate::store::cache::Tee;
use crate::store::{
    BlobCache, Have, OnBytes, Opener, RawManifest, Reference, Sink, Store, StoreError,
};
use futures_util::StreamExt;
use sha2::Digest as _;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes gathered before one positional write.
const WRITE_PIECE: usize = 1 << 20;
/// Received bytes of one blob that may wait for the writer, in KiB (with `--jobs` blobs at
/// once, this times the jobs bounds the build's buffers).
const IN_FLIGHT_KIB: usize = 2048;

/// What goes into a bundle.
pub struct Plan<'a> {
    /// Small files held in memory, by path, in order.
    pub files: &'a [(String, Vec<u8>)],
    /// Every blob (configs, layers, manifests), by digest.
    pub blobs: &'a [(Digest, u64)],
    /// Modification time of every entry.
    pub mtime: u64,
    /// The checksum file and its signature (see `pack::checksum_and_sign`).
    pub checksums: &'a [u8],
    /// The signature, if signed.
    pub signature: Option<&'a [u8]>,
}

/// Where blobs were taken from.
#[derive(Debug, Default)]
pub struct Counts {
    /// Bytes copied from the cache (whole blobs and resumed prefixes).
    pub from_cache: AtomicU64,
    /// Bytes received from the source.
    pub received: AtomicU64,
    /// Whole blobs copied from the cache.
    pub cached_blobs: AtomicU64,
}

/// A bundle being written.
pub struct BundleWriter<'a> {
    file: Arc<File>,
    /// The bundle's eventual path, for messages.
    dest: PathBuf,
    /// Digest → (offset of its data, size).
    regions: BTreeMap<Digest, (u64, u64)>,
    done: Mutex<BTreeSet<Digest>>,
    cache: Option<&'a BlobCache>,
    len: u64,
    files: usize,
    /// Where the bytes came from.
    pub counts: Counts,
}

fn round_up(n: u64) -> u64 {
    n.div_ceil(512) * 512
}

impl<'a> BundleWriter<'a> {
    /// Lay the bundle out in `out` (a temporary file of the destination `dest`): everything but
    /// the blobs' bytes is written now.
    pub fn create(
        out: &AtomicFile,
        dest: &Path,
        plan: &Plan<'_>,
        cache: Option<&'a BlobCache>,
    ) -> Result<BundleWriter<'a>, PackError> {
        let werr = |source: io::Error| PackError::Write {
            path: dest.to_path_buf(),
            source,
        };
        // The entries before the blobs, as a sequential tar writer writes them.
        let mut tar = tar::Builder::new(Vec::new());
        tar.mode(tar::HeaderMode::Deterministic);
        let mut count = 0usize;
        let mtime = plan.mtime;
        let add = |tar: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]| -> io::Result<()> {
            let mut h = header(data.len() as u64, mtime, false);
            tar.append_data(&mut h, path, data)
        };
        add(&mut tar, CHECKSUMS_FILE, plan.checksums).map_err(werr)?;
        count += 1;
        if let Some(sig) = plan.signature {
            add(&mut tar, SIGNATURE_FILE, sig).map_err(werr)?;
            count += 1;
        }
        let mut dirs_done = BTreeSet::new();
        let mut ensure_dirs = |tar: &mut tar::Builder<Vec<u8>>, path: &str| -> io::Result<()> {
            let mut acc = String::new();
            let parts: Vec<&str> = path.split('/').collect();
            for part in &parts[..parts.len().saturating_sub(1)] {
                acc.push_str(part);
                acc.push('/');
                if dirs_done.insert(acc.clone()) {
                    let mut h = header(0, mtime, true);
                    tar.append_data(&mut h, &acc, io::empty())?;
                }
            }
            Ok(())
        };
        for (p, b) in plan.files {
            ensure_dirs(&mut tar, p).map_err(werr)?;
            add(&mut tar, p, b).map_err(werr)?;
            count += 1;
        }
        let mut blobs = plan.blobs.to_vec();
        blobs.sort();
        blobs.dedup();
        if let Some((d, _)) = blobs.first() {
            ensure_dirs(&mut tar, &d.layout_path()).map_err(werr)?;
        }
        let mut head = tar.into_inner().map_err(werr)?;
        // into_inner finished the archive with its two end blocks: they belong after the blobs.
        head.truncate(head.len().saturating_sub(1024));
        // Then each blob: its header, its bytes (later), padding to 512.
        let mut regions = BTreeMap::new();
        let mut headers = Vec::with_capacity(blobs.len());
        let mut at = head.len() as u64;
        for (d, size) in &blobs {
            let path = d.layout_path();
            let mut h = header(*size, mtime, false);
            // A blob's path (77 bytes) always fits the header: no long-name entry.
            h.set_path(&path).map_err(werr)?;
            h.set_cksum();
            headers.push((at, h));
            regions.insert(d.clone(), (at + 512, *size));
            at += 512 + round_up(*size);
            count += 1;
        }
        let len = at + 1024;
        let file = out.file().try_clone().map_err(werr)?;
        // The whole size, reserved now: a full disk fails before any blob is downloaded.
        // Unwritten regions read as zeros: the padding and the two end blocks.
        crate::store::file::reserve(&file, len).map_err(werr)?;
        crate::store::file::write_at(&file, &head, 0).map_err(werr)?;
        for (offset, h) in &headers {
            crate::store::file::write_at(&file, h.as_bytes(), *offset).map_err(werr)?;
        }
        Ok(BundleWriter {
            file: Arc::new(file),
            dest: dest.to_path_buf(),
            regions,
            done: Mutex::new(BTreeSet::new()),
            cache,
            len,
            files: count,
            counts: Counts::default(),
        })
    }

    /// Every blob is in. (The file's own sha256 is not taken: it would be a second hash of every
    /// byte, on the build's critical path; SHA256SUMS and its signature cover the content, and
    /// `sha256sum` gives the file's when copies are compared.)
    pub fn finish(&self) -> Result<PackStats, PackError> {
        let done = self.done.lock().map(|d| d.len()).unwrap_or(0);
        if done != self.regions.len() {
            let missing: Vec<String> = self
                .regions
                .keys()
                .filter(|d| !self.done.lock().is_ok_and(|s| s.contains(*d)))
                .map(|d| d.to_string())
                .collect();
            return Err(PackError::Write {
                path: self.dest.clone(),
                source: io::Error::other(format!(
                    "{} blobs were never written: {}",
                    missing.len(),
                    missing.join(", ")
                )),
            });
        }
        Ok(PackStats {
            bytes: self.len,
            files: self.files,
        })
    }

    fn err(&self, e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> StoreError {
        StoreError::other(self.describe(), e)
    }

    fn region(&self, d: &Digest) -> Result<(u64, u64), StoreError> {
        self.regions
            .get(d)
            .copied()
            .ok_or_else(|| self.err(format!("{d} is not part of the bundle's plan")))
    }

    fn mark_done(&self, d: &Digest) {
        if let Ok(mut s) = self.done.lock() {
            s.insert(d.clone());
        }
    }

    /// Write `data` at `offset` (positional, on the blocking pool).
    async fn write(&self, data: bytes::Bytes, offset: u64) -> Result<(), StoreError> {
        let file = self.file.clone();
        tokio::task::spawn_blocking(move || crate::store::file::write_at(&file, &data, offset))
            .await
            .map_err(|e| self.err(e.to_string()))?
            .map_err(|e| {
                StoreError::other(
                    self.describe(),
                    PackError::Write {
                        path: self.dest.clone(),
                        source: e,
                    },
                )
            })
    }

    /// Copy the first `len` bytes of the cache file `from` into the region, hashing them (on
    /// the blocking pool), telling `on_bytes` of each piece.
    async fn copy_from_cache(
        &self,
        from: PathBuf,
        len: u64,
        region: u64,
        on_bytes: Option<OnBytes>,
    ) -> Result<sha2::Sha256, StoreError> {
        let file = self.file.clone();
        tokio::task::spawn_blocking(move || -> io::Result<sha2::Sha256> {
            let src = File::open(&from)?;
            let mut hasher = sha2::Sha256::new();
            let mut buf = vec![0u8; 4 << 20];
            let mut at = 0u64;
            while at < len {
                let n = (len - at).min(buf.len() as u64) as usize;
                crate::store::file::read_at(&src, &mut buf[..n], at)?;
                hasher.update(&buf[..n]);
                crate::store::file::write_at(&file, &buf[..n], region + at)?;
                if let Some(report) = &on_bytes {
                    report(n as u64);
                }
                at += n as u64;
            }
            Ok(hasher)
        })
        .await
        .map_err(|e| self.err(e.to_string()))?
        .map_err(|e| self.err(e))
    }

    /// Copy a complete cached blob into its region, hashing it: `false` when the cached copy
    /// does not match (it is then removed from the cache).
    async fn copy_cached(
        &self,
        cache: &BlobCache,
        desc: &Descriptor,
        region: u64,
        on_bytes: &OnBytes,
    ) -> Result<bool, StoreError> {
        let size = desc.size;
        let hasher = self
            .copy_from_cache(
                cache.path(&desc.digest),
                size,
                region,
                Some(on_bytes.clone()),
            )
            .await?;
        if Digest::from_hasher(hasher) != desc.digest {
            // Torn by a crash, or changed: not trusted, fetched again.
            let _ = std::fs::remove_file(cache.path(&desc.digest));
            return Ok(false);
        }
        self.counts.from_cache.fetch_add(size, Ordering::Relaxed);
        self.counts.cached_blobs.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }
}

impl Store for BundleWriter<'_> {
    fn describe(&self) -> String {
        format!("bundle {}", self.dest.display())
    }
}

impl Sink for BundleWriter<'_> {
    /// Complete once written; a partial download in the cache is resumed.
    async fn blob_state(&self, _repo: &str, desc: &Descriptor) -> Result<Have, StoreError> {
        if self.done.lock().is_ok_and(|s| s.contains(&desc.digest)) {
            return Ok(Have::Complete);
        }
        if let Some(cache) = self.cache {
            if !cache.has(&desc.digest, desc.size) {
                if let Some(n) = cache.partial_len(&desc.digest).filter(|&n| n <= desc.size) {
                    return Ok(Have::Partial(n));
                }
            }
        }
        Ok(Have::Nothing)
    }

    async fn put_blob(
        &self,
        _repo: &str,
        desc: &Descriptor,
        offset: u64,
        data: &dyn Opener,
        on_bytes: &OnBytes,
    ) -> Result<(), StoreError> {
        let (region, size) = self.region(&desc.digest)?;
        if size != desc.size {
            return Err(StoreError::SizeMismatch {
                store: self.describe(),
                what: format!("blob {}", desc.digest),
                expected: size,
                actual: desc.size,
            });
        }
        if let Some(cache) = self.cache {
            if cache.has(&desc.digest, size)
                && self.copy_cached(cache, desc, region, on_bytes).await?
            {
                self.mark_done(&desc.digest);
                return Ok(());
            }
        }
        // The cache's partial download, continued: its prefix is copied (and hashed) first.
        let mut tee: Option<Tee> = match self.cache {
            Some(c) => Some(c.tee(&desc.digest, size)?),
            None => None,
        };
        let mut hasher = sha2::Sha256::new();
        let mut pos = 0u64;
        let start = match &mut tee {
            Some(t) if t.offset() == offset => offset,
            Some(t) => {
                t.restart()?;
                0
            }
            None => 0,
        };
        if start > 0 {
            if let Some(t) = &tee {
                hasher = self
                    .copy_from_cache(t.path().to_path_buf(), start, region, None)
                    .await?;
                self.counts.from_cache.fetch_add(start, Ordering::Relaxed);
                pos = start;
            }
        }
        let mut stream = data.open(pos).await?;
        // The writes (the bundle at the blob's offset, the cache's partial file) run on a thread
        // of the blocking pool, a few MiB behind the download: receiving and hashing here,
        // writing there, on two cores.
        // What is in flight is bounded in bytes, not pieces (a piece is up to ~400 KiB on a fast
        // link): the receiver holds a permit per KiB until the writer has written its piece.
        let budget = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT_KIB));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(
            bytes::Bytes,
            tokio::sync::OwnedSemaphorePermit,
        )>();
        let file = self.file.clone();
        let mut tee_w = tee.take();
        enum WriteFail {
            Bundle(io::Error),
            Cache(crate::store::CacheError),
        }
        let start_at = region + pos;
        let writes = tokio::task::spawn_blocking(move || {
            // Each piece goes to the cache's partial file at once (what a killed build keeps);
            // the bundle gets them a MiB at a time.
            let mut result: Result<(), WriteFail> = Ok(());
            let mut buf: Vec<u8> = Vec::with_capacity(WRITE_PIECE);
            let mut at = start_at;
            let flush = |buf: &mut Vec<u8>, at: &mut u64| -> Result<(), WriteFail> {
                crate::store::file::write_at(&file, buf, *at).map_err(WriteFail::Bundle)?;
                *at += buf.len() as u64;
                buf.clear();
                Ok(())
            };
            while let Some((piece, _permit)) = rx.blocking_recv() {
                if result.is_err() {
                    continue; // Drain: the receiving side learns of the error at the end.
                }
                if let Some(t) = &mut tee_w {
                    if let Err(e) = t.write(&piece) {
                        result = Err(WriteFail::Cache(e));
                        continue;
                    }
                }
                buf.extend_from_slice(&piece);
                if buf.len() >= WRITE_PIECE {
                    result = flush(&mut buf, &mut at);
                }
            }
            if result.is_ok() && !buf.is_empty() {
                result = flush(&mut buf, &mut at);
            }
            (result, tee_w)
        });
        let mut failed: Option<StoreError> = None;
        while let Some(piece) = stream.next().await {
            let piece = match piece {
                Ok(p) => p,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            if pos + piece.len() as u64 > size {
                failed = Some(StoreError::SizeMismatch {
                    store: self.describe(),
                    what: format!("blob {}", desc.digest),
                    expected: size,
                    actual: pos + piece.len() as u64,
                });
                break;
            }
            hasher.update(&piece);
            pos += piece.len() as u64;
            on_bytes(piece.len() as u64);
            self.counts
                .received
                .fetch_add(piece.len() as u64, Ordering::Relaxed);
            let kib = piece.len().div_ceil(1024).clamp(1, IN_FLIGHT_KIB) as u32;
            let Ok(permit) = budget.clone().acquire_many_owned(kib).await else {
                break;
            };
            if tx.send((piece, permit)).is_err() {
                break; // The writer stopped: its error is below.
            }
        }
        drop(tx);
        let (written, tee_back) = writes.await.map_err(|e| self.err(e.to_string()))?;
        tee = tee_back;
        if let Some(e) = failed.or(written.err().map(|e| match e {
            WriteFail::Bundle(source) => StoreError::other(
                self.describe(),
                PackError::Write {
                    path: self.dest.clone(),
                    source,
                },
            ),
            WriteFail::Cache(c) => StoreError::Cache(c),
        })) {
            // A transfer that broke leaves the cache's partial file (the next run resumes);
            // content that does not match does not.
            if matches!(e, StoreError::SizeMismatch { .. }) {
                if let Some(t) = tee.take() {
                    t.discard();
                }
            }
            return Err(e);
        }
        let actual = Digest::from_hasher(hasher);
        if pos != size || actual != desc.digest {
            // What the cache got is not kept either.
            if let Some(t) = tee.take() {
                t.discard();
            }
            return Err(if pos != size {
                StoreError::SizeMismatch {
                    store: self.describe(),
                    what: format!("blob {}", desc.digest),
                    expected: size,
                    actual: pos,
                }
            } else {
                StoreError::DigestMismatch {
                    store: self.describe(),
                    what: format!("blob {}", desc.digest),
                    expected: desc.digest.clone(),
                    actual,
                    size: pos,
                }
            });
        }
        if let Some(t) = tee {
            t.commit()?;
        }
        self.mark_done(&desc.digest);
        Ok(())
    }

    async fn has_manifest(
        &self,
        _repo: &str,
        _reference: &Reference,
        digest: &Digest,
    ) -> Result<bool, StoreError> {
        Ok(self.done.lock().is_ok_and(|s| s.contains(digest)))
    }

    /// A manifest is a blob of the layout: its exact bytes at its offset.
    async fn put_manifest(
        &self,
        _repo: &str,
        _reference: &Reference,
        m: &RawManifest,
    ) -> Result<(), StoreError> {
        let (region, size) = self.region(&m.digest)?;
        if size != m.bytes.len() as u64 || Digest::of(&m.bytes) != m.digest {
            return Err(self.err(format!(
                "manifest {} does not match its plan ({} bytes planned)",
                m.digest, size
            )));
        }
        self.write(m.bytes.clone(), region).await?;
        if let Some(cache) = self.cache {
            cache.put_bytes(&m.digest, &m.bytes)?;
        }
        self.mark_done(&m.digest);
        Ok(())
    }
}
