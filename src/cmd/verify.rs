//! `koord-bundle verify`: signature first, then every byte; no network.

use crate::bundle::reader;
use crate::cli::VerifyArgs;
use crate::progress::{Mode, Progress};
use anyhow::Context as _;

/// Verify a bundle.
pub async fn run(args: VerifyArgs) -> anyhow::Result<()> {
    let progress = Progress::new(Mode::detect(args.json));
    super::bundle_arg(&args.bundle)?;
    super::check_not_truncated(&args.bundle)?;
    let pk = if args.insecure_skip_signature {
        progress.warn("--insecure-skip-signature: the signature is NOT checked; only integrity is");
        None
    } else {
        Some(super::public_key(args.key.as_deref())?)
    };
    let total = std::fs::metadata(&args.bundle)
        .with_context(|| format!("cannot read {}", args.bundle.display()))?
        .len();
    let bar = progress.bytes("verifying", total);
    let policy = match &pk {
        Some(k) => reader::SignaturePolicy::Require(k),
        None => reader::SignaturePolicy::Skip,
    };
    let report = crate::bundle::source::verify(&args.bundle, policy, &|n| bar.inc(n)).await?;
    bar.finish("done");
    let set = report.file.as_ref().and_then(|f| f.set.clone());
    // The parity parts too: damage there lowers what the set can still rebuild.
    let parity_damage = match &set {
        Some(s) => {
            let parity: u64 = s.geometry.sizes[s.geometry.k..].iter().sum();
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
            let sig = pk.as_ref().and_then(|k| s.good_signature(k).ok().flatten());
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
    if args.json {
        let m = report.manifest.as_ref();
        return super::print_json(&serde_json::json!({
            "ok": true, "bundle": report.bundle, "files": report.files, "blobs": report.blobs,
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
        }));
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
    Ok(())
}
