//! YAML 1.1 merge keys (`<<: *anchor`, `<<: [*a, *b]`) resolved as helm reads them.
//!
//! helm (3 and 4) turns every rendered manifest into the JSON it sends to the API server with
//! `sigs.k8s.io/yaml`, whose YAML reader is go-yaml v2: it resolves merge keys, and does so in
//! key order. A key written before `<<` is overwritten by the merged value, one after it wins;
//! of a list of merged mappings the first wins. (Checked with helm 3.17 and helm 4.1 against a
//! real API server: `before: x` then `<<: {before: m}` is stored as `before: m`.) A YAML 1.2
//! reader (`serde_yaml_ng`) keeps `<<` as a plain key, so a document read here and written back
//! would change meaning; and a container whose `image` comes from a merge would be missed by the
//! pinning and by the check of the rendered images. So every rendered document is resolved
//! here first, the way helm reads it.

use serde_yaml_ng::{Mapping, Value};

/// The merge key.
const MERGE: &str = "<<";

fn is_merge(k: &Value) -> bool {
    k.as_str() == Some(MERGE)
}

/// Whether `v` has a merge key at any depth.
fn has_merge(v: &Value) -> bool {
    match v {
        Value::Mapping(m) => m.iter().any(|(k, val)| is_merge(k) || has_merge(val)),
        Value::Sequence(list) => list.iter().any(has_merge),
        Value::Tagged(t) => has_merge(&t.value),
        _ => false,
    }
}

/// Resolve every merge key of `v`, a document parsed from `text`, as helm reads it (see the
/// module's documentation). Error: a merge value that is not a mapping or a list of mappings
/// (helm refuses the document too), or a quoted `"<<"` key in a document that has `<<` keys (a
/// quoted one is a plain key to helm, a plain one a merge key, and the parsed document no longer
/// tells them apart: such a document is refused rather than guessed at).
pub(crate) fn resolve(text: &str, v: &mut Value) -> Result<(), String> {
    if !has_merge(v) {
        return Ok(());
    }
    if text.contains("\"<<\"") || text.contains("'<<'") {
        return Err("it has a quoted \"<<\" key and YAML merge keys (<<): which is which cannot be told once read; write the key unquoted (a merge) or under another name".into());
    }
    resolve_value(v)
}

fn resolve_value(v: &mut Value) -> Result<(), String> {
    match v {
        Value::Mapping(m) => {
            // The merged mappings are resolved first (their own merge keys included).
            for (_, val) in m.iter_mut() {
                resolve_value(val)?;
            }
            if !m.keys().any(is_merge) {
                return Ok(());
            }
            let mut out = Mapping::new();
            for (k, val) in std::mem::take(m) {
                if !is_merge(&k) {
                    out.insert(k, val);
                    continue;
                }
                match val {
                    Value::Mapping(from) => merge_into(&mut out, from),
                    Value::Sequence(list) => {
                        // go-yaml v2 merges the list backwards: the first mapping wins.
                        for item in list.into_iter().rev() {
                            match untag(item) {
                                Value::Mapping(from) => merge_into(&mut out, from),
                                other => return Err(not_a_map(&other)),
                            }
                        }
                    }
                    other => match untag(other) {
                        Value::Mapping(from) => merge_into(&mut out, from),
                        other => return Err(not_a_map(&other)),
                    },
                }
            }
            *m = out;
            Ok(())
        }
        Value::Sequence(list) => list.iter_mut().try_for_each(resolve_value),
        Value::Tagged(t) => resolve_value(&mut t.value),
        _ => Ok(()),
    }
}

fn untag(v: Value) -> Value {
    match v {
        Value::Tagged(t) => untag(t.value),
        v => v,
    }
}

/// Every key of `from` set in `out`, over what `out` has (go-yaml v2's order).
fn merge_into(out: &mut Mapping, from: Mapping) {
    for (k, val) in from {
        out.insert(k, val);
    }
}

fn not_a_map(v: &Value) -> String {
    let what = match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    };
    format!("a YAML merge key (<<) merges {what}: helm reads only a mapping or a list of mappings there")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolved(text: &str) -> Result<serde_json::Value, String> {
        let mut v =
            koord_base::yaml::parse_value("test", text.as_bytes(), &koord_base::yaml::MANIFESTS)
                .map_err(|e| e.to_string())?;
        resolve(text, &mut v)?;
        serde_json::to_value(&v).map_err(|e| e.to_string())
    }

    /// What helm 3.17 and 4.1 stored in a real API server for these documents (see the module
    /// documentation): the key before `<<` lost, the one after kept, the first of a list first.
    #[test]
    fn merge_keys_resolve_as_helm_reads_them() {
        let got = resolved("metadata:\n  labels: &base\n    a: base-a\n    b: base-b\ndata:\n  before: x\n  <<: [{before: from-merge1, c: m1-c, d: m1-d}, {c: m2-c, e: m2-e}]\n  d: explicit-d\n").unwrap();
        assert_eq!(
            got,
            serde_json::json!({"metadata": {"labels": {"a": "base-a", "b": "base-b"}},
                "data": {"before": "from-merge1", "c": "m1-c", "d": "explicit-d", "e": "m2-e"}})
        );
        let got = resolved("labels:\n  <<: {a: m-a, b: m-b}\n  a: explicit-a\n").unwrap();
        assert_eq!(
            got,
            serde_json::json!({"labels": {"a": "explicit-a", "b": "m-b"}})
        );
        // A merged mapping's own merge key, through an alias.
        let got = resolved("x: &x {<<: {p: 1}, q: 2}\ny: {<<: *x, r: 3}\n").unwrap();
        assert_eq!(got["y"], serde_json::json!({"p": 1, "q": 2, "r": 3}));
    }

    #[test]
    fn what_helm_refuses_or_cannot_be_told_is_an_error() {
        let e = resolved("a: {<<: 5}\n").unwrap_err();
        assert!(e.contains("merges a number"), "{e}");
        let e = resolved("a: {<<: [{x: 1}, y]}\n").unwrap_err();
        assert!(e.contains("merges a string"), "{e}");
        let e = resolved("a: {<<: {x: 1}}\nb: {\"<<\": 2}\n").unwrap_err();
        assert!(e.contains("quoted"), "{e}");
        // Alone too: read, a quoted key and a plain one are the same.
        assert!(resolved("b: {'<<': 2}\n").unwrap_err().contains("quoted"));
        // No merge key: nothing changes.
        assert_eq!(
            resolved("b: {\"<\": 2}\n").unwrap(),
            serde_json::json!({"b": {"<": 2}})
        );
    }
}
