#!/usr/bin/env bash
# THE test command: installs dependencies, checks formatting and clippy, starts the test environment
# (registries, chart repo, synthetic images, a Kubernetes control plane), runs every Rust test
# against it and stops the environment again.
#
#   scripts/test.sh [--quick] [extra args for cargo nextest run]
#
#   --quick         the gate for a change inside one part: fmt, clippy, the unit tests and the
#                   integration tests that need no cluster (registries only, no control plane),
#                   but for the ten slowest (the test group slow of .config/nextest.toml).
#                   The full command (no flag) is the one CI runs.
#   KB_CACHE_DIR    caches kept outside the clone, so that a fresh clone on the same machine
#                   (CI's) starts warm (default ${XDG_CACHE_HOME:-~/.cache}/koord-bundle-dev):
#                     target/  cargo's target directory (unless CARGO_TARGET_DIR is set); it is
#                              emptied when it grows past KB_TARGET_MAX_GB (default 20)
#                     tools/   helm, kubectl, the Python tools, the control plane, cargo-nextest
#                              (<repo>/.tools links to it unless KB_TOOLS is set)
#   KB_KEEP_ENV=1   leave the test environment running afterwards
#   KB_ENV_DIR      state dir of the environment (default <repo>/target/test-env)
#   KB_TEST_TMPDIR  the tests' temporary directory (TMPDIR; default <repo>/target/test-tmp):
#                   emptied before the run; whatever is left in it after the run is a leak
#                   (listed, removed, and the run fails)
#   KB_TEST_THREADS how many tests run at once (default 4; the cluster tests take one of the
#                   environment's control planes each, see .config/nextest.toml)
#
# At the end it prints how long each stage took.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
quick=0
if [[ "${1:-}" == --quick ]]; then
    quick=1
    shift
fi
export KB_ENV_DIR="${KB_ENV_DIR:-$REPO_ROOT/target/test-env}"
KB_TEST_TMPDIR="${KB_TEST_TMPDIR:-$REPO_ROOT/target/test-tmp}"
export KB_CACHE_DIR="${KB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/koord-bundle-dev}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$KB_CACHE_DIR/target}"

log() { printf '[test] %s\n' "$*" >&2; }

# ------------------------------------------------------------------ stage times
STAGES=()
stage_t0=0
stage_name=""
# Microseconds since the epoch (bash 5's EPOCHREALTIME without its point: no bc needed).
now_us() { echo "${EPOCHREALTIME/./}"; }
# secs_since <microseconds>: seconds since then, to a tenth.
secs_since() { local d=$(($(now_us) - $1)); printf '%d.%d' $((d / 1000000)) $((d % 1000000 / 100000)); }
stage() {
    stage_done
    stage_name="$1"
    stage_t0="$(now_us)"
    log "== $1"
}
stage_done() {
    if [[ -n "$stage_name" ]]; then
        STAGES+=("$(printf '%-44s %7s s' "$stage_name" "$(secs_since "$stage_t0")")")
        stage_name=""
    fi
}
run_t0="$(now_us)"
print_stages() {
    stage_done
    ((${#STAGES[@]})) || return 0
    log "stage times:"
    printf '[test]   %s\n' "${STAGES[@]}" >&2
    log "$(printf '%-44s %7s s' total "$(secs_since "$run_t0")")"
}

# ------------------------------------------------------------------ caches
# cargo's target directory outside the clone: the dependencies (most of a build) are compiled
# once per machine, not once per clone; cargo rebuilds this workspace's own crates from their
# sources (a fresh clone's files are newer than anything built). One run at a time uses it: a
# second run waits here (the test environment's ports are one run's anyway).
mkdir -p "$CARGO_TARGET_DIR"
exec 8>"$CARGO_TARGET_DIR/.koord-bundle-test.lock"
if ! flock -n 8; then
    log "another scripts/test.sh uses $CARGO_TARGET_DIR: waiting for it (or set CARGO_TARGET_DIR)"
    flock 8
fi
target_kb=$(du -sk "$CARGO_TARGET_DIR" 2>/dev/null | cut -f1 || echo 0)
if ((target_kb > ${KB_TARGET_MAX_GB:-20} * 1024 * 1024)); then
    log "$CARGO_TARGET_DIR holds $((target_kb / 1024 / 1024)) GiB (> KB_TARGET_MAX_GB=${KB_TARGET_MAX_GB:-20}): emptying it"
    find "$CARGO_TARGET_DIR" -mindepth 1 -maxdepth 1 ! -name .koord-bundle-test.lock -exec rm -rf {} +
fi
# The tools live beside it; .tools in the clone is a link there (unless KB_TOOLS says otherwise).
if [[ -z "${KB_TOOLS:-}" && ! -e "$REPO_ROOT/.tools" && ! -L "$REPO_ROOT/.tools" ]]; then
    mkdir -p "$KB_CACHE_DIR/tools"
    ln -s "$KB_CACHE_DIR/tools" "$REPO_ROOT/.tools"
fi

trap print_stages EXIT

stage "install-deps (apt, npm, PyPI, nextest)"
scripts/install-deps.sh
export PATH="$("$REPO_ROOT/scripts/install-deps.sh" --nextest-dir):$PATH"

# The house rules hold before any test runs: formatted, and clippy-clean with warnings as errors.
stage "cargo fmt --check"
cargo fmt --all -- --check || { log "ERROR: cargo fmt would change files: run cargo fmt"; exit 1; }

# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
    local rc=$?
    if [[ -n "${env_pid:-}" ]]; then
        kill "$env_pid" 2>/dev/null || true
        wait "$env_pid" 2>/dev/null || true
    fi
    if [[ "${KB_KEEP_ENV:-0}" == 1 ]]; then
        log "KB_KEEP_ENV=1: leaving the test environment running (scripts/test-env.sh stop)"
    else
        scripts/test-env.sh stop || log "warning: stopping the test environment failed"
    fi
    print_stages
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The environment starts in the background while cargo builds: starting registries, pushing the
# synthetic images and the control plane mostly wait, and cargo keeps both cores busy meanwhile.
# --quick starts no control plane (KB_NO_CLUSTER=1): its tests touch no cluster.
env_log="$KB_ENV_DIR.start.log"
mkdir -p "$(dirname "$env_log")"
if ((quick)); then
    KB_NO_CLUSTER=1 scripts/test-env.sh start >"$env_log" 2>&1 &
else
    scripts/test-env.sh start >"$env_log" 2>&1 &
fi
env_pid=$!

# --workspace: every crate of the workspace (crates/*), not only the root one; without it a
# test moved into a crate would silently stop being built and run.
stage "cargo clippy --workspace --all-targets"
cargo clippy --workspace --all-targets -- -D warnings || { log "ERROR: clippy found warnings"; exit 1; }
# The fuzz targets (fuzz/, a workspace of its own) are run by scripts/fuzz.sh, not here; but they
# must keep compiling against the library they fuzz (a changed signature broke one unnoticed once).
# Plain `cargo check` needs no sanitizer or nightly flags; it shares the target directory, so the
# dependencies clippy checked are not checked again.
if ((!quick)); then
    stage "cargo check of the fuzz targets"
    cargo check --manifest-path fuzz/Cargo.toml --bins --locked \
        || { log "ERROR: the fuzz targets do not build: fix fuzz/fuzz_targets/, or refresh fuzz/Cargo.lock after a dependency change (cargo check --manifest-path fuzz/Cargo.toml)"; exit 1; }
fi

# The library crates of crates/ are read by others too: their docs build without a warning, and
# the examples in them (koord-splitset's README) run. nextest runs no doctests.
if ((!quick)); then
    stage "docs and doctests of the library crates"
    RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p koord-base -p koord-splitset -p koord-store -p koord-kube --quiet \
        || { log "ERROR: the library crates' docs have warnings"; exit 1; }
    cargo test --doc -p koord-base -p koord-splitset -p koord-store -p koord-kube --quiet \
        || { log "ERROR: a doctest of the library crates failed"; exit 1; }
fi

stage "build the tests"
cargo nextest run --workspace --no-run --cargo-quiet

stage "test environment (started in the background)"
if ! wait "$env_pid"; then
    env_pid=""
    cat "$env_log" >&2
    log "ERROR: scripts/test-env.sh start failed (its log is above)"
    exit 1
fi
env_pid=""
sed 's/^/[test-env log] /' "$env_log" | tail -n 3 >&2

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
# nextest runs each test in a process of its own, KB_TEST_THREADS at a time; the tests that
# lease a control plane are a test group as large as the environment's pool of control planes
# (.config/nextest.toml), so no test slot waits on a cluster lock while other tests could run.
args=(--profile default)
# --quick: no test that leases a control plane, nor the one that only needs its address, nor
# the slow ones (the group slow of .config/nextest.toml).
((quick)) && args=(--profile quick -E 'not group(cluster) & not group(slow) & not test(=kube_hostile::an_exec_plugin_that_prints_forever)')
stage "run the tests (nextest ${args[*]})"
log "running: cargo nextest run --workspace ${args[*]} --no-fail-fast $*"
TMPDIR="$KB_TEST_TMPDIR" cargo nextest run --workspace --cargo-quiet "${args[@]}" \
    --test-threads "${KB_TEST_THREADS:-4}" --no-fail-fast "$@" || rc=$?
log "test runner exited with $rc"
if [[ -n "$(ls -A "$KB_TEST_TMPDIR")" ]]; then
    log "ERROR: the tests left $(du -sh "$KB_TEST_TMPDIR" | cut -f1) in their temporary directory (a test that keeps a file past its end, or a test killed):"
    (cd "$KB_TEST_TMPDIR" && du -sh -- * .[!.]* 2>/dev/null | head -20) >&2 || true
    ((rc == 0)) && rc=1
fi
rm -rf "$KB_TEST_TMPDIR"
exit "$rc"
