//! Find the container images a chart deploys, for given values.
//!
//! Two ways, one rule. The truth is the rendered manifests: the `image` of every container,
//! init container and ephemeral container, at any depth of any document
//! ([`super::rendered`]).
//!
//! * [`images_from_rendered`]: from what real `helm template` printed (the command layer runs
//!   helm; `--discover helm|auto`).
//! * [`discover_images`]: without helm. Every rendered file under `templates/` (not partials
//!   `_*`, not `NOTES.txt`; CRD templates too, as helm renders them, their CRD documents left
//!   to [`super::crds`]) is rendered by the built-in engine (`engine.rs`) as
//!   helm would, with release `koordinator` in `koordinator-system`, and read the same way.
//!   What the engine cannot know is refused where an image depends on it, never guessed.
//!   Cross-check: every `<component>.image.repository` of the values must be mentioned by some
//!   template (or rendered): a misspelt `--set` is looked at, not ignored
//!   ([`ChartError::UnusedImageValue`]). Subcharts are refused ([`ChartError::UnsupportedChart`]).
//!
//! Both split each reference Docker-style (an empty host is Docker Hub: the 0.1–0.4 charts),
//! check host, repository and tag, name each image after the values component whose
//! `image.repository` it uses, and return them sorted, one per reference.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use regex::Regex;
use serde_yaml_ng::Value;

use super::{scalar_to_string, ChartArchive, ChartError};

/// A container image a chart deploys.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ChartImage {
    /// Values path of the component (`manager`, `deviceDaemon`); for an image line without
    /// a `<component>.image.repository` reference: the one values path it uses, or "" for a
    /// literal.
    pub component: String,
    /// Registry host as rendered (the evaluated `imageRepositoryHost`); may be "".
    pub host: String,
    /// Repository as in the values (`koordinator-sh/koord-manager`).
    pub repository: String,
    /// Tag (`v1.8.0`); `latest` when the line renders none, as the kubelet would.
    pub tag: String,
    /// Template that deploys it (`templates/koord-manager.yaml`).
    pub template: String,
}

impl ChartImage {
    /// `host/repository:tag`, or `repository:tag` when the host is empty.
    pub fn reference(&self) -> String {
        if self.host.is_empty() {
            format!("{}:{}", self.repository, self.tag)
        } else {
            format!("{}/{}:{}", self.host, self.repository, self.tag)
        }
    }
}

use super::re;

fn crd_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r#"(?m)^kind:[ \t]*["']?CustomResourceDefinition["']?[ \t]*\r?$"#,
    )
}

/// Does this text declare a CustomResourceDefinition (a top-level `kind:` line)?
pub(crate) fn declares_crd(text: &str) -> bool {
    crd_re().is_match(text)
}

/// Is this chart file rendered as a manifest by Helm (not a partial, not NOTES.txt)?
pub(crate) fn is_rendered_template(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    path.starts_with("templates/") && !base.starts_with('_') && base != "NOTES.txt"
}

fn host_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"^(?:(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])(?::[0-9]+)?$",
    )
}

fn repo_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(
        &R,
        r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$",
    )
}

fn tag_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(&R, r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
}

/// Split a rendered reference Docker-style: (host, repository, tag).
fn split_reference(r: &str) -> Result<(String, String, String), String> {
    if r.contains('@') {
        return Err("digest references (`@sha256:...`) are not supported".into());
    }
    let (name, tag) = match r.rfind(':') {
        Some(i) if !r[i..].contains('/') => (&r[..i], &r[i + 1..]),
        _ => (r, "latest"),
    };
    let (host, repo) = match name.split_once('/') {
        Some((h, rest)) if h.contains(['.', ':']) || h == "localhost" || h.starts_with('[') => {
            (h, rest)
        }
        _ => ("", name),
    };
    Ok((host.to_string(), repo.to_string(), tag.to_string()))
}

/// A rendered reference as a [`ChartImage`] of `template` (its component left for the caller
/// to name), split Docker-style and checked: a valid host, repository and tag that give the
/// reference back.
fn parse_image(reference: &str, template: &str) -> Result<ChartImage, String> {
    if reference.starts_with('/') {
        return Err("empty registry host before '/' (is imageRepositoryHost empty?)".into());
    }
    let (host, repository, tag) = split_reference(reference)?;
    let defaulted_tag = !reference.ends_with(&format!(":{tag}"));
    let img = ChartImage {
        component: String::new(),
        host,
        repository,
        tag,
        template: template.to_string(),
    };
    if !img.host.is_empty() && !host_re().is_match(&img.host) {
        return Err(format!("invalid registry host {:?}", img.host));
    }
    if !repo_re().is_match(&img.repository) {
        return Err(format!(
            "invalid repository {:?} (lower-case path components separated by '/')",
            img.repository
        ));
    }
    if !tag_re().is_match(&img.tag) {
        return Err(format!("invalid tag {:?}", img.tag));
    }
    let expected = if defaulted_tag {
        format!("{reference}:latest")
    } else {
        reference.to_string()
    };
    if img.reference() != expected {
        return Err(format!(
            "cannot split it into registry, repository and tag (got {})",
            img.reference()
        ));
    }
    Ok(img)
}

/// Values paths of components declaring an image (`<path>.image.repository`).
fn declared_images(values: &Value, path: &mut Vec<String>, out: &mut Vec<(String, String)>) {
    let Value::Mapping(m) = values else { return };
    if let Some(Value::Mapping(img)) = m.get("image") {
        if let Some(repo) = img.get("repository") {
            let shown = scalar_to_string(repo).unwrap_or_else(|| format!("{repo:?}"));
            out.push((path.join("."), shown));
        }
    }
    for (k, v) in m {
        if let (Some(key), Value::Mapping(_)) = (k.as_str(), v) {
            path.push(key.to_string());
            declared_images(v, path, out);
            path.pop();
        }
    }
}

/// The release name and namespace the built-in reader renders with (the `load` defaults,
/// and what `--discover helm` passes to `helm template`).
pub const RELEASE: &str = "koordinator";
/// See [`RELEASE`].
pub const NAMESPACE: &str = "koordinator-system";

/// A rendered scalar stands for an unknown: `kbunknown<N>kb`.
fn placeholder(i: usize) -> String {
    format!("kbunknown{i}kb")
}

/// The unknown a placeholder-bearing text stands for.
fn placeholder_in(text: &str) -> Option<usize> {
    let start = text.find("kbunknown")? + "kbunknown".len();
    let end = text[start..].find("kb")? + start;
    text[start..end].parse().ok()
}

/// A placeholder where a container (or a list or map of them) could hide: the value of a key
/// on the way to a pod spec, a whole document, a mapping key.
fn hidden_structure(v: &Value, key: Option<&str>) -> Option<usize> {
    const PATH: [&str; 8] = [
        "spec",
        "template",
        "jobTemplate",
        "containers",
        "initContainers",
        "ephemeralContainers",
        "podTemplate",
        "items",
    ];
    match v {
        Value::String(s) if key.is_none_or(|k| PATH.contains(&k)) => placeholder_in(s),
        Value::Mapping(m) => m.iter().find_map(|(k, val)| {
            let ks = k.as_str();
            ks.and_then(placeholder_in)
                .or_else(|| hidden_structure(val, Some(ks.unwrap_or(""))))
        }),
        Value::Sequence(l) => l.iter().find_map(|x| match (key, x) {
            (Some(k), Value::String(s)) if PATH.contains(&k) => placeholder_in(s),
            _ => hidden_structure(x, Some("")),
        }),
        Value::Tagged(t) => hidden_structure(&t.value, key),
        _ => None,
    }
}

/// The images `chart` deploys with `values` (the chart's values merged with the user's
/// overrides: see [`super::values`]), read without helm: every rendered template is rendered
/// by the built-in engine (see `engine.rs`) as `helm template` would, and the `image` of every
/// container, init container and ephemeral container of the result is taken, exactly as from
/// helm's output ([`images_from_rendered`]). Sorted by repository (then host, tag), one per
/// reference.
///
/// Refused, naming the file and line, never guessed: an image (or a structure that could hold
/// containers) that depends on something only helm or the cluster knows
/// ([`ChartError::Unevaluable`], [`ChartError::UnresolvedImage`]); rendering that helm would
/// fail too ([`ChartError::TemplateFailed`]); a `<component>.image.repository` in the values
/// that no template mentions ([`ChartError::UnusedImageValue`]: a misspelt `--set`); subcharts
/// ([`ChartError::UnsupportedChart`]).
pub fn discover_images(
    chart: &ChartArchive,
    values: &Value,
) -> Result<Vec<ChartImage>, ChartError> {
    if chart.files().any(|(p, _)| p.starts_with("charts/")) {
        return Err(ChartError::UnsupportedChart {
            chart: chart.label(),
            reason: "subcharts (files under charts/): their images would not be discovered".into(),
        });
    }
    let (mut engine, parsed) = super::engine::Engine::new(chart, values, RELEASE, NAMESPACE)?;
    let mut found: Vec<super::rendered::RenderedImage> = Vec::new();
    let mut all_text = String::new();
    for (path, p) in &parsed {
        let Some(text) = chart.file(path).and_then(|b| std::str::from_utf8(b).ok()) else {
            continue;
        };
        all_text.push_str(text);
        if !is_rendered_template(path) {
            continue;
        }
        let rendered = engine.render(path, p)?;
        let unevaluable = |u: &super::engine::Unknown| ChartError::Unevaluable {
            template: u.file.clone(),
            line: u.line,
            action: u.action.clone(),
            reason: u.reason.clone(),
        };
        // Markers to placeholders; a fatal one refuses the file wherever it landed.
        let mut text_out = String::with_capacity(rendered.text.len());
        let mut rest = rendered.text.as_str();
        while let Some(start) = rest.find(super::engine::OPEN) {
            text_out.push_str(&rest[..start]);
            let Some(i) = super::engine::first_marker(&rest[start..]) else {
                return Err(ChartError::TemplateFailed {
                    template: path.clone(),
                    line: 0,
                    reason: "the template renders a private-use character the built-in reader uses itself".into(),
                });
            };
            if let Some(u) = engine.unknowns.get(i).filter(|u| u.fatal) {
                return Err(unevaluable(u));
            }
            text_out.push_str(&placeholder(i));
            let close = rest[start..]
                .find(super::engine::CLOSE)
                .map_or(rest.len(), |c| start + c + super::engine::CLOSE.len_utf8());
            rest = &rest[close..];
        }
        text_out.push_str(rest);
        if text_out.contains(super::engine::CLOSE) {
            return Err(ChartError::TemplateFailed {
                template: path.clone(),
                line: 0,
                reason:
                    "the template renders a private-use character the built-in reader uses itself"
                        .into(),
            });
        }
        let line_at = |offset: usize| {
            rendered
                .lines
                .iter()
                .rev()
                .find(|(o, _)| *o <= offset)
                .map_or(0, |(_, l)| *l)
        };
        for (_, doc) in super::rendered::split_documents(&text_out) {
            // A CRD deploys no container; it is read (and refused if bad) by `crds`.
            if declares_crd(&doc) {
                continue;
            }
            let what = format!("{path} (as rendered)");
            let v = match crate::yaml::parse_value(&what, doc.as_bytes(), &crate::yaml::MANIFESTS) {
                Ok(v) => v,
                Err(e) => {
                    if let Some(u) = placeholder_in(&doc).and_then(|i| engine.unknowns.get(i)) {
                        return Err(unevaluable(u));
                    }
                    return Err(ChartError::InvalidYaml {
                        file: what,
                        reason: e.reason(),
                    });
                }
            };
            if let Some(u) = hidden_structure(&v, None).and_then(|i| engine.unknowns.get(i)) {
                return Err(unevaluable(u));
            }
            let mut imgs = Vec::new();
            super::rendered::collect(&v, path, &mut imgs).map_err(|reason| {
                ChartError::InvalidYaml {
                    file: what.clone(),
                    reason,
                }
            })?;
            for img in imgs {
                if let Some(i) = placeholder_in(&img.image) {
                    let u = engine.unknowns.get(i);
                    let offset = text_out.find(&img.image).unwrap_or(0);
                    return Err(ChartError::UnresolvedImage {
                        template: u.map_or_else(|| path.clone(), |u| u.file.clone()),
                        line: u.map_or_else(|| line_at(offset), |u| u.line),
                        text: u.map(|u| u.action.clone()).unwrap_or_default(),
                        reason: u.map(|u| u.reason.clone()).unwrap_or_default(),
                    });
                }
                found.push(img);
            }
        }
        // Invalid references are reported at their line.
        for img in found.iter().filter(|i| i.source == *path) {
            if let Err(reason) = parse_image(&img.image, path) {
                let offset = text_out.find(&img.image).unwrap_or(0);
                return Err(ChartError::InvalidImage {
                    template: path.clone(),
                    line: line_at(offset),
                    reference: img.image.clone(),
                    reason,
                });
            }
        }
    }
    let images = images_from_rendered(&found, values)?;
    // Every image the values declare must be mentioned by some template: a misspelt `--set`
    // (or a component this chart version lacks) is looked at, not ignored.
    let mut declared = Vec::new();
    declared_images(values, &mut Vec::new(), &mut declared);
    for (component, repository) in declared {
        let needle = if component.is_empty() {
            ".Values.image".to_string()
        } else {
            format!(".Values.{component}")
        };
        let mentioned = all_text.match_indices(&needle).any(|(i, _)| {
            !all_text[i + needle.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
        });
        let rendered = images.iter().any(|i| i.repository == repository);
        if !(mentioned || rendered) {
            return Err(ChartError::UnusedImageValue {
                component,
                repository,
            });
        }
    }
    Ok(images)
}

/// The images of a chart as real `helm template` rendered them (see
/// [`super::rendered::images_in_manifests`]): each rendered reference split Docker-style
/// (an empty host is Docker Hub), checked as the built-in reader checks its own, and named
/// after the values component whose `image.repository` it uses (else its container's name).
/// Sorted and deduplicated like [`discover_images`].
pub fn images_from_rendered(
    rendered: &[super::rendered::RenderedImage],
    values: &Value,
) -> Result<Vec<ChartImage>, ChartError> {
    let mut declared = Vec::new();
    declared_images(values, &mut Vec::new(), &mut declared);
    let mut images = Vec::new();
    for r in rendered {
        let invalid = |reason: String| ChartError::InvalidRenderedImage {
            template: if r.source.is_empty() {
                "rendered manifests".into()
            } else {
                r.source.clone()
            },
            reference: r.image.clone(),
            reason,
        };
        let mut img = parse_image(&r.image, &r.source).map_err(invalid)?;
        let repository = img.repository.clone();
        img.component = declared
            .iter()
            .find(|(_, repo)| *repo == repository || repository.ends_with(&format!("/{repo}")))
            .map(|(c, _)| c.clone())
            .unwrap_or_else(|| r.container.clone());
        images.push(img);
    }
    images.sort_by(|a, b| {
        (&a.repository, &a.host, &a.tag, &a.component, &a.template).cmp(&(
            &b.repository,
            &b.host,
            &b.tag,
            &b.component,
            &b.template,
        ))
    });
    let mut seen = BTreeSet::new();
    images.retain(|i| seen.insert(i.reference()));
    Ok(images)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chart::archive::tests::{
        chart_of, EVERY, TEST_CHART_YAML, V041, V111, V141, V160, V180,
    };
    use crate::chart::values::{apply_set, merge_values};

    fn discover(bytes: &[u8], sets: &[&str]) -> Result<Vec<ChartImage>, ChartError> {
        let chart = ChartArchive::from_tgz(bytes).expect("chart");
        let mut v = chart.values().clone();
        for s in sets {
            apply_set(&mut v, s).expect("set");
        }
        discover_images(&chart, &v)
    }

    fn refs(images: &[ChartImage]) -> Vec<String> {
        images.iter().map(ChartImage::reference).collect()
    }

    #[test]
    fn v180_five_images() {
        let images = discover(V180, &[]).expect("discover");
        let h = "registry.cn-beijing.aliyuncs.com/koordinator-sh";
        assert_eq!(
            refs(&images),
            [
                format!("{h}/koord-descheduler:v1.8.0"),
                format!("{h}/koord-device-daemon:v1.8.0"),
                format!("{h}/koord-manager:v1.8.0"),
                format!("{h}/koord-scheduler:v1.8.0"),
                format!("{h}/koordlet:v1.8.0"),
            ]
        );
        let dd = &images[1];
        assert_eq!(dd.component, "deviceDaemon");
        assert_eq!(dd.host, "registry.cn-beijing.aliyuncs.com");
        assert_eq!(dd.repository, "koordinator-sh/koord-device-daemon");
        assert_eq!(dd.tag, "v1.8.0");
        assert_eq!(dd.template, "templates/koord-device-daemon.yaml");
        let comps: Vec<&str> = images.iter().map(|i| i.component.as_str()).collect();
        assert_eq!(
            comps,
            [
                "descheduler",
                "deviceDaemon",
                "manager",
                "scheduler",
                "koordlet"
            ]
        );
    }

    #[test]
    fn v160_v141_v111_four_images() {
        for (bytes, tag) in [(V160, "v1.6.0"), (V141, "v1.4.1"), (V111, "v1.1.1")] {
            let images = discover(bytes, &[]).expect("discover");
            let repos: Vec<&str> = images.iter().map(|i| i.repository.as_str()).collect();
            assert_eq!(
                repos,
                [
                    "koordinator-sh/koord-descheduler",
                    "koordinator-sh/koord-manager",
                    "koordinator-sh/koord-scheduler",
                    "koordinator-sh/koordlet"
                ],
                "{tag}"
            );
            assert!(
                images
                    .iter()
                    .all(|i| i.tag == tag && i.host == "registry.cn-beijing.aliyuncs.com"),
                "{tag}"
            );
        }
    }

    #[test]
    fn v041_hostless_and_with_host() {
        let images = discover(V041, &[]).expect("discover");
        assert_eq!(
            refs(&images),
            [
                "koordinatorsh/koord-manager:v0.4.1",
                "koordinatorsh/koord-scheduler:v0.4.1",
                "koordinatorsh/koordlet:v0.4.1"
            ]
        );
        assert!(images.iter().all(|i| i.host.is_empty()));
        let lines: Vec<&str> = images.iter().map(|i| i.template.as_str()).collect();
        assert_eq!(
            lines,
            [
                "templates/koord-manager.yaml",
                "templates/koord-scheduler.yaml",
                "templates/koordlet.yaml"
            ]
        );

        let images = discover(V041, &["imageRepositoryHost=ghcr.io"]).expect("discover");
        assert_eq!(
            refs(&images),
            [
                "ghcr.io/koordinatorsh/koord-manager:v0.4.1",
                "ghcr.io/koordinatorsh/koord-scheduler:v0.4.1",
                "ghcr.io/koordinatorsh/koordlet:v0.4.1"
            ]
        );
        assert!(images
            .iter()
            .all(|i| i.host == "ghcr.io" && i.repository.starts_with("koordinatorsh/")));
    }

    #[test]
    fn overrides_change_images() {
        let images = discover(V180, &["manager.image.tag=v9"]).expect("discover");
        let m = images
            .iter()
            .find(|i| i.component == "manager")
            .expect("manager");
        assert_eq!(m.tag, "v9");
        assert_eq!(
            m.reference(),
            "registry.cn-beijing.aliyuncs.com/koordinator-sh/koord-manager:v9"
        );
        assert!(images
            .iter()
            .filter(|i| i.component != "manager")
            .all(|i| i.tag == "v1.8.0"));

        let images = discover(
            V180,
            &["imageRepositoryHost=ghcr.io,koordlet.image.repository=me/koordlet"],
        )
        .expect("d");
        assert!(images.iter().all(|i| i.host == "ghcr.io"));
        assert!(refs(&images).contains(&"ghcr.io/me/koordlet:v1.8.0".to_string()));

        // A values file overlay, then numeric tag from --set (typed as int, rendered as text).
        let chart = ChartArchive::from_tgz(V180).expect("chart");
        let mut v = chart.values().clone();
        merge_values(
            &mut v,
            &crate::yaml::parse_value(
                "t",
                b"scheduler: {image: {tag: v1.8.1}}",
                &crate::yaml::VALUES,
            )
            .expect("yaml"),
        );
        apply_set(&mut v, "descheduler.image.tag=18").expect("set");
        let images = discover_images(&chart, &v).expect("discover");
        let tags: Vec<(&str, &str)> = images
            .iter()
            .map(|i| (i.component.as_str(), i.tag.as_str()))
            .collect();
        assert!(
            tags.contains(&("scheduler", "v1.8.1")) && tags.contains(&("descheduler", "18")),
            "{tags:?}"
        );
    }

    #[test]
    fn same_reference_is_deduplicated() {
        let images = discover(
            V180,
            &["koordlet.image.repository=koordinator-sh/koord-manager,koordlet.image.tag=v1.8.0"],
        )
        .expect("discover");
        assert_eq!(images.len(), 4);
    }

    #[test]
    fn errors_name_template_and_line() {
        // Empty host on a 1.x chart renders "/koordinator-sh/...": invalid.
        let err = discover(V180, &["imageRepositoryHost="]).expect_err("empty host");
        let msg = err.to_string();
        assert!(matches!(err, ChartError::InvalidImage { .. }), "{msg}");
        assert!(
            msg.contains("templates/") && msg.contains("imageRepositoryHost"),
            "{msg}"
        );

        // A missing value renders nothing, as in helm: the reference has no tag.
        let err = discover(V180, &["manager.image.tag=null"]).expect_err("missing tag");
        match &err {
            ChartError::InvalidImage {
                template,
                line,
                reference,
                reason,
            } => {
                assert_eq!(template, "templates/koord-manager.yaml");
                assert_eq!(*line, 63);
                assert!(reference.ends_with("koord-manager:"), "{reference}");
                assert!(reason.contains("invalid tag"), "{reason}");
            }
            other => panic!("unexpected {other}"),
        }
        assert!(
            err.to_string()
                .starts_with("templates/koord-manager.yaml:63: "),
            "{err}"
        );

        // A non-scalar value prints as Go prints a map.
        let err = discover(V180, &["manager.image.tag.x=1"]).expect_err("mapping tag");
        assert!(err.to_string().contains("map[x:1]"), "{err}");

        // An image in values that no template uses.
        let err = discover(
            V180,
            &["sidecar.image.repository=foo/bar,sidecar.image.tag=v1"],
        )
        .expect_err("unused");
        match &err {
            ChartError::UnusedImageValue {
                component,
                repository,
            } => {
                assert_eq!(component, "sidecar");
                assert_eq!(repository, "foo/bar");
            }
            other => panic!("unexpected {other}"),
        }
        // The device daemon does not exist in 1.6.0.
        let err = discover(V160, &["deviceDaemon.image.repository=x/y"]).expect_err("unused");
        assert!(
            err.to_string().contains("deviceDaemon.image.repository"),
            "{err}"
        );
    }

    fn chart_with(templates: &[(&str, &str)], values: &str) -> ChartArchive {
        chart_with_meta(TEST_CHART_YAML, templates, values)
    }

    fn chart_with_meta(meta: &str, templates: &[(&str, &str)], values: &str) -> ChartArchive {
        let mut files = vec![("Chart.yaml", meta), ("values.yaml", values)];
        files.extend_from_slice(templates);
        chart_of(&files)
    }

    #[test]
    fn template_forms() {
        let values = "reg: r.example:5000\na:\n  image: {repository: org/a, tag: '1.0'}\nb:\n  enabled: false\n  image: {repository: org/b, tag: v2}\nc: {image: {repository: org/c}}\n";
        let t = r#"
# image: commented/out:1
spec:
  template:
    spec:
      containers:
      - image: {{ .Values.reg -}} /{{ .Values.a.image.repository }}:{{ .Values.a.image.tag }}  # comment
        name: a
      - name: literal
        image: 'busybox:1.36'
{{- if .Values.b.enabled }}
      - image: "{{ .Values.reg }}/{{ .Values.b.image.repository }}:{{ .Values.b.image.tag }}"
        name: b
{{- end }}
      - image: {{ $.Values.c.image.repository }}
        name: c
{{/* image: in a comment {{ include "x" . }} */}}
{{- define "unused" }}
  image: {{ include "nope" . }}
{{- end }}
      volumes:
      - name: x
        image:
          reference: not-an-image
{{- if semverCompare ">=1.22" .Capabilities.KubeVersion.Version }}
      priorityClassName: high
{{- end }}
"#;
        let chart = chart_with(
            &[
                ("templates/d.yaml", t),
                ("templates/_h.tpl", "{{ define \"x\" }}image: y{{ end }}\n"),
            ],
            values,
        );
        let images = discover_images(&chart, chart.values()).expect("discover");
        let got: Vec<(String, &str)> = images
            .iter()
            .map(|i| (i.reference(), i.component.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("busybox:1.36".to_string(), "literal"),
                ("r.example:5000/org/a:1.0".to_string(), "a"),
                ("org/c:latest".to_string(), "c"),
            ]
        );
        assert_eq!(images[1].host, "r.example:5000");

        let mut v = chart.values().clone();
        apply_set(&mut v, "b.enabled=true").expect("set");
        let images = discover_images(&chart, &v).expect("discover");
        assert!(refs(&images).contains(&"r.example:5000/org/b:v2".to_string()));
    }

    /// The idioms most charts use, each rendered as helm renders it.
    #[test]
    fn common_helm_idioms() {
        let values = r#"
global:
  imageRegistry: ""
image:
  registry: docker.io
  repository: org/app
  tag: ""
sidecar:
  enabled: false
  image: {registry: quay.io, repository: org/side, tag: "2.0"}
init:
  image: {registry: "", repository: org/init, tag: "1.1"}
exporter:
  image: {repository: org/exporter, tag: v3}
"#;
        let helpers = r#"
{{- define "c.image" -}}
{{- $registry := .imageRoot.registry -}}
{{- if .global.imageRegistry }}{{ $registry = .global.imageRegistry }}{{ end -}}
{{- $tag := .imageRoot.tag | default .chart.AppVersion | toString -}}
{{- if $registry -}}
{{- printf "%s/%s:%s" $registry .imageRoot.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" .imageRoot.repository $tag -}}
{{- end -}}
{{- end -}}
{{- define "c.name" -}}{{ .Release.Name }}-{{ .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
"#;
        let deploy = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "c.name" . }}
  namespace: {{ .Release.Namespace | quote }}
  labels: {{- include "c.labels" . | nindent 4 }}
spec:
  template:
    spec:
      {{- with .Values.init }}
      initContainers:
        - name: init
          image: {{ include "c.image" (dict "imageRoot" .image "global" $.Values.global "chart" $.Chart) | quote }}
      {{- end }}
      containers:
        - name: app
          image: "{{ .Values.image.registry }}/{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
          resources: {{- toYaml .Values.resources | nindent 12 }}
        {{- if .Values.sidecar.enabled }}
        - name: side
          image: {{ include "c.image" (dict "imageRoot" .Values.sidecar.image "global" .Values.global "chart" .Chart) }}
        {{- end }}
---
apiVersion: batch/v1
kind: CronJob
metadata:
  name: {{ printf "%s-exporter" .Release.Name }}
spec:
  jobTemplate:
    spec:
      template:
        spec:
          containers:
          {{- range $name, $c := dict "exporter" .Values.exporter }}
            - name: {{ $name }}
              image: {{ printf "%s:%s" $c.image.repository $c.image.tag | squote }}
          {{- end }}
"#;
        let labels = "{{- define \"c.labels\" -}}\napp: {{ .Chart.Name }}\nversion: {{ .Chart.Version | quote }}\n{{- end -}}\n";
        let chart = chart_with_meta(
            "apiVersion: v2\nname: c\nversion: 1.2.3\nappVersion: \"4.5.6\"\n",
            &[
                ("templates/_helpers.tpl", helpers),
                ("templates/_labels.tpl", labels),
                ("templates/deploy.yaml", deploy),
                ("templates/NOTES.txt", "image: {{ .Values.nothing.here }}\n"),
                (
                    "crds/x.yaml",
                    "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n",
                ),
            ],
            values,
        );
        let found = |sets: &[&str]| {
            let mut v = chart.values().clone();
            for s in sets {
                apply_set(&mut v, s).expect("set");
            }
            refs(&discover_images(&chart, &v).expect("discover"))
        };
        assert_eq!(
            found(&[]),
            ["docker.io/org/app:4.5.6", "org/exporter:v3", "org/init:1.1",]
        );
        assert_eq!(
            found(&[
                "sidecar.enabled=true",
                "image.tag=9",
                "global.imageRegistry=mirror.example:5000"
            ]),
            [
                "docker.io/org/app:9",
                "org/exporter:v3",
                "mirror.example:5000/org/init:1.1",
                "mirror.example:5000/org/side:2.0",
            ]
        );
    }

    /// Helm renders every template, a CRD's included: a workload in the same file as a CRD
    /// deploys its image like any other.
    #[test]
    fn a_workload_next_to_a_crd_in_one_template_is_read() {
        let t = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: foos.x.io\n---\nkind: Deployment\nspec:\n  template:\n    spec:\n      containers:\n      - name: a\n        image: {{ .Values.a.image.repository }}:{{ .Values.a.image.tag }}\n";
        let chart = chart_with(
            &[("templates/both.yaml", t)],
            "a: {image: {repository: org/a, tag: v1}}\n",
        );
        let images = discover_images(&chart, chart.values()).expect("discover");
        assert_eq!(refs(&images), ["org/a:v1"]);
    }

    #[test]
    fn unresolvable_forms_are_refused_with_file_and_line() {
        let values = "a: {image: {repository: org/a, tag: v1}}\n";
        let pod = |line: &str| format!("spec:\n  containers:\n  - name: x\n    {line}\n");
        for (t, why) in [
            (
                pod("image: {{ .Values.a.image.repository }}:{{ randAlphaNum 5 }}"),
                "the function `randAlphaNum`",
            ),
            (
                pod("image: {{ .Values.a.image.repository }}:{{ .Capabilities.KubeVersion.Minor }}"),
                ".Capabilities",
            ),
            (
                "spec:\n{{- if semverCompare \">=1.22\" .Capabilities.KubeVersion.Version }}\n  containers: [{name: x, image: 'org/a:v1'}]\n{{- end }}\n".to_string(),
                "a branch renders container images",
            ),
            (
                "spec:\n  containers: {{ toYaml (list (dict \"name\" \"x\" \"image\" (.Values.a.image.repository | randAlphaNum))) | nindent 4 }}\n".to_string(),
                "randAlphaNum",
            ),
        ] {
            let chart = chart_with(&[("templates/x.yaml", &t)], values);
            let err = discover_images(&chart, chart.values()).expect_err(&t);
            let msg = err.to_string();
            assert!(
                msg.starts_with("templates/x.yaml:") && msg.contains(why),
                "{t}\n=> {msg}"
            );
        }
        // What helm fails on, the built-in reader fails on too.
        for (t, why) in [
            (
                pod("image: {{ .Values.missing.image.repository }}"),
                "nil pointer",
            ),
            (
                pod("image: {{ required \"set a.image.x\" .Values.a.image.x }}"),
                "set a.image.x",
            ),
            (pod("image: {{ include \"img\" . }}"), "no template \"img\""),
        ] {
            let chart = chart_with(&[("templates/x.yaml", &t)], values);
            let err = discover_images(&chart, chart.values()).expect_err(&t);
            assert!(
                matches!(err, ChartError::TemplateFailed { .. }) && err.to_string().contains(why),
                "{t}\n=> {err}"
            );
        }
        let chart = chart_with(
            &[("templates/x.yaml", "{{ if .Values.a }}\nimage: x\n")],
            values,
        );
        assert!(matches!(
            discover_images(&chart, chart.values()),
            Err(ChartError::TemplateSyntax { .. })
        ));
        let chart = chart_with(&[("templates/x.yaml", "a: b\n")], values);
        assert!(matches!(
            discover_images(&chart, chart.values()),
            Err(ChartError::UnusedImageValue { .. })
        ));
        let chart = chart_with(
            &[
                (
                    "templates/x.yaml",
                    &pod("image: {{ .Values.a.image.repository }}:{{ .Values.a.image.tag }}"),
                ),
                ("charts/sub/Chart.yaml", "name: sub"),
            ],
            values,
        );
        assert!(matches!(
            discover_images(&chart, chart.values()),
            Err(ChartError::UnsupportedChart { .. })
        ));
    }

    /// Every published version: as many images as `helm template` renders (the counts of
    /// `EVERY`), one per component.
    #[test]
    fn every_fixture_discovers() {
        for (version, bytes, n, _) in EVERY {
            let images = discover(bytes, &[]).expect(version);
            assert_eq!(images.len(), n, "{version}");
            let mut comps: Vec<&str> = images.iter().map(|i| i.component.as_str()).collect();
            comps.sort();
            comps.dedup();
            assert_eq!(comps.len(), n, "{version}: one image per component");
        }
    }

    #[test]
    fn split_references() {
        assert_eq!(
            split_reference("busybox").expect("s"),
            ("".into(), "busybox".into(), "latest".into())
        );
        assert_eq!(
            split_reference("localhost:5000/a/b:c").expect("s"),
            ("localhost:5000".into(), "a/b".into(), "c".into())
        );
        assert_eq!(
            split_reference("org/app:1").expect("s"),
            ("".into(), "org/app".into(), "1".into())
        );
        assert!(split_reference("a@sha256:00").is_err());
    }
}
