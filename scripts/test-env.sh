#!/usr/bin/env bash
# koord-bundle test environment: three OCI registries (CNCF distribution 2.8:
# plain HTTP; TLS + htpasswd basic auth; TLS + Docker token auth with its blobs
# redirected to a CDN stand-in, like Docker Hub, ghcr.io, ACR and Harbor), the
# token service and blob server of the third (scripts/token-registry.py), a
# Harbor stand-in (a fourth distribution 2.8 with token auth behind
# scripts/token-registry.py harbor: /v2/, /service/token and /api/v2.0/ on one
# host:port, projects, robot accounts), a Helm chart repository over HTTP, and
# synthetic images pushed into the first three, a registry that serves the OCI 1.1 referrers API
# (go-containerregistry's pkg/registry, tests/referrers-registry, built by
# scripts/install-deps.sh; empty at start, in memory), and a real Kubernetes control plane
# (scripts/control-plane.sh: etcd, kube-apiserver and kube-controller-manager, built once from
# the Go module proxy).
#
#   scripts/test-env.sh start    # idempotent: reuses healthy running services
#   scripts/test-env.sh stop     # stops what start started (pid files)
#   scripts/test-env.sh status   # prints what runs; exits 0 when every service runs and is
#                                # healthy, 3 when one is stopped, 1 when one runs unhealthy
#
# Environment (all optional):
#   KB_ENV_DIR     state dir            (default <repo>/target/test-env)
#   KB_TOOLS       helm binaries        (default <repo>/.tools)
#   KB_PLAIN_PORT  plain registry port  (default 15000)
#   KB_TLS_PORT    TLS registry port    (default 15001)
#   KB_HELM_PORT   chart repo port      (default 15080)
#   KB_TOKEN_PORT  token-auth registry  (default 15002)
#   KB_AUTH_PORT   its token service    (default 15003)
#   KB_CDN_PORT    its blob server      (default 15004)
#   KB_HARBOR_PORT           Harbor stand-in, HTTPS   (default 15005)
#   KB_HARBOR_HTTP_PORT      its plain-HTTP entrance  (default 15006)
#   KB_HARBOR_REGISTRY_PORT  the registry behind it   (default 15007)
#   KB_REFERRERS_PORT        the referrers registry, plain HTTP (default 15008)
#   KB_ETCD_PORT, KB_KUBE_PORT, KB_KCM_PORT  the first control plane (default 15010-15013, see
#                  scripts/control-plane.sh)
#   KB_CONTROL_PLANES  how many control planes (default 2): the tests that lease a cluster
#                  run side by side, one per control plane (tests/it/cluster.rs, and the test
#                  group `cluster` of .config/nextest.toml, which must allow as many)
#   KB_KUBE_POOL_PORT  the second and later control planes take 4 ports each from here
#                  (default 15020: 15020-15023 for the second, 15024-15027 for a third)
#   KB_NO_CLUSTER=1    start no control plane (scripts/test.sh --quick: its tests need none)
#
# A second environment runs side by side with its own KB_ENV_DIR and every
# KB_*_PORT set to free ports (pid files, state and env.json live in KB_ENV_DIR).
#
# Writes $KB_ENV_DIR/env.sh (export lines) and $KB_ENV_DIR/env.json.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KB_ENV_DIR="${KB_ENV_DIR:-$REPO_ROOT/target/test-env}"
KB_TOOLS="${KB_TOOLS:-$REPO_ROOT/.tools}"
KB_PLAIN_PORT="${KB_PLAIN_PORT:-15000}"
KB_TLS_PORT="${KB_TLS_PORT:-15001}"
KB_HELM_PORT="${KB_HELM_PORT:-15080}"
KB_TOKEN_PORT="${KB_TOKEN_PORT:-15002}"
KB_AUTH_PORT="${KB_AUTH_PORT:-15003}"
KB_CDN_PORT="${KB_CDN_PORT:-15004}"
KB_HARBOR_PORT="${KB_HARBOR_PORT:-15005}"
KB_HARBOR_HTTP_PORT="${KB_HARBOR_HTTP_PORT:-15006}"
KB_HARBOR_REGISTRY_PORT="${KB_HARBOR_REGISTRY_PORT:-15007}"
KB_REFERRERS_PORT="${KB_REFERRERS_PORT:-15008}"
KB_CONTROL_PLANES="${KB_CONTROL_PLANES:-2}"
KB_KUBE_POOL_PORT="${KB_KUBE_POOL_PORT:-15020}"
[[ "$KB_CONTROL_PLANES" =~ ^[1-9][0-9]*$ ]] || { echo "KB_CONTROL_PLANES must be 1 or more" >&2; exit 2; }
[[ "${KB_NO_CLUSTER:-0}" == 1 ]] && KB_CONTROL_PLANES=0

HOST=127.0.0.1
USERNAME=koord
PASSWORD=koord-test-pw
# Token registry: USERNAME may push, PULL_USER may only pull; IDENTITY_TOKEN is a refresh token
# of USERNAME (the identity-token flow).
PULL_USER=reader
PULL_PASSWORD=reader-test-pw
IDENTITY_TOKEN=koord-test-identity-token-6f1d
TOKEN_SERVICE=koord-test-registry
TOKEN_ISSUER=koord-test-token-issuer
# Harbor stand-in: Harbor's own service and issuer names; its projects, users and robot
# account (see write_harbor_state). USERNAME is a Developer of the seeded projects, PULL_USER a
# Guest, HARBOR_ADMIN a system administrator, ROBOT a project robot of `koord` that may push.
HARBOR_SERVICE=harbor-registry
HARBOR_ISSUER=harbor-token-issuer
HARBOR_ADMIN=admin
HARBOR_ADMIN_PASSWORD=Harbor12345
ROBOT_USER='robot$koord+ci'
ROBOT_PASSWORD=koord-robot-secret-7c2e
CHARTS_SRC="$REPO_ROOT/tests/fixtures/charts"

mkdir -p "$KB_ENV_DIR"
KB_ENV_DIR="$(cd "$KB_ENV_DIR" && pwd)"
KB_TOOLS="$(mkdir -p "$KB_TOOLS" && cd "$KB_TOOLS" && pwd)"

RUN_DIR="$KB_ENV_DIR/run"
LOG_DIR="$KB_ENV_DIR/logs"
PKI_DIR="$KB_ENV_DIR/pki"        # ca.crt ca.key server.crt server.key
CA_DIR="$KB_ENV_DIR/ca"          # only ca.crt: usable as skopeo/containers --cert-dir
HELM_DIR="$KB_ENV_DIR/helm-repo"
PLAIN_DIR="$KB_ENV_DIR/registry-plain"
TLS_DIR="$KB_ENV_DIR/registry-tls"
TOKEN_DIR="$KB_ENV_DIR/registry-token"
HARBOR_DIR="$KB_ENV_DIR/registry-harborreg"
REFERRERS_DIR="$KB_ENV_DIR/registry-referrers"
REFERRERS_BIN="$KB_TOOLS/referrers-registry-v0.22.1/referrers-registry"
MARKER="$KB_ENV_DIR/images.pushed"

SERVICES=(plain tls helm auth cdn token harborreg harbor referrers)

log() { printf '[test-env] %s\n' "$*" >&2; }
die() { printf '[test-env] ERROR: %s\n' "$*" >&2; exit 1; }

port_of() {
    case "$1" in
        plain) echo "$KB_PLAIN_PORT" ;;
        tls) echo "$KB_TLS_PORT" ;;
        helm) echo "$KB_HELM_PORT" ;;
        token) echo "$KB_TOKEN_PORT" ;;
        auth) echo "$KB_AUTH_PORT" ;;
        cdn) echo "$KB_CDN_PORT" ;;
        harborreg) echo "$KB_HARBOR_REGISTRY_PORT" ;;
        harbor) echo "$KB_HARBOR_PORT" ;;
        referrers) echo "$KB_REFERRERS_PORT" ;;
    esac
}
# The variable that sets a service's port.
port_var_of() {
    case "$1" in
        harborreg) echo KB_HARBOR_REGISTRY_PORT ;;
        *) echo "KB_${1^^}_PORT" ;;
    esac
}
pidfile_of() { echo "$RUN_DIR/$1.pid"; }

# alive <pid>: the process exists and is not a zombie (our services are
# reparented to pid 1 once this script exits, which may reap them late).
alive() {
    local st
    st="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || true)"
    [[ -n "$st" && "$st" != Z && "$st" != X ]]
}
logfile_of() { echo "$LOG_DIR/$1.log"; }

# pid of a running service we started, or empty.
running_pid() {
    local pf pid
    pf="$(pidfile_of "$1")"
    [[ -f "$pf" ]] || return 0
    pid="$(cat "$pf" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    if alive "$pid"; then
        local want
        case "$1" in
            plain | tls | token | harborreg) want="docker-registry" ;;
            helm) want="http.server" ;;
            auth | cdn | harbor) want="token-registry.py $1" ;;
            referrers) want="referrers-registry" ;;
        esac
        local cmdline
        cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
        if [[ "$cmdline" == *"$want"* ]]; then
            echo "$pid"
        fi
    fi
}

port_open() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

# healthy <service>: the service answers as expected.
healthy() {
    local port code
    port="$(port_of "$1")"
    case "$1" in
        plain)
            code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 "http://$HOST:$port/v2/" || true)"
            [[ "$code" == 200 ]]
            ;;
        tls)
            code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 --cacert "$PKI_DIR/ca.crt" \
                -u "$USERNAME:$PASSWORD" "https://$HOST:$port/v2/" || true)"
            [[ "$code" == 200 ]]
            ;;
        helm)
            code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 "http://$HOST:$port/index.yaml" || true)"
            [[ "$code" == 200 ]]
            ;;
        token)
            # Anonymous: 401 with a Bearer challenge naming our token service.
            curl -s -o /dev/null -D - --max-time 3 --cacert "$PKI_DIR/ca.crt" "https://$HOST:$port/v2/" 2>/dev/null \
                | grep -qi "^www-authenticate: Bearer realm=\"https://$HOST:$KB_AUTH_PORT/token\""
            ;;
        auth)
            code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 --cacert "$PKI_DIR/ca.crt" \
                "https://$HOST:$port/token?service=$TOKEN_SERVICE" || true)"
            [[ "$code" == 200 ]]
            ;;
        cdn)
            code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 --cacert "$PKI_DIR/ca.crt" \
                "https://localhost:$port/healthz" || true)"
            [[ "$code" == 200 ]]
            ;;
        harborreg)
            # Token auth whose realm is the Harbor stand-in's /service/token.
            curl -s -o /dev/null -D - --max-time 3 "http://$HOST:$port/v2/" 2>/dev/null \
                | grep -qi "^www-authenticate: Bearer realm=\"https://$HOST:$KB_HARBOR_PORT/service/token\""
            ;;
        referrers)
            # /v2/ answers, and the referrers route is served (a 404 of the API's own
            # NAME_UNKNOWN for a repository nobody pushed, not a route that is not there).
            code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 "http://$HOST:$port/v2/" || true)"
            [[ "$code" == 200 ]] || return 1
            curl -s --max-time 3 "http://$HOST:$port/v2/kb-health/referrers/sha256:$(printf '0%.0s' {1..64})" 2>/dev/null \
                | grep -q '"NAME_UNKNOWN"'
            ;;
        harbor)
            # Both entrances answer systeminfo; /v2/ reaches the registry behind.
            code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 --cacert "$PKI_DIR/ca.crt" \
                "https://$HOST:$port/api/v2.0/systeminfo" || true)"
            [[ "$code" == 200 ]] || return 1
            code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 \
                "http://$HOST:$KB_HARBOR_HTTP_PORT/api/v2.0/systeminfo" || true)"
            [[ "$code" == 200 ]] || return 1
            code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 --cacert "$PKI_DIR/ca.crt" \
                "https://$HOST:$port/v2/" || true)"
            [[ "$code" == 401 ]]
            ;;
    esac
}

# A python3 that has `cryptography` (the token service signs RS256 JWTs): the one on PATH,
# else Debian's (where apt's python3-cryptography goes).
token_python() {
    local p
    for p in "$(command -v python3 || true)" /usr/bin/python3; do
        if [[ -n "$p" && -x "$p" ]] && "$p" -c 'import cryptography' 2>/dev/null; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

need_tools() {
    local missing=()
    for b in docker-registry skopeo htpasswd openssl curl python3; do
        command -v "$b" >/dev/null 2>&1 || missing+=("$b")
    done
    token_python >/dev/null || missing+=(python3-cryptography)
    [[ -x "$REFERRERS_BIN" ]] || missing+=("$REFERRERS_BIN")
    ((${#missing[@]} == 0)) || die "missing tools: ${missing[*]} (run scripts/install-deps.sh)"
    for v in 3 4; do
        [[ -x "$KB_TOOLS/helm$v/helm" ]] || log "warning: $KB_TOOLS/helm$v/helm missing (run scripts/install-deps.sh)"
    done
}

# ------------------------------------------------------------------ PKI
# pki_fresh <ca> <cert>: $PKI_DIR holds <ca>.crt, <cert>.crt and <cert>.key, the certificate
# chains to the CA and is good for another day.
pki_fresh() {
    [[ -s "$PKI_DIR/$1.crt" && -s "$PKI_DIR/$2.crt" && -s "$PKI_DIR/$2.key" ]] \
        && openssl verify -CAfile "$PKI_DIR/$1.crt" "$PKI_DIR/$2.crt" >/dev/null 2>&1 \
        && openssl x509 -in "$PKI_DIR/$2.crt" -noout -checkend 86400 >/dev/null 2>&1
}

# new_ca <dir> <name> <CN>: a self-signed CA, <dir>/<name>.crt and <dir>/<name>.key.
new_ca() {
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
        -subj "/CN=$3" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -keyout "$1/$2.key" -out "$1/$2.crt" >"$1/openssl.log" 2>&1 \
        || { cat "$1/openssl.log" >&2; die "openssl: creating $3 failed"; }
}

# new_cert <dir> <ca> <name> <CN> <extfile>: a key <dir>/<name>.key and its certificate
# <dir>/<name>.crt, issued by the CA <dir>/<ca>.{crt,key} with the extensions of <extfile>.
new_cert() {
    local dir="$1" ca="$2" name="$3" cn="$4" ext="$5"
    openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=$cn" \
        -keyout "$dir/$name.key" -out "$dir/$name.csr" >"$dir/openssl.log" 2>&1 \
        || { cat "$dir/openssl.log" >&2; die "openssl: creating the key of $cn failed"; }
    openssl x509 -req -sha256 -days 3650 -in "$dir/$name.csr" \
        -CA "$dir/$ca.crt" -CAkey "$dir/$ca.key" -CAcreateserial \
        -extfile "$ext" -out "$dir/$name.crt" >"$dir/openssl.log" 2>&1 \
        || { cat "$dir/openssl.log" >&2; die "openssl: signing the certificate of $cn failed"; }
}

make_pki() {
    mkdir -p "$PKI_DIR" "$CA_DIR"
    if [[ -s "$PKI_DIR/ca.key" ]] && pki_fresh ca server; then
        cp -f "$PKI_DIR/ca.crt" "$CA_DIR/ca.crt"
        return 0
    fi
    log "creating test CA and server certificate in $PKI_DIR"
    local tmp
    tmp="$(mktemp -d)"
    new_ca "$tmp" ca "koord-bundle test CA"
    cat >"$tmp/server.ext" <<EOF
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost
EOF
    new_cert "$tmp" ca server localhost "$tmp/server.ext"
    chmod 600 "$tmp/ca.key" "$tmp/server.key"
    mv -f "$tmp/ca.crt" "$tmp/ca.key" "$tmp/server.crt" "$tmp/server.key" "$PKI_DIR/"
    rm -rf "$tmp"
    cp -f "$PKI_DIR/ca.crt" "$CA_DIR/ca.crt"
    # a new CA invalidates anything that trusted the old one: restart the TLS services
    stop_service tls
    stop_service token
    stop_service auth
    stop_service cdn
    stop_service harbor
}

# The token service's signing key: a CA of its own (the registry's rootcertbundle) and a signer
# certificate it issued (sent in each JWT's x5c header).
make_token_pki() {
    if pki_fresh token-ca token-signer; then
        return 0
    fi
    log "creating the token signer CA and certificate in $PKI_DIR"
    local tmp
    tmp="$(mktemp -d)"
    new_ca "$tmp" token-ca "koord-bundle test token CA"
    printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n' >"$tmp/signer.ext"
    new_cert "$tmp" token-ca token-signer "koord-bundle test token signer" "$tmp/signer.ext"
    chmod 600 "$tmp/token-ca.key" "$tmp/token-signer.key"
    mv -f "$tmp/token-ca.crt" "$tmp/token-ca.key" "$tmp/token-signer.crt" "$tmp/token-signer.key" "$PKI_DIR/"
    rm -rf "$tmp"
    stop_service auth
    stop_service token
    stop_service harbor
    stop_service harborreg
}

write_token_users() {
    mkdir -p "$TOKEN_DIR"
    printf '{"users": {"%s": {"password": "%s", "role": "push"}, "%s": {"password": "%s", "role": "pull"}},\n "refresh": {"%s": "%s"}}\n' \
        "$USERNAME" "$PASSWORD" "$PULL_USER" "$PULL_PASSWORD" "$IDENTITY_TOKEN" "$USERNAME" \
        >"$TOKEN_DIR/users.json.new"
    if ! cmp -s "$TOKEN_DIR/users.json.new" "$TOKEN_DIR/users.json" 2>/dev/null; then
        mv -f "$TOKEN_DIR/users.json.new" "$TOKEN_DIR/users.json"
        stop_service auth
    else
        rm -f "$TOKEN_DIR/users.json.new"
    fi
}

# The Harbor stand-in's seed: users, the robot account and the projects that exist at start
# (those created through the API live until the stand-in stops).
write_harbor_state() {
    mkdir -p "$HARBOR_DIR"
    KB_W_USER="$USERNAME" KB_W_PASSWORD="$PASSWORD" KB_W_PULL_USER="$PULL_USER" \
    KB_W_PULL_PASSWORD="$PULL_PASSWORD" KB_W_ADMIN="$HARBOR_ADMIN" \
    KB_W_ADMIN_PASSWORD="$HARBOR_ADMIN_PASSWORD" KB_W_ROBOT="$ROBOT_USER" \
    KB_W_ROBOT_PASSWORD="$ROBOT_PASSWORD" python3 - >"$HARBOR_DIR/harbor.json.new" <<'EOF'
import json, os
e = os.environ
members = {e["KB_W_USER"]: "developer", e["KB_W_PULL_USER"]: "guest"}
print(json.dumps({
    "project_creation_restriction": "everyone",
    "users": {
        e["KB_W_USER"]: {"password": e["KB_W_PASSWORD"]},
        e["KB_W_PULL_USER"]: {"password": e["KB_W_PULL_PASSWORD"]},
        e["KB_W_ADMIN"]: {"password": e["KB_W_ADMIN_PASSWORD"], "sysadmin": True},
    },
    "robots": {e["KB_W_ROBOT"]: {"password": e["KB_W_ROBOT_PASSWORD"],
                                  "permissions": {"koord": ["pull", "push"]}}},
    "projects": {
        "library": {"public": True, "members": members},
        "koord": {"public": False, "members": members},
    },
}, indent=2))
EOF
    if ! cmp -s "$HARBOR_DIR/harbor.json.new" "$HARBOR_DIR/harbor.json" 2>/dev/null; then
        mv -f "$HARBOR_DIR/harbor.json.new" "$HARBOR_DIR/harbor.json"
        stop_service harbor
    else
        rm -f "$HARBOR_DIR/harbor.json.new"
    fi
}

make_htpasswd() {
    local f="$TLS_DIR/htpasswd"
    if [[ -s "$f" ]] && htpasswd -vb "$f" "$USERNAME" "$PASSWORD" >/dev/null 2>&1; then
        return 0
    fi
    mkdir -p "$TLS_DIR"
    htpasswd -Bbc "$f" "$USERNAME" "$PASSWORD" >/dev/null 2>&1 || die "htpasswd -B failed"
    stop_service tls
}

# ------------------------------------------------------------------ configs
write_registry_config() {
    local name="$1" dir port
    port="$(port_of "$name")"
    dir="$KB_ENV_DIR/registry-$name"
    mkdir -p "$dir/data"
    # Behind the Harbor stand-in: its Location headers relative, so both entrances work.
    local relative=false
    [[ "$name" == harborreg ]] && relative=true
    {
        cat <<EOF
# generated by scripts/test-env.sh
version: 0.1
log:
  level: info
  formatter: text
  accesslog:
    disabled: false
  fields:
    service: registry-$name
storage:
  filesystem:
    rootdirectory: $dir/data
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
  redirect:
    disable: $([[ "$name" == token ]] && echo false || echo true)
http:
  addr: $HOST:$port
  secret: koord-bundle-test-env-$name
  relativeurls: $relative
  headers:
    X-Content-Type-Options: [nosniff]
EOF
        if [[ "$name" == tls ]]; then
            cat <<EOF
  tls:
    certificate: $PKI_DIR/server.crt
    key: $PKI_DIR/server.key
auth:
  htpasswd:
    realm: koord-bundle-test
    path: $TLS_DIR/htpasswd
EOF
        fi
        if [[ "$name" == token ]]; then
            # Docker token auth, and every blob GET redirected (307) to the blob server on
            # another host name (localhost, not 127.0.0.1), as Docker Hub and ghcr.io do to
            # their CDNs.
            cat <<EOF
  tls:
    certificate: $PKI_DIR/server.crt
    key: $PKI_DIR/server.key
auth:
  token:
    realm: https://$HOST:$KB_AUTH_PORT/token
    service: $TOKEN_SERVICE
    issuer: $TOKEN_ISSUER
    rootcertbundle: $PKI_DIR/token-ca.crt
middleware:
  storage:
    - name: redirect
      options:
        baseurl: https://localhost:$KB_CDN_PORT/
EOF
        fi
        if [[ "$name" == harborreg ]]; then
            # Plain HTTP on loopback behind the stand-in, which serves TLS (as Harbor's nginx
            # does); tokens from the stand-in's /service/token.
            cat <<EOF
auth:
  token:
    realm: https://$HOST:$KB_HARBOR_PORT/service/token
    service: $HARBOR_SERVICE
    issuer: $HARBOR_ISSUER
    rootcertbundle: $PKI_DIR/token-ca.crt
EOF
        fi
    } >"$dir/config.yml.new"
    if ! cmp -s "$dir/config.yml.new" "$dir/config.yml" 2>/dev/null; then
        mv -f "$dir/config.yml.new" "$dir/config.yml"
        stop_service "$name" # config changed: restart with the new one
    else
        rm -f "$dir/config.yml.new"
    fi
}

sync_helm_repo() {
    [[ -f "$CHARTS_SRC/index.yaml" ]] || die "no chart fixtures at $CHARTS_SRC"
    mkdir -p "$HELM_DIR"
    local f
    for f in "$CHARTS_SRC"/index.yaml "$CHARTS_SRC"/*.tgz; do
        cmp -s "$f" "$HELM_DIR/$(basename "$f")" || cp -f "$f" "$HELM_DIR/"
    done
    # drop archives that are no longer in the fixtures
    for f in "$HELM_DIR"/*.tgz; do
        [[ -e "$f" ]] || continue
        [[ -e "$CHARTS_SRC/$(basename "$f")" ]] || rm -f "$f"
    done
}

# ------------------------------------------------------------------ processes
start_service() {
    local name="$1" port pid lf
    port="$(port_of "$name")"
    lf="$(logfile_of "$name")"
    pid="$(running_pid "$name")"
    if [[ -n "$pid" ]]; then
        if healthy "$name"; then
            log "$name: reusing pid $pid on port $port"
            return 0
        fi
        log "$name: pid $pid is not healthy, restarting"
        stop_service "$name"
    fi
    rm -f "$(pidfile_of "$name")"
    if port_open "$port"; then
        die "$name: port $HOST:$port is already in use by another process (not started by this env in $KB_ENV_DIR); stop it or set $(port_var_of "$name")"
    fi
    local -a cmd
    case "$name" in
        plain | tls | token | harborreg) cmd=("$(command -v docker-registry)" serve "$KB_ENV_DIR/registry-$name/config.yml") ;;
        helm) cmd=("$(command -v python3)" -m http.server --bind "$HOST" --directory "$HELM_DIR" "$port") ;;
        auth) cmd=("$(token_python)" "$REPO_ROOT/scripts/token-registry.py" auth --port "$port"
            --key "$PKI_DIR/token-signer.key" --cert "$PKI_DIR/token-signer.crt"
            --issuer "$TOKEN_ISSUER" --service "$TOKEN_SERVICE" --users "$TOKEN_DIR/users.json"
            --tls-cert "$PKI_DIR/server.crt" --tls-key "$PKI_DIR/server.key") ;;
        cdn) cmd=("$(command -v python3)" "$REPO_ROOT/scripts/token-registry.py" cdn --port "$port"
            --root "$TOKEN_DIR/data" --tls-cert "$PKI_DIR/server.crt" --tls-key "$PKI_DIR/server.key") ;;
        harbor)
            if port_open "$KB_HARBOR_HTTP_PORT"; then
                die "harbor: port $HOST:$KB_HARBOR_HTTP_PORT is already in use by another process; stop it or set KB_HARBOR_HTTP_PORT"
            fi
            cmd=("$(token_python)" "$REPO_ROOT/scripts/token-registry.py" harbor --port "$port"
            --http-port "$KB_HARBOR_HTTP_PORT" --upstream "$HOST:$KB_HARBOR_REGISTRY_PORT"
            --key "$PKI_DIR/token-signer.key" --cert "$PKI_DIR/token-signer.crt"
            --issuer "$HARBOR_ISSUER" --service "$HARBOR_SERVICE" --state "$HARBOR_DIR/harbor.json"
            --tls-cert "$PKI_DIR/server.crt" --tls-key "$PKI_DIR/server.key") ;;
        referrers) cmd=("$REFERRERS_BIN" -addr "$HOST:$port" -blobs "$REFERRERS_DIR/blobs") ;;
    esac
    {
        printf '\n===== %s start: %s\n' "$(date -u +%FT%TZ)" "${cmd[*]}"
    } >>"$lf"
    # setsid: own session, so a Ctrl-C in the calling terminal does not kill it.
    # 9>&-: do not hand the env lock to the long-running service.
    setsid "${cmd[@]}" >>"$lf" 2>&1 </dev/null 9>&- &
    pid=$!
    echo "$pid" >"$(pidfile_of "$name")"
    local i
    for ((i = 0; i < 150; i++)); do
        if healthy "$name"; then
            log "$name: started pid $pid on port $port"
            return 0
        fi
        if ! alive "$pid"; then
            break
        fi
        sleep 0.1
    done
    log "$name: did not become healthy on $HOST:$port; last lines of $lf:"
    # only this attempt's output, long lines cut
    awk '/^===== /{n=0; delete b} {b[n++]=$0} END{s=(n>30?n-30:0); for(i=s;i<n;i++) print substr(b[i],1,400)}' \
        "$lf" >&2 || true
    stop_service "$name"
    die "$name failed to start"
}

stop_service() {
    local name="$1" pid pf
    pf="$(pidfile_of "$name")"
    pid="$(running_pid "$name")"
    if [[ -n "$pid" ]]; then
        kill "$pid" 2>/dev/null || true
        local i
        for ((i = 0; i < 100; i++)); do
            alive "$pid" || break
            sleep 0.05
        done
        if alive "$pid"; then
            log "$name: pid $pid ignored SIGTERM, sending SIGKILL"
            kill -9 "$pid" 2>/dev/null || true
        fi
        log "$name: stopped pid $pid"
    fi
    rm -f "$pf"
}

# ------------------------------------------------------------------ images
images_stamp() {
    {
        sha256sum "$REPO_ROOT/scripts/gen-images.py"
        sha256sum "$CHARTS_SRC"/*.tgz
        echo "plain=$HOST:$KB_PLAIN_PORT tls=$HOST:$KB_TLS_PORT token=$HOST:$KB_TOKEN_PORT"
    } | sha256sum | cut -d' ' -f1
}

gen_args() {
    printf '%s\n' --env-dir "$KB_ENV_DIR" --charts-dir "$CHARTS_SRC" \
        --plain "$HOST:$KB_PLAIN_PORT" --tls "$HOST:$KB_TLS_PORT" \
        --token "$HOST:$KB_TOKEN_PORT" --token-auth "https://$HOST:$KB_AUTH_PORT/token" \
        --token-service "$TOKEN_SERVICE" \
        --username "$USERNAME" --password "$PASSWORD" --helm "$KB_TOOLS/helm3/helm"
}

push_images() {
    local stamp
    stamp="$(images_stamp)"
    local -a args
    mapfile -t args < <(gen_args)
    if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$stamp" ]] \
        && python3 "$REPO_ROOT/scripts/gen-images.py" "${args[@]}" --ca-file "$PKI_DIR/ca.crt" --verify; then
        log "images: already pushed (marker $MARKER)"
        return 0
    fi
    rm -f "$MARKER"
    log "images: generating and pushing synthetic images"
    python3 "$REPO_ROOT/scripts/gen-images.py" "${args[@]}" --cert-dir "$CA_DIR" \
        >"$LOG_DIR/gen-images.out" 2>"$LOG_DIR/gen-images.log" || {
        tail -n 40 "$LOG_DIR/gen-images.log" >&2
        die "pushing the synthetic images failed (log: $LOG_DIR/gen-images.log)"
    }
    cat "$LOG_DIR/gen-images.out" >&2
    echo "$stamp" >"$MARKER"
}

# ------------------------------------------------------------------ env files
write_env_files() {
    KB_W_PLAIN="$HOST:$KB_PLAIN_PORT" KB_W_TLS="$HOST:$KB_TLS_PORT" \
    KB_W_CA_FILE="$PKI_DIR/ca.crt" KB_W_CA_DIR="$CA_DIR" \
    KB_W_USER="$USERNAME" KB_W_PASSWORD="$PASSWORD" \
    KB_W_HELM_REPO="http://$HOST:$KB_HELM_PORT/" \
    KB_W_HELM3="$KB_TOOLS/helm3/helm" KB_W_HELM4="$KB_TOOLS/helm4/helm" \
    KB_W_KUBECTL="$KB_TOOLS/kubectl/kubectl" KB_W_KUBE_DIRS="$(kube_dirs)" \
    KB_W_COSIGN="$KB_TOOLS/cosign-v2.6.5/cosign" \
    KB_W_ENV_DIR="$KB_ENV_DIR" KB_W_PLAIN_STORAGE="$PLAIN_DIR/data" KB_W_TLS_STORAGE="$TLS_DIR/data" \
    KB_W_CHARTS_DIR="$HELM_DIR" \
    KB_W_TOKEN="$HOST:$KB_TOKEN_PORT" KB_W_AUTH_URL="https://$HOST:$KB_AUTH_PORT" \
    KB_W_CDN_URL="https://localhost:$KB_CDN_PORT" KB_W_TOKEN_SERVICE="$TOKEN_SERVICE" \
    KB_W_PULL_USER="$PULL_USER" KB_W_PULL_PASSWORD="$PULL_PASSWORD" \
    KB_W_IDENTITY_TOKEN="$IDENTITY_TOKEN" KB_W_TOKEN_STORAGE="$TOKEN_DIR/data" \
    KB_W_TOKEN_CA="$PKI_DIR/token-ca.crt" \
    KB_W_HARBOR="$HOST:$KB_HARBOR_PORT" KB_W_HARBOR_HTTP="$HOST:$KB_HARBOR_HTTP_PORT" \
    KB_W_HARBOR_STORAGE="$HARBOR_DIR/data" KB_W_HARBOR_ADMIN="$HARBOR_ADMIN" \
    KB_W_HARBOR_ADMIN_PASSWORD="$HARBOR_ADMIN_PASSWORD" KB_W_ROBOT="$ROBOT_USER" \
    KB_W_ROBOT_PASSWORD="$ROBOT_PASSWORD" KB_W_REFERRERS="$HOST:$KB_REFERRERS_PORT" \
    python3 - <<'EOF'
import json, os, shlex
e = os.environ
env_dir = e["KB_W_ENV_DIR"]
d = {
    "plain_registry": e["KB_W_PLAIN"],
    "tls_registry": e["KB_W_TLS"],
    "ca_file": e["KB_W_CA_FILE"],
    "ca_dir": e["KB_W_CA_DIR"],
    "username": e["KB_W_USER"],
    "password": e["KB_W_PASSWORD"],
    "helm_repo": e["KB_W_HELM_REPO"],
    "helm3": e["KB_W_HELM3"],
    "helm4": e["KB_W_HELM4"],
    "kubectl": e["KB_W_KUBECTL"],
    "cosign": e["KB_W_COSIGN"],
    "env_dir": env_dir,
    "images_json": os.path.join(env_dir, "images.json"),
    "mirror_partial_prefix": "mirror-partial",
    "plain_storage": e["KB_W_PLAIN_STORAGE"],
    "tls_storage": e["KB_W_TLS_STORAGE"],
    "charts_dir": e["KB_W_CHARTS_DIR"],
    # The token registry (TLS with ca_file; Docker token auth; blobs redirected to the CDN).
    "token_registry": e["KB_W_TOKEN"],
    "token_auth_url": e["KB_W_AUTH_URL"],
    "token_realm": e["KB_W_AUTH_URL"] + "/token",
    "token_cdn_url": e["KB_W_CDN_URL"],
    "token_service": e["KB_W_TOKEN_SERVICE"],
    "token_ca_file": e["KB_W_TOKEN_CA"],
    "token_storage": e["KB_W_TOKEN_STORAGE"],
    "push_user": {"username": e["KB_W_USER"], "password": e["KB_W_PASSWORD"]},
    "pull_user": {"username": e["KB_W_PULL_USER"], "password": e["KB_W_PULL_PASSWORD"]},
    "identity_token": e["KB_W_IDENTITY_TOKEN"],
    # The Harbor stand-in (TLS with ca_file; plain HTTP on harbor_http_registry, same state):
    # push_user is a Developer and pull_user a Guest of harbor_projects; harbor_robot may push
    # to the project koord only; harbor_admin is a system administrator.
    "harbor_registry": e["KB_W_HARBOR"],
    "harbor_http_registry": e["KB_W_HARBOR_HTTP"],
    "harbor_storage": e["KB_W_HARBOR_STORAGE"],
    "harbor_projects": ["library", "koord"],
    "harbor_robot": {"username": e["KB_W_ROBOT"], "password": e["KB_W_ROBOT_PASSWORD"]},
    "harbor_admin": {"username": e["KB_W_HARBOR_ADMIN"], "password": e["KB_W_HARBOR_ADMIN_PASSWORD"]},
    # A plain-HTTP registry that serves the OCI 1.1 referrers API (go-containerregistry's
    # pkg/registry; empty at start, its manifests in memory: the tests push what they need).
    "referrers_registry": e["KB_W_REFERRERS"],
}
# The control planes' part (scripts/control-plane.sh writes one per control plane): kube_server,
# kube_admin_kubeconfig, kube_ca_file, kube_version, kube_lock, kube_tokens. The first one's at
# the top level (a user's KB_KUBECONFIG, the demo), every one in kube_pool (the tests' leases);
# none with KB_NO_CLUSTER=1.
pool = []
for kdir in e["KB_W_KUBE_DIRS"].split():
    with open(os.path.join(kdir, "env.json")) as f:
        pool.append(json.load(f))
if pool:
    d.update(pool[0])
d["kube_pool"] = pool
tmp = os.path.join(env_dir, "env.json.tmp")
with open(tmp, "w") as f:
    json.dump(d, f, indent=2)
    f.write("\n")
os.replace(tmp, os.path.join(env_dir, "env.json"))
names = {
    "KB_PLAIN_REGISTRY": "plain_registry", "KB_TLS_REGISTRY": "tls_registry",
    "KB_CA_FILE": "ca_file", "KB_CA_DIR": "ca_dir", "KB_REGISTRY_USER": "username",
    "KB_REGISTRY_PASSWORD": "password", "KB_HELM_REPO": "helm_repo", "KB_HELM3": "helm3",
    "KB_HELM4": "helm4", "KB_ENV_DIR": "env_dir", "KB_IMAGES_JSON": "images_json",
    "KB_TOKEN_REGISTRY": "token_registry", "KB_TOKEN_REALM": "token_realm",
    "KB_TOKEN_CDN": "token_cdn_url", "KB_HARBOR_REGISTRY": "harbor_registry",
    "KB_KUBECONFIG": "kube_admin_kubeconfig", "KB_REFERRERS_REGISTRY": "referrers_registry",
}
lines = ["# generated by scripts/test-env.sh; source it"]
lines += [f"export {k}={shlex.quote(d[v])}" for k, v in names.items() if v in d]
lines.append(f"export KB_ENV_JSON={shlex.quote(os.path.join(env_dir, 'env.json'))}")
tmp = os.path.join(env_dir, "env.sh.tmp")
with open(tmp, "w") as f:
    f.write("\n".join(lines) + "\n")
os.replace(tmp, os.path.join(env_dir, "env.sh"))
EOF
}

# ------------------------------------------------------------------ control planes
# The state directory of control plane i (0: the first, on KB_ETCD_PORT...).
kube_dir() {
    if (($1 == 0)); then echo "$KB_ENV_DIR/kube"; else echo "$KB_ENV_DIR/kube-$1"; fi
}
# The state directories of the control planes this start runs.
kube_dirs() {
    local i
    for ((i = 0; i < KB_CONTROL_PLANES; i++)); do kube_dir "$i"; done
}
# control_plane <i> <verb>: scripts/control-plane.sh <verb> for control plane i.
control_plane() {
    local i="$1" verb="$2"
    if ((i == 0)); then
        KB_KUBE_DIR="$(kube_dir 0)" KB_ENV_DIR="$KB_ENV_DIR" KB_TOOLS="$KB_TOOLS" \
            "$REPO_ROOT/scripts/control-plane.sh" "$verb"
    else
        local b=$((KB_KUBE_POOL_PORT + 4 * (i - 1)))
        KB_KUBE_DIR="$(kube_dir "$i")" KB_ETCD_PORT="$b" KB_KUBE_PORT="$((b + 2))" KB_KCM_PORT="$((b + 3))" \
            KB_ENV_DIR="$KB_ENV_DIR" KB_TOOLS="$KB_TOOLS" "$REPO_ROOT/scripts/control-plane.sh" "$verb" 2>&1 \
            | sed "s/^\[control-plane\]/[control-plane $i]/" >&2
        return "${PIPESTATUS[0]}"
    fi
}
# Start the pool side by side (built once first); every one must come up.
start_control_planes() {
    ((KB_CONTROL_PLANES > 0)) || { log "KB_NO_CLUSTER=1: no control plane"; return 0; }
    KB_ENV_DIR="$KB_ENV_DIR" KB_TOOLS="$KB_TOOLS" "$REPO_ROOT/scripts/control-plane.sh" build
    local i pids=() failed=0
    for ((i = 0; i < KB_CONTROL_PLANES; i++)); do
        control_plane "$i" start &
        pids+=("$!")
    done
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || { log "control plane $i did not start"; failed=1; }
    done
    ((failed == 0)) || die "the control planes did not all start (logs in $KB_ENV_DIR/kube*/logs)"
}
# Stop every control plane that has a state directory, however many the last start ran.
stop_control_planes() {
    local d i
    for d in "$KB_ENV_DIR"/kube "$KB_ENV_DIR"/kube-*; do
        [[ -d "$d/run" ]] || continue
        KB_KUBE_DIR="$d" KB_ENV_DIR="$KB_ENV_DIR" KB_TOOLS="$KB_TOOLS" "$REPO_ROOT/scripts/control-plane.sh" stop
    done
}

# ------------------------------------------------------------------ commands
cmd_start() {
    local t0=$SECONDS
    need_tools
    mkdir -p "$RUN_DIR" "$LOG_DIR" "$PLAIN_DIR" "$TLS_DIR" "$TOKEN_DIR" "$HARBOR_DIR" "$REFERRERS_DIR"
    make_pki
    make_token_pki
    make_htpasswd
    write_token_users
    write_harbor_state
    write_registry_config plain
    write_registry_config tls
    write_registry_config token
    write_registry_config harborreg
    sync_helm_repo
    local s
    for s in "${SERVICES[@]}"; do
        start_service "$s"
    done
    push_images
    start_control_planes
    write_env_files
    log "ready in $((SECONDS - t0))s: kube=$(python3 -c "import json,sys; print(' '.join(k['kube_server'] for k in json.load(open(sys.argv[1]))['kube_pool']) or 'none')" "$KB_ENV_DIR/env.json") plain=$HOST:$KB_PLAIN_PORT tls=$HOST:$KB_TLS_PORT token=$HOST:$KB_TOKEN_PORT (auth $KB_AUTH_PORT, cdn $KB_CDN_PORT) harbor=$HOST:$KB_HARBOR_PORT (http $KB_HARBOR_HTTP_PORT, registry $KB_HARBOR_REGISTRY_PORT) referrers=$HOST:$KB_REFERRERS_PORT helm=http://$HOST:$KB_HELM_PORT/"
    log "env: $KB_ENV_DIR/env.json, $KB_ENV_DIR/env.sh"
}

cmd_stop() {
    local s
    stop_control_planes
    for s in "${SERVICES[@]}"; do
        stop_service "$s"
    done
    log "stopped"
}

cmd_status() {
    local s pid port state rc=0
    for s in "${SERVICES[@]}"; do
        pid="$(running_pid "$s")"
        port="$(port_of "$s")"
        if [[ -z "$pid" ]]; then
            state="stopped"
            rc=3
        elif healthy "$s"; then
            state="running (pid $pid), healthy"
        else
            state="running (pid $pid), NOT healthy"
            [[ $rc -eq 3 ]] || rc=1
        fi
        printf '%-9s %s:%-5s %s\n' "$s" "$HOST" "$port" "$state"
    done
    local kube_rc i
    for ((i = 0; i < KB_CONTROL_PLANES; i++)); do
        echo "control plane $i ($(kube_dir "$i")):"
        kube_rc=0
        control_plane "$i" status || kube_rc=$?
        if ((kube_rc == 3)); then
            rc=3
        elif ((kube_rc != 0)) && ((rc != 3)); then
            rc=1
        fi
    done
    if [[ -f "$MARKER" ]]; then
        echo "images: pushed (marker $MARKER)"
    else
        echo "images: not pushed"
    fi
    [[ -f "$KB_ENV_DIR/env.json" ]] && echo "env:    $KB_ENV_DIR/env.json"
    return "$rc"
}

# one start/stop at a time per env dir
lock() {
    exec 9>"$KB_ENV_DIR/.lock"
    flock -w 120 9 || die "another scripts/test-env.sh holds $KB_ENV_DIR/.lock"
}

case "${1:-}" in
    start) lock; cmd_start ;;
    stop) lock; cmd_stop ;;
    restart) lock; cmd_stop; cmd_start ;;
    status) cmd_status ;;
    *)
        echo "usage: $0 start|stop|status|restart" >&2
        exit 2
        ;;
esac
