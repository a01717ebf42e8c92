//! Signed for admission: what a site's admission controller needs to admit the images `load`
//! pushed only when they carry the site's cosign signature (issue 46).
//!
//! - [`policy`]: the policies, written for the site: a Kyverno `ImageValidatingPolicy` and a
//!   sigstore policy-controller `ClusterImagePolicy` that admit the images under the load's
//!   `REGISTRY[/PREFIX]` only when signed by the site's key, with no transparency log and no
//!   internet (a pure rendering, and an atomic write into a directory).
//!
//! The signing itself (cosign signatures pushed at load) lives beside this module.
//!
//! Layer 5 (the domain, beside `bundle` and `cluster`): it uses only lower layers (`oci` for the
//! registry address rules).

pub mod policy;
