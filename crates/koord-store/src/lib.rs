//! koord-store: the stores content is copied between, and the one graph walk that copies it.
//!
//! - [`store`]: the [`store::Source`] and [`store::Sink`] traits and their stores: the
//!   distribution-API registry client (the only code that speaks to registries: token and basic
//!   auth, credential helpers, Harbor's projects, mounts, resumable blob downloads), the blob
//!   cache on disk, the Helm repository fetcher, file regions, the one retry policy
//!   ([`store::retry`]) and, with the `memory-store` feature, an in-memory store for tests and
//!   the `graph_walk` fuzz target;
//! - [`copy`]: [`copy::resolve`] reads a manifest graph from a source under the walk's bounds,
//!   [`copy::transfer`] copies graphs into a sink children first, each blob once.
//!
//! It uses koord-base only. The root crate re-exports both modules at their old paths
//! (`koord_bundle::store`, `koord_bundle::copy`), and `tests/it/layers.rs` holds them to the
//! same layers as before (3: store; 4: copy).
#![deny(missing_docs)]

pub mod copy;
pub mod store;

/// The class of one error of a chain when its type is one of this crate's or koord-base's:
/// `Some(decision)`; `None` for another crate's type (see [`koord_base::exit::code_of`]).
pub fn class_of(
    e: &(dyn std::error::Error + 'static),
) -> Option<Option<koord_base::exit::ExitClass>> {
    koord_base::exit_classes!(e;
        crate::copy::WalkError,
        crate::store::auth::AuthError,
        crate::store::cache::CacheError,
        crate::store::content::Failure,
        crate::store::content::StoreError,
        crate::store::http::HttpError,
        crate::store::registry::HarborError,
        crate::store::registry::ProbeError,
        crate::store::registry::RegistryError,
    )
    .or_else(|| koord_base::class::class_of(e))
}
