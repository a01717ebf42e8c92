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

pub(crate) use crate::text::error_chain;
