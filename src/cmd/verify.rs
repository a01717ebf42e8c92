//! `koord-bundle verify`: signature first, then every byte; no network.

use crate::bundle::OpenedBundle;
use crate::cli::VerifyArgs;
use crate::cluster;
use crate::progress::{Mode, Progress};
use anyhow::Context as _;

/// Verify a bundle.
pub async fn run(args: VerifyArgs) -> anyhow::Result<()> {
    let progress = Progress::new(Mode::detect(args.json));
    super::bundle_arg(&args.bundle)?;
    // Opened once: the completeness check, the size and the verification read the same handle.
    let opened = OpenedBundle::open(&args.bundle);
    if let Ok(b) = &opened {
        b.check_complete()?;
    }
    let pk = super::trusted_key(&args.signature, &progress)?;
    let mut b = super::opened(&args.bundle, opened, None)?;
    b.set_trust(pk);
    let bar = progress.bytes("verifying", b.size());
    let report = crate::bundle::source::verify_opened(&b, &|n| bar.inc(n)).await?;
    bar.finish("done");
    let set = report.file.as_ref().and_then(|f| f.set.clone());
    // The parity parts too: damage there lowers what the set can still rebuild.
    let parity_damage = match &set {
        Some(s) => {
            let parity = s.data_bytes(s.data_parts()..s.part_count());
            let bar = progress.bytes("checking parity parts", parity);
            let d = tokio::task::block_in_place(|| s.check_parity(&|n| bar.inc(n)));
            bar.finish("done");
            d
        }
        None => Vec::new(),
    };
    // A part whose own copy of the header is damaged, its part line intact: every byte of
    // the bundle still verifies (against an intact copy) and the set opens from any other part,
    // so this stays a warning and the exit code 0, as a block rebuilt from parity does; but
    // `repair` writes that part back, and verify says so.
    let header_damage = match &set {
        Some(s) => {
            let sig = b.key().and_then(|k| s.good_signature(k).ok().flatten());
            s.damaged_header_copies(sig.as_deref())
        }
        None => Vec::new(),
    };
    if let Some(bf) = &report.file {
        super::sets::tell_repairs(&progress, bf);
    }
    for d in &header_damage {
        progress.warn(format!(
            "{} (part {}): its copy of the header is damaged ({}); the bundle's data is whole and every other part carries the header (koord-bundle repair {} writes it back)",
            d.path.display(),
            d.part,
            d.reason,
            args.bundle.display()
        ));
    }
    for d in &parity_damage {
        progress.warn(format!(
            "{d}: a parity part (koord-bundle repair {} writes it back)",
            args.bundle.display()
        ));
    }
    let cluster = match (&report.manifest, args.cluster) {
        (Some(m), true) => Some(check_cluster(&args, m).await?),
        (None, true) => anyhow::bail!(
            "{} has no koord-bundle.json: nothing to check the cluster against",
            args.bundle.display()
        ),
        _ => None,
    };
    if args.json {
        let m = report.manifest.as_ref();
        super::print_json(&serde_json::json!({
            "ok": cluster.as_ref().is_none_or(|c| c.ok()), "bundle": report.bundle, "files": report.files, "blobs": report.blobs,
            "bytes": report.bytes, "blobBytes": report.manifest.as_ref().map(|m| m.blobs.bytes),
            "manifests": report.manifests,
            "signature": {"verified": report.signature_verified, "keyId": report.signature.as_ref().map(|s| &s.key_id),
                          "trustedComment": report.signature.as_ref().map(|s| &s.trusted_comment)},
            "chart": m.map(|m| serde_json::json!({"name": m.chart.name, "version": m.chart.version})),
            "images": m.map(|m| m.images.len()),
            "expectedOnSite": m.map(|m| &m.omitted_blobs),
            "split": report.file.as_ref().map(|f| f.is_split()),
            "repaired": set.as_ref().map(|s| s.repairs()).unwrap_or_default(),
            "parityDamage": parity_damage, "headerDamage": header_damage,
            "notes": set.as_ref().map(|s| s.notes.clone()).unwrap_or_default(),
            "cluster": cluster,
        }))?;
        return cluster_verdict(cluster.as_ref(), true);
    }
    match (&report.signature, report.signature_verified) {
        (Some(s), true) => crate::say!("signature  OK (key {}; {})", s.key_id, s.trusted_comment),
        _ => crate::say!("signature  NOT CHECKED"),
    }
    crate::say!(
        "files      {} OK, {} in all",
        report.files,
        crate::text::human_bytes(report.bytes)
    );
    if let Some(m) = &report.manifest {
        crate::say!("blobs      {}", super::blobs_in_bundle(&m.blobs));
    }
    let left_out = report
        .manifest
        .as_ref()
        .filter(|m| m.base.is_some())
        .map(|m| m.omitted_blobs.len());
    crate::say!(
        "layout     {} manifests, {}",
        report.manifests,
        match left_out {
            Some(n) => format!("every referenced blob present but the {n} an incremental bundle leaves out (below)"),
            None => "every referenced blob present".into(),
        }
    );
    if let Some(m) = &report.manifest {
        crate::say!(
            "chart      {} {}, {} images, {} CRDs",
            m.chart.name,
            m.chart.version,
            m.images.len(),
            m.crds.len()
        );
    }
    if let Some(m) = report.manifest.as_ref().filter(|m| m.base.is_some()) {
        let bytes = m
            .omitted_blobs
            .iter()
            .fold(0u64, |a, o| a.saturating_add(o.size));
        crate::say!(
            "expected   incremental bundle: {} blobs ({bytes} bytes) left out, which the target registry must already hold: load {} first",
            m.omitted_blobs.len(),
            m.base.as_ref().map(|b| b.describe()).unwrap_or_default()
        );
        for o in &m.omitted_blobs {
            crate::say!("  {} ({} bytes)", o.digest, o.size);
        }
    }
    crate::say!("bundle {} verified", args.bundle.display());
    if let Some(c) = &cluster {
        print_cluster(c);
    }
    cluster_verdict(cluster.as_ref(), false)
}

/// The release's containers next to the bundle's images ([`cluster::running`]).
async fn check_cluster(
    args: &VerifyArgs,
    m: &crate::bundle::manifest::BundleManifest,
) -> anyhow::Result<cluster::running::Report> {
    let carried: Vec<cluster::running::Carried> = m
        .images
        .iter()
        .map(|i| cluster::running::Carried {
            reference: i.ref_name.clone(),
            digest: i.digest.to_string(),
            platforms: i
                .manifests
                .iter()
                .filter(|p| p.attestation_of.is_none())
                .filter_map(|p| Some((p.digest.to_string(), p.platform.clone()?)))
                .collect(),
        })
        .collect();
    let kube = &args.kube;
    let (client, _, _) = super::kube_client(kube.kubeconfig.as_deref(), kube.context.as_deref())?;
    let namespace = kube
        .namespace
        .as_deref()
        .unwrap_or(crate::load::DEFAULT_RELEASE_NAMESPACE);
    let r = cluster::running::check(&client, namespace, &kube.release, &carried)
        .await
        .context("cannot check the cluster against the bundle")?;
    Ok(r)
}

fn print_cluster(r: &cluster::running::Report) {
    use cluster::running::Verdict as V;
    crate::say!(
        "cluster    release {} in {} (revision {}, {}, chart {}): {} workloads, {} containers",
        r.release,
        r.namespace,
        r.revision,
        r.status,
        r.chart_version.as_deref().unwrap_or("?"),
        r.workloads.len(),
        r.counts.total()
    );
    if let Some(d) = r.deployed_revision {
        crate::say!(
            "           the newest revision is not deployed: the workloads of revision {d}, the last deployed, are judged too (what helm applied of it may still run)"
        );
    }
    for p in &r.problems {
        crate::say!(
            "  {} {}: {}",
            if p.failure {
                "FAILED     "
            } else {
                "CANNOT TELL"
            },
            p.subject,
            p.message
        );
    }
    for c in &r.containers {
        let running = c.running.as_deref().unwrap_or("-");
        let expected = c.expected.as_deref().unwrap_or("an image of the bundle");
        let line = match c.verdict {
            V::Carried => format!(
                "OK          {} {}: expected {expected}, found {running} ({} of {}){}",
                c.pod,
                c.container,
                c.matched.as_deref().unwrap_or_default(),
                c.bundle_image.as_deref().unwrap_or_default(),
                if c.spec_pinned {
                    ""
                } else {
                    "; its spec names it by tag, not by the bundle's digest (load pins it)"
                }
            ),
            V::Differs => format!(
                "DIFFERS     {} {}: expected {expected}, found {running} (spec {})",
                c.pod, c.container, c.spec
            ),
            V::NotStarted => format!(
                "NOT STARTED {} {}: expected {expected}, found no image running yet (spec {}): check again once it runs",
                c.pod, c.container, c.spec
            ),
            V::NotBundled => format!(
                "NOT BUNDLED {} {}: expected {expected}, found {} (running {running}), which is not an image of the bundle",
                c.pod,
                c.container,
                c.spec
            ),
        };
        crate::say!("  {line}");
    }
    if r.omitted > 0 {
        crate::say!(
            "  ... and {} more containers, counted in the verdict but not shown",
            r.omitted
        );
    }
    crate::say!("verdict    {}", r.verdict.line);
}

/// Exit 0 only when every container of the release runs a digest the bundle carries; 1 when
/// one does not (or a workload is missing, or there is none); 4 when nothing failed but not
/// everything could be told (a container not started).
fn cluster_verdict(r: Option<&cluster::running::Report>, json: bool) -> anyhow::Result<()> {
    use cluster::running::{NotVerified, Outcome, Verdict as V};
    let Some(r) = r.filter(|r| !r.ok()) else {
        return Ok(());
    };
    if json {
        // The report was the JSON: the error goes to stderr only.
        super::set_json_errors(false);
    }
    let wrong: Vec<String> = r
        .containers
        .iter()
        .filter(|c| matches!(c.verdict, V::Differs | V::NotBundled))
        .map(|c| {
            format!(
                "{} {}: expected {}, found {} (running {})",
                c.pod,
                c.container,
                c.expected.as_deref().unwrap_or("an image of the bundle"),
                c.spec,
                c.running.as_deref().unwrap_or("nothing yet")
            )
        })
        .chain(
            r.problems
                .iter()
                .filter(|p| p.failure)
                .map(|p| format!("{}: {}", p.subject, p.message)),
        )
        .collect();
    // The first few named (a DaemonSet differs on every node): the rest are in the report.
    let more = wrong.len().saturating_sub(12);
    let named = if wrong.is_empty() {
        String::new()
    } else {
        format!(
            ": {}{}",
            wrong[..wrong.len().min(12)].join("; "),
            if more > 0 {
                format!("; and {more} more (above)")
            } else {
                String::new()
            }
        )
    };
    let could_not_tell = r.verdict.outcome == Outcome::CouldNotTell;
    let message = if could_not_tell {
        format!(
            "the cluster could not be verified against the bundle: {}; check again once every container runs (exit code 4: could not tell)",
            r.verdict.line
        )
    } else {
        format!(
            "the release does not run what the bundle carries: {}{named}; load the bundle again (its images are pinned by digest), delete the pods that run another image, or find what replaced them",
            r.verdict.line
        )
    };
    Err(NotVerified {
        message,
        could_not_tell,
    }
    .into())
}
