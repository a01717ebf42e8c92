//! Issue 21, "the first hour": what a new user trips over, each through the real binary.

use crate::common::*;
use serde_json::Value;
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
