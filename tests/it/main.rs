//! Integration tests: the real binary against the real peers of the test environment
//! (CNCF distribution 2.8 over plain HTTP and over TLS with basic auth, skopeo, minisign,
//! sha256sum, helm). Start them with scripts/test.sh.

// The tests read what the binary wrote with serde_yaml_ng directly, as an outside peer would
// (the crate itself parses YAML only through koord_bundle::yaml).
#![allow(clippy::disallowed_methods)]

mod build;
mod charts;
mod common;
mod exit_codes;
mod fake_registry;
mod fault_proxy;
mod faults;
mod fuzz_regressions;
mod harbor;
mod helm;
mod hostile;
mod hostile_charts;
mod install;
mod kube_fake;
mod kube_hostile;
mod kubeconfig;
mod large_blobs;
mod layers;
mod load;
mod messages;
mod parity;
mod preflight;
mod serve;
mod sneakernet;
mod token_registry;
mod yaml_bounds;
