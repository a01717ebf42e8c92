//! Settings are resolved before any I/O (issue 22): every command reads and checks its flags,
//! files and environment first, so a bad setting fails with no network request made, no
//! bundle verified and no byte written. Each case points every address the command could reach
//! (Helm repository, image source, target registry, Kubernetes API server) at one counting
//! stand-in, and asserts it saw nothing.

use crate::common::*;
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A TCP listener on loopback that counts the connections made to it (and answers none).
struct Counter {
    addr: String,
    seen: Arc<AtomicUsize>,
}

impl Counter {
    fn start() -> Counter {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let seen = Arc::new(AtomicUsize::new(0));
        let s = seen.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                s.fetch_add(1, Ordering::SeqCst);
                drop(c);
            }
        });
        Counter { addr, seen }
    }
    fn seen(&self) -> usize {
        self.seen.load(Ordering::SeqCst)
    }
}

/// Files in `dir` (not descending), but the ones `keep` names.
fn files(dir: &Path, keep: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| !keep.contains(&n.as_str()))
        .collect();
    v.sort();
    v
}

/// The counter saw nothing, and the home's folder holds only what it held before.
fn nothing_done(h: &Home, c: &Counter, before: &[String], case: &str) {
    assert_eq!(c.seen(), 0, "{case}: a request was made");
    assert_eq!(
        files(h.path(), &[]),
        before,
        "{case}: a file was written in the home"
    );
}

#[test]
fn build_resolves_its_settings_before_any_request_or_write() {
    let h = Home::with_key();
    let c = Counter::start();
    let repo = format!("http://{}/", c.addr);
    std::fs::write(h.path().join("bad.yaml"), "a: [unclosed\n").unwrap();
    let cases: Vec<(&str, Vec<&str>, Option<&str>, &str)> = vec![
        (
            "values file missing",
            vec!["--values", "missing.yaml"],
            None,
            "missing.yaml",
        ),
        (
            "values file not YAML",
            vec!["--values", "bad.yaml"],
            None,
            "bad.yaml",
        ),
        ("--set without a key", vec!["--set", "=x"], None, "--set"),
        (
            "--platform",
            vec!["--platform", "amd64"],
            None,
            "--platform",
        ),
        (
            "--split size",
            vec!["--split", "1K"],
            None,
            "minimum part size",
        ),
        (
            "--since",
            vec!["--since", "no-such-bundle.tar"],
            None,
            "no-such-bundle.tar",
        ),
        (
            "--sign-key",
            vec!["--sign-key", "no-such.key"],
            None,
            "no-such.key",
        ),
        (
            "-o into a missing folder",
            vec!["-o", "nowhere/b.tar"],
            None,
            "nowhere",
        ),
        ("no helm", vec![], Some("/nonexistent/helm"), "helm"),
    ];
    for (case, extra, helm, needle) in cases {
        let before = files(h.path(), &[]);
        let mut b = h.build("1.8.0").repo(&repo).source(&c.addr).args(&extra);
        if let Some(p) = helm {
            b = b.helm(Some(Path::new(p)));
        }
        let o = b.run();
        assert_fails(&o, 1, &[needle]);
        nothing_done(&h, &c, &before, case);
    }
    // The same flags, right, do reach the stand-in: the count above can see a request.
    let o = h.build("1.8.0").repo(&repo).source(&c.addr).run();
    assert!(!o.status.success());
    assert!(
        c.seen() > 0,
        "the stand-in saw no request from a good build"
    );
}

#[test]
fn load_resolves_its_settings_before_verifying_or_any_request() {
    let h = Home::with_key();
    let c = Counter::start();
    let (bundle, _) = h.build_plain("1.8.0", &[]);
    let b = bundle.to_str().unwrap().to_string();
    // A kubeconfig whose API server is the stand-in.
    let kc = h.path().join("kubeconfig");
    std::fs::write(
        &kc,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://{}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
            c.addr
        ),
    )
    .unwrap();
    std::fs::write(h.path().join("broken-kubeconfig"), "clusters: [").unwrap();
    let kcs = kc.to_str().unwrap().to_string();
    let helm = env().helm4.to_str().unwrap().to_string();
    let reg = c.addr.clone();
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        (
            "no helm",
            vec!["--helm", "/nonexistent/helm", "--kubeconfig", &kcs],
            "helm",
        ),
        (
            "kubeconfig missing",
            vec!["--helm", &helm, "--kubeconfig", "no-such-kubeconfig"],
            "no-such-kubeconfig",
        ),
        (
            "kubeconfig broken",
            vec!["--helm", &helm, "--kubeconfig", "broken-kubeconfig"],
            "broken-kubeconfig",
        ),
        (
            "unknown context",
            vec!["--helm", &helm, "--kubeconfig", &kcs, "--context", "nope"],
            "nope",
        ),
        (
            "public key missing",
            vec!["--no-install", "--key", "no-such.pub"],
            "no-such.pub",
        ),
    ];
    for (case, extra, needle) in cases {
        let before = files(h.path(), &[]);
        let mut args = vec![
            "load",
            b.as_str(),
            "--registry",
            reg.as_str(),
            "--plain-http",
        ];
        args.extend(extra);
        let o = h.run(&args);
        let err = assert_fails(&o, 1, &[needle]);
        // The progress lines of a verification ("verifying", "verified N files") never came.
        assert!(
            !err.lines()
                .any(|l| l.starts_with("verified ") || l.contains("verifying")),
            "{case}: the bundle was verified first:\n{err}"
        );
        nothing_done(&h, &c, &before, case);
    }
    // Right settings reach the stand-in (the registry's first contact).
    let o = h.run(&[
        "load",
        &b,
        "--registry",
        &reg,
        "--plain-http",
        "--no-install",
    ]);
    assert!(!o.status.success());
    assert!(c.seen() > 0, "the stand-in saw no request from a good load");
}
