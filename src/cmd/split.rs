//! `koord-bundle split` and `koord-bundle join`.

use crate::bundle::parts;
use crate::cli::{JoinArgs, SplitArgs};
use anyhow::Context as _;
use std::path::{Path, PathBuf};

/// Split `bundle` into `dir`; returns the part paths.
pub fn split_file(
    bundle: &Path,
    size: &str,
    dir: &Path,
    name: &str,
    key: Option<&minisign::SecretKey>,
) -> anyhow::Result<Vec<PathBuf>> {
    let size = parts::parse_size(size)?;
    Ok(parts::split(bundle, size, dir, name, key)?)
}

/// `split`.
pub fn run_split(args: SplitArgs) -> anyhow::Result<()> {
    let name = args
        .bundle
        .file_name()
        .context("the bundle path has no file name")?
        .to_string_lossy()
        .to_string();
    let dir = match &args.output_dir {
        Some(d) => d.clone(),
        None => args
            .bundle
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from(".")),
    };
    // The parts' header is signed with the given key, else the default one when there is one.
    let key =
        super::signing_key(args.sign_key.as_deref(), args.sign_key.is_some())?.map(|(sk, _)| sk);
    let written = split_file(&args.bundle, &args.size, &dir, &name, key.as_ref())?;
    if args.json {
        return super::print_json(
            &serde_json::json!({"parts": written, "headerSigned": key.is_some()}),
        );
    }
    for p in &written {
        println!(
            "{} ({})",
            p.display(),
            crate::text::human_bytes(std::fs::metadata(p)?.len())
        );
    }
    println!(
        "{} parts; verify, inspect and load take {} directly{}",
        written.len(),
        written[0].display(),
        if key.is_some() {
            "; the parts' header is signed"
        } else {
            ""
        }
    );
    Ok(())
}

/// `join`.
pub fn run_join(args: JoinArgs) -> anyhow::Result<()> {
    let bf = parts::BundleFile::open(&args.first_part)?;
    let header = bf.header.as_ref().with_context(|| {
        format!(
            "{} is not the first part of a split bundle",
            args.first_part.display()
        )
    })?;
    // The header names the parts and the bundle: trust it only once its signature checked.
    if args.insecure_skip_signature {
        eprintln!("warning: --insecure-skip-signature: the parts' header signature is NOT checked");
    } else {
        let pk = super::verify::public_key(args.key.as_deref())?;
        if !bf.verify_header(&pk)? {
            anyhow::bail!(
                "{}: the parts' header is not signed, so the file names and digests in it cannot be trusted: \
                 split it again with a key (koord-bundle split --sign-key), or pass --insecure-skip-signature \
                 (verify and load still check the joined bundle's own signature)",
                args.first_part.display()
            );
        }
    }
    let out = match &args.output {
        Some(o) => o.clone(),
        // Never a path from the header: its plain name, in the current directory.
        None if parts::is_plain_file_name(&header.bundle.file) => {
            PathBuf::from(&header.bundle.file)
        }
        None => anyhow::bail!(
            "{}: the header names the bundle \"{}\", which is not a plain file name: refusing to write there; name the output with -o FILE",
            args.first_part.display(),
            crate::text::printable(&header.bundle.file)
        ),
    };
    let n = parts::join(&args.first_part, &out)?;
    if args.json {
        return super::print_json(
            &serde_json::json!({"bundle": out, "bytes": n, "sha256": header.bundle.sha256}),
        );
    }
    println!(
        "{} ({} bytes, sha256 {}) joined from {} parts",
        out.display(),
        n,
        header.bundle.sha256.hex(),
        header.parts.len()
    );
    Ok(())
}
