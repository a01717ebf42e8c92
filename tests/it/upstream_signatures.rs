//! `build --with-signatures [--verify-key PUB] [--allow-unsigned-images]` (issue 46, carry
//! upstream signatures): the test environment's synthetic images of chart 1.4.0 (four images,
//! two platforms each) copied to a fresh prefix of the plain registry and signed there by the
//! real cosign (v2.6.5, offline: `--tlog-upload=false`), bundled from that prefix, loaded into
//! another, and checked there with `cosign verify` by digest. A tampered signature, another
//! key's and a missing one are each refused with `--verify-key`, and no bundle is written; so
//! is one the source fails to serve (the fault proxy), which is never taken for "unsigned".
//! `inspect` and `diff` show what a bundle carries and what changed.

use crate::common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

const VERSION: &str = V140;
const IMAGES: [&str; 4] = V140_IMAGES;
const TAG: &str = V140_TAG;

/// cosign (`COSIGN_PASSWORD` the upstream keys'), reaching nothing but the plain registry.
fn cosign(h: &Home, args: &[&str]) -> Output {
    cosign_with(h, &[("COSIGN_PASSWORD", "upstream-pw".as_ref())], args)
}

/// A key pair made by cosign: (NAME.key, NAME.pub).
fn key_pair(h: &Home, name: &str) -> (PathBuf, PathBuf) {
    cosign_key_pair(h, name, "upstream-pw")
}

/// `cosign sign` `image` (`HOST/REPO@DIGEST`) with `key`, offline; `recursive`: each platform
/// manifest too.
fn sign(h: &Home, key: &Path, image: &str, recursive: bool) {
    let mut a = vec![
        "sign",
        "--key",
        key.to_str().unwrap(),
        "--tlog-upload=false",
        "--allow-insecure-registry",
        "--yes",
    ];
    if recursive {
        a.push("--recursive");
    }
    a.push(image);
    ok(&cosign(h, &a));
}

/// `cosign attest --type custom` of `image` with `key`, offline (the predicate
/// `{"built":"upstream"}`).
fn attest(h: &Home, key: &Path, image: &str) {
    let predicate = h.path().join("predicate.json");
    std::fs::write(&predicate, r#"{"built":"upstream"}"#).unwrap();
    ok(&cosign(
        h,
        &[
            "attest",
            "--key",
            key.to_str().unwrap(),
            "--type",
            "custom",
            "--predicate",
            predicate.to_str().unwrap(),
            "--tlog-upload=false",
            "--allow-insecure-registry",
            "--yes",
            image,
        ],
    ));
}

/// The 1.4.0 images copied (every platform) under `plain/PREFIX`; each `(repository, digest)`.
fn copy_images(prefix: &str) -> Vec<(String, String)> {
    copy_140_images(&env().plain, prefix)
}

/// The raw manifest at `plain/REFERENCE` (`REPO:TAG`), or `None` when not there.
fn manifest_at(reference: &str) -> Option<Vec<u8>> {
    let (repo, tag) = reference.rsplit_once(':').unwrap();
    let r = curl(
        &["-H", "Accept: application/vnd.oci.image.manifest.v1+json"],
        &format!("http://{}/v2/{repo}/manifests/{tag}", env().plain),
    );
    (r.status == 200).then_some(r.body)
}

fn sig_tag(digest: &str) -> String {
    format!("sha256-{}.sig", digest.trim_start_matches("sha256:"))
}

fn build(h: &Home, prefix: &str, out: &Path, extra: &[&str]) -> Output {
    h.build(VERSION)
        .source(&format!("{}/{prefix}", env().plain))
        .out(out)
        .arg("--with-signatures")
        .args(extra)
        .run()
}

#[test]
fn upstream_signatures_cross_unchanged_and_cosign_verifies_them_at_the_site() {
    let h = Home::with_key();
    let (up_key, up_pub) = key_pair(&h, "upstream");
    let (site_key, site_pub) = key_pair(&h, "site");
    let e = env();
    let src = unique_prefix("upsig");
    let images = copy_images(&src);
    for (i, (repo, digest)) in images.iter().enumerate() {
        // The first image: its platform manifests too.
        sign(
            &h,
            &up_key,
            &format!("{}/{src}/{repo}@{digest}", e.plain),
            i == 0,
        );
    }
    // One attestation (koord-manager's index), as `cosign attest` writes it.
    let (att_repo, att_digest) = &images[1];
    attest(
        &h,
        &up_key,
        &format!("{}/{src}/{att_repo}@{att_digest}", e.plain),
    );

    let out = h.path().join("signed.tar");
    let o = build(&h, &src, &out, &["--verify-key", up_pub.to_str().unwrap()]);
    assert_ok(&o);
    let said = String::from_utf8_lossy(&o.stderr).to_string() + &String::from_utf8_lossy(&o.stdout);
    assert!(said.contains("checked against --verify-key"), "{said}");
    let m = bundle_manifest(&out);
    let mut carried = Vec::new();
    for (n, (repo, digest)) in images.iter().enumerate() {
        let img = bundle_image(&m, repo);
        let sigs = img["signatures"].as_array().expect("signatures recorded");
        let index_sig = sigs
            .iter()
            .find(|s| s["kind"] == "signature" && s["signs"] == digest.as_str())
            .unwrap_or_else(|| panic!("{repo}: no signature of its index carried: {sigs:?}"));
        assert_eq!(index_sig["ref"], format!("{repo}:{}", sig_tag(digest)));
        assert!(index_sig["verifiedWith"]
            .as_str()
            .unwrap()
            .starts_with("sha256:"));
        // Byte for byte as upstream holds it.
        let upstream = manifest_at(&format!("{src}/{repo}:{}", sig_tag(digest))).unwrap();
        assert_eq!(index_sig["digest"], sha256(&upstream), "{repo}");
        let platform_sigs = sigs
            .iter()
            .filter(|s| s["kind"] == "signature" && s["signs"] != digest.as_str())
            .count();
        assert_eq!(
            platform_sigs,
            if n == 0 { 2 } else { 0 },
            "{repo}: {sigs:?}"
        );
        let atts = sigs.iter().filter(|s| s["kind"] == "attestation").count();
        assert_eq!(atts, usize::from(n == 1), "{repo}: {sigs:?}");
        for s in sigs {
            carried.push((
                s["ref"].as_str().unwrap().to_string(),
                s["digest"].as_str().unwrap().to_string(),
            ));
        }
    }
    // The layout names them, and verify checks them like every other manifest; so does the
    // reference reader, and the manifest matches the spec's schema (which knows the member:
    // another `kind` is refused).
    let schema = spec_accepts(&h, &out, &m);
    let mut bad = m.clone();
    bad["images"][0]["signatures"][0]["kind"] = "other".into();
    assert!(!schema.is_valid(&bad));
    // The BOM lists each carried manifest on its image, and stays valid CycloneDX.
    let bom = h.path().join("bom.cdx.json");
    assert_ok(&h.run(&[
        "inspect",
        out.to_str().unwrap(),
        "--sbom",
        bom.to_str().unwrap(),
    ]));
    let text = std::fs::read_to_string(&bom).unwrap();
    for (reference, digest) in &carried {
        assert!(
            text.contains(&format!("{reference}@{digest}")),
            "{reference} not in the BOM"
        );
    }
    assert!(text.contains("koord-bundle:image:attestation"));
    validate(&bom).unwrap();

    // With a platform filter the index is rewritten (a digest nobody signed): the kept
    // platform manifests must be signed instead. Only koord-descheduler's are: koord-manager
    // is refused, naming its amd64 digest; with --allow-unsigned-images the descheduler
    // carries its amd64 signature alone.
    let amd64 = |repo: &str| {
        e.images
            .iter()
            .find(|i| i["repository"] == repo && i["tag"] == TAG)
            .and_then(|i| i["manifests"].as_array())
            .and_then(|m| m.iter().find(|m| m["platform"] == "linux/amd64"))
            .and_then(|m| m["digest"].as_str())
            .unwrap()
            .to_string()
    };
    let filtered = h.path().join("amd64.tar");
    let pf = [
        "--verify-key",
        up_pub.to_str().unwrap(),
        "--platform",
        "linux/amd64",
    ];
    let o = build(&h, &src, &filtered, &pf);
    assert_fails(
        &o,
        1,
        &[
            "koordinator-sh/koord-manager",
            &amd64(IMAGES[1]),
            "no signature upstream",
        ],
    );
    assert!(!filtered.exists());
    let o = build(
        &h,
        &src,
        &filtered,
        &[&pf[..], &["--allow-unsigned-images"]].concat(),
    );
    assert_ok(&o);
    let fm = bundle_manifest(&filtered);
    let sigs: Vec<&str> = bundle_image(&fm, IMAGES[0])["signatures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["signs"].as_str().unwrap())
        .collect();
    assert_eq!(sigs, [amd64(IMAGES[0])]);

    // Loaded into another prefix: the same manifests under the same tags, and cosign accepts
    // every image there by digest with the upstream key.
    let site = unique_prefix("upsig-site");
    let registry = format!("{}/{site}", e.plain);
    assert_ok(
        &h.load_cmd(&out, &registry, &["--no-install", "--json", "--plain-http"])
            .output()
            .unwrap(),
    );
    for (reference, digest) in &carried {
        let there = manifest_at(&format!("{site}/{reference}"))
            .unwrap_or_else(|| panic!("{reference} was not pushed"));
        assert_eq!(&sha256(&there), digest, "{reference} changed on the way");
    }
    for (repo, digest) in &images {
        let at = format!("{registry}/{repo}@{digest}");
        let out = ok(&cosign(
            &h,
            &[
                "verify",
                "--key",
                up_pub.to_str().unwrap(),
                "--insecure-ignore-tlog=true",
                "--allow-insecure-registry",
                &at,
            ],
        ));
        assert!(out.contains(digest.as_str()), "{out}");
    }
    let (repo, digest) = &images[1];
    ok(&cosign(
        &h,
        &[
            "verify-attestation",
            "--key",
            up_pub.to_str().unwrap(),
            "--type",
            "custom",
            "--insecure-ignore-tlog=true",
            "--allow-insecure-registry",
            &format!("{registry}/{repo}@{digest}"),
        ],
    ));

    // With --sign-images as well: the site's signature is appended to the carried one (the
    // tag's digest changes), and both keys verify.
    let site2 = unique_prefix("upsig-site2");
    let registry2 = format!("{}/{site2}", e.plain);
    assert_ok(
        &h.load_cmd(
            &out,
            &registry2,
            &["--no-install", "--json", "--plain-http"],
        )
        .args(["--sign-images", site_key.to_str().unwrap()])
        .env("COSIGN_PASSWORD", "upstream-pw")
        .output()
        .unwrap(),
    );
    let (repo, digest) = &images[2];
    let tag = format!("{site2}/{repo}:{}", sig_tag(digest));
    let both: Value = serde_json::from_slice(&manifest_at(&tag).unwrap()).unwrap();
    assert_eq!(both["layers"].as_array().unwrap().len(), 2, "{both}");
    // Loaded again without --sign-images: the tag keeps both signatures (the carried one is
    // not pushed over it), and it says so.
    let o = h
        .load_cmd(&out, &registry2, &["--no-install", "--plain-http"])
        .output()
        .unwrap();
    assert_ok(&o);
    let again: Value = serde_json::from_slice(&manifest_at(&tag).unwrap()).unwrap();
    assert_eq!(again, both, "a re-run dropped the site's signature");
    let said = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(said.contains("kept as the registry holds them"), "{said}");
    for key in [&up_pub, &site_pub] {
        ok(&cosign(
            &h,
            &[
                "verify",
                "--key",
                key.to_str().unwrap(),
                "--insecure-ignore-tlog=true",
                "--allow-insecure-registry",
                &format!("{registry2}/{repo}@{digest}"),
            ],
        ));
    }

    // The tag's copy of the upstream payload with its signature forged (the same layer
    // digest): not the upstream signature, so not "appended"; the site's tag is not
    // overwritten, and the warning says the upstream signature is NOT there (before: the same
    // payload digest passed as the upstream signature inside).
    let mut forged = both.clone();
    forge_signature(&mut forged);
    let (r, t) = tag.rsplit_once(':').unwrap();
    put_oci_manifest(&h, &e.plain, r, t, &forged);
    let o = h
        .load_cmd(&out, &registry2, &["--no-install", "--plain-http"])
        .output()
        .unwrap();
    assert_ok(&o);
    let said = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        said.contains("the upstream signature is NOT pushed there") && said.contains(&tag),
        "{said}"
    );
    let now: Value = serde_json::from_slice(&manifest_at(&tag).unwrap()).unwrap();
    assert_eq!(now, forged, "the site's tag was overwritten");
}

#[test]
fn a_tampered_foreign_or_missing_upstream_signature_is_refused_and_nothing_is_written() {
    let h = Home::with_key();
    let (up_key, up_pub) = key_pair(&h, "upstream");
    let (other_key, _) = key_pair(&h, "other");
    let e = env();
    let up = up_pub.to_str().unwrap();

    // --verify-key without --with-signatures is a usage error; a file that is no public key
    // is refused before anything is read.
    let o = h.build(VERSION).args(&["--verify-key", up]).run();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let o = build(
        &h,
        "nowhere",
        &h.path().join("x.tar"),
        &["--verify-key", up_key.to_str().unwrap()],
    );
    assert_fails(
        &o,
        1,
        &["--verify-key", "is not a PEM public key of ECDSA P-256"],
    );

    // A prefix where koord-descheduler is not signed and koord-manager only by another key.
    let mixed = unique_prefix("upsig-mixed");
    let images = copy_images(&mixed);
    for (i, (repo, digest)) in images.iter().enumerate() {
        let key = match i {
            0 => continue,
            1 => &other_key,
            _ => &up_key,
        };
        sign(
            &h,
            key,
            &format!("{}/{mixed}/{repo}@{digest}", e.plain),
            false,
        );
    }
    let out = h.path().join("refused.tar");
    // Unsigned: refused (fail closed), naming the image and its digest.
    let o = build(&h, &mixed, &out, &["--verify-key", up]);
    assert_fails(
        &o,
        1,
        &[
            "koordinator-sh/koord-descheduler",
            images[0].1.as_str(),
            "no signature upstream",
            "--allow-unsigned-images",
            "nothing was written",
        ],
    );
    assert!(!out.exists());
    // Let through with --allow-unsigned-images; another key's signature still is not.
    let o = build(
        &h,
        &mixed,
        &out,
        &["--verify-key", up, "--allow-unsigned-images"],
    );
    assert_fails(
        &o,
        1,
        &[
            "koordinator-sh/koord-manager",
            images[1].1.as_str(),
            "does not verify against --verify-key",
        ],
    );
    assert!(!out.exists());
    // Without --verify-key: carried unverified, and said so; the unsigned one without.
    let o = build(&h, &mixed, &out, &[]);
    assert_ok(&o);
    let said = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(said.contains("NOT verified"), "{said}");
    assert!(
        said.contains("1 of 4 images had no signature upstream")
            && said.contains("koord-descheduler"),
        "{said}"
    );
    let m = bundle_manifest(&out);
    assert!(bundle_image(&m, IMAGES[0]).get("signatures").is_none());
    let s = &bundle_image(&m, IMAGES[1])["signatures"][0];
    assert_eq!(s["signs"], images[1].1.as_str());
    assert!(s.get("verifiedWith").is_none(), "{s}");

    // A prefix where koord-scheduler's signature is tampered with: one base64 character of
    // the signature changed, the manifest pushed back.
    let tampered = unique_prefix("upsig-tampered");
    let images = copy_images(&tampered);
    for (repo, digest) in &images {
        sign(
            &h,
            &up_key,
            &format!("{}/{tampered}/{repo}@{digest}", e.plain),
            false,
        );
    }
    let (repo, digest) = &images[2];
    let tag = format!("{tampered}/{repo}:{}", sig_tag(digest));
    let mut sig: Value = serde_json::from_slice(&manifest_at(&tag).unwrap()).unwrap();
    forge_signature(&mut sig);
    let (r, t) = tag.rsplit_once(':').unwrap();
    put_oci_manifest(&h, &e.plain, r, t, &sig);
    let out = h.path().join("tampered.tar");
    let o = build(&h, &tampered, &out, &["--verify-key", up]);
    assert_fails(
        &o,
        1,
        &[
            "koordinator-sh/koord-scheduler",
            digest.as_str(),
            "does not verify against --verify-key",
            "the signature does not verify against the key",
            "nothing was written",
        ],
    );
    assert!(!out.exists());
    let partial: Vec<_> = std::fs::read_dir(h.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("tampered.tar"))
        .collect();
    assert!(partial.is_empty(), "{partial:?}");
}

/// The `(config, first layer)` digests of the signature manifest at `plain/REFERENCE`.
fn sig_blobs(reference: &str) -> (String, String) {
    let m: Value = serde_json::from_slice(&manifest_at(reference).unwrap()).unwrap();
    (
        m["config"]["digest"].as_str().unwrap().to_string(),
        m["layers"][0]["digest"].as_str().unwrap().to_string(),
    )
}

/// A registry that fails to serve an upstream `.sig` (its tag manifest or a blob of it: a 500,
/// a dropped connection, 401, 403, or a 404 on one of its blobs) ends `build --with-signatures`
/// with the image named and no bundle written, whatever the flags: a signature that could not
/// be read is never taken for "unsigned" (fail closed). Transport failures are exit 3 (retry
/// later), an auth refusal or a broken tag exit 1. Only a 404 on the tag itself means
/// unsigned: refused with --verify-key, let through by --allow-unsigned-images.
#[test]
fn a_signature_that_cannot_be_read_fails_the_build_and_is_never_taken_for_unsigned() {
    use crate::fault_proxy::{self, Mode, ReadFault};
    let h = Home::with_key();
    let (up_key, up_pub) = key_pair(&h, "upstream");
    let up = up_pub.to_str().unwrap();
    let e = env();
    let src = unique_prefix("upsig-faults");
    let images = copy_images(&src);
    for (repo, digest) in &images {
        sign(
            &h,
            &up_key,
            &format!("{}/{src}/{repo}@{digest}", e.plain),
            false,
        );
    }
    // The faults hit koord-manager's signature only.
    let (repo, digest) = &images[1];
    let tag: &'static str = Box::leak(sig_tag(digest).into_boxed_str());
    let (config, layer) = sig_blobs(&format!("{src}/{repo}:{tag}"));
    let hex = |d: &str| -> &'static str {
        Box::leak(d.trim_start_matches("sha256:").to_string().into_boxed_str())
    };
    let (config, layer) = (hex(&config), hex(&layer));
    let out = h.path().join("faulty.tar");
    let no_bundle = || {
        assert!(!out.exists());
        let left: Vec<_> = std::fs::read_dir(h.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("faulty.tar"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    };
    let with_key: &[&str] = &["--verify-key", up];
    let lenient: &[&str] = &["--verify-key", up, "--allow-unsigned-images"];
    // (what, the path the proxy fails, how, a login for the proxy, flags, exit code, said)
    type Case<'a> = (
        &'a str,
        &'static str,
        ReadFault,
        bool,
        &'a [&'a str],
        i32,
        &'a [&'a str],
    );
    let cases: [Case; 10] = [
        (
            "404 on its config",
            config,
            ReadFault::Status(404),
            false,
            lenient,
            1,
            &[config],
        ),
        (
            "404 on its config, no key",
            config,
            ReadFault::Status(404),
            false,
            &[],
            1,
            &[config],
        ),
        (
            "404 on its layer",
            layer,
            ReadFault::Status(404),
            false,
            with_key,
            1,
            &[layer],
        ),
        (
            "401 on the tag",
            tag,
            ReadFault::Status(401),
            false,
            lenient,
            1,
            &["needs a login"],
        ),
        (
            "401 on the tag, logged in",
            tag,
            ReadFault::Status(401),
            true,
            lenient,
            1,
            &["refused the credentials"],
        ),
        (
            "403 on the tag, logged in",
            tag,
            ReadFault::Status(403),
            true,
            &[],
            1,
            &["denies pull"],
        ),
        (
            "500 on the tag",
            tag,
            ReadFault::Status(500),
            false,
            lenient,
            3,
            &["500", "after 6 attempts"],
        ),
        (
            "dropped on the tag",
            tag,
            ReadFault::Drop,
            false,
            &[],
            3,
            &["after 6 attempts"],
        ),
        (
            "dropped on its layer",
            layer,
            ReadFault::Drop,
            false,
            lenient,
            3,
            &[layer],
        ),
        (
            "dropped on its config",
            config,
            ReadFault::Drop,
            false,
            with_key,
            3,
            &[config],
        ),
    ];
    let docker_config = h.path().join(".docker/config.json");
    for (what, needle, how, login, flags, code, said) in cases {
        let proxy = fault_proxy::start(&e.plain, Mode::FailReads(needle, how));
        let _ = std::fs::remove_file(&docker_config);
        if login {
            std::fs::create_dir_all(docker_config.parent().unwrap()).unwrap();
            // user:secret
            let auths = format!(
                r#"{{"auths":{{"{}":{{"auth":"dXNlcjpzZWNyZXQ="}}}}}}"#,
                proxy.addr
            );
            std::fs::write(&docker_config, auths).unwrap();
        }
        let o = h
            .build(VERSION)
            .source(&format!("{}/{src}", proxy.addr))
            .out(&out)
            .arg("--with-signatures")
            .args(flags)
            .run();
        let err = assert_fails(
            &o,
            code,
            &[&["koordinator-sh/koord-manager", tag][..], said].concat(),
        );
        println!("{what}: {}", err.lines().last().unwrap_or(""));
        assert!(!err.contains("no signature upstream"), "{what}: {err}");
        assert!(
            proxy
                .counts
                .failed_reads
                .load(std::sync::atomic::Ordering::SeqCst)
                > 0,
            "{what}"
        );
        no_bundle();
    }
    let _ = std::fs::remove_file(&docker_config);
    // A 404 on the tag: unsigned. Refused with --verify-key, carried without a signature with
    // --allow-unsigned-images (and said so).
    let proxy = fault_proxy::start(&e.plain, Mode::FailReads(tag, ReadFault::Status(404)));
    let build = |flags: &[&str]| {
        h.build(VERSION)
            .source(&format!("{}/{src}", proxy.addr))
            .out(&out)
            .arg("--with-signatures")
            .args(flags)
            .run()
    };
    assert_fails(
        &build(with_key),
        1,
        &[
            "koordinator-sh/koord-manager",
            digest.as_str(),
            "no signature upstream",
            "--allow-unsigned-images",
        ],
    );
    no_bundle();
    let o = build(lenient);
    assert_ok(&o);
    let said = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        said.contains("koord-manager") && said.contains("has no signature upstream"),
        "{said}"
    );
    let m = bundle_manifest(&out);
    assert!(bundle_image(&m, repo).get("signatures").is_none());
    assert!(bundle_image(&m, IMAGES[0])["signatures"][0]["verifiedWith"].is_string());
}

/// sha256 of a PEM public key's DER, by openssl: what the bundle records as `verifiedWith`.
fn fingerprint(h: &Home, public: &Path) -> String {
    let der = h.path().join("key.der");
    assert_ok(&tool(
        "openssl",
        &[
            "pkey",
            "-pubin",
            "-in",
            public.to_str().unwrap(),
            "-outform",
            "DER",
            "-out",
            der.to_str().unwrap(),
        ],
        h.path(),
    ));
    sha256(&std::fs::read(der).unwrap())
}

/// `inspect` (table and --json) lists the carried signatures and attestations per image: what
/// each signs, how many it holds, and whether it was verified at build and against which key
/// (the key's DER sha256, as openssl computes it); an image without one says why. `diff`
/// (table, Markdown, --json) reports them added, removed and changed (another manifest, a lost
/// verification), with warnings for a signature NEW no longer carries or no longer verified.
#[test]
fn carried_signatures_show_in_inspect_and_diff() {
    let h = Home::with_key();
    let (up_key, up_pub) = key_pair(&h, "upstream");
    let (other_key, _) = key_pair(&h, "other");
    let up = up_pub.to_str().unwrap();
    let fp = fingerprint(&h, &up_pub);
    let e = env();
    let src = unique_prefix("upsig-show");
    let images = copy_images(&src);
    let at = |i: usize| format!("{}/{src}/{}@{}", e.plain, images[i].0, images[i].1);
    // koord-descheduler: its index and both platforms; koord-manager: its index; the others
    // none.
    sign(&h, &up_key, &at(0), true);
    sign(&h, &up_key, &at(1), false);
    let build = |name: &str, flags: &[&str]| {
        let out = h.path().join(name);
        assert_ok(&build(&h, &src, &out, flags));
        out
    };
    let lenient = ["--verify-key", up, "--allow-unsigned-images"];
    let a = build("a.tar", &lenient);
    let inspect = |b: &Path| ok(&h.run(&["inspect", b.to_str().unwrap()]));
    let table = inspect(&a);
    println!("{table}");
    let short = |d: &str| format!("sha256:{}", &d.trim_start_matches("sha256:")[..12]);
    for want in [
        format!("upstream cosign signatures: 4 manifests carried for 2 of 4 images, each verified at build against the key {fp}"),
        format!("signature    of index {}  1 signature, verified at build, key {}", short(&images[1].1), short(&fp)),
        "of linux/amd64 sha256:".to_string(),
        "of linux/arm64 sha256:".to_string(),
        "no upstream signature carried: unsigned at its source, let through by --allow-unsigned-images".to_string(),
    ] {
        assert!(table.contains(&want), "inspect lacks {want:?}:\n{table}");
    }
    let j: Value =
        serde_json::from_slice(&h.run(&["inspect", a.to_str().unwrap(), "--json"]).stdout).unwrap();
    assert_eq!(
        j["upstreamSignatures"]["manifests"], 4,
        "{}",
        j["upstreamSignatures"]
    );
    assert_eq!(
        j["upstreamSignatures"]["verifiedWith"],
        serde_json::json!([fp])
    );
    let of = |j: &Value, repo: &str| -> Vec<Value> {
        j["images"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["ref"] == format!("{repo}:{TAG}"))
            .unwrap()["signatures"]
            .as_array()
            .unwrap()
            .clone()
    };
    let s = of(&j, IMAGES[1]);
    assert_eq!(s.len(), 1, "{s:?}");
    assert_eq!(s[0]["kind"], "signature");
    assert_eq!(s[0]["signs"], images[1].1.as_str());
    assert_eq!(s[0]["signsWhat"], "index");
    assert_eq!(s[0]["verified"], true);
    assert_eq!(s[0]["verifiedWith"], fp.as_str());
    assert_eq!(s[0]["layers"], 1);
    assert_eq!(of(&j, IMAGES[0]).len(), 3);
    assert!(of(&j, IMAGES[2]).is_empty());

    // B: koord-scheduler signed since, and koord-manager attested.
    sign(&h, &up_key, &at(2), false);
    attest(&h, &up_key, &at(1));
    let b = build("b.tar", &lenient);
    let diff = |o: &Path, n: &Path, extra: &[&str]| {
        ok(&h.run(
            &[
                &["diff", o.to_str().unwrap(), n.to_str().unwrap()][..],
                extra,
            ]
            .concat(),
        ))
    };
    let json =
        |o: &Path, n: &Path| -> Value { serde_json::from_str(&diff(o, n, &["--json"])).unwrap() };
    let r = json(&a, &b);
    let s = &r["signatures"];
    assert_eq!(s["unchanged"], 4, "{s}");
    assert!(
        s["removed"].as_array().unwrap().is_empty() && s["changed"].as_array().unwrap().is_empty(),
        "{s}"
    );
    let mut added: Vec<(String, String, String)> = s["added"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            assert_eq!(x["verifiedWith"], fp.as_str(), "{x}");
            (
                x["kind"].as_str().unwrap().into(),
                x["image"].as_str().unwrap().into(),
                x["signs"].as_str().unwrap().into(),
            )
        })
        .collect();
    added.sort();
    assert_eq!(
        added,
        [
            (
                "attestation".into(),
                format!("{}:{TAG}", IMAGES[1]),
                images[1].1.clone()
            ),
            (
                "signature".into(),
                format!("{}:{TAG}", IMAGES[2]),
                images[2].1.clone()
            ),
        ]
    );
    let t = diff(&a, &b, &[]);
    println!("{t}");
    assert!(
        t.contains("upstream signatures 2 added, 0 removed, 0 changed, 4 unchanged"),
        "{t}"
    );
    assert!(
        t.contains(&format!(
            "  + signature {}:{}",
            IMAGES[2],
            sig_tag(&images[2].1)
        )),
        "{t}"
    );
    let md = diff(&a, &b, &["--format", "markdown"]);
    assert!(
        md.contains("### Upstream signatures: 2 added, 0 removed, 0 changed, 4 unchanged"),
        "{md}"
    );
    // The other way: removed, and warned about.
    let r = json(&b, &a);
    assert_eq!(
        r["signatures"]["removed"].as_array().unwrap().len(),
        2,
        "{}",
        r["signatures"]
    );
    let warned = r["warnings"].to_string();
    assert!(
        warned.contains("NEW no longer carries 1 upstream signature OLD carried"),
        "{warned}"
    );
    assert!(warned.contains(&sig_tag(&images[2].1)), "{warned}");

    // C: built without --verify-key, after another key signed koord-manager too (cosign
    // appends its signature to the same tag: another manifest, two layers).
    sign(&h, &other_key, &at(1), false);
    let c = build("c.tar", &[]);
    let table = inspect(&c);
    assert!(
        table.contains("NOT verified at build (built without --verify-key)"),
        "{table}"
    );
    assert!(
        table.contains("2 signatures, NOT verified (built without --verify-key)"),
        "{table}"
    );
    assert!(
        table.contains("no upstream signature carried (none at its source)"),
        "{table}"
    );
    let r = json(&b, &c);
    let s = &r["signatures"];
    assert_eq!(s["changed"].as_array().unwrap().len(), 6, "{s}");
    let manager = s["changed"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["ref"] == format!("{}:{}", IMAGES[1], sig_tag(&images[1].1)))
        .unwrap();
    assert_eq!(manager["layers"], serde_json::json!({"old": 1, "new": 2}));
    assert_ne!(manager["digest"]["old"], manager["digest"]["new"]);
    assert_eq!(
        manager["verifiedWith"],
        serde_json::json!({"old": fp, "new": null})
    );
    let warned = r["warnings"].to_string();
    assert!(
        warned.contains("6 upstream signatures verified at build in OLD are not verified against the same key in NEW"),
        "{warned}"
    );
    let t = diff(&b, &c, &[]);
    assert!(
        t.contains(&format!(
            "layers 1 → 2; verified at build (key {}) → NOT verified at build",
            short(&fp)
        )),
        "{t}"
    );
}
