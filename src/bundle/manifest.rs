//! `koord-bundle.json`: what the bundle holds and where it came from.

use crate::oci::{Digest, Manifest, Platform};
use crate::store::RawManifest;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The bundle manifest (format `koord-bundle/v1`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleManifest {
    /// `koord-bundle/v1`.
    pub format_version: String,
    /// The tool that wrote it.
    pub tool: Tool,
    /// Creation time, RFC 3339 UTC (`SOURCE_DATE_EPOCH` when set).
    pub created: String,
    /// The chart.
    pub chart: ChartRecord,
    /// The images, sorted by `ref`.
    pub images: Vec<ImageRecord>,
    /// The CRDs, as plain YAML files under `crds/`.
    pub crds: Vec<CrdRecord>,
    /// The `--platform` filter, if any.
    #[serde(default)]
    pub platform_filter: Option<Vec<String>>,
    /// Sources in order of preference, as given.
    pub sources: Vec<String>,
    /// User overrides fed to image discovery (file names and `--set` keys; never values).
    pub overrides: Overrides,
    /// Unique blobs in the layout (image blobs and the chart artifact's).
    pub blobs: BlobTotals,
    /// Digest of every blob the bundle carries, sorted (so a later `build --since` can leave
    /// them out, from this manifest alone).
    #[serde(default)]
    pub blob_list: Vec<Digest>,
    /// For an incremental bundle: the bundle it builds on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<BaseRecord>,
    /// For an incremental bundle: blobs the layout references but leaves out, because the base
    /// bundle (or one before it) carried them; `load` requires them in the target registry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub omitted_blobs: Vec<OmittedBlob>,
    /// How the chart's images were found (absent in bundles of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery: Option<DiscoveryRecord>,
    /// The size of every blob of `blobList` (absent in bundles of older versions), so `diff`
    /// can tell the bytes a transfer carries from this manifest alone.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub blob_sizes: BTreeMap<Digest, u64>,
    /// The programs a site needs to load the bundle (`build --with-tools`): koord-bundle and
    /// helm, as files under `tools/<os>-<arch>/`, listed in the checksum file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolRecord>,
}

/// A program the bundle carries (`build --with-tools`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ToolRecord {
    /// `koord-bundle` or `helm`.
    pub name: String,
    /// Its version (`0.1.0`, `v3.17.3`).
    pub version: String,
    /// The platform it runs on, as Go names it (`linux/amd64`).
    pub platform: String,
    /// Its path in the bundle (`tools/linux-amd64/helm`).
    pub file: String,
    /// Its sha256 (also in the checksum file).
    pub sha256: Digest,
    /// Its size in bytes.
    pub size: u64,
}

/// How the chart's images were found.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryRecord {
    /// `helm`: real `helm template` (always, since helm became a prerequisite of `build`;
    /// bundles of older versions may say `builtin`, koord-bundle's former template engine).
    pub method: String,
    /// The helm version that rendered the chart (`v3.17.3`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helm_version: Option<String>,
}

/// The bundle an incremental bundle builds on.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BaseRecord {
    /// sha256 of the base bundle's `koord-bundle.json` (its identity).
    pub manifest_digest: Digest,
    /// Its chart version.
    pub chart_version: String,
    /// Its creation time.
    pub created: String,
    /// Its file name, when `--since` named the bundle (not a manifest written by `inspect
    /// --manifest`): what `load` and `inspect` tell the site to load first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

impl BaseRecord {
    /// `the 1.7.0 bundle koordinator-1.7.0.tar (created …, koord-bundle.json sha256:…)`.
    pub fn describe(&self) -> String {
        format!(
            "the {} bundle{} (created {}, koord-bundle.json {})",
            crate::text::printable(&self.chart_version),
            self.file
                .as_deref()
                .map(|f| format!(" {}", crate::text::printable(f)))
                .unwrap_or_default(),
            crate::text::printable(&self.created),
            self.manifest_digest
        )
    }
}

/// A blob left out of an incremental bundle.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct OmittedBlob {
    /// Digest.
    pub digest: Digest,
    /// Size.
    pub size: u64,
}

impl BundleManifest {
    /// Every blob a site that loaded this bundle holds: what it carried and what it required.
    pub fn blobs_on_site(&self) -> std::collections::BTreeSet<Digest> {
        self.blob_list
            .iter()
            .cloned()
            .chain(self.omitted_blobs.iter().map(|o| o.digest.clone()))
            .collect()
    }
}

/// Tool name and version.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tool {
    /// `koord-bundle`.
    pub name: String,
    /// Crate version.
    pub version: String,
}

/// The chart and its provenance.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChartRecord {
    /// Chart name.
    pub name: String,
    /// Chart version.
    pub version: String,
    /// App version.
    pub app_version: Option<String>,
    /// sha256 of the chart archive.
    pub digest: Digest,
    /// Path of the archive inside the bundle.
    pub file: String,
    /// Where it was downloaded from (`None` for `--chart FILE`).
    pub url: Option<String>,
    /// The digest the repository index gave, if any.
    pub index_digest: Option<String>,
    /// True when the archive did not match the index digest and the build was told to go on
    /// (`--allow-chart-digest-mismatch`).
    pub digest_mismatch_allowed: bool,
    /// The chart as a Helm OCI artifact in the layout.
    pub oci: OciRecord,
}

/// A manifest in the layout.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OciRecord {
    /// Its `org.opencontainers.image.ref.name`.
    #[serde(rename = "ref")]
    pub ref_name: String,
    /// Manifest digest.
    pub digest: Digest,
    /// Manifest media type.
    pub media_type: String,
    /// Manifest size.
    pub size: u64,
}

/// One image.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageRecord {
    /// Name in the layout (`koordinator-sh/koordlet:v1.8.0`): the chart's repository path and tag,
    /// which is also where `load` pushes it under the target registry.
    #[serde(rename = "ref")]
    pub ref_name: String,
    /// Values path of the component (`koordlet`), or `manual` for `--image`.
    pub component: String,
    /// Repository path as in the chart.
    pub repository: String,
    /// Tag.
    pub tag: String,
    /// The reference the chart renders by default (`registry.cn-beijing.aliyuncs.com/...`).
    pub original: String,
    /// Source label (`ghcr`, `aliyun`, a custom host).
    pub source: String,
    /// The reference it was pulled from.
    pub source_ref: String,
    /// Sources tried first that did not serve it, with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallbacks: Vec<String>,
    /// Top manifest digest in the bundle.
    pub digest: Digest,
    /// Top manifest digest upstream (differs only under a platform filter).
    pub upstream_digest: Digest,
    /// Top manifest media type.
    pub media_type: String,
    /// Top manifest size.
    pub size: u64,
    /// Platforms kept.
    pub platforms: Vec<String>,
    /// Platforms dropped by the filter.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped_platforms: Vec<String>,
    /// Attestation entries kept.
    pub attestations: usize,
    /// Bytes of all its manifests and blobs (shared blobs counted in each image).
    pub total_size: u64,
    /// The manifests its top index lists, each with its platform (for a single-platform
    /// image: the top manifest itself). Absent in bundles of older versions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub manifests: Vec<PlatformManifest>,
    /// The cosign signature and attestation manifests carried from its source
    /// (`build --with-signatures`), in the order of `manifests`. Absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signatures: Vec<SignatureRecord>,
}

/// A cosign signature (`.sig`) or attestation (`.att`) manifest carried with an image, under
/// its tag in the image's repository (cosign's tag scheme), or an OCI 1.1 referrer of one of
/// its manifests (`scheme` [`REFERRER_SCHEME`]), byte for byte as its source served it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SignatureRecord {
    /// `signature` (`.sig`) or `attestation` (`.att`).
    pub kind: String,
    /// Its name in the layout, and the repository and tag `load` pushes it under:
    /// `<repository>:sha256-<hex>.sig`; for a referrer, `<repository>@<digest>` (pushed by
    /// digest).
    #[serde(rename = "ref")]
    pub ref_name: String,
    /// [`REFERRER_SCHEME`] for an OCI 1.1 referrer (its manifest's `subject` is `signs`);
    /// absent: cosign's tag scheme.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// The image manifest it signs (the image's digest or one of its `manifests`).
    pub signs: Digest,
    /// Its manifest's digest.
    pub digest: Digest,
    /// Its manifest's media type.
    pub media_type: String,
    /// Its manifest's size.
    pub size: u64,
    /// How many signatures (or attestations) it holds (its layers).
    pub layers: usize,
    /// The sha256 of the public key (DER) every one of them was checked against at build
    /// (`--verify-key`); absent: carried unchecked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_with: Option<Digest>,
}

/// The `scheme` of a carried OCI 1.1 referrer.
pub const REFERRER_SCHEME: &str = "referrer";

impl SignatureRecord {
    /// Is it an OCI 1.1 referrer (else a manifest of cosign's tag scheme)?
    pub fn is_referrer(&self) -> bool {
        self.scheme.as_deref() == Some(REFERRER_SCHEME)
    }
}

/// One manifest of an image's index: a platform's image, or an attestation of one.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PlatformManifest {
    /// `os/arch[/variant]` (`linux/arm64/v8`), `unknown/unknown` for an attestation; absent
    /// when neither the index nor the image's config names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
    /// Manifest digest.
    pub digest: Digest,
    /// Manifest media type.
    pub media_type: String,
    /// Manifest size.
    pub size: u64,
    /// For an attestation: the digest of the manifest it describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attestation_of: Option<Digest>,
}

/// The manifests an image's top manifest lists, with their platforms: the entries of an index,
/// or (a single-platform image) the top manifest itself with `platform`, the one its config
/// names. Bytes that do not parse as a manifest list nothing.
pub fn platform_manifests(top: &RawManifest, platform: Option<&str>) -> Vec<PlatformManifest> {
    match Manifest::parse(&top.bytes, Some(&top.media_type)) {
        Ok(Manifest::Index { manifests, .. }) => manifests
            .iter()
            .map(|d| PlatformManifest {
                platform: d.platform.as_ref().map(Platform::to_string),
                digest: d.digest.clone(),
                media_type: d.media_type.clone(),
                size: d.size,
                attestation_of: d
                    .platform
                    .as_ref()
                    .filter(|p| p.is_unknown())
                    .and(d.annotations.as_ref())
                    .and_then(|a| a.get("vnd.docker.reference.digest"))
                    .and_then(|d| d.parse().ok()),
            })
            .collect(),
        Ok(Manifest::Image { .. }) => vec![PlatformManifest {
            platform: platform.map(str::to_string),
            digest: top.digest.clone(),
            media_type: top.media_type.clone(),
            size: top.bytes.len() as u64,
            attestation_of: None,
        }],
        Err(_) => Vec::new(),
    }
}

/// One CRD.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CrdRecord {
    /// Path inside the bundle (`crds/<file>`).
    pub file: String,
    /// `metadata.name`.
    pub name: String,
    /// API group.
    pub group: String,
    /// Plural.
    pub plural: String,
    /// Kind.
    pub kind: String,
    /// The `crds.<key>` value that switches it off in the chart.
    pub values_key: Option<String>,
    /// Its versions, served and stored (absent in bundles of older versions).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<CrdVersion>,
    /// sha256 of its file (absent in bundles of older versions; `SHA256SUMS` has it too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<Digest>,
}

pub use crate::crd::CrdVersion;

/// What the user fed to discovery.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Overrides {
    /// `--values` file names.
    pub values_files: Vec<String>,
    /// `--set` keys (values are not recorded: they may hold secrets).
    pub set_keys: Vec<String>,
    /// `--image` references added by hand.
    pub extra_images: Vec<String>,
}

/// Blob totals.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BlobTotals {
    /// Number of unique blobs.
    pub count: usize,
    /// Their bytes.
    pub bytes: u64,
}
