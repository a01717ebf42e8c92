//! Helm repository index (`index.yaml`): parsing, version resolution and chart URLs.
//!
//! # Version semantics
//!
//! [`VersionSpec::parse`] follows Helm 3, which uses Masterminds/semver v3:
//!
//! * `latest` (or an empty string): the highest version **without** a prerelease part
//!   (Helm's default, which is the constraint `*`).
//! * A complete version, with or without `v` or `=` (`1.8.0`, `v1.8.0`, `=1.8.0`,
//!   `1.8.0-rc.1`): exactly that version ([`VersionSpec::Exact`]). This is the only way to get
//!   a prerelease through [`VersionSpec::Exact`]; build metadata is ignored when comparing.
//! * A partial version without operator (`1.7`, `1`, `1.7.x`): Masterminds treats it as
//!   `=1.7`, which for a partial version means "any 1.7.x" (same as `~1.7`), **not** the caret
//!   range Cargo would use. `1` means any `1.x.y`.
//! * Operators `=`, `>`, `>=`, `<`, `<=` (and Masterminds' `=>`, `=<`), `~`, `~>`, `^`,
//!   wildcards `x`/`X`/`*`, comparators separated by spaces and/or commas (all must hold),
//!   and hyphen ranges `1.2 - 1.4` (= `>=1.2, <=1.4`). `^0.2` is `>=0.2.0, <0.3.0` in both
//!   Masterminds v3 and Cargo.
//! * Not supported (clear error): `||` alternatives and `!=`, which `semver::VersionReq` cannot
//!   express.
//!
//! Prereleases in ranges follow the `semver` crate: a prerelease matches only if a comparator
//! names a prerelease of the same `major.minor.patch` (Masterminds is slightly looser: any
//! comparator with a prerelease admits prereleases). Ranges never match a prerelease
//! otherwise.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::OnceLock;

use regex::Regex;
use serde_yaml_ng::Value;

use super::{scalar_to_string, ChartError};

/// One version of one chart in a repository index.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ChartEntry {
    /// Chart name (the entry's `name`, or its key in `entries` when absent).
    pub name: String,
    /// Chart version exactly as written in the index.
    pub version: String,
    /// `appVersion`, if any (numbers are rendered as text).
    pub app_version: Option<String>,
    /// `digest`: sha256 hex of the archive, as the index claims it.
    pub digest: Option<String>,
    /// Download URLs, as written (absolute, or relative to the repository URL: see
    /// [`resolve_chart_url`]).
    pub urls: Vec<String>,
    /// `created` timestamp, as written.
    pub created: Option<String>,
}

#[derive(Debug, Clone)]
struct Indexed {
    semver: semver::Version,
    entry: ChartEntry,
}

/// A parsed Helm repository index.
#[derive(Debug, Clone)]
pub struct RepoIndex {
    /// chart name -> versions, newest first (the charts that were read).
    entries: BTreeMap<String, Vec<Indexed>>,
    /// Every chart the index names.
    names: std::collections::BTreeSet<String>,
    skipped: Vec<String>,
}

/// Which version of a chart to take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionSpec {
    /// The highest version that is not a prerelease.
    Latest,
    /// Exactly this version (build metadata ignored); may be a prerelease.
    Exact(semver::Version),
    /// The highest version matching this requirement (already translated from Helm syntax).
    Range(semver::VersionReq),
}

impl fmt::Display for VersionSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VersionSpec::Latest => f.write_str("latest"),
            VersionSpec::Exact(v) => write!(f, "{v}"),
            VersionSpec::Range(r) => write!(f, "{r}"),
        }
    }
}

use super::re;

const VER: &str =
    r"v?(?:[0-9]+|[xX*])(?:\.(?:[0-9]+|[xX*])){0,2}(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?";

fn hyphen_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(&R, &format!(r"({VER})\s+-\s+({VER})"))
}

fn comparator_re() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    re(&R, &format!(r"(>=|=>|<=|=<|!=|~>|>|<|=|~|\^)?\s*({VER})"))
}

impl VersionSpec {
    /// Parse a version or constraint given by the user, with Helm's semantics (see the module
    /// documentation).
    pub fn parse(s: &str) -> Result<Self, ChartError> {
        let spec = s.trim();
        let invalid = |reason: String| ChartError::InvalidVersionSpec {
            spec: s.to_string(),
            reason,
        };
        if spec.is_empty() || spec.eq_ignore_ascii_case("latest") {
            return Ok(VersionSpec::Latest);
        }
        if spec.contains("||") {
            return Err(invalid(
                "alternatives with `||` are not supported; give a single range".into(),
            ));
        }
        // An exact, complete version (optionally `=` and/or `v` prefixed).
        let bare = spec.strip_prefix('=').map(str::trim_start).unwrap_or(spec);
        let bare = bare.strip_prefix(['v', 'V']).unwrap_or(bare);
        if let Ok(v) = semver::Version::parse(bare) {
            return Ok(VersionSpec::Exact(v));
        }

        // Hyphen ranges first: "a - b" => ">=a <=b".
        let rewritten = hyphen_re().replace_all(spec, ">=$1 <=$2").into_owned();
        let mut comparators = Vec::new();
        let mut last_end = 0;
        for caps in comparator_re().captures_iter(&rewritten) {
            let Some(m) = caps.get(0) else { continue };
            let between = &rewritten[last_end..m.start()];
            if !between.chars().all(|c| c.is_whitespace() || c == ',') {
                return Err(invalid(format!("unexpected text {:?}", between.trim())));
            }
            last_end = m.end();
            let op = caps.get(1).map(|m| m.as_str()).unwrap_or("");
            let ver = caps.get(2).map(|m| m.as_str()).unwrap_or("");
            comparators.push(translate_comparator(op, ver).map_err(&invalid)?);
        }
        let rest = &rewritten[last_end..];
        if !rest.chars().all(|c| c.is_whitespace() || c == ',') {
            return Err(invalid(format!("unexpected text {:?}", rest.trim())));
        }
        if comparators.is_empty() {
            return Err(invalid("not a version or version constraint".into()));
        }
        let joined = comparators.join(", ");
        semver::VersionReq::parse(&joined)
            .map(VersionSpec::Range)
            .map_err(|e| invalid(format!("{e} (as {joined:?})")))
    }
}

/// Translate one Masterminds comparator into the `semver` crate's syntax.
fn translate_comparator(op: &str, ver: &str) -> Result<String, String> {
    let ver = ver.strip_prefix(['v', 'V']).unwrap_or(ver);
    // Split off prerelease/build, then truncate the numeric core at the first wildcard.
    let core_end = ver.find(['-', '+']).unwrap_or(ver.len());
    let (core, suffix) = ver.split_at(core_end);
    let mut parts = Vec::new();
    let mut wildcard = false;
    for p in core.split('.') {
        if p == "x" || p == "X" || p == "*" {
            wildcard = true;
            break;
        }
        parts.push(p);
    }
    if wildcard && !suffix.is_empty() {
        return Err(format!(
            "a wildcard version cannot have a prerelease or build part: {ver:?}"
        ));
    }
    let v = if parts.is_empty() {
        None
    } else {
        Some(format!("{}{}", parts.join("."), suffix))
    };
    let out = match (op, v) {
        ("!=", _) => return Err("`!=` is not supported; use a range instead".into()),
        (_, None) => "*".to_string(),
        // Masterminds: "=1.7" / "1.7" (partial) means any 1.7.x; the semver crate's "=1.7"
        // means the same. A complete version means exactly that version in both.
        ("" | "=", Some(v)) => format!("={v}"),
        ("~" | "~>", Some(v)) => format!("~{v}"),
        ("^", Some(v)) => format!("^{v}"),
        ("=>", Some(v)) => format!(">={v}"),
        ("=<", Some(v)) => format!("<={v}"),
        (op, Some(v)) => format!("{op}{v}"),
    };
    Ok(out)
}

/// Lenient version parsing as Masterminds' `NewVersion`: optional `v`, missing minor/patch
/// default to 0.
fn parse_lenient(s: &str) -> Option<semver::Version> {
    let s = s.trim();
    let s = s.strip_prefix(['v', 'V']).unwrap_or(s);
    if let Ok(v) = semver::Version::parse(s) {
        return Some(v);
    }
    let core_end = s.find(['-', '+']).unwrap_or(s.len());
    let (core, suffix) = s.split_at(core_end);
    let parts: Vec<&str> = core.split('.').collect();
    if parts.is_empty()
        || parts.len() > 3
        || parts
            .iter()
            .any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    let mut full: Vec<&str> = parts.clone();
    while full.len() < 3 {
        full.push("0");
    }
    semver::Version::parse(&format!("{}{}", full.join("."), suffix)).ok()
}

fn opt_string(v: Option<&Value>) -> Option<String> {
    v.and_then(scalar_to_string)
}

impl RepoIndex {
    /// Parse a Helm repository index (`apiVersion: v1`, YAML or JSON), every chart of it.
    /// Unknown fields are ignored; entries that are not mappings, have no string `version` or
    /// a version that is not SemVer (after Helm's leniency: `v` prefix, missing minor/patch)
    /// are skipped (see [`RepoIndex::skipped`]).
    pub fn parse(bytes: &[u8]) -> Result<Self, ChartError> {
        Self::parse_charts(bytes, None)
    }

    /// Like [`RepoIndex::parse`], but only the versions of `chart` are read: the index is
    /// scanned event by event (bounded: [`koord_base::yaml::INDEX`]) and only the entries of
    /// `chart` are parsed into values, so memory stays near the size of the input however
    /// many other charts the repository lists. [`RepoIndex::charts`] still names them all.
    pub fn parse_chart(bytes: &[u8], chart: &str) -> Result<Self, ChartError> {
        Self::parse_charts(bytes, Some(chart))
    }

    fn parse_charts(bytes: &[u8], only: Option<&str>) -> Result<Self, ChartError> {
        let invalid = |reason: String| ChartError::InvalidIndex { reason };
        let limits = koord_base::yaml::INDEX;
        let text = koord_base::yaml::text_of("index.yaml", bytes, &limits)
            .map_err(|e| invalid(e.reason()))?;
        let scan = scan_index(text, &limits).map_err(|e| invalid(e.reason()))?;
        match scan.api_version.as_deref() {
            Some("v1") => {}
            Some(other) => {
                return Err(invalid(format!(
                    "unsupported apiVersion {other:?} (expected v1)"
                )))
            }
            None => {
                return Err(invalid(
                    "no apiVersion (not a Helm repository index?)".into(),
                ))
            }
        }
        let mut entries: BTreeMap<String, Vec<Indexed>> = BTreeMap::new();
        let mut names = std::collections::BTreeSet::new();
        let mut skipped = Vec::new();
        for span in &scan.charts {
            names.insert(span.name.clone());
            if only.is_some_and(|c| c != span.name) {
                continue;
            }
            if !span.is_sequence {
                skipped.push(format!("{}: entries are not a list", span.name));
                continue;
            }
            // The entries of one chart on their own: the same bytes, indented as they were.
            let mut doc = " ".repeat(span.column);
            doc.push_str(&text[span.start..span.end]);
            let what = format!("index.yaml entries of {}", span.name);
            let list = koord_base::yaml::parse_value(&what, doc.as_bytes(), &limits)
                .map_err(|e| invalid(e.to_string()))?;
            let Value::Sequence(list) = list else {
                skipped.push(format!("{}: entries are not a list", span.name));
                continue;
            };
            let mut versions = Vec::new();
            for item in &list {
                match parse_entry(&span.name, item) {
                    Ok(ix) => versions.push(ix),
                    Err(why) => skipped.push(format!("{}: {why}", span.name)),
                }
            }
            // Newest first; equal precedence keeps index order (stable sort).
            versions.sort_by(|a: &Indexed, b: &Indexed| b.semver.cmp_precedence(&a.semver));
            entries
                .entry(span.name.clone())
                .or_default()
                .extend(versions);
        }
        Ok(RepoIndex {
            entries,
            names,
            skipped,
        })
    }

    /// Names of the charts in the index, sorted (all of them, also those not read).
    pub fn charts(&self) -> Vec<&str> {
        self.names.iter().map(String::as_str).collect()
    }

    /// Human-readable notes about index entries that were skipped while parsing.
    pub fn skipped(&self) -> &[String] {
        &self.skipped
    }

    /// All usable versions of `chart`, newest first (empty if the chart is unknown).
    pub fn versions(&self, chart: &str) -> Vec<&ChartEntry> {
        self.entries
            .get(chart)
            .map(|v| v.iter().map(|ix| &ix.entry).collect())
            .unwrap_or_default()
    }

    /// The highest version of `chart` matching `spec`. Prereleases are only returned for
    /// [`VersionSpec::Exact`] (or a range that names a prerelease of the same version).
    pub fn resolve(&self, chart: &str, spec: &VersionSpec) -> Result<&ChartEntry, ChartError> {
        let Some(list) = self.entries.get(chart) else {
            return Err(ChartError::UnknownChart {
                chart: chart.to_string(),
                available: self.names.iter().cloned().collect(),
            });
        };
        let found = match spec {
            VersionSpec::Latest => list.iter().find(|ix| ix.semver.pre.is_empty()),
            VersionSpec::Exact(v) => list
                .iter()
                .find(|ix| ix.semver == *v)
                .or_else(|| list.iter().find(|ix| ix.semver.cmp_precedence(v).is_eq())),
            VersionSpec::Range(req) => list.iter().find(|ix| req.matches(&ix.semver)),
        };
        found
            .map(|ix| &ix.entry)
            .ok_or_else(|| ChartError::UnknownVersion {
                chart: chart.to_string(),
                requested: spec.to_string(),
                nearest: nearest(list, spec),
            })
    }
}

/// Where one chart's value sits in the index text.
#[derive(Debug)]
struct ChartSpan {
    name: String,
    start: usize,
    end: usize,
    column: usize,
    is_sequence: bool,
}

/// What [`scan_index`] learns from the events of an index.
#[derive(Debug, Default)]
struct IndexScan {
    api_version: Option<String>,
    charts: Vec<ChartSpan>,
}

/// What an open collection of the index is.
#[derive(Debug, Clone, PartialEq)]
enum Role {
    Root,
    Entries,
    /// The value of `entries.<name>`, from this byte offset and column.
    Chart(String, usize, usize),
    Other,
}

#[derive(Debug)]
struct Frame {
    role: Role,
    is_map: bool,
    /// In a mapping: the next node is a key.
    expect_key: bool,
    /// In a mapping: the key of the value being read (None for a non-scalar key).
    key: Option<String>,
    keys: std::collections::BTreeSet<String>,
}

fn yaml_err(reason: String) -> koord_base::yaml::YamlError {
    koord_base::yaml::YamlError::Invalid {
        what: "index.yaml".into(),
        reason,
    }
}

/// One pass over the index's events (bounded by `limits`): `apiVersion`, and where each
/// `entries.<chart>` value starts and ends. Nothing else is kept.
fn scan_index(
    text: &str,
    limits: &koord_base::yaml::Limits,
) -> Result<IndexScan, koord_base::yaml::YamlError> {
    use koord_base::yaml::Kind;
    let mut out = IndexScan::default();
    let mut stack: Vec<Frame> = Vec::new();
    let mut documents = 0usize;
    let mut root_seen = false;
    koord_base::yaml::events("index.yaml", text, limits, &mut |ev| {
        match ev.kind {
            Kind::DocumentStart => {
                documents += 1;
                if documents > 1 {
                    return Err(yaml_err("holds more than one YAML document".into()));
                }
                return Ok(());
            }
            Kind::DocumentEnd => return Ok(()),
            _ => {}
        }
        let is_start = matches!(
            ev.kind,
            Kind::Scalar | Kind::Alias | Kind::MappingStart | Kind::SequenceStart
        );
        if is_start {
            // What this node is, from its parent.
            let role = match stack.last_mut() {
                None => {
                    if root_seen {
                        return Ok(());
                    }
                    root_seen = true;
                    if ev.kind != Kind::MappingStart {
                        return Err(yaml_err("not a mapping".into()));
                    }
                    Role::Root
                }
                Some(parent) if parent.is_map && parent.expect_key => {
                    parent.key = (ev.kind == Kind::Scalar)
                        .then(|| String::from_utf8_lossy(&ev.value).into_owned());
                    if let Some(k) = &parent.key {
                        if matches!(parent.role, Role::Root | Role::Entries)
                            && !parent.keys.insert(k.clone())
                        {
                            return Err(yaml_err(format!(
                                "not valid YAML: line {}: duplicate key {k:?}",
                                ev.line + 1
                            )));
                        }
                    }
                    Role::Other
                }
                Some(parent) => match (&parent.role, parent.is_map, parent.key.as_deref()) {
                    (Role::Root, true, Some("apiVersion")) => {
                        if ev.kind == Kind::Scalar {
                            out.api_version = Some(String::from_utf8_lossy(&ev.value).into_owned());
                        }
                        Role::Other
                    }
                    (Role::Root, true, Some("entries")) => match ev.kind {
                        Kind::MappingStart => Role::Entries,
                        Kind::Scalar
                            if ev.plain
                                && matches!(
                                    &ev.value[..],
                                    b"" | b"~" | b"null" | b"Null" | b"NULL"
                                ) =>
                        {
                            Role::Other
                        }
                        _ => return Err(yaml_err("`entries` is not a mapping".into())),
                    },
                    (Role::Entries, true, Some(name)) => {
                        let name = name.to_string();
                        if matches!(ev.kind, Kind::MappingStart | Kind::SequenceStart) {
                            Role::Chart(name, ev.start, ev.column)
                        } else {
                            out.charts.push(ChartSpan {
                                name,
                                start: ev.start,
                                end: ev.end,
                                column: ev.column,
                                is_sequence: false,
                            });
                            Role::Other
                        }
                    }
                    _ => Role::Other,
                },
            };
            let is_key = stack.last().is_some_and(|p| p.is_map && p.expect_key);
            if matches!(ev.kind, Kind::MappingStart | Kind::SequenceStart) {
                stack.push(Frame {
                    role,
                    is_map: ev.kind == Kind::MappingStart,
                    expect_key: true,
                    key: None,
                    keys: Default::default(),
                });
                return Ok(());
            }
            // A scalar or alias is complete at once.
            if let Some(parent) = stack.last_mut() {
                if parent.is_map {
                    parent.expect_key = !is_key;
                }
            }
            return Ok(());
        }
        // The end of a collection.
        if let Some(frame) = stack.pop() {
            if let Role::Chart(name, start, column) = frame.role {
                out.charts.push(ChartSpan {
                    name,
                    start,
                    end: ev.end,
                    column,
                    is_sequence: !frame.is_map,
                });
            }
            if let Some(parent) = stack.last_mut() {
                if parent.is_map {
                    parent.expect_key = !parent.expect_key;
                }
            }
        }
        Ok(())
    })?;
    Ok(out)
}

fn parse_entry(chart: &str, item: &Value) -> Result<Indexed, String> {
    let Value::Mapping(m) = item else {
        return Err("an entry is not a mapping".into());
    };
    let version = match m.get("version") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(format!("version {other:?} is not a string")),
        None => return Err("an entry has no version".into()),
    };
    let semver =
        parse_lenient(&version).ok_or_else(|| format!("version {version:?} is not SemVer"))?;
    let name = m
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or(chart)
        .to_string();
    let urls = match m.get("urls") {
        Some(Value::Sequence(seq)) => seq.iter().filter_map(scalar_to_string).collect(),
        Some(Value::String(s)) => vec![s.clone()],
        _ => Vec::new(),
    };
    Ok(Indexed {
        semver,
        entry: ChartEntry {
            name,
            version,
            app_version: opt_string(m.get("appVersion")),
            digest: opt_string(m.get("digest")),
            urls,
            created: opt_string(m.get("created")),
        },
    })
}

/// Up to 5 versions closest to what was asked, closest first: walk outwards from where the
/// target would sit in the sorted list, taking the closer neighbour by (major, minor, patch)
/// distance each time (ties prefer the newer version).
fn nearest(list: &[Indexed], spec: &VersionSpec) -> Vec<String> {
    let target = match spec {
        VersionSpec::Latest => None,
        VersionSpec::Exact(v) => Some(v.clone()),
        VersionSpec::Range(req) => req.comparators.first().map(|c| semver::Version {
            major: c.major,
            minor: c.minor.unwrap_or(0),
            patch: c.patch.unwrap_or(0),
            pre: c.pre.clone(),
            build: semver::BuildMetadata::EMPTY,
        }),
    };
    let ordered: Vec<&Indexed> = match target {
        None => list.iter().collect(),
        Some(t) => {
            let dist = |v: &semver::Version| {
                (
                    v.major.abs_diff(t.major),
                    v.minor.abs_diff(t.minor),
                    v.patch.abs_diff(t.patch),
                )
            };
            // `list` is newest first: `split` entries are newer than the target.
            let split = list
                .iter()
                .take_while(|ix| ix.semver.cmp_precedence(&t).is_gt())
                .count();
            let mut upper = list[..split].iter().rev().peekable();
            let mut lower = list[split..].iter().peekable();
            let mut out = Vec::with_capacity(list.len());
            loop {
                let take_upper = match (upper.peek(), lower.peek()) {
                    (Some(u), Some(l)) => dist(&u.semver) <= dist(&l.semver),
                    (Some(_), None) => true,
                    (None, Some(_)) => false,
                    (None, None) => break,
                };
                let next = if take_upper {
                    upper.next()
                } else {
                    lower.next()
                };
                if let Some(ix) = next {
                    out.push(ix);
                }
            }
            out
        }
    };
    let mut out: Vec<String> = Vec::new();
    for ix in ordered {
        if !out.contains(&ix.entry.version) {
            out.push(ix.entry.version.clone());
        }
        if out.len() == 5 {
            break;
        }
    }
    out
}

/// Split `url` into (before query/fragment, query including `?` or "").
fn split_query(url: &str) -> (&str, &str) {
    let no_frag = url.split('#').next().unwrap_or(url);
    match no_frag.find('?') {
        Some(i) => (&no_frag[..i], &no_frag[i..]),
        None => (no_frag, ""),
    }
}

/// Split into (scheme + "//" + authority, path). Either may be empty.
fn split_authority(url: &str) -> (&str, &str) {
    static R: OnceLock<Regex> = OnceLock::new();
    let r = re(&R, r"^(?:[A-Za-z][A-Za-z0-9+.\-]*:)?(?://[^/]*)?");
    let end = r.find(url).map(|m| m.end()).unwrap_or(0);
    url.split_at(end)
}

fn has_scheme(url: &str) -> bool {
    static R: OnceLock<Regex> = OnceLock::new();
    re(&R, r"^[A-Za-z][A-Za-z0-9+.\-]*:").is_match(url)
}

/// RFC 3986 `remove_dot_segments` for a path. For a relative path (a local repository
/// directory), `..` that cannot be resolved are kept.
fn remove_dot_segments(path: &str) -> String {
    let absolute = path.starts_with('/');
    let mut out: Vec<&str> = Vec::new();
    let segs: Vec<&str> = path.split('/').collect();
    let n = segs.len();
    let mut trailing_slash = false;
    for (i, seg) in segs.iter().enumerate() {
        let last = i + 1 == n;
        match *seg {
            "." => trailing_slash = last,
            ".." => {
                if out.last().is_some_and(|l| *l != "..") {
                    out.pop();
                } else if !absolute {
                    out.push("..");
                }
                trailing_slash = last;
            }
            s => {
                if !(s.is_empty() && i == 0 && absolute) {
                    out.push(s);
                }
                trailing_slash = false;
            }
        }
    }
    let mut joined = out.join("/");
    if absolute {
        joined.insert(0, '/');
    }
    if trailing_slash && !joined.ends_with('/') {
        joined.push('/');
    }
    joined
}

/// The URL to download a chart from, given the URL the index was fetched from (or the
/// repository URL) and one of the entry's `urls`.
///
/// Absolute entry URLs are returned unchanged. Relative ones are resolved like Helm's
/// `ResolveReferenceURL`: against the repository URL with a trailing slash. `index_url` may be
/// the repository URL with or without trailing slash, or the index file itself
/// (`.../index.yaml`, or any last segment ending in `.yaml`/`.yml`/`.json`), which is dropped.
/// Like Helm, the query of the repository URL (e.g. an access token) is carried over; if it
/// has none, the entry URL's own query is kept (Helm would drop it).
pub fn resolve_chart_url(index_url: &str, entry_url: &str) -> String {
    let entry_url = entry_url.trim();
    if has_scheme(entry_url) {
        return entry_url.to_string();
    }
    let (base, base_query) = split_query(index_url.trim());
    let (authority, base_path) = split_authority(base);
    // Directory of the repository, with a trailing slash.
    let mut dir = base_path.to_string();
    if let Some(last) = dir.rsplit('/').next() {
        let lower = last.to_ascii_lowercase();
        if lower.ends_with(".yaml") || lower.ends_with(".yml") || lower.ends_with(".json") {
            let cut = dir.len() - last.len();
            dir.truncate(cut);
        }
    }
    if !dir.ends_with('/') {
        dir.push('/');
    }
    let (ref_path, ref_query) = split_query(entry_url);
    let query = if base_query.is_empty() {
        ref_query
    } else {
        base_query
    };
    if let Some(rest) = ref_path.strip_prefix("//") {
        // Network-path reference: keep only the scheme.
        let scheme = authority.split("//").next().unwrap_or("");
        return format!("{scheme}//{rest}{query}");
    }
    let path = if ref_path.starts_with('/') {
        remove_dot_segments(ref_path)
    } else if authority.is_empty() && !dir.starts_with('/') {
        // A relative base (a local directory): keep it relative.
        remove_dot_segments(&format!("{dir}{ref_path}"))
    } else {
        let dir = if dir.starts_with('/') {
            dir
        } else {
            format!("/{dir}")
        };
        remove_dot_segments(&format!("{dir}{ref_path}"))
    };
    format!("{authority}{path}{query}")
}

/// The URL of a repository's index file: `https://koordinator-sh.github.io/charts/` ->
/// `https://koordinator-sh.github.io/charts/index.yaml`. A URL that already names
/// `index.yaml` is returned unchanged; a query string is kept at the end.
pub fn index_url(repo_url: &str) -> String {
    let (base, query) = split_query(repo_url.trim());
    if base.ends_with("/index.yaml") {
        return format!("{base}{query}");
    }
    format!("{}/index.yaml{query}", base.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: &[u8] = include_bytes!("../../../../tests/fixtures/charts/index.yaml");
    const UPSTREAM: &[u8] = include_bytes!("../../../../tests/fixtures/charts/index.upstream.yaml");

    fn v(s: &str) -> semver::Version {
        semver::Version::parse(s).expect("test version")
    }

    fn range(spec: &str) -> semver::VersionReq {
        match VersionSpec::parse(spec).expect("spec parses") {
            VersionSpec::Range(r) => r,
            other => panic!("{spec}: expected a range, got {other:?}"),
        }
    }

    #[test]
    fn parse_local_index() {
        let ix = RepoIndex::parse(LOCAL).expect("parse");
        assert_eq!(ix.charts(), vec!["koordinator"]);
        let versions: Vec<&str> = ix
            .versions("koordinator")
            .iter()
            .map(|e| e.version.as_str())
            .collect();
        assert_eq!(versions.len(), 21);
        assert_eq!(versions[..3], ["1.8.0", "1.7.0", "1.6.0"]);
        assert_eq!(versions[20], "0.1.0");
        let e = ix
            .resolve("koordinator", &VersionSpec::Latest)
            .expect("latest");
        assert_eq!(e.version, "1.8.0");
        assert_eq!(e.urls, ["koordinator-1.8.0.tgz"]);
        assert_eq!(e.app_version.as_deref(), Some("1.8.0"));
        assert_eq!(
            e.digest.as_deref(),
            Some("f4b5be3927fd6b1f4fd42fb50675f2e1feed98eb0a939d78ffb89daf51691f88")
        );
        assert_eq!(e.created.as_deref(), Some("2026-04-16T08:27:29.710956047Z"));
        assert!(ix.skipped().is_empty());
    }

    #[test]
    fn parse_upstream_index() {
        let ix = RepoIndex::parse(UPSTREAM).expect("parse");
        assert_eq!(
            ix.charts(),
            vec![
                "hadoop-yarn",
                "hami-daemon",
                "koord-queue",
                "koordinator",
                "koordinator-yarn-copilot",
                "koordinator-yarn-operator"
            ]
        );
        let k = ix.versions("koordinator");
        assert_eq!(k.len(), 21);
        assert_eq!(k[0].version, "1.8.0");
        assert_eq!(k[20].version, "0.1.0");
        // newest first, strictly
        for w in k.windows(2) {
            assert!(v(&w[0].version) > v(&w[1].version));
        }
        let e = ix
            .resolve("koordinator", &VersionSpec::parse("~1.7").expect("spec"))
            .expect("resolve");
        assert_eq!(e.version, "1.7.0");
        assert_eq!(
            e.urls,
            ["https://github.com/koordinator-sh/charts/releases/download/koordinator-1.7.0/koordinator-1.7.0.tgz"]
        );
        // hadoop-yarn has a prerelease-looking version 3.3.2-1.0: latest is 3.3.3.
        let h = ix
            .resolve("hadoop-yarn", &VersionSpec::Latest)
            .expect("latest");
        assert_eq!(h.version, "3.3.3");
    }

    #[test]
    fn version_spec_parse() {
        assert_eq!(
            VersionSpec::parse("latest").expect("p"),
            VersionSpec::Latest
        );
        assert_eq!(VersionSpec::parse("").expect("p"), VersionSpec::Latest);
        assert_eq!(
            VersionSpec::parse("1.8.0").expect("p"),
            VersionSpec::Exact(v("1.8.0"))
        );
        assert_eq!(
            VersionSpec::parse("v1.8.0").expect("p"),
            VersionSpec::Exact(v("1.8.0"))
        );
        assert_eq!(
            VersionSpec::parse("=1.8.0").expect("p"),
            VersionSpec::Exact(v("1.8.0"))
        );
        assert_eq!(
            VersionSpec::parse("1.8.0-rc.1").expect("p"),
            VersionSpec::Exact(v("1.8.0-rc.1"))
        );

        let r = range("~1.7");
        assert!(r.matches(&v("1.7.0")) && r.matches(&v("1.7.9")) && !r.matches(&v("1.8.0")));
        let r = range(">=1.6 <1.8");
        assert!(r.matches(&v("1.6.0")) && r.matches(&v("1.7.3")) && !r.matches(&v("1.8.0")));
        assert!(!r.matches(&v("1.5.9")));
        let r = range(">= 1.6, < 1.8");
        assert!(r.matches(&v("1.7.0")) && !r.matches(&v("1.8.0")));
        // Masterminds: a bare partial version means that minor (not caret).
        let r = range("1.7");
        assert!(r.matches(&v("1.7.0")) && r.matches(&v("1.7.5")) && !r.matches(&v("1.8.0")));
        let r = range("1");
        assert!(r.matches(&v("1.8.0")) && !r.matches(&v("2.0.0")) && !r.matches(&v("0.9.0")));
        let r = range("1.7.x");
        assert!(r.matches(&v("1.7.2")) && !r.matches(&v("1.8.0")));
        let r = range("^1.4");
        assert!(r.matches(&v("1.8.0")) && !r.matches(&v("2.0.0")) && !r.matches(&v("1.3.0")));
        let r = range("^0.4");
        assert!(r.matches(&v("0.4.1")) && !r.matches(&v("0.5.0")));
        let r = range("1.4 - 1.6");
        assert!(r.matches(&v("1.4.0")) && r.matches(&v("1.6.9")) && !r.matches(&v("1.7.0")));
        let r = range("*");
        assert!(r.matches(&v("1.8.0")) && !r.matches(&v("1.9.0-rc.1")));
        let r = range("=> 1.6");
        assert!(r.matches(&v("1.6.0")));
        let r = range("~> 1.6");
        assert!(r.matches(&v("1.6.5")) && !r.matches(&v("1.7.0")));

        for bad in ["1.6 || 1.8", "!=1.7.0", "foo", ">=1.6 bar", "1.8.0.1"] {
            let err = VersionSpec::parse(bad).expect_err(bad);
            assert!(err.to_string().contains(bad), "{err}");
        }
    }

    #[test]
    fn resolve_versions() {
        let ix = RepoIndex::parse(UPSTREAM).expect("parse");
        let get = |s: &str| {
            ix.resolve("koordinator", &VersionSpec::parse(s).expect("spec"))
                .map(|e| e.version.clone())
        };
        assert_eq!(get("1.8.0").expect("r"), "1.8.0");
        assert_eq!(get("v1.4.1").expect("r"), "1.4.1");
        assert_eq!(get("1.4").expect("r"), "1.4.1");
        assert_eq!(get(">=1.6 <1.8").expect("r"), "1.7.0");
        assert_eq!(get("^0.6").expect("r"), "0.6.2");
        assert_eq!(get("<1").expect("r"), "0.7.0");
        let err = get("1.7.5").expect_err("unknown");
        match &err {
            ChartError::UnknownVersion {
                chart,
                requested,
                nearest,
            } => {
                assert_eq!(chart, "koordinator");
                assert_eq!(requested, "1.7.5");
                assert_eq!(nearest, &["1.7.0", "1.8.0", "1.6.0", "1.5.0", "1.4.1"]);
            }
            other => panic!("unexpected {other:?}"),
        }
        let msg = err.to_string();
        assert!(
            msg.contains("1.7.5") && msg.contains("nearest existing versions: 1.7.0, 1.8.0"),
            "{msg}"
        );
        match get("~2.1").expect_err("unknown") {
            ChartError::UnknownVersion { nearest, .. } => {
                assert_eq!(nearest, ["1.8.0", "1.7.0", "1.6.0", "1.5.0", "1.4.1"])
            }
            other => panic!("unexpected {other:?}"),
        }
        match get("0.0.1").expect_err("unknown") {
            ChartError::UnknownVersion { nearest, .. } => {
                assert_eq!(nearest, ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0"])
            }
            other => panic!("unexpected {other:?}"),
        }

        let err = ix
            .resolve("koordinatorr", &VersionSpec::Latest)
            .expect_err("unknown chart");
        let msg = err.to_string();
        assert!(
            msg.contains("koordinatorr")
                && msg.contains("koord-queue")
                && msg.contains("koordinator,"),
            "{msg}"
        );
    }

    #[test]
    fn prereleases_only_when_exact() {
        let idx = b"apiVersion: v1\nentries:\n  c:\n  - {name: c, version: 1.9.0-rc.1, urls: [c-1.9.0-rc.1.tgz], futureField: {x: 1}}\n  - {name: c, version: 1.8.0, urls: [c-1.8.0.tgz]}\n  - {name: c, version: not-a-version}\n  - {name: c, version: v1.7}\n  - {name: c}\n  - 42\n";
        let ix = RepoIndex::parse(idx).expect("parse");
        let versions: Vec<&str> = ix
            .versions("c")
            .iter()
            .map(|e| e.version.as_str())
            .collect();
        assert_eq!(versions, ["1.9.0-rc.1", "1.8.0", "v1.7"]);
        assert_eq!(ix.skipped().len(), 3, "{:?}", ix.skipped());
        let r = |s: &str| {
            ix.resolve("c", &VersionSpec::parse(s).expect("spec"))
                .map(|e| e.version.as_str())
        };
        assert_eq!(r("latest").expect("r"), "1.8.0");
        assert_eq!(r(">=1.0").expect("r"), "1.8.0");
        assert_eq!(r("1.9.0-rc.1").expect("r"), "1.9.0-rc.1");
        assert_eq!(r("1.7").expect("r"), "v1.7");
        assert_eq!(r("1.7.0").expect("r"), "v1.7");
        assert!(r("1.9.0").is_err());
    }

    #[test]
    fn one_chart_reads_the_same_as_all() {
        let all = RepoIndex::parse(UPSTREAM).expect("all");
        let one = RepoIndex::parse_chart(UPSTREAM, "koordinator").expect("one");
        assert_eq!(one.charts(), all.charts());
        let v = |ix: &RepoIndex, c: &str| {
            ix.versions(c)
                .iter()
                .map(|e| (e.version.clone(), e.digest.clone(), e.urls.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(v(&one, "koordinator"), v(&all, "koordinator"));
        assert!(one.versions("koord-queue").is_empty());
        assert!(!all.versions("koord-queue").is_empty());
        // Every layout Helm or a hand may write: flow (JSON), compact and indented block
        // sequences, comments, quoted keys, anchors inside the entries.
        for text in [
            r#"{"apiVersion":"v1","entries":{"x":[{"version":"9.0.0"}],"c":[{"version":"1.0.0","urls":["c.tgz"]},{"version":"2.0.0"}]}}"#,
            "apiVersion: v1\nentries:\n  x:\n  - version: 9.0.0\n  c:\n  - version: 1.0.0\n    urls: [c.tgz]\n  # a comment\n  - {version: 2.0.0}\n",
            "apiVersion: v1\nentries:\n  'x': [{version: 9.0.0}]\n  \"c\":\n      - version: 1.0.0\n        urls:\n          - c.tgz\n      - &two\n        version: 2.0.0\ngenerated: x\n",
        ] {
            let ix = RepoIndex::parse_chart(text.as_bytes(), "c").expect(text);
            assert_eq!(ix.charts(), ["c", "x"], "{text}");
            let got: Vec<&str> = ix.versions("c").iter().map(|e| e.version.as_str()).collect();
            assert_eq!(got, ["2.0.0", "1.0.0"], "{text}");
            assert_eq!(ix.versions("c")[1].urls, ["c.tgz"], "{text}");
        }
        let err = RepoIndex::parse_chart(b"apiVersion: v1\nentries:\n  c: []\n  c: []\n", "c")
            .expect_err("duplicate");
        assert!(err.to_string().contains("duplicate key \"c\""), "{err}");
        let err = RepoIndex::parse_chart(b"apiVersion: v1\n---\napiVersion: v1\n", "c")
            .expect_err("two documents");
        assert!(err.to_string().contains("more than one"), "{err}");
    }

    #[test]
    fn bad_indexes() {
        assert!(matches!(
            RepoIndex::parse(b"{{{"),
            Err(ChartError::InvalidIndex { .. })
        ));
        assert!(matches!(
            RepoIndex::parse(b"entries: {}"),
            Err(ChartError::InvalidIndex { .. })
        ));
        assert!(matches!(
            RepoIndex::parse(b"apiVersion: v2\nentries: {}"),
            Err(ChartError::InvalidIndex { .. })
        ));
        assert!(matches!(
            RepoIndex::parse(b"- a"),
            Err(ChartError::InvalidIndex { .. })
        ));
        let ix = RepoIndex::parse(b"apiVersion: v1\n").expect("empty index");
        assert!(ix.charts().is_empty());
        let err = ix
            .resolve("koordinator", &VersionSpec::Latest)
            .expect_err("unknown");
        assert!(err.to_string().contains("(none)"), "{err}");
        // JSON is YAML.
        let ix = RepoIndex::parse(
            br#"{"apiVersion":"v1","entries":{"a":[{"version":"1.0.0","urls":["a.tgz"]}]}}"#,
        )
        .expect("json index");
        assert_eq!(ix.versions("a")[0].name, "a");
    }

    #[test]
    fn chart_urls() {
        let abs = "https://github.com/koordinator-sh/charts/releases/download/koordinator-1.8.0/koordinator-1.8.0.tgz";
        assert_eq!(
            resolve_chart_url("https://koordinator-sh.github.io/charts/", abs),
            abs
        );
        for base in [
            "http://h/charts",
            "http://h/charts/",
            "http://h/charts/index.yaml",
        ] {
            assert_eq!(
                resolve_chart_url(base, "koordinator-1.8.0.tgz"),
                "http://h/charts/koordinator-1.8.0.tgz",
                "{base}"
            );
            assert_eq!(
                resolve_chart_url(base, "./sub/c.tgz"),
                "http://h/charts/sub/c.tgz"
            );
            assert_eq!(
                resolve_chart_url(base, "../other/c.tgz"),
                "http://h/other/c.tgz"
            );
            assert_eq!(
                resolve_chart_url(base, "/root/c.tgz"),
                "http://h/root/c.tgz"
            );
            assert_eq!(
                resolve_chart_url(base, "//cdn.example/c.tgz"),
                "http://cdn.example/c.tgz"
            );
        }
        assert_eq!(
            resolve_chart_url("http://h:8080", "c.tgz"),
            "http://h:8080/c.tgz"
        );
        assert_eq!(resolve_chart_url("http://h/", "c.tgz"), "http://h/c.tgz");
        assert_eq!(
            resolve_chart_url("https://h/charts?token=abc", "c.tgz"),
            "https://h/charts/c.tgz?token=abc"
        );
        assert_eq!(
            resolve_chart_url("https://h/charts/", "c.tgz?x=1"),
            "https://h/charts/c.tgz?x=1"
        );
        assert_eq!(
            resolve_chart_url("file:///srv/charts/index.yaml", "c.tgz"),
            "file:///srv/charts/c.tgz"
        );
        assert_eq!(
            resolve_chart_url("/srv/charts", "c.tgz"),
            "/srv/charts/c.tgz"
        );
        assert_eq!(
            resolve_chart_url("charts/index.yaml", "c.tgz"),
            "charts/c.tgz"
        );
        assert_eq!(resolve_chart_url("oci://x/y", "oci://z/c"), "oci://z/c");
    }

    #[test]
    fn index_urls() {
        assert_eq!(
            index_url("https://koordinator-sh.github.io/charts/"),
            "https://koordinator-sh.github.io/charts/index.yaml"
        );
        assert_eq!(
            index_url("https://koordinator-sh.github.io/charts"),
            "https://koordinator-sh.github.io/charts/index.yaml"
        );
        assert_eq!(
            index_url("http://h/charts/index.yaml"),
            "http://h/charts/index.yaml"
        );
        assert_eq!(
            index_url("http://h/charts?t=1"),
            "http://h/charts/index.yaml?t=1"
        );
    }
}
