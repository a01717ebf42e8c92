//! `verify` and `load` against the real registries: digests compared with skopeo, the chart
//! pulled back with real helm, bad bundles refused before any push.

use crate::common::*;
use crate::fault_proxy::{self, Mode};
use serde_json::Value;
use std::path::Path;

fn manifest(h: &Home, bundle: &Path) -> Value {
    let o = h.run(&["inspect", bundle.to_str().unwrap(), "--json"]);
    assert_ok(&o);
    serde_json::from_slice(&o.stdout).unwrap()
}

fn load(h: &Home, bundle: &Path, registry: &str, extra: &[&str]) -> std::process::Output {
    h.load_cmd(bundle, registry, &["--no-install", "--json"])
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn verify_checks_signature_files_and_layout() {
    let b = Built::new();
    let o = b
        .home
        .run(&["verify", b.bundle.to_str().unwrap(), "--json"]);
    assert_ok(&o);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["signature"]["verified"], true);
    assert_eq!(v["signature"]["keyId"].as_str().unwrap().len(), 16);
    let m = manifest(&b.home, &b.bundle);
    assert_eq!(v["blobs"], m["blobs"]["count"]);
    assert!(v["files"].as_u64().unwrap() > v["blobs"].as_u64().unwrap());
}

#[test]
fn load_into_plain_registry_digests_unchanged_chart_pullable_reload_skips() {
    let b = Built::new();
    let e = env();
    let prefix = unique_prefix("plain");
    let registry = format!("{}/{prefix}", e.plain);
    let o = load(&b.home, &b.bundle, &registry, &["--plain-http"]);
    assert_ok(&o);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(r["push"]["uploaded"].as_u64().unwrap() > 0);
    assert!(
        r["push"]["mounted"].as_u64().unwrap() > 0,
        "the shared base layer is mounted, not uploaded again: {}",
        r["push"]
    );
    let m = manifest(&b.home, &b.bundle);
    for img in m["images"].as_array().unwrap() {
        let target = format!("docker://{registry}/{}", img["ref"].as_str().unwrap());
        assert_digest(
            &target,
            &Skopeo::plain_http(),
            img["digest"].as_str().unwrap(),
        );
        // And every platform manifest is there too (skopeo copies the whole index).
        let dest = b.home.path().join(format!(
            "copy-{}",
            img["ref"].as_str().unwrap().replace(['/', ':'], "_")
        ));
        let o = tool(
            "skopeo",
            &[
                "copy",
                "--all",
                "--src-tls-verify=false",
                &target,
                &format!("oci:{}:x", dest.display()),
            ],
            b.home.path(),
        );
        assert_ok(&o);
    }
    // The chart, pulled back by real helm v3 and v4, is byte-identical.
    let chart_digest = m["chart"]["digest"].as_str().unwrap().to_string();
    for helm in [&e.helm3, &e.helm4] {
        let d = tempfile::tempdir().unwrap();
        let o = tool(
            helm.to_str().unwrap(),
            &[
                "pull",
                &format!("oci://{registry}/charts/koordinator"),
                "--version",
                "1.8.0",
                "--plain-http",
                "-d",
                d.path().to_str().unwrap(),
            ],
            d.path(),
        );
        assert_ok(&o);
        let got = std::fs::read(d.path().join("koordinator-1.8.0.tgz")).unwrap();
        assert_eq!(sha256(&got), chart_digest, "{}", helm.display());
    }
    // Re-load: everything is there, nothing is pushed.
    let o = load(&b.home, &b.bundle, &registry, &["--plain-http"]);
    assert_ok(&o);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["push"]["uploaded"], 0);
    assert_eq!(r["push"]["mounted"], 0);
    assert_eq!(r["push"]["manifestsPushed"], 0);
    assert!(r["push"]["skipped"].as_u64().unwrap() > 0);
}

#[test]
fn load_into_tls_registry_with_basic_auth_under_a_prefix() {
    let b = Built::new();
    let e = env();
    let prefix = unique_prefix("tls");
    let registry = format!("{}/{prefix}", e.tls);
    let ca = e.ca_file.to_str().unwrap();
    let key = b.home.pubkey();
    let key = key.to_str().unwrap();
    let mut c = b.home.cmd(&[
        "load",
        b.bundle.to_str().unwrap(),
        "--registry",
        &registry,
        "--key",
        key,
        "--no-install",
        "--json",
        "--ca-file",
        ca,
        "--username",
        &e.username,
        "--password-stdin",
    ]);
    let o = run_with_stdin(&mut c, &format!("{}\n", e.password));
    assert_ok(&o);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!all.contains(&e.password), "password in output");
    let m = manifest(&b.home, &b.bundle);
    let cert_dir = Path::new(ca).parent().unwrap().parent().unwrap().join("ca");
    let skopeo = Skopeo::tls(&cert_dir, &e.username, &e.password);
    for img in m["images"].as_array().unwrap() {
        let target = format!("docker://{registry}/{}", img["ref"].as_str().unwrap());
        assert_digest(&target, &skopeo, img["digest"].as_str().unwrap());
    }
    // Wrong password: a clear refusal naming the registry.
    let mut c = b.home.cmd(&[
        "load",
        b.bundle.to_str().unwrap(),
        "--registry",
        &format!("{}/{}", e.tls, unique_prefix("tlsbad")),
        "--key",
        key,
        "--no-install",
        "--ca-file",
        ca,
        "--username",
        &e.username,
        "--password-stdin",
    ]);
    let o = run_with_stdin(&mut c, "not-the-password\n");
    let err = assert_fails(&o, 1, &[&e.tls, "credentials"]);
    assert!(!err.contains("not-the-password"));
    // Wrong CA: a TLS error that says what to do.
    let other_ca = b.home.path().join("other-ca.pem");
    let o = tool(
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "/dev/null",
            "-subj",
            "/CN=other",
            "-days",
            "1",
            "-out",
            other_ca.to_str().unwrap(),
        ],
        b.home.path(),
    );
    assert_ok(&o);
    let mut c = b.home.cmd(&[
        "load",
        b.bundle.to_str().unwrap(),
        "--registry",
        &registry,
        "--key",
        key,
        "--no-install",
        "--ca-file",
        other_ca.to_str().unwrap(),
        "--username",
        &e.username,
        "--password-stdin",
    ]);
    let o = run_with_stdin(&mut c, &format!("{}\n", e.password));
    assert_fails(&o, 1, &["TLS", "--ca-file"]);
}

/// Rewrite the bundle entry by entry; `edit` may change an entry's data (or drop it: None).
fn rewrite(
    src: &Path,
    dst: &Path,
    edit: impl Fn(&str, Vec<u8>) -> Option<Vec<u8>>,
    append: &[(&[u8], &[u8])],
) {
    use std::io::Read;
    let mut ar = tar::Archive::new(std::fs::File::open(src).unwrap());
    let mut out = tar::Builder::new(std::fs::File::create(dst).unwrap());
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e.path().unwrap().to_string_lossy().to_string();
        let mut data = Vec::new();
        e.read_to_end(&mut data).unwrap();
        let mut h = e.header().clone();
        if let Some(d) = edit(&name, data) {
            h.set_size(d.len() as u64);
            h.set_cksum();
            out.append(&h, &d[..]).unwrap();
        }
    }
    for (raw_name, data) in append {
        let mut h = tar::Header::new_ustar();
        h.as_old_mut().name[..raw_name.len()].copy_from_slice(raw_name);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        // The header as the format gives it (uid/gid 0): what is refused is the entry itself.
        h.set_uid(0);
        h.set_gid(0);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        out.append(&h, *data).unwrap();
    }
    out.finish().unwrap();
}

fn flip(mut d: Vec<u8>, at: usize) -> Vec<u8> {
    let i = at.min(d.len() - 1);
    d[i] ^= 0x01;
    d
}

#[test]
fn bad_bundles_are_refused_before_any_push() {
    let b = Built::new();
    let h = &b.home;
    let dir = h.path().join("bad");
    std::fs::create_dir_all(&dir).unwrap();
    let (big_blob, _) = largest_blob(&b.bundle);
    let sha_of = |p: &Path| sha256(&std::fs::read(p).unwrap());
    type Case<'a> = (&'a str, Box<dyn Fn(&Path) + 'a>, Vec<&'a str>);
    let cases: Vec<Case> = vec![
        (
            "blob-byte",
            Box::new(|p: &Path| {
                rewrite(
                    &b.bundle,
                    p,
                    |n, d| Some(if n == big_blob { flip(d, 1000) } else { d }),
                    &[],
                )
            }),
            vec![big_blob.as_str(), "SHA256SUMS says"],
        ),
        (
            "manifest-byte",
            Box::new(|p: &Path| {
                rewrite(
                    &b.bundle,
                    p,
                    |n, d| {
                        Some(if n == "koord-bundle.json" {
                            flip(d, 50)
                        } else {
                            d
                        })
                    },
                    &[],
                )
            }),
            vec!["koord-bundle.json"],
        ),
        (
            "checksum-byte",
            Box::new(|p: &Path| {
                rewrite(
                    &b.bundle,
                    p,
                    |n, d| Some(if n == "SHA256SUMS" { flip(d, 3) } else { d }),
                    &[],
                )
            }),
            vec!["signature"],
        ),
        (
            "truncated",
            Box::new(|p: &Path| {
                let d = std::fs::read(&b.bundle).unwrap();
                std::fs::write(p, &d[..d.len() / 2]).unwrap();
            }),
            vec!["truncated"],
        ),
        (
            "extra-file",
            Box::new(|p: &Path| rewrite(&b.bundle, p, |_, d| Some(d), &[(b"extra.txt", b"hello")])),
            vec!["extra.txt", "not listed"],
        ),
        (
            "path-traversal",
            Box::new(|p: &Path| {
                rewrite(&b.bundle, p, |_, d| Some(d), &[(b"../../etc/evil", b"x")])
            }),
            vec!["../../etc/evil", "unsafe path"],
        ),
        (
            "missing-file",
            Box::new(|p: &Path| {
                rewrite(
                    &b.bundle,
                    p,
                    |n, d| {
                        if n.starts_with("crds/") && n.ends_with("podgroups.yaml") {
                            None
                        } else {
                            Some(d)
                        }
                    },
                    &[],
                )
            }),
            vec!["missing", "podgroups"],
        ),
    ];
    for (name, make, needles) in &cases {
        let bad = dir.join(format!("{name}.tar"));
        make(&bad);
        let before = sha_of(&bad);
        let prefix = unique_prefix(name);
        let o = load(
            h,
            &bad,
            &format!("{}/{prefix}", env().plain),
            &["--plain-http"],
        );
        let err = assert_fails(&o, 1, needles);
        assert!(err.contains("nothing was pushed"), "{name}: {err}");
        assert!(
            repos_under(&prefix).is_empty(),
            "{name}: something was pushed: {:?}",
            repos_under(&prefix)
        );
        assert_eq!(sha_of(&bad), before, "the bundle was modified");
        // verify names the same problem.
        let key = h.pubkey();
        let o = h.run(&[
            "verify",
            bad.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
        ]);
        assert_fails(&o, 1, needles);
    }
    // A wrong public key.
    let other = Home::with_key();
    let prefix = unique_prefix("wrongkey");
    let o = h.run(&[
        "load",
        b.bundle.to_str().unwrap(),
        "--registry",
        &format!("{}/{prefix}", env().plain),
        "--plain-http",
        "--no-install",
        "--key",
        other.pubkey().to_str().unwrap(),
    ]);
    assert_fails(&o, 1, &["signed by key", "nothing was pushed"]);
    assert!(repos_under(&prefix).is_empty());
}

/// helm reads its own environment: a release store other than Secrets, or another cluster or
/// user, would make the helm load runs act on something the checks before it never read (a
/// downgrade guard that finds no release, an install into another cluster). Refused before
/// anything is verified or pushed, naming each variable, never a token's value; with
/// `--no-install` helm is not run and the same environment loads.
#[test]
fn helm_settings_in_the_environment_that_the_checks_would_not_see_stop_the_load() {
    let b = Built::new();
    let prefix = unique_prefix("helm-env");
    let registry = format!("{}/{prefix}", env().plain);
    let vars = [
        ("HELM_DRIVER", "configmap"),
        ("HELM_KUBETOKEN", "tok-never-shown"),
        ("HELM_KUBEINSECURE_SKIP_TLS_VERIFY", "false"),
    ];
    let o = b
        .home
        .load_cmd(&b.bundle, &registry, &["--plain-http"])
        .envs(vars)
        .output()
        .unwrap();
    let err = assert_fails(
        &o,
        1,
        &[
            "HELM_DRIVER=configmap, HELM_KUBETOKEN (a token) are set",
            "helm's Secrets",
            "--no-install",
            "nothing was verified or pushed",
        ],
    );
    assert!(
        !err.contains("tok-never-shown") && !err.contains("SKIP_TLS"),
        "{err}"
    );
    assert!(
        repos_under(&prefix).is_empty(),
        "{:?}",
        repos_under(&prefix)
    );
    let o = b
        .home
        .load_cmd(&b.bundle, &registry, &["--plain-http", "--no-install"])
        .envs(vars)
        .output()
        .unwrap();
    assert_ok(&o);
}

#[test]
fn unsigned_bundle_needs_the_explicit_flag() {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.8.0", &["--unsigned"]);
    let prefix = unique_prefix("unsigned");
    let registry = format!("{}/{prefix}", env().plain);
    let o = load(&h, &bundle, &registry, &["--plain-http"]);
    assert_fails(
        &o,
        1,
        &[
            "not signed",
            "--insecure-skip-signature",
            "nothing was pushed",
        ],
    );
    assert!(repos_under(&prefix).is_empty());
    let o = load(
        &h,
        &bundle,
        &registry,
        &["--plain-http", "--insecure-skip-signature"],
    );
    assert_ok(&o);
    assert!(String::from_utf8_lossy(&o.stderr).contains("NOT checked"));
    assert_eq!(repos_under(&prefix).len(), 6, "five images and the chart");
}

#[test]
fn load_finds_the_single_bundle_in_the_current_directory() {
    let h = Home::with_key();
    let (_bundle, _) = h.build_plain("1.8.0", &[]);
    let prefix = unique_prefix("cwd");
    let o = h.run(&[
        "load",
        "--registry",
        &format!("{}/{prefix}", env().plain),
        "--plain-http",
        "--no-install",
        "--json",
    ]);
    assert_ok(&o);
    assert_eq!(repos_under(&prefix).len(), 6);
}

#[test]
fn registry_down_mid_push_then_rerun_completes() {
    let b = Built::new();
    let e = env();
    let prefix = unique_prefix("down");
    // The registry "goes down" after ~400 KiB of requests: some blobs are in, the rest are not.
    let proxy = fault_proxy::start(&e.plain, Mode::DownAfter(400 * 1024));
    // One transfer at a time: the first 400 KiB then finish whole blobs. With several at once
    // they could all be cut half-way, leaving nothing for the re-run to skip (it failed so
    // once in a full run on a busy machine: skipped 0).
    let o = load(
        &b.home,
        &b.bundle,
        &format!("{}/{prefix}", proxy.addr),
        &["--plain-http", "--jobs", "1"],
    );
    let err = assert_fails(&o, 3, &["re-run"]);
    assert!(err.contains(&proxy.addr), "{err}");
    assert!(proxy.counts.down.load(std::sync::atomic::Ordering::SeqCst));
    // Back up (straight to the registry): the re-run completes, skipping what got there.
    let o = load(
        &b.home,
        &b.bundle,
        &format!("{}/{prefix}", e.plain),
        &["--plain-http"],
    );
    assert_ok(&o);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(r["push"]["skipped"].as_u64().unwrap() > 0, "{}", r["push"]);
    assert!(r["push"]["uploaded"].as_u64().unwrap() > 0, "{}", r["push"]);
    let m = manifest(&b.home, &b.bundle);
    for img in m["images"].as_array().unwrap() {
        let target = format!(
            "docker://{}/{prefix}/{}",
            e.plain,
            img["ref"].as_str().unwrap()
        );
        assert_digest(
            &target,
            &Skopeo::plain_http(),
            img["digest"].as_str().unwrap(),
        );
    }
}
