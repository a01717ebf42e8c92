//! `diff OLD NEW`: what the person who approves a transfer must read, from the heads of two
//! bundles (or the manifest files `inspect --manifest` writes): the chart version and
//! appVersion; images added, removed, re-tagged or changed, per platform; the blobs NEW has
//! that OLD's site lacks (what `build --since OLD` carries) and their bytes; CRDs added,
//! removed or changed, down to the fields of their schemas ([`crds`]); the chart's
//! `values.yaml` defaults ([`values`]); the upstream cosign signatures and attestations carried
//! (`build --with-signatures`): added, removed, changed; each side's signer. Pure: the caller reads the heads
//! (and checks them); [`render`] writes the report as a table or Markdown.

pub mod crds;
pub mod render;
pub mod values;

use super::manifest::{ImageRecord, PlatformManifest, SignatureRecord};
use super::BundleManifest;
use crate::oci::Digest;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// What a side was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum InputKind {
    /// A bundle file.
    Bundle,
    /// A part of a split set.
    SplitSet,
    /// The bundle manifest alone (`inspect --manifest`).
    ManifestFile,
}

/// A side's signature, as far as it was checked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Signature {
    /// The bundle carries a signature.
    pub signed: bool,
    /// The key that signed it (from the signature itself).
    pub key_id: Option<String>,
    /// `Some(true)`: verified with the key given; `Some(false)`: it did not verify (see
    /// `reason`); `None`: not checked (no key given, or a manifest file).
    pub verified: Option<bool>,
    /// Why it did not verify, or why it was not checked.
    pub reason: Option<String>,
}

/// One side of the comparison: what was read of a bundle's head (checked against its
/// `SHA256SUMS`), or of a manifest file.
#[derive(Debug, Clone)]
pub struct Side {
    /// The path given.
    pub input: String,
    /// What it is.
    pub kind: InputKind,
    /// Its bundle manifest.
    pub manifest: BundleManifest,
    /// sha256 of its `koord-bundle.json` (the bundle's identity).
    pub manifest_digest: Digest,
    /// Its CRD files by path (`crds/...`); `None` for a manifest file.
    pub crd_files: Option<BTreeMap<String, Vec<u8>>>,
    /// Its chart's `values.yaml`; `None` for a manifest file.
    pub values: Option<serde_yaml_ng::Value>,
    /// Its signature.
    pub signature: Signature,
}

/// A side as the report names it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SideSummary {
    /// The path given.
    pub input: String,
    /// What it is.
    pub kind: InputKind,
    /// Chart name and version.
    pub chart: String,
    /// Creation time.
    pub created: String,
    /// sha256 of its `koord-bundle.json`.
    pub manifest_digest: Digest,
    /// Its signature.
    pub signature: Signature,
}

/// Old and new of one value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change<T> {
    /// Before.
    pub old: T,
    /// After.
    pub new: T,
}

/// The chart.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChartChange {
    /// Name (of NEW).
    pub name: String,
    /// Version.
    pub version: Change<String>,
    /// appVersion.
    pub app_version: Change<Option<String>>,
    /// sha256 of the archive.
    pub digest: Change<Digest>,
}

/// One image on one side.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageEntry {
    /// `repository:tag`.
    #[serde(rename = "ref")]
    pub ref_name: String,
    /// Top manifest digest.
    pub digest: Digest,
    /// Its platforms.
    pub platforms: Vec<String>,
}

/// A platform of an image present on either side.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlatformChange {
    /// `linux/amd64`.
    pub platform: String,
    /// `added`, `removed`, `changed`, `unchanged`, or `unknown` (a side records no
    /// per-platform digests: written by an older koord-bundle).
    pub change: &'static str,
    /// Its manifest digest in OLD.
    pub old: Option<Digest>,
    /// Its manifest digest in NEW.
    pub new: Option<Digest>,
}

/// An image in both bundles (the same ref, or the same repository under another tag) whose
/// digest or tag changed.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageChange {
    /// Repository path.
    pub repository: String,
    /// Tag.
    pub tag: Change<String>,
    /// Top manifest digest.
    pub digest: Change<Digest>,
    /// Per platform.
    pub platforms: Vec<PlatformChange>,
}

/// The images.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageChanges {
    /// In NEW only.
    pub added: Vec<ImageEntry>,
    /// In OLD only.
    pub removed: Vec<ImageEntry>,
    /// The same repository under another tag.
    pub retagged: Vec<ImageChange>,
    /// The same ref, another digest.
    pub changed: Vec<ImageChange>,
    /// The same ref and digest.
    pub unchanged: usize,
}

/// An upstream cosign signature or attestation manifest a side carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SignatureEntry {
    /// The image that carries it (`repository:tag`).
    pub image: String,
    /// `signature` or `attestation`.
    pub kind: String,
    /// Its tag (`repository:sha256-<hex>.sig`).
    #[serde(rename = "ref")]
    pub ref_name: String,
    /// The manifest it signs.
    pub signs: Digest,
    /// Its manifest's digest.
    pub digest: Digest,
    /// How many signatures (attestations) it holds.
    pub layers: usize,
    /// The key (sha256 of its DER) it was verified against at build; `None`: carried unchecked.
    pub verified_with: Option<Digest>,
}

/// A signature or attestation tag both sides carry, with another manifest or another check.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SignatureChange {
    /// The image that carries it in NEW.
    pub image: String,
    /// `signature` or `attestation`.
    pub kind: String,
    /// Its tag.
    #[serde(rename = "ref")]
    pub ref_name: String,
    /// The manifest it signs.
    pub signs: Digest,
    /// Its manifest's digest.
    pub digest: Change<Digest>,
    /// How many signatures it holds.
    pub layers: Change<usize>,
    /// The key it was verified against at build.
    pub verified_with: Change<Option<Digest>>,
}

/// The upstream signatures and attestations carried (`build --with-signatures`), matched by
/// tag (which names the digest signed and the kind).
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SignatureChanges {
    /// In NEW only.
    pub added: Vec<SignatureEntry>,
    /// In OLD only.
    pub removed: Vec<SignatureEntry>,
    /// The same tag, another manifest or verified otherwise.
    pub changed: Vec<SignatureChange>,
    /// The same tag, manifest and key.
    pub unchanged: usize,
}

/// What must cross: the blobs NEW's layout needs that OLD's site does not hold (what
/// `build --since OLD` carries), plus NEW's manifests (always carried).
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Transfer {
    /// Blobs (configs, layers, manifests).
    pub blobs: usize,
    /// Of which manifests.
    pub manifests: usize,
    /// Their bytes; `None` when NEW records no blob sizes (written by an older koord-bundle).
    pub bytes: Option<u64>,
    /// Blobs NEW needs but leaves out (an incremental bundle) that OLD's site lacks too.
    pub missing: Vec<Digest>,
    /// Blobs NEW needs that OLD's site already holds.
    pub on_site: usize,
}

/// The whole comparison.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// OLD.
    pub old: SideSummary,
    /// NEW.
    pub new: SideSummary,
    /// The chart.
    pub chart: ChartChange,
    /// The images.
    pub images: ImageChanges,
    /// The upstream signatures and attestations carried.
    pub signatures: SignatureChanges,
    /// The bytes to carry.
    pub transfer: Transfer,
    /// The CRDs.
    pub crds: crds::CrdChanges,
    /// The values defaults.
    pub values: values::ValueChanges,
    /// What can break existing objects or needs a look, one line each.
    pub warnings: Vec<String>,
    /// The references `load` pins NEW's images to (`REF@<index digest>`, under the target
    /// registry): what an upgrade to NEW runs.
    pub pins: Vec<String>,
}

fn summary(s: &Side) -> SideSummary {
    SideSummary {
        input: s.input.clone(),
        kind: s.kind,
        chart: format!("{} {}", s.manifest.chart.name, s.manifest.chart.version),
        created: s.manifest.created.clone(),
        manifest_digest: s.manifest_digest.clone(),
        signature: s.signature.clone(),
    }
}

/// Compare two sides.
pub fn compare(old: &Side, new: &Side) -> Report {
    let (o, n) = (&old.manifest, &new.manifest);
    let crds = crds::compare(old, new);
    let values = values::compare(old.values.as_ref(), new.values.as_ref());
    let mut warnings = crds.warnings();
    for (s, name) in [(old, "OLD"), (new, "NEW")] {
        match (&s.signature, s.kind) {
            (_, InputKind::ManifestFile) => {}
            (sig, _) if !sig.signed => warnings.push(format!("{name} ({}) is not signed", s.input)),
            (sig, _) if sig.verified == Some(false) => warnings.push(format!(
                "{name} ({}): its signature does not verify with the key given: {}",
                s.input,
                sig.reason.as_deref().unwrap_or("")
            )),
            _ => {}
        }
    }
    let signatures = signatures(o, n);
    warnings.extend(signatures.warnings());
    Report {
        old: summary(old),
        new: summary(new),
        chart: ChartChange {
            name: n.chart.name.clone(),
            version: Change {
                old: o.chart.version.clone(),
                new: n.chart.version.clone(),
            },
            app_version: Change {
                old: o.chart.app_version.clone(),
                new: n.chart.app_version.clone(),
            },
            digest: Change {
                old: o.chart.digest.clone(),
                new: n.chart.digest.clone(),
            },
        },
        images: images(o, n),
        signatures,
        transfer: transfer(o, n),
        crds,
        values,
        warnings,
        pins: n
            .images
            .iter()
            .map(|i| crate::oci::pinned(&i.ref_name, i.digest.as_str()))
            .collect(),
    }
}

fn entry(i: &ImageRecord) -> ImageEntry {
    ImageEntry {
        ref_name: i.ref_name.clone(),
        digest: i.digest.clone(),
        platforms: i.platforms.clone(),
    }
}

/// The image manifests of an image by platform (attestations left out).
fn by_platform(i: &ImageRecord) -> BTreeMap<String, &PlatformManifest> {
    i.manifests
        .iter()
        .filter(|m| m.attestation_of.is_none())
        .filter(|m| m.platform.as_deref() != Some("unknown/unknown"))
        .map(|m| (m.platform.clone().unwrap_or_else(|| "unknown".into()), m))
        .collect()
}

/// Per platform: by manifest digest when both sides record them, else by name only.
fn platforms(o: &ImageRecord, n: &ImageRecord) -> Vec<PlatformChange> {
    let (po, pn) = (by_platform(o), by_platform(n));
    let known = !o.manifests.is_empty() && !n.manifests.is_empty();
    let names: BTreeSet<String> = if known {
        po.keys().chain(pn.keys()).cloned().collect()
    } else {
        o.platforms.iter().chain(&n.platforms).cloned().collect()
    };
    names
        .into_iter()
        .map(|p| {
            let (od, nd) = (
                po.get(&p).map(|m| m.digest.clone()),
                pn.get(&p).map(|m| m.digest.clone()),
            );
            let (in_o, in_n) = if known {
                (od.is_some(), nd.is_some())
            } else {
                (o.platforms.contains(&p), n.platforms.contains(&p))
            };
            let change = match (in_o, in_n) {
                (false, _) => "added",
                (_, false) => "removed",
                _ if !known => "unknown",
                _ if od == nd => "unchanged",
                _ => "changed",
            };
            PlatformChange {
                platform: p,
                change,
                old: od,
                new: nd,
            }
        })
        .collect()
}

fn change(o: &ImageRecord, n: &ImageRecord) -> ImageChange {
    ImageChange {
        repository: n.repository.clone(),
        tag: Change {
            old: o.tag.clone(),
            new: n.tag.clone(),
        },
        digest: Change {
            old: o.digest.clone(),
            new: n.digest.clone(),
        },
        platforms: platforms(o, n),
    }
}

/// Images matched by ref; what is left, by repository when each side has exactly one image
/// of it (a re-tag); the rest added or removed.
fn images(o: &BundleManifest, n: &BundleManifest) -> ImageChanges {
    let mut out = ImageChanges::default();
    let old_refs: BTreeMap<&str, &ImageRecord> =
        o.images.iter().map(|i| (i.ref_name.as_str(), i)).collect();
    let new_refs: BTreeMap<&str, &ImageRecord> =
        n.images.iter().map(|i| (i.ref_name.as_str(), i)).collect();
    let mut old_left: BTreeMap<&str, Vec<&ImageRecord>> = BTreeMap::new();
    let mut new_left: BTreeMap<&str, Vec<&ImageRecord>> = BTreeMap::new();
    for (r, oi) in &old_refs {
        match new_refs.get(r) {
            Some(ni) if ni.digest == oi.digest => out.unchanged += 1,
            Some(ni) => out.changed.push(change(oi, ni)),
            None => old_left.entry(&oi.repository).or_default().push(oi),
        }
    }
    for (r, ni) in &new_refs {
        if !old_refs.contains_key(r) {
            new_left.entry(&ni.repository).or_default().push(ni);
        }
    }
    for (repo, olds) in &old_left {
        match (olds.as_slice(), new_left.get(repo).map(Vec::as_slice)) {
            ([oi], Some([ni])) => out.retagged.push(change(oi, ni)),
            _ => out.removed.extend(olds.iter().map(|i| entry(i))),
        }
    }
    for (repo, news) in &new_left {
        let retag = matches!(
            (old_left.get(repo).map(Vec::as_slice), news.as_slice()),
            (Some([_]), [_])
        );
        if !retag {
            out.added.extend(news.iter().map(|i| entry(i)));
        }
    }
    out
}

/// Every signature record of a manifest by its tag, with the image that carries it (the first,
/// when two tags of one repository share a digest).
fn signature_records(m: &BundleManifest) -> BTreeMap<&str, (&ImageRecord, &SignatureRecord)> {
    let mut out = BTreeMap::new();
    for i in &m.images {
        for s in &i.signatures {
            out.entry(s.ref_name.as_str()).or_insert((i, s));
        }
    }
    out
}

fn signature_entry(i: &ImageRecord, s: &SignatureRecord) -> SignatureEntry {
    SignatureEntry {
        image: i.ref_name.clone(),
        kind: s.kind.clone(),
        ref_name: s.ref_name.clone(),
        signs: s.signs.clone(),
        digest: s.digest.clone(),
        layers: s.layers,
        verified_with: s.verified_with.clone(),
    }
}

/// Signatures matched by tag.
fn signatures(o: &BundleManifest, n: &BundleManifest) -> SignatureChanges {
    let (so, sn) = (signature_records(o), signature_records(n));
    let mut out = SignatureChanges::default();
    for (r, (oi, os)) in &so {
        match sn.get(r) {
            None => out.removed.push(signature_entry(oi, os)),
            Some((_, ns)) if ns.digest == os.digest && ns.verified_with == os.verified_with => {
                out.unchanged += 1
            }
            Some((ni, ns)) => out.changed.push(SignatureChange {
                image: ni.ref_name.clone(),
                kind: ns.kind.clone(),
                ref_name: ns.ref_name.clone(),
                signs: ns.signs.clone(),
                digest: Change {
                    old: os.digest.clone(),
                    new: ns.digest.clone(),
                },
                layers: Change {
                    old: os.layers,
                    new: ns.layers,
                },
                verified_with: Change {
                    old: os.verified_with.clone(),
                    new: ns.verified_with.clone(),
                },
            }),
        }
    }
    for (r, (ni, ns)) in &sn {
        if !so.contains_key(r) {
            out.added.push(signature_entry(ni, ns));
        }
    }
    out
}

impl SignatureChanges {
    /// What an approver must not miss: signatures NEW no longer carries, and signatures OLD
    /// had verified at build that NEW carries unchecked or checked against another key.
    fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        let gone: Vec<&str> = self
            .removed
            .iter()
            .filter(|s| s.kind == "signature")
            .map(|s| s.ref_name.as_str())
            .collect();
        if !gone.is_empty() {
            w.push(format!(
                "NEW no longer carries {} upstream {} OLD carried (a policy naming the upstream key refuses those images at the site unless they are signed there): {}",
                gone.len(),
                crate::text::plural(gone.len(), "signature", "signatures"),
                gone.join(", ")
            ));
        }
        let weaker: Vec<String> = self
            .changed
            .iter()
            .filter(|c| c.verified_with.old.is_some() && c.verified_with.new != c.verified_with.old)
            .map(|c| match &c.verified_with.new {
                None => format!("{} (now NOT verified)", c.ref_name),
                Some(k) => format!("{} (now verified against another key, {k})", c.ref_name),
            })
            .collect();
        if !weaker.is_empty() {
            w.push(format!(
                "{} upstream {} verified at build in OLD {} not verified against the same key in NEW (build NEW with --verify-key and the same key): {}",
                weaker.len(),
                crate::text::plural(weaker.len(), "signature", "signatures"),
                crate::text::plural(weaker.len(), "is", "are"),
                weaker.join(", ")
            ));
        }
        w
    }
}

/// The blobs NEW needs that OLD's site lacks, plus NEW's manifests, as `build --since OLD`
/// carries them.
fn transfer(o: &BundleManifest, n: &BundleManifest) -> Transfer {
    let on_site = o.blobs_on_site();
    let manifests: BTreeSet<&Digest> = n
        .images
        .iter()
        .flat_map(|i| std::iter::once(&i.digest).chain(i.manifests.iter().map(|m| &m.digest)))
        .chain([&n.chart.oci.digest])
        .collect();
    let omitted: BTreeMap<&Digest, u64> = n
        .omitted_blobs
        .iter()
        .map(|b| (&b.digest, b.size))
        .collect();
    let mut t = Transfer::default();
    let mut bytes = Some(0u64);
    let needed: BTreeSet<&Digest> = n.blob_list.iter().chain(omitted.keys().copied()).collect();
    for d in needed {
        let is_manifest = manifests.contains(d);
        if on_site.contains(d) && !is_manifest {
            t.on_site += 1;
            continue;
        }
        if omitted.contains_key(d) && !is_manifest {
            t.missing.push(d.clone());
            continue;
        }
        t.blobs += 1;
        t.manifests += usize::from(is_manifest);
        bytes = match (bytes, n.blob_sizes.get(d)) {
            (Some(b), Some(s)) => Some(b.saturating_add(*s)),
            _ => None,
        };
    }
    t.bytes = bytes;
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn d(s: &str) -> String {
        Digest::of(s.as_bytes()).to_string()
    }

    fn image(repo: &str, tag: &str, top: &str, plats: &[(&str, &str)]) -> serde_json::Value {
        json!({
            "ref": format!("{repo}:{tag}"), "component": "c", "repository": repo, "tag": tag,
            "original": "o", "source": "s", "sourceRef": format!("r/{repo}:{tag}"),
            "digest": d(top), "upstreamDigest": d(top), "mediaType": "m", "size": 1,
            "platforms": plats.iter().map(|p| p.0).collect::<Vec<_>>(), "attestations": 0, "totalSize": 1,
            "manifests": plats.iter().map(|(p, m)| json!({"platform": p, "digest": d(m), "mediaType": "m", "size": 1})).collect::<Vec<_>>(),
        })
    }

    fn manifest(images: Vec<serde_json::Value>, blobs: &[(&str, u64)]) -> BundleManifest {
        let list: Vec<String> = blobs.iter().map(|(b, _)| d(b)).collect();
        let sizes: serde_json::Map<String, serde_json::Value> =
            blobs.iter().map(|(b, s)| (d(b), json!(s))).collect();
        serde_json::from_value(json!({
            "formatVersion": "koord-bundle/v1", "tool": {"name": "k", "version": "0"},
            "created": "2025-01-01T00:00:00Z",
            "chart": {"name": "koordinator", "version": "1.0.0", "appVersion": null, "digest": d("chart"),
                      "file": "charts/c.tgz", "url": null, "indexDigest": null, "digestMismatchAllowed": false,
                      "oci": {"ref": "charts/koordinator:1.0.0", "digest": d("chartoci"), "mediaType": "m", "size": 1}},
            "images": images, "crds": [], "sources": [], "overrides": {"valuesFiles": [], "setKeys": [], "extraImages": []},
            "blobs": {"count": list.len(), "bytes": 0}, "blobList": list, "blobSizes": sizes,
        }))
        .unwrap()
    }

    #[test]
    fn images_matched_by_ref_then_by_repository() {
        let o = manifest(
            vec![
                image("a/same", "v1", "s", &[("linux/amd64", "s1")]),
                image(
                    "a/changed",
                    "v1",
                    "c1",
                    &[("linux/amd64", "c1a"), ("linux/arm64", "c1b")],
                ),
                image("a/retag", "v1", "r1", &[("linux/amd64", "r1a")]),
                image("a/gone", "v1", "g", &[("linux/amd64", "g1")]),
            ],
            &[],
        );
        let n = manifest(
            vec![
                image("a/same", "v1", "s", &[("linux/amd64", "s1")]),
                image(
                    "a/changed",
                    "v1",
                    "c2",
                    &[("linux/amd64", "c1a"), ("linux/s390x", "c2c")],
                ),
                image("a/retag", "v2", "r2", &[("linux/amd64", "r2a")]),
                image("a/new", "v1", "n", &[("linux/amd64", "n1")]),
            ],
            &[],
        );
        let i = images(&o, &n);
        assert_eq!(i.unchanged, 1);
        assert_eq!(i.added.len(), 1);
        assert_eq!(i.added[0].ref_name, "a/new:v1");
        assert_eq!(i.removed[0].ref_name, "a/gone:v1");
        assert_eq!(i.retagged.len(), 1);
        assert_eq!(
            (
                i.retagged[0].tag.old.as_str(),
                i.retagged[0].tag.new.as_str()
            ),
            ("v1", "v2")
        );
        let c = &i.changed[0];
        let p: Vec<(&str, &str)> = c
            .platforms
            .iter()
            .map(|p| (p.platform.as_str(), p.change))
            .collect();
        assert_eq!(
            p,
            [
                ("linux/amd64", "unchanged"),
                ("linux/arm64", "removed"),
                ("linux/s390x", "added")
            ]
        );
    }

    #[test]
    fn transfer_is_what_the_site_lacks_plus_manifests() {
        let o = manifest(
            vec![image("a/x", "v1", "t1", &[("linux/amd64", "m1")])],
            &[("t1", 10), ("m1", 20), ("layer", 1000), ("old", 5)],
        );
        let n = manifest(
            vec![image("a/x", "v2", "t2", &[("linux/amd64", "m1")])],
            &[("t2", 11), ("m1", 20), ("layer", 1000), ("new", 300)],
        );
        let t = transfer(&o, &n);
        // t2 (new top manifest), m1 (a manifest: always carried), new (a layer the site lacks);
        // `layer` is on the site.
        assert_eq!((t.blobs, t.manifests, t.on_site), (3, 2, 1));
        assert_eq!(t.bytes, Some(11 + 20 + 300));
        // Without sizes (an older NEW): bytes unknown.
        let mut n2 = n.clone();
        n2.blob_sizes.clear();
        assert_eq!(transfer(&o, &n2).bytes, None);
    }
}
