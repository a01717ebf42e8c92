//! Checks made against the target cluster before installing the chart, read-only, after the
//! Koordinator compatibility notes and Helm's install rules. Reading the cluster (`read`) is
//! apart from judging it: each check is a pure rule over the typed objects read (k8s-openapi's
//! `Node`, `Namespace`, `CustomResourceDefinition`, `Secret`, version `Info`), one file per
//! check (`version`, `nodes`, `platform`, `release`, `crds`, `namespace`), each
//! unit-tested on typed objects without a server.
//!
//! | check | reads | finds |
//! |---|---|---|
//! | `server-version` | `GET /version` | below 1.18: Fail; 1.18–1.23: Warn (koord-scheduler needs compatibility feature gates there) |
//! | `node-arch` | `GET /api/v1/nodes` | a node architecture the bundle has no images for: Fail |
//! | `kernel` | the same | Linux older than 4.19: Warn |
//! | `containerd` | the same | containerd 1.7+: NRI mode available (Info); else not (Info) |
//! | `crd-ownership` | `GET .../customresourcedefinitions/<name>` per chart CRD | unowned (ACK): Warn + `crds.<key>=false`, or Fail in strict mode; another release's: Fail |
//! | `namespace` | `GET /api/v1/namespaces/<ns>` (release and chart namespaces) | the chart's namespace exists without Helm ownership: Fail with the kubectl commands that adopt it; the release namespace is missing: created by helm, unless it is the chart's own |
//! | `release` | Helm's release Secrets in the release namespace, then in every namespace | an existing release (upgrade, where it lives), or one stuck in a pending state (Fail) |
//! | `platform` | node `providerID`s and labels, kubelet `/configz`, DaemonSets | kind with a kubelet `cgroupRoot` other than `/` (Fail, with the guide's kind config); EKS with a custom CNI (koord-manager on the host network) |
//!
//! # Release namespace and chart namespace
//!
//! Koordinator's install guide installs the release into `default` (`helm install koordinator
//! koordinator-sh/koordinator`); the chart renders its own `koordinator-system` Namespace and puts
//! every namespaced object there. Helm's first write is the release record, a Secret in the
//! release namespace: a release namespace of `koordinator-system` fails on a fresh cluster with
//! 404 `namespaces "koordinator-system" not found`, and with `--create-namespace` helm 3's create
//! of the chart's own Namespace object then conflicts (409; helm 4, which applies server-side,
//! gets through: `install::helm{3,4}::old_namespace_choice` shows both). So the release namespace is `default` unless the user names
//! another one, and a release of the same name found in another namespace (installed there
//! before) is upgraded where it is rather than installed a second time.
//!
//! Tested against the real control plane of the test environment, with nodes and CRDs shaped
//! on real clusters (`tests/fixtures/kube/`), and against the read-only fake API server of
//! `tests/kube-fake/` for what a real one cannot be made to answer (see `super`).
//!
//! Every list read is bounded (pages, bytes, time, repeated `continue` tokens: [`super::list`]).

mod crds;
mod namespace;
mod nodes;
mod ownership;
mod platform;
mod read;
mod release;
mod version;

pub use nodes::NodeInfo;

use super::client::KubeClient;
use super::ClusterError;
use serde::Serialize;
use std::fmt;

/// Check name: the API server's version.
pub const CHECK_SERVER_VERSION: &str = "server-version";
/// Check name: node architectures against the bundle's platforms.
pub const CHECK_NODE_ARCH: &str = "node-arch";
/// Check name: node kernel versions.
pub const CHECK_KERNEL: &str = "kernel";
/// Check name: container runtime (NRI availability).
pub const CHECK_CONTAINERD: &str = "containerd";
/// Check name: ownership of existing chart CRDs.
pub const CHECK_CRD_OWNERSHIP: &str = "crd-ownership";
/// Check name: the install namespace.
pub const CHECK_NAMESPACE: &str = "namespace";
/// Check name: an existing Helm release.
pub const CHECK_RELEASE: &str = "release";
/// Check name: what the platform (kind, EKS) needs.
pub const CHECK_PLATFORM: &str = "platform";

/// The kind cluster configuration of Koordinator's install guide: kubelet's cgroup root `/`.
pub const KIND_CLUSTER_CONFIG: &str = r#"kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
- role: control-plane
  kubeadmConfigPatches:
  - |
    kind: InitConfiguration
    nodeRegistration:
      kubeletExtraArgs:
        cgroup-root: "/"
  - |
    kind: KubeletConfiguration
    cgroupRoot: /"#;

/// Node names listed in one finding before "and N more".
const MAX_NAMES: usize = 5;

/// What the checks need to know about the bundle and the planned install.
#[derive(Debug, Clone, Copy)]
pub struct PreflightInput<'a> {
    /// Platforms the bundle has images for, union over its images (`linux/amd64`, `linux/arm64`).
    pub bundle_platforms: &'a [String],
    /// The CRDs the chart will render (leave out those already switched off).
    pub crds: &'a [ChartCrd],
    /// Helm release namespace (`default`, as Koordinator's guide installs it).
    pub namespace: &'a str,
    /// The user named the release namespace (`--namespace`): a release of the same name in
    /// another namespace is then a conflict, not followed.
    pub namespace_explicit: bool,
    /// The namespace the chart creates and installs its objects into (`koordinator-system`).
    pub chart_namespace: &'a str,
    /// Helm release name (`koordinator`).
    pub release: &'a str,
    /// Refuse conflicts instead of working around them (unowned CRDs switched off, EKS custom
    /// CNI on the host network).
    pub strict: bool,
    /// koord-manager is put on the host network anyway (`--host-network`).
    pub host_network: bool,
    /// The bundle's chart version (`1.8.0`): an existing release of a newer chart makes this
    /// a downgrade.
    pub chart_version: &'a str,
    /// A downgrade is allowed (`--allow-downgrade`).
    pub allow_downgrade: bool,
}

/// One CRD of the chart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChartCrd {
    /// `metadata.name`, e.g. `reservations.scheduling.koordinator.sh`.
    pub name: String,
    /// `spec.names.plural`, e.g. `reservations`.
    pub plural: String,
    /// The `X` of the `crds.X` value that switches the template on, if it has one.
    pub values_key: Option<String>,
}

/// How serious a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// For information.
    Info,
    /// The install can go on, with a caveat.
    Warn,
    /// The install would fail or not work.
    Fail,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        })
    }
}

/// One result of a check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// How serious.
    pub level: Level,
    /// Which check (one of the `CHECK_*` names).
    pub check: &'static str,
    /// What it is about: `release NS/NAME`, `namespace NS`, `crd NAME`, `Kind NS/NAME`, `nodes`,
    /// `cluster` (for automation: `--json` carries it; the message names it too).
    pub subject: String,
    /// What was found.
    pub message: String,
    /// What to do about it, when there is something to do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// The check could not tell (what it needs could not be read, or is not there): a Fail,
    /// unless the user named the check in `--skip-check` ([`PreflightReport::skip`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub could_not_tell: bool,
}

impl Finding {
    /// A finding of `check` at `level`, about nothing in particular until [`Finding::about`].
    pub fn new(
        level: Level,
        check: &'static str,
        message: impl Into<String>,
        fix: Option<String>,
    ) -> Self {
        Finding {
            level,
            check,
            subject: String::new(),
            message: message.into(),
            fix,
            could_not_tell: false,
        }
    }

    /// A check that could not tell: a Fail, whose fix says what to do (`fix`) or how to go on
    /// without the check (`--skip-check CHECK`, which makes it a Warn).
    pub fn could_not_tell(
        check: &'static str,
        message: impl Into<String>,
        fix: Option<&str>,
    ) -> Self {
        let way_on = format!("pass --skip-check {check} to go on without this check");
        let fix = match fix {
            Some(f) => format!("{f}; or {way_on}"),
            None => way_on,
        };
        Finding {
            could_not_tell: true,
            ..Finding::new(Level::Fail, check, message, Some(fix))
        }
    }

    /// The finding, about `subject` (see [`Finding::subject`]).
    pub fn about(mut self, subject: impl Into<String>) -> Self {
        self.subject = subject.into();
        self
    }
}

/// `findings`, each about `subject` unless it says what it is about itself.
pub(crate) fn about_all(findings: Vec<Finding>, subject: &str) -> Vec<Finding> {
    findings
        .into_iter()
        .map(|f| {
            if f.subject.is_empty() {
                f.about(subject)
            } else {
                f
            }
        })
        .collect()
}

/// The newest revision of an existing Helm release of the same name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseInfo {
    /// Release name.
    pub name: String,
    /// Release namespace.
    pub namespace: String,
    /// Revision number.
    pub revision: u32,
    /// Helm status (`deployed`, `failed`, `pending-upgrade`, ...).
    pub status: String,
    /// Chart version of that revision, when its record could be decoded.
    pub chart_version: Option<String>,
    /// The user values of that revision (`helm get values`), when its record could be decoded.
    #[serde(skip)]
    pub values: Option<serde_json::Value>,
    /// The objects that revision applied (its manifest), when its record could be decoded.
    #[serde(skip)]
    pub manifest: Option<String>,
    /// Why the record of that revision could not be decoded, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
    /// The newest revision that was ever deployed (`deployed`, `superseded` or `uninstalled`),
    /// whatever the newest revision's status: what the downgrade guard compares with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_deployed: Option<DeployedRevision>,
}

/// The newest revision of a release that was ever deployed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeployedRevision {
    /// Revision number.
    pub revision: u32,
    /// Its Helm status now (`deployed`, `superseded`, `uninstalled`).
    pub status: String,
    /// Its chart version, when its record could be decoded.
    pub chart_version: Option<String>,
    /// Why its record could not be decoded, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
    /// The objects it applied (its manifest), when its record could be decoded: what still
    /// runs of it when a newer revision failed or is pending (`verify --cluster` judges both).
    #[serde(skip)]
    pub manifest: Option<String>,
}

/// Everything the checks found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreflightReport {
    /// `gitVersion` of the API server.
    pub server_version: String,
    /// The nodes.
    pub nodes: Vec<NodeInfo>,
    /// The findings, in check order.
    pub findings: Vec<Finding>,
    /// Values to set to `false` (full key paths, `crds.reservations`): CRDs that exist
    /// without Helm ownership and are left to their current owner.
    pub crd_values_off: Vec<String>,
    /// The existing release of the same name, if any (the install is then an upgrade).
    pub existing_release: Option<ReleaseInfo>,
    /// The release namespace to install into: the one asked for, or the one where the release
    /// already lives.
    pub release_namespace: String,
    /// The release namespace does not exist: helm creates it (`--create-namespace`).
    pub create_namespace: bool,
    /// koord-manager must run on the host network (EKS with a custom CNI): set
    /// `manager.hostNetwork=true`.
    pub host_network: bool,
}

impl PreflightReport {
    /// True when a finding is a [`Level::Fail`].
    pub fn failed(&self) -> bool {
        self.findings.iter().any(|f| f.level == Level::Fail)
    }

    /// The checks the user said to go on without (`--skip-check`): each of their findings
    /// that could not tell becomes a Warn saying so. A check that could tell (a Fail found) is
    /// not skipped.
    pub fn skip(&mut self, checks: &[String]) {
        for f in &mut self.findings {
            if f.could_not_tell && f.level == Level::Fail && checks.iter().any(|c| c == f.check) {
                f.level = Level::Warn;
                f.message
                    .push_str(&format!(" (not checked: --skip-check {})", f.check));
                f.fix = None;
            }
        }
    }
}

/// The checks that can answer "could not tell", which `--skip-check` names.
pub const SKIPPABLE_CHECKS: [&str; 3] = [CHECK_SERVER_VERSION, CHECK_NODE_ARCH, CHECK_PLATFORM];

/// Run every check against the cluster behind `client`: read what the checks need, then judge
/// it. API errors (unreachable, 401, 403, a list past its bounds) end the run with an error;
/// what the cluster holds is reported as findings.
pub async fn preflight(
    client: &KubeClient,
    input: &PreflightInput<'_>,
) -> Result<PreflightReport, ClusterError> {
    let mut findings = Vec::new();

    let info = read::version(client).await?;
    findings.extend(about_all(version::version_findings(&info), "cluster"));

    let nodes = read::nodes(client).await?;
    findings.extend(about_all(
        nodes::node_findings(&nodes, input.bundle_platforms),
        "nodes",
    ));

    let kind: Vec<&NodeInfo> = nodes.iter().filter(|n| platform::is_kind(n)).collect();
    if !kind.is_empty() {
        let roots = read::kubelet_cgroup_roots(client, &kind).await?;
        findings.extend(about_all(platform::kind_findings(&roots), "nodes"));
    }
    let mut host_network = false;
    if platform::is_eks(&nodes) {
        let daemonsets = read::daemonsets(client).await?;
        let (f, hn) = platform::eks_findings(&daemonsets, input.strict, input.host_network);
        findings.extend(about_all(f, "cluster"));
        host_network = hn;
    }

    // The release: in the release namespace, else anywhere (installed by hand elsewhere).
    let here = read::release_secrets(client, Some(input.namespace), input.release).await?;
    let everywhere = if release::latest(&here, input.namespace).is_some() {
        None
    } else {
        Some(read::release_secrets_everywhere(client, input.release).await?)
    };
    let located = release::locate(&here, everywhere.as_ref(), input);
    let about_release = format!("release {}/{}", located.namespace, input.release);
    findings.extend(about_all(located.findings, &about_release));
    let ns = located.namespace.as_str();
    let owner = PreflightInput {
        namespace: ns,
        ..*input
    };

    let mut crds = Vec::new();
    for crd in input.crds {
        crds.push((crd, read::crd(client, &crd.name).await?));
    }
    let (crd_findings, crd_values_off) = crds::crd_findings(&crds, &owner);
    findings.extend(about_all(crd_findings, "CRDs"));

    let release_ns = read::namespace(client, ns).await?;
    let chart_ns = if input.chart_namespace == ns {
        release_ns.clone()
    } else {
        read::namespace(client, input.chart_namespace).await?
    };
    let (ns_findings, create_namespace) = namespace::namespace_findings(
        release_ns.as_ref(),
        chart_ns.as_ref(),
        ns,
        input.chart_namespace,
        input.release,
    );
    findings.extend(about_all(ns_findings, &format!("namespace {ns}")));
    findings.extend(about_all(
        release::release_findings(located.release.as_ref(), &owner),
        &about_release,
    ));

    Ok(PreflightReport {
        server_version: version::shown(&info),
        nodes,
        findings,
        crd_values_off,
        existing_release: located.release,
        release_namespace: located.namespace,
        create_namespace,
        host_network,
    })
}

/// `a, b, c and 4 more`.
pub(crate) fn names<'a>(it: impl IntoIterator<Item = &'a str>) -> String {
    let all: Vec<&str> = it.into_iter().collect();
    let mut s = all
        .iter()
        .take(MAX_NAMES)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if all.len() > MAX_NAMES {
        s.push_str(&format!(" and {} more", all.len() - MAX_NAMES));
    }
    s
}

/// The newest revision of release `release` in `namespace` (Helm's record decoded: its chart
/// version, values and manifest), if there is one.
pub async fn release_revision(
    client: &KubeClient,
    namespace: &str,
    release: &str,
) -> Result<Option<ReleaseInfo>, ClusterError> {
    let here = read::release_secrets(client, Some(namespace), release).await?;
    Ok(release::latest(&here, namespace))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A check that could not tell is a Fail naming `--skip-check CHECK`; skipped, a Warn that
    /// says so. A Fail of a check that could tell, or of another check, stays a Fail.
    #[test]
    fn skip_check_makes_only_could_not_tell_of_the_named_checks_a_warn() {
        let unknown = Finding::could_not_tell(CHECK_NODE_ARCH, "no nodes", Some("wait"));
        assert_eq!(unknown.level, Level::Fail);
        assert_eq!(
            unknown.fix.as_deref(),
            Some("wait; or pass --skip-check node-arch to go on without this check")
        );
        let v = serde_json::to_value(&unknown).unwrap();
        assert_eq!(v["couldNotTell"], true);
        let mut rep = PreflightReport {
            server_version: String::new(),
            nodes: Vec::new(),
            findings: vec![
                unknown,
                Finding::new(Level::Fail, CHECK_NODE_ARCH, "no arm64 images", None),
                Finding::could_not_tell(CHECK_SERVER_VERSION, "version?", None),
            ],
            crd_values_off: Vec::new(),
            existing_release: None,
            release_namespace: "default".into(),
            create_namespace: false,
            host_network: false,
        };
        rep.skip(&["node-arch".to_string()]);
        let levels: Vec<Level> = rep.findings.iter().map(|f| f.level).collect();
        assert_eq!(levels, [Level::Warn, Level::Fail, Level::Fail]);
        assert_eq!(
            rep.findings[0].message,
            "no nodes (not checked: --skip-check node-arch)"
        );
        assert!(rep.findings[0].fix.is_none());
        assert!(rep.failed());
    }

    #[test]
    fn report_serializes_camel_case() {
        let rep = PreflightReport {
            server_version: "v1.29.2".into(),
            nodes: vec![NodeInfo {
                name: "n".into(),
                arch: "amd64".into(),
                os: "linux".into(),
                kernel: "6.8".into(),
                container_runtime: "containerd://1.7.13".into(),
                provider_id: String::new(),
                eks_labels: false,
            }],
            findings: vec![Finding::new(Level::Warn, CHECK_KERNEL, "m", None)],
            crd_values_off: vec!["crds.reservations".into()],
            existing_release: Some(ReleaseInfo {
                name: "koordinator".into(),
                namespace: "koordinator-system".into(),
                revision: 3,
                status: "deployed".into(),
                chart_version: None,
                values: None,
                manifest: None,
                unreadable: None,
                last_deployed: None,
            }),
            release_namespace: "default".into(),
            create_namespace: false,
            host_network: false,
        };
        let v = serde_json::to_value(&rep).unwrap();
        assert_eq!(v["serverVersion"], "v1.29.2");
        assert_eq!(v["nodes"][0]["containerRuntime"], "containerd://1.7.13");
        assert_eq!(v["findings"][0]["level"], "warn");
        assert!(v["findings"][0].get("fix").is_none());
        assert!(v["findings"][0].get("couldNotTell").is_none());
        assert_eq!(v["crdValuesOff"][0], "crds.reservations");
        assert_eq!(
            v["existingRelease"]["chartVersion"],
            serde_json::Value::Null
        );
        assert!(!rep.failed());
        assert_eq!(names(["a", "b"]), "a, b");
        assert_eq!(
            names(["1", "2", "3", "4", "5", "6", "7"]),
            "1, 2, 3, 4, 5 and 2 more"
        );
    }

    /// A fixture object (tests/fixtures/kube/...), typed.
    pub(crate) fn fixture<T: serde::de::DeserializeOwned>(p: &str) -> T {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/kube")
            .join(p);
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The pre-flight's input for release `koordinator` in `default`.
    pub(crate) fn input<'a>(
        platforms: &'a [String],
        crds: &'a [ChartCrd],
        strict: bool,
    ) -> PreflightInput<'a> {
        PreflightInput {
            bundle_platforms: platforms,
            crds,
            namespace: "default",
            namespace_explicit: false,
            chart_namespace: "koordinator-system",
            release: "koordinator",
            strict,
            host_network: false,
            chart_version: "1.8.0",
            allow_downgrade: false,
        }
    }
}
