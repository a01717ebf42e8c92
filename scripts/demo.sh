#!/usr/bin/env bash
# The whole koord-bundle story offline, against local services on 127.0.0.1:
#   build (from a local "upstream" registry and Helm repository) → verify (with koord-bundle,
#   and with minisign + sha256sum) → load into a private TLS registry with basic auth → check it
#   with skopeo and helm → install with real helm 4 into a FAKE Kubernetes API server.
# No internet and no Kubernetes cluster are needed. The API server of the last step is
# tests/kube-fake/fake_apiserver.py, a Python stand-in: it stores what helm writes, strict where
# a real one is, but it is not Kubernetes: no controller runs, no pod ever starts.
#
#   scripts/demo.sh          # KB_KEEP_ENV=1 leaves the registries running afterwards
#
# Ports: as scripts/test-env.sh (KB_PLAIN_PORT, KB_TLS_PORT, KB_HELM_PORT, ...).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
export KB_ENV_DIR="${KB_ENV_DIR:-$REPO_ROOT/target/test-env}"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
FAKE_PID=""
cleanup() {
    [[ -n "$FAKE_PID" ]] && kill "$FAKE_PID" 2>/dev/null
    if [[ "${KB_KEEP_ENV:-0}" != 1 ]]; then "$REPO_ROOT/scripts/test-env.sh" stop; fi
}

step "installing the peers (docker-registry, skopeo, minisign, helm) if missing"
scripts/install-deps.sh
step "starting local registries (plain 'upstream' and TLS+auth 'private') and a Helm repository"
scripts/test-env.sh start
trap cleanup EXIT
# shellcheck source=/dev/null
source "$KB_ENV_DIR/env.sh"

step "building koord-bundle"
cargo build --quiet
KB="$REPO_ROOT/target/debug/koord-bundle"
WORK="$(mktemp -d)"
export KOORD_BUNDLE_CONFIG_DIR="$WORK/config" KOORD_BUNDLE_CACHE_DIR="$WORK/cache"
cd "$WORK"

step "connected side: a signing key, then the bundle of Koordinator 1.8.0"
"$KB" keygen --unencrypted
"$KB" build 1.8.0 --repo "$KB_HELM_REPO" --source "$KB_PLAIN_REGISTRY" --plain-http --helm "$KB_HELM4"
"$KB" inspect koordinator-1.8.0.tar

step "the sneakernet: only the bundle and the public key cross"
mkdir inside && cp koordinator-1.8.0.tar "$KOORD_BUNDLE_CONFIG_DIR/koord-bundle.pub" inside/
cd inside

step "air-gapped side: verify with koord-bundle, and with standard tools"
"$KB" verify koordinator-1.8.0.tar --key koord-bundle.pub
mkdir x && tar xf koordinator-1.8.0.tar -C x && cp koord-bundle.pub x/
(cd x && minisign -Vm SHA256SUMS -p koord-bundle.pub && sha256sum -c --quiet SHA256SUMS && echo "sha256sum: every file OK")
skopeo inspect --raw oci-archive:koordinator-1.8.0.tar:koordinator-sh/koordlet:v1.8.0 | head -c 200; echo

step "air-gapped side: load into the private registry (TLS + basic auth) under a prefix"
printf '%s\n' "$KB_REGISTRY_PASSWORD" | "$KB" load --registry "$KB_TLS_REGISTRY/koordinator" --key koord-bundle.pub \
    --ca-file "$KB_CA_FILE" --username "$KB_REGISTRY_USER" --password-stdin --no-install
step "re-load: everything is already there"
printf '%s\n' "$KB_REGISTRY_PASSWORD" | "$KB" load --registry "$KB_TLS_REGISTRY/koordinator" --key koord-bundle.pub \
    --ca-file "$KB_CA_FILE" --username "$KB_REGISTRY_USER" --password-stdin --no-install

step "check the private registry with skopeo and helm 4 (helm 3 speaks plain HTTP to loopback registries)"
skopeo inspect --cert-dir "$KB_CA_DIR" --creds "$KB_REGISTRY_USER:$KB_REGISTRY_PASSWORD" \
    "docker://$KB_TLS_REGISTRY/koordinator/koordinator-sh/koord-manager:v1.8.0" | head -4
export HELM_REGISTRY_CONFIG="$WORK/helm-registry.json" HELM_CACHE_HOME="$WORK/helm-cache" \
    HELM_CONFIG_HOME="$WORK/helm-config" HELM_DATA_HOME="$WORK/helm-data"
printf '%s\n' "$KB_REGISTRY_PASSWORD" | "$KB_HELM4" registry login "$KB_TLS_REGISTRY" --ca-file "$KB_CA_FILE" -u "$KB_REGISTRY_USER" --password-stdin
mkdir -p pulled
"$KB_HELM4" pull "oci://$KB_TLS_REGISTRY/koordinator/charts/koordinator" --version 1.8.0 --ca-file "$KB_CA_FILE" -d pulled
ls -l pulled

step "starting a FAKE Kubernetes API server (tests/kube-fake/fake_apiserver.py: NOT Kubernetes, no pod will ever run)"
FAKE_DIR="$WORK/fake-apiserver"
mkdir -p "$FAKE_DIR"
python3 "$REPO_ROOT/tests/kube-fake/fake_apiserver.py" --state-dir "$FAKE_DIR" --port 0 \
    --seed-dir "$REPO_ROOT/tests/fixtures/kube/kind" >"$FAKE_DIR/log" 2>&1 &
FAKE_PID=$!
for _ in $(seq 100); do [[ -s "$FAKE_DIR/addr" ]] && break; sleep 0.1; done
[[ -s "$FAKE_DIR/addr" ]] || { cat "$FAKE_DIR/log" >&2; echo "the fake API server did not start" >&2; exit 1; }
echo "FAKE API server at $(cat "$FAKE_DIR/addr"), seeded with objects shaped like a kind cluster"

step "install: koord-bundle load pre-flights the FAKE cluster, then real helm 4 installs into it"
printf '%s\n' "$KB_REGISTRY_PASSWORD" | "$KB" load --registry "$KB_TLS_REGISTRY/koordinator" --key koord-bundle.pub \
    --ca-file "$KB_CA_FILE" --username "$KB_REGISTRY_USER" --password-stdin \
    --helm "$KB_HELM4" --kubeconfig "$FAKE_DIR/kubeconfig"

step "what the FAKE API server now holds (stored objects only: nothing runs)"
KUBECONFIG="$FAKE_DIR/kubeconfig" "$KB_HELM4" list --all-namespaces
curl -s "$(cat "$FAKE_DIR/addr")/_fake/state" | python3 -c '
import collections, json, sys
objs = json.load(sys.stdin)["objects"]
kinds = collections.Counter(o["kind"] for o in objs if o.get("metadata", {}).get("namespace") == "koordinator-system" or o["kind"] == "CustomResourceDefinition")
print("objects of the release:", ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
for o in objs:
    if o["kind"] in ("Deployment", "DaemonSet"):
        for c in o["spec"]["template"]["spec"]["containers"]:
            print("  %-10s %-22s image %s" % (o["kind"], o["metadata"]["name"], c["image"]))
'
step "done: work files in $WORK"
