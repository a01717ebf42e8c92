//! What a user reads: errors that never echo untrusted bytes raw, cause chains without
//! repetition, progress lines that agree with the summary, messages that say what to do.

use crate::common::*;
use std::io::Write as _;
use std::process::Stdio;

/// Nothing in `text` a terminal would act on or show other than as written: no control
/// character but the line break, no bidi override or zero-width character, no replacement
/// character standing for bytes that are not UTF-8.
fn assert_terminal_safe(what: &str, raw: &[u8]) {
    let text = std::str::from_utf8(raw)
        .unwrap_or_else(|e| panic!("{what}: output is not UTF-8 ({e}): {raw:?}"));
    for c in text.chars() {
        let bad = (c.is_control() && c != '\n')
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}' | '\u{fffd}');
        assert!(!bad, "{what}: {c:?} reached the terminal:\n{text}");
    }
}

/// A file that looks like a tar header whose fields hold an escape sequence, a bidi override,
/// a bell and bytes that are not UTF-8, then random bytes.
fn hostile_file(path: &std::path::Path) {
    let mut header = [0u8; 512];
    let name = "evil\u{1b}[2J\u{1b}]0;owned\u{7}\u{202e}txt.gpj".as_bytes();
    header[..name.len()].copy_from_slice(name);
    // mode, uid, gid, size, mtime, checksum: garbage, escape sequences and invalid UTF-8.
    let fields = b"\x1b[31m\xff\xfe\x07\x1b[0m\xe2\x80\xae\x00";
    for (i, b) in header[100..156].iter_mut().enumerate() {
        *b = fields[i % fields.len()];
    }
    let mut bytes = header.to_vec();
    let mut x: u32 = 0x1234_5678;
    for _ in 0..20_000 {
        // xorshift: reproducible noise.
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        bytes.push((x >> 24) as u8);
    }
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn errors_about_a_random_file_never_echo_its_bytes_raw() {
    let h = Home::with_key();
    let f = h.path().join("random.tar");
    hostile_file(&f);
    for args in [
        vec!["verify", f.to_str().unwrap(), "--insecure-skip-signature"],
        vec!["verify", f.to_str().unwrap()],
        vec!["inspect", f.to_str().unwrap()],
        vec!["join", f.to_str().unwrap()],
    ] {
        let o = h.run(&args);
        assert_fails(&o, 1, &["random.tar"]);
        assert_terminal_safe(&args.join(" "), &o.stderr);
    }
}

#[test]
fn cause_chains_do_not_repeat_themselves() {
    let h = Home::new();
    // A missing bundle: the OS error once, not once per wrapper.
    let o = h.run(&["inspect", "no-such.tar"]);
    let err = assert_fails(&o, 1, &["No such file or directory"]);
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    // A directory for a bundle: said once (issue 21: one message in every command).
    let o = h.run(&["inspect", "."]);
    let err = assert_fails(&o, 1, &["is a directory, not a bundle"]);
    assert_eq!(err.matches("is a directory").count(), 1, "{err}");
    // A bundle checked with the wrong public key: the sentence once.
    let b = Built::new();
    let other = Home::with_key();
    let o = h.run(&[
        "verify",
        b.bundle.to_str().unwrap(),
        "--key",
        other.pubkey().to_str().unwrap(),
    ]);
    let err = assert_fails(&o, 1, &["signature check failed"]);
    assert_eq!(err.matches("signature check failed").count(), 1, "{err}");
    assert!(!err.contains("caused by"), "{err}");
}

/// The blob counts of the summary line `registry R: COUNTS; manifests …`.
fn summary_of(out: &str) -> String {
    out.lines()
        .find(|l| l.starts_with("registry "))
        .and_then(|l| l.split_once(": "))
        .and_then(|(_, rest)| rest.split_once("; manifests"))
        .map(|(blobs, _)| blobs.to_string())
        .unwrap_or_else(|| panic!("no summary line:\n{out}"))
}

/// `pushing: …` / `checking registry: …` (stderr) and `registry R: …; manifests …` (stdout):
/// the blob counts of both.
fn push_lines(o: &std::process::Output) -> (String, String) {
    let err = String::from_utf8_lossy(&o.stderr);
    let progress = err
        .lines()
        .find_map(|l| {
            l.strip_prefix("pushing: ")
                .or_else(|| l.strip_prefix("checking registry: "))
        })
        .unwrap_or_else(|| panic!("no progress line:\n{err}"))
        .to_string();
    (progress, summary_of(&String::from_utf8_lossy(&o.stdout)))
}

#[test]
fn reload_and_dry_run_progress_lines_agree_with_the_summary() {
    let e = env();
    let b = Built::new();
    let registry = format!("{}/{}", e.plain, unique_prefix("agree"));
    let load = |extra: &[&str]| {
        let o = b
            .home
            .load_cmd(&b.bundle, &registry, &["--plain-http", "--no-install"])
            .args(extra)
            .output()
            .unwrap();
        assert_ok(&o);
        o
    };
    // Before anything is there: the plan, then the push.
    let (p, s) = push_lines(&load(&["--dry-run"]));
    assert_eq!(p, s);
    assert!(
        p.starts_with("would push ") && p.contains("0 already there (0 B)"),
        "{p}"
    );
    let (p, s) = push_lines(&load(&[]));
    assert_eq!(p, s);
    assert!(
        p.starts_with("pushed ") && !p.starts_with("pushed 0 "),
        "{p}"
    );
    // A re-load and a dry run of it: nothing to push, everything already there, in both lines.
    for extra in [&[][..], &["--dry-run"][..]] {
        let (p, s) = push_lines(&load(extra));
        assert_eq!(p, s, "{extra:?}");
        assert!(
            p.contains("push 0 of ") || p.starts_with("pushed 0 of "),
            "{p}"
        );
        assert!(!p.contains(" 0 already there"), "{p}");
    }
    // On a terminal the bar's closing line is whole, not cut to the bar's message column.
    let script = format!(
        "{} load {} --registry {registry} --plain-http --key {} --no-install",
        env!("CARGO_BIN_EXE_koord-bundle"),
        b.bundle.display(),
        b.home.pubkey().display()
    );
    let o = std::process::Command::new("script")
        .args(["-qec", &script, "/dev/null"])
        .env("KOORD_BUNDLE_CONFIG_DIR", b.home.config())
        .env("KOORD_BUNDLE_CACHE_DIR", b.home.cache())
        .env("HOME", b.home.path())
        .env("TERM", "xterm")
        .output()
        .expect("script (util-linux) runs a command on a pseudo-terminal");
    assert_ok(&o);
    let tty = strip_ansi(&String::from_utf8_lossy(&o.stdout));
    let summary = tty
        .split(&format!("registry {registry}: "))
        .nth(1)
        .and_then(|rest| rest.split_once("; manifests"))
        .map(|(blobs, _)| blobs.to_string())
        .unwrap_or_else(|| panic!("no summary on the terminal:\n{tty}"));
    assert!(
        tty.contains(&format!("pushing: {summary}")),
        "the terminal's closing line differs from the summary {summary:?}:\n{tty}"
    );
}

/// `s` without terminal escape sequences (CSI: ESC [ parameters final-byte).
fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for f in chars.by_ref() {
                if ('@'..='~').contains(&f) {
                    break;
                }
            }
        } else if c != '\r' {
            out.push(c);
        }
    }
    out
}

#[test]
fn split_below_the_minimum_part_size_names_the_minimum() {
    let b = Built::new();
    let h = Home::new();
    for size in ["0", "1", "1K", "63K"] {
        let o = h.run(&[
            "split",
            b.bundle.to_str().unwrap(),
            "--size",
            size,
            "--output-dir",
            h.path().to_str().unwrap(),
        ]);
        let err = assert_fails(&o, 1, &["minimum part size of 64 KiB", "64K"]);
        assert!(!err.contains("invalid size"), "{size}: {err}");
    }
    let o = h.run(&["build", "1.8.0", "--split", "1K", "--dry-run"]);
    assert_fails(&o, 1, &["minimum part size of 64 KiB"]);
    // Not a size at all: the formats.
    let o = h.run(&["split", b.bundle.to_str().unwrap(), "--size", "lots"]);
    assert_fails(&o, 1, &["invalid size", "K, M, G or T"]);
}

#[test]
fn an_unknown_source_lists_every_name_chart_included() {
    let h = Home::new();
    let o = h.run(&["build", "1.8.0", "--source", "quay", "--dry-run"]);
    assert_fails(
        &o,
        1,
        &[
            "unknown source \"quay\"",
            "chart, aliyun, aliyun-hangzhou, dockerhub, ghcr",
        ],
    );
}

#[test]
fn verify_and_load_help_say_any_part_of_a_split_bundle_is_taken() {
    let h = Home::new();
    for cmd in ["verify", "load", "inspect", "serve", "join", "repair"] {
        let o = h.run(&[cmd, "--help"]);
        assert_ok(&o);
        let help = String::from_utf8_lossy(&o.stdout);
        assert!(help.contains("any part"), "{cmd} --help:\n{help}");
    }
}

#[test]
fn a_short_password_does_not_mangle_what_helm_prints() {
    // The password `e`: the old scrubbing turned helm's "deployed" into "d<redacted>ploy…".
    // The plain registry takes any login; the real control plane takes the install.
    let e = env();
    let b = Built::new();
    let kube = crate::cluster::lease();
    kube.seed_nodes("kubeadm");
    let registry = format!("{}/{}", e.plain, unique_prefix("shortpw"));
    let mut child = b
        .home
        .load_cmd(
            &b.bundle,
            &registry,
            &[
                "--plain-http",
                "--username",
                "someone",
                "--password-stdin",
                "--kubeconfig",
                kube.kubeconfig.to_str().unwrap(),
                "--helm",
                e.helm4.to_str().unwrap(),
            ],
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"e\n").unwrap();
    let o = child.wait_with_output().unwrap();
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("STATUS: deployed"), "{err}");
    assert!(!err.contains("<redacted>"), "{err}");
}

#[test]
fn build_into_a_missing_directory_fails_before_any_network_access() {
    // The Helm repository and the source are addresses where nothing listens: had the build
    // gone to the network first, it would have failed there (exit 3), not on the directory.
    let h = Home::with_key();
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let cache = h.path().join("fresh-cache");
    let out = h.path().join("no-such-dir/koordinator.tar");
    let o = h
        .build("1.8.0")
        .repo(&format!("http://{dead}/"))
        .source(&dead)
        .args(&["--cache", cache.to_str().unwrap()])
        .out(&out)
        .run();
    let err = assert_fails(
        &o,
        1,
        &["no-such-dir", "does not exist", "nothing was done"],
    );
    assert!(!err.contains("nothing listens"), "{err}");
    let cached = walkdir(&cache);
    assert!(cached.is_empty(), "the cache got {cached:?}");
}

fn walkdir(d: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(d) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                v.extend(walkdir(&p));
            } else {
                v.push(p);
            }
        }
    }
    v
}
