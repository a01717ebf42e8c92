#!/usr/bin/env bash
# THE test command: installs dependencies, checks formatting and clippy, starts the test environment
# (registries, chart repo, synthetic images), runs the Rust tests against it
# and stops the environment again.
#
#   scripts/test.sh [extra args for cargo nextest run / cargo test]
#
#   KB_KEEP_ENV=1   leave the test environment running afterwards
#   KB_ENV_DIR      state dir of the environment (default <repo>/target/test-env)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
export KB_ENV_DIR="${KB_ENV_DIR:-$REPO_ROOT/target/test-env}"

log() { printf '[test] %s\n' "$*" >&2; }

scripts/install-deps.sh

# The house rules hold before any test runs: formatted, and clippy-clean with warnings as errors.
log "cargo fmt --all -- --check"
cargo fmt --all -- --check || { log "ERROR: cargo fmt would change files: run cargo fmt"; exit 1; }
log "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings || { log "ERROR: clippy found warnings"; exit 1; }

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

rc=0
if cargo nextest --version >/dev/null 2>&1; then
    log "running: cargo nextest run --no-fail-fast $*"
    cargo nextest run --no-fail-fast "$@" || rc=$?
else
    log "cargo-nextest not installed; running: cargo test --no-fail-fast $*"
    cargo test --no-fail-fast "$@" || rc=$?
fi
log "test runner exited with $rc"
exit "$rc"
