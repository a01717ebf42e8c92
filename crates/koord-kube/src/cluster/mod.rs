//! Read-only access to the target Kubernetes cluster, for the checks made before installing:
//! kubeconfig as kubectl reads it ([`kubeconfig`]: `KUBECONFIG` lists merged, `--context`),
//! the user's credentials ([`auth`]: tokens, client certificates, exec plugins ([`exec`]), the
//! oidc auth-provider, impersonation), the API client ([`client`], bounded lists in [`list`]),
//! the pre-flight ([`mod@preflight`]): reading the cluster in one place, pure rules over
//! the typed objects read, one file per check) and the checks of an upgrade ([`upgrade`]:
//! what the new release changes, what its CRDs do to the objects in the cluster, and a
//! server-side dry run of every object).
//!
//! Nothing here writes to the cluster (helm does, with the same kubeconfig files and context,
//! running exec plugins itself): the one request that is not a GET is an apply with
//! `dryRun=All`, which the API server never persists. Nothing here reads the environment
//! either: the caller passes `--kubeconfig`, `$KUBECONFIG` and the home directory in (see
//! [`kubeconfig::locate`]).
//!
//! # kube and k8s-openapi, and what is still ours
//!
//! The client is kube-client 5 ([`kube::Client`], rustls on aws-lc-rs like the rest of the
//! tree): TLS against the kubeconfig's CA or the system roots, `tls-server-name`, client
//! certificates, `proxy-url` (http, https, socks5), the impersonation headers. Kubeconfig files
//! are kube's types ([`kube::config::Kubeconfig`]), merged by its `merge` (kubectl's rules);
//! objects are k8s-openapi's (`Node`, `Namespace`, `CustomResourceDefinition`, `Secret`,
//! `DaemonSet`, version `Info`). Kept in this module, each for a measured or documented reason:
//!
//! - **credentials** ([`auth`], [`exec`]): kube runs exec plugins and the gcp auth-provider's
//!   command with `Command::output()` (whole output in memory, no time limit, children left
//!   behind, the output and arguments in its error's `Debug`), and it would send credentials to
//!   a plain `http://` server, which client-go never does. So credentials are resolved here,
//!   plugins run through [`koord_base::child`], and the `Authorization` header is set per request,
//!   over TLS only;
//! - **reading answers** ([`client`], [`list`]): kube's typed calls (`Api::get`, `Api::list`)
//!   read a whole body before any size check, and paging is left to the caller; here every
//!   body goes through [`kube::Client::send`] and is capped while it is read, and every list is
//!   bounded in pages, bytes, time and repeated `continue` tokens;
//! - **errors**: they name the kubeconfig file(s), context, user, server and resource, never a
//!   credential ([`ClusterError`]).
//!
//! What kube costs, measured with two clean `cargo build --release --locked` (`lto = "thin"`,
//! `codegen-units = 4`) of the koord-bundle crate (which held this module then) before and
//! after, each from a fresh target directory on this 2-core machine while other engineers'
//! builds ran (load average 9–12 in both), 2026-12-01:
//!
//! | | wall clock | CPU (user + sys) | binary | crates (`cargo tree --prefix none --no-dedupe \| sort -u`) |
//! |---|---|---|---|---|
//! | hand-written client (reqwest) | 13 min 46 s | 316 s | 17 944 752 bytes | 181 |
//! | kube 5 + k8s-openapi 0.29 | 14 min 04 s | 446 s | 22 694 440 bytes | 227 |
//!
//! Of the +4.7 MB (symbol sizes from `nm -S`): kube's own YAML parser (serde-saphyr, granit-parser,
//! annotate-snippets: ~0.7 MB, linked through kube's error types although kubeconfigs are parsed
//! by [`koord_base::yaml`] here), k8s-openapi 0.32 MB, kube-client 0.27 MB, kube's auth layer's
//! jsonpath and pest 0.25 MB (never run here: no exec or auth-provider entry reaches kube),
//! hyper-util/tower/tower-http 0.3 MB, and more monomorphised serde_json and core code.
//!
//! Testing: against the REAL control plane of the test environment (`scripts/control-plane.sh`:
//! kube-apiserver v1.36.3 with RBAC, admission and an audit log, etcd 3.6.8,
//! kube-controller-manager; `tests/it/cluster.rs`), into which real helm 3 and 4 install, with
//! nodes shaped on kind, EKS, ACK and kubeadm (`tests/fixtures/kube/`). The fake API server of
//! `tests/kube-fake/` stays only for the answers a real one cannot be made to give here:
//! endless or oversized list pages, an old server version, a plain-HTTP server, and a kind
//! node's kubelet `/configz` through the node proxy (which refuses loopback node addresses).

pub mod auth;
pub mod client;
pub mod exec;
pub mod kubeconfig;
pub mod list;
pub mod preflight;
pub mod running;
#[cfg(test)]
pub(crate) mod test_server;
pub mod upgrade;

pub use auth::{ClientIdentity, Credentials, Impersonation};
pub use client::KubeClient;
pub use kubeconfig::{Files, Kubeconfig, Merged, Origin};
pub use preflight::{
    preflight, ChartCrd, DeployedRevision, Finding, Level, NodeInfo, PreflightInput,
    PreflightReport, ReleaseInfo, SKIPPABLE_CHECKS,
};

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
    #[error("kubeconfig {kubeconfig}: {message}")]
    InvalidKubeconfig {
        /// The file(s), `a.yaml:b.yaml`.
        kubeconfig: String,
        /// What is wrong (never a credential value).
        message: String,
    },
    /// The requested (or current) context is not in the kubeconfig.
    #[error("kubeconfig {kubeconfig}: context {context:?} not found (contexts: {available})")]
    ContextNotFound {
        /// The file(s), `a.yaml:b.yaml`.
        kubeconfig: String,
        /// The context asked for.
        context: String,
        /// The contexts the file has.
        available: String,
    },
    /// A file named by the kubeconfig (CA, client certificate or key, token file) is unreadable.
    #[error("kubeconfig {kubeconfig}: {what} {file}: {source}")]
    CredentialFile {
        /// The kubeconfig file(s).
        kubeconfig: String,
        /// Which entry, e.g. `user "admin" client-key`.
        what: String,
        /// The file it names (resolved against the kubeconfig's directory).
        file: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The user's exec credential plugin is misconfigured, missing, failed, or printed no
    /// usable credential.
    #[error(
        "kubeconfig {kubeconfig}: user {user:?}: exec credential plugin ({command}): {message}"
    )]
    ExecPlugin {
        /// The kubeconfig file(s).
        kubeconfig: String,
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
    /// The user entry authenticates with an auth-provider that cannot be used (gcp, azure, an
    /// oidc entry without a usable id-token).
    #[error("kubeconfig {kubeconfig}: user {user:?} uses the {provider:?} auth-provider: {hint}")]
    AuthProviderUnsupported {
        /// The kubeconfig file(s).
        kubeconfig: String,
        /// The user entry's name.
        user: String,
        /// The provider's name.
        provider: String,
        /// Why it cannot be used, and what to do.
        hint: String,
    },
    /// The client could not be built from the kubeconfig (bad PEM, bad proxy URL...).
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

impl koord_base::exit::Classify for ClusterError {
    fn exit_class(&self) -> Option<koord_base::exit::ExitClass> {
        use koord_base::exit::ExitClass as C;
        match self {
            // No API server answering, or one failing on its side, after the retries.
            ClusterError::Unreachable { .. }
            | ClusterError::Api {
                transient: true, ..
            } => Some(C::Machine),
            // Reading a file the kubeconfig names: the kind of I/O error decides.
            ClusterError::ReadKubeconfig { .. } | ClusterError::CredentialFile { .. } => None,
            // The kubeconfig, its credentials, TLS, refusals, answers that are wrong.
            _ => Some(C::Input),
        }
    }
}
