//! Writing a v2 set (`split`): one pass over the bundle, a group of stripes at a time — the
//! data parts' blocks read from the bundle, digested, coded into the parity parts' blocks, and
//! every part's bytes written in place into its temporary file by a thread of its own while
//! the next group is read and coded — while another thread hashes the bundle in order for the
//! header's whole-bundle sha256. The header goes at the start of
//! every part last, then every part is fsynced and renamed into place.

use super::header;
use super::PartInfo;
use super::{
    io_err, Geometry, PartEntry, SetError, SetHeader, TableInfo, Unit, ALIGN, BLOCK_DIGEST, CODE,
    CODE_SPREAD, DIGEST_LEN, FORMAT, MAX_PARTS,
};
use crate::atomic::AtomicFile;
use crate::oci::Digest;
use crate::parity::{Coder, ParityError, SLICE_BUDGET};
use crate::sign;
use sha2::Digest as _;
use std::io::Read;
use std::path::{Path, PathBuf};

/// How to split.
pub struct SplitOptions<'a> {
    /// Largest part file.
    pub size: u64,
    /// Parity parts.
    pub parity: usize,
    /// The parity parts hold a code over the whole set (as par2 does) rather than one per
    /// stripe.
    pub spread: bool,
    /// Where the parts go.
    pub out_dir: &'a Path,
    /// The bundle's file name (parts are `NAME.partNNN`, parity parts `NAME.parityNNN`).
    pub name: &'a str,
    /// Sign the header with this key.
    pub signer: Option<&'a minisign::SecretKey>,
}

fn trusted_comment(name: &str) -> String {
    format!("koord-bundle split header of {name}")
}

/// The header for `g` (digests as given).
fn header_for(g: &Geometry, bundle: PartInfo, size: u64, name: &str, table: Digest) -> SetHeader {
    SetHeader {
        format: FORMAT.into(),
        bundle,
        part_size: size,
        data_offset: g.data_offset,
        block_size: g.block,
        data_parts: g.k,
        parity_parts: g.n,
        code: if g.spread { CODE_SPREAD } else { CODE }.into(),
        parts: g
            .sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| PartEntry {
                file: super::part_file_name(name, i, g.k),
                size: s,
            })
            .collect(),
        block_digest: BLOCK_DIGEST.into(),
        block_table: TableInfo {
            size: g.total_blocks() * DIGEST_LEN as u64,
            sha256: table,
        },
    }
}

fn to_json(bundle: &Path, h: &SetHeader) -> Result<Vec<u8>, SetError> {
    serde_json::to_vec(h).map_err(|e| SetError::Io {
        path: bundle.to_path_buf(),
        source: std::io::Error::other(e),
    })
}

fn sign_json(
    bundle: &Path,
    json: &[u8],
    name: &str,
    signer: Option<&minisign::SecretKey>,
) -> Result<Vec<u8>, SetError> {
    match signer {
        Some(sk) => Ok(sign::sign(sk, json, &trusted_comment(name))
            .map_err(|source| SetError::Signature {
                path: bundle.to_path_buf(),
                source,
            })?
            .into_bytes()),
        None => Ok(Vec::new()),
    }
}

/// The layout for a bundle of `total` bytes: the header area grows with the part count and
/// the block table, which grow as the area takes room from the parts; repeated until it fits.
fn layout(bundle: &Path, total: u64, opts: &SplitOptions<'_>) -> Result<Geometry, SetError> {
    let size = opts.size;
    let mut h = ALIGN;
    for _ in 0..64 {
        let too_small = SetError::HeaderTooLarge {
            bundle: bundle.to_path_buf(),
            size,
            total,
            header: h,
        };
        // The header may take at most half a part.
        if size < 2 * h {
            return Err(too_small);
        }
        let mut stride = (size - h) / 2 * 2;
        let mut spread_block = None;
        if opts.spread && opts.parity > 0 {
            // Whole blocks in every data part but the last, so a parity part of as many whole
            // blocks fits in a part too.
            let b = Geometry::spread_block_for(total, stride, opts.parity).ok_or_else(|| {
                SetError::TooManyParts {
                    bundle: bundle.to_path_buf(),
                    parts: total.div_ceil(stride) as usize + opts.parity,
                    size,
                    what: "--spread codes at most 65536 blocks (data and parity) of at most 64 MiB, none larger than a part".into(),
                }
            })?;
            stride = stride / b * b;
            spread_block = Some(b);
        }
        let k = total.div_ceil(stride).max(1);
        let parts = k.saturating_add(opts.parity as u64);
        if parts > MAX_PARTS as u64 {
            return Err(SetError::TooManyParts {
                bundle: bundle.to_path_buf(),
                parts: parts as usize,
                size,
                what: format!("a set has at most {MAX_PARTS} parts"),
            });
        }
        if opts.parity > 0 && spread_block.is_none() {
            Coder::new(k as usize, opts.parity).map_err(|source| SetError::Parity {
                path: bundle.to_path_buf(),
                source,
            })?;
        }
        let g = match spread_block {
            Some(b) => Geometry::new_spread(total, stride, opts.parity, b, h),
            None => {
                let block = Geometry::block_for(stride.min(total), parts as usize);
                Geometry::new(total, stride, opts.parity, block, h)
            }
        };
        let zero = Digest::of(b"");
        let info = PartInfo {
            file: opts.name.to_string(),
            size: total,
            sha256: zero.clone(),
        };
        let json = to_json(bundle, &header_for(&g, info, size, opts.name, zero))?;
        let sig = sign_json(bundle, &json, opts.name, opts.signer)?;
        let table = g.total_blocks() * DIGEST_LEN as u64;
        let line = header::part_line(g.parts() - 1, g.parts(), &header::set_id(&json));
        let need = (header::MAGIC.len() + 1 + line.len()) as u64
            + format!("{}\n\n{}\n\n{}\n", json.len(), sig.len(), table).len() as u64
            + json.len() as u64
            + sig.len() as u64
            + table;
        let need = need.next_multiple_of(ALIGN);
        if need <= h {
            return Ok(g);
        }
        h = need;
    }
    Err(SetError::HeaderTooLarge {
        bundle: bundle.to_path_buf(),
        size,
        total,
        header: h,
    })
}

/// Split `bundle` into a v2 set in `opts.out_dir`; stale parts of an earlier split of the same
/// name there are removed. Returns the parts written, data parts first.
pub fn split(
    bundle: &Path,
    opts: &SplitOptions<'_>,
    on_bytes: &(dyn Fn(u64) + Sync),
) -> Result<Vec<PathBuf>, SetError> {
    let src = crate::bounded::open_input(bundle).map_err(io_err(bundle))?;
    split_open(&src, bundle, opts, on_bytes)
}

/// [`split`] of the bundle open as `src` (at `bundle`, named in messages): read through this
/// descriptor only, never opened again by its path (`build --split` splits its own temporary
/// file, which it holds open).
pub fn split_open(
    src: &std::fs::File,
    bundle: &Path,
    opts: &SplitOptions<'_>,
    on_bytes: &(dyn Fn(u64) + Sync),
) -> Result<Vec<PathBuf>, SetError> {
    if !super::is_plain_file_name(opts.name) {
        return Err(SetError::BadName {
            bundle: bundle.to_path_buf(),
        });
    }
    let total = src.metadata().map_err(io_err(bundle))?.len();
    let g = layout(bundle, total, opts)?;
    std::fs::create_dir_all(opts.out_dir).map_err(io_err(opts.out_dir))?;
    let mut tmps = Vec::with_capacity(g.parts());
    for i in 0..g.parts() {
        let dest = opts.out_dir.join(super::part_file_name(opts.name, i, g.k));
        let tmp = AtomicFile::create(&dest).map_err(io_err(&dest))?;
        crate::fsio::reserve(tmp.file(), g.file_len(i)).map_err(io_err(&dest))?;
        tmps.push((tmp, dest));
    }
    // The whole bundle's sha256, in order, on a thread of its own (told to stop on a failure),
    // through the same open file (positional reads).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let whole = {
        let f = src.try_clone().map_err(io_err(bundle))?;
        let stop = stop.clone();
        std::thread::spawn(move || -> std::io::Result<Digest> {
            let mut f = crate::fsio::Positioned::new(&f, 0);
            let mut h = sha2::Sha256::new();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    return Err(std::io::Error::other("stopped"));
                }
                match f.read(&mut buf) {
                    Ok(0) => return Ok(Digest::from_hasher(h)),
                    Ok(n) => h.update(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        })
    };
    let table = write_stripes(bundle, src, &g, &tmps, on_bytes)
        .and_then(|mut table| {
            if g.spread {
                encode_spread(bundle, src, &g, &tmps, &mut table)?;
            }
            Ok(table)
        })
        .inspect_err(|_| {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        })?;
    let whole = whole
        .join()
        .map_err(|_| SetError::Io {
            path: bundle.to_path_buf(),
            source: std::io::Error::other("the hashing thread panicked"),
        })?
        .map_err(io_err(bundle))?;
    let info = PartInfo {
        file: opts.name.to_string(),
        size: total,
        sha256: whole,
    };
    let json = to_json(
        bundle,
        &header_for(&g, info, opts.size, opts.name, Digest::of(&table)),
    )?;
    let sig = sign_json(bundle, &json, opts.name, opts.signer)?;
    // Every part complete (its header written, fsynced) before any is renamed into place.
    for (i, (tmp, dest)) in tmps.iter().enumerate() {
        let mut head = header::area(&json, &sig, &table, i, g.parts());
        if head.len() as u64 > g.data_offset {
            return Err(SetError::HeaderTooLarge {
                bundle: bundle.to_path_buf(),
                size: opts.size,
                total,
                header: head.len() as u64,
            });
        }
        head.resize(g.data_offset as usize, 0);
        crate::fsio::write_at(tmp.file(), &head, 0).map_err(io_err(dest))?;
        tmp.file().sync_all().map_err(io_err(dest))?;
    }
    // An earlier split of the same bundle in the folder stays whole until the new set is: its
    // parts are kept under hidden names while the new ones are renamed over them (a reader
    // finds a part of its set under any name in the folder), and let go only at the end. A
    // split killed among its renames left neither set joinable.
    let kept = keep_earlier(opts.out_dir, opts.name);
    let mut written = Vec::with_capacity(tmps.len());
    for (tmp, dest) in tmps {
        tmp.commit().map_err(io_err(&dest))?;
        written.push(dest);
    }
    remove_stale(opts.out_dir, opts.name, g.k, g.n)?;
    for k in kept {
        let _ = std::fs::remove_file(k);
    }
    Ok(written)
}

/// Hard links `.FILE.prev` to every part `FILE` of an earlier set of `name` in `dir`; the
/// links made. Best effort: a file system without hard links (FAT32) keeps nothing.
fn keep_earlier(dir: &Path, name: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut kept = Vec::new();
    for e in entries.flatten() {
        let f = e.file_name().to_string_lossy().to_string();
        let is_part = e.file_type().is_ok_and(|t| t.is_file())
            && f.strip_prefix(name)
                .and_then(|r| r.strip_prefix(".part").or(r.strip_prefix(".parity")))
                .is_some_and(|n| n.len() >= 3 && n.bytes().all(|b| b.is_ascii_digit()));
        if !is_part {
            continue;
        }
        let link = dir.join(format!(".{f}.prev"));
        let _ = std::fs::remove_file(&link);
        if std::fs::hard_link(e.path(), &link).is_ok() {
            kept.push(link);
        }
    }
    kept
}

/// Every stripe, a group at a time: data blocks from the bundle, parity blocks coded from them,
/// both written into the parts and digested into the block table (returned). Each group is
/// coded and digested in two halves (stripes `j0..mid` and `mid..j1`) on two threads, each
/// with a coder of half the slice budget, while a thread of its own writes the group before
/// (two sets of group buffers of a quarter of the budget each; one set when a single stripe
/// takes more than half the budget).
fn write_stripes(
    bundle: &Path,
    src: &std::fs::File,
    g: &Geometry,
    tmps: &[(AtomicFile, PathBuf)],
    on_bytes: &(dyn Fn(u64) + Sync),
) -> Result<Vec<u8>, SetError> {
    // A set-wide code is coded after this pass ([`encode_spread`]): here, the data parts only.
    let (k, n) = (g.k, if g.spread { 0 } else { g.n });
    let count = k + n;
    let plan = g.groups(count, 4);
    let per = plan.per;
    let mut table = vec![0u8; g.total_blocks() as usize * DIGEST_LEN];
    let perr = |source| SetError::Parity {
        path: bundle.to_path_buf(),
        source,
    };
    let mut coders = match n {
        0 => None,
        _ => Some([
            Coder::with_budget(k, n, SLICE_BUDGET / 2).map_err(perr)?,
            Coder::with_budget(k, n, SLICE_BUDGET / 2).map_err(perr)?,
        ]),
    };
    let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<(Unit, Vec<Vec<u8>>)>(1);
    let (empty_tx, empty_rx) = std::sync::mpsc::channel::<Vec<Vec<u8>>>();
    for _ in 0..plan.sets {
        let _ = empty_tx.send(plan.buffers(g));
    }
    std::thread::scope(|s| {
        let writer = s.spawn(move || -> Result<(), SetError> {
            for (u, bufs) in full_rx {
                let Unit { j0, j1, q0, q1 } = u;
                for (q, (tmp, dest)) in tmps.iter().enumerate().take(q1).skip(q0) {
                    let from = (j0 * g.block).min(g.sizes[q]);
                    let len = ((j1 * g.block).min(g.sizes[q]) - from) as usize;
                    let bytes = &bufs[q - q0][..len];
                    crate::fsio::write_at(tmp.file(), bytes, g.data_offset + from)
                        .map_err(io_err(dest))?;
                    crate::fsio::start_writeback(tmp.file(), g.data_offset + from, len as u64);
                }
                // Refused only once the coder has ended: the groups it sent are still written
                // (after a failure, into files that are then dropped).
                let _ = empty_tx.send(bufs);
            }
            Ok(())
        });
        // Called once: the channel ends it holds are dropped when it returns, which lets the
        // writer finish (or stop).
        let work = || -> Result<(), SetError> {
            let (full_tx, empty_rx) = (full_tx, empty_rx);
            for u in plan.units(g, count) {
                let Unit { j0, j1, q0, q1 } = u;
                // The writer failed: its error is the one to report.
                let Ok(mut bufs) = empty_rx.recv() else {
                    return Ok(());
                };
                // The next group is read from the disk while this one is coded.
                for i in q0..q1.min(k) {
                    let from = (j1 * g.block).min(g.sizes[i]);
                    let to = ((j1 + per) * g.block).min(g.sizes[i]);
                    crate::fsio::will_need(src, i as u64 * g.stride() + from, to - from);
                }
                for i in q0..q1.min(k) {
                    let buf = &mut bufs[i - q0];
                    let from = (j0 * g.block).min(g.sizes[i]);
                    let len = ((j1 * g.block).min(g.sizes[i]) - from) as usize;
                    crate::fsio::read_at(src, &mut buf[..len], i as u64 * g.stride() + from)
                        .map_err(io_err(bundle))?;
                    buf[len..].fill(0);
                }
                let digests = code_group(g, u, &mut bufs[..q1 - q0], coders.as_mut()).map_err(
                    |e| match e {
                        Some(source) => perr(source),
                        None => SetError::Io {
                            path: bundle.to_path_buf(),
                            source: std::io::Error::other("a coding thread panicked"),
                        },
                    },
                )?;
                for (i, d) in digests {
                    table[i * DIGEST_LEN..(i + 1) * DIGEST_LEN].copy_from_slice(&d);
                }
                if full_tx.send((u, bufs)).is_err() {
                    return Ok(());
                }
                on_bytes(
                    (q0..q1.min(k))
                        .map(|i| (j1 * g.block).min(g.sizes[i]) - (j0 * g.block).min(g.sizes[i]))
                        .sum(),
                );
            }
            Ok(())
        };
        let coded = work();
        let written = writer.join().map_err(|_| SetError::Io {
            path: bundle.to_path_buf(),
            source: std::io::Error::other("the writing thread panicked"),
        })?;
        written.and(coded)
    })?;
    Ok(table)
}

/// The parity parts of a set-wide code ([`super::spread`]): coded from the bundle's blocks
/// (the data parts are written by then), written into the parity parts' files, then read back
/// and digested into `table`. Read back because each block is written a column slice at a time
/// by two threads in no fixed order, so no hasher sees its bytes in order; the parity parts
/// are then still in the page cache (2 GiB set: about 410 MiB read back, in a split of about 5 s).
fn encode_spread(
    bundle: &Path,
    src: &std::fs::File,
    g: &Geometry,
    tmps: &[(AtomicFile, PathBuf)],
    table: &mut [u8],
) -> Result<(), SetError> {
    let read = |i: usize, at: u64, buf: &mut [u8]| -> std::io::Result<()> {
        let (p, b) = g.shard_block(i);
        let start = p as u64 * g.stride() + b * g.block;
        super::spread::read_padded(src, start, g.block_len(p, b), at, buf)
    };
    let write = |i: usize, at: u64, bytes: &[u8]| -> Result<(), SetError> {
        let (p, b) = g.shard_block(i);
        let (tmp, dest) = &tmps[p];
        crate::fsio::write_at(tmp.file(), bytes, g.data_offset + b * g.block + at)
            .map_err(io_err(dest))
    };
    super::spread::encode(bundle, g, &read, &write)?;
    let mut buf = vec![0u8; g.block as usize];
    for (p, (tmp, dest)) in tmps.iter().enumerate().skip(g.k) {
        for b in 0..g.blocks(p) {
            let bytes = &mut buf[..g.block_len(p, b) as usize];
            crate::fsio::read_at(tmp.file(), bytes, g.data_offset + b * g.block)
                .map_err(io_err(dest))?;
            let i = g.table_index(p, b);
            table[i * DIGEST_LEN..(i + 1) * DIGEST_LEN]
                .copy_from_slice(&super::block_digest(bytes));
        }
    }
    Ok(())
}

/// Block digests: (index in the block table, digest).
type Digests = Vec<(usize, [u8; DIGEST_LEN])>;

/// Code the parity blocks of the group `u` (read into `bufs`, part `q0 + i` at `i`) and digest
/// every block of it, in two halves on two threads. `Err(None)`: a thread panicked.
fn code_group(
    g: &Geometry,
    u: Unit,
    bufs: &mut [Vec<u8>],
    coders: Option<&mut [Coder; 2]>,
) -> Result<Digests, Option<ParityError>> {
    let Unit { j0, j1, q0, .. } = u;
    // The parts coded here (the data parts only, for a set-wide code; all of them, q0 = 0, for
    // a code per stripe).
    let parts = bufs.len();
    let k = g.k.min(q0 + parts) - q0;
    let mid = j0 + (j1 - j0).div_ceil(2);
    let cut = ((mid - j0) * g.block) as usize;
    let run = ((j1 - 1 - j0) * g.block + g.shard_len(j1 - 1)) as usize;
    let (data, parity) = bufs.split_at_mut(k);
    let data: &[Vec<u8>] = data;
    let (mut lo, mut hi): (Vec<&mut [u8]>, Vec<&mut [u8]>) = parity
        .iter_mut()
        .map(|b| {
            let (l, h) = b[..run].split_at_mut(cut.min(run));
            (l, h)
        })
        .unzip();
    let (c_lo, c_hi) = match coders {
        Some([a, b]) => (Some(a), Some(b)),
        None => (None, None),
    };
    let half = |coder: Option<&mut Coder>,
                outs: &mut [&mut [u8]],
                a: u64,
                b: u64,
                from: usize|
     -> Result<Digests, ParityError> {
        let to = from + outs.first().map_or(0, |o| o.len());
        if let (Some(c), true) = (coder, a < b) {
            let originals: Vec<&[u8]> = data.iter().map(|d| &d[from..to]).collect();
            c.encode(&originals, outs)?;
        }
        let mut out = Vec::new();
        for i in 0..parts {
            let q = q0 + i;
            for blk in a..b.min(g.blocks(q)) {
                let at = ((blk - j0) * g.block) as usize;
                let len = g.block_len(q, blk) as usize;
                let bytes = if i < k {
                    &data[i][at..at + len]
                } else {
                    &outs[i - k][at - from..at - from + len]
                };
                out.push((g.table_index(q, blk), super::block_digest(bytes)));
            }
        }
        Ok(out)
    };
    std::thread::scope(|s| {
        let other = s.spawn(|| half(c_hi, &mut hi, mid, j1, cut));
        let mut mine = half(c_lo, &mut lo, j0, mid, 0).map_err(Some)?;
        let theirs = other.join().map_err(|_| None)?.map_err(Some)?;
        mine.extend(theirs);
        Ok(mine)
    })
}

/// Parts left by an earlier split of `name` in `dir` that are not parts of the new set of `k`
/// data and `n` parity parts: `NAME.partNNN` numbered `k` or more (data parts beyond, and
/// parity parts named before they had names of their own), `NAME.parityNNN` numbered `n` or more.
fn remove_stale(dir: &Path, name: &str, k: usize, n: usize) -> Result<(), SetError> {
    let number = |n: &str, prefix: &str| {
        n.strip_prefix(prefix)
            .filter(|s| s.len() >= 3 && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse::<usize>().ok())
    };
    let (data, parity) = (format!("{name}.part"), format!("{name}.parity"));
    for e in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let e = e.map_err(io_err(dir))?;
        let f = e.file_name().to_string_lossy().to_string();
        if number(&f, &data).is_some_and(|i| i >= k) || number(&f, &parity).is_some_and(|j| j >= n)
        {
            std::fs::remove_file(e.path()).map_err(io_err(&e.path()))?;
        }
    }
    Ok(())
}
