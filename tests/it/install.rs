//! `load` all the way into a cluster: real helm 3 and helm 4, with their default Secret storage
//! driver, install, upgrade and uninstall into the REAL Kubernetes control plane of the test
//! environment (kube-apiserver v1.36 with RBAC, admission and validation, etcd 3.6 and the
//! controller manager: `tests/it/cluster.rs`). The tests assert on what the API server holds at
//! the end (read with kubectl) and on what its audit log recorded. No Pod runs (no scheduler,
//! no kubelet), so nothing is waited for.
//!
//! One test still uses the fake API server of `tests/kube-fake/`, for an answer the real one
//! cannot be made to give here: a kind node's kubelet `/configz` through the API server's node
//! proxy (it refuses to proxy to a loopback node address, "address not allowed", and loopback is
//! the only address tests may use).

use crate::cluster::{self, Cluster};
use crate::common::*;
use crate::kube_fake::{self, Opts};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const CHART_NS: &str = "koordinator-system";
const RELEASE: &str = "koordinator";
/// The five CRDs Alibaba Cloud ACK's ack-koordinator installs (Koordinator's install guide).
const ACK_PLURALS: [&str; 5] = [
    "reservations",
    "elasticquotas",
    "podgroups",
    "nodemetrics",
    "nodeslos",
];

fn load_args(
    b: &Built,
    bundle: &Path,
    registry: &str,
    cluster: &Cluster,
    major: u64,
    extra: &[&str],
) -> Vec<String> {
    load_args_with(b, bundle, registry, &cluster.kubeconfig, major, extra)
}

/// `load` with a kubeconfig of its own.
fn load_args_with(
    b: &Built,
    bundle: &Path,
    registry: &str,
    kubeconfig: &Path,
    major: u64,
    extra: &[&str],
) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "load".into(),
        bundle.to_string_lossy().into(),
        "--registry".into(),
        registry.into(),
        "--plain-http".into(),
        "--key".into(),
        b.home.pubkey().to_string_lossy().into(),
        "--kubeconfig".into(),
        kubeconfig.to_string_lossy().into(),
        "--helm".into(),
        cluster::helm_of(major).to_string_lossy().into(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn run(b: &Built, args: &[String]) -> std::process::Output {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    b.home.run(&a)
}

fn bundled_images(registry: &str, tag: &str, components: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = components
        .iter()
        .map(|c| format!("{registry}/koordinator-sh/{c}:{tag}"))
        .collect();
    v.sort();
    v
}

/// Every workload's images, sorted, as the chart names them: each is pinned to a digest by
/// `load` (`REF@sha256:...`, checked here, with the pull policy that goes with it), which is
/// cut off (`day2::images_are_pinned_to_the_bundles_digests` checks the digests).
fn workload_images(kube: &Cluster) -> Vec<String> {
    let mut v = Vec::new();
    for (w, c, image, policy) in kube.containers(CHART_NS) {
        let Some((r, d)) = image.split_once("@sha256:") else {
            panic!("{w}: container {c} runs {image}, not pinned to a digest");
        };
        assert_eq!(d.len(), 64, "{image}");
        assert_eq!(policy, "IfNotPresent", "{w} {c}");
        v.push(r.to_string());
    }
    v.sort();
    v.dedup();
    v
}

/// What the cluster holds after a successful install of 1.8.0 from `registry` as release
/// `koordinator` in `default`, revision `rev`.
fn assert_installed(kube: &Cluster, registry: &str, rev: &str) {
    eprintln!("the cluster after the install: {}", kube.summary());
    let ns = kube.names("namespaces", None);
    assert!(ns.contains(&CHART_NS.to_string()), "{ns:?}");
    let releases = kube.releases("default");
    assert_eq!(
        releases.last(),
        Some(&(RELEASE.to_string(), "deployed".to_string(), rev.to_string())),
        "{releases:?}\n{:#?}",
        kube.request_lines()
    );
    assert!(
        kube.releases(CHART_NS).is_empty(),
        "no release record in the chart's namespace"
    );
    assert_eq!(
        workload_images(kube),
        bundled_images(registry, "v1.8.0", &COMPONENTS_180),
        "every workload pulls from the private registry"
    );
    let chart_ns = kube.get("namespace", None, CHART_NS).unwrap();
    assert_eq!(
        chart_ns["metadata"]["annotations"]["meta.helm.sh/release-namespace"], "default",
        "{chart_ns}"
    );
}

/// helm wrote the release record into `default`, as the client it is.
fn assert_release_record_in_default(kube: &Cluster, major: u64) {
    let writes: Vec<Value> = kube
        .requests_of("Helm/")
        .into_iter()
        .filter(|r| r["verb"] == "create" && r["objectRef"]["resource"] == "secrets")
        .collect();
    let first = writes
        .first()
        .unwrap_or_else(|| panic!("no release Secret written: {:#?}", kube.request_lines()));
    assert_eq!(first["objectRef"]["namespace"], "default", "{first}");
    assert_eq!(first["responseStatus"]["code"], 201, "{first}");
    let agent = first["userAgent"].as_str().unwrap();
    assert!(agent.starts_with(&format!("Helm/{major}.")), "{agent}");
}

/// helm 3 creates and patches (client-side: the API server records an Update by manager
/// `helm`); helm 4 applies (server-side: an Apply by manager `helm`).
fn assert_write_style(kube: &Cluster, major: u64) {
    let d = kube
        .get("deployment", Some(CHART_NS), "koord-manager")
        .unwrap();
    let managers: Vec<(String, String)> = d["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["manager"].as_str().unwrap_or("").to_string(),
                m["operation"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let want = if major == 3 { "Update" } else { "Apply" };
    assert!(
        managers.contains(&("helm".to_string(), want.to_string())),
        "{managers:?}"
    );
}

fn fresh(major: u64) {
    let b = Built::new();
    let e = env();
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let registry = format!("{}/{}", e.plain, unique_prefix(&format!("fresh{major}")));
    let o = run(
        &b,
        &load_args(&b, &b.bundle, &registry, &kube, major, &["--json"]),
    );
    assert_ok(&o);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["helm"]["installed"], true);
    assert_eq!(r["helm"]["namespace"], "default");
    let cmd = r["helm"]["command"].as_str().unwrap();
    assert!(cmd.contains("--namespace default"), "{cmd}");
    assert!(!cmd.contains("--create-namespace"), "{cmd}");
    assert_installed(&kube, &registry, "1");
    assert_release_record_in_default(&kube, major);
    assert_write_style(&kube, major);
    assert_eq!(kube.names("CustomResourceDefinition", None).len(), 13);
    // helm lists it, and uninstalls it cleanly (namespace and records gone), keeping the CRDs
    // (load marks them helm.sh/resource-policy: keep: see day2.rs).
    let o = kube.helm(major, &["list", "-A", "-o", "json"]);
    assert_ok(&o);
    let list: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(list[0]["namespace"], "default", "{list}");
    assert_eq!(list[0]["chart"], "koordinator-1.8.0", "{list}");
    let o = kube.helm(major, &["uninstall", RELEASE, "-n", "default"]);
    assert_ok(&o);
    kube.wait_namespaces_finalized();
    assert!(kube.releases("default").is_empty());
    assert_eq!(kube.names("CustomResourceDefinition", None).len(), 13);
    assert!(!kube
        .names("Namespace", None)
        .contains(&CHART_NS.to_string()));
}

fn guide_installed(major: u64) {
    let b = Built::new();
    // Koordinator's guide: `helm install koordinator koordinator-sh/koordinator` (into default),
    // here from the local chart repository.
    let e = env();
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let o = kube.helm(
        major,
        &[
            "install",
            RELEASE,
            "koordinator",
            "--repo",
            &e.helm_repo,
            "--version",
            "1.8.0",
        ],
    );
    assert_ok(&o);
    assert_eq!(kube.releases("default").len(), 1);
    let registry = format!("{}/{}", e.plain, unique_prefix(&format!("guide{major}")));
    let o = run(&b, &load_args(&b, &b.bundle, &registry, &kube, major, &[]));
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("revision 1, chart 1.8.0 is deployed in default: this is a reinstall of the same chart 1.8.0"),
        "{err}"
    );
    // Upgraded, not duplicated: one release, revision 2, images now from the private registry.
    assert_installed(&kube, &registry, "2");
    let names: Vec<String> = kube.releases("default").into_iter().map(|r| r.0).collect();
    assert_eq!(names, [RELEASE, RELEASE], "two revisions of one release");
    let o = kube.helm(major, &["list", "-A", "-q"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), RELEASE);
}

fn release_in_other_namespace(major: u64) {
    let b = Built::new();
    // A release installed by hand into koordinator-system (namespace adopted first): found
    // through helm's labels in any namespace and upgraded there, never installed again.
    let e = env();
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    kube.seed(json!([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CHART_NS,
        "labels": {"app.kubernetes.io/managed-by": "Helm"},
        "annotations": {"meta.helm.sh/release-name": RELEASE, "meta.helm.sh/release-namespace": CHART_NS}}}]));
    let chart = fixtures().join("koordinator-1.8.0.tgz");
    let o = kube.helm(
        major,
        &["install", RELEASE, chart.to_str().unwrap(), "-n", CHART_NS],
    );
    assert_ok(&o);
    let prefix = unique_prefix(&format!("other{major}"));
    let registry = format!("{}/{prefix}", e.plain);
    // --namespace default named explicitly: refused before any push.
    let o = run(
        &b,
        &load_args(
            &b,
            &b.bundle,
            &registry,
            &kube,
            major,
            &["--namespace", "default"],
        ),
    );
    assert_fails(
        &o,
        1,
        &[
            "already exists in koordinator-system",
            "--namespace koordinator-system",
            "nothing was pushed",
        ],
    );
    assert!(repos_under(&prefix).is_empty());
    // Without --namespace: upgraded where it lives.
    let o = run(
        &b,
        &load_args(&b, &b.bundle, &registry, &kube, major, &["--json"]),
    );
    assert_ok(&o);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["helm"]["namespace"], CHART_NS);
    let rel = kube.releases(CHART_NS);
    assert_eq!(rel.last().unwrap().1, "deployed");
    assert_eq!(rel.last().unwrap().2, "2");
    assert!(kube.releases("default").is_empty(), "no second release");
    eprintln!("the cluster after the upgrade: {}", kube.summary());
}

fn unowned_namespace(major: u64) {
    let b = Built::new();
    let e = env();
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    // As `kubectl create namespace koordinator-system` leaves it.
    kube.kubectl(&["create", "namespace", CHART_NS]);
    let prefix = unique_prefix(&format!("unowned{major}"));
    let registry = format!("{}/{prefix}", e.plain);
    let o = run(&b, &load_args(&b, &b.bundle, &registry, &kube, major, &[]));
    let fix = "kubectl label namespace koordinator-system app.kubernetes.io/managed-by=Helm && kubectl annotate namespace koordinator-system meta.helm.sh/release-name=koordinator meta.helm.sh/release-namespace=default";
    assert_fails(&o, 1, &["nothing was pushed", fix]);
    assert!(repos_under(&prefix).is_empty());
    // The fix the finding names, run as it is printed, then the load goes through.
    for cmd in fix.split(" && ") {
        let args: Vec<&str> = cmd.split(' ').skip(1).collect();
        kube.kubectl(&args);
    }
    let o = run(&b, &load_args(&b, &b.bundle, &registry, &kube, major, &[]));
    assert_ok(&o);
    assert_installed(&kube, &registry, "1");
}

fn ack(major: u64) {
    let b = Built::new();
    let e = env();
    let kube = cluster::lease();
    // ACK's nodes and the five CRDs ack-koordinator installs, without Helm's labels.
    kube.seed_nodes("ack");
    kube.seed_crds("ack");
    // ack-koordinator's namespace, adopted as the pre-flight says (its own test is above).
    kube.seed(json!([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CHART_NS,
        "labels": {"app.kubernetes.io/managed-by": "Helm"},
        "annotations": {"meta.helm.sh/release-name": RELEASE, "meta.helm.sh/release-namespace": "default"}}}]));
    let before: Vec<Value> = kube.of_kind("CustomResourceDefinition", None);
    assert_eq!(before.len(), 5);
    let registry = format!("{}/{}", e.plain, unique_prefix(&format!("ack{major}")));
    let o = run(
        &b,
        &load_args(&b, &b.bundle, &registry, &kube, major, &["--json"]),
    );
    assert_ok(&o);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let values = r["helm"]["values"].as_str().unwrap();
    for p in ACK_PLURALS {
        assert!(values.contains(&format!("{p}: false")), "{values}");
    }
    assert_installed(&kube, &registry, "1");
    // The five stay exactly as ACK left them (the API server's resourceVersion too); the
    // chart's other eight are created.
    for b in &before {
        let name = b["metadata"]["name"].as_str().unwrap();
        let now = kube.get("CustomResourceDefinition", None, name).unwrap();
        for field in [
            "/metadata/resourceVersion",
            "/metadata/labels",
            "/metadata/annotations",
            "/spec",
        ] {
            assert_eq!(
                now.pointer(field),
                b.pointer(field),
                "{name} was touched: {field}"
            );
        }
    }
    assert_eq!(kube.names("CustomResourceDefinition", None).len(), 13);
}

fn pending_install(major: u64) {
    let b = Built::new();
    let e = env();
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    // An install interrupted half-way: helm waits for the Deployments to be ready (no Pod ever
    // runs here), its release record says pending-install, and helm is killed.
    let chart = fixtures().join("koordinator-1.8.0.tgz");
    let mut child = kube
        .helm_cmd(
            major,
            &[
                "install",
                RELEASE,
                chart.to_str().unwrap(),
                "-n",
                "default",
                "--wait",
                "--timeout",
                "10m",
            ],
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until(
        "helm to create the Deployments and wait for them",
        std::time::Duration::from_secs(120),
        || {
            kube.get("deployment", Some(CHART_NS), "koord-manager")
                .is_some()
                && kube.releases("default").first().map(|r| r.1.as_str()) == Some("pending-install")
        },
    );
    child.kill().unwrap();
    let _ = child.wait();
    assert_eq!(
        kube.releases("default"),
        [(
            RELEASE.to_string(),
            "pending-install".to_string(),
            "1".to_string()
        )]
    );
    let prefix = unique_prefix(&format!("pending{major}"));
    let registry = format!("{}/{prefix}", e.plain);
    let o = run(&b, &load_args(&b, &b.bundle, &registry, &kube, major, &[]));
    assert_fails(
        &o,
        1,
        &[
            "pending-install",
            "helm uninstall koordinator -n default",
            "nothing was pushed",
        ],
    );
    assert!(repos_under(&prefix).is_empty());
    // The fix it names, then the load goes through.
    assert_ok(&kube.helm(major, &["uninstall", RELEASE, "-n", "default"]));
    kube.wait_namespaces_finalized();
    let o = run(&b, &load_args(&b, &b.bundle, &registry, &kube, major, &[]));
    assert_ok(&o);
    assert_installed(&kube, &registry, "1");
}

fn upgrade_160_to_180(major: u64) {
    let b = Built::new();
    let e = env();
    let (old, _) = b.home.build_plain("1.6.0", &[]);
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let registry = format!("{}/{}", e.plain, unique_prefix(&format!("upgrade{major}")));
    let o = run(&b, &load_args(&b, &old, &registry, &kube, major, &[]));
    assert_ok(&o);
    assert_eq!(
        workload_images(&kube),
        bundled_images(
            &registry,
            "v1.6.0",
            &[
                "koord-descheduler",
                "koord-manager",
                "koord-scheduler",
                "koordlet"
            ]
        )
    );
    let crds_160 = kube.names("CustomResourceDefinition", None).len();
    let o = run(&b, &load_args(&b, &b.bundle, &registry, &kube, major, &[]));
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("chart 1.6.0 is deployed in default: this is an upgrade"),
        "{err}"
    );
    assert_installed(&kube, &registry, "2");
    assert_eq!(kube.releases("default")[0].1, "superseded");
    assert!(kube.names("CustomResourceDefinition", None).len() > crds_160);
    assert!(kube
        .get("DaemonSet", Some(CHART_NS), "koord-device-daemon")
        .is_some());
}

/// What `load` ran before the fix, run by hand with real helm on a fresh cluster: release
/// namespace `koordinator-system` fails with 404 (helm's release record comes before the chart's
/// Namespace); with `--create-namespace` helm 3 fails on the chart's own Namespace object (helm 4,
/// which applies, gets through). Then `load` with today's choice installs on the same cluster
/// once the old release is uninstalled.
fn old_namespace_choice(major: u64) {
    let b = Built::new();
    let e = env();
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let registry = format!("{}/{}", e.plain, unique_prefix(&format!("oldns{major}")));
    let o = run(
        &b,
        &load_args(&b, &b.bundle, &registry, &kube, major, &["--no-install"]),
    );
    assert_ok(&o);
    let chart = format!("oci://{registry}/charts/koordinator");
    let old = [
        "upgrade",
        "--install",
        RELEASE,
        chart.as_str(),
        "--version",
        "1.8.0",
        "--plain-http",
        "--namespace",
        CHART_NS,
    ];
    let o = kube.helm(major, &old);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "the old command installed: {err}");
    assert!(
        err.contains(&format!("namespaces \"{CHART_NS}\" not found")),
        "{err}"
    );
    let mut with_create = old.to_vec();
    with_create.push("--create-namespace");
    let o = kube.helm(major, &with_create);
    let err = String::from_utf8_lossy(&o.stderr);
    if major == 3 {
        // helm 3 creates the namespace, then its POST of the chart's Namespace object is 409.
        assert!(!o.status.success(), "--create-namespace installed: {err}");
        assert!(
            err.contains(&format!("namespaces \"{CHART_NS}\" already exists")),
            "{err}"
        );
    } else {
        // helm 4 applies (server-side apply creates or takes over), so the chart's Namespace
        // object does not clash with the one helm just made: the old command with
        // --create-namespace works with helm 4 (both writes are helm's own field manager).
        assert!(o.status.success(), "{err}");
        assert_eq!(kube.releases(CHART_NS).len(), 1);
    }
    eprintln!("the cluster after the old commands: {}", kube.summary());
    // The old release (failed with helm 3) is removed as a user would.
    let o = kube.helm(major, &["uninstall", RELEASE, "-n", CHART_NS]);
    assert_ok(&o);
    kube.wait_namespaces_finalized();
    let o = run(&b, &load_args(&b, &b.bundle, &registry, &kube, major, &[]));
    assert_ok(&o);
    assert_installed(&kube, &registry, "1");
}

macro_rules! both_helms {
    ($($name:ident),* $(,)?) => {
        mod helm3 { $( #[test] fn $name() { super::$name(3) } )* }
        mod helm4 { $( #[test] fn $name() { super::$name(4) } )* }
    };
}
both_helms!(
    fresh,
    old_namespace_choice,
    guide_installed,
    release_in_other_namespace,
    unowned_namespace,
    ack,
    pending_install,
    upgrade_160_to_180,
    the_printed_helm_command_runs_again_after_the_load
);

/// Issue 32 item 4: the helm command a real `load` prints named files in a temporary folder
/// that the load deleted when it ended (the values, the post-renderer's configuration, helm 4's
/// plugin), so it could not be run again. They are kept now, named in the `values` line: the
/// command runs again as printed (a new revision of the release). A second load, an upgrade,
/// ends with `upgraded release`.
fn the_printed_helm_command_runs_again_after_the_load(major: u64) {
    let b = Built::new();
    let e = env();
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let registry = format!("{}/{}", e.plain, unique_prefix(&format!("again{major}")));
    let args = load_args(&b, &b.bundle, &registry, &kube, major, &["--json"]);
    let o = run(&b, &args);
    assert_ok(&o);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["helm"]["installed"], true, "{r}");
    let cmd = r["helm"]["command"].as_str().unwrap().to_string();
    let values = PathBuf::from(
        r["helm"]["valuesFile"]
            .as_str()
            .unwrap_or_else(|| panic!("no valuesFile kept for the printed command: {r}")),
    );
    let dir = values.parent().unwrap().to_path_buf();
    assert!(
        cmd.contains(&format!("--values {}", values.display())),
        "{cmd}"
    );
    // Every file of the kept folder the command names is there.
    for w in cmd.split([' ', '=', '\'']) {
        if w.starts_with(dir.to_str().unwrap()) {
            assert!(Path::new(w).exists(), "{w} (named by {cmd}) is gone");
        }
    }
    let again = std::process::Command::new("sh")
        .args(["-c", &cmd])
        .current_dir(b.home.path())
        .env("HOME", b.home.path())
        .output()
        .unwrap();
    assert_ok(&again);
    assert_installed(&kube, &registry, "2");
    // The plain-text form names the kept folder and says to delete it; an upgrade says so.
    let text: Vec<String> = args.iter().filter(|a| *a != "--json").cloned().collect();
    let o = run(&b, &text);
    assert_ok(&o);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    eprintln!("{out}");
    assert!(out.contains("values   ") && out.contains("rm -r"), "{out}");
    assert!(
        out.trim_end()
            .lines()
            .last()
            .unwrap()
            .starts_with("upgraded release koordinator in namespace default"),
        "{out}"
    );
    // The upgrade kept its files next to the bundle, in the same private folder; the
    // release's values (which may hold a site's secrets) are not written for a helm that takes
    // --reset-then-reuse-values (3.14+, both helms here).
    assert_eq!(
        dir,
        b.bundle
            .parent()
            .unwrap()
            .join("koord-bundle-helm-koordinator")
    );
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert_eq!(
        std::fs::metadata(&values).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(
        !dir.join("release-values.yaml").exists(),
        "the release's values were written for a helm that never reads them"
    );
    assert!(out.contains(&format!("rm -r {}", dir.display())), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dry_run_prints_the_exact_command_and_keeps_its_values_file() {
    let b = Built::new();
    let e = env();
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let prefix = unique_prefix("dry");
    let registry = format!("{}/{prefix}", e.tls);
    let h = &b.home;
    let auth = h.login_tls();
    let mut args = load_args(
        &b,
        &b.bundle,
        &registry,
        &kube,
        4,
        &[
            "--dry-run",
            "--json",
            "--ca-file",
            e.ca_file.to_str().unwrap(),
        ],
    );
    args.retain(|a| a != "--plain-http");
    let o = h
        .cmd(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .env("REGISTRY_AUTH_FILE", &auth)
        .output()
        .unwrap();
    assert_ok(&o);
    assert!(
        repos_under(&prefix).is_empty(),
        "--dry-run pushed something"
    );
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let cmd = r["helm"]["command"].as_str().unwrap();
    let values = PathBuf::from(r["helm"]["valuesFile"].as_str().unwrap());
    assert!(
        values.is_file(),
        "the values file is kept: {}",
        values.display()
    );
    let text = std::fs::read_to_string(&values).unwrap();
    assert!(
        text.contains(&format!("imageRepositoryHost: {registry}")),
        "{text}"
    );
    for needle in [
        format!("registry login {}", e.tls),
        "--password-stdin".to_string(),
        format!(
            "upgrade --install koordinator oci://{registry}/charts/koordinator --version 1.8.0"
        ),
        "--namespace default".to_string(),
        format!("--ca-file {}", e.ca_file.display()),
        "--registry-config".to_string(),
        format!("--values {}", values.display()),
        format!("--kubeconfig {}", kube.kubeconfig.display()),
    ] {
        assert!(cmd.contains(&needle), "{needle:?} not in {cmd}");
    }
    assert!(!cmd.contains(&e.password), "no password in the command");
    // The plain-text form names the file and says to delete it.
    let args2: Vec<String> = args.iter().filter(|a| *a != "--json").cloned().collect();
    let o = h
        .cmd(&args2.iter().map(String::as_str).collect::<Vec<_>>())
        .env("REGISTRY_AUTH_FILE", &auth)
        .output()
        .unwrap();
    assert_ok(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("values   ") && out.contains("delete it when done, rm -r"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(values.parent().unwrap());
    // Nothing was written to the cluster, by koord-bundle or by helm.
    assert!(
        kube.writes_of("koord-bundle/").is_empty(),
        "{:#?}",
        kube.request_lines()
    );
    assert!(
        kube.writes_of("Helm/").is_empty(),
        "{:#?}",
        kube.request_lines()
    );
}

/// On the FAKE API server: the real one refuses to proxy to a loopback node address
/// ("address not allowed"), so no kubelet `/configz` of ours can be reached through it.
#[test]
fn kind_default_cgroup_root_stops_before_any_push_with_the_guides_config() {
    let b = Built::new();
    let e = env();
    let kube = kube_fake::start(Opts {
        seed: &["kind", "kind-default-cgroup"],
        ..Default::default()
    });
    let prefix = unique_prefix("kindcg");
    let registry = format!("{}/{prefix}", e.plain);
    let o = run(
        &b,
        &load_args_with(&b, &b.bundle, &registry, &kube.kubeconfig, 4, &[]),
    );
    assert_fails(
        &o,
        1,
        &[
            "kind-control-plane (/kubelet)",
            "/host-cgroup/kubepods.slice",
            "cgroup-root: \"/\"",
            "kind: KubeletConfiguration",
            "cgroupRoot: /",
            "nothing was pushed",
        ],
    );
    assert!(repos_under(&prefix).is_empty());
    // Issue 42: a failed check is printed as an error (it was "warning: pre-flight Fail
    // [...]"); the warnings' form is asserted in day2 (a Warn and a Fail of the CRD checks).
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.lines()
            .any(|l| l
                .starts_with("error: pre-flight FAIL [platform] kind node(s) kind-control-plane")),
        "{err}"
    );
    assert!(
        !err.contains("warning: pre-flight FAIL") && !err.contains("pre-flight Fail"),
        "{err}"
    );
    assert!(kube
        .requests()
        .iter()
        .any(|r| r["path"] == "/api/v1/nodes/kind-control-plane/proxy/configz"));
}

#[test]
fn eks_with_calico_runs_koord_manager_on_the_host_network_or_fails_under_strict() {
    let b = Built::new();
    let e = env();
    let kube = cluster::lease();
    kube.seed_nodes("eks");
    let ds = |name: &str| {
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
               "metadata": {"name": name, "namespace": "kube-system"},
               "spec": {"selector": {"matchLabels": {"k8s-app": name}},
                        "template": {"metadata": {"labels": {"k8s-app": name}},
                                     "spec": {"containers": [{"name": name, "image": format!("example.invalid/{name}:v1")}]}}}})
    };
    kube.seed(json!([ds("calico-node"), ds("kube-proxy")]));
    let prefix = unique_prefix("eks");
    let registry = format!("{}/{prefix}", e.plain);
    let o = run(
        &b,
        &load_args(&b, &b.bundle, &registry, &kube, 4, &["--strict"]),
    );
    assert_fails(
        &o,
        1,
        &["calico-node", "--host-network", "nothing was pushed"],
    );
    assert!(repos_under(&prefix).is_empty());
    // Without --strict: said, and set.
    let o = run(&b, &load_args(&b, &b.bundle, &registry, &kube, 4, &[]));
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("setting manager.hostNetwork=true"), "{err}");
    let m = kube
        .get("Deployment", Some(CHART_NS), "koord-manager")
        .unwrap();
    assert_eq!(m["spec"]["template"]["spec"]["hostNetwork"], true);
}

#[test]
fn no_cluster_and_missing_helm_stop_before_any_push() {
    let e = env();
    let prefix = unique_prefix("nocluster");
    let registry = format!("{}/{prefix}", e.plain);
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    std::fs::write(&kc, format!("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://{closed}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: t\n")).unwrap();
    let b = Built::new();
    let o = b.home.run(&[
        "load",
        b.bundle.to_str().unwrap(),
        "--registry",
        &registry,
        "--plain-http",
        "--kubeconfig",
        kc.to_str().unwrap(),
        "--helm",
        e.helm4.to_str().unwrap(),
    ]);
    // Unreachable: exit 3 (a retry, or whoever runs the cluster, may help).
    assert_fails(
        &o,
        3,
        &["no cluster reachable", &closed.to_string(), "--no-install"],
    );
    assert!(repos_under(&prefix).is_empty());
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let mut args = load_args(&b, &b.bundle, &registry, &kube, 4, &[]);
    let i = args.iter().position(|a| a == "--helm").unwrap();
    args[i + 1] = "/nonexistent/helm".into();
    assert_fails(&run(&b, &args), 1, &["helm", "nothing was pushed"]);
    assert!(repos_under(&prefix).is_empty());
}

/// Requests of koord-bundle and helm that the API server refused (401, 403).
fn refused(kube: &Cluster) -> Vec<String> {
    kube.requests()
        .iter()
        .filter(|r| {
            let agent = r["userAgent"].as_str().unwrap_or("");
            (agent.starts_with("Helm/") || agent.starts_with("koord-bundle/"))
                && matches!(r["responseStatus"]["code"].as_u64(), Some(401 | 403))
        })
        .map(cluster::request_line)
        .collect()
}

#[test]
fn exec_plugin_kubeconfig_over_tls_installs_with_helm_running_the_plugin_itself() {
    let b = Built::new();
    // The API server takes the admin's static token; only the plugin script hands it out.
    // koord-bundle's pre-flight runs the plugin, and so does helm on its own (it gets the
    // kubeconfig).
    let e = env();
    for major in [3, 4] {
        let kube = cluster::lease();
        kube.seed_nodes("kubeadm");
        let (kubeconfig, runs, _) = kube.exec_kubeconfig("client.authentication.k8s.io/v1");
        let registry = format!("{}/{}", e.plain, unique_prefix(&format!("exec{major}")));
        let args = load_args_with(&b, &b.bundle, &registry, &kubeconfig, major, &[]);
        let o = run(&b, &args);
        assert_ok(&o);
        assert_installed(&kube, &registry, "1");
        assert!(refused(&kube).is_empty(), "{:#?}", refused(&kube));
        let helm_as_admin = kube
            .requests_of("Helm/")
            .iter()
            .filter(|r| r["user"]["username"] == "koord-test-admin")
            .count();
        assert!(helm_as_admin > 0, "{:#?}", kube.request_lines());
        let n = std::fs::read_to_string(&runs).unwrap().lines().count();
        assert!(
            n >= 2,
            "the pre-flight and helm both ran the plugin ({n} runs)"
        );
        let token = kube.cp.tokens["admin"].as_str().unwrap();
        assert!(!String::from_utf8_lossy(&o.stderr).contains(token));
    }
}

#[test]
fn a_registry_that_stores_another_manifest_stops_the_load_before_helm() {
    // A registry that changes a manifest on its way in (some convert formats) must not get an
    // install: the digest it answers with is checked against the bundle's.
    let b = Built::new();
    let e = env();
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let proxy =
        crate::fault_proxy::start(&e.plain, crate::fault_proxy::Mode::RewriteTaggedManifests);
    let registry = format!("{}/{}", proxy.addr, unique_prefix("rewritten"));
    let o = run(&b, &load_args(&b, &b.bundle, &registry, &kube, 4, &[]));
    assert_fails(&o, 1, &["expected sha256:", "refused"]);
    assert!(
        proxy
            .counts
            .rewritten
            .load(std::sync::atomic::Ordering::SeqCst)
            > 0
    );
    assert!(kube.releases("default").is_empty());
    assert!(kube.names("CustomResourceDefinition", None).is_empty());
}

/// Issue 17's case: a.yaml holds the cluster and the user, b.yaml the context and
/// `current-context`, and `KUBECONFIG=a.yaml:b.yaml`, no `--kubeconfig`. The pre-flight reads
/// the merged context (it used to read a.yaml alone and stop: "no current-context is set"), and
/// helm gets the same list in its environment and the same context (`--kube-context`): the dry
/// run prints both, and the real install with helm 3 and 4 reaches the API server as the
/// token's user.
#[test]
fn a_kubeconfig_list_is_merged_for_the_preflight_and_given_whole_to_helm() {
    let b = Built::new();
    let e = env();
    for major in [3, 4] {
        let kube = cluster::lease();
        kube.seed_nodes("kubeadm");
        let token = kube.cp.tokens["admin"].as_str().unwrap().to_string();
        let kc = cluster::kubeconfig_json(&kube.cp, "list-user", json!({"token": token}));
        let dir = kube.dir.path();
        let mut cluster = kc["clusters"][0].clone();
        cluster["name"] = "stub".into();
        let a = dir.join("a.yaml");
        std::fs::write(
            &a,
            json!({"apiVersion": "v1", "kind": "Config", "clusters": [cluster], "users": kc["users"]})
                .to_string(),
        )
        .unwrap();
        let bb = dir.join("b.yaml");
        std::fs::write(
            &bb,
            json!({"apiVersion": "v1", "kind": "Config", "current-context": "stub",
                   "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "list-user"}}]})
                .to_string(),
        )
        .unwrap();
        let list = std::env::join_paths([&a, &bb]).unwrap();
        let registry = format!("{}/{}", e.plain, unique_prefix(&format!("kclist{major}")));
        let mut args = load_args(&b, &b.bundle, &registry, &kube, major, &[]);
        let i = args.iter().position(|a| a == "--kubeconfig").unwrap();
        args.drain(i..i + 2);
        let run_with = |extra: &[&str]| {
            let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
            all.extend(extra);
            b.home.cmd(&all).env("KUBECONFIG", &list).output().unwrap()
        };
        let o = run_with(&["--dry-run", "--json"]);
        assert_ok(&o);
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        let cmd = r["helm"]["command"].as_str().unwrap();
        assert!(
            cmd.starts_with(&format!("KUBECONFIG={}:{} ", a.display(), bb.display())),
            "{cmd}"
        );
        assert!(cmd.contains("--kube-context stub"), "{cmd}");
        assert!(!cmd.contains("--kubeconfig"), "{cmd}");
        assert!(
            r["preflight"]["findings"].as_array().unwrap().len() > 3,
            "{r}"
        );
        let o = run_with(&[]);
        assert_ok(&o);
        assert_installed(&kube, &registry, "1");
        assert!(refused(&kube).is_empty(), "{:#?}", refused(&kube));
        for agent in ["Helm/", "koord-bundle/"] {
            let reqs = kube.requests_of(agent);
            assert!(!reqs.is_empty(), "no request of {agent}");
            assert!(
                reqs.iter()
                    .all(|r| r["user"]["username"] == "koord-test-admin"),
                "{:#?}",
                kube.request_lines()
            );
        }
    }
}

/// Issue 21: a dry run fails where the real run would, before anything is pushed. helm 3
/// speaks plain HTTP to a registry on a loopback address, so it cannot install from the TLS
/// registry on 127.0.0.1: both runs stop before the push, exit 1, saying so and what to use.
#[test]
fn helm3_and_a_tls_loopback_registry_stop_before_the_push_in_both_runs() {
    let b = Built::new();
    let e = env();
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let prefix = unique_prefix("h3loop");
    let registry = format!("{}/{prefix}", e.tls);
    let auth = b.home.login_tls();
    let mut args = load_args(
        &b,
        &b.bundle,
        &registry,
        &kube,
        3,
        &["--ca-file", e.ca_file.to_str().unwrap()],
    );
    args.retain(|a| a != "--plain-http");
    for extra in [&["--dry-run"][..], &[][..]] {
        let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
        all.extend(extra);
        let o = b
            .home
            .cmd(&all)
            .env("REGISTRY_AUTH_FILE", &auth)
            .output()
            .unwrap();
        assert_fails(
            &o,
            1,
            &[
                "helm 3.17.3 cannot install the chart",
                "use helm 4",
                "nothing was pushed",
            ],
        );
    }
    assert!(repos_under(&prefix).is_empty());
    assert!(
        kube.requests_of("koord-bundle/").is_empty(),
        "not even the pre-flight ran"
    );
}

/// Issue 21: with `--no-install` a dry run needs no helm and no cluster, and does not suggest
/// `--no-install`; an exec plugin that fails stops a dry run of an install as it stops the
/// real run (exit 1, nothing pushed), where the dry run used to skip the pre-flight and exit 0.
#[test]
fn dry_runs_are_truthful_about_helm_and_the_preflight() {
    let b = Built::new();
    let e = env();
    let prefix = unique_prefix("truthful");
    let registry = format!("{}/{prefix}", e.plain);
    let o = b.home.run(&[
        "load",
        b.bundle.to_str().unwrap(),
        "--registry",
        &registry,
        "--plain-http",
        "--no-install",
        "--dry-run",
        "--helm",
        "/nonexistent/helm",
        "--kubeconfig",
        "/nonexistent/kubeconfig",
    ]);
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.contains("or run with --no-install") && !err.contains("pass --no-install"),
        "{err}"
    );
    assert!(err.contains("pre-flight not run: --no-install"), "{err}");

    let kube = cluster::lease();
    let (kubeconfig, _, _) = kube.exec_kubeconfig("client.authentication.k8s.io/v1");
    // The plugin exits 3: its PLUGIN_TOKEN is renamed away.
    let text = std::fs::read_to_string(&kubeconfig)
        .unwrap()
        .replace("PLUGIN_TOKEN", "OTHER");
    std::fs::write(&kubeconfig, text).unwrap();
    let mut args = load_args(&b, &b.bundle, &registry, &kube, 4, &[]);
    let i = args.iter().position(|a| a == "--kubeconfig").unwrap();
    args[i + 1] = kubeconfig.to_string_lossy().into();
    for extra in [&["--dry-run"][..], &[][..]] {
        let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
        all.extend(extra);
        assert_fails(
            &b.home.run(&all),
            1,
            &[
                "exec credential plugin",
                "it failed (exit status: 3)",
                "nothing was pushed",
            ],
        );
    }
    assert!(repos_under(&prefix).is_empty());
}

/// Ctrl-C while helm installs or upgrades: the message names what undoes it, with the helm the
/// load used, its kubeconfig and the revision. An interrupted first install names `helm
/// uninstall`; an interrupted upgrade names `helm rollback RELEASE 1`, the revision deployed
/// before, and that command runs as printed. (Before: "run the same command again", which then
/// failed asking for a rollback, without its revision or its helm.)
#[test]
fn an_interrupted_helm_step_names_what_undoes_it() {
    let b = Built::new();
    let e = env();
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let registry = format!("{}/{}", e.plain, unique_prefix("undo"));
    // helm, but the real install or upgrade (not its dry runs, not `version`) waits forever,
    // after leaving a mark: the load is interrupted while "helm runs".
    let real = cluster::helm_of(3);
    let mark = b.home.path().join("helm-started");
    let slow = b.home.path().join("slow-helm");
    std::fs::write(
        &slow,
        format!(
            "#!/bin/sh\ncase \" $* \" in\n  *' upgrade '*' --dry-run'*) ;;\n  *' upgrade '*) : > '{}'; exec sleep 600;;\nesac\nexec '{}' \"$@\"\n",
            mark.display(),
            real.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
    let interrupted = |what: &str| -> String {
        let _ = std::fs::remove_file(&mark);
        let mut args = load_args(&b, &b.bundle, &registry, &kube, 3, &[]);
        let at = args.iter().position(|a| a == "--helm").unwrap();
        args[at + 1] = slow.to_string_lossy().into_owned();
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let child = b
            .home
            .cmd(&a)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        wait_for(what, std::time::Duration::from_secs(240), || {
            if mark.exists() {
                Ok(())
            } else {
                Err("helm's real run has not started".into())
            }
        });
        // SAFETY: kill(2) on the child's pid, which has not been waited for yet.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert_eq!(o.status.code(), Some(130), "{what}: {err}");
        assert!(err.contains("interrupted (SIGINT)"), "{what}: {err}");
        err.split_whitespace().collect::<Vec<_>>().join(" ")
    };
    let kubeconfig = kube.kubeconfig.display().to_string();
    // 1. The first install, interrupted: uninstall.
    let err = interrupted("the interrupted install");
    let undo = format!(
        "{} uninstall koordinator --namespace default --kubeconfig {kubeconfig}",
        slow.display()
    );
    assert!(err.contains(&undo), "{undo}\nnot in: {err}");
    // 2. Installed for real (revision 1); the upgrade, interrupted: roll back to 1.
    let o = run(&b, &load_args(&b, &b.bundle, &registry, &kube, 3, &[]));
    assert_ok(&o);
    let err = interrupted("the interrupted upgrade");
    let undo = format!(
        "{} rollback koordinator 1 --namespace default --kubeconfig {kubeconfig}",
        slow.display()
    );
    assert!(
        err.contains(&format!(
            "roll the release back to revision 1, the one deployed before: {undo}"
        )),
        "{undo}\nnot in: {err}"
    );
    // The command runs as printed (the slow helm passes a rollback to the real one).
    let again = std::process::Command::new("sh")
        .args(["-c", &undo])
        .output()
        .unwrap();
    assert_ok(&again);
    let releases = kube.releases("default");
    assert!(
        releases
            .iter()
            .any(|(n, s, r)| n == "koordinator" && s == "deployed" && r == "2"),
        "the rollback made no revision 2: {releases:?}"
    );
}
