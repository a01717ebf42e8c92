//! A CustomResourceDefinition as the bundle carries it (`crds/<group>_<plural>.yaml`), read for
//! what an approver needs: its versions (served, stored) for the bill of materials, and the
//! fields of each version's schema for `diff` — by path (`spec.foo.bar`; `[]` for the items
//! of an array, `*` for the values of a map), whether each is required, its type and its
//! `enum` values.
//!
//! The schema is `spec.versions[].schema.openAPIV3Schema`; a version without one takes the
//! CRD-wide `spec.validation.openAPIV3Schema` of `apiextensions.k8s.io/v1beta1` (where a CRD
//! may also name its one version in `spec.version`). Every file goes through the bounded YAML
//! entry ([`crate::yaml`], the CRD limits) first.

use super::manifest::CrdVersion;
use serde_yaml_ng::Value;
use std::collections::{BTreeMap, BTreeSet};

/// A CRD file that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("CRD file {file}: {reason}")]
pub struct CrdError {
    /// The file (`crds/...`).
    pub file: String,
    /// What is wrong.
    pub reason: String,
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
}

/// One version of a CRD and its schema's fields, by path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionSchema {
    /// Name, served, stored.
    pub version: CrdVersion,
    /// Every field by path; `None` when the version has no schema.
    pub fields: Option<BTreeMap<String, Field>>,
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
    let err = |reason: String| CrdError {
        file: file.to_string(),
        reason,
    };
    let doc =
        crate::yaml::parse_value(file, bytes, &crate::yaml::CRD).map_err(|e| err(e.reason()))?;
    if text_at(&doc, &["kind"]) != "CustomResourceDefinition" {
        return Err(err("not a CustomResourceDefinition".into()));
    }
    let crd_wide = get(&doc, &["spec", "validation", "openAPIV3Schema"]);
    let mut versions = Vec::new();
    match get(&doc, &["spec", "versions"]).and_then(Value::as_sequence) {
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
                });
            }
        }
        None => {
            let name = text_at(&doc, &["spec", "version"]);
            if !name.is_empty() {
                versions.push(VersionSchema {
                    version: CrdVersion {
                        name,
                        served: true,
                        storage: true,
                    },
                    fields: crd_wide.map(fields),
                });
            }
        }
    }
    Ok(CrdSchema {
        name: text_at(&doc, &["metadata", "name"]),
        group: text_at(&doc, &["spec", "group"]),
        kind: text_at(&doc, &["spec", "names", "kind"]),
        versions,
    })
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
    fn not_a_crd_is_named() {
        let e = parse("crds/x.yaml", b"kind: ConfigMap\n").unwrap_err();
        assert!(e.to_string().contains("crds/x.yaml"), "{e}");
        assert!(parse("crds/y.yaml", b"a: [\n").is_err());
    }
}
