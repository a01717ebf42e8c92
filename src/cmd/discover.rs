//! `build`'s image discovery: real `helm template` when a helm binary is there (exact, and it
//! honours `--values`/`--set` as helm does), or the built-in template reader.

use crate::bundle::manifest::DiscoveryRecord;
use crate::chart::{self, ChartArchive, ChartImage};
use crate::cli::{BuildArgs, Discover};
use crate::helm::{ChartSource, Helm, InstallPlan};
use anyhow::Context as _;
use serde_yaml_ng::Value;

/// What to do when the built-in reader refuses a chart.
const BUILTIN_HINT: &str =
    "the built-in chart reader cannot evaluate this chart: install helm 3.5+ \
     (found on PATH, or given with --helm) so that `helm template` renders it, and build again";

/// The images `archive` deploys with `values` (the chart's merged with the user's), found as
/// `args.discover` says; and how they were found.
pub fn images(
    args: &BuildArgs,
    archive: &ChartArchive,
    archive_bytes: &[u8],
    values: &Value,
) -> anyhow::Result<(Vec<ChartImage>, DiscoveryRecord)> {
    let helm = match args.discover {
        Discover::Builtin => None,
        Discover::Helm => Some(
            Helm::find(
                args.helm.as_deref(),
                std::env::var_os(super::env::PATH).as_deref(),
                &crate::helm::FOR_LOAD,
            )
            .context(
                "--discover helm: no usable helm (install helm 3.5+ or pass --helm PATH; \
             --discover builtin reads the chart without it)",
            )?,
        ),
        // A helm that is absent (or too old) means the built-in reader.
        Discover::Auto => Helm::find(
            args.helm.as_deref(),
            std::env::var_os(super::env::PATH).as_deref(),
            &crate::helm::FOR_LOAD,
        )
        .ok(),
    };
    let Some(helm) = helm else {
        let images = chart::discover_images(archive, values).context(BUILTIN_HINT)?;
        return Ok((
            images,
            DiscoveryRecord {
                method: "builtin".into(),
                helm_version: None,
            },
        ));
    };
    // helm reads the chart from a file: the very bytes that go into the bundle.
    let dir = tempfile::tempdir().context("cannot create a temporary directory for helm")?;
    let path = dir.path().join(format!(
        "{}-{}.tgz",
        archive.meta().name,
        archive.meta().version
    ));
    std::fs::write(&path, archive_bytes)
        .with_context(|| format!("cannot write {}", path.display()))?;
    let mut plan = InstallPlan::new(
        "koordinator",
        "koordinator-system",
        ChartSource::Archive(path),
        Value::Mapping(Default::default()),
    );
    plan.user_values = args.values.clone();
    plan.user_sets = args.set.clone();
    let rendered = helm.template(&plan).with_context(|| {
        format!(
            "helm {} could not render chart {} {} (--discover builtin reads it without helm)",
            helm.version,
            archive.meta().name,
            archive.meta().version
        )
    })?;
    let found = chart::rendered::images_in_manifests(&rendered)?;
    let images = chart::discover::images_from_rendered(&found, values)?;
    Ok((
        images,
        DiscoveryRecord {
            method: "helm".into(),
            helm_version: Some(format!("v{}", helm.version)),
        },
    ))
}
