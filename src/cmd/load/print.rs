//! What `load` prints: the checks' findings, its summary and `--json`'s document.

use super::settings::Settings;
use crate::bundle::source::BundleSource;
use crate::bundle::BundleManifest;
use crate::cli::LoadArgs;
use crate::cluster;
use crate::copy;
use crate::helm;
use crate::load;
use crate::oci::Target;
use crate::progress::Progress;
use serde_json::json;
use std::path::PathBuf;

/// Findings, one line each, by level: `pre-flight INFO [...]`, `warning: pre-flight WARN
/// [...]`, `error: pre-flight FAIL [...]` (a Fail was printed as a warning).
pub(super) fn print_findings_of(findings: &[cluster::Finding], progress: &Progress) {
    for f in findings {
        let line = format!(
            "pre-flight {} [{}] {}{}",
            f.level,
            f.check,
            f.message,
            f.fix
                .as_ref()
                .map(|x| format!(" — fix: {x}"))
                .unwrap_or_default()
        );
        match f.level {
            cluster::Level::Info => progress.say(line),
            cluster::Level::Warn => progress.warn(line),
            cluster::Level::Fail => progress.error(line),
        }
    }
}

/// What a load did, for its report.
pub(super) struct Outcome<'a> {
    pub(super) args: &'a LoadArgs,
    pub(super) settings: &'a Settings,
    pub(super) src: &'a BundleSource,
    pub(super) pre: &'a load::Preflight,
    pub(super) planned: &'a load::Planned,
    pub(super) rendered: Option<&'a load::Rendered>,
    pub(super) checked: &'a crate::cmd::registry_check::Checked,
    pub(super) stats: &'a copy::Stats,
    pub(super) rehashed: bool,
    pub(super) signed: Option<serde_json::Value>,
    pub(super) policies: Vec<PathBuf>,
    pub(super) done: load::Installed,
}

/// The load's report: `--json`'s document, else its summary lines.
pub(super) fn report(out: Outcome<'_>) -> anyhow::Result<()> {
    let Outcome {
        args,
        settings,
        src,
        pre,
        planned,
        rendered,
        checked,
        stats,
        rehashed,
        signed,
        policies,
        done,
    } = out;
    let (target, manifest) = (&settings.opts.target, src.manifest());
    let (preflight, namespace) = (&pre.report, &pre.namespace);
    let chart_repo = format!("charts/{}", manifest.chart.name);
    let chart_target = target.image(&chart_repo, &manifest.chart.version)?;
    let plan = &planned.plan;
    let existing = preflight.as_ref().and_then(|r| r.existing_release.as_ref());
    let bundle = settings.bundle.path();
    if args.json {
        return crate::cmd::print_json(&json!({
            "bundle": bundle, "registry": target.host_and_prefix(), "dryRun": args.dry_run,
            "verified": {"files": src.report().files, "blobs": src.report().blobs, "bytes": src.report().bytes, "signature": src.report().signature_verified,
                         "blobsRehashed": rehashed},
            "push": stats,
            "signed": signed,
            "policies": policies,
            "harbor": checked.json(),
            "chart": {"ref": chart_target.to_string(), "version": manifest.chart.version},
            "images": images_json(manifest, target, args.dry_run, rendered, done.installed),
            "preflight": preflight,
            "upgrade": rendered.map(|r| &r.upgrade),
            "helm": {"command": done.command, "renderedImages": rendered.map(|r| &r.images),
                     "installed": done.installed, "upgraded": done.installed && existing.is_some(),
                     "namespace": namespace, "valuesFile": done.kept_values,
                     "values": serde_yaml_ng::to_string(&plan.generated_values).ok(),
                     "releaseValues": rendered.map(|r| &r.release.config),
                     "previousValues": existing.and_then(|r| r.values.as_ref())},
        }));
    }
    let verb = if args.dry_run { "would push" } else { "pushed" };
    crate::say!(
        "registry {}: {}; manifests {verb} {}, present {}",
        target.host_and_prefix(),
        load::blob_counts(stats, args.dry_run),
        stats.manifests_pushed,
        stats.manifests_skipped
    );
    crate::say!(
        "chart    oci://{}/{chart_repo} --version {}",
        target.host_and_prefix(),
        manifest.chart.version
    );
    if let Some(s) = &signed {
        crate::say!(
            "signed   {} images with the cosign key {} ({} signatures or attestations pushed, {} there already; {}); check one with: cosign verify --key cosign.pub --insecure-ignore-tlog=true IMAGE@DIGEST",
            s["images"].as_array().map_or(0, Vec::len),
            settings.cosign.as_ref().map(|k| k.path().display().to_string()).unwrap_or_default(),
            s["pushed"],
            s["present"],
            s["referrersSaid"].as_str().unwrap_or_default()
        );
    }
    if let Some((_, files)) = &settings.policies {
        for (path, file) in policies.iter().zip(files) {
            crate::say!(
                "policy   {} for {}: kubectl apply -f it where that engine runs (see the README's \"Signed for admission\")",
                path.display(),
                file.engine.describe()
            );
        }
    }
    if let Some(c) = &done.command {
        crate::say!("helm     {c}");
    }
    if let (Some(f), Some(dir)) = (&done.kept_values, &done.kept_dir) {
        crate::say!(
            "values   {} (kept next to the bundle for the command above, mode 0600, in a 0700 folder; no password in it, but the site's values are: delete it when done, rm -r {})",
            f.display(),
            dir.display()
        );
    }
    if let Some(r) = rendered {
        print_rendered(r, args, existing.is_some(), &target.host_and_prefix());
    }
    if done.installed {
        crate::say!(
            "{} release {} in namespace {} (Koordinator's objects in {})",
            if existing.is_some() {
                "upgraded"
            } else {
                "installed"
            },
            args.kube.release,
            namespace,
            load::CHART_NAMESPACE
        );
    }
    Ok(())
}

/// Per image of the bundle, what this load did with it (`--json`'s `images`; the bundle's BOM
/// cannot know it): `pushedAs` the reference and digest the registry holds it under (absent in a
/// dry run), `renderedAs` how the rendered release names it (absent when nothing was rendered:
/// no cluster), `pinned` whether every such name is its digest (false under `--no-pin`, with a
/// helm that skips the post-renderer, or when the release does not use it), `installedAs` the
/// name the installed release runs it by (absent unless helm installed it).
fn images_json(
    manifest: &BundleManifest,
    target: &Target,
    dry_run: bool,
    rendered: Option<&load::Rendered>,
    installed: bool,
) -> serde_json::Value {
    let registry = target.host_and_prefix();
    let images = manifest.images.iter().map(|i| {
        let tagged = format!("{registry}/{}", i.ref_name);
        let pinned = crate::oci::pinned(&tagged, i.digest.as_str());
        let names: Option<Vec<&String>> = rendered.map(|r| {
            r.images
                .iter()
                .filter(|x| **x == tagged || **x == pinned)
                .collect()
        });
        let all_pinned = names
            .as_ref()
            .is_some_and(|n| !n.is_empty() && n.iter().all(|x| **x == pinned));
        let mut v = json!({"ref": i.ref_name, "digest": i.digest, "pinned": all_pinned});
        if !dry_run {
            v["pushedAs"] = pinned.clone().into();
        }
        if let Some(n) = &names {
            v["renderedAs"] = json!(n);
            if installed && !n.is_empty() {
                v["installedAs"] = if all_pinned { pinned } else { tagged }.into();
            }
        }
        v
    });
    serde_json::Value::Array(images.collect())
}

/// What the render before the push found: the images, the values the release will hold, and
/// (listed in a dry run, counted otherwise) what changes in the cluster.
fn print_rendered(r: &load::Rendered, args: &LoadArgs, upgrade: bool, registry: &str) {
    use cluster::upgrade::Action;
    let pinned = r.images.iter().filter(|i| i.contains("@sha256:")).count();
    crate::say!(
        "rendered {} images, all in the bundle under {registry}{}",
        r.images.len(),
        match pinned {
            0 => String::new(),
            n if n == r.images.len() => ", each pinned to the bundle's digest".to_string(),
            n => format!(", {n} pinned to the bundle's digest"),
        }
    );
    if args.dry_run {
        for i in &r.images {
            crate::say!("  {}", crate::text::printable(i));
        }
    }
    if upgrade {
        let how = match super::settings::values_mode(args) {
            helm::ValuesMode::Keep => "the release's values, then this run's over them",
            helm::ValuesMode::Reset => "this run's values only (--reset-values)",
            helm::ValuesMode::Reuse => "helm's --reuse-values",
        };
        let yaml = serde_yaml_ng::to_string(&r.release.config).unwrap_or_default();
        crate::say!("values   the release will hold ({how}):");
        for line in yaml.lines() {
            crate::say!("           {}", crate::text::terminal_safe(line));
        }
    }
    if let Some(why) = &r.upgrade.changes_unknown {
        // say! makes the whole line terminal-safe; printable would also cut the reason.
        crate::say!("changes  not known: {why}");
        return;
    }
    let changes = &r.upgrade.changes;
    let count = |a: Action| changes.iter().filter(|c| c.action == a).count();
    let labels_only = changes.iter().filter(|c| c.only_metadata).count();
    // Fields the cluster fills in (copied into the render by the chart's `lookup`) are not
    // changes: an object that differs only in them is counted apart, its fields listed apart.
    let filled_only = changes.iter().filter(|c| c.only_server_filled()).count();
    crate::say!(
        "changes  {} added, {} changed ({labels_only} of them only in labels or annotations), {} removed{}{}",
        count(Action::Add),
        count(Action::Change) - filled_only,
        count(Action::Remove),
        if filled_only > 0 {
            format!(
                "; {filled_only} more differ only in fields the cluster fills in (listed apart)"
            )
        } else {
            String::new()
        },
        if args.dry_run { ":" } else { "" }
    );
    if !args.dry_run {
        return;
    }
    for c in changes
        .iter()
        .filter(|c| !c.only_metadata && !c.only_server_filled())
    {
        let sign = match c.action {
            Action::Add => "+",
            Action::Change => "~",
            Action::Remove => "-",
        };
        crate::say!("  {sign} {}", crate::text::terminal_safe(&c.subject()));
        for d in &c.details {
            crate::say!("      {}", crate::text::terminal_safe(d));
        }
    }
    let filled: Vec<_> = changes
        .iter()
        .filter(|c| !c.server_filled.is_empty())
        .collect();
    if !filled.is_empty() {
        crate::say!("filled   by the cluster, not changes (the chart copies them from the live objects; helm's record of the release does not have them):");
        for c in filled {
            crate::say!(
                "  {}: {}",
                crate::text::terminal_safe(&c.subject()),
                crate::text::terminal_safe(&c.server_filled.join(", "))
            );
        }
    }
}
