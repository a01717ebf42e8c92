//! Issue 21, "the first hour": what a new user trips over, each through the real binary.

use crate::common::*;
use serde_json::Value;
use std::path::Path;
use std::process::Output;

/// The one JSON document a failing `--json` command prints on stdout, checked against the
/// exit code and stderr of the process.
fn error_doc(o: &Output, what: &str) -> Value {
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{what}: stdout is not one JSON document ({e}):\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    });
    let err = &v["error"];
    assert_eq!(
        err["exitCode"].as_i64(),
        o.status.code().map(i64::from),
        "{what}: {v}"
    );
    let message = err["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: {v}"));
    assert!(
        !message.is_empty() && !message.starts_with("error:"),
        "{what}: {v}"
    );
    assert!(err["causes"].is_array(), "{what}: {v}");
    // The human message is still on stderr.
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains(message),
        "{what}: stderr lacks {message:?}:\n{stderr}"
    );
    v
}

#[test]
fn every_json_command_prints_a_json_error_document_on_failure() {
    let h = Home::with_key();
    let missing = h.path().join("no-such.tar");
    let m = missing.to_str().unwrap();
    let part = h.path().join("no-such.tar.part000");
    let p = part.to_str().unwrap();
    let cases: Vec<(&str, Output)> = vec![
        ("build 9.9.9", h.build("9.9.9").arg("--json").run()),
        ("inspect", h.run(&["inspect", m, "--json"])),
        ("verify", h.run(&["verify", m, "--json"])),
        (
            "load",
            h.run(&[
                "load",
                m,
                "--registry",
                &env().plain,
                "--plain-http",
                "--no-install",
                "--json",
            ]),
        ),
        ("split", h.run(&["split", m, "--size", "1M", "--json"])),
        ("join", h.run(&["join", p, "--json"])),
        ("repair", h.run(&["repair", p, "--json"])),
        // The key pair exists already (Home::with_key).
        ("keygen", h.run(&["keygen", "--unencrypted", "--json"])),
    ];
    for (what, o) in &cases {
        assert_eq!(o.status.code(), Some(1), "{what}: {o:?}");
        error_doc(o, what);
    }
    let v = error_doc(&cases[0].1, "build");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("9.9.9"),
        "{v}"
    );

    // A usage error (exit 2): the same document; clap's message stays on stderr.
    let o = h.run(&["verify", m, "--json", "--no-such-flag"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let v = error_doc(&o, "usage");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--no-such-flag"),
        "{v}"
    );

    // Without --json, stdout stays empty.
    let o = h.run(&["verify", m]);
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty(), "{o:?}");
}

#[test]
fn a_panic_with_json_prints_the_json_error_document_with_exit_3() {
    let h = Home::new();
    for place in ["main", "thread"] {
        let o = h
            .cmd(&["inspect", "no-such.tar", "--json"])
            .env("KOORD_BUNDLE_TEST_PANIC", place)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(3), "{place}: {o:?}");
        let v = error_doc(&o, place);
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.starts_with("internal error"), "{v}");
    }
}

/// A signed bundle of chart 1.8.0 in `h` and a split set of it (two parts) in `h/parts`:
/// (bundle, first part).
fn bundle_and_parts(h: &Home) -> (std::path::PathBuf, std::path::PathBuf) {
    let (bundle, _) = h.build_plain("1.8.0", &[]);
    let parts = h.path().join("parts");
    std::fs::create_dir(&parts).unwrap();
    let o = h.run(&[
        "split",
        bundle.to_str().unwrap(),
        "--size",
        "1M",
        "--output-dir",
        parts.to_str().unwrap(),
    ]);
    assert_ok(&o);
    (bundle, parts.join("koordinator-1.8.0.tar.part000"))
}

const NO_DIR: &str =
    "the output directory nodir does not exist: create it first (mkdir -p nodir); nothing was done";

#[test]
fn a_missing_output_directory_is_refused_the_same_way_by_every_command() {
    let h = Home::with_key();
    let (bundle, part) = bundle_and_parts(&h);
    let b = bundle.to_str().unwrap();
    let p = part.to_str().unwrap();
    let cases: Vec<(&str, Output)> = vec![
        (
            "build -o",
            h.build("1.8.0").args(&["-o", "nodir/x.tar"]).run(),
        ),
        ("join -o", h.run(&["join", p, "-o", "nodir/x.tar"])),
        (
            "split --output-dir",
            h.run(&["split", b, "--size", "1M", "--output-dir", "nodir"]),
        ),
        (
            "keygen --output-dir",
            h.run(&["keygen", "--unencrypted", "--output-dir", "nodir"]),
        ),
        (
            "inspect --manifest",
            h.run(&["inspect", b, "--manifest", "nodir/m.json"]),
        ),
    ];
    for (what, o) in &cases {
        let err = assert_fails(o, 1, &[NO_DIR]);
        assert!(!err.contains(".partial"), "{what}: {err}");
        assert!(
            !h.path().join("nodir").exists(),
            "{what} created the directory"
        );
    }
}

#[test]
fn an_existing_output_file_is_replaced_only_with_force() {
    let h = Home::with_key();
    let (bundle, part) = bundle_and_parts(&h);
    let b = bundle.to_str().unwrap();
    let p = part.to_str().unwrap();
    let notes = h.path().join("notes.txt");
    std::fs::write(&notes, "my notes\n").unwrap();
    let key = h.pubkey();
    let k = key.to_str().unwrap();

    // join -o FILE that exists: refused, the file untouched.
    let o = h.run(&["join", p, "-o", "notes.txt", "--key", k]);
    assert_fails(&o, 1, &["notes.txt already exists: pass --force"]);
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "my notes\n");
    // join without -o where the bundle already is (the home): refused too.
    let before = std::fs::metadata(&bundle).unwrap().modified().unwrap();
    let o = h.run(&["join", p, "--key", k]);
    assert_fails(
        &o,
        1,
        &["koordinator-1.8.0.tar already exists: pass --force"],
    );
    assert_eq!(
        std::fs::metadata(&bundle).unwrap().modified().unwrap(),
        before
    );
    // With --force: replaced, byte-identical to the bundle (sha256sum, a peer).
    let o = h.run(&["join", p, "-o", "notes.txt", "--key", k, "--force"]);
    assert_ok(&o);
    let sum = |f: &std::path::Path| {
        let o = tool("sha256sum", &[f.to_str().unwrap()], h.path());
        String::from_utf8_lossy(&o.stdout)
            .split(' ')
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(sum(&notes), sum(&bundle));

    // inspect --manifest FILE that exists: refused, then replaced with --force.
    std::fs::write(h.path().join("m.json"), "mine").unwrap();
    let o = h.run(&["inspect", b, "--manifest", "m.json"]);
    assert_fails(&o, 1, &["m.json already exists: pass --force"]);
    assert_eq!(
        std::fs::read_to_string(h.path().join("m.json")).unwrap(),
        "mine"
    );
    assert_ok(&h.run(&["inspect", b, "--manifest", "m.json", "--force"]));
    let m: Value =
        serde_json::from_slice(&std::fs::read(h.path().join("m.json")).unwrap()).unwrap();
    assert_eq!(m["chart"]["version"], "1.8.0");

    // keygen over an existing key: refused, the key unchanged.
    let before = std::fs::read(&key).unwrap();
    let o = h.run(&["keygen", "--unencrypted"]);
    assert_fails(&o, 1, &["already exists", "will not overwrite a key"]);
    assert_eq!(std::fs::read(&key).unwrap(), before);
}

#[test]
fn a_directory_given_as_the_bundle_gets_one_message_in_every_command() {
    let h = Home::with_key();
    let dir = h.path().join("adir");
    std::fs::create_dir(&dir).unwrap();
    let d = "adir";
    let msg = "adir is a directory, not a bundle: name the bundle file (NAME.tar, or any part NAME.partNNN of a split set)";
    let plain = env().plain.clone();
    let cases: Vec<(&str, Output)> = vec![
        ("verify", h.run(&["verify", d])),
        ("inspect", h.run(&["inspect", d])),
        ("serve", h.run(&["serve", d, "--addr", "127.0.0.1:0"])),
        (
            "load",
            h.run(&[
                "load",
                d,
                "--registry",
                &plain,
                "--plain-http",
                "--no-install",
            ]),
        ),
        ("split", h.run(&["split", d, "--size", "1M"])),
        ("join", h.run(&["join", d])),
        ("repair", h.run(&["repair", d])),
        (
            "build --since",
            h.build("1.8.0").args(&["--since", d, "--dry-run"]).run(),
        ),
    ];
    for (what, o) in &cases {
        let err = assert_fails(o, 1, &[msg]);
        assert!(!err.contains("os error"), "{what}: {err}");
    }
}

#[test]
fn a_truncated_bundle_is_called_truncated_by_every_reader() {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.8.0", &[]);
    let bytes = std::fs::read(&bundle).unwrap();
    let whole = bytes.len();
    let cut = h.path().join("cut.tar");
    let plain = env().plain.clone();
    // Cut inside a large layer, and at 95 % (after the last layer began: verify named the
    // files it missed).
    for len in [whole * 55 / 100, whole * 95 / 100] {
        std::fs::write(&cut, &bytes[..len]).unwrap();
        let c = cut.to_str().unwrap();
        let said = format!("is truncated: the file is {len} bytes, the bundle needs at least");
        let cases: Vec<(&str, Output)> = vec![
            ("verify", h.run(&["verify", c])),
            ("inspect", h.run(&["inspect", c])),
            ("serve", h.run(&["serve", c, "--addr", "127.0.0.1:0"])),
            (
                "load",
                h.run(&[
                    "load",
                    c,
                    "--registry",
                    &plain,
                    "--plain-http",
                    "--no-install",
                ]),
            ),
        ];
        for (what, o) in &cases {
            let err = assert_fails(o, 1, &[&said, "copy it again in full"]);
            assert!(!err.contains("missing"), "{what}: {err}");
        }
        // The bound is a lower bound: the whole bundle is larger still.
        let err = String::from_utf8_lossy(&cases[0].1.stderr).to_string();
        let needed: usize = err
            .split("needs at least ")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{err}"));
        assert!(
            needed > len && needed <= whole,
            "{len} < {needed} <= {whole}"
        );
    }
    // The whole bundle passes.
    assert_ok(&h.run(&["inspect", bundle.to_str().unwrap()]));
}

#[test]
fn serve_on_loopback_does_not_send_the_nodes_to_127_0_0_1() {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.8.0", &[]);
    let s = crate::serve_proc::start(&h, &[bundle.to_str().unwrap()]);
    let out = s.stdout();
    let port = s.addr.rsplit(':').next().unwrap().to_string();
    let install = out
        .lines()
        .find(|l| l.contains("imageRepositoryHost="))
        .unwrap_or_else(|| panic!("no install advice:\n{out}"));
    assert!(
        install.contains(&format!("imageRepositoryHost=HOST:{port}")),
        "{install}"
    );
    for needle in [
        "loopback address",
        "127.0.0.1 is the node itself",
        &format!("--addr 0.0.0.0:{port}"),
        &format!("container runtimes must treat HOST:{port} as an insecure registry"),
    ] {
        assert!(out.contains(needle), "banner lacks {needle:?}:\n{out}");
    }
    // What this machine runs itself (skopeo, helm pull) still names the address it listens on.
    assert!(
        out.contains(&format!("helm pull oci://{}/", s.addr)),
        "{out}"
    );
}

/// `N blobs in the bundle (X)` of a command's output.
fn blobs_line(out: &str) -> String {
    let at = out
        .find(" blobs in the bundle (")
        .unwrap_or_else(|| panic!("no 'blobs in the bundle':\n{out}"));
    let start = out[..at]
        .rfind(|c: char| !c.is_ascii_digit())
        .map_or(0, |i| i + 1);
    let end = at + out[at..].find(')').unwrap() + 1;
    out[start..end].to_string()
}

#[test]
fn build_inspect_verify_and_load_count_the_same_blobs() {
    let h = Home::with_key();
    let (bundle, built) = h.build_plain("1.8.0", &[]);
    let b = bundle.to_str().unwrap();
    let carried = &built["counts"]["carried"];
    let (count, bytes) = (
        carried["blobs"].as_u64().unwrap(),
        carried["bytes"].as_u64().unwrap(),
    );
    let m = bundle_manifest(&bundle);
    assert_eq!(
        (m["blobs"]["count"].as_u64(), m["blobs"]["bytes"].as_u64()),
        (Some(count), Some(bytes))
    );
    let stdout = |o: &Output| {
        assert_ok(o);
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    let dry = h.build("1.8.0").arg("--dry-run").run();
    let said = blobs_line(&stdout(&dry));
    let inspect = blobs_line(&stdout(&h.run(&["inspect", b])));
    let verify = stdout(&h.run(&["verify", b]));
    assert_eq!(inspect, said);
    assert_eq!(blobs_line(&verify), said);
    assert!(
        said.starts_with(&format!("{count} blobs in the bundle (")),
        "{said}"
    );
    // verify's byte count is of every file, and says so.
    assert!(verify.contains(" in all"), "{verify}");
    // build's own lines use the plan's counts: the configs and layers it writes are the images'
    // (what the dry run counts as to download) and the chart artifact's.
    let download = built["counts"]["download"]["blobs"].as_u64().unwrap();
    let copied = built["counts"]["copied"]["blobs"].as_u64().unwrap();
    assert!(stdout(&dry).contains(&format!("the images' {download} (")));
    let real = h.build("1.8.0").out(&h.path().join("again.tar")).run();
    let real = stdout(&real);
    assert_eq!(blobs_line(&real), said);
    let chart = copied - download;
    assert!(
        real.contains(&format!("{copied} configs and layers ("))
            && real.contains(&format!(
                "{download} of the images, {chart} of the chart artifact)"
            ))
            && real.contains(&format!("copied   {copied} configs and layers written (")),
        "{real}"
    );

    // A re-load: each blob counted once, never more bytes than the bundle holds.
    let registry = format!("{}/{}", env().plain, unique_prefix("numbers"));
    let load = |extra: &[&str]| {
        let o = h
            .load_cmd(&bundle, &registry, &["--plain-http", "--no-install"])
            .args(extra)
            .output()
            .unwrap();
        assert_ok(&o);
        o
    };
    load(&[]);
    let o = load(&["--json"]);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let push = &r["push"];
    let n = push["blobs"].as_u64().unwrap();
    // Every blob of the bundle is a config or layer pushed, or a manifest.
    assert_eq!(
        n + push["manifestsSkipped"].as_u64().unwrap(),
        count,
        "{push}"
    );
    assert_eq!(push["skipped"].as_u64(), Some(n), "{push}");
    let present = push["skippedBytes"].as_u64().unwrap();
    assert!(
        present <= bytes,
        "{present} bytes already there, of a bundle of {bytes}: {push}"
    );
    assert_eq!(push["blobBytes"].as_u64(), Some(present));
    // (repository, blob) pairs stay in the JSON, named as such.
    assert!(push["pairs"]["blobs"].as_u64().unwrap() > n, "{push}");
    let o = load(&[]);
    let out = String::from_utf8_lossy(&o.stdout);
    let human = present as f64 / 1024.0;
    assert!(
        out.contains(&format!(
            "pushed 0 of {n} blobs (0 B), {n} already there ({human:.1} KiB)"
        )),
        "{out}"
    );
}

#[test]
fn every_help_has_examples_and_build_marks_its_repeatable_flags() {
    let h = Home::new();
    for cmd in [
        "keygen", "build", "inspect", "verify", "load", "split", "join", "repair", "serve",
    ] {
        let o = h.run(&[cmd, "--help"]);
        assert_ok(&o);
        let out = String::from_utf8_lossy(&o.stdout);
        let examples = out
            .split("Examples:\n")
            .nth(1)
            .unwrap_or_else(|| panic!("{cmd} --help has no examples:\n{out}"));
        assert!(
            examples.contains(&format!("koord-bundle {cmd} ")),
            "{cmd}: {examples}"
        );
    }
    let help = |cmd: &str| String::from_utf8_lossy(&h.run(&[cmd, "--help"]).stdout).to_string();
    // Each flag's paragraph, up to the next flag.
    let flag_doc = |text: &str, flag: &str| -> String {
        let opts = &text[text.find("Options:").unwrap()..];
        let at = opts
            .find(&format!("--{flag} "))
            .unwrap_or_else(|| panic!("no --{flag}:\n{text}"));
        let rest = &opts[at..];
        let end = rest.find("\n  -").unwrap_or(rest.len());
        rest[..end].split_whitespace().collect::<Vec<_>>().join(" ")
    };
    let build = help("build");
    for flag in ["source", "image", "values", "set", "ca-file", "platform"] {
        assert!(
            flag_doc(&build, flag).contains("Repeatable"),
            "build --{flag}"
        );
    }
    let load = help("load");
    for flag in ["values", "set", "ca-file", "image-pull-secret", "skip-crds"] {
        assert!(
            flag_doc(&load, flag).contains("Repeatable"),
            "load --{flag}"
        );
    }
}

#[test]
fn a_wrong_key_password_on_a_terminal_gets_three_tries() {
    let h = Home::new();
    let o = h
        .cmd(&["keygen"])
        .env("KOORD_BUNDLE_KEY_PASSWORD", "right")
        .output()
        .unwrap();
    assert_ok(&o);
    let (bundle, _) = {
        let b = Home::with_key();
        let (p, v) = b.build_plain("1.8.0", &[]);
        let here = h.path().join("b.tar");
        std::fs::copy(&p, &here).unwrap();
        (here, v)
    };
    std::fs::create_dir(h.path().join("parts")).unwrap();
    // split signs the parts' header with the default key: encrypted, so asked on a terminal
    // (script runs it on a pseudo-terminal; what is typed is its standard input).
    let split = |typed: &str| {
        let script = format!(
            "{} split {} --size 1M --output-dir {}",
            env!("CARGO_BIN_EXE_koord-bundle"),
            bundle.display(),
            h.path().join("parts").display()
        );
        let mut c = std::process::Command::new("script");
        c.args(["-qec", &script, "/dev/null"])
            .current_dir(h.path())
            .env("KOORD_BUNDLE_CONFIG_DIR", h.config())
            .env_remove("KOORD_BUNDLE_KEY_PASSWORD")
            .env("TERM", "dumb");
        run_with_stdin(&mut c, typed)
    };
    let o = split("wrong\nwrong again\nright\n");
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert_eq!(out.matches("Key password:").count(), 3, "{out}");
    assert_eq!(out.matches("try again").count(), 2, "{out}");
    assert!(out.contains("the parts' header is signed"), "{out}");
    let o = split("a\nb\nc\nright\n");
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert_eq!(out.matches("Key password:").count(), 3, "{out}");
    assert!(out.contains("3 tries: no password opened the key"), "{out}");
}

#[test]
fn the_smaller_messages_of_the_first_hour() {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.8.0", &[]);
    let b = bundle.to_str().unwrap();

    // "1 parts" and "sha256 sha256:".
    std::fs::create_dir(h.path().join("one")).unwrap();
    let o = h.run(&["split", b, "--size", "2M", "--output-dir", "one"]);
    assert_ok(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("\n1 part;"), "{out}");
    let o = h.run(&["join", "one/koordinator-1.8.0.tar.part000", "-o", "j.tar"]);
    assert_ok(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(", sha256:") && out.contains("joined from 1 part\n"),
        "{out}"
    );
    assert!(!out.contains("sha256 sha256"), "{out}");
    let (_, at) = largest_blob(&bundle);
    let tampered = h.path().join("t.tar");
    std::fs::copy(&bundle, &tampered).unwrap();
    flip_byte(&tampered, at + 100);
    let o = h.run(&["verify", tampered.to_str().unwrap()]);
    let err = assert_fails(&o, 1, &["has digest sha256:", "SHA256SUMS says sha256:"]);
    assert!(!err.contains("sha256 sha256"), "{err}");

    // A random file: "not a tar", none of its bytes.
    let random: Vec<u8> = (0..20_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(h.path().join("random.bin"), &random).unwrap();
    let plain = env().plain.clone();
    for args in [
        vec!["verify", "random.bin"],
        vec!["inspect", "random.bin"],
        vec!["serve", "random.bin", "--addr", "127.0.0.1:0"],
        vec![
            "load",
            "random.bin",
            "--registry",
            &plain,
            "--plain-http",
            "--no-install",
        ],
    ] {
        let o = h.run(&args);
        let err = assert_fails(
            &o,
            1,
            &["random.bin is not a tar archive (no tar header at the start)"],
        );
        assert!(
            !err.contains("\\u{") && !err.contains("\\x") && err.len() < 600,
            "{args:?}: {err}"
        );
    }

    // split without a key: warned that the header is unsigned, and what join then needs.
    let nokey = Home::new();
    let o = nokey.run(&[
        "split",
        b,
        "--size",
        "1M",
        "--output-dir",
        h.path().join("one").to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ok(&o);
    assert!(
        err.contains("warning: no signing key") && err.contains("NOT signed"),
        "{err}"
    );
    assert!(err.contains("--insecure-skip-signature"), "{err}");

    // inspect --json: `size` is the top manifest's (as in the bundle's own JSON and the spec),
    // `totalSize` the image's whole size.
    let o = h.run(&["inspect", b, "--json"]);
    assert_ok(&o);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let m = bundle_manifest(&bundle);
    for (got, want) in v["images"]
        .as_array()
        .unwrap()
        .iter()
        .zip(m["images"].as_array().unwrap())
    {
        assert_eq!(got["size"], want["size"], "{got}");
        assert_eq!(got["totalSize"], want["totalSize"], "{got}");
        assert!(got["totalSize"].as_u64() > got["size"].as_u64(), "{got}");
    }
}

#[test]
fn a_file_where_the_output_directory_should_be_is_named_as_such() {
    let h = Home::with_key();
    std::fs::write(h.path().join("out"), "a file").unwrap();
    let o = h.run(&["keygen", "--unencrypted", "--output-dir", "out"]);
    let err = assert_fails(
        &o,
        1,
        &["the output directory out is a file, not a directory"],
    );
    assert!(!err.contains("mkdir"), "{err}");
    let o = h.build("1.8.0").args(&["-o", "out/b.tar"]).run();
    assert_fails(
        &o,
        1,
        &["the output directory out is a file, not a directory"],
    );
}

/// Issue 32, the first hour round 3: a `--json` usage error names the missing argument; the
/// `found` line does not count an `--image` as the chart's; `build --split` tells the user to
/// verify a part (the whole bundle is never written).
#[test]
fn first_hour_round_3_messages() {
    let h = Home::with_key();
    let o = h.run(&["load", "x.tar", "--json"]);
    assert_eq!(o.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("not provided: --registry"), "{v}");
    let e = env();
    let extra = format!("{}/koordinator-sh/koordlet:v1.7.0", e.plain);
    let o = h
        .build("1.8.0")
        .args(&["--dry-run", "--image", &extra])
        .run();
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    let found = err
        .lines()
        .find(|l| l.starts_with("found"))
        .unwrap_or_default();
    assert!(
        found.starts_with("found    5 images and 13 CRDs in chart koordinator 1.8.0")
            && found.ends_with(", and 1 added with --image"),
        "{err}"
    );
    let out = h.path().join("koordinator-1.8.0.tar");
    let o = h.build("1.8.0").out(&out).args(&["--split", "512K"]).run();
    assert_ok(&o);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let line = stdout.lines().find(|l| l.starts_with("signed")).unwrap();
    let named = line
        .split("koord-bundle verify ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap();
    assert!(!out.exists());
    assert!(
        Path::new(named).exists() || h.path().join(named).exists(),
        "{line}: {named} does not exist"
    );
}

/// A size as `human_bytes` prints it (`95.4 KiB`, `0 B`), in bytes.
fn human_size(s: &str) -> f64 {
    let (n, unit) = s.trim().split_once(' ').unwrap_or((s, "B"));
    let n: f64 = n.parse().unwrap_or_else(|_| panic!("not a size: {s:?}"));
    let scale = ["B", "KiB", "MiB", "GiB"]
        .iter()
        .position(|u| *u == unit)
        .unwrap_or_else(|| panic!("not a unit: {s:?}"));
    n * 1024f64.powi(scale as i32)
}

/// Issue 32 item 4: one build summary said `24 of them to download (827.0 KiB)` and then `26 …
/// written: 95.4 KiB downloaded, 769.3 KiB reused` (most of it reused from the 1.7.0 bundle,
/// and the chart artifact's two counted in one line only). Both lines now count the same
/// configs and layers, their number and bytes, and the copy's bytes add up to them.
#[test]
fn a_build_summary_counts_the_same_configs_and_layers_in_every_line() {
    let h = Home::with_key();
    assert_ok(&h.build("1.7.0").run());
    let dry = h.build("1.8.0").args(&["--dry-run", "--json"]).run();
    assert_ok(&dry);
    let plan: Value = serde_json::from_slice(&dry.stdout).unwrap();
    let copied = plan["counts"]["copied"]["blobs"].as_u64().unwrap();
    let images = plan["counts"]["download"]["blobs"].as_u64().unwrap();
    assert!(copied > images, "{plan}");
    let o = h.build("1.8.0").run();
    assert_ok(&o);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let line = |start: &str| {
        out.lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no {start:?} line:\n{out}"))
            .to_string()
    };
    let (content, copy) = (line("content"), line("copied"));
    // The same number in both, and the same bytes.
    let planned = format!("{copied} configs and layers (");
    let at = content
        .find(&planned)
        .unwrap_or_else(|| panic!("{content}\n{copy}"));
    let planned_bytes = content[at + planned.len()..]
        .split([';', ')', ','])
        .next()
        .unwrap()
        .to_string();
    let written = format!("copied   {copied} configs and layers written (");
    assert!(copy.starts_with(&written), "{content}\n{copy}");
    let written_bytes = copy[written.len()..].split(')').next().unwrap();
    assert_eq!(planned_bytes, written_bytes, "{content}\n{copy}");
    assert!(
        content.contains(&format!(
            "{images} of the images, {} of the chart artifact",
            copied - images
        )),
        "{content}"
    );
    // A real build says what it did, not what a build with an empty cache would download.
    assert!(!content.contains("to download"), "{content}");
    // downloaded + reused + kept = the bytes written (each rounded to a tenth of its unit),
    // most of them reused from the 1.7.0 bundle.
    let figure = |w: &str| {
        let end = copy
            .find(&format!(" {w}"))
            .unwrap_or_else(|| panic!("no {w:?}: {copy}"));
        let start = copy[..end].rfind([':', ',', '(']).unwrap() + 1;
        human_size(&copy[start..end])
    };
    let (downloaded, reused, kept) = (
        figure("downloaded"),
        figure("reused"),
        figure("kept from an interrupted run"),
    );
    let total = human_size(written_bytes);
    assert!(reused > downloaded, "{copy}");
    assert!(
        (downloaded + reused + kept - total).abs() <= 0.002 * total + 300.0,
        "{downloaded} + {reused} + {kept} of {total}: {copy}"
    );
}
