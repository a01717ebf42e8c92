//! The transport: one reqwest client (no automatic redirects), the `/v2/` ping per host, tokens
//! for exactly the scopes a request needs (and the ones a 401 challenge names), basic auth for
//! htpasswd registries, bounded body reads, and the classification of every failure into a
//! [`RegistryError`] that says what happened. Retries are the caller's (see `mod.rs`): one call
//! here is one attempt, with its auth round trips.

use super::auth::{
    merge_scopes, parse_challenges, parse_retry_after, scopes_text, CachedToken, Challenge, Scope,
    TokenAnswer, TokenCache,
};
use super::body::read_capped;
use super::RegistryError;
use crate::store::auth::{Credential, Credentials, Lookup};
use crate::store::error_chain as chain;
use crate::store::retry::Failure;
use base64::Engine as _;
use reqwest::header::{HeaderName, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// Largest token service answer read (a JWT with an `x5c` chain is a few KiB).
const MAX_TOKEN_BODY: usize = 256 * 1024;
/// Largest error body read (for its message).
const MAX_ERROR_BODY: usize = 64 * 1024;

/// How a host wants to be spoken to, learnt from `GET /v2/`.
#[derive(Debug, Clone)]
enum HostAuth {
    /// No auth asked for.
    Open,
    /// HTTP basic.
    Basic,
    /// Docker token auth.
    Bearer {
        realm: String,
        service: Option<String>,
    },
}

type HostSlot = Arc<tokio::sync::Mutex<Option<HostAuth>>>;

/// A request body that can be made again (a 401 or a retry sends it anew).
pub(crate) type BodyFn<'a> = &'a (dyn Fn() -> reqwest::Body + Send + Sync);

/// One request to a registry.
pub(crate) struct Req<'a> {
    pub method: Method,
    /// Registry host\[:port\].
    pub host: &'a str,
    /// Absolute URL, or a path (`/v2/...`) on `host`.
    pub url: String,
    /// The accesses the request needs.
    pub scopes: Vec<Scope>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Option<BodyFn<'a>>,
    /// For messages.
    pub what: &'a str,
}

/// The transport shared by every call.
pub(crate) struct Transport {
    http: reqwest::Client,
    plain_http_hosts: Vec<String>,
    credentials: Credentials,
    /// Per host, its own lock: the first request pings, the others to that host wait for it,
    /// requests to other hosts do not.
    hosts: std::sync::Mutex<HashMap<String, HostSlot>>,
    tokens: TokenCache,
}

impl Transport {
    pub fn new(
        http: reqwest::Client,
        plain_http_hosts: Vec<String>,
        credentials: Credentials,
    ) -> Self {
        Transport {
            http,
            plain_http_hosts,
            credentials,
            hosts: Default::default(),
            tokens: Default::default(),
        }
    }

    /// `https://host` or `http://host` (with --plain-http).
    pub fn base(&self, host: &str) -> String {
        let plain = self.plain_http_hosts.iter().any(|h| h == host);
        format!("{}://{host}", if plain { "http" } else { "https" })
    }

    fn url(&self, req: &Req<'_>) -> Result<Url, RegistryError> {
        let text = if req.url.starts_with('/') {
            format!("{}{}", self.base(req.host), req.url)
        } else {
            req.url.clone()
        };
        Url::parse(&text).map_err(|e| RegistryError::Status {
            registry: req.host.to_string(),
            what: req.what.to_string(),
            message: format!("bad URL {text}: {e}"),
        })
    }

    async fn lookup(&self, host: &str) -> Result<Lookup, RegistryError> {
        self.credentials
            .resolve(host)
            .await
            .map_err(RegistryError::Credentials)
    }

    /// The HTTP client itself, for requests outside the distribution API (Harbor's
    /// `/api/v2.0/`): the same TLS settings, no credentials added.
    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// A fresh token for exactly `scopes` from `host`'s token service, with the host's
    /// credentials (what a push would get), or `None` when the host does not use token auth.
    /// The token is not cached: the caller reads what it grants.
    pub(crate) async fn token_for(
        &self,
        host: &str,
        scopes: &[Scope],
        what: &str,
    ) -> Result<Option<koord_base::secret::Secret>, RegistryError> {
        match self.host_auth(host, what).await? {
            HostAuth::Bearer { realm, service } => Ok(Some(
                self.fetch_token(host, &realm, service.as_deref(), scopes, what)
                    .await?
                    .token,
            )),
            HostAuth::Open | HostAuth::Basic => Ok(None),
        }
    }

    /// Send one request: the auth the host asked for, and on a 401 the token for the scopes its
    /// challenge names, once. A 401/403 that remains becomes "no credentials", "refused" or
    /// "denied"; any other status is the caller's to judge.
    pub async fn send(&self, req: &Req<'_>) -> Result<reqwest::Response, RegistryError> {
        let url = self.url(req)?;
        let same_origin = self.is_registry_origin(req.host, &url);
        let host_auth = if same_origin {
            self.host_auth(req.host, req.what).await?
        } else {
            HostAuth::Open
        };
        let auth = match &host_auth {
            HostAuth::Open => None,
            HostAuth::Basic => self.basic_header(req.host).await?,
            HostAuth::Bearer { realm, service } => Some(
                self.bearer(
                    req.host,
                    realm,
                    service.as_deref(),
                    &req.scopes,
                    false,
                    req.what,
                )
                .await?,
            ),
        };
        let resp = self.raw(req, &url, auth.clone()).await?;
        if !same_origin || !matches!(resp.status().as_u16(), 401 | 403) {
            return Ok(resp);
        }
        let status = resp.status();
        let challenges = parse_challenges(
            resp.headers()
                .get_all(reqwest::header::WWW_AUTHENTICATE)
                .iter()
                .filter_map(|v| v.to_str().ok()),
        );
        drop(resp);
        let bearer = challenges.iter().find_map(|c| match c {
            Challenge::Bearer {
                realm,
                service,
                scopes,
                ..
            } => Some((realm.clone(), service.clone(), scopes.clone())),
            Challenge::Basic => None,
        });
        let basic = challenges.iter().any(|c| matches!(c, Challenge::Basic));
        if status.as_u16() == 401 {
            if let Some((realm, service, cscopes)) = bearer {
                // Learn (or correct) the host's token service, then get a token for the scopes
                // the request needs and those the challenge names, together.
                *self.host_slot(req.host).lock().await = Some(HostAuth::Bearer {
                    realm: realm.clone(),
                    service: service.clone(),
                });
                let want = merge_scopes([&req.scopes[..], &cscopes[..]]);
                let token = self
                    .bearer(req.host, &realm, service.as_deref(), &want, true, req.what)
                    .await?;
                let again = self.raw(req, &url, Some(token)).await?;
                if matches!(again.status().as_u16(), 401 | 403) {
                    return Err(self.denied(req, &want).await);
                }
                return Ok(again);
            }
            if basic && auth.is_none() {
                *self.host_slot(req.host).lock().await = Some(HostAuth::Basic);
                if let Some(h) = self.basic_header(req.host).await? {
                    let again = self.raw(req, &url, Some(h)).await?;
                    if again.status().as_u16() == 401 {
                        return Err(self.refused(req.host, req.what).await);
                    }
                    if again.status().as_u16() == 403 {
                        return Err(self.denied(req, &req.scopes).await);
                    }
                    return Ok(again);
                }
                return Err(self.no_credentials(req.host, req.what).await);
            }
            if matches!(host_auth, HostAuth::Basic) && auth.is_some() {
                return Err(self.refused(req.host, req.what).await);
            }
        }
        Err(self.denied(req, &req.scopes).await)
    }

    /// One HTTP exchange, no auth logic.
    async fn raw(
        &self,
        req: &Req<'_>,
        url: &Url,
        auth: Option<HeaderValue>,
    ) -> Result<reqwest::Response, RegistryError> {
        let mut b = self.http.request(req.method.clone(), url.clone());
        for (k, v) in &req.headers {
            b = b.header(k, v);
        }
        if let Some(a) = auth {
            b = b.header(reqwest::header::AUTHORIZATION, a);
        }
        if let Some(body) = req.body {
            b = b.body(body());
        }
        b.send()
            .await
            .map_err(|e| classify_send_error(&host_of(url, req.host), req.what, &e))
    }

    /// Is `url` on the registry itself (same scheme, host and port)? Credentials go nowhere else.
    fn is_registry_origin(&self, host: &str, url: &Url) -> bool {
        let Ok(base) = Url::parse(&self.base(host)) else {
            return false;
        };
        base.scheme() == url.scheme()
            && base.host_str() == url.host_str()
            && base.port_or_known_default() == url.port_or_known_default()
    }

    /// The host's auth scheme, from `GET /v2/` the first time it is needed.
    async fn host_auth(&self, host: &str, what: &str) -> Result<HostAuth, RegistryError> {
        let slot = self.host_slot(host);
        let mut known = slot.lock().await;
        if let Some(h) = known.as_ref() {
            return Ok(h.clone());
        }
        let url =
            Url::parse(&format!("{}/v2/", self.base(host))).map_err(|e| RegistryError::Status {
                registry: host.to_string(),
                what: what.to_string(),
                message: format!("bad registry address: {e}"),
            })?;
        let resp = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| classify_send_error(host, what, &e))?;
        let status = resp.status();
        let auth = if status == StatusCode::UNAUTHORIZED {
            let ch = parse_challenges(
                resp.headers()
                    .get_all(reqwest::header::WWW_AUTHENTICATE)
                    .iter()
                    .filter_map(|v| v.to_str().ok()),
            );
            match ch.into_iter().next() {
                Some(Challenge::Bearer { realm, service, .. }) => {
                    HostAuth::Bearer { realm, service }
                }
                Some(Challenge::Basic) => HostAuth::Basic,
                None => HostAuth::Open,
            }
        } else if is_transient_status(status) {
            return Err(status_error(host, what, resp).await);
        } else if status == StatusCode::BAD_REQUEST {
            // distribution over TLS answers a plain-HTTP request with 400 and this text.
            let body = read_capped(resp, MAX_ERROR_BODY).await.unwrap_or_default();
            if String::from_utf8_lossy(&body).contains("HTTP request to an HTTPS server") {
                return Err(RegistryError::Status {
                    registry: host.to_string(),
                    what: what.to_string(),
                    message: format!("{host} speaks HTTPS, not plain HTTP: drop --plain-http"),
                });
            }
            HostAuth::Open
        } else {
            HostAuth::Open
        };
        *known = Some(auth.clone());
        Ok(auth)
    }

    fn host_slot(&self, host: &str) -> HostSlot {
        match self.hosts.lock() {
            Ok(mut m) => m.entry(host.to_string()).or_default().clone(),
            Err(_) => Arc::default(),
        }
    }

    async fn basic_header(&self, host: &str) -> Result<Option<HeaderValue>, RegistryError> {
        let lookup = self.lookup(host).await?;
        Ok(match lookup.found.map(|f| f.credential) {
            Some(Credential::Basic(l)) => basic_value(&l.username, l.password.expose()),
            _ => None,
        })
    }

    /// `Bearer TOKEN` for `scopes` on `host`: from the cache unless `fresh`, else from the token
    /// service (basic auth for a user, the refresh-token grant for an identity token,
    /// anonymous otherwise).
    async fn bearer(
        &self,
        host: &str,
        realm: &str,
        service: Option<&str>,
        scopes: &[Scope],
        fresh: bool,
        what: &str,
    ) -> Result<HeaderValue, RegistryError> {
        let slot = self.tokens.slot(host, scopes);
        let mut guard = slot.lock().await;
        let now = Instant::now();
        if !fresh {
            if let Some(t) = guard.as_ref().filter(|t| t.until > now) {
                return bearer_value(t.token.expose(), host, what);
            }
        }
        let t = self.fetch_token(host, realm, service, scopes, what).await?;
        let v = bearer_value(t.token.expose(), host, what)?;
        *guard = Some(t);
        Ok(v)
    }

    async fn fetch_token(
        &self,
        host: &str,
        realm: &str,
        service: Option<&str>,
        scopes: &[Scope],
        what: &str,
    ) -> Result<CachedToken, RegistryError> {
        // A broken helper does not stop an anonymous pull; it is reported if a login is needed.
        let (lookup, lookup_err) = match self.lookup(host).await {
            Ok(l) => (l, None),
            Err(e) => (Lookup::default(), Some(e)),
        };
        let mut url = Url::parse(realm).map_err(|e| RegistryError::Status {
            registry: host.to_string(),
            what: what.to_string(),
            message: format!("its token service address {realm:?} is not a URL: {e}"),
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(RegistryError::Status {
                registry: host.to_string(),
                what: what.to_string(),
                message: format!("its token service address {realm:?} is not http(s)"),
            });
        }
        let realm_host = host_of(&url, host).to_string();
        let cred = lookup.found.as_ref().map(|f| &f.credential);
        let resp = match cred {
            Some(Credential::IdentityToken(rt)) => {
                let scope = scopes_text(scopes);
                // Built before the request: the serializer is not Send.
                let form = {
                    let mut form = url::form_urlencoded::Serializer::new(String::new());
                    form.append_pair("grant_type", "refresh_token")
                        .append_pair("refresh_token", rt.expose())
                        .append_pair("client_id", "koord-bundle");
                    if let Some(s) = service {
                        form.append_pair("service", s);
                    }
                    if !scope.is_empty() {
                        form.append_pair("scope", &scope);
                    }
                    form.finish()
                };
                self.http
                    .post(url.clone())
                    .header(
                        reqwest::header::CONTENT_TYPE,
                        "application/x-www-form-urlencoded",
                    )
                    .body(form)
                    .send()
                    .await
            }
            other => {
                {
                    let mut q = url.query_pairs_mut();
                    if let Some(s) = service {
                        q.append_pair("service", s);
                    }
                    for s in scopes {
                        q.append_pair("scope", &s.to_string());
                    }
                }
                let mut b = self.http.get(url.clone());
                if let Some(Credential::Basic(l)) = other {
                    if let Some(v) = basic_value(&l.username, l.password.expose()) {
                        b = b.header(reqwest::header::AUTHORIZATION, v);
                    }
                }
                b.send().await
            }
        };
        let what_token = format!("a token for {} ({what})", scopes_text(scopes));
        let resp = resp.map_err(|e| classify_send_error(&realm_host, &what_token, &e))?;
        let status = resp.status();
        if status.is_success() {
            let body = read_capped(resp, MAX_TOKEN_BODY)
                .await
                .map_err(|e| e.into_error(&realm_host, &what_token))?;
            let answer: TokenAnswer =
                serde_json::from_slice(&body).map_err(|_| RegistryError::Status {
                    registry: realm_host.clone(),
                    what: what_token.clone(),
                    message: "the token service's answer is not the JSON {\"token\": ...} of the distribution token spec".into(),
                })?;
            return answer
                .into_cached(Instant::now())
                .ok_or_else(|| RegistryError::Status {
                    registry: realm_host,
                    what: what_token,
                    message: "the token service answered without a token".into(),
                });
        }
        if matches!(status.as_u16(), 400 | 401 | 403) {
            return Err(match lookup.found {
                Some(found) => RegistryError::Refused {
                    registry: host.to_string(),
                    who: found.credential.who(),
                    origin: found.origin,
                    what: what.to_string(),
                    detail: format!("its token service {realm_host} answered {status}"),
                },
                None => match lookup_err {
                    Some(e) => e,
                    None => RegistryError::NoCredentials {
                        registry: host.to_string(),
                        what: what.to_string(),
                        searched: lookup.searched_text(),
                    },
                },
            });
        }
        Err(status_error(&realm_host, &what_token, resp).await)
    }

    async fn no_credentials(&self, host: &str, what: &str) -> RegistryError {
        match self.lookup(host).await {
            Ok(l) => RegistryError::NoCredentials {
                registry: host.to_string(),
                what: what.to_string(),
                searched: l.searched_text(),
            },
            Err(e) => e,
        }
    }

    async fn refused(&self, host: &str, what: &str) -> RegistryError {
        match self.lookup(host).await {
            Ok(Lookup { found: Some(f), .. }) => RegistryError::Refused {
                registry: host.to_string(),
                who: f.credential.who(),
                origin: f.origin,
                what: what.to_string(),
                detail: "it answered 401".into(),
            },
            Ok(l) => RegistryError::NoCredentials {
                registry: host.to_string(),
                what: what.to_string(),
                searched: l.searched_text(),
            },
            Err(e) => e,
        }
    }

    /// A request still refused with a token for every scope it needs: without credentials,
    /// "log in"; with them, the user lacks the right.
    async fn denied(&self, req: &Req<'_>, scopes: &[Scope]) -> RegistryError {
        match self.lookup(req.host).await {
            Ok(Lookup { found: Some(f), .. }) => RegistryError::Denied {
                registry: req.host.to_string(),
                who: f.credential.who(),
                what: req.what.to_string(),
                action: if req.scopes.iter().any(|s| s.wants_push()) {
                    "push"
                } else {
                    "pull"
                },
                scope: scopes_text(scopes),
            },
            Ok(l) => RegistryError::NoCredentials {
                registry: req.host.to_string(),
                what: req.what.to_string(),
                searched: l.searched_text(),
            },
            Err(e) => e,
        }
    }
}

fn basic_value(user: &str, password: &str) -> Option<HeaderValue> {
    let enc = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let mut v = HeaderValue::from_str(&format!("Basic {enc}")).ok()?;
    v.set_sensitive(true);
    Some(v)
}

fn bearer_value(token: &str, host: &str, what: &str) -> Result<HeaderValue, RegistryError> {
    let mut v =
        HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| RegistryError::Status {
            registry: host.to_string(),
            what: what.to_string(),
            message: "its token service handed out a token that cannot be sent in a header".into(),
        })?;
    v.set_sensitive(true);
    Ok(v)
}

/// `host[:port]` of a URL (for messages), else the fallback.
pub(crate) fn host_of<'a>(url: &Url, fallback: &'a str) -> std::borrow::Cow<'a, str> {
    match (url.host_str(), url.port()) {
        (Some(h), Some(p)) => format!("{h}:{p}").into(),
        (Some(h), None) => h.to_string().into(),
        _ => fallback.into(),
    }
}

/// What an error answer means to the retry policy, for registries and Helm repositories alike:
/// worth another try ([`is_transient_status`]), the server's `Retry-After` (seconds or an HTTP
/// date), throttled (429).
pub(crate) fn status_failure(resp: &reqwest::Response) -> Failure {
    let status = resp.status();
    Failure {
        retryable: is_transient_status(status),
        retry_after: resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, std::time::SystemTime::now())),
        throttled: status == StatusCode::TOO_MANY_REQUESTS,
    }
}

/// 408, 429 and 5xx are worth another try.
pub(crate) fn is_transient_status(s: StatusCode) -> bool {
    matches!(s.as_u16(), 408 | 429) || s.is_server_error()
}

/// The error for a status that is not what the caller wanted: 404 is "not found", 408/429/5xx
/// transient (with `Retry-After`), anything else a status error with the registry's message.
pub(crate) async fn status_error(
    registry: &str,
    what: &str,
    resp: reqwest::Response,
) -> RegistryError {
    let status = resp.status();
    let failure = status_failure(&resp);
    let body = read_capped(resp, MAX_ERROR_BODY).await.unwrap_or_default();
    let message = error_text(status, &body);
    if status == StatusCode::NOT_FOUND {
        return RegistryError::NotFound {
            what: what.to_string(),
            registry: registry.to_string(),
        };
    }
    if failure.retryable {
        let mut e = RegistryError::transport(registry, what, message, String::new(), true);
        if let RegistryError::Transport {
            throttled,
            retry_after,
            ..
        } = &mut e
        {
            *throttled = failure.throttled;
            *retry_after = failure.retry_after;
        }
        return e;
    }
    let hint = if status == StatusCode::BAD_REQUEST
        && String::from_utf8_lossy(&body).contains("HTTP request to an HTTPS server")
    {
        format!(" ({registry} speaks HTTPS: drop --plain-http)")
    } else {
        String::new()
    };
    RegistryError::Status {
        registry: registry.to_string(),
        what: what.to_string(),
        message: format!("{message}{hint}"),
    }
}

/// `HTTP 404 Not Found: MANIFEST_UNKNOWN: manifest unknown` from a distribution error body.
pub(super) fn error_text(status: StatusCode, body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Env {
        errors: Vec<E>,
    }
    #[derive(serde::Deserialize)]
    struct E {
        code: Option<String>,
        message: Option<String>,
    }
    let detail = match serde_json::from_slice::<Env>(body) {
        Ok(env) if !env.errors.is_empty() => env
            .errors
            .iter()
            .map(|e| {
                format!(
                    "{}: {}",
                    e.code.as_deref().unwrap_or("?"),
                    e.message.as_deref().unwrap_or("")
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
        _ => {
            let t = String::from_utf8_lossy(body);
            let line = t.lines().next().unwrap_or("").trim();
            line.chars().take(200).collect()
        }
    };
    if detail.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {detail}")
    }
}

/// Is `host` (with or without port) a loopback address?
fn is_loopback(host: &str) -> bool {
    let h = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or(rest)
    } else {
        host.rsplit_once(':')
            .filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit()))
            .map(|(h, _)| h)
            .unwrap_or(host)
    };
    h.eq_ignore_ascii_case("localhost")
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// An HTTP answer that does not parse (hyper's parse errors: a head over its buffer, too many
/// headers, a bad status line or header, a bad version): why, and whether it was only too
/// large; or `None`.
fn malformed(e: &(dyn std::error::Error + 'static)) -> Option<(String, bool)> {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if let Some(h) = c.downcast_ref::<hyper::Error>() {
            if h.is_parse() || h.is_parse_status() || h.is_parse_too_large() {
                return Some((h.to_string(), h.is_parse_too_large()));
            }
        }
        cur = c.source();
    }
    None
}

/// A failed exchange, sorted into what the user can act on.
pub(crate) fn classify_send_error(host: &str, what: &str, e: &reqwest::Error) -> RegistryError {
    let message = chain(e);
    // The words of the error, without its URL: an upload's `_state` token is random base64,
    // and one that spelt "tls" made a cut connection a TLS failure, not retried (a flake of
    // faults::build_and_load_through_a_flaky_registry_give_the_clean_result).
    let lower = match e.url() {
        Some(u) => message.replace(u.as_str(), ""),
        None => message.clone(),
    }
    .to_lowercase();
    if let Some((why, too_large)) = malformed(e) {
        // What a TLS server answers to plain HTTP does not parse either.
        let plain = !too_large && e.url().is_some_and(|u| u.scheme() == "http");
        return RegistryError::Malformed {
            registry: host.to_string(),
            what: what.to_string(),
            message: if plain {
                format!("{why} (if {host} speaks HTTPS, drop --plain-http)")
            } else {
                why
            },
        };
    }
    if lower.contains("invalidcontenttype") || lower.contains("corrupt message") {
        return RegistryError::PlainHttp {
            registry: host.to_string(),
            what: what.to_string(),
        };
    }
    if lower.contains("certificate") || lower.contains("tls") || lower.contains("handshake") {
        return RegistryError::Tls {
            registry: host.to_string(),
            what: what.to_string(),
            message,
        };
    }
    let refused = {
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
        let mut found = false;
        while let Some(c) = cur {
            if let Some(io) = c.downcast_ref::<std::io::Error>() {
                if io.kind() == std::io::ErrorKind::ConnectionRefused {
                    found = true;
                }
            }
            cur = c.source();
        }
        found || lower.contains("connection refused")
    };
    if refused && is_loopback(host) {
        return RegistryError::transport(
            host,
            what,
            message,
            format!(
                " (nothing listens on {host}: is the service running there, and is the port right?)"
            ),
            false,
        );
    }
    let no_such_host = lower.contains("name or service not known")
        || lower.contains("no address associated with hostname")
        || lower.contains("nodename nor servname provided")
        || lower.contains("no such host");
    if no_such_host {
        return RegistryError::transport(
            host,
            what,
            message,
            format!(" (no such host: check the name {host}, and that it resolves from here)"),
            false,
        );
    }
    let hint = if e.is_connect() || lower.contains("connect") {
        format!(" (is {host} up and reachable from here?)")
    } else {
        String::new()
    };
    RegistryError::transport(host, what, message, hint, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn loopback_and_error_text() {
        assert!(is_loopback("127.0.0.1:5000"));
        assert!(is_loopback("localhost"));
        assert!(is_loopback("[::1]:5000"));
        assert!(!is_loopback("10.0.0.5:5000"));
        assert!(!is_loopback("registry.example"));
        let t = error_text(
            StatusCode::NOT_FOUND,
            br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#,
        );
        assert_eq!(t, "HTTP 404 Not Found: MANIFEST_UNKNOWN: manifest unknown");
        assert_eq!(
            error_text(StatusCode::BAD_GATEWAY, b""),
            "HTTP 502 Bad Gateway"
        );
    }

    /// What the registry client and the Helm repository fetcher read from an error answer.
    #[test]
    fn status_failure_reads_status_and_retry_after() {
        let answer = |status: u16, retry_after: Option<&str>| {
            let mut b = http::Response::builder().status(status);
            if let Some(v) = retry_after {
                b = b.header("retry-after", v);
            }
            status_failure(&reqwest::Response::from(b.body("").unwrap()))
        };
        let f = answer(429, Some("3"));
        assert!(f.retryable && f.throttled, "{f:?}");
        assert_eq!(f.retry_after, Some(std::time::Duration::from_secs(3)));
        let f = answer(503, None);
        assert!(
            f.retryable && !f.throttled && f.retry_after.is_none(),
            "{f:?}"
        );
        let f = answer(404, Some("3"));
        assert!(!f.retryable && !f.throttled, "{f:?}");
    }

    /// A server on 127.0.0.1 that answers every connection with `answer` (then closes it).
    fn answering(answer: Vec<u8>) -> String {
        use std::io::{Read as _, Write as _};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                let _ = c.write_all(&answer);
            }
        });
        addr
    }

    async fn get(addr: &str) -> RegistryError {
        let e = reqwest::Client::new()
            .get(format!("http://{addr}/v2/"))
            .send()
            .await
            .unwrap_err();
        classify_send_error(addr, "ping", &e)
    }

    #[tokio::test]
    async fn a_malformed_answer_is_permanent_and_a_cut_one_transient() {
        // A head larger than any client reads: permanent, named.
        let mut huge =
            b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"x\",service=\""
                .to_vec();
        huge.extend(std::iter::repeat_n(b'x', 1 << 20));
        huge.extend_from_slice(b"\"\r\nContent-Length: 0\r\n\r\n");
        for answer in [
            huge,
            b"HTTP/1.1 2000 What\r\n\r\n".to_vec(),
            b"\x15\x03\x03\x00\x02\x02\x46".to_vec(), // a TLS alert
        ] {
            let addr = answering(answer);
            let e = get(&addr).await;
            assert!(matches!(e, RegistryError::Malformed { .. }), "{e:?}");
            assert!(!e.failure().retryable && !e.is_transient(), "{e:?}");
            assert!(e.to_string().contains(&addr), "{e}");
        }
        // Closed before any answer (a reset, a proxy restarting): transient, retried.
        let addr = answering(Vec::new());
        let e = get(&addr).await;
        assert!(e.failure().retryable && e.is_transient(), "{e:?}");
        // Whatever the URL spells: words of an upload token are not the error's.
        for query in ["_state=CTLsJVuFYTOH1ek", "x=handshake", "x=certificate"] {
            let e = reqwest::Client::new()
                .get(format!("http://{addr}/v2/x/blobs/uploads/1?{query}"))
                .send()
                .await
                .unwrap_err();
            let e = classify_send_error(&addr, "upload", &e);
            assert!(!matches!(e, RegistryError::Tls { .. }), "{query}: {e:?}");
            assert!(e.failure().retryable && e.is_transient(), "{query}: {e:?}");
        }
    }
}
