//! `load`'s settings: the flags and the environment, resolved once before the bundle is read
//! or anything is sent.

use crate::bundle::source::BundleSource;
use crate::bundle::OpenedBundle;
use crate::cli::LoadArgs;
use crate::cluster;
use crate::helm::{self, Helm, RegistryAccess};
use crate::load;
use crate::oci::Target;
use crate::progress::Progress;
use crate::secret::Secret;
use crate::store::auth::Login;
use crate::store::{Registry, RegistryOptions};
use anyhow::{bail, Context as _};
use std::io::Read as _;
use std::path::PathBuf;
use std::sync::Arc;

/// The single `koordinator-*` bundle in the current directory.
fn find_bundle() -> anyhow::Result<PathBuf> {
    let mut found = Vec::new();
    // A split set: its first part present (part000 may be lost: any part opens a v2 set).
    let mut sets: std::collections::BTreeMap<String, PathBuf> = Default::default();
    for e in std::fs::read_dir(".").context("cannot list the current directory")? {
        let p = e?.path();
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        if !name.starts_with("koordinator-") || !p.is_file() {
            continue;
        }
        if name.ends_with(".tar") || name.ends_with(".tar.gz") {
            found.push(p);
        } else if let Some((stem, _)) = name
            .rsplit_once(".part")
            .filter(|_| koord_splitset::looks_like_part(&p))
        {
            let first = sets.entry(stem.to_string()).or_insert_with(|| p.clone());
            if p < *first {
                *first = p;
            }
        }
    }
    found.extend(sets.into_values());
    found.sort();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => bail!("no koordinator-*.tar bundle (or .part000 first part) in the current directory: name the bundle (koord-bundle load BUNDLE --registry ...)"),
        _ => bail!(
            "several bundles in the current directory ({}): name the one to load",
            found.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// What a load needs from the flags and the environment, resolved before the bundle is read
/// or anything is sent: which bundle, where it goes, the key, the registry's login, helm, and
/// the cluster's kubeconfig. An error in any of them costs no verification and no request.
pub(super) struct Settings {
    /// The bundle, opened, with the key its signature is checked with.
    pub(super) bundle: OpenedBundle,
    /// What the pipeline does (`crate::load`).
    pub(super) opts: load::Options,
    /// The registry client (credentials read, `--password-stdin` taken).
    pub(super) reg: Arc<Registry>,
    /// helm, when something is installed (a dry run of an install included).
    pub(super) helm: Option<Helm>,
    /// No helm here and no `--helm`: why, until the verified bundle supplies its own.
    pub(super) helm_missing: Option<helm::HelmError>,
    /// The folder of the helm the bundle carries, while it is used.
    pub(super) _carried: Option<tempfile::TempDir>,
    /// The cluster's client and kubeconfig, when something is installed.
    pub(super) kube: Option<(cluster::KubeClient, load::KubeTarget)>,
    /// `--sign-images`: the cosign key, decrypted.
    pub(super) cosign: Option<crate::admission::cosign::CosignKey>,
    /// `--sign-images`: the admission policies for the key and the target, rendered, and the
    /// folder they go into once the images are signed.
    pub(super) policies: Option<(PathBuf, Vec<crate::admission::policy::PolicyFile>)>,
}

impl Settings {
    pub(super) async fn resolve(args: &LoadArgs, progress: &Progress) -> anyhow::Result<Settings> {
        let bundle = match &args.bundle {
            Some(b) => b.clone(),
            None => find_bundle()?,
        };
        crate::cmd::bundle_arg(&bundle)?;
        let target = Target::parse(&args.registry)?;
        // The values files helm will read, opened as build opens its inputs (a FIFO or a device
        // is refused here, not handed to helm to block on) and checked as bounded YAML.
        crate::cmd::check_helm_inputs(&args.values, &args.set)?;
        if !args.no_install {
            let set = crate::cmd::helm_env_conflicts(|n| std::env::var_os(n));
            if !set.is_empty() {
                let (is, it) = if set.len() == 1 {
                    ("is", "it")
                } else {
                    ("are", "them")
                };
                bail!(
                    "{} {is} set: helm reads {it}, and would then keep the release elsewhere, or reach another cluster or user, than the checks koord-bundle makes before it (they read the release from helm's Secrets, through the kubeconfig and --context); unset {it} for this load (pass --context for a context), or load with --no-install and run helm yourself: nothing was verified or pushed",
                    set.join(", "),
                );
            }
        }
        // A gzip bundle cannot be read in place: say so before spending a verification on it.
        // Opened once: every later read of the bundle goes through this handle.
        let bf = koord_splitset::BundleFile::open(&bundle)
            .with_context(|| format!("cannot read {}", bundle.display()))?;
        let head = bf
            .read_range(0, 2)
            .with_context(|| format!("cannot read {}", bundle.display()))?;
        if head.starts_with(&[0x1f, 0x8b]) {
            bail!("{} is gzip-compressed: load reads bundles in place, so decompress it first (gunzip -k {}); nothing was verified or pushed", bundle.display(), bundle.display());
        }
        let mut bundle = OpenedBundle::of(bf);
        bundle
            .check_complete()
            .context("the bundle did not verify: nothing was pushed")?;
        bundle.set_trust(crate::cmd::trusted_key(&args.signature, progress)?);
        // Read and decrypted before anything is sent: a wrong password costs no push.
        let cosign = match &args.sign_images {
            Some(k) => Some(crate::cmd::sign_images::read_key(k)?),
            None => None,
        };
        // The policies for that key, rendered and their folder checked before anything is
        // sent: a target the engines' globs cannot hold, or a folder that is not there, costs
        // no push.
        let policies = match &cosign {
            Some(key) => {
                use crate::admission::policy;
                let files = policy::render(
                    &key.public_key_pem(),
                    &target.host_and_prefix(),
                    policy::DEFAULT_NAME,
                )?;
                let dir = args
                    .policy_dir
                    .clone()
                    .unwrap_or_else(|| PathBuf::from("."));
                if !dir.is_dir() {
                    bail!(
                        "--policy-dir {}: no such folder (make it, or give another): nothing was verified or pushed",
                        dir.display()
                    );
                }
                Some((dir, files))
            }
            None => None,
        };
        let mut credentials = crate::cmd::registry_credentials()?;
        if let Some(user) = &args.username {
            let mut pw = String::new();
            std::io::stdin()
                .read_to_string(&mut pw)
                .context("reading the password from standard input")?;
            let pw = pw.trim_end_matches(['\r', '\n']).to_string();
            if pw.is_empty() {
                bail!("--password-stdin: standard input held no password");
            }
            credentials.insert(
                &target.registry,
                Login {
                    username: user.clone(),
                    password: Secret::new(pw),
                },
            );
        }
        if args.insecure_skip_tls_verify {
            progress.warn(format!(
                "--insecure-skip-tls-verify: the certificate of {} is NOT checked",
                target.registry
            ));
        }
        // helm logs in with a user and password; an identity token stays with koord-bundle. A
        // broken credential helper is reported by the push, where it matters.
        let login = credentials
            .resolve(&target.registry)
            .await
            .ok()
            .and_then(|l| l.found)
            .and_then(|f| f.credential.login().cloned());
        let reg = Registry::new(RegistryOptions {
            plain_http_hosts: if args.plain_http {
                vec![target.registry.clone()]
            } else {
                vec![]
            },
            ca_files: args.ca_file.clone(),
            insecure_skip_tls_verify: args.insecure_skip_tls_verify,
            credentials,
            on_retry: Some(crate::cmd::retry_reporter(progress)),
            ..Default::default()
        })?;

        let (helm, helm_missing) = match find_helm(args) {
            Ok(h) => (h, None),
            // Not here: the bundle may carry one (`build --with-tools`), read once verified.
            Err(e @ helm::HelmError::NotFound { .. }) if args.helm.is_none() => (None, Some(e)),
            Err(e) => {
                return Err(anyhow::Error::new(e).context(
                    "helm is needed to install (or pass --no-install): nothing was pushed",
                ))
            }
        };
        let opts = options(args, target, login.as_ref());
        let mut settings = Settings {
            bundle,
            opts,
            reg: Arc::new(reg),
            helm,
            helm_missing,
            _carried: None,
            kube: None,
            cosign,
            policies,
        };
        if let Some(h) = &settings.helm {
            load::check_helm_reaches_registry(&settings.opts, h)?;
        }
        if !args.no_install {
            settings.kube = Some(kube_client(args).map_err(|e| {
                anyhow::Error::new(e).context(
                    "the pre-flight cannot read the cluster: nothing was verified or pushed (pass --no-install to push only)",
                )
            })?);
        }
        Ok(settings)
    }
}

/// helm, when it will be used: for an install (a dry run of one included). With
/// `--no-install` nothing is installed and helm is not looked for.
fn find_helm(args: &LoadArgs) -> Result<Option<Helm>, helm::HelmError> {
    if args.no_install {
        return Ok(None);
    }
    Helm::find(
        args.helm.as_deref(),
        std::env::var_os(crate::cmd::env::PATH).as_deref(),
        &helm::FOR_LOAD,
    )
    .map(Some)
}

impl Settings {
    /// No helm on this machine: the one the verified bundle carries, if it carries one for
    /// this platform (checked like any helm), else why not.
    pub(super) async fn carried_helm(
        &mut self,
        src: &BundleSource,
        progress: &Progress,
    ) -> anyhow::Result<()> {
        let Some(why) = self.helm_missing.take() else {
            return Ok(());
        };
        let (h, dir) = crate::cmd::carried::helm(src, why, progress).await?;
        load::check_helm_reaches_registry(&self.opts, &h)?;
        self.helm = Some(h);
        self._carried = Some(dir);
        Ok(())
    }
}

/// The pipeline's settings from the flags: `login` is the one helm gets (a user and
/// password; an identity token stays with koord-bundle).
fn options(args: &LoadArgs, target: Target, login: Option<&Login>) -> load::Options {
    load::Options {
        registry: RegistryAccess {
            host: target.registry.clone(),
            username: login.map(|l| l.username.clone()),
            password: login.map(|l| l.password.clone()),
            ca_file: args.ca_file.first().cloned(),
            plain_http: args.plain_http,
            insecure_skip_tls_verify: args.insecure_skip_tls_verify,
        },
        target,
        release: args.kube.release.clone(),
        namespace: args.kube.namespace.clone(),
        context: args.kube.context.clone(),
        values: args.values.clone(),
        sets: args.set.clone(),
        values_mode: values_mode(args),
        feature_gates: args.feature_gates.clone(),
        skip_crds: args.skip_crds.clone(),
        host_network: args.host_network,
        image_pull_secrets: args.image_pull_secret.clone(),
        strict: args.strict,
        allow_downgrade: args.allow_downgrade,
        allow_field_loss: args.allow_field_loss,
        skip_checks: args.skip_check.clone(),
        keep_crds: !args.no_keep_crds,
        pin: !args.no_pin,
        keep_pull_policy: args.keep_pull_policy,
        exe: std::env::current_exe().ok(),
        install: !args.no_install,
        dry_run: args.dry_run,
        jobs: args.jobs,
    }
}

/// The cluster's client and the kubeconfig helm gets, as `--kubeconfig` and `--context` name
/// them.
fn kube_client(
    args: &LoadArgs,
) -> Result<(cluster::KubeClient, load::KubeTarget), cluster::ClusterError> {
    let (client, files, kc) = crate::cmd::kube_client(
        args.kube.kubeconfig.as_deref(),
        args.kube.context.as_deref(),
    )?;
    Ok((
        client,
        load::KubeTarget {
            files,
            context: kc.context,
        },
    ))
}

/// The values mode of `load`'s flags.
pub(super) fn values_mode(args: &LoadArgs) -> helm::ValuesMode {
    if args.reset_values {
        helm::ValuesMode::Reset
    } else if args.reuse_values {
        helm::ValuesMode::Reuse
    } else {
        helm::ValuesMode::Keep
    }
}
