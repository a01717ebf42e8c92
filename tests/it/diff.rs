//! Issue 19: `koord-bundle diff OLD NEW` over every consecutive pair of the 21 published chart
//! versions, its CRD findings checked against a computation written here from the charts' own
//! files (untarred, CRDs read as YAML), its image findings against real `helm template` and
//! the test environment's image list, its values findings on a few pairs, its byte count
//! against what a real `build --since OLD` carries; and its inputs: split parts, manifest
//! files, keys, and what it refuses.

use crate::common::{
    assert_fails, assert_ok, bundle_manifest, env, fixtures, helm_images, versions, Home,
};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

// --- An independent reading of the charts' CRDs ------------------------------------------

/// One field: required, and its enum values.
#[derive(Debug, Clone, PartialEq)]
struct F {
    required: bool,
    enums: Option<BTreeSet<String>>,
}

#[derive(Debug, Clone)]
struct V {
    served: bool,
    storage: bool,
    /// Field path → field; empty without a schema.
    fields: BTreeMap<String, F>,
}

/// The files of a chart archive, by path inside it.
fn chart_files(version: &str) -> BTreeMap<String, String> {
    let f = std::fs::File::open(fixtures().join(format!("koordinator-{version}.tgz"))).unwrap();
    let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(f));
    let mut out = BTreeMap::new();
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let p = e.path().unwrap().to_string_lossy().to_string();
        let mut s = String::new();
        if std::io::Read::read_to_string(&mut e, &mut s).is_ok() {
            out.insert(p, s);
        }
    }
    out
}

fn enum_text(v: &serde_yaml_ng::Value) -> String {
    match v {
        serde_yaml_ng::Value::String(s) => s.clone(),
        other => serde_yaml_ng::to_string(other).unwrap().trim().to_string(),
    }
}

/// Every field of a schema, walked with a work list: `a.b`, `a[]` for items, `a.*` for map
/// values.
fn schema_fields(root: &serde_yaml_ng::Value) -> BTreeMap<String, F> {
    let mut out = BTreeMap::new();
    let mut todo = vec![(String::new(), root.clone(), false)];
    while let Some((path, node, required)) = todo.pop() {
        if !path.is_empty() {
            let enums = node["enum"]
                .as_sequence()
                .map(|s| s.iter().map(enum_text).collect());
            out.insert(path.clone(), F { required, enums });
        }
        let req: Vec<String> = node["required"]
            .as_sequence()
            .map(|s| {
                s.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let prefix = if path.is_empty() {
            String::new()
        } else {
            format!("{path}.")
        };
        if let Some(props) = node["properties"].as_mapping() {
            for (k, v) in props {
                let k = k.as_str().unwrap().to_string();
                todo.push((format!("{prefix}{k}"), v.clone(), req.contains(&k)));
            }
        }
        if node["items"].is_mapping() {
            todo.push((format!("{path}[]"), node["items"].clone(), false));
        }
        if node["additionalProperties"].is_mapping() {
            todo.push((
                format!("{prefix}*"),
                node["additionalProperties"].clone(),
                false,
            ));
        }
    }
    out
}

/// The CRDs a chart ships, by name: template lines of actions dropped, then YAML.
fn chart_crds(version: &str) -> BTreeMap<String, BTreeMap<String, V>> {
    let mut out = BTreeMap::new();
    for (path, text) in chart_files(version) {
        let in_chart = path.contains("/templates/") || path.contains("/crds/");
        if !in_chart || !path.ends_with(".yaml") || !text.contains("kind: CustomResourceDefinition")
        {
            continue;
        }
        let plain: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("{{"))
            .map(|l| format!("{l}\n"))
            .collect();
        for doc in plain.split("\n---") {
            let Ok(y) = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(doc) else {
                continue;
            };
            if y["kind"].as_str() != Some("CustomResourceDefinition") {
                continue;
            }
            let name = y["metadata"]["name"].as_str().unwrap().to_string();
            let mut vs = BTreeMap::new();
            for v in y["spec"]["versions"].as_sequence().unwrap() {
                let schema = &v["schema"]["openAPIV3Schema"];
                vs.insert(
                    v["name"].as_str().unwrap().to_string(),
                    V {
                        served: v["served"].as_bool() == Some(true),
                        storage: v["storage"].as_bool() == Some(true),
                        fields: if schema.is_mapping() {
                            schema_fields(schema)
                        } else {
                            BTreeMap::new()
                        },
                    },
                );
            }
            out.insert(name, vs);
        }
    }
    out
}

fn parent(p: &str) -> Option<&str> {
    p.rfind(['.', '[']).map(|i| &p[..i])
}

/// Paths of `set` none of whose ancestors is in `set`.
fn top(set: &BTreeSet<String>) -> Vec<String> {
    set.iter()
        .filter(|p| {
            let mut cur = p.as_str();
            while let Some(q) = parent(cur) {
                if set.contains(q) {
                    return false;
                }
                cur = q;
            }
            true
        })
        .cloned()
        .collect()
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|x| x.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// The findings expected for a CRD in both charts, as `diff --json` reports them (only what
/// changed): versions added/removed, stored version, and per version the fields.
fn expected_crd_change(o: &BTreeMap<String, V>, n: &BTreeMap<String, V>) -> Value {
    let (ko, kn): (BTreeSet<&String>, BTreeSet<&String>) = (o.keys().collect(), n.keys().collect());
    let stored =
        |m: &BTreeMap<String, V>| m.iter().find(|(_, v)| v.storage).map(|(k, _)| k.clone());
    let mut schema = Vec::new();
    for (ver, vo) in o {
        let Some(vn) = n.get(ver) else { continue };
        let po: BTreeSet<String> = vo.fields.keys().cloned().collect();
        let pn: BTreeSet<String> = vn.fields.keys().cloned().collect();
        let added = top(&pn.difference(&po).cloned().collect());
        let removed = top(&po.difference(&pn).cloned().collect());
        let newly_required: Vec<String> = vn
            .fields
            .iter()
            .filter(|(p, f)| {
                f.required
                    && !vo.fields.get(*p).is_some_and(|x| x.required)
                    && (vo.fields.contains_key(*p)
                        || parent(p).is_none_or(|q| q.is_empty() || vo.fields.contains_key(q)))
            })
            .map(|(p, _)| p.clone())
            .collect();
        let mut enum_removed = Vec::new();
        for (p, fo) in &vo.fields {
            if let (Some(a), Some(b)) = (&fo.enums, vn.fields.get(p).and_then(|f| f.enums.as_ref()))
            {
                let gone: Vec<String> = a.difference(b).cloned().collect();
                if !gone.is_empty() {
                    enum_removed.push(serde_json::json!({"path": p, "values": gone}));
                }
            }
        }
        if !(added.is_empty()
            && removed.is_empty()
            && newly_required.is_empty()
            && enum_removed.is_empty())
        {
            schema.push(
                serde_json::json!({"version": ver, "fieldsAdded": added, "fieldsRemoved": removed,
                "newlyRequired": newly_required, "enumValuesRemoved": enum_removed}),
            );
        }
    }
    serde_json::json!({
        "versionsAdded": kn.difference(&ko).collect::<Vec<_>>(),
        "versionsRemoved": ko.difference(&kn).collect::<Vec<_>>(),
        "storage": match (stored(o), stored(n)) {
            (Some(a), Some(b)) if a != b => serde_json::json!({"old": a, "new": b}),
            _ => Value::Null,
        },
        "schema": schema,
    })
}

/// What `diff` reported for a changed CRD, in the shape of [`expected_crd_change`] (schema
/// entries with only type or enum-added findings left out).
fn reported_crd_change(c: &Value) -> Value {
    let schema: Vec<Value> = c["schema"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            serde_json::json!({"version": v["version"], "fieldsAdded": v["fieldsAdded"], "fieldsRemoved": v["fieldsRemoved"],
                "newlyRequired": v["newlyRequired"], "enumValuesRemoved": v["enumValuesRemoved"]})
        })
        .filter(|v| {
            ["fieldsAdded", "fieldsRemoved", "newlyRequired", "enumValuesRemoved"]
                .iter()
                .any(|k| !v[k].as_array().unwrap().is_empty())
        })
        .collect();
    serde_json::json!({"versionsAdded": c["versionsAdded"], "versionsRemoved": c["versionsRemoved"],
        "storage": c["storage"], "schema": schema})
}

fn check_crds(pair: &str, old: &str, new: &str, d: &Value) {
    let (co, cn) = (chart_crds(old), chart_crds(new));
    let names = |v: &Value| -> BTreeSet<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect()
    };
    let want_added: BTreeSet<String> = cn
        .keys()
        .filter(|k| !co.contains_key(*k))
        .cloned()
        .collect();
    let want_removed: BTreeSet<String> = co
        .keys()
        .filter(|k| !cn.contains_key(*k))
        .cloned()
        .collect();
    assert_eq!(names(&d["crds"]["added"]), want_added, "{pair}: CRDs added");
    assert_eq!(
        names(&d["crds"]["removed"]),
        want_removed,
        "{pair}: CRDs removed"
    );
    let changed: BTreeMap<String, &Value> = d["crds"]["changed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap().to_string(), c))
        .collect();
    let warnings = d["warnings"].to_string();
    for (name, vo) in &co {
        let Some(vn) = cn.get(name) else { continue };
        let want = expected_crd_change(vo, vn);
        let empty = want["versionsAdded"].as_array().unwrap().is_empty()
            && want["versionsRemoved"].as_array().unwrap().is_empty()
            && want["storage"].is_null()
            && want["schema"].as_array().unwrap().is_empty();
        match changed.get(name) {
            Some(c) => assert_eq!(reported_crd_change(c), want, "{pair}: CRD {name}"),
            None => assert!(
                empty,
                "{pair}: CRD {name} changed but diff says it did not: {want}"
            ),
        }
        // Served versions no longer served.
        let gone: Vec<&String> = vo
            .iter()
            .filter(|(k, v)| v.served && vn.get(*k).is_some_and(|x| !x.served))
            .map(|(k, _)| k)
            .collect();
        if let Some(c) = changed.get(name) {
            assert_eq!(
                strs(&c["noLongerServed"]).iter().collect::<Vec<_>>(),
                gone,
                "{pair}: {name}"
            );
        }
        // Whatever can break existing objects is warned about, naming the CRD.
        for s in want["schema"].as_array().unwrap() {
            let breaking = ["fieldsRemoved", "newlyRequired", "enumValuesRemoved"]
                .iter()
                .any(|k| !s[k].as_array().unwrap().is_empty());
            if breaking {
                assert!(
                    warnings.contains(&format!("CRD {name}: {}", s["version"].as_str().unwrap())),
                    "{pair}: no warning for {name}: {warnings}"
                );
            }
        }
        for v in strs(&want["versionsRemoved"]) {
            if vo[&v].served {
                assert!(
                    warnings.contains(&format!("CRD {name}: version {v} is removed")),
                    "{pair}: {warnings}"
                );
            }
        }
    }
}

// --- Images: real helm template and the environment's image list ------------------------

/// repository → tag of the images real helm renders from a chart, the registry host cut.
fn chart_images(version: &str) -> BTreeMap<String, String> {
    helm_images(&env().helm3, version, &[])
        .into_iter()
        .map(|r| {
            let (name, tag) = r.rsplit_once(':').unwrap();
            let repo = match name.split_once('/') {
                Some((host, rest))
                    if host.contains('.') || host.contains(':') || host == "localhost" =>
                {
                    rest
                }
                _ => name,
            };
            (repo.to_string(), tag.to_string())
        })
        .collect()
}

/// platform → manifest digest of a pushed test image (attestations left out).
fn pushed_platforms(repo: &str, tag: &str) -> BTreeMap<String, String> {
    let img = env()
        .images
        .iter()
        .find(|i| i["repository"] == repo && i["tag"] == tag)
        .unwrap_or_else(|| panic!("{repo}:{tag} not in images.json"));
    img["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| {
            let p = m["platform"].as_str()?;
            (p != "unknown/unknown")
                .then(|| (p.to_string(), m["digest"].as_str().unwrap().to_string()))
        })
        .collect()
}

fn check_images(pair: &str, old: &str, new: &str, d: &Value) {
    let (io, inew) = (chart_images(old), chart_images(new));
    // The references an upgrade pins: every image of NEW at its pushed index digest.
    let pins: BTreeSet<String> = d["pins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect();
    let want_pins: BTreeSet<String> = inew
        .iter()
        .map(|(repo, tag)| format!("{repo}:{tag}@{}", crate::common::pushed_digest(repo, tag)))
        .collect();
    assert_eq!(pins, want_pins, "{pair}: pins");
    let refs = |v: &Value| -> BTreeSet<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|i| i["ref"].as_str().unwrap().to_string())
            .collect()
    };
    let want_added: BTreeSet<String> = inew
        .iter()
        .filter(|(r, _)| !io.contains_key(*r))
        .map(|(r, t)| format!("{r}:{t}"))
        .collect();
    let want_removed: BTreeSet<String> = io
        .iter()
        .filter(|(r, _)| !inew.contains_key(*r))
        .map(|(r, t)| format!("{r}:{t}"))
        .collect();
    assert_eq!(
        refs(&d["images"]["added"]),
        want_added,
        "{pair}: images added"
    );
    assert_eq!(
        refs(&d["images"]["removed"]),
        want_removed,
        "{pair}: images removed"
    );
    let mut want_retag = BTreeSet::new();
    let mut unchanged = 0;
    for (r, to) in &io {
        match inew.get(r) {
            Some(tn) if tn != to => {
                want_retag.insert((r.clone(), to.clone(), tn.clone()));
            }
            Some(_) => unchanged += 1,
            None => {}
        }
    }
    let got_retag: BTreeSet<(String, String, String)> = d["images"]["retagged"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["repository"].as_str().unwrap().to_string(),
                c["tag"]["old"].as_str().unwrap().to_string(),
                c["tag"]["new"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(got_retag, want_retag, "{pair}: images re-tagged");
    assert_eq!(d["images"]["unchanged"], unchanged, "{pair}");
    assert_eq!(
        d["images"]["changed"].as_array().unwrap().len(),
        0,
        "{pair}: the same tag is the same image here"
    );
    // Per platform, as the image generator pushed them.
    for c in d["images"]["retagged"].as_array().unwrap() {
        let repo = c["repository"].as_str().unwrap();
        let po = pushed_platforms(repo, c["tag"]["old"].as_str().unwrap());
        let pn = pushed_platforms(repo, c["tag"]["new"].as_str().unwrap());
        let all: BTreeSet<&String> = po.keys().chain(pn.keys()).collect();
        let want: Vec<(String, &str)> = all
            .into_iter()
            .map(|p| {
                let ch = match (po.get(p), pn.get(p)) {
                    (None, _) => "added",
                    (_, None) => "removed",
                    (a, b) if a == b => "unchanged",
                    _ => "changed",
                };
                (p.clone(), ch)
            })
            .collect();
        let got: Vec<(String, &str)> = c["platforms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["platform"].as_str().unwrap().to_string(),
                    p["change"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(got, want, "{pair}: {repo} per platform");
    }
}

// --- Values -----------------------------------------------------------------------------

/// values.yaml of a chart, flattened: path → value; feature-gate strings as `path[Gate]`.
fn chart_values(version: &str) -> BTreeMap<String, Value> {
    let files = chart_files(version);
    let text = &files["koordinator/values.yaml"];
    let y: Value = serde_yaml_ng::from_str(text).unwrap();
    let mut out = BTreeMap::new();
    let mut todo = vec![(String::new(), y)];
    while let Some((p, v)) = todo.pop() {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, x) in m {
                    todo.push((if p.is_empty() { k } else { format!("{p}.{k}") }, x));
                }
            }
            Value::String(s)
                if {
                    let last = p.rsplit('.').next().unwrap().to_lowercase();
                    last.ends_with("featuregates") || last == "features"
                } && s
                    .split(',')
                    .filter(|x| !x.trim().is_empty())
                    .all(|x| x.contains('=')) =>
            {
                for pair in s.split(',').filter(|x| !x.trim().is_empty()) {
                    let (g, val) = pair.split_once('=').unwrap();
                    out.insert(format!("{p}[{}]", g.trim()), Value::from(val.trim()));
                }
            }
            other => {
                out.insert(p, other);
            }
        }
    }
    out
}

fn check_values(pair: &str, old: &str, new: &str, d: &Value) {
    let (vo, vn) = (chart_values(old), chart_values(new));
    let parse = |s: &Value| -> Value { serde_json::from_str(s.as_str().unwrap()).unwrap() };
    let entries = |k: &str, key: &str| -> BTreeMap<String, Value> {
        d["values"][k]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["path"].as_str().unwrap().to_string(), parse(&e[key])))
            .collect()
    };
    let want_added: BTreeMap<String, Value> = vn
        .iter()
        .filter(|(k, _)| !vo.contains_key(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let want_removed: BTreeMap<String, Value> = vo
        .iter()
        .filter(|(k, _)| !vn.contains_key(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let want_changed: BTreeMap<String, (Value, Value)> = vo
        .iter()
        .filter_map(|(k, a)| {
            vn.get(k)
                .filter(|b| *b != a)
                .map(|b| (k.clone(), (a.clone(), b.clone())))
        })
        .collect();
    assert_eq!(
        entries("added", "value"),
        want_added,
        "{pair}: values added"
    );
    assert_eq!(
        entries("removed", "value"),
        want_removed,
        "{pair}: values removed"
    );
    let got_changed: BTreeMap<String, (Value, Value)> = d["values"]["changed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap().to_string(),
                (parse(&e["old"]), parse(&e["new"])),
            )
        })
        .collect();
    assert_eq!(got_changed, want_changed, "{pair}: values changed");
}

fn diff_json(h: &Home, old: &Path, new: &Path, extra: &[&str]) -> Value {
    let mut args = vec![
        "diff",
        old.to_str().unwrap(),
        new.to_str().unwrap(),
        "--json",
    ];
    args.extend(extra);
    let o = h.run(&args);
    assert_ok(&o);
    serde_json::from_slice(&o.stdout).expect("diff --json prints JSON")
}

#[test]
fn diff_of_every_consecutive_chart_version_matches_the_charts_and_helm() {
    let h = Home::with_key();
    let all = versions();
    assert_eq!(all.len(), 21);
    let bundles: Vec<PathBuf> = all.iter().map(|v| h.build_plain(v, &[]).0).collect();
    let key = h.pubkey();
    let mut crd_findings = 0;
    for (i, w) in all.windows(2).enumerate() {
        let (old, new) = (&w[0], &w[1]);
        let pair = format!("{old} → {new}");
        let d = diff_json(
            &h,
            &bundles[i],
            &bundles[i + 1],
            &["--key", key.to_str().unwrap()],
        );
        assert_eq!(d["chart"]["version"]["old"], old.as_str(), "{pair}");
        assert_eq!(d["chart"]["version"]["new"], new.as_str(), "{pair}");
        for side in ["old", "new"] {
            assert_eq!(d[side]["signature"]["verified"], true, "{pair}: {side}");
            assert_eq!(d[side]["kind"], "bundle");
        }
        check_crds(&pair, old, new, &d);
        check_images(&pair, old, new, &d);
        crd_findings += d["crds"]["changed"].as_array().unwrap().len()
            + d["crds"]["added"].as_array().unwrap().len();
        if ["0.4.1", "1.2.0", "1.6.0", "1.7.0"].contains(&old.as_str()) {
            check_values(&pair, old, new, &d);
        }
    }
    assert!(
        crd_findings > 20,
        "the pairs hold CRD changes to check: {crd_findings}"
    );
}

#[test]
fn diff_takes_parts_manifest_files_and_keys_and_refuses_what_is_not_a_bundle() {
    let h = Home::with_key();
    let (old, _) = h.build_plain("1.7.0", &[]);
    let (new, _) = h.build_plain("1.8.0", &[]);
    let whole = diff_json(&h, &old, &new, &[]);
    assert_eq!(
        whole["old"]["signature"]["verified"],
        Value::Null,
        "not checked without --key"
    );
    assert_eq!(whole["old"]["signature"]["signed"], true);

    // What build --since OLD really carries is what diff says must cross.
    let inc = h.path().join("inc.tar");
    let o = h
        .build("1.8.0")
        .out(&inc)
        .args(&["--since", old.to_str().unwrap(), "--json"])
        .run();
    assert_ok(&o);
    let inc_m = bundle_manifest(&inc);
    assert_eq!(
        whole["transfer"]["blobs"], inc_m["blobs"]["count"],
        "blobs build --since carries"
    );
    assert_eq!(
        whole["transfer"]["bytes"], inc_m["blobs"]["bytes"],
        "bytes build --since carries"
    );

    // A part of a split set, any part: the same findings.
    let parts = h.path().join("parts");
    std::fs::create_dir(&parts).unwrap();
    assert_ok(&h.run(&[
        "split",
        new.to_str().unwrap(),
        "--size",
        "256K",
        "--output-dir",
        parts.to_str().unwrap(),
    ]));
    let part = parts.join("koordinator-1.8.0.tar.part002");
    assert!(part.exists());
    let split = diff_json(&h, &old, &part, &[]);
    assert_eq!(split["new"]["kind"], "splitSet");
    for k in ["chart", "images", "transfer", "crds", "values", "warnings"] {
        assert_eq!(split[k], whole[k], "{k}");
    }

    // The manifest file inspect --manifest writes: images and bytes, no schemas or values.
    let mf = h.path().join("old.json");
    assert_ok(&h.run(&[
        "inspect",
        old.to_str().unwrap(),
        "--manifest",
        mf.to_str().unwrap(),
    ]));
    let m = diff_json(&h, &mf, &new, &[]);
    assert_eq!(m["old"]["kind"], "manifestFile");
    assert_eq!(m["images"], whole["images"]);
    assert_eq!(m["transfer"], whole["transfer"]);
    assert!(m["crds"]["note"]
        .as_str()
        .unwrap()
        .contains("not available from a manifest file"));
    assert!(m["values"]["note"]
        .as_str()
        .unwrap()
        .contains("not available from a manifest file"));
    // It still knows which CRDs changed: their files' digests are recorded.
    let names = |v: &Value| -> Vec<String> {
        v["crds"]["changed"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(&m), names(&whole));

    // Keys: the right one verifies both; another one verifies neither, and diff still compares.
    let d = diff_json(&h, &old, &new, &["--key", h.pubkey().to_str().unwrap()]);
    assert_eq!(
        (
            d["old"]["signature"]["verified"].clone(),
            d["new"]["signature"]["verified"].clone()
        ),
        (Value::Bool(true), Value::Bool(true))
    );
    let other = Home::with_key();
    let d = diff_json(&h, &old, &new, &["--key", other.pubkey().to_str().unwrap()]);
    assert_eq!(d["new"]["signature"]["verified"], false);
    assert!(
        d["warnings"].to_string().contains("does not verify"),
        "{}",
        d["warnings"]
    );

    // Markdown and the table.
    let o = h.run(&[
        "diff",
        old.to_str().unwrap(),
        new.to_str().unwrap(),
        "--format",
        "markdown",
    ]);
    assert_ok(&o);
    let md = String::from_utf8_lossy(&o.stdout);
    for s in [
        "## koord-bundle diff: koordinator 1.7.0 → 1.8.0",
        "### Images",
        "### What must cross",
        "### CRDs",
        "### values.yaml defaults",
        "| `koordinator-sh/koordlet` | re-tagged | v1.7.0 → v1.8.0 |",
    ] {
        assert!(md.contains(s), "markdown lacks {s:?}:\n{md}");
    }
    let o = h.run(&["diff", old.to_str().unwrap(), new.to_str().unwrap()]);
    assert_ok(&o);
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(
        t.contains("chart    koordinator 1.7.0 → 1.8.0, appVersion 1.7.0 → 1.8.0"),
        "{t}"
    );

    // Not a bundle: exit 1, naming the file.
    let junk = h.path().join("junk.bin");
    std::fs::write(&junk, vec![7u8; 4096]).unwrap();
    let o = h.run(&["diff", junk.to_str().unwrap(), new.to_str().unwrap()]);
    assert_fails(&o, 1, &["junk.bin"]);
    // A head file that does not match SHA256SUMS: exit 1, naming the file.
    let bad = h.path().join("bad.tar");
    let mut bytes = std::fs::read(&new).unwrap();
    let crd = b"kind: CustomResourceDefinition";
    let at = bytes.windows(crd.len()).position(|w| w == crd).unwrap();
    bytes[at] = b'K';
    std::fs::write(&bad, bytes).unwrap();
    let o = h.run(&["diff", old.to_str().unwrap(), bad.to_str().unwrap()]);
    assert_fails(&o, 1, &["bad.tar", "crds/", "SHA256SUMS says"]);
}

/// `diff --format markdown` is pasted into change requests: whatever a bundle's manifest
/// holds (an image name, a chart version, a CRD name) stays text there, as GitHub renders it
/// (cmark-gfm, raw HTML let through as it is before GitHub's sanitiser): no tag, no link, no
/// emphasis, no cell broken by `|`, and every code span shows its text exactly.
#[test]
fn markdown_keeps_what_bundles_say_as_text() {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.8.0", &[]);
    let old = h.path().join("old.json");
    assert_ok(&h.run(&[
        "inspect",
        bundle.to_str().unwrap(),
        "--manifest",
        old.to_str().unwrap(),
    ]));
    let mut m: Value = serde_json::from_slice(&std::fs::read(&old).unwrap()).unwrap();
    let evil = "<img src=x onerror=alert(1)>[click](http://evil.example) www.evil.example a``b |x| ~~s~~ **b** _i_ &amp;";
    m["chart"]["version"] = format!("1.8.0{evil}").into();
    m["chart"]["appVersion"] = evil.into();
    m["created"] = evil.into();
    let repo = m["images"][0]["repository"].as_str().unwrap().to_string();
    m["images"][0]["ref"] = format!("{repo}{evil}`:v1`").into();
    m["images"][0]["repository"] = format!("{repo}{evil}`").into();
    m["crds"][0]["name"] = format!("`{evil}").into();
    m["crds"][0]["sha256"] = format!("sha256:{}", "0".repeat(64)).into();
    let new = h.path().join("new.json");
    std::fs::write(&new, m.to_string()).unwrap();
    let o = h.run(&[
        "diff",
        old.to_str().unwrap(),
        new.to_str().unwrap(),
        "--format",
        "markdown",
    ]);
    assert_ok(&o);
    let md = h.path().join("diff.md");
    std::fs::write(&md, &o.stdout).unwrap();
    let tools = std::env::var_os("KB_TOOLS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools"));
    let py = tools.join("markdown/bin/python3");
    let r = std::process::Command::new(&py)
        .args([
            "-c",
            "import sys, cmarkgfm\nfrom cmarkgfm.cmark import Options as O\nsys.stdout.write(cmarkgfm.github_flavored_markdown_to_html(open(sys.argv[1]).read(), options=O.CMARK_OPT_UNSAFE))",
            md.to_str().unwrap(),
        ])
        .output()
        .unwrap_or_else(|e| panic!("{} (scripts/install-deps.sh installs cmarkgfm): {e}", py.display()));
    assert_ok(&r);
    let html = String::from_utf8(r.stdout).unwrap();
    // (Our own notes are in italics: <em>i</em> is what the bundle's `_i_` must not become.)
    for bad in ["<img", "<a ", "<strong>", "<em>i</em>", "<del>"] {
        assert!(!html.contains(bad), "{bad} in the rendered diff:\n{html}");
    }
    // As text, entity and all: `&amp;` shows as itself.
    assert!(
        html.contains("&lt;img src=x onerror=alert(1)&gt;[click](http://evil.example) www.evil.example a``b |x| ~~s~~ **b** _i_ &amp;amp;"),
        "{html}"
    );
    let shown = evil
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    for span in [
        format!("<code>{repo}{shown}`</code>"),
        format!("<code>`{shown}</code>"),
    ] {
        assert!(html.contains(&span), "no {span} in\n{html}");
    }
    // Every row of a table has its table's cells: no `|` from a bundle split one.
    for table in html.split("<table>").skip(1) {
        let table = &table[..table.find("</table>").unwrap()];
        let cols = table
            .split("</thead>")
            .next()
            .unwrap()
            .matches("</th>")
            .count();
        for row in table.split("<tr>").skip(2) {
            assert_eq!(row.matches("</td>").count(), cols, "{row}");
        }
    }
}
