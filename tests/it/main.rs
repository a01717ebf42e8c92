// The tests print what they saw for a failure's reader; the one-printer rule (clippy.toml) is the binary's.
#![allow(clippy::disallowed_macros)]
//! Integration tests: the real binary against the real peers of the test environment
//! (CNCF distribution 2.8 over plain HTTP and over TLS with basic auth, skopeo, minisign,
//! sha256sum, helm, kubectl, a real kube-apiserver). Start them with scripts/test.sh.
//!
//! Helper modules hold no test: `cluster` (the real control plane, leased one test at a time),
//! `common` (the environment, homes, running, waiting, skopeo, curl), `serve_proc` (a running
//! `koord-bundle serve`), `fake_registry`, `fault_proxy` and `kube_fake` (stand-ins). Every other module is a scenario file and uses only helpers, never
//! another scenario file (`layers.rs` holds that).

// The tests read what the binary wrote with serde_yaml_ng directly, as an outside peer would
// (the crate itself parses YAML only through koord_bundle::yaml).
#![allow(clippy::disallowed_methods)]

mod admission_policy;
mod bom;
mod build;
mod bytes;
mod charts;
mod cluster;
mod common;
mod cosign_sign;
mod day2;
mod diff;
mod error_classes;
mod exit_codes;
mod fake_registry;
mod fault_proxy;
mod faults;
mod firsthour;
mod fuzz_regressions;
mod guards;
mod harbor;
mod helm;
mod hostile;
mod hostile_charts;
mod hostile_sets;
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
mod reference_reader;
mod referrers;
mod serve;
mod serve_proc;
mod settings;
mod sneakernet;
mod spec;
mod terminal;
mod token_registry;
mod tools;
mod untrusted_files;
mod upstream_signatures;
mod verify_cluster;
mod yaml_bounds;
