#![no_main]
//! The Helm repository index and version constraints on untrusted bytes.
//!
//! Input: `<version spec> NUL <index.yaml>` (no NUL: the whole input is the index and the spec
//! is empty, i.e. `latest`). The spec goes through `VersionSpec::parse`; the index through
//! `RepoIndex::parse`, then `versions` and `resolve` for `koordinator` and the index's first
//! charts, and `resolve_chart_url` for the resolved entry's URLs.
//!
//! Checked on top of "no panic":
//! * `resolve` returns one of `versions(chart)`; `UnknownChart` only for charts not listed;
//! * every listed version that parses as a spec resolves (a version copied from the index must
//!   be usable as `--version`);
//! * `latest` resolves when some listed version is a plain release.

use koord_bundle::chart::{index_url, resolve_chart_url, ChartError, RepoIndex, VersionSpec};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (spec_bytes, index) = match data.iter().position(|&b| b == 0) {
        Some(p) => (&data[..p], &data[p + 1..]),
        None => (&b""[..], data),
    };
    let spec_text = String::from_utf8_lossy(spec_bytes);
    let spec = VersionSpec::parse(&spec_text);
    if let Ok(s) = &spec {
        // Display must not panic; it is what error messages show.
        let _ = s.to_string();
    }
    let _ = index_url(&spec_text);

    let Ok(ix) = RepoIndex::parse(index) else {
        return;
    };
    let _ = ix.skipped();
    let charts: Vec<String> = ix.charts().iter().map(|s| s.to_string()).collect();
    let mut names = vec!["koordinator".to_string()];
    names.extend(charts.iter().take(3).cloned());
    for chart in &names {
        let versions = ix.versions(chart);
        let listed = charts.contains(chart);
        if let Ok(s) = &spec {
            check_resolve(&ix, chart, s, listed, &spec_text);
        }
        check_resolve(
            &ix,
            chart,
            &VersionSpec::Latest,
            listed,
            "https://h/charts/",
        );

        let mut has_release = false;
        for e in versions.iter().take(16) {
            if let Ok(vs) = VersionSpec::parse(&e.version) {
                if let VersionSpec::Exact(v) = &vs {
                    has_release |= v.pre.is_empty();
                }
                if let Err(err) = ix.resolve(chart, &vs) {
                    panic!(
                        "version {:?} is listed for {chart:?} but does not resolve: {err}",
                        e.version
                    );
                }
            }
        }
        if has_release {
            assert!(
                ix.resolve(chart, &VersionSpec::Latest).is_ok(),
                "{chart:?} has a release version but `latest` does not resolve"
            );
        }
    }
});

fn check_resolve(ix: &RepoIndex, chart: &str, spec: &VersionSpec, listed: bool, base: &str) {
    match ix.resolve(chart, spec) {
        Ok(e) => {
            assert!(listed, "resolved an unlisted chart {chart:?}");
            assert!(
                ix.versions(chart).iter().any(|v| std::ptr::eq(*v, e)),
                "resolve returned an entry that versions() does not list"
            );
            for url in e.urls.iter().take(4) {
                for b in [
                    base,
                    "https://koordinator-sh.github.io/charts/",
                    "charts/index.yaml",
                    "/srv/charts",
                ] {
                    let _ = resolve_chart_url(b, url);
                }
            }
        }
        Err(ChartError::UnknownChart { .. }) => {
            assert!(!listed, "chart {chart:?} is listed but UnknownChart");
        }
        Err(ChartError::UnknownVersion { nearest, .. }) => {
            assert!(listed, "UnknownVersion for an unlisted chart {chart:?}");
            assert!(nearest.len() <= 5);
        }
        Err(other) => panic!("unexpected error from resolve: {other:?}"),
    }
}
