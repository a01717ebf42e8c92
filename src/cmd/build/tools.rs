//! `build --with-tools`: the programs the site needs to load the bundle (this koord-bundle
//! and the helm that rendered the chart), found and hashed here; carried under
//! `tools/<os>-<arch>/` (`bundle::tools`).

use crate::bundle::manifest::ToolRecord;
use crate::bundle::plan::ToolInput;
use crate::bundle::tools::{file_of, host_platform};
use crate::helm::Helm;
use crate::progress::Progress;
use anyhow::Context as _;
use sha2::Digest as _;
use std::io::Read as _;
use std::path::Path;

/// This koord-bundle and `helm`, for this machine's platform, each hashed. Says so when the
/// bundle's images are for other platforms only (the site's machines then cannot run them).
pub(super) fn collect(
    helm: &Helm,
    platforms: Option<&[String]>,
    progress: &Progress,
) -> anyhow::Result<Vec<ToolInput>> {
    let platform = host_platform();
    if let Some(p) = platforms.filter(|p| !p.iter().any(|p| p.starts_with(&platform))) {
        progress.warn(format!(
            "--with-tools carries koord-bundle and helm for {platform} (this machine), but the images are for {} only: the site's machines may not run them; build on a {} machine to carry tools they run",
            p.join(", "),
            p.join(" or ")
        ));
    }
    let me = std::env::current_exe().context("--with-tools: where is this koord-bundle?")?;
    let tools = vec![
        tool(&me, "koord-bundle", env!("CARGO_PKG_VERSION"), &platform)?,
        tool(&helm.path, "helm", &format!("v{}", helm.version), &platform)?,
    ];
    for t in &tools {
        progress.say(format!(
            "tools    {} {} for {} ({}, {})",
            t.record.name,
            t.record.version,
            t.record.platform,
            t.record.file,
            crate::text::human_bytes(t.record.size)
        ));
    }
    Ok(tools)
}

/// One program: its file hashed (a regular file only, read in pieces).
fn tool(path: &Path, name: &str, version: &str, platform: &str) -> anyhow::Result<ToolInput> {
    let what = || format!("--with-tools: reading {name} at {}", path.display());
    let mut f = crate::bounded::open_input(path).with_context(what)?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf).with_context(what)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        size += n as u64;
    }
    Ok(ToolInput {
        record: ToolRecord {
            name: name.into(),
            version: version.into(),
            platform: platform.into(),
            file: file_of(platform, name),
            sha256: crate::oci::Digest::from_hasher(h),
            size,
        },
        path: path.to_path_buf(),
    })
}
