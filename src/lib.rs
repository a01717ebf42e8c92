//! koord-bundle: carry Koordinator (Helm chart, container images, CRDs) into an air-gapped
//! cluster as one signed, plain-tar bundle whose root is an OCI image layout.
//!
//! # A short tour
//!
//! Every command is a copy between stores, done by one engine:
//!
//! | command | source → sink |
//! |---|---|
//! | `build`  | registry ([`store::registry::RegistryStore`]) and earlier bundles ([`bundle::reuse`]) → the bundle writer ([`bundle::writer`]), each blob written once |
//! | `load`   | bundle read in place ([`bundle::source::BundleSource`]) → registry |
//! | `verify` | the bundle streamed once, every file hashed; the layout checked by the engine's walk |
//! | `serve`  | HTTP ([`serve`]) over any [`store::Catalog`] source: a bundle read in place |
//!
//! The layers, lowest first (a module uses only lower ones; `tests/it/layers.rs` holds the rule):
//!
//! 0. [`exit`]: the exit codes, and the class each error type says it is of beside its
//!    definition ([`exit::Classify`]); each crate lists its error types once in its `class_of`
//!    (koord-base's `class`, layer 4; the other crates' at their roots, taken as layer 7; the
//!    root's in `cmd`), and [`cmd::exit_code`] walks an error chain with them;
//! 1. [`oci`] (digests, descriptors, manifests, references: pure types), [`text`] and [`yaml`]
//!    (every YAML input goes through its bounds), [`bounded`] (every file read from outside
//!    stops at its cap), [`secret`] (credentials that never print), [`child`] (the one way
//!    another program is run: time limit, output caps, its process group ended with it);
//! 2. [`sign`] (minisign keys and signatures) and [`fsio`] (file primitives);
//! 3. [`store`]: the [`store::Source`] and [`store::Sink`] traits and their stores (registry,
//!    blob cache, memory, file regions), with retries at the transport; [`crd`] (a CRD's
//!    versions and schema, and the one rule of what a schema does to an object);
//! 4. [`copy`]: the one graph walk — [`copy::resolve`] reads a graph from a source,
//!    [`copy::transfer`] copies graphs into a sink children first, each blob once;
//! 5. [`koord_splitset`]: split sets (parts with parity, repair, join) and files written
//!    atomically — its own layers 1 (`parity`), 3 (`atomic`), 4 (`set`), 5 (`parts`);
//! 6. the domain, side by side: [`bundle`] (format, reader, writer, the bundle as a source),
//!    [`chart`] (Helm repository index, chart archive, image discovery, CRDs),
//!    [`cluster`] (kubeconfig, API client, pre-flight), [`helm`] (the only module that runs
//!    helm), [`serve`] (a read-only registry), [`sources`] (where images come from),
//!    [`admission`] (cosign signatures pushed at load, and the admission policies for them);
//! 7. [`cli`] (flags; their doc comments are `--help`), [`progress`] (the one printer) and
//!    [`load`] (load's pipeline over the domain: pre-flight, plan, render, push, install; it
//!    prints nothing and reads no flag: it takes resolved settings and says what it finds as
//!    events);
//! 8. [`cmd`]: one module per command, the only place that prints, prompts or reads the
//!    environment; settings are resolved there once, before any I/O.
//!
//! [`exit`], [`oci`], [`text`], [`yaml`], [`bounded`], [`secret`], [`child`], [`sign`], [`fsio`]
//! and [`crd`] live in the workspace's `crates/koord-base` (they use nothing of the rest);
//! [`store`] and [`copy`] in `crates/koord-store` (over koord-base only); [`chart`], [`cluster`]
//! and [`helm`] in `crates/koord-kube` (over koord-base and koord-store). All are re-exported
//! here at their paths; `crates/koord-splitset` (over koord-base only) is used by its own name.
//!
//! Where things go: a new store implements [`store::Source`] and/or [`store::Sink`] in
//! koord-store's `store/` (or, when it knows the bundle format, in `bundle/`); a new command
//! gets its flags in `cli/`, a `cmd/<name>.rs` that resolves its settings and calls the engine,
//! and a test in `tests/it/` that runs the binary against the real peers of the test
//! environment.
#![deny(missing_docs)]

/// One line of a command's words on stdout, made safe for a terminal ([`text::terminal_safe`]):
/// every string from a bundle, a header, a registry or a child process that a command prints
/// goes through here (or through [`progress::Progress`] for stderr). `println!` itself is
/// refused by clippy (clippy.toml) outside the few places that print JSON or a prompt.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::progress::say_line(&format!($($arg)*))
    };
}

/// One line on stderr, made safe for a terminal: for the few messages printed outside a
/// [`progress::Progress`] (which escapes its own).
#[macro_export]
macro_rules! tell {
    ($($arg:tt)*) => {
        $crate::progress::tell_line(&format!($($arg)*))
    };
}

// The modules that use nothing of the rest live in crates/koord-base (issue 44); they keep
// their paths here, so `crate::oci`, `koord_bundle::sign`, … read as before.
pub use koord_base::{bounded, child, crd, exit, fsio, oci, secret, sign, text, yaml};
// The stores and the graph walk live in crates/koord-store (issue 47), at their old paths too.
pub use koord_store::{copy, store};
// The chart, helm and the cluster side live in crates/koord-kube (issue 47), at their old paths.
pub use koord_kube::{chart, cluster, helm};

pub mod admission;
pub mod bundle;
pub mod cli;
pub mod cmd;
pub mod load;
pub mod progress;
pub mod serve;
pub mod sources;
