//! The downgrade guard on the REAL control plane (`cluster`), issue 42: it compares the
//! bundle's chart with the newest revision that was ever deployed, whatever the newest
//! revision's status; versions compare by SemVer 2.0 (build metadata ignored); a version that
//! is not SemVer, or a record that cannot be read, is "could not tell" and refused unless
//! `--allow-downgrade`, naming what was read. The release histories are written as helm's
//! Secret driver writes them (one `helm.sh/release.v1` Secret per revision, base64 of gzip of
//! the release JSON), so each case costs a `load --dry-run`, not an install.

use crate::cluster::{self, Cluster};
use crate::common::*;
use serde_json::{json, Value};
use std::path::Path;

/// A revision's record: release `name`, `revision`, `status`, its release JSON `body` (text).
fn record(name: &str, revision: u32, status: &str, body: &str) -> Value {
    cluster::helm_record(name, "default", revision, status, &cluster::helm_text(body))
}

/// The record of a revision of chart `version` ([`record`] of [`release`]).
fn revision(name: &str, number: u32, status: &str, version: &str) -> Value {
    record(
        name,
        number,
        status,
        &release(name, number, status, version),
    )
}

/// The release JSON of a revision of chart `version`.
fn release(name: &str, revision: u32, status: &str, version: &str) -> String {
    json!({"name": name, "namespace": "default", "version": revision, "info": {"status": status},
        "chart": {"metadata": {"name": "koordinator", "version": version}},
        "config": {}, "manifest": ""})
    .to_string()
}

/// `load BUNDLE --dry-run --release NAME` into the plain registry and the leased cluster.
fn dry_run(
    h: &Home,
    kube: &Cluster,
    bundle: &Path,
    name: &str,
    extra: &[&str],
) -> std::process::Output {
    let registry = format!("{}/{}", env().plain, unique_prefix("guard"));
    let helm = cluster::helm_of(3);
    let mut args = vec![
        "--plain-http",
        "--kubeconfig",
        kube.kubeconfig.to_str().unwrap(),
        "--helm",
        helm.to_str().unwrap(),
        "--release",
        name,
        "--dry-run",
    ];
    args.extend_from_slice(extra);
    h.load_cmd(bundle, &registry, &args).output().unwrap()
}

/// A 1.7.0 bundle over: a failed upgrade of a release that ran 1.8.0 (a DOWNGRADE: before, a
/// warning and "an upgrade"); a release of chart `1.10` (not SemVer: refused, naming it;
/// before, "an upgrade"); a release of `1.7.0+build.9` (the same version: before, a DOWNGRADE);
/// a record over the 64 MiB cap (unreadable: refused; before, cut, and "an upgrade").
/// `--allow-downgrade` lets each through, with a warning.
#[test]
fn the_downgrade_guard_fails_closed() {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.7.0", &[]);
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    // A padding field after the chart's version: a reader that cut the record at the cap
    // would find the version, then fail to parse the rest.
    let big = {
        let r = release("big", 1, "deployed", "1.8.0");
        format!(
            "{},\"pad\":\"{}\"}}",
            &r[..r.len() - 1],
            "x".repeat(64 * 1024 * 1024)
        )
    };
    kube.seed(json!([
        revision("failed-up", 1, "superseded", "1.8.0"),
        revision("failed-up", 2, "failed", "1.8.0"),
        revision("not-semver", 1, "deployed", "1.10"),
        revision("build-meta", 1, "deployed", "1.7.0+build.9"),
        record("big", 1, "deployed", &big),
    ]));
    drop(big);
    let o = dry_run(&h, &kube, &bundle, "failed-up", &[]);
    assert_fails(
        &o,
        1,
        &[
            "revision 1, chart 1.8.0 (superseded)",
            "a DOWNGRADE to chart 1.7.0",
            "--allow-downgrade",
        ],
    );
    // --json: the error document carries every finding of the pre-flight (before: the
    // message "... (above)" and no finding: CI could not read why).
    let o = dry_run(&h, &kube, &bundle, "failed-up", &["--json"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    let findings = doc["error"]["findings"]
        .as_array()
        .unwrap_or_else(|| panic!("no findings in the error document: {doc}"));
    let down = findings
        .iter()
        .find(|f| {
            f["message"]
                .as_str()
                .is_some_and(|m| m.contains("a DOWNGRADE to chart 1.7.0"))
        })
        .unwrap_or_else(|| panic!("no DOWNGRADE finding: {doc}"));
    assert_eq!(down["level"], "fail", "{down}");
    assert!(
        down["check"].as_str().is_some_and(|c| !c.is_empty()),
        "{down}"
    );
    assert_eq!(down["subject"], "release default/failed-up", "{down}");
    assert!(
        findings
            .iter()
            .all(|f| f["subject"].as_str().is_some_and(|s| !s.is_empty())),
        "a finding without its subject: {doc}"
    );
    assert!(
        down["fix"]
            .as_str()
            .is_some_and(|f| f.contains("--allow-downgrade")),
        "{down}"
    );
    assert!(findings.len() > 1, "only the failing finding: {doc}");
    let o = dry_run(&h, &kube, &bundle, "not-semver", &[]);
    assert_fails(
        &o,
        1,
        &[
            "chart version \"1.10\" is not a SemVer 2.0 version",
            "--allow-downgrade",
        ],
    );
    let o = dry_run(&h, &kube, &bundle, "build-meta", &[]);
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("a reinstall of the same chart 1.7.0") && !err.contains("DOWNGRADE"),
        "{err}"
    );
    let o = dry_run(&h, &kube, &bundle, "big", &[]);
    assert_fails(&o, 1, &["could not be read", "larger than 64 MiB"]);
    for name in ["failed-up", "not-semver", "big"] {
        let o = dry_run(&h, &kube, &bundle, name, &["--allow-downgrade"]);
        assert_ok(&o);
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("DOWNGRADE to chart 1.7.0"),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}
