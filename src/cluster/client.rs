//! A small, read-only Kubernetes API client: GET a path, get JSON back (or `None` on 404).
//!
//! Authentication as resolved by [`super::kubeconfig`]: bearer token, basic, an exec
//! plugin's token ([`super::exec`], cached until it expires and fetched again once after a
//! 401), TLS client certificate. As client-go (kubectl, helm) does, credentials are sent over
//! TLS only: to a plain `http://` server requests go without them, and a 401/403 then says
//! why ([`ClusterError::CredentialsWithheld`]). Server verification against the kubeconfig's CA (only it: the system roots are
//! not used when a CA is given), the system roots otherwise, or none with
//! `insecure-skip-tls-verify`. Timeouts: 5 s to connect, 20 s per request. No retries: a
//! preflight that cannot reach the cluster says so at once.

use super::exec::ExecToken;
use super::kubeconfig::{Credentials, Kubeconfig};
use super::ClusterError;
use crate::store::body::{read_capped, BodyError};
use std::time::{Duration, SystemTime};

/// Largest response body accepted (a NodeList of a big cluster fits many times over).
const MAX_BODY: usize = 128 * 1024 * 1024;

/// Connect timeout.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Whole-request timeout.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// A GET-only client for one kubeconfig context.
pub struct KubeClient {
    http: reqwest::Client,
    base: String,
    server: String,
    context: String,
    user: String,
    credentials: Credentials,
    timeouts: (Duration, Duration),
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

impl KubeClient {
    /// A client for the resolved kubeconfig, with the default timeouts.
    pub fn new(cfg: &Kubeconfig) -> Result<Self, ClusterError> {
        Self::with_timeouts(cfg, CONNECT_TIMEOUT, REQUEST_TIMEOUT)
    }

    /// A client with other timeouts (tests).
    pub fn with_timeouts(
        cfg: &Kubeconfig,
        connect: Duration,
        request: Duration,
    ) -> Result<Self, ClusterError> {
        let setup = |message: String| ClusterError::ClientSetup {
            server: cfg.server.clone(),
            context: cfg.context.clone(),
            message,
        };
        let mut b = reqwest::Client::builder()
            .user_agent(concat!("koord-bundle/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(connect)
            .timeout(request);
        if cfg.insecure_skip_tls_verify {
            b = b.tls_danger_accept_invalid_certs(true);
        } else if let Some(pem) = &cfg.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| {
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
            b = b.tls_certs_only(certs);
        }
        if let Some(id) = &cfg.client_identity {
            let mut pem = id.certificate_pem.clone();
            if !pem.ends_with(b"\n") {
                pem.push(b'\n');
            }
            pem.extend_from_slice(id.key_pem.expose());
            // The error of a bad key is not shown: only that it is bad.
            let identity = reqwest::Identity::from_pem(&pem).map_err(|_| {
                setup(format!(
                    "the client certificate or key of user {:?} is not a valid PEM certificate and private key",
                    cfg.user
                ))
            })?;
            b = b.identity(identity);
        }
        if let Some(proxy) = &cfg.proxy_url {
            let p = reqwest::Proxy::all(proxy.expose()).map_err(|_| {
                setup(format!(
                    "the proxy-url of cluster {:?} is not a usable proxy URL",
                    cfg.cluster
                ))
            })?;
            b = b.proxy(p);
        } else {
            b = b.no_proxy();
        }
        let http = b.build().map_err(|e| setup(crate::text::error_chain(&e)))?;
        Ok(KubeClient {
            http,
            base: cfg.server.trim_end_matches('/').to_string(),
            server: cfg.server.clone(),
            context: cfg.context.clone(),
            user: if cfg.user.is_empty() {
                "(anonymous)".into()
            } else {
                cfg.user.clone()
            },
            credentials: cfg.credentials.clone(),
            timeouts: (connect, request),
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

    /// Why the kubeconfig's credentials are not sent, when they are not: the server URL is
    /// plain `http://` (client-go never sends credentials without TLS either).
    pub fn credentials_withheld(&self) -> Option<String> {
        if self.credentials == Credentials::None || !self.plain_http() {
            return None;
        }
        Some(format!(
            "the credentials of kubeconfig user {:?} are not sent to {}: it is plain http://, and credentials go over TLS only (as with kubectl and helm)",
            self.user, self.server
        ))
    }

    fn plain_http(&self) -> bool {
        self.base
            .get(..7)
            .is_some_and(|p| p.eq_ignore_ascii_case("http://"))
    }

    /// The exec plugin's token: cached while fresh, else (or when `refresh`) run the plugin.
    async fn exec_token(
        &self,
        exec: &super::exec::ExecConfig,
        refresh: bool,
    ) -> Result<super::Secret, ClusterError> {
        let mut cache = self.exec_cache.lock().await;
        if !refresh {
            if let Some(t) = cache.as_ref().filter(|t| t.fresh(SystemTime::now())) {
                return Ok(t.token.clone());
            }
        }
        let t = exec.run().await?;
        let token = t.token.clone();
        *cache = Some(t);
        Ok(token)
    }

    /// GET `path` (e.g. `/api/v1/nodes`, query included) and parse the JSON answer. `Ok(None)`
    /// on 404.
    pub async fn get_json(&self, path: &str) -> Result<Option<serde_json::Value>, ClusterError> {
        let url = format!("{}{}", self.base, path);
        let withheld = self.credentials_withheld().is_some();
        let mut refreshed = false;
        let resp = loop {
            let mut req = self
                .http
                .get(&url)
                .header(reqwest::header::ACCEPT, "application/json");
            req = match &self.credentials {
                _ if withheld => req,
                Credentials::None => req,
                Credentials::Bearer(t) => req.bearer_auth(t.expose()),
                Credentials::Basic { username, password } => {
                    req.basic_auth(username, Some(password.expose()))
                }
                Credentials::Exec(e) => {
                    req.bearer_auth(self.exec_token(e, refreshed).await?.expose())
                }
            };
            let resp = req.send().await.map_err(|e| self.transport_error(&e))?;
            // An exec token the server refuses is fetched again, once (as client-go does).
            if resp.status().as_u16() == 401
                && !refreshed
                && !withheld
                && matches!(self.credentials, Credentials::Exec(_))
            {
                refreshed = true;
                continue;
            }
            break resp;
        };
        let status = resp.status();
        if withheld && matches!(status.as_u16(), 401 | 403) {
            return Err(ClusterError::CredentialsWithheld {
                server: self.server.clone(),
                user: self.user.clone(),
                resource: path.to_string(),
                status: status.to_string(),
            });
        }
        let body = read_capped(resp, MAX_BODY).await.map_err(|e| match e {
            BodyError::Read(e) => self.transport_error(&e),
            BodyError::TooLarge(_) => ClusterError::Api {
                url: url.clone(),
                message: format!("answer larger than {MAX_BODY} bytes"),
                transient: false,
            },
        })?;
        match status.as_u16() {
            200..=299 => serde_json::from_slice(&body).map(Some).map_err(|e| ClusterError::Api {
                url,
                message: format!("HTTP {status} but the answer is not JSON ({e}); is {} a Kubernetes API server?", self.server),
                transient: false,
            }),
            404 => Ok(None),
            401 => Err(ClusterError::Unauthorized { server: self.server.clone(), user: self.user.clone(), resource: path.to_string() }),
            403 => Err(ClusterError::Forbidden {
                server: self.server.clone(),
                user: self.user.clone(),
                resource: path.to_string(),
                message: status_message(&body).unwrap_or_else(|| "forbidden".into()),
            }),
            _ => Err(ClusterError::Api {
                url,
                message: match status_message(&body) {
                    Some(m) => format!("HTTP {status}: {m}"),
                    None => format!("HTTP {status}"),
                },
                transient: status.is_server_error() || status.as_u16() == 429,
            }),
        }
    }

    fn transport_error(&self, e: &reqwest::Error) -> ClusterError {
        let message = crate::text::error_chain(e);
        let lower = message.to_ascii_lowercase();
        if e.is_timeout() {
            return ClusterError::Unreachable {
                server: self.server.clone(),
                context: self.context.clone(),
                message: format!(
                    "no answer in time (connect timeout {:?}, request timeout {:?}): {message}",
                    self.timeouts.0, self.timeouts.1
                ),
            };
        }
        if lower.contains("certificate") || lower.contains("tls") || lower.contains("handshake") {
            return ClusterError::Tls {
                server: self.server.clone(),
                context: self.context.clone(),
                message,
            };
        }
        if e.is_connect() {
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

/// The `message` of a Kubernetes `Status` body, or the start of a plain-text body.
fn status_message(body: &[u8]) -> Option<String> {
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
mod tests {
    use super::*;
    use crate::cluster::secret::Secret;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::path::PathBuf;
    use std::sync::{Arc, Mutex};

    fn cfg(server: String, credentials: Credentials) -> Kubeconfig {
        Kubeconfig {
            path: PathBuf::from("/tmp/kc"),
            context: "ctx".into(),
            cluster: "c".into(),
            user: "ci-bot".into(),
            namespace: None,
            server,
            ca_pem: None,
            insecure_skip_tls_verify: false,
            proxy_url: None,
            credentials,
            client_identity: None,
        }
    }

    /// One-shot HTTP server: answers each connection with `status` and `body`, records the
    /// request heads.
    fn serve(status: &'static str, body: &'static str) -> (String, Arc<Mutex<Vec<String>>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        std::thread::spawn(move || {
            for c in l.incoming().flatten().take(8) {
                let mut c = c;
                let mut buf = [0u8; 4096];
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                s2.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&head).to_string());
                let _ = write!(c, "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            }
        });
        (url, seen)
    }

    #[tokio::test]
    async fn ok_404_and_no_credentials_over_plain_http() {
        let (url, seen) = serve(
            "200 OK",
            r#"{"major":"1","minor":"29","gitVersion":"v1.29.2"}"#,
        );
        let c = KubeClient::new(&cfg(
            url.clone() + "/",
            Credentials::Bearer(Secret::new("tok-123")),
        ))
        .unwrap();
        assert!(c.credentials_withheld().unwrap().contains("plain http://"));
        let v = c.get_json("/version").await.unwrap().unwrap();
        assert_eq!(v["gitVersion"], "v1.29.2");
        let head = seen.lock().unwrap()[0].clone();
        assert!(head.starts_with("GET /version HTTP/1.1"), "{head}");
        assert!(
            !head.to_ascii_lowercase().contains("authorization"),
            "no credentials over plain HTTP: {head}"
        );

        let (url, _) = serve(
            "404 Not Found",
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"namespaces \"x\" not found","reason":"NotFound","details":{"name":"x","kind":"namespaces"},"code":404}"#,
        );
        let c = KubeClient::new(&cfg(url, Credentials::None)).unwrap();
        assert!(c.credentials_withheld().is_none());
        assert!(c.get_json("/api/v1/namespaces/x").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn withheld_basic_credentials_explain_a_401() {
        let (url, seen) = serve("401 Unauthorized", "{}");
        let c = KubeClient::new(&cfg(
            url.clone(),
            Credentials::Basic {
                username: "admin".into(),
                password: Secret::new("pw"),
            },
        ))
        .unwrap();
        let e = c.get_json("/version").await.unwrap_err();
        assert!(
            matches!(e, ClusterError::CredentialsWithheld { .. }),
            "{e:?}"
        );
        let m = e.to_string();
        assert!(
            m.contains("were not sent") && m.contains("https://") && m.contains(&url),
            "{m}"
        );
        let head = seen.lock().unwrap()[0].to_ascii_lowercase();
        assert!(!head.contains("authorization"), "{head}");
    }

    #[tokio::test]
    async fn unauthorized_and_forbidden_name_user_and_resource() {
        let (url, _) = serve(
            "401 Unauthorized",
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}"#,
        );
        let c = KubeClient::new(&cfg(url.clone(), Credentials::None)).unwrap();
        let e = c.get_json("/api/v1/nodes").await.unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, ClusterError::Unauthorized { .. }));
        assert!(
            m.contains("ci-bot") && m.contains("/api/v1/nodes") && m.contains(&url),
            "{m}"
        );
        assert!(!m.contains("expired-tok"), "{m}");

        let (url, _) = serve(
            "403 Forbidden",
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"nodes is forbidden: User \"system:serviceaccount:default:ci\" cannot list resource \"nodes\" in API group \"\" at the cluster scope","reason":"Forbidden","details":{"kind":"nodes"},"code":403}"#,
        );
        let c = KubeClient::new(&cfg(url, Credentials::None)).unwrap();
        let m = c.get_json("/api/v1/nodes").await.unwrap_err().to_string();
        assert!(
            m.contains("403 Forbidden") && m.contains("ci-bot") && m.contains("/api/v1/nodes"),
            "{m}"
        );
        assert!(
            m.contains("cannot list resource \\\"nodes\\\"")
                || m.contains("cannot list resource \"nodes\""),
            "{m}"
        );
    }

    #[tokio::test]
    async fn unreachable_names_the_server() {
        // A port that was just free: nothing listens there.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let server = format!("https://127.0.0.1:{port}");
        let c = KubeClient::new(&cfg(server.clone(), Credentials::None)).unwrap();
        let m = c.get_json("/version").await.unwrap_err().to_string();
        assert!(
            m.contains("no cluster reachable at") && m.contains(&server),
            "{m}"
        );
    }

    #[tokio::test]
    async fn non_json_answer_is_reported() {
        let (url, _) = serve("200 OK", "<html>login</html>");
        let c = KubeClient::new(&cfg(url, Credentials::None)).unwrap();
        let m = c.get_json("/version").await.unwrap_err().to_string();
        assert!(m.contains("not JSON") && m.contains("/version"), "{m}");
    }

    #[test]
    fn bad_ca_and_identity_are_setup_errors_without_key_material() {
        let mut k = cfg("https://k:6443".into(), Credentials::None);
        k.ca_pem = Some(b"not a pem".to_vec());
        let m = KubeClient::new(&k).unwrap_err().to_string();
        assert!(
            m.contains("holds no PEM certificate") && m.contains("https://k:6443"),
            "{m}"
        );

        let mut k = cfg("https://k:6443".into(), Credentials::None);
        k.client_identity = Some(crate::cluster::ClientIdentity {
            certificate_pem: b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
                .to_vec(),
            key_pem: crate::cluster::SecretBytes::new(
                b"-----BEGIN PRIVATE KEY-----\nU0VDUkVU\n-----END PRIVATE KEY-----\n".to_vec(),
            ),
        });
        match KubeClient::new(&k) {
            Ok(_) => {} // rustls may only reject the pair at handshake time
            Err(e) => {
                let m = e.to_string();
                assert!(!m.contains("U0VDUkVU"), "{m}");
            }
        }
    }

    #[test]
    fn debug_has_no_token() {
        let c = KubeClient::new(&cfg(
            "https://k:6443".into(),
            Credentials::Bearer(Secret::new("tok-xyz")),
        ))
        .unwrap();
        assert!(!format!("{c:?}").contains("tok-xyz"));
    }

    #[test]
    fn status_message_falls_back_to_text() {
        assert_eq!(
            status_message(br#"{"kind":"Status","message":"boom"}"#).as_deref(),
            Some("boom")
        );
        assert_eq!(
            status_message(b"404 page not found\n").as_deref(),
            Some("404 page not found")
        );
        assert_eq!(status_message(b"").as_deref(), None);
    }
}
