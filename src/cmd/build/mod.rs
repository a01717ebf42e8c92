//! `koord-bundle build`: settings, then chart → images → [`Plan`] → bundle. What the bundle
//! holds is decided in `bundle::plan` and `bundle::layout`, where it is written in
//! `bundle::emit`. Here: `settings` resolves the flags and the environment before any I/O,
//! `inputs` gathers what the plan is made from, and this file runs the build and prints.

mod inputs;
mod settings;
mod signatures;
mod tools;

use crate::bundle::emit::{self, Output, Written};
use crate::bundle::layout;
use crate::bundle::pack;
use crate::bundle::plan::Plan;
use crate::cli::BuildArgs;
use crate::progress::{Mode, Progress};
use crate::text::human_bytes;
use inputs::{donors, make_plan};
use serde_json::json;
use settings::Settings;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

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
    let interrupted = |signal: crate::exit::Signal, partial: &Mutex<Option<PathBuf>>| {
        crate::child::kill_all();
        let path = partial.lock().ok().and_then(|p| p.clone());
        let kept = kept_text(path.as_deref());
        anyhow::Error::from(super::Interrupted { signal, kept })
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
        // Interrupted before the output was known (the chart still being resolved): this run
        // wrote nothing, and a `.partial` an earlier run left is not touched.
        _ => "nothing was written yet by this run (a .partial an earlier run left is kept for a resume)"
            .into(),
    }
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
    for l in koord_splitset::leftovers(&path).unwrap_or_default() {
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
        *p = koord_splitset::partial_path(&path).ok();
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

/// What the copy into the bundle did, counting what [`content_line`] counts: the configs and
/// layers written (the images' and the chart artifact's two) and their bytes, split by where
/// they came from: downloaded (or, the chart artifact's, written from the chart archive),
/// reused from earlier bundles or the cache, kept from an interrupted run. (It said `26 …
/// written` after a content line's `24 of them to download`: the images' alone, planned for an
/// empty cache.)
fn copied_line(plan: &Plan, fetched: &emit::Fetched) -> String {
    let c = &plan.counts;
    format!(
        "{} written ({}): {} downloaded or written from the chart archive, {} reused, {} kept from an interrupted run",
        configs_and_layers(c.copied.blobs),
        human_bytes(c.copied.bytes),
        human_bytes(fetched.downloaded_bytes),
        human_bytes(fetched.cached_bytes),
        human_bytes(fetched.resumed_bytes)
    )
}

/// `N configs and layers` (`1 config or layer`).
fn configs_and_layers(n: usize) -> String {
    format!(
        "{n} {}",
        crate::text::plural(n, "config or layer", "configs and layers")
    )
}

/// The plan's numbers, in the words both the dry run and the real run print: the bundle's
/// blobs, and of them the manifests and the configs and layers that the copy writes (the
/// images' and the chart artifact's), the same number and bytes [`copied_line`] counts.
fn content_line(plan: &Plan) -> String {
    let c = &plan.counts;
    let chart = c.copied.blobs.saturating_sub(c.download.blobs);
    let mut s = format!(
        "chart {} {}, {} images, {} CRDs; {} blobs in the bundle ({}): {} {} and {} ({}; {} of the images, {} of the chart artifact)",
        plan.input.chart.name,
        plan.input.chart.version,
        c.images,
        c.crds,
        c.carried.blobs,
        human_bytes(c.carried.bytes),
        c.manifests,
        crate::text::plural(c.manifests, "manifest", "manifests"),
        configs_and_layers(c.copied.blobs),
        human_bytes(c.copied.bytes),
        c.download.blobs,
        chart,
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
            "publicKey": pubkey, "tools": manifest.tools,
        }));
    }
    crate::say!(
        "bundle   {} ({})",
        output.display(),
        human_bytes(w.stats.bytes)
    );
    if !parts.is_empty() {
        crate::say!(
            "parts    {} {}: {} ... (verify, inspect, load and serve take any part)",
            parts.len(),
            crate::text::plural(parts.len(), "part", "parts"),
            parts[0].display()
        );
    }
    crate::say!("content  {}", content_line(plan));
    let from = match (&settings.cache, &settings.index) {
        (Some(c), _) => format!("earlier bundles and the blob store {}", c.root().display()),
        (None, Some(i)) => format!("earlier bundles (indexed in {})", i.path().display()),
        (None, None) => "bundles named with --since/--reuse (--no-cache)".into(),
    };
    crate::say!(
        "copied   {} (reused from {from})",
        copied_line(plan, &w.fetched),
    );
    if let Some(t) = crate::bundle::tools::summary(manifest) {
        crate::say!("tools    {t}: a site with neither runs them from the bundle (README: 'One file crosses')");
    }
    // What to verify: the bundle, or with --split one of its parts (the bundle's own name
    // is never written then).
    let named = parts.first().unwrap_or(output);
    match pubkey {
        Some(p) => crate::say!("signed   copy the public key {} to the loading site: koord-bundle verify {} --key koord-bundle.pub", p.display(), named.display()),
        None => crate::say!("signed   NO (--unsigned): loading needs --insecure-skip-signature"),
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
    crate::say!("plan     {} ({})", path.display(), chart.digest);
    for r in &manifest.images {
        crate::say!(
            "  {:44} {}  from {:16} [{}] {}",
            r.ref_name,
            r.digest,
            r.source,
            r.platforms.join(", "),
            human_bytes(r.total_size)
        );
    }
    crate::say!("content  {}", content_line(plan));
    // What a build with an empty cache downloads; a real run says what it took from where.
    crate::say!(
        "         the images' {} ({}) to download from their registries, less what earlier bundles or the blob cache hold; nothing was downloaded but manifests (--dry-run)",
        plan.counts.download.blobs,
        human_bytes(plan.counts.download.bytes)
    );
    Ok(())
}
