//! `koord-bundle inspect`: the head of a bundle, no verification.

use crate::bundle::{reader, sign, BundleManifest};
use crate::cli::InspectArgs;
use anyhow::Context as _;

/// Show what a bundle holds.
pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    let progress = crate::progress::Progress::new(crate::progress::Mode::detect(args.json));
    super::bundle_arg(&args.bundle)?;
    if let Some(out) = &args.manifest {
        super::output_dir_of(Some(out), true)?;
        super::refuse_existing(out, args.force)?;
    }
    let bf = crate::bundle::parts::BundleFile::open(&args.bundle).map_err(|source| {
        reader::VerifyError::Parts {
            path: args.bundle.clone(),
            source,
        }
    })?;
    let head = reader::read_head_of(&bf)?;
    reader::check_complete(&bf, &head)?;
    super::sets::tell_repairs(&progress, &bf);
    let m: BundleManifest = serde_json::from_slice(&head.manifest).with_context(|| {
        format!(
            "{}: the bundle manifest is not readable",
            args.bundle.display()
        )
    })?;
    if let Some(out) = &args.manifest {
        write_file(out, &head.manifest, args.force)?;
        if !args.json {
            println!(
                "manifest written to {} (for koord-bundle build --since {})",
                out.display(),
                out.display()
            );
        }
    }
    let signature = match &head.signature {
        Some(s) => Some(sign::signature_info(s)?),
        None => None,
    };
    if args.json {
        let images: Vec<_> = m
            .images
            .iter()
            .map(|i| {
                serde_json::json!({
                    "ref": i.ref_name, "digest": i.digest, "upstreamDigest": i.upstream_digest,
                    "platforms": i.platforms, "source": i.source, "sourceRef": i.source_ref,
                    "original": i.original, "size": i.size, "totalSize": i.total_size,
                })
            })
            .collect();
        return super::print_json(&serde_json::json!({
            "formatVersion": m.format_version,
            "created": m.created,
            "tool": m.tool,
            "chart": {"name": m.chart.name, "version": m.chart.version, "appVersion": m.chart.app_version,
                      "digest": m.chart.digest, "file": m.chart.file, "url": m.chart.url,
                      "digestMismatchAllowed": m.chart.digest_mismatch_allowed, "oci": m.chart.oci},
            "images": images,
            "crds": m.crds,
            "platformFilter": m.platform_filter,
            "blobs": m.blobs,
            "base": m.base,
            "omittedBlobs": m.omitted_blobs.len(),
            "signature": signature.as_ref().map(|s| serde_json::json!({"signed": true, "keyId": s.key_id, "trustedComment": s.trusted_comment, "verified": false}))
                .unwrap_or(serde_json::json!({"signed": false})),
        }));
    }
    println!("bundle   {}", args.bundle.display());
    println!(
        "format   {} (koord-bundle {}), created {}",
        m.format_version, m.tool.version, m.created
    );
    println!(
        "chart    {} {} ({})",
        m.chart.name, m.chart.version, m.chart.digest
    );
    match &signature {
        Some(s) => println!(
            "signed   by key {} (not verified here: run `koord-bundle verify`)",
            s.key_id
        ),
        None => println!("signed   NO"),
    }
    println!("blobs    {}", super::blobs_in_bundle(&m.blobs));
    println!("images   {}", m.images.len());
    for i in &m.images {
        println!(
            "  {:44} {}  [{}]  from {}",
            i.ref_name,
            &i.digest.as_str()[..19],
            i.platforms.join(", "),
            i.source
        );
    }
    println!("crds     {}", m.crds.len());
    for c in &m.crds {
        println!("  {}", c.name);
    }
    Ok(())
}

/// Write `bytes` to `path` whole or not at all (a temporary file in the same directory,
/// renamed into place; an existing file is replaced only when `force`).
fn write_file(path: &std::path::Path, bytes: &[u8], force: bool) -> anyhow::Result<()> {
    use std::io::Write as _;
    let dir = super::output_dir_of(Some(path), false)?;
    let write = || -> std::io::Result<()> {
        let mut tmp = tempfile::Builder::new()
            .prefix(".koord-bundle-manifest.")
            .tempfile_in(&dir)?;
        tmp.write_all(bytes)?;
        tmp.as_file().sync_all()?;
        if force {
            tmp.persist(path).map_err(|e| e.error)?;
        } else {
            tmp.persist_noclobber(path).map_err(|e| e.error)?;
        }
        Ok(())
    };
    write().with_context(|| format!("cannot write {}", path.display()))
}
