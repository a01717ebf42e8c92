//! Every YAML document the tool reads goes through here, with a bound on its size, nesting
//! depth and number of nodes, whatever its source: a chart's `Chart.yaml`, `values.yaml` and
//! CRDs, a repository's `index.yaml`, the user's `--values` files, a kubeconfig, the manifests
//! `helm template` renders.
//!
//! # Why a guard pass, and why this one
//!
//! `serde_yaml_ng` first collects every event of a document and only then builds the value, so
//! its own recursion limit (128) is reached after the whole input has been scanned; and
//! libyaml's scanner re-checks every open flow level for each token, so 300 000 nested `[` take
//! minutes to scan (quadratic), and a `--values` file of 200 KB took 37 s. A pre-scan that
//! guesses where quoted scalars start can be walked around (`a: it's` on one line hid the
//! brackets below it from the guard that was here before).
//!
//! So the guard is the parser itself: [`events`] drives the very libyaml that `serde_yaml_ng`
//! uses (the `unsafe-libyaml` crate, same version) one event at a time and stops at the first
//! event past a limit. Both passes read the same bytes with the same scanner, so no quoting,
//! comment or block-scalar rule can make them disagree. With the nesting bounded the scan is
//! linear, and libyaml hands out the first events after at most one line (a simple key is
//! never looked for past 1024 characters), so a hostile input is refused after reading a few
//! hundred bytes of it. Aliases are counted as what they expand to (depth and nodes), so an
//! alias bomb is refused too. Only then is the document given to `serde_yaml_ng`.
//!
//! The `unsafe` code here is the small libyaml driver (`Driver`: 4 blocks, each a call into
//! libyaml's C-shaped API on a parser that never moves); koord-base's other two are in `fsio`
//! and `child`.
//!
//! # Why libyaml, and not serde-saphyr's budgets (measured)
//!
//! serde-saphyr (safe Rust, already in the tree through kube) refuses over-deep or over-large
//! input with its `Budget`, and gives the same values as this module on every real input
//! (all 36 YAML files of the 1.8.0 chart, the upstream index). It refuses deep nesting faster
//! (300 000 `[`: 0.02 ms against 1.3–1.6 ms here). But it charges an alias to the node budget
//! only by replaying what the alias expands to, so the cost of refusing an alias bomb grows
//! with the limit: the 406-byte billion-laughs file (9 anchors × 9 aliases) is refused here in
//! 0.012 ms under every [`Limits`], and by the budget after 0.8–1.1 s and 486 MB ([`VALUES`]),
//! 3.9–4.6 s and 1.9 GB ([`MANIFESTS`]), and not at all under [`INDEX`] (out of memory at a
//! 4 GB cap). Capping the replay at 100 000 events fixes the cost (≤ 0.12 s) but is a new
//! limit unrelated to `max_nodes` that a legitimate input can hit. Parse times of real input
//! are close: the 1.8.0 chart's 36 files 11–15 ms here against 13–21 ms; its largest file (the
//! nodeslos CRD, 109 KB) 2.6–3.3 ms against 2.8–3.7 ms. serde-saphyr also has no public
//! event API with byte offsets, which `koord_bundle::chart`'s index scan needs. A safe port
//! of [`events`]' counting onto its parser (granit-parser) refuses every bomb in 0.02–0.05 ms
//! but parses 1.5–3× slower and changes four behaviours (custom tags dropped, integers past
//! u64 read as floats, `1e999` as infinity, every error text). Reproduce: `bench/yaml-budgets/
//! run.sh` (its README has the whole table, 2-core machine, medians of 5 runs).

use std::collections::HashMap;
use std::mem::MaybeUninit;

use serde_yaml_ng::Value;
use unsafe_libyaml as unsafe_yaml;

/// Bounds for one source of YAML.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest input, in bytes.
    pub max_bytes: usize,
    /// Deepest nesting of collections (flow or block, aliases expanded).
    pub max_depth: usize,
    /// Most nodes (scalars and collections, aliases expanded), over all documents.
    pub max_nodes: usize,
}

const MIB: usize = 1024 * 1024;

/// Below `serde_yaml_ng`'s own recursion limit (128), above anything real (a Kubernetes CRD's
/// OpenAPI schema nests about two levels per level of the type, rarely past 40).
const DEPTH: usize = 100;

/// `Chart.yaml`.
pub const CHART_YAML: Limits = Limits {
    max_bytes: MIB,
    max_depth: DEPTH,
    max_nodes: 100_000,
};
/// A chart's `values.yaml`.
pub const VALUES: Limits = Limits {
    max_bytes: 16 * MIB,
    max_depth: DEPTH,
    max_nodes: 2_000_000,
};
/// A `--values` file given by the user.
pub const VALUES_FILE: Limits = VALUES;
/// One CustomResourceDefinition file of a chart.
pub const CRD: Limits = Limits {
    max_bytes: 16 * MIB,
    max_depth: DEPTH,
    max_nodes: 2_000_000,
};
/// A Helm repository `index.yaml` (scanned in full, parsed only for the charts asked for:
/// see `koord_bundle::chart::RepoIndex`). Big public repositories serve 20–30 MB.
pub const INDEX: Limits = Limits {
    max_bytes: 128 * MIB,
    max_depth: DEPTH,
    max_nodes: 50_000_000,
};
/// A kubeconfig file.
pub const KUBECONFIG: Limits = Limits {
    max_bytes: 4 * MIB,
    max_depth: DEPTH,
    max_nodes: 200_000,
};
/// The manifests `helm template` renders from a chart.
pub const MANIFESTS: Limits = Limits {
    max_bytes: 64 * MIB,
    max_depth: DEPTH,
    max_nodes: 8_000_000,
};

/// A YAML input refused or not readable. Every message names the input (`what`).
#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    /// Larger than the limit for its source.
    #[error("{what}: {size} bytes, more than the {limit} bytes allowed for it")]
    TooLarge {
        /// The input.
        what: String,
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Collections nested deeper than allowed.
    #[error("{what}: line {line}: collections nested deeper than {limit} levels (aliases expanded); refused before parsing")]
    TooDeep {
        /// The input.
        what: String,
        /// 1-based line where the limit was passed.
        line: usize,
        /// The limit.
        limit: usize,
    },
    /// More nodes than allowed.
    #[error("{what}: line {line}: more than {limit} YAML nodes (aliases expanded); refused before parsing")]
    TooManyNodes {
        /// The input.
        what: String,
        /// 1-based line where the limit was passed.
        line: usize,
        /// The limit.
        limit: usize,
    },
    /// Not UTF-8 (the only encoding accepted).
    #[error("{what}: not valid UTF-8 (at byte {offset})")]
    NotUtf8 {
        /// The input.
        what: String,
        /// Offset of the first invalid byte.
        offset: usize,
    },
    /// Not YAML, or not the shape asked for.
    #[error("{what}: {reason}")]
    Invalid {
        /// The input.
        what: String,
        /// The parser's message (with line and column) or what is wrong.
        reason: String,
    },
}

impl crate::exit::Classify for YamlError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        // YAML from outside (a chart, a kubeconfig, values) beyond its bounds, or not YAML.
        Some(crate::exit::ExitClass::Input)
    }
}

impl YamlError {
    /// The message without its subject (for callers that name the input themselves).
    pub fn reason(&self) -> String {
        let full = self.to_string();
        let what = match self {
            YamlError::TooLarge { what, .. }
            | YamlError::TooDeep { what, .. }
            | YamlError::TooManyNodes { what, .. }
            | YamlError::NotUtf8 { what, .. }
            | YamlError::Invalid { what, .. } => what,
        };
        full.strip_prefix(&format!("{what}: "))
            .map(str::to_string)
            .unwrap_or(full)
    }
}

/// What kind of event [`events`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `---` (or the implicit start of a document).
    DocumentStart,
    /// The end of a document.
    DocumentEnd,
    /// The start of a mapping.
    MappingStart,
    /// The end of a mapping.
    MappingEnd,
    /// The start of a sequence.
    SequenceStart,
    /// The end of a sequence.
    SequenceEnd,
    /// A scalar.
    Scalar,
    /// An alias (`*name`).
    Alias,
}

/// One parser event: where it is, and for scalars their value.
#[derive(Debug, Clone)]
pub struct Event {
    /// What the event is.
    pub kind: Kind,
    /// Byte offset (in the text given to [`events`]) where the node starts (its anchor or tag
    /// included).
    pub start: usize,
    /// Byte offset just after the event.
    pub end: usize,
    /// 0-based column of `start`.
    pub column: usize,
    /// 0-based line of `start`.
    pub line: usize,
    /// The anchor (`&name`) of a node, or the name an alias refers to.
    pub anchor: Option<Vec<u8>>,
    /// A scalar's value (quotes and escapes resolved); empty for other events.
    pub value: Vec<u8>,
    /// The scalar is plain (unquoted, not a block scalar).
    pub plain: bool,
}

/// The text of `bytes` for parsing: size checked, UTF-8 checked, a leading byte-order mark
/// dropped.
pub fn text_of<'a>(what: &str, bytes: &'a [u8], limits: &Limits) -> Result<&'a str, YamlError> {
    if bytes.len() > limits.max_bytes {
        return Err(YamlError::TooLarge {
            what: what.to_string(),
            size: bytes.len(),
            limit: limits.max_bytes,
        });
    }
    let text = std::str::from_utf8(bytes).map_err(|e| YamlError::NotUtf8 {
        what: what.to_string(),
        offset: e.valid_up_to(),
    })?;
    Ok(text.strip_prefix('\u{feff}').unwrap_or(text))
}

/// One open collection, for the limits.
struct Open {
    anchor: Option<Vec<u8>>,
    nodes_before: usize,
    depth: usize,
    deepest_below: usize,
}

/// Drive the parser over `text` (already size- and UTF-8-checked by the caller, or use
/// [`check`]) with `limits` enforced, calling `on_event` for every event in order. Stops at
/// the first event past a limit, at a syntax error, or when `on_event` returns an error.
/// Returns the number of documents.
pub fn events(
    what: &str,
    text: &str,
    limits: &Limits,
    on_event: &mut dyn FnMut(&Event) -> Result<(), YamlError>,
) -> Result<usize, YamlError> {
    let mut driver = Driver::new(text).map_err(|reason| YamlError::Invalid {
        what: what.to_string(),
        reason,
    })?;
    // anchor -> (nodes, depth) of the node it names, as expanded.
    let mut anchors: HashMap<Vec<u8>, (usize, usize)> = HashMap::new();
    let mut open: Vec<Open> = Vec::new();
    let mut nodes = 0usize;
    let mut documents = 0usize;
    let too_deep = |line: usize| YamlError::TooDeep {
        what: what.to_string(),
        line: line + 1,
        limit: limits.max_depth,
    };
    let too_many = |line: usize| YamlError::TooManyNodes {
        what: what.to_string(),
        line: line + 1,
        limit: limits.max_nodes,
    };
    loop {
        let Some(ev) = driver.next().map_err(|reason| YamlError::Invalid {
            what: what.to_string(),
            reason: format!("not valid YAML: {reason}"),
        })?
        else {
            return Ok(documents);
        };
        let depth = open.len();
        match ev.kind {
            Kind::DocumentStart => {
                documents += 1;
                anchors.clear();
            }
            Kind::DocumentEnd => {}
            Kind::MappingStart | Kind::SequenceStart => {
                nodes += 1;
                if depth + 1 > limits.max_depth {
                    return Err(too_deep(ev.line));
                }
                open.push(Open {
                    anchor: ev.anchor.clone(),
                    nodes_before: nodes - 1,
                    depth: depth + 1,
                    deepest_below: depth + 1,
                });
            }
            Kind::MappingEnd | Kind::SequenceEnd => {
                if let Some(o) = open.pop() {
                    if let Some(parent) = open.last_mut() {
                        parent.deepest_below = parent.deepest_below.max(o.deepest_below);
                    }
                    if let Some(a) = o.anchor {
                        anchors.insert(a, (nodes - o.nodes_before, o.deepest_below - o.depth + 1));
                    }
                }
            }
            Kind::Scalar => {
                nodes += 1;
                if let Some(a) = &ev.anchor {
                    anchors.insert(a.clone(), (1, 0));
                }
            }
            Kind::Alias => {
                // libyaml itself refuses an alias to an unknown anchor.
                let (n, d) = ev
                    .anchor
                    .as_ref()
                    .and_then(|a| anchors.get(a))
                    .copied()
                    .unwrap_or((1, 0));
                nodes = nodes.saturating_add(n);
                if depth + d > limits.max_depth {
                    return Err(too_deep(ev.line));
                }
                if let Some(o) = open.last_mut() {
                    o.deepest_below = o.deepest_below.max(depth + d);
                }
            }
        }
        if nodes > limits.max_nodes {
            return Err(too_many(ev.line));
        }
        on_event(&ev)?;
    }
}

/// Check `bytes` against `limits` without building anything; returns the text (byte-order
/// mark dropped) and the number of documents.
pub fn check<'a>(
    what: &str,
    bytes: &'a [u8],
    limits: &Limits,
) -> Result<(&'a str, usize), YamlError> {
    let text = text_of(what, bytes, limits)?;
    let docs = events(what, text, limits, &mut |_| Ok(()))?;
    Ok((text, docs))
}

fn invalid(what: &str, e: impl std::fmt::Display) -> YamlError {
    YamlError::Invalid {
        what: what.to_string(),
        reason: format!("not valid YAML: {e}"),
    }
}

/// Parse one YAML document (an empty input is `null`) into a value, within `limits`.
/// More than one document is refused.
pub fn parse_value(what: &str, bytes: &[u8], limits: &Limits) -> Result<Value, YamlError> {
    parse(what, bytes, limits)
}

/// Parse one YAML document into `T`, within `limits`. More than one document is refused.
pub fn parse<T: serde::de::DeserializeOwned>(
    what: &str,
    bytes: &[u8],
    limits: &Limits,
) -> Result<T, YamlError> {
    let (text, docs) = check(what, bytes, limits)?;
    parse_checked(what, text, docs)
}

/// Parse `text`, already guarded by [`events`] (`docs`: the documents it counted), into `T`.
#[allow(clippy::disallowed_methods)] // the one place that parses, after the guard
fn parse_checked<T: serde::de::DeserializeOwned>(
    what: &str,
    text: &str,
    docs: usize,
) -> Result<T, YamlError> {
    if docs > 1 {
        return Err(YamlError::Invalid {
            what: what.to_string(),
            reason: format!("holds {docs} YAML documents; one is expected"),
        });
    }
    serde_yaml_ng::from_str(text).map_err(|e| invalid(what, e))
}

/// Parse every document of a YAML stream (`---`-separated), within `limits` (over all of
/// them). Empty documents are left out.
#[allow(clippy::disallowed_methods)] // the one place that parses, after the guard
pub fn parse_documents(what: &str, bytes: &[u8], limits: &Limits) -> Result<Vec<Value>, YamlError> {
    use serde::Deserialize as _;
    let (text, _) = check(what, bytes, limits)?;
    let mut out = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let v = Value::deserialize(doc).map_err(|e| YamlError::Invalid {
            what: what.to_string(),
            reason: format!("document {}: not valid YAML: {e}", i + 1),
        })?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

/// The libyaml event parser over one text: the `unsafe` code of this module.
struct Driver<'a> {
    /// Boxed: libyaml keeps a pointer to the parser in the parser (`read_handler_data`), so
    /// it must not move once initialised.
    parser: Box<MaybeUninit<unsafe_yaml::yaml_parser_t>>,
    text: &'a str,
    done: bool,
}

impl<'a> Driver<'a> {
    fn new(text: &'a str) -> Result<Self, String> {
        let mut parser = Box::new(MaybeUninit::<unsafe_yaml::yaml_parser_t>::uninit());
        // SAFETY: `yaml_parser_initialize` initialises the whole struct it is given (it zeroes
        // it first); on failure nothing was allocated and the memory is never read (`Drop` is
        // not run: the Box is dropped as `MaybeUninit`).
        unsafe {
            let p: *mut unsafe_yaml::yaml_parser_t = MaybeUninit::as_mut_ptr(&mut *parser);
            if unsafe_yaml::yaml_parser_initialize(p).fail {
                return Err("the YAML parser could not be initialised (out of memory)".into());
            }
            unsafe_yaml::yaml_parser_set_encoding(p, unsafe_yaml::YAML_UTF8_ENCODING);
            // The parser reads `text` through this pointer until it is deleted: `Driver`
            // borrows `text` for its whole life.
            unsafe_yaml::yaml_parser_set_input_string(p, text.as_ptr(), text.len() as u64);
        }
        Ok(Driver {
            parser,
            text,
            done: false,
        })
    }

    /// The parser's error, with its position.
    fn error(&mut self) -> String {
        // SAFETY: the parser is initialised; `problem` and `context` are null or point to
        // static NUL-terminated strings of libyaml.
        unsafe {
            let p: *mut unsafe_yaml::yaml_parser_t = MaybeUninit::as_mut_ptr(&mut *self.parser);
            let text = |s: *const std::ffi::c_char| {
                if s.is_null() {
                    None
                } else {
                    Some(std::ffi::CStr::from_ptr(s).to_string_lossy().into_owned())
                }
            };
            // The public error fields are reached through `Deref` (a prefix struct).
            let parser: &unsafe_yaml::yaml_parser_t = &*p;
            let problem = text(parser.problem.cast()).unwrap_or_else(|| "syntax error".into());
            let mark = parser.problem_mark;
            let mut msg = format!(
                "line {} column {}: {problem}",
                mark.line + 1,
                mark.column + 1
            );
            if let Some(ctx) = text(parser.context.cast()) {
                let cm = parser.context_mark;
                msg.push_str(&format!(
                    " ({ctx} at line {} column {})",
                    cm.line + 1,
                    cm.column + 1
                ));
            }
            msg
        }
    }

    /// The next event, `None` after the end of the stream.
    fn next(&mut self) -> Result<Option<Event>, String> {
        if self.done {
            return Ok(None);
        }
        let mut raw = MaybeUninit::<unsafe_yaml::yaml_event_t>::uninit();
        // SAFETY: the parser is initialised and its input (`self.text`) is alive. After a
        // successful `yaml_parser_parse` the event is initialised; its pointers (anchor,
        // scalar value) are valid until `yaml_event_delete`, which is called once, after
        // everything was copied out of it.
        unsafe {
            let p: *mut unsafe_yaml::yaml_parser_t = MaybeUninit::as_mut_ptr(&mut *self.parser);
            let failed_before = (&*p).error != unsafe_yaml::YAML_NO_ERROR;
            if failed_before || unsafe_yaml::yaml_parser_parse(p, raw.as_mut_ptr()).fail {
                self.done = true;
                return Err(self.error());
            }
            let e = raw.as_mut_ptr();
            let bytes = |ptr: *const u8, len: usize| -> Vec<u8> {
                if ptr.is_null() {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(ptr, len).to_vec()
                }
            };
            let cstr = |ptr: *const u8| -> Option<Vec<u8>> {
                if ptr.is_null() {
                    None
                } else {
                    Some(std::ffi::CStr::from_ptr(ptr.cast()).to_bytes().to_vec())
                }
            };
            let (kind, anchor, value, plain) = match (*e).type_ {
                unsafe_yaml::YAML_STREAM_START_EVENT | unsafe_yaml::YAML_NO_EVENT => {
                    unsafe_yaml::yaml_event_delete(e);
                    return self.next();
                }
                unsafe_yaml::YAML_STREAM_END_EVENT => {
                    unsafe_yaml::yaml_event_delete(e);
                    self.done = true;
                    return Ok(None);
                }
                unsafe_yaml::YAML_DOCUMENT_START_EVENT => {
                    (Kind::DocumentStart, None, Vec::new(), false)
                }
                unsafe_yaml::YAML_DOCUMENT_END_EVENT => {
                    (Kind::DocumentEnd, None, Vec::new(), false)
                }
                unsafe_yaml::YAML_ALIAS_EVENT => {
                    (Kind::Alias, cstr((*e).data.alias.anchor), Vec::new(), false)
                }
                unsafe_yaml::YAML_SCALAR_EVENT => {
                    let s = (*e).data.scalar;
                    (
                        Kind::Scalar,
                        cstr(s.anchor),
                        bytes(s.value, s.length as usize),
                        s.style == unsafe_yaml::YAML_PLAIN_SCALAR_STYLE,
                    )
                }
                unsafe_yaml::YAML_SEQUENCE_START_EVENT => (
                    Kind::SequenceStart,
                    cstr((*e).data.sequence_start.anchor),
                    Vec::new(),
                    false,
                ),
                unsafe_yaml::YAML_SEQUENCE_END_EVENT => {
                    (Kind::SequenceEnd, None, Vec::new(), false)
                }
                unsafe_yaml::YAML_MAPPING_START_EVENT => (
                    Kind::MappingStart,
                    cstr((*e).data.mapping_start.anchor),
                    Vec::new(),
                    false,
                ),
                _ => (Kind::MappingEnd, None, Vec::new(), false),
            };
            let (sm, em) = ((*e).start_mark, (*e).end_mark);
            unsafe_yaml::yaml_event_delete(e);
            let len = self.text.len();
            Ok(Some(Event {
                kind,
                start: (sm.index as usize).min(len),
                end: (em.index as usize).min(len),
                column: sm.column as usize,
                line: sm.line as usize,
                anchor,
                value,
                plain,
            }))
        }
    }
}

impl Drop for Driver<'_> {
    fn drop(&mut self) {
        // SAFETY: a `Driver` exists only with an initialised parser; deleted once.
        unsafe { unsafe_yaml::yaml_parser_delete(MaybeUninit::as_mut_ptr(&mut *self.parser)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: Limits = Limits {
        max_bytes: 1 << 20,
        max_depth: 10,
        max_nodes: 1000,
    };

    #[test]
    fn parses_like_serde_yaml() {
        let v = parse_value("t", b"a: [1, {b: 'x'}]\nc: &x {d: 1}\ne: *x\n", &SMALL).expect("ok");
        assert_eq!(v["a"][1]["b"], "x");
        assert_eq!(v["e"]["d"], 1);
        assert!(parse_value("t", b"", &SMALL).expect("empty").is_null());
        assert!(parse_value("t", "\u{feff}a: 1\n".as_bytes(), &SMALL).is_ok());
        let docs = parse_documents("t", b"a: 1\n---\n---\nb: 2\n", &SMALL).expect("docs");
        assert_eq!(docs.len(), 2);
        let err = parse_value("t", b"a: 1\n---\nb: 2\n", &SMALL).expect_err("two docs");
        assert!(err.to_string().contains("2 YAML documents"), "{err}");
        let err = parse_value("t", b"a: [\n", &SMALL).expect_err("syntax");
        assert!(err.to_string().starts_with("t: "), "{err}");
    }

    #[test]
    fn depth_is_bounded_whatever_the_quotes() {
        // The walk-around of the old guard (a `'` inside a plain scalar), and its cousins: a
        // quote in a comment, in a block scalar. The error must be the depth bound, reported
        // at the line of the brackets (the parser's own recursion error would mean the whole
        // input was scanned first).
        for (prefix, line) in [
            ("a: it's\nb: ", 2),
            ("# it's\nb: ", 2),
            ("a: |\n  it's\nb: ", 3),
            ("a: 'it''s'\nb: ", 2),
            ("", 1),
        ] {
            let mut text = prefix.as_bytes().to_vec();
            text.extend(std::iter::repeat_n(b'[', 300_000));
            let err = parse_value("deep", &text, &VALUES).expect_err(prefix);
            assert!(
                matches!(err, YamlError::TooDeep { line: l, limit: 100, .. } if l == line),
                "{prefix:?}: {err}"
            );
        }
        // An unterminated quote is a syntax error, found without scanning the rest.
        let mut text = b"a: \"x\nb: ".to_vec();
        text.extend(std::iter::repeat_n(b'[', 300_000));
        let err = parse_value("deep", &text, &VALUES).expect_err("quote");
        assert!(matches!(err, YamlError::Invalid { .. }), "{err}");
        let err =
            parse_value("deep", b"a:\n - - - - - - - - - - - x\n", &SMALL).expect_err("block");
        assert!(matches!(err, YamlError::TooDeep { line: 2, .. }), "{err}");
        assert!(parse_value("ok", b"a:\n - - - - - - - x\n", &SMALL).is_ok());
    }

    #[test]
    fn aliases_count_as_what_they_expand_to() {
        let bomb = b"a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n";
        let err = parse_value("bomb", bomb, &SMALL).expect_err("bomb");
        assert!(
            matches!(err, YamlError::TooManyNodes { line: 3, .. }),
            "{err}"
        );
        let deep = b"a: &a [[[[[[[[x]]]]]]]]\nb: [[[*a]]]\n";
        let err = parse_value("deep alias", deep, &SMALL).expect_err("deep alias");
        assert!(matches!(err, YamlError::TooDeep { line: 2, .. }), "{err}");
    }

    #[test]
    fn size_and_encoding() {
        let err = parse_value(
            "big",
            &[b' '; 2048],
            &Limits {
                max_bytes: 1024,
                ..SMALL
            },
        )
        .expect_err("big");
        assert!(
            err.to_string().contains("2048 bytes, more than the 1024"),
            "{err}"
        );
        let err = parse_value("bin", b"a: \xff\n", &SMALL).expect_err("utf8");
        assert!(matches!(err, YamlError::NotUtf8 { offset: 3, .. }), "{err}");
    }

    #[test]
    fn events_report_positions() {
        let text = "x: 1\nentries:\n  c:\n  - {v: 1}\n  d: []\n";
        let mut seen = Vec::new();
        events("t", text, &SMALL, &mut |e| {
            seen.push((
                e.kind,
                e.start,
                String::from_utf8_lossy(&e.value).into_owned(),
            ));
            Ok(())
        })
        .expect("events");
        let seq = seen
            .iter()
            .find(|(k, _, _)| *k == Kind::SequenceStart)
            .expect("sequence");
        assert_eq!(&text[seq.1..seq.1 + 3], "- {");
    }
}
