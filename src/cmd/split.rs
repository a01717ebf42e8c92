//! `koord-bundle split`, `join` and `repair`.

use super::sets::{set_notes, tell_repairs};
use crate::cli::{JoinArgs, RepairArgs, SplitArgs};
use crate::progress::{Mode, Progress};
use anyhow::{bail, Context as _};
use koord_splitset::BundleFile;
use std::path::{Path, PathBuf};

/// Split `args.bundle` into `dir` as `args` say; returns the part paths.
pub fn split_file(
    args: &SplitArgs,
    dir: &Path,
    name: &str,
    key: Option<&minisign::SecretKey>,
    on_bytes: &(dyn Fn(u64) + Sync),
) -> anyhow::Result<Vec<PathBuf>> {
    let size = koord_splitset::parse_size(&args.size)?;
    let opts = koord_splitset::SplitOptions {
        size,
        parity: args.parity,
        spread: args.spread,
        out_dir: dir,
        name,
        signer: key,
    };
    Ok(koord_splitset::split(&args.bundle, &opts, on_bytes)?)
}

/// `--spread` (of `split`, and of `build --split`) with no parity parts to spread: refused.
pub(crate) fn spread_needs_parity(parity: usize, spread: bool) -> anyhow::Result<()> {
    if spread && parity == 0 {
        bail!("--spread needs --parity N (it spreads the parity parts' code over the whole set)");
    }
    Ok(())
}

/// `split`.
pub fn run_split(args: SplitArgs) -> anyhow::Result<()> {
    let progress = Progress::new(Mode::detect(args.json));
    super::bundle_arg(&args.bundle)?;
    spread_needs_parity(args.parity, args.spread)?;
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
    super::output_dir(&dir, true)?;
    // The parts' header is signed with the given key, else the default one when there is one.
    let key =
        super::signing_key(args.sign_key.as_deref(), args.sign_key.is_some())?.map(|(sk, _)| sk);
    if key.is_none() {
        progress.warn(
            "no signing key (none in the config directory, no --sign-key): the parts' header is NOT signed, \
             so join and repair will refuse the set without --insecure-skip-signature; sign it with \
             --sign-key FILE, or create a key with `koord-bundle keygen` (the bundle's own signature is \
             unchanged and still checked by verify and load)",
        );
    }
    let total = std::fs::metadata(&args.bundle)
        .with_context(|| format!("cannot read {}", args.bundle.display()))?
        .len();
    let bar = progress.bytes("splitting", total);
    let written = split_file(&args, &dir, &name, key.as_ref(), &|n| bar.inc(n))?;
    bar.finish("done");
    if args.json {
        return super::print_json(&serde_json::json!({
            "parts": written, "parityParts": args.parity, "spread": args.spread,
            "headerSigned": key.is_some()
        }));
    }
    for p in &written {
        crate::say!(
            "{} ({})",
            p.display(),
            crate::text::human_bytes(std::fs::metadata(p)?.len())
        );
    }
    crate::say!(
        "{} {}{}{}; verify, inspect, load, serve and join take any of them{}",
        written.len(),
        crate::text::plural(written.len(), "part", "parts"),
        match args.parity {
            0 => String::new(),
            1 => ", the last one parity: any 1 part lost is rebuilt".into(),
            n => format!(", the last {n} parity: any {n} parts lost are rebuilt"),
        },
        if args.spread {
            ", and any damaged blocks up to that many wherever they are (one code over the set)"
        } else {
            ""
        },
        if key.is_some() {
            "; the parts' header is signed"
        } else {
            ""
        }
    );
    Ok(())
}

/// The header names the parts and the bundle: trusted only once its signature checked (or
/// when told not to check). Returns the signature the key verified (v2 sets).
fn trust_header(
    bf: &BundleFile,
    key: Option<&Path>,
    skip: bool,
    progress: &Progress,
) -> anyhow::Result<Option<Vec<u8>>> {
    if skip {
        progress.warn("--insecure-skip-signature: the parts' header signature is NOT checked");
        return Ok(None);
    }
    let pk = super::public_key(key)?;
    let signed = match &bf.set {
        Some(s) => s.good_signature(&pk)?,
        None => bf.verify_header(&pk)?.then(Vec::new),
    };
    if signed.is_none() {
        bail!(
            "{}: the parts' header is not signed, so the file names and digests in it cannot be trusted: \
             split it again with a key (koord-bundle split --sign-key), or pass --insecure-skip-signature \
             (verify and load still check the bundle's own signature)",
            bf.path.display()
        );
    }
    Ok(signed)
}

/// `join`.
pub fn run_join(args: JoinArgs) -> anyhow::Result<()> {
    let progress = Progress::new(Mode::detect(args.json));
    super::bundle_arg(&args.first_part)?;
    if let Some(o) = &args.output {
        super::output_dir_of(Some(o), true)?;
        super::refuse_existing(o, args.force)?;
    }
    let bf = BundleFile::open(&args.first_part)?;
    let whole = bf.whole().cloned().with_context(|| {
        format!(
            "{} is not a part of a split bundle",
            args.first_part.display()
        )
    })?;
    trust_header(
        &bf,
        args.signature.key.as_deref(),
        args.signature.insecure_skip_signature,
        &progress,
    )?;
    let out = match &args.output {
        Some(o) => o.clone(),
        // Never a path from the header: its plain name, in the current directory.
        None if koord_splitset::is_plain_file_name(&whole.file) => PathBuf::from(&whole.file),
        None => anyhow::bail!(
            "{}: the header names the bundle \"{}\", which is not a plain file name: refusing to write there; name the output with -o FILE",
            args.first_part.display(),
            crate::text::printable(&whole.file)
        ),
    };
    super::refuse_existing(&out, args.force)?;
    let n = koord_splitset::join(&bf, &out)?;
    tell_repairs(&progress, &bf);
    let from = joined_from(&bf);
    if args.json {
        return super::print_json(&serde_json::json!({
            "bundle": out, "bytes": n, "sha256": whole.sha256,
            "repaired": bf.set.as_ref().map(|s| s.repairs()).unwrap_or_default(),
            "partsRead": from.read, "partsRebuilt": from.rebuilt,
        }));
    }
    crate::say!(
        "{} ({} bytes, {}) joined from {from}",
        out.display(),
        n,
        whole.sha256
    );
    Ok(())
}

/// What a join read: the parts it took bytes from, and the data parts it rebuilt from parity
/// because they were missing. (It said `joined from 7 parts` of 6 data parts and 1 parity part
/// whose part 3 was missing: the count of the set, not of what was read.)
struct JoinedFrom {
    /// Parts read: the data parts found, and the parity parts found when anything was rebuilt.
    read: usize,
    /// Data parts missing, rebuilt from parity.
    rebuilt: usize,
    /// Blocks rebuilt of the data parts that were there (damaged).
    damaged_blocks: u64,
    /// Parity parts of the set not read (nothing to rebuild).
    parity_unused: usize,
}

fn joined_from(bf: &BundleFile) -> JoinedFrom {
    let Some(s) = &bf.set else {
        // Format v1: data parts only, every one read.
        let read = bf.header.as_ref().map(|h| h.parts.len()).unwrap_or(0);
        return JoinedFrom {
            read,
            rebuilt: 0,
            damaged_blocks: 0,
            parity_unused: 0,
        };
    };
    let (k, parts) = (s.data_parts(), s.part_count());
    let repairs = s.repairs();
    let rebuilt = repairs.iter().filter(|r| r.missing && r.part < k).count();
    let damaged_blocks = repairs
        .iter()
        .filter(|r| !r.missing)
        .map(|r| r.blocks)
        .sum();
    let present = |ps: std::ops::Range<usize>| ps.filter(|&p| s.found(p)).count();
    let data = present(0..k);
    let parity = present(k..parts);
    if repairs.is_empty() {
        JoinedFrom {
            read: data,
            rebuilt: 0,
            damaged_blocks: 0,
            parity_unused: parts - k,
        }
    } else {
        JoinedFrom {
            read: data + parity,
            rebuilt,
            damaged_blocks,
            parity_unused: 0,
        }
    }
}

impl std::fmt::Display for JoinedFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::text::plural;
        let parts = |n: usize| plural(n, "part", "parts");
        if self.parity_unused > 0 {
            return write!(
                f,
                "{} data {} ({} parity {} not needed)",
                self.read,
                parts(self.read),
                self.parity_unused,
                parts(self.parity_unused)
            );
        }
        write!(f, "{} {}", self.read, parts(self.read))?;
        if self.rebuilt > 0 {
            write!(f, " and {} rebuilt from parity", self.rebuilt)?;
        }
        if self.damaged_blocks > 0 {
            write!(
                f,
                ", {} damaged {} rebuilt from parity",
                self.damaged_blocks,
                plural(self.damaged_blocks as usize, "block", "blocks")
            )?;
        }
        Ok(())
    }
}

/// `repair`.
pub fn run_repair(args: RepairArgs) -> anyhow::Result<()> {
    let progress = Progress::new(Mode::detect(args.json));
    super::bundle_arg(&args.part)?;
    let bf = BundleFile::open(&args.part)?;
    let Some(s) = bf.set.clone() else {
        match &bf.header {
            Some(_) => bail!(
                "{}: a set split by an older koord-bundle (format v1: no parity, no block digests) cannot be repaired: copy the damaged part again (koord-bundle verify names it)",
                args.part.display()
            ),
            None => bail!("{} is not a part of a split bundle", args.part.display()),
        }
    };
    let sig = trust_header(
        &bf,
        args.signature.key.as_deref(),
        args.signature.insecure_skip_signature,
        &progress,
    )?;
    for n in set_notes(&bf) {
        progress.say(n);
    }
    let total = s.data_bytes(0..s.part_count());
    let bar = progress.bytes("checking", total);
    let done = koord_splitset::repair(&s, sig.as_deref(), &|n| bar.inc(n))?;
    bar.finish("done");
    if args.json {
        return super::print_json(&serde_json::json!({
            "set": s.path, "damage": done.damage, "rebuiltBlocks": done.rebuilt,
            "written": done.written, "notes": s.notes,
        }));
    }
    for p in &done.damage.parts {
        crate::say!("damaged  {p}");
    }
    for w in &done.written {
        crate::say!("written  {}", w.display());
    }
    if done.written.is_empty() {
        crate::say!("the set {} is whole: nothing to repair", s.path.display());
    } else {
        crate::say!(
            "{} {} written back whole ({} {} rebuilt from parity): the set is whole again",
            done.written.len(),
            crate::text::plural(done.written.len(), "part", "parts"),
            done.rebuilt,
            if done.rebuilt == 1 { "block" } else { "blocks" }
        );
    }
    Ok(())
}
