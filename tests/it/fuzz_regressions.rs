//! Regression tests from fuzzing (fuzz/, scripts/fuzz.sh): inputs that crashed a fuzz target
//! (kept under fuzz/regressions/) and inputs that pin down an interesting refusal. Each test
//! feeds its input through the same API as the fuzz target and asserts the specific error, not
//! only the absence of a panic. None of them needs the test environment.

use koord_bundle::bundle::checksums::Checksums;
use koord_bundle::bundle::reader::{SignaturePolicy, VerifyError, VerifyReport};
use koord_bundle::bundle::source;
use koord_bundle::chart::{extract_crds, ChartArchive, ChartError, RepoIndex, VersionSpec};
use koord_bundle::oci::Digest;
use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------------------------
// Helpers

/// A saved fuzz input.
fn regression(name: &str) -> Vec<u8> {
    let p: PathBuf = [env!("CARGO_MANIFEST_DIR"), "fuzz", "regressions", name]
        .iter()
        .collect();
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `verify_from` on a plain tar, signature skipped: what the `bundle_reader` target calls.
fn verify(tar: Vec<u8>) -> Result<VerifyReport, VerifyError> {
    // The layout walk is async and the passes over the tar `block_in_place`: a multi-threaded
    // runtime, as the binary's.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .expect("a tokio runtime");
    rt.block_on(source::verify_from(
        Path::new("fuzz.tar"),
        Box::new(Cursor::new(tar)),
        false,
        SignaturePolicy::Skip,
        &|_| {},
    ))
}

/// A tar from (raw name, entry type byte, data): the name goes into the header as is, so
/// unsafe paths get through.
fn tar_of(entries: &[(&[u8], u8, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, data) in entries {
        let mut h = tar::Header::new_ustar();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_entry_type(tar::EntryType::new(*kind));
        h.set_size(data.len() as u64);
        // The header fields the format gives (bundle-spec §1), so that each test reaches what
        // it is about.
        let dir = *kind == b'5' || name.starts_with(b"tools/");
        h.set_mode(if dir { 0o755 } else { 0o644 });
        h.set_uid(0);
        h.set_gid(0);
        h.set_cksum();
        b.append(&h, *data).expect("append to memory");
    }
    b.into_inner().expect("finish tar")
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).expect("gzip to memory");
    gz.finish().expect("gzip to memory")
}

const MANIFEST: &str = r#"{"formatVersion":"koord-bundle/v1","tool":{"name":"koord-bundle","version":"0.1.0"},"created":"2026-01-01T00:00:00Z","chart":{"name":"koordinator","version":"1.8.0","appVersion":"1.8.0","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000","file":"charts/koordinator-1.8.0.tgz","url":null,"indexDigest":null,"digestMismatchAllowed":false,"oci":{"ref":"charts/koordinator:1.8.0","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000","mediaType":"application/vnd.oci.image.manifest.v1+json","size":1}},"images":[],"crds":[],"platformFilter":null,"sources":["ghcr"],"overrides":{"valuesFiles":[],"setKeys":[],"extraImages":[]},"blobs":{"count":0,"bytes":0}}"#;
const LAYOUT: &[u8] = br#"{"imageLayoutVersion":"1.0.0"}"#;
const INDEX: &[u8] =
    br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}"#;

/// The files of a minimal valid bundle (no image), in bundle order.
fn files() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("koord-bundle.json", MANIFEST.as_bytes().to_vec()),
        ("oci-layout", LAYOUT.to_vec()),
        ("index.json", INDEX.to_vec()),
    ]
}

/// `sha256sum` lines for `files`, sorted by path.
fn sums_of(files: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut sums = Checksums::default();
    for (p, d) in files {
        sums.0.insert(p.to_string(), Digest::of(d));
    }
    sums.render().into_bytes()
}

/// A bundle tar: SHA256SUMS (`sums`) then `entries` (all regular files).
fn bundle_with(sums: &[u8], entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut all: Vec<(&[u8], u8, &[u8])> = vec![(b"SHA256SUMS", b'0', sums)];
    for (p, d) in entries {
        all.push((p.as_bytes(), b'0', d));
    }
    tar_of(&all)
}

fn entry_refused(res: Result<VerifyReport, VerifyError>, name: &str, why: &str) {
    match res {
        Err(VerifyError::Entry { entry, reason, .. }) => {
            assert_eq!(entry, name, "{reason}");
            assert!(reason.contains(why), "{entry}: {reason}");
        }
        other => panic!("expected entry {name:?} refused ({why}), got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Bundle reader

#[test]
fn fuzz_minimal_bundle_verifies() {
    // The control for the refusals below: the same bundle, unchanged, is accepted.
    let f = files();
    let report = verify(bundle_with(&sums_of(&f), &f)).expect("a minimal bundle verifies");
    assert_eq!(report.files, 3);
    assert_eq!(report.blobs, 0);
}

#[test]
fn fuzz_checksums_list_a_path_twice() {
    let f = files();
    let mut sums = sums_of(&f);
    let dup = format!("{}  oci-layout\n", Digest::of(LAYOUT).hex());
    sums.extend_from_slice(dup.as_bytes());
    let err = Checksums::parse(&sums).expect_err("a path listed twice");
    assert_eq!(err.line, 4);
    assert!(err.reason.contains("oci-layout listed twice"), "{err}");
    match verify(bundle_with(&sums, &f)) {
        Err(VerifyError::Checksums(e)) => {
            assert_eq!(e.line, 4);
            assert!(e.reason.contains("listed twice"), "{e}");
        }
        other => panic!("expected a checksum-file error, got {other:?}"),
    }
}

#[test]
fn fuzz_checksums_unsafe_path() {
    let line = format!("{}  ../etc/passwd\n", Digest::of(b"").hex());
    let err = Checksums::parse(line.as_bytes()).expect_err("unsafe path");
    assert_eq!(err.line, 1);
    assert!(err.reason.contains("unsafe path"), "{err}");
    let err = Checksums::parse(b"\xff\xfe  a\n").expect_err("not UTF-8");
    assert_eq!((err.line, err.reason.as_str()), (0, "not UTF-8"));
}

#[test]
fn fuzz_entry_appears_twice() {
    let f = files();
    let mut entries = f.clone();
    entries.push(f[1].clone());
    entry_refused(
        verify(bundle_with(&sums_of(&f), &entries)),
        "oci-layout",
        "duplicate entry",
    );
}

#[test]
fn fuzz_second_checksum_file() {
    let f = files();
    let sums = sums_of(&f);
    let mut entries = f.clone();
    entries.push(("SHA256SUMS", sums.clone()));
    entry_refused(
        verify(bundle_with(&sums, &entries)),
        "SHA256SUMS",
        "duplicate entry",
    );
}

#[test]
fn fuzz_unlisted_file() {
    let f = files();
    let mut entries = f.clone();
    entries.push(("extra.txt", b"not listed".to_vec()));
    entry_refused(
        verify(bundle_with(&sums_of(&f), &entries)),
        "extra.txt",
        "not listed in SHA256SUMS",
    );
}

#[test]
fn fuzz_tampered_file() {
    let f = files();
    let sums = sums_of(&f);
    let mut entries = f.clone();
    entries[1].1 = br#"{"imageLayoutVersion":"2.0.0"}"#.to_vec();
    match verify(bundle_with(&sums, &entries)) {
        Err(VerifyError::Mismatch {
            entry,
            expected,
            actual,
            ..
        }) => {
            assert_eq!(entry, "oci-layout");
            assert_eq!(expected, Digest::of(LAYOUT));
            assert_eq!(actual, Digest::of(&entries[1].1));
        }
        other => panic!("expected a checksum mismatch, got {other:?}"),
    }
}

#[test]
fn fuzz_listed_file_missing() {
    let f = files();
    let sums = sums_of(&f);
    let entries = vec![f[0].clone(), f[2].clone()];
    match verify(bundle_with(&sums, &entries)) {
        Err(VerifyError::Missing { missing, .. }) => assert_eq!(missing, ["oci-layout"]),
        other => panic!("expected a missing file, got {other:?}"),
    }
}

#[test]
fn fuzz_links_and_devices_refused() {
    let f = files();
    let sums = sums_of(&f);
    for kind in [b'1', b'2', b'3', b'4', b'6'] {
        let tar = tar_of(&[
            (b"SHA256SUMS", b'0', &sums),
            (b"koord-bundle.json", kind, b""),
        ]);
        entry_refused(verify(tar), "koord-bundle.json", "is not allowed");
    }
}

#[test]
fn fuzz_unsafe_entry_paths_refused() {
    let f = files();
    let sums = sums_of(&f);
    for name in [
        "../oci-layout",
        "/oci-layout",
        "a//oci-layout",
        "./oci-layout",
    ] {
        let tar = tar_of(&[
            (b"SHA256SUMS", b'0', &sums),
            (name.as_bytes(), b'0', LAYOUT),
        ]);
        entry_refused(verify(tar), name, "unsafe path");
    }
}

#[test]
fn fuzz_directory_without_listed_files() {
    let f = files();
    let sums = sums_of(&f);
    let tar = tar_of(&[(b"SHA256SUMS", b'0', &sums), (b"charts/", b'5', b"")]);
    entry_refused(
        verify(tar),
        "charts/",
        "directory not holding any listed file",
    );
}

#[test]
fn fuzz_truncated_inside_a_file() {
    let f = files();
    let mut tar = bundle_with(&sums_of(&f), &f);
    // SHA256SUMS: header + 1 block; koord-bundle.json: header, then cut 100 bytes into its data.
    let cut = 512 + 512 + 512 + 100;
    tar.truncate(cut);
    match verify(tar) {
        Err(VerifyError::Tar { reason, .. }) => {
            assert!(
                reason.contains("koord-bundle.json is truncated"),
                "{reason}"
            )
        }
        other => panic!("expected a truncated tar, got {other:?}"),
    }
}

#[test]
fn fuzz_checksum_file_not_first() {
    let f = files();
    let sums = sums_of(&f);
    let tar = tar_of(&[
        (b"koord-bundle.json", b'0', MANIFEST.as_bytes()),
        (b"SHA256SUMS", b'0', &sums),
    ]);
    assert!(matches!(verify(tar), Err(VerifyError::NoChecksums(_))));
    // A directory called SHA256SUMS is not the checksum file either.
    let tar = tar_of(&[(b"SHA256SUMS", b'5', b"")]);
    assert!(matches!(verify(tar), Err(VerifyError::NoChecksums(_))));
    assert!(matches!(
        verify(Vec::new()),
        Err(VerifyError::NoChecksums(_))
    ));
}

#[test]
fn fuzz_blob_named_after_another_digest() {
    let blob = b"{\"not\":\"its name\"}".to_vec();
    let other = Digest::of(b"other");
    let name = other.layout_path();
    let mut f: Vec<(&str, Vec<u8>)> = files();
    f.push((name.as_str(), blob));
    // The checksum file lists the true content hash under the wrong name.
    entry_refused(
        verify(bundle_with(&sums_of(&f), &f)),
        &name,
        "blob file name is not its digest",
    );
}

#[test]
fn fuzz_unknown_format_version() {
    let mut f = files();
    f[0].1 = MANIFEST
        .replace("koord-bundle/v1", "koord-bundle/v2")
        .into_bytes();
    match verify(bundle_with(&sums_of(&f), &f)) {
        Err(VerifyError::Content { reason, .. }) => {
            assert!(
                reason.contains("\"koord-bundle/v2\" is not koord-bundle/v1"),
                "{reason}"
            )
        }
        other => panic!("expected a format refusal, got {other:?}"),
    }
}

#[test]
fn fuzz_index_references_a_missing_blob() {
    let missing = Digest::of(b"nowhere");
    let index = format!(
        r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{missing}","size":7}}]}}"#
    );
    let mut f = files();
    f[2].1 = index.into_bytes();
    match verify(bundle_with(&sums_of(&f), &f)) {
        Err(VerifyError::Content { reason, .. }) => {
            assert!(
                reason.contains(&format!("{missing} ")) && reason.contains("not in the bundle"),
                "{reason}"
            )
        }
        other => panic!("expected a missing manifest, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Chart archives

const CHART_YAML: &[u8] = b"apiVersion: v2\nname: demo\nversion: 0.1.0\n";

/// A chart archive whose tar stream is 66 MiB, most of it the data of a symlink entry (which
/// the reader skips, so only the stream limit can stop it), as 67 concatenated gzip members:
/// about 70 KiB.
fn gzip_bomb() -> Vec<u8> {
    let mib = 1024 * 1024;
    let mut h = tar::Header::new_ustar();
    h.set_path("demo/link").expect("path");
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(66 * mib as u64);
    h.set_cksum();
    let mut out = gzip(h.as_bytes());
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&vec![0u8; mib]).expect("gzip to memory");
    let zeros = gz.finish().expect("gzip to memory");
    for _ in 0..66 {
        out.extend_from_slice(&zeros);
    }
    out
}

#[test]
fn fuzz_chart_gzip_bomb() {
    let bomb = gzip_bomb();
    assert!(bomb.len() < 200 * 1024, "{} bytes", bomb.len());
    match ChartArchive::from_tgz(&bomb) {
        Err(ChartError::ArchiveTooLarge { limit, what }) => {
            assert_eq!(limit, "64 MiB uncompressed");
            assert_eq!(what, "the tar stream is larger");
        }
        other => panic!("expected ArchiveTooLarge, got {other:?}"),
    }
}

#[test]
fn fuzz_chart_file_claims_65_mib() {
    // A header that claims more than the limit: refused before any data is read.
    let mut h = tar::Header::new_ustar();
    h.set_path("demo/values.yaml").expect("path");
    h.set_size(65 * 1024 * 1024);
    h.set_cksum();
    let tgz = gzip(h.as_bytes());
    match ChartArchive::from_tgz(&tgz) {
        Err(ChartError::ArchiveTooLarge { what, .. }) => {
            assert!(
                what.contains("files add up to more") && what.contains("values.yaml"),
                "{what}"
            )
        }
        other => panic!("expected ArchiveTooLarge, got {other:?}"),
    }
}

#[test]
fn fuzz_chart_too_many_entries() {
    let mut entries: Vec<(Vec<u8>, u8, &[u8])> = Vec::new();
    for i in 0..10_001 {
        entries.push((format!("demo/d{i}/").into_bytes(), b'5', b""));
    }
    let refs: Vec<(&[u8], u8, &[u8])> = entries
        .iter()
        .map(|(n, k, d)| (n.as_slice(), *k, *d))
        .collect();
    match ChartArchive::from_tgz(&gzip(&tar_of(&refs))) {
        Err(ChartError::ArchiveTooLarge { limit, .. }) => assert_eq!(limit, "10000 entries"),
        other => panic!("expected ArchiveTooLarge, got {other:?}"),
    }
}

fn chart_unsafe(entries: &[(&[u8], u8, &[u8])], path: &str, why: &str) {
    match ChartArchive::from_tgz(&gzip(&tar_of(entries))) {
        Err(ChartError::UnsafePath { path: p, reason }) => {
            assert_eq!(p, path);
            assert!(reason.contains(why), "{reason}");
        }
        other => panic!("expected {path:?} refused ({why}), got {other:?}"),
    }
}

#[test]
fn fuzz_chart_unsafe_paths() {
    chart_unsafe(
        &[
            (b"demo/Chart.yaml", b'0', CHART_YAML),
            (b"demo/../x", b'0', b""),
        ],
        "demo/../x",
        "parent directory",
    );
    chart_unsafe(
        &[(b"/demo/Chart.yaml", b'0', CHART_YAML)],
        "/demo/Chart.yaml",
        "absolute path",
    );
    chart_unsafe(
        &[(b"C:\\demo\\Chart.yaml", b'0', CHART_YAML)],
        "C:\\demo\\Chart.yaml",
        "absolute path",
    );
    chart_unsafe(
        &[
            (b"demo/Chart.yaml", b'0', CHART_YAML),
            (b"other/x", b'0', b""),
        ],
        "other/x",
        "more than one top folder",
    );
    chart_unsafe(
        &[
            (b"demo/Chart.yaml", b'0', CHART_YAML),
            (b"./demo//Chart.yaml", b'0', CHART_YAML),
        ],
        "./demo//Chart.yaml",
        "holds this file twice",
    );
    chart_unsafe(
        &[(b"Chart.yaml", b'0', CHART_YAML)],
        "Chart.yaml",
        "outside the chart's top folder",
    );
}

// ---------------------------------------------------------------------------------------------
// Helm repository index

#[test]
fn fuzz_index_shapes_refused() {
    for (text, why) in [
        (
            &b"apiVersion: v1\nentries: [a]\n"[..],
            "`entries` is not a mapping",
        ),
        (b"apiVersion: 1\n", "unsupported apiVersion \"1\""),
        (b"kind: x\n", "no apiVersion"),
        (
            b"apiVersion: v1\napiVersion: v1\n",
            "not valid YAML: line 2: duplicate key",
        ),
        (b"\xff\xfe", "not valid UTF-8"),
    ] {
        match RepoIndex::parse(text) {
            Err(ChartError::InvalidIndex { reason }) => assert!(reason.contains(why), "{reason}"),
            other => panic!("{text:?}: expected InvalidIndex ({why}), got {other:?}"),
        }
    }
}

#[test]
fn fuzz_version_specs_refused() {
    for (spec, why) in [
        ("1.6 || 1.8", "`||` are not supported"),
        ("!=1.7.0", "`!=` is not supported"),
        ("1.x-rc.1", "wildcard version cannot have a prerelease"),
        (">=1.6 bar", "unexpected text \"bar\""),
        ("\u{0}", "unexpected text"),
    ] {
        match VersionSpec::parse(spec) {
            Err(ChartError::InvalidVersionSpec { spec: s, reason }) => {
                assert_eq!(s, spec);
                assert!(reason.contains(why), "{spec:?}: {reason}");
            }
            other => panic!("{spec:?}: expected InvalidVersionSpec ({why}), got {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// CRDs

fn crd_doc(plural: &str, group: &str) -> String {
    format!(
        "---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: {plural}.{group}\nspec:\n  group: {group}\n  names:\n    kind: Foo\n    plural: {plural}\n"
    )
}

#[test]
fn fuzz_crd_group_with_a_slash_is_refused() {
    // Found while writing the chart_archive target's CRD oracle. Two CRDs in one template file
    // are stored as crds/<group>_<plural>.yaml (Crd::file_name, "unique ... base name"), and
    // `group` is taken from the YAML unchecked: a group with `/` or `..` puts the file
    // elsewhere in the bundle (`crds/../../../etc_foos.yaml`). The API server only accepts DNS
    // subdomains as groups, so such a CRD is invalid: extract_crds should refuse it.
    // Currently it returns Ok with file_name "../../../etc_foos.yaml".
    let text = format!(
        "{{{{- if .Values.crds.managed }}}}\n{}{}{{{{- end }}}}\n",
        crd_doc("foos", "../../../etc"),
        crd_doc("bars", "x.io")
    );
    let tgz = gzip(&tar_of(&[
        (b"demo/Chart.yaml", b'0', CHART_YAML),
        (b"demo/templates/crd/x.yaml", b'0', text.as_bytes()),
    ]));
    let chart = ChartArchive::from_tgz(&tgz).expect("chart");
    match extract_crds(&chart) {
        Err(ChartError::InvalidCrd { file, .. }) => assert_eq!(file, "templates/crd/x.yaml"),
        Ok(crds) => panic!(
            "CRD with group \"../../../etc\" accepted, stored as crds/{}",
            crds[0].file_name
        ),
        Err(other) => panic!("expected InvalidCrd, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// YAML bombs (repository index, Chart.yaml, values.yaml)

/// "Billion laughs": 9 levels of 9 aliases to the level below, 9^9 leaves once expanded.
fn yaml_bomb(key: &str) -> String {
    let mut s = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x]\n");
    for i in 1..9 {
        let p = i - 1;
        s += &format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        );
    }
    s + &format!("{key}: [*a8, *a8, *a8, *a8, *a8, *a8, *a8, *a8, *a8]\n")
}

#[test]
fn fuzz_index_alias_bomb() {
    let text = format!("apiVersion: v1\n{}", yaml_bomb("entries"));
    match RepoIndex::parse(text.as_bytes()) {
        Err(ChartError::InvalidIndex { reason }) => {
            assert!(reason.contains("YAML nodes (aliases expanded)"), "{reason}")
        }
        other => panic!("expected InvalidIndex, got {other:?}"),
    }
}

#[test]
fn fuzz_index_deep_flow_nesting() {
    // helm_index timeout: `entries: [[[[...]]]]`, 50 000 levels (100 KiB). serde_yaml_ng
    // refuses it (recursion limit 128) only after its scanner has done work quadratic in the
    // depth (unsafe-libyaml 0.2.11; serde_yaml_ng issue 16): 53 s in the ASan fuzz build, 15 s
    // in a debug test, 4x per doubling. A downloaded index must not stall `build`: the flow
    // depth is checked before serde_yaml_ng runs.
    let input = regression("helm_index-deep-flow-nesting.bin");
    let index = &input[1..]; // the target's input: `<spec> NUL <index>`, spec empty
                             // Refused at its first `[`: `entries` must be a mapping (the index is read event by
                             // event, so nothing past that line is scanned). No timing in tests: the message shows
                             // which check refused it.
    match RepoIndex::parse(index) {
        Err(ChartError::InvalidIndex { reason }) => {
            assert!(reason.contains("`entries` is not a mapping"), "{reason}")
        }
        other => panic!("expected InvalidIndex, got {other:?}"),
    }
    // The same depth anywhere else in the index meets the depth bound.
    let mut deep = b"apiVersion: v1\ngenerated: it's\nx: ".to_vec();
    let first = index.iter().position(|&b| b == b'[').expect("brackets");
    deep.extend_from_slice(&index[first..]);
    match RepoIndex::parse(&deep) {
        Err(ChartError::InvalidIndex { reason }) => {
            assert!(reason.contains("nested deeper than 100"), "{reason}")
        }
        other => panic!("expected InvalidIndex, got {other:?}"),
    }
}

#[test]
fn fuzz_chart_values_deep_flow_nesting() {
    // The same shape in values.yaml of a chart archive (an untrusted --chart FILE): from_tgz
    // parses it with serde_yaml_ng and no depth check (12 s in a debug test).
    let values = format!("a: {}{}\n", "[".repeat(50_000), "]".repeat(50_000));
    let tgz = gzip(&tar_of(&[
        (b"demo/Chart.yaml", b'0', CHART_YAML),
        (b"demo/values.yaml", b'0', values.as_bytes()),
    ]));
    match ChartArchive::from_tgz(&tgz) {
        Err(ChartError::InvalidYaml { file, reason }) => {
            assert_eq!(file, "values.yaml");
            assert!(reason.contains("nested deeper than 100"), "{reason}");
        }
        other => panic!("expected InvalidYaml, got {other:?}"),
    }
}

#[test]
fn fuzz_chart_values_alias_bomb() {
    let values = yaml_bomb("bomb");
    let tgz = gzip(&tar_of(&[
        (b"demo/Chart.yaml", b'0', CHART_YAML),
        (b"demo/values.yaml", b'0', values.as_bytes()),
    ]));
    match ChartArchive::from_tgz(&tgz) {
        Err(ChartError::InvalidYaml { file, reason }) => {
            assert_eq!(file, "values.yaml");
            assert!(reason.contains("YAML nodes (aliases expanded)"), "{reason}");
        }
        other => panic!("expected InvalidYaml, got {other:?}"),
    }
}

#[test]
fn fuzz_chart_crd_deep_flow_nesting() {
    // And in a CRD file: extract_crds parses every file under crds/ with serde_yaml_ng.
    let crd = format!("a: {}{}\n", "{a: ".repeat(50_000), "}".repeat(50_000));
    let tgz = gzip(&tar_of(&[
        (b"demo/Chart.yaml", b'0', CHART_YAML),
        (b"demo/crds/deep.yaml", b'0', crd.as_bytes()),
    ]));
    let chart = ChartArchive::from_tgz(&tgz).expect("chart");
    match extract_crds(&chart) {
        Err(ChartError::InvalidCrd { file, reason }) => {
            assert_eq!(file, "crds/deep.yaml");
            assert!(reason.contains("nested deeper than 100"), "{reason}");
        }
        other => panic!("expected InvalidCrd, got {other:?}"),
    }
}

#[test]
fn a_manifest_that_starts_with_whitespace_is_kept_and_walked() {
    // JSON may begin with whitespace; a registry serves such a manifest as it was pushed, and
    // its digest covers the whitespace. verify keeps small manifests in memory for the layout
    // walk: it must recognise this one too.
    let config = br#"{"architecture":"amd64","os":"linux"}"#.to_vec();
    let manifest = format!(
        "\n  {{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"config\":{{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"{}\",\"size\":{}}},\"layers\":[]}}",
        Digest::of(&config),
        config.len()
    )
    .into_bytes();
    let index = format!(
        "{{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.index.v1+json\",\"manifests\":[{{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"{}\",\"size\":{}}}]}}",
        Digest::of(&manifest),
        manifest.len()
    )
    .into_bytes();
    let blob = |d: &[u8]| format!("blobs/sha256/{}", Digest::of(d).hex());
    let (mpath, cpath) = (blob(&manifest), blob(&config));
    let f: Vec<(&str, Vec<u8>)> = vec![
        ("koord-bundle.json", MANIFEST.as_bytes().to_vec()),
        ("oci-layout", LAYOUT.to_vec()),
        ("index.json", index),
        (&mpath, manifest),
        (&cpath, config),
    ];
    let report = verify(bundle_with(&sums_of(&f), &f)).expect("verifies");
    assert_eq!(report.blobs, 2);
    assert_eq!(report.manifests, 1);
}
