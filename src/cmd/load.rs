//! `koord-bundle load`: verify, pre-flight, push (digests unchanged), install with helm.
//! Nothing is pushed before verification (and, when installing, helm and the pre-flight)
//! passed; nothing is installed after a failed push.

use crate::bundle::reader::Unhashed;
use crate::bundle::source::{split_ref, BundleSource};
use crate::bundle::{BundleManifest, OpenedBundle};
use crate::cli::LoadArgs;
use crate::cluster;
use crate::copy::{self, Item};
use crate::helm::{self, ChartSource, Helm, InstallPlan, RegistryAccess};
use crate::oci::Descriptor;
use crate::oci::Target;
use crate::progress::{Mode, Progress};
use crate::secret::Secret;
use crate::store::auth::Login;
use crate::store::registry::RegistryStore;
use crate::store::{Reference, Registry, RegistryOptions, Source as _};
use crate::text::human_bytes;
use anyhow::{bail, Context as _};
use futures_util::TryStreamExt as _;
use serde_json::json;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The release namespace of Koordinator's install guide (`helm install koordinator
/// koordinator-sh/koordinator`): helm keeps its release records there.
pub(crate) const DEFAULT_RELEASE_NAMESPACE: &str = "default";
/// The namespace the chart creates and fills (`installation.namespace`).
const CHART_NAMESPACE: &str = "koordinator-system";

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

/// Write the chart archive (the Helm artifact's layer, read from the bundle in place) into
/// `dir`.
async fn extract_chart(src: &BundleSource, dir: &Path) -> anyhow::Result<PathBuf> {
    let chart = &src.manifest().chart;
    let desc = Descriptor {
        media_type: crate::oci::media::HELM_CHART.into(),
        digest: chart.digest.clone(),
        size: src
            .blob_size(&chart.digest)
            .context("the chart archive is not among the bundle's blobs")?,
        platform: None,
        annotations: None,
    };
    let pieces: Vec<bytes::Bytes> = src.blob("", &desc, 0).await?.try_collect().await?;
    let bytes = pieces.concat();
    if crate::oci::Digest::of(&bytes) != chart.digest {
        bail!(
            "the chart archive in {} does not match its digest",
            src.path().display()
        );
    }
    let name = Path::new(&chart.file)
        .file_name()
        .context("the chart file has no name")?;
    let out = dir.join(name);
    std::fs::write(&out, bytes).with_context(|| format!("writing {}", out.display()))?;
    Ok(out)
}

/// What a load needs from the flags and the environment, resolved before the bundle is read
/// or anything is sent: which bundle, where it goes, the key, the registry's login, helm, and
/// the cluster's kubeconfig. An error in any of them costs no verification and no request.
struct Settings {
    /// The bundle, opened, with the key its signature is checked with.
    bundle: OpenedBundle,
    target: Target,
    /// The registry client (credentials read, `--password-stdin` taken).
    reg: Arc<Registry>,
    /// The login helm gets (a user and password; an identity token stays with koord-bundle).
    login: Option<Login>,
    /// helm, when something is installed (a dry run of an install included).
    helm: Option<Helm>,
    /// No helm here and no `--helm`: why, until the verified bundle supplies its own.
    helm_missing: Option<helm::HelmError>,
    /// The folder of the helm the bundle carries, while it is used.
    _carried: Option<tempfile::TempDir>,
    /// The cluster's client and kubeconfig, when something is installed.
    kube: Option<(cluster::KubeClient, KubeTarget)>,
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
        let mut settings = Settings {
            bundle,
            target,
            reg: Arc::new(reg),
            login,
            helm,
            helm_missing,
            _carried: None,
            kube: None,
            cosign,
            policies,
        };
        if let Some(h) = &settings.helm {
            check_helm_reaches_registry(args, &settings, h)?;
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
        args: &LoadArgs,
        src: &BundleSource,
        progress: &Progress,
    ) -> anyhow::Result<()> {
        let Some(why) = self.helm_missing.take() else {
            return Ok(());
        };
        let (h, dir) = super::carried::helm(src, why, progress).await?;
        check_helm_reaches_registry(args, self, &h)?;
        self.helm = Some(h);
        self._carried = Some(dir);
        Ok(())
    }
}

/// How helm reaches the registry that holds the chart.
fn registry_access(args: &LoadArgs, settings: &Settings) -> RegistryAccess {
    let login = &settings.login;
    RegistryAccess {
        host: settings.target.registry.clone(),
        username: login.as_ref().map(|l| l.username.clone()),
        password: login.as_ref().map(|l| l.password.clone()),
        ca_file: args.ca_file.first().cloned(),
        plain_http: args.plain_http,
        insecure_skip_tls_verify: args.insecure_skip_tls_verify,
    }
}

/// What would stop helm after the push, checked before it: helm 3 cannot reach a TLS registry
/// on a loopback address (it speaks plain HTTP there), so the install from it would fail.
fn check_helm_reaches_registry(
    args: &LoadArgs,
    settings: &Settings,
    helm: &Helm,
) -> anyhow::Result<()> {
    if !helm.supports_oci() {
        // helm before 3.8 installs the bundle's chart archive: no registry involved.
        return Ok(());
    }
    if let Some(hint) = registry_access(args, settings).loopback_tls_hint(helm) {
        bail!(
            "helm {} cannot install the chart from {}: {hint}; nothing was pushed",
            helm.version,
            settings.target.host_and_prefix()
        );
    }
    Ok(())
}

/// The cluster the pre-flight read: its kubeconfig files and context, given to helm as they
/// are, so that helm installs where the pre-flight looked.
struct KubeTarget {
    files: cluster::Files,
    context: String,
}

fn kube_client(
    args: &LoadArgs,
) -> Result<(cluster::KubeClient, KubeTarget), cluster::ClusterError> {
    let (client, files, kc) = super::kube_client(
        args.kube.kubeconfig.as_deref(),
        args.kube.context.as_deref(),
    )?;
    Ok((
        client,
        KubeTarget {
            files,
            context: kc.context,
        },
    ))
}

/// The pre-flight's findings, one line each.
fn print_findings(r: &cluster::PreflightReport, progress: &Progress) {
    print_findings_of(&r.findings, progress)
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

/// What the pre-flight gave: its report, the release namespace to install into, the cluster.
struct Preflight {
    report: Option<cluster::PreflightReport>,
    namespace: String,
    target: Option<KubeTarget>,
    /// The client the pre-flight read the cluster with (the upgrade checks read it again).
    client: Option<cluster::KubeClient>,
}

/// The cluster's pre-flight, before any push, whenever something will be installed (a dry run
/// of an install included: it fails where the real run would, before pushing). With
/// `--no-install` there is no pre-flight.
async fn preflight(
    args: &LoadArgs,
    kube: Option<(cluster::KubeClient, KubeTarget)>,
    manifest: &BundleManifest,
    progress: &Progress,
) -> anyhow::Result<Preflight> {
    // The release namespace: Koordinator's guide installs into `default`; the chart's objects
    // go to its own namespace whatever this is (see cluster::preflight).
    let namespace = args
        .kube
        .namespace
        .clone()
        .unwrap_or_else(|| DEFAULT_RELEASE_NAMESPACE.to_string());
    let Some((client, target)) = kube else {
        progress.say("pre-flight not run: --no-install (nothing is installed)");
        return Ok(Preflight {
            report: None,
            namespace,
            target: None,
            client: None,
        });
    };
    let mut platforms: Vec<String> = manifest
        .images
        .iter()
        .flat_map(|i| i.platforms.clone())
        .collect();
    platforms.sort();
    platforms.dedup();
    let crds: Vec<cluster::ChartCrd> = manifest
        .crds
        .iter()
        .map(|c| cluster::ChartCrd {
            name: c.name.clone(),
            plural: c.plural.clone(),
            values_key: c.values_key.clone(),
        })
        .collect();
    let input = cluster::PreflightInput {
        bundle_platforms: &platforms,
        crds: &crds,
        namespace: &namespace,
        namespace_explicit: args.kube.namespace.is_some(),
        chart_namespace: CHART_NAMESPACE,
        release: &args.kube.release,
        strict: args.strict,
        host_network: args.host_network,
        chart_version: &manifest.chart.version,
        allow_downgrade: args.allow_downgrade,
    };
    if let Some(w) = client.credentials_withheld() {
        progress.warn(format!("pre-flight: {w}"));
    }
    let report = cluster::preflight(&client, &input).await.map_err(|e| {
        anyhow::Error::new(e).context(
            "the pre-flight could not read the cluster: nothing was pushed (pass --no-install to push only)",
        )
    })?;
    print_findings(&report, progress);
    if report.failed() {
        return Err(super::ChecksFailed::new(
            "the pre-flight found problems the install would hit (above): nothing was pushed",
            &report.findings,
        )
        .into());
    }
    Ok(Preflight {
        namespace: report.release_namespace.clone(),
        report: Some(report),
        target: Some(target),
        client: Some(client),
    })
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
    let target = &settings.target;
    let store = RegistryStore::new(settings.reg.clone(), &target.host_and_prefix());
    let graphs = super::upstream_sigs::keep_appended(
        &settings.reg,
        &store,
        src,
        graphs(src).await?,
        progress,
    )
    .await?;
    let all_there = tags_in_place(sink, &graphs, args.jobs)
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
    let stats = push(src, sink, &graphs, args.jobs, args.dry_run, progress)
        .await
        .map_err(|e| push_failed(e, src.manifest(), args.dry_run))?;
    if !args.dry_run {
        super::upstream_sigs::list_referrers(&settings.reg, &store, src, progress).await?;
    }
    Ok((stats, !all_there))
}

/// What a failed push says: for blobs an incremental bundle left out and the registry lacks
/// (found before anything is pushed), which bundle to load first; else that a re-run finishes.
fn push_failed(
    e: anyhow::Error,
    m: &crate::bundle::BundleManifest,
    dry_run: bool,
) -> anyhow::Error {
    let missing = e.chain().any(|c| {
        matches!(
            c.downcast_ref(),
            Some(copy::WalkError::MissingOnSite { .. })
        )
    });
    match (&m.base, missing) {
        (Some(base), true) => e.context(format!(
            "this is an incremental bundle: the registry lacks blobs it left out, because its base carried them; load its base, {}, into the same registry first, then this one; nothing was pushed",
            base.describe()
        )),
        _ if dry_run => e.context("checking the registry"),
        _ => e.context("push failed: nothing was installed; re-run the same command to finish (what is there is skipped)"),
    }
}

/// What the helm step did.
struct Installed {
    command: Option<String>,
    kept_values: Option<PathBuf>,
    /// The folder of the printed command's files.
    kept_dir: Option<PathBuf>,
    installed: bool,
}

/// The install, planned once before anything is pushed: the plan helm runs (the chart from
/// the registry, the generated values, how the release's values carry over, the
/// post-renderer), and the chart archive a render before the push uses.
struct Planned {
    plan: InstallPlan,
    /// The bundle's chart archive, in `_tmp`.
    archive: PathBuf,
    _tmp: tempfile::TempDir,
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

/// The oldest helm whose `--post-renderer` takes arguments (`--post-renderer-args`).
const POST_RENDERER_ARGS: semver::Version = semver::Version::new(3, 10, 0);

/// helm's post-renderer: `koord-bundle post-render` (the CRDs kept on uninstall), unless
/// `--no-keep-crds` or helm is too old for it (said).
fn post_renderer(
    args: &LoadArgs,
    settings: &Settings,
    src: &BundleSource,
    helm: Option<&Helm>,
    progress: &Progress,
) -> anyhow::Result<Option<helm::PostRenderer>> {
    let how = crate::chart::post_render::PostRender {
        keep_crds: !args.no_keep_crds,
        pin: if args.no_pin {
            Default::default()
        } else {
            pins(settings, src)
        },
        keep_pull_policy: args.keep_pull_policy,
    };
    if how.is_noop() {
        return Ok(None);
    }
    if helm.is_some_and(|h| h.version < POST_RENDERER_ARGS) {
        progress.warn(format!(
            "helm before {POST_RENDERER_ARGS} cannot run koord-bundle as its post-renderer: the images are installed by tag, not pinned to the bundle's digests, and the chart's CRDs without helm.sh/resource-policy: keep, so `helm uninstall` would delete them and every object of theirs"
        ));
        return Ok(None);
    }
    Ok(Some(helm::PostRenderer {
        exe: std::env::current_exe()
            .context("cannot find the koord-bundle executable for helm's post-renderer")?,
        config_json: serde_json::to_string(&how)?,
    }))
}

/// Every image of the bundle as the chart renders it under the target registry → its digest
/// in the bundle.
fn pins(settings: &Settings, src: &BundleSource) -> std::collections::BTreeMap<String, String> {
    let target = &settings.target;
    src.manifest()
        .images
        .iter()
        .map(|i| {
            (
                format!("{}/{}", target.host_and_prefix(), i.ref_name),
                i.digest.to_string(),
            )
        })
        .collect()
}

/// Every image of the bundle, by the repositories that name it (its chart path, which matches
/// it under the target registry too, and where it came from), for the scan of the rendering.
fn carried(src: &BundleSource) -> Vec<crate::chart::rendered::Carried> {
    src.manifest()
        .images
        .iter()
        .map(|i| {
            let mut repositories = vec![i.repository.clone()];
            for r in [&i.original, &i.source_ref] {
                if let Ok(p) = crate::oci::ImageRef::parse(r) {
                    repositories.push(format!("{}/{}", p.registry, p.repository));
                    repositories.push(p.repository);
                }
            }
            repositories.sort();
            repositories.dedup();
            crate::chart::rendered::Carried {
                name: i.ref_name.clone(),
                repositories,
            }
        })
        .collect()
}

/// A Warn for each image of the bundle named outside a container's image field (a Fail under
/// `--strict`): the post-renderer pins only container images, so that one runs by tag.
fn mention_findings(
    mentions: &[crate::chart::rendered::ImageMention],
    strict: bool,
) -> Vec<cluster::Finding> {
    mentions
        .iter()
        .map(|m| {
            cluster::Finding::new(
                if strict {
                    cluster::Level::Fail
                } else {
                    cluster::Level::Warn
                },
                "image-outside-containers",
                format!(
                    "{}: it is not pinned to the bundle's digest, and whatever uses it pulls the tag as the registry holds it then",
                    m
                ),
                Some(if strict {
                    "name the image in a container's image field, or change the values that put it there".to_string()
                } else {
                    "check that it names the image under the registry loaded into; pass --strict to refuse such a rendering".to_string()
                }),
            )
            .about(format!("{} {}", m.object, m.path))
        })
        .collect()
}

/// Plan the install: values, chart, the release's values carried over, the post-renderer.
async fn plan(
    args: &LoadArgs,
    settings: &Settings,
    src: &BundleSource,
    helm: Option<&Helm>,
    pre: &Preflight,
    progress: &Progress,
) -> anyhow::Result<Planned> {
    let (target, manifest) = (&settings.target, src.manifest());
    let preflight = pre.report.as_ref();
    let chart_repo = format!("charts/{}", manifest.chart.name);
    let mut crds_off: Vec<String> = args.skip_crds.clone();
    if let Some(r) = preflight {
        for k in &r.crd_values_off {
            let k = k.trim_start_matches("crds.").to_string();
            if !crds_off.contains(&k) {
                crds_off.push(k);
            }
        }
    }
    let host_network = args.host_network || preflight.is_some_and(|r| r.host_network);
    let values = crate::chart::generated_values(
        &target.host_and_prefix(),
        args.feature_gates.as_deref(),
        &crds_off,
        host_network,
        &args.image_pull_secret,
    );
    let tmp = tempfile::tempdir()?;
    let archive = extract_chart(src, tmp.path()).await?;
    // The chart a real run installs: from the registry (helm 3.8+), else the bundle's archive.
    let chart_source = match &helm {
        Some(h) if h.supports_oci() => ChartSource::Oci {
            reference: format!("oci://{}/{chart_repo}", target.host_and_prefix()),
            version: manifest.chart.version.clone(),
        },
        _ => ChartSource::Archive(archive.clone()),
    };
    let existing = preflight.and_then(|r| r.existing_release.as_ref());
    let plan = InstallPlan {
        release: args.kube.release.clone(),
        namespace: pre.namespace.clone(),
        create_namespace: preflight.is_some_and(|r| r.create_namespace),
        chart: chart_source,
        generated_values: values,
        user_values: args.values.clone(),
        user_sets: args.set.clone(),
        values_mode: values_mode(args),
        previous_values: existing
            .and_then(|r| r.values.as_ref())
            .and_then(|v| serde_yaml_ng::to_value(v).ok()),
        post_render: post_renderer(args, settings, src, helm, progress)?,
        // helm gets the kubeconfig files and the context the pre-flight read: one file as
        // --kubeconfig, a $KUBECONFIG list (which --kubeconfig cannot take) in its environment.
        kubeconfig: pre
            .target
            .as_ref()
            .filter(|t| t.files.origin == cluster::Origin::Flag)
            .and_then(|t| t.files.paths.first().cloned()),
        kubeconfig_env: pre
            .target
            .as_ref()
            .filter(|t| t.files.origin == cluster::Origin::Env)
            .and_then(|t| t.files.env_value()),
        context: pre
            .target
            .as_ref()
            .map(|t| t.context.clone())
            .or_else(|| args.kube.context.clone()),
        registry: Some(registry_access(args, settings)),
        wait: false,
        timeout: None,
    };
    Ok(Planned {
        plan,
        archive,
        _tmp: tmp,
    })
}

/// What the render before the push found: helm's release as it would be, and the checks of
/// the second day against the cluster.
struct Rendered {
    release: helm::RenderedRelease,
    images: Vec<String>,
    upgrade: cluster::upgrade::UpgradeReport,
}

/// Before any push: the release as helm will make it (`helm upgrade --install --dry-run=server
/// -o json` from the bundle's chart archive: the merged values, the post-rendered objects),
/// every image it deploys checked to be in the bundle, and the upgrade checked against the
/// cluster (what changes, what the CRDs do to existing objects, a server-side dry run).
async fn render(
    args: &LoadArgs,
    settings: &Settings,
    src: &BundleSource,
    helm: &Helm,
    planned: &Planned,
    pre: &Preflight,
    progress: &Progress,
) -> anyhow::Result<Option<Rendered>> {
    let Some(client) = &pre.client else {
        return Ok(None);
    };
    let target = &settings.target;
    let mut plan = planned.plan.clone();
    plan.chart = ChartSource::Archive(planned.archive.clone());
    let release = tokio::task::block_in_place(|| helm.render_release(&plan)).context(
        "helm could not render the release (a dry run against the cluster): nothing was pushed",
    )?;
    // Every rendered document read strictly (hooks too): its container images, and the
    // images of the bundle it names anywhere else (not pinned, not checked below).
    let scan = crate::chart::rendered::scan(&release.all_manifests(), &carried(src))
        .context("the release helm rendered: nothing was pushed")?;
    let images = scan.images;
    // As the chart renders them, and as pinned to the bundle's digest (the post-renderer).
    let bundled: Vec<String> = pins(settings, src)
        .into_iter()
        .flat_map(|(r, d)| [crate::chart::post_render::pinned(&r, &d), r])
        .collect();
    let foreign: Vec<&String> = images.iter().filter(|i| !bundled.contains(i)).collect();
    if !foreign.is_empty() {
        bail!(
            "the rendered chart uses images the bundle does not hold under {}: {}; nothing was pushed",
            target.host_and_prefix(),
            foreign.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        );
    }
    let mentions = mention_findings(&scan.mentions, args.strict);
    print_findings_of(&mentions, progress);
    if args.strict && !mentions.is_empty() {
        return Err(super::ChecksFailed::new(
            "--strict: the rendered chart names images of the bundle outside a container's image field (above): nothing was pushed",
            &mentions,
        )
        .into());
    }
    let objects = crate::chart::post_render::objects(&release.manifest)
        .context("the release helm rendered")?;
    let previous = match pre
        .report
        .as_ref()
        .and_then(|r| r.existing_release.as_ref())
        .and_then(|r| r.manifest.as_deref())
    {
        Some(m) => crate::chart::post_render::objects(m).unwrap_or_default(),
        None => Vec::new(),
    };
    let upgrade = cluster::upgrade::check(
        client,
        &cluster::upgrade::UpgradeInput {
            objects: &objects,
            previous: &previous,
            release_namespace: &pre.namespace,
            strict: args.strict,
            allow_field_loss: args.allow_field_loss,
        },
    )
    .await
    .map_err(|e| {
        anyhow::Error::new(e)
            .context("the checks of the new release could not read the cluster: nothing was pushed")
    })?;
    print_findings_of(&upgrade.findings, progress);
    let mut upgrade = upgrade;
    upgrade.findings.extend(mentions);
    if upgrade.failed() {
        return Err(super::ChecksFailed::new(
            "the new release would fail or lose objects in the cluster (above): nothing was pushed",
            &upgrade.findings,
        )
        .into());
    }
    Ok(Some(Rendered {
        release,
        images,
        upgrade,
    }))
}

/// The printed helm command, and in a real run the install itself, after the push. The files
/// the command names (the generated values, the post-renderer's configuration, helm 4's
/// plugin, the registry config a login fills; the bundle's helm when it is the one used) are
/// written to a folder of their own next to the bundle ([`command_dir`]), kept so that the
/// command runs as printed after the load; the output names it. helm itself runs from a
/// private temporary folder that goes when the load ends.
// helm's lines are passed on as they come (escaped), with no newline added.
#[allow(clippy::disallowed_macros)]
async fn install(
    args: &LoadArgs,
    settings: &Settings,
    helm: Option<&Helm>,
    planned: &Planned,
    deployed_before: Option<u32>,
    progress: &Progress,
) -> anyhow::Result<Installed> {
    let plan = &planned.plan;
    let mut out = Installed {
        command: None,
        kept_values: None,
        kept_dir: None,
        installed: false,
    };
    let Some(h) = helm else { return Ok(out) };
    // The helm the printed commands name: the bundle's, copied next to the kept files (the
    // copy this load runs goes when it ends), else the one found here.
    let mut shown = h.clone();
    match command_dir(settings.bundle.path(), &args.kube.release) {
        Ok(dir) => {
            if settings._carried.is_some() {
                shown.path = keep_helm(&h.path, &dir)?;
            }
            let values_file = helm::keep_command_files(plan, &shown, &dir)
                .context("writing the files of the printed helm command")?;
            out.command = Some(plan.command_line(&shown, &values_file, false));
            out.kept_values = Some(values_file);
            out.kept_dir = Some(dir);
        }
        Err(why) => progress.warn(format!(
            "the helm command is not printed: its files cannot be kept ({why})"
        )),
    }
    if !args.no_install && !args.dry_run {
        let undo = plan.recovery_line(&shown, deployed_before);
        *RECOVERY.lock().unwrap_or_else(|e| e.into_inner()) = Some(match deployed_before {
            Some(rev) => format!("roll the release back to revision {rev}, the one deployed before: {undo}; then run the same load again"),
            None => format!("the release was being installed: remove what helm left with {undo}; then run the same load again"),
        });
        // helm's output, as it comes (scrubbed of the password by helm.rs); helm quotes the
        // cluster and the chart: no control character of theirs reaches the terminal raw.
        let sink: crate::child::LineSink = std::sync::Arc::new(|_, line: &[u8]| {
            eprint!(
                "{}",
                crate::text::terminal_safe(&String::from_utf8_lossy(line))
            )
        });
        tokio::task::block_in_place(|| h.upgrade_install(plan, false, Some(sink))).context("helm upgrade --install failed (the images and chart are in the registry; fix the cause and re-run)")?;
        out.installed = true;
    }
    Ok(out)
}

/// What undoes an interrupted helm step (set just before helm runs), for the interrupt's
/// message.
static RECOVERY: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// The folder the printed helm command's files are kept in: `koord-bundle-helm-RELEASE` next
/// to the bundle, else in the current directory (a bundle on read-only media), created 0700.
/// An existing folder is used only when it is a real directory of this user that nobody else
/// can read (never through a symbolic link).
fn command_dir(bundle: &Path, release: &str) -> Result<PathBuf, String> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
    let name = format!(
        "koord-bundle-helm-{}",
        release
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            })
            .collect::<String>()
    );
    let beside = bundle
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut why = Vec::new();
    for base in [beside, Path::new(".")] {
        let dir = base.join(&name);
        let made = std::fs::DirBuilder::new().mode(0o700).create(&dir);
        // Absolute: the printed command runs from any directory.
        let dir = match std::path::absolute(&dir) {
            Ok(d) => d,
            Err(e) => {
                why.push(format!("{}: {e}", dir.display()));
                continue;
            }
        };
        match made {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                match std::fs::symlink_metadata(&dir) {
                    Ok(m)
                        if m.is_dir()
                            && m.uid() == rustix::process::geteuid().as_raw()
                            && m.permissions().mode() & 0o077 == 0 =>
                    {
                        return Ok(dir)
                    }
                    Ok(_) => why.push(format!(
                        "{} is there and is not a private folder of this user (0700)",
                        dir.display()
                    )),
                    Err(e) => why.push(format!("{}: {e}", dir.display())),
                }
            }
            Err(e) => why.push(format!("{}: {e}", dir.display())),
        }
    }
    Err(why.join("; "))
}

/// Copy the bundle's helm (checked when it was copied out) into `dir`, 0700, for the printed
/// commands; returns its path.
fn keep_helm(from: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let to = dir.join("helm");
    match std::fs::remove_file(&to) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("replacing {}", to.display()))
        }
        _ => {}
    }
    let mut src =
        crate::bounded::open_input(from).with_context(|| format!("reading {}", from.display()))?;
    let mut dst = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(&to)
        .with_context(|| format!("creating {}", to.display()))?;
    std::io::copy(&mut src, &mut dst).with_context(|| format!("writing {}", to.display()))?;
    dst.sync_all()?;
    Ok(to)
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
    settings.carried_helm(&args, &src, &progress).await?;
    let manifest = src.manifest().clone();
    let pre = preflight(&args, settings.kube.take(), &manifest, &progress).await?;
    let helm = settings.helm.take();
    let target = settings.target.clone();
    let planned = plan(&args, &settings, &src, helm.as_ref(), &pre, &progress).await?;
    let rendered = match &helm {
        Some(h) => render(&args, &settings, &src, h, &planned, &pre, &progress).await?,
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
    let deployed_before = pre
        .report
        .as_ref()
        .and_then(|r| r.existing_release.as_ref())
        .and_then(|r| match r.status.as_str() {
            "deployed" => Some(r.revision),
            _ => r.last_deployed.as_ref().map(|d| d.revision),
        });
    let done = install(
        &args,
        &settings,
        helm.as_ref(),
        &planned,
        deployed_before,
        &progress,
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
        blob_counts(&stats, args.dry_run),
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
            "{} release {} in namespace {} (Koordinator's objects in {CHART_NAMESPACE})",
            if existing.is_some() {
                "upgraded"
            } else {
                "installed"
            },
            args.kube.release,
            namespace
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
    rendered: Option<&Rendered>,
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
fn print_rendered(r: &Rendered, args: &LoadArgs, upgrade: bool, registry: &str) {
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

/// Every graph the bundle names (its images, their carried cosign signatures and
/// attestations, and the chart artifact), each with the repository and the tag (or digest) it
/// goes under, resolved by the walk from the verified manifests. A carried signature goes to
/// its own tag (`sha256-<hex>.sig`) unchanged, before `--sign-images` appends the site's to
/// it; a carried OCI 1.1 referrer by its digest (`upstream_sigs::list_referrers` lists it).
async fn graphs(src: &BundleSource) -> anyhow::Result<Vec<(copy::Graph, String, Reference)>> {
    let m = src.manifest();
    let mut out = Vec::new();
    let budget = copy::Budget::default();
    let sigs = m.images.iter().flat_map(|i| &i.signatures);
    for (r, by_digest) in m
        .images
        .iter()
        .map(|i| (&i.ref_name, None))
        .chain(sigs.map(|s| (&s.ref_name, s.is_referrer().then_some(&s.digest))))
        .chain(std::iter::once((&m.chart.oci.ref_name, None)))
    {
        let (repo, reference) = match by_digest {
            Some(d) => (
                r.split_once('@')
                    .map(|(repo, _)| repo)
                    .with_context(|| format!("ref name {r:?} is not REPOSITORY@DIGEST"))?,
                Reference::Digest(d.clone()),
            ),
            None => {
                let (repo, tag) = split_ref(r)
                    .with_context(|| format!("ref name {r:?} is not REPOSITORY:TAG"))?;
                (repo, Reference::Tag(tag.to_string()))
            }
        };
        let g = copy::resolve(src, repo, &reference, None, &budget)
            .await
            .with_context(|| format!("{} in the bundle", reference.qualify(repo)))?;
        out.push((g, repo.to_string(), reference));
    }
    Ok(out)
}

/// Does every tag in the registry already point at its graph's top manifest?
async fn tags_in_place<K: crate::store::Sink>(
    sink: &K,
    graphs: &[(copy::Graph, String, Reference)],
    jobs: usize,
) -> anyhow::Result<bool> {
    use futures_util::StreamExt as _;
    let found: Vec<bool> = futures_util::stream::iter(graphs)
        .map(|(g, repo, reference)| async move {
            crate::store::Sink::has_manifest(sink, repo, reference, &g.top.digest).await
        })
        .buffered(jobs.max(1))
        .try_collect()
        .await?;
    Ok(found.iter().all(|f| *f))
}

/// Copy every graph into the registry, each under its repository and tag: the one walk, from
/// the bundle read in place.
async fn push<K: crate::store::Sink>(
    src: &BundleSource,
    sink: &K,
    graphs: &[(copy::Graph, String, Reference)],
    jobs: usize,
    dry_run: bool,
    progress: &Progress,
) -> anyhow::Result<copy::Stats> {
    let m = src.manifest();
    let items: Vec<Item> = graphs
        .iter()
        .map(|(g, repo, reference)| Item {
            graph: g,
            repo: repo.clone(),
            reference: reference.clone(),
        })
        .collect();
    let omitted = m.omitted_blobs.iter().map(|o| o.digest.clone()).collect();
    // Checked: a digest with two sizes, or sizes that add up past 2^63 - 1, are refused.
    let total = copy::totals(graphs.iter().map(|(g, _, _)| g), &Default::default())?.bytes;
    let bar = progress.bytes(
        if dry_run {
            "checking registry"
        } else {
            "pushing"
        },
        total,
    );
    let on = bar.clone();
    let stats = copy::transfer(
        src,
        sink,
        &items,
        &copy::Options {
            jobs,
            omitted: &omitted,
            omitted_policy: copy::Omitted::Require,
            dry_run,
            on_bytes: Arc::new(move |n| on.inc(n)),
        },
    )
    .await?;
    bar.finish(&blob_counts(&stats, dry_run));
    Ok(stats)
}

/// What the push did with the blobs, in the same words on the progress line and in the
/// summary: `pushed 3 of 26 blobs (1.2 MiB), 23 already there (3.8 MiB), 8 mounted across
/// repositories` (each blob counted once, whatever number of repositories use it; the bytes
/// pushed are the bytes sent), `would push …, would mount …` in a dry run.
fn blob_counts(stats: &copy::Stats, dry_run: bool) -> String {
    let (push, mount) = if dry_run {
        ("would push", "would mount")
    } else {
        ("pushed", "mounted")
    };
    let mounts = if stats.mounted > 0 {
        format!(", {mount} {} across repositories", stats.mounted)
    } else {
        String::new()
    };
    format!(
        "{push} {} of {} {} ({}), {} already there ({}){mounts}",
        stats.uploaded,
        stats.blobs,
        crate::text::plural(stats.blobs, "blob", "blobs"),
        human_bytes(stats.uploaded_bytes),
        stats.skipped,
        human_bytes(stats.skipped_bytes)
    )
}
