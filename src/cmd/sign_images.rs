//! `load --sign-images KEY` and `keygen --cosign` (issue 46): the site's cosign key signs what
//! crossed, so a cluster whose admission policy admits only signed images runs it.
//!
//! The key is read and decrypted while `load` resolves its settings, before the bundle is
//! read or anything is sent. The signing runs after the bundle's signature and every blob
//! were verified and the images pushed, and before helm: for each image, its index digest
//! and each platform manifest digest get a cosign signature (`sha256-<hex>.sig`), and the
//! index digest an attestation (`sha256-<hex>.att`) of the image's CycloneDX entry of the
//! bundle's bill of materials. A failure stops the load before helm: the images are in the
//! registry, unsigned, and a re-run signs what is not signed yet.
//!
//! Before anything is signed, each image's repository is asked whether it serves the OCI 1.1
//! referrers API (`GET /v2/<name>/referrers/<digest>`): where it does (200 with an index), each
//! signature and attestation is pushed as a referrer too; where it does not (404), the tag
//! scheme only, and the output says which. Any other answer stops the load before anything is
//! signed. After the signing, the referrers API must list every referrer pushed (`listed`),
//! else the load stops before helm.

use super::listed;
use crate::admission::attach::{Attached, Signer};
use crate::admission::cosign::{self, CosignKey, KeyFile, CYCLONEDX_PREDICATE};
use crate::bundle::manifest::ImageRecord;
use crate::bundle::source::{split_ref, BundleSource};
use crate::cli::KeygenArgs;
use crate::oci::{Descriptor, Digest, ImageRef};
use crate::progress::Progress;
use crate::store::registry::RegistryStore;
use crate::store::{Reference, Registry};
use anyhow::Context as _;
use futures_util::{StreamExt as _, TryStreamExt as _};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// cosign's own variable for its key's password (read as cosign reads it: set, even empty,
/// it is the password).
pub const COSIGN_PASSWORD: &str = "COSIGN_PASSWORD";

/// The cosign key's password: `COSIGN_PASSWORD` when set (empty too, as cosign takes it),
/// else a prompt on a terminal (twice for a new key), else `None`.
fn password(confirm: bool) -> anyhow::Result<Option<String>> {
    if let Ok(p) = std::env::var(COSIGN_PASSWORD) {
        return Ok(Some(p));
    }
    if !std::io::stdin().is_terminal() {
        return Ok(None);
    }
    for _ in 0..3 {
        let p = super::prompt_password("Cosign key password: ")?;
        if !confirm || super::prompt_password("Cosign key password (again): ")? == p {
            return Ok(Some(p));
        }
        crate::tell!("the passwords do not match: try again");
    }
    anyhow::bail!("the passwords did not match in 3 tries: no key was written")
}

/// `keygen --cosign`: cosign.key and cosign.pub in cosign's format, in `--output-dir` or the
/// current directory (where `cosign generate-key-pair` writes them).
pub fn keygen(args: KeygenArgs) -> anyhow::Result<()> {
    let dir = match args.output_dir {
        Some(d) => {
            super::output_dir(&d, true)?;
            d
        }
        None => PathBuf::from("."),
    };
    // Before any password is asked for: a key is never overwritten.
    for f in [cosign::PRIVATE_KEY_FILE, cosign::PUBLIC_KEY_FILE] {
        if dir.join(f).symlink_metadata().is_ok() {
            return Err(cosign::CosignError::Exists(dir.join(f)).into());
        }
    }
    let pw = password(true)?.context(
        "the cosign key needs a password: set COSIGN_PASSWORD (cosign's variable; set and empty means no password, as cosign allows) or run on a terminal",
    )?;
    let (sk, pk) = cosign::write_pair(&dir, pw.as_bytes())?;
    if args.json {
        return super::print_json(&json!({"privateKey": sk, "publicKey": pk, "format": "cosign"}));
    }
    crate::say!(
        "private key: {} (cosign's format, encrypted; give it to `load --sign-images`)",
        sk.display()
    );
    crate::say!(
        "public key:  {} (what the cluster's admission policy names; `cosign verify --key` takes it)",
        pk.display()
    );
    Ok(())
}

/// Read and decrypt the cosign key of `--sign-images` (nothing has been sent yet).
pub fn read_key(path: &Path) -> anyhow::Result<CosignKey> {
    let file = KeyFile::read(path)?;
    let pw = password(false)?.with_context(|| {
        format!(
            "the cosign key {} needs its password: set COSIGN_PASSWORD or run on a terminal; nothing was pushed",
            path.display()
        )
    })?;
    Ok(file.open(pw.as_bytes())?)
}

/// One signature or attestation to push.
struct Job {
    image: usize,
    /// Index of the platform manifest, `None` for the image's top digest.
    platform: Option<usize>,
    repo: crate::oci::ImageRef,
    /// The manifest signed.
    subject: Descriptor,
    /// The predicate of an attestation; `None` for a signature.
    predicate: Option<Value>,
    /// Push it as an OCI 1.1 referrer too (the repository serves the referrers API).
    referrer: bool,
}

/// Each image's manifests: its top manifest, then every platform manifest (not the attestation
/// manifests of an index), as the bundle holds them and load pushed them (media type, digest,
/// size: what a referrer's `subject` names).
async fn manifests_of(
    src: &BundleSource,
    img: &crate::bundle::manifest::ImageRecord,
    repo: &str,
) -> anyhow::Result<Vec<Descriptor>> {
    let mut manifests = img.manifests.clone();
    if manifests.is_empty() {
        // A bundle written before the manifest listed them: read the index.
        let top = crate::store::Source::manifest(src, repo, &Reference::Digest(img.digest.clone()))
            .await
            .with_context(|| format!("{} in the bundle", img.ref_name))?;
        manifests = crate::bundle::manifest::platform_manifests(
            &top,
            img.platforms.first().map(String::as_str),
        );
    }
    let mut digests = vec![img.digest.clone()];
    for m in manifests.iter().filter(|m| m.attestation_of.is_none()) {
        if !digests.contains(&m.digest) {
            digests.push(m.digest.clone());
        }
    }
    let mut out = Vec::with_capacity(digests.len());
    for d in digests {
        let m = crate::store::Source::manifest(src, repo, &Reference::Digest(d))
            .await
            .with_context(|| format!("{} in the bundle", img.ref_name))?;
        out.push(Descriptor {
            media_type: m.media_type,
            size: m.bytes.len() as u64,
            digest: m.digest,
            platform: None,
            annotations: None,
        });
    }
    Ok(out)
}

/// The CycloneDX document of one image: its entry of the bundle's bill of materials (the
/// component and its platform manifests, made by the function that wrote `bom.cdx.json`, from
/// the verified bundle manifest), as the predicate of its attestation.
fn image_bom(
    bom: &Value,
    img: &crate::bundle::manifest::ImageRecord,
    created: &str,
) -> anyhow::Result<Value> {
    let bom_ref = format!("image:{}", img.ref_name);
    let component = bom["components"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["bom-ref"] == bom_ref.as_str()))
        .with_context(|| format!("the bill of materials has no entry for {}", img.ref_name))?;
    Ok(json!({
        "$schema": "http://cyclonedx.org/schema/bom-1.6.schema.json",
        "bomFormat": "CycloneDX",
        "specVersion": bom["specVersion"],
        "version": 1,
        "metadata": {
            "timestamp": created,
            "tools": bom["metadata"]["tools"],
            "component": component,
        },
    }))
}

/// Sign every image of the bundle in the registry (see the module's doc). Returns what
/// `load --json` reports under `signed`.
pub async fn sign_all(
    src: &BundleSource,
    reg: &Arc<Registry>,
    store: &RegistryStore,
    key: &CosignKey,
    jobs: usize,
    progress: &Progress,
) -> anyhow::Result<Value> {
    let m = src.manifest();
    let bom = crate::bundle::sbom::cyclonedx(m, &[], &[], crate::bundle::sbom::Origin::Build)
        .context("the bill of materials of the bundle")?;
    let bom: Value = serde_json::from_slice(&bom)?;
    let signer = Signer::new(reg, key, &m.created);
    let mut work = Vec::new();
    let mut shape = Vec::new();
    for (i, img) in m.images.iter().enumerate() {
        let (repo, tag) = split_ref(&img.ref_name)
            .with_context(|| format!("ref name {:?} is not REPOSITORY:TAG", img.ref_name))?;
        let r = store.image(repo, &Reference::Tag(tag.to_string()))?;
        let manifests = manifests_of(src, img, repo).await?;
        // Asked before anything is signed: an answer that is neither yes nor no stops here.
        let referrer = signer
            .serves_referrers(&r, &img.digest)
            .await
            .context("nothing was signed; the images are in the registry, UNSIGNED, and nothing was installed")?;
        for (n, d) in manifests.iter().enumerate() {
            let platform = n.checked_sub(1);
            work.push(Job {
                image: i,
                platform,
                repo: r.clone(),
                subject: d.clone(),
                predicate: None,
                referrer,
            });
        }
        work.push(Job {
            image: i,
            platform: None,
            repo: r.clone(),
            subject: manifests[0].clone(),
            predicate: Some(image_bom(&bom, img, &m.created)?),
            referrer,
        });
        let digests = manifests.into_iter().map(|d| d.digest).collect();
        shape.push((img, r, digests, referrer));
    }
    let bar = progress.count("signing images", work.len() as u64);
    let results: Vec<(usize, Option<usize>, bool, Attached)> =
        futures_util::stream::iter(work.iter())
            .map(|j| {
                let (signer, bar) = (&signer, &bar);
                async move {
                    let a = match &j.predicate {
                        None => signer.sign(&j.repo, &j.subject, j.referrer).await,
                        Some(p) => {
                            signer
                                .attest(&j.repo, &j.subject, CYCLONEDX_PREDICATE, p, j.referrer)
                                .await
                        }
                    }?;
                    bar.inc(1);
                    Ok::<_, crate::admission::attach::AttachError>((
                        j.image,
                        j.platform,
                        j.predicate.is_some(),
                        a,
                    ))
                }
            })
            .buffer_unordered(jobs.max(1))
            .try_collect()
            .await
            .context(
                "signing failed: the images are in the registry, UNSIGNED (or partly signed); nothing was installed; fix the cause and re-run the same command (what is signed is not signed again)",
            )?;
    let added = results.iter().filter(|r| r.3.added).count();
    let (sigs, atts) = (
        results.iter().filter(|r| !r.2).count(),
        results.iter().filter(|r| r.2).count(),
    );
    let referred: Vec<_> = results
        .iter()
        .filter_map(|r| r.3.referrer.as_ref())
        .collect();
    let ref_added = referred.iter().filter(|r| r.added).count();
    let no_api: Vec<String> = shape
        .iter()
        .filter(|s| !s.3)
        .map(|(_, r, _, _)| format!("{}/{}", r.registry, r.repository))
        .collect();
    let referrers_said = match (referred.is_empty(), no_api.is_empty()) {
        (true, _) => "the registry serves no OCI 1.1 referrers API (404): in cosign's tag scheme only".to_string(),
        (false, true) => format!(
            "as OCI 1.1 referrers too: {ref_added} pushed, {} there already",
            referred.len() - ref_added
        ),
        (false, false) => format!(
            "as OCI 1.1 referrers too: {ref_added} pushed, {} there already; in the tag scheme only where the registry serves no referrers API (404): {}",
            referred.len() - ref_added,
            no_api.join(", ")
        ),
    };
    bar.finish(&format!(
        "{sigs} signatures and {atts} attestations: {added} pushed, {} there already; {referrers_said}",
        results.len() - added
    ));
    referrers_listed(reg, &results, &shape).await?;
    let find = |image: usize, platform: Option<usize>, att: bool| {
        results
            .iter()
            .find(|r| r.0 == image && r.1 == platform && r.2 == att)
            .map(|r| json!(r.3))
    };
    let images: Vec<Value> = shape
        .iter()
        .enumerate()
        .map(|(i, (img, r, digests, referrers))| {
            json!({
                "ref": img.ref_name,
                "repository": format!("{}/{}", r.registry, r.repository),
                "referrers": referrers,
                "index": {"digest": img.digest, "signature": find(i, None, false),
                          "attestation": find(i, None, true)},
                "platforms": digests.iter().enumerate().skip(1).map(|(n, d)| json!({
                    "digest": d, "signature": find(i, Some(n - 1), false),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(json!({
        "key": key.path(),
        "publicKey": key.public_key_pem(),
        "predicateType": CYCLONEDX_PREDICATE,
        "pushed": added,
        "present": results.len() - added,
        "referrersPushed": ref_added,
        "referrersPresent": referred.len() - ref_added,
        "referrersSaid": referrers_said,
        "images": images,
    }))
}

/// Every referrer this load pushed is listed by the registry's referrers API (asked at the
/// times of [`listed::ASK_WAITS`]), else an error before the install: a
/// cluster's admission policy that looks there would not find it.
async fn referrers_listed(
    reg: &Registry,
    results: &[(usize, Option<usize>, bool, Attached)],
    shape: &[(&ImageRecord, ImageRef, Vec<Digest>, bool)],
) -> anyhow::Result<()> {
    let mut want: BTreeMap<(usize, &Digest), Vec<(Digest, String)>> = BTreeMap::new();
    for (image, _, att, a) in results {
        if let Some(r) = a.referrer.as_ref().filter(|r| r.added) {
            let kind = if *att { "attestation" } else { "signature" };
            want.entry((*image, &a.digest))
                .or_default()
                .push((r.digest.clone(), format!("{} ({kind})", r.reference)));
        }
    }
    let mut unlisted: listed::Wanted = want
        .into_iter()
        .map(|((image, signs), refs)| {
            let subject = ImageRef {
                tag: None,
                digest: Some(signs.to_string()),
                ..shape[image].1.clone()
            };
            (subject, signs.clone(), refs)
        })
        .collect();
    listed::ask_until_listed(reg, &mut unlisted, &listed::ASK_WAITS).await?;
    if unlisted.is_empty() {
        return Ok(());
    }
    Err(listed::unlisted_error(
        &unlisted,
        "the referrers load --sign-images pushed",
        "The signatures in cosign's tag scheme (sha256-<hex>.sig, .att) are pushed. Check the registry's referrers support, and any proxy in front of it, and re-run",
    ))
}
