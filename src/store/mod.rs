//! Stores: the sources and sinks content is copied between. `registry` is the distribution-API
//! client (the only module that speaks to registries); `cache` is the content-addressed blob
//! store on disk.

pub mod auth;
pub mod cache;
pub mod content;
pub mod file;
pub mod http;
pub mod memory;
pub mod registry;
pub mod retry;

pub use auth::{Credentials, Secret};
pub use cache::{BlobCache, CacheError};
pub use content::{
    BlobStream, Catalog, Have, OnBytes, Opener, RawManifest, Reference, Sink, Source, Store,
    StoreError,
};
pub use memory::MemoryStore;
pub use registry::{Mount, Registry, RegistryError, RegistryOptions, RetryEvent, RetryReporter};

/// An error and its sources on one line (`a: b: c`), each cause once.
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}
