#!/usr/bin/env bash
# SIGKILL `build`, `split` (over an earlier set), `repair` and `join` at random moments, and
# check after every kill that the earlier state is still readable and that the next run finishes
# with the bytes of an uninterrupted one. NOT part of the test command: 50 random moments per
# command take half an hour (the test command kills builds at 8 random moments, in
# tests/it/untrusted_files.rs); run it by hand.
#
#   scripts/kill-loop.sh [RUNS_PER_COMMAND] [MIB]      # defaults: 50 runs, a 64 MiB bundle
#
# KB: the koord-bundle binary [default: target/release, else target/debug]. The build loop needs
# the test environment (scripts/test-env.sh start; KB_ENV_DIR, default target/test-env): it
# builds 1.8.0 from its local registry (KB_KILL_BUILD_IMAGE: an image more), and is skipped,
# said, without it. KB_KILL_LOOP: the commands to run [default: "build split repair join"].
# Prints one line per command: runs, kills that landed while it ran, and failures (exit 1 when
# there is one).
set -euo pipefail
RUNS="${1:-50}"
MIB="${2:-64}"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KB="${KB:-}"
if [[ -z "$KB" ]]; then
    for b in "$REPO_ROOT/target/release/koord-bundle" "$REPO_ROOT/target/debug/koord-bundle"; do
        [[ -x "$b" ]] && KB="$b" && break
    done
fi
[[ -x "$KB" ]] || { echo "no koord-bundle binary: cargo build first, or set KB" >&2; exit 2; }
W="$(mktemp -d)"
trap 'rm -rf "$W"' EXIT
export KOORD_BUNDLE_CONFIG_DIR="$W/config" KOORD_BUNDLE_CACHE_DIR="$W/cache"
"$KB" keygen --unencrypted >/dev/null 2>&1
cd "$W"
head -c "$((MIB << 20))" /dev/urandom >b.tar
sum_of() { sha256sum <"$1" | cut -d' ' -f1; }
want="$(sum_of b.tar)"
fails=0
want() { [[ " ${KB_KILL_LOOP:-build split repair join} " == *" $1 "* ]]; }
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
# Seconds an uninterrupted run of "$@" takes (the kills land in 0..that).
timed() { local t0; t0=$(date +%s.%N); "$@" >/dev/null 2>&1 || true; python3 -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" "$t0" "$(date +%s.%N)"; }
# Run "$@", SIGKILL it after a random moment within $1 seconds; "killed" if it was still running.
kill_within() {
    local limit="$1"; shift
    "$@" >/dev/null 2>&1 &
    local pid=$!
    sleep "$(python3 -c "import random; print(random.uniform(0, $limit))")"
    if kill -9 "$pid" 2>/dev/null; then wait "$pid" 2>/dev/null || true; echo killed; else wait "$pid" 2>/dev/null || true; echo finished; fi
}
joined_ok() { # $1: a part; the set joins to the bundle's bytes
    rm -f "$W/j.tar"
    "$KB" join "$1" -o "$W/j.tar" >/dev/null 2>&1 && [[ "$(sum_of "$W/j.tar")" == "$want" ]]
}
sums() { (cd "$1" && sha256sum b.tar.* | sort); }

# --- build: killed at a random moment, then run again, every other time with the same inputs
# (resumes from its .partial) and otherwise with a platform left out (the .partial, made for
# other inputs, is discarded): each time byte for byte the uninterrupted build of those inputs,
# nothing at the output path after a kill, no .partial after a finished build.
ENV_SH="${KB_ENV_DIR:-$REPO_ROOT/target/test-env}/env.sh"
if ! want build; then
    :
elif [[ -f "$ENV_SH" ]]; then
    # shellcheck source=/dev/null
    source "$ENV_SH"
    # An array, not a function: kill_within must SIGKILL koord-bundle itself, not a subshell
    # that runs it (the orphan would go on holding the .partial's lock).
    BLD=("$KB" build 1.8.0 --repo "$KB_HELM_REPO" --source "$KB_PLAIN_REGISTRY" --plain-http
        --helm "$KB_HELM4" --no-cache)
    # KB_KILL_BUILD_IMAGE: one more image (e.g. of scripts/bench's set), so that writing the
    # bundle, not rendering the chart, takes most of a build and most kills land in it.
    [[ -z "${KB_KILL_BUILD_IMAGE:-}" ]] || BLD+=(--image "$KB_KILL_BUILD_IMAGE")
    bld() { "${BLD[@]}" "$@"; }
    bld -o clean.tar >/dev/null 2>&1 || { echo "build failed against $KB_PLAIN_REGISTRY" >&2; exit 2; }
    bld --platform linux/amd64 -o clean-amd64.tar >/dev/null 2>&1
    clean_sum="$(sum_of clean.tar)" amd64_sum="$(sum_of clean-amd64.tar)"
    t=$(timed bld -o t.tar)
    killed=0 discarded=0
    for i in $(seq "$RUNS"); do
        rm -f bb.tar
        [[ "$(kill_within "$t" "${BLD[@]}" -o bb.tar)" == killed ]] && killed=$((killed + 1))
        if [[ -e bb.tar ]] && [[ "$(sum_of bb.tar)" != "$clean_sum" ]]; then fail "build run $i: a partial file at the output path"; fi
        rm -f bb.tar
        if ((i % 2)); then
            bld -o bb.tar >err.txt 2>&1 || fail "build run $i: the resumed build failed: $(tail -n 5 err.txt)"
            [[ -e bb.tar && "$(sum_of bb.tar)" == "$clean_sum" ]] || fail "build run $i: the resumed build differs from a clean one"
        else
            # (an empty .partial, made but killed before its first byte, holds nothing to say)
            had=0; [[ -s .bb.tar.partial ]] && had=1
            bld --platform linux/amd64 -o bb.tar >err.txt 2>&1 || fail "build run $i: the build with other inputs failed: $(tail -n 5 err.txt)"
            [[ -e bb.tar && "$(sum_of bb.tar)" == "$amd64_sum" ]] || fail "build run $i: the build with other inputs differs from a clean one"
            if [[ $had == 1 ]]; then
                grep -q "is not resumed from" err.txt && discarded=$((discarded + 1)) || fail "build run $i: a .partial of other inputs was not said to be discarded"
            fi
        fi
        [[ ! -e .bb.tar.partial ]] || fail "build run $i: the .partial stayed"
    done
    echo "build   $RUNS runs, $killed killed mid-run, $discarded .partial files of other inputs discarded, $fails failures so far"
else
    echo "build   skipped: no test environment at $ENV_SH (scripts/test-env.sh start)"
fi

# --- split over an earlier set (another part size): after a kill, a part of one of the two sets
# joins to the bundle; the next split finishes with the parts of an uninterrupted one.
mkdir -p ref s
"$KB" split b.tar --size 4M --parity 2 --output-dir ref >/dev/null 2>&1
if want split; then
t=$(timed "$KB" split b.tar --size 4M --parity 2 --output-dir ref)
killed=0
for i in $(seq "$RUNS"); do
    rm -rf s && mkdir s
    "$KB" split b.tar --size 6M --parity 2 --output-dir s >/dev/null 2>&1
    [[ "$(kill_within "$t" "$KB" split b.tar --size 4M --parity 2 --output-dir s)" == killed ]] && killed=$((killed + 1))
    ok=0
    for p in s/b.tar.part000 s/.b.tar.part000.prev; do [[ -f "$p" ]] && joined_ok "$p" && ok=1 && break; done
    [[ $ok == 1 ]] || fail "split run $i: no set in the folder joins to the bundle"
    "$KB" split b.tar --size 4M --parity 2 --output-dir s >/dev/null 2>&1 || fail "split run $i: the next split failed"
    [[ "$(sums s | cut -d' ' -f1)" == "$(sums ref | cut -d' ' -f1)" ]] || fail "split run $i: the next split differs from an uninterrupted one"
    [[ -z "$(find s -name '.*' -type f)" ]] || fail "split run $i: hidden files left: $(find s -name '.*' -type f)"
done
echo "split   $RUNS runs, $killed killed mid-run, $fails failures so far"
fi

# --- repair of a set with a part missing and another damaged: after a kill, the set still
# repairs; the next repair writes the parts of the split.
damage() {
    rm -rf r && cp -r ref r && rm r/b.tar.part003
    printf 'X' | dd of=r/b.tar.part005 bs=1 seek=$((1 << 20)) conv=notrunc 2>/dev/null
}
if want repair; then
damage
t=$(timed "$KB" repair r/b.tar.part000)
killed=0
for i in $(seq "$RUNS"); do
    damage
    [[ "$(kill_within "$t" "$KB" repair r/b.tar.part000)" == killed ]] && killed=$((killed + 1))
    "$KB" repair r/b.tar.part000 >/dev/null 2>&1 || fail "repair run $i: the next repair failed"
    [[ "$(sums r)" == "$(sums ref)" ]] || fail "repair run $i: the repaired set differs from the split"
done
echo "repair  $RUNS runs, $killed killed mid-run, $fails failures so far"
fi

# --- join: after a kill nothing is at the output path (or the file there before, whole); the
# next join writes the bundle.
if want join; then
t=$(timed "$KB" join ref/b.tar.part000 -o "$W/t.tar")
killed=0
for i in $(seq "$RUNS"); do
    rm -f out.tar
    [[ "$(kill_within "$t" "$KB" join ref/b.tar.part000 -o "$W/out.tar")" == killed ]] && killed=$((killed + 1))
    if [[ -e out.tar ]] && [[ "$(sum_of out.tar)" != "$want" ]]; then
        fail "join run $i: a partial file at the output path"
    fi
    rm -f out.tar
    "$KB" join ref/b.tar.part000 -o "$W/out.tar" >/dev/null 2>&1 || fail "join run $i: the next join failed"
    [[ "$(sum_of out.tar)" == "$want" ]] || fail "join run $i: the joined bundle differs"
    [[ -z "$(find . -maxdepth 1 -name '.out.tar*')" ]] || fail "join run $i: temporary files left"
done
echo "join    $RUNS runs, $killed killed mid-run, $fails failures so far"
fi
echo "$fails failures in all"
[[ $fails == 0 ]]
