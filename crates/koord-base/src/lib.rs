//! koord-base: the parts of koord-bundle that use nothing of the rest of it.
//!
//! - [`oci`]: digests, descriptors, platforms, media types, manifests and references (pure
//!   types, no I/O);
//! - [`text`]: text from outside made safe to print (escaped, bounded), percent-encoding;
//! - [`bounded`]: input files opened one way (regular files only, an open that never waits)
//!   and read under a cap;
//! - [`fsio`]: file primitives (positional reads and writes, space reserved, the one way a
//!   file written in place is opened);
//! - [`sign`]: minisign keys and signatures, compatible with the `minisign` command;
//! - [`child`]: the one way a child process is run (its own process group, killed with its
//!   parent, output bounded, limits set);
//! - [`secret`]: a string that never prints (passwords, tokens);
//! - [`yaml`]: the one bounded YAML entry (size, depth, nodes, aliases as expanded) every YAML
//!   input goes through; [`crd`]: CustomResourceDefinition schemas read through it (bundle, the
//!   chart reader and the cluster's upgrade checks all compare them, so it sits below the three);
//! - [`exit`]: the exit codes, and the [`exit::Classify`] trait by which each error type says
//!   its own class next to its definition; [`class`] finds this crate's types in an error chain.
//!
//! The root crate re-exports each module at its old path (`koord_bundle::oci`, …), and
//! `tests/it/layers.rs` holds these modules to the same layers as the root crate's (0: exit;
//! 1: oci, text, yaml, bounded, child, secret; 2: sign, fsio; 3: crd; 4: class).
#![deny(missing_docs)]

pub mod bounded;
pub mod child;
pub mod class;
pub mod crd;
pub mod exit;
pub mod fsio;
pub mod oci;
pub mod secret;
pub mod sign;
pub mod text;
pub mod yaml;
