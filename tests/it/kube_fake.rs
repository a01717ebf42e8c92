//! Runs the FAKE, read-only Kubernetes API server of `tests/kube-fake/` (a Python process) for
//! the few tests that need an answer the real kube-apiserver of the test environment cannot be
//! made to give (tests/kube-fake/README.md says which, and what the fake models). Tests assert
//! on what the client did with the answers, and on the fake's request log.

use crate::common::wait_until;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running fake API server.
pub struct KubeFake {
    /// The kubeconfig it wrote (token user when started with a token).
    pub kubeconfig: PathBuf,
    /// Its state directory (addr, kubeconfig, requests.jsonl, ca.crt with TLS).
    dir: tempfile::TempDir,
    child: Child,
}

/// Options of [`start`].
#[derive(Default, Clone)]
pub struct Opts<'a> {
    /// Fixture directories under tests/fixtures/kube/ to seed from (`kind`, `old`...): their
    /// `version.json`, `nodes.json` and `configz/`.
    pub seed: &'a [&'a str],
    /// Serve HTTPS with a throw-away CA.
    pub tls: bool,
    /// Bearer token every request must carry.
    pub token: Option<&'a str>,
    /// LIST answers of paths matching `path_regex` never end (`mode` `cycle` over `tokens`, or
    /// `fresh` tokens), each padded with `pad_bytes`.
    pub pages: Option<Value>,
    /// Objects served as they are (a JSON list: Secrets, Deployments, Pods).
    pub objects: Option<Value>,
    /// Every LIST of pods in a namespace is `pages` pages of `per_page` new pods whose image
    /// strings are `image_bytes` long.
    pub hostile_pods: Option<Value>,
}

/// Start a fake API server seeded from the fixtures named.
pub fn start(opts: Opts<'_>) -> KubeFake {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new("python3");
    cmd.arg(root.join("tests/kube-fake/fake_apiserver.py"))
        .arg("--state-dir")
        .arg(dir.path())
        .args(["--port", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for s in opts.seed {
        cmd.arg("--seed-dir")
            .arg(root.join("tests/fixtures/kube").join(s));
    }
    if opts.tls {
        cmd.arg("--tls");
    }
    if let Some(t) = opts.token {
        cmd.args(["--token", t]);
    }
    if let Some(rule) = &opts.pages {
        cmd.arg("--pages").arg(rule.to_string());
    }
    if let Some(objects) = &opts.objects {
        let file = dir.path().join("objects.json");
        std::fs::write(&file, objects.to_string()).expect("write the fake's objects");
        cmd.arg("--objects").arg(file);
    }
    if let Some(rule) = &opts.hostile_pods {
        cmd.arg("--hostile-pods").arg(rule.to_string());
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
    KubeFake {
        kubeconfig: dir.path().join("kubeconfig"),
        child,
        dir,
    }
}

impl KubeFake {
    /// The request log: one object per request answered (method, path, query, authorized,
    /// status, message, continueGiven), each written before its answer was sent.
    pub fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("requests.jsonl"))
            .expect("the fake's request log")
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }
}

impl Drop for KubeFake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
