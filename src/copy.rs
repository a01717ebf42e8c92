//! The graph walk: resolve each image (index → manifests → blobs) from the first source that
//! has it, filter platforms, then fetch every unique blob once, with bounded concurrency, into
//! the content-addressed cache. Manifests are kept as the exact bytes the registry served unless
//! a platform filter forces a new index (whose new digest is then recorded next to the upstream
//! one).

pub mod walk;

use crate::oci::{media, Digest, ImageRef, Manifest, ManifestError};
use crate::progress::Progress;
use crate::store::{registry::Fetched, BlobCache, CacheError, Mount, Registry, RegistryError};
use futures_util::StreamExt;
use std::collections::BTreeMap;

/// A failure of the copy engine.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// No source had the image.
    #[error("no source has {image}:\n  {}", attempts.join("\n  "))]
    AllSourcesFailed {
        /// The chart's image reference.
        image: String,
        /// Each source tried, with why it failed.
        attempts: Vec<String>,
    },
    /// A registry failure.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// A manifest that cannot be walked.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The cache failed.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// An incremental bundle's left-out blobs are not in the target registry.
    #[error("this incremental bundle needs blobs the target registry does not hold ({} missing: {}): load the bundle it builds on first", missing.len(), missing.join(", "))]
    MissingOnSite {
        /// `digest (size bytes, for repo)` of each.
        missing: Vec<String>,
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
}

/// One image, resolved: which source served it and every manifest and blob it needs.
#[derive(Debug, Clone)]
pub struct ResolvedImage {
    /// Where it came from.
    pub source_ref: ImageRef,
    /// Label of the source (`ghcr`, `aliyun`, `127.0.0.1:5000`).
    pub source: String,
    /// Digest of the top manifest as the registry served it.
    pub upstream_digest: Digest,
    /// Digest of the top manifest kept in the bundle (differs only under a platform filter).
    pub digest: Digest,
    /// Media type of the top manifest.
    pub media_type: String,
    /// Size of the top manifest.
    pub size: u64,
    /// Platforms kept (`linux/amd64`), attestation entries excluded.
    pub platforms: Vec<String>,
    /// Platforms dropped by the filter.
    pub dropped: Vec<String>,
    /// Attestation (`unknown/unknown`) entries kept.
    pub attestations: usize,
    /// Every manifest (top first) as raw bytes.
    pub manifests: Vec<(Digest, bytes::Bytes)>,
    /// Every blob (config and layers) with its size.
    pub blobs: Vec<(Digest, u64)>,
    /// Sources tried before the one that served it.
    pub fallbacks: Vec<String>,
}

impl ResolvedImage {
    /// Bytes of all manifests and blobs.
    pub fn total_size(&self) -> u64 {
        self.manifests
            .iter()
            .map(|(_, b)| b.len() as u64)
            .sum::<u64>()
            + self.blobs.iter().map(|(_, s)| s).sum::<u64>()
    }
}

/// Resolve one image from the first candidate source that has it.
pub async fn resolve_image(
    reg: &Registry,
    cache: &BlobCache,
    image: &str,
    candidates: &[(String, ImageRef)],
    platforms: Option<&[String]>,
) -> Result<ResolvedImage, CopyError> {
    let mut attempts = Vec::new();
    for (label, r) in candidates {
        match reg.get_manifest(r).await {
            Ok((bytes, digest)) => {
                let mut img = walk(reg, cache, image, label, r, bytes, digest, platforms).await?;
                img.fallbacks = attempts;
                return Ok(img);
            }
            Err(e) => attempts.push(format!("{label} ({r}): {e}")),
        }
    }
    Err(CopyError::AllSourcesFailed {
        image: image.to_string(),
        attempts,
    })
}

#[allow(clippy::too_many_arguments)]
async fn walk(
    reg: &Registry,
    cache: &BlobCache,
    image: &str,
    label: &str,
    r: &ImageRef,
    bytes: bytes::Bytes,
    digest: Digest,
    platforms: Option<&[String]>,
) -> Result<ResolvedImage, CopyError> {
    let top = Manifest::parse(&bytes, None)?;
    let mut img = ResolvedImage {
        source_ref: r.clone(),
        source: label.to_string(),
        upstream_digest: digest.clone(),
        digest: digest.clone(),
        media_type: top.media_type().to_string(),
        size: bytes.len() as u64,
        platforms: vec![],
        dropped: vec![],
        attestations: 0,
        manifests: vec![],
        blobs: vec![],
        fallbacks: vec![],
    };
    match &top {
        Manifest::Index { manifests, .. } => {
            let wanted = |p: &Option<crate::oci::Platform>| match (platforms, p) {
                (None, _) => true,
                (Some(f), Some(p)) => f.iter().any(|f| p.matches(f)),
                (Some(_), None) => false,
            };
            let mut kept: Vec<usize> = (0..manifests.len())
                .filter(|&i| {
                    manifests[i]
                        .platform
                        .as_ref()
                        .is_none_or(|p| !p.is_unknown())
                        && wanted(&manifests[i].platform)
                })
                .collect();
            let kept_digests: Vec<&str> =
                kept.iter().map(|&i| manifests[i].digest.as_str()).collect();
            // Attestations stay with the manifest they describe.
            let att: Vec<usize> = (0..manifests.len())
                .filter(|&i| {
                    manifests[i]
                        .platform
                        .as_ref()
                        .is_some_and(|p| p.is_unknown())
                })
                .filter(|&i| {
                    platforms.is_none()
                        || manifests[i]
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get("vnd.docker.reference.digest"))
                            .is_some_and(|d| kept_digests.contains(&d.as_str()))
                })
                .collect();
            if kept.is_empty() {
                let available: Vec<String> = manifests
                    .iter()
                    .filter_map(|m| m.platform.as_ref())
                    .filter(|p| !p.is_unknown())
                    .map(|p| p.to_string())
                    .collect();
                return Err(CopyError::Platform {
                    image: image.to_string(),
                    wanted: platforms.map(|p| p.join(",")).unwrap_or_default(),
                    available: available.join(", "),
                });
            }
            img.attestations = att.len();
            kept.extend(att);
            kept.sort_unstable();
            for (i, m) in manifests.iter().enumerate() {
                let name = m
                    .platform
                    .as_ref()
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "unknown".into());
                if kept.contains(&i) {
                    if m.platform.as_ref().is_none_or(|p| !p.is_unknown()) {
                        img.platforms.push(name);
                    }
                } else {
                    img.dropped.push(name);
                }
            }
            let top_bytes = if kept.len() == manifests.len() {
                bytes.clone()
            } else {
                // A new index holding only the kept entries, every other field as served.
                let mut doc: serde_json::Value =
                    serde_json::from_slice(&bytes).map_err(|e| ManifestError::Invalid {
                        digest: digest.clone(),
                        reason: e.to_string(),
                    })?;
                if let Some(arr) = doc.get_mut("manifests").and_then(|m| m.as_array_mut()) {
                    let all = std::mem::take(arr);
                    *arr = all
                        .into_iter()
                        .enumerate()
                        .filter(|(i, _)| kept.contains(i))
                        .map(|(_, v)| v)
                        .collect();
                }
                bytes::Bytes::from(serde_json::to_vec(&doc).map_err(|e| {
                    ManifestError::Invalid {
                        digest: digest.clone(),
                        reason: e.to_string(),
                    }
                })?)
            };
            img.digest = Digest::of(&top_bytes);
            img.size = top_bytes.len() as u64;
            img.manifests.push((img.digest.clone(), top_bytes));
            for &i in &kept {
                let child = &manifests[i];
                let cref = r.with_reference(child.digest.as_str());
                let (cbytes, cdigest) = reg.get_manifest(&cref).await?;
                if cbytes.len() as u64 != child.size {
                    return Err(RegistryError::Status {
                        registry: r.registry.clone(),
                        what: cref.to_string(),
                        message: format!(
                            "manifest is {} bytes, the index says {}",
                            cbytes.len(),
                            child.size
                        ),
                    }
                    .into());
                }
                let cm = Manifest::parse(&cbytes, Some(&child.media_type))?;
                if let Manifest::Index { .. } = cm {
                    return Err(ManifestError::Invalid {
                        digest: cdigest,
                        reason: "nested index is not supported".into(),
                    }
                    .into());
                }
                img.blobs
                    .extend(cm.blobs().into_iter().map(|d| (d.digest.clone(), d.size)));
                img.manifests.push((cdigest, cbytes));
            }
        }
        Manifest::Image { config, .. } => {
            img.manifests.push((digest.clone(), bytes.clone()));
            img.blobs
                .extend(top.blobs().into_iter().map(|d| (d.digest.clone(), d.size)));
            // A single-platform image: its platform is in the config.
            if config.size <= 1024 * 1024 && !media::is_index(&config.media_type) {
                reg.fetch_blob(r, &config.digest, config.size, cache, &|_| {})
                    .await?;
                let cfg = cache.read_small(&config.digest, config.size)?;
                let v: serde_json::Value = serde_json::from_slice(&cfg).unwrap_or_default();
                if let (Some(os), Some(arch)) = (
                    v.get("os").and_then(|s| s.as_str()),
                    v.get("architecture").and_then(|s| s.as_str()),
                ) {
                    let p = crate::oci::Platform {
                        architecture: arch.into(),
                        os: os.into(),
                        variant: v.get("variant").and_then(|s| s.as_str()).map(String::from),
                        os_version: None,
                    };
                    if let Some(f) = platforms {
                        if !f.iter().any(|f| p.matches(f)) {
                            return Err(CopyError::Platform {
                                image: image.to_string(),
                                wanted: f.join(","),
                                available: p.to_string(),
                            });
                        }
                    }
                    img.platforms.push(p.to_string());
                }
            }
        }
    }
    Ok(img)
}

/// Totals of a fetch.
#[derive(Debug, Default, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FetchStats {
    /// Blobs whose digest was checked in this run (downloaded, or manifests held in memory):
    /// the pack need not hash them again.
    #[serde(skip)]
    pub verified: std::collections::BTreeSet<Digest>,
    /// Unique blobs.
    pub blobs: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Blobs found complete in the cache.
    pub cached_blobs: usize,
    /// Bytes found in the cache (complete blobs and resumed prefixes).
    pub cached_bytes: u64,
    /// Bytes downloaded.
    pub downloaded_bytes: u64,
}

/// Store every manifest in the cache and fetch every unique blob once, `jobs` at a time,
/// except those in `skip` (blobs an incremental bundle leaves out).
pub async fn fetch_all(
    reg: &Registry,
    cache: &BlobCache,
    images: &[ResolvedImage],
    skip: &std::collections::BTreeSet<Digest>,
    jobs: usize,
    progress: &Progress,
) -> Result<FetchStats, CopyError> {
    let mut unique: BTreeMap<Digest, (u64, ImageRef)> = BTreeMap::new();
    let mut verified = std::collections::BTreeSet::new();
    for img in images {
        for (d, b) in &img.manifests {
            cache.put_bytes(d, b)?;
            verified.insert(d.clone());
        }
        for (d, s) in img.blobs.iter().filter(|(d, _)| !skip.contains(d)) {
            unique
                .entry(d.clone())
                .or_insert_with(|| (*s, img.source_ref.clone()));
        }
    }
    let mut stats = FetchStats {
        blobs: unique.len(),
        bytes: unique.values().map(|(s, _)| s).sum(),
        ..Default::default()
    };
    let bar = progress.bytes("fetching blobs", stats.bytes);
    stats.verified = verified;
    let results: Vec<Result<(Digest, u64, Fetched), CopyError>> =
        futures_util::stream::iter(unique.iter())
            .map(|(d, (size, r))| {
                let bar = bar.clone();
                async move {
                    let f = reg.fetch_blob(r, d, *size, cache, &|n| bar.inc(n)).await?;
                    Ok((d.clone(), *size, f))
                }
            })
            .buffer_unordered(jobs.max(1))
            .collect()
            .await;
    for r in results {
        match r? {
            (_, size, Fetched::Cached) => {
                stats.cached_blobs += 1;
                stats.cached_bytes += size;
            }
            (d, size, Fetched::Downloaded(n)) => {
                stats.downloaded_bytes += n;
                stats.cached_bytes += size - n.min(size);
                stats.verified.insert(d);
            }
        }
    }
    bar.finish(&format!(
        "{} blobs, {} downloaded, {} reused from cache",
        stats.blobs,
        human_bytes(stats.downloaded_bytes),
        human_bytes(stats.cached_bytes)
    ));
    Ok(stats)
}

/// `12.3 MiB`.
pub fn human_bytes(n: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// Where a bundle is pushed: `REGISTRY[/PREFIX]`.
#[derive(Debug, Clone)]
pub struct Target {
    /// Registry host\[:port\].
    pub registry: String,
    /// Path prefix (may be empty).
    pub prefix: String,
}

/// A `--registry` value that is not `HOST[:PORT][/PREFIX]`.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// `user:password@host`: refused, and never echoed.
    #[error("--registry {redacted}: a registry address must not carry a user or password (it would be echoed in messages and kept in shell history and process lists): give HOST[:PORT][/PREFIX] and pass the login with --username U --password-stdin (or `docker login HOST`)")]
    Userinfo {
        /// The value with its user and password replaced.
        redacted: String,
    },
    /// `https://host`: no scheme wanted.
    #[error("--registry {value}: give HOST[:PORT][/PREFIX] without a scheme (HTTPS is the default; --plain-http for plain HTTP)")]
    Scheme {
        /// The value.
        value: String,
    },
    /// Not a registry address.
    #[error(transparent)]
    Ref(#[from] crate::oci::RefError),
}

impl Target {
    /// Parse `HOST[:PORT][/PREFIX]`. A user or password in it is refused without being echoed.
    pub fn parse(s: &str) -> Result<Self, TargetError> {
        let (scheme, rest) = match s.split_once("://") {
            Some((sch, rest)) => (Some(sch), rest),
            None => (None, s),
        };
        // No registry address or prefix holds an `@`: whatever stands before the last one may
        // be a password (with `/` or `@` in it), so none of it is shown.
        if let Some(at) = rest.rfind('@') {
            let after = &rest[at + 1..];
            return Err(TargetError::Userinfo {
                redacted: format!(
                    "{}USER:PASSWORD@{after}",
                    scheme.map(|x| format!("{x}://")).unwrap_or_default()
                ),
            });
        }
        if scheme.is_some() {
            return Err(TargetError::Scheme {
                value: s.to_string(),
            });
        }
        let s = s.trim_end_matches('/');
        let (registry, prefix) = match s.split_once('/') {
            Some((r, p)) => (r.to_string(), p.to_string()),
            None => (s.to_string(), String::new()),
        };
        // Validate by parsing a reference under it.
        ImageRef::parse(&format!(
            "{registry}/{}x:t",
            if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            }
        ))?;
        if !(registry.contains('.') || registry.contains(':') || registry == "localhost") {
            return Err(crate::oci::RefError { reference: s.to_string(), reason: "the registry must be a host name with a dot or a port (e.g. registry.internal or 10.0.0.5:5000)" }.into());
        }
        Ok(Target { registry, prefix })
    }
    /// `REGISTRY[/PREFIX]`, the chart's new `imageRepositoryHost`.
    pub fn host_and_prefix(&self) -> String {
        if self.prefix.is_empty() {
            self.registry.clone()
        } else {
            format!("{}/{}", self.registry, self.prefix)
        }
    }
    /// The reference of `repository:tag` under this target.
    pub fn image(&self, repository: &str, tag: &str) -> Result<ImageRef, crate::oci::RefError> {
        ImageRef::parse(&format!("{}/{repository}:{tag}", self.host_and_prefix()))
    }
}

/// One manifest graph to push: a repository, a tag, and what the tag points to.
#[derive(Debug, Clone)]
pub struct PushItem {
    /// Target reference (with tag).
    pub target: ImageRef,
    /// Top manifest digest.
    pub digest: Digest,
    /// Top manifest media type.
    pub media_type: String,
}

/// What a push did (or, in a dry run, would do).
#[derive(Debug, Default, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PushStats {
    /// (repository, blob) pairs considered.
    pub blobs: usize,
    /// Blobs uploaded.
    pub uploaded: usize,
    /// Bytes uploaded.
    pub uploaded_bytes: u64,
    /// Blobs mounted from another repository of the registry.
    pub mounted: usize,
    /// Blobs already present.
    pub skipped: usize,
    /// Bytes already present.
    pub skipped_bytes: u64,
    /// Manifests put.
    pub manifests_pushed: usize,
    /// Manifests already present.
    pub manifests_skipped: usize,
    /// Tags pointed at their manifest (and read back).
    pub tags: Vec<String>,
    /// Blobs an incremental bundle left out, found in the registry.
    pub required_present: usize,
}

struct Graph {
    item: PushItem,
    /// Manifests children first (digest, media type).
    manifests: Vec<(Digest, String)>,
    blobs: Vec<(Digest, u64)>,
}

fn graph(item: &PushItem, small: &BTreeMap<Digest, Vec<u8>>) -> Result<Graph, CopyError> {
    let mut manifests = Vec::new();
    let mut blobs = Vec::new();
    let bytes = small
        .get(&item.digest)
        .ok_or_else(|| ManifestError::Invalid {
            digest: item.digest.clone(),
            reason: "not in the bundle".into(),
        })?;
    match Manifest::parse(bytes, Some(&item.media_type))? {
        Manifest::Index {
            manifests: children,
            ..
        } => {
            for c in children {
                let cb = small.get(&c.digest).ok_or_else(|| ManifestError::Invalid {
                    digest: c.digest.clone(),
                    reason: "not in the bundle".into(),
                })?;
                let m = Manifest::parse(cb, Some(&c.media_type))?;
                blobs.extend(m.blobs().into_iter().map(|d| (d.digest.clone(), d.size)));
                manifests.push((c.digest.clone(), m.media_type().to_string()));
            }
        }
        m @ Manifest::Image { .. } => {
            blobs.extend(m.blobs().into_iter().map(|d| (d.digest.clone(), d.size)))
        }
    }
    let top_type = Manifest::parse(bytes, Some(&item.media_type))?
        .media_type()
        .to_string();
    manifests.push((item.digest.clone(), top_type));
    blobs.sort();
    blobs.dedup();
    Ok(Graph {
        item: item.clone(),
        manifests,
        blobs,
    })
}

/// Push manifest graphs from a bundle read in place (blobs at `locations` in `bundle`), children
/// first: blobs already present are skipped (HEAD), blobs present in another repository of the
/// registry are mounted, the rest uploaded; every manifest is put as its exact bytes and every tag
/// is read back and its digest checked. With `dry_run`, nothing is written: the stats say what
/// would be.
#[allow(clippy::too_many_arguments)]
pub async fn push_bundle(
    reg: &Registry,
    bundle: &crate::bundle::parts::BundleFile,
    locations: &BTreeMap<Digest, (u64, u64)>,
    small: &BTreeMap<Digest, Vec<u8>>,
    items: &[PushItem],
    omitted: &std::collections::BTreeSet<Digest>,
    jobs: usize,
    dry_run: bool,
    progress: &Progress,
) -> Result<PushStats, CopyError> {
    let all: Vec<Graph> = items
        .iter()
        .map(|i| graph(i, small))
        .collect::<Result<_, _>>()?;
    // Phase 0: a tag that already points at the bundle's manifest means the whole graph is
    // there (the registry accepted that manifest only with everything it references): such
    // graphs need no blob checks. One GET per tag, in parallel.
    let tops: Vec<Result<bool, CopyError>> = futures_util::stream::iter(all.iter())
        .map(|g| async move {
            match reg.get_manifest(&g.item.target).await {
                Ok((_, got)) => Ok(got == g.item.digest),
                Err(e) if e.is_not_found() => Ok(false),
                Err(e) => Err(e.into()),
            }
        })
        .buffered(jobs.max(1))
        .collect()
        .await;
    let mut graphs = Vec::new();
    let mut done_already = PushStats::default();
    for (g, present) in all.into_iter().zip(tops) {
        if present? {
            done_already.blobs += g.blobs.len();
            done_already.skipped += g.blobs.len();
            done_already.skipped_bytes += g.blobs.iter().map(|(_, s)| s).sum::<u64>();
            done_already.manifests_skipped += g.manifests.len();
            done_already.tags.push(g.item.target.to_string());
        } else {
            graphs.push(g);
        }
    }
    let mut stats = PushStats::default();
    // Home repository of each blob: the first graph that uses it; for a blob an incremental
    // bundle left out, a repository of the target that already holds it (checked before
    // anything is pushed).
    let mut home: BTreeMap<Digest, (ImageRef, u64)> = BTreeMap::new();
    let mut missing = Vec::new();
    let mut required: BTreeMap<Digest, (u64, Vec<ImageRef>)> = BTreeMap::new();
    for g in &graphs {
        for (d, s) in g.blobs.iter().filter(|(d, _)| omitted.contains(d)) {
            required
                .entry(d.clone())
                .or_insert_with(|| (*s, vec![]))
                .1
                .push(g.item.target.clone());
        }
    }
    for (d, (size, repos)) in &required {
        let mut found = None;
        for r in repos {
            if reg.blob_exists(r, d).await? {
                found = Some(r.clone());
                break;
            }
        }
        match found {
            Some(r) => {
                home.insert(d.clone(), (r, *size));
            }
            None => missing.push(format!("{d} ({size} bytes, for {})", repos[0].repository)),
        }
    }
    if !missing.is_empty() {
        return Err(CopyError::MissingOnSite { missing });
    }
    stats.required_present = required.len();
    for g in &graphs {
        for (d, s) in &g.blobs {
            home.entry(d.clone())
                .or_insert_with(|| (g.item.target.clone(), *s));
        }
    }
    let total: u64 = home.values().map(|(_, s)| s).sum();
    let bar = progress.bytes(
        if dry_run {
            "checking registry"
        } else {
            "pushing blobs"
        },
        total,
    );
    let bar_arc = {
        let b = bar.clone();
        std::sync::Arc::new(move |n: u64| b.inc(n)) as std::sync::Arc<dyn Fn(u64) + Send + Sync>
    };
    #[derive(Clone, Copy)]
    enum Done {
        Present,
        Uploaded,
        Mounted,
    }
    // Phase 1: every unique blob into its home repository.
    let phase1: Vec<Result<(u64, Done), CopyError>> = futures_util::stream::iter(home.iter())
        .map(|(d, (r, size))| {
            let on = bar_arc.clone();
            async move {
                if reg.blob_exists(r, d).await? {
                    on(*size);
                    return Ok((*size, Done::Present));
                }
                if dry_run {
                    on(*size);
                    return Ok((*size, Done::Uploaded));
                }
                let (offset, len) = *locations.get(d).ok_or_else(|| ManifestError::Invalid {
                    digest: d.clone(),
                    reason: "blob missing from the bundle".into(),
                })?;
                reg.push_blob_from_file(r, d, &bundle.segments(offset, len), on)
                    .await?;
                Ok((*size, Done::Uploaded))
            }
        })
        .buffer_unordered(jobs.max(1))
        .collect()
        .await;
    let tally =
        |r: Result<(u64, Done), CopyError>, stats: &mut PushStats| -> Result<(), CopyError> {
            let (size, done) = r?;
            stats.blobs += 1;
            match done {
                Done::Present => {
                    stats.skipped += 1;
                    stats.skipped_bytes += size;
                }
                Done::Uploaded => {
                    stats.uploaded += 1;
                    stats.uploaded_bytes += size;
                }
                Done::Mounted => stats.mounted += 1,
            }
            Ok(())
        };
    for r in phase1 {
        tally(r, &mut stats)?;
    }
    // Phase 2: the same blobs in the other repositories that use them: mount, else upload.
    let mut others = Vec::new();
    for g in &graphs {
        for (d, s) in &g.blobs {
            let (h, _) = &home[d];
            if h.repository != g.item.target.repository {
                others.push((g.item.target.clone(), h.repository.clone(), d.clone(), *s));
            }
        }
    }
    others.sort_by(|a, b| (&a.0.repository, &a.2).cmp(&(&b.0.repository, &b.2)));
    others.dedup_by(|a, b| a.0.repository == b.0.repository && a.2 == b.2);
    let phase2: Vec<Result<(u64, Done), CopyError>> = futures_util::stream::iter(others.iter())
        .map(|(r, from, d, size)| {
            let on = bar_arc.clone();
            async move {
                if reg.blob_exists(r, d).await? {
                    return Ok((*size, Done::Present));
                }
                if dry_run {
                    return Ok((*size, Done::Mounted));
                }
                // A mount is an optimisation: refused (401/403) or not honoured (202, 404...),
                // the blob is uploaded instead.
                if reg.mount_blob(r, from, d).await? == Mount::Mounted
                    && reg.blob_exists(r, d).await?
                {
                    return Ok((*size, Done::Mounted));
                }
                let (offset, len) = *locations.get(d).ok_or_else(|| ManifestError::Invalid {
                    digest: d.clone(),
                    reason: "blob missing from the bundle".into(),
                })?;
                reg.push_blob_from_file(r, d, &bundle.segments(offset, len), on)
                    .await?;
                Ok((*size, Done::Uploaded))
            }
        })
        .buffer_unordered(jobs.max(1))
        .collect()
        .await;
    for r in phase2 {
        tally(r, &mut stats)?;
    }
    bar.finish(&format!(
        "{} uploaded ({}), {} mounted, {} already there ({})",
        stats.uploaded,
        human_bytes(stats.uploaded_bytes),
        stats.mounted,
        stats.skipped,
        human_bytes(stats.skipped_bytes)
    ));
    // Phase 3: manifests, children first, then the tag; read back.
    for g in &graphs {
        for (d, mt) in &g.manifests {
            let is_top = d == &g.item.digest;
            let by_digest = g.item.target.with_reference(d.as_str());
            let present = match reg
                .get_manifest(if is_top { &g.item.target } else { &by_digest })
                .await
            {
                Ok((_, got)) => &got == d,
                Err(e) if e.is_not_found() => false,
                Err(e) => return Err(e.into()),
            };
            if present {
                stats.manifests_skipped += 1;
                continue;
            }
            stats.manifests_pushed += 1;
            if dry_run {
                continue;
            }
            let bytes = bytes::Bytes::from(small[d].clone());
            let target = if is_top {
                g.item.target.clone()
            } else {
                by_digest
            };
            reg.put_manifest(&target, &bytes, mt).await?;
        }
        stats.tags.push(g.item.target.to_string());
    }
    stats.blobs += done_already.blobs;
    stats.skipped += done_already.skipped;
    stats.skipped_bytes += done_already.skipped_bytes;
    stats.manifests_skipped += done_already.manifests_skipped;
    stats.tags.extend(done_already.tags);
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_refuses_userinfo_without_echoing_it() {
        for v in [
            "user:s3cr3t@127.0.0.1:5000/site",
            "https://user:s3cr3t@127.0.0.1:5000/site",
            "user:s3/cr@3t@registry.example",
        ] {
            let e = Target::parse(v).unwrap_err().to_string();
            assert!(!e.contains("s3"), "{e}");
            assert!(e.contains("--password-stdin"), "{e}");
        }
        assert!(Target::parse("https://registry.example/site")
            .unwrap_err()
            .to_string()
            .contains("without a scheme"));
        let t = Target::parse("127.0.0.1:5000/site/").unwrap();
        assert_eq!(t.host_and_prefix(), "127.0.0.1:5000/site");
    }
}
