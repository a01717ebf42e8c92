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
use std::process::Output;

const SIG_TYPE: &str = "application/vnd.dev.cosign.artifact.sig.v1+json";
const ATT_TYPE: &str = "application/vnd.in-toto+json";

/// cosign reaching nothing but the test registries (plain HTTP), `COSIGN_EXPERIMENTAL=1`
/// (what its OCI 1.1 flags ask for), `COSIGN_PASSWORD` as given.
fn cosign(h: &Home, password: &str, args: &[&str]) -> Output {
    cosign_with(
        h,
        &[
            ("COSIGN_EXPERIMENTAL", "1".as_ref()),
            ("COSIGN_PASSWORD", password.as_ref()),
        ],
        args,
    )
}

/// A key pair made by cosign: (NAME.key, NAME.pub), password `pw`.
fn key_pair(h: &Home, name: &str) -> (PathBuf, PathBuf) {
    cosign_key_pair(h, name, "pw")
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
        // Each names its subject as the registry holds the index: media type, size, digest.
        let top = manifest_at(&rr, path, index).unwrap();
        let top_type = serde_json::from_slice::<Value>(&top).unwrap()["mediaType"].clone();
        for m in list.json()["manifests"].as_array().unwrap() {
            let bytes = manifest_at(&rr, path, m["digest"].as_str().unwrap()).unwrap();
            let subject = serde_json::from_slice::<Value>(&bytes).unwrap()["subject"].clone();
            assert_eq!(
                subject,
                serde_json::json!({"mediaType": top_type, "size": top.len(), "digest": index}),
                "{m}"
            );
        }
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
    let err = cosign_refused(&verify(h, &pubkey, &at, false), "no .sig tag");
    assert!(err.contains("no signatures found"), "{err}");
    let out = ok(&verify(h, &pubkey, &at, true));
    assert!(out.contains(index), "{out}");
    cosign_refused(&verify(h, &other_pub, &at, true), "another key");
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

    // Built from there with --with-signatures: the referrers (attestations included) are
    // carried beside the tag scheme's manifests, each checked with the site's key.
    let out = h.path().join("resigned.tar");
    let o = h
        .build("1.8.0")
        .source(&format!("{rr}/{prefix}"))
        .out(&out)
        .args(&[
            "--with-signatures",
            "--verify-key",
            pubkey.to_str().unwrap(),
        ])
        .run();
    assert_ok(&o);
    let m = bundle_manifest(&out);
    for img in s["images"].as_array().unwrap() {
        let path = img["repository"]
            .as_str()
            .unwrap()
            .split_once('/')
            .unwrap()
            .1;
        let repo = path.split_once('/').unwrap().1;
        let carried = &m["images"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["repository"] == repo)
            .unwrap()["signatures"];
        let count = |scheme: Option<&str>, kind: &str| {
            carried
                .as_array()
                .unwrap()
                .iter()
                .filter(|c| c["scheme"].as_str() == scheme && c["kind"] == kind)
                .count()
        };
        let digests = 1 + img["platforms"].as_array().unwrap().len();
        assert_eq!(count(Some("referrer"), "signature"), digests, "{carried}");
        assert_eq!(count(Some("referrer"), "attestation"), 1, "{carried}");
        assert_eq!(count(None, "signature"), digests, "{carried}");
        assert_eq!(count(None, "attestation"), 1, "{carried}");
    }
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

#[test]
fn referrers_the_registry_does_not_list_after_signing_stop_the_load() {
    let b = Built::new();
    let (key, _) = key_pair(&b.home, "site");
    let rr = referrers_registry();
    // The API answers, and lists nothing: what load --sign-images pushes never shows there.
    let empty = r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}"#;
    let proxy = fault_proxy::start(
        &rr,
        Mode::ReferrersAnswer(200, "application/vnd.oci.image.index.v1+json", empty),
    );
    let prefix = unique_prefix("refs-sign-unlisted");
    let o = load_signing(&b, &format!("{}/{prefix}", proxy.addr), &key);
    let err = assert_fails(
        &o,
        1,
        &[
            "serves the OCI 1.1 referrers API but does not list",
            "of the referrers load --sign-images pushed",
            "asked 4 times over 7 s",
            "@sha256:",
            "(signature)",
            "(attestation)",
            "Nothing was installed",
        ],
    );
    println!("{err}");
    // They were pushed (the registry itself lists them; only the proxy's answer hides them),
    // and so were the signatures in cosign's tag scheme.
    let repo = format!("{prefix}/koordinator-sh/koordlet");
    let d = pushed_digest("koordinator-sh/koordlet", "v1.8.0");
    let list = referrers(&rr, &repo, &d).json();
    assert!(
        types(&list).contains(&"application/vnd.dev.cosign.artifact.sig.v1+json".to_string()),
        "{list}"
    );
    assert!(tags(&rr, &repo).iter().any(|t| t.ends_with(".sig")));
}

const VERSION: &str = V140;
/// `build 1.4.0 --source HOST/PREFIX --plain-http -o OUT --with-signatures EXTRA...`.
fn build(h: &Home, source: &str, out: &Path, extra: &[&str]) -> Output {
    h.build(VERSION)
        .source(source)
        .out(out)
        .arg("--with-signatures")
        .args(extra)
        .run()
}

/// The referrer records of `repo` in a bundle manifest.
fn carried_referrers<'a>(m: &'a Value, repo: &str) -> Vec<&'a Value> {
    bundle_image(m, repo)["signatures"]
        .as_array()
        .map(|a| a.iter().filter(|s| s["scheme"] == "referrer").collect())
        .unwrap_or_default()
}

/// A registry that serves the referrers API but does not list what it accepted (a proxy
/// answering every subject with an empty list): asked again, then refused, exit 1, before any
/// install; "no" is not read as done. `referrer` is one of the bundle's carried referrers.
fn unlisted_referrers_stop_the_load(h: &Home, out: &Path, rr: &str, referrer: &str) {
    let empty = r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}"#;
    let proxy = fault_proxy::start(
        rr,
        Mode::ReferrersAnswer(200, "application/vnd.oci.image.index.v1+json", empty),
    );
    let o = h
        .load_cmd(
            out,
            &format!("{}/{}", proxy.addr, unique_prefix("refs-unlisted")),
            &["--no-install", "--plain-http"],
        )
        .output()
        .unwrap();
    assert_fails(
        &o,
        1,
        &[
            "serves the OCI 1.1 referrers API but does not list 4 of the carried referrers it accepted",
            "asked 4 times over 7 s",
            referrer,
            "Nothing was installed",
        ],
    );
    assert!(
        proxy
            .counts
            .referrers
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 4 * 4
    );
}

#[test]
fn build_carries_upstream_referrers_checked_and_load_pushes_them_unchanged() {
    let h = Home::with_key();
    let (up_key, up_pub) = key_pair(&h, "upstream");
    let rr = referrers_registry();
    let src = unique_prefix("refs-up");
    let images = copy_140_images(&rr, &src);
    for (repo, digest) in &images {
        cosign_sign_oci11(&h, &up_key, &format!("{rr}/{src}/{repo}@{digest}"));
    }
    let out = h.path().join("referrers.tar");
    let o = build(
        &h,
        &format!("{rr}/{src}"),
        &out,
        &["--verify-key", up_pub.to_str().unwrap()],
    );
    assert_ok(&o);
    let said = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        said.contains("4 of them OCI 1.1 referrers")
            && said.contains("checked against --verify-key"),
        "{said}"
    );
    let m = bundle_manifest(&out);
    let mut carried = Vec::new();
    for (repo, digest) in &images {
        let refs = carried_referrers(&m, repo);
        assert_eq!(refs.len(), 1, "{repo}: {refs:?}");
        let s = refs[0];
        assert_eq!(s["kind"], "signature");
        assert_eq!(s["signs"], digest.as_str());
        assert!(s["verifiedWith"].as_str().unwrap().starts_with("sha256:"));
        // Byte for byte the upstream referrer, named by its digest.
        let list = referrers(&rr, &format!("{src}/{repo}"), digest).json();
        assert_eq!(s["digest"], list["manifests"][0]["digest"], "{repo}");
        assert_eq!(
            s["ref"],
            format!("{repo}@{}", s["digest"].as_str().unwrap())
        );
        carried.push((
            repo.clone(),
            digest.clone(),
            s["digest"].as_str().unwrap().to_string(),
        ));
    }
    // The layout, the reference reader, the schema and the BOM know them.
    let schema = spec_accepts(&h, &out, &m);
    let mut bad = m.clone();
    bad["images"][0]["signatures"][0]["scheme"] = "other".into();
    assert!(!schema.is_valid(&bad));
    let bom = h.path().join("bom.cdx.json");
    assert_ok(&h.run(&[
        "inspect",
        out.to_str().unwrap(),
        "--sbom",
        bom.to_str().unwrap(),
    ]));
    let text = std::fs::read_to_string(&bom).unwrap();
    for (repo, _, r) in &carried {
        assert!(
            text.contains(&format!("\"{repo}@{r}\"")),
            "{repo}@{r} not in the BOM"
        );
    }
    validate(&bom).unwrap();

    // Loaded where the registry serves referrers: the same manifests, listed by their
    // subject; cosign verifies each image through them with the upstream key (there is no
    // .sig tag to fall back on).
    let site = unique_prefix("refs-site");
    let o = h
        .load_cmd(
            &out,
            &format!("{rr}/{site}"),
            &["--no-install", "--plain-http"],
        )
        .output()
        .unwrap();
    let said = ok(&o) + &String::from_utf8_lossy(&o.stderr);
    assert!(
        said.contains("4 listed by the registry's referrers API"),
        "{said}"
    );
    for (repo, digest, r) in &carried {
        let list = referrers(&rr, &format!("{site}/{repo}"), digest).json();
        assert_eq!(list["manifests"][0]["digest"], r.as_str(), "{repo}");
        let at = format!("{rr}/{site}/{repo}@{digest}");
        ok(&verify(&h, &up_pub, &at, true));
        cosign_refused(&verify(&h, &up_pub, &at, false), "no .sig tag");
    }

    unlisted_referrers_stop_the_load(&h, &out, &rr, &carried[0].2);

    // Loaded into distribution 2.8 (no referrers API): pushed by digest and listed in the
    // referrers tag schema's index of the subject, where cosign's OCI 1.1 mode finds them.
    let plain = &env().plain;
    let site2 = unique_prefix("refs-site-plain");
    let load_plain = || {
        h.load_cmd(
            &out,
            &format!("{plain}/{site2}"),
            &["--no-install", "--plain-http"],
        )
        .output()
        .unwrap()
    };
    let o = load_plain();
    let said = ok(&o) + &String::from_utf8_lossy(&o.stderr);
    assert!(
        said.contains("the registry serves no referrers API (404): 4 added to the referrers tag schema's sha256-<hex> index"),
        "{said}"
    );
    let mut indexes = Vec::new();
    for (repo, digest, r) in &carried {
        let path = format!("{site2}/{repo}");
        let there = manifest_at(plain, &path, r).expect("the referrer by its digest");
        assert_eq!(&sha256(&there), r, "{repo}: changed on the way");
        let tag = format!("sha256-{}", digest.trim_start_matches("sha256:"));
        let index = manifest_at(plain, &path, &tag).expect("the fallback index");
        let v: Value = serde_json::from_slice(&index).unwrap();
        assert_eq!(v["manifests"][0]["digest"], r.as_str());
        assert_eq!(v["manifests"][0]["artifactType"], SIG_TYPE);
        indexes.push((path, tag, index));
        let at = format!("{plain}/{site2}/{repo}@{digest}");
        ok(&verify(&h, &up_pub, &at, true));
        cosign_refused(&verify(&h, &up_pub, &at, false), "no .sig tag");
    }
    // Again: nothing added, every index as it was.
    let o = load_plain();
    let said = ok(&o) + &String::from_utf8_lossy(&o.stderr);
    assert!(
        said.contains("0 added") && said.contains("4 listed there already"),
        "{said}"
    );
    for (path, tag, index) in &indexes {
        assert_eq!(&manifest_at(plain, path, tag).unwrap(), index);
    }
    // And built from there: read through the fallback index, the same referrers carried.
    let again = h.path().join("again.tar");
    let o = build(
        &h,
        &format!("{plain}/{site2}"),
        &again,
        &["--verify-key", up_pub.to_str().unwrap()],
    );
    assert_ok(&o);
    let m2 = bundle_manifest(&again);
    for (repo, _, r) in &carried {
        let refs = carried_referrers(&m2, repo);
        assert_eq!(refs.len(), 1, "{repo}");
        assert_eq!(refs[0]["digest"], r.as_str());
    }
}

#[test]
fn a_referrers_answer_that_is_no_list_or_a_referrer_that_does_not_verify_writes_nothing() {
    let h = Home::with_key();
    let (up_key, up_pub) = key_pair(&h, "upstream");
    let up = up_pub.to_str().unwrap();
    let rr = referrers_registry();
    let src = unique_prefix("refs-bad-up");
    let images = copy_140_images(&rr, &src);
    for (repo, digest) in &images {
        cosign_sign_oci11(&h, &up_key, &format!("{rr}/{src}/{repo}@{digest}"));
    }
    let no_output = |out: &Path| {
        assert!(!out.exists());
        let name = out.file_name().unwrap().to_string_lossy().to_string();
        let partial: Vec<_> = std::fs::read_dir(h.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(&name))
            .collect();
        assert!(partial.is_empty(), "{partial:?}");
    };

    // A proxy that answers the referrers API with something else than a referrers list.
    for (ct, body, needle) in [
        ("text/html", "<html>login</html>", "not JSON"),
        (
            "application/vnd.oci.image.manifest.v1+json",
            r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","layers":[]}"#,
            "not an OCI image index",
        ),
    ] {
        let proxy = fault_proxy::start(&rr, Mode::ReferrersAnswer(200, ct, body));
        let out = h.path().join("proxied.tar");
        let o = build(
            &h,
            &format!("{}/{src}", proxy.addr),
            &out,
            &["--verify-key", up],
        );
        assert_fails(
            &o,
            1,
            &[
                "the OCI 1.1 referrers of",
                "the answer is not a referrers list",
                needle,
                "nothing was written",
            ],
        );
        no_output(&out);
    }

    // A forged referrer beside the good one (koord-scheduler's, one character of its
    // signature changed, pushed by digest with the same subject): refused as a whole.
    let (repo, digest) = &images[2];
    let path = format!("{src}/{repo}");
    let good = referrers(&rr, &path, digest).json()["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let mut sig: Value = serde_json::from_slice(&manifest_at(&rr, &path, &good).unwrap()).unwrap();
    forge_signature(&mut sig);
    let forged_digest = sha256(&serde_json::to_vec(&sig).unwrap());
    put_oci_manifest(&h, &rr, &path, &forged_digest, &sig);
    assert_eq!(types(&referrers(&rr, &path, digest).json()).len(), 2);
    let out = h.path().join("forged.tar");
    let o = build(&h, &format!("{rr}/{src}"), &out, &["--verify-key", up]);
    assert_fails(
        &o,
        1,
        &[
            "koordinator-sh/koord-scheduler",
            digest.as_str(),
            &format!("{repo}@{forged_digest}"),
            "does not verify against --verify-key",
            "the signature does not verify against the key",
            "nothing was written",
        ],
    );
    no_output(&out);
    // Without --verify-key: carried unverified, both, and said so.
    let o = build(&h, &format!("{rr}/{src}"), &out, &[]);
    assert_ok(&o);
    assert!(String::from_utf8_lossy(&o.stderr).contains("NOT verified"));
    assert_eq!(carried_referrers(&bundle_manifest(&out), repo).len(), 2);
}
