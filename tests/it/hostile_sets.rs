//! Issue 30, the split-set items: a header names no file but its own parts (item 4), a forged
//! header claiming thousands of parts costs linear time (item 6), a part of another set mixed
//! into a folder is named, never read (item 9), repair checks what parity rebuilt (item 9),
//! and a full disk names the file that could not be written (item 9).

use crate::common::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

const NAME: &str = "koordinator-1.8.0.tar";

/// A signed bundle split into 600 KiB parts with `extra` (`--parity 1`) in `parts/`; returns
/// (home, bundle, first part).
fn split_set(h: &Home, extra: &[&str]) -> (PathBuf, PathBuf) {
    let (bundle, _) = h.build_plain("1.8.0", &[]);
    let dir = h.path().join("parts");
    std::fs::create_dir_all(&dir).unwrap();
    let mut args = vec![
        "split",
        bundle.to_str().unwrap(),
        "--size",
        "600K",
        "--output-dir",
        dir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    assert_ok(&h.run(&args));
    (bundle, dir.join(format!("{NAME}.part000")))
}

fn files_of(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    v.sort();
    v
}

#[test]
fn parity_parts_are_named_as_parity_and_a_header_names_no_other_file() {
    let h = Home::with_key();
    let (_, first) = split_set(&h, &["--parity", "1"]);
    let dir = first.parent().unwrap().to_path_buf();
    let names = files_of(&dir);
    assert!(
        names.contains(&format!("{NAME}.parity000")),
        "the parity part says what it is: {names:?}"
    );
    assert!(names.iter().all(|n| n.starts_with(NAME)), "{names:?}");

    // An unsigned header naming part 1 `victim.txt`, the part itself gone: repair told to
    // skip the signature rewrote victim.txt. Refused now, before anything is read or written.
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, b"precious").unwrap();
    std::fs::remove_file(dir.join(format!("{NAME}.part001"))).unwrap();
    let mut fp = read_first_part(&first);
    fp.json["parts"][1]["file"] = "victim.txt".into();
    fp.sig.clear();
    write_first_part(&first, &fp);
    let first_s = first.to_str().unwrap();
    for cmd in ["repair", "verify", "join"] {
        let o = h.run(&[cmd, first_s, "--insecure-skip-signature"]);
        let err = assert_fails(
            &o,
            1,
            &["a part's name is the bundle's name and its number"],
        );
        assert!(err.contains("victim.txt"), "{cmd}: {err}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "{cmd}");
    }
}

/// Make `fp` claim a set of `k` data parts of `size` bytes and one parity part, in blocks of
/// `block`, data at `offset`, with the block table `table` (its size and sha256 set to match);
/// unsigned.
fn claim_geometry(
    fp: &mut FirstPart,
    k: usize,
    size: u64,
    block: u64,
    offset: u64,
    table: Vec<u8>,
) {
    let mut parts: Vec<serde_json::Value> = (0..k)
        .map(|i| serde_json::json!({"file": format!("{NAME}.part{i:03}"), "size": size}))
        .collect();
    parts.push(serde_json::json!({"file": format!("{NAME}.parity000"), "size": size}));
    let j = &mut fp.json;
    j["bundle"]["size"] = (size * k as u64).into();
    j["partSize"] = (offset + size).into();
    j["dataOffset"] = offset.into();
    j["blockSize"] = block.into();
    j["dataParts"] = k.into();
    j["parityParts"] = 1.into();
    j["parts"] = parts.into();
    j["blockTable"]["size"] = table.len().into();
    j["blockTable"]["sha256"] = sha256(&table).into();
    fp.table = table;
    fp.count = k + 1;
    fp.sig.clear();
}

/// A part claiming a set of `k` data parts of one `block` each and one parity part, every
/// other part missing; written over `first` (unsigned).
fn forge_wide_claim(first: &Path, k: usize, block: u64) {
    let mut fp = read_first_part(first);
    let count = k + 1;
    let offset = 4u64 << 20;
    claim_geometry(&mut fp, k, block, block, offset, vec![7u8; count * 16]);
    fp.index = 0;
    fp.data = vec![1u8; block.min(16 << 10) as usize];
    write_first_part(first, &fp);
}

/// Run `args` with the address space limited to `limit` bytes (prlimit): an allocation a
/// header sized beyond it aborts the program (exit 134) instead of passing unseen.
fn run_within_memory(h: &Home, args: &[&str], limit: u64) -> std::process::Output {
    let inner = h.cmd(args);
    let mut c = std::process::Command::new("prlimit");
    c.arg(format!("--as={limit}"))
        .arg("--")
        .arg(inner.get_program());
    c.args(inner.get_args());
    for (k, v) in inner.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c.current_dir(h.path());
    c.output().unwrap()
}

#[test]
fn a_header_claiming_huge_blocks_is_read_within_the_memory_budget() {
    let h = Home::with_key();
    let (bundle, first) = split_set(&h, &["--parity", "1", "--spread"]);
    let dir = first.parent().unwrap();
    for f in files_of(dir) {
        if f != format!("{NAME}.part000") {
            std::fs::remove_file(dir.join(f)).unwrap();
        }
    }
    // 200 blocks of 64 MiB, the largest a set-wide code allows, claimed by a 4 MiB part.
    forge_wide_claim(&first, 199, 64 << 20);
    let first_s = first.to_str().unwrap();
    let joined = h.path().join("joined.tar");
    let mut outs = Vec::new();
    for args in [
        vec!["inspect", first_s],
        vec!["verify", first_s, "--insecure-skip-signature"],
        vec!["verify", first_s, "--key", h.pubkey().to_str().unwrap()],
        vec!["diff", bundle.to_str().unwrap(), first_s],
        vec!["repair", first_s, "--insecure-skip-signature"],
        vec![
            "join",
            first_s,
            "--insecure-skip-signature",
            "-o",
            joined.to_str().unwrap(),
        ],
    ] {
        let o = run_within_memory(&h, &args, 1 << 30);
        eprintln!(
            "{args:?}: {:?}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        outs.push((args.join(" "), o.status.code()));
    }
    assert!(outs.iter().all(|(_, c)| *c == Some(1)), "{outs:#?}");
}

#[test]
fn a_part_claiming_16383_parts_is_reported_in_linear_time_and_bounded_words() {
    let h = Home::with_key();
    let (_, first) = split_set(&h, &[]);
    let dir = first.parent().unwrap();
    for f in files_of(dir) {
        if f != format!("{NAME}.part000") {
            std::fs::remove_file(dir.join(f)).unwrap();
        }
    }
    // The largest set the spec allows (16,384 parts): the damage report took over 120 s (its
    // greedy choice of parts to copy again was quadratic); the bound only catches that.
    forge_wide_claim(&first, 16_382, 4096);
    let mut c = h.cmd(&[
        "verify",
        first.to_str().unwrap(),
        "--insecure-skip-signature",
    ]);
    c.current_dir(h.path());
    let o = output_within(
        c,
        Duration::from_secs(90),
        "verify of a part claiming 16,383 parts",
    );
    let err = assert_fails(&o, 1, &["damage beyond repair", "more damaged parts"]);
    assert!(
        err.len() < 20_000,
        "the report is bounded: {} bytes",
        err.len()
    );
    let o = h.run(&[
        "verify",
        first.to_str().unwrap(),
        "--insecure-skip-signature",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(1));
}

/// The 16-byte block digest of the split format (blake3-128).
fn block_digest(bytes: &[u8]) -> [u8; 16] {
    blake3::hash(bytes).as_bytes()[..16].try_into().unwrap()
}

#[test]
fn repair_checks_what_parity_rebuilt_before_it_writes() {
    let h = Home::with_key();
    let (_, first) = split_set(&h, &["--parity", "1"]);
    let dir = first.parent().unwrap().to_path_buf();
    let mut parts: Vec<PathBuf> = files_of(&dir).iter().map(|f| dir.join(f)).collect();
    // Data parts then the parity part, as the header lists them.
    parts.sort_by_key(|p| read_first_part(p).index);
    let fp0 = read_first_part(&first);
    let block = fp0.json["blockSize"].as_u64().unwrap() as usize;
    let k = fp0.json["dataParts"].as_u64().unwrap() as usize;
    let blocks =
        |q: usize| (fp0.json["parts"][q]["size"].as_u64().unwrap() as usize).div_ceil(block);
    // A forged, unsigned set: a byte of the parity part's first block changed, and the block
    // table changed to match it, so the parity block reads as intact but no longer codes the
    // data of its stripe.
    let mut table = fp0.table.clone();
    let at: usize = (0..k).map(blocks).sum::<usize>() * 16;
    let mut parity = read_first_part(&parts[k]);
    parity.data[10] ^= 0xff;
    let end = block.min(parity.data.len());
    table[at..at + 16].copy_from_slice(&block_digest(&parity.data[..end]));
    for p in &parts {
        let mut fp = read_first_part(p);
        if fp.index == k {
            fp.data = parity.data.clone();
        }
        fp.json["blockTable"]["sha256"] = sha256(&table).into();
        fp.table = table.clone();
        fp.sig.clear();
        write_first_part(p, &fp);
    }
    // And a byte of data part 1's first block damaged: its stripe has one damaged block, which
    // the forged parity "rebuilds" into other bytes.
    let victim = &parts[1];
    let mut fp1 = read_first_part(victim);
    fp1.data[100] ^= 0x01;
    write_first_part(victim, &fp1);
    let before = std::fs::read(victim).unwrap();
    let o = h.run(&[
        "repair",
        first.to_str().unwrap(),
        "--insecure-skip-signature",
    ]);
    let err = assert_fails(
        &o,
        1,
        &[
            "rebuilt from parity, does not match its digest",
            "nothing was written",
        ],
    );
    assert!(err.contains(".part001"), "names the part: {err}");
    assert_eq!(
        std::fs::read(victim).unwrap(),
        before,
        "the part is not replaced by bytes that fail their digest"
    );
    // Readers refuse the same block rather than hand it on.
    let o = h.run(&[
        "verify",
        first.to_str().unwrap(),
        "--insecure-skip-signature",
    ]);
    assert_fails(&o, 1, &["does not match its digest"]);
}

#[test]
fn build_split_with_parity_counts_the_parity_parts_in_its_room_check() {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.8.0", &[]);
    let len = std::fs::metadata(&bundle).unwrap().len();
    // A file system with room for the bundle and its data parts (2 × its size) and 300 KiB
    // more, but not for 3 parity parts of 200 KiB each: refused before anything is downloaded
    // or written, as the room check promises, not by a full disk half-way through the split.
    let small = h.path().join("small");
    let size = format!("{}k", (2 * len).div_ceil(1024) + 300);
    let line = h
        .build("1.8.0")
        .args(&["--split", "200K", "--parity", "3"])
        .out(&small.join(NAME))
        .shell_line();
    let o = in_tmpfs(
        &h,
        &small,
        &size,
        &format!(
            "{line}; rc=$?; echo FILES:; ls -A {}; exit $rc",
            small.display()
        ),
    );
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    // More than this file system holds at all: exit 1 ("no cleaning makes room"), said
    // before the download; it was exit 3 from a full disk in the middle of the split.
    assert_eq!(
        o.status.code(),
        Some(1),
        "refused before the download\n{err}"
    );
    assert!(
        err.contains("cannot be written") && err.contains("no cleaning makes room"),
        "the room check refuses: {err}"
    );
    assert!(!err.contains("No space left"), "{err}");
    let files = out.rsplit("FILES:").next().unwrap().trim();
    assert_eq!(files, "", "nothing written to the output's file system");
}

#[test]
fn parts_of_another_set_in_the_folder_are_named_never_read() {
    let h = Home::with_key();
    let (bundle, first) = split_set(&h, &["--parity", "1"]);
    let dir = first.parent().unwrap().to_path_buf();
    let older = files_of(&dir);
    // The same bundle split again into larger parts elsewhere, and copied over the first set
    // (a folder merged by hand): the larger set's parts replace the first few, the first set's
    // last parts and its parity part stay.
    let other = h.path().join("other");
    std::fs::create_dir(&other).unwrap();
    assert_ok(&h.run(&[
        "split",
        bundle.to_str().unwrap(),
        "--size",
        "1M",
        "--output-dir",
        other.to_str().unwrap(),
    ]));
    let newer = files_of(&other);
    for f in &newer {
        std::fs::copy(other.join(f), dir.join(f)).unwrap();
    }
    let strays: Vec<&String> = older.iter().filter(|f| !newer.contains(f)).collect();
    assert!(!strays.is_empty(), "{older:?} {newer:?}");
    let first_s = first.to_str().unwrap();
    for args in [
        vec!["verify", first_s],
        vec!["repair", first_s],
        vec!["join", first_s, "-o", "joined.tar"],
    ] {
        let o = h.run(&args);
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(
            o.status.code(),
            Some(0),
            "{args:?}: the set read is whole\n{all}"
        );
        for s in &strays {
            assert!(
                all.contains(&format!(
                    "{s} is named as a part of this set but belongs to another split set"
                )),
                "{args:?} names {s}: {all}"
            );
        }
        assert!(
            !all.contains("koord-bundle repair"),
            "{args:?}: nothing to repair: {all}"
        );
    }
    // The strays are untouched.
    for s in &strays {
        assert!(dir.join(s).exists(), "{s}");
    }
}

#[test]
fn a_split_killed_among_its_renames_leaves_the_earlier_set_whole() {
    let h = Home::with_key();
    // Without parity: nothing rebuilds a part the new set took.
    let (bundle, first) = split_set(&h, &[]);
    let dir = first.parent().unwrap().to_path_buf();
    let earlier = files_of(&dir);
    let last = dir.join(earlier.last().unwrap());
    // The same bundle split again into the same folder, in smaller parts, SIGKILLed by the
    // kernel at its second rename (strace's fault injection: the moment, exactly).
    let bin = env!("CARGO_BIN_EXE_koord-bundle");
    let o = std::process::Command::new("strace")
        .args([
            "-f",
            "-o",
            "/dev/null",
            "-e",
            "trace=rename,renameat,renameat2",
            "-e",
            "inject=rename,renameat,renameat2:signal=KILL:when=2",
            bin,
            "split",
            bundle.to_str().unwrap(),
            "--size",
            "400K",
            "--output-dir",
            dir.to_str().unwrap(),
        ])
        .env("KOORD_BUNDLE_CONFIG_DIR", h.config())
        .env("KOORD_BUNDLE_CACHE_DIR", h.cache())
        .output()
        .expect("strace");
    assert_ne!(o.status.code(), Some(0), "killed: {o:?}");
    // The earlier set joins whole, from a part the new set did not replace.
    let joined = h.path().join("earlier.tar");
    assert_ok(&h.run(&[
        "join",
        last.to_str().unwrap(),
        "-o",
        joined.to_str().unwrap(),
    ]));
    assert_eq!(
        std::fs::read(&joined).unwrap(),
        std::fs::read(&bundle).unwrap()
    );
    // The split run again finishes; the new set joins; nothing of the earlier one is left.
    let o = h.run(&[
        "split",
        bundle.to_str().unwrap(),
        "--size",
        "400K",
        "--output-dir",
        dir.to_str().unwrap(),
    ]);
    assert_ok(&o);
    let now = files_of(&dir);
    assert!(now.iter().all(|f| !f.starts_with('.')), "{now:?}");
    let again = h.path().join("again.tar");
    assert_ok(&h.run(&[
        "join",
        dir.join(format!("{NAME}.part000")).to_str().unwrap(),
        "-o",
        again.to_str().unwrap(),
    ]));
    assert_eq!(
        std::fs::read(&again).unwrap(),
        std::fs::read(&bundle).unwrap()
    );
}

/// `len` bytes (no bundle: `split` takes any file) named `name`, split with one parity part
/// into `size` parts in `parts/`, signed with `h`'s key; the folder.
fn split_bytes(h: &Home, name: &str, len: usize, size: &str) -> PathBuf {
    let big = h.path().join(name);
    let mut bytes = vec![0u8; len];
    blake3::Hasher::new()
        .update(b"koord-bundle test data")
        .finalize_xof()
        .fill(&mut bytes);
    std::fs::write(&big, &bytes).unwrap();
    let dir = h.path().join("parts");
    std::fs::create_dir_all(&dir).unwrap();
    assert_ok(&h.run(&[
        "split",
        big.to_str().unwrap(),
        "--size",
        size,
        "--parity",
        "1",
        "--output-dir",
        dir.to_str().unwrap(),
    ]));
    dir
}

/// A set of 40 MB of data in 10 MB parts with one parity part (several groups of stripes: the
/// pass reads the next group while one is checked), its header signed by `h`'s key but its
/// parity not the code of its data: a byte of the parity part's first block changed, the block
/// table and the signature made again to match (a mis-made set, signed). One byte of data part
/// 1's first block damaged. Returns the parts, data parts first.
fn signed_set_whose_parity_does_not_code_its_data(h: &Home) -> Vec<PathBuf> {
    let dir = split_bytes(h, NAME, 40_000_000, "10M");
    let mut parts: Vec<PathBuf> = files_of(&dir).iter().map(|f| dir.join(f)).collect();
    parts.sort_by_key(|p| read_first_part(p).index);
    let fp0 = read_first_part(&parts[0]);
    let block = fp0.json["blockSize"].as_u64().unwrap() as usize;
    let k = fp0.json["dataParts"].as_u64().unwrap() as usize;
    assert_eq!(parts.len(), k + 1);
    let blocks =
        |q: usize| (fp0.json["parts"][q]["size"].as_u64().unwrap() as usize).div_ceil(block);
    let mut table = fp0.table.clone();
    let at: usize = (0..k).map(blocks).sum::<usize>() * 16;
    let mut parity = read_first_part(&parts[k]);
    parity.data[10] ^= 0xff;
    table[at..at + 16].copy_from_slice(&block_digest(&parity.data[..block]));
    let mut json = fp0.json.clone();
    json["blockTable"]["sha256"] = sha256(&table).into();
    // The forged header signed with the home's key by minisign itself.
    let signing = h.path().join("signing");
    std::fs::create_dir_all(&signing).unwrap();
    std::fs::write(signing.join("h.json"), serde_json::to_vec(&json).unwrap()).unwrap();
    let key = h.config().join("koord-bundle.key");
    assert_ok(&tool(
        "minisign",
        &["-S", "-s", key.to_str().unwrap(), "-m", "h.json"],
        &signing,
    ));
    let sig = std::fs::read(signing.join("h.json.minisig")).unwrap();
    for p in &parts {
        let mut fp = read_first_part(p);
        if fp.index == k {
            fp.data = parity.data.clone();
        }
        if fp.index == 1 {
            fp.data[100] ^= 0x01;
        }
        fp.json = json.clone();
        fp.table = table.clone();
        fp.sig = sig.clone();
        write_first_part(p, &fp);
    }
    parts
}

#[test]
fn repair_of_a_signed_set_whose_parity_does_not_code_its_data_ends_refused() {
    let h = Home::with_key();
    let parts = signed_set_whose_parity_does_not_code_its_data(&h);
    let before: Vec<Vec<u8>> = parts.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let first = parts[0].to_str().unwrap();
    // join reads the same set and refuses it.
    let o = output_within(
        h.cmd(&["join", first, "-o", "joined.tar"]),
        Duration::from_secs(60),
        "join to end",
    );
    assert_fails(&o, 1, &["does not match its digest"]);
    // repair stopped with the reading thread still waiting for a buffer: it hung, 0 % CPU.
    let o = output_within(
        h.cmd(&["repair", first]),
        Duration::from_secs(60),
        "repair to end (it hung when the check failed while the next group was being read)",
    );
    let err = assert_fails(
        &o,
        1,
        &[
            "rebuilt from parity, does not match its digest",
            "nothing was written",
        ],
    );
    assert!(err.contains(".part001"), "names the part: {err}");
    for (p, b) in parts.iter().zip(&before) {
        assert!(&std::fs::read(p).unwrap() == b, "{} unchanged", p.display());
    }
}

/// A whole set of `k` sparse data parts of `size` bytes each and one sparse parity part (zeros
/// code zeros), in blocks of 1 MiB, unsigned, next to `first`'s name: a long check (every block
/// read and hashed) that uses no disk and writes nothing.
fn sparse_set(first: &Path, k: usize, size: u64) -> Vec<PathBuf> {
    let mut fp = read_first_part(first);
    let block = 1u64 << 20;
    let count = k + 1;
    let offset = 4u64 << 20;
    // Every block zeros, as read from the sparse files: a whole set, nothing written.
    let zeros = block_digest(&vec![0u8; block as usize]);
    let table = zeros.repeat(count * (size / block) as usize);
    claim_geometry(&mut fp, k, size, block, offset, table);
    fp.data = Vec::new();
    let dir = first.parent().unwrap();
    for f in files_of(dir) {
        std::fs::remove_file(dir.join(f)).unwrap();
    }
    (0..count)
        .map(|i| {
            let name = if i < k {
                format!("{NAME}.part{i:03}")
            } else {
                format!("{NAME}.parity000")
            };
            let p = dir.join(name);
            fp.index = i;
            write_first_part(&p, &fp);
            std::fs::OpenOptions::new()
                .write(true)
                .open(&p)
                .unwrap()
                .set_len(offset + size)
                .unwrap();
            p
        })
        .collect()
}

#[test]
fn sigint_ends_a_repair_started_with_sigint_ignored() {
    let h = Home::with_key();
    let first = split_bytes(&h, NAME, 100_000, "64K").join(format!("{NAME}.part000"));
    // 4 data parts and a parity part of 8 GiB each (sparse): minutes of reading and hashing.
    let parts = sparse_set(&first, 4, 8 << 30);
    // Started as a script's background job is: SIGINT ignored, inherited (it then ran on,
    // deaf to SIGINT).
    let mut cmd = h.cmd(&[
        "repair",
        parts[0].to_str().unwrap(),
        "--insecure-skip-signature",
    ]);
    let program = cmd.get_program().to_owned();
    let mut sh = std::process::Command::new("sh");
    sh.arg("-c")
        .arg("trap '' INT; exec \"$0\" \"$@\"")
        .arg(program)
        .args(cmd.get_args())
        .current_dir(h.path());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => sh.env(k, v),
            None => sh.env_remove(k),
        };
    }
    cmd = sh;
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    /// Killed when the test fails.
    struct Running(std::process::Child);
    impl Drop for Running {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Running(cmd.spawn().unwrap());
    let pid = child.0.id();
    // Once it reads the parts (past its own start, its header reads and the parity part's
    // header copy): 256 MiB read.
    wait_until("repair to read the set", Duration::from_secs(60), || {
        if let Some(status) = child.0.try_wait().unwrap() {
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(&mut child.0.stderr.take().unwrap(), &mut err);
            panic!("repair ended before it was interrupted ({status}): {err}");
        }
        std::fs::read_to_string(format!("/proc/{pid}/io"))
            .ok()
            .and_then(|io| {
                io.lines()
                    .find_map(|l| l.strip_prefix("rchar: ").map(|n| n.trim().parse::<u64>()))
            })
            .is_some_and(|n| n.is_ok_and(|n| n > 256 << 20))
    });
    assert!(child.0.try_wait().unwrap().is_none(), "still running");
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGINT) }, 0);
    let ended = wait_for("repair to end on SIGINT", Duration::from_secs(20), || {
        child
            .0
            .try_wait()
            .unwrap()
            .ok_or("still running".to_string())
    });
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.0.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(ended.code(), Some(130), "{err}");
    assert!(err.contains("interrupted (SIGINT)"), "{err}");
}

#[test]
fn a_damaged_part_next_to_another_set_is_never_read_as_that_set() {
    let h = Home::with_key();
    // A part of one set, alone, next to the parts of another bundle's set.
    let dir = split_bytes(&h, NAME, 300_000, "100K");
    split_bytes(&h, "other.tar", 300_000, "100K");
    for f in files_of(&dir) {
        if f.starts_with(NAME) && f != format!("{NAME}.part001") {
            std::fs::remove_file(dir.join(f)).unwrap();
        }
    }
    let part = dir.join(format!("{NAME}.part001"));
    let intact = std::fs::read(&part).unwrap();
    // The set id, from its part line (`part 1 of 5 set ID check C`).
    let line = String::from_utf8_lossy(intact.split(|&c| c == b'\n').nth(1).unwrap()).to_string();
    let id = line.split(' ').nth(5).unwrap().to_string();
    let run = |damaged: &[u8], needles: &[&str]| {
        std::fs::write(&part, damaged).unwrap();
        let p = part.to_str().unwrap();
        for args in [
            vec!["verify", p],
            vec!["repair", p],
            vec!["join", p, "-o", "joined.tar"],
        ] {
            let o = h.run(&args);
            let err = assert_fails(&o, 1, needles);
            assert!(
                err.contains("other.tar.part000 (set ") && err.contains("of other.tar)"),
                "{args:?} names the other set's parts: {err}"
            );
            assert!(!h.path().join("joined.tar").exists(), "{args:?}");
            assert!(!h.path().join("other.tar.joined").exists(), "{args:?}");
        }
        assert_eq!(std::fs::read(&part).unwrap(), damaged, "nothing written");
    };
    // Its part line and header damaged: repair said the other set was whole ("nothing to
    // repair") and join wrote the other bundle, without a word about the part named.
    let mut damaged = intact.clone();
    damaged[..300].fill(b'x');
    run(
        &damaged,
        &[
            "no other part of a set that names it as its part next to it has an intact one",
            "of other split sets, never read as its set",
        ],
    );
    // Its part line intact, its header damaged: the set its part line names is said.
    let mut damaged = intact.clone();
    let at = damaged.iter().position(|&c| c == b'{').unwrap() + 20;
    damaged[at] ^= 0x20;
    run(
        &damaged,
        &[
            &format!("no other part of its set ({id}, as its part line says)"),
            "of other split sets, never read as its set",
        ],
    );
}
