//! The erasure code of split sets with parity parts: a stripe is `k` original shards (one block
//! of every data part) and `n` recovery shards (one block of every parity part), all of the same
//! even length; any `k` intact shards of a stripe give back the other `n`.
//!
//! The code is reed-solomon-simd's: Reed–Solomon over GF(2^16) with the FFT construction of
//! Lin, Chung and Han, the code of Leopard-RS (its recovery shards are byte-identical to
//! Leopard-RS and leopard-codec for the same input). It works on the shard's bytes position by
//! position: bytes `c..c+w` of the recovery shards depend only on bytes `c..c+w` of the original
//! shards whenever `c` and `w` are multiples of 64 (the last, partial 64-byte chunk is laid out
//! on its own, and stays last). So a stripe is coded in column slices of [`Coder::slice_width`]
//! bytes, which bounds memory whatever the block size and the number of parts; the property
//! test below checks that sliced and whole coding give the same bytes.
//!
//! # Decoding a few lost shards
//!
//! The code is linear and the same at every symbol position: an erased original is a fixed
//! GF(2^16) combination of the `k` shards the decoder is given. When few originals are lost
//! (at most [`MATRIX_MAX_LOST`], the case of a lost disc or two), [`Coder::decode`] works out
//! those coefficients once per erasure pattern (one decode of `k` unit symbols, position `i`
//! of shard `i`) and applies them with the library's own SIMD multiply and XOR, instead of the
//! FFT decoder on every stripe. Measured here (2 cores, AVX2 engine; a 10+2 stripe of 32 KiB
//! blocks, 2 originals lost, 480 MiB): the FFT decoder 935 MiB/s of stripe, the coefficients
//! 7,444 MiB/s — the FFT decoder was 43 % of `repair`'s time. The property test below checks
//! that both give the same bytes.

use reed_solomon_simd::engine::{tables, utils, DefaultEngine, Engine as _, GF_MODULUS};
use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};

/// Memory one column slice of a stripe may take (the shards' slices plus the coder's work
/// space, which is at most twice the shard count rounded up to a power of two).
pub(crate) const SLICE_BUDGET: usize = 32 << 20;

/// Most lost originals decoded by coefficients (see the module docs); more go through the
/// FFT decoder, whose cost does not grow with the erasures.
pub(crate) const MATRIX_MAX_LOST: usize = 4;

/// Bytes multiplied at once when decoding by coefficients (a piece of every shard stays in
/// the first-level cache).
const MATRIX_PIECE: usize = 8 << 10;

/// Why a stripe cannot be coded.
#[derive(Debug, thiserror::Error)]
pub enum ParityError {
    /// The code has no such shape.
    #[error("{k} data parts with {n} parity parts is beyond the Reed-Solomon code (at most 32768 data parts and 65536 parts in all): use larger parts or fewer parity parts")]
    Unsupported {
        /// Data parts.
        k: usize,
        /// Parity parts.
        n: usize,
    },
    /// Too few intact shards in a stripe.
    #[error("{have} intact blocks in the stripe, {need} needed")]
    TooFew {
        /// Intact shards.
        have: usize,
        /// Shards needed (`k`).
        need: usize,
    },
    /// Shards of different or odd lengths (a bug of the caller).
    #[error("shards must all have the same even, non-zero length (got {0} bytes)")]
    Length(usize),
    /// The coder refused its input (a bug).
    #[error("Reed-Solomon coder: {0}")]
    Coder(String),
}

impl koord_base::exit::Classify for ParityError {
    fn exit_class(&self) -> Option<koord_base::exit::ExitClass> {
        use koord_base::exit::ExitClass;
        Some(match self {
            // A bug of the coder or of its caller, not the input.
            ParityError::Coder(_) | ParityError::Length(_) => ExitClass::Machine,
            // A shape beyond the code, too few intact blocks: the parts given.
            ParityError::Unsupported { .. } | ParityError::TooFew { .. } => ExitClass::Input,
        })
    }
}

fn coder_err(e: reed_solomon_simd::Error) -> ParityError {
    ParityError::Coder(e.to_string())
}

/// A coder for stripes of `k` original and `n` recovery shards; it keeps its work space
/// between stripes (one per thread).
pub(crate) struct Coder {
    k: usize,
    n: usize,
    width: usize,
    enc: Option<ReedSolomonEncoder>,
    dec: Option<ReedSolomonDecoder>,
    /// The coefficients of the last erasure pattern decoded by coefficients.
    matrix: Option<Matrix>,
}

/// Each lost original as a combination of the shards given: `coef[o][u]` is the logarithm of
/// the factor of shard `used[u]` in lost original `lost[o]` (`None`: factor 0).
struct Matrix {
    used: Vec<usize>,
    lost: Vec<usize>,
    coef: Vec<Vec<Option<u16>>>,
}

impl std::fmt::Debug for Coder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Coder({}+{})", self.k, self.n)
    }
}

impl Coder {
    /// A coder for `k` originals and `n` recovery shards (`n` may be 0: nothing to code).
    pub(crate) fn new(k: usize, n: usize) -> Result<Coder, ParityError> {
        Self::with_budget(k, n, SLICE_BUDGET)
    }

    /// [`Coder::new`] whose column slices take at most `budget` bytes (two coders working side
    /// by side share [`SLICE_BUDGET`]).
    pub(crate) fn with_budget(k: usize, n: usize, budget: usize) -> Result<Coder, ParityError> {
        if k == 0 || (n > 0 && !ReedSolomonEncoder::supports(k, n)) {
            return Err(ParityError::Unsupported { k, n });
        }
        Ok(Coder {
            k,
            n,
            width: slice_width_within(k, n, budget),
            enc: None,
            dec: None,
            matrix: None,
        })
    }

    /// Bytes of each shard coded at once: a multiple of 64 such that the slices of every shard
    /// and the coder's work space stay within [`SLICE_BUDGET`].
    pub(crate) fn slice_width(&self) -> usize {
        self.width
    }

    /// The `n` recovery shards of `originals` (`k` slices of one even length) into `recovery`
    /// (`n` slices of that length).
    pub(crate) fn encode(
        &mut self,
        originals: &[&[u8]],
        recovery: &mut [&mut [u8]],
    ) -> Result<(), ParityError> {
        let len = check_lengths(originals.iter().map(|s| s.len()))?;
        if originals.len() != self.k || recovery.len() != self.n {
            return Err(ParityError::Coder(format!(
                "{} originals and {} recovery shards given to a {}+{} coder",
                originals.len(),
                recovery.len(),
                self.k,
                self.n
            )));
        }
        if recovery.iter().any(|r| r.len() != len) {
            return Err(ParityError::Length(len));
        }
        if self.n == 0 {
            return Ok(());
        }
        let width = self.slice_width();
        let (k, n) = (self.k, self.n);
        let mut c = 0;
        while c < len {
            let end = slice_end(c, len, width);
            let enc = match &mut self.enc {
                Some(e) => {
                    e.reset(k, n, end - c).map_err(coder_err)?;
                    e
                }
                None => self
                    .enc
                    .insert(ReedSolomonEncoder::new(k, n, end - c).map_err(coder_err)?),
            };
            for o in originals {
                enc.add_original_shard(&o[c..end]).map_err(coder_err)?;
            }
            let result = enc.encode().map_err(coder_err)?;
            for (r, out) in result.recovery_iter().zip(recovery.iter_mut()) {
                out[c..end].copy_from_slice(r);
            }
            c = end;
        }
        Ok(())
    }

    /// Fill every erased shard of a stripe: `shards` holds the `k` originals then the `n`
    /// recovery shards, `None` where erased; at least `k` must be present, all of `len` bytes.
    /// Erased originals are decoded, erased recovery shards encoded again from the originals.
    pub(crate) fn reconstruct(
        &mut self,
        shards: &mut [Option<Vec<u8>>],
        len: usize,
    ) -> Result<(), ParityError> {
        let (k, n) = (self.k, self.n);
        if shards.len() != k + n {
            return Err(ParityError::Coder(format!(
                "{} shards given to a {k}+{n} coder",
                shards.len()
            )));
        }
        let missing: Vec<usize> = (0..k).filter(|&i| shards[i].is_none()).collect();
        if !missing.is_empty() {
            let mut restored: Vec<Vec<u8>> = missing.iter().map(|_| vec![0u8; len]).collect();
            {
                let present: Vec<Option<&[u8]>> = shards.iter().map(|s| s.as_deref()).collect();
                let mut outs: Vec<(usize, &mut [u8])> = missing
                    .iter()
                    .copied()
                    .zip(restored.iter_mut().map(|r| &mut r[..]))
                    .collect();
                self.decode(&present, &mut outs)?;
            }
            for (i, r) in missing.iter().zip(restored) {
                shards[*i] = Some(r);
            }
        }
        if shards[k..].iter().any(|s| s.is_none()) {
            let originals: Vec<&[u8]> = shards[..k].iter().flatten().map(|s| &s[..]).collect();
            let mut recovery = vec![vec![0u8; len]; n];
            let mut outs: Vec<&mut [u8]> = recovery.iter_mut().map(|r| &mut r[..]).collect();
            self.encode(&originals, &mut outs)?;
            for (slot, r) in shards[k..].iter_mut().zip(recovery) {
                if slot.is_none() {
                    *slot = Some(r);
                }
            }
        }
        Ok(())
    }

    /// Decode the erased originals of a stripe: `shards` holds the `k` originals then the `n`
    /// recovery shards (`None` where erased, at least `k` present, all of one even length);
    /// each `(index, buffer)` of `outputs` (an erased original) is filled. Column slice by
    /// column slice: no copy of the shards is made.
    pub(crate) fn decode(
        &mut self,
        shards: &[Option<&[u8]>],
        outputs: &mut [(usize, &mut [u8])],
    ) -> Result<(), ParityError> {
        let (k, n) = (self.k, self.n);
        if shards.len() != k + n || outputs.iter().any(|(i, _)| *i >= k) {
            return Err(ParityError::Coder(format!(
                "{} shards given to a {k}+{n} coder",
                shards.len()
            )));
        }
        let len = check_lengths(
            shards
                .iter()
                .flatten()
                .map(|s| s.len())
                .chain(outputs.iter().map(|(_, o)| o.len())),
        )?;
        let have = shards.iter().filter(|s| s.is_some()).count();
        if have < k {
            return Err(ParityError::TooFew { have, need: k });
        }
        if outputs.is_empty() {
            return Ok(());
        }
        if outputs.len() <= MATRIX_MAX_LOST && len >= 64 {
            let body = len / 64 * 64;
            self.decode_by_matrix(shards, outputs, body)?;
            if body == len {
                return Ok(());
            }
            // The partial last 64-byte chunk, laid out on its own: the FFT decoder.
            let tail: Vec<Option<&[u8]>> = shards.iter().map(|s| s.map(|s| &s[body..])).collect();
            let mut outs: Vec<(usize, &mut [u8])> = outputs
                .iter_mut()
                .map(|(i, o)| (*i, &mut o[body..]))
                .collect();
            return self.decode_by_fft(&tail, &mut outs, len - body);
        }
        self.decode_by_fft(shards, outputs, len)
    }

    /// [`Coder::decode`] with the FFT decoder, column slice by column slice.
    fn decode_by_fft(
        &mut self,
        shards: &[Option<&[u8]>],
        outputs: &mut [(usize, &mut [u8])],
        len: usize,
    ) -> Result<(), ParityError> {
        let (k, n) = (self.k, self.n);
        let width = self.slice_width();
        let mut c = 0;
        while c < len {
            let end = slice_end(c, len, width);
            let dec = match &mut self.dec {
                Some(d) => {
                    d.reset(k, n, end - c).map_err(coder_err)?;
                    d
                }
                None => self
                    .dec
                    .insert(ReedSolomonDecoder::new(k, n, end - c).map_err(coder_err)?),
            };
            // Exactly k shards: every present original, then recovery shards.
            let mut given = 0;
            for (i, s) in shards.iter().enumerate() {
                if given == k {
                    break;
                }
                let Some(s) = s else { continue };
                if i < k {
                    dec.add_original_shard(i, &s[c..end]).map_err(coder_err)?;
                } else {
                    dec.add_recovery_shard(i - k, &s[c..end])
                        .map_err(coder_err)?;
                }
                given += 1;
            }
            let result = dec.decode().map_err(coder_err)?;
            for (i, out) in outputs.iter_mut() {
                let r = result
                    .restored_original(*i)
                    .ok_or_else(|| ParityError::Coder(format!("original {i} not restored")))?;
                out[c..end].copy_from_slice(r);
            }
            c = end;
        }
        Ok(())
    }

    /// The first `body` bytes (a multiple of 64) of the erased originals in `outputs`, as
    /// combinations of the first `k` shards present (see the module docs).
    fn decode_by_matrix(
        &mut self,
        shards: &[Option<&[u8]>],
        outputs: &mut [(usize, &mut [u8])],
        body: usize,
    ) -> Result<(), ParityError> {
        let used: Vec<usize> = (0..shards.len())
            .filter(|&i| shards[i].is_some())
            .take(self.k)
            .collect();
        let lost: Vec<usize> = outputs.iter().map(|(i, _)| *i).collect();
        if self
            .matrix
            .as_ref()
            .is_none_or(|m| m.used != used || m.lost != lost)
        {
            self.matrix = Some(self.matrix_for(used, lost)?);
        }
        let Some(m) = &self.matrix else {
            return Err(ParityError::Coder("no coefficients".into()));
        };
        let engine = DefaultEngine::new();
        let mut scratch = vec![[0u8; 64]; MATRIX_PIECE / 64];
        let mut c = 0;
        while c < body {
            let end = (c + MATRIX_PIECE).min(body);
            let tmp = &mut scratch[..(end - c) / 64];
            for (_, out) in outputs.iter_mut() {
                out[c..end].fill(0);
            }
            // Each shard copied once, then multiplied from one lost original's factor to the
            // next (x·a, then ·(b/a): one multiply each).
            for (u, &i) in m.used.iter().enumerate() {
                let Some(shard) = shards[i] else { continue };
                let (src, _) = shard[c..end].as_chunks::<64>();
                tmp.copy_from_slice(src);
                let mut at: u32 = 0;
                for (o, (_, out)) in outputs.iter_mut().enumerate() {
                    let Some(log) = m.coef[o][u] else { continue };
                    let step =
                        (u32::from(log) + u32::from(GF_MODULUS) - at) % u32::from(GF_MODULUS);
                    engine.mul(tmp, step as u16);
                    at = u32::from(log);
                    let (out, _) = out[c..end].as_chunks_mut::<64>();
                    utils::xor(out, tmp);
                }
            }
            c = end;
        }
        Ok(())
    }

    /// The coefficients of `lost` in terms of `used` (`k` shards): a decode in which shard
    /// `used[u]` holds the symbol 1 at position `u` and 0 elsewhere, so position `u` of each
    /// restored original is its factor of that shard. Positions are independent 64 bytes at a
    /// time (32 symbols), so the decode runs in pieces of the coder's slice width: its work
    /// space stays within the coder's budget whatever `k` (one decode of all `k` positions at
    /// once took `2 × (k + n)` rounded up to a power of two times `k / 16` bytes: 128 MiB for
    /// the two coders of a set-wide code of 4,096 blocks, 16 GiB at the code's 65,536).
    fn matrix_for(&mut self, used: Vec<usize>, lost: Vec<usize>) -> Result<Matrix, ParityError> {
        let (k, n) = (self.k, self.n);
        let len = k.div_ceil(32) * 64;
        let piece = self.width.min(len);
        let position = |u: usize| (u / 32 * 64 + u % 32, u / 32 * 64 + 32 + u % 32);
        let log = &tables::get_exp_log().log;
        let mut coef = vec![vec![None; used.len()]; lost.len()];
        let mut unit = vec![0u8; piece];
        let zeros = vec![0u8; piece];
        let mut p0 = 0;
        while p0 < len {
            let w = piece.min(len - p0);
            // The shards whose unit symbol falls in bytes p0..p0 + w.
            let (u0, u1) = (p0 / 64 * 32, ((p0 + w) / 64 * 32).min(used.len()));
            let dec = match &mut self.dec {
                Some(d) => {
                    d.reset(k, n, w).map_err(coder_err)?;
                    d
                }
                None => self
                    .dec
                    .insert(ReedSolomonDecoder::new(k, n, w).map_err(coder_err)?),
            };
            for (u, &i) in used.iter().enumerate() {
                let shard: &[u8] = if (u0..u1).contains(&u) {
                    unit[..w].fill(0);
                    unit[position(u).0 - p0] = 1;
                    &unit[..w]
                } else {
                    &zeros[..w]
                };
                if i < k {
                    dec.add_original_shard(i, shard).map_err(coder_err)?;
                } else {
                    dec.add_recovery_shard(i - k, shard).map_err(coder_err)?;
                }
            }
            let result = dec.decode().map_err(coder_err)?;
            for (o, &lo_) in lost.iter().enumerate() {
                let r = result
                    .restored_original(lo_)
                    .ok_or_else(|| ParityError::Coder(format!("original {lo_} not restored")))?;
                for (u, c) in coef[o].iter_mut().enumerate().take(u1).skip(u0) {
                    let (lo, hi) = position(u);
                    let v = u16::from(r[lo - p0]) | u16::from(r[hi - p0]) << 8;
                    *c = (v != 0).then(|| log[usize::from(v)]);
                }
            }
            p0 += w;
        }
        Ok(Matrix { used, lost, coef })
    }
}

fn slice_width_within(k: usize, n: usize, budget: usize) -> usize {
    let shards = k + n;
    let work = 2 * shards.next_power_of_two();
    ((budget / (shards + work)) / 64 * 64).max(64)
}

/// The end of the slice that starts at `c`: `c + width`, or `len` when the rest fits (so the
/// shard's partial last 64-byte chunk is always in the last slice).
fn slice_end(c: usize, len: usize, width: usize) -> usize {
    if len - c <= width {
        len
    } else {
        c + width
    }
}

fn check_lengths(mut lens: impl Iterator<Item = usize>) -> Result<usize, ParityError> {
    let first = lens.next().unwrap_or(0);
    if first == 0 || !first.is_multiple_of(2) {
        return Err(ParityError::Length(first));
    }
    match lens.find(|&l| l != first) {
        Some(other) => Err(ParityError::Length(other)),
        None => Ok(first),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encode_whole(k: usize, n: usize, originals: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let len = originals[0].len();
        let mut enc = ReedSolomonEncoder::new(k, n, len).unwrap();
        for o in originals {
            enc.add_original_shard(o).unwrap();
        }
        let recovery = enc
            .encode()
            .unwrap()
            .recovery_iter()
            .map(|r| r.to_vec())
            .collect();
        recovery
    }

    /// A coder that slices at `width` bytes, as one with many parts or large blocks does.
    fn narrow(k: usize, n: usize, width: usize) -> Coder {
        Coder {
            width,
            ..Coder::new(k, n).unwrap()
        }
    }

    fn encode_sliced(k: usize, n: usize, originals: &[Vec<u8>], width: usize) -> Vec<Vec<u8>> {
        let len = originals[0].len();
        let mut recovery = vec![vec![0u8; len]; n];
        let parts: Vec<&[u8]> = originals.iter().map(|o| &o[..]).collect();
        let mut refs: Vec<&mut [u8]> = recovery.iter_mut().map(|o| &mut o[..]).collect();
        narrow(k, n, width).encode(&parts, &mut refs).unwrap();
        recovery
    }

    prop_compose! {
        /// k originals of one even length (1..=3000 bytes), n recovery, an erasure pattern of
        /// at most n shards, and a slice width (a multiple of 64).
        fn stripe()(k in 1usize..12, n in 1usize..6, half in 1usize..1500, seed in any::<u64>(),
                    width64 in 1usize..8)
            -> (usize, usize, Vec<Vec<u8>>, Vec<usize>, usize) {
            let len = half * 2;
            let mut x = seed | 1;
            let mut next = move || { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x };
            let originals: Vec<Vec<u8>> =
                (0..k).map(|_| (0..len).map(|_| next() as u8).collect()).collect();
            let mut all: Vec<usize> = (0..k + n).collect();
            for i in (1..all.len()).rev() {
                all.swap(i, (next() as usize) % (i + 1));
            }
            let lose = (next() as usize) % (n + 1);
            all.truncate(lose);
            (k, n, originals, all, width64 * 64)
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Any erasure of up to n shards is rebuilt exactly, originals and recovery alike, and
        /// coding in column slices gives the bytes of coding whole shards.
        #[test]
        fn any_n_erasures_are_rebuilt_and_slicing_changes_nothing(
            (k, n, originals, lost, width) in stripe()
        ) {
            let whole = encode_whole(k, n, &originals);
            prop_assert_eq!(&encode_sliced(k, n, &originals, width), &whole);
            let mut c = narrow(k, n, width);
            let len = originals[0].len();
            let mut shards: Vec<Option<Vec<u8>>> =
                originals.iter().chain(&whole).cloned().map(Some).collect();
            for &i in &lost {
                shards[i] = None;
            }
            c.reconstruct(&mut shards, len).unwrap();
            for (i, s) in shards.iter().enumerate() {
                let want = if i < k { &originals[i] } else { &whole[i - k] };
                prop_assert_eq!(s.as_ref(), Some(want), "shard {}", i);
            }
        }

        /// Decoding by coefficients gives the FFT decoder's bytes, for stripes of more than 32
        /// shards too (the unit symbols then sit in several 64-byte chunks) and for shards
        /// with a partial last chunk, and with the coefficients worked out in pieces (a coder
        /// of the smallest budget: 64-byte pieces, the unit symbols of 32 shards each).
        #[test]
        fn coefficients_decode_as_the_fft_decoder_does(
            k in 1usize..80, n in 1usize..5, half in 32usize..700, seed in any::<u64>(),
            small in any::<bool>()
        ) {
            let len = half * 2;
            let mut x = seed | 1;
            let mut next = move || { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x };
            let originals: Vec<Vec<u8>> =
                (0..k).map(|_| (0..len).map(|_| next() as u8).collect()).collect();
            let recovery = encode_whole(k, n, &originals);
            let mut all: Vec<usize> = (0..k).collect();
            for i in (1..all.len()).rev() {
                all.swap(i, (next() as usize) % (i + 1));
            }
            all.truncate(1 + (next() as usize) % n.min(k).min(MATRIX_MAX_LOST));
            let shards: Vec<Option<&[u8]>> = originals.iter().chain(&recovery)
                .enumerate()
                .map(|(i, s)| (!all.contains(&i)).then_some(&s[..]))
                .collect();
            let mut by_matrix = vec![vec![0u8; len]; all.len()];
            let mut by_fft = by_matrix.clone();
            let mut c = Coder::with_budget(k, n, if small { 1 } else { SLICE_BUDGET }).unwrap();
            let mut outs: Vec<(usize, &mut [u8])> =
                all.iter().copied().zip(by_matrix.iter_mut().map(|b| &mut b[..])).collect();
            c.decode(&shards, &mut outs).unwrap();
            let mut outs: Vec<(usize, &mut [u8])> =
                all.iter().copied().zip(by_fft.iter_mut().map(|b| &mut b[..])).collect();
            c.decode_by_fft(&shards, &mut outs, len).unwrap();
            prop_assert_eq!(&by_matrix, &by_fft);
            for (o, &i) in all.iter().enumerate() {
                prop_assert!(by_matrix[o] == originals[i], "original {}", i);
            }
        }

        /// One erasure more than n is refused, never guessed.
        #[test]
        fn more_than_n_erasures_are_refused((k, n, originals, _lost, _w) in stripe()) {
            prop_assume!(k > 0);
            let whole = encode_whole(k, n, &originals);
            let len = originals[0].len();
            let mut shards: Vec<Option<Vec<u8>>> =
                originals.iter().chain(&whole).cloned().map(Some).collect();
            for s in shards.iter_mut().take(n + 1) {
                *s = None;
            }
            let e = Coder::new(k, n).unwrap().reconstruct(&mut shards, len).unwrap_err();
            let too_few = matches!(e, ParityError::TooFew { have, need } if have == k - 1 && need == k);
            prop_assert!(too_few, "{}", e);
        }
    }

    #[test]
    fn slices_stay_within_the_budget() {
        for (k, n) in [(1, 1), (10, 2), (1000, 200), (30000, 30000)] {
            let w = slice_width_within(k, n, SLICE_BUDGET);
            assert_eq!(w % 64, 0);
            let shards = k + n;
            assert!(w == 64 || (shards + 2 * shards.next_power_of_two()) * w <= SLICE_BUDGET);
        }
        assert!(Coder::new(40000, 30000).is_err());
        assert!(Coder::new(0, 1).is_err());
    }
}
