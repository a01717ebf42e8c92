//! The helm a bundle carries (`build --with-tools`), for a site that has none: `load` without
//! helm on `PATH` (and without `--helm`) takes it from the verified bundle, hashed again
//! against the signed checksum file as it is copied out, into a folder of its own that goes
//! when the load ends.

use crate::bundle::source::BundleSource;
use crate::bundle::tools;
use crate::helm::{self, Helm};
use crate::progress::Progress;
use anyhow::{bail, Context as _};
use futures_util::StreamExt as _;
use sha2::Digest as _;
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};

/// The carried helm, copied out of `src` and checked, with the folder that holds it. `why` is
/// what finding helm on this machine said (the error when the bundle carries none for it).
pub async fn helm(
    src: &BundleSource,
    why: helm::HelmError,
    progress: &Progress,
) -> anyhow::Result<(Helm, tempfile::TempDir)> {
    let platform = tools::host_platform();
    let m = src.manifest();
    let Some(t) = tools::find(m, "helm", &platform) else {
        let carried = match tools::summary(m) {
            Some(s) => format!("it carries {s}, none for {platform}"),
            None => "it carries no tools (build it with --with-tools)".into(),
        };
        return Err(anyhow::Error::new(why).context(format!(
            "helm is needed to install (or pass --no-install), and the bundle cannot supply one: {carried}; nothing was pushed"
        )));
    };
    let dir = tempfile::Builder::new()
        .prefix("koord-bundle-tools-")
        .tempdir()
        .context("a folder for the bundle's helm")?;
    let path = dir.path().join("helm");
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    let mut stream = src.tool(&t.file)?;
    let mut h = sha2::Sha256::new();
    let mut n = 0u64;
    while let Some(piece) = stream.next().await {
        let piece = piece?;
        h.update(&piece);
        n += piece.len() as u64;
        out.write_all(&piece)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let got = crate::oci::Digest::from_hasher(h);
    if got != t.sha256 || n != t.size {
        bail!(
            "{} in the bundle is not what its signed checksum file says (sha256 {got}, {n} bytes; expected {}, {} bytes): the bundle is damaged; nothing was pushed",
            t.file,
            t.sha256,
            t.size
        );
    }
    out.sync_all()?;
    // On the descriptor, never by path after the open.
    out.set_permissions(std::fs::Permissions::from_mode(0o700))?;
    drop(out);
    let found = Helm::find(Some(&path), None, &helm::FOR_LOAD)
        .context("the bundle's helm does not run here: nothing was pushed")?;
    progress.say(format!(
        "helm     none on PATH: using the one the bundle carries ({}, helm v{}, sha256 checked)",
        t.file, found.version
    ));
    Ok((found, dir))
}
