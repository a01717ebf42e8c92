//! The commands: the only place that prints, prompts or reads the environment.

pub mod build;
mod carried;
pub mod diff;
pub mod discover;
mod exit_code;
pub mod inspect;
pub mod keygen;
mod listed;
pub mod load;
pub mod post_render;
mod registry_check;
pub mod serve;
pub mod sets;
pub mod sign_images;
pub mod split;
mod upstream_sigs;
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
    /// The kubeconfig files of `load` (a list, merged as kubectl merges it) when
    /// `--kubeconfig` is not given; helm gets the same list.
    pub const KUBECONFIG: &str = "KUBECONFIG";
    /// helm's release store: `load`'s checks read a release from helm's Secrets (helm's
    /// default driver), so another driver is refused ([`super::helm_env_conflicts`]).
    pub const HELM_DRIVER: &str = "HELM_DRIVER";
    /// helm's own ways to reach another cluster, or as another user, than the kubeconfig and
    /// context `load`'s checks read: refused while set ([`super::helm_env_conflicts`]).
    pub const HELM_CLUSTER: [&str; 8] = [
        "HELM_KUBECONTEXT",
        "HELM_KUBEAPISERVER",
        "HELM_KUBETOKEN",
        "HELM_KUBEASUSER",
        "HELM_KUBEASGROUPS",
        "HELM_KUBECAFILE",
        "HELM_KUBETLS_SERVER_NAME",
        "HELM_KUBEINSECURE_SKIP_TLS_VERIFY",
    ];
    /// Tests only, and only in debug builds: `main`, `task`, `blocking` or `thread` makes the
    /// binary panic there before it runs its command, so the tests see that a panic anywhere
    /// ends as [`super::install_panic_hook`] says (no input reaches a panic otherwise: each one
    /// found was fixed). Release builds do not read it.
    pub const TEST_PANIC: &str = "KOORD_BUNDLE_TEST_PANIC";
}

/// Where bugs are reported.
pub const ISSUES: &str = concat!(env!("CARGO_PKG_REPOSITORY"), "/issues");

/// Make every panic, on any thread (the main one, a tokio task, the blocking pool, a thread of
/// our own), end the process the same way: one message saying it is a bug and where to report
/// it, child processes ended, exit code [`EXIT_INTERNAL`]. Never Rust's 101, never an abort
/// (134) or a core dump: the hook exits before anything unwinds, so no second panic in a
/// destructor can turn it into an abort, and a panic on another thread cannot be lost in a
/// `JoinError`. (A write to a closed standard output or error is reported as such, not as a
/// bug.) Set once, first thing in `main`.
// Raw writes, not println!/eprintln! (which panic on a failed write, and a panic in the hook
// aborts): the message is escaped as it is built, the JSON document by serde_json.
#[allow(clippy::disallowed_methods)]
pub fn install_panic_hook() {
    use std::io::Write as _;
    use std::sync::atomic::{AtomicBool, Ordering};
    static REPORTED: AtomicBool = AtomicBool::new(false);
    std::panic::set_hook(Box::new(|info| {
        if REPORTED.swap(true, Ordering::SeqCst) {
            // Another thread is already reporting and exiting: wait for it.
            loop {
                std::thread::park();
            }
        }
        let payload = info.payload();
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".into());
        let at = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_else(|| "?".into());
        let text = if what.starts_with("failed printing to std") {
            // `println!` to a closed pipe (`koord-bundle inspect B | head -1`): not a bug.
            format!("error: {}\n", crate::text::terminal_safe(&what))
        } else {
            format!(
                "error: internal error: {} (at {at}, thread {})\n  this is a bug in koord-bundle {}: please report it at {ISSUES} with the command you ran and this message\n",
                crate::text::terminal_safe(&what),
                std::thread::current().name().unwrap_or("unnamed"),
                env!("CARGO_PKG_VERSION"),
            )
        };
        // Never a panic in here (a failed write is ignored): that would abort.
        let _ = std::io::stderr().write_all(text.as_bytes());
        if JSON_ERRORS.load(Ordering::SeqCst) {
            // With --json, the same document as every other failure (exit code 3).
            let message = text.lines().next().unwrap_or_default();
            let message = message.strip_prefix("error: ").unwrap_or(message);
            let causes: Vec<String> = text.lines().skip(1).map(|l| l.trim().to_string()).collect();
            let doc = error_json(message, &causes, EXIT_INTERNAL);
            let _ = writeln!(std::io::stdout(), "{doc}");
        }
        crate::child::kill_all();
        std::process::exit(EXIT_INTERNAL);
    }));
}

/// `KOORD_BUNDLE_TEST_PANIC` (see [`env::TEST_PANIC`]): a panic where it says, in debug builds.
pub async fn test_panic() {
    #[cfg(debug_assertions)]
    match std::env::var(env::TEST_PANIC).as_deref() {
        Ok("main") => panic!("test panic on the main thread"),
        Ok("task") => {
            let _ = tokio::spawn(async { panic!("test panic in a tokio task") }).await;
        }
        Ok("blocking") => {
            let _ = tokio::task::spawn_blocking(|| panic!("test panic on the blocking pool")).await;
        }
        Ok("thread") => {
            let _ = std::thread::spawn(|| panic!("test panic on a thread of its own")).join();
        }
        _ => {}
    }
}

// The exit codes, and the class each error type says it is of (koord_base::exit).
pub use crate::exit::{
    EXIT_COULD_NOT_TELL, EXIT_INTERNAL, EXIT_OK, EXIT_SIGINT, EXIT_SIGTERM, EXIT_USAGE, EXIT_USER,
};
pub use exit_code::{class_of, exit_code};

/// A command stopped by SIGINT or SIGTERM: what it kept, and so the exit code
/// ([`EXIT_SIGINT`], [`EXIT_SIGTERM`]).
#[derive(Debug, thiserror::Error)]
#[error("interrupted ({}): {kept}", signal.name())]
pub struct Interrupted {
    /// The signal.
    pub signal: crate::exit::Signal,
    /// What was kept, and what to do.
    pub kept: String,
}

impl crate::exit::Classify for Interrupted {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        Some(crate::exit::ExitClass::Interrupted(self.signal))
    }
}

/// SIGINT and SIGTERM, listened to from now on (the default action, ending the process at
/// once, no longer applies): resolves to the first that arrives.
pub fn interrupt_signals(
) -> anyhow::Result<impl std::future::Future<Output = crate::exit::Signal> + Send + 'static> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt()).context("cannot listen to SIGINT")?;
    let mut term = signal(SignalKind::terminate()).context("cannot listen to SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => crate::exit::Signal::Int,
            _ = term.recv() => crate::exit::Signal::Term,
        }
    })
}

/// The config directory holding the default key pair.
pub fn config_dir() -> anyhow::Result<PathBuf> {
    if let Some(d) = std::env::var_os(env::CONFIG_DIR) {
        return Ok(PathBuf::from(d));
    }
    dirs::config_dir()
        .map(|d| d.join("koord-bundle"))
        .context("no config directory for this user: pass the path explicitly or set KOORD_BUNDLE_CONFIG_DIR")
}

/// The cache directory (the index of earlier bundles, `bundle::reuse`).
pub fn cache_dir() -> anyhow::Result<PathBuf> {
    if let Some(d) = std::env::var_os(env::CACHE_DIR) {
        return Ok(PathBuf::from(d));
    }
    dirs::cache_dir().map(|d| d.join("koord-bundle")).context(
        "no cache directory for this user: set KOORD_BUNDLE_CACHE_DIR, or build with --no-cache",
    )
}

/// The key a bundle is checked with, from the options every reading command shares: `None`
/// with `--insecure-skip-signature`, said once in the same words by every command.
pub fn trusted_key(
    sig: &crate::cli::SignatureArgs,
    progress: &crate::progress::Progress,
) -> anyhow::Result<Option<minisign::PublicKey>> {
    if sig.insecure_skip_signature {
        progress.warn(
            "--insecure-skip-signature: the bundle's signature is NOT checked (its integrity still is)",
        );
        Ok(None)
    } else {
        public_key(sig.key.as_deref()).map(Some)
    }
}

/// Find the public key: `--key`, else the one in the config directory.
pub fn public_key(key: Option<&std::path::Path>) -> anyhow::Result<minisign::PublicKey> {
    let path = match key {
        Some(k) => k.to_path_buf(),
        None => config_dir()?.join(crate::bundle::sign::PUBLIC_KEY_FILE),
    };
    if !path.exists() {
        anyhow::bail!(
            "no public key at {}: pass --key PUB (the koord-bundle.pub of the build site), or --insecure-skip-signature to check everything but the signature",
            path.display()
        );
    }
    Ok(crate::bundle::sign::load_public_key(&path)?)
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
    let prompted = std::env::var_os(env::KEY_PASSWORD).is_none() && std::io::stdin().is_terminal();
    if !prompted || !sign::secret_key_is_encrypted(&path)? {
        let password = if sign::secret_key_is_encrypted(&path)? {
            key_password(false)?
        } else {
            None
        };
        let sk = sign::load_secret_key(&path, password)?;
        return Ok(Some((sk, path.with_extension("pub"))));
    }
    // On a terminal, a mistyped password is asked again, as sudo and ssh-keygen do.
    let mut attempt = 0;
    loop {
        attempt += 1;
        let password = prompt_password("Key password: ")?;
        match sign::load_secret_key(&path, Some(password)) {
            Ok(sk) => return Ok(Some((sk, path.with_extension("pub")))),
            Err(e) if attempt < PASSWORD_TRIES => {
                crate::tell!("{e}: try again");
            }
            Err(e) => {
                return Err(anyhow::Error::from(e).context(format!(
                    "{PASSWORD_TRIES} tries: no password opened the key"
                )))
            }
        }
    }
}

/// How often a password is asked on a terminal (a mistyped one, or two that differ).
const PASSWORD_TRIES: usize = 3;

/// The key password: the environment, else a prompt on a terminal, else `None`. With
/// `confirm` (a new key), it is asked twice, and again when the two differ.
pub fn key_password(confirm: bool) -> anyhow::Result<Option<String>> {
    if let Ok(p) = std::env::var(env::KEY_PASSWORD) {
        return Ok(Some(p));
    }
    if !std::io::stdin().is_terminal() {
        return Ok(None);
    }
    for attempt in 1..=PASSWORD_TRIES {
        let p = prompt_password("Key password: ")?;
        if !confirm || prompt_password("Key password (again): ")? == p {
            return Ok(Some(p));
        }
        if attempt < PASSWORD_TRIES {
            crate::tell!("the passwords do not match: try again");
        }
    }
    anyhow::bail!("the passwords did not match in {PASSWORD_TRIES} tries: no key was written")
}

// A prompt of our own words on a terminal, with no newline.
#[allow(clippy::disallowed_macros)]
pub(crate) fn prompt_password(prompt: &str) -> anyhow::Result<String> {
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

/// `SOURCE_DATE_EPOCH`, when set: the creation time of what is built (reproducible builds).
pub fn source_date_epoch() -> anyhow::Result<Option<u64>> {
    match std::env::var(env::SOURCE_DATE_EPOCH) {
        Ok(s) => Ok(Some(s.trim().parse().with_context(|| {
            format!("SOURCE_DATE_EPOCH={s:?} is not a number of seconds")
        })?)),
        Err(_) => Ok(None),
    }
}

/// The directory an output file (`-o FILE`) goes to, checked to exist and, when `writable`, to
/// take a file, before anything is downloaded or read: `.` without `-o`.
pub fn output_dir_of(output: Option<&std::path::Path>, writable: bool) -> anyhow::Result<PathBuf> {
    let dir = output
        .and_then(std::path::Path::parent)
        .filter(|p| !p.as_os_str().is_empty())
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    if output.is_some_and(|o| o.is_dir()) {
        anyhow::bail!(
            "-o {}: is a directory; name the file to write (e.g. {}/koordinator-VERSION.tar)",
            output.map(|o| o.display().to_string()).unwrap_or_default(),
            output.map(|o| o.display().to_string()).unwrap_or_default()
        );
    }
    output_dir(&dir, writable)?;
    Ok(dir)
}

/// An output directory given (`--output-dir DIR`, the folder of `-o FILE`): checked to exist
/// and, when `writable`, to take a file. Every command refuses a missing one with the same
/// message rather than create it (a typo would otherwise scatter files).
pub fn output_dir(dir: &std::path::Path, writable: bool) -> anyhow::Result<()> {
    if dir.exists() && !dir.is_dir() {
        anyhow::bail!(
            "the output directory {} is a file, not a directory: name a directory; nothing was done",
            dir.display()
        );
    }
    if !dir.is_dir() {
        anyhow::bail!(
            "the output directory {} does not exist: create it first (mkdir -p {}); nothing was done",
            dir.display(),
            dir.display()
        );
    }
    if writable {
        tempfile::Builder::new()
            .prefix(".koord-bundle-probe.")
            .tempfile_in(dir)
            .with_context(|| {
                format!(
                    "cannot write into {}: the directory must be writable (nothing was done)",
                    dir.display()
                )
            })?;
    }
    Ok(())
}

/// An output file that already exists is replaced only with `--force`.
pub fn refuse_existing(path: &std::path::Path, force: bool) -> anyhow::Result<()> {
    if !force && path.symlink_metadata().is_ok() {
        anyhow::bail!(
            "{} already exists: pass --force to replace it, or name another file; nothing was done",
            path.display()
        );
    }
    Ok(())
}

/// The bundle [`crate::bundle::OpenedBundle::open`] opened at `path`, or why not: a file that
/// cannot be read says so ("cannot read FILE"), else why it is no bundle (a split set's bad
/// header, a missing part), under `context` if given. Called where the commands first need
/// the bundle whole, after the checks that come before (`check_complete`, the key).
pub fn opened(
    path: &std::path::Path,
    opened: Result<crate::bundle::OpenedBundle, crate::bundle::reader::VerifyError>,
    context: Option<&'static str>,
) -> anyhow::Result<crate::bundle::OpenedBundle> {
    opened.or_else(|e| {
        std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
        Err(match context {
            Some(c) => anyhow::Error::new(e).context(c),
            None => e.into(),
        })
    })
}

/// A path given where a bundle is read: a directory gets the same message in every command.
pub fn bundle_arg(path: &std::path::Path) -> anyhow::Result<()> {
    if path.is_dir() {
        anyhow::bail!(
            "{} is a directory, not a bundle: name the bundle file (NAME.tar, or any part NAME.partNNN of a split set)",
            path.display()
        );
    }
    Ok(())
}

/// The inputs `build` passes to helm, checked before any download: each `--values` file is
/// bounded YAML, each `--set` is `KEY=VALUE[,KEY=VALUE...]` with a key. helm reads them itself.
pub fn check_helm_inputs(values: &[PathBuf], sets: &[String]) -> anyhow::Result<()> {
    for f in values {
        let limits = crate::yaml::VALUES_FILE;
        let text = crate::bounded::read_file_bounded(f, limits.max_bytes)
            .with_context(|| format!("cannot read values file {}", f.display()))?;
        crate::yaml::check(&format!("values file {}", f.display()), &text, &limits)?;
    }
    for s in sets {
        match s.split_once('=') {
            Some((k, _)) if !k.trim().is_empty() => {}
            _ => anyhow::bail!(
                "--set {}: expected KEY=VALUE (e.g. --set koordlet.enableSchedulerConfig=true)",
                crate::text::printable(s)
            ),
        }
    }
    Ok(())
}

/// The variables of helm's environment (read through `var`) that would make the helm `load`
/// runs keep the release elsewhere, or reach another cluster or another user, than the checks
/// before it read (the release in helm's Secrets, through the kubeconfig and `--context`): each
/// as `NAME=value` (a token's value withheld), in the order helm documents them. helm reads them
/// itself, so a conflict is refused rather than passed on, or dropped behind the user's back.
/// What helm takes as unset is not a conflict: an empty value, `HELM_DRIVER=secret`/`secrets`,
/// `HELM_KUBEINSECURE_SKIP_TLS_VERIFY` that Go's `ParseBool` does not read as true.
pub fn helm_env_conflicts(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Vec<String> {
    let mut out = Vec::new();
    let value = |name: &str| {
        var(name)
            .map(|v| v.to_string_lossy().into_owned())
            .filter(|v| !v.is_empty())
    };
    if let Some(d) = value(env::HELM_DRIVER) {
        if d != "secret" && d != "secrets" {
            out.push(format!(
                "{}={}",
                env::HELM_DRIVER,
                crate::text::printable(&d)
            ));
        }
    }
    for name in env::HELM_CLUSTER {
        let Some(v) = value(name) else { continue };
        let shown = match name {
            "HELM_KUBETOKEN" => format!("{name} (a token)"),
            "HELM_KUBEINSECURE_SKIP_TLS_VERIFY"
                if !matches!(v.as_str(), "1" | "t" | "T" | "TRUE" | "true" | "True") =>
            {
                continue
            }
            _ => format!("{name}={}", crate::text::printable(&v)),
        };
        out.push(shown);
    }
    out
}

/// The blobs of a bundle, in the same words in every command (`build`, its dry run,
/// `inspect`, `verify`, `load`, `serve`): `43 blobs in the bundle (874.0 KiB)`, every blob its
/// manifest counts, image manifests included.
pub fn blobs_in_bundle(blobs: &crate::bundle::manifest::BlobTotals) -> String {
    format!(
        "{} {} in the bundle ({})",
        blobs.count,
        crate::text::plural(blobs.count, "blob", "blobs"),
        crate::text::human_bytes(blobs.bytes)
    )
}

/// Print a JSON document on stdout, terminal-safe: serde_json escapes C0 controls only, so C1
/// controls and bidi overrides of a bundle's names and comments are written as `\uXXXX`
/// escapes ([`crate::text::json_terminal_safe`]), which every JSON reader decodes the same.
// A JSON document, printed whole: terminal_safe's escapes would break it, json_terminal_safe's do not.
#[allow(clippy::disallowed_macros)]
pub fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!(
        "{}",
        crate::text::json_terminal_safe(&serde_json::to_string_pretty(v)?)
    );
    Ok(())
}

/// The error chain as printed on stderr: `error: …`, then a `caused by: …` line per cause
/// whose text the line before does not already hold (a wrapper that quotes its cause, as most
/// do, would otherwise print it twice), every line made safe for a terminal (errors quote
/// bundles, registries and files: no control character of theirs reaches it raw).
pub fn report(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for (i, text) in chain_texts(e).iter().enumerate() {
        let prefix = if i == 0 { "error: " } else { "  caused by: " };
        out.push_str(prefix);
        out.push_str(text);
        out.push('\n');
    }
    out
}

/// The messages of an error chain, outermost first, as [`report`] prints them: a cause whose
/// text the message before already holds is left out; each made safe for a terminal.
fn chain_texts(e: &anyhow::Error) -> Vec<String> {
    let mut out = Vec::new();
    let mut last = String::new();
    for (i, cause) in e.chain().enumerate() {
        let text = cause.to_string();
        if i > 0 && last.contains(&text) {
            continue;
        }
        out.push(crate::text::terminal_safe(&text));
        last = text;
    }
    out
}

/// The kubeconfig as kubectl reads it (`--kubeconfig`, else the `$KUBECONFIG` list merged,
/// else `~/.kube/config`; `--context`, else the current context) and a client for it (`load`
/// and `verify --cluster`).
pub(crate) fn kube_client(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
) -> Result<
    (
        crate::cluster::KubeClient,
        crate::cluster::Files,
        crate::cluster::Kubeconfig,
    ),
    crate::cluster::ClusterError,
> {
    let files = crate::cluster::kubeconfig::locate(
        kubeconfig,
        std::env::var_os(env::KUBECONFIG).as_deref(),
        dirs::home_dir().as_deref(),
    )?;
    let kc = crate::cluster::kubeconfig::read(&files)?.select(context)?;
    let client = crate::cluster::KubeClient::new(&kc)?;
    Ok((client, files, kc))
}

/// Set once `--json` was given: failures (errors and panics) then also print one JSON document
/// on stdout ([`error_json`]).
static JSON_ERRORS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Print failures as JSON on stdout too (the command was given `--json`).
pub fn set_json_errors(on: bool) {
    JSON_ERRORS.store(on, std::sync::atomic::Ordering::SeqCst);
}

/// Checks that found problems: defined beside the pipeline that runs the checks.
pub use crate::load::ChecksFailed;

/// The JSON document of a failure, the same for every command:
/// `{"error": {"message": "...", "causes": ["...", ...], "exitCode": N}}`.
pub fn error_json(message: &str, causes: &[String], exit_code: i32) -> String {
    let v = serde_json::json!({
        "error": {"message": message, "causes": causes, "exitCode": exit_code}
    });
    serde_json::to_string_pretty(&v).unwrap_or_else(|_| {
        format!(
            r#"{{"error": {{"message": "(unprintable)", "causes": [], "exitCode": {exit_code}}}}}"#
        )
    })
}

/// A command failed: the error chain on stderr (and, with `--json`, one JSON document on
/// stdout, see [`error_json`]); returns its exit code ([`exit_code`]).
// The report is escaped by chain_texts; the JSON by serde_json.
#[allow(clippy::disallowed_macros)]
pub fn fail(e: &anyhow::Error) -> i32 {
    let code = exit_code(e);
    eprint!("{}", report(e));
    if JSON_ERRORS.load(std::sync::atomic::Ordering::SeqCst) {
        let texts = chain_texts(e);
        let (message, causes) = texts
            .split_first()
            .map_or(("", &[][..]), |(m, c)| (m.as_str(), c));
        let mut doc = error_json(message, causes, code);
        // A failed check carries what it found, so that automation reads the findings, not
        // only "see above".
        if let Some(failed) = e.chain().find_map(|c| c.downcast_ref::<ChecksFailed>()) {
            if let Ok(mut v) = serde_json::from_str::<serde_json::Value>(&doc) {
                v["error"]["findings"] = serde_json::Value::Array(failed.findings.clone());
                doc = serde_json::to_string_pretty(&v).unwrap_or(doc);
            }
        }
        println!("{doc}");
    }
    code
}

/// A usage error of clap's (exit [`EXIT_USAGE`]) of a command line that holds `--json`: the
/// JSON document on stdout, clap's own message still on stderr (printed by clap).
// A JSON document (its message escaped before it is serialised).
#[allow(clippy::disallowed_macros)]
pub fn usage_error_json(e: &clap::Error) {
    // clap's message runs until its first blank line: `the following required arguments were
    // not provided:` is followed by the arguments, one per indented line. All of it, on one
    // line (the usage and the hint after it stay on stderr).
    let rendered = e.render().to_string();
    let message: Vec<&str> = rendered
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(|l| l.trim())
        .collect();
    let message = message.join(" ");
    let message = message.strip_prefix("error: ").unwrap_or(&message);
    println!(
        "{}",
        error_json(&crate::text::terminal_safe(message), &[], e.exit_code())
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What helm takes as unset is no conflict; every other driver, and any of helm's own
    /// cluster or user settings, is one; a token's value is never repeated.
    #[test]
    fn helm_env_conflicts_name_what_helm_would_read_and_withhold_a_token() {
        let with = |vars: &'static [(&'static str, &'static str)]| {
            helm_env_conflicts(move |n| {
                vars.iter()
                    .find(|(k, _)| *k == n)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            })
        };
        assert!(with(&[]).is_empty());
        assert!(with(&[
            ("HELM_DRIVER", "secret"),
            ("HELM_KUBECONTEXT", ""),
            ("HELM_KUBEINSECURE_SKIP_TLS_VERIFY", "false"),
            ("HELM_NAMESPACE", "elsewhere"),
        ])
        .is_empty());
        assert!(with(&[("HELM_DRIVER", "secrets")]).is_empty());
        assert_eq!(
            with(&[
                ("HELM_KUBETOKEN", "tok-123"),
                ("HELM_DRIVER", "configmap"),
                ("HELM_KUBEINSECURE_SKIP_TLS_VERIFY", "1"),
                ("HELM_KUBEAPISERVER", "https://10.0.0.1:6443"),
            ]),
            [
                "HELM_DRIVER=configmap",
                "HELM_KUBEAPISERVER=https://10.0.0.1:6443",
                "HELM_KUBETOKEN (a token)",
                "HELM_KUBEINSECURE_SKIP_TLS_VERIFY=1",
            ]
        );
        assert_eq!(with(&[("HELM_DRIVER", "memory")]), ["HELM_DRIVER=memory"]);
    }

    #[test]
    fn report_drops_repeated_causes_and_escapes() {
        let e = anyhow::Error::from(std::io::Error::other("Is a directory"))
            .context("x: Is a directory")
            .context("bundle x: Is a directory\u{1b}[2J");
        assert_eq!(report(&e), "error: bundle x: Is a directory\\u{1b}[2J\n");
        let e = anyhow::anyhow!("cause").context("outer");
        assert_eq!(report(&e), "error: outer\n  caused by: cause\n");
    }
}
