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
//! The OCI 1.1 referrers of each digest are read too ([`fetch_referrers`]): where the source
//! serves the referrers API (`GET /v2/<name>/referrers/<digest>` answers 200), the entries of
//! cosign's artifact types (`super::referrers`; others, an SBOM or a notation signature, are
//! left); where it answers 404, the referrers tag schema's `sha256-<hex>` index if there is
//! one (what OCI 1.1 clients keep on a registry without the API). A referrer must name the
//! digest as its `subject` and have the type the list gives it, and is checked like the tag
//! scheme's manifests; an answer that is not a referrers list is refused. The tag scheme is
//! read either way (a registry that serves referrers may hold `.sig` tags too).

use super::attach::{self, Kind, DSSE_MEDIA, PREDICATE_ANNOTATION, SIGNATURE_ANNOTATION};
use super::cosign::{self, CosignError};
use super::referrers;
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
    /// The tag is there, but a blob its manifest names cannot be found.
    #[error("image {image}: its {} {reference} is there, but not all of it can be read ({why}); a signature that cannot be read is not taken for none: nothing was written (have the tag repaired or deleted at the source, or build without --with-signatures)", kind.word())]
    Incomplete {
        /// The image.
        image: String,
        /// Signature or attestation.
        kind: Kind,
        /// `REPOSITORY:sha256-<hex>.sig` (or `.att`).
        reference: String,
        /// What the walk could not find.
        why: String,
    },
    /// The referrers answer (or the fallback tag) is not a referrers list.
    #[error("image {image}: the OCI 1.1 referrers of {reference}: {reason}; nothing was written (check the registry, or what is in front of it; build without --with-signatures to carry no signature)")]
    Referrers {
        /// The image.
        image: String,
        /// `REPOSITORY@DIGEST` (or the fallback tag).
        reference: String,
        /// What the answer was.
        reason: String,
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
    #[error("image {image}, digest {digest}: no signature upstream ({reference} is not there, nor a cosign signature among its OCI 1.1 referrers), and --verify-key {} asks for one; nothing was written (sign it with that key, or pass --allow-unsigned-images to carry it without)", key.display())]
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

impl crate::exit::Classify for UpstreamError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        match self {
            // Reading from the source: the store's error decides.
            UpstreamError::Read { .. } => None,
            // Signatures upstream that are incomplete, not cosign's, not verifying or absent.
            _ => Some(crate::exit::ExitClass::Input),
        }
    }
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

/// Where a carried manifest is found, and goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheme {
    /// Under this tag (`sha256-<hex>.sig`): cosign's tag scheme.
    Tag(String),
    /// An OCI 1.1 referrer of the digest it signs (its `subject`), by its own digest.
    Referrer,
}

/// A signature or attestation manifest read from the source, with its blobs.
#[derive(Debug, Clone)]
pub struct Found {
    /// Signatures or attestations.
    pub kind: Kind,
    /// Where it is.
    pub scheme: Scheme,
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
    let at = Read {
        src,
        image,
        repo,
        reference: &reference,
        signs,
        kind,
        key,
    };
    let graph = match copy::resolve(src, repo, &Reference::Tag(tag.clone()), None, budget).await {
        Ok(g) => g,
        // Only a tag that is not there means unsigned. One that is there but names a blob
        // (its config, a layer) the source lacks is never taken for none.
        Err(WalkError::NotFound(_)) => return Ok(None),
        Err(WalkError::Store(missing)) if missing.is_not_found() => {
            return Err(UpstreamError::Incomplete {
                image: image.to_string(),
                kind,
                reference,
                why: missing.to_string(),
            })
        }
        Err(e) => return Err(at.walk_error(e)),
    };
    at.checked(graph, Scheme::Tag(tag.clone())).await.map(Some)
}

/// What [`fetch_referrers`] found for one digest.
#[derive(Debug, Default)]
pub struct Referred {
    /// Where the list came from: the referrers API, the fallback tag, or nowhere (`None`: the
    /// source answered 404 and holds no `sha256-<hex>` index).
    pub listed_by: Option<ListedBy>,
    /// Its cosign signature and attestation referrers, read and checked.
    pub found: Vec<Found>,
}

/// Where a referrers list was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListedBy {
    /// `GET /v2/<name>/referrers/<digest>` (200).
    Api,
    /// The referrers tag schema's `sha256-<hex>` index (the API answered 404).
    FallbackTag,
}

/// The OCI 1.1 referrers of `signs` in `repo` of `src` that are cosign signatures or
/// attestations (see the module's doc), each read with its blobs and, with `key`, checked.
pub async fn fetch_referrers<S: Source>(
    src: &S,
    image: &str,
    repo: &str,
    signs: &Digest,
    key: Option<&UpstreamKey>,
    budget: &Budget,
) -> Result<Referred, UpstreamError> {
    let subject = format!("{repo}@{signs}");
    let read = |what: String| {
        move |source| UpstreamError::Read {
            what: format!("image {image}: {what}"),
            source,
        }
    };
    let (bytes, listed_by, reference) = match src.referrers(repo, signs).await.map_err(read(
        format!("asking for the OCI 1.1 referrers of {subject}"),
    ))? {
        Some(b) => (b, ListedBy::Api, subject.clone()),
        None => {
            let tag = referrers::fallback_tag(signs);
            let reference = format!("{repo}:{tag}");
            match src.manifest(repo, &Reference::Tag(tag)).await {
                Ok(m) => (m.bytes, ListedBy::FallbackTag, reference),
                Err(e) if e.is_not_found() => return Ok(Referred::default()),
                Err(e) => return Err(read(format!("reading {reference}"))(e)),
            }
        }
    };
    let bad = |reason: String| UpstreamError::Referrers {
        image: image.to_string(),
        reference: reference.clone(),
        reason,
    };
    let listed = referrers::parse_list(&bytes)
        .map_err(|r| bad(format!("the answer is not a referrers list ({r})")))?;
    let ours: Vec<(Kind, &referrers::Listed)> = listed
        .iter()
        .filter_map(|l| Kind::of_artifact(l.artifact_type.as_deref()).map(|k| (k, l)))
        .collect();
    if ours.len() > referrers::MAX_COSIGN_REFERRERS {
        return Err(bad(format!(
            "{} cosign referrers, more than the {} koord-bundle carries",
            ours.len(),
            referrers::MAX_COSIGN_REFERRERS
        )));
    }
    let mut found = Vec::new();
    for (kind, l) in ours {
        let reference = format!("{repo}@{}", l.digest);
        let at = Read {
            src,
            image,
            repo,
            reference: &reference,
            signs,
            kind,
            key,
        };
        let graph = copy::resolve(
            src,
            repo,
            &Reference::Digest(l.digest.clone()),
            None,
            budget,
        )
        .await
        .map_err(|e| at.walk_error(e))?;
        // What the list says of it must be what it says of itself.
        let (artifact_type, subject_digest) = referrers::describe(&graph.top.bytes);
        if artifact_type.as_deref() != l.artifact_type.as_deref() {
            return Err(at.not_cosign(format!(
                "the referrers list gives it artifactType {:?}, the manifest {:?}",
                l.artifact_type, artifact_type
            )));
        }
        if subject_digest.as_ref() != Some(signs) {
            return Err(at.not_cosign(format!(
                "its subject is {}, not {signs}",
                subject_digest.map_or("missing".to_string(), |d| d.to_string())
            )));
        }
        found.push(at.checked(graph, Scheme::Referrer).await?);
    }
    Ok(Referred {
        listed_by: Some(listed_by),
        found,
    })
}

/// One manifest being read: what messages name, and what it is checked against.
struct Read<'a, S> {
    src: &'a S,
    image: &'a str,
    repo: &'a str,
    reference: &'a str,
    signs: &'a Digest,
    kind: Kind,
    key: Option<&'a UpstreamKey>,
}

impl<S: Source> Read<'_, S> {
    fn not_cosign(&self, reason: String) -> UpstreamError {
        UpstreamError::NotCosign {
            image: self.image.to_string(),
            reference: self.reference.to_string(),
            reason,
        }
    }

    /// A store that failed is that; anything else the walk refuses is the manifest's.
    fn walk_error(&self, e: WalkError) -> UpstreamError {
        match e {
            WalkError::NotFound(source) | WalkError::Store(source) => UpstreamError::Read {
                what: format!("image {}: reading {}", self.image, self.reference),
                source,
            },
            other => self.not_cosign(other.to_string()),
        }
    }

    /// `graph` (a signature or attestation manifest) with its blobs inline, every layer
    /// checked with the key (if any).
    async fn checked(&self, mut graph: Graph, scheme: Scheme) -> Result<Found, UpstreamError> {
        let (image, reference, signs, kind) = (self.image, self.reference, self.signs, self.kind);
        let not_cosign = |reason: String| self.not_cosign(reason);
        let read_err = |e: WalkError| self.walk_error(e);
        // The walk names a platform from the config; a signature image has none (`os`,
        // `arch` empty).
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
            let bytes = read_blob(self.src, self.repo, &d).await.map_err(read_err)?;
            graph.inline.insert(d.digest.clone(), bytes.into());
        }
        let verified_with = match self.key {
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
                            reference: reference.to_string(),
                            key: k.path.clone(),
                            reason: format!("layer {} of {}: {reason}", i + 1, layers.len()),
                        });
                    }
                }
                if layers.is_empty() {
                    return Err(UpstreamError::NotVerified {
                        image: image.to_string(),
                        digest: signs.clone(),
                        reference: reference.to_string(),
                        key: k.path.clone(),
                        reason: "it holds no signature".into(),
                    });
                }
                Some(k.fingerprint.clone())
            }
        };
        Ok(Found {
            kind,
            scheme,
            signs: signs.clone(),
            graph,
            layers: layers.len(),
            verified_with,
        })
    }
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
            // cosign's attestation referrers carry no layer annotations: the statement's own
            // predicate type then (it is signed; the annotation is not).
            let pt = annotation(PREDICATE_ANNOTATION)
                .or_else(|| cosign::envelope_predicate_type(bytes))
                .unwrap_or_default();
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

    #[test]
    fn an_attestation_layer_without_annotations_is_checked_by_its_statement() {
        // cosign's attestation referrers carry no predicateType annotation on the layer.
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("k");
        std::fs::write(&p, cosign::generate(b"").unwrap().0).unwrap();
        let key = cosign::KeyFile::read(&p).unwrap().open(b"").unwrap();
        let digest = Digest::of(b"image");
        let st = cosign::intoto_statement(
            "r/x",
            digest.as_str(),
            cosign::CYCLONEDX_PREDICATE,
            &serde_json::json!({}),
        );
        let env = cosign::dsse_envelope(&key, &st);
        let bare = desc(DSSE_MEDIA, &env, None);
        let vk = key.verifying_key();
        assert_eq!(
            check_layer(vk, Kind::Attestation, &bare, &env, &digest),
            Ok(())
        );
        assert!(check_layer(vk, Kind::Attestation, &bare, &env, &Digest::of(b"y")).is_err());
        let mut v: serde_json::Value = serde_json::from_slice(&env).unwrap();
        v["signatures"][0]["sig"] = cosign::base64(&key.sign(b"other")).into();
        let forged = serde_json::to_vec(&v).unwrap();
        assert!(check_layer(vk, Kind::Attestation, &bare, &forged, &digest).is_err());
    }
}
