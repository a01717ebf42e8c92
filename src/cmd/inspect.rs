//! `koord-bundle inspect`: the head of a bundle, no verification.

use crate::bundle::manifest::{ImageRecord, SignatureRecord};
use crate::bundle::{reader, sign, BundleManifest, OpenedBundle};
use crate::cli::InspectArgs;
use anyhow::Context as _;
use std::collections::BTreeSet;

/// Show what a bundle holds.
pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    let progress = crate::progress::Progress::new(crate::progress::Mode::detect(args.json));
    super::bundle_arg(&args.bundle)?;
    // The output files are checked before anything is read: a missing folder or a file that
    // would be replaced without --force is refused up front.
    let files = [args.manifest.as_ref(), args.sbom.as_ref()];
    for out in files.into_iter().flatten().filter(|o| o.as_os_str() != "-") {
        super::output_dir_of(Some(out), true)?;
        super::refuse_existing(out, args.force)?;
    }
    let b = OpenedBundle::open(&args.bundle)?;
    // A file asked for (--sbom FILE, --manifest FILE) is the output: a line saying where it
    // went, and the table only when nothing was written (--json prints its document still).
    let table = !files.iter().flatten().any(|o| o.as_os_str() != "-");
    if let Some(out) = &args.sbom {
        write_sbom(&args, &b, out, &progress)?;
        if out.as_os_str() == "-" || (args.manifest.is_none() && !args.json) {
            return Ok(());
        }
    }
    let head = b.head()?;
    b.check_complete()?;
    // (write_sbom said it already.)
    if args.sbom.is_none() {
        super::sets::tell_repairs(&progress, b.file());
    }
    let m: BundleManifest = serde_json::from_slice(&head.manifest).with_context(|| {
        format!(
            "{}: the bundle manifest is not readable",
            args.bundle.display()
        )
    })?;
    if let Some(out) = &args.manifest {
        write_atomic(out, &head.manifest)?;
        if !args.json {
            crate::say!(
                "manifest written to {} (for koord-bundle build --since {})",
                out.display(),
                out.display()
            );
        }
    }
    if !table && !args.json {
        return Ok(());
    }
    let signature = match &head.signature {
        Some(s) => Some(sign::signature_info(s)?),
        None => None,
    };
    if args.json {
        return print_json(&m, signature.as_ref());
    }
    crate::say!("bundle   {}", args.bundle.display());
    crate::say!(
        "format   {} (koord-bundle {}), created {}",
        m.format_version,
        m.tool.version,
        m.created
    );
    crate::say!(
        "chart    {} {} ({})",
        m.chart.name,
        m.chart.version,
        m.chart.digest
    );
    match &signature {
        Some(s) => crate::say!(
            "signed   by key {} (not verified here: run `koord-bundle verify`)",
            s.key_id
        ),
        None => crate::say!("signed   NO"),
    }
    crate::say!("blobs    {}", super::blobs_in_bundle(&m.blobs));
    if let Some(b) = &m.base {
        crate::say!(
            "base     incremental: {} blobs left out, carried by {}; load that bundle first",
            m.omitted_blobs.len(),
            b.describe()
        );
    }
    crate::say!("images   {}", m.images.len());
    let carried = Carried::of(&m);
    if let Some(line) = carried.summary(m.images.len()) {
        crate::say!("  {line}");
    }
    for i in &m.images {
        crate::say!(
            "  {:44} {}  [{}]  from {}",
            i.ref_name,
            &i.digest.as_str()[..19],
            i.platforms.join(", "),
            i.source
        );
        for line in carried.lines(i) {
            crate::say!("      {line}");
        }
    }
    crate::say!("crds     {}", m.crds.len());
    for c in &m.crds {
        crate::say!("  {}", c.name);
    }
    if !m.tools.is_empty() {
        crate::say!(
            "tools    {} (for a site with neither: see the README, 'One file crosses')",
            m.tools.len()
        );
        for t in &m.tools {
            crate::say!(
                "  {:30} {} {} for {}, {}",
                t.file,
                t.name,
                t.version,
                t.platform,
                crate::text::human_bytes(t.size)
            );
        }
    }
    Ok(())
}

/// `inspect --json`: the manifest's head, each image with its carried signatures.
fn print_json(m: &BundleManifest, signature: Option<&sign::SignatureInfo>) -> anyhow::Result<()> {
    let images: Vec<_> = m
        .images
        .iter()
        .map(|i| {
            serde_json::json!({
                "ref": i.ref_name, "digest": i.digest, "upstreamDigest": i.upstream_digest,
                "platforms": i.platforms, "source": i.source, "sourceRef": i.source_ref,
                "original": i.original, "size": i.size, "totalSize": i.total_size,
                "signatures": i.signatures.iter().map(|s| signature_json(i, s)).collect::<Vec<_>>(),
            })
        })
        .collect();
    let carried = Carried::of(m);
    super::print_json(&serde_json::json!({
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
        "tools": m.tools,
        "upstreamSignatures": {
            "manifests": carried.manifests, "imagesSigned": carried.images_signed,
            "verifiedWith": carried.keys, "unverified": carried.unverified,
        },
        "signature": signature.map(|s| serde_json::json!({"signed": true, "keyId": s.key_id, "trustedComment": s.trusted_comment, "verified": false}))
            .unwrap_or(serde_json::json!({"signed": false})),
    }))
}

/// The upstream cosign signatures and attestations a bundle carries (`build
/// --with-signatures`), as its manifest records them.
struct Carried {
    /// Signature and attestation manifests.
    manifests: usize,
    /// Images with at least one signature manifest.
    images_signed: usize,
    /// The keys (sha256 of their DER) they were checked against at build.
    keys: BTreeSet<String>,
    /// Manifests carried unchecked (no `--verify-key`).
    unverified: usize,
}

impl Carried {
    fn of(m: &BundleManifest) -> Carried {
        let all = || m.images.iter().flat_map(|i| &i.signatures);
        Carried {
            manifests: all().count(),
            images_signed: m
                .images
                .iter()
                .filter(|i| i.signatures.iter().any(|s| s.kind == "signature"))
                .count(),
            keys: all()
                .filter_map(|s| s.verified_with.as_ref())
                .map(|d| d.to_string())
                .collect(),
            unverified: all().filter(|s| s.verified_with.is_none()).count(),
        }
    }

    /// One line on them all; `None` when the bundle carries none (built without
    /// `--with-signatures`, or no image had any).
    fn summary(&self, images: usize) -> Option<String> {
        if self.manifests == 0 {
            return None;
        }
        let keys: Vec<&str> = self.keys.iter().map(String::as_str).collect();
        let checked = match (keys.is_empty(), self.unverified) {
            (true, _) => "NOT verified at build (built without --verify-key): carried as the sources held them".to_string(),
            (false, 0) => format!(
                "each verified at build against the key {}",
                keys.join(", ")
            ),
            (false, n) => format!(
                "verified at build against the key {}, except {n} NOT verified",
                keys.join(", ")
            ),
        };
        Some(format!(
            "upstream cosign signatures: {} {} carried for {} of {images} images, {checked}",
            self.manifests,
            crate::text::plural(self.manifests, "manifest", "manifests"),
            self.images_signed
        ))
    }

    /// One line per signature or attestation manifest `i` carries; for an image without a
    /// signature in a bundle that carries some, why.
    fn lines(&self, i: &ImageRecord) -> Vec<String> {
        let mut out: Vec<String> = i
            .signatures
            .iter()
            .map(|s| {
                let checked = match &s.verified_with {
                    Some(k) => format!("verified at build, key sha256:{}", &k.hex()[..12]),
                    None => "NOT verified (built without --verify-key)".into(),
                };
                let what = if s.kind == "attestation" {
                    crate::text::plural(s.layers, "attestation", "attestations")
                } else {
                    crate::text::plural(s.layers, "signature", "signatures")
                };
                format!(
                    "{:11}  of {} sha256:{}  {} {what}, {checked}",
                    s.kind,
                    signs_what(i, s),
                    &s.signs.hex()[..12],
                    s.layers
                )
            })
            .collect();
        if self.manifests > 0 && !i.signatures.iter().any(|s| s.kind == "signature") {
            out.push(if self.keys.is_empty() {
                "no upstream signature carried (none at its source)".into()
            } else {
                "no upstream signature carried: unsigned at its source, let through by --allow-unsigned-images".into()
            });
        }
        out
    }
}

/// What of image `i` a signature record signs: `index` (its top manifest), a platform, or
/// `manifest` (one the image does not list).
fn signs_what(i: &ImageRecord, s: &SignatureRecord) -> String {
    if s.signs == i.digest {
        return if i.manifests.len() == 1 && i.manifests[0].digest == i.digest {
            "image".into()
        } else {
            "index".into()
        };
    }
    i.manifests
        .iter()
        .find(|m| m.digest == s.signs)
        .and_then(|m| m.platform.clone())
        .unwrap_or_else(|| "manifest".into())
}

/// A signature record for `inspect --json`: as the manifest has it, with `verified` and
/// `signsWhat` spelled out.
fn signature_json(i: &ImageRecord, s: &SignatureRecord) -> serde_json::Value {
    serde_json::json!({
        "kind": s.kind, "ref": s.ref_name, "signs": s.signs, "signsWhat": signs_what(i, s),
        "digest": s.digest, "mediaType": s.media_type, "size": s.size, "layers": s.layers,
        "verified": s.verified_with.is_some(), "verifiedWith": s.verified_with,
    })
}

/// Write `bytes` to `out` whole or not at all (a temporary file renamed into place).
fn write_atomic(out: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let f = koord_splitset::AtomicFile::create(out)
        .with_context(|| format!("cannot write {}", out.display()))?;
    f.file()
        .write_all(bytes)
        .and_then(|()| f.commit())
        .with_context(|| format!("cannot write {}", out.display()))
}

/// `--sbom [FILE]`: the bundle's bill of materials, checked against `SHA256SUMS`, or one
/// derived from what an older bundle holds (its manifest, CRD files and index manifests),
/// to `out` (`-`: standard output).
fn write_sbom(
    args: &InspectArgs,
    b: &OpenedBundle,
    out: &std::path::Path,
    progress: &crate::progress::Progress,
) -> anyhow::Result<()> {
    use crate::bundle::sbom;
    let path = &args.bundle;
    let head = b.whole_head()?;
    head.check(path)?;
    let manifest = head.manifest(path)?;
    let bytes = match head.file(sbom::SBOM_FILE) {
        Some(b) => b.to_vec(),
        None => {
            progress.warn(format!(
                "{} carries no bill of materials (written before koord-bundle put one in every bundle): deriving one from its manifest, CRD files and index manifests, marked as derived",
                path.display()
            ));
            // The index manifests are among the blobs: the layout is read (and its small
            // files checked) in place, the large blobs skipped.
            let (report, _) =
                reader::read_entries_of(path, b.file(), reader::SignaturePolicy::Skip, &|_| {})?;
            sbom::derive(manifest, &head.files, &report.small_blobs)
                .with_context(|| format!("{}: cannot derive a bill of materials", path.display()))?
        }
    };
    super::sets::tell_repairs(progress, b.file());
    if out.as_os_str() == "-" {
        use std::io::Write as _;
        // The file asked for (`-o -`), byte for byte: a document for a pipe, not words.
        #[allow(clippy::disallowed_methods)]
        let mut so = std::io::stdout().lock();
        so.write_all(&bytes)
            .and_then(|()| so.flush())
            .context("cannot write the bill of materials to standard output")?;
        return Ok(());
    }
    write_atomic(out, &bytes)?;
    if !args.json {
        crate::say!("bill of materials written to {}", out.display());
    }
    Ok(())
}
