//! `load` with the cluster side: the pre-flight against the Kubernetes API stub (real-format
//! responses shaped like kind, EKS, ACK and an old cluster; no API server can be had here), the
//! helm command, the chart rendered by real helm, and a full `load` whose `helm upgrade
//! --install` runs real helm 4 with an in-memory release store (HELM_DRIVER=memory: helm's own
//! fake Kubernetes client), since there is no cluster to install into.

use crate::common::*;
use crate::kube_stub;
use crate::load::{built, repos_under, unique_prefix};
use serde_json::Value;
use std::path::Path;

fn load_args<'a>(
    registry: &'a str,
    kubeconfig: &'a Path,
    helm: &'a Path,
    extra: &[&'a str],
) -> Vec<String> {
    let b = built();
    let mut v: Vec<String> = vec![
        "load".into(),
        b.bundle.to_string_lossy().into(),
        "--registry".into(),
        registry.into(),
        "--plain-http".into(),
        "--key".into(),
        b.home.pubkey().to_string_lossy().into(),
        "--kubeconfig".into(),
        kubeconfig.to_string_lossy().into(),
        "--helm".into(),
        helm.to_string_lossy().into(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn run(args: &[String]) -> std::process::Output {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    built().home.run(&a)
}

fn bundled_images(registry: &str) -> Vec<String> {
    let mut v: Vec<String> = [
        "koord-descheduler",
        "koord-device-daemon",
        "koord-manager",
        "koord-scheduler",
        "koordlet",
    ]
    .iter()
    .map(|c| format!("{registry}/koordinator-sh/{c}:v1.8.0"))
    .collect();
    v.sort();
    v
}

#[test]
fn dry_run_against_a_kind_shaped_cluster_pushes_nothing_and_renders_with_helm_3_and_4() {
    let stub = kube_stub::start("kind");
    let e = env();
    for helm in [&e.helm3, &e.helm4] {
        let prefix = unique_prefix("dry");
        let registry = format!("{}/{prefix}", e.plain);
        let o = run(&load_args(
            &registry,
            &stub.kubeconfig,
            helm,
            &[
                "--dry-run",
                "--json",
                "--feature-gates",
                "PodMutatingWebhook=false",
            ],
        ));
        assert_ok(&o);
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(
            repos_under(&prefix).is_empty(),
            "--dry-run pushed something"
        );
        assert_eq!(r["dryRun"], true);
        assert!(
            r["push"]["uploaded"].as_u64().unwrap() > 0,
            "the plan lists what would be pushed"
        );
        assert_eq!(
            r["preflight"]["serverVersion"]
                .as_str()
                .map(|v| v.starts_with("v1.29")),
            Some(true),
            "{}",
            r["preflight"]
        );
        let cmd = r["helm"]["command"].as_str().unwrap();
        assert!(cmd.contains("upgrade --install koordinator"), "{cmd}");
        assert!(cmd.contains("--namespace koordinator-system"), "{cmd}");
        let mut rendered: Vec<String> = r["helm"]["renderedImages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        rendered.sort();
        assert_eq!(
            rendered,
            bundled_images(&registry),
            "every rendered image is a bundled image under the target"
        );
        let values = r["helm"]["values"].as_str().unwrap();
        assert!(
            values.contains(&format!("imageRepositoryHost: {registry}")),
            "{values}"
        );
        assert!(values.contains("PodMutatingWebhook=false"), "{values}");
    }
}

#[test]
fn ack_shaped_cluster_conflicting_crds_are_switched_off_or_named_under_strict() {
    let stub = kube_stub::start("ack");
    let e = env();
    let prefix = unique_prefix("ack");
    let registry = format!("{}/{prefix}", e.plain);
    let o = run(&load_args(
        &registry,
        &stub.kubeconfig,
        &e.helm4,
        &["--dry-run", "--json"],
    ));
    assert_ok(&o);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let off: Vec<&str> = r["preflight"]["crdValuesOff"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(off.len(), 5, "{off:?}");
    let values = r["helm"]["values"].as_str().unwrap();
    for k in [
        "reservations",
        "elasticquotas",
        "podgroups",
        "nodemetrics",
        "nodeslos",
    ] {
        assert!(
            values.contains(&format!("{k}: false")),
            "{k} not switched off:\n{values}"
        );
    }
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("1.22"), "ACK 1.22 warns: {err}");
    // Not a dry run: the namespace without Helm ownership stops the load before any push.
    let o = run(&load_args(&registry, &stub.kubeconfig, &e.helm4, &[]));
    assert_fails(
        &o,
        1,
        &[
            "pre-flight",
            "nothing was pushed",
            "kubectl label namespace koordinator-system",
        ],
    );
    assert!(repos_under(&prefix).is_empty());
    // --strict: the conflicting CRDs are a failure naming the exact flag.
    let o = run(&load_args(
        &registry,
        &stub.kubeconfig,
        &e.helm4,
        &["--strict"],
    ));
    assert_fails(
        &o,
        1,
        &["--skip-crds reservations,elasticquotas,podgroups,nodemetrics,nodeslos"],
    );
    assert!(repos_under(&prefix).is_empty());
}

#[test]
fn old_cluster_and_missing_arch_and_no_cluster_stop_before_any_push() {
    let e = env();
    let old = kube_stub::start("old");
    let prefix = unique_prefix("old");
    let registry = format!("{}/{prefix}", e.plain);
    let o = run(&load_args(&registry, &old.kubeconfig, &e.helm4, &[]));
    assert_fails(&o, 1, &["1.18", "nothing was pushed"]);
    assert!(repos_under(&prefix).is_empty());

    // An arm64 node and an amd64-only bundle.
    let h = Home::with_key();
    let (amd64, _) = h.build_plain("1.8.0", &["--platform", "linux/amd64"]);
    let eks = kube_stub::start("eks");
    let o = h.run(&[
        "load",
        amd64.to_str().unwrap(),
        "--registry",
        &registry,
        "--plain-http",
        "--kubeconfig",
        eks.kubeconfig.to_str().unwrap(),
        "--helm",
        e.helm4.to_str().unwrap(),
    ]);
    assert_fails(&o, 1, &["arm64", "--platform", "nothing was pushed"]);
    assert!(repos_under(&prefix).is_empty());

    // No cluster reachable: stop, unless --no-install.
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    std::fs::write(&kc, format!("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{closed}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: t\n")).unwrap();
    let o = run(&load_args(&registry, &kc, &e.helm4, &[]));
    assert_fails(
        &o,
        1,
        &["no cluster reachable", &closed.to_string(), "--no-install"],
    );
    assert!(repos_under(&prefix).is_empty());

    // A missing helm: a clear error before anything is pushed.
    let kind = kube_stub::start("kind");
    let o = run(&load_args(
        &registry,
        &kind.kubeconfig,
        Path::new("/nonexistent/helm"),
        &[],
    ));
    assert_fails(&o, 1, &["helm", "nothing was pushed"]);
    assert!(repos_under(&prefix).is_empty());
}

#[test]
fn full_load_pushes_then_installs_from_the_private_registry_with_real_helm_4() {
    let e = env();
    let stub = kube_stub::start("kind");
    stub.allow_anonymous();
    let dir = tempfile::tempdir().unwrap();
    let real = koord_bundle::helm::Helm::find(Some(&e.helm4)).unwrap();
    let helm = crate::helm::memory_driver_helm(&real, dir.path()).path;
    let prefix = unique_prefix("install");
    let registry = format!("{}/{prefix}", e.plain);
    let o = run(&load_args(
        &registry,
        &stub.kubeconfig,
        &helm,
        &[
            "--json",
            "--host-network",
            "--image-pull-secret",
            "regcred",
            "--skip-crds",
            "reservations",
        ],
    ));
    assert_ok(&o);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["helm"]["installed"], true);
    assert_eq!(repos_under(&prefix).len(), 6);
    let cmd = r["helm"]["command"].as_str().unwrap();
    assert!(
        cmd.contains(&format!("oci://{registry}/charts/koordinator")),
        "installs from the private registry: {cmd}"
    );
    assert!(cmd.contains("--version 1.8.0"), "{cmd}");
    let values = r["helm"]["values"].as_str().unwrap();
    assert!(
        values.contains("hostNetwork: true")
            && values.contains("regcred")
            && values.contains("reservations: false"),
        "{values}"
    );
    // Helm's own report: the release was deployed (into helm's in-memory store and fake client).
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("STATUS: deployed"), "{err}");
    assert!(
        err.contains("NAME: koordinator") && err.contains("NAMESPACE: koordinator-system"),
        "{err}"
    );
}
