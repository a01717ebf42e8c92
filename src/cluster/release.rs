//! Helm release records as the Secrets storage driver (Helm 3 and 4's default) keeps them:
//! one Secret per revision, `sh.helm.release.v1.<name>.v<revision>`, type
//! `helm.sh/release.v1`, labels `owner=helm`, `name`, `status`, `version`, and
//! `data.release` = base64 (the Secret encoding) of base64 of gzip of the release JSON.

use base64::Engine as _;
use serde_json::Value;
use std::io::Read;

/// Largest decompressed release accepted (a release holds the chart and its rendered manifest).
const MAX_RELEASE_JSON: u64 = 64 * 1024 * 1024;

/// One revision, from its Secret's labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Revision {
    pub name: String,
    pub namespace: String,
    pub revision: u32,
    pub status: String,
}

/// The newest revision (by the numeric `version` label, not by name order: `v10` sorts before
/// `v9`) of a SecretList, with the Secret it came from.
pub(crate) fn latest(list: &Value) -> Option<(Revision, &Value)> {
    let items = list.get("items")?.as_array()?;
    items
        .iter()
        .filter_map(|s| {
            let labels = s.pointer("/metadata/labels")?;
            if labels.get("owner")?.as_str()? != "helm" {
                return None;
            }
            let revision: u32 = labels.get("version")?.as_str()?.parse().ok()?;
            let name = labels.get("name")?.as_str()?.to_string();
            let status = labels
                .get("status")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_string();
            let namespace = s
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            Some((
                Revision {
                    name,
                    namespace,
                    revision,
                    status,
                },
                s,
            ))
        })
        .max_by_key(|(r, _)| r.revision)
}

/// Decode `data.release` of a release Secret into the release JSON. `None` when it cannot be
/// decoded (the caller then just lacks the chart version).
pub(crate) fn decode(secret: &Value) -> Option<Value> {
    let outer = secret.pointer("/data/release")?.as_str()?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let helm_text = b64.decode(outer.trim()).ok()?;
    let raw = b64.decode(trim_ascii(&helm_text)).ok()?;
    // Helm gzips since 3.0; it still reads plain JSON, and so do we.
    let json = if raw.starts_with(&[0x1f, 0x8b, 0x08]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&raw[..])
            .take(MAX_RELEASE_JSON)
            .read_to_end(&mut out)
            .ok()?;
        out
    } else {
        raw
    };
    serde_json::from_slice(&json).ok()
}

/// `chart.metadata.version` of a decoded release.
pub(crate) fn chart_version(release: &Value) -> Option<String> {
    release
        .pointer("/chart/metadata/version")?
        .as_str()
        .map(str::to_string)
}

fn trim_ascii(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &b[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::Write;

    fn encode(release: &Value) -> String {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(release.to_string().as_bytes()).unwrap();
        let b64 = base64::engine::general_purpose::STANDARD;
        b64.encode(b64.encode(gz.finish().unwrap()))
    }

    fn secret(rev: u32, status: &str, data: Option<String>) -> Value {
        let mut s = json!({"metadata": {"name": format!("sh.helm.release.v1.koordinator.v{rev}"), "namespace": "koordinator-system",
            "labels": {"name": "koordinator", "owner": "helm", "status": status, "version": rev.to_string()}},
            "type": "helm.sh/release.v1"});
        if let Some(d) = data {
            s["data"] = json!({ "release": d });
        }
        s
    }

    #[test]
    fn latest_is_numeric_not_lexicographic() {
        let list = json!({"kind": "SecretList", "items": [secret(10, "deployed", None), secret(9, "superseded", None), secret(8, "superseded", None)]});
        let (r, _) = latest(&list).unwrap();
        assert_eq!(r.revision, 10);
        assert_eq!(r.status, "deployed");
        assert_eq!(r.namespace, "koordinator-system");
        assert!(latest(&json!({"items": []})).is_none());
    }

    #[test]
    fn decodes_gzip_and_plain() {
        let rel = json!({"name": "koordinator", "version": 3, "chart": {"metadata": {"name": "koordinator", "version": "1.6.0"}}});
        let s = secret(3, "deployed", Some(encode(&rel)));
        assert_eq!(
            chart_version(&decode(&s).unwrap()).as_deref(),
            Some("1.6.0")
        );
        let b64 = base64::engine::general_purpose::STANDARD;
        let plain = secret(3, "deployed", Some(b64.encode(b64.encode(rel.to_string()))));
        assert_eq!(
            chart_version(&decode(&plain).unwrap()).as_deref(),
            Some("1.6.0")
        );
        assert!(decode(&secret(3, "deployed", Some("!!".into()))).is_none());
        assert!(decode(&secret(3, "deployed", None)).is_none());
    }

    #[test]
    fn eks_fixture_release_decodes() {
        let list: Value = serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/kube/eks/secrets-koordinator-system.json"
        )))
        .unwrap();
        let (r, s) = latest(&list).unwrap();
        assert_eq!(
            (r.name.as_str(), r.revision, r.status.as_str()),
            ("koordinator", 3, "deployed")
        );
        let rel = decode(s).unwrap();
        assert_eq!(chart_version(&rel).as_deref(), Some("1.6.0"));
        assert_eq!(rel["version"], 3);
        assert_eq!(rel["info"]["status"], "deployed");
    }
}
