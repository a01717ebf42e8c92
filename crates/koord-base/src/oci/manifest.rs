use super::size::{MAX_SIZE, MAX_SIZE_TEXT};
use super::{media, Digest};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// An OCI content descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// Media type of the referenced content.
    pub media_type: String,
    /// Digest of the referenced content.
    pub digest: Digest,
    /// Size in bytes.
    pub size: u64,
    /// Platform, for entries of an index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// A platform as found in an image index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    /// CPU architecture (`amd64`, `arm64`, `unknown`).
    pub architecture: String,
    /// Operating system (`linux`, `unknown`).
    pub os: String,
    /// CPU variant (`v8`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// OS version (Windows).
    #[serde(
        rename = "os.version",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub os_version: Option<String>,
}

impl Platform {
    /// Does this platform match a `os/arch[/variant]` filter string? A filter without a variant
    /// matches every variant.
    pub fn matches(&self, filter: &str) -> bool {
        let mut parts = filter.split('/');
        let (os, arch, variant) = (parts.next(), parts.next(), parts.next());
        os == Some(self.os.as_str())
            && arch == Some(self.architecture.as_str())
            && (variant.is_none() || variant == self.variant.as_deref())
    }
    /// Buildx attestation entries carry `unknown/unknown`.
    pub fn is_unknown(&self) -> bool {
        self.os == "unknown" && self.architecture == "unknown"
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// A manifest parsed from raw bytes: either an index or an image (or artifact) manifest.
/// The raw bytes stay the truth; this is only for walking the graph.
#[derive(Debug, Clone)]
pub enum Manifest {
    /// An OCI index or Docker manifest list.
    Index {
        /// Media type (from the document, else from the transport).
        media_type: String,
        /// Child manifests.
        manifests: Vec<Descriptor>,
    },
    /// An image or artifact manifest.
    Image {
        /// Media type (from the document, else from the transport).
        media_type: String,
        /// Config blob.
        config: Descriptor,
        /// Layer blobs.
        layers: Vec<Descriptor>,
    },
}

/// A manifest that cannot be walked.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// Not JSON of a manifest shape.
    #[error("manifest {digest} is not a valid OCI/Docker manifest: {reason}")]
    Invalid {
        /// Digest of the bytes.
        digest: Digest,
        /// What is wrong.
        reason: String,
    },
}

/// A manifest that does not parse or breaks a rule: what a bundle or a registry served.
impl crate::exit::Classify for ManifestError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        Some(crate::exit::ExitClass::Input)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    schema_version: Option<i64>,
    media_type: Option<String>,
    manifests: Option<Vec<Descriptor>>,
    config: Option<Descriptor>,
    layers: Option<Vec<Descriptor>>,
}

impl Manifest {
    /// Parse raw manifest bytes. `transport_type` is the Content-Type the registry gave, used when
    /// the document carries no `mediaType`.
    pub fn parse(bytes: &[u8], transport_type: Option<&str>) -> Result<Self, ManifestError> {
        let invalid = |reason: String| ManifestError::Invalid {
            digest: Digest::of(bytes),
            reason,
        };
        let raw: Raw = serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
        if raw.schema_version != Some(2) {
            return Err(invalid(format!(
                "schemaVersion {:?}, expected 2",
                raw.schema_version
            )));
        }
        // A size an OCI descriptor cannot hold (its `size` is an int64) is refused here, where
        // every walk of every graph first meets it: nothing downstream adds it up.
        let all = raw.manifests.iter().flatten();
        let all = all
            .chain(raw.config.iter())
            .chain(raw.layers.iter().flatten());
        if let Some(d) = all.into_iter().find(|d| d.size > MAX_SIZE) {
            return Err(invalid(format!(
                "{} declares {} bytes, more than an OCI descriptor can hold ({MAX_SIZE_TEXT}: its size is an int64)",
                d.digest, d.size
            )));
        }
        let media_type = raw
            .media_type
            .or_else(|| transport_type.map(str::to_string))
            .unwrap_or_default();
        if let Some(manifests) = raw.manifests {
            let media_type = if media_type.is_empty() {
                media::OCI_INDEX.to_string()
            } else {
                media_type
            };
            return Ok(Manifest::Index {
                media_type,
                manifests,
            });
        }
        match raw.config {
            Some(config) => {
                let media_type = if media_type.is_empty() {
                    media::OCI_MANIFEST.to_string()
                } else {
                    media_type
                };
                Ok(Manifest::Image {
                    media_type,
                    config,
                    layers: raw.layers.unwrap_or_default(),
                })
            }
            None => Err(invalid("neither `manifests` nor `config`".into())),
        }
    }

    /// The media type.
    pub fn media_type(&self) -> &str {
        match self {
            Manifest::Index { media_type, .. } | Manifest::Image { media_type, .. } => media_type,
        }
    }

    /// Blobs an image manifest references (config first), empty for an index.
    pub fn blobs(&self) -> Vec<&Descriptor> {
        match self {
            Manifest::Index { .. } => vec![],
            Manifest::Image { config, layers, .. } => {
                std::iter::once(config).chain(layers).collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn parses_index_and_image() {
        let d = Digest::of(b"x");
        let idx = format!(
            r#"{{"schemaVersion":2,"mediaType":"{}","manifests":[{{"mediaType":"{}","digest":"{d}","size":1,"platform":{{"architecture":"arm64","os":"linux","variant":"v8"}}}}]}}"#,
            media::OCI_INDEX,
            media::OCI_MANIFEST
        );
        match Manifest::parse(idx.as_bytes(), None).unwrap() {
            Manifest::Index { manifests, .. } => {
                let p = manifests[0].platform.as_ref().unwrap();
                assert!(p.matches("linux/arm64"));
                assert!(p.matches("linux/arm64/v8"));
                assert!(!p.matches("linux/amd64"));
                assert_eq!(p.to_string(), "linux/arm64/v8");
            }
            _ => panic!("expected index"),
        }
        let img = format!(
            r#"{{"schemaVersion":2,"config":{{"mediaType":"a","digest":"{d}","size":1}},"layers":[]}}"#
        );
        assert!(matches!(
            Manifest::parse(img.as_bytes(), None).unwrap(),
            Manifest::Image { .. }
        ));
        assert!(Manifest::parse(b"{\"schemaVersion\":1}", None).is_err());
        // A size an int64 cannot hold: refused, naming the blob.
        let huge = format!(
            r#"{{"schemaVersion":2,"config":{{"mediaType":"a","digest":"{d}","size":1}},"layers":[{{"mediaType":"b","digest":"{d}","size":18446744073709551615}}]}}"#
        );
        let e = Manifest::parse(huge.as_bytes(), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&d.to_string()) && e.contains("int64"), "{e}");
        let max = huge.replace("18446744073709551615", "9223372036854775807");
        assert!(Manifest::parse(max.as_bytes(), None).is_ok());
        assert!(Manifest::parse(b"not json", None).is_err());
    }
}
