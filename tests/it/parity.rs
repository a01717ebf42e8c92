//! Split sets with parity parts (issue 20): parts lost, damaged, truncated, renamed, swapped or
//! from another set, read and repaired by the real binary; results checked byte for byte
//! against the bundle and the pristine parts, with skopeo (load, serve) and minisign (the
//! header's signature, from a part other than the first).
//!
//! The set: the small 1.8.0 bundle of the test environment (about 1.3 MB) in parts of 256 KiB
//! (6 data parts, blocks of 4 KiB: 62 stripes).

use crate::common::*;
use crate::serve_proc::start;
use serde_json::Value;
use std::io::BufRead;
use std::path::{Path, PathBuf};

/// A split set of the built bundle in a folder of its own.
struct Parts {
    dir: PathBuf,
    parts: Vec<PathBuf>,
    /// The pristine bytes of every part.
    pristine: Vec<Vec<u8>>,
}

impl Parts {
    fn new(b: &Built, size: &str, parity: usize) -> Parts {
        Parts::of(&b.home, &b.bundle, size, parity)
    }
    /// `input` split by `h` into a folder of its own.
    fn of(h: &Home, input: &Path, size: &str, parity: usize) -> Parts {
        Parts::with(h, input, size, parity, &[])
    }
    /// [`Parts::of`] with more `split` arguments.
    fn with(h: &Home, input: &Path, size: &str, parity: usize, more: &[&str]) -> Parts {
        let (dir, parts) = split_set(h, input, size, parity, more);
        let pristine = parts.iter().map(|p| std::fs::read(p).unwrap()).collect();
        Parts {
            dir,
            parts,
            pristine,
        }
    }
    fn arg(&self, i: usize) -> &str {
        self.parts[i].to_str().unwrap()
    }
    fn name(&self, i: usize) -> String {
        self.parts[i].file_name().unwrap().to_string_lossy().into()
    }
    /// Every part as it was written.
    fn assert_pristine(&self) {
        for (p, want) in self.parts.iter().zip(&self.pristine) {
            let have = std::fs::read(p).unwrap_or_default();
            assert!(
                have == *want,
                "{} differs from the part split wrote",
                p.display()
            );
        }
    }
    fn restore(&self) {
        for (p, want) in self.parts.iter().zip(&self.pristine) {
            std::fs::write(p, want).unwrap();
        }
    }
}

/// The header JSON of a part (read as the format says: magic, part line, length, JSON).
fn header(part: &Path) -> Value {
    let mut r = std::io::BufReader::new(std::fs::File::open(part).unwrap());
    let mut line = String::new();
    for _ in 0..3 {
        line.clear();
        r.read_line(&mut line).unwrap();
    }
    let len: usize = line.trim().parse().unwrap();
    let mut json = vec![0u8; len];
    std::io::Read::read_exact(&mut r, &mut json).unwrap();
    serde_json::from_slice(&json).unwrap()
}

/// Where block `b` of a part starts in its file.
fn block_at(h: &Value, b: u64) -> u64 {
    h["dataOffset"].as_u64().unwrap() + b * h["blockSize"].as_u64().unwrap()
}

/// A seeded xorshift: the same damage on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Every combination of one or two of the set's 8 parts put aside: joined from a part left,
/// byte for byte the bundle, each part missing named; the parts put back after each.
fn join_without_any_one_or_two(h: &Home, s: &Parts, bundle: &Path) {
    let count = s.parts.len();
    let want = sha256(&std::fs::read(bundle).unwrap());
    let aside = h.path().join("aside");
    std::fs::create_dir_all(&aside).unwrap();
    let mut combos: Vec<Vec<usize>> = (0..count).map(|i| vec![i]).collect();
    for i in 0..count {
        for j in i + 1..count {
            combos.push(vec![i, j]);
        }
    }
    assert_eq!(combos.len(), 8 + 28);
    for lost in &combos {
        for &i in lost {
            std::fs::rename(&s.parts[i], aside.join(s.name(i))).unwrap();
        }
        let survivor = (0..count).find(|i| !lost.contains(i)).unwrap();
        let out = h.path().join("joined.tar");
        let o = h.run(&["join", s.arg(survivor), "-o", out.to_str().unwrap()]);
        assert_ok(&o);
        assert_eq!(
            sha256(&std::fs::read(&out).unwrap()),
            want,
            "parts {lost:?} lost"
        );
        let e = stderr(&o);
        for &i in lost {
            assert!(
                e.contains(&format!("{} (part {i}) is missing", s.name(i))),
                "{e}"
            );
        }
        std::fs::remove_file(&out).unwrap();
        for &i in lost {
            std::fs::rename(aside.join(s.name(i)), &s.parts[i]).unwrap();
        }
    }
}

/// Damage beyond the parity parts: `verify`, `load` (nothing pushed), `join` (no output) and
/// `repair` each refuse with every one of `needles`, and the set's folder is left as it was,
/// byte for byte.
fn refused_before_anything_is_pushed_or_written(h: &Home, s: &Parts, needles: &[String]) {
    let e = env();
    let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
    let folder = || {
        let mut files: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&s.dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
            .collect();
        files.sort();
        files
    };
    let before = folder();
    assert_fails(&h.run(&["verify", s.arg(0)]), 1, &needles);
    let prefix = unique_prefix("beyond");
    let o = h.run(&[
        "load",
        s.arg(3),
        "--registry",
        &format!("{}/{prefix}", e.plain),
        "--plain-http",
        "--no-install",
    ]);
    assert_fails(&o, 1, &needles);
    assert!(stderr(&o).contains("nothing was pushed"));
    assert!(repos_under(&prefix).is_empty());
    let out = h.path().join("joined.tar");
    assert_fails(
        &h.run(&["join", s.arg(0), "-o", out.to_str().unwrap()]),
        1,
        &needles,
    );
    assert!(!out.exists());
    assert_fails(&h.run(&["repair", s.arg(7)]), 1, &needles);
    assert!(folder() == before, "the set's folder changed");
}

/// `repair --json` from part `from`: `written` parts written back and `rebuilt` blocks rebuilt,
/// every part as split wrote it, and `verify` with nothing more to rebuild. Returns the JSON.
fn repaired_whole(h: &Home, s: &Parts, from: usize, written: usize, rebuilt: u64) -> Value {
    let o = h.run(&["repair", s.arg(from), "--json"]);
    assert_ok(&o);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["written"].as_array().unwrap().len(), written, "{r}");
    assert_eq!(r["rebuiltBlocks"], rebuilt, "{r}");
    s.assert_pristine();
    let o = h.run(&["verify", s.arg(0)]);
    assert_ok(&o);
    assert!(!stderr(&o).contains("rebuilt"), "{}", stderr(&o));
    r
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

#[test]
fn every_combination_of_up_to_n_lost_parts_is_rebuilt() {
    let b = Built::new();
    let h = &b.home;
    let s = Parts::new(&b, "256K", 2);
    let count = s.parts.len();
    assert_eq!(count, 8, "6 data parts and 2 parity parts");
    let aside = h.path().join("aside");
    join_without_any_one_or_two(h, &s, &b.bundle);
    // N+1 = 3 parts lost: refused, naming them, how many more parity parts, what to copy.
    for i in [0, 3, 6] {
        std::fs::rename(&s.parts[i], aside.join(s.name(i))).unwrap();
    }
    let out = h.path().join("joined.tar");
    let mut needles = vec![
        "damage beyond repair".to_string(),
        "1 more parity part would have been needed".into(),
        format!("copy again {}", s.name(0)),
    ];
    needles.extend([0, 3, 6].map(|i| format!("{}: missing", s.name(i))));
    let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
    assert_fails(
        &h.run(&["join", s.arg(1), "-o", out.to_str().unwrap()]),
        1,
        &needles,
    );
    assert!(!out.exists());
    assert_fails(&h.run(&["verify", s.arg(7)]), 1, &needles);
    for i in [0, 3, 6] {
        std::fs::rename(aside.join(s.name(i)), &s.parts[i]).unwrap();
    }
    // verify too, from a parity part, with the first and the last data part lost.
    for i in [0, 5] {
        std::fs::remove_file(&s.parts[i]).unwrap();
    }
    let o = h.run(&["verify", s.arg(7)]);
    assert_ok(&o);
    let e = stderr(&o);
    assert!(e.contains(&format!("{}: missing, all", s.name(0))), "{e}");
    assert!(e.contains("rebuilt from parity"), "{e}");
    assert!(e.contains("koord-bundle repair"), "{e}");
}

#[test]
fn random_damage_in_every_part_is_found_per_block_and_repaired() {
    let b = Built::new();
    let h = &b.home;
    let s = Parts::new(&b, "256K", 2);
    let hd = header(&s.parts[0]);
    let stripes = hd["parts"][0]["size"]
        .as_u64()
        .unwrap()
        .div_ceil(hd["blockSize"].as_u64().unwrap());
    let mut rng = Rng(0x5eed_2020_0000_0001);
    let mut per_stripe = vec![0usize; stripes as usize];
    let mut damaged = Vec::new();
    for (q, part) in s.parts.iter().enumerate() {
        let size = hd["parts"][q]["size"].as_u64().unwrap();
        let blocks = size.div_ceil(hd["blockSize"].as_u64().unwrap());
        // A stripe that has fewer than 2 damaged blocks so far.
        let j = loop {
            let j = rng.below(blocks);
            if per_stripe[j as usize] < 2 {
                break j;
            }
        };
        per_stripe[j as usize] += 1;
        let len =
            (size - j * hd["blockSize"].as_u64().unwrap()).min(hd["blockSize"].as_u64().unwrap());
        // A few damaged bytes in that block.
        for _ in 0..1 + rng.below(8) {
            flip_byte(part, block_at(&hd, j) + rng.below(len));
        }
        damaged.push((q, j));
    }
    let o = h.run(&["verify", s.arg(3)]);
    assert_ok(&o);
    let e = stderr(&o);
    for &(q, j) in &damaged {
        let said = if q < 6 {
            format!("{}: 1 block damaged, rebuilt from parity", s.name(q))
        } else {
            // Parity parts are checked too (reading the bundle does not touch them).
            format!(
                "{}: 1 of {stripes} blocks damaged (block {j}): a parity part",
                s.name(q)
            )
        };
        assert!(e.contains(&said), "{said}\n{e}");
    }
    let out = h.path().join("joined.tar");
    assert_ok(&h.run(&["join", s.arg(0), "-o", out.to_str().unwrap()]));
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(&b.bundle).unwrap()
    );
    let r = repaired_whole(h, &s, 6, 8, 8);
    for (i, &(q, j)) in damaged.iter().enumerate() {
        assert_eq!(r["damage"]["parts"][i]["index"], q as u64);
        assert_eq!(r["damage"]["parts"][i]["blocks"], serde_json::json!([j]));
    }
}

#[test]
fn a_truncated_part_is_rebuilt_and_written_back() {
    let b = Built::new();
    let h = &b.home;
    let s = Parts::new(&b, "256K", 1);
    let p2 = &s.pristine[2];
    std::fs::write(&s.parts[2], &p2[..p2.len() - 10_000]).unwrap();
    let o = h.run(&["verify", s.arg(0)]);
    assert_ok(&o);
    let e = stderr(&o);
    assert!(
        e.contains(&format!(
            "{} (part 2) is {} bytes, the header says {}",
            s.parts[2].display(),
            p2.len() - 10_000,
            p2.len()
        )),
        "{e}"
    );
    assert!(
        e.contains(&format!(
            "{}: 3 blocks damaged, rebuilt from parity",
            s.name(2)
        )),
        "{e}"
    );
    let o = h.run(&["repair", s.arg(0)]);
    assert_ok(&o);
    assert!(String::from_utf8_lossy(&o.stdout).contains("1 part written back whole"));
    s.assert_pristine();
}

#[test]
fn damage_beyond_n_is_refused_before_anything_is_pushed_or_written() {
    let b = Built::new();
    let h = &b.home;
    let s = Parts::new(&b, "256K", 2);
    // Two parts lost and block 5 of a third scratched: stripe 5 has 3 damaged blocks.
    std::fs::remove_file(&s.parts[1]).unwrap();
    std::fs::remove_file(&s.parts[4]).unwrap();
    let hd = header(&s.parts[0]);
    flip_byte(&s.parts[2], block_at(&hd, 5) + 17);
    let blocks = hd["parts"][2]["size"]
        .as_u64()
        .unwrap()
        .div_ceil(hd["blockSize"].as_u64().unwrap());
    let needles = [
        "damage beyond repair".to_string(),
        format!("{}: missing", s.name(1)),
        format!("{}: missing", s.name(4)),
        format!("{}: 1 of {blocks} blocks damaged (block 5)", s.name(2)),
        "1 stripe (5) has up to 3 damaged blocks".into(),
        "1 more parity part would have been needed".into(),
        format!("copy again {}", s.name(1)),
    ];
    refused_before_anything_is_pushed_or_written(h, &s, &needles);
    // The part named to copy again, copied again: repaired.
    std::fs::write(&s.parts[1], &s.pristine[1]).unwrap();
    assert_ok(&h.run(&["repair", s.arg(0)]));
    s.assert_pristine();
}

#[test]
fn any_part_starts_every_reader_and_the_header_survives_the_first_part() {
    let e = env();
    let b = Built::new();
    let h = &b.home;
    let s = Parts::new(&b, "256K", 2);
    std::fs::remove_file(&s.parts[0]).unwrap();
    // The header as minisign sees it, from the last parity part: its JSON and signature.
    let part = std::fs::read(&s.parts[7]).unwrap();
    let mut lines = part.split(|&c| c == b'\n');
    assert_eq!(lines.next().unwrap(), b"koord-bundle-split v2");
    let ident = String::from_utf8(lines.next().unwrap().to_vec()).unwrap();
    assert!(ident.starts_with("part 7 of 8 set "), "{ident}");
    let json_len: usize = std::str::from_utf8(lines.next().unwrap())
        .unwrap()
        .parse()
        .unwrap();
    let json_at =
        "koord-bundle-split v2\n".len() + ident.len() + 1 + json_len.to_string().len() + 1;
    let json = &part[json_at..json_at + json_len];
    let rest = &part[json_at + json_len + 1..];
    let nl = rest.iter().position(|&c| c == b'\n').unwrap();
    let sig_len: usize = std::str::from_utf8(&rest[..nl]).unwrap().parse().unwrap();
    let sig = &rest[nl + 1..nl + 1 + sig_len];
    let d = h.path().join("minisign");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("header.json"), json).unwrap();
    std::fs::write(d.join("header.json.minisig"), sig).unwrap();
    let o = tool(
        "minisign",
        &[
            "-V",
            "-m",
            "header.json",
            "-p",
            h.pubkey().to_str().unwrap(),
        ],
        &d,
    );
    assert_ok(&o);
    // Its copy of the header damaged: part 3 still opens the set from the others' copies.
    let hd = header(&s.parts[3]);
    flip_byte(&s.parts[3], 200);
    let o = h.run(&["verify", s.arg(3)]);
    assert_ok(&o);
    let err = stderr(&o);
    assert!(err.contains("its copy of the header is damaged"), "{err}");
    assert!(
        err.contains(&format!("{}: missing, all", s.name(0))),
        "{err}"
    );
    assert_ok(&h.run(&["inspect", s.arg(2)]));
    let out = h.path().join("j.tar");
    assert_ok(&h.run(&["join", s.arg(7), "-o", out.to_str().unwrap()]));
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(&b.bundle).unwrap()
    );
    // load from part 5, checked by skopeo.
    let prefix = unique_prefix("anypart");
    assert_ok(&h.run(&[
        "load",
        s.arg(5),
        "--registry",
        &format!("{}/{prefix}", e.plain),
        "--plain-http",
        "--no-install",
    ]));
    let m = bundle_manifest(&b.bundle);
    for (r, digest) in image_digests(&m) {
        assert_digest(
            &format!("docker://{}/{prefix}/{r}", e.plain),
            &Skopeo::plain_http(),
            &digest,
        );
    }
    // serve from a parity part; a byte of a layer altered after verification is rebuilt
    // from parity, and said so.
    let srv = start(h, &[s.arg(6)]);
    let (entry, offset) = largest_blob(&b.bundle);
    let digest = format!("sha256:{}", entry.rsplit('/').next().unwrap());
    let repo = image_digests(&m)
        .into_iter()
        .map(|(r, _)| r.split(':').next().unwrap().to_string())
        .find(|r| {
            curl(
                &["-I"],
                &srv.url("http", &format!("/v2/{r}/blobs/{digest}")),
            )
            .status
                == 200
        })
        .expect("the largest blob is in some image");
    // Where the blob's byte 1000 is: data part and offset in it.
    let stride = hd["parts"][0]["size"].as_u64().unwrap();
    let at = offset + 1000;
    let (p, within) = ((at / stride) as usize, at % stride);
    assert_ne!(p, 0, "the largest blob lies beyond the lost first part");
    flip_byte(&s.parts[p], hd["dataOffset"].as_u64().unwrap() + within);
    let url = srv.url("http", &format!("/v2/{repo}/blobs/{digest}"));
    assert_eq!(sha256(&curl(&[], &url).body), digest);
    let a = curl(&["-r", "0-99999"], &url);
    let z = curl(&["-r", "100000-"], &url);
    assert_eq!((a.status, z.status), (206, 206));
    assert_eq!(sha256(&[a.body, z.body].concat()), digest);
    let log = srv.wait_log("rebuilt from parity");
    assert!(
        log.contains(&format!("{}: block", s.name(p))) && log.contains("rebuilt from parity"),
        "{log}"
    );
}

#[test]
fn renamed_swapped_and_foreign_parts_are_recognised_by_their_header() {
    let b = Built::new();
    let h = &b.home;
    let s = Parts::new(&b, "256K", 1);
    // Renamed.
    let renamed = s.dir.join("disc-three.bin");
    std::fs::rename(&s.parts[2], &renamed).unwrap();
    let o = h.run(&["verify", s.arg(0)]);
    assert_ok(&o);
    assert!(
        stderr(&o).contains(&format!(
            "{} holds {} (part 2",
            renamed.display(),
            s.name(2)
        )),
        "{}",
        stderr(&o)
    );
    assert!(
        !stderr(&o).contains("rebuilt"),
        "read from where it is, not rebuilt"
    );
    std::fs::rename(&renamed, &s.parts[2]).unwrap();
    // Swapped pair: read by content; repair puts them back.
    std::fs::write(&s.parts[1], &s.pristine[3]).unwrap();
    std::fs::write(&s.parts[3], &s.pristine[1]).unwrap();
    let o = h.run(&["verify", s.arg(0)]);
    assert_ok(&o);
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "{} holds {} (part 1",
            s.parts[3].display(),
            s.name(1)
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "{} holds {} (part 3",
            s.parts[1].display(),
            s.name(3)
        )),
        "{err}"
    );
    let out = h.path().join("j.tar");
    assert_ok(&h.run(&["join", s.arg(0), "-o", out.to_str().unwrap()]));
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(&b.bundle).unwrap()
    );
    assert_ok(&h.run(&["repair", s.arg(0)]));
    s.assert_pristine();
    // A part of another set (the same bundle split in other sizes) in the place of part 4.
    let other = Parts::new(&b, "300K", 1);
    std::fs::write(&s.parts[4], &other.pristine[4]).unwrap();
    let o = h.run(&["verify", s.arg(0)]);
    assert_ok(&o);
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "{} belongs to another split set",
            s.parts[4].display()
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!("{}: missing, all", s.name(4))),
        "{err}"
    );
    // repair does not write over it.
    assert_fails(
        &h.run(&["repair", s.arg(0)]),
        1,
        &["belongs to another split set", "move it away"],
    );
    assert_eq!(std::fs::read(&s.parts[4]).unwrap(), other.pristine[4]);
    std::fs::remove_file(&s.parts[4]).unwrap();
    assert_ok(&h.run(&["repair", s.arg(0)]));
    s.assert_pristine();
    s.restore();
}

#[test]
fn two_parts_deleted_and_a_third_scratched_are_verified_loaded_and_repaired() {
    let e = env();
    let b = Built::new();
    let h = &b.home;
    let s = Parts::new(&b, "256K", 3);
    std::fs::remove_file(&s.parts[1]).unwrap();
    std::fs::remove_file(&s.parts[4]).unwrap();
    let hd = header(&s.parts[0]);
    // A scratch: 3 KiB of zeros across blocks 9 and 10 of part 2.
    let mut p2 = s.pristine[2].clone();
    let at = block_at(&hd, 9) + 2048;
    p2[at as usize..at as usize + 3072].fill(0);
    std::fs::write(&s.parts[2], &p2).unwrap();
    let o = h.run(&["verify", s.arg(0)]);
    assert_ok(&o);
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "{}: 2 blocks damaged, rebuilt from parity",
            s.name(2)
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!("{}: missing, all", s.name(1))),
        "{err}"
    );
    let prefix = unique_prefix("scratched");
    let o = h.run(&[
        "load",
        s.arg(8),
        "--registry",
        &format!("{}/{prefix}", e.plain),
        "--plain-http",
        "--no-install",
    ]);
    assert_ok(&o);
    assert!(stderr(&o).contains("rebuilt from parity"), "{}", stderr(&o));
    assert_eq!(repos_under(&prefix).len(), 6);
    let o = h.run(&["repair", s.arg(0)]);
    assert_ok(&o);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.contains("3 parts written back whole"), "{out}");
    s.assert_pristine();
}

#[test]
fn a_v1_set_is_still_read() {
    let b = Built::new();
    let h = &b.home;
    // A v1 set written by hand as bundle-spec/README.md (§8, v1) describes it: 3 parts, the
    // header in the first one only, unsigned.
    let bundle = std::fs::read(&b.bundle).unwrap();
    let dir = h.path().join(unique_prefix("v1"));
    std::fs::create_dir_all(&dir).unwrap();
    let name = "old.tar";
    let cut = [0, 400_000, 900_000, bundle.len()];
    let parts: Vec<Value> = (0..3)
        .map(|i| {
            let piece = &bundle[cut[i]..cut[i + 1]];
            serde_json::json!({"file": format!("{name}.part{i:03}"), "size": piece.len(), "sha256": sha256(piece)})
        })
        .collect();
    let json = serde_json::to_vec(&serde_json::json!({
        "format": "koord-bundle-split/v1",
        "bundle": {"file": name, "size": bundle.len(), "sha256": sha256(&bundle)},
        "parts": parts,
    }))
    .unwrap();
    for i in 0..3 {
        let mut bytes = Vec::new();
        if i == 0 {
            bytes.extend_from_slice(format!("koord-bundle-split v1\n{}\n", json.len()).as_bytes());
            bytes.extend_from_slice(&json);
            bytes.extend_from_slice(b"\n0\n");
        }
        bytes.extend_from_slice(&bundle[cut[i]..cut[i + 1]]);
        std::fs::write(dir.join(format!("{name}.part{i:03}")), bytes).unwrap();
    }
    let first = dir.join(format!("{name}.part000"));
    assert_ok(&h.run(&["verify", first.to_str().unwrap()]));
    let out = h.path().join("j.tar");
    assert_ok(&h.run(&[
        "join",
        first.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--insecure-skip-signature",
    ]));
    assert_eq!(std::fs::read(&out).unwrap(), bundle);
    assert_fails(
        &h.run(&[
            "repair",
            first.to_str().unwrap(),
            "--insecure-skip-signature",
        ]),
        1,
        &["format v1", "copy the damaged part again"],
    );
}

#[test]
fn build_split_writes_parity_parts() {
    let h = Home::with_key();
    let dir = h.path().join("dvd");
    std::fs::create_dir(&dir).unwrap();
    let out = dir.join("koordinator-1.8.0.tar");
    let o = h
        .build("1.8.0")
        .out(&out)
        .args(&["--split", "512K", "--parity", "1"])
        .run();
    assert_ok(&o);
    let mut parts: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    parts.sort();
    let hd = header(&parts[0]);
    assert_eq!(hd["parityParts"], 1);
    assert_eq!(parts.len() as u64, hd["dataParts"].as_u64().unwrap() + 1);
    std::fs::remove_file(&parts[0]).unwrap();
    assert_ok(&h.run(&["verify", parts[1].to_str().unwrap()]));
    // --parity needs --split.
    let o = h.build("1.8.0").args(&["--parity", "1"]).run();
    assert_fails(&o, 2, &["--split"]);
}

/// A set whose parts take several groups of stripes to write and to repair (the writer and
/// `repair` work a group at a time, reading or writing the next group on a thread of their
/// own): 24 MiB of incompressible bytes in parts of 1 MiB with 2 parity parts (27 parts of
/// 4 KiB blocks: groups of about 600 KiB per part when writing, 300 KiB when repairing). Every byte of every group comes back:
/// joined with the first data part and a parity part gone, and repaired with the first data
/// part gone and damage across the group boundaries of another part.
#[test]
fn a_set_of_many_groups_is_written_joined_and_repaired_whole() {
    let h = Home::with_key();
    let input = h.path().join("big.bin");
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let bytes: Vec<u8> = (0..24u64 << 20).map(|_| rng.next() as u8).collect();
    std::fs::write(&input, &bytes).unwrap();
    let s = Parts::of(&h, &input, "1M", 2);
    assert!(s.parts.len() > 20, "{} parts", s.parts.len());
    let last = s.parts.len() - 1;
    std::fs::remove_file(&s.parts[0]).unwrap();
    std::fs::remove_file(&s.parts[last]).unwrap();
    let joined = h.path().join("joined.bin");
    let o = h.run(&["join", s.arg(7), "-o", joined.to_str().unwrap()]);
    assert_ok(&o);
    assert!(
        std::fs::read(&joined).unwrap() == bytes,
        "join gave other bytes"
    );
    // The parity part back; 400 KB of part 9 zeroed around its middle, across the group
    // boundaries of `repair`, with part 0 still gone.
    std::fs::write(&s.parts[last], &s.pristine[last]).unwrap();
    let mut p9 = s.pristine[9].clone();
    let mid = p9.len() / 2;
    p9[mid - 200_000..mid + 200_000].fill(0);
    std::fs::write(&s.parts[9], &p9).unwrap();
    let o = h.run(&["repair", s.arg(7)]);
    assert_ok(&o);
    s.assert_pristine();
}

/// `split --spread`: the parity parts hold one code over the whole set, as par2 does, so
/// damage in the same place of more parts than there are parity parts is rebuilt too. Part 1
/// lost and block 5 scratched in parts 2, 4 and parity part 7: 4 damaged blocks in stripe 5,
/// which a code per stripe with 2 parity parts refuses
/// (`damage_beyond_n_is_refused_before_anything_is_pushed_or_written` has 3).
#[test]
fn a_spread_set_rebuilds_the_same_place_damaged_in_more_parts_than_it_has_parity_parts() {
    let e = env();
    let b = Built::new();
    let h = &b.home;
    let s = Parts::with(h, &b.bundle, "256K", 2, &["--spread"]);
    assert_eq!(s.parts.len(), 8, "6 data parts and 2 parity parts");
    let hd = header(&s.parts[0]);
    assert_eq!(hd["code"], "reed-solomon-gf16-leopard-set");
    let blocks = hd["parts"][7]["size"]
        .as_u64()
        .unwrap()
        .div_ceil(hd["blockSize"].as_u64().unwrap());
    std::fs::remove_file(&s.parts[1]).unwrap();
    for q in [2, 4, 7] {
        flip_byte(&s.parts[q], block_at(&hd, 5) + 17);
    }
    let o = h.run(&["verify", s.arg(0)]);
    assert_ok(&o);
    let err = stderr(&o);
    for said in [
        format!("{}: missing, all", s.name(1)),
        format!("{}: 1 block damaged, rebuilt from parity", s.name(2)),
        format!("{}: 1 block damaged, rebuilt from parity", s.name(4)),
        format!(
            "{}: 1 of {blocks} blocks damaged (block 5): a parity part",
            s.name(7)
        ),
    ] {
        assert!(err.contains(&said), "{said}\n{err}");
    }
    let prefix = unique_prefix("spread");
    let o = h.run(&[
        "load",
        s.arg(3),
        "--registry",
        &format!("{}/{prefix}", e.plain),
        "--plain-http",
        "--no-install",
    ]);
    assert_ok(&o);
    assert!(stderr(&o).contains("rebuilt from parity"), "{}", stderr(&o));
    assert_eq!(repos_under(&prefix).len(), 6);
    let out = h.path().join("joined.tar");
    assert_ok(&h.run(&["join", s.arg(5), "-o", out.to_str().unwrap()]));
    assert!(std::fs::read(&out).unwrap() == std::fs::read(&b.bundle).unwrap());
    let missing = hd["parts"][1]["size"]
        .as_u64()
        .unwrap()
        .div_ceil(hd["blockSize"].as_u64().unwrap());
    repaired_whole(h, &s, 0, 4, missing + 3);
}

/// A spread set: every combination of up to 2 of its 8 parts lost is joined byte for byte;
/// damage of one block more than the parity parts' blocks is refused before anything is
/// pushed or written, naming the damage, the parity parts missing and the part to copy again;
/// that part copied again, the rest is repaired.
#[test]
fn a_spread_set_rebuilds_any_n_parts_and_refuses_one_block_more() {
    let b = Built::new();
    let h = &b.home;
    let s = Parts::with(h, &b.bundle, "256K", 2, &["--spread"]);
    assert_eq!(s.parts.len(), 8, "6 data parts and 2 parity parts");
    join_without_any_one_or_two(h, &s, &b.bundle);
    s.assert_pristine();
    // Parts 1 and 4 lost: every recovery block is needed. One byte more damaged (in part 2):
    // beyond repair.
    let hd = header(&s.parts[0]);
    let per = hd["parts"][0]["size"]
        .as_u64()
        .unwrap()
        .div_ceil(hd["blockSize"].as_u64().unwrap());
    let r = 2 * per;
    std::fs::remove_file(&s.parts[1]).unwrap();
    std::fs::remove_file(&s.parts[4]).unwrap();
    flip_byte(&s.parts[2], block_at(&hd, 30) + 100);
    let needles = [
        "damage beyond repair".to_string(),
        format!("{}: missing", s.name(1)),
        format!("{}: missing", s.name(4)),
        format!("{}: 1 of {per} blocks damaged (block 30)", s.name(2)),
        format!("{} damaged blocks in all", r + 1),
        format!("rebuild at most {r} blocks wherever they are"),
        "1 more parity part would have been needed".into(),
        format!("copy again {} (", s.name(1)),
    ];
    refused_before_anything_is_pushed_or_written(h, &s, &needles);
    std::fs::write(&s.parts[1], &s.pristine[1]).unwrap();
    assert_ok(&h.run(&["repair", s.arg(0)]));
    s.assert_pristine();
}

/// `build --split --parity --spread` writes a spread set; `--spread` needs `--parity`.
#[test]
fn build_split_spread_writes_a_set_wide_code() {
    let h = Home::with_key();
    let dir = h.path().join("dvd");
    std::fs::create_dir(&dir).unwrap();
    let out = dir.join("koordinator-1.8.0.tar");
    let o = h
        .build("1.8.0")
        .out(&out)
        .args(&["--split", "512K", "--parity", "1", "--spread"])
        .run();
    assert_ok(&o);
    let mut parts: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    parts.sort();
    let hd = header(&parts[0]);
    assert_eq!(hd["code"], "reed-solomon-gf16-leopard-set");
    std::fs::remove_file(&parts[0]).unwrap();
    assert_ok(&h.run(&["verify", parts[1].to_str().unwrap()]));
    let o = h
        .build("1.8.0")
        .args(&["--split", "512K", "--spread"])
        .run();
    assert_fails(&o, 1, &["--spread needs --parity N"]);
    let o = h.run(&["split", out.to_str().unwrap(), "--size", "512K", "--spread"]);
    assert_fails(&o, 1, &["--spread needs --parity N"]);
}

/// Issue 32 item 4: one byte of part 2's copy of the header changed (its part line intact, so the
/// set still opens from it and every byte of the bundle verifies). `repair` finds and rewrites
/// that part; `verify` says so too, naming the part and the command, and still exits 0: the
/// bundle is whole and every other part carries the header. Named from another part or from the
/// damaged one, by a path or by its bare name in its folder (`x.part002` is `./x.part002` there).
#[test]
fn verify_names_a_part_whose_copy_of_the_header_is_damaged() {
    let b = Built::new();
    let h = &b.home;
    let s = Parts::new(&b, "256K", 1);
    flip_byte(&s.parts[2], 200);
    for from in [0, 2] {
        let bare = s.name(from);
        for (arg, dir) in [(s.arg(from), h.path()), (bare.as_str(), s.dir.as_path())] {
            let o = h.cmd(&["verify", arg]).current_dir(dir).output().unwrap();
            assert_ok(&o);
            let err = stderr(&o);
            let line = err
                .lines()
                .find(|l| l.contains(&s.name(2)) && l.contains("(part 2)"))
                .unwrap_or_else(|| panic!("verify {arg} does not name part 2:\n{err}"));
            assert!(line.contains("copy of the header is damaged"), "{line}");
            assert!(
                err.contains(&format!("koord-bundle repair {arg}")),
                "verify {arg}:\n{err}"
            );
            assert!(
                String::from_utf8_lossy(&o.stdout).contains("verified"),
                "{o:?}"
            );
        }
    }
    let o = h.run(&["verify", s.arg(0), "--json"]);
    assert_ok(&o);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["headerDamage"][0]["part"], 2, "{v}");
    let r = repaired_whole(h, &s, 0, 1, 0);
    assert_eq!(r["written"][0].as_str(), Some(s.arg(2)), "{r}");
    let o = h.run(&["verify", s.arg(0)]);
    assert!(!stderr(&o).contains("header"), "{}", stderr(&o));
}

/// Issue 32 item 4: `join` said `joined from 7 parts` of a set of 6 data parts and 1 parity part
/// whose part 3 was missing and rebuilt. It says what it read and what it rebuilt.
#[test]
fn join_says_how_many_parts_it_read_and_how_many_it_rebuilt() {
    let b = Built::new();
    let h = &b.home;
    let s = Parts::new(&b, "256K", 1);
    assert_eq!(s.parts.len(), 7);
    let hd = header(&s.parts[0]);
    let join = |from: usize| {
        let out = h.path().join("joined.tar");
        let o = h.run(&["join", s.arg(from), "-o", out.to_str().unwrap(), "--force"]);
        assert_ok(&o);
        assert_eq!(
            std::fs::read(&out).unwrap(),
            std::fs::read(&b.bundle).unwrap()
        );
        let said = String::from_utf8_lossy(&o.stdout).to_string();
        said.trim_end()
            .rsplit(" joined from ")
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(join(0), "6 data parts (1 parity part not needed)");
    std::fs::remove_file(&s.parts[3]).unwrap();
    assert_eq!(join(0), "6 parts and 1 rebuilt from parity");
    s.restore();
    std::fs::remove_file(&s.parts[6]).unwrap();
    assert_eq!(join(0), "6 data parts (1 parity part not needed)");
    s.restore();
    flip_byte(&s.parts[1], block_at(&hd, 2) + 10);
    assert_eq!(join(0), "7 parts, 1 damaged block rebuilt from parity");
}

/// Issue 32 item 4: damage beyond a set of 1 parity part said `the 1 parity part rebuild at
/// most …`: the verb agrees with its number, per stripe and for a set-wide code.
#[test]
fn damage_beyond_one_parity_part_is_worded_in_the_singular() {
    let b = Built::new();
    let h = &b.home;
    let s = Parts::new(&b, "256K", 1);
    let hd = header(&s.parts[0]);
    flip_byte(&s.parts[1], block_at(&hd, 5) + 7);
    flip_byte(&s.parts[2], block_at(&hd, 5) + 7);
    let o = h.run(&["verify", s.arg(0)]);
    let err = assert_fails(&o, 1, &["damage beyond repair"]);
    assert!(
        err.contains("and the 1 parity part rebuilds at most 1 per stripe"),
        "{err}"
    );
    let w = Parts::with(h, &b.bundle, "256K", 1, &["--spread"]);
    std::fs::remove_file(&w.parts[1]).unwrap();
    std::fs::remove_file(&w.parts[2]).unwrap();
    let o = h.run(&["verify", w.arg(0)]);
    let err = assert_fails(&o, 1, &["damage beyond repair"]);
    assert!(
        err.contains("the 1 parity part (a code over the whole set) rebuilds at most"),
        "{err}"
    );
}
