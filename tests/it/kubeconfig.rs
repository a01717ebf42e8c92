//! Kubeconfig lists read as kubectl reads them: for several `KUBECONFIG` lists (and
//! `--context`), the library's merged view (`Merged::minified`) is compared with what the real
//! `kubectl config view --minify --flatten -o json` prints for the same list, run from another
//! directory (so that relative paths must be resolved against the file naming them).
//!
//! kubectl is the test environment's (`scripts/install-deps.sh` puts kubectl 1.33 into
//! `.tools/kubectl/`, env.json names it): without it the tests fail, never skip.

use koord_bundle::cluster::kubeconfig;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn kubectl() -> PathBuf {
    let p = PathBuf::from(
        crate::common::env_json()["kubectl"]
            .as_str()
            .expect("env.json names kubectl: restart the test environment"),
    );
    assert!(
        p.is_file(),
        "{} is missing: run scripts/install-deps.sh",
        p.display()
    );
    p
}

/// Nulls dropped everywhere (kubectl prints `env: null`, kube's types `user: null`), and
/// kubectl's empty `preferences`.
fn normalise(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            if m.get("preferences")
                .is_some_and(|p| p == &serde_json::json!({}))
            {
                m.remove("preferences");
            }
            m.values_mut().for_each(normalise);
        }
        Value::Array(a) => a.iter_mut().for_each(normalise),
        _ => {}
    }
}

/// Compare the library's view of `files` (a KUBECONFIG list) with kubectl's. Returns
/// kubectl's view (after normalising).
fn compare(files: &[&Path], context: Option<&str>) -> Value {
    let kubectl = kubectl();
    let list = std::env::join_paths(files).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(&kubectl);
    cmd.args(["config", "view", "--minify", "--flatten", "-o", "json"])
        .env("KUBECONFIG", &list)
        .env("HOME", elsewhere.path())
        .current_dir(elsewhere.path());
    if let Some(c) = context {
        cmd.args(["--context", c]);
    }
    let o = cmd.output().expect("kubectl runs");
    assert!(
        o.status.success(),
        "kubectl config view: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mut theirs: Value = serde_json::from_slice(&o.stdout).unwrap();
    let found = kubeconfig::locate(None, Some(&list), None).unwrap();
    let mut ours = kubeconfig::read(&found).unwrap().minified(context).unwrap();
    normalise(&mut theirs);
    normalise(&mut ours);
    assert_eq!(
        ours,
        theirs,
        "\nours:\n{}\nkubectl:\n{}",
        serde_json::to_string_pretty(&ours).unwrap(),
        serde_json::to_string_pretty(&theirs).unwrap()
    );
    theirs
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, text).unwrap();
    p
}

/// The issue's case: a.yaml holds the cluster and the user (with a CA file relative to a.yaml),
/// b.yaml the context and `current-context`, plus a cluster and user of the same names, which
/// lose to a.yaml's whole (not field by field).
#[test]
fn cluster_and_user_in_one_file_context_in_another() {
    let d = tempfile::tempdir().unwrap();
    write(
        d.path(),
        "a/ca.crt",
        "-----BEGIN CERTIFICATE-----\nQ0FB\n-----END CERTIFICATE-----\n",
    );
    let a = write(
        d.path(),
        "a/a.yaml",
        "apiVersion: v1\nkind: Config\nclusters:\n- name: stub\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority: ca.crt\nusers:\n- name: admin\n  user:\n    token: token-of-a\n",
    );
    let b = write(
        d.path(),
        "b/b.yaml",
        "apiVersion: v1\nkind: Config\ncurrent-context: stub\ncontexts:\n- name: stub\n  context: {cluster: stub, user: admin, namespace: tools}\nclusters:\n- name: stub\n  cluster: {server: 'https://b:6443', insecure-skip-tls-verify: true}\nusers:\n- name: admin\n  user: {token: token-of-b, as: someone}\n",
    );
    let v = compare(&[&a, &b], None);
    assert_eq!(v["current-context"], "stub");
    assert_eq!(v["users"][0]["user"]["token"], "token-of-a");
}

/// An empty `current-context` in the first file does not win; a missing file in the list is
/// skipped; `--context` picks a context only the last file has.
#[test]
fn empty_current_context_missing_file_and_context_flag() {
    let d = tempfile::tempdir().unwrap();
    let first = write(
        d.path(),
        "first.yaml",
        "current-context: ''\nclusters:\n- name: c1\n  cluster: {server: 'https://one:6443', tls-server-name: kubernetes.default.svc, proxy-url: 'http://proxy.corp:3128'}\n",
    );
    let missing = d.path().join("not-there.yaml");
    let last = write(
        d.path(),
        "last.yaml",
        "current-context: ctx-1\ncontexts:\n- name: ctx-1\n  context: {cluster: c1, user: u1}\n- name: ctx-2\n  context: {cluster: c1}\nusers:\n- name: u1\n  user: {username: admin, password: pw}\n",
    );
    let v = compare(&[&first, &missing, &last], None);
    assert_eq!(v["current-context"], "ctx-1");
    assert_eq!(
        v["clusters"][0]["cluster"]["tls-server-name"],
        "kubernetes.default.svc"
    );
    compare(&[&first, &missing, &last], Some("ctx-2"));
}

/// An exec plugin user with impersonation, and client certificate files relative to their
/// kubeconfig, flattened into data.
#[test]
fn exec_impersonation_and_client_certificate_files() {
    let d = tempfile::tempdir().unwrap();
    write(
        d.path(),
        "certs/client.crt",
        "-----BEGIN CERTIFICATE-----\nQ0VSVA==\n-----END CERTIFICATE-----\n",
    );
    write(
        d.path(),
        "certs/client.key",
        "-----BEGIN PRIVATE KEY-----\nS0VZ\n-----END PRIVATE KEY-----\n",
    );
    let users = write(
        d.path(),
        "certs/users.yaml",
        r#"users:
- name: eks
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: aws
      args: [eks, get-token, --cluster-name, prod]
      env: [{name: AWS_PROFILE, value: prod}]
      interactiveMode: IfAvailable
      provideClusterInfo: true
    as: jane
    as-uid: "1001"
    as-groups: [devs, ops]
    as-user-extra: {reason: [audit]}
- name: cert
  user: {client-certificate: client.crt, client-key: client.key}
"#,
    );
    let ctx = write(
        d.path(),
        "ctx.yaml",
        "current-context: prod\ncontexts:\n- name: prod\n  context: {cluster: prod, user: eks}\n- name: certs\n  context: {cluster: prod, user: cert}\nclusters:\n- name: prod\n  cluster: {server: 'https://ABCD.eks.amazonaws.com', certificate-authority-data: UEVN}\n",
    );
    let v = compare(&[&ctx, &users], None);
    assert_eq!(v["users"][0]["user"]["exec"]["command"], "aws");
    assert_eq!(v["users"][0]["user"]["as-groups"][1], "ops");
    let v = compare(&[&ctx, &users], Some("certs"));
    assert!(v["users"][0]["user"]["client-key-data"].is_string());
}
