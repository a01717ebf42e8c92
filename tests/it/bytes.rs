//! Every byte written once (issue 23): a build's bytes depend only on its inputs, a stopped
//! build resumes from its own `.partial`, earlier bundles are the cache; and Ctrl-C during a
//! build (issue 21) says what it kept.

use crate::common::*;
use crate::fake_registry::{self, BlobMode};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// `build --json` output.
fn json_of(o: &std::process::Output) -> Value {
    assert_ok(o);
    serde_json::from_slice(&o.stdout).expect("build --json prints JSON")
}

/// The bytes of a file, for comparing bundles (small ones: a few MiB).
fn bytes(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Wait until the wall clock shows another second than at `since` (so two builds do not run
/// within the same second: the bytes must not depend on it).
fn next_second(since: std::time::SystemTime) {
    let secs =
        |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    wait_until(
        "the clock to show the next second",
        Duration::from_secs(5),
        || secs(std::time::SystemTime::now()) > secs(since),
    );
}

/// The `created` of a chart version in the test environment's repository index, as
/// `date -u` writes it in RFC 3339 seconds (a peer, not our parser).
fn index_created(version: &str) -> String {
    let text = curl(&["-sS"], &format!("{}index.yaml", env().helm_repo)).body;
    let index: Value = serde_yaml_ng::from_slice(&text).expect("index.yaml");
    let created = index["entries"]["koordinator"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["version"] == version)
        .and_then(|e| e["created"].as_str())
        .unwrap_or_else(|| panic!("no created for {version}"))
        .to_string();
    let o = Command::new("date")
        .args(["-u", "-d", &created, "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .unwrap();
    assert!(o.status.success(), "date -d {created}");
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

/// A blob of a plain-tar bundle: its path in the tar, where its bytes are, its bytes.
fn blob_entries(bundle: &Path) -> Vec<(String, u64, Vec<u8>)> {
    let mut ar = tar::Archive::new(std::fs::File::open(bundle).unwrap());
    let mut out = Vec::new();
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let p = e.path().unwrap().to_string_lossy().to_string();
        if p.starts_with("blobs/sha256/") && e.header().entry_type().is_file() {
            let pos = e.raw_file_position();
            let mut b = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut b).unwrap();
            out.push((p, pos, b));
        }
    }
    out
}

/// How many of `blobs` (of the clean bundle) `partial` holds at their places already.
fn present(partial: &Path, blobs: &[(String, u64, Vec<u8>)]) -> usize {
    let Ok(f) = std::fs::File::open(partial) else {
        return 0;
    };
    blobs
        .iter()
        .filter(|(_, pos, b)| {
            let mut got = vec![0u8; b.len()];
            std::os::unix::fs::FileExt::read_exact_at(&f, &mut got, *pos).is_ok() && &got == b
        })
        .count()
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

fn wait_exit(mut child: Child, what: &str) -> (i32, String) {
    let mut code = None;
    wait_until(what, Duration::from_secs(60), || {
        code = child.try_wait().unwrap().map(|s| s.code().unwrap_or(-1));
        code.is_some()
    });
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    (code.unwrap(), err)
}

/// A build's bytes depend on its inputs only: built twice, in different seconds, without
/// SOURCE_DATE_EPOCH, and once more with --no-cache (nothing taken from the bundles before),
/// the three are byte for byte the same; `created` (koord-bundle.json) and the chart artifact's
/// `org.opencontainers.image.created` are the index entry's `created`. The second build
/// downloads no blob (they come from the first bundle, re-hashed), and the cache directory
/// holds an index of kilobytes, no blob. (Before: `created` took the clock and the second
/// bundle differed in its manifest, its chart artifact's digest and its checksum file; the
/// second build took every blob from a copy in the cache directory as large as the bundle.)
#[test]
fn same_inputs_same_bytes_and_the_second_build_downloads_nothing() {
    let h = Home::with_key();
    let (a, b, c) = (
        h.path().join("a.tar"),
        h.path().join("b.tar"),
        h.path().join("c.tar"),
    );
    let first = json_of(&h.build("1.8.0").out(&a).arg("--json").run());
    assert!(first["fetch"]["downloadedBytes"].as_u64().unwrap() > 0);
    next_second(std::time::SystemTime::now());
    let second = json_of(&h.build("1.8.0").out(&b).arg("--json").run());
    assert!(
        bytes(&a) == bytes(&b),
        "two builds of the same inputs differ"
    );
    assert_eq!(second["fetch"]["downloadedBytes"], 0, "{second}");
    assert_eq!(
        second["fetch"]["cachedBlobs"],
        second["counts"]["copied"]["blobs"]
    );
    next_second(std::time::SystemTime::now());
    json_of(
        &h.build("1.8.0")
            .out(&c)
            .args(&["--json", "--no-cache"])
            .run(),
    );
    assert!(
        bytes(&a) == bytes(&c),
        "a clean build differs from one made of earlier bundles"
    );
    // The creation time is the index entry's.
    let created = index_created("1.8.0");
    let m = bundle_manifest(&a);
    assert_eq!(m["created"], created.as_str());
    assert_eq!(first["created"], created.as_str());
    let chart = m["chart"]["oci"]["digest"].as_str().unwrap().to_string();
    let (_, _, raw) = blob_entries(&a)
        .into_iter()
        .find(|(p, _, _)| p.ends_with(&chart[7..]))
        .expect("the chart artifact's manifest in the bundle");
    let artifact: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(
        artifact["annotations"]["org.opencontainers.image.created"],
        created.as_str()
    );
    // The cache directory: the index, kilobytes; no blob store.
    let mut total = 0;
    for e in std::fs::read_dir(h.cache()).unwrap() {
        let e = e.unwrap();
        assert!(
            e.file_type().unwrap().is_file(),
            "{:?} in the cache",
            e.path()
        );
        total += e.metadata().unwrap().len();
    }
    assert!(total < 64 * 1024, "the cache directory holds {total} bytes");
    assert!(!h.cache().join("blobs").exists());
}

/// A bundle of 1.8.0 after one of 1.7.0: the blobs both carry come from the 1.7.0 bundle.
#[test]
fn a_newer_version_reuses_what_the_older_bundle_holds() {
    let h = Home::with_key();
    let (old, _) = h.build_plain("1.7.0", &[]);
    let new = h.path().join("new.tar");
    let b = json_of(&h.build("1.8.0").out(&new).arg("--json").run());
    let list = |p: &Path| -> std::collections::BTreeSet<String> {
        bundle_manifest(p)["blobList"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap().to_string())
            .collect()
    };
    let shared: u64 = blob_entries(&new)
        .iter()
        .filter(|(p, _, _)| list(&old).contains(&format!("sha256:{}", &p[13..])))
        .filter(|(p, _, _)| {
            // Configs and layers (what the copy moves; manifests are written from memory).
            let m = bundle_manifest(&new);
            !m["images"]
                .as_array()
                .unwrap()
                .iter()
                .any(|i| i["digest"].as_str().unwrap().ends_with(&p[13..]))
        })
        .map(|(_, _, b)| b.len() as u64)
        .sum();
    let cached = b["fetch"]["cachedBytes"].as_u64().unwrap();
    assert!(cached > 0, "nothing reused from the 1.7.0 bundle: {b}");
    assert!(
        !h.cache().join("blobs").exists(),
        "a second copy in a blob store"
    );
    assert!(
        cached <= shared,
        "reused {cached} bytes, only {shared} are shared"
    );
    assert_eq!(
        cached + b["fetch"]["downloadedBytes"].as_u64().unwrap(),
        b["counts"]["copied"]["bytes"].as_u64().unwrap(),
        "every byte is reused or downloaded, once"
    );
    let o = h.run(&[
        "verify",
        new.to_str().unwrap(),
        "--key",
        h.pubkey().to_str().unwrap(),
    ]);
    assert_ok(&o);
}

/// An indexed bundle changed in place (one byte, its modification time put back, so the index
/// cannot tell): its blob is refused by the re-hash, said, and fetched again; the bundle built
/// is whole. A deleted bundle: said once, its blobs fetched again, then forgotten.
#[test]
fn a_changed_or_deleted_earlier_bundle_is_refused_and_fetched_again() {
    let h = Home::with_key();
    let (old, _) = h.build_plain("1.8.0", &[]);
    let (path, at) = largest_blob(&old);
    let size = blob_entries(&old)
        .into_iter()
        .find(|(p, _, _)| *p == path)
        .map(|(_, _, b)| b.len() as u64)
        .unwrap();
    let mtime = std::fs::metadata(&old).unwrap().modified().unwrap();
    flip_byte(&old, at + 10);
    std::fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let b1 = h.path().join("b1.tar");
    let o = h.build("1.8.0").out(&b1).arg("--json").run();
    let b = json_of(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("blob sha256:{} of earlier bundle", &path[13..]))
            && err.contains("refused"),
        "{err}"
    );
    assert_eq!(b["fetch"]["downloadedBytes"].as_u64().unwrap(), size, "{b}");
    let o = h.run(&[
        "verify",
        b1.to_str().unwrap(),
        "--key",
        h.pubkey().to_str().unwrap(),
    ]);
    assert_ok(&o);
    // b1 is indexed now; the changed bundle was forgotten. Delete b1: said once.
    std::fs::remove_file(&b1).unwrap();
    let o = h
        .build("1.8.0")
        .out(&h.path().join("b2.tar"))
        .arg("--json")
        .run();
    let b = json_of(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("b1.tar").count(), 1, "{err}");
    assert!(err.contains("is gone"), "{err}");
    assert!(
        !err.contains(old.to_str().unwrap()),
        "the changed bundle is said once: {err}"
    );
    assert_eq!(
        b["fetch"]["downloadedBytes"],
        b["counts"]["copied"]["bytes"]
    );
    let o = h
        .build("1.8.0")
        .out(&h.path().join("b3.tar"))
        .arg("--json")
        .run();
    let b = json_of(&o);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("b1.tar"));
    assert_eq!(b["fetch"]["downloadedBytes"], 0);
}

/// A damaged index is said, and rebuilt: the build goes on (downloading), the next one reuses.
#[test]
fn a_damaged_index_is_said_and_rebuilt() {
    let h = Home::with_key();
    std::fs::create_dir_all(h.cache()).unwrap();
    std::fs::write(
        h.cache().join("bundles.json"),
        b"{\"version\":1,\"bundles\":[{\"pa",
    )
    .unwrap();
    let o = h
        .build("1.8.0")
        .out(&h.path().join("a.tar"))
        .arg("--json")
        .run();
    let b = json_of(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bundles.json is damaged"), "{err}");
    assert!(b["fetch"]["downloadedBytes"].as_u64().unwrap() > 0);
    let o = h
        .build("1.8.0")
        .out(&h.path().join("b.tar"))
        .arg("--json")
        .run();
    assert!(!String::from_utf8_lossy(&o.stderr).contains("damaged"));
    assert_eq!(json_of(&o)["fetch"]["downloadedBytes"], 0);
}

/// A build whose one extra image stalls on its layer, with the clean bundle of the same inputs
/// to compare with.
struct Stalled {
    h: Home,
    fake: fake_registry::FakeRegistry,
    clean: PathBuf,
    blobs: Vec<(String, u64, Vec<u8>)>,
    image: String,
}

impl Stalled {
    fn new() -> Stalled {
        let h = Home::with_key();
        let layer: Vec<u8> = (0..3_000_000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let fake = fake_registry::start("slow/img", "v1", layer, BlobMode::Good);
        let image = format!("{}/slow/img:v1", fake.addr);
        let clean = h.path().join("clean.tar");
        let s = Stalled {
            h,
            fake,
            clean,
            blobs: vec![],
            image,
        };
        json_of(&s.build(&s.clean).run());
        let blobs = blob_entries(&s.clean);
        *s.fake.mode.lock().unwrap() = BlobMode::StallAfter(1_000_000);
        Stalled { blobs, ..s }
    }

    /// The build (--no-cache: what it keeps can only come from its own `.partial`).
    fn build(&self, out: &Path) -> Build<'_> {
        self.h
            .build("1.8.0")
            .args(&["--image", &self.image, "--json", "--no-cache"])
            .out(out)
    }

    fn spawn(&self, out: &Path) -> Child {
        self.build(out)
            .cmd()
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn partial(&self, out: &Path) -> PathBuf {
        out.with_file_name(format!(
            ".{}.partial",
            out.file_name().unwrap().to_string_lossy()
        ))
    }

    /// Wait until the `.partial` of `out` holds `n` of the clean bundle's blobs.
    fn wait_for(&self, out: &Path, n: usize) {
        let p = self.partial(out);
        wait_until(
            &format!("{n} blobs in {}", p.display()),
            Duration::from_secs(120),
            || present(&p, &self.blobs) >= n,
        );
    }

    /// The same build, the layer served again: byte for byte the clean bundle; the build's
    /// JSON.
    fn finish(&self, out: &Path) -> Value {
        *self.fake.mode.lock().unwrap() = BlobMode::Good;
        let b = json_of(&self.build(out).run());
        *self.fake.mode.lock().unwrap() = BlobMode::StallAfter(1_000_000);
        assert!(
            bytes(out) == bytes(&self.clean),
            "the resumed bundle differs from a clean build"
        );
        assert!(
            !self.partial(out).exists(),
            "the .partial stayed after the build"
        );
        b
    }
}

/// SIGKILL at several points (one blob written, half of them, all but the stalled layer and its
/// manifest), then
/// the same build: byte for byte the clean build, every blob the killed run finished kept from
/// its `.partial` (re-hashed), not fetched again. (Before: a random temporary name, removed by
/// the next run; a resumed build could not be compared with a clean one.)
#[test]
fn sigkill_at_several_points_then_the_same_build_is_the_clean_build() {
    let s = Stalled::new();
    let all = s.blobs.len();
    assert!(all > 4, "{all} blobs");
    // All but the stalled layer and its image's manifest (written after its blobs).
    for (i, n) in [1, all / 2, all - 2].into_iter().enumerate() {
        let out = s.h.path().join(format!("k{i}.tar"));
        let mut child = s.spawn(&out);
        s.wait_for(&out, n);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            !out.exists(),
            "a killed build left a file at the output path"
        );
        let b = s.finish(&out);
        let kept = b["fetch"]["resumedBlobs"].as_u64().unwrap() as usize;
        assert!(kept >= n, "killed with {n} blobs written, {kept} kept: {b}");
    }
}

/// Ctrl-C (SIGINT) and SIGTERM during a build: it says it was interrupted and what it kept to
/// resume, exits 130 / 143, leaves nothing at the output path; the same command then resumes.
/// (Before: it printed nothing and left `.NAME.XXXX.partial`, found by no later run.)
#[test]
fn ctrl_c_and_sigterm_say_what_is_kept_and_the_same_command_resumes() {
    let s = Stalled::new();
    let out = s.h.path().join("r.tar");
    for (sig, code, name) in [
        (libc::SIGINT, 130, "SIGINT"),
        (libc::SIGTERM, 143, "SIGTERM"),
    ] {
        let gets = s.fake.layer_gets.load(std::sync::atomic::Ordering::SeqCst);
        let child = s.spawn(&out);
        s.wait_for(&out, s.blobs.len() - 2);
        // (The second time the .partial holds them from the start: wait for the layer's GET.)
        wait_until(
            "the build to ask for the layer",
            Duration::from_secs(60),
            || s.fake.layer_gets.load(std::sync::atomic::Ordering::SeqCst) > gets,
        );
        signal(&child, sig);
        let (got, err) = wait_exit(child, "the interrupted build to exit");
        assert_eq!(got, code, "{err}");
        assert!(
            err.contains(&format!(
                "interrupted ({name}): kept {}",
                s.partial(&out).display()
            )) && err
                .contains("to resume: run the same command again; delete it to free the space"),
            "{err}"
        );
        assert!(!out.exists());
        assert!(s.partial(&out).exists());
    }
    // Another output in the same folder names the one left, with its size.
    *s.fake.mode.lock().unwrap() = BlobMode::Good;
    let o = s.build(&s.h.path().join("other.tar")).run();
    json_of(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(".r.tar.partial") && err.contains("interrupted build of another output"),
        "{err}"
    );
    let b = s.finish(&out);
    assert!(
        b["fetch"]["resumedBlobs"].as_u64().unwrap() as usize >= s.blobs.len() - 2,
        "{b}"
    );
}

/// Ctrl-C while helm renders the chart: helm is ended with the build (its process group
/// killed), which says nothing was written yet and exits 130. (Without `child::kill_all` on
/// the signal, helm lives on after the build.)
#[test]
fn ctrl_c_while_helm_runs_ends_helm() {
    let h = Home::with_key();
    let pidfile = h.path().join("helm.pid");
    let wrapper = h.path().join("slow-helm");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = template ] && {{ echo $$ > '{}'; exec sleep 300; }}; done\nexec '{}' \"$@\"\n",
            pidfile.display(),
            env().helm3.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let child = h
        .build("1.8.0")
        .helm(Some(&wrapper))
        .out(&h.path().join("a.tar"))
        .cmd()
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("helm template to start", Duration::from_secs(60), || {
        std::fs::read_to_string(&pidfile).is_ok_and(|p| p.ends_with('\n'))
    });
    let helm: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    signal(&child, libc::SIGINT);
    let (code, err) = wait_exit(child, "the interrupted build to exit");
    assert_eq!(code, 130, "{err}");
    assert!(
        err.contains("interrupted (SIGINT): nothing was written yet"),
        "{err}"
    );
    let gone = || {
        std::fs::read_to_string(format!("/proc/{helm}/stat"))
            .map(|s| s.split(' ').nth(2) == Some("Z"))
            .unwrap_or(true)
    };
    wait_until("helm to end with the build", Duration::from_secs(10), gone);
}

/// `--reuse BUNDLE` feeds the same mechanism without the index (`--no-cache`): a plain bundle
/// of the same version gives every blob; a gzip bundle cannot be read at offsets, is said and
/// skipped.
#[test]
fn reuse_takes_blobs_from_a_named_bundle_and_says_why_a_gzip_one_cannot() {
    let h = Home::with_key();
    let (old, _) = h.build_plain("1.8.0", &["--no-cache"]);
    let gz = h.path().join("old.tar.gz");
    json_of(
        &h.build("1.8.0")
            .out(&gz)
            .args(&["--json", "--no-cache", "--compress", "gzip"])
            .run(),
    );
    let out = h.path().join("new.tar");
    let o = h
        .build("1.8.0")
        .out(&out)
        .args(&[
            "--json",
            "--no-cache",
            "--reuse",
            old.to_str().unwrap(),
            "--reuse",
            gz.to_str().unwrap(),
        ])
        .run();
    let b = json_of(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("old.tar.gz: a gzip bundle cannot be read at offsets"),
        "{err}"
    );
    assert_eq!(b["fetch"]["downloadedBytes"], 0, "{b}");
    assert_eq!(b["fetch"]["cachedBlobs"], b["counts"]["copied"]["blobs"]);
    assert!(bytes(&old) == bytes(&out));
    assert!(!h.cache().exists(), "--no-cache wrote the cache directory");
}

/// A blob cut off mid-way by SIGKILL is continued where what was written of it ends (a range
/// request), checked whole at its end; when that prefix does not hold (a byte of it changed),
/// the whole blob is fetched again. Both give the clean bundle, byte for byte.
#[test]
fn a_blob_cut_off_mid_way_is_continued_and_a_bad_prefix_is_fetched_again() {
    let s = Stalled::new();
    let layer_hex = &s.fake.layer_digest[7..];
    let (_, pos, layer) = s
        .blobs
        .iter()
        .find(|(p, _, _)| p.ends_with(layer_hex))
        .cloned()
        .unwrap();
    for (i, spoil) in [false, true].into_iter().enumerate() {
        *s.fake.mode.lock().unwrap() = BlobMode::StallAfter(2_500_000);
        let out = s.h.path().join(format!("cut{i}.tar"));
        let partial = s.partial(&out);
        let mut child = s.spawn(&out);
        // The first MiB of the layer is in place (the writer writes a MiB at a time).
        wait_until(
            "a MiB of the layer written",
            Duration::from_secs(120),
            || {
                let mut got = vec![0u8; 1 << 20];
                std::fs::File::open(&partial).is_ok_and(|f| {
                    std::os::unix::fs::FileExt::read_exact_at(&f, &mut got, pos).is_ok()
                        && got == layer[..1 << 20]
                })
            },
        );
        child.kill().unwrap();
        child.wait().unwrap();
        if spoil {
            flip_byte(&partial, pos + 1000);
        }
        let before = s.fake.ranges.lock().unwrap().len();
        let b = s.finish(&out);
        let ranges: Vec<u64> = s.fake.ranges.lock().unwrap()[before..].to_vec();
        let resumed = b["fetch"]["resumedBytes"].as_u64().unwrap();
        if spoil {
            // Continued, refused at its end, fetched again from its start.
            assert!(ranges.first().is_some_and(|&r| r >= 1 << 20), "{ranges:?}");
            assert!(
                b["fetch"]["downloadedBytes"].as_u64().unwrap() >= layer.len() as u64,
                "{b}"
            );
        } else {
            assert_eq!(ranges.len(), 1, "one range request: {ranges:?}");
            assert!(
                ranges[0] >= 1 << 20 && resumed >= ranges[0],
                "{ranges:?} {b}"
            );
        }
    }
}
