//! What the cluster runs, checked against the bundle (`verify BUNDLE --cluster`): the release's
//! workloads, from the manifest of its newest revision (Helm's record, as the pre-flight reads
//! it), their pods (listed by each workload's selector, bounded as every list read is) and, per
//! container, the reference in the pod's spec and the digest the node runs
//! (`status.containerStatuses[].imageID`), each compared with the bundle's digests for that
//! image: its top manifest (the index `load` pins to) or one of its platforms' manifests.
//!
//! A container the bundle does not carry (an image of the site's own, a sidecar injected by a
//! webhook) is named, not judged. A container not started yet has no `imageID`: it is named as
//! such, and judged when it runs.

use super::list::{self, Bounds};
use super::{ClusterError, KubeClient};
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;
use serde_json::Value;

/// The workload kinds whose pods are checked (found by their selectors).
const WORKLOADS: &[&str] = &["Deployment", "DaemonSet", "StatefulSet"];

/// Pods of one workload at most (a DaemonSet on 5,000 nodes: 5,000).
const POD_BOUNDS: Bounds = Bounds::DAEMONSETS;

/// One image of the bundle, as `verify --cluster` compares it.
#[derive(Debug, Clone)]
pub struct Carried {
    /// `koordinator-sh/koordlet:v1.8.0` (the bundle's `ref`).
    pub reference: String,
    /// The top manifest digest (what `load` pins to).
    pub digest: String,
    /// Its platforms' manifests: (digest, platform).
    pub platforms: Vec<(String, String)>,
}

/// What a container runs, next to the bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// The node runs a digest the bundle carries for this image.
    Carried,
    /// The node runs another digest.
    Differs,
    /// Not started: no digest yet.
    NotStarted,
    /// An image the bundle does not carry.
    NotBundled,
}

/// One container of one pod.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    /// `namespace/pod`.
    pub pod: String,
    /// The container's name (`init:` before an init container's).
    pub container: String,
    /// The reference in the pod's spec.
    pub spec: String,
    /// The digest in the spec's reference, if it names one.
    pub spec_digest: Option<String>,
    /// Whether the spec's digest is the bundle's for this image.
    pub spec_pinned: bool,
    /// The digest the node runs (from `imageID`).
    pub running: Option<String>,
    /// The bundle's image (`ref`), when it carries this one.
    pub bundle_image: Option<String>,
    /// The bundle's digest for it (top manifest).
    pub bundle_digest: Option<String>,
    /// What the running digest is in the bundle (`index`, `linux/amd64`, ...).
    pub matched: Option<String>,
    /// The verdict.
    pub verdict: Verdict,
}

/// The check of one release.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Release name.
    pub release: String,
    /// Its namespace.
    pub namespace: String,
    /// The revision whose manifest named the workloads.
    pub revision: u32,
    /// Its chart version.
    pub chart_version: Option<String>,
    /// Workloads of the release (`Kind/name`).
    pub workloads: Vec<String>,
    /// Every container of their pods.
    pub containers: Vec<Container>,
}

impl Report {
    /// Containers with a verdict.
    pub fn count(&self, v: Verdict) -> usize {
        self.containers.iter().filter(|c| c.verdict == v).count()
    }

    /// Every running container of the release runs a digest the bundle carries.
    pub fn ok(&self) -> bool {
        self.count(Verdict::Differs) == 0
    }
}

/// The `sha256:<64 hex>` a reference or an `imageID` ends with.
pub fn digest_in(s: &str) -> Option<String> {
    let at = s.rfind("sha256:")?;
    let hex = &s[at + 7..];
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| format!("sha256:{}", hex.to_ascii_lowercase()))
}

/// The bundle's image a spec reference is: by `repo:tag` at the end of its name (under any
/// registry and prefix), else by the digest it names.
fn carried_for<'a>(spec: &str, carried: &'a [Carried]) -> Option<&'a Carried> {
    let name = spec.split('@').next().unwrap_or(spec);
    let digest = digest_in(spec);
    carried
        .iter()
        .find(|c| name == c.reference || name.ends_with(&format!("/{}", c.reference)))
        .or_else(|| {
            let d = digest.as_deref()?;
            carried
                .iter()
                .find(|c| c.digest == d || c.platforms.iter().any(|(p, _)| p == d))
        })
}

/// Judge one container: its spec reference and its status's `imageID` (empty when not started).
pub fn judge(
    pod: &str,
    container: &str,
    spec: &str,
    image_id: Option<&str>,
    carried: &[Carried],
) -> Container {
    let c = carried_for(spec, carried);
    let spec_digest = digest_in(spec);
    let running = image_id.filter(|s| !s.is_empty()).and_then(digest_in);
    let matched = match (c, &running) {
        (Some(c), Some(r)) if *r == c.digest => Some("index".to_string()),
        (Some(c), Some(r)) => c
            .platforms
            .iter()
            .find(|(d, _)| d == r)
            .map(|(_, p)| p.clone()),
        _ => None,
    };
    let verdict = match (c, &running) {
        (None, _) => Verdict::NotBundled,
        (Some(_), None) => Verdict::NotStarted,
        (Some(_), Some(_)) if matched.is_some() => Verdict::Carried,
        (Some(_), Some(_)) => Verdict::Differs,
    };
    Container {
        pod: pod.to_string(),
        container: container.to_string(),
        spec: spec.to_string(),
        spec_pinned: c.is_some_and(|c| spec_digest.as_deref() == Some(c.digest.as_str())),
        spec_digest,
        running,
        bundle_image: c.map(|c| c.reference.clone()),
        bundle_digest: c.map(|c| c.digest.clone()),
        matched,
        verdict,
    }
}

/// The workloads of a release manifest: (kind, namespace, name, label selector).
fn workloads(
    manifest: &str,
    namespace: &str,
) -> Result<Vec<(String, String, String, String)>, String> {
    let docs = crate::yaml::parse_documents(
        "the release's manifest",
        manifest.as_bytes(),
        &crate::yaml::MANIFESTS,
    )
    .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for d in docs {
        let v: Value = serde_json::to_value(&d).map_err(|e| e.to_string())?;
        let kind = v["kind"].as_str().unwrap_or_default();
        if !WORKLOADS.contains(&kind) {
            continue;
        }
        let name = v["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let ns = v["metadata"]["namespace"]
            .as_str()
            .unwrap_or(namespace)
            .to_string();
        let labels = v["spec"]["selector"]["matchLabels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| format!("{k}={v}")))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        if name.is_empty() || labels.is_empty() {
            continue;
        }
        out.push((kind.to_string(), ns, name, labels));
    }
    Ok(out)
}

/// Check release `release` (in `namespace`) against `carried`.
pub async fn check(
    client: &KubeClient,
    namespace: &str,
    release: &str,
    carried: &[Carried],
) -> Result<Report, ClusterError> {
    let info = super::preflight::release_revision(client, namespace, release)
        .await?
        .ok_or_else(|| ClusterError::Api {
            url: client.url(&format!("/api/v1/namespaces/{namespace}/secrets")),
            message: format!(
                "no Helm release {release:?} in namespace {namespace}: pass --release NAME and --namespace NS of the installed release (helm list -A)"
            ),
            transient: false,
        })?;
    let manifest = info.manifest.clone().unwrap_or_default();
    let found = workloads(&manifest, namespace).map_err(|m| ClusterError::Api {
        url: client.url(&format!("/api/v1/namespaces/{namespace}/secrets")),
        message: format!(
            "the manifest of release {release} revision {}: {m}",
            info.revision
        ),
        transient: false,
    })?;
    let mut report = Report {
        release: release.to_string(),
        namespace: namespace.to_string(),
        revision: info.revision,
        chart_version: info.chart_version.clone(),
        workloads: Vec::new(),
        containers: Vec::new(),
    };
    let mut seen = std::collections::BTreeSet::new();
    for (kind, ns, name, selector) in found {
        report.workloads.push(format!("{kind}/{name}"));
        let path = format!(
            "/api/v1/namespaces/{}/pods?labelSelector={}",
            crate::text::percent_encode(&ns),
            crate::text::percent_encode(&selector)
        );
        let mut pods: Vec<Pod> = Vec::new();
        list::list::<Pod, _>(client, &path, POD_BOUNDS, |page| pods.extend(page)).await?;
        for p in pods {
            let pod = format!(
                "{}/{}",
                p.metadata.namespace.as_deref().unwrap_or(&ns),
                p.metadata.name.as_deref().unwrap_or_default()
            );
            // Two workloads whose selectors overlap list the same pod once.
            if !seen.insert(pod.clone()) {
                continue;
            }
            let status = p.status.as_ref();
            let Some(spec) = &p.spec else { continue };
            let lists = [
                (
                    "init:",
                    spec.init_containers.as_deref().unwrap_or_default(),
                    status.and_then(|s| s.init_container_statuses.as_deref()),
                ),
                (
                    "",
                    &spec.containers[..],
                    status.and_then(|s| s.container_statuses.as_deref()),
                ),
            ];
            for (prefix, containers, statuses) in lists {
                for c in containers {
                    let image_id = statuses
                        .and_then(|st| st.iter().find(|s| s.name == c.name))
                        .map(|s| s.image_id.as_str());
                    report.containers.push(judge(
                        &pod,
                        &format!("{prefix}{}", c.name),
                        c.image.as_deref().unwrap_or_default(),
                        image_id,
                        carried,
                    ));
                }
            }
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn carried() -> Vec<Carried> {
        vec![Carried {
            reference: "koordinator-sh/koordlet:v1.7.0".into(),
            digest: format!("sha256:{}", "a".repeat(64)),
            platforms: vec![(format!("sha256:{}", "b".repeat(64)), "linux/amd64".into())],
        }]
    }

    #[test]
    fn a_container_is_judged_by_the_digest_its_node_runs() {
        let (a, b, c) = ("a".repeat(64), "b".repeat(64), "c".repeat(64));
        let spec = format!("reg.local/koordinator-sh/koordlet:v1.7.0@sha256:{a}");
        let ok = judge(
            "ns/p",
            "koordlet",
            &spec,
            Some(&format!("reg.local/koordinator-sh/koordlet@sha256:{a}")),
            &carried(),
        );
        assert_eq!(
            (ok.verdict, ok.matched.as_deref(), ok.spec_pinned),
            (Verdict::Carried, Some("index"), true)
        );
        let plat = judge(
            "ns/p",
            "koordlet",
            &spec,
            Some(&format!("docker-pullable://x@sha256:{b}")),
            &carried(),
        );
        assert_eq!(
            (plat.verdict, plat.matched.as_deref()),
            (Verdict::Carried, Some("linux/amd64"))
        );
        let other = judge(
            "ns/p",
            "koordlet",
            &spec,
            Some(&format!("sha256:{c}")),
            &carried(),
        );
        assert_eq!(other.verdict, Verdict::Differs);
        let waiting = judge("ns/p", "koordlet", &spec, Some(""), &carried());
        assert_eq!(waiting.verdict, Verdict::NotStarted);
        let by_tag = judge(
            "ns/p",
            "koordlet",
            "reg.local/koordinator-sh/koordlet:v1.7.0",
            None,
            &carried(),
        );
        assert_eq!(
            (by_tag.verdict, by_tag.spec_pinned),
            (Verdict::NotStarted, false)
        );
        let theirs = judge(
            "ns/p",
            "sidecar",
            "istio/proxyv2:1.20",
            Some(&format!("sha256:{c}")),
            &carried(),
        );
        assert_eq!(theirs.verdict, Verdict::NotBundled);
        // A tag that only ends like the bundle's is not it.
        let near = judge(
            "ns/p",
            "x",
            "reg.local/evil-koordinator-sh/koordlet:v1.7.0",
            None,
            &carried(),
        );
        assert_eq!(near.verdict, Verdict::NotBundled);
    }

    #[test]
    fn the_workloads_come_from_the_release_manifest() {
        let m = "---\n# Source: x\napiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: koordlet\nspec:\n  selector:\n    matchLabels:\n      koord-app: koordlet\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n";
        let w = workloads(m, "koordinator-system").unwrap();
        assert_eq!(
            w,
            vec![(
                "DaemonSet".to_string(),
                "koordinator-system".to_string(),
                "koordlet".to_string(),
                "koord-app=koordlet".to_string()
            )]
        );
    }
}
