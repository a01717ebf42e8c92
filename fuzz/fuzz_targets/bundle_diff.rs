#![no_main]
//! What `diff` and `inspect --sbom` read from a bundle they were handed, on untrusted bytes.
//!
//! The first input byte picks the mode (`byte % 4`):
//!
//! * 0: the rest is a CRD file: `bundle::crd::parse`; when it parses, every field path it
//!   reports is non-empty and its parent (the path before the last `.` or `[`) is reported too,
//!   and comparing the CRD with itself finds nothing;
//! * 1: the rest is a `values.yaml`: parsed within the VALUES bounds, flattened, compared with
//!   itself: nothing added, removed or changed;
//! * 2: the rest is `koord-bundle.json`: a bill of materials derived from it (no CRD files, no
//!   blobs) is JSON when it is made at all;
//! * 3: the rest is written to a file and read with `reader::read_whole_head`, then checked
//!   against its own `SHA256SUMS`.

use koord_bundle::bundle::diff;
use koord_bundle::bundle::{crd, reader, sbom};
use koord_splitset::BundleFile;
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 4 {
        0 => {
            if let Ok(c) = crd::parse("crds/fuzz.yaml", rest) {
                for v in &c.versions {
                    let Some(fields) = &v.fields else { continue };
                    for path in fields.keys() {
                        assert!(!path.is_empty());
                        if let Some(i) = path.rfind(['.', '[']) {
                            let parent = &path[..i];
                            assert!(
                                parent.is_empty() || fields.contains_key(parent),
                                "{path} without its parent"
                            );
                        }
                    }
                }
                let same = diff::crds::compare_schemas(&c, &c);
                assert!(same.is_empty(), "a CRD differs from itself: {same:?}");
            }
        }
        1 => {
            let limits = koord_bundle::yaml::VALUES;
            if let Ok(v) = koord_bundle::yaml::parse_value("values.yaml", rest, &limits) {
                let c = diff::values::compare(Some(&v), Some(&v));
                assert!(c.added.is_empty() && c.removed.is_empty() && c.changed.is_empty());
            }
        }
        2 => {
            if let Ok(bom) = sbom::derive(rest, &[], &BTreeMap::new()) {
                serde_json::from_slice::<serde_json::Value>(&bom).expect("the BOM is JSON");
            }
        }
        _ => {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("fuzz.tar");
            std::fs::write(&path, rest).expect("write");
            if let Ok(bf) = BundleFile::open(&path) {
                if let Ok(head) = reader::read_whole_head(&bf) {
                    let _ = head.check(&path);
                }
            }
        }
    }
});
