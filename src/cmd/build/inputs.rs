//! What `build`'s plan is made from: the chart (fetched and its CRDs read), the images (resolved
//! at their sources), the overrides, and the blobs earlier bundles hold. Gathered here because it
//! needs chart and sources together, which only `cmd` may use; decided in `bundle::plan`.

use super::settings::Settings;
use crate::bundle::manifest::{CrdRecord, DiscoveryRecord, Overrides};
use crate::bundle::plan::{self, ChartInput, CrdFile, ImageInput, Plan, PlanInput};
use crate::bundle::reuse::{self, Donors};
use crate::chart::fetch::{self, FetchedChart};
use crate::chart::{self, ChartArchive};
use crate::cli::BuildArgs;
use crate::progress::Progress;
use crate::sources::resolve::{self, Resolved, Wanted};
use anyhow::Context as _;

/// The chart: fetched (or read from `--chart`), its CRDs, and the images helm renders it with.
pub(super) async fn read_chart(
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
        match fetched.index_digest.as_deref() {
            Some(d) => progress.warn(format!("chart archive {origin} does not match the index digest {d} (actual {}): going on as --allow-chart-digest-mismatch says; recorded in the bundle", fetched.digest.hex())),
            None => progress.warn(format!("chart archive {origin} is not checked: the repository index gives no digest for it (actual {}); going on as --allow-chart-digest-mismatch says; recorded in the bundle", fetched.digest.hex())),
        }
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
        crate::cmd::discover::images(&settings.helm, args, &archive, &fetched.bytes, &origin)?;
    let mut wanted: Vec<Wanted> = images.iter().map(crate::cmd::discover::wanted).collect();
    wanted.sort_by(|a, b| a.ref_name.cmp(&b.ref_name));
    wanted.dedup_by(|a, b| a.ref_name == b.ref_name);
    let in_chart = wanted.len();
    for e in &args.images {
        wanted.push(Wanted::manual(e)?);
    }
    wanted.sort_by(|a, b| a.ref_name.cmp(&b.ref_name));
    wanted.dedup_by(|a, b| a.ref_name == b.ref_name);
    let manual = wanted.len() - in_chart;
    progress.say(format!(
        "found    {in_chart} images and {} CRDs in chart {} {} (helm template, helm v{}){}",
        crds.len(),
        meta.name,
        meta.version,
        settings.helm.version,
        match manual {
            0 => String::new(),
            n => format!(", and {n} added with --image"),
        }
    ));
    Ok((fetched, archive, crds, wanted, discovery))
}

/// The plan: the chart, its CRDs and every image resolved, in the bundle's own terms.
pub(super) async fn make_plan(
    args: &BuildArgs,
    settings: Settings,
    progress: &Progress,
) -> anyhow::Result<(Settings, Plan)> {
    let upstream_key = super::signatures::key(args)?;
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
    let mut images: Vec<ImageInput> = wanted.into_iter().zip(resolved).map(image_input).collect();
    super::signatures::carry(
        args,
        &settings,
        upstream_key.as_ref(),
        &mut images,
        progress,
    )
    .await?;
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
        images,
        base: settings.base.clone(),
        platform_filter: settings.platforms.clone(),
        sources: settings.recorded_sources.clone(),
        overrides: overrides(args),
        discovery,
        tools: match args.with_tools {
            true => super::tools::collect(&settings.helm, settings.platforms.as_deref(), progress)?,
            false => vec![],
        },
    };
    Ok((settings, Plan::new(input)?))
}

pub(super) fn crd_file(c: chart::Crd) -> CrdFile {
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

pub(super) fn image_input((w, r): (Wanted, Resolved)) -> ImageInput {
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
        signatures: Vec::new(),
    }
}

/// What the user fed to discovery: file names and `--set` keys, never values.
pub(super) fn overrides(args: &BuildArgs) -> Overrides {
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

/// Blobs earlier bundles hold: the index of the build host (what it says of bundles moved or
/// changed is said here), `--since` and `--reuse`. Returns the bundles read to add to the
/// index.
pub(super) fn donors(
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
