//! `load` and the upstream cosign signatures a bundle carries (`build --with-signatures`): they
//! are pushed unchanged (same digests) under their tags, so that a policy naming the upstream
//! key admits the images at the site, except where the registry's tag already holds every
//! signature the carried manifest holds: that is the carried manifest with signatures appended
//! since (`load --sign-images` appends the site's, which gives the `.sig` a new digest; or a
//! `cosign sign` at the site), and pushing the carried one again would drop them. A tag that
//! holds other signatures only is not overwritten either: a warning says the upstream one is
//! not pushed there.
//!
//! A carried OCI 1.1 referrer is pushed unchanged by its digest. Where the registry serves the
//! referrers API it lists the referrer itself (by its `subject`); where it answers 404
//! (distribution 2.8), [`list_referrers`] adds it to the referrers tag schema's index
//! (`sha256-<hex>` of the subject), as the OCI distribution spec 1.1 tells a client pushing a
//! manifest with a `subject` to such a registry: that is where cosign `--experimental-oci11`
//! and every OCI 1.1 client look there. Converting it into the tag scheme instead would change
//! its bytes (another digest), and the upstream may have signed through referrers only
//! (`cosign sign --registry-referrers-mode=oci-1-1` writes no `.sig` tag).

use super::listed;
use crate::admission::referrers;
use crate::bundle::manifest::SignatureRecord;
use crate::bundle::source::BundleSource;
use crate::copy::Graph;
use crate::oci::{media, Digest};
use crate::progress::Progress;
use crate::store::registry::RegistryStore;
use crate::store::{Reference, Registry};
use anyhow::Context as _;
use std::collections::{BTreeMap, BTreeSet};

/// The signatures a cosign signature manifest holds: each layer's digest (the signed payload,
/// or an attestation's signed envelope) with the signature its descriptor carries
/// (`dev.cosignproject.cosign/signature`; "" for an attestation, signed inside its layer).
/// The same payload signed by another key, or a signature forged, is another pair. Empty:
/// none, or not a manifest.
fn signatures(bytes: &[u8]) -> BTreeSet<(Digest, String)> {
    let v: serde_json::Value = serde_json::from_slice(bytes).unwrap_or_default();
    v["layers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|l| {
                    let digest = serde_json::from_value(l["digest"].clone()).ok()?;
                    let signature = l["annotations"]["dev.cosignproject.cosign/signature"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    Some((digest, signature))
                })
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
    graphs: Vec<(Graph, String, Reference)>,
    progress: &Progress,
) -> anyhow::Result<Vec<(Graph, String, Reference)>> {
    let carried: BTreeSet<&str> = src
        .manifest()
        .images
        .iter()
        .flat_map(|i| &i.signatures)
        .filter(|s| !s.is_referrer())
        .map(|s| s.ref_name.as_str())
        .collect();
    if carried.is_empty() {
        return Ok(graphs);
    }
    let (mut out, mut appended, mut foreign) = (Vec::new(), 0usize, Vec::new());
    for (g, repo, reference) in graphs {
        let tagged = matches!(reference, Reference::Tag(_));
        if !tagged || !carried.contains(reference.qualify(&repo).as_str()) {
            out.push((g, repo, reference));
            continue;
        }
        let at = store.image(&repo, &reference)?;
        match reg.get_manifest(&at).await {
            Ok((_, d)) if d == g.top.digest => out.push((g, repo, reference)),
            Ok((bytes, _)) => {
                // Appended: every carried signature is there, the same payload with the same
                // signature (not only the same payload, which another key can sign).
                if signatures(&g.top.bytes).is_subset(&signatures(&bytes)) {
                    appended += 1;
                } else {
                    foreign.push(at.to_string());
                }
            }
            Err(e) if e.is_not_found() => out.push((g, repo, reference)),
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

/// After the push: each carried OCI 1.1 referrer listed where clients look for it (see the
/// module's doc): by the registry itself where it serves the referrers API, else in the
/// `sha256-<hex>` index of its subject, added to what that index lists (nothing is pushed when
/// it lists them all). Says which. Fails closed: a registry whose referrers API does not list
/// a referrer it accepted (asked again after the waits of [`listed::ASK_WAITS`]) is an error,
/// before the install.
pub(super) async fn list_referrers(
    reg: &Registry,
    store: &RegistryStore,
    src: &BundleSource,
    progress: &Progress,
) -> anyhow::Result<()> {
    let mut by_subject: BTreeMap<(String, Digest), Vec<&SignatureRecord>> = BTreeMap::new();
    for s in src
        .manifest()
        .images
        .iter()
        .flat_map(|i| &i.signatures)
        .filter(|s| s.is_referrer())
    {
        let repo = s
            .ref_name
            .split_once('@')
            .map(|(r, _)| r.to_string())
            .with_context(|| format!("ref name {:?} is not REPOSITORY@DIGEST", s.ref_name))?;
        by_subject
            .entry((repo, s.signs.clone()))
            .or_default()
            .push(s);
    }
    if by_subject.is_empty() {
        return Ok(());
    }
    let (mut by_api, mut indexed, mut there) = (0usize, 0usize, 0usize);
    // Referrers the registry's API does not list yet.
    let mut unlisted = listed::Wanted::new();
    for ((repo, signs), recs) in &by_subject {
        let subject = store.image(repo, &Reference::Digest(signs.clone()))?;
        let not_a_list = |what: &str, reason: String| {
            anyhow::anyhow!(
                "{what} is not a referrers list ({reason}): the {} carried OCI 1.1 referrers of {subject} were pushed by digest but are not listed; check the registry (or what is in front of it), or delete what is there, and re-run",
                recs.len()
            )
        };
        let answer = reg
            .referrers(&subject, signs)
            .await
            .with_context(|| format!("asking for the OCI 1.1 referrers of {subject}"))?;
        if let Some(bytes) = answer {
            let want: Vec<(Digest, String)> = recs
                .iter()
                .map(|r| {
                    (
                        r.digest.clone(),
                        format!("{}/{}", subject.registry, r.ref_name),
                    )
                })
                .collect();
            let missing = listed::not_listed(&bytes, &want)
                .map_err(|r| not_a_list("the registry's referrers answer", r))?;
            by_api += recs.len() - missing.len();
            if !missing.is_empty() {
                unlisted.push((subject, signs.clone(), missing));
            }
            continue;
        }
        let tag = referrers::fallback_tag(signs);
        let at = store.image(repo, &Reference::Tag(tag))?;
        let mut index = match reg.get_manifest(&at).await {
            Ok((bytes, _)) => {
                referrers::parse_list(&bytes).map_err(|r| not_a_list(&at.to_string(), r))?;
                serde_json::from_slice::<serde_json::Value>(&bytes)?
            }
            Err(e) if e.is_not_found() => serde_json::json!({
                "schemaVersion": 2,
                "mediaType": media::OCI_INDEX,
                "manifests": [],
            }),
            Err(e) => return Err(e).with_context(|| format!("reading {at}")),
        };
        let listed: BTreeSet<String> = index["manifests"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|d| d["digest"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let mut added = 0usize;
        for r in recs {
            if listed.contains(r.digest.as_str()) {
                there += 1;
                continue;
            }
            let m = crate::store::Source::manifest(src, repo, &Reference::Digest(r.digest.clone()))
                .await
                .with_context(|| format!("{} in the bundle", r.ref_name))?;
            if let Some(a) = index["manifests"].as_array_mut() {
                a.push(referrers::list_entry(&m.bytes, &r.media_type));
                added += 1;
            }
        }
        if added > 0 {
            let bytes = bytes::Bytes::from(serde_json::to_vec(&index)?);
            reg.put_manifest(&at, &bytes, media::OCI_INDEX)
                .await
                .with_context(|| format!("pushing the referrers index {at}"))?;
            indexed += added;
        }
    }
    // Asked once above.
    by_api += listed::ask_until_listed(reg, &mut unlisted, &listed::ASK_WAITS[1..]).await?;
    if !unlisted.is_empty() {
        return Err(listed::unlisted_error(
            &unlisted,
            "the carried referrers it accepted",
            "Check the registry's referrers support, and any proxy in front of it, or load a bundle built without --with-signatures",
        ));
    }
    let n: usize = by_subject.values().map(Vec::len).sum();
    let mut line = format!(
        "upstream {n} OCI 1.1 {} carried by the bundle: pushed unchanged by digest",
        crate::text::plural(n, "referrer", "referrers")
    );
    if by_api > 0 {
        line.push_str(&format!(
            "; {by_api} listed by the registry's referrers API"
        ));
    }
    if indexed + there > 0 {
        line.push_str(&format!(
            "; the registry serves no referrers API (404): {indexed} added to the referrers tag schema's sha256-<hex> index of its subject ({there} listed there already), where OCI 1.1 clients such as cosign --experimental-oci11 look"
        ));
    }
    progress.say(line);
    Ok(())
}
