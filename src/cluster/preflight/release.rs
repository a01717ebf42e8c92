//! The `release` check, over Helm's release records as the Secret storage driver (Helm 3 and
//! 4's default) keeps them: one Secret per revision, `sh.helm.release.v1.<name>.v<revision>`,
//! type `helm.sh/release.v1`, labels `owner=helm`, `name`, `status`, `version`, and
//! `data.release` = base64 of gzip of the release JSON (under the Secret's own base64, which
//! k8s-openapi's `ByteString` has already decoded).
//!
//! The release is looked for in the release namespace, else in every namespace (installed by
//! hand elsewhere: upgraded where it is, or a Fail when `--namespace` names another one); one
//! stuck in a pending state is a Fail.

use super::{Finding, Level, PreflightInput, ReleaseInfo, CHECK_RELEASE};
use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use std::collections::BTreeMap;
use std::io::Read;

/// Largest decompressed release accepted (a release holds the chart and its rendered manifest).
const MAX_RELEASE_JSON: u64 = 64 * 1024 * 1024;

/// The release records found in every namespace, or why they could not be listed.
#[derive(Debug)]
pub(crate) enum Everywhere {
    /// The records of the release, in any namespace.
    Found(Vec<Secret>),
    /// Not allowed to list Secrets in all namespaces.
    Forbidden,
}

/// Where the release lives and what was said about it.
#[derive(Debug)]
pub(crate) struct Located {
    /// The newest revision of the release, if it exists where it will be installed.
    pub release: Option<ReleaseInfo>,
    /// The namespace to install into.
    pub namespace: String,
    /// Findings about where it was found.
    pub findings: Vec<Finding>,
}

/// A revision, from its Secret's labels.
fn revision(s: &Secret) -> Option<(u32, ReleaseInfo)> {
    let labels = s.metadata.labels.as_ref()?;
    if labels.get("owner")? != "helm" {
        return None;
    }
    let revision: u32 = labels.get("version")?.parse().ok()?;
    Some((
        revision,
        ReleaseInfo {
            name: labels.get("name")?.clone(),
            namespace: s.metadata.namespace.clone().unwrap_or_default(),
            revision,
            status: labels
                .get("status")
                .cloned()
                .unwrap_or_else(|| "unknown".into()),
            chart_version: None,
            values: None,
            manifest: None,
        },
    ))
}

/// The newest revision (by the numeric `version` label, not by name order: `v10` sorts before
/// `v9`) among `secrets`, with its chart version when its record decodes. Records without a
/// namespace are taken to be in `namespace`.
pub(crate) fn latest(secrets: &[Secret], namespace: &str) -> Option<ReleaseInfo> {
    let (secret, mut info) = secrets
        .iter()
        .filter_map(|s| revision(s).map(|(r, i)| (r, s, i)))
        .max_by_key(|(r, _, _)| *r)
        .map(|(_, s, i)| (s, i))?;
    if info.namespace.is_empty() {
        info.namespace = namespace.to_string();
    }
    if let Some(release) = decode(secret) {
        info.chart_version = chart_version(&release);
        info.values = release.get("config").filter(|c| !c.is_null()).cloned();
        info.manifest = release
            .get("manifest")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string);
    }
    Some(info)
}

/// Decode `data.release` of a release Secret into the release JSON. `None` when it cannot be
/// decoded (the caller then just lacks the chart version).
pub(crate) fn decode(secret: &Secret) -> Option<serde_json::Value> {
    let helm_text = &secret.data.as_ref()?.get("release")?.0;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(helm_text.trim_ascii())
        .ok()?;
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
pub(crate) fn chart_version(release: &serde_json::Value) -> Option<String> {
    release
        .pointer("/chart/metadata/version")?
        .as_str()
        .map(str::to_string)
}

/// Where release `input.release` lives: in the release namespace (`here`), else in another
/// (`everywhere`, looked at only when `here` has none).
pub(crate) fn locate(
    here: &[Secret],
    everywhere: Option<&Everywhere>,
    input: &PreflightInput<'_>,
) -> Located {
    let (rel, ns) = (input.release, input.namespace);
    let at_home = |findings| Located {
        release: None,
        namespace: ns.to_string(),
        findings,
    };
    if let Some(r) = latest(here, ns) {
        return Located {
            release: Some(r),
            namespace: ns.to_string(),
            findings: Vec::new(),
        };
    }
    let all = match everywhere {
        None => return at_home(Vec::new()),
        Some(Everywhere::Forbidden) => {
            return at_home(vec![Finding::new(
                Level::Warn,
                CHECK_RELEASE,
                format!(
                    "not allowed to list Secrets in all namespaces: a release {rel:?} installed in a namespace other than {ns} would not be found (and helm would install a second one that conflicts with it)"
                ),
                Some(format!("check with `helm list -A --filter '^{rel}$'`; if it exists elsewhere, pass --namespace NS")),
            )])
        }
        Some(Everywhere::Found(all)) => all,
    };
    let mut by_ns: BTreeMap<String, Vec<Secret>> = BTreeMap::new();
    for s in all {
        let sns = s.metadata.namespace.clone().unwrap_or_default();
        if !sns.is_empty() && sns != ns {
            by_ns.entry(sns).or_default().push(s.clone());
        }
    }
    let mut found: Vec<ReleaseInfo> = by_ns
        .iter()
        .filter_map(|(ns, items)| latest(items, ns))
        .collect();
    match found.len() {
        0 => at_home(Vec::new()),
        1 if !input.namespace_explicit => {
            let r = found.remove(0);
            let other = r.namespace.clone();
            let f = Finding::new(
                Level::Info,
                CHECK_RELEASE,
                format!(
                    "Helm release {rel:?} already exists in namespace {other} (not in {ns}): it is upgraded there, in namespace {other}, so that no second release fights it for the same objects"
                ),
                None,
            );
            Located {
                release: Some(r),
                namespace: other,
                findings: vec![f],
            }
        }
        _ => {
            let list = found
                .iter()
                .map(|r| format!("{} (revision {}, {})", r.namespace, r.revision, r.status))
                .collect::<Vec<_>>()
                .join(", ");
            let f = Finding::new(
                Level::Fail,
                CHECK_RELEASE,
                format!(
                    "Helm release {rel:?} already exists in {list}, not in {ns}: a second release {rel:?} in {ns} would claim the same cluster-wide objects (CRDs, ClusterRoles, webhooks, the {} namespace) and helm would refuse them",
                    input.chart_namespace
                ),
                Some(if found.len() == 1 {
                    format!("upgrade it where it is: --namespace {}", found[0].namespace)
                } else {
                    format!("keep one of them (helm uninstall {rel} -n NS for the others), then pass --namespace NS")
                }),
            );
            at_home(vec![f])
        }
    }
}

/// Findings for an existing release.
pub(crate) fn release_findings(
    existing: Option<&ReleaseInfo>,
    input: &PreflightInput<'_>,
) -> Vec<Finding> {
    let (rel, ns) = (input.release, input.namespace);
    let Some(r) = existing else {
        return vec![Finding::new(
            Level::Info,
            CHECK_RELEASE,
            format!("no Helm release {rel:?} in namespace {ns}: this is a fresh install"),
            None,
        )];
    };
    let chart = r
        .chart_version
        .as_deref()
        .map(|v| format!(", chart {v}"))
        .unwrap_or_default();
    let f = match r.status.as_str() {
        "deployed" | "superseded" => {
            let (what, level, fix) = direction(r, input);
            Finding::new(
                level,
                CHECK_RELEASE,
                format!("Helm release {rel:?} revision {}{chart} is {} in {ns}: this is {what}", r.revision, r.status),
                fix,
            )
        }
        "failed" => Finding::new(
            Level::Warn,
            CHECK_RELEASE,
            format!("Helm release {rel:?} revision {}{chart} failed in {ns}: the upgrade replaces it", r.revision),
            None,
        ),
        "uninstalled" => Finding::new(
            Level::Warn,
            CHECK_RELEASE,
            format!("Helm release {rel:?} was uninstalled with its history kept (revision {}{chart}) in {ns}", r.revision),
            None,
        ),
        "pending-install" => Finding::new(
            Level::Fail,
            CHECK_RELEASE,
            format!(
                "Helm release {rel:?} revision {}{chart} is stuck in pending-install in {ns}: an install was interrupted, and Helm refuses to change a release while another operation is in progress",
                r.revision
            ),
            Some(format!(
                "make sure no helm command is running on it, then remove the unfinished install with `helm uninstall {rel} -n {ns}` and run again"
            )),
        ),
        s if s.starts_with("pending") || s == "uninstalling" => Finding::new(
            Level::Fail,
            CHECK_RELEASE,
            format!(
                "Helm release {rel:?} revision {}{chart} is stuck in {s} in {ns}: Helm refuses to change a release while another operation is in progress (or was interrupted)",
                r.revision
            ),
            Some(format!(
                "make sure no helm command is running on it, then look at `helm history {rel} -n {ns}` and roll back to the last deployed revision (`helm rollback {rel} <REVISION> -n {ns}`)"
            )),
        ),
        other => Finding::new(
            Level::Warn,
            CHECK_RELEASE,
            format!("Helm release {rel:?} revision {}{chart} has status {other:?} in {ns}", r.revision),
            None,
        ),
    };
    vec![f]
}

/// What installing the bundle's chart over release `r` is: an upgrade, a reinstall of the same
/// version, or a downgrade (refused unless `--allow-downgrade`: the older chart may not know
/// the CRD versions and values the newer one left in the cluster).
fn direction(r: &ReleaseInfo, input: &PreflightInput<'_>) -> (String, Level, Option<String>) {
    let parse = |v: &str| semver::Version::parse(v.trim_start_matches('v')).ok();
    let (Some(now), Some(new)) = (
        r.chart_version.as_deref().and_then(parse),
        parse(input.chart_version),
    ) else {
        return ("an upgrade".into(), Level::Info, None);
    };
    match new.cmp(&now) {
        std::cmp::Ordering::Greater => (format!("an upgrade to chart {new}"), Level::Info, None),
        std::cmp::Ordering::Equal => (
            format!("a reinstall of the same chart {new} (the values and the registry may change)"),
            Level::Info,
            None,
        ),
        std::cmp::Ordering::Less if input.allow_downgrade => (
            format!("a DOWNGRADE to chart {new} (--allow-downgrade)"),
            Level::Warn,
            None,
        ),
        std::cmp::Ordering::Less => (
            format!("a DOWNGRADE to chart {new}: the bundle's chart is older than the one the release runs"),
            Level::Fail,
            Some(format!(
                "load a bundle of chart {now} or newer; or, to go back to {new} on purpose, pass --allow-downgrade (`helm rollback {} <REVISION> -n {}` returns to an earlier revision as it was)",
                input.release, input.namespace
            )),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::preflight::tests::{fixture, input};
    use k8s_openapi::ByteString;
    use serde_json::json;
    use std::io::Write;

    fn encode(release: &serde_json::Value) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(release.to_string().as_bytes()).unwrap();
        base64::engine::general_purpose::STANDARD
            .encode(gz.finish().unwrap())
            .into_bytes()
    }

    fn secret(ns: &str, rev: u32, status: &str, data: Option<Vec<u8>>) -> Secret {
        let mut s: Secret = serde_json::from_value(json!({"metadata": {"name": format!("sh.helm.release.v1.koordinator.v{rev}"), "namespace": ns,
            "labels": {"name": "koordinator", "owner": "helm", "status": status, "version": rev.to_string()}},
            "type": "helm.sh/release.v1"})).unwrap();
        if let Some(d) = data {
            s.data = Some([("release".to_string(), ByteString(d))].into());
        }
        s
    }

    #[test]
    fn latest_is_numeric_not_lexicographic() {
        let ks = "koordinator-system";
        let list = [
            secret(ks, 10, "deployed", None),
            secret(ks, 9, "superseded", None),
            secret(ks, 8, "superseded", None),
        ];
        let r = latest(&list, "x").unwrap();
        assert_eq!(r.revision, 10);
        assert_eq!(r.status, "deployed");
        assert_eq!(r.namespace, ks);
        assert!(latest(&[], "x").is_none());
    }

    #[test]
    fn decodes_gzip_and_plain() {
        let rel = json!({"name": "koordinator", "version": 3, "chart": {"metadata": {"name": "koordinator", "version": "1.6.0"}}});
        let s = secret("d", 3, "deployed", Some(encode(&rel)));
        assert_eq!(
            chart_version(&decode(&s).unwrap()).as_deref(),
            Some("1.6.0")
        );
        let b64 = base64::engine::general_purpose::STANDARD;
        let plain = secret(
            "d",
            3,
            "deployed",
            Some(b64.encode(rel.to_string()).into_bytes()),
        );
        assert_eq!(
            chart_version(&decode(&plain).unwrap()).as_deref(),
            Some("1.6.0")
        );
        assert!(decode(&secret("d", 3, "deployed", Some(b"!!".to_vec()))).is_none());
        assert!(decode(&secret("d", 3, "deployed", None)).is_none());
    }

    #[test]
    fn eks_fixture_release_decodes() {
        let list: k8s_openapi::List<Secret> = fixture("eks/secrets-koordinator-system.json");
        let r = latest(&list.items, "koordinator-system").unwrap();
        assert_eq!(
            (r.name.as_str(), r.revision, r.status.as_str()),
            ("koordinator", 3, "deployed")
        );
        assert_eq!(r.chart_version.as_deref(), Some("1.6.0"));
    }

    #[test]
    fn found_elsewhere_is_followed_unless_the_namespace_was_named() {
        let mut i = input(&[], &[], false);
        let ks = "koordinator-system";
        let all = Everywhere::Found(vec![secret(ks, 2, "deployed", None)]);
        let l = locate(&[], Some(&all), &i);
        assert_eq!(l.namespace, ks);
        assert_eq!(l.release.unwrap().revision, 2);
        assert!(
            l.findings[0].message.contains("it is upgraded there"),
            "{:?}",
            l.findings
        );
        i.namespace_explicit = true;
        let l = locate(&[], Some(&all), &i);
        assert_eq!(
            (l.namespace.as_str(), l.release.is_none()),
            ("default", true)
        );
        assert_eq!(l.findings[0].level, Level::Fail);
        assert_eq!(
            l.findings[0].fix.as_deref(),
            Some("upgrade it where it is: --namespace koordinator-system")
        );
        let l = locate(&[], Some(&Everywhere::Forbidden), &i);
        assert_eq!(l.findings[0].level, Level::Warn);
        // Found at home: nothing else is looked at.
        let here = [secret("default", 5, "deployed", None)];
        let l = locate(&here, None, &i);
        assert_eq!(
            (l.namespace.as_str(), l.release.unwrap().revision),
            ("default", 5)
        );
    }

    #[test]
    fn release_states() {
        let i = input(&[], &[], false);
        let r = |status: &str| ReleaseInfo {
            name: "koordinator".into(),
            namespace: "default".into(),
            revision: 3,
            status: status.into(),
            chart_version: Some("1.6.0".into()),
            values: None,
            manifest: None,
        };
        assert_eq!(release_findings(None, &i)[0].level, Level::Info);
        // The bundle's chart (1.8.0 in `input`) against the release's: up, same, down.
        let mut newer = r("deployed");
        newer.chart_version = Some("1.9.1".into());
        let f = &release_findings(Some(&newer), &i)[0];
        assert_eq!(f.level, Level::Fail, "{}", f.message);
        assert!(
            f.message.contains("DOWNGRADE to chart 1.8.0"),
            "{}",
            f.message
        );
        assert!(f.fix.as_deref().unwrap().contains("--allow-downgrade"));
        let allowed = PreflightInput {
            allow_downgrade: true,
            ..i
        };
        assert_eq!(
            release_findings(Some(&newer), &allowed)[0].level,
            Level::Warn
        );
        newer.chart_version = Some("1.8.0".into());
        assert!(release_findings(Some(&newer), &i)[0]
            .message
            .contains("a reinstall of the same chart 1.8.0"));
        let f = &release_findings(Some(&r("deployed")), &i)[0];
        assert_eq!(f.level, Level::Info);
        assert!(
            f.message.contains("revision 3, chart 1.6.0") && f.message.contains("upgrade"),
            "{}",
            f.message
        );
        assert_eq!(
            release_findings(Some(&r("failed")), &i)[0].level,
            Level::Warn
        );
        let f = &release_findings(Some(&r("pending-upgrade")), &i)[0];
        assert_eq!(f.level, Level::Fail);
        assert!(f
            .fix
            .as_deref()
            .unwrap()
            .contains("helm rollback koordinator"));
    }
}
