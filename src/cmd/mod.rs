//! The commands: the only place that prints, prompts or reads the environment.

pub mod build;
pub mod discover;
pub mod inspect;
pub mod keygen;
pub mod load;
pub mod serve;
pub mod split;
pub mod verify;

use anyhow::Context as _;
use std::io::IsTerminal;
use std::path::PathBuf;

/// Every environment variable koord-bundle reads, in one place.
pub mod env {
    /// Password of the signing key (else a prompt on a terminal).
    pub const KEY_PASSWORD: &str = "KOORD_BUNDLE_KEY_PASSWORD";
    /// Overrides the config directory (keys) [default: ~/.config/koord-bundle].
    pub const CONFIG_DIR: &str = "KOORD_BUNDLE_CONFIG_DIR";
    /// Overrides the cache directory [default: ~/.cache/koord-bundle].
    pub const CACHE_DIR: &str = "KOORD_BUNDLE_CACHE_DIR";
    /// Fixes the bundle's creation time (reproducible builds).
    pub const SOURCE_DATE_EPOCH: &str = "SOURCE_DATE_EPOCH";
    /// Registry auth file (podman/skopeo convention).
    pub const REGISTRY_AUTH_FILE: &str = "REGISTRY_AUTH_FILE";
    /// Docker config directory.
    pub const DOCKER_CONFIG: &str = "DOCKER_CONFIG";
    /// Podman's runtime auth file lives in `$XDG_RUNTIME_DIR/containers/auth.json`.
    pub const XDG_RUNTIME_DIR: &str = "XDG_RUNTIME_DIR";
    /// Where `docker-credential-*` helpers are found.
    pub const PATH: &str = "PATH";
}

/// Exit code for verification and user errors.
pub const EXIT_USER: i32 = 1;
/// Exit code for internal failures.
pub const EXIT_INTERNAL: i32 = 2;

/// The config directory holding the default key pair.
pub fn config_dir() -> anyhow::Result<PathBuf> {
    if let Some(d) = std::env::var_os(env::CONFIG_DIR) {
        return Ok(PathBuf::from(d));
    }
    dirs::config_dir()
        .map(|d| d.join("koord-bundle"))
        .context("no config directory for this user: pass the path explicitly or set KOORD_BUNDLE_CONFIG_DIR")
}

/// The default blob cache.
pub fn cache_dir() -> anyhow::Result<PathBuf> {
    if let Some(d) = std::env::var_os(env::CACHE_DIR) {
        return Ok(PathBuf::from(d));
    }
    dirs::cache_dir()
        .map(|d| d.join("koord-bundle"))
        .context("no cache directory for this user: pass --cache DIR or set KOORD_BUNDLE_CACHE_DIR")
}

/// The signing key: `explicit`, else `koord-bundle.key` in the config directory, with the
/// path of its public key. A missing key is an error saying how to make one when `required`,
/// else `None`.
pub fn signing_key(
    explicit: Option<&std::path::Path>,
    required: bool,
) -> anyhow::Result<Option<(minisign::SecretKey, PathBuf)>> {
    use crate::bundle::sign;
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => config_dir()?.join(sign::SECRET_KEY_FILE),
    };
    if !path.exists() {
        if !required {
            return Ok(None);
        }
        anyhow::bail!(
            "no signing key at {}: create one with `koord-bundle keygen` (writes koord-bundle.key and koord-bundle.pub into {}), pass --sign-key FILE, or --unsigned",
            path.display(),
            path.parent().map(|p| p.display().to_string()).unwrap_or_default()
        );
    }
    let password = if sign::secret_key_is_encrypted(&path)? {
        key_password(false)?
    } else {
        None
    };
    let sk = sign::load_secret_key(&path, password)?;
    Ok(Some((sk, path.with_extension("pub"))))
}

/// The key password: the environment, else a prompt on a terminal, else `None`.
pub fn key_password(confirm: bool) -> anyhow::Result<Option<String>> {
    if let Ok(p) = std::env::var(env::KEY_PASSWORD) {
        return Ok(Some(p));
    }
    if !std::io::stdin().is_terminal() {
        return Ok(None);
    }
    let p = prompt_password("Key password: ")?;
    if confirm && prompt_password("Key password (again): ")? != p {
        anyhow::bail!("the passwords do not match");
    }
    Ok(Some(p))
}

fn prompt_password(prompt: &str) -> anyhow::Result<String> {
    // Echo off through stty; the password never reaches argv or the environment of a child.
    eprint!("{prompt}");
    let _ = std::process::Command::new("stty")
        .arg("-echo")
        .stdin(std::process::Stdio::inherit())
        .status();
    let mut line = String::new();
    let r = std::io::stdin().read_line(&mut line);
    let _ = std::process::Command::new("stty")
        .arg("echo")
        .stdin(std::process::Stdio::inherit())
        .status();
    eprintln!();
    r.context("reading the password")?;
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

/// Container auth files, in order of precedence.
pub fn auth_files() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(f) = std::env::var_os(env::REGISTRY_AUTH_FILE) {
        v.push(PathBuf::from(f));
    }
    if let Some(d) = std::env::var_os(env::DOCKER_CONFIG) {
        v.push(PathBuf::from(d).join("config.json"));
    }
    if let Some(h) = dirs::home_dir() {
        v.push(h.join(".docker/config.json"));
    }
    if let Some(r) = std::env::var_os(env::XDG_RUNTIME_DIR) {
        v.push(PathBuf::from(r).join("containers/auth.json"));
    }
    v
}

/// Registry credentials from the auth files, with credential helpers found on `$PATH`.
pub fn registry_credentials() -> anyhow::Result<crate::store::Credentials> {
    Ok(crate::store::Credentials::from_files_with_path(
        &auth_files(),
        std::env::var_os(env::PATH),
    )?)
}

/// Report every registry retry on the progress line: what failed, attempt n of m, next in s.
pub fn retry_reporter(progress: &crate::progress::Progress) -> crate::store::RetryReporter {
    let p = progress.clone();
    crate::store::RetryReporter(std::sync::Arc::new(move |e: &crate::store::RetryEvent| {
        p.warn(format!(
            "retrying {} on {} (attempt {} of {} failed, next in {:.1} s): {}",
            e.what,
            e.registry,
            e.attempt,
            e.of,
            e.next_in.as_secs_f64(),
            e.error
        ))
    }))
}

/// Creation time: `SOURCE_DATE_EPOCH` when set, else now (seconds).
pub fn creation_time() -> anyhow::Result<u64> {
    match std::env::var(env::SOURCE_DATE_EPOCH) {
        Ok(s) => s
            .trim()
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={s:?} is not a number of seconds")),
        Err(_) => Ok(std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs()),
    }
}

/// RFC 3339 of seconds since the epoch.
pub fn rfc3339(secs: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
        .to_string()
}

/// Print a JSON document on stdout.
pub fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Exit code for an error chain: user/verification errors are 1, internal failures 2.
pub fn exit_code(e: &anyhow::Error) -> i32 {
    use crate::store::RegistryError;
    // A full disk (or quota) is never the user's input at fault, whichever command hit it.
    let disk_full = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(
                io.kind(),
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            )
        })
    });
    if disk_full {
        return EXIT_INTERNAL;
    }
    for cause in e.chain() {
        let registry = cause
            .downcast_ref::<RegistryError>()
            .or_else(|| {
                cause
                    .downcast_ref::<crate::copy::WalkError>()
                    .and_then(|w| w.registry())
            })
            .or_else(|| {
                cause
                    .downcast_ref::<crate::store::StoreError>()
                    .and_then(|s| s.registry())
            });
        if let Some(r) = registry {
            return if r.is_transient() {
                EXIT_INTERNAL
            } else {
                EXIT_USER
            };
        }
        if let Some(crate::bundle::pack::PackError::Write { .. }) = cause.downcast_ref() {
            return EXIT_INTERNAL;
        }
    }
    EXIT_USER
}
