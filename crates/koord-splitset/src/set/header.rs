//! The header area at the start of every part of a v2 set:
//!
//! ```text
//! koord-bundle-split v2\n
//! part <index> of <parts> set <set id> check <8 hex>\n
//! <decimal length of JSON>\n<JSON>\n
//! <decimal length of signature, 0 when unsigned>\n<minisign signature of the JSON>\n
//! <decimal length of block table>\n<block table>
//! zero bytes up to dataOffset
//! ```
//!
//! The set id is the first 16 bytes of the JSON's sha256 (hex); `check` is the first 4 bytes of
//! the sha256 of the rest of its line, so a damaged part line is never read as another index.
//! A copy is intact when its JSON hashes to its set id and its table to the JSON's
//! `blockTable`; the signature, when checked, covers the JSON.

use super::is_plain_file_name;
use super::{
    Geometry, SetError, SetHeader, ALIGN, BLOCK_DIGEST, CODE, CODE_SPREAD, DIGEST_LEN, FORMAT,
    MAX_BLOCK, MAX_JSON, MAX_LENGTH_LINE, MAX_MAGIC_LINE, MAX_PARTS, MAX_PART_LINE, MAX_SIG,
    MAX_SPREAD_BLOCK, MAX_TABLE, MIN_BLOCK, STRIPE_BUDGET,
};
use crate::oci::Digest;
use crate::sign;
use sha2::Digest as _;
use std::io::{self, BufRead, BufReader, Read, Seek as _};
use std::path::Path;

/// First line of every part.
pub const MAGIC: &str = "koord-bundle-split v2";

/// Which part a file says it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ident {
    /// Its index in the set.
    pub(crate) index: usize,
    /// Parts in the set.
    pub(crate) count: usize,
    /// The set id.
    pub(crate) set: String,
}

/// One part's copy of the header, checked for integrity (not yet for its signature).
#[derive(Debug, Clone)]
pub(crate) struct Copy {
    /// The JSON.
    pub(crate) json: Vec<u8>,
    /// The signature (empty when unsigned).
    pub(crate) sig: Vec<u8>,
    /// The header.
    pub(crate) header: SetHeader,
    /// The block table.
    pub(crate) table: Vec<u8>,
    /// The layout.
    pub(crate) geometry: Geometry,
}

/// The set id of a header JSON.
pub(crate) fn set_id(json: &[u8]) -> String {
    hex::encode(&sha2::Sha256::digest(json)[..16])
}

fn line_check(rest: &str) -> String {
    hex::encode(&sha2::Sha256::digest(rest.as_bytes())[..4])
}

/// The part line of part `index`.
pub(crate) fn part_line(index: usize, count: usize, set: &str) -> String {
    let rest = format!("part {index} of {count} set {set}");
    let check = line_check(&rest);
    format!("{rest} check {check}\n")
}

fn parse_part_line(line: &str) -> Option<Ident> {
    let (rest, check) = line.rsplit_once(" check ")?;
    if line_check(rest) != check {
        return None;
    }
    let mut w = rest.split(' ');
    let (Some("part"), Some(i), Some("of"), Some(c), Some("set"), Some(set), None) = (
        w.next(),
        w.next(),
        w.next(),
        w.next(),
        w.next(),
        w.next(),
        w.next(),
    ) else {
        return None;
    };
    Some(Ident {
        index: i.parse().ok()?,
        count: c.parse().ok()?,
        set: set.to_string(),
    })
}

/// The header area of part `index`: the lines, JSON, signature and table, padded with zeros
/// to `data_offset` (or unpadded when longer: the caller checks).
pub(crate) fn area(json: &[u8], sig: &[u8], table: &[u8], index: usize, count: usize) -> Vec<u8> {
    let mut out = format!("{MAGIC}\n").into_bytes();
    out.extend_from_slice(part_line(index, count, &set_id(json)).as_bytes());
    out.extend_from_slice(format!("{}\n", json.len()).as_bytes());
    out.extend_from_slice(json);
    out.extend_from_slice(format!("\n{}\n", sig.len()).as_bytes());
    out.extend_from_slice(sig);
    out.extend_from_slice(format!("\n{}\n", table.len()).as_bytes());
    out.extend_from_slice(table);
    out
}

fn read_line(r: &mut impl BufRead, max: u64) -> io::Result<Option<String>> {
    let mut line = Vec::new();
    r.by_ref().take(max).read_until(b'\n', &mut line)?;
    if line.last() != Some(&b'\n') {
        return Ok(None);
    }
    line.pop();
    Ok(String::from_utf8(line).ok())
}

fn read_exact_bounded(r: &mut impl Read, len: u64, max: u64) -> Result<Vec<u8>, String> {
    if len > max {
        return Err(format!(
            "a length of {len} bytes is beyond the {max} allowed"
        ));
    }
    // Grown as bytes arrive, not reserved from a length not yet checked.
    let mut out = Vec::with_capacity(len.min(1 << 20) as usize);
    r.take(len)
        .read_to_end(&mut out)
        .map_err(|e| e.to_string())?;
    if out.len() as u64 != len {
        return Err("truncated".into());
    }
    Ok(out)
}

/// The part line of the file at `path`, if it is a v2 part whose part line is intact.
/// `Err` only when the file cannot be read at all.
pub(crate) fn read_ident(path: &Path) -> io::Result<Option<Ident>> {
    let f = crate::bounded::open_input(path)?;
    if !f.metadata()?.is_file() {
        return Ok(None);
    }
    let mut r = BufReader::with_capacity(512, f);
    if read_line(&mut r, MAX_MAGIC_LINE)?.as_deref() != Some(MAGIC) {
        return Ok(None);
    }
    Ok(read_line(&mut r, MAX_PART_LINE)?
        .as_deref()
        .and_then(parse_part_line))
}

/// Whether the file at `path` starts with the v2 magic line.
pub(crate) fn is_v2(head: &[u8]) -> bool {
    head.starts_with(format!("{MAGIC}\n").as_bytes())
}

/// Read and check the header copy of the file at `path`. `Err` says why it is not intact.
pub(crate) fn read_copy(path: &Path) -> Result<Copy, String> {
    let f = crate::bounded::open_input(path).map_err(|e| e.to_string())?;
    let mut r = BufReader::with_capacity(64 * 1024, f);
    let line = |r: &mut BufReader<std::fs::File>, max| {
        read_line(r, max)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "a header line is damaged or truncated".to_string())
    };
    if line(&mut r, MAX_MAGIC_LINE)? != MAGIC {
        return Err("it does not start with the v2 split magic line".into());
    }
    let ident = read_line(&mut r, MAX_PART_LINE)
        .map_err(|e| e.to_string())?
        .as_deref()
        .and_then(parse_part_line);
    let len = |s: String| {
        s.parse::<u64>()
            .map_err(|_| "a length line is damaged".to_string())
    };
    let json_len = len(line(&mut r, MAX_LENGTH_LINE)?)?;
    let json = read_exact_bounded(&mut r, json_len, MAX_JSON)?;
    if !line(&mut r, 1)?.is_empty() {
        return Err("no line break after the JSON".into());
    }
    let sig_len = len(line(&mut r, MAX_LENGTH_LINE)?)?;
    let sig = read_exact_bounded(&mut r, sig_len, MAX_SIG as u64)?;
    if !line(&mut r, 1)?.is_empty() {
        return Err("no line break after the signature".into());
    }
    let id = set_id(&json);
    if let Some(i) = &ident {
        if i.set != id {
            return Err(format!(
                "its JSON does not hash to its set id {} (damaged)",
                i.set
            ));
        }
    }
    let header: SetHeader =
        serde_json::from_slice(&json).map_err(|e| format!("its JSON does not parse: {e}"))?;
    let geometry = geometry_of(&header)?;
    let table_len = len(line(&mut r, MAX_LENGTH_LINE)?)?;
    if table_len != header.block_table.size {
        return Err("the block table's length differs from the JSON's".into());
    }
    let table = read_exact_bounded(&mut r, table_len, MAX_TABLE)?;
    if Digest::of(&table) != header.block_table.sha256 {
        return Err("its block table does not match the JSON's sha256 (damaged)".into());
    }
    let used = r.stream_position().map_err(|e| e.to_string())?;
    if used > header.data_offset {
        return Err("the header area overlaps the data".into());
    }
    if ident.as_ref().is_some_and(|i| i.count != geometry.parts()) {
        return Err("its part line and JSON disagree on the number of parts".into());
    }
    Ok(Copy {
        json,
        sig,
        header,
        table,
        geometry,
    })
}

/// The layout a header describes, after checking everything a reader relies on (a header is
/// untrusted until its signature is checked, and even then must not make a reader allocate or
/// loop without bound).
pub(crate) fn geometry_of(h: &SetHeader) -> Result<Geometry, String> {
    let (k, n, b) = (h.data_parts, h.parity_parts, h.block_size);
    let spread = h.code == CODE_SPREAD;
    if h.format != FORMAT || !(h.code == CODE || spread && n > 0) || h.block_digest != BLOCK_DIGEST
    {
        return Err(format!(
            "unknown format, code or block digest ({}, {}, {})",
            crate::text::printable(&h.format),
            crate::text::printable(&h.code),
            crate::text::printable(&h.block_digest)
        ));
    }
    if k == 0 || h.parts.len() != k.saturating_add(n) || h.parts.len() > MAX_PARTS {
        return Err("bad part counts".into());
    }
    let max_block = if spread { MAX_SPREAD_BLOCK } else { MAX_BLOCK };
    if !b.is_power_of_two() || !(MIN_BLOCK..=max_block).contains(&b) {
        return Err(format!(
            "block size {b} is not a power of two in 4 KiB..{} MiB",
            max_block >> 20
        ));
    }
    if !spread
        && ((h.parts.len() as u64) * b > STRIPE_BUDGET
            || (n > 0 && super::super::parity::Coder::new(k, n).is_err()))
    {
        return Err("a stripe of this set is beyond the memory bound or the code".into());
    }
    if !h.data_offset.is_multiple_of(ALIGN) || h.data_offset < ALIGN || h.data_offset >= h.part_size
    {
        return Err("bad data offset".into());
    }
    if !is_plain_file_name(&h.bundle.file) {
        return Err(format!(
            "the bundle's name \"{}\" is not a plain file name",
            crate::text::printable(&h.bundle.file)
        ));
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, p) in h.parts.iter().enumerate() {
        if !is_plain_file_name(&p.file) || !names.insert(p.file.as_str()) {
            return Err(format!(
                "part name \"{}\" is not a plain file name, or repeated",
                crate::text::printable(&p.file)
            ));
        }
        // The one name a part may have: a header cannot make repair write to another file.
        if !super::is_part_file_name(&p.file, &h.bundle.file, i, k) {
            return Err(format!(
                "part {i} is named \"{}\", but part {i} of {} is {} (a part's name is the bundle's name and its number)",
                crate::text::printable(&p.file),
                crate::text::printable(&h.bundle.file),
                crate::text::printable(&super::part_file_name(&h.bundle.file, i, k)),
            ));
        }
        if h.data_offset
            .checked_add(p.size)
            .is_none_or(|end| end > h.part_size)
        {
            return Err(format!("part {} is larger than the part size", p.file));
        }
    }
    let stride = h.parts[0].size;
    let g = if spread {
        Geometry::new_spread(h.bundle.size, stride, n, b, h.data_offset)
    } else {
        Geometry::new(h.bundle.size, stride, n, b, h.data_offset)
    };
    let sizes: Vec<u64> = h.parts.iter().map(|p| p.size).collect();
    if g.sizes != sizes || g.k != k {
        return Err("the part sizes do not add up to the bundle".into());
    }
    if spread && super::super::parity::Coder::new(g.originals(), g.recovery()).is_err() {
        return Err("the set-wide code has more blocks than the code can take".into());
    }
    let table = g.total_blocks().checked_mul(DIGEST_LEN as u64);
    if table != Some(h.block_table.size) || h.block_table.size > MAX_TABLE {
        return Err("the block table's size does not fit the parts".into());
    }
    Ok(g)
}

/// The signature of the set's header that `pk` verifies: this copy's, else another part's copy
/// of the same JSON (a signature damaged in one part is read from another). `None` when the
/// header is not signed.
pub(crate) fn verify_any(
    set: &super::Set,
    pk: &minisign::PublicKey,
) -> Result<Option<Vec<u8>>, SetError> {
    let sig_err = |source| SetError::Signature {
        path: set.path.clone(),
        source,
    };
    let first = match &set.signature {
        None => return Ok(None),
        Some(sig) => match sign::verify(pk, sig, &set.json) {
            Ok(_) => return Ok(Some(sig.clone())),
            Err(e) => e,
        },
    };
    // This copy's signature may be damaged: another part's copy of the same JSON will do.
    for slot in &set.slots {
        if slot.file.is_none() || slot.path == set.path {
            continue;
        }
        if let Ok(c) = read_copy(&slot.path) {
            if c.json == set.json && !c.sig.is_empty() && sign::verify(pk, &c.sig, &c.json).is_ok()
            {
                return Ok(Some(c.sig));
            }
        }
    }
    Err(sig_err(first))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::set::{PartEntry, PartInfo, TableInfo};

    /// The header a writer makes for `g` (digests left empty: `geometry_of` does not read them).
    fn header_of(g: &Geometry, total: u64, code: &str) -> SetHeader {
        SetHeader {
            format: FORMAT.into(),
            bundle: PartInfo {
                file: "b.tar".into(),
                size: total,
                sha256: Digest::of(b""),
            },
            part_size: g.data_offset + g.sizes.iter().max().unwrap(),
            data_offset: g.data_offset,
            block_size: g.block,
            data_parts: g.k,
            parity_parts: g.n,
            code: code.into(),
            parts: g
                .sizes
                .iter()
                .enumerate()
                .map(|(i, &size)| PartEntry {
                    file: format!("b.tar.part{i:03}"),
                    size,
                })
                .collect(),
            block_digest: BLOCK_DIGEST.into(),
            block_table: TableInfo {
                size: g.total_blocks() * DIGEST_LEN as u64,
                sha256: Digest::of(b""),
            },
        }
    }

    #[test]
    fn a_set_wide_header_is_checked_before_anything_is_sized_from_it() {
        let total = 10 << 20;
        let g = Geometry::new_spread(total, 1 << 20, 2, 64 << 10, 4096);
        assert_eq!(
            geometry_of(&header_of(&g, total, CODE_SPREAD)),
            Ok(g.clone())
        );
        // A set-wide code without parity parts.
        let g0 = Geometry::new_spread(total, 1 << 20, 0, 64 << 10, 4096);
        let e = geometry_of(&header_of(&g0, total, CODE_SPREAD)).unwrap_err();
        assert!(e.contains("unknown format, code"), "{e}");
        // Blocks beyond 64 MiB.
        let big = Geometry::new_spread(1 << 30, 512 << 20, 1, 128 << 20, 4096);
        let e = geometry_of(&header_of(&big, 1 << 30, CODE_SPREAD)).unwrap_err();
        assert!(e.contains("not a power of two in 4 KiB..64 MiB"), "{e}");
        // More blocks than the code takes (65 536 data blocks and 4096 parity blocks).
        let many = Geometry::new_spread(256 << 20, 16 << 20, 1, 4096, 4096);
        let e = geometry_of(&header_of(&many, 256 << 20, CODE_SPREAD)).unwrap_err();
        assert!(e.contains("more blocks than the code can take"), "{e}");
        // Parity parts that do not hold whole blocks.
        let mut h = header_of(&g, total, CODE_SPREAD);
        h.parts[11].size -= 2;
        let e = geometry_of(&h).unwrap_err();
        assert!(e.contains("do not add up"), "{e}");
    }

    /// Issue 30 item 4: a part's name is the bundle's name and its number, nothing a header
    /// says otherwise (an unsigned header naming its part `victim.txt` had repair rewrite it).
    #[test]
    fn a_part_is_named_by_the_bundle_and_its_number_only() {
        let total = 10 << 20;
        let g = Geometry::new(total, 1 << 20, 2, 64 << 10, 4096);
        let mut h = header_of(&g, total, CODE);
        assert_eq!(geometry_of(&h), Ok(g.clone()));
        // Parity parts under their own names (and, from older writers, as NAME.partNNN).
        h.parts[10].file = "b.tar.parity000".into();
        h.parts[11].file = "b.tar.parity001".into();
        assert_eq!(geometry_of(&h), Ok(g.clone()));
        for (i, bad) in [
            (1, "victim.txt"),
            (1, "b.tar.part1"),
            (10, "b.tar.parity002"),
            (3, "b.tar.parity000"),
            (0, "c.tar.part000"),
        ] {
            let mut h = header_of(&g, total, CODE);
            h.parts[i].file = bad.into();
            let e = geometry_of(&h).unwrap_err();
            assert!(
                e.contains("a part's name is the bundle's name"),
                "{bad}: {e}"
            );
        }
        let mut h = header_of(&g, total, CODE);
        h.bundle.file = "../b.tar".into();
        let e = geometry_of(&h).unwrap_err();
        assert!(e.contains("not a plain file name"), "{e}");
    }
    #[test]
    fn part_lines_check_themselves() {
        let l = part_line(3, 12, "00112233445566778899aabbccddeeff");
        let l = l.trim_end();
        assert_eq!(
            parse_part_line(l),
            Some(Ident {
                index: 3,
                count: 12,
                set: "00112233445566778899aabbccddeeff".into()
            })
        );
        // One digit changed: refused, not read as part 5.
        assert_eq!(parse_part_line(&l.replacen("part 3", "part 5", 1)), None);
        assert_eq!(parse_part_line("part 3 of 12"), None);
    }
}
