//! `koord-bundle load`: verify, pre-flight, push (digests unchanged), install with helm.
//! Nothing is pushed before verification (and, when installing, helm and the pre-flight)
//! passed; nothing is installed after a failed push.

use crate::bundle::reader::Unhashed;
use crate::bundle::source::BundleSource;
use crate::bundle::{BundleManifest, OpenedBundle};
use crate::cli::LoadArgs;
use crate::cluster;
use crate::copy;
use crate::helm::{self, Helm, RegistryAccess};
use crate::load;
use crate::oci::Target;
use crate::progress::{Mode, Progress};
use crate::secret::Secret;
use crate::store::auth::Login;
use crate::store::registry::RegistryStore;
use crate::store::{Registry, RegistryOptions};
use anyhow::{bail, Context as _};
use serde_json::json;
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
struct Settings {
    /// The bundle, opened, with the key its signature is checked with.
    bundle: OpenedBundle,
    /// What the pipeline does (`crate::load`).
    opts: load::Options,
    /// The registry client (credentials read, `--password-stdin` taken).
    reg: Arc<Registry>,
    /// helm, when something is installed (a dry run of an install included).
    helm: Option<Helm>,
    /// No helm here and no `--helm`: why, until the verified bundle supplies its own.
    helm_missing: Option<helm::HelmError>,
    /// The folder of the helm the bundle carries, while it is used.
    _carried: Option<tempfile::TempDir>,
    /// The cluster's client and kubeconfig, when something is installed.
    kube: Option<(cluster::KubeClient, load::KubeTarget)>,
    /// `--sign-images`: the cosign key, decrypted.
    cosign: Option<crate::admission::cosign::CosignKey>,
    /// `--sign-images`: the admission policies for the key and the target, rendered, and the
    /// folder they go into once the images are signed.
    policies: Option<(PathBuf, Vec<crate::admission::policy::PolicyFile>)>,
}

impl Settings {
    async fn resolve(args: &LoadArgs, progress: &Progress) -> anyhow::Result<Settings> {
        let bundle = match &args.bundle {
            Some(b) => b.clone(),
            None => find_bundle()?,
        };
        super::bundle_arg(&bundle)?;
        let target = Target::parse(&args.registry)?;
        // The values files helm will read, opened as build opens its inputs (a FIFO or a device
        // is refused here, not handed to helm to block on) and checked as bounded YAML.
        super::check_helm_inputs(&args.values, &args.set)?;
        if !args.no_install {
            let set = super::helm_env_conflicts(|n| std::env::var_os(n));
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
        bundle.set_trust(super::trusted_key(&args.signature, progress)?);
        // Read and decrypted before anything is sent: a wrong password costs no push.
        let cosign = match &args.sign_images {
            Some(k) => Some(super::sign_images::read_key(k)?),
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
        let mut credentials = super::registry_credentials()?;
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
            on_retry: Some(super::retry_reporter(progress)),
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

/// Verify the bundle and open it for reading in place: everything but the bytes of its large
/// blobs, which [`push`] hashes unless nothing will be pushed at all.
async fn verify(
    settings: &Settings,
    progress: &Progress,
) -> anyhow::Result<(BundleSource, Unhashed)> {
    let bundle = &settings.bundle;
    let bar = progress.bytes("verifying", bundle.size());
    let (src, unhashed) = BundleSource::open_unhashed(bundle, &|n| bar.inc(n))
        .await
        .context("the bundle did not verify: nothing was pushed")?;
    bar.finish("layout verified");
    if let Some(bf) = &src.report().file {
        super::sets::tell_repairs(progress, bf);
    }
    let report = src.report();
    progress.say(format!(
        "verified {} files; {}{}",
        report.files,
        super::blobs_in_bundle(&src.manifest().blobs),
        match &report.signature {
            Some(s) if report.signature_verified => format!(", signed by key {}", s.key_id),
            _ => ", signature not checked".into(),
        }
    ));
    Ok((src, unhashed))
}

/// helm, when it will be used: for an install (a dry run of one included). With
/// `--no-install` nothing is installed and helm is not looked for.
fn find_helm(args: &LoadArgs) -> Result<Option<Helm>, helm::HelmError> {
    if args.no_install {
        return Ok(None);
    }
    Helm::find(
        args.helm.as_deref(),
        std::env::var_os(super::env::PATH).as_deref(),
        &helm::FOR_LOAD,
    )
    .map(Some)
}

impl Settings {
    /// No helm on this machine: the one the verified bundle carries, if it carries one for
    /// this platform (checked like any helm), else why not.
    async fn carried_helm(
        &mut self,
        src: &BundleSource,
        progress: &Progress,
    ) -> anyhow::Result<()> {
        let Some(why) = self.helm_missing.take() else {
            return Ok(());
        };
        let (h, dir) = super::carried::helm(src, why, progress).await?;
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
    let (client, files, kc) = super::kube_client(
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

/// Findings, one line each, by level: `pre-flight INFO [...]`, `warning: pre-flight WARN
/// [...]`, `error: pre-flight FAIL [...]` (a Fail was printed as a warning).
fn print_findings_of(findings: &[cluster::Finding], progress: &Progress) {
    for f in findings {
        let line = format!(
            "pre-flight {} [{}] {}{}",
            f.level,
            f.check,
            f.message,
            f.fix
                .as_ref()
                .map(|x| format!(" — fix: {x}"))
                .unwrap_or_default()
        );
        match f.level {
            cluster::Level::Info => progress.say(line),
            cluster::Level::Warn => progress.warn(line),
            cluster::Level::Fail => progress.error(line),
        }
    }
}

/// The re-hash decision and the push: when every tag already points at the bundle's digests,
/// nothing of the bundle will be read, so its blobs are not hashed (verify checks every byte);
/// else they are, before anything is pushed, and the login must be allowed to push (Harbor).
async fn hash_and_push<K: crate::store::Sink>(
    args: &LoadArgs,
    settings: &Settings,
    src: &BundleSource,
    unhashed: Unhashed,
    sink: &K,
    checked: &super::registry_check::Checked,
    progress: &Progress,
) -> anyhow::Result<(copy::Stats, bool)> {
    let target = &settings.opts.target;
    let store = RegistryStore::new(settings.reg.clone(), &target.host_and_prefix());
    let graphs = super::upstream_sigs::keep_appended(
        &settings.reg,
        &store,
        src,
        load::graphs(src).await?,
        progress,
    )
    .await?;
    let all_there = load::tags_in_place(sink, &graphs, args.jobs)
        .await
        .context("checking the registry")?;
    if all_there {
        progress.say(format!(
            "every tag in {} already points at the bundle's digests: nothing to push, so the bundle's large blobs were not re-hashed (koord-bundle verify checks every byte)",
            target.host_and_prefix()
        ));
    } else {
        checked.may_push()?;
        let bar = progress.bytes("verifying blobs", unhashed.bytes());
        tokio::task::block_in_place(|| unhashed.hash(&|n| bar.inc(n)))
            .context("the bundle did not verify: nothing was pushed")?;
        bar.finish("verified");
    }
    let pushed = async {
        let bar = progress.bytes(
            if args.dry_run {
                "checking registry"
            } else {
                "pushing"
            },
            load::push_bytes(&graphs)?,
        );
        let on = bar.clone();
        let on_bytes = Arc::new(move |n| on.inc(n));
        let stats = load::push(src, sink, &graphs, args.jobs, args.dry_run, on_bytes).await?;
        bar.finish(&load::blob_counts(&stats, args.dry_run));
        anyhow::Ok(stats)
    };
    let stats = pushed
        .await
        .map_err(|e| load::push_failed(e, src.manifest(), args.dry_run))?;
    if !args.dry_run {
        super::upstream_sigs::list_referrers(&settings.reg, &store, src, progress).await?;
    }
    Ok((stats, !all_there))
}

/// The values mode of `load`'s flags.
fn values_mode(args: &LoadArgs) -> helm::ValuesMode {
    if args.reset_values {
        helm::ValuesMode::Reset
    } else if args.reuse_values {
        helm::ValuesMode::Reuse
    } else {
        helm::ValuesMode::Keep
    }
}

/// What undoes an interrupted helm step (set just before helm runs), for the interrupt's
/// message.
static RECOVERY: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// The pipeline's events, printed: lines and warnings as they come, findings one line each by
/// level, and what undoes the helm step kept for an interrupt's message.
fn events(progress: &Progress) -> impl Fn(load::Event) + Sync + '_ {
    move |e| match e {
        load::Event::Said(line) => progress.say(line),
        load::Event::Warning(line) => progress.warn(line),
        load::Event::Findings(f) => print_findings_of(&f, progress),
        load::Event::Recovery(undo) => {
            *RECOVERY.lock().unwrap_or_else(|e| e.into_inner()) = Some(undo)
        }
    }
}

/// helm's output, as it comes (scrubbed of the password by helm.rs); helm quotes the cluster
/// and the chart: no control character of theirs reaches the terminal raw.
// helm's lines are passed on as they come (escaped), with no newline added.
#[allow(clippy::disallowed_macros)]
fn helm_lines() -> crate::child::LineSink {
    Arc::new(|_, line: &[u8]| {
        eprint!(
            "{}",
            crate::text::terminal_safe(&String::from_utf8_lossy(line))
        )
    })
}

/// Run the load: settings, verify, helm and the pre-flight, the release rendered and checked
/// against the cluster, push (nothing before all of these passed), install (nothing after a
/// failed push), report.
pub async fn run(args: LoadArgs) -> anyhow::Result<()> {
    let signals = super::interrupt_signals()?;
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let got = signals.await;
        let _ = tx.send(got);
        // helm (an install under way) and the post-renderer end with the load.
        crate::child::kill_all();
    });
    let interrupted = |(signal, code): (&'static str, i32)| {
        crate::child::kill_all();
        let kept = match Phase::now() {
            Phase::Checking => "nothing was pushed or installed".to_string(),
            Phase::Pushing => "what was pushed stays in the registry, digests unchanged; nothing was installed; run the same command again to push the rest (what is there is not sent again) and install".to_string(),
            Phase::Installing => match RECOVERY.lock().unwrap_or_else(|e| e.into_inner()).clone() {
                Some(undo) => format!("everything was pushed; helm was stopped during the install or upgrade, which leaves the release pending: {undo}"),
                None => "everything was pushed; nothing was installed: run the same command again".to_string(),
            },
        };
        anyhow::Error::from(super::Interrupted { signal, kept, code })
    };
    tokio::select! {
        biased;
        Ok(got) = &mut rx => Err(interrupted(got)),
        r = load(args) => match rx.try_recv() {
            Ok(got) if r.is_err() => Err(interrupted(got)),
            _ => r,
        },
    }
}

/// How far a load got, for what an interrupt says.
#[derive(Clone, Copy)]
enum Phase {
    Checking,
    Pushing,
    Installing,
}

static PHASE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

impl Phase {
    fn set(self) {
        PHASE.store(self as u8, std::sync::atomic::Ordering::SeqCst);
    }
    fn now() -> Phase {
        match PHASE.load(std::sync::atomic::Ordering::SeqCst) {
            0 => Phase::Checking,
            1 => Phase::Pushing,
            _ => Phase::Installing,
        }
    }
}

/// `--sign-images`: every image pushed signed and attested with the site's cosign key, then
/// the admission policies for the key written (a policy applied before the signatures would
/// refuse Koordinator's pods). What was signed (`--json`'s `signed`) and the policy files.
async fn sign_images(
    args: &LoadArgs,
    settings: &Settings,
    src: &BundleSource,
    registry: &RegistryStore,
    progress: &Progress,
) -> anyhow::Result<(Option<serde_json::Value>, Vec<PathBuf>)> {
    let Some(key) = &settings.cosign else {
        return Ok((None, Vec::new()));
    };
    if args.dry_run {
        progress.say("--dry-run: no image is signed");
        return Ok((None, Vec::new()));
    }
    let signed =
        super::sign_images::sign_all(src, &settings.reg, registry, key, args.jobs, progress)
            .await?;
    let policies = match &settings.policies {
        Some((dir, files)) => crate::admission::policy::write(dir, files)?,
        None => Vec::new(),
    };
    Ok((Some(signed), policies))
}

async fn load(args: LoadArgs) -> anyhow::Result<()> {
    let progress = Progress::new(Mode::detect(args.json));
    let mut settings = Settings::resolve(&args, &progress).await?;
    let (src, unhashed) = verify(&settings, &progress).await?;
    settings.carried_helm(&src, &progress).await?;
    let manifest = src.manifest().clone();
    let ev = events(&progress);
    let o = &settings.opts;
    let pre = load::preflight(o, settings.kube.take(), &manifest, &ev).await?;
    let helm = settings.helm.take();
    let target = o.target.clone();
    let planned = load::plan(o, &src, helm.as_ref(), &pre, &ev).await?;
    let rendered = match &helm {
        Some(h) => load::render(o, &src, h, &planned, &pre, &ev).await?,
        None => None,
    };
    // The registry step (its first contact; Harbor's projects), before any push.
    let checked =
        super::registry_check::check(&args, &settings.reg, &target, &manifest, &progress).await?;
    let registry = RegistryStore::new(settings.reg.clone(), &target.host_and_prefix());
    let sink = checked.sink(&registry, &target);
    Phase::Pushing.set();
    let (stats, rehashed) =
        hash_and_push(&args, &settings, &src, unhashed, &sink, &checked, &progress).await?;
    // `--sign-images`: after the push, before helm (a failure installs nothing).
    let (signed, policies) = sign_images(&args, &settings, &src, &registry, &progress).await?;
    Phase::Installing.set();
    let done = load::install(
        &settings.opts,
        settings.bundle.path(),
        settings._carried.is_some(),
        helm.as_ref(),
        &planned,
        pre.deployed_before(),
        helm_lines(),
        &ev,
    )
    .await?;
    let (preflight, namespace) = (&pre.report, &pre.namespace);
    let chart_repo = format!("charts/{}", manifest.chart.name);
    let chart_target = target.image(&chart_repo, &manifest.chart.version)?;
    let plan = &planned.plan;
    let existing = preflight.as_ref().and_then(|r| r.existing_release.as_ref());
    let bundle = settings.bundle.path();
    if args.json {
        return super::print_json(&json!({
            "bundle": bundle, "registry": target.host_and_prefix(), "dryRun": args.dry_run,
            "verified": {"files": src.report().files, "blobs": src.report().blobs, "bytes": src.report().bytes, "signature": src.report().signature_verified,
                         "blobsRehashed": rehashed},
            "push": stats,
            "signed": signed,
            "policies": policies,
            "harbor": checked.json(),
            "chart": {"ref": chart_target.to_string(), "version": manifest.chart.version},
            "images": images_json(&manifest, &target, args.dry_run, rendered.as_ref(), done.installed),
            "preflight": preflight,
            "upgrade": rendered.as_ref().map(|r| &r.upgrade),
            "helm": {"command": done.command, "renderedImages": rendered.as_ref().map(|r| &r.images),
                     "installed": done.installed, "upgraded": done.installed && existing.is_some(),
                     "namespace": namespace, "valuesFile": done.kept_values,
                     "values": serde_yaml_ng::to_string(&plan.generated_values).ok(),
                     "releaseValues": rendered.as_ref().map(|r| &r.release.config),
                     "previousValues": existing.and_then(|r| r.values.as_ref())},
        }));
    }
    let verb = if args.dry_run { "would push" } else { "pushed" };
    crate::say!(
        "registry {}: {}; manifests {verb} {}, present {}",
        target.host_and_prefix(),
        load::blob_counts(&stats, args.dry_run),
        stats.manifests_pushed,
        stats.manifests_skipped
    );
    crate::say!(
        "chart    oci://{}/{chart_repo} --version {}",
        target.host_and_prefix(),
        manifest.chart.version
    );
    if let Some(s) = &signed {
        crate::say!(
            "signed   {} images with the cosign key {} ({} signatures or attestations pushed, {} there already; {}); check one with: cosign verify --key cosign.pub --insecure-ignore-tlog=true IMAGE@DIGEST",
            s["images"].as_array().map_or(0, Vec::len),
            settings.cosign.as_ref().map(|k| k.path().display().to_string()).unwrap_or_default(),
            s["pushed"],
            s["present"],
            s["referrersSaid"].as_str().unwrap_or_default()
        );
    }
    if let Some((_, files)) = &settings.policies {
        for (path, file) in policies.iter().zip(files) {
            crate::say!(
                "policy   {} for {}: kubectl apply -f it where that engine runs (see the README's \"Signed for admission\")",
                path.display(),
                file.engine.describe()
            );
        }
    }
    if let Some(c) = &done.command {
        crate::say!("helm     {c}");
    }
    if let (Some(f), Some(dir)) = (&done.kept_values, &done.kept_dir) {
        crate::say!(
            "values   {} (kept next to the bundle for the command above, mode 0600, in a 0700 folder; no password in it, but the site's values are: delete it when done, rm -r {})",
            f.display(),
            dir.display()
        );
    }
    if let Some(r) = &rendered {
        print_rendered(r, &args, existing.is_some(), &target.host_and_prefix());
    }
    if done.installed {
        crate::say!(
            "{} release {} in namespace {} (Koordinator's objects in {})",
            if existing.is_some() {
                "upgraded"
            } else {
                "installed"
            },
            args.kube.release,
            namespace,
            load::CHART_NAMESPACE
        );
    }
    Ok(())
}

/// Per image of the bundle, what this load did with it (`--json`'s `images`; the bundle's BOM
/// cannot know it): `pushedAs` the reference and digest the registry holds it under (absent in a
/// dry run), `renderedAs` how the rendered release names it (absent when nothing was rendered:
/// no cluster), `pinned` whether every such name is its digest (false under `--no-pin`, with a
/// helm that skips the post-renderer, or when the release does not use it), `installedAs` the
/// name the installed release runs it by (absent unless helm installed it).
fn images_json(
    manifest: &BundleManifest,
    target: &Target,
    dry_run: bool,
    rendered: Option<&load::Rendered>,
    installed: bool,
) -> serde_json::Value {
    let registry = target.host_and_prefix();
    let images = manifest.images.iter().map(|i| {
        let tagged = format!("{registry}/{}", i.ref_name);
        let pinned = crate::oci::pinned(&tagged, i.digest.as_str());
        let names: Option<Vec<&String>> = rendered.map(|r| {
            r.images
                .iter()
                .filter(|x| **x == tagged || **x == pinned)
                .collect()
        });
        let all_pinned = names
            .as_ref()
            .is_some_and(|n| !n.is_empty() && n.iter().all(|x| **x == pinned));
        let mut v = json!({"ref": i.ref_name, "digest": i.digest, "pinned": all_pinned});
        if !dry_run {
            v["pushedAs"] = pinned.clone().into();
        }
        if let Some(n) = &names {
            v["renderedAs"] = json!(n);
            if installed && !n.is_empty() {
                v["installedAs"] = if all_pinned { pinned } else { tagged }.into();
            }
        }
        v
    });
    serde_json::Value::Array(images.collect())
}

/// What the render before the push found: the images, the values the release will hold, and
/// (listed in a dry run, counted otherwise) what changes in the cluster.
fn print_rendered(r: &load::Rendered, args: &LoadArgs, upgrade: bool, registry: &str) {
    use cluster::upgrade::Action;
    let pinned = r.images.iter().filter(|i| i.contains("@sha256:")).count();
    crate::say!(
        "rendered {} images, all in the bundle under {registry}{}",
        r.images.len(),
        match pinned {
            0 => String::new(),
            n if n == r.images.len() => ", each pinned to the bundle's digest".to_string(),
            n => format!(", {n} pinned to the bundle's digest"),
        }
    );
    if args.dry_run {
        for i in &r.images {
            crate::say!("  {}", crate::text::printable(i));
        }
    }
    if upgrade {
        let how = match values_mode(args) {
            helm::ValuesMode::Keep => "the release's values, then this run's over them",
            helm::ValuesMode::Reset => "this run's values only (--reset-values)",
            helm::ValuesMode::Reuse => "helm's --reuse-values",
        };
        let yaml = serde_yaml_ng::to_string(&r.release.config).unwrap_or_default();
        crate::say!("values   the release will hold ({how}):");
        for line in yaml.lines() {
            crate::say!("           {}", crate::text::terminal_safe(line));
        }
    }
    let changes = &r.upgrade.changes;
    let count = |a: Action| changes.iter().filter(|c| c.action == a).count();
    let labels_only = changes.iter().filter(|c| c.only_metadata).count();
    // Fields the cluster fills in (copied into the render by the chart's `lookup`) are not
    // changes: an object that differs only in them is counted apart, its fields listed apart.
    let filled_only = changes.iter().filter(|c| c.only_server_filled()).count();
    crate::say!(
        "changes  {} added, {} changed ({labels_only} of them only in labels or annotations), {} removed{}{}",
        count(Action::Add),
        count(Action::Change) - filled_only,
        count(Action::Remove),
        if filled_only > 0 {
            format!(
                "; {filled_only} more differ only in fields the cluster fills in (listed apart)"
            )
        } else {
            String::new()
        },
        if args.dry_run { ":" } else { "" }
    );
    if !args.dry_run {
        return;
    }
    for c in changes
        .iter()
        .filter(|c| !c.only_metadata && !c.only_server_filled())
    {
        let sign = match c.action {
            Action::Add => "+",
            Action::Change => "~",
            Action::Remove => "-",
        };
        crate::say!("  {sign} {}", crate::text::terminal_safe(&c.subject()));
        for d in &c.details {
            crate::say!("      {}", crate::text::terminal_safe(d));
        }
    }
    let filled: Vec<_> = changes
        .iter()
        .filter(|c| !c.server_filled.is_empty())
        .collect();
    if !filled.is_empty() {
        crate::say!("filled   by the cluster, not changes (the chart copies them from the live objects; helm's record of the release does not have them):");
        for c in filled {
            crate::say!(
                "  {}: {}",
                crate::text::terminal_safe(&c.subject()),
                crate::text::terminal_safe(&c.server_filled.join(", "))
            );
        }
    }
}
