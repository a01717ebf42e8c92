//! Running the `helm` binary: finding it, installing the chart from the private OCI registry
//! (or from the chart archive), rendering it, pulling it back.
//!
//! This is the only module of the workspace that spawns `helm`.
//!
//! # Passwords
//!
//! A registry password is never put in helm's argv (visible in the process list), in output,
//! logs or errors: when [`RegistryAccess`] carries credentials, the module logs in first with
//! `helm registry login HOST --username U --password-stdin` into a throw-away registry config
//! (`--registry-config`, in a private temporary directory removed afterwards), the password
//! written to helm's stdin, and then runs the real command with the same `--registry-config`.
//! Everything captured from helm is additionally scrubbed of the password before it is shown
//! or stored in an error.
//!
//! # Bounds
//!
//! helm is an outside program, and `helm template` is fed an untrusted chart: every run goes
//! through [`koord_base::child::run`], in a process group of its own that is killed with it, with a
//! time limit, a cap on each output stream (checked while reading) and an address space of
//! [`HELM_MEMORY`]. Passing a bound ends helm with [`HelmError::Stopped`] naming it; helm
//! crashing on its own (Go's "fatal error: out of memory", a stack overflow) is
//! [`HelmError::Crashed`].
//!
//! | run                              | time limit                 | stdout cap | stderr cap |
//! |----------------------------------|----------------------------|------------|------------|
//! | `version`, `registry login --help` | 30 s                     | 64 KiB     | 64 KiB     |
//! | `template` (chart archive)       | 120 s                      | 64 MiB (= [`koord_base::yaml::MANIFESTS`]) | 4 MiB |
//! | `template` (OCI chart)           | 300 s                      | 64 MiB     | 4 MiB      |
//! | `pull`, `registry login`         | 300 s                      | 1 MiB      | 4 MiB      |
//! | `upgrade --install`              | helm's `--timeout` (default 5 min) + 5 min | 64 MiB | 16 MiB |
//!
//! Rendering Koordinator 1.8.0 takes helm 3.17.3 about 0.2 s, 55 MB resident, and prints
//! 356 KB. `upgrade --install` waits for the cluster for up to its own `--timeout` (helm's
//! default: 5 min): the limit adds 5 min of headroom on top, so that helm's own, clearer
//! timeout message comes first.
//!
//! # Flags per helm version (checked against helm 3.17.3 and 4.1.4)
//!
//! | flag                                     | helm 3                 | helm 4 |
//! |------------------------------------------|------------------------|--------|
//! | `--plain-http` (upgrade, template, pull) | 3.13+                  | yes    |
//! | `--ca-file`, `--insecure-skip-tls-verify` honoured for OCI | 3.12+ | yes    |
//! | `registry login --ca-file`               | 3.12+                  | yes    |
//! | `registry login --insecure`              | yes                    | yes    |
//! | `registry login --plain-http`            | not in 3.17 (probed)   | yes    |
//! | `--dry-run=client`                       | 3.13+ (`--dry-run` before) | yes |
//! | `--wait` (bare)                          | boolean                | `=watcher` strategy |
//!
//! Helm 3 (at least up to 3.17) always talks plain HTTP to OCI registries whose host is
//! `localhost` or a loopback address (127.0.0.0/8, `::1`), whatever the TLS flags; errors of
//! that case carry a hint.
//!
//! Gates marked 3.12+/3.13+ come from helm's release history (helm 3.12 "OCI transport
//! refinement", 3.13 `--plain-http` and `--dry-run=client|server`); only 3.17.3 and 4.1.4 were
//! run.
//!
//! # A client-side dry run still needs a cluster
//!
//! `helm upgrade --install --dry-run=client` changes nothing in the cluster, but helm 3 and
//! helm 4 still read the release history from it first (and helm 3 its version and API groups),
//! so without a reachable Kubernetes API server it fails with "Kubernetes cluster unreachable".
//! Only `helm template` ([`Helm::template`]) renders without any cluster.

// The Koordinator chart's values and the images of rendered manifests are chart logic: they
// live in `crate::chart` (`generated_values`, `rendered_images`), not here.
use koord_base::child::{self, ChildError, Limits, LineSink, StderrMode};
use koord_base::secret::Secret;
use regex::Regex;
use semver::Version;
use serde_yaml_ng::Value;
use std::collections::HashSet;
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// What a command needs helm for, and the oldest helm that does it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    /// The oldest helm that will do.
    pub min: Version,
    /// What for, as it reads after "koord-bundle ".
    pub purpose: &'static str,
}

/// `build` renders the chart with `helm template` to find its images. helm 3.8 (January
/// 2022) is the oldest with OCI support generally available: the machine that builds a bundle
/// then has a helm that can also install it the way `load` does, from the registry.
pub const FOR_BUILD: Need = Need {
    min: Version::new(3, 8, 0),
    purpose: "build renders the chart with `helm template` to find its images",
};

/// `load` installs with helm; before 3.8 from the bundle's chart archive (no OCI), which helm
/// 3.5 already does.
pub const FOR_LOAD: Need = Need {
    min: Version::new(3, 5, 0),
    purpose: "load installs the chart with helm (3.8 or newer to install from an OCI registry)",
};

/// helm's address space (`RLIMIT_AS`), for every run: 4 GiB. helm (Go) needs about 600 MiB of
/// address space just to start (it refused to start under 512 MiB, measured with
/// `prlimit --as`), and rendering Koordinator 1.8.0 keeps 55 MB resident. Without a limit, a
/// hostile chart of a few hundred bytes took helm 3.17.3 to 11.6 GB resident in 30 s (string
/// doubling with `printf "%s%s"`) or 11.1 GB in 82 s (`tpl` calling itself) before it crashed;
/// under this limit it crashes at 4 GiB instead, and takes nothing else on the machine down
/// with it.
pub const HELM_MEMORY: u64 = 4 << 30;
/// `helm version` and other local probes.
const PROBE_TIME: Duration = Duration::from_secs(30);
/// `helm template` of a chart.
const TEMPLATE_TIME: Duration = Duration::from_secs(120);
/// `helm pull` and `helm registry login`: one registry exchange each.
const REGISTRY_TIME: Duration = Duration::from_secs(300);
/// helm's own default `--timeout` for `upgrade --install`.
const HELM_DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// What `upgrade --install` gets beyond its own `--timeout`.
const INSTALL_HEADROOM: Duration = Duration::from_secs(300);
const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
/// OCI support is generally available (no `HELM_EXPERIMENTAL_OCI`) from this helm on.
const OCI_GA: Version = Version::new(3, 8, 0);
/// `--ca-file`/`--insecure-skip-tls-verify` apply to OCI registries, `registry login --ca-file`.
const OCI_TLS_FLAGS: Version = Version::new(3, 12, 0);
/// `--plain-http` exists; `--dry-run` takes a value (`client`/`server`).
const PLAIN_HTTP_AND_DRY_RUN_MODE: Version = Version::new(3, 13, 0);
/// The file name of the throw-away registry config, next to the generated values file.
const REGISTRY_CONFIG_NAME: &str = "registry-config.json";
/// The file name of the generated values file in the private temporary directory.
const VALUES_NAME: &str = "koord-bundle-values.yaml";
/// The release's current values (helm before 3.14), next to the generated ones.
const PREVIOUS_VALUES_NAME: &str = "release-values.yaml";
/// The post-renderer's configuration, next to the values.
const POST_RENDER_NAME: &str = "post-render.json";
/// helm 4's plugin directory (`HELM_PLUGINS`), next to the values.
const PLUGINS_NAME: &str = "plugins";
/// The name of the post-renderer plugin given to helm 4.
const POST_RENDER_PLUGIN: &str = "koord-bundle";
/// helm's `--reset-then-reuse-values` (helm 3.14, January 2024).
const RESET_THEN_REUSE: Version = Version::new(3, 14, 0);
/// Lines of helm's stderr kept in errors.
const TAIL_LINES: usize = 20;

/// Errors of running helm. Every message names its subject (the helm binary, registry host,
/// chart, release or file).
#[derive(Debug, thiserror::Error)]
pub enum HelmError {
    /// No helm binary.
    #[error("helm not found {looked}: koord-bundle {} and needs helm {} or newer; install it (https://helm.sh/docs/intro/install/) or pass --helm PATH", need.purpose, need.min)]
    NotFound {
        /// Where it was looked for ("at /x/helm (--helm)", "on PATH (looked in /a, /b)").
        looked: String,
        /// What it was needed for.
        need: Need,
    },

    /// The helm binary is older than the command needs.
    #[error("helm {version} at {} is too old: koord-bundle {} and needs helm {} or newer; install a newer helm (https://helm.sh/docs/intro/install/) or pass --helm PATH", path.display(), need.purpose, need.min)]
    TooOld {
        /// The binary.
        path: PathBuf,
        /// Its version.
        version: Version,
        /// What it was needed for (boxed: with the path and version beside it, this variant
        /// made every `Result<_, HelmError>` 128 bytes, which clippy's result_large_err refuses
        /// in the crates that return it).
        need: Box<Need>,
    },

    /// helm passed a bound koord-bundle sets on it (time, output) and was stopped, with
    /// everything it started.
    #[error("{command} was stopped: {source}{}", hint_suffix(hint))]
    Stopped {
        /// The command and its subject.
        command: String,
        /// Which bound.
        source: ChildError,
        /// Another try may do better (a slow registry or cluster), as opposed to a chart that
        /// renders without end.
        transient: bool,
        /// What to do.
        hint: Option<String>,
    },

    /// helm's runtime gave up (Go's `fatal error:`): out of memory under [`HELM_MEMORY`], a
    /// stack overflow. What a hostile chart does to it; no real chart comes near.
    #[error("{command} crashed ({status}): {fatal} [hint: helm runs with an address space of {} GiB; no published chart needs a fraction of it: the chart makes helm {what}]", HELM_MEMORY >> 30)]
    Crashed {
        /// The command and its subject.
        command: String,
        /// helm's exit status.
        status: String,
        /// helm's `runtime:` and `fatal error:` lines.
        fatal: String,
        /// "run out of memory", "overflow its stack", "crash".
        what: &'static str,
    },

    /// `helm version` printed nothing that looks like a version.
    #[error("cannot tell the version of helm at {}: `helm version` printed {output:?}", path.display())]
    VersionUnknown {
        /// The binary.
        path: PathBuf,
        /// What it printed (shortened).
        output: String,
    },

    /// The helm binary could not be started.
    #[error("cannot run helm at {}: {source}", path.display())]
    Spawn {
        /// The binary.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },

    /// OCI chart references need helm 3.8 or newer.
    #[error("helm {version} cannot use the OCI chart {reference}: OCI registries need helm 3.8 or newer; install from the chart archive instead, or use a newer helm")]
    OciUnsupported {
        /// The helm version.
        version: String,
        /// The chart reference.
        reference: String,
    },

    /// A registry setting that this helm version cannot honour.
    #[error("helm {version} cannot {what} for registry {host}: that needs helm {needs} or newer")]
    Unsupported {
        /// The helm version.
        version: String,
        /// The registry host.
        host: String,
        /// What was asked ("use a custom CA file").
        what: &'static str,
        /// The helm version needed.
        needs: &'static str,
    },

    /// Only one of user name and password was given.
    #[error("registry {host}: a {missing} is needed too (user name and password go together)")]
    IncompleteCredentials {
        /// The registry host.
        host: String,
        /// "user name" or "password".
        missing: &'static str,
    },

    /// `helm registry login` failed.
    #[error(
        "helm registry login to {host} as {username} failed ({status}){}:\n{stderr_tail}",
        hint_suffix(hint)
    )]
    LoginFailed {
        /// The registry host.
        host: String,
        /// The user name.
        username: String,
        /// helm's exit status.
        status: String,
        /// The last lines of helm's output (password scrubbed).
        stderr_tail: String,
        /// What probably went wrong, if known.
        hint: Option<String>,
    },

    /// A helm command failed.
    #[error("{command} failed ({status}){}:\n{stderr_tail}", hint_suffix(hint))]
    Failed {
        /// The command and its subject, e.g. `helm upgrade --install koordinator (chart …)`.
        command: String,
        /// helm's exit status.
        status: String,
        /// The last lines of helm's stderr (password scrubbed).
        stderr_tail: String,
        /// What probably went wrong, if known.
        hint: Option<String>,
    },

    /// `helm pull` succeeded but the archive is not where it should be.
    #[error("helm pull {reference} --version {version} succeeded but wrote no chart archive into {}", dest.display())]
    PulledArchiveMissing {
        /// The chart reference.
        reference: String,
        /// The chart version.
        version: String,
        /// The destination directory.
        dest: PathBuf,
    },

    /// A file or directory of ours could not be written or read.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What it is ("cannot write the generated values file").
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },

    /// The generated values could not be serialised.
    #[error("cannot serialise the generated helm values: {source}")]
    Values {
        /// The serialiser's error.
        source: serde_yaml_ng::Error,
    },
}

impl koord_base::exit::Classify for HelmError {
    fn exit_class(&self) -> Option<koord_base::exit::ExitClass> {
        use koord_base::exit::ExitClass as C;
        match self {
            // Starting helm: the kind of I/O error decides.
            HelmError::Spawn { .. } => None,
            // koord-bundle's own files and values: the machine's (or a bug).
            HelmError::Io { .. }
            | HelmError::Values { .. }
            | HelmError::PulledArchiveMissing { .. } => Some(C::Machine),
            // A registry or cluster that did not answer helm.
            HelmError::LoginFailed { .. } | HelmError::Failed { .. } if self.is_transient() => {
                Some(C::Machine)
            }
            // A slow registry or cluster; a chart that renders without end is the input's.
            HelmError::Stopped { transient, .. } => {
                Some(if *transient { C::Machine } else { C::Input })
            }
            // No helm or one too old, refused logins, charts helm refuses or crashes on.
            _ => Some(C::Input),
        }
    }
}

impl HelmError {
    /// helm failed on the network or on the other side (a refused or reset connection, a
    /// timeout, a 5xx or 429 of the cluster or registry), as far as its output tells: helm
    /// exits 1 for every failure, so its words are all there is to go by. Another try later may
    /// work; any other failure of helm is taken as an answer about the input.
    pub fn is_transient(&self) -> bool {
        const TRANSIENT: [&str; 13] = [
            "connection refused",
            "timed out",
            "connection reset",
            "no route to host",
            "i/o timeout",
            "tls handshake timeout",
            "context deadline exceeded",
            "internal server error",
            "bad gateway",
            "service unavailable",
            "gateway timeout",
            "too many requests",
            "unable to handle the request",
        ];
        match self {
            HelmError::LoginFailed { stderr_tail, .. } | HelmError::Failed { stderr_tail, .. } => {
                let t = stderr_tail.to_ascii_lowercase();
                TRANSIENT.iter().any(|w| t.contains(w))
            }
            _ => false,
        }
    }
}

fn hint_suffix(hint: &Option<String>) -> String {
    match hint {
        Some(h) => format!(" [hint: {h}]"),
        None => String::new(),
    }
}

/// A helm binary and its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Helm {
    /// The binary.
    pub path: PathBuf,
    /// Its version (`helm version`).
    pub version: Version,
}

/// Access to the private OCI registry the chart is pulled from.
#[derive(Debug, Clone, Default)]
pub struct RegistryAccess {
    /// `host[:port]`, e.g. `127.0.0.1:15001`.
    pub host: String,
    /// User name for `helm registry login` (together with `password`).
    pub username: Option<String>,
    /// Password or token; only ever written to helm's stdin.
    pub password: Option<Secret>,
    /// CA bundle to verify the registry's certificate (`--ca-file`).
    pub ca_file: Option<PathBuf>,
    /// The registry speaks plain HTTP (`--plain-http`).
    pub plain_http: bool,
    /// Do not verify the registry's certificate (`--insecure-skip-tls-verify`).
    pub insecure_skip_tls_verify: bool,
}

impl RegistryAccess {
    /// User name and password, if both are given; an error if only one is.
    pub fn credentials(&self) -> Result<Option<(&str, &Secret)>, HelmError> {
        match (&self.username, &self.password) {
            (Some(u), Some(p)) => Ok(Some((u.as_str(), p))),
            (None, None) => Ok(None),
            (Some(_), None) => Err(HelmError::IncompleteCredentials {
                host: self.host.clone(),
                missing: "password",
            }),
            (None, Some(_)) => Err(HelmError::IncompleteCredentials {
                host: self.host.clone(),
                missing: "user name",
            }),
        }
    }

    fn has_credentials(&self) -> bool {
        self.username.is_some() && self.password.is_some()
    }

    fn password(&self) -> Option<&Secret> {
        self.password.as_ref()
    }

    /// Helm 3 speaks plain HTTP to OCI registries on loopback hosts whatever the TLS flags:
    /// why `helm` cannot reach this registry, if it cannot (`load` checks it before any push).
    pub fn loopback_tls_hint(&self, helm: &Helm) -> Option<String> {
        if helm.major() == 3 && !self.plain_http && is_loopback_host(&self.host) {
            Some(format!(
                "helm 3 always uses plain HTTP for OCI registries on localhost or a loopback address, so it cannot reach the TLS registry {}; use helm 4, a non-loopback host name for the registry, or a plain-HTTP registry",
                self.host
            ))
        } else {
            None
        }
    }
}

/// `host[:port]` is `localhost` or a loopback address (127.0.0.0/8, ::1): containerd's
/// `MatchLocalhost`, which makes helm 3 use plain HTTP for OCI registries.
fn is_loopback_host(host: &str) -> bool {
    let h = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or(rest)
    } else if host.matches(':').count() == 1 {
        host.split(':').next().unwrap_or(host)
    } else {
        host
    };
    h.eq_ignore_ascii_case("localhost")
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Where the chart comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChartSource {
    /// A chart in an OCI registry (helm 3.8+).
    Oci {
        /// `oci://HOST[/PREFIX]/charts/koordinator`.
        reference: String,
        /// The chart version (the tag).
        version: String,
    },
    /// A chart archive on disk (any helm 3.5+).
    Archive(PathBuf),
}

impl ChartSource {
    fn describe(&self) -> String {
        match self {
            ChartSource::Oci { reference, version } => format!("chart {reference} {version}"),
            ChartSource::Archive(p) => format!("chart archive {}", p.display()),
        }
    }

    /// CHART [--version V] as helm's arguments.
    fn args(&self, out: &mut Vec<String>) {
        match self {
            ChartSource::Oci { reference, version } => {
                out.push(reference.clone());
                out.push("--version".into());
                out.push(version.clone());
            }
            ChartSource::Archive(p) => {
                let s = p.to_string_lossy().into_owned();
                // A path starting with '-' would read as a flag.
                out.push(if s.starts_with('-') {
                    format!("./{s}")
                } else {
                    s
                });
            }
        }
    }
}

/// Everything `helm upgrade --install` of Koordinator needs.
#[derive(Debug, Clone)]
pub struct InstallPlan {
    /// Release name.
    pub release: String,
    /// Release namespace (`--namespace`): `default`, as Koordinator's guide installs it. The
    /// chart renders its own `koordinator-system` Namespace and puts its objects there; the
    /// release namespace only holds helm's release records. It must never be
    /// `koordinator-system` on a fresh cluster: helm writes the release record before the
    /// chart creates that namespace (404), and `--create-namespace` would make the chart's
    /// Namespace object conflict with helm 3 ("already exists"; helm 4 applies and gets
    /// through).
    pub namespace: String,
    /// `--create-namespace`: only for a release namespace that does not exist and is not the
    /// chart's own.
    pub create_namespace: bool,
    /// The chart.
    pub chart: ChartSource,
    /// The values koord-bundle decides (see `chart::generated_values`); written to a private
    /// temporary file and passed first.
    pub generated_values: Value,
    /// The user's values files (`--values`), passed after the generated ones, in order.
    pub user_values: Vec<PathBuf>,
    /// The user's `--set` expressions, passed last, in order.
    pub user_sets: Vec<String>,
    /// Where an upgrade's values start from (ignored by a fresh install).
    pub values_mode: ValuesMode,
    /// The release's current user values (`helm get values`), for [`ValuesMode::Keep`] with a
    /// helm before 3.14 (no `--reset-then-reuse-values`): passed as the first values file.
    pub previous_values: Option<Value>,
    /// helm's post-renderer: `koord-bundle post-render` (see `chart::post_render`).
    pub post_render: Option<PostRenderer>,
    /// `--kubeconfig` (one file: helm's flag takes one).
    pub kubeconfig: Option<PathBuf>,
    /// `KUBECONFIG` in helm's environment: a list of files, merged by helm as by kubectl (and
    /// shown before the command line printed).
    pub kubeconfig_env: Option<std::ffi::OsString>,
    /// `--kube-context`.
    pub context: Option<String>,
    /// Access to the registry of an OCI chart (ignored for chart archives).
    pub registry: Option<RegistryAccess>,
    /// `--wait`.
    pub wait: bool,
    /// `--timeout` (a Go duration, e.g. `10m`).
    pub timeout: Option<String>,
}

/// Write the files the printed command of `helm` names (the generated values, 0600; the
/// release's values when this helm needs them as a file; the post-renderer's configuration and
/// helm 4's plugin) into `dir`, a folder the caller chose to keep (0700, its own), so that the
/// command runs as printed after the process ends. The files of an earlier run in `dir` (these
/// names only, nothing else in it) are replaced. Returns the values file; the registry config
/// a login fills goes next to it.
pub fn keep_command_files(
    plan: &InstallPlan,
    helm: &Helm,
    dir: &Path,
) -> Result<PathBuf, HelmError> {
    for name in [
        VALUES_NAME,
        PREVIOUS_VALUES_NAME,
        POST_RENDER_NAME,
        REGISTRY_CONFIG_NAME,
    ] {
        remove_if_there(&dir.join(name))?;
    }
    let plugin = dir.join(PLUGINS_NAME).join(POST_RENDER_PLUGIN);
    remove_if_there(&plugin.join("plugin.yaml"))?;
    write_values_file(plan, Some(&helm.version), dir)
}

/// Remove a file of ours if it is there (a file, or a symbolic link: never what it points to).
fn remove_if_there(path: &Path) -> Result<(), HelmError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(HelmError::Io {
            what: "cannot replace the earlier file",
            path: path.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Write the plan's generated values (0600) into `dir`, with the release's values and the
/// post-renderer's files when the plan has them; returns the values file.
/// The release's values are written only for a helm that reads them as a file (before 3.14, no
/// `--reset-then-reuse-values`): they may hold a site's secrets.
fn write_values_file(
    plan: &InstallPlan,
    v: Option<&Version>,
    dir: &Path,
) -> Result<PathBuf, HelmError> {
    let values_file = dir.join(VALUES_NAME);
    let yaml = serde_yaml_ng::to_string(&plan.generated_values)
        .map_err(|source| HelmError::Values { source })?;
    write_private(&values_file, yaml.as_bytes()).map_err(|source| HelmError::Io {
        what: "cannot write the generated values file",
        path: values_file.clone(),
        source,
    })?;
    if let Some(prev) = plan.previous_values_file(v) {
        let file = sibling(&values_file, PREVIOUS_VALUES_NAME);
        let yaml = serde_yaml_ng::to_string(prev).map_err(|source| HelmError::Values { source })?;
        write_private(&file, yaml.as_bytes()).map_err(|source| HelmError::Io {
            what: "cannot write the release's values file",
            path: file.clone(),
            source,
        })?;
    }
    write_post_render(plan, &values_file)?;
    Ok(values_file)
}

/// The release a dry run of `helm upgrade --install` would make ([`Helm::render_release`]).
#[derive(Debug, Clone)]
pub struct RenderedRelease {
    /// The user values the new revision would hold (`helm get values`), merged as the real
    /// run merges them.
    pub config: serde_json::Value,
    /// Every object it would apply (post-rendered), as helm stores it.
    pub manifest: String,
    /// Its hooks, each a document after a `# Source:` line of its template; "" when it has
    /// none. helm 4 post-renders them; helm 3 does not (helm/helm#7891).
    pub hooks: String,
    /// The revision it would be.
    pub revision: u64,
}

impl RenderedRelease {
    /// Every document helm rendered: the objects, then the hooks.
    pub fn all_manifests(&self) -> String {
        format!("{}\n{}", self.manifest, self.hooks)
    }
}

/// What a successful helm command printed (password scrubbed).
#[derive(Debug, Clone, Default)]
pub struct HelmOutput {
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl HelmOutput {
    /// The rendered objects of a `--dry-run` release report (the `HOOKS:` and `MANIFEST:`
    /// sections, without `NOTES:`), or all of stdout if it has no such sections.
    pub fn manifest(&self) -> String {
        let s = self.stdout.as_str();
        let start = ["\nHOOKS:\n", "\nMANIFEST:\n"]
            .iter()
            .filter_map(|m| s.find(m).map(|i| i + m.len()))
            .min();
        let Some(start) = start else {
            return s.to_string();
        };
        let body = &s[start..];
        let body = match body.find("\nNOTES:\n") {
            Some(end) => &body[..end + 1],
            None => body,
        };
        body.lines()
            .filter(|l| *l != "MANIFEST:")
            .fold(String::new(), |mut acc, l| {
                acc.push_str(l);
                acc.push('\n');
                acc
            })
    }
}

/// Version-dependent flag choices. `None` means the newest helm (3.13+ and 4).
fn at_least(v: Option<&Version>, min: &Version) -> bool {
    v.is_none_or(|v| v >= min)
}

impl InstallPlan {
    /// A plan with the defaults: no user values, no `--reuse-values`/`--reset-values`, the
    /// current kubeconfig and context, no registry access, no `--wait`.
    pub fn new(
        release: impl Into<String>,
        namespace: impl Into<String>,
        chart: ChartSource,
        generated_values: Value,
    ) -> Self {
        InstallPlan {
            release: release.into(),
            namespace: namespace.into(),
            create_namespace: false,
            chart,
            generated_values,
            user_values: Vec::new(),
            user_sets: Vec::new(),
            values_mode: ValuesMode::Keep,
            previous_values: None,
            post_render: None,
            kubeconfig: None,
            kubeconfig_env: None,
            context: None,
            registry: None,
            wait: false,
            timeout: None,
        }
    }

    /// The helm arguments of `helm upgrade --install` (without the binary), with the values file
    /// path given; for display (`--dry-run` prints "the exact helm command"), and for running.
    ///
    /// These are the arguments for helm 3.13+ and helm 4; [`InstallPlan::command_line`] and
    /// [`Helm::upgrade_install`] adapt them to older helm (no `--plain-http`, bare `--dry-run`).
    /// When the plan has registry credentials for an OCI chart, the arguments include
    /// `--registry-config` naming `registry-config.json` next to `values_file`: the throw-away
    /// registry config that [`Helm::upgrade_install`] fills with `helm registry login
    /// --password-stdin` first. The password itself is never among the arguments.
    pub fn upgrade_install_args(&self, values_file: &Path, client_dry_run: bool) -> Vec<String> {
        self.upgrade_args_for(None, values_file, client_dry_run)
    }

    /// Display form: the command line, shell-quoted, with secrets impossible to appear (they
    /// never are in args). With registry credentials, a first line shows the `helm registry
    /// login … --password-stdin` that precedes the install (the password goes to its stdin).
    pub fn command_line(&self, helm: &Helm, values_file: &Path, client_dry_run: bool) -> String {
        let bin = shell_quote(&helm.path.to_string_lossy());
        let mut out = String::new();
        if let Some(reg) = self.oci_registry().filter(|r| r.has_credentials()) {
            let cfg = registry_config_path(values_file);
            let login = login_args(reg, &helm.version, &cfg, helm.major() >= 4);
            let _ = writeln!(out, "{bin} {}", join_quoted(&login));
        }
        let args = self.upgrade_args_for(Some(&helm.version), values_file, client_dry_run);
        if let Some(list) = &self.kubeconfig_env {
            let _ = write!(out, "KUBECONFIG={} ", shell_quote(&list.to_string_lossy()));
        }
        if let Some(dir) = self.helm_plugins(helm, values_file) {
            let _ = write!(out, "HELM_PLUGINS={} ", shell_quote(&dir.to_string_lossy()));
        }
        let _ = write!(out, "{bin} {}", join_quoted(&args));
        out
    }

    /// The command that undoes an interrupted `helm upgrade --install` of this plan, as the
    /// printed command would run it (same helm, kubeconfig and context): `helm rollback RELEASE
    /// REVISION` to the revision that was deployed before, or `helm uninstall RELEASE` when
    /// there was none (an install interrupted leaves `pending-install`, which only an
    /// uninstall clears).
    pub fn recovery_line(&self, helm: &Helm, deployed_before: Option<u32>) -> String {
        let mut a: Vec<String> = match deployed_before {
            Some(rev) => vec!["rollback".into(), self.release.clone(), rev.to_string()],
            None => vec!["uninstall".into(), self.release.clone()],
        };
        a.push("--namespace".into());
        a.push(self.namespace.clone());
        if let Some(k) = &self.kubeconfig {
            a.push("--kubeconfig".into());
            a.push(k.to_string_lossy().into_owned());
        }
        if let Some(c) = &self.context {
            a.push("--kube-context".into());
            a.push(c.clone());
        }
        let mut out = String::new();
        if let Some(list) = &self.kubeconfig_env {
            let _ = write!(out, "KUBECONFIG={} ", shell_quote(&list.to_string_lossy()));
        }
        let _ = write!(
            out,
            "{} {}",
            shell_quote(&helm.path.to_string_lossy()),
            join_quoted(&a)
        );
        out
    }

    /// The registry access, when the chart is in an OCI registry.
    fn oci_registry(&self) -> Option<&RegistryAccess> {
        match self.chart {
            ChartSource::Oci { .. } => self.registry.as_ref(),
            ChartSource::Archive(_) => None,
        }
    }

    fn upgrade_args_for(
        &self,
        v: Option<&Version>,
        values_file: &Path,
        client_dry_run: bool,
    ) -> Vec<String> {
        let mut a: Vec<String> = vec!["upgrade".into(), "--install".into(), self.release.clone()];
        self.chart.args(&mut a);
        a.push("--namespace".into());
        a.push(self.namespace.clone());
        // Never for the chart's own namespace (see `namespace`).
        if self.create_namespace {
            a.push("--create-namespace".into());
        }
        if let Some(k) = &self.kubeconfig {
            a.push("--kubeconfig".into());
            a.push(k.to_string_lossy().into_owned());
        }
        if let Some(c) = &self.context {
            a.push("--kube-context".into());
            a.push(c.clone());
        }
        self.registry_and_values_args(v, values_file, &mut a);
        match self.values_mode {
            ValuesMode::Keep if at_least(v, &RESET_THEN_REUSE) => {
                a.push("--reset-then-reuse-values".into())
            }
            // Before 3.14: the release's values are the first values file (see
            // `registry_and_values_args`), over the new chart's defaults.
            ValuesMode::Keep => a.push("--reset-values".into()),
            ValuesMode::Reset => a.push("--reset-values".into()),
            ValuesMode::Reuse => a.push("--reuse-values".into()),
        }
        self.post_render_args(v, values_file, &mut a);
        if self.wait {
            // helm 3: a boolean; helm 4: bare --wait means the "watcher" strategy.
            a.push("--wait".into());
        }
        if let Some(t) = &self.timeout {
            a.push("--timeout".into());
            a.push(t.clone());
        }
        if client_dry_run {
            if at_least(v, &PLAIN_HTTP_AND_DRY_RUN_MODE) {
                a.push("--dry-run=client".into());
            } else {
                a.push("--dry-run".into());
            }
        }
        a
    }

    fn template_args_for(&self, v: Option<&Version>, values_file: &Path) -> Vec<String> {
        let mut a: Vec<String> = vec!["template".into(), self.release.clone()];
        self.chart.args(&mut a);
        a.push("--namespace".into());
        a.push(self.namespace.clone());
        self.registry_and_values_args(v, values_file, &mut a);
        a
    }

    /// Registry flags (OCI charts only), then the values: generated first, then the user's
    /// files and `--set`s in order (later ones win, `--set` over files).
    fn registry_and_values_args(
        &self,
        v: Option<&Version>,
        values_file: &Path,
        a: &mut Vec<String>,
    ) {
        if let Some(reg) = self.oci_registry() {
            let cfg = reg
                .has_credentials()
                .then(|| registry_config_path(values_file));
            registry_flags(reg, v, cfg.as_deref(), a);
        }
        if self.previous_values_file(v).is_some() {
            a.push("--values".into());
            a.push(
                sibling(values_file, PREVIOUS_VALUES_NAME)
                    .to_string_lossy()
                    .into_owned(),
            );
        }
        a.push("--values".into());
        a.push(values_file.to_string_lossy().into_owned());
        for f in &self.user_values {
            a.push("--values".into());
            a.push(f.to_string_lossy().into_owned());
        }
        for s in &self.user_sets {
            a.push("--set".into());
            a.push(s.clone());
        }
    }
}

fn registry_config_path(values_file: &Path) -> PathBuf {
    values_file.with_file_name(REGISTRY_CONFIG_NAME)
}

/// A file next to the values file (the plan's private directory).
fn sibling(values_file: &Path, name: &str) -> PathBuf {
    values_file.with_file_name(name)
}

impl InstallPlan {
    /// The release's values to pass as a file: with [`ValuesMode::Keep`] on a helm that has no
    /// `--reset-then-reuse-values`.
    fn previous_values_file(&self, v: Option<&Version>) -> Option<&Value> {
        match self.values_mode {
            ValuesMode::Keep if !at_least(v, &RESET_THEN_REUSE) => self.previous_values.as_ref(),
            _ => None,
        }
    }

    /// `--post-renderer`: helm 3 runs an executable with arguments; helm 4 only runs plugins,
    /// so it gets a `postrenderer/v1` plugin of ours in `plugins/` next to the values file
    /// (`HELM_PLUGINS`, see [`InstallPlan::helm_plugins`]).
    fn post_render_args(&self, v: Option<&Version>, values_file: &Path, a: &mut Vec<String>) {
        let Some(pr) = &self.post_render else { return };
        let config = sibling(values_file, POST_RENDER_NAME);
        if v.is_some_and(|v| v.major >= 4) {
            a.push("--post-renderer".into());
            a.push(POST_RENDER_PLUGIN.into());
        } else {
            a.push("--post-renderer".into());
            a.push(pr.exe.to_string_lossy().into_owned());
            for arg in [
                "post-render".to_string(),
                "--config".into(),
                config.to_string_lossy().into_owned(),
            ] {
                a.push("--post-renderer-args".into());
                a.push(arg);
            }
        }
    }

    /// `HELM_PLUGINS` for helm 4's post-renderer plugin, when there is one.
    fn helm_plugins(&self, helm: &Helm, values_file: &Path) -> Option<PathBuf> {
        (self.post_render.is_some() && helm.major() >= 4)
            .then(|| sibling(values_file, PLUGINS_NAME))
    }
}

/// Where an upgrade's values start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ValuesMode {
    /// The release's current user values, then this run's over them, over the NEW chart's
    /// defaults: helm's `--reset-then-reuse-values` (3.14+), or the release's values as the
    /// first values file with `--reset-values` before that. The site's settings survive an
    /// upgrade.
    #[default]
    Keep,
    /// Only this run's values over the chart's defaults (`--reset-values`): what was set
    /// before is dropped.
    Reset,
    /// helm's `--reuse-values`: the release's merged values, the new chart's defaults unused
    /// where a key was set before.
    Reuse,
}

/// helm's post-renderer, `EXE post-render --config FILE`.
#[derive(Debug, Clone)]
pub struct PostRenderer {
    /// The koord-bundle executable.
    pub exe: PathBuf,
    /// Its configuration (JSON), written next to the values file.
    pub config_json: String,
}

/// Write the post-renderer's configuration and, for helm 4, its plugin next to `values_file`.
fn write_post_render(plan: &InstallPlan, values_file: &Path) -> Result<(), HelmError> {
    let Some(pr) = &plan.post_render else {
        return Ok(());
    };
    let io = |what: &'static str, path: PathBuf| move |source| HelmError::Io { what, path, source };
    let config = sibling(values_file, POST_RENDER_NAME);
    write_private(&config, pr.config_json.as_bytes()).map_err(io(
        "cannot write the post-renderer's configuration",
        config.clone(),
    ))?;
    let dir = sibling(values_file, PLUGINS_NAME).join(POST_RENDER_PLUGIN);
    std::fs::create_dir_all(&dir).map_err(io(
        "cannot create the post-renderer plugin directory",
        dir.clone(),
    ))?;
    let yaml = serde_yaml_ng::to_string(&serde_json::json!({
        "apiVersion": "v1",
        "type": "postrenderer/v1",
        "name": POST_RENDER_PLUGIN,
        "version": env!("CARGO_PKG_VERSION"),
        "runtime": "subprocess",
        "runtimeConfig": {"platformCommand": [{
            "command": pr.exe,
            "args": ["post-render", "--config", config],
        }]},
    }))
    .map_err(|source| HelmError::Values { source })?;
    let file = dir.join("plugin.yaml");
    write_private(&file, yaml.as_bytes())
        .map_err(io("cannot write the post-renderer plugin", file.clone()))
}

/// The TLS/plain-HTTP/login flags of `upgrade`, `template` and `pull` for an OCI chart.
fn registry_flags(
    reg: &RegistryAccess,
    v: Option<&Version>,
    registry_config: Option<&Path>,
    a: &mut Vec<String>,
) {
    // Before 3.13 there is no --plain-http: helm 3.8–3.12 fall back to HTTP by themselves.
    if reg.plain_http && at_least(v, &PLAIN_HTTP_AND_DRY_RUN_MODE) {
        a.push("--plain-http".into());
    }
    if let Some(ca) = &reg.ca_file {
        a.push("--ca-file".into());
        a.push(ca.to_string_lossy().into_owned());
    }
    if reg.insecure_skip_tls_verify {
        a.push("--insecure-skip-tls-verify".into());
    }
    if let Some(cfg) = registry_config {
        a.push("--registry-config".into());
        a.push(cfg.to_string_lossy().into_owned());
    }
}

/// `registry login HOST --username U --password-stdin --registry-config CFG [TLS flags]`.
fn login_args(
    reg: &RegistryAccess,
    v: &Version,
    registry_config: &Path,
    plain_http_flag: bool,
) -> Vec<String> {
    let mut a: Vec<String> = vec!["registry".into(), "login".into(), reg.host.clone()];
    a.push("--username".into());
    a.push(reg.username.clone().unwrap_or_default());
    a.push("--password-stdin".into());
    a.push("--registry-config".into());
    a.push(registry_config.to_string_lossy().into_owned());
    if let Some(ca) = &reg.ca_file {
        if v >= &OCI_TLS_FLAGS {
            a.push("--ca-file".into());
            a.push(ca.to_string_lossy().into_owned());
        }
    }
    if reg.insecure_skip_tls_verify {
        a.push("--insecure".into());
    }
    // helm 3.17 has no `registry login --plain-http` and falls back from HTTPS to HTTP itself;
    // helm 4 has the flag (and newer oras-go no longer sends credentials over a fallback).
    if reg.plain_http && plain_http_flag {
        a.push("--plain-http".into());
    }
    a
}

/// Quote one argument for a POSIX shell.
pub(crate) fn shell_quote(s: &str) -> String {
    let safe = !s.is_empty()
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(c, '_' | '-' | '.' | '/' | ':' | '=' | '@' | '%' | '+' | ',')
        });
    if safe {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

fn join_quoted(args: &[String]) -> String {
    args.iter()
        .map(|a| shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A secret this long, found inside a longer word, is still taken for the secret (it can be
/// glued to other text, e.g. after a percent-escape); a shorter one is replaced only where it
/// stands alone.
const SCRUB_INSIDE_WORDS: usize = 8;

/// `text` with the secret replaced by `<redacted>`.
///
/// The password only ever reaches helm on its stdin (`--password-stdin`), so helm has no
/// reason to print it; this is a second line of defence, and it must not mangle the rest:
/// with the password `p`, replacing every `p` turned "unexpected" into `unex<redacted>ected`.
/// So an occurrence is replaced when it stands alone as a word (nothing alphanumeric right
/// before or after it: `user:p@host`, `"p"`, `p` at the end of a line), whatever its length; and
/// inside a longer word only for secrets of [`SCRUB_INSIDE_WORDS`] characters or more, which
/// ordinary words do not contain by chance.
fn redact(text: &str, secret: Option<&Secret>) -> String {
    let Some(secret) = secret.map(Secret::expose).filter(|s| !s.is_empty()) else {
        return text.to_string();
    };
    let inside_words = secret.chars().count() >= SCRUB_INSIDE_WORDS;
    let word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(secret) {
        let before = rest[..at].chars().next_back().or(out.chars().next_back());
        let after = rest[at + secret.len()..].chars().next();
        out.push_str(&rest[..at]);
        if inside_words || (!word(before) && !word(after)) {
            out.push_str("<redacted>");
        } else {
            out.push_str(secret);
        }
        rest = &rest[at + secret.len()..];
    }
    out.push_str(rest);
    out
}

/// helm's error: `text` from its last line starting with `Error:` (helm's prefix of the
/// error it exits with), or all of it when there is none.
fn error_part(text: &str) -> &str {
    let mut at = None;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if line.starts_with("Error:") {
            at = Some(offset);
        }
        offset += line.len();
    }
    &text[at.unwrap_or(0)..]
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(n);
    lines[start..].join("\n")
}

/// A version in `helm version` output: `v3.17.3`, `v3.17.3+ge4da497`, `Client: v2.16.1+g…`.
fn parse_version(text: &str) -> Option<Version> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    let re = RE
        .get_or_init(|| Regex::new(r"v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z][0-9A-Za-z.-]*))?").ok())
        .as_ref()?;
    let c = re.captures(text)?;
    let num = |i: usize| c.get(i).and_then(|m| m.as_str().parse::<u64>().ok());
    let mut v = Version::new(num(1)?, num(2)?, num(3)?);
    if let Some(pre) = c.get(4) {
        v.pre = semver::Prerelease::new(pre.as_str()).unwrap_or(semver::Prerelease::EMPTY);
    }
    Some(v)
}

/// The first executable `helm` in a PATH-like list; else every directory looked in.
fn find_on_path(path_var: Option<&OsStr>) -> Result<PathBuf, Vec<PathBuf>> {
    let name = if cfg!(windows) { "helm.exe" } else { "helm" };
    let dirs: Vec<PathBuf> = path_var
        .map(std::env::split_paths)
        .into_iter()
        .flatten()
        .collect();
    dirs.iter()
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
        .ok_or(dirs)
}

/// "on PATH (looked in /a, /b)" for [`HelmError::NotFound`].
fn looked_on_path(dirs: &[PathBuf]) -> String {
    if dirs.is_empty() {
        return "on PATH (PATH is empty or not set)".into();
    }
    let list: Vec<String> = dirs
        .iter()
        .map(|d| {
            if d.as_os_str().is_empty() {
                ".".to_string()
            } else {
                d.display().to_string()
            }
        })
        .collect();
    format!("on PATH (looked in {})", list.join(", "))
}

fn is_executable(p: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    }
    #[cfg(not(unix))]
    {
        p.is_file()
    }
}

/// Write a file only we can read (0600 on Unix).
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        opts.mode(0o600);
    }
    let mut f = opts.open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

fn private_tempdir() -> Result<tempfile::TempDir, HelmError> {
    // tempfile creates the directory 0700.
    tempfile::Builder::new()
        .prefix("koord-bundle-helm-")
        .tempdir()
        .map_err(|source| HelmError::Io {
            what: "cannot create a private temporary directory in",
            path: std::env::temp_dir(),
            source,
        })
}

fn status_text(s: &ExitStatus) -> String {
    s.to_string()
}

/// The kinds of helm runs, each with its bounds (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Job {
    /// `helm version`, `helm registry login --help`: local and instant.
    Probe,
    /// `helm template` of a chart archive: an untrusted chart, rendered locally.
    Template,
    /// `helm template` of a chart in an OCI registry: fetched first, then rendered.
    TemplateFromRegistry,
    /// `helm pull`, `helm registry login`: one registry exchange.
    Registry,
    /// `helm upgrade --install`, given helm's own `--timeout`.
    Install(Duration),
}

impl Job {
    fn limits(self) -> Limits {
        let (timeout, max_stdout, max_stderr) = match self {
            Job::Probe => (PROBE_TIME, 64 * KIB, 64 * KIB),
            Job::Template => (
                TEMPLATE_TIME,
                koord_base::yaml::MANIFESTS.max_bytes,
                4 * MIB,
            ),
            Job::TemplateFromRegistry => (
                REGISTRY_TIME,
                koord_base::yaml::MANIFESTS.max_bytes,
                4 * MIB,
            ),
            Job::Registry => (REGISTRY_TIME, MIB, 4 * MIB),
            Job::Install(own) => (own.saturating_add(INSTALL_HEADROOM), 64 * MIB, 16 * MIB),
        };
        Limits {
            timeout,
            max_stdout,
            max_stderr,
            max_memory: Some(HELM_MEMORY),
        }
    }

    /// A run stopped at a bound may do better later: a registry or cluster that was slow.
    fn transient(self) -> bool {
        matches!(
            self,
            Job::Registry | Job::TemplateFromRegistry | Job::Install(_)
        )
    }

    fn hint(self) -> Option<String> {
        Some(match self {
            Job::Template => "a published Koordinator chart renders in well under a second, to under 1 MiB: this chart is not one koord-bundle can take; check where it came from".into(),
            Job::Install(_) => "the cluster or the registry answered too slowly; check them, then re-run".into(),
            Job::Registry | Job::TemplateFromRegistry => {
                "the registry answered too slowly; check it, then re-run".into()
            }
            Job::Probe => "this helm does not answer `helm version`: is it a working helm binary?".into(),
        })
    }
}

/// helm's `--timeout` (a Go duration: `300s`, `10m`, `1h30m`, `1.5h`); `None` if it does not
/// read as one (helm then refuses it itself).
fn go_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let n: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += n * scale;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total).ok()
}

/// A finished helm run, its output scrubbed of the password.
struct Ran {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Pass each line to `sink` scrubbed of `secret`.
fn scrubbing(sink: LineSink, secret: Option<Secret>) -> LineSink {
    Arc::new(move |stream, line| {
        let text = redact(&String::from_utf8_lossy(line), secret.as_ref());
        sink(stream, text.as_bytes())
    })
}

/// One helm run: what it is, and what it is fed.
struct Run<'a> {
    /// The command and its subject, for errors.
    command: &'a str,
    job: Job,
    /// `job`'s bounds (tests shorten them).
    limits: Limits,
    stdin: Option<&'a [u8]>,
    /// Scrubbed from everything helm prints.
    secret: Option<&'a Secret>,
    /// Receives helm's lines as they come.
    sink: Option<LineSink>,
    /// `KUBECONFIG` for helm: the list the pre-flight read, so that helm merges the same files.
    kubeconfig_env: Option<&'a OsStr>,
    /// `HELM_PLUGINS`: helm 4's post-renderer plugin.
    helm_plugins: Option<PathBuf>,
}

impl<'a> Run<'a> {
    fn new(command: &'a str, job: Job) -> Self {
        Run {
            command,
            job,
            limits: job.limits(),
            stdin: None,
            secret: None,
            sink: None,
            kubeconfig_env: None,
            helm_plugins: None,
        }
    }
    fn secret(mut self, secret: Option<&'a Secret>) -> Self {
        self.secret = secret;
        self
    }
}

/// Run helm at `path` with `args` within the run's bounds (through [`child::run`]).
fn run_helm(path: &Path, args: &[String], run: Run<'_>) -> Result<Ran, HelmError> {
    let Run {
        command,
        job,
        limits,
        stdin,
        secret,
        sink,
        kubeconfig_env,
        helm_plugins,
    } = run;
    let mut cmd = Command::new(path);
    cmd.args(args);
    if let Some(list) = kubeconfig_env {
        cmd.env("KUBECONFIG", list);
    }
    if let Some(dir) = helm_plugins {
        cmd.env("HELM_PLUGINS", dir);
    }
    let sink = sink.map(|s| scrubbing(s, secret.cloned()));
    let out = child::run(cmd, stdin, StderrMode::Capture, &limits, sink).map_err(|e| match e {
        ChildError::NotFound { .. } => HelmError::Spawn {
            path: path.to_path_buf(),
            source: std::io::ErrorKind::NotFound.into(),
        },
        ChildError::Spawn { source, .. } | ChildError::Wait { source, .. } => HelmError::Spawn {
            path: path.to_path_buf(),
            source,
        },
        e @ (ChildError::TimedOut { .. } | ChildError::OutputTooLarge { .. }) => {
            HelmError::Stopped {
                command: command.to_string(),
                source: e,
                transient: job.transient(),
                hint: job.hint(),
            }
        }
    })?;
    Ok(Ran {
        status: out.status,
        stdout: redact(&String::from_utf8_lossy(&out.stdout), secret),
        stderr: redact(&String::from_utf8_lossy(&out.stderr), secret),
    })
}

/// The error of a helm run that failed: [`HelmError::Crashed`] when Go's runtime gave up (its
/// `fatal error:` line, with the `runtime:` line before it; never the goroutine dump that
/// follows), else [`HelmError::Failed`] with the tail of `output` (helm's own error, from its
/// last `Error:` line on, when `error_only`).
fn failure(
    command: String,
    status: &ExitStatus,
    output: &str,
    error_only: bool,
    hint: Option<String>,
) -> HelmError {
    let lines: Vec<&str> = output.lines().collect();
    if let Some(i) = lines.iter().position(|l| l.starts_with("fatal error: ")) {
        let start = if i > 0 && lines[i - 1].starts_with("runtime: ") {
            i - 1
        } else {
            i
        };
        let fatal: String = lines[start..=i].join("; ").chars().take(400).collect();
        let what = if fatal.contains("out of memory") {
            "run out of memory"
        } else if fatal.contains("stack overflow") || fatal.contains("stack exceeds") {
            "overflow its stack"
        } else {
            "crash"
        };
        return HelmError::Crashed {
            command,
            status: status_text(status),
            fatal,
            what,
        };
    }
    HelmError::Failed {
        command,
        status: status_text(status),
        stderr_tail: tail(
            if error_only {
                error_part(output)
            } else {
                output
            },
            TAIL_LINES,
        ),
        hint,
    }
}

impl Helm {
    /// Find helm: `explicit` (`--helm PATH`), else `helm` on `path_var` (the caller's `PATH`),
    /// for what `need` says. Reads its version with `helm version --template '{{.Version}}'`
    /// (helm 3 and 4 print e.g. `v3.17.3`/`v4.1.4`), falling back to `helm version --short`;
    /// each probe is bounded like every helm run.
    ///
    /// Errors: [`HelmError::NotFound`] naming where it looked (the `--helm` path, or every
    /// `PATH` entry) and how to install helm, [`HelmError::TooOld`] below `need.min`,
    /// [`HelmError::VersionUnknown`], [`HelmError::Stopped`] for a helm that hangs.
    pub fn find(
        explicit: Option<&Path>,
        path_var: Option<&OsStr>,
        need: &Need,
    ) -> Result<Helm, HelmError> {
        let not_found = |looked: String| HelmError::NotFound {
            looked,
            need: need.clone(),
        };
        let path = match explicit {
            Some(p) if !p.exists() => {
                return Err(not_found(format!("at {} (--helm)", p.display())))
            }
            Some(p) => p.to_path_buf(),
            None => find_on_path(path_var).map_err(|dirs| not_found(looked_on_path(&dirs)))?,
        };
        let probe = |args: &[&str]| -> Result<(bool, String), HelmError> {
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            let ran = run_helm(&path, &args, Run::new("helm version", Job::Probe)).map_err(
                |e| match e {
                    HelmError::Spawn { source, .. }
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        not_found(format!("at {}", path.display()))
                    }
                    other => other,
                },
            )?;
            Ok((
                ran.status.success(),
                format!("{}{}", ran.stdout, ran.stderr),
            ))
        };
        let (ok, text) = probe(&["version", "--template", "{{.Version}}"])?;
        let version = match (ok, parse_version(text.trim())) {
            (true, Some(v)) => v,
            _ => {
                let (_, short) = probe(&["version", "--short"])?;
                match parse_version(&short) {
                    Some(v) => v,
                    None => {
                        let mut output: String = format!("{} / {}", text.trim(), short.trim())
                            .chars()
                            .take(200)
                            .collect();
                        if output.len() >= 200 {
                            output.push('…');
                        }
                        return Err(HelmError::VersionUnknown { path, output });
                    }
                }
            }
        };
        if version < need.min {
            return Err(HelmError::TooOld {
                path,
                version,
                need: Box::new(need.clone()),
            });
        }
        Ok(Helm { path, version })
    }

    /// helm can pull charts from OCI registries without `HELM_EXPERIMENTAL_OCI` (3.8.0+).
    pub fn supports_oci(&self) -> bool {
        self.version >= OCI_GA
    }

    /// The major version (3 or 4).
    pub fn major(&self) -> u64 {
        self.version.major
    }

    /// Write generated values to a temp file (0600), log in to the registry if credentials are
    /// given using a throw-away registry config (`--registry-config` in a temp dir, password via
    /// `--password-stdin`, never argv), then run `helm upgrade --install ...`
    /// ([`InstallPlan::upgrade_install_args`], adapted to this helm). helm's output goes to
    /// `sink` line by line as it comes, scrubbed of the password (the caller prints it); a
    /// failure is [`HelmError::Failed`] with helm's own error (from its last `Error:` line).
    /// The run is bounded by helm's `--timeout` (default 5 min) plus 5 min.
    ///
    /// `client_dry_run` adds `--dry-run=client` (`--dry-run` before helm 3.13). Note that even
    /// then helm reads the release history from the cluster: without a reachable Kubernetes API
    /// server it fails with "Kubernetes cluster unreachable"; use [`Helm::template`] to render
    /// without a cluster.
    pub fn upgrade_install(
        &self,
        plan: &InstallPlan,
        client_dry_run: bool,
        sink: Option<LineSink>,
    ) -> Result<HelmOutput, HelmError> {
        self.check_chart(plan)?;
        let dir = private_tempdir()?;
        let values_file = self.prepare(plan, dir.path())?;
        let args = plan.upgrade_args_for(Some(&self.version), &values_file, client_dry_run);
        let command = format!(
            "helm upgrade --install {} ({}, namespace {})",
            plan.release,
            plan.chart.describe(),
            plan.namespace
        );
        let reg = plan.oci_registry();
        let secret = reg.and_then(RegistryAccess::password);
        let own_timeout = plan
            .timeout
            .as_deref()
            .and_then(go_duration)
            .unwrap_or(HELM_DEFAULT_TIMEOUT);
        let mut run = Run::new(&command, Job::Install(own_timeout)).secret(secret);
        run.sink = sink;
        run.kubeconfig_env = plan.kubeconfig_env.as_deref();
        run.helm_plugins = plan.helm_plugins(self, &values_file);
        let ran = run_helm(&self.path, &args, run);
        drop(dir);
        let ran = ran?;
        if !ran.status.success() {
            // The whole output was passed on as it came: the error repeats only helm's own.
            let hint = reg.and_then(|r| r.loopback_tls_hint(self));
            return Err(failure(command, &ran.status, &ran.stderr, true, hint));
        }
        Ok(HelmOutput {
            stdout: ran.stdout,
            stderr: ran.stderr,
        })
    }

    /// The release this plan would make, as helm makes it, without changing anything: `helm
    /// upgrade --install ... --dry-run=server -o json` (`--dry-run` before helm 3.13). helm
    /// reads the release it upgrades from the cluster, merges the values as the real run will
    /// ([`ValuesMode`]), renders with the cluster's API versions and `lookup`, and runs the
    /// post-renderer: its `config` is the user values the new revision will hold, its
    /// `manifest` every object it will apply. helm does not send the objects to the API
    /// server: the caller checks them there (`cluster::upgrade`).
    pub fn render_release(&self, plan: &InstallPlan) -> Result<RenderedRelease, HelmError> {
        self.check_chart(plan)?;
        let dir = private_tempdir()?;
        let values_file = self.prepare(plan, dir.path())?;
        let mut args = plan.upgrade_args_for(Some(&self.version), &values_file, false);
        args.push(
            if at_least(Some(&self.version), &PLAIN_HTTP_AND_DRY_RUN_MODE) {
                "--dry-run=server".into()
            } else {
                "--dry-run".into()
            },
        );
        args.extend(["-o".to_string(), "json".to_string()]);
        let command = format!(
            "helm upgrade --install {} --dry-run ({}, namespace {})",
            plan.release,
            plan.chart.describe(),
            plan.namespace
        );
        let reg = plan.oci_registry();
        let secret = reg.and_then(RegistryAccess::password);
        let mut run = Run::new(&command, Job::Install(HELM_DEFAULT_TIMEOUT)).secret(secret);
        run.kubeconfig_env = plan.kubeconfig_env.as_deref();
        run.helm_plugins = plan.helm_plugins(self, &values_file);
        let ran = run_helm(&self.path, &args, run);
        drop(dir);
        let ran = ran?;
        if !ran.status.success() {
            let hint = reg.and_then(|r| r.loopback_tls_hint(self));
            return Err(failure(command, &ran.status, &ran.stderr, true, hint));
        }
        let bad = |reason: String| HelmError::Failed {
            command: command.clone(),
            status: "exit status: 0".into(),
            stderr_tail: reason,
            hint: None,
        };
        let v: serde_json::Value = serde_json::from_str(&ran.stdout)
            .map_err(|e| bad(format!("its -o json output is not JSON: {e}")))?;
        let manifest = v["manifest"]
            .as_str()
            .ok_or_else(|| bad("its -o json output has no manifest".into()))?
            .to_string();
        Ok(RenderedRelease {
            config: match &v["config"] {
                serde_json::Value::Null => serde_json::json!({}),
                c => c.clone(),
            },
            manifest,
            hooks: v["hooks"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|h| {
                    format!(
                        "---\n# Source: {}\n{}\n",
                        h["path"].as_str().unwrap_or_default(),
                        h["manifest"].as_str().unwrap_or_default()
                    )
                })
                .collect(),
            revision: v["version"].as_u64().unwrap_or(0),
        })
    }

    /// `helm template` of the plan's chart with the same values (generated, then the user's)
    /// and, for OCI charts, the same registry login/TLS flags → the rendered manifests. Needs no
    /// cluster. Bounded: 120 s, 64 MiB of output, [`HELM_MEMORY`].
    pub fn template(&self, plan: &InstallPlan) -> Result<String, HelmError> {
        self.check_chart(plan)?;
        let dir = private_tempdir()?;
        let values_file = self.prepare(plan, dir.path())?;
        let args = plan.template_args_for(Some(&self.version), &values_file);
        let reg = plan.oci_registry();
        let secret = reg.and_then(RegistryAccess::password);
        let command = format!("helm template {} ({})", plan.release, plan.chart.describe());
        // An OCI chart is fetched from the registry first: more time, for a slow registry.
        let job = match plan.chart {
            ChartSource::Archive(_) => Job::Template,
            ChartSource::Oci { .. } => Job::TemplateFromRegistry,
        };
        let ran = run_helm(&self.path, &args, Run::new(&command, job).secret(secret));
        drop(dir);
        let ran = ran?;
        if !ran.status.success() {
            let hint = reg.and_then(|r| r.loopback_tls_hint(self));
            return Err(failure(command, &ran.status, &ran.stderr, false, hint));
        }
        Ok(ran.stdout)
    }

    /// `helm pull oci://... --version V --destination DIR` (DIR is created if needed), with the
    /// registry's login/TLS flags. Returns the path of the pulled archive.
    pub fn pull(
        &self,
        reference: &str,
        version: &str,
        dest: &Path,
        registry: Option<&RegistryAccess>,
    ) -> Result<PathBuf, HelmError> {
        if !self.supports_oci() {
            return Err(HelmError::OciUnsupported {
                version: self.version.to_string(),
                reference: reference.to_string(),
            });
        }
        if let Some(reg) = registry {
            self.check_registry(reg)?;
        }
        std::fs::create_dir_all(dest).map_err(|source| HelmError::Io {
            what: "cannot create the chart destination directory",
            path: dest.to_path_buf(),
            source,
        })?;
        let before: HashSet<PathBuf> = list_archives(dest).into_iter().collect();
        let dir = private_tempdir()?;
        let cfg = dir.path().join(REGISTRY_CONFIG_NAME);
        let mut args: Vec<String> = vec![
            "pull".into(),
            reference.to_string(),
            "--version".into(),
            version.to_string(),
        ];
        args.push("--destination".into());
        args.push(dest.to_string_lossy().into_owned());
        if let Some(reg) = registry {
            let logged_in = self.login_if_needed(reg, &cfg)?;
            registry_flags(
                reg,
                Some(&self.version),
                logged_in.then_some(cfg.as_path()),
                &mut args,
            );
        }
        let secret = registry.and_then(RegistryAccess::password);
        let command = format!("helm pull {reference} --version {version}");
        let ran = run_helm(
            &self.path,
            &args,
            Run::new(&command, Job::Registry).secret(secret),
        );
        drop(dir);
        let ran = ran?;
        if !ran.status.success() {
            let hint = registry.and_then(|r| r.loopback_tls_hint(self));
            return Err(failure(command, &ran.status, &ran.stderr, false, hint));
        }
        let name = reference
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or(reference);
        let expected = dest.join(format!("{name}-{version}.tgz"));
        if expected.is_file() {
            return Ok(expected);
        }
        let new: Vec<PathBuf> = list_archives(dest)
            .into_iter()
            .filter(|p| !before.contains(p))
            .collect();
        match new.as_slice() {
            [one] => Ok(one.clone()),
            _ => Err(HelmError::PulledArchiveMissing {
                reference: reference.to_string(),
                version: version.to_string(),
                dest: dest.to_path_buf(),
            }),
        }
    }

    /// The chart source and registry settings are usable with this helm.
    fn check_chart(&self, plan: &InstallPlan) -> Result<(), HelmError> {
        if let ChartSource::Oci { reference, .. } = &plan.chart {
            if !self.supports_oci() {
                return Err(HelmError::OciUnsupported {
                    version: self.version.to_string(),
                    reference: reference.clone(),
                });
            }
            if let Some(reg) = &plan.registry {
                self.check_registry(reg)?;
            }
        }
        Ok(())
    }

    fn check_registry(&self, reg: &RegistryAccess) -> Result<(), HelmError> {
        reg.credentials()?;
        let unsupported = |what: &'static str| HelmError::Unsupported {
            version: self.version.to_string(),
            host: reg.host.clone(),
            what,
            needs: "3.12.0",
        };
        // Before 3.12 helm ignores --ca-file/--insecure-skip-tls-verify for OCI registries:
        // refuse rather than fail later with an obscure certificate error.
        if reg.ca_file.is_some() && self.version < OCI_TLS_FLAGS {
            return Err(unsupported("use a custom CA file"));
        }
        if reg.insecure_skip_tls_verify && self.version < OCI_TLS_FLAGS {
            return Err(unsupported("skip TLS verification"));
        }
        Ok(())
    }

    /// Write the generated values (0600) into `dir` and log in if the plan has credentials.
    fn prepare(&self, plan: &InstallPlan, dir: &Path) -> Result<PathBuf, HelmError> {
        let values_file = write_values_file(plan, Some(&self.version), dir)?;
        if let Some(reg) = plan.oci_registry() {
            self.login_if_needed(reg, &registry_config_path(&values_file))?;
        }
        Ok(values_file)
    }

    /// `helm registry login` into `registry_config` when `reg` has credentials; the password
    /// goes to helm's stdin. Returns whether it logged in.
    fn login_if_needed(
        &self,
        reg: &RegistryAccess,
        registry_config: &Path,
    ) -> Result<bool, HelmError> {
        let Some((username, password)) = reg.credentials()? else {
            return Ok(false);
        };
        let plain_flag = reg.plain_http && self.login_has_plain_http();
        let args = login_args(reg, &self.version, registry_config, plain_flag);
        let mut stdin = password.expose().as_bytes().to_vec();
        stdin.push(b'\n');
        let command = format!("helm registry login {}", reg.host);
        let mut run = Run::new(&command, Job::Registry).secret(Some(password));
        run.stdin = Some(&stdin);
        let ran = run_helm(&self.path, &args, run)?;
        if !ran.status.success() {
            return Err(HelmError::LoginFailed {
                host: reg.host.clone(),
                username: username.to_string(),
                status: status_text(&ran.status),
                stderr_tail: tail(&format!("{}{}", ran.stdout, ran.stderr), TAIL_LINES),
                hint: None,
            });
        }
        Ok(true)
    }

    /// Whether `helm registry login` has `--plain-http` (helm 4 does, helm 3.17 does not).
    fn login_has_plain_http(&self) -> bool {
        if self.major() >= 4 {
            return true;
        }
        let args: Vec<String> = ["registry", "login", "--help"].map(String::from).into();
        run_helm(
            &self.path,
            &args,
            Run::new("helm registry login --help", Job::Probe),
        )
        .is_ok_and(|ran| ran.stdout.contains("--plain-http"))
    }
}

fn list_archives(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "tgz"))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PW: &str = "s3cr3t-pa55";

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    fn helm(version: &str) -> Helm {
        Helm {
            path: PathBuf::from("/opt/helm bin/helm"),
            version: v(version),
        }
    }

    fn tls_reg() -> RegistryAccess {
        RegistryAccess {
            host: "reg.example:5000".into(),
            username: Some("koord".into()),
            password: Some(Secret::new(PW)),
            ca_file: Some("/etc/ca.crt".into()),
            plain_http: false,
            insecure_skip_tls_verify: false,
        }
    }

    fn plan(chart: ChartSource, registry: Option<RegistryAccess>) -> InstallPlan {
        let mut p = InstallPlan::new(
            "koordinator",
            "koordinator-system",
            chart,
            // What `chart::generated_values` gives for a prefixed registry, a feature gate, one
            // CRD off, the host network and a pull secret; written out here, as helm sits
            // beside chart and does not use it (tests/it/layers.rs).
            koord_base::yaml::parse_value(
                "the test's values",
                b"imageRepositoryHost: reg.example:5000/prefix\nfeatureGates: A=true\ncrds: {reservations: false}\nmanager: {hostNetwork: true}\nimagePullSecrets: [{name: regcred}]\n",
                &koord_base::yaml::VALUES,
            )
            .expect("the test's values parse"),
        );
        p.registry = registry;
        p.user_values = vec!["/u/one.yaml".into(), "/u/two.yaml".into()];
        p.user_sets = vec!["a=1".into(), "b=2".into()];
        p
    }

    fn oci() -> ChartSource {
        ChartSource::Oci {
            reference: "oci://reg.example:5000/prefix/charts/koordinator".into(),
            version: "1.8.0".into(),
        }
    }

    #[test]
    fn parses_helm_version_outputs() {
        assert_eq!(parse_version("v3.17.3"), Some(v("3.17.3")));
        assert_eq!(parse_version("v4.1.4"), Some(v("4.1.4")));
        assert_eq!(parse_version("v3.17.3+ge4da497"), Some(v("3.17.3")));
        assert_eq!(
            parse_version("Client: v2.16.1+gbbdfe5e\n"),
            Some(v("2.16.1"))
        );
        assert_eq!(
            parse_version(r#"version.BuildInfo{Version:"v3.18.0-rc.1", GitCommit:"x"}"#),
            Some(v("3.18.0-rc.1"))
        );
        assert_eq!(parse_version("<no value>"), None);
        assert_eq!(parse_version(""), None);
    }

    #[test]
    fn upgrade_args_in_order() {
        let mut p = plan(
            oci(),
            Some(RegistryAccess {
                host: "reg.example:5000".into(),
                plain_http: true,
                ..Default::default()
            }),
        );
        p.kubeconfig = Some("/k/config".into());
        p.context = Some("prod".into());
        p.values_mode = ValuesMode::Reuse;
        p.wait = true;
        p.timeout = Some("10m".into());
        let a = p.upgrade_install_args(Path::new("/tmp/x/values.yaml"), true);
        let expected: Vec<&str> = vec![
            "upgrade",
            "--install",
            "koordinator",
            "oci://reg.example:5000/prefix/charts/koordinator",
            "--version",
            "1.8.0",
            "--namespace",
            "koordinator-system",
            "--kubeconfig",
            "/k/config",
            "--kube-context",
            "prod",
            "--plain-http",
            "--values",
            "/tmp/x/values.yaml",
            "--values",
            "/u/one.yaml",
            "--values",
            "/u/two.yaml",
            "--set",
            "a=1",
            "--set",
            "b=2",
            "--reuse-values",
            "--wait",
            "--timeout",
            "10m",
            "--dry-run=client",
        ];
        assert_eq!(a, expected);
        assert!(!a.iter().any(|x| x == "--create-namespace"));
    }

    #[test]
    fn old_helm_gets_old_flags() {
        let p = plan(
            oci(),
            Some(RegistryAccess {
                host: "r:1".into(),
                plain_http: true,
                ..Default::default()
            }),
        );
        let a = p.upgrade_args_for(Some(&v("3.12.3")), Path::new("/v.yaml"), true);
        assert!(!a.iter().any(|x| x == "--plain-http"));
        assert!(a.iter().any(|x| x == "--dry-run"));
        assert!(!a.iter().any(|x| x.starts_with("--dry-run=")));
        let a = p.upgrade_args_for(Some(&v("4.1.4")), Path::new("/v.yaml"), false);
        assert!(a.iter().any(|x| x == "--plain-http"));
        assert!(!a.iter().any(|x| x.starts_with("--dry-run")));
    }

    #[test]
    fn the_release_values_carry_over_and_the_post_renderer_is_given_per_helm() {
        let mut p = plan(oci(), None);
        p.previous_values =
            Some(serde_yaml_ng::to_value(serde_json::json!({"manager": {"replicas": 3}})).unwrap());
        p.post_render = Some(PostRenderer {
            exe: "/bin/koord-bundle".into(),
            config_json: "{}".into(),
        });
        let vf = Path::new("/d/values.yaml");
        // helm 3.14+: helm merges the release's values itself.
        let a = p.upgrade_args_for(Some(&v("3.17.3")), vf, false);
        assert!(a.iter().any(|x| x == "--reset-then-reuse-values"), "{a:?}");
        assert!(
            !a.iter().any(|x| x.ends_with("release-values.yaml")),
            "{a:?}"
        );
        let post: Vec<&str> = a
            .windows(2)
            .filter(|w| w[0].starts_with("--post-renderer"))
            .map(|w| w[1].as_str())
            .collect();
        assert_eq!(
            post,
            [
                "/bin/koord-bundle",
                "post-render",
                "--config",
                "/d/post-render.json"
            ]
        );
        // Before 3.14: the release's values are the first values file, over the chart's defaults.
        let a = p.upgrade_args_for(Some(&v("3.12.3")), vf, false);
        let files: Vec<&str> = a
            .windows(2)
            .filter(|w| w[0] == "--values")
            .map(|w| w[1].as_str())
            .collect();
        assert_eq!(
            files,
            [
                "/d/release-values.yaml",
                "/d/values.yaml",
                "/u/one.yaml",
                "/u/two.yaml"
            ]
        );
        assert!(a.iter().any(|x| x == "--reset-values"), "{a:?}");
        // helm 4: the plugin, through HELM_PLUGINS.
        let a = p.upgrade_args_for(Some(&v("4.1.4")), vf, false);
        assert!(
            a.windows(2)
                .any(|w| w[0] == "--post-renderer" && w[1] == "koord-bundle"),
            "{a:?}"
        );
        let line = p.command_line(&helm("4.1.4"), vf, false);
        assert!(line.contains("HELM_PLUGINS=/d/plugins "), "{line}");
        p.values_mode = ValuesMode::Reset;
        let a = p.upgrade_args_for(Some(&v("3.12.3")), vf, false);
        assert!(
            !a.iter().any(|x| x.ends_with("release-values.yaml")),
            "{a:?}"
        );
    }

    #[test]
    fn credentials_mean_registry_config_next_to_values_never_password() {
        let p = plan(oci(), Some(tls_reg()));
        let a = p.upgrade_install_args(Path::new("/tmp/d/values.yaml"), false);
        let i = a.iter().position(|x| x == "--registry-config").unwrap();
        assert_eq!(a[i + 1], "/tmp/d/registry-config.json");
        assert!(a
            .windows(2)
            .any(|w| w[0] == "--ca-file" && w[1] == "/etc/ca.crt"));
        let t = p.template_args_for(Some(&v("3.17.3")), Path::new("/tmp/d/values.yaml"));
        let l = login_args(
            &tls_reg(),
            &v("3.17.3"),
            Path::new("/tmp/d/registry-config.json"),
            false,
        );
        for arg in a.iter().chain(&t).chain(&l) {
            assert!(!arg.contains(PW), "{arg}");
        }
        assert!(l.iter().any(|x| x == "--password-stdin"));
        let line = p.command_line(&helm("4.1.4"), Path::new("/tmp/d/values.yaml"), true);
        assert!(!line.contains(PW));
        assert!(line.starts_with("'/opt/helm bin/helm' registry login reg.example:5000 --username koord --password-stdin"), "{line}");
        assert!(
            line.contains("\n'/opt/helm bin/helm' upgrade --install koordinator"),
            "{line}"
        );
        assert!(format!("{p:?}").contains("<redacted>") && !format!("{p:?}").contains(PW));
    }

    #[test]
    fn archive_gets_no_registry_flags() {
        let p = plan(
            ChartSource::Archive("-odd/koordinator-1.8.0.tgz".into()),
            Some(tls_reg()),
        );
        let a = p.upgrade_install_args(Path::new("/v.yaml"), false);
        assert_eq!(a[3], "./-odd/koordinator-1.8.0.tgz");
        assert!(!a
            .iter()
            .any(|x| x == "--registry-config" || x == "--ca-file" || x == "--version"));
        assert!(!p
            .command_line(&helm("3.17.3"), Path::new("/v.yaml"), false)
            .contains("registry login"));
    }

    #[test]
    fn login_flags_per_version() {
        let mut r = tls_reg();
        r.insecure_skip_tls_verify = true;
        r.plain_http = true;
        let cfg = Path::new("/c.json");
        let new = login_args(&r, &v("3.17.3"), cfg, false);
        assert!(new.iter().any(|x| x == "--ca-file") && new.iter().any(|x| x == "--insecure"));
        assert!(!new.iter().any(|x| x == "--plain-http"));
        assert!(login_args(&r, &v("4.1.4"), cfg, true)
            .iter()
            .any(|x| x == "--plain-http"));
        assert!(!login_args(&r, &v("3.11.0"), cfg, false)
            .iter()
            .any(|x| x == "--ca-file"));
    }

    #[test]
    fn checks_refuse_what_old_helm_cannot_do() {
        let h = helm("3.7.2");
        assert!(matches!(
            h.check_chart(&plan(oci(), None)),
            Err(HelmError::OciUnsupported { .. })
        ));
        assert!(h
            .check_chart(&plan(ChartSource::Archive("/c.tgz".into()), None))
            .is_ok());
        let e = helm("3.11.0")
            .check_chart(&plan(oci(), Some(tls_reg())))
            .unwrap_err();
        assert!(
            e.to_string().contains("custom CA") && e.to_string().contains("reg.example:5000"),
            "{e}"
        );
        let mut half = tls_reg();
        half.password = None;
        let e = helm("3.17.3")
            .check_chart(&plan(oci(), Some(half)))
            .unwrap_err();
        assert!(e.to_string().contains("password"), "{e}");
        assert!(helm("3.17.3")
            .check_chart(&plan(oci(), Some(tls_reg())))
            .is_ok());
    }

    #[test]
    fn loopback_hosts() {
        for h in [
            "127.0.0.1:15001",
            "127.0.0.2:5000",
            "localhost:5000",
            "localhost",
            "[::1]:5000",
            "::1",
        ] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "192.0.2.2:5000",
            "reg.example:5000",
            "vm",
            "localhost.localdomain:1",
            "[fd00::2]:1",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
        let r = RegistryAccess {
            host: "127.0.0.1:15001".into(),
            ..Default::default()
        };
        assert!(r.loopback_tls_hint(&helm("3.17.3")).is_some());
        assert!(r.loopback_tls_hint(&helm("4.1.4")).is_none());
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("a-b_c/d.e:f=g,h@1+2%"), "a-b_c/d.e:f=g,h@1+2%");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("$HOME"), "'$HOME'");
    }

    #[test]
    fn helm_failures_on_the_network_or_the_far_side_are_transient() {
        let failed = |tail: &str| HelmError::Failed {
            command: "helm upgrade --install".into(),
            status: "exit status: 1".into(),
            stderr_tail: tail.into(),
            hint: None,
        };
        for t in [
            "Error: Kubernetes cluster unreachable: Get \"https://10.0.0.1:6443/version\": dial tcp 10.0.0.1:6443: connect: connection refused",
            "Error: etcdserver: request timed out",
            "Error: the server is currently unable to handle the request",
            "Error: Get \"https://r/v2/\": net/http: TLS handshake timeout",
        ] {
            assert!(failed(t).is_transient(), "{t}");
        }
        for t in [
            "Error: INSTALLATION FAILED: namespaces \"x\" not found",
            "Error: UPGRADE FAILED: another operation (install/upgrade/rollback) is in progress",
        ] {
            assert!(!failed(t).is_transient(), "{t}");
        }
    }

    #[test]
    fn redaction_and_tail() {
        let s = Secret::new(PW);
        assert_eq!(
            redact(&format!("x {PW} y {PW}"), Some(&s)),
            "x <redacted> y <redacted>"
        );
        assert_eq!(redact("abc", Some(&Secret::new(String::new()))), "abc");
        // A short password only where it stands alone: other words keep their letters.
        let p = Secret::new("p");
        assert_eq!(
            redact("unexpected http://u:p@host \"p\" p", Some(&p)),
            "unexpected http://u:<redacted>@host \"<redacted>\" <redacted>"
        );
        // A long one wherever it is, glued to other text too.
        let long = Secret::new("Tr0ub4dor3x");
        assert_eq!(
            redact("%40Tr0ub4dor3x and xTr0ub4dor3x", Some(&long)),
            "%40<redacted> and x<redacted>"
        );
        assert_eq!(tail("1\n2\n\n3\n4\n", 2), "3\n4");
        assert_eq!(
            error_part("Pulled: x\nError: one\nmore\nError: two\nwhy\n"),
            "Error: two\nwhy\n"
        );
        assert_eq!(error_part("no prefix\n"), "no prefix\n");
    }

    #[test]
    fn manifest_of_dry_run_report() {
        let out = HelmOutput {
            stdout: "Release \"k\" does not exist. Installing it now.\nNAME: k\nSTATUS: pending-install\nHOOKS:\n---\nkind: Pod\nspec: {containers: [{image: h/hook:1}]}\nMANIFEST:\n---\nkind: Pod\nspec: {containers: [{image: h/a:1}]}\n\nNOTES:\nhello image: h/notes:1\n".into(),
            stderr: String::new(),
        };
        let m = out.manifest();
        assert!(
            !m.contains("NAME:") && !m.contains("NOTES") && !m.contains("MANIFEST:"),
            "{m}"
        );
        assert!(
            m.contains("image: h/a:1") && m.contains("image: h/hook:1"),
            "{m}"
        );
        let plain = HelmOutput {
            stdout: "kind: Pod\n".into(),
            stderr: String::new(),
        };
        assert_eq!(plain.manifest(), "kind: Pod\n");
    }

    #[test]
    fn finds_helm_on_path_only_if_executable() {
        let d1 = tempfile::tempdir().unwrap();
        let d2 = tempfile::tempdir().unwrap();
        std::fs::write(d1.path().join("helm"), "not executable").unwrap();
        let exe = d2.path().join("helm");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let path = std::env::join_paths([d1.path(), d2.path()]).unwrap();
        assert_eq!(find_on_path(Some(&path)), Ok(exe));
        let empty = tempfile::tempdir().unwrap();
        let looked = find_on_path(Some(empty.path().as_os_str())).unwrap_err();
        assert_eq!(looked, [empty.path().to_path_buf()]);
        assert_eq!(find_on_path(None), Err(vec![]));
        // Where it looked, every entry, for the message.
        let both = std::env::join_paths([d1.path(), empty.path()]).unwrap();
        let e = Helm::find(None, Some(&both), &FOR_BUILD).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains(&format!(
                "on PATH (looked in {}, {})",
                d1.path().display(),
                empty.path().display()
            )) && text.contains("3.8.0")
                && text.contains("https://helm.sh/docs/intro/install/")
                && text.contains("--helm PATH"),
            "{text}"
        );
        let e = Helm::find(None, None, &FOR_BUILD).unwrap_err();
        assert!(e.to_string().contains("PATH is empty or not set"), "{e}");
    }

    #[cfg(unix)]
    fn fake_helm(dir: &Path, script: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let p = dir.join("helm");
        std::fs::write(&p, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[cfg(unix)]
    fn short(job: Job, command: &str) -> Run<'_> {
        let mut r = Run::new(command, job);
        r.limits.timeout = Duration::from_millis(700);
        r.limits.max_stdout = 1 << 20;
        r
    }

    #[cfg(unix)]
    #[test]
    fn a_helm_past_a_bound_is_stopped_with_everything_it_started() {
        let d = tempfile::tempdir().unwrap();
        let p = fake_helm(d.path(), "yes koord");
        let e = run_helm(&p, &[], short(Job::Template, "helm template x"))
            .err()
            .unwrap();
        assert!(
            matches!(
                &e,
                HelmError::Stopped {
                    source: ChildError::OutputTooLarge { .. },
                    transient: false,
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string().starts_with("helm template x was stopped: ")
                && e.to_string()
                    .contains("more than 1048576 bytes on its standard output"),
            "{e}"
        );
        let pid = d.path().join("pid");
        let p = fake_helm(
            d.path(),
            &format!(
                "sleep 300 >/dev/null 2>&1 & echo $! > {}; exec sleep 300",
                pid.display()
            ),
        );
        let e = run_helm(
            &p,
            &[],
            short(Job::Install(HELM_DEFAULT_TIMEOUT), "helm upgrade"),
        )
        .err()
        .unwrap();
        assert!(
            matches!(
                &e,
                HelmError::Stopped {
                    source: ChildError::TimedOut { .. },
                    transient: true,
                    ..
                }
            ) && e.to_string().contains("did not finish within 1 s"),
            "{e}"
        );
        assert!(
            koord_base::child::pid_in_file_is_gone(&pid),
            "helm's child outlived it"
        );
    }

    #[cfg(unix)]
    #[test]
    fn every_helm_run_gets_the_address_space_limit() {
        let d = tempfile::tempdir().unwrap();
        // `ulimit -v`: the address-space limit in KiB, as the shell sees it.
        let p = fake_helm(d.path(), "ulimit -v");
        for job in [
            Job::Probe,
            Job::Template,
            Job::TemplateFromRegistry,
            Job::Registry,
            Job::Install(HELM_DEFAULT_TIMEOUT),
        ] {
            let ran = run_helm(&p, &[], Run::new("helm", job)).unwrap();
            assert_eq!(
                ran.stdout.trim(),
                (HELM_MEMORY / 1024).to_string(),
                "{job:?}"
            );
        }
    }

    #[cfg(unix)]
    #[test]
    fn the_sink_gets_helm_lines_scrubbed() {
        let d = tempfile::tempdir().unwrap();
        let p = fake_helm(
            d.path(),
            &format!("echo 'one {PW}'; echo two >&2; printf three"),
        );
        let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let s2 = seen.clone();
        let secret = Secret::new(PW);
        let mut run =
            Run::new("helm upgrade", Job::Install(HELM_DEFAULT_TIMEOUT)).secret(Some(&secret));
        run.sink = Some(Arc::new(move |_, line: &[u8]| {
            s2.lock()
                .unwrap()
                .push(String::from_utf8_lossy(line).into_owned())
        }));
        let ran = run_helm(&p, &[], run).unwrap();
        let mut got = seen.lock().unwrap().clone();
        got.sort();
        assert_eq!(got, ["one <redacted>\n", "three", "two\n"]);
        assert_eq!(ran.stdout, "one <redacted>\nthree");
    }

    #[test]
    fn go_runtime_crashes_are_named_without_the_goroutine_dump() {
        let st = exit_status(2);
        let oom = "runtime: out of memory: cannot allocate 100000595968-byte block (12140544 in use)\nfatal error: out of memory\n\ngoroutine 1 gp=0xc0000061c0 m=5 [running]:\nruntime.throw({0x235d37d?, 0xba43b8?})\n";
        let e = failure("helm template k".into(), &st, oom, false, None);
        let t = e.to_string();
        assert!(
            matches!(
                e,
                HelmError::Crashed {
                    what: "run out of memory",
                    ..
                }
            ),
            "{t}"
        );
        assert!(
            t.contains("cannot allocate 100000595968-byte block")
                && !t.contains("goroutine")
                && t.contains("4 GiB"),
            "{t}"
        );
        let so = "runtime: goroutine stack exceeds 1000000000-byte limit\nruntime: sp=0xc140980368\nfatal error: stack overflow\n\nruntime stack:\n";
        let e = failure("helm template k".into(), &st, so, false, None);
        assert!(
            matches!(
                e,
                HelmError::Crashed {
                    what: "overflow its stack",
                    ..
                }
            ),
            "{e}"
        );
        let e = failure(
            "helm template k".into(),
            &st,
            "Error: parse error at (x.yaml:1)\n",
            false,
            None,
        );
        assert!(matches!(e, HelmError::Failed { .. }), "{e}");
    }

    #[cfg(unix)]
    fn exit_status(code: i32) -> ExitStatus {
        use std::os::unix::process::ExitStatusExt as _;
        ExitStatus::from_raw(code << 8)
    }

    #[test]
    fn go_durations() {
        let s = Duration::from_secs;
        assert_eq!(go_duration("300s"), Some(s(300)));
        assert_eq!(go_duration("10m"), Some(s(600)));
        assert_eq!(go_duration("1h30m"), Some(s(5400)));
        assert_eq!(go_duration("1.5h"), Some(s(5400)));
        assert_eq!(go_duration("1500ms"), Some(Duration::from_millis(1500)));
        for bad in ["", "10", "m", "10x", "-1s", "1e400h"] {
            assert_eq!(go_duration(bad), None, "{bad}");
        }
        let l = Job::Install(go_duration("10m").unwrap()).limits();
        assert_eq!(l.timeout, s(900));
        assert_eq!(Job::Install(HELM_DEFAULT_TIMEOUT).limits().timeout, s(600));
        assert_eq!(
            Job::Template.limits().max_stdout,
            koord_base::yaml::MANIFESTS.max_bytes
        );
        let oci = Job::TemplateFromRegistry.limits();
        assert_eq!(
            (oci.timeout, oci.max_stdout),
            (REGISTRY_TIME, koord_base::yaml::MANIFESTS.max_bytes)
        );
    }

    #[cfg(unix)]
    #[test]
    fn find_reads_versions_and_refuses_old_ones() {
        let d = tempfile::tempdir().unwrap();
        let p = fake_helm(
            d.path(),
            r#"[ "$2" = "--template" ] && { echo "v3.9.4"; exit 0; }; exit 1"#,
        );
        assert_eq!(
            Helm::find(Some(&p), None, &FOR_BUILD).unwrap().version,
            v("3.9.4")
        );
        let d = tempfile::tempdir().unwrap();
        // --template unknown (exit 1): falls back to --short.
        let p = fake_helm(
            d.path(),
            r#"[ "$2" = "--short" ] && { echo "v3.6.3+gd506314"; exit 0; }; echo "Error: unknown flag: --template" >&2; exit 1"#,
        );
        let h = Helm::find(Some(&p), None, &FOR_LOAD).unwrap();
        assert_eq!(
            (h.version.clone(), h.major(), h.supports_oci()),
            (v("3.6.3"), 3, false)
        );
        let d = tempfile::tempdir().unwrap();
        let p = fake_helm(d.path(), "echo v3.4.0");
        let e = Helm::find(Some(&p), None, &FOR_LOAD).unwrap_err();
        assert!(
            matches!(e, HelmError::TooOld { .. })
                && e.to_string().contains("3.4.0")
                && e.to_string().contains("3.5.0"),
            "{e}"
        );
        // build needs 3.8: 3.6.3 is refused there.
        let d = tempfile::tempdir().unwrap();
        let p = fake_helm(d.path(), "echo v3.6.3");
        let e = Helm::find(Some(&p), None, &FOR_BUILD).unwrap_err();
        assert!(
            matches!(e, HelmError::TooOld { .. })
                && e.to_string().contains("needs helm 3.8.0 or newer")
                && e.to_string().contains("build"),
            "{e}"
        );
        let d = tempfile::tempdir().unwrap();
        let p = fake_helm(d.path(), "echo nothing useful");
        assert!(matches!(
            Helm::find(Some(&p), None, &FOR_BUILD),
            Err(HelmError::VersionUnknown { .. })
        ));
        let e = Helm::find(Some(Path::new("/nonexistent/dir/helm")), None, &FOR_BUILD).unwrap_err();
        assert!(matches!(e, HelmError::NotFound { .. }), "{e}");
        assert!(
            e.to_string().contains("at /nonexistent/dir/helm (--helm)")
                && e.to_string().contains("--helm PATH"),
            "{e}"
        );
    }
}
