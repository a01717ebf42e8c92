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
//! (or for the whole run when there is none) and fetched again after a 401, once
//! ([`super::KubeClient`]). Client certificates from a plugin (`status.clientCertificateData`)
//! are not supported.
//!
//! # Run here, not by kube
//!
//! kube-client 5.0.0 runs exec plugins itself (`auth_exec` in its `client/auth/mod.rs`) with
//! `std::process::Command::output()`: the whole output is read into memory before anything is
//! checked, there is no time limit, nothing it starts is killed, and its error (`AuthExecRun`)
//! carries the command line with every argument and the plugin's whole output (the token
//! included) in its `Debug` form. A plugin that prints forever grew koord-bundle to 22.6 GB in
//! 80 s before the kernel killed it (issue 17, with the hand-written runner of that time, which
//! read the same way). So the plugin runs through [`koord_base::child`] (time limit, standard output
//! capped at [`MAX_OUTPUT`] while it is read, its process group killed at the end, timeout
//! included) and kube gets only the resulting token.

use super::ClusterError;
use base64::Engine as _;
use koord_base::child::{self, ChildError, Limits, StderrMode};
use koord_base::secret::Secret;
use serde::Deserialize;
use std::time::{Duration, SystemTime};

/// Longest a plugin may run (a browser login of `kubelogin` included).
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest plugin output accepted (an `ExecCredential` is a few KiB).
pub const MAX_OUTPUT: usize = 1024 * 1024;
/// A token is fetched again this long before it expires.
const EXPIRY_SKEW: Duration = Duration::from_secs(10);

/// The `exec` entry of a kubeconfig user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecConfig {
    /// The kubeconfig file(s), for messages (`a.yaml:b.yaml`).
    pub kubeconfig: String,
    /// The user entry's name (for messages).
    pub user: String,
    /// `client.authentication.k8s.io/v1` or `v1beta1`.
    pub api_version: String,
    /// The program (made absolute against the kubeconfig's directory when it holds a `/`).
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
    /// Still usable (not within `EXPIRY_SKEW` of its expiry).
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
        redacted_command(&self.command, &self.args)
    }

    fn error(&self, message: String) -> ClusterError {
        ClusterError::ExecPlugin {
            kubeconfig: self.kubeconfig.clone(),
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

    /// Run the plugin (within `timeout`, its output capped while read) and read its token.
    pub async fn run(&self, timeout: Duration) -> Result<ExecToken, ClusterError> {
        if self.interactive_mode == "Always" {
            return Err(self.error(
                "its interactiveMode is Always, but koord-bundle runs plugins without a terminal on their standard input; use a plugin mode or configuration that works without a prompt (interactiveMode IfAvailable or Never)".into(),
            ));
        }
        let mut cmd = std::process::Command::new(&self.command);
        cmd.args(&self.args)
            .env("KUBERNETES_EXEC_INFO", self.exec_info());
        for (k, v) in &self.env {
            cmd.env(k, v.expose());
        }
        let limits = Limits {
            timeout,
            max_stdout: MAX_OUTPUT,
            max_stderr: MAX_OUTPUT,
            max_memory: None,
        };
        let out = child::run_async(cmd, None, StderrMode::Inherit, limits, None)
            .await
            .map_err(|e| self.child_error(e))?;
        if !out.status.success() {
            return Err(self.error(format!(
                "it failed ({}); its messages are above",
                out.status
            )));
        }
        self.parse(&out.stdout, SystemTime::now())
    }

    /// What a failed run says: never the plugin's output, always what to do.
    fn child_error(&self, e: ChildError) -> ClusterError {
        match e {
            ChildError::NotFound { .. } => self.error(format!(
                "{} not found{}",
                self.command,
                match &self.install_hint {
                    Some(h) => format!(": {}", h.trim()),
                    None => ": install it, or put it on PATH".into(),
                }
            )),
            ChildError::TimedOut { after, .. } => self.error(format!(
                "it did not finish within {} s: it was stopped, with every process it started; check that it can get a token without a prompt (run it by hand)",
                after.as_secs()
            )),
            ChildError::OutputTooLarge { limit, stream, .. } => self.error(format!(
                "it printed more than {limit} bytes on its {stream} (an ExecCredential is a few KiB): it was stopped, with every process it started"
            )),
            ChildError::Spawn { source, .. } => self.error(format!("cannot start it: {source}")),
            ChildError::Wait { source, .. } => {
                self.error(format!("waiting for it failed: {source}"))
            }
        }
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

/// The command line, with the value of any flag whose name suggests a credential (`--token`,
/// `--client-secret`, `--password`, `--key`...) replaced by `<redacted>`.
pub fn redacted_command(command: &str, args: &[String]) -> String {
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

    fn script(dir: &std::path::Path, body: &str) -> String {
        use std::os::unix::fs::PermissionsExt as _;
        let p = dir.join("plugin.sh");
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p.to_string_lossy().into_owned()
    }

    /// A plugin that prints without end is stopped at the cap, having cost at most the cap.
    #[tokio::test]
    async fn endless_output_is_capped_while_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cfg(API_VERSIONS[0]);
        c.command = script(dir.path(), "exec yes token-token-token");
        c.args.clear();
        let m = c
            .run(Duration::from_secs(60))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            m.contains("printed more than 1048576 bytes on its standard output"),
            "{m}"
        );
        assert!(!m.contains("token-token"), "{m}");
    }

    /// A plugin that hangs, with a child of its own: both are gone after the time limit.
    #[tokio::test]
    async fn a_hanging_plugin_and_its_child_are_killed() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("child.pid");
        let mut c = cfg(API_VERSIONS[0]);
        c.command = script(
            dir.path(),
            &format!(
                "sleep 300 &\necho $! > {}\nwait",
                pid_file.to_string_lossy()
            ),
        );
        c.args.clear();
        let m = c.run(Duration::from_secs(2)).await.unwrap_err().to_string();
        assert!(m.contains("did not finish within 2 s"), "{m}");
        // Killed with its group; reaped by init soon after (a zombie until then).
        assert!(
            koord_base::child::pid_in_file_is_gone(&pid_file),
            "the plugin's child outlived the timeout"
        );
    }
}
