//! `build --with-signatures [--verify-key PUB] [--allow-unsigned-images]`: each image's cosign
//! signatures and attestations, read from its source in the tag scheme and as OCI 1.1
//! referrers (where the source serves the referrers API, or keeps the referrers tag schema's
//! index) for its index and each platform manifest (`admission::upstream`), and added to the
//! plan, so that the bundle carries them and `load` pushes them unchanged.
//!
//! Which digests must be signed with `--verify-key`: the image's top manifest, as the chart
//! (and a pinned release) pulls it; when a platform filter rewrote the index (a new digest
//! nobody signed), each kept platform manifest instead. One that is not is refused (fail
//! closed) unless `--allow-unsigned-images`.
//!
//! Only a tag that is not there means "unsigned": a signature that could not be read (the
//! registry failing, refusing the login, a blob of the tag missing) ends the build, whatever
//! the flags, as nobody can tell then whether the image is signed.

use super::settings::Settings;
use crate::admission::attach::{self, Kind};
use crate::admission::upstream::{self, Found, ListedBy, Scheme, UpstreamKey};
use crate::bundle::manifest::{SignatureRecord, REFERRER_SCHEME};
use crate::bundle::plan::{CarriedSignature, ImageInput};
use crate::cli::BuildArgs;
use crate::oci::Digest;
use crate::progress::Progress;
use futures_util::{StreamExt as _, TryStreamExt as _};

/// `--verify-key`, read before anything else is done.
pub(super) fn key(args: &BuildArgs) -> anyhow::Result<Option<UpstreamKey>> {
    Ok(match &args.verify_key {
        Some(p) => Some(UpstreamKey::read(p)?),
        None => None,
    })
}

/// The digests of `image` whose signatures are looked for, each with whether it must be
/// signed (under `--verify-key`).
fn digests(image: &ImageInput) -> Vec<(Digest, bool)> {
    let g = &image.graph;
    let rewritten = g.top.digest != g.upstream.digest;
    let mut out = Vec::new();
    if !rewritten {
        out.push((g.top.digest.clone(), true));
    }
    for m in image.record().manifests {
        let attestation =
            m.attestation_of.is_some() || m.platform.as_deref() == Some("unknown/unknown");
        if m.digest != g.top.digest && !attestation {
            out.push((m.digest, rewritten));
        }
    }
    out
}

/// Read every image's signatures and attestations into `images`; say what was carried.
pub(super) async fn carry(
    args: &BuildArgs,
    settings: &Settings,
    key: Option<&UpstreamKey>,
    images: &mut [ImageInput],
    progress: &Progress,
) -> anyhow::Result<()> {
    if !args.with_signatures {
        return Ok(());
    }
    let budget = crate::copy::Budget::default();
    let src = &settings.registries;
    let mut unsigned: Vec<String> = Vec::new();
    let (mut manifests, mut signed) = (0usize, 0usize);
    // Referrers carried; digests whose source served the API, kept the fallback tag, neither.
    let (mut referred, mut by_api, mut by_tag, mut by_none) = (0usize, 0usize, 0usize, 0usize);
    // Two tags of one repository with the same digest share its signature tag: carried once.
    let mut seen = std::collections::BTreeSet::new();
    for image in images.iter_mut() {
        let wanted = digests(image);
        let lookups: Vec<(Digest, bool, Kind)> = wanted
            .iter()
            .flat_map(|(d, must)| {
                [Kind::Signature, Kind::Attestation].map(|k| (d.clone(), *must, k))
            })
            .collect();
        let (name, repo) = (image.ref_name.clone(), image.graph.repo.clone());
        let found: Vec<(Digest, bool, Kind, Option<Found>)> = futures_util::stream::iter(lookups)
            .map(|(d, must, kind)| {
                let (name, repo, budget) = (&name, &repo, &budget);
                async move {
                    lookup(src, name, repo, &d, kind, key, budget)
                        .await
                        .map(|f| (d, must, kind, f))
                }
            })
            .buffered(args.jobs.max(1))
            .try_collect()
            .await?;
        let refs: Vec<(Digest, upstream::Referred)> = futures_util::stream::iter(&wanted)
            .map(|(d, _)| {
                let (name, repo, budget) = (&name, &repo, &budget);
                async move {
                    upstream::fetch_referrers(src, name, repo, d, key, budget)
                        .await
                        .map(|r| (d.clone(), r))
                }
            })
            .buffered(args.jobs.max(1))
            .try_collect()
            .await?;
        // The digests a signature was found for, by either scheme.
        let mut signed_digests = std::collections::BTreeSet::new();
        let mut keep = |image: &mut ImageInput, f: Found| {
            if f.kind == Kind::Signature {
                signed_digests.insert(f.signs.clone());
            }
            let c = carried(&image.repository, f);
            if seen.insert(c.record.ref_name.clone()) {
                manifests += 1;
                if c.record.scheme.is_some() {
                    referred += 1;
                }
                image.signatures.push(c);
            }
        };
        for (_, r) in refs {
            match r.listed_by {
                Some(ListedBy::Api) => by_api += 1,
                Some(ListedBy::FallbackTag) => by_tag += 1,
                None => by_none += 1,
            }
            for f in r.found {
                keep(image, f);
            }
        }
        let mut missing = Vec::new();
        for (d, must, kind, f) in found {
            match f {
                Some(f) => keep(image, f),
                None if kind == Kind::Signature && must => missing.push((d, kind)),
                None => {}
            }
        }
        for (d, kind) in missing {
            if signed_digests.contains(&d) {
                continue;
            }
            let reference = format!("{repo}:{}", attach::tag_of(&d, kind));
            match key {
                Some(k) if !args.allow_unsigned_images => {
                    return Err(k.unsigned(&name, &d, &reference).into())
                }
                Some(_) => progress.warn(format!(
                    "{name}: {d} has no signature upstream ({reference}, nor an OCI 1.1 referrer): carried without one (--allow-unsigned-images)"
                )),
                None => {}
            }
        }
        if !signed_digests.is_empty() {
            signed += 1;
        } else {
            unsigned.push(name);
        }
    }
    let verified = match key {
        Some(k) => format!(
            ", each checked against --verify-key {} (sha256 of the key {})",
            k.path().display(),
            k.fingerprint()
        ),
        None => String::new(),
    };
    let referrers = match (by_api + by_tag, by_none) {
        (0, _) => " (the sources serve no OCI 1.1 referrers API: the tag scheme only)".to_string(),
        (_, 0) => format!(" ({referred} of them OCI 1.1 referrers)"),
        (_, n) => format!(
            " ({referred} of them OCI 1.1 referrers; for {n} digests the source serves no referrers API: the tag scheme only)"
        ),
    };
    progress.say(format!(
        "upstream {manifests} cosign signature and attestation {} carried for {signed} of {} images{referrers}{verified}",
        crate::text::plural(manifests, "manifest", "manifests"),
        images.len()
    ));
    if key.is_none() && manifests > 0 {
        progress.warn(format!(
            "the {manifests} carried signature and attestation manifests are NOT verified (no --verify-key): the bundle carries whatever the sources hold next to the images; give --verify-key PUB to check them before they are bundled"
        ));
    }
    if !unsigned.is_empty() {
        progress.warn(format!(
            "{} of {} images had no signature upstream and are carried without one: {}",
            unsigned.len(),
            images.len(),
            unsigned.join(", ")
        ));
    }
    Ok(())
}

/// The `kind` manifest of `signs` (`upstream::fetch`: `None` only when its tag is not there).
/// A failure to read says which image could not be told signed, and what to do.
async fn lookup(
    src: &crate::store::registry::RegistryStore,
    image: &str,
    repo: &str,
    signs: &Digest,
    kind: Kind,
    key: Option<&UpstreamKey>,
    budget: &crate::copy::Budget,
) -> anyhow::Result<Option<Found>> {
    match upstream::fetch(src, image, repo, signs, kind, key, budget).await {
        Err(e @ upstream::UpstreamError::Read { .. }) => Err(anyhow::Error::new(e).context(format!(
            "cannot tell whether image {image} is signed: its {} {repo}:{} could not be read, and a signature that cannot be read is not taken for none; nothing was written (run the build again once the source serves it, or build without --with-signatures)",
            kind.word(),
            attach::tag_of(signs, kind)
        ))),
        other => Ok(other?),
    }
}

/// What the plan carries of a manifest read from upstream.
fn carried(repository: &str, f: Found) -> CarriedSignature {
    let top = &f.graph.top;
    let (ref_name, scheme) = match &f.scheme {
        Scheme::Tag(t) => (format!("{repository}:{t}"), None),
        Scheme::Referrer => (
            format!("{repository}@{}", top.digest),
            Some(REFERRER_SCHEME.to_string()),
        ),
    };
    CarriedSignature {
        record: SignatureRecord {
            kind: f.kind.word().into(),
            ref_name,
            scheme,
            signs: f.signs,
            digest: top.digest.clone(),
            media_type: top.media_type.clone(),
            size: top.bytes.len() as u64,
            layers: f.layers,
            verified_with: f.verified_with,
        },
        graph: f.graph,
    }
}
