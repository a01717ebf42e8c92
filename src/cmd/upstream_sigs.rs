//! `load` and the upstream cosign signatures a bundle carries (`build --with-signatures`): they
//! are pushed unchanged (same digests) under their tags, so that a policy naming the upstream
//! key admits the images at the site, except where the registry's tag already holds every
//! signature the carried manifest holds: that is the carried manifest with signatures appended
//! since (`load --sign-images` appends the site's, which gives the `.sig` a new digest; or a
//! `cosign sign` at the site), and pushing the carried one again would drop them. A tag that
//! holds other signatures only is not overwritten either: a warning says the upstream one is
//! not pushed there.

use crate::bundle::source::BundleSource;
use crate::copy::Graph;
use crate::oci::Digest;
use crate::progress::Progress;
use crate::store::registry::RegistryStore;
use crate::store::{Reference, Registry};
use anyhow::Context as _;
use std::collections::BTreeSet;

/// The layer digests of an image manifest (empty: none, or not one).
fn layers(bytes: &[u8]) -> BTreeSet<Digest> {
    let v: serde_json::Value = serde_json::from_slice(bytes).unwrap_or_default();
    v["layers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|l| serde_json::from_value(l["digest"].clone()).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// `graphs` (each with the repository and tag it goes under) less the carried signature
/// manifests the registry must keep as they are; says what happens to the carried ones.
pub(super) async fn keep_appended(
    reg: &Registry,
    store: &RegistryStore,
    src: &BundleSource,
    graphs: Vec<(Graph, String, String)>,
    progress: &Progress,
) -> anyhow::Result<Vec<(Graph, String, String)>> {
    let carried: BTreeSet<&str> = src
        .manifest()
        .images
        .iter()
        .flat_map(|i| &i.signatures)
        .map(|s| s.ref_name.as_str())
        .collect();
    if carried.is_empty() {
        return Ok(graphs);
    }
    let (mut out, mut appended, mut foreign) = (Vec::new(), 0usize, Vec::new());
    for (g, repo, tag) in graphs {
        if !carried.contains(format!("{repo}:{tag}").as_str()) {
            out.push((g, repo, tag));
            continue;
        }
        let at = store.image(&repo, &Reference::Tag(tag.clone()))?;
        match reg.get_manifest(&at).await {
            Ok((_, d)) if d == g.top.digest => out.push((g, repo, tag)),
            Ok((bytes, _)) => {
                let there = layers(&bytes);
                if layers(&g.top.bytes).is_subset(&there) {
                    appended += 1;
                } else {
                    foreign.push(at.to_string());
                }
            }
            Err(e) if e.is_not_found() => out.push((g, repo, tag)),
            Err(e) => return Err(e).with_context(|| format!("reading {at}")),
        }
    }
    let n = carried.len();
    let mut line = format!(
        "upstream {n} cosign signature and attestation {} carried by the bundle: pushed unchanged under their tags, so a policy naming the upstream key admits the images here",
        crate::text::plural(n, "manifest", "manifests")
    );
    if appended > 0 {
        line.push_str(&format!(
            "; {appended} kept as the registry holds them (the carried signatures with others appended since, by --sign-images or cosign: a new digest, the upstream signature inside)"
        ));
    }
    progress.say(line);
    if !foreign.is_empty() {
        progress.warn(format!(
            "{} already {} other signatures: not overwritten, so the upstream signature is NOT pushed there (delete the tag and re-run to carry it): {}",
            foreign.len(),
            if foreign.len() == 1 { "holds" } else { "hold" },
            foreign.join(", ")
        ));
    }
    Ok(out)
}
