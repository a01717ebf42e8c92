//! Helm chart handling: repository index, chart archives, values, image discovery and CRDs.
//!
//! Everything here works on bytes the caller already fetched: no network or file-system I/O.
//!
//! * [`index`]: parse a Helm repository `index.yaml`, resolve a version constraint
//!   (Helm / Masterminds semantics) and chart URLs.
//! * [`archive`]: read a `helm package` archive (`.tgz`) safely into memory.
//! * [`values`]: the values koord-bundle sets when it installs the chart.
//! * [`rendered`]: the container images of rendered manifests (`helm template`'s output).
//! * [`discover`]: those images checked and named after the chart's components.
//! * [`crds`]: extract the CustomResourceDefinitions the chart ships (wrapped in templates).
//! * [`post_render`]: what helm's post-renderer (`koord-bundle post-render`) changes in the
//!   rendered manifests before helm applies them.
//! * `merge`: YAML 1.1 merge keys (`<<`) of rendered documents resolved as helm reads them.
//!
//! Rendering is helm's: no template is evaluated here (only the `{{ if }}` wrapper of a CRD
//! template is recognised, and cut out).

pub mod archive;
pub mod crds;
pub mod discover;
pub mod fetch;
pub mod index;
mod merge;
pub mod post_render;
pub mod rendered;
mod template;
pub mod values;

/// A regex literal of this module, compiled once (a literal that does not compile is a bug
/// caught by the tests that use it).
pub(crate) fn re(
    cell: &'static std::sync::OnceLock<regex::Regex>,
    pattern: &str,
) -> &'static regex::Regex {
    cell.get_or_init(|| regex::Regex::new(pattern).expect("valid regex literal"))
}

pub use archive::{ChartArchive, ChartMeta};
pub use crds::{extract_crds, Crd};
pub use discover::{images_from_rendered, ChartImage};
pub use index::{index_url, resolve_chart_url, ChartEntry, RepoIndex, VersionSpec};
pub use rendered::rendered_images;
pub use values::generated_values;

/// Errors of the chart module. Every message names its subject (chart, version, URL, file,
/// template path and line).
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// The repository index could not be read at all.
    #[error("repository index: {reason}")]
    InvalidIndex {
        /// What is wrong with it.
        reason: String,
    },

    /// The chart is not in the repository index.
    #[error(
        "chart {chart:?} is not in the repository index; the index has: {}",
        list_or_none(available)
    )]
    UnknownChart {
        /// The chart asked for.
        chart: String,
        /// The charts the index has (sorted).
        available: Vec<String>,
    },

    /// No version of the chart matches what was asked.
    #[error(
        "chart {chart:?} has no version matching {requested:?}; nearest existing versions: {}",
        list_or_none(nearest)
    )]
    UnknownVersion {
        /// The chart.
        chart: String,
        /// The version or constraint asked for, as given.
        requested: String,
        /// Up to 5 existing versions closest to the request, closest first.
        nearest: Vec<String>,
    },

    /// A version or version constraint could not be parsed.
    #[error("invalid chart version {spec:?}: {reason}")]
    InvalidVersionSpec {
        /// The text given.
        spec: String,
        /// Why it is refused.
        reason: String,
    },

    /// The chart archive is not a readable gzip-compressed tar.
    #[error("chart archive: {reason}")]
    InvalidArchive {
        /// What is wrong with it.
        reason: String,
    },

    /// An entry of the chart archive has a path that would escape the chart folder
    /// (absolute, `..`) or is otherwise unusable.
    #[error("chart archive entry {path:?}: {reason}")]
    UnsafePath {
        /// The path as stored in the archive (lossy UTF-8).
        path: String,
        /// Why it is refused.
        reason: String,
    },

    /// The chart archive exceeds a safety limit (uncompressed size or number of entries).
    #[error("chart archive exceeds the limit of {limit}: {what}")]
    ArchiveTooLarge {
        /// The limit, human readable (e.g. "64 MiB uncompressed").
        limit: String,
        /// What exceeded it.
        what: String,
    },

    /// A file the chart must have is missing.
    #[error("chart file {file:?} is missing from the archive")]
    MissingFile {
        /// Path relative to the chart root.
        file: String,
    },

    /// A YAML file of the chart (or given by the user) is invalid.
    #[error("{file}: {reason}")]
    InvalidYaml {
        /// The file (chart-relative path, or a description such as "values overlay").
        file: String,
        /// The parser's message or what is wrong.
        reason: String,
    },

    /// A rendered container image (from `helm template`) is not a usable image reference.
    #[error(
        "{template} (as rendered): image {reference:?} is not a valid image reference: {reason}"
    )]
    InvalidRenderedImage {
        /// The template the document came from ("rendered manifests" when unknown).
        template: String,
        /// The rendered value.
        reference: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A CRD file of the chart could not be extracted.
    #[error("CRD file {file}: {reason}")]
    InvalidCrd {
        /// Chart-relative path of the file.
        file: String,
        /// What is wrong.
        reason: String,
    },
}

impl koord_base::exit::Classify for ChartError {
    fn exit_class(&self) -> Option<koord_base::exit::ExitClass> {
        // An index, a chart archive or a version that is not what it should be.
        Some(koord_base::exit::ExitClass::Input)
    }
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "(none)".to_string()
    } else {
        items.join(", ")
    }
}

/// Render a scalar YAML value as Go's text/template would print it (`{{ .Values.x }}`):
/// strings as-is, booleans `true`/`false`, numbers in their shortest form.
/// `None` for null, sequences and mappings.
pub(crate) fn scalar_to_string(v: &serde_yaml_ng::Value) -> Option<String> {
    use serde_yaml_ng::Value;
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Some(i.to_string())
            } else if let Some(u) = n.as_u64() {
                Some(u.to_string())
            } else {
                n.as_f64().map(|f| f.to_string())
            }
        }
        Value::Tagged(t) => scalar_to_string(&t.value),
        Value::Null | Value::Sequence(_) | Value::Mapping(_) => None,
    }
}

/// Convert a YAML value to JSON. Non-string mapping keys are rendered as text (as
/// `sigs.k8s.io/yaml`, which Helm uses, does); tags are dropped; non-finite floats become
/// strings.
pub(crate) fn yaml_to_json(v: &serde_yaml_ng::Value) -> serde_json::Value {
    use serde_json::Value as J;
    use serde_yaml_ng::Value as Y;
    match v {
        Y::Null => J::Null,
        Y::Bool(b) => J::Bool(*b),
        Y::Number(n) => {
            if let Some(i) = n.as_i64() {
                J::from(i)
            } else if let Some(u) = n.as_u64() {
                J::from(u)
            } else {
                match n.as_f64().and_then(serde_json::Number::from_f64) {
                    Some(f) => J::Number(f),
                    None => J::String(n.to_string()),
                }
            }
        }
        Y::String(s) => J::String(s.clone()),
        Y::Sequence(seq) => J::Array(seq.iter().map(yaml_to_json).collect()),
        Y::Mapping(m) => {
            let mut out = serde_json::Map::new();
            for (k, val) in m {
                let key = match k {
                    Y::String(s) => s.clone(),
                    other => scalar_to_string(other).unwrap_or_else(|| {
                        serde_yaml_ng::to_string(other)
                            .map(|s| s.trim_end().to_string())
                            .unwrap_or_default()
                    }),
                };
                out.insert(key, yaml_to_json(val));
            }
            J::Object(out)
        }
        Y::Tagged(t) => yaml_to_json(&t.value),
    }
}

/// 1-based line number of byte offset `pos` in `text`.
pub(crate) fn line_of(text: &str, pos: usize) -> usize {
    let end = pos.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}
