//! The bundle writer, a [`Sink`]: the tar is laid out before any blob arrives (every size and
//! digest is known once the manifests are resolved), so the checksum file and its signature go
//! first, as readers expect, and each blob is written once, straight to its final offset,
//! whatever order blobs arrive in, hashed as it is received.
//!
//! Each blob is written once (issue 23): a build resumes from its own `.partial` (the regions
//! an earlier, stopped run finished are re-hashed and kept, a blob it cut off mid-way is
//! continued where its written prefix ends: [`resumed_regions`]), and copies
//! what earlier bundles hold ([`super::reuse`]), re-hashing every byte copied. With an opt-in
//! blob cache (`--cache DIR`): a blob the cache holds is copied from it (and hashed); a blob it
//! does not hold is also appended to the cache's partial file as it arrives (not hashed twice:
//! the writer's hash decides). The layout is byte for byte what a sequential tar writer gives (`tar` with deterministic
//! headers): checksum file, signature, the small files with their directories, then the blobs
//! in digest order, then two zero blocks.

use super::pack::{header, PackError, PackStats};
use super::reuse::Donors;
use super::{CHECKSUMS_FILE, SIGNATURE_FILE};
use crate::oci::{size, BlobCheck, BlobMismatch, Descriptor, Digest};
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
pub struct Entries<'a> {
    /// Small files held in memory, by path, in order.
    pub files: &'a [(String, Vec<u8>)],
    /// Every blob (configs, layers, manifests), by digest.
    pub blobs: &'a [(Digest, u64)],
    /// The programs carried for the site, after the blobs: (path, sha256, size), written
    /// like blobs (by digest, from their files) but under their own names, executable.
    pub tools: &'a [(String, Digest, u64)],
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
    /// Bytes copied from earlier bundles or the blob cache (whole blobs and resumed prefixes).
    pub from_cache: AtomicU64,
    /// Bytes received from the source.
    pub received: AtomicU64,
    /// Whole blobs copied from earlier bundles or the blob cache.
    pub cached_blobs: AtomicU64,
    /// Bytes kept from the build's own `.partial` (manifests included).
    pub resumed: AtomicU64,
    /// Blobs kept from it.
    pub resumed_blobs: AtomicU64,
}

/// A bundle laid out: the bytes before the blobs, every blob's header and place, the length.
/// Computed before anything is written, with checked arithmetic: a size that would wrap or
/// pass what a file can hold ([`size::MAX_SIZE`]) is refused here, and [`check_room`] compares
/// the length with the disk.
#[derive(Debug)]
pub struct TarLayout {
    head: Vec<u8>,
    headers: Vec<(u64, tar::Header)>,
    /// Digest → (offset of its data, size).
    regions: BTreeMap<Digest, (u64, u64)>,
    len: u64,
    files: usize,
    /// What the layout is made of, hashed: the record a `.partial` carries of what it was made
    /// for ([`Trailer`]).
    plan: String,
}

/// Bytes after a `.partial`'s bundle length: the record of the plan it was made for (issue 30:
/// a `.partial` of other inputs was taken for this one's, and shipped a broken bundle). Cut
/// off before the file is renamed into place; a file without it is not resumed from.
pub const TRAILER_LEN: u64 = 512;
const TRAILER_MAGIC: &[u8] = b"koord-bundle .partial v1\nplan sha256:";

/// The trailer a `.partial` of `plan` carries at its bundle length.
fn trailer(plan: &str) -> Vec<u8> {
    let mut t = TRAILER_MAGIC.to_vec();
    t.extend_from_slice(plan.as_bytes());
    t.push(b'\n');
    t.resize(TRAILER_LEN as usize, 0);
    t
}

/// Whether an earlier run's `.partial` (`found` bytes) was made for this layout: its length is
/// the bundle's plus the trailer, and the trailer names this plan.
pub fn made_for(file: &File, found: u64, layout: &TarLayout) -> io::Result<Option<String>> {
    if found != layout.len + TRAILER_LEN {
        return Ok(Some(if found < TRAILER_LEN {
            "it holds no record of what it was made for".into()
        } else {
            format!(
                "it is {found} bytes, not the {} this build's bundle and its record take: it was made for other inputs",
                layout.len + TRAILER_LEN
            )
        }));
    }
    let mut got = vec![0u8; TRAILER_LEN as usize];
    crate::store::file::read_at(file, &mut got, layout.len)?;
    if got == trailer(&layout.plan) {
        Ok(None)
    } else if got.starts_with(TRAILER_MAGIC) {
        Ok(Some(
            "it was made for other inputs (another chart, image, platform, key or option)".into(),
        ))
    } else {
        Ok(Some("it holds no record of what it was made for".into()))
    }
}

/// The carried programs after the blobs, from byte `at`: their folders' headers, then each
/// program's header and region (keyed by its sha256). Returns where the next entry starts.
fn lay_out_tools(
    plan: &Entries<'_>,
    mut at: u64,
    headers: &mut Vec<(u64, tar::Header)>,
    regions: &mut BTreeMap<Digest, (u64, u64)>,
) -> Result<u64, String> {
    let mut dirs = BTreeSet::new();
    for (path, d, size) in plan.tools {
        let too_big = || {
            format!("with {path} of {size} bytes the bundle would pass {} bytes, the most a file can hold", size::MAX_SIZE_TEXT)
        };
        let mut acc = String::new();
        let parts: Vec<&str> = path.split('/').collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            acc.push_str(part);
            acc.push('/');
            if dirs.insert(acc.clone()) {
                let mut h = header(0, plan.mtime, true);
                h.set_path(&acc).map_err(|e| format!("{acc}: {e}"))?;
                h.set_cksum();
                headers.push((at, h));
                at = size::checked_add(at, 512).ok_or_else(too_big)?;
            }
        }
        if regions.contains_key(d) {
            return Err(format!("{path} has the digest {d} of a blob of the bundle"));
        }
        let end = round_up(*size)
            .and_then(|padded| size::checked_add(at, 512)?.checked_add(padded))
            .filter(|&e| e <= size::MAX_SIZE - 1024)
            .ok_or_else(too_big)?;
        let mut h = super::pack::header_mode(*size, plan.mtime, false, 0o755);
        // `tools/<os>-<arch>/<name>`: short, always fits the header.
        h.set_path(path).map_err(|e| format!("{path}: {e}"))?;
        h.set_cksum();
        headers.push((at, h));
        regions.insert(d.clone(), (at + 512, *size));
        at = end;
    }
    Ok(at)
}

fn round_up(n: u64) -> Option<u64> {
    n.checked_next_multiple_of(512)
}

/// Zero bytes after a blob of `size` bytes, up to its next 512-byte block.
fn padding(size: u64) -> usize {
    ((512 - size % 512) % 512) as usize
}

impl TarLayout {
    /// Lay out `plan` for the bundle `dest` (named in errors).
    pub fn new(dest: &Path, plan: &Entries<'_>) -> Result<TarLayout, PackError> {
        let werr = |source: io::Error| PackError::Write {
            path: dest.to_path_buf(),
            source,
        };
        let refuse = |reason: String| PackError::Plan {
            path: dest.to_path_buf(),
            reason,
        };
        let (head, mut count) = head_entries(plan).map_err(werr)?;
        let mut blobs = plan.blobs.to_vec();
        blobs.sort();
        blobs.dedup();
        if let Some(w) = blobs.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(refuse(format!(
                "blob {} is planned as {} bytes and as {} bytes",
                w[0].0, w[0].1, w[1].1
            )));
        }
        // Then each blob: its header, its bytes (later), padding to 512.
        let mut regions = BTreeMap::new();
        let mut headers = Vec::with_capacity(blobs.len());
        let mut at = head.len() as u64;
        for (d, size) in &blobs {
            let end = round_up(*size)
                .and_then(|padded| size::checked_add(at, 512)?.checked_add(padded))
                .filter(|&e| e <= size::MAX_SIZE - 1024)
                .ok_or_else(|| {
                    refuse(format!(
                        "with blob {d} of {size} bytes it would pass {} bytes, the most a file can hold",
                        size::MAX_SIZE_TEXT
                    ))
                })?;
            let mut h = header(*size, plan.mtime, false);
            // A blob's path (77 bytes) always fits the header: no long-name entry.
            h.set_path(d.layout_path()).map_err(werr)?;
            h.set_cksum();
            headers.push((at, h));
            regions.insert(d.clone(), (at + 512, *size));
            at = end;
            count += 1;
        }
        at = lay_out_tools(plan, at, &mut headers, &mut regions).map_err(refuse)?;
        count += plan.tools.len();
        let len = at + 1024;
        let mut h = sha2::Sha256::new();
        h.update(len.to_le_bytes());
        h.update((head.len() as u64).to_le_bytes());
        h.update(&head);
        for (offset, hd) in &headers {
            h.update(offset.to_le_bytes());
            h.update(hd.as_bytes());
        }
        for (d, (offset, size)) in &regions {
            h.update(d.to_string().as_bytes());
            h.update(offset.to_le_bytes());
            h.update(size.to_le_bytes());
        }
        let plan = hex::encode(h.finalize());
        Ok(TarLayout {
            head,
            headers,
            regions,
            len,
            files: count,
            plan,
        })
    }

    /// The bundle's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Never empty (the two end blocks at least); for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every blob's place: (digest, offset of its data, size), in offset order.
    pub fn regions(&self) -> impl Iterator<Item = (&Digest, u64, u64)> {
        let mut v: Vec<_> = self.regions.iter().map(|(d, &(o, s))| (d, o, s)).collect();
        v.sort_by_key(|&(_, o, _)| o);
        v.into_iter()
    }

    /// [`TarLayout::regions`], owned (for the index of earlier bundles, and the resume pass).
    pub fn region_list(&self) -> Vec<(Digest, u64, u64)> {
        self.regions().map(|(d, o, s)| (d.clone(), o, s)).collect()
    }
}

/// What an earlier, stopped run of the same build left in its `.partial`.
#[derive(Debug, Default)]
pub struct Resumed {
    /// Blobs found whole at their places (re-hashed): kept.
    pub kept: BTreeSet<Digest>,
    /// Blobs cut off mid-way: the length of what was written of each (from its start) and
    /// its hash; the download continues there (a range request), and the whole blob is
    /// checked at its end (fetched again from its start when it does not match).
    pub prefixes: BTreeMap<Digest, (u64, sha2::Sha256)>,
}

/// What the file (an earlier, stopped run's `.partial` of `found` bytes, laid out the same
/// way: the layout is a function of the plan) holds of `regions`. Each region is read from its
/// start, piece by piece, until a piece of zeros (the file was reserved with zeros, and a blob
/// is written from its start on, in order): a region read whole whose hash matches is kept; a
/// region that stops earlier gives a prefix, up to its last byte that is not zero (never past
/// what was written; a blob whose bytes are zero there is only fetched a little more).
pub fn resumed_regions(
    file: &File,
    found: u64,
    regions: &[(Digest, u64, u64)],
) -> io::Result<Resumed> {
    let mut out = Resumed::default();
    let mut buf = vec![0u8; WRITE_PIECE];
    for (d, offset, size) in regions {
        let avail = found.saturating_sub(*offset).min(*size);
        let mut hasher = sha2::Sha256::new();
        let mut at = 0u64;
        let mut end = 0u64; // after the last byte that is not zero
        while at < avail {
            let n = (avail - at).min(buf.len() as u64) as usize;
            crate::store::file::read_at(file, &mut buf[..n], offset + at)?;
            let Some(last) = buf[..n].iter().rposition(|&b| b != 0) else {
                break;
            };
            if end < at {
                // Zeros between what was hashed and this piece: hashed now.
                hasher.update(vec![0u8; (at - end) as usize]);
            }
            hasher.update(&buf[..=last]);
            end = at + last as u64 + 1;
            at += n as u64;
        }
        if at == *size && *size > 0 {
            // Read whole: the zeros at its end too (it may end in zeros, or have been cut in
            // its last piece: then what comes before them is a prefix).
            let before_zeros = hasher.clone();
            if end < at {
                hasher.update(vec![0u8; (at - end) as usize]);
            }
            if &Digest::from_hasher(hasher) == d {
                out.kept.insert(d.clone());
                continue;
            }
            hasher = before_zeros;
        }
        if end > 0 && end < *size {
            out.prefixes.insert(d.clone(), (end, hasher));
        }
    }
    Ok(out)
}

/// The entries before the blobs, as a sequential tar writer writes them (without its end
/// blocks), and how many entries they are.
fn head_entries(plan: &Entries<'_>) -> io::Result<(Vec<u8>, usize)> {
    let mut tar = tar::Builder::new(Vec::new());
    tar.mode(tar::HeaderMode::Deterministic);
    let mut count = 0usize;
    let mtime = plan.mtime;
    let add = |tar: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]| -> io::Result<()> {
        let mut h = header(data.len() as u64, mtime, false);
        tar.append_data(&mut h, path, data)
    };
    add(&mut tar, CHECKSUMS_FILE, plan.checksums)?;
    count += 1;
    if let Some(sig) = plan.signature {
        add(&mut tar, SIGNATURE_FILE, sig)?;
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
        ensure_dirs(&mut tar, p)?;
        add(&mut tar, p, b)?;
        count += 1;
    }
    if let Some((d, _)) = plan.blobs.iter().min() {
        ensure_dirs(&mut tar, &d.layout_path())?;
    }
    let mut head = tar.into_inner()?;
    // into_inner finished the archive with its two end blocks: they belong after the blobs.
    head.truncate(head.len().saturating_sub(1024));
    Ok((head, count))
}

/// Room on the file system of `dir`: (bytes free to this user, bytes in all).
fn space(dir: &Path) -> io::Result<(u64, u64)> {
    crate::store::file::space(dir)
}

/// Can the file system that will hold `dest` take `needed` bytes? Refused (exit 1, [`PackError::Plan`]) when
/// it is larger than the whole file system: no cleaning makes room for it; refused as a full
/// disk (exit 3, `StorageFull`) when it is larger than what is free now. `what` names what
/// makes the bundle that large (its largest blob and image), for both messages.
pub fn check_room(dest: &Path, needed: u64, what: &str) -> Result<(), PackError> {
    let dir = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let (free, all) = space(dir).map_err(|source| PackError::Write {
        path: dest.to_path_buf(),
        source,
    })?;
    let h = crate::text::human_bytes;
    if needed > all {
        return Err(PackError::Plan {
            path: dest.to_path_buf(),
            reason: format!(
                "it would be {needed} bytes ({}), more than the whole file system of {} holds ({} in all){what}: no cleaning makes room for it",
                h(needed),
                dir.display(),
                h(all)
            ),
        });
    }
    if needed > free {
        return Err(PackError::Write {
            path: dest.to_path_buf(),
            source: io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "it needs {needed} bytes ({}) and {} has {} free{what}: No space left on device (free some space there, or write the bundle elsewhere with -o)",
                    h(needed),
                    dir.display(),
                    h(free)
                ),
            ),
        });
    }
    Ok(())
}

/// A bundle being written.
pub struct BundleWriter<'a> {
    file: Arc<File>,
    /// The bundle's eventual path, for messages.
    dest: PathBuf,
    /// Digest → (offset of its data, size).
    regions: BTreeMap<Digest, (u64, u64)>,
    done: Mutex<BTreeSet<Digest>>,
    /// Blobs an earlier run cut off mid-way: what it wrote of each, and its hash.
    prefixes: Mutex<BTreeMap<Digest, (u64, sha2::Sha256)>>,
    cache: Option<&'a BlobCache>,
    donors: Option<&'a Donors>,
    /// What to say (blobs of earlier bundles refused).
    notes: Mutex<Vec<String>>,
    /// Earlier bundles a blob of which did not match: forgotten by the index.
    refused: Mutex<BTreeSet<PathBuf>>,
    len: u64,
    files: usize,
    /// The bytes before the blobs and every blob's header: checked on disk before the file is
    /// committed ([`BundleWriter::finish`]).
    head: Vec<u8>,
    headers: Vec<(u64, tar::Header)>,
    /// Where the bytes came from.
    pub counts: Counts,
}

/// Zeros written at once (padding and the end blocks).
static ZEROS: [u8; 1024] = [0; 1024];

impl<'a> BundleWriter<'a> {
    /// Write `layout` into `out` (the temporary file of the destination `dest`): everything but
    /// the blobs' bytes is written now, the whole length reserved first. `resumed`: what an
    /// earlier run of the same build wrote there ([`resumed_regions`]): whole blobs are not
    /// written again, cut ones are continued.
    pub fn create(
        out: &File,
        dest: &Path,
        layout: TarLayout,
        resumed: Resumed,
        cache: Option<&'a BlobCache>,
        donors: Option<&'a Donors>,
    ) -> Result<BundleWriter<'a>, PackError> {
        let werr = |source: io::Error| PackError::Write {
            path: dest.to_path_buf(),
            source,
        };
        let file = out.try_clone().map_err(werr)?;
        // What an earlier run left past the new length goes; the whole size (and the record of
        // the plan after it) is reserved now: a full disk fails before any blob is downloaded.
        // Every byte that is not a blob's is written now, whatever an earlier run left there:
        // the head, each header, each padding, the two end blocks; a blob's bytes are either
        // kept after they were re-hashed ([`resumed_regions`]) or written by this run.
        let full = layout.len + TRAILER_LEN;
        if file.metadata().map_err(werr)?.len() > full {
            file.set_len(full).map_err(werr)?;
        }
        crate::store::file::reserve(&file, full).map_err(werr)?;
        crate::store::file::write_at(&file, &trailer(&layout.plan), layout.len).map_err(werr)?;
        crate::store::file::write_at(&file, &layout.head, 0).map_err(werr)?;
        for (offset, h) in &layout.headers {
            crate::store::file::write_at(&file, h.as_bytes(), *offset).map_err(werr)?;
        }
        for (offset, size) in layout.regions.values() {
            let pad = padding(*size);
            if pad > 0 {
                crate::store::file::write_at(&file, &ZEROS[..pad], offset + size).map_err(werr)?;
            }
        }
        crate::store::file::write_at(&file, &ZEROS, layout.len - 1024).map_err(werr)?;
        Ok(BundleWriter {
            file: Arc::new(file),
            dest: dest.to_path_buf(),
            regions: layout.regions,
            done: Mutex::new(resumed.kept),
            prefixes: Mutex::new(resumed.prefixes),
            cache,
            donors,
            notes: Mutex::new(Vec::new()),
            refused: Mutex::new(BTreeSet::new()),
            len: layout.len,
            files: layout.files,
            head: layout.head,
            headers: layout.headers,
            counts: Counts::default(),
        })
    }

    /// What to say, and the earlier bundles to forget (a blob of theirs did not match).
    pub fn notes(&self) -> (Vec<String>, Vec<PathBuf>) {
        let notes = self.notes.lock().map(|n| n.clone()).unwrap_or_default();
        let refused = self
            .refused
            .lock()
            .map(|r| r.iter().cloned().collect())
            .unwrap_or_default();
        (notes, refused)
    }

    /// Every blob is in. (The file's own sha256 is not taken: it would be a second hash of every
    /// byte, on the build's critical path; SHA256SUMS and its signature cover the content, and
    /// `sha256sum` gives the file's when copies are compared.)
    ///
    /// Before it is committed, the file is read back where it is not a blob: the head, every
    /// header, every padding and the end blocks must be the layout's bytes (what another
    /// writer of the same file, or a disk, changed is found here, not by the user's `tar`);
    /// then the record of the plan is cut off.
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
        let werr = |source: io::Error| PackError::Write {
            path: self.dest.clone(),
            source,
        };
        self.check_structure().map_err(werr)?;
        self.file.set_len(self.len).map_err(werr)?;
        Ok(PackStats {
            bytes: self.len,
            files: self.files,
        })
    }

    /// The bytes of the file that are not a blob's, as the layout has them.
    fn check_structure(&self) -> io::Result<()> {
        let bad = |what: String| {
            io::Error::other(format!(
                "{what} is not what was written there (the file changed while it was written: is another program writing it?)"
            ))
        };
        let mut got = vec![0u8; self.head.len()];
        crate::store::file::read_at(&self.file, &mut got, 0)?;
        if got != self.head {
            return Err(bad(
                "the start of the bundle (its checksum file, signature and small files)".into(),
            ));
        }
        let mut block = [0u8; 512];
        for (offset, h) in &self.headers {
            crate::store::file::read_at(&self.file, &mut block, *offset)?;
            if block != *h.as_bytes() {
                return Err(bad(format!("the tar header at byte {offset}")));
            }
        }
        for (d, (offset, size)) in &self.regions {
            let pad = padding(*size);
            crate::store::file::read_at(&self.file, &mut block[..pad], offset + size)?;
            if block[..pad].iter().any(|&b| b != 0) {
                return Err(bad(format!("the padding after blob {d}")));
            }
        }
        let mut end = [0u8; 1024];
        crate::store::file::read_at(&self.file, &mut end, self.len - 1024)?;
        if end != ZEROS {
            return Err(bad("the end-of-archive blocks".into()));
        }
        Ok(())
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
        self.copy_region(from, 0, len, region, on_bytes)
            .await
            .map_err(|e| self.err(e))
    }

    /// Copy `len` bytes at `from_offset` of the file `from` into the region, hashing them (on
    /// the blocking pool), telling `on_bytes` of each piece.
    async fn copy_region(
        &self,
        from: PathBuf,
        from_offset: u64,
        len: u64,
        region: u64,
        on_bytes: Option<OnBytes>,
    ) -> io::Result<sha2::Sha256> {
        let file = self.file.clone();
        tokio::task::spawn_blocking(move || -> io::Result<sha2::Sha256> {
            let src = crate::bounded::open_input(&from)?;
            let mut hasher = sha2::Sha256::new();
            let mut buf = vec![0u8; 4 << 20];
            let mut at = 0u64;
            while at < len {
                let n = (len - at).min(buf.len() as u64) as usize;
                crate::store::file::read_at(&src, &mut buf[..n], from_offset + at)?;
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
        .map_err(|e| io::Error::other(e.to_string()))?
    }

    /// Copy `desc` from an earlier bundle that holds it, re-hashing it: `true` when one did
    /// (its bytes are in place), `false` when none holds it or what they hold does not match
    /// (said, and the bundle forgotten by the index; the blob is then fetched).
    async fn copy_from_donors(&self, desc: &Descriptor, region: u64, on_bytes: &OnBytes) -> bool {
        let Some(donors) = self.donors else {
            return false;
        };
        for loc in donors.get(&desc.digest) {
            if loc.size != desc.size {
                continue;
            }
            let got = self
                .copy_region(
                    loc.bundle.to_path_buf(),
                    loc.offset,
                    desc.size,
                    region,
                    None,
                )
                .await;
            let why = match got {
                Ok(h) if Digest::from_hasher(h.clone()) == desc.digest => {
                    on_bytes(desc.size);
                    self.counts
                        .from_cache
                        .fetch_add(desc.size, Ordering::Relaxed);
                    self.counts.cached_blobs.fetch_add(1, Ordering::Relaxed);
                    return true;
                }
                Ok(h) => format!("its bytes there hash to {}", Digest::from_hasher(h)),
                Err(e) => format!("cannot read it: {e}"),
            };
            if let Ok(mut n) = self.notes.lock() {
                n.push(format!(
                    "blob {} of earlier bundle {} refused ({why}; the file changed since it was indexed): fetched again; the bundle is forgotten",
                    desc.digest,
                    loc.bundle.display()
                ));
            }
            if let Ok(mut r) = self.refused.lock() {
                r.insert(loc.bundle.to_path_buf());
            }
        }
        false
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

    /// Where a download of `desc` starts: the cache's partial download continued (its prefix
    /// copied into the region and hashed) when the source resumes at its end, else from 0.
    /// Returns the cache's partial file (when there is a cache) and the check of the blob,
    /// at the position it goes on from.
    async fn resume(
        &self,
        desc: &Descriptor,
        offset: u64,
        region: u64,
    ) -> Result<(Option<Tee>, BlobCheck), StoreError> {
        let mut tee: Option<Tee> = match self.cache {
            Some(c) => Some(c.tee(&desc.digest, desc.size)?),
            None => None,
        };
        let start = match &mut tee {
            Some(t) if t.offset() == offset => offset,
            Some(t) => {
                t.restart()?;
                0
            }
            None => {
                // The stopped run's own prefix of it, continued where it ends.
                let cut = self
                    .prefixes
                    .lock()
                    .ok()
                    .and_then(|mut p| p.remove(&desc.digest));
                if let Some((n, hasher)) = cut.filter(|(n, _)| *n == offset && offset > 0) {
                    self.counts.resumed.fetch_add(n, Ordering::Relaxed);
                    return Ok((None, BlobCheck::resumed(&desc.digest, desc.size, hasher, n)));
                }
                0
            }
        };
        match &tee {
            Some(t) if start > 0 => {
                let hasher = self
                    .copy_from_cache(t.path().to_path_buf(), start, region, None)
                    .await?;
                self.counts.from_cache.fetch_add(start, Ordering::Relaxed);
                Ok((
                    tee,
                    BlobCheck::resumed(&desc.digest, desc.size, hasher, start),
                ))
            }
            _ => Ok((tee, BlobCheck::new(&desc.digest, desc.size))),
        }
    }

    /// Receive the rest of `desc` from `stream` (which starts where `got` stands), checking it
    /// here and writing it on a thread of the blocking pool, a few MiB behind the download:
    /// receiving and hashing on one core, writing on another. What is in flight is bounded in bytes, not
    /// pieces (a piece is up to ~400 KiB on a fast link): the receiver holds a permit per KiB
    /// until the writer has written its piece.
    async fn receive(
        &self,
        desc: &Descriptor,
        region: u64,
        mut got: Received,
        mut stream: crate::store::BlobStream,
        on_bytes: &OnBytes,
    ) -> Result<Received, StoreError> {
        let budget = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT_KIB));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let start = region + got.check.received();
        let writes = spawn_writes(self.file.clone(), start, got.tee.take(), rx);
        let mut failed: Option<StoreError> = None;
        while let Some(piece) = stream.next().await {
            let piece = match piece {
                Ok(p) => p,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            if let Err(m) = got.check.update(&piece) {
                failed = Some(self.mismatch(desc, m));
                break;
            }
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
        let (written, tee) = writes.await.map_err(|e| self.err(e.to_string()))?;
        got.tee = tee;
        let written = written.err().map(|e| match e {
            WriteFail::Bundle(source) => StoreError::other(
                self.describe(),
                PackError::Write {
                    path: self.dest.clone(),
                    source,
                },
            ),
            WriteFail::Cache(c) => c.into(),
        });
        if let Some(e) = failed.or(written) {
            // A transfer that broke leaves the cache's partial file (the next run resumes);
            // content that does not match does not.
            if matches!(e, StoreError::SizeMismatch { .. }) {
                if let Some(t) = got.tee.take() {
                    t.discard();
                }
            }
            return Err(e);
        }
        Ok(got)
    }

    /// What the blob check found wrong with `desc`, as this store says it.
    fn mismatch(&self, desc: &Descriptor, m: BlobMismatch) -> StoreError {
        StoreError::mismatch(self.describe(), format!("blob {}", desc.digest), m)
    }

    /// The whole blob arrived: it must be `desc`'s size and digest (else what the cache got is
    /// dropped too); the cache's copy is committed.
    fn finish_blob(&self, desc: &Descriptor, got: Received) -> Result<(), StoreError> {
        let Received { check, mut tee } = got;
        if let Err(m) = check.finish() {
            if let Some(t) = tee.take() {
                t.discard();
            }
            return Err(self.mismatch(desc, m));
        }
        if let Some(t) = tee {
            t.commit()?;
        }
        self.mark_done(&desc.digest);
        Ok(())
    }
}

/// A blob being received: its check so far and the cache's partial file it also goes to.
struct Received {
    check: BlobCheck,
    tee: Option<Tee>,
}

/// Why the writing side of a transfer stopped.
enum WriteFail {
    Bundle(io::Error),
    Cache(crate::store::CacheError),
}

type Piece = (bytes::Bytes, tokio::sync::OwnedSemaphorePermit);

/// The writing side of a transfer, on the blocking pool: each piece goes to the cache's partial
/// file at once (what a killed build keeps), the bundle gets them a MiB at a time from
/// `start_at` on. Gives the partial file back at the end.
fn spawn_writes(
    file: Arc<File>,
    start_at: u64,
    mut tee: Option<Tee>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Piece>,
) -> tokio::task::JoinHandle<(Result<(), WriteFail>, Option<Tee>)> {
    tokio::task::spawn_blocking(move || {
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
                // Stop at the first failure: the channel ends with this thread, so the
                // receiving side stops too (its send fails) rather than download the rest of
                // the blob for nothing, and learns of the error at the end.
                break;
            }
            if let Some(t) = &mut tee {
                if let Err(e) = t.write(&piece) {
                    result = Err(WriteFail::Cache(e));
                    continue;
                }
            }
            // Never past the capacity: `extend_from_slice` would double the buffer (massif:
            // 8 MiB of a build's 16 MB heap peak were these buffers at 2 MiB each).
            if buf.len() + piece.len() > WRITE_PIECE && !buf.is_empty() {
                result = flush(&mut buf, &mut at);
                if result.is_err() {
                    continue;
                }
            }
            if piece.len() >= WRITE_PIECE {
                // Already a whole write: straight through, not copied into the buffer.
                result = crate::store::file::write_at(&file, &piece, at).map_err(WriteFail::Bundle);
                at += piece.len() as u64;
                continue;
            }
            buf.extend_from_slice(&piece);
            if buf.len() >= WRITE_PIECE {
                result = flush(&mut buf, &mut at);
            }
        }
        if result.is_ok() && !buf.is_empty() {
            result = flush(&mut buf, &mut at);
        }
        (result, tee)
    })
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
            return Ok(Have::Nothing);
        }
        let cut = self
            .prefixes
            .lock()
            .ok()
            .and_then(|p| p.get(&desc.digest).map(|(n, _)| *n));
        Ok(match cut {
            Some(n)
                if n < desc.size && self.donors.is_none_or(|d| d.get(&desc.digest).is_empty()) =>
            {
                Have::Partial(n)
            }
            _ => Have::Nothing,
        })
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
        if self.copy_from_donors(desc, region, on_bytes).await {
            self.mark_done(&desc.digest);
            return Ok(());
        }
        let (tee, check) = self.resume(desc, offset, region).await?;
        let pos = check.received();
        let stream = data.open(pos).await?;
        let got = self
            .receive(desc, region, Received { check, tee }, stream, on_bytes)
            .await;
        let own_prefix = self.cache.is_none() && pos > 0;
        match got.and_then(|got| self.finish_blob(desc, got)) {
            // What the stopped run left of it did not hold (torn, or another layout's bytes
            // at that place): the whole blob is fetched again.
            Err(StoreError::DigestMismatch { .. } | StoreError::SizeMismatch { .. })
                if own_prefix =>
            {
                let stream = data.open(0).await?;
                let received = Received {
                    check: BlobCheck::new(&desc.digest, desc.size),
                    tee: None,
                };
                let got = self
                    .receive(desc, region, received, stream, on_bytes)
                    .await?;
                self.finish_blob(desc, got)
            }
            other => other,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn plan<'a>(blobs: &'a [(Digest, u64)], files: &'a [(String, Vec<u8>)]) -> Entries<'a> {
        Entries {
            files,
            blobs,
            tools: &[],
            mtime: 0,
            checksums: b"sums",
            signature: None,
        }
    }

    #[test]
    fn sizes_that_would_wrap_are_refused_when_laid_out() {
        let dest = Path::new("b.tar");
        let files = [("index.json".to_string(), b"{}".to_vec())];
        let (a, b) = (Digest::of(b"a"), Digest::of(b"b"));
        // 2^64 - 1 rounds up past u64: it wrapped to 0 and the regions overlapped.
        for blobs in [
            vec![(a.clone(), u64::MAX)],
            vec![(a.clone(), size::MAX_SIZE)],
            vec![
                (a.clone(), size::MAX_SIZE / 2),
                (b.clone(), size::MAX_SIZE / 2),
            ],
        ] {
            let e = TarLayout::new(dest, &plan(&blobs, &files)).unwrap_err();
            assert!(matches!(e, PackError::Plan { .. }), "{e}");
            assert!(e.to_string().contains("2^63 - 1"), "{e}");
        }
        // One digest, two sizes.
        let e = TarLayout::new(dest, &plan(&[(a.clone(), 1), (a.clone(), 2)], &files)).unwrap_err();
        assert!(e.to_string().contains("as 1 bytes and as 2 bytes"), "{e}");
        // Large but possible: laid out, regions in order and apart, the length their sum.
        let blobs = [(a.clone(), 1 << 40), (b.clone(), 1000)];
        let l = TarLayout::new(dest, &plan(&blobs, &files)).unwrap();
        let regions: Vec<_> = l.regions().collect();
        assert_eq!(regions.len(), 2);
        let (_, o0, s0) = regions[0];
        let (_, o1, s1) = regions[1];
        assert!(o0 + s0 <= o1 - 512, "{regions:?}");
        assert_eq!(l.len(), (o1 + s1).next_multiple_of(512) + 1024);
    }

    #[test]
    fn room_is_the_whole_file_system_then_what_is_free() {
        let dir = std::env::temp_dir();
        let dest = dir.join("b.tar");
        let (free, all) = space(&dir).unwrap();
        check_room(&dest, 1, "").unwrap();
        // More than the file system holds: the plan is impossible (exit 1).
        let e = check_room(&dest, all + 1, "; its largest blob is X").unwrap_err();
        assert!(matches!(e, PackError::Plan { .. }), "{e}");
        let text = e.to_string();
        assert!(text.contains("whole file system") && text.contains("largest blob is X"));
        // More than is free, less than it holds: a full disk (exit 3). The machine is shared:
        // what is free may grow between two reads (another process removed files), so the
        // free space is read again until it holds still across the check.
        if free < all {
            let mut free = free;
            let e = loop {
                match check_room(&dest, free + 1, "") {
                    Err(e) => break e,
                    Ok(()) => {
                        let (now, _) = space(&dir).unwrap();
                        assert!(now > free, "{} bytes fit in {free} free", free + 1);
                        free = now;
                    }
                }
            };
            match e {
                PackError::Write { source, .. } => {
                    assert_eq!(source.kind(), io::ErrorKind::StorageFull);
                    assert!(source.to_string().contains("No space left on device"));
                }
                other => panic!("{other}"),
            }
        }
    }
}
