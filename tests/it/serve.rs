//! `serve`: the real binary as a read-only registry, read by real skopeo, helm 3 and 4, curl and
//! `koord-bundle load`; over plain HTTP and over TLS with basic auth; from a whole bundle and
//! from the first part of a split one. Bad bundles are refused before anything is served.
//! Each server is a child process killed when the test ends (`serve_proc.rs`).

use crate::common::*;
use crate::serve_proc::{start, try_start};
use serde_json::Value;
use std::path::Path;

/// `skopeo copy --all` of every image from `src_host` into OCI layouts; checks each copied
/// index has the bundle's digest (and `skopeo inspect --raw` agrees).
fn skopeo_copies_every_image(home: &Home, m: &Value, src_host: &str, how: &Skopeo) {
    let src_flags = how.flags("src-");
    for (r, digest) in image_digests(m) {
        let src = format!("docker://{src_host}/{r}");
        assert_digest(&src, how, &digest);
        let dir = home.path().join(format!(
            "oci-{}",
            unique_prefix(&r.replace(['/', ':'], "_"))
        ));
        let dest = format!("oci:{}:x", dir.display());
        let mut a = vec!["copy", "--all"];
        a.extend(src_flags.iter().map(String::as_str));
        a.push(&src);
        a.push(&dest);
        let o = tool("skopeo", &a, home.path());
        assert_ok(&o);
        let index: Value =
            serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
        assert_eq!(index["manifests"][0]["digest"], digest.as_str(), "{src}");
    }
}

/// `helm pull` of the bundle's chart from `host`; the archive must be the bundle's, byte for byte.
fn helm_pull_is_identical(helm: &Path, host: &str, flags: &[&str], chart_digest: &str) {
    let d = tempfile::tempdir().unwrap();
    let mut a = vec![
        "pull".to_string(),
        format!("oci://{host}/charts/koordinator"),
        "--version".into(),
        "1.8.0".into(),
        "-d".into(),
        d.path().to_string_lossy().into_owned(),
    ];
    a.extend(flags.iter().map(|s| s.to_string()));
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let o = tool(helm.to_str().unwrap(), &a, d.path());
    assert_ok(&o);
    let got = std::fs::read(d.path().join("koordinator-1.8.0.tgz")).unwrap();
    assert_eq!(sha256(&got), chart_digest, "{}", helm.display());
}

/// `--key` for `serve`: the home's public key.
fn pubkey(h: &Home) -> String {
    h.pubkey().to_string_lossy().into_owned()
}

#[test]
fn serve_skopeo_copies_every_image_and_helm_pulls_the_chart() {
    let b = Built::new();
    let m = bundle_manifest(&b.bundle);
    let s = start(&b.home, &[b.bundle.to_str().unwrap()]);
    let out = s.stdout();
    for needle in [
        "verified: signature OK",
        "charts/koordinator",
        "koordinator-sh/koordlet",
        "skopeo copy --all",
        "helm pull oci://",
        "imageRepositoryHost=",
        "koord-bundle load",
        "insecure registry",
    ] {
        assert!(out.contains(needle), "banner lacks {needle:?}:\n{out}");
    }
    assert_eq!(image_digests(&m).len(), 5);
    skopeo_copies_every_image(&b.home, &m, &s.addr, &Skopeo::plain_http());
    let chart_digest = m["chart"]["digest"].as_str().unwrap();
    let e = env();
    for helm in [&e.helm3, &e.helm4] {
        helm_pull_is_identical(helm, &s.addr, &["--plain-http"], chart_digest);
    }
    // One log line per request: method, path, status, bytes.
    let log = s.wait_log("/v2/charts/koordinator/blobs/");
    assert!(
        log.lines()
            .any(|l| l.contains(" GET /v2/koordinator-sh/koordlet/manifests/v1.8.0 200 ")),
        "{log}"
    );
}

#[test]
fn serve_and_load_read_the_same_bundle_at_once() {
    let b = Built::new();
    let e = env();
    let m = bundle_manifest(&b.bundle);
    let s = start(&b.home, &[b.bundle.to_str().unwrap()]);
    let loaded = unique_prefix("serve-load");
    let copied = unique_prefix("serve-copy");
    let load = {
        let mut c = b.home.cmd(&[
            "load",
            b.bundle.to_str().unwrap(),
            "--registry",
            &format!("{}/{loaded}", e.plain),
            "--plain-http",
            "--key",
            &pubkey(&b.home),
            "--no-install",
            "--json",
        ]);
        std::thread::spawn(move || c.output().unwrap())
    };
    // Meanwhile, skopeo copies every image from serve into the same registry.
    for (r, _) in image_digests(&m) {
        let o = tool(
            "skopeo",
            &[
                "copy",
                "--all",
                "--src-tls-verify=false",
                "--dest-tls-verify=false",
                &format!("docker://{}/{r}", s.addr),
                &format!("docker://{}/{copied}/{r}", e.plain),
            ],
            b.home.path(),
        );
        assert_ok(&o);
    }
    assert_ok(&load.join().unwrap());
    for (r, digest) in image_digests(&m) {
        for prefix in [&loaded, &copied] {
            let target = format!("docker://{}/{prefix}/{r}", e.plain);
            assert_digest(&target, &Skopeo::plain_http(), &digest);
        }
    }
}

#[test]
fn serve_answers_the_distribution_api() {
    let b = Built::new();
    let m = bundle_manifest(&b.bundle);
    let s = start(&b.home, &[b.bundle.to_str().unwrap()]);
    let url = |p: &str| s.url("http", p);

    // /v2/, GET and HEAD.
    let r = curl(&[], &url("/v2/"));
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"{}");
    assert_eq!(
        r.header("docker-distribution-api-version").as_deref(),
        Some("registry/2.0")
    );
    assert_eq!(curl(&["-I"], &url("/v2/")).status, 200);

    // Catalog and tags, with paging.
    let r = curl(&[], &url("/v2/_catalog"));
    let repos: Vec<String> = r.json()["repositories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        repos,
        [
            "charts/koordinator",
            "koordinator-sh/koord-descheduler",
            "koordinator-sh/koord-device-daemon",
            "koordinator-sh/koord-manager",
            "koordinator-sh/koord-scheduler",
            "koordinator-sh/koordlet",
        ]
    );
    let r = curl(&[], &url("/v2/_catalog?n=2"));
    assert_eq!(r.json()["repositories"].as_array().unwrap().len(), 2);
    let link = r.header("link").expect("Link header");
    assert!(
        link.contains("last=koordinator-sh%2fkoord-descheduler") && link.contains("rel=\"next\""),
        "{link}"
    );
    let r = curl(
        &[],
        &url("/v2/_catalog?n=2&last=koordinator-sh%2Fkoord-scheduler"),
    );
    assert_eq!(
        r.json()["repositories"],
        serde_json::json!(["koordinator-sh/koordlet"])
    );
    assert!(r.header("link").is_none());
    let r = curl(&[], &url("/v2/koordinator-sh/koordlet/tags/list"));
    assert_eq!(
        r.json(),
        serde_json::json!({"name": "koordinator-sh/koordlet", "tags": ["v1.8.0"]})
    );
    let r = curl(&[], &url("/v2/charts/koordinator/tags/list"));
    assert_eq!(r.json()["tags"], serde_json::json!(["1.8.0"]));
    let r = curl(&[], &url("/v2/nope/tags/list"));
    assert_eq!((r.status, r.error_code().as_str()), (404, "NAME_UNKNOWN"));

    // Manifests: by tag and by digest, GET and HEAD, media type from the bundle.
    let koordlet = m["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["repository"] == "koordinator-sh/koordlet")
        .unwrap();
    let digest = koordlet["digest"].as_str().unwrap();
    let media_type = koordlet["mediaType"].as_str().unwrap();
    for reference in ["v1.8.0", digest] {
        let r = curl(
            &[],
            &url(&format!(
                "/v2/koordinator-sh/koordlet/manifests/{reference}"
            )),
        );
        assert_eq!(r.status, 200);
        assert_eq!(sha256(&r.body), digest);
        assert_eq!(r.header("docker-content-digest").as_deref(), Some(digest));
        assert_eq!(r.header("content-type").as_deref(), Some(media_type));
        assert_eq!(r.header("content-length"), Some(r.body.len().to_string()));
        let h = curl(
            &["-I"],
            &url(&format!(
                "/v2/koordinator-sh/koordlet/manifests/{reference}"
            )),
        );
        assert_eq!(h.status, 200);
        assert_eq!(h.header("content-length"), Some(r.body.len().to_string()));
        assert_eq!(h.header("docker-content-digest").as_deref(), Some(digest));
    }
    // A child manifest, with the media type of its index entry; served whatever Accept says.
    let index: Value = serde_json::from_slice(
        &curl(&[], &url("/v2/koordinator-sh/koordlet/manifests/v1.8.0")).body,
    )
    .unwrap();
    let child = &index["manifests"][0];
    let r = curl(
        &[
            "-H",
            "Accept: application/vnd.docker.distribution.manifest.v1+json",
        ],
        &url(&format!(
            "/v2/koordinator-sh/koordlet/manifests/{}",
            child["digest"].as_str().unwrap()
        )),
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type").as_deref(),
        child["mediaType"].as_str()
    );
    let image: Value = serde_json::from_slice(&r.body).unwrap();
    for (path, code) in [
        (
            "/v2/koordinator-sh/koordlet/manifests/v0.0.0",
            "MANIFEST_UNKNOWN",
        ),
        ("/v2/nope/manifests/v1.8.0", "MANIFEST_UNKNOWN"),
        // Another repository's manifest is not in this one.
        (
            &format!("/v2/koordinator-sh/koord-manager/manifests/{digest}"),
            "MANIFEST_UNKNOWN",
        ),
    ] {
        let r = curl(&[], &url(path));
        assert_eq!((r.status, r.error_code().as_str()), (404, code), "{path}");
    }

    // Blobs: whole, HEAD, ranges.
    let layer = image["layers"][0]["digest"].as_str().unwrap();
    let size = image["layers"][0]["size"].as_u64().unwrap();
    let blob_url = url(&format!("/v2/koordinator-sh/koordlet/blobs/{layer}"));
    let whole = curl(&[], &blob_url);
    assert_eq!(whole.status, 200);
    assert_eq!(sha256(&whole.body), layer);
    assert_eq!(whole.body.len() as u64, size);
    assert_eq!(
        whole.header("content-type").as_deref(),
        Some("application/octet-stream")
    );
    assert_eq!(
        whole.header("docker-content-digest").as_deref(),
        Some(layer)
    );
    assert_eq!(whole.header("accept-ranges").as_deref(), Some("bytes"));
    let h = curl(&["-I"], &blob_url);
    assert_eq!(h.status, 200);
    assert_eq!(h.header("content-length"), Some(size.to_string()));
    let r = curl(&["-r", "100-1099"], &blob_url);
    assert_eq!(r.status, 206);
    assert_eq!(r.body, &whole.body[100..1100]);
    assert_eq!(
        r.header("content-range"),
        Some(format!("bytes 100-1099/{size}"))
    );
    let r = curl(&["-r", &format!("{}-", size - 10)], &blob_url);
    assert_eq!(r.status, 206);
    assert_eq!(r.body, &whole.body[size as usize - 10..]);
    let r = curl(&["-r", "-5"], &blob_url);
    assert_eq!(
        (r.status, &r.body[..]),
        (206, &whole.body[size as usize - 5..])
    );
    for bad in [format!("{size}-"), "9-3".to_string(), "x-y".to_string()] {
        let r = curl(&["-H", &format!("Range: bytes={bad}")], &blob_url);
        assert_eq!(r.status, 416, "{bad}");
        assert_eq!(r.header("content-range"), Some(format!("bytes */{size}")));
    }
    for (path, status, code) in [
        (
            format!(
                "/v2/koordinator-sh/koordlet/blobs/sha256:{}",
                "0".repeat(64)
            ),
            404,
            "BLOB_UNKNOWN",
        ),
        // A blob of another repository (the chart archive) is not in this one.
        (
            format!(
                "/v2/koordinator-sh/koordlet/blobs/{}",
                m["chart"]["digest"].as_str().unwrap()
            ),
            404,
            "BLOB_UNKNOWN",
        ),
        (
            "/v2/koordinator-sh/koordlet/blobs/sha256:xyz".to_string(),
            400,
            "DIGEST_INVALID",
        ),
    ] {
        let r = curl(&[], &url(&path));
        assert_eq!(
            (r.status, r.error_code().as_str()),
            (status, code),
            "{path}"
        );
    }
    assert_eq!(curl(&[], &url("/v1/")).status, 404);

    // Every write is refused.
    for (method, path) in [
        ("PUT", "/v2/koordinator-sh/koordlet/manifests/v1.8.0"),
        ("POST", "/v2/koordinator-sh/koordlet/blobs/uploads/"),
        ("PATCH", "/v2/koordinator-sh/koordlet/blobs/uploads/x"),
        (
            "DELETE",
            &format!("/v2/koordinator-sh/koordlet/blobs/{layer}"),
        ),
    ] {
        let r = curl(&["-X", method, "--data", "{}"], &url(path));
        assert_eq!(
            (r.status, r.error_code().as_str()),
            (405, "UNSUPPORTED"),
            "{method} {path}"
        );
    }
    // Still intact after all that.
    assert_eq!(sha256(&curl(&[], &blob_url).body), layer);
    let log = s.wait_log(" DELETE ");
    assert!(
        log.lines().any(|l| l.contains(&format!(
            "GET /v2/koordinator-sh/koordlet/blobs/{layer} 200 {size}B"
        ))),
        "{log}"
    );
    assert!(log.contains(" 405 "), "{log}");
}

#[test]
fn serve_over_tls_with_basic_auth() {
    let b = Built::new();
    let e = env();
    let m = bundle_manifest(&b.bundle);
    let pki = e.ca_file.parent().unwrap();
    let (cert, key) = (pki.join("server.crt"), pki.join("server.key"));
    let ca_dir = pki.parent().unwrap().join("ca");
    let password = "serve-s3cret-pw";
    let o = tool("htpasswd", &["-Bbn", "alice", password], b.home.path());
    assert_ok(&o);
    let htpasswd = b.home.path().join("serve.htpasswd");
    std::fs::write(&htpasswd, &o.stdout).unwrap();
    let s = start(
        &b.home,
        &[
            b.bundle.to_str().unwrap(),
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--htpasswd",
            htpasswd.to_str().unwrap(),
        ],
    );
    assert!(s.stdout().contains("https://"), "{}", s.stdout());
    let ca = e.ca_file.to_str().unwrap();
    let v2 = s.url("https", "/v2/");

    // Without or with wrong credentials: 401 and a Basic challenge, on every path.
    for (args, path) in [
        (vec!["--cacert", ca], "/v2/"),
        (vec!["--cacert", ca], "/v2/_catalog"),
        (
            vec!["--cacert", ca, "-u", "alice:wrong"],
            "/v2/koordinator-sh/koordlet/manifests/v1.8.0",
        ),
        (vec!["--cacert", ca, "-u", "bob:x"], "/v2/"),
    ] {
        let r = curl(&args, &s.url("https", path));
        assert_eq!(
            (r.status, r.error_code().as_str()),
            (401, "UNAUTHORIZED"),
            "{path}"
        );
        assert_eq!(
            r.header("www-authenticate").as_deref(),
            Some("basic realm=\"koord-bundle\""),
            "(headers lower-cased)"
        );
    }
    let creds = format!("alice:{password}");
    let r = curl(&["--cacert", ca, "-u", &creds], &v2);
    assert_eq!(r.status, 200);
    // The certificate is checked: curl without the CA refuses it.
    assert_eq!(curl(&["-u", &creds], &v2).status, 0);

    // skopeo: refused without credentials, copies with them (verifying with the CA).
    let anonymous = Skopeo {
        cert_dir: Some(&ca_dir),
        ..Skopeo::default()
    };
    let o = anonymous.inspect_raw(&format!(
        "docker://{}/koordinator-sh/koordlet:v1.8.0",
        s.addr
    ));
    assert!(!o.status.success(), "skopeo without credentials succeeded");
    skopeo_copies_every_image(
        &b.home,
        &m,
        &s.addr,
        &Skopeo::tls(&ca_dir, "alice", password),
    );

    // helm 4 over TLS with a registry login (helm 3 speaks plain HTTP to loopback registries,
    // see tests/it/helm.rs).
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = cfg_dir.path().join("config.json");
    let mut c = std::process::Command::new(&e.helm4);
    c.args([
        "registry",
        "login",
        &s.addr,
        "--username",
        "alice",
        "--password-stdin",
        "--registry-config",
        cfg.to_str().unwrap(),
        "--ca-file",
        ca,
    ]);
    let o = run_with_stdin(&mut c, &format!("{password}\n"));
    assert_ok(&o);
    helm_pull_is_identical(
        &e.helm4,
        &s.addr,
        &["--registry-config", cfg.to_str().unwrap(), "--ca-file", ca],
        m["chart"]["digest"].as_str().unwrap(),
    );

    let all = format!(
        "{}{}",
        s.stdout(),
        s.wait_log("/v2/charts/koordinator/blobs/")
    );
    assert!(!all.contains(password), "the password was logged");
    assert!(all.contains(" 401 "), "{all}");
}

#[test]
fn serve_refuses_what_does_not_verify() {
    let b = Built::new();
    let h = &b.home;
    let dir = h.path().join("serve-bad");
    std::fs::create_dir_all(&dir).unwrap();

    // A byte flipped in the largest blob.
    let bad = dir.join("flipped.tar");
    std::fs::copy(&b.bundle, &bad).unwrap();
    let (entry, offset) = largest_blob(&bad);
    flip_byte(&bad, offset + 1000);
    let r = try_start(h, &[bad.to_str().unwrap(), "--key", &pubkey(h)])
        .err()
        .expect("a flipped byte was served");
    assert_eq!(r.code, Some(1), "{r:?}");
    for needle in ["nothing is served", "SHA256SUMS says", entry.as_str()] {
        assert!(r.stderr.contains(needle), "lacks {needle:?}: {r:?}");
    }

    // A wrong key.
    let other = Home::with_key();
    let r = try_start(h, &[b.bundle.to_str().unwrap(), "--key", &pubkey(&other)])
        .err()
        .expect("served with the wrong key");
    assert_eq!(r.code, Some(1));
    assert!(r.stderr.contains("signed by key"), "{r:?}");

    // A gzip bundle cannot be read in place.
    let tar = dir.join("bundle.tar");
    std::fs::copy(&b.bundle, &tar).unwrap();
    assert_ok(&tool("gzip", &["-f", tar.to_str().unwrap()], h.path()));
    let gz = dir.join("bundle.tar.gz");
    let r = try_start(h, &[gz.to_str().unwrap()])
        .err()
        .expect("gzip served");
    assert_eq!(r.code, Some(1));
    assert!(r.stderr.contains("gunzip"), "{r:?}");

    // An htpasswd entry that is not bcrypt; a key that does not match the certificate.
    let md5 = dir.join("md5.htpasswd");
    let o = tool("htpasswd", &["-mbn", "alice", "pw"], h.path());
    assert_ok(&o);
    std::fs::write(&md5, &o.stdout).unwrap();
    let r = try_start(
        h,
        &[
            b.bundle.to_str().unwrap(),
            "--htpasswd",
            md5.to_str().unwrap(),
        ],
    )
    .err()
    .expect("MD5 htpasswd accepted");
    assert_eq!(r.code, Some(1));
    assert!(
        r.stderr.contains("htpasswd -B") && r.stderr.contains("MD5"),
        "{r:?}"
    );
    let pki = env().ca_file.parent().unwrap();
    let r = try_start(
        h,
        &[
            b.bundle.to_str().unwrap(),
            "--tls-cert",
            pki.join("server.crt").to_str().unwrap(),
            "--tls-key",
            pki.join("ca.key").to_str().unwrap(),
        ],
    )
    .err()
    .expect("a mismatched key was accepted");
    assert_eq!(r.code, Some(1));
    assert!(r.stderr.contains("TLS"), "{r:?}");
}

#[test]
fn serve_refuses_an_incremental_bundle() {
    let h = Home::with_key();
    let (base, _) = h.build_plain("1.6.0", &[]);
    let (inc, _) = h.build_plain("1.8.0", &["--since", base.to_str().unwrap()]);
    let r = try_start(&h, &[inc.to_str().unwrap()])
        .err()
        .expect("an incremental bundle was served");
    assert_eq!(r.code, Some(1));
    for needle in ["incremental", "1.6.0", "serve the full bundle"] {
        assert!(r.stderr.contains(needle), "lacks {needle:?}: {r:?}");
    }
}

#[test]
fn serve_unsigned_bundle_needs_the_explicit_flag() {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.8.0", &["--unsigned"]);
    let r = try_start(&h, &[bundle.to_str().unwrap()])
        .err()
        .expect("an unsigned bundle was served");
    assert_eq!(r.code, Some(1));
    for needle in [
        "not signed",
        "--insecure-skip-signature",
        "nothing is served",
    ] {
        assert!(r.stderr.contains(needle), "lacks {needle:?}: {r:?}");
    }
    let s = start(&h, &[bundle.to_str().unwrap(), "--insecure-skip-signature"]);
    assert!(s.stderr().contains("NOT checked"), "{}", s.stderr());
    assert!(
        s.stdout().contains("signature NOT CHECKED"),
        "{}",
        s.stdout()
    );
    let m = bundle_manifest(&bundle);
    skopeo_copies_every_image(&h, &m, &s.addr, &Skopeo::plain_http());
}

#[test]
fn serve_from_the_first_part_of_a_split_bundle() {
    let b = Built::new();
    let h = &b.home;
    let m = bundle_manifest(&b.bundle);
    let dir = h.path().join(unique_prefix("parts"));
    std::fs::create_dir(&dir).unwrap();
    let o = h.run(&[
        "split",
        b.bundle.to_str().unwrap(),
        "--size",
        "600K",
        "--output-dir",
        dir.to_str().unwrap(),
    ]);
    assert_ok(&o);
    let name = b.bundle.file_name().unwrap().to_string_lossy();
    let first = dir.join(format!("{name}.part000"));
    let parts = std::fs::read_dir(&dir).unwrap().count();
    assert!(parts >= 2, "{parts} parts");
    assert_ok(&h.run(&["verify", first.to_str().unwrap()]));
    let s = start(h, &[first.to_str().unwrap()]);
    // Every image (so every blob, some of them across two parts) arrives with its digest.
    skopeo_copies_every_image(h, &m, &s.addr, &Skopeo::plain_http());
    helm_pull_is_identical(
        &env().helm3,
        &s.addr,
        &["--plain-http"],
        m["chart"]["digest"].as_str().unwrap(),
    );
    // A range across the whole of the largest blob, in two requests that meet in the middle.
    let (entry, _) = largest_blob(&b.bundle);
    let digest = format!("sha256:{}", entry.rsplit('/').next().unwrap());
    let repo = s.repo_with_blob(&m, &digest);
    let url = s.url("http", &format!("/v2/{repo}/blobs/{digest}"));
    let a = curl(&["-r", "0-199999"], &url);
    let z = curl(&["-r", "200000-"], &url);
    assert_eq!((a.status, z.status), (206, 206));
    assert_eq!(sha256(&[a.body, z.body].concat()), digest);
}

#[test]
fn serve_notices_a_bundle_changed_after_verification() {
    let b = Built::new();
    let h = &b.home;
    let dir = h.path().join(unique_prefix("changed"));
    std::fs::create_dir_all(&dir).unwrap();
    let served = dir.join("served.tar");
    let pristine = dir.join("pristine.tar");
    std::fs::copy(&b.bundle, &served).unwrap();
    std::fs::copy(&b.bundle, &pristine).unwrap();
    assert_ok(&tool(
        "touch",
        &["-r", served.to_str().unwrap(), pristine.to_str().unwrap()],
        h.path(),
    ));
    let (entry, offset) = largest_blob(&served);
    let digest = format!("sha256:{}", entry.rsplit('/').next().unwrap());
    let m = bundle_manifest(&b.bundle);
    let s = start(h, &[served.to_str().unwrap(), "--key", &pubkey(h)]);
    let repo = s.repo_with_blob(&m, &digest);
    let url = s.url("http", &format!("/v2/{repo}/blobs/{digest}"));
    assert_eq!(sha256(&curl(&[], &url).body), digest);

    // Altered in place, its time stamp put back: the size and time checks cannot see it, the
    // digest check of a whole GET does. The transfer breaks off, and the blob is refused after.
    flip_byte(&served, offset + 1000);
    assert_ok(&tool(
        "touch",
        &["-r", pristine.to_str().unwrap(), served.to_str().unwrap()],
        h.path(),
    ));
    let r = curl(&[], &url);
    assert_ne!(sha256(&r.body), digest, "a wrong blob arrived whole");
    let log = s.wait_log("read back as");
    assert!(
        log.contains("the bundle changed after verification"),
        "{log}"
    );
    assert_eq!(curl(&[], &url).status, 500);

    // Altered without hiding it: any other blob read from the file is refused too, even a
    // range; manifests (held in memory since verification) are still served.
    flip_byte(&served, offset + 2000);
    let get = |p: &str| curl(&[], &s.url("http", p));
    let index: Value =
        serde_json::from_slice(&get(&format!("/v2/{repo}/manifests/v1.8.0")).body).unwrap();
    let child = index["manifests"][0]["digest"].as_str().unwrap();
    let image: Value =
        serde_json::from_slice(&get(&format!("/v2/{repo}/manifests/{child}")).body).unwrap();
    let layer = image["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap())
        .find(|d| *d != digest)
        .expect("another layer");
    let r = curl(
        &["-r", "0-9"],
        &s.url("http", &format!("/v2/{repo}/blobs/{layer}")),
    );
    assert_eq!(r.status, 500);
    s.wait_log("changed since it was verified");
}

#[test]
fn serve_stops_cleanly_on_sigterm() {
    let b = Built::new();
    let mut s = start(&b.home, &[b.bundle.to_str().unwrap()]);
    assert_eq!(curl(&[], &s.url("http", "/v2/")).status, 200);
    let status = s.terminate();
    assert!(status.success(), "{status:?}\n{}", s.stderr());
    assert!(s.stderr().contains("stopped"), "{}", s.stderr());
    // The port is closed.
    assert_eq!(curl(&[], &s.url("http", "/v2/")).status, 0);
}
