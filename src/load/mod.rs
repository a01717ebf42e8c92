//! `load`'s pipeline, once its settings are resolved and the bundle verified: the cluster's
//! pre-flight ([`preflight()`]), the install planned ([`plan()`]), the release rendered and
//! checked against the cluster before any push ([`render()`]), the push ([`push()`]) and helm
//! ([`install()`]). Nothing is pushed before the checks passed and nothing is installed after
//! a failed push: the command calls these in that order (`cmd::load`).
//!
//! It takes resolved settings only ([`Options`], built by the command from its flags and the
//! environment) and says what it finds through [`Event`]s, which the command prints: this
//! module reads no flag, no environment variable and no terminal, and prints nothing.

mod install;
mod plan;
mod preflight;
mod push;
mod render;

pub use install::{install, Installed};
pub use plan::{check_helm_reaches_registry, plan, Planned};
pub use preflight::{preflight, KubeTarget, Preflight};
pub use push::{blob_counts, graphs, push, push_bytes, push_failed, tags_in_place, Graphs};
pub use render::{render, Rendered};

use crate::cluster::Finding;
use crate::helm::{RegistryAccess, ValuesMode};
use crate::oci::Target;
use std::path::PathBuf;

/// The release namespace of Koordinator's install guide (`helm install koordinator
/// koordinator-sh/koordinator`): helm keeps its release records there.
pub const DEFAULT_RELEASE_NAMESPACE: &str = "default";
/// The namespace the chart creates and fills (`installation.namespace`).
pub const CHART_NAMESPACE: &str = "koordinator-system";

/// What a load does, resolved from its flags and the environment before anything is read.
#[derive(Debug, Clone)]
pub struct Options {
    /// The registry (and path prefix) everything goes to.
    pub target: Target,
    /// How helm reaches that registry (its login, CA, plain HTTP).
    pub registry: RegistryAccess,
    /// The helm release.
    pub release: String,
    /// `--namespace`: the release namespace asked for (else the release's, or
    /// [`DEFAULT_RELEASE_NAMESPACE`]).
    pub namespace: Option<String>,
    /// `--context`: the kubeconfig context asked for.
    pub context: Option<String>,
    /// `--values` files, in order.
    pub values: Vec<PathBuf>,
    /// `--set` values, in order.
    pub sets: Vec<String>,
    /// How the release's values carry over on an upgrade.
    pub values_mode: ValuesMode,
    /// `--feature-gates`.
    pub feature_gates: Option<String>,
    /// `--skip-crds`: the chart's CRD switches turned off.
    pub skip_crds: Vec<String>,
    /// `--host-network`.
    pub host_network: bool,
    /// `--image-pull-secret`.
    pub image_pull_secrets: Vec<String>,
    /// `--strict`: warnings of the checks fail the load.
    pub strict: bool,
    /// `--allow-downgrade`.
    pub allow_downgrade: bool,
    /// `--allow-field-loss`.
    pub allow_field_loss: bool,
    /// `--skip-check`: pre-flight checks whose "could not tell" becomes a Warn.
    pub skip_checks: Vec<String>,
    /// The chart's CRDs kept on `helm uninstall` (not `--no-keep-crds`).
    pub keep_crds: bool,
    /// Images pinned to the bundle's digests (not `--no-pin`).
    pub pin: bool,
    /// `--keep-pull-policy`.
    pub keep_pull_policy: bool,
    /// This program, helm's post-renderer (`None`: it cannot be found).
    pub exe: Option<PathBuf>,
    /// Something is installed (not `--no-install`).
    pub install: bool,
    /// `--dry-run`: nothing is pushed or installed.
    pub dry_run: bool,
    /// `--jobs`: transfers at once.
    pub jobs: usize,
}

/// What the pipeline tells the command as it goes, for it to print.
#[derive(Debug, Clone)]
pub enum Event {
    /// A line of progress.
    Said(String),
    /// A warning.
    Warning(String),
    /// Findings of a check, every level (the command prints each by its level).
    Findings(Vec<Finding>),
    /// What undoes the helm step if it is interrupted: sent just before helm runs.
    Recovery(String),
}

/// Where [`Event`]s go.
pub type Events<'a> = &'a (dyn Fn(Event) + Sync);

/// Checks that found problems (the pre-flight, the checks of the new release): the error says
/// so in a line, and `--json` carries every finding in its error document (`findings`: each
/// with its check, level, message and fix), as the stderr lines above the error do.
#[derive(Debug)]
pub struct ChecksFailed {
    /// The error's line.
    pub message: String,
    /// Every finding of the checks (not only the failing ones), as JSON.
    pub findings: Vec<serde_json::Value>,
}

impl crate::exit::Classify for ChecksFailed {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        // Checks that found problems: the cluster or the bundle is not as the install needs.
        Some(crate::exit::ExitClass::Input)
    }
}

impl ChecksFailed {
    /// The error `message` for `findings`.
    pub fn new<T: serde::Serialize>(message: impl Into<String>, findings: &[T]) -> ChecksFailed {
        ChecksFailed {
            message: message.into(),
            findings: findings
                .iter()
                .filter_map(|f| serde_json::to_value(f).ok())
                .collect(),
        }
    }
}

impl std::fmt::Display for ChecksFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ChecksFailed {}
