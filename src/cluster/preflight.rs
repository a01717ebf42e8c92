//! Checks made against the target cluster before installing the chart, read-only, after the
//! Koordinator compatibility notes and Helm's install rules:
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
//! Tested against a stateful fake API server (`tests/kube-fake/`) and real-format fixtures
//! (`tests/fixtures/kube/`), not against a live API server.

use super::client::KubeClient;
use super::release;
use super::ClusterError;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
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

/// Kubernetes below this is refused.
const MIN_KUBE: (u32, u32) = (1, 18);
/// Kernel below this gets a warning.
const MIN_KERNEL: (u32, u32) = (4, 19);
/// containerd from this version on supports NRI.
const NRI_CONTAINERD: (u32, u32) = (1, 7);
/// Node names listed in one finding before "and N more".
const MAX_NAMES: usize = 5;
/// Page size for the node list.
const NODE_PAGE: u32 = 500;

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
    /// What was found.
    pub message: String,
    /// What to do about it, when there is something to do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    fn new(
        level: Level,
        check: &'static str,
        message: impl Into<String>,
        fix: Option<String>,
    ) -> Self {
        Finding {
            level,
            check,
            message: message.into(),
            fix,
        }
    }
}

/// A node, from its `status.nodeInfo`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    /// `metadata.name`.
    pub name: String,
    /// `architecture` (`amd64`, `arm64`).
    pub arch: String,
    /// `operatingSystem` (`linux`).
    pub os: String,
    /// `kernelVersion`.
    pub kernel: String,
    /// `containerRuntimeVersion` (`containerd://1.7.22`).
    pub container_runtime: String,
    /// `spec.providerID` (`kind://docker/kind/kind-control-plane`, `aws:///eu-west-1a/i-...`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub provider_id: String,
    /// The node carries `eks.amazonaws.com/*` labels.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub eks_labels: bool,
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
}

/// Run every check against the cluster behind `client`. API errors (unreachable, 401, 403) end
/// the run with an error; what the cluster holds is reported as findings.
pub async fn preflight(
    client: &KubeClient,
    input: &PreflightInput<'_>,
) -> Result<PreflightReport, ClusterError> {
    let mut findings = Vec::new();

    let version = client
        .get_json("/version")
        .await?
        .ok_or_else(|| ClusterError::Api {
            url: format!("{}/version", client.server().trim_end_matches('/')),
            message: format!(
                "404: {} does not look like a Kubernetes API server",
                client.server()
            ),
            transient: false,
        })?;
    let git = version
        .get("gitVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let major = version.get("major").and_then(Value::as_str).unwrap_or("");
    let minor = version.get("minor").and_then(Value::as_str).unwrap_or("");
    findings.extend(version_findings(&git, major, minor));

    let nodes = list_nodes(client).await?;
    findings.extend(node_findings(&nodes, input.bundle_platforms));

    let (platform, host_network) = platform_findings(client, &nodes, input).await?;
    findings.extend(platform);

    // The release: in the release namespace, else anywhere (installed by hand elsewhere).
    let (existing_release, release_namespace, release_finding) =
        find_release(client, input).await?;
    findings.extend(release_finding);
    let ns = release_namespace.as_str();

    let mut crds = Vec::new();
    for crd in input.crds {
        let obj = client
            .get_json(&format!(
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{}",
                crd.name
            ))
            .await?;
        crds.push((crd, obj));
    }
    let owner = PreflightInput {
        namespace: ns,
        ..*input
    };
    let (crd_findings, crd_values_off) = crd_findings(&crds, &owner);
    findings.extend(crd_findings);

    let release_ns_obj = client.get_json(&format!("/api/v1/namespaces/{ns}")).await?;
    let chart_ns_obj = if input.chart_namespace == ns {
        release_ns_obj.clone()
    } else {
        client
            .get_json(&format!("/api/v1/namespaces/{}", input.chart_namespace))
            .await?
    };
    let (ns_findings, create_namespace) = namespace_findings(
        release_ns_obj.as_ref(),
        chart_ns_obj.as_ref(),
        ns,
        input.chart_namespace,
        input.release,
    );
    findings.extend(ns_findings);
    findings.extend(release_findings(existing_release.as_ref(), &owner));

    Ok(PreflightReport {
        server_version: if git.is_empty() {
            format!("{major}.{minor}")
        } else {
            git
        },
        nodes,
        findings,
        crd_values_off,
        existing_release,
        release_namespace,
        create_namespace,
        host_network,
    })
}

/// The newest revision of release `input.release` in the release namespace; if it has none,
/// in any other namespace (Helm's release Secrets, labels `owner=helm,name=<release>`). Returns
/// the release, the namespace to install into, and a finding when the release lives elsewhere.
async fn find_release(
    client: &KubeClient,
    input: &PreflightInput<'_>,
) -> Result<(Option<ReleaseInfo>, String, Vec<Finding>), ClusterError> {
    let selector = format!(
        "owner%3Dhelm%2Cname%3D{}",
        crate::text::percent_encode(input.release)
    );
    let here = client
        .get_json(&format!(
            "/api/v1/namespaces/{}/secrets?labelSelector={selector}",
            input.namespace
        ))
        .await?
        .unwrap_or(Value::Null);
    if let Some(r) = release_info(&here, input.namespace) {
        return Ok((Some(r), input.namespace.to_string(), Vec::new()));
    }
    let everywhere = match client
        .get_json(&format!("/api/v1/secrets?labelSelector={selector}"))
        .await
    {
        Ok(v) => v.unwrap_or(Value::Null),
        Err(ClusterError::Forbidden { .. }) => {
            return Ok((
                None,
                input.namespace.to_string(),
                vec![Finding::new(
                    Level::Warn,
                    CHECK_RELEASE,
                    format!(
                        "not allowed to list Secrets in all namespaces: a release {:?} installed in a namespace other than {} would not be found (and helm would install a second one that conflicts with it)",
                        input.release, input.namespace
                    ),
                    Some(format!("check with `helm list -A --filter '^{}$'`; if it exists elsewhere, pass --namespace NS", input.release)),
                )],
            ))
        }
        Err(e) => return Err(e),
    };
    let mut by_ns: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for s in everywhere
        .get("items")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let ns = s
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if !ns.is_empty() && ns != input.namespace {
            by_ns.entry(ns).or_default().push(s.clone());
        }
    }
    let mut found: Vec<ReleaseInfo> = by_ns
        .iter()
        .filter_map(|(ns, items)| release_info(&serde_json::json!({ "items": items }), ns))
        .collect();
    let (rel, ns) = (input.release, input.namespace);
    match found.len() {
        0 => Ok((None, ns.to_string(), Vec::new())),
        1 if !input.namespace_explicit => {
            let r = found.remove(0);
            let other = r.namespace.clone();
            let f = Finding::new(
                Level::Info,
                CHECK_RELEASE,
                format!(
                    "Helm release {rel:?} already exists in namespace {other} (not in {ns}): it is upgraded there, in namespace {other}, so that no second release fights it for the same objects"
                ),
                None,
            );
            Ok((Some(r), other, vec![f]))
        }
        _ => {
            let list = found
                .iter()
                .map(|r| format!("{} (revision {}, {})", r.namespace, r.revision, r.status))
                .collect::<Vec<_>>()
                .join(", ");
            let f = Finding::new(
                Level::Fail,
                CHECK_RELEASE,
                format!(
                    "Helm release {rel:?} already exists in {list}, not in {ns}: a second release {rel:?} in {ns} would claim the same cluster-wide objects (CRDs, ClusterRoles, webhooks, the {} namespace) and helm would refuse them",
                    input.chart_namespace
                ),
                Some(if found.len() == 1 {
                    format!("upgrade it where it is: --namespace {}", found[0].namespace)
                } else {
                    format!("keep one of them (helm uninstall {rel} -n NS for the others), then pass --namespace NS")
                }),
            );
            Ok((None, ns.to_string(), vec![f]))
        }
    }
}

/// The newest release of a SecretList, with its chart version.
fn release_info(list: &Value, namespace: &str) -> Option<ReleaseInfo> {
    release::latest(list).map(|(r, secret)| ReleaseInfo {
        name: r.name,
        namespace: if r.namespace.is_empty() {
            namespace.to_string()
        } else {
            r.namespace
        },
        revision: r.revision,
        status: r.status,
        chart_version: release::decode(secret)
            .as_ref()
            .and_then(release::chart_version),
    })
}

/// All nodes, following `continue` tokens.
async fn list_nodes(client: &KubeClient) -> Result<Vec<NodeInfo>, ClusterError> {
    let mut nodes = Vec::new();
    let mut cont: Option<String> = None;
    loop {
        let mut path = format!("/api/v1/nodes?limit={NODE_PAGE}");
        if let Some(c) = &cont {
            path.push_str("&continue=");
            path.push_str(&crate::text::percent_encode(c));
        }
        let Some(list) = client.get_json(&path).await? else {
            return Err(ClusterError::Api {
                url: format!("{}{path}", client.server().trim_end_matches('/')),
                message: "404: the API server does not serve nodes".into(),
                transient: false,
            });
        };
        nodes.extend(node_infos(&list));
        let next = list
            .pointer("/metadata/continue")
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty())
            .map(str::to_string);
        if next.is_some() && next == cont {
            return Err(ClusterError::Api {
                url: format!("{}{path}", client.server().trim_end_matches('/')),
                message: "the node list repeats its continue token".into(),
                transient: false,
            });
        }
        cont = next;
        if cont.is_none() {
            return Ok(nodes);
        }
    }
}

/// The nodes of a NodeList.
pub(crate) fn node_infos(list: &Value) -> Vec<NodeInfo> {
    let s = |v: &Value, p: &str| {
        v.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    list.get("items")
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .map(|n| NodeInfo {
                    name: s(n, "/metadata/name"),
                    arch: s(n, "/status/nodeInfo/architecture"),
                    os: s(n, "/status/nodeInfo/operatingSystem"),
                    kernel: s(n, "/status/nodeInfo/kernelVersion"),
                    container_runtime: s(n, "/status/nodeInfo/containerRuntimeVersion"),
                    provider_id: s(n, "/spec/providerID"),
                    eks_labels: n
                        .pointer("/metadata/labels")
                        .and_then(Value::as_object)
                        .is_some_and(|l| l.keys().any(|k| k.starts_with("eks.amazonaws.com/"))),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `major.minor.patch` of a Kubernetes version string: `v1.28.3-eks-4f4795d`,
/// `v1.26.3+k3s1`, `v1.22.15-aliyun.1`, `1.29`.
pub(crate) fn parse_kube_version(s: &str) -> Option<(u32, u32, u32)> {
    let s = s.trim().trim_start_matches(['v', 'V']);
    let mut it = s.splitn(3, '.');
    let major = leading_number(it.next()?)?;
    let minor = leading_number(it.next()?)?;
    let patch = it.next().and_then(leading_number).unwrap_or(0);
    Some((major, minor, patch))
}

/// `major.minor` of a kernel release: `5.10.0-28-cloud-amd64`, `4.18.0-372.el8.x86_64`.
pub(crate) fn parse_kernel(s: &str) -> Option<(u32, u32)> {
    let mut it = s.trim().splitn(3, '.');
    Some((leading_number(it.next()?)?, leading_number(it.next()?)?))
}

/// Runtime name and `major.minor` of a `containerRuntimeVersion`: `containerd://1.7.22`,
/// `docker://20.10.7`, `cri-o://1.28.1`, `containerd://v1.7.11-k3s2`.
pub(crate) fn parse_runtime(s: &str) -> (String, Option<(u32, u32)>) {
    let (name, version) = s.split_once("://").unwrap_or((s, ""));
    let version = version.trim_start_matches(['v', 'V']);
    let mut it = version.splitn(3, '.');
    let mm = match (
        it.next().and_then(leading_number),
        it.next().and_then(leading_number),
    ) {
        (Some(a), Some(b)) => Some((a, b)),
        _ => None,
    };
    (name.to_string(), mm)
}

fn leading_number(s: &str) -> Option<u32> {
    let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Findings for the server version (`gitVersion`, with the `major`/`minor` fields as fallback).
pub(crate) fn version_findings(git: &str, major: &str, minor: &str) -> Vec<Finding> {
    let parsed = parse_kube_version(git)
        .or_else(|| Some((leading_number(major)?, leading_number(minor)?, 0)));
    let shown = if git.is_empty() {
        format!("{major}.{minor}")
    } else {
        git.to_string()
    };
    let Some((ma, mi, _)) = parsed else {
        return vec![Finding::new(
            Level::Warn,
            CHECK_SERVER_VERSION,
            format!("cannot read the Kubernetes version from {shown:?}: compatibility not checked"),
            None,
        )];
    };
    let v = (ma, mi);
    let f = if v < MIN_KUBE {
        Finding::new(
            Level::Fail,
            CHECK_SERVER_VERSION,
            format!("Kubernetes {shown} is too old: Koordinator needs Kubernetes 1.18 or newer"),
            Some("upgrade the cluster to Kubernetes 1.18 or newer (1.24 or newer needs no compatibility feature gates)".into()),
        )
    } else if v < (1, 22) {
        Finding::new(
            Level::Warn,
            CHECK_SERVER_VERSION,
            format!(
                "Kubernetes {shown}: per the Koordinator compatibility notes, some components will not work on Kubernetes below 1.22 as they are: koord-scheduler is built on Kubernetes 1.24+ libraries and needs the feature gates DisableCSIStorageCapacityInformer=true,CompatiblePodDisruptionBudget=true here{}",
                if v <= (1, 20) { "; chart 1.8.0 also grants koord-scheduler read access to namespaces on 1.20 and older" } else { "" }
            ),
            Some("let Helm render the chart against this cluster so that it picks its below-1.22 scheduler feature gates (value scheduler.compatibleBelow122FeatureGates in chart 1.8.0), or upgrade to Kubernetes 1.24 or newer".into()),
        )
    } else if v == (1, 22) {
        Finding::new(
            Level::Warn,
            CHECK_SERVER_VERSION,
            format!(
                "Kubernetes {shown}: per the Koordinator compatibility notes, some components will not work on Kubernetes 1.22 as they are: koord-scheduler reads storage.k8s.io/v1 CSIStorageCapacity (served from 1.24) and needs the feature gate CompatibleCSIStorageCapacity=true here"
            ),
            Some("let Helm render the chart against this cluster so that it picks its 1.22 scheduler feature gates (value scheduler.compatible122FeatureGates in chart 1.8.0), or upgrade to Kubernetes 1.24 or newer".into()),
        )
    } else if v == (1, 23) {
        Finding::new(
            Level::Warn,
            CHECK_SERVER_VERSION,
            format!(
                "Kubernetes {shown}: koord-scheduler reads storage.k8s.io/v1 CSIStorageCapacity, served from Kubernetes 1.24; on 1.23 it is reported to fail to start (Koordinator issue #1784) and chart 1.8.0 sets no compatibility gate for 1.23"
            ),
            Some("set scheduler.featureGates=CompatibleCSIStorageCapacity=true, or upgrade to Kubernetes 1.24 or newer".into()),
        )
    } else {
        Finding::new(
            Level::Info,
            CHECK_SERVER_VERSION,
            format!("Kubernetes {shown}"),
            None,
        )
    };
    vec![f]
}

/// `a, b, c and 4 more`.
fn names<'a>(it: impl IntoIterator<Item = &'a str>) -> String {
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

/// Findings for node architectures, kernels and runtimes.
pub(crate) fn node_findings(nodes: &[NodeInfo], bundle_platforms: &[String]) -> Vec<Finding> {
    let mut out = Vec::new();
    if nodes.is_empty() {
        out.push(Finding::new(
            Level::Warn,
            CHECK_NODE_ARCH,
            "the cluster has no nodes yet: node architectures, kernels and runtimes not checked",
            None,
        ));
        return out;
    }

    // Architectures.
    let non_linux: Vec<&NodeInfo> = nodes
        .iter()
        .filter(|n| !n.os.is_empty() && n.os != "linux")
        .collect();
    if !non_linux.is_empty() {
        out.push(Finding::new(
            Level::Warn,
            CHECK_NODE_ARCH,
            format!(
                "nodes {} are not Linux nodes ({}): Koordinator's components run on Linux only and will not run there",
                names(non_linux.iter().map(|n| n.name.as_str())),
                names(non_linux.iter().map(|n| n.os.as_str()))
            ),
            None,
        ));
    }
    let mut by_platform: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for n in nodes
        .iter()
        .filter(|n| n.os == "linux" && !n.arch.is_empty())
    {
        by_platform
            .entry(format!("linux/{}", n.arch))
            .or_default()
            .push(&n.name);
    }
    let bundle: Vec<(String, String)> = bundle_platforms
        .iter()
        .filter_map(|p| {
            let mut it = p.split('/');
            Some((it.next()?.to_string(), it.next()?.to_string()))
        })
        .collect();
    if bundle.is_empty() {
        out.push(Finding::new(
            Level::Warn,
            CHECK_NODE_ARCH,
            "the bundle lists no image platforms: node architectures not checked",
            None,
        ));
    } else {
        let covered = |platform: &str| {
            bundle
                .iter()
                .any(|(os, arch)| format!("{os}/{arch}") == platform)
        };
        let missing: Vec<(&String, &Vec<&str>)> =
            by_platform.iter().filter(|(p, _)| !covered(p)).collect();
        let bundle_list = bundle_platforms.join(", ");
        if missing.is_empty() {
            if !by_platform.is_empty() {
                out.push(Finding::new(
                    Level::Info,
                    CHECK_NODE_ARCH,
                    format!(
                        "node platforms {} are all in the bundle ({bundle_list})",
                        by_platform
                            .keys()
                            .map(String::as_str)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    None,
                ));
            }
        } else {
            let detail: Vec<String> = missing
                .iter()
                .map(|(p, ns)| {
                    format!("{p} on {} node(s): {}", ns.len(), names(ns.iter().copied()))
                })
                .collect();
            let mut wanted: Vec<String> = bundle_platforms.to_vec();
            for (p, _) in &missing {
                wanted.push((*p).clone());
            }
            out.push(Finding::new(
                Level::Fail,
                CHECK_NODE_ARCH,
                format!(
                    "the bundle has no images for {}; it holds {bundle_list} only, and koordlet (a DaemonSet) runs on every node",
                    detail.join("; ")
                ),
                Some(format!("rebuild the bundle with --platform {}", wanted.join(","))),
            ));
        }
    }

    // Kernels.
    let old: Vec<&NodeInfo> = nodes
        .iter()
        .filter(|n| n.os == "linux" || n.os.is_empty())
        .filter(|n| parse_kernel(&n.kernel).is_some_and(|k| k < MIN_KERNEL))
        .collect();
    if !old.is_empty() {
        let mut kernels: Vec<&str> = old.iter().map(|n| n.kernel.as_str()).collect();
        kernels.sort_unstable();
        kernels.dedup();
        out.push(Finding::new(
            Level::Warn,
            CHECK_KERNEL,
            format!(
                "Linux kernel older than 4.19 on {} node(s): {} ({}); Koordinator recommends 4.19 or newer, and koordlet QoS features that need newer kernel interfaces will not work there",
                old.len(),
                names(old.iter().map(|n| n.name.as_str())),
                kernels.join(", ")
            ),
            Some("upgrade the node OS or kernel to 4.19 or newer where those features are needed".into()),
        ));
    }

    // Runtimes.
    let mut nri: Vec<&NodeInfo> = Vec::new();
    let mut no_nri: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for n in nodes.iter().filter(|n| !n.container_runtime.is_empty()) {
        match parse_runtime(&n.container_runtime) {
            (name, Some(v)) if name == "containerd" && v >= NRI_CONTAINERD => nri.push(n),
            _ => no_nri
                .entry(n.container_runtime.clone())
                .or_default()
                .push(&n.name),
        }
    }
    if !nri.is_empty() {
        out.push(Finding::new(
            Level::Info,
            CHECK_CONTAINERD,
            format!(
                "containerd 1.7+ on {} node(s) ({}): NRI mode available (containerd 1.7 needs NRI enabled in its config; 2.0 enables it by default)",
                nri.len(),
                names(nri.iter().map(|n| n.name.as_str()))
            ),
            None,
        ));
    }
    for (runtime, ns) in &no_nri {
        out.push(Finding::new(
            Level::Info,
            CHECK_CONTAINERD,
            format!(
                "{runtime} on {} node(s) ({}): NRI mode not available (Koordinator's NRI mode needs containerd 1.7 or newer); koordlet uses its standalone mode there",
                ns.len(),
                names(ns.iter().copied())
            ),
            None,
        ));
    }
    out
}

/// kind and EKS, as Koordinator's install guide has them. Returns the findings and whether
/// koord-manager must go on the host network.
async fn platform_findings(
    client: &KubeClient,
    nodes: &[NodeInfo],
    input: &PreflightInput<'_>,
) -> Result<(Vec<Finding>, bool), ClusterError> {
    let mut out = Vec::new();
    let kind: Vec<&NodeInfo> = nodes
        .iter()
        .filter(|n| n.provider_id.starts_with("kind://"))
        .collect();
    if !kind.is_empty() {
        let mut bad = Vec::new();
        let mut unknown = Vec::new();
        for n in &kind {
            match client
                .get_json(&format!("/api/v1/nodes/{}/proxy/configz", n.name))
                .await
            {
                Ok(Some(v)) => {
                    let root = v
                        .pointer("/kubeletconfig/cgroupRoot")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    if root != "/" {
                        bad.push(format!(
                            "{} ({})",
                            n.name,
                            if root.is_empty() { "unset" } else { root }
                        ));
                    }
                }
                Ok(None) | Err(ClusterError::Forbidden { .. }) | Err(ClusterError::Api { .. }) => {
                    unknown.push(n.name.as_str())
                }
                Err(e) => return Err(e),
            }
        }
        out.extend(kind_findings(&bad, &unknown));
    }
    let eks = nodes
        .iter()
        .any(|n| n.provider_id.starts_with("aws://") || n.eks_labels);
    let mut host_network = false;
    if eks {
        let daemonsets: Vec<String> = client
            .get_json("/apis/apps/v1/daemonsets")
            .await?
            .and_then(|l| l.get("items").cloned())
            .and_then(|i| i.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .map(|d| {
                format!(
                    "{}/{}",
                    d.pointer("/metadata/namespace")
                        .and_then(Value::as_str)
                        .unwrap_or(""),
                    d.pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                )
            })
            .collect();
        let (f, hn) = eks_findings(&daemonsets, input.strict, input.host_network);
        out.extend(f);
        host_network = hn;
    }
    Ok((out, host_network))
}

/// kind nodes whose kubelet cgroup root is not `/` (`bad`, "name (root)"), or could not be read.
pub(crate) fn kind_findings(bad: &[String], unknown: &[&str]) -> Vec<Finding> {
    let fix = format!(
        "create the kind cluster with kubelet's cgroup root at / (Koordinator's install guide), e.g. `kind create cluster --config kind.yaml` with kind.yaml:\n{KIND_CLUSTER_CONFIG}"
    );
    let mut out = Vec::new();
    if !bad.is_empty() {
        out.push(Finding::new(
            Level::Fail,
            CHECK_PLATFORM,
            format!(
                "kind node(s) {} run kubelet with a cgroup root other than /: koordlet looks for /host-cgroup/kubepods.slice and will not find the pods' cgroups",
                names(bad.iter().map(String::as_str))
            ),
            Some(fix),
        ));
    } else if !unknown.is_empty() {
        out.push(Finding::new(
            Level::Warn,
            CHECK_PLATFORM,
            format!(
                "kind node(s) {}: kubelet's configuration (/configz) could not be read, so its cgroup root was not checked; koordlet needs it at /",
                names(unknown.iter().copied())
            ),
            Some(fix),
        ));
    } else {
        out.push(Finding::new(
            Level::Info,
            CHECK_PLATFORM,
            "kind cluster with kubelet's cgroup root at /, as Koordinator needs",
            None,
        ));
    }
    out
}

/// EKS: a custom CNI (Calico, Weave, Cilium DaemonSets, and no `aws-node`) leaves the control
/// plane unable to reach pod IPs, so koord-manager's webhook must be on the host network.
/// `daemonsets` are `namespace/name`. Returns the findings and whether to set
/// `manager.hostNetwork=true`.
pub(crate) fn eks_findings(
    daemonsets: &[String],
    strict: bool,
    host_network: bool,
) -> (Vec<Finding>, bool) {
    let name = |d: &String| d.rsplit('/').next().unwrap_or("").to_string();
    let aws_node = daemonsets.iter().any(|d| name(d) == "aws-node");
    let custom: Vec<&String> = daemonsets
        .iter()
        .filter(|d| {
            let n = name(d);
            n.starts_with("calico") || n.starts_with("weave") || n.starts_with("cilium")
        })
        .collect();
    if aws_node || custom.is_empty() {
        return (
            vec![Finding::new(
                Level::Info,
                CHECK_PLATFORM,
                if aws_node {
                    "EKS with the Amazon VPC CNI (aws-node): the control plane reaches koord-manager's webhook"
                } else {
                    "EKS without a Calico, Weave or Cilium DaemonSet: the control plane reaches koord-manager's webhook"
                },
                None,
            )],
            false,
        );
    }
    let list = names(custom.iter().map(|s| s.as_str()));
    let why = format!(
        "EKS with a custom CNI ({list}) and no aws-node: the EKS control plane cannot reach pod IPs, so koord-manager's webhook is unreachable unless koord-manager runs on the host network"
    );
    if host_network {
        return (
            vec![Finding::new(
                Level::Info,
                CHECK_PLATFORM,
                format!("{why}: --host-network sets manager.hostNetwork=true"),
                None,
            )],
            true,
        );
    }
    if strict {
        return (
            vec![Finding::new(
                Level::Fail,
                CHECK_PLATFORM,
                why,
                Some("pass --host-network (manager.hostNetwork=true)".into()),
            )],
            false,
        );
    }
    (
        vec![Finding::new(
            Level::Warn,
            CHECK_PLATFORM,
            format!("{why}: setting manager.hostNetwork=true"),
            None,
        )],
        true,
    )
}

/// Who owns an existing object, by Helm's ownership metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ownership {
    /// `managed-by: Helm` and both annotations naming this release and namespace.
    This,
    /// Annotations naming another release or namespace.
    Other { release: String, namespace: String },
    /// No (or incomplete) Helm ownership: Helm refuses to take it over.
    Unmanaged,
}

const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
const RELEASE_NAME: &str = "meta.helm.sh/release-name";
const RELEASE_NAMESPACE: &str = "meta.helm.sh/release-namespace";

/// Helm's check (`checkOwnership`): the label `app.kubernetes.io/managed-by=Helm` and the
/// annotations `meta.helm.sh/release-name` / `meta.helm.sh/release-namespace`.
pub(crate) fn ownership(obj: &Value, release: &str, namespace: &str) -> Ownership {
    let label = obj
        .pointer("/metadata/labels")
        .and_then(|l| l.get(MANAGED_BY))
        .and_then(Value::as_str);
    let ann = |k: &str| {
        obj.pointer("/metadata/annotations")
            .and_then(|a| a.get(k))
            .and_then(Value::as_str)
    };
    let (rn, rns) = (ann(RELEASE_NAME), ann(RELEASE_NAMESPACE));
    if label == Some("Helm") && rn == Some(release) && rns == Some(namespace) {
        return Ownership::This;
    }
    if rn.is_some_and(|r| r != release) || rns.is_some_and(|n| n != namespace) {
        return Ownership::Other {
            release: rn.unwrap_or("?").to_string(),
            namespace: rns.unwrap_or("?").to_string(),
        };
    }
    Ownership::Unmanaged
}

/// Findings for the chart's CRDs found in the cluster (`None`: absent), and the values to
/// switch off.
pub(crate) fn crd_findings(
    crds: &[(&ChartCrd, Option<Value>)],
    input: &PreflightInput<'_>,
) -> (Vec<Finding>, Vec<String>) {
    let mut out = Vec::new();
    let mut off = Vec::new();
    let mut ours: Vec<&str> = Vec::new();
    let mut absent: Vec<&str> = Vec::new();
    let mut unowned: Vec<&ChartCrd> = Vec::new();
    for (crd, obj) in crds {
        let Some(obj) = obj else {
            absent.push(&crd.name);
            continue;
        };
        match ownership(obj, input.release, input.namespace) {
            Ownership::This => ours.push(&crd.name),
            Ownership::Unmanaged => unowned.push(crd),
            Ownership::Other { release, namespace } => out.push(Finding::new(
                Level::Fail,
                CHECK_CRD_OWNERSHIP,
                format!(
                    "CRD {} belongs to Helm release {release:?} in namespace {namespace:?}, not to {:?} in {:?}: Helm will refuse to install it into this release",
                    crd.name, input.release, input.namespace
                ),
                Some(format!(
                    "upgrade release {release:?} in namespace {namespace:?} instead, or leave the CRD to it with --skip-crds {}",
                    crd.plural
                )),
            )),
        }
    }
    if !unowned.is_empty() {
        // A CRD without a values switch cannot be left out: it must be adopted or removed.
        let (switchable, fixed): (Vec<&ChartCrd>, Vec<&ChartCrd>) =
            unowned.iter().partition(|c| c.values_key.is_some());
        for crd in &fixed {
            out.push(Finding::new(
                Level::Fail,
                CHECK_CRD_OWNERSHIP,
                format!(
                    "CRD {} exists without Helm ownership and the chart has no value to leave it out: Helm will refuse to install",
                    crd.name
                ),
                Some(adopt_commands("customresourcedefinition", &crd.name, None, input)),
            ));
        }
        if input.strict && !switchable.is_empty() {
            let plurals: Vec<&str> = switchable.iter().map(|c| c.plural.as_str()).collect();
            out.push(Finding::new(
                Level::Fail,
                CHECK_CRD_OWNERSHIP,
                format!(
                    "{} chart CRD(s) already exist without Helm ownership ({}), as on Alibaba Cloud ACK where ack-koordinator installs them: Helm refuses to install a chart whose resources exist unowned",
                    switchable.len(),
                    switchable.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")
                ),
                Some(format!("--skip-crds {}", plurals.join(","))),
            ));
        } else {
            for crd in &switchable {
                let key = crd.values_key.as_deref().unwrap_or_default();
                off.push(format!("crds.{key}"));
                out.push(Finding::new(
                    Level::Warn,
                    CHECK_CRD_OWNERSHIP,
                    format!(
                        "CRD {} already exists without Helm ownership (installed by another tool, e.g. ACK's ack-koordinator): the chart will not manage it (crds.{key}=false) and the installed definition stays in use",
                        crd.name
                    ),
                    None,
                ));
            }
        }
    }
    if !ours.is_empty() {
        out.push(Finding::new(
            Level::Info,
            CHECK_CRD_OWNERSHIP,
            format!(
                "{} of {} chart CRD(s) are already managed by release {:?} in {:?}: they will be upgraded",
                ours.len(),
                crds.len(),
                input.release,
                input.namespace
            ),
            None,
        ));
    }
    if !absent.is_empty() && absent.len() < crds.len() {
        out.push(Finding::new(
            Level::Info,
            CHECK_CRD_OWNERSHIP,
            format!(
                "{} chart CRD(s) are not in the cluster yet and will be created: {}",
                absent.len(),
                names(absent.iter().copied())
            ),
            None,
        ));
    }
    (out, off)
}

/// `kubectl label ... && kubectl annotate ...` making `kind/name` owned by the release
/// (`--overwrite` where a different value is already set).
fn adopt_commands(
    kind: &str,
    name: &str,
    obj: Option<&Value>,
    input: &PreflightInput<'_>,
) -> String {
    let get = |p: &str, k: &str| {
        obj.and_then(|o| o.pointer(p))
            .and_then(|m| m.get(k))
            .and_then(Value::as_str)
    };
    let label_clash = get("/metadata/labels", MANAGED_BY).is_some_and(|v| v != "Helm");
    let ann_clash = get("/metadata/annotations", RELEASE_NAME).is_some_and(|v| v != input.release)
        || get("/metadata/annotations", RELEASE_NAMESPACE).is_some_and(|v| v != input.namespace);
    format!(
        "kubectl label {kind} {name}{} {MANAGED_BY}=Helm && kubectl annotate {kind} {name}{} {RELEASE_NAME}={} {RELEASE_NAMESPACE}={}",
        if label_clash { " --overwrite" } else { "" },
        if ann_clash { " --overwrite" } else { "" },
        input.release,
        input.namespace
    )
}

/// Findings for the release namespace and the chart's namespace (`None`: absent), and whether
/// helm must create the release namespace (`--create-namespace`).
pub(crate) fn namespace_findings(
    release_ns: Option<&Value>,
    chart_ns: Option<&Value>,
    namespace: &str,
    chart_namespace: &str,
    release: &str,
) -> (Vec<Finding>, bool) {
    let input = PreflightInput {
        bundle_platforms: &[],
        crds: &[],
        namespace,
        namespace_explicit: false,
        chart_namespace,
        release,
        strict: false,
        host_network: false,
    };
    let terminating = |obj: &Value, ns: &str| {
        (obj.pointer("/status/phase").and_then(Value::as_str) == Some("Terminating")).then(|| {
            Finding::new(
                Level::Fail,
                CHECK_NAMESPACE,
                format!("namespace {ns} is being deleted (Terminating)"),
                Some(format!(
                    "wait until `kubectl get namespace {ns}` reports NotFound, then run again"
                )),
            )
        })
    };
    let mut out = Vec::new();
    let mut create = false;
    if namespace != chart_namespace {
        match release_ns {
            None => {
                create = true;
                out.push(Finding::new(
                    Level::Info,
                    CHECK_NAMESPACE,
                    format!("release namespace {namespace} does not exist: helm creates it for its release record (--create-namespace)"),
                    None,
                ));
            }
            Some(obj) => out.extend(terminating(obj, namespace)),
        }
    } else if release_ns.is_none() {
        out.push(Finding::new(
            Level::Fail,
            CHECK_NAMESPACE,
            format!(
                "the release namespace is the chart's own namespace {namespace}, which does not exist yet: helm writes its release record there before the chart creates it, and stops with 404 namespaces \"{namespace}\" not found (--create-namespace would instead make the chart's Namespace object conflict)"
            ),
            Some("install the release into default, as Koordinator's guide does (leave out --namespace, or --namespace default)".into()),
        ));
        return (out, false);
    }
    let Some(obj) = chart_ns else {
        out.push(Finding::new(
            Level::Info,
            CHECK_NAMESPACE,
            format!("namespace {chart_namespace} does not exist yet: the chart creates it"),
            None,
        ));
        return (out, create);
    };
    if let Some(f) = terminating(obj, chart_namespace) {
        out.push(f);
        return (out, create);
    }
    out.push(match ownership(obj, release, namespace) {
        Ownership::This => Finding::new(
            Level::Info,
            CHECK_NAMESPACE,
            format!("namespace {chart_namespace} exists and is managed by release {release:?} ({namespace})"),
            None,
        ),
        Ownership::Unmanaged => Finding::new(
            Level::Fail,
            CHECK_NAMESPACE,
            format!(
                "namespace {chart_namespace} exists without Helm ownership; the chart renders this Namespace itself, so Helm will refuse to install. Once adopted, Helm owns it: `helm uninstall` would delete it with everything in it"
            ),
            Some(adopt_commands("namespace", chart_namespace, Some(obj), &input)),
        ),
        Ownership::Other { release: other, namespace: other_ns } => Finding::new(
            Level::Fail,
            CHECK_NAMESPACE,
            format!(
                "namespace {chart_namespace} belongs to Helm release {other:?} in namespace {other_ns:?}, not to {release:?} in {namespace:?}: Helm will refuse to install"
            ),
            Some(format!(
                "upgrade release {other:?} (--namespace {other_ns}) instead, or hand the namespace over: {}",
                adopt_commands("namespace", chart_namespace, Some(obj), &input)
            )),
        ),
    });
    (out, create)
}

/// Findings for an existing release.
pub(crate) fn release_findings(
    existing: Option<&ReleaseInfo>,
    input: &PreflightInput<'_>,
) -> Vec<Finding> {
    let (rel, ns) = (input.release, input.namespace);
    let Some(r) = existing else {
        return vec![Finding::new(
            Level::Info,
            CHECK_RELEASE,
            format!("no Helm release {rel:?} in namespace {ns}: this is a fresh install"),
            None,
        )];
    };
    let chart = r
        .chart_version
        .as_deref()
        .map(|v| format!(", chart {v}"))
        .unwrap_or_default();
    let f = match r.status.as_str() {
        "deployed" | "superseded" => Finding::new(
            Level::Info,
            CHECK_RELEASE,
            format!("Helm release {rel:?} revision {}{chart} is {} in {ns}: this is an upgrade", r.revision, r.status),
            None,
        ),
        "failed" => Finding::new(
            Level::Warn,
            CHECK_RELEASE,
            format!("Helm release {rel:?} revision {}{chart} failed in {ns}: the upgrade replaces it", r.revision),
            None,
        ),
        "uninstalled" => Finding::new(
            Level::Warn,
            CHECK_RELEASE,
            format!("Helm release {rel:?} was uninstalled with its history kept (revision {}{chart}) in {ns}", r.revision),
            None,
        ),
        "pending-install" => Finding::new(
            Level::Fail,
            CHECK_RELEASE,
            format!(
                "Helm release {rel:?} revision {}{chart} is stuck in pending-install in {ns}: an install was interrupted, and Helm refuses to change a release while another operation is in progress",
                r.revision
            ),
            Some(format!(
                "make sure no helm command is running on it, then remove the unfinished install with `helm uninstall {rel} -n {ns}` and run again"
            )),
        ),
        s if s.starts_with("pending") || s == "uninstalling" => Finding::new(
            Level::Fail,
            CHECK_RELEASE,
            format!(
                "Helm release {rel:?} revision {}{chart} is stuck in {s} in {ns}: Helm refuses to change a release while another operation is in progress (or was interrupted)",
                r.revision
            ),
            Some(format!(
                "make sure no helm command is running on it, then look at `helm history {rel} -n {ns}` and roll back to the last deployed revision (`helm rollback {rel} <REVISION> -n {ns}`)"
            )),
        ),
        other => Finding::new(
            Level::Warn,
            CHECK_RELEASE,
            format!("Helm release {rel:?} revision {}{chart} has status {other:?} in {ns}", r.revision),
            None,
        ),
    };
    vec![f]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    macro_rules! fixture {
        ($p:literal) => {
            serde_json::from_str::<Value>(include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/kube/",
                $p
            )))
            .unwrap()
        };
    }

    fn input<'a>(
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
        }
    }

    fn crd(name: &str) -> ChartCrd {
        let plural = name.split('.').next().unwrap().to_string();
        ChartCrd {
            name: name.into(),
            values_key: Some(plural.clone()),
            plural,
        }
    }

    #[test]
    fn kube_versions() {
        assert_eq!(parse_kube_version("v1.28.3-eks-4f4795d"), Some((1, 28, 3)));
        assert_eq!(parse_kube_version("v1.26.3+k3s1"), Some((1, 26, 3)));
        assert_eq!(parse_kube_version("v1.22.15-aliyun.1"), Some((1, 22, 15)));
        assert_eq!(parse_kube_version("v1.29.2"), Some((1, 29, 2)));
        assert_eq!(parse_kube_version("1.30"), Some((1, 30, 0)));
        assert_eq!(parse_kube_version("v1.27.3-gke.100"), Some((1, 27, 3)));
        assert_eq!(parse_kube_version(""), None);
        assert_eq!(parse_kube_version("vX"), None);
    }

    #[test]
    fn version_levels() {
        let lvl = |g: &str| version_findings(g, "", "")[0].level;
        assert_eq!(lvl("v1.16.15"), Level::Fail);
        assert_eq!(lvl("v1.17.0"), Level::Fail);
        assert_eq!(lvl("v1.18.0"), Level::Warn);
        assert_eq!(lvl("v1.20.15"), Level::Warn);
        assert_eq!(lvl("v1.21.14"), Level::Warn);
        assert_eq!(lvl("v1.22.15-aliyun.1"), Level::Warn);
        assert_eq!(lvl("v1.23.17"), Level::Warn);
        assert_eq!(lvl("v1.24.0"), Level::Info);
        assert_eq!(lvl("v1.28.15-eks-7f9249a"), Level::Info);
        let f = &version_findings("v1.16.15", "1", "16")[0];
        assert!(
            f.message
                .contains("Koordinator needs Kubernetes 1.18 or newer"),
            "{}",
            f.message
        );
        let f = &version_findings("v1.22.15-aliyun.1", "1", "22+")[0];
        assert!(
            f.message.contains("Koordinator compatibility notes")
                && f.message.contains("CompatibleCSIStorageCapacity"),
            "{}",
            f.message
        );
        let f = &version_findings("v1.20.4", "1", "20")[0];
        assert!(
            f.message.contains("Koordinator compatibility notes")
                && f.message.contains("CompatiblePodDisruptionBudget"),
            "{}",
            f.message
        );
        // Fallback to major/minor ("28+" on EKS).
        assert_eq!(version_findings("", "1", "28+")[0].level, Level::Info);
        assert_eq!(version_findings("weird", "", "")[0].level, Level::Warn);
    }

    #[test]
    fn kernels_and_runtimes() {
        assert_eq!(parse_kernel("5.10.0-28-cloud-amd64"), Some((5, 10)));
        assert_eq!(parse_kernel("4.18.0-372.el8.x86_64"), Some((4, 18)));
        assert_eq!(parse_kernel("3.10.0-1160.el7.x86_64"), Some((3, 10)));
        assert_eq!(parse_kernel("5.10.134-16.3.al8.x86_64"), Some((5, 10)));
        assert_eq!(parse_kernel("6.8.0-48-generic"), Some((6, 8)));
        assert_eq!(parse_kernel(""), None);
        assert_eq!(
            parse_runtime("containerd://1.7.22"),
            ("containerd".into(), Some((1, 7)))
        );
        assert_eq!(
            parse_runtime("containerd://v1.7.11-k3s2"),
            ("containerd".into(), Some((1, 7)))
        );
        assert_eq!(
            parse_runtime("containerd://1.6.20"),
            ("containerd".into(), Some((1, 6)))
        );
        assert_eq!(
            parse_runtime("docker://20.10.7"),
            ("docker".into(), Some((20, 10)))
        );
        assert_eq!(
            parse_runtime("cri-o://1.28.1"),
            ("cri-o".into(), Some((1, 28)))
        );
        assert_eq!(
            parse_runtime("containerd://2.0.0"),
            ("containerd".into(), Some((2, 0)))
        );
    }

    #[test]
    fn eks_nodes_arch_fail_then_pass() {
        let nodes = node_infos(&fixture!("eks/nodes.json"));
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[1].arch, "arm64");
        assert_eq!(nodes[1].container_runtime, "containerd://1.7.22");
        let amd = vec!["linux/amd64".to_string()];
        let f = node_findings(&nodes, &amd);
        let fail = f.iter().find(|f| f.level == Level::Fail).unwrap();
        assert_eq!(fail.check, CHECK_NODE_ARCH);
        assert!(
            fail.message
                .contains("linux/arm64 on 1 node(s): ip-192-168-5-87.eu-west-1.compute.internal"),
            "{}",
            fail.message
        );
        assert!(
            fail.message.contains("holds linux/amd64 only"),
            "{}",
            fail.message
        );
        assert_eq!(
            fail.fix.as_deref(),
            Some("rebuild the bundle with --platform linux/amd64,linux/arm64")
        );
        let both = vec!["linux/amd64".to_string(), "linux/arm64/v8".to_string()];
        let f = node_findings(&nodes, &both);
        assert!(f.iter().all(|f| f.level != Level::Fail), "{f:?}");
        assert!(f
            .iter()
            .any(|f| f.check == CHECK_CONTAINERD && f.message.contains("NRI mode available")));
        assert!(f.iter().all(|f| f.check != CHECK_KERNEL));
    }

    #[test]
    fn old_nodes_kernel_and_docker() {
        let nodes = node_infos(&fixture!("old/nodes.json"));
        let f = node_findings(&nodes, &["linux/amd64".to_string()]);
        let k = f.iter().find(|f| f.check == CHECK_KERNEL).unwrap();
        assert_eq!(k.level, Level::Warn);
        assert!(
            k.message.contains("k8s-master-01") && k.message.contains("k8s-worker-01"),
            "{}",
            k.message
        );
        assert!(
            k.message.contains("3.10.0-1160.el7.x86_64")
                && k.message.contains("4.18.0-372.9.1.el8.x86_64"),
            "{}",
            k.message
        );
        let r: Vec<&Finding> = f.iter().filter(|f| f.check == CHECK_CONTAINERD).collect();
        assert_eq!(r.len(), 2);
        assert!(r
            .iter()
            .all(|f| f.level == Level::Info && f.message.contains("NRI mode not available")));
    }

    #[test]
    fn many_names_are_shortened() {
        let nodes: Vec<NodeInfo> = (0..8)
            .map(|i| NodeInfo {
                name: format!("n{i}"),
                arch: "s390x".into(),
                os: "linux".into(),
                kernel: "5.4".into(),
                container_runtime: "containerd://1.7.0".into(),
                provider_id: String::new(),
                eks_labels: false,
            })
            .collect();
        let f = node_findings(&nodes, &["linux/amd64".into()]);
        let fail = f.iter().find(|f| f.level == Level::Fail).unwrap();
        assert!(
            fail.message.contains("n0, n1, n2, n3, n4 and 3 more"),
            "{}",
            fail.message
        );
        assert!(node_findings(&[], &[])[0].message.contains("no nodes"));
    }

    #[test]
    fn ownership_rules() {
        let (r, n) = ("koordinator", "koordinator-system");
        let helm = json!({"metadata": {"labels": {"app.kubernetes.io/managed-by": "Helm"}, "annotations": {"meta.helm.sh/release-name": r, "meta.helm.sh/release-namespace": n}}});
        assert_eq!(ownership(&helm, r, n), Ownership::This);
        assert_eq!(
            ownership(&helm, r, "default"),
            Ownership::Other {
                release: r.into(),
                namespace: n.into()
            }
        );
        assert_eq!(
            ownership(&json!({"metadata": {}}), r, n),
            Ownership::Unmanaged
        );
        // Annotations without the label: Helm refuses too.
        let half = json!({"metadata": {"annotations": {"meta.helm.sh/release-name": r, "meta.helm.sh/release-namespace": n}}});
        assert_eq!(ownership(&half, r, n), Ownership::Unmanaged);
        assert_eq!(
            ownership(&fixture!("ack/crds/nodeslos.slo.koordinator.sh.json"), r, n),
            Ownership::Unmanaged
        );
        assert_eq!(
            ownership(&fixture!("eks/crds/nodeslos.slo.koordinator.sh.json"), r, n),
            Ownership::This
        );
        assert_eq!(
            ownership(&fixture!("ack/namespace-koordinator-system.json"), r, n),
            Ownership::Unmanaged
        );
        assert_eq!(
            ownership(&fixture!("eks/namespace-koordinator-system.json"), r, n),
            Ownership::This
        );
    }

    #[test]
    fn ack_crds_values_off_or_strict_fail() {
        let crds = vec![
            crd("reservations.scheduling.koordinator.sh"),
            crd("podgroups.scheduling.sigs.k8s.io"),
            crd("devices.scheduling.koordinator.sh"),
        ];
        let found = vec![
            (
                &crds[0],
                Some(fixture!(
                    "ack/crds/reservations.scheduling.koordinator.sh.json"
                )),
            ),
            (
                &crds[1],
                Some(fixture!("ack/crds/podgroups.scheduling.sigs.k8s.io.json")),
            ),
            (&crds[2], None),
        ];
        let (f, off) = crd_findings(&found, &input(&[], &crds, false));
        assert_eq!(off, ["crds.reservations", "crds.podgroups"]);
        assert_eq!(f.iter().filter(|f| f.level == Level::Warn).count(), 2);
        assert!(
            f[0].message.contains("crds.reservations=false"),
            "{}",
            f[0].message
        );
        assert!(f.iter().any(|f| f.level == Level::Info
            && f.message
                .contains("1 chart CRD(s) are not in the cluster yet")));

        let (f, off) = crd_findings(&found, &input(&[], &crds, true));
        assert!(off.is_empty());
        let fail: Vec<&Finding> = f.iter().filter(|f| f.level == Level::Fail).collect();
        assert_eq!(fail.len(), 1);
        assert_eq!(
            fail[0].fix.as_deref(),
            Some("--skip-crds reservations,podgroups")
        );
    }

    #[test]
    fn crd_of_another_release_or_without_switch_fails() {
        let mut c = crd("reservations.scheduling.koordinator.sh");
        let other = json!({"metadata": {"name": c.name, "labels": {"app.kubernetes.io/managed-by": "Helm"}, "annotations": {"meta.helm.sh/release-name": "koordinator", "meta.helm.sh/release-namespace": "kube-system"}}});
        let crds = vec![c.clone()];
        let (f, off) = crd_findings(&[(&crds[0], Some(other))], &input(&[], &crds, false));
        assert!(off.is_empty());
        assert_eq!(f[0].level, Level::Fail);
        assert!(f[0].message.contains("\"kube-system\""), "{}", f[0].message);

        c.values_key = None;
        let crds = vec![c];
        let (f, off) = crd_findings(
            &[(&crds[0], Some(json!({"metadata": {}})))],
            &input(&[], &crds, false),
        );
        assert!(off.is_empty());
        assert_eq!(f[0].level, Level::Fail);
        assert!(f[0].fix.as_deref().unwrap().starts_with("kubectl label customresourcedefinition reservations.scheduling.koordinator.sh app.kubernetes.io/managed-by=Helm"));
    }

    #[test]
    fn namespace_adoption_commands() {
        let (ks, d, r) = ("koordinator-system", "default", "koordinator");
        let default_ns = json!({"metadata": {"name": "default"}, "status": {"phase": "Active"}});
        let ack = fixture!("ack/namespace-koordinator-system.json");
        let (f, create) = namespace_findings(Some(&default_ns), Some(&ack), d, ks, r);
        assert!(!create);
        assert_eq!(f[0].level, Level::Fail);
        assert_eq!(
            f[0].fix.as_deref(),
            Some("kubectl label namespace koordinator-system app.kubernetes.io/managed-by=Helm && kubectl annotate namespace koordinator-system meta.helm.sh/release-name=koordinator meta.helm.sh/release-namespace=default")
        );
        let clash = json!({"metadata": {"name": "koordinator-system", "labels": {"app.kubernetes.io/managed-by": "ack"}}, "status": {"phase": "Active"}});
        let (f, _) = namespace_findings(Some(&default_ns), Some(&clash), d, ks, r);
        assert!(f[0].fix.as_deref().unwrap().starts_with("kubectl label namespace koordinator-system --overwrite app.kubernetes.io/managed-by=Helm && kubectl annotate namespace koordinator-system meta.helm.sh"));
        // The EKS fixture's namespace belongs to a release kept in koordinator-system itself.
        let eks = fixture!("eks/namespace-koordinator-system.json");
        assert_eq!(
            namespace_findings(Some(&eks), Some(&eks), ks, ks, r).0[0].level,
            Level::Info
        );
        let (f, _) = namespace_findings(Some(&default_ns), Some(&eks), d, ks, r);
        assert_eq!(f[0].level, Level::Fail, "{f:?}");
        assert!(
            f[0].fix
                .as_deref()
                .unwrap()
                .contains("--namespace koordinator-system"),
            "{f:?}"
        );
        let (f, create) = namespace_findings(Some(&default_ns), None, d, ks, r);
        assert_eq!((f[0].level, create), (Level::Info, false));
        // A release namespace that does not exist: helm creates it, unless it is the chart's.
        let (f, create) = namespace_findings(None, None, "tools", ks, r);
        assert!(
            create && f[0].message.contains("--create-namespace"),
            "{f:?}"
        );
        let (f, create) = namespace_findings(None, None, ks, ks, r);
        assert!(!create);
        assert_eq!(f[0].level, Level::Fail);
        assert!(
            f[0].message
                .contains("404 namespaces \"koordinator-system\" not found"),
            "{f:?}"
        );
        assert!(f[0].fix.as_deref().unwrap().contains("default"), "{f:?}");
        let term =
            json!({"metadata": {"name": "koordinator-system"}, "status": {"phase": "Terminating"}});
        assert_eq!(
            namespace_findings(Some(&default_ns), Some(&term), d, ks, r).0[0].level,
            Level::Fail
        );
    }

    #[test]
    fn kind_and_eks_platform_findings() {
        let f = kind_findings(&["kind-control-plane (/kubelet)".into()], &[]);
        assert_eq!(f[0].level, Level::Fail);
        assert!(
            f[0].message.contains("/host-cgroup/kubepods.slice"),
            "{}",
            f[0].message
        );
        let fix = f[0].fix.as_deref().unwrap();
        assert!(
            fix.contains("cgroup-root: \"/\"") && fix.contains("cgroupRoot: /"),
            "{fix}"
        );
        assert_eq!(kind_findings(&[], &[])[0].level, Level::Info);
        assert_eq!(kind_findings(&[], &["n"])[0].level, Level::Warn);

        let ds = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (f, hn) = eks_findings(
            &ds(&["kube-system/aws-node", "kube-system/kube-proxy"]),
            false,
            false,
        );
        assert!(!hn && f[0].level == Level::Info, "{f:?}");
        let calico = ds(&["kube-system/calico-node", "kube-system/kube-proxy"]);
        let (f, hn) = eks_findings(&calico, false, false);
        assert!(hn && f[0].level == Level::Warn, "{f:?}");
        assert!(f[0].message.contains("manager.hostNetwork=true"), "{f:?}");
        let (f, hn) = eks_findings(&calico, true, false);
        assert!(!hn && f[0].level == Level::Fail, "{f:?}");
        assert!(
            f[0].fix.as_deref().unwrap().contains("--host-network"),
            "{f:?}"
        );
        let (f, hn) = eks_findings(&calico, true, true);
        assert!(hn && f[0].level == Level::Info, "{f:?}");
        let (_, hn) = eks_findings(
            &ds(&["kube-system/cilium", "kube-system/weave-net"]),
            false,
            false,
        );
        assert!(hn);
    }

    #[test]
    fn release_states() {
        let i = input(&[], &[], false);
        let r = |status: &str| ReleaseInfo {
            name: "koordinator".into(),
            namespace: "default".into(),
            revision: 3,
            status: status.into(),
            chart_version: Some("1.6.0".into()),
        };
        assert_eq!(release_findings(None, &i)[0].level, Level::Info);
        let f = &release_findings(Some(&r("deployed")), &i)[0];
        assert_eq!(f.level, Level::Info);
        assert!(
            f.message.contains("revision 3, chart 1.6.0") && f.message.contains("upgrade"),
            "{}",
            f.message
        );
        assert_eq!(
            release_findings(Some(&r("failed")), &i)[0].level,
            Level::Warn
        );
        let f = &release_findings(Some(&r("pending-upgrade")), &i)[0];
        assert_eq!(f.level, Level::Fail);
        assert!(f
            .fix
            .as_deref()
            .unwrap()
            .contains("helm rollback koordinator"));
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
        assert_eq!(v["crdValuesOff"][0], "crds.reservations");
        assert_eq!(v["existingRelease"]["chartVersion"], Value::Null);
        assert!(!rep.failed());
    }

    #[test]
    fn selector_encoding() {
        assert_eq!(crate::text::percent_encode("koordinator"), "koordinator");
        assert_eq!(crate::text::percent_encode("a=b,c"), "a%3Db%2Cc");
    }
}
