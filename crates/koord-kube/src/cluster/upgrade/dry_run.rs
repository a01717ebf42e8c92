//! The server-side dry run (`server-dry-run`): every object of the new release, applied to the
//! API server with `dryRun=All` (server-side apply, field manager `helm`, forced), so that what
//! the API server would refuse — validation, defaulting, admission plugins and webhooks,
//! a CRD whose stored versions it would drop, RBAC the user lacks — is found before anything is
//! pushed or changed. helm's own `--dry-run=server` does not send the objects: it only lets
//! templates `lookup` the cluster.
//!
//! Kinds are mapped to their resources by discovery (`GET /api[s]/GROUP/VERSION`), once per
//! group-version. Two cases cannot be checked as they are, and are said:
//! - a namespaced object whose namespace does not exist yet and is created by the release
//!   itself (the chart's `koordinator-system` on a fresh install): checked in the release
//!   namespace instead;
//! - an object of a kind the cluster does not serve yet (a custom resource of a CRD the release
//!   creates): not checked.

use super::super::client::{status_message, KubeClient};
use super::super::preflight::{names, Finding, Level};
use super::super::ClusterError;
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Check name: the server-side dry run.
pub const CHECK_SERVER_DRY_RUN: &str = "server-dry-run";

/// What the dry run checked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DryRun {
    /// Objects the API server accepted.
    pub accepted: usize,
    /// Objects it refused.
    pub refused: usize,
    /// Objects not checked (their kind is not served yet).
    pub not_checked: Vec<String>,
    /// Namespaces created by the release, whose objects were checked in the release namespace.
    pub checked_elsewhere: Vec<String>,
}

/// One resource of a discovery document.
#[derive(Debug, Clone)]
struct Resource {
    plural: String,
    namespaced: bool,
}

/// `/api/v1` or `/apis/GROUP/VERSION`.
fn gv_path(api_version: &str) -> String {
    if api_version.contains('/') {
        format!("/apis/{api_version}")
    } else {
        format!("/api/{api_version}")
    }
}

/// The resources of a group-version by kind, `None` when the cluster does not serve it.
async fn discover(
    client: &KubeClient,
    api_version: &str,
) -> Result<Option<BTreeMap<String, Resource>>, ClusterError> {
    let Some(doc) = client.get_json(&gv_path(api_version)).await? else {
        return Ok(None);
    };
    let mut out = BTreeMap::new();
    for r in doc["resources"].as_array().into_iter().flatten() {
        let (Some(name), Some(kind)) = (r["name"].as_str(), r["kind"].as_str()) else {
            continue;
        };
        if name.contains('/') {
            continue; // a subresource
        }
        out.entry(kind.to_string()).or_insert(Resource {
            plural: name.to_string(),
            namespaced: r["namespaced"].as_bool().unwrap_or(false),
        });
    }
    Ok(Some(out))
}

fn subject(kind: &str, ns: Option<&str>, name: &str) -> String {
    match ns {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// Apply every object of `objects` as a dry run; a Fail finding for each one refused.
pub(crate) async fn dry_run(
    client: &KubeClient,
    objects: &[Value],
    release_ns: &str,
) -> Result<(Vec<Finding>, DryRun), ClusterError> {
    let mut out = Vec::new();
    let mut report = DryRun::default();
    let mut gvs: BTreeMap<String, Option<BTreeMap<String, Resource>>> = BTreeMap::new();
    let mut namespaces: BTreeMap<String, bool> = BTreeMap::new();
    let created: BTreeSet<&str> = objects
        .iter()
        .filter(|o| o["kind"] == "Namespace" && o["apiVersion"] == "v1")
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    let mut elsewhere = BTreeSet::new();
    for o in objects {
        let (Some(api), Some(kind), Some(name)) = (
            o["apiVersion"].as_str(),
            o["kind"].as_str(),
            o["metadata"]["name"].as_str(),
        ) else {
            continue;
        };
        if !gvs.contains_key(api) {
            gvs.insert(api.to_string(), discover(client, api).await?);
        }
        let Some(res) = gvs[api].as_ref().and_then(|m| m.get(kind)).cloned() else {
            report
                .not_checked
                .push(subject(kind, o["metadata"]["namespace"].as_str(), name));
            continue;
        };
        let mut obj = o.clone();
        let mut ns = None;
        if res.namespaced {
            let mut n = o["metadata"]["namespace"]
                .as_str()
                .unwrap_or(release_ns)
                .to_string();
            if !namespaces.contains_key(&n) {
                let exists = client
                    .get_json(&format!(
                        "/api/v1/namespaces/{}",
                        koord_base::text::percent_encode(&n)
                    ))
                    .await?
                    .is_some();
                namespaces.insert(n.clone(), exists);
            }
            if !namespaces[&n] && created.contains(n.as_str()) {
                elsewhere.insert(n.clone());
                n = release_ns.to_string();
            }
            obj["metadata"]["namespace"] = n.clone().into();
            ns = Some(n);
        }
        let path = format!(
            "{}{}/{}/{}?dryRun=All&fieldManager=helm&force=true",
            gv_path(api),
            ns.as_deref()
                .map(|n| format!("/namespaces/{}", koord_base::text::percent_encode(n)))
                .unwrap_or_default(),
            res.plural,
            koord_base::text::percent_encode(name)
        );
        let a = client.apply_dry_run(&path, &obj).await?;
        if a.status.is_success() {
            report.accepted += 1;
            continue;
        }
        if a.status == http::StatusCode::UNAUTHORIZED {
            client.check(&path, &a)?;
        }
        report.refused += 1;
        let what = subject(
            kind,
            o["metadata"]["namespace"].as_str().or(ns.as_deref()),
            name,
        );
        let message = status_message(&a.body).unwrap_or_else(|| format!("HTTP {}", a.status));
        out.push(Finding::new(
            Level::Fail,
            CHECK_SERVER_DRY_RUN,
            format!(
                "the API server refuses {what} (a dry run of the apply helm will make: HTTP {}): {message}",
                a.status.as_u16()
            ),
            Some(if a.status == http::StatusCode::FORBIDDEN {
                format!("the kubeconfig user {:?} may not write it: install with a user that may (cluster-admin, as Koordinator's guide assumes)", client.user())
            } else {
                "fix the values that render it (--values, --set), or the cluster's admission policy that refuses it, then run again".into()
            }),
        ).about(what));
    }
    report.checked_elsewhere = elsewhere.into_iter().collect();
    let mut notes = Vec::new();
    if !report.checked_elsewhere.is_empty() {
        notes.push(format!(
            "the objects of namespace(s) {} (created by this release) were checked in namespace {release_ns}",
            report.checked_elsewhere.join(", ")
        ));
    }
    if !report.not_checked.is_empty() {
        notes.push(format!(
            "{} object(s) of kinds the cluster does not serve yet were not checked: {}",
            report.not_checked.len(),
            names(report.not_checked.iter().map(String::as_str))
        ));
    }
    out.insert(
        0,
        Finding::new(
            Level::Info,
            CHECK_SERVER_DRY_RUN,
            format!(
                "the API server accepted {} of {} object(s) of the new release in a dry run{}",
                report.accepted,
                report.accepted + report.refused + report.not_checked.len(),
                if notes.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", notes.join("; "))
                }
            ),
            None,
        )
        .about("the new release's objects"),
    );
    Ok((out, report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_version_paths() {
        assert_eq!(gv_path("v1"), "/api/v1");
        assert_eq!(gv_path("apps/v1"), "/apis/apps/v1");
        assert_eq!(subject("Deployment", Some("ns"), "d"), "Deployment ns/d");
    }
}
