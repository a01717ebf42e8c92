//! `verify --cluster` on the REAL control plane (`cluster`), over releases whose Helm records
//! are written as helm writes them (a `helm.sh/release.v1` Secret, base64 of gzip of the
//! release JSON) and whose objects are created with kubectl: the controller manager makes the
//! pods, and their statuses are written as a kubelet would (the status subresource), since no
//! kubelet runs. Issue 42: the check fails closed. Every kind a release renders and every
//! selector form is read, init, regular and ephemeral containers are judged, a release that
//! names nothing to check is a failure, a container not started is "could not tell" (exit 4),
//! and what is kept of a large release is bounded, the rest counted.

use crate::cluster::{self, Cluster};
use crate::common::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const NS: &str = "audit";
const REG: &str = "reg.local/site";

/// The bundle's images: `ref` → `REG/ref@digest` (what `load` pins to).
fn pinned(bundle: &Path) -> Vec<(String, String)> {
    bundle_manifest(bundle)["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let r = i["ref"].as_str().unwrap().to_string();
            let p = format!("{REG}/{r}@{}", i["digest"].as_str().unwrap());
            (r, p)
        })
        .collect()
}

/// The `imageID` a node reports for a reference `REPO[:TAG]@DIGEST`: `REPO@DIGEST`.
fn node_id(image: &str) -> String {
    let (name, digest) = image.split_once('@').expect("a pinned reference");
    let repo = match name.rfind(':') {
        Some(i) if i > name.rfind('/').unwrap_or(0) => &name[..i],
        _ => name,
    };
    format!("{repo}@{digest}")
}

/// A Helm release record for `manifest` (status `deployed`), as helm's Secret driver writes it.
fn record(release: &str, revision: u32, manifest: &str) -> Value {
    let rel = json!({"name": release, "namespace": NS, "version": revision,
        "info": {"status": "deployed"},
        "chart": {"metadata": {"name": "koordinator", "version": "1.7.0"}},
        "config": {}, "manifest": manifest});
    raw_record(release, revision, &cluster::helm_text(&rel.to_string()))
}

/// A release Secret whose `release` (helm's own base64 text) is `helm_text`.
fn raw_record(release: &str, revision: u32, helm_text: &str) -> Value {
    cluster::helm_record(release, NS, revision, "deployed", helm_text)
}

/// The objects, as YAML documents of a release manifest (JSON is YAML).
fn manifest(objects: &[Value]) -> String {
    objects
        .iter()
        .map(|o| format!("---\n# Source: koordinator/templates/x.yaml\n{o}\n"))
        .collect()
}

fn container(name: &str, image: &str) -> Value {
    json!({"name": name, "image": image})
}

/// A home with a signed 1.7.0 bundle, the leased cluster and namespace [`NS`].
fn setup() -> (Home, PathBuf, Vec<(String, String)>, Cluster) {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.7.0", &[]);
    let images = pinned(&bundle);
    assert!(images.len() >= 3, "{images:?}");
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    kube.seed(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}));
    // Pods need the namespace's default ServiceAccount, which the controller manager makes.
    let until = Instant::now() + Duration::from_secs(60);
    while kube.get("serviceaccount", Some(NS), "default").is_none() {
        assert!(Instant::now() < until, "no default ServiceAccount in {NS}");
        std::thread::sleep(Duration::from_millis(300));
    }
    (h, bundle, images, kube)
}

/// `verify BUNDLE --cluster --release RELEASE --namespace audit [extra]`.
fn verify(
    h: &Home,
    kube: &Cluster,
    bundle: &Path,
    release: &str,
    extra: &[&str],
) -> std::process::Output {
    let mut args = vec![
        "verify",
        bundle.to_str().unwrap(),
        "--cluster",
        "--release",
        release,
        "--namespace",
        NS,
        "--kubeconfig",
        kube.kubeconfig.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    h.run(&args)
}

/// The pods of [`NS`] once there are at least `n` and their number held for 3 s.
fn pods(kube: &Cluster, n: usize) -> Vec<Value> {
    let until = Instant::now() + Duration::from_secs(120);
    let (mut last, mut since) = (usize::MAX, Instant::now());
    loop {
        let items = kube.of_kind("pods", Some(NS));
        if items.len() != last {
            (last, since) = (items.len(), Instant::now());
        }
        if items.len() >= n && since.elapsed() >= Duration::from_secs(3) {
            return items;
        }
        assert!(
            Instant::now() < until,
            "{} pods in {NS}, not {n}: {:?}",
            items.len(),
            items
                .iter()
                .map(|p| &p["metadata"]["name"])
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A release of every workload kind: a Deployment selected by `matchExpressions` only (with an
/// init container), a StatefulSet, a Job (its selector the API server's), a CronJob (its pods
/// those of a Job it owns), and a bare Pod; beside them a pod of no workload of the release.
/// With every node running the bundle's digests, all 6 containers are verified (exit 0). One
/// Job pod running another digest fails (exit 1), so does an ephemeral debug container, of an
/// image the bundle does not carry. (Before: only the StatefulSet was read, 1 container, and
/// each of these cases exited 0.)
#[test]
fn every_workload_kind_and_container_kind_is_judged() {
    let (h, bundle, images, kube) = setup();
    let img = |i: usize| images[i].1.clone();
    let labels = |app: &str| json!({ "app": app });
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "by-expression", "namespace": NS},
        "spec": {"replicas": 1,
            "selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["by-expression"]}]},
            "template": {"metadata": {"labels": labels("by-expression")},
                "spec": {"initContainers": [container("prepare", &img(1))],
                         "containers": [container("main", &img(0))]}}}});
    let statefulset = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "sts", "namespace": NS},
        "spec": {"replicas": 1, "serviceName": "sts", "selector": {"matchLabels": labels("sts")},
            "template": {"metadata": {"labels": labels("sts")},
                "spec": {"containers": [container("main", &img(1))]}}}});
    let job_spec = |app: &str| {
        json!({"template": {"metadata": {"labels": labels(app)},
        "spec": {"restartPolicy": "Never", "containers": [container("task", &img(2))]}}})
    };
    let job = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "job", "namespace": NS}, "spec": job_spec("job")});
    let cronjob = json!({"apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": "cron", "namespace": NS},
        "spec": {"schedule": "0 0 1 1 *", "suspend": true, "jobTemplate": {"spec": job_spec("cron")}}});
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "bare", "namespace": NS},
        "spec": {"containers": [container("main", &img(0))]}});
    let objects = [deployment, statefulset, job, cronjob, pod];
    let mut seeded = objects.to_vec();
    seeded.push(record("kinds", 1, &manifest(&objects)));
    // Not of the release: never judged.
    seeded.push(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "bystander", "namespace": NS, "labels": {"app": "other"}},
        "spec": {"containers": [container("main", "docker.io/library/busybox:1.36")]}}));
    kube.seed(Value::Array(seeded));
    // The CronJob's run, as `kubectl create job --from` makes it (owned by the CronJob).
    kube.kubectl(&[
        "-n",
        NS,
        "create",
        "job",
        "cron-by-hand",
        "--from=cronjob/cron",
    ]);
    let all = pods(&kube, 6);
    let names: Vec<&str> = all
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap())
        .collect();
    for p in all.iter().filter(|p| p["metadata"]["name"] != "bystander") {
        kube.write_pod_status(p, &node_id);
    }
    let o = verify(&h, &kube, &bundle, "kinds", &[]);
    assert_ok(&o);
    let out = stdout(&o);
    assert!(
        out.contains("verdict    6 of 6 containers verified: VERIFIED"),
        "{names:?}\n{out}"
    );
    for want in [
        "5 workloads",
        " init:prepare: expected ",
        &format!("{NS}/bare main"),
        &format!("{NS}/sts-0 main"),
        &format!("{NS}/job-"),
        &format!("{NS}/cron-by-hand-"),
        &format!("{NS}/by-expression-"),
    ] {
        assert!(out.contains(want), "{want:?} not in:\n{out}");
    }
    assert!(!out.contains("bystander"), "{out}");
    // A Job's pod runs another digest.
    let job_pod = all
        .iter()
        .find(|p| p["metadata"]["name"].as_str().unwrap().starts_with("job-"))
        .unwrap();
    let other = format!("sha256:{}", "e".repeat(64));
    kube.write_pod_status(job_pod, &|image: &str| {
        format!("{}@{other}", node_id(image).split('@').next().unwrap())
    });
    let o = verify(&h, &kube, &bundle, "kinds", &[]);
    let err = assert_fails(
        &o,
        1,
        &["5 of 6 containers verified (1 DIFFERS): FAILED", &other],
    );
    assert!(
        err.contains(job_pod["metadata"]["name"].as_str().unwrap()),
        "{err}"
    );
    kube.write_pod_status(job_pod, &node_id);
    assert_ok(&verify(&h, &kube, &bundle, "kinds", &[]));
    // An ephemeral debug container in the bare pod, of an image the bundle does not carry.
    kube.kubectl(&[
        "-n",
        NS,
        "debug",
        "bare",
        "--image=docker.io/library/busybox:1.36",
        "-c",
        "debugger",
        "--profile=general",
    ]);
    let bare = kube.get("pod", Some(NS), "bare").unwrap();
    // Its node runs busybox; the pod's own container still runs the bundle's digest.
    kube.write_pod_status(&bare, &|i: &str| {
        if i.contains('@') {
            node_id(i)
        } else {
            format!("{i}@sha256:{}", "f".repeat(64))
        }
    });
    let o = verify(&h, &kube, &bundle, "kinds", &[]);
    assert_fails(
        &o,
        1,
        &[
            "6 of 7 containers verified (1 NOT BUNDLED): FAILED",
            "ephemeral:debugger: expected an image of the bundle, found docker.io/library/busybox:1.36",
        ],
    );
    let out = stdout(&o);
    assert!(
        out.contains("NOT BUNDLED audit/bare ephemeral:debugger: expected an image of the bundle, found docker.io/library/busybox:1.36"),
        "{out}"
    );
    let o = verify(&h, &kube, &bundle, "kinds", &["--json"]);
    assert_eq!(o.status.code(), Some(1));
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["ok"], false);
    assert_eq!(j["cluster"]["verdict"]["outcome"], "failed", "{j}");
    assert_eq!(
        (
            &j["cluster"]["verdict"]["verified"],
            &j["cluster"]["verdict"]["containers"]
        ),
        (&json!(6), &json!(7))
    );
}

/// A record that cannot be decoded, a release that renders no workload: failures (exit 1). A
/// workload whose container has not started: "could not tell", exit 4, in text and `--json`.
/// (Before: each exited 0, the first two with "0 workloads, 0 containers".)
#[test]
fn a_release_with_nothing_verified_is_never_a_success() {
    let (h, bundle, images, kube) = setup();
    let config = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": NS}});
    let waiting = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "waiting", "namespace": NS},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "waiting"}},
            "template": {"metadata": {"labels": {"app": "waiting"}},
                "spec": {"containers": [container("main", &images[0].1)]}}}});
    kube.seed(json!([
        raw_record("garbled", 1, "H4sI-not-a-release"),
        record("nothing", 1, &manifest(&[config])),
        record("waiting", 1, &manifest(std::slice::from_ref(&waiting))),
        waiting,
    ]));
    let o = verify(&h, &kube, &bundle, "garbled", &[]);
    assert_fails(
        &o,
        1,
        &["sh.helm.release.v1.garbled.v1", "cannot be decoded"],
    );
    let o = verify(&h, &kube, &bundle, "nothing", &[]);
    assert_fails(
        &o,
        1,
        &["0 of 0 containers verified (the release renders no workload): FAILED"],
    );
    pods(&kube, 1);
    let o = verify(&h, &kube, &bundle, "waiting", &[]);
    assert_fails(
        &o,
        4,
        &[
            "0 of 1 container verified (1 NOT STARTED): COULD NOT TELL",
            "exit code 4",
        ],
    );
    assert!(
        stdout(&o).contains("NOT STARTED audit/waiting-"),
        "{}",
        stdout(&o)
    );
    let o = verify(&h, &kube, &bundle, "waiting", &["--json"]);
    assert_eq!(o.status.code(), Some(4));
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["ok"], false);
    assert_eq!(j["cluster"]["verdict"]["outcome"], "could-not-tell", "{j}");
}

/// A release record of `status` for `manifest`, as helm's Secret driver writes it.
fn record_as(release: &str, revision: u32, status: &str, manifest: &str) -> Value {
    let rel = json!({"name": release, "namespace": NS, "version": revision,
        "info": {"status": status},
        "chart": {"metadata": {"name": "koordinator", "version": "1.7.0"}},
        "config": {}, "manifest": manifest});
    cluster::helm_record(
        release,
        NS,
        revision,
        status,
        &cluster::helm_text(&rel.to_string()),
    )
}

/// The newest revision failed (an upgrade that stopped half-way) or is pending (helm running,
/// or stopped in the middle): what the last deployed revision applied may still run, and helm
/// still counts it as the release's. Its workloads are judged too: a Deployment only revision
/// 1 renders, running an image the bundle does not carry, fails the check (before: only the
/// newest revision's workloads were read, and this exited 0, VERIFIED). A pending revision is
/// "could not tell" (exit 4) even when every container runs the bundle's digests.
#[test]
fn a_failed_or_pending_newest_revision_is_judged_with_the_last_deployed_one() {
    let (h, bundle, images, kube) = setup();
    let deployment = |name: &str, image: &str| {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}},
                    "spec": {"containers": [container("main", image)]}}}})
    };
    let kept = deployment("kept", &images[1].1);
    let old = deployment("old-only", "docker.io/library/busybox:1.36");
    let both = manifest(&[kept.clone(), old.clone()]);
    let newest = manifest(std::slice::from_ref(&kept));
    kube.seed(json!([
        record_as("upgraded", 1, "deployed", &both),
        record_as("upgraded", 2, "failed", &newest),
        record_as("pending", 1, "superseded", &newest),
        record_as("pending", 2, "pending-upgrade", &newest),
        kept,
        old,
    ]));
    for p in pods(&kube, 2) {
        kube.write_pod_status(&p, &|i: &str| {
            if i.contains('@') {
                node_id(i)
            } else {
                format!("{i}@sha256:{}", "f".repeat(64))
            }
        });
    }
    let o = verify(&h, &kube, &bundle, "upgraded", &[]);
    assert_fails(
        &o,
        1,
        &["1 of 2 containers verified (1 NOT BUNDLED): FAILED"],
    );
    let out = stdout(&o);
    for want in [
        "(revision 2, failed,",
        "the workloads of revision 1, the last deployed, are judged too",
        "audit/old-only-",
    ] {
        assert!(out.contains(want), "{want:?} not in:\n{out}");
    }
    let o = verify(&h, &kube, &bundle, "upgraded", &["--json"]);
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["cluster"]["deployedRevision"], 1, "{j}");
    let o = verify(&h, &kube, &bundle, "pending", &[]);
    assert_fails(
        &o,
        4,
        &[
            "1 of 1 container verified (1 workload with a problem): COULD NOT TELL",
            "exit code 4",
        ],
    );
    let out = stdout(&o);
    assert!(
        out.contains("its newest revision, 2, is pending-upgrade: helm is in the middle"),
        "{out}"
    );
}

/// A Deployment of 230 replicas, none started: every container is counted, at most 200 of a
/// kind of answer are kept and shown, the rest are a count (before: every container kept, each
/// string cloned, so memory grew with what the server sent).
#[test]
fn a_large_release_is_counted_whole_and_shown_in_part() {
    let (h, bundle, images, kube) = setup();
    let many = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "many", "namespace": NS},
        "spec": {"replicas": 230, "selector": {"matchLabels": {"app": "many"}},
            "template": {"metadata": {"labels": {"app": "many"}},
                "spec": {"containers": [container("main", &images[0].1)]}}}});
    kube.seed(json!([
        record("many", 1, &manifest(std::slice::from_ref(&many))),
        many
    ]));
    pods(&kube, 230);
    let o = verify(&h, &kube, &bundle, "many", &["--json"]);
    assert_eq!(
        o.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    let c = &j["cluster"];
    assert_eq!(c["counts"]["notStarted"], 230, "{c}");
    assert_eq!(c["containers"].as_array().unwrap().len(), 200);
    assert_eq!(c["omitted"], 30);
    assert_eq!(c["verdict"]["containers"], 230);
    let o = verify(&h, &kube, &bundle, "many", &[]);
    let out = stdout(&o);
    assert!(out.contains("... and 30 more containers"), "{out}");
    assert!(
        out.contains("0 of 230 containers verified (230 NOT STARTED)"),
        "{out}"
    );
}
