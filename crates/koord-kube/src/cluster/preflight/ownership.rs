//! Helm's ownership rule for objects that exist before an install (`checkOwnership`), shared by
//! the CRD and namespace checks, and the kubectl commands that hand an object to a release.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

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
pub(crate) fn ownership(meta: &ObjectMeta, release: &str, namespace: &str) -> Ownership {
    let label = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY))
        .map(String::as_str);
    let ann = |k: &str| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .map(String::as_str)
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

/// `kubectl label ... && kubectl annotate ...` making `kind/name` owned by the release
/// (`--overwrite` where a different value is already set).
pub(crate) fn adopt_commands(
    kind: &str,
    name: &str,
    meta: Option<&ObjectMeta>,
    release: &str,
    namespace: &str,
) -> String {
    let label = |k: &str| {
        meta.and_then(|m| m.labels.as_ref()?.get(k))
            .map(String::as_str)
    };
    let ann = |k: &str| {
        meta.and_then(|m| m.annotations.as_ref()?.get(k))
            .map(String::as_str)
    };
    let label_clash = label(MANAGED_BY).is_some_and(|v| v != "Helm");
    let ann_clash = ann(RELEASE_NAME).is_some_and(|v| v != release)
        || ann(RELEASE_NAMESPACE).is_some_and(|v| v != namespace);
    format!(
        "kubectl label {kind} {name}{} {MANAGED_BY}=Helm && kubectl annotate {kind} {name}{} {RELEASE_NAME}={} {RELEASE_NAMESPACE}={}",
        if label_clash { " --overwrite" } else { "" },
        if ann_clash { " --overwrite" } else { "" },
        release,
        namespace
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::preflight::tests::fixture;
    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use serde_json::json;

    fn meta(v: serde_json::Value) -> ObjectMeta {
        serde_json::from_value(v).unwrap()
    }
    fn crd(p: &str) -> CustomResourceDefinition {
        fixture(p)
    }
    fn ns(p: &str) -> Namespace {
        fixture(p)
    }

    #[test]
    fn ownership_rules() {
        let (r, n) = ("koordinator", "koordinator-system");
        let helm = meta(
            json!({"labels": {"app.kubernetes.io/managed-by": "Helm"}, "annotations": {"meta.helm.sh/release-name": r, "meta.helm.sh/release-namespace": n}}),
        );
        assert_eq!(ownership(&helm, r, n), Ownership::This);
        assert_eq!(
            ownership(&helm, r, "default"),
            Ownership::Other {
                release: r.into(),
                namespace: n.into()
            }
        );
        assert_eq!(
            ownership(&ObjectMeta::default(), r, n),
            Ownership::Unmanaged
        );
        // Annotations without the label: Helm refuses too.
        let half = meta(
            json!({"annotations": {"meta.helm.sh/release-name": r, "meta.helm.sh/release-namespace": n}}),
        );
        assert_eq!(ownership(&half, r, n), Ownership::Unmanaged);
        assert_eq!(
            ownership(
                &crd("ack/crds/nodeslos.slo.koordinator.sh.json").metadata,
                r,
                n
            ),
            Ownership::Unmanaged
        );
        assert_eq!(
            ownership(
                &crd("eks/crds/nodeslos.slo.koordinator.sh.json").metadata,
                r,
                n
            ),
            Ownership::This
        );
        assert_eq!(
            ownership(&ns("ack/namespace-koordinator-system.json").metadata, r, n),
            Ownership::Unmanaged
        );
        assert_eq!(
            ownership(&ns("eks/namespace-koordinator-system.json").metadata, r, n),
            Ownership::This
        );
    }
}
