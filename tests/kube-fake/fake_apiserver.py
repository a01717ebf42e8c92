#!/usr/bin/env python3
"""A FAKE, read-only Kubernetes API server, kept only for the few answers of koord-bundle's
tests that the real kube-apiserver of the test environment cannot be made to give (README.md
beside this file): endless LIST pages, an old server version, plain HTTP, a kubelet /configz
through the node proxy. It is not Kubernetes.

    python3 fake_apiserver.py --state-dir DIR [--port 0] [--tls] [--token T]
                              [--seed-dir FIXTURE_DIR]... [--pages RULE_JSON]

It writes DIR/addr (the base URL, written last, once it listens), DIR/kubeconfig (pointing at
it), DIR/ca.crt with --tls, and one JSON line per request to DIR/requests.jsonl (written before
the answer is sent).

--pages '{"path_regex": ..., "mode": "cycle"|"fresh", "tokens": [...], "pad_bytes": N}': LIST
answers of matching paths never end: each carries a continue token (the tokens in a circle, or
a new one every time) and N bytes of padding (a hostile server, for the client's list bounds).

--objects FILE: a JSON list of objects (Secrets, Deployments, Pods...) served as they are.

--hostile-pods '{"pages": P, "per_page": N, "image_bytes": B}': every LIST of pods in a
namespace, whatever its selector, is P pages of N pods, each pod new (its own name), its one
container's image and imageID strings of B bytes (a hostile server, for verify --cluster).

Python 3 standard library, and openssl for --tls.
"""

import argparse
import base64
import json
import os
import re
import ssl
import subprocess
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# The resources it serves, read-only: (group, version, plural) -> (kind, namespaced). It holds
# only what the fixtures give (nodes) and the four namespaces every cluster has; LISTs of the
# others are empty and GETs of them 404.
RESOURCES = {
    ("", "v1", "namespaces"): ("Namespace", False),
    ("", "v1", "nodes"): ("Node", False),
    ("", "v1", "secrets"): ("Secret", True),
    ("", "v1", "pods"): ("Pod", True),
    ("apps", "v1", "deployments"): ("Deployment", True),
    ("apps", "v1", "daemonsets"): ("DaemonSet", True),
    ("batch", "v1", "jobs"): ("Job", True),
    ("apiextensions.k8s.io", "v1", "customresourcedefinitions"): ("CustomResourceDefinition", False),
}
NAMESPACES = ("default", "kube-node-lease", "kube-public", "kube-system")

OBJECTS = {}  # (group, plural, namespace or "", name) -> object
CONFIGZ = {}  # node name -> kubelet /configz answer
VERSION = {}  # the /version answer
OPTS = None
LOG_LOCK = threading.Lock()
PAGES_SERVED = [0]


class ApiError(Exception):
    def __init__(self, code, reason, message, details=None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def status_body(e):
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": e.message, "reason": e.reason, "code": e.code}
    if e.details:
        body["details"] = e.details
    return body


def no_such_resource():
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def not_found(group, plural, name):
    what = f"{plural}.{group}" if group else plural
    details = {"name": name, "kind": plural}
    if group:
        details["group"] = group
    return ApiError(404, "NotFound", f'{what} "{name}" not found', details)


def api_get(path, query):
    """GET of the API: /version, one object, a LIST, or a node's kubelet /configz."""
    if path == "/version":
        if not VERSION:
            raise no_such_resource()
        return VERSION
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise no_such_resource()
    ns = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        ns, rest = rest[1], rest[2:]
    if not rest or (group, version, rest[0]) not in RESOURCES:
        raise no_such_resource()
    plural, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), rest[2:]
    kind, namespaced = RESOURCES[(group, version, plural)]
    api_version = f"{group}/{version}" if group else version
    if ns is not None and not namespaced:
        raise no_such_resource()
    if sub:
        # The kubelet's /configz through the API server's node proxy, from the fixture.
        if (plural, sub) == ("nodes", ["proxy", "configz"]) and name in CONFIGZ:
            if ("", "nodes", "", name) not in OBJECTS:
                raise not_found(group, plural, name)
            return CONFIGZ[name]
        raise no_such_resource()
    if query.get("watch", [""])[0] in ("1", "true"):
        raise ApiError(405, "MethodNotAllowed", "this fake API server does not implement watch")
    if name:
        obj = OBJECTS.get((group, plural, ns or "", name))
        if obj is None:
            raise not_found(group, plural, name)
        return {"kind": kind, "apiVersion": api_version, **obj}  # list items carry neither
    if OPTS.hostile_pods and plural == "pods" and ns is not None:
        return hostile_pods(ns, query)
    items = [o for (g, p, n, _), o in sorted(OBJECTS.items())
             if (g, p) == (group, plural) and ns in (None, n)]
    if items and query.get("fieldSelector"):
        raise ApiError(400, "BadRequest", "this fake API server does not apply field selectors")
    selector = query.get("labelSelector", [""])[0]
    if items and selector:
        terms = [t.split("=", 1) for t in selector.split(",")]
        if any(len(t) != 2 or not t[0] or t[0].endswith("!") for t in terms):
            raise ApiError(400, "BadRequest", "this fake API server applies only k=v label selectors")
        items = [o for o in items
                 if all((o.get("metadata", {}).get("labels") or {}).get(k) == v.lstrip("=") for k, v in terms)]
    return {"kind": f"{kind}List", "apiVersion": api_version,
            "metadata": {"resourceVersion": "1000"}, "items": items}


HOSTILE_PODS_SERVED = [0]
HOSTILE_IMAGE = [""]


def hostile_pods(ns, query):
    """A page of --hostile-pods: N new pods with B-byte image strings, and a continue token
    until P pages were served for this listing (the token counts the pages)."""
    rule = OPTS.hostile_pods
    token = query.get("continue", [""])[0]
    page = int(token.split("-")[-1]) if token else 0
    items = []
    for _ in range(int(rule["per_page"])):
        HOSTILE_PODS_SERVED[0] += 1
        n = HOSTILE_PODS_SERVED[0]
        items.append({"metadata": {"name": f"hostile-{n}", "namespace": ns},
                      "spec": {"containers": [{"name": "c", "image": HOSTILE_IMAGE[0]}]},
                      "status": {"containerStatuses": [{"name": "c", "image": HOSTILE_IMAGE[0],
                                                        "imageID": HOSTILE_IMAGE[0], "ready": True,
                                                        "restartCount": 0}]}})
    meta = {"resourceVersion": "1000"}
    if page + 1 < int(rule["pages"]):
        meta["continue"] = f"hostile-pods-{HOSTILE_PODS_SERVED[0]}-{page + 1}"
    return {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-kube-apiserver"
    sys_version = ""

    def log_message(self, fmt, *args):  # the JSON request log replaces the default one
        pass

    def do_GET(self):
        self.answer("GET")

    def do_POST(self):
        self.answer("POST")

    def do_PUT(self):
        self.answer("PUT")

    def do_PATCH(self):
        self.answer("PATCH")

    def do_DELETE(self):
        self.answer("DELETE")

    def answer(self, method):
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        authorized = OPTS.token is None or self.headers.get("Authorization", "") == f"Bearer {OPTS.token}"
        entry = {"time": time.time(), "method": method, "path": url.path, "query": url.query,
                 "authorized": authorized}
        pad = 0
        try:
            if not authorized:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", "this fake API server is read-only")
            code, out = 200, api_get(url.path, query)
            pad = self.hostile_page(url.path, out, entry)
        except ApiError as e:
            code, out = e.code, status_body(e)
            entry["message"] = e.message
        entry["status"] = code
        with LOG_LOCK, open(os.path.join(OPTS.state_dir, "requests.jsonl"), "a") as f:
            f.write(json.dumps(entry) + "\n")
        data = json.dumps(out).encode()
        if pad:
            data = data[:-1] + b', "padding": "' + b"x" * pad + b'"}'
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # a client that stops reading an oversized page

    def hostile_page(self, path, out, entry):
        """A LIST answer of a --pages path: a continue token that never ends the list."""
        rule = OPTS.pages
        if not rule or not out.get("kind", "").endswith("List") or not re.search(rule["path_regex"], path):
            return 0
        PAGES_SERVED[0] += 1
        n = PAGES_SERVED[0]
        if rule.get("mode") == "fresh":
            token = f"fresh-{n}"
        else:
            tokens = rule.get("tokens") or ["A", "B"]
            token = tokens[(n - 1) % len(tokens)]
        out["metadata"]["continue"] = token  # a LIST answer is built afresh for each request
        entry["continueGiven"] = token
        return int(rule.get("pad_bytes", 0))


def seed_dir(d):
    """From a fixture directory of tests/fixtures/kube/: version.json (the /version answer),
    nodes.json (a NodeList), configz/<node>.json (kubelet /configz answers). Other files there
    are for the real control plane and the unit tests, not read here."""
    def load(p):
        with open(p) as f:
            return json.load(f)

    global VERSION
    p = os.path.join(d, "version.json")
    if os.path.exists(p):
        VERSION = load(p)
    p = os.path.join(d, "nodes.json")
    if os.path.exists(p):
        for n in load(p).get("items", []):
            OBJECTS[("", "nodes", "", n["metadata"]["name"])] = n
    p = os.path.join(d, "configz")
    if os.path.isdir(p):
        for c in sorted(os.listdir(p)):
            CONFIGZ[c[:-len(".json")]] = load(os.path.join(p, c))


def make_tls(state_dir):
    """A throw-away CA and a server certificate for 127.0.0.1/localhost (openssl)."""
    ca_key, ca_crt = os.path.join(state_dir, "ca.key"), os.path.join(state_dir, "ca.crt")
    key, csr, crt = (os.path.join(state_dir, n) for n in ("server.key", "server.csr", "server.crt"))
    ext = os.path.join(state_dir, "server.ext")
    run = lambda *a: subprocess.run(a, check=True, capture_output=True)
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
        "/CN=fake-kube-apiserver-ca", "-keyout", ca_key, "-out", ca_crt)
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", csr)
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    run("openssl", "x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial",
        "-days", "2", "-out", crt, "-extfile", ext)
    return ca_crt, crt, key


def main():
    global OPTS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--tls", action="store_true", help="serve HTTPS with a throw-away CA (DIR/ca.crt)")
    ap.add_argument("--token", help="bearer token every request must carry (default: none needed)")
    ap.add_argument("--seed-dir", action="append", default=[], help="fixture directory to load")
    ap.add_argument("--pages", type=json.loads, help="endless LIST pages (see above)")
    ap.add_argument("--objects", help="JSON file: a list of objects to serve")
    ap.add_argument("--hostile-pods", type=json.loads, help="pods of huge images (see above)")
    OPTS = ap.parse_args()
    os.makedirs(OPTS.state_dir, exist_ok=True)
    open(os.path.join(OPTS.state_dir, "requests.jsonl"), "w").close()
    for ns in NAMESPACES:
        OBJECTS[("", "namespaces", "", ns)] = {
            "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}
    for d in OPTS.seed_dir:
        seed_dir(d)
    if OPTS.objects:
        with open(OPTS.objects) as f:
            for o in json.load(f):
                api = o["apiVersion"]
                group = api.rsplit("/", 1)[0] if "/" in api else ""
                plural = next(p for (g, _, p), (k, _) in RESOURCES.items() if g == group and k == o["kind"])
                m = o["metadata"]
                OBJECTS[(group, plural, m.get("namespace", ""), m["name"])] = o
    if OPTS.hostile_pods:
        HOSTILE_IMAGE[0] = "evil.example/" + "x" * int(OPTS.hostile_pods["image_bytes"]) + ":1"
    server = ThreadingHTTPServer(("127.0.0.1", OPTS.port), Handler)
    server.daemon_threads = True
    cluster = {}
    scheme = "http"
    if OPTS.tls:
        ca, crt, key = make_tls(OPTS.state_dir)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(crt, key)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        scheme = "https"
        with open(ca, "rb") as f:
            cluster["certificate-authority-data"] = base64.b64encode(f.read()).decode()
    url = f"{scheme}://127.0.0.1:{server.server_address[1]}"
    cluster["server"] = url
    kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "fake",
                  "clusters": [{"name": "fake", "cluster": cluster}],
                  "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake-admin"}}],
                  "users": [{"name": "fake-admin", "user": {"token": OPTS.token} if OPTS.token else {}}]}
    with open(os.path.join(OPTS.state_dir, "kubeconfig"), "w") as f:
        json.dump(kubeconfig, f, indent=1)  # JSON is YAML
    tmp = os.path.join(OPTS.state_dir, "addr.tmp")
    with open(tmp, "w") as f:
        f.write(url + "\n")
    os.rename(tmp, os.path.join(OPTS.state_dir, "addr"))
    print(f"fake-kube-apiserver listening on {url} (state dir {OPTS.state_dir})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
