//! Pure OCI types: digests, descriptors, platforms, media types, manifests and references.
//! Nothing here does I/O.

mod digest;
mod manifest;
mod reference;
pub mod size;
mod target;

pub use digest::{BlobCheck, BlobMismatch, Digest, DigestError, Sha256Writer};
pub use manifest::{Descriptor, Manifest, ManifestError, Platform};
pub use reference::{pinned, ImageRef, RefError};
pub use target::{split_host_port, HostPort, Target, TargetError};

/// Media types this tool reads and writes.
pub mod media {
    /// OCI image index.
    pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
    /// OCI image manifest.
    pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    /// Docker manifest list (schema 2).
    pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
    /// Docker image manifest (schema 2).
    pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
    /// Helm chart config blob (Chart.yaml as JSON).
    pub const HELM_CONFIG: &str = "application/vnd.cncf.helm.config.v1+json";
    /// Helm chart content layer (the chart .tgz).
    pub const HELM_CHART: &str = "application/vnd.cncf.helm.chart.content.v1.tar+gzip";
    /// Every manifest media type, for `Accept` headers (distribution 2.8 answers 404 for an
    /// index fetched without the index type in `Accept`).
    pub const ALL_MANIFESTS: [&str; 4] = [OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST];

    /// True for the two index (manifest list) media types.
    pub fn is_index(media_type: &str) -> bool {
        media_type == OCI_INDEX || media_type == DOCKER_LIST
    }
}
