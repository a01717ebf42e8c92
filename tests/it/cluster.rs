//! The real Kubernetes control plane of the test environment (`scripts/control-plane.sh`:
//! kube-apiserver v1.36 with RBAC, admission and an audit log, on etcd 3.6, and
//! kube-controller-manager; no scheduler and no kubelet, so no Pod ever runs).
//!
//! The Koordinator chart holds cluster-wide objects with fixed names (13 CRDs, its
//! ClusterRoles, webhook configurations and PriorityClasses), so two installs of it cannot
//! share one cluster: a test **leases** a cluster ([`lease`]) and has it to itself until the
//! lease is dropped (an exclusive `flock` on that control plane's lock file, which serialises
//! the tests of every runner and process). The environment runs a pool of control planes
//! (`KB_CONTROL_PLANES`, env.json's `kube_pool`), so that as many leased tests run side by side:
//! under nextest, a test of the group `cluster` (.config/nextest.toml) takes the control plane
//! of its group slot; elsewhere (cargo test) the first free one. A lease starts from a clean
//! cluster: whatever an earlier test left (releases, namespaces, CRDs, nodes, the chart's
//! cluster-wide objects, anything a test seeded) is deleted first, and the namespace controller
//! has finished.
//!
//! What the API server saw comes from its audit log ([`Cluster::requests`]: user, user agent,
//! verb, object, answer code; no bodies), what it holds from `kubectl` (the environment's
//! kubectl 1.33, as a user would look).

use crate::common::*;
use serde_json::{json, Value};
use std::io::{Read as _, Seek as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// Namespaces every cluster has: never deleted by a reset.
const BASELINE_NAMESPACES: [&str; 4] = ["default", "kube-node-lease", "kube-public", "kube-system"];
/// The label every object a test seeds carries, so that a reset finds it.
pub const SEEDED: &str = "koord-bundle.test/seeded";

/// The control plane, as env.json names it.
pub struct ControlPlane {
    /// `https://127.0.0.1:PORT`.
    pub server: String,
    /// The cluster CA.
    pub ca: PathBuf,
    /// The admin's client certificate and key (`O=system:masters`).
    pub admin_cert: PathBuf,
    /// Its key.
    pub admin_key: PathBuf,
    /// `v1.36.3`.
    pub version: String,
    /// The lock file of [`lease`].
    pub lock: PathBuf,
    /// The API server's audit log (JSON lines).
    pub audit_log: PathBuf,
    /// Static tokens: `limited`, `nobody`, `admin` (system:masters).
    pub tokens: Value,
    /// kubectl.
    pub kubectl: PathBuf,
}

/// The first control plane of the environment (a test that only needs its address and CA;
/// a test that sends it requests takes a [`lease`]).
pub fn control_plane() -> ControlPlane {
    pool().swap_remove(0)
}

/// Every control plane of the environment (env.json's `kube_pool`).
pub fn pool() -> Vec<ControlPlane> {
    let pool = env_json()["kube_pool"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !pool.is_empty(),
        "env.json names no control plane: the environment was started without one \
         (scripts/test.sh --quick, or KB_NO_CLUSTER=1), or before control-plane pools \
         (scripts/test-env.sh restart)"
    );
    pool.iter().map(control_plane_of).collect()
}

/// The control plane of one entry of `kube_pool`.
fn control_plane_of(v: &Value) -> ControlPlane {
    let s = |k: &str| {
        v[k].as_str()
            .unwrap_or_else(|| panic!("env.json's kube_pool entry lacks {k}: restart the test environment (scripts/test-env.sh restart)"))
            .to_string()
    };
    ControlPlane {
        server: s("kube_server"),
        ca: s("kube_ca_file").into(),
        admin_cert: s("kube_admin_cert").into(),
        admin_key: s("kube_admin_key").into(),
        version: s("kube_version"),
        lock: s("kube_lock").into(),
        audit_log: s("kube_audit_log").into(),
        tokens: v["kube_tokens"].clone(),
        kubectl: env_json()["kubectl"]
            .as_str()
            .expect("env.json names kubectl")
            .into(),
    }
}

/// The cluster, leased by one test (see the module doc).
pub struct Cluster {
    _lock: std::fs::File,
    /// The control plane.
    pub cp: ControlPlane,
    /// The admin's kubeconfig (JSON, client certificate), in [`Cluster::dir`].
    pub kubeconfig: PathBuf,
    /// A directory of this lease: kubeconfigs, helm's homes.
    pub dir: tempfile::TempDir,
    /// The audit log's length when the lease began (or [`Cluster::forget_requests`] was last
    /// called): [`Cluster::requests`] reads from there.
    audit_from: std::cell::Cell<u64>,
}

/// Lease a cluster: wait until a control plane is free, then start from a clean cluster (see
/// the module doc). The cluster has no nodes: see [`Cluster::seed_nodes`].
///
/// Under nextest the test must be in the test group `cluster` (.config/nextest.toml): a
/// leasing test outside it would hold a test slot while it waits, and run beside more leased
/// tests than there are control planes. It fails saying so.
pub fn lease() -> Cluster {
    let mut pool = pool();
    let open = |cp: &ControlPlane| {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&cp.lock)
            .expect("open the cluster lock")
    };
    let (cp, lock) = if std::env::var_os("NEXTEST").is_some() {
        let group = std::env::var("NEXTEST_TEST_GROUP").unwrap_or_default();
        assert_eq!(
            group, "cluster",
            "this test leases a cluster: put it in the test group `cluster` of .config/nextest.toml"
        );
        let slot: usize = std::env::var("NEXTEST_TEST_GROUP_SLOT")
            .ok()
            .and_then(|s| s.parse().ok())
            .expect("nextest names the test's group slot (NEXTEST_TEST_GROUP_SLOT)");
        assert!(
            slot < pool.len(),
            "group slot {slot} but {} control planes: the group `cluster` of .config/nextest.toml \
             allows more tests at once than KB_CONTROL_PLANES starts",
            pool.len()
        );
        let cp = pool.swap_remove(slot);
        let lock = open(&cp);
        lock.lock().expect("lock the cluster");
        (cp, lock)
    } else {
        // The first free one; all busy: try again shortly.
        let (i, lock) = 'found: loop {
            for (i, cp) in pool.iter().enumerate() {
                let lock = open(cp);
                if lock.try_lock().is_ok() {
                    break 'found (i, lock);
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        (pool.swap_remove(i), lock)
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        kubeconfig_json(
            &cp,
            "admin",
            json!({
            "client-certificate": cp.admin_cert, "client-key": cp.admin_key}),
        )
        .to_string(),
    )
    .unwrap();
    let c = Cluster {
        _lock: lock,
        cp,
        kubeconfig,
        dir,
        audit_from: std::cell::Cell::new(0),
    };
    c.reset();
    c.forget_requests();
    c
}

/// A kubeconfig (JSON) for the control plane whose user entry `user` is `auth`.
pub fn kubeconfig_json(cp: &ControlPlane, user: &str, auth: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "kb-test", "cluster": {"server": cp.server, "certificate-authority": cp.ca}}],
        "users": [{"name": user, "user": auth}],
        "contexts": [{"name": "kb-test", "context": {"cluster": "kb-test", "user": user}}],
        "current-context": "kb-test",
    })
}

impl Cluster {
    /// `kubectl ARGS` as the admin; its output (not checked).
    pub fn kubectl_output(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        let mut c = Command::new(&self.cp.kubectl);
        c.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.dir.path())
            .stdin(if stdin.is_some() {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            })
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().expect("kubectl runs");
        if let Some(input) = stdin {
            use std::io::Write as _;
            child.stdin.take().unwrap().write_all(input).unwrap();
        }
        child.wait_with_output().unwrap()
    }

    /// `kubectl ARGS` as the admin; its standard output (it must succeed).
    pub fn kubectl(&self, args: &[&str]) -> String {
        let o = self.kubectl_output(args, None);
        assert!(
            o.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Create `objects` (one object or a JSON array of them) as a user would with
    /// `kubectl create -f`, each labelled [`SEEDED`] so that a reset finds it.
    pub fn seed(&self, objects: Value) {
        let mut items = match objects {
            Value::Array(a) => a,
            one => vec![one],
        };
        for o in &mut items {
            o["metadata"]["labels"][SEEDED] = "true".into();
        }
        let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
        let o = self.kubectl_output(&["create", "-f", "-"], Some(list.to_string().as_bytes()));
        assert!(
            o.status.success(),
            "kubectl create: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// The nodes of a fixture (`tests/fixtures/kube/<name>/nodes.json`), created as their
    /// kubelets would register them (status included).
    pub fn seed_nodes(&self, fixture: &str) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/kube")
            .join(fixture)
            .join("nodes.json");
        let list: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let nodes: Vec<Value> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                let mut n = n.clone();
                n["apiVersion"] = "v1".into();
                n["kind"] = "Node".into();
                for k in [
                    "uid",
                    "resourceVersion",
                    "creationTimestamp",
                    "managedFields",
                ] {
                    n["metadata"].as_object_mut().unwrap().remove(k);
                }
                n
            })
            .collect();
        self.seed(Value::Array(nodes));
    }

    /// Every object of `kind` (in `namespace`, or cluster-wide / in all namespaces).
    pub fn of_kind(&self, kind: &str, namespace: Option<&str>) -> Vec<Value> {
        let mut args = vec!["get", kind, "-o", "json"];
        match namespace {
            Some(ns) => args.extend(["-n", ns]),
            None => args.push("-A"),
        }
        let v: Value = serde_json::from_str(&self.kubectl(&args)).unwrap();
        v["items"].as_array().cloned().unwrap_or_default()
    }

    /// (name, resourceVersion) of every object of each (kind, namespace) of `kinds`, sorted by
    /// name: equal before and after a command means it changed none of them.
    pub fn resource_versions(&self, kinds: &[(&str, Option<&str>)]) -> Vec<(String, Value)> {
        let mut v: Vec<(String, Value)> = kinds
            .iter()
            .flat_map(|(kind, ns)| self.of_kind(kind, *ns))
            .map(|o| {
                (
                    o["metadata"]["name"].as_str().unwrap().to_string(),
                    o["metadata"]["resourceVersion"].clone(),
                )
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// The names of every object of `kind`, sorted.
    pub fn names(&self, kind: &str, namespace: Option<&str>) -> Vec<String> {
        let mut v: Vec<String> = self
            .of_kind(kind, namespace)
            .iter()
            .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        v.sort();
        v
    }

    /// One object, `None` when it does not exist.
    pub fn get(&self, kind: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let mut args = vec!["get", kind, name, "-o", "json", "--show-managed-fields"];
        if let Some(ns) = namespace {
            args.extend(["-n", ns]);
        }
        let o = self.kubectl_output(&args, None);
        if !o.status.success() {
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                err.contains("NotFound") || err.contains("not found"),
                "kubectl get: {err}"
            );
            return None;
        }
        Some(serde_json::from_slice(&o.stdout).unwrap())
    }

    /// (workload as `Kind name`, container, image, pull policy) of every container of the
    /// Deployments and DaemonSets in `namespace`.
    pub fn containers(&self, namespace: &str) -> Vec<(String, String, String, String)> {
        let mut v = Vec::new();
        for kind in ["Deployment", "DaemonSet"] {
            for name in self.names(kind, Some(namespace)) {
                let w = self.get(kind, Some(namespace), &name).unwrap();
                for c in w["spec"]["template"]["spec"]["containers"]
                    .as_array()
                    .unwrap()
                {
                    v.push((
                        format!("{kind} {name}"),
                        c["name"].as_str().unwrap().to_string(),
                        c["image"].as_str().unwrap().to_string(),
                        c["imagePullPolicy"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                    ));
                }
            }
        }
        v
    }

    /// helm's release records in `namespace`: (name, status, revision), by revision.
    pub fn releases(&self, namespace: &str) -> Vec<(String, String, String)> {
        let mut v: Vec<(u64, (String, String, String))> = self
            .of_kind("secrets", Some(namespace))
            .iter()
            .filter(|s| s["type"] == "helm.sh/release.v1")
            .map(|s| {
                let l = &s["metadata"]["labels"];
                let t = |k: &str| l[k].as_str().unwrap_or("").to_string();
                (
                    t("version").parse().unwrap_or(0),
                    (t("name"), t("status"), t("version")),
                )
            })
            .collect();
        v.sort();
        v.into_iter().map(|(_, r)| r).collect()
    }

    /// From now on, [`Cluster::requests`] returns only what comes after this.
    pub fn forget_requests(&self) {
        self.audit_from.set(
            std::fs::metadata(&self.cp.audit_log)
                .map(|m| m.len())
                .unwrap_or(0),
        );
    }

    /// What the API server's audit log recorded since the lease began (the controller
    /// manager's and the API server's own requests are not recorded).
    pub fn requests(&self) -> Vec<Value> {
        let mut f = std::fs::File::open(&self.cp.audit_log).expect("the audit log");
        f.seek(std::io::SeekFrom::Start(self.audit_from.get()))
            .unwrap();
        let mut text = String::new();
        f.read_to_string(&mut text).unwrap();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The requests of clients whose user agent starts with `agent` (`Helm/`,
    /// `koord-bundle/`).
    pub fn requests_of(&self, agent: &str) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| r["userAgent"].as_str().unwrap_or("").starts_with(agent))
            .collect()
    }

    /// One line per request, for a failing assertion.
    pub fn request_lines(&self) -> Vec<String> {
        self.requests().iter().map(request_line).collect()
    }

    /// Requests that would change something (create, update, patch, delete), not dry runs.
    pub fn writes_of(&self, agent: &str) -> Vec<String> {
        self.requests_of(agent)
            .iter()
            .filter(|r| {
                matches!(
                    r["verb"].as_str(),
                    Some("create" | "update" | "patch" | "delete" | "deletecollection")
                ) && !r["requestURI"]
                    .as_str()
                    .unwrap_or("")
                    .contains("dryRun=All")
            })
            .map(request_line)
            .collect()
    }

    /// helm (3 or 4) as a user runs it by hand: the admin's kubeconfig, homes of this lease.
    pub fn helm(&self, major: u64, args: &[&str]) -> Output {
        self.helm_cmd(major, args).output().expect("helm runs")
    }

    /// The command of [`Cluster::helm`], not run yet.
    pub fn helm_cmd(&self, major: u64, args: &[&str]) -> Command {
        let dir = self.dir.path();
        let mut c = Command::new(helm_of(major));
        c.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", dir.join("helm-cache"))
            .env("HELM_CONFIG_HOME", dir.join("helm-config"))
            .env("HELM_DATA_HOME", dir.join("helm-data"))
            .env_remove("HELM_DRIVER");
        c
    }

    /// A kubeconfig file (JSON) whose user is a static token of the control plane (`limited`,
    /// `nobody`, `admin`), or any other token.
    pub fn token_kubeconfig(&self, name: &str, token: &str) -> PathBuf {
        let path = self.dir.path().join(format!("kubeconfig-{name}"));
        let kc = kubeconfig_json(&self.cp, name, json!({"token": token}));
        std::fs::write(&path, kc.to_string()).unwrap();
        path
    }

    /// One line on what the cluster holds, for a test's log.
    pub fn summary(&self) -> String {
        let ns: Vec<String> = self
            .names("namespaces", None)
            .into_iter()
            .filter(|n| !BASELINE_NAMESPACES.contains(&n.as_str()))
            .collect();
        let mut releases = Vec::new();
        for n in BASELINE_NAMESPACES
            .iter()
            .map(|s| s.to_string())
            .chain(ns.clone())
        {
            for (name, status, rev) in self.releases(&n) {
                releases.push(format!("{n}/{name} v{rev} {status}"));
            }
        }
        format!(
            "namespaces {ns:?}; releases {releases:?}; {} CRDs; {} nodes",
            self.names("crd", None).len(),
            self.names("nodes", None).len()
        )
    }

    /// Back to a clean cluster (see the module doc): what the chart, helm and earlier tests
    /// made is deleted, and the namespace controller has emptied every namespace deleted.
    ///
    /// A CRD deleted moments after it was created can stay Terminating for minutes (its
    /// finalizer fails with "could not list instances: storage is (re)initializing" and
    /// backs off): its objects are deleted here first, and after 10 s its finalizer is
    /// removed, as an operator would.
    fn reset(&self) {
        let del = |args: &[&str]| {
            let mut a = vec!["delete", "--ignore-not-found", "--wait=false"];
            a.extend(args);
            self.kubectl(&a);
        };
        let crds = self.names("crd", None);
        if !crds.is_empty() {
            let kinds = crds.join(",");
            let _ = self.kubectl_output(
                &[
                    "delete",
                    "--ignore-not-found",
                    "--wait=false",
                    &kinds,
                    "--all",
                    "-A",
                ],
                None,
            );
        }
        del(&[
            "validatingwebhookconfigurations,mutatingwebhookconfigurations",
            "--all",
        ]);
        del(&["crd", "--all"]);
        del(&["nodes", "--all"]);
        del(&[
            "clusterroles,clusterrolebindings,priorityclasses",
            "-l",
            "app.kubernetes.io/managed-by=Helm",
        ]);
        del(&[
            "clusterroles,clusterrolebindings,priorityclasses",
            "-l",
            SEEDED,
        ]);
        del(&["secrets,configmaps", "--all", "-n", "default"]);
        del(&[
            "daemonsets,deployments,configmaps,secrets,serviceaccounts",
            "-l",
            SEEDED,
            "-n",
            "kube-system",
        ]);
        let extra: Vec<String> = self
            .names("namespaces", None)
            .into_iter()
            .filter(|n| !BASELINE_NAMESPACES.contains(&n.as_str()))
            .collect();
        if !extra.is_empty() {
            let mut a = vec!["namespaces"];
            a.extend(extra.iter().map(String::as_str));
            del(&a);
        }
        let start = std::time::Instant::now();
        let mut unstuck = false;
        loop {
            let left = self.kubectl(&["get", "namespaces,crd", "-o", "name"]);
            let left: Vec<&str> = left
                .lines()
                .filter(|l| {
                    !l.strip_prefix("namespace/")
                        .is_some_and(|n| BASELINE_NAMESPACES.contains(&n))
                })
                .collect();
            if left.is_empty() {
                return;
            }
            let waited = start.elapsed();
            if waited > Duration::from_secs(10) && !unstuck {
                unstuck = true;
                for crd in left
                    .iter()
                    .filter(|l| l.starts_with("customresourcedefinition"))
                {
                    let _ = self.kubectl_output(
                        &[
                            "patch",
                            crd,
                            "--type=merge",
                            "-p",
                            r#"{"metadata":{"finalizers":[]}}"#,
                        ],
                        None,
                    );
                }
            }
            assert!(
                waited < Duration::from_secs(180),
                "the cluster is not clean after {waited:?}: {left:?} remain"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

/// helm 3 or 4 of the environment.
pub fn helm_of(major: u64) -> PathBuf {
    if major == 3 {
        env().helm3.clone()
    } else {
        env().helm4.clone()
    }
}

/// `verb resource namespace/name code user-agent` of an audit event.
pub fn request_line(r: &Value) -> String {
    let o = &r["objectRef"];
    format!(
        "{} {} {}/{} {} {} [{}]",
        r["verb"].as_str().unwrap_or(""),
        o["resource"]
            .as_str()
            .unwrap_or(r["requestURI"].as_str().unwrap_or("")),
        o["namespace"].as_str().unwrap_or(""),
        o["name"].as_str().unwrap_or(""),
        r["responseStatus"]["code"],
        r["user"]["username"].as_str().unwrap_or(""),
        r["userAgent"]
            .as_str()
            .unwrap_or("")
            .split(' ')
            .next()
            .unwrap_or("")
    )
}

impl Cluster {
    /// Wait until no namespace is Terminating (the namespace controller emptied and removed
    /// every deleted one) and no CRD is being deleted. The bound is long: the namespace
    /// controller backs off (up to a minute a try) while CRDs deleted with the namespace leave
    /// its discovery incomplete, and 120 s ran out once in a full run (install::helm4::
    /// old_namespace_choice, after helm 4 uninstalled 13 CRDs and their namespace). A failure
    /// names what was still being deleted.
    pub fn wait_namespaces_finalized(&self) {
        wait_for(
            "deleted namespaces and CRDs to be gone",
            Duration::from_secs(300),
            || {
                let namespaces = self.kubectl(&[
                    "get",
                    "namespaces",
                    "-o",
                    r#"jsonpath={range .items[?(@.status.phase=="Terminating")]}{.metadata.name} {end}"#,
                ]);
                // A CRD helm uninstalled stays, with its release's annotations, until its
                // objects are gone: a pre-flight then reads it as the old release's (a flake
                // of install::helm4::old_namespace_choice, once in a full run).
                let crds = self.kubectl(&[
                    "get",
                    "crd",
                    "-o",
                    "jsonpath={range .items[?(@.metadata.deletionTimestamp)]}{.metadata.name} {end}",
                ]);
                if namespaces.trim().is_empty() && crds.trim().is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "still terminating: namespaces [{}], CRDs [{}]",
                        namespaces.trim(),
                        crds.trim()
                    ))
                }
            },
        );
    }

    /// A kubeconfig whose user gets the admin's static token from an exec plugin script of
    /// ours (the API server checks the token, so nothing passes unless the plugin ran and its
    /// output was used). Returns (kubeconfig, file counting the plugin's runs, file with its
    /// KUBERNETES_EXEC_INFO).
    pub fn exec_kubeconfig(&self, api_version: &str) -> (PathBuf, PathBuf, PathBuf) {
        let token = self.cp.tokens["admin"].as_str().unwrap().to_string();
        self.exec_kubeconfig_with(api_version, &token)
    }

    /// [`Cluster::exec_kubeconfig`] whose plugin hands out `token`.
    pub fn exec_kubeconfig_with(
        &self,
        api_version: &str,
        token: &str,
    ) -> (PathBuf, PathBuf, PathBuf) {
        let dir = self.dir.path();
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
        let kc = kubeconfig_json(
            &self.cp,
            "exec-user",
            json!({"exec": {
                "apiVersion": api_version,
                "command": plugin,
                "args": ["--cluster-name", "kb-test"],
                "env": [{"name": "PLUGIN_TOKEN", "value": token},
                        {"name": "RUNS_FILE", "value": count},
                        {"name": "INFO_FILE", "value": info}],
                "interactiveMode": "Never",
                "provideClusterInfo": true,
                "installHint": "token-plugin.sh comes with the test"
            }}),
        );
        let path = dir.join(format!(
            "exec-kubeconfig-{}",
            api_version.rsplit('/').next().unwrap()
        ));
        std::fs::write(&path, kc.to_string()).unwrap();
        (path, count, info)
    }

    /// CRDs of a fixture (`tests/fixtures/kube/<name>/crds/*.json`), created as the tool that
    /// owns them would (their metadata as the fixture has it; the API server's own fields
    /// and the status left to it).
    pub fn seed_crds(&self, fixture: &str) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/kube")
            .join(fixture)
            .join("crds");
        let mut crds = Vec::new();
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let mut c: Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            c.as_object_mut().unwrap().remove("status");
            for k in [
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "managedFields",
                "generation",
            ] {
                c["metadata"].as_object_mut().unwrap().remove(k);
            }
            crds.push(c);
        }
        self.seed(Value::Array(crds));
        self.wait_established(&[]);
    }

    /// Wait (60 s) until every CRD named (every CRD, with no name) is Established. Polled
    /// rather than `kubectl wait --for=condition=Established`: that fails at once ("accessor
    /// error: <nil>") on a CRD whose status has no conditions yet, which a just-created CRD may
    /// not have (a flake of install::helm3::ack, and of admission_policy's engine CRDs, once
    /// each in a full run).
    pub fn wait_established(&self, names: &[&str]) {
        let mut args = vec!["get", "crd"];
        args.extend_from_slice(names);
        args.extend_from_slice(&["-o", "json"]);
        wait_until(
            "the CRDs to be Established",
            Duration::from_secs(60),
            || {
                let out = self.kubectl(&args);
                let got: Value = serde_json::from_str(&out).unwrap();
                // One name gives the object, several (or none) a list.
                let crds = match got["items"].as_array() {
                    Some(items) => items.clone(),
                    None => vec![got],
                };
                crds.iter().all(|crd| {
                    crd["status"]["conditions"].as_array().is_some_and(|c| {
                        c.iter()
                            .any(|c| c["type"] == "Established" && c["status"] == "True")
                    })
                })
            },
        );
    }
}

impl Cluster {
    /// Write pod `pod`'s status (the pod as `kubectl get -o json` gives it) as its kubelet
    /// would: phase Running, every regular and ephemeral container running and ready, every
    /// init container terminated (Completed), each container's `imageID` what `image_id` gives
    /// for its spec image. No kubelet runs here: the tests that judge what pods run write this.
    pub fn write_pod_status(&self, pod: &Value, image_id: &dyn Fn(&str) -> String) {
        let namespace = pod["metadata"]["namespace"].as_str().unwrap();
        let name = pod["metadata"]["name"].as_str().unwrap();
        let statuses = |field: &str, state: &Value| -> Vec<Value> {
            pod["spec"][field]
                .as_array()
                .map(|cs| {
                    cs.iter()
                        .map(|c| {
                            let image = c["image"].as_str().unwrap();
                            json!({"name": c["name"], "image": image, "imageID": image_id(image),
                                "ready": state.get("running").is_some(), "restartCount": 0,
                                "state": state})
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let running = json!({"running": {"startedAt": "2026-12-04T00:00:00Z"}});
        let done = json!({"terminated": {"exitCode": 0, "reason": "Completed",
            "startedAt": "2026-12-04T00:00:00Z", "finishedAt": "2026-12-04T00:00:01Z"}});
        let mut status = json!({"phase": "Running",
            "containerStatuses": statuses("containers", &running)});
        for (field, key, state) in [
            ("initContainers", "initContainerStatuses", &done),
            (
                "ephemeralContainers",
                "ephemeralContainerStatuses",
                &running,
            ),
        ] {
            let s = statuses(field, state);
            if !s.is_empty() {
                status[key] = s.into();
            }
        }
        self.kubectl(&[
            "-n",
            namespace,
            "patch",
            "pod",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &json!({ "status": status }).to_string(),
        ]);
    }
}

/// A Helm release record (a Secret of type `helm.sh/release.v1`, as helm's Secret driver
/// writes it) of release `name`, `revision` and `status` in `namespace`, whose `data.release`
/// holds `helm_text`: helm's own text of the release ([`helm_text`], or anything a test forges).
pub fn helm_record(
    name: &str,
    namespace: &str,
    revision: u32,
    status: &str,
    helm_text: &str,
) -> Value {
    use base64::Engine as _;
    json!({"apiVersion": "v1", "kind": "Secret", "type": "helm.sh/release.v1",
        "metadata": {"name": format!("sh.helm.release.v1.{name}.v{revision}"), "namespace": namespace,
            "labels": {"owner": "helm", "name": name, "status": status, "version": revision.to_string()}},
        "data": {"release": base64::engine::general_purpose::STANDARD.encode(helm_text)}})
}

/// Helm's text of a release JSON: gzipped, then base64 (helm 3 and 4 store it so; the
/// Secret's `data` base64-encodes it once more).
pub fn helm_text(release_json: &str) -> String {
    use base64::Engine as _;
    use std::io::Write as _;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(release_json.as_bytes()).unwrap();
    base64::engine::general_purpose::STANDARD.encode(gz.finish().unwrap())
}
