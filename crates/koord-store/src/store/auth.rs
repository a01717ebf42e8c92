//! Registry credentials, found the way docker, podman, skopeo and crane find them:
//! `--username`/`--password-stdin` first, then the container auth files in the order the
//! command layer gives (`$REGISTRY_AUTH_FILE`, `$DOCKER_CONFIG/config.json`,
//! `~/.docker/config.json`, `$XDG_RUNTIME_DIR/containers/auth.json`). In each file, for a host:
//! its `credHelpers` entry (`docker-credential-NAME get`), else its `auths` entry (`auth`,
//! `username`/`password` or `identitytoken`), else the file's `credsStore` helper. Secrets never
//! appear in `Debug` or `Display`, in a child's argv, or in an error.
//!
//! Why not the `docker_credential` crate (1.4): it reads `$DOCKER_CONFIG`/`$HOME` itself (only
//! `src/cmd` reads the environment here), cannot be handed the `PATH` to find helpers on, puts a
//! failing helper's stdout into its error text (where a secret could end up in a message), does not
//! tell "the helper has no credentials for this host" (exit 1, `credentials not found`) from a
//! broken helper, has no timeout for a helper that hangs, and returns plain `String` secrets. The
//! protocol is small (one JSON object in, one out), so it lives here, with those points covered.
//!
//! A helper is an outside program: it runs through [`koord_base::child`] (30 s, 64 KiB of output
//! read with the cap, its process group killed with it), at most once per host per command,
//! its failure kept like its answer: concurrent look-ups of a host wait for the one run.

use base64::Engine as _;
use koord_base::child::{self, ChildError, Limits, StderrMode};
use koord_base::secret::Secret;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Username and password for one registry.
#[derive(Debug, Clone)]
pub struct Login {
    /// User name.
    pub username: String,
    /// Password or token.
    pub password: Secret,
}

/// What a registry login is made of.
#[derive(Debug, Clone)]
pub enum Credential {
    /// User name and password (or an access token used as the password): HTTP basic auth to
    /// the registry or its token service.
    Basic(Login),
    /// An identity token (OAuth2 refresh token): exchanged at the token service with
    /// `grant_type=refresh_token` (ACR, Harbor robot accounts, `docker login` with a token).
    IdentityToken(Secret),
}

impl Credential {
    /// Who this is, for messages (never the secret).
    pub fn who(&self) -> String {
        match self {
            Credential::Basic(l) => format!("user {:?}", l.username),
            Credential::IdentityToken(_) => "the identity token".to_string(),
        }
    }
    /// The login, when it is a user name and password.
    pub fn login(&self) -> Option<&Login> {
        match self {
            Credential::Basic(l) => Some(l),
            Credential::IdentityToken(_) => None,
        }
    }
}

/// A credential and where it came from.
#[derive(Debug, Clone)]
pub struct Found {
    /// The credential.
    pub credential: Credential,
    /// Where it came from (`--username`, a file, a helper), for messages.
    pub origin: String,
}

/// The outcome of a look-up: the credential, if any, and every place looked at (for the "no
/// credentials" message).
#[derive(Debug, Clone, Default)]
pub struct Lookup {
    /// What was found.
    pub found: Option<Found>,
    /// Places looked at, in order (`/path/config.json (no entry)`, `docker-credential-x (none)`).
    pub searched: Vec<String>,
}

impl Lookup {
    /// The places looked at, on one line.
    pub fn searched_text(&self) -> String {
        if self.searched.is_empty() {
            "no auth file exists".to_string()
        } else {
            self.searched.join(", ")
        }
    }
}

/// An auth file that exists but cannot be read, or a credential helper that failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AuthError {
    /// The file is unreadable or malformed.
    #[error("cannot read registry auth file {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong (never the file's content).
        reason: String,
    },
    /// A credential helper failed (other than "no credentials for this host").
    #[error("credential helper docker-credential-{helper} (named by {config}) failed for {host}: {reason}")]
    Helper {
        /// Helper name (the part after `docker-credential-`).
        helper: String,
        /// The config file naming it.
        config: PathBuf,
        /// The registry asked about.
        host: String,
        /// What went wrong: the helper's first line of output (escaped, at most 200
        /// characters) when it failed, never output that parses as a credential.
        reason: String,
    },
}

impl koord_base::exit::Classify for AuthError {
    fn exit_class(&self) -> Option<koord_base::exit::ExitClass> {
        // An auth file that cannot be read or parsed, a credential helper that fails: the
        // user's configuration.
        Some(koord_base::exit::ExitClass::Input)
    }
}

#[derive(Debug, Clone, Default)]
struct AuthFile {
    path: PathBuf,
    auths: BTreeMap<String, Entry>,
    creds_store: Option<String>,
    cred_helpers: BTreeMap<String, String>,
}

#[derive(Debug, Clone)]
enum Entry {
    Login(Login),
    Token(Secret),
}

/// Credentials by registry host: explicit logins plus the auth files, read once; helpers are
/// run when a host is first asked for, and their answer is kept for the process.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    explicit: BTreeMap<String, Login>,
    files: Vec<AuthFile>,
    /// Every path considered, existing or not (for messages).
    considered: Vec<PathBuf>,
    /// `PATH` to find `docker-credential-*` on (`None`: the process's own).
    helper_path: Option<OsString>,
    /// One look-up per host, its outcome kept (a helper's failure too); shared by clones.
    cache: Arc<Mutex<BTreeMap<String, Slot>>>,
}

/// The outcome of one host's look-up, filled once: concurrent look-ups wait for it.
type Slot = Arc<tokio::sync::OnceCell<Result<Lookup, AuthError>>>;

/// How long a credential helper may take.
const HELPER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// Largest helper answer read (each of standard output and standard error).
const HELPER_MAX_OUTPUT: usize = 64 * 1024;

impl Credentials {
    /// Add a login for `host` (`--username`): it wins over every file.
    pub fn insert(&mut self, host: &str, login: Login) {
        self.explicit.insert(normalise_host(host), login);
        if let Ok(mut c) = self.cache.lock() {
            c.clear();
        }
    }

    /// Read the auth files that exist, in the order given (earlier wins); helpers are found on
    /// `helper_path` (the command layer passes `$PATH`).
    pub fn from_files_with_path(
        paths: &[PathBuf],
        helper_path: Option<OsString>,
    ) -> Result<Self, AuthError> {
        let mut creds = Credentials {
            helper_path,
            considered: paths.to_vec(),
            ..Default::default()
        };
        for path in paths {
            if path.is_file() {
                creds.files.push(read_file(path)?);
            }
        }
        Ok(creds)
    }

    /// Find the credential for `host`, running a credential helper if a file names one. The
    /// outcome is kept, a failure too: a helper runs at most once per host, and look-ups of a
    /// host while its helper runs wait for that run.
    pub async fn resolve(&self, host: &str) -> Result<Lookup, AuthError> {
        let h = normalise_host(host);
        let slot: Slot = {
            let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            c.entry(h.clone()).or_default().clone()
        };
        slot.get_or_init(|| self.resolve_uncached(&h)).await.clone()
    }

    async fn resolve_uncached(&self, h: &str) -> Result<Lookup, AuthError> {
        let mut searched = Vec::new();
        // The look-up ends at the first credential found.
        let hit = |credential, origin, searched| Lookup {
            found: Some(Found { credential, origin }),
            searched,
        };
        if let Some(l) = self.explicit.get(h) {
            return Ok(hit(
                Credential::Basic(l.clone()),
                "--username/--password-stdin".into(),
                searched,
            ));
        }
        for path in &self.considered {
            let Some(file) = self.files.iter().find(|f| &f.path == path) else {
                searched.push(format!("{} (not there)", path.display()));
                continue;
            };
            if let Some(helper) = file.cred_helpers.get(h) {
                if let Some(c) = self.run_helper(helper, h, &file.path).await? {
                    let origin = format!(
                        "docker-credential-{helper} (credHelpers of {})",
                        file.path.display()
                    );
                    return Ok(hit(c, origin, searched));
                }
                searched.push(format!(
                    "docker-credential-{helper} from credHelpers of {} (nothing for {h})",
                    file.path.display()
                ));
                continue;
            }
            match file.auths.get(h) {
                Some(Entry::Login(l)) => {
                    let origin = format!("auths of {}", file.path.display());
                    return Ok(hit(Credential::Basic(l.clone()), origin, searched));
                }
                Some(Entry::Token(t)) => {
                    let origin = format!("identitytoken in auths of {}", file.path.display());
                    return Ok(hit(Credential::IdentityToken(t.clone()), origin, searched));
                }
                None => {}
            }
            let Some(store) = &file.creds_store else {
                searched.push(format!("{} (no entry for {h})", file.path.display()));
                continue;
            };
            if let Some(c) = self.run_helper(store, h, &file.path).await? {
                let origin = format!(
                    "docker-credential-{store} (credsStore of {})",
                    file.path.display()
                );
                return Ok(hit(c, origin, searched));
            }
            searched.push(format!(
                "{} (no entry) and its credsStore docker-credential-{store} (nothing for {h})",
                file.path.display()
            ));
        }
        Ok(Lookup {
            found: None,
            searched,
        })
    }

    /// `docker-credential-NAME get`, the server on stdin, `{ServerURL, Username, Secret}` on
    /// stdout. `Ok(None)` when the helper has nothing for this server.
    async fn run_helper(
        &self,
        name: &str,
        host: &str,
        config: &Path,
    ) -> Result<Option<Credential>, AuthError> {
        let err = |reason: String| AuthError::Helper {
            helper: name.to_string(),
            config: config.to_path_buf(),
            host: host.to_string(),
            reason,
        };
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return Err(err("the helper name is not a plain name".into()));
        }
        let program = format!("docker-credential-{name}");
        let mut cmd = std::process::Command::new(&program);
        cmd.arg("get");
        if let Some(p) = &self.helper_path {
            cmd.env("PATH", p);
        }
        // Docker Hub's server is known to helpers by its v1 URL.
        let server = if host == "docker.io" {
            "https://index.docker.io/v1/"
        } else {
            host
        };
        let limits = Limits {
            timeout: HELPER_TIMEOUT,
            max_stdout: HELPER_MAX_OUTPUT,
            max_stderr: HELPER_MAX_OUTPUT,
            max_memory: None,
        };
        let out = child::run_async(
            cmd,
            Some(server.as_bytes().to_vec()),
            StderrMode::Capture,
            limits,
            None,
        )
        .await
        .map_err(|e| {
            err(match e {
                ChildError::NotFound { .. } => format!("{program} is not on PATH"),
                // Timed out or printed too much: the message names the limit.
                other => other.to_string(),
            })
        })?;
        if !out.status.success() {
            // The helpers' protocol: "credentials not found in native keychain" on stdout.
            let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
            let etext = String::from_utf8_lossy(&out.stderr).to_lowercase();
            if text.contains("credentials not found") || etext.contains("credentials not found") {
                return Ok(None);
            }
            return Err(err(format!(
                "exited with {}{} [hint: see what it says with `echo {server} | {program} get`]",
                out.status,
                said(&out.stdout, &out.stderr)
            )));
        }
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Answer {
            #[serde(default)]
            username: String,
            #[serde(default)]
            secret: Option<Secret>,
        }
        let a: Answer = serde_json::from_slice(&out.stdout).map_err(|_| {
            err("its answer is not the JSON object {ServerURL, Username, Secret}".into())
        })?;
        let Some(secret) = a.secret.filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        Ok(Some(if a.username == "<token>" {
            Credential::IdentityToken(secret)
        } else {
            Credential::Basic(Login {
                username: a.username,
                password: secret,
            })
        }))
    }
}

/// What a failed helper said, for its error: `: "FIRST LINE"` — the first non-empty line of its
/// standard output (where helpers answer, errors included), else of its standard error,
/// escaped and at most 200 characters. Never output that parses as JSON (a credential, or
/// part of one): then only that it answered JSON.
fn said(stdout: &[u8], stderr: &[u8]) -> String {
    let first = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(str::to_string)
    };
    let is_json = |b: &[u8]| serde_json::from_slice::<serde_json::Value>(b).is_ok();
    for stream in [stdout, stderr] {
        let Some(line) = first(stream) else { continue };
        if is_json(stream) || is_json(line.as_bytes()) || line.starts_with('{') {
            return ": its output is JSON, not shown (it may hold a secret)".into();
        }
        return format!(": \"{}\"", koord_base::text::printable(&line));
    }
    String::new()
}

/// A registry auth file (`config.json`, `auth.json`) holds a few logins; 16 MiB is far above any.
const MAX_AUTH_FILE: usize = 16 * 1024 * 1024;

fn read_file(path: &Path) -> Result<AuthFile, AuthError> {
    let err = |reason: String| AuthError::File {
        path: path.to_path_buf(),
        reason,
    };
    // Opened as every input file is (a FIFO is refused, not waited on), read to a bound.
    let bytes = koord_base::bounded::read_file_bounded(path, MAX_AUTH_FILE)
        .map_err(|e| err(e.to_string()))?;
    // Never quote the content: the parser's message has a position, not the text.
    let doc: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| err(format!("not JSON ({e})")))?;
    let mut file = AuthFile {
        path: path.to_path_buf(),
        ..Default::default()
    };
    if let Some(s) = doc.get("credsStore").and_then(|s| s.as_str()) {
        if !s.is_empty() {
            file.creds_store = Some(s.to_string());
        }
    }
    if let Some(h) = doc.get("credHelpers").and_then(|h| h.as_object()) {
        for (host, name) in h {
            if let Some(n) = name.as_str().filter(|n| !n.is_empty()) {
                file.cred_helpers
                    .insert(normalise_host(host), n.to_string());
            }
        }
    }
    let Some(auths) = doc.get("auths").and_then(|a| a.as_object()) else {
        return Ok(file);
    };
    for (host, entry) in auths {
        let token = entry
            .get("identitytoken")
            .and_then(|t| t.as_str())
            .filter(|t| !t.is_empty());
        let login = if let Some(t) = token {
            Entry::Token(Secret::new(t))
        } else if let Some(auth) = entry
            .get("auth")
            .and_then(|a| a.as_str())
            .filter(|a| !a.is_empty())
        {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .map_err(|_| err(format!("the `auth` of {host} is not base64")))?;
            let text = String::from_utf8(decoded)
                .map_err(|_| err(format!("the `auth` of {host} is not UTF-8")))?;
            let Some((u, p)) = text.split_once(':') else {
                return Err(err(format!("the `auth` of {host} is not user:password")));
            };
            Entry::Login(Login {
                username: u.to_string(),
                password: Secret::new(p.to_string()),
            })
        } else {
            match (
                entry.get("username").and_then(|v| v.as_str()),
                entry.get("password").and_then(|v| v.as_str()),
            ) {
                (Some(u), Some(p)) if !p.is_empty() => Entry::Login(Login {
                    username: u.into(),
                    password: Secret::new(p),
                }),
                // `{}`: docker's marker for a login kept in a credential store.
                _ => continue,
            }
        };
        file.auths.entry(normalise_host(host)).or_insert(login);
    }
    Ok(file)
}

/// `https://index.docker.io/v1/` and friends all mean `docker.io`; a podman key with a
/// namespace (`host/ns`) counts for its host.
pub fn normalise_host(host: &str) -> String {
    let h = host
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let h = h.split('/').next().unwrap_or(h);
    match h {
        "index.docker.io" | "registry-1.docker.io" => "docker.io".to_string(),
        _ => h.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn reads_docker_config_and_redacts() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        let auth = base64::engine::general_purpose::STANDARD.encode("koord:s3cret");
        std::fs::write(&p, format!(r#"{{"auths":{{"127.0.0.1:5001":{{"auth":"{auth}"}},"https://index.docker.io/v1/":{{"auth":"{auth}"}},"tok.example":{{"identitytoken":"refresh-xyz"}},"store.example":{{}}}}}}"#)).unwrap();
        let c = Credentials::from_files_with_path(&[p], None).unwrap();
        let login = |host: &str| {
            rt().block_on(c.resolve(host))
                .unwrap()
                .found
                .and_then(|f| f.credential.login().cloned())
        };
        let l = login("127.0.0.1:5001").unwrap();
        assert_eq!(l.username, "koord");
        assert_eq!(l.password.expose(), "s3cret");
        assert!(login("docker.io").is_some());
        assert!(!format!("{c:?}").contains("s3cret"));
        let found = rt().block_on(c.resolve("tok.example")).unwrap();
        match found.found.unwrap().credential {
            Credential::IdentityToken(t) => assert_eq!(t.expose(), "refresh-xyz"),
            other => panic!("{other:?}"),
        }
        let none = rt().block_on(c.resolve("store.example")).unwrap();
        assert!(none.found.is_none());
        assert!(none.searched_text().contains("config.json"), "{none:?}");
    }

    #[test]
    fn helpers_from_path_with_token_and_not_found() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let helper = bin.join("docker-credential-t1");
        std::fs::write(
            &helper,
            "#!/bin/sh\nread s\ncase \"$s\" in\n  a.example) echo '{\"ServerURL\":\"a.example\",\"Username\":\"u1\",\"Secret\":\"p1\"}';;\n  b.example) echo '{\"ServerURL\":\"b.example\",\"Username\":\"<token>\",\"Secret\":\"rt\"}';;\n  *) echo 'credentials not found in native keychain'; exit 1;;\nesac\n",
        )
        .unwrap();
        std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cfg = dir.path().join("config.json");
        std::fs::write(
            &cfg,
            r#"{"credsStore":"t1","credHelpers":{"c.example":"missing-helper"}}"#,
        )
        .unwrap();
        let c =
            Credentials::from_files_with_path(&[cfg], Some(bin.as_os_str().to_owned())).unwrap();
        let rt = rt();
        let a = rt.block_on(c.resolve("a.example")).unwrap().found.unwrap();
        assert_eq!(a.credential.login().unwrap().username, "u1");
        assert!(a.origin.contains("credsStore"), "{}", a.origin);
        let b = rt.block_on(c.resolve("b.example")).unwrap().found.unwrap();
        assert!(matches!(b.credential, Credential::IdentityToken(_)));
        let none = rt.block_on(c.resolve("z.example")).unwrap();
        assert!(none.found.is_none());
        assert!(
            none.searched_text().contains("docker-credential-t1"),
            "{none:?}"
        );
        let e = rt.block_on(c.resolve("c.example")).unwrap_err();
        assert!(e.to_string().contains("not on PATH"), "{e}");
    }

    #[test]
    fn what_a_failed_helper_said() {
        assert_eq!(
            said(
                b"\nYou do not currently have an active account selected.\nmore\n",
                b"x"
            ),
            ": \"You do not currently have an active account selected.\""
        );
        assert_eq!(said(b"", b"boom\x1b[2J\n"), ": \"boom\\u{1b}[2J\"");
        assert_eq!(said(b"", b""), "");
        for secret in [
            &b"{\"ServerURL\":\"h\",\"Username\":\"u\",\"Secret\":\"p\"}"[..],
            b"{\"Secret\": \"p\",\n",
        ] {
            let t = said(secret, b"");
            assert!(!t.contains('p') || !t.contains("\"p\""), "{t}");
            assert!(t.contains("JSON, not shown"), "{t}");
        }
        let long = "y".repeat(300);
        assert_eq!(said(long.as_bytes(), b"").chars().count(), 2 + 2 + 200 + 1);
    }

    /// A helper that fails runs once per host, however many look-ups ask at once (they wait
    /// for the one run, a second long); its failure is kept. (The one that hangs is in
    /// tests/it/token_registry.rs: 30 s.)
    #[test]
    fn a_helper_runs_once_per_host_and_its_failure_is_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let count = dir.path().join("count");
        let helper = bin.join("docker-credential-flaky");
        std::fs::write(
            &helper,
            format!(
                "#!/bin/sh\nread s\necho \"$s\" >> '{}'\n/bin/sleep 1\necho 'You do not currently have an active account selected.'\nexit 1\n",
                count.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cfg = dir.path().join("config.json");
        std::fs::write(&cfg, r#"{"credsStore":"flaky"}"#).unwrap();
        let c =
            Credentials::from_files_with_path(&[cfg], Some(bin.as_os_str().to_owned())).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .unwrap();
        let errors: Vec<AuthError> = rt.block_on(async {
            let mut tasks = Vec::new();
            for host in [
                "a.example",
                "a.example",
                "b.example",
                "a.example",
                "b.example",
            ] {
                let c = c.clone();
                tasks.push(tokio::spawn(async move { c.resolve(host).await }));
            }
            let mut errs = Vec::new();
            for t in tasks {
                errs.push(t.await.unwrap().unwrap_err());
            }
            // Later look-ups get the kept failure.
            errs.push(c.resolve("a.example").await.unwrap_err());
            errs
        });
        let mut asked: Vec<String> = std::fs::read_to_string(&count)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        asked.sort();
        assert_eq!(asked, ["a.example", "b.example"]);
        let e = errors[5].to_string();
        assert!(
            e.contains("\"You do not currently have an active account selected.\"")
                && e.contains("`echo a.example | docker-credential-flaky get`"),
            "{e}"
        );
    }
}
