//! Signatures and attestations pushed next to an image, in cosign's tag scheme: the manifest
//! tagged `sha256-<hex>.sig` (signatures) or `sha256-<hex>.att` (attestations) in the image's
//! own repository, an OCI image manifest whose layers are the signed payloads.
//!
//! - A signature layer: the simple-signing payload, media type
//!   `application/vnd.dev.cosign.simplesigning.v1+json`, its base64 signature in the
//!   annotation `dev.cosignproject.cosign/signature`.
//! - An attestation layer: a DSSE envelope of an in-toto statement, media type
//!   `application/vnd.dsse.envelope.v1+json`, annotations `predicateType` and an empty
//!   `dev.cosignproject.cosign/signature` (as `cosign attest` writes it).
//!
//! What is there already is kept: a new layer is appended to the manifest the tag holds, as
//! cosign appends, so the signatures of other keys stay. When a layer there is already this
//! key's signature (or attestation) of this digest, nothing is pushed: a re-run leaves the tag
//! as it is.
//!
//! Where the registry serves the OCI 1.1 referrers API (`GET /v2/<name>/referrers/<digest>`
//! answers 200 with an index), each signature and attestation is also pushed as a referrer
//! (`super::referrers`: cosign's own shapes), unless a referrer of that type already holds this
//! key's signature of the digest. The tag scheme is written always: it is what cosign, Kyverno
//! and the policy-controller read by default, and distribution 2.8 (the registry most
//! air-gapped sites run) has no referrers API (404: the tag scheme only, and said so).

use super::cosign::{self, CosignKey};
use super::referrers;
use crate::oci::{media, Descriptor, Digest, ImageRef};
use crate::store::{BlobStream, Opener, Registry, RegistryError, StoreError};
use futures_util::future::BoxFuture;
use futures_util::{StreamExt as _, TryStreamExt as _};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The media type of a cosign signature layer (the simple-signing payload).
pub const SIMPLE_SIGNING_MEDIA: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The media type of a cosign attestation layer (a DSSE envelope).
pub const DSSE_MEDIA: &str = "application/vnd.dsse.envelope.v1+json";
/// The annotation holding a layer's base64 signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The annotation naming an attestation's predicate type.
pub const PREDICATE_ANNOTATION: &str = "predicateType";
/// The config media type of cosign's signature images.
const CONFIG_MEDIA: &str = "application/vnd.oci.image.config.v1+json";
/// A layer read back to see whose it is: larger ones are someone else's (a payload is about
/// 250 bytes, an attestation of one image's BOM a few KiB). Also the bound of a layer
/// `build --with-signatures` carries (`upstream`).
pub const MAX_LAYER: u64 = 8 * 1024 * 1024;

/// Signatures (`.sig`) or attestations (`.att`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `sha256-<hex>.sig`.
    Signature,
    /// `sha256-<hex>.att`.
    Attestation,
}

impl Kind {
    fn suffix(self) -> &'static str {
        match self {
            Kind::Signature => "sig",
            Kind::Attestation => "att",
        }
    }
    fn media_type(self) -> &'static str {
        match self {
            Kind::Signature => SIMPLE_SIGNING_MEDIA,
            Kind::Attestation => DSSE_MEDIA,
        }
    }
    /// Its name in messages and in the bundle manifest (`signature`, `attestation`).
    pub fn word(self) -> &'static str {
        match self {
            Kind::Signature => "signature",
            Kind::Attestation => "attestation",
        }
    }
    /// The `artifactType` of its OCI 1.1 referrers.
    pub fn artifact_type(self) -> &'static str {
        match self {
            Kind::Signature => referrers::SIGNATURE_ARTIFACT,
            Kind::Attestation => referrers::ATTESTATION_ARTIFACT,
        }
    }
    /// The kind of a referrer of `artifact_type` (`None`: not one of cosign's).
    pub fn of_artifact(artifact_type: Option<&str>) -> Option<Kind> {
        [Kind::Signature, Kind::Attestation]
            .into_iter()
            .find(|k| Some(k.artifact_type()) == artifact_type)
    }
}

/// The tag cosign looks under for `digest`'s signatures or attestations.
pub fn tag_of(digest: &Digest, kind: Kind) -> String {
    format!("sha256-{}.{}", digest.hex(), kind.suffix())
}

/// What was done for one digest.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Attached {
    /// The signed digest.
    pub digest: Digest,
    /// `REPOSITORY:sha256-<hex>.sig` (or `.att`).
    pub reference: String,
    /// The digest of the manifest the tag holds now.
    pub manifest: String,
    /// Whether a layer was added (false: this key's was there already).
    pub added: bool,
    /// The OCI 1.1 referrer holding the same signature, where the registry serves the
    /// referrers API (`None`: it does not, the tag scheme only).
    pub referrer: Option<Referred>,
}

/// A signature's or an attestation's OCI 1.1 referrer.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Referred {
    /// `REPOSITORY@<digest of the referrer manifest>`.
    pub reference: String,
    /// Its `artifactType`.
    pub artifact_type: &'static str,
    /// Whether it was pushed (false: one of this key's was there already).
    pub added: bool,
    /// The referrer manifest's digest (in `reference` too).
    #[serde(skip)]
    pub digest: Digest,
}

/// A signature or attestation that could not be pushed. Messages name the tag.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The registry refused or failed a request.
    #[error("{what}: {source}")]
    Registry {
        /// What was being done.
        what: String,
        /// The registry's answer.
        #[source]
        source: RegistryError,
    },
    /// A blob upload failed.
    #[error("{what}: {source}")]
    Store {
        /// What was being done.
        what: String,
        /// Why.
        #[source]
        source: StoreError,
    },
    /// The registry's referrers answer is not a referrers list (or no longer served).
    #[error("{reference}: {reason}: koord-bundle cannot tell whether the registry serves OCI 1.1 referrers, so it pushed no referrer there (a 200 with an OCI image index means it does, a 404 that it does not); check the registry or what is in front of it, and re-run")]
    Referrers {
        /// The referrers URL's subject (`REPOSITORY@DIGEST`).
        reference: String,
        /// What the answer was.
        reason: String,
    },
    /// The tag holds something cosign would not have written there.
    #[error("{reference} holds a manifest that is not a cosign signature image ({reason}): koord-bundle does not change it; remove it (or find who wrote it) and re-run")]
    NotCosign {
        /// The tag.
        reference: String,
        /// What it is.
        reason: String,
    },
}

impl crate::exit::Classify for AttachError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        match self {
            // The registry's or the store's error decides.
            AttachError::Registry { .. } | AttachError::Store { .. } => None,
            // A registry whose referrers cannot be told, a tag that is not a signature.
            AttachError::Referrers { .. } | AttachError::NotCosign { .. } => {
                Some(crate::exit::ExitClass::Input)
            }
        }
    }
}

/// A blob's bytes held in memory, opened for an upload (again on a retry).
struct Held(bytes::Bytes);

impl Opener for Held {
    fn open(&self, offset: u64) -> BoxFuture<'_, Result<BlobStream, StoreError>> {
        let b = self.0.slice(
            usize::try_from(offset)
                .unwrap_or(usize::MAX)
                .min(self.0.len())..,
        );
        Box::pin(async move {
            Ok(futures_util::stream::once(async move { Ok::<_, StoreError>(b) }).boxed())
        })
    }
}

/// The layer to append, and how a layer there is recognised as this key's.
struct NewLayer {
    media_type: &'static str,
    bytes: bytes::Bytes,
    annotations: BTreeMap<String, String>,
}

/// One signature or attestation of a manifest, as `attach`, `append` and `refer` take it.
struct Attachment<'a> {
    /// The registry and repository (tag and digest ignored).
    repo: &'a ImageRef,
    /// The signed manifest, as the bundle recorded it.
    subject: &'a Descriptor,
    kind: Kind,
    layer: NewLayer,
    /// Whether a layer found there is this key's, for this subject (and predicate type).
    ours: &'a (dyn Fn(&Descriptor, &[u8]) -> bool + Sync),
}

/// Where signatures go: the registry and the image's repository.
pub struct Signer<'a> {
    reg: &'a Arc<Registry>,
    key: &'a CosignKey,
    /// The time an attestation referrer records (`org.opencontainers.image.created`): the
    /// bundle's, so that a re-run pushes the same bytes.
    created: String,
}

impl<'a> Signer<'a> {
    /// Sign with `key` through `reg`; `created` (RFC 3339) dates the attestation referrers.
    pub fn new(reg: &'a Arc<Registry>, key: &'a CosignKey, created: &str) -> Self {
        Signer {
            reg,
            key,
            created: created.to_string(),
        }
    }

    /// Does the registry serve the OCI 1.1 referrers API for `repo` (asked of `digest`, a
    /// manifest it holds)? 200 with an OCI image index: yes; 404: no; anything else is an
    /// error (nothing is claimed either way).
    pub async fn serves_referrers(
        &self,
        repo: &ImageRef,
        digest: &Digest,
    ) -> Result<bool, AttachError> {
        Ok(self.referrers_of(repo, digest).await?.is_some())
    }

    /// The referrers list of `digest` (`None`: not served).
    async fn referrers_of(
        &self,
        repo: &ImageRef,
        digest: &Digest,
    ) -> Result<Option<Vec<referrers::Listed>>, AttachError> {
        let reference = format!("{}/{}@{digest}", repo.registry, repo.repository);
        let bytes =
            self.reg
                .referrers(repo, digest)
                .await
                .map_err(|source| AttachError::Registry {
                    what: format!("asking for the OCI 1.1 referrers of {reference}"),
                    source,
                })?;
        let Some(bytes) = bytes else { return Ok(None) };
        referrers::parse_list(&bytes)
            .map(Some)
            .map_err(|reason| AttachError::Referrers {
                reference,
                reason: format!("the referrers answer is not a referrers list ({reason})"),
            })
    }

    /// Sign the manifest `subject` of `repo` (its registry and repository; tag and digest
    /// ignored): a cosign signature under `sha256-<hex>.sig`, unless this key's is there; with
    /// `referrer` (the registry serves the referrers API), also as an OCI 1.1 referrer.
    pub async fn sign(
        &self,
        repo: &ImageRef,
        subject: &Descriptor,
        referrer: bool,
    ) -> Result<Attached, AttachError> {
        let digest = &subject.digest;
        let repository = format!("{}/{}", repo.registry, repo.repository);
        let payload = cosign::simple_signing_payload(&repository, digest.as_str());
        let sig = cosign::base64(&self.key.sign(&payload));
        let vk = *self.key.verifying_key();
        let want = digest.to_string();
        let ours = move |d: &Descriptor, bytes: &[u8]| {
            d.annotations
                .as_ref()
                .and_then(|a| a.get(SIGNATURE_ANNOTATION))
                .and_then(|s| cosign::unbase64(s))
                .is_some_and(|s| cosign::verify(&vk, bytes, &s))
                && cosign::signed_digest(bytes).as_deref() == Some(want.as_str())
        };
        let layer = NewLayer {
            media_type: SIMPLE_SIGNING_MEDIA,
            bytes: payload.into(),
            annotations: BTreeMap::from([(SIGNATURE_ANNOTATION.to_string(), sig)]),
        };
        let a = Attachment {
            repo,
            subject,
            kind: Kind::Signature,
            layer,
            ours: &ours,
        };
        self.attach(&a, referrer).await
    }

    /// Attest the manifest `subject` of `repo` with `predicate` of `predicate_type` (an in-toto
    /// statement in a DSSE envelope) under `sha256-<hex>.att`, unless this key attested it with
    /// that type already; with `referrer`, also as an OCI 1.1 referrer.
    pub async fn attest(
        &self,
        repo: &ImageRef,
        subject: &Descriptor,
        predicate_type: &str,
        predicate: &serde_json::Value,
        referrer: bool,
    ) -> Result<Attached, AttachError> {
        let digest = &subject.digest;
        let repository = format!("{}/{}", repo.registry, repo.repository);
        let statement =
            cosign::intoto_statement(&repository, digest.as_str(), predicate_type, predicate);
        let envelope = cosign::dsse_envelope(self.key, &statement);
        let vk = *self.key.verifying_key();
        let (want, pt) = (digest.to_string(), predicate_type.to_string());
        let ours =
            move |_: &Descriptor, bytes: &[u8]| cosign::envelope_attests(&vk, bytes, &want, &pt);
        let layer = NewLayer {
            media_type: DSSE_MEDIA,
            bytes: envelope.into(),
            annotations: BTreeMap::from([
                (SIGNATURE_ANNOTATION.to_string(), String::new()),
                (PREDICATE_ANNOTATION.to_string(), predicate_type.to_string()),
            ]),
        };
        let a = Attachment {
            repo,
            subject,
            kind: Kind::Attestation,
            layer,
            ours: &ours,
        };
        self.attach(&a, referrer).await
    }

    /// `a`'s layer appended under its subject's tag of its kind ([`Self::append`]) and, with
    /// `referrer`, pushed as an OCI 1.1 referrer of it too ([`Self::refer`]); each skipped where
    /// a layer that is ours is there already.
    async fn attach(&self, a: &Attachment<'_>, referrer: bool) -> Result<Attached, AttachError> {
        let mut attached = self.append(a).await?;
        if referrer {
            attached.referrer = Some(self.refer(a).await?);
        }
        Ok(attached)
    }

    /// Whether one of `layers` (a manifest's, as JSON) is a layer of `a`'s kind that is ours.
    async fn holds_ours(
        &self,
        a: &Attachment<'_>,
        layers: &[serde_json::Value],
    ) -> Result<bool, AttachError> {
        for l in layers {
            let Ok(d) = serde_json::from_value::<Descriptor>(l.clone()) else {
                continue;
            };
            if d.media_type != a.kind.media_type() || d.size > MAX_LAYER {
                continue;
            }
            let bytes = self.blob(a.repo, &d).await?;
            if (a.ours)(&d, &bytes) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// `a`'s layer pushed as a blob; its entry for a manifest's `layers`.
    async fn push_layer(&self, a: &Attachment<'_>) -> Result<serde_json::Value, AttachError> {
        let desc = self
            .push_blob(a.repo, a.layer.media_type, a.layer.bytes.clone())
            .await?;
        Ok(serde_json::json!({
            "mediaType": desc.media_type,
            "size": desc.size,
            "digest": desc.digest,
            "annotations": a.layer.annotations,
        }))
    }

    /// The OCI 1.1 referrer of `a`'s subject holding its layer, unless one of its kind's type
    /// already holds a layer that is ours: the shapes cosign writes (`super::referrers`). The
    /// subject's media type and size are the caller's (the bundle's record of the manifest it
    /// pushed by that digest), not read back from the registry.
    async fn refer(&self, a: &Attachment<'_>) -> Result<Referred, AttachError> {
        let (repo, kind) = (a.repo, a.kind);
        let digest = &a.subject.digest;
        let artifact_type = kind.artifact_type();
        let at = |d: &Digest| format!("{}/{}@{d}", repo.registry, repo.repository);
        let reg_err = |what: String| move |source| AttachError::Registry { what, source };
        let gone = "the registry answered 404 to the referrers API it had served a moment before";
        let listed =
            self.referrers_of(repo, digest)
                .await?
                .ok_or_else(|| AttachError::Referrers {
                    reference: at(digest),
                    reason: gone.into(),
                })?;

        let same: Vec<&referrers::Listed> = listed
            .iter()
            .filter(|l| l.artifact_type.as_deref() == Some(artifact_type))
            .collect();
        if same.len() > referrers::MAX_COSIGN_REFERRERS {
            return Err(AttachError::Referrers {
                reference: at(digest),
                reason: format!(
                    "{} referrers of type {artifact_type}, more than the {} koord-bundle reads",
                    same.len(),
                    referrers::MAX_COSIGN_REFERRERS
                ),
            });
        }
        for entry in same {
            let r = ImageRef {
                tag: None,
                digest: Some(entry.digest.to_string()),
                ..repo.clone()
            };
            let (bytes, _) = self
                .reg
                .get_manifest(&r)
                .await
                .map_err(reg_err(format!("reading the referrer {r}")))?;
            // Someone else's shapes are not ours to judge here: only a layer of ours counts.
            let Ok((layers, _)) = read_existing(&bytes) else {
                continue;
            };
            if self.holds_ours(a, &layers).await? {
                return Ok(Referred {
                    reference: r.to_string(),
                    artifact_type,
                    added: false,
                    digest: entry.digest.clone(),
                });
            }
        }
        let layer_json = self.push_layer(a).await?;
        let subject = serde_json::json!({
            "mediaType": a.subject.media_type,
            "size": a.subject.size,
            "digest": digest,
        });
        let manifest = match kind {
            // cosign's WriteSignaturesExperimentalOCI: the signature image, its config's media
            // type the artifact type.
            Kind::Signature => {
                let config = signature_config(std::slice::from_ref(&layer_json));
                let config = self.push_blob(repo, artifact_type, config.into()).await?;
                serde_json::json!({
                    "schemaVersion": 2,
                    "mediaType": media::OCI_MANIFEST,
                    "config": {"mediaType": artifact_type, "size": config.size, "digest": config.digest},
                    "layers": [layer_json],
                    "subject": subject,
                    "artifactType": artifact_type,
                })
            }
            // cosign's WriteAttestationsReferrer: the empty config, the envelope, a time.
            Kind::Attestation => {
                let config = self
                    .push_blob(repo, referrers::EMPTY_CONFIG_MEDIA, b"{}".as_slice().into())
                    .await?;
                serde_json::json!({
                    "schemaVersion": 2,
                    "mediaType": media::OCI_MANIFEST,
                    "config": {"mediaType": referrers::EMPTY_CONFIG_MEDIA, "size": config.size, "digest": config.digest},
                    "layers": [layer_json],
                    "annotations": {referrers::CREATED_ANNOTATION: self.created},
                    "subject": subject,
                    "artifactType": artifact_type,
                })
            }
        };
        let bytes = bytes::Bytes::from(serde_json::to_vec(&manifest).unwrap_or_default());
        let digest = Digest::of(&bytes);
        let r = ImageRef {
            tag: None,
            digest: Some(digest.to_string()),
            ..repo.clone()
        };
        self.reg
            .put_manifest(&r, &bytes, media::OCI_MANIFEST)
            .await
            .map_err(reg_err(format!("pushing the referrer {r}")))?;
        Ok(Referred {
            reference: r.to_string(),
            artifact_type,
            added: true,
            digest,
        })
    }

    /// The manifest under `a`'s subject's tag of its kind, with its layer appended, unless a
    /// layer there is ours.
    async fn append(&self, a: &Attachment<'_>) -> Result<Attached, AttachError> {
        let (repo, digest) = (a.repo, &a.subject.digest);
        let tag = tag_of(digest, a.kind);
        let tagged = ImageRef {
            tag: Some(tag.clone()),
            digest: None,
            ..repo.clone()
        };
        let reference = tagged.to_string();
        let reg_err = |what: String| move |source| AttachError::Registry { what, source };
        let (mut layers, annotations) = match self.reg.get_manifest(&tagged).await {
            Ok((bytes, existing)) => {
                let (layers, annotations) =
                    read_existing(&bytes).map_err(|reason| AttachError::NotCosign {
                        reference: reference.clone(),
                        reason,
                    })?;
                if self.holds_ours(a, &layers).await? {
                    return Ok(Attached {
                        digest: digest.clone(),
                        reference,
                        manifest: existing.to_string(),
                        added: false,
                        referrer: None,
                    });
                }
                (layers, annotations)
            }
            Err(e) if e.is_not_found() => (Vec::new(), None),
            Err(e) => return Err(reg_err(format!("reading {reference}"))(e)),
        };
        layers.push(self.push_layer(a).await?);
        let config = signature_config(&layers);
        let config = self.push_blob(repo, CONFIG_MEDIA, config.into()).await?;
        let mut manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": media::OCI_MANIFEST,
            "config": {"mediaType": config.media_type, "digest": config.digest, "size": config.size},
            "layers": layers,
        });
        if let Some(a) = annotations {
            manifest["annotations"] = a;
        }
        let bytes = bytes::Bytes::from(serde_json::to_vec(&manifest).unwrap_or_default());
        let put = self
            .reg
            .put_manifest(&tagged, &bytes, media::OCI_MANIFEST)
            .await
            .map_err(reg_err(format!("pushing {reference}")))?;
        Ok(Attached {
            digest: digest.clone(),
            reference,
            manifest: put.to_string(),
            added: true,
            referrer: None,
        })
    }

    /// A layer's bytes (at most [`MAX_LAYER`]), checked against its digest.
    async fn blob(&self, repo: &ImageRef, d: &Descriptor) -> Result<Vec<u8>, AttachError> {
        let what = format!("reading blob {} of {}", d.digest, repo.repository);
        let r = ImageRef {
            tag: None,
            digest: Some(d.digest.to_string()),
            ..repo.clone()
        };
        let mut stream = self.reg.clone().blob_stream(r, d.clone(), 0);
        let mut out = Vec::new();
        while let Some(chunk) = stream
            .try_next()
            .await
            .map_err(|source| AttachError::Store {
                what: what.clone(),
                source,
            })?
        {
            out.extend_from_slice(&chunk);
            if out.len() as u64 > d.size {
                break;
            }
        }
        // A blob that is not what its digest says is nobody's signature.
        if Digest::of(&out) != d.digest {
            out.clear();
        }
        Ok(out)
    }

    /// Push `bytes` as a blob of `repo` (unless it holds it); its descriptor.
    async fn push_blob(
        &self,
        repo: &ImageRef,
        media_type: &str,
        bytes: bytes::Bytes,
    ) -> Result<Descriptor, AttachError> {
        let desc = Descriptor {
            media_type: media_type.to_string(),
            digest: Digest::of(&bytes),
            size: bytes.len() as u64,
            platform: None,
            annotations: None,
        };
        let what = format!("pushing blob {} to {}", desc.digest, repo.repository);
        let r = ImageRef {
            tag: None,
            digest: Some(desc.digest.to_string()),
            ..repo.clone()
        };
        let there =
            self.reg
                .blob_exists(&r, &desc)
                .await
                .map_err(|source| AttachError::Registry {
                    what: what.clone(),
                    source,
                })?;
        if !there {
            let quiet: crate::store::OnBytes = Arc::new(|_| {});
            self.reg
                .push_blob(&r, &desc, &Held(bytes), &quiet)
                .await
                .map_err(|source| AttachError::Store { what, source })?;
        }
        Ok(desc)
    }
}

/// The config go-containerregistry's mutate.Append writes for a signature image of `layers`:
/// a history entry and a diff_id (the layer's own digest: not compressed) for each layer.
fn signature_config(layers: &[serde_json::Value]) -> Vec<u8> {
    let diff_ids: Vec<serde_json::Value> = layers.iter().map(|l| l["digest"].clone()).collect();
    let config = serde_json::json!({
        "architecture": "",
        "config": {},
        "created": "0001-01-01T00:00:00Z",
        "history": vec![serde_json::json!({"created": "0001-01-01T00:00:00Z"}); layers.len()],
        "os": "",
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    serde_json::to_vec(&config).unwrap_or_default()
}

/// The layers and annotations of the manifest a signature tag holds (an OCI or Docker image
/// manifest), or why it is not one koord-bundle appends to.
type Existing = (Vec<serde_json::Value>, Option<serde_json::Value>);
fn read_existing(bytes: &[u8]) -> Result<Existing, String> {
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|_| "not JSON".to_string())?;
    let mt = v["mediaType"].as_str().unwrap_or(media::OCI_MANIFEST);
    if mt != media::OCI_MANIFEST && mt != media::DOCKER_MANIFEST {
        return Err(format!("a {mt}, not an image manifest"));
    }
    let layers = v["layers"]
        .as_array()
        .cloned()
        .ok_or_else(|| "no layers".to_string())?;
    let annotations = v.get("annotations").filter(|a| a.is_object()).cloned();
    Ok((layers, annotations))
}
