//! What the cluster runs, checked against the bundle (`verify BUNDLE --cluster`): the release's
//! workloads, from the manifest of its newest revision (Helm's record, as the pre-flight reads
//! it), their pods and, per container (init, regular and ephemeral), the reference in the pod's
//! spec and the digest the node runs (`imageID` of the container's status), each compared with
//! the bundle's digests for that image: its top manifest (the index `load` pins to) or one of
//! its platforms' manifests.
//!
//! Every workload kind a chart renders is read: Deployments, DaemonSets and StatefulSets (their
//! pods found by the live object's selector, `matchLabels` and `matchExpressions` alike), Jobs
//! (by the selector the API server gave them), CronJobs (the Jobs they own, then those Jobs'
//! pods) and bare Pods (by name). The image a container should run comes from the release's
//! manifest (the same container of the same workload), so a container whose image was swapped
//! (`kubectl set image`) is named with what it was expected to run and what it runs.
//!
//! Three answers, never a silent "fine":
//! - **verified**: every container of the release runs a digest the bundle carries for it;
//! - **failed**: a container runs another digest (an old pod, a tag pushed again), runs an image
//!   the bundle does not carry (`NOT BUNDLED`: a swapped image, a sidecar injected by a
//!   webhook, a debug container), a workload of the release is missing, or the release renders
//!   no workload at all;
//! - **could not tell**: a container has not started (no `imageID` yet), a workload's pods
//!   cannot be selected, or no container was found.
//!
//! Memory is bounded by this module, never by the server: pods are judged one page at a time
//! (each page dropped before the next is read), at most [`MAX_SHOWN`] containers of each kind
//! of answer are kept to be shown (the rest are counted), quoted strings are cut to
//! [`MAX_FIELD`] bytes (with their length said), at most [`MAX_PODS`] distinct pods are judged,
//! a pod judged is remembered (to judge it once when selectors overlap) by the 32 bytes of its
//! name's SHA-256, and at most [`MAX_WORKLOADS`] workloads of the release's record are looked
//! at (the record is the server's too: past that, the rest are counted and the answer is
//! "could not tell").

use super::list::{self, Bounds};
use super::preflight::ReleaseInfo;
use super::{ClusterError, KubeClient};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use serde::Serialize;
use serde_json::Value;
use sha2::Digest as _;
use std::collections::{BTreeMap, HashSet};

/// The workload kinds whose pods are checked.
const WORKLOADS: &[&str] = &[
    "Deployment",
    "DaemonSet",
    "StatefulSet",
    "Job",
    "CronJob",
    "Pod",
];

/// Pods are listed 100 a page: one page of pods is what the check holds at a time.
const POD_BOUNDS: Bounds = Bounds {
    page_limit: 100,
    ..Bounds::DAEMONSETS
};

/// Jobs of a namespace are listed (to find those a CronJob owns) 100 a page.
const JOB_BOUNDS: Bounds = Bounds {
    page_limit: 100,
    ..Bounds::DAEMONSETS
};

/// Containers kept to be shown, per kind of answer (verified ones, and the others): the rest
/// are counted ([`Report::omitted`]).
pub const MAX_SHOWN: usize = 200;

/// Longest string kept from a pod or the release's record (an image reference, a name), in
/// bytes: a real reference (a registry host, a repository of at most 255 bytes, a tag of at
/// most 128 and a digest) fits; a longer one is cut, its length said.
pub const MAX_FIELD: usize = 512;

/// Workloads of the release's record looked at most (Koordinator's chart renders five): past
/// it, the rest are counted, not judged, and the answer is at best "could not tell".
pub const MAX_WORKLOADS: usize = 1000;

/// Distinct pods judged at most (a DaemonSet on 5,000 nodes is 5,000): past it, the check stops
/// with an error.
pub const MAX_PODS: usize = 100_000;

/// Jobs of one CronJob looked at most (Kubernetes keeps 3 successful and 1 failed by default).
const MAX_CRON_JOBS: usize = 100;

/// One image of the bundle, as `verify --cluster` compares it.
#[derive(Debug, Clone)]
pub struct Carried {
    /// `koordinator-sh/koordlet:v1.8.0` (the bundle's `ref`).
    pub reference: String,
    /// The top manifest digest (what `load` pins to).
    pub digest: String,
    /// Its platforms' manifests: (digest, platform).
    pub platforms: Vec<(String, String)>,
}

impl Carried {
    /// `REF@DIGEST`: what a container of this image is expected to run.
    fn pinned(&self) -> String {
        format!("{}@{}", self.reference, self.digest)
    }

    /// What digest `d` is of this image: `index`, a platform, or `None`.
    fn matches(&self, d: &str) -> Option<String> {
        if d == self.digest {
            return Some("index".to_string());
        }
        self.platforms
            .iter()
            .find(|(p, _)| p == d)
            .map(|(_, p)| p.clone())
    }
}

/// What a container runs, next to the bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// The node runs a digest the bundle carries for this image.
    Carried,
    /// The node runs another digest, or the container runs another image of the bundle than
    /// the release renders for it (a failure).
    Differs,
    /// Not started: no digest yet (could not tell).
    NotStarted,
    /// An image the bundle does not carry (a failure).
    NotBundled,
}

/// One container of one pod.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    /// `namespace/pod`.
    pub pod: String,
    /// The container's name (`init:` before an init container's, `ephemeral:` before an
    /// ephemeral container's).
    pub container: String,
    /// The reference in the pod's spec.
    pub spec: String,
    /// The digest in the spec's reference, if it names one.
    pub spec_digest: Option<String>,
    /// Whether the spec's digest is the bundle's for this image.
    pub spec_pinned: bool,
    /// The digest the node runs (from `imageID`).
    pub running: Option<String>,
    /// The image the release's manifest renders for this container, if it names it.
    pub rendered: Option<String>,
    /// What the container should run: `REF@DIGEST` of the bundle's image for it.
    pub expected: Option<String>,
    /// The bundle's image (`ref`) it is judged against, when the bundle carries one for it.
    pub bundle_image: Option<String>,
    /// The bundle's digest for it (top manifest).
    pub bundle_digest: Option<String>,
    /// What the running digest is in the bundle (`index`, `linux/amd64`, ...).
    pub matched: Option<String>,
    /// The verdict.
    pub verdict: Verdict,
}

/// Something about a workload, not a container: missing, or its pods cannot be selected.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    /// `Kind/namespace/name`, or the release.
    pub subject: String,
    /// What is wrong.
    pub message: String,
    /// A failure (`true`) or "could not tell" (`false`).
    pub failure: bool,
}

/// The check's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Every container of the release runs a digest the bundle carries for it.
    Verified,
    /// Something runs that the bundle does not carry, or a workload is missing.
    Failed,
    /// Nothing failed, but not everything could be told (not started, no selector, nothing
    /// found).
    CouldNotTell,
}

/// Containers counted by verdict (all of them, also those not kept to be shown).
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    /// Verified.
    pub carried: usize,
    /// Another digest.
    pub differs: usize,
    /// Not started.
    pub not_started: usize,
    /// Not an image of the bundle.
    pub not_bundled: usize,
}

impl Counts {
    /// Every container judged.
    pub fn total(&self) -> usize {
        self.carried + self.differs + self.not_started + self.not_bundled
    }
}

/// The one-line verdict (text and `--json` alike).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// The answer.
    pub outcome: Outcome,
    /// Containers that run a digest the bundle carries.
    pub verified: usize,
    /// Containers judged.
    pub containers: usize,
    /// `12 of 14 containers verified (1 DIFFERS, 1 NOT STARTED)`.
    pub line: String,
}

/// The check of one release.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Release name.
    pub release: String,
    /// Its namespace.
    pub namespace: String,
    /// The revision whose manifest named the workloads.
    pub revision: u32,
    /// Its Helm status.
    pub status: String,
    /// Its chart version.
    pub chart_version: Option<String>,
    /// When the newest revision is not deployed (failed, pending): the last deployed one,
    /// whose workloads were judged too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deployed_revision: Option<u32>,
    /// Workloads of the release (`Kind/name`).
    pub workloads: Vec<String>,
    /// Containers of their pods: every one that does not run what the bundle carries, and
    /// those that do, each up to [`MAX_SHOWN`].
    pub containers: Vec<Container>,
    /// Every container judged, by verdict.
    pub counts: Counts,
    /// Containers judged but not kept in `containers` (past [`MAX_SHOWN`]).
    pub omitted: usize,
    /// Workloads that are missing or whose pods cannot be selected.
    pub problems: Vec<Problem>,
    /// The verdict.
    pub verdict: Summary,
}

impl Report {
    /// Containers with a verdict (all of them, also those not kept).
    pub fn count(&self, v: Verdict) -> usize {
        match v {
            Verdict::Carried => self.counts.carried,
            Verdict::Differs => self.counts.differs,
            Verdict::NotStarted => self.counts.not_started,
            Verdict::NotBundled => self.counts.not_bundled,
        }
    }

    /// Every container of the release runs a digest the bundle carries, and there is at least
    /// one.
    pub fn ok(&self) -> bool {
        self.verdict.outcome == Outcome::Verified
    }

    /// Work out the verdict from the counts and problems.
    fn conclude(&mut self) {
        let c = &self.counts;
        let failures = c.differs
            + c.not_bundled
            + self.problems.iter().filter(|p| p.failure).count()
            + usize::from(self.workloads.is_empty());
        let unknown = c.not_started + self.problems.iter().filter(|p| !p.failure).count();
        let outcome = if failures > 0 {
            Outcome::Failed
        } else if unknown > 0 || c.total() == 0 {
            Outcome::CouldNotTell
        } else {
            Outcome::Verified
        };
        let mut parts = Vec::new();
        for (n, what) in [
            (c.differs, "DIFFERS"),
            (c.not_bundled, "NOT BUNDLED"),
            (c.not_started, "NOT STARTED"),
        ] {
            if n > 0 {
                parts.push(format!("{n} {what}"));
            }
        }
        let problems = self.problems.len();
        if problems > 0 {
            parts.push(format!(
                "{problems} {} with a problem",
                koord_base::text::plural(problems, "workload", "workloads")
            ));
        }
        if self.workloads.is_empty() {
            parts.push("the release renders no workload".into());
        } else if c.total() == 0 {
            parts.push("no container found".into());
        }
        let mut line = format!(
            "{} of {} {} verified",
            c.carried,
            c.total(),
            koord_base::text::plural(c.total(), "container", "containers")
        );
        if !parts.is_empty() {
            line.push_str(&format!(" ({})", parts.join(", ")));
        }
        line.push_str(match outcome {
            Outcome::Verified => ": VERIFIED",
            Outcome::Failed => ": FAILED",
            Outcome::CouldNotTell => ": COULD NOT TELL",
        });
        self.verdict = Summary {
            outcome,
            verified: c.carried,
            containers: c.total(),
            line,
        };
    }
}

/// The check did not verify the release: [`Outcome::Failed`] or [`Outcome::CouldNotTell`],
/// told apart by the exit code (1 and 4, `cmd::exit_code`).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct NotVerified {
    /// The verdict line and what failed.
    pub message: String,
    /// Nothing failed, but not everything could be told.
    pub could_not_tell: bool,
}

impl koord_base::exit::Classify for NotVerified {
    fn exit_class(&self) -> Option<koord_base::exit::ExitClass> {
        use koord_base::exit::ExitClass as C;
        Some(if self.could_not_tell {
            C::CouldNotTell
        } else {
            C::Input
        })
    }
}

/// The `sha256:<64 hex>` a reference or an `imageID` ends with.
pub fn digest_in(s: &str) -> Option<String> {
    let at = s.rfind("sha256:")?;
    let hex = &s[at + 7..];
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| format!("sha256:{}", hex.to_ascii_lowercase()))
}

/// The repository of a reference's name (no digest): its tag, if any, cut off (a `:` after
/// the last `/`; a registry's port is before it).
fn repository(name: &str) -> &str {
    let slash = name.rfind('/').map_or(0, |i| i + 1);
    match name[slash..].rfind(':') {
        Some(i) => &name[..slash + i],
        None => name,
    }
}

/// `name` is `want`, or ends with `/want` (under any registry and prefix).
fn names(name: &str, want: &str) -> bool {
    name == want
        || name
            .strip_suffix(want)
            .is_some_and(|head| head.ends_with('/'))
}

/// The bundle's image a reference is: of the same repository (under any registry and prefix),
/// the same tag first, else the one whose digests hold `running`, else the first; with no
/// repository of the bundle, by the digest the reference names.
fn carried_for<'a>(
    reference: &str,
    running: Option<&str>,
    carried: &'a [Carried],
) -> Option<&'a Carried> {
    let name = reference.split('@').next().unwrap_or(reference);
    let repo = repository(name);
    let same: Vec<&Carried> = carried
        .iter()
        .filter(|c| names(repo, repository(&c.reference)))
        .collect();
    same.iter()
        .find(|c| names(name, &c.reference))
        .or_else(|| {
            let r = running?;
            same.iter().find(|c| c.matches(r).is_some())
        })
        .or(same.first())
        .copied()
        .or_else(|| {
            let d = digest_in(reference)?;
            carried.iter().find(|c| c.matches(&d).is_some())
        })
}

/// `s`, cut to [`MAX_FIELD`] bytes (at a character boundary), a cut marked with `…` and the
/// length of the whole: `reg/xxxx… (1048580 bytes, cut)`.
fn bounded(s: &str) -> String {
    if s.len() <= MAX_FIELD {
        return s.to_string();
    }
    let mut end = MAX_FIELD;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes, cut)", &s[..end], s.len())
}

/// Judge one container: its spec reference, its status's `imageID` (empty when not started)
/// and the image the release's manifest renders for it (`None` when it names none: an
/// ephemeral or injected container).
pub fn judge(
    pod: &str,
    container: &str,
    spec: &str,
    image_id: Option<&str>,
    rendered: Option<&str>,
    carried: &[Carried],
) -> Container {
    let running = image_id.filter(|s| !s.is_empty()).and_then(digest_in);
    let of_spec = carried_for(spec, running.as_deref(), carried);
    let of_release = rendered.and_then(|r| carried_for(r, running.as_deref(), carried));
    // What it should run: what the release renders for it, else what its spec names.
    let target = of_release.or(of_spec);
    let matched = match (target, &running) {
        (Some(t), Some(r)) => t.matches(r),
        _ => None,
    };
    let swapped = match (of_spec, of_release) {
        (Some(s), Some(r)) => repository(&s.reference) != repository(&r.reference),
        _ => false,
    };
    let verdict = match (of_spec, &running) {
        (None, _) => Verdict::NotBundled,
        (Some(_), _) if swapped => Verdict::Differs,
        (Some(_), None) => Verdict::NotStarted,
        (Some(_), Some(_)) if matched.is_some() => Verdict::Carried,
        (Some(_), Some(_)) => Verdict::Differs,
    };
    let spec_digest = digest_in(spec);
    Container {
        pod: bounded(pod),
        container: bounded(container),
        spec: bounded(spec),
        spec_pinned: target.is_some_and(|c| spec_digest.as_deref() == Some(c.digest.as_str())),
        spec_digest,
        running,
        rendered: rendered.map(bounded),
        expected: target.map(Carried::pinned),
        bundle_image: target.map(|c| c.reference.clone()),
        bundle_digest: target.map(|c| c.digest.clone()),
        matched,
        verdict,
    }
}

/// One workload of the release's manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Workload {
    kind: String,
    namespace: String,
    name: String,
    /// Container (`name`, `init:name`) → the image the manifest renders for it.
    rendered: BTreeMap<String, String>,
}

impl Workload {
    fn subject(&self) -> String {
        format!("{}/{}/{}", self.kind, self.namespace, self.name)
    }
}

/// A label selector (`matchLabels` and `matchExpressions`) as the `labelSelector` query of a
/// LIST: `k=v,k in (a,b),k notin (c),k,!k`. An empty or absent selector, or one that cannot be
/// written so, is an error: it would select every pod, or none.
pub fn selector_query(sel: &Value) -> Result<String, String> {
    let mut parts = Vec::new();
    if let Some(m) = sel.get("matchLabels").filter(|m| !m.is_null()) {
        let m = m.as_object().ok_or("matchLabels is not a map")?;
        for (k, v) in m {
            let v = v
                .as_str()
                .ok_or_else(|| format!("matchLabels {k:?} is not a string"))?;
            parts.push(format!("{k}={v}"));
        }
    }
    if let Some(e) = sel.get("matchExpressions").filter(|e| !e.is_null()) {
        let e = e.as_array().ok_or("matchExpressions is not a list")?;
        for x in e {
            let key = x["key"]
                .as_str()
                .filter(|k| !k.is_empty())
                .ok_or("a matchExpression without a key")?;
            let values: Vec<&str> = x["values"]
                .as_array()
                .map(|v| v.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let op = x["operator"].as_str().unwrap_or_default();
            parts.push(match op {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(format!("matchExpression {key:?} {op} has no values"))
                }
                "In" => format!("{key} in ({})", values.join(",")),
                "NotIn" => format!("{key} notin ({})", values.join(",")),
                "Exists" => key.to_string(),
                "DoesNotExist" => format!("!{key}"),
                other => {
                    return Err(format!(
                        "matchExpression {key:?} has operator {other:?}, which is not In, NotIn, Exists or DoesNotExist"
                    ))
                }
            });
        }
    }
    if parts.is_empty() {
        return Err("an empty selector (it would select every pod)".into());
    }
    Ok(parts.join(","))
}

/// The pod template's spec of a workload object (`spec` of a Pod).
fn pod_spec<'v>(kind: &str, v: &'v Value) -> &'v Value {
    match kind {
        "Pod" => &v["spec"],
        "CronJob" => &v["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        _ => &v["spec"]["template"]["spec"],
    }
}

/// The workloads of a release manifest, at most [`MAX_WORKLOADS`], and how many more it
/// renders. Their names and images are kept cut to [`MAX_FIELD`] bytes.
fn workloads(manifest: &str, namespace: &str) -> Result<(Vec<Workload>, usize), String> {
    let docs = koord_base::yaml::parse_documents(
        "the release's manifest",
        manifest.as_bytes(),
        &koord_base::yaml::MANIFESTS,
    )
    .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut more = 0usize;
    for d in docs {
        let v: Value = serde_json::to_value(&d).map_err(|e| e.to_string())?;
        let kind = v["kind"].as_str().unwrap_or_default();
        if !WORKLOADS.contains(&kind) {
            continue;
        }
        if out.len() >= MAX_WORKLOADS {
            more += 1;
            continue;
        }
        let name = v["metadata"]["name"].as_str().unwrap_or_default();
        if name.is_empty() {
            return Err(format!("a {kind} without a name"));
        }
        let ns = v["metadata"]["namespace"]
            .as_str()
            .filter(|n| !n.is_empty())
            .unwrap_or(namespace);
        let spec = pod_spec(kind, &v);
        let mut rendered = BTreeMap::new();
        for (field, prefix) in [("initContainers", "init:"), ("containers", "")] {
            for c in spec[field]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
            {
                if let (Some(n), Some(i)) = (c["name"].as_str(), c["image"].as_str()) {
                    rendered.insert(bounded(&format!("{prefix}{n}")), bounded(i));
                }
            }
        }
        out.push(Workload {
            kind: kind.to_string(),
            namespace: bounded(ns),
            name: bounded(name),
            rendered,
        });
    }
    Ok((out, more))
}

/// The API path of a workload object.
fn object_path(kind: &str, ns: &str, name: &str) -> String {
    let (group, plural) = match kind {
        "Deployment" => ("apis/apps/v1", "deployments"),
        "DaemonSet" => ("apis/apps/v1", "daemonsets"),
        "StatefulSet" => ("apis/apps/v1", "statefulsets"),
        "Job" => ("apis/batch/v1", "jobs"),
        "CronJob" => ("apis/batch/v1", "cronjobs"),
        _ => ("api/v1", "pods"),
    };
    format!(
        "/{group}/namespaces/{}/{plural}/{}",
        koord_base::text::percent_encode(ns),
        koord_base::text::percent_encode(name)
    )
}

/// The pods judged so far: kept up to [`MAX_SHOWN`] per kind of answer, counted all.
struct Tally<'a> {
    carried: &'a [Carried],
    /// SHA-256 of each pod's `namespace/name` judged: 32 bytes a pod, whatever its name's length.
    seen: HashSet<[u8; 32]>,
    shown_ok: usize,
    shown_bad: usize,
    containers: Vec<Container>,
    counts: Counts,
    omitted: usize,
    too_many: bool,
}

impl<'a> Tally<'a> {
    fn new(carried: &'a [Carried]) -> Self {
        Tally {
            carried,
            seen: HashSet::new(),
            shown_ok: 0,
            shown_bad: 0,
            containers: Vec::new(),
            counts: Counts::default(),
            omitted: 0,
            too_many: false,
        }
    }

    /// Judge every container of pod `p` (of workload `w`), once per pod.
    fn pod(&mut self, p: &Pod, w: &Workload) {
        let name = format!(
            "{}/{}",
            p.metadata.namespace.as_deref().unwrap_or(&w.namespace),
            p.metadata.name.as_deref().unwrap_or_default()
        );
        if self.seen.len() >= MAX_PODS {
            self.too_many = true;
            return;
        }
        // Two workloads whose selectors overlap list the same pod once.
        let key: [u8; 32] = sha2::Sha256::digest(name.as_bytes()).into();
        if !self.seen.insert(key) {
            return;
        }
        let Some(spec) = &p.spec else { return };
        let status = p.status.as_ref();
        fn id<'p>(statuses: Option<&'p Vec<ContainerStatus>>, n: &str) -> Option<&'p str> {
            statuses
                .and_then(|st| st.iter().find(|s| s.name == n))
                .map(|s| s.image_id.as_str())
        }
        for c in spec.init_containers.as_deref().unwrap_or_default() {
            let key = format!("init:{}", c.name);
            let image_id = id(
                status.and_then(|s| s.init_container_statuses.as_ref()),
                &c.name,
            );
            self.add(&name, &key, c.image.as_deref(), image_id, w);
        }
        for c in &spec.containers {
            let image_id = id(status.and_then(|s| s.container_statuses.as_ref()), &c.name);
            self.add(&name, &c.name, c.image.as_deref(), image_id, w);
        }
        for c in spec.ephemeral_containers.as_deref().unwrap_or_default() {
            let key = format!("ephemeral:{}", c.name);
            let image_id = id(
                status.and_then(|s| s.ephemeral_container_statuses.as_ref()),
                &c.name,
            );
            self.add(&name, &key, c.image.as_deref(), image_id, w);
        }
    }

    fn add(
        &mut self,
        pod: &str,
        key: &str,
        image: Option<&str>,
        image_id: Option<&str>,
        w: &Workload,
    ) {
        let rendered = w.rendered.get(key).map(String::as_str);
        let c = judge(
            pod,
            key,
            image.unwrap_or_default(),
            image_id,
            rendered,
            self.carried,
        );
        let shown = match c.verdict {
            Verdict::Carried => {
                self.counts.carried += 1;
                &mut self.shown_ok
            }
            v => {
                match v {
                    Verdict::Differs => self.counts.differs += 1,
                    Verdict::NotStarted => self.counts.not_started += 1,
                    _ => self.counts.not_bundled += 1,
                }
                &mut self.shown_bad
            }
        };
        if *shown < MAX_SHOWN {
            *shown += 1;
            self.containers.push(c);
        } else {
            self.omitted += 1;
        }
    }
}

/// Check release `release` (in `namespace`) against `carried`.
pub async fn check(
    client: &KubeClient,
    namespace: &str,
    release: &str,
    carried: &[Carried],
) -> Result<Report, ClusterError> {
    let records = client.url(&format!("/api/v1/namespaces/{namespace}/secrets"));
    let info = super::preflight::release_revision(client, namespace, release)
        .await?
        .ok_or_else(|| ClusterError::Api {
            url: records.clone(),
            message: format!(
                "no Helm release {release:?} in namespace {namespace}: pass --release NAME and --namespace NS of the installed release (helm list -A)"
            ),
            transient: false,
        })?;
    // A record that cannot be decoded names no workload: that is not "nothing to check".
    let manifest = info.manifest.as_deref().ok_or_else(|| ClusterError::Api {
        url: records.clone(),
        message: format!(
            "the record of release {release} revision {} (sh.helm.release.v1.{release}.v{}) cannot be decoded ({}), so the release's workloads are unknown and nothing can be verified: look at it with `helm get manifest {release} -n {namespace}`",
            info.revision,
            info.revision,
            info.unreadable.as_deref().unwrap_or("it holds no manifest")
        ),
        transient: false,
    })?;
    let manifest_err = |revision: u32| {
        let url = records.clone();
        move |m: String| ClusterError::Api {
            url,
            message: format!("the manifest of release {release} revision {revision}: {m}"),
            transient: false,
        }
    };
    let (mut found, mut more) =
        workloads(manifest, namespace).map_err(manifest_err(info.revision))?;
    let unsettled = unsettled(&info, release, namespace);
    let mut report = Report {
        release: release.to_string(),
        namespace: namespace.to_string(),
        revision: info.revision,
        status: info.status.clone(),
        chart_version: info.chart_version.clone(),
        deployed_revision: None,
        workloads: Vec::new(),
        containers: Vec::new(),
        counts: Counts::default(),
        omitted: 0,
        problems: Vec::new(),
        verdict: Summary {
            outcome: Outcome::CouldNotTell,
            verified: 0,
            containers: 0,
            line: String::new(),
        },
    };
    if let Some(u) = unsettled {
        // What the last deployed revision applied is judged too.
        match u.deployed {
            Some((revision, Some(m))) => {
                let (old, old_more) = workloads(m, namespace).map_err(manifest_err(revision))?;
                more += old_more;
                for w in old {
                    let same = |f: &Workload| {
                        (&f.kind, &f.namespace, &f.name) == (&w.kind, &w.namespace, &w.name)
                    };
                    if found.iter().any(same) {
                        continue;
                    }
                    if found.len() < MAX_WORKLOADS {
                        found.push(w);
                    } else {
                        more += 1;
                    }
                }
                report.deployed_revision = Some(revision);
            }
            Some((revision, None)) => report.problems.push(Problem {
                subject: format!("release {release} revision {revision}"),
                message: format!(
                    "the last deployed revision, whose objects may still run, cannot be decoded, so its workloads are unknown: look at it with `helm get manifest {release} -n {namespace} --revision {revision}`"
                ),
                failure: false,
            }),
            None => {}
        }
        report.problems.extend(u.problem);
    }
    if more > 0 {
        report.problems.push(Problem {
            subject: format!("release {release}"),
            message: format!(
                "its record renders {} workloads: the first {MAX_WORKLOADS} were judged, the other {more} were not",
                MAX_WORKLOADS + more
            ),
            failure: false,
        });
    }
    let mut tally = Tally::new(carried);
    for w in &found {
        report.workloads.push(format!("{}/{}", w.kind, w.name));
        if let Some(p) = workload(client, w, &mut tally).await? {
            report.problems.push(p);
        }
        if tally.too_many {
            return Err(ClusterError::Api {
                url: client.url(&format!("/api/v1/namespaces/{}/pods", w.namespace)),
                message: format!(
                    "more than {MAX_PODS} pods of release {release}: the check stopped there, and nothing was verified"
                ),
                transient: false,
            });
        }
    }
    report.containers = tally.containers;
    report.counts = tally.counts;
    report.omitted = tally.omitted;
    report.conclude();
    Ok(report)
}

/// A newest revision that is not deployed: an upgrade that failed half-way, or one helm is
/// running or was stopped in (`pending-*`, `uninstalling`). helm applies a new revision's
/// objects before it deletes what the last deployed revision had and the new one dropped, and
/// compares with that revision on the next upgrade, so what it applied may still run and is
/// still the release's.
struct Unsettled<'a> {
    /// The last deployed revision (not the newest) and its manifest, if it can be decoded.
    deployed: Option<(u32, Option<&'a str>)>,
    /// "Could not tell" when helm is, or was, in the middle of an operation: what runs may
    /// still change, or be left half-done.
    problem: Option<Problem>,
}

/// The statuses a newest revision rests in: nothing of helm's is under way.
const SETTLED: &[&str] = &["deployed", "failed", "superseded", "uninstalled"];

fn unsettled<'a>(info: &'a ReleaseInfo, release: &str, namespace: &str) -> Option<Unsettled<'a>> {
    if info.status == "deployed" {
        return None;
    }
    let deployed = info
        .last_deployed
        .as_ref()
        .filter(|d| d.revision != info.revision)
        .map(|d| (d.revision, d.manifest.as_deref()));
    let problem = (!SETTLED.contains(&info.status.as_str())).then(|| Problem {
        subject: format!("release {release}"),
        message: format!(
            "its newest revision, {}, is {}: helm is in the middle of an operation on it, or was stopped in one, so what runs may still change or be left half-done; let helm finish, or roll back (helm rollback {release} -n {namespace}), then verify again",
            info.revision,
            koord_base::text::printable(&info.status)
        ),
        failure: false,
    });
    Some(Unsettled { deployed, problem })
}

/// Judge the pods of one workload; a problem when it is missing or its pods cannot be selected.
async fn workload(
    client: &KubeClient,
    w: &Workload,
    tally: &mut Tally<'_>,
) -> Result<Option<Problem>, ClusterError> {
    let problem = |message: String, failure: bool| {
        Some(Problem {
            subject: w.subject(),
            message,
            failure,
        })
    };
    if w.kind == "Pod" {
        let path = object_path("Pod", &w.namespace, &w.name);
        return Ok(match client.get::<Pod>(&path).await? {
            Some(p) => {
                tally.pod(&p, w);
                None
            }
            None => problem(
                "the release renders this Pod, and the cluster does not have it".into(),
                true,
            ),
        });
    }
    let path = object_path(&w.kind, &w.namespace, &w.name);
    let Some(live) = client.get_json(&path).await? else {
        // A finished Job may have been deleted (ttlSecondsAfterFinished): what it ran can no
        // longer be told. Any other workload should be there.
        let job = w.kind == "Job";
        return Ok(problem(
            format!(
                "the release renders this {}, and the cluster does not have it{}",
                w.kind,
                if job {
                    " (deleted after it finished?): what it ran cannot be told"
                } else {
                    ""
                }
            ),
            !job,
        ));
    };
    let selectors: Vec<(String, Value)> = if w.kind == "CronJob" {
        let uid = live["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        drop(live);
        let mut jobs = Vec::new();
        let mut more = 0usize;
        let jobs_path = format!(
            "/apis/batch/v1/namespaces/{}/jobs",
            koord_base::text::percent_encode(&w.namespace)
        );
        list::list_json(client, &jobs_path, JOB_BOUNDS, |page| {
            for j in page {
                let owned = j["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|o| {
                        o.iter()
                            .any(|r| r["uid"] == uid.as_str() && !uid.is_empty())
                    });
                if !owned {
                    continue;
                }
                if jobs.len() >= MAX_CRON_JOBS {
                    more += 1;
                    continue;
                }
                let name = j["metadata"]["name"].as_str().unwrap_or_default();
                jobs.push((
                    format!("Job {}", bounded(name)),
                    j["spec"]["selector"].clone(),
                ));
            }
        })
        .await?;
        if more > 0 {
            return Ok(problem(
                format!(
                    "owns more than {MAX_CRON_JOBS} Jobs ({} in all): their pods were not all judged",
                    MAX_CRON_JOBS + more
                ),
                false,
            ));
        }
        jobs
    } else {
        vec![(
            format!("{} {}", w.kind, w.name),
            live["spec"]["selector"].clone(),
        )]
    };
    for (what, selector) in selectors {
        let query = match selector_query(&selector) {
            Ok(q) => q,
            Err(e) => {
                return Ok(problem(
                    format!("the pods of {what} cannot be selected: its selector is {e}"),
                    false,
                ))
            }
        };
        let path = format!(
            "/api/v1/namespaces/{}/pods?labelSelector={}",
            koord_base::text::percent_encode(&w.namespace),
            koord_base::text::percent_encode(&query)
        );
        list::list::<Pod, _>(client, &path, POD_BOUNDS, |page| {
            for p in &page {
                tally.pod(p, w);
            }
        })
        .await?;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn carried() -> Vec<Carried> {
        vec![Carried {
            reference: "koordinator-sh/koordlet:v1.7.0".into(),
            digest: format!("sha256:{}", "a".repeat(64)),
            platforms: vec![(format!("sha256:{}", "b".repeat(64)), "linux/amd64".into())],
        }]
    }

    fn report(containers: Vec<Container>, workloads: usize) -> Report {
        let mut counts = Counts::default();
        for c in &containers {
            match c.verdict {
                Verdict::Carried => counts.carried += 1,
                Verdict::Differs => counts.differs += 1,
                Verdict::NotStarted => counts.not_started += 1,
                Verdict::NotBundled => counts.not_bundled += 1,
            }
        }
        let mut r = Report {
            release: "koordinator".into(),
            namespace: "default".into(),
            revision: 1,
            status: "deployed".into(),
            chart_version: None,
            deployed_revision: None,
            workloads: (0..workloads).map(|i| format!("Deployment/w{i}")).collect(),
            containers,
            counts,
            omitted: 0,
            problems: Vec::new(),
            verdict: Summary {
                outcome: Outcome::Verified,
                verified: 0,
                containers: 0,
                line: String::new(),
            },
        };
        r.conclude();
        r
    }

    #[test]
    fn a_container_is_judged_by_the_digest_its_node_runs() {
        let (a, b, c) = ("a".repeat(64), "b".repeat(64), "c".repeat(64));
        let spec = format!("reg.local/koordinator-sh/koordlet:v1.7.0@sha256:{a}");
        let ok = judge(
            "ns/p",
            "koordlet",
            &spec,
            Some(&format!("reg.local/koordinator-sh/koordlet@sha256:{a}")),
            None,
            &carried(),
        );
        assert_eq!(
            (ok.verdict, ok.matched.as_deref(), ok.spec_pinned),
            (Verdict::Carried, Some("index"), true)
        );
        assert_eq!(
            ok.expected,
            Some(format!("koordinator-sh/koordlet:v1.7.0@sha256:{a}"))
        );
        let plat = judge(
            "ns/p",
            "koordlet",
            &spec,
            Some(&format!("docker-pullable://x@sha256:{b}")),
            None,
            &carried(),
        );
        assert_eq!(
            (plat.verdict, plat.matched.as_deref()),
            (Verdict::Carried, Some("linux/amd64"))
        );
        let other = judge(
            "ns/p",
            "koordlet",
            &spec,
            Some(&format!("sha256:{c}")),
            None,
            &carried(),
        );
        assert_eq!(other.verdict, Verdict::Differs);
        let waiting = judge("ns/p", "koordlet", &spec, Some(""), None, &carried());
        assert_eq!(waiting.verdict, Verdict::NotStarted);
        let by_tag = judge(
            "ns/p",
            "koordlet",
            "reg.local/koordinator-sh/koordlet:v1.7.0",
            None,
            None,
            &carried(),
        );
        assert_eq!(
            (by_tag.verdict, by_tag.spec_pinned),
            (Verdict::NotStarted, false)
        );
        let theirs = judge(
            "ns/p",
            "sidecar",
            "istio/proxyv2:1.20",
            Some(&format!("sha256:{c}")),
            None,
            &carried(),
        );
        assert_eq!(theirs.verdict, Verdict::NotBundled);
        // A tag that only ends like the bundle's is not it.
        let near = judge(
            "ns/p",
            "x",
            "reg.local/evil-koordinator-sh/koordlet:v1.7.0",
            None,
            None,
            &carried(),
        );
        assert_eq!(near.verdict, Verdict::NotBundled);
        // NOT BUNDLED is a failure, not a pass (before: `ok()` counted only DIFFERS).
        let r = report(vec![ok.clone(), theirs.clone()], 1);
        assert!(!r.ok());
        assert_eq!(r.verdict.outcome, Outcome::Failed);
        assert!(
            r.verdict
                .line
                .starts_with("1 of 2 containers verified (1 NOT BUNDLED)"),
            "{}",
            r.verdict.line
        );
    }

    /// An old pod of a repository the bundle carries (`v1.6.0` of koordlet after the upgrade)
    /// DIFFERS (before: NOT BUNDLED, and a pass); an image swapped in for the one the release
    /// renders is named with both.
    #[test]
    fn an_old_tag_of_a_carried_repository_differs_and_a_swap_names_both_images() {
        let (a, c) = ("a".repeat(64), "c".repeat(64));
        let old = judge(
            "ns/p",
            "koordlet",
            &format!("reg.local/koordinator-sh/koordlet:v1.6.0@sha256:{c}"),
            Some(&format!("reg.local/koordinator-sh/koordlet@sha256:{c}")),
            None,
            &carried(),
        );
        assert_eq!(old.verdict, Verdict::Differs);
        assert_eq!(old.bundle_digest, Some(format!("sha256:{a}")));
        let rendered = format!("reg.local/koordinator-sh/koordlet:v1.7.0@sha256:{a}");
        let evil = judge(
            "ns/p",
            "koordlet",
            "evil.example/x:1",
            Some(&format!("evil.example/x@sha256:{a}")),
            Some(&rendered),
            &carried(),
        );
        assert_eq!(evil.verdict, Verdict::NotBundled);
        assert_eq!(
            evil.expected,
            Some(format!("koordinator-sh/koordlet:v1.7.0@sha256:{a}"))
        );
        assert_eq!(evil.rendered.as_deref(), Some(rendered.as_str()));
    }

    #[test]
    fn not_started_could_not_tell_and_no_workload_fails() {
        let a = "a".repeat(64);
        let spec = format!("reg.local/koordinator-sh/koordlet:v1.7.0@sha256:{a}");
        let ok = judge("p", "k", &spec, Some(&spec), None, &carried());
        let waiting = judge("p", "k", &spec, None, None, &carried());
        let r = report(vec![ok.clone(), waiting], 1);
        assert_eq!(r.verdict.outcome, Outcome::CouldNotTell);
        assert_eq!((r.verdict.verified, r.verdict.containers), (1, 2));
        let r = report(vec![ok], 1);
        assert!(r.ok());
        assert_eq!(r.verdict.line, "1 of 1 container verified: VERIFIED");
        // No workload at all: a failure; workloads without a container: could not tell.
        let r = report(Vec::new(), 0);
        assert_eq!(r.verdict.outcome, Outcome::Failed);
        assert!(r.verdict.line.contains("no workload"), "{}", r.verdict.line);
        assert_eq!(report(Vec::new(), 2).verdict.outcome, Outcome::CouldNotTell);
    }

    #[test]
    fn the_workloads_come_from_the_release_manifest() {
        let m = "---\n# Source: x\napiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: koordlet\nspec:\n  selector:\n    matchLabels:\n      koord-app: koordlet\n  template:\n    spec:\n      initContainers:\n      - name: i\n        image: busybox\n      containers:\n      - name: koordlet\n        image: r/koordlet:v1\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n---\nkind: CronJob\nmetadata:\n  name: cj\n  namespace: other\nspec:\n  jobTemplate:\n    spec:\n      template:\n        spec:\n          containers:\n          - name: c\n            image: r/c:1\n---\nkind: Job\nmetadata:\n  name: j\n---\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: x\n    image: r/x:1\n";
        let (w, more) = workloads(m, "koordinator-system").unwrap();
        assert_eq!(more, 0);
        let got: Vec<(&str, &str, &str)> = w
            .iter()
            .map(|w| (w.kind.as_str(), w.namespace.as_str(), w.name.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("DaemonSet", "koordinator-system", "koordlet"),
                ("CronJob", "other", "cj"),
                ("Job", "koordinator-system", "j"),
                ("Pod", "koordinator-system", "p"),
            ]
        );
        assert_eq!(
            w[0].rendered,
            BTreeMap::from([
                ("init:i".to_string(), "busybox".to_string()),
                ("koordlet".to_string(), "r/koordlet:v1".to_string())
            ])
        );
        assert_eq!(w[1].rendered["c"], "r/c:1");
        assert_eq!(w[3].rendered["x"], "r/x:1");
    }

    #[test]
    fn every_selector_form_becomes_a_label_selector() {
        let s = serde_json::json!({"matchLabels": {"app": "a"}, "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["x", "y"]},
            {"key": "env", "operator": "NotIn", "values": ["dev"]},
            {"key": "k", "operator": "Exists"},
            {"key": "gone", "operator": "DoesNotExist"}]});
        assert_eq!(
            selector_query(&s).unwrap(),
            "app=a,tier in (x,y),env notin (dev),k,!gone"
        );
        let only = serde_json::json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["m"]}]});
        assert_eq!(selector_query(&only).unwrap(), "app in (m)");
        assert!(selector_query(&serde_json::json!({})).is_err());
        assert!(selector_query(&Value::Null).is_err());
        let bad = serde_json::json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]});
        assert!(selector_query(&bad).unwrap_err().contains("Gt"));
    }

    /// Findings are kept up to MAX_SHOWN per kind of answer, the rest counted; a string from
    /// the server is cut to MAX_FIELD bytes.
    #[test]
    fn what_is_kept_is_bounded_and_the_rest_counted() {
        let carried = carried();
        let mut t = Tally::new(&carried);
        let w = Workload {
            kind: "DaemonSet".into(),
            namespace: "ns".into(),
            name: "d".into(),
            rendered: BTreeMap::new(),
        };
        let long = format!("reg/{}:1", "x".repeat(1 << 20));
        for i in 0..(MAX_SHOWN + 50) {
            let p: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("p{i}"), "namespace": "ns"},
                "spec": {"containers": [{"name": "c", "image": long}]}}))
            .unwrap();
            t.pod(&p, &w);
            // The same pod again (overlapping selectors): judged once.
            t.pod(&p, &w);
        }
        assert_eq!(t.counts.not_bundled, MAX_SHOWN + 50);
        assert_eq!((t.containers.len(), t.omitted), (MAX_SHOWN, 50));
        assert!(t
            .containers
            .iter()
            .all(|c| c.spec.len() <= MAX_FIELD + 40 && c.spec.ends_with("… (1048582 bytes, cut)")));
    }

    /// The record names the workloads, and it is the server's: at most MAX_WORKLOADS are
    /// kept, the rest counted; a report with workloads left out is at best "could not tell".
    #[test]
    fn the_workloads_of_a_record_are_bounded() {
        let long = "y".repeat(1 << 20);
        let m: String = (0..MAX_WORKLOADS + 7)
            .map(|i| {
                let image = if i == 0 { long.as_str() } else { "koordlet" };
                format!("---\nkind: Deployment\nmetadata:\n  name: d{i}\nspec:\n  template:\n    spec:\n      containers:\n      - name: c\n        image: reg/{image}:1\n")
            })
            .collect();
        let (w, more) = workloads(&m, "ns").unwrap();
        assert_eq!((w.len(), more), (MAX_WORKLOADS, 7));
        assert!(
            w[0].rendered["c"].len() <= MAX_FIELD + 40,
            "{}",
            w[0].rendered["c"].len()
        );
    }
}
