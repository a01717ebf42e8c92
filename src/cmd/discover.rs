//! `build`'s image discovery: real `helm template` of the chart (exact, and it takes
//! `--values`/`--set` as helm does), bounded as every helm run is (`crate::helm`).

use crate::bundle::manifest::DiscoveryRecord;
use crate::chart::{self, ChartArchive, ChartImage};
use crate::cli::BuildArgs;
use crate::helm::{ChartSource, Helm, InstallPlan};
use anyhow::Context as _;
use serde_yaml_ng::Value;

/// The images `archive` deploys, rendered by `helm template` with the user's `--values` and
/// `--set`; and which helm rendered them. `origin` says where the chart came from (its URL,
/// the `--chart` file), for messages.
pub fn images(
    helm: &Helm,
    args: &BuildArgs,
    archive: &ChartArchive,
    archive_bytes: &[u8],
    origin: &str,
) -> anyhow::Result<(Vec<ChartImage>, DiscoveryRecord)> {
    // helm reads the chart from a file: the very bytes that go into the bundle.
    let dir = tempfile::tempdir().context("cannot create a temporary directory for helm")?;
    let path = dir.path().join("chart.tgz");
    std::fs::write(&path, archive_bytes)
        .with_context(|| format!("cannot write {}", path.display()))?;
    let mut plan = InstallPlan::new(
        chart::discover::RELEASE,
        chart::discover::NAMESPACE,
        ChartSource::Archive(path),
        Value::Mapping(Default::default()),
    );
    plan.user_values = args.values.clone();
    plan.user_sets = args.set.clone();
    let rendered = tokio::task::block_in_place(|| helm.template(&plan)).with_context(|| {
        format!(
            "helm {} could not render chart {} {} ({origin}) to find its images",
            helm.version,
            archive.meta().name,
            archive.meta().version
        )
    })?;
    let found = chart::rendered::images_in_manifests(&rendered)?;
    let images = chart::images_from_rendered(&found, archive)?;
    Ok((
        images,
        DiscoveryRecord {
            method: "helm".into(),
            helm_version: Some(format!("v{}", helm.version)),
        },
    ))
}

/// An image the chart deploys, as the source resolution takes it.
pub fn wanted(i: &ChartImage) -> crate::sources::resolve::Wanted {
    crate::sources::resolve::Wanted {
        ref_name: format!("{}:{}", i.repository, i.tag),
        component: i.component.clone(),
        host: i.host.clone(),
        repository: i.repository.clone(),
        tag: i.tag.clone(),
        original: i.reference(),
        fixed: None,
    }
}
