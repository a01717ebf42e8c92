//! Every published chart version, 0.1.0 – 1.8.0 (issue 8 part 2 and part 4): the images
//! `build` bundles are exactly those real `helm template` renders from the chart (build renders
//! it with helm, always: issue 17), and a real build of every version succeeds with helm 3 and
//! helm 4. Without helm, build stops before any download.

use crate::common::{
    assert_ok, env, helm_images, images_of, pushed_digest, tar_entries, versions, Home,
};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;

fn plan(h: &Home, version: &str, extra: &[&str]) -> Value {
    let o = h
        .build(version)
        .args(&["--dry-run", "--json"])
        .args(extra)
        .run();
    assert_ok(&o);
    serde_json::from_slice(&o.stdout).expect("build --json prints JSON")
}

fn originals(plan: &Value) -> BTreeSet<String> {
    plan["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["original"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn every_chart_version_bundles_exactly_what_helm_renders() {
    let e = env();
    let h = Home::new();
    let all = versions();
    assert_eq!(all.len(), 21, "{all:?}");
    for (i, version) in all.iter().enumerate() {
        let truth = helm_images(&e.helm3, version, &[]);
        // Real helm 3 and 4 render the same images.
        if i % 5 == 0 {
            assert_eq!(helm_images(&e.helm4, version, &[]), truth, "{version}");
        }
        let p = plan(&h, version, &[]);
        assert_eq!(originals(&p), truth, "{version}");
        assert_eq!(p["discovery"]["method"], "helm", "{version}");
        assert_eq!(p["discovery"]["helmVersion"], "v3.17.3", "{version}");
        for img in p["images"].as_array().unwrap() {
            assert_eq!(
                img["digest"],
                pushed_digest(
                    img["repository"].as_str().unwrap(),
                    img["tag"].as_str().unwrap()
                ),
                "{version}: {img}"
            );
        }
    }
    // Overrides as helm takes them: an image tag changed and the host switched; on 0.4.1 the
    // host switches between the `if .Values.imageRepositoryHost` / `else` image lines.
    for (version, sets) in [
        (
            "1.8.0",
            &["imageRepositoryHost=ghcr.io", "koordlet.image.tag=v1.6.0"][..],
        ),
        ("0.4.1", &["imageRepositoryHost=ghcr.io"][..]),
    ] {
        let truth = helm_images(&e.helm3, version, sets);
        let mut x: Vec<&str> = Vec::new();
        for s in sets {
            x.extend(["--set", s]);
        }
        let p = plan(&h, version, &x);
        assert_eq!(originals(&p), truth, "{version} {sets:?}");
    }
}

#[test]
fn every_chart_version_builds_a_bundle_with_helm_3_and_helm_4() {
    let e = env();
    let h = Home::new();
    for (i, version) in versions().into_iter().enumerate() {
        // Every version with helm 4; every third one with helm 3 too.
        let helms: Vec<(&Path, &str)> = if i % 3 == 0 {
            vec![(&e.helm4, "v4.1.4"), (&e.helm3, "v3.17.3")]
        } else {
            vec![(&e.helm4, "v4.1.4")]
        };
        let truth = helm_images(&e.helm3, &version, &[]);
        let mut manifests = Vec::new();
        for (helm, helm_version) in helms {
            let out = h.path().join(format!("k-{version}-{helm_version}.tar"));
            let o = h
                .build(&version)
                .helm(Some(helm))
                .args(&["--unsigned", "--json"])
                .out(&out)
                .run();
            assert_ok(&o);
            let entries = tar_entries(&out);
            let crds: Vec<&String> = entries
                .iter()
                .filter(|n| n.starts_with("crds/") && !n.ends_with('/'))
                .collect();
            assert!(!crds.is_empty(), "{version}");
            for c in &crds {
                let name = c.trim_start_matches("crds/");
                assert!(
                    !name.contains(' ') && name.ends_with(".yaml") && name.contains('_'),
                    "{version}: {c}"
                );
            }
            let mut ar = tar::Archive::new(std::fs::File::open(&out).unwrap());
            let manifest: Value = ar
                .entries()
                .unwrap()
                .map(|e| e.unwrap())
                .find(|e| e.path().unwrap().to_string_lossy() == "koord-bundle.json")
                .map(|mut e| {
                    let mut s = String::new();
                    std::io::Read::read_to_string(&mut e, &mut s).unwrap();
                    serde_json::from_str(&s).unwrap()
                })
                .expect("koord-bundle.json");
            assert_eq!(manifest["discovery"]["method"], "helm", "{version}");
            assert_eq!(manifest["discovery"]["helmVersion"], helm_version);
            assert_eq!(originals(&manifest), truth, "{version} {helm_version}");
            manifests.push(manifest);
            std::fs::remove_file(&out).unwrap();
        }
        for m in &manifests[1..] {
            assert_eq!(m["images"], manifests[0]["images"], "{version}");
            assert_eq!(m["crds"], manifests[0]["crds"], "{version}");
        }
    }
}

/// `helm package` a chart of tests/fixtures/charts-synthetic into `dir`.
fn package(name: &str, dir: &Path) -> std::path::PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/charts-synthetic")
        .join(name);
    let o = std::process::Command::new(&env().helm3)
        .args([
            "package",
            src.to_str().unwrap(),
            "-d",
            dir.to_str().unwrap(),
        ])
        .output()
        .expect("helm package");
    assert_ok(&o);
    dir.join(format!("{name}-0.1.0.tgz"))
}

fn helm_template_dir(name: &str, sets: &[&str]) -> BTreeSet<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/charts-synthetic")
        .join(name);
    let mut c = std::process::Command::new(&env().helm3);
    c.args([
        "template",
        "koordinator",
        src.to_str().unwrap(),
        "--namespace",
        "koordinator-system",
    ]);
    for s in sets {
        c.args(["--set", s]);
    }
    let o = c.output().expect("helm template");
    assert_ok(&o);
    images_of(&String::from_utf8_lossy(&o.stdout))
}

#[test]
fn synthetic_chart_idioms_bundle_what_helm_renders() {
    let h = Home::new();
    let chart = package("idioms", h.path());
    for sets in [
        vec![],
        vec![
            "sidecar.enabled=true",
            "global.imageRegistry=mirror.example:5000",
            "image.tag=v1.6.0",
        ],
    ] {
        let truth = helm_template_dir("idioms", &sets);
        assert!(truth.len() >= 3, "{truth:?}");
        let mut build = h.build("").chart(&chart).args(&["--dry-run", "--json"]);
        for s in &sets {
            build = build.args(&["--set", s]);
        }
        let o = build.run();
        assert_ok(&o);
        let p: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(originals(&p), truth, "{sets:?}");
        // The optional component is bundled only when enabled.
        let side = p["images"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["repository"] == "koordinator-sh/koord-device-daemon");
        assert_eq!(side, !sets.is_empty(), "{sets:?}");
        assert_eq!(p["crds"][0], "widgets.idioms.example.com");
    }
}

/// A chart only helm can read (`.Capabilities`, functions the old built-in reader lacked):
/// bundled as helm renders it.
#[test]
fn a_chart_only_helm_can_read_bundles_what_helm_renders() {
    let e = env();
    let h = Home::new();
    let chart = package("needs-helm", h.path());
    for (helm, version) in [(&e.helm3, "v3.17.3"), (&e.helm4, "v4.1.4")] {
        let o = h
            .build("")
            .chart(&chart)
            .helm(Some(helm))
            .args(&["--dry-run", "--json"])
            .run();
        assert_ok(&o);
        let p: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(originals(&p), helm_template_dir("needs-helm", &[]));
        assert_eq!(p["discovery"]["helmVersion"], version);
    }
}

/// A chart repository that counts the connections it gets (and answers none).
fn counting_repo() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let n2 = n.clone();
    std::thread::spawn(move || {
        for c in listener.incoming() {
            n2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(c);
        }
    });
    (url, n)
}

/// build needs helm (3.8+): without one it stops at once, before any download, naming where
/// it looked and how to install helm; the same for a helm that is too old.
#[test]
fn build_without_helm_stops_before_any_download() {
    let h = Home::new();
    let (repo, connections) = counting_repo();
    let no_helm = h.path().join("empty-path");
    let other = h.path().join("other-dir");
    std::fs::create_dir_all(&no_helm).unwrap();
    std::fs::create_dir_all(&other).unwrap();
    let path = std::env::join_paths([&no_helm, &other]).unwrap();
    let build = h.build("1.8.0").repo(&repo).helm(None);
    // Not on PATH: every PATH entry is named.
    let o = build.clone().cmd().env("PATH", &path).output().unwrap();
    crate::common::assert_fails(
        &o,
        1,
        &[
            &format!(
                "helm not found on PATH (looked in {}, {})",
                no_helm.display(),
                other.display()
            ),
            "needs helm 3.8.0 or newer",
            "https://helm.sh/docs/intro/install/",
            "--helm PATH",
            "nothing was downloaded",
        ],
    );
    // --helm naming nothing.
    let missing = h.path().join("no-such-helm");
    let o = build
        .clone()
        .helm(Some(&missing))
        .cmd()
        .env("PATH", &path)
        .output()
        .unwrap();
    crate::common::assert_fails(
        &o,
        1,
        &[&format!("helm not found at {} (--helm)", missing.display())],
    );
    // A helm older than 3.8.
    let old = other.join("helm");
    std::fs::write(&old, "#!/bin/sh\necho v3.7.2\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let o = build.cmd().env("PATH", &path).output().unwrap();
    crate::common::assert_fails(
        &o,
        1,
        &[
            &format!("helm 3.7.2 at {} is too old", old.display()),
            "needs helm 3.8.0 or newer",
        ],
    );
    // The builds have ended, so any connection of theirs is queued at the repository; one of
    // ours, made now, is accepted after all of them (in order): once it is counted, theirs
    // would have been.
    let addr = repo.trim_start_matches("http://").trim_end_matches('/');
    let _ours = std::net::TcpStream::connect(addr).unwrap();
    let count = || connections.load(std::sync::atomic::Ordering::SeqCst);
    crate::common::wait_until(
        "the chart repository to accept our own connection",
        std::time::Duration::from_secs(30),
        || count() > 0,
    );
    assert_eq!(
        count(),
        1,
        "build reached the chart repository without helm"
    );
}
