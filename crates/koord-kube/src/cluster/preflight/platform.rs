//! The `platform` check, as Koordinator's install guide has it: kind clusters whose kubelet
//! `cgroupRoot` is not `/` (Fail, with the guide's kind config), EKS with a custom CNI
//! (koord-manager on the host network, or a Fail under `--strict`).

use super::{names, Finding, Level, NodeInfo, CHECK_PLATFORM, KIND_CLUSTER_CONFIG};

/// A kind node (`providerID` `kind://...`).
pub(crate) fn is_kind(n: &NodeInfo) -> bool {
    n.provider_id.starts_with("kind://")
}

/// An EKS cluster: an `aws://` providerID or `eks.amazonaws.com/*` labels on a node.
pub(crate) fn is_eks(nodes: &[NodeInfo]) -> bool {
    nodes
        .iter()
        .any(|n| n.provider_id.starts_with("aws://") || n.eks_labels)
}

/// The part of kubelet's `/configz` answer the kind check reads.
#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct Configz {
    #[serde(default)]
    kubeletconfig: KubeletConfig,
}

#[derive(Debug, Default, serde::Deserialize)]
struct KubeletConfig {
    #[serde(default, rename = "cgroupRoot")]
    cgroup_root: Option<String>,
}

impl Configz {
    /// `kubeletconfig.cgroupRoot` (empty when unset).
    pub(crate) fn cgroup_root(&self) -> String {
        self.kubeletconfig.cgroup_root.clone().unwrap_or_default()
    }
}

/// kind nodes and their kubelet cgroup root (`None`: its configuration could not be read).
pub(crate) fn kind_findings(roots: &[(String, Option<String>)]) -> Vec<Finding> {
    let mut bad = Vec::new();
    let mut unknown = Vec::new();
    for (name, root) in roots {
        match root.as_deref() {
            Some("/") => {}
            Some(r) => bad.push(format!(
                "{name} ({})",
                if r.is_empty() { "unset" } else { r }
            )),
            None => unknown.push(name.as_str()),
        }
    }
    kind_root_findings(&bad, &unknown)
}

/// kind nodes whose kubelet cgroup root is not `/` (`bad`, "name (root)"), or could not be read.
fn kind_root_findings(bad: &[String], unknown: &[&str]) -> Vec<Finding> {
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
        out.push(Finding::could_not_tell(
            CHECK_PLATFORM,
            format!(
                "kind node(s) {}: kubelet's configuration (/configz) could not be read, so whether its cgroup root is / (as koordlet needs) cannot be told",
                names(unknown.iter().copied())
            ),
            Some(&fix),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_and_eks_platform_findings() {
        let f = kind_findings(&[("kind-control-plane".into(), Some("/kubelet".into()))]);
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
        assert_eq!(
            kind_findings(&[("n".into(), Some("/".into()))])[0].level,
            Level::Info
        );
        assert!(kind_findings(&[("n".into(), Some(String::new()))])[0]
            .message
            .contains("n (unset)"));
        // /configz unreadable: could not tell, a Fail that --skip-check platform makes a Warn.
        let unread = &kind_findings(&[("n".into(), None)])[0];
        assert!(
            unread.level == Level::Fail && unread.could_not_tell,
            "{unread:?}"
        );
        assert!(unread
            .fix
            .as_deref()
            .unwrap()
            .ends_with("or pass --skip-check platform to go on without this check"));

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
    fn configz_of_the_fixtures() {
        let c: Configz = serde_json::from_str(
            r#"{"kubeletconfig": {"cgroupRoot": "/kubelet", "cgroupDriver": "systemd"}}"#,
        )
        .unwrap();
        assert_eq!(c.cgroup_root(), "/kubelet");
        let c: Configz = serde_json::from_str("{}").unwrap();
        assert_eq!(c.cgroup_root(), "");
    }
}
