//! A verified bundle read in place, as a [`Source`]: `load` copies from it into a registry,
//! `serve` answers from it. Nothing is extracted. Manifests (and every small JSON blob) are the
//! copies held in memory since verification, so they cannot change afterwards; layers are read
//! from the bundle file(s), whose size, modification time and identity (device, inode) must stay
//! those seen before verification began: a changed file is refused before any of it is read.
//! (A change that puts size and time back is not seen by this check; `serve` hashes what it
//! sends on top.) A split set of format v2 is read through the set instead: every block is
//! checked against the signed header as it is read, and rebuilt from parity when damaged.

use super::reader::{self, SignaturePolicy, Unhashed, VerifyError, VerifyReport};
use super::BundleManifest;
use super::OpenedBundle;
use crate::oci::{Descriptor, Digest, Manifest};
use crate::store::file::{self, Region};
use crate::store::{BlobStream, Catalog, RawManifest, Reference, Source, Store, StoreError};
use futures_util::StreamExt;
use koord_splitset::Set;
use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

/// Why a bundle cannot be read in place.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// It did not verify.
    #[error(transparent)]
    Verify(#[from] VerifyError),
    /// Its files changed while (or after) they were verified.
    #[error("bundle file {path} changed since it was verified ({what}): verify it again")]
    Changed {
        /// The file.
        path: PathBuf,
        /// What changed.
        what: String,
    },
    /// It cannot be read in place.
    #[error("bundle {path}: {reason}")]
    Content {
        /// The bundle.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A file cannot be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

impl crate::exit::Classify for SourceError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        match self {
            SourceError::Verify(v) => crate::exit::Classify::exit_class(v),
            // Reading the bundle: the kind of I/O error decides.
            SourceError::Io { .. } => None,
            // A bundle changed after it was verified, or holding what it should not.
            SourceError::Changed { .. } | SourceError::Content { .. } => {
                Some(crate::exit::ExitClass::Input)
            }
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SourceError + '_ {
    move |source| SourceError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What identifies a file's content cheaply: size, modification time and identity.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    id: (u64, u64),
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt as _;
        Stamp {
            len: m.len(),
            modified: m.modified().ok(),
            id: (m.dev(), m.ino()),
        }
    }
    /// What differs from `then`, if anything.
    fn differs(&self, then: &Stamp, identity: bool) -> Option<String> {
        if self.len != then.len {
            return Some(format!("{} bytes, was {}", self.len, then.len));
        }
        if self.modified != then.modified {
            return Some("modified".into());
        }
        if identity && self.id != then.id {
            return Some("replaced by another file".into());
        }
        None
    }
}

/// One file of the bundle, opened once.
#[derive(Debug)]
struct Part {
    path: PathBuf,
    file: Arc<File>,
    /// Where this part's bundle bytes start in the bundle stream.
    start: u64,
    /// Bundle bytes in this part.
    len: u64,
    /// Where they start in the file.
    file_offset: u64,
    stamp: Stamp,
}

/// A verified bundle, read in place.
#[derive(Debug)]
pub struct BundleSource {
    path: PathBuf,
    report: VerifyReport,
    manifest: BundleManifest,
    parts: Vec<Part>,
    /// A v2 split set, read block by block (then `parts` is empty).
    set: Option<Arc<Set>>,
    /// Repository → tag → top manifest (digest, media type), from the bundle manifest.
    tags: BTreeMap<String, BTreeMap<String, (Digest, String)>>,
    /// Media type of every manifest, as the descriptor that reaches it says.
    types: BTreeMap<Digest, String>,
}

/// Verify the bundle at `path` completely: the pass over the tar ([`reader::read_entries`]),
/// the layout's completeness ([`check_layout`]), then the bytes of its large files on every
/// core. What `verify` runs. The passes block this task's thread (`block_in_place`): call it on
/// tokio's multi-threaded runtime.
pub async fn verify(
    path: &Path,
    policy: SignaturePolicy<'_>,
    on_bytes: &(dyn Fn(u64) + Sync),
) -> Result<VerifyReport, VerifyError> {
    let (report, unhashed) =
        tokio::task::block_in_place(|| reader::read_entries(path, policy, on_bytes))?;
    let report = checked_in_memory(path, report).await?;
    tokio::task::block_in_place(|| unhashed.hash(on_bytes))?;
    Ok(report)
}

/// [`verify`] of a bundle opened already, with the key it was given
/// ([`OpenedBundle::set_trust`]).
pub async fn verify_opened(
    b: &OpenedBundle,
    on_bytes: &(dyn Fn(u64) + Sync),
) -> Result<VerifyReport, VerifyError> {
    let (report, unhashed) = tokio::task::block_in_place(|| {
        reader::read_entries_of(b.path(), b.file(), b.policy(), on_bytes)
    })?;
    let report = checked_in_memory(b.path(), report).await?;
    tokio::task::block_in_place(|| unhashed.hash(on_bytes))?;
    Ok(report)
}

/// [`verify`] over any byte stream (`path` only names it in messages), every byte hashed as it
/// streams by. Blob locations are offsets in that stream.
pub async fn verify_from(
    path: &Path,
    input: Box<dyn io::Read>,
    compressed: bool,
    policy: SignaturePolicy<'_>,
    on_bytes: &(dyn Fn(u64) + Sync),
) -> Result<VerifyReport, VerifyError> {
    let report = tokio::task::block_in_place(|| {
        reader::read_entries_from(path, input, compressed, policy, on_bytes)
    })?;
    checked_in_memory(path, report).await
}

/// The layout of a report checked through an in-memory source (manifests and small blobs
/// only), the report given back with the manifests walked.
async fn checked_in_memory(path: &Path, report: VerifyReport) -> Result<VerifyReport, VerifyError> {
    let src = BundleSource::in_memory(path, report).map_err(|e| match e {
        SourceError::Verify(v) => v,
        other => VerifyError::Content {
            path: path.to_path_buf(),
            reason: other.to_string(),
        },
    })?;
    let manifests = check_layout(&src).await?;
    let mut report = src.into_report();
    report.manifests = manifests;
    Ok(report)
}

/// The layout is complete: every graph `index.json` roots, walked by the one walk of the copy
/// engine over the verified manifests, finds each manifest and blob it references in the
/// bundle with its descriptor's size (or, in an incremental bundle, left out with that size).
/// Gives the number of manifests walked.
pub async fn check_layout(src: &BundleSource) -> Result<usize, VerifyError> {
    use crate::copy;
    use std::collections::BTreeSet;
    let path = src.path();
    let content = |reason: String| VerifyError::Content {
        path: path.to_path_buf(),
        reason,
    };
    let report = src.report();
    let manifest = src.manifest();
    let omitted: BTreeMap<&Digest, u64> = manifest
        .omitted_blobs
        .iter()
        .map(|o| (&o.digest, o.size))
        .collect();
    let present = |d: &Descriptor| -> Result<(), VerifyError> {
        match src.blob_size(&d.digest) {
            Some(s) if s == d.size => Ok(()),
            Some(s) => Err(content(format!(
                "{} is {s} bytes, its descriptor says {}",
                d.digest, d.size
            ))),
            // An incremental bundle leaves out what the site already holds.
            None if omitted.get(&d.digest) == Some(&d.size) => Ok(()),
            None => Err(content(format!(
                "{} ({}) is referenced but not in the bundle",
                d.digest, d.media_type
            ))),
        }
    };
    let mut walked = BTreeSet::new();
    // One bundle: the walk's bundle-wide bounds hold across its roots.
    let budget = copy::Budget::default();
    for root in &report.roots {
        present(root)?;
        let reference = Reference::Digest(root.digest.clone());
        let graph = copy::resolve(src, "", &reference, None, &budget)
            .await
            .map_err(|e| match e {
                copy::WalkError::NotFound(s) | copy::WalkError::Store(s) if s.is_not_found() => {
                    content(format!(
                        "{s}: a manifest {} references is not in the bundle",
                        root.digest
                    ))
                }
                other => content(other.to_string()),
            })?;
        for m in graph.manifests() {
            present(&m.descriptor())?;
            walked.insert(m.digest.clone());
        }
        for b in &graph.blobs {
            present(b)?;
        }
    }
    for img in &manifest.images {
        if !walked.contains(&img.digest) {
            return Err(content(format!(
                "image {} ({}) is not in index.json",
                img.ref_name, img.digest
            )));
        }
    }
    Ok(walked.len())
}

/// `REPOSITORY:TAG` of a ref name.
pub fn split_ref(r: &str) -> Option<(&str, &str)> {
    match r.rsplit_once(':') {
        Some((repo, tag)) if !repo.is_empty() && !tag.is_empty() && !tag.contains('/') => {
            Some((repo, tag))
        }
        _ => None,
    }
}

impl BundleSource {
    /// Verify the bundle `b` (a file or a split set, opened) completely, with the key it was
    /// given, then open it for reading in place. A gzip bundle is refused before verification (it cannot be
    /// read in place).
    ///
    /// The passes over the file block this task's thread (`block_in_place`): call it on tokio's
    /// multi-threaded runtime.
    pub async fn open(
        b: &OpenedBundle,
        on_bytes: &(dyn Fn(u64) + Sync),
    ) -> Result<BundleSource, SourceError> {
        let (src, unhashed) = Self::open_unhashed(b, on_bytes).await?;
        tokio::task::block_in_place(|| unhashed.hash(on_bytes))?;
        Ok(src)
    }

    /// [`BundleSource::open`] with everything verified but the bytes of the large files of a
    /// plain bundle (see [`reader::read_entries`]): the caller hashes them with
    /// [`Unhashed::hash`] before it reads them, or knows it will not read them (a re-load that
    /// finds every tag in place pushes nothing).
    pub async fn open_unhashed(
        b: &OpenedBundle,
        on_bytes: &(dyn Fn(u64) + Sync),
    ) -> Result<(BundleSource, Unhashed), SourceError> {
        let (mut src, unhashed) = tokio::task::block_in_place(|| Self::read_unhashed(b, on_bytes))?;
        src.report.manifests = check_layout(&src).await?;
        Ok((src, unhashed))
    }

    /// The pass over the file of [`BundleSource::open_unhashed`], before the layout walk.
    fn read_unhashed(
        b: &OpenedBundle,
        on_bytes: &(dyn Fn(u64) + Sync),
    ) -> Result<(BundleSource, Unhashed), SourceError> {
        let (path, bf) = (b.path(), b.file());
        if b.is_gzip()? {
            return Err(compressed(path));
        }
        // A v2 set checks every block it reads: no stamps (its parts may even be missing).
        let stamped = if bf.set.is_some() {
            &[][..]
        } else {
            &bf.parts[..]
        };
        let before = stamped
            .iter()
            .map(|s| {
                std::fs::metadata(&s.path)
                    .map(|m| Stamp::of(&m))
                    .map_err(io_err(&s.path))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Verified through the same parts that are read afterwards.
        let (report, unhashed) = reader::read_entries_of(path, bf, b.policy(), on_bytes)?;
        if report.compressed {
            return Err(compressed(path));
        }
        let mut parts = Vec::new();
        let mut start = 0;
        for (seg, then) in stamped.iter().zip(&before) {
            let file = crate::bounded::open_input(&seg.path).map_err(io_err(&seg.path))?;
            let stamp = Stamp::of(&file.metadata().map_err(io_err(&seg.path))?);
            if let Some(what) = stamp.differs(then, true) {
                return Err(SourceError::Changed {
                    path: seg.path.clone(),
                    what,
                });
            }
            parts.push(Part {
                path: seg.path.clone(),
                file: Arc::new(file),
                start,
                len: seg.len,
                file_offset: seg.offset,
                stamp,
            });
            start += seg.len;
        }
        let mut src = Self::from_report(path, report, parts)?;
        src.set = bf.set.clone();
        Ok((src, unhashed))
    }

    /// A source over a verified report alone: manifests and small blobs from memory, no layer
    /// can be read (what `verify` walks the layout graph with).
    pub fn in_memory(path: &Path, report: VerifyReport) -> Result<BundleSource, SourceError> {
        Self::from_report(path, report, vec![])
    }

    fn from_report(
        path: &Path,
        report: VerifyReport,
        parts: Vec<Part>,
    ) -> Result<BundleSource, SourceError> {
        let content = |reason: String| SourceError::Content {
            path: path.to_path_buf(),
            reason,
        };
        let manifest = report
            .manifest
            .clone()
            .ok_or_else(|| content("no bundle manifest".into()))?;
        let mut tags: BTreeMap<String, BTreeMap<String, (Digest, String)>> = BTreeMap::new();
        let mut tops = Vec::new();
        let mut referrers = Vec::new();
        for img in &manifest.images {
            tops.push((&img.ref_name, &img.digest, &img.media_type));
            // Its carried cosign signatures, under their own tags; a carried referrer has no
            // tag (its ref is `<repository>@<digest>`): read by its digest.
            for s in &img.signatures {
                if s.is_referrer() {
                    referrers.push((&s.digest, &s.media_type));
                } else {
                    tops.push((&s.ref_name, &s.digest, &s.media_type));
                }
            }
        }
        let oci = &manifest.chart.oci;
        tops.push((&oci.ref_name, &oci.digest, &oci.media_type));
        let mut types = BTreeMap::new();
        for (r, d, mt) in tops {
            let (repo, tag) = split_ref(r)
                .ok_or_else(|| content(format!("ref name {r:?} is not REPOSITORY:TAG")))?;
            tags.entry(repo.to_string())
                .or_default()
                .insert(tag.to_string(), (d.clone(), mt.clone()));
            types.insert(d.clone(), mt.clone());
        }
        for (d, mt) in referrers {
            types.insert(d.clone(), mt.clone());
        }
        // Child manifests: the media type their parent's descriptor gives.
        for bytes in report.small_blobs.values() {
            if let Ok(Manifest::Index { manifests, .. }) = Manifest::parse(bytes, None) {
                for c in manifests {
                    types.entry(c.digest).or_insert(c.media_type);
                }
            }
        }
        let total = parts.iter().fold(0u64, |a, p| a.saturating_add(p.len));
        if !parts.is_empty() {
            for (d, &(offset, size)) in &report.blob_locations {
                if offset.checked_add(size).is_none_or(|end| end > total) {
                    return Err(content(format!("{d} lies beyond the end of the bundle")));
                }
            }
        }
        Ok(BundleSource {
            path: path.to_path_buf(),
            report,
            manifest,
            parts,
            set: None,
            tags,
            types,
        })
    }

    /// The verification report.
    pub fn report(&self) -> &VerifyReport {
        &self.report
    }

    /// The verification report, given back.
    pub fn into_report(self) -> VerifyReport {
        self.report
    }

    /// The bundle manifest.
    pub fn manifest(&self) -> &BundleManifest {
        &self.manifest
    }

    /// The size of a blob the bundle holds.
    pub fn blob_size(&self, d: &Digest) -> Option<u64> {
        self.report
            .blob_locations
            .get(d)
            .map(|&(_, size)| size)
            .or_else(|| self.report.small_blobs.get(d).map(|b| b.len() as u64))
    }

    /// The bundle (as the user named it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The v2 split set it is read from, if it is one (what was rebuilt: [`Set::repairs`]).
    pub fn split_set(&self) -> Option<&Arc<Set>> {
        self.set.as_ref()
    }

    /// Where bundle bytes `offset..offset+len` are, after checking their files did not change.
    fn regions(&self, offset: u64, len: u64) -> Result<Vec<Region>, SourceError> {
        let mut out = Vec::new();
        let (mut offset, mut len) = (offset, len);
        for p in &self.parts {
            if len == 0 {
                break;
            }
            if offset >= p.start + p.len {
                continue;
            }
            let now = Stamp::of(&p.file.metadata().map_err(io_err(&p.path))?);
            if let Some(what) = now.differs(&p.stamp, false) {
                return Err(SourceError::Changed {
                    path: p.path.clone(),
                    what,
                });
            }
            let within = offset - p.start;
            let take = (p.len - within).min(len);
            out.push(Region {
                file: p.file.clone(),
                path: p.path.clone(),
                offset: p.file_offset + within,
                len: take,
            });
            offset += take;
            len -= take;
        }
        if len > 0 {
            return Err(SourceError::Content {
                path: self.path.clone(),
                reason: "a blob lies beyond the end of the bundle".into(),
            });
        }
        Ok(out)
    }

    fn err(&self, e: SourceError) -> StoreError {
        StoreError::other(self.describe(), e)
    }
}

/// Bundle bytes `offset..offset+len` of a v2 set, a piece at a time on the blocking pool, each
/// block checked and, when damaged, rebuilt.
fn set_stream(store: String, set: Arc<Set>, offset: u64, len: u64) -> BlobStream {
    let pieces = (0..len.div_ceil(file::PIECE)).map(move |i| {
        let at = i * file::PIECE;
        (offset + at, (len - at).min(file::PIECE))
    });
    futures_util::stream::iter(pieces)
        .then(move |(at, n)| {
            let (store, set) = (store.clone(), set.clone());
            async move {
                match tokio::task::spawn_blocking(move || set.read_range(at, n)).await {
                    Ok(Ok(b)) => Ok(bytes::Bytes::from(b)),
                    Ok(Err(e)) => Err(StoreError::other(store, e)),
                    Err(e) => Err(StoreError::other(store, e.to_string())),
                }
            }
        })
        .boxed()
}

fn compressed(path: &Path) -> SourceError {
    SourceError::Content {
        path: path.to_path_buf(),
        reason: format!(
            "it is gzip-compressed, and can only be read in place uncompressed: gunzip -k {}",
            path.display()
        ),
    }
}

impl Store for BundleSource {
    fn describe(&self) -> String {
        format!("bundle {}", self.path.display())
    }
}

impl Catalog for BundleSource {
    fn catalog(&self) -> BTreeMap<String, Vec<String>> {
        self.tags
            .iter()
            .map(|(r, t)| (r.clone(), t.keys().cloned().collect()))
            .collect()
    }
}

impl Source for BundleSource {
    async fn manifest(&self, repo: &str, reference: &Reference) -> Result<RawManifest, StoreError> {
        let not_found = || StoreError::NotFound {
            store: self.describe(),
            what: format!("manifest {}", reference.qualify(repo)),
        };
        let (digest, media_type) = match reference {
            Reference::Tag(t) => self
                .tags
                .get(repo)
                .and_then(|r| r.get(t))
                .cloned()
                .ok_or_else(not_found)?,
            Reference::Digest(d) => (d.clone(), self.types.get(d).cloned().unwrap_or_default()),
        };
        let bytes = self.report.small_blobs.get(&digest).ok_or_else(not_found)?;
        let media_type = if media_type.is_empty() {
            Manifest::parse(bytes, None)
                .map(|m| m.media_type().to_string())
                .unwrap_or_default()
        } else {
            media_type
        };
        Ok(RawManifest {
            bytes: bytes.clone(),
            digest,
            media_type,
        })
    }

    async fn blob(
        &self,
        _repo: &str,
        desc: &Descriptor,
        offset: u64,
    ) -> Result<BlobStream, StoreError> {
        if let Some(b) = self.report.small_blobs.get(&desc.digest) {
            let piece = b.slice((offset as usize).min(b.len())..);
            return Ok(futures_util::stream::iter([Ok(piece)]).boxed());
        }
        let &(at, size) = self
            .report
            .blob_locations
            .get(&desc.digest)
            .ok_or_else(|| StoreError::NotFound {
                store: self.describe(),
                what: format!("blob {}", desc.digest),
            })?;
        self.range_stream(&format!("blob {}", desc.digest), at, size, offset)
    }

    /// No referrers API: a bundle holds what it carries under tags and digests (`serve`
    /// answers 404 to `/referrers/`), so a reader falls back to the referrers tag schema.
    async fn referrers(
        &self,
        _repo: &str,
        _subject: &Digest,
    ) -> Result<Option<bytes::Bytes>, StoreError> {
        Ok(None)
    }
}

impl BundleSource {
    /// The bytes of a program the bundle carries (`tools/…`, as its manifest names it).
    pub fn tool(&self, file: &str) -> Result<BlobStream, StoreError> {
        let &(at, size) =
            self.report
                .tool_locations
                .get(file)
                .ok_or_else(|| StoreError::NotFound {
                    store: self.describe(),
                    what: crate::text::printable(file),
                })?;
        self.range_stream(&crate::text::printable(file), at, size, 0)
    }

    /// The bundle's bytes `at + offset .. at + size` (an entry's, from `offset` on), from its
    /// file, parts or split set.
    fn range_stream(
        &self,
        what: &str,
        at: u64,
        size: u64,
        offset: u64,
    ) -> Result<BlobStream, StoreError> {
        if let Some(set) = &self.set {
            let offset = offset.min(size);
            if at.saturating_add(size) > set.header.bundle.size {
                return Err(self.err(SourceError::Content {
                    path: self.path.clone(),
                    reason: format!("{what} lies beyond the end of the bundle"),
                }));
            }
            return Ok(set_stream(
                self.describe(),
                set.clone(),
                at + offset,
                size - offset,
            ));
        }
        if self.parts.is_empty() {
            return Err(StoreError::NotFound {
                store: self.describe(),
                what: format!("{what} (not read in place)"),
            });
        }
        let offset = offset.min(size);
        let regions = self
            .regions(at + offset, size - offset)
            .map_err(|e| self.err(e))?;
        Ok(file::stream(self.describe(), regions))
    }
}
