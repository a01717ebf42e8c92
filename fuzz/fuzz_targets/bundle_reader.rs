#![no_main]
//! The bundle reader on untrusted bytes: `source::verify_from` (plain and gzip streams), `verify` and
//! `read_head` on a file, `Checksums::parse` and the bundle manifest's JSON.
//!
//! The first input byte picks the mode (`byte % 8`):
//!
//! * 0, 1: the rest is a plain tar, fed to `verify_from`;
//! * 2: the rest is a gzip-compressed tar (decompressed as `reader::open` does);
//! * 3: the rest is a checksum file (`Checksums::parse`, then a render/parse round trip);
//! * 4: the rest is `koord-bundle.json` (`serde_json`, then a serialize/parse round trip);
//! * 5: the rest is written to a file and read with `read_head` and `verify`;
//! * 6, 7: structure-aware: the rest drives `arbitrary` to build a bundle tar from generated
//!   entries (manifests and blobs that reference each other by digest, a SHA256SUMS that
//!   matches them unless an edit breaks it, then tar-level edits: dropped, duplicated, swapped,
//!   renamed, retyped or flipped entries, GNU long names, PAX paths, truncation, gzip).
//!
//! Whenever the reader accepts a bundle, an independent model re-reads the tar and checks what
//! the spec requires of an accepted bundle (every file listed once and matching its hash, no
//! unsafe or unexpected entry, blob offsets and sizes pointing at the right bytes): a panic
//! there means the reader accepted something it must refuse.

use arbitrary::{Arbitrary, Unstructured};
use koord_bundle::bundle::checksums::Checksums;
use koord_bundle::bundle::reader::{self, SignaturePolicy, VerifyError, VerifyReport};
use koord_bundle::bundle::source;
use koord_bundle::bundle::{BundleManifest, CHECKSUMS_FILE, FORMAT_VERSION, SIGNATURE_FILE};
use koord_bundle::oci::Digest;
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeSet;
use std::io::{Cursor, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

const LABEL: &str = "fuzz-bundle.tar";
/// Cap on what the model decompresses (gzip bombs in the input).
const MAX_INFLATE: u64 = 64 * 1024 * 1024;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 8 {
        0 | 1 => {
            let _ = verify_bytes(rest, false);
        }
        2 => {
            let _ = verify_bytes(rest, true);
        }
        3 => checksums(rest),
        4 => manifest(rest),
        5 => on_disk(rest),
        _ => structured(rest),
    }
});

// ---------------------------------------------------------------------------------------------
// Raw modes

/// `verify_from` over `bytes` (gzip-decompressed first when `gzip`), then the model on success.
fn verify_bytes(bytes: &[u8], gzip: bool) -> Result<(), VerifyError> {
    let input: Box<dyn Read> = if gzip {
        Box::new(flate2::read::GzDecoder::new(Cursor::new(bytes.to_vec())))
    } else {
        Box::new(Cursor::new(bytes.to_vec()))
    };
    let counted = AtomicU64::new(0);
    let res = runtime().block_on(source::verify_from(
        Path::new(LABEL),
        input,
        gzip,
        SignaturePolicy::Skip,
        &|n| {
            counted.fetch_add(n, Ordering::Relaxed);
        },
    ));
    if let Ok(report) = &res {
        let plain = if gzip { inflate(bytes) } else { bytes.to_vec() };
        check_report(report, &plain, counted.load(Ordering::Relaxed));
    }
    res.map(|_| ())
}

fn inflate(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    // A gzip stream whose tail is damaged can still have been verified: the tar ends before
    // the gzip trailer is read. Keep what decompresses.
    let _ = flate2::read::GzDecoder::new(bytes)
        .take(MAX_INFLATE)
        .read_to_end(&mut out);
    out
}

fn checksums(bytes: &[u8]) {
    let Ok(sums) = Checksums::parse(bytes) else {
        return;
    };
    for path in sums.0.keys() {
        assert!(
            reader::safe_path(path),
            "Checksums::parse accepted unsafe path {path:?}"
        );
    }
    // A trailing `\r` on the last line (no newline after it) is kept in the path, and render
    // writes it back before `\n`, where `lines()` strips it: skip those.
    if sums.0.keys().any(|k| k.ends_with('\r')) {
        return;
    }
    let again = Checksums::parse(sums.render().as_bytes()).expect("rendered checksums parse");
    assert_eq!(again, sums, "render/parse round trip");
}

fn manifest(bytes: &[u8]) {
    let Ok(m) = serde_json::from_slice::<BundleManifest>(bytes) else {
        return;
    };
    let json = serde_json::to_vec(&m).expect("a parsed manifest serializes");
    let again: BundleManifest = serde_json::from_slice(&json).expect("serialized manifest parses");
    assert_eq!(
        serde_json::to_value(&again).expect("to_value"),
        serde_json::to_value(&m).expect("to_value"),
        "serialize/parse round trip"
    );
}

/// The layout walk is async and the passes over the tar `block_in_place`: one multi-threaded
/// runtime for the whole run, as the binary's.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .expect("a tokio runtime")
    })
}

fn scratch_file() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        std::env::temp_dir().join(format!("koord-bundle-fuzz-{}.tar", std::process::id()))
    })
}

fn on_disk(bytes: &[u8]) {
    let path = scratch_file();
    std::fs::File::create(path)
        .and_then(|mut f| f.write_all(bytes))
        .expect("write the scratch file");
    let _ = reader::read_head(path);
    let counted = AtomicU64::new(0);
    let res = runtime().block_on(source::verify(path, SignaturePolicy::Skip, &|n| {
        counted.fetch_add(n, Ordering::Relaxed);
    }));
    if let Ok(report) = &res {
        let plain = if bytes.starts_with(&[0x1f, 0x8b]) {
            assert!(report.compressed, "gzip input not reported as compressed");
            inflate(bytes)
        } else {
            assert!(!report.compressed, "plain input reported as compressed");
            bytes.to_vec()
        };
        check_report(report, &plain, counted.load(Ordering::Relaxed));
    }
}

// ---------------------------------------------------------------------------------------------
// What an accepted bundle must satisfy

fn check_report(report: &VerifyReport, tar: &[u8], counted: u64) {
    assert_eq!(
        counted, report.bytes,
        "on_bytes total differs from report.bytes"
    );
    let manifest = report
        .manifest
        .as_ref()
        .expect("an accepted bundle has its manifest");
    assert_eq!(manifest.format_version, FORMAT_VERSION);
    for (d, bytes) in &report.small_blobs {
        assert_eq!(&Digest::of(bytes), d, "small blob kept with other bytes");
    }
    for (d, &(offset, size)) in &report.blob_locations {
        let end = offset
            .checked_add(size)
            .filter(|&e| e <= tar.len() as u64)
            .unwrap_or_else(|| panic!("blob {d} at {offset}+{size} lies outside the stream"));
        assert_eq!(
            &Digest::of(&tar[offset as usize..end as usize]),
            d,
            "blob location {offset}+{size} does not hold blob {d}"
        );
    }
    for img in &manifest.images {
        assert!(
            report.blob_locations.contains_key(&img.digest),
            "image {} accepted without its manifest blob",
            img.digest
        );
    }
    if let Err(why) = model_check(tar) {
        panic!("verify accepted a bundle the model refuses: {why}");
    }
}

fn model_safe(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('/')
        && !p.contains(['\\', '\0'])
        && p.trim_end_matches('/')
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// An independent reading of the spec's reader obligations (§7.1–2), over the same tar.
fn model_check(tar: &[u8]) -> Result<(), String> {
    let mut ar = tar::Archive::new(Cursor::new(tar));
    let mut entries = ar.entries().map_err(|e| format!("tar: {e}"))?;
    let mut first = entries
        .next()
        .ok_or("empty tar")?
        .map_err(|e| format!("tar: {e}"))?;
    if first.path_bytes().as_ref() != CHECKSUMS_FILE.as_bytes()
        || first.header().entry_type() != tar::EntryType::Regular
    {
        return Err("first entry is not the checksum file".into());
    }
    let mut text = Vec::new();
    first
        .read_to_end(&mut text)
        .map_err(|e| format!("tar: {e}"))?;
    let sums = Checksums::parse(&text).map_err(|e| e.to_string())?;
    let mut seen = BTreeSet::new();
    for (i, e) in entries.enumerate() {
        let mut e = e.map_err(|e| format!("tar: {e}"))?;
        let name = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        if i == 0 && name == SIGNATURE_FILE {
            continue;
        }
        if !model_safe(&name) {
            return Err(format!("unsafe entry {name:?} accepted"));
        }
        match e.header().entry_type() {
            tar::EntryType::Directory => {
                let prefix = format!("{}/", name.trim_end_matches('/'));
                if !sums.0.keys().any(|k| k.starts_with(&prefix)) {
                    return Err(format!("directory {name:?} holds no listed file"));
                }
                continue;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {}
            other => return Err(format!("entry {name:?} of type {other:?} accepted")),
        }
        if !seen.insert(name.clone()) || name == CHECKSUMS_FILE || name == SIGNATURE_FILE {
            return Err(format!("entry {name:?} accepted twice"));
        }
        let expected = sums
            .0
            .get(&name)
            .ok_or_else(|| format!("unlisted entry {name:?} accepted"))?;
        let mut data = Vec::new();
        e.read_to_end(&mut data).map_err(|e| format!("tar: {e}"))?;
        if &Digest::of(&data) != expected {
            return Err(format!("{name:?} accepted with the wrong content"));
        }
        if let Some(hex) = name.strip_prefix("blobs/sha256/") {
            if hex != expected.hex() {
                return Err(format!("blob {name:?} accepted under another digest"));
            }
        }
    }
    if let Some(missing) = sums.0.keys().find(|k| !seen.contains(*k)) {
        return Err(format!("listed file {missing:?} missing, yet accepted"));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Structure-aware mode

#[derive(Arbitrary, Debug)]
enum Media {
    OciManifest,
    OciIndex,
    DockerManifest,
    DockerList,
    Config,
    Layer,
    Other(String),
}

impl Media {
    fn as_str(&self) -> &str {
        match self {
            Media::OciManifest => "application/vnd.oci.image.manifest.v1+json",
            Media::OciIndex => "application/vnd.oci.image.index.v1+json",
            Media::DockerManifest => "application/vnd.docker.distribution.manifest.v2+json",
            Media::DockerList => "application/vnd.docker.distribution.manifest.list.v2+json",
            Media::Config => "application/vnd.oci.image.config.v1+json",
            Media::Layer => "application/vnd.oci.image.layer.v1.tar+gzip",
            Media::Other(s) => s,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum RefDigest {
    /// The digest of the target blob.
    Target,
    /// The digest of other bytes (a blob that is not in the bundle).
    Dangling(u8),
    /// Any string.
    Raw(String),
}

/// A descriptor pointing at an earlier blob.
#[derive(Arbitrary, Debug)]
struct Ref {
    target: u8,
    media: Media,
    digest: RefDigest,
    /// Added to the true size (0: exact).
    size_delta: i8,
    platform: bool,
    ref_name: Option<String>,
}

#[derive(Arbitrary, Debug)]
enum BlobSpec {
    Image {
        media: Option<Media>,
        config: Ref,
        layers: Vec<Ref>,
    },
    Index {
        media: Option<Media>,
        manifests: Vec<Ref>,
    },
    Bytes(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum ManifestSpec {
    Valid {
        format_bad: Option<String>,
        /// Images: indexes of blobs whose digests they name.
        images: Vec<u8>,
        chart: String,
        tag: String,
    },
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum IndexSpec {
    Roots(Vec<Ref>),
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum SigSpec {
    /// Well-formed minisign structure, garbage key and signature.
    Fake {
        comment: String,
        prehashed: bool,
    },
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum SumsEdit {
    Drop(u8),
    Corrupt(u8),
    Add(String),
    Rename(u8, String),
}

#[derive(Arbitrary, Debug)]
enum EntryEdit {
    Drop(u8),
    Duplicate(u8),
    Swap(u8, u8),
    Kind(u8, u8),
    Rename(u8, Vec<u8>),
    Flip(u8, u16),
    LongName(u8),
    Pax(u8),
    Truncate(u16),
}

#[derive(Arbitrary, Debug)]
struct Spec {
    signature: Option<SigSpec>,
    manifest: ManifestSpec,
    index: IndexSpec,
    layout: Option<Vec<u8>>,
    blobs: Vec<BlobSpec>,
    extra: Vec<(String, Vec<u8>)>,
    dirs: bool,
    sums_edits: Vec<SumsEdit>,
    raw_sums: Option<Vec<u8>>,
    edits: Vec<EntryEdit>,
    gzip: bool,
}

#[derive(Debug, Clone)]
struct TEntry {
    name: Vec<u8>,
    kind: u8,
    data: Vec<u8>,
    long_name: bool,
    pax_path: bool,
}

impl TEntry {
    fn file(name: &str, data: Vec<u8>) -> Self {
        TEntry {
            name: name.as_bytes().to_vec(),
            kind: b'0',
            data,
            long_name: false,
            pax_path: false,
        }
    }
}

fn descriptor(r: &Ref, built: &[(Digest, Vec<u8>)]) -> serde_json::Value {
    let target = (!built.is_empty()).then(|| &built[r.target as usize % built.len()]);
    let digest = match (&r.digest, target) {
        (RefDigest::Target, Some((d, _))) => d.to_string(),
        (RefDigest::Target, None) => Digest::of(&[r.target]).to_string(),
        (RefDigest::Dangling(b), _) => Digest::of(&[0xff, *b]).to_string(),
        (RefDigest::Raw(s), _) => s.clone(),
    };
    let size = target.map_or(0, |(_, b)| b.len() as i64) + i64::from(r.size_delta);
    let mut d = serde_json::json!({
        "mediaType": r.media.as_str(),
        "digest": digest,
        "size": size,
    });
    if r.platform {
        d["platform"] = serde_json::json!({"architecture": "amd64", "os": "linux"});
    }
    if let Some(name) = &r.ref_name {
        d["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": name});
    }
    d
}

fn fake_signature(comment: &str, prehashed: bool) -> Vec<u8> {
    use std::fmt::Write as _;
    // Base64 without a crate: 74 bytes of signature (alg, keynum, sig), 64 of global sig.
    fn b64(bytes: &[u8]) -> String {
        const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut s = String::new();
        for c in bytes.chunks(3) {
            let n = (u32::from(c[0]) << 16)
                | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
                | u32::from(*c.get(2).unwrap_or(&0));
            for i in 0..4 {
                if i <= c.len() {
                    s.push(T[(n >> (18 - 6 * i)) as usize & 63] as char);
                } else {
                    s.push('=');
                }
            }
        }
        s
    }
    let mut sig = Vec::with_capacity(74);
    sig.extend_from_slice(if prehashed { b"ED" } else { b"Ed" });
    sig.extend_from_slice(&[7u8; 8]);
    sig.extend_from_slice(&[9u8; 64]);
    let mut s = String::new();
    let _ = writeln!(s, "untrusted comment: signature from koord-bundle");
    let _ = writeln!(s, "{}", b64(&sig));
    let _ = writeln!(s, "trusted comment: {comment}");
    let _ = writeln!(s, "{}", b64(&[3u8; 64]));
    s.into_bytes()
}

fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    // "<len> <key>=<value>\n", where <len> counts itself.
    let body = 1 + key.len() + 1 + value.len() + 1;
    let mut len = body + 1;
    while len != body + len.to_string().len() {
        len = body + len.to_string().len();
    }
    let mut out = format!("{len} {key}=").into_bytes();
    out.extend_from_slice(value);
    out.push(b'\n');
    out
}

fn write_tar(entries: &[TEntry]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let header = |name: &[u8], kind: u8, size: u64| {
        let mut h = tar::Header::new_ustar();
        {
            let field = &mut h.as_old_mut().name;
            let n = name.len().min(field.len());
            field[..n].copy_from_slice(&name[..n]);
        }
        h.set_entry_type(tar::EntryType::new(kind));
        h.set_size(size);
        h.set_mode(if kind == b'5' { 0o755 } else { 0o644 });
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        h
    };
    for e in entries {
        if e.long_name {
            let mut data = e.name.clone();
            data.push(0);
            let mut h = tar::Header::new_gnu();
            {
                let field = &mut h.as_old_mut().name;
                field[..13].copy_from_slice(b"././@LongLink");
            }
            h.set_entry_type(tar::EntryType::GNULongName);
            h.set_size(data.len() as u64);
            h.set_cksum();
            let _ = b.append(&h, data.as_slice());
        }
        if e.pax_path {
            let data = pax_record("path", &e.name);
            let h = header(b"PaxHeaders/entry", b'x', data.len() as u64);
            let _ = b.append(&h, data.as_slice());
        }
        let h = header(&e.name, e.kind, e.data.len() as u64);
        let _ = b.append(&h, e.data.as_slice());
    }
    b.into_inner().unwrap_or_default()
}

fn structured(bytes: &[u8]) {
    let mut u = Unstructured::new(bytes);
    let Ok(spec) = Spec::arbitrary(&mut u) else {
        return;
    };

    // Blobs, each referencing earlier ones.
    let mut built: Vec<(Digest, Vec<u8>)> = Vec::new();
    for b in spec.blobs.iter().take(8) {
        let data = match b {
            BlobSpec::Bytes(v) => v.clone(),
            BlobSpec::Image {
                media,
                config,
                layers,
            } => {
                let mut m = serde_json::json!({
                    "schemaVersion": 2,
                    "config": descriptor(config, &built),
                    "layers": layers.iter().take(4).map(|r| descriptor(r, &built)).collect::<Vec<_>>(),
                });
                if let Some(mt) = media {
                    m["mediaType"] = mt.as_str().into();
                }
                serde_json::to_vec(&m).unwrap_or_default()
            }
            BlobSpec::Index { media, manifests } => {
                let mut m = serde_json::json!({
                    "schemaVersion": 2,
                    "manifests": manifests.iter().take(4).map(|r| descriptor(r, &built)).collect::<Vec<_>>(),
                });
                if let Some(mt) = media {
                    m["mediaType"] = mt.as_str().into();
                }
                serde_json::to_vec(&m).unwrap_or_default()
            }
        };
        let d = Digest::of(&data);
        if built.iter().all(|(x, _)| *x != d) {
            built.push((d, data));
        }
    }

    let index_json = match &spec.index {
        IndexSpec::Roots(roots) => serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": roots.iter().take(4).map(|r| descriptor(r, &built)).collect::<Vec<_>>(),
        }))
        .unwrap_or_default(),
        IndexSpec::Raw(v) => v.clone(),
    };

    let manifest_json = match &spec.manifest {
        ManifestSpec::Raw(v) => v.clone(),
        ManifestSpec::Valid {
            format_bad,
            images,
            chart,
            tag,
        } => {
            let digest_of = |i: u8| {
                if built.is_empty() {
                    Digest::of(&[i]).to_string()
                } else {
                    built[i as usize % built.len()].0.to_string()
                }
            };
            let images: Vec<serde_json::Value> = images
                .iter()
                .take(4)
                .map(|&i| {
                    serde_json::json!({
                        "ref": format!("koordinator-sh/{chart}:{tag}"),
                        "component": "manager",
                        "repository": format!("koordinator-sh/{chart}"),
                        "tag": tag,
                        "original": format!("ghcr.io/koordinator-sh/{chart}:{tag}"),
                        "source": "ghcr",
                        "sourceRef": format!("ghcr.io/koordinator-sh/{chart}:{tag}"),
                        "digest": digest_of(i),
                        "upstreamDigest": digest_of(i),
                        "mediaType": "application/vnd.oci.image.index.v1+json",
                        "size": 1,
                        "platforms": ["linux/amd64"],
                        "attestations": 0,
                        "totalSize": 1,
                    })
                })
                .collect();
            serde_json::to_vec(&serde_json::json!({
                "formatVersion": format_bad.clone().unwrap_or_else(|| FORMAT_VERSION.to_string()),
                "tool": {"name": "koord-bundle", "version": "0.1.0"},
                "created": "2026-01-01T00:00:00Z",
                "chart": {
                    "name": chart, "version": "1.8.0", "appVersion": "1.8.0",
                    "digest": Digest::of(chart.as_bytes()).to_string(),
                    "file": "charts/koordinator-1.8.0.tgz", "url": null, "indexDigest": null,
                    "digestMismatchAllowed": false,
                    "oci": {"ref": "charts/koordinator:1.8.0", "digest": digest_of(0),
                            "mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 1},
                },
                "images": images,
                "crds": [],
                "platformFilter": null,
                "sources": ["ghcr"],
                "overrides": {"valuesFiles": [], "setKeys": [], "extraImages": []},
                "blobs": {"count": built.len(), "bytes": 0},
            }))
            .unwrap_or_default()
        }
    };

    // Files of the bundle, in spec order.
    let mut files = vec![
        TEntry::file("koord-bundle.json", manifest_json),
        TEntry::file(
            "oci-layout",
            spec.layout
                .clone()
                .unwrap_or_else(|| br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec()),
        ),
        TEntry::file("index.json", index_json),
    ];
    for (name, data) in spec.extra.iter().take(4) {
        files.push(TEntry::file(name, data.clone()));
    }
    if spec.dirs {
        let mut d = TEntry::file("blobs/", Vec::new());
        d.kind = b'5';
        files.push(d.clone());
        d.name = b"blobs/sha256/".to_vec();
        files.push(d);
    }
    for (d, data) in &built {
        files.push(TEntry::file(&d.layout_path(), data.clone()));
    }

    // The checksum file: every regular file, then edits.
    let mut sums = Checksums::default();
    for f in files.iter().filter(|f| f.kind == b'0') {
        sums.0.insert(
            String::from_utf8_lossy(&f.name).into_owned(),
            Digest::of(&f.data),
        );
    }
    for edit in spec.sums_edits.iter().take(3) {
        let nth = |i: u8| sums.0.keys().nth(i as usize % sums.0.len().max(1)).cloned();
        match edit {
            SumsEdit::Drop(i) => {
                if let Some(k) = nth(*i) {
                    sums.0.remove(&k);
                }
            }
            SumsEdit::Corrupt(i) => {
                if let Some(k) = nth(*i) {
                    sums.0.insert(k, Digest::of(b"corrupt"));
                }
            }
            SumsEdit::Add(p) => {
                sums.0.insert(p.clone(), Digest::of(p.as_bytes()));
            }
            SumsEdit::Rename(i, p) => {
                if let Some(k) = nth(*i) {
                    if let Some(d) = sums.0.remove(&k) {
                        sums.0.insert(p.clone(), d);
                    }
                }
            }
        }
    }
    let sums_text = spec
        .raw_sums
        .clone()
        .unwrap_or_else(|| sums.render().into_bytes());

    let mut entries = vec![TEntry::file(CHECKSUMS_FILE, sums_text)];
    match &spec.signature {
        Some(SigSpec::Fake { comment, prehashed }) => entries.push(TEntry::file(
            SIGNATURE_FILE,
            fake_signature(comment, *prehashed),
        )),
        Some(SigSpec::Raw(v)) => entries.push(TEntry::file(SIGNATURE_FILE, v.clone())),
        None => {}
    }
    entries.extend(files);

    // Tar-level edits.
    let mut truncate = None;
    for edit in spec.edits.iter().take(4) {
        let n = entries.len();
        if n == 0 {
            break;
        }
        let at = |i: u8| i as usize % n;
        match edit {
            EntryEdit::Drop(i) => {
                entries.remove(at(*i));
            }
            EntryEdit::Duplicate(i) => {
                let e = entries[at(*i)].clone();
                entries.push(e);
            }
            EntryEdit::Swap(i, j) => entries.swap(at(*i), at(*j)),
            EntryEdit::Kind(i, k) => entries[at(*i)].kind = *k,
            EntryEdit::Rename(i, name) => entries[at(*i)].name = name.clone(),
            EntryEdit::Flip(i, pos) => {
                let data = &mut entries[at(*i)].data;
                if !data.is_empty() {
                    let p = *pos as usize % data.len();
                    data[p] ^= 1;
                }
            }
            EntryEdit::LongName(i) => entries[at(*i)].long_name = true,
            EntryEdit::Pax(i) => entries[at(*i)].pax_path = true,
            EntryEdit::Truncate(t) => truncate = Some(*t as usize),
        }
    }
    let mut tar = write_tar(&entries);
    if let Some(t) = truncate {
        tar.truncate(t % (tar.len() + 1));
    }

    if spec.gzip {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let _ = gz.write_all(&tar);
        let compressed = gz.finish().unwrap_or_default();
        let counted = AtomicU64::new(0);
        let res = runtime().block_on(source::verify_from(
            Path::new(LABEL),
            Box::new(flate2::read::GzDecoder::new(Cursor::new(compressed))),
            true,
            SignaturePolicy::Skip,
            &|n| {
                counted.fetch_add(n, Ordering::Relaxed);
            },
        ));
        if let Ok(report) = &res {
            check_report(report, &tar, counted.load(Ordering::Relaxed));
        }
    } else {
        let _ = verify_bytes(&tar, false);
    }
}
