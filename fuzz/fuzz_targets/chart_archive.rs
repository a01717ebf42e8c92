#![no_main]
//! Chart archives on untrusted bytes: `ChartArchive::from_tgz`, then `extract_crds`, and
//! `images_from_rendered` (the images of a rendering, named after the chart's components) with
//! each of the chart's template files taken as if helm had rendered it, on what parses.
//!
//! Two input shapes:
//! * a gzip stream (starts with `1f 8b`): fed to `from_tgz` as is. The custom mutator
//!   decompresses such inputs, lets libFuzzer mutate the tar inside, and compresses the result
//!   again, so mutations reach the tar and the files in it instead of dying on a CRC check.
//! * anything else: a list of files, `path NUL content NUL path NUL content ...`, built into a
//!   tar (raw header names, so `..` and absolute paths get through; GNU long names past 100
//!   bytes) and gzipped here. A path whose first byte is 0x01..=0x07 gets the tar entry type
//!   `'0' + byte` (1 hard link, 2 symlink, 3 char device, 4 block device, 5 directory,
//!   6 FIFO, 7 contiguous). Two pseudo-paths are skipped: `--values` and `--set` (inputs of
//!   the value merging and `--set` parser that helm now does instead; older corpus entries
//!   still hold them). Insertions and deletions keep this shape intact.
//!
//! Checked on top of "no panic": an accepted archive has only safe, non-empty relative paths
//! and a named, versioned Chart.yaml; discovered images are unique references; extracted CRDs
//! have unique names and file names that are plain base names (the bundle stores them as
//! `crds/<file_name>`), and CRDs cut out of templates hold no template action.

use koord_bundle::chart::rendered::images_in_manifests;
use koord_bundle::chart::{extract_crds, images_from_rendered, ChartArchive, ChartError};
use libfuzzer_sys::{fuzz_mutator, fuzz_target, fuzzer_mutate};
use std::collections::BTreeSet;
use std::io::{Read, Write};

/// Largest tar the mutator inflates (the library's own limit is 64 MiB).
const MUTATE_MAX_TAR: u64 = 8 * 1024 * 1024;

fuzz_target!(|data: &[u8]| {
    if data.starts_with(&[0x1f, 0x8b]) {
        check(data);
    } else {
        check(&build_from_list(data));
    }
});

fuzz_mutator!(|data: &mut [u8], size: usize, max_size: usize, seed: u32| {
    // One time in eight, mutate the compressed bytes themselves (gzip-level damage).
    if seed % 8 != 0 && data[..size].starts_with(&[0x1f, 0x8b]) {
        let mut tar = Vec::new();
        let ok = flate2::read::MultiGzDecoder::new(&data[..size])
            .take(MUTATE_MAX_TAR)
            .read_to_end(&mut tar)
            .is_ok();
        if ok && !tar.is_empty() {
            let len = tar.len();
            let cap = (len + len / 4).max(len + 4096);
            tar.resize(cap, 0);
            let n = fuzzer_mutate(&mut tar, len, cap);
            tar.truncate(n);
            let gz = gzip(&tar, flate2::Compression::fast());
            if gz.len() <= max_size {
                data[..gz.len()].copy_from_slice(&gz);
                return gz.len();
            }
        }
    }
    fuzzer_mutate(data, size, max_size)
});

fn gzip(bytes: &[u8], level: flate2::Compression) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), level);
    gz.write_all(bytes).expect("gzip to memory");
    gz.finish().expect("gzip to memory")
}

fn raw_header(name: &[u8], kind: u8, size: u64) -> tar::Header {
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
}

/// The tgz of the file-list shape.
fn build_from_list(data: &[u8]) -> Vec<u8> {
    let mut parts = data.split(|&b| b == 0);
    let mut b = tar::Builder::new(Vec::new());
    let mut count = 0;
    while let Some(path) = parts.next() {
        let content = parts.next().unwrap_or_default();
        match path {
            // Inputs of code that is gone (helm merges values and reads --set).
            b"--values" | b"--set" => continue,
            // The empty piece after a trailing NUL (`./` still writes an empty chart path).
            b"" => continue,
            _ => {}
        }
        count += 1;
        if count > 256 {
            break;
        }
        let (kind, name) = match path.split_first() {
            Some((&k @ 1..=7, rest)) => (b'0' + k, rest),
            _ => (b'0', path),
        };
        let size = if kind == b'5' { 0 } else { content.len() };
        if name.len() > 100 {
            let mut long = name.to_vec();
            long.push(0);
            let mut h = tar::Header::new_gnu();
            h.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
            h.set_entry_type(tar::EntryType::GNULongName);
            h.set_size(long.len() as u64);
            h.set_cksum();
            let _ = b.append(&h, long.as_slice());
        }
        let h = raw_header(name, kind, size as u64);
        let _ = b.append(&h, &content[..size]);
    }
    let tar = b.into_inner().unwrap_or_default();
    gzip(&tar, flate2::Compression::none())
}

fn check(tgz: &[u8]) {
    let chart = match ChartArchive::from_tgz(tgz) {
        Ok(c) => c,
        Err(
            ChartError::InvalidArchive { .. }
            | ChartError::UnsafePath { .. }
            | ChartError::ArchiveTooLarge { .. }
            | ChartError::MissingFile { .. }
            | ChartError::InvalidYaml { .. },
        ) => return,
        Err(other) => panic!("from_tgz: unexpected error kind {other:?}"),
    };
    let top = chart.top_dir();
    assert!(
        !top.is_empty() && !top.contains('/') && top != "." && top != "..",
        "top folder {top:?}"
    );
    for (path, _) in chart.files() {
        assert!(
            !path.is_empty()
                && !path.starts_with('/')
                && path
                    .split('/')
                    .all(|c| !c.is_empty() && c != "." && c != ".."),
            "from_tgz accepted file path {path:?}"
        );
    }
    let meta = chart.meta();
    assert!(!meta.name.trim().is_empty() && !meta.version.trim().is_empty());
    assert!(chart.values().is_mapping(), "values are not a mapping");

    // Each template as if helm had rendered it (with its `# Source:` line): the images of a
    // rendering named after this chart's components.
    for (path, bytes) in chart.files() {
        if !path.starts_with("templates/") {
            continue;
        }
        let text = format!(
            "---\n# Source: {}/{path}\n{}",
            chart.meta().name,
            String::from_utf8_lossy(bytes)
        );
        if let Ok(found) = images_in_manifests(&text) {
            check_images(images_from_rendered(&found, &chart));
        }
    }

    if let Ok(crds) = extract_crds(&chart) {
        let plain_crds = chart.files().any(|(p, _)| p.starts_with("crds/"));
        let mut names = BTreeSet::new();
        let mut files = BTreeSet::new();
        for c in &crds {
            assert!(names.insert(c.name.clone()), "CRD {} twice", c.name);
            assert!(
                files.insert(c.file_name.clone()),
                "CRD file {} twice",
                c.file_name
            );
            assert!(
                !c.file_name.is_empty()
                    && !c.file_name.contains(['/', '\\', '\0'])
                    && c.file_name != "."
                    && c.file_name != "..",
                "CRD file name {:?} is not a plain base name (bundle path crds/{})",
                c.file_name,
                c.file_name
            );
            if !plain_crds {
                assert!(
                    !c.yaml.contains("{{"),
                    "CRD {} from a template still holds an action",
                    c.name
                );
            }
        }
    }
}

fn check_images(res: Result<Vec<koord_bundle::chart::ChartImage>, ChartError>) {
    let Ok(images) = res else { return };
    let mut refs = BTreeSet::new();
    for i in &images {
        let r = i.reference();
        assert!(!i.repository.is_empty() && !i.tag.is_empty(), "image {r:?}");
        assert!(!r.contains(char::is_whitespace), "image reference {r:?}");
        assert!(refs.insert(r.clone()), "image {r} listed twice");
    }
}
