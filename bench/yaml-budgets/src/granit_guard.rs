//! Option C: yaml.rs's guard (limits with aliases counted as expanded, arithmetically) ported
//! from libyaml to granit-parser (the safe parser serde-saphyr is built on, re-exported as
//! `serde_saphyr::granit_parser`), then serde-saphyr parses. Same scanner for both passes, no
//! `unsafe`, a bomb is refused without replaying it.

use std::collections::HashMap;

use serde_saphyr::granit_parser::{Event, Parser};
use serde_yaml_ng::Value;

use crate::yaml::{text_of, Limits, YamlError};

struct Open {
    anchor: usize,
    nodes_before: usize,
    depth: usize,
    deepest_below: usize,
}

/// Walk the events with the limits; returns the number of documents.
pub fn guard(what: &str, text: &str, limits: &Limits) -> Result<usize, YamlError> {
    let opts = serde_saphyr::granit_parser::options! {
        flow_nesting_limit: limits.max_depth,
        block_nesting_limit: limits.max_depth + 1,
        emit_comments: false,
    };
    let parser = Parser::new_from_str_with_options(text, opts);
    let mut anchors: HashMap<usize, (usize, usize)> = HashMap::new();
    let mut open: Vec<Open> = Vec::new();
    let (mut nodes, mut documents) = (0usize, 0usize);
    let too_deep = |line: usize| YamlError::TooDeep {
        what: what.into(),
        line,
        limit: limits.max_depth,
    };
    let too_many = |line: usize| YamlError::TooManyNodes {
        what: what.into(),
        line,
        limit: limits.max_nodes,
    };
    for item in parser {
        let (ev, span) = item.map_err(|e| YamlError::Invalid {
            what: what.into(),
            reason: format!("not valid YAML: {e}"),
        })?;
        let line = span.start.line();
        let depth = open.len();
        match ev {
            Event::DocumentStart(..) => {
                documents += 1;
                anchors.clear();
            }
            Event::MappingStart(_, anchor, _) | Event::SequenceStart(_, anchor, _) => {
                nodes += 1;
                if depth + 1 > limits.max_depth {
                    return Err(too_deep(line));
                }
                open.push(Open {
                    anchor,
                    nodes_before: nodes - 1,
                    depth: depth + 1,
                    deepest_below: depth + 1,
                });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                if let Some(o) = open.pop() {
                    if let Some(p) = open.last_mut() {
                        p.deepest_below = p.deepest_below.max(o.deepest_below);
                    }
                    if o.anchor != 0 {
                        anchors.insert(
                            o.anchor,
                            (nodes - o.nodes_before, o.deepest_below - o.depth + 1),
                        );
                    }
                }
            }
            Event::Scalar(_, _, anchor, _) => {
                nodes += 1;
                if anchor != 0 {
                    anchors.insert(anchor, (1, 0));
                }
            }
            Event::Alias(id) => {
                let (n, d) = anchors.get(&id).copied().unwrap_or((1, 0));
                nodes = nodes.saturating_add(n);
                if depth + d > limits.max_depth {
                    return Err(too_deep(line));
                }
                if let Some(o) = open.last_mut() {
                    o.deepest_below = o.deepest_below.max(depth + d);
                }
            }
            _ => {}
        }
        if nodes > limits.max_nodes {
            return Err(too_many(line));
        }
    }
    Ok(documents)
}

pub fn parse_value(what: &str, bytes: &[u8], limits: &Limits) -> Result<Value, YamlError> {
    let text = text_of(what, bytes, limits)?;
    let docs = guard(what, text, limits)?;
    if docs > 1 {
        return Err(YamlError::Invalid {
            what: what.into(),
            reason: format!("holds {docs} YAML documents; one is expected"),
        });
    }
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_saphyr::from_str_with_options(text, crate::saphyr::options(limits, 2)).map_err(|e| {
        YamlError::Invalid {
            what: what.into(),
            reason: format!("not valid YAML: {e}"),
        }
    })
}

pub fn parse_documents(what: &str, bytes: &[u8], limits: &Limits) -> Result<Vec<Value>, YamlError> {
    let text = text_of(what, bytes, limits)?;
    guard(what, text, limits)?;
    let docs: Vec<Value> = serde_saphyr::from_multiple_with_options(
        text,
        crate::saphyr::options(limits, usize::MAX / 8),
    )
    .map_err(|e| YamlError::Invalid {
        what: what.into(),
        reason: format!("not valid YAML: {e}"),
    })?;
    Ok(docs.into_iter().filter(|v| !v.is_null()).collect())
}
