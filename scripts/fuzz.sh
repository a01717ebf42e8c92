#!/usr/bin/env bash
# Fuzz koord-bundle's parsers of untrusted input for a bounded time. NOT part of the test
# command (scripts/test.sh): run it by hand or from a scheduled job.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# SECONDS_PER_TARGET defaults to 60. TARGET defaults to all of them (fuzz/fuzz_targets/*.rs):
#   bundle_reader  verify_from / verify / read_head, Checksums::parse, koord-bundle.json
#   split_header   BundleFile::open of a split bundle's parts, reader, check_parts, join
#   helm_index     RepoIndex::parse, versions, resolve with VersionSpec::parse
#   chart_archive  ChartArchive::from_tgz, extract_crds, images_from_rendered
#   yaml_sources   YAML from every source (--values, index.yaml, kubeconfig, rendered
#                  manifests, Chart.yaml, values.yaml, CRDs, helm's output named after a
#                  chart's components)
#   registry_auth  the registry client's reading of WWW-Authenticate challenges and scopes,
#                  token service answers, Retry-After and error bodies (1 MiB heads included)
#   graph_walk     copy::resolve / totals / the bundle layout / a dry-run transfer over an
#                  in-memory store answering hostile graphs (cycles by digest, fan-out, deep
#                  nesting, sizes that wrap)
#
# Exit status: 0 when every target ran its time without a finding; 1 when one crashed (the
# crash input's path is printed: fuzz/artifacts/<target>/crash-*, leak-*, timeout-*, oom-*);
# 2 on a setup or build failure.
#
# How it runs on stable Rust (verified with rustc 1.95.0 stable and cargo-fuzz 0.13.2):
# * cargo-fuzz passes nightly-only flags (-Zsanitizer=..., -Cpasses=sancov-module, ...).
#   RUSTC_BOOTSTRAP=1 makes the stable compiler accept them; no nightly toolchain is needed.
# * AddressSanitizer works on stable: rustup's stable rust-std ships librustc-stable_rt.asan.a.
#   If it ever does not (another target triple), use KB_FUZZ_SANITIZER=none.
# * Built with debug assertions (-a), so integer overflow panics as in a debug build.
# * cargo-fuzz is installed with `cargo install cargo-fuzz --locked` when missing (a few
#   minutes). The first build of the fuzz crate compiles the whole dependency tree with
#   instrumentation (about 10 minutes on 2 cores); later builds are incremental.
# * fuzz/ is a crate with a workspace of its own: the main build and tests never see it.
# * LeakSanitizer runs too. fuzz/lsan.supp suppresses two false positives, both races with the
#   detached read-ahead thread that `reader::open_file` spawns (see the file).
#
# Seeds: fuzz/seeds/gen_seeds.py writes them to fuzz/seed-corpus/<target>/ on every run (the
# chart fixtures and repository indexes come from tests/fixtures/charts). What the fuzzer finds
# accumulates in fuzz/corpus/<target>/. Logs go to fuzz/logs/<target>.log. All three are
# git-ignored.
#
# Environment:
#   KB_FUZZ_SANITIZER  address (default) or none
#   KB_FUZZ_RSS_MB     libFuzzer -rss_limit_mb (default 2048)
#   KB_FUZZ_TIMEOUT    seconds one input may take before it counts as a hang (default 30)
#   KB_FUZZ_ARGS       more libFuzzer arguments (e.g. "-seed=1 -only_ascii=1")
#
# A crash input becomes a regression test: copy it to fuzz/regressions/<target>-<short>.bin
# and add a test to tests/it/fuzz_regressions.rs. Reproduce one with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run -a <target> fuzz/artifacts/<target>/crash-...
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

log() { printf '[fuzz] %s\n' "$*" >&2; }

SECS="${1:-60}"
[[ $# -gt 0 ]] && shift
if ! [[ "$SECS" =~ ^[0-9]+$ ]] || [[ "$SECS" -eq 0 ]]; then
    log "usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]"
    exit 2
fi
if [[ $# -gt 0 ]]; then
    TARGETS=("$@")
else
    TARGETS=(bundle_reader bundle_diff split_header helm_index chart_archive yaml_sources registry_auth graph_walk)
fi

SANITIZER="${KB_FUZZ_SANITIZER:-address}"
RSS_MB="${KB_FUZZ_RSS_MB:-2048}"
TIMEOUT="${KB_FUZZ_TIMEOUT:-30}"
export RUSTC_BOOTSTRAP=1
export LSAN_OPTIONS="suppressions=$REPO_ROOT/fuzz/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"

# Largest input per target: room above the largest seed.
max_len() {
    case "$1" in
        bundle_reader) echo 65536 ;;
        helm_index) echo 65536 ;;
        chart_archive) echo 262144 ;;
        yaml_sources) echo 131072 ;;
        registry_auth) echo 1100000 ;;
        *) echo 65536 ;;
    esac
}

if ! cargo fuzz --version >/dev/null 2>&1; then
    log "cargo-fuzz not found: cargo install cargo-fuzz --locked"
    cargo install cargo-fuzz --locked || { log "ERROR: installing cargo-fuzz failed"; exit 2; }
fi
log "$(cargo fuzz --version), $(rustc --version), sanitizer: $SANITIZER"

command -v python3 >/dev/null || { log "ERROR: python3 is needed for the seed generator"; exit 2; }
rm -rf fuzz/seed-corpus
python3 fuzz/seeds/gen_seeds.py fuzz/seed-corpus "$REPO_ROOT" || { log "ERROR: seed generation failed"; exit 2; }
mkdir -p fuzz/logs

log "building the fuzz targets (first build: several minutes)"
cargo fuzz build -a --sanitizer "$SANITIZER" || { log "ERROR: cargo fuzz build failed"; exit 2; }

failed=()
for t in "${TARGETS[@]}"; do
    mkdir -p "fuzz/corpus/$t" "fuzz/seed-corpus/$t"
    logf="fuzz/logs/$t.log"
    log "running $t for ${SECS}s (log: $logf)"
    rc=0
    # shellcheck disable=SC2086  # KB_FUZZ_ARGS is a list of arguments
    cargo fuzz run -a --sanitizer "$SANITIZER" "$t" "fuzz/corpus/$t" "fuzz/seed-corpus/$t" -- \
        -max_total_time="$SECS" -rss_limit_mb="$RSS_MB" -timeout="$TIMEOUT" \
        -max_len="$(max_len "$t")" -print_final_stats=1 ${KB_FUZZ_ARGS:-} >"$logf" 2>&1 || rc=$?
    # The last status line (cov/ft/corp/exec/s) and the totals.
    grep -E '^#[0-9]+' "$logf" | tail -n 1 >&2 || true
    grep -E 'stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$logf" >&2 || true
    if [[ $rc -ne 0 ]]; then
        artifact="$(grep -oE "(Test unit written to|artifact_prefix.*; Test unit written to) [^ ]+" "$logf" | awk '{print $NF}' | tail -n 1)"
        log "FAILED: $t (exit $rc): ${artifact:-no artifact written, see $logf}"
        grep -E 'panicked at|ERROR: (AddressSanitizer|libFuzzer)|SUMMARY' "$logf" | head -n 5 >&2 || true
        failed+=("$t")
    else
        log "ok: $t"
    fi
done

if [[ ${#failed[@]} -gt 0 ]]; then
    log "targets with findings: ${failed[*]}"
    exit 1
fi
log "no findings"
