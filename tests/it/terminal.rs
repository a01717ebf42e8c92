//! Issue 30 item 7: nothing from a bundle reaches the terminal raw. A bundle whose file name
//! carries an OSC title sequence, a bell and a right-to-left override (a file received on a
//! disc is named by whoever wrote the disc): every command that names it, its parts or its
//! header prints them escaped, through the one printer (crate::say!, progress::Progress;
//! clippy.toml refuses println! elsewhere).
//!
//! Issue 42: serve's request log quotes what an unauthenticated client sent, and goes through
//! the same printer (clippy.toml refuses std::io::stdout/stderr too, so no writeln! goes round).

use crate::common::*;
use std::io::{Read as _, Write as _};
use std::time::Duration;

const HOSTILE: &str = "evil\u{1b}]0;owned\u{7}\u{202e}rat.tar";
const RTL: &str = "koordinator\u{202e}rat.tar";

fn raw_in(o: &std::process::Output) -> Option<String> {
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    ['\u{1b}', '\u{7}', '\u{202e}']
        .iter()
        .any(|c| all.contains(*c))
        .then_some(all)
}

#[test]
fn a_hostile_bundle_name_never_reaches_the_terminal_raw() {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.8.0", &[]);
    let evil = h.path().join(HOSTILE);
    std::fs::rename(&bundle, &evil).unwrap();
    let e = evil.to_str().unwrap();
    // A name its parts cannot carry: refused by split, in escaped words.
    for args in [vec!["inspect", e], vec!["verify", e]] {
        let o = h.run(&args);
        assert_ok(&o);
        no_raw(&args, &o);
    }
    let o = h.run(&["split", e, "--size", "600K"]);
    let err = assert_fails(&o, 1, &["rename the bundle first"]);
    assert!(err.contains("\\u{1b}"), "{err}");
    no_raw(&["split"], &o);
    // A name with only the override: split, and every reader of the set.
    let rtl = h.path().join(RTL);
    std::fs::rename(&evil, &rtl).unwrap();
    let r = rtl.to_str().unwrap();
    let parts = h.path().join("parts");
    std::fs::create_dir(&parts).unwrap();
    let first = parts.join(format!("{RTL}.part000"));
    let f = first.to_str().unwrap();
    let runs: Vec<Vec<&str>> = vec![
        vec!["inspect", r],
        vec![
            "split",
            r,
            "--size",
            "600K",
            "--parity",
            "1",
            "--output-dir",
            parts.to_str().unwrap(),
        ],
        vec!["verify", f],
        vec!["inspect", f],
        vec!["repair", f],
        vec!["join", f, "-o", "joined.tar"],
    ];
    for args in runs {
        let o = h.run(&args);
        assert_ok(&o);
        no_raw(&args, &o);
    }
}

fn no_raw(args: &[&str], o: &std::process::Output) {
    if let Some(all) = raw_in(o) {
        panic!("{args:?}: a control or bidi character printed raw:\n{all:?}");
    }
}

/// One raw HTTP/1.1 request on its own connection (`Connection: close`); the status line of
/// the answer.
fn raw_request(addr: &str, target: &[u8]) -> String {
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = b"GET ".to_vec();
    req.extend_from_slice(target);
    req.extend_from_slice(b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    c.write_all(&req).unwrap();
    let mut answer = Vec::new();
    let _ = c.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Issue 42: httparse and http take UTF-8 in a request target, so a client of `serve` (no
/// credentials needed) chose bytes of the operator's terminal: a right-to-left override and C1
/// controls (U+009B is CSI, U+009D OSC on a terminal that reads C1) came out of the request log
/// byte for byte. They come out escaped, and the request is still logged. ESC and BEL, which
/// the HTTP parser refuses (400), do not come out either.
#[test]
fn a_hostile_request_path_reaches_serves_log_escaped() {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.8.0", &[]);
    let s = crate::serve_proc::start(&h, &[bundle.to_str().unwrap()]);
    let ctl = raw_request(&s.addr, b"/v2/\x1b]0;owned\x07\x1b[2J/manifests/x");
    assert!(ctl.starts_with("HTTP/1.1 "), "no HTTP answer: {ctl:?}");
    let utf8 = raw_request(
        &s.addr,
        b"/v2/\xe2\x80\xaeevil\xc2\x9b31m\xc2\x9d0;owned\xe2\x80\x8b/manifests/x",
    );
    assert!(utf8.starts_with("HTTP/1.1 "), "no HTTP answer: {utf8:?}");
    // The log line is written when the answer's body ends.
    let log = s.wait_log("evil");
    let raw: Vec<char> = [
        '\u{1b}', '\u{7}', '\u{202e}', '\u{9b}', '\u{9d}', '\u{200b}', '\u{fffd}',
    ]
    .into_iter()
    .filter(|c| log.contains(*c))
    .collect();
    assert!(
        raw.is_empty(),
        "serve's stderr holds {raw:?} raw (a client's bytes on the operator's terminal):\n{log:?}"
    );
    assert!(
        log.contains("GET /v2/\\u{202e}evil\\u{9b}31m\\u{9d}0;owned\\u{200b}/manifests/x "),
        "the hostile request is not logged, escaped:\n{log}"
    );
}

/// Issue 42: `--json` output is for pipes, but it lands on terminals too. serde_json escapes C0
/// controls only, so `verify --json` of a bundle named with a right-to-left override or a C1
/// control printed them raw (`inspect --json` is held to the same). They are `\uXXXX` escapes
/// now, which a JSON reader decodes to the same name.
#[test]
fn json_output_carries_no_raw_bidi_or_c1_character() {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.8.0", &[]);
    let rtl = h.path().join("koordinator\u{202e}\u{9b}31m.tar");
    std::fs::rename(&bundle, &rtl).unwrap();
    let r = rtl.to_str().unwrap();
    for args in [vec!["inspect", r, "--json"], vec!["verify", r, "--json"]] {
        let o = h.run(&args);
        assert_ok(&o);
        no_raw(&args, &o);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            !out.contains('\u{9b}'),
            "{args:?}: C1 printed raw:\n{out:?}"
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        if args[0] == "verify" {
            // It names the bundle: escaped, and decoded back to the same name.
            assert!(out.contains("\\u202e\\u009b31m.tar"), "{out}");
            assert_eq!(v["bundle"].as_str(), Some(r), "{out}");
        }
    }
}
