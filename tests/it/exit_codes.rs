//! The exit-code contract (README, "Exit codes"), a test per row, through the binary:
//! 0 success; 1 the input is wrong (fix it, do not retry); 2 a usage error (clap's); 3 an
//! internal or transient failure (a retry or an operator may help).

use crate::common::*;
use std::path::Path;

const INPUT: i32 = 1;
const USAGE: i32 = 2;
const INTERNAL: i32 = 3;

/// `127.0.0.1:PORT` where nothing listens.
fn dead_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

fn build(h: &Home, extra: &[&str]) -> std::process::Output {
    let out = h.path().join("b.tar");
    let helm = env().helm3.to_str().unwrap();
    let mut args = vec![
        "build",
        "1.8.0",
        "-o",
        out.to_str().unwrap(),
        "--helm",
        helm,
    ];
    args.extend_from_slice(extra);
    h.run(&args)
}

fn load(b: &Built, extra: &[&str]) -> std::process::Output {
    let key = b.home.pubkey();
    let mut args = vec![
        "load",
        b.bundle.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
        "--no-install",
    ];
    args.extend_from_slice(extra);
    b.home.run(&args)
}

#[test]
fn build_with_every_image_source_unreachable_is_3() {
    let e = env();
    let h = Home::with_key();
    let (a, b) = (dead_addr(), dead_addr());
    let o = build(
        &h,
        &[
            "--repo",
            &e.helm_repo,
            "--source",
            &a,
            "--source",
            &b,
            "--plain-http",
        ],
    );
    assert_fails(
        &o,
        INTERNAL,
        &["no source has", &a, &b, "nothing listens on"],
    );
}

#[test]
fn build_with_no_source_holding_an_image_is_1() {
    // Every source answered, and none has it: the input (sources, version) is wrong.
    let e = env();
    let h = Home::with_key();
    let o = build(
        &h,
        &[
            "--repo",
            &e.helm_repo,
            "--source",
            &format!("{}/{}", e.plain, unique_prefix("nothing-here")),
            "--plain-http",
        ],
    );
    assert_fails(&o, INPUT, &["no source has", "not found"]);
}

#[test]
fn build_with_the_helm_repository_unreachable_is_3_and_a_missing_index_is_1() {
    let e = env();
    let h = Home::with_key();
    let dead = dead_addr();
    let o = build(
        &h,
        &[
            "--repo",
            &format!("http://{dead}/"),
            "--source",
            &e.plain,
            "--plain-http",
        ],
    );
    let err = assert_fails(
        &o,
        INTERNAL,
        &[
            "Helm repository index",
            &format!("nothing listens on {dead}"),
        ],
    );
    assert!(!err.contains("retrying"), "{err}");
    // The repository answers, but there is no index there: a wrong --repo.
    let o = build(
        &h,
        &[
            "--repo",
            &format!("{}no-such-dir/", e.helm_repo),
            "--source",
            &e.plain,
            "--plain-http",
        ],
    );
    assert_fails(&o, INPUT, &["Helm repository index", "404"]);
}

#[test]
fn build_from_a_plain_http_source_without_the_flag_is_1() {
    let e = env();
    let h = Home::with_key();
    let o = build(&h, &["--repo", &e.helm_repo, "--source", &e.plain]);
    assert_fails(&o, INPUT, &["speaks plain HTTP", "--plain-http"]);
}

#[test]
fn build_of_a_version_that_does_not_exist_is_1() {
    let h = Home::with_key();
    let o = h.build("9.9.9").run();
    assert_fails(&o, INPUT, &["no version matching \"9.9.9\"", "1.8.0"]);
}

#[test]
fn load_into_a_plain_http_registry_without_the_flag_is_1() {
    let e = env();
    let b = Built::new();
    let o = load(
        &b,
        &[
            "--registry",
            &format!("{}/{}", e.plain, unique_prefix("noflag")),
        ],
    );
    assert_fails(&o, INPUT, &["speaks plain HTTP", "--plain-http"]);
}

#[test]
fn load_with_a_wrong_password_is_1() {
    let e = env();
    let b = Built::new();
    let key = b.home.pubkey();
    let mut c = b.home.cmd(&[
        "load",
        b.bundle.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
        "--no-install",
        "--registry",
        &format!("{}/{}", e.tls, unique_prefix("wrongpw")),
        "--ca-file",
        e.ca_file.to_str().unwrap(),
        "--username",
        &e.username,
        "--password-stdin",
    ]);
    let o = run_with_stdin(&mut c, "not-the-password\n");
    let err = assert_fails(&o, INPUT, &["refused the credentials", &e.username]);
    assert!(!err.contains("not-the-password"), "{err}");
}

#[test]
fn load_into_an_unreachable_registry_is_3() {
    let dead = dead_addr();
    let b = Built::new();
    let o = load(&b, &["--registry", &format!("{dead}/x"), "--plain-http"]);
    assert_fails(&o, INTERNAL, &["cannot reach", &dead]);
}

#[test]
fn usage_errors_are_2() {
    let h = Home::new();
    for (args, says) in [
        (&["frobnicate"][..], "unrecognized subcommand"),
        (
            &["verify", "x.tar", "--no-such-flag"][..],
            "unexpected argument",
        ),
        (&["load", "x.tar"][..], "--registry"),
        (
            &["load", "x.tar", "--registry", "r", "--username", "u"][..],
            "--password-stdin",
        ),
        (
            &["load", "x.tar", "--registry", "r", "--jobs", "many"][..],
            "invalid value",
        ),
        (&["split", "x.tar"][..], "--size"),
        (&["build", "1.8.0", "1.7.0"][..], "unexpected argument"),
        (
            &["build", "--sign-key", "k", "--unsigned"][..],
            "cannot be used with",
        ),
        (&[][..], "Usage"),
    ] {
        let o = h.run(args);
        assert_fails(&o, USAGE, &[says]);
    }
    // Asking for help is not an error.
    for args in [&["--help"][..], &["load", "--help"][..], &["--version"][..]] {
        assert_ok(&h.run(args));
    }
}

#[test]
fn verification_failures_and_bad_bundles_are_1() {
    let b = Built::new();
    let h = Home::new();
    // One byte changed in the middle of a bundle.
    let mut bytes = std::fs::read(&b.bundle).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    let damaged = h.path().join("damaged.tar");
    std::fs::write(&damaged, &bytes).unwrap();
    let key = b.home.pubkey();
    let o = h.run(&[
        "verify",
        damaged.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ]);
    assert_fails(&o, INPUT, &["damaged.tar"]);
    // Signed by another key.
    let other = Home::with_key();
    let o = h.run(&[
        "verify",
        b.bundle.to_str().unwrap(),
        "--key",
        other.pubkey().to_str().unwrap(),
    ]);
    assert_fails(&o, INPUT, &["signature"]);
    // Not a bundle at all, and not there at all.
    let junk = h.path().join("junk.tar");
    std::fs::write(&junk, vec![7u8; 10_000]).unwrap();
    let o = h.run(&[
        "verify",
        junk.to_str().unwrap(),
        "--insecure-skip-signature",
    ]);
    assert_fails(&o, INPUT, &["junk.tar"]);
    let o = h.run(&["inspect", "no-such.tar"]);
    assert_fails(&o, INPUT, &["no-such.tar", "No such file"]);
}

/// Run `script` in a private mount namespace where `dir` is a small tmpfs filled to the last
/// byte.
fn on_a_full_disk(h: &Home, dir: &Path, script: &str) -> std::process::Output {
    let d = dir.display();
    in_tmpfs(
        h,
        dir,
        "64k",
        &format!(
            "mkdir {d}/keys && (dd if=/dev/zero of={d}/fill bs=4k 2>/dev/null; true) && {script}"
        ),
    )
}

#[test]
fn a_full_disk_is_3() {
    // build's output, the cache, split and join on a full disk: tests/it/faults.rs and
    // hostile.rs. Here: the two small writers, keygen and inspect --manifest.
    let b = Built::new();
    let h = Home::new();
    let full = h.path().join("full");
    let bin = env!("CARGO_BIN_EXE_koord-bundle");
    let d = full.display();
    for script in [
        format!("{bin} keygen --unencrypted --output-dir {d}/keys"),
        format!(
            "{bin} inspect {} --manifest {d}/old.json",
            b.bundle.display()
        ),
    ] {
        let o = on_a_full_disk(&h, &full, &script);
        assert_fails(&o, INTERNAL, &["No space left on device"]);
    }
}

#[test]
fn registry_address_typos_are_1_and_name_the_rule() {
    // Issue 21, item 8: each typo is named with the rule it breaks, and no internal
    // placeholder reference reaches the message.
    let b = Built::new();
    for (registry, says) in [
        (
            "127.0.0.1:1500l",
            "port \"1500l\" is not a number from 1 to 65535",
        ),
        ("/Site1", "the registry host is missing"),
        ("127.0.0.1:5000/Site1", "repository names are lower case"),
        ("127.0.0.1:5000//site1", "empty path component"),
        ("reg_istry.example:5000", "which a host name cannot hold"),
    ] {
        let o = load(&b, &["--registry", registry]);
        let err = assert_fails(&o, INPUT, &[says]);
        assert!(!err.contains("x:t"), "{registry}: {err}");
        assert!(!err.contains("bad URL"), "{registry}: {err}");
    }
    // A name the name service does not know is most often a typo: 1, said so (README).
    let o = load(&b, &["--registry", "locahost:15001", "--plain-http"]);
    assert_fails(
        &o,
        INPUT,
        &[
            "locahost does not resolve",
            "check the spelling",
            "did you mean localhost?",
        ],
    );
    for (addr, says) in [
        ("locahost:0", "locahost does not resolve"),
        ("127.0.0.1:1500l", "port \"1500l\""),
        ("localhost", "the port is missing"),
    ] {
        let o = b
            .home
            .run(&["serve", b.bundle.to_str().unwrap(), "--addr", addr]);
        assert_fails(&o, INPUT, &[says]);
    }
}
