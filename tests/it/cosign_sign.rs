//! `load --sign-images` and `keygen --cosign` (issue 46), checked with the real cosign (v2.6.5,
//! built by scripts/install-deps.sh; a test that cannot find it fails): every signature and
//! attestation a load pushes is verified by digest against the TLS + auth registry; a key
//! made by `cosign generate-key-pair` is read, and one made by `keygen --cosign` is read by
//! cosign; another key, a tampered signature, a wrong password, a file that is not a cosign
//! key and a registry that refuses the signature tag are each refused.

use crate::common::*;
use crate::fault_proxy::{self, Mode};
use serde_json::Value;
use std::path::Path;
use std::process::Output;

/// cosign, run in a home of its own that reaches nothing: `HOME` and `TUF_ROOT` in `h`, the
/// TLS registry's CA (`SSL_CERT_FILE`) and login (a `DOCKER_CONFIG` of the test registry's
/// credentials), `COSIGN_PASSWORD` as given.
fn cosign(h: &Home, password: Option<&str>, args: &[&str]) -> Output {
    use base64::Engine as _;
    let e = env();
    let docker = cosign_home(h).join("docker");
    std::fs::create_dir_all(&docker).unwrap();
    let auth =
        base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", e.username, e.password));
    std::fs::write(
        docker.join("config.json"),
        format!(r#"{{"auths":{{"{}":{{"auth":"{auth}"}}}}}}"#, e.tls),
    )
    .unwrap();
    let mut envs = vec![
        ("DOCKER_CONFIG", docker.as_os_str()),
        ("SSL_CERT_FILE", e.ca_file.as_ref()),
    ];
    if let Some(p) = password {
        envs.push(("COSIGN_PASSWORD", p.as_ref()));
    }
    cosign_with(h, &envs, args)
}

/// `load BUNDLE --registry <TLS>/PREFIX --no-install --json --ca-file CA` with the TLS
/// registry's login, plus `extra`, `COSIGN_PASSWORD` as given.
fn load_tls(b: &Built, prefix: &str, password: Option<&str>, extra: &[&str]) -> Output {
    let e = env();
    let registry = format!("{}/{prefix}", e.tls);
    let mut c = b.home.load_cmd(
        &b.bundle,
        &registry,
        &[
            "--no-install",
            "--json",
            "--ca-file",
            e.ca_file.to_str().unwrap(),
        ],
    );
    c.args(extra).env("REGISTRY_AUTH_FILE", b.home.login_tls());
    if let Some(p) = password {
        c.env("COSIGN_PASSWORD", p);
    }
    c.output().unwrap()
}

/// Every `IMAGE@DIGEST` load says it signed: (reference, is an index with an attestation).
fn signed_refs(load: &Value) -> Vec<(String, bool)> {
    let mut v = Vec::new();
    for img in load["signed"]["images"].as_array().expect("signed.images") {
        let repo = img["repository"].as_str().unwrap();
        v.push((
            format!("{repo}@{}", img["index"]["digest"].as_str().unwrap()),
            true,
        ));
        for p in img["platforms"].as_array().unwrap() {
            v.push((format!("{repo}@{}", p["digest"].as_str().unwrap()), false));
        }
    }
    v
}

fn verify(h: &Home, key: &Path, image: &str) -> Output {
    cosign(
        h,
        None,
        &[
            "verify",
            "--key",
            key.to_str().unwrap(),
            "--insecure-ignore-tlog=true",
            image,
        ],
    )
}

/// The TLS registry's raw manifest at `reference` (`REPO:TAG` under the registry).
fn raw_manifest(reference: &str) -> Vec<u8> {
    let e = env();
    let cert_dir = e.ca_file.parent().unwrap().parent().unwrap().join("ca");
    skopeo_raw(
        &format!("docker://{reference}"),
        &Skopeo::tls(&cert_dir, &e.username, &e.password),
    )
}

#[test]
fn keygen_cosign_writes_a_pair_the_real_cosign_reads_and_never_overwrites() {
    let h = Home::new();
    let dir = h.path().join("keys");
    std::fs::create_dir(&dir).unwrap();
    let d = dir.to_str().unwrap();
    let o = h
        .cmd(&["keygen", "--cosign", "--output-dir", d, "--json"])
        .env("COSIGN_PASSWORD", "site-pw")
        .output()
        .unwrap();
    assert_ok(&o);
    let (key, pubkey) = (dir.join("cosign.key"), dir.join("cosign.pub"));
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // cosign reads the private key and derives the same public key.
    let derived = ok(&cosign(
        &h,
        Some("site-pw"),
        &["public-key", "--key", key.to_str().unwrap()],
    ));
    assert_eq!(derived, std::fs::read_to_string(&pubkey).unwrap());
    // A signature cosign makes with it verifies with our public key, and not with another.
    std::fs::write(h.path().join("blob"), b"what crossed").unwrap();
    ok(&cosign(
        &h,
        Some("site-pw"),
        &[
            "sign-blob",
            "--key",
            key.to_str().unwrap(),
            "--tlog-upload=false",
            "--yes",
            "--output-signature",
            "blob.sig",
            "blob",
        ],
    ));
    let verify_blob = |p: &Path| {
        cosign(
            &h,
            None,
            &[
                "verify-blob",
                "--key",
                p.to_str().unwrap(),
                "--insecure-ignore-tlog=true",
                "--signature",
                "blob.sig",
                "blob",
            ],
        )
    };
    ok(&verify_blob(&pubkey));
    let (_, other_pub) = cosign_key_pair(&h, "other", "x");
    cosign_refused(
        &verify_blob(&other_pub),
        "a signature checked with another key",
    );
    // The wrong password: cosign refuses it too (the key is really encrypted).
    cosign_refused(
        &cosign(
            &h,
            Some("nope"),
            &["public-key", "--key", key.to_str().unwrap()],
        ),
        "the wrong password",
    );
    // Never overwritten.
    let before = std::fs::read(&key).unwrap();
    let o = h
        .cmd(&["keygen", "--cosign", "--output-dir", d])
        .env("COSIGN_PASSWORD", "site-pw")
        .output()
        .unwrap();
    assert_fails(&o, 1, &["cosign.key", "never overwritten"]);
    assert_eq!(std::fs::read(&key).unwrap(), before);
}

#[test]
fn load_signs_and_attests_every_image_cosign_verifies_each_by_digest() {
    let b = Built::new();
    let h = &b.home;
    // The site's key, made by cosign itself.
    let (key, pubkey) = cosign_key_pair(h, "site", "site-pw");
    let (other_key, other_pub) = cosign_key_pair(h, "other", "other-pw");
    let prefix = unique_prefix("cosign");
    let o = load_tls(
        &b,
        &prefix,
        Some("site-pw"),
        &["--sign-images", key.to_str().unwrap()],
    );
    assert_ok(&o);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let refs = signed_refs(&r);
    let m = bundle_manifest(&b.bundle);
    let images = m["images"].as_array().unwrap();
    assert_eq!(
        r["signed"]["images"].as_array().unwrap().len(),
        images.len()
    );
    // Index + each platform manifest (every image of the 1.8.0 bundle has two platforms).
    assert!(refs.len() >= 3 * images.len(), "{refs:?}");
    assert_eq!(
        r["signed"]["pushed"].as_u64().unwrap() as usize,
        refs.len() + images.len()
    );
    // The bundle's BOM, for the attested entries.
    let bom_path = h.path().join("bom.cdx.json");
    assert_ok(&h.run(&[
        "inspect",
        b.bundle.to_str().unwrap(),
        "--sbom",
        bom_path.to_str().unwrap(),
    ]));
    let bom: Value = serde_json::from_slice(&std::fs::read(&bom_path).unwrap()).unwrap();
    for (image, is_index) in &refs {
        let out = ok(&verify(h, &pubkey, image));
        assert!(out.contains("docker-manifest-digest"), "{out}");
        println!("cosign verify {image}: OK");
        if *is_index {
            let out = ok(&cosign(
                h,
                None,
                &[
                    "verify-attestation",
                    "--type",
                    "cyclonedx",
                    "--key",
                    pubkey.to_str().unwrap(),
                    "--insecure-ignore-tlog=true",
                    image,
                ],
            ));
            println!("cosign verify-attestation --type cyclonedx {image}: OK");
            use base64::Engine as _;
            let env: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
            let st: Value = serde_json::from_slice(
                &base64::engine::general_purpose::STANDARD
                    .decode(env["payload"].as_str().unwrap())
                    .unwrap(),
            )
            .unwrap();
            assert_eq!(st["predicateType"], "https://cyclonedx.org/bom");
            let component = &st["predicate"]["metadata"]["component"];
            let entry = bom["components"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["bom-ref"] == component["bom-ref"])
                .expect("the attested component is an entry of the bundle's BOM");
            assert_eq!(component, entry, "the attested entry is the bundle's");
        }
    }
    // Another key's check refuses every one of them.
    let (first, _) = &refs[0];
    let err = cosign_refused(
        &verify(h, &other_pub, first),
        "our signature, checked with another key",
    );
    assert!(err.contains("no matching signatures"), "{err}");

    // Idempotent: a re-run pushes no signature manifest; every tag keeps its digest.
    let tags: Vec<(String, String)> = r["signed"]["images"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|i| {
            let mut v = vec![&i["index"]["signature"], &i["index"]["attestation"]];
            v.extend(
                i["platforms"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| &p["signature"]),
            );
            v.into_iter().map(|a| {
                (
                    a["reference"].as_str().unwrap().to_string(),
                    a["manifest"].as_str().unwrap().to_string(),
                )
            })
        })
        .collect();
    for (t, d) in &tags {
        assert_eq!(&sha256(&raw_manifest(t)), d, "{t}");
    }
    let o = load_tls(
        &b,
        &prefix,
        Some("site-pw"),
        &["--sign-images", key.to_str().unwrap()],
    );
    assert_ok(&o);
    let again: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(again["signed"]["pushed"], 0, "{}", again["signed"]);
    for (t, d) in &tags {
        assert_eq!(&sha256(&raw_manifest(t)), d, "{t} changed on a re-run");
    }

    // An image signed by another key only: refused with ours. Then our load appends its own
    // signature to the other key's, and both verify.
    let prefix2 = unique_prefix("cosign-other");
    let o = load_tls(&b, &prefix2, None, &[]);
    assert_ok(&o);
    let plain: Value = serde_json::from_slice(&o.stdout).unwrap();
    let img = &plain["images"][0];
    let target = format!(
        "{}/{prefix2}/{}@{}",
        env().tls,
        img["ref"].as_str().unwrap().split(':').next().unwrap(),
        img["digest"].as_str().unwrap()
    );
    ok(&cosign(
        h,
        Some("other-pw"),
        &[
            "sign",
            "--key",
            other_key.to_str().unwrap(),
            "--tlog-upload=false",
            "--yes",
            &target,
        ],
    ));
    ok(&verify(h, &other_pub, &target));
    let err = cosign_refused(
        &verify(h, &pubkey, &target),
        "an image signed by another key",
    );
    println!("cosign verify --key site.pub {target} (signed by another key): {err}");
    let o = load_tls(
        &b,
        &prefix2,
        Some("site-pw"),
        &["--sign-images", key.to_str().unwrap()],
    );
    assert_ok(&o);
    ok(&verify(h, &pubkey, &target));
    ok(&verify(h, &other_pub, &target));

    // A tampered signature: the annotation changed, the manifest pushed back. Refused.
    let sig_tag = tags
        .iter()
        .find(|(t, _)| t.ends_with(".sig"))
        .map(|(t, _)| t.clone())
        .unwrap();
    let mut sig: Value = serde_json::from_slice(&raw_manifest(&sig_tag)).unwrap();
    // One base64 character of the signature changed.
    forge_signature(&mut sig);
    let body = serde_json::to_vec(&sig).unwrap();
    let body_file = h.path().join("tampered.json");
    std::fs::write(&body_file, &body).unwrap();
    let (repo, tag) = sig_tag
        .rsplit_once(':')
        .map(|(r, t)| (r.to_string(), t.to_string()))
        .unwrap();
    let repo = repo.split_once('/').unwrap().1;
    let e = env();
    let put = curl(
        &[
            "-X",
            "PUT",
            "--cacert",
            e.ca_file.to_str().unwrap(),
            "-u",
            &format!("{}:{}", e.username, e.password),
            "-H",
            "Content-Type: application/vnd.oci.image.manifest.v1+json",
            "--data-binary",
            &format!("@{}", body_file.display()),
        ],
        &format!("https://{}/v2/{repo}/manifests/{tag}", e.tls),
    );
    assert_eq!(put.status, 201, "{}", String::from_utf8_lossy(&put.body));
    let signed_digest = format!(
        "sha256:{}",
        tag.trim_start_matches("sha256-").trim_end_matches(".sig")
    );
    let image = format!("{}/{repo}@{signed_digest}", e.tls);
    let err = cosign_refused(&verify(h, &pubkey, &image), "a tampered signature");
    println!("cosign verify {image} (tampered signature): {err}");
}

/// The tags of each of the bundle's repositories under `prefix` of the plain registry.
fn tag_lists(prefix: &str) -> Vec<(String, Value)> {
    repos_under(prefix)
        .into_iter()
        .map(|r| {
            let url = format!("http://{}/v2/{r}/tags/list", env().plain);
            let mut tags = curl(&[], &url).json()["tags"].clone();
            if let Some(a) = tags.as_array_mut() {
                a.sort_by_key(|t| t.as_str().unwrap_or_default().to_string());
            }
            (r, tags)
        })
        .collect()
}

#[test]
fn a_wrong_password_or_a_file_that_is_no_cosign_key_pushes_nothing() {
    let b = Built::new();
    let h = &b.home;
    let (key, pubkey) = cosign_key_pair(h, "site", "site-pw");
    let prefix = unique_prefix("cosign-bad");
    let registry = format!("{}/{prefix}", env().plain);
    let load = |password: &str, key: &Path| {
        h.load_cmd(&b.bundle, &registry, &["--no-install", "--plain-http"])
            .args(["--sign-images", key.to_str().unwrap()])
            .env("COSIGN_PASSWORD", password)
            .output()
            .unwrap()
    };
    // Into an empty prefix: nothing at all is pushed.
    let o = load("wrong", &key);
    assert_fails(
        &o,
        1,
        &[
            "wrong password for the cosign key",
            "site.key",
            "nothing was pushed",
        ],
    );
    assert!(
        repos_under(&prefix).is_empty(),
        "{:?}",
        repos_under(&prefix)
    );
    let minisign_key = h.config().join("koord-bundle.key");
    let binary = h.path().join("binary.key");
    std::fs::write(&binary, [0u8, 159, 146, 150, 1, 2, 3]).unwrap();
    for (file, what) in [
        (&minisign_key, "a minisign secret key"),
        (&pubkey, "a public key"),
        (&binary, "not text"),
        (&b.bundle, "larger than"),
    ] {
        let o = load("site-pw", file);
        assert_fails(
            &o,
            1,
            &["is not a cosign private key", what, "nothing was pushed"],
        );
    }
    assert!(repos_under(&prefix).is_empty());
    // A policy folder that is not there: said before anything is sent.
    let o = h
        .load_cmd(&b.bundle, &registry, &["--no-install", "--plain-http"])
        .args(["--sign-images", key.to_str().unwrap()])
        .args(["--policy-dir", "no-such-folder"])
        .env("COSIGN_PASSWORD", "site-pw")
        .output()
        .unwrap();
    assert_fails(
        &o,
        1,
        &["--policy-dir no-such-folder: no such folder", "nothing was"],
    );
    assert!(repos_under(&prefix).is_empty());
    // Into a prefix that holds the images (unsigned): its tags stay as they are.
    let o = h
        .load_cmd(&b.bundle, &registry, &["--no-install", "--plain-http"])
        .output()
        .unwrap();
    assert_ok(&o);
    let before = tag_lists(&prefix);
    assert_eq!(before.len(), 6);
    assert_fails(&load("wrong", &key), 1, &["wrong password"]);
    assert_fails(
        &load("site-pw", &minisign_key),
        1,
        &["not a cosign private key"],
    );
    assert_eq!(tag_lists(&prefix), before);
    // The right password signs: the .sig tags appear, and the policies for the key are
    // written into the current directory (no --policy-dir), named in the output.
    let o = load("site-pw", &key);
    assert_ok(&o);
    let said = String::from_utf8_lossy(&o.stdout);
    for f in [
        "koordinator-signed-kyverno.yaml",
        "koordinator-signed-policy-controller.yaml",
    ] {
        assert!(h.path().join(f).is_file(), "{f} not written");
        assert!(said.contains(f), "{f} not named:\n{said}");
    }
    let after = tag_lists(&prefix);
    assert!(
        after.iter().any(|(_, t)| t.to_string().contains(".sig")),
        "{after:?}"
    );
}

/// A tag immutability rule on `*.sig` (Harbor's 412 PRECONDITION, played by the fault proxy in
/// front of the plain registry): the load stops after the push and before helm, saying the
/// images are in the registry unsigned; nothing is installed in the real cluster.
#[test]
fn a_registry_that_refuses_the_signature_tag_stops_the_load_before_helm() {
    let b = Built::new();
    let h = &b.home;
    let (key, _) = cosign_key_pair(h, "site", "site-pw");
    let kube = crate::cluster::lease();
    kube.seed_nodes("kubeadm");
    let proxy = fault_proxy::start(&env().plain, Mode::RefuseTagsEnding(".sig"));
    let prefix = unique_prefix("cosign-refused");
    let registry = format!("{}/{prefix}", proxy.addr);
    let o = h
        .load_cmd(&b.bundle, &registry, &["--plain-http"])
        .args([
            "--kubeconfig",
            kube.kubeconfig.to_str().unwrap(),
            "--helm",
            crate::cluster::helm_of(3).to_str().unwrap(),
            "--sign-images",
            key.to_str().unwrap(),
        ])
        .env("COSIGN_PASSWORD", "site-pw")
        .output()
        .unwrap();
    let err = assert_fails(
        &o,
        1,
        &[
            "the images are in the registry, UNSIGNED",
            "nothing was installed",
            ".sig",
            "immutable",
        ],
    );
    println!("{err}");
    assert!(
        proxy
            .counts
            .refused
            .load(std::sync::atomic::Ordering::SeqCst)
            > 0
    );
    assert!(
        kube.releases("default").is_empty(),
        "{:?}",
        kube.releases("default")
    );
    assert!(kube.names("CustomResourceDefinition", None).is_empty());
    // The images were pushed (under the proxy's upstream), no signature tag was.
    let lists = tag_lists(&prefix);
    assert_eq!(lists.len(), 6, "{lists:?}");
    assert!(
        lists.iter().all(|(_, t)| !t.to_string().contains(".sig")),
        "{lists:?}"
    );
}
