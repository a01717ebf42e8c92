//! The `namespace` check, over the release namespace and the chart's own namespace
//! (k8s-openapi's `Namespace`, `None` when absent): the chart's namespace existing without Helm
//! ownership is a Fail with the kubectl commands that adopt it; a missing release namespace is
//! created by helm (`--create-namespace`), unless it is the chart's own (a Fail: helm's release
//! record would be written before the chart creates it).

use super::ownership::{adopt_commands, ownership, Ownership};
use super::{Finding, Level, CHECK_NAMESPACE};
use k8s_openapi::api::core::v1::Namespace;

/// Findings for the release namespace and the chart's namespace (`None`: absent), and whether
/// helm must create the release namespace (`--create-namespace`).
pub(crate) fn namespace_findings(
    release_ns: Option<&Namespace>,
    chart_ns: Option<&Namespace>,
    namespace: &str,
    chart_namespace: &str,
    release: &str,
) -> (Vec<Finding>, bool) {
    let terminating = |obj: &Namespace, ns: &str| {
        let phase = obj.status.as_ref().and_then(|s| s.phase.as_deref());
        (phase == Some("Terminating")).then(|| {
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
    out.push(match ownership(&obj.metadata, release, namespace) {
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
            Some(adopt_commands("namespace", chart_namespace, Some(&obj.metadata), release, namespace)),
        ),
        Ownership::Other { release: other, namespace: other_ns } => Finding::new(
            Level::Fail,
            CHECK_NAMESPACE,
            format!(
                "namespace {chart_namespace} belongs to Helm release {other:?} in namespace {other_ns:?}, not to {release:?} in {namespace:?}: Helm will refuse to install"
            ),
            Some(format!(
                "upgrade release {other:?} (--namespace {other_ns}) instead, or hand the namespace over: {}",
                adopt_commands("namespace", chart_namespace, Some(&obj.metadata), release, namespace)
            )),
        ),
    });
    (out, create)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::preflight::tests::fixture;
    use serde_json::json;

    fn ns(v: serde_json::Value) -> Namespace {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn namespace_adoption_commands() {
        let (ks, d, r) = ("koordinator-system", "default", "koordinator");
        let default_ns =
            ns(json!({"metadata": {"name": "default"}, "status": {"phase": "Active"}}));
        let ack: Namespace = fixture("ack/namespace-koordinator-system.json");
        let (f, create) = namespace_findings(Some(&default_ns), Some(&ack), d, ks, r);
        assert!(!create);
        assert_eq!(f[0].level, Level::Fail);
        assert_eq!(
            f[0].fix.as_deref(),
            Some("kubectl label namespace koordinator-system app.kubernetes.io/managed-by=Helm && kubectl annotate namespace koordinator-system meta.helm.sh/release-name=koordinator meta.helm.sh/release-namespace=default")
        );
        let clash = ns(
            json!({"metadata": {"name": "koordinator-system", "labels": {"app.kubernetes.io/managed-by": "ack"}}, "status": {"phase": "Active"}}),
        );
        let (f, _) = namespace_findings(Some(&default_ns), Some(&clash), d, ks, r);
        assert!(f[0].fix.as_deref().unwrap().starts_with("kubectl label namespace koordinator-system --overwrite app.kubernetes.io/managed-by=Helm && kubectl annotate namespace koordinator-system meta.helm.sh"));
        // The EKS fixture's namespace belongs to a release kept in koordinator-system itself.
        let eks: Namespace = fixture("eks/namespace-koordinator-system.json");
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
        let term = ns(
            json!({"metadata": {"name": "koordinator-system"}, "status": {"phase": "Terminating"}}),
        );
        assert_eq!(
            namespace_findings(Some(&default_ns), Some(&term), d, ks, r).0[0].level,
            Level::Fail
        );
    }
}
