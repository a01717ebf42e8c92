//! A kubeconfig user entry, resolved as client-go resolves it into what requests carry.
//!
//! | entry | here |
//! |---|---|
//! | `token`, `tokenFile` | a bearer token; `tokenFile` wins over `token` (client-go's rule), read bounded |
//! | `username` / `password` | basic authentication |
//! | `client-certificate(-data)`, `client-key(-data)` | the TLS client identity (`*-data` wins) |
//! | `exec` | an exec credential plugin, run through [`koord_base::child`] ([`super::exec`]) |
//! | `auth-provider: oidc` | its `id-token` as the bearer token; an expired one is refused with what to run |
//! | `auth-provider: gcp`, `azure` | refused with client-go's own advice: client-go removed both in 1.26, so helm and kubectl (1.26+) refuse them too |
//! | `as`, `as-uid`, `as-groups`, `as-user-extra` | impersonation headers (kube sends them) |
//!
//! As client-go validates: a token and a username together, or an exec plugin with an
//! auth-provider, are refused; so is impersonating groups, a uid or extras without `as`.
//! Where the credentials go (never over plain `http://`) is decided by [`super::KubeClient`].

use super::exec::{ExecConfig, API_VERSIONS};
use super::ClusterError;
use base64::Engine as _;
use koord_base::secret::{Secret, SecretBytes};
use kube::config::{AuthInfo, AuthProviderConfig, ExecInteractiveMode};
use secrecy::ExposeSecret as _;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Largest token or certificate file read.
const MAX_CREDENTIAL_FILE: usize = 1024 * 1024;

/// How requests authenticate (besides a client certificate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// No header.
    None,
    /// `Authorization: Bearer <token>`.
    Bearer(Secret),
    /// `Authorization: Basic ...`.
    Basic {
        /// The user name.
        username: String,
        /// The password.
        password: Secret,
    },
    /// `Authorization: Bearer <token>` with the token of an exec credential plugin.
    Exec(Box<ExecConfig>),
}

/// A TLS client certificate chain and its private key, both PEM.
#[derive(Debug, Clone)]
pub struct ClientIdentity {
    /// Certificate chain, PEM.
    pub certificate_pem: Vec<u8>,
    /// Private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key_pem: SecretBytes,
}

/// Whom the requests act as (`Impersonate-*` headers).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Impersonation {
    /// `as`.
    pub user: Option<String>,
    /// `as-uid`.
    pub uid: Option<String>,
    /// `as-groups`.
    pub groups: Vec<String>,
    /// `as-user-extra`.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Impersonation {
    /// Nothing is impersonated.
    pub fn is_empty(&self) -> bool {
        self.user.is_none() && self.uid.is_none() && self.groups.is_empty() && self.extra.is_empty()
    }
}

/// A resolved user entry.
#[derive(Debug, Clone)]
pub struct User {
    /// Token or basic credentials, or the plugin that gives a token.
    pub credentials: Credentials,
    /// TLS client certificate and key.
    pub client_identity: Option<ClientIdentity>,
    /// Whom to act as.
    pub impersonation: Impersonation,
}

/// What the cluster entry tells an exec plugin (`provideClusterInfo`).
pub(crate) struct ClusterInfo<'a> {
    pub server: &'a str,
    pub ca_pem: Option<&'a [u8]>,
    pub insecure_skip_tls_verify: bool,
}

/// Which kubeconfig and user entry, for messages.
pub(crate) struct Entry<'a> {
    /// The kubeconfig file(s), `a.yaml:b.yaml`.
    pub kubeconfig: &'a str,
    /// The user entry's name (empty: an anonymous context).
    pub user: &'a str,
}

impl Entry<'_> {
    fn invalid(&self, message: String) -> ClusterError {
        ClusterError::InvalidKubeconfig {
            kubeconfig: self.kubeconfig.to_string(),
            message,
        }
    }

    /// A file the user entry names (already made absolute against the kubeconfig that names
    /// it), read bounded.
    fn file(&self, what: &str, file: &str) -> Result<Vec<u8>, ClusterError> {
        let path = PathBuf::from(file);
        koord_base::bounded::read_file_bounded(&path, MAX_CREDENTIAL_FILE).map_err(|source| {
            ClusterError::CredentialFile {
                kubeconfig: self.kubeconfig.to_string(),
                what: format!("user {:?} {what}", self.user),
                file: path,
                source,
            }
        })
    }
}

/// Resolve the user entry `info` of `entry`.
pub(crate) fn resolve(
    entry: &Entry<'_>,
    info: &AuthInfo,
    cluster: &ClusterInfo<'_>,
) -> Result<User, ClusterError> {
    let user = entry.user;
    let token = token(entry, info)?;
    let username = non_empty(info.username.as_deref());
    if token.is_some() && username.is_some() {
        return Err(entry.invalid(format!(
            "user {user:?} sets both a token and a username/password; only one may be set"
        )));
    }
    if info.exec.is_some() && info.auth_provider.is_some() {
        return Err(entry.invalid(format!(
            "user {user:?} sets both an exec plugin and an auth-provider; only one may be set"
        )));
    }
    let credentials = if let Some(e) = &info.exec {
        if token.is_some() || username.is_some() {
            return Err(entry.invalid(format!(
                "user {user:?} sets both an exec plugin and a token or username/password; only one may be set"
            )));
        }
        Credentials::Exec(Box::new(exec_config(entry, e, cluster)?))
    } else if let Some(p) = &info.auth_provider {
        if token.is_some() || username.is_some() {
            return Err(entry.invalid(format!(
                "user {user:?} sets both an auth-provider and a token or username/password; only one may be set"
            )));
        }
        Credentials::Bearer(auth_provider_token(entry, p, std::time::SystemTime::now())?)
    } else if let Some(t) = token {
        Credentials::Bearer(t)
    } else if let Some(u) = username {
        Credentials::Basic {
            username: u.to_string(),
            password: Secret::new(
                info.password
                    .as_ref()
                    .map(|p| p.expose_secret().to_string())
                    .unwrap_or_default(),
            ),
        }
    } else {
        Credentials::None
    };
    Ok(User {
        credentials,
        client_identity: client_identity(entry, info)?,
        impersonation: impersonation(entry, info)?,
    })
}

/// `tokenFile` (wins, as in client-go) or `token`.
fn token(entry: &Entry<'_>, info: &AuthInfo) -> Result<Option<Secret>, ClusterError> {
    if let Some(f) = non_empty(info.token_file.as_deref()) {
        let user = entry.user;
        let bytes = entry.file("tokenFile", f)?;
        let t = String::from_utf8(bytes)
            .map_err(|_| entry.invalid(format!("user {user:?}: tokenFile {f} is not text")))?;
        let t = t.trim();
        if t.is_empty() {
            return Err(entry.invalid(format!("user {user:?}: tokenFile {f} is empty")));
        }
        return Ok(Some(Secret::new(t)));
    }
    Ok(info
        .token
        .as_ref()
        .map(|t| t.expose_secret().to_string())
        .filter(|t| !t.is_empty())
        .map(Secret::new))
}

/// The exec entry, checked as client-go checks it.
fn exec_config(
    entry: &Entry<'_>,
    e: &kube::config::ExecConfig,
    cluster: &ClusterInfo<'_>,
) -> Result<ExecConfig, ClusterError> {
    let command = e.command.clone().unwrap_or_default();
    let args = e.args.clone().unwrap_or_default();
    let bad = |message: String| ClusterError::ExecPlugin {
        kubeconfig: entry.kubeconfig.to_string(),
        user: entry.user.to_string(),
        command: super::exec::redacted_command(
            if command.is_empty() { "?" } else { &command },
            &args,
        ),
        message,
    };
    if command.trim().is_empty() {
        return Err(bad("the exec entry names no command".into()));
    }
    let api_version = e.api_version.clone().unwrap_or_default();
    if !API_VERSIONS.contains(&api_version.as_str()) {
        return Err(bad(format!(
            "apiVersion {api_version:?} is not supported (supported: {})",
            API_VERSIONS.join(", ")
        )));
    }
    let interactive_mode = match &e.interactive_mode {
        Some(ExecInteractiveMode::Never) => "Never",
        Some(ExecInteractiveMode::IfAvailable) => "IfAvailable",
        Some(ExecInteractiveMode::Always) => "Always",
        // As client-go: required in v1, IfAvailable by default in v1beta1.
        None if api_version.ends_with("/v1") => {
            return Err(bad(
                "interactiveMode must be set for client.authentication.k8s.io/v1".into(),
            ))
        }
        None => "IfAvailable",
    };
    let mut env = Vec::new();
    for v in e.env.iter().flatten() {
        let name = v.get("name").cloned().unwrap_or_default();
        if name.is_empty() {
            return Err(bad("an env entry has no name".into()));
        }
        env.push((
            name,
            Secret::new(v.get("value").cloned().unwrap_or_default()),
        ));
    }
    Ok(ExecConfig {
        kubeconfig: entry.kubeconfig.to_string(),
        user: entry.user.to_string(),
        api_version,
        command,
        args,
        env,
        install_hint: e.install_hint.clone().filter(|h| !h.trim().is_empty()),
        provide_cluster_info: e.provide_cluster_info,
        interactive_mode: interactive_mode.to_string(),
        server: cluster.server.to_string(),
        ca_pem: cluster.ca_pem.map(<[u8]>::to_vec),
        insecure_skip_tls_verify: cluster.insecure_skip_tls_verify,
    })
}

/// The bearer token of an auth-provider entry: oidc's `id-token`; gcp and azure as client-go
/// 1.26+ (and so helm and kubectl) treat them: removed.
pub(crate) fn auth_provider_token(
    entry: &Entry<'_>,
    p: &AuthProviderConfig,
    now: std::time::SystemTime,
) -> Result<Secret, ClusterError> {
    let unsupported = |hint: String| ClusterError::AuthProviderUnsupported {
        kubeconfig: entry.kubeconfig.to_string(),
        user: entry.user.to_string(),
        provider: p.name.clone(),
        hint,
    };
    match p.name.as_str() {
        "oidc" => {
            let Some(token) = p.config.get("id-token").filter(|t| !t.is_empty()) else {
                return Err(unsupported(
                    "it has no id-token: log in once with kubectl (it saves the id-token into the kubeconfig), or use an exec plugin such as kubelogin".into(),
                ));
            };
            if jwt_expired(token, now) {
                return Err(unsupported(
                    "its id-token has expired: run any kubectl command with this context once (kubectl refreshes the id-token with the refresh-token and saves it), then run again; or use an exec plugin such as kubelogin".into(),
                ));
            }
            Ok(Secret::new(token.as_str()))
        }
        "gcp" => Err(unsupported(
            "client-go removed the gcp auth plugin in Kubernetes 1.26, so helm and kubectl refuse it too: install gke-gcloud-auth-plugin and use its exec entry (gcloud container clusters get-credentials writes one)".into(),
        )),
        "azure" => Err(unsupported(
            "client-go removed the azure auth plugin in Kubernetes 1.26, so helm and kubectl refuse it too: use kubelogin (kubelogin convert-kubeconfig writes its exec entry)".into(),
        )),
        _ => Err(unsupported(
            "only the oidc auth-provider exists in client-go (and so in helm); use an exec plugin".into(),
        )),
    }
}

/// A JWT whose `exp` claim is in the past. Anything that does not read as a JWT is not
/// known to be expired (the server decides).
fn jwt_expired(token: &str, now: std::time::SystemTime) -> bool {
    let Some(payload) = token.split('.').nth(1) else {
        return false;
    };
    let Ok(bytes) =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload.trim_end_matches('='))
    else {
        return false;
    };
    let Ok(claims) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return false;
    };
    let Some(exp) = claims.get("exp").and_then(serde_json::Value::as_u64) else {
        return false;
    };
    now.duration_since(std::time::UNIX_EPOCH)
        .is_ok_and(|n| n.as_secs() >= exp)
}

/// `client-certificate(-data)` and `client-key(-data)`: both or neither.
fn client_identity(
    entry: &Entry<'_>,
    info: &AuthInfo,
) -> Result<Option<ClientIdentity>, ClusterError> {
    let user = entry.user;
    let cert = match (
        non_empty(info.client_certificate_data.as_deref()),
        non_empty(info.client_certificate.as_deref()),
    ) {
        (Some(d), _) => Some(decode_b64(d).ok_or_else(|| {
            entry.invalid(format!(
                "user {user:?}: client-certificate-data is not valid base64"
            ))
        })?),
        (None, Some(f)) => Some(entry.file("client-certificate", f)?),
        (None, None) => None,
    };
    let key_data = info
        .client_key_data
        .as_ref()
        .map(|k| k.expose_secret().to_string());
    let key = match (
        non_empty(key_data.as_deref()),
        non_empty(info.client_key.as_deref()),
    ) {
        (Some(d), _) => Some(SecretBytes::new(decode_b64(d).ok_or_else(|| {
            entry.invalid(format!(
                "user {user:?}: client-key-data is not valid base64"
            ))
        })?)),
        (None, Some(f)) => Some(SecretBytes::new(entry.file("client-key", f)?)),
        (None, None) => None,
    };
    match (cert, key) {
        (Some(certificate_pem), Some(key_pem)) => Ok(Some(ClientIdentity {
            certificate_pem,
            key_pem,
        })),
        (Some(_), None) => Err(entry.invalid(format!(
            "user {user:?} has a client certificate but no client key"
        ))),
        (None, Some(_)) => Err(entry.invalid(format!(
            "user {user:?} has a client key but no client certificate"
        ))),
        (None, None) => Ok(None),
    }
}

/// `as`, `as-uid`, `as-groups`, `as-user-extra`; the others need `as` (client-go's rule).
fn impersonation(entry: &Entry<'_>, info: &AuthInfo) -> Result<Impersonation, ClusterError> {
    let imp = Impersonation {
        user: non_empty(info.impersonate.as_deref()).map(str::to_string),
        uid: non_empty(info.impersonate_uid.as_deref()).map(str::to_string),
        groups: info.impersonate_groups.clone().unwrap_or_default(),
        extra: info
            .impersonate_user_extra
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
    };
    if imp.user.is_none() && !imp.is_empty() {
        return Err(entry.invalid(format!(
            "user {:?} impersonates a uid, groups or extras without a user name (as); set as as well, as kubectl requires",
            entry.user
        )));
    }
    Ok(imp)
}

pub(crate) fn non_empty(s: Option<&str>) -> Option<&str> {
    s.map(str::trim).filter(|s| !s.is_empty())
}

/// Standard base64, whitespace (line breaks in hand-edited files) ignored.
pub(crate) fn decode_b64(data: &str) -> Option<Vec<u8>> {
    let compact: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .ok()
}

/// `file` made absolute against `dir` (the directory of the kubeconfig that names it).
pub(crate) fn absolute(dir: &Path, file: &str) -> String {
    let p = Path::new(file);
    if p.is_relative() && !file.is_empty() {
        dir.join(p).to_string_lossy().into_owned()
    } else {
        file.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    fn entry() -> Entry<'static> {
        Entry {
            kubeconfig: "/k/a.yaml:/k/b.yaml",
            user: "oidc-user",
        }
    }

    fn provider(name: &str, config: &[(&str, &str)]) -> AuthProviderConfig {
        AuthProviderConfig {
            name: name.into(),
            config: config
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn jwt(exp: u64) -> String {
        let b = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "{}.{}.sig",
            b.encode(r#"{"alg":"RS256"}"#),
            b.encode(format!(r#"{{"iss":"https://idp","exp":{exp}}}"#))
        )
    }

    #[test]
    fn oidc_id_token_is_used_until_it_expires() {
        let now = UNIX_EPOCH + Duration::from_secs(2_000_000_000);
        let fresh = jwt(2_000_000_600);
        let t =
            auth_provider_token(&entry(), &provider("oidc", &[("id-token", &fresh)]), now).unwrap();
        assert_eq!(t.expose(), fresh);
        let old = jwt(1_999_999_000);
        let m = auth_provider_token(
            &entry(),
            &provider(
                "oidc",
                &[("id-token", &old), ("refresh-token", "rt-secret")],
            ),
            now,
        )
        .unwrap_err()
        .to_string();
        assert!(m.contains("expired") && m.contains("kubectl"), "{m}");
        assert!(
            m.contains("oidc-user") && m.contains("/k/a.yaml:/k/b.yaml"),
            "{m}"
        );
        assert!(!m.contains(&old) && !m.contains("rt-secret"), "{m}");
        // Not a JWT: the server decides.
        let t = auth_provider_token(&entry(), &provider("oidc", &[("id-token", "opaque")]), now)
            .unwrap();
        assert_eq!(t.expose(), "opaque");
    }

    #[test]
    fn gcp_azure_and_others_are_refused_as_client_go_does() {
        let now = SystemTime::now();
        for (name, needle) in [
            ("gcp", "gke-gcloud-auth-plugin"),
            ("azure", "kubelogin"),
            ("openstack", "exec plugin"),
        ] {
            let m = auth_provider_token(
                &entry(),
                &provider(name, &[("access-token", "ya29.secret")]),
                now,
            )
            .unwrap_err()
            .to_string();
            assert!(m.contains(needle) && m.contains(name), "{m}");
            assert!(!m.contains("ya29.secret"), "{m}");
        }
    }

    #[test]
    fn impersonation_needs_a_user() {
        let mut info = AuthInfo {
            impersonate_groups: Some(vec!["system:masters".into()]),
            ..Default::default()
        };
        let m = impersonation(&entry(), &info).unwrap_err().to_string();
        assert!(m.contains("without a user name"), "{m}");
        info.impersonate = Some("jane".into());
        info.impersonate_uid = Some("42".into());
        let i = impersonation(&entry(), &info).unwrap();
        assert_eq!(i.user.as_deref(), Some("jane"));
        assert_eq!(i.groups, ["system:masters"]);
    }
}
