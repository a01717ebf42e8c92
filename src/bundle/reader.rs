//! Reading a bundle in place, in one streaming pass: the head (checksum file, signature,
//! bundle manifest) for `inspect`, and the full check for `verify`. Unsafe tar entries (absolute
//! paths, `..`, links, devices, duplicates) and files the checksum file does not list are refused.

use super::checksums::Checksums;
use super::sign::{self, SignatureInfo};
use super::{BundleManifest, CHECKSUMS_FILE, MANIFEST_FILE, SIGNATURE_FILE};
use crate::oci::{Digest, Manifest};
use koord_splitset::{BundleFile, PartsError};
use minisign::PublicKey;
use sha2::Digest as _;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

/// Largest small file read into memory: the checksum file, its signature, the bundle manifest,
/// `index.json`, and every other file of the head (the chart archive, the CRDs, the BOM).
pub const MAX_SMALL: u64 = 64 * 1024 * 1024;

pub use super::checksums::safe_path;

/// Why a bundle is refused.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// A part of a split bundle is missing, short or altered, or its header is bad.
    // Every PartsError names its file (the bundle itself, or a part of it).
    #[error("bundle {source}")]
    Parts {
        /// The bundle (first part).
        path: PathBuf,
        /// What is wrong.
        source: PartsError,
    },
    /// Cannot read the file.
    #[error("cannot read bundle {path}: {source}")]
    Io {
        /// The bundle.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The tar is damaged or truncated.
    #[error("bundle {path} is not a readable tar (truncated or damaged?): {reason}")]
    Tar {
        /// The bundle.
        path: PathBuf,
        /// Details.
        reason: String,
    },
    /// The file does not start with a tar header: not a bundle at all (its bytes are not
    /// quoted: they are anything).
    #[error("{0} is not a tar archive (no tar header at the start): not a koord-bundle bundle (NAME.tar, or a part NAME.partNNN of a split set), or damaged at its start")]
    NotATar(PathBuf),
    /// The bundle does not start with the checksum file.
    #[error("bundle {0} does not start with SHA256SUMS: not a koord-bundle bundle, or damaged")]
    NoChecksums(PathBuf),
    /// The checksum file is malformed.
    #[error(transparent)]
    Checksums(#[from] super::checksums::ChecksumsError),
    /// No signature, and one is required.
    #[error("bundle {0} is not signed: refusing it (pass --insecure-skip-signature to accept an unsigned bundle)")]
    Unsigned(PathBuf),
    /// The signature does not verify.
    #[error("bundle {path}: {source}")]
    Signature {
        /// The bundle.
        path: PathBuf,
        /// The failure.
        source: sign::SignError,
    },
    /// An unsafe or unexpected tar entry.
    #[error("bundle {path}: entry {entry:?} refused: {reason}")]
    Entry {
        /// The bundle.
        path: PathBuf,
        /// The entry.
        entry: String,
        /// Why.
        reason: String,
    },
    /// A file does not match its checksum.
    #[error("bundle {path}: {entry} has digest {actual}, SHA256SUMS says {expected}")]
    Mismatch {
        /// The bundle.
        path: PathBuf,
        /// The entry.
        entry: String,
        /// Expected.
        expected: Digest,
        /// Actual.
        actual: Digest,
    },
    /// Files listed but absent.
    #[error("bundle {path}: listed in SHA256SUMS but missing: {}", missing.join(", "))]
    Missing {
        /// The bundle.
        path: PathBuf,
        /// The files.
        missing: Vec<String>,
    },
    /// The file is shorter than what its head says the bundle holds: cut short in a copy.
    #[error("bundle {path} is truncated: the file is {size} bytes, the bundle needs at least {needed} ({files} files after its head, {blobs} blobs of {blob_bytes} bytes among them): copy it again in full")]
    Truncated {
        /// The bundle.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The least size of the whole bundle: its head, then a tar header and the bytes of
        /// every blob, then the end of the archive.
        needed: u64,
        /// Files SHA256SUMS lists after the head.
        files: u64,
        /// Blobs its manifest counts.
        blobs: usize,
        /// Their bytes.
        blob_bytes: u64,
    },
    /// The content is inconsistent (manifest, layout).
    #[error("bundle {path}: {reason}")]
    Content {
        /// The bundle.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

impl crate::exit::Classify for VerifyError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        match self {
            // The part's own error (the next in the chain) decides; reading the bundle given:
            // the kind of I/O error (missing, a directory: the input; the disk: the machine).
            VerifyError::Parts { .. } | VerifyError::Io { .. } => None,
            VerifyError::Checksums(c) => crate::exit::Classify::exit_class(c),
            // Not a bundle, unsigned, a signature or digest that does not verify, truncated.
            _ => Some(crate::exit::ExitClass::Input),
        }
    }
}

/// Open a bundle (a file, or the first part of a split bundle), transparently un-gzipping.
pub fn open(path: &Path) -> Result<Box<dyn Read>, VerifyError> {
    Ok(open_file(&BundleFile::open(path).map_err(|e| parts_err(path, e))?)?.0)
}

fn parts_err(path: &Path, e: PartsError) -> VerifyError {
    VerifyError::Parts {
        path: path.to_path_buf(),
        source: e,
    }
}

/// The byte stream of an opened bundle and whether it is gzip-compressed.
fn open_file(bf: &BundleFile) -> Result<(Box<dyn Read>, bool), VerifyError> {
    let mut r = BufReader::with_capacity(
        1 << 16,
        ReadAhead::new(bf.reader().map_err(|e| parts_err(&bf.path, e))?),
    );
    let head = io::BufRead::fill_buf(&mut r).map_err(|source| VerifyError::Io {
        path: bf.path.clone(),
        source,
    })?;
    if head.starts_with(&[0x1f, 0x8b]) {
        // Every gzip member: data appended after the first one is read (and refused as
        // trailing data) rather than silently ignored.
        Ok((Box::new(flate2::read::MultiGzDecoder::new(r)), true))
    } else {
        Ok((Box::new(r), false))
    }
}

/// Reads the underlying stream on a thread of its own, a few MiB ahead, so that reading the
/// file and hashing it run on two cores.
pub struct ReadAhead {
    rx: std::sync::mpsc::Receiver<io::Result<Vec<u8>>>,
    chunk: Vec<u8>,
    pos: usize,
    done: bool,
}

impl ReadAhead {
    /// Start reading `inner` ahead.
    pub fn new<R: Read + Send + 'static>(mut inner: R) -> Self {
        let (tx, rx) = std::sync::mpsc::sync_channel(4);
        std::thread::spawn(move || loop {
            let mut buf = vec![0u8; 1 << 20];
            let mut filled = 0;
            let res = loop {
                match inner.read(&mut buf[filled..]) {
                    Ok(0) => break Ok(()),
                    Ok(n) => {
                        filled += n;
                        if filled == buf.len() {
                            break Ok(());
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => break Err(e),
                }
            };
            buf.truncate(filled);
            let end = filled == 0;
            let sent = match res {
                Ok(()) if end => tx.send(Ok(Vec::new())),
                Ok(()) => tx.send(Ok(buf)),
                Err(e) => {
                    if filled > 0 && tx.send(Ok(buf)).is_err() {
                        return;
                    }
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            if sent.is_err() || end {
                return;
            }
        });
        ReadAhead {
            rx,
            chunk: Vec::new(),
            pos: 0,
            done: false,
        }
    }
}

impl Read for ReadAhead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.chunk.len() {
            if self.done {
                return Ok(0);
            }
            match self.rx.recv() {
                Ok(Ok(c)) if c.is_empty() => self.done = true,
                Ok(Ok(c)) => {
                    self.chunk = c;
                    self.pos = 0;
                }
                Ok(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                // The reading thread ended without saying the stream ended: an error, never
                // an end of the stream (the bytes after it would be taken as missing).
                Err(_) => {
                    self.done = true;
                    return Err(io::Error::other(
                        "the reading thread stopped before the end of the stream",
                    ));
                }
            }
        }
        let n = buf.len().min(self.chunk.len() - self.pos);
        buf[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// The first entries of a bundle.
#[derive(Debug, Clone)]
pub struct Head {
    /// SHA256SUMS bytes.
    pub checksums: Vec<u8>,
    /// The signature, if signed.
    pub signature: Option<Vec<u8>>,
    /// koord-bundle.json bytes.
    pub manifest: Vec<u8>,
    /// Where the head ends in the archive (the offset after the manifest's entry).
    pub end: u64,
    /// Whether the bundle is gzip-compressed (`end` is then an offset in the decompressed
    /// stream).
    pub gzip: bool,
}

/// Tar blocks are 512 bytes.
const TAR_BLOCK: u64 = 512;

/// Whether `block` is a whole tar header whose checksum holds.
fn is_tar_header(block: &[u8]) -> bool {
    if block.len() < TAR_BLOCK as usize {
        return false;
    }
    let Ok(want) = tar::Header::from_byte_slice(&block[..TAR_BLOCK as usize]).cksum() else {
        return false;
    };
    let sum: u32 = block[..TAR_BLOCK as usize]
        .iter()
        .enumerate()
        .map(|(i, b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u32::from(*b)
            }
        })
        .sum();
    sum == want
}

/// Most tar headers [`walk_to_end`] reads (a bundle of 600,000 files; the walk then gives up).
const MAX_WALK: usize = 1 << 20;

/// Walk the tar headers of `bf` from `from` (a header's offset) by seeking: the least size of
/// the whole archive, when it is larger than the file (an entry, or the end of the archive,
/// lies beyond the file's end); `None` when the archive ends within the file, or a header is
/// not readable (the reader that follows says why).
fn walk_to_end(bf: &BundleFile, from: u64) -> Option<u64> {
    use std::os::unix::fs::FileExt as _;
    // A plain file (check_complete walks nothing else), opened once for the walk: one
    // positioned read per header, where `read_range` opened the file for each (`verify` of a
    // 1.8.0 bundle opened its file 68 times, 62 of them here).
    let file = crate::bounded::open_input(&bf.path).ok()?;
    let mut block = vec![0u8; TAR_BLOCK as usize];
    let mut pos = from;
    for _ in 0..MAX_WALK {
        if pos.saturating_add(TAR_BLOCK) > bf.size {
            // Not even the end-of-archive blocks.
            return Some(pos.saturating_add(2 * TAR_BLOCK));
        }
        file.read_exact_at(&mut block, pos).ok()?;
        if block.iter().all(|b| *b == 0) {
            let end = pos.saturating_add(2 * TAR_BLOCK);
            return (end > bf.size).then_some(end);
        }
        let size = tar::Header::from_byte_slice(&block).entry_size().ok()?;
        let entry_end = pos
            .saturating_add(TAR_BLOCK)
            .saturating_add(size.div_ceil(TAR_BLOCK).saturating_mul(TAR_BLOCK));
        if entry_end > bf.size {
            return Some(entry_end.saturating_add(2 * TAR_BLOCK));
        }
        pos = entry_end;
    }
    None
}

/// Refuse a bundle cut short (a copy that stopped, the first 300 MB of a larger file) with a
/// message that says so and by how much, before anything reads or verifies the rest: the file
/// must hold at least its head, then a tar header for each file its SHA256SUMS lists and the
/// bytes of the blobs its manifest counts, then the two zero blocks that end an archive; and
/// the tar headers after the head, walked by seeking (one 512-byte read per file), must each
/// find their entry whole in the file, which catches a cut anywhere. (A split set knows the size of each
/// part and says so itself; a gzip bundle's size says nothing about its content.)
pub fn check_complete(bf: &BundleFile, head: &Head) -> Result<(), VerifyError> {
    if head.gzip || bf.is_split() {
        return Ok(());
    }
    let Ok(m) = serde_json::from_slice::<BundleManifest>(&head.manifest) else {
        // Unreadable: the reader that parses it says so.
        return Ok(());
    };
    // Every file SHA256SUMS lists but the manifest (in the head) comes after the head, each
    // with a tar header of its own.
    let files = head
        .checksums
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty() && !l.ends_with(MANIFEST_FILE.as_bytes()))
        .count() as u64;
    let needed = head
        .end
        .saturating_add(files.saturating_mul(TAR_BLOCK))
        .saturating_add(m.blobs.bytes)
        .saturating_add(2 * TAR_BLOCK);
    let needed = needed.max(walk_to_end(bf, head.end).unwrap_or(0));
    if bf.size < needed {
        return Err(VerifyError::Truncated {
            path: bf.path.clone(),
            size: bf.size,
            needed,
            files,
            blobs: m.blobs.count,
            blob_bytes: m.blobs.bytes,
        });
    }
    Ok(())
}

fn read_small(path: &Path, name: &str, r: impl Read, size: u64) -> Result<Vec<u8>, VerifyError> {
    if size > MAX_SMALL {
        return Err(VerifyError::Entry {
            path: path.to_path_buf(),
            entry: name.into(),
            reason: format!("{size} bytes is too large"),
        });
    }
    // Grown as bytes arrive, not reserved from the size a (not yet verified) header claims.
    let mut buf = Vec::with_capacity(size.min(64 * 1024) as usize);
    r.take(size)
        .read_to_end(&mut buf)
        .map_err(|e| VerifyError::Tar {
            path: path.to_path_buf(),
            reason: crate::text::printable(&e.to_string()),
        })?;
    Ok(buf)
}

/// Read only the head: checksum file, signature and bundle manifest (the first entries).
pub fn read_head(path: &Path) -> Result<Head, VerifyError> {
    read_head_of(&BundleFile::open(path).map_err(|e| parts_err(path, e))?)
}

/// [`read_head`] of a bundle already opened (a split set keeps the log of what it rebuilt).
pub fn read_head_of(bf: &BundleFile) -> Result<Head, VerifyError> {
    let path = &bf.path;
    let (mut stream, gzip) = open_file(bf)?;
    // The first block is a tar header, or this is no bundle: said so, rather than what the
    // tar reader makes of random bytes.
    let mut first = Vec::with_capacity(TAR_BLOCK as usize);
    (&mut stream)
        .take(TAR_BLOCK)
        .read_to_end(&mut first)
        .map_err(|e| VerifyError::Tar {
            path: path.to_path_buf(),
            reason: crate::text::printable(&e.to_string()),
        })?;
    if !is_tar_header(&first) {
        return Err(VerifyError::NotATar(path.to_path_buf()));
    }
    let mut ar = tar::Archive::new(io::Cursor::new(first).chain(stream));
    let terr = |e: io::Error| VerifyError::Tar {
        path: path.to_path_buf(),
        reason: crate::text::printable(&e.to_string()),
    };
    let mut checksums = None;
    let mut signature = None;
    for entry in ar.entries().map_err(terr)? {
        let entry = entry.map_err(terr)?;
        let name = entry.path().map_err(terr)?.to_string_lossy().to_string();
        let size = entry.size();
        if let Some(reason) = header_fault(&name, entry.header()) {
            return Err(VerifyError::Entry {
                path: path.to_path_buf(),
                entry: name,
                reason,
            });
        }
        match name.as_str() {
            CHECKSUMS_FILE if checksums.is_none() => {
                checksums = Some(read_small(path, &name, entry, size)?)
            }
            SIGNATURE_FILE if checksums.is_some() => {
                signature = Some(read_small(path, &name, entry, size)?)
            }
            MANIFEST_FILE if checksums.is_some() => {
                let end = entry
                    .raw_file_position()
                    .saturating_add(size.div_ceil(TAR_BLOCK).saturating_mul(TAR_BLOCK));
                let manifest = read_small(path, &name, entry, size)?;
                return Ok(Head {
                    checksums: checksums.unwrap_or_default(),
                    signature,
                    manifest,
                    end,
                    gzip,
                });
            }
            _ => return Err(VerifyError::NoChecksums(path.to_path_buf())),
        }
    }
    Err(VerifyError::NoChecksums(path.to_path_buf()))
}

/// Most bytes of a bundle's head (the files before `blobs/`) read into memory: many times a
/// real head (1.8.0: its chart archive, 13 CRDs and the small files, about 1 MiB).
pub const MAX_HEAD_BYTES: u64 = 256 * 1024 * 1024;
/// Most files in a bundle's head (1.8.0: 19).
pub const MAX_HEAD_FILES: usize = 10_000;

/// Every file of a bundle's head: the entries before `blobs/` (the checksum file, the
/// signature, the bundle manifest, the bill of materials, `index.json`, the chart archive, the
/// CRDs). Read in one pass that stops at the first blob, so it costs the same for a bundle of
/// 1 MiB or 100 GiB.
#[derive(Debug, Clone)]
pub struct WholeHead {
    /// SHA256SUMS bytes.
    pub checksums: Vec<u8>,
    /// The signature, if signed.
    pub signature: Option<Vec<u8>>,
    /// Every other file before `blobs/`, in the bundle's order.
    pub files: Vec<(String, Vec<u8>)>,
}

impl WholeHead {
    /// The bytes of the file `name`, if the head holds it.
    pub fn file(&self, name: &str) -> Option<&[u8]> {
        self.files
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b.as_slice())
    }

    /// The bundle manifest's bytes.
    pub fn manifest(&self, path: &Path) -> Result<&[u8], VerifyError> {
        self.file(MANIFEST_FILE)
            .ok_or_else(|| VerifyError::Missing {
                path: path.to_path_buf(),
                missing: vec![MANIFEST_FILE.into()],
            })
    }

    /// Check every file of the head against `SHA256SUMS` (`path` names the bundle): each must
    /// be listed, with its digest. The parsed checksum file.
    pub fn check(&self, path: &Path) -> Result<Checksums, VerifyError> {
        let sums = Checksums::parse(&self.checksums)?;
        for (name, bytes) in &self.files {
            let Some(expected) = sums.0.get(name) else {
                return Err(VerifyError::Entry {
                    path: path.to_path_buf(),
                    entry: name.clone(),
                    reason: "not listed in SHA256SUMS".into(),
                });
            };
            let actual = Digest::of(bytes);
            if &actual != expected {
                return Err(VerifyError::Mismatch {
                    path: path.to_path_buf(),
                    entry: name.clone(),
                    expected: expected.clone(),
                    actual,
                });
            }
        }
        Ok(sums)
    }
}

/// What is wrong with the header of the entry `name`, as the format has it (bundle-spec §1):
/// mode 0644 for files (0755 for the programs under `tools/`), 0755 for directories, uid and
/// gid 0. `None` when it holds. The bytes of an entry are signed, its header is not: a header
/// rewritten to mode 6777 or uid 1000 passed, and `tar xf … tools` as root then made setuid,
/// world-writable copies of koord-bundle and helm.
pub(crate) fn header_fault(name: &str, h: &tar::Header) -> Option<String> {
    let dir = h.entry_type() == tar::EntryType::Directory;
    let want = if dir || name.starts_with("tools/") {
        0o755
    } else {
        0o644
    };
    let mode = match h.mode() {
        Ok(m) => m,
        Err(_) => return Some("its mode field is not a number".into()),
    };
    if mode != want {
        let mut what = Vec::new();
        for (bit, word) in [
            (0o4000, "setuid"),
            (0o2000, "setgid"),
            (0o1000, "sticky"),
            (0o002, "world-writable"),
            (0o020, "group-writable"),
        ] {
            if mode & bit != 0 {
                what.push(word);
            }
        }
        let what = if what.is_empty() {
            String::new()
        } else {
            format!(" ({})", what.join(", "))
        };
        return Some(format!(
            "mode {mode:04o}{what}: the format gives this entry mode {want:04o}; the bundle was changed after it was written (do not extract it)"
        ));
    }
    for (field, value) in [("uid", h.uid()), ("gid", h.gid())] {
        match value {
            Ok(0) => {}
            Ok(v) => {
                return Some(format!(
                    "{field} {v}: the format gives every entry {field} 0; the bundle was changed after it was written (do not extract it)"
                ))
            }
            Err(_) => return Some(format!("its {field} field is not a number")),
        }
    }
    None
}

/// Read a bundle's head: every entry before `blobs/`, within [`MAX_HEAD_BYTES`] and
/// [`MAX_HEAD_FILES`]; unsafe entries and entries other than files and directories are
/// refused, as [`verify`] refuses them. Nothing is checked against `SHA256SUMS` here: see
/// [`WholeHead::check`].
pub fn read_whole_head(bf: &BundleFile) -> Result<WholeHead, VerifyError> {
    let path = &bf.path;
    let mut ar = tar::Archive::new(open_file(bf)?.0);
    let terr = |e: io::Error| tar_err(path, e);
    let entry_err = |entry: &str, reason: String| VerifyError::Entry {
        path: path.to_path_buf(),
        entry: entry.to_string(),
        reason,
    };
    let mut head = WholeHead {
        checksums: Vec::new(),
        signature: None,
        files: Vec::new(),
    };
    let mut bytes = 0u64;
    for (i, entry) in ar.entries().map_err(terr)?.enumerate() {
        let entry = entry.map_err(terr)?;
        let name = String::from_utf8_lossy(&entry.path_bytes()).to_string();
        let size = entry.size();
        if let Some(fault) = header_fault(&name, entry.header()) {
            return Err(entry_err(&name, fault));
        }
        if i == 0 {
            if name != CHECKSUMS_FILE || entry.header().entry_type() != tar::EntryType::Regular {
                return Err(VerifyError::NoChecksums(path.to_path_buf()));
            }
            head.checksums = read_small(path, &name, entry, size)?;
            continue;
        }
        if name.starts_with("blobs/") {
            return Ok(head);
        }
        if !safe_path(&name) {
            return Err(entry_err(
                &name,
                "unsafe path (absolute, `..` or empty component)".into(),
            ));
        }
        match entry.header().entry_type() {
            tar::EntryType::Directory => continue,
            tar::EntryType::Regular | tar::EntryType::Continuous => {}
            other => {
                return Err(entry_err(
                    &name,
                    format!("entry type {other:?} is not allowed (only files and directories)"),
                ))
            }
        }
        bytes = bytes.saturating_add(size);
        if bytes > MAX_HEAD_BYTES || head.files.len() >= MAX_HEAD_FILES {
            return Err(entry_err(
                &name,
                format!(
                    "the files before blobs/ pass {} or {MAX_HEAD_FILES} files: not a bundle koord-bundle wrote",
                    crate::text::human_bytes(MAX_HEAD_BYTES)
                ),
            ));
        }
        let data = read_small(path, &name, entry, size)?;
        if i == 1 && name == SIGNATURE_FILE {
            head.signature = Some(data);
        } else if head.files.iter().any(|(n, _)| *n == name) || name == SIGNATURE_FILE {
            return Err(entry_err(&name, "duplicate entry".into()));
        } else {
            head.files.push((name, data));
        }
    }
    // A bundle without blobs (no image at all) ends here.
    if head.file(MANIFEST_FILE).is_none() {
        return Err(VerifyError::NoChecksums(path.to_path_buf()));
    }
    Ok(head)
}

/// What `verify` found.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyReport {
    /// The bundle.
    pub bundle: PathBuf,
    /// Files checked against SHA256SUMS.
    pub files: usize,
    /// Of which blobs.
    pub blobs: usize,
    /// Bytes hashed.
    pub bytes: u64,
    /// The signature, when checked.
    pub signature: Option<SignatureInfo>,
    /// Whether the signature was verified with a key.
    pub signature_verified: bool,
    /// Manifests walked in the layout.
    pub manifests: usize,
    /// The bundle manifest.
    #[serde(skip)]
    pub manifest: Option<BundleManifest>,
    /// Where each blob's bytes sit in the bundle file (plain tar only): digest → (offset, size).
    #[serde(skip)]
    pub blob_locations: BTreeMap<Digest, (u64, u64)>,
    /// Where each program carried for the site (`tools/…`) sits: path → (offset, size).
    #[serde(skip)]
    pub tool_locations: BTreeMap<String, (u64, u64)>,
    /// Small JSON blobs (manifests, configs) held in memory (handed out without a copy).
    #[serde(skip)]
    pub small_blobs: BTreeMap<Digest, bytes::Bytes>,
    /// Whether the bundle is gzip-compressed (then blobs cannot be read in place).
    pub compressed: bool,
    /// The bundle's file(s), when verified from disk.
    #[serde(skip)]
    pub file: Option<BundleFile>,
    /// The descriptors `index.json` roots the layout at (walked by
    /// [`super::source::check_layout`]).
    #[serde(skip)]
    pub roots: Vec<crate::oci::Descriptor>,
}

/// How to treat the signature.
pub enum SignaturePolicy<'a> {
    /// Verify with this key; unsigned is an error.
    Require(&'a PublicKey),
    /// Do not check it (`--insecure-skip-signature`).
    Skip,
}

/// Entries at least this large are hashed after the pass over the tar, in parallel, when the
/// bundle is a plain file (random access); smaller ones as they are read.
const DEFER_OVER: u64 = 1024 * 1024;
/// Bytes read per request when hashing a deferred entry.
const HASH_PIECE: usize = 4 << 20;

/// An entry whose bytes were not hashed in the pass over the tar.
#[derive(Debug, Clone)]
struct Deferred {
    name: String,
    offset: u64,
    size: u64,
    expected: Digest,
}

/// Files of a verified layout whose bytes are still to be hashed: [`read_entries`] leaves the
/// large ones of a plain bundle for [`Unhashed::hash`], which hashes them on every core.
#[derive(Debug)]
pub struct Unhashed {
    path: PathBuf,
    file: Option<std::fs::File>,
    items: Vec<Deferred>,
}

impl Unhashed {
    /// Bytes still to hash.
    pub fn bytes(&self) -> u64 {
        self.items
            .iter()
            .fold(0u64, |a, d| a.saturating_add(d.size))
    }

    /// How many files.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when nothing is left to hash.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Hash every file left, largest first, one per core at a time (positional reads of the
    /// bundle file); each must match SHA256SUMS.
    pub fn hash(mut self, on_bytes: &(dyn Fn(u64) + Sync)) -> Result<(), VerifyError> {
        let Some(file) = self.file.take() else {
            return Ok(());
        };
        self.items.sort_by_key(|d| std::cmp::Reverse(d.size));
        let queue = std::sync::Mutex::new(self.items.into_iter());
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .clamp(1, 4);
        let path = &self.path;
        let hash_one = |d: &Deferred, buf: &mut Vec<u8>| -> Result<(), VerifyError> {
            let mut hasher = sha2::Sha256::new();
            let mut at = 0u64;
            while at < d.size {
                let n = (d.size - at).min(HASH_PIECE as u64) as usize;
                crate::store::file::read_at(&file, &mut buf[..n], d.offset + at).map_err(|e| {
                    VerifyError::Tar {
                        path: path.clone(),
                        reason: format!("{} is truncated: {e}", d.name),
                    }
                })?;
                hasher.update(&buf[..n]);
                on_bytes(n as u64);
                at += n as u64;
            }
            let actual = Digest::from_hasher(hasher);
            if actual != d.expected {
                return Err(VerifyError::Mismatch {
                    path: path.clone(),
                    entry: d.name.clone(),
                    expected: d.expected.clone(),
                    actual,
                });
            }
            Ok(())
        };
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    scope.spawn(|| -> Result<(), VerifyError> {
                        let mut buf = vec![0u8; HASH_PIECE];
                        loop {
                            let next = match queue.lock() {
                                Ok(mut q) => q.next(),
                                Err(_) => None,
                            };
                            let Some(d) = next else { return Ok(()) };
                            hash_one(&d, &mut buf)?;
                        }
                    })
                })
                .collect();
            let mut first_err = None;
            for w in workers {
                let r = w.join().unwrap_or_else(|_| {
                    Err(VerifyError::Content {
                        path: path.clone(),
                        reason: "a hashing thread panicked".into(),
                    })
                });
                if let (Err(e), None) = (r, &first_err) {
                    first_err = Some(e);
                    // Stop the others soon: nothing more is taken from the queue.
                    if let Ok(mut q) = queue.lock() {
                        for _ in q.by_ref() {}
                    }
                }
            }
            first_err.map_or(Ok(()), Err)
        })
    }
}

/// A plain bundle file read with seeks: the pass over the tar skips the bytes of deferred
/// entries.
struct SeekInput(BufReader<std::fs::File>);

impl Read for SeekInput {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl io::Seek for SeekInput {
    fn seek(&mut self, pos: io::SeekFrom) -> io::Result<u64> {
        self.0.seek(pos)
    }
}

/// How the pass over the tar gets its entries.
trait TarInput: Read + Sized {
    /// Whether large entries may be left for [`Unhashed`] (their bytes are skipped, not read).
    const DEFER: bool;
    fn entries(ar: &mut tar::Archive<Self>) -> io::Result<tar::Entries<'_, Self>>;
}

impl TarInput for Box<dyn Read> {
    const DEFER: bool = false;
    fn entries(ar: &mut tar::Archive<Self>) -> io::Result<tar::Entries<'_, Self>> {
        ar.entries()
    }
}

impl TarInput for SeekInput {
    const DEFER: bool = true;
    fn entries(ar: &mut tar::Archive<Self>) -> io::Result<tar::Entries<'_, Self>> {
        ar.entries_with_seek()
    }
}

/// The pass over the tar: the signature first, then every entry against the checksum file
/// (its name, type and place; the small files' bytes: manifests, index, bundle manifest), but
/// for the bytes of the large files of a plain bundle, which are left in [`Unhashed`]. A split
/// or gzip bundle is read as one stream and comes back with nothing left to hash. The layout's
/// completeness is checked after it, by [`super::source::check_layout`] (the engine's walk);
/// [`super::source::verify`] does both and the hashing.
pub fn read_entries(
    path: &Path,
    policy: SignaturePolicy<'_>,
    on_bytes: &(dyn Fn(u64) + Sync),
) -> Result<(VerifyReport, Unhashed), VerifyError> {
    let bf = BundleFile::open(path).map_err(|e| parts_err(path, e))?;
    read_entries_of(path, &bf, policy, on_bytes)
}

/// Whether the bundle `bf` (opened from `path`) is gzip-compressed.
pub(crate) fn is_gzip(path: &Path, bf: &BundleFile) -> Result<bool, VerifyError> {
    Ok(bf
        .read_range(0, 2)
        .map_err(|e| parts_err(path, e))?
        .starts_with(&[0x1f, 0x8b]))
}

/// [`read_entries`] of a bundle already opened: its bytes are read through `bf`'s parts.
pub(crate) fn read_entries_of(
    path: &Path,
    bf: &BundleFile,
    policy: SignaturePolicy<'_>,
    on_bytes: &(dyn Fn(u64) + Sync),
) -> Result<(VerifyReport, Unhashed), VerifyError> {
    if let (SignaturePolicy::Require(pk), true) = (&policy, bf.is_split()) {
        // A signed split header is checked before any part is read.
        bf.verify_header(pk).map_err(|e| parts_err(path, e))?;
    }
    let gzip = is_gzip(path, bf)?;
    let io_err = |source| VerifyError::Io {
        path: path.to_path_buf(),
        source,
    };
    if !bf.is_split() && !gzip {
        // A plain file: random access, the large files hashed afterwards on every core.
        let file = crate::bounded::open_input(path).map_err(io_err)?;
        let input = SeekInput(BufReader::with_capacity(
            64 * 1024,
            file.try_clone().map_err(io_err)?,
        ));
        let (mut report, items) = verify_tar(path, input, false, policy, on_bytes)?;
        report.file = Some(bf.clone());
        return Ok((
            report,
            Unhashed {
                path: path.to_path_buf(),
                file: Some(file),
                items,
            },
        ));
    }
    let (input, compressed) = open_file(bf)?;
    let mut report = match verify_tar(path, input, compressed, policy, on_bytes) {
        Ok((r, _)) => r,
        // In a split bundle, name the part that is wrong, not only the file inside it.
        Err(e) if bf.is_split() => {
            return Err(bf
                .check_parts()
                .map_err(|pe| parts_err(path, pe))
                .err()
                .unwrap_or(e))
        }
        Err(e) => return Err(e),
    };
    report.file = Some(bf.clone());
    Ok((
        report,
        Unhashed {
            path: path.to_path_buf(),
            file: None,
            items: vec![],
        },
    ))
}

/// [`read_entries`] over any byte stream (`path` only names it in messages), every byte hashed
/// as it streams by. Blob locations are offsets in that stream.
pub fn read_entries_from(
    path: &Path,
    input: Box<dyn Read>,
    compressed: bool,
    policy: SignaturePolicy<'_>,
    on_bytes: &(dyn Fn(u64) + Sync),
) -> Result<VerifyReport, VerifyError> {
    verify_tar(path, input, compressed, policy, on_bytes).map(|(r, _)| r)
}

/// The one pass over the tar: every entry checked against SHA256SUMS and the rules; with a
/// seekable input, large entries are deferred (returned, unread).
fn verify_tar<R: TarInput>(
    path: &Path,
    input: R,
    compressed: bool,
    policy: SignaturePolicy<'_>,
    on_bytes: &(dyn Fn(u64) + Sync),
) -> Result<(VerifyReport, Vec<Deferred>), VerifyError> {
    let terr = |e: io::Error| tar_err(path, e);
    let mut ar = tar::Archive::new(input);
    let mut pass = {
        let mut entries = R::entries(&mut ar).map_err(terr)?;
        // 1. The checksum file, then the signature, checked before anything else is read.
        let (sums_bytes, signature, pending) = signed_head(path, &mut entries, &policy)?;
        // Parsed only now: a signed checksum file is trusted before its content is
        // interpreted.
        let sums = Checksums::parse(&sums_bytes)?;
        let mut report = VerifyReport {
            bundle: path.to_path_buf(),
            files: 0,
            blobs: 0,
            bytes: 0,
            signature: None,
            signature_verified: false,
            manifests: 0,
            manifest: None,
            blob_locations: BTreeMap::new(),
            tool_locations: BTreeMap::new(),
            small_blobs: BTreeMap::new(),
            compressed,
            file: None,
            roots: Vec::new(),
        };
        if let Some((info, verified)) = signature {
            report.signature = info;
            report.signature_verified = verified;
        }
        // 2. Every other entry, hashed as it streams by.
        let mut pass = Pass {
            path,
            sums,
            report,
            on_bytes,
            seen: BTreeSet::new(),
            small: BTreeMap::new(),
            manifest_bytes: None,
            index_bytes: None,
            deferred: Vec::new(),
            buf: vec![0u8; 1 << 20],
        };
        if let Some(e) = pending {
            pass.entry::<R>(e)?;
        }
        for e in entries {
            pass.entry::<R>(e.map_err(terr)?)?;
        }
        pass
    };
    // After the end-of-archive block only zeros may follow (the second end block and the
    // record padding): an appended archive would otherwise pass unverified, and `tar -i`
    // would extract it.
    only_zeros_after(path, ar.into_inner(), &mut pass.buf)?;
    let missing: Vec<String> = (pass.sums.0.keys())
        .filter(|k| !pass.seen.contains(*k))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Err(VerifyError::Missing {
            path: path.to_path_buf(),
            missing,
        });
    }
    // 3. The layout is complete.
    let Pass {
        mut report,
        sums: pass_sums,
        small,
        manifest_bytes,
        index_bytes,
        deferred,
        ..
    } = pass;
    let content = |reason: String| VerifyError::Content {
        path: path.to_path_buf(),
        reason,
    };
    let manifest: BundleManifest =
        serde_json::from_slice(manifest_bytes.as_deref().unwrap_or_default()).map_err(|e| {
            content(format!(
                "{MANIFEST_FILE} is not a valid bundle manifest: {e}"
            ))
        })?;
    if manifest.format_version != super::FORMAT_VERSION {
        return Err(content(format!(
            "format {:?} is not {} (a newer koord-bundle wrote it?)",
            manifest.format_version,
            super::FORMAT_VERSION
        )));
    }
    check_tools(&manifest, &pass_sums, &report).map_err(content)?;
    let index = Manifest::parse(index_bytes.as_deref().unwrap_or_default(), None)
        .map_err(|e| content(format!("index.json: {e}")))?;
    let Manifest::Index {
        manifests: roots, ..
    } = index
    else {
        return Err(content("index.json is not an image index".into()));
    };
    report.manifest = Some(manifest);
    report.small_blobs = small;
    report.roots = roots;
    Ok((report, deferred))
}

/// Every program the manifest says the bundle carries is the file the checksum file lists
/// under its path, of its size (hashed by then).
fn check_tools(m: &BundleManifest, sums: &Checksums, report: &VerifyReport) -> Result<(), String> {
    for t in &m.tools {
        let said = || crate::text::printable(&t.file);
        if sums.0.get(&t.file) != Some(&t.sha256) {
            return Err(format!(
                "the manifest says {} has sha256 {}, the checksum file does not",
                said(),
                t.sha256
            ));
        }
        if report.tool_locations.get(&t.file).map(|&(_, n)| n) != Some(t.size) {
            return Err(format!(
                "the manifest says {} is {} bytes, the bundle's entry is not",
                said(),
                t.size
            ));
        }
    }
    Ok(())
}

fn tar_err(path: &Path, e: io::Error) -> VerifyError {
    VerifyError::Tar {
        path: path.to_path_buf(),
        reason: crate::text::printable(&e.to_string()),
    }
}

/// A signature's details and whether a key verified it.
type Signed = (Option<SignatureInfo>, bool);

/// What [`signed_head`] read: the checksum file's bytes, the signature, and the entry after
/// the checksum file when it is not a signature.
type SignedHead<'a, R> = (Vec<u8>, Option<Signed>, Option<tar::Entry<'a, R>>);

/// The first entries: the checksum file, then the signature (verified by `policy` before
/// anything else is read). Returns the checksum file's bytes, the signature, and the entry
/// after the checksum file when it is not a signature (an unsigned bundle).
fn signed_head<'a, R: Read>(
    path: &Path,
    entries: &mut tar::Entries<'a, R>,
    policy: &SignaturePolicy<'_>,
) -> Result<SignedHead<'a, R>, VerifyError> {
    let terr = |e: io::Error| tar_err(path, e);
    let first = entries
        .next()
        .ok_or_else(|| VerifyError::NoChecksums(path.to_path_buf()))?
        .map_err(terr)?;
    if first.path().map_err(terr)?.to_string_lossy() != CHECKSUMS_FILE
        || first.header().entry_type() != tar::EntryType::Regular
    {
        return Err(VerifyError::NoChecksums(path.to_path_buf()));
    }
    if let Some(reason) = header_fault(CHECKSUMS_FILE, first.header()) {
        return Err(VerifyError::Entry {
            path: path.to_path_buf(),
            entry: CHECKSUMS_FILE.into(),
            reason,
        });
    }
    let size = first.size();
    let sums_bytes = read_small(path, CHECKSUMS_FILE, first, size)?;
    let Some(e) = entries.next() else {
        return Err(VerifyError::Missing {
            path: path.to_path_buf(),
            missing: Checksums::parse(&sums_bytes)
                .map(|s| s.0.into_keys().collect())
                .unwrap_or_default(),
        });
    };
    let e = e.map_err(terr)?;
    let name = e.path().map_err(terr)?.to_string_lossy().to_string();
    if name != SIGNATURE_FILE {
        if let SignaturePolicy::Require(_) = policy {
            return Err(VerifyError::Unsigned(path.to_path_buf()));
        }
        return Ok((sums_bytes, None, Some(e)));
    }
    if let Some(reason) = header_fault(SIGNATURE_FILE, e.header()) {
        return Err(VerifyError::Entry {
            path: path.to_path_buf(),
            entry: SIGNATURE_FILE.into(),
            reason,
        });
    }
    let size = e.size();
    let sig = read_small(path, SIGNATURE_FILE, e, size)?;
    let signed = match policy {
        SignaturePolicy::Require(pk) => {
            let info =
                sign::verify(pk, &sig, &sums_bytes).map_err(|source| VerifyError::Signature {
                    path: path.to_path_buf(),
                    source,
                })?;
            (Some(info), true)
        }
        SignaturePolicy::Skip => (sign::signature_info(&sig).ok(), false),
    };
    Ok((sums_bytes, Some(signed), None))
}

/// Read what follows the end-of-archive block: only zeros are allowed.
fn only_zeros_after(path: &Path, mut rest: impl Read, buf: &mut [u8]) -> Result<(), VerifyError> {
    let mut at = 0u64;
    loop {
        let n = match rest.read(buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(tar_err(path, e)),
        };
        if let Some(i) = buf[..n].iter().position(|&b| b != 0) {
            return Err(VerifyError::Content {
                path: path.to_path_buf(),
                reason: format!(
                    "data after the end of the tar archive ({} bytes past its end-of-archive block): refusing it (an appended archive is not covered by SHA256SUMS)",
                    at + i as u64
                ),
            });
        }
        at += n as u64;
    }
}

/// The pass over the entries after the signature: what it has seen and kept so far.
struct Pass<'p> {
    path: &'p Path,
    sums: Checksums,
    report: VerifyReport,
    on_bytes: &'p (dyn Fn(u64) + Sync),
    seen: BTreeSet<String>,
    /// Small JSON blobs (manifests, configs), for the layout walk.
    small: BTreeMap<Digest, bytes::Bytes>,
    manifest_bytes: Option<Vec<u8>>,
    index_bytes: Option<Vec<u8>>,
    deferred: Vec<Deferred>,
    buf: Vec<u8>,
}

impl Pass<'_> {
    fn entry_err(&self, entry: &str, reason: &str) -> VerifyError {
        VerifyError::Entry {
            path: self.path.to_path_buf(),
            entry: entry.to_string(),
            reason: reason.to_string(),
        }
    }

    /// One entry: a safe name of an allowed type, listed, once; hashed (or deferred) and
    /// checked against SHA256SUMS; small JSON kept.
    fn entry<R: TarInput>(&mut self, mut e: tar::Entry<'_, R>) -> Result<(), VerifyError> {
        let path = self.path;
        let terr = |e: io::Error| tar_err(path, e);
        let name = e.path().map_err(terr)?.to_string_lossy().to_string();
        let raw_name = String::from_utf8_lossy(&e.path_bytes()).to_string();
        if !safe_path(&raw_name) {
            return Err(
                self.entry_err(&raw_name, "unsafe path (absolute, `..` or empty component)")
            );
        }
        if let Some(fault) = header_fault(&name, e.header()) {
            return Err(self.entry_err(&name, &fault));
        }
        match e.header().entry_type() {
            tar::EntryType::Directory => {
                let prefix = name.trim_end_matches('/').to_string() + "/";
                if !self.sums.0.keys().any(|k| k.starts_with(&prefix)) {
                    return Err(self.entry_err(&name, "directory not holding any listed file"));
                }
                return Ok(());
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {}
            other => {
                return Err(self.entry_err(
                    &name,
                    &format!("entry type {other:?} is not allowed (only files and directories)"),
                ))
            }
        }
        if name == CHECKSUMS_FILE || name == SIGNATURE_FILE || !self.seen.insert(name.clone()) {
            return Err(self.entry_err(&name, "duplicate entry"));
        }
        let Some(expected) = self.sums.0.get(&name).cloned() else {
            return Err(self.entry_err(&name, "not listed in SHA256SUMS"));
        };
        let size = e.size();
        let position = e.raw_file_position();
        let blob = match name.strip_prefix("blobs/sha256/").map(Digest::from_hex) {
            None => None,
            Some(Err(_)) => {
                return Err(self.entry_err(&name, "blob file name is not a sha256 digest"))
            }
            Some(Ok(d)) if d != expected => {
                return Err(self.entry_err(&name, "blob file name is not its digest"))
            }
            Some(Ok(d)) => Some(d),
        };
        // Held in memory: the bundle manifest and index.json (bounded), and blobs up to 4 MiB
        // that may be manifests. Every other file is only hashed.
        let keep = match &blob {
            None => (name == MANIFEST_FILE || name == "index.json") && size <= MAX_SMALL,
            Some(_) => size <= crate::store::registry::MAX_MANIFEST as u64,
        };
        self.report.files += 1;
        // A header's size is the bundle's word, not yet checked: summed without wrapping.
        self.report.bytes = crate::oci::size::checked_add(self.report.bytes, size)
            .ok_or_else(|| self.entry_err(&name, &format!("{size} bytes is too large")))?;
        if let Some(d) = &blob {
            self.report.blobs += 1;
            self.report
                .blob_locations
                .insert(d.clone(), (position, size));
        }
        if name.starts_with(&format!("{}/", super::tools::TOOLS_DIR)) {
            self.report
                .tool_locations
                .insert(name.clone(), (position, size));
        }
        if R::DEFER && !keep && size >= DEFER_OVER {
            // Hashed later, in parallel: its bytes are skipped here.
            self.deferred.push(Deferred {
                name,
                offset: position,
                size,
                expected,
            });
            return Ok(());
        }
        let kept = self.hash(&mut e, &name, size, &expected, keep)?;
        match blob {
            // Small JSON (manifests, configs) is kept for the layout walk; JSON may start
            // with whitespace.
            Some(d) if keep && kept.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') => {
                self.small.insert(d, kept.into());
            }
            Some(_) => {}
            None if name == MANIFEST_FILE => self.manifest_bytes = Some(kept),
            None if name == "index.json" => self.index_bytes = Some(kept),
            None => {}
        }
        Ok(())
    }

    /// Hash an entry's `size` bytes against `expected`; its bytes when `keep`.
    fn hash(
        &mut self,
        e: &mut impl Read,
        name: &str,
        size: u64,
        expected: &Digest,
        keep: bool,
    ) -> Result<Vec<u8>, VerifyError> {
        let mut hasher = sha2::Sha256::new();
        let mut kept = Vec::new();
        let mut n_total = 0u64;
        loop {
            let n = e.read(&mut self.buf).map_err(|e| tar_err(self.path, e))?;
            if n == 0 {
                break;
            }
            hasher.update(&self.buf[..n]);
            if keep {
                kept.extend_from_slice(&self.buf[..n]);
            }
            n_total += n as u64;
            (self.on_bytes)(n as u64);
        }
        if n_total != size {
            return Err(VerifyError::Tar {
                path: self.path.to_path_buf(),
                reason: format!("{name} is truncated ({n_total} of {size} bytes)"),
            });
        }
        let actual = Digest::from_hasher(hasher);
        if &actual != expected {
            return Err(VerifyError::Mismatch {
                path: self.path.to_path_buf(),
                entry: name.to_string(),
                expected: expected.clone(),
                actual,
            });
        }
        Ok(kept)
    }
}
