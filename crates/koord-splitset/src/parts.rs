//! A bundle on disk: one file, or a set of parts (`NAME.part000`, `NAME.part001`, ...) for media
//! with a size limit.
//!
//! Sets are written in format v2 ([`crate::set`]: the header in every part, block digests,
//! parity parts); this module opens both versions and still reads v1 sets, whose first part
//! starts with a small header listing every part with its size and sha256 and the whole
//! bundle's size and sha256, optionally minisign-signed, then the bundle's first bytes; the
//! other parts are plain slices. Readers take the first part directly: a part that is missing,
//! short or altered is named with its expected and actual sha256. [`split`] writes v1 (kept to
//! test that v1 sets are still read).

use crate::atomic::AtomicFile;
use crate::oci::Digest;
use crate::set::{self, Set, SetError, SetReader};
pub use crate::set::{is_plain_file_name, PartInfo};
use crate::sign;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// First line of a first part.
pub const MAGIC: &str = "koord-bundle-split v1";
/// Largest header JSON accepted.
pub const MAX_HEADER: usize = 1024 * 1024;
/// Longest header line read (the magic line and the length lines), its `\n` included.
pub const MAX_LINE: u64 = 64;

/// The header of a split bundle (JSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SplitHeader {
    /// `koord-bundle-split/v1`.
    pub format: String,
    /// The whole bundle.
    pub bundle: PartInfo,
    /// Every part, in order; `size` and `sha256` are of the bundle bytes it carries (for the
    /// first part: after the header).
    pub parts: Vec<PartInfo>,
}

/// Failures of split bundles.
#[derive(Debug, thiserror::Error)]
pub enum PartsError {
    /// I/O on a file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The header of the first part is malformed.
    #[error("{path}: not a valid split header: {reason}")]
    Header {
        /// The first part.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A part is missing.
    #[error(
        "part {file} is missing (expected next to {first}, {size} bytes, {sha256}): copy it again"
    )]
    Missing {
        /// Part file.
        file: PathBuf,
        /// First part.
        first: PathBuf,
        /// Expected size.
        size: u64,
        /// Expected digest.
        sha256: Digest,
    },
    /// A part has the wrong size.
    #[error("part {file} is {actual} bytes, the header says {expected}: copy it again")]
    Size {
        /// Part file.
        file: PathBuf,
        /// Expected.
        expected: u64,
        /// Actual.
        actual: u64,
    },
    /// A part's content does not match.
    #[error("part {file} has digest {actual}, the header says {expected}: copy it again")]
    Digest {
        /// Part file.
        file: PathBuf,
        /// Expected.
        expected: Digest,
        /// Actual.
        actual: Digest,
    },
    /// Bad size argument.
    #[error("invalid size {0:?}: use bytes with K, M, G or T (powers of 1024; KB, MB, GB, TB for powers of 1000), or dvd (4.7 GB), dl-dvd (8.5 GB), bd (25 GB), fat32 (4 GiB - 1)")]
    BadSize(String),
    /// A size below [`MIN_PART_SIZE`].
    #[error("part size {given:?} ({bytes} B) is below the minimum part size of {} KiB ({MIN_PART_SIZE} B): give {}K or more", MIN_PART_SIZE / 1024, MIN_PART_SIZE / 1024)]
    SizeTooSmall {
        /// The size as given.
        given: String,
        /// What it means in bytes.
        bytes: u64,
    },
    /// Parts this small leave no room for the first part's header, which lists every part.
    #[error("parts of {size} bytes are too small for {bundle} ({total} bytes): the first part's header lists every part and needs about {header} bytes of it; give a larger size")]
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
    /// The header signature does not verify.
    #[error("{path}: split header signature: {source}")]
    Signature {
        /// First part.
        path: PathBuf,
        /// Why.
        source: sign::SignError,
    },
    /// A v2 set.
    #[error(transparent)]
    Set(#[from] SetError),
}

impl koord_base::exit::Classify for PartsError {
    fn exit_class(&self) -> Option<koord_base::exit::ExitClass> {
        match self {
            // Reading a part: missing, a directory (the input) or the disk (the machine).
            PartsError::Io { .. } => None,
            PartsError::Set(s) => s.exit_class(),
            // A part missing, short or altered, a bad header, a bad size, a bad signature.
            _ => Some(koord_base::exit::ExitClass::Input),
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> PartsError + '_ {
    move |source| PartsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The smallest part `split` writes (and `build --split` accepts): smaller parts would be mostly
/// header, and no medium is that small.
pub const MIN_PART_SIZE: u64 = 64 * 1024;

/// `4G`, `700M`, `4GB`, `dvd`, `bd`, `fat32`, or plain bytes; at least [`MIN_PART_SIZE`].
pub fn parse_size(s: &str) -> Result<u64, PartsError> {
    let bad = || PartsError::BadSize(s.to_string());
    let t = s.trim().to_ascii_lowercase();
    let named = match t.as_str() {
        "dvd" => Some(4_700_000_000),
        "dl-dvd" | "dvd-dl" => Some(8_500_000_000),
        "bd" | "bluray" | "blu-ray" => Some(25_000_000_000),
        "fat32" => Some(4 * 1024 * 1024 * 1024 - 1),
        _ => None,
    };
    if let Some(n) = named {
        return Ok(n);
    }
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num.parse().map_err(|_| bad())?;
    let mult: f64 = match unit.trim() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(bad()),
    };
    let n = (num * mult) as u64;
    if n < MIN_PART_SIZE {
        return Err(PartsError::SizeTooSmall {
            given: s.to_string(),
            bytes: n,
        });
    }
    Ok(n)
}

/// A contiguous byte range of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// The file.
    pub path: PathBuf,
    /// Offset in the file.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
}

/// A bundle on disk, whole or split.
#[derive(Debug, Clone)]
pub struct BundleFile {
    /// What the user named (the file or the first part).
    pub path: PathBuf,
    /// The split header, if split.
    pub header: Option<SplitHeader>,
    /// The header's raw JSON (what its signature covers).
    pub(crate) header_json: Vec<u8>,
    /// The header's minisign signature, if signed.
    pub(crate) header_signature: Option<Vec<u8>>,
    /// Where the bundle's bytes are: (file, offset of the data in it, data length), in order.
    pub parts: Vec<Segment>,
    /// Total bundle bytes.
    pub size: u64,
    /// A v2 set (header in every part, block digests, parity), read through it: `header` is
    /// then `None` and `parts` lists where the data parts should be.
    pub set: Option<Arc<Set>>,
}

fn read_line_bounded(r: &mut impl BufRead, path: &Path) -> Result<String, PartsError> {
    let mut line = String::new();
    r.by_ref()
        .take(MAX_LINE)
        .read_line(&mut line)
        .map_err(io_err(path))?;
    if !line.ends_with('\n') {
        return Err(PartsError::Header {
            path: path.to_path_buf(),
            reason: "truncated".into(),
        });
    }
    Ok(line.trim_end().to_string())
}

impl BundleFile {
    /// Open a bundle or the first part of a split bundle. Every part must exist with its size;
    /// contents are checked as they are read.
    pub fn open(path: &Path) -> Result<Self, PartsError> {
        let f = crate::bounded::open_input(path).map_err(io_err(path))?;
        let len = f.metadata().map_err(io_err(path))?.len();
        let mut r = BufReader::new(f);
        let head = r.fill_buf().map_err(io_err(path))?;
        let is_split = head.starts_with(MAGIC.as_bytes());
        let v2 = set::header::is_v2(head);
        if v2 || (!is_split && set::looks_like_part(path)) {
            return Self::open_v2(path, v2, len);
        }
        if !is_split {
            return Ok(Self::one_file(path, len));
        }
        let herr = |reason: &str| PartsError::Header {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        };
        read_line_bounded(&mut r, path)?;
        let json_len: usize = read_line_bounded(&mut r, path)?
            .parse()
            .map_err(|_| herr("bad header length"))?;
        if json_len > MAX_HEADER {
            return Err(herr("header too large"));
        }
        let mut json = vec![0u8; json_len];
        r.read_exact(&mut json).map_err(io_err(path))?;
        let mut nl = [0u8; 1];
        r.read_exact(&mut nl).map_err(io_err(path))?;
        let sig_len: usize = read_line_bounded(&mut r, path)?
            .parse()
            .map_err(|_| herr("bad signature length"))?;
        if sig_len > set::MAX_SIG {
            return Err(herr("signature too large"));
        }
        let mut sig = vec![0u8; sig_len];
        r.read_exact(&mut sig).map_err(io_err(path))?;
        let data_start = r.stream_position().map_err(io_err(path))?;
        let header: SplitHeader =
            serde_json::from_slice(&json).map_err(|e| herr(&e.to_string()))?;
        if header.format != "koord-bundle-split/v1" || header.parts.is_empty() {
            return Err(herr("unknown format or no parts"));
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut parts = Vec::new();
        for (i, p) in header.parts.iter().enumerate() {
            if !is_plain_file_name(&p.file) {
                return Err(herr(&format!(
                    "part name \"{}\" is not a plain file name",
                    crate::text::printable(&p.file)
                )));
            }
            let file = if i == 0 {
                path.to_path_buf()
            } else {
                dir.join(&p.file)
            };
            let (offset, actual) = if i == 0 {
                (data_start, len.saturating_sub(data_start))
            } else {
                match std::fs::metadata(&file) {
                    Ok(m) => (0, m.len()),
                    Err(_) => {
                        return Err(PartsError::Missing {
                            file,
                            first: path.to_path_buf(),
                            size: p.size,
                            sha256: p.sha256.clone(),
                        })
                    }
                }
            };
            if actual != p.size {
                return Err(PartsError::Size {
                    file,
                    expected: p.size,
                    actual,
                });
            }
            parts.push(Segment {
                path: file,
                offset,
                len: p.size,
            });
        }
        // Checked: sizes in a header add up, they never wrap to the bundle's.
        let size = crate::oci::size::checked_sum(parts.iter().map(|s| s.len))
            .ok_or_else(|| herr("the parts add up to more than a file can hold"))?;
        if size != header.bundle.size {
            return Err(herr("parts do not add up to the bundle size"));
        }
        Ok(BundleFile {
            path: path.to_path_buf(),
            header: Some(header),
            header_json: json,
            header_signature: (sig_len > 0).then_some(sig),
            parts,
            size,
            set: None,
        })
    }

    /// A plain bundle: one file, read whole.
    fn one_file(path: &Path, len: u64) -> Self {
        BundleFile {
            path: path.to_path_buf(),
            header: None,
            header_json: vec![],
            header_signature: None,
            parts: vec![Segment {
                path: path.to_path_buf(),
                offset: 0,
                len,
            }],
            size: len,
            set: None,
        }
    }

    /// A v2 set, from any of its parts (`is_v2`: the part named starts with the v2 magic line;
    /// else it is named like a part and may have lost its header: the set is opened from the
    /// parts next to it when there are any, and the file read as a whole bundle when not).
    fn open_v2(path: &Path, is_v2: bool, len: u64) -> Result<Self, PartsError> {
        if !is_v2 && !set::has_v2_siblings(path) {
            return Ok(Self::one_file(path, len));
        }
        let s = set::open(path)?;
        let g = &s.geometry;
        let parts = (0..g.k)
            .map(|p| Segment {
                path: s.part_path(p).to_path_buf(),
                offset: g.data_offset,
                len: g.sizes[p],
            })
            .collect();
        Ok(BundleFile {
            path: path.to_path_buf(),
            header: None,
            header_json: s.json.clone(),
            header_signature: s.signature.clone(),
            parts,
            size: s.header.bundle.size,
            set: Some(Arc::new(s)),
        })
    }

    /// The whole bundle's name, size and sha256, as the split header gives them.
    pub fn whole(&self) -> Option<&PartInfo> {
        match (&self.header, &self.set) {
            (Some(h), _) => Some(&h.bundle),
            (None, Some(s)) => Some(&s.header.bundle),
            (None, None) => None,
        }
    }

    /// Is this a split bundle?
    pub fn is_split(&self) -> bool {
        self.header.is_some() || self.set.is_some()
    }

    /// Check the header signature with `pk` (when the header is signed). Returns whether it was
    /// signed.
    pub fn verify_header(&self, pk: &minisign::PublicKey) -> Result<bool, PartsError> {
        if let Some(s) = &self.set {
            return Ok(s.verify_header(pk)?);
        }
        match &self.header_signature {
            Some(sig) => {
                sign::verify(pk, sig, &self.header_json).map_err(|source| {
                    PartsError::Signature {
                        path: self.path.clone(),
                        source,
                    }
                })?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// All the bundle's bytes in order; with parts, each part's sha256 is checked when its end
    /// is reached (a mismatch is an `InvalidData` error naming the part).
    pub fn reader(&self) -> Result<PartsReader, PartsError> {
        Ok(PartsReader {
            set: self.set.as_ref().map(|s| s.reader()),
            file: self.clone(),
            index: 0,
            current: None,
            left: 0,
            hasher: sha2::Sha256::new(),
            position: 0,
        })
    }

    /// Read every part and check it against the header (to name the part that is wrong once
    /// something inside the bundle failed to verify). A whole bundle always passes.
    pub fn check_parts(&self) -> Result<(), PartsError> {
        if let Some(s) = &self.set {
            let report = set::check(s, &|_| {})?;
            if !report.repairable() {
                return Err(SetError::Beyond(Box::new(report)).into());
            }
            return Ok(());
        }
        let Some(h) = &self.header else { return Ok(()) };
        for (seg, info) in self.parts.iter().zip(&h.parts) {
            let mut f = crate::bounded::open_input(&seg.path).map_err(io_err(&seg.path))?;
            f.seek(SeekFrom::Start(seg.offset))
                .map_err(io_err(&seg.path))?;
            let mut w = crate::oci::Sha256Writer::new(io::sink());
            io::copy(&mut f.take(seg.len), &mut w).map_err(io_err(&seg.path))?;
            let (actual, _, _) = w.finish();
            if actual != info.sha256 {
                return Err(PartsError::Digest {
                    file: seg.path.clone(),
                    expected: info.sha256.clone(),
                    actual,
                });
            }
        }
        Ok(())
    }

    /// Where bytes `offset..offset+len` of the bundle are.
    pub(crate) fn segments(&self, mut offset: u64, mut len: u64) -> Vec<Segment> {
        let mut out = Vec::new();
        for p in &self.parts {
            if len == 0 {
                break;
            }
            if offset >= p.len {
                offset -= p.len;
                continue;
            }
            let take = (p.len - offset).min(len);
            out.push(Segment {
                path: p.path.clone(),
                offset: p.offset.saturating_add(offset),
                len: take,
            });
            len -= take;
            offset = 0;
        }
        out
    }

    /// Read a byte range (small: manifests).
    pub fn read_range(&self, offset: u64, len: u64) -> Result<Vec<u8>, PartsError> {
        if let Some(s) = &self.set {
            return s.read_range(offset, len).map_err(|e| match e {
                // Beyond repair: the whole picture (every damaged part and block) instead.
                SetError::Stripe { .. } => self.check_parts().err().unwrap_or(e.into()),
                other => other.into(),
            });
        }
        let mut out = Vec::with_capacity(len as usize);
        for s in self.segments(offset, len) {
            let mut f = crate::bounded::open_input(&s.path).map_err(io_err(&s.path))?;
            f.seek(SeekFrom::Start(s.offset)).map_err(io_err(&s.path))?;
            f.take(s.len)
                .read_to_end(&mut out)
                .map_err(io_err(&s.path))?;
        }
        Ok(out)
    }
}

/// Sequential reader over the parts, checking each part's digest (v1), or each block's,
/// repairing what it can (v2).
pub struct PartsReader {
    set: Option<SetReader>,
    file: BundleFile,
    index: usize,
    current: Option<BufReader<File>>,
    left: u64,
    hasher: sha2::Sha256,
    position: u64,
}

impl Read for PartsReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(s) = &mut self.set {
            return s.read(buf);
        }
        loop {
            if self.current.is_none() {
                let Some(seg) = self.file.parts.get(self.index) else {
                    return Ok(0);
                };
                let mut f = crate::bounded::open_input(&seg.path)?;
                f.seek(SeekFrom::Start(seg.offset))?;
                self.current = Some(BufReader::with_capacity(1 << 20, f));
                self.left = seg.len;
                self.hasher = sha2::Sha256::new();
            }
            if self.left == 0 {
                if let Some(h) = &self.file.header {
                    let info = &h.parts[self.index];
                    let actual = Digest::from_hasher(std::mem::take(&mut self.hasher));
                    if actual != info.sha256 {
                        let e = PartsError::Digest {
                            file: self.file.parts[self.index].path.clone(),
                            expected: info.sha256.clone(),
                            actual,
                        };
                        return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string()));
                    }
                }
                self.current = None;
                self.index += 1;
                continue;
            }
            let want = (buf.len() as u64).min(self.left) as usize;
            let n = self
                .current
                .as_mut()
                .map(|r| r.read(&mut buf[..want]))
                .unwrap_or(Ok(0))?;
            if n == 0 {
                let path = self.file.parts[self.index].path.display().to_string();
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("part {path} ended early"),
                ));
            }
            if self.file.header.is_some() {
                self.hasher.update(&buf[..n]);
            }
            self.left -= n as u64;
            self.position += n as u64;
            return Ok(n);
        }
    }
}

/// Stale parts of an earlier split of `name` in `dir` beyond `keep` parts.
#[cfg(test)]
fn remove_stale(dir: &Path, name: &str, keep: usize) -> Result<(), PartsError> {
    let prefix = format!("{name}.part");
    for e in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let e = e.map_err(io_err(dir))?;
        let n = e.file_name().to_string_lossy().to_string();
        if let Some(idx) = n
            .strip_prefix(&prefix)
            .and_then(|s| s.parse::<usize>().ok())
        {
            if idx >= keep {
                std::fs::remove_file(e.path()).map_err(io_err(&e.path()))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
fn part_name(name: &str, i: usize) -> String {
    format!("{name}.part{i:03}")
}

/// Split `bundle` into parts of at most `size` bytes each (the first part's header included)
/// in `out_dir`; stale parts of an earlier split of the same name there are removed. The header
/// is signed when a key is given. Format v1, which `split` no longer writes (set::write does,
/// v2): kept for the tests that check v1 sets are still read.
#[cfg(test)]
fn split(
    bundle: &Path,
    size: u64,
    out_dir: &Path,
    name: &str,
    signer: Option<&minisign::SecretKey>,
) -> Result<Vec<PathBuf>, PartsError> {
    let total = std::fs::metadata(bundle).map_err(io_err(bundle))?.len();
    // Reserve room for the header in the first part (it grows with the part count).
    let estimate_parts = total / size.max(1) + 2;
    let reserve = 512 + estimate_parts * 160 + if signer.is_some() { 400 } else { 0 };
    let too_small = |header: u64| PartsError::HeaderTooLarge {
        bundle: bundle.to_path_buf(),
        size,
        total,
        header,
    };
    if size <= reserve * 2 {
        return Err(too_small(reserve));
    }
    let first_data = (size - reserve).min(total);
    let mut sizes = vec![first_data];
    let mut rest = total - first_data;
    while rest > 0 {
        let s = rest.min(size);
        sizes.push(s);
        rest -= s;
    }
    // Pass 1: digests of every part's data and of the whole.
    let mut f = BufReader::with_capacity(
        1 << 20,
        crate::bounded::open_input(bundle).map_err(io_err(bundle))?,
    );
    let mut whole = sha2::Sha256::new();
    let mut infos = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    for (i, &s) in sizes.iter().enumerate() {
        let mut h = sha2::Sha256::new();
        let mut left = s;
        while left > 0 {
            let want = left.min(buf.len() as u64) as usize;
            let n = f.read(&mut buf[..want]).map_err(io_err(bundle))?;
            if n == 0 {
                return Err(PartsError::Io {
                    path: bundle.to_path_buf(),
                    source: io::ErrorKind::UnexpectedEof.into(),
                });
            }
            h.update(&buf[..n]);
            whole.update(&buf[..n]);
            left -= n as u64;
        }
        infos.push(PartInfo {
            file: part_name(name, i),
            size: s,
            sha256: Digest::from_hasher(h),
        });
    }
    let header = SplitHeader {
        format: "koord-bundle-split/v1".into(),
        bundle: PartInfo {
            file: name.to_string(),
            size: total,
            sha256: Digest::from_hasher(whole),
        },
        parts: infos,
    };
    let json = serde_json::to_vec(&header).map_err(|e| PartsError::Header {
        path: bundle.to_path_buf(),
        reason: e.to_string(),
    })?;
    let sig = match signer {
        Some(sk) => sign::sign(sk, &json, &format!("koord-bundle split header of {name}"))
            .map_err(|source| PartsError::Signature {
                path: bundle.to_path_buf(),
                source,
            })?
            .into_bytes(),
        None => vec![],
    };
    let mut head = format!("{MAGIC}\n{}\n", json.len()).into_bytes();
    head.extend_from_slice(&json);
    head.extend_from_slice(format!("\n{}\n", sig.len()).as_bytes());
    head.extend_from_slice(&sig);
    if head.len() as u64 + first_data > size {
        return Err(too_small(head.len() as u64));
    }
    // Pass 2: write the parts (each to a temporary file, then renamed).
    std::fs::create_dir_all(out_dir).map_err(io_err(out_dir))?;
    let mut src = BufReader::with_capacity(
        1 << 20,
        crate::bounded::open_input(bundle).map_err(io_err(bundle))?,
    );
    let mut written = Vec::new();
    for (i, info) in header.parts.iter().enumerate() {
        let path = out_dir.join(&info.file);
        let tmp = AtomicFile::create(&path).map_err(io_err(&path))?;
        {
            let mut w = io::BufWriter::with_capacity(1 << 20, tmp.file());
            if i == 0 {
                w.write_all(&head).map_err(io_err(&path))?;
            }
            io::copy(&mut (&mut src).take(info.size), &mut w).map_err(io_err(&path))?;
            w.flush().map_err(io_err(&path))?;
        }
        tmp.commit().map_err(io_err(&path))?;
        written.push(path);
    }
    remove_stale(out_dir, name, header.parts.len())?;
    Ok(written)
}

/// Join a split bundle into `out` (checked part by part, or block by block and repaired, and
/// as a whole), atomically: a failure leaves nothing at `out`.
pub fn join(bf: &BundleFile, out: &Path) -> Result<u64, PartsError> {
    let first = &bf.path;
    let Some(whole) = bf.whole() else {
        return Err(PartsError::Header {
            path: first.to_path_buf(),
            reason: "not a part of a split bundle".into(),
        });
    };
    let tmp = AtomicFile::create(out).map_err(io_err(out))?;
    let mut reader = bf.reader()?;
    let mut w = crate::oci::Sha256Writer::new(io::BufWriter::with_capacity(1 << 20, tmp.file()));
    // Not io::copy: a failed read names the part (and, with parity, every damaged block), a
    // failed write (a full disk) names the output.
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let got = match reader.read(&mut chunk) {
            Ok(0) => break,
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                bf.check_parts()?;
                return Err(PartsError::Io {
                    path: first.to_path_buf(),
                    source: e,
                });
            }
        };
        w.write_all(&chunk[..got]).map_err(io_err(out))?;
    }
    let (digest, n, mut buf) = w.finish();
    buf.flush().map_err(io_err(out))?;
    drop(buf);
    if digest != whole.sha256 || n != whole.size {
        return Err(PartsError::Digest {
            file: out.to_path_buf(),
            expected: whole.sha256.clone(),
            actual: digest,
        });
    }
    tmp.commit().map_err(io_err(out))?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("700M").unwrap(), 700 << 20);
        assert_eq!(parse_size("4G").unwrap(), 4 << 30);
        assert_eq!(parse_size("4GB").unwrap(), 4_000_000_000);
        assert_eq!(parse_size("dvd").unwrap(), 4_700_000_000);
        assert_eq!(parse_size("fat32").unwrap(), (4u64 << 30) - 1);
        assert!(matches!(
            parse_size("1K"),
            Err(PartsError::SizeTooSmall { bytes: 1024, .. })
        ));
        assert_eq!(parse_size("64K").unwrap(), MIN_PART_SIZE);
        assert!(parse_size("12").is_err());
        assert!(parse_size("4Q").is_err());
    }

    #[test]
    fn split_read_join_and_detect() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let b = dir.path().join("b.tar");
        std::fs::write(&b, &data).unwrap();
        let out = dir.path().join("parts");
        std::fs::create_dir(&out).unwrap();
        std::fs::write(out.join("b.tar.part009"), b"stale").unwrap();
        let parts = split(&b, 300_000, &out, "b.tar", None).unwrap();
        assert_eq!(parts.len(), 4);
        assert!(!out.join("b.tar.part009").exists(), "stale part removed");
        for p in &parts {
            assert!(std::fs::metadata(p).unwrap().len() <= 300_000);
        }
        let bf = BundleFile::open(&parts[0]).unwrap();
        let mut all = Vec::new();
        bf.reader().unwrap().read_to_end(&mut all).unwrap();
        assert_eq!(all, data);
        assert_eq!(
            bf.read_range(299_000, 5_000).unwrap(),
            data[299_000..304_000]
        );
        let joined = dir.path().join("j.tar");
        join(&BundleFile::open(&parts[0]).unwrap(), &joined).unwrap();
        assert_eq!(std::fs::read(&joined).unwrap(), data);
        // An altered part is named.
        let mut p2 = std::fs::read(&parts[2]).unwrap();
        p2[10] ^= 1;
        std::fs::write(&parts[2], &p2).unwrap();
        let e = bf
            .reader()
            .unwrap()
            .read_to_end(&mut Vec::new())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("b.tar.part002") && e.contains("the header says"),
            "{e}"
        );
        // A missing part is named.
        std::fs::remove_file(&parts[3]).unwrap();
        let e = BundleFile::open(&parts[0]).unwrap_err().to_string();
        assert!(e.contains("b.tar.part003") && e.contains("missing"), "{e}");
    }
}
