//! `koord-bundle serve`: a read-only OCI registry straight from a bundle (or the first part of
//! a split bundle), with no extraction. The bundle is verified completely first; nothing is
//! served before. Requests are logged to stderr, one line each; Ctrl-C or SIGTERM stops it.

use crate::bundle::source::BundleSource;
use crate::bundle::BundleManifest;
use crate::bundle::OpenedBundle;
use crate::cli::ServeArgs;
use crate::progress::{Mode, Progress};
use crate::serve::{self, Event, Htpasswd, Index, Listener, Options};
use anyhow::Context as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// After Ctrl-C / SIGTERM, how long open transfers may go on.
const GRACE: Duration = Duration::from_secs(10);

/// `--addr HOST:PORT`, checked by the rules of a registry address (port 0: any free port) before
/// binding, and a host name the name service does not know named as such (a typo: exit 1).
async fn check_addr(addr: &str) -> anyhow::Result<()> {
    let hp = crate::oci::split_host_port(addr, true)
        .map_err(|reason| anyhow::anyhow!("--addr {addr:?}: {reason}"))?;
    if hp.port.is_none() {
        anyhow::bail!("--addr {addr:?}: the port is missing: give HOST:PORT, e.g. 127.0.0.1:5000");
    }
    if hp.host.parse::<std::net::IpAddr>().is_err() {
        if let Err(e) = tokio::net::lookup_host(addr).await {
            if crate::store::dns::does_not_resolve(&e.to_string()) {
                anyhow::bail!(
                    "--addr {addr}: the host name {} does not resolve (the name service knows no such host): check the spelling{}, or give an IP address of this machine",
                    hp.host,
                    crate::store::dns::localhost_hint(hp.host)
                );
            }
        }
    }
    Ok(())
}

/// Serve a bundle.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    // Ctrl-C and SIGTERM are listened to from the start: a signal that arrives once the port
    // answers stops serve cleanly (registered lazily, when the serving loop first polled it, a
    // SIGTERM right after the first answer could still kill it: exit by signal, no "stopped").
    let shutdown = shutdown_signal()?;
    let progress = Progress::new(Mode::detect(false));
    super::bundle_arg(&args.bundle)?;
    // Opened once: the completeness check, the head, the size and the verification read the
    // same handle.
    let opened = OpenedBundle::open(&args.bundle);
    if let Ok(b) = &opened {
        b.check_complete()
            .context("the bundle did not verify: nothing is served")?;
    }
    let pk = super::trusted_key(&args.signature, &progress)?;
    // Everything that fails fast comes before the (long) verification.
    let htpasswd = args.htpasswd.as_deref().map(Htpasswd::load).transpose()?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(serve::tls_config(cert, key)?),
        _ => None,
    };
    check_addr(&args.addr).await?;
    let listener = Listener::bind(&args.addr).await?;
    let addr = listener.local_addr().context("the listening address")?;

    let mut b = super::opened(
        &args.bundle,
        opened,
        Some("the bundle did not verify: nothing is served"),
    )?;
    b.set_trust(pk);
    // An incremental bundle leaves out layers the site holds: say so before verifying it.
    if let Ok(head) = b.head() {
        if let Ok(m) = serde_json::from_slice::<BundleManifest>(&head.manifest) {
            refuse_incremental(&m)?;
        }
    }
    let bar = progress.bytes("verifying", b.size());
    let src = BundleSource::open(&b, &|n| bar.inc(n))
        .await
        .context("the bundle did not verify: nothing is served")?;
    bar.finish("verified");
    if let Some(bf) = &src.report().file {
        super::sets::tell_repairs(&progress, bf);
    }
    if let Some(set) = src.split_set() {
        // Damage that appears while serving: each block rebuilt is told once.
        let p = progress.clone();
        set.on_repair(Arc::new(move |r: &koord_splitset::Repair| {
            p.warn(format!(
                "{}: block {} damaged, rebuilt from parity (koord-bundle repair writes it back)",
                r.file, r.block
            ))
        }));
    }
    refuse_incremental(src.manifest())?;
    let index = Index::build(&src)
        .await
        .context("the bundle's layout cannot be served")?;

    print_banner(&args, &src, &index, addr, tls.is_some(), htpasswd.as_ref());

    // The request log goes through the printer like every other line: a request's path is the
    // client's (httparse and http take UTF-8 in it, bidi overrides and C1 controls included),
    // and reaches the operator's terminal escaped.
    let log = progress.clone();
    let events: serve::EventSink = Arc::new(move |e: Event| match e {
        Event::Request(r) => log.say(format!(
            "{} {} {} {} {}B {}ms{}",
            r.remote,
            r.method,
            r.path,
            r.status,
            r.bytes,
            r.elapsed.as_millis(),
            if r.complete { "" } else { " (incomplete)" }
        )),
        Event::Warning(w) => log.warn(w),
        Event::Connection { remote, error } => log.say(format!("{remote} connection: {error}")),
    });
    serve::serve(
        listener,
        Arc::new(src),
        index,
        Options {
            htpasswd,
            tls,
            events,
            grace: GRACE,
            max_connections: usize::from(args.max_connections),
        },
        shutdown,
    )
    .await?;
    crate::tell!("stopped");
    Ok(())
}

/// Ctrl-C or SIGTERM: both registered now (no longer the default action of ending the
/// process), the future resolving at the first that arrives.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt()).context("cannot listen to SIGINT")?;
    let mut term = signal(SignalKind::terminate()).context("cannot listen to SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        crate::tell!(
            "stopping: no new connections; open transfers get {}s to finish",
            GRACE.as_secs()
        );
    })
}

/// An incremental bundle cannot be served alone: its left-out layers are not in it.
fn refuse_incremental(m: &BundleManifest) -> anyhow::Result<()> {
    if m.omitted_blobs.is_empty() {
        return Ok(());
    }
    let base = m
        .base
        .as_ref()
        .map(|b| format!(" on the {} bundle created {}", b.chart_version, b.created))
        .unwrap_or_default();
    anyhow::bail!(
        "an incremental bundle (it builds{base} and leaves out {} blobs the site already holds) cannot be served on its own: serve the full bundle, or load this one into the registry that holds its base",
        m.omitted_blobs.len()
    )
}

/// What verified, where it listens, what it serves and how to use it (stdout).
fn print_banner(
    args: &ServeArgs,
    src: &BundleSource,
    index: &Index,
    addr: SocketAddr,
    tls: bool,
    htpasswd: Option<&Htpasswd>,
) {
    let report = src.report();
    let signature = match &report.signature {
        Some(s) if report.signature_verified => {
            format!("signature OK (key {}; {})", s.key_id, s.trusted_comment)
        }
        _ => "signature NOT CHECKED".into(),
    };
    crate::say!(
        "bundle {} verified: {signature}; {} files ({}), {}",
        src.path().display(),
        report.files,
        crate::text::human_bytes(report.bytes),
        super::blobs_in_bundle(&src.manifest().blobs)
    );
    // How clients reach it: the bound address, or a placeholder for a wildcard address.
    let host = if addr.ip().is_unspecified() {
        format!("HOST:{}", addr.port())
    } else {
        addr.to_string()
    };
    let scheme = if tls { "https" } else { "http" };
    crate::say!(
        "serving a read-only OCI registry on {scheme}://{addr}{} (Ctrl-C stops it)",
        if htpasswd.is_some() {
            ", basic auth required"
        } else {
            ""
        }
    );
    // The nodes pull from an address they reach: never a loopback one (on a node, 127.0.0.1
    // is the node itself), never a wildcard one.
    let node_host = if addr.ip().is_unspecified() || addr.ip().is_loopback() {
        format!("HOST:{}", addr.port())
    } else {
        addr.to_string()
    };
    if addr.ip().is_unspecified() {
        crate::say!("  (HOST below: an address of this machine that the clients reach)");
    }
    crate::say!("repositories:");
    let tags = index.tags();
    let width = tags.iter().map(|(r, _)| r.len()).max().unwrap_or(0);
    for (repo, tag) in &tags {
        crate::say!("  {repo:width$}  {tag}");
    }

    let (skopeo_tls, helm_tls) = if tls {
        (
            " --src-cert-dir DIR_WITH_CA_CRT".to_string(),
            " --ca-file CA.crt".to_string(),
        )
    } else {
        (
            " --src-tls-verify=false".to_string(),
            " --plain-http".to_string(),
        )
    };
    let skopeo_auth = if htpasswd.is_some() {
        " --src-creds USER:PASSWORD"
    } else {
        ""
    };
    crate::say!("use it:");
    if htpasswd.is_some() {
        let ca = if tls { " --ca-file CA.crt" } else { "" };
        crate::say!(
            "  helm registry login {host} --username USER --password-stdin{ca}   (once, for helm)"
        );
    }
    let image = tags
        .iter()
        .find(|(r, _)| r.ends_with("/koordlet"))
        .or_else(|| tags.iter().find(|(r, _)| !r.starts_with("charts/")));
    if let Some((repo, tag)) = image {
        let short = repo.rsplit('/').next().unwrap_or(repo);
        crate::say!(
            "  skopeo copy --all{skopeo_tls}{skopeo_auth} docker://{host}/{repo}:{tag} oci:{short}:{tag}"
        );
    }
    if let Some((repo, tag)) = tags.iter().find(|(r, _)| r.starts_with("charts/")) {
        crate::say!("  helm pull oci://{host}/{repo} --version {tag}{helm_tls}");
        crate::say!(
            "  helm upgrade --install koordinator oci://{host}/{repo} --version {tag}{helm_tls} \\\n      --namespace default --set imageRepositoryHost={node_host}{}",
            if htpasswd.is_some() {
                " --set 'imagePullSecrets[0].name=SECRET'"
            } else {
                ""
            }
        );
        crate::say!("    (release in default, as Koordinator's guide has it; the chart creates koordinator-system and puts its objects there; the nodes then pull every image from here)");
        if addr.ip().is_loopback() {
            crate::say!(
                "    (HOST: an address of this machine that the nodes reach. This registry listens on {addr}, a loopback address that only this machine reaches (on a node, 127.0.0.1 is the node itself): for the nodes, serve on --addr 0.0.0.0:{port} or --addr <an address of this machine>:{port})",
                port = addr.port()
            );
        }
        if htpasswd.is_some() {
            crate::say!("    (SECRET must exist in koordinator-system first, in a namespace helm may adopt: kubectl create namespace koordinator-system && kubectl label namespace koordinator-system app.kubernetes.io/managed-by=Helm && kubectl annotate namespace koordinator-system meta.helm.sh/release-name=koordinator meta.helm.sh/release-namespace=default && kubectl -n koordinator-system create secret docker-registry SECRET --docker-server={node_host} --docker-username=USER --docker-password=...)");
        }
        if tls {
            crate::say!("    (containerd must trust the CA: /etc/containerd/certs.d/{node_host}/hosts.toml with ca = \"CA.crt\")");
        }
    }
    crate::say!(
        "  koord-bundle load {} --registry REGISTRY[/PREFIX]   (once the site has a registry of its own)",
        args.bundle.display()
    );
    if !tls {
        crate::say!(
            "note: plain HTTP: container runtimes must treat {node_host} as an insecure registry (containerd: /etc/containerd/certs.d/{node_host}/hosts.toml with server = \"http://{node_host}\"); --tls-cert/--tls-key serve HTTPS"
        );
    }
    crate::say!("requests are logged to stderr, one line each");
}
