//! Hostile input, round 2 (issue 10): each test is an attack that worked against an earlier
//! binary, run through the binary the way a user would meet it.

use crate::common::*;
use crate::serve::{curl, flip_byte, largest_blob, manifest, pubkey, sha256, start};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A part's pieces (split format v2): header JSON, signature, block table, data.
struct FirstPart {
    index: usize,
    count: usize,
    json: serde_json::Value,
    sig: Vec<u8>,
    table: Vec<u8>,
    data: Vec<u8>,
}

fn read_first_part(p: &Path) -> FirstPart {
    let b = std::fs::read(p).unwrap();
    let mut lines = b.splitn(4, |&c| c == b'\n');
    assert_eq!(lines.next().unwrap(), b"koord-bundle-split v2");
    let ident = std::str::from_utf8(lines.next().unwrap())
        .unwrap()
        .to_string();
    let w: Vec<&str> = ident.split(' ').collect();
    let (index, count) = (w[1].parse().unwrap(), w[3].parse().unwrap());
    let len: usize = std::str::from_utf8(lines.next().unwrap())
        .unwrap()
        .parse()
        .unwrap();
    let rest = lines.next().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&rest[..len]).unwrap();
    let rest = &rest[len + 1..];
    let nl = rest.iter().position(|&c| c == b'\n').unwrap();
    let sig_len: usize = std::str::from_utf8(&rest[..nl]).unwrap().parse().unwrap();
    let sig = rest[nl + 1..nl + 1 + sig_len].to_vec();
    let rest = &rest[nl + 1 + sig_len + 1..];
    let nl = rest.iter().position(|&c| c == b'\n').unwrap();
    let table_len: usize = std::str::from_utf8(&rest[..nl]).unwrap().parse().unwrap();
    let table = rest[nl + 1..nl + 1 + table_len].to_vec();
    let data = b[json["dataOffset"].as_u64().unwrap() as usize..].to_vec();
    FirstPart {
        index,
        count,
        json,
        sig,
        table,
        data,
    }
}

/// Write a part back as an attacker would: its part line made consistent with the edited JSON
/// (set id and check), the data where the JSON says.
fn write_first_part(p: &Path, fp: &FirstPart) {
    use sha2::Digest as _;
    let json = serde_json::to_vec(&fp.json).unwrap();
    let set = hex::encode(&sha2::Sha256::digest(&json)[..16]);
    let rest = format!("part {} of {} set {set}", fp.index, fp.count);
    let check = hex::encode(&sha2::Sha256::digest(rest.as_bytes())[..4]);
    let mut out = format!(
        "koord-bundle-split v2\n{rest} check {check}\n{}\n",
        json.len()
    )
    .into_bytes();
    out.extend_from_slice(&json);
    out.extend_from_slice(format!("\n{}\n", fp.sig.len()).as_bytes());
    out.extend_from_slice(&fp.sig);
    out.extend_from_slice(format!("\n{}\n", fp.table.len()).as_bytes());
    out.extend_from_slice(&fp.table);
    let offset = fp.json["dataOffset"].as_u64().unwrap() as usize;
    assert!(out.len() <= offset, "the edited header still fits its area");
    out.resize(offset, 0);
    out.extend_from_slice(&fp.data);
    std::fs::write(p, out).unwrap();
}

/// A signed split bundle in its own directory; returns (home, the first part).
fn split_bundle() -> (Home, PathBuf) {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.8.0", &[]);
    let dir = h.path().join("parts");
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

    // 1. The header edited to name another file, its old signature kept: the signature fails.
    let mut fp = read_first_part(&first);
    fp.json["bundle"]["file"] = victim.to_str().unwrap().into();
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

    // 3. Told to skip the signature: an absolute path, or one with `..`, is still refused.
    for name in [
        victim.to_str().unwrap(),
        "../victim",
        "sub/../../victim",
        "..",
    ] {
        fp.json["bundle"]["file"] = name.into();
        write_first_part(&first, &fp);
        let o = h.run(&["join", first_s, "--insecure-skip-signature"]);
        let err = assert_fails(&o, 1, &["not a plain file name", "-o FILE"]);
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

    // 5. The genuine header: joined under its plain name in the current directory.
    std::fs::write(&first, &original).unwrap();
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
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while held.clients.load(Ordering::SeqCst) < 3 || held.reopened.load(Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the server closed no socket beyond a client's share ({} of 3 clients holding)",
            held.clients.load(Ordering::SeqCst)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The server gives up only sockets idle for at least half a second (a newcomer's request
    // may be on its way): the attackers' sockets reach that age, then the probes come.
    std::thread::sleep(Duration::from_millis(700));
    // A new client's requests are all answered (each probe is a new connection).
    let url = format!("http://{addr}/v2/");
    let mut answered = 0;
    for _ in 0..10 {
        if curl(&["--max-time", "20", "--interface", "127.0.0.2"], &url).status == 200 {
            answered += 1;
        }
    }
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
    let m = manifest(&h, &bundle);
    let s = start(&h, &[bundle.to_str().unwrap(), "--key", &pubkey(&h)]);
    let repo = image_digests(&m)
        .into_iter()
        .map(|(r, _)| r.split(':').next().unwrap().to_string())
        .find(|r| curl(&["-I"], &s.url("http", &format!("/v2/{r}/blobs/{digest}"))).status == 200)
        .expect("the largest blob is in some image");
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
    let (bundle, _) = h.build_plain("1.8.0", &[]);
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
    check("join", o);
}
