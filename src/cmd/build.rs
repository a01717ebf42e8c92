//! `koord-bundle build`: chart → images → bundle.

use crate::bundle::atomic::AtomicFile;
use crate::bundle::manifest::{
    BaseRecord, BlobTotals, ChartRecord, CrdRecord, ImageRecord, OciRecord, OmittedBlob, Overrides,
    Tool,
};
use crate::bundle::pack::{self, Compression};
use crate::bundle::writer::{self, check_room, BundleWriter, Plan};
use crate::bundle::{BundleManifest, FORMAT_VERSION, REF_NAME};
use crate::chart::{self, ChartArchive, ChartImage};
use crate::cli::BuildArgs;
use crate::copy::{self, Graph, Item};
use crate::helm::Helm;
use crate::oci::{media, Digest, ImageRef};
use crate::progress::{Mode, Progress};
use crate::sources::{Origin, SourceMap};
use crate::store::body::read_file_bounded;
use crate::store::http::HttpFetcher;
use crate::store::registry::RegistryStore;
use crate::store::{BlobCache, RawManifest, Reference, Registry, RegistryOptions};
use crate::text::human_bytes;
use anyhow::{bail, Context as _};
use futures_util::{StreamExt, TryStreamExt};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

/// The chart, fetched and checked.
struct FetchedChart {
    bytes: Vec<u8>,
    digest: Digest,
    url: Option<String>,
    index_digest: Option<String>,
    mismatch_allowed: bool,
}

async fn fetch_chart(
    args: &BuildArgs,
    http: &HttpFetcher,
    progress: &Progress,
) -> anyhow::Result<FetchedChart> {
    if let Some(file) = &args.chart {
        let bytes = read_file_bounded(file, chart::archive::MAX_UNCOMPRESSED as usize)
            .with_context(|| format!("cannot read chart archive {}", file.display()))?;
        let digest = Digest::of(&bytes);
        progress.say(format!("chart    {} ({digest})", file.display()));
        return Ok(FetchedChart {
            bytes,
            digest,
            url: None,
            index_digest: None,
            mismatch_allowed: false,
        });
    }
    let index_url = chart::index_url(&args.repo);
    let index_bytes = http.get(&index_url, crate::yaml::INDEX.max_bytes).await.context("cannot read the Helm repository index (use --repo URL, or --chart FILE with an archive downloaded by hand)")?;
    let index = chart::RepoIndex::parse_chart(&index_bytes, "koordinator")
        .with_context(|| index_url.clone())?;
    let spec = chart::VersionSpec::parse(&args.version)?;
    let entry = index.resolve("koordinator", &spec)?;
    let url_text = entry
        .urls
        .first()
        .with_context(|| format!("index entry koordinator {} has no urls", entry.version))?;
    let url = chart::resolve_chart_url(&args.repo, url_text);
    let bytes = http
        .get(&url, chart::archive::MAX_UNCOMPRESSED as usize)
        .await?;
    let digest = Digest::of(&bytes);
    let mut mismatch_allowed = false;
    if let Some(expected) = &entry.digest {
        let expected_norm = expected.trim().trim_start_matches("sha256:").to_lowercase();
        if expected_norm != digest.hex() {
            if !args.allow_chart_digest_mismatch {
                bail!(
                    "chart archive {url} has sha256 {}, but the repository index says {expected_norm}: refusing it.\n\
                     If you trust this archive (upstream's 1.7.0 and 1.8.0 index entries predate a moved tag), \
                     re-run with --allow-chart-digest-mismatch (recorded in the bundle), or pass --chart FILE",
                    digest.hex()
                );
            }
            progress.warn(format!("chart archive {url} does not match the index digest {expected_norm} (actual {}): going on as --allow-chart-digest-mismatch says; recorded in the bundle", digest.hex()));
            mismatch_allowed = true;
        }
    }
    progress.say(format!(
        "chart    koordinator {} from {url} ({digest})",
        entry.version
    ));
    Ok(FetchedChart {
        bytes,
        digest,
        url: Some(url),
        index_digest: entry.digest.clone(),
        mismatch_allowed,
    })
}

/// The images to bundle: what the chart deploys plus `--image`.
struct Wanted {
    ref_name: String,
    component: String,
    host: String,
    repository: String,
    tag: String,
    original: String,
    /// Fixed reference (`--image`): no source mapping.
    fixed: Option<ImageRef>,
}

fn wanted_images(images: &[ChartImage], extra: &[String]) -> anyhow::Result<Vec<Wanted>> {
    let mut v: Vec<Wanted> = images
        .iter()
        .map(|i| Wanted {
            ref_name: format!("{}:{}", i.repository, i.tag),
            component: i.component.clone(),
            host: i.host.clone(),
            repository: i.repository.clone(),
            tag: i.tag.clone(),
            original: i.reference(),
            fixed: None,
        })
        .collect();
    for e in extra {
        let r = ImageRef::parse(e)?;
        let tag = r.tag.clone().with_context(|| {
            format!("--image {e}: give a tag (the bundle names images by repository:tag)")
        })?;
        v.push(Wanted {
            ref_name: format!("{}:{tag}", r.repository),
            component: "manual".into(),
            host: r.registry.clone(),
            repository: r.repository.clone(),
            tag,
            original: e.clone(),
            fixed: Some(r),
        });
    }
    v.sort_by(|a, b| a.ref_name.cmp(&b.ref_name));
    v.dedup_by(|a, b| a.ref_name == b.ref_name);
    Ok(v)
}

/// The bundle `--since` names: (its manifest, the digest of its manifest bytes).
fn load_base(path: &std::path::Path) -> anyhow::Result<(BundleManifest, Digest)> {
    let bytes = match crate::bundle::reader::read_head(path) {
        Ok(head) => head.manifest,
        Err(_) => std::fs::read(path)
            .with_context(|| format!("--since {}: cannot read it", path.display()))?,
    };
    let m: BundleManifest = serde_json::from_slice(&bytes).with_context(|| {
        format!("--since {}: neither a bundle nor a bundle manifest (koord-bundle inspect BUNDLE --manifest FILE writes one)", path.display())
    })?;
    if m.blob_list.is_empty() {
        bail!(
            "--since {}: this manifest lists no blobs (written by an older koord-bundle?)",
            path.display()
        );
    }
    Ok((m, Digest::of(&bytes)))
}

/// What a build needs, resolved once from the flags and the environment before any I/O: an
/// error in any of them costs no download.
struct Settings {
    /// The helm that renders the chart (`--helm`, else on `PATH`; 3.8+).
    helm: Helm,
    sources: Vec<Origin>,
    /// The sources as given (or the default list), for the bundle manifest.
    recorded_sources: Vec<String>,
    platforms: Option<Vec<String>>,
    /// Parsed `--split` size.
    split: Option<u64>,
    signer: Option<(minisign::SecretKey, PathBuf)>,
    /// The bundle `--since` names, and the digest of its manifest.
    base: Option<(BundleManifest, Digest)>,
    /// Blobs a site that loaded the base holds.
    on_site: BTreeSet<Digest>,
    /// The blob cache (`None` with `--no-cache`).
    cache_root: Option<PathBuf>,
    /// Where the output goes (checked writable).
    output_dir: PathBuf,
}

impl Settings {
    fn resolve(args: &BuildArgs, map: &SourceMap) -> anyhow::Result<Settings> {
        let sources: Vec<Origin> = if args.sources.is_empty() {
            map.default_sources()
        } else {
            args.sources
                .iter()
                .map(|s| map.parse_source(s))
                .collect::<Result<_, _>>()?
        };
        let platforms = (!args.platform.is_empty()).then(|| args.platform.clone());
        for p in platforms.iter().flatten() {
            if p.split('/').count() < 2 {
                bail!("--platform {p}: expected OS/ARCH[/VARIANT], e.g. linux/amd64");
            }
        }
        let split = args
            .split
            .as_deref()
            .map(crate::bundle::parts::parse_size)
            .transpose()?;
        // helm renders the chart: without one, nothing is downloaded.
        let helm = Helm::find(
            args.helm.as_deref(),
            std::env::var_os(super::env::PATH).as_deref(),
            &crate::helm::FOR_BUILD,
        )
        .context(
            "build needs helm to find the images the chart deploys (nothing was downloaded)",
        )?;
        // The values files go to helm as they are; each is checked to be bounded YAML first,
        // so that a bad one is named before anything is downloaded.
        for f in &args.values {
            let limits = crate::yaml::VALUES_FILE;
            let text = read_file_bounded(f, limits.max_bytes)
                .with_context(|| format!("cannot read values file {}", f.display()))?;
            crate::yaml::check(&format!("values file {}", f.display()), &text, &limits)?;
        }
        let signer = if args.dry_run || args.unsigned {
            None
        } else {
            super::signing_key(args.sign_key.as_deref(), true)?
        };
        let base = args.since.as_deref().map(load_base).transpose()?;
        let on_site = base
            .as_ref()
            .map(|(m, _)| m.blobs_on_site())
            .unwrap_or_default();
        let cache_root = match (&args.cache, args.no_cache) {
            (_, true) => None,
            (Some(c), false) => Some(c.clone()),
            (None, false) => Some(super::cache_dir()?),
        };
        let output_dir = args
            .output
            .as_deref()
            .and_then(std::path::Path::parent)
            .filter(|p| !p.as_os_str().is_empty())
            .map(std::path::Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        if !args.dry_run {
            // The output directory must take a file before a single byte is downloaded.
            tempfile::Builder::new()
                .prefix(".koord-bundle-probe.")
                .tempfile_in(&output_dir)
                .with_context(|| {
                    format!(
                        "cannot write the bundle into {}: the directory must exist and be writable (nothing was downloaded)",
                        output_dir.display()
                    )
                })?;
        }
        Ok(Settings {
            helm,
            sources,
            recorded_sources: if args.sources.is_empty() {
                map.default.clone()
            } else {
                args.sources.clone()
            },
            platforms,
            split,
            signer,
            base,
            on_site,
            cache_root,
            output_dir,
        })
    }
}

/// One image, resolved: the graph and which source served it.
struct Resolved {
    graph: Graph,
    /// Label of the source (`ghcr`, `aliyun`, `127.0.0.1:5000`).
    source: String,
    source_ref: ImageRef,
    /// Sources tried before, with why they did not serve it.
    fallbacks: Vec<String>,
}

/// The candidate references of an image, in order of preference: (label, reference).
fn candidates(
    map: &SourceMap,
    sources: &[Origin],
    w: &Wanted,
) -> anyhow::Result<Vec<(String, ImageRef)>> {
    if let Some(r) = &w.fixed {
        return Ok(vec![(r.registry.clone(), r.clone())]);
    }
    let mut c: Vec<(String, ImageRef)> = Vec::new();
    for s in sources {
        let r = map.map(s, &w.host, &w.repository, &w.tag)?;
        if !c.iter().any(|(_, x)| x == &r) {
            c.push((map.label(s, &r, &w.repository), r));
        }
    }
    Ok(c)
}

/// Resolve an image from the first candidate that serves it. A source that does not have it,
/// refuses access or cannot be reached is passed over (and named in the record); a graph that
/// is found but cannot be used (platforms, a broken manifest) stops the build.
async fn resolve_image(
    store: &RegistryStore,
    w: &Wanted,
    candidates: &[(String, ImageRef)],
    platforms: Option<&[String]>,
    budget: &copy::Budget,
) -> anyhow::Result<Resolved> {
    let mut fallbacks = Vec::new();
    let mut unreachable = false;
    for (label, r) in candidates {
        let repo = format!("{}/{}", r.registry, r.repository);
        let reference = match (&r.digest, &r.tag) {
            (Some(d), _) => Reference::Digest(Digest::from_hex(d.trim_start_matches("sha256:"))?),
            (None, t) => Reference::Tag(t.clone().unwrap_or_else(|| "latest".into())),
        };
        match copy::resolve(store, &repo, &reference, platforms, budget).await {
            Ok(graph) => {
                return Ok(Resolved {
                    graph,
                    source: label.clone(),
                    source_ref: r.clone(),
                    fallbacks,
                })
            }
            Err(copy::WalkError::Store(e)) => {
                unreachable |= e.registry().is_some_and(|r| r.is_transient());
                fallbacks.push(format!("{label} ({r}): {e}"))
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(crate::sources::NoSourceError {
        image: w.original.clone(),
        tried: fallbacks,
        unreachable,
    }
    .into())
}

fn record(w: &Wanted, r: &Resolved) -> ImageRecord {
    let g = &r.graph;
    ImageRecord {
        ref_name: w.ref_name.clone(),
        component: w.component.clone(),
        repository: w.repository.clone(),
        tag: w.tag.clone(),
        original: w.original.clone(),
        source: r.source.clone(),
        source_ref: r.source_ref.to_string(),
        fallbacks: r.fallbacks.clone(),
        digest: g.top.digest.clone(),
        upstream_digest: g.upstream.digest.clone(),
        media_type: g.top.media_type.clone(),
        size: g.top.bytes.len() as u64,
        platforms: g.platforms.clone(),
        dropped_platforms: g.dropped.clone(),
        attestations: g.attestations,
        total_size: g.total_size(),
    }
}

/// Totals of the fetch into the cache.
#[derive(Debug, Default, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct FetchStats {
    /// Unique blobs.
    blobs: usize,
    /// Their bytes.
    bytes: u64,
    /// Blobs found complete in the cache.
    cached_blobs: usize,
    /// Bytes found in the cache (complete blobs and resumed prefixes).
    cached_bytes: u64,
    /// Bytes downloaded.
    downloaded_bytes: u64,
}

/// Every graph's blobs and manifests into the bundle writer (the one walk), each blob once,
/// from the registries or the cache; the blobs the site holds (`--since`) are left out.
async fn write_blobs(
    store: &RegistryStore,
    writer: &BundleWriter<'_>,
    graphs: &[&Graph],
    settings: &Settings,
    jobs: usize,
    progress: &Progress,
) -> anyhow::Result<FetchStats> {
    let totals = copy::totals(graphs.iter().copied(), &settings.on_site)?;
    let mut stats = FetchStats {
        blobs: totals.blobs.len(),
        bytes: totals.bytes,
        ..Default::default()
    };
    let bar = progress.bytes("writing bundle", stats.bytes);
    let on = bar.clone();
    let items: Vec<Item> = graphs
        .iter()
        .map(|g| Item {
            graph: g,
            repo: g.repo.clone(),
            reference: g.reference.clone(),
        })
        .collect();
    copy::transfer(
        store,
        writer,
        &items,
        &copy::Options {
            jobs,
            omitted: &settings.on_site,
            omitted_policy: copy::Omitted::Skip,
            dry_run: false,
            on_bytes: Arc::new(move |n| on.inc(n)),
        },
    )
    .await?;
    use std::sync::atomic::Ordering::Relaxed;
    stats.downloaded_bytes = writer.counts.received.load(Relaxed);
    stats.cached_bytes = writer.counts.from_cache.load(Relaxed);
    stats.cached_blobs = writer.counts.cached_blobs.load(Relaxed) as usize;
    bar.finish(&format!(
        "{} blobs, {} downloaded, {} reused from cache",
        stats.blobs,
        human_bytes(stats.downloaded_bytes),
        human_bytes(stats.cached_bytes)
    ));
    Ok(stats)
}

/// The chart as a Helm OCI artifact (config: Chart.yaml as JSON; layer: the archive): a graph
/// whose blobs are inline, copied into the bundle by the same walk as the images.
fn chart_artifact(
    archive: &ChartArchive,
    fetched: &FetchedChart,
    created: &str,
) -> anyhow::Result<Graph> {
    let meta = archive.meta();
    let config_bytes = bytes::Bytes::from(serde_json::to_vec(archive.chart_yaml_json())?);
    let config_digest = Digest::of(&config_bytes);
    let mut annotations = serde_json::Map::new();
    annotations.insert("org.opencontainers.image.created".into(), json!(created));
    if let Some(d) = &meta.description {
        annotations.insert("org.opencontainers.image.description".into(), json!(d));
    }
    annotations.insert("org.opencontainers.image.title".into(), json!(meta.name));
    annotations.insert(
        "org.opencontainers.image.version".into(),
        json!(meta.version),
    );
    let config = crate::oci::Descriptor {
        media_type: media::HELM_CONFIG.into(),
        digest: config_digest.clone(),
        size: config_bytes.len() as u64,
        platform: None,
        annotations: None,
    };
    let layer = crate::oci::Descriptor {
        media_type: media::HELM_CHART.into(),
        digest: fetched.digest.clone(),
        size: fetched.bytes.len() as u64,
        platform: None,
        annotations: None,
    };
    let top = RawManifest::new(
        serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": media::OCI_MANIFEST,
            "config": config,
            "layers": [layer],
            "annotations": annotations,
        }))?,
        media::OCI_MANIFEST,
    );
    let repo = format!("charts/{}", meta.name);
    let graph = Graph {
        repo,
        reference: Reference::Tag(meta.version.clone()),
        upstream: top.clone(),
        top,
        children: vec![],
        blobs: vec![config, layer],
        inline: BTreeMap::from([
            (config_digest, config_bytes),
            (
                fetched.digest.clone(),
                bytes::Bytes::from(fetched.bytes.clone()),
            ),
        ]),
        platforms: vec![],
        dropped: vec![],
        attestations: 0,
    };
    Ok(graph)
}

/// The chart and what it asks for.
struct ChartInput {
    fetched: FetchedChart,
    archive: ChartArchive,
    crds: Vec<crate::chart::Crd>,
    wanted: Vec<Wanted>,
    discovery: crate::bundle::manifest::DiscoveryRecord,
}

/// The chart (from the repository index, or `--chart`), its CRDs, and the images it deploys
/// (rendered by helm with `--values`/`--set`) plus `--image`.
async fn read_chart(
    args: &BuildArgs,
    helm: &Helm,
    progress: &Progress,
) -> anyhow::Result<ChartInput> {
    let http = HttpFetcher::new(&args.ca_file, Default::default())?;
    let fetched = fetch_chart(args, &http, progress).await?;
    let archive = ChartArchive::from_tgz(&fetched.bytes)
        .context("the chart archive is not a readable Helm chart")?;
    let meta = archive.meta();
    if meta.name != "koordinator" {
        progress.warn(format!(
            "the chart is named {:?}, not koordinator",
            meta.name
        ));
    }
    // The chart's own files first (no outside program), then helm.
    let crds = chart::extract_crds(&archive)?;
    let origin = match (&fetched.url, &args.chart) {
        (Some(url), _) => url.clone(),
        (None, Some(file)) => format!("--chart {}", file.display()),
        (None, None) => "the chart archive".into(),
    };
    let (images, discovery) =
        super::discover::images(helm, args, &archive, &fetched.bytes, &origin)?;
    let wanted = wanted_images(&images, &args.images)?;
    progress.say(format!(
        "found    {} images and {} CRDs in chart {} {} (helm template, helm v{})",
        wanted.len(),
        crds.len(),
        meta.name,
        meta.version,
        helm.version
    ));

    Ok(ChartInput {
        fetched,
        archive,
        crds,
        wanted,
        discovery,
    })
}

/// Every registry the images may come from, as one store (repositories carry their host).
fn registry_store(
    args: &BuildArgs,
    settings: &Settings,
    wanted: &[Wanted],
    progress: &Progress,
) -> anyhow::Result<RegistryStore> {
    let mut plain_hosts = Vec::new();
    if args.plain_http {
        for s in &settings.sources {
            if let Origin::Custom(c) = s {
                plain_hosts.push(c.split('/').next().unwrap_or(c).to_string());
            }
        }
        for w in wanted {
            if let Some(r) = &w.fixed {
                plain_hosts.push(r.registry.clone());
            }
        }
    }
    let reg = Registry::new(RegistryOptions {
        plain_http_hosts: plain_hosts,
        ca_files: args.ca_file.clone(),
        credentials: super::registry_credentials()?,
        on_retry: Some(super::retry_reporter(progress)),
        ..Default::default()
    })?;
    Ok(RegistryStore::new(Arc::new(reg), ""))
}

/// Every image resolved from the first source that has it (`jobs` at a time).
async fn resolve_all(
    store: &RegistryStore,
    map: &SourceMap,
    settings: &Settings,
    wanted: &[Wanted],
    jobs: usize,
    progress: &Progress,
) -> anyhow::Result<Vec<Resolved>> {
    let cands = wanted
        .iter()
        .map(|w| candidates(map, &settings.sources, w))
        .collect::<anyhow::Result<Vec<_>>>()?;
    // The walk's bundle-wide bounds (manifests, their bytes, blobs) hold across the images.
    let budget = &copy::Budget::default();
    // The first failure ends the walk of the rest (a graph beyond a bound stops the build
    // there, not after every other image was walked).
    let resolved: Vec<Resolved> = futures_util::stream::iter(wanted.iter().zip(&cands))
        .map(|(w, c)| {
            let platforms = settings.platforms.as_deref();
            async move {
                resolve_image(store, w, c, platforms, budget)
                    .await
                    .with_context(|| format!("image {} (component {})", w.original, w.component))
            }
        })
        .buffered(jobs.max(1))
        .try_collect()
        .await?;
    for (w, r) in wanted.iter().zip(&resolved) {
        if !r.fallbacks.is_empty() {
            progress.warn(format!(
                "{}: served by {} after {}",
                w.ref_name,
                r.source,
                r.fallbacks.join("; ")
            ));
        }
    }
    Ok(resolved)
}

/// What goes into the bundle besides the blobs' bytes: its manifest, the small files, and the
/// list of blobs.
struct Layout {
    manifest: BundleManifest,
    files: Vec<(String, Vec<u8>)>,
    blobs: Vec<(Digest, u64)>,
}

/// The layout index, the bundle manifest and the files; blobs the site holds (`--since`) are
/// left out (and recorded).
fn assemble(
    args: &BuildArgs,
    settings: &Settings,
    chart: &ChartInput,
    records: Vec<ImageRecord>,
    resolved: &[Resolved],
    chart_graph: &Graph,
    created: &str,
) -> anyhow::Result<Layout> {
    let (meta, fetched, crds, discovery) = (
        chart.archive.meta(),
        &chart.fetched,
        &chart.crds,
        &chart.discovery,
    );
    let chart_ref = format!("charts/{}:{}", meta.name, meta.version);
    let mut entries: Vec<serde_json::Value> = records
        .iter()
        .map(|r| json!({"mediaType": r.media_type, "digest": r.digest, "size": r.size, "annotations": {REF_NAME: r.ref_name}}))
        .collect();
    entries.push(json!({"mediaType": media::OCI_MANIFEST, "digest": chart_graph.top.digest, "size": chart_graph.top.bytes.len(),
                        "artifactType": media::HELM_CONFIG, "annotations": {REF_NAME: chart_ref}}));
    let index_json = serde_json::to_vec(
        &json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX, "manifests": entries}),
    )?;
    let mut blobs: Vec<(Digest, u64)> = Vec::new();
    let mut omitted: Vec<OmittedBlob> = Vec::new();
    for g in resolved.iter().map(|r| &r.graph).chain([chart_graph]) {
        // Manifests are always carried (small, and needed to walk and push the graph); configs
        // and layers the site already holds are left out.
        blobs.extend(
            g.manifests()
                .map(|m| (m.digest.clone(), m.bytes.len() as u64)),
        );
        for b in &g.blobs {
            if settings.on_site.contains(&b.digest) {
                omitted.push(OmittedBlob {
                    digest: b.digest.clone(),
                    size: b.size,
                });
            } else {
                blobs.push((b.digest.clone(), b.size));
            }
        }
    }
    omitted.sort();
    omitted.dedup();
    blobs.sort();
    blobs.dedup();
    let chart_file = format!("charts/{}-{}.tgz", meta.name, meta.version);
    let crd_records: Vec<CrdRecord> = crds
        .iter()
        .map(|c| CrdRecord {
            file: format!("crds/{}", c.file_name),
            name: c.name.clone(),
            group: c.group.clone(),
            plural: c.plural.clone(),
            kind: c.kind.clone(),
            values_key: c.values_key.clone(),
        })
        .collect();
    let manifest = BundleManifest {
        format_version: FORMAT_VERSION.into(),
        tool: Tool {
            name: "koord-bundle".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        },
        created: created.to_string(),
        chart: ChartRecord {
            name: meta.name.clone(),
            version: meta.version.clone(),
            app_version: meta.app_version.clone(),
            digest: fetched.digest.clone(),
            file: chart_file.clone(),
            url: fetched.url.clone(),
            index_digest: fetched.index_digest.clone(),
            digest_mismatch_allowed: fetched.mismatch_allowed,
            oci: OciRecord {
                ref_name: chart_ref,
                digest: chart_graph.top.digest.clone(),
                media_type: media::OCI_MANIFEST.into(),
                size: chart_graph.top.bytes.len() as u64,
            },
        },
        images: records,
        crds: crd_records,
        platform_filter: settings.platforms.clone(),
        sources: settings.recorded_sources.clone(),
        overrides: Overrides {
            values_files: args
                .values
                .iter()
                .map(|p| {
                    p.file_name()
                        .map(|n| n.to_string_lossy().to_string())
                        .unwrap_or_default()
                })
                .collect(),
            set_keys: args
                .set
                .iter()
                .flat_map(|s| {
                    s.split(',')
                        .map(|kv| kv.split('=').next().unwrap_or("").to_string())
                })
                .collect(),
            extra_images: args.images.clone(),
        },
        blobs: BlobTotals {
            count: blobs.len(),
            bytes: crate::oci::size::checked_sum(blobs.iter().map(|(_, s)| *s)).context(
                "the bundle's blobs add up to more than 2^63 - 1 bytes, the most a file can hold",
            )?,
        },
        blob_list: blobs.iter().map(|(d, _)| d.clone()).collect(),
        base: settings.base.as_ref().map(|(m, d)| BaseRecord {
            manifest_digest: d.clone(),
            chart_version: m.chart.version.clone(),
            created: m.created.clone(),
        }),
        omitted_blobs: omitted,
        discovery: Some(discovery.clone()),
    };
    let manifest_json = serde_json::to_vec_pretty(&manifest)?;
    let mut files: Vec<(String, Vec<u8>)> = vec![
        (crate::bundle::MANIFEST_FILE.into(), manifest_json),
        (
            "oci-layout".into(),
            br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
        ),
        ("index.json".into(), index_json),
        (chart_file, fetched.bytes.clone()),
    ];
    for c in crds {
        files.push((format!("crds/{}", c.file_name), c.yaml.clone().into_bytes()));
    }

    Ok(Layout {
        manifest,
        files,
        blobs,
    })
}

/// What was written: the bundle (or its parts) and where its blobs came from.
struct Written {
    output: PathBuf,
    out: pack::PackStats,
    parts: Vec<PathBuf>,
    stats: FetchStats,
}

/// The bundle: laid out (checksums and signature first), then every blob copied once into its
/// place by the one walk, from the registries (or the cache), then renamed into place (or
/// split, or compressed).
async fn write_bundle(
    args: &BuildArgs,
    settings: &Settings,
    store: &RegistryStore,
    layout: &Layout,
    graphs: &[&Graph],
    created_secs: u64,
    progress: &Progress,
) -> anyhow::Result<Written> {
    let (manifest, files, blobs) = (&layout.manifest, &layout.files, &layout.blobs);
    let meta = &manifest.chart;
    let created = &manifest.created;
    let output = output_path(args, settings, &meta.version);
    let trusted = format!(
        "koord-bundle {} {} created {created}",
        meta.name, meta.version
    );
    let signer = settings.signer.as_ref();
    let (checksums, signature) =
        pack::checksum_and_sign(files, blobs, signer.map(|(sk, _)| (sk, trusted.as_str())))?;
    let cache = match &settings.cache_root {
        Some(root) => Some(BlobCache::open(root)?),
        None => None,
    };
    let werr = |source: std::io::Error| pack::PackError::Write {
        path: output.clone(),
        source,
    };
    // Checked (one size per blob, naming the images), laid out, and measured against the
    // disk, before the first byte is written.
    let totals = copy::totals(graphs.iter().copied(), &settings.on_site)?;
    let tar = writer::Layout::new(
        &output,
        &Plan {
            files,
            blobs,
            mtime: created_secs,
            checksums: &checksums,
            signature: signature.as_deref(),
        },
    )?;
    // The blobs the cache lacks go there too as they arrive: counted when it shares the
    // output's file system (a cache elsewhere that fills stops the build with exit 3).
    let cached = cache_room(cache.as_ref(), settings, &output, &totals);
    let mut why = largest(&totals);
    if cached > 0 {
        why.push_str(&format!(
            "; with {} for the blob cache on the same file system",
            human_bytes(cached)
        ));
    }
    check_room(
        &output,
        room_needed(args, settings, tar.len()).saturating_add(cached),
        &why,
    )?;
    let out = AtomicFile::create(&output).map_err(werr)?;
    let writer = BundleWriter::create(&out, &output, tar, cache.as_ref())?;
    let stats = write_blobs(store, &writer, graphs, settings, args.jobs, progress).await?;
    let written = tokio::task::block_in_place(|| writer.finish())?;
    let (out, parts) = match (settings.split, args.compress) {
        (None, Compression::None) => {
            out.commit().map_err(werr)?;
            (written, vec![])
        }
        (None, Compression::Gzip) => {
            let gz = AtomicFile::create(&output).map_err(werr)?;
            let bytes = tokio::task::block_in_place(|| pack::gzip(out.path(), &gz, &output))?;
            gz.commit().map_err(werr)?;
            (pack::PackStats { bytes, ..written }, vec![])
        }
        (Some(size), _) => {
            // Split the written bundle into NAME.partNNN; the whole file goes when dropped.
            let name = output
                .file_name()
                .context("the output path has no file name")?
                .to_string_lossy()
                .to_string();
            let opts = crate::bundle::set::SplitOptions {
                size,
                parity: args.parity,
                out_dir: &settings.output_dir,
                name: &name,
                signer: signer.map(|(sk, _)| sk),
            };
            let parts = tokio::task::block_in_place(|| {
                crate::bundle::set::split(out.path(), &opts, &|_| {})
            })?;
            (written, parts)
        }
    };
    Ok(Written {
        output,
        out,
        parts,
        stats,
    })
}

/// Where the bundle goes: `-o`, else `koordinator-VERSION.tar[.gz]` in the output directory.
fn output_path(args: &BuildArgs, settings: &Settings, version: &str) -> PathBuf {
    args.output.clone().unwrap_or_else(|| {
        settings.output_dir.join(match args.compress {
            Compression::None => format!("koordinator-{version}.tar"),
            Compression::Gzip => format!("koordinator-{version}.tar.gz"),
        })
    })
}

/// Bytes the output's file system must take for a bundle of `len` bytes: the bundle, and once
/// more for what is made of it before it goes (its parts with `--split`, its gzip copy with
/// `--compress gzip`).
fn room_needed(args: &BuildArgs, settings: &Settings, len: u64) -> u64 {
    if settings.split.is_some() || args.compress == Compression::Gzip {
        len.saturating_mul(2)
    } else {
        len
    }
}

/// Bytes the blob cache will take on the output's file system: the blobs it lacks, when it
/// is on that file system (else 0).
fn cache_room(
    cache: Option<&BlobCache>,
    settings: &Settings,
    output: &std::path::Path,
    totals: &copy::Totals,
) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    let (Some(cache), Some(root)) = (cache, &settings.cache_root) else {
        return 0;
    };
    let dir = output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let dev = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.dev()).ok();
    if dev(root).is_none() || dev(root) != dev(dir) {
        return 0;
    }
    totals
        .blobs
        .iter()
        .filter(|(d, s)| !cache.has(d, **s))
        .fold(0u64, |a, (_, s)| a.saturating_add(*s))
}

/// `, its largest blob being D (N bytes) of image I`, for the room check's messages.
fn largest(totals: &copy::Totals) -> String {
    match &totals.largest {
        Some((d, size, image)) => format!(
            "; its largest blob is {d} of image {image}, {size} bytes ({})",
            human_bytes(*size)
        ),
        None => String::new(),
    }
}

/// Run the build.
pub async fn run(args: BuildArgs) -> anyhow::Result<()> {
    let progress = Progress::new(Mode::detect(args.json));
    let map = SourceMap::builtin();
    let settings = Settings::resolve(&args, &map)?;
    let chart = read_chart(&args, &settings.helm, &progress).await?;
    let store = registry_store(&args, &settings, &chart.wanted, &progress)?;
    let resolved =
        resolve_all(&store, &map, &settings, &chart.wanted, args.jobs, &progress).await?;
    let records: Vec<ImageRecord> = chart
        .wanted
        .iter()
        .zip(&resolved)
        .map(|(w, r)| record(w, r))
        .collect();
    if args.dry_run {
        return print_plan(&args, &settings, &chart, &records, &resolved, &progress);
    }
    let created_secs = super::creation_time()?;
    let created = super::rfc3339(created_secs);
    let chart_graph = chart_artifact(&chart.archive, &chart.fetched, &created)?;
    let layout = assemble(
        &args,
        &settings,
        &chart,
        records,
        &resolved,
        &chart_graph,
        &created,
    )?;
    let graphs: Vec<&Graph> = resolved
        .iter()
        .map(|r| &r.graph)
        .chain([&chart_graph])
        .collect();
    let w = write_bundle(
        &args,
        &settings,
        &store,
        &layout,
        &graphs,
        created_secs,
        &progress,
    )
    .await?;
    print_result(&args, &settings, &layout.manifest, &w)
}

/// What was built (stdout, or one JSON document).
fn print_result(
    args: &BuildArgs,
    settings: &Settings,
    manifest: &BundleManifest,
    w: &Written,
) -> anyhow::Result<()> {
    let (output, out, parts, stats) = (&w.output, &w.out, &w.parts, &w.stats);
    let signer = settings.signer.as_ref();
    let pubkey = signer.map(|(_, p)| p.clone());
    if args.json {
        return super::print_json(&json!({
            "bundle": parts.first().unwrap_or(output), "parts": parts, "bytes": out.bytes, "files": out.files,
            "omittedBlobs": manifest.omitted_blobs.len(), "base": manifest.base,
            "chart": {"name": manifest.chart.name, "version": manifest.chart.version, "digest": manifest.chart.digest},
            "images": manifest.images, "crds": manifest.crds.len(), "fetch": stats, "signed": signer.is_some(),
            "discovery": manifest.discovery,
            "publicKey": pubkey,
        }));
    }
    println!("bundle   {} ({})", output.display(), human_bytes(out.bytes),);
    if !parts.is_empty() {
        println!(
            "parts    {} parts: {} ... (verify, inspect and load take the first part)",
            parts.len(),
            parts[0].display()
        );
    }
    if let Some(b) = &manifest.base {
        println!(
            "base     incremental on the {} bundle of {}: {} blobs left out (the target registry must hold them)",
            b.chart_version,
            b.created,
            manifest.omitted_blobs.len()
        );
    }
    println!(
        "content  chart {} {}, {} images, {} CRDs, {} unique blobs ({})",
        manifest.chart.name,
        manifest.chart.version,
        manifest.images.len(),
        manifest.crds.len(),
        manifest.blobs.count,
        human_bytes(manifest.blobs.bytes)
    );
    println!(
        "fetched  {} downloaded, {} reused from the cache {}",
        human_bytes(stats.downloaded_bytes),
        human_bytes(stats.cached_bytes),
        settings
            .cache_root
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "(--no-cache)".into())
    );
    match pubkey {
        Some(p) => println!("signed   copy the public key {} to the loading site: koord-bundle verify {} --key koord-bundle.pub", p.display(), output.display()),
        None => println!("signed   NO (--unsigned): loading needs --insecure-skip-signature"),
    }
    Ok(())
}

/// `--dry-run`: the plan, nothing downloaded but manifests.
fn print_plan(
    args: &BuildArgs,
    settings: &Settings,
    chart: &ChartInput,
    records: &[ImageRecord],
    resolved: &[Resolved],
    progress: &Progress,
) -> anyhow::Result<()> {
    let (meta, fetched, crds, discovery) = (
        chart.archive.meta(),
        &chart.fetched,
        &chart.crds,
        &chart.discovery,
    );
    // Checked as a build checks them: a size that cannot be is refused here too.
    let totals = copy::totals(resolved.iter().map(|r| &r.graph), &BTreeSet::new())?;
    let (unique, total) = (&totals.blobs, totals.bytes);
    let output = output_path(args, settings, &meta.version);
    match check_room(
        &output,
        room_needed(args, settings, total),
        &largest(&totals),
    ) {
        Err(pack::PackError::Write { source, .. }) => progress.warn(format!(
            "a build to {} would stop before downloading: {source}",
            output.display()
        )),
        other => other?,
    }
    if args.json {
        return super::print_json(&json!({
            "dryRun": true,
            "chart": {"name": meta.name, "version": meta.version, "digest": fetched.digest, "url": fetched.url},
            "images": records, "crds": crds.iter().map(|c| &c.name).collect::<Vec<_>>(),
            "discovery": discovery,
            "uniqueBlobs": unique.len(), "bytes": total,
        }));
    }
    println!(
        "plan: chart {} {} ({})",
        meta.name, meta.version, fetched.digest
    );
    for r in records {
        println!(
            "  {:44} {}  from {:16} [{}] {}",
            r.ref_name,
            r.digest,
            r.source,
            r.platforms.join(", "),
            human_bytes(r.total_size)
        );
    }
    println!(
        "  {} CRDs; {} unique blobs, {} to download (nothing was downloaded: --dry-run)",
        crds.len(),
        unique.len(),
        human_bytes(total)
    );
    Ok(())
}
