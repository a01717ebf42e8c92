//! One [`Plan`] per `build`: what the bundle will hold, made once from what the command found
//! (the chart, its CRDs, every image's resolved graph, the base of an incremental bundle), and
//! everything derived from it computed here once: the chart as a Helm OCI artifact, the blobs
//! the bundle carries, those it leaves out, those to download, and the counts every summary
//! prints. The dry run, the layout ([`super::layout`]), the writer and every summary read the
//! same plan, so a dry run says what the real run does.
//!
//! Pure: no I/O. The command layer fetches and resolves, then hands the results in as a
//! [`PlanInput`] (in the bundle's own types: this layer does not know the chart module).

use super::manifest::{
    BaseRecord, CrdRecord, DiscoveryRecord, ImageRecord, OmittedBlob, Overrides,
};
use crate::copy::{self, Graph, WalkError};
use crate::oci::{media, Descriptor};
use crate::oci::{size, Digest};
use crate::store::{RawManifest, Reference};
use bytes::Bytes;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};

/// The chart, as the bundle records and carries it.
#[derive(Debug, Clone)]
pub struct ChartInput {
    /// `name` of Chart.yaml.
    pub name: String,
    /// `version` of Chart.yaml.
    pub version: String,
    /// `appVersion` of Chart.yaml.
    pub app_version: Option<String>,
    /// `description` of Chart.yaml (an annotation of the Helm artifact).
    pub description: Option<String>,
    /// The archive, byte for byte as downloaded.
    pub archive: Bytes,
    /// Its sha256.
    pub digest: Digest,
    /// Where it was downloaded from (`None` for `--chart FILE`).
    pub url: Option<String>,
    /// The digest the repository index gave, if any.
    pub index_digest: Option<String>,
    /// The archive did not match `index_digest` and the build was told to go on.
    pub mismatch_allowed: bool,
    /// Chart.yaml as JSON: the Helm artifact's config blob.
    pub config_json: Bytes,
}

/// A CRD file of the bundle.
#[derive(Debug, Clone)]
pub struct CrdFile {
    /// What the command found of it (`file` is its path in the bundle); its `versions` and
    /// `sha256` are filled in from `yaml` by [`CrdFile::record`].
    pub record: CrdRecord,
    /// The file's bytes.
    pub yaml: Bytes,
}

impl CrdFile {
    /// What the bundle manifest says of it: `record` with the file's versions (served,
    /// stored) and sha256.
    pub fn record(&self) -> Result<CrdRecord, super::crd::CrdError> {
        let schema = super::crd::parse(&self.record.file, &self.yaml)?;
        Ok(CrdRecord {
            versions: schema.version_records(),
            sha256: Some(Digest::of(&self.yaml)),
            ..self.record.clone()
        })
    }
}

/// An image, resolved.
#[derive(Debug, Clone)]
pub struct ImageInput {
    /// Name in the layout (`koordinator-sh/koordlet:v1.8.0`).
    pub ref_name: String,
    /// Values path of the component, or `manual` for `--image`.
    pub component: String,
    /// Repository path as in the chart.
    pub repository: String,
    /// Tag.
    pub tag: String,
    /// The reference the chart renders by default.
    pub original: String,
    /// Label of the source that served it.
    pub source: String,
    /// The reference it was pulled from.
    pub source_ref: String,
    /// Sources tried first that did not serve it, with why.
    pub fallbacks: Vec<String>,
    /// Its graph, as resolved from that source.
    pub graph: Graph,
    /// Its cosign signatures and attestations carried from that source
    /// (`build --with-signatures`).
    pub signatures: Vec<CarriedSignature>,
}

/// A cosign signature or attestation manifest carried with an image: what the bundle manifest
/// says of it, and its graph (the manifest, its config and layers, all held inline: read and
/// checked when the plan was made).
#[derive(Debug, Clone)]
pub struct CarriedSignature {
    /// Its record.
    pub record: super::manifest::SignatureRecord,
    /// Its graph, read from the image's source by its tag.
    pub graph: Graph,
}

impl ImageInput {
    /// What the bundle manifest says of it.
    pub fn record(&self) -> ImageRecord {
        let g = &self.graph;
        ImageRecord {
            ref_name: self.ref_name.clone(),
            component: self.component.clone(),
            repository: self.repository.clone(),
            tag: self.tag.clone(),
            original: self.original.clone(),
            source: self.source.clone(),
            source_ref: self.source_ref.clone(),
            fallbacks: self.fallbacks.clone(),
            digest: g.top.digest.clone(),
            upstream_digest: g.upstream.digest.clone(),
            media_type: g.top.media_type.clone(),
            size: g.top.bytes.len() as u64,
            platforms: g.platforms.clone(),
            dropped_platforms: g.dropped.clone(),
            attestations: g.attestations,
            total_size: g.total_size(),
            manifests: super::manifest::platform_manifests(
                &g.top,
                g.platforms.first().map(String::as_str),
            ),
            signatures: self.signatures.iter().map(|s| s.record.clone()).collect(),
        }
    }
}

/// The bundle an incremental bundle builds on (`--since`).
#[derive(Debug, Clone)]
pub struct Base {
    /// What the new bundle records of it.
    pub record: BaseRecord,
    /// Every blob a site that loaded it holds: left out of the new bundle.
    pub on_site: BTreeSet<Digest>,
}

/// Why the bundle `--since` names cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum BaseError {
    /// Neither a bundle nor a file.
    #[error("--since {path}: cannot read it: {source}")]
    Read {
        /// As given.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Not a bundle manifest.
    #[error("--since {path}: neither a bundle nor a bundle manifest (koord-bundle inspect BUNDLE --manifest FILE writes one): {source}")]
    NotAManifest {
        /// As given.
        path: std::path::PathBuf,
        /// Why it does not parse.
        source: serde_json::Error,
    },
    /// A manifest without a blob list.
    #[error("--since {path}: this manifest lists no blobs (written by an older koord-bundle?)")]
    NoBlobList {
        /// As given.
        path: std::path::PathBuf,
    },
}

impl crate::exit::Classify for BaseError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        match self {
            // Reading --since: the kind of I/O error decides.
            BaseError::Read { .. } => None,
            BaseError::NotAManifest { .. } | BaseError::NoBlobList { .. } => {
                Some(crate::exit::ExitClass::Input)
            }
        }
    }
}

/// Largest bundle manifest read as `--since` when it is a file of its own.
pub const MAX_BASE_MANIFEST: usize = 64 << 20;

impl Base {
    /// The base `--since` names: a bundle (or any part of a split set), or the small file
    /// `inspect --manifest` writes.
    pub fn read(path: &std::path::Path) -> Result<Base, BaseError> {
        let mut file = None;
        let bytes =
            match super::reader::read_head(path) {
                Ok(head) => {
                    file = path.file_name().map(|n| n.to_string_lossy().into_owned());
                    head.manifest
                }
                Err(_) => crate::bounded::read_file_bounded(path, MAX_BASE_MANIFEST).map_err(
                    |source| BaseError::Read {
                        path: path.to_path_buf(),
                        source,
                    },
                )?,
            };
        let m: super::BundleManifest =
            serde_json::from_slice(&bytes).map_err(|source| BaseError::NotAManifest {
                path: path.to_path_buf(),
                source,
            })?;
        if m.blob_list.is_empty() {
            return Err(BaseError::NoBlobList {
                path: path.to_path_buf(),
            });
        }
        Ok(Base {
            record: BaseRecord {
                manifest_digest: Digest::of(&bytes),
                chart_version: m.chart.version.clone(),
                created: m.created.clone(),
                file,
            },
            on_site: m.blobs_on_site(),
        })
    }
}

/// Everything a plan is made of.
#[derive(Debug, Clone)]
pub struct PlanInput {
    /// Creation time, seconds since the epoch (taken from the inputs, never from the clock:
    /// see [`created_from`]).
    pub created: u64,
    /// The chart.
    pub chart: ChartInput,
    /// Its CRDs.
    pub crds: Vec<CrdFile>,
    /// The images, each resolved.
    pub images: Vec<ImageInput>,
    /// The base of an incremental bundle.
    pub base: Option<Base>,
    /// The `--platform` filter.
    pub platform_filter: Option<Vec<String>>,
    /// The source order used.
    pub sources: Vec<String>,
    /// The user's overrides (names only).
    pub overrides: Overrides,
    /// How the images were found.
    pub discovery: DiscoveryRecord,
    /// The programs carried for the site (`build --with-tools`), hashed when found.
    pub tools: Vec<ToolInput>,
}

/// A program carried for the site: what the manifest says of it, and the file it is read from
/// (hashed again as it is written: a file that changed in between fails the build).
#[derive(Debug, Clone)]
pub struct ToolInput {
    /// Its record (path in the bundle, version, platform, sha256, size).
    pub record: super::manifest::ToolRecord,
    /// The file on this machine.
    pub path: std::path::PathBuf,
}

/// What one set of blobs holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Tally {
    /// How many.
    pub blobs: usize,
    /// Their bytes.
    pub bytes: u64,
}

/// The numbers of a bundle, as every command prints them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    /// Images.
    pub images: usize,
    /// CRD files.
    pub crds: usize,
    /// Manifests of the layout (every image's and the chart artifact's), each once.
    pub manifests: usize,
    /// Every blob the bundle carries (manifests, configs, layers; each once): the bundle
    /// manifest's `blobs`.
    pub carried: Tally,
    /// Configs and layers the bundle carries (the images' and the chart artifact's): what the
    /// copy into the bundle moves.
    pub copied: Tally,
    /// Of those, the images' configs and layers, taken from their registries (what a build
    /// with an empty cache downloads).
    pub download: Tally,
    /// Configs and layers left out because the base holds them (`--since`).
    pub omitted: Tally,
}

/// Why a plan cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The graphs contradict each other or are beyond a bound.
    #[error("{0}")]
    Walk(#[from] WalkError),
    /// A sum that a file cannot hold.
    #[error(
        "{what} add up to more than {} bytes, the most a file can hold",
        size::MAX_SIZE_TEXT
    )]
    TooLarge {
        /// What was summed.
        what: &'static str,
    },
    /// A CRD file the chart carries cannot be read for its versions.
    #[error("{0}")]
    Crd(#[from] super::crd::CrdError),
    /// The bill of materials cannot be made.
    #[error("{0}")]
    Sbom(#[from] super::sbom::SbomError),
    /// JSON could not be written (it always can: a bug).
    #[error("cannot write {what} as JSON: {source}")]
    Json {
        /// Which document.
        what: &'static str,
        /// The error.
        source: serde_json::Error,
    },
}

impl crate::exit::Classify for PlanError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        use crate::exit::ExitClass as C;
        match self {
            // The walk, a CRD, the bill of materials: the error that happened decides.
            PlanError::Walk(_) | PlanError::Crd(_) | PlanError::Sbom(_) => None,
            // Sizes no file holds: what the registries declared.
            PlanError::TooLarge { .. } => Some(C::Input),
            // koord-bundle's own structures that do not serialise: a bug.
            PlanError::Json { .. } => Some(C::Machine),
        }
    }
}

/// A bundle to build.
#[derive(Debug, Clone)]
pub struct Plan {
    /// What it was made of.
    pub input: PlanInput,
    /// `created` as RFC 3339.
    pub created_rfc3339: String,
    /// What the bundle manifest says of each image, in the order of `input.images`.
    pub images: Vec<ImageRecord>,
    /// What the bundle manifest says of each CRD, in the order of `input.crds`.
    pub crds: Vec<CrdRecord>,
    /// The chart as a Helm OCI artifact: a graph whose blobs are inline.
    pub chart_graph: Graph,
    /// Every blob the bundle carries (manifests, configs, layers), sorted, each once.
    pub carried: Vec<(Digest, u64)>,
    /// Configs and layers the base holds, sorted, each once.
    pub omitted: Vec<OmittedBlob>,
    /// Configs and layers of the images to take from their registries.
    pub download: copy::Totals,
    /// The numbers, computed once.
    pub counts: Counts,
}

fn sum(what: &'static str, sizes: impl IntoIterator<Item = u64>) -> Result<u64, PlanError> {
    size::checked_sum(sizes).ok_or(PlanError::TooLarge { what })
}

impl Plan {
    /// Make the plan: the chart artifact, the blob sets and the counts, every sum checked.
    pub fn new(input: PlanInput) -> Result<Plan, PlanError> {
        let created_rfc3339 = rfc3339(input.created);
        let chart_graph = chart_artifact(&input.chart, &created_rfc3339)?;
        let empty = BTreeSet::new();
        let on_site = input.base.as_ref().map(|b| &b.on_site).unwrap_or(&empty);
        let download = copy::totals(input.images.iter().map(|i| &i.graph), on_site)?;
        // One size per digest across every graph, the carried signatures' and the chart's
        // included.
        let all = copy::totals(every_graph(&input, &chart_graph), &BTreeSet::new())?;
        let mut carried: BTreeMap<Digest, u64> = BTreeMap::new();
        let mut manifests = 0usize;
        for g in every_graph(&input, &chart_graph) {
            // Manifests are always carried (small, and needed to walk and push the graph).
            for m in g.manifests() {
                if carried
                    .insert(m.digest.clone(), m.bytes.len() as u64)
                    .is_none()
                {
                    manifests += 1;
                }
            }
        }
        let mut omitted = Vec::new();
        for (d, s) in &all.blobs {
            if on_site.contains(d) {
                omitted.push(OmittedBlob {
                    digest: d.clone(),
                    size: *s,
                });
            } else {
                carried.insert(d.clone(), *s);
            }
        }
        let copied: Vec<u64> = all
            .blobs
            .iter()
            .filter(|(d, _)| !on_site.contains(*d))
            .map(|(_, s)| *s)
            .collect();
        let carried: Vec<(Digest, u64)> = carried.into_iter().collect();
        let images = input.images.iter().map(ImageInput::record).collect();
        let crds = input
            .crds
            .iter()
            .map(CrdFile::record)
            .collect::<Result<_, _>>()?;
        let counts = Counts {
            images: input.images.len(),
            crds: input.crds.len(),
            manifests,
            carried: Tally {
                blobs: carried.len(),
                bytes: sum("the bundle's blobs", carried.iter().map(|(_, s)| *s))?,
            },
            copied: Tally {
                blobs: copied.len(),
                bytes: sum("the bundle's configs and layers", copied)?,
            },
            download: Tally {
                blobs: download.blobs.len(),
                bytes: download.bytes,
            },
            omitted: Tally {
                blobs: omitted.len(),
                bytes: sum("the blobs left out", omitted.iter().map(|o| o.size))?,
            },
        };
        Ok(Plan {
            input,
            created_rfc3339,
            images,
            crds,
            chart_graph,
            carried,
            omitted,
            download,
            counts,
        })
    }

    /// Every graph to copy into the bundle: the images', their carried signatures', then the
    /// chart artifact's.
    pub fn graphs(&self) -> Vec<&Graph> {
        every_graph(&self.input, &self.chart_graph).collect()
    }

    /// Blobs the bundle leaves out (`--since`): not copied.
    pub fn on_site(&self) -> BTreeSet<Digest> {
        self.omitted.iter().map(|o| o.digest.clone()).collect()
    }
}

/// The images' graphs, then their carried signatures', then the chart artifact's.
fn every_graph<'a>(input: &'a PlanInput, chart: &'a Graph) -> impl Iterator<Item = &'a Graph> {
    let images = input.images.iter();
    images
        .clone()
        .map(|i| &i.graph)
        .chain(images.flat_map(|i| i.signatures.iter().map(|s| &s.graph)))
        .chain([chart])
}

/// The chart as a Helm OCI artifact (config: Chart.yaml as JSON; layer: the archive), created
/// at `created` (RFC 3339): a graph whose blobs are inline, copied into the bundle by the same
/// walk as the images, and pushed by `load` as `charts/<name>:<version>`.
pub fn chart_artifact(chart: &ChartInput, created: &str) -> Result<Graph, PlanError> {
    let config_digest = Digest::of(&chart.config_json);
    let mut annotations = serde_json::Map::new();
    annotations.insert("org.opencontainers.image.created".into(), json!(created));
    if let Some(d) = &chart.description {
        annotations.insert("org.opencontainers.image.description".into(), json!(d));
    }
    annotations.insert("org.opencontainers.image.title".into(), json!(chart.name));
    annotations.insert(
        "org.opencontainers.image.version".into(),
        json!(chart.version),
    );
    let config = Descriptor {
        media_type: media::HELM_CONFIG.into(),
        digest: config_digest.clone(),
        size: chart.config_json.len() as u64,
        platform: None,
        annotations: None,
    };
    let layer = Descriptor {
        media_type: media::HELM_CHART.into(),
        digest: chart.digest.clone(),
        size: chart.archive.len() as u64,
        platform: None,
        annotations: None,
    };
    let top = RawManifest::new(
        serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": media::OCI_MANIFEST,
            "config": config,
            "layers": [layer],
            "annotations": annotations,
        }))
        .map_err(|source| PlanError::Json {
            what: "the chart artifact's manifest",
            source,
        })?,
        media::OCI_MANIFEST,
    );
    Ok(Graph {
        repo: format!("charts/{}", chart.name),
        reference: Reference::Tag(chart.version.clone()),
        upstream: top.clone(),
        top,
        children: vec![],
        blobs: vec![config, layer],
        inline: BTreeMap::from([
            (config_digest, chart.config_json.clone()),
            (chart.digest.clone(), chart.archive.clone()),
        ]),
        platforms: vec![],
        dropped: vec![],
        attestations: 0,
    })
}

/// RFC 3339 (UTC, seconds) of seconds since the epoch.
pub fn rfc3339(secs: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
        .to_string()
}

/// The creation time of a bundle, from its inputs only, so that the same inputs give the same
/// bytes on any machine at any time: `SOURCE_DATE_EPOCH` when set, else the repository index's
/// `created` of the chart version, else the newest modification time inside the chart archive
/// (`--chart FILE`), else the epoch.
pub fn created_from(
    source_date_epoch: Option<u64>,
    index_created: Option<&str>,
    archive_mtime: Option<u64>,
) -> u64 {
    if let Some(s) = source_date_epoch {
        return s;
    }
    if let Some(t) = index_created.and_then(parse_time) {
        return t;
    }
    archive_mtime.unwrap_or(0)
}

/// Seconds since the epoch of an RFC 3339 time as Helm writes them
/// (`2025-11-05T03:10:41.812346+08:00`, `...Z`); `None` when it does not parse.
fn parse_time(text: &str) -> Option<u64> {
    let t = text.trim();
    // humantime takes only UTC (`Z`): apply a numeric offset by hand.
    let (base, offset) = match t.len().checked_sub(6).map(|i| t.split_at(i)) {
        Some((b, o))
            if (o.starts_with('+') || o.starts_with('-')) && o.as_bytes().get(3) == Some(&b':') =>
        {
            let sign: i64 = if o.starts_with('-') { -1 } else { 1 };
            let h: i64 = o.get(1..3)?.parse().ok()?;
            let m: i64 = o.get(4..6)?.parse().ok()?;
            (format!("{b}Z"), sign * (h * 3600 + m * 60))
        }
        _ => (t.to_string(), 0),
    };
    let at = humantime::parse_rfc3339_weak(base.trim_end_matches('Z'))
        .or_else(|_| humantime::parse_rfc3339(&base))
        .ok()?;
    let secs = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs() as i64;
    u64::try_from(secs.checked_sub(offset)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creation_time_comes_from_the_inputs() {
        assert_eq!(
            created_from(Some(7), Some("2025-01-01T00:00:00Z"), Some(9)),
            7
        );
        assert_eq!(
            created_from(None, Some("2025-11-05T03:10:41.812346+08:00"), Some(9)),
            1762283441
        );
        assert_eq!(
            created_from(None, Some("2025-11-04T19:10:41Z"), None),
            1762283441
        );
        assert_eq!(created_from(None, Some("not a time"), Some(9)), 9);
        assert_eq!(created_from(None, None, None), 0);
        assert_eq!(rfc3339(1762283441), "2025-11-04T19:10:41Z");
    }
}
