//! The bundle: its manifest, checksum file, signature, and the plain tar that carries them with
//! an OCI image layout at its root. Normative description: `bundle-spec/README.md`.

pub mod checksums;
pub use crate::crd;
pub mod diff;
pub mod emit;
pub mod layout;
pub mod manifest;
pub mod opened;
pub mod pack;
pub mod plan;
pub mod reader;
pub mod reuse;
pub mod sbom;
/// The signature (minisign): at the crate's root since it uses nothing of the bundle's.
pub use crate::sign;
pub mod source;
pub mod tools;
pub mod writer;

pub use manifest::BundleManifest;
pub use opened::OpenedBundle;

/// Name of the bundle manifest inside the tar.
pub const MANIFEST_FILE: &str = "koord-bundle.json";
/// Name of the checksum file inside the tar.
pub const CHECKSUMS_FILE: &str = "SHA256SUMS";
/// Name of the minisign signature of the checksum file.
pub const SIGNATURE_FILE: &str = "SHA256SUMS.minisig";
/// The format this crate writes.
pub const FORMAT_VERSION: &str = "koord-bundle/v1";
/// The OCI annotation that names an image in `index.json`.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";
