//! The `server-version` check: the API server's version (`GET /version`, k8s-openapi's
//! `Info`) against Koordinator's compatibility notes. Below 1.18: Fail; 1.18–1.23: Warn
//! (koord-scheduler needs compatibility feature gates there); 1.24+: Info.

use super::{Finding, Level, CHECK_SERVER_VERSION};
use k8s_openapi::apimachinery::pkg::version::Info;

/// Kubernetes below this is refused.
const MIN_KUBE: (u32, u32) = (1, 18);

/// The version as reported: `gitVersion`, else `major.minor`.
pub(crate) fn shown(info: &Info) -> String {
    if info.git_version.is_empty() {
        format!("{}.{}", info.major, info.minor)
    } else {
        info.git_version.clone()
    }
}

/// Findings for the server version (`gitVersion`, with `major`/`minor` as fallback).
pub(crate) fn version_findings(info: &Info) -> Vec<Finding> {
    findings(&info.git_version, &info.major, &info.minor)
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

pub(crate) fn leading_number(s: &str) -> Option<u32> {
    let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn findings(git: &str, major: &str, minor: &str) -> Vec<Finding> {
    let parsed = parse_kube_version(git)
        .or_else(|| Some((leading_number(major)?, leading_number(minor)?, 0)));
    let shown = if git.is_empty() {
        format!("{major}.{minor}")
    } else {
        git.to_string()
    };
    let Some((ma, mi, _)) = parsed else {
        return vec![Finding::could_not_tell(
            CHECK_SERVER_VERSION,
            format!("cannot read the Kubernetes version from {shown:?}: whether Koordinator supports it cannot be told"),
            Some("check what the API server reports (kubectl version)"),
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

#[cfg(test)]
mod tests {
    use super::*;

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

    fn info(git: &str, major: &str, minor: &str) -> Info {
        Info {
            git_version: git.into(),
            major: major.into(),
            minor: minor.into(),
            ..Default::default()
        }
    }

    #[test]
    fn version_levels() {
        let lvl = |g: &str| version_findings(&info(g, "", ""))[0].level;
        assert_eq!(lvl("v1.16.15"), Level::Fail);
        assert_eq!(lvl("v1.17.0"), Level::Fail);
        assert_eq!(lvl("v1.18.0"), Level::Warn);
        assert_eq!(lvl("v1.20.15"), Level::Warn);
        assert_eq!(lvl("v1.21.14"), Level::Warn);
        assert_eq!(lvl("v1.22.15-aliyun.1"), Level::Warn);
        assert_eq!(lvl("v1.23.17"), Level::Warn);
        assert_eq!(lvl("v1.24.0"), Level::Info);
        assert_eq!(lvl("v1.28.15-eks-7f9249a"), Level::Info);
        let f = &version_findings(&info("v1.16.15", "1", "16"))[0];
        assert!(
            f.message
                .contains("Koordinator needs Kubernetes 1.18 or newer"),
            "{}",
            f.message
        );
        let f = &version_findings(&info("v1.22.15-aliyun.1", "1", "22+"))[0];
        assert!(
            f.message.contains("Koordinator compatibility notes")
                && f.message.contains("CompatibleCSIStorageCapacity"),
            "{}",
            f.message
        );
        let f = &version_findings(&info("v1.20.4", "1", "20"))[0];
        assert!(
            f.message.contains("Koordinator compatibility notes")
                && f.message.contains("CompatiblePodDisruptionBudget"),
            "{}",
            f.message
        );
        // Fallback to major/minor ("28+" on EKS).
        assert_eq!(
            version_findings(&info("", "1", "28+"))[0].level,
            Level::Info
        );
        assert_eq!(shown(&info("", "1", "28+")), "1.28+");
        // A version that does not parse: could not tell, a Fail (before: a Warn, and the
        // check below 1.18 skipped).
        let weird = &version_findings(&info("weird", "", ""))[0];
        assert!(
            weird.level == Level::Fail && weird.could_not_tell,
            "{weird:?}"
        );
    }

    #[test]
    fn the_fake_and_fixture_versions_are_typed_infos() {
        let v: Info = crate::cluster::preflight::tests::fixture("eks/version.json");
        assert_eq!(shown(&v), "v1.28.15-eks-7f9249a");
    }
}
