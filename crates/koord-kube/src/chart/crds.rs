//! The CustomResourceDefinitions a chart ships.
//!
//! Koordinator keeps its CRDs as templates under `templates/crd/` (0.x charts: directly under
//! `templates/`), each wrapped in `{{- if and .Values.crds.managed .Values.crds.<plural> }}` …
//! `{{- end }}` (1.0–1.5: `{{- if .Values.crds.managed }}`). Helm's own `crds/` folder (plain
//! YAML, never templated) is read too.
//!
//! Files taken: every file under `crds/` ending in `.yaml`/`.yml`/`.json` (as Helm), every
//! rendered file under `templates/crd/`, and any other rendered template that declares a
//! top-level `kind: CustomResourceDefinition`. For templates, the wrapper (one leading
//! `{{ if <condition on .Values> }}` and one trailing `{{ end }}`, trim markers allowed, the
//! `end` possibly glued to the last line) is cut out and everything else is kept byte for
//! byte; any other template action is an error naming the file and line. Each YAML document
//! must be an `apiextensions.k8s.io` CustomResourceDefinition with `metadata.name`,
//! `spec.group`, `spec.names.plural` and `spec.names.kind`, and `metadata.name` must be
//! `<plural>.<group>` (the API server requires it). CRD names must be unique in the chart.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use regex::Regex;
use serde_yaml_ng::Value;

use super::discover::{declares_crd, is_rendered_template};
use super::template::{is_plain_condition, keyword, tokenize, Token};
use super::{line_of, ChartArchive, ChartError};

/// A CustomResourceDefinition shipped by a chart.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Crd {
    /// The file name the bundle stores it under: `<group>_<plural>.yaml` (kubebuilder's
    /// naming, `scheduling.koordinator.sh_reservations.yaml`), always taken from the CRD
    /// itself and never from the name of the file it came from (the 0.5.0–1.0.0 charts name
    /// one file `topology.node.k8s.io_ noderesourcetopologies.yaml`, with a space). The group
    /// is checked to be a DNS subdomain and the plural a DNS label, so the name is one plain
    /// path component; unique since CRD names are.
    pub file_name: String,
    /// The chart file it comes from (`templates/crd/...`, `crds/...`).
    pub source: String,
    /// `metadata.name` (`reservations.scheduling.koordinator.sh`).
    pub name: String,
    /// `spec.group`.
    pub group: String,
    /// `spec.names.plural`.
    pub plural: String,
    /// `spec.names.kind`.
    pub kind: String,
    /// The `X` of `.Values.crds.X` in the wrapper's condition (other than `managed`), if any:
    /// the value that turns this CRD off.
    pub values_key: Option<String>,
    /// The CRD as plain YAML: the file with the wrapper actions cut out, otherwise unchanged
    /// (one document of it if the file holds several).
    pub yaml: String,
}

fn values_key_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    R.get_or_init(|| {
        Regex::new(r"\.Values\.crds\.([A-Za-z_][A-Za-z0-9_]*)").expect("valid regex literal")
    })
}

fn invalid(file: &str, reason: impl Into<String>) -> ChartError {
    ChartError::InvalidCrd {
        file: file.to_string(),
        reason: reason.into(),
    }
}

/// Cut the `{{ if }}` … `{{ end }}` wrapper out of a CRD template.
fn strip_wrapper(file: &str, text: &str) -> Result<(String, Option<String>), ChartError> {
    let tokens = tokenize(text)
        .map_err(|(pos, why)| invalid(file, format!("line {}: {why}", line_of(text, pos))))?;
    let significant = |t: &&Token<'_>| match t {
        Token::Text { start, end } => !text[*start..*end].trim().is_empty(),
        Token::Action(_) => true,
    };
    let actions: Vec<_> = tokens
        .iter()
        .filter_map(|t| match t {
            Token::Action(a) => Some(a),
            Token::Text { .. } => None,
        })
        .collect();
    if actions.is_empty() {
        return Ok((text.to_string(), None));
    }
    let first = tokens.iter().find(significant);
    let last = tokens.iter().rev().find(significant);
    let (Some(Token::Action(open)), Some(Token::Action(close))) = (first, last) else {
        let a = actions[0];
        return Err(invalid(
            file,
            format!(
                "line {}: template action `{{{{ {} }}}}` is not part of an `{{{{ if }}}}` … `{{{{ end }}}}` wrapper around the whole file",
                line_of(text, a.start),
                a.inner
            ),
        ));
    };
    if keyword(open.inner) != "if" || keyword(close.inner) != "end" || actions.len() != 2 {
        let is_wrapper = |a: &&&super::template::Action<'_>| {
            (a.start == open.start && keyword(a.inner) == "if")
                || (a.start == close.start && keyword(a.inner) == "end")
        };
        let odd = actions
            .iter()
            .find(|a| !is_wrapper(a))
            .copied()
            .unwrap_or(open);
        return Err(invalid(
            file,
            format!(
                "line {}: template action `{{{{ {} }}}}` left after removing the `{{{{ if }}}}` … `{{{{ end }}}}` wrapper",
                line_of(text, odd.start),
                odd.inner
            ),
        ));
    }
    let cond = open.inner["if".len()..].trim();
    if !is_plain_condition(cond) {
        return Err(invalid(
            file,
            format!(
                "line {}: wrapper condition `{cond}` is not understood",
                line_of(text, open.start)
            ),
        ));
    }
    let values_key = values_key_re()
        .captures_iter(cond)
        .filter_map(|c| c.get(1).map(|m| m.as_str()))
        .find(|k| *k != "managed")
        .map(str::to_string);
    let mut yaml = String::with_capacity(text.len());
    yaml.push_str(&text[..open.start]);
    yaml.push_str(&text[open.end..close.start]);
    yaml.push_str(&text[close.end..]);
    Ok((yaml, values_key))
}

fn is_separator(line: &str) -> bool {
    let l = line.trim_end_matches(['\n', '\r']);
    l == "---" || l.starts_with("--- ") || l.starts_with("---\t")
}

/// Split YAML text into its non-empty documents, each with its `---` line, as slices.
fn documents(yaml: &str) -> Vec<&str> {
    let mut starts = vec![0];
    let mut offset = 0;
    for line in yaml.split_inclusive('\n') {
        if is_separator(line) && offset > 0 {
            starts.push(offset);
        }
        offset += line.len();
    }
    starts.push(yaml.len());
    let pieces: Vec<&str> = starts.windows(2).map(|w| &yaml[w[0]..w[1]]).collect();
    let has_content = |p: &&str| {
        p.lines().any(|l| {
            let t = l.trim();
            !(t.is_empty() || t.starts_with('#') || is_separator(l) || t == "...")
        })
    };
    let non_empty: Vec<&str> = pieces.into_iter().filter(has_content).collect();
    if non_empty.len() == 1 {
        vec![yaml]
    } else {
        non_empty
    }
}

fn str_at<'v>(v: &'v Value, path: &[&str]) -> Option<&'v str> {
    path.iter()
        .try_fold(v, |cur, key| cur.as_mapping()?.get(*key))
        .and_then(Value::as_str)
}

fn parse_crd(
    file: &str,
    doc_no: usize,
    total: usize,
    yaml: &str,
    values_key: Option<String>,
) -> Result<Crd, ChartError> {
    let which = if total > 1 {
        format!("document {}: ", doc_no + 1)
    } else {
        String::new()
    };
    // Bounded in size, depth and nodes before the parser builds anything (koord_base::yaml).
    let v = koord_base::yaml::parse_value(file, yaml.as_bytes(), &koord_base::yaml::CRD)
        .map_err(|e| invalid(file, format!("{which}{}", e.reason())))?;
    let need = |path: &[&str]| {
        str_at(&v, path)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .ok_or_else(|| invalid(file, format!("{which}`{}` is missing", path.join("."))))
    };
    let kind_of_doc = need(&["kind"])?;
    if kind_of_doc != "CustomResourceDefinition" {
        return Err(invalid(
            file,
            format!("{which}a {kind_of_doc}, not a CustomResourceDefinition"),
        ));
    }
    let api = need(&["apiVersion"])?;
    if !api.starts_with("apiextensions.k8s.io/") {
        return Err(invalid(
            file,
            format!("{which}apiVersion {api:?} is not apiextensions.k8s.io"),
        ));
    }
    let name = need(&["metadata", "name"])?;
    let group = need(&["spec", "group"])?;
    let plural = need(&["spec", "names", "plural"])?;
    let kind = need(&["spec", "names", "kind"])?;
    if name != format!("{plural}.{group}") {
        return Err(invalid(
            file,
            format!("{which}metadata.name {name:?} is not <plural>.<group> ({plural}.{group})"),
        ));
    }
    // Both become the bundle's file name: DNS names as the API server requires them (which
    // also keeps `/`, `..` and spaces out; regression: fuzzing found a group `../x`).
    if !is_dns_subdomain(&group) {
        return Err(invalid(
            file,
            format!("{which}spec.group {group:?} is not a DNS subdomain (lower-case letters, digits, '-' and '.')"),
        ));
    }
    if !koord_base::text::is_dns_label(&plural) {
        return Err(invalid(
            file,
            format!("{which}spec.names.plural {plural:?} is not a DNS label (lower-case letters, digits and '-', at most 63)"),
        ));
    }
    Ok(Crd {
        file_name: format!("{group}_{plural}.yaml"),
        source: file.to_string(),
        name,
        group,
        plural,
        kind,
        values_key,
        yaml: yaml.to_string(),
    })
}

/// An RFC 1123 subdomain: dot-separated labels, at most 253 characters.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(koord_base::text::is_dns_label)
}

/// The CRDs of a chart, in file order (`crds/` first, then `templates/`). See the module
/// documentation for what is accepted.
pub fn extract_crds(chart: &ChartArchive) -> Result<Vec<Crd>, ChartError> {
    // (source path, CRDs in that file, CRD)
    let mut found: Vec<(String, usize, Crd)> = Vec::new();
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for (path, bytes) in chart.files() {
        let plain = path.starts_with("crds/");
        if plain {
            let lower = path.to_ascii_lowercase();
            if !(lower.ends_with(".yaml") || lower.ends_with(".yml") || lower.ends_with(".json")) {
                continue;
            }
        } else if !is_rendered_template(path) {
            continue;
        }
        let in_crd_dir = path.starts_with("templates/crd/");
        let text = match std::str::from_utf8(bytes) {
            Ok(t) => t,
            Err(_) if plain || in_crd_dir => return Err(invalid(path, "not valid UTF-8")),
            Err(_) => continue,
        };
        if !(plain || in_crd_dir || declares_crd(text)) {
            continue;
        }
        let (yaml, values_key) = if plain {
            (text.to_string(), None)
        } else {
            strip_wrapper(path, text)?
        };
        let docs = documents(&yaml);
        if docs.is_empty() {
            return Err(invalid(path, "holds no CustomResourceDefinition"));
        }
        for (i, doc) in docs.iter().enumerate() {
            let crd = parse_crd(path, i, docs.len(), doc, values_key.clone())?;
            if let Some(other) = seen.insert(crd.name.clone(), path.to_string()) {
                return Err(invalid(
                    path,
                    format!("CRD {} is also defined in {other}", crd.name),
                ));
            }
            found.push((path.to_string(), docs.len(), crd));
        }
    }
    Ok(found.into_iter().map(|(_, _, crd)| crd).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chart::archive::tests::{chart_of, ALL, EVERY, TEST_CHART_YAML, V041, V111, V180};

    fn chart_with(files: &[(&str, &str)]) -> ChartArchive {
        let mut all = vec![("Chart.yaml", TEST_CHART_YAML)];
        all.extend_from_slice(files);
        chart_of(&all)
    }

    const CRD: &str = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: foos.x.io\nspec:\n  group: x.io\n  names:\n    kind: Foo\n    plural: foos\n  scope: Namespaced\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema:\n        description: 'Use {{ like this }}'\n        type: object\n";

    #[test]
    fn every_fixture() {
        let expected = [
            ("0.4.1", 3),
            ("1.1.1", 9),
            ("1.4.1", 10),
            ("1.6.0", 11),
            ("1.8.0", 13),
        ];
        for ((version, bytes), (v2, n)) in ALL.iter().zip(expected) {
            assert_eq!(*version, v2);
            let chart = ChartArchive::from_tgz(bytes).expect(version);
            let crds = extract_crds(&chart).expect(version);
            assert_eq!(crds.len(), n, "{version}");
            let mut names: Vec<&str> = crds.iter().map(|c| c.name.as_str()).collect();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), n, "{version}: unique names");
            for c in &crds {
                assert!(!c.yaml.contains("{{"), "{version} {}", c.file_name);
                assert_eq!(
                    c.file_name,
                    format!("{}_{}.yaml", c.group, c.plural),
                    "{version}"
                );
                let v: Value =
                    koord_base::yaml::parse_value("crd", c.yaml.as_bytes(), &koord_base::yaml::CRD)
                        .expect("yaml");
                assert_eq!(v["kind"], "CustomResourceDefinition");
                // The 1.6+ wrappers name the CRD's switch; older ones only `crds.managed`.
                if version.starts_with("1.6") || version.starts_with("1.8") {
                    assert_eq!(
                        c.values_key.as_deref(),
                        Some(c.plural.as_str()),
                        "{version} {}",
                        c.file_name
                    );
                    assert!(
                        chart.values()["crds"].get(&c.plural).is_some(),
                        "{version}: values have crds.{}",
                        c.plural
                    );
                } else {
                    assert_eq!(c.values_key, None);
                }
            }
        }
    }

    #[test]
    fn every_published_version_names_crds_after_the_crd() {
        for (version, bytes, _, n) in EVERY {
            let chart = ChartArchive::from_tgz(bytes).expect(version);
            let crds = extract_crds(&chart).expect(version);
            assert_eq!(crds.len(), n, "{version}");
            for c in &crds {
                assert_eq!(c.file_name, format!("{}_{}.yaml", c.group, c.plural));
                assert!(!c.file_name.contains(' '), "{version}: {}", c.file_name);
            }
            // 0.5.0 – 1.0.0 ship `topology.node.k8s.io_ noderesourcetopologies.yaml`.
            if let Some(nrt) = crds.iter().find(|c| c.source.contains(' ')) {
                assert_eq!(
                    nrt.file_name, "topology.node.k8s.io_noderesourcetopologies.yaml",
                    "{version}"
                );
            }
        }
        let spaced = EVERY
            .iter()
            .filter(|(_, b, _, _)| {
                let chart = ChartArchive::from_tgz(b).expect("chart");
                let spaced = chart.files().any(|(p, _)| p.contains(' '));
                spaced
            })
            .map(|(v, _, _, _)| *v)
            .collect::<Vec<_>>();
        assert_eq!(spaced, ["0.5.0", "0.6.0", "0.6.2", "0.7.0", "1.0.0"]);
    }

    #[test]
    fn group_and_plural_must_be_dns_names() {
        let clean = CRD.replace("{{ like this }}", "like this");
        for (from, to, why) in [
            ("group: x.io", "group: ../x.io", "spec.group"),
            ("group: x.io", "group: X.io", "spec.group"),
            ("plural: foos", "plural: 'fo os'", "spec.names.plural"),
            ("plural: foos", "plural: foos/..", "spec.names.plural"),
        ] {
            let name_from = "name: foos.x.io";
            let group = to.trim_start_matches("group: ");
            let plural = to.trim_start_matches("plural: ").trim_matches('\'');
            let name_to = if to.starts_with("group") {
                format!("name: foos.{group}")
            } else {
                format!("name: '{plural}.x.io'")
            };
            let text = clean.replace(from, to).replace(name_from, &name_to);
            let chart = chart_with(&[("crds/x.yaml", &text)]);
            let err = extract_crds(&chart).expect_err(to);
            assert!(err.to_string().contains(why), "{to}: {err}");
        }
    }

    #[test]
    fn v180_details() {
        let chart = ChartArchive::from_tgz(V180).expect("chart");
        let crds = extract_crds(&chart).expect("crds");
        let r = crds
            .iter()
            .find(|c| c.plural == "reservations")
            .expect("reservations");
        assert_eq!(r.name, "reservations.scheduling.koordinator.sh");
        assert_eq!(r.group, "scheduling.koordinator.sh");
        assert_eq!(r.kind, "Reservation");
        assert_eq!(r.file_name, "scheduling.koordinator.sh_reservations.yaml");
        // Byte for byte: the original minus the two wrapper actions.
        let original = std::str::from_utf8(
            chart
                .file("templates/crd/scheduling.koordinator.sh_reservations.yaml")
                .expect("file"),
        )
        .expect("utf8");
        let expected = original
            .replacen(
                "{{- if and .Values.crds.managed .Values.crds.reservations }}",
                "",
                1,
            )
            .replacen("{{- end }}", "", 1);
        assert_eq!(r.yaml, expected);
        assert!(r
            .yaml
            .starts_with("\n---\napiVersion: apiextensions.k8s.io/v1\n"));

        // The glued `{{- end }}`.
        let n = crds
            .iter()
            .find(|c| c.plural == "noderesourcetopologies")
            .expect("nrt");
        assert!(
            n.yaml.ends_with("      storage: true\n"),
            "{:?}",
            &n.yaml[n.yaml.len() - 40..]
        );
        assert_eq!(n.group, "topology.node.k8s.io");
    }

    #[test]
    fn old_layouts() {
        let chart = ChartArchive::from_tgz(V041).expect("chart");
        let files: Vec<String> = extract_crds(&chart)
            .expect("crds")
            .into_iter()
            .map(|c| c.file_name)
            .collect();
        assert_eq!(
            files,
            [
                "config.koordinator.sh_clustercolocationprofiles.yaml",
                "slo.koordinator.sh_nodemetrics.yaml",
                "slo.koordinator.sh_nodeslos.yaml"
            ]
        );
        let chart = ChartArchive::from_tgz(V111).expect("chart");
        assert!(extract_crds(&chart)
            .expect("crds")
            .iter()
            .all(|c| c.values_key.is_none()));
    }

    #[test]
    fn crds_folder_and_multi_documents() {
        let clean = CRD.replace("{{ like this }}", "like this");
        let bars = clean.replace("foos", "bars").replace("Foo", "Bar");
        let bazs = clean.replace("foos", "bazs").replace("Foo", "Baz");
        let two = format!("{{{{- if and .Values.crds.managed .Values.crds.extra }}}}\n# two CRDs\n---\n{bars}---\n{bazs}{{{{- end }}}}\n");
        let chart = chart_with(&[
            ("crds/foo.yaml", CRD),
            ("crds/README.md", "not yaml"),
            ("templates/crd/two.yaml", &two),
            ("templates/crd/_helpers.tpl", "{{ define \"x\" }}{{ end }}"),
        ]);
        let crds = extract_crds(&chart).expect("crds");
        let names: Vec<&str> = crds.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["foos.x.io", "bars.x.io", "bazs.x.io"]);
        // crds/ files are not templates: kept as they are, `{{` included.
        assert_eq!(crds[0].yaml, CRD);
        assert!(crds[0].values_key.is_none());
        assert_eq!(crds[1].values_key.as_deref(), Some("extra"));
        assert_eq!(crds[1].yaml, format!("---\n{bars}"));
        assert_eq!(crds[2].yaml, format!("---\n{bazs}\n"));
        // Named after each CRD, never after the file.
        let files: Vec<&str> = crds.iter().map(|c| c.file_name.as_str()).collect();
        assert_eq!(
            files,
            ["x.io_foos.yaml", "x.io_bars.yaml", "x.io_bazs.yaml"]
        );
        assert_eq!(crds[0].source, "crds/foo.yaml");
    }

    #[test]
    fn errors_name_the_file() {
        let wrap =
            |body: &str| format!("{{{{- if .Values.crds.managed }}}}\n{body}{{{{- end }}}}\n");
        let clean = CRD.replace("{{ like this }}", "like this");
        let cases: Vec<(String, &str)> = vec![
            (
                wrap(&clean.replace("foos.x.io", "{{ .Values.name }}")),
                "left after removing",
            ),
            (format!("{{{{ include \"x\" . }}}}\n{clean}"), "wrapper"),
            (
                wrap("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"),
                "not a CustomResourceDefinition",
            ),
            (
                wrap(&clean.replace("  name: foos.x.io\n", "")),
                "metadata.name",
            ),
            (
                wrap(&clean.replace("foos.x.io", "other.x.io")),
                "<plural>.<group>",
            ),
            (wrap("a: [\n"), "not valid YAML"),
            (wrap(""), "no CustomResourceDefinition"),
            (
                format!("{{{{ if include \"x\" . }}}}\n{clean}{{{{ end }}}}"),
                "not understood",
            ),
            ("{{ if .Values.x }\n".to_string(), "unterminated"),
        ];
        for (text, why) in cases {
            let chart = chart_with(&[("templates/crd/x.yaml", &text)]);
            let err = extract_crds(&chart).expect_err(why);
            let msg = err.to_string();
            assert!(
                msg.starts_with("CRD file templates/crd/x.yaml: ") && msg.contains(why),
                "{why}: {msg}"
            );
        }
        let chart = chart_with(&[
            ("crds/a.yaml", CRD),
            (
                "templates/crd/b.yaml",
                &wrap(&CRD.replace("{{ like this }}", "x")),
            ),
        ]);
        let err = extract_crds(&chart).expect_err("duplicate");
        assert!(
            err.to_string().contains("also defined in crds/a.yaml"),
            "{err}"
        );
    }
}
