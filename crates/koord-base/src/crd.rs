//! A CustomResourceDefinition, read for what an approver and an upgrade need: its versions
//! (served, stored) for the bill of materials, and the fields of each version's schema — by path
//! (`spec.foo.bar`; `[]` for the items of an array, `*` for the values of a map), whether each is
//! required, its type, its `enum` values and whether unknown fields below it are kept
//! (`x-kubernetes-preserve-unknown-fields`).
//!
//! It is read from the bundle's `crds/<group>_<plural>.yaml` ([`parse`]), from a rendered
//! manifest or from the cluster ([`from_value`]). **One rule** says what a schema version does
//! to a field: [`VersionSchema::prunes`] (the API server drops the field on the next write),
//! [`Field::required`] and [`Field::enums`]. `diff` applies it to the fields of an old schema
//! (what an upgrade of the CRD removes, requires, forbids), the pre-flight of an upgrade to the
//! objects that exist in the cluster ([`VersionSchema::check_object`]): both say the same thing
//! about the same change.
//!
//! The schema is `spec.versions[].schema.openAPIV3Schema`; a version without one takes the
//! CRD-wide `spec.validation.openAPIV3Schema` of `apiextensions.k8s.io/v1beta1` (where a CRD
//! may also name its one version in `spec.version`). Every file goes through the bounded YAML
//! entry ([`crate::yaml`], the CRD limits) first.

use serde::{Deserialize, Serialize};
use serde_yaml_ng::Value;
use std::collections::{BTreeMap, BTreeSet};

/// One version of a CRD.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CrdVersion {
    /// `v1alpha1`.
    pub name: String,
    /// Served by the API server.
    pub served: bool,
    /// The version objects are stored as (one per CRD).
    pub storage: bool,
}

/// A CRD file that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("CRD file {file}: {reason}")]
pub struct CrdError {
    /// The file (`crds/...`).
    pub file: String,
    /// What is wrong.
    pub reason: String,
}

impl crate::exit::Classify for CrdError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        // A CRD file of the chart or the bundle that does not parse.
        Some(crate::exit::ExitClass::Input)
    }
}

/// One field of a schema.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Field {
    /// `type` (`string`, `object`, ...), when the schema says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ty: Option<String>,
    /// Listed in its parent's `required`.
    pub required: bool,
    /// Its `enum` values, as text, when it has an `enum`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enums: Option<Vec<String>>,
    /// `x-kubernetes-preserve-unknown-fields: true`: fields below it that the schema does not
    /// name are kept, not pruned.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub preserve_unknown: bool,
    /// `x-kubernetes-embedded-resource: true`: an object with its own `apiVersion`, `kind`
    /// and `metadata`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub embedded: bool,
}

/// One version of a CRD and its schema's fields, by path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionSchema {
    /// Name, served, stored.
    pub version: CrdVersion,
    /// Every field by path; `None` when the version has no schema.
    pub fields: Option<BTreeMap<String, Field>>,
    /// The root of the schema keeps unknown fields (`x-kubernetes-preserve-unknown-fields` on
    /// `openAPIV3Schema` itself).
    pub root_preserves: bool,
}

/// What an existing object loses or breaks under a schema version ([`VersionSchema::check_object`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectProblems {
    /// Fields it sets that the schema does not have: pruned by the API server on the next
    /// write (concrete paths: `spec.ports[2].name`).
    pub pruned: Vec<String>,
    /// Required fields it lacks: its next update is refused.
    pub missing_required: Vec<String>,
    /// Values an `enum` no longer allows (`path=value`): its next update is refused.
    pub enum_gone: Vec<String>,
}

impl ObjectProblems {
    /// Nothing found.
    pub fn is_empty(&self) -> bool {
        self.pruned.is_empty() && self.missing_required.is_empty() && self.enum_gone.is_empty()
    }
}

/// The schema path that holds `path` (`spec.a` → `spec`, `spec.a[]` → `spec.a`, `spec` → ``).
fn parent_path(path: &str) -> Option<&str> {
    if path.is_empty() {
        return None;
    }
    if let Some(p) = path.strip_suffix("[]") {
        return Some(p);
    }
    Some(path.rfind('.').map_or("", |i| &path[..i]))
}

/// `path.key` (or `key` at the root).
fn child_path(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// The fields every object has, whatever its schema says.
const OBJECT_META: [&str; 3] = ["apiVersion", "kind", "metadata"];

/// `path` is inside the `metadata` of the object or of an embedded resource.
fn within_metadata(fields: &BTreeMap<String, Field>, path: &str) -> bool {
    let mut cur = parent_path(path);
    let mut child = path;
    while let Some(p) = cur {
        let key = &child[if p.is_empty() { 0 } else { p.len() + 1 }..];
        if key == "metadata" && (p.is_empty() || fields.get(p).is_some_and(|f| f.embedded)) {
            return true;
        }
        child = p;
        cur = parent_path(p);
    }
    false
}

impl VersionSchema {
    /// THE rule of what this version does to a field at schema path `path` (the notation of
    /// [`fields`]): `true` when the API server prunes it, i.e. the schema neither has it nor
    /// keeps unknown fields there (`x-kubernetes-preserve-unknown-fields` on it or an
    /// ancestor, a map's `*` values, an embedded resource's `apiVersion`/`kind`/`metadata`).
    /// A version without a schema prunes nothing.
    pub fn prunes(&self, path: &str) -> bool {
        let Some(fields) = &self.fields else {
            return false;
        };
        if fields.contains_key(path) {
            return false;
        }
        let Some(parent) = parent_path(path) else {
            return false;
        };
        let key = &path[if parent.is_empty() {
            0
        } else {
            parent.len() + 1
        }..];
        if OBJECT_META.contains(&key)
            && (parent.is_empty() || fields.get(parent).is_some_and(|f| f.embedded))
        {
            return false;
        }
        // The API server keeps an object's metadata as ObjectMeta, whatever the schema says of
        // it (a CRD's schema may say only `metadata: {type: object}`).
        if within_metadata(fields, path) {
            return false;
        }
        if !path.ends_with("[]") && fields.contains_key(&child_path(parent, "*")) {
            return false;
        }
        let mut cur = Some(parent);
        while let Some(p) = cur {
            if p.is_empty() {
                return !self.root_preserves;
            }
            if fields.get(p).is_some_and(|f| f.preserve_unknown) {
                return false;
            }
            cur = parent_path(p);
        }
        true
    }

    /// What `object` (JSON, as the API server returns it) loses or breaks under this version:
    /// fields [`VersionSchema::prunes`], required fields it lacks, values an `enum` no longer
    /// allows. Bounded by the object, which the caller read bounded.
    pub fn check_object(&self, object: &serde_json::Value) -> ObjectProblems {
        let mut out = ObjectProblems::default();
        if let Some(fields) = &self.fields {
            let mut required: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
            for (path, f) in fields {
                if f.required {
                    if let Some(parent) = parent_path(path).filter(|_| !path.ends_with("[]")) {
                        let key = &path[if parent.is_empty() {
                            0
                        } else {
                            parent.len() + 1
                        }..];
                        required.entry(parent).or_default().push(key);
                    }
                }
            }
            self.walk_object(fields, &required, object, "", "", &mut out);
        }
        out
    }

    fn walk_object(
        &self,
        fields: &BTreeMap<String, Field>,
        required: &BTreeMap<&str, Vec<&str>>,
        v: &serde_json::Value,
        schema: &str,
        at: &str,
        out: &mut ObjectProblems,
    ) {
        match v {
            serde_json::Value::Object(m) => {
                for key in required.get(schema).into_iter().flatten() {
                    if !m.contains_key(*key) {
                        out.missing_required.push(child_path(at, key));
                    }
                }
                for (k, child) in m {
                    let concrete = child_path(at, k);
                    let named = child_path(schema, k);
                    if OBJECT_META.contains(&k.as_str())
                        && (schema.is_empty() || fields.get(schema).is_some_and(|f| f.embedded))
                    {
                        continue;
                    }
                    let next = if fields.contains_key(&named) {
                        named
                    } else {
                        let map = child_path(schema, "*");
                        if fields.contains_key(&map) {
                            map
                        } else {
                            if self.prunes(&named) {
                                out.pruned.push(concrete);
                            }
                            continue;
                        }
                    };
                    self.walk_object(fields, required, child, &next, &concrete, out);
                }
            }
            serde_json::Value::Array(items) => {
                let next = format!("{schema}[]");
                if fields.contains_key(&next) {
                    for (i, item) in items.iter().enumerate() {
                        self.walk_object(fields, required, item, &next, &format!("{at}[{i}]"), out);
                    }
                }
            }
            scalar => {
                if let Some(allowed) = fields.get(schema).and_then(|f| f.enums.as_ref()) {
                    let text = match scalar {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    if !allowed.contains(&text) {
                        out.enum_gone.push(format!("{at}={text}"));
                    }
                }
            }
        }
    }
}

/// What a CRD file declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrdSchema {
    /// `metadata.name`.
    pub name: String,
    /// `spec.group`.
    pub group: String,
    /// `spec.names.kind`.
    pub kind: String,
    /// Its versions, in the file's order.
    pub versions: Vec<VersionSchema>,
}

impl CrdSchema {
    /// The versions alone (name, served, stored).
    pub fn version_records(&self) -> Vec<CrdVersion> {
        self.versions.iter().map(|v| v.version.clone()).collect()
    }
}

fn get<'v>(v: &'v Value, path: &[&str]) -> Option<&'v Value> {
    path.iter()
        .try_fold(v, |cur, key| cur.as_mapping()?.get(*key))
}

fn text_at(v: &Value, path: &[&str]) -> String {
    get(v, path)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// A scalar as text (`enum` values may be strings, numbers, booleans or null).
fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => "null".into(),
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

/// Read a CRD file.
pub fn parse(file: &str, bytes: &[u8]) -> Result<CrdSchema, CrdError> {
    let doc = crate::yaml::parse_value(file, bytes, &crate::yaml::CRD).map_err(|e| CrdError {
        file: file.to_string(),
        reason: e.reason(),
    })?;
    from_value(file, &doc)
}

/// Read a CRD already parsed (a document of a rendered manifest, an object from the API server
/// turned into YAML's value type); `file` names it in errors.
pub fn from_value(file: &str, doc: &Value) -> Result<CrdSchema, CrdError> {
    let err = |reason: String| CrdError {
        file: file.to_string(),
        reason,
    };
    if text_at(doc, &["kind"]) != "CustomResourceDefinition" {
        return Err(err("not a CustomResourceDefinition".into()));
    }
    let crd_wide = get(doc, &["spec", "validation", "openAPIV3Schema"]);
    let mut versions = Vec::new();
    match get(doc, &["spec", "versions"]).and_then(Value::as_sequence) {
        Some(list) => {
            for v in list {
                let name = text_at(v, &["name"]);
                if name.is_empty() {
                    return Err(err("a version of spec.versions has no name".into()));
                }
                let flag = |k: &str| get(v, &[k]).and_then(Value::as_bool).unwrap_or(false);
                let schema = get(v, &["schema", "openAPIV3Schema"]).or(crd_wide);
                versions.push(VersionSchema {
                    version: CrdVersion {
                        name,
                        served: flag("served"),
                        storage: flag("storage"),
                    },
                    fields: schema.map(fields),
                    root_preserves: schema.is_some_and(preserves),
                });
            }
        }
        None => {
            let name = text_at(doc, &["spec", "version"]);
            if !name.is_empty() {
                versions.push(VersionSchema {
                    version: CrdVersion {
                        name,
                        served: true,
                        storage: true,
                    },
                    fields: crd_wide.map(fields),
                    root_preserves: crd_wide.is_some_and(preserves),
                });
            }
        }
    }
    Ok(CrdSchema {
        name: text_at(doc, &["metadata", "name"]),
        group: text_at(doc, &["spec", "group"]),
        kind: text_at(doc, &["spec", "names", "kind"]),
        versions,
    })
}

/// `x-kubernetes-preserve-unknown-fields: true` on a schema node.
fn preserves(node: &Value) -> bool {
    node.as_mapping()
        .and_then(|m| m.get("x-kubernetes-preserve-unknown-fields"))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// Every field of an OpenAPI v3 schema, by path.
pub fn fields(schema: &Value) -> BTreeMap<String, Field> {
    let mut out = BTreeMap::new();
    walk(schema, "", false, &mut out);
    out
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Record the node at `path` and walk its properties, array items and map values. The YAML
/// was bounded in depth before it was parsed, so the recursion is too.
fn walk(node: &Value, path: &str, required: bool, out: &mut BTreeMap<String, Field>) {
    let Some(m) = node.as_mapping() else { return };
    if !path.is_empty() {
        out.insert(
            path.to_string(),
            Field {
                ty: m.get("type").and_then(Value::as_str).map(str::to_string),
                required,
                enums: m
                    .get("enum")
                    .and_then(Value::as_sequence)
                    .map(|s| s.iter().map(scalar_text).collect()),
                preserve_unknown: preserves(node),
                embedded: m
                    .get("x-kubernetes-embedded-resource")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            },
        );
    }
    let needed: BTreeSet<&str> = m
        .get("required")
        .and_then(Value::as_sequence)
        .map(|s| s.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if let Some(props) = m.get("properties").and_then(Value::as_mapping) {
        for (k, v) in props {
            let key = scalar_text(k);
            walk(v, &join(path, &key), needed.contains(key.as_str()), out);
        }
    }
    if let Some(items) = m.get("items") {
        walk(items, &format!("{path}[]"), false, out);
    }
    if let Some(values) = m.get("additionalProperties") {
        walk(values, &join(path, "*"), false, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CRD: &str = r#"
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  names: {kind: Widget, plural: widgets}
  versions:
  - name: v1alpha1
    served: true
    storage: false
  - name: v1beta1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {type: integer}
              mode: {type: string, enum: [Fast, Slow, 3]}
              ports:
                type: array
                items:
                  type: object
                  properties:
                    port: {type: integer}
              labels:
                type: object
                additionalProperties: {type: string}
"#;

    #[test]
    fn versions_and_fields_by_path() {
        let c = parse("crds/example.com_widgets.yaml", CRD.as_bytes()).unwrap();
        assert_eq!(c.name, "widgets.example.com");
        assert_eq!(
            (c.group.as_str(), c.kind.as_str()),
            ("example.com", "Widget")
        );
        let v = c.version_records();
        assert_eq!(v.len(), 2);
        assert!(v[0].served && !v[0].storage && v[1].storage);
        assert!(c.versions[0].fields.is_none(), "v1alpha1 has no schema");
        let f = c.versions[1].fields.as_ref().unwrap();
        let paths: Vec<&str> = f.keys().map(String::as_str).collect();
        assert_eq!(
            paths,
            [
                "spec",
                "spec.labels",
                "spec.labels.*",
                "spec.mode",
                "spec.ports",
                "spec.ports[]",
                "spec.ports[].port",
                "spec.size"
            ]
        );
        assert!(f["spec.size"].required && !f["spec.mode"].required);
        assert_eq!(
            f["spec.mode"].enums.as_deref(),
            Some(&["Fast".to_string(), "Slow".into(), "3".into()][..])
        );
        assert_eq!(f["spec.size"].ty.as_deref(), Some("integer"));
    }

    #[test]
    fn v1beta1_validation_and_single_version() {
        let y = "apiVersion: apiextensions.k8s.io/v1beta1\nkind: CustomResourceDefinition\nmetadata: {name: a.b.c}\nspec:\n  group: b.c\n  version: v1\n  names: {kind: A, plural: a}\n  validation:\n    openAPIV3Schema:\n      properties:\n        spec: {properties: {x: {type: string}}}\n";
        let c = parse("crds/x.yaml", y.as_bytes()).unwrap();
        assert_eq!(c.versions.len(), 1);
        assert!(c.versions[0].version.served && c.versions[0].version.storage);
        let f = c.versions[0].fields.as_ref().unwrap();
        assert!(f.contains_key("spec.x"));
    }

    #[test]
    fn one_rule_for_what_a_schema_prunes_and_what_an_object_loses() {
        let c = parse("crds/example.com_widgets.yaml", CRD.as_bytes()).unwrap();
        let v = &c.versions[1];
        assert!(!v.prunes("spec.size"));
        assert!(v.prunes("spec.gone"), "a field the schema lacks");
        assert!(!v.prunes("spec.labels.anything"), "a map's values");
        assert!(!v.prunes("metadata"), "every object's metadata");
        assert!(!v.prunes("metadata.labels"), "its fields too");
        assert!(
            !c.versions[0].prunes("spec.gone"),
            "no schema: nothing pruned"
        );
        let obj = serde_json::json!({"apiVersion": "example.com/v1beta1", "kind": "Widget",
            "metadata": {"name": "w", "labels": {"a": "b"}, "managedFields": [{"manager": "m"}]},
            "spec": {"mode": "Medium", "gone": {"x": 1}, "labels": {"a": "b"},
                     "ports": [{"port": 1}, {"port": 2, "name": "old"}]}});
        let p = v.check_object(&obj);
        assert_eq!(p.pruned, ["spec.gone", "spec.ports[1].name"]);
        assert_eq!(p.missing_required, ["spec.size"]);
        assert_eq!(p.enum_gone, ["spec.mode=Medium"]);
        let keep = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: a.b.c}\nspec:\n  group: b.c\n  names: {kind: A, plural: a}\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema:\n        type: object\n        properties:\n          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}\n          status: {type: object, properties: {n: {type: integer}}}\n";
        let c = parse("crds/a.yaml", keep.as_bytes()).unwrap();
        let v = &c.versions[0];
        assert!(
            !v.prunes("spec.any.deep"),
            "kept below preserve-unknown-fields"
        );
        assert!(v.prunes("status.m"));
        let p = v.check_object(
            &serde_json::json!({"spec": {"x": {"y": 1}}, "status": {"m": 1}, "extra": 2}),
        );
        assert_eq!(p.pruned, ["extra", "status.m"]);
    }

    #[test]
    fn not_a_crd_is_named() {
        let e = parse("crds/x.yaml", b"kind: ConfigMap\n").unwrap_err();
        assert!(e.to_string().contains("crds/x.yaml"), "{e}");
        assert!(parse("crds/y.yaml", b"a: [\n").is_err());
    }
}
