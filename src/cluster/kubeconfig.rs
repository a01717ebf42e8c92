//! Kubeconfig loading: find the file, pick the context, resolve the cluster and user entries
//! into what [`super::KubeClient`] needs.
//!
//! Supported, as kubectl reads them: `server`, `certificate-authority`,
//! `certificate-authority-data`, `insecure-skip-tls-verify`, `proxy-url` (HTTP(S) proxies);
//! user `token`, `tokenFile` (wins over `token`, as in client-go), `client-certificate(-data)` +
//! `client-key(-data)`, `username`/`password`. `*-data` wins over the file form. Relative file
//! paths are relative to the kubeconfig's directory.
//!
//! `exec` credential plugins (EKS's `aws eks get-token`, GKE's `gke-gcloud-auth-plugin`,
//! `kubelogin`) are run as client-go runs them ([`super::exec`]).
//!
//! Not supported in this version, each reported with a clear error naming the user entry:
//! `auth-provider` (oidc, gcp, azure), impersonation (`as`, `as-groups`...), and
//! `tls-server-name`. Only one kubeconfig file is read: with a `$KUBECONFIG` list, the first
//! entry that exists (kubectl would merge them all).

use super::exec::{ExecConfig, API_VERSIONS};
use super::secret::{Secret, SecretBytes};
use super::ClusterError;
use base64::Engine as _;
use serde::Deserialize;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// A resolved kubeconfig: one context, its cluster and its user.
#[derive(Debug, Clone)]
pub struct Kubeconfig {
    /// The file it was read from.
    pub path: PathBuf,
    /// The context used.
    pub context: String,
    /// The cluster entry's name.
    pub cluster: String,
    /// The user entry's name (empty for an anonymous context).
    pub user: String,
    /// The context's default namespace, if any.
    pub namespace: Option<String>,
    /// The API server URL, as written (`https://host:6443`, maybe with a path prefix).
    pub server: String,
    /// PEM CA bundle to trust instead of the system roots.
    pub ca_pem: Option<Vec<u8>>,
    /// Skip verification of the server certificate.
    pub insecure_skip_tls_verify: bool,
    /// HTTP(S) proxy for the API server (may embed credentials, so kept as a secret).
    pub proxy_url: Option<Secret>,
    /// Token or basic credentials.
    pub credentials: Credentials,
    /// TLS client certificate and key.
    pub client_identity: Option<ClientIdentity>,
}

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

/// Find the kubeconfig file: `explicit` (`--kubeconfig`), else the first existing entry of
/// `kubeconfig_env` (the value of `$KUBECONFIG`, a path list), else `<home>/.kube/config`.
/// The caller reads the environment and passes it in.
pub fn locate(
    explicit: Option<&Path>,
    kubeconfig_env: Option<&OsStr>,
    home: Option<&Path>,
) -> Result<PathBuf, ClusterError> {
    if let Some(p) = explicit {
        if p.is_file() {
            return Ok(p.to_path_buf());
        }
        return Err(ClusterError::NoKubeconfig {
            tried: format!("--kubeconfig {}", p.display()),
        });
    }
    let mut tried = Vec::new();
    if let Some(env) = kubeconfig_env.filter(|v| !v.is_empty()) {
        let entries: Vec<PathBuf> = std::env::split_paths(env)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
        if let Some(p) = entries.iter().find(|p| p.is_file()) {
            return Ok(p.clone());
        }
        let list: Vec<String> = entries.iter().map(|p| p.display().to_string()).collect();
        // kubectl does not fall back to ~/.kube/config when KUBECONFIG is set: neither do we.
        return Err(ClusterError::NoKubeconfig {
            tried: format!("KUBECONFIG={}", list.join(":")),
        });
    }
    if let Some(h) = home {
        let p = h.join(".kube").join("config");
        if p.is_file() {
            return Ok(p);
        }
        tried.push(p.display().to_string());
    } else {
        tried.push("~/.kube/config (no home directory)".into());
    }
    Err(ClusterError::NoKubeconfig {
        tried: tried.join(", "),
    })
}

/// Read `path` and resolve `context` (or the current context).
pub fn load(path: &Path, context: Option<&str>) -> Result<Kubeconfig, ClusterError> {
    // Bounded like every input: the parse refuses more than this anyway, so a bigger file (or
    // an endless one) is not read whole first.
    let text = crate::store::body::read_file_bounded(path, crate::yaml::KUBECONFIG.max_bytes)
        .and_then(|b| String::from_utf8(b).map_err(std::io::Error::other))
        .map_err(|source| ClusterError::ReadKubeconfig {
            path: path.to_path_buf(),
            source,
        })?;
    parse(&text, path, context)
}

/// Resolve kubeconfig `text`; `path` names it in errors and its directory anchors relative
/// file paths.
pub fn parse(text: &str, path: &Path, context: Option<&str>) -> Result<Kubeconfig, ClusterError> {
    let invalid = |message: String| ClusterError::InvalidKubeconfig {
        path: path.to_path_buf(),
        message,
    };
    if text.trim().is_empty() {
        return Err(invalid("the file is empty".into()));
    }
    // Bounded in size, depth and nodes like every YAML input (crate::yaml).
    let raw: RawConfig =
        crate::yaml::parse("kubeconfig", text.as_bytes(), &crate::yaml::KUBECONFIG)
            .map_err(|e| invalid(format!("not a valid kubeconfig: {}", e.reason())))?;
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let contexts = raw.contexts.unwrap_or_default();
    let wanted = match context.filter(|c| !c.is_empty()) {
        Some(c) => c.to_string(),
        None => match raw.current_context.filter(|c| !c.is_empty()) {
            Some(c) => c,
            None => {
                let names: Vec<&str> = contexts.iter().map(|c| c.name.as_str()).collect();
                return Err(invalid(format!(
                    "no current-context is set; pass --context (contexts: {})",
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                )));
            }
        },
    };
    let Some(ctx) = contexts.iter().find(|c| c.name == wanted) else {
        let names: Vec<&str> = contexts.iter().map(|c| c.name.as_str()).collect();
        return Err(ClusterError::ContextNotFound {
            path: path.to_path_buf(),
            context: wanted,
            available: if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            },
        });
    };
    let ctx_body = ctx.context.clone().unwrap_or_default();
    let cluster_name = ctx_body.cluster.unwrap_or_default();
    if cluster_name.is_empty() {
        return Err(invalid(format!("context {wanted:?} names no cluster")));
    }
    let clusters = raw.clusters.unwrap_or_default();
    let cluster = clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .ok_or_else(|| {
            invalid(format!(
                "cluster {cluster_name:?} (of context {wanted:?}) not found"
            ))
        })?
        .cluster
        .clone()
        .unwrap_or_default();
    let server = cluster.server.unwrap_or_default().trim().to_string();
    if server.is_empty() {
        return Err(invalid(format!("cluster {cluster_name:?} has no server")));
    }
    if !(server.starts_with("https://") || server.starts_with("http://")) {
        return Err(invalid(format!(
            "cluster {cluster_name:?}: server {server:?} is not an http(s) URL"
        )));
    }
    if cluster
        .tls_server_name
        .as_deref()
        .is_some_and(|s| !s.is_empty())
    {
        return Err(invalid(format!(
            "cluster {cluster_name:?} sets tls-server-name, which koord-bundle does not support in this version"
        )));
    }
    let ca_pem = match (
        non_empty(cluster.ca_data.as_deref()),
        non_empty(cluster.ca_file.as_deref()),
    ) {
        (Some(data), _) => Some(decode_b64(data).ok_or_else(|| {
            invalid(format!(
                "cluster {cluster_name:?}: certificate-authority-data is not valid base64"
            ))
        })?),
        (None, Some(file)) => {
            let file = resolve(&base, file);
            Some(
                std::fs::read(&file).map_err(|source| ClusterError::CredentialFile {
                    path: path.to_path_buf(),
                    what: format!("cluster {cluster_name:?} certificate-authority"),
                    file,
                    source,
                })?,
            )
        }
        (None, None) => None,
    };
    let proxy_url = cluster.proxy_url.filter(|p| !p.is_empty());

    let user_name = ctx_body.user.unwrap_or_default();
    let user = if user_name.is_empty() {
        RawUser::default()
    } else {
        raw.users
            .unwrap_or_default()
            .into_iter()
            .find(|u| u.name == user_name)
            .ok_or_else(|| {
                invalid(format!(
                    "user {user_name:?} (of context {wanted:?}) not found"
                ))
            })?
            .user
            .unwrap_or_default()
    };
    let exec = match &user.exec {
        None => None,
        Some(e) => {
            let command = e.command.clone().unwrap_or_default();
            let bad = |message: String| ClusterError::ExecPlugin {
                path: path.to_path_buf(),
                user: user_name.clone(),
                command: e.display_command(),
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
            let interactive_mode = match e.interactive_mode.as_deref().filter(|m| !m.is_empty()) {
                Some(m @ ("Never" | "IfAvailable" | "Always")) => m.to_string(),
                Some(m) => {
                    return Err(bad(format!(
                        "interactiveMode {m:?} is not Never, IfAvailable or Always"
                    )))
                }
                // As client-go: required in v1, IfAvailable by default in v1beta1.
                None if api_version.ends_with("/v1") => {
                    return Err(bad(
                        "interactiveMode must be set for client.authentication.k8s.io/v1".into(),
                    ))
                }
                None => "IfAvailable".into(),
            };
            let env = e
                .env
                .iter()
                .flatten()
                .map(|v| {
                    (
                        v.name.clone(),
                        v.value.clone().unwrap_or_else(|| Secret::new("")),
                    )
                })
                .collect();
            Some(ExecConfig {
                kubeconfig: path.to_path_buf(),
                user: user_name.clone(),
                api_version,
                command,
                args: e.args.clone().unwrap_or_default(),
                env,
                install_hint: e.install_hint.clone().filter(|h| !h.trim().is_empty()),
                provide_cluster_info: e.provide_cluster_info.unwrap_or(false),
                interactive_mode,
                server: server.clone(),
                ca_pem: None,
                insecure_skip_tls_verify: cluster.insecure_skip_tls_verify.unwrap_or(false),
            })
        }
    };
    if let Some(ap) = &user.auth_provider {
        return Err(ClusterError::AuthProviderUnsupported {
            path: path.to_path_buf(),
            user: user_name,
            provider: ap.name.clone().unwrap_or_default(),
        });
    }
    if non_empty(user.impersonate.as_deref()).is_some()
        || user
            .impersonate_uid
            .as_deref()
            .is_some_and(|s| !s.is_empty())
        || user
            .impersonate_groups
            .as_ref()
            .is_some_and(|g| !g.is_empty())
    {
        return Err(invalid(format!(
            "user {user_name:?} impersonates another identity (as / as-groups), which koord-bundle does not support in this version"
        )));
    }

    let user_file = |what: &str, file: &str| -> Result<Vec<u8>, ClusterError> {
        let file = resolve(&base, file);
        std::fs::read(&file).map_err(|source| ClusterError::CredentialFile {
            path: path.to_path_buf(),
            what: format!("user {user_name:?} {what}"),
            file,
            source,
        })
    };
    let token = match non_empty(user.token_file.as_deref()) {
        Some(f) => {
            let bytes = user_file("tokenFile", f)?;
            let t = String::from_utf8(bytes)
                .map_err(|_| invalid(format!("user {user_name:?}: tokenFile {f} is not text")))?;
            let t = t.trim().to_string();
            if t.is_empty() {
                return Err(invalid(format!(
                    "user {user_name:?}: tokenFile {f} is empty"
                )));
            }
            Some(Secret::new(t))
        }
        None => user.token.filter(|t| !t.is_empty()),
    };
    let username = user.username.filter(|u| !u.is_empty());
    if exec.is_some() && (token.is_some() || username.is_some()) {
        return Err(invalid(format!(
            "user {user_name:?} sets both an exec plugin and a token or username/password; only one may be set"
        )));
    }
    let credentials = match (token, username) {
        _ if exec.is_some() => {
            let mut e = exec.map(Box::new).ok_or_else(|| invalid("exec".into()))?;
            e.ca_pem = ca_pem.clone();
            Credentials::Exec(e)
        }
        (Some(_), Some(_)) => {
            return Err(invalid(format!(
                "user {user_name:?} sets both a token and a username/password; only one may be set"
            )))
        }
        (Some(t), None) => Credentials::Bearer(t),
        (None, Some(u)) => Credentials::Basic {
            username: u,
            password: user.password.unwrap_or_else(|| Secret::new("")),
        },
        (None, None) => Credentials::None,
    };

    let cert = match (
        non_empty(user.client_certificate_data.as_deref()),
        non_empty(user.client_certificate.as_deref()),
    ) {
        (Some(d), _) => Some(decode_b64(d).ok_or_else(|| {
            invalid(format!(
                "user {user_name:?}: client-certificate-data is not valid base64"
            ))
        })?),
        (None, Some(f)) => Some(user_file("client-certificate", f)?),
        (None, None) => None,
    };
    let key = match (
        user.client_key_data.as_ref().filter(|k| !k.is_empty()),
        non_empty(user.client_key.as_deref()),
    ) {
        (Some(d), _) => Some(SecretBytes::new(decode_b64(d.expose()).ok_or_else(
            || {
                invalid(format!(
                    "user {user_name:?}: client-key-data is not valid base64"
                ))
            },
        )?)),
        (None, Some(f)) => Some(SecretBytes::new(user_file("client-key", f)?)),
        (None, None) => None,
    };
    let client_identity = match (cert, key) {
        (Some(certificate_pem), Some(key_pem)) => Some(ClientIdentity {
            certificate_pem,
            key_pem,
        }),
        (Some(_), None) => {
            return Err(invalid(format!(
                "user {user_name:?} has a client certificate but no client key"
            )))
        }
        (None, Some(_)) => {
            return Err(invalid(format!(
                "user {user_name:?} has a client key but no client certificate"
            )))
        }
        (None, None) => None,
    };

    Ok(Kubeconfig {
        path: path.to_path_buf(),
        context: wanted,
        cluster: cluster_name,
        user: user_name,
        namespace: ctx_body.namespace.filter(|n| !n.is_empty()),
        server,
        ca_pem,
        insecure_skip_tls_verify: cluster.insecure_skip_tls_verify.unwrap_or(false),
        proxy_url,
        credentials,
        client_identity,
    })
}

fn non_empty(s: Option<&str>) -> Option<&str> {
    s.map(str::trim).filter(|s| !s.is_empty())
}

fn resolve(base: &Path, file: &str) -> PathBuf {
    let p = Path::new(file);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

/// Standard base64, whitespace (line breaks in hand-edited files) ignored.
fn decode_b64(data: &str) -> Option<Vec<u8>> {
    let compact: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .ok()
}

#[derive(Deserialize, Default)]
struct RawConfig {
    #[serde(rename = "current-context", default)]
    current_context: Option<String>,
    #[serde(default)]
    clusters: Option<Vec<NamedCluster>>,
    #[serde(default)]
    contexts: Option<Vec<NamedContext>>,
    #[serde(default)]
    users: Option<Vec<NamedUser>>,
}

#[derive(Deserialize)]
struct NamedCluster {
    name: String,
    #[serde(default)]
    cluster: Option<RawCluster>,
}

#[derive(Deserialize, Default, Clone)]
struct RawCluster {
    #[serde(default)]
    server: Option<String>,
    #[serde(rename = "certificate-authority", default)]
    ca_file: Option<String>,
    #[serde(rename = "certificate-authority-data", default)]
    ca_data: Option<String>,
    #[serde(rename = "insecure-skip-tls-verify", default)]
    insecure_skip_tls_verify: Option<bool>,
    #[serde(rename = "tls-server-name", default)]
    tls_server_name: Option<String>,
    #[serde(rename = "proxy-url", default)]
    proxy_url: Option<Secret>,
}

#[derive(Deserialize)]
struct NamedContext {
    name: String,
    #[serde(default)]
    context: Option<RawContext>,
}

#[derive(Deserialize, Default, Clone)]
struct RawContext {
    #[serde(default)]
    cluster: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
}

#[derive(Deserialize)]
struct NamedUser {
    name: String,
    #[serde(default)]
    user: Option<RawUser>,
}

#[derive(Deserialize, Default)]
struct RawUser {
    #[serde(default)]
    token: Option<Secret>,
    #[serde(rename = "tokenFile", default)]
    token_file: Option<String>,
    #[serde(rename = "client-certificate", default)]
    client_certificate: Option<String>,
    #[serde(rename = "client-certificate-data", default)]
    client_certificate_data: Option<String>,
    #[serde(rename = "client-key", default)]
    client_key: Option<String>,
    #[serde(rename = "client-key-data", default)]
    client_key_data: Option<Secret>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<Secret>,
    #[serde(default)]
    exec: Option<RawExec>,
    #[serde(rename = "auth-provider", default)]
    auth_provider: Option<RawAuthProvider>,
    #[serde(rename = "as", default)]
    impersonate: Option<String>,
    #[serde(rename = "as-uid", default)]
    impersonate_uid: Option<String>,
    #[serde(rename = "as-groups", default)]
    impersonate_groups: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawExec {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    command: Option<String>,
    #[serde(default)]
    args: Option<Vec<String>>,
    #[serde(default)]
    env: Option<Vec<RawEnv>>,
    #[serde(default)]
    install_hint: Option<String>,
    #[serde(default)]
    provide_cluster_info: Option<bool>,
    #[serde(default)]
    interactive_mode: Option<String>,
}

#[derive(Deserialize)]
struct RawEnv {
    name: String,
    #[serde(default)]
    value: Option<Secret>,
}

impl RawExec {
    fn display_command(&self) -> String {
        redacted_command(
            self.command.as_deref().unwrap_or("?"),
            self.args.as_deref().unwrap_or_default(),
        )
    }
}

/// The command line, with the value of any flag whose name suggests a credential (`--token`,
/// `--client-secret`, `--password`, `--key`...) replaced by `<redacted>`.
pub(crate) fn redacted_command(command: &str, args: &[String]) -> String {
    {
        let sensitive = |flag: &str| {
            let f = flag.trim_start_matches('-').to_ascii_lowercase();
            ["token", "secret", "password", "passwd", "key", "credential"]
                .iter()
                .any(|w| f.contains(w))
        };
        let mut parts = vec![command.to_string()];
        let mut redact_next = false;
        for a in args {
            if redact_next {
                parts.push("<redacted>".into());
                redact_next = false;
            } else if a.starts_with('-') && sensitive(a.split('=').next().unwrap_or(a)) {
                match a.split_once('=') {
                    Some((flag, _)) => parts.push(format!("{flag}=<redacted>")),
                    None => {
                        parts.push(a.clone());
                        redact_next = true;
                    }
                }
            } else {
                parts.push(a.clone());
            }
        }
        parts.join(" ")
    }
}

#[derive(Deserialize)]
struct RawAuthProvider {
    #[serde(default)]
    name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN_CFG: &str = r#"
apiVersion: v1
kind: Config
current-context: kind-kind
clusters:
- name: kind-kind
  cluster:
    server: https://127.0.0.1:40123
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUMKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=
- name: other
  cluster:
    server: https://10.0.0.1:6443
    certificate-authority: ca/other.crt
    insecure-skip-tls-verify: true
contexts:
- name: kind-kind
  context: {cluster: kind-kind, user: kind-kind}
- name: other
  context: {cluster: other, user: basic, namespace: tools}
- name: anon
  context: {cluster: kind-kind}
users:
- name: kind-kind
  user:
    token: abc.def.ghi
- name: basic
  user:
    username: admin
    password: 123456
"#;

    fn p() -> PathBuf {
        PathBuf::from("/nonexistent/kube/config")
    }

    #[test]
    fn current_context_with_token_and_ca_data() {
        let k = parse(TOKEN_CFG, &p(), None).unwrap();
        assert_eq!(k.context, "kind-kind");
        assert_eq!(k.cluster, "kind-kind");
        assert_eq!(k.user, "kind-kind");
        assert_eq!(k.server, "https://127.0.0.1:40123");
        assert_eq!(
            k.credentials,
            Credentials::Bearer(Secret::new("abc.def.ghi"))
        );
        assert!(k
            .ca_pem
            .as_deref()
            .unwrap()
            .starts_with(b"-----BEGIN CERTIFICATE-----"));
        assert!(!k.insecure_skip_tls_verify);
        // Debug shows no token.
        assert!(!format!("{k:?}").contains("abc.def.ghi"));
    }

    #[test]
    fn explicit_context_basic_auth_and_relative_ca_file() {
        let e = parse(TOKEN_CFG, &p(), Some("other"))
            .unwrap_err()
            .to_string();
        // The CA file is resolved against the kubeconfig's directory.
        assert!(e.contains("/nonexistent/kube/ca/other.crt"), "{e}");
        assert!(e.contains("certificate-authority"), "{e}");

        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("ca")).unwrap();
        std::fs::write(dir.path().join("ca/other.crt"), b"PEM").unwrap();
        let cfg = dir.path().join("config");
        std::fs::write(&cfg, TOKEN_CFG).unwrap();
        let k = load(&cfg, Some("other")).unwrap();
        assert_eq!(k.ca_pem.as_deref(), Some(&b"PEM"[..]));
        assert!(k.insecure_skip_tls_verify);
        assert_eq!(k.namespace.as_deref(), Some("tools"));
        match &k.credentials {
            Credentials::Basic { username, password } => {
                assert_eq!(username, "admin");
                assert_eq!(password.expose(), "123456");
            }
            c => panic!("expected basic, got {c:?}"),
        }
        assert!(!format!("{k:?}").contains("123456"));
    }

    #[test]
    fn anonymous_context() {
        let k = parse(TOKEN_CFG, &p(), Some("anon")).unwrap();
        assert_eq!(k.user, "");
        assert_eq!(k.credentials, Credentials::None);
    }

    #[test]
    fn unknown_context_lists_the_known_ones() {
        let e = parse(TOKEN_CFG, &p(), Some("prod"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"prod\" not found"), "{e}");
        assert!(e.contains("kind-kind, other, anon"), "{e}");
        assert!(e.contains("/nonexistent/kube/config"), "{e}");
    }

    #[test]
    fn exec_plugin_entries_are_read_as_client_go_reads_them() {
        let cfg = r#"
current-context: arn:aws:eks:eu-west-1:111122223333:cluster/prod
clusters:
- name: arn:aws:eks:eu-west-1:111122223333:cluster/prod
  cluster: {server: "https://ABCD.gr7.eu-west-1.eks.amazonaws.com", certificate-authority-data: UEVN}
contexts:
- name: arn:aws:eks:eu-west-1:111122223333:cluster/prod
  context: {cluster: "arn:aws:eks:eu-west-1:111122223333:cluster/prod", user: "arn:aws:eks:eu-west-1:111122223333:cluster/prod"}
users:
- name: arn:aws:eks:eu-west-1:111122223333:cluster/prod
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: aws
      args: [--region, eu-west-1, eks, get-token, --cluster-name, prod]
      env: [{name: AWS_PROFILE, value: prod}]
      installHint: install the AWS CLI
      provideClusterInfo: true
"#;
        let k = parse(cfg, &p(), None).unwrap();
        let Credentials::Exec(e) = &k.credentials else {
            panic!("{:?}", k.credentials)
        };
        assert_eq!(e.command, "aws");
        assert_eq!(e.args.len(), 6);
        assert_eq!(e.env[0].0, "AWS_PROFILE");
        assert_eq!(e.env[0].1.expose(), "prod");
        assert_eq!(e.interactive_mode, "IfAvailable");
        assert!(e.provide_cluster_info);
        assert_eq!(e.ca_pem.as_deref(), Some(&b"PEM"[..]));
        assert_eq!(e.install_hint.as_deref(), Some("install the AWS CLI"));
        // v1 needs interactiveMode; unknown versions are refused, naming the command.
        let v1 = cfg.replace("v1beta1", "v1");
        let m = parse(&v1, &p(), None).unwrap_err().to_string();
        assert!(m.contains("interactiveMode must be set"), "{m}");
        assert!(
            m.contains("aws --region eu-west-1 eks get-token --cluster-name prod"),
            "{m}"
        );
        let old = cfg.replace("v1beta1", "v1alpha1");
        let m = parse(&old, &p(), None).unwrap_err().to_string();
        assert!(m.contains("v1alpha1") && m.contains("not supported"), "{m}");
    }

    #[test]
    fn exec_command_shows_subcommands_not_flag_values() {
        let args: Vec<String> = ["eks", "get-token", "--token", "s3cr3t"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            redacted_command("aws", &args),
            "aws eks get-token --token <redacted>"
        );
        let args: Vec<String> = ["get-token", "--client-secret=shh", "--server-id", "abc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            redacted_command("kubelogin", &args),
            "kubelogin get-token --client-secret=<redacted> --server-id abc"
        );
    }

    #[test]
    fn auth_provider_is_refused_clearly() {
        let cfg = r#"
current-context: c
clusters: [{name: c, cluster: {server: "https://k:6443"}}]
contexts: [{name: c, context: {cluster: c, user: oidc-user}}]
users:
- name: oidc-user
  user:
    auth-provider:
      name: oidc
      config: {id-token: eyJsecret, client-secret: shh}
"#;
        let m = parse(cfg, &p(), None).unwrap_err().to_string();
        assert!(m.contains("\"oidc\" auth-provider"), "{m}");
        assert!(m.contains("oidc-user"), "{m}");
        assert!(!m.contains("eyJsecret") && !m.contains("shh"), "{m}");
    }

    #[test]
    fn token_file_wins_and_client_cert_files_resolve_relative() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "from-file\n").unwrap();
        std::fs::write(dir.path().join("client.crt"), "CERT").unwrap();
        std::fs::write(dir.path().join("client.key"), "KEY").unwrap();
        let cfg = r#"
current-context: c
clusters: [{name: c, cluster: {server: "https://k:6443"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users:
- name: u
  user: {token: inline, tokenFile: token, client-certificate: client.crt, client-key: client.key}
"#;
        let path = dir.path().join("kc.yaml");
        std::fs::write(&path, cfg).unwrap();
        let k = load(&path, None).unwrap();
        assert_eq!(k.credentials, Credentials::Bearer(Secret::new("from-file")));
        let id = k.client_identity.unwrap();
        assert_eq!(id.certificate_pem, b"CERT");
        assert_eq!(id.key_pem.expose(), b"KEY");
    }

    #[test]
    fn half_a_client_identity_is_an_error() {
        let cfg = r#"
current-context: c
clusters: [{name: c, cluster: {server: "https://k:6443"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {client-certificate-data: Q0VSVA==}}]
"#;
        let m = parse(cfg, &p(), None).unwrap_err().to_string();
        assert!(m.contains("no client key"), "{m}");
    }

    #[test]
    fn bad_key_data_does_not_echo_it() {
        let cfg = r#"
current-context: c
clusters: [{name: c, cluster: {server: "https://k:6443"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {client-certificate-data: Q0VSVA==, client-key-data: "not*base64*SECRET"}}]
"#;
        let m = parse(cfg, &p(), None).unwrap_err().to_string();
        assert!(m.contains("client-key-data is not valid base64"), "{m}");
        assert!(!m.contains("SECRET"), "{m}");
    }

    #[test]
    fn missing_server_and_missing_user_entry() {
        let cfg = "current-context: c\nclusters: [{name: c, cluster: {}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n";
        let m = parse(cfg, &p(), None).unwrap_err().to_string();
        assert!(m.contains("cluster \"c\" has no server"), "{m}");
        let cfg = "current-context: c\nclusters: [{name: c, cluster: {server: 'https://k'}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n";
        let m = parse(cfg, &p(), None).unwrap_err().to_string();
        assert!(m.contains("user \"u\" (of context \"c\") not found"), "{m}");
    }

    #[test]
    fn no_current_context() {
        let cfg = "clusters: []\ncontexts: [{name: a, context: {cluster: a}}]\n";
        let m = parse(cfg, &p(), None).unwrap_err().to_string();
        assert!(
            m.contains("no current-context") && m.contains("--context") && m.contains("a"),
            "{m}"
        );
    }

    #[test]
    fn token_and_basic_together_is_an_error() {
        let cfg = r#"
current-context: c
clusters: [{name: c, cluster: {server: "https://k:6443"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {token: t0k3n, username: a, password: p4ss}}]
"#;
        let m = parse(cfg, &p(), None).unwrap_err().to_string();
        assert!(m.contains("both a token and a username/password"), "{m}");
        assert!(!m.contains("t0k3n") && !m.contains("p4ss"), "{m}");
    }

    #[test]
    fn locate_order() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir_all(home.join(".kube")).unwrap();
        std::fs::write(home.join(".kube/config"), "x").unwrap();
        let a = dir.path().join("a.yaml");
        let b = dir.path().join("b.yaml");
        std::fs::write(&b, "x").unwrap();

        // --kubeconfig wins, and must exist.
        assert_eq!(locate(Some(&b), None, Some(&home)).unwrap(), b);
        let e = locate(Some(&a), None, Some(&home)).unwrap_err().to_string();
        assert!(e.contains("--kubeconfig") && e.contains("a.yaml"), "{e}");
        // $KUBECONFIG: first existing entry of the list.
        let list = std::env::join_paths([&a, &b]).unwrap();
        assert_eq!(locate(None, Some(&list), Some(&home)).unwrap(), b);
        let only_a = std::env::join_paths([&a]).unwrap();
        let e = locate(None, Some(&only_a), Some(&home))
            .unwrap_err()
            .to_string();
        assert!(e.contains("KUBECONFIG=") && e.contains("a.yaml"), "{e}");
        // Else ~/.kube/config.
        assert_eq!(
            locate(None, None, Some(&home)).unwrap(),
            home.join(".kube/config")
        );
        assert_eq!(
            locate(None, Some(OsStr::new("")), Some(&home)).unwrap(),
            home.join(".kube/config")
        );
        let e = locate(None, None, Some(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no kubeconfig found") && e.contains("--no-install"),
            "{e}"
        );
    }
}
