//! Bundles with large blobs: their bytes are hashed after the pass over the tar, in parallel
//! (a plain file), and a re-load that finds every tag in place does not hash them again.

use crate::common::*;
use crate::fake_registry::{self, BlobMode};
use serde_json::Value;
use std::path::PathBuf;

/// A bundle of 1.8.0 plus one image with a 6 MB layer (above the size hashed in the pass).
fn big_bundle(h: &Home) -> PathBuf {
    let layer: Vec<u8> = (0..6_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
        .collect();
    let fake = fake_registry::start("big/img", "v1", layer, BlobMode::Good);
    let img = format!("{}/big/img:v1", fake.addr);
    let (bundle, _) = h.build_plain("1.8.0", &["--image", &img]);
    bundle
}

#[test]
fn a_changed_byte_in_a_large_blob_is_found_by_verify_and_load() {
    let h = Home::with_key();
    let bundle = big_bundle(&h);
    let b = bundle.to_str().unwrap();
    assert_ok(&h.run(&["verify", b]));
    let (entry, offset) = largest_blob(&bundle);
    flip_byte(&bundle, offset + 3_000_000);
    let o = h.run(&["verify", b]);
    let digest_hex = entry.rsplit('/').next().unwrap();
    assert_fails(&o, 1, &[digest_hex, "SHA256SUMS says"]);
    let prefix = unique_prefix("bigbad");
    let o = h.run(&[
        "load",
        b,
        "--registry",
        &format!("{}/{prefix}", env().plain),
        "--plain-http",
        "--no-install",
    ]);
    assert_fails(&o, 1, &[digest_hex, "nothing was pushed"]);
    assert!(repos_under(&prefix).is_empty());
}

#[test]
fn a_reload_with_every_tag_in_place_does_not_rehash_the_large_blobs() {
    let h = Home::with_key();
    let bundle = big_bundle(&h);
    let b = bundle.to_str().unwrap();
    let registry = format!("{}/{}", env().plain, unique_prefix("bigre"));
    let args = [
        "load",
        b,
        "--registry",
        &registry,
        "--plain-http",
        "--no-install",
        "--json",
    ];
    let o = h.run(&args);
    assert_ok(&o);
    let first: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(first["verified"]["blobsRehashed"], true);
    assert!(first["push"]["uploaded"].as_u64().unwrap() > 0);
    let o = h.run(&args);
    assert_ok(&o);
    let again: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(again["verified"]["blobsRehashed"], false, "{again}");
    assert_eq!(again["push"]["uploaded"], 0);
    let o = h.run(&args[..args.len() - 1]);
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("were not re-hashed"), "{err}");
    // Changed on disk since: a re-load that pushes nothing still says nothing is wrong (it
    // read nothing of it), but verify finds it.
    let (_, offset) = largest_blob(&bundle);
    flip_byte(&bundle, offset + 10);
    assert_ok(&h.run(&args));
    assert_fails(&h.run(&["verify", b]), 1, &["SHA256SUMS says"]);
}
