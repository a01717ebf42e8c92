//! The push: every graph of the bundle into the registry, digests unchanged.

use crate::bundle::source::{split_ref, BundleSource};
use crate::copy::{self, Item};
use crate::store::{OnBytes, Reference};
use crate::text::human_bytes;
use anyhow::Context as _;
use futures_util::TryStreamExt as _;

/// Every graph the bundle names, with the repository and the reference it goes under.
pub type Graphs = Vec<(copy::Graph, String, Reference)>;

/// Every graph the bundle names (its images, their carried cosign signatures and
/// attestations, and the chart artifact), each with the repository and the tag (or digest) it
/// goes under, resolved by the walk from the verified manifests. A carried signature goes to
/// its own tag (`sha256-<hex>.sig`) unchanged, before `--sign-images` appends the site's to
/// it; a carried OCI 1.1 referrer by its digest (`upstream_sigs::list_referrers` lists it).
pub async fn graphs(src: &BundleSource) -> anyhow::Result<Graphs> {
    let m = src.manifest();
    let mut out = Vec::new();
    let budget = copy::Budget::default();
    let sigs = m.images.iter().flat_map(|i| &i.signatures);
    for (r, by_digest) in m
        .images
        .iter()
        .map(|i| (&i.ref_name, None))
        .chain(sigs.map(|s| (&s.ref_name, s.is_referrer().then_some(&s.digest))))
        .chain(std::iter::once((&m.chart.oci.ref_name, None)))
    {
        let (repo, reference) = match by_digest {
            Some(d) => (
                r.split_once('@')
                    .map(|(repo, _)| repo)
                    .with_context(|| format!("ref name {r:?} is not REPOSITORY@DIGEST"))?,
                Reference::Digest(d.clone()),
            ),
            None => {
                let (repo, tag) = split_ref(r)
                    .with_context(|| format!("ref name {r:?} is not REPOSITORY:TAG"))?;
                (repo, Reference::Tag(tag.to_string()))
            }
        };
        let g = copy::resolve(src, repo, &reference, None, &budget)
            .await
            .with_context(|| format!("{} in the bundle", reference.qualify(repo)))?;
        out.push((g, repo.to_string(), reference));
    }
    Ok(out)
}

/// Does every tag in the registry already point at its graph's top manifest?
pub async fn tags_in_place<K: crate::store::Sink>(
    sink: &K,
    graphs: &[(copy::Graph, String, Reference)],
    jobs: usize,
) -> anyhow::Result<bool> {
    use futures_util::StreamExt as _;
    let found: Vec<bool> = futures_util::stream::iter(graphs)
        .map(|(g, repo, reference)| async move {
            crate::store::Sink::has_manifest(sink, repo, reference, &g.top.digest).await
        })
        .buffered(jobs.max(1))
        .try_collect()
        .await?;
    Ok(found.iter().all(|f| *f))
}

/// The bytes [`push`] walks (its progress bar's size). Checked: a digest with two sizes, or
/// sizes that add up past 2^63 - 1, are refused.
pub fn push_bytes(graphs: &[(copy::Graph, String, Reference)]) -> anyhow::Result<u64> {
    Ok(copy::totals(graphs.iter().map(|(g, _, _)| g), &Default::default())?.bytes)
}

/// Copy every graph into the registry, each under its repository and tag: the one walk, from
/// the bundle read in place (`dry_run`: nothing is sent, what would be is counted).
pub async fn push<K: crate::store::Sink>(
    src: &BundleSource,
    sink: &K,
    graphs: &[(copy::Graph, String, Reference)],
    jobs: usize,
    dry_run: bool,
    on_bytes: OnBytes,
) -> anyhow::Result<copy::Stats> {
    let m = src.manifest();
    let items: Vec<Item> = graphs
        .iter()
        .map(|(g, repo, reference)| Item {
            graph: g,
            repo: repo.clone(),
            reference: reference.clone(),
        })
        .collect();
    let omitted = m.omitted_blobs.iter().map(|o| o.digest.clone()).collect();
    Ok(copy::transfer(
        src,
        sink,
        &items,
        &copy::Options {
            jobs,
            omitted: &omitted,
            omitted_policy: copy::Omitted::Require,
            dry_run,
            on_bytes,
        },
    )
    .await?)
}

/// What a failed push says: for blobs an incremental bundle left out and the registry lacks
/// (found before anything is pushed), which bundle to load first; else that a re-run finishes.
pub fn push_failed(
    e: anyhow::Error,
    m: &crate::bundle::BundleManifest,
    dry_run: bool,
) -> anyhow::Error {
    let missing = e.chain().any(|c| {
        matches!(
            c.downcast_ref(),
            Some(copy::WalkError::MissingOnSite { .. })
        )
    });
    match (&m.base, missing) {
        (Some(base), true) => e.context(format!(
            "this is an incremental bundle: the registry lacks blobs it left out, because its base carried them; load its base, {}, into the same registry first, then this one; nothing was pushed",
            base.describe()
        )),
        _ if dry_run => e.context("checking the registry"),
        _ => e.context("push failed: nothing was installed; re-run the same command to finish (what is there is skipped)"),
    }
}

/// What the push did with the blobs, in the same words on the progress line and in the
/// summary: `pushed 3 of 26 blobs (1.2 MiB), 23 already there (3.8 MiB), 8 mounted across
/// repositories` (each blob counted once, whatever number of repositories use it; the bytes
/// pushed are the bytes sent), `would push …, would mount …` in a dry run.
pub fn blob_counts(stats: &copy::Stats, dry_run: bool) -> String {
    let (push, mount) = if dry_run {
        ("would push", "would mount")
    } else {
        ("pushed", "mounted")
    };
    let mounts = if stats.mounted > 0 {
        format!(", {mount} {} across repositories", stats.mounted)
    } else {
        String::new()
    };
    format!(
        "{push} {} of {} {} ({}), {} already there ({}){mounts}",
        stats.uploaded,
        stats.blobs,
        crate::text::plural(stats.blobs, "blob", "blobs"),
        human_bytes(stats.uploaded_bytes),
        stats.skipped,
        human_bytes(stats.skipped_bytes)
    )
}
