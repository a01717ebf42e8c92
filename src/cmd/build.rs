//! `koord-bundle build`: settings, then chart → images → [`Plan`] → bundle. What the bundle
//! holds is decided in `bundle::plan` and `bundle::layout`, where it is written in
//! `bundle::emit`; this file resolves the flags and prints.

use crate::bundle::atomic;
use crate::bundle::emit::{self, Output, Written};
use crate::bundle::layout;
use crate::bundle::manifest::{CrdRecord, DiscoveryRecord, Overrides};
use crate::bundle::pack::{self, Compression};
use crate::bundle::plan::{self, Base, ChartInput, CrdFile, ImageInput, Plan, PlanInput};
use crate::bundle::reuse::{self, Donors, Index};
use crate::chart::fetch::{self, FetchedChart};
use crate::chart::{self, ChartArchive};
use crate::cli::BuildArgs;
use crate::helm::Helm;
use crate::progress::{Mode, Progress};
use crate::sources::resolve::{self, Resolved, Wanted};
use crate::sources::{Origin, SourceMap};
use crate::store::http::HttpFetcher;
use crate::store::registry::RegistryStore;
use crate::store::{BlobCache, Registry, RegistryOptions};
use crate::text::human_bytes;
use anyhow::{bail, Context as _};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// What a build needs, resolved once from the flags and the environment before any network
/// request or byte written: an error in any of them costs no download.
struct Settings {
    /// The helm that renders the chart (`--helm`, else on `PATH`; 3.8+).
    helm: Helm,
    map: SourceMap,
    sources: Vec<Origin>,
    /// The sources as given (or the default list), for the bundle manifest.
    recorded_sources: Vec<String>,
    platforms: Option<Vec<String>>,
    /// `--split` size and `--parity`.
    split: Option<(u64, usize)>,
    signer: Option<(minisign::SecretKey, PathBuf)>,
    /// The bundle `--since` names.
    base: Option<Base>,
    /// The opt-in blob store (`--cache DIR`).
    cache: Option<BlobCache>,
    /// The index of earlier bundles, in the cache directory (`None` with `--no-cache`).
    index: Option<Index>,
    /// Where the output goes (checked writable; `None`: named after the chart version).
    output: Option<PathBuf>,
    output_dir: PathBuf,
    /// `SOURCE_DATE_EPOCH`.
    source_date_epoch: Option<u64>,
    /// The Helm repository client (CA files read).
    http: HttpFetcher,
    /// The registries' client (credentials and CA files read).
    registries: RegistryStore,
}

impl Settings {
    fn resolve(args: &BuildArgs, progress: &Progress) -> anyhow::Result<Settings> {
        let map = SourceMap::builtin();
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
        let split = match args.split.as_deref() {
            Some(s) => Some((crate::bundle::parts::parse_size(s)?, args.parity)),
            None if args.parity > 0 => {
                bail!("--parity needs --split SIZE (parity parts are parts of a split set)")
            }
            None => None,
        };
        // helm renders the chart: without one, nothing is downloaded.
        let helm = Helm::find(
            args.helm.as_deref(),
            std::env::var_os(super::env::PATH).as_deref(),
            &crate::helm::FOR_BUILD,
        )
        .context(
            "build needs helm to find the images the chart deploys (nothing was downloaded)",
        )?;
        super::check_helm_inputs(&args.values, &args.set)?;
        let signer = if args.dry_run || args.unsigned {
            None
        } else {
            super::signing_key(args.sign_key.as_deref(), true)?
        };
        let base = args.since.as_deref().map(Base::read).transpose()?;
        let output_dir = super::output_dir_of(args.output.as_deref(), !args.dry_run)?;
        let reg = Registry::new(RegistryOptions {
            plain_http_hosts: plain_hosts(args, &sources),
            ca_files: args.ca_file.clone(),
            credentials: super::registry_credentials()?,
            on_retry: Some(super::retry_reporter(progress)),
            ..Default::default()
        })?;
        let index = (!args.no_cache)
            .then(super::cache_dir)
            .transpose()?
            .map(|d| Index::new(&d));
        // Last: the only setting that creates something (the blob store's folders).
        let cache = args.cache.as_deref().map(BlobCache::open).transpose()?;
        Ok(Settings {
            helm,
            recorded_sources: if args.sources.is_empty() {
                map.default.clone()
            } else {
                args.sources.clone()
            },
            map,
            sources,
            platforms,
            split,
            signer,
            base,
            cache,
            index,
            output: args.output.clone(),
            output_dir,
            source_date_epoch: super::source_date_epoch()?,
            http: HttpFetcher::new(&args.ca_file, Default::default())?,
            registries: RegistryStore::new(Arc::new(reg), ""),
        })
    }

    /// Where the bundle goes: `-o`, else `koordinator-VERSION.tar[.gz]` in the output directory.
    fn output_path(&self, args: &BuildArgs, version: &str) -> PathBuf {
        self.output.clone().unwrap_or_else(|| {
            self.output_dir.join(match args.compress {
                Compression::None => format!("koordinator-{version}.tar"),
                Compression::Gzip => format!("koordinator-{version}.tar.gz"),
            })
        })
    }
}

/// Hosts spoken to over plain HTTP (`--plain-http`): custom sources and `--image` registries.
fn plain_hosts(args: &BuildArgs, sources: &[Origin]) -> Vec<String> {
    if !args.plain_http {
        return vec![];
    }
    let custom = sources.iter().filter_map(|s| match s {
        Origin::Custom(c) => Some(c.split('/').next().unwrap_or(c).to_string()),
        _ => None,
    });
    let fixed = args.images.iter().filter_map(|i| {
        crate::oci::ImageRef::parse(i)
            .ok()
            .map(|r| r.registry.clone())
    });
    custom.chain(fixed).collect()
}

/// The chart: fetched (or read from `--chart`), its CRDs, and the images helm renders it with.
async fn read_chart(
    args: &BuildArgs,
    settings: &Settings,
    progress: &Progress,
) -> anyhow::Result<(
    FetchedChart,
    ChartArchive,
    Vec<chart::Crd>,
    Vec<Wanted>,
    DiscoveryRecord,
)> {
    let fetched = match &args.chart {
        Some(file) => fetch::read_file(file)?,
        None => {
            fetch::from_repository(
                &settings.http,
                &args.repo,
                &args.version,
                args.allow_chart_digest_mismatch,
            )
            .await?
        }
    };
    let origin = match (&fetched.url, &args.chart) {
        (Some(url), _) => url.clone(),
        (None, Some(file)) => format!("--chart {}", file.display()),
        (None, None) => "the chart archive".into(),
    };
    if fetched.mismatch_allowed {
        progress.warn(format!("chart archive {origin} does not match the index digest {} (actual {}): going on as --allow-chart-digest-mismatch says; recorded in the bundle", fetched.index_digest.as_deref().unwrap_or("?"), fetched.digest.hex()));
    }
    progress.say(format!("chart    {origin} ({})", fetched.digest));
    let archive = ChartArchive::from_tgz(&fetched.bytes)
        .context("the chart archive is not a readable Helm chart")?;
    let meta = archive.meta();
    if meta.name != fetch::CHART {
        progress.warn(format!(
            "the chart is named {:?}, not koordinator",
            meta.name
        ));
    }
    // The chart's own files first (no outside program), then helm.
    let crds = chart::extract_crds(&archive)?;
    let (images, discovery) =
        super::discover::images(&settings.helm, args, &archive, &fetched.bytes, &origin)?;
    let mut wanted: Vec<Wanted> = images.iter().map(super::discover::wanted).collect();
    for e in &args.images {
        wanted.push(Wanted::manual(e)?);
    }
    wanted.sort_by(|a, b| a.ref_name.cmp(&b.ref_name));
    wanted.dedup_by(|a, b| a.ref_name == b.ref_name);
    progress.say(format!(
        "found    {} images and {} CRDs in chart {} {} (helm template, helm v{})",
        wanted.len(),
        crds.len(),
        meta.name,
        meta.version,
        settings.helm.version
    ));
    Ok((fetched, archive, crds, wanted, discovery))
}

/// The plan: the chart, its CRDs and every image resolved, in the bundle's own terms.
async fn make_plan(
    args: &BuildArgs,
    settings: Settings,
    progress: &Progress,
) -> anyhow::Result<(Settings, Plan)> {
    let (fetched, archive, crds, wanted, discovery) = read_chart(args, &settings, progress).await?;
    let resolved = resolve::resolve_all(
        &settings.registries,
        &settings.map,
        &settings.sources,
        &wanted,
        settings.platforms.as_deref(),
        args.jobs,
    )
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
    let meta = archive.meta();
    let created = plan::created_from(
        settings.source_date_epoch,
        fetched.index_created.as_deref(),
        fetch::archive_mtime(&fetched.bytes),
    );
    let input = PlanInput {
        created,
        chart: ChartInput {
            name: meta.name.clone(),
            version: meta.version.clone(),
            app_version: meta.app_version.clone(),
            description: meta.description.clone(),
            config_json: serde_json::to_vec(archive.chart_yaml_json())?.into(),
            archive: fetched.bytes.into(),
            digest: fetched.digest,
            url: fetched.url,
            index_digest: fetched.index_digest,
            mismatch_allowed: fetched.mismatch_allowed,
        },
        crds: crds.into_iter().map(crd_file).collect(),
        images: wanted.into_iter().zip(resolved).map(image_input).collect(),
        base: settings.base.clone(),
        platform_filter: settings.platforms.clone(),
        sources: settings.recorded_sources.clone(),
        overrides: overrides(args),
        discovery,
    };
    Ok((settings, Plan::new(input)?))
}

fn crd_file(c: chart::Crd) -> CrdFile {
    CrdFile {
        record: CrdRecord {
            file: format!("crds/{}", c.file_name),
            name: c.name,
            group: c.group,
            plural: c.plural,
            kind: c.kind,
            values_key: c.values_key,
            // Versions and sha256: read from the file by the plan.
            ..CrdRecord::default()
        },
        yaml: c.yaml.into_bytes().into(),
    }
}

fn image_input((w, r): (Wanted, Resolved)) -> ImageInput {
    ImageInput {
        ref_name: w.ref_name,
        component: w.component,
        repository: w.repository,
        tag: w.tag,
        original: w.original,
        source: r.source,
        source_ref: r.source_ref.to_string(),
        fallbacks: r.fallbacks,
        graph: r.graph,
    }
}

/// What the user fed to discovery: file names and `--set` keys, never values.
fn overrides(args: &BuildArgs) -> Overrides {
    Overrides {
        values_files: args
            .values
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().to_string()))
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
    }
}

/// Run the build; on SIGINT or SIGTERM, child processes (helm) are ended, and the build
/// says what it kept to resume (its `.partial`) and exits 130 or 143.
pub async fn run(args: BuildArgs) -> anyhow::Result<()> {
    let signals = super::interrupt_signals()?;
    let partial: Arc<Mutex<Option<PathBuf>>> = Arc::default();
    // Heard on a task of its own: parts of the build block their thread (helm runs to its
    // end), so the signal ends the children from there, and the build then stops.
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let got = signals.await;
        // Told first: a build that fails because its helm was killed is then known as
        // interrupted.
        let _ = tx.send(got);
        crate::child::kill_all();
    });
    let interrupted = |(signal, code): (&'static str, i32), partial: &Mutex<Option<PathBuf>>| {
        crate::child::kill_all();
        let path = partial.lock().ok().and_then(|p| p.clone());
        let kept = kept_text(path.as_deref());
        anyhow::Error::from(super::Interrupted { signal, kept, code })
    };
    tokio::select! {
        biased;
        Ok(got) = &mut rx => Err(interrupted(got, &partial)),
        r = build(args, partial.clone()) => match rx.try_recv() {
            // The build ended because its children were killed: the signal is the news.
            Ok(got) if r.is_err() => Err(interrupted(got, &partial)),
            _ => r,
        },
    }
}

/// What an interrupted build kept.
fn kept_text(partial: Option<&Path>) -> String {
    match partial.map(|p| (p, std::fs::metadata(p))) {
        Some((p, Ok(m))) => format!(
            "kept {} ({}) to resume: run the same command again; delete it to free the space",
            p.display(),
            human_bytes(m.len())
        ),
        _ => "nothing was written yet".into(),
    }
}

/// Blobs earlier bundles hold: the index of the build host (what it says of bundles moved or
/// changed is said here), `--since` and `--reuse`. Returns the bundles read to add to the
/// index.
fn donors(
    args: &BuildArgs,
    settings: &Settings,
    plan: &Plan,
    progress: &Progress,
) -> anyhow::Result<(Donors, Vec<reuse::Record>)> {
    let wanted = plan.carried.iter().map(|(d, _)| d.clone()).collect();
    let mut donors = Donors::default();
    if let Some(index) = &settings.index {
        match index.donors(&wanted) {
            Ok((d, notes)) => {
                donors = d;
                for n in notes {
                    progress.warn(n);
                }
            }
            Err(e) => progress.warn(format!("{e}: earlier bundles are not used this time")),
        }
    }
    let mut read = Vec::new();
    for (p, named) in args
        .since
        .iter()
        .map(|p| (p, false))
        .chain(args.reuse.iter().map(|p| (p, true)))
    {
        match reuse::blob_regions(p) {
            Ok(blobs) => {
                donors.add(p, &blobs, &wanted);
                read.push((p.clone(), blobs));
            }
            // `--since` may name a bundle manifest: not a source of blobs, nothing to say.
            Err(e) if named => progress.warn(format!("--reuse {e}")),
            Err(_) => {}
        }
    }
    Ok((donors, read))
}

/// The build itself; `partial` is told of the bundle's `.partial` file once it is known.
async fn build(args: BuildArgs, partial: Arc<Mutex<Option<PathBuf>>>) -> anyhow::Result<()> {
    let progress = Progress::new(Mode::detect(args.json));
    if let Some(since) = &args.since {
        super::bundle_arg(since)?;
    }
    let settings = Settings::resolve(&args, &progress)?;
    let (settings, plan) = make_plan(&args, settings, &progress).await?;
    let layout = layout::layout(&plan)?;
    let path = settings.output_path(&args, &plan.input.chart.version);
    let out = Output {
        path: &path,
        dir: &settings.output_dir,
        split: settings.split,
        compress: args.compress,
        signer: settings.signer.as_ref().map(|(sk, _)| sk),
        cache: settings.cache.as_ref(),
        donors: None,
        jobs: args.jobs,
    };
    if args.dry_run {
        // Laid out and measured as the real run does; only the disk's room is a warning here.
        let tar = emit::tar_layout(&plan, &layout, &out)?;
        match emit::check_disk(&plan, &out, tar.len()) {
            Err(pack::PackError::Write { source, .. }) => progress.warn(format!(
                "a build to {} would stop before downloading: {source}",
                path.display()
            )),
            other => other?,
        }
        return print_plan(&args, &plan, &layout.manifest, &path);
    }
    for l in atomic::leftovers(&path).unwrap_or_default() {
        progress.warn(if l.removed {
            format!("removed {} ({}), left by a build interrupted more than 7 days ago", l.path.display(), human_bytes(l.bytes))
        } else {
            format!("{} ({}) is left by an interrupted build of another output: run that build again to resume it, or delete it to free the space", l.path.display(), human_bytes(l.bytes))
        });
    }
    let (donors, read) = donors(&args, &settings, &plan, &progress)?;
    let out = Output {
        donors: Some(&donors),
        ..out
    };
    if let Ok(mut p) = partial.lock() {
        *p = atomic::partial_path(&path).ok();
    }
    let bar = progress.bytes("writing bundle", plan.counts.copied.bytes);
    let on = bar.clone();
    let w = emit::write(
        &plan,
        &layout,
        &settings.registries,
        &out,
        Arc::new(move |n| on.inc(n)),
    )
    .await?;
    bar.finish(&copied_line(&plan, &w.fetched));
    for n in &w.notes {
        progress.warn(n);
    }
    if let Some(index) = &settings.index {
        let mut add = read;
        add.extend(w.regions.clone().map(|r| (w.path.clone(), r)));
        if let Err(e) = index.update(&add, &w.refused, false) {
            progress.warn(format!(
                "{e}: this bundle is not indexed as a source of blobs for later builds"
            ));
        }
    }
    print_result(&args, &settings, &plan, &layout.manifest, &w)
}

/// What the copy into the bundle did, in the plan's terms: the configs and layers written (the
/// images', which the dry run counts as to download, and the chart artifact's two, written from
/// the chart archive), their bytes fresh (downloaded, or the chart's from memory) and from the
/// cache.
fn copied_line(plan: &Plan, fetched: &emit::Fetched) -> String {
    let c = &plan.counts;
    let chart = c.copied.blobs.saturating_sub(c.download.blobs);
    format!(
        "{} configs and layers written ({} of the images, {} of the chart artifact): {} downloaded, {} reused, {} kept from an interrupted run",
        c.copied.blobs,
        c.download.blobs,
        chart,
        human_bytes(fetched.downloaded_bytes),
        human_bytes(fetched.cached_bytes),
        human_bytes(fetched.resumed_bytes)
    )
}

/// The plan's numbers, in the words both the dry run and the real run print.
fn content_line(plan: &Plan) -> String {
    let c = &plan.counts;
    let mut s = format!(
        "chart {} {}, {} images, {} CRDs; {} blobs in the bundle ({}), {} of them to download ({})",
        plan.input.chart.name,
        plan.input.chart.version,
        c.images,
        c.crds,
        c.carried.blobs,
        human_bytes(c.carried.bytes),
        c.download.blobs,
        human_bytes(c.download.bytes)
    );
    if let Some(b) = &plan.input.base {
        s.push_str(&format!(
            "; {} left out, held since the {} bundle ({})",
            c.omitted.blobs,
            b.record.chart_version,
            human_bytes(c.omitted.bytes)
        ));
    }
    s
}

/// What was built (stdout, or one JSON document).
fn print_result(
    args: &BuildArgs,
    settings: &Settings,
    plan: &Plan,
    manifest: &crate::bundle::BundleManifest,
    w: &Written,
) -> anyhow::Result<()> {
    let (output, parts) = (&w.path, &w.parts);
    let pubkey = settings.signer.as_ref().map(|(_, p)| p.clone());
    if args.json {
        return super::print_json(&json!({
            "bundle": parts.first().unwrap_or(output), "parts": parts, "bytes": w.stats.bytes, "files": w.stats.files,
            "counts": plan.counts, "base": manifest.base,
            "chart": {"name": manifest.chart.name, "version": manifest.chart.version, "digest": manifest.chart.digest},
            "images": manifest.images, "crds": manifest.crds.len(), "fetch": w.fetched, "signed": pubkey.is_some(),
            "discovery": manifest.discovery, "created": manifest.created,
            "publicKey": pubkey,
        }));
    }
    println!(
        "bundle   {} ({})",
        output.display(),
        human_bytes(w.stats.bytes)
    );
    if !parts.is_empty() {
        println!(
            "parts    {} {}: {} ... (verify, inspect, load and serve take any part)",
            parts.len(),
            crate::text::plural(parts.len(), "part", "parts"),
            parts[0].display()
        );
    }
    println!("content  {}", content_line(plan));
    let from = match (&settings.cache, &settings.index) {
        (Some(c), _) => format!("earlier bundles and the blob store {}", c.root().display()),
        (None, Some(i)) => format!("earlier bundles (indexed in {})", i.path().display()),
        (None, None) => "bundles named with --since/--reuse (--no-cache)".into(),
    };
    println!(
        "copied   {} (reused from {from})",
        copied_line(plan, &w.fetched),
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
    plan: &Plan,
    manifest: &crate::bundle::BundleManifest,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    let chart = &plan.input.chart;
    if args.json {
        return super::print_json(&json!({
            "dryRun": true, "bundle": path,
            "chart": {"name": chart.name, "version": chart.version, "digest": chart.digest, "url": chart.url},
            "images": manifest.images, "crds": manifest.crds.iter().map(|c| &c.name).collect::<Vec<_>>(),
            "discovery": manifest.discovery, "created": manifest.created,
            "counts": plan.counts,
        }));
    }
    println!("plan     {} ({})", path.display(), chart.digest);
    for r in &manifest.images {
        println!(
            "  {:44} {}  from {:16} [{}] {}",
            r.ref_name,
            r.digest,
            r.source,
            r.platforms.join(", "),
            human_bytes(r.total_size)
        );
    }
    println!("content  {}", content_line(plan));
    println!("         nothing was downloaded but manifests (--dry-run)");
    Ok(())
}
