//! The second day, on the REAL control plane (`cluster`): upgrades keep the site's values and
//! name what they change, a downgrade needs its flag, CRD changes that would break the upgrade
//! or lose objects are found before anything is pushed, the API server is asked first (a
//! server-side dry run), and `helm uninstall` keeps the CRDs and their objects.

use crate::cluster::{self, Cluster};
use crate::common::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const CHART_NS: &str = "koordinator-system";
const RELEASE: &str = "koordinator";

/// The values a site installs with.
const SITE_VALUES: &str = "manager:\n  replicas: 3\n  resources:\n    limits:\n      cpu: \"2\"\nkoordlet:\n  enableServiceMonitor: false\nfeatureGates: \"AllAlpha=false\"\n";

/// `load BUNDLE` into the plain registry under `prefix` and the leased cluster, with `extra`.
fn load(
    h: &Home,
    kube: &Cluster,
    bundle: &Path,
    prefix: &str,
    major: u64,
    extra: &[&str],
) -> std::process::Output {
    let registry = format!("{}/{prefix}", env().plain);
    let mut args = vec![
        "load",
        bundle.to_str().unwrap(),
        "--registry",
        &registry,
        "--plain-http",
        "--kubeconfig",
        kube.kubeconfig.to_str().unwrap(),
    ];
    let helm = cluster::helm_of(major);
    args.extend(["--helm", helm.to_str().unwrap()]);
    args.extend(extra);
    h.load_cmd(bundle, &registry, &args[4..]).output().unwrap()
}

/// `helm get values RELEASE -o json` (the user values the release holds).
fn release_values(kube: &Cluster, major: u64) -> Value {
    let o = kube.helm(
        major,
        &["get", "values", RELEASE, "-n", "default", "-o", "json"],
    );
    assert_ok(&o);
    serde_json::from_slice(&o.stdout).unwrap()
}

/// A home with signed bundles of 1.7.0 and 1.8.0, and the site's values file.
fn two_versions() -> (Home, PathBuf, PathBuf, PathBuf) {
    let h = Home::with_key();
    let (old, _) = h.build_plain("1.7.0", &[]);
    let (new, _) = h.build_plain("1.8.0", &[]);
    let values = h.path().join("site-values.yaml");
    std::fs::write(&values, SITE_VALUES).unwrap();
    (h, old, new, values)
}

/// The site's values, as `helm get values` prints them.
fn assert_site_values(v: &Value) {
    assert_eq!(v["manager"]["replicas"], 3, "{v}");
    assert_eq!(v["manager"]["resources"]["limits"]["cpu"], "2", "{v}");
    assert_eq!(v["koordlet"]["enableServiceMonitor"], false, "{v}");
    assert_eq!(v["featureGates"], "AllAlpha=false", "{v}");
}

fn site_values_survive_an_upgrade(major: u64) {
    let (h, old, new, values) = two_versions();
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let prefix = unique_prefix(&format!("keep{major}"));
    assert_ok(&load(
        &h,
        &kube,
        &old,
        &prefix,
        major,
        &["--values", values.to_str().unwrap()],
    ));
    let before = release_values(&kube, major);
    assert_site_values(&before);
    // The dry run shows what the release will hold, and nothing is written.
    kube.forget_requests();
    let o = load(&h, &kube, &new, &prefix, major, &["--dry-run", "--json"]);
    assert_ok(&o);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_site_values(&r["helm"]["releaseValues"]);
    assert_eq!(r["helm"]["previousValues"], before);
    assert!(kube.writes_of("koord-bundle/").is_empty() && kube.writes_of("Helm/").is_empty());
    // The upgrade itself, without --values: the site's values are still there, and the
    // private registry's host is this run's.
    let o = load(&h, &kube, &new, &prefix, major, &[]);
    assert_ok(&o);
    assert!(String::from_utf8_lossy(&o.stdout).contains("upgraded release koordinator"));
    let after = release_values(&kube, major);
    assert_site_values(&after);
    assert_eq!(after["imageRepositoryHost"], before["imageRepositoryHost"]);
    let d = kube
        .get("deployment", Some(CHART_NS), "koord-manager")
        .unwrap();
    assert_eq!(
        d["spec"]["replicas"], 3,
        "the site's 3 replicas, not the chart's 2"
    );
    // What the upgrade did before this change (helm given only this run's values): the
    // site's values are gone. --reset-values asks for exactly that.
    let o = load(&h, &kube, &new, &prefix, major, &["--reset-values"]);
    assert_ok(&o);
    let reset = release_values(&kube, major);
    assert!(reset.get("manager").is_none(), "{reset}");
    assert!(reset["imageRepositoryHost"].is_string(), "{reset}");
}

fn a_downgrade_is_refused_without_its_flag(major: u64) {
    let (h, old, new, _) = two_versions();
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let prefix = unique_prefix(&format!("down{major}"));
    assert_ok(&load(&h, &kube, &new, &prefix, major, &[]));
    let prefix2 = unique_prefix(&format!("down2{major}"));
    for extra in [&["--dry-run"][..], &[][..]] {
        let o = load(&h, &kube, &old, &prefix2, major, extra);
        assert_fails(
            &o,
            1,
            &[
                "a DOWNGRADE to chart 1.7.0",
                "--allow-downgrade",
                "nothing was pushed",
            ],
        );
    }
    assert!(repos_under(&prefix2).is_empty());
    let o = load(
        &h,
        &kube,
        &old,
        &prefix2,
        major,
        &["--allow-downgrade", "--dry-run"],
    );
    assert_ok(&o);
    assert!(String::from_utf8_lossy(&o.stderr)
        .contains("a DOWNGRADE to chart 1.7.0 (--allow-downgrade)"));
}

macro_rules! both_helms {
    ($($name:ident),* $(,)?) => {
        mod helm3 { $( #[test] fn $name() { super::$name(3) } )* }
        mod helm4 { $( #[test] fn $name() { super::$name(4) } )* }
    };
}
both_helms!(
    site_values_survive_an_upgrade,
    a_downgrade_is_refused_without_its_flag
);

/// The dry run of 1.7.0 → 1.8.0 lists what changes, object by object.
#[test]
fn the_dry_run_lists_what_an_upgrade_changes() {
    let (h, old, new, _) = two_versions();
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let prefix = unique_prefix("changes");
    assert_ok(&load(&h, &kube, &old, &prefix, 4, &[]));
    kube.forget_requests();
    let o = load(&h, &kube, &new, &prefix, 4, &["--dry-run"]);
    assert_ok(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    let registry = format!("{}/{prefix}", env().plain);
    for needle in [
        "changes  ".to_string(),
        "~ Deployment koordinator-system/koord-manager".to_string(),
        format!("image of manager: {registry}/koordinator-sh/koord-manager:v1.7.0@sha256:"),
        format!(" → {registry}/koordinator-sh/koord-manager:v1.8.0@sha256:"),
        "~ CustomResourceDefinition scheduleexplanations.scheduling.koordinator.sh".to_string(),
        "values   the release will hold (the release's values, then this run's over them):"
            .to_string(),
    ] {
        assert!(out.contains(&needle), "{needle:?} not in:\n{out}");
    }
    // Issue 42: what the cluster filled in (the chart copies it from the live objects with
    // `lookup`; the record of the first install does not have it) is not in the change list,
    // and is listed apart (before: a change of the webhook Service, its ServiceAccount and
    // its Secret, among the real ones).
    let (list, apart) = out
        .split_once("\nfilled   by the cluster, not changes")
        .unwrap_or_else(|| panic!("no list of fields the cluster filled in:\n{out}"));
    for hidden in [
        "spec.clusterIP",
        "ipFamilies",
        "~ Service koordinator-system/koordinator-webhook-service",
        "~ ServiceAccount koordinator-system/koord-manager",
        "~ Secret koordinator-system/koordinator-webhook-certs",
    ] {
        assert!(
            !list.contains(hidden),
            "{hidden:?} in the change list:\n{list}"
        );
    }
    for listed in [
        "Service koordinator-system/koordinator-webhook-service: spec.clusterIP, spec.clusterIPs[0], spec.ipFamilies[0], spec.ipFamilyPolicy, spec.type",
        "ServiceAccount koordinator-system/koord-manager: secrets",
        "Secret koordinator-system/koordinator-webhook-certs: data",
    ] {
        assert!(apart.contains(listed), "{listed:?} not in:\n{apart}");
    }
    assert!(
        list.contains("3 more differ only in fields the cluster fills in (listed apart)"),
        "{list}"
    );
    let o = load(&h, &kube, &new, &prefix, 4, &["--dry-run", "--json"]);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let changes = r["upgrade"]["changes"].as_array().unwrap();
    let svc = changes
        .iter()
        .find(|c| c["name"] == "koordinator-webhook-service")
        .unwrap();
    assert!(svc.get("details").is_none(), "{svc}");
    assert_eq!(svc["serverFilled"][0], "spec.clusterIP", "{svc}");
    assert!(
        changes.iter().any(|c| c["action"] == "change"
            && c["kind"] == "DaemonSet"
            && c["name"] == "koordlet"),
        "{changes:#?}"
    );
    assert!(kube.writes_of("koord-bundle/").is_empty() && kube.writes_of("Helm/").is_empty());
    // The dry run asked the API server (dryRun=All) for every object.
    let dry: Vec<Value> = kube
        .requests_of("koord-bundle/")
        .into_iter()
        .filter(|r| {
            r["verb"] == "patch"
                && r["requestURI"]
                    .as_str()
                    .unwrap_or("")
                    .contains("dryRun=All")
        })
        .collect();
    assert!(dry.len() > 40, "{}", dry.len());
}

/// A ScheduleExplanation of 1.7.0 that sets `spec.questionObjectReference`, which 1.8.0's
/// schema removes: the upgrade would drop that field, so it is refused before any push, naming
/// the object and the field (issue 42: before, a Warn, and the field lost on the next write
/// unless --strict); `--allow-field-loss` lets it through with a warning, and `--strict`
/// refuses it still.
#[test]
fn an_object_that_loses_a_field_is_named_before_the_upgrade() {
    let (h, old, new, _) = two_versions();
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let prefix = unique_prefix("prune");
    assert_ok(&load(&h, &kube, &old, &prefix, 4, &[]));
    kube.kubectl(&["create", "namespace", "team-a"]);
    kube.seed(json!({"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "ScheduleExplanation",
        "metadata": {"name": "why-pending", "namespace": "team-a"},
        "spec": {"questionObjectReference": {"kind": "Pod", "namespace": "team-a", "name": "web-0"}}}));
    let named = "[crd-objects] CRD scheduleexplanations.scheduling.koordinator.sh (ScheduleExplanation v1alpha1): 1 of 1 object(s) do not fit the new schema: 1 lose spec.questionObjectReference";
    let o = load(&h, &kube, &new, &prefix, 4, &["--dry-run"]);
    assert_fails(
        &o,
        1,
        &[
            named,
            "team-a/why-pending",
            "--allow-field-loss",
            "nothing was pushed",
        ],
    );
    let o = load(
        &h,
        &kube,
        &new,
        &prefix,
        4,
        &["--dry-run", "--allow-field-loss"],
    );
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(named) && err.contains("team-a/why-pending"),
        "{err}"
    );
    // 1.7.0 → 1.8.0 drops some fields of ScheduleExplanation and adds others: not a downgrade.
    assert!(!err.contains("crd-downgrade"), "{err}");
    let prefix2 = unique_prefix("prune2");
    for extra in [&["--strict", "--allow-field-loss"][..], &[][..]] {
        let o = load(&h, &kube, &new, &prefix2, 4, extra);
        assert_fails(&o, 1, &["team-a/why-pending", "nothing was pushed"]);
    }
    assert!(repos_under(&prefix2).is_empty());
    assert_eq!(
        kube.releases("default").last().unwrap().2,
        "1",
        "not upgraded"
    );
}

/// Issue 42: 1.8.0 installed, then `helm uninstall` (the CRDs are kept), and a Reservation
/// that sets `spec.preAllocationPolicy`, a field 1.8.0's CRD has and 1.7.0's does not. A load
/// of 1.7.0 is no upgrade of a release (there is none), but it replaces the CRDs with older
/// ones: named a CRD DOWNGRADE, and the Reservation that would lose its field refused before
/// any push, in the dry run and the real run, the cluster unchanged (before: "a fresh
/// install", a Warn, and the field dropped on the next write). With --allow-field-loss the
/// dry run passes, saying the same.
#[test]
fn an_older_chart_over_newer_crds_without_a_release_is_a_crd_downgrade() {
    let (h, old, new, _) = two_versions();
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let prefix = unique_prefix("crddown");
    assert_ok(&load(&h, &kube, &new, &prefix, 4, &[]));
    assert_ok(&kube.helm(4, &["uninstall", RELEASE, "-n", "default"]));
    kube.wait_namespaces_finalized();
    assert!(kube.releases("default").is_empty());
    kube.seed(
        json!({"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation",
        "metadata": {"name": "for-web"},
        "spec": {"owners": [{"object": {"name": "web-0", "namespace": "default"}}],
            "template": {"spec": {"containers": [{"name": "web", "image": "nginx"}]}},
            "preAllocationPolicy": {"mode": "Default", "enableMultiple": true}}}),
    );
    let crd = "reservations.scheduling.koordinator.sh";
    let snapshot = |k: &Cluster| {
        k.resource_versions(&[
            ("crd", None),
            ("reservations", None),
            ("secrets", Some("default")),
        ])
    };
    let before = snapshot(&kube);
    let prefix2 = unique_prefix("crddown2");
    for extra in [&["--dry-run"][..], &[][..]] {
        let o = load(&h, &kube, &old, &prefix2, 4, extra);
        assert_fails(
            &o,
            1,
            &[
                // A Warn is printed as a warning, a Fail as an error (issue 42: a Fail was
                // "warning: pre-flight Fail [...]").
                &format!("\nwarning: pre-flight WARN [crd-downgrade] CRD {crd}: a CRD DOWNGRADE: the CRD in the cluster has 1 field(s) that the chart's does not (spec.preAllocationPolicy)"),
                &format!("\nerror: pre-flight FAIL [crd-objects] CRD {crd} (Reservation v1alpha1), replaced by an older definition (a CRD DOWNGRADE): 1 of 1 object(s) do not fit the new schema: 1 lose spec.preAllocationPolicy"),
                "for-web",
                "--allow-field-loss",
                "nothing was pushed",
            ],
        );
    }
    assert!(repos_under(&prefix2).is_empty());
    assert_eq!(snapshot(&kube), before, "the cluster is unchanged");
    let r = kube.get("reservation", None, "for-web").unwrap();
    assert_eq!(r["spec"]["preAllocationPolicy"]["enableMultiple"], true);
    let o = load(
        &h,
        &kube,
        &old,
        &prefix2,
        4,
        &["--dry-run", "--allow-field-loss"],
    );
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("[crd-downgrade] CRD {crd}: a CRD DOWNGRADE"))
            && err.contains("for-web"),
        "{err}"
    );
}

/// NodeResourceTopology objects stored as v1alpha1 (chart 1.6.0), and a chart built here from
/// 1.8.0 whose NodeResourceTopology CRD no longer has v1alpha1: the pre-flight fails before any
/// push, naming the CRD, the version, the objects and the migration; the cluster is unchanged.
#[test]
fn a_chart_that_drops_a_stored_version_fails_before_any_push() {
    let h = Home::with_key();
    let (old, _) = h.build_plain("1.6.0", &[]);
    let chart = dropping_chart(&h);
    let (bad, _) = {
        let out = h.path().join("koordinator-1.8.1.tar");
        let o = h.build("1.8.1").chart(&chart).out(&out).arg("--json").run();
        assert_ok(&o);
        (out, ())
    };
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let prefix = unique_prefix("stored");
    assert_ok(&load(&h, &kube, &old, &prefix, 4, &[]));
    kube.seed(
        json!({"apiVersion": "topology.node.k8s.io/v1alpha1", "kind": "NodeResourceTopology",
        "metadata": {"name": "cp-1"}, "topologyPolicies": ["None"], "zones": []}),
    );
    let crd = "noderesourcetopologies.topology.node.k8s.io";
    let live = kube.get("crd", None, crd).unwrap();
    assert_eq!(live["status"]["storedVersions"], json!(["v1alpha1"]));
    let snapshot =
        |k: &Cluster| k.resource_versions(&[("crd", None), ("secrets", Some("default"))]);
    let before = snapshot(&kube);
    let prefix2 = unique_prefix("stored2");
    for extra in [&["--dry-run"][..], &[][..]] {
        let o = load(&h, &kube, &bad, &prefix2, 4, extra);
        assert_fails(&o, 1, &[
            &format!("[crd-stored-versions] CRD {crd}: version v1alpha1 is among its stored versions (status.storedVersions: v1alpha1), with 1 object(s) in the cluster, but the new CRD no longer has it (versions: v1alpha2)"),
            "first install a chart version whose CRD serves both v1alpha1 and v1alpha2",
            "kubectl replace -f -",
            "--subresource=status",
            "nothing was pushed",
        ]);
    }
    assert!(repos_under(&prefix2).is_empty());
    assert_eq!(snapshot(&kube), before, "the cluster is unchanged");
}

/// The bundle of `chart` (a [`repackaged`] 1.8.1), built into `h`.
fn bundle_of(h: &Home, chart: &Path) -> PathBuf {
    let bundle = h.path().join("koordinator-1.8.1.tar");
    assert_ok(&h.build("1.8.1").chart(chart).out(&bundle).run());
    bundle
}

/// chart 1.8.0 as 1.8.1, its NodeResourceTopology CRD without v1alpha1 (`helm package`).
fn dropping_chart(h: &Home) -> PathBuf {
    repackaged(h, |dir| {
        let crd = dir.join("templates/crd/topology.node.k8s.io_noderesourcetopologies.yaml");
        let text = std::fs::read_to_string(&crd).unwrap();
        let (a, b) = (
            text.find("    - name: v1alpha1\n").expect("v1alpha1"),
            text.find("    - name: v1alpha2\n").expect("v1alpha2"),
        );
        std::fs::write(&crd, format!("{}{}", &text[..a], &text[b..])).unwrap();
    })
}

/// chart 1.8.0 as 1.8.1 (`helm package`), changed by `edit` (given the chart's folder).
fn repackaged(h: &Home, edit: impl FnOnce(&Path)) -> PathBuf {
    let src = h.path().join("chart-src");
    std::fs::create_dir(&src).unwrap();
    assert_ok(&tool(
        "tar",
        &[
            "xzf",
            fixtures().join("koordinator-1.8.0.tgz").to_str().unwrap(),
            "-C",
            src.to_str().unwrap(),
        ],
        h.path(),
    ));
    let dir = src.join("koordinator");
    edit(&dir);
    let meta = dir.join("Chart.yaml");
    let text = std::fs::read_to_string(&meta)
        .unwrap()
        .replace("version: 1.8.0", "version: 1.8.1");
    std::fs::write(&meta, text).unwrap();
    let o = std::process::Command::new(&env().helm3)
        .args([
            "package",
            dir.to_str().unwrap(),
            "-d",
            h.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_ok(&o);
    h.path().join("koordinator-1.8.1.tgz")
}

/// Issue 42: an image of the bundle named outside a container's `image` field (a ConfigMap,
/// a container's env, a hook) is not pinned by the post-renderer nor seen by the check of the
/// rendered images. load names each (object, path) as a warning, and `--strict` refuses the
/// rendering before any push.
#[test]
fn images_named_outside_container_image_fields_are_reported_and_refused_under_strict() {
    let h = Home::with_key();
    let chart = repackaged(&h, |dir| {
        std::fs::write(
            dir.join("templates/site-extra.yaml"),
            r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: site-sidecars
  namespace: {{ .Values.installation.namespace }}
data:
  config: |
    sidecar: {{ .Values.imageRepositoryHost }}/{{ .Values.manager.image.repository }}:{{ .Values.manager.image.tag }}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: site-hook
  namespace: {{ .Values.installation.namespace }}
  annotations:
    "helm.sh/hook": pre-install,pre-upgrade
data:
  image: "{{ .Values.imageRepositoryHost }}/{{ .Values.koordlet.image.repository }}@sha256:0000000000000000000000000000000000000000000000000000000000000000"
"#,
        )
        .unwrap();
    });
    let bundle = bundle_of(&h, &chart);
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let prefix = unique_prefix("mention");
    let registry = format!("{}/{prefix}", env().plain);
    let o = load(&h, &kube, &bundle, &prefix, 4, &["--dry-run"]);
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    for want in [
        format!("warning: pre-flight WARN [image-outside-containers] ConfigMap koordinator-system/site-sidecars data.config: \"{registry}/koordinator-sh/koord-manager:v1.8.0\" names the bundle's image koordinator-sh/koord-manager:v1.8.0 outside a container's image field"),
        format!("ConfigMap koordinator-system/site-hook data.image: \"{registry}/koordinator-sh/koordlet@sha256:0000000000000000000000000000000000000000000000000000000000000000\" names the bundle's image koordinator-sh/koordlet:v1.8.0"),
        "pass --strict to refuse".to_string(),
    ] {
        assert!(err.contains(&want), "{want}\nnot in:\n{err}");
    }
    for extra in [&["--dry-run", "--strict"][..], &["--strict"][..]] {
        let o = load(&h, &kube, &bundle, &prefix, 4, extra);
        assert_fails(
            &o,
            1,
            &[
                "pre-flight FAIL [image-outside-containers] ConfigMap koordinator-system/site-sidecars data.config",
                "--strict: the rendered chart names images of the bundle unpinned, outside a container's image field or by their tag (above): nothing was pushed",
            ],
        );
    }
    assert!(repos_under(&prefix).is_empty());
    assert!(kube.releases("default").is_empty());
}

/// A hook's container image: helm 4 post-renders hooks, so it is pinned to the bundle's digest
/// and nothing is said; helm 3 does not (helm/helm#7891), so the rendering names the image by
/// its tag although pinning is on: a Warn naming it, a Fail under `--strict` (before: no word,
/// the tag form passed the check of the rendered images).
#[test]
fn a_hook_image_that_helm_3_leaves_unpinned_is_said() {
    let h = Home::with_key();
    let chart = repackaged(&h, |dir| {
        std::fs::write(
            dir.join("templates/site-hook-job.yaml"),
            r#"apiVersion: batch/v1
kind: Job
metadata:
  name: site-check
  namespace: {{ .Values.installation.namespace }}
  annotations:
    "helm.sh/hook": pre-install,pre-upgrade
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: check
          image: "{{ .Values.imageRepositoryHost }}/{{ .Values.manager.image.repository }}:{{ .Values.manager.image.tag }}"
"#,
        )
        .unwrap();
    });
    let bundle = bundle_of(&h, &chart);
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let prefix = unique_prefix("hookpin");
    let registry = format!("{}/{prefix}", env().plain);
    let said = format!("[image-not-pinned] image {registry}/koordinator-sh/koord-manager:v1.8.0: the rendered release names it by its tag, not pinned to the bundle's digest");
    let o = load(&h, &kube, &bundle, &prefix, 4, &["--dry-run"]);
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.contains("image-not-pinned"),
        "helm 4 pins hooks:\n{err}"
    );
    let o = load(&h, &kube, &bundle, &prefix, 3, &["--dry-run"]);
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("pre-flight WARN {said}")),
        "{said}\nnot in:\n{err}"
    );
    let o = load(&h, &kube, &bundle, &prefix, 3, &["--dry-run", "--strict"]);
    assert_fails(
        &o,
        1,
        &[
            &format!("pre-flight FAIL {said}"),
            "--strict: the rendered chart names images of the bundle unpinned",
        ],
    );
    // --no-pin installs by tag on purpose: nothing to say.
    let o = load(&h, &kube, &bundle, &prefix, 3, &["--dry-run", "--no-pin"]);
    assert_ok(&o);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("image-not-pinned"));
    assert!(repos_under(&prefix).is_empty());
}

/// A cluster with no nodes yet: whether the bundle has images for their architectures cannot
/// be told, a Fail naming `--skip-check node-arch` (before: a warning, and the install went
/// on); with that flag a warning says the check was skipped, and the load goes on. A value
/// `--skip-check` does not know is a usage error.
#[test]
fn a_cluster_with_no_nodes_cannot_be_told_unless_the_check_is_skipped() {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.8.0", &[]);
    let kube = cluster::lease();
    let prefix = unique_prefix("nonodes");
    let o = load(&h, &kube, &bundle, &prefix, 4, &["--dry-run"]);
    assert_fails(
        &o,
        1,
        &[
            "pre-flight FAIL [node-arch] the cluster has no nodes yet: whether the bundle has images for their architectures, and their kernels and runtimes, cannot be told",
            "pass --skip-check node-arch to go on without this check",
            "nothing was pushed",
        ],
    );
    let o = load(
        &h,
        &kube,
        &bundle,
        &prefix,
        4,
        &["--dry-run", "--skip-check", "node-arch", "--json"],
    );
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("pre-flight WARN [node-arch] the cluster has no nodes yet")
            && err.contains("(not checked: --skip-check node-arch)"),
        "{err}"
    );
    let o = load(&h, &kube, &bundle, &prefix, 4, &["--skip-check", "nodes"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(repos_under(&prefix).is_empty());
}

/// A value that makes a Deployment invalid (replicas -1): helm renders it, the API server
/// refuses it in the dry run; exit 1 naming the object, nothing pushed, nothing written.
#[test]
fn a_value_that_makes_a_deployment_invalid_is_refused_by_the_api_server_first() {
    let b = Built::new();
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let prefix = unique_prefix("invalid");
    for extra in [&["--dry-run"][..], &[][..]] {
        let mut args = vec!["--set", "manager.replicas=-1"];
        args.extend(extra);
        let o = load(&b.home, &kube, &b.bundle, &prefix, 4, &args);
        assert_fails(&o, 1, &[
            "[server-dry-run] the API server refuses Deployment koordinator-system/koord-manager",
            "spec.replicas",
            "nothing was pushed",
        ]);
    }
    assert!(repos_under(&prefix).is_empty());
    assert!(
        kube.writes_of("koord-bundle/").is_empty() && kube.writes_of("Helm/").is_empty(),
        "{:#?}",
        kube.request_lines()
    );
    assert!(kube.releases("default").is_empty());
}

/// `helm uninstall` keeps the CRDs `load` installed, and every object of theirs; with
/// `--no-keep-crds` (the chart as it is) it deletes them all, as it always did.
#[test]
fn uninstall_keeps_the_crds_and_their_objects() {
    let b = Built::new();
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let prefix = unique_prefix("keepcrd");
    assert_ok(&load(&b.home, &kube, &b.bundle, &prefix, 4, &[]));
    let crd = kube
        .get("crd", None, "nodeslos.slo.koordinator.sh")
        .unwrap();
    assert_eq!(
        crd["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    let objects = json!([
        {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": "cp-1"}, "spec": {}},
        {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota", "metadata": {"name": "team-a", "namespace": "default"}, "spec": {"max": {"cpu": "10"}}},
    ]);
    kube.seed(objects.clone());
    assert_ok(&kube.helm(4, &["uninstall", RELEASE, "-n", "default"]));
    kube.wait_namespaces_finalized();
    assert_eq!(kube.names("crd", None).len(), 13, "the CRDs are kept");
    assert!(kube.get("nodeslo", None, "cp-1").is_some());
    assert!(kube
        .get("elasticquota", Some("default"), "team-a")
        .is_some());
    assert!(kube.releases("default").is_empty());
    // Installed again: the kept CRDs are the release's again.
    assert_ok(&load(&b.home, &kube, &b.bundle, &prefix, 4, &[]));
    assert!(kube
        .get("elasticquota", Some("default"), "team-a")
        .is_some());
    // The chart as it is: uninstall takes the CRDs and their objects with it.
    assert_ok(&load(
        &b.home,
        &kube,
        &b.bundle,
        &prefix,
        4,
        &["--no-keep-crds"],
    ));
    assert_ok(&kube.helm(4, &["uninstall", RELEASE, "-n", "default"]));
    wait_until(
        "the CRDs to be deleted",
        std::time::Duration::from_secs(120),
        || kube.names("crd", None).is_empty(),
    );
}

/// 1.6.0 → 1.7.0 moves NodeResourceTopology's stored version from v1alpha1 to v1alpha2: said,
/// with what to run before a later chart drops v1alpha1.
#[test]
fn a_stored_version_change_is_said_with_what_to_run_later() {
    let h = Home::with_key();
    let (old, _) = h.build_plain("1.6.0", &[]);
    let (new, _) = h.build_plain("1.7.0", &[]);
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let prefix = unique_prefix("storage");
    assert_ok(&load(&h, &kube, &old, &prefix, 4, &[]));
    kube.seed(
        json!({"apiVersion": "topology.node.k8s.io/v1alpha1", "kind": "NodeResourceTopology",
        "metadata": {"name": "cp-1"}, "topologyPolicies": ["None"], "zones": []}),
    );
    let o = load(&h, &kube, &new, &prefix, 4, &[]);
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("[crd-storage-version] CRD noderesourcetopologies.topology.node.k8s.io: the stored version changes from v1alpha1 to v1alpha2: its 1 existing object(s) stay stored as v1alpha1")
            && err.contains("before a later chart drops v1alpha1"),
        "{err}"
    );
    let crd = kube
        .get("crd", None, "noderesourcetopologies.topology.node.k8s.io")
        .unwrap();
    assert_eq!(
        crd["status"]["storedVersions"],
        json!(["v1alpha1", "v1alpha2"])
    );
}

/// `REGISTRY/REF` → `REGISTRY/REF@DIGEST` of every image the bundle carries.
fn pinned_refs(bundle: &Path, registry: &str) -> std::collections::BTreeMap<String, String> {
    bundle_manifest(bundle)["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let r = format!("{registry}/{}", i["ref"].as_str().unwrap());
            let pinned = format!("{r}@{}", i["digest"].as_str().unwrap());
            (r, pinned)
        })
        .collect()
}

/// Issue 42: what load did to each image is in `load --json` (`images`), not predicted in the
/// bundle's BOM: the dry run renders every image pinned and pushes nothing; a real run with
/// `--no-pin` pushes each (`pushedAs` its digest) and installs it by tag, `pinned: false`, as the
/// cluster's workloads show. (The BOM said `installedAs: REF@DIGEST` whatever load did.)
#[test]
fn load_json_says_per_image_what_load_did() {
    let b = Built::new();
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let prefix = unique_prefix("json");
    let registry = format!("{}/{prefix}", env().plain);
    let want = pinned_refs(&b.bundle, &registry);
    let images = |o: &std::process::Output| -> Vec<Value> {
        assert_ok(o);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        let images = v["images"].as_array().unwrap().clone();
        assert_eq!(images.len(), want.len(), "{v}");
        images
    };
    let tag_of = |i: &Value| format!("{registry}/{}", i["ref"].as_str().unwrap());
    let dry = images(&load(
        &b.home,
        &kube,
        &b.bundle,
        &prefix,
        4,
        &["--dry-run", "--json"],
    ));
    let mut rendered = 0;
    for i in &dry {
        let tag = tag_of(i);
        assert_eq!(i.get("pushedAs"), None, "{i}");
        assert_eq!(i.get("installedAs"), None, "{i}");
        let names = i["renderedAs"].as_array().unwrap();
        if names.is_empty() {
            assert_eq!(i["pinned"], false, "{i}");
            continue;
        }
        rendered += 1;
        assert_eq!(names, &vec![json!(want[&tag])], "{i}");
        assert_eq!(i["pinned"], true, "{i}");
    }
    assert!(rendered >= 4, "{dry:?}");
    let done = images(&load(
        &b.home,
        &kube,
        &b.bundle,
        &prefix,
        4,
        &["--no-pin", "--json"],
    ));
    let running: Vec<String> = kube
        .containers(CHART_NS)
        .into_iter()
        .map(|(_, _, image, _)| image)
        .collect();
    let mut installed = 0;
    for i in &done {
        let tag = tag_of(i);
        assert_eq!(i["pushedAs"], json!(want[&tag]), "{i}");
        assert_eq!(i["pinned"], false, "{i}");
        let names = i["renderedAs"].as_array().unwrap();
        if names.is_empty() {
            assert_eq!(i.get("installedAs"), None, "{i}");
            continue;
        }
        installed += 1;
        assert_eq!(names, &vec![json!(tag)], "{i}");
        assert_eq!(i["installedAs"], json!(tag), "{i}");
        assert!(running.contains(&tag), "{tag} not among {running:?}");
    }
    assert!(installed >= 4, "{done:?}");
}

/// Every container `load` installs runs `REF@<the bundle's top manifest digest>`, pulled
/// `IfNotPresent` (the chart says `Always`); the dry run shows the references. A tag pushed
/// again with other bytes in the registry changes nothing the release names, also after its
/// pods are restarted. An upgrade to 1.8.0 pins its own digests and keeps the site's values.
/// `--no-pin` installs by tag, with the chart's policy. (Before: `image: …/koordlet:v1.7.0`,
/// `imagePullPolicy: Always`: whoever can push to the registry decided what ran.)
#[test]
fn images_are_pinned_to_the_bundles_digests() {
    let (h, old, new, values) = two_versions();
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let prefix = unique_prefix("pin");
    let registry = format!("{}/{prefix}", env().plain);
    let want = pinned_refs(&old, &registry);
    let o = load(&h, &kube, &old, &prefix, 3, &["--dry-run"]);
    assert_ok(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("each pinned to the bundle's digest"), "{out}");
    let o = load(
        &h,
        &kube,
        &old,
        &prefix,
        3,
        &["--values", values.to_str().unwrap()],
    );
    assert_ok(&o);
    let running = kube.containers(CHART_NS);
    assert!(running.len() >= 4, "{running:?}");
    for (w, c, image, policy) in &running {
        assert!(
            want.values().any(|p| p == image),
            "{w} container {c} runs {image}, not a reference pinned to the bundle's digest ({want:?})"
        );
        assert!(
            out.contains(&format!("  {image}\n")),
            "the dry run did not show {image}:\n{out}"
        );
        assert_eq!(policy, "IfNotPresent", "{w} {c}");
    }
    // Another image pushed under koord-manager's tag: the registry's tag moves, the release
    // still names the bundle's digest, also after a restart of its pods.
    let tag = format!("{registry}/koordinator-sh/koord-manager:v1.7.0");
    let other = format!("{registry}/koordinator-sh/koord-scheduler:v1.7.0");
    let plain = Skopeo::plain_http();
    let mut args = vec!["copy".to_string()];
    args.extend(plain.flags("src-"));
    args.extend(plain.flags("dest-"));
    args.extend([
        "--all".into(),
        format!("docker://{other}"),
        format!("docker://{tag}"),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let c = tool("skopeo", &args, h.path());
    assert!(c.status.success(), "{c:?}");
    assert_ne!(
        format!(
            "{tag}@{}",
            sha256(&skopeo_raw(&format!("docker://{tag}"), &plain))
        ),
        want[&tag],
        "the tag did not move"
    );
    kube.kubectl(&[
        "-n", CHART_NS, "patch", "deployment", "koord-manager", "--type=merge", "-p",
        r#"{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":"now"}}}}}"#,
    ]);
    assert!(
        kube.containers(CHART_NS)
            .iter()
            .any(|(w, _, image, _)| w == "Deployment koord-manager" && image == &want[&tag]),
        "{:?}",
        kube.containers(CHART_NS)
    );
    // The upgrade pins 1.8.0's digests, and the site's values stay.
    let want_new = pinned_refs(&new, &registry);
    assert_ok(&load(&h, &kube, &new, &prefix, 3, &[]));
    for (w, c, image, policy) in kube.containers(CHART_NS) {
        assert!(want_new.values().any(|p| p == &image), "{w} {c}: {image}");
        assert_eq!(policy, "IfNotPresent");
    }
    assert_site_values(&release_values(&kube, 3));
    // --no-pin: by tag, the chart's policy.
    assert_ok(&load(&h, &kube, &new, &prefix, 3, &["--no-pin"]));
    let unpinned = kube.containers(CHART_NS);
    assert!(
        unpinned.iter().all(|(_, _, image, _)| !image.contains('@')),
        "{unpinned:?}"
    );
    assert!(
        unpinned.iter().any(|(_, _, _, policy)| policy == "Always"),
        "{unpinned:?}"
    );
}

/// The pods of `namespace` (JSON), once the controller manager has made at least `n`.
fn pods_of(kube: &Cluster, namespace: &str, n: usize) -> Vec<Value> {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(90);
    // At least `n`, and the same count for 3 s: the controller manager makes a workload's
    // replicas one after another, and a pod made after the statuses are written is "not
    // started" (seen once: a second replica listed after the first was).
    let (mut last, mut since) = (usize::MAX, std::time::Instant::now());
    loop {
        let out = kube.kubectl(&["-n", namespace, "get", "pods", "-o", "json"]);
        let items = serde_json::from_str::<Value>(&out).unwrap()["items"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if items.len() != last {
            (last, since) = (items.len(), std::time::Instant::now());
        }
        let settled = since.elapsed() >= std::time::Duration::from_secs(3);
        if items.len() >= n && settled || std::time::Instant::now() > until {
            return items;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

/// `verify --cluster` on the real control plane: pods whose containers have not started are
/// named as such, and the check could not tell (exit 4; before issue 42: exit 0); with
/// statuses written as a kubelet writes them, `imageID` the bundle's digest, every container is
/// OK (exit 0) and the verdict line says so; one pod running another digest fails the check
/// (exit 1), naming the pod and both digests, in text and in `--json`. `kubectl set image` of
/// koord-manager's container to another repository is NOT BUNDLED and fails (exit 1; before
/// issue 42: exit 0), naming the image expected and the one found.
#[test]
fn the_cluster_is_checked_against_the_bundle() {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.7.0", &[]);
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let prefix = unique_prefix("audit");
    assert_ok(&load(&h, &kube, &bundle, &prefix, 3, &[]));
    let deployments = kube.names("Deployment", Some(CHART_NS)).len();
    assert!(deployments >= 3, "{deployments}");
    let pods = pods_of(&kube, CHART_NS, deployments);
    assert!(
        pods.len() >= deployments,
        "the controller manager made no pods: {pods:?}"
    );
    let verify = |extra: &[&str]| {
        let mut args = vec![
            "verify",
            bundle.to_str().unwrap(),
            "--cluster",
            "--kubeconfig",
            kube.kubeconfig.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        h.run(&args)
    };
    // Not started: named, and "could not tell" (exit 4).
    let o = verify(&[]);
    assert_fails(&o, 4, &["NOT STARTED): COULD NOT TELL"]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        out.contains("NOT STARTED") && !out.contains("DIFFERS"),
        "{out}"
    );
    // Running the bundle's digests (the pinned reference's digest, as the node reports it).
    let carried = |image: &str| {
        let (name, digest) = image.split_once('@').expect("a pinned reference");
        let repo = name.rsplit_once(':').map_or(name, |(r, _)| r);
        format!("{repo}@{digest}")
    };
    for p in &pods {
        kube.write_pod_status(p, &carried);
    }
    let o = verify(&[]);
    assert_ok(&o);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        out.contains("OK ") && !out.contains("NOT STARTED") && !out.contains("DIFFERS"),
        "{out}"
    );
    let verdict = out.lines().last().unwrap_or_default().to_string();
    assert!(
        verdict.starts_with("verdict    ") && verdict.ends_with("containers verified: VERIFIED"),
        "{out}"
    );
    let o = verify(&["--json"]);
    assert_ok(&o);
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    let containers = j["cluster"]["containers"].as_array().unwrap();
    assert!(containers.len() >= pods.len(), "{j}");
    assert!(
        containers
            .iter()
            .all(|c| c["verdict"] == "carried" && c["specPinned"] == true),
        "{j}"
    );
    // One pod runs another digest (a tag re-pushed, and the pod pulled by tag).
    let other = format!("sha256:{}", "e".repeat(64));
    let victim = &pods[0];
    let victim_name = victim["metadata"]["name"].as_str().unwrap().to_string();
    kube.write_pod_status(victim, &|image: &str| {
        let repo = image.split('@').next().unwrap();
        format!("{repo}@{other}")
    });
    let want = carried(victim["spec"]["containers"][0]["image"].as_str().unwrap());
    let want_digest = want.split_once('@').unwrap().1;
    let o = verify(&[]);
    let err = assert_fails(
        &o,
        1,
        &[
            "the release does not run what the bundle carries",
            "1 DIFFERS",
        ],
    );
    assert!(
        err.contains(&victim_name) && err.contains(&other) && err.contains(want_digest),
        "the pod and both digests are named: {err}"
    );
    let o = verify(&["--json"]);
    assert_eq!(o.status.code(), Some(1));
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["ok"], false);
    assert!(
        j["cluster"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["verdict"] == "differs" && c["running"] == other.as_str()),
        "{j}"
    );
    assert_eq!(j["cluster"]["verdict"]["outcome"], "failed", "{j}");
    // Back to the bundle's digest; then koord-manager's container swapped for an image of
    // another repository, as `kubectl set image` does: the new ReplicaSet's pod is NOT BUNDLED
    // (also before it starts, and after), named with the image the release renders for it.
    kube.write_pod_status(victim, &carried);
    assert_ok(&verify(&[]));
    kube.kubectl(&[
        "-n",
        CHART_NS,
        "set",
        "image",
        "deploy/koord-manager",
        "manager=evil.example/x:1",
    ]);
    let evil_pod = || {
        pods_of(&kube, CHART_NS, pods.len() + 1)
            .into_iter()
            .find(|p| p["spec"]["containers"][0]["image"] == "evil.example/x:1")
            .expect("the controller manager made a pod of the new template")
    };
    let evil = evil_pod();
    let o = verify(&[]);
    eprintln!(
        "verify --cluster after `kubectl set image` (exit {:?}):\n{}{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let err = assert_fails(&o, 1, &["NOT BUNDLED): FAILED", "evil.example/x:1"]);
    assert!(
        err.contains(evil["metadata"]["name"].as_str().unwrap()),
        "{err}"
    );
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        out.contains(": expected koordinator-sh/koord-manager:v1.7.0@sha256:")
            && out.contains(", found evil.example/x:1 (running -)"),
        "{out}"
    );
    kube.write_pod_status(&evil, &|_| {
        format!("evil.example/x@sha256:{}", "d".repeat(64))
    });
    let o = verify(&["--json"]);
    assert_eq!(o.status.code(), Some(1));
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["ok"], false);
    assert!(
        j["cluster"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["verdict"] == "not-bundled"
                && c["spec"] == "evil.example/x:1"
                && c["expected"]
                    .as_str()
                    .is_some_and(|e| e.starts_with("koordinator-sh/koord-manager:v1.7.0@sha256:"))),
        "{j}"
    );
}
