//! What koord-bundle changes in the chart's rendered manifests before helm applies them: helm
//! runs `koord-bundle post-render` as its post-renderer (helm 3 `--post-renderer EXE`, helm 4 a
//! `postrenderer/v1` plugin), handing it every rendered manifest on stdin and applying what it
//! prints. The chart itself is left as upstream published it (its digest is in the bundle).
//!
//! - **CRDs are kept** (`keep_crds`): every CustomResourceDefinition gets the annotation
//!   `helm.sh/resource-policy: keep`. Koordinator's chart renders its 13 CRDs from
//!   `templates/crd/` without it, so `helm uninstall` deleted them and with them every
//!   Reservation, ElasticQuota, NodeSLO... of the cluster. helm reads the policy from the
//!   manifest it stored, so a release must have been installed or upgraded through this
//!   post-renderer for `helm uninstall` to keep them.
//!
//! - **Images are pinned** (`pin`): every container image the bundle carries is written as
//!   `REF@sha256:<the bundle's top manifest digest>`, and its `imagePullPolicy` becomes
//!   `IfNotPresent` (a digest cannot change; the chart's `Always` made every container start ask
//!   the registry), unless `keepPullPolicy`. So what runs is what crossed: a tag re-pushed in
//!   the private registry changes nothing that runs. Done here, not by values: the chart has no
//!   value for a digest, and every workload kind is reached the same way.
//!
//! A document that is changed is written back as JSON (a subset of YAML: no YAML 1.1 pitfall
//! of `on`, `no` or `0755` in what helm reads back), after its `# Source:` comment, its YAML
//! merge keys (`<<`) resolved as helm resolves them (`super::merge`: JSON has no merge key, and
//! a `<<` written back as a key would be a literal one); every other document is passed on byte
//! for byte.

use super::rendered::{documents, read_document};
use super::ChartError;
use serde::{Deserialize, Serialize};
use serde_yaml_ng::Value;

/// The annotation that makes helm leave an object in place on uninstall (and on an upgrade
/// that no longer renders it).
pub const RESOURCE_POLICY: &str = "helm.sh/resource-policy";

/// What the post-renderer does (its `--config` file, written by `load`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PostRender {
    /// Annotate every CRD with `helm.sh/resource-policy: keep`.
    pub keep_crds: bool,
    /// Image reference as the chart renders it (`host/prefix/repo:tag`) → the digest to pin it
    /// to (the bundle's top manifest digest).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub pin: std::collections::BTreeMap<String, String>,
    /// Leave the chart's `imagePullPolicy` of pinned images as it is.
    #[serde(default)]
    pub keep_pull_policy: bool,
}

impl PostRender {
    /// Nothing to change.
    pub fn is_noop(&self) -> bool {
        !self.keep_crds && self.pin.is_empty()
    }
}

/// `ref@digest`: how a pinned image is written.
pub use koord_base::oci::pinned;

/// Apply `how` to the rendered `manifests` (helm's multi-document YAML). Errors name the
/// template a document came from.
pub fn post_render(manifests: &str, how: &PostRender) -> Result<String, ChartError> {
    let mut out = String::with_capacity(manifests.len() + 4096);
    for (i, (source, doc)) in documents(manifests)?.iter().enumerate() {
        out.push_str("---\n");
        // As helm reads it: a container image that comes from a merge is pinned too, and a
        // document written back keeps the meaning its merge keys gave it.
        let (what, mut v) = read_document(i, source, doc)?;
        if !change(&mut v, how) {
            out.push_str(doc);
            continue;
        }
        for line in doc.lines().take_while(|l| l.starts_with('#')) {
            out.push_str(line);
            out.push('\n');
        }
        let json = serde_json::to_string(&v).map_err(|e| ChartError::InvalidYaml {
            file: what.clone(),
            reason: format!("cannot be written as JSON: {e}"),
        })?;
        out.push_str(&json);
        out.push('\n');
    }
    Ok(out)
}

/// Change one document; whether anything changed.
fn change(v: &mut Value, how: &PostRender) -> bool {
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default();
    if how.keep_crds && kind == "CustomResourceDefinition" {
        return annotate(v, RESOURCE_POLICY, "keep");
    }
    !how.pin.is_empty() && pin(v, how)
}

/// Pin the images of every container list at any depth (every workload kind, as
/// [`super::rendered`] finds them); whether anything changed.
fn pin(v: &mut Value, how: &PostRender) -> bool {
    let mut changed = false;
    match v {
        Value::Mapping(m) => {
            for (k, val) in m.iter_mut() {
                if let (true, Value::Sequence(list)) =
                    (super::rendered::is_container_list(k), &mut *val)
                {
                    for c in list.iter_mut() {
                        changed |= pin_container(c, how);
                    }
                }
                changed |= pin(val, how);
            }
        }
        Value::Sequence(list) => {
            for x in list {
                changed |= pin(x, how);
            }
        }
        Value::Tagged(t) => changed |= pin(&mut t.value, how),
        _ => {}
    }
    changed
}

fn pin_container(c: &mut Value, how: &PostRender) -> bool {
    let Some(m) = c.as_mapping_mut() else {
        return false;
    };
    let Some(image) = m.get("image").and_then(Value::as_str).map(str::trim) else {
        return false;
    };
    let Some(digest) = how.pin.get(image) else {
        return false;
    };
    let to = pinned(image, digest);
    m.insert("image".into(), to.into());
    if !how.keep_pull_policy {
        m.insert("imagePullPolicy".into(), "IfNotPresent".into());
    }
    true
}

/// Set `metadata.annotations[key] = value`; whether it was not so already.
fn annotate(v: &mut Value, key: &str, value: &str) -> bool {
    let Some(doc) = v.as_mapping_mut() else {
        return false;
    };
    let meta = doc
        .entry("metadata".into())
        .or_insert_with(|| Value::Mapping(Default::default()));
    if !meta.is_mapping() {
        *meta = Value::Mapping(Default::default());
    }
    let Some(meta) = meta.as_mapping_mut() else {
        return false;
    };
    let ann = meta
        .entry("annotations".into())
        .or_insert_with(|| Value::Mapping(Default::default()));
    if !ann.is_mapping() {
        *ann = Value::Mapping(Default::default());
    }
    let Some(ann) = ann.as_mapping_mut() else {
        return false;
    };
    if ann.get(key).and_then(Value::as_str) == Some(value) {
        return false;
    }
    ann.insert(key.into(), value.into());
    true
}

/// The objects of rendered manifests, as JSON (documents that are empty or `null` left out).
pub fn objects(manifests: &str) -> Result<Vec<serde_json::Value>, ChartError> {
    let mut out = Vec::new();
    for (i, (source, doc)) in documents(manifests)?.iter().enumerate() {
        let (what, v) = read_document(i, source, doc)?;
        if v.is_null() {
            continue;
        }
        let json = serde_json::to_value(&v).map_err(|e| ChartError::InvalidYaml {
            file: what.clone(),
            reason: format!("not an object JSON can hold: {e}"),
        })?;
        if json.is_object() {
            out.push(json);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: &str = "---\n# Source: k/templates/crd/a.yaml\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: as.x.io\nspec:\n  group: x.io\n  names: {kind: A, plural: as}\n  scope: Namespaced\n  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, properties: {flag: {type: string, enum: ['on', 'off']}}}}}]\n---\n# Source: k/templates/cm.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata:\n  mode: 'on'\n";

    #[test]
    fn images_the_bundle_carries_are_pinned_at_any_depth() {
        let m = "---\n# Source: k/templates/d.yaml\nkind: Deployment\nmetadata: {name: d}\nspec:\n  template:\n    spec:\n      initContainers: [{name: i, image: 'r/init:1', imagePullPolicy: Always}]\n      containers:\n      - name: a\n        image: r/a:1\n        imagePullPolicy: Always\n      - name: other\n        image: elsewhere/x:2\n        imagePullPolicy: Always\n---\n# Source: k/templates/cj.yaml\nkind: CronJob\nmetadata: {name: j}\nspec:\n  jobTemplate:\n    spec:\n      template:\n        spec:\n          containers: [{name: j, image: r/a:1}]\n";
        let how = PostRender {
            pin: [
                ("r/a:1".to_string(), "sha256:aa".to_string()),
                ("r/init:1".to_string(), "sha256:ii".to_string()),
            ]
            .into(),
            ..Default::default()
        };
        let out = post_render(m, &how).unwrap();
        let o = objects(&out).unwrap();
        let pod = &o[0]["spec"]["template"]["spec"];
        assert_eq!(pod["containers"][0]["image"], "r/a:1@sha256:aa");
        assert_eq!(pod["containers"][0]["imagePullPolicy"], "IfNotPresent");
        assert_eq!(pod["initContainers"][0]["image"], "r/init:1@sha256:ii");
        // Not the bundle's: left as the chart renders it, policy too.
        assert_eq!(pod["containers"][1]["image"], "elsewhere/x:2");
        assert_eq!(pod["containers"][1]["imagePullPolicy"], "Always");
        let job = &o[1]["spec"]["jobTemplate"]["spec"]["template"]["spec"];
        assert_eq!(job["containers"][0]["image"], "r/a:1@sha256:aa");
        // Twice is once; and the chart's policy kept when asked.
        assert_eq!(post_render(&out, &how).unwrap(), out);
        let keep = PostRender {
            keep_pull_policy: true,
            ..how
        };
        let o = objects(&post_render(m, &keep).unwrap()).unwrap();
        assert_eq!(
            o[0]["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"],
            "Always"
        );
        assert_eq!(
            o[0]["spec"]["template"]["spec"]["containers"][0]["image"],
            "r/a:1@sha256:aa"
        );
    }

    #[test]
    fn crds_are_kept_and_nothing_else_changes() {
        let out = post_render(
            M,
            &PostRender {
                keep_crds: true,
                ..Default::default()
            },
        )
        .unwrap();
        let objs = objects(&out).unwrap();
        assert_eq!(objs.len(), 2);
        assert_eq!(objs[0]["metadata"]["annotations"][RESOURCE_POLICY], "keep");
        // A YAML 1.1 reader would take an unquoted `on` for true: the JSON keeps it a string.
        assert_eq!(
            objs[0]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["flag"]
                ["enum"][0],
            "on"
        );
        assert!(out.contains("# Source: k/templates/crd/a.yaml\n{"), "{out}");
        assert!(
            out.contains("# Source: k/templates/cm.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata:\n  mode: 'on'\n"),
            "untouched documents pass byte for byte: {out}"
        );
        // Twice is once.
        assert_eq!(
            post_render(
                &out,
                &PostRender {
                    keep_crds: true,
                    ..Default::default()
                }
            )
            .unwrap(),
            out
        );
        assert_eq!(
            objects(&post_render(M, &PostRender::default()).unwrap()).unwrap(),
            objects(M).unwrap()
        );
    }

    /// Issue 42: a document written back keeps the meaning its YAML 1.1 merge keys gave it in
    /// helm (go-yaml v2: a key before `<<` is overwritten, one after it wins), a container
    /// image that comes from a merge is pinned, and a document with nothing to change passes
    /// byte for byte, merge keys and all.
    #[test]
    fn merge_keys_keep_their_meaning() {
        let d = "---\n# Source: k/templates/d.yaml\nkind: Deployment\nmetadata:\n  name: d\n  labels: &labels\n    app: d\n    tier: base\nspec:\n  template:\n    metadata:\n      labels:\n        tier: overwritten\n        <<: *labels\n        extra: x\n    spec:\n      containers:\n      - &c\n        name: a\n        image: r/a:1\n        env:\n        - {name: A, value: '1'}\n      - <<: *c\n        name: b\n        env:\n        - <<: {name: B, value: from-merge}\n          value: '2'\n";
        let cm = "---\n# Source: k/templates/cm.yaml\nkind: ConfigMap\nmetadata: {name: c}\ndata:\n  <<: {a: '1'}\n  b: 'on'\n";
        let how = PostRender {
            pin: [("r/a:1".to_string(), "sha256:aa".to_string())].into(),
            keep_pull_policy: true,
            ..Default::default()
        };
        let out = post_render(&format!("{d}{cm}"), &how).unwrap();
        let (dep, rest) = out.split_at(out.len().saturating_sub(cm.len()));
        assert!(
            !dep.contains("<<"),
            "written back with a literal merge key: {dep}"
        );
        // Nothing to pin: byte for byte, `<<` left for helm to read.
        assert_eq!(rest, cm);
        let o = objects(&out).unwrap();
        assert_eq!(
            o[0],
            serde_json::json!({"kind": "Deployment",
            "metadata": {"name": "d", "labels": {"app": "d", "tier": "base"}},
            "spec": {"template": {
                "metadata": {"labels": {"app": "d", "tier": "base", "extra": "x"}},
                "spec": {"containers": [
                    {"name": "a", "image": "r/a:1@sha256:aa", "env": [{"name": "A", "value": "1"}]},
                    {"name": "b", "image": "r/a:1@sha256:aa", "env": [{"name": "B", "value": "2"}]},
                ]}}}})
        );
        assert_eq!(post_render(d, &PostRender::default()).unwrap(), d);
        assert_eq!(o[1]["data"], serde_json::json!({"a": "1", "b": "on"}));
        // Twice is once.
        assert_eq!(post_render(&out, &how).unwrap(), out);
    }

    #[test]
    fn a_broken_document_is_named() {
        let e = post_render(
            "---\n# Source: k/templates/x.yaml\na: [\n",
            &PostRender::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("templates/x.yaml"), "{e}");
    }
}
