//! `koord_bundle::helm` against the real helm 3.17.3 and 4.1.4 and the registries of the test
//! environment (plain HTTP on 127.0.0.1:15000, TLS + basic auth on 127.0.0.1:15001).
//!
//! Each test pushes the fixture chart itself (`helm push`, into a fresh `helmtest-*`
//! repository) before pulling or installing it.
//!
//! There is NO Kubernetes API server here. `helm upgrade --install --dry-run=client` still needs
//! one (helm reads the release history first; helm 3 also asks the API server for its version
//! and API groups), so with a dummy kubeconfig pointing at 127.0.0.1:1 it fails with "cluster
//! unreachable" (tested below). To run the exact arguments the tool uses anyway, the dry-run tests
//! call helm through a wrapper script that sets `HELM_DRIVER=memory` (an empty in-memory release
//! store, which also replaces helm's Kubernetes client with a printing fake) and, for helm 3, point
//! the kubeconfig at a tiny fake API server in this file that answers only the discovery requests
//! (`/version`, `/api`, `/apis`, `/api/v1`). helm 4 needs no API server at all then (dummy
//! kubeconfig 127.0.0.1:1). `helm template` needs nothing.
//!
//! Helm 3 always speaks plain HTTP to OCI registries on `localhost` or any loopback address
//! (whatever the TLS flags), and this machine may only run servers on loopback: helm 3's TLS +
//! login path therefore cannot be exercised here. helm 3 is tested against the plain registry;
//! helm 4 against the TLS registry with basic auth, verifying its certificate with the CA file.

use crate::common::{env, fixtures, run_with_stdin};
use koord_bundle::chart::{generated_values, rendered_images};
use koord_bundle::helm::{ChartSource, Helm, HelmError, InstallPlan, RegistryAccess};
use koord_bundle::secret::Secret;
use serde_yaml_ng::Value;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

const IMAGE_HOST: &str = "127.0.0.1:15000/prefix";
const FEATURE_GATES: &str = "PodMutatingWebhook=false,NodeMutatingWebhook=true";
const CRDS_OFF: [&str; 2] = ["reservations", "podmigrationjobs"];
const IMAGES_180: [&str; 5] = [
    "koord-descheduler",
    "koord-device-daemon",
    "koord-manager",
    "koord-scheduler",
    "koordlet",
];

fn helm(major: u64) -> Helm {
    let e = env();
    let path = if major == 3 { &e.helm3 } else { &e.helm4 };
    let h = Helm::find(Some(path), None, &koord_bundle::helm::FOR_BUILD)
        .unwrap_or_else(|err| panic!("{err} (scripts/install-deps.sh installs helm)"));
    assert_eq!(h.major(), major);
    assert!(h.supports_oci());
    h
}

fn unique() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "helmtest-{}-{}-{}",
        std::process::id(),
        nanos % 1_000_000_000,
        N.fetch_add(1, Ordering::SeqCst)
    )
}

fn chart_180() -> PathBuf {
    fixtures().join("koordinator-1.8.0.tgz")
}

fn sha256(path: &Path) -> String {
    hex::encode(Sha256::digest(
        std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    ))
}

fn run_ok(cmd: &mut Command, stdin: Option<&str>) {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    if let (Some(s), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(s.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `helm push` of the 1.8.0 fixture into a fresh repository of the plain registry; returns the
/// chart reference.
fn push_plain(h: &Helm) -> String {
    let repo = format!("oci://{}/{}", env().plain, unique());
    run_ok(
        Command::new(&h.path)
            .args(["push"])
            .arg(chart_180())
            .args([&repo, "--plain-http"]),
        None,
    );
    format!("{repo}/koordinator")
}

/// How a helm version reaches the TLS registry (see the module comment).
struct Tls {
    host: String,
    ca_file: Option<PathBuf>,
    insecure: bool,
}

impl Tls {
    /// helm 4's route to the TLS registry (see the module comment for helm 3).
    fn new(h: &Helm) -> Tls {
        assert_eq!(h.major(), 4, "helm 3 cannot use TLS on a loopback registry");
        let e = env();
        Tls {
            host: e.tls.clone(),
            ca_file: Some(e.ca_file.clone()),
            insecure: false,
        }
    }

    fn access(&self, password: &str) -> RegistryAccess {
        RegistryAccess {
            host: self.host.clone(),
            username: Some(env().username.clone()),
            password: Some(Secret::new(password.to_string())),
            ca_file: self.ca_file.clone(),
            plain_http: false,
            insecure_skip_tls_verify: self.insecure,
        }
    }

    fn tls_flags(&self, insecure_flag: &str) -> Vec<String> {
        match &self.ca_file {
            Some(ca) => vec!["--ca-file".into(), ca.to_string_lossy().into_owned()],
            None => vec![insecure_flag.into()],
        }
    }

    /// Log in (test-side, `--password-stdin`, temporary registry config) and push the fixture;
    /// returns the chart reference.
    fn push(&self, h: &Helm) -> String {
        let e = env();
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("config.json");
        run_ok(
            Command::new(&h.path)
                .args([
                    "registry",
                    "login",
                    &self.host,
                    "--username",
                    &e.username,
                    "--password-stdin",
                    "--registry-config",
                ])
                .arg(&cfg)
                .args(self.tls_flags("--insecure")),
            Some(&format!("{}\n", e.password)),
        );
        let repo = format!("oci://{}/{}", self.host, unique());
        run_ok(
            Command::new(&h.path)
                .arg("push")
                .arg(chart_180())
                .arg(&repo)
                .arg("--registry-config")
                .arg(&cfg)
                .args(self.tls_flags("--insecure-skip-tls-verify")),
            None,
        );
        format!("{repo}/koordinator")
    }
}

/// A fake Kubernetes API server answering only discovery (what helm 3's client-side dry run
/// asks for once its release store is in memory). Returns its port.
fn fake_discovery_api() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || serve_discovery(conn));
        }
    });
    port
}

fn serve_discovery(mut conn: TcpStream) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match conn.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head);
    let path = head
        .split_whitespace()
        .nth(1)
        .unwrap_or("/")
        .split('?')
        .next()
        .unwrap_or("/")
        .to_string();
    let body = match path.as_str() {
        "/version" => {
            Some(r#"{"major":"1","minor":"30","gitVersion":"v1.30.0","platform":"linux/amd64"}"#)
        }
        "/api" => {
            Some(r#"{"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[]}"#)
        }
        "/apis" => Some(r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[]}"#),
        "/api/v1" => Some(r#"{"kind":"APIResourceList","groupVersion":"v1","resources":[]}"#),
        _ => None,
    };
    let resp = match body {
        Some(b) => format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}", b.len()),
        None => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_string(),
    };
    let _ = conn.write_all(resp.as_bytes());
}

fn write_kubeconfig(dir: &Path, server: &str) -> PathBuf {
    let p = dir.join("kubeconfig");
    std::fs::write(
        &p,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: dummy\n  cluster:\n    server: {server}\ncontexts:\n- name: dummy\n  context:\n    cluster: dummy\n    user: dummy\ncurrent-context: dummy\nusers:\n- name: dummy\n  user: {{}}\n"
        ),
    )
    .unwrap();
    p
}

/// The real helm behind a wrapper that keeps releases in memory (see the module comment).
pub fn memory_driver_helm(real: &Helm, dir: &Path) -> Helm {
    use std::os::unix::fs::PermissionsExt as _;
    let data = dir.join("no-releases.yaml");
    std::fs::write(&data, "").unwrap();
    let wrapper = dir.join("helm");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nHELM_DRIVER=memory\nHELM_MEMORY_DRIVER_DATA='{}'\nexport HELM_DRIVER HELM_MEMORY_DRIVER_DATA\nexec '{}' \"$@\"\n",
            data.display(),
            real.path.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let h = Helm::find(Some(&wrapper), None, &koord_bundle::helm::FOR_LOAD).unwrap();
    assert_eq!(h.version, real.version);
    h
}

/// The plan `koord-bundle load` builds, as far as this module is concerned.
fn tool_plan(chart: ChartSource, registry: Option<RegistryAccess>) -> InstallPlan {
    let crds_off: Vec<String> = CRDS_OFF.iter().map(|s| s.to_string()).collect();
    let values = generated_values(
        IMAGE_HOST,
        Some(FEATURE_GATES),
        &crds_off,
        true,
        &["regcred".to_string()],
    );
    let mut plan = InstallPlan::new("koordinator", "koordinator-system", chart, values);
    plan.registry = registry;
    plan
}

fn expected_images() -> Vec<String> {
    IMAGES_180
        .iter()
        .map(|n| format!("{IMAGE_HOST}/koordinator-sh/{n}:v1.8.0"))
        .collect()
}

fn documents(manifests: &str) -> Vec<Value> {
    manifests
        .split("\n---")
        .filter_map(|d| serde_yaml_ng::from_str::<Value>(d).ok())
        .filter(|v| v.is_mapping())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

/// What the tool's values must do to the rendered chart.
fn check_rendered(manifests: &str) {
    let images = rendered_images(manifests).expect("rendered images");
    assert_eq!(images, expected_images(), "rendered images");
    assert!(images
        .iter()
        .all(|i| i.starts_with(&format!("{IMAGE_HOST}/"))));

    let docs = documents(manifests);
    let crds: Vec<&str> = docs
        .iter()
        .filter(|d| d["kind"].as_str() == Some("CustomResourceDefinition"))
        .filter_map(|d| d["metadata"]["name"].as_str())
        .collect();
    assert!(
        crds.contains(&"devices.scheduling.koordinator.sh"),
        "CRDs rendered: {crds:?}"
    );
    for off in CRDS_OFF {
        assert!(
            !crds.iter().any(|c| c.starts_with(&format!("{off}."))),
            "CRD {off} switched off but rendered: {crds:?}"
        );
    }

    let manager = find(&docs, "Deployment", "koord-manager");
    let pod = &manager["spec"]["template"]["spec"];
    assert_eq!(
        pod["hostNetwork"],
        Value::Bool(true),
        "koord-manager hostNetwork"
    );
    let args: Vec<&str> = pod["containers"][0]["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        args.contains(&format!("--feature-gates={FEATURE_GATES}").as_str()),
        "{args:?}"
    );
    for (kind, name) in [
        ("Deployment", "koord-manager"),
        ("Deployment", "koord-scheduler"),
        ("DaemonSet", "koordlet"),
    ] {
        let secrets = &find(&docs, kind, name)["spec"]["template"]["spec"]["imagePullSecrets"];
        assert_eq!(
            secrets,
            &serde_yaml_ng::from_str::<Value>("[{name: regcred}]").unwrap(),
            "{kind} {name} imagePullSecrets"
        );
    }
}

fn pull_plain(major: u64) {
    let h = helm(major);
    let reference = push_plain(&h);
    let dest = tempfile::tempdir().unwrap();
    let access = RegistryAccess {
        host: env().plain.clone(),
        plain_http: true,
        ..Default::default()
    };
    let got = h
        .pull(
            &reference,
            "1.8.0",
            &dest.path().join("new-dir"),
            Some(&access),
        )
        .unwrap();
    assert_eq!(got.file_name().unwrap(), "koordinator-1.8.0.tgz");
    assert_eq!(sha256(&got), sha256(&chart_180()));
}

fn pull_tls_with_login(major: u64) {
    let h = helm(major);
    let tls = Tls::new(&h);
    let reference = tls.push(&h);
    let dest = tempfile::tempdir().unwrap();
    let got = h
        .pull(
            &reference,
            "1.8.0",
            dest.path(),
            Some(&tls.access(&env().password)),
        )
        .unwrap();
    assert_eq!(sha256(&got), sha256(&chart_180()));

    // Without credentials the registry refuses; with a wrong password the login fails. Neither
    // error shows the password.
    let anonymous = RegistryAccess {
        username: None,
        password: None,
        ..tls.access("")
    };
    let err = h
        .pull(&reference, "1.8.0", dest.path(), Some(&anonymous))
        .unwrap_err();
    assert!(matches!(err, HelmError::Failed { .. }), "{err}");
    assert!(err.to_string().contains(&reference), "{err}");
    let wrong = "wrong-pw-5d41402abc";
    let err = h
        .pull(&reference, "1.8.0", dest.path(), Some(&tls.access(wrong)))
        .unwrap_err();
    assert!(matches!(err, HelmError::LoginFailed { .. }), "{err}");
    let shown = format!("{err} {err:?}");
    assert!(
        shown.contains(&tls.host) && !shown.contains(wrong),
        "{shown}"
    );
}

/// `upgrade_install(plan, client_dry_run = true)` with the tool's exact arguments, the chart
/// from the TLS registry with login (or the archive), helm's release store in memory.
fn upgrade_install_dry_run(major: u64, from_registry: bool) {
    let real = helm(major);
    let dir = tempfile::tempdir().unwrap();
    let h = memory_driver_helm(&real, dir.path());
    let server = if major == 3 {
        format!("http://127.0.0.1:{}", fake_discovery_api())
    } else {
        "https://127.0.0.1:1".to_string()
    };
    let (chart, registry) = if from_registry && major == 3 {
        (
            ChartSource::Oci {
                reference: push_plain(&real),
                version: "1.8.0".into(),
            },
            Some(RegistryAccess {
                host: env().plain.clone(),
                username: None,
                password: None,
                ca_file: None,
                plain_http: true,
                insecure_skip_tls_verify: false,
            }),
        )
    } else if from_registry {
        let tls = Tls::new(&real);
        let reference = tls.push(&real);
        (
            ChartSource::Oci {
                reference,
                version: "1.8.0".into(),
            },
            Some(tls.access(&env().password)),
        )
    } else {
        (ChartSource::Archive(chart_180()), None)
    };
    let mut plan = tool_plan(chart, registry);
    plan.kubeconfig = Some(write_kubeconfig(dir.path(), &server));
    plan.context = Some("dummy".into());
    plan.timeout = Some("2m".into());
    // helm's lines reach the sink as they come, scrubbed.
    let lines = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let l2 = lines.clone();
    let sink: koord_bundle::child::LineSink = std::sync::Arc::new(move |_, line: &[u8]| {
        l2.lock().unwrap().push_str(&String::from_utf8_lossy(line))
    });
    let out = h
        .upgrade_install(&plan, true, Some(sink))
        .unwrap_or_else(|e| panic!("{e}"));
    let seen = lines.lock().unwrap().clone();
    assert!(seen.contains("koordinator-system"), "{seen}");
    assert!(!seen.contains(&env().password), "{seen}");
    assert!(out.stdout.contains("koordinator-system"), "{}", out.stdout);
    check_rendered(&out.manifest());
    assert!(!out.stdout.contains(&env().password) && !out.stderr.contains(&env().password));
}

/// Without a cluster (and without the in-memory release store) the client-side dry run fails:
/// helm reads the release history first. The error names the release and keeps helm's words.
fn upgrade_install_needs_a_cluster(major: u64) {
    let h = helm(major);
    let dir = tempfile::tempdir().unwrap();
    let mut plan = tool_plan(ChartSource::Archive(chart_180()), None);
    plan.kubeconfig = Some(write_kubeconfig(dir.path(), "https://127.0.0.1:1"));
    let err = h.upgrade_install(&plan, true, None).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, HelmError::Failed { .. }), "{text}");
    assert!(
        text.contains("helm upgrade --install koordinator")
            && text.to_lowercase().contains("cluster unreachable"),
        "{text}"
    );
}

fn template_images(major: u64) {
    let h = helm(major);
    let reference = push_plain(&h);
    let access = RegistryAccess {
        host: env().plain.clone(),
        plain_http: true,
        ..Default::default()
    };
    let mut plan = tool_plan(
        ChartSource::Oci {
            reference,
            version: "1.8.0".into(),
        },
        Some(access),
    );
    // User values come after the generated ones, --set last.
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("user.yaml");
    std::fs::write(
        &user,
        "manager:\n  replicas: 4\nscheduler:\n  replicas: 1\n",
    )
    .unwrap();
    plan.user_values = vec![user];
    plan.user_sets = vec!["manager.replicas=3".into()];
    let manifests = h.template(&plan).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        rendered_images(&manifests).expect("images"),
        expected_images()
    );
    check_rendered(&manifests);
    let docs = documents(&manifests);
    assert_eq!(
        find(&docs, "Deployment", "koord-manager")["spec"]["replicas"].as_u64(),
        Some(3)
    );
    assert_eq!(
        find(&docs, "Deployment", "koord-scheduler")["spec"]["replicas"].as_u64(),
        Some(1)
    );
}

/// The same from the TLS registry with login, and the password is in no argument of any helm
/// command the module builds.
fn template_tls_and_no_password_in_args(major: u64) {
    let h = helm(major);
    let tls = Tls::new(&h);
    let reference = tls.push(&h);
    let plan = tool_plan(
        ChartSource::Oci {
            reference,
            version: "1.8.0".into(),
        },
        Some(tls.access(&env().password)),
    );
    let manifests = h.template(&plan).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        rendered_images(&manifests).expect("images"),
        expected_images()
    );
    let pw = &env().password;
    let values = Path::new("/tmp/koord-bundle-helm-x/values.yaml");
    for dry in [false, true] {
        let args = plan.upgrade_install_args(values, dry);
        assert!(args.iter().any(|a| a == "--registry-config"));
        assert!(args.iter().all(|a| !a.contains(pw.as_str())), "{args:?}");
        let line = plan.command_line(&h, values, dry);
        assert!(
            line.contains("--password-stdin") && !line.contains(pw.as_str()),
            "{line}"
        );
    }
}

macro_rules! per_helm {
    ($($name:ident),* $(,)?) => {
        mod v3 { $( #[test] fn $name() { super::$name(3) } )* }
        mod v4 { $( #[test] fn $name() { super::$name(4) } )* }
    };
}

per_helm!(pull_plain, upgrade_install_needs_a_cluster, template_images);

mod tls_v4 {
    #[test]
    fn pull_tls_with_login() {
        super::pull_tls_with_login(4)
    }
    #[test]
    fn template_tls_and_no_password_in_args() {
        super::template_tls_and_no_password_in_args(4)
    }
}

fn upgrade_install_dry_run_oci(major: u64) {
    upgrade_install_dry_run(major, true)
}

fn upgrade_install_dry_run_archive(major: u64) {
    upgrade_install_dry_run(major, false)
}

mod dry_run {
    mod v3 {
        #[test]
        fn oci_plain() {
            super::super::upgrade_install_dry_run_oci(3)
        }
        #[test]
        fn archive() {
            super::super::upgrade_install_dry_run_archive(3)
        }
    }
    mod v4 {
        #[test]
        fn oci_tls_login() {
            super::super::upgrade_install_dry_run_oci(4)
        }
        #[test]
        fn archive() {
            super::super::upgrade_install_dry_run_archive(4)
        }
    }
}

#[test]
fn missing_helm_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let err = Helm::find(
        Some(&dir.path().join("helm")),
        None,
        &koord_bundle::helm::FOR_LOAD,
    )
    .unwrap_err();
    assert!(matches!(err, HelmError::NotFound { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("needs helm 3.5.0 or newer")
            && text.contains("https://helm.sh/docs/intro/install/")
            && text.contains("--helm PATH"),
        "{text}"
    );
}

#[test]
fn old_fake_helm_is_too_old() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("helm");
    std::fs::write(&fake, "#!/bin/sh\necho v3.4.0\n").unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let err = Helm::find(Some(&fake), None, &koord_bundle::helm::FOR_LOAD).unwrap_err();
    assert!(
        matches!(&err, HelmError::TooOld { version, .. } if version.to_string() == "3.4.0"),
        "{err}"
    );
    assert!(err.to_string().contains("3.5"), "{err}");
}

/// The objects Go's YAML reader (kubectl's, the library helm uses too) makes of `manifests`:
/// `kubectl label --local -f FILE -o json nothing-` reads every document and prints it as JSON,
/// changing nothing and asking no API server.
fn as_go_reads_it(dir: &Path, name: &str, manifests: &str) -> Vec<serde_json::Value> {
    let file = dir.join(name);
    std::fs::write(&file, manifests).unwrap();
    let kubectl = crate::common::env_json()["kubectl"]
        .as_str()
        .unwrap()
        .to_string();
    let o = Command::new(kubectl)
        .args(["label", "--local", "-o", "json", "nothing-", "-f"])
        .arg(&file)
        .env("KUBECONFIG", "/dev/null")
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    serde_json::Deserializer::from_slice(&o.stdout)
        .into_iter::<serde_json::Value>()
        .map(|v| v.unwrap())
        .collect()
}

/// Issue 42: YAML 1.1 merge keys (`<<`) through the real post-renderer. A document it rewrites
/// (an image to pin) means what the chart's rendering meant to helm (go-yaml v2, here through
/// kubectl: a key before `<<` is overwritten, one after it wins; a container image that comes
/// from a merge is pinned too); a document with nothing to pin passes byte for byte.
#[test]
fn merge_keys_keep_their_meaning_through_the_post_renderer() {
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("mk");
    std::fs::create_dir_all(chart.join("templates")).unwrap();
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: mk\nversion: 0.1.0\n",
    )
    .unwrap();
    std::fs::write(
        chart.join("templates/d.yaml"),
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: d
  labels: &labels
    app: d
    tier: base
spec:
  selector:
    matchLabels: {app: d}
  template:
    metadata:
      labels:
        tier: overwritten
        <<: *labels
        extra: x
    spec:
      containers:
      - &c
        name: a
        image: {{ .Values.host }}/koordinator-sh/koord-manager:v1.8.0
        imagePullPolicy: Always
        env:
        - {name: A, value: "1"}
      - <<: *c
        name: b
        env:
        - <<: [{name: B, value: first}, {value: second, extra: e}]
          value: "2"
"#,
    )
    .unwrap();
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  labels: {<<: {a: m}, a: explicit}\ndata:\n  before: x\n  <<: {before: merged, on: 'on'}\n";
    std::fs::write(chart.join("templates/cm.yaml"), cm).unwrap();
    let host = "127.0.0.1:5000/site";
    let o = Command::new(&env().helm3)
        .args(["template", "r"])
        .arg(&chart)
        .args(["--set", &format!("host={host}")])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let rendered = String::from_utf8(o.stdout).unwrap();
    let digest = format!("sha256:{}", "a".repeat(64));
    let image = format!("{host}/koordinator-sh/koord-manager:v1.8.0");
    let config = dir.path().join("post-render.json");
    std::fs::write(
        &config,
        serde_json::json!({"keepCrds": true, "pin": {&image: &digest}}).to_string(),
    )
    .unwrap();
    let o = run_with_stdin(
        Command::new(env!("CARGO_BIN_EXE_koord-bundle"))
            .args(["post-render", "--config"])
            .arg(&config),
        &rendered,
    );
    assert!(o.status.success(), "{o:?}");
    let out = String::from_utf8(o.stdout).unwrap();
    // What helm would send without the post-renderer, the images pinned: what it sends with it.
    let mut want = as_go_reads_it(dir.path(), "rendered.yaml", &rendered);
    for obj in &mut want {
        if let Some(cs) = obj.pointer_mut("/spec/template/spec/containers") {
            for c in cs.as_array_mut().unwrap() {
                c["image"] = format!("{image}@{digest}").into();
                c["imagePullPolicy"] = "IfNotPresent".into();
            }
        }
    }
    let got = as_go_reads_it(dir.path(), "post-rendered.yaml", &out);
    assert_eq!(got, want, "post-rendered:\n{out}");
    let d = got.iter().find(|o| o["kind"] == "Deployment").unwrap();
    assert_eq!(
        d["spec"]["template"]["metadata"]["labels"],
        serde_json::json!({"app": "d", "tier": "base", "extra": "x"})
    );
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][1]["env"],
        serde_json::json!([{"name": "B", "value": "2", "extra": "e"}])
    );
    // The ConfigMap had nothing to pin: as helm rendered it, byte for byte.
    assert!(
        out.contains(&format!("# Source: mk/templates/cm.yaml\n{cm}")),
        "{out}"
    );
    assert!(!out.replace(cm, "").contains("<<"), "{out}");
}
