//! The bundle's contents as a pure function of its [`Plan`]: the bundle manifest
//! (`koord-bundle.json`), the OCI layout's `index.json` and `oci-layout`, the chart archive, the
//! CRD files, and the list of blobs, in the order `bundle-spec/README.md` §1 fixes. No I/O, no
//! clock: the same plan gives the same bytes.

use super::manifest::{BlobTotals, ChartRecord, OciRecord, Tool};
use super::plan::{ChartInput, Plan, PlanError};
use super::{BundleManifest, FORMAT_VERSION, MANIFEST_FILE, REF_NAME};
use crate::copy::Graph;
use crate::oci::{media, Descriptor, Digest};
use crate::store::{RawManifest, Reference};
use serde_json::json;
use std::collections::BTreeMap;

/// What goes into a bundle besides the blobs' bytes.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The bundle manifest.
    pub manifest: BundleManifest,
    /// The small files by path, in the bundle's entry order (after the checksum file and its
    /// signature).
    pub files: Vec<(String, Vec<u8>)>,
    /// Every blob the bundle carries, sorted by digest.
    pub blobs: Vec<(Digest, u64)>,
}

fn json_bytes(what: &'static str, v: &impl serde::Serialize) -> Result<Vec<u8>, PlanError> {
    serde_json::to_vec(v).map_err(|source| PlanError::Json { what, source })
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
        json_bytes(
            "the chart artifact's manifest",
            &json!({
                "schemaVersion": 2,
                "mediaType": media::OCI_MANIFEST,
                "config": config,
                "layers": [layer],
                "annotations": annotations,
            }),
        )?,
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

/// Path of the chart archive in the bundle.
pub fn chart_file(chart: &ChartInput) -> String {
    format!("charts/{}-{}.tgz", chart.name, chart.version)
}

/// Ref name of the chart artifact in the layout.
pub fn chart_ref(chart: &ChartInput) -> String {
    format!("charts/{}:{}", chart.name, chart.version)
}

/// The bundle manifest of `plan`.
pub fn manifest(plan: &Plan) -> BundleManifest {
    let input = &plan.input;
    let chart = &input.chart;
    BundleManifest {
        format_version: FORMAT_VERSION.into(),
        tool: Tool {
            name: "koord-bundle".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        },
        created: plan.created_rfc3339.clone(),
        chart: ChartRecord {
            name: chart.name.clone(),
            version: chart.version.clone(),
            app_version: chart.app_version.clone(),
            digest: chart.digest.clone(),
            file: chart_file(chart),
            url: chart.url.clone(),
            index_digest: chart.index_digest.clone(),
            digest_mismatch_allowed: chart.mismatch_allowed,
            oci: OciRecord {
                ref_name: chart_ref(chart),
                digest: plan.chart_graph.top.digest.clone(),
                media_type: media::OCI_MANIFEST.into(),
                size: plan.chart_graph.top.bytes.len() as u64,
            },
        },
        images: plan.images.clone(),
        crds: input.crds.iter().map(|c| c.record.clone()).collect(),
        platform_filter: input.platform_filter.clone(),
        sources: input.sources.clone(),
        overrides: input.overrides.clone(),
        blobs: BlobTotals {
            count: plan.counts.carried.blobs,
            bytes: plan.counts.carried.bytes,
        },
        blob_list: plan.carried.iter().map(|(d, _)| d.clone()).collect(),
        base: input.base.as_ref().map(|b| b.record.clone()),
        omitted_blobs: plan.omitted.clone(),
        discovery: Some(input.discovery.clone()),
    }
}

/// The layout's `index.json`: every image under its ref name, then the chart artifact.
pub fn index_json(plan: &Plan) -> Result<Vec<u8>, PlanError> {
    let chart = &plan.input.chart;
    let mut entries: Vec<serde_json::Value> = plan
        .images
        .iter()
        .map(|r| {
            json!({"mediaType": r.media_type, "digest": r.digest, "size": r.size,
                   "annotations": {REF_NAME: r.ref_name}})
        })
        .collect();
    entries.push(json!({"mediaType": media::OCI_MANIFEST, "digest": plan.chart_graph.top.digest,
                        "size": plan.chart_graph.top.bytes.len(), "artifactType": media::HELM_CONFIG,
                        "annotations": {REF_NAME: chart_ref(chart)}}));
    json_bytes(
        "index.json",
        &json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX, "manifests": entries}),
    )
}

/// Everything but the blobs' bytes: the manifest, the small files in order, the blob list.
pub fn layout(plan: &Plan) -> Result<Layout, PlanError> {
    let manifest = manifest(plan);
    let manifest_json = serde_json::to_vec_pretty(&manifest).map_err(|source| PlanError::Json {
        what: MANIFEST_FILE,
        source,
    })?;
    let chart = &plan.input.chart;
    let mut files: Vec<(String, Vec<u8>)> = vec![
        (MANIFEST_FILE.into(), manifest_json),
        (
            "oci-layout".into(),
            br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
        ),
        ("index.json".into(), index_json(plan)?),
        (chart_file(chart), chart.archive.to_vec()),
    ];
    for c in &plan.input.crds {
        files.push((c.record.file.clone(), c.yaml.to_vec()));
    }
    Ok(Layout {
        manifest,
        files,
        blobs: plan.carried.clone(),
    })
}
