//! The bundle format as `bundle-spec/` states it, held to what the code writes and enforces
//! (issue 45): the JSON Schemas of `koord-bundle.json` and of the split header accept real
//! output (a bundle; an incremental bundle with its programs and a platform filter; every part
//! of a split set with parity, per stripe and spread) and refuse hand-broken documents as the
//! reader does; the reader limits of the spec's §10 are the constants the code enforces, row
//! for constant and constant for row.

use crate::common::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn spec_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("bundle-spec")
}

/// The validator of `bundle-spec/schema/NAME` (draft 2020-12, as its `$schema` says).
fn schema(name: &str) -> jsonschema::Validator {
    let path = spec_dir().join("schema").join(name);
    let s: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(
        s["$schema"], "https://json-schema.org/draft/2020-12/schema",
        "{name}"
    );
    jsonschema::draft202012::new(&s).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every error of `v` on `doc`, each as `<JSON pointer of the instance>: <message>`.
fn errors(v: &jsonschema::Validator, doc: &Value) -> Vec<String> {
    v.iter_errors(doc)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

fn assert_valid(v: &jsonschema::Validator, doc: &Value, what: &str) {
    let errs = errors(v, doc);
    assert!(
        errs.is_empty(),
        "{what} does not match its schema: {errs:#?}\n{doc:#}"
    );
}

/// `doc` fails `v` with an error that names `needle` (the field, as a JSON pointer or a name).
fn assert_invalid(v: &jsonschema::Validator, doc: &Value, needle: &str, what: &str) {
    let errs = errors(v, doc);
    assert!(
        errs.iter().any(|e| e.contains(needle)),
        "{what}: expected an error naming {needle:?}, got {errs:#?}"
    );
}

/// `split BUNDLE --size 256K --parity 1 MORE --output-dir <new folder>`: the parts written.
fn split(h: &Home, bundle: &Path, more: &[&str]) -> Vec<PathBuf> {
    split_set(h, bundle, "256K", 1, more).1
}

#[test]
fn the_manifest_and_split_headers_match_their_schemas() {
    let manifests = schema("koord-bundle.schema.json");
    let headers = schema("split-header.schema.json");
    let h = Home::with_key();
    let (base, _) = h.build_plain("1.6.0", &[]);
    // The members a plain bundle leaves out: `base` and `omittedBlobs` (--since), `tools`
    // (--with-tools), `droppedPlatforms` and an `upstreamDigest` of its own (--platform).
    let (inc, _) = h.build_plain(
        "1.8.0",
        &[
            "--since",
            base.to_str().unwrap(),
            "--with-tools",
            "--platform",
            "linux/amd64",
        ],
    );
    let m_base = bundle_manifest(&base);
    let m_inc = bundle_manifest(&inc);
    assert_valid(&manifests, &m_base, "the 1.6.0 bundle's koord-bundle.json");
    assert_valid(
        &manifests,
        &m_inc,
        "the incremental 1.8.0 bundle's koord-bundle.json",
    );
    for member in [
        "base",
        "omittedBlobs",
        "tools",
        "discovery",
        "blobSizes",
        "blobList",
    ] {
        assert!(m_inc.get(member).is_some(), "no {member} in {m_inc:#}");
    }
    let images = m_inc["images"].as_array().unwrap();
    assert!(
        images
            .iter()
            .any(|i| i.get("droppedPlatforms").is_some() && i["digest"] != i["upstreamDigest"]),
        "the platform filter dropped nothing: {m_inc:#}"
    );
    // Each value the reader reads back: what the schema accepts, koord-bundle parses.
    for m in [&m_base, &m_inc] {
        serde_json::from_value::<koord_bundle::bundle::BundleManifest>(m.clone()).unwrap();
    }

    // Every part of a split set, data and parity, per stripe and spread: one header, valid.
    for (more, code) in [
        (&[][..], "reed-solomon-gf16-leopard"),
        (&["--spread"][..], "reed-solomon-gf16-leopard-set"),
    ] {
        let parts = split(&h, &base, more);
        let first = read_first_part(&parts[0]).json;
        assert_eq!(first["code"], code);
        assert_eq!(first["parityParts"], 1);
        assert_eq!(parts.len(), first["parts"].as_array().unwrap().len());
        assert!(parts.len() > 2, "{first:#}");
        for p in &parts {
            let fp = read_first_part(p);
            assert_eq!(fp.json, first, "{} carries another header", p.display());
            assert_valid(
                &headers,
                &fp.json,
                &format!("the header of {}", p.display()),
            );
        }
        serde_json::from_value::<koord_splitset::format::SetHeader>(first).unwrap();
    }

    // Hand-broken manifests: the schema names the field, and the reader refuses them too.
    let reader_refuses = |doc: &Value, what: &str| {
        let r = serde_json::from_value::<koord_bundle::bundle::BundleManifest>(doc.clone());
        assert!(r.is_err(), "the reader accepts {what}");
    };
    let mut bare = m_base.clone();
    let hex = bare["chart"]["digest"].as_str().unwrap()[7..].to_string();
    bare["chart"]["digest"] = json!(hex);
    assert_invalid(
        &manifests,
        &bare,
        "/chart/digest",
        "a digest without sha256:",
    );
    reader_refuses(&bare, "a digest without sha256:");
    let mut upper = m_base.clone();
    upper["blobList"][0] = json!(upper["blobList"][0].as_str().unwrap().to_uppercase());
    assert_invalid(&manifests, &upper, "/blobList/0", "an upper-case digest");
    reader_refuses(&upper, "an upper-case digest");
    let mut missing = m_base.clone();
    missing.as_object_mut().unwrap().remove("created");
    assert_invalid(&manifests, &missing, "\"created\"", "no created");
    reader_refuses(&missing, "no created");
    let mut text_size = m_base.clone();
    text_size["images"][0]["size"] = json!(text_size["images"][0]["size"].to_string());
    assert_invalid(
        &manifests,
        &text_size,
        "/images/0/size",
        "a size as a string",
    );
    reader_refuses(&text_size, "a size as a string");
    let mut negative = m_base.clone();
    negative["blobs"]["bytes"] = json!(-1);
    assert_invalid(&manifests, &negative, "/blobs/bytes", "a negative size");
    reader_refuses(&negative, "a negative size");
    // A size with a fraction: JSON Schema's `integer` cannot tell `1.0` from `1`; the reader
    // refuses it (spec §3.1).
    let mut float = m_base.clone();
    float["blobs"]["bytes"] = json!(1.0);
    reader_refuses(&float, "a size written as 1.0");
    // A member named twice (spec §3.3).
    let text = serde_json::to_string(&m_base).unwrap();
    let twice = format!("{{\"created\":\"2020-01-01T00:00:00Z\",{}", &text[1..]);
    let r = serde_json::from_str::<koord_bundle::bundle::BundleManifest>(&twice);
    assert!(r.is_err(), "the reader accepts a member named twice");
    let mut version = m_base.clone();
    version["formatVersion"] = json!("koord-bundle/v2");
    assert_invalid(
        &manifests,
        &version,
        "/formatVersion",
        "another format version",
    );
    // Unknown members are ignored (spec §3.3), by the schema and by the reader; an optional
    // member may be null.
    let mut newer = m_base.clone();
    newer["aFieldOfLaterVersions"] = json!({"any": 1});
    newer["chart"]["alsoNew"] = json!(true);
    newer["base"] = Value::Null;
    assert_valid(&manifests, &newer, "a manifest with unknown members");
    serde_json::from_value::<koord_bundle::bundle::BundleManifest>(newer).unwrap();

    // Hand-broken split headers: unknown members are refused at every level (spec §8.1), by
    // the schema and by the reader, `bundle` included.
    let header = read_first_part(&split(&h, &base, &[])[0]).json;
    for (edit, needle) in [
        ("/bundle", "/bundle"),
        ("", "aNewMember"),
        ("/blockTable", "/blockTable"),
    ] {
        let mut broken = header.clone();
        broken
            .pointer_mut(edit)
            .unwrap()
            .as_object_mut()
            .unwrap()
            .insert("aNewMember".into(), json!(1));
        assert_invalid(
            &headers,
            &broken,
            needle,
            &format!("a new member in {edit:?}"),
        );
        let r = serde_json::from_value::<koord_splitset::format::SetHeader>(broken);
        assert!(r.is_err(), "the reader accepts a new member in {edit:?}");
    }
    let mut bare = header.clone();
    bare["bundle"]["sha256"] = json!(bare["bundle"]["sha256"].as_str().unwrap()[7..]);
    assert_invalid(&headers, &bare, "/bundle/sha256", "a bare hex sha256");
    let mut dir = header.clone();
    dir["bundle"]["file"] = json!("../b.tar");
    assert_invalid(
        &headers,
        &dir,
        "/bundle/file",
        "a bundle name with a directory",
    );
    // Version 1 (read only): unknown members refused as well (spec §8.2).
    let v1 = json!({
        "format": "koord-bundle-split/v1",
        "bundle": {"file": "b.tar", "size": 1, "sha256": m_base["chart"]["digest"]},
        "parts": [{"file": "b.tar.part000", "size": 1, "sha256": m_base["chart"]["digest"]}],
    });
    serde_json::from_value::<koord_splitset::format::SplitHeader>(v1.clone()).unwrap();
    for edit in ["", "/bundle", "/parts/0"] {
        let mut broken = v1.clone();
        broken
            .pointer_mut(edit)
            .unwrap()
            .as_object_mut()
            .unwrap()
            .insert("aNewMember".into(), json!(1));
        let r = serde_json::from_value::<koord_splitset::format::SplitHeader>(broken);
        assert!(r.is_err(), "the reader accepts a new member in v1 {edit:?}");
    }
}

/// The limits table of the spec's §10: name → value.
fn spec_limits() -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string(spec_dir().join("README.md")).unwrap();
    let start = text
        .find("\n## 10. Reader limits")
        .expect("bundle-spec/README.md has a section 10, Reader limits");
    let section = &text[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    let mut limits = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let name = cells[1].trim_matches('`').to_string();
        let value: u64 = cells[2]
            .parse()
            .unwrap_or_else(|_| panic!("the value of {name} is not a decimal integer: {line}"));
        assert!(
            limits.insert(name.clone(), value).is_none(),
            "{name} is listed twice"
        );
    }
    assert!(limits.len() > 20, "{limits:?}");
    limits
}

#[test]
fn the_spec_states_the_limits_the_reader_enforces() {
    use koord_bundle::bundle::{plan, reader};
    use koord_bundle::{chart::archive, copy, oci::size, store::registry, yaml};
    use koord_splitset::format;
    // (limit in the spec, file, constant, its value): every bound the reader enforces.
    let code: &[(&str, &str, &str, u64)] = &[
        (
            "max-head-file",
            "src/bundle/reader.rs",
            "MAX_SMALL",
            reader::MAX_SMALL,
        ),
        (
            "max-head-file",
            "src/bundle/plan.rs",
            "MAX_BASE_MANIFEST",
            plan::MAX_BASE_MANIFEST as u64,
        ),
        (
            "max-head-bytes",
            "src/bundle/reader.rs",
            "MAX_HEAD_BYTES",
            reader::MAX_HEAD_BYTES,
        ),
        (
            "max-head-files",
            "src/bundle/reader.rs",
            "MAX_HEAD_FILES",
            reader::MAX_HEAD_FILES as u64,
        ),
        (
            "max-manifest-size",
            "crates/koord-store/src/store/registry/mod.rs",
            "MAX_MANIFEST",
            registry::MAX_MANIFEST as u64,
        ),
        (
            "max-manifests",
            "crates/koord-store/src/copy.rs",
            "MAX_MANIFESTS",
            copy::MAX_MANIFESTS as u64,
        ),
        (
            "max-manifest-bytes",
            "crates/koord-store/src/copy.rs",
            "MAX_MANIFEST_BYTES",
            copy::MAX_MANIFEST_BYTES,
        ),
        (
            "max-index-children",
            "crates/koord-store/src/copy.rs",
            "MAX_CHILDREN",
            copy::MAX_CHILDREN as u64,
        ),
        (
            "max-index-depth",
            "crates/koord-store/src/copy.rs",
            "MAX_DEPTH",
            copy::MAX_DEPTH as u64,
        ),
        (
            "max-blobs",
            "crates/koord-store/src/copy.rs",
            "MAX_BLOBS",
            copy::MAX_BLOBS as u64,
        ),
        (
            "max-size",
            "crates/koord-base/src/oci/size.rs",
            "MAX_SIZE",
            size::MAX_SIZE,
        ),
        (
            "max-chart-bytes",
            "crates/koord-kube/src/chart/archive.rs",
            "MAX_UNCOMPRESSED",
            archive::MAX_UNCOMPRESSED,
        ),
        (
            "max-chart-entries",
            "crates/koord-kube/src/chart/archive.rs",
            "MAX_ENTRIES",
            archive::MAX_ENTRIES as u64,
        ),
        (
            "max-crd-bytes",
            "crates/koord-base/src/yaml.rs",
            "CRD.max_bytes",
            yaml::CRD.max_bytes as u64,
        ),
        (
            "max-crd-depth",
            "crates/koord-base/src/yaml.rs",
            "CRD.max_depth",
            yaml::CRD.max_depth as u64,
        ),
        (
            "max-crd-nodes",
            "crates/koord-base/src/yaml.rs",
            "CRD.max_nodes",
            yaml::CRD.max_nodes as u64,
        ),
        (
            "max-split-magic-line",
            "crates/koord-splitset/src/set/mod.rs",
            "MAX_MAGIC_LINE",
            format::MAX_MAGIC_LINE,
        ),
        (
            "max-split-part-line",
            "crates/koord-splitset/src/set/mod.rs",
            "MAX_PART_LINE",
            format::MAX_PART_LINE,
        ),
        (
            "max-split-length-line",
            "crates/koord-splitset/src/set/mod.rs",
            "MAX_LENGTH_LINE",
            format::MAX_LENGTH_LINE,
        ),
        (
            "max-split-json",
            "crates/koord-splitset/src/set/mod.rs",
            "MAX_JSON",
            format::MAX_JSON,
        ),
        (
            "max-split-signature",
            "crates/koord-splitset/src/set/mod.rs",
            "MAX_SIG",
            format::MAX_SIG as u64,
        ),
        (
            "max-block-table",
            "crates/koord-splitset/src/set/mod.rs",
            "MAX_TABLE",
            format::MAX_TABLE,
        ),
        (
            "max-parts",
            "crates/koord-splitset/src/set/mod.rs",
            "MAX_PARTS",
            format::MAX_PARTS as u64,
        ),
        (
            "max-stripe-bytes",
            "crates/koord-splitset/src/set/mod.rs",
            "STRIPE_BUDGET",
            format::STRIPE_BUDGET,
        ),
        (
            "min-block-size",
            "crates/koord-splitset/src/set/mod.rs",
            "MIN_BLOCK",
            format::MIN_BLOCK,
        ),
        (
            "max-block-size",
            "crates/koord-splitset/src/set/mod.rs",
            "MAX_BLOCK",
            format::MAX_BLOCK,
        ),
        (
            "max-spread-block-size",
            "crates/koord-splitset/src/set/mod.rs",
            "MAX_SPREAD_BLOCK",
            format::MAX_SPREAD_BLOCK,
        ),
        (
            "max-file-name",
            "crates/koord-splitset/src/set/mod.rs",
            "MAX_FILE_NAME",
            format::MAX_FILE_NAME as u64,
        ),
        (
            "max-folder-scan",
            "crates/koord-splitset/src/set/open.rs",
            "MAX_SCAN",
            format::MAX_SCAN as u64,
        ),
        (
            "max-split-v1-line",
            "crates/koord-splitset/src/parts.rs",
            "MAX_LINE",
            format::MAX_LINE,
        ),
        (
            "max-split-v1-json",
            "crates/koord-splitset/src/parts.rs",
            "MAX_HEADER",
            format::MAX_HEADER as u64,
        ),
    ];
    // Bounds of the bundle code that are not limits on what a reader is given: why each is not
    // in the spec.
    let not_limits: &[(&str, &str, &str)] = &[
        (
            "crates/koord-splitset/src/parts.rs",
            "MIN_PART_SIZE",
            "the smallest part `split` writes; a reader checks parts against the header",
        ),
        (
            "src/bundle/reader.rs",
            "MAX_WALK",
            "the truncation pre-check gives up there; it refuses nothing",
        ),
        (
            "crates/koord-splitset/src/atomic.rs",
            "PARTIAL_MAX_AGE",
            "the age of a writer's leftover partial files",
        ),
        (
            "src/bundle/reuse.rs",
            "MAX_INDEX",
            "the local index of built bundles, not part of a bundle",
        ),
        (
            "crates/koord-splitset/src/parity.rs",
            "SLICE_BUDGET",
            "the coder's own memory, whatever the input",
        ),
        (
            "crates/koord-splitset/src/parity.rs",
            "MATRIX_MAX_LOST",
            "which decoder runs, not what is read",
        ),
        (
            "crates/koord-splitset/src/set/spread.rs",
            "WIDE_BUDGET",
            "the spread rebuild's own memory, whatever the input",
        ),
        (
            "crates/koord-splitset/src/set/mod.rs",
            "MAX_LISTED",
            "the words of a damage report",
        ),
        (
            "crates/koord-store/src/copy.rs",
            "MAX_CONFIG_PEEK",
            "a larger config leaves the platform unknown; nothing is refused",
        ),
    ];

    // Spec → code: every row of the table is a constant with its value.
    let spec = spec_limits();
    let mut bad = Vec::new();
    for (name, value) in &spec {
        let consts: Vec<_> = code.iter().filter(|c| c.0 == name).collect();
        if consts.is_empty() {
            bad.push(format!(
                "the spec lists {name} = {value}, the code has no such limit"
            ));
        }
        for (_, file, c, v) in consts {
            if v != value {
                bad.push(format!(
                    "the spec says {name} = {value}, {file} has {c} = {v}"
                ));
            }
        }
    }
    // Code → spec: every limit is a row.
    for (name, file, c, _) in code {
        if !spec.contains_key(*name) {
            bad.push(format!("{file}: {c} is enforced, the spec lists no {name}"));
        }
    }
    // Every bound the bundle code declares (a constant named MAX, MIN or BUDGET) is one of the
    // two lists, so that a new one cannot go unstated.
    let re = regex::Regex::new(
        r"(?m)^\s*(?:pub(?:\([a-z]+\))?\s+)?const\s+([A-Z0-9_]*(?:MAX|MIN|BUDGET)[A-Z0-9_]*)\s*:",
    )
    .unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("crates/koord-store/src/copy.rs")];
    let mut dirs = vec![root.join("src/bundle")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let mut seen = BTreeSet::new();
    for f in &files {
        let rel = f.strip_prefix(root).unwrap().to_string_lossy().to_string();
        for c in re.captures_iter(&std::fs::read_to_string(f).unwrap()) {
            let name = c[1].to_string();
            let known = code.iter().any(|k| k.1 == rel && k.2 == name)
                || not_limits.iter().any(|k| k.0 == rel && k.1 == name);
            if !known {
                bad.push(format!(
                    "{rel}: {name} is neither a limit of the spec (§10) nor listed here as none"
                ));
            }
            seen.insert((rel.clone(), name));
        }
    }
    for (file, c) in code
        .iter()
        .map(|k| (k.1, k.2))
        .chain(not_limits.iter().map(|k| (k.0, k.1)))
        .filter(|(f, _)| f.starts_with("src/bundle/") || *f == "crates/koord-store/src/copy.rs")
    {
        if !seen.contains(&(file.to_string(), c.to_string())) {
            bad.push(format!("{file} declares no constant {c} any more"));
        }
    }
    assert!(
        bad.is_empty(),
        "the spec and the code disagree:\n{}",
        bad.join("\n")
    );
}
