//! One pass over a whole set, a group of stripes at a time: every block of every part read once
//! and checked against its digest ([`check`]); for [`repair`], the damaged blocks rebuilt from
//! their stripes and every part that needs it written back whole (to a temporary file renamed
//! into place only when every stripe could be rebuilt: damage beyond the parity parts writes
//! nothing).
//!
//! A thread of its own reads the next group while one is checked, rebuilt and written (with
//! the kernel asked to read the one after ahead).
//!
//! Memory: two sets of group buffers, `(k + n) × B × stripes ≤ STRIPE_BUDGET / 8` (8 MiB)
//! each, or one stripe in one set when a stripe is larger than that (at most the budget, 64
//! MiB), plus the coder's column slice (at most 32 MiB); the set's block table besides.

use super::header;
use super::{io_err, DamageReport, PartDamage, Set, SetError, Unit};
use crate::atomic::AtomicFile;
use crate::parity::{Coder, SLICE_BUDGET};
use std::path::PathBuf;

/// What [`repair`] did.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Repaired {
    /// The parts written back whole.
    pub written: Vec<PathBuf>,
    /// The damage found (every stripe within the parity parts).
    pub damage: DamageReport,
    /// Blocks rebuilt from parity.
    pub rebuilt: u64,
}

/// Read every block of the set and say what is damaged (an `Ok` report may still be beyond
/// repair: see [`DamageReport::repairable`]).
pub(crate) fn check(set: &Set, on_bytes: &(dyn Fn(u64) + Sync)) -> Result<DamageReport, SetError> {
    Ok(Pass::new(set, None, on_bytes)?.run()?.0)
}

/// Write every damaged, missing, misplaced or short part of the set back whole, its header area
/// carrying `signature` (the one the key verified; the set's own when none was checked).
/// Damage beyond the parity parts is refused ([`SetError::Beyond`]) and nothing is written.
pub fn repair(
    set: &Set,
    signature: Option<&[u8]>,
    on_bytes: &(dyn Fn(u64) + Sync),
) -> Result<Repaired, SetError> {
    let sig = signature
        .map(<[u8]>::to_vec)
        .or_else(|| set.signature.clone())
        .unwrap_or_default();
    // Lost beyond doubt before a byte is read: a check pass (it writes nothing) says the
    // damage, and no room is reserved for parts that would never be written (a forged header
    // claiming 200 blocks of 64 MiB had repair reserve 12.5 GiB before refusing, and fail on
    // a full disk instead). Only a shortcut: the full pass below decides every other case.
    if set.surely_beyond_repair() {
        let damage = check(set, on_bytes)?;
        if !damage.repairable() {
            return Err(SetError::Beyond(Box::new(damage)));
        }
    }
    let (damage, targets, mut rebuilt) = Pass::new(set, Some(sig.clone()), on_bytes)?.run()?;
    if !damage.repairable() {
        return Err(SetError::Beyond(Box::new(damage)));
    }
    let g = &set.geometry;
    if g.spread && damage.damaged_blocks > 0 {
        rebuilt = rebuild_spread(set, &damage, &targets)?;
    }
    let mut written = Vec::new();
    for (q, t) in targets.into_iter().enumerate() {
        let Some(t) = t else { continue };
        let mut head = header::area(&set.json, &sig, &set.table, q, g.parts());
        head.resize(g.data_offset as usize, 0);
        let file = t.tmp.file();
        crate::fsio::write_at(file, &head, 0).map_err(io_err(&t.dest))?;
        file.set_len(g.file_len(q)).map_err(io_err(&t.dest))?;
        t.tmp.commit().map_err(io_err(&t.dest))?;
        written.push(t.dest);
    }
    Ok(Repaired {
        written,
        damage,
        rebuilt,
    })
}

/// A set-wide code: every damaged block rebuilt at once into the parts being written back, then
/// read back and checked against its digest. Returns the blocks rebuilt.
fn rebuild_spread(
    set: &Set,
    damage: &DamageReport,
    targets: &[Option<Target>],
) -> Result<u64, SetError> {
    let g = &set.geometry;
    let lost = damage.shards(g);
    let target = |p: usize| {
        targets[p].as_ref().ok_or_else(|| SetError::Io {
            path: set.slots[p].path.clone(),
            source: std::io::Error::other("a damaged part has no part to write back to (a bug)"),
        })
    };
    let write = |i: usize, at: u64, bytes: &[u8]| -> Result<(), SetError> {
        let (p, b) = g.shard_block(i);
        let t = target(p)?;
        let len = g.block_len(p, b).saturating_sub(at).min(bytes.len() as u64) as usize;
        crate::fsio::write_at(
            t.tmp.file(),
            &bytes[..len],
            g.data_offset + b * g.block + at,
        )
        .map_err(io_err(&t.dest))
    };
    let read = super::spread::read_from_parts(set);
    super::spread::rebuild(&set.path, g, &lost, true, &read, &write)?;
    let mut buf = vec![0u8; g.block as usize];
    for &i in &lost {
        let (p, b) = g.shard_block(i);
        let t = target(p)?;
        let bytes = &mut buf[..g.block_len(p, b) as usize];
        crate::fsio::read_at(t.tmp.file(), bytes, g.data_offset + b * g.block)
            .map_err(io_err(&t.dest))?;
        if super::block_digest(bytes) != set.expected(p, b) {
            return Err(SetError::Rebuilt {
                path: t.dest.clone(),
                block: b,
            });
        }
    }
    Ok(lost.len() as u64)
}

/// A part found where the header puts it whose copy of the header is not the set's (one byte
/// changed in it is enough): its data may be whole, but [`repair`] writes it back.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HeaderCopyDamage {
    /// Its index.
    pub part: usize,
    /// The file.
    pub path: PathBuf,
    /// What is wrong with its copy, as far as reading it says.
    pub reason: String,
}

impl Set {
    /// Whether the parts not found at all are already more than the parity rebuilds: with a
    /// set-wide code, more blocks than the parity parts hold; with stripes, more parts than
    /// there are parity parts (stripe 0 has a block of every part, so it lost more shards
    /// than it has parity). Parts found but damaged are not counted: that takes a read.
    pub(crate) fn surely_beyond_repair(&self) -> bool {
        let g = &self.geometry;
        let missing: Vec<usize> = (0..g.parts())
            .filter(|&p| self.slots[p].file.is_none() && g.blocks(p) > 0)
            .collect();
        if g.spread {
            let lost: u64 = missing.iter().map(|&p| g.blocks(p)).sum();
            let parity: u64 = (g.k..g.parts()).map(|p| g.blocks(p)).sum();
            lost > parity
        } else {
            missing.len() > g.n
        }
    }

    /// Whether part `q`'s header area is the one the set gives it, carrying `sig`: what
    /// [`repair`] compares before it decides to write a part back.
    pub(crate) fn header_area_intact(&self, q: usize, sig: &[u8]) -> bool {
        let g = &self.geometry;
        let Some(file) = &self.slots[q].file else {
            return false;
        };
        let mut want = header::area(&self.json, sig, &self.table, q, g.parts());
        want.resize(g.data_offset as usize, 0);
        let mut have = vec![0u8; want.len()];
        crate::fsio::read_at(file, &mut have, 0).is_ok() && have == want
    }

    /// The parts whose header area [`repair`] would write again though opening the set said
    /// nothing of them (their part line is intact, so they were found and read; a part the
    /// opening noted, missing, moved, short or with its own copy damaged, is in
    /// [`Set::notes`] already). `signature`: the one the key verified (the set's own when none
    /// was checked), as [`repair`] takes it.
    pub fn damaged_header_copies(&self, signature: Option<&[u8]>) -> Vec<HeaderCopyDamage> {
        let sig = signature
            .map(<[u8]>::to_vec)
            .or_else(|| self.signature.clone())
            .unwrap_or_default();
        (0..self.slots.len())
            .filter(|&q| {
                let s = &self.slots[q];
                s.file.is_some() && !s.rewrite && !self.header_area_intact(q, &sig)
            })
            .map(|q| {
                let path = self.slots[q].path.clone();
                let reason = match header::read_copy(&path) {
                    Err(r) => r,
                    Ok(c) if c.json != self.json => "it is another header".into(),
                    Ok(c) if c.sig != sig => "its signature differs from the set's".into(),
                    Ok(_) => "its bytes differ from the set's header area".into(),
                };
                HeaderCopyDamage {
                    part: q,
                    path,
                    reason,
                }
            })
            .collect()
    }
}

/// A part being written back.
struct Target {
    tmp: AtomicFile,
    dest: PathBuf,
}

struct Pass<'a> {
    set: &'a Set,
    /// Repairing: the signature the header areas get.
    sig: Option<Vec<u8>>,
    on_bytes: &'a (dyn Fn(u64) + Sync),
    targets: Vec<Option<Target>>,
    damaged: Vec<Vec<u64>>,
    rebuilt: u64,
    /// The coders of the two rebuilding threads, kept from one group to the next (a lost part
    /// is the same erasure pattern in every group: its coefficients are worked out once).
    coders: [Option<Coder>; 2],
}

type Outcome = (DamageReport, Vec<Option<Target>>, u64);

impl<'a> Pass<'a> {
    fn new(
        set: &'a Set,
        sig: Option<Vec<u8>>,
        on_bytes: &'a (dyn Fn(u64) + Sync),
    ) -> Result<Pass<'a>, SetError> {
        let count = set.geometry.parts();
        let mut pass = Pass {
            set,
            sig,
            on_bytes,
            targets: (0..count).map(|_| None).collect(),
            damaged: vec![Vec::new(); count],
            rebuilt: 0,
            coders: [None, None],
        };
        if pass.sig.is_some() {
            for q in 0..count {
                if set.slots[q].rewrite || !pass.header_intact(q) {
                    pass.target(q, 0)?;
                }
            }
        }
        Ok(pass)
    }

    /// Whether part `q`'s header area is the one it should have.
    fn header_intact(&self, q: usize) -> bool {
        self.set
            .header_area_intact(q, self.sig.as_deref().unwrap_or_default())
    }

    /// Make part `q` a target: its file is written anew; its first `upto` bytes of data (blocks
    /// checked intact before it was found damaged) are copied from where it is now.
    fn target(&mut self, q: usize, upto: u64) -> Result<(), SetError> {
        if self.targets[q].is_some() {
            return Ok(());
        }
        let set = self.set;
        let dest = set
            .path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(|d| d.join(&set.header.parts[q].file))
            .unwrap_or_else(|| PathBuf::from(&set.header.parts[q].file));
        if let Ok(Some(ident)) = header::read_ident(&dest) {
            if ident.set != set.id() {
                return Err(SetError::Foreign {
                    bundle: header::read_copy(&dest).ok().map(|c| c.header.bundle.file),
                    path: dest,
                    part: q,
                });
            }
        }
        let tmp = AtomicFile::create(&dest).map_err(io_err(&dest))?;
        let g = &set.geometry;
        crate::fsio::reserve(tmp.file(), g.file_len(q)).map_err(io_err(&dest))?;
        if let (Some(src), true) = (&set.slots[q].file, upto > 0) {
            let mut buf = vec![0u8; 1 << 20];
            let mut at = 0;
            while at < upto {
                let n = (upto - at).min(buf.len() as u64) as usize;
                let off = g.data_offset + at;
                crate::fsio::read_at(src, &mut buf[..n], off)
                    .map_err(io_err(&set.slots[q].path))?;
                crate::fsio::write_at(tmp.file(), &buf[..n], off).map_err(io_err(&dest))?;
                at += n as u64;
            }
        }
        self.targets[q] = Some(Target { tmp, dest });
        Ok(())
    }

    fn run(mut self) -> Result<Outcome, SetError> {
        let set = self.set;
        let g = &set.geometry;
        let count = g.parts();
        // Two sets of group buffers of an eighth of the budget each (one set when a single
        // stripe takes more than half the budget): a thread of its own reads the next group
        // from the disk while this one is checked, rebuilt and written. Small groups: the
        // buffers are touched once and stay in the caches (a quarter of the budget per set
        // measured slower here, its pages first touched at the cost of a fault each).
        let plan = g.groups(count, 8);
        let per = plan.per;
        let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<Group>(1);
        let (empty_tx, empty_rx) = std::sync::mpsc::channel::<Vec<Vec<u8>>>();
        for _ in 0..plan.sets {
            let _ = empty_tx.send(plan.buffers(g));
        }
        std::thread::scope(|s| {
            // Owned here, so that it ends with this closure, on a failure and on an unwinding
            // alike: the reader then finds no buffer coming back and stops. (Left in `run`, it
            // kept a reader waiting for a buffer forever, and the join below waiting for it: a
            // check that failed while the next group was being read hung at 0 % CPU.)
            let empty_tx = empty_tx;
            let reader = s.spawn(move || {
                for u in plan.units(g, count) {
                    // The consumer stopped (a failure): nothing more to read.
                    let Ok(mut bufs) = empty_rx.recv() else {
                        return;
                    };
                    // Kept AHEAD groups ahead (all of them at the start).
                    let ahead = if u.j0 == 0 {
                        u.j1
                    } else {
                        u.j1 + (AHEAD - 1) * per
                    };
                    will_need(set, u, ahead, u.j1 + AHEAD * per);
                    let avail = read_group(set, u, &mut bufs);
                    if full_tx.send((u, bufs, avail)).is_err() {
                        return;
                    }
                }
            });
            let work = || -> Result<(), SetError> {
                for (u, mut bufs, avail) in full_rx {
                    self.group(u, &mut bufs, &avail)?;
                    let _ = empty_tx.send(bufs);
                }
                Ok(())
            };
            let worked = work();
            drop(empty_tx);
            reader.join().map_err(|_| SetError::Io {
                path: set.path.clone(),
                source: std::io::Error::other("the reading thread panicked"),
            })?;
            worked
        })?;
        let set = self.set;
        let mut report = DamageReport {
            set: set.path.clone(),
            parity: g.n,
            spread: g.spread.then_some(g.recovery() as u64),
            notes: set.notes.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        };
        for (q, blocks) in self.damaged.into_iter().enumerate() {
            if blocks.is_empty() {
                continue;
            }
            report.parts.push(PartDamage {
                index: q,
                file: set.header.parts[q].file.clone(),
                missing: set.slots[q].file.is_none(),
                blocks,
                of: g.blocks(q),
            });
        }
        report.conclude();
        Ok((report, self.targets, self.rebuilt))
    }

    /// Stripes `j0..j1` of parts `q0..q1` (`bufs[i]` holds part `q0 + i`): read, check,
    /// rebuild, write.
    fn group(&mut self, u: Unit, bufs: &mut [Vec<u8>], avail: &[u64]) -> Result<(), SetError> {
        let set = self.set;
        let g = &set.geometry;
        let Unit { j0, j1, q0, q1 } = u;
        let bad = check_group(set, u, bufs, avail)?;
        // Per stripe, the parts whose block is damaged.
        let mut stripes: Vec<Vec<usize>> = vec![Vec::new(); (j1 - j0) as usize];
        for (i, blocks) in bad.iter().enumerate() {
            for &b in blocks {
                stripes[(b - j0) as usize].push(q0 + i);
                self.damaged[q0 + i].push(b);
            }
        }
        (self.on_bytes)((j1 - j0) * g.block * (q1 - q0) as u64);
        if self.sig.is_none() {
            return Ok(());
        }
        for (i, blocks) in bad.iter().enumerate() {
            if !blocks.is_empty() {
                let q = q0 + i;
                self.target(q, (j0 * g.block).min(g.sizes[q]))?;
            }
        }
        // A set-wide code is rebuilt after the pass, all at once (`rebuild_spread`). A code per
        // stripe has every part in each group (q0 = 0).
        if !g.spread {
            self.rebuild_runs(j0, &stripes, bufs)?;
            // What parity rebuilt is checked against the block table before it is written: a
            // set whose parity does not code its data (an unsigned, forged header) writes
            // nothing. (Stripes with more damage than parity are refused after the pass.)
            for (q, blocks) in bad.iter().enumerate() {
                for &b in blocks {
                    if stripes[(b - j0) as usize].len() > g.n {
                        continue;
                    }
                    let at = ((b - j0) * g.block) as usize;
                    let len = g.block_len(q, b) as usize;
                    if super::block_digest(&bufs[q][at..at + len]) != set.expected(q, b) {
                        return Err(SetError::Rebuilt {
                            path: set.slots[q].path.clone(),
                            block: b,
                        });
                    }
                }
            }
        }
        for (q, t) in self.targets.iter().enumerate().take(q1).skip(q0) {
            let Some(t) = t else { continue };
            let from = (j0 * g.block).min(g.sizes[q]);
            let len = ((j1 * g.block).min(g.sizes[q]) - from) as usize;
            crate::fsio::write_at(t.tmp.file(), &bufs[q - q0][..len], g.data_offset + from)
                .map_err(io_err(&t.dest))?;
            crate::fsio::start_writeback(t.tmp.file(), g.data_offset + from, len as u64);
        }
        Ok(())
    }

    /// Rebuild the damaged blocks of stripes `j0..` (`stripes`: per stripe, its damaged parts)
    /// in `bufs`, a run of stripes with the same damaged parts at once, each run in two halves
    /// on two threads. A stripe with more damaged blocks than parity parts is left (the pass
    /// ends refused).
    fn rebuild_runs(
        &mut self,
        j0: u64,
        stripes: &[Vec<usize>],
        bufs: &mut [Vec<u8>],
    ) -> Result<(), SetError> {
        let set = self.set;
        let g = &set.geometry;
        let mut j = 0;
        while j < stripes.len() {
            let mut end = j + 1;
            while end < stripes.len() && stripes[end] == stripes[j] {
                end += 1;
            }
            let lost = &stripes[j];
            if !lost.is_empty() && lost.len() <= g.n {
                let from = (j as u64 * g.block) as usize;
                let to = ((end as u64 - 1) * g.block + g.shard_len(j0 + end as u64 - 1)) as usize;
                // Two halves of the run, on two threads.
                let cut = (j + (end - j).div_ceil(2)) * g.block as usize;
                let (mut lo, mut hi): (Vec<&mut [u8]>, Vec<&mut [u8]>) = bufs
                    .iter_mut()
                    .map(|b| b[from..to].split_at_mut(cut.min(to) - from))
                    .unzip();
                let [c_lo, c_hi] = &mut self.coders;
                std::thread::scope(|s| {
                    let other = s.spawn(|| rebuild(set, &mut hi, lost, c_hi));
                    rebuild(set, &mut lo, lost, c_lo)?;
                    other.join().map_err(|_| SetError::Io {
                        path: set.path.clone(),
                        source: std::io::Error::other("a rebuilding thread panicked"),
                    })?
                })?;
                self.rebuilt += (end - j) as u64 * lost.len() as u64;
            }
            j = end;
        }
        Ok(())
    }
}

/// Groups the kernel is asked to read ahead of the one being read (4 groups of 8 MiB).
const AHEAD: u64 = 4;

/// A group read: which, the buffers, the bytes each part had.
type Group = (Unit, Vec<Vec<u8>>, Vec<u64>);

/// Ask the kernel to read stripes `j0..j1` of the parts of `u` ahead (see
/// [`crate::fsio::will_need`]).
fn will_need(set: &Set, u: Unit, j0: u64, j1: u64) {
    let g = &set.geometry;
    for (q, slot) in set.slots.iter().enumerate().take(u.q1).skip(u.q0) {
        if let Some(f) = &slot.file {
            let from = (j0 * g.block).min(g.sizes[q]);
            let to = (j1 * g.block).min(g.sizes[q]);
            crate::fsio::will_need(f, g.data_offset + from, to - from);
        }
    }
}

/// Read the group `u` into `bufs` (part `q0 + i` into `bufs[i]`; zeros where a part has no
/// bytes) and return the bytes each part had there.
fn read_group(set: &Set, u: Unit, bufs: &mut [Vec<u8>]) -> Vec<u64> {
    let g = &set.geometry;
    let Unit { j0, j1, q0, q1 } = u;
    let mut avail = vec![0u64; q1 - q0];
    for (i, buf) in bufs[..q1 - q0].iter_mut().enumerate() {
        let q = q0 + i;
        let from = (j0 * g.block).min(g.sizes[q]);
        let want = (j1 * g.block).min(g.sizes[q]) - from;
        let slot = &set.slots[q];
        let on_disk = slot.len.saturating_sub(g.data_offset + from).min(want);
        let at = g.data_offset + from;
        let got = match &slot.file {
            Some(f) if on_disk > 0 => {
                let bytes = &mut buf[..on_disk as usize];
                if crate::fsio::read_at(f, bytes, at).is_err() {
                    // A read error (unreadable sectors of a scratched disc): block by block, so
                    // only the blocks that cannot be read count as damaged (zeros fail their
                    // digest).
                    for (i, chunk) in bytes.chunks_mut(g.block as usize).enumerate() {
                        let off = at + i as u64 * g.block;
                        if crate::fsio::read_at(f, chunk, off).is_err() {
                            chunk.fill(0);
                        }
                    }
                }
                on_disk
            }
            _ => 0,
        };
        // Beyond the part's end, zeros (a shorter part's blocks are padded with zeros in their
        // stripes). The bytes it lacks before its end are left as they are: every block there
        // is damaged, so it is rebuilt before it is written or read as a shard, or nothing is
        // written at all.
        buf[want as usize..].fill(0);
        avail[i] = got;
    }
    avail
}

/// Per part of `u` (`q0 + i` at `i`), its damaged blocks among its stripes (read into `bufs`,
/// `avail` bytes of each part there). Checked on two threads.
fn check_group(
    set: &Set,
    u: Unit,
    bufs: &[Vec<u8>],
    avail: &[u64],
) -> Result<Vec<Vec<u64>>, SetError> {
    let g = &set.geometry;
    let Unit { j0, j1, q0, q1 } = u;
    let check_part = |i: usize| -> Vec<u64> {
        let q = q0 + i;
        let buf = &bufs[i];
        let mut bad = Vec::new();
        for b in j0..j1.min(g.blocks(q)) {
            let at = ((b - j0) * g.block) as usize;
            let len = g.block_len(q, b) as usize;
            if (at + len) as u64 > avail[i]
                || super::block_digest(&buf[at..at + len]) != set.expected(q, b)
            {
                bad.push(b);
            }
        }
        bad
    };
    let count = q1 - q0;
    let (even, odd) = std::thread::scope(|s| {
        let odd = s.spawn(|| {
            (1..count)
                .step_by(2)
                .map(|q| (q, check_part(q)))
                .collect::<Vec<_>>()
        });
        let even: Vec<_> = (0..count).step_by(2).map(|q| (q, check_part(q))).collect();
        (even, odd.join())
    });
    let odd = odd.map_err(|_| SetError::Io {
        path: set.path.clone(),
        source: std::io::Error::other("a checking thread panicked"),
    })?;
    let mut out = vec![Vec::new(); count];
    for (q, bad) in even.into_iter().chain(odd) {
        out[q] = bad;
    }
    Ok(out)
}

/// Rebuild the parts `lost` in `parts` (the same bytes of every part: a run of stripes that
/// lost the same parts): data parts decoded from `k` intact shards, parity parts encoded again.
/// Each of two threads has a coder of half the slice budget.
fn rebuild(
    set: &Set,
    parts: &mut [&mut [u8]],
    lost: &[usize],
    kept: &mut Option<Coder>,
) -> Result<(), SetError> {
    let g = &set.geometry;
    let (k, n) = (g.k, g.n);
    if parts.first().is_none_or(|p| p.is_empty()) {
        return Ok(());
    }
    let perr = |source| SetError::Parity {
        path: set.path.clone(),
        source,
    };
    let coder = match kept {
        Some(c) => c,
        None => kept.insert(Coder::with_budget(k, n, SLICE_BUDGET / 2).map_err(perr)?),
    };
    if lost.iter().any(|&q| q < k) {
        let mut present: Vec<Option<&[u8]>> = Vec::with_capacity(k + n);
        let mut outs: Vec<(usize, &mut [u8])> = Vec::new();
        for (q, buf) in parts.iter_mut().enumerate() {
            if lost.contains(&q) {
                present.push(None);
                if q < k {
                    outs.push((q, &mut buf[..]));
                }
            } else {
                present.push(Some(&buf[..]));
            }
        }
        coder.decode(&present, &mut outs).map_err(perr)?;
    }
    if lost.iter().any(|&q| q >= k) {
        let (data, parity) = parts.split_at_mut(k);
        let originals: Vec<&[u8]> = data.iter().map(|b| &b[..]).collect();
        let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|b| &mut b[..]).collect();
        coder.encode(&originals, &mut outs).map_err(perr)?;
    }
    Ok(())
}
