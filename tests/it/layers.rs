//! The dependency direction of the crate's modules, as go-containerregistry's depcheck holds
//! its own: a module may use only modules of a lower layer.
//!
//! ```text
//! 0  exit               the exit codes and the class trait every error type implements beside its definition
//! 1  oci, text, yaml, child, bounded, secret, parity    pure types, text helpers, the one bounded YAML entry, the one child-process runner, bounded reads, secrets; the erasure code
//! 2  sign, fsio         signatures (minisign), file primitives: over bounded reads
//! 3  store, crd, atomic  sources and sinks: registry, blob cache, memory, files; CRD schemas read through yaml; files written atomically
//! 4  copy, set, class   the one graph walk over stores; split sets (format v2); the list of koord-base's error types, for a chain
//! 5  parts, splitset    a bundle on disk, one file or parts; `koord_splitset::` as the root crate sees it
//! 6  bundle, chart, cluster, helm, serve, sources, admission    the domain, side by side (none uses another)
//! 7  cli, progress, load  flags and the printer, for the commands only; load's pipeline (pre-flight, plan, render, push, install) over the domain
//! 8  cmd                the commands: the only place that prints or reads the environment
//! ```

use crate::common::{all_sources, module_path, sources};
use std::path::Path;

const LAYERS: &[(&str, u8)] = &[
    ("exit", 0),
    ("oci", 1),
    ("text", 1),
    ("yaml", 1),
    ("child", 1),
    ("bounded", 1),
    ("secret", 1),
    ("parity", 1),
    ("sign", 2),
    ("fsio", 2),
    ("store", 3),
    ("crd", 3),
    ("atomic", 3),
    ("class", 4),
    ("copy", 4),
    ("set", 4),
    ("parts", 5),
    ("splitset", 5),
    ("bundle", 6),
    ("chart", 6),
    ("cluster", 6),
    ("helm", 6),
    ("serve", 6),
    ("sources", 6),
    ("admission", 6),
    ("cli", 7),
    ("progress", 7),
    ("load", 7),
    // A crate's list of its error types (`koord_kube::class_of`, in its lib.rs): it names the
    // types of every module of its crate, the domain's included.
    ("class_of", 7),
    ("cmd", 8),
];

/// The macros `lib.rs` exports, and the module each expands into.
const MACROS: &[(&str, &str)] = &[
    ("say", "progress"),
    ("tell", "progress"),
    ("exit_classes", "exit"),
];

fn layer(module: &str) -> Option<u8> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
}

/// `(file's module, used module, line)` for every use of `crate::X` against the direction.
fn violations(files: &[(String, String)]) -> Vec<String> {
    // `koord_base::X`, `koord_store::X` and `koord_kube::X` (workspace crates, re-exported at
    // the old paths) are modules of the same layers as `crate::X`; `koord_splitset::` (no
    // re-export: the root names its items) is the crate as a whole, layer `splitset`.
    let re = regex::Regex::new(
        r"(?:crate|koord_base|koord_store|koord_kube)::([a-z_]+)|\bkoord_(splitset)::",
    )
    .unwrap();
    let mut bad = Vec::new();
    for (path, text) in files {
        let module = module_of(path);
        if module == "lib" || module == "main" {
            continue;
        }
        let Some(own) = layer(&module) else {
            bad.push(format!(
                "{path}: module {module} has no layer (add it to LAYERS)"
            ));
            continue;
        };
        let code = blank_comments(text);
        for (at, used) in used_modules(&re, &code) {
            if used == module {
                continue;
            }
            let n = code[..at].matches('\n').count() + 1;
            match layer(&used) {
                Some(l) if l < own => {}
                Some(l) => bad.push(format!(
                    "{path}:{n}: {module} (layer {own}) uses {used} (layer {l})"
                )),
                None => bad.push(format!("{path}:{n}: unknown module {used}")),
            }
        }
    }
    bad
}

/// The top module of a source file: `src/store/x.rs` → `store`; a crate of the workspace
/// holds modules of the same layers, `crates/koord-base/src/oci/x.rs` → `oci`.
fn module_of(path: &str) -> String {
    let inside = match path.strip_prefix("crates/") {
        Some(rest) => rest.split_once("/src/").map_or(rest, |(_, p)| p),
        None => path.trim_start_matches("src/"),
    };
    inside
        .split(['/', '.'])
        .next()
        .unwrap_or_default()
        .to_string()
}

/// `text` with its comment lines blanked (line numbers kept).
fn blank_comments(text: &str) -> String {
    text.lines()
        .map(|l| {
            if l.trim_start().starts_with("//") {
                ""
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules of `tests/it` that hold helpers and no test. Every other file there is a
/// scenario, and may use only these: a helper two scenarios share lives in one of them.
const TEST_HELPERS: &[&str] = &[
    "cluster",
    "common",
    "fake_registry",
    "fault_proxy",
    "kube_fake",
    "serve_proc",
];

/// Every use, in a file of `tests/it`, of a module of `tests/it` that is not a helper.
fn test_violations(files: &[(String, String)]) -> Vec<String> {
    let re = regex::Regex::new(r"crate::([a-z_]+)").unwrap();
    let mut bad = Vec::new();
    for (path, text) in files {
        let module = Path::new(path)
            .file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default();
        // main lists the modules; this file's test data is made of `crate::` paths.
        if module == "main" || module == "layers" {
            continue;
        }
        let code = blank_comments(text);
        for (at, used) in used_modules(&re, &code) {
            if used == module || TEST_HELPERS.contains(&used.as_str()) {
                continue;
            }
            let n = code[..at].matches('\n').count() + 1;
            bad.push(format!(
                "{path}:{n}: {module} uses {used}, which is not a helper module: move what \
                 it needs to one of {TEST_HELPERS:?}"
            ));
        }
    }
    bad
}

/// `(byte offset, module)` of every `crate::X`, and of every top-level item of a grouped
/// `crate::{X, Y::Z, ...}` (which may span lines).
fn used_modules(re: &regex::Regex, code: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = re
        .captures_iter(code)
        .map(|c| {
            // Group 1 of a `crate::X` pattern, group 2 (when there is one) of a crate's name.
            let m = c.get(1).or_else(|| c.get(2)).expect("a group");
            let name = m.as_str();
            // A macro of the crate root (`crate::say!`) counts as the module it expands into.
            let name = match MACROS.iter().find(|(mac, _)| *mac == name) {
                Some((_, module)) if code[m.end()..].starts_with('!') => module,
                _ => name,
            };
            (m.start(), name.to_string())
        })
        .collect();
    for (start, _) in code.match_indices("crate::{") {
        let mut depth = 0;
        let mut item_start = true;
        for (i, ch) in code[start + "crate::".len()..].char_indices() {
            let at = start + "crate::".len() + i;
            match ch {
                '{' => {
                    depth += 1;
                    item_start = depth == 1;
                }
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                ',' if depth == 1 => item_start = true,
                c if item_start && depth == 1 && c.is_ascii_lowercase() => {
                    let name: String = code[at..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    out.push((at, name));
                    item_start = false;
                }
                c if item_start && !c.is_whitespace() => item_start = false,
                _ => {}
            }
        }
    }
    out
}

#[test]
fn modules_depend_only_on_lower_layers() {
    let files = all_sources();
    assert!(files.len() > 30, "read the sources");
    let bad = violations(&files);
    assert!(bad.is_empty(), "against the layers:\n{}", bad.join("\n"));
}

#[test]
fn the_check_finds_a_use_against_the_direction() {
    let files = vec![
        (
            "src/store/x.rs".to_string(),
            "use crate::oci::Digest;\nuse crate::copy::transfer;\n// crate::cmd in a comment\n"
                .to_string(),
        ),
        (
            "src/bundle/y.rs".to_string(),
            "fn f() { crate::chart::x(); }".to_string(),
        ),
        (
            "src/oci/z.rs".to_string(),
            "use crate::{\n    oci::Digest,\n    store::{Sink, Source},\n};\n".to_string(),
        ),
        (
            "src/cmd/w.rs".to_string(),
            "fn f() { crate::say!(\"x\"); }".to_string(),
        ),
        (
            "src/store/v.rs".to_string(),
            "fn f() { crate::tell!(\"x\"); }".to_string(),
        ),
    ];
    let mut files = files;
    files.push((
        "crates/koord-base/src/oci/u.rs".to_string(),
        "use crate::store::Sink;\n".to_string(),
    ));
    files.push((
        "src/text.rs".to_string(),
        "use koord_base::cluster::x;\n".to_string(),
    ));
    files.push((
        "src/copy.rs".to_string(),
        "fn f() { koord_splitset::join(); }\n".to_string(),
    ));
    files.push((
        "crates/koord-splitset/src/set/w.rs".to_string(),
        "use crate::parts::BundleFile;\n".to_string(),
    ));
    files.push((
        "crates/koord-base/src/sign.rs".to_string(),
        "fn f() { koord_store::copy::transfer(); }\n".to_string(),
    ));
    files.push((
        "crates/koord-kube/src/chart/x.rs".to_string(),
        "fn f() { koord_kube::cluster::list(); }\n".to_string(),
    ));
    let bad = violations(&files);
    assert_eq!(bad.len(), 10, "{bad:?}");
    assert!(
        bad[9]
            .contains("crates/koord-kube/src/chart/x.rs:1: chart (layer 6) uses cluster (layer 6)"),
        "a path through koord_kube, side by side: {bad:?}"
    );
    assert!(
        bad[8].contains("crates/koord-base/src/sign.rs:1: sign (layer 2) uses copy (layer 4)"),
        "a path through koord_store: {bad:?}"
    );
    assert!(
        bad[6].contains("src/copy.rs:1: copy (layer 4) uses splitset (layer 5)"),
        "a path through koord_splitset: {bad:?}"
    );
    assert!(
        bad[7].contains("set (layer 4) uses parts (layer 5)"),
        "inside koord-splitset: {bad:?}"
    );
    assert!(
        bad[4].contains("crates/koord-base/src/oci/u.rs:1: oci (layer 1) uses store (layer 3)"),
        "a file of a workspace crate: {bad:?}"
    );
    assert!(
        bad[5].contains("text (layer 1) uses cluster (layer 6)"),
        "a path through koord_base: {bad:?}"
    );
    assert!(
        bad[3].contains("store (layer 3) uses progress (layer 7)"),
        "a root macro counts as the module it expands into: {bad:?}"
    );
    assert!(bad[0].contains("store (layer 3) uses copy (layer 4)"));
    assert!(bad[1].contains("bundle (layer 6) uses chart (layer 6)"));
    assert!(
        bad[2].contains("src/oci/z.rs:3: oci (layer 1) uses store (layer 3)"),
        "a grouped import: {bad:?}"
    );
}

#[test]
fn test_files_use_only_helper_modules() {
    let mut files = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it"),
        &mut files,
    );
    assert!(files.len() > 20, "read the test files");
    let bad = test_violations(&files);
    assert!(
        bad.is_empty(),
        "scenario files using each other:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_check_finds_a_scenario_file_using_another() {
    let files = vec![
        (
            "tests/it/large_blobs.rs".to_string(),
            "use crate::common::*;\nuse crate::serve::{flip_byte, largest_blob};\n".to_string(),
        ),
        (
            "tests/it/common.rs".to_string(),
            "// crate::load in a comment\nfn f() { crate::load::unique_prefix(\"x\"); }"
                .to_string(),
        ),
        (
            "tests/it/serve_proc.rs".to_string(),
            "use crate::{common::Home, fake_registry};\n".to_string(),
        ),
    ];
    let bad = test_violations(&files);
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert!(bad[0].starts_with("tests/it/large_blobs.rs:2: large_blobs uses serve,"));
    assert!(bad[1].starts_with("tests/it/common.rs:2: common uses load,"));
}

// ---------------------------------------------------------------------------------------------
// No cycle between the submodules of a layer's module, no function too long to read

/// The edges between submodules (`bundle::reader` → `bundle::checksums`) that `crate::a::b`
/// and `super::b` paths make, test modules (after `#[cfg(test)]`) left out; a path naming an
/// item rather than a submodule counts as the module (`crate::bundle::Foo` → `bundle`).
fn module_edges(files: &[(String, String)]) -> std::collections::BTreeSet<(String, String)> {
    let modules: std::collections::BTreeSet<Vec<String>> =
        files.iter().filter_map(|(p, _)| module_path(p)).collect();
    let node = |parts: &[String]| -> String {
        let two = &parts[..parts.len().min(2)];
        if modules.contains(two) {
            two.join("::")
        } else {
            parts[0].clone()
        }
    };
    let re = regex::Regex::new(r"\b(crate|super)::([a-z_]+)(?:::([a-z_]+))?").unwrap();
    let mut edges = std::collections::BTreeSet::new();
    for (path, text) in files {
        let Some(me) = module_path(path) else {
            continue;
        };
        let code = blank_comments(text);
        let code = code.split("#[cfg(test)]").next().unwrap_or_default();
        let from = node(&me);
        for c in re.captures_iter(code) {
            let mut target: Vec<String> = if &c[1] == "crate" {
                vec![c[2].to_string()]
            } else {
                // `super::x` from `a::b` (a file) is `a::x`; from `a` (a mod.rs), the crate's `x`.
                let mut base = me[..me.len() - 1].to_vec();
                base.push(c[2].to_string());
                base
            };
            if let Some(m) = c.get(3) {
                target.push(m.as_str().to_string());
            }
            let to = node(&target);
            let related = from == to
                || from.starts_with(&format!("{to}::"))
                || to.starts_with(&format!("{from}::"));
            if !related && modules.contains(&to.split("::").map(str::to_string).collect::<Vec<_>>())
            {
                edges.insert((from.clone(), to));
            }
        }
    }
    edges
}

/// A cycle among `edges`, if there is one: its modules, in order.
fn find_cycle(edges: &std::collections::BTreeSet<(String, String)>) -> Option<Vec<String>> {
    use std::collections::BTreeMap;
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        next.entry(a).or_default().push(b);
    }
    // 0 unseen, 1 on the current path, 2 done.
    let mut state: BTreeMap<&str, u8> = BTreeMap::new();
    fn walk<'a>(
        v: &'a str,
        next: &BTreeMap<&'a str, Vec<&'a str>>,
        state: &mut BTreeMap<&'a str, u8>,
        path: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        state.insert(v, 1);
        path.push(v);
        for &w in next.get(v).map(Vec::as_slice).unwrap_or_default() {
            match state.get(w).copied().unwrap_or(0) {
                1 => {
                    let at = path.iter().position(|p| *p == w).unwrap_or(0);
                    let mut cycle: Vec<String> = path[at..].iter().map(|s| s.to_string()).collect();
                    cycle.push(w.to_string());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = walk(w, next, state, path) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(v, 2);
        None
    }
    let starts: Vec<&str> = next.keys().copied().collect();
    for v in starts {
        if state.get(v).copied().unwrap_or(0) == 0 {
            if let Some(c) = walk(v, &next, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn no_import_cycle_between_modules() {
    let files = all_sources();
    let edges = module_edges(&files);
    assert!(edges.len() > 100, "found the imports: {}", edges.len());
    if let Some(cycle) = find_cycle(&edges) {
        panic!("modules that import each other: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_cycle_check_finds_a_cycle() {
    let f = |p: &str, t: &str| (p.to_string(), t.to_string());
    let files = vec![
        f("src/bundle/mod.rs", "pub mod reader;\npub mod checksums;\n"),
        f("src/bundle/reader.rs", "use super::checksums::Checksums;\n"),
        f(
            "src/bundle/checksums.rs",
            "fn f() { crate::bundle::reader::safe_path(\"x\"); }\n#[cfg(test)]\nuse super::x;",
        ),
        f("src/oci/mod.rs", "pub struct Digest;\n"),
        f("src/store/mod.rs", "use crate::oci::Digest;\n"),
    ];
    let cycle = find_cycle(&module_edges(&files)).expect("the cycle");
    assert_eq!(
        cycle,
        ["bundle::checksums", "bundle::reader", "bundle::checksums"]
    );
    // The use after `#[cfg(test)]` is a test module's: no edge.
    let mut acyclic = files.clone();
    acyclic[2] = f(
        "src/bundle/checksums.rs",
        "fn f() {}\n#[cfg(test)]\nuse crate::bundle::reader::safe_path;",
    );
    assert_eq!(find_cycle(&module_edges(&acyclic)), None);
}

/// Most lines a function of `src/` may have.
const MAX_FUNCTION_LINES: usize = 150;

/// `(lines, "path:line name")` of every function: from its `fn` line to the first line after
/// it that is `}` at the same indentation (rustfmt's layout).
fn function_lengths(files: &[(String, String)]) -> Vec<(usize, String)> {
    let re = regex::Regex::new(
        r"^(\s*)(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)",
    )
    .unwrap();
    let mut out = Vec::new();
    for (path, text) in files {
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let Some(c) = re.captures(l) else { continue };
            let opened = l.matches('{').count();
            if l.trim_end().ends_with(';') || (opened > 0 && opened == l.matches('}').count()) {
                continue; // a declaration in a trait, or a function on one line
            }
            let close = format!("{}}}", &c[1]);
            if let Some(end) = lines[i + 1..].iter().position(|x| *x == close) {
                out.push((end + 2, format!("{path}:{} {}", i + 1, &c[7])));
            }
        }
    }
    out
}

#[test]
fn no_function_longer_than_the_limit() {
    let files = all_sources();
    let lengths = function_lengths(&files);
    assert!(
        lengths.len() > 500,
        "found the functions: {}",
        lengths.len()
    );
    let long: Vec<String> = lengths
        .iter()
        .filter(|(n, _)| *n > MAX_FUNCTION_LINES)
        .map(|(n, f)| format!("{f}: {n} lines"))
        .collect();
    assert!(
        long.is_empty(),
        "functions over {MAX_FUNCTION_LINES} lines (split them):\n{}",
        long.join("\n")
    );
}

#[test]
fn the_length_check_counts_a_function() {
    let body = "    let x = 1;\n".repeat(151);
    let files = vec![(
        "src/x.rs".to_string(),
        format!("pub async fn long() {{\n{body}}}\n\nfn short() {{}}\n    fn inner() {{\n    }}\n"),
    )];
    let lengths = function_lengths(&files);
    assert_eq!(lengths[0], (153, "src/x.rs:1 long".to_string()));
    assert_eq!(lengths[1].1, "src/x.rs:156 inner");
    assert_eq!(
        lengths.len(),
        2,
        "a one-line fn has no closing line of its own"
    );
}
