#![no_main]
//! The header and parts of a split bundle on untrusted bytes.
//!
//! Input: the files of a split bundle (format v1 or v2), separated by the marker `\0PART\0`: the
//! first is written as `b.tar.part000` (the header and the first data), the others as
//! `b.tar.part001`, ... in a fresh directory `parts/` of a temporary root. Then `BundleFile::open`, the sequential reader
//! (bounded), `check_parts`, `read_range`, `verify_header` with a fixed key, and `join` into
//! `out/`.
//!
//! Checked on top of "no panic":
//! * every part an accepted header names lies in `parts/` and has a plain file name;
//! * nothing is ever created outside `parts/` and `out/` (the header's names cannot steer a
//!   write), and `join` writes only the file it was given;
//! * the parts' data adds up to the size `open` reports.

use koord_splitset::{self as parts, BundleFile};
use libfuzzer_sys::fuzz_target;
use std::io::Read;

const MARKER: &[u8] = b"\0PART\0";

/// One key for every run (key generation is slow).
fn key() -> &'static minisign::PublicKey {
    static K: std::sync::OnceLock<minisign::PublicKey> = std::sync::OnceLock::new();
    K.get_or_init(|| {
        minisign::KeyPair::generate_unencrypted_keypair()
            .expect("a key pair")
            .pk
    })
}

fn split_input(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    while let Some(p) = rest.windows(MARKER.len()).position(|w| w == MARKER) {
        out.push(&rest[..p]);
        rest = &rest[p + MARKER.len()..];
        if out.len() == 8 {
            break;
        }
    }
    out.push(rest);
    out
}

fn listing(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = walk(dir)
        .into_iter()
        .map(|p| p.strip_prefix(dir).unwrap().to_string_lossy().to_string())
        .collect();
    v.sort();
    v
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            }
            out.push(p);
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("parts");
    let out = root.path().join("out");
    std::fs::create_dir(&dir).unwrap();
    std::fs::create_dir(&out).unwrap();
    for (i, f) in split_input(data).iter().enumerate() {
        std::fs::write(dir.join(format!("b.tar.part{i:03}")), f).unwrap();
    }
    let first = dir.join("b.tar.part000");
    let before = listing(root.path());

    if let Ok(bf) = BundleFile::open(&first) {
        if let Some(h) = &bf.header {
            for p in &h.parts {
                assert!(parts::is_plain_file_name(&p.file), "{:?} accepted", p.file);
            }
        }
        if let Some(s) = &bf.set {
            for p in &s.header.parts {
                assert!(parts::is_plain_file_name(&p.file), "{:?} accepted", p.file);
            }
        }
        for seg in &bf.parts {
            assert_eq!(seg.path.parent(), Some(dir.as_path()), "{:?}", seg.path);
        }
        assert_eq!(bf.parts.iter().map(|s| s.len).sum::<u64>(), bf.size);
        if let Ok(r) = bf.reader() {
            let mut sink = Vec::new();
            let _ = r.take(1 << 20).read_to_end(&mut sink);
        }
        let _ = bf.check_parts();
        let _ = bf.read_range(0, bf.size.min(4096));
        let _ = bf.read_range(bf.size.saturating_sub(10), 100);
        let _ = bf.verify_header(key());
        let joined = out.join("joined.tar");
        let _ = parts::join(&bf, &joined);
    }
    // Nothing appeared anywhere but out/joined.tar.
    let mut after = listing(root.path());
    after.retain(|p| p != "out/joined.tar");
    assert_eq!(before, after, "files appeared or vanished");
});
