//! The bundle's contents as a pure function of its [`Plan`]: the bundle manifest
//! (`koord-bundle.json`), the OCI layout's `index.json` and `oci-layout`, the chart archive, the
//! CRD files, the bill of materials (`bom.cdx.json`, [`super::sbom`]), and the list of blobs,
//! in the order `bundle-spec/README.md` §1 fixes. No I/O, no clock: the same plan gives the
//! same bytes.

use super::manifest::{BlobTotals, ChartRecord, OciRecord, Tool};
use super::plan::{ChartInput, Plan, PlanError};
use super::{BundleManifest, FORMAT_VERSION, MANIFEST_FILE, REF_NAME};
use crate::oci::{media, Digest};
use serde_json::json;

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
    /// The programs carried for the site (after the blobs, read from their files).
    pub tools: Vec<super::plan::ToolInput>,
}

impl Layout {
    /// The carried programs as entries: (path in the bundle, sha256, size).
    pub fn tool_entries(&self) -> Vec<(String, Digest, u64)> {
        self.tools
            .iter()
            .map(|t| {
                (
                    t.record.file.clone(),
                    t.record.sha256.clone(),
                    t.record.size,
                )
            })
            .collect()
    }
}

fn json_bytes(what: &'static str, v: &impl serde::Serialize) -> Result<Vec<u8>, PlanError> {
    serde_json::to_vec(v).map_err(|source| PlanError::Json { what, source })
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
        crds: plan.crds.clone(),
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
        blob_sizes: plan.carried.iter().cloned().collect(),
        tools: input.tools.iter().map(|t| t.record.clone()).collect(),
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
    // The carried cosign signatures and attestations: roots of their own (§2 allows them),
    // under the tag cosign looks them up by.
    entries.extend(plan.images.iter().flat_map(|r| &r.signatures).map(|s| {
        json!({"mediaType": s.media_type, "digest": s.digest, "size": s.size,
               "annotations": {REF_NAME: s.ref_name}})
    }));
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
    // The bill of materials: of the manifest's exact bytes and the CRD files above.
    let bom = super::sbom::file(&manifest, &files[0].1, &files)?;
    files.push(bom);
    Ok(Layout {
        manifest,
        files,
        blobs: plan.carried.clone(),
        tools: plan.input.tools.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::manifest::{CrdRecord, DiscoveryRecord, Overrides};
    use crate::bundle::plan::{CrdFile, PlanInput};
    use crate::bundle::sbom::{self, SBOM_FILE};

    const CRD: &str = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  names: {kind: Widget, plural: widgets}
  scope: Namespaced
  versions:
  - name: v1alpha1
    served: true
    storage: false
    schema: {openAPIV3Schema: {type: object}}
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, properties: {spec: {type: object}}}}
";

    fn input(created: u64, crd: &str) -> PlanInput {
        let archive = bytes::Bytes::from_static(b"not read by the plan");
        PlanInput {
            created,
            chart: ChartInput {
                name: "koordinator".into(),
                version: "1.8.0".into(),
                app_version: Some("1.8.0".into()),
                description: None,
                digest: Digest::of(&archive),
                archive,
                url: None,
                index_digest: None,
                mismatch_allowed: false,
                config_json: bytes::Bytes::from_static(br#"{"name":"koordinator"}"#),
            },
            crds: vec![CrdFile {
                record: CrdRecord {
                    file: "crds/example.com_widgets.yaml".into(),
                    name: "widgets.example.com".into(),
                    group: "example.com".into(),
                    plural: "widgets".into(),
                    kind: "Widget".into(),
                    ..CrdRecord::default()
                },
                yaml: bytes::Bytes::copy_from_slice(crd.as_bytes()),
            }],
            images: vec![],
            base: None,
            platform_filter: None,
            sources: vec!["chart".into()],
            overrides: Overrides::default(),
            discovery: DiscoveryRecord {
                method: "helm".into(),
                helm_version: Some("v3.17.3".into()),
            },
            tools: vec![],
        }
    }

    fn bom(l: &Layout) -> serde_json::Value {
        let (_, b) = l.files.iter().find(|(p, _)| p == SBOM_FILE).unwrap();
        serde_json::from_slice(b).unwrap()
    }

    #[test]
    fn the_layout_carries_a_bom_of_the_plan_after_the_crd_files() {
        let l = layout(&Plan::new(input(1_700_000_000, CRD)).unwrap()).unwrap();
        let names: Vec<&str> = l.files.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            names,
            [
                MANIFEST_FILE,
                "oci-layout",
                "index.json",
                "charts/koordinator-1.8.0.tgz",
                "crds/example.com_widgets.yaml",
                SBOM_FILE
            ]
        );
        // The manifest records what the plan read from the CRD file.
        let crd = &l.manifest.crds[0];
        assert_eq!(crd.sha256, Some(Digest::of(CRD.as_bytes())));
        let v: Vec<(&str, bool, bool)> = crd
            .versions
            .iter()
            .map(|v| (v.name.as_str(), v.served, v.storage))
            .collect();
        assert_eq!(v, [("v1alpha1", true, false), ("v1", true, true)]);
        // The BOM: of the manifest's exact bytes, at the plan's creation time.
        let b = bom(&l);
        assert_eq!(b["specVersion"], "1.6");
        assert_eq!(b["serialNumber"], sbom::serial_number(&l.files[0].1));
        assert_eq!(b["metadata"]["timestamp"], "2023-11-14T22:13:20Z");
        let c = &b["components"][1];
        assert_eq!(c["bom-ref"], "crd:widgets.example.com");
        assert_eq!(c["version"], "v1");
    }

    #[test]
    fn the_same_plan_inputs_give_the_same_bom_and_other_inputs_another() {
        let of = |created, crd: &str| {
            let l = layout(&Plan::new(input(created, crd)).unwrap()).unwrap();
            l.files.into_iter().find(|(p, _)| p == SBOM_FILE).unwrap().1
        };
        let a = of(1_700_000_000, CRD);
        assert_eq!(a, of(1_700_000_000, CRD));
        assert_ne!(a, of(1_700_000_001, CRD), "another creation time");
        assert_ne!(
            a,
            of(
                1_700_000_000,
                &CRD.replace("storage: false", "storage: true ")
            ),
            "another CRD file"
        );
    }

    #[test]
    fn a_crd_file_the_plan_cannot_read_names_itself() {
        let e = Plan::new(input(0, "kind: [unclosed")).unwrap_err();
        assert!(
            e.to_string().contains("crds/example.com_widgets.yaml"),
            "{e}"
        );
    }
}
