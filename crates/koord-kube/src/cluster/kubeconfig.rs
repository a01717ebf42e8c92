//! Kubeconfig as kubectl reads it: find the files, merge them, pick the context, resolve its
//! cluster and user into what [`super::KubeClient`] needs.
//!
//! - **Which files** ([`locate`]): `--kubeconfig FILE` (it must exist); else every entry of
//!   `$KUBECONFIG` (a path list; entries that do not exist are skipped, as kubectl skips them;
//!   none existing is an error, and `~/.kube/config` is then not read either, as with
//!   kubectl); else `~/.kube/config`.
//! - **Merged** ([`read`]) by kubectl's rules, with kube's [`kube::config::Kubeconfig::merge`]:
//!   the first file to set a cluster, user or context name wins it whole (a later file's entry of
//!   the same name is dropped, not blended in), and the first file to set a non-empty
//!   `current-context` wins. Relative paths (`certificate-authority`, `client-certificate`,
//!   `client-key`, `tokenFile`, an exec `command` holding a `/`) are resolved against the
//!   directory of the file that names them, before the merge, as client-go does.
//! - **The context**: `--context`, else the merged `current-context`.
//! - **The cluster**: `server` (`https://` or `http://`), `certificate-authority(-data)`,
//!   `insecure-skip-tls-verify`, `tls-server-name`, `proxy-url` (`http`, `https`, `socks5`).
//! - **The user**: see [`super::auth`] (tokens, basic, client certificates, exec plugins,
//!   the oidc auth-provider, impersonation).
//!
//! Each file is bounded like every YAML input ([`koord_base::yaml::KUBECONFIG`]) and parsed by
//! [`koord_base::yaml`] into kube's types. `tests/it/kubeconfig.rs` compares the merged view
//! ([`Merged::minified`]) with `kubectl config view --minify --flatten` for several lists.

use super::auth::{self, ClientIdentity, Credentials, Entry, Impersonation};
use super::ClusterError;
use koord_base::secret::Secret;
use kube::config::{Cluster, Context, Kubeconfig as Raw};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// Where the list of kubeconfig files came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `--kubeconfig FILE`.
    Flag,
    /// `$KUBECONFIG`.
    Env,
    /// `~/.kube/config`.
    Default,
}

/// The kubeconfig files to read, in order (as given: relative paths stay relative to the
/// working directory, as for kubectl), and where the list came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Files {
    /// The files, in merge order (those that do not exist included, for a `$KUBECONFIG` list).
    pub paths: Vec<PathBuf>,
    /// Where the list came from.
    pub origin: Origin,
}

impl Files {
    /// One file given by `--kubeconfig`.
    pub fn one(path: &Path) -> Files {
        Files {
            paths: vec![path.to_path_buf()],
            origin: Origin::Flag,
        }
    }

    /// `a.yaml:b.yaml`: how messages name the configuration.
    pub fn display(&self) -> String {
        self.paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    }

    /// The list as a `KUBECONFIG` value (for helm: its `--kubeconfig` takes one file only).
    pub fn env_value(&self) -> Option<OsString> {
        std::env::join_paths(&self.paths).ok()
    }
}

/// A resolved kubeconfig: one context, its cluster and its user.
#[derive(Debug, Clone)]
pub struct Kubeconfig {
    /// The files it was read from, `a.yaml:b.yaml` (for messages).
    pub kubeconfig: String,
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
    /// The name the server certificate is checked against (and sent as SNI), when not the
    /// server URL's host.
    pub tls_server_name: Option<String>,
    /// HTTP(S) or SOCKS5 proxy for the API server (may embed credentials, so kept secret).
    pub proxy_url: Option<Secret>,
    /// Token or basic credentials, or an exec plugin.
    pub credentials: Credentials,
    /// TLS client certificate and key.
    pub client_identity: Option<ClientIdentity>,
    /// Whom requests act as.
    pub impersonation: Impersonation,
}

/// Find the kubeconfig files: `explicit` (`--kubeconfig`), else the `kubeconfig_env` list
/// (`$KUBECONFIG`), else `<home>/.kube/config`. The caller reads the environment.
pub fn locate(
    explicit: Option<&Path>,
    kubeconfig_env: Option<&OsStr>,
    home: Option<&Path>,
) -> Result<Files, ClusterError> {
    // What exists is taken (and then read as every input file is: a FIFO, a device or a
    // directory is refused there, by name), not skipped as if missing.
    if let Some(p) = explicit {
        if p.exists() {
            return Ok(Files::one(p));
        }
        return Err(ClusterError::NoKubeconfig {
            tried: format!("--kubeconfig {} (no such file)", p.display()),
        });
    }
    if let Some(env) = kubeconfig_env.filter(|v| !v.is_empty()) {
        let paths: Vec<PathBuf> = std::env::split_paths(env)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
        if paths.iter().any(|p| p.exists()) {
            return Ok(Files {
                paths,
                origin: Origin::Env,
            });
        }
        // kubectl does not fall back to ~/.kube/config when KUBECONFIG is set: neither do we.
        let list: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        return Err(ClusterError::NoKubeconfig {
            tried: format!("KUBECONFIG={} (none of them exists)", list.join(":")),
        });
    }
    let tried = match home {
        Some(h) => {
            let p = h.join(".kube").join("config");
            if p.exists() {
                return Ok(Files {
                    paths: vec![p],
                    origin: Origin::Default,
                });
            }
            p.display().to_string()
        }
        None => "~/.kube/config (no home directory)".into(),
    };
    Err(ClusterError::NoKubeconfig { tried })
}

/// The merged kubeconfig of a list of files.
#[derive(Clone)]
pub struct Merged {
    /// The list it was read from.
    pub files: Files,
    raw: Raw,
}

/// Names only: kube's types show auth-provider settings (an oidc `id-token`, a
/// `client-secret`) and exec `env` values in their `Debug`.
impl std::fmt::Debug for Merged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Merged")
            .field("files", &self.files)
            .field("contexts", &self.contexts())
            .field("current_context", &self.current_context())
            .finish_non_exhaustive()
    }
}

/// Read every file of `files` (those of a `$KUBECONFIG` list that do not exist are skipped)
/// and merge them by kubectl's rules.
pub fn read(files: &Files) -> Result<Merged, ClusterError> {
    let mut merged = Raw::default();
    for path in &files.paths {
        if files.origin == Origin::Env && !path.exists() {
            continue;
        }
        let bytes =
            koord_base::bounded::read_file_bounded(path, koord_base::yaml::KUBECONFIG.max_bytes)
                .map_err(|source| ClusterError::ReadKubeconfig {
                    path: path.clone(),
                    source,
                })?;
        let one = parse_raw(&bytes, path)?;
        merged = merged
            .merge(one)
            .map_err(|e| ClusterError::InvalidKubeconfig {
                kubeconfig: files.display(),
                message: format!(
                    "{} cannot be merged with the files before it: {e}",
                    path.display()
                ),
            })?;
    }
    Ok(Merged {
        files: files.clone(),
        raw: merged,
    })
}

/// One file: bounded, parsed into kube's types, empty `current-context` dropped (so that a
/// later file's wins, as with kubectl), relative paths made absolute against its directory.
fn parse_raw(bytes: &[u8], path: &Path) -> Result<Raw, ClusterError> {
    let invalid = |message: String| ClusterError::InvalidKubeconfig {
        kubeconfig: path.display().to_string(),
        message,
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        // kubectl reads an empty file as an empty configuration.
        return Ok(Raw::default());
    }
    let mut raw: Raw = koord_base::yaml::parse("kubeconfig", bytes, &koord_base::yaml::KUBECONFIG)
        .map_err(|e| invalid(format!("not a valid kubeconfig: {}", e.reason())))?;
    if raw.current_context.as_deref().is_some_and(str::is_empty) {
        raw.current_context = None;
    }
    let dir = path.parent().unwrap_or(Path::new(""));
    let abs = |f: &mut Option<String>| {
        if let Some(v) = f.as_mut().filter(|v| !v.is_empty()) {
            *v = auth::absolute(dir, v);
        }
    };
    for c in raw.clusters.iter_mut().filter_map(|c| c.cluster.as_mut()) {
        abs(&mut c.certificate_authority);
    }
    for u in raw
        .auth_infos
        .iter_mut()
        .filter_map(|u| u.auth_info.as_mut())
    {
        abs(&mut u.client_certificate);
        abs(&mut u.client_key);
        abs(&mut u.token_file);
        // client-go resolves an exec command only when it holds a path separator: a bare
        // `aws` is looked up on PATH.
        if let Some(e) = u.exec.as_mut() {
            if e.command.as_deref().is_some_and(|c| c.contains('/')) {
                abs(&mut e.command);
            }
        }
    }
    Ok(raw)
}

/// Read `path` alone and resolve `context` (or the current context).
pub fn load(path: &Path, context: Option<&str>) -> Result<Kubeconfig, ClusterError> {
    read(&Files::one(path))?.select(context)
}

/// Resolve kubeconfig `text` as the file `path` (whose directory anchors relative paths).
pub fn parse(text: &str, path: &Path, context: Option<&str>) -> Result<Kubeconfig, ClusterError> {
    let files = Files::one(path);
    let raw = if text.len() > koord_base::yaml::KUBECONFIG.max_bytes {
        return Err(ClusterError::InvalidKubeconfig {
            kubeconfig: files.display(),
            message: format!(
                "larger than {} bytes",
                koord_base::yaml::KUBECONFIG.max_bytes
            ),
        });
    } else {
        parse_raw(text.as_bytes(), path)?
    };
    Merged { files, raw }.select(context)
}

impl Merged {
    fn invalid(&self, message: String) -> ClusterError {
        ClusterError::InvalidKubeconfig {
            kubeconfig: self.files.display(),
            message,
        }
    }

    /// The context names, in merge order.
    pub fn contexts(&self) -> Vec<&str> {
        self.raw.contexts.iter().map(|c| c.name.as_str()).collect()
    }

    /// The merged `current-context`.
    pub fn current_context(&self) -> Option<&str> {
        self.raw.current_context.as_deref()
    }

    /// The context to use (`--context`, else the current one), its entry, its cluster entry.
    fn pick(&self, context: Option<&str>) -> Result<(String, Context, Cluster), ClusterError> {
        let names = || {
            let n = self.contexts();
            if n.is_empty() {
                "none".to_string()
            } else {
                n.join(", ")
            }
        };
        let wanted = match context.filter(|c| !c.is_empty()).or(self.current_context()) {
            Some(c) => c.to_string(),
            None => {
                return Err(self.invalid(format!(
                    "no current-context is set; pass --context (contexts: {})",
                    names()
                )))
            }
        };
        let Some(ctx) = self.raw.contexts.iter().find(|c| c.name == wanted) else {
            return Err(ClusterError::ContextNotFound {
                kubeconfig: self.files.display(),
                context: wanted,
                available: names(),
            });
        };
        let body = ctx.context.clone().unwrap_or_default();
        if body.cluster.is_empty() {
            return Err(self.invalid(format!("context {wanted:?} names no cluster")));
        }
        let cluster = self
            .raw
            .clusters
            .iter()
            .find(|c| c.name == body.cluster)
            .ok_or_else(|| {
                self.invalid(format!(
                    "cluster {:?} (of context {wanted:?}) not found",
                    body.cluster
                ))
            })?
            .cluster
            .clone()
            .unwrap_or_default();
        Ok((wanted, body, cluster))
    }

    /// Resolve `context` (or the current context) into a client configuration.
    pub fn select(&self, context: Option<&str>) -> Result<Kubeconfig, ClusterError> {
        let (wanted, body, cluster) = self.pick(context)?;
        let cluster_name = body.cluster.clone();
        let server = cluster
            .server
            .clone()
            .unwrap_or_default()
            .trim()
            .to_string();
        if server.is_empty() {
            return Err(self.invalid(format!("cluster {cluster_name:?} has no server")));
        }
        let lower = server.to_ascii_lowercase();
        if !(lower.starts_with("https://") || lower.starts_with("http://")) {
            return Err(self.invalid(format!(
                "cluster {cluster_name:?}: server {server:?} is not an http(s) URL"
            )));
        }
        let kubeconfig = self.files.display();
        let ca_pem = self.ca(&cluster_name, &cluster)?;
        let user_name = body.user.clone().unwrap_or_default();
        let info = if user_name.is_empty() {
            Default::default()
        } else {
            self.raw
                .auth_infos
                .iter()
                .find(|u| u.name == user_name)
                .ok_or_else(|| {
                    self.invalid(format!(
                        "user {user_name:?} (of context {wanted:?}) not found"
                    ))
                })?
                .auth_info
                .clone()
                .unwrap_or_default()
        };
        let insecure = cluster.insecure_skip_tls_verify.unwrap_or(false);
        let user = auth::resolve(
            &Entry {
                kubeconfig: &kubeconfig,
                user: &user_name,
            },
            &info,
            &auth::ClusterInfo {
                server: &server,
                ca_pem: ca_pem.as_deref(),
                insecure_skip_tls_verify: insecure,
            },
        )?;
        Ok(Kubeconfig {
            kubeconfig,
            context: wanted,
            cluster: cluster_name,
            user: user_name,
            namespace: body.namespace.filter(|n| !n.is_empty()),
            server,
            ca_pem,
            insecure_skip_tls_verify: insecure,
            tls_server_name: auth::non_empty(cluster.tls_server_name.as_deref())
                .map(str::to_string),
            proxy_url: auth::non_empty(cluster.proxy_url.as_deref()).map(Secret::new),
            credentials: user.credentials,
            client_identity: user.client_identity,
            impersonation: user.impersonation,
        })
    }

    /// The cluster's CA: `certificate-authority-data` wins over the file.
    fn ca(&self, name: &str, cluster: &Cluster) -> Result<Option<Vec<u8>>, ClusterError> {
        match (
            auth::non_empty(cluster.certificate_authority_data.as_deref()),
            auth::non_empty(cluster.certificate_authority.as_deref()),
        ) {
            (Some(data), _) => auth::decode_b64(data).map(Some).ok_or_else(|| {
                self.invalid(format!(
                    "cluster {name:?}: certificate-authority-data is not valid base64"
                ))
            }),
            (None, Some(file)) => {
                let file = PathBuf::from(file);
                koord_base::bounded::read_file_bounded(&file, 4 * 1024 * 1024)
                    .map(Some)
                    .map_err(|source| ClusterError::CredentialFile {
                        kubeconfig: self.files.display(),
                        what: format!("cluster {name:?} certificate-authority"),
                        file,
                        source,
                    })
            }
            (None, None) => Ok(None),
        }
    }

    /// The merged configuration as `kubectl config view --minify --flatten -o json` prints it:
    /// the context, its cluster and its user only, files named by them read into their `-data`
    /// fields. For comparing with kubectl (tests); it holds the credentials.
    pub fn minified(&self, context: Option<&str>) -> Result<serde_json::Value, ClusterError> {
        use base64::Engine as _;
        let (wanted, body, mut cluster) = self.pick(context)?;
        let b64 = |bytes: Vec<u8>| base64::engine::general_purpose::STANDARD.encode(bytes);
        let read = |f: &str| std::fs::read(f).map_err(|e| self.invalid(format!("{f}: {e}")));
        if let Some(f) = cluster.certificate_authority.take() {
            if cluster.certificate_authority_data.is_none() {
                cluster.certificate_authority_data = Some(b64(read(&f)?));
            }
        }
        let user_name = body.user.clone().unwrap_or_default();
        let mut user = self
            .raw
            .auth_infos
            .iter()
            .find(|u| u.name == user_name)
            .and_then(|u| u.auth_info.clone());
        if let Some(u) = user.as_mut() {
            if let Some(f) = u.client_certificate.take() {
                if u.client_certificate_data.is_none() {
                    u.client_certificate_data = Some(b64(read(&f)?));
                }
            }
            if let Some(f) = u.client_key.take() {
                if u.client_key_data.is_none() {
                    u.client_key_data = Some(b64(read(&f)?).into());
                }
            }
        }
        // As kubectl prints an anonymous context: `user: ""`, and no `users` at all.
        let mut body = body;
        body.user = Some(user_name.clone());
        let mut view = serde_json::json!({
            "kind": "Config",
            "apiVersion": "v1",
            "clusters": [{"name": body.cluster, "cluster": cluster}],
            "contexts": [{"name": wanted, "context": body}],
            "current-context": wanted,
        });
        if let Some(u) = user {
            view["users"] = serde_json::json!([{"name": user_name, "user": u}]);
        }
        Ok(view)
    }
}

#[cfg(test)]
mod tests;
