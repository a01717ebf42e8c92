//! Every error type says its exit class beside its definition, and its crate's `class_of`
//! names it, so that `cmd::exit_code` finds it in a chain (`koord_base::exit`); the README's
//! exit-code table says what `ExitClass` says. A type missing from both would fall to exit 1,
//! as 18 of them did while one function downcast each by hand.

use crate::common::{all_sources, module_path};
use koord_bundle::exit::{ExitClass, EXIT_OK, EXIT_USAGE};
use std::path::Path;

/// Each error type of `files`: (its file, its name). An error type derives `thiserror::Error`
/// or implements `std::error::Error` by hand; test modules (after `#[cfg(test)]`) are left out.
fn error_types(files: &[(String, String)]) -> Vec<(String, String)> {
    let derive = regex::Regex::new(r"#\[derive\([^)]*\bError\b[^)]*\)\]").unwrap();
    let item = regex::Regex::new(r"(?m)^\s*pub(?:\([a-z]+\))?\s+(?:enum|struct)\s+(\w+)").unwrap();
    let by_hand = regex::Regex::new(r"impl\s+(?:std::error::)?Error\s+for\s+(\w+)").unwrap();
    let mut out = Vec::new();
    for (path, text) in files {
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for d in derive.find_iter(code) {
            // The item the derive is on: the first `pub enum|struct` after it.
            if let Some(c) = item.captures(&code[d.end()..]) {
                out.push((path.clone(), c[1].to_string()));
            }
        }
        for c in by_hand.captures_iter(code) {
            out.push((path.clone(), c[1].to_string()));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The crate a source file is of: `crates/NAME` or the root (``).
fn crate_of(path: &str) -> &str {
    match path.strip_prefix("crates/") {
        Some(rest) => &path[..path.len() - rest.len() + rest.find('/').unwrap_or(rest.len())],
        None => "",
    }
}

/// The paths a crate's `class_of` lists (`crate::bundle::pack::PackError`), and the files of
/// the crate that call `exit_classes!`.
fn listed(files: &[(String, String)], krate: &str) -> (Vec<String>, Vec<String>) {
    let (mut out, mut lists) = (Vec::new(), Vec::new());
    for (path, text) in files {
        if crate_of(path) != krate {
            continue;
        }
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let mut rest = code;
        if rest.contains("exit_classes!(") {
            lists.push(path.clone());
        }
        while let Some(at) = rest.find("exit_classes!(") {
            rest = &rest[at..];
            let end = rest.find(')').unwrap_or(rest.len());
            let body = rest[..end].split_once(';').map_or("", |(_, b)| b);
            out.extend(
                body.split(',')
                    .map(|t| t.split_whitespace().collect::<String>())
                    .filter(|t| !t.is_empty()),
            );
            rest = &rest[end..];
        }
    }
    (out, lists)
}

/// What is wrong with the error types of `files`: each that has no `Classify` in the file
/// that defines it, or that its crate's `class_of` does not name (by `crate::` and a path to
/// its module, or to a module above it that re-exports it).
fn unclassified(files: &[(String, String)]) -> Vec<String> {
    let mut problems = Vec::new();
    for (path, name) in error_types(files) {
        let text = &files.iter().find(|(p, _)| *p == path).unwrap().1;
        let implemented = regex::Regex::new(&format!(r"impl\s+[\w:]*Classify\s+for\s+{name}\b"))
            .unwrap()
            .is_match(text);
        if !implemented {
            problems.push(format!(
                "{path}: {name} does not implement koord_base::exit::Classify beside its definition"
            ));
        }
        let module = module_path(&path).unwrap_or_default();
        let (entries, lists) = listed(files, crate_of(&path));
        let named = entries.iter().any(|entry| {
            let Some(inside) = entry.strip_prefix("crate::") else {
                return false;
            };
            let mut segments: Vec<&str> = inside.split("::").collect();
            segments.pop() == Some(name.as_str())
                && segments.len() <= module.len()
                && segments.iter().zip(&module).all(|(a, b)| a == b)
        });
        if !named {
            problems.push(format!(
                "{path}: {name} is not in its crate's class_of list (exit_classes! in {})",
                lists.join(", ")
            ));
        }
    }
    problems
}

#[test]
fn every_error_type_says_its_exit_class_and_is_listed() {
    let files = all_sources();
    let types = error_types(&files);
    // Each crate has error types, the root most of them: a finder that found none is broken.
    assert!(types.len() >= 40, "found only {types:?}");
    let problems = unclassified(&files);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_check_finds_a_type_without_its_class_or_off_the_list() {
    // `CRATE::` for `crate::`: the paths of a made-up crate, not uses of this crate's modules
    // (which tests/it/layers.rs would hold against the layers).
    let file = |p: &str, t: &str| (p.to_string(), t.replace("CRATE::", "crate::"));
    let lib = file(
        "crates/koord-x/src/lib.rs",
        "pub fn class_of(e: &E) -> X {\n    koord_base::exit_classes!(e;\n        CRATE::a::Listed,\n        CRATE::a::b::Deep,\n    )\n}\n",
    );
    let a = file(
        "crates/koord-x/src/a/mod.rs",
        "#[derive(Debug, thiserror::Error)]\n#[error(\"x\")]\npub struct Listed;\nimpl koord_base::exit::Classify for Listed {}\n\
         #[derive(Debug, thiserror::Error)]\npub enum Bare { A }\n\
         #[derive(Debug)]\npub struct Hand;\nimpl std::error::Error for Hand {}\nimpl CRATE::exit::Classify for Hand {}\n\
         #[cfg(test)]\nmod tests {\n#[derive(Debug, thiserror::Error)]\npub struct InTest;\n}\n",
    );
    // Listed by a path below its own module: not where it is.
    let other = file(
        "crates/koord-x/src/c.rs",
        "#[derive(Debug, thiserror::Error)]\npub struct Deep;\nimpl Classify for Deep {}\n",
    );
    let problems = unclassified(&[lib, a, other]);
    assert_eq!(
        problems,
        [
            "crates/koord-x/src/a/mod.rs: Bare does not implement koord_base::exit::Classify beside its definition",
            "crates/koord-x/src/a/mod.rs: Bare is not in its crate's class_of list (exit_classes! in crates/koord-x/src/lib.rs)",
            "crates/koord-x/src/a/mod.rs: Hand is not in its crate's class_of list (exit_classes! in crates/koord-x/src/lib.rs)",
            "crates/koord-x/src/c.rs: Deep is not in its crate's class_of list (exit_classes! in crates/koord-x/src/lib.rs)",
        ]
    );
}

/// The rows of the README's "Exit codes" table: (code column, meaning, what to do).
fn readme_rows() -> Vec<(String, String, String)> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let section = readme
        .split("\n## Exit codes\n")
        .nth(1)
        .expect("README has an \"## Exit codes\" section");
    let section = section.split("\n## ").next().unwrap();
    section
        .lines()
        .skip_while(|l| !l.starts_with("| code |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l
                .trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            (
                cells[0].to_string(),
                cells[1].to_string(),
                cells.last().unwrap().to_string(),
            )
        })
        .collect()
}

/// The README's table has a row per class, with the class's code, meaning and what to do,
/// besides success (0) and clap's usage error (2), and no other row.
#[test]
fn the_readme_exit_code_table_is_the_classes() {
    let rows = readme_rows();
    let mut expected = vec![EXIT_OK.to_string(), EXIT_USAGE.to_string()];
    for class in ExitClass::ALL {
        let row = rows
            .iter()
            .find(|(code, _, _)| *code == class.codes_text())
            .unwrap_or_else(|| panic!("README: no row for exit code {}", class.codes_text()));
        assert_eq!(row.1, class.meaning(), "README: the meaning of {}", row.0);
        assert_eq!(
            row.2,
            class.what_to_do(),
            "README: what to do for {}",
            row.0
        );
        expected.push(class.codes_text());
    }
    let mut codes: Vec<String> = rows.into_iter().map(|r| r.0).collect();
    codes.sort();
    expected.sort();
    assert_eq!(codes, expected, "README: the rows of the exit-code table");
}
