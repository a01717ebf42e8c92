//! koord-kube: the chart and the cluster, each reached through the real tool of its field.
//!
//! - [`chart`]: a Helm repository's `index.yaml` (version constraints, chart URLs), chart
//!   archives read in memory under caps, the values koord-bundle sets, the images of rendered
//!   manifests, the CRDs a chart ships, what the post-renderer changes;
//! - [`helm`]: the only module that runs `helm` (install, upgrade, template, pull, registry
//!   login), every run bounded in time, output and memory, passwords never in argv;
//! - [`cluster`]: kubeconfig as kubectl reads it, the user's credentials, the API client over
//!   kube, the pre-flight and the checks of an upgrade (read-only: helm writes).
//!
//! The three are side by side (none uses another); they use koord-base (YAML, CRD schemas,
//! child processes, secrets) and koord-store (the Helm repository fetcher). The root crate
//! re-exports each module at its old path (`koord_bundle::chart`, …), and `tests/it/layers.rs`
//! holds them to the same layer as before (6: the domain).
#![deny(missing_docs)]

pub mod chart;
pub mod cluster;
pub mod helm;

/// The class of one error of a chain when its type is one of this crate's, koord-store's or
/// koord-base's: `Some(decision)`; `None` for another crate's type (see
/// [`koord_base::exit::code_of`]).
pub fn class_of(
    e: &(dyn std::error::Error + 'static),
) -> Option<Option<koord_base::exit::ExitClass>> {
    koord_base::exit_classes!(e;
        crate::chart::ChartError,
        crate::chart::fetch::FetchError,
        crate::cluster::ClusterError,
        crate::cluster::running::NotVerified,
        crate::helm::HelmError,
    )
    .or_else(|| koord_store::class_of(e))
}
