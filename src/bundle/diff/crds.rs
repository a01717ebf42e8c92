//! The CRDs of two bundles: added, removed, and for each that changed, its served and stored
//! versions and, version by version, the fields of its schema (by path), fields that became
//! required, `enum` values removed and types changed, with a warning wherever a change can
//! break objects that exist in a cluster (the Koordinator guide has users upgrade CRDs by
//! hand or skip them, so this is what an operator must see before `load`).
//!
//! From a manifest file (`inspect --manifest`) only the CRD list, their versions (when
//! recorded) and whether a file changed are known: the schemas are "not available".

use super::{Change, Side};
use crate::bundle::crd::{self, CrdSchema, Field, VersionSchema};
use crate::bundle::manifest::{CrdRecord, CrdVersion};
use crate::oci::Digest;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// A CRD of one side.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CrdEntry {
    /// `metadata.name`.
    pub name: String,
    /// Kind.
    pub kind: String,
    /// Its versions (when known).
    pub versions: Vec<String>,
}

/// An `enum` that lost or gained values.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EnumChange {
    /// Field path.
    pub path: String,
    /// Values.
    pub values: Vec<String>,
}

/// A field whose type changed.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TypeChange {
    /// Field path.
    pub path: String,
    /// Types.
    pub types: Change<Option<String>>,
}

/// The schema of one version present on both sides.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionDiff {
    /// Version name.
    pub version: String,
    /// Fields only NEW has (the topmost: not those under a field added with them).
    pub fields_added: Vec<String>,
    /// Fields only OLD has (the topmost).
    pub fields_removed: Vec<String>,
    /// Fields required in NEW that OLD did not require (or did not have).
    pub newly_required: Vec<String>,
    /// Fields OLD required that NEW does not.
    pub no_longer_required: Vec<String>,
    /// `enum` values OLD allowed that NEW does not.
    pub enum_values_removed: Vec<EnumChange>,
    /// `enum` values NEW allows that OLD did not.
    pub enum_values_added: Vec<EnumChange>,
    /// Types changed.
    pub types_changed: Vec<TypeChange>,
}

impl CrdChange {
    /// Nothing changed: no version, stored version or schema finding, no warning.
    pub fn is_empty(&self) -> bool {
        self.versions_added.is_empty()
            && self.versions_removed.is_empty()
            && self.no_longer_served.is_empty()
            && self.newly_served.is_empty()
            && self.storage.is_none()
            && self.schema.is_empty()
            && self.warnings.is_empty()
    }
}

impl VersionDiff {
    fn is_empty(&self) -> bool {
        self.fields_added.is_empty()
            && self.fields_removed.is_empty()
            && self.newly_required.is_empty()
            && self.no_longer_required.is_empty()
            && self.enum_values_removed.is_empty()
            && self.enum_values_added.is_empty()
            && self.types_changed.is_empty()
    }
}

/// A CRD on both sides whose file changed.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CrdChange {
    /// `metadata.name`.
    pub name: String,
    /// Kind.
    pub kind: String,
    /// Versions only NEW has.
    pub versions_added: Vec<String>,
    /// Versions only OLD has.
    pub versions_removed: Vec<String>,
    /// Versions OLD served that NEW does not serve.
    pub no_longer_served: Vec<String>,
    /// Versions NEW serves that OLD did not.
    pub newly_served: Vec<String>,
    /// The stored version, when it changed.
    pub storage: Option<Change<String>>,
    /// Version by version, the schema (empty when not available).
    pub schema: Vec<VersionDiff>,
    /// Whether both schemas could be read (not from a manifest file).
    pub schema_available: bool,
    /// What can break existing objects.
    pub warnings: Vec<String>,
}

/// The CRDs of two sides.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CrdChanges {
    /// Only in NEW.
    pub added: Vec<CrdEntry>,
    /// Only in OLD.
    pub removed: Vec<CrdEntry>,
    /// In both, changed.
    pub changed: Vec<CrdChange>,
    /// In both, the same file.
    pub unchanged: usize,
    /// Why the schemas are not compared (a manifest file on a side).
    pub note: Option<String>,
}

impl CrdChanges {
    /// Every warning, one line each, naming the CRD.
    pub fn warnings(&self) -> Vec<String> {
        let mut w: Vec<String> = self
            .removed
            .iter()
            .map(|c| {
                format!(
                    "CRD {} is removed: the chart no longer installs it; its objects stay in the cluster until it is deleted by hand",
                    c.name
                )
            })
            .collect();
        for c in &self.changed {
            w.extend(c.warnings.iter().map(|x| format!("CRD {}: {x}", c.name)));
        }
        w
    }
}

/// A CRD of one side: its record, and its schema when the file is at hand.
struct Known<'a> {
    rec: &'a CrdRecord,
    digest: Option<Digest>,
    schema: Option<Result<CrdSchema, crd::CrdError>>,
}

impl Known<'_> {
    fn versions(&self) -> Vec<CrdVersion> {
        match &self.schema {
            Some(Ok(s)) => s.version_records(),
            _ => self.rec.versions.clone(),
        }
    }
    fn entry(&self) -> CrdEntry {
        CrdEntry {
            name: self.rec.name.clone(),
            kind: self.rec.kind.clone(),
            versions: self.versions().into_iter().map(|v| v.name).collect(),
        }
    }
}

fn known(side: &Side) -> BTreeMap<&str, Known<'_>> {
    side.manifest
        .crds
        .iter()
        .map(|rec| {
            let bytes = side.crd_files.as_ref().and_then(|f| f.get(&rec.file));
            let k = Known {
                rec,
                digest: bytes.map(|b| Digest::of(b)).or_else(|| rec.sha256.clone()),
                schema: bytes.map(|b| crd::parse(&rec.file, b)),
            };
            (rec.name.as_str(), k)
        })
        .collect()
}

/// Compare the CRDs of two sides.
pub fn compare(old: &Side, new: &Side) -> CrdChanges {
    let (ko, kn) = (known(old), known(new));
    let mut out = CrdChanges::default();
    let schemas = old.crd_files.is_some() && new.crd_files.is_some();
    if !schemas {
        out.note =
            Some("CRD schemas: not available from a manifest file (give the bundle itself)".into());
    }
    for (name, o) in &ko {
        let Some(n) = kn.get(name) else {
            out.removed.push(o.entry());
            continue;
        };
        let same = match (&o.digest, &n.digest) {
            (Some(a), Some(b)) => a == b,
            _ => o.versions() == n.versions(),
        };
        if same {
            out.unchanged += 1;
        } else {
            out.changed.push(changed(o, n));
        }
    }
    out.added = kn
        .iter()
        .filter(|(name, _)| !ko.contains_key(*name))
        .map(|(_, n)| n.entry())
        .collect();
    out
}

/// Two readings of one CRD compared (versions and schemas), as [`compare`] compares a CRD
/// found on both sides.
pub fn compare_schemas(old: &CrdSchema, new: &CrdSchema) -> CrdChange {
    let rec = |s: &CrdSchema| CrdRecord {
        file: String::new(),
        name: s.name.clone(),
        group: s.group.clone(),
        plural: String::new(),
        kind: s.kind.clone(),
        values_key: None,
        versions: s.version_records(),
        sha256: None,
    };
    let (ro, rn) = (rec(old), rec(new));
    changed(
        &Known {
            rec: &ro,
            digest: None,
            schema: Some(Ok(old.clone())),
        },
        &Known {
            rec: &rn,
            digest: None,
            schema: Some(Ok(new.clone())),
        },
    )
}

fn names(v: &[CrdVersion], f: impl Fn(&CrdVersion) -> bool) -> BTreeSet<String> {
    v.iter().filter(|x| f(x)).map(|x| x.name.clone()).collect()
}

fn minus(a: &BTreeSet<String>, b: &BTreeSet<String>) -> Vec<String> {
    a.difference(b).cloned().collect()
}

fn changed(o: &Known<'_>, n: &Known<'_>) -> CrdChange {
    let (vo, vn) = (o.versions(), n.versions());
    let (all_o, all_n) = (names(&vo, |_| true), names(&vn, |_| true));
    let (served_o, served_n) = (names(&vo, |v| v.served), names(&vn, |v| v.served));
    let stored = |v: &[CrdVersion]| v.iter().find(|x| x.storage).map(|x| x.name.clone());
    let mut c = CrdChange {
        name: n.rec.name.clone(),
        kind: n.rec.kind.clone(),
        versions_added: minus(&all_n, &all_o),
        versions_removed: minus(&all_o, &all_n),
        no_longer_served: minus(&served_o, &served_n)
            .into_iter()
            .filter(|v| all_n.contains(v))
            .collect(),
        newly_served: minus(&served_n, &served_o)
            .into_iter()
            .filter(|v| all_o.contains(v))
            .collect(),
        ..Default::default()
    };
    if let (Some(a), Some(b)) = (stored(&vo), stored(&vn)) {
        if a != b {
            c.storage = Some(Change { old: a, new: b });
        }
    }
    for v in &c.versions_removed {
        if served_o.contains(v) {
            c.warnings.push(format!(
                "version {v} is removed: objects of {v} can no longer be read or written through it, and the API server refuses the new CRD while {v} is still among its stored versions (status.storedVersions)"
            ));
        }
    }
    for v in &c.no_longer_served {
        c.warnings.push(format!(
            "version {v} is no longer served: clients that use {v} fail"
        ));
    }
    if let Some(s) = &c.storage {
        c.warnings.push(format!(
            "the stored version changes from {} to {}: existing objects stay stored as {} until they are rewritten",
            s.old, s.new, s.old
        ));
    }
    if let (Some(Ok(so)), Some(Ok(sn))) = (&o.schema, &n.schema) {
        c.schema_available = true;
        for vo in &so.versions {
            let Some(vn) = sn
                .versions
                .iter()
                .find(|x| x.version.name == vo.version.name)
            else {
                continue;
            };
            let empty = BTreeMap::new();
            let d = fields(&vo.version.name, vo.fields.as_ref().unwrap_or(&empty), vn);
            if !d.is_empty() {
                warn_fields(&d, &mut c.warnings);
                c.schema.push(d);
            }
        }
    } else {
        for (side, k) in [("OLD", o), ("NEW", n)] {
            if let Some(Err(e)) = &k.schema {
                c.warnings
                    .push(format!("{side}: its schema cannot be read: {e}"));
            }
        }
    }
    c
}

/// The fields of one version's schema on both sides: a field of OLD is removed when NEW
/// prunes it ([`VersionSchema::prunes`], the rule the pre-flight of an upgrade applies to the
/// objects in the cluster).
fn fields(version: &str, o: &BTreeMap<String, Field>, new: &VersionSchema) -> VersionDiff {
    let mut d = VersionDiff {
        version: version.to_string(),
        ..Default::default()
    };
    let empty = BTreeMap::new();
    let n = new.fields.as_ref().unwrap_or(&empty);
    for (path, fo) in o {
        let Some(fnew) = n.get(path) else {
            if new.prunes(path) {
                d.fields_removed.push(path.clone());
            }
            continue;
        };
        if fo.required && !fnew.required {
            d.no_longer_required.push(path.clone());
        }
        if fnew.required && !fo.required {
            d.newly_required.push(path.clone());
        }
        if fo.ty != fnew.ty {
            d.types_changed.push(TypeChange {
                path: path.clone(),
                types: Change {
                    old: fo.ty.clone(),
                    new: fnew.ty.clone(),
                },
            });
        }
        let set = |f: &Field| -> Option<BTreeSet<String>> {
            f.enums.as_ref().map(|e| e.iter().cloned().collect())
        };
        if let (Some(a), Some(b)) = (set(fo), set(fnew)) {
            let removed = minus(&a, &b);
            if !removed.is_empty() {
                d.enum_values_removed.push(EnumChange {
                    path: path.clone(),
                    values: removed,
                });
            }
            let added = minus(&b, &a);
            if !added.is_empty() {
                d.enum_values_added.push(EnumChange {
                    path: path.clone(),
                    values: added,
                });
            }
        }
    }
    for (path, f) in n {
        if !o.contains_key(path) {
            d.fields_added.push(path.clone());
            if f.required && parent_exists(o, path) {
                d.newly_required.push(path.clone());
            }
        }
    }
    d.fields_added = topmost(&d.fields_added);
    d.fields_removed = topmost(&d.fields_removed);
    d
}

/// The paths of `list` (sorted) whose parents are not in it: a field added or removed with
/// everything under it is named once.
fn topmost(list: &[String]) -> Vec<String> {
    let set: BTreeSet<&str> = list.iter().map(String::as_str).collect();
    list.iter()
        .filter(|p| {
            let mut cur = p.as_str();
            while let Some(i) = cur.rfind(['.', '[']) {
                cur = &cur[..i];
                if set.contains(cur) {
                    return false;
                }
            }
            true
        })
        .cloned()
        .collect()
}

/// Whether the object that holds `path` existed in OLD (a new required field inside a new
/// optional object breaks nothing: no existing object has that object).
fn parent_exists(o: &BTreeMap<String, Field>, path: &str) -> bool {
    let parent = match path.rfind(['.', '[']) {
        Some(i) => &path[..i],
        None => return true,
    };
    parent.is_empty() || o.contains_key(parent)
}

fn warn_fields(d: &VersionDiff, w: &mut Vec<String>) {
    let v = &d.version;
    let list = |x: &[String]| x.join(", ");
    if !d.fields_removed.is_empty() {
        w.push(format!(
            "{v}: fields removed ({}): existing objects that set them lose them (pruned) when next written",
            list(&d.fields_removed)
        ));
    }
    if !d.newly_required.is_empty() {
        w.push(format!(
            "{v}: fields now required ({}): existing objects without them are refused on their next update",
            list(&d.newly_required)
        ));
    }
    for e in &d.enum_values_removed {
        w.push(format!(
            "{v}: {} no longer allows {}: existing objects with such a value are refused on their next update",
            e.path,
            e.values.join(", ")
        ));
    }
    for t in &d.types_changed {
        w.push(format!(
            "{v}: {} changes type from {} to {}: existing objects may no longer validate",
            t.path,
            t.types.old.as_deref().unwrap_or("(none)"),
            t.types.new.as_deref().unwrap_or("(none)")
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(required: bool, ty: &str, enums: Option<&[&str]>) -> Field {
        Field {
            ty: Some(ty.into()),
            required,
            enums: enums.map(|e| e.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        }
    }

    #[test]
    fn fields_added_removed_required_enums_types() {
        let o: BTreeMap<String, Field> = [
            ("spec", f(false, "object", None)),
            ("spec.a", f(false, "string", None)),
            ("spec.gone", f(false, "object", None)),
            ("spec.gone.x", f(false, "string", None)),
            ("spec.mode", f(false, "string", Some(&["A", "B", "C"]))),
            ("spec.n", f(false, "integer", None)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let n: BTreeMap<String, Field> = [
            ("spec", f(false, "object", None)),
            ("spec.a", f(true, "string", None)),
            ("spec.mode", f(false, "string", Some(&["A", "D"]))),
            ("spec.n", f(false, "string", None)),
            ("spec.new", f(true, "object", None)),
            ("spec.new.inner", f(true, "string", None)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let new = VersionSchema {
            version: crate::bundle::manifest::CrdVersion {
                name: "v1".into(),
                served: true,
                storage: true,
            },
            fields: Some(n),
            root_preserves: false,
        };
        let d = fields("v1", &o, &new);
        assert_eq!(
            d.fields_added,
            ["spec.new"],
            "children of a new field are not repeated"
        );
        assert_eq!(d.fields_removed, ["spec.gone"]);
        // spec.new.inner is required inside a new object: no existing object breaks.
        assert_eq!(d.newly_required, ["spec.a", "spec.new"]);
        assert_eq!(d.enum_values_removed[0].values, ["B", "C"]);
        assert_eq!(d.enum_values_added[0].values, ["D"]);
        assert_eq!(d.types_changed[0].path, "spec.n");
        let mut w = Vec::new();
        warn_fields(&d, &mut w);
        assert_eq!(w.len(), 4, "{w:?}");
        assert!(
            w[0].contains("spec.gone") && w[1].contains("spec.a"),
            "{w:?}"
        );
        assert_eq!(
            topmost(&["a[]".into(), "a[].b".into(), "ab".into()]),
            ["a[]", "ab"]
        );
    }
}
