#!/usr/bin/env bash
# THE test command: installs dependencies, checks formatting and clippy, starts the test environment
# (registries, chart repo, synthetic images), runs the Rust tests against it
# and stops the environment again.
#
#   scripts/test.sh [extra args for cargo nextest run / cargo test]
#
#   KB_KEEP_ENV=1   leave the test environment running afterwards
#   KB_ENV_DIR      state dir of the environment (default <repo>/target/test-env)
#   KB_TEST_TMPDIR  the tests' temporary directory (TMPDIR; default <repo>/target/test-tmp):
#                   emptied before the run; whatever is left in it after the run is a leak
#                   (listed, removed, and the run fails)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
export KB_ENV_DIR="${KB_ENV_DIR:-$REPO_ROOT/target/test-env}"
KB_TEST_TMPDIR="${KB_TEST_TMPDIR:-$REPO_ROOT/target/test-tmp}"

log() { printf '[test] %s\n' "$*" >&2; }

scripts/install-deps.sh

# The house rules hold before any test runs: formatted, and clippy-clean with warnings as errors.
log "cargo fmt --all -- --check"
cargo fmt --all -- --check || { log "ERROR: cargo fmt would change files: run cargo fmt"; exit 1; }
log "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings || { log "ERROR: clippy found warnings"; exit 1; }
# The fuzz targets (fuzz/, a workspace of its own) are run by scripts/fuzz.sh, not here; but they
# must keep compiling against the library they fuzz (a changed signature broke one unnoticed once).
# Plain `cargo check` needs no sanitizer or nightly flags; about a minute on a fresh machine.
log "cargo check of the fuzz targets"
cargo check --manifest-path fuzz/Cargo.toml --bins --locked \
    || { log "ERROR: the fuzz targets do not build: fix fuzz/fuzz_targets/, or refresh fuzz/Cargo.lock after a dependency change (cargo check --manifest-path fuzz/Cargo.toml)"; exit 1; }

# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
    if [[ "${KB_KEEP_ENV:-0}" == 1 ]]; then
        log "KB_KEEP_ENV=1: leaving the test environment running (scripts/test-env.sh stop)"
    else
        scripts/test-env.sh stop || log "warning: stopping the test environment failed"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

scripts/test-env.sh start

# KB_ENV_JSON (what the Rust tests read) plus the KB_* convenience variables.
# shellcheck source=/dev/null
source "$KB_ENV_DIR/env.sh"
export KB_ENV_JSON="$KB_ENV_DIR/env.json"
[[ -f "$KB_ENV_JSON" ]] || { log "ERROR: $KB_ENV_JSON was not written"; exit 1; }

# Every test removes what it wrote (its homes are tempfile::TempDir, dropped also when it
# fails). The tests and everything they run get a temporary directory of their own, so what a
# run leaves behind is seen here, and never piles up in /tmp.
rm -rf "$KB_TEST_TMPDIR"
mkdir -p "$KB_TEST_TMPDIR"
rc=0
# Tests on the one real API server take its lease in turn (tests/it/cluster.rs): a test thread
# waiting for it does no work. With libtest's default (one thread per core: 2 here) a waiting
# thread halves the run; four threads keep both cores busy while one test holds the cluster.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-4}"
if cargo nextest --version >/dev/null 2>&1; then
    log "running: cargo nextest run --no-fail-fast $*"
    TMPDIR="$KB_TEST_TMPDIR" cargo nextest run --no-fail-fast "$@" || rc=$?
else
    log "cargo-nextest not installed; running: cargo test --no-fail-fast $*"
    TMPDIR="$KB_TEST_TMPDIR" cargo test --no-fail-fast "$@" || rc=$?
fi
log "test runner exited with $rc"
if [[ -n "$(ls -A "$KB_TEST_TMPDIR")" ]]; then
    log "ERROR: the tests left $(du -sh "$KB_TEST_TMPDIR" | cut -f1) in their temporary directory (a test that keeps a file past its end, or a test killed):"
    (cd "$KB_TEST_TMPDIR" && du -sh -- * .[!.]* 2>/dev/null | head -20) >&2 || true
    ((rc == 0)) && rc=1
fi
rm -rf "$KB_TEST_TMPDIR"
exit "$rc"
