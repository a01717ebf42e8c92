//! The `release` check, over Helm's release records as the Secret storage driver (Helm 3 and
//! 4's default) keeps them: one Secret per revision, `sh.helm.release.v1.<name>.v<revision>`,
//! type `helm.sh/release.v1`, labels `owner=helm`, `name`, `status`, `version`, and
//! `data.release` = base64 of gzip of the release JSON (under the Secret's own base64, which
//! k8s-openapi's `ByteString` has already decoded).
//!
//! The release is looked for in the release namespace, else in every namespace (installed by
//! hand elsewhere: upgraded where it is, or a Fail when `--namespace` names another one); one
//! stuck in a pending state is a Fail.

use super::{DeployedRevision, Finding, Level, PreflightInput, ReleaseInfo, CHECK_RELEASE};
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
            unreadable: None,
            last_deployed: None,
        },
    ))
}

/// Statuses of a revision that was deployed once: `deployed`, `superseded` (deployed, then
/// replaced by a newer deployed one) and `uninstalled` (`helm uninstall --keep-history` marks the
/// deployed revision so: its CRDs, kept, are still in the cluster). `failed` and `pending-*`
/// revisions may never have been deployed.
const WAS_DEPLOYED: &[&str] = &["deployed", "superseded", "uninstalled"];

/// The newest revision (by the numeric `version` label, not by name order: `v10` sorts before
/// `v9`) among `secrets`, with its chart version when its record decodes (else why not, in
/// `unreadable`), and the newest revision that was ever deployed ([`WAS_DEPLOYED`]), which the
/// downgrade guard compares with. Records without a namespace are taken to be in `namespace`.
pub(crate) fn latest(secrets: &[Secret], namespace: &str) -> Option<ReleaseInfo> {
    let revisions: Vec<(u32, &Secret, ReleaseInfo)> = secrets
        .iter()
        .filter_map(|s| revision(s).map(|(r, i)| (r, s, i)))
        .collect();
    let (_, secret, mut info) = revisions.iter().max_by_key(|(r, _, _)| *r)?.clone();
    if info.namespace.is_empty() {
        info.namespace = namespace.to_string();
    }
    match decode(secret) {
        Ok(release) => {
            info.chart_version = chart_version(&release);
            info.values = release.get("config").filter(|c| !c.is_null()).cloned();
            info.manifest = release
                .get("manifest")
                .and_then(serde_json::Value::as_str)
                .map(str::to_string);
        }
        Err(e) => info.unreadable = Some(e),
    }
    info.last_deployed = revisions
        .iter()
        .filter(|(_, _, i)| WAS_DEPLOYED.contains(&i.status.as_str()))
        .max_by_key(|(r, _, _)| *r)
        .map(|(r, s, i)| {
            if *r == info.revision {
                return DeployedRevision {
                    revision: info.revision,
                    status: info.status.clone(),
                    chart_version: info.chart_version.clone(),
                    unreadable: info.unreadable.clone(),
                    manifest: info.manifest.clone(),
                };
            }
            let (chart_version, unreadable, manifest) = match decode(s) {
                Ok(release) => (
                    chart_version(&release),
                    None,
                    release
                        .get("manifest")
                        .and_then(serde_json::Value::as_str)
                        .map(str::to_string),
                ),
                Err(e) => (None, Some(e), None),
            };
            DeployedRevision {
                revision: *r,
                status: i.status.clone(),
                chart_version,
                unreadable,
                manifest,
            }
        });
    Some(info)
}

/// Decode `data.release` of a release Secret into the release JSON, or say why it cannot be:
/// no data, not base64, not gzip, larger than [`MAX_RELEASE_JSON`] once decompressed (never
/// cut and then read), not JSON.
pub(crate) fn decode(secret: &Secret) -> Result<serde_json::Value, String> {
    let helm_text = &secret
        .data
        .as_ref()
        .and_then(|d| d.get("release"))
        .ok_or("the record has no data.release")?
        .0;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(helm_text.trim_ascii())
        .map_err(|e| format!("data.release is not base64: {e}"))?;
    // Helm gzips since 3.0; it still reads plain JSON, and so do we.
    let json = if raw.starts_with(&[0x1f, 0x8b, 0x08]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&raw[..])
            .take(MAX_RELEASE_JSON + 1)
            .read_to_end(&mut out)
            .map_err(|e| format!("data.release does not decompress: {e}"))?;
        if out.len() as u64 > MAX_RELEASE_JSON {
            return Err(format!(
                "the record is larger than {} MiB once decompressed, and was not read further",
                MAX_RELEASE_JSON >> 20
            ));
        }
        out
    } else {
        raw
    };
    serde_json::from_slice(&json).map_err(|e| format!("the record is not a release (JSON): {e}"))
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
            let (what, level, fix) = direction(r.last_deployed.as_ref(), input);
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
    let mut findings = vec![f];
    // The newest revision is not deployed (failed, uninstalled, pending): the direction is
    // told against the newest revision that ever was, whatever the newest one's status.
    if !matches!(r.status.as_str(), "deployed" | "superseded") {
        if let Some(d) = &r.last_deployed {
            let (what, level, fix) = direction(Some(d), input);
            let chart = d
                .chart_version
                .as_deref()
                .map(|v| format!(", chart {v}"))
                .unwrap_or_default();
            findings.push(Finding::new(
                level,
                CHECK_RELEASE,
                format!(
                    "the newest revision of Helm release {rel:?} ever deployed is revision {}{chart} ({}): against it, this is {what}",
                    d.revision, d.status
                ),
                fix,
            ));
        }
    }
    findings
}

/// A chart version as SemVer 2.0 reads it (a leading `v`, which helm strips too, allowed), or
/// why it is not one.
fn semver_of(v: &str) -> Result<semver::Version, String> {
    semver::Version::parse(v.strip_prefix('v').unwrap_or(v)).map_err(|e| e.to_string())
}

/// What installing the bundle's chart over the newest revision ever deployed `d` is: an
/// upgrade, a reinstall of the same version, or a downgrade (refused unless
/// `--allow-downgrade`: the older chart may not know the CRD versions and values the newer one
/// left in the cluster). Versions are compared by SemVer 2.0 precedence (build metadata
/// ignored). A version that cannot be read, or is not SemVer, cannot be compared: "could not
/// tell", refused as a downgrade is, and the message names what was read.
fn direction(
    d: Option<&DeployedRevision>,
    input: &PreflightInput<'_>,
) -> (String, Level, Option<String>) {
    let (rel, ns, bundle) = (input.release, input.namespace, input.chart_version);
    let Some(d) = d else {
        return ("an upgrade".into(), Level::Info, None);
    };
    let unknown = |why: String| {
        if input.allow_downgrade {
            (
                format!("maybe a DOWNGRADE to chart {bundle}: {why} (--allow-downgrade)"),
                Level::Warn,
                None,
            )
        } else {
            (
                format!("maybe a DOWNGRADE to chart {bundle}, which cannot be told: {why}"),
                Level::Fail,
                Some(format!(
                    "look at `helm history {rel} -n {ns}`; if chart {bundle} is not older than what revision {} ran, pass --allow-downgrade",
                    d.revision
                )),
            )
        }
    };
    let installed = match (&d.chart_version, &d.unreadable) {
        (Some(v), _) => v,
        (None, Some(why)) => {
            return unknown(format!(
                "the chart version of revision {} could not be read ({why})",
                d.revision
            ))
        }
        (None, None) => {
            return unknown(format!(
                "the record of revision {} has no chart version",
                d.revision
            ))
        }
    };
    let now = match semver_of(installed) {
        Ok(v) => v,
        Err(e) => {
            return unknown(format!(
                "revision {}'s chart version {installed:?} is not a SemVer 2.0 version ({e})",
                d.revision
            ))
        }
    };
    let new = match semver_of(bundle) {
        Ok(v) => v,
        Err(e) => {
            return unknown(format!(
                "the bundle's chart version {bundle:?} is not a SemVer 2.0 version ({e})"
            ))
        }
    };
    match new.cmp_precedence(&now) {
        std::cmp::Ordering::Greater => (format!("an upgrade to chart {new}"), Level::Info, None),
        std::cmp::Ordering::Equal => (
            format!(
                "a reinstall of the same chart {new}{} (the values and the registry may change)",
                if new.build == now.build {
                    String::new()
                } else {
                    format!(" (installed as {installed}: SemVer gives build metadata no precedence)")
                }
            ),
            Level::Info,
            None,
        ),
        std::cmp::Ordering::Less if input.allow_downgrade => (
            format!("a DOWNGRADE to chart {new} (--allow-downgrade): revision {} ran {installed}", d.revision),
            Level::Warn,
            None,
        ),
        std::cmp::Ordering::Less => (
            format!("a DOWNGRADE to chart {new}: the bundle's chart is older than {installed}, which revision {} ran", d.revision),
            Level::Fail,
            Some(format!(
                "load a bundle of chart {now} or newer; or, to go back to {new} on purpose, pass --allow-downgrade (`helm rollback {rel} <REVISION> -n {ns}` returns to an earlier revision as it was)"
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
        assert!(decode(&secret("d", 3, "deployed", Some(b"!!".to_vec()))).is_err());
        assert!(decode(&secret("d", 3, "deployed", None)).is_err());
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

    /// The newest revision (`status`, chart `version`), which is also the newest ever deployed
    /// when its status says it was.
    fn rel(status: &str, version: &str) -> ReleaseInfo {
        ReleaseInfo {
            name: "koordinator".into(),
            namespace: "default".into(),
            revision: 3,
            status: status.into(),
            chart_version: Some(version.into()),
            values: None,
            manifest: None,
            unreadable: None,
            last_deployed: WAS_DEPLOYED.contains(&status).then(|| DeployedRevision {
                revision: 3,
                status: status.into(),
                chart_version: Some(version.into()),
                unreadable: None,
                manifest: None,
            }),
        }
    }

    #[test]
    fn release_states() {
        let i = input(&[], &[], false);
        assert_eq!(release_findings(None, &i)[0].level, Level::Info);
        // The bundle's chart (1.8.0 in `input`) against the release's: up, same, down.
        let newer = rel("deployed", "1.9.1");
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
        assert!(release_findings(Some(&rel("deployed", "1.8.0")), &i)[0]
            .message
            .contains("a reinstall of the same chart 1.8.0"));
        let f = &release_findings(Some(&rel("deployed", "1.6.0")), &i)[0];
        assert_eq!(f.level, Level::Info);
        assert!(
            f.message.contains("revision 3, chart 1.6.0") && f.message.contains("upgrade"),
            "{}",
            f.message
        );
        // A failed first install: nothing was ever deployed to compare with.
        let f = release_findings(Some(&rel("failed", "1.6.0")), &i);
        assert_eq!((f.len(), f[0].level), (1, Level::Warn));
        let f = &release_findings(Some(&rel("pending-upgrade", "1.6.0")), &i)[0];
        assert_eq!(f.level, Level::Fail);
        assert!(f
            .fix
            .as_deref()
            .unwrap()
            .contains("helm rollback koordinator"));
    }

    fn record(version: &str) -> Vec<u8> {
        encode(
            &json!({"name": "koordinator", "chart": {"metadata": {"name": "koordinator", "version": version}}}),
        )
    }

    /// 1.8.0 over a failed upgrade of a release that ran 1.9.1: a downgrade, told against
    /// revision 2, the newest ever deployed (before: a Warn about the failed revision, and no
    /// direction at all). An uninstalled revision (history kept) was deployed too.
    #[test]
    fn the_downgrade_guard_compares_with_the_newest_revision_ever_deployed() {
        let ks = "default";
        let i = input(&[], &[], false);
        let list = [
            secret(ks, 1, "superseded", Some(record("1.7.0"))),
            secret(ks, 2, "superseded", Some(record("1.9.1"))),
            secret(ks, 3, "failed", Some(record("1.9.2"))),
        ];
        let r = latest(&list, ks).unwrap();
        assert_eq!((r.revision, r.status.as_str()), (3, "failed"));
        let d = r.last_deployed.as_ref().unwrap();
        assert_eq!((d.revision, d.chart_version.as_deref()), (2, Some("1.9.1")));
        let f = release_findings(Some(&r), &i);
        let down = f
            .iter()
            .find(|f| f.level == Level::Fail)
            .unwrap_or_else(|| panic!("no Fail: {f:?}"));
        assert!(
            down.message.contains("revision 2, chart 1.9.1")
                && down.message.contains("a DOWNGRADE to chart 1.8.0"),
            "{}",
            down.message
        );
        let allowed = PreflightInput {
            allow_downgrade: true,
            ..i
        };
        assert!(release_findings(Some(&r), &allowed)
            .iter()
            .all(|f| f.level != Level::Fail));
        let list = [
            secret(ks, 1, "superseded", Some(record("1.7.0"))),
            secret(ks, 2, "uninstalled", Some(record("1.9.1"))),
        ];
        let r = latest(&list, ks).unwrap();
        assert!(release_findings(Some(&r), &i)
            .iter()
            .any(|f| f.level == Level::Fail && f.message.contains("DOWNGRADE")));
        // Over a failed upgrade of an older release: an upgrade.
        let list = [
            secret(ks, 1, "superseded", Some(record("1.7.0"))),
            secret(ks, 2, "failed", Some(record("1.9.1"))),
        ];
        let r = latest(&list, ks).unwrap();
        let f = release_findings(Some(&r), &i);
        assert!(f.iter().all(|f| f.level != Level::Fail), "{f:?}");
        assert!(
            f.iter()
                .any(|f| f.message.contains("an upgrade to chart 1.8.0")),
            "{f:?}"
        );
    }

    /// SemVer 2.0: build metadata has no precedence (`1.8.0+build.9` → 1.8.0 is a reinstall,
    /// before: a DOWNGRADE); a version that is not SemVer (`1.10`, which helm accepts) cannot be
    /// compared: refused unless --allow-downgrade, naming it (before: "an upgrade", at Info).
    #[test]
    fn versions_compare_by_semver_and_one_that_is_not_is_refused() {
        let i = input(&[], &[], false);
        let f = &release_findings(Some(&rel("deployed", "1.8.0+build.9")), &i)[0];
        assert_eq!(f.level, Level::Info, "{}", f.message);
        assert!(
            f.message.contains("a reinstall of the same chart 1.8.0"),
            "{}",
            f.message
        );
        let f = &release_findings(Some(&rel("deployed", "1.8.0-rc.1")), &i)[0];
        assert!(
            f.message.contains("an upgrade to chart 1.8.0"),
            "{}",
            f.message
        );
        for v in ["1.10", "latest"] {
            let f = &release_findings(Some(&rel("deployed", v)), &i)[0];
            assert_eq!(f.level, Level::Fail, "{}", f.message);
            assert!(
                f.message
                    .contains(&format!("{v:?} is not a SemVer 2.0 version")),
                "{}",
                f.message
            );
            assert!(f.fix.as_deref().unwrap().contains("--allow-downgrade"));
            let allowed = PreflightInput {
                allow_downgrade: true,
                ..i
            };
            assert_eq!(
                release_findings(Some(&rel("deployed", v)), &allowed)[0].level,
                Level::Warn
            );
        }
        // The bundle's own version is held to the same rule.
        let odd = PreflightInput {
            chart_version: "1.8",
            ..i
        };
        let f = &release_findings(Some(&rel("deployed", "1.7.0")), &odd)[0];
        assert_eq!(f.level, Level::Fail, "{}", f.message);
        assert!(f.message.contains("\"1.8\""), "{}", f.message);
    }

    /// A record over the 64 MiB cap is not cut and then read (before: `take()` cut it, the
    /// parse failed, and the guard said "an upgrade"): it is unreadable, and the guard refuses,
    /// saying why.
    #[test]
    fn a_record_over_the_cap_is_unreadable_and_refused() {
        let pad = "x".repeat(MAX_RELEASE_JSON as usize);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        // The version first: a reader that cut the record would still have found it.
        write!(
            gz,
            r#"{{"chart":{{"metadata":{{"version":"1.9.1"}}}},"pad":"{pad}"}}"#
        )
        .unwrap();
        drop(pad);
        let big = base64::engine::general_purpose::STANDARD
            .encode(gz.finish().unwrap())
            .into_bytes();
        let s = secret("default", 4, "deployed", Some(big));
        let e = decode(&s).unwrap_err();
        assert!(e.contains("larger than 64 MiB"), "{e}");
        let r = latest(&[s], "default").unwrap();
        assert_eq!(r.chart_version, None);
        let f = &release_findings(Some(&r), &input(&[], &[], false))[0];
        assert_eq!(f.level, Level::Fail, "{}", f.message);
        assert!(
            f.message.contains("could not be read") && f.message.contains("larger than 64 MiB"),
            "{}",
            f.message
        );
    }
}
