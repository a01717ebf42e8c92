//! Issue 30 item 7: nothing from a bundle reaches the terminal raw. A bundle whose file name
//! carries an OSC title sequence, a bell and a right-to-left override (a file received on a
//! disc is named by whoever wrote the disc): every command that names it, its parts or its
//! header prints them escaped, through the one printer (crate::say!, progress::Progress;
//! clippy.toml refuses println! elsewhere).

use crate::common::*;

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
