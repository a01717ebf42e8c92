//! The candidate replacement for the libyaml guard of `yaml.rs`: serde-saphyr 2.2.0 with a
//! `Budget` (and alias-replay limits) derived from the same `Limits`, deserializing straight
//! into `serde_yaml_ng::Value` (the type every caller of `crate::yaml` uses today).
//!
//! Sizes and UTF-8 are still checked by `yaml::text_of` (serde-saphyr's byte cap only applies
//! to reader input).

use serde_saphyr::{DuplicateKeyPolicy, MergeKeyPolicy, NonFiniteFloatPolicy, Options};
use serde_yaml_ng::Value;

use crate::yaml::{text_of, Limits, YamlError};

/// With `SAPHYR_TIGHT=1`: alias replays and anchor copies capped at TIGHT events whatever
/// the source (no real input of this tool replays that much).
const TIGHT: usize = 100_000;
fn tight() -> bool {
    std::env::var_os("SAPHYR_TIGHT").is_some()
}

/// `Options` for one source, matching `yaml.rs`'s `Limits` and today's `serde_yaml_ng` reading
/// as closely as serde-saphyr allows (see FINDINGS.md for what still differs).
pub fn options(limits: &Limits, max_documents: usize) -> Options {
    let budget = serde_saphyr::budget! {
        // Strings are size-checked by text_of; this only applies to readers.
        max_reader_input_bytes: Some(limits.max_bytes),
        // Both nestings, like yaml.rs's one depth. Flow is refused in the scanner itself.
        max_depth: limits.max_depth,
        flow_nesting_limit: limits.max_depth,
        // Nodes: scalars + collection starts, alias replays included (like yaml.rs).
        max_nodes: limits.max_nodes,
        // Events are bounded by the nodes (start + end per node, plus markers); replays count.
        max_events: limits.max_nodes.saturating_mul(2).saturating_add(4 * max_documents + 16),
        max_documents: max_documents,
        // Aliases/anchors: the expanded node count is the real bound; no extra refusals.
        max_aliases: limits.max_nodes,
        max_anchors: limits.max_nodes,
        max_recorded_anchor_events: if tight() { TIGHT } else { limits.max_nodes },
        max_recorded_anchor_bytes: limits.max_bytes,
        max_total_scalar_bytes: limits.max_bytes,
        max_merge_keys: limits.max_nodes,
        // The ratio heuristic (> 10 aliases per anchor once 100 aliases) would refuse honest
        // values files that reuse one anchor many times; the node count covers bombs.
        enforce_alias_anchor_ratio: false,
    };
    serde_saphyr::options! {
        budget: budget,
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: if tight() { TIGHT } else { limits.max_nodes.saturating_mul(2) },
            max_replay_stack_depth: limits.max_depth,
        },
        // serde_yaml_ng's Mapping refuses duplicates too.
        duplicate_keys: DuplicateKeyPolicy::Error,
        // `<<` stays a plain key: chart/merge.rs resolves it the way helm (go-yaml v2) does,
        // archive.rs calls apply_merge.
        merge_keys: MergeKeyPolicy::AsOrdinary,
        // serde_yaml_ng reads .inf/.nan as floats.
        non_finite_float_policy: NonFiniteFloatPolicy::PassThrough,
        // YAML 1.2 booleans only, like serde_yaml_ng (`yes`, `on` stay strings).
        strict_booleans: true,
        // serde_yaml_ng keeps `0777`, `007`, `1_000` as strings (saphyr: 777.0, 7.0, 1000).
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        // serde_yaml_ng keeps a `!!binary` scalar's base64 text as a string.
        ignore_binary_tag_for_string: true,
        // serde_yaml_ng reads `s:` / `s: ~` into a String field as "" / "~" (kubeconfig types).
        null_as_string: true,
        // One-line messages (no source excerpt), like today's.
        with_snippet: false,
        emit_comments: false,
    }
}

fn invalid(what: &str, e: impl std::fmt::Display) -> YamlError {
    YamlError::Invalid {
        what: what.to_string(),
        reason: format!("not valid YAML: {e}"),
    }
}

/// Like `yaml::parse_value`.
pub fn parse_value(what: &str, bytes: &[u8], limits: &Limits) -> Result<Value, YamlError> {
    let text = text_of(what, bytes, limits)?;
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_saphyr::from_str_with_options(text, options(limits, 2)).map_err(|e| invalid(what, e))
}

/// Like `yaml::parse_documents` (null documents left out: serde-saphyr skips them itself).
pub fn parse_documents(what: &str, bytes: &[u8], limits: &Limits) -> Result<Vec<Value>, YamlError> {
    let text = text_of(what, bytes, limits)?;
    let docs: Vec<Value> =
        serde_saphyr::from_multiple_with_options(text, options(limits, usize::MAX / 8))
            .map_err(|e| invalid(what, e))?;
    Ok(docs.into_iter().filter(|v| !v.is_null()).collect())
}

/// Like `yaml::check`: all limits enforced (aliases replayed), nothing built.
pub fn check(what: &str, bytes: &[u8], limits: &Limits) -> Result<(), YamlError> {
    let text = text_of(what, bytes, limits)?;
    let _: Vec<serde::de::IgnoredAny> =
        serde_saphyr::from_multiple_with_options(text, options(limits, usize::MAX / 8))
            .map_err(|e| invalid(what, e))?;
    Ok(())
}

/// serde-saphyr's own event-level check (`check_yaml_budget`): aliases are NOT replayed here.
pub fn budget_scan(text: &str, limits: &Limits) -> Result<Option<String>, String> {
    let b = options(limits, usize::MAX / 8).budget.expect("budget");
    serde_saphyr::budget::check_yaml_budget(
        text,
        b,
        serde_saphyr::budget::EnforcingPolicy::AllContent,
    )
    .map(|r| r.breached.map(|b| format!("{b:?}")))
    .map_err(|e| e.to_string())
}

/// For the semantic probes: the same input read by both, no limits of interest.
pub fn probe(text: &str) -> Result<Value, String> {
    let mut o = options(&crate::yaml::VALUES, 1);
    o.with_snippet = false;
    serde_saphyr::from_str_with_options::<Value>(text, o).map_err(|e| e.to_string())
}

/// serde-saphyr with its default options (for the record).
pub fn probe_defaults(text: &str) -> Result<Value, String> {
    serde_saphyr::from_str::<Value>(text).map_err(|e| e.to_string())
}
