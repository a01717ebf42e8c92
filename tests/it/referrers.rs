//! OCI 1.1 referrers of cosign signatures and attestations (issue 46), against the test
//! environment's registry that serves the referrers API (go-containerregistry's pkg/registry,
//! `referrers_registry`) and distribution 2.8 (which does not), checked with the real cosign
//! v2.6.5 (`COSIGN_EXPERIMENTAL=1 cosign verify --experimental-oci11`, `cosign sign
//! --registry-referrers-mode=oci-1-1`):
//!
//! - `load --sign-images` pushes each signature and attestation as a referrer too where the
//!   registry serves the API, and the tag scheme always; not again on a re-run; the tag scheme
//!   only (and said so) where the registry answers 404; nothing signed when the referrers
//!   answer is neither.
//! - `build --with-signatures` carries the referrers of an image signed upstream with
//!   `--registry-referrers-mode=oci-1-1`, checked with `--verify-key`, and `load` pushes them
//!   unchanged: as referrers, or under the referrers tag schema's `sha256-<hex>` index where
//!   the registry serves no API; a referrers answer that is not an index, and a referrer that
//!   does not verify, are refused and nothing is written.

use crate::common::*;
use crate::fault_proxy::{self, Mode};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

const SIG_TYPE: &str = "application/vnd.dev.cosign.artifact.sig.v1+json";
const ATT_TYPE: &str = "application/vnd.in-toto+json";

/// cosign in a home of its own that reaches nothing but the test registries (plain HTTP),
/// `COSIGN_EXPERIMENTAL=1` (what its OCI 1.1 flags ask for), `COSIGN_PASSWORD` as given.
fn cosign(h: &Home, password: &str, args: &[&str]) -> Output {
    let home = h.path().join("cosign-home");
    std::fs::create_dir_all(&home).unwrap();
    let mut c = Command::new(cosign_bin());
    c.args(args)
        .current_dir(h.path())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", &home)
        .env("TUF_ROOT", home.join("tuf"))
        .env("COSIGN_EXPERIMENTAL", "1")
        .env("COSIGN_PASSWORD", password);
    output_within(c, Duration::from_secs(120), "cosign")
}

/// A key pair made by cosign: (NAME.key, NAME.pub), password `pw`.
fn key_pair(h: &Home, name: &str) -> (PathBuf, PathBuf) {
    ok(&cosign(
        h,
        "pw",
        &["generate-key-pair", "--output-key-prefix", name],
    ));
    (
        h.path().join(format!("{name}.key")),
        h.path().join(format!("{name}.pub")),
    )
}

/// `cosign verify` of `image` (`HOST/REPO@DIGEST`) with `key`, by the tag scheme, or with
/// `--experimental-oci11` (the referrers first).
fn verify(h: &Home, key: &Path, image: &str, oci11: bool) -> Output {
    let mut a = vec![
        "verify",
        "--key",
        key.to_str().unwrap(),
        "--insecure-ignore-tlog=true",
        "--allow-insecure-registry",
    ];
    if oci11 {
        a.push("--experimental-oci11");
    }
    a.push(image);
    cosign(h, "", &a)
}

fn refused(o: &Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        !o.status.success(),
        "{what}: cosign accepted it\nstdout:\n{}\nstderr:\n{err}",
        String::from_utf8_lossy(&o.stdout)
    );
    err
}

/// The referrers list of `digest` in `repo` (`PREFIX/REPO`) of `host` (plain HTTP): status
/// and body.
fn referrers(host: &str, repo: &str, digest: &str) -> Http {
    curl(
        &["-H", "Accept: application/vnd.oci.image.index.v1+json"],
        &format!("http://{host}/v2/{repo}/referrers/{digest}"),
    )
}

/// The artifact types of a referrers list, sorted.
fn types(list: &Value) -> Vec<String> {
    let mut v: Vec<String> = list["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["artifactType"].as_str().unwrap_or("").to_string())
        .collect();
    v.sort();
    v
}

/// The raw manifest at `host/REPO` by `reference` (a tag or a digest), or `None`.
fn manifest_at(host: &str, repo: &str, reference: &str) -> Option<Vec<u8>> {
    let r = curl(
        &[
            "-H",
            "Accept: application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json",
        ],
        &format!("http://{host}/v2/{repo}/manifests/{reference}"),
    );
    (r.status == 200).then_some(r.body)
}

/// The tags of `repo` in `host`.
fn tags(host: &str, repo: &str) -> Vec<String> {
    let mut t: Vec<String> = curl(&[], &format!("http://{host}/v2/{repo}/tags/list")).json()
        ["tags"]
        .as_array()
        .map(|a| a.iter().map(|t| t.as_str().unwrap().to_string()).collect())
        .unwrap_or_default();
    t.sort();
    t
}

/// `load BUNDLE --registry HOST/PREFIX --no-install --json --plain-http --sign-images KEY`.
fn load_signing(b: &Built, registry: &str, key: &Path) -> Output {
    b.home
        .load_cmd(
            &b.bundle,
            registry,
            &["--no-install", "--json", "--plain-http"],
        )
        .args(["--sign-images", key.to_str().unwrap()])
        .env("COSIGN_PASSWORD", "pw")
        .output()
        .unwrap()
}

#[test]
fn load_signs_as_oci_referrers_too_where_the_registry_serves_them() {
    let b = Built::new();
    let h = &b.home;
    let (key, pubkey) = key_pair(h, "site");
    let (_, other_pub) = key_pair(h, "other");
    let rr = referrers_registry();
    let prefix = unique_prefix("refs-sign");
    let o = load_signing(&b, &format!("{rr}/{prefix}"), &key);
    assert_ok(&o);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let s = &r["signed"];
    let said = s["referrersSaid"].as_str().unwrap();
    assert!(said.starts_with("as OCI 1.1 referrers too"), "{said}");
    assert_eq!(s["referrersPushed"], s["pushed"], "{s}");
    assert_eq!(s["referrersPresent"], 0, "{s}");
    let mut checked = 0;
    for img in s["images"].as_array().unwrap() {
        assert_eq!(img["referrers"], true, "{img}");
        let repo = img["repository"].as_str().unwrap();
        let path = repo.split_once('/').unwrap().1;
        let index = img["index"]["digest"].as_str().unwrap();
        assert_eq!(
            img["index"]["signature"]["referrer"]["artifactType"],
            SIG_TYPE
        );
        assert_eq!(
            img["index"]["attestation"]["referrer"]["artifactType"],
            ATT_TYPE
        );
        // The registry lists one signature and one attestation referrer for the index, one
        // signature for each platform manifest.
        let list = referrers(&rr, path, index);
        assert_eq!(list.status, 200);
        assert_eq!(types(&list.json()), [SIG_TYPE, ATT_TYPE].map(String::from));
        for p in img["platforms"].as_array().unwrap() {
            let d = p["digest"].as_str().unwrap();
            assert_eq!(types(&referrers(&rr, path, d).json()), [SIG_TYPE]);
        }
        // cosign finds the signature through the referrers API, and the tag scheme still
        // verifies as before.
        let at = format!("{repo}@{index}");
        ok(&verify(h, &pubkey, &at, true));
        ok(&verify(h, &pubkey, &at, false));
        checked += 1;
    }
    assert!(checked >= 5, "{s}");

    // The referrer alone: the first image's .sig tag removed, cosign's tag-scheme check fails
    // and its OCI 1.1 check still passes (with this key only).
    let img = &s["images"][0];
    let repo = img["repository"].as_str().unwrap();
    let path = repo.split_once('/').unwrap().1;
    let index = img["index"]["digest"].as_str().unwrap();
    let at = format!("{repo}@{index}");
    let sig_tag = format!("sha256-{}.sig", index.trim_start_matches("sha256:"));
    let del = curl(
        &["-X", "DELETE"],
        &format!("http://{rr}/v2/{path}/manifests/{sig_tag}"),
    );
    assert_eq!(del.status, 202, "{}", String::from_utf8_lossy(&del.body));
    let err = refused(&verify(h, &pubkey, &at, false), "no .sig tag");
    assert!(err.contains("no signatures found"), "{err}");
    let out = ok(&verify(h, &pubkey, &at, true));
    assert!(out.contains(index), "{out}");
    refused(&verify(h, &other_pub, &at, true), "another key");
    // cosign's tree lists both referrers by type.
    let tree = ok(&cosign(
        h,
        "",
        &[
            "tree",
            "--experimental-oci11",
            "--allow-insecure-registry",
            &at,
        ],
    ));
    for t in [SIG_TYPE, ATT_TYPE] {
        assert!(
            tree.contains(&format!("{t} artifacts via OCI referrer")),
            "{tree}"
        );
    }

    // Idempotent: a re-run pushes no referrer (the removed tag comes back, the same bytes).
    let before: Vec<Value> = s["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let p = i["repository"].as_str().unwrap().split_once('/').unwrap().1;
            referrers(&rr, p, i["index"]["digest"].as_str().unwrap()).json()
        })
        .collect();
    let o = load_signing(&b, &format!("{rr}/{prefix}"), &key);
    assert_ok(&o);
    let again: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(again["signed"]["referrersPushed"], 0, "{}", again["signed"]);
    assert_eq!(again["signed"]["pushed"], 1, "{}", again["signed"]);
    for (i, img) in s["images"].as_array().unwrap().iter().enumerate() {
        let p = img["repository"]
            .as_str()
            .unwrap()
            .split_once('/')
            .unwrap()
            .1;
        let list = referrers(&rr, p, img["index"]["digest"].as_str().unwrap()).json();
        assert_eq!(list, before[i], "a re-run changed the referrers");
    }
    ok(&verify(h, &pubkey, &at, false));
}

#[test]
fn without_a_referrers_api_load_signs_in_the_tag_scheme_only_and_says_so() {
    let b = Built::new();
    let h = &b.home;
    let (key, pubkey) = key_pair(h, "site");
    let plain = &env().plain;
    let prefix = unique_prefix("refs-none");
    let o = load_signing(&b, &format!("{plain}/{prefix}"), &key);
    assert_ok(&o);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let s = &r["signed"];
    let no_api = "the registry serves no OCI 1.1 referrers API (404): in cosign's tag scheme only";
    assert_eq!(s["referrersSaid"], no_api, "{s}");
    assert_eq!(s["referrersPushed"], 0, "{s}");
    for img in s["images"].as_array().unwrap() {
        assert_eq!(img["referrers"], false);
        assert!(img["index"]["signature"]["referrer"].is_null(), "{img}");
    }
    let img = &s["images"][0];
    let at = format!(
        "{}@{}",
        img["repository"].as_str().unwrap(),
        img["index"]["digest"].as_str().unwrap()
    );
    ok(&verify(h, &pubkey, &at, false));
    // cosign's OCI 1.1 mode falls back to the tag scheme here too.
    ok(&verify(h, &pubkey, &at, true));
    // Without --json, the summary says it.
    let o = h
        .load_cmd(
            &b.bundle,
            &format!("{plain}/{prefix}"),
            &["--no-install", "--plain-http"],
        )
        .args(["--sign-images", key.to_str().unwrap()])
        .env("COSIGN_PASSWORD", "pw")
        .output()
        .unwrap();
    let out = ok(&o);
    assert!(out.contains(no_api), "{out}");
}

#[test]
fn a_referrers_answer_that_is_neither_yes_nor_no_signs_nothing() {
    let b = Built::new();
    let (key, _) = key_pair(&b.home, "site");
    let rr = referrers_registry();
    for (status, ct, body, needles) in [
        (
            200,
            "text/html",
            "<html>welcome to the proxy</html>",
            &["is not a referrers list (not JSON)"][..],
        ),
        (
            200,
            "application/vnd.oci.image.manifest.v1+json",
            r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","layers":[]}"#,
            &["not an OCI image index"][..],
        ),
        (
            400,
            "application/json",
            r#"{"errors":[{"code":"UNSUPPORTED","message":"no"}]}"#,
            &["asking for the OCI 1.1 referrers of", "UNSUPPORTED"][..],
        ),
    ] {
        let proxy = fault_proxy::start(&rr, Mode::ReferrersAnswer(status, ct, body));
        let prefix = unique_prefix("refs-bad");
        let o = load_signing(&b, &format!("{}/{prefix}", proxy.addr), &key);
        let mut want = vec!["nothing was signed", "UNSIGNED"];
        want.extend_from_slice(needles);
        let err = assert_fails(&o, 1, &want);
        println!("{err}");
        assert!(
            proxy
                .counts
                .referrers
                .load(std::sync::atomic::Ordering::SeqCst)
                > 0
        );
        // The images are there, not one signature tag, not one referrer.
        let repo = format!("{prefix}/koordinator-sh/koordlet");
        let t = tags(&rr, &repo);
        assert!(!t.is_empty(), "the images were pushed");
        assert!(t.iter().all(|t| !t.starts_with("sha256-")), "{t:?}");
        let d = pushed_digest("koordinator-sh/koordlet", "v1.8.0");
        let list = referrers(&rr, &repo, &d);
        assert_eq!(types(&list.json()), Vec::<String>::new());
        assert!(manifest_at(&rr, &repo, &d).is_some());
    }
}
