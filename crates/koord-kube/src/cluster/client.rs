//! A read-only Kubernetes API client over [`kube::Client`]: GET a path, get a typed object back
//! (or `None` on 404), every answer capped while it is read. The one other request is a
//! server-side apply as a dry run (`KubeClient::apply_dry_run`: `dryRun=All`, refused without
//! it), which the API server validates and admits but never persists.
//!
//! kube does the transport: TLS against the kubeconfig's CA (only it: the system roots are not
//! used when a CA is given) or the system roots, or none with `insecure-skip-tls-verify`;
//! `tls-server-name` (SNI and the name checked); the TLS client certificate; `proxy-url`; the
//! `Impersonate-*` headers. Authentication headers are set here, per request: a bearer token
//! (`token`, `tokenFile`, the oidc `id-token`), basic, or an exec plugin's token ([`super::exec`],
//! cached until it expires and fetched again once after a 401). As client-go (kubectl, helm)
//! does, credentials are sent over TLS only: to a plain `http://` server requests go without
//! them, and a 401/403 then says why ([`ClusterError::CredentialsWithheld`]). Timeouts: 5 s to
//! connect, 20 s per request (answer read whole included). No retries: a pre-flight that cannot
//! reach the cluster says so at once.

use super::auth::Credentials;
use super::exec::{ExecToken, EXEC_TIMEOUT};
use super::kubeconfig::Kubeconfig;
use super::ClusterError;
use base64::Engine as _;
use http_body_util::BodyExt as _;
use std::time::{Duration, SystemTime};

/// Largest answer of a single GET accepted (a CRD with its schemas is a few hundred KiB).
pub const MAX_BODY: usize = 64 * 1024 * 1024;

/// Connect timeout.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Whole-request timeout.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// The time limits of a client.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// To connect.
    pub connect: Duration,
    /// One request, its answer read whole.
    pub request: Duration,
    /// One run of an exec credential plugin.
    pub exec: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: CONNECT_TIMEOUT,
            request: REQUEST_TIMEOUT,
            exec: EXEC_TIMEOUT,
        }
    }
}

/// A GET-only client for one kubeconfig context.
pub struct KubeClient {
    client: kube::Client,
    server: String,
    context: String,
    user: String,
    credentials: Credentials,
    plain_http: bool,
    timeouts: Timeouts,
    exec_cache: tokio::sync::Mutex<Option<ExecToken>>,
}

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClient")
            .field("server", &self.server)
            .field("context", &self.context)
            .field("user", &self.user)
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

/// An answer read whole (capped).
pub(crate) struct Answer {
    pub status: http::StatusCode,
    pub body: Vec<u8>,
}

impl KubeClient {
    /// A client for the resolved kubeconfig, with the default timeouts. Needs a tokio runtime.
    pub fn new(cfg: &Kubeconfig) -> Result<Self, ClusterError> {
        Self::with_timeouts(cfg, Timeouts::default())
    }

    /// A client with other timeouts (tests).
    pub fn with_timeouts(cfg: &Kubeconfig, timeouts: Timeouts) -> Result<Self, ClusterError> {
        let config = kube_config(cfg, &timeouts)?;
        let client = kube::Client::try_from(config).map_err(|e| ClusterError::ClientSetup {
            server: cfg.server.clone(),
            context: cfg.context.clone(),
            message: setup_message(&e, &cfg.user),
        })?;
        Ok(KubeClient {
            client,
            server: cfg.server.clone(),
            context: cfg.context.clone(),
            user: if cfg.user.is_empty() {
                "(anonymous)".into()
            } else {
                cfg.user.clone()
            },
            credentials: cfg.credentials.clone(),
            plain_http: cfg
                .server
                .get(..7)
                .is_some_and(|p| p.eq_ignore_ascii_case("http://")),
            timeouts,
            exec_cache: tokio::sync::Mutex::new(None),
        })
    }

    /// The API server URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The kubeconfig context in use.
    pub fn context(&self) -> &str {
        &self.context
    }

    /// The kubeconfig user entry in use (`(anonymous)` for none).
    pub fn user(&self) -> &str {
        &self.user
    }

    /// `server` + `path`, for messages.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.trim_end_matches('/'))
    }

    /// Why the kubeconfig's credentials are not sent, when they are not: the server URL is
    /// plain `http://` (client-go never sends credentials without TLS either).
    pub fn credentials_withheld(&self) -> Option<String> {
        if self.credentials == Credentials::None || !self.plain_http {
            return None;
        }
        Some(format!(
            "the credentials of kubeconfig user {:?} are not sent to {}: it is plain http://, and credentials go over TLS only (as with kubectl and helm)",
            self.user, self.server
        ))
    }

    /// The exec plugin's token: cached while fresh, else (or when `refresh`) run the plugin.
    async fn exec_token(
        &self,
        exec: &super::exec::ExecConfig,
        refresh: bool,
    ) -> Result<koord_base::secret::Secret, ClusterError> {
        let mut cache = self.exec_cache.lock().await;
        if !refresh {
            if let Some(t) = cache.as_ref().filter(|t| t.fresh(SystemTime::now())) {
                return Ok(t.token.clone());
            }
        }
        let t = exec.run(self.timeouts.exec).await?;
        let token = t.token.clone();
        *cache = Some(t);
        Ok(token)
    }

    /// The `Authorization` header value, if any.
    async fn authorization(&self, refresh: bool) -> Result<Option<String>, ClusterError> {
        if self.plain_http {
            return Ok(None);
        }
        Ok(match &self.credentials {
            Credentials::None => None,
            Credentials::Bearer(t) => Some(format!("Bearer {}", t.expose())),
            Credentials::Basic { username, password } => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD
                    .encode(format!("{username}:{}", password.expose()))
            )),
            Credentials::Exec(e) => Some(format!(
                "Bearer {}",
                self.exec_token(e, refresh).await?.expose()
            )),
        })
    }

    /// GET `path` (query included); the status and the body, read to at most `cap` bytes,
    /// all within the request timeout. A 401 to an exec plugin's token fetches a new one, once.
    pub(crate) async fn fetch(&self, path: &str, cap: usize) -> Result<Answer, ClusterError> {
        self.request(http::Method::GET, path, None, cap).await
    }

    /// A server-side apply of `object` (JSON) at `path` **as a dry run**: the path must carry
    /// `dryRun=All`, so the API server validates, defaults and admits the object (webhooks
    /// included) and persists nothing. The only request of this client that is not a GET.
    pub(crate) async fn apply_dry_run(
        &self,
        path: &str,
        object: &serde_json::Value,
    ) -> Result<Answer, ClusterError> {
        if !path.contains("dryRun=All") {
            return Err(ClusterError::Api {
                url: self.url(path),
                message: "refused: an apply that is not a dry run (no dryRun=All)".into(),
                transient: false,
            });
        }
        let body = serde_json::to_vec(object).map_err(|e| ClusterError::Api {
            url: self.url(path),
            message: format!("cannot encode the object: {e}"),
            transient: false,
        })?;
        self.request(
            http::Method::PATCH,
            path,
            Some(("application/apply-patch+yaml", body)),
            MAX_BODY,
        )
        .await
    }

    async fn request(
        &self,
        method: http::Method,
        path: &str,
        body: Option<(&'static str, Vec<u8>)>,
        cap: usize,
    ) -> Result<Answer, ClusterError> {
        let mut refreshed = false;
        loop {
            let auth = self.authorization(refreshed).await?;
            let once = self.fetch_once(method.clone(), path, body.clone(), auth.as_deref(), cap);
            let answer = tokio::time::timeout(self.timeouts.request, once)
                .await
                .map_err(|_| ClusterError::Unreachable {
                    server: self.server.clone(),
                    context: self.context.clone(),
                    message: format!(
                        "no complete answer to {method} {path} within {} s",
                        self.timeouts.request.as_secs()
                    ),
                })??;
            if answer.status == http::StatusCode::UNAUTHORIZED
                && !refreshed
                && auth.is_some()
                && matches!(self.credentials, Credentials::Exec(_))
            {
                refreshed = true;
                continue;
            }
            return Ok(answer);
        }
    }

    async fn fetch_once(
        &self,
        method: http::Method,
        path: &str,
        body: Option<(&'static str, Vec<u8>)>,
        auth: Option<&str>,
        cap: usize,
    ) -> Result<Answer, ClusterError> {
        let mut req = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::ACCEPT, "application/json")
            .header(
                http::header::USER_AGENT,
                concat!("koord-bundle/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(a) = auth {
            req = req.header(http::header::AUTHORIZATION, a);
        }
        let req = match body {
            Some((content_type, bytes)) => req
                .header(http::header::CONTENT_TYPE, content_type)
                .body(kube::client::Body::from(bytes)),
            None => req.body(kube::client::Body::empty()),
        };
        let req = req.map_err(|e| ClusterError::Api {
            url: self.url(path),
            message: format!("cannot build the request: {e}"),
            transient: false,
        })?;
        let resp = self
            .client
            .send(req)
            .await
            .map_err(|e| self.transport_error(&e))?;
        let status = resp.status();
        let mut body = resp.into_body();
        let mut buf: Vec<u8> = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| self.transport_error(&e))?;
            if let Ok(data) = frame.into_data() {
                if buf.len().saturating_add(data.len()) > cap {
                    return Err(ClusterError::Api {
                        url: self.url(path),
                        message: format!(
                            "the answer is larger than {cap} bytes: it was not read further"
                        ),
                        transient: false,
                    });
                }
                buf.extend_from_slice(&data);
            }
        }
        Ok(Answer { status, body: buf })
    }

    /// GET `path` and parse the JSON answer as `T`. `Ok(None)` on 404.
    pub async fn get<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<Option<T>, ClusterError> {
        let a = self.fetch(path, MAX_BODY).await?;
        if a.status == http::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        self.check(path, &a)?;
        self.decode(path, &a).map(Some)
    }

    /// GET `path` as untyped JSON. `Ok(None)` on 404.
    pub async fn get_json(&self, path: &str) -> Result<Option<serde_json::Value>, ClusterError> {
        self.get(path).await
    }

    /// A success status, else the error it means.
    pub(crate) fn check(&self, path: &str, a: &Answer) -> Result<(), ClusterError> {
        let status = a.status;
        if status.is_success() {
            return Ok(());
        }
        if self.credentials_withheld().is_some() && matches!(status.as_u16(), 401 | 403) {
            return Err(ClusterError::CredentialsWithheld {
                server: self.server.clone(),
                user: self.user.clone(),
                resource: path.to_string(),
                status: status.to_string(),
            });
        }
        Err(match status.as_u16() {
            401 => ClusterError::Unauthorized {
                server: self.server.clone(),
                user: self.user.clone(),
                resource: path.to_string(),
            },
            403 => ClusterError::Forbidden {
                server: self.server.clone(),
                user: self.user.clone(),
                resource: path.to_string(),
                message: status_message(&a.body).unwrap_or_else(|| "forbidden".into()),
            },
            _ => ClusterError::Api {
                url: self.url(path),
                message: match status_message(&a.body) {
                    Some(m) => format!("HTTP {status}: {m}"),
                    None => format!("HTTP {status}"),
                },
                transient: status.is_server_error() || status.as_u16() == 429,
            },
        })
    }

    /// The body as `T`, or an error naming what it is not.
    pub(crate) fn decode<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        a: &Answer,
    ) -> Result<T, ClusterError> {
        serde_json::from_slice(&a.body).map_err(|e| ClusterError::Api {
            url: self.url(path),
            message: format!(
                "HTTP {} but the answer is not JSON of the kind expected ({e}); is {} a Kubernetes API server?",
                a.status, self.server
            ),
            transient: false,
        })
    }

    fn transport_error(&self, e: &kube::Error) -> ClusterError {
        let message = koord_base::text::error_chain(e);
        let lower = message.to_ascii_lowercase();
        if lower.contains("certificate")
            || lower.contains("tls")
            || lower.contains("handshake")
            || lower.contains("invalid peer")
        {
            return ClusterError::Tls {
                server: self.server.clone(),
                context: self.context.clone(),
                message,
            };
        }
        if lower.contains("connect")
            || lower.contains("dns")
            || lower.contains("timed out")
            || lower.contains("refused")
            || lower.contains("proxy")
        {
            return ClusterError::Unreachable {
                server: self.server.clone(),
                context: self.context.clone(),
                message,
            };
        }
        // A connection that broke after it was made (reset, a body cut short).
        ClusterError::Api {
            url: self.server.clone(),
            message,
            transient: true,
        }
    }
}

/// kube's configuration for `cfg`: the transport only (authentication is set per request).
fn kube_config(cfg: &Kubeconfig, t: &Timeouts) -> Result<kube::Config, ClusterError> {
    let setup = |message: String| ClusterError::ClientSetup {
        server: cfg.server.clone(),
        context: cfg.context.clone(),
        message,
    };
    let uri: http::Uri = cfg
        .server
        .parse()
        .map_err(|e| setup(format!("the server URL is not a valid URL: {e}")))?;
    let mut c = kube::Config::new(uri);
    c.default_namespace = cfg.namespace.clone().unwrap_or_else(|| "default".into());
    c.connect_timeout = Some(t.connect);
    c.read_timeout = Some(t.request);
    c.write_timeout = Some(t.request);
    c.default_retry = false;
    c.accept_invalid_certs = cfg.insecure_skip_tls_verify;
    c.tls_server_name = cfg.tls_server_name.clone();
    if let Some(pem) = &cfg.ca_pem {
        use rustls_pki_types::pem::PemObject as _;
        let certs: Vec<Vec<u8>> = rustls_pki_types::CertificateDer::pem_slice_iter(pem)
            .map(|c| c.map(|c| c.as_ref().to_vec()))
            .collect::<Result<_, _>>()
            .map_err(|e| {
                setup(format!(
                    "the certificate authority of cluster {:?} is not valid PEM: {e}",
                    cfg.cluster
                ))
            })?;
        if certs.is_empty() {
            return Err(setup(format!(
                "the certificate authority of cluster {:?} holds no PEM certificate",
                cfg.cluster
            )));
        }
        c.root_cert = Some(certs);
    }
    if let Some(proxy) = &cfg.proxy_url {
        c.proxy_url = Some(proxy.expose().parse().map_err(|_| {
            setup(format!(
                "the proxy-url of cluster {:?} is not a usable proxy URL",
                cfg.cluster
            ))
        })?);
    }
    if let Some(id) = &cfg.client_identity {
        let b64 = base64::engine::general_purpose::STANDARD;
        c.auth_info.client_certificate_data = Some(b64.encode(&id.certificate_pem));
        c.auth_info.client_key_data = Some(b64.encode(id.key_pem.expose()).into());
    }
    let imp = &cfg.impersonation;
    c.auth_info.impersonate = imp.user.clone();
    c.auth_info.impersonate_uid = imp.uid.clone();
    c.auth_info.impersonate_groups = (!imp.groups.is_empty()).then(|| imp.groups.clone());
    c.auth_info.impersonate_user_extra =
        (!imp.extra.is_empty()).then(|| imp.extra.clone().into_iter().collect());
    Ok(c)
}

/// What a failed client setup says, with no key material: a bad key is only said to be bad.
fn setup_message(e: &kube::Error, user: &str) -> String {
    let text = koord_base::text::error_chain(e);
    let lower = text.to_ascii_lowercase();
    if lower.contains("private key") || lower.contains("identity") {
        format!(
            "the client certificate or key of user {user:?} is not a valid PEM certificate and private key"
        )
    } else {
        text
    }
}

/// The `message` of a Kubernetes `Status` body, or the start of a plain-text body.
pub(crate) fn status_message(body: &[u8]) -> Option<String> {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        if let Some(m) = v
            .get("message")
            .and_then(|m| m.as_str())
            .filter(|m| !m.is_empty())
        {
            return Some(m.to_string());
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let mut short: String = text.chars().take(200).collect();
    if short.len() < text.len() {
        short.push_str("...");
    }
    Some(short)
}

#[cfg(test)]
mod tests;
