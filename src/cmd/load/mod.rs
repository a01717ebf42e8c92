//! `koord-bundle load`: verify, pre-flight, push (digests unchanged), install with helm.
//! Nothing is pushed before verification (and, when installing, helm and the pre-flight)
//! passed; nothing is installed after a failed push.
//!
//! The command's part: its settings resolved from the flags and the environment
//! (`settings.rs`), the verification and the push with their progress bars, the interrupt's
//! message, and what is printed (`print.rs`). The pre-flight, the plan, the render before the
//! push and helm's step are the library's ([`crate::load`]).

use crate::bundle::reader::Unhashed;
use crate::bundle::source::BundleSource;
use crate::cli::LoadArgs;
use crate::copy;
use crate::load;
use crate::progress::{Mode, Progress};
use crate::store::registry::RegistryStore;
use anyhow::Context as _;
use std::path::PathBuf;
use std::sync::Arc;

mod print;
mod settings;
use settings::Settings;

/// Verify the bundle and open it for reading in place: everything but the bytes of its large
/// blobs, which the push hashes unless nothing will be pushed at all.
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

/// What undoes an interrupted helm step (set just before helm runs), for the interrupt's
/// message.
static RECOVERY: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// The pipeline's events, printed: lines and warnings as they come, findings one line each by
/// level, and what undoes the helm step kept for an interrupt's message.
fn events(progress: &Progress) -> impl Fn(load::Event) + Sync + '_ {
    move |e| match e {
        load::Event::Said(line) => progress.say(line),
        load::Event::Warning(line) => progress.warn(line),
        load::Event::Findings(f) => print::print_findings_of(&f, progress),
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
    let interrupted = |signal: crate::exit::Signal| {
        crate::child::kill_all();
        let kept = match Phase::now() {
            Phase::Checking => "nothing was pushed or installed".to_string(),
            Phase::Pushing => "what was pushed stays in the registry, digests unchanged; nothing was installed; run the same command again to push the rest (what is there is not sent again) and install".to_string(),
            Phase::Installing => match RECOVERY.lock().unwrap_or_else(|e| e.into_inner()).clone() {
                Some(undo) => format!("everything was pushed; helm was stopped during the install or upgrade, which leaves the release pending: {undo}"),
                None => "everything was pushed; nothing was installed: run the same command again".to_string(),
            },
        };
        anyhow::Error::from(super::Interrupted { signal, kept })
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
    print::report(print::Outcome {
        args: &args,
        settings: &settings,
        src: &src,
        pre: &pre,
        planned: &planned,
        rendered: rendered.as_ref(),
        checked: &checked,
        stats: &stats,
        rehashed,
        signed,
        policies,
        done,
    })
}
