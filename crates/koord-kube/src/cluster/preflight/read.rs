//! Reading what the checks judge: every GET and LIST of the pre-flight, typed, each list
//! bounded ([`crate::cluster::list`]). No judgement here, beyond reducing each page of nodes to
//! the [`NodeInfo`] the checks read (so a big cluster costs one page of memory).

use super::platform::Configz;
use super::release::Everywhere;
use super::NodeInfo;
use crate::cluster::client::KubeClient;
use crate::cluster::list::{self, Bounds};
use crate::cluster::ClusterError;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::version::Info;

/// `GET /version`.
pub(super) async fn version(client: &KubeClient) -> Result<Info, ClusterError> {
    client
        .get::<Info>("/version")
        .await?
        .ok_or_else(|| ClusterError::Api {
            url: client.url("/version"),
            message: format!(
                "404: {} does not look like a Kubernetes API server",
                client.server()
            ),
            transient: false,
        })
}

/// Every node, page by page.
pub(super) async fn nodes(client: &KubeClient) -> Result<Vec<NodeInfo>, ClusterError> {
    let mut out = Vec::new();
    list::list::<Node, _>(client, "/api/v1/nodes", Bounds::NODES, |page| {
        out.extend(page.iter().map(NodeInfo::from_node))
    })
    .await?;
    Ok(out)
}

/// The kubelet `cgroupRoot` of each node, from `/configz` through the API server's node proxy
/// (`None`: not readable, e.g. forbidden).
pub(super) async fn kubelet_cgroup_roots(
    client: &KubeClient,
    nodes: &[&NodeInfo],
) -> Result<Vec<(String, Option<String>)>, ClusterError> {
    let mut out = Vec::new();
    for n in nodes {
        let path = format!(
            "/api/v1/nodes/{}/proxy/configz",
            koord_base::text::percent_encode(&n.name)
        );
        let root = match client.get::<Configz>(&path).await {
            Ok(Some(c)) => Some(c.cgroup_root()),
            Ok(None) | Err(ClusterError::Forbidden { .. }) | Err(ClusterError::Api { .. }) => None,
            Err(e) => return Err(e),
        };
        out.push((n.name.clone(), root));
    }
    Ok(out)
}

/// Every DaemonSet, as `namespace/name`.
pub(super) async fn daemonsets(client: &KubeClient) -> Result<Vec<String>, ClusterError> {
    let mut out = Vec::new();
    list::list::<DaemonSet, _>(
        client,
        "/apis/apps/v1/daemonsets",
        Bounds::DAEMONSETS,
        |page| {
            out.extend(page.iter().map(|d| {
                format!(
                    "{}/{}",
                    d.metadata.namespace.as_deref().unwrap_or(""),
                    d.metadata.name.as_deref().unwrap_or("")
                )
            }))
        },
    )
    .await?;
    Ok(out)
}

/// The label selector of a release's records: `owner=helm,name=<release>`, encoded.
fn release_selector(release: &str) -> String {
    format!(
        "labelSelector=owner%3Dhelm%2Cname%3D{}",
        koord_base::text::percent_encode(release)
    )
}

/// The release's records in `namespace`.
pub(super) async fn release_secrets(
    client: &KubeClient,
    namespace: Option<&str>,
    release: &str,
) -> Result<Vec<Secret>, ClusterError> {
    let base = match namespace {
        Some(ns) => format!(
            "/api/v1/namespaces/{}/secrets",
            koord_base::text::percent_encode(ns)
        ),
        None => "/api/v1/secrets".to_string(),
    };
    let path = format!("{base}?{}", release_selector(release));
    let mut out = Vec::new();
    list::list::<Secret, _>(client, &path, Bounds::SECRETS, |page| out.extend(page)).await?;
    Ok(out)
}

/// The release's records in every namespace, or that listing them is not allowed.
pub(super) async fn release_secrets_everywhere(
    client: &KubeClient,
    release: &str,
) -> Result<Everywhere, ClusterError> {
    match release_secrets(client, None, release).await {
        Ok(v) => Ok(Everywhere::Found(v)),
        Err(ClusterError::Forbidden { .. }) => Ok(Everywhere::Forbidden),
        Err(e) => Err(e),
    }
}

/// One CRD by name (`None`: absent).
pub(super) async fn crd(
    client: &KubeClient,
    name: &str,
) -> Result<Option<CustomResourceDefinition>, ClusterError> {
    client
        .get(&format!(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{}",
            koord_base::text::percent_encode(name)
        ))
        .await
}

/// One namespace by name (`None`: absent).
pub(super) async fn namespace(
    client: &KubeClient,
    name: &str,
) -> Result<Option<Namespace>, ClusterError> {
    client
        .get(&format!(
            "/api/v1/namespaces/{}",
            koord_base::text::percent_encode(name)
        ))
        .await
}
