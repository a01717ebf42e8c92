//! The copy engine: the one graph walk every command uses. [`resolve`] reads a manifest graph from a [`Source`]
//! (an index, its child manifests, their configs and layers), [`transfer`] copies resolved
//! graphs into a [`Sink`] children first: each blob once, skipping what the sink holds,
//! resuming what it holds in part, mounting across repositories where it can, with bounded
//! parallelism, largest blobs first; then every manifest as its exact bytes, the tag last.
//!
//! One policy for all: nested indexes are walked; a platform filter keeps the matching entries
//! of the top index and the attestations that describe them (the index is then rewritten, and
//! both digests are known); blobs an incremental bundle left out must already be in the sink,
//! checked before anything is written.
//!
//! # Bounds
//!
//! A graph comes from a registry, and a registry can answer anything: an index of 15,000
//! children, indexes nested without end, sizes that wrap. The walk takes what a real image needs
//! many times over, as a registry takes manifests up to 4 MiB and no more (distribution's own
//! limit), and refuses the rest while walking, before anything is fetched beyond the bound:
//!
//! | bound | value | what real images need |
//! |---|---|---|
//! | children of one index | [`MAX_CHILDREN`] (256) | Koordinator's: 2 platforms and their attestations; official Docker Hub images about 20 |
//! | indexes nested in indexes | [`MAX_DEPTH`] (4) | none (the top index lists image manifests) |
//! | manifests in one bundle | [`MAX_MANIFESTS`] (1,000) | the test environment's 1.8.0 bundle: 17 |
//! | bytes of those manifests | [`MAX_MANIFEST_BYTES`] (64 MiB) | the same bundle: 9.3 KiB |
//! | blobs in one bundle (each image's configs and layers) | [`MAX_BLOBS`] (10,000) | the same bundle: 26 |
//! | one blob, and the blobs of one graph or plan together | [`size::MAX_SIZE`] (2^63 - 1) | what an OCI descriptor (int64) and a file (`off_t`) hold |
//!
//! The bundle-wide bounds are kept by a [`Budget`] every [`resolve`] of one bundle shares. A
//! digest declared with two sizes is refused as well ([`totals`] across graphs).

use crate::store::{
    BlobStream, Have, OnBytes, Opener, RawManifest, Reference, Sink, Source, Store, StoreError,
};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::{StreamExt, TryStreamExt};
use koord_base::oci::{media, size, Descriptor, Digest, Manifest, ManifestError, Platform};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Most children of one index.
pub const MAX_CHILDREN: usize = 256;
/// Deepest nesting of indexes walked (the top index is depth 0).
pub const MAX_DEPTH: usize = 4;
/// Most manifests in one bundle (indexes, image manifests, attestations, the chart's).
pub const MAX_MANIFESTS: usize = 1000;
/// Most bytes of manifests in one bundle.
pub const MAX_MANIFEST_BYTES: u64 = 64 * 1024 * 1024;
/// Most blobs (configs and layers, counted per image) in one bundle.
pub const MAX_BLOBS: usize = 10_000;
/// Largest config read to learn a single-platform image's platform.
const MAX_CONFIG_PEEK: u64 = 1024 * 1024;

/// Why a copy failed.
#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    /// The reference the walk starts from is not in the store: "not there", as opposed to a
    /// manifest that is there but names a child or blob the store lacks (that is
    /// [`WalkError::Store`], with the store's own not-found).
    #[error(transparent)]
    NotFound(StoreError),
    /// A store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A manifest that cannot be walked.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// Something in a graph that contradicts its descriptor.
    #[error("{what}: {reason}")]
    Graph {
        /// The manifest or blob.
        what: String,
        /// What is wrong.
        reason: String,
    },
    /// The platform filter leaves nothing.
    #[error("{image} has platforms {available}, none of which matches --platform {wanted}")]
    Platform {
        /// The image.
        image: String,
        /// The filter.
        wanted: String,
        /// What it has.
        available: String,
    },
    /// A graph beyond one of the walk's bounds (see the module docs).
    #[error("image {image}: {what}: refused (koord-bundle takes at most {limit}; see \"Bounds\" in its README)")]
    Bound {
        /// The image being walked.
        image: String,
        /// What passed the bound.
        what: String,
        /// The bound, in words.
        limit: String,
    },
    /// A manifest of an image that is not a manifest.
    #[error("image {image}: {source}")]
    Invalid {
        /// The image being walked (its registry and repository).
        image: String,
        /// What is wrong.
        source: ManifestError,
    },
    /// Blobs left out of an incremental bundle are not in the sink.
    #[error("this incremental bundle needs blobs that {sink} does not hold ({} missing: {}): load the bundle it builds on first", missing.len(), missing.join(", "))]
    MissingOnSite {
        /// The sink.
        sink: String,
        /// `digest (size bytes, for repo)` of each.
        missing: Vec<String>,
    },
}

impl koord_base::exit::Classify for WalkError {
    fn exit_class(&self) -> Option<koord_base::exit::ExitClass> {
        match self {
            WalkError::NotFound(s) | WalkError::Store(s) => s.exit_class(),
            WalkError::Manifest(m) => m.exit_class(),
            // A graph that cannot be walked, a platform filter that leaves nothing, a bound
            // passed, a manifest that is not one, blobs an incremental bundle needs: the input.
            _ => Some(koord_base::exit::ExitClass::Input),
        }
    }
}

/// A manifest graph read from a source.
#[derive(Debug, Clone)]
pub struct Graph {
    /// Where it was read: repository and reference.
    pub repo: String,
    /// Tag or digest it was read by.
    pub reference: Reference,
    /// The top manifest as the source served it.
    pub upstream: RawManifest,
    /// The top manifest kept: `upstream`, or a new index under a platform filter.
    pub top: RawManifest,
    /// Every other manifest the top one reaches, each once, children before their parents.
    pub children: Vec<RawManifest>,
    /// Every blob (configs, layers, non-manifest index entries), each once.
    pub blobs: Vec<Descriptor>,
    /// Blobs read while resolving (small configs), so they need not be read again.
    pub inline: BTreeMap<Digest, Bytes>,
    /// Platforms kept (`linux/amd64`), attestations excluded.
    pub platforms: Vec<String>,
    /// Platforms a filter dropped.
    pub dropped: Vec<String>,
    /// Attestation (`unknown/unknown`) entries kept.
    pub attestations: usize,
}

impl Graph {
    /// Bytes of every manifest and blob (at most [`size::MAX_SIZE`]: [`resolve`] refuses a
    /// graph that adds up to more; a graph made otherwise saturates).
    pub fn total_size(&self) -> u64 {
        let manifests = self.manifests().map(|m| m.bytes.len() as u64);
        size::checked_sum(manifests.chain(self.blobs.iter().map(|b| b.size))).unwrap_or(u64::MAX)
    }

    /// Every manifest, children first, the top one last.
    pub fn manifests(&self) -> impl Iterator<Item = &RawManifest> {
        self.children.iter().chain(std::iter::once(&self.top))
    }

    /// `repository:tag` (or `@digest`) it was read by: the image, for messages.
    pub fn image(&self) -> String {
        self.reference.qualify(&self.repo)
    }
}

fn graph_err(what: impl Into<String>, reason: impl Into<String>) -> WalkError {
    WalkError::Graph {
        what: what.into(),
        reason: reason.into(),
    }
}

/// What the graphs of one bundle may take together: [`MAX_MANIFESTS`] manifests of
/// [`MAX_MANIFEST_BYTES`] bytes and [`MAX_BLOBS`] blobs. Every [`resolve`] of a bundle shares
/// one; what a walk that failed took is given back (another source may serve the image).
#[derive(Debug, Default)]
pub struct Budget {
    manifests: AtomicUsize,
    manifest_bytes: AtomicU64,
    blobs: AtomicUsize,
}

/// What one walk took of a [`Budget`].
#[derive(Debug, Default)]
struct Taken {
    manifests: usize,
    manifest_bytes: u64,
    blobs: usize,
}

impl Budget {
    /// A place for one more manifest, taken before it is fetched.
    fn manifest(&self, image: &str, taken: &mut Taken) -> Result<(), WalkError> {
        let n = self.manifests.fetch_add(1, Ordering::SeqCst) + 1;
        taken.manifests += 1;
        if n > MAX_MANIFESTS {
            return Err(bound(
                image,
                format!("its manifests bring the bundle past {MAX_MANIFESTS} manifests"),
                format!("{MAX_MANIFESTS} manifests in one bundle"),
            ));
        }
        Ok(())
    }

    /// The bytes of a manifest fetched.
    fn manifest_bytes(&self, image: &str, len: u64, taken: &mut Taken) -> Result<(), WalkError> {
        let n = self.manifest_bytes.fetch_add(len, Ordering::SeqCst);
        taken.manifest_bytes += len;
        if n.saturating_add(len) > MAX_MANIFEST_BYTES {
            return Err(bound(
                image,
                format!(
                    "its manifests bring the bundle's past {}",
                    koord_base::text::human_bytes(MAX_MANIFEST_BYTES)
                ),
                format!(
                    "{} of manifests in one bundle",
                    koord_base::text::human_bytes(MAX_MANIFEST_BYTES)
                ),
            ));
        }
        Ok(())
    }

    /// `n` more blobs.
    fn blobs(&self, image: &str, n: usize, taken: &mut Taken) -> Result<(), WalkError> {
        let total = self.blobs.fetch_add(n, Ordering::SeqCst) + n;
        taken.blobs += n;
        if total > MAX_BLOBS {
            return Err(bound(
                image,
                format!("its blobs bring the bundle past {MAX_BLOBS} blobs"),
                format!("{MAX_BLOBS} blobs in one bundle"),
            ));
        }
        Ok(())
    }

    fn give_back(&self, taken: &Taken) {
        self.manifests.fetch_sub(taken.manifests, Ordering::SeqCst);
        self.manifest_bytes
            .fetch_sub(taken.manifest_bytes, Ordering::SeqCst);
        self.blobs.fetch_sub(taken.blobs, Ordering::SeqCst);
    }
}

fn bound(image: &str, what: String, limit: String) -> WalkError {
    WalkError::Bound {
        image: image.to_string(),
        what,
        limit,
    }
}

/// One walk: the graph being read, what it has seen (digest → declared size), what it took.
struct Walk<'a> {
    image: String,
    budget: &'a Budget,
    taken: Taken,
    seen: BTreeMap<Digest, u64>,
    /// Declared bytes so far (manifests and blobs), at most [`size::MAX_SIZE`].
    bytes: u64,
}

impl Walk<'_> {
    /// Note `d` with its declared size: `false` when it was seen before (with the same size; a
    /// second size is refused).
    fn first_sight(&mut self, d: &Descriptor) -> Result<bool, WalkError> {
        match self.seen.get(&d.digest) {
            Some(&s) if s == d.size => Ok(false),
            Some(&s) => Err(graph_err(
                format!("image {}", self.image),
                format!(
                    "{} is declared as {s} bytes and as {} bytes: refused",
                    d.digest, d.size
                ),
            )),
            None => {
                self.seen.insert(d.digest.clone(), d.size);
                self.bytes = size::checked_add(self.bytes, d.size).ok_or_else(|| {
                    bound(
                        &self.image,
                        format!(
                            "its blobs add up to more than {} bytes",
                            size::MAX_SIZE_TEXT
                        ),
                        format!("{} bytes in one image", size::MAX_SIZE_TEXT),
                    )
                })?;
                Ok(true)
            }
        }
    }

    /// An index's children, at most [`MAX_CHILDREN`].
    fn children_ok(&self, digest: &Digest, n: usize) -> Result<(), WalkError> {
        if n > MAX_CHILDREN {
            return Err(bound(
                &self.image,
                format!("index {digest} lists {n} manifests"),
                format!("{MAX_CHILDREN} manifests in one index"),
            ));
        }
        Ok(())
    }

    /// A manifest's bytes parsed, naming the image when they are not a manifest.
    fn parse(&self, m: &RawManifest) -> Result<Manifest, WalkError> {
        Manifest::parse(&m.bytes, Some(&m.media_type)).map_err(|source| WalkError::Invalid {
            image: self.image.clone(),
            source,
        })
    }
}

/// Read the graph `repo` names by `reference` from `src`; with `platforms`, keep only the
/// matching entries of the top index (and their attestations). The bundle-wide bounds are
/// `budget`'s; a walk that fails gives back what it took of it.
pub async fn resolve<S: Source>(
    src: &S,
    repo: &str,
    reference: &Reference,
    platforms: Option<&[String]>,
    budget: &Budget,
) -> Result<Graph, WalkError> {
    let mut w = Walk {
        image: reference.qualify(repo),
        budget,
        taken: Taken::default(),
        seen: BTreeMap::new(),
        bytes: 0,
    };
    let r = resolve_in(src, repo, reference, platforms, &mut w).await;
    if r.is_err() {
        budget.give_back(&w.taken);
    }
    r
}

async fn resolve_in<S: Source>(
    src: &S,
    repo: &str,
    reference: &Reference,
    platforms: Option<&[String]>,
    w: &mut Walk<'_>,
) -> Result<Graph, WalkError> {
    w.budget.manifest(&w.image, &mut w.taken)?;
    let upstream = src.manifest(repo, reference).await.map_err(|e| {
        if e.is_not_found() {
            WalkError::NotFound(e)
        } else {
            WalkError::Store(e)
        }
    })?;
    w.budget
        .manifest_bytes(&w.image, upstream.bytes.len() as u64, &mut w.taken)?;
    let name = w.image.clone();
    let parsed = w.parse(&upstream)?;
    let mut g = Graph {
        repo: repo.to_string(),
        reference: reference.clone(),
        upstream: upstream.clone(),
        top: upstream.clone(),
        children: vec![],
        blobs: vec![],
        inline: BTreeMap::new(),
        platforms: vec![],
        dropped: vec![],
        attestations: 0,
    };
    w.first_sight(&upstream.descriptor())?;
    match parsed {
        Manifest::Index { manifests, .. } => {
            w.children_ok(&upstream.digest, manifests.len())?;
            let kept = filter_index(&name, &manifests, platforms)?;
            for (i, m) in manifests.iter().enumerate() {
                let label = m
                    .platform
                    .as_ref()
                    .map(Platform::to_string)
                    .unwrap_or_else(|| "unknown".into());
                let attestation = m.platform.as_ref().is_some_and(Platform::is_unknown);
                match (kept.contains(&i), attestation) {
                    (true, true) => g.attestations += 1,
                    (true, false) => g.platforms.push(label),
                    (false, _) => g.dropped.push(label),
                }
            }
            if kept.len() != manifests.len() {
                g.top = rewrite_index(&upstream, &kept)?;
            }
            for &i in &kept {
                walk_child(src, repo, &manifests[i], 1, &mut g, w).await?;
            }
        }
        img @ Manifest::Image { .. } => {
            add_blobs(&mut g, &img, w)?;
            // A single-platform image names its platform in its config.
            if let Manifest::Image { config, .. } = &img {
                if let Some(p) = peek_platform(src, repo, config, &mut g).await? {
                    if let Some(f) = platforms.filter(|f| !f.iter().any(|f| p.matches(f))) {
                        return Err(WalkError::Platform {
                            image: name,
                            wanted: f.join(","),
                            available: p.to_string(),
                        });
                    }
                    g.platforms.push(p.to_string());
                }
            }
        }
    }
    Ok(g)
}

/// Indexes of the entries a platform filter keeps: matching platforms, entries without a
/// platform, and attestations of kept entries. Without a filter: all.
fn filter_index(
    name: &str,
    manifests: &[Descriptor],
    platforms: Option<&[String]>,
) -> Result<Vec<usize>, WalkError> {
    let Some(filter) = platforms else {
        return Ok((0..manifests.len()).collect());
    };
    let is_att = |m: &Descriptor| m.platform.as_ref().is_some_and(Platform::is_unknown);
    let kept: Vec<usize> = (0..manifests.len())
        .filter(|&i| !is_att(&manifests[i]))
        .filter(|&i| match &manifests[i].platform {
            Some(p) => filter.iter().any(|f| p.matches(f)),
            None => false,
        })
        .collect();
    if kept.is_empty() {
        let available: Vec<String> = manifests
            .iter()
            .filter(|m| !is_att(m))
            .filter_map(|m| m.platform.as_ref().map(Platform::to_string))
            .collect();
        return Err(WalkError::Platform {
            image: name.to_string(),
            wanted: filter.join(","),
            available: available.join(", "),
        });
    }
    let kept_digests: BTreeSet<&str> = kept.iter().map(|&i| manifests[i].digest.as_str()).collect();
    let mut all: Vec<usize> = kept.clone();
    for (i, m) in manifests.iter().enumerate() {
        let describes = m
            .annotations
            .as_ref()
            .and_then(|a| a.get("vnd.docker.reference.digest"))
            .is_some_and(|d| kept_digests.contains(d.as_str()));
        if is_att(m) && describes {
            all.push(i);
        }
    }
    all.sort_unstable();
    Ok(all)
}

/// A new index holding only the `kept` entries, every other field as served.
fn rewrite_index(upstream: &RawManifest, kept: &[usize]) -> Result<RawManifest, WalkError> {
    let invalid = |e: serde_json::Error| ManifestError::Invalid {
        digest: upstream.digest.clone(),
        reason: e.to_string(),
    };
    let mut doc: serde_json::Value = serde_json::from_slice(&upstream.bytes).map_err(invalid)?;
    if let Some(arr) = doc.get_mut("manifests").and_then(|m| m.as_array_mut()) {
        let all = std::mem::take(arr);
        *arr = all
            .into_iter()
            .enumerate()
            .filter(|(i, _)| kept.contains(i))
            .map(|(_, v)| v)
            .collect();
    }
    Ok(RawManifest::new(
        serde_json::to_vec(&doc).map_err(invalid)?,
        upstream.media_type.clone(),
    ))
}

fn add_blobs(g: &mut Graph, m: &Manifest, w: &mut Walk<'_>) -> Result<(), WalkError> {
    let before = g.blobs.len();
    for b in m.blobs() {
        if w.first_sight(b)? {
            g.blobs.push(b.clone());
        }
    }
    w.budget
        .blobs(&w.image, g.blobs.len() - before, &mut w.taken)
}

/// Walk one entry of an index: a manifest (recursively) or, when it is not one, a blob.
async fn walk_child<S: Source>(
    src: &S,
    repo: &str,
    desc: &Descriptor,
    depth: usize,
    g: &mut Graph,
    w: &mut Walk<'_>,
) -> Result<(), WalkError> {
    if !w.first_sight(desc)? {
        return Ok(());
    }
    let is_manifest = media::ALL_MANIFESTS.contains(&desc.media_type.as_str());
    if !is_manifest {
        g.blobs.push(desc.clone());
        return w.budget.blobs(&w.image, 1, &mut w.taken);
    }
    let what = format!("manifest {repo}@{}", desc.digest);
    if media::is_index(&desc.media_type) && depth >= MAX_DEPTH {
        return Err(bound(
            &w.image,
            format!("{what} is an index nested deeper than {MAX_DEPTH}"),
            format!("indexes nested {MAX_DEPTH} deep"),
        ));
    }
    w.budget.manifest(&w.image, &mut w.taken)?;
    let m = src
        .manifest(repo, &Reference::Digest(desc.digest.clone()))
        .await?;
    w.budget
        .manifest_bytes(&w.image, m.bytes.len() as u64, &mut w.taken)?;
    if m.digest != desc.digest {
        return Err(graph_err(what, format!("served with digest {}", m.digest)));
    }
    if m.bytes.len() as u64 != desc.size {
        return Err(graph_err(
            what,
            format!("is {} bytes, the index says {}", m.bytes.len(), desc.size),
        ));
    }
    let m = RawManifest {
        media_type: desc.media_type.clone(),
        ..m
    };
    match w.parse(&m)? {
        Manifest::Index { manifests, .. } => {
            if depth >= MAX_DEPTH {
                return Err(bound(
                    &w.image,
                    format!("{what} is an index nested deeper than {MAX_DEPTH}"),
                    format!("indexes nested {MAX_DEPTH} deep"),
                ));
            }
            w.children_ok(&desc.digest, manifests.len())?;
            for c in &manifests {
                Box::pin(walk_child(src, repo, c, depth + 1, g, w)).await?;
            }
        }
        img @ Manifest::Image { .. } => add_blobs(g, &img, w)?,
    }
    g.children.push(m);
    Ok(())
}

/// The platform a single-platform image's config names (it is small; kept in `g.inline`).
async fn peek_platform<S: Source>(
    src: &S,
    repo: &str,
    config: &Descriptor,
    g: &mut Graph,
) -> Result<Option<Platform>, WalkError> {
    if config.size > MAX_CONFIG_PEEK || media::is_index(&config.media_type) {
        return Ok(None);
    }
    let bytes: Vec<Bytes> = src.blob(repo, config, 0).await?.try_collect().await?;
    let bytes = Bytes::from(bytes.concat());
    if bytes.len() as u64 != config.size || Digest::of(&bytes) != config.digest {
        return Err(StoreError::DigestMismatch {
            store: src.describe(),
            what: format!("config {repo}@{}", config.digest),
            expected: config.digest.clone(),
            actual: Digest::of(&bytes),
            size: bytes.len() as u64,
        }
        .into());
    }
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    g.inline.insert(config.digest.clone(), bytes);
    let s = |k: &str| v.get(k).and_then(|s| s.as_str()).map(str::to_string);
    Ok(match (s("os"), s("architecture")) {
        (Some(os), Some(architecture)) => Some(Platform {
            architecture,
            os,
            variant: s("variant"),
            os_version: None,
        }),
        _ => None,
    })
}

/// The blobs of several graphs together (each once), what they weigh, and the largest.
#[derive(Debug, Clone, Default)]
pub struct Totals {
    /// Every blob, by digest: its size.
    pub blobs: BTreeMap<Digest, u64>,
    /// Their bytes, at most [`size::MAX_SIZE`].
    pub bytes: u64,
    /// The largest blob: its digest, size and the image it belongs to (the first one).
    pub largest: Option<(Digest, u64, String)>,
}

/// The blobs of `graphs` but those in `skip`, each once: refused when a digest is declared with
/// two sizes (naming both images) or when they add up to more than [`size::MAX_SIZE`].
pub fn totals<'g>(
    graphs: impl IntoIterator<Item = &'g Graph>,
    skip: &BTreeSet<Digest>,
) -> Result<Totals, WalkError> {
    let mut t = Totals::default();
    let mut owner: BTreeMap<&Digest, String> = BTreeMap::new();
    for g in graphs {
        for b in g.blobs.iter().filter(|b| !skip.contains(&b.digest)) {
            match t.blobs.get(&b.digest) {
                Some(&s) if s == b.size => continue,
                Some(&s) => {
                    return Err(graph_err(
                        format!("blob {}", b.digest),
                        format!(
                        "declared as {s} bytes by image {} and as {} bytes by image {}: refused",
                        owner.get(&b.digest).map(String::as_str).unwrap_or("?"),
                        b.size,
                        g.image()
                    ),
                    ))
                }
                None => {}
            }
            t.blobs.insert(b.digest.clone(), b.size);
            owner.insert(&b.digest, g.image());
            t.bytes = size::checked_add(t.bytes, b.size).ok_or_else(|| {
                bound(
                    &g.image(),
                    format!(
                        "the blobs of the images so far add up to more than {} bytes",
                        size::MAX_SIZE_TEXT
                    ),
                    format!("{} bytes in one bundle", size::MAX_SIZE_TEXT),
                )
            })?;
            if t.largest.as_ref().is_none_or(|(_, s, _)| b.size > *s) {
                t.largest = Some((b.digest.clone(), b.size, g.image()));
            }
        }
    }
    Ok(t)
}

/// One graph to copy: where it goes in the sink.
#[derive(Debug, Clone)]
pub struct Item<'g> {
    /// The resolved graph.
    pub graph: &'g Graph,
    /// Repository in the sink.
    pub repo: String,
    /// Tag (or digest) in the sink.
    pub reference: Reference,
}

/// What becomes of the blobs [`Options::omitted`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Omitted {
    /// The sink must already hold them (loading an incremental bundle): checked before
    /// anything is written.
    Require,
    /// Not copied, not checked (building an incremental bundle: the site holds them).
    Skip,
}

/// How to copy.
pub struct Options<'a> {
    /// Blob transfers at once.
    pub jobs: usize,
    /// Blobs not to copy.
    pub omitted: &'a BTreeSet<Digest>,
    /// Whether the sink must hold them.
    pub omitted_policy: Omitted,
    /// Write nothing: only find out what would be written.
    pub dry_run: bool,
    /// Told of blob bytes as they are taken (or found present).
    pub on_bytes: OnBytes,
}

/// What a copy did (or, in a dry run, would do). Blobs are counted once each (by digest),
/// whatever number of repositories use them; [`Stats::pairs`] counts (repository, blob) pairs.
#[derive(Debug, Default, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    /// Blobs considered, each once.
    pub blobs: usize,
    /// Their bytes.
    pub blob_bytes: u64,
    /// Of those, blobs copied (into at least one repository).
    pub uploaded: usize,
    /// Bytes copied (of resumed blobs: the rest only; a blob copied into two repositories
    /// counts twice: these are the bytes sent).
    pub uploaded_bytes: u64,
    /// Blobs mounted from another repository of the sink ((repository, blob) pairs: a mount
    /// adds a blob the sink holds to one more repository).
    pub mounted: usize,
    /// Of the blobs, those already in the sink (none of their bytes sent).
    pub skipped: usize,
    /// Their bytes.
    pub skipped_bytes: u64,
    /// Manifests put.
    pub manifests_pushed: usize,
    /// Manifests already present.
    pub manifests_skipped: usize,
    /// Graphs whose tag already pointed at their top manifest (nothing of them was checked).
    pub graphs_present: usize,
    /// Tags pointed at their manifest.
    pub tags: Vec<String>,
    /// Blobs an incremental bundle left out, found in the sink.
    pub required_present: usize,
    /// The same counts per (repository, blob) pair.
    pub pairs: PairStats,
}

/// What a copy did per (repository, blob) pair: a blob that three repositories use counts
/// three times.
#[derive(Debug, Default, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PairStats {
    /// Pairs considered.
    pub blobs: usize,
    /// Pairs copied.
    pub uploaded: usize,
    /// Pairs already present.
    pub skipped: usize,
    /// Their bytes.
    pub skipped_bytes: u64,
}

/// Each blob once: its size and whether any of its bytes were sent.
#[derive(Default)]
struct Unique(BTreeMap<Digest, (u64, bool)>);

impl Unique {
    fn saw(&mut self, d: &Digest, size: u64, uploaded: bool) {
        let e = self.0.entry(d.clone()).or_insert((size, false));
        e.1 |= uploaded;
    }

    fn into_stats(self, stats: &mut Stats) {
        for (size, uploaded) in self.0.into_values() {
            stats.blobs += 1;
            stats.blob_bytes = stats.blob_bytes.saturating_add(size);
            if uploaded {
                stats.uploaded += 1;
            } else {
                stats.skipped += 1;
                stats.skipped_bytes = stats.skipped_bytes.saturating_add(size);
            }
        }
    }
}

#[derive(Clone)]
enum Done {
    Present(u64),
    Uploaded(u64),
    Mounted,
}

/// Copy resolved graphs from `src` into `sink`: blobs first (each once, largest first), then
/// manifests children first, the tag last. A graph whose tag already points at its top manifest
/// is taken as complete (a registry accepts a manifest only with everything it references).
/// A dry run reads the sink's state but writes nothing: every blob counts as uploaded, every
/// mount as done, every manifest as put.
pub async fn transfer<S: Source, K: Sink>(
    src: &S,
    sink: &K,
    items: &[Item<'_>],
    opts: &Options<'_>,
) -> Result<Stats, WalkError> {
    if opts.dry_run {
        transfer_into(src, &DryRun(sink), items, opts).await
    } else {
        transfer_into(src, sink, items, opts).await
    }
}

/// A sink that answers what the one under it holds and writes nothing: every blob it is given
/// counts as uploaded, every mount as done, every manifest as put.
struct DryRun<'a, K>(&'a K);

impl<K: Sink> Store for DryRun<'_, K> {
    fn describe(&self) -> String {
        self.0.describe()
    }
}

impl<K: Sink> Sink for DryRun<'_, K> {
    async fn blob_state(&self, repo: &str, desc: &Descriptor) -> Result<Have, StoreError> {
        self.0.blob_state(repo, desc).await
    }

    async fn put_blob(
        &self,
        _repo: &str,
        desc: &Descriptor,
        offset: u64,
        _data: &dyn Opener,
        on_bytes: &OnBytes,
    ) -> Result<(), StoreError> {
        on_bytes(desc.size.saturating_sub(offset));
        Ok(())
    }

    async fn mount_blob(
        &self,
        _repo: &str,
        _from_repo: &str,
        _desc: &Descriptor,
    ) -> Result<bool, StoreError> {
        Ok(true)
    }

    async fn has_manifest(
        &self,
        repo: &str,
        reference: &Reference,
        digest: &Digest,
    ) -> Result<bool, StoreError> {
        self.0.has_manifest(repo, reference, digest).await
    }

    async fn put_manifest(
        &self,
        _repo: &str,
        _reference: &Reference,
        _manifest: &RawManifest,
    ) -> Result<(), StoreError> {
        Ok(())
    }
}

async fn transfer_into<S: Source, K: Sink>(
    src: &S,
    sink: &K,
    items: &[Item<'_>],
    opts: &Options<'_>,
) -> Result<Stats, WalkError> {
    let jobs = opts.jobs.max(1);
    let mut stats = Stats::default();
    // 0. Graphs already there.
    let present: Vec<bool> = futures_util::stream::iter(items)
        .map(|it| sink.has_manifest(&it.repo, &it.reference, &it.graph.top.digest))
        .buffered(jobs)
        .try_collect()
        .await?;
    let mut todo = Vec::new();
    let mut done_graphs = Vec::new();
    for (it, done) in items.iter().zip(present) {
        if done {
            done_graphs.push(it);
        } else {
            todo.push(it);
        }
    }
    let mut unique = count_present(&done_graphs, &todo, opts, &mut stats);

    // 1. Where each blob goes first (its home), and the left-out blobs the sink must hold.
    let mut home: BTreeMap<&Digest, (&str, &Descriptor, &Item)> = BTreeMap::new();
    let mut required: BTreeMap<&Digest, (&Descriptor, Vec<&str>)> = BTreeMap::new();
    for it in &todo {
        for b in &it.graph.blobs {
            if opts.omitted.contains(&b.digest) {
                if opts.omitted_policy == Omitted::Skip {
                    continue;
                }
                required
                    .entry(&b.digest)
                    .or_insert_with(|| (b, vec![]))
                    .1
                    .push(&it.repo);
            } else {
                home.entry(&b.digest).or_insert((&it.repo, b, it));
            }
        }
    }
    // Each looked up in the repositories that use it, `jobs` blobs at a time.
    let found: Vec<Option<&str>> = futures_util::stream::iter(required.values())
        .map(|(desc, repos)| async move {
            for r in repos {
                if sink.blob_state(r, desc).await? == Have::Complete {
                    return Ok::<_, StoreError>(Some(*r));
                }
            }
            Ok(None)
        })
        .buffered(jobs)
        .try_collect()
        .await?;
    let mut missing = Vec::new();
    let mut required_home: BTreeMap<&Digest, &str> = BTreeMap::new();
    for ((d, (desc, repos)), found) in required.iter().zip(found) {
        match found {
            Some(r) => {
                required_home.insert(d, r);
            }
            None => missing.push(format!("{d} ({} bytes, for {})", desc.size, repos[0])),
        }
    }
    if !missing.is_empty() {
        return Err(WalkError::MissingOnSite {
            sink: sink.describe(),
            missing,
        });
    }
    stats.required_present = required.len();
    for (d, (desc, _)) in &required {
        if !unique.0.contains_key(*d) {
            (opts.on_bytes)(desc.size);
        }
        unique.saw(d, desc.size, false);
    }

    // 2. Every blob into its home, largest first; 3. as soon as a graph's blobs are home, the
    // same blobs in its repository (present, mounted, or copied), then 4. its manifests,
    // children first, the tag last. A graph does not wait for the blobs of the others (a small
    // image's tag is in place while the largest blob of another still uploads).
    let mut order: Vec<_> = home.values().collect();
    order.sort_by_key(|(_, b, _)| std::cmp::Reverse(b.size));
    let homed = Homed::default();
    let homes = futures_util::stream::iter(order)
        .map(|(repo, desc, it)| async {
            let r = copy_blob(src, sink, it, repo, desc, opts).await;
            homed.settle(&desc.digest, r.is_ok());
            r.map(|d| (*desc, d))
        })
        .buffer_unordered(jobs)
        .try_collect::<Vec<(&Descriptor, Done)>>();
    let claimed: std::sync::Mutex<BTreeSet<(String, Digest)>> = Default::default();
    // Every graph waits for its blobs at once (waiting costs nothing) and finishes as soon as
    // they are home; what the finishing graphs send (mounts, copies, manifests) is `jobs`
    // requests at a time in all, beside the `jobs` home copies.
    let ops = tokio::sync::Semaphore::new(jobs);
    // Where each blob is to be had in the sink: its home, or the repository of the site's copy
    // (incremental bundles).
    let mut found_in: BTreeMap<&Digest, &str> = required_home.clone();
    found_in.extend(home.iter().map(|(d, (h, _, _))| (*d, *h)));
    let graphs = futures_util::future::try_join_all(todo.iter().map(|it| {
        let (homed, ops, claimed) = (&homed, &ops, &claimed);
        let (home, found_in) = (&home, &found_in);
        async move {
            let theirs: Vec<&Digest> = it
                .graph
                .blobs
                .iter()
                .map(|b| &b.digest)
                .filter(|d| home.contains_key(d))
                .collect();
            if !homed.wait_for(&theirs).await {
                // A blob failed to go home: its error is the one reported.
                return Ok(GraphDone::default());
            }
            finish_graph(src, sink, it, found_in, claimed, ops, opts).await
        }
    }));
    // The first error ends the whole transfer (what is in flight is dropped; a rerun resumes).
    let (home_results, graph_results) = futures_util::future::try_join(homes, graphs).await?;
    for (desc, r) in home_results {
        tally(&mut stats, &mut unique, desc, r);
    }
    for g in graph_results {
        for (desc, d) in g.blobs {
            tally(&mut stats, &mut unique, desc, d);
        }
        stats.manifests_pushed += g.manifests_pushed;
        stats.manifests_skipped += g.manifests_skipped;
    }
    for it in &todo {
        stats.tags.push(it.reference.qualify(&it.repo));
    }
    unique.into_stats(&mut stats);
    Ok(stats)
}

/// Count the graphs already in the sink (`done`): their blobs as present, each once. The
/// progress counts each blob once: a blob that a graph still to copy (`todo`) holds is
/// counted by its copy.
fn count_present(
    done: &[&Item<'_>],
    todo: &[&Item<'_>],
    opts: &Options<'_>,
    stats: &mut Stats,
) -> Unique {
    let mut unique = Unique::default();
    let to_copy: BTreeSet<&Digest> = todo
        .iter()
        .flat_map(|it| it.graph.blobs.iter().map(|b| &b.digest))
        .collect();
    for it in done {
        stats.graphs_present += 1;
        stats.pairs.blobs += it.graph.blobs.len();
        stats.pairs.skipped += it.graph.blobs.len();
        for b in &it.graph.blobs {
            stats.pairs.skipped_bytes = stats.pairs.skipped_bytes.saturating_add(b.size);
            if !to_copy.contains(&b.digest) && !unique.0.contains_key(&b.digest) {
                (opts.on_bytes)(b.size);
            }
            unique.saw(&b.digest, b.size, false);
        }
        stats.manifests_skipped += it.graph.children.len() + 1;
        stats.tags.push(it.reference.qualify(&it.repo));
    }
    unique
}

/// Which home copies have ended (and whether well), for the graphs that wait on them.
#[derive(Default)]
struct Homed {
    settled: std::sync::Mutex<BTreeMap<Digest, bool>>,
    changed: tokio::sync::Notify,
}

impl Homed {
    fn settle(&self, d: &Digest, ok: bool) {
        if let Ok(mut s) = self.settled.lock() {
            s.insert(d.clone(), ok);
        }
        self.changed.notify_waiters();
    }

    /// Wait until every one of `digests` is home: `false` as soon as one failed.
    async fn wait_for(&self, digests: &[&Digest]) -> bool {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let Ok(s) = self.settled.lock() else {
                    return false;
                };
                if digests.iter().any(|d| s.get(*d) == Some(&false)) {
                    return false;
                }
                if digests.iter().all(|d| s.get(*d) == Some(&true)) {
                    return true;
                }
            }
            changed.await;
        }
    }
}

/// What finishing one graph did.
#[derive(Default)]
struct GraphDone<'g> {
    blobs: Vec<(&'g Descriptor, Done)>,
    manifests_pushed: usize,
    manifests_skipped: usize,
}

/// One graph whose blobs are home: the same blobs in its repository (each (repository, blob)
/// pair once across graphs), then its manifests.
async fn finish_graph<'g, S: Source, K: Sink>(
    src: &S,
    sink: &K,
    it: &'g Item<'_>,
    found_in: &BTreeMap<&Digest, &str>,
    claimed: &std::sync::Mutex<BTreeSet<(String, Digest)>>,
    ops: &tokio::sync::Semaphore,
    opts: &Options<'_>,
) -> Result<GraphDone<'g>, WalkError> {
    let mut mine = Vec::new();
    for b in &it.graph.blobs {
        let Some(&from) = found_in.get(&b.digest) else {
            continue;
        };
        let fresh = claimed
            .lock()
            .map(|mut c| c.insert((it.repo.clone(), b.digest.clone())))
            .unwrap_or(false);
        if from != it.repo && fresh {
            mine.push((from, b));
        }
    }
    // A second copy of a blob (a mount refused) is not counted on the progress again: the
    // first one was.
    let again = Options {
        jobs: opts.jobs,
        omitted: opts.omitted,
        omitted_policy: opts.omitted_policy,
        dry_run: opts.dry_run,
        on_bytes: std::sync::Arc::new(|_| {}),
    };
    let again = &again;
    let blobs: Vec<(&Descriptor, Done)> = futures_util::stream::iter(mine)
        .map(|(from, desc)| async move {
            let _op = permit(ops).await?;
            let done = match sink.blob_state(&it.repo, desc).await? {
                Have::Complete => Done::Present(desc.size),
                _ if sink.mount_blob(&it.repo, from, desc).await? => Done::Mounted,
                _ => copy_blob(src, sink, it, &it.repo, desc, again).await?,
            };
            Ok::<_, WalkError>((desc, done))
        })
        .buffer_unordered(opts.jobs.max(1))
        .try_collect()
        .await?;
    let (manifests_pushed, manifests_skipped) = put_manifests(sink, it, ops).await?;
    Ok(GraphDone {
        blobs,
        manifests_pushed,
        manifests_skipped,
    })
}

fn tally(stats: &mut Stats, unique: &mut Unique, desc: &Descriptor, d: Done) {
    stats.pairs.blobs += 1;
    match d {
        Done::Present(n) => {
            stats.pairs.skipped += 1;
            stats.pairs.skipped_bytes = stats.pairs.skipped_bytes.saturating_add(n);
            unique.saw(&desc.digest, desc.size, false);
        }
        Done::Uploaded(n) => {
            stats.pairs.uploaded += 1;
            stats.uploaded_bytes = stats.uploaded_bytes.saturating_add(n);
            unique.saw(&desc.digest, desc.size, true);
        }
        Done::Mounted => {
            stats.mounted += 1;
            unique.saw(&desc.digest, desc.size, false);
        }
    }
}

/// The source side of one blob transfer: the graph's inline copy, else the source.
struct FromSource<'a, S> {
    src: &'a S,
    repo: &'a str,
    desc: &'a Descriptor,
    inline: Option<&'a Bytes>,
}

impl<S: Source> Opener for FromSource<'_, S> {
    fn open(&self, offset: u64) -> BoxFuture<'_, Result<BlobStream, StoreError>> {
        Box::pin(async move {
            match self.inline {
                Some(b) => {
                    let piece = b.slice((offset as usize).min(b.len())..);
                    Ok(futures_util::stream::iter([Ok(piece)]).boxed())
                }
                None => self.src.blob(self.repo, self.desc, offset).await,
            }
        })
    }
}

/// One blob into `repo` of the sink: skipped when there, resumed when partly there. Retries
/// are the stores' business (their transport's policy): a registry source resumes a broken
/// download itself, a registry sink restarts a failed upload.
async fn copy_blob<S: Source, K: Sink>(
    src: &S,
    sink: &K,
    it: &Item<'_>,
    repo: &str,
    desc: &Descriptor,
    opts: &Options<'_>,
) -> Result<Done, WalkError> {
    let offset = match sink.blob_state(repo, desc).await? {
        Have::Complete => {
            (opts.on_bytes)(desc.size);
            return Ok(Done::Present(desc.size));
        }
        Have::Partial(n) if n <= desc.size => n,
        _ => 0,
    };
    (opts.on_bytes)(offset);
    let data = FromSource {
        src,
        repo: &it.graph.repo,
        desc,
        inline: it.graph.inline.get(&desc.digest),
    };
    sink.put_blob(repo, desc, offset, &data, &opts.on_bytes)
        .await
        .map_err(|e| from_source(e, src, &it.graph.repo))?;
    Ok(Done::Uploaded(desc.size.saturating_sub(offset)))
}

/// Content the sink refused for its size or digest came so from the source: the error names
/// the source (the registry and repository that served it), not the sink that noticed.
fn from_source<S: Source>(e: StoreError, src: &S, repo: &str) -> StoreError {
    let from = format!("{} {repo}", src.describe()).trim().to_string();
    match e {
        StoreError::DigestMismatch {
            what,
            expected,
            actual,
            size,
            ..
        } => StoreError::DigestMismatch {
            store: from,
            what,
            expected,
            actual,
            size,
        },
        StoreError::SizeMismatch {
            what,
            expected,
            actual,
            ..
        } => StoreError::SizeMismatch {
            store: from,
            what,
            expected,
            actual,
        },
        other => other,
    }
}

/// A place among the `jobs` requests the finishing graphs may have in flight.
async fn permit(
    ops: &tokio::sync::Semaphore,
) -> Result<tokio::sync::SemaphorePermit<'_>, WalkError> {
    ops.acquire().await.map_err(|_| graph_err("copy", "closed"))
}

/// One manifest: skipped when the sink has it, else put. Returns (pushed, skipped).
async fn put_one_manifest<K: Sink>(
    sink: &K,
    it: &Item<'_>,
    m: &RawManifest,
    reference: Reference,
    ops: &tokio::sync::Semaphore,
) -> Result<(usize, usize), WalkError> {
    let _op = permit(ops).await?;
    if sink.has_manifest(&it.repo, &reference, &m.digest).await? {
        return Ok((0, 1));
    }
    sink.put_manifest(&it.repo, &reference, m).await?;
    Ok((1, 0))
}

async fn put_manifests<K: Sink>(
    sink: &K,
    it: &Item<'_>,
    ops: &tokio::sync::Semaphore,
) -> Result<(usize, usize), WalkError> {
    // Children by digest, deepest first: each level once the one below is in (an index may
    // hold indexes); the manifests of one level at once.
    let (mut pushed, mut skipped) = (0, 0);
    let mut levels: Vec<Vec<&RawManifest>> = Vec::new();
    let mut placed: BTreeMap<&Digest, usize> = BTreeMap::new();
    for m in &it.graph.children {
        // A child's level: one above the highest of the manifests it references.
        let refs: Vec<Digest> = match Manifest::parse(&m.bytes, Some(&m.media_type)) {
            Ok(Manifest::Index { manifests, .. }) => {
                manifests.into_iter().map(|d| d.digest).collect()
            }
            _ => vec![],
        };
        let level = refs
            .iter()
            .filter_map(|d| placed.get(d))
            .map(|l| l + 1)
            .max()
            .unwrap_or(0);
        placed.insert(&m.digest, level);
        if levels.len() <= level {
            levels.resize_with(level + 1, Vec::new);
        }
        levels[level].push(m);
    }
    for level in levels {
        let done: Vec<(usize, usize)> = futures_util::stream::iter(level)
            .map(|m| put_one_manifest(sink, it, m, Reference::Digest(m.digest.clone()), ops))
            .buffer_unordered(8)
            .try_collect()
            .await?;
        for (p, s) in done {
            pushed += p;
            skipped += s;
        }
    }
    let (p, s) = put_one_manifest(sink, it, &it.graph.top, it.reference.clone(), ops).await?;
    Ok((pushed + p, skipped + s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;
    use serde_json::json;

    fn image(store: &MemoryStore, repo: &str, arch: &str, layer: &[u8]) -> RawManifest {
        let config = store.add_blob(
            repo,
            "application/vnd.oci.image.config.v1+json",
            serde_json::to_vec(&json!({"os": "linux", "architecture": arch})).unwrap(),
        );
        let base = store.add_blob(
            repo,
            "application/vnd.oci.image.layer.v1.tar",
            b"base".to_vec(),
        );
        let top = store.add_blob(
            repo,
            "application/vnd.oci.image.layer.v1.tar",
            layer.to_vec(),
        );
        let m = RawManifest::new(
            serde_json::to_vec(
                &json!({"schemaVersion": 2, "mediaType": media::OCI_MANIFEST,
                "config": config, "layers": [base, top]}),
            )
            .unwrap(),
            media::OCI_MANIFEST,
        );
        store.add_manifest(repo, None, m.clone());
        m
    }

    /// A multi-arch index with an attestation, tagged `v1` in `repo`.
    fn index(store: &MemoryStore, repo: &str) -> RawManifest {
        let amd = image(store, repo, "amd64", format!("{repo}-amd64").as_bytes());
        let arm = image(store, repo, "arm64", format!("{repo}-arm64").as_bytes());
        let att_layer = store.add_blob(repo, "application/vnd.in-toto+json", b"{}".to_vec());
        let att_cfg = store.add_blob(
            repo,
            "application/vnd.oci.image.config.v1+json",
            b"{}".to_vec(),
        );
        let att = RawManifest::new(
            serde_json::to_vec(
                &json!({"schemaVersion": 2, "mediaType": media::OCI_MANIFEST,
                "config": att_cfg, "layers": [att_layer]}),
            )
            .unwrap(),
            media::OCI_MANIFEST,
        );
        store.add_manifest(repo, None, att.clone());
        let entry = |m: &RawManifest, os: &str, arch: &str| {
            json!({"mediaType": media::OCI_MANIFEST, "digest": m.digest, "size": m.bytes.len(),
                   "platform": {"os": os, "architecture": arch}})
        };
        let mut att_entry = entry(&att, "unknown", "unknown");
        att_entry["annotations"] = json!({"vnd.docker.reference.digest": amd.digest,
                                          "vnd.docker.reference.type": "attestation-manifest"});
        let idx = RawManifest::new(
            serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX,
                "manifests": [entry(&amd, "linux", "amd64"), entry(&arm, "linux", "arm64"), att_entry]}))
            .unwrap(),
            media::OCI_INDEX,
        );
        store.add_manifest(repo, Some("v1"), idx.clone());
        idx
    }

    fn opts(omitted: &BTreeSet<Digest>) -> Options<'_> {
        Options {
            jobs: 3,
            omitted,
            omitted_policy: Omitted::Require,
            dry_run: false,
            on_bytes: std::sync::Arc::new(|_| {}),
        }
    }

    fn tag(t: &str) -> Reference {
        Reference::Tag(t.into())
    }

    #[tokio::test]
    async fn copies_children_first_each_blob_once_mounting_across_repositories() {
        let src = MemoryStore::new("src");
        let a = index(&src, "a");
        let b = index(&src, "b");
        let ga = resolve(&src, "a", &tag("v1"), None, &Budget::default())
            .await
            .unwrap();
        let gb = resolve(&src, "b", &tag("v1"), None, &Budget::default())
            .await
            .unwrap();
        assert_eq!(ga.platforms, ["linux/amd64", "linux/arm64"]);
        assert_eq!(ga.attestations, 1);
        assert_eq!(ga.children.len(), 3);
        // 2 configs + base + 2 layers + the attestation's config and layer (both `{}`: one).
        assert_eq!(ga.blobs.len(), 6);
        let sink = MemoryStore::new("sink");
        let none = BTreeSet::new();
        let items = [
            Item {
                graph: &ga,
                repo: "p/a".into(),
                reference: tag("v1"),
            },
            Item {
                graph: &gb,
                repo: "p/b".into(),
                reference: tag("v1"),
            },
        ];
        let s = transfer(&src, &sink, &items, &opts(&none)).await.unwrap();
        assert_eq!(sink.tag("p/a", "v1"), Some(a.digest.clone()));
        assert_eq!(sink.tag("p/b", "v1"), Some(b.digest.clone()));
        // Each distinct blob uploaded once; `base` and the attestation's `{}` blobs mounted.
        let uploads = sink.log().iter().filter(|l| l.0 == "put_blob").count();
        assert_eq!(uploads, s.uploaded);
        assert!(s.mounted >= 2, "{s:?}");
        assert_eq!(s.manifests_pushed, 8);
        // Again: every graph is there, nothing is checked blob by blob.
        let counted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let c = counted.clone();
        let counting = Options {
            on_bytes: std::sync::Arc::new(move |n| {
                c.fetch_add(n, std::sync::atomic::Ordering::SeqCst);
            }),
            ..opts(&none)
        };
        let again = transfer(&src, &sink, &items, &counting).await.unwrap();
        assert_eq!(
            (again.graphs_present, again.uploaded, again.manifests_pushed),
            (2, 0, 0)
        );
        // Issue 21: each blob counted once, not once per repository that uses it, in the
        // counts and on the progress (which overran its total).
        let t = totals([&ga, &gb], &BTreeSet::new()).unwrap();
        assert_eq!(again.blobs, t.blobs.len());
        assert_eq!(
            (again.skipped, again.skipped_bytes),
            (t.blobs.len(), t.bytes)
        );
        assert_eq!(again.blob_bytes, t.bytes);
        assert_eq!(again.pairs.blobs, ga.blobs.len() + gb.blobs.len());
        assert!(again.pairs.blobs > again.blobs, "{again:?}");
        assert_eq!(counted.load(std::sync::atomic::Ordering::SeqCst), t.bytes);
        // The first copy: every blob uploaded once, the same unique count.
        assert_eq!(
            (s.blobs, s.uploaded, s.skipped),
            (t.blobs.len(), t.blobs.len(), 0)
        );
    }

    #[tokio::test]
    async fn without_mounts_blobs_are_uploaded_and_a_platform_filter_rewrites_the_index() {
        let src = MemoryStore::new("src");
        let up = index(&src, "a");
        let g = resolve(
            &src,
            "a",
            &tag("v1"),
            Some(&["linux/amd64".to_string()]),
            &Budget::default(),
        )
        .await
        .unwrap();
        assert_eq!(g.upstream.digest, up.digest);
        assert_ne!(g.top.digest, up.digest, "a new index");
        assert_eq!(
            (g.platforms.len(), g.dropped.len(), g.attestations),
            (1, 1, 1)
        );
        assert_eq!(g.children.len(), 2, "amd64 and its attestation");
        let e = resolve(
            &src,
            "a",
            &tag("v1"),
            Some(&["linux/s390x".to_string()]),
            &Budget::default(),
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("linux/amd64, linux/arm64"), "{e}");

        let mut sink = MemoryStore::new("sink");
        sink.mounts = false;
        let none = BTreeSet::new();
        let items = [Item {
            graph: &g,
            repo: "x".into(),
            reference: tag("v1"),
        }];
        transfer(&src, &sink, &items, &opts(&none)).await.unwrap();
        assert_eq!(sink.tag("x", "v1"), Some(g.top.digest.clone()));
    }

    #[tokio::test]
    async fn left_out_blobs_must_be_in_the_sink_before_anything_is_written() {
        let src = MemoryStore::new("src");
        index(&src, "a");
        let g = resolve(&src, "a", &tag("v1"), None, &Budget::default())
            .await
            .unwrap();
        let omitted: BTreeSet<Digest> = [g.blobs[1].digest.clone()].into();
        src.remove_blob(&g.blobs[1].digest);
        let sink = MemoryStore::new("sink");
        let items = [Item {
            graph: &g,
            repo: "a".into(),
            reference: tag("v1"),
        }];
        let e = transfer(&src, &sink, &items, &opts(&omitted))
            .await
            .unwrap_err();
        assert!(matches!(e, WalkError::MissingOnSite { .. }), "{e}");
        assert!(sink.log().is_empty(), "nothing written: {:?}", sink.log());
        // Once the sink holds it, the rest is copied.
        sink.add_blob("a", &g.blobs[1].media_type, b"base".to_vec());
        let s = transfer(&src, &sink, &items, &opts(&omitted))
            .await
            .unwrap();
        assert_eq!(s.required_present, 1);
        assert_eq!(sink.tag("a", "v1"), Some(g.top.digest.clone()));
    }

    #[tokio::test]
    async fn nested_indexes_are_walked_and_a_dry_run_writes_nothing() {
        let src = MemoryStore::new("src");
        let inner = index(&src, "a");
        let outer = RawManifest::new(
            serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX,
                "manifests": [{"mediaType": media::OCI_INDEX, "digest": inner.digest,
                               "size": inner.bytes.len()}]}))
            .unwrap(),
            media::OCI_INDEX,
        );
        src.add_manifest("a", Some("outer"), outer.clone());
        let g = resolve(&src, "a", &tag("outer"), None, &Budget::default())
            .await
            .unwrap();
        assert_eq!(
            g.children.len(),
            4,
            "the inner index and its three manifests"
        );
        assert_eq!(
            g.children.last().unwrap().digest,
            inner.digest,
            "children first"
        );
        let sink = MemoryStore::new("sink");
        let none = BTreeSet::new();
        let items = [Item {
            graph: &g,
            repo: "a".into(),
            reference: tag("outer"),
        }];
        let mut o = opts(&none);
        o.dry_run = true;
        let s = transfer(&src, &sink, &items, &o).await.unwrap();
        assert!(sink.log().is_empty());
        assert_eq!(s.manifests_pushed, 5);
        o.dry_run = false;
        transfer(&src, &sink, &items, &o).await.unwrap();
        assert_eq!(sink.tag("a", "outer"), Some(outer.digest));
    }

    #[tokio::test]
    async fn a_blob_that_does_not_match_its_descriptor_is_refused() {
        let src = MemoryStore::new("src");
        let m = image(&src, "a", "amd64", b"layer");
        src.add_manifest("a", Some("v1"), m);
        let g = resolve(&src, "a", &tag("v1"), None, &Budget::default())
            .await
            .unwrap();
        assert_eq!(g.platforms, ["linux/amd64"], "from the config");
        // The source serves other bytes for a layer than its descriptor says.
        let mut bad = g.clone();
        bad.blobs[2].digest = Digest::of(b"something else");
        let sink = MemoryStore::new("sink");
        src.add_blob("a", "x", b"something else".to_vec());
        let none = BTreeSet::new();
        let items = [Item {
            graph: &bad,
            repo: "a".into(),
            reference: tag("v1"),
        }];
        let e = transfer(&src, &sink, &items, &opts(&none))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("bytes but"), "{e}");
    }

    /// An index in `repo` of `n` distinct single-layer images, tagged `tag`.
    fn wide_index(store: &MemoryStore, repo: &str, tag: &str, n: usize) -> RawManifest {
        let layer = store.add_blob(
            repo,
            "application/vnd.oci.image.layer.v1.tar",
            b"l".to_vec(),
        );
        let kids: Vec<serde_json::Value> = (0..n)
            .map(|i| {
                let cfg = store.add_blob(
                    repo,
                    "application/vnd.oci.image.config.v1+json",
                    format!("{{\"i\":{i}}}").into_bytes(),
                );
                let m = RawManifest::new(
                    serde_json::to_vec(
                        &json!({"schemaVersion": 2, "mediaType": media::OCI_MANIFEST,
                        "config": cfg, "layers": [layer]}),
                    )
                    .unwrap(),
                    media::OCI_MANIFEST,
                );
                store.add_manifest(repo, None, m.clone());
                json!({"mediaType": media::OCI_MANIFEST, "digest": m.digest, "size": m.bytes.len(),
                       "platform": {"os": "linux", "architecture": "amd64"}})
            })
            .collect();
        let idx = RawManifest::new(
            serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX,
                "manifests": kids}))
            .unwrap(),
            media::OCI_INDEX,
        );
        store.add_manifest(repo, Some(tag), idx.clone());
        idx
    }

    /// A reference that is not there is [`WalkError::NotFound`]; a manifest that is there but
    /// names a child the store lacks is the store's not-found ([`WalkError::Store`]): "not
    /// there" and "broken" are told apart by the walk itself, without a second read.
    #[tokio::test]
    async fn a_missing_reference_is_not_a_missing_child() {
        let src = MemoryStore::new("src");
        let budget = Budget::default();
        let e = resolve(&src, "a", &tag("none"), None, &budget)
            .await
            .unwrap_err();
        assert!(
            matches!(e, WalkError::NotFound(ref s) if s.is_not_found()),
            "{e}"
        );
        let absent = image(&MemoryStore::new("other"), "a", "amd64", b"x");
        let m = RawManifest::new(
            serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX,
                "manifests": [absent.descriptor()]}))
            .unwrap(),
            media::OCI_INDEX,
        );
        src.add_manifest("a", Some("broken"), m);
        let e = resolve(&src, "a", &tag("broken"), None, &budget)
            .await
            .unwrap_err();
        assert!(
            matches!(e, WalkError::Store(ref s) if s.is_not_found()),
            "{e}"
        );
        assert!(e.to_string().contains(absent.digest.as_str()), "{e}");
    }

    #[tokio::test]
    async fn an_index_wider_than_the_bound_is_refused_before_its_children_are_read() {
        let src = MemoryStore::new("src");
        wide_index(&src, "a", "ok", MAX_CHILDREN);
        wide_index(&src, "a", "wide", MAX_CHILDREN + 1);
        let budget = Budget::default();
        let g = resolve(&src, "a", &tag("ok"), None, &budget).await.unwrap();
        assert_eq!(g.children.len(), MAX_CHILDREN);
        let e = resolve(&src, "a", &tag("wide"), None, &budget)
            .await
            .unwrap_err();
        assert!(matches!(e, WalkError::Bound { .. }), "{e}");
        assert!(e.to_string().contains("257 manifests"), "{e}");
        // The refused walk gave back what it took: only the first graph counts.
        assert_eq!(budget.manifests.load(Ordering::SeqCst), MAX_CHILDREN + 1);
    }

    #[tokio::test]
    async fn the_bundle_wide_bounds_hold_across_graphs() {
        let src = MemoryStore::new("src");
        for r in 0..4 {
            wide_index(&src, &format!("r{r}"), "v1", 250);
        }
        let budget = Budget::default();
        for r in 0..3 {
            resolve(&src, &format!("r{r}"), &tag("v1"), None, &budget)
                .await
                .unwrap();
        }
        // 3 × 251 manifests taken; the fourth graph passes 1000.
        let e = resolve(&src, "r3", &tag("v1"), None, &budget)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("1000 manifests"), "{e}");
        // A fresh budget: each graph alone is fine.
        resolve(&src, "r3", &tag("v1"), None, &Budget::default())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn nesting_beyond_the_bound_and_two_sizes_for_one_digest_are_refused() {
        let src = MemoryStore::new("src");
        let mut top = index(&src, "a");
        let wrap = |m: &RawManifest| {
            RawManifest::new(
                serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX,
                    "manifests": [{"mediaType": media::OCI_INDEX, "digest": m.digest,
                                   "size": m.bytes.len()}]}))
                .unwrap(),
                media::OCI_INDEX,
            )
        };
        for depth in 1..=MAX_DEPTH {
            top = wrap(&top);
            src.add_manifest("a", Some(&format!("d{depth}")), top.clone());
        }
        // The top index and MAX_DEPTH - 1 indexes under it, then the multi-arch one: refused.
        resolve(
            &src,
            "a",
            &tag(&format!("d{}", MAX_DEPTH - 1)),
            None,
            &Budget::default(),
        )
        .await
        .unwrap();
        let e = resolve(
            &src,
            "a",
            &tag(&format!("d{MAX_DEPTH}")),
            None,
            &Budget::default(),
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("nested deeper than 4"), "{e}");

        // One layer, declared with two sizes by two images.
        let m = image(&src, "b", "amd64", b"layer");
        src.add_manifest("b", Some("v1"), m);
        let g1 = resolve(&src, "b", &tag("v1"), None, &Budget::default())
            .await
            .unwrap();
        let mut g2 = g1.clone();
        g2.reference = tag("v2");
        g2.blobs[2].size += 1;
        let e = totals([&g1, &g2], &BTreeSet::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains(&g1.blobs[2].digest.to_string()), "{e}");
        assert!(e.contains("b:v1") && e.contains("b:v2"), "{e}");
        assert!(e.contains("as 5 bytes") && e.contains("as 6 bytes"), "{e}");
        // Sizes that would wrap u64 are refused, not added up.
        let mut g3 = g1.clone();
        g3.blobs[1].size = size::MAX_SIZE;
        g3.blobs[2].size = size::MAX_SIZE;
        let e = totals([&g3], &BTreeSet::new()).unwrap_err().to_string();
        assert!(e.contains("2^63 - 1"), "{e}");
        let t = totals([&g1], &BTreeSet::new()).unwrap();
        assert_eq!(t.bytes, g1.blobs.iter().map(|b| b.size).sum::<u64>());
        let largest = g1.blobs.iter().map(|b| b.size).max();
        assert_eq!(t.largest.map(|l| l.1), largest);
    }
}
