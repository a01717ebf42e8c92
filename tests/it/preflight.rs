//! Preflight end to end through the library, against the REAL control plane of the test
//! environment (`cluster`: kube-apiserver v1.36 with RBAC and static-token users), with nodes
//! and CRDs shaped on EKS, ACK and kind (`tests/fixtures/kube/`) created in it.
//!
//! Three tests use the FAKE API server (`kube_fake`) for answers a real one cannot be made to
//! give here: an old server version (`old_cluster_is_refused`), a plain-HTTP server
//! (`no_token_over_plain_http`), and a kind node's kubelet `/configz` through the node proxy
//! (`kind_fresh_cluster_passes`: the API server refuses to proxy to a loopback node address).

use crate::cluster::{self as real, Cluster};
use crate::kube_fake::{self, KubeFake, Opts};
use koord_bundle::chart::{extract_crds, ChartArchive};
use koord_bundle::cluster::{
    self, preflight, ChartCrd, ClusterError, KubeClient, Level, PreflightInput, PreflightReport,
};
use serde_json::json;
use std::path::{Path, PathBuf};

const NS: &str = "koordinator-system";
const TOKEN: &str = "fake-token-0123456789abcdef";
const RELEASE: &str = "koordinator";

/// A fake API server over HTTPS that wants `TOKEN`, seeded from one fixture directory.
fn start(cluster: &str) -> KubeFake {
    kube_fake::start(Opts {
        seed: &[cluster],
        tls: true,
        token: Some(TOKEN),
        ..Default::default()
    })
}

/// The 1.8.0 chart's CRDs as `load` hands them to the pre-flight: extracted from the archive in
/// tests/fixtures/charts by the library (as `build` does), in `<group>_<plural>.yaml` order.
fn chart_180_crds() -> Vec<ChartCrd> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/charts/koordinator-1.8.0.tgz");
    let archive = ChartArchive::from_tgz(&std::fs::read(&path).expect("chart archive"))
        .expect("the 1.8.0 chart reads");
    let mut crds = extract_crds(&archive).expect("its CRDs");
    crds.sort_by(|a, b| a.file_name.cmp(&b.file_name));
    crds.into_iter()
        .map(|c| ChartCrd {
            name: c.name,
            plural: c.plural,
            values_key: c.values_key,
        })
        .collect()
}

fn platforms(p: &[&str]) -> Vec<String> {
    p.iter().map(|s| s.to_string()).collect()
}

/// The pre-flight's input as `load` builds it for a release `koordinator` in `default`.
fn input_for<'a>(
    platforms: &'a [String],
    crds: &'a [ChartCrd],
    strict: bool,
) -> PreflightInput<'a> {
    PreflightInput {
        bundle_platforms: platforms,
        crds,
        namespace: "default",
        namespace_explicit: false,
        chart_namespace: NS,
        release: RELEASE,
        strict,
        host_network: false,
        chart_version: "1.8.0",
        allow_downgrade: false,
    }
}

/// The pre-flight through the kubeconfig at `kubeconfig`.
async fn run_with(
    kubeconfig: &Path,
    platforms: &[String],
    crds: &[ChartCrd],
    strict: bool,
) -> PreflightReport {
    let cfg = cluster::kubeconfig::load(kubeconfig, None).expect("the kubeconfig loads");
    let client = KubeClient::new(&cfg).expect("client");
    preflight(&client, &input_for(platforms, crds, strict))
        .await
        .expect("preflight runs")
}

/// The pre-flight against the fake.
async fn run(
    stub: &KubeFake,
    platforms: &[String],
    crds: &[ChartCrd],
    strict: bool,
) -> PreflightReport {
    run_with(&stub.kubeconfig, platforms, crds, strict).await
}

fn of<'a>(r: &'a PreflightReport, check: &str) -> Vec<&'a koord_bundle::cluster::Finding> {
    r.findings.iter().filter(|f| f.check == check).collect()
}

#[test]
fn chart_180_has_thirteen_switchable_crds() {
    let crds = chart_180_crds();
    assert_eq!(crds.len(), 13, "{crds:?}");
    assert!(
        crds.iter()
            .all(|c| c.values_key.as_deref() == Some(c.plural.as_str())),
        "{crds:?}"
    );
    for n in [
        "reservations.scheduling.koordinator.sh",
        "nodemetrics.slo.koordinator.sh",
        "nodeslos.slo.koordinator.sh",
        "elasticquotas.scheduling.sigs.k8s.io",
        "podgroups.scheduling.sigs.k8s.io",
    ] {
        assert!(crds.iter().any(|c| c.name == n), "{n} missing");
    }
}

/// On the FAKE API server: a kind node's kubelet `/configz` cannot be reached through a real
/// API server here (it refuses to proxy to a loopback node address).
#[tokio::test]
async fn kind_fresh_cluster_passes() {
    let stub = start("kind");
    let crds = chart_180_crds();
    let r = run(&stub, &platforms(&["linux/amd64"]), &crds, false).await;
    assert!(!r.failed(), "{:#?}", r.findings);
    assert_eq!(r.server_version, "v1.29.2");
    assert_eq!(r.nodes.len(), 1);
    let n = &r.nodes[0];
    assert_eq!(
        (n.name.as_str(), n.arch.as_str(), n.os.as_str()),
        ("kind-control-plane", "amd64", "linux")
    );
    assert_eq!(n.container_runtime, "containerd://1.7.13");
    assert!(
        r.findings.iter().all(|f| f.level == Level::Info),
        "{:#?}",
        r.findings
    );
    assert!(of(&r, "containerd")[0]
        .message
        .contains("NRI mode available"));
    assert!(of(&r, "namespace")
        .iter()
        .any(|f| f.message.contains("does not exist yet")));
    assert!(of(&r, "release")[0].message.contains("fresh install"));
    assert!(of(&r, "crd-ownership").is_empty(), "{:#?}", r.findings);
    assert!(of(&r, "kernel").is_empty());
    assert!(r.crd_values_off.is_empty());
    assert!(r.existing_release.is_none());
    // Every request carried the token (over TLS); the release lookup used Helm's labels.
    let reqs = stub.requests();
    assert!(reqs.iter().all(|r| r["authorized"] == true), "{reqs:?}");
    let seen: Vec<String> = reqs
        .iter()
        .map(|r| {
            format!(
                "{} {}?{}",
                r["method"].as_str().unwrap(),
                r["path"].as_str().unwrap(),
                r["query"].as_str().unwrap()
            )
        })
        .collect();
    assert!(
        seen.contains(&format!(
            "GET /api/v1/namespaces/default/secrets?labelSelector=owner%3Dhelm%2Cname%3D{RELEASE}&limit=50"
        )),
        "{seen:?}"
    );
    assert!(seen.contains(&"GET /api/v1/nodes?limit=500".to_string()));
    assert!(seen.contains(&"GET /api/v1/nodes/kind-control-plane/proxy/configz?".to_string()));
}

#[tokio::test]
async fn eks_arm64_nodes_fail_then_pass_and_existing_release_is_found() {
    let kube = real::lease();
    kube.seed_nodes("eks");
    // Chart 1.6.0 installed by hand into koordinator-system (helm 4 applies its Namespace over
    // the one --create-namespace made), then upgraded once: revision 2.
    let chart = crate::common::fixtures().join("koordinator-1.6.0.tgz");
    for verb in ["install", "upgrade"] {
        let mut args = vec![verb, RELEASE, chart.to_str().unwrap(), "-n", NS];
        if verb == "install" {
            args.push("--create-namespace");
        }
        crate::common::assert_ok(&kube.helm(4, &args));
    }
    let crds = chart_180_crds();

    let r = run_with(&kube.kubeconfig, &platforms(&["linux/amd64"]), &crds, false).await;
    assert!(r.failed());
    let arch = of(&r, "node-arch");
    assert_eq!(arch.len(), 1);
    assert_eq!(arch[0].level, Level::Fail);
    assert!(
        arch[0]
            .message
            .contains("linux/arm64 on 1 node(s): ip-192-168-5-87.eu-west-1.compute.internal"),
        "{}",
        arch[0].message
    );
    assert!(
        arch[0].message.contains("holds linux/amd64 only"),
        "{}",
        arch[0].message
    );
    assert_eq!(
        arch[0].fix.as_deref(),
        Some("rebuild the bundle with --platform linux/amd64,linux/arm64")
    );

    let r = run_with(
        &kube.kubeconfig,
        &platforms(&["linux/amd64", "linux/arm64"]),
        &crds,
        false,
    )
    .await;
    assert!(!r.failed(), "{:#?}", r.findings);
    assert_eq!(r.server_version, kube.cp.version);
    assert_eq!(of(&r, "server-version")[0].level, Level::Info);
    assert_eq!(r.nodes.len(), 3);
    assert!(r
        .nodes
        .iter()
        .all(|n| n.kernel.starts_with("5.10.") && n.container_runtime == "containerd://1.7.22"));
    assert!(of(&r, "containerd")[0].message.contains("3 node(s)"));
    // Upgrade of revision 2 (chart 1.6.0): its CRDs are this release's, 1.8.0's new ones absent.
    let rel = r.existing_release.as_ref().expect("existing release");
    assert_eq!(
        (
            rel.name.as_str(),
            rel.namespace.as_str(),
            rel.revision,
            rel.status.as_str()
        ),
        (RELEASE, NS, 2, "deployed")
    );
    assert_eq!(rel.chart_version.as_deref(), Some("1.6.0"));
    // Installed into koordinator-system before: found there and upgraded there.
    let rel_f = of(&r, "release");
    assert!(
        rel_f[0].message.contains(
            "already exists in namespace koordinator-system (not in default): it is upgraded there"
        ),
        "{rel_f:#?}"
    );
    assert!(
        rel_f[1]
            .message
            .contains("revision 2, chart 1.6.0 is deployed in koordinator-system: this is an upgrade to chart 1.8.0"),
        "{rel_f:#?}"
    );
    assert_eq!(r.release_namespace, NS);
    let crd = of(&r, "crd-ownership");
    assert!(crd.iter().all(|f| f.level == Level::Info), "{crd:#?}");
    assert!(crd.iter().any(|f| f
        .message
        .contains("11 of 13 chart CRD(s) are already managed by release")));
    assert!(crd.iter().any(|f| f
        .message
        .contains("2 chart CRD(s) are not in the cluster yet")
        && f.message
            .contains("clusternetworktopologies.scheduling.koordinator.sh")
        && f.message
            .contains("scheduleexplanations.scheduling.koordinator.sh")));
    assert!(r.crd_values_off.is_empty());
    assert_eq!(of(&r, "namespace")[0].level, Level::Info);
}

/// ACK's nodes, the five CRDs ack-koordinator installs (no Helm labels) and its namespace, as
/// `kubectl create namespace` leaves it.
fn ack(kube: &Cluster) {
    kube.seed_nodes("ack");
    kube.seed_crds("ack");
    kube.kubectl(&["create", "namespace", NS]);
}

#[tokio::test]
async fn ack_unowned_crds_are_switched_off_and_namespace_needs_adoption() {
    let kube = real::lease();
    ack(&kube);
    let crds = chart_180_crds();
    let r = run_with(
        &kube.kubeconfig,
        &platforms(&["linux/amd64", "linux/arm64"]),
        &crds,
        false,
    )
    .await;

    // The five CRDs ack-koordinator installed, in chart order.
    assert_eq!(
        r.crd_values_off,
        [
            "crds.reservations",
            "crds.elasticquotas",
            "crds.podgroups",
            "crds.nodemetrics",
            "crds.nodeslos"
        ]
    );
    let crd = of(&r, "crd-ownership");
    let warns: Vec<_> = crd.iter().filter(|f| f.level == Level::Warn).collect();
    assert_eq!(warns.len(), 5, "{crd:#?}");
    assert!(warns.iter().any(
        |f| f.message.contains("reservations.scheduling.koordinator.sh")
            && f.message.contains("crds.reservations=false")
    ));
    assert!(crd.iter().all(|f| f.level != Level::Fail));

    // The namespace exists without Helm's labels: Fail, with the commands that adopt it.
    let ns: Vec<_> = of(&r, "namespace")
        .into_iter()
        .filter(|f| f.level == Level::Fail)
        .collect();
    assert_eq!(ns.len(), 1, "{ns:#?}");
    assert_eq!(
        ns[0].fix.as_deref(),
        Some("kubectl label namespace koordinator-system app.kubernetes.io/managed-by=Helm && kubectl annotate namespace koordinator-system meta.helm.sh/release-name=koordinator meta.helm.sh/release-namespace=default")
    );
    assert!(r.failed());

    // containerd 1.6 on Alibaba Cloud Linux 3 (kernel 5.10): no NRI, no kernel warning.
    let rt = of(&r, "containerd");
    assert!(rt.iter().all(|f| f.level == Level::Info));
    assert!(
        rt[0].message.contains("containerd://1.6.20")
            && rt[0].message.contains("NRI mode not available"),
        "{}",
        rt[0].message
    );
    assert!(of(&r, "kernel").is_empty());
    assert!(r.existing_release.is_none());

    // The JSON form, as --json prints it.
    let j = serde_json::to_value(&r).unwrap();
    assert_eq!(j["crdValuesOff"].as_array().unwrap().len(), 5);
    assert_eq!(j["findings"][0]["check"], "server-version");
    assert_eq!(j["findings"][0]["level"], "info");
}

#[tokio::test]
async fn ack_strict_fails_naming_skip_crds_with_the_five_plurals() {
    let kube = real::lease();
    ack(&kube);
    let crds = chart_180_crds();
    let r = run_with(&kube.kubeconfig, &platforms(&["linux/amd64"]), &crds, true).await;
    assert!(r.failed());
    assert!(r.crd_values_off.is_empty());
    let fails: Vec<_> = of(&r, "crd-ownership")
        .into_iter()
        .filter(|f| f.level == Level::Fail)
        .collect();
    assert_eq!(fails.len(), 1, "{fails:#?}");
    assert_eq!(
        fails[0].fix.as_deref(),
        Some("--skip-crds reservations,elasticquotas,podgroups,nodemetrics,nodeslos")
    );
    assert!(
        fails[0].message.contains("5 chart CRD(s)") && fails[0].message.contains("ACK"),
        "{}",
        fails[0].message
    );
}

/// On the FAKE API server: a real one cannot be made to report v1.16.
#[tokio::test]
async fn old_cluster_is_refused() {
    let stub = start("old");
    let crds = chart_180_crds();
    let r = run(&stub, &platforms(&["linux/amd64"]), &crds, false).await;
    assert!(r.failed());
    assert_eq!(r.server_version, "v1.16.15");
    let v = of(&r, "server-version");
    assert_eq!(v[0].level, Level::Fail);
    assert!(
        v[0].message
            .contains("Koordinator needs Kubernetes 1.18 or newer"),
        "{}",
        v[0].message
    );
    let k = of(&r, "kernel");
    assert_eq!(k[0].level, Level::Warn);
    assert!(
        k[0].message.contains("3.10.0-1160.el7.x86_64"),
        "{}",
        k[0].message
    );
    assert!(of(&r, "containerd")
        .iter()
        .all(|f| f.message.contains("docker://")));
}

#[tokio::test]
async fn wrong_token_is_401_naming_user_and_resource() {
    let kube = real::lease();
    let path = kube.token_kubeconfig("expired-user", "expired-token-value");
    let cfg = cluster::kubeconfig::load(&path, None).unwrap();
    let client = KubeClient::new(&cfg).unwrap();
    let crds = chart_180_crds();
    let platforms = platforms(&["linux/amd64"]);
    let input = input_for(&platforms, &crds, false);
    let e = preflight(&client, &input).await.unwrap_err();
    assert!(matches!(e, ClusterError::Unauthorized { .. }), "{e:?}");
    let m = e.to_string();
    assert!(
        m.contains("\"expired-user\"") && m.contains("/version") && m.contains(&kube.cp.server),
        "{m}"
    );
    assert!(!m.contains("expired-token-value"), "{m}");
}

/// A user whose RBAC lets it read nodes, namespaces, CRDs and DaemonSets, but not Secrets: the
/// API server's own 403, naming the user and the resource.
#[tokio::test]
async fn forbidden_secrets_is_403_naming_user_and_resource() {
    let kube = real::lease();
    kube.seed_nodes("eks");
    kube.seed(json!([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "koord-test-limited"},
         "rules": [{"apiGroups": [""], "resources": ["nodes", "namespaces"], "verbs": ["get", "list"]},
                   {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["get", "list"]},
                   {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get", "list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "koord-test-limited"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "koord-test-limited"},
         "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "koord-test-limited"}]}
    ]));
    let path = kube.token_kubeconfig("limited", kube.cp.tokens["limited"].as_str().unwrap());
    let cfg = cluster::kubeconfig::load(&path, None).unwrap();
    let client = KubeClient::new(&cfg).unwrap();
    let crds = chart_180_crds();
    let platforms = platforms(&["linux/amd64", "linux/arm64"]);
    let input = input_for(&platforms, &crds, false);
    let e = preflight(&client, &input).await.unwrap_err();
    let m = e.to_string();
    assert!(matches!(e, ClusterError::Forbidden { .. }), "{e:?}");
    assert!(
        m.contains("\"limited\"") && m.contains("/api/v1/namespaces/default/secrets"),
        "{m}"
    );
    assert!(
        m.contains("User \"koord-test-limited\" cannot list resource \"secrets\""),
        "{m}"
    );
}

fn runs(count: &Path) -> usize {
    std::fs::read_to_string(count)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

#[tokio::test]
async fn exec_plugin_token_is_fetched_once_cached_and_fetched_again_after_a_401() {
    for api in [
        "client.authentication.k8s.io/v1",
        "client.authentication.k8s.io/v1beta1",
    ] {
        let kube = real::lease();
        kube.seed_nodes("kubeadm");
        let (path, count, info) = kube.exec_kubeconfig(api);
        let cfg = cluster::kubeconfig::load(&path, None).unwrap();
        let client = KubeClient::new(&cfg).unwrap();
        let crds = chart_180_crds();
        let platforms = platforms(&["linux/amd64"]);
        let input = input_for(&platforms, &crds, false);
        let r = preflight(&client, &input)
            .await
            .expect("preflight with the plugin's token");
        assert!(!r.failed(), "{:#?}", r.findings);
        let reqs = kube.requests_of("koord-bundle/");
        assert!(reqs.len() > 10, "{:#?}", kube.request_lines());
        assert!(
            reqs.iter()
                .all(|r| r["user"]["username"] == "koord-test-admin"
                    && r["responseStatus"]["code"].as_u64().unwrap_or(0) < 400
                    || r["responseStatus"]["code"] == 404),
            "{:#?}",
            kube.request_lines()
        );
        assert_eq!(runs(&count), 1, "one run, cached for every request ({api})");
        let exec_info: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&info).unwrap()).unwrap();
        assert_eq!(exec_info["apiVersion"], api);
        assert_eq!(exec_info["kind"], "ExecCredential");
        assert_eq!(exec_info["spec"]["interactive"], false);
        assert_eq!(
            exec_info["spec"]["cluster"]["server"],
            kube.cp.server.as_str()
        );
        assert!(exec_info["spec"]["cluster"]["certificate-authority-data"].is_string());

        // A token the server refuses: fetched again once, then a 401 naming the user.
        let before = runs(&count);
        let (path, count, _) = kube.exec_kubeconfig_with(api, "not-the-token");
        let cfg = cluster::kubeconfig::load(&path, None).unwrap();
        let client = KubeClient::new(&cfg).unwrap();
        let e = preflight(&client, &input).await.unwrap_err();
        assert!(matches!(e, ClusterError::Unauthorized { .. }), "{e:?}");
        assert!(!e.to_string().contains("not-the-token"), "{e}");
        assert_eq!(runs(&count) - before, 2, "run, refused, run again once");
    }
}

#[tokio::test]
async fn exec_plugin_missing_or_broken_is_named_with_its_install_hint() {
    let kube = real::lease();
    let (path, _, _) = kube.exec_kubeconfig("client.authentication.k8s.io/v1");
    let text = std::fs::read_to_string(&path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let plugin = v["users"][0]["user"]["exec"]["command"]
        .as_str()
        .unwrap()
        .to_string();
    let missing = path.with_file_name("missing-kubeconfig");
    std::fs::write(&missing, text.replace(&plugin, "/nonexistent/aws")).unwrap();
    let cfg = cluster::kubeconfig::load(&missing, None).unwrap();
    let m = KubeClient::new(&cfg)
        .unwrap()
        .get_json("/version")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        m.contains("/nonexistent/aws --cluster-name kb-test")
            && m.contains("not found: token-plugin.sh comes with the test"),
        "{m}"
    );
    // The plugin exits non-zero (no PLUGIN_TOKEN): named, its stderr left to the user.
    let broken = path.with_file_name("broken-kubeconfig");
    std::fs::write(&broken, text.replace("PLUGIN_TOKEN", "OTHER_NAME")).unwrap();
    let cfg = cluster::kubeconfig::load(&broken, None).unwrap();
    let m = KubeClient::new(&cfg)
        .unwrap()
        .get_json("/version")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        m.contains("exec credential plugin") && m.contains("it failed (exit status: 3)"),
        "{m}"
    );
}

#[tokio::test]
async fn unreachable_server_says_no_cluster_reachable_and_names_the_url() {
    // A port that was free a moment ago: connection refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("https://127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: gone\nclusters:\n- name: gone\n  cluster:\n    server: {url}\n    insecure-skip-tls-verify: true\ncontexts:\n- name: gone\n  context: {{cluster: gone, user: sa}}\nusers:\n- name: sa\n  user: {{token: abc}}\n"
        ),
    )
    .unwrap();
    let cfg = cluster::kubeconfig::load(&path, None).unwrap();
    let client = KubeClient::new(&cfg).unwrap();
    let crds = chart_180_crds();
    let platforms = platforms(&["linux/amd64"]);
    let input = input_for(&platforms, &crds, false);
    let e = preflight(&client, &input).await.unwrap_err();
    assert!(matches!(e, ClusterError::Unreachable { .. }), "{e:?}");
    let m = e.to_string();
    assert!(
        m.contains("no cluster reachable") && m.contains(&url),
        "{m}"
    );
}

/// The lease's admin kubeconfig with its cluster and user entries changed by `edit`, written
/// next to it.
fn edited_kubeconfig(
    kube: &Cluster,
    name: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> PathBuf {
    let mut kc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&kube.kubeconfig).unwrap()).unwrap();
    edit(&mut kc);
    let path = kube.dir.path().join(name);
    std::fs::write(&path, kc.to_string()).unwrap();
    path
}

/// `tls-server-name`: the API server's certificate names 127.0.0.1 and `kubernetes`. With
/// `tls-server-name: kubernetes` the handshake passes; with a name the certificate does not
/// hold it fails, naming the server (so the name, not the address, is what was checked).
#[tokio::test]
async fn tls_server_name_is_sent_and_checked() {
    let kube = real::lease();
    kube.seed_nodes("kubeadm");
    let crds = chart_180_crds();
    let platforms = platforms(&["linux/amd64"]);
    let input = input_for(&platforms, &crds, false);
    let wrong = edited_kubeconfig(&kube, "wrong-name", |kc| {
        kc["clusters"][0]["cluster"]["tls-server-name"] = "not-the-api-server.example".into();
    });
    let cfg = cluster::kubeconfig::load(&wrong, None).unwrap();
    let e = preflight(&KubeClient::new(&cfg).unwrap(), &input)
        .await
        .unwrap_err();
    assert!(matches!(e, ClusterError::Tls { .. }), "{e:?}");
    assert!(e.to_string().contains(&kube.cp.server), "{e}");
    let named = edited_kubeconfig(&kube, "named", |kc| {
        kc["clusters"][0]["cluster"]["tls-server-name"] = "kubernetes".into();
    });
    let cfg = cluster::kubeconfig::load(&named, None).unwrap();
    let r = preflight(&KubeClient::new(&cfg).unwrap(), &input)
        .await
        .expect("the certificate is checked against tls-server-name");
    assert!(!r.failed(), "{:#?}", r.findings);
}

/// `as`, `as-uid`, `as-groups`, `as-user-extra`: every request carries the `Impersonate-*`
/// headers, as kubectl sends them: the API server acts as that user (403 for what it may not
/// do) and its audit log records the impersonation.
#[tokio::test]
async fn impersonation_headers_are_sent() {
    let kube = real::lease();
    let path = edited_kubeconfig(&kube, "impersonating", |kc| {
        let u = &mut kc["users"][0]["user"];
        u["as"] = "koord-test-nobody".into();
        u["as-uid"] = "1002".into();
        u["as-groups"] = serde_json::json!(["devs", "ops"]);
        u["as-user-extra"] = serde_json::json!({"reason": ["audit"]});
    });
    let cfg = cluster::kubeconfig::load(&path, None).unwrap();
    let client = KubeClient::new(&cfg).unwrap();
    let e = client.get_json("/api/v1/nodes").await.unwrap_err();
    assert!(
        e.to_string()
            .contains("User \"koord-test-nobody\" cannot list resource \"nodes\""),
        "{e}"
    );
    let reqs = kube.requests_of("koord-bundle/");
    let imp = &reqs.last().unwrap()["impersonatedUser"];
    assert_eq!(imp["username"], "koord-test-nobody", "{imp}");
    assert_eq!(imp["uid"], "1002", "{imp}");
    assert_eq!(
        imp["groups"],
        serde_json::json!(["devs", "ops", "system:authenticated"]),
        "{imp}"
    );
    assert_eq!(
        imp["extra"]["reason"],
        serde_json::json!(["audit"]),
        "{imp}"
    );
}

/// A CONNECT proxy of the test's own, counting the tunnels it opened and their targets.
fn connect_proxy() -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s2 = seen.clone();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            let seen = s2.clone();
            std::thread::spawn(move || {
                let mut c = c;
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match c.read(&mut b) {
                        Ok(1) => head.push(b[0]),
                        _ => return,
                    }
                }
                let head = String::from_utf8_lossy(&head).to_string();
                let target = head.split_whitespace().nth(1).unwrap_or("").to_string();
                seen.lock()
                    .unwrap()
                    .push(head.lines().next().unwrap_or("").to_string());
                let Ok(up) = std::net::TcpStream::connect(&target) else {
                    let _ = c.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n");
                    return;
                };
                let _ = c.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
                let (mut c2, mut up2) = (c.try_clone().unwrap(), up.try_clone().unwrap());
                let t = std::thread::spawn(move || {
                    let _ = std::io::copy(&mut up2, &mut c2);
                    let _ = c2.shutdown(std::net::Shutdown::Both);
                });
                let mut up = up;
                let _ = std::io::copy(&mut c, &mut up);
                let _ = up.shutdown(std::net::Shutdown::Both);
                let _ = t.join();
            });
        }
    });
    (url, seen)
}

/// `proxy-url`: the API server is reached through the kubeconfig's HTTP proxy (a CONNECT
/// tunnel), TLS and token end to end through it.
#[tokio::test]
async fn proxy_url_tunnels_through_the_proxy() {
    let kube = real::lease();
    let (proxy, seen) = connect_proxy();
    let path = edited_kubeconfig(&kube, "proxied", |kc| {
        kc["clusters"][0]["cluster"]["proxy-url"] = proxy.clone().into();
    });
    let cfg = cluster::kubeconfig::load(&path, None).unwrap();
    let v = KubeClient::new(&cfg)
        .unwrap()
        .get_json("/version")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v["gitVersion"], kube.cp.version.as_str());
    let host = kube.cp.server.trim_start_matches("https://").to_string();
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter()
            .any(|l| l.starts_with(&format!("CONNECT {host} "))),
        "{seen:?}"
    );
}

/// Credentials go over TLS only: to a plain-HTTP server the token is not sent, and the 401
/// says why, naming the user and the server. On the FAKE API server: a real one serves no
/// plain HTTP.
#[tokio::test]
async fn no_token_over_plain_http() {
    let fake = kube_fake::start(Opts {
        seed: &["kind"],
        token: Some(TOKEN),
        ..Default::default()
    });
    let cfg = cluster::kubeconfig::load(&fake.kubeconfig, None).unwrap();
    let client = KubeClient::new(&cfg).unwrap();
    assert!(client.credentials_withheld().is_some());
    let e = client.get_json("/version").await.unwrap_err();
    assert!(
        matches!(e, ClusterError::CredentialsWithheld { .. }),
        "{e:?}"
    );
    assert!(fake.requests().iter().all(|r| r["authorized"] == false));
}
