//! The install, planned once before anything is pushed.

use super::preflight::Preflight;
use super::{Event, Events, Options};
use crate::bundle::source::BundleSource;
use crate::cluster;
use crate::helm::{self, ChartSource, Helm, InstallPlan};
use crate::oci::{Descriptor, Target};
use anyhow::{bail, Context as _};
use futures_util::TryStreamExt as _;
use std::path::{Path, PathBuf};

/// The install, planned once before anything is pushed: the plan helm runs (the chart from
/// the registry, the generated values, how the release's values carry over, the
/// post-renderer), and the chart archive a render before the push uses.
#[derive(Debug)]
pub struct Planned {
    /// What helm runs.
    pub plan: InstallPlan,
    /// The bundle's chart archive, in `_tmp`.
    pub archive: PathBuf,
    _tmp: tempfile::TempDir,
}

/// Write the chart archive (the Helm artifact's layer, read from the bundle in place) into
/// `dir`.
async fn extract_chart(src: &BundleSource, dir: &Path) -> anyhow::Result<PathBuf> {
    let chart = &src.manifest().chart;
    let desc = Descriptor {
        media_type: crate::oci::media::HELM_CHART.into(),
        digest: chart.digest.clone(),
        size: src
            .blob_size(&chart.digest)
            .context("the chart archive is not among the bundle's blobs")?,
        platform: None,
        annotations: None,
    };
    use crate::store::Source as _;
    let pieces: Vec<bytes::Bytes> = src.blob("", &desc, 0).await?.try_collect().await?;
    let bytes = pieces.concat();
    if crate::oci::Digest::of(&bytes) != chart.digest {
        bail!(
            "the chart archive in {} does not match its digest",
            src.path().display()
        );
    }
    let name = Path::new(&chart.file)
        .file_name()
        .context("the chart file has no name")?;
    let out = dir.join(name);
    std::fs::write(&out, bytes).with_context(|| format!("writing {}", out.display()))?;
    Ok(out)
}

/// What would stop helm after the push, checked before it: helm 3 cannot reach a TLS registry
/// on a loopback address (it speaks plain HTTP there), so the install from it would fail.
pub fn check_helm_reaches_registry(o: &Options, helm: &Helm) -> anyhow::Result<()> {
    if !helm.supports_oci() {
        // helm before 3.8 installs the bundle's chart archive: no registry involved.
        return Ok(());
    }
    if let Some(hint) = o.registry.loopback_tls_hint(helm) {
        bail!(
            "helm {} cannot install the chart from {}: {hint}; nothing was pushed",
            helm.version,
            o.target.host_and_prefix()
        );
    }
    Ok(())
}

/// The oldest helm whose `--post-renderer` takes arguments (`--post-renderer-args`).
const POST_RENDERER_ARGS: semver::Version = semver::Version::new(3, 10, 0);

/// helm's post-renderer: `koord-bundle post-render` (the CRDs kept on uninstall), unless
/// `--no-keep-crds` or helm is too old for it (said).
fn post_renderer(
    o: &Options,
    src: &BundleSource,
    helm: Option<&Helm>,
    ev: Events<'_>,
) -> anyhow::Result<Option<helm::PostRenderer>> {
    let how = crate::chart::post_render::PostRender {
        keep_crds: o.keep_crds,
        pin: if o.pin {
            pins(&o.target, src)
        } else {
            Default::default()
        },
        keep_pull_policy: o.keep_pull_policy,
    };
    if how.is_noop() {
        return Ok(None);
    }
    if helm.is_some_and(|h| h.version < POST_RENDERER_ARGS) {
        ev(Event::Warning(format!(
            "helm before {POST_RENDERER_ARGS} cannot run koord-bundle as its post-renderer: the images are installed by tag, not pinned to the bundle's digests, and the chart's CRDs without helm.sh/resource-policy: keep, so `helm uninstall` would delete them and every object of theirs"
        )));
        return Ok(None);
    }
    Ok(Some(helm::PostRenderer {
        exe: o
            .exe
            .clone()
            .context("cannot find the koord-bundle executable for helm's post-renderer")?,
        config_json: serde_json::to_string(&how)?,
    }))
}

/// Every image of the bundle as the chart renders it under the target registry → its digest
/// in the bundle.
pub(super) fn pins(
    target: &Target,
    src: &BundleSource,
) -> std::collections::BTreeMap<String, String> {
    src.manifest()
        .images
        .iter()
        .map(|i| {
            (
                format!("{}/{}", target.host_and_prefix(), i.ref_name),
                i.digest.to_string(),
            )
        })
        .collect()
}

/// Plan the install: values, chart, the release's values carried over, the post-renderer.
pub async fn plan(
    o: &Options,
    src: &BundleSource,
    helm: Option<&Helm>,
    pre: &Preflight,
    ev: Events<'_>,
) -> anyhow::Result<Planned> {
    let (target, manifest) = (&o.target, src.manifest());
    let preflight = pre.report.as_ref();
    let chart_repo = format!("charts/{}", manifest.chart.name);
    let mut crds_off: Vec<String> = o.skip_crds.clone();
    if let Some(r) = preflight {
        for k in &r.crd_values_off {
            let k = k.trim_start_matches("crds.").to_string();
            if !crds_off.contains(&k) {
                crds_off.push(k);
            }
        }
    }
    let host_network = o.host_network || preflight.is_some_and(|r| r.host_network);
    let values = crate::chart::generated_values(
        &target.host_and_prefix(),
        o.feature_gates.as_deref(),
        &crds_off,
        host_network,
        &o.image_pull_secrets,
    );
    let tmp = tempfile::tempdir()?;
    let archive = extract_chart(src, tmp.path()).await?;
    // The chart a real run installs: from the registry (helm 3.8+), else the bundle's archive.
    let chart_source = match &helm {
        Some(h) if h.supports_oci() => ChartSource::Oci {
            reference: format!("oci://{}/{chart_repo}", target.host_and_prefix()),
            version: manifest.chart.version.clone(),
        },
        _ => ChartSource::Archive(archive.clone()),
    };
    let existing = preflight.and_then(|r| r.existing_release.as_ref());
    let kube = pre.target.as_ref();
    let plan = InstallPlan {
        release: o.release.clone(),
        namespace: pre.namespace.clone(),
        create_namespace: preflight.is_some_and(|r| r.create_namespace),
        chart: chart_source,
        generated_values: values,
        user_values: o.values.clone(),
        user_sets: o.sets.clone(),
        values_mode: o.values_mode,
        previous_values: existing
            .and_then(|r| r.values.as_ref())
            .and_then(|v| serde_yaml_ng::to_value(v).ok()),
        post_render: post_renderer(o, src, helm, ev)?,
        // helm gets the kubeconfig files and the context the pre-flight read: one file as
        // --kubeconfig, a $KUBECONFIG list (which --kubeconfig cannot take) in its environment.
        kubeconfig: kube
            .filter(|t| t.files.origin == cluster::Origin::Flag)
            .and_then(|t| t.files.paths.first().cloned()),
        kubeconfig_env: kube
            .filter(|t| t.files.origin == cluster::Origin::Env)
            .and_then(|t| t.files.env_value()),
        context: kube
            .map(|t| t.context.clone())
            .or_else(|| o.context.clone()),
        registry: Some(o.registry.clone()),
        wait: false,
        timeout: None,
    };
    Ok(Planned {
        plan,
        archive,
        _tmp: tmp,
    })
}
