//! koord-bundle: carry Koordinator (Helm chart, container images, CRDs) into an air-gapped
//! cluster as one signed, plain-tar bundle whose root is an OCI image layout.
//!
//! The crate is organised as a copy between stores (see `bundle-spec/` and ARCHITECTURE):
//! `oci` holds pure types, `store` the sources and sinks (registry, content-addressed cache),
//! `copy` the graph walk, `chart` and `bundle` the domain, and `cmd` the commands, the only
//! place that prints or reads the environment.
#![deny(missing_docs)]

pub mod bundle;
pub mod chart;
pub mod cli;
pub mod cluster;
pub mod cmd;
pub mod copy;
pub mod helm;
pub mod oci;
pub mod progress;
pub mod serve;
pub mod sources;
pub mod store;
pub mod yaml;
