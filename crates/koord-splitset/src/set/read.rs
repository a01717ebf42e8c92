//! Reading a v2 set: every block checked against its digest as it is read; a damaged or missing
//! block rebuilt from its stripe (the other parts' blocks and the parity parts'), and logged.
//! A reader holds one block, or one stripe while it rebuilds (`(k + n) × B`, at most 64 MiB).

use super::{Set, SetError};
use crate::parity::Coder;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::{self, Read};
use std::sync::Arc;

/// One block rebuilt while reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repair {
    /// The part.
    pub(crate) part: usize,
    /// Its file name.
    pub file: String,
    /// The block.
    pub block: u64,
    /// The part is missing altogether.
    pub(crate) missing: bool,
}

/// What was rebuilt of one part so far.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PartRepairs {
    /// The part.
    pub part: usize,
    /// Its file name.
    pub(crate) file: String,
    /// The part is missing altogether.
    pub missing: bool,
    /// Blocks rebuilt.
    pub blocks: u64,
    /// Blocks it has.
    pub(crate) of: u64,
}

impl fmt::Display for PartRepairs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let blocks = if self.blocks == 1 { "block" } else { "blocks" };
        if self.missing && self.blocks == self.of {
            write!(
                f,
                "{}: missing, all {} of its blocks rebuilt from parity",
                self.file, self.of
            )
        } else if self.missing {
            write!(
                f,
                "{}: missing, the {} of its {} blocks read rebuilt from parity",
                self.file, self.blocks, self.of
            )
        } else {
            write!(
                f,
                "{}: {} {blocks} damaged, rebuilt from parity",
                self.file, self.blocks
            )
        }
    }
}

/// Blocks rebuilt, per part.
#[derive(Debug, Default)]
pub(crate) struct Log {
    parts: BTreeMap<usize, BTreeSet<u64>>,
}

/// A block of a stripe that cannot be rebuilt (the full picture: [`super::check`]).
fn stripe_error(set: &Set, p: usize, b: u64, damaged: &[usize]) -> SetError {
    let names: Vec<String> = damaged
        .iter()
        .map(|&q| set.header.parts[q].file.clone())
        .collect();
    SetError::Stripe {
        set: set.path.clone(),
        file: set.header.parts[p].file.clone(),
        block: b,
        damaged: names,
        parity: set.geometry.n,
    }
}

impl Set {
    /// Parts repaired while reading, so far.
    pub fn repairs(&self) -> Vec<PartRepairs> {
        let log = match self.log.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        log.parts
            .iter()
            .map(|(&p, blocks)| PartRepairs {
                part: p,
                file: self.header.parts[p].file.clone(),
                missing: self.slots[p].file.is_none(),
                blocks: blocks.len() as u64,
                of: self.geometry.blocks(p),
            })
            .collect()
    }

    /// Tell `observer` of every block rebuilt from now on.
    pub fn on_repair(&self, observer: super::Observer) {
        if let Ok(mut o) = self.observer.lock() {
            *o = Some(observer);
        }
    }

    fn record(&self, p: usize, b: u64) {
        let new = match self.log.lock() {
            Ok(mut l) => l.parts.entry(p).or_default().insert(b),
            Err(_) => false,
        };
        let observer = self.observer.lock().ok().and_then(|o| o.clone());
        if let (true, Some(o)) = (new, observer) {
            o(&Repair {
                part: p,
                file: self.header.parts[p].file.clone(),
                block: b,
                missing: self.slots[p].file.is_none(),
            });
        }
    }

    /// The bytes of block `b` of part `p` as the part holds them, if it holds them all.
    pub(crate) fn read_raw(&self, p: usize, b: u64) -> Option<Vec<u8>> {
        let g = &self.geometry;
        let len = g.block_len(p, b);
        let slot = &self.slots[p];
        let file = slot.file.as_ref()?;
        let at = g.data_offset + b * g.block;
        if at + len > slot.len {
            return None;
        }
        let mut buf = vec![0u8; len as usize];
        crate::fsio::read_at(file, &mut buf, at).ok()?;
        Some(buf)
    }

    /// Block `b` of part `p` when intact (its digest matches the header's).
    pub(crate) fn intact(&self, p: usize, b: u64) -> Option<Vec<u8>> {
        if self.geometry.block_len(p, b) == 0 {
            return Some(Vec::new());
        }
        self.read_raw(p, b)
            .filter(|bytes| super::block_digest(bytes) == self.expected(p, b))
    }

    /// Block `b` of part `p`, checked; rebuilt from its stripe when damaged or missing.
    pub(crate) fn read_block(&self, p: usize, b: u64) -> Result<Vec<u8>, SetError> {
        if let Some(bytes) = self.intact(p, b) {
            return Ok(bytes);
        }
        let bytes = if self.geometry.spread {
            self.rebuild_spread(p, b)?
        } else {
            self.rebuild(p, b)?
        };
        self.record(p, b);
        Ok(bytes)
    }

    /// Block `b` of data part `p` of a set-wide code: on the first damaged block read, the
    /// whole set is checked and every damaged data block rebuilt into a spill file
    /// ([`super::spread::Spill`]); read from there, checked against its digest.
    fn rebuild_spread(&self, p: usize, b: u64) -> Result<Vec<u8>, SetError> {
        let spill = {
            let mut kept = match self.spill.lock() {
                Ok(s) => s,
                Err(e) => e.into_inner(),
            };
            match &*kept {
                Some(s) => s.clone(),
                None => kept
                    .insert(Arc::new(super::spread::Spill::build(self)?))
                    .clone(),
            }
        };
        spill
            .block(&self.geometry, p, b)
            .filter(|bytes| super::block_digest(bytes) == self.expected(p, b))
            .ok_or_else(|| SetError::Io {
                path: self.slots[p].path.clone(),
                source: io::Error::other(format!(
                    "block {b} was intact when the set was checked and is damaged now (the medium is failing while read?): read it again, or copy the part again"
                )),
            })
    }

    /// Rebuild block `j` of part `p` from stripe `j`: intact blocks of the data parts first,
    /// then of the parity parts, until `k` are at hand.
    fn rebuild(&self, p: usize, j: u64) -> Result<Vec<u8>, SetError> {
        let g = &self.geometry;
        let (k, n) = (g.k, g.n);
        let len = g.shard_len(j) as usize;
        let mut shards: Vec<Option<Vec<u8>>> = vec![None; k + n];
        let mut damaged = vec![p];
        let mut have = 0;
        for q in (0..k + n).filter(|&q| q != p) {
            if have == k {
                break;
            }
            match self.intact(q, j) {
                Some(mut bytes) => {
                    bytes.resize(len, 0);
                    shards[q] = Some(bytes);
                    have += 1;
                }
                None => damaged.push(q),
            }
        }
        if n == 0 || have < k {
            // The rest of the stripe, so the message names every damaged block of it.
            let last = damaged.last().copied().unwrap_or(p);
            for q in (last + 1..k + n).filter(|&q| q != p && shards[q].is_none()) {
                if self.intact(q, j).is_none() {
                    damaged.push(q);
                }
            }
            damaged.sort_unstable();
            damaged.dedup();
            return Err(stripe_error(self, p, j, &damaged));
        }
        let perr = |source| SetError::Parity {
            path: self.path.clone(),
            source,
        };
        // The last rebuild's coder, taken out so rebuilds on other threads do not wait.
        let kept = self.coder.lock().ok().and_then(|mut c| c.take());
        let mut coder = match kept {
            Some(c) => c,
            None => Coder::new(k, n).map_err(perr)?,
        };
        let mut out = if p < k {
            // Only the block asked for is decoded.
            let present: Vec<Option<&[u8]>> = shards.iter().map(|s| s.as_deref()).collect();
            let mut out = vec![0u8; len];
            coder
                .decode(&present, &mut [(p, &mut out[..])])
                .map_err(perr)?;
            out
        } else {
            coder.reconstruct(&mut shards, len).map_err(perr)?;
            shards[p].take().unwrap_or_default()
        };
        if let Ok(mut c) = self.coder.lock() {
            *c = Some(coder);
        }
        out.truncate(g.block_len(p, j) as usize);
        if super::block_digest(&out) != self.expected(p, j) {
            return Err(SetError::Rebuilt {
                path: self.slots[p].path.clone(),
                block: j,
            });
        }
        Ok(out)
    }

    /// Check every block of the parity parts (which reading the bundle does not touch unless
    /// it rebuilds): the damaged ones, per parity part (`repair` writes them back).
    pub fn check_parity(&self, on_bytes: &(dyn Fn(u64) + Sync)) -> Vec<super::PartDamage> {
        let g = &self.geometry;
        let mut out = Vec::new();
        for p in g.k..g.parts() {
            let blocks: Vec<u64> = (0..g.blocks(p))
                .filter(|&b| {
                    on_bytes(g.block_len(p, b));
                    self.intact(p, b).is_none()
                })
                .collect();
            if !blocks.is_empty() {
                out.push(super::PartDamage {
                    index: p,
                    file: self.header.parts[p].file.clone(),
                    missing: self.slots[p].file.is_none(),
                    blocks,
                    of: g.blocks(p),
                });
            }
        }
        out
    }

    /// Bundle bytes `offset..offset + len`, checked and repaired.
    pub fn read_range(&self, offset: u64, len: u64) -> Result<Vec<u8>, SetError> {
        let g = &self.geometry;
        let mut out = Vec::with_capacity(len.min(1 << 24) as usize);
        let end = offset.saturating_add(len).min(self.header.bundle.size);
        let mut at = offset;
        while at < end {
            let (p, within) = g.locate(at);
            let b = within / g.block;
            let block = self.read_block(p, b)?;
            let from = (within - b * g.block) as usize;
            let take = (block.len() - from).min((end - at) as usize);
            if take == 0 {
                break;
            }
            out.extend_from_slice(&block[from..from + take]);
            at += take as u64;
        }
        Ok(out)
    }

    /// The bundle's bytes in order, checked and repaired block by block.
    pub(crate) fn reader(self: &Arc<Self>) -> SetReader {
        SetReader {
            set: self.clone(),
            pos: 0,
            block: Vec::new(),
            block_start: 0,
        }
    }
}

/// Sequential reader of a set's bundle bytes.
pub struct SetReader {
    set: Arc<Set>,
    pos: u64,
    block: Vec<u8>,
    block_start: u64,
}

impl Read for SetReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let size = self.set.header.bundle.size;
        if self.pos >= size || buf.is_empty() {
            return Ok(0);
        }
        let within_block = self.pos.checked_sub(self.block_start);
        if within_block.is_none_or(|w| w >= self.block.len() as u64) {
            let g = &self.set.geometry;
            let (p, within) = g.locate(self.pos);
            let b = within / g.block;
            self.block = self
                .set
                .read_block(p, b)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            self.block_start = self.pos - (within - b * g.block);
            if self.block.is_empty() {
                return Ok(0);
            }
        }
        let from = (self.pos - self.block_start) as usize;
        let n = buf.len().min(self.block.len() - from);
        buf[..n].copy_from_slice(&self.block[from..from + n]);
        self.pos += n as u64;
        Ok(n)
    }
}
