#!/usr/bin/env bash
# Builds the peer tools that `scripts/bench --peers` measures next to koord-bundle, with this
# machine's `go`, from the Go module proxy (GOPROXY), versions pinned below. Each build is cached
# in target/peers/<name>-<version>/ (the binary, build.log, build-seconds); a build that fails
# leaves target/peers/<name>-<version>/FAILED with the reason, and is retried on the next call.
#
#   scripts/peers/build.sh [crane] [regctl] [zarf] [hauler]     # default: all four
#
# Builds run at nice 15 with one package compiled at a time (GOFLAGS=-p=1): gentle on a shared
# machine, slow the first time (Zarf: minutes), instant afterwards.
#
# Zarf's go.mod has replace directives, so `go install zarf@version` refuses it: its module is
# downloaded (go mod download) and built in a copy under target/peers/src/ with -mod=mod.
# Hauler (module hauler.dev/go/hauler/v2): if the proxy does not serve the pinned version, the
# source may be given as a directory in KB_PEER_HAULER_SRC (a checkout of the tag); its
# dependencies still come from the proxy. Without either, Hauler is reported as not built.
#
# Prints one line per tool: NAME<TAB>VERSION<TAB>PATH-or-FAILED<TAB>build seconds or reason.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PEERS="${KB_PEERS_DIR:-$REPO_ROOT/target/peers}"

CRANE_MODULE=github.com/google/go-containerregistry
CRANE_VERSION=v0.22.1
REGCTL_MODULE=github.com/regclient/regclient
REGCTL_VERSION=v0.11.7
ZARF_MODULE=github.com/zarf-dev/zarf
ZARF_VERSION=v0.84.0
HAULER_MODULE=hauler.dev/go/hauler/v2
HAULER_VERSION=v2.0.3

export CGO_ENABLED=0
export GOFLAGS="${KB_PEER_GOFLAGS:--p=1 -buildvcs=false}"
export GOTOOLCHAIN=local
NICE=(nice -n 15)

command -v go >/dev/null || { echo "scripts/peers/build.sh: go not found" >&2; exit 1; }
mkdir -p "$PEERS"

# done_or_build NAME VERSION BIN FUNCTION: runs FUNCTION DIR unless DIR/BIN already runs.
done_or_build() {
    local name=$1 ver=$2 bin=$3 fn=$4 dir="$PEERS/$1-$2" t0 rc
    if [[ -x "$dir/$bin" ]] && "$dir/$bin" version >/dev/null 2>&1; then
        printf '%s\t%s\t%s\t%s\n' "$name" "$ver" "$dir/$bin" "cached (built in $(cat "$dir/build-seconds" 2>/dev/null || echo '?') s)"
        return 0
    fi
    rm -rf "$dir"; mkdir -p "$dir"
    t0=$(date +%s)
    rc=0
    "$fn" "$dir" >"$dir/build.log" 2>&1 || rc=$?
    if ((rc == 0)) && [[ -x "$dir/$bin" ]]; then
        echo $(( $(date +%s) - t0 )) >"$dir/build-seconds"
        printf '%s\t%s\t%s\t%s\n' "$name" "$ver" "$dir/$bin" "built in $(cat "$dir/build-seconds") s"
    else
        { echo "exit $rc after $(( $(date +%s) - t0 )) s"; tail -n 5 "$dir/build.log"; } >"$dir/FAILED"
        printf '%s\t%s\t%s\t%s\n' "$name" "$ver" FAILED "$(tail -n 1 "$dir/build.log" | cut -c1-300)"
        return 1
    fi
}

b_crane() { GOBIN="$1" "${NICE[@]}" go install -ldflags "-s -w -X $CRANE_MODULE/cmd/crane/cmd.Version=$CRANE_VERSION" \
    "$CRANE_MODULE/cmd/crane@$CRANE_VERSION"; }
b_regctl() { GOBIN="$1" "${NICE[@]}" go install -ldflags "-s -w -X $REGCTL_MODULE/internal/version.vcsTag=$REGCTL_VERSION" \
    "$REGCTL_MODULE/cmd/regctl@$REGCTL_VERSION"; }
# src_copy MODULE VERSION DEST: the module's source from the proxy, writable, in DEST
src_copy() {
    local d
    d="$(go mod download -json "$1@$2" | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j.get("Dir","")) if not j.get("Error") else sys.exit(j["Error"])')"
    rm -rf "$3"; mkdir -p "$(dirname "$3")"; cp -r "$d" "$3"; chmod -R u+w "$3"
}
b_zarf() {
    local src="$PEERS/src/zarf-$ZARF_VERSION"
    src_copy "$ZARF_MODULE" "$ZARF_VERSION" "$src"
    (cd "$src" && "${NICE[@]}" go build -mod=mod -trimpath \
        -ldflags "-s -w -X $ZARF_MODULE/src/config.CLIVersion=$ZARF_VERSION" -o "$1/zarf" .)
}
b_hauler() {
    local src="$PEERS/src/hauler-$HAULER_VERSION"
    if ! src_copy "$HAULER_MODULE" "$HAULER_VERSION" "$src"; then
        [[ -n "${KB_PEER_HAULER_SRC:-}" && -f "$KB_PEER_HAULER_SRC/go.mod" ]] || {
            echo "the Go module proxy does not serve $HAULER_MODULE@$HAULER_VERSION, and KB_PEER_HAULER_SRC names no checkout"
            return 1
        }
        grep -q "^module $HAULER_MODULE\$" "$KB_PEER_HAULER_SRC/go.mod" || { echo "KB_PEER_HAULER_SRC is not $HAULER_MODULE"; return 1; }
        echo "building from KB_PEER_HAULER_SRC=$KB_PEER_HAULER_SRC (dependencies from the proxy)"
        rm -rf "$src"; mkdir -p "$(dirname "$src")"; cp -r "$KB_PEER_HAULER_SRC" "$src"; chmod -R u+w "$src"
    fi
    (cd "$src" && "${NICE[@]}" go build -mod=mod -trimpath \
        -ldflags "-s -w -X $HAULER_MODULE/internal/version.gitVersion=$HAULER_VERSION" -o "$1/hauler" ./cmd/hauler)
}

want=("$@")
((${#want[@]})) || want=(crane regctl zarf hauler)
rc=0
for w in "${want[@]}"; do
    case "$w" in
        crane) done_or_build crane "$CRANE_VERSION" crane b_crane || rc=1 ;;
        regctl) done_or_build regctl "$REGCTL_VERSION" regctl b_regctl || rc=1 ;;
        zarf) done_or_build zarf "$ZARF_VERSION" zarf b_zarf || rc=1 ;;
        hauler) done_or_build hauler "$HAULER_VERSION" hauler b_hauler || rc=1 ;;
        *) echo "scripts/peers/build.sh: unknown tool $w" >&2; exit 2 ;;
    esac
done
exit "$rc"
