//! `koord-bundle diff OLD NEW`: what changed between two bundles, read from their heads only
//! (the files before `blobs/`), each checked against its `SHA256SUMS` (and, with `--key`, its
//! signature: key ID and verified yes/no per side). OLD and NEW may be bundles, any part of
//! a split set, or the manifest file `inspect --manifest` writes. Exit 0 when it compared,
//! whatever it found; 1 when an input is not a bundle or fails its checksums.

use crate::bundle::diff::{self, InputKind, Side, Signature};
use crate::bundle::{reader, sign, BundleManifest, OpenedBundle, FORMAT_VERSION};
use crate::cli::DiffArgs;
use crate::oci::Digest;
use anyhow::{bail, Context as _};
use std::collections::BTreeMap;
use std::path::Path;

/// Largest manifest file (`inspect --manifest`) read.
const MAX_MANIFEST_FILE: usize = 64 * 1024 * 1024;

/// Compare two bundles.
// The report is printed whole, escaped (it has its own newlines).
#[allow(clippy::disallowed_macros)]
pub fn run(args: DiffArgs) -> anyhow::Result<()> {
    super::bundle_arg(&args.old)?;
    super::bundle_arg(&args.new)?;
    let progress = crate::progress::Progress::new(crate::progress::Mode::detect(
        args.json || args.format == "json",
    ));
    let key = match &args.key {
        Some(k) => Some(crate::bundle::sign::load_public_key(k)?),
        None => None,
    };
    let old = read_side(&args.old, key.as_ref(), &progress).context("cannot read OLD")?;
    let new = read_side(&args.new, key.as_ref(), &progress).context("cannot read NEW")?;
    let report = diff::compare(&old, &new);
    if args.json || args.format == "json" {
        return super::print_json(&report);
    }
    let text = if args.format == "markdown" {
        diff::render::markdown(&report)
    } else {
        diff::render::table(&report)
    };
    // Bundles name files and values: nothing of theirs reaches the terminal raw.
    print!("{}", crate::text::terminal_safe(&text));
    Ok(())
}

/// Whether `path` is a JSON file (a bundle manifest) rather than a bundle.
fn is_json(path: &Path) -> anyhow::Result<bool> {
    use std::io::Read as _;
    let mut f = match crate::bounded::open_input(path) {
        Ok(f) => f,
        // A part of a split set may be missing: the set reader says what is wrong.
        Err(_) => return Ok(false),
    };
    let mut buf = [0u8; 512];
    let n = f.read(&mut buf).unwrap_or(0);
    Ok(buf[..n]
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'{'))
}

fn parse_manifest(path: &Path, bytes: &[u8]) -> anyhow::Result<BundleManifest> {
    let m: BundleManifest = serde_json::from_slice(bytes).with_context(|| {
        format!(
            "{}: not a bundle manifest (koord-bundle inspect BUNDLE --manifest FILE writes one)",
            path.display()
        )
    })?;
    if m.format_version != FORMAT_VERSION {
        bail!(
            "{}: format {:?} is not {FORMAT_VERSION} (a newer koord-bundle wrote it?)",
            path.display(),
            m.format_version
        );
    }
    Ok(m)
}

/// One side: a manifest file, or a bundle's head checked against its `SHA256SUMS`.
fn read_side(
    path: &Path,
    key: Option<&minisign::PublicKey>,
    progress: &crate::progress::Progress,
) -> anyhow::Result<Side> {
    let input = path.display().to_string();
    if is_json(path)? {
        let bytes = crate::bounded::read_file_bounded(path, MAX_MANIFEST_FILE)
            .with_context(|| format!("cannot read {}", path.display()))?;
        return Ok(Side {
            input,
            kind: InputKind::ManifestFile,
            manifest: parse_manifest(path, &bytes)?,
            manifest_digest: Digest::of(&bytes),
            crd_files: None,
            values: None,
            signature: Signature {
                reason: Some("a manifest file carries no signature".into()),
                ..Default::default()
            },
        });
    }
    let b = OpenedBundle::open(path)?;
    let head = b.whole_head()?;
    super::sets::tell_repairs(progress, b.file());
    head.check(path)?;
    let manifest_bytes = head.manifest(path)?;
    let manifest = parse_manifest(path, manifest_bytes)?;
    let chart = head.file(&manifest.chart.file).with_context(|| {
        format!(
            "{}: the chart archive {} is not in the bundle's head",
            path.display(),
            manifest.chart.file
        )
    })?;
    let archive = crate::chart::ChartArchive::from_tgz(chart)
        .with_context(|| format!("{}: {}", path.display(), manifest.chart.file))?;
    let crd_files: BTreeMap<String, Vec<u8>> = head
        .files
        .iter()
        .filter(|(n, _)| n.starts_with("crds/"))
        .cloned()
        .collect();
    Ok(Side {
        input,
        kind: if b.is_split() {
            InputKind::SplitSet
        } else {
            InputKind::Bundle
        },
        manifest_digest: Digest::of(manifest_bytes),
        manifest,
        crd_files: Some(crd_files),
        values: Some(archive.values().clone()),
        signature: signature(&head, key),
    })
}

/// The signature of a head: who signed, and whether it verifies with `key`.
fn signature(head: &reader::WholeHead, key: Option<&minisign::PublicKey>) -> Signature {
    let Some(sig) = &head.signature else {
        return Signature::default();
    };
    let key_id = sign::signature_info(sig).ok().map(|i| i.key_id);
    match key {
        None => Signature {
            signed: true,
            key_id,
            verified: None,
            reason: Some("no --key given".into()),
        },
        Some(pk) => match sign::verify(pk, sig, &head.checksums) {
            Ok(_) => Signature {
                signed: true,
                key_id,
                verified: Some(true),
                reason: None,
            },
            Err(e) => Signature {
                signed: true,
                key_id,
                verified: Some(false),
                reason: Some(e.to_string()),
            },
        },
    }
}
