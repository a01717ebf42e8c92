#!/bin/sh
# Reproduce every measurement of README.md (release build, median of $RUNS runs, default 5),
# or only the cases given as arguments: ./run.sh real bomb bomb:values unit
#
# Builds in $CARGO_TARGET_DIR (default ${TMPDIR:-/tmp}/yaml-budgets-target) and extracts the
# repository's chart fixtures into its data/ directory: nothing is written into the repository
# (the build is --locked, so a stale Cargo.lock is an error, never rewritten here).
set -e
here=$(cd "$(dirname "$0")" && pwd)
fixtures="$here/../../tests/fixtures/charts"
target="${CARGO_TARGET_DIR:-${TMPDIR:-/tmp}/yaml-budgets-target}"
mkdir -p "$target"
target=$(cd "$target" && pwd)
export CARGO_TARGET_DIR="$target"

data="$target/data"
rm -rf "$data"
mkdir -p "$data"
tar -xzf "$fixtures/koordinator-1.8.0.tgz" -C "$data"
cp "$fixtures/index.upstream.yaml" "$data/"
export YAML_BUDGETS_DATA="$data"

(cd "$here" && nice -n 19 cargo build --release --offline --locked)
B="nice -n 19 timeout 900 $target/release/yaml-budgets"

one() {
  label="$1"
  if [ -n "${SAPHYR_TIGHT+set}" ]; then label="SAPHYR_TIGHT=$SAPHYR_TIGHT $1"; fi
  if [ "$1" = bomb:index ]; then
    # serde-saphyr replays this bomb up to INDEX's 50 M nodes (~12 GB): capped at 4 GB.
    echo "=== $label (capped at 4 GB of address space)"
    (ulimit -v 4000000; RUST_BACKTRACE=0 /usr/bin/time -f '(%e s wall, %M KB max RSS, exit %x)' $B "$1" 2>&1 | grep -v "^ *[0-9]*: \|^ *at \|^note:") || true
  else
    echo "=== $label"
    /usr/bin/time -f '(%e s wall, %M KB max RSS)' $B "$1"
  fi
}

if [ $# -gt 0 ]; then
  for c in "$@"; do one "$c"; done
  exit 0
fi
for c in tagjson real index values200k stream stream20 flow300k quote block10k blockmap bomb bomb:chart bomb:values bomb:manifests unit probes flatkeys:100000 flowdense:2:98 bomb:index; do
  one "$c"
done
# serde-saphyr with alias replays capped at 100 000 events whatever the Limits (src/saphyr.rs).
for c in bomb:values bomb:manifests bomb:index; do (SAPHYR_TIGHT=1; export SAPHYR_TIGHT; one "$c"); done
for c in values2m flowdense:16:98; do one "$c"; done
