//! The cluster's pre-flight, before any push.

use super::{ChecksFailed, Event, Events, Options, CHART_NAMESPACE, DEFAULT_RELEASE_NAMESPACE};
use crate::bundle::BundleManifest;
use crate::cluster;

/// The cluster the pre-flight read: its kubeconfig files and context, given to helm as they
/// are, so that helm installs where the pre-flight looked.
#[derive(Debug)]
pub struct KubeTarget {
    /// The kubeconfig files, and where their names came from.
    pub files: cluster::Files,
    /// The context used.
    pub context: String,
}

/// What the pre-flight gave: its report, the release namespace to install into, the cluster.
#[derive(Debug)]
pub struct Preflight {
    /// The report (`None`: not run, nothing is installed).
    pub report: Option<cluster::PreflightReport>,
    /// The release namespace.
    pub namespace: String,
    /// The cluster helm is to install into.
    pub target: Option<KubeTarget>,
    /// The client the pre-flight read the cluster with (the upgrade checks read it again).
    pub client: Option<cluster::KubeClient>,
}

impl Preflight {
    /// The revision an interrupted or failed helm step rolls back to: the release's, when it
    /// is deployed, else the last deployed one it records; `None` for a first install.
    pub fn deployed_before(&self) -> Option<u32> {
        self.report
            .as_ref()
            .and_then(|r| r.existing_release.as_ref())
            .and_then(|r| match r.status.as_str() {
                "deployed" => Some(r.revision),
                _ => r.last_deployed.as_ref().map(|d| d.revision),
            })
    }
}

/// The cluster's pre-flight, before any push, whenever something will be installed (a dry run
/// of an install included: it fails where the real run would, before pushing). Without a
/// cluster (`--no-install`) there is no pre-flight.
pub async fn preflight(
    o: &Options,
    kube: Option<(cluster::KubeClient, KubeTarget)>,
    manifest: &BundleManifest,
    ev: Events<'_>,
) -> anyhow::Result<Preflight> {
    // The release namespace: Koordinator's guide installs into `default`; the chart's objects
    // go to its own namespace whatever this is (see cluster::preflight).
    let namespace = o
        .namespace
        .clone()
        .unwrap_or_else(|| DEFAULT_RELEASE_NAMESPACE.to_string());
    let Some((client, target)) = kube else {
        ev(Event::Said(
            "pre-flight not run: --no-install (nothing is installed)".into(),
        ));
        return Ok(Preflight {
            report: None,
            namespace,
            target: None,
            client: None,
        });
    };
    let mut platforms: Vec<String> = manifest
        .images
        .iter()
        .flat_map(|i| i.platforms.clone())
        .collect();
    platforms.sort();
    platforms.dedup();
    let crds: Vec<cluster::ChartCrd> = manifest
        .crds
        .iter()
        .map(|c| cluster::ChartCrd {
            name: c.name.clone(),
            plural: c.plural.clone(),
            values_key: c.values_key.clone(),
        })
        .collect();
    let input = cluster::PreflightInput {
        bundle_platforms: &platforms,
        crds: &crds,
        namespace: &namespace,
        namespace_explicit: o.namespace.is_some(),
        chart_namespace: CHART_NAMESPACE,
        release: &o.release,
        strict: o.strict,
        host_network: o.host_network,
        chart_version: &manifest.chart.version,
        allow_downgrade: o.allow_downgrade,
    };
    if let Some(w) = client.credentials_withheld() {
        ev(Event::Warning(format!("pre-flight: {w}")));
    }
    let mut report = cluster::preflight(&client, &input).await.map_err(|e| {
        anyhow::Error::new(e).context(
            "the pre-flight could not read the cluster: nothing was pushed (pass --no-install to push only)",
        )
    })?;
    report.skip(&o.skip_checks);
    ev(Event::Findings(report.findings.clone()));
    if report.failed() {
        return Err(ChecksFailed::new(
            "the pre-flight found problems the install would hit (above): nothing was pushed",
            &report.findings,
        )
        .into());
    }
    Ok(Preflight {
        namespace: report.release_namespace.clone(),
        report: Some(report),
        target: Some(target),
        client: Some(client),
    })
}
