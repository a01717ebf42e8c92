#![no_main]
//! YAML from every source the tool reads, on untrusted bytes, through the entry points the
//! tool uses (all of them go through `koord_bundle::yaml`, which bounds size, depth and nodes).
//!
//! Input: one selector byte, then the YAML. The selector (mod 8) picks the source:
//! 0 a `--values` file (`yaml::check`, what `build` checks before handing it to helm, and
//!   `yaml::parse_value`),
//! 1 a repository `index.yaml` (`RepoIndex::parse_chart` against `RepoIndex::parse`),
//! 2 a kubeconfig (`cluster::kubeconfig::parse`),
//! 3 rendered manifests (`chart::rendered::images_in_manifests` and `rendered_images`),
//! 4 a chart's `Chart.yaml`, 5 its `values.yaml` (then the images of a rendering named after
//!   its components), 6 a CRD file in `crds/` and as a template, 7 rendered manifests as
//!   helm prints them (`# Source:` lines) of a chart, their images named after its components
//!   (`images_from_rendered`): what `build` does with helm's output, which the binary cannot be
//!   made to feed with anything helm would not print.
//!
//! Checked on top of "no panic" (and libFuzzer's time and memory limits):
//! * `parse_chart(index, c)` and `parse(index)` agree on the versions of `c` (the streaming
//!   reader of one chart must read what the whole-index parse reads);
//! * `yaml::check` accepts whatever `yaml::parse_value` parsed (one guard, one parser).

use koord_bundle::chart::rendered::images_in_manifests;
use koord_bundle::chart::{extract_crds, images_from_rendered, ChartArchive, RepoIndex};
use koord_bundle::yaml;
use libfuzzer_sys::fuzz_target;
use std::io::Write;

const CHART_YAML: &[u8] = b"apiVersion: v2\nname: demo\nversion: 1.0.0\nappVersion: 1.0.0\n";
const VALUES: &[u8] = b"image: {repository: org/app, tag: v1}\nregistry: r.example\n";
const TEMPLATE: &[u8] = b"spec:\n  containers:\n  - name: app\n    image: {{ .Values.registry }}/{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}\n";
/// What helm renders from `TEMPLATE` with `VALUES`.
const RENDERED: &str = "---\n# Source: demo/templates/x.yaml\nspec:\n  containers:\n  - name: app\n    image: r.example/org/app:v1\n";

fn tgz(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        let _ = b.append_data(&mut h, format!("demo/{path}"), *data);
    }
    let tar = b.into_inner().unwrap_or_default();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let _ = gz.write_all(&tar);
    gz.finish().unwrap_or_default()
}

fn chart(files: &[(&str, &[u8])]) {
    let Ok(c) = ChartArchive::from_tgz(&tgz(files)) else {
        return;
    };
    if let Ok(found) = images_in_manifests(RENDERED) {
        let _ = images_from_rendered(&found, &c);
    }
    let _ = extract_crds(&c);
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    match sel % 8 {
        0 => {
            if yaml::parse_value("values file", body, &yaml::VALUES_FILE).is_ok() {
                assert!(yaml::check("values file", body, &yaml::VALUES_FILE).is_ok());
            }
        }
        1 => {
            let one = RepoIndex::parse_chart(body, "koordinator");
            let all = RepoIndex::parse(body);
            if let (Ok(one), Ok(all)) = (&one, &all) {
                let v = |ix: &RepoIndex| {
                    ix.versions("koordinator")
                        .iter()
                        .map(|e| (e.version.clone(), e.digest.clone(), e.urls.clone()))
                        .collect::<Vec<_>>()
                };
                assert_eq!(v(one), v(all), "parse_chart and parse disagree");
                assert_eq!(one.charts(), all.charts());
            }
            // Reading one chart never fails where reading them all succeeds.
            if all.is_ok() {
                assert!(
                    one.is_ok(),
                    "parse_chart failed where parse succeeded: {one:?}"
                );
            }
        }
        2 => {
            let text = String::from_utf8_lossy(body);
            let _ = koord_bundle::cluster::kubeconfig::parse(
                &text,
                std::path::Path::new("/nonexistent/kubeconfig"),
                None,
            );
        }
        3 => {
            let text = String::from_utf8_lossy(body);
            let _ = koord_bundle::chart::rendered::images_in_manifests(&text);
            let _ = koord_bundle::chart::rendered::rendered_images(&text);
        }
        4 => chart(&[("Chart.yaml", body), ("values.yaml", VALUES)]),
        5 => chart(&[
            ("Chart.yaml", CHART_YAML),
            ("values.yaml", body),
            ("templates/x.yaml", TEMPLATE),
        ]),
        6 => {
            chart(&[("Chart.yaml", CHART_YAML), ("crds/x.yaml", body)]);
            let mut wrapped = b"{{- if .Values.crds.managed }}\n".to_vec();
            wrapped.extend_from_slice(body);
            wrapped.extend_from_slice(b"\n{{- end }}\n");
            chart(&[
                ("Chart.yaml", CHART_YAML),
                ("templates/crd/x.yaml", &wrapped),
            ]);
        }
        _ => {
            let Ok(c) = ChartArchive::from_tgz(&tgz(&[
                ("Chart.yaml", CHART_YAML),
                ("values.yaml", VALUES),
                ("templates/x.yaml", TEMPLATE),
            ])) else {
                return;
            };
            let text = String::from_utf8_lossy(body);
            if let Ok(found) = images_in_manifests(&text) {
                if let Ok(images) = images_from_rendered(&found, &c) {
                    let mut refs = std::collections::BTreeSet::new();
                    for i in &images {
                        assert!(refs.insert(i.reference()), "{} twice", i.reference());
                    }
                }
            }
        }
    }
});
