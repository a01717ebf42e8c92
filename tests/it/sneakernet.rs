//! Split bundles (parts for media) and incremental bundles, with the real registry.

use crate::common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn sha(p: &Path) -> String {
    sha256(&std::fs::read(p).unwrap())
}

fn parts_of(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!("{name}.part"))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn build_split_parts_verify_inspect_load_and_join_byte_identical() {
    let e = env();
    let h = Home::with_key();
    let epoch = [("SOURCE_DATE_EPOCH", "1700000000")];
    let whole = h.path().join("whole.tar");
    let run_env = |build: Build| {
        let mut c = build.cmd();
        for (k, v) in epoch {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    assert_ok(&run_env(h.build("1.8.0").out(&whole)));
    let dir = h.path().join("dvd");
    std::fs::create_dir(&dir).unwrap();
    let out = dir.join("koordinator-1.8.0.tar");
    let o = run_env(
        h.build("1.8.0")
            .out(&out)
            .args(&["--split", "600K", "--json"]),
    );
    assert_ok(&o);
    assert!(!out.exists(), "with --split only the parts are written");
    let parts = parts_of(&dir, "koordinator-1.8.0.tar");
    assert!(parts.len() >= 3, "{parts:?}");
    for p in &parts {
        assert!(
            std::fs::metadata(p).unwrap().len() <= 600 * 1024,
            "{} is larger than 600K",
            p.display()
        );
    }
    let first = parts[0].to_str().unwrap();
    let o = h.run(&["verify", first, "--json"]);
    assert_ok(&o);
    assert_eq!(
        serde_json::from_slice::<Value>(&o.stdout).unwrap()["split"],
        true
    );
    let o = h.run(&["inspect", first, "--json"]);
    assert_ok(&o);
    // join gives back the unsplit bundle, byte for byte.
    let joined = h.path().join("joined.tar");
    assert_ok(&h.run(&["join", first, "-o", joined.to_str().unwrap()]));
    assert_eq!(sha(&joined), sha(&whole));
    // load takes the first part directly.
    let prefix = unique_prefix("parts");
    let o = h.run(&[
        "load",
        first,
        "--registry",
        &format!("{}/{prefix}", e.plain),
        "--plain-http",
        "--no-install",
    ]);
    assert_ok(&o);
    assert_eq!(repos_under(&prefix).len(), 6);
    for img in [
        "koordinator-sh/koordlet:v1.8.0",
        "koordinator-sh/koord-manager:v1.8.0",
    ] {
        assert_digest(
            &format!("docker://{}/{prefix}/{img}", e.plain),
            &Skopeo::plain_http(),
            &pushed_digest(img.split(':').next().unwrap(), "v1.8.0"),
        );
    }
}

#[test]
fn damaged_missing_or_swapped_parts_are_named() {
    let b = Built::new();
    let h = &b.home;
    let dir = h.path().join(format!("split-{}", unique_prefix("d")));
    std::fs::create_dir(&dir).unwrap();
    let o = h.run(&[
        "split",
        b.bundle.to_str().unwrap(),
        "--size",
        "300K",
        "--output-dir",
        dir.to_str().unwrap(),
    ]);
    assert_ok(&o);
    let name = b.bundle.file_name().unwrap().to_string_lossy().to_string();
    let parts = parts_of(&dir, &name);
    assert!(parts.len() >= 4);
    let first = parts[0].to_str().unwrap().to_string();
    let verify = |needles: &[&str]| {
        let o = h.run(&["verify", &first]);
        assert_fails(&o, 1, needles);
    };
    // A flipped byte in part 2 (a set without parity parts: the damaged block is named).
    let p2 = parts[2].clone();
    let orig = std::fs::read(&p2).unwrap();
    let mut bad = orig.clone();
    bad[orig.len() - 1000] ^= 1;
    std::fs::write(&p2, &bad).unwrap();
    verify(&[
        &format!("{}: 1 of", p2.file_name().unwrap().to_string_lossy()),
        "blocks damaged (block",
        "the set has no parity parts",
        &format!("copy again {}", p2.file_name().unwrap().to_string_lossy()),
    ]);
    // Truncated.
    std::fs::write(&p2, &orig[..orig.len() - 10]).unwrap();
    verify(&[
        &p2.file_name().unwrap().to_string_lossy(),
        "bytes, the header says",
    ]);
    // Missing.
    std::fs::remove_file(&p2).unwrap();
    verify(&[&p2.file_name().unwrap().to_string_lossy(), "missing"]);
    // Swapped (parts 1 and 2 have the same size): each part says which it is, so both are
    // read where they are, and said so.
    std::fs::write(&p2, &orig).unwrap();
    let p1 = parts[1].clone();
    let one = std::fs::read(&p1).unwrap();
    std::fs::write(&p1, &orig).unwrap();
    std::fs::write(&p2, &one).unwrap();
    let o = h.run(&["verify", &first]);
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!(
            "{} holds {} (part 2",
            p1.display(),
            p2.file_name().unwrap().to_string_lossy()
        )),
        "{err}"
    );
    std::fs::write(&p1, &one).unwrap();
    std::fs::write(&p2, &orig).unwrap();
    assert_ok(&h.run(&["verify", &first]));
    // Re-splitting into the same folder with a larger size removes the stale parts.
    assert_ok(&h.run(&[
        "split",
        b.bundle.to_str().unwrap(),
        "--size",
        "1M",
        "--output-dir",
        dir.to_str().unwrap(),
    ]));
    assert_eq!(parts_of(&dir, &name).len(), 2);
    // The header is signed with the default key: a wrong key is refused before any part is read.
    let other = Home::with_key();
    let o = h.run(&["verify", &first, "--key", other.pubkey().to_str().unwrap()]);
    assert_fails(&o, 1, &["split header signature", "signed by key"]);
}

#[test]
fn incremental_bundle_leaves_out_what_the_site_holds_and_load_checks_it() {
    let e = env();
    let h = Home::with_key();
    let (base, base_build) = h.build_plain("1.6.0", &[]);
    // From the old bundle, and from its manifest alone: the same result.
    let mf = h.path().join("base-manifest.json");
    assert_ok(&h.run(&[
        "inspect",
        base.to_str().unwrap(),
        "--manifest",
        mf.to_str().unwrap(),
    ]));
    let (inc, b) = h.build_plain("1.8.0", &["--since", base.to_str().unwrap()]);
    let inc2 = h.path().join("inc2.tar");
    let o = h
        .build("1.8.0")
        .args(&["--since", mf.to_str().unwrap()])
        .out(&inc2)
        .arg("--json")
        .run();
    assert_ok(&o);
    let b2: Value = serde_json::from_slice(&o.stdout).unwrap();
    let omitted = b["counts"]["omitted"]["blobs"].as_u64().unwrap();
    assert!(
        omitted >= 2,
        "the shared base layers of 1.6.0 are left out: {b}"
    );
    assert_eq!(b2["counts"], b["counts"]);
    assert_eq!(b["base"]["chartVersion"], "1.6.0");
    let full_home = Home::with_key();
    let full = full_home.build_plain("1.8.0", &[]).0;
    assert!(std::fs::metadata(&inc).unwrap().len() < std::fs::metadata(&full).unwrap().len());
    let _ = base_build;
    // verify checks what it carries and lists what it expects on site.
    let o = h.run(&["verify", inc.to_str().unwrap(), "--json"]);
    assert_ok(&o);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["expectedOnSite"].as_array().unwrap().len() as u64,
        omitted
    );
    // Load into an empty registry: refused before any push, naming what is missing.
    let prefix = unique_prefix("inc");
    let registry = format!("{}/{prefix}", e.plain);
    let o = h.run(&[
        "load",
        inc.to_str().unwrap(),
        "--registry",
        &registry,
        "--plain-http",
        "--no-install",
    ]);
    let err = assert_fails(
        &o,
        1,
        &[
            "incremental",
            "missing",
            "load its base, the 1.6.0 bundle koordinator-1.6.0.tar (created ",
            "nothing was pushed",
        ],
    );
    assert!(!err.contains("re-run the same command"), "{err}");
    assert!(repos_under(&prefix).is_empty());
    // inspect and verify say what it is and what to load first.
    let o = h.run(&["inspect", inc.to_str().unwrap()]);
    assert_ok(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&format!("base     incremental: {omitted} blobs left out, carried by the 1.6.0 bundle koordinator-1.6.0.tar")),
        "{out}"
    );
    let o = h.run(&[
        "verify",
        inc.to_str().unwrap(),
        "--key",
        h.pubkey().to_str().unwrap(),
    ]);
    assert_ok(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&format!(
            "every referenced blob present but the {omitted} an incremental bundle leaves out"
        )),
        "{out}"
    );
    // Base first, then the increment: complete, digests unchanged.
    assert_ok(&h.run(&[
        "load",
        base.to_str().unwrap(),
        "--registry",
        &registry,
        "--plain-http",
        "--no-install",
    ]));
    let o = h.run(&[
        "load",
        inc.to_str().unwrap(),
        "--registry",
        &registry,
        "--plain-http",
        "--no-install",
        "--json",
    ]);
    assert_ok(&o);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["push"]["requiredPresent"].as_u64().unwrap(), omitted);
    for c in [
        "koord-descheduler",
        "koord-device-daemon",
        "koord-manager",
        "koord-scheduler",
        "koordlet",
    ] {
        let repo = format!("koordinator-sh/{c}");
        let o = tool(
            "skopeo",
            &[
                "copy",
                "--all",
                "--src-tls-verify=false",
                &format!("docker://{registry}/{repo}:v1.8.0"),
                &format!("oci:{}:x", h.path().join(format!("c-{c}")).display()),
            ],
            h.path(),
        );
        assert_ok(&o);
        assert_digest(
            &format!("docker://{registry}/{repo}:v1.8.0"),
            &Skopeo::plain_http(),
            &pushed_digest(&repo, "v1.8.0"),
        );
    }
}
