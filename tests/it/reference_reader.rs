//! Issue 45: the format checkable by a second implementation. The reference reader
//! (`bundle-spec/reference/kbread.py`, Python standard library only, written from
//! bundle-spec/README.md) accepts a bundle the binary builds, with its signature checked, and
//! refuses what the binary refuses: a blob with one byte changed, an index over a reader limit
//! (the bundle re-signed, so only the limit refuses it).

use crate::common::{assert_ok, env, flip_byte, largest_blob, output_within, sha256, tool, Home};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// `python3 bundle-spec/reference/kbread.py ARGS`, within a minute.
fn kbread(args: &[&str]) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bundle-spec/reference/kbread.py");
    let mut c = Command::new("python3");
    c.arg(script).args(args);
    output_within(c, Duration::from_secs(60), "kbread.py ends")
}

/// The reader's exit code and its stdout (its report), the report in the failure message.
fn outcome(o: &Output) -> (Option<i32>, String) {
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    eprintln!("kbread.py:\n{out}{}", String::from_utf8_lossy(&o.stderr));
    (o.status.code(), out)
}

/// minisign's key ID (16 upper-case hex digits) of the public key file `pub`.
fn key_id(pubkey: &Path) -> String {
    use base64::Engine as _;
    let text = std::fs::read_to_string(pubkey).unwrap();
    let line = text.lines().nth(1).unwrap();
    let raw = base64::engine::general_purpose::STANDARD
        .decode(line)
        .unwrap();
    let n = u64::from_le_bytes(raw[2..10].try_into().unwrap());
    format!("{n:016X}")
}

/// The bytes of every entry of the tar at `path`, with its header, in order.
fn entries(path: &Path) -> Vec<(tar::Header, Vec<u8>)> {
    let mut ar = tar::Archive::new(std::fs::File::open(path).unwrap());
    ar.entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut v).unwrap();
            (e.header().clone(), v)
        })
        .collect()
}

fn name(h: &tar::Header) -> String {
    h.path().unwrap().to_string_lossy().to_string()
}

/// `bundle` with one more image in its layout: `koordinator-sh/wide:v1`, an image index of
/// `children` entries (all the same platform manifest of the bundle), its blob added where the
/// format puts it, koord-bundle.json and SHA256SUMS updated and SHA256SUMS signed again with the
/// home's key by minisign. Written to `out`.
fn with_wide_index(h: &Home, bundle: &Path, children: usize, out: &Path) {
    let mut all = entries(bundle);
    let find = |all: &[(tar::Header, Vec<u8>)], n: &str| {
        all.iter().position(|(h, _)| name(h) == n).unwrap()
    };
    let mi = find(&all, "koord-bundle.json");
    let mut manifest: Value = serde_json::from_slice(&all[mi].1).unwrap();
    let child = manifest["images"][0]["manifests"][0].clone();
    let child = json!({"mediaType": child["mediaType"], "digest": child["digest"],
        "size": child["size"], "platform": {"os": "linux", "architecture": "amd64"}});
    let wide = serde_json::to_vec(&json!({"schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": vec![child; children]}))
    .unwrap();
    let digest = sha256(&wide);
    let hex = digest.trim_start_matches("sha256:").to_string();
    // The layout's index names it.
    let ii = find(&all, "index.json");
    let mut index: Value = serde_json::from_slice(&all[ii].1).unwrap();
    index["manifests"].as_array_mut().unwrap().push(json!({
        "mediaType": "application/vnd.oci.image.index.v1+json", "digest": digest,
        "size": wide.len(),
        "annotations": {"org.opencontainers.image.ref.name": "koordinator-sh/wide:v1"}}));
    all[ii].1 = serde_json::to_vec(&index).unwrap();
    // The bundle manifest counts it.
    let count = {
        let list = manifest["blobList"].as_array_mut().unwrap();
        list.push(json!(digest));
        list.sort_by(|a, b| a.as_str().cmp(&b.as_str()));
        list.len()
    };
    manifest["blobs"]["count"] = json!(count);
    let bytes = manifest["blobs"]["bytes"].as_u64().unwrap() + wide.len() as u64;
    manifest["blobs"]["bytes"] = json!(bytes);
    manifest["blobSizes"][&digest] = json!(wide.len());
    all[mi].1 = serde_json::to_vec(&manifest).unwrap();
    // The blob, in digest order among the blobs.
    let blob_name = format!("blobs/sha256/{hex}");
    let at = all
        .iter()
        .position(|(h, _)| {
            let n = name(h);
            n.starts_with("blobs/sha256/") && n.len() == blob_name.len() && n > blob_name
        })
        .unwrap_or(all.len());
    let template = all
        .iter()
        .find(|(h, _)| name(h).starts_with("blobs/sha256/") && h.entry_type().is_file())
        .unwrap()
        .0
        .clone();
    all.insert(at, (template, wide));
    all[at].0.set_path(&blob_name).unwrap();
    // SHA256SUMS again, then its signature.
    let mut sums: Vec<(String, String)> = all
        .iter()
        .filter(|(h, _)| h.entry_type().is_file())
        .map(|(h, b)| (name(h), sha256(b)))
        .filter(|(n, _)| n != "SHA256SUMS" && n != "SHA256SUMS.minisig")
        .collect();
    sums.sort();
    let text: String = sums
        .iter()
        .map(|(n, d)| format!("{}  {n}\n", d.trim_start_matches("sha256:")))
        .collect();
    all[0].1 = text.into_bytes();
    let dir = h.path().join("resign");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("SHA256SUMS"), &all[0].1).unwrap();
    let key = h.config().join("koord-bundle.key");
    assert_ok(&tool(
        "minisign",
        &[
            "-S",
            "-s",
            key.to_str().unwrap(),
            "-m",
            "SHA256SUMS",
            "-t",
            "re-signed by the test",
        ],
        &dir,
    ));
    all[1].1 = std::fs::read(dir.join("SHA256SUMS.minisig")).unwrap();
    let mut b = tar::Builder::new(std::fs::File::create(out).unwrap());
    for (mut header, data) in all {
        header.set_size(data.len() as u64);
        header.set_cksum();
        b.append(&header, data.as_slice()).unwrap();
    }
    b.finish().unwrap();
}

/// A signed 1.8.0 bundle in a home with its key.
fn built() -> (Home, PathBuf) {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.8.0", &[]);
    (h, bundle)
}

#[test]
fn the_reference_reader_accepts_a_built_bundle_and_checks_its_signature() {
    let (h, bundle) = built();
    let pubkey = h.pubkey();
    let (code, out) = outcome(&kbread(&[
        bundle.to_str().unwrap(),
        "--key",
        pubkey.to_str().unwrap(),
    ]));
    assert_eq!(code, Some(0));
    assert!(
        out.contains(&format!("ok    signature: key {}", key_id(&pubkey))),
        "{out}"
    );
    assert!(
        out.contains("koord-bundle koordinator 1.8.0 created"),
        "{out}"
    );
    assert!(out.ends_with("verdict: accepted\n"), "{out}");
    // Another key: refused, naming both key IDs.
    let other = Home::with_key();
    let (code, out) = outcome(&kbread(&[
        bundle.to_str().unwrap(),
        "--key",
        other.pubkey().to_str().unwrap(),
    ]));
    assert_eq!(code, Some(1));
    assert!(
        out.contains(&key_id(&other.pubkey())) && out.contains(&key_id(&pubkey)),
        "{out}"
    );
    // No key: the signature is said to be unchecked, the rest is checked.
    let (code, out) = outcome(&kbread(&[bundle.to_str().unwrap()]));
    assert_eq!(code, Some(0));
    assert!(out.contains("signature: not checked (no --key)"), "{out}");
    // An unsigned bundle and a key: refused, before anything past SHA256SUMS is read.
    let unsigned = h.path().join("unsigned.tar");
    assert_ok(&h.build("1.8.0").out(&unsigned).arg("--unsigned").run());
    let (code, out) = outcome(&kbread(&[
        unsigned.to_str().unwrap(),
        "--key",
        pubkey.to_str().unwrap(),
    ]));
    assert_eq!(code, Some(1));
    assert!(out.contains("FAIL  the bundle is not signed"), "{out}");
    // Usage.
    assert_eq!(kbread(&[]).status.code(), Some(2));
}

#[test]
fn the_reference_reader_refuses_a_blob_with_one_byte_changed_naming_it() {
    let (h, bundle) = built();
    let (blob, at) = largest_blob(&bundle);
    flip_byte(&bundle, at + 100);
    let pubkey = h.pubkey();
    let (code, out) = outcome(&kbread(&[
        bundle.to_str().unwrap(),
        "--key",
        pubkey.to_str().unwrap(),
    ]));
    assert_eq!(code, Some(1));
    assert!(
        out.contains(&format!("FAIL  entry '{blob}' has sha256")),
        "{out}"
    );
    assert!(out.contains("verdict: refused"), "{out}");
    // The binary agrees.
    let o = h.run(&[
        "verify",
        bundle.to_str().unwrap(),
        "--key",
        pubkey.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn the_reference_reader_refuses_an_index_over_the_children_limit_in_a_signed_bundle() {
    let (h, bundle) = built();
    let pubkey = h.pubkey();
    // At the limit: accepted by both (the bundle rewritten and re-signed is a valid bundle).
    let ok = h.path().join("wide-256.tar");
    with_wide_index(&h, &bundle, 256, &ok);
    let (code, out) = outcome(&kbread(&[
        ok.to_str().unwrap(),
        "--key",
        pubkey.to_str().unwrap(),
    ]));
    assert_eq!(code, Some(0), "{out}");
    let o = h.run(&[
        "verify",
        ok.to_str().unwrap(),
        "--key",
        pubkey.to_str().unwrap(),
    ]);
    assert_ok(&o);
    // One more child: refused by both, naming the limit.
    let wide = h.path().join("wide-257.tar");
    with_wide_index(&h, &bundle, 257, &wide);
    let (code, out) = outcome(&kbread(&[
        wide.to_str().unwrap(),
        "--key",
        pubkey.to_str().unwrap(),
    ]));
    assert_eq!(code, Some(1));
    assert!(out.contains("ok    signature: key"), "{out}");
    assert!(
        out.contains("koordinator-sh/wide:v1: index sha256:")
            && out.contains("lists 257 manifests, over the limit of 256 children"),
        "{out}"
    );
    let o = h.run(&[
        "verify",
        wide.to_str().unwrap(),
        "--key",
        pubkey.to_str().unwrap(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("256"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Every file under `dir` (relative paths, sorted), `inputs/` and the README left out.
fn files_under(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().to_string();
            if rel == "inputs" || rel == "README.md" {
                continue;
            }
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.push(rel);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn the_test_vectors_are_rebuilt_byte_for_byte_and_read_by_the_reference_reader() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let committed = root.join("bundle-spec/vectors");
    let h = Home::new();
    let out = h.path().join("vectors");
    let mut c = Command::new("python3");
    c.arg(root.join("scripts/make-vectors.py"))
        .arg(&out)
        .arg("--koord-bundle")
        .arg(env!("CARGO_BIN_EXE_koord-bundle"))
        .arg("--helm")
        .arg(&env().helm3);
    assert_ok(&output_within(
        c,
        Duration::from_secs(300),
        "make-vectors.py ends",
    ));
    // The same files, byte for byte.
    let files = files_under(&committed);
    assert_eq!(files_under(&out), files);
    for f in &files {
        assert!(
            std::fs::read(out.join(f)).unwrap() == std::fs::read(committed.join(f)).unwrap(),
            "{f} differs from bundle-spec/vectors/{f}: if the change is meant (format, koord-bundle's \
             version, helm), run scripts/make-vectors.py bundle-spec/vectors --koord-bundle BIN --helm HELM \
             and review the difference"
        );
    }
    // The reference reader finds what expected.json says.
    let expected = committed.join("expected.json");
    let (code, out_text) = outcome(&kbread(&["--expect", expected.to_str().unwrap()]));
    assert_eq!(code, Some(0));
    assert!(
        out_text.contains("ok    koordinator-1.0.0.tar: manifest digest, key ID"),
        "{out_text}"
    );
    // The damaged part in place of its original: the binary reads the set, rebuilding the block
    // expected.json names, and `repair` writes the part back as expected.json says.
    let exp: Value = serde_json::from_slice(&std::fs::read(&expected).unwrap()).unwrap();
    let set = h.path().join("set");
    std::fs::create_dir(&set).unwrap();
    for f in files.iter().filter(|f| f.starts_with("split/")) {
        std::fs::copy(committed.join(f), set.join(f.trim_start_matches("split/"))).unwrap();
    }
    let part = exp["damaged"]["repairRestores"]["file"].as_str().unwrap();
    std::fs::copy(
        committed.join(exp["damaged"]["file"].as_str().unwrap()),
        set.join(part),
    )
    .unwrap();
    let key = committed.join(exp["bundle"]["key"].as_str().unwrap());
    let first = set.join("koordinator-1.0.0.tar.part000");
    let args = [first.to_str().unwrap(), "--key", key.to_str().unwrap()];
    let o = h.run(&[&["verify"][..], &args[..]].concat());
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("{part}: 1 block damaged, rebuilt from parity")),
        "{err}"
    );
    let o = h.run(&[&["repair"][..], &args[..]].concat());
    assert_ok(&o);
    let out_text = String::from_utf8_lossy(&o.stdout);
    let block = exp["damaged"]["block"]["index"].as_u64().unwrap();
    assert!(
        out_text.contains(&format!("{part}: 1 of 3 blocks damaged (block {block})")),
        "{out_text}"
    );
    let restored = sha256(&std::fs::read(set.join(part)).unwrap());
    assert_eq!(
        restored.trim_start_matches("sha256:"),
        exp["damaged"]["repairRestores"]["sha256"].as_str().unwrap()
    );
}
