//! The set-wide code of `split --spread` ([`super::CODE_SPREAD`]): every block of the set is one
//! shard of a single Reed–Solomon code, its index its place in the block table — the data
//! parts' blocks the `K` originals (a block shorter than `B` padded with zeros), the parity
//! parts' blocks the `R` recovery shards. Any `R` damaged or missing blocks are rebuilt,
//! wherever they are, as par2 does; a code per stripe rebuilds at most `n` blocks of each
//! stripe, which is faster (see [`super`]) but weaker when damage falls in the same place of
//! more parts than there are parity parts.
//!
//! The code is applied in column slices: slice `c` is bytes `c..c + s` of every shard, read
//! with `pread` from where each block is, coded, and written where each block goes. Memory is
//! `(K + R) × s` plus the coder's work space, within [`WIDE_BUDGET`], whatever the set's size;
//! the price is that every slice reads a little of every block (the whole set once in all,
//! from the page cache when it fits there; a set larger than the memory is read `B / s` times
//! from the disk).
//!
//! Two threads take the slices in turn, each with a coder of half the budget.

use super::{Geometry, Set, SetError};
use crate::parity::{Coder, ParityError};
use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Memory of the column slices of a set-wide code (both threads).
pub(crate) const WIDE_BUDGET: usize = 64 << 20;

/// Bytes of every shard coded at once within `budget`: a multiple of 64 (the slices tile the
/// block, the last one shorter), at least 64. The memory per byte of slice: the `K + R`
/// shards, the lost originals restored (at most `R`), and the larger of the coders' work spaces
/// (reed-solomon-simd 3: the high-rate encoder `K` rounded up to a multiple of `R`'s power of
/// two, the decoder `R`'s power of two plus `K`, rounded up to a power of two).
fn slice_for(g: &Geometry, budget: usize) -> usize {
    let (kk, rr) = (g.originals(), g.recovery());
    let chunk = rr.next_power_of_two();
    let work = kk
        .next_multiple_of(chunk)
        .max((chunk + kk).next_power_of_two());
    let w = budget / (kk + 2 * rr + work) / 64 * 64;
    (w as u64).clamp(64, g.block) as usize
}

/// Where shard bytes are read from: `read(shard, at, buf)` fills `buf` with bytes
/// `at..at + buf.len()` of the shard (zeros beyond its block's end).
pub(crate) type ReadShard<'a> = dyn Fn(usize, u64, &mut [u8]) -> std::io::Result<()> + Sync + 'a;
/// Where rebuilt or coded shard bytes go: `write(shard, at, bytes)`.
pub(crate) type WriteShard<'a> = dyn Fn(usize, u64, &[u8]) -> Result<(), SetError> + Sync + 'a;

/// The work on one column slice: `(coder, scratch, c, w)`, the slice of bytes `c..c + w` of
/// every shard; the scratch space is the thread's own, kept from one slice to the next (its
/// pages touched once).
type SliceWork<'a> =
    dyn Fn(&mut Coder, &mut Vec<u8>, u64, usize) -> Result<(), SetError> + Sync + 'a;

fn parity_err(path: &Path, source: ParityError) -> SetError {
    SetError::Parity {
        path: path.to_path_buf(),
        source,
    }
}

/// Run `work` for every column slice of the block size, on two threads.
fn slices(path: &Path, g: &Geometry, work: &SliceWork<'_>) -> Result<(), SetError> {
    let s = slice_for(g, WIDE_BUDGET / 2);
    let count = g.block.div_ceil(s as u64) as usize;
    let next = AtomicUsize::new(0);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let run = || -> Result<(), SetError> {
        let mut coder = Coder::with_budget(g.originals(), g.recovery(), WIDE_BUDGET / 2)
            .map_err(|e| parity_err(path, e))?;
        let mut scratch = Vec::new();
        loop {
            if failed.load(Ordering::Relaxed) {
                return Ok(());
            }
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= count {
                return Ok(());
            }
            let c = i as u64 * s as u64;
            let w = (g.block - c).min(s as u64) as usize;
            if let Err(e) = work(&mut coder, &mut scratch, c, w) {
                failed.store(true, Ordering::Relaxed);
                return Err(e);
            }
        }
    };
    std::thread::scope(|sc| {
        let other = sc.spawn(run);
        let mine = run();
        let theirs = other.join().map_err(|_| SetError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::other("a coding thread panicked"),
        })?;
        mine.and(theirs)
    })
}

/// Code every recovery shard of `g` from its originals (read by `read`), written by `write`.
pub(crate) fn encode(
    path: &Path,
    g: &Geometry,
    read: &ReadShard<'_>,
    write: &WriteShard<'_>,
) -> Result<(), SetError> {
    let (kk, rr) = (g.originals(), g.recovery());
    slices(path, g, &|coder, scratch, c, w| {
        scratch.resize((kk + rr) * w, 0);
        let (originals, recovery) = scratch[..(kk + rr) * w].split_at_mut(kk * w);
        for (i, buf) in originals.chunks_mut(w).enumerate() {
            read(i, c, buf).map_err(super::io_err(path))?;
        }
        {
            let o: Vec<&[u8]> = originals.chunks(w).collect();
            let mut r: Vec<&mut [u8]> = recovery.chunks_mut(w).collect();
            coder.encode(&o, &mut r).map_err(|e| parity_err(path, e))?;
        }
        for (j, bytes) in recovery.chunks(w).enumerate() {
            write(kk + j, c, bytes)?;
        }
        Ok(())
    })
}

/// Rebuild the shards `lost` (sorted; at most `R`) from the others (read by `read`, intact):
/// lost originals decoded, and with `parity` lost recovery shards coded again; each written by
/// `write`.
pub(crate) fn rebuild(
    path: &Path,
    g: &Geometry,
    lost: &[usize],
    parity: bool,
    read: &ReadShard<'_>,
    write: &WriteShard<'_>,
) -> Result<(), SetError> {
    let (kk, rr) = (g.originals(), g.recovery());
    if lost.len() > rr {
        return Err(SetError::Parity {
            path: path.to_path_buf(),
            source: ParityError::TooFew {
                have: kk + rr - lost.len(),
                need: kk,
            },
        });
    }
    let is_lost = {
        let mut v = vec![false; kk + rr];
        for &i in lost {
            v[i] = true;
        }
        v
    };
    let lost_data: Vec<usize> = lost.iter().copied().filter(|&i| i < kk).collect();
    let lost_parity = parity && lost.iter().any(|&i| i >= kk);
    // The shards read: every intact original, and as many intact recovery shards as there are
    // lost originals (the decoder takes exactly K).
    let mut used: Vec<usize> = (0..kk).filter(|&i| !is_lost[i]).collect();
    used.extend((kk..kk + rr).filter(|&i| !is_lost[i]).take(lost_data.len()));
    slices(path, g, &|coder, scratch, c, w| {
        scratch.resize((kk + rr + lost_data.len()) * w, 0);
        let (shards, restored) =
            scratch[..(kk + rr + lost_data.len()) * w].split_at_mut((kk + rr) * w);
        for (i, buf) in shards.chunks_mut(w).enumerate() {
            if used.binary_search(&i).is_ok() {
                read(i, c, buf).map_err(super::io_err(path))?;
            }
        }
        if !lost_data.is_empty() {
            let (data, parity) = shards.split_at_mut(kk * w);
            {
                let data: &[u8] = data;
                let present: Vec<Option<&[u8]>> = data
                    .chunks(w)
                    .chain(parity.chunks(w))
                    .enumerate()
                    .map(|(i, s)| used.binary_search(&i).is_ok().then_some(s))
                    .collect();
                let mut outs: Vec<(usize, &mut [u8])> = lost_data
                    .iter()
                    .copied()
                    .zip(restored.chunks_mut(w))
                    .collect();
                coder
                    .decode(&present, &mut outs)
                    .map_err(|e| parity_err(path, e))?;
            }
            for (&i, bytes) in lost_data.iter().zip(restored.chunks(w)) {
                data[i * w..(i + 1) * w].copy_from_slice(bytes);
                write(i, c, bytes)?;
            }
        }
        if lost_parity {
            let (data, parity) = shards.split_at_mut(kk * w);
            let o: Vec<&[u8]> = data.chunks(w).collect();
            let mut r: Vec<&mut [u8]> = parity.chunks_mut(w).collect();
            coder.encode(&o, &mut r).map_err(|e| parity_err(path, e))?;
            for &i in lost.iter().filter(|&&i| i >= kk) {
                write(i, c, &shards[i * w..(i + 1) * w])?;
            }
        }
        Ok(())
    })
}

/// Bytes `at..at + buf.len()` of a shard whose block of `len` bytes starts at `start` of
/// `file`: zeros beyond the block's end (a shorter block is padded to the shard size).
pub(crate) fn read_padded(
    file: &File,
    start: u64,
    len: u64,
    at: u64,
    buf: &mut [u8],
) -> std::io::Result<()> {
    let have = len.saturating_sub(at).min(buf.len() as u64) as usize;
    buf[have..].fill(0);
    if have == 0 {
        return Ok(());
    }
    crate::fsio::read_at(file, &mut buf[..have], start + at)
}

/// Shard bytes as the set's part files hold them ([`read_padded`]).
pub(crate) fn read_from_parts<'a>(
    set: &'a Set,
) -> impl Fn(usize, u64, &mut [u8]) -> std::io::Result<()> + Sync + 'a {
    move |i, at, buf| {
        let g = &set.geometry;
        let (p, b) = g.shard_block(i);
        let Some(f) = &set.slots[p].file else {
            return Err(std::io::Error::other("the part is missing"));
        };
        read_padded(f, g.data_offset + b * g.block, g.block_len(p, b), at, buf)
    }
}

/// The damaged data blocks of a set-wide code, rebuilt into a temporary file (unlinked: gone
/// when the set is dropped) for readers: found by one pass over the set ([`super::check`]) on
/// the first damaged block read.
pub(crate) struct Spill {
    file: File,
    /// Shard → where its block starts in `file`.
    at: HashMap<usize, u64>,
}

impl Spill {
    /// Check the whole set and rebuild every damaged data block into a spill file (in the
    /// temporary directory). Damage beyond the code is refused with the whole picture.
    pub(crate) fn build(set: &Set) -> Result<Spill, SetError> {
        let g = &set.geometry;
        let report = super::check(set, &|_| {})?;
        if !report.repairable() {
            return Err(SetError::Beyond(Box::new(report)));
        }
        let lost = report.shards(g);
        let tmp = std::env::temp_dir();
        let file = tempfile::tempfile_in(&tmp).map_err(super::io_err(&tmp))?;
        let at: HashMap<usize, u64> = lost
            .iter()
            .filter(|&&i| i < g.originals())
            .enumerate()
            .map(|(n, &i)| (i, n as u64 * g.block))
            .collect();
        let read = read_from_parts(set);
        let write = |i: usize, c: u64, bytes: &[u8]| -> Result<(), SetError> {
            let start = at.get(&i).ok_or_else(|| SetError::Io {
                path: tmp.clone(),
                source: std::io::Error::other(format!(
                    "shard {i} has no place in the spill file (a bug)"
                )),
            })?;
            crate::fsio::write_at(&file, bytes, start + c).map_err(super::io_err(&tmp))
        };
        // Only the data blocks are needed to read the bundle: lost recovery blocks stay lost.
        rebuild(&set.path, g, &lost, false, &read, &write)?;
        Ok(Spill { file, at })
    }

    /// Block `b` of data part `p` as rebuilt (`None`: it was intact when the set was checked).
    pub(crate) fn block(&self, g: &Geometry, p: usize, b: u64) -> Option<Vec<u8>> {
        let start = *self.at.get(&g.table_index(p, b))?;
        let mut buf = vec![0u8; g.block_len(p, b) as usize];
        crate::fsio::read_at(&self.file, &mut buf, start).ok()?;
        Some(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Mutex;

    /// A set-wide code held in memory: every shard of `g`, data then recovery, `B` bytes each.
    fn shards_of(g: &Geometry, seed: u64) -> Vec<Vec<u8>> {
        let mut x = seed | 1;
        (0..g.originals() + g.recovery())
            .map(|i| {
                let (p, b) = g.shard_block(i);
                let len = if i < g.originals() {
                    g.block_len(p, b)
                } else {
                    0
                };
                let mut v = vec![0u8; g.block as usize];
                for byte in &mut v[..len as usize] {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    *byte = x as u8;
                }
                v
            })
            .collect()
    }

    fn encode_in_memory(g: &Geometry, shards: &mut [Vec<u8>]) {
        let out = Mutex::new(shards.to_vec());
        let src = shards.to_vec();
        let read = |i: usize, at: u64, buf: &mut [u8]| -> std::io::Result<()> {
            buf.copy_from_slice(&src[i][at as usize..at as usize + buf.len()]);
            Ok(())
        };
        let write = |i: usize, at: u64, bytes: &[u8]| -> Result<(), SetError> {
            out.lock().unwrap()[i][at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
            Ok(())
        };
        encode(Path::new("mem"), g, &read, &write).unwrap();
        shards.clone_from_slice(&out.into_inner().unwrap());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Any `R` lost shards of a set-wide code, wherever they are (data or recovery, the
        /// same block of every part or not), come back byte for byte; `R + 1` are refused.
        #[test]
        fn any_r_lost_blocks_of_the_set_are_rebuilt(
            total in 20_000u64..200_000,
            stride_blocks in 2u64..9,
            n in 1usize..4,
            seed in any::<u64>(),
            picks in proptest::collection::vec(any::<u64>(), 64),
        ) {
            let block = 4096;
            let g = Geometry::new_spread(total, stride_blocks * block, n, block, 0);
            let mut shards = shards_of(&g, seed);
            encode_in_memory(&g, &mut shards);
            let all = g.originals() + g.recovery();
            let mut lost: Vec<usize> = picks.iter().map(|&x| (x % all as u64) as usize).collect();
            lost.sort_unstable();
            lost.dedup();
            lost.truncate(g.recovery());
            lost.sort_unstable();
            let pristine = shards.clone();
            for &i in &lost {
                shards[i].fill(0xEE);
            }
            let out = Mutex::new(shards.clone());
            let read = |i: usize, at: u64, buf: &mut [u8]| -> std::io::Result<()> {
                assert!(lost.binary_search(&i).is_err(), "a lost shard was read");
                buf.copy_from_slice(&shards[i][at as usize..at as usize + buf.len()]);
                Ok(())
            };
            let write = |i: usize, at: u64, bytes: &[u8]| -> Result<(), SetError> {
                out.lock().unwrap()[i][at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
                Ok(())
            };
            let too_many: Vec<usize> = (0..=g.recovery()).collect();
            prop_assert!(rebuild(Path::new("mem"), &g, &too_many, true, &read, &write).is_err());
            rebuild(Path::new("mem"), &g, &lost, true, &read, &write).unwrap();
            prop_assert!(out.into_inner().unwrap() == pristine);
        }
    }

    #[test]
    fn a_spread_geometry_numbers_its_shards_in_table_order() {
        // 3 data parts of 3 blocks (the last of 1.5 blocks), 2 parity parts of 3 whole blocks.
        let g = Geometry::new_spread(2 * 12288 + 6144, 12288, 2, 4096, 4096);
        assert_eq!(g.k, 3);
        assert_eq!(g.sizes, vec![12288, 12288, 6144, 12288, 12288]);
        assert_eq!(g.originals(), 8);
        assert_eq!(g.recovery(), 6);
        assert_eq!(g.shard_block(0), (0, 0));
        assert_eq!(g.shard_block(7), (2, 1));
        assert_eq!(g.shard_block(8), (3, 0));
        assert_eq!(g.shard_block(13), (4, 2));
        for i in 0..14 {
            let (p, b) = g.shard_block(i);
            assert_eq!(g.table_index(p, b), i);
        }
        // An odd first part: the parity parts still hold whole blocks.
        let g = Geometry::new_spread(5000, 5000, 1, 4096, 4096);
        assert_eq!(g.sizes, vec![5000, 8192]);
        // Block sizes: about 4096 data blocks, more when the code needs it, none past a part.
        assert_eq!(
            Geometry::spread_block_for(470 << 20, 47 << 20, 2),
            Some(128 << 10)
        );
        assert_eq!(
            Geometry::spread_block_for(1 << 20, 256 << 10, 2),
            Some(4096)
        );
        assert_eq!(
            Geometry::spread_block_for(100 << 30, 25 << 30, 1),
            Some(32 << 20)
        );
        assert_eq!(Geometry::spread_block_for(100 << 40, 25 << 40, 1), None);
    }
}
