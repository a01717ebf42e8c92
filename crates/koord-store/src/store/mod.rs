//! Stores: the sources and sinks content is copied between. `registry` is the distribution-API
//! client (the only module that speaks to registries); `cache` is the content-addressed blob
//! store on disk.

pub mod auth;
pub mod cache;
pub mod content;
pub mod dns;
pub mod file;
pub mod http;
#[cfg(any(test, feature = "memory-store"))]
pub mod memory;
pub mod registry;
pub mod retry;

pub use auth::Credentials;
pub use cache::{BlobCache, CacheError};
pub use content::{
    BlobStream, Catalog, Failure, Have, OnBytes, Opener, RawManifest, Reference, Sink, Source,
    Store, StoreError, StoreFailure,
};
#[cfg(any(test, feature = "memory-store"))]
pub use memory::MemoryStore;
pub use registry::{Mount, Registry, RegistryError, RegistryOptions, RetryEvent, RetryReporter};

pub(crate) use koord_base::text::error_chain;

/// A CA bundle: the system's whole bundle is about 200 KiB.
const MAX_CA_FILE: usize = 16 * 1024 * 1024;

/// The certificates of the `--ca-file` PEM files, to trust besides the system roots (registries
/// and Helm repositories alike). A file that cannot be read, or holds no PEM certificate, is an
/// error naming it.
pub(crate) fn read_ca_files(
    files: &[std::path::PathBuf],
) -> Result<Vec<reqwest::Certificate>, String> {
    let mut certs = Vec::new();
    for f in files {
        // Opened as every input file is: a FIFO or a device is refused, not waited on.
        let data = koord_base::bounded::read_file_bounded(f, MAX_CA_FILE)
            .map_err(|e| format!("cannot read CA file {}: {e}", f.display()))?;
        if !String::from_utf8_lossy(&data).contains("-----BEGIN CERTIFICATE-----") {
            return Err(format!("CA file {} holds no PEM certificate", f.display()));
        }
        certs.extend(
            reqwest::Certificate::from_pem_bundle(&data)
                .map_err(|e| format!("CA file {}: {e}", f.display()))?,
        );
    }
    Ok(certs)
}
