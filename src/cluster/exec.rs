//! kubeconfig `exec` credential plugins (`client.authentication.k8s.io/v1` and `v1beta1`), as
//! client-go runs them: EKS's `aws eks get-token`, GKE's `gke-gcloud-auth-plugin`, AKS/OIDC's
//! `kubelogin`.
//!
//! The plugin is run with the kubeconfig's `args` and `env` added to koord-bundle's own
//! environment, and `KUBERNETES_EXEC_INFO` holding an `ExecCredential` whose `spec.interactive`
//! is false (koord-bundle never hands its standard input to a plugin: it may be the
//! `--password-stdin` password) and whose `spec.cluster` is filled when `provideClusterInfo` is
//! true. `interactiveMode: Always` is refused for that reason; `IfAvailable` and `Never` run.
//! It must print an `ExecCredential` of the same `apiVersion` with `status.token`; its stderr
//! goes to the user, as with client-go. The token is cached until `status.expirationTimestamp`
//! (or for the whole run when there is none) and fetched again after a 401, once.
//! Client certificates from a plugin (`status.clientCertificateData`) are not supported.

use super::secret::Secret;
use super::ClusterError;
use base64::Engine as _;
use serde::Deserialize;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, SystemTime};

/// Longest a plugin may run (a browser login of `kubelogin` included).
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest plugin output accepted.
const MAX_OUTPUT: usize = 1024 * 1024;
/// A token is fetched again this long before it expires.
const EXPIRY_SKEW: Duration = Duration::from_secs(10);

/// The `exec` entry of a kubeconfig user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecConfig {
    /// The kubeconfig (for messages).
    pub kubeconfig: PathBuf,
    /// The user entry's name (for messages).
    pub user: String,
    /// `client.authentication.k8s.io/v1` or `v1beta1`.
    pub api_version: String,
    /// The program.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment (values may be credentials).
    pub env: Vec<(String, Secret)>,
    /// What to tell the user when the program is missing.
    pub install_hint: Option<String>,
    /// Put the cluster (server, CA) into `KUBERNETES_EXEC_INFO`.
    pub provide_cluster_info: bool,
    /// `Never`, `IfAvailable` or `Always`.
    pub interactive_mode: String,
    /// The cluster's server URL, for `provideClusterInfo`.
    pub server: String,
    /// The cluster's CA (PEM), for `provideClusterInfo`.
    pub ca_pem: Option<Vec<u8>>,
    /// The cluster's `insecure-skip-tls-verify`, for `provideClusterInfo`.
    pub insecure_skip_tls_verify: bool,
}

/// The supported ExecCredential API versions.
pub const API_VERSIONS: [&str; 2] = [
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
];

/// A token from a plugin, with its expiry.
#[derive(Debug, Clone)]
pub struct ExecToken {
    /// The bearer token.
    pub token: Secret,
    /// When it expires (`None`: valid for the whole run).
    pub expires: Option<SystemTime>,
}

impl ExecToken {
    /// Still usable (not within [`EXPIRY_SKEW`] of its expiry).
    pub fn fresh(&self, now: SystemTime) -> bool {
        self.expires.is_none_or(|e| now + EXPIRY_SKEW < e)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawCredential {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    status: Option<RawStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawStatus {
    #[serde(default)]
    token: Option<Secret>,
    #[serde(default)]
    expiration_timestamp: Option<String>,
    #[serde(default)]
    client_certificate_data: Option<String>,
}

impl ExecConfig {
    /// The command line for messages, flag values that look like credentials redacted.
    pub fn display_command(&self) -> String {
        super::kubeconfig::redacted_command(&self.command, &self.args)
    }

    fn error(&self, message: String) -> ClusterError {
        ClusterError::ExecPlugin {
            path: self.kubeconfig.clone(),
            user: self.user.clone(),
            command: self.display_command(),
            message,
        }
    }

    /// `KUBERNETES_EXEC_INFO`.
    fn exec_info(&self) -> String {
        let mut spec = serde_json::json!({ "interactive": false });
        if self.provide_cluster_info {
            let mut cluster = serde_json::json!({ "server": self.server });
            if let Some(ca) = &self.ca_pem {
                cluster["certificate-authority-data"] =
                    base64::engine::general_purpose::STANDARD.encode(ca).into();
            }
            if self.insecure_skip_tls_verify {
                cluster["insecure-skip-tls-verify"] = true.into();
            }
            spec["cluster"] = cluster;
        }
        serde_json::json!({"apiVersion": self.api_version, "kind": "ExecCredential", "spec": spec})
            .to_string()
    }

    /// Run the plugin and read its token.
    pub async fn run(&self) -> Result<ExecToken, ClusterError> {
        if self.interactive_mode == "Always" {
            return Err(self.error(
                "its interactiveMode is Always, but koord-bundle runs plugins without a terminal on their standard input; use a plugin mode or configuration that works without a prompt (interactiveMode IfAvailable or Never)".into(),
            ));
        }
        let mut cmd = tokio::process::Command::new(&self.command);
        cmd.args(&self.args)
            .env("KUBERNETES_EXEC_INFO", self.exec_info())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        for (k, v) in &self.env {
            cmd.env(k, v.expose());
        }
        let child = cmd.spawn().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                self.error(format!(
                    "{} not found{}",
                    self.command,
                    match &self.install_hint {
                        Some(h) => format!(": {}", h.trim()),
                        None => ": install it, or put it on PATH".into(),
                    }
                ))
            } else {
                self.error(format!("cannot start it: {e}"))
            }
        })?;
        let out = match tokio::time::timeout(EXEC_TIMEOUT, child.wait_with_output()).await {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => return Err(self.error(format!("cannot read its output: {e}"))),
            Err(_) => {
                return Err(self.error(format!("it did not finish in {} s", EXEC_TIMEOUT.as_secs())))
            }
        };
        if !out.status.success() {
            return Err(self.error(format!(
                "it failed ({}); its messages are above",
                out.status
            )));
        }
        if out.stdout.len() > MAX_OUTPUT {
            return Err(self.error(format!("it printed more than {MAX_OUTPUT} bytes")));
        }
        self.parse(&out.stdout, SystemTime::now())
    }

    /// Read an ExecCredential printed by the plugin. Never echoes the output.
    pub fn parse(&self, stdout: &[u8], _now: SystemTime) -> Result<ExecToken, ClusterError> {
        let raw: RawCredential = serde_json::from_slice(stdout).map_err(|e| {
            self.error(format!(
                "it did not print an ExecCredential as JSON (line {}, column {})",
                e.line(),
                e.column()
            ))
        })?;
        if raw.kind != "ExecCredential" {
            return Err(self.error(format!(
                "it printed kind {:?}, not ExecCredential",
                raw.kind
            )));
        }
        if raw.api_version != self.api_version {
            return Err(self.error(format!(
                "it printed apiVersion {:?}, but the kubeconfig asks for {:?}",
                raw.api_version, self.api_version
            )));
        }
        let Some(status) = raw.status else {
            return Err(self.error("its ExecCredential has no status".into()));
        };
        if status.client_certificate_data.is_some() && status.token.is_none() {
            return Err(self.error(
                "it returns a client certificate, which koord-bundle does not support from exec plugins in this version (tokens only)".into(),
            ));
        }
        let token = status
            .token
            .filter(|t| !t.expose().is_empty())
            .ok_or_else(|| self.error("its ExecCredential has no status.token".into()))?;
        let expires = match status.expiration_timestamp.as_deref() {
            None | Some("") => None,
            Some(ts) => Some(
                humantime::parse_rfc3339_weak(ts.trim_end_matches('Z')).map_err(|_| {
                    self.error(format!(
                        "its status.expirationTimestamp {ts:?} is not an RFC 3339 time"
                    ))
                })?,
            ),
        };
        Ok(ExecToken { token, expires })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(api: &str) -> ExecConfig {
        ExecConfig {
            kubeconfig: "/k".into(),
            user: "u".into(),
            api_version: api.into(),
            command: "plugin".into(),
            args: vec!["--token".into(), "hush".into()],
            env: vec![],
            install_hint: None,
            provide_cluster_info: true,
            interactive_mode: "IfAvailable".into(),
            server: "https://k:6443".into(),
            ca_pem: Some(b"PEM".to_vec()),
            insecure_skip_tls_verify: false,
        }
    }

    #[test]
    fn parses_tokens_and_expiry_and_refuses_the_rest() {
        let c = cfg(API_VERSIONS[0]);
        let t = c
            .parse(br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"tok-1","expirationTimestamp":"2030-01-02T03:04:05Z"}}"#, SystemTime::now())
            .unwrap();
        assert_eq!(t.token.expose(), "tok-1");
        assert!(t.fresh(SystemTime::now()));
        let t = c
            .parse(br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"tok-1","expirationTimestamp":"2001-01-02T03:04:05Z"}}"#, SystemTime::now())
            .unwrap();
        assert!(!t.fresh(SystemTime::now()));
        let m = c
            .parse(br#"{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{"token":"secret-x"}}"#, SystemTime::now())
            .unwrap_err()
            .to_string();
        assert!(m.contains("v1beta1") && !m.contains("secret-x"), "{m}");
        assert!(m.contains("plugin --token <redacted>"), "{m}");
        let m = c
            .parse(b"secret-y not json", SystemTime::now())
            .unwrap_err()
            .to_string();
        assert!(
            m.contains("not print an ExecCredential") && !m.contains("secret-y"),
            "{m}"
        );
        let m = c
            .parse(br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"clientCertificateData":"x","clientKeyData":"y"}}"#, SystemTime::now())
            .unwrap_err()
            .to_string();
        assert!(m.contains("client certificate"), "{m}");
    }

    #[test]
    fn exec_info_carries_the_cluster_only_when_asked() {
        let mut c = cfg(API_VERSIONS[1]);
        let v: serde_json::Value = serde_json::from_str(&c.exec_info()).unwrap();
        assert_eq!(v["spec"]["interactive"], false);
        assert_eq!(v["spec"]["cluster"]["server"], "https://k:6443");
        assert_eq!(v["spec"]["cluster"]["certificate-authority-data"], "UEVN");
        c.provide_cluster_info = false;
        let v: serde_json::Value = serde_json::from_str(&c.exec_info()).unwrap();
        assert!(v["spec"].get("cluster").is_none());
    }
}
