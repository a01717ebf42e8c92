//! The container images of rendered manifests (what `helm template` prints): the `image` of
//! every entry of `containers`, `initContainers` and `ephemeralContainers`, at any depth, so
//! every workload kind (Pod, Deployment, DaemonSet, StatefulSet, ReplicaSet, Job, CronJob, and
//! custom resources embedding a pod template) counts.

use std::collections::BTreeSet;

use serde_yaml_ng::Value;

use super::ChartError;

/// One container image found in rendered manifests.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RenderedImage {
    /// The image as written (`registry/repo:tag`).
    pub image: String,
    /// The chart file the document came from (`templates/koord-manager.yaml`), from helm's
    /// `# Source: CHART/...` line; "" when unknown.
    pub source: String,
    /// The container's `name`.
    pub container: String,
}

/// Split a YAML stream at `---` lines: (the template it came from, the document text).
pub(crate) fn split_documents(text: &str) -> Vec<(String, String)> {
    let mut docs = vec![(String::new(), String::new())];
    for line in text.lines() {
        if line == "---" || line.starts_with("--- ") || line == "..." {
            docs.push((String::new(), String::new()));
        } else if let Some((source, d)) = docs.last_mut() {
            if let Some(s) = line.strip_prefix("# Source: ") {
                if source.is_empty() {
                    // `CHART/templates/x.yaml` -> `templates/x.yaml`.
                    *source = s
                        .split_once('/')
                        .map_or(s, |(_, rest)| rest)
                        .trim()
                        .to_string();
                }
            }
            d.push_str(line);
            d.push('\n');
        }
    }
    docs.retain(|(_, d)| !d.trim().is_empty());
    docs
}

/// Whether a mapping key names a list of containers of a pod spec (what [`collect`] reads and
/// the post-renderer pins).
pub(crate) fn is_container_list(k: &Value) -> bool {
    matches!(
        k.as_str(),
        Some("containers" | "initContainers" | "ephemeralContainers")
    )
}

/// Collect the container images of `v` into `out`. Error: a container whose `image` is not
/// a string.
pub(crate) fn collect(v: &Value, source: &str, out: &mut Vec<RenderedImage>) -> Result<(), String> {
    match v {
        Value::Mapping(m) => {
            for (k, val) in m {
                if let (true, Value::Sequence(list)) = (is_container_list(k), val) {
                    for c in list {
                        let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
                        match c.get("image") {
                            None | Some(Value::Null) => {}
                            Some(Value::String(img)) if img.trim().is_empty() => {}
                            Some(Value::String(img)) => out.push(RenderedImage {
                                image: img.trim().to_string(),
                                source: source.to_string(),
                                container: name.to_string(),
                            }),
                            Some(other) => {
                                return Err(format!(
                                "container {name:?} has an image that is not a string: {other:?}"
                            ))
                            }
                        }
                    }
                }
                collect(val, source, out)?;
            }
        }
        Value::Sequence(list) => {
            for x in list {
                collect(x, source, out)?;
            }
        }
        Value::Tagged(t) => collect(&t.value, source, out)?,
        _ => {}
    }
    Ok(())
}

/// Every container image of rendered manifests, strictly: a document that is not YAML, or a
/// container image that is not a string, is an error naming the template it came from
/// (helm's output is always valid YAML, so this never refuses a real rendering). Sorted,
/// one entry per (image, source, container).
pub fn images_in_manifests(manifests: &str) -> Result<Vec<RenderedImage>, ChartError> {
    let limits = crate::yaml::MANIFESTS;
    if manifests.len() > limits.max_bytes {
        return Err(ChartError::InvalidYaml {
            file: "rendered manifests".into(),
            reason: format!(
                "{} bytes, more than the {} allowed",
                manifests.len(),
                limits.max_bytes
            ),
        });
    }
    let mut out = Vec::new();
    for (i, (source, doc)) in split_documents(manifests).iter().enumerate() {
        let what = if source.is_empty() {
            format!("rendered document {}", i + 1)
        } else {
            format!("rendered {source}")
        };
        let v = crate::yaml::parse_value(&what, doc.as_bytes(), &limits).map_err(|e| {
            ChartError::InvalidYaml {
                file: what.clone(),
                reason: e.reason(),
            }
        })?;
        collect(&v, source, &mut out).map_err(|reason| ChartError::InvalidYaml {
            file: what.clone(),
            reason,
        })?;
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Every container image in rendered YAML documents, deduplicated and sorted. Documents that
/// are not YAML are skipped (used to check a rendering against a bundle, where a bad document
/// must not hide the others).
pub fn rendered_images(manifests: &str) -> Vec<String> {
    let mut images = BTreeSet::new();
    for (source, doc) in split_documents(manifests) {
        if let Ok(v) =
            crate::yaml::parse_value("rendered document", doc.as_bytes(), &crate::yaml::MANIFESTS)
        {
            let mut found = Vec::new();
            // A non-string image only drops that document's images here.
            if collect(&v, &source, &mut found).is_ok() {
                images.extend(found.into_iter().map(|i| i.image));
            }
        }
    }
    images.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_workload_kind() {
        let m = "---\n# Source: c/templates/a.yaml\nkind: Deployment\nspec:\n  template:\n    spec:\n      initContainers: [{name: i, image: 'r/init:1'}]\n      containers:\n      - name: a\n        image: r/a:1\n---\n# Source: c/templates/cj.yaml\nkind: CronJob\nspec:\n  jobTemplate:\n    spec:\n      template:\n        spec:\n          containers: [{name: j, image: r/job:2}]\n          ephemeralContainers: [{name: e, image: r/debug:3}]\n---\nkind: ConfigMap\ndata: {image: not-a-container}\n";
        let imgs = images_in_manifests(m).expect("images");
        let got: Vec<(&str, &str, &str)> = imgs
            .iter()
            .map(|i| (i.image.as_str(), i.source.as_str(), i.container.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("r/a:1", "templates/a.yaml", "a"),
                ("r/debug:3", "templates/cj.yaml", "e"),
                ("r/init:1", "templates/a.yaml", "i"),
                ("r/job:2", "templates/cj.yaml", "j"),
            ]
        );
        assert_eq!(
            rendered_images(m),
            ["r/a:1", "r/debug:3", "r/init:1", "r/job:2"]
        );
        let err = images_in_manifests("# Source: c/templates/x.yaml\na: [\n").expect_err("bad");
        assert!(err.to_string().contains("templates/x.yaml"), "{err}");
        assert!(images_in_manifests("containers: [{name: x, image: {a: 1}}]\n").is_err());
        // The lenient form skips the bad document only.
        assert_eq!(
            rendered_images("a: [\n---\ncontainers: [{image: x:1}]\n"),
            ["x:1"]
        );
    }
}
