//! Read-only access to the target Kubernetes cluster, for the checks made before installing
//! (`preflight`): kubeconfig loading ([`kubeconfig`]), exec credential plugins ([`exec`]), a
//! small GET-only API client ([`client`]) and the checks themselves ([`mod@preflight`]).
//!
//! Nothing here writes to the cluster (helm does, with the same kubeconfig, running exec
//! plugins itself). Nothing here reads the environment either: the caller passes
//! `--kubeconfig`, `$KUBECONFIG` and the home directory in (see [`kubeconfig::locate`]).
//!
//! # Hand-written client, not kube-client (the `kube` crate)
//!
//! Measured with two minimal programs (scratch, not committed) that list the nodes of a
//! cluster: one over reqwest 0.13 as this module does, one with `kube` 2.0.1 (features
//! `client`, `rustls-tls`, `config`) and `k8s-openapi` 0.26 (`latest`), both `lto = "thin"`,
//! `cargo clean` then `cargo build --release`, one after the other on this 2-core machine
//! with nothing else running (2026-11-30):
//!
//! | | clean release build | release binary | crates in the tree |
//! |---|---|---|---|
//! | reqwest only (as here) | 68.6 s | 6 606 752 bytes | 116 |
//! | kube-client + k8s-openapi | 70.5 s | 7 265 544 bytes | 127 |
//!
//! So kube-client is not expensive: +2 s of build (k8s-openapi compiles beside the rest),
//! +0.66 MB of binary, 11 more crates. (An earlier attempt inside a copy of this crate, on a
//! machine shared with other builds, did not finish in 15 min and is not a figure.) The choice
//! rests on the rest: the cluster side needs five GETs, a kubeconfig reader and an exec-plugin
//! runner, about 1 500 lines with their tests, and our error messages and redaction (which
//! kubeconfig, which plugin, never a token) would wrap kube's own kubeconfig and exec handling
//! anyway. Decision: keep the hand-written client; switch to kube-client if koord-bundle ever
//! writes to the cluster itself (today helm does) or needs watches.
//!
//! Testing: no Kubernetes API server can be run where this crate is developed (no kind, k3s or
//! envtest). The code that talks to a cluster is tested against a FAKE API server
//! (`tests/kube-fake/`: stateful, HTTPS with a token, strict where the real one is, no
//! controllers) seeded with real-format objects (`tests/fixtures/kube/`, shaped on kind, EKS,
//! ACK and an old cluster, not captured from live ones), and real helm 3 and 4 install into it.

pub mod client;
pub mod exec;
pub mod kubeconfig;
pub mod preflight;
mod release;
mod secret;

pub use client::KubeClient;
pub use kubeconfig::{ClientIdentity, Credentials, Kubeconfig};
pub use preflight::{
    preflight, ChartCrd, Finding, Level, NodeInfo, PreflightInput, PreflightReport, ReleaseInfo,
};
pub use secret::{Secret, SecretBytes};

use std::path::PathBuf;

/// What can go wrong loading a kubeconfig or talking to the cluster. Every message names its
/// subject (file, context, user, server URL, API path). None carries a credential.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// No kubeconfig file was found.
    #[error("no kubeconfig found (looked at {tried}): pass --kubeconfig FILE or set KUBECONFIG, or run with --no-install")]
    NoKubeconfig {
        /// Where it looked, in order.
        tried: String,
    },
    /// The kubeconfig file could not be read.
    #[error("cannot read kubeconfig {path}: {source}")]
    ReadKubeconfig {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The kubeconfig is not valid YAML of the expected shape, or is inconsistent.
    #[error("kubeconfig {path}: {message}")]
    InvalidKubeconfig {
        /// The file.
        path: PathBuf,
        /// What is wrong (never a credential value).
        message: String,
    },
    /// The requested (or current) context is not in the kubeconfig.
    #[error("kubeconfig {path}: context {context:?} not found (contexts: {available})")]
    ContextNotFound {
        /// The file.
        path: PathBuf,
        /// The context asked for.
        context: String,
        /// The contexts the file has.
        available: String,
    },
    /// A file named by the kubeconfig (CA, client certificate or key, token file) is unreadable.
    #[error("kubeconfig {path}: {what} {file}: {source}")]
    CredentialFile {
        /// The kubeconfig.
        path: PathBuf,
        /// Which entry, e.g. `user "admin" client-key`.
        what: String,
        /// The file it names (resolved against the kubeconfig's directory).
        file: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The user's exec credential plugin is misconfigured, missing, failed, or printed no
    /// usable credential.
    #[error("kubeconfig {path}: user {user:?}: exec credential plugin ({command}): {message}")]
    ExecPlugin {
        /// The kubeconfig.
        path: PathBuf,
        /// The user entry's name.
        user: String,
        /// The plugin command line, e.g. `aws eks get-token --cluster-name prod` (values of
        /// credential-like flags redacted).
        command: String,
        /// What went wrong (never the plugin's output).
        message: String,
    },
    /// The server answered 401/403 to a request sent without the kubeconfig's credentials,
    /// which are withheld from plain-HTTP servers.
    #[error("{status} from {server} for GET {resource}: the credentials of kubeconfig user {user:?} were not sent, because {server} is plain http:// and credentials (tokens, passwords, exec-plugin tokens) go over TLS only, as kubectl and helm (client-go) do; use the cluster's https:// URL")]
    CredentialsWithheld {
        /// The API server URL.
        server: String,
        /// The kubeconfig user entry.
        user: String,
        /// The API path requested.
        resource: String,
        /// `401 Unauthorized` or `403 Forbidden`.
        status: String,
    },
    /// The user entry authenticates with an auth-provider (oidc, gcp, azure), not supported.
    #[error(
        "kubeconfig {path}: user {user:?} uses the {provider:?} auth-provider: auth-providers are not supported in this version; use a token kubeconfig (e.g. a service-account token) or run with --no-install"
    )]
    AuthProviderUnsupported {
        /// The kubeconfig.
        path: PathBuf,
        /// The user entry's name.
        user: String,
        /// The provider's name.
        provider: String,
    },
    /// The HTTP client could not be built from the kubeconfig (bad PEM, bad proxy URL...).
    #[error("cannot set up a client for {server} (context {context:?}): {message}")]
    ClientSetup {
        /// The API server URL.
        server: String,
        /// The kubeconfig context.
        context: String,
        /// What is wrong.
        message: String,
    },
    /// Nothing answered at the server URL (refused, DNS failure, timeout).
    #[error("no cluster reachable at {server} (context {context:?}): {message}")]
    Unreachable {
        /// The API server URL.
        server: String,
        /// The kubeconfig context.
        context: String,
        /// The cause.
        message: String,
    },
    /// The TLS handshake with the API server failed.
    #[error("TLS handshake with {server} failed (context {context:?}): {message}; check the cluster's certificate-authority(-data) in the kubeconfig")]
    Tls {
        /// The API server URL.
        server: String,
        /// The kubeconfig context.
        context: String,
        /// The cause.
        message: String,
    },
    /// 401: the API server rejected the credentials.
    #[error("401 Unauthorized from {server} for GET {resource}: the credentials of kubeconfig user {user:?} were rejected (expired or revoked token, wrong certificate?)")]
    Unauthorized {
        /// The API server URL.
        server: String,
        /// The kubeconfig user entry.
        user: String,
        /// The API path requested.
        resource: String,
    },
    /// 403: the credentials are valid but not allowed to read the resource.
    #[error(
        "403 Forbidden from {server} for GET {resource} as kubeconfig user {user:?}: {message}"
    )]
    Forbidden {
        /// The API server URL.
        server: String,
        /// The kubeconfig user entry.
        user: String,
        /// The API path requested.
        resource: String,
        /// The API server's explanation (its `Status.message`).
        message: String,
    },
    /// Any other non-success answer, or an answer that is not the expected JSON.
    #[error("GET {url}: {message}")]
    Api {
        /// The full URL.
        url: String,
        /// What went wrong.
        message: String,
        /// The server failed on its side (5xx, 429) or the connection broke mid-answer: another
        /// try later may work.
        transient: bool,
    },
}
