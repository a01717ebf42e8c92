//! The registry store: a small client of the distribution API (`/v2/`) over reqwest, for any
//! number of registries. Manifests are copied as raw bytes (digests come from the bytes, reads
//! stop at 4 MiB while reading), blobs stream into the cache with resume, uploads stream from
//! the bundle in place, and every call goes through one retry policy whose retries are reported
//! to the caller.
//!
//! Why our own client and not oci-client (0.18, used before): its token flow asks only for
//! `repository:<one repository>:pull[,push]`, so a cross-repository mount, whose challenge names
//! `repository:TARGET:pull,push repository:SOURCE:pull`, was refused on every token-auth
//! registry (Harbor, ACR, Quay, GitLab, Docker Hub) and the load could not be finished; it has no
//! identity-token (OAuth2 refresh-token) flow; it swallows the token service's errors, so a
//! missing login read as "refused credentials"; it does not hand `Retry-After` through; and it
//! reads a manifest body whole before any size check. The part of the API this tool needs (ping,
//! challenge, token, manifest get/put, blob HEAD/GET/upload/mount) is small, and owning it lets
//! every failure say which of "no credentials", "refused", "no right", "plain HTTP", "TLS" or
//! "unreachable" happened.
//!
//! Layout: `auth` (challenges, scopes, token cache: pure), `client` (one attempt of one request,
//! with its auth round trips, and failure classification), this module (the operations and the
//! retry loop), `probe` (is the registry Harbor? does its name resolve?) and `harbor` (Harbor's
//! projects and push rights, checked before a push).

mod auth;
pub(crate) mod body;
mod client;
pub(crate) use client::{classify_send_error, host_of, is_transient_status, status_failure};
mod harbor;
mod probe;
mod store;

pub use harbor::{CheckOptions, HarborError, Project, ProjectState, PushDenied};
pub use probe::{Flavor, ProbeError};
pub use store::RegistryStore;

/// The client's readers of what a registry or token service answers, pure, for the fuzz
/// targets (`fuzz/fuzz_targets/registry_auth.rs`): not an API.
#[doc(hidden)]
pub mod fuzzing {
    use super::auth::{self, Challenge, Scope, TokenAnswer};
    use std::time::{Duration, Instant};

    /// A challenge as the client reads it: `Some((realm, service, scopes))` for Bearer,
    /// `None` for Basic.
    pub type Read = Option<(String, Option<String>, Vec<String>)>;

    /// Every challenge of `values` (`WWW-Authenticate` headers), as the client reads them.
    pub fn challenges(values: &[&str]) -> Vec<Read> {
        auth::parse_challenges(values.iter().copied())
            .into_iter()
            .map(|c| match c {
                Challenge::Bearer {
                    realm,
                    service,
                    scopes,
                    ..
                } => Some((
                    realm,
                    service,
                    scopes.iter().map(|s| s.to_string()).collect(),
                )),
                Challenge::Basic => None,
            })
            .collect()
    }

    /// `type:name:actions` parsed and printed again, as the client does with a challenge's
    /// scopes (`None` when it does not parse).
    pub fn scope(s: &str) -> Option<String> {
        Scope::parse(s).map(|s| s.to_string())
    }

    /// Scope lists merged as for one token request, printed (the token cache's key).
    pub fn merged(lists: &[Vec<String>]) -> String {
        let parsed: Vec<Vec<Scope>> = lists
            .iter()
            .map(|l| l.iter().filter_map(|s| Scope::parse(s)).collect())
            .collect();
        auth::scopes_text(&auth::merge_scopes(parsed.iter().map(Vec::as_slice)))
    }

    /// A token service's answer as the client reads it: the token's length and how long it
    /// is kept (`None`: no token in it, or not the JSON of the spec).
    pub fn token_answer(body: &[u8]) -> Option<(usize, Duration)> {
        let a: TokenAnswer = serde_json::from_slice(body).ok()?;
        let now = Instant::now();
        a.into_cached(now).map(|c| {
            (
                c.token.expose().len(),
                c.until.saturating_duration_since(now),
            )
        })
    }

    /// `Retry-After` as the client reads it, at a fixed now.
    pub fn retry_after(v: &str) -> Option<Duration> {
        auth::parse_retry_after(
            v,
            std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        )
    }

    /// An error body as the client words it.
    pub fn error_text(status: u16, body: &[u8]) -> String {
        match reqwest::StatusCode::from_u16(status) {
            Ok(s) => super::client::error_text(s, body),
            Err(_) => String::new(),
        }
    }
}

use super::auth::{AuthError, Credentials};
use super::retry::{Failure, RetryPolicy};
use auth::Scope;
use body::{read_capped, BodyError};
use client::{status_error, Req, Transport};
use koord_base::oci::{media, Digest, ImageRef};
use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Largest manifest accepted (distribution's own limit is 4 MiB).
pub const MAX_MANIFEST: usize = 4 * 1024 * 1024;
/// Redirects followed for one blob GET.
const MAX_REDIRECTS: usize = 5;

/// One retry, for the progress line: what failed, attempt `attempt` of `of`, the next in
/// `next_in`.
#[derive(Debug, Clone)]
pub struct RetryEvent {
    /// The registry (or token service) host.
    pub registry: String,
    /// What was being done.
    pub what: String,
    /// Why it failed (one line).
    pub error: String,
    /// The attempt that failed (1-based).
    pub attempt: u32,
    /// Attempts allowed in all.
    pub of: u32,
    /// Wait before the next attempt.
    pub next_in: Duration,
}

/// Where retries are reported (the command layer prints them).
#[derive(Clone)]
pub struct RetryReporter(pub Arc<dyn Fn(&RetryEvent) + Send + Sync>);

impl std::fmt::Debug for RetryReporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RetryReporter")
    }
}

/// How to reach registries.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// Hosts spoken to over plain HTTP.
    pub plain_http_hosts: Vec<String>,
    /// Extra CA certificates (PEM) to trust besides the system roots.
    pub ca_files: Vec<PathBuf>,
    /// Skip TLS verification (only with its flag, and a warning).
    pub insecure_skip_tls_verify: bool,
    /// Logins by host.
    pub credentials: Credentials,
    /// Retry policy.
    pub retry: RetryPolicy,
    /// Told about every retry.
    pub on_retry: Option<RetryReporter>,
}

/// A failure talking to a registry. Messages name the registry, the reference or digest, and
/// what to do.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The manifest or blob is not there.
    #[error("{what} not found on {registry}")]
    NotFound {
        /// Reference or digest.
        what: String,
        /// Registry host.
        registry: String,
    },
    /// The registry wants a login and none was found for it.
    #[error("{registry} needs a login for {what}, and no credentials for {registry} were found (looked at: {searched}): log in with `docker login {registry}` (or give `load` --username U --password-stdin)")]
    NoCredentials {
        /// Registry host.
        registry: String,
        /// What was asked for.
        what: String,
        /// Where credentials were looked for.
        searched: String,
    },
    /// The registry (or its token service) refused the credentials that were sent.
    #[error("{registry} refused the credentials of {who} (from {origin}) for {what} ({detail}): check the user name and password or token, e.g. with `docker login {registry}`")]
    Refused {
        /// Registry host.
        registry: String,
        /// `user "name"` or `the identity token` (never the secret).
        who: String,
        /// Where the credentials came from.
        origin: String,
        /// What was asked for.
        what: String,
        /// Who said no.
        detail: String,
    },
    /// Logged in, but the user may not do this.
    #[error("{registry} accepted the credentials of {who} but denies {action} for {what} (asked for {scope}): ask the registry's admin for {action} rights there, or use another account")]
    Denied {
        /// Registry host.
        registry: String,
        /// `user "name"` or `the identity token`.
        who: String,
        /// What was asked for.
        what: String,
        /// `pull` or `push`.
        action: &'static str,
        /// The scopes asked for.
        scope: String,
    },
    /// Transport failure (connection, reset, 5xx, 429) after all retries, or at once for a
    /// plainly wrong address.
    #[error("cannot reach {registry} for {what}: {message} ({})", attempts_text(*attempts))]
    Transport {
        /// Registry host.
        registry: String,
        /// What was asked for.
        what: String,
        /// The error chain, and what to do.
        message: String,
        /// The registry asked us to slow down (429).
        throttled: bool,
        /// Its `Retry-After`, if any.
        retry_after: Option<Duration>,
        /// Worth another try (false: connection refused on loopback, no such host).
        retryable: bool,
        /// Attempts made.
        attempts: u32,
    },
    /// An answer that is not HTTP, or not what it claims to be (a head too large to read, a
    /// status line or header that does not parse): permanent, not retried. A registry, or a
    /// proxy in front of it, that answers this way will answer the same way again.
    #[error("{registry} sent a malformed answer to {what}: {message}: refused, not retried (ask its operators to check it and any proxy in front of it)")]
    Malformed {
        /// Registry host.
        registry: String,
        /// What was asked for.
        what: String,
        /// What is wrong with the answer.
        message: String,
    },
    /// Any other status.
    #[error("{registry} answered {what}: {message}")]
    Status {
        /// Registry host.
        registry: String,
        /// What was asked for.
        what: String,
        /// The answer.
        message: String,
    },
    /// The registry served bytes that do not match the digest asked for.
    #[error("{registry} served {what} with digest {actual}, expected {expected}: refused")]
    DigestMismatch {
        /// Registry host.
        registry: String,
        /// Reference.
        what: String,
        /// Expected digest.
        expected: String,
        /// Actual digest.
        actual: Digest,
    },
    /// TLS handshake failure (unknown CA, wrong host name): not retried.
    #[error("TLS with {registry} failed for {what}: {message} (pass the registry's CA with --ca-file, or --plain-http if {registry} speaks plain HTTP)")]
    Tls {
        /// Registry host.
        registry: String,
        /// What was asked for.
        what: String,
        /// The error chain.
        message: String,
    },
    /// A TLS connection got a plain-HTTP answer.
    #[error("{registry} speaks plain HTTP, not HTTPS ({what}): pass --plain-http to talk to it (only on a network you trust)")]
    PlainHttp {
        /// Registry host.
        registry: String,
        /// What was asked for.
        what: String,
    },
    /// An auth file or credential helper failed.
    #[error(transparent)]
    Credentials(#[from] AuthError),
    /// Client set-up failed (bad CA file).
    #[error("registry client setup: {0}")]
    Setup(String),
}

impl koord_base::exit::Classify for RegistryError {
    fn exit_class(&self) -> Option<koord_base::exit::ExitClass> {
        use koord_base::exit::ExitClass as C;
        match self {
            // Unreachable, reset, 5xx, 429 after the retries.
            RegistryError::Transport { .. } => Some(C::Machine),
            RegistryError::Credentials(a) => a.exit_class(),
            // Not there, no login, refused, denied, TLS, plain HTTP, an answer that is wrong,
            // a client that cannot be set up with what was given (a CA file).
            _ => Some(C::Input),
        }
    }
}

fn attempts_text(n: u32) -> String {
    match n {
        0 | 1 => "gave up after 1 attempt".to_string(),
        n => format!("after {n} attempts"),
    }
}

impl RegistryError {
    pub(crate) fn transport(
        registry: &str,
        what: &str,
        message: String,
        hint: String,
        retryable: bool,
    ) -> Self {
        RegistryError::Transport {
            registry: registry.to_string(),
            what: what.to_string(),
            message: format!("{message}{hint}"),
            throttled: false,
            retry_after: None,
            retryable,
            attempts: 1,
        }
    }
    /// A transport failure: unreachable, reset, 5xx or 429 after the retries (exit code 3, an
    /// internal or transient failure).
    pub fn is_transient(&self) -> bool {
        matches!(self, RegistryError::Transport { .. })
    }
    /// What this failure says to the retry policy: worth another try, the registry's
    /// `Retry-After`, a 429.
    pub fn failure(&self) -> Failure {
        match self {
            RegistryError::Transport {
                retryable,
                retry_after,
                throttled,
                ..
            } => Failure {
                retryable: *retryable,
                retry_after: *retry_after,
                throttled: *throttled,
            },
            _ => Failure::FINAL,
        }
    }
    /// Is this "the thing is not there" (so another source may have it)?
    pub fn is_not_found(&self) -> bool {
        matches!(self, RegistryError::NotFound { .. })
    }
    /// Is this an auth outcome (no login, refused, denied)?
    pub fn is_auth(&self) -> bool {
        matches!(
            self,
            RegistryError::NoCredentials { .. }
                | RegistryError::Refused { .. }
                | RegistryError::Denied { .. }
        )
    }
    fn set_attempts(&mut self, n: u32) {
        if let RegistryError::Transport { attempts, .. } = self {
            *attempts = n;
        }
    }
    fn registry(&self) -> &str {
        match self {
            RegistryError::NotFound { registry, .. }
            | RegistryError::NoCredentials { registry, .. }
            | RegistryError::Refused { registry, .. }
            | RegistryError::Denied { registry, .. }
            | RegistryError::Transport { registry, .. }
            | RegistryError::Status { registry, .. }
            | RegistryError::Malformed { registry, .. }
            | RegistryError::DigestMismatch { registry, .. }
            | RegistryError::Tls { registry, .. }
            | RegistryError::PlainHttp { registry, .. } => registry,
            RegistryError::Credentials(_) | RegistryError::Setup(_) => "",
        }
    }
}

/// What a mount request came to. Anything but `Mounted` means "upload it instead".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mount {
    /// The registry linked the blob into the target repository (201).
    Mounted,
    /// The registry refused the mount (401/403: no right on the source, or mounts off).
    Refused(String),
    /// The registry opened an upload instead (202) or does not mount (404, 405...).
    NotHonoured(String),
}

/// A registry client for any number of registries.
pub struct Registry {
    transport: Transport,
    opts: RegistryOptions,
}

fn repo_path(r: &ImageRef) -> String {
    format!("/v2/{}", r.repository)
}

impl Registry {
    /// Build a client.
    pub fn new(opts: RegistryOptions) -> Result<Self, RegistryError> {
        let mut b = reqwest::Client::builder()
            .user_agent(concat!("koord-bundle/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(15))
            .read_timeout(Duration::from_secs(60))
            // Redirects are followed by hand: a blob's CDN must not get the registry's
            // `Authorization`, and a resumed download goes to where it was sent.
            .redirect(reqwest::redirect::Policy::none());
        let extra = super::read_ca_files(&opts.ca_files).map_err(RegistryError::Setup)?;
        if !extra.is_empty() {
            b = b.tls_certs_merge(extra);
        }
        if opts.insecure_skip_tls_verify {
            b = b.tls_danger_accept_invalid_certs(true);
        }
        let http = b
            .build()
            .map_err(|e| RegistryError::Setup(super::error_chain(&e)))?;
        Ok(Registry {
            transport: Transport::new(
                http,
                opts.plain_http_hosts.clone(),
                opts.credentials.clone(),
            ),
            opts,
        })
    }

    fn report(&self, e: &RegistryError, what: &str, attempt: u32, wait: Duration) {
        if let Some(r) = &self.opts.on_retry {
            (r.0)(&RetryEvent {
                registry: e.registry().to_string(),
                what: what.to_string(),
                // The cause alone: the line already says what and where.
                error: match e {
                    RegistryError::Transport { message, .. } => message.clone(),
                    other => other.to_string(),
                },
                attempt,
                of: self.opts.retry.tries,
                next_in: wait,
            });
        }
    }

    /// Run `f` until it succeeds, fails for good, or the tries are spent; report each retry.
    async fn with_retry<T, F, Fut>(&self, what: &str, f: F) -> Result<T, RegistryError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, RegistryError>>,
    {
        let report = |e: &RegistryError, made, wait| self.report(e, what, made, wait);
        super::retry::run(&self.opts.retry, what, f, RegistryError::failure, report)
            .await
            .map_err(|(mut e, made)| {
                e.set_attempts(made);
                e
            })
    }

    /// Fetch a manifest's raw bytes by tag or digest (at most [`MAX_MANIFEST`], checked while
    /// reading). The digest is computed from the bytes and, when the reference names one,
    /// checked against it.
    pub async fn get_manifest(
        &self,
        r: &ImageRef,
    ) -> Result<(bytes::Bytes, Digest), RegistryError> {
        let (bytes, digest, _) = self.get_manifest_typed(r).await?;
        Ok((bytes, digest))
    }

    /// [`Registry::get_manifest`], with the `Content-Type` the registry served it as.
    pub async fn get_manifest_typed(
        &self,
        r: &ImageRef,
    ) -> Result<(bytes::Bytes, Digest, Option<String>), RegistryError> {
        let what = r.to_string();
        let accept = HeaderValue::from_static(
            "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json",
        );
        debug_assert!(media::ALL_MANIFESTS
            .iter()
            .all(|m| accept.to_str().is_ok_and(|a| a.contains(m))));
        let req = Req {
            method: Method::GET,
            host: &r.registry,
            url: format!("{}/manifests/{}", repo_path(r), r.reference()),
            scopes: vec![Scope::repository(&r.repository, &["pull"])],
            headers: vec![(reqwest::header::ACCEPT, accept)],
            body: None,
            what: &what,
        };
        let bytes = self
            .with_retry(&what, || async {
                let resp = self.transport.send(&req).await?;
                if resp.status() != StatusCode::OK {
                    return Err(status_error(&r.registry, &what, resp).await);
                }
                let content_type = resp
                    .headers()
                    .get(reqwest::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .map(|v| v.split(';').next().unwrap_or(v).trim().to_string())
                    .filter(|v| !v.is_empty());
                let bytes = read_capped(resp, MAX_MANIFEST).await.map_err(|e| match e {
                    BodyError::TooLarge(cap) => RegistryError::Status {
                        registry: r.registry.clone(),
                        what: what.clone(),
                        message: format!("the manifest is larger than {cap} bytes: refused"),
                    },
                    other => other.into_error(&r.registry, &what),
                })?;
                Ok((bytes, content_type))
            })
            .await?;
        let (bytes, content_type) = bytes;
        let digest = Digest::of(&bytes);
        if let Some(expected) = &r.digest {
            if expected != digest.as_str() {
                return Err(RegistryError::DigestMismatch {
                    registry: r.registry.clone(),
                    what,
                    expected: expected.clone(),
                    actual: digest,
                });
            }
        }
        Ok((bytes, digest, content_type))
    }

    /// The OCI 1.1 referrers list of `subject` in `r`'s repository (`GET
    /// /v2/<name>/referrers/<digest>`, distribution spec 1.1): the body of a 200 (at most
    /// [`MAX_MANIFEST`], not parsed here), or `None` when the registry answers 404 (it serves no
    /// referrers API: distribution 2.8 has none). Any other answer is an error.
    pub async fn referrers(
        &self,
        r: &ImageRef,
        subject: &Digest,
    ) -> Result<Option<bytes::Bytes>, RegistryError> {
        let what = format!("the referrers of {}/{}@{subject}", r.registry, r.repository);
        let req = Req {
            method: Method::GET,
            host: &r.registry,
            url: format!("{}/referrers/{subject}", repo_path(r)),
            scopes: vec![Scope::repository(&r.repository, &["pull"])],
            headers: vec![(
                reqwest::header::ACCEPT,
                HeaderValue::from_static(media::OCI_INDEX),
            )],
            body: None,
            what: &what,
        };
        let got = self
            .with_retry(&what, || async {
                let resp = self.transport.send(&req).await?;
                if resp.status() != StatusCode::OK {
                    return Err(status_error(&r.registry, &what, resp).await);
                }
                read_capped(resp, MAX_MANIFEST).await.map_err(|e| match e {
                    BodyError::TooLarge(cap) => RegistryError::Status {
                        registry: r.registry.clone(),
                        what: what.clone(),
                        message: format!("the referrers list is larger than {cap} bytes: refused"),
                    },
                    other => other.into_error(&r.registry, &what),
                })
            })
            .await;
        match got {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// GET a blob, following redirects by hand, and remembering where it was sent, so a resumed
    /// attempt asks there directly. The transport sends credentials only to the registry's own
    /// origin: a redirect to another (S3, R2 and OSS answer 400 to a request that carries the
    /// registry's `Authorization`) goes without.
    async fn blob_get(
        &self,
        r: &ImageRef,
        digest: &Digest,
        what: &str,
        headers: &HeaderMap,
        redirected: &mut Option<Url>,
    ) -> Result<reqwest::Response, RegistryError> {
        let first = match redirected.as_ref() {
            Some(u) => u.to_string(),
            None => format!("{}/blobs/{digest}", repo_path(r)),
        };
        let mut resp = self.pull_get(r, first, what, headers).await?;
        for _ in 0..MAX_REDIRECTS {
            if !resp.status().is_redirection() {
                return Ok(resp);
            }
            let Some(loc) = resp
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|l| resp.url().join(l).ok())
            else {
                return Err(RegistryError::Status {
                    registry: r.registry.clone(),
                    what: what.to_string(),
                    message: format!("HTTP {} without a Location", resp.status()),
                });
            };
            *redirected = Some(loc.clone());
            resp = self.pull_get(r, loc.to_string(), what, headers).await?;
        }
        Err(RegistryError::Status {
            registry: r.registry.clone(),
            what: what.to_string(),
            message: format!("more than {MAX_REDIRECTS} redirects"),
        })
    }

    /// GET `url` (a path on the registry, or any URL) for `r`'s repository: with the registry's
    /// credentials and a `pull` token when it is on the registry's own origin, without when not.
    async fn pull_get(
        &self,
        r: &ImageRef,
        url: String,
        what: &str,
        headers: &HeaderMap,
    ) -> Result<reqwest::Response, RegistryError> {
        let req = Req {
            method: Method::GET,
            host: &r.registry,
            url,
            scopes: vec![Scope::repository(&r.repository, &["pull"])],
            headers: headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            body: None,
            what,
        };
        self.transport.send(&req).await
    }

    /// Does `repo` on this registry hold the blob? (HEAD; a redirect to storage counts as yes:
    /// the registry redirects only blobs it holds.)
    ///
    /// A 2xx whose `Content-Length` is not the blob's size is not the blob: a registry that answers 200 to every HEAD, with no body length or another one,
    /// does not make `load` skip the upload (issue 30).
    pub async fn blob_exists(
        &self,
        r: &ImageRef,
        desc: &koord_base::oci::Descriptor,
    ) -> Result<bool, RegistryError> {
        let digest = &desc.digest;
        let what = format!("blob {digest} in {}", r.repository);
        let req = Req {
            method: Method::HEAD,
            host: &r.registry,
            url: format!("{}/blobs/{digest}", repo_path(r)),
            scopes: vec![Scope::repository(&r.repository, &["pull"])],
            headers: vec![],
            body: None,
            what: &what,
        };
        self.with_retry(&what, || async {
            let resp = self.transport.send(&req).await?;
            let s = resp.status();
            let length = resp
                .headers()
                .get(reqwest::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if s.is_success() {
                Ok(length == Some(desc.size))
            } else if s.is_redirection() {
                Ok(true)
            } else if s == StatusCode::NOT_FOUND {
                Ok(false)
            } else {
                Err(status_error(&r.registry, &what, resp).await)
            }
        })
        .await
    }

    /// Ask the registry to mount a blob from another repository of the same registry, with a
    /// token for both repositories (the scopes its challenge names). A refusal or a mount not
    /// honoured is an answer, not an error: the caller uploads instead. Only a transport
    /// failure after the retries is an error.
    pub async fn mount_blob(
        &self,
        r: &ImageRef,
        from_repository: &str,
        digest: &Digest,
    ) -> Result<Mount, RegistryError> {
        let what = format!("mount of {digest} from {from_repository}");
        let req = Req {
            method: Method::POST,
            host: &r.registry,
            url: format!(
                "{}/blobs/uploads/?mount={digest}&from={from_repository}",
                repo_path(r)
            ),
            scopes: vec![
                Scope::repository(&r.repository, &["pull", "push"]),
                Scope::repository(from_repository, &["pull"]),
            ],
            headers: vec![(
                reqwest::header::CONTENT_LENGTH,
                HeaderValue::from_static("0"),
            )],
            body: None,
            what: &what,
        };
        let out = self
            .with_retry(&what, || async {
                match self.transport.send(&req).await {
                    Ok(resp) => {
                        let s = resp.status();
                        if s == StatusCode::CREATED {
                            Ok(Mount::Mounted)
                        } else if s == StatusCode::ACCEPTED {
                            Ok(Mount::NotHonoured(
                                "202: an upload was opened instead".into(),
                            ))
                        } else if client::is_transient_status(s) {
                            Err(status_error(&r.registry, &what, resp).await)
                        } else {
                            Ok(Mount::NotHonoured(format!("HTTP {s}")))
                        }
                    }
                    Err(e) if e.is_auth() => Ok(Mount::Refused(e.to_string())),
                    Err(e) => Err(e),
                }
            })
            .await?;
        Ok(out)
    }

    /// Put a manifest as raw bytes under `r`'s tag or digest, then read it back by its digest:
    /// the registry's `Docker-Content-Digest` answer is never taken as proof that it stored the
    /// bytes (a differing one is refused at once).
    pub async fn put_manifest(
        &self,
        r: &ImageRef,
        bytes: &bytes::Bytes,
        media_type: &str,
    ) -> Result<Digest, RegistryError> {
        let what = format!("manifest {r}");
        let ct = HeaderValue::from_str(media_type).map_err(|_| RegistryError::Status {
            registry: r.registry.clone(),
            what: what.clone(),
            message: format!("bad media type {media_type:?}"),
        })?;
        let body_bytes = bytes.clone();
        let make_body = move || reqwest::Body::from(body_bytes.clone());
        let req = Req {
            method: Method::PUT,
            host: &r.registry,
            url: format!("{}/manifests/{}", repo_path(r), r.reference()),
            scopes: vec![Scope::repository(&r.repository, &["pull", "push"])],
            headers: vec![(reqwest::header::CONTENT_TYPE, ct)],
            body: Some(&make_body),
            what: &what,
        };
        // What the registry says it stored (its answer's digest), if it says.
        let said = self
            .with_retry(&what, || async {
                let resp = self.transport.send(&req).await?;
                if !resp.status().is_success() {
                    return Err(status_error(&r.registry, &what, resp).await);
                }
                Ok(resp
                    .headers()
                    .get("docker-content-digest")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<Digest>().ok()))
            })
            .await?;
        let expected = Digest::of(bytes);
        if let Some(d) = said.filter(|d| d != &expected) {
            return Err(RegistryError::DigestMismatch {
                registry: r.registry.clone(),
                what,
                expected: expected.to_string(),
                actual: d,
            });
        }
        // Read back by digest: a registry that answers 201 (with the right header, even) and
        // stores nothing is found here, not by the cluster pulling later (issue 30). The GET
        // checks the bytes it gets against the digest asked for.
        let back = ImageRef {
            tag: None,
            digest: Some(expected.to_string()),
            ..r.clone()
        };
        match self.get_manifest(&back).await {
            Ok(_) => Ok(expected),
            Err(e) if e.is_not_found() => Err(RegistryError::Status {
                registry: r.registry.clone(),
                what,
                message: format!(
                    "the registry accepted the manifest (digest {expected}) but does not serve it back: it did not store it"
                ),
            }),
            Err(e) => Err(e),
        }
    }
}

/// The upload session URL of a 202 (relative or absolute).
fn upload_location(
    resp: &reqwest::Response,
    registry: &str,
    what: &str,
) -> Result<Url, RegistryError> {
    resp.headers()
        .get(reqwest::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|l| resp.url().join(l).ok())
        .ok_or_else(|| RegistryError::Status {
            registry: registry.to_string(),
            what: what.to_string(),
            message: "202 without a Location for the upload".into(),
        })
}

impl crate::store::StoreFailure for RegistryError {
    fn is_not_found(&self) -> bool {
        RegistryError::is_not_found(self)
    }
    fn is_transient(&self) -> bool {
        RegistryError::is_transient(self)
    }
    fn as_error(&self) -> &(dyn std::error::Error + 'static) {
        self
    }
}

impl From<RegistryError> for crate::store::StoreError {
    fn from(e: RegistryError) -> Self {
        crate::store::StoreError::Failed(crate::store::Failure::new(e))
    }
}
