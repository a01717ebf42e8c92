//! OCI 1.1 referrers (distribution spec 1.1, image spec 1.1) of cosign signatures and
//! attestations: what `GET /v2/<name>/referrers/<digest>` answers, and the manifests that name
//! the signed image as their `subject`.
//!
//! - A signature referrer is what `cosign sign --registry-referrers-mode=oci-1-1` (cosign
//!   v2.6.5, `pkg/oci/remote/write.go`, `WriteSignaturesExperimentalOCI`) pushes: the
//!   signature image's manifest with `artifactType` and `config.mediaType`
//!   [`SIGNATURE_ARTIFACT`], and `subject` the signed manifest; `cosign verify
//!   --experimental-oci11` finds it by that type.
//! - An attestation referrer is what cosign's `WriteAttestationsReferrer` (same file) pushes:
//!   `artifactType` [`ATTESTATION_ARTIFACT`] (the in-toto media type), an empty config
//!   (`application/vnd.oci.empty.v1+json`, `{}`), the DSSE envelope as its layer. cosign v2.6.5's
//!   CLI has no command that writes or reads it (its attestations go to the `.att` tag, or as
//!   a sigstore bundle); `cosign tree --experimental-oci11` lists it.
//!
//! A registry serves the API when it answers 200 with an image index, and does not when it
//! answers 404 (distribution 2.8); any other answer is an error, not a guess. Where it does
//! not, the spec's fallback is the referrers tag schema: an index under the tag
//! `sha256-<hex>` of the subject ([`fallback_tag`]), kept by whoever pushes a referrer.

use crate::oci::{media, Digest};

/// The `artifactType` of a cosign signature referrer (cosign's
/// `ArtifactType("sig")`).
pub const SIGNATURE_ARTIFACT: &str = "application/vnd.dev.cosign.artifact.sig.v1+json";
/// The `artifactType` of a cosign attestation referrer (the in-toto payload type, as cosign's
/// `WriteAttestationsReferrer` gives it).
pub const ATTESTATION_ARTIFACT: &str = "application/vnd.in-toto+json";
/// The OCI empty descriptor's media type (an attestation referrer's config, `{}`).
pub const EMPTY_CONFIG_MEDIA: &str = "application/vnd.oci.empty.v1+json";
/// The annotation a referrer's creation time goes in.
pub const CREATED_ANNOTATION: &str = "org.opencontainers.image.created";
/// A referrers list with more cosign entries than this for one digest is refused (each is a
/// manifest to read).
pub const MAX_COSIGN_REFERRERS: usize = 256;

/// One entry of a referrers list.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Listed {
    /// The referrer manifest's media type.
    pub media_type: String,
    /// Its digest.
    pub digest: Digest,
    /// Its size.
    pub size: u64,
    /// Its `artifactType` as the list gives it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
}

/// The referrers tag schema's tag of `subject`: `sha256-<hex>`.
pub fn fallback_tag(subject: &Digest) -> String {
    format!("sha256-{}", subject.hex())
}

/// The entries of a referrers list, or why it is not one: it must be an OCI image index
/// (`schemaVersion` 2, `mediaType` the OCI index's, `manifests` an array of descriptors).
pub fn parse_list(bytes: &[u8]) -> Result<Vec<Listed>, String> {
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|_| "not JSON".to_string())?;
    if !v.is_object() {
        return Err("not a JSON object".into());
    }
    if v["schemaVersion"] != 2 {
        return Err(format!("schemaVersion {}, not 2", v["schemaVersion"]));
    }
    match v["mediaType"].as_str() {
        Some(media::OCI_INDEX) => {}
        Some(other) => return Err(format!("a {other}, not an OCI image index")),
        None => return Err("no mediaType (an OCI image index names its own)".into()),
    }
    let list = v["manifests"]
        .as_array()
        .ok_or("no manifests array (an image index lists its manifests)")?;
    list.iter()
        .enumerate()
        .map(|(i, d)| {
            let bad = |why: &str| format!("entry {} of {}: {why}", i + 1, list.len());
            let digest = d["digest"]
                .as_str()
                .and_then(|s| s.parse::<Digest>().ok())
                .ok_or_else(|| bad("no sha256 digest"))?;
            Ok(Listed {
                media_type: d["mediaType"]
                    .as_str()
                    .ok_or_else(|| bad("no mediaType"))?
                    .to_string(),
                digest,
                size: d["size"].as_u64().ok_or_else(|| bad("no size"))?,
                artifact_type: d["artifactType"].as_str().map(str::to_string),
            })
        })
        .collect()
}

/// What a referrer manifest says of itself: its `artifactType` (else its config's media
/// type, as the spec derives it) and its `subject`'s digest.
pub fn describe(manifest: &[u8]) -> (Option<String>, Option<Digest>) {
    let v: serde_json::Value = serde_json::from_slice(manifest).unwrap_or_default();
    let at = v["artifactType"]
        .as_str()
        .or_else(|| v["config"]["mediaType"].as_str())
        .map(str::to_string);
    let subject = v["subject"]["digest"]
        .as_str()
        .and_then(|s| s.parse::<Digest>().ok());
    (at, subject)
}

/// The descriptor of a referrer in a referrers list (the fallback tag's index): its media
/// type, digest and size, its `artifactType` and its annotations, as the spec lists them.
pub fn list_entry(manifest: &[u8], media_type: &str) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_slice(manifest).unwrap_or_default();
    let mut d = serde_json::json!({
        "mediaType": media_type,
        "digest": Digest::of(manifest),
        "size": manifest.len(),
    });
    if let (Some(at), _) = describe(manifest) {
        d["artifactType"] = at.into();
    }
    if v["annotations"].is_object() {
        d["annotations"] = v["annotations"].clone();
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_must_be_an_oci_index() {
        let d = Digest::of(b"x");
        let good = serde_json::json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX,
            "manifests": [{"mediaType": media::OCI_MANIFEST, "digest": d, "size": 3,
                           "artifactType": SIGNATURE_ARTIFACT}]});
        let l = parse_list(&serde_json::to_vec(&good).unwrap()).unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].artifact_type.as_deref(), Some(SIGNATURE_ARTIFACT));
        for (bad, needle) in [
            (serde_json::json!([]), "not a JSON object"),
            (
                serde_json::json!({"schemaVersion": 2, "mediaType": media::OCI_MANIFEST, "manifests": []}),
                "not an OCI image index",
            ),
            (
                serde_json::json!({"schemaVersion": 2, "manifests": []}),
                "no mediaType",
            ),
            (
                serde_json::json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX}),
                "no manifests",
            ),
            (
                serde_json::json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX,
                    "manifests": [{"mediaType": "m", "digest": "md5:00", "size": 1}]}),
                "entry 1 of 1: no sha256 digest",
            ),
        ] {
            let e = parse_list(&serde_json::to_vec(&bad).unwrap()).unwrap_err();
            assert!(e.contains(needle), "{e}");
        }
        assert!(parse_list(b"<html>").unwrap_err().contains("not JSON"));
    }

    #[test]
    fn a_manifest_says_its_type_and_subject() {
        let d = Digest::of(b"image");
        let m = serde_json::json!({"config": {"mediaType": EMPTY_CONFIG_MEDIA},
            "artifactType": ATTESTATION_ARTIFACT, "subject": {"digest": d},
            "annotations": {CREATED_ANNOTATION: "t"}});
        let bytes = serde_json::to_vec(&m).unwrap();
        assert_eq!(
            describe(&bytes),
            (Some(ATTESTATION_ARTIFACT.to_string()), Some(d.clone()))
        );
        let e = list_entry(&bytes, media::OCI_MANIFEST);
        assert_eq!(e["artifactType"], ATTESTATION_ARTIFACT);
        assert_eq!(e["annotations"][CREATED_ANNOTATION], "t");
        // No artifactType: the config's media type.
        let m = serde_json::json!({"config": {"mediaType": SIGNATURE_ARTIFACT}});
        assert_eq!(
            describe(&serde_json::to_vec(&m).unwrap()).0.as_deref(),
            Some(SIGNATURE_ARTIFACT)
        );
        assert_eq!(fallback_tag(&d), format!("sha256-{}", d.hex()));
    }
}
