#![no_main]
//! The manifest-graph walk (`copy::resolve`, `copy::totals`, the bundle layout, a dry-run
//! `copy::transfer`) over an in-memory store that answers hostile graphs: manifests stored
//! under digests that are not theirs (so a graph can reach itself: cycles by digest), indexes
//! of hundreds of children, indexes nested without end, sizes at and past 2^63 - 1 and 2^64 - 1,
//! one digest declared with several sizes, blobs listed as index entries.
//!
//! Input (`arbitrary`): up to 24 nodes, each an index or an image manifest whose entries
//! point at other nodes (any, itself included) or at blobs, with a declared size that is
//! exact, off by some bytes, or one of the sizes that wrap; indexes may also fan out to up to
//! 300 distinct image manifests (in all, made once). Up to 4 of the nodes are tagged and walked with one shared
//! budget, with or without a platform filter.
//!
//! Checked on top of "no panic, no hang":
//! * a graph the walk accepts holds each blob once, at most 2^63 - 1 bytes in all, and the
//!   walk's bounds hold (children per index, manifests and blobs per bundle);
//! * the totals of the accepted graphs never exceed 2^63 - 1 and are their blobs' sum;
//! * a layout the writer accepts has its regions in order, apart, within its length.

use arbitrary::Arbitrary;
use koord_bundle::bundle::writer::{Entries, TarLayout};
use koord_bundle::copy::{self, Budget, Item, Omitted, Options};
use koord_bundle::oci::{media, size::MAX_SIZE, Digest};
use koord_bundle::store::{MemoryStore, RawManifest, Reference};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use std::collections::BTreeSet;

#[derive(Arbitrary, Debug)]
enum Size {
    Exact,
    Plus(u16),
    Minus(u16),
    Max,
    I64Max,
    Half,
    Any(u64),
}

#[derive(Arbitrary, Debug)]
struct Entry {
    /// A node (modulo the node count) or, with `blob`, blob number `target`.
    target: u8,
    blob: bool,
    size: Size,
    /// 0 index, 1 manifest, 2 Docker list, 3 Docker manifest, else a layer type.
    media: u8,
    /// 0 linux/amd64, 1 linux/arm64, 2 unknown/unknown, else none.
    platform: u8,
}

#[derive(Arbitrary, Debug)]
struct Node {
    index: bool,
    entries: Vec<Entry>,
    /// Extra distinct children of an index (modulo 700, 300 in all).
    fanout: u16,
}

#[derive(Arbitrary, Debug)]
struct Input {
    nodes: Vec<Node>,
    tops: Vec<u8>,
    filter: Option<bool>,
}

fn node_digest(i: usize) -> Digest {
    Digest::of(format!("node {i}").as_bytes())
}

/// Blob `i`: `i + 1` bytes of `{`.
fn blob_bytes(i: u8) -> Vec<u8> {
    vec![b'{'; 1 + usize::from(i)]
}

fn blob_digest(i: u8) -> Digest {
    Digest::of(&blob_bytes(i))
}

fn media_of(m: u8) -> &'static str {
    match m % 6 {
        0 => media::OCI_INDEX,
        1 => media::OCI_MANIFEST,
        2 => media::DOCKER_LIST,
        3 => media::DOCKER_MANIFEST,
        4 => "application/vnd.oci.image.layer.v1.tar+gzip",
        _ => "application/vnd.oci.image.config.v1+json",
    }
}

fn declared(s: &Size, exact: u64) -> u64 {
    match s {
        Size::Exact => exact,
        Size::Plus(n) => exact.saturating_add(u64::from(*n)),
        Size::Minus(n) => exact.saturating_sub(u64::from(*n)),
        Size::Max => u64::MAX,
        Size::I64Max => MAX_SIZE,
        Size::Half => MAX_SIZE / 2 + 1,
        Size::Any(n) => *n,
    }
}

/// The fan-out children: 300 honest image manifests, distinct by an annotation, and their
/// index entries as JSON text; made once (the fuzzer's time goes to the walk, not to them).
fn fan_children() -> &'static [(RawManifest, String)] {
    static FAN: std::sync::OnceLock<Vec<(RawManifest, String)>> = std::sync::OnceLock::new();
    FAN.get_or_init(|| {
        (0..FAN_MAX)
            .map(|j| {
                let m = RawManifest::new(
                    serde_json::to_vec(&json!({"schemaVersion": 2,
                        "mediaType": media::OCI_MANIFEST,
                        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                   "digest": Digest::of(b"{}"), "size": 2},
                        "layers": [], "annotations": {"n": j.to_string()}}))
                    .unwrap_or_default(),
                    media::OCI_MANIFEST,
                );
                let entry = json!({"mediaType": media::OCI_MANIFEST, "digest": m.digest,
                    "size": m.bytes.len(), "platform": {"os": "linux", "architecture": "amd64"}})
                .to_string();
                (m, entry)
            })
            .collect()
    })
}

/// Fan-out children in one input, in all: past the 256 of one index.
const FAN_MAX: usize = 300;

/// A node's bytes, its children sized by `lens` (the nodes' lengths from the last round);
/// an index also lists fan-out children `fan`.
fn render(i: usize, n: &Node, count: usize, lens: &[u64], fan: std::ops::Range<usize>) -> Vec<u8> {
    let desc = |e: &Entry| -> Value {
        let (digest, exact) = if e.blob {
            (blob_digest(e.target), 1 + u64::from(e.target))
        } else {
            let t = usize::from(e.target) % count;
            (node_digest(t), lens[t])
        };
        let mut d = json!({"mediaType": media_of(e.media), "digest": digest,
                           "size": declared(&e.size, exact)});
        match e.platform % 4 {
            0 => d["platform"] = json!({"os": "linux", "architecture": "amd64"}),
            1 => d["platform"] = json!({"os": "linux", "architecture": "arm64"}),
            2 => d["platform"] = json!({"os": "unknown", "architecture": "unknown"}),
            _ => {}
        }
        d
    };
    let doc = if n.index {
        let kids: Vec<String> = (n.entries.iter().take(16).map(|e| desc(e).to_string()))
            .chain(
                fan_children()
                    .get(fan)
                    .unwrap_or_default()
                    .iter()
                    .map(|(_, e)| e.clone()),
            )
            .collect();
        return format!(
            r#"{{"schemaVersion":2,"mediaType":"{}","manifests":[{}]}}"#,
            media::OCI_INDEX,
            kids.join(",")
        )
        .into_bytes();
    } else {
        let mut entries = n.entries.iter().take(16).map(desc);
        let config = entries.next().unwrap_or_else(|| {
            json!({"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": Digest::of(b"{}"), "size": 2})
        });
        json!({"schemaVersion": 2, "mediaType": media::OCI_MANIFEST, "config": config,
               "layers": entries.collect::<Vec<_>>(), "annotations": {"node": i.to_string()}})
    };
    serde_json::to_vec(&doc).unwrap_or_default()
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

fuzz_target!(|input: Input| {
    let nodes: Vec<&Node> = input.nodes.iter().take(24).collect();
    if nodes.is_empty() {
        return;
    }
    let count = nodes.len();
    let store = MemoryStore::new("hostile");
    store.add_blob(
        "r",
        "application/vnd.oci.image.config.v1+json",
        b"{}".to_vec(),
    );
    // The blobs the entries name (a descriptor declaring `Exact` describes them truly).
    let named: BTreeSet<u8> = nodes
        .iter()
        .flat_map(|n| n.entries.iter().take(16))
        .filter(|e| e.blob)
        .map(|e| e.target)
        .collect();
    for b in named {
        let _ = store.add_blob("r", "application/octet-stream", blob_bytes(b));
    }
    // Fan-out children: each index takes the next ones of the 300 (distinct across indexes).
    let mut fans = Vec::new();
    let mut next = 0usize;
    for n in &nodes {
        let k = if n.index {
            usize::from(n.fanout % 700).min(FAN_MAX - next)
        } else {
            0
        };
        fans.push(next..next + k);
        next += k;
    }
    for (m, _) in &fan_children()[..next] {
        store.add_manifest("r", None, m.clone());
    }
    // Each node's bytes sized by its children's lengths: three rounds settle the digits.
    let mut lens = vec![0u64; count];
    let mut bytes = Vec::new();
    for _ in 0..3 {
        bytes = (0..count)
            .map(|i| render(i, nodes[i], count, &lens, fans[i].clone()))
            .collect();
        lens = bytes.iter().map(|b| b.len() as u64).collect();
    }
    // Stored under a digest that is not theirs: the store answers whatever it is asked.
    for (i, b) in bytes.into_iter().enumerate() {
        let media_type = if nodes[i].index {
            media::OCI_INDEX
        } else {
            media::OCI_MANIFEST
        };
        let m = RawManifest {
            bytes: b.into(),
            digest: node_digest(i),
            media_type: media_type.to_string(),
        };
        store.add_manifest("r", Some(&format!("t{i}")), m);
    }

    let filter = input
        .filter
        .map(|arm| vec![if arm { "linux/arm64" } else { "linux/amd64" }.to_string()]);
    let budget = Budget::default();
    let mut graphs = Vec::new();
    for t in input.tops.iter().take(4) {
        let tag = Reference::Tag(format!("t{}", usize::from(*t) % count));
        let walked =
            runtime().block_on(copy::resolve(&store, "r", &tag, filter.as_deref(), &budget));
        let Ok(g) = walked else { continue };
        assert!(
            g.children.len() < copy::MAX_MANIFESTS,
            "{} manifests",
            g.children.len() + 1
        );
        assert!(g.blobs.len() <= copy::MAX_BLOBS);
        let unique: BTreeSet<&Digest> = g.blobs.iter().map(|b| &b.digest).collect();
        assert_eq!(unique.len(), g.blobs.len(), "a blob twice in one graph");
        assert!(g.blobs.iter().all(|b| b.size <= MAX_SIZE));
        assert!(
            g.total_size() <= MAX_SIZE,
            "a graph of {} bytes",
            g.total_size()
        );
        graphs.push(g);
    }
    let Ok(totals) = copy::totals(graphs.iter(), &BTreeSet::new()) else {
        return;
    };
    assert!(totals.bytes <= MAX_SIZE);
    assert_eq!(totals.bytes, totals.blobs.values().sum::<u64>());

    // The bundle layout of what was accepted: regions in order, apart, inside the file.
    let mut blobs: Vec<(Digest, u64)> = totals.blobs.iter().map(|(d, s)| (d.clone(), *s)).collect();
    for g in &graphs {
        blobs.extend(
            g.manifests()
                .map(|m| (m.digest.clone(), m.bytes.len() as u64)),
        );
    }
    let files = [("index.json".to_string(), b"{}".to_vec())];
    let plan = Entries {
        files: &files,
        blobs: &blobs,
        tools: &[],
        mtime: 0,
        checksums: b"sums",
        signature: None,
    };
    if let Ok(layout) = TarLayout::new(std::path::Path::new("fuzz.tar"), &plan) {
        let mut end = 0u64;
        for (_, offset, size) in layout.regions() {
            assert!(offset >= end + 512, "regions overlap");
            end = offset + size;
        }
        assert!(end <= layout.len() && layout.len() <= MAX_SIZE);
    }

    // A dry run of the copy into an empty store: decides, never panics (on graphs of a few
    // dozen manifests: larger ones take the same paths, only slower).
    if graphs.iter().map(|g| g.children.len()).sum::<usize>() > 64 {
        return;
    }
    let sink = MemoryStore::new("sink");
    let items: Vec<Item> = graphs
        .iter()
        .map(|g| Item {
            graph: g,
            repo: "s".into(),
            reference: g.reference.clone(),
        })
        .collect();
    let none = BTreeSet::new();
    let opts = Options {
        jobs: 3,
        omitted: &none,
        omitted_policy: Omitted::Require,
        dry_run: true,
        on_bytes: std::sync::Arc::new(|_| {}),
    };
    let _ = runtime().block_on(copy::transfer(&store, &sink, &items, &opts));
});
