//! `build`, `inspect` and the bundle format, checked with the real peers.

use crate::common::*;
use crate::fake_registry::{self, BlobMode};
use serde_json::Value;
use std::collections::BTreeSet;

fn refs(build: &Value) -> Vec<String> {
    build["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["ref"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn build_1_8_0_from_plain_registry_checks_with_standard_tools() {
    let h = Home::with_key();
    let (bundle, b) = h.build_plain("1.8.0", &[]);
    assert!(bundle.is_file());
    // Every image the chart deploys, under the chart's repository names, digests unchanged.
    let expected: Vec<String> = COMPONENTS_180
        .iter()
        .map(|c| format!("koordinator-sh/{c}:v1.8.0"))
        .collect();
    assert_eq!(refs(&b), expected);
    for img in b["images"].as_array().unwrap() {
        let repo = img["repository"].as_str().unwrap();
        assert_eq!(img["digest"], pushed_digest(repo, "v1.8.0"), "{repo}");
        assert_eq!(img["digest"], img["upstreamDigest"]);
        assert_eq!(
            img["platforms"],
            serde_json::json!(["linux/amd64", "linux/arm64"]),
            "{repo}"
        );
        assert_eq!(img["source"], env().plain.as_str());
        assert_eq!(
            img["original"],
            format!("registry.cn-beijing.aliyuncs.com/{repo}:v1.8.0")
        );
    }
    let koordlet = b["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["ref"] == "koordinator-sh/koordlet:v1.8.0")
        .unwrap();
    assert_eq!(
        koordlet["attestations"], 1,
        "the buildx attestation entry is kept (digest unchanged)"
    );
    assert_eq!(b["crds"], 13);

    // sha256sum -c and minisign -Vm on the extracted bundle.
    let x = extract(&h, &bundle);
    let o = tool("sha256sum", &["-c", "--strict", "SHA256SUMS"], &x);
    assert_ok(&o);
    let checked = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.ends_with(": OK"))
        .count();
    let files_on_disk = walk_files(&x).len();
    assert_eq!(
        checked + 2,
        files_on_disk,
        "SHA256SUMS covers every file but itself and its signature"
    );
    assert_ok(&tool(
        "minisign",
        &["-Vm", "SHA256SUMS", "-p", h.pubkey().to_str().unwrap()],
        &x,
    ));
    // CRDs are plain YAML, wrappers stripped.
    for f in std::fs::read_dir(x.join("crds")).unwrap() {
        let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
        assert!(!text.contains("{{"), "template left in a CRD");
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(v["kind"].as_str(), Some("CustomResourceDefinition"));
    }
    // skopeo reads every image straight from the archive.
    for r in &expected {
        assert_digest(
            &format!("oci-archive:{}:{r}", bundle.display()),
            &Skopeo::default(),
            &pushed_digest(r.split(':').next().unwrap(), "v1.8.0"),
        );
        let o = tool(
            "skopeo",
            &[
                "inspect",
                "--override-arch",
                "arm64",
                &format!("oci-archive:{}:{r}", bundle.display()),
            ],
            h.path(),
        );
        assert_ok(&o);
    }
    // inspect --json has the documented shape.
    let o = h.run(&["inspect", bundle.to_str().unwrap(), "--json"]);
    assert_ok(&o);
    let i: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(i["chart"]["name"], "koordinator");
    assert_eq!(i["chart"]["version"], "1.8.0");
    assert_eq!(
        i["chart"]["digest"],
        format!(
            "sha256:{}",
            sha_of(&common_fixture("koordinator-1.8.0.tgz"))
        )
    );
    assert_eq!(i["images"].as_array().unwrap().len(), 5);
    for img in i["images"].as_array().unwrap() {
        for k in ["ref", "digest", "platforms", "source"] {
            assert!(!img[k].is_null(), "inspect image lacks {k}");
        }
    }
    assert_eq!(i["crds"].as_array().unwrap().len(), 13);
    assert_eq!(i["signature"]["signed"], true);
    assert!(i["signature"]["keyId"].as_str().unwrap().len() == 16);
}

fn common_fixture(name: &str) -> Vec<u8> {
    std::fs::read(fixtures().join(name)).unwrap()
}

fn sha_of(b: &[u8]) -> String {
    sha256(b)[7..].to_string()
}

fn walk_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            v.extend(walk_files(&p));
        } else {
            v.push(p);
        }
    }
    v
}

#[test]
fn shared_layers_are_stored_once() {
    let h = Home::with_key();
    let (bundle, b) = h.build_plain("1.8.0", &[]);
    let entries = tar_entries(&bundle);
    let unique: BTreeSet<&String> = entries.iter().collect();
    assert_eq!(unique.len(), entries.len(), "no tar entry twice");
    // Entry order: checksum file and signature first (signature checked before anything else).
    assert_eq!(entries[0], "SHA256SUMS");
    assert_eq!(entries[1], "SHA256SUMS.minisig");
    let blobs = entries
        .iter()
        .filter(|e| e.starts_with("blobs/sha256/") && e.len() > 20)
        .count();
    let i: Value = serde_json::from_slice(
        &h.run(&["inspect", bundle.to_str().unwrap(), "--json"])
            .stdout,
    )
    .unwrap();
    assert_eq!(blobs as u64, i["blobs"]["count"].as_u64().unwrap());
    // The images share their base layer: the sum of image sizes exceeds the unique bytes.
    let sum: u64 = b["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["totalSize"].as_u64().unwrap())
        .sum();
    let unique_bytes = i["blobs"]["bytes"].as_u64().unwrap();
    assert!(
        sum > unique_bytes + 4 * 300_000,
        "shared base layers should be counted once: {sum} vs {unique_bytes}"
    );
    // Bundle size = unique blob bytes + the small files (chart, CRDs, manifests) + tar framing.
    let size = std::fs::metadata(&bundle).unwrap().len();
    let small_files: u64 = {
        let mut ar = tar::Archive::new(std::fs::File::open(&bundle).unwrap());
        ar.entries()
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| !e.path().unwrap().starts_with("blobs"))
            .map(|e| e.size())
            .sum()
    };
    let framing = 512 * 2 * entries.len() as u64 + 10240;
    assert!(
        size >= unique_bytes + small_files && size <= unique_bytes + small_files + framing,
        "bundle {size} vs blobs {unique_bytes} + files {small_files}"
    );
}

#[test]
fn values_and_set_feed_discovery() {
    let h = Home::new();
    let o = h
        .build("1.8.0")
        .args(&[
            "--dry-run",
            "--json",
            "--set",
            "koordlet.image.tag=v1.6.0,manager.image.tag=v1.6.0",
        ])
        .run();
    assert_ok(&o);
    let plan: Value = serde_json::from_slice(&o.stdout).unwrap();
    let r = refs(&plan);
    assert!(
        r.contains(&"koordinator-sh/koordlet:v1.6.0".to_string()),
        "{r:?}"
    );
    assert!(
        r.contains(&"koordinator-sh/koord-manager:v1.6.0".to_string()),
        "{r:?}"
    );
    assert!(
        r.contains(&"koordinator-sh/koord-scheduler:v1.8.0".to_string()),
        "{r:?}"
    );
    assert!(plan["counts"]["download"]["blobs"].as_u64().unwrap() > 0);
    // A dry run downloads no layer: nothing partial, and whatever the cache holds is JSON
    // (manifests, configs), never a layer.
    let files = |d: &str| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(h.cache().join(d))
            .into_iter()
            .flatten()
            .map(|e| e.unwrap().path())
            .collect()
    };
    assert_eq!(files("partial").len(), 0);
    for f in files("blobs/sha256") {
        let b = std::fs::read(&f).unwrap();
        assert!(
            serde_json::from_slice::<Value>(&b).is_ok(),
            "a dry run cached {} ({} bytes), not JSON: a layer",
            f.display(),
            b.len()
        );
    }
}

#[test]
fn build_from_tls_registry_with_basic_auth() {
    let h = Home::with_key();
    let e = env();
    let out = h.path().join("b.tar");
    // Without credentials: a clear refusal naming the registry, nothing at the output path.
    let tls = h.build("1.8.0").source(&e.tls).https().out(&out);
    let o = tls
        .clone()
        .args(&["--ca-file", e.ca_file.to_str().unwrap()])
        .run();
    assert_fails(&o, 1, &[&e.tls, "docker login"]);
    assert!(!out.exists());
    // Without the CA: a TLS error that says what to do.
    let auth = h.login_tls();
    let o = tls.cmd().env("REGISTRY_AUTH_FILE", &auth).output().unwrap();
    assert_fails(&o, 1, &["--ca-file", "UnknownIssuer"]);
    assert!(!out.exists());
    // With both.
    let o = tls
        .args(&["--ca-file", e.ca_file.to_str().unwrap(), "--json"])
        .cmd()
        .env("REGISTRY_AUTH_FILE", &auth)
        .output()
        .unwrap();
    assert_ok(&o);
    let b: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(refs(&b).len(), 5);
    for img in b["images"].as_array().unwrap() {
        assert_eq!(img["source"], e.tls.as_str());
        assert_eq!(
            img["digest"],
            pushed_digest(img["repository"].as_str().unwrap(), "v1.8.0")
        );
    }
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        !all.contains(&e.password),
        "the password leaked into output"
    );
    let bytes = std::fs::read(&out).unwrap();
    assert!(
        !bytes
            .windows(e.password.len())
            .any(|w| w == e.password.as_bytes()),
        "the password is in the bundle"
    );
}

#[test]
fn platform_filter_keeps_only_those_platforms() {
    let h = Home::with_key();
    let (bundle, b) = h.build_plain("1.8.0", &["--platform", "linux/arm64"]);
    for img in b["images"].as_array().unwrap() {
        assert_eq!(img["platforms"], serde_json::json!(["linux/arm64"]));
        assert_ne!(
            img["digest"], img["upstreamDigest"],
            "a filtered index is a new index, recorded as such"
        );
        assert_eq!(
            img["upstreamDigest"],
            pushed_digest(img["repository"].as_str().unwrap(), "v1.8.0")
        );
        assert!(img["droppedPlatforms"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p == "linux/amd64"));
    }
    let r = "koordinator-sh/koordlet:v1.8.0";
    let raw = skopeo_raw(
        &format!("oci-archive:{}:{r}", bundle.display()),
        &Skopeo::default(),
    );
    let idx: Value = serde_json::from_slice(&raw).unwrap();
    let ms = idx["manifests"].as_array().unwrap();
    assert_eq!(ms.len(), 1, "amd64 and its attestation are dropped: {idx}");
    assert_eq!(ms[0]["platform"]["architecture"], "arm64");
    // And the filtered bundle still verifies completely.
    let o = h.run(&["verify", bundle.to_str().unwrap()]);
    assert_ok(&o);
    // An impossible filter is a clear error.
    let o = h
        .build("1.8.0")
        .args(&["--platform", "linux/s390x", "--dry-run"])
        .run();
    assert_fails(&o, 1, &["linux/s390x", "linux/amd64, linux/arm64"]);
}

#[test]
fn source_fallback_per_image() {
    let h = Home::new();
    let e = env();
    let partial = format!("{}/mirror-partial", e.plain);
    let o = h
        .build("1.8.0")
        .sources(&[&partial, &e.plain])
        .args(&["--dry-run", "--json"])
        .run();
    assert_ok(&o);
    let plan: Value = serde_json::from_slice(&o.stdout).unwrap();
    for img in plan["images"].as_array().unwrap() {
        let want = if img["repository"] == "koordinator-sh/koord-descheduler" {
            e.plain.clone()
        } else {
            partial.clone()
        };
        assert_eq!(img["source"], want.as_str(), "{}", img["ref"]);
        assert_eq!(
            img["digest"],
            pushed_digest(img["repository"].as_str().unwrap(), "v1.8.0")
        );
    }
    let d = plan["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["repository"] == "koordinator-sh/koord-descheduler")
        .unwrap();
    assert!(
        d["fallbacks"][0].as_str().unwrap().contains("not found"),
        "{d}"
    );
    // No source has it: every attempt is named.
    let o = h.build("1.8.0").source(&partial).arg("--dry-run").run();
    assert_fails(
        &o,
        1,
        &["no source has", "koord-descheduler", "mirror-partial"],
    );
}

/// A build of 1.8.0 from a repository (a local directory) holding the fixture archive and the
/// fixture index as `edit` changes it (given the index and the archive's real sha256): it
/// stops naming each of `refusal` and writes nothing; with --allow-chart-digest-mismatch it
/// goes on, warns with `warning`, and the bundle records it (`digestMismatchAllowed`).
fn refused_unless_overridden(
    edit: impl FnOnce(&str, &str) -> String,
    refusal: &[&str],
    warning: &str,
) {
    let h = Home::with_key();
    let repo = h.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    std::fs::copy(
        fixtures().join("koordinator-1.8.0.tgz"),
        repo.join("koordinator-1.8.0.tgz"),
    )
    .unwrap();
    let real = sha_of(&common_fixture("koordinator-1.8.0.tgz"));
    let index = std::fs::read_to_string(fixtures().join("index.yaml")).unwrap();
    std::fs::write(repo.join("index.yaml"), edit(&index, &real)).unwrap();
    let out = h.path().join("m.tar");
    let build = h.build("1.8.0").repo(repo.to_str().unwrap()).out(&out);
    let o = build.run();
    let mut needles = vec![
        "koordinator-1.8.0.tgz",
        real.as_str(),
        "--allow-chart-digest-mismatch",
    ];
    needles.extend_from_slice(refusal);
    assert_fails(&o, 1, &needles);
    assert!(!out.exists());
    let o = build.arg("--allow-chart-digest-mismatch").run();
    assert_ok(&o);
    assert!(String::from_utf8_lossy(&o.stderr).contains(warning));
    let i: Value =
        serde_json::from_slice(&h.run(&["inspect", out.to_str().unwrap(), "--json"]).stdout)
            .unwrap();
    assert_eq!(i["chart"]["digestMismatchAllowed"], true);
}

#[test]
fn chart_digest_mismatch_stops_the_build_unless_overridden() {
    // The index's digest for 1.8.0 does not match the archive.
    let fake = "0".repeat(64);
    refused_unless_overridden(
        |index, real| index.replace(real, &fake),
        &[&fake],
        "does not match",
    );
}

/// An index entry with no digest vouches for nothing: the archive it names is refused unless
/// the user says so (before: taken without a word, into the signed bundle).
#[test]
fn a_chart_the_index_gives_no_digest_for_stops_the_build_unless_overridden() {
    refused_unless_overridden(
        |index, real| {
            let lines: Vec<&str> = index.lines().collect();
            let at = lines
                .iter()
                .position(|l| l.contains(real))
                .expect("the index names 1.8.0's digest");
            assert!(
                lines[at].trim_start().starts_with("digest:"),
                "{}",
                lines[at]
            );
            let mut without = lines.clone();
            without.remove(at);
            without.join("\n") + "\n"
        },
        &["gives no digest for koordinator 1.8.0"],
        "the repository index gives no digest",
    );
}

#[test]
fn unknown_version_lists_the_nearest() {
    let h = Home::with_key();
    let o = h.build("1.7.5").run();
    assert_fails(&o, 1, &["1.7.5", "1.8.0", "1.6.0"]);
    let o = h.build("~1.9").run();
    assert_fails(&o, 1, &["~1.9"]);
    // Ranges and `latest` resolve.
    let o = h.build(">=1.4 <1.7").args(&["--dry-run", "--json"]).run();
    assert_ok(&o);
    let plan: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(plan["chart"]["version"], "1.6.0");
    let o = h.build_latest().args(&["--dry-run", "--json"]).run();
    assert_ok(&o);
    assert_eq!(
        serde_json::from_slice::<Value>(&o.stdout).unwrap()["chart"]["version"],
        "1.8.0"
    );
}

#[test]
fn no_key_says_how_to_make_one() {
    let h = Home::new();
    let out = h.path().join("k.tar");
    let build = h.build("1.8.0").out(&out);
    let o = build.run();
    assert_fails(&o, 1, &["koord-bundle keygen", "--sign-key"]);
    assert!(!out.exists());
    // An encrypted key with its password from the environment.
    let o = h
        .cmd(&["keygen"])
        .env("KOORD_BUNDLE_KEY_PASSWORD", "pw")
        .output()
        .unwrap();
    assert_ok(&o);
    let o = build.run();
    assert_fails(&o, 1, &["KOORD_BUNDLE_KEY_PASSWORD"]);
    let o = build
        .cmd()
        .env("KOORD_BUNDLE_KEY_PASSWORD", "pw")
        .output()
        .unwrap();
    assert_ok(&o);
    let o = h.run(&[
        "verify",
        out.to_str().unwrap(),
        "--key",
        h.pubkey().to_str().unwrap(),
    ]);
    assert_ok(&o);
}

#[test]
fn blob_digest_mismatch_is_refused_and_never_cached() {
    let h = Home::with_key();
    let layer: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let fake = fake_registry::start("bad/img", "v1", layer, BlobMode::Corrupt);
    let out = h.path().join("bad.tar");
    let img = format!("{}/bad/img:v1", fake.addr);
    let build = h.build("1.8.0").args(&["--image", &img]).out(&out);
    let o = build.run();
    assert_fails(&o, 1, &[&fake.layer_digest, "refused"]);
    assert!(!out.exists(), "no bundle after a refused blob");
    let hex = &fake.layer_digest[7..];
    assert!(
        !h.cache().join("blobs/sha256").join(hex).exists(),
        "the bad blob reached the cache"
    );
    // The same image served correctly: the build completes and the image is in the bundle.
    *fake.mode.lock().unwrap() = BlobMode::Good;
    let o = build.arg("--json").run();
    assert_ok(&o);
    let b: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(refs(&b).contains(&"bad/img:v1".to_string()));
}

/// With the opt-in blob store (`--cache DIR`), a blob cut off mid-way is resumed at the byte
/// where it stopped (the store's partial file); the other blobs the killed run finished are
/// kept from its own `.partial` (tests/it/bytes.rs has the default build's resume).
#[test]
fn interrupted_build_resumes_without_refetching() {
    let h = Home::with_key();
    let layer: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let fake = fake_registry::start("slow/img", "v1", layer, BlobMode::StallAfter(1_000_000));
    let out = h.path().join("r.tar");
    let img = format!("{}/slow/img:v1", fake.addr);
    let store = h.cache();
    let build = h.build("1.8.0").args(&[
        "--image",
        &img,
        "--json",
        "--cache",
        store.to_str().unwrap(),
    ]);
    let mut child = build
        .clone()
        .out(&out)
        .cmd()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until a million bytes of the layer sit in the partial file, then SIGKILL the build.
    let partial = h.cache().join("partial").join(&fake.layer_digest[7..]);
    wait_until(
        "the build to reach the stalled layer",
        std::time::Duration::from_secs(120),
        || std::fs::metadata(&partial).map(|m| m.len()).unwrap_or(0) >= 1_000_000,
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        !out.exists(),
        "a killed build left a file at the output path"
    );
    *fake.mode.lock().unwrap() = BlobMode::Good;
    let o = build.clone().out(&out).run();
    assert_ok(&o);
    let b: Value = serde_json::from_slice(&o.stdout).unwrap();
    // Resumed with a range request at the byte where it stopped; the rest came from the cache.
    assert_eq!(fake.ranges.lock().unwrap().last().copied(), Some(1_000_000));
    assert_eq!(fake.layer_gets.load(std::sync::atomic::Ordering::SeqCst), 2);
    let (downloaded, cached, resumed, total) = (
        b["fetch"]["downloadedBytes"].as_u64().unwrap(),
        b["fetch"]["cachedBytes"].as_u64().unwrap(),
        b["fetch"]["resumedBytes"].as_u64().unwrap(),
        b["counts"]["copied"]["bytes"].as_u64().unwrap(),
    );
    assert!(
        downloaded + cached + resumed >= total && downloaded < total,
        "every byte is reused, kept or fetched: {b}"
    );
    assert!(
        cached >= 1_000_000,
        "the first million bytes of the layer were reused: {cached}"
    );
    // A second bundle from the same cache downloads nothing.
    let out2 = h.path().join("r2.tar");
    let o = build.out(&out2).run();
    assert_ok(&o);
    let b2: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(b2["fetch"]["downloadedBytes"], 0);
    assert_eq!(b2["fetch"]["cachedBlobs"], b2["counts"]["copied"]["blobs"]);
}

/// One plan per run: the dry run prints the very numbers the real run then has (carried,
/// copied, to download, left out, images, CRDs), the same image records and creation time, with
/// and without `--since` (the dry run used to count the blobs a base holds as "to download").
#[test]
fn dry_run_and_real_run_print_the_same_plan() {
    let h = Home::with_key();
    let (base, _) = h.build_plain("1.6.0", &[]);
    for extra in [vec![], vec!["--since", base.to_str().unwrap()]] {
        let out = h.path().join(format!("same-{}.tar", extra.len()));
        let dry = h
            .build("1.8.0")
            .args(&extra)
            .arg("--dry-run")
            .arg("--json")
            .run();
        assert_ok(&dry);
        let real = h.build("1.8.0").args(&extra).out(&out).arg("--json").run();
        assert_ok(&real);
        let (d, r): (Value, Value) = (
            serde_json::from_slice(&dry.stdout).unwrap(),
            serde_json::from_slice(&real.stdout).unwrap(),
        );
        assert!(d["counts"]["carried"]["blobs"].as_u64().unwrap() > 0, "{d}");
        assert_eq!(d["counts"], r["counts"], "dry run {d}\nreal run {r}");
        assert_eq!(d["images"], r["images"]);
        assert_eq!(d["created"], r["created"]);
        if extra.is_empty() {
            assert_eq!(d["counts"]["omitted"]["blobs"], 0);
        } else {
            // What the base holds is neither carried nor downloaded.
            let omitted = d["counts"]["omitted"]["blobs"].as_u64().unwrap();
            assert!(omitted > 0, "{d}");
        }
        // The bundle manifest says the same: inspect reads it back.
        let o = h.run(&["inspect", out.to_str().unwrap(), "--json"]);
        assert_ok(&o);
        let i: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(i["blobs"]["count"], r["counts"]["carried"]["blobs"]);
        assert_eq!(i["blobs"]["bytes"], r["counts"]["carried"]["bytes"]);
    }
}
