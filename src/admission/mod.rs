//! Signed for admission (issue 46): what lets a cluster whose admission policy admits only
//! signed images (Kyverno, the sigstore policy-controller, Ratify) run what `load` pushed.
//!
//! - [`cosign`]: cosign's key files (read and written as cosign does), its signature payloads
//!   (simple signing, DSSE over in-toto), ECDSA P-256 signing and checking.
//! - [`attach`]: signatures and attestations pushed next to an image in cosign's tag scheme
//!   (`sha256-<hex>.sig`, `sha256-<hex>.att` in the image's repository), appended to what is
//!   there, and not again when this key already signed; where the registry serves the OCI 1.1
//!   referrers API, also as referrers.
//! - [`referrers`]: OCI 1.1 referrers of cosign signatures and attestations (their artifact
//!   types, the referrers list and its fallback tag).
//! - [`policy`]: the policies, written for the site: a Kyverno `ImageValidatingPolicy` and a
//!   sigstore policy-controller `ClusterImagePolicy` that admit the images under the load's
//!   `REGISTRY[/PREFIX]` only when signed by the site's key, with no transparency log and no
//!   internet (a pure rendering, and an atomic write into a directory).
//! - [`upstream`]: the signatures and attestations an image's source holds in the tag scheme
//!   and as OCI 1.1 referrers, read to be carried into a bundle (`build --with-signatures`) and
//!   checked against a key.
//!
//! Layer 5 (the domain, beside `bundle` and `cluster`; see tests/it/layers.rs): over the
//! registry client (`store`) and the OCI types; `cmd::load` chooses what is signed and says
//! what was.

pub mod attach;
pub mod cosign;
pub mod policy;
pub mod referrers;
pub mod upstream;
