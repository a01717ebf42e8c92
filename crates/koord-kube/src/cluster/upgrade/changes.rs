//! What a new release changes in the cluster, object by object, as the helm-diff plugin shows
//! it: the objects of the release's current manifest (from its record) against those of the new
//! one (helm's server-side render), matched by group, kind, namespace and name. For each object
//! changed, the fields an operator looks at are named first (images, replicas, RBAC rules,
//! webhooks, CRD versions and schemas), then how many other fields changed and the first few.
//! Pure: the caller hands both lists in.
//!
//! Fields the cluster fills in itself (a Service's `clusterIP`, `ipFamilies`, a
//! ServiceAccount's `secrets`, the webhook Secret's `data` that koord-manager writes) are not
//! changes: Koordinator's chart copies them from the live objects with `lookup`, so helm's
//! server-side render has them and the record of the first install does not. They are kept
//! apart ([`ObjectChange::server_filled`]), and an object that differs only in them is no
//! change ([`ObjectChange::only_server_filled`]).

use koord_base::crd;
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Other changed fields named before "and N more".
const MAX_OTHER: usize = 6;

/// What happens to one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Created by the new release.
    Add,
    /// Changed.
    Change,
    /// Deleted by helm (the new chart no longer renders it), unless it is kept.
    Remove,
}

/// One object the upgrade adds, changes or removes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectChange {
    /// Add, change, remove.
    pub action: Action,
    /// `Deployment`.
    pub kind: String,
    /// Its namespace (none for cluster-wide objects).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// What changes, one line each (for a change).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
    /// Only labels and annotations change (every object's `helm.sh/chart` label does).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub only_metadata: bool,
    /// Fields the cluster filled in, which the release's record does not set and the new
    /// render copies from the live object (`server_filled`): not changes, and not in
    /// `details`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub server_filled: Vec<String>,
}

impl ObjectChange {
    /// A change in nothing but fields the cluster fills in: no change at all.
    pub fn only_server_filled(&self) -> bool {
        self.action == Action::Change && self.details.is_empty() && !self.server_filled.is_empty()
    }

    /// `Deployment koordinator-system/koord-manager`.
    pub fn subject(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.kind, self.name),
            None => format!("{} {}", self.kind, self.name),
        }
    }
}

/// The identity of an object: (API group, kind, namespace, name). The version is left out:
/// an object served under a new version is the same object.
type Key = (String, String, Option<String>, String);

fn key(o: &Value, release_ns: &str) -> Option<Key> {
    let api = o["apiVersion"].as_str().unwrap_or_default();
    let group = api.rsplit_once('/').map_or("", |(g, _)| g).to_string();
    let kind = o["kind"].as_str()?.to_string();
    let name = o["metadata"]["name"].as_str()?.to_string();
    let ns = o["metadata"]["namespace"]
        .as_str()
        .map(str::to_string)
        .or_else(|| (!cluster_scoped(&kind)).then(|| release_ns.to_string()));
    Some((group, kind, ns, name))
}

/// Kinds of the chart that have no namespace (helm puts every other object without one into
/// the release namespace).
fn cluster_scoped(kind: &str) -> bool {
    matches!(
        kind,
        "Namespace"
            | "CustomResourceDefinition"
            | "ClusterRole"
            | "ClusterRoleBinding"
            | "PriorityClass"
            | "MutatingWebhookConfiguration"
            | "ValidatingWebhookConfiguration"
            | "ValidatingAdmissionPolicy"
            | "ValidatingAdmissionPolicyBinding"
            | "StorageClass"
            | "RuntimeClass"
            | "IngressClass"
            | "APIService"
            | "PersistentVolume"
            | "Node"
    )
}

/// The changes from the objects of `old` (the release's manifest) to `new`, sorted by kind,
/// namespace and name.
pub fn diff(old: &[Value], new: &[Value], release_ns: &str) -> Vec<ObjectChange> {
    let index = |list: &[Value]| -> BTreeMap<Key, Value> {
        list.iter()
            .filter_map(|o| key(o, release_ns).map(|k| (k, o.clone())))
            .collect()
    };
    let (o, n) = (index(old), index(new));
    let mut out = Vec::new();
    let change = |action, (_, kind, namespace, name): &Key, details, only_metadata| ObjectChange {
        action,
        kind: kind.clone(),
        namespace: namespace.clone(),
        name: name.clone(),
        details,
        only_metadata,
        server_filled: Vec::new(),
    };
    for (k, nv) in &n {
        match o.get(k) {
            None => out.push(change(Action::Add, k, Vec::new(), false)),
            Some(ov) if ov == nv => {}
            Some(ov) => {
                let (details, only_metadata, filled) = object_details(ov, nv);
                let mut c = change(Action::Change, k, details, only_metadata);
                c.server_filled = filled;
                out.push(c);
            }
        }
    }
    for k in o.keys().filter(|k| !n.contains_key(*k)) {
        let details = match o[k]["metadata"]["annotations"]["helm.sh/resource-policy"].as_str() {
            Some("keep") => {
                vec!["kept (helm.sh/resource-policy: keep): helm leaves it in place".into()]
            }
            _ => Vec::new(),
        };
        out.push(change(Action::Remove, k, details, false));
    }
    out.sort_by(|a, b| {
        (&a.kind, &a.namespace, &a.name, a.action).cmp(&(&b.kind, &b.namespace, &b.name, b.action))
    });
    out
}

/// Every leaf of `v` by path (`spec.template.spec.containers[0].image`), as JSON text.
fn leaves(v: &Value, path: &str, out: &mut BTreeMap<String, String>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                leaves(x, &p, out);
            }
        }
        Value::Array(a) if !a.is_empty() => {
            for (i, x) in a.iter().enumerate() {
                leaves(x, &format!("{path}[{i}]"), out);
            }
        }
        other => {
            out.insert(path.to_string(), other.to_string());
        }
    }
}

/// The pod template's containers, by name: (image).
fn containers(o: &Value) -> BTreeMap<String, String> {
    let spec = [
        "spec.template.spec",
        "spec.jobTemplate.spec.template.spec",
        "spec",
    ]
    .iter()
    .map(|p| p.split('.').fold(o, |v, k| &v[k]))
    .find(|s| s.get("containers").is_some());
    let mut out = BTreeMap::new();
    if let Some(spec) = spec {
        for list in ["initContainers", "containers"] {
            for c in spec[list].as_array().into_iter().flatten() {
                if let (Some(n), Some(i)) = (c["name"].as_str(), c["image"].as_str()) {
                    out.insert(n.to_string(), i.to_string());
                }
            }
        }
    }
    out
}

/// Fields the API server (or, for the webhook Secret's `data`, koord-manager) fills in, by
/// kind, as paths without indices: (kind, path or path prefix). `*` is any kind.
const SERVER_FILLED: &[(&str, &str)] = &[
    ("Service", "spec.clusterIP"),
    ("Service", "spec.clusterIPs"),
    ("Service", "spec.ipFamilies"),
    ("Service", "spec.ipFamilyPolicy"),
    ("Service", "spec.ipFamily"),
    ("Service", "spec.type"),
    ("Service", "spec.sessionAffinity"),
    ("Service", "spec.internalTrafficPolicy"),
    ("Service", "spec.ports[].nodePort"),
    ("Service", "spec.healthCheckNodePort"),
    ("ServiceAccount", "secrets"),
    ("Secret", "data"),
    ("*", "metadata.uid"),
    ("*", "metadata.resourceVersion"),
    ("*", "metadata.creationTimestamp"),
    ("*", "metadata.generation"),
    ("*", "metadata.managedFields"),
    ("*", "status"),
];

/// Whether the field at `path` of an object of `kind` is one the cluster fills in.
fn server_filled(kind: &str, path: &str) -> bool {
    let generic = super::crds::strip_indices(path);
    SERVER_FILLED.iter().any(|(k, p)| {
        (*k == "*" || *k == kind)
            && generic.strip_prefix(p).is_some_and(|rest| {
                rest.is_empty() || rest.starts_with('.') || rest.starts_with('[')
            })
    })
}

/// The lines that say what changes in one object, whether only its labels and annotations
/// do, and the fields the cluster filled in that the old object (the record) does not set.
fn object_details(o: &Value, n: &Value) -> (Vec<String>, bool, Vec<String>) {
    let mut d = Vec::new();
    let (co, cn) = (containers(o), containers(n));
    for (name, img) in &cn {
        match co.get(name) {
            Some(old) if old != img => d.push(format!("image of {name}: {old} → {img}")),
            None => d.push(format!("container {name} added: {img}")),
            _ => {}
        }
    }
    for name in co.keys().filter(|k| !cn.contains_key(*k)) {
        d.push(format!("container {name} removed"));
    }
    if o["spec"]["replicas"] != n["spec"]["replicas"] {
        d.push(format!(
            "replicas: {} → {}",
            text(&o["spec"]["replicas"]),
            text(&n["spec"]["replicas"])
        ));
    }
    if o.get("rules").is_some() || n.get("rules").is_some() {
        rules(&o["rules"], &n["rules"], &mut d);
    }
    if o.get("webhooks").is_some() || n.get("webhooks").is_some() {
        webhooks(&o["webhooks"], &n["webhooks"], &mut d);
    }
    if n["kind"] == "CustomResourceDefinition" {
        crd_details(o, n, &mut d);
    }
    let (mut lo, mut ln) = (BTreeMap::new(), BTreeMap::new());
    leaves(o, "", &mut lo);
    leaves(n, "", &mut ln);
    let covered = |p: &str| {
        p.starts_with("rules")
            || p.starts_with("webhooks")
            || p == "spec.replicas"
            || (p.ends_with(".image") && p.contains("ontainers["))
            || (n["kind"] == "CustomResourceDefinition" && p.starts_with("spec.versions"))
    };
    let kind = n["kind"].as_str().unwrap_or_default();
    // Set by the cluster: the record does not set it (absent or null), the render has it.
    let unset = |p: &str| lo.get(p).is_none_or(|v| v.as_str() == "null");
    let filled: Vec<String> = lo
        .keys()
        .chain(ln.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|p| lo.get(*p) != ln.get(*p) && unset(p) && server_filled(kind, p))
        .cloned()
        .collect();
    let changed: BTreeSet<&String> = lo
        .keys()
        .chain(ln.keys())
        .filter(|p| lo.get(*p) != ln.get(*p) && !filled.contains(p))
        .collect();
    let meta: Vec<&String> = changed
        .iter()
        .copied()
        .filter(|p| p.starts_with("metadata.labels") || p.starts_with("metadata.annotations"))
        .collect();
    let other: Vec<&String> = changed
        .iter()
        .copied()
        .filter(|p| !covered(p) && !meta.contains(p))
        .collect();
    let only_metadata = d.is_empty() && other.is_empty() && !meta.is_empty();
    if !meta.is_empty() {
        d.push(format!(
            "labels/annotations: {}",
            meta.iter()
                .map(|p| {
                    let k = p.split_once('.').map_or(p.as_str(), |(_, r)| r);
                    let k = k.split_once('.').map_or(k, |(_, r)| r);
                    format!(
                        "{k} ({} → {})",
                        lo.get(*p).map_or("-", |s| s),
                        ln.get(*p).map_or("-", |s| s)
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !other.is_empty() {
        let mut line = format!(
            "{} other field(s): {}",
            other.len(),
            other
                .iter()
                .take(MAX_OTHER)
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        if other.len() > MAX_OTHER {
            line.push_str(&format!(" and {} more", other.len() - MAX_OTHER));
        }
        d.push(line);
    }
    (d, only_metadata, filled)
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "(default)".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The permissions of a list of RBAC rules, one by one: (API group, resource or
/// non-resource URL, resource name or "", verb). Two lists that group the same permissions
/// differently (1.8.0 merges 1.7.0's rules) give the same set.
fn permissions(rules: &Value) -> BTreeSet<(String, String, String, String)> {
    let list = |r: &Value, k: &str| -> Vec<String> {
        r[k].as_array()
            .map(|a| a.iter().map(text).collect())
            .unwrap_or_default()
    };
    let mut out = BTreeSet::new();
    for r in rules.as_array().into_iter().flatten() {
        let verbs = list(r, "verbs");
        let mut names = list(r, "resourceNames");
        if names.is_empty() {
            names.push(String::new());
        }
        let targets: Vec<(String, String)> = if r.get("nonResourceURLs").is_some() {
            list(r, "nonResourceURLs")
                .into_iter()
                .map(|u| (String::new(), u))
                .collect()
        } else {
            let groups = list(r, "apiGroups");
            let resources = list(r, "resources");
            groups
                .iter()
                .flat_map(|g| resources.iter().map(move |res| (g.clone(), res.clone())))
                .collect()
        };
        for (g, res) in &targets {
            for n in &names {
                for v in &verbs {
                    out.insert((g.clone(), res.clone(), n.clone(), v.clone()));
                }
            }
        }
    }
    out
}

/// Permissions in lines: `get,list,watch configmaps,pods (core)`, the resources that take the
/// same verbs in one group on one line.
fn permission_lines(p: &BTreeSet<(String, String, String, String)>) -> Vec<String> {
    let mut verbs: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for (g, res, name, v) in p {
        let target = if name.is_empty() {
            res.clone()
        } else {
            format!("{res}/{name}")
        };
        verbs
            .entry((g.clone(), target))
            .or_default()
            .push(v.clone());
    }
    let mut lines: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for ((g, target), v) in verbs {
        lines.entry((g, v.join(","))).or_default().push(target);
    }
    lines
        .into_iter()
        .map(|((g, v), targets)| {
            let group = if g.is_empty() { "core".to_string() } else { g };
            format!("{v} {} ({group})", targets.join(","))
        })
        .collect()
}

/// What the RBAC rules grant or no longer grant, permission by permission; rules only
/// regrouped are said as such.
fn rules(o: &Value, n: &Value, d: &mut Vec<String>) {
    let (po, pn) = (permissions(o), permissions(n));
    let added: BTreeSet<_> = pn.difference(&po).cloned().collect();
    let removed: BTreeSet<_> = po.difference(&pn).cloned().collect();
    for l in permission_lines(&added) {
        d.push(format!("RBAC permission added: {l}"));
    }
    for l in permission_lines(&removed) {
        d.push(format!("RBAC permission removed: {l}"));
    }
    if added.is_empty() && removed.is_empty() && o != n {
        d.push("RBAC rules regrouped: the same permissions".into());
    }
}

fn webhooks(o: &Value, n: &Value, d: &mut Vec<String>) {
    let by_name = |v: &Value| -> BTreeMap<String, Value> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|w| w["name"].as_str().map(|n| (n.to_string(), w.clone())))
            .collect()
    };
    let (wo, wn) = (by_name(o), by_name(n));
    for (name, w) in &wn {
        match wo.get(name) {
            None => d.push(format!("webhook added: {name}")),
            Some(old) if old != w => {
                let fields: Vec<&str> = [
                    "clientConfig",
                    "rules",
                    "failurePolicy",
                    "namespaceSelector",
                    "objectSelector",
                    "sideEffects",
                    "timeoutSeconds",
                    "matchPolicy",
                    "admissionReviewVersions",
                    "reinvocationPolicy",
                    "matchConditions",
                ]
                .into_iter()
                .filter(|f| old[*f] != w[*f])
                .collect();
                d.push(format!("webhook {name} changes: {}", fields.join(", ")));
            }
            _ => {}
        }
    }
    for name in wo.keys().filter(|k| !wn.contains_key(*k)) {
        d.push(format!("webhook removed: {name}"));
    }
}

/// Versions, storage and schema fields of a CRD, by the one rule of [`crd`].
fn crd_details(o: &Value, n: &Value, d: &mut Vec<String>) {
    let parse = |v: &Value| {
        serde_yaml_ng::to_value(v)
            .ok()
            .and_then(|y| crd::from_value("CRD", &y).ok())
    };
    let (Some(so), Some(sn)) = (parse(o), parse(n)) else {
        return;
    };
    let names = |s: &crd::CrdSchema| -> BTreeSet<String> {
        s.versions.iter().map(|v| v.version.name.clone()).collect()
    };
    let (vo, vn) = (names(&so), names(&sn));
    for v in vn.difference(&vo) {
        d.push(format!("version {v} added"));
    }
    for v in vo.difference(&vn) {
        d.push(format!("version {v} removed"));
    }
    let stored = |s: &crd::CrdSchema| {
        s.versions
            .iter()
            .find(|v| v.version.storage)
            .map(|v| v.version.name.clone())
    };
    if let (Some(a), Some(b)) = (stored(&so), stored(&sn)) {
        if a != b {
            d.push(format!("stored version: {a} → {b}"));
        }
    }
    for old in &so.versions {
        let Some(new) = sn
            .versions
            .iter()
            .find(|v| v.version.name == old.version.name)
        else {
            continue;
        };
        if old.version.served && !new.version.served {
            d.push(format!("version {} no longer served", old.version.name));
        }
        let (Some(fo), Some(fnew)) = (&old.fields, &new.fields) else {
            continue;
        };
        let removed = fo.keys().filter(|p| new.prunes(p)).count();
        let added = fnew.keys().filter(|p| !fo.contains_key(*p)).count();
        if removed + added > 0 {
            d.push(format!(
                "{}: schema fields {added} added, {removed} removed",
                old.version.name
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deploy(image: &str, replicas: u64, chart: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "koord-manager", "namespace": "koordinator-system", "labels": {"helm.sh/chart": chart}},
               "spec": {"replicas": replicas, "template": {"spec": {"containers": [{"name": "manager", "image": image, "args": ["--a"]}]}}}})
    }

    /// What Koordinator's chart copies from the live objects with `lookup` (the webhook
    /// Service's cluster IPs, the ServiceAccount's secrets, the webhook Secret's data) is not a
    /// change; a port the chart changes is, and a clusterIP the record set and the render
    /// changes is too.
    #[test]
    fn fields_the_cluster_fills_in_are_kept_apart() {
        let svc = |extra: Value| {
            let mut s = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "koordinator-webhook-service", "namespace": "koordinator-system"},
                "spec": {"ports": [{"port": 443, "targetPort": 9876}], "selector": {"koord-app": "koord-manager"}}});
            for (k, v) in extra.as_object().unwrap() {
                s["spec"][k] = v.clone();
            }
            s
        };
        let filled = json!({"clusterIP": "10.0.0.7", "clusterIPs": ["10.0.0.7"], "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "type": "ClusterIP"});
        let sa = |secrets: Value| json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "koord-manager", "namespace": "koordinator-system"}, "secrets": secrets});
        let secret = |data: Value| json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "koordinator-webhook-certs", "namespace": "koordinator-system"}, "data": data});
        let old = vec![svc(json!({})), sa(Value::Null), secret(Value::Null)];
        let new = vec![
            svc(filled.clone()),
            sa(json!([{"name": "t"}])),
            secret(json!({"ca-cert": "Y2E="})),
        ];
        let c = diff(&old, &new, "default");
        assert_eq!(c.len(), 3, "{c:#?}");
        assert!(
            c.iter()
                .all(|c| c.only_server_filled() && c.details.is_empty()),
            "{c:#?}"
        );
        let s = c.iter().find(|c| c.kind == "Service").unwrap();
        assert_eq!(
            s.server_filled,
            [
                "spec.clusterIP",
                "spec.clusterIPs[0]",
                "spec.ipFamilies[0]",
                "spec.ipFamilyPolicy",
                "spec.type"
            ]
        );
        // A real change next to them is still one; a clusterIP the record set is not filled.
        let mut moved = svc(filled.clone());
        moved["spec"]["ports"][0]["targetPort"] = json!(9443);
        let c = diff(&[svc(json!({}))], &[moved], "default");
        assert!(!c[0].only_server_filled());
        assert_eq!(c[0].details, ["1 other field(s): spec.ports[0].targetPort"]);
        assert_eq!(c[0].server_filled.len(), 5);
        let c = diff(
            &[svc(json!({"clusterIP": "10.0.0.1"}))],
            &[svc(json!({"clusterIP": "10.0.0.2"}))],
            "default",
        );
        assert_eq!(c[0].details, ["1 other field(s): spec.clusterIP"]);
        assert!(c[0].server_filled.is_empty());
    }

    #[test]
    fn objects_added_changed_removed_with_what_an_operator_looks_at() {
        let role_old = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]});
        let role_new = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}, {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"]}]});
        let gone = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "old"}});
        let added = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "new", "namespace": "koordinator-system"}});
        let old = vec![deploy("r/m:v1.7.0", 2, "koordinator-1.7.0"), role_old, gone];
        let mut d_new = deploy("r/m:v1.8.0", 3, "koordinator-1.8.0");
        d_new["spec"]["template"]["spec"]["containers"][0]["args"] = json!(["--b"]);
        let new = vec![d_new, role_new.clone(), added];
        let c = diff(&old, &new, "default");
        let lines: Vec<String> = c
            .iter()
            .map(|c| format!("{:?} {}", c.action, c.subject()))
            .collect();
        assert_eq!(
            lines,
            [
                "Change ClusterRole r",
                "Remove ConfigMap default/old",
                "Change Deployment koordinator-system/koord-manager",
                "Add Service koordinator-system/new",
            ]
        );
        assert_eq!(
            c[0].details,
            ["RBAC permission added: patch deployments (apps)"]
        );
        // The same permissions grouped otherwise: said as such, nothing added or removed.
        let merged = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"},
            "rules": [{"apiGroups": ["", "apps"], "resources": ["pods"], "verbs": ["get"]},
                      {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"]}]});
        let split = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
                      {"apiGroups": ["apps"], "resources": ["pods", "deployments"], "verbs": ["get"]},
                      {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"]}]});
        let c2 = diff(std::slice::from_ref(&merged), &[split], "default");
        assert_eq!(
            c2[0].details,
            ["RBAC permission added: get deployments (apps)"]
        );
        let regrouped = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"},
            "rules": [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"]},
                      {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
                      {"apiGroups": ["apps"], "resources": ["pods"], "verbs": ["get"]}]});
        let c3 = diff(&[merged], &[regrouped], "default");
        assert_eq!(
            c3[0].details,
            ["RBAC rules regrouped: the same permissions"]
        );
        let d = &c[2].details;
        assert!(
            d.contains(&"image of manager: r/m:v1.7.0 → r/m:v1.8.0".to_string()),
            "{d:?}"
        );
        assert!(d.contains(&"replicas: 2 → 3".to_string()), "{d:?}");
        assert!(
            d.iter().any(|l| l.starts_with(
                "labels/annotations: helm.sh/chart (\"koordinator-1.7.0\" → \"koordinator-1.8.0\")"
            )),
            "{d:?}"
        );
        assert!(
            d.iter()
                .any(|l| l == "1 other field(s): spec.template.spec.containers[0].args[0]"),
            "{d:?}"
        );
        // Labels alone: said so.
        let mut relabelled = role_new.clone();
        relabelled["metadata"]["labels"] = json!({"helm.sh/chart": "x"});
        let c = diff(&[role_new], &[relabelled], "default");
        assert!(c[0].only_metadata, "{c:?}");
    }

    #[test]
    fn webhooks_and_crds() {
        let wh = |policy: &str| {
            json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "v"}, "webhooks": [{"name": "a.koordinator.sh", "failurePolicy": policy}]})
        };
        let c = diff(&[wh("Ignore")], &[wh("Fail")], "default");
        assert_eq!(
            c[0].details,
            ["webhook a.koordinator.sh changes: failurePolicy"]
        );
        let crd = |versions: Value| {
            json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "as.x.io"}, "spec": {"group": "x.io", "names": {"kind": "A", "plural": "as"}, "versions": versions}})
        };
        let schema = |props: Value| json!({"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "properties": props}}}});
        let old = crd(
            json!([{"name": "v1alpha1", "served": true, "storage": true, "schema": schema(json!({"a": {"type": "string"}, "b": {"type": "string"}}))}]),
        );
        let new = crd(
            json!([{"name": "v1alpha1", "served": true, "storage": false, "schema": schema(json!({"a": {"type": "string"}}))},
                             {"name": "v1alpha2", "served": true, "storage": true}]),
        );
        let c = diff(&[old], &[new], "default");
        assert_eq!(
            c[0].details[..3],
            [
                "version v1alpha2 added".to_string(),
                "stored version: v1alpha1 → v1alpha2".into(),
                "v1alpha1: schema fields 0 added, 1 removed".into(),
            ]
        );
    }
}
