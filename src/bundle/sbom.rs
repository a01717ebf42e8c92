//! The bill of materials every bundle carries (`bom.cdx.json`, listed in `SHA256SUMS` and so
//! covered by the signature): CycloneDX 1.6 JSON, for the person who approves a transfer.
//!
//! - the chart: name, version, appVersion (a property), the archive's sha256, where it came
//!   from (a `distribution` reference);
//! - every image (`container`): repository and tag, the top manifest's digest as its hash, a
//!   `pkg:oci` purl with `repository_url` (where it was pulled from) and `tag`, which source
//!   served it; each manifest of its index as a nested component with its platform (purl
//!   qualifiers `arch` and `os`), attestations marked as such;
//! - every CRD (`data`, a `definition`): group, kind, served and stored versions, the file's
//!   sha256.
//!
//! The bytes are a pure function of the bundle manifest's bytes and the CRD files: the
//! `serialNumber` is a UUID made from the sha256 of `koord-bundle.json` (the bundle's identity,
//! as `build --since` records it): its first 16 bytes with the version nibble set to 8 and the
//! variant bits to `10`, as RFC 9562 (§5.8, appendix B.2) says for a UUID made from a name with
//! SHA-256; the timestamp is the bundle's `created`; keys are sorted, components in the
//! manifest's order (images sorted by ref). The same inputs give the same bytes.
//!
//! Written by hand over `serde_json`: the Rust CycloneDX library (`cyclonedx-bom` 0.8.1, the
//! newest) writes specification 1.3 to 1.5 only. The tests validate the output with the
//! reference validator (`cyclonedx-python-lib`'s strict JSON schema validator for 1.6). Purls
//! are made by `packageurl` (canonical encoding, sorted qualifiers).

use super::crd;
use super::manifest::{CrdRecord, CrdVersion, ImageRecord, PlatformManifest};
use super::BundleManifest;
use crate::oci::Digest;
use serde_json::{json, Value};

/// Name of the bill of materials inside the bundle (CycloneDX's recommended JSON name).
pub const SBOM_FILE: &str = "bom.cdx.json";

/// The CycloneDX version written.
pub const SPEC_VERSION: &str = "1.6";

/// Why no bill of materials could be made.
#[derive(Debug, thiserror::Error)]
pub enum SbomError {
    /// A CRD file of the bundle cannot be read.
    #[error(transparent)]
    Crd(#[from] crd::CrdError),
    /// A purl cannot be made from an image's names.
    #[error("image {image}: no package URL can be made of it: {reason}")]
    Purl {
        /// The image (`ref`).
        image: String,
        /// Why.
        reason: String,
    },
    /// A CRD the manifest lists has no file among the bundle's.
    #[error("the bundle manifest lists CRD {0}, but the bundle has no such file")]
    MissingCrd(String),
    /// The bundle manifest does not parse.
    #[error("the bundle manifest is not readable: {0}")]
    Manifest(serde_json::Error),
    /// JSON could not be written (not expected: every key is a string).
    #[error("the bill of materials: {0}")]
    Json(#[from] serde_json::Error),
}

impl crate::exit::Classify for SbomError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        use crate::exit::ExitClass as C;
        match self {
            SbomError::Crd(c) => crate::exit::Classify::exit_class(c),
            // An image or a bundle manifest the bill of materials cannot be made of.
            SbomError::Purl { .. } | SbomError::MissingCrd(_) | SbomError::Manifest(_) => {
                Some(C::Input)
            }
            // The bill of materials, koord-bundle's own value, that does not serialise: a bug.
            SbomError::Json(_) => Some(C::Machine),
        }
    }
}

/// Whether the BOM was written by `build` or derived afterwards from an older bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Written into the bundle by `build`.
    Build,
    /// Derived by `inspect --sbom` from a bundle written before bundles carried one.
    Derived,
}

/// A name-based UUID (version 8, RFC 9562) of `bytes`' sha256, as `urn:uuid:...`.
pub fn serial_number(bytes: &[u8]) -> String {
    let d = Digest::of(bytes);
    let mut b = [0u8; 16];
    if let Ok(raw) = hex::decode(d.hex()) {
        b.copy_from_slice(&raw[..16]);
    }
    b[6] = (b[6] & 0x0f) | 0x80;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!(
        "urn:uuid:{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

fn prop(name: &str, value: impl Into<String>) -> Value {
    json!({"name": format!("koord-bundle:{name}"), "value": value.into()})
}

fn sha256(d: &Digest) -> Value {
    json!([{"alg": "SHA-256", "content": d.hex()}])
}

/// The CycloneDX 1.6 JSON of a bundle: `manifest_bytes` are the exact bytes of its
/// `koord-bundle.json` (parsed: `manifest`), `crds` each CRD record with its file's bytes.
pub fn cyclonedx(
    manifest: &BundleManifest,
    manifest_bytes: &[u8],
    crds: &[(&CrdRecord, &[u8])],
    origin: Origin,
) -> Result<Vec<u8>, SbomError> {
    let chart = &manifest.chart;
    let chart_ref = format!("chart:{}@{}", chart.name, chart.version);
    let mut components = vec![chart_component(manifest, &chart_ref)];
    let mut deps = Vec::new();
    for img in &manifest.images {
        let (c, r) = image_component(img)?;
        components.push(c);
        deps.push(r);
    }
    for (rec, bytes) in crds {
        let (c, r) = crd_component(rec, bytes)?;
        components.push(c);
        deps.push(r);
    }
    let mut bundle_deps = vec![json!(chart_ref)];
    for t in &manifest.tools {
        let r = format!("tool:{}@{}", t.file, t.version);
        components.push(tool_component(t, &r));
        bundle_deps.push(json!(r));
    }
    let mut props = vec![
        prop("formatVersion", &manifest.format_version),
        prop("sources", manifest.sources.join(",")),
    ];
    if let Some(p) = &manifest.platform_filter {
        props.push(prop("platformFilter", p.join(",")));
    }
    if let Some(b) = &manifest.base {
        props.push(prop(
            "base",
            format!(
                "incremental on the {} bundle of {} ({})",
                b.chart_version, b.created, b.manifest_digest
            ),
        ));
    }
    if origin == Origin::Derived {
        props.push(prop(
            "derived",
            format!(
                "derived by koord-bundle {} from a bundle written without a bill of materials",
                env!("CARGO_PKG_VERSION")
            ),
        ));
    }
    let bom = json!({
        "$schema": "http://cyclonedx.org/schema/bom-1.6.schema.json",
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "serialNumber": serial_number(manifest_bytes),
        "version": 1,
        "metadata": {
            "timestamp": manifest.created,
            "lifecycles": [{"phase": if origin == Origin::Build { "build" } else { "post-build" }}],
            "tools": {"components": [{
                "type": "application",
                "name": manifest.tool.name,
                "version": manifest.tool.version,
            }]},
            "component": {
                "type": "application",
                "bom-ref": "bundle",
                "name": format!("{}-bundle", chart.name),
                "version": chart.version,
                "description": format!(
                    "koord-bundle of the {} Helm chart {}: {} images, {} CRDs",
                    chart.name, chart.version, manifest.images.len(), manifest.crds.len()
                ),
                "hashes": sha256(&Digest::of(manifest_bytes)),
                "properties": [prop("created", &manifest.created)],
            },
            "properties": props,
        },
        "components": components,
        "dependencies": [
            {"ref": "bundle", "dependsOn": bundle_deps},
            {"ref": chart_ref, "dependsOn": deps},
        ],
    });
    let mut out = serde_json::to_vec_pretty(&bom)?;
    out.push(b'\n');
    Ok(out)
}

/// The bill of materials as a file of the bundle, `(SBOM_FILE, bytes)`: of the manifest
/// (`manifest_bytes` its exact bytes) and the CRD files among the bundle's small `files`.
pub fn file(
    manifest: &BundleManifest,
    manifest_bytes: &[u8],
    files: &[(String, Vec<u8>)],
) -> Result<(String, Vec<u8>), SbomError> {
    let crds = crd_files(manifest, files)?;
    let bytes = cyclonedx(manifest, manifest_bytes, &crds, Origin::Build)?;
    Ok((SBOM_FILE.to_string(), bytes))
}

/// Each CRD record of `manifest` with its file's bytes, found among `files`.
fn crd_files<'a>(
    manifest: &'a BundleManifest,
    files: &'a [(String, Vec<u8>)],
) -> Result<Vec<(&'a CrdRecord, &'a [u8])>, SbomError> {
    manifest
        .crds
        .iter()
        .map(|c| {
            files
                .iter()
                .find(|(p, _)| *p == c.file)
                .map(|(_, b)| (c, b.as_slice()))
                .ok_or_else(|| SbomError::MissingCrd(c.file.clone()))
        })
        .collect()
}

/// The bill of materials of a bundle written before bundles carried one, derived from what it
/// holds: its manifest (`manifest_bytes`), its CRD files (among `head_files`) and the
/// manifests among its blobs (`blobs`, digest → bytes: each image's top manifest, for its
/// platform manifests). Marked as derived (a `koord-bundle:derived` property, lifecycle
/// `post-build`).
pub fn derive(
    manifest_bytes: &[u8],
    head_files: &[(String, Vec<u8>)],
    blobs: &std::collections::BTreeMap<Digest, bytes::Bytes>,
) -> Result<Vec<u8>, SbomError> {
    let mut manifest: BundleManifest =
        serde_json::from_slice(manifest_bytes).map_err(SbomError::Manifest)?;
    for img in manifest
        .images
        .iter_mut()
        .filter(|i| i.manifests.is_empty())
    {
        if let Some(bytes) = blobs.get(&img.digest) {
            let top = crate::store::RawManifest::new(bytes.clone(), img.media_type.clone());
            img.manifests = super::manifest::platform_manifests(
                &top,
                img.platforms.first().map(String::as_str),
            );
        }
    }
    let crds = crd_files(&manifest, head_files)?;
    cyclonedx(&manifest, manifest_bytes, &crds, Origin::Derived)
}

fn chart_component(m: &BundleManifest, bom_ref: &str) -> Value {
    let c = &m.chart;
    let mut props = vec![
        prop("chart:file", &c.file),
        prop("chart:oci", format!("{}@{}", c.oci.ref_name, c.oci.digest)),
    ];
    if let Some(a) = &c.app_version {
        props.push(prop("chart:appVersion", a));
    }
    if let Some(d) = &c.index_digest {
        props.push(prop("chart:indexDigest", d));
    }
    if c.digest_mismatch_allowed {
        props.push(prop(
            "chart:digestMismatchAllowed",
            "true: the archive did not match the repository index and the build was told to go on",
        ));
    }
    let mut v = json!({
        "type": "application",
        "bom-ref": bom_ref,
        "name": c.name,
        "version": c.version,
        "hashes": sha256(&c.digest),
        "properties": props,
    });
    if let Some(url) = &c.url {
        v["externalReferences"] = json!([{"type": "distribution", "url": url}]);
    }
    v
}

/// A program the bundle carries for its site (`build --with-tools`).
fn tool_component(t: &super::manifest::ToolRecord, bom_ref: &str) -> Value {
    json!({
        "type": "application",
        "bom-ref": bom_ref,
        "name": t.name,
        "version": t.version,
        "hashes": sha256(&t.sha256),
        "properties": [prop("tool:file", &t.file), prop("tool:platform", &t.platform),
                       prop("tool:size", t.size.to_string())],
    })
}

/// `pkg:oci/NAME@DIGEST?repository_url=...&tag=...` (+ `arch`, `os` for a platform).
fn oci_purl(
    img: &ImageRecord,
    digest: &Digest,
    platform: Option<&str>,
) -> Result<String, SbomError> {
    let err = |e: packageurl::Error| SbomError::Purl {
        image: img.ref_name.clone(),
        reason: e.to_string(),
    };
    // Where it was pulled from: the source reference without its tag or digest.
    let source = img.source_ref.split('@').next().unwrap_or_default();
    let repository_url = match source.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => source,
    };
    let name = img.repository.rsplit('/').next().unwrap_or(&img.repository);
    let mut p = packageurl::PackageUrl::new("oci", name.to_lowercase()).map_err(err)?;
    p.with_version(digest.as_str()).map_err(err)?;
    p.add_qualifier("repository_url", repository_url.to_string())
        .map_err(err)?;
    p.add_qualifier("tag", img.tag.clone()).map_err(err)?;
    if let Some((os, arch)) = platform.and_then(|p| p.split_once('/')) {
        let arch = arch.split('/').next().unwrap_or(arch);
        if os != "unknown" {
            p.add_qualifier("arch", arch.to_string()).map_err(err)?;
            p.add_qualifier("os", os.to_string()).map_err(err)?;
        }
    }
    Ok(p.to_string())
}

fn image_component(img: &ImageRecord) -> Result<(Value, String), SbomError> {
    let bom_ref = format!("image:{}", img.ref_name);
    let mut props = vec![
        prop("image:ref", &img.ref_name),
        prop("image:source", &img.source),
        prop("image:sourceRef", &img.source_ref),
        prop("image:original", &img.original),
        prop("image:component", &img.component),
        prop("image:mediaType", &img.media_type),
        prop("image:platforms", img.platforms.join(",")),
        // No `installedAs`: how a site installs the image (the registry, pinned or not: `load
        // --no-pin`, a helm too old for the post-renderer) is not known when the bundle is
        // built; `load --json` says what load did (`images`).
    ];
    if img.upstream_digest != img.digest {
        props.push(prop("image:upstreamDigest", img.upstream_digest.as_str()));
    }
    for f in &img.fallbacks {
        props.push(prop("image:fallback", f));
    }
    // Carried cosign signatures and attestations (`build --with-signatures`): one property
    // each, `<ref>@<manifest digest>` (the tag names the digest it signs), or a referrer's
    // `<ref>` alone (`<repository>@<manifest digest>`: its subject is the digest it signs).
    for sig in &img.signatures {
        let name = match sig.kind.as_str() {
            "attestation" => "image:attestation",
            _ => "image:signature",
        };
        let at = if sig.is_referrer() {
            sig.ref_name.clone()
        } else {
            format!("{}@{}", sig.ref_name, sig.digest)
        };
        if let Some(k) = &sig.verified_with {
            props.push(prop(name, at.clone()));
            props.push(prop("image:signatureVerifiedWith", format!("{at} {k}")));
        } else {
            props.push(prop(name, at));
        }
    }
    let nested = img
        .manifests
        .iter()
        .map(|pm| platform_component(img, &bom_ref, pm))
        .collect::<Result<Vec<_>, _>>()?;
    let mut v = json!({
        "type": "container",
        "bom-ref": bom_ref,
        "name": img.repository,
        "version": img.tag,
        "hashes": sha256(&img.digest),
        "purl": oci_purl(img, &img.digest, None)?,
        "properties": props,
    });
    if !nested.is_empty() {
        v["components"] = Value::Array(nested);
    }
    Ok((v, bom_ref))
}

fn platform_component(
    img: &ImageRecord,
    parent: &str,
    pm: &PlatformManifest,
) -> Result<Value, SbomError> {
    let platform = pm.platform.as_deref();
    let mut props = vec![prop("image:mediaType", &pm.media_type)];
    if let Some(p) = platform {
        props.push(prop("image:platform", p));
    }
    if let Some(of) = &pm.attestation_of {
        props.push(prop("image:attestationOf", of.as_str()));
    }
    Ok(json!({
        "type": "container",
        "bom-ref": format!("{parent}@{}", pm.digest),
        "name": img.repository,
        "version": img.tag,
        "description": match (&pm.attestation_of, platform) {
            (Some(_), _) => "attestation manifest".to_string(),
            (None, Some(p)) => format!("{p} image manifest"),
            (None, None) => "image manifest".to_string(),
        },
        "hashes": sha256(&pm.digest),
        "purl": oci_purl(img, &pm.digest, platform)?,
        "properties": props,
    }))
}

fn crd_component(rec: &CrdRecord, bytes: &[u8]) -> Result<(Value, String), SbomError> {
    let versions: Vec<CrdVersion> = if rec.versions.is_empty() {
        crd::parse(&rec.file, bytes)?.version_records()
    } else {
        rec.versions.clone()
    };
    let list = |f: fn(&CrdVersion) -> bool| {
        versions
            .iter()
            .filter(|v| f(v))
            .map(|v| v.name.as_str())
            .collect::<Vec<_>>()
            .join(",")
    };
    let bom_ref = format!("crd:{}", rec.name);
    let mut props = vec![
        prop("crd:kind", &rec.kind),
        prop("crd:plural", &rec.plural),
        prop("crd:servedVersions", list(|v| v.served)),
        prop("crd:storedVersion", list(|v| v.storage)),
        prop("crd:file", &rec.file),
    ];
    if let Some(k) = &rec.values_key {
        props.push(prop("crd:valuesKey", format!("crds.{k}")));
    }
    let mut v = json!({
        "type": "data",
        "bom-ref": bom_ref,
        "group": rec.group,
        "name": rec.name,
        "description": format!("CustomResourceDefinition {} ({})", rec.kind, rec.name),
        "hashes": sha256(&Digest::of(bytes)),
        "data": [{"type": "definition", "name": rec.file}],
        "properties": props,
    });
    if let Some(stored) = versions.iter().find(|v| v.storage) {
        v["version"] = json!(stored.name);
    }
    Ok((v, bom_ref))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_number_is_a_version_8_uuid_of_the_bytes() {
        let s = serial_number(b"koord-bundle.json bytes");
        assert_eq!(s, serial_number(b"koord-bundle.json bytes"));
        assert_ne!(s, serial_number(b"other bytes"));
        let u = s.strip_prefix("urn:uuid:").unwrap();
        let groups: Vec<&str> = u.split('-').collect();
        assert_eq!(
            groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(groups[2].starts_with('8'), "version nibble: {u}");
        assert!("89ab".contains(&groups[3][..1]), "variant bits: {u}");
        // The first bytes are those of the sha256, but for the version and variant bits.
        let d = Digest::of(b"koord-bundle.json bytes");
        assert_eq!(&u[..8], &d.hex()[..8]);
    }
}
