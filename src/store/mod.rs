//! Stores: the sources and sinks content is copied between. `registry` is the only user of
//! oci-client; `cache` is the content-addressed blob store on disk.

pub mod auth;
pub mod cache;
pub mod http;
pub mod registry;
pub mod retry;

pub use auth::{Credentials, Secret};
pub use cache::{BlobCache, CacheError};
pub use registry::{Registry, RegistryError, RegistryOptions};
