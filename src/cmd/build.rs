//! `koord-bundle build`: chart → images → bundle.

use crate::bundle::manifest::{
    BaseRecord, BlobTotals, ChartRecord, CrdRecord, ImageRecord, OciRecord, OmittedBlob, Overrides,
    Tool,
};
use crate::bundle::pack::{self, Compression, PackInput};
use crate::bundle::{sign, BundleManifest, FORMAT_VERSION, REF_NAME};
use crate::chart::{self, ChartArchive, ChartImage};
use crate::cli::BuildArgs;
use crate::copy::{self, human_bytes, ResolvedImage};
use crate::oci::{media, Digest, ImageRef};
use crate::progress::{Mode, Progress};
use crate::sources::{Source, SourceMap};
use crate::store::http::HttpFetcher;
use crate::store::{BlobCache, Credentials, Registry, RegistryOptions};
use anyhow::{bail, Context as _};
use futures_util::StreamExt;
use serde_json::json;
use std::path::PathBuf;

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
        let bytes = read_bounded(file, chart::archive::MAX_UNCOMPRESSED as usize)
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

/// Read a file of at most `max` bytes (refused beyond, without reading the rest).
fn read_bounded(path: &std::path::Path, max: usize) -> anyhow::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut out = Vec::new();
    std::fs::File::open(path)?
        .take(max as u64 + 1)
        .read_to_end(&mut out)?;
    if out.len() > max {
        bail!(
            "{}: larger than the {max} bytes allowed for it",
            path.display()
        );
    }
    Ok(out)
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

fn load_signer(args: &BuildArgs) -> anyhow::Result<Option<(minisign::SecretKey, PathBuf)>> {
    if args.unsigned {
        return Ok(None);
    }
    let path = match &args.sign_key {
        Some(p) => p.clone(),
        None => super::config_dir()?.join(sign::SECRET_KEY_FILE),
    };
    if !path.exists() {
        bail!(
            "no signing key at {}: create one with `koord-bundle keygen` (writes koord-bundle.key and koord-bundle.pub into {}), pass --sign-key FILE, or --unsigned",
            path.display(),
            path.parent().map(|p| p.display().to_string()).unwrap_or_default()
        );
    }
    let password = if sign::secret_key_is_encrypted(&path)? {
        super::key_password(false)?
    } else {
        None
    };
    let sk = sign::load_secret_key(&path, password)?;
    Ok(Some((sk, path.with_extension("pub"))))
}

/// Run the build.
pub async fn run(args: BuildArgs) -> anyhow::Result<()> {
    let progress = Progress::new(Mode::detect(args.json));
    let signer = if args.dry_run {
        None
    } else {
        load_signer(&args)?
    };
    let base = args.since.as_deref().map(load_base).transpose()?;
    let on_site = base
        .as_ref()
        .map(|(m, _)| m.blobs_on_site())
        .unwrap_or_default();
    let map = SourceMap::builtin();
    let sources: Vec<Source> = if args.sources.is_empty() {
        map.default_sources()
    } else {
        args.sources
            .iter()
            .map(|s| map.parse_source(s))
            .collect::<Result<_, _>>()?
    };
    let platforms: Option<Vec<String>> = (!args.platform.is_empty()).then(|| args.platform.clone());
    if let Some(ps) = &platforms {
        for p in ps {
            if p.split('/').count() < 2 {
                bail!("--platform {p}: expected OS/ARCH[/VARIANT], e.g. linux/amd64");
            }
        }
    }

    // 1. The chart.
    let http = HttpFetcher::new(&args.ca_file, Default::default())?;
    let fetched = fetch_chart(&args, &http, &progress).await?;
    let archive = ChartArchive::from_tgz(&fetched.bytes)
        .context("the chart archive is not a readable Helm chart")?;
    let meta = archive.meta().clone();
    if meta.name != "koordinator" {
        progress.warn(format!(
            "the chart is named {:?}, not koordinator",
            meta.name
        ));
    }
    let mut values = archive.values().clone();
    for f in &args.values {
        let limits = crate::yaml::VALUES_FILE;
        let text = read_bounded(f, limits.max_bytes)
            .with_context(|| format!("cannot read values file {}", f.display()))?;
        let overlay = crate::yaml::parse_helm_values(
            &format!("values file {}", f.display()),
            &text,
            &limits,
        )?;
        chart::merge_values(&mut values, &overlay);
    }
    for s in &args.set {
        chart::apply_set(&mut values, s)?;
    }
    let (images, discovery) = super::discover::images(&args, &archive, &fetched.bytes, &values)?;
    let crds = chart::extract_crds(&archive)?;
    let wanted = wanted_images(&images, &args.images)?;
    progress.say(format!(
        "found    {} images and {} CRDs in chart {} {} ({})",
        wanted.len(),
        crds.len(),
        meta.name,
        meta.version,
        match &discovery.helm_version {
            Some(v) => format!("helm template, helm {v}"),
            None => "built-in chart reader".into(),
        }
    ));

    // 2. Resolve every image from the first source that has it.
    let mut plain_hosts = Vec::new();
    if args.plain_http {
        for s in &sources {
            if let Source::Custom(c) = s {
                plain_hosts.push(c.split('/').next().unwrap_or(c).to_string());
            }
        }
        for w in &wanted {
            if let Some(r) = &w.fixed {
                plain_hosts.push(r.registry.clone());
            }
        }
    }
    let credentials = Credentials::from_files(&super::auth_files())?;
    let reg = Registry::new(RegistryOptions {
        plain_http_hosts: plain_hosts,
        ca_files: args.ca_file.clone(),
        credentials,
        ..Default::default()
    })?;
    let cache_root = match &args.cache {
        Some(c) => c.clone(),
        None => super::cache_dir()?,
    };
    let cache = BlobCache::open(&cache_root)?;
    let mut candidates = Vec::new();
    for w in &wanted {
        let c: Vec<(String, ImageRef)> = match &w.fixed {
            Some(r) => vec![(r.registry.clone(), r.clone())],
            None => {
                let mut c: Vec<(String, ImageRef)> = Vec::new();
                for s in &sources {
                    let r = map.map(s, &w.host, &w.repository, &w.tag)?;
                    if !c.iter().any(|(_, x)| x == &r) {
                        c.push((map.label(s, &r, &w.repository), r));
                    }
                }
                c
            }
        };
        candidates.push(c);
    }
    let resolved: Vec<anyhow::Result<ResolvedImage>> =
        futures_util::stream::iter(wanted.iter().zip(&candidates))
            .map(|(w, c)| {
                let (reg, cache, platforms) = (&reg, &cache, platforms.as_deref());
                async move {
                    copy::resolve_image(reg, cache, &w.original, c, platforms)
                        .await
                        .with_context(|| {
                            format!("image {} (component {})", w.original, w.component)
                        })
                }
            })
            .buffered(args.jobs.max(1))
            .collect()
            .await;
    let resolved: Vec<ResolvedImage> = resolved.into_iter().collect::<anyhow::Result<_>>()?;
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
    let records: Vec<ImageRecord> = wanted
        .iter()
        .zip(&resolved)
        .map(|(w, r)| ImageRecord {
            ref_name: w.ref_name.clone(),
            component: w.component.clone(),
            repository: w.repository.clone(),
            tag: w.tag.clone(),
            original: w.original.clone(),
            source: r.source.clone(),
            source_ref: r.source_ref.to_string(),
            fallbacks: r.fallbacks.clone(),
            digest: r.digest.clone(),
            upstream_digest: r.upstream_digest.clone(),
            media_type: r.media_type.clone(),
            size: r.size,
            platforms: r.platforms.clone(),
            dropped_platforms: r.dropped.clone(),
            attestations: r.attestations,
            total_size: r.total_size(),
        })
        .collect();

    if args.dry_run {
        let mut unique = std::collections::BTreeMap::new();
        for r in &resolved {
            for (d, s) in &r.blobs {
                unique.insert(d.clone(), *s);
            }
        }
        let total: u64 = unique.values().sum();
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
        for r in &records {
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
        return Ok(());
    }

    // 3. Fetch every blob once.
    let stats = copy::fetch_all(&reg, &cache, &resolved, &on_site, args.jobs, &progress).await?;
    let mut verified = stats.verified.clone();

    // 4. The chart as a Helm OCI artifact.
    let created_secs = super::creation_time()?;
    let created = super::rfc3339(created_secs);
    let config_bytes = serde_json::to_vec(archive.chart_yaml_json())?;
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
    let chart_manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": media::OCI_MANIFEST,
        "config": {"mediaType": media::HELM_CONFIG, "digest": config_digest, "size": config_bytes.len()},
        "layers": [{"mediaType": media::HELM_CHART, "digest": fetched.digest, "size": fetched.bytes.len()}],
        "annotations": annotations,
    }))?;
    let chart_manifest_digest = Digest::of(&chart_manifest);
    cache.put_bytes(&config_digest, &config_bytes)?;
    cache.put_bytes(&fetched.digest, &fetched.bytes)?;
    cache.put_bytes(&chart_manifest_digest, &chart_manifest)?;
    verified.extend([
        config_digest.clone(),
        fetched.digest.clone(),
        chart_manifest_digest.clone(),
    ]);
    let chart_ref = format!("charts/{}:{}", meta.name, meta.version);

    // 5. Layout index, bundle manifest, files.
    let mut entries: Vec<serde_json::Value> = records
        .iter()
        .map(|r| json!({"mediaType": r.media_type, "digest": r.digest, "size": r.size, "annotations": {REF_NAME: r.ref_name}}))
        .collect();
    entries.push(json!({"mediaType": media::OCI_MANIFEST, "digest": chart_manifest_digest, "size": chart_manifest.len(),
                        "artifactType": media::HELM_CONFIG, "annotations": {REF_NAME: chart_ref}}));
    let index_json = serde_json::to_vec(
        &json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX, "manifests": entries}),
    )?;
    let mut blobs: Vec<(Digest, u64)> = Vec::new();
    let mut omitted: Vec<OmittedBlob> = Vec::new();
    for r in &resolved {
        // Manifests are always carried (small, and needed to walk and push the graph); configs
        // and layers the site already holds are left out.
        blobs.extend(r.manifests.iter().map(|(d, b)| (d.clone(), b.len() as u64)));
        for (d, size) in &r.blobs {
            if on_site.contains(d) {
                omitted.push(OmittedBlob {
                    digest: d.clone(),
                    size: *size,
                });
            } else {
                blobs.push((d.clone(), *size));
            }
        }
    }
    omitted.sort();
    omitted.dedup();
    blobs.push((config_digest, config_bytes.len() as u64));
    blobs.push((fetched.digest.clone(), fetched.bytes.len() as u64));
    blobs.push((chart_manifest_digest.clone(), chart_manifest.len() as u64));
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
        created: created.clone(),
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
                digest: chart_manifest_digest,
                media_type: media::OCI_MANIFEST.into(),
                size: chart_manifest.len() as u64,
            },
        },
        images: records,
        crds: crd_records,
        platform_filter: platforms.clone(),
        sources: if args.sources.is_empty() {
            map.default.clone()
        } else {
            args.sources.clone()
        },
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
            bytes: blobs.iter().map(|(_, s)| s).sum(),
        },
        blob_list: blobs.iter().map(|(d, _)| d.clone()).collect(),
        base: base.as_ref().map(|(m, d)| BaseRecord {
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
    for c in &crds {
        files.push((format!("crds/{}", c.file_name), c.yaml.clone().into_bytes()));
    }

    // 6. Pack, sign, rename into place.
    let output = args.output.clone().unwrap_or_else(|| {
        PathBuf::from(match args.compress {
            Compression::None => format!("koordinator-{}.tar", meta.version),
            Compression::Gzip => format!("koordinator-{}.tar.gz", meta.version),
        })
    });
    let trusted = format!(
        "koord-bundle {} {} created {created}",
        meta.name, meta.version
    );
    let input = PackInput {
        files,
        blobs,
        cache: &cache,
        mtime: created_secs,
        signer: signer.as_ref().map(|(sk, _)| (sk, trusted)),
        compress: args.compress,
        verified: &verified,
    };
    let bar = progress.bytes("writing bundle", manifest.blobs.bytes);
    let (out, parts) = match &args.split {
        None => (
            tokio::task::block_in_place(|| pack::pack(&input, &output, &|n| bar.inc(n)))?,
            vec![],
        ),
        Some(size) => {
            // Pack beside the output, split into NAME.partNNN, drop the whole file.
            let name = output
                .file_name()
                .context("the output path has no file name")?
                .to_string_lossy()
                .to_string();
            let dir = output
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map(std::path::Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from("."));
            let whole = tempfile::Builder::new()
                .prefix(&format!(".{name}."))
                .suffix(".unsplit")
                .tempfile_in(&dir)?
                .into_temp_path();
            let out = tokio::task::block_in_place(|| pack::pack(&input, &whole, &|n| bar.inc(n)))?;
            let parts = tokio::task::block_in_place(|| {
                super::split::split_file(
                    &whole,
                    size,
                    &dir,
                    &name,
                    signer.as_ref().map(|(sk, _)| sk),
                )
            })?;
            (out, parts)
        }
    };
    bar.finish(&format!(
        "{} written",
        parts.first().unwrap_or(&output).display()
    ));
    let pubkey = signer.as_ref().map(|(_, p)| p.clone());
    if args.json {
        return super::print_json(&json!({
            "bundle": parts.first().unwrap_or(&output), "parts": parts, "sha256": out.sha256, "bytes": out.bytes, "files": out.files,
            "omittedBlobs": manifest.omitted_blobs.len(), "base": manifest.base,
            "chart": {"name": manifest.chart.name, "version": manifest.chart.version, "digest": manifest.chart.digest},
            "images": manifest.images, "crds": manifest.crds.len(), "fetch": stats, "signed": signer.is_some(),
            "discovery": manifest.discovery,
            "publicKey": pubkey,
        }));
    }
    println!(
        "bundle   {} ({}, sha256 {})",
        output.display(),
        human_bytes(out.bytes),
        out.sha256.hex()
    );
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
        cache_root.display()
    );
    match pubkey {
        Some(p) => println!("signed   copy the public key {} to the loading site: koord-bundle verify {} --key koord-bundle.pub", p.display(), output.display()),
        None => println!("signed   NO (--unsigned): loading needs --insecure-skip-signature"),
    }
    Ok(())
}
