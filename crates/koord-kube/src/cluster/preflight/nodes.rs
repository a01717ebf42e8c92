//! The `node-arch`, `kernel` and `containerd` checks, over the nodes (k8s-openapi's `Node`,
//! read page by page into [`NodeInfo`]): a node platform the bundle has no images for (Fail),
//! a Linux kernel older than 4.19 (Warn), containerd 1.7+ for NRI mode (Info).

use super::version::leading_number;
use super::{names, Finding, Level, CHECK_CONTAINERD, CHECK_KERNEL, CHECK_NODE_ARCH};
use k8s_openapi::api::core::v1::Node;
use serde::Serialize;
use std::collections::BTreeMap;

/// Kernel below this gets a warning.
const MIN_KERNEL: (u32, u32) = (4, 19);
/// containerd from this version on supports NRI.
const NRI_CONTAINERD: (u32, u32) = (1, 7);

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

impl NodeInfo {
    /// What the checks need of a node: its name, `status.nodeInfo`, `spec.providerID` and
    /// whether it carries EKS labels.
    pub fn from_node(n: &Node) -> NodeInfo {
        let info = n.status.as_ref().and_then(|s| s.node_info.as_ref());
        let field = |f: fn(&k8s_openapi::api::core::v1::NodeSystemInfo) -> &String| {
            info.map(f).cloned().unwrap_or_default()
        };
        NodeInfo {
            name: n.metadata.name.clone().unwrap_or_default(),
            arch: field(|i| &i.architecture),
            os: field(|i| &i.operating_system),
            kernel: field(|i| &i.kernel_version),
            container_runtime: field(|i| &i.container_runtime_version),
            provider_id: n
                .spec
                .as_ref()
                .and_then(|s| s.provider_id.clone())
                .unwrap_or_default(),
            eks_labels: n
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.keys().any(|k| k.starts_with("eks.amazonaws.com/"))),
        }
    }
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

/// Findings for node architectures, kernels and runtimes.
pub(crate) fn node_findings(nodes: &[NodeInfo], bundle_platforms: &[String]) -> Vec<Finding> {
    let mut out = Vec::new();
    if nodes.is_empty() {
        out.push(Finding::could_not_tell(
            CHECK_NODE_ARCH,
            "the cluster has no nodes yet: whether the bundle has images for their architectures, and their kernels and runtimes, cannot be told",
            Some("load once the nodes have joined (kubectl get nodes)"),
        ));
        return out;
    }

    arch_findings(nodes, bundle_platforms, &mut out);
    kernel_findings(nodes, &mut out);
    runtime_findings(nodes, &mut out);
    out
}

/// Node platforms against the bundle's.
fn arch_findings(nodes: &[NodeInfo], bundle_platforms: &[String], out: &mut Vec<Finding>) {
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
    // A node whose status names no operating system, or a Linux node no architecture (not
    // registered fully, or a node object written by hand): whether the bundle has images for
    // it cannot be told, and koordlet (a DaemonSet) goes to every node. Before, such nodes
    // were left out of the check without a word, so a cluster of them passed it.
    let unknown: Vec<&NodeInfo> = nodes
        .iter()
        .filter(|n| n.os.is_empty() || (n.os == "linux" && n.arch.is_empty()))
        .collect();
    if !unknown.is_empty() {
        out.push(Finding::could_not_tell(
            CHECK_NODE_ARCH,
            format!(
                "nodes {} report no operating system or architecture (status.nodeInfo), so whether the bundle has images for them cannot be told; koordlet (a DaemonSet) runs on every node",
                names(unknown.iter().map(|n| n.name.as_str()))
            ),
            Some("wait until every node has registered and reports its platform (kubectl get nodes -o wide), then load again"),
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
        out.push(Finding::could_not_tell(
            CHECK_NODE_ARCH,
            "the bundle lists no image platforms: whether it has images for the nodes' architectures cannot be told",
            Some("build the bundle again (koord-bundle build records the platforms of every image)"),
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
}

/// Kernels older than 4.19.
fn kernel_findings(nodes: &[NodeInfo], out: &mut Vec<Finding>) {
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
}

/// Container runtimes: NRI mode with containerd 1.7+.
fn runtime_findings(nodes: &[NodeInfo], out: &mut Vec<Finding>) {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::preflight::tests::fixture;

    fn node_infos(p: &str) -> Vec<NodeInfo> {
        let list: k8s_openapi::List<Node> = fixture(p);
        list.items.iter().map(NodeInfo::from_node).collect()
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
        let nodes = node_infos("eks/nodes.json");
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[1].arch, "arm64");
        assert_eq!(nodes[1].container_runtime, "containerd://1.7.22");
        assert!(nodes
            .iter()
            .all(|n| n.eks_labels && n.provider_id.starts_with("aws://")));
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
        let nodes = node_infos("old/nodes.json");
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
    fn kind_node_is_read_from_its_typed_object() {
        let nodes = node_infos("kind/nodes.json");
        assert_eq!(nodes.len(), 1);
        let n = &nodes[0];
        assert_eq!(
            (n.name.as_str(), n.arch.as_str(), n.os.as_str()),
            ("kind-control-plane", "amd64", "linux")
        );
        assert!(n.provider_id.starts_with("kind://"));
        assert!(!n.eks_labels);
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

    /// A node that reports no OS, or a Linux node no architecture, is "cannot be told", a
    /// Fail: before, it was left out of the check, and a cluster of such nodes passed it.
    #[test]
    fn a_node_of_unknown_platform_fails_the_check() {
        let node = |name: &str, os: &str, arch: &str| NodeInfo {
            name: name.into(),
            arch: arch.into(),
            os: os.into(),
            kernel: "5.15".into(),
            container_runtime: "containerd://1.7.0".into(),
            provider_id: String::new(),
            eks_labels: false,
        };
        let amd = ["linux/amd64".to_string()];
        let known = node_findings(&[node("a", "linux", "amd64")], &amd);
        assert!(known.iter().all(|f| f.level != Level::Fail), "{known:?}");
        for nodes in [
            vec![node("a", "linux", "amd64"), node("b", "linux", "")],
            vec![node("b", "", "")],
        ] {
            let f = node_findings(&nodes, &amd);
            let fail = f
                .iter()
                .find(|f| f.level == Level::Fail && f.check == CHECK_NODE_ARCH)
                .unwrap_or_else(|| panic!("{f:?}"));
            assert!(
                fail.message.contains("nodes b report no operating system"),
                "{}",
                fail.message
            );
            assert!(fail.message.contains("cannot be told"));
        }
    }
}
