#!/usr/bin/env bash
# A real Kubernetes control plane for the koord-bundle tests: etcd, kube-apiserver and
# kube-controller-manager, built from the Go module proxy (tests/control-plane/go.mod pins them:
# k8s.io/kubernetes v1.36.3, and the etcd server that module requires, v3.6.8) and run on
# 127.0.0.1 with client certificates made by openssl, RBAC, and a service-account key pair.
#
#   scripts/control-plane.sh build    # once: cached in $KB_TOOLS/control-plane, keyed by go.mod/go.sum
#   scripts/control-plane.sh start    # idempotent: reuses a healthy running control plane
#   scripts/control-plane.sh stop
#   scripts/control-plane.sh status   # 0 all healthy, 3 one stopped, 1 one unhealthy
#
# No kube-scheduler and no kubelet: Deployments make ReplicaSets and Pods (the controller
# manager), but no Pod is ever scheduled or runs. Tests that need a Pod's status write it as a
# kubelet would (the status subresource).
#
# Environment (all optional):
#   KB_ENV_DIR       state dir (default <repo>/target/test-env); the cluster lives in $KB_ENV_DIR/kube
#   KB_TOOLS         where the binaries are built (default <repo>/.tools)
#   KB_ETCD_PORT     etcd client port (default 15010; the peer port is the next one)
#   KB_KUBE_PORT     kube-apiserver's secure port (default 15012)
#   KB_KCM_PORT      kube-controller-manager's secure port (default 15013)
#   KB_KUBE_DIR      this control plane's state (default $KB_ENV_DIR/kube): scripts/test-env.sh
#                    runs a pool of them, each with a directory and ports of its own
#
# Writes $KB_ENV_DIR/kube/admin.kubeconfig (system:masters, client certificate) and
# $KB_ENV_DIR/kube/env.json (what scripts/test-env.sh merges into the tests' env.json).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KB_ENV_DIR="${KB_ENV_DIR:-$REPO_ROOT/target/test-env}"
KB_TOOLS="${KB_TOOLS:-$REPO_ROOT/.tools}"
KB_ETCD_PORT="${KB_ETCD_PORT:-15010}"
KB_KUBE_PORT="${KB_KUBE_PORT:-15012}"
KB_KCM_PORT="${KB_KCM_PORT:-15013}"
HOST=127.0.0.1
SRC="$REPO_ROOT/tests/control-plane"

mkdir -p "$KB_ENV_DIR" "$KB_TOOLS"
KB_ENV_DIR="$(cd "$KB_ENV_DIR" && pwd)"
[[ -z "${KB_KUBE_DIR:-}" ]] || { mkdir -p "$KB_KUBE_DIR" && KB_KUBE_DIR="$(cd "$KB_KUBE_DIR" && pwd)"; }
KB_TOOLS="$(cd "$KB_TOOLS" && pwd)"
BIN="$KB_TOOLS/control-plane"
DIR="${KB_KUBE_DIR:-$KB_ENV_DIR/kube}"
PKI="$DIR/pki"
RUN="$DIR/run"
LOGS="$DIR/logs"
COMPONENTS=(etcd kube-apiserver kube-controller-manager)

log() { printf '[control-plane] %s\n' "$*" >&2; }
die() { printf '[control-plane] ERROR: %s\n' "$*" >&2; exit 1; }

# ------------------------------------------------------------------ build
# The key of a build: the pinned module graph, the mains, and the Go that built them.
build_key() {
    {
        cat "$SRC/go.mod" "$SRC/go.sum"
        cat "$SRC"/*/main.go "${BASH_SOURCE[0]}"
        go version
    } | sha256sum | cut -d' ' -f1
}

all_built() {
    local c
    for c in "${COMPONENTS[@]}"; do
        [[ -x "$BIN/$c" ]] || return 1
    done
}

cmd_build() {
    command -v go >/dev/null 2>&1 || die "go is needed to build the control plane (Go 1.26: https://go.dev/dl/)"
    local key
    key="$(build_key)"
    if [[ -f "$BIN/build.key" && "$(cat "$BIN/build.key")" == "$key" ]] && all_built; then
        return 0
    fi
    mkdir -p "$BIN"
    rm -f "$BIN/build.key"
    log "building ${COMPONENTS[*]} from the Go module proxy (tests/control-plane/go.mod; a cold build takes about 6 minutes on 2 cores, a warm one seconds)"
    local t0=$SECONDS c v
    (cd "$SRC" && go mod download) || die "go mod download failed in $SRC (is the Go module proxy reachable? GOPROXY=$(go env GOPROXY))"
    # The version the API server reports (/version), set as Kubernetes' own build does
    # (hack/lib/version.sh): without it, it says v0.0.0-master.
    v="$(cd "$SRC" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
    [[ "$v" =~ ^v([0-9]+)\.([0-9]+)\. ]] || die "cannot read the k8s.io/kubernetes version from $SRC/go.mod"
    local ldflags="-s -w" in
    for in in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $in.gitVersion=$v -X $in.gitMajor=${BASH_REMATCH[1]} -X $in.gitMinor=${BASH_REMATCH[2]}"
        ldflags+=" -X $in.gitTreeState=clean -X $in.buildDate=1970-01-01T00:00:00Z"
    done
    for c in "${COMPONENTS[@]}"; do
        (cd "$SRC" && CGO_ENABLED=0 go build -trimpath -ldflags="$ldflags" -o "$BIN/$c.new" "./$c") \
            || die "go build ./$c failed in $SRC"
        mv -f "$BIN/$c.new" "$BIN/$c"
    done
    echo "$key" >"$BIN/build.key"
    log "built in $((SECONDS - t0))s: $("$BIN/kube-apiserver" --version 2>&1), etcd $("$BIN/etcd" --version 2>&1 | awk '/etcd Version/{print $3}')"
}

# ------------------------------------------------------------------ PKI
# cert <name> <CN> <O or empty> <extensions>: a key and certificate issued by the cluster CA.
cert() {
    local name="$1" cn="$2" org="$3" ext="$4" subj="/CN=$2"
    [[ -n "$org" ]] && subj="/O=$org/CN=$cn"
    printf '%s\n' "$ext" >"$PKI/$name.ext"
    openssl req -newkey rsa:2048 -nodes -sha256 -subj "$subj" \
        -keyout "$PKI/$name.key" -out "$PKI/$name.csr" >>"$PKI/openssl.log" 2>&1 \
        || die "openssl: the key of $cn"
    openssl x509 -req -sha256 -days 3650 -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
        -CAcreateserial -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" >>"$PKI/openssl.log" 2>&1 \
        || die "openssl: the certificate of $cn"
    chmod 600 "$PKI/$name.key"
}

make_pki() {
    if [[ -s "$PKI/ca.crt" && -s "$PKI/admin.key" && -s "$PKI/sa.key" ]] \
        && openssl x509 -in "$PKI/apiserver.crt" -noout -checkend 86400 >/dev/null 2>&1; then
        return 0
    fi
    log "creating the cluster CA, serving and client certificates and the service-account key in $PKI"
    rm -rf "$PKI"
    mkdir -p "$PKI"
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 -subj "/CN=koord-bundle test cluster CA" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -keyout "$PKI/ca.key" -out "$PKI/ca.crt" >>"$PKI/openssl.log" 2>&1 || die "openssl: the cluster CA"
    local server="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    local client="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
    cert apiserver kube-apiserver "" "$server"
    cert admin kubernetes-admin system:masters "$client"
    cert kcm system:kube-controller-manager "" "$client"
    openssl genrsa -out "$PKI/sa.key" 2048 >>"$PKI/openssl.log" 2>&1 || die "openssl: the service-account key"
    openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" >>"$PKI/openssl.log" 2>&1 || die "openssl: the service-account public key"
    chmod 600 "$PKI/ca.key" "$PKI/sa.key"
    stop_all
}

# kubeconfig <file> <user> <cert name>: a kubeconfig with the client certificate embedded.
kubeconfig() {
    local tmp="$1.tmp"
    cat >"$tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: koord-bundle-test
  cluster:
    server: https://$HOST:$KB_KUBE_PORT
    certificate-authority-data: $(base64 -w0 <"$PKI/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 <"$PKI/$3.crt")
    client-key-data: $(base64 -w0 <"$PKI/$3.key")
contexts:
- name: koord-bundle-test
  context: {cluster: koord-bundle-test, user: $2}
current-context: koord-bundle-test
EOF
    chmod 600 "$tmp"
    mv -f "$tmp" "$1"
}

# ------------------------------------------------------------------ processes
pidfile() { echo "$RUN/$1.pid"; }
alive() {
    local st
    st="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || true)"
    [[ -n "$st" && "$st" != Z && "$st" != X ]]
}
running_pid() {
    local pf pid cmdline
    pf="$(pidfile "$1")"
    [[ -f "$pf" ]] || return 0
    pid="$(cat "$pf" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" || return 0
    # The program it runs, symlinks resolved on both sides: KB_TOOLS may name the tools through
    # <repo>/.tools (a link to the cache) in one shell and directly in another, and a stop that
    # took the same process for a stranger dropped its pid file and left it running.
    cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
    [[ -n "$cmdline" && "$(readlink -f "${cmdline%% *}" 2>/dev/null)" == "$(readlink -f "$BIN/$1" 2>/dev/null)" ]] && echo "$pid"
    return 0
}
port_open() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

healthy() {
    case "$1" in
        etcd)
            curl -sf --max-time 3 "http://$HOST:$KB_ETCD_PORT/health" 2>/dev/null | grep -q '"health":"true"'
            ;;
        kube-apiserver)
            [[ "$(curl -s --max-time 3 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
                "https://$HOST:$KB_KUBE_PORT/readyz" 2>/dev/null || true)" == ok ]]
            ;;
        kube-controller-manager)
            [[ "$(curl -sk --max-time 3 "https://$HOST:$KB_KCM_PORT/healthz" 2>/dev/null || true)" == ok ]]
            ;;
    esac
}

port_of() {
    case "$1" in
        etcd) echo "$KB_ETCD_PORT" ;;
        kube-apiserver) echo "$KB_KUBE_PORT" ;;
        kube-controller-manager) echo "$KB_KCM_PORT" ;;
    esac
}

args_of() {
    case "$1" in
        etcd)
            printf '%s\n' --name koord-bundle-test --data-dir "$DIR/etcd" \
                --listen-client-urls "http://$HOST:$KB_ETCD_PORT" --advertise-client-urls "http://$HOST:$KB_ETCD_PORT" \
                --listen-peer-urls "http://$HOST:$((KB_ETCD_PORT + 1))" \
                --initial-advertise-peer-urls "http://$HOST:$((KB_ETCD_PORT + 1))" \
                --initial-cluster "koord-bundle-test=http://$HOST:$((KB_ETCD_PORT + 1))" \
                --listen-metrics-urls "" --quota-backend-bytes $((2 << 30)) \
                --unsafe-no-fsync --log-level warn
            ;;
        kube-apiserver)
            printf '%s\n' --etcd-servers "http://$HOST:$KB_ETCD_PORT" \
                --bind-address "$HOST" --advertise-address "$HOST" --secure-port "$KB_KUBE_PORT" \
                --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
                --client-ca-file "$PKI/ca.crt" \
                --token-auth-file "$DIR/tokens.csv" \
                --authorization-mode Node,RBAC \
                --service-account-issuer https://kubernetes.default.svc.cluster.local \
                --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
                --service-cluster-ip-range 10.96.0.0/16 \
                --allow-privileged=true \
                --audit-policy-file "$DIR/audit-policy.yaml" --audit-log-path "$DIR/audit.log" \
                --audit-log-format json --audit-log-maxsize 0 --audit-log-mode blocking \
                --profiling=false --v=1
            ;;
        kube-controller-manager)
            printf '%s\n' --kubeconfig "$DIR/kcm.kubeconfig" \
                --authentication-kubeconfig "$DIR/kcm.kubeconfig" --authorization-kubeconfig "$DIR/kcm.kubeconfig" \
                --bind-address "$HOST" --secure-port "$KB_KCM_PORT" \
                --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
                --use-service-account-credentials=true --leader-elect=false \
                --controllers '*,-nodeipam,-nodelifecycle,-ttl,-bootstrapsigner,-tokencleaner,-csrsigning,-persistentvolume-binder,-attachdetach,-route,-service,-cloud-node-lifecycle' \
                --profiling=false --v=1
            ;;
    esac
}

start_one() {
    local c="$1" pid lf port
    pid="$(running_pid "$c")"
    if [[ -n "$pid" ]]; then
        if healthy "$c"; then
            log "$c: reusing pid $pid"
            return 0
        fi
        log "$c: pid $pid is not healthy, restarting"
        stop_one "$c"
    fi
    port="$(port_of "$c")"
    if port_open "$port"; then
        die "$c: port $HOST:$port is already in use by another process; stop it or set the KB_*_PORT of scripts/control-plane.sh"
    fi
    lf="$LOGS/$c.log"
    local -a args
    mapfile -t args < <(args_of "$c")
    printf '\n===== %s start\n' "$(date -u +%FT%TZ)" >>"$lf"
    setsid "$BIN/$c" "${args[@]}" >>"$lf" 2>&1 </dev/null 9>&- &
    pid=$!
    echo "$pid" >"$(pidfile "$c")"
    local i t0=$SECONDS
    for ((i = 0; i < 600; i++)); do
        if healthy "$c"; then
            log "$c: started pid $pid on $HOST:$port ($((SECONDS - t0))s)"
            return 0
        fi
        alive "$pid" || break
        sleep 0.1
    done
    log "$c did not become healthy; last lines of $lf:"
    awk '/^===== /{n=0; delete b} {b[n++]=$0} END{s=(n>40?n-40:0); for(i=s;i<n;i++) print substr(b[i],1,400)}' "$lf" >&2 || true
    stop_one "$c"
    die "$c failed to start"
}

stop_one() {
    local c="$1" pid
    pid="$(running_pid "$c")"
    if [[ -n "$pid" ]]; then
        kill "$pid" 2>/dev/null || true
        local i
        for ((i = 0; i < 200; i++)); do
            alive "$pid" || break
            sleep 0.05
        done
        if alive "$pid"; then
            log "$c: pid $pid ignored SIGTERM, sending SIGKILL"
            kill -9 "$pid" 2>/dev/null || true
        fi
        log "$c: stopped pid $pid"
    fi
    rm -f "$(pidfile "$1")"
}

stop_all() {
    local i
    for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
        stop_one "${COMPONENTS[$i]}"
    done
}

# The static tokens of the test users (tests/it/cluster.rs gives them RBAC of their own):
# `limited` has only what its test binds to it; `nobody` has nothing; `admin` is in
# system:masters (for kubeconfigs whose credential is a token: exec plugins, lists).
write_tokens() {
    cat >"$DIR/tokens.csv.new" <<EOF
koord-test-limited-token,koord-test-limited,1001
koord-test-nobody-token,koord-test-nobody,1002
koord-test-admin-token,koord-test-admin,1003,"system:masters"
EOF
    if ! cmp -s "$DIR/tokens.csv.new" "$DIR/tokens.csv" 2>/dev/null; then
        mv -f "$DIR/tokens.csv.new" "$DIR/tokens.csv"
        stop_one kube-apiserver
    else
        rm -f "$DIR/tokens.csv.new"
    fi
}

# The audit log is the tests' record of the requests the API server saw (who, with which
# user agent, which verb on which object, the answer's code; never a body): what the
# controller manager and the API server itself do is left out.
write_audit_policy() {
    cat >"$DIR/audit-policy.yaml.new" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  users: ["system:kube-controller-manager", "system:apiserver"]
- level: None
  userGroups: ["system:serviceaccounts:kube-system", "system:nodes"]
- level: None
  nonResourceURLs: ["/readyz*", "/healthz*", "/livez*"]
- level: Metadata
EOF
    if ! cmp -s "$DIR/audit-policy.yaml.new" "$DIR/audit-policy.yaml" 2>/dev/null; then
        mv -f "$DIR/audit-policy.yaml.new" "$DIR/audit-policy.yaml"
        stop_one kube-apiserver
    else
        rm -f "$DIR/audit-policy.yaml.new"
    fi
}

write_env() {
    python3 - "$DIR" "$HOST:$KB_KUBE_PORT" "$("$BIN/kube-apiserver" --version 2>&1 | awk '{print $2}')" \
        "$("$BIN/etcd" --version 2>&1 | awk '/etcd Version/{print $3}')" <<'EOF'
import json, os, sys
d, server, version, etcd = sys.argv[1:5]
out = {
    "kube_server": "https://" + server,
    "kube_admin_kubeconfig": os.path.join(d, "admin.kubeconfig"),
    "kube_ca_file": os.path.join(d, "pki", "ca.crt"),
    "kube_admin_cert": os.path.join(d, "pki", "admin.crt"),
    "kube_admin_key": os.path.join(d, "pki", "admin.key"),
    "kube_version": version,
    "etcd_version": etcd,
    "kube_lock": os.path.join(d, "cluster.lock"),
    "kube_audit_log": os.path.join(d, "audit.log"),
    "kube_tokens": {"limited": "koord-test-limited-token", "nobody": "koord-test-nobody-token",
                    "admin": "koord-test-admin-token"},
}
tmp = os.path.join(d, "env.json.tmp")
with open(tmp, "w") as f:
    json.dump(out, f, indent=2)
os.replace(tmp, os.path.join(d, "env.json"))
EOF
}

cmd_start() {
    local t0=$SECONDS c
    cmd_build
    mkdir -p "$RUN" "$LOGS" "$DIR/etcd"
    make_pki
    write_tokens
    write_audit_policy
    kubeconfig "$DIR/admin.kubeconfig" kubernetes-admin admin
    kubeconfig "$DIR/kcm.kubeconfig" system:kube-controller-manager kcm
    for c in "${COMPONENTS[@]}"; do
        start_one "$c"
    done
    write_env
    log "ready in $((SECONDS - t0))s: https://$HOST:$KB_KUBE_PORT ($DIR/admin.kubeconfig)"
}

cmd_status() {
    local c pid rc=0
    for c in "${COMPONENTS[@]}"; do
        pid="$(running_pid "$c")"
        if [[ -z "$pid" ]]; then
            printf '%-24s stopped\n' "$c"
            rc=3
        elif healthy "$c"; then
            printf '%-24s running (pid %s), healthy\n' "$c" "$pid"
        else
            printf '%-24s running (pid %s), NOT healthy\n' "$c" "$pid"
            [[ $rc -eq 3 ]] || rc=1
        fi
    done
    return "$rc"
}

case "${1:-}" in
    build) cmd_build ;;
    start) cmd_start ;;
    stop) stop_all ;;
    status) cmd_status ;;
    *)
        echo "usage: $0 build|start|stop|status" >&2
        exit 2
        ;;
esac
