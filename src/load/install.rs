//! helm's step, after the push: the printed command and its files, and the install itself.

use super::plan::Planned;
use super::{Event, Events, Options};
use crate::helm::Helm;
use anyhow::Context as _;
use std::path::{Path, PathBuf};

/// What the helm step did.
#[derive(Debug, Default)]
pub struct Installed {
    /// The helm command printed (it runs as printed after the load).
    pub command: Option<String>,
    /// The generated values file the command names.
    pub kept_values: Option<PathBuf>,
    /// The folder of the printed command's files.
    pub kept_dir: Option<PathBuf>,
    /// Whether helm installed or upgraded the release.
    pub installed: bool,
}

/// The printed helm command, and in a real run the install itself, after the push. The files
/// the command names (the generated values, the post-renderer's configuration, helm 4's
/// plugin, the registry config a login fills; the bundle's helm when it is the one used,
/// `carried`) are written to a folder of their own next to `bundle` ([`command_dir`]), kept so
/// that the command runs as printed after the load; the result names it. helm itself runs from
/// a private temporary folder that goes when the load ends; its output goes to `lines`.
#[allow(clippy::too_many_arguments)]
pub async fn install(
    o: &Options,
    bundle: &Path,
    carried: bool,
    helm: Option<&Helm>,
    planned: &Planned,
    deployed_before: Option<u32>,
    lines: crate::child::LineSink,
    ev: Events<'_>,
) -> anyhow::Result<Installed> {
    let plan = &planned.plan;
    let mut out = Installed::default();
    let Some(h) = helm else { return Ok(out) };
    // The helm the printed commands name: the bundle's, copied next to the kept files (the
    // copy this load runs goes when it ends), else the one found here.
    let mut shown = h.clone();
    match command_dir(bundle, &o.release) {
        Ok(dir) => {
            if carried {
                shown.path = keep_helm(&h.path, &dir)?;
            }
            let values_file = crate::helm::keep_command_files(plan, &shown, &dir)
                .context("writing the files of the printed helm command")?;
            out.command = Some(plan.command_line(&shown, &values_file, false));
            out.kept_values = Some(values_file);
            out.kept_dir = Some(dir);
        }
        Err(why) => ev(Event::Warning(format!(
            "the helm command is not printed: its files cannot be kept ({why})"
        ))),
    }
    if o.install && !o.dry_run {
        let undo = plan.recovery_line(&shown, deployed_before);
        ev(Event::Recovery(match deployed_before {
            Some(rev) => format!("roll the release back to revision {rev}, the one deployed before: {undo}; then run the same load again"),
            None => format!("the release was being installed: remove what helm left with {undo}; then run the same load again"),
        }));
        tokio::task::block_in_place(|| h.upgrade_install(plan, false, Some(lines))).context("helm upgrade --install failed (the images and chart are in the registry; fix the cause and re-run)")?;
        out.installed = true;
    }
    Ok(out)
}

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
