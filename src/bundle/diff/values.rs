//! The chart's `values.yaml` defaults of two bundles, flattened to paths
//! (`koordlet.image.tag`), each leaf as JSON text (`"v1.8.0"`, `2`, `[]`, `{}`): added,
//! removed and changed (old → new). Koordinator's chart keeps feature gates as one string of
//! `Gate=bool,...` pairs (`featureGates`, `scheduler.compatible122FeatureGates`,
//! `koordlet.features`): each gate is its own path, `scheduler.featureGates[Gate]`, so a gate
//! that changes is named rather than the whole string.

use super::Change;
use serde::Serialize;
use serde_yaml_ng::Value;
use std::collections::BTreeMap;

/// A value on one side.
#[derive(Debug, Clone, Serialize)]
pub struct ValueEntry {
    /// Path.
    pub path: String,
    /// The value, as JSON text.
    pub value: String,
}

/// A value on both sides that differs.
#[derive(Debug, Clone, Serialize)]
pub struct ValueChange {
    /// Path.
    pub path: String,
    /// The values, as JSON text.
    #[serde(flatten)]
    pub change: Change<String>,
}

/// The values defaults of two sides.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ValueChanges {
    /// Only in NEW.
    pub added: Vec<ValueEntry>,
    /// Only in OLD.
    pub removed: Vec<ValueEntry>,
    /// In both, different.
    pub changed: Vec<ValueChange>,
    /// Why they are not compared (a manifest file on a side).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Whether a key holds feature gates as `Gate=bool,...`.
fn is_gates_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.ends_with("featuregates") || k == "features"
}

/// `Gate=value` pairs of a feature-gate string; `None` when it is not one.
fn gate_pairs(s: &str) -> Option<Vec<(&str, &str)>> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.trim(), v.trim()))
                .filter(|(k, _)| !k.is_empty())
        })
        .collect()
}

fn key_text(k: &Value) -> String {
    match k {
        Value::String(s) => s.clone(),
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

fn json_text(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| format!("{v:?}"))
}

/// Every leaf of `v` by path.
pub fn flatten(v: &Value) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    walk(v, "", &mut out);
    out
}

fn walk(v: &Value, path: &str, out: &mut BTreeMap<String, String>) {
    match v {
        Value::Mapping(m) if !m.is_empty() => {
            for (k, x) in m {
                let key = key_text(k);
                let p = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                walk(x, &p, out);
            }
        }
        Value::Tagged(t) => walk(&t.value, path, out),
        Value::String(s) if is_gates_key(path.rsplit('.').next().unwrap_or(path)) => {
            match gate_pairs(s) {
                Some(pairs) => {
                    for (gate, val) in pairs {
                        out.insert(format!("{path}[{gate}]"), json_text(&Value::from(val)));
                    }
                }
                None => {
                    out.insert(path.to_string(), json_text(v));
                }
            }
        }
        _ => {
            out.insert(path.to_string(), json_text(v));
        }
    }
}

/// Compare two sides' values (`None`: not available, a manifest file).
pub fn compare(old: Option<&Value>, new: Option<&Value>) -> ValueChanges {
    let (Some(o), Some(n)) = (old, new) else {
        return ValueChanges {
            note: Some(
                "values.yaml: not available from a manifest file (give the bundle itself)".into(),
            ),
            ..Default::default()
        };
    };
    let (fo, fnew) = (flatten(o), flatten(n));
    let mut out = ValueChanges::default();
    for (path, a) in &fo {
        match fnew.get(path) {
            None => out.removed.push(ValueEntry {
                path: path.clone(),
                value: a.clone(),
            }),
            Some(b) if a != b => out.changed.push(ValueChange {
                path: path.clone(),
                change: Change {
                    old: a.clone(),
                    new: b.clone(),
                },
            }),
            Some(_) => {}
        }
    }
    for (path, b) in &fnew {
        if !fo.contains_key(path) {
            out.added.push(ValueEntry {
                path: path.clone(),
                value: b.clone(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn y(s: &str) -> Value {
        crate::yaml::parse_value("test", s.as_bytes(), &crate::yaml::VALUES).unwrap()
    }

    #[test]
    fn flattened_with_feature_gates_as_pairs() {
        let f = flatten(&y(
            "a: {b: 1, c: \"x\", d: [1, 2], e: {}}\nscheduler:\n  featureGates: \"A=true, B=false\"\n  compatible122FeatureGates: \"\"\nkoordlet: {features: \"not pairs\"}\n",
        ));
        let got: Vec<(&str, &str)> = f.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            got,
            [
                ("a.b", "1"),
                ("a.c", "\"x\""),
                ("a.d", "[1,2]"),
                ("a.e", "{}"),
                ("koordlet.features", "\"not pairs\""),
                ("scheduler.featureGates[A]", "\"true\""),
                ("scheduler.featureGates[B]", "\"false\""),
            ]
        );
    }

    #[test]
    fn added_removed_changed_and_gates() {
        let o = y("a: 1\nb: {c: x}\nfeatureGates: \"G1=true,G2=true\"\n");
        let n = y("a: 2\nd: true\nfeatureGates: \"G1=false,G3=true\"\n");
        let c = compare(Some(&o), Some(&n));
        let paths = |v: &[ValueEntry]| v.iter().map(|e| e.path.clone()).collect::<Vec<_>>();
        assert_eq!(paths(&c.added), ["d", "featureGates[G3]"]);
        assert_eq!(paths(&c.removed), ["b.c", "featureGates[G2]"]);
        let ch: Vec<(String, String, String)> = c
            .changed
            .iter()
            .map(|x| (x.path.clone(), x.change.old.clone(), x.change.new.clone()))
            .collect();
        assert_eq!(
            ch,
            [
                ("a".into(), "1".into(), "2".into()),
                (
                    "featureGates[G1]".into(),
                    "\"true\"".into(),
                    "\"false\"".into()
                )
            ]
        );
        assert!(compare(None, Some(&n)).note.is_some());
    }
}
