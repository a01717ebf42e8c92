//! Upstream signatures carried into a bundle (`build --with-signatures`): the cosign
//! signatures and attestations a source holds next to an image, in cosign's tag scheme
//! (`sha256-<hex>.sig`, `sha256-<hex>.att` in the image's repository), read by their tags with
//! every blob (the manifest, its config, its layers: each a few hundred bytes) and, with a
//! public key (`--verify-key`), checked before anything is written:
//!
//! - a signature layer must be a simple-signing payload naming the digest its tag names,
//!   signed (the `dev.cosignproject.cosign/signature` annotation) by the key;
//! - an attestation layer must be a DSSE envelope signed by the key whose in-toto statement
//!   names that digest as a subject and has the predicate type its annotation says.
//!
//! Every layer must pass: a `.sig` that also holds another key's signature is refused as a
//! whole (fail closed: what the bundle carries as "verified" is all the key's). The manifests
//! are carried byte for byte (same digests), so `load` pushes them unchanged and a policy
//! naming the upstream key admits the images at the site too.
//!
//! OCI 1.1 referrers (`GET /v2/<name>/referrers/<digest>`) are not read: no registry
//! koord-bundle is tested against serves that API, and cosign writes the tag scheme by default.

use super::attach::{self, Kind, DSSE_MEDIA, PREDICATE_ANNOTATION, SIGNATURE_ANNOTATION};
use super::cosign::{self, CosignError};
use crate::copy::{self, Budget, Graph, WalkError};
use crate::oci::{media, Descriptor, Digest};
use crate::store::{Reference, Source, StoreError};
use futures_util::TryStreamExt as _;
use p256::ecdsa::VerifyingKey;
use p256::pkcs8::EncodePublicKey as _;
use std::path::{Path, PathBuf};

/// The largest layer carried (a signature payload or an attestation envelope).
pub use super::attach::MAX_LAYER;
/// A signature manifest with more layers than this is refused (each is one signature).
pub const MAX_LAYERS: usize = 256;
/// A public key file larger than this is no cosign public key (one is about 180 bytes).
const MAX_KEY_FILE: usize = 64 * 1024;

/// Why an upstream signature cannot be carried. Messages name the image, the digest and the
/// tag, and what to do.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The tag could not be read (other than "not there").
    #[error("{what}: {source}")]
    Read {
        /// `image <ref name>: reading REPOSITORY:sha256-<hex>.sig`.
        what: String,
        /// What failed.
        #[source]
        source: StoreError,
    },
    /// The tag holds something cosign does not write there.
    #[error("image {image}: {reference} is not a cosign signature manifest ({reason}): nothing was written; remove or re-sign it upstream, or build without --with-signatures")]
    NotCosign {
        /// The image.
        image: String,
        /// The tag.
        reference: String,
        /// What it is.
        reason: String,
    },
    /// A signature or attestation that does not verify against the key.
    #[error("image {image}, digest {digest}: {reference} does not verify against --verify-key {}: {reason}; nothing was written (is it tampered with, or signed with another key? check with `cosign verify --key` and sign the image with the key you give)", key.display())]
    NotVerified {
        /// The image.
        image: String,
        /// The digest it is said to sign.
        digest: Digest,
        /// The tag.
        reference: String,
        /// The key's file.
        key: PathBuf,
        /// Which layer, and why.
        reason: String,
    },
    /// An image the key did not sign (no `.sig` upstream).
    #[error("image {image}, digest {digest}: no signature upstream ({reference} is not there), and --verify-key {} asks for one; nothing was written (sign it with that key, or pass --allow-unsigned-images to carry it without)", key.display())]
    Unsigned {
        /// The image.
        image: String,
        /// The digest without a signature.
        digest: Digest,
        /// The tag looked for.
        reference: String,
        /// The key's file.
        key: PathBuf,
    },
}

/// A cosign public key to check upstream signatures with.
#[derive(Debug, Clone)]
pub struct UpstreamKey {
    path: PathBuf,
    key: VerifyingKey,
    fingerprint: Digest,
}

impl UpstreamKey {
    /// Read a cosign public key (PEM `PUBLIC KEY`, ECDSA P-256).
    pub fn read(path: &Path) -> Result<UpstreamKey, CosignError> {
        let what = format!("--verify-key {}", path.display());
        let err = |reason: String| CosignError::PublicKey {
            what: what.clone(),
            reason,
        };
        let bytes = crate::bounded::read_file_bounded(path, MAX_KEY_FILE).map_err(|source| {
            CosignError::Io {
                path: path.to_path_buf(),
                source,
            }
        })?;
        let text = String::from_utf8(bytes).map_err(|_| err("not a PEM file".into()))?;
        let key = cosign::public_key_from_pem(&what, &text)?;
        let der = key
            .to_public_key_der()
            .map_err(|e| err(format!("cannot encode it: {e}")))?;
        Ok(UpstreamKey {
            path: path.to_path_buf(),
            key,
            fingerprint: Digest::of(der.as_bytes()),
        })
    }

    /// The file it was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The sha256 of the key's DER (SubjectPublicKeyInfo): what the bundle records.
    pub fn fingerprint(&self) -> &Digest {
        &self.fingerprint
    }

    /// The error for `digest` of `image` having no signature under `reference`.
    pub fn unsigned(&self, image: &str, digest: &Digest, reference: &str) -> UpstreamError {
        UpstreamError::Unsigned {
            image: image.to_string(),
            digest: digest.clone(),
            reference: reference.to_string(),
            key: self.path.clone(),
        }
    }
}

/// A signature or attestation manifest read from the source, with its blobs.
#[derive(Debug, Clone)]
pub struct Found {
    /// Signatures or attestations.
    pub kind: Kind,
    /// Its tag (`sha256-<hex>.sig`).
    pub tag: String,
    /// The digest it signs.
    pub signs: Digest,
    /// Its graph, every blob inline.
    pub graph: Graph,
    /// Its layers (signatures or attestations).
    pub layers: usize,
    /// The key's fingerprint, when every layer was checked against it.
    pub verified_with: Option<Digest>,
}

/// The `.sig` (or `.att`) manifest of `signs` in `repo` of `src` (`None`: not there), read
/// with its blobs and, with `key`, checked. `image` names the image in messages.
pub async fn fetch<S: Source>(
    src: &S,
    image: &str,
    repo: &str,
    signs: &Digest,
    kind: Kind,
    key: Option<&UpstreamKey>,
    budget: &Budget,
) -> Result<Option<Found>, UpstreamError> {
    let tag = attach::tag_of(signs, kind);
    let reference = format!("{repo}:{tag}");
    let not_cosign = |reason: String| UpstreamError::NotCosign {
        image: image.to_string(),
        reference: reference.clone(),
        reason,
    };
    // A store that failed is that; anything else the walk refuses is the manifest's.
    let read_err = |e: WalkError| match e {
        WalkError::Store(source) => UpstreamError::Read {
            what: format!("image {image}: reading {reference}"),
            source,
        },
        other => not_cosign(other.to_string()),
    };
    let mut graph = match copy::resolve(src, repo, &Reference::Tag(tag.clone()), None, budget).await
    {
        Ok(g) => g,
        Err(WalkError::Store(e)) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(read_err(e)),
    };
    // The walk names a platform from the config; a signature image has none (`os`, `arch`
    // empty).
    graph.platforms.clear();
    if !graph.children.is_empty() || media::is_index(&graph.top.media_type) {
        return Err(not_cosign(format!("a {}", graph.top.media_type)));
    }
    let layers = layers_of(&graph.top.bytes).map_err(not_cosign)?;
    if layers.len() > MAX_LAYERS {
        return Err(not_cosign(format!(
            "{} layers, more than the {MAX_LAYERS} koord-bundle carries",
            layers.len()
        )));
    }
    for d in graph.blobs.clone() {
        if graph.inline.contains_key(&d.digest) {
            continue;
        }
        if d.size > MAX_LAYER {
            return Err(not_cosign(format!(
                "blob {} of {} bytes, more than a signature's {MAX_LAYER}",
                d.digest, d.size
            )));
        }
        let bytes = read_blob(src, repo, &d).await.map_err(read_err)?;
        graph.inline.insert(d.digest.clone(), bytes.into());
    }
    let verified_with = match key {
        None => None,
        Some(k) => {
            for (i, l) in layers.iter().enumerate() {
                let bytes = graph
                    .inline
                    .get(&l.digest)
                    .map(|b| b.to_vec())
                    .unwrap_or_default();
                if let Err(reason) = check_layer(&k.key, kind, l, &bytes, signs) {
                    return Err(UpstreamError::NotVerified {
                        image: image.to_string(),
                        digest: signs.clone(),
                        reference,
                        key: k.path.clone(),
                        reason: format!("layer {} of {}: {reason}", i + 1, layers.len()),
                    });
                }
            }
            if layers.is_empty() {
                return Err(UpstreamError::NotVerified {
                    image: image.to_string(),
                    digest: signs.clone(),
                    reference,
                    key: k.path.clone(),
                    reason: "it holds no signature".into(),
                });
            }
            Some(k.fingerprint.clone())
        }
    };
    Ok(Some(Found {
        kind,
        tag,
        signs: signs.clone(),
        graph,
        layers: layers.len(),
        verified_with,
    }))
}

/// The layers of an image manifest, or why it is not one.
fn layers_of(bytes: &[u8]) -> Result<Vec<Descriptor>, String> {
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|_| "not JSON".to_string())?;
    let mt = v["mediaType"].as_str().unwrap_or(media::OCI_MANIFEST);
    if mt != media::OCI_MANIFEST && mt != media::DOCKER_MANIFEST {
        return Err(format!("a {mt}, not an image manifest"));
    }
    serde_json::from_value(v["layers"].clone()).map_err(|_| "no readable layers".to_string())
}

/// A blob's bytes, checked against its descriptor.
async fn read_blob<S: Source>(src: &S, repo: &str, d: &Descriptor) -> Result<Vec<u8>, WalkError> {
    let mut stream = src.blob(repo, d, 0).await?;
    let mut out = Vec::new();
    while let Some(chunk) = stream.try_next().await? {
        out.extend_from_slice(&chunk);
        if out.len() as u64 > d.size {
            break;
        }
    }
    if out.len() as u64 != d.size || Digest::of(&out) != d.digest {
        return Err(WalkError::Graph {
            what: format!("blob {repo}@{}", d.digest),
            reason: format!(
                "the source served {} bytes of digest {}, not what the signature manifest names",
                out.len(),
                Digest::of(&out)
            ),
        });
    }
    Ok(out)
}

/// Does layer `l` (its bytes) of a `kind` manifest sign `signs` under `key`? `Err`: why not.
fn check_layer(
    key: &VerifyingKey,
    kind: Kind,
    l: &Descriptor,
    bytes: &[u8],
    signs: &Digest,
) -> Result<(), String> {
    let annotation = |k: &str| l.annotations.as_ref().and_then(|a| a.get(k)).cloned();
    match kind {
        Kind::Signature => {
            if l.media_type != attach::SIMPLE_SIGNING_MEDIA {
                return Err(format!("a {}, not a simple-signing payload", l.media_type));
            }
            let sig = annotation(SIGNATURE_ANNOTATION)
                .and_then(|s| cosign::unbase64(&s))
                .ok_or(
                    "no base64 signature in its dev.cosignproject.cosign/signature annotation",
                )?;
            if !cosign::verify(key, bytes, &sig) {
                return Err("the signature does not verify against the key".into());
            }
            match cosign::signed_digest(bytes) {
                Some(d) if d == signs.as_str() => Ok(()),
                Some(d) => Err(format!("it signs {d}, not {signs}")),
                None => Err("its payload is not a cosign simple-signing payload".into()),
            }
        }
        Kind::Attestation => {
            if l.media_type != DSSE_MEDIA {
                return Err(format!("a {}, not a DSSE envelope", l.media_type));
            }
            let pt = annotation(PREDICATE_ANNOTATION).unwrap_or_default();
            if cosign::envelope_attests(key, bytes, signs.as_str(), &pt) {
                Ok(())
            } else {
                Err(format!("the envelope is not signed by the key, or its statement does not name {signs} with predicate type {pt:?}"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn desc(media_type: &str, bytes: &[u8], sig: Option<String>) -> Descriptor {
        Descriptor {
            media_type: media_type.into(),
            digest: Digest::of(bytes),
            size: bytes.len() as u64,
            platform: None,
            annotations: sig.map(|s| BTreeMap::from([(SIGNATURE_ANNOTATION.to_string(), s)])),
        }
    }

    #[test]
    fn a_signature_layer_must_be_the_keys_and_name_the_digest() {
        let (sk, _) = cosign::generate(b"").unwrap();
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("k");
        std::fs::write(&p, sk).unwrap();
        let key = cosign::KeyFile::read(&p).unwrap().open(b"").unwrap();
        let (other_sk, _) = cosign::generate(b"").unwrap();
        std::fs::write(d.path().join("o"), other_sk).unwrap();
        let other = cosign::KeyFile::read(&d.path().join("o"))
            .unwrap()
            .open(b"")
            .unwrap();
        let digest = Digest::of(b"image");
        let payload = cosign::simple_signing_payload("r/x", digest.as_str());
        let good = desc(
            attach::SIMPLE_SIGNING_MEDIA,
            &payload,
            Some(cosign::base64(&key.sign(&payload))),
        );
        let vk = key.verifying_key();
        assert_eq!(
            check_layer(vk, Kind::Signature, &good, &payload, &digest),
            Ok(())
        );
        // Another digest, another key, a changed payload, no signature: refused.
        assert!(check_layer(vk, Kind::Signature, &good, &payload, &Digest::of(b"x")).is_err());
        let theirs = desc(
            attach::SIMPLE_SIGNING_MEDIA,
            &payload,
            Some(cosign::base64(&other.sign(&payload))),
        );
        assert!(check_layer(vk, Kind::Signature, &theirs, &payload, &digest).is_err());
        let mut changed = payload.clone();
        changed.push(b' ');
        assert!(check_layer(vk, Kind::Signature, &good, &changed, &digest).is_err());
        let bare = desc(attach::SIMPLE_SIGNING_MEDIA, &payload, None);
        assert!(check_layer(vk, Kind::Signature, &bare, &payload, &digest).is_err());
    }
}
