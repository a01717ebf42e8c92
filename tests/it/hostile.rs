//! Hostile input, round 2 (issue 10): each test is an attack that worked against an earlier
//! binary, run through the binary the way a user would meet it.

use crate::common::*;
use crate::serve_proc::start;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A signed split bundle in its own directory; returns (home, the first part).
fn split_bundle() -> (Home, PathBuf) {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.8.0", &[]);
    let dir = h.path().join("parts");
    std::fs::create_dir(&dir).unwrap();
    let o = h.run(&[
        "split",
        bundle.to_str().unwrap(),
        "--size",
        "600K",
        "--output-dir",
        dir.to_str().unwrap(),
    ]);
    assert_ok(&o);
    (h, dir.join("koordinator-1.8.0.tar.part000"))
}

#[test]
fn join_never_writes_where_the_part_header_says() {
    let (h, first) = split_bundle();
    let victim = h.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let first_s = first.to_str().unwrap();
    let original = std::fs::read(&first).unwrap();

    // 1. The header edited (a larger part size allowed), its old signature kept: the
    // signature fails.
    let mut fp = read_first_part(&first);
    fp.json["partSize"] = (fp.json["partSize"].as_u64().unwrap() + 1).into();
    write_first_part(&first, &fp);
    let o = h.run(&["join", first_s]);
    assert_fails(&o, 1, &["signature"]);
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");

    // 2. The same header unsigned: refused, since nothing vouches for its names.
    fp.sig.clear();
    write_first_part(&first, &fp);
    let o = h.run(&["join", first_s]);
    assert_fails(&o, 1, &["not signed", "--insecure-skip-signature"]);
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");

    // 3. Told to skip the signature: an absolute path, or one with `..`, as the bundle's name
    // is a malformed header (the parts' names are made of it), refused before anything is read.
    for name in [
        victim.to_str().unwrap(),
        "../victim",
        "sub/../../victim",
        "..",
    ] {
        fp.json["bundle"]["file"] = name.into();
        write_first_part(&first, &fp);
        let o = h.run(&["join", first_s, "--insecure-skip-signature"]);
        let err = assert_fails(&o, 1, &["not a plain file name"]);
        assert!(!err.contains('\u{1b}'), "{err}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "{name}");
    }

    // 4. A part name with a path in it: refused by every reader, before any part is read.
    let mut fp = read_first_part(&first);
    fp.json["parts"][1]["file"] = "../victim".into();
    fp.sig.clear();
    write_first_part(&first, &fp);
    let o = h.run(&["verify", first_s, "--insecure-skip-signature"]);
    assert_fails(&o, 1, &["is not a plain file name"]);

    // 5. The genuine header: joined under its plain name in the current directory (where the
    // bundle split was built: moved away, join replaces no file without --force).
    std::fs::write(&first, &original).unwrap();
    std::fs::remove_file(h.path().join("koordinator-1.8.0.tar")).unwrap();
    let o = h.run(&["join", first_s, "--json"]);
    assert_ok(&o);
    let joined = h.path().join("koordinator-1.8.0.tar");
    assert!(joined.is_file());
    assert_ok(&h.run(&["verify", joined.to_str().unwrap()]));
}

#[test]
fn verify_refuses_data_after_the_end_of_the_archive() {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.8.0", &[]);

    // Zero padding (what tar writes to fill a record) is fine.
    let padded = h.path().join("padded.tar");
    let mut bytes = std::fs::read(&bundle).unwrap();
    bytes.extend_from_slice(&[0u8; 10240]);
    std::fs::write(&padded, &bytes).unwrap();
    assert_ok(&h.run(&["verify", padded.to_str().unwrap()]));

    // A second archive appended: `tar -i` would extract it; verify must refuse it.
    let evil_dir = h.path().join("evil");
    std::fs::create_dir(&evil_dir).unwrap();
    std::fs::write(evil_dir.join("evil.sh"), b"#!/bin/sh\necho pwned\n").unwrap();
    let evil_tar = h.path().join("evil.tar");
    assert_ok(&tool(
        "tar",
        &[
            "-cf",
            evil_tar.to_str().unwrap(),
            "-C",
            evil_dir.to_str().unwrap(),
            "evil.sh",
        ],
        h.path(),
    ));
    let appended = h.path().join("appended.tar");
    let mut bytes = std::fs::read(&bundle).unwrap();
    bytes.extend_from_slice(&std::fs::read(&evil_tar).unwrap());
    std::fs::write(&appended, &bytes).unwrap();
    let o = h.run(&["verify", appended.to_str().unwrap()]);
    assert_fails(&o, 1, &["data after the end of the tar archive"]);
    // ... and so does load, before anything is pushed.
    let o = h.run(&[
        "load",
        appended.to_str().unwrap(),
        "--registry",
        "127.0.0.1:9/x",
        "--no-install",
    ]);
    assert_fails(
        &o,
        1,
        &[
            "data after the end of the tar archive",
            "nothing was pushed",
        ],
    );

    // The same with a gzip bundle and a second gzip member.
    let gz = h.path().join("b.tar.gz");
    let o = h
        .build("1.8.0")
        .args(&["--compress", "gzip"])
        .out(&gz)
        .run();
    assert_ok(&o);
    assert_ok(&h.run(&["verify", gz.to_str().unwrap()]));
    let evil_gz = h.path().join("evil.tar.gz");
    assert_ok(&tool(
        "tar",
        &[
            "-czf",
            evil_gz.to_str().unwrap(),
            "-C",
            evil_dir.to_str().unwrap(),
            "evil.sh",
        ],
        h.path(),
    ));
    let mut bytes = std::fs::read(&gz).unwrap();
    bytes.extend_from_slice(&std::fs::read(&evil_gz).unwrap());
    let gz2 = h.path().join("two-members.tar.gz");
    std::fs::write(&gz2, &bytes).unwrap();
    let o = h.run(&["verify", gz2.to_str().unwrap()]);
    assert_fails(&o, 1, &["data after the end of the tar archive"]);
}

#[test]
fn load_refuses_a_gzip_bundle_before_verifying_it() {
    let h = Home::new();
    // Not even a valid bundle: refused for what it is (gzip), without reading it through.
    let gz = h.path().join("koordinator-1.8.0.tar.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(&vec![7u8; 1 << 20]).unwrap();
    std::fs::write(&gz, enc.finish().unwrap()).unwrap();
    let o = h.run(&[
        "load",
        gz.to_str().unwrap(),
        "--registry",
        "127.0.0.1:9/x",
        "--no-install",
        "--insecure-skip-signature",
    ]);
    let err = assert_fails(
        &o,
        1,
        &["gzip-compressed", "gunzip -k", "nothing was verified"],
    );
    assert!(!err.contains("verifying"), "{err}");
}

#[test]
fn a_build_removes_what_a_killed_build_left_next_to_its_output() {
    let h = Home::with_key();
    let out = h.path().join("koordinator-1.8.0.tar");
    // What a build killed while writing leaves: hidden temporary files nobody holds.
    let left = [
        h.path().join(".koordinator-1.8.0.tar.a1B2c3.partial"),
        h.path().join(".koordinator-1.8.0.tar.Zz9Yy8.partial"),
    ];
    for l in &left {
        std::fs::write(l, vec![0u8; 4096]).unwrap();
    }
    // Files of other names are none of its business.
    let other = h.path().join(".other.tar.a1B2c3.partial");
    std::fs::write(&other, b"x").unwrap();
    let (bundle, _) = h.build_plain("1.8.0", &[]);
    assert_eq!(bundle, out);
    for l in &left {
        assert!(!l.exists(), "{} is still there", l.display());
    }
    assert!(other.exists());
    let hidden: Vec<String> = std::fs::read_dir(h.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with(".koordinator"))
        .collect();
    assert!(hidden.is_empty(), "{hidden:?}");
}

/// Open `n` idle connections from `src` (a loopback address) to `addr` and keep them open,
/// reopening those the server closes, until `stop` is set; returns how many were reopened.
/// `held` counts, as it goes, the clients holding their `n` sockets and the sockets reopened.
fn hold_idle(
    src: &'static str,
    addr: &str,
    n: usize,
    stop: Arc<AtomicBool>,
    held: Arc<Held>,
) -> std::thread::JoinHandle<usize> {
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        let connect = || -> Option<TcpStream> {
            rt.block_on(async {
                let s = tokio::net::TcpSocket::new_v4().ok()?;
                s.bind(format!("{src}:0").parse().ok()?).ok()?;
                s.connect(addr).await.ok()?.into_std().ok()
            })
        };
        let mut socks: Vec<Option<TcpStream>> = (0..n).map(|_| connect()).collect();
        held.clients.fetch_add(1, Ordering::SeqCst);
        let mut reopened = 0;
        let mut buf = [0u8; 64];
        while !stop.load(Ordering::SeqCst) {
            for s in socks.iter_mut() {
                let closed = match s.as_mut().map(|t| t.read(&mut buf)) {
                    None | Some(Ok(0)) => true,
                    Some(Err(e)) => e.kind() != std::io::ErrorKind::WouldBlock,
                    Some(Ok(_)) => false,
                };
                if closed {
                    *s = connect();
                    reopened += 1;
                    held.reopened.fetch_add(1, Ordering::SeqCst);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        reopened
    })
}

/// What the clients of [`hold_idle`] did so far.
#[derive(Default)]
struct Held {
    /// Clients that opened their sockets.
    clients: AtomicUsize,
    /// Sockets the server closed and a client reopened.
    reopened: AtomicUsize,
}

#[test]
fn serve_is_not_starved_by_one_client_holding_idle_sockets() {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.8.0", &[]);
    let server = start(&h, &[bundle.to_str().unwrap(), "--max-connections", "128"]);
    let addr = server
        .url("http", "")
        .trim_start_matches("http://")
        .to_string();

    // Three clients hold 100 idle sockets each, reopening what is closed: more than all 128
    // places, and more than each one's share (64).
    let stop = Arc::new(AtomicBool::new(false));
    let held = Arc::new(Held::default());
    let attackers: Vec<_> = ["127.0.0.1", "127.0.0.3", "127.0.0.4"]
        .into_iter()
        .map(|src| hold_idle(src, &addr, 100, stop.clone(), held.clone()))
        .collect();
    // Probe once the server is full: all three hold their sockets, and it has begun closing
    // those beyond a client's share.
    wait_for(
        "the server to close sockets beyond a client's share",
        Duration::from_secs(60),
        || {
            let clients = held.clients.load(Ordering::SeqCst);
            let reopened = held.reopened.load(Ordering::SeqCst);
            if clients == 3 && reopened > 0 {
                Ok(())
            } else {
                Err(format!(
                    "{clients} of 3 clients hold their sockets, {reopened} sockets reopened"
                ))
            }
        },
    );
    // The server gives up only sockets idle for at least half a second (a newcomer's request
    // may be on its way), so a newcomer is turned away until the attackers' sockets reach that
    // age: the first answer is the server giving one up for it.
    let url = format!("http://{addr}/v2/");
    let probe = || curl(&["--max-time", "20", "--interface", "127.0.0.2"], &url).status == 200;
    wait_until(
        "a new client to be answered while idle sockets fill the server",
        Duration::from_secs(60),
        probe,
    );
    // From then on, every request of a new client is answered (each probe is a new connection).
    let answered = (0..10).filter(|_| probe()).count();
    stop.store(true, Ordering::SeqCst);
    let reopened: usize = attackers.into_iter().map(|a| a.join().unwrap()).sum();
    assert_eq!(
        answered, 10,
        "probes answered while idle sockets filled the server"
    );
    assert!(
        reopened > 0,
        "the server closed sockets beyond a client's share"
    );
    let log = server.stderr();
    assert!(log.contains("connection closed at once"), "{log}");
}

#[test]
fn serve_range_requests_never_return_bytes_changed_after_verification() {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.8.0", &[]);
    let pristine = h.path().join("pristine.tar");
    std::fs::copy(&bundle, &pristine).unwrap();
    assert_ok(&tool(
        "touch",
        &["-r", bundle.to_str().unwrap(), pristine.to_str().unwrap()],
        h.path(),
    ));
    let (entry, offset) = largest_blob(&bundle);
    let digest = format!("sha256:{}", entry.rsplit('/').next().unwrap());
    let m = bundle_manifest(&bundle);
    let key = h.pubkey();
    let s = start(
        &h,
        &[bundle.to_str().unwrap(), "--key", key.to_str().unwrap()],
    );
    let repo = s.repo_with_blob(&m, &digest);
    let url = s.url("http", &format!("/v2/{repo}/blobs/{digest}"));
    let whole = curl(&[], &url).body;
    assert_eq!(sha256(&whole), digest);
    assert!(whole.len() > 3000, "a blob large enough to change inside");
    // A range read before the change is served (and makes serve take the chunk digests).
    let r = curl(&["-r", "1000-1999"], &url);
    assert_eq!((r.status, &r.body[..]), (206, &whole[1000..2000]));

    // Changed in place with its size and time stamp put back: the range that covers the change
    // must not arrive; the transfer breaks off, and the blob is refused from then on.
    flip_byte(&bundle, offset + 1500);
    assert_ok(&tool(
        "touch",
        &["-r", pristine.to_str().unwrap(), bundle.to_str().unwrap()],
        h.path(),
    ));
    let r = curl(&["-r", "1000-1999"], &url);
    assert_ne!(
        r.body,
        whole[1000..2000].to_vec(),
        "changed bytes were served"
    );
    assert!(r.body.len() < 1000, "{} bytes arrived", r.body.len());
    let log = s.wait_log("changed in bytes");
    assert!(
        log.contains("the bundle changed after verification"),
        "{log}"
    );
    assert_eq!(curl(&["-r", "0-9"], &url).status, 500);
}

/// Run `script` in a private mount namespace where `dir` is a 600 KiB tmpfs.
fn in_small_disk(h: &Home, dir: &Path, script: &str) -> std::process::Output {
    in_tmpfs(h, dir, "600k", script)
}

#[test]
fn a_full_disk_is_exit_3_in_the_cache_in_split_and_in_join() {
    let h = Home::with_key();
    // Not indexed: the build below downloads every blob into its blob store.
    let (bundle, _) = h.build_plain("1.8.0", &["--no-cache"]);
    let bin = env!("CARGO_BIN_EXE_koord-bundle");
    let small = h.path().join("small");
    let check = |what: &str, o: std::process::Output| {
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert_eq!(
            o.status.code(),
            Some(3),
            "{what}: exit 3 for a full disk\n{err}"
        );
        assert!(err.contains("No space left on device"), "{what}: {err}");
    };
    // The blob cache on the full disk.
    let o = in_small_disk(
        &h,
        &small,
        &h.build("1.8.0")
            .args(&["--cache", &format!("{}/cache", small.display())])
            .out(&h.path().join("b.tar"))
            .shell_line(),
    );
    check("cache", o);
    // split's parts, and join's output.
    let o = in_small_disk(
        &h,
        &small,
        &format!(
            "{bin} split {} --size 200K --output-dir {}",
            bundle.display(),
            small.display()
        ),
    );
    check("split", o);
    let parts = h.path().join("parts");
    std::fs::create_dir(&parts).unwrap();
    assert_ok(&h.run(&[
        "split",
        bundle.to_str().unwrap(),
        "--size",
        "200K",
        "--output-dir",
        parts.to_str().unwrap(),
    ]));
    let o = in_small_disk(
        &h,
        &small,
        &format!(
            "{bin} join {}/koordinator-1.8.0.tar.part000 -o {}/joined.tar",
            parts.display(),
            small.display()
        ),
    );
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    check("join", o);
    // The file that could not be written is named, not the part being read.
    assert!(err.contains("joined.tar"), "join names its output: {err}");
    assert!(!err.contains("part000: No space"), "{err}");
    // keygen on a full disk: exit 3 and no key at all (an empty secret key left behind would
    // make every later keygen refuse, "already exists").
    let keys = small.join("keys");
    let o = in_small_disk(
        &h,
        &small,
        &format!(
            "mkdir {k} && (dd if=/dev/zero of={d}/fill bs=4k 2>/dev/null; true) && {bin} keygen --unencrypted --output-dir {k}; rc=$?; echo; echo FILES:; ls -A {k}; exit $rc",
            k = keys.display(),
            d = small.display()
        ),
    );
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let files = out.rsplit("FILES:").next().unwrap().trim().to_string();
    check("keygen", o);
    assert_eq!(
        files, "",
        "keygen leaves no key (and no temporary file) on a full disk"
    );
}

// ---------------------------------------------------------------------------------------------
// Round 3 (issue 18): sizes that wrap, graphs without end, a binary that never aborts. Each
// hostile registry is an in-process one (`fake_registry::Hostile`): no real registry serves a
// layer of 2^64-1 bytes or an index of 15,000 children.

use crate::fake_registry::{Hostile, HostileRegistry, OCI_INDEX};
use std::process::Output;

/// `build 1.8.0` of the test environment plus `--image FAKE/<image>` for each of `images`,
/// unsigned, into `out/` of the home.
fn build_with(h: &Home, fake: &HostileRegistry, images: &[&str], extra: &[&str]) -> Output {
    let mut b = h
        .build("1.8.0")
        .arg("--unsigned")
        .out(&h.path().join("out/koordinator-1.8.0.tar"));
    for i in images {
        b = b.args(&["--image", &format!("{}/{i}", fake.addr)]);
    }
    std::fs::create_dir_all(h.path().join("out")).unwrap();
    b.args(extra).run()
}

/// Nothing at all in `dir` (no bundle, no hidden temporary file).
fn assert_empty(dir: &Path) {
    let left: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "left in {}: {left:?}", dir.display());
}

/// An image whose one layer declares `size` bytes and is served as zeros without end.
fn endless_image(size: u64) -> (Hostile, String) {
    let mut f = Hostile::default();
    let layer = f.endless_blob("layer", size);
    let d = layer["digest"].as_str().unwrap().to_string();
    f.image("hostile/img", &[layer], Some("v1"), None);
    (f, d)
}

#[test]
fn a_layer_declared_2_pow_64_minus_1_bytes_is_refused_before_anything_is_written() {
    let h = Home::new();
    let (f, layer) = endless_image(u64::MAX);
    let fake = f.start();
    for extra in [&[][..], &["--dry-run"][..]] {
        let o = build_with(&h, &fake, &["hostile/img:v1"], extra);
        let err = assert_fails(&o, 1, &[&layer, "hostile/img:v1", "18446744073709551615"]);
        assert!(err.contains("int64"), "{err}");
        assert!(!err.contains("to download"), "{err}");
    }
    assert_eq!(
        fake.endless_bytes.load(Ordering::SeqCst),
        0,
        "not a byte of it fetched"
    );
    assert_empty(&h.path().join("out"));
    assert_empty(&h.cache().join("partial"));
}

#[test]
fn a_layer_larger_than_the_disk_is_refused_naming_image_and_blob() {
    let h = Home::new();
    let (f, layer) = endless_image(1 << 62);
    let fake = f.start();
    let o = build_with(&h, &fake, &["hostile/img:v1"], &[]);
    let err = assert_fails(&o, 1, &[&layer, "hostile/img:v1", "whole file system"]);
    assert!(!err.contains("File too large"), "{err}");
    assert_eq!(fake.endless_bytes.load(Ordering::SeqCst), 0);
    assert_empty(&h.path().join("out"));
    // --dry-run tells the same before anything is fetched but manifests.
    let o = build_with(&h, &fake, &["hostile/img:v1"], &["--dry-run"]);
    assert_fails(&o, 1, &[&layer, "hostile/img:v1", "whole file system"]);
}

#[test]
fn an_index_of_15000_children_is_refused_before_they_are_fetched() {
    let h = Home::new();
    let mut f = Hostile::default();
    let layer = f.blob(b"one layer");
    let kids: Vec<serde_json::Value> = (0..15_000)
        .map(|i| f.image("hostile/img", std::slice::from_ref(&layer), None, Some(i)))
        .collect();
    f.index("hostile/img", kids, Some("v1"));
    let fake = f.start();
    let o = build_with(&h, &fake, &["hostile/img:v1"], &[]);
    assert_fails(&o, 1, &["hostile/img:v1", "15000", "256"]);
    // The top index only (and no retry of it).
    assert_eq!(fake.manifest_gets.load(Ordering::SeqCst), 1);
    assert_empty(&h.path().join("out"));
}

#[test]
fn indexes_nested_deeper_than_the_bound_are_refused() {
    let h = Home::new();
    let mut f = Hostile::default();
    let layer = f.blob(b"one layer");
    let mut top = f.image("hostile/img", &[layer], None, None);
    for _ in 0..64 {
        top = f.index("hostile/img", vec![top], None);
    }
    let d = top["digest"].as_str().unwrap().to_string();
    let body = serde_json::to_vec(&serde_json::json!({"schemaVersion": 2,
        "mediaType": OCI_INDEX, "manifests": [top]}))
    .unwrap();
    f.raw_manifest("hostile/img", "v1", body, OCI_INDEX);
    let fake = f.start();
    let o = build_with(&h, &fake, &["hostile/img:v1"], &[]);
    assert_fails(
        &o,
        1,
        &["hostile/img:v1", "nested deeper than 4", "\"Bounds\""],
    );
    // The top index and the three under it; the fourth is refused by its descriptor, unread.
    assert_eq!(fake.manifest_gets.load(Ordering::SeqCst), 4, "{d}");
}

#[test]
fn a_bundle_of_more_manifests_than_the_bound_is_refused_while_walking() {
    let h = Home::new();
    let mut f = Hostile::default();
    let layer = f.blob(b"one layer");
    let mut images = Vec::new();
    for n in 0..5 {
        let repo = format!("hostile/img{n}");
        let kids: Vec<serde_json::Value> = (0..250)
            .map(|i| f.image(&repo, std::slice::from_ref(&layer), None, Some(i)))
            .collect();
        f.index(&repo, kids, Some("v1"));
        images.push(format!("{repo}:v1"));
    }
    let fake = f.start();
    let images: Vec<&str> = images.iter().map(String::as_str).collect();
    let o = build_with(&h, &fake, &images, &["--jobs", "1"]);
    assert_fails(&o, 1, &["1000 manifests"]);
    // The walk stopped at the bound: the fifth image's children were not all fetched.
    let gets = fake.manifest_gets.load(Ordering::SeqCst);
    assert!(gets <= 1010, "{gets} manifest fetches");
    assert_empty(&h.path().join("out"));
}

#[test]
fn a_blob_declared_with_two_sizes_is_refused() {
    let h = Home::new();
    let mut f = Hostile::default();
    let layer = f.blob(b"one layer, two sizes");
    let d = layer["digest"].as_str().unwrap().to_string();
    f.image("hostile/a", std::slice::from_ref(&layer), Some("v1"), None);
    let mut lie = layer.clone();
    lie["size"] = (20 + 1000).into();
    f.image("hostile/b", &[lie], Some("v1"), None);
    let fake = f.start();
    let o = build_with(&h, &fake, &["hostile/a:v1", "hostile/b:v1"], &[]);
    // Refused from the plan, naming both images, before any blob was fetched.
    assert_fails(
        &o,
        1,
        &[
            &d,
            "as 20 bytes",
            "as 1020 bytes",
            "hostile/a:v1",
            "hostile/b:v1",
        ],
    );
    assert_empty(&h.path().join("out"));
    assert_empty(&h.cache().join("blobs/sha256"));
}

#[test]
fn a_malformed_answer_is_refused_at_once_naming_the_registry() {
    // A 1 MiB WWW-Authenticate header: no HTTP client takes a head that large.
    let h = Home::new();
    let mut f = Hostile::default();
    f.www_authenticate = Some(format!(
        "Bearer realm=\"http://127.0.0.1:9/token\",service=\"{}\"",
        "x".repeat(1 << 20)
    ));
    let fake = f.start();
    let o = build_with(&h, &fake, &["hostile/img:v1"], &[]);
    let err = assert_fails(&o, 1, &[&fake.addr, "malformed"]);
    assert!(!err.contains("retrying"), "{err}");
    assert_eq!(fake.requests.load(Ordering::SeqCst), 1, "{err}");

    // A manifest that is not the JSON it claims to be.
    let mut f = Hostile::default();
    f.raw_manifest(
        "hostile/img",
        "v1",
        b"<html>a proxy's login page</html>".to_vec(),
        crate::fake_registry::OCI_MANIFEST,
    );
    let fake = f.start();
    let o = build_with(&h, &fake, &["hostile/img:v1"], &[]);
    let err = assert_fails(&o, 1, &[&fake.addr, "hostile/img:v1", "not a valid"]);
    assert!(!err.contains("retrying"), "{err}");
    assert_eq!(fake.manifest_gets.load(Ordering::SeqCst), 1);

    // A manifest asked by digest, served with other bytes.
    let mut f = Hostile::default();
    let layer = f.blob(b"a layer");
    let real = f.image("hostile/img", &[layer], None, None);
    let d = real["digest"].as_str().unwrap().to_string();
    f.raw_manifest(
        "hostile/img",
        &d,
        br#"{"schemaVersion":2,"other":true}"#.to_vec(),
        crate::fake_registry::OCI_MANIFEST,
    );
    let fake = f.start();
    let o = build_with(&h, &fake, &[&format!("hostile/img:v1@{d}")], &[]);
    let err = assert_fails(&o, 1, &[&fake.addr, &d]);
    assert!(!err.contains("retrying"), "{err}");
    assert_eq!(fake.manifest_gets.load(Ordering::SeqCst), 1);
    assert_empty(&h.path().join("out"));
}

#[test]
fn a_panic_anywhere_is_exit_3_with_one_message_saying_it_is_a_bug() {
    // No input reaches a panic (each one found was fixed): the debug binary panics where
    // KOORD_BUNDLE_TEST_PANIC says, as a bug would.
    let h = Home::new();
    for place in ["main", "task", "blocking", "thread"] {
        let o = h
            .cmd(&["inspect", "no-such.tar"])
            .env("KOORD_BUNDLE_TEST_PANIC", place)
            .output()
            .unwrap();
        let err = assert_fails(
            &o,
            3,
            &[
                "internal error",
                "this is a bug in koord-bundle",
                "https://github.com/koordinator-sh/koord-bundle/issues",
            ],
        );
        assert_eq!(err.matches("internal error").count(), 1, "{place}: {err}");
        // The default hook's text is not printed (the message above replaces it).
        assert!(!err.contains("panicked at"), "{place}: {err}");
    }
}

#[test]
fn a_bundle_larger_than_the_whole_disk_is_1_and_nothing_is_fetched() {
    let h = Home::with_key();
    let small = h.path().join("small");
    // A 600 KiB file system for a bundle of about 1.3 MiB: no cleaning makes room.
    let script = format!(
        "{build}; rc=$?; ls -A {small}; exit $rc",
        small = small.display(),
        build = h.build("1.8.0").out(&small.join("b.tar")).shell_line(),
    );
    let o = in_tmpfs(&h, &small, "600k", &script);
    let err = assert_fails(&o, 1, &["whole file system", "its largest blob is sha256:"]);
    assert!(err.contains("of image "), "{err}");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "", "files left");
    // Refused before the first blob was fetched: nothing in the cache.
    let cached: Vec<_> = ["blobs/sha256", "partial"]
        .iter()
        .flat_map(|d| std::fs::read_dir(h.cache().join(d)).into_iter().flatten())
        .collect();
    assert!(cached.is_empty(), "{} files in the cache", cached.len());
}

/// Every hostile case of this file, through the binary: whatever the input, the exit code is
/// one of 0 to 3 (never a signal, an abort's 134 or a panic's 101).
#[test]
fn every_hostile_case_ends_with_an_exit_code_from_0_to_3() {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.8.0", &[]);
    let b = bundle.to_str().unwrap().to_string();
    let bin = env!("CARGO_BIN_EXE_koord-bundle");
    let mut cases: Vec<(String, i32, Output)> = Vec::new();
    let mut case = |name: &str, want: i32, o: Output| cases.push((name.to_string(), want, o));

    // Round 2: a split header edited, data after the tar's end, a gzip bundle to load,
    // leftovers of a killed build, a full disk.
    let parts = h.path().join("parts");
    std::fs::create_dir(&parts).unwrap();
    assert_ok(&h.run(&[
        "split",
        &b,
        "--size",
        "600K",
        "--output-dir",
        parts.to_str().unwrap(),
    ]));
    let first = parts.join("koordinator-1.8.0.tar.part000");
    let mut fp = read_first_part(&first);
    fp.json["bundle"]["file"] = "../victim".into();
    fp.sig.clear();
    write_first_part(&first, &fp);
    let first = first.to_str().unwrap();
    case("join: edited header", 1, h.run(&["join", first]));
    case(
        "join: edited header, signature skipped",
        1,
        h.run(&["join", first, "--insecure-skip-signature"]),
    );
    let appended = h.path().join("appended.tar");
    let mut bytes = std::fs::read(&bundle).unwrap();
    bytes.extend_from_slice(&std::fs::read(&bundle).unwrap()[..4096]);
    std::fs::write(&appended, &bytes).unwrap();
    case(
        "verify: data after the end",
        1,
        h.run(&["verify", appended.to_str().unwrap()]),
    );
    let gz = h.path().join("koordinator-1.8.0.tar.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(&[7u8; 4096]).unwrap();
    std::fs::write(&gz, enc.finish().unwrap()).unwrap();
    case(
        "load: gzip",
        1,
        h.run(&[
            "load",
            gz.to_str().unwrap(),
            "--registry",
            "127.0.0.1:9/x",
            "--no-install",
        ]),
    );
    std::fs::write(
        h.path().join(".koordinator-1.8.0.tar.a1B2c3.partial"),
        [0u8; 64],
    )
    .unwrap();
    case(
        "build: leftovers of a killed build",
        0,
        h.build("1.8.0").run(),
    );
    let small = h.path().join("small");
    case(
        "split: full disk",
        3,
        in_small_disk(
            &h,
            &small,
            &format!(
                "{bin} split {b} --size 200K --output-dir {}",
                small.display()
            ),
        ),
    );

    // Round 3: registries that answer what no registry should.
    let (f, _) = endless_image(u64::MAX);
    let fake = f.start();
    case(
        "build: 2^64-1 bytes",
        1,
        build_with(&h, &fake, &["hostile/img:v1"], &[]),
    );
    case(
        "build --dry-run: 2^64-1 bytes",
        1,
        build_with(&h, &fake, &["hostile/img:v1"], &["--dry-run"]),
    );
    let (f, _) = endless_image(1 << 62);
    let fake = f.start();
    case(
        "build: 2^62 bytes",
        1,
        build_with(&h, &fake, &["hostile/img:v1"], &[]),
    );
    let mut f = Hostile::default();
    let layer = f.blob(b"l");
    let kids = (0..300)
        .map(|i| f.image("hostile/img", std::slice::from_ref(&layer), None, Some(i)))
        .collect();
    f.index("hostile/img", kids, Some("v1"));
    let mut top = f.image("hostile/deep", std::slice::from_ref(&layer), None, None);
    for _ in 0..10 {
        top = f.index("hostile/deep", vec![top], None);
    }
    let body = serde_json::to_vec(&serde_json::json!({"schemaVersion": 2,
        "mediaType": OCI_INDEX, "manifests": [top]}))
    .unwrap();
    f.raw_manifest("hostile/deep", "v1", body, OCI_INDEX);
    f.raw_manifest("hostile/html", "v1", b"<html>".to_vec(), OCI_INDEX);
    let fake = f.start();
    case(
        "build: 300 children",
        1,
        build_with(&h, &fake, &["hostile/img:v1"], &[]),
    );
    case(
        "build: nested 11 deep",
        1,
        build_with(&h, &fake, &["hostile/deep:v1"], &[]),
    );
    case(
        "build: not JSON",
        1,
        build_with(&h, &fake, &["hostile/html:v1"], &[]),
    );
    let mut f = Hostile::default();
    f.www_authenticate = Some(format!(
        "Bearer realm=\"x\",service=\"{}\"",
        "x".repeat(1 << 20)
    ));
    let fake = f.start();
    case(
        "build: 1 MiB head",
        1,
        build_with(&h, &fake, &["hostile/img:v1"], &[]),
    );
    // A tar entry whose header claims 2^64 - 1 bytes.
    let mut huge = tar::Header::new_gnu();
    huge.set_size(u64::MAX);
    huge.set_path("blobs/sha256/x").unwrap();
    huge.set_cksum();
    let mut tarb = std::fs::read(&bundle).unwrap()[..1536].to_vec();
    tarb.extend_from_slice(huge.as_bytes());
    tarb.extend_from_slice(&[0u8; 4096]);
    let t = h.path().join("huge-entry.tar");
    std::fs::write(&t, &tarb).unwrap();
    case(
        "verify: an entry of 2^64-1 bytes",
        1,
        h.run(&["verify", t.to_str().unwrap(), "--insecure-skip-signature"]),
    );
    // serve, asked for ranges at and past u64's end, then told to stop.
    let mut s = start(&h, &[&b]);
    let (entry, _) = largest_blob(&bundle);
    let digest = format!("sha256:{}", entry.rsplit('/').next().unwrap());
    let repo = s.repo_with_blob(&bundle_manifest(&bundle), &digest);
    let url = s.url("http", &format!("/v2/{repo}/blobs/{digest}"));
    for (range, want) in [
        ("18446744073709551615-", 416),
        ("18446744073709551614-18446744073709551615", 416),
        ("0-18446744073709551615", 206),
        ("-18446744073709551615", 206),
        ("99999999999999999999999-1", 416),
    ] {
        let r = curl(&["-H", &format!("Range: bytes={range}")], &url);
        assert_eq!(r.status, want, "serve, Range {range}");
    }
    let code = s.terminate().code();
    assert!(matches!(code, Some(0..=3)), "serve ended with {code:?}");
    for place in ["main", "task", "blocking", "thread"] {
        let o = h
            .cmd(&["verify", &b])
            .env("KOORD_BUNDLE_TEST_PANIC", place)
            .output()
            .unwrap();
        case(&format!("a panic ({place})"), 3, o);
    }

    let mut wrong = Vec::new();
    for (name, want, o) in &cases {
        let code = o.status.code();
        assert!(
            matches!(code, Some(0..=3)),
            "{name}: ended with {:?} ({:?})\n{}",
            code,
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        if code != Some(*want) {
            wrong.push(format!("{name}: {code:?}, expected {want}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn the_blob_cache_on_the_output_disk_counts_before_the_first_byte() {
    let h = Home::with_key();
    let small = h.path().join("small");
    // 2 MiB for a bundle of about 1.3 MiB and its blobs in the cache: both do not fit.
    let script = format!(
        "{build}; rc=$?; ls -A {small}; ls -A {small}/cache/partial; exit $rc",
        small = small.display(),
        build = h
            .build("1.8.0")
            .args(&["--cache", &format!("{}/cache", small.display())])
            .out(&small.join("b.tar"))
            .shell_line(),
    );
    let o = in_tmpfs(&h, &small, "2m", &script);
    assert_fails(&o, 1, &["whole file system", "for the blob cache"]);
    // Nothing but the cache's (empty) directories.
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "cache");
}
