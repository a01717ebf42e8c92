//! Writing a bundle from its [`Plan`] and [`Layout`]: the checksum file and its signature, the
//! tar laid out and measured against the disk before the first byte, every blob copied once into
//! its place by the one walk (from the registries, earlier bundles, the opt-in blob cache, or
//! the chart itself), then the file renamed into place, gzipped, or split into parts.
//!
//! The bundle is written in `.NAME.partial` next to it ([`PartialFile`]): a build that stops
//! before its end (an error, Ctrl-C, SIGKILL) leaves it, and the same build run again keeps
//! every blob it finished (re-hashed) and fetches only the rest.

use super::layout::Layout;
use super::pack::{self, Compression, PackError, PackStats};
use super::plan::Plan;
use super::reuse::Donors;
use super::writer::{check_room, BundleWriter, Entries, Resumed, TarLayout};
use crate::copy::{self, Item, WalkError};
use crate::store::{BlobCache, OnBytes, Source};
use koord_splitset::{AtomicFile, PartialFile};
use koord_splitset::{SetError, SplitOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;

/// Why a bundle could not be written.
#[derive(Debug, thiserror::Error)]
pub enum EmitError {
    /// Laying out, checksumming, signing or writing the tar.
    #[error("{0}")]
    Pack(#[from] PackError),
    /// The copy of a blob into the bundle.
    #[error("{0}")]
    Walk(#[from] WalkError),
    /// Splitting the bundle into parts.
    #[error("{0}")]
    Set(#[from] SetError),
    /// The blob cache.
    #[error("{0}")]
    Cache(#[from] crate::store::cache::CacheError),
    /// A program carried for the site (`--with-tools`) could not be read or changed.
    #[error("{path} (--with-tools): {source}")]
    Tool {
        /// The program's file on this machine.
        path: PathBuf,
        /// Why.
        source: Box<crate::store::StoreError>,
    },
}

impl crate::exit::Classify for EmitError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        // Each wraps the error that happened (the pack, the walk, the split, the cache, the
        // tool's store): it decides.
        None
    }
}

/// Where and how the bundle is written.
pub struct Output<'a> {
    /// The bundle's path (with `split`: the name its parts are named after).
    pub path: &'a Path,
    /// The directory of the parts (with `split`).
    pub dir: &'a Path,
    /// Largest part and parity parts, for a split set.
    pub split: Option<(u64, usize, bool)>,
    /// Whole-file compression.
    pub compress: Compression,
    /// The key that signs the checksum file (and a split set's header).
    pub signer: Option<&'a minisign::SecretKey>,
    /// The blob cache (`--cache DIR`): blobs it holds are copied from it, those it lacks are
    /// added to it.
    pub cache: Option<&'a BlobCache>,
    /// Blobs earlier bundles hold (the index of the build host, `--since`, `--reuse`).
    pub donors: Option<&'a Donors>,
    /// Blob transfers at once.
    pub jobs: usize,
}

/// Where the blobs' bytes came from.
#[derive(Debug, Default, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Fetched {
    /// Blobs copied whole from earlier bundles or the blob cache.
    pub cached_blobs: usize,
    /// Bytes copied from earlier bundles or the blob cache (whole blobs, and with `--cache`
    /// resumed prefixes).
    pub cached_bytes: u64,
    /// Blobs kept from the `.partial` an earlier, stopped run of the same build left
    /// (manifests included).
    pub resumed_blobs: usize,
    /// Their bytes.
    pub resumed_bytes: u64,
    /// Bytes downloaded.
    pub downloaded_bytes: u64,
}

/// What was written.
#[derive(Debug)]
pub struct Written {
    /// The bundle's path.
    pub path: PathBuf,
    /// Its size and entries.
    pub stats: PackStats,
    /// Its parts, when split.
    pub parts: Vec<PathBuf>,
    /// Where its blobs came from.
    pub fetched: Fetched,
    /// Its blobs' places, for the index of earlier bundles (`None`: gzip or split, not a
    /// source of blobs).
    pub regions: Option<Vec<(crate::oci::Digest, u64, u64)>>,
    /// What to say: blobs of earlier bundles refused.
    pub notes: Vec<String>,
    /// Earlier bundles to forget (a blob of theirs did not match).
    pub refused: Vec<PathBuf>,
}

/// The trusted comment of the signature: `koord-bundle <chart> <version> created <time>`.
pub fn trusted_comment(layout: &Layout) -> String {
    let m = &layout.manifest;
    format!(
        "koord-bundle {} {} created {}",
        m.chart.name, m.chart.version, m.created
    )
}

/// The bundle laid out as a tar (checksums and signature first), before anything is written:
/// every size checked.
pub fn tar_layout(plan: &Plan, layout: &Layout, out: &Output<'_>) -> Result<TarLayout, PackError> {
    let trusted = trusted_comment(layout);
    let tools = layout.tool_entries();
    let (checksums, signature) = pack::checksum_and_sign(
        &layout.files,
        &layout.blobs,
        &tools,
        out.signer.map(|sk| (sk, trusted.as_str())),
    )?;
    TarLayout::new(
        out.path,
        &Entries {
            files: &layout.files,
            blobs: &layout.blobs,
            tools: &tools,
            mtime: plan.input.created,
            checksums: &checksums,
            signature: signature.as_deref(),
        },
    )
}

/// Bytes the output's file system must take for a bundle of `len` bytes: the bundle, and once
/// more for what is made of it before it goes (its parts with a split, its gzip copy), and
/// the parity parts of a split (each at most a part, and about as large as the data of one
/// data part: at most the bundle).
pub fn room_needed(out: &Output<'_>, len: u64) -> u64 {
    match out.split {
        Some((size, parity, _)) => len
            .saturating_mul(2)
            .saturating_add((parity as u64).saturating_mul(size.min(len.saturating_add(1 << 20)))),
        None if out.compress == Compression::Gzip => len.saturating_mul(2),
        None => len,
    }
}

/// Bytes the blob cache will take on the output's file system: the blobs it lacks, when it
/// is on that file system (else 0).
pub fn cache_room(plan: &Plan, out: &Output<'_>) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    let Some(cache) = out.cache else {
        return 0;
    };
    let dir = out
        .path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
    if dev(cache.root()).is_none() || dev(cache.root()) != dev(dir) {
        return 0;
    }
    plan.download
        .blobs
        .iter()
        .filter(|(d, s)| !cache.has(d, **s))
        .fold(0u64, |a, (_, s)| a.saturating_add(*s))
}

/// `; its largest blob is D of image I, N bytes`, for the room check's messages.
pub fn largest(plan: &Plan) -> String {
    match &plan.download.largest {
        Some((d, size, image)) => format!(
            "; its largest blob is {d} of image {image}, {size} bytes ({})",
            crate::text::human_bytes(*size)
        ),
        None => String::new(),
    }
}

/// Is there room for the bundle (and what the cache adds on the same file system)?
pub fn check_disk(plan: &Plan, out: &Output<'_>, len: u64) -> Result<(), PackError> {
    let cached = cache_room(plan, out);
    let mut why = largest(plan);
    if cached > 0 {
        why.push_str(&format!(
            "; with {} for the blob cache on the same file system",
            crate::text::human_bytes(cached)
        ));
    }
    // What an earlier, stopped run of the same build left is already taken: a resume needs
    // only the rest.
    let held = koord_splitset::partial_path(out.path)
        .and_then(std::fs::metadata)
        .map(|m| m.len().min(len))
        .unwrap_or(0);
    check_room(
        out.path,
        room_needed(out, len)
            .saturating_add(cached)
            .saturating_sub(held),
        &why,
    )
}

/// Write the bundle: laid out and measured first, then every blob copied into its place from
/// `store` (the images' registries) or the chart itself, then committed (renamed, gzipped, or
/// split). `on_bytes` is told of blob bytes as they are written.
pub async fn write<S: Source>(
    plan: &Plan,
    layout: &Layout,
    store: &S,
    out: &Output<'_>,
    on_bytes: OnBytes,
) -> Result<Written, EmitError> {
    let tar = tar_layout(plan, layout, out)?;
    check_disk(plan, out, tar.len())?;
    let werr = |source: std::io::Error| PackError::Write {
        path: out.path.to_path_buf(),
        source,
    };
    let mut file = PartialFile::open(out.path).map_err(werr)?;
    let mut said = Vec::new();
    if let Some(what) = file.replaced() {
        said.push(format!(
            "{} was not a regular file ({what}): removed (not what it pointed to), and the bundle written to a new file",
            file.path().display()
        ));
    }
    if file.found() > 0 {
        if let Some(why) = super::writer::made_for(file.file(), file.found(), &tar).map_err(werr)? {
            said.push(format!(
                "{}, left by an earlier run, is not resumed from: {why}; building from the start",
                file.path().display()
            ));
            file.discard().map_err(werr)?;
        }
    }
    let regions = tar.region_list();
    let kept = resume(&file, &regions).await.map_err(werr)?;
    // Counted: the images' and the chart's blobs (not the tools).
    let tool = |d: &crate::oci::Digest| layout.tools.iter().any(|t| &t.record.sha256 == d);
    let kept_blobs: Vec<_> = regions
        .iter()
        .filter(|(d, _, _)| kept.kept.contains(d) && !tool(d))
        .collect();
    let resumed = kept_blobs
        .iter()
        .fold(0u64, |a, (_, _, s)| a.saturating_add(*s));
    let resumed_blobs = kept_blobs.len() as u64;
    let writer = BundleWriter::create(file.file(), out.path, tar, kept, out.cache, out.donors)?;
    writer.counts.resumed.fetch_add(resumed, Relaxed);
    writer.counts.resumed_blobs.store(resumed_blobs, Relaxed);
    let graphs = plan.graphs();
    let items: Vec<Item> = graphs
        .iter()
        .map(|g| Item {
            graph: g,
            repo: g.repo.clone(),
            reference: g.reference.clone(),
        })
        .collect();
    let on_site = plan.on_site();
    let on_tool_bytes = on_bytes.clone();
    copy::transfer(
        store,
        &writer,
        &items,
        &copy::Options {
            jobs: out.jobs,
            omitted: &on_site,
            omitted_policy: copy::Omitted::Skip,
            dry_run: false,
            on_bytes,
        },
    )
    .await?;
    // The tools are neither downloaded nor image content: the counts every summary prints
    // stay those of the images and the chart.
    let counted = [
        &writer.counts.received,
        &writer.counts.from_cache,
        &writer.counts.cached_blobs,
        &writer.counts.resumed,
        &writer.counts.resumed_blobs,
    ]
    .map(|c| c.load(Relaxed));
    put_tools(&writer, layout, &on_tool_bytes).await?;
    for (c, n) in [
        &writer.counts.received,
        &writer.counts.from_cache,
        &writer.counts.cached_blobs,
        &writer.counts.resumed,
        &writer.counts.resumed_blobs,
    ]
    .into_iter()
    .zip(counted)
    {
        c.store(n, Relaxed);
    }
    let fetched = Fetched {
        downloaded_bytes: writer.counts.received.load(Relaxed),
        cached_bytes: writer.counts.from_cache.load(Relaxed),
        cached_blobs: writer.counts.cached_blobs.load(Relaxed) as usize,
        resumed_bytes: writer.counts.resumed.load(Relaxed),
        resumed_blobs: writer.counts.resumed_blobs.load(Relaxed) as usize,
    };
    let (notes, refused) = writer.notes();
    let notes = said.into_iter().chain(notes).collect();
    let stats = tokio::task::block_in_place(|| writer.finish())?;
    let plain = out.split.is_none() && out.compress == Compression::None;
    let (stats, parts) = commit(file, stats, out)?;
    Ok(Written {
        path: out.path.to_path_buf(),
        stats,
        parts,
        fetched,
        regions: plain.then_some(regions),
        notes,
        refused,
    })
}

/// The programs carried for the site into their places, each read from its file and hashed
/// as it is written (a file that changed since the plan hashed it fails the build).
async fn put_tools(
    writer: &BundleWriter<'_>,
    layout: &Layout,
    on_bytes: &OnBytes,
) -> Result<(), EmitError> {
    use crate::store::Sink as _;
    for t in &layout.tools {
        let err = |source| EmitError::Tool {
            path: t.path.clone(),
            source: Box::new(source),
        };
        let desc = crate::oci::Descriptor {
            media_type: "application/octet-stream".into(),
            digest: t.record.sha256.clone(),
            size: t.record.size,
            platform: None,
            annotations: None,
        };
        let opener = crate::store::file::FileOpener::open(&t.path).map_err(|e| {
            err(crate::store::StoreError::other(
                t.path.display().to_string(),
                e,
            ))
        })?;
        let state = writer
            .blob_state(super::tools::TOOLS_DIR, &desc)
            .await
            .map_err(err)?;
        if state == crate::store::Have::Complete {
            continue;
        }
        let from = match state {
            crate::store::Have::Partial(n) => n,
            _ => 0,
        };
        writer
            .put_blob(super::tools::TOOLS_DIR, &desc, from, &opener, on_bytes)
            .await
            .map_err(err)?;
    }
    Ok(())
}

/// What an earlier, stopped run of this build left in `file`: every region of the new layout
/// it holds, re-hashed, and the blobs it cut off mid-way (on the blocking pool).
async fn resume(
    file: &PartialFile,
    regions: &[(crate::oci::Digest, u64, u64)],
) -> std::io::Result<Resumed> {
    if file.found() == 0 {
        return Ok(Default::default());
    }
    let (f, found, regions) = (file.file().try_clone()?, file.found(), regions.to_vec());
    tokio::task::spawn_blocking(move || super::writer::resumed_regions(&f, found, &regions))
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?
}

/// The written temporary file into place: renamed, or gzipped, or split into parts (the whole
/// file then goes when dropped).
fn commit(
    file: PartialFile,
    written: PackStats,
    out: &Output<'_>,
) -> Result<(PackStats, Vec<PathBuf>), EmitError> {
    let werr = |source: std::io::Error| PackError::Write {
        path: out.path.to_path_buf(),
        source,
    };
    match (out.split, out.compress) {
        (None, Compression::None) => {
            file.commit().map_err(werr)?;
            Ok((written, vec![]))
        }
        (None, Compression::Gzip) => {
            let gz = AtomicFile::create(out.path).map_err(werr)?;
            let bytes = tokio::task::block_in_place(|| pack::gzip(file.file(), &gz, out.path))?;
            gz.commit().map_err(werr)?;
            file.remove().map_err(werr)?;
            Ok((PackStats { bytes, ..written }, vec![]))
        }
        (Some((size, parity, spread)), _) => {
            let name = out
                .path
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .ok_or_else(|| {
                    werr(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        "the output path has no file name",
                    ))
                })?;
            let opts = SplitOptions {
                size,
                parity,
                spread,
                out_dir: out.dir,
                name: &name,
                signer: out.signer,
            };
            let parts = tokio::task::block_in_place(|| {
                koord_splitset::split_open(file.file(), file.path(), &opts, &|_| {})
            })?;
            file.remove().map_err(werr)?;
            Ok((written, parts))
        }
    }
}
