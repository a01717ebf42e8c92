//! The release rendered and checked against the cluster, before any push.

use super::plan::{pins, Planned};
use super::preflight::Preflight;
use super::{ChecksFailed, Event, Events, Options};
use crate::bundle::source::BundleSource;
use crate::cluster;
use crate::helm::{self, ChartSource, Helm};
use anyhow::{bail, Context as _};

/// What the render before the push found: helm's release as it would be, and the checks of
/// the second day against the cluster.
#[derive(Debug)]
pub struct Rendered {
    /// The release as helm would make it.
    pub release: helm::RenderedRelease,
    /// Every container image it names.
    pub images: Vec<String>,
    /// The checks of the new release against the cluster.
    pub upgrade: cluster::upgrade::UpgradeReport,
}

/// Every image of the bundle, by the repositories that name it (its chart path, which matches
/// it under the target registry too, and where it came from), for the scan of the rendering.
fn carried(src: &BundleSource) -> Vec<crate::chart::rendered::Carried> {
    src.manifest()
        .images
        .iter()
        .map(|i| {
            let mut repositories = vec![i.repository.clone()];
            for r in [&i.original, &i.source_ref] {
                if let Ok(p) = crate::oci::ImageRef::parse(r) {
                    repositories.push(format!("{}/{}", p.registry, p.repository));
                    repositories.push(p.repository);
                }
            }
            repositories.sort();
            repositories.dedup();
            crate::chart::rendered::Carried {
                name: i.ref_name.clone(),
                repositories,
            }
        })
        .collect()
}

/// The level of a bundle image the release will run unpinned: a Warn, a Fail under `--strict`.
fn unpinned_level(strict: bool) -> cluster::Level {
    if strict {
        cluster::Level::Fail
    } else {
        cluster::Level::Warn
    }
}

/// A Warn for each image of the bundle named outside a container's image field (a Fail under
/// `--strict`): the post-renderer pins only container images, so that one runs by tag.
fn mention_findings(
    mentions: &[crate::chart::rendered::ImageMention],
    strict: bool,
) -> Vec<cluster::Finding> {
    mentions
        .iter()
        .map(|m| {
            cluster::Finding::new(
                unpinned_level(strict),
                "image-outside-containers",
                format!(
                    "{}: it is not pinned to the bundle's digest, and whatever uses it pulls the tag as the registry holds it then",
                    m
                ),
                Some(if strict {
                    "name the image in a container's image field, or change the values that put it there".to_string()
                } else {
                    "check that it names the image under the registry loaded into; pass --strict to refuse such a rendering".to_string()
                }),
            )
            .about(format!("{} {}", m.object, m.path))
        })
        .collect()
}

/// A Warn for each container image of the bundle the rendered release still names by its tag
/// although pinning is on (a Fail under `--strict`): the post-renderer did not see it (helm 3
/// does not post-render hooks, helm/helm#7891; helm 4 does), so it runs by tag.
fn by_tag_findings(
    images: &[String],
    pins: &std::collections::BTreeMap<String, String>,
    strict: bool,
) -> Vec<cluster::Finding> {
    images
        .iter()
        .filter(|i| pins.contains_key(*i))
        .map(|i| {
            cluster::Finding::new(
                unpinned_level(strict),
                "image-not-pinned",
                format!(
                    "image {}: the rendered release names it by its tag, not pinned to the bundle's digest (helm 3 does not post-render a chart's hooks; helm 4 does): it runs the tag as the registry holds it then",
                    crate::text::printable(i)
                ),
                Some(if strict {
                    "install with helm 4, which post-renders hooks, or pass --no-pin to install by tag on purpose".to_string()
                } else {
                    "install with helm 4, which post-renders hooks; pass --strict to refuse such a rendering".to_string()
                }),
            )
            .about(format!("image {}", crate::text::printable(i)))
        })
        .collect()
}

/// Before any push: the release as helm will make it (`helm upgrade --install --dry-run=server
/// -o json` from the bundle's chart archive: the merged values, the post-rendered objects),
/// every image it deploys checked to be in the bundle, and the upgrade checked against the
/// cluster (what changes, what the CRDs do to existing objects, a server-side dry run).
/// `None` without a cluster.
pub async fn render(
    o: &Options,
    src: &BundleSource,
    helm: &Helm,
    planned: &Planned,
    pre: &Preflight,
    ev: Events<'_>,
) -> anyhow::Result<Option<Rendered>> {
    let Some(client) = &pre.client else {
        return Ok(None);
    };
    let target = &o.target;
    let mut plan = planned.plan.clone();
    plan.chart = ChartSource::Archive(planned.archive.clone());
    let release = tokio::task::block_in_place(|| helm.render_release(&plan)).context(
        "helm could not render the release (a dry run against the cluster): nothing was pushed",
    )?;
    // Every rendered document read strictly (hooks too): its container images, and the
    // images of the bundle it names anywhere else (not pinned, not checked below).
    let scan = crate::chart::rendered::scan(&release.all_manifests(), &carried(src))
        .context("the release helm rendered: nothing was pushed")?;
    let images = scan.images;
    // As the chart renders them, and as pinned to the bundle's digest (the post-renderer).
    let pinned = pins(target, src);
    let bundled: Vec<String> = pinned
        .iter()
        .flat_map(|(r, d)| [crate::chart::post_render::pinned(r, d), r.clone()])
        .collect();
    let foreign: Vec<&String> = images.iter().filter(|i| !bundled.contains(i)).collect();
    if !foreign.is_empty() {
        bail!(
            "the rendered chart uses images the bundle does not hold under {}: {}; nothing was pushed",
            target.host_and_prefix(),
            foreign.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        );
    }
    let mut mentions = mention_findings(&scan.mentions, o.strict);
    if o.pin && planned.plan.post_render.is_some() {
        mentions.extend(by_tag_findings(&images, &pinned, o.strict));
    }
    ev(Event::Findings(mentions.clone()));
    if o.strict && !mentions.is_empty() {
        return Err(ChecksFailed::new(
            "--strict: the rendered chart names images of the bundle unpinned, outside a container's image field or by their tag (above): nothing was pushed",
            &mentions,
        )
        .into());
    }
    let objects = crate::chart::post_render::objects(&release.manifest)
        .context("the release helm rendered")?;
    // The current revision's objects, for what the upgrade changes; a manifest that does not
    // parse makes the changes unknown (said so), not "nothing removed".
    let (previous, previous_unreadable) = match pre
        .report
        .as_ref()
        .and_then(|r| r.existing_release.as_ref())
        .and_then(|r| r.manifest.as_deref())
        .map(crate::chart::post_render::objects)
    {
        Some(Ok(objects)) => (objects, None),
        Some(Err(e)) => (Vec::new(), Some(format!("{e:#}"))),
        None => (Vec::new(), None),
    };
    let mut upgrade = cluster::upgrade::check(
        client,
        &cluster::upgrade::UpgradeInput {
            objects: &objects,
            previous: &previous,
            previous_unreadable: previous_unreadable.as_deref(),
            release_namespace: &pre.namespace,
            strict: o.strict,
            allow_field_loss: o.allow_field_loss,
        },
    )
    .await
    .map_err(|e| {
        anyhow::Error::new(e)
            .context("the checks of the new release could not read the cluster: nothing was pushed")
    })?;
    ev(Event::Findings(upgrade.findings.clone()));
    upgrade.findings.extend(mentions);
    if upgrade.failed() {
        return Err(ChecksFailed::new(
            "the new release would fail or lose objects in the cluster (above): nothing was pushed",
            &upgrade.findings,
        )
        .into());
    }
    Ok(Some(Rendered {
        release,
        images,
        upgrade,
    }))
}
