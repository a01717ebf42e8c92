//! `load`'s registry step, after verification and the pre-flight and before any push: the first
//! contact with the registry (a host name that does not resolve is named as such), and for
//! Harbor its projects: each repository pushed into a project that exists (or is created with
//! `--create-project`) and that the login may push to ([`Checked::may_push`], asked once the
//! load knows it has something to push: a load that finds every tag in place pushes nothing,
//! and a pull-only login may do that). A dry run does the same checks (it only creates
//! nothing), so it fails where the real run would. Any other registry: nothing more.

use crate::bundle::source::split_ref;
use crate::bundle::BundleManifest;
use crate::cli::LoadArgs;
use crate::oci::{Descriptor, Digest, Target};
use crate::progress::Progress;
use crate::store::registry::{CheckOptions, Flavor, Project, ProjectState};
use crate::store::{
    Have, OnBytes, Opener, RawManifest, Reference, Registry, Sink, Store, StoreError,
};
use anyhow::Context as _;
use serde_json::json;

/// What the step found.
pub(super) struct Checked {
    host: String,
    flavor: Flavor,
    projects: Vec<Project>,
}

impl Checked {
    /// May the login push everywhere the load pushes? (Always, for a registry that is not
    /// Harbor: its push finds out.)
    pub(super) fn may_push(&self) -> Result<(), crate::store::registry::HarborError> {
        match self.projects.iter().find_map(|p| p.push_error(&self.host)) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// For `--json`: `null` for a registry that is not Harbor.
    pub(super) fn json(&self) -> serde_json::Value {
        match &self.flavor {
            Flavor::Harbor { version } => json!({"version": version, "projects": self.projects}),
            Flavor::Other => serde_json::Value::Null,
        }
    }

    /// The sink a push goes through: `sink` itself, except that in a project a dry run would
    /// create, every repository is empty (asking the registry there would be refused).
    pub(super) fn sink<'a, K: Sink>(&self, sink: &'a K, target: &Target) -> Unborn<'a, K> {
        Unborn {
            inner: sink,
            prefix: target.prefix.clone(),
            projects: self
                .projects
                .iter()
                .filter(|p| p.state == ProjectState::WouldCreate)
                .map(|p| p.name.clone())
                .collect(),
        }
    }
}

/// The repositories a load pushes into, full paths under the target (`PREFIX/koordinator-sh/
/// koordlet`, `PREFIX/charts/koordinator`).
fn repositories(target: &Target, manifest: &BundleManifest) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for r in manifest
        .images
        .iter()
        .map(|i| &i.ref_name)
        .chain(std::iter::once(&manifest.chart.oci.ref_name))
    {
        let (repo, _) =
            split_ref(r).with_context(|| format!("ref name {r:?} is not REPOSITORY:TAG"))?;
        out.push(target.repository(repo));
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Probe the registry; for Harbor, check (and with `--create-project` create) its projects.
pub(super) async fn check(
    args: &LoadArgs,
    reg: &Registry,
    target: &Target,
    manifest: &BundleManifest,
    progress: &Progress,
) -> anyhow::Result<Checked> {
    let host = &target.registry;
    let flavor = reg.probe(host, target.host_name()).await?;
    let Flavor::Harbor { version } = &flavor else {
        if args.create_project {
            progress.warn(format!(
                "--create-project: {host} is not Harbor (no /api/v2.0/systeminfo): there are no projects to create"
            ));
        }
        return Ok(Checked {
            host: host.clone(),
            flavor,
            projects: Vec::new(),
        });
    };
    let repos = repositories(target, manifest)?;
    let projects = reg
        .harbor_check(
            host,
            &repos,
            CheckOptions {
                create: args.create_project,
                dry_run: args.dry_run,
            },
        )
        .await?;
    let harbor = if version.is_empty() {
        format!("Harbor at {host}")
    } else {
        format!("Harbor {version} at {host}")
    };
    for p in &projects {
        let push = match &p.denied {
            None => "the login may push there".to_string(),
            Some(d) => format!("{} may not push there (granted {})", d.who, d.granted),
        };
        progress.say(match p.state {
            ProjectState::Exists => format!("{harbor}: project {} exists; {push}", p.name),
            ProjectState::Created => format!("{harbor}: created private project {} (--create-project); {push}", p.name),
            ProjectState::WouldCreate => format!("{harbor}: project {} does not exist; the load would create it, private (--create-project; dry run: nothing created)", p.name),
        });
    }
    Ok(Checked {
        host: host.clone(),
        flavor,
        projects,
    })
}

/// A sink whose repositories in projects that do not exist yet hold nothing (a dry run's view
/// of a Harbor project it would create); every other repository is the inner sink's.
pub(super) struct Unborn<'a, K> {
    inner: &'a K,
    /// The target's prefix: repositories given to the sink are under it.
    prefix: String,
    projects: Vec<String>,
}

impl<K> Unborn<'_, K> {
    fn unborn(&self, repo: &str) -> bool {
        let full = if self.prefix.is_empty() {
            repo
        } else {
            &self.prefix
        };
        let project = full.split('/').next().unwrap_or(full);
        self.projects.iter().any(|p| p == project)
    }
}

impl<K: Sink> Store for Unborn<'_, K> {
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

impl<K: Sink> Sink for Unborn<'_, K> {
    async fn blob_state(&self, repo: &str, desc: &Descriptor) -> Result<Have, StoreError> {
        if self.unborn(repo) {
            return Ok(Have::Nothing);
        }
        self.inner.blob_state(repo, desc).await
    }

    async fn put_blob(
        &self,
        repo: &str,
        desc: &Descriptor,
        offset: u64,
        data: &dyn Opener,
        on_bytes: &OnBytes,
    ) -> Result<(), StoreError> {
        self.inner
            .put_blob(repo, desc, offset, data, on_bytes)
            .await
    }

    async fn mount_blob(
        &self,
        repo: &str,
        from_repo: &str,
        desc: &Descriptor,
    ) -> Result<bool, StoreError> {
        if self.unborn(from_repo) {
            return Ok(false);
        }
        self.inner.mount_blob(repo, from_repo, desc).await
    }

    async fn has_manifest(
        &self,
        repo: &str,
        reference: &Reference,
        digest: &Digest,
    ) -> Result<bool, StoreError> {
        if self.unborn(repo) {
            return Ok(false);
        }
        self.inner.has_manifest(repo, reference, digest).await
    }

    async fn put_manifest(
        &self,
        repo: &str,
        reference: &Reference,
        manifest: &RawManifest,
    ) -> Result<(), StoreError> {
        self.inner.put_manifest(repo, reference, manifest).await
    }
}
