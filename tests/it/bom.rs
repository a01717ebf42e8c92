//! Issue 19: the bill of materials every bundle carries (`bom.cdx.json`, CycloneDX 1.6),
//! validated by the reference validator (`cyclonedx-python-lib`'s strict JSON schema
//! validator, installed by scripts/install-deps.sh), checked against the bundle's own files
//! with sha256sum and tar, deterministic, and derived for a bundle made without one.

use crate::common::{assert_ok, env, extract, pushed_digest, tool, validate, Home};
use serde_json::Value;
use std::path::Path;

/// The bytes of `name` in the tar at `path` (read with the tar crate, as a peer).
fn tar_file(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut ar = tar::Archive::new(std::fs::File::open(path).unwrap());
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        if e.path().unwrap().to_string_lossy() == name {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut v).unwrap();
            return Some(v);
        }
    }
    None
}

fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(b))
}

fn props(c: &Value) -> Vec<(String, String)> {
    c["properties"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["value"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn prop<'a>(p: &'a [(String, String)], name: &str) -> Option<&'a str> {
    p.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

#[test]
fn the_bom_of_a_1_8_0_bundle_passes_the_cyclonedx_validator() {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.8.0", &[]);
    let x = extract(&h, &bundle);
    // Listed in SHA256SUMS, so covered by the signature: sha256sum and minisign check it.
    let sums = std::fs::read_to_string(x.join("SHA256SUMS")).unwrap();
    assert!(
        sums.lines().any(|l| l.ends_with("  bom.cdx.json")),
        "{sums}"
    );
    assert_ok(&tool("sha256sum", &["--quiet", "-c", "SHA256SUMS"], &x));
    assert_ok(&tool(
        "minisign",
        &["-Vm", "SHA256SUMS", "-p", h.pubkey().to_str().unwrap()],
        &x,
    ));
    let bom_path = x.join("bom.cdx.json");
    let out = validate(&bom_path).unwrap_or_else(|e| panic!("the BOM does not validate:\n{e}"));
    eprintln!("{out}");
    // inspect --sbom writes the same bytes, to a file or to stdout.
    let written = h.path().join("out.cdx.json");
    assert_ok(&h.run(&[
        "inspect",
        bundle.to_str().unwrap(),
        "--sbom",
        written.to_str().unwrap(),
    ]));
    let bom_bytes = std::fs::read(&bom_path).unwrap();
    assert_eq!(std::fs::read(&written).unwrap(), bom_bytes);
    let o = h.run(&["inspect", bundle.to_str().unwrap(), "--sbom"]);
    assert_ok(&o);
    assert_eq!(o.stdout, bom_bytes, "stdout holds the BOM alone");

    // What it says, against the bundle's own files.
    let bom: Value = serde_json::from_slice(&bom_bytes).unwrap();
    let manifest_bytes = std::fs::read(x.join("koord-bundle.json")).unwrap();
    let m: Value = serde_json::from_slice(&manifest_bytes).unwrap();
    assert_eq!(bom["specVersion"], "1.6");
    assert_eq!(bom["metadata"]["timestamp"], m["created"]);
    let serial = bom["serialNumber"].as_str().unwrap();
    let hex = sha256_hex(&manifest_bytes);
    assert_eq!(
        &serial[9..17],
        &hex[..8],
        "the serial number is made of koord-bundle.json's sha256"
    );
    assert_eq!(&serial[23..24], "8", "a version-8 UUID: {serial}");
    let comps = bom["components"].as_array().unwrap();
    let chart = &comps[0];
    assert_eq!(
        (chart["name"].as_str(), chart["version"].as_str()),
        (Some("koordinator"), Some("1.8.0"))
    );
    let tgz = std::fs::read(x.join("charts/koordinator-1.8.0.tgz")).unwrap();
    assert_eq!(chart["hashes"][0]["content"], sha256_hex(&tgz));
    assert_eq!(
        prop(&props(chart), "koord-bundle:chart:appVersion"),
        Some("1.8.0")
    );
    assert_eq!(
        chart["externalReferences"][0]["url"],
        format!("{}koordinator-1.8.0.tgz", env().helm_repo)
    );
    let images: Vec<&Value> = comps.iter().filter(|c| c["type"] == "container").collect();
    assert_eq!(images.len(), 5);
    for img in images {
        let repo = img["name"].as_str().unwrap();
        let tag = img["version"].as_str().unwrap();
        let digest = pushed_digest(repo, tag);
        assert_eq!(
            img["hashes"][0]["content"],
            digest.trim_start_matches("sha256:")
        );
        let purl = img["purl"].as_str().unwrap();
        let name = repo.rsplit('/').next().unwrap();
        assert!(
            purl.starts_with(&format!("pkg:oci/{name}@sha256%3A{}", &digest[7..]))
                || purl.starts_with(&format!("pkg:oci/{name}@{digest}")),
            "{purl}"
        );
        assert!(purl.contains(&format!("tag={tag}")), "{purl}");
        assert!(
            purl.contains(&format!("repository_url={}%2F", env().plain))
                || purl.contains(&format!("repository_url={}/", env().plain)),
            "{purl}"
        );
        assert_eq!(
            prop(&props(img), "koord-bundle:image:source"),
            Some(env().plain.as_str())
        );
        // Nothing of a site: how load installs it is not known at build time (issue 42:
        // `installedAs` was a prediction, wrong under --no-pin); load --json says it.
        assert_eq!(prop(&props(img), "koord-bundle:image:installedAs"), None);
        // Each platform manifest, as the registry's images.json (written by the test
        // environment's image generator) has it.
        let pushed = env()
            .images
            .iter()
            .find(|i| i["repository"] == repo && i["tag"] == tag)
            .unwrap();
        let mut want: Vec<(String, String)> = pushed["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["platform"]
                        .as_str()
                        .unwrap_or("unknown/unknown")
                        .to_string(),
                    m["digest"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let mut got: Vec<(String, String)> = img["components"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    prop(&props(c), "koord-bundle:image:platform")
                        .unwrap_or("unknown/unknown")
                        .to_string(),
                    format!("sha256:{}", c["hashes"][0]["content"].as_str().unwrap()),
                )
            })
            .collect();
        want.sort();
        got.sort();
        assert_eq!(got, want, "{repo}:{tag}");
    }
    let crds: Vec<&Value> = comps.iter().filter(|c| c["type"] == "data").collect();
    assert_eq!(crds.len(), 13);
    for c in crds {
        let p = props(c);
        let file = prop(&p, "koord-bundle:crd:file").unwrap();
        let bytes = std::fs::read(x.join(file)).unwrap();
        assert_eq!(c["hashes"][0]["content"], sha256_hex(&bytes), "{file}");
        let y: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&bytes).unwrap();
        assert_eq!(c["group"].as_str(), y["spec"]["group"].as_str());
        assert_eq!(
            prop(&p, "koord-bundle:crd:kind"),
            y["spec"]["names"]["kind"].as_str()
        );
        let versions = y["spec"]["versions"].as_sequence().unwrap();
        let served: Vec<&str> = versions
            .iter()
            .filter(|v| v["served"].as_bool() == Some(true))
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        let stored: Vec<&str> = versions
            .iter()
            .filter(|v| v["storage"].as_bool() == Some(true))
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            prop(&p, "koord-bundle:crd:servedVersions"),
            Some(served.join(",").as_str()),
            "{file}"
        );
        assert_eq!(
            prop(&p, "koord-bundle:crd:storedVersion"),
            Some(stored.join(",").as_str()),
            "{file}"
        );
    }

    // The validator is not a formality: a BOM with a field 1.6 does not have is refused.
    let mut bad: Value = bom.clone();
    bad["components"][1]["imageDigest"] = Value::from("x");
    let bad_path = h.path().join("bad.cdx.json");
    std::fs::write(&bad_path, serde_json::to_vec(&bad).unwrap()).unwrap();
    assert!(
        validate(&bad_path).is_err(),
        "the validator accepts anything"
    );
}

#[test]
fn the_same_inputs_give_the_same_bom_bytes() {
    let h = Home::with_key();
    let build = |out: &Path, epoch: &str, extra: &[&str]| {
        let o = h
            .build("1.8.0")
            .out(out)
            .args(extra)
            .cmd()
            .env("SOURCE_DATE_EPOCH", epoch)
            .output()
            .unwrap();
        assert_ok(&o);
        tar_file(out, "bom.cdx.json").expect("bom.cdx.json in the bundle")
    };
    let a = build(&h.path().join("a.tar"), "1700000000", &[]);
    // Another build: from the cache this time, and without it.
    let b = build(&h.path().join("b.tar"), "1700000000", &[]);
    let c = build(&h.path().join("c.tar"), "1700000000", &["--no-cache"]);
    assert_eq!(a, b);
    assert_eq!(a, c);
    let v: Value = serde_json::from_slice(&a).unwrap();
    assert_eq!(v["metadata"]["timestamp"], "2023-11-14T22:13:20Z");
    // Another creation time is another bundle: another serial number.
    let d = build(&h.path().join("d.tar"), "1700000001", &[]);
    let w: Value = serde_json::from_slice(&d).unwrap();
    assert_ne!(v["serialNumber"], w["serialNumber"]);
}

/// Rewrite an unsigned bundle as koord-bundle made them before they carried a BOM: without
/// `bom.cdx.json`, and its manifest without the fields recorded for it (each image's platform
/// manifests, each CRD's versions and sha256, the blob sizes); `SHA256SUMS` to match.
fn without_bom(src: &Path, dst: &Path) {
    let mut entries: Vec<(tar::Header, Vec<u8>)> = Vec::new();
    let mut ar = tar::Archive::new(std::fs::File::open(src).unwrap());
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut data).unwrap();
        entries.push((e.header().clone(), data));
    }
    let name_of = |h: &tar::Header| h.path().unwrap().to_string_lossy().to_string();
    let (mi, _) = entries
        .iter()
        .enumerate()
        .find(|(_, (h, _))| name_of(h) == "koord-bundle.json")
        .unwrap();
    let mut m: Value = serde_json::from_slice(&entries[mi].1).unwrap();
    for i in m["images"].as_array_mut().unwrap() {
        i.as_object_mut()
            .unwrap()
            .remove("manifests")
            .expect("images[].manifests");
    }
    for c in m["crds"].as_array_mut().unwrap() {
        c.as_object_mut()
            .unwrap()
            .remove("versions")
            .expect("crds[].versions");
        c.as_object_mut().unwrap().remove("sha256");
    }
    m.as_object_mut()
        .unwrap()
        .remove("blobSizes")
        .expect("blobSizes");
    let old_hex = sha256_hex(&entries[mi].1);
    entries[mi].1 = serde_json::to_vec_pretty(&m).unwrap();
    let new_hex = sha256_hex(&entries[mi].1);
    let mut b = tar::Builder::new(std::fs::File::create(dst).unwrap());
    for (mut hdr, mut data) in entries {
        let name = name_of(&hdr);
        if name == "bom.cdx.json" {
            continue;
        }
        assert_ne!(name, "SHA256SUMS.minisig", "build it --unsigned");
        if name == "SHA256SUMS" {
            let text = String::from_utf8(data).unwrap();
            data = text
                .lines()
                .filter(|l| !l.ends_with("  bom.cdx.json"))
                .map(|l| format!("{}\n", l.replace(&old_hex, &new_hex)))
                .collect::<String>()
                .into_bytes();
        }
        hdr.set_size(data.len() as u64);
        hdr.set_cksum();
        b.append(&hdr, data.as_slice()).unwrap();
    }
    b.finish().unwrap();
}

#[test]
fn inspect_sbom_derives_one_for_a_bundle_made_without() {
    let h = Home::new();
    let (bundle, _) = h.build_plain("1.8.0", &["--unsigned"]);
    let old = h.path().join("old.tar");
    without_bom(&bundle, &old);
    assert!(tar_file(&old, "bom.cdx.json").is_none());
    // Still a whole bundle: verify accepts it.
    assert_ok(&h.run(&["verify", old.to_str().unwrap(), "--insecure-skip-signature"]));
    let derived = h.path().join("derived.cdx.json");
    let o = h.run(&[
        "inspect",
        old.to_str().unwrap(),
        "--sbom",
        derived.to_str().unwrap(),
    ]);
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("carries no bill of materials") && err.contains("deriving"),
        "{err}"
    );
    validate(&derived).unwrap_or_else(|e| panic!("the derived BOM does not validate:\n{e}"));
    let d: Value = serde_json::from_slice(&std::fs::read(&derived).unwrap()).unwrap();
    let original: Value =
        serde_json::from_slice(&tar_file(&bundle, "bom.cdx.json").unwrap()).unwrap();
    assert!(
        props(&d["metadata"])
            .iter()
            .any(|(n, _)| n == "koord-bundle:derived"),
        "marked as derived"
    );
    assert_eq!(d["metadata"]["lifecycles"][0]["phase"], "post-build");
    // The same components as the build wrote: each image's platform manifests read from the
    // index manifests among the blobs, each CRD's versions from its file.
    assert_eq!(d["components"], original["components"]);
    // Its serial number is that of this bundle's manifest, not the original's.
    assert_ne!(d["serialNumber"], original["serialNumber"]);
    // The bundle itself is read in place, not changed.
    assert!(tar_file(&old, "bom.cdx.json").is_none());
}

/// Issue 32 item 4: `inspect --sbom FILE` also printed the whole inspect table. A file asked
/// for is the output: one line saying where it went, nothing else on stdout (with
/// `--manifest FILE` too: a line each); `--json` still prints its document, and `--sbom` alone
/// the BOM.
#[test]
fn inspect_sbom_file_says_where_and_nothing_else() {
    let h = Home::new();
    let (bundle, _) = h.build_plain("1.8.0", &["--unsigned"]);
    let b = bundle.to_str().unwrap();
    let o = h.run(&["inspect", b, "--sbom", "bom.cdx.json"]);
    assert_ok(&o);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "bill of materials written to bom.cdx.json\n"
    );
    assert!(h.path().join("bom.cdx.json").is_file());
    let o = h.run(&["inspect", b, "--sbom", "b2.json", "--manifest", "m.json"]);
    assert_ok(&o);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "bill of materials written to b2.json\nmanifest written to m.json (for koord-bundle build --since m.json)\n"
    );
    let o = h.run(&["inspect", b, "--sbom", "b3.json", "--json"]);
    assert_ok(&o);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["chart"]["version"], "1.8.0");
    assert_eq!(
        std::fs::read(h.path().join("b3.json")).unwrap(),
        std::fs::read(h.path().join("bom.cdx.json")).unwrap()
    );
}
