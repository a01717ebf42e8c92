//! Runs the FAKE Kubernetes API server of `tests/kube-fake/` (a Python process) for a test:
//! stateful, strict where the real API server is strict, no controllers, no pods ever run (see
//! tests/kube-fake/README.md for what it does not model). Real helm installs into it with its
//! default Secret driver; tests assert on the objects it holds at the end and on its request log.
#![allow(dead_code)]

use crate::common::{wait_for, wait_until};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running fake API server.
pub struct KubeFake {
    /// `http(s)://127.0.0.1:PORT`.
    pub url: String,
    /// The kubeconfig it wrote (token user when started with a token).
    pub kubeconfig: PathBuf,
    /// Its state directory (addr, kubeconfig, requests.jsonl, ca.crt with TLS).
    pub dir: tempfile::TempDir,
    child: Child,
    ca: Option<PathBuf>,
    tls_name: bool,
}

/// Options of [`start`].
#[derive(Default, Clone)]
pub struct Opts<'a> {
    /// Fixture directories under tests/fixtures/kube/ to seed from (`kind`, `eks`, `ack`...).
    pub seed: &'a [&'a str],
    /// Serve HTTPS with a throw-away CA.
    pub tls: bool,
    /// Bearer token every API request must carry.
    pub token: Option<&'a str>,
    /// With `tls`: the certificate names this DNS name only, not 127.0.0.1.
    pub tls_name: Option<&'a str>,
}

pub fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/kube")
        .join(name)
}

/// Start a fake API server seeded from the fixtures named.
pub fn start(opts: Opts<'_>) -> KubeFake {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kube-fake/fake_apiserver.py");
    let mut cmd = Command::new("python3");
    cmd.arg(&script)
        .arg("--state-dir")
        .arg(dir.path())
        .args(["--port", "0", "--namespace-finalize-seconds", "0.5"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for s in opts.seed {
        cmd.arg("--seed-dir").arg(fixture_dir(s));
    }
    if opts.tls {
        cmd.arg("--tls");
    }
    if let Some(t) = opts.token {
        cmd.args(["--token", t]);
    }
    if let Some(n) = opts.tls_name {
        cmd.args(["--tls-name", n]);
    }
    let mut child = cmd
        .spawn()
        .expect("python3 runs tests/kube-fake/fake_apiserver.py");
    let addr = dir.path().join("addr");
    wait_until(
        "the fake API server to start",
        Duration::from_secs(30),
        || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("the fake API server exited at start: {status}");
            }
            addr.exists()
        },
    );
    let url = std::fs::read_to_string(&addr)
        .expect("addr")
        .trim()
        .to_string();
    KubeFake {
        url,
        kubeconfig: dir.path().join("kubeconfig"),
        ca: opts.tls.then(|| dir.path().join("ca.crt")),
        tls_name: opts.tls_name.is_some(),
        child,
        dir,
    }
}

impl KubeFake {
    /// A control endpoint (`/_fake/...`), through curl (GET, or POST of a JSON body).
    fn control(&self, path: &str, post: Option<&Value>) -> Value {
        let mut c = Command::new("curl");
        c.args(["-sS", "--fail-with-body", "--max-time", "30"]);
        if self.tls_name {
            // Its certificate does not name 127.0.0.1 (and curl's own SNI must not be counted:
            // none is sent to an IP address).
            c.arg("--insecure");
        } else if let Some(ca) = &self.ca {
            c.arg("--cacert").arg(ca);
        }
        if let Some(body) = post {
            c.args(["-H", "Content-Type: application/json", "--data-binary"])
                .arg(body.to_string());
        }
        c.arg(format!("{}{path}", self.url));
        let o = c.output().expect("curl runs");
        assert!(
            o.status.success(),
            "curl {path}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        serde_json::from_slice(&o.stdout).expect("the fake answers JSON")
    }

    /// LIST answers of paths matching `path_regex` never end (`mode` `cycle` over `tokens`, or
    /// `fresh` tokens), each padded with `pad_bytes`.
    pub fn pages(&self, rule: Value) {
        self.control("/_fake/pages", Some(&rule));
    }

    /// The TLS server names clients sent.
    pub fn sni(&self) -> Vec<Value> {
        self.control("/_fake/sni", None)["sni"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Every object it holds.
    pub fn objects(&self) -> Vec<Value> {
        let v = self.control("/_fake/state", None);
        v["objects"].as_array().cloned().unwrap_or_default()
    }

    /// The objects of a kind (`Namespace`, `Secret`...), optionally in a namespace.
    pub fn of_kind(&self, kind: &str, namespace: Option<&str>) -> Vec<Value> {
        self.objects()
            .into_iter()
            .filter(|o| o["kind"] == kind)
            .filter(|o| namespace.is_none_or(|ns| o["metadata"]["namespace"] == ns))
            .collect()
    }

    /// Wait (30 s at most) until no namespace is `Terminating`: the fake's namespace
    /// "controller" removes a deleted namespace and its content after
    /// `--namespace-finalize-seconds`.
    pub fn wait_namespaces_finalized(&self) {
        wait_for("no namespace Terminating", Duration::from_secs(30), || {
            let terminating: Vec<String> = self
                .of_kind("Namespace", None)
                .iter()
                .filter(|n| n["status"]["phase"] == "Terminating")
                .map(|n| n["metadata"]["name"].as_str().unwrap_or("").to_string())
                .collect();
            match terminating.is_empty() {
                true => Ok(()),
                false => Err(format!("still Terminating: {terminating:?}")),
            }
        })
    }

    /// `metadata.name` of the objects of a kind.
    pub fn names(&self, kind: &str, namespace: Option<&str>) -> Vec<String> {
        self.of_kind(kind, namespace)
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap_or("").to_string())
            .collect()
    }

    /// One object, if it holds it.
    pub fn get(&self, kind: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        self.of_kind(kind, namespace)
            .into_iter()
            .find(|o| o["metadata"]["name"] == name)
    }

    /// The request log.
    pub fn requests(&self) -> Vec<Value> {
        let v = self.control("/_fake/requests", None);
        v["requests"].as_array().cloned().unwrap_or_default()
    }

    /// `METHOD PATH STATUS` of every request that is not discovery, for messages.
    pub fn request_lines(&self) -> Vec<String> {
        self.requests()
            .iter()
            .filter(|r| r["resource"].is_string() || r["status"].as_u64() != Some(200))
            .map(|r| {
                format!(
                    "{} {} {} {}",
                    r["method"].as_str().unwrap_or(""),
                    r["path"].as_str().unwrap_or(""),
                    r["status"],
                    r["message"].as_str().unwrap_or("")
                )
            })
            .collect()
    }

    /// Store objects as they are (no admission): a cluster's prior state.
    pub fn seed(&self, objects: Value) {
        self.control(
            "/_fake/objects",
            Some(&serde_json::json!({ "objects": objects })),
        );
    }

    /// Leave the next `count` requests `METHOD` matching `path_regex` unanswered.
    pub fn hang(&self, method: &str, path_regex: &str, count: u32) {
        self.control(
            "/_fake/hang",
            Some(&serde_json::json!({"method": method, "path_regex": path_regex, "count": count})),
        );
    }

    /// Answer the next `count` requests `METHOD` matching `path_regex` with a `Status` of
    /// `code`/`reason`/`message`.
    pub fn fail(
        &self,
        method: &str,
        path_regex: &str,
        code: u16,
        reason: &str,
        message: &str,
        count: u32,
    ) {
        self.control(
            "/_fake/fail",
            Some(
                &serde_json::json!({"method": method, "path_regex": path_regex, "code": code,
                "reason": reason, "message": message, "count": count}),
            ),
        );
    }

    /// The images of a Deployment or DaemonSet's containers.
    pub fn images(&self, kind: &str, namespace: &str, name: &str) -> Vec<String> {
        let o = self
            .get(kind, Some(namespace), name)
            .unwrap_or_else(|| panic!("no {kind} {namespace}/{name}"));
        o["spec"]["template"]["spec"]["containers"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|c| c["image"].as_str().unwrap_or("").to_string())
            .collect()
    }

    /// (name, status, version) of helm's release Secrets in a namespace, from their labels, oldest
    /// revision first.
    pub fn releases(&self, namespace: &str) -> Vec<(String, String, String)> {
        let mut v: Vec<(String, String, String)> = self
            .of_kind("Secret", Some(namespace))
            .iter()
            .filter(|s| s["type"] == "helm.sh/release.v1")
            .map(|s| {
                let l = &s["metadata"]["labels"];
                (
                    l["name"].as_str().unwrap_or("").to_string(),
                    l["status"].as_str().unwrap_or("").to_string(),
                    l["version"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        v.sort_by_key(|r| r.2.parse::<u32>().unwrap_or(0));
        v
    }
}

impl KubeFake {
    /// One line on what it holds and what it answered, for a test's log (printed with
    /// `--no-capture`): namespaces, helm release records, CRDs, workload images, how many
    /// GETs found nothing (helm looks before it creates), and the other requests it answered
    /// with an error, by status, method and resource.
    pub fn summary(&self) -> String {
        let objects = self.objects();
        let mut namespaces: Vec<String> = objects
            .iter()
            .filter(|o| o["kind"] == "Namespace")
            .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
            .filter(|n| !n.starts_with("kube-"))
            .collect();
        namespaces.sort();
        let mut releases: Vec<String> = objects
            .iter()
            .filter(|o| o["kind"] == "Secret" && o["type"] == "helm.sh/release.v1")
            .map(|o| {
                let l = &o["metadata"]["labels"];
                format!(
                    "{}/{} v{} {}",
                    o["metadata"]["namespace"].as_str().unwrap_or(""),
                    l["name"].as_str().unwrap_or(""),
                    l["version"].as_str().unwrap_or(""),
                    l["status"].as_str().unwrap_or("")
                )
            })
            .collect();
        releases.sort();
        let crds = objects
            .iter()
            .filter(|o| o["kind"] == "CustomResourceDefinition")
            .count();
        let mut images: Vec<String> = objects
            .iter()
            .filter(|o| o["kind"] == "Deployment" || o["kind"] == "DaemonSet")
            .flat_map(|o| {
                o["spec"]["template"]["spec"]["containers"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|c| c["image"].as_str().map(str::to_string))
            .collect();
        images.sort();
        images.dedup();
        let mut refused: BTreeMap<String, usize> = BTreeMap::new();
        let mut absent = 0;
        let requests = self.requests();
        for r in &requests {
            let status = r["status"].as_u64().unwrap_or(0);
            if status == 404 && r["method"] == "GET" {
                absent += 1;
            } else if status >= 400 {
                let what = format!(
                    "{} {} {}",
                    status,
                    r["method"].as_str().unwrap_or(""),
                    r["resource"].as_str().unwrap_or("")
                );
                *refused.entry(what).or_default() += 1;
            }
        }
        format!(
            "namespaces {namespaces:?}; releases {releases:?}; {crds} CRDs; workload images {images:?}; {} requests ({absent} GETs of absent objects), errors {refused:?}",
            requests.len()
        )
    }
}

impl Drop for KubeFake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A kubeconfig for `fake` whose user gets its token from an exec plugin script of ours (the
/// fake checks the token, so nothing passes unless the plugin ran and its output was used).
/// Returns (kubeconfig, file counting the plugin's runs, file with its KUBERNETES_EXEC_INFO).
pub fn exec_kubeconfig(
    fake: &KubeFake,
    api_version: &str,
    token: &str,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let dir = fake.dir.path();
    let plugin = dir.join("token-plugin.sh");
    let count = dir.join("plugin-runs");
    let info = dir.join("plugin-exec-info.json");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\necho run >> \"$RUNS_FILE\"\nprintf '%s' \"$KUBERNETES_EXEC_INFO\" > \"$INFO_FILE\"\n[ -n \"$PLUGIN_TOKEN\" ] || {{ echo 'token-plugin: PLUGIN_TOKEN not set' >&2; exit 3; }}\nprintf '{{\"apiVersion\":\"{api_version}\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"%s\",\"expirationTimestamp\":\"2099-01-01T00:00:00Z\"}}}}\\n' \"$PLUGIN_TOKEN\"\n"
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut kc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&fake.kubeconfig).unwrap()).unwrap();
    kc["users"][0]["user"] = serde_json::json!({"exec": {
        "apiVersion": api_version,
        "command": plugin,
        "args": ["--cluster-name", "fake"],
        "env": [{"name": "PLUGIN_TOKEN", "value": token},
                {"name": "RUNS_FILE", "value": count},
                {"name": "INFO_FILE", "value": info}],
        "interactiveMode": "Never",
        "provideClusterInfo": true,
        "installHint": "token-plugin.sh comes with the test"
    }});
    let path = dir.join(format!(
        "exec-kubeconfig-{}",
        api_version.rsplit('/').next().unwrap()
    ));
    std::fs::write(&path, kc.to_string()).unwrap();
    (path, count, info)
}
