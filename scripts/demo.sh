#!/usr/bin/env bash
# The whole koord-bundle story offline, against local registries on 127.0.0.1:
#   build (from a local "upstream" registry) → verify → load into a private TLS registry with
#   basic auth → check the result with skopeo and helm → render the install with helm.
# No internet and no Kubernetes cluster are needed: the install step runs helm in client dry-run
# mode (--dry-run), which is all that can be done without a cluster.
#
#   scripts/demo.sh            # KB_KEEP_ENV=1 leaves the registries running afterwards
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
export KB_ENV_DIR="${KB_ENV_DIR:-$REPO_ROOT/target/test-env}"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "installing the peers (docker-registry, skopeo, minisign, helm) if missing"
scripts/install-deps.sh
step "starting local registries (plain 'upstream' and TLS+auth 'private') and a Helm repository"
scripts/test-env.sh start
# shellcheck source=/dev/null
source "$KB_ENV_DIR/env.sh"
if [[ "${KB_KEEP_ENV:-0}" != 1 ]]; then trap '"$REPO_ROOT/scripts/test-env.sh" stop' EXIT; fi

step "building koord-bundle"
cargo build --release --quiet
KB="$REPO_ROOT/target/release/koord-bundle"
WORK="$(mktemp -d)"
export KOORD_BUNDLE_CONFIG_DIR="$WORK/config" KOORD_BUNDLE_CACHE_DIR="$WORK/cache"
cd "$WORK"

step "connected side: a signing key, then the bundle of Koordinator 1.8.0"
"$KB" keygen --unencrypted
"$KB" build 1.8.0 --repo "$KB_HELM_REPO" --source "$KB_PLAIN_REGISTRY" --plain-http
"$KB" inspect koordinator-1.8.0.tar

step "the sneakernet: only the bundle and the public key cross"
mkdir inside && cp koordinator-1.8.0.tar "$KOORD_BUNDLE_CONFIG_DIR/koord-bundle.pub" inside/
cd inside

step "air-gapped side: verify with koord-bundle, and with standard tools"
"$KB" verify koordinator-1.8.0.tar --key koord-bundle.pub
mkdir x && tar xf koordinator-1.8.0.tar -C x
(cd x && minisign -Vm SHA256SUMS -p ../koord-bundle.pub && sha256sum -c --quiet SHA256SUMS && echo "sha256sum: every file OK")
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
export HELM_REGISTRY_CONFIG="$WORK/helm-registry.json"
printf '%s\n' "$KB_REGISTRY_PASSWORD" | "$KB_HELM4" registry login "$KB_TLS_REGISTRY" --ca-file "$KB_CA_FILE" -u "$KB_REGISTRY_USER" --password-stdin
mkdir -p pulled
"$KB_HELM4" pull "oci://$KB_TLS_REGISTRY/koordinator/charts/koordinator" --version 1.8.0 --ca-file "$KB_CA_FILE" -d pulled
ls -l pulled

step "the install, as far as it goes without a cluster: helm renders it (--dry-run)"
printf '%s\n' "$KB_REGISTRY_PASSWORD" | "$KB" load --registry "$KB_TLS_REGISTRY/koordinator" --key koord-bundle.pub \
    --ca-file "$KB_CA_FILE" --username "$KB_REGISTRY_USER" --password-stdin --dry-run --helm "$KB_HELM4" \
    --kubeconfig /dev/null || true
step "done: work files in $WORK"
