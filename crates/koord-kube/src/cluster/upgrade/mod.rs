//! The second day: what installing the new release does to the cluster, found before anything is
//! pushed or changed, from the objects helm will apply (its server-side render, post-rendered)
//! and those the release applied before (its record).
//!
//! - [`changes`]: object by object, what the new release adds, changes (images, replicas,
//!   RBAC rules, webhooks, CRD versions and schemas, other fields) and removes;
//! - [`crds`]: stored versions the new CRDs drop (a Fail: the API server would refuse them
//!   half-way through `helm upgrade`), stored versions that change, CRDs in the cluster newer
//!   than the chart's (a CRD downgrade, with a release or without), and existing custom
//!   resources the new schemas prune (a Fail unless `--allow-field-loss`) or refuse;
//! - [`dry_run`]: every object applied to the API server with `dryRun=All`: validation and
//!   admission errors show here, naming the object.
//!
//! Like the pre-flight, it reads (and dry-runs: the API server persists nothing); helm writes.

pub mod changes;
pub mod crds;
pub mod dry_run;

pub use changes::{Action, ObjectChange};
pub use crds::{
    CHECK_CRD_DOWNGRADE, CHECK_CRD_OBJECTS, CHECK_CRD_STORAGE_VERSION, CHECK_CRD_STORED_VERSIONS,
};
pub use dry_run::{DryRun, CHECK_SERVER_DRY_RUN};

use super::client::KubeClient;
use super::preflight::{Finding, Level};
use super::ClusterError;
use serde::Serialize;
use serde_json::Value;

/// What the checks need.
#[derive(Debug, Clone, Copy)]
pub struct UpgradeInput<'a> {
    /// Every object the new release will apply.
    pub objects: &'a [Value],
    /// Every object the release's current revision applied (empty for a fresh install).
    pub previous: &'a [Value],
    /// Why the current revision's objects could not be read (its manifest does not parse):
    /// what the new release changes is then not known, never "nothing removed".
    pub previous_unreadable: Option<&'a str>,
    /// The release namespace (where helm puts objects without one).
    pub release_namespace: &'a str,
    /// `--strict`: custom resources the new schemas prune or refuse are a Fail.
    pub strict: bool,
    /// `--allow-field-loss`: custom resources the new schemas prune are a Warn, not a Fail.
    pub allow_field_loss: bool,
}

/// What the checks found.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeReport {
    /// Findings, in check order (CRDs, then the dry run).
    pub findings: Vec<Finding>,
    /// Object by object, what the new release changes (empty when `changes_unknown` says why
    /// it is not known).
    pub changes: Vec<ObjectChange>,
    /// Why what the new release changes is not known: the current revision's objects could not
    /// be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes_unknown: Option<String>,
    /// What the server-side dry run checked.
    pub dry_run: DryRun,
}

impl UpgradeReport {
    /// True when a finding is a [`Level::Fail`].
    pub fn failed(&self) -> bool {
        self.findings.iter().any(|f| f.level == Level::Fail)
    }
}

/// Run the checks against the cluster behind `client`.
pub async fn check(
    client: &KubeClient,
    input: &UpgradeInput<'_>,
) -> Result<UpgradeReport, ClusterError> {
    let (changes, changes_unknown) = match input.previous_unreadable {
        Some(why) => (
            Vec::new(),
            Some(format!(
                "the objects of the release's current revision could not be read ({why})"
            )),
        ),
        None => (
            changes::diff(input.previous, input.objects, input.release_namespace),
            None,
        ),
    };
    let new_crds: Vec<&Value> = input
        .objects
        .iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
        .collect();
    let mut findings =
        crds::crd_findings(client, &new_crds, input.strict, input.allow_field_loss).await?;
    let (dry, report) = dry_run::dry_run(client, input.objects, input.release_namespace).await?;
    findings.extend(dry);
    Ok(UpgradeReport {
        findings,
        changes,
        changes_unknown,
        dry_run: report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The current revision's objects unreadable: the changes are "not known", with why, never
    /// an empty list read as "nothing removed"; readable, they are diffed.
    #[tokio::test]
    async fn changes_are_not_known_when_the_current_revision_cannot_be_read() {
        use crate::cluster::test_server::{cfg, serve};
        use crate::cluster::{Credentials, KubeClient};
        // No object to check: nothing is asked of the server.
        let (url, seen) = serve("500 Internal Server Error", "{}");
        let client = KubeClient::new(&cfg(url, Credentials::None)).unwrap();
        let old = vec![serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "gone", "namespace": "default"}})];
        let input = |previous_unreadable| UpgradeInput {
            objects: &[],
            previous: &old,
            release_namespace: "default",
            strict: false,
            allow_field_loss: false,
            previous_unreadable,
        };
        let r = check(&client, &input(Some("line 3: not YAML")))
            .await
            .unwrap();
        assert!(r.changes.is_empty());
        assert_eq!(
            r.changes_unknown.as_deref(),
            Some("the objects of the release's current revision could not be read (line 3: not YAML)")
        );
        let v = serde_json::to_value(&r).unwrap();
        assert!(v["changesUnknown"].is_string(), "{v}");
        let r = check(&client, &input(None)).await.unwrap();
        assert_eq!(r.changes.len(), 1);
        assert_eq!(r.changes[0].action, Action::Remove);
        assert!(r.changes_unknown.is_none());
        assert!(seen.lock().unwrap().is_empty(), "nothing is read");
    }
}
