//! What replacing the chart's CRDs does to the cluster (helm replaces them on every upgrade: the
//! chart keeps them in `templates/crd/`), read against the live CRDs and their objects:
//!
//! | check | finds |
//! |---|---|
//! | `crd-stored-versions` | versions in the live CRD's `status.storedVersions` that the new CRD no longer lists: the API server refuses the new CRD in the middle of `helm upgrade` (a failed release): **Fail**, one per CRD however many versions it drops (the lists cut to ten, the rest counted), naming them, how many objects exist, and the steps that migrate them |
//! | `crd-storage-version` | the stored version changes: existing objects stay stored in the old one until rewritten (**Warn** when there are some, else Info), with what to run before a later chart drops it |
//! | `crd-downgrade` | the live CRD has fields the new one does not, and the new one none that the live one lacks: the CRD in the cluster comes from a newer chart (kept by `helm uninstall`, or left by another install), and installing replaces it with an older one, with a release or without: **Warn**, naming the fields (objects that set them are a `crd-objects` Fail) |
//! | `crd-objects` | objects that the new schema prunes fields of (**Fail**, **Warn** with `--allow-field-loss`), that lack a newly required field, or use an `enum` value that is gone (**Warn**, **Fail** under `--strict`) ([`koord_base::crd::VersionSchema::check_object`], the rule `diff` applies to the schemas) |
//!
//! Older or newer is told by the schemas, not by a version: the chart's CRDs carry no chart
//! version, and after `helm uninstall` no record says which chart installed them.
//!
//! Objects are listed bounded ([`crate::cluster::list::Bounds::CUSTOM`]).

use super::super::client::KubeClient;
use super::super::list::{list_json, Bounds};
use super::super::preflight::{names, Finding, Level};
use super::super::ClusterError;
use koord_base::crd::{self, CrdSchema};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Check name: a stored version the new CRD drops.
pub const CHECK_CRD_STORED_VERSIONS: &str = "crd-stored-versions";
/// Check name: the stored version changes.
pub const CHECK_CRD_STORAGE_VERSION: &str = "crd-storage-version";
/// Check name: existing objects against the new schema.
pub const CHECK_CRD_OBJECTS: &str = "crd-objects";
/// Check name: the live CRD is newer than the chart's.
pub const CHECK_CRD_DOWNGRADE: &str = "crd-downgrade";

/// Fields named in a `crd-downgrade` finding; the rest are counted.
const MAX_FIELDS_SHOWN: usize = 8;

/// The live side of one CRD: its served and stored versions, its storage version.
struct Live {
    group: String,
    plural: String,
    served: Vec<String>,
    storage: Option<String>,
    stored_versions: Vec<String>,
}

fn live(v: &Value) -> Live {
    let versions = v["spec"]["versions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let name = |x: &Value| x["name"].as_str().unwrap_or_default().to_string();
    Live {
        group: v["spec"]["group"].as_str().unwrap_or_default().to_string(),
        plural: v["spec"]["names"]["plural"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        served: versions
            .iter()
            .filter(|x| x["served"] == true)
            .map(name)
            .collect(),
        storage: versions.iter().find(|x| x["storage"] == true).map(name),
        stored_versions: v["status"]["storedVersions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect(),
    }
}

/// Every object of a CRD, read at `version` (all namespaces), bounded.
async fn objects_of(
    client: &KubeClient,
    l: &Live,
    version: &str,
) -> Result<Vec<Value>, ClusterError> {
    let path = format!("/apis/{}/{version}/{}", l.group, l.plural);
    let mut all = Vec::new();
    list_json(client, &path, Bounds::CUSTOM, |page| all.extend(page)).await?;
    Ok(all)
}

fn object_name(o: &Value) -> String {
    let name = o["metadata"]["name"].as_str().unwrap_or("?");
    match o["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

/// The steps that move every object of a CRD to `to` and drop the other stored versions.
fn migrate_steps(crd: &str, plural_group: &str, to: &str) -> String {
    format!(
        "with the chart now installed: (1) rewrite every object so that it is stored as {to}: `kubectl get {plural_group} -A -o json | kubectl replace -f -`; (2) drop the old versions from the stored versions: `kubectl patch crd {crd} --subresource=status --type=merge -p '{{\"status\":{{\"storedVersions\":[\"{to}\"]}}}}'`; then run this load again"
    )
}

/// The findings for the chart's new CRDs (`new`: each CRD object of the rendered manifest).
pub(crate) async fn crd_findings(
    client: &KubeClient,
    new: &[&Value],
    strict: bool,
    allow_field_loss: bool,
) -> Result<Vec<Finding>, ClusterError> {
    let mut out = Vec::new();
    for n in new {
        let name = n["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let Some(cur) = client
            .get_json(&format!(
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            ))
            .await?
        else {
            continue;
        };
        let (schema, live_schema) = match schemas(&name, n, &cur) {
            Ok(both) => both,
            Err(f) => {
                out.push(*f);
                continue;
            }
        };
        let downgrade = downgrade_finding(&name, &live_schema, &schema);
        let is_downgrade = downgrade.is_some();
        let first = out.len();
        out.extend(downgrade);
        let opts = Opts {
            strict,
            allow_field_loss,
            downgrade: is_downgrade,
        };
        one_crd(client, &name, &live(&cur), &schema, opts, &mut out).await?;
        for f in &mut out[first..] {
            f.subject = format!("crd {name}");
        }
    }
    Ok(out)
}

/// The chart's CRD `new` and the cluster's `cur`, read as schemas. One that cannot be read is
/// "could not tell" (what the replacement does to the objects, whether it is older), never a
/// skip: a Fail that names the way around it.
fn schemas(name: &str, new: &Value, cur: &Value) -> Result<(CrdSchema, CrdSchema), Box<Finding>> {
    let plural = new["spec"]["names"]["plural"].as_str().unwrap_or(name);
    let read = |which: &str, v: &Value| {
        serde_yaml_ng::to_value(v)
            .map_err(|e| e.to_string())
            .and_then(|y| crd::from_value(name, &y).map_err(|e| e.to_string()))
            .map_err(|why| {
                Box::new(
                    Finding::new(
                        Level::Fail,
                        CHECK_CRD_OBJECTS,
                        format!("CRD {name}: {which} cannot be read ({why}): could not tell what replacing it does to the objects in the cluster"),
                        Some(format!("look at it (`kubectl get crd {name} -o yaml`); or pass --skip-crds {plural} to leave the CRD in the cluster as it is")),
                    )
                    .about(format!("crd {name}")),
                )
            })
    };
    Ok((
        read("the chart's definition", new)?,
        read("the definition in the cluster", cur)?,
    ))
}

/// How objects that do not fit are judged.
#[derive(Debug, Clone, Copy)]
struct Opts {
    /// `--strict`: every object that does not fit is a Fail.
    strict: bool,
    /// `--allow-field-loss`: objects that lose fields are a Warn, not a Fail.
    allow_field_loss: bool,
    /// The new CRD is older than the live one (said in the objects' finding).
    downgrade: bool,
}

/// The fields of `from` (by path) that `to` prunes, over the versions both have: the top-most
/// ones (a field whose parent is lost too is left out).
fn lost_fields(from: &CrdSchema, to: &CrdSchema) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for t in &to.versions {
        let Some(f) = from
            .versions
            .iter()
            .find(|f| f.version.name == t.version.name)
            .and_then(|f| f.fields.as_ref())
        else {
            continue;
        };
        if t.fields.is_none() {
            continue;
        }
        for path in f.keys() {
            if t.prunes(path) {
                out.insert(path.clone());
            }
        }
    }
    let lost = out.clone();
    out.retain(|p| {
        !lost
            .iter()
            .any(|q| q != p && (p.starts_with(&format!("{q}.")) || p.starts_with(&format!("{q}["))))
    });
    out
}

/// A `crd-downgrade` Warn when the live CRD has fields the chart's new one does not, and the
/// new one none the live one lacks: the chart is older than the CRD in the cluster.
fn downgrade_finding(name: &str, live: &CrdSchema, new: &CrdSchema) -> Option<Finding> {
    let lost = lost_fields(live, new);
    if lost.is_empty() || !lost_fields(new, live).is_empty() {
        return None;
    }
    let shown: Vec<&str> = lost
        .iter()
        .map(String::as_str)
        .take(MAX_FIELDS_SHOWN)
        .collect();
    let more = lost.len().saturating_sub(MAX_FIELDS_SHOWN);
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    Some(Finding::new(
        Level::Warn,
        CHECK_CRD_DOWNGRADE,
        format!(
            "CRD {name}: a CRD DOWNGRADE: the CRD in the cluster has {} field(s) that the chart's does not ({}{more}), and the chart's has none that it lacks: it comes from a newer chart (kept by `helm uninstall`, or installed by another release), and this install replaces it with an older one",
            lost.len(),
            shown.join(", ")
        ),
        Some(format!(
            "install the chart version the CRD came from, or a newer one; objects that set these fields lose them on their next write (check {CHECK_CRD_OBJECTS} names them)"
        )),
    ))
}

async fn one_crd(
    client: &KubeClient,
    name: &str,
    l: &Live,
    schema: &CrdSchema,
    opts: Opts,
    out: &mut Vec<Finding>,
) -> Result<(), ClusterError> {
    let plural_group = format!("{}.{}", l.plural, l.group);
    let new_versions: BTreeSet<&str> = schema
        .versions
        .iter()
        .map(|v| v.version.name.as_str())
        .collect();
    let new_storage = schema
        .versions
        .iter()
        .find(|v| v.version.storage)
        .map(|v| v.version.name.clone());
    // Objects: read at the new stored version when the live CRD serves it, else at another
    // version of the new CRD it serves (the new schema judges them there), else at its own.
    let read_at = new_storage
        .clone()
        .filter(|v| l.served.contains(v))
        .or_else(|| {
            schema
                .versions
                .iter()
                .map(|v| v.version.name.clone())
                .find(|v| l.served.contains(v))
        })
        .or_else(|| l.storage.clone().filter(|v| l.served.contains(v)))
        .or_else(|| l.served.first().cloned());
    let Some(read_at) = read_at else {
        // A CRD that serves no version: its objects (in etcd all the same) cannot be listed.
        out.push(objects_not_checked(
            name,
            &l.plural,
            "the CRD in the cluster serves no version, so its objects cannot be read".into(),
        ));
        return Ok(());
    };
    let objects = objects_of(client, l, &read_at).await?;
    let count = objects.len();
    let dropped = stored_versions_dropped(
        name,
        &plural_group,
        l,
        &new_versions,
        new_storage.as_deref(),
        count,
    );
    let any_dropped = dropped.is_some();
    out.extend(dropped);
    if let (Some(old), Some(new)) = (&l.storage, &new_storage) {
        if old != new && !any_dropped {
            let (level, what) = if count > 0 {
                (Level::Warn, format!("its {count} existing object(s) stay stored as {old} until they are rewritten (status.storedVersions keeps {old})"))
            } else {
                (
                    Level::Info,
                    format!("it has no objects yet, so nothing stays stored as {old}"),
                )
            };
            out.push(Finding::new(
                level,
                CHECK_CRD_STORAGE_VERSION,
                format!("CRD {name}: the stored version changes from {old} to {new}: {what}"),
                (count > 0).then(|| {
                    format!(
                        "before a later chart drops {old}, {}",
                        migrate_steps(name, &plural_group, new)
                    )
                }),
            ));
        }
    }
    if count > 0 && !any_dropped && !new_versions.contains(read_at.as_str()) {
        // Served only at a version the new CRD does not have: the new schema has nothing to
        // judge them by.
        out.push(objects_not_checked(
            name,
            &l.plural,
            format!("its {count} object(s) can be read only at {read_at}, which the new CRD does not have"),
        ));
        return Ok(());
    }
    out.extend(object_fit(name, l, schema, Some(&read_at), &objects, opts));
    Ok(())
}

/// The objects of CRD `name` could not be judged against the new schema (`why`): could not
/// tell what replacing the CRD does to them, a Fail that names the way around it (as an
/// unreadable schema is, see [`schemas`]).
fn objects_not_checked(name: &str, plural: &str, why: String) -> Finding {
    Finding::new(
        Level::Fail,
        CHECK_CRD_OBJECTS,
        format!("CRD {name}: {why}: could not tell what replacing it does to the objects in the cluster"),
        Some(format!("serve a version of it that the chart's CRD has (`kubectl edit crd {name}`, `served: true`), then run this load again; or pass --skip-crds {plural} to leave the CRD in the cluster as it is")),
    )
    .about(format!("crd {name}"))
}

/// Versions shown of a list the server gives (`status.storedVersions`, the new CRD's versions):
/// the rest are counted.
const MAX_VERSIONS_SHOWN: usize = 10;

/// Longest version name shown (a real one is a DNS label of at most 63 bytes).
const MAX_VERSION_NAME: usize = 63;

/// `v1, v2, ... and N more`: at most [`MAX_VERSIONS_SHOWN`] of `list`, each cut to
/// [`MAX_VERSION_NAME`] bytes.
fn version_list<'a>(list: impl IntoIterator<Item = &'a str>) -> String {
    let mut shown = Vec::new();
    let mut more = 0usize;
    for v in list {
        if shown.len() >= MAX_VERSIONS_SHOWN {
            more += 1;
            continue;
        }
        let mut end = v.len().min(MAX_VERSION_NAME);
        while !v.is_char_boundary(end) {
            end -= 1;
        }
        shown.push(if end < v.len() {
            format!("{}…", &v[..end])
        } else {
            v.to_string()
        });
    }
    let mut s = shown.join(", ");
    if more > 0 {
        s.push_str(&format!(" and {more} more"));
    }
    s
}

/// The stored versions of the live CRD that the new CRD no longer has: ONE finding for the
/// CRD (a Fail), however many versions it drops, each list in it cut to
/// [`MAX_VERSIONS_SHOWN`] (a CRD with 30,000 stored versions gave 30,000 findings, each
/// repeating the whole list).
fn stored_versions_dropped(
    name: &str,
    plural_group: &str,
    l: &Live,
    new_versions: &BTreeSet<&str>,
    new_storage: Option<&str>,
    count: usize,
) -> Option<Finding> {
    let dropped: Vec<&str> = l
        .stored_versions
        .iter()
        .map(String::as_str)
        .filter(|v| !new_versions.contains(v))
        .collect();
    if dropped.is_empty() {
        return None;
    }
    let to = new_storage.unwrap_or_default();
    let fix = match l.storage.as_deref().filter(|s| dropped.contains(s)) {
        Some(v) => format!(
            "the live CRD still stores its objects as {v}: first install a chart version whose CRD serves both {v} and {to} with {to} as the stored version, then {}",
            migrate_steps(name, plural_group, to)
        ),
        None => migrate_steps(name, plural_group, l.storage.as_deref().unwrap_or(to)),
    };
    let (which, these) = if dropped.len() == 1 {
        (
            format!("version {} is", version_list(dropped.iter().copied())),
            "it",
        )
    } else {
        (
            format!(
                "{} versions ({}) are",
                dropped.len(),
                version_list(dropped.iter().copied())
            ),
            "them",
        )
    };
    Some(Finding::new(
        Level::Fail,
        CHECK_CRD_STORED_VERSIONS,
        format!(
            "CRD {name}: {which} among its stored versions (status.storedVersions: {}), with {count} object(s) in the cluster, but the new CRD no longer has {these} (versions: {}): the API server refuses such a CRD, so helm would stop in the middle of the upgrade and leave a failed release",
            version_list(l.stored_versions.iter().map(String::as_str)),
            version_list(new_versions.iter().copied()),
        ),
        Some(fix),
    ))
}

/// What the new schema, at the version objects are read at, does to the objects in the cluster.
fn object_fit(
    name: &str,
    l: &Live,
    schema: &CrdSchema,
    read_at: Option<&str>,
    objects: &[serde_json::Value],
    opts: Opts,
) -> Option<Finding> {
    let plural_group = format!("{}.{}", l.plural, l.group);
    let count = objects.len();
    let version = read_at.and_then(|v| schema.versions.iter().find(|s| s.version.name == v))?;
    // What the new schema does to each object: (kind of problem, field) -> objects.
    let mut by_problem: BTreeMap<(u8, String), Vec<String>> = BTreeMap::new();
    let mut affected = BTreeSet::new();
    for o in objects {
        let p = version.check_object(o);
        if p.is_empty() {
            continue;
        }
        let who = object_name(o);
        affected.insert(who.clone());
        let generic = |path: &str| strip_indices(path);
        for f in &p.pruned {
            by_problem
                .entry((0, generic(f)))
                .or_default()
                .push(who.clone());
        }
        for f in &p.missing_required {
            by_problem
                .entry((1, generic(f)))
                .or_default()
                .push(who.clone());
        }
        for f in &p.enum_gone {
            by_problem
                .entry((2, f.clone()))
                .or_default()
                .push(who.clone());
        }
    }
    if affected.is_empty() {
        return None;
    }
    let loses = by_problem.keys().any(|(kind, _)| *kind == 0);
    let refused = loses && !opts.allow_field_loss;
    let level = if opts.strict || refused {
        Level::Fail
    } else {
        Level::Warn
    };
    let v = &version.version.name;
    let mut lines = Vec::new();
    for ((kind, field), who) in &by_problem {
        let mut who = who.clone();
        who.dedup();
        let what = match kind {
            0 => format!("lose {field} (the new schema has no such field: pruned on the next write)"),
            1 => format!("lack {field}, which the new schema requires (their next update is refused)"),
            _ => format!("use {field}, a value the new schema's enum no longer allows (their next update is refused)"),
        };
        lines.push(format!(
            "{} {what}: {}",
            who.len(),
            names(who.iter().map(String::as_str))
        ));
    }
    Some(Finding::new(
        level,
        CHECK_CRD_OBJECTS,
        format!(
            "CRD {name} ({} {v}){}: {} of {count} object(s) do not fit the new schema: {}",
            schema.kind,
            if opts.downgrade {
                ", replaced by an older definition (a CRD DOWNGRADE)"
            } else {
                ""
            },
            affected.len(),
            lines.join("; ")
        ),
        Some(format!(
            "save them first (`kubectl get {plural_group} -A -o yaml > {}-backup.yaml`) and move what they set to the fields the new version has{}{}",
            l.plural,
            if refused {
                "; or pass --allow-field-loss to install anyway, and let the API server drop those fields"
            } else {
                ""
            },
            if opts.strict || refused { "" } else { "; pass --strict to refuse such an upgrade" }
        )),
    ))
}

/// `spec.ports[3].name` → `spec.ports[].name`: one line for the same field of many items.
pub(super) fn strip_indices(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut skip = false;
    for c in path.chars() {
        match c {
            '[' => {
                skip = true;
                out.push('[');
            }
            ']' => {
                skip = false;
                out.push(']');
            }
            _ if skip => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CRD whose schema cannot be read, the chart's or the cluster's, is a Fail naming the
    /// way around it (`--skip-crds PLURAL`), never skipped (before: `continue`, no finding: the
    /// objects and the downgrade went unchecked).
    #[test]
    fn a_crd_that_cannot_be_read_is_could_not_tell_not_a_skip() {
        let good = serde_json::json!({"apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition", "metadata": {"name": "xs.g.io"},
            "spec": {"group": "g.io", "names": {"plural": "xs", "kind": "X"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object"}}}]}});
        let mut bad = good.clone();
        bad["spec"]["versions"][0]["name"] = "".into();
        assert!(schemas("xs.g.io", &good, &good).is_ok());
        for (new, cur, which) in [
            (&bad, &good, "the chart's definition"),
            (&good, &bad, "the definition in the cluster"),
        ] {
            let f = schemas("xs.g.io", new, cur).unwrap_err();
            assert_eq!(f.level, Level::Fail);
            assert_eq!(f.subject, "crd xs.g.io");
            assert!(
                f.message
                    .starts_with(&format!("CRD xs.g.io: {which} cannot be read (")),
                "{}",
                f.message
            );
            assert!(f.message.contains("could not tell"), "{}", f.message);
            assert!(
                f.fix.as_deref().unwrap().contains("--skip-crds xs"),
                "{:?}",
                f.fix
            );
        }
    }

    /// Objects the new schema cannot judge are "could not tell", a Fail naming the way around
    /// it, never "none" (before: a CRD serving no version was read as having no objects, and
    /// objects served only at a version the new CRD lacks went unchecked). A version both CRDs
    /// have is read first, so that the new schema judges the objects there.
    #[tokio::test]
    async fn objects_the_new_schema_cannot_judge_are_could_not_tell() {
        use crate::cluster::test_server::{cfg, serve};
        use crate::cluster::{Credentials, KubeClient};
        let schema = |versions: &[(&str, bool)]| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|(v, storage)| {
                    serde_json::json!({"name": v, "served": true, "storage": storage,
                        "schema": {"openAPIV3Schema": {"type": "object",
                            "properties": {"spec": {"type": "object",
                                "properties": {"size": {"type": "integer"}}}}}}})
                })
                .collect();
            let doc = serde_json::json!({"apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition", "metadata": {"name": "xs.g.io"},
                "spec": {"group": "g.io", "names": {"plural": "xs", "kind": "X"},
                    "versions": versions}});
            crd::from_value("xs.g.io", &serde_yaml_ng::to_value(&doc).unwrap()).unwrap()
        };
        let live = |served: &[&str]| Live {
            group: "g.io".into(),
            plural: "xs".into(),
            served: served.iter().map(|v| v.to_string()).collect(),
            storage: Some("v2".into()),
            stored_versions: vec!["v2".into()],
        };
        let opts = Opts {
            strict: false,
            allow_field_loss: false,
            downgrade: false,
        };
        let one_object = r#"{"kind":"XList","apiVersion":"g.io/v1","metadata":{},"items":[{"apiVersion":"g.io/v1","kind":"X","metadata":{"name":"a"},"spec":{"size":1}}]}"#;
        let (url, seen) = serve("200 OK", one_object);
        let client = KubeClient::new(&cfg(url, Credentials::None)).unwrap();
        let run = |l: Live, s: CrdSchema| {
            let client = &client;
            async move {
                let mut out = Vec::new();
                one_crd(client, "xs.g.io", &l, &s, opts, &mut out)
                    .await
                    .unwrap();
                out
            }
        };
        // Serving no version: nothing can be listed, nothing is asked.
        let out = run(live(&[]), schema(&[("v2", true)])).await;
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].level, Level::Fail);
        assert!(
            out[0].message.contains("serves no version"),
            "{}",
            out[0].message
        );
        assert!(
            out[0].message.contains("could not tell"),
            "{}",
            out[0].message
        );
        assert!(out[0].fix.as_deref().unwrap().contains("--skip-crds xs"));
        assert!(seen.lock().unwrap().is_empty(), "nothing is read");
        // Served only at v1 (its storage v2 unserved), which the new CRD lacks.
        let out = run(live(&["v1"]), schema(&[("v2", true)])).await;
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].level, Level::Fail);
        assert!(
            out[0].message.contains(
                "its 1 object(s) can be read only at v1, which the new CRD does not have"
            ),
            "{}",
            out[0].message
        );
        // The new CRD has v1 too: the objects are read there and fit.
        let out = run(live(&["v1"]), schema(&[("v1", false), ("v2", true)])).await;
        assert!(out.is_empty(), "{out:?}");
        let asked = seen.lock().unwrap().clone();
        assert_eq!(asked.len(), 2, "{asked:?}");
        assert!(
            asked.iter().all(|h| h.starts_with("GET /apis/g.io/v1/xs")),
            "{asked:?}"
        );
    }

    /// 30,000 stored versions the new CRD drops: one finding, its message short (before:
    /// 30,000 findings, each naming all 30,000, and `load` aborted).
    #[test]
    fn thirty_thousand_dropped_stored_versions_are_one_short_finding() {
        let l = Live {
            group: "g.io".into(),
            plural: "xs".into(),
            served: vec!["v1".into()],
            storage: Some("v0".into()),
            stored_versions: (0..30_000).map(|i| format!("v{i}")).collect(),
        };
        let new: BTreeSet<&str> = ["v1", "v2"].into();
        let f = stored_versions_dropped("xs.g.io", "xs.g.io", &l, &new, Some("v2"), 3).unwrap();
        assert_eq!(f.level, Level::Fail);
        assert!(
            f.message.starts_with("CRD xs.g.io: 29998 versions (v0, v3, v4, v5, v6, v7, v8, v9, v10, v11 and 29988 more) are among its stored versions (status.storedVersions: v0, v1, v2, v3, v4, v5, v6, v7, v8, v9 and 29990 more)"),
            "{}",
            f.message
        );
        assert!(f.message.len() < 1000, "{}", f.message.len());
        assert!(f.fix.unwrap().contains("stores its objects as v0"));
        let one = Live {
            stored_versions: vec!["v1".into(), "v9".into()],
            storage: Some("v1".into()),
            ..l
        };
        let f = stored_versions_dropped("xs.g.io", "xs.g.io", &one, &new, Some("v2"), 0).unwrap();
        assert!(f.message.starts_with("CRD xs.g.io: version v9 is among its stored versions (status.storedVersions: v1, v9), with 0 object(s) in the cluster, but the new CRD no longer has it (versions: v1, v2)"), "{}", f.message);
        assert!(stored_versions_dropped(
            "xs.g.io",
            "xs.g.io",
            &Live {
                stored_versions: vec!["v1".into()],
                ..one
            },
            &new,
            None,
            0
        )
        .is_none());
    }

    fn schema(fields: &[&str]) -> CrdSchema {
        let mut props = serde_json::Map::new();
        for f in fields {
            props.insert((*f).to_string(), serde_json::json!({"type": "string"}));
        }
        let doc = serde_json::json!({"kind": "CustomResourceDefinition", "metadata": {"name": "xs.g.io"},
            "spec": {"group": "g.io", "names": {"kind": "X"}, "versions": [{"name": "v1", "served": true, "storage": true,
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "properties": props}}}}}]}});
        crd::from_value("x", &serde_yaml_ng::to_value(&doc).unwrap()).unwrap()
    }

    /// The chart's CRD lacks fields the live one has, and has none it lacks: a downgrade,
    /// named with the fields; fields gone both ways (1.7.0 ↔ 1.8.0's ScheduleExplanation) or
    /// only added are not.
    #[test]
    fn a_crd_older_than_the_live_one_is_a_downgrade() {
        let (old, new) = (schema(&["a", "b"]), schema(&["a", "b", "c"]));
        let f = downgrade_finding("xs.g.io", &new, &old).unwrap();
        assert_eq!((f.level, f.check), (Level::Warn, CHECK_CRD_DOWNGRADE));
        assert!(f.message.contains("a CRD DOWNGRADE: the CRD in the cluster has 1 field(s) that the chart's does not (spec.c)"), "{}", f.message);
        assert!(downgrade_finding("xs.g.io", &old, &new).is_none());
        assert!(downgrade_finding("xs.g.io", &new, &schema(&["a", "b", "d"])).is_none());
        assert!(downgrade_finding("xs.g.io", &new, &new).is_none());
    }

    /// An object that loses a field is a Fail, a Warn with --allow-field-loss; one that lacks
    /// a required field is a Warn, a Fail under --strict.
    #[test]
    fn objects_that_lose_fields_fail_unless_allowed() {
        let new = schema(&["a"]);
        let l = live(&serde_json::json!({"spec": {"group": "g.io", "names": {"plural": "xs"}}}));
        let objects =
            [serde_json::json!({"metadata": {"name": "o1"}, "spec": {"a": "x", "c": "y"}})];
        let opts = |allow_field_loss, strict| Opts {
            strict,
            allow_field_loss,
            downgrade: true,
        };
        let f = object_fit(
            "xs.g.io",
            &l,
            &new,
            Some("v1"),
            &objects,
            opts(false, false),
        )
        .unwrap();
        assert_eq!(f.level, Level::Fail);
        assert!(f.message.contains("(X v1), replaced by an older definition (a CRD DOWNGRADE): 1 of 1 object(s) do not fit the new schema: 1 lose spec.c"), "{}", f.message);
        assert!(f.fix.unwrap().contains("--allow-field-loss"));
        let f = object_fit("xs.g.io", &l, &new, Some("v1"), &objects, opts(true, false)).unwrap();
        assert_eq!(f.level, Level::Warn);
        let f = object_fit("xs.g.io", &l, &new, Some("v1"), &objects, opts(true, true)).unwrap();
        assert_eq!(f.level, Level::Fail);
    }

    #[test]
    fn indices_are_folded() {
        assert_eq!(strip_indices("spec.ports[12].name"), "spec.ports[].name");
        assert_eq!(strip_indices("a"), "a");
    }

    #[test]
    fn live_side_of_a_crd() {
        let l = live(
            &serde_json::json!({"spec": {"group": "g.io", "names": {"plural": "xs"},
            "versions": [{"name": "v1alpha1", "served": true, "storage": false}, {"name": "v1alpha2", "served": true, "storage": true}]},
            "status": {"storedVersions": ["v1alpha1", "v1alpha2"]}}),
        );
        assert_eq!(l.storage.as_deref(), Some("v1alpha2"));
        assert_eq!(l.served, ["v1alpha1", "v1alpha2"]);
        assert_eq!(l.stored_versions, ["v1alpha1", "v1alpha2"]);
        assert!(migrate_steps("xs.g.io", "xs.g.io", "v1alpha2").contains("--subresource=status"));
    }
}
