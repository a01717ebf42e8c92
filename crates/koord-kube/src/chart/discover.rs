//! The container images a chart deploys, from what real `helm template` rendered.
//!
//! The truth is the rendered manifests: the `image` of every container, init container and
//! ephemeral container, at any depth of any document ([`super::rendered`]); the command layer
//! runs helm (`crate::helm`), always. [`images_from_rendered`] splits each reference
//! Docker-style (an empty host is Docker Hub: the 0.1–0.4 charts), checks host, repository and
//! tag, names each image after a component (see [`images_from_rendered`]), and returns them
//! sorted, one per reference.

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

/// The release name and namespace `build` renders the chart with (`helm template RELEASE
/// --namespace NAMESPACE`): the `load` defaults.
pub const RELEASE: &str = "koordinator";
/// See [`RELEASE`].
pub const NAMESPACE: &str = "koordinator-system";

/// The component whose `<component>.image.repository` (the chart's own `values.yaml`) names
/// `repository`.
fn component_by_repository(repository: &str, declared: &[(String, String)]) -> Option<String> {
    declared
        .iter()
        .find(|(_, repo)| repo == repository || repository.ends_with(&format!("/{repo}")))
        .map(|(c, _)| c.clone())
}

/// For an image no chart value names (the user's values changed its repository): the one
/// component whose `.Values.<component>.image` the template it came from mentions, unless
/// that component's own image was rendered too (then this is another container).
fn component_by_template(
    source: &str,
    declared: &[(String, String)],
    named: &BTreeSet<String>,
    chart: &ChartArchive,
) -> Option<String> {
    let text = chart
        .file(source)
        .map(String::from_utf8_lossy)
        .unwrap_or_default();
    let mentioned: Vec<&String> = declared
        .iter()
        .map(|(c, _)| c)
        .filter(|c| {
            let needle = if c.is_empty() {
                ".Values.image".to_string()
            } else {
                format!(".Values.{c}.image")
            };
            text.match_indices(&needle).any(|(i, _)| {
                !text[i + needle.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
        })
        .collect();
    match mentioned.as_slice() {
        [one] if !named.contains(*one) => Some((*one).clone()),
        _ => None,
    }
}

/// The images of `chart` as real `helm template` rendered them (see
/// [`super::rendered::images_in_manifests`]): each rendered reference split Docker-style
/// (an empty host is Docker Hub) and checked (a valid host, repository and tag that give the
/// reference back), and named after its component: the chart's own values (its
/// `values.yaml`, not the user's overrides: no value merging is needed) or the template it came
/// from (see `component_by_repository` and `component_by_template`). Sorted by repository (then host, tag), one per reference.
pub fn images_from_rendered(
    rendered: &[super::rendered::RenderedImage],
    chart: &ChartArchive,
) -> Result<Vec<ChartImage>, ChartError> {
    let mut declared = Vec::new();
    declared_images(chart.values(), &mut Vec::new(), &mut declared);
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
        img.component = component_by_repository(&img.repository, &declared).unwrap_or_default();
        images.push((img, r));
    }
    let named: BTreeSet<String> = images
        .iter()
        .map(|(i, _)| i.component.clone())
        .filter(|c| !c.is_empty())
        .collect();
    let mut images: Vec<ChartImage> = images
        .into_iter()
        .map(|(mut img, r)| {
            if img.component.is_empty() {
                img.component = component_by_template(&r.source, &declared, &named, chart)
                    .unwrap_or_else(|| r.container.clone());
            }
            img
        })
        .collect();
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
    use crate::chart::archive::tests::{chart_of, TEST_CHART_YAML, V041, V180};
    use crate::chart::rendered::RenderedImage;

    fn rendered(image: &str, source: &str, container: &str) -> RenderedImage {
        RenderedImage {
            image: image.into(),
            source: source.into(),
            container: container.into(),
        }
    }

    fn named(images: &[ChartImage]) -> Vec<(String, &str)> {
        images
            .iter()
            .map(|i| (i.reference(), i.component.as_str()))
            .collect()
    }

    /// What helm renders from 1.8.0, named after the chart's values; a repository the user
    /// changed is named after the one component its template uses; a tag or host changed
    /// keeps the name.
    #[test]
    fn components_from_the_charts_own_values_or_its_template() {
        let chart = ChartArchive::from_tgz(V180).expect("chart");
        let h = "registry.cn-beijing.aliyuncs.com/koordinator-sh";
        let found = vec![
            rendered(
                &format!("{h}/koord-manager:v1.8.0"),
                "templates/koord-manager.yaml",
                "manager",
            ),
            rendered(
                &format!("{h}/koord-device-daemon:v1.8.0"),
                "templates/koord-device-daemon.yaml",
                "device-daemon",
            ),
            rendered(
                "ghcr.io/koordinator-sh/koordlet:v9",
                "templates/koordlet.yaml",
                "koordlet",
            ),
            rendered(
                "me.example/me/my-scheduler:v1.8.0",
                "templates/koord-scheduler.yaml",
                "scheduler",
            ),
            rendered(
                &format!("{h}/koord-descheduler:v1.8.0"),
                "templates/koord-descheduler.yaml",
                "descheduler",
            ),
            rendered(
                "busybox:1.36",
                "templates/koord-descheduler.yaml",
                "sidecar",
            ),
        ];
        let images = images_from_rendered(&found, &chart).expect("images");
        assert_eq!(
            named(&images),
            [
                ("busybox:1.36".to_string(), "sidecar"),
                (format!("{h}/koord-descheduler:v1.8.0"), "descheduler"),
                (format!("{h}/koord-device-daemon:v1.8.0"), "deviceDaemon"),
                (format!("{h}/koord-manager:v1.8.0"), "manager"),
                ("ghcr.io/koordinator-sh/koordlet:v9".to_string(), "koordlet"),
                ("me.example/me/my-scheduler:v1.8.0".to_string(), "scheduler"),
            ]
        );
        let dd = &images[2];
        assert_eq!(
            (
                dd.host.as_str(),
                dd.repository.as_str(),
                dd.tag.as_str(),
                dd.template.as_str()
            ),
            (
                "registry.cn-beijing.aliyuncs.com",
                "koordinator-sh/koord-device-daemon",
                "v1.8.0",
                "templates/koord-device-daemon.yaml"
            )
        );
    }

    #[test]
    fn hostless_references_are_docker_hub() {
        let chart = ChartArchive::from_tgz(V041).expect("chart");
        let found = vec![rendered(
            "koordinatorsh/koordlet:v0.4.1",
            "templates/koordlet.yaml",
            "koordlet",
        )];
        let images = images_from_rendered(&found, &chart).expect("images");
        assert_eq!(images[0].host, "");
        assert_eq!(images[0].repository, "koordinatorsh/koordlet");
        assert_eq!(images[0].component, "koordlet");
    }

    #[test]
    fn one_entry_per_reference_sorted() {
        let chart = chart_of(&[
            ("Chart.yaml", TEST_CHART_YAML),
            ("values.yaml", "a: {image: {repository: org/a}}\n"),
        ]);
        let found = vec![
            rendered("org/b:1", "templates/x.yaml", "b"),
            rendered("org/a:1", "templates/x.yaml", "a"),
            rendered("org/a:1", "templates/y.yaml", "again"),
        ];
        let images = images_from_rendered(&found, &chart).expect("images");
        assert_eq!(
            named(&images),
            [("org/a:1".into(), "a"), ("org/b:1".into(), "b")]
        );
    }

    #[test]
    fn invalid_references_name_the_template() {
        let chart = chart_of(&[("Chart.yaml", TEST_CHART_YAML)]);
        for (image, why) in [
            ("/koordinator-sh/koordlet:v1", "imageRepositoryHost"),
            ("org/a:", "invalid tag"),
            ("Org/A:1", "invalid repository"),
            ("r.example/a@sha256:00", "digest"),
            ("bad host!/a:1", "invalid repository"),
        ] {
            let e = images_from_rendered(&[rendered(image, "templates/x.yaml", "x")], &chart)
                .expect_err(image);
            let t = e.to_string();
            assert!(
                matches!(e, ChartError::InvalidRenderedImage { .. })
                    && t.starts_with("templates/x.yaml (as rendered)")
                    && t.contains(why),
                "{image}: {t}"
            );
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
