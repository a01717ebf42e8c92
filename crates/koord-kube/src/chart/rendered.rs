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

/// The documents of rendered manifests (helm's multi-document YAML), within the manifests'
/// size limit: (the template each came from, its text). Read each with [`read_document`].
pub(crate) fn documents(manifests: &str) -> Result<Vec<(String, String)>, ChartError> {
    let limits = koord_base::yaml::MANIFESTS;
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
    Ok(split_documents(manifests))
}

/// The `i`th document of [`documents`] read as helm reads it (merge keys resolved, see
/// [`super::merge`]), strictly: what names it in messages (`rendered document N (template)`),
/// and its value. The one reader of rendered documents: the post-renderer, the image scan and
/// the objects of the upgrade checks all see the same thing.
pub(crate) fn read_document(
    i: usize,
    source: &str,
    doc: &str,
) -> Result<(String, Value), ChartError> {
    let what = if source.is_empty() {
        format!("rendered document {}", i + 1)
    } else {
        format!("rendered document {} ({source})", i + 1)
    };
    let mut v = koord_base::yaml::parse_value(&what, doc.as_bytes(), &koord_base::yaml::MANIFESTS)
        .map_err(|e| ChartError::InvalidYaml {
            file: what.clone(),
            reason: e.reason(),
        })?;
    super::merge::resolve(doc, &mut v).map_err(|reason| ChartError::InvalidYaml {
        file: what.clone(),
        reason,
    })?;
    Ok((what, v))
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
    let mut out = Vec::new();
    for (i, (source, doc)) in documents(manifests)?.iter().enumerate() {
        let (what, v) = read_document(i, source, doc)?;
        collect(&v, source, &mut out).map_err(|reason| ChartError::InvalidYaml {
            file: what.clone(),
            reason,
        })?;
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Every container image of rendered manifests, deduplicated and sorted; strictly, as
/// [`scan`]: a document that is not YAML, or an image that is not a string, is an error naming
/// the document (it used to be skipped, which hid its images from the check against the
/// bundle).
pub fn rendered_images(manifests: &str) -> Result<Vec<String>, ChartError> {
    scan(manifests, &[]).map(|s| s.images)
}

/// An image the bundle carries, as [`scan`] looks for it in rendered manifests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carried {
    /// Its name in the bundle (`koordinator-sh/koord-manager:v1.8.0`), for the report.
    pub name: String,
    /// Repositories that name it, without tag or digest: the chart's repository path
    /// (`koordinator-sh/koord-manager`, which also matches it under any registry or prefix:
    /// the target's, the upstream one) and whatever else it was known as.
    pub repositories: Vec<String>,
}

/// A reference to an image of the bundle outside a container's `image` field: in a
/// ConfigMap, an env var, container args, a custom resource's field. The post-renderer does
/// not pin it and the check of the rendered images does not see it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ImageMention {
    /// The object: `ConfigMap koordinator-system/foo` (kind, namespace/name), or the document
    /// (`rendered document 3 (templates/x.yaml)`) when it has no kind or name.
    pub object: String,
    /// Where in the object: `data.config`, `spec.template.spec.containers[0].env[1].value`.
    pub path: String,
    /// The reference as written there (`host/koordinator-sh/koord-manager:v1.8.0`).
    pub reference: String,
    /// The bundle's image it names ([`Carried::name`]).
    pub image: String,
}

impl std::fmt::Display for ImageMention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {:?} names the bundle's image {} outside a container's image field",
            self.object, self.path, self.reference, self.image
        )
    }
}

/// What [`scan`] found in rendered manifests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// Every container image (the `image` of every container list entry), sorted, once each.
    pub images: Vec<String>,
    /// Every other string that names an image of the bundle, in document order.
    pub mentions: Vec<ImageMention>,
}

/// Read every rendered document strictly: its container images, and every other string
/// scalar (and string key) that names an image the bundle carries (`carried`). A document that
/// is not YAML, or a container image that is not a string, is an error naming the document
/// (its kind and name when it has them, else its template or index): nothing is skipped.
pub fn scan(manifests: &str, carried: &[Carried]) -> Result<Scan, ChartError> {
    let mut images = BTreeSet::new();
    let mut mentions = Vec::new();
    for (i, (source, doc)) in documents(manifests)?.iter().enumerate() {
        let (what, v) = read_document(i, source, doc)?;
        let object = object_name(&v).unwrap_or_else(|| what.clone());
        let mut found = Vec::new();
        collect(&v, source, &mut found).map_err(|reason| ChartError::InvalidYaml {
            file: if object == what {
                what.clone()
            } else {
                format!("{what}, {object}")
            },
            reason,
        })?;
        images.extend(found.into_iter().map(|i| i.image));
        if !carried.is_empty() {
            let mut at = |path: &str, text: &str| {
                for (reference, image) in mentions_in(text, carried) {
                    mentions.push(ImageMention {
                        object: object.clone(),
                        path: path.to_string(),
                        reference,
                        image,
                    });
                }
            };
            strings(&v, &mut String::new(), false, &mut at);
        }
    }
    mentions.dedup();
    Ok(Scan {
        images: images.into_iter().collect(),
        mentions,
    })
}

/// `Kind namespace/name` (or `Kind name`) of a document, when it has a kind and a name.
fn object_name(v: &Value) -> Option<String> {
    let kind = v.get("kind").and_then(Value::as_str)?;
    let meta = v.get("metadata");
    let name = meta.and_then(|m| m.get("name")).and_then(Value::as_str)?;
    Some(
        match meta
            .and_then(|m| m.get("namespace"))
            .and_then(Value::as_str)
        {
            Some(ns) if !ns.is_empty() => format!("{kind} {ns}/{name}"),
            _ => format!("{kind} {name}"),
        },
    )
}

/// Append one step to a YAML path: `.key`, `["a.b/c"]` for a key that is not a plain word,
/// `[3]` for a list index.
fn push_key(path: &mut String, key: &str) {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if plain {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key);
    } else {
        path.push_str(&format!("[{key:?}]"));
    }
}

/// Call `at(path, text)` for every string scalar and string key of `v`, except the `image`
/// of a container (an entry of a container list: `in_containers`).
fn strings(v: &Value, path: &mut String, in_containers: bool, at: &mut impl FnMut(&str, &str)) {
    match v {
        Value::String(s) => at(path, s),
        Value::Mapping(m) => {
            for (k, val) in m {
                let len = path.len();
                let key = match k {
                    Value::String(s) => s.clone(),
                    other => super::scalar_to_string(other).unwrap_or_else(|| "?".into()),
                };
                push_key(path, &key);
                if let Value::String(s) = k {
                    at(path, s);
                }
                let skip = in_containers && key == "image" && val.is_string();
                if !skip {
                    match (is_container_list(k), val) {
                        (true, Value::Sequence(list)) => {
                            for (i, c) in list.iter().enumerate() {
                                let len = path.len();
                                path.push_str(&format!("[{i}]"));
                                strings(c, path, true, at);
                                path.truncate(len);
                            }
                        }
                        _ => strings(val, path, false, at),
                    }
                }
                path.truncate(len);
            }
        }
        Value::Sequence(list) => {
            for (i, x) in list.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                strings(x, path, false, at);
                path.truncate(len);
            }
        }
        Value::Tagged(t) => strings(&t.value, path, in_containers, at),
        _ => {}
    }
}

/// Characters of an image reference's name (a repository path).
fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/')
}

/// Characters of a tag or a digest.
fn ref_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':')
}

/// The references to `carried` images in `text`: (the reference as written, with its
/// registry, tag or digest; the image's name). A repository counts where it stands as a
/// whole name (nothing of a name before it but a registry or prefix ending in `/`, nothing
/// after it but a tag, a digest or the end of the name); a repository of one path component
/// counts only with a tag or digest (a bare word is not an image).
pub(crate) fn mentions_in(text: &str, carried: &[Carried]) -> Vec<(String, String)> {
    let mut out: Vec<(usize, usize, String)> = Vec::new();
    for c in carried {
        for repo in &c.repositories {
            if repo.is_empty() {
                continue;
            }
            for (pos, _) in text.match_indices(repo.as_str()) {
                let end = pos + repo.len();
                let before = text[..pos].chars().next_back();
                if before.is_some_and(|b| name_char(b) && b != '/') {
                    continue;
                }
                let rest = &text[end..];
                let mut after = rest.chars();
                let tail_len = match after.next() {
                    None => 0,
                    Some(':' | '@') => {
                        let n: usize = rest[1..]
                            .chars()
                            .take_while(|&c| ref_char(c))
                            .map(char::len_utf8)
                            .sum();
                        // `repo:` then nothing of a tag: the name alone.
                        if n == 0 {
                            0
                        } else {
                            1 + n
                        }
                    }
                    Some('.') if after.next().is_some_and(|c| name_char(c) && c != '/') => continue,
                    Some(c) if name_char(c) && c != '.' => continue,
                    Some(_) => 0,
                };
                if tail_len == 0 && !repo.contains('/') {
                    continue;
                }
                // Back to the start of the whole reference (its registry and prefix).
                let start = text[..pos]
                    .char_indices()
                    .rev()
                    .take_while(|&(_, c)| name_char(c) || c == ':')
                    .last()
                    .map_or(pos, |(i, _)| i);
                out.push((start, end + tail_len, c.name.clone()));
            }
        }
    }
    // One per reference: the longest repository that matched it.
    out.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let mut kept: Vec<(usize, usize, String)> = Vec::new();
    for m in out {
        if !kept.iter().any(|k| k.0 <= m.0 && m.1 <= k.1) {
            kept.push(m);
        }
    }
    kept.into_iter()
        .map(|(s, e, name)| (text[s..e].trim_end_matches(['.', ':']).to_string(), name))
        .collect()
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
            rendered_images(m).expect("images"),
            ["r/a:1", "r/debug:3", "r/init:1", "r/job:2"]
        );
        let err = images_in_manifests("# Source: c/templates/x.yaml\na: [\n").expect_err("bad");
        assert!(err.to_string().contains("templates/x.yaml"), "{err}");
        assert!(images_in_manifests("containers: [{name: x, image: {a: 1}}]\n").is_err());
    }

    #[test]
    fn a_document_that_cannot_be_read_is_an_error_not_a_skip() {
        // Issue 42: a bad document used to drop out of the check against the bundle, with the
        // images of its good neighbours checked as if it were all.
        let e = rendered_images("a: [\n---\ncontainers: [{image: x:1}]\n").expect_err("bad");
        assert!(e.to_string().contains("rendered document 1"), "{e}");
        let e = rendered_images(
            "---\ncontainers: [{image: x:1}]\n---\n# Source: c/templates/d.yaml\nkind: Deployment\nmetadata: {name: d, namespace: ns}\nspec: {template: {spec: {containers: [{name: c, image: 5}]}}}\n",
        )
        .expect_err("not a string");
        let e = e.to_string();
        for want in [
            "rendered document 2 (templates/d.yaml)",
            "Deployment ns/d",
            "container \"c\" has an image that is not a string",
        ] {
            assert!(e.contains(want), "{want:?} in {e}");
        }
    }

    #[test]
    fn a_container_image_from_a_merge_key_is_seen() {
        // helm resolves `<<` (go-yaml v2): the image is the container's, checked as such.
        let m = "kind: Pod\nmetadata: {name: p}\nx: &c {image: 'r/m:1'}\nspec:\n  containers: [{<<: *c, name: m}]\n";
        assert_eq!(rendered_images(m).expect("images"), ["r/m:1"]);
        let e =
            rendered_images("kind: Pod\nspec: {containers: [{<<: 3}]}\n").expect_err("bad merge");
        assert!(e.to_string().contains("rendered document 1"), "{e}");
    }

    fn carried() -> Vec<Carried> {
        vec![
            Carried {
                name: "koordinator-sh/koord-manager:v1.8.0".into(),
                repositories: vec![
                    "koordinator-sh/koord-manager".into(),
                    "ghcr.io/koordinator-sh/koord-manager".into(),
                ],
            },
            Carried {
                name: "busybox:1.36".into(),
                repositories: vec!["busybox".into()],
            },
        ]
    }

    #[test]
    fn images_of_the_bundle_outside_container_image_fields_are_named_with_their_place() {
        let m = "---\n# Source: k/templates/cm.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: foo, namespace: koordinator-system}\ndata:\n  config: |\n    sidecar: reg.local:5000/site/koordinator-sh/koord-manager:v1.8.0\n    other: koordinator-sh/koord-manager-extra:v1\n  url: https://example.com/koordinator-sh/koord-managers\n---\n# Source: k/templates/d.yaml\nkind: Deployment\nmetadata: {name: d, namespace: koordinator-system}\nspec:\n  template:\n    metadata:\n      annotations: {\"example.com/image\": \"koordinator-sh/koord-manager@sha256:abcd\"}\n    spec:\n      containers:\n      - name: m\n        image: reg.local:5000/site/koordinator-sh/koord-manager:v1.8.0@sha256:abcd\n        args: [\"--helper-image=ghcr.io/koordinator-sh/koord-manager:v1.8.0\"]\n        env: [{name: X, value: busybox}, {name: Y, value: \"busybox:1.36.\"}]\n---\nkind: Widget\nmetadata: {name: w}\nspec: {image: koordinator-sh/koord-manager}\n";
        let s = scan(m, &carried()).expect("scan");
        assert_eq!(
            s.images,
            ["reg.local:5000/site/koordinator-sh/koord-manager:v1.8.0@sha256:abcd"]
        );
        let got: Vec<(&str, &str, &str, &str)> = s
            .mentions
            .iter()
            .map(|m| {
                (
                    m.object.as_str(),
                    m.path.as_str(),
                    m.reference.as_str(),
                    m.image.as_str(),
                )
            })
            .collect();
        let km = "koordinator-sh/koord-manager:v1.8.0";
        assert_eq!(
            got,
            [
                (
                    "ConfigMap koordinator-system/foo",
                    "data.config",
                    "reg.local:5000/site/koordinator-sh/koord-manager:v1.8.0",
                    km
                ),
                (
                    "Deployment koordinator-system/d",
                    "spec.template.metadata.annotations[\"example.com/image\"]",
                    "koordinator-sh/koord-manager@sha256:abcd",
                    km
                ),
                (
                    "Deployment koordinator-system/d",
                    "spec.template.spec.containers[0].args[0]",
                    "ghcr.io/koordinator-sh/koord-manager:v1.8.0",
                    km
                ),
                (
                    "Deployment koordinator-system/d",
                    "spec.template.spec.containers[0].env[1].value",
                    "busybox:1.36",
                    "busybox:1.36"
                ),
                ("Widget w", "spec.image", "koordinator-sh/koord-manager", km),
            ]
        );
        assert_eq!(
            s.mentions[0].to_string(),
            "ConfigMap koordinator-system/foo data.config: \"reg.local:5000/site/koordinator-sh/koord-manager:v1.8.0\" names the bundle's image koordinator-sh/koord-manager:v1.8.0 outside a container's image field"
        );
        // Nothing carried: nothing looked for.
        assert!(scan(m, &[]).expect("scan").mentions.is_empty());
    }

    #[test]
    fn a_reference_is_a_whole_name() {
        let c = carried();
        let refs =
            |t: &str| -> Vec<String> { mentions_in(t, &c).into_iter().map(|(r, _)| r).collect() };
        assert_eq!(
            refs("x koordinator-sh/koord-manager"),
            ["koordinator-sh/koord-manager"]
        );
        assert_eq!(
            refs("\"koordinator-sh/koord-manager:v1\","),
            ["koordinator-sh/koord-manager:v1"]
        );
        assert_eq!(
            refs("image=h:5000/p/koordinator-sh/koord-manager:v1.8.0 next"),
            ["h:5000/p/koordinator-sh/koord-manager:v1.8.0"]
        );
        assert!(refs("xkoordinator-sh/koord-manager").is_empty());
        assert!(refs("koordinator-sh/koord-manager2").is_empty());
        assert!(refs("koordinator-sh/koord-manager.example").is_empty());
        assert!(refs("koordinator-sh/koord-manager/sub").is_empty());
        assert!(refs("a busybox, and busybox: run").is_empty());
        assert_eq!(refs("run busybox:1.36 now"), ["busybox:1.36"]);
        assert_eq!(
            refs("docker.io/library/busybox@sha256:00"),
            ["docker.io/library/busybox@sha256:00"]
        );
    }
}
