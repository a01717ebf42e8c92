#!/usr/bin/env python3
"""The helpers that make a CNCF distribution 2.8 registry behave like Docker Hub, ghcr.io,
Aliyun ACR or Harbor in the test environment (started by scripts/test-env.sh):

  auth  A Docker token service (distribution's token spec). `GET /token?service=S&scope=...`
        with HTTP basic auth for a user, without it for anonymous callers; `POST /token`
        with `grant_type=refresh_token` (the OAuth2 flow of identity tokens: ACR, Harbor robot
        accounts). Answers `{"token", "access_token", "expires_in", "issued_at"}`: an RS256 JWT
        whose header carries `x5c` (the signer certificate, which chains to the registry's
        `rootcertbundle`) and whose claims are iss, sub, aud, exp, nbf, iat, jti, access.
        Anonymous callers get pull only; each user gets the actions its role allows (push
        users: pull and push; pull users: pull), always a subset of what was asked. Bad
        credentials: 401.

  cdn   A blob server standing in for S3/R2/OSS behind distribution's `redirect` storage
        middleware: serves the registry's storage directory read-only with Range support, and
        answers 400 to any request that carries an `Authorization` header (as S3 and OSS do:
        "only one auth mechanism allowed").

  harbor  A Harbor stand-in in front of a distribution 2.8 whose `auth: token` realm is this
        server's `/service/token` (Harbor serves `/v2/`, `/service/token` and `/api/v2.0/` on one
        host:port; docker-registry cannot, so this is the reverse proxy Harbor's nginx is):
        `/v2/` is passed to the registry (500 for a one-component repository, as Harbor
        answers: it has no project); `/service/token` grants, of what was asked, only what the
        caller's role allows inside an existing project (Developer and up: pull, push; Guest:
        pull; a robot account: its permissions; anonymous: pull on public projects; nothing
        outside a project, so a push there meets the registry's own 401); `GET
        /api/v2.0/systeminfo` anonymously with `harbor_version`; with basic auth, `HEAD
        /api/v2.0/projects?project_name=P` (200/404), `GET /api/v2.0/projects?name=` (fuzzy, as
        Harbor), `GET /api/v2.0/projects/{name|id}`, `POST /api/v2.0/projects` (201; 400 for a
        name outside Harbor's rule; 403 for robot accounts, and for users under
        `project_creation_restriction: adminonly`; 409 if it exists). Users, robot accounts
        (`robot$NAME`, `robot$PROJECT+NAME`) and the projects of the start come from a JSON
        file; projects created through the API live until it stops. HTTPS on --port, and with
        --http-port a plain-HTTP entrance to the same state (helm 3 speaks plain HTTP to
        loopback registries). `GET /koord-test/stats` counts what it saw.

auth and cdn count what they see and serve the counts as JSON on `GET /stats` (`?prefix=P` limits the
token counts to requests whose scopes name a repository under P). For tests that stop a load
half-way, `GET /control?slow_prefix=P&delay_ms=N` makes the token service answer requests for
repositories under P N ms late. Python standard library plus
`cryptography` (Debian: python3-cryptography) for the RSA signature.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import secrets
import ssl
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def log(msg: str) -> None:
    print(f"[token-registry] {msg}", file=sys.stderr, flush=True)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def serve(handler_cls, host: str, port: int, tls_cert: str | None, tls_key: str | None) -> None:
    httpd = Server((host, port), handler_cls)
    if tls_cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(tls_cert, tls_key)
        # Handshake in the handler's thread, not in the accept loop.
        httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True, do_handshake_on_connect=False)
    log(f"{handler_cls.__name__} listening on {host}:{port} ({'https' if tls_cert else 'http'})")
    httpd.serve_forever()


class Base(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "koord-test"

    def setup(self):
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.settimeout(30)
            self.connection.do_handshake()

    def log_message(self, fmt, *args):  # access log on stderr, one line
        sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))

    def send_json(self, status: int, obj, extra: dict | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def read_body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(min(n, 1 << 20)) if n > 0 else b""


# --------------------------------------------------------------------------- #
# token service
# --------------------------------------------------------------------------- #

class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.events: list[dict] = []
        self.counts: dict[str, int] = {}

    def add(self, kind: str, names: list[str] | None = None, **extra) -> None:
        with self.lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            if names is not None:
                self.events.append({"kind": kind, "names": names, **extra})
                if len(self.events) > 200000:
                    del self.events[:100000]

    def snapshot(self, prefix: str | None) -> dict:
        with self.lock:
            if prefix is None:
                return dict(self.counts)
            out: dict[str, int] = {}
            for e in self.events:
                if any(n.startswith(prefix) for n in e["names"]):
                    out[e["kind"]] = out.get(e["kind"], 0) + 1
            return out


def make_signer(cfg: dict):
    """sign(sub, access) -> (RS256 JWT, ttl) with the signer key and its certificate in x5c."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding
    from cryptography import x509

    key = serialization.load_pem_private_key(Path(cfg["key"]).read_bytes(), password=None)
    certs = x509.load_pem_x509_certificates(Path(cfg["cert"]).read_bytes()) \
        if hasattr(x509, "load_pem_x509_certificates") else [x509.load_pem_x509_certificate(Path(cfg["cert"]).read_bytes())]
    x5c = [base64.b64encode(c.public_bytes(serialization.Encoding.DER)).decode() for c in certs]

    def sign(sub: str, access: list[dict]) -> tuple[str, int]:
        now = int(time.time())
        ttl = cfg["ttl"]
        header = {"typ": "JWT", "alg": "RS256", "x5c": x5c}
        claims = {
            "iss": cfg["issuer"], "sub": sub, "aud": cfg["service"],
            "exp": now + ttl, "nbf": now - 10, "iat": now,
            "jti": secrets.token_hex(16), "access": access,
        }
        signing_input = f"{b64url(json.dumps(header, separators=(',', ':')).encode())}." \
                        f"{b64url(json.dumps(claims, separators=(',', ':')).encode())}"
        sig = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{b64url(sig)}", ttl

    return sign


def make_auth_handler(cfg: dict):
    sign = make_signer(cfg)
    users: dict[str, tuple[str, str]] = cfg["users"]  # name -> (password, role)
    refresh: dict[str, str] = cfg["refresh"]  # refresh token -> user
    stats = Stats()
    # Test control: token requests naming a repository under a prefix wait this long (so a test
    # can stop a load half-way on a condition, not a timer).
    slow: dict[str, float] = {}
    slow_lock = threading.Lock()

    def delay_for(names: list[str]) -> None:
        with slow_lock:
            d = max((v for p, v in slow.items() if any(n.startswith(p) for n in names)), default=0.0)
        if d > 0:
            time.sleep(d)

    def grant(role: str | None, scopes: list[str]) -> tuple[list[dict], list[str]]:
        allowed = {"push": {"pull", "push", "delete"}, "pull": {"pull"}}.get(role or "", {"pull"})
        access, names = [], []
        for s in scopes:
            for one in s.split():
                parts = one.split(":")
                if len(parts) < 3:
                    continue
                typ, name, actions = parts[0], ":".join(parts[1:-1]), parts[-1].split(",")
                names.append(name)
                if typ == "registry":
                    acts = ["*"] if role == "push" and "*" in actions else []
                elif typ == "repository":
                    acts = [a for a in actions if a in allowed]
                else:
                    acts = []
                access.append({"type": typ, "name": name, "actions": acts})
        return access, names

    class AuthHandler(Base):
        def do_GET(self):
            url = urllib.parse.urlsplit(self.path)
            q = urllib.parse.parse_qs(url.query)
            if url.path == "/stats":
                prefix = q.get("prefix", [None])[0]
                return self.send_json(200, stats.snapshot(prefix))
            if url.path == "/control":
                prefix = q.get("slow_prefix", [""])[0]
                if prefix:
                    with slow_lock:
                        slow[prefix] = float(q.get("delay_ms", ["0"])[0]) / 1000.0
                return self.send_json(200, {"slow": slow})
            if url.path != "/token":
                return self.send_json(404, {"error": "not found"})
            if q.get("service", [cfg["service"]])[0] != cfg["service"]:
                return self.send_json(400, {"error": "unknown service"})
            scopes = q.get("scope", [])
            delay_for(grant(None, scopes)[1])
            auth = self.headers.get("Authorization")
            if auth:
                scheme, _, value = auth.partition(" ")
                try:
                    user, _, password = base64.b64decode(value).decode().partition(":")
                except Exception:  # noqa: BLE001
                    user, password = "", None
                entry = users.get(user)
                if scheme.lower() != "basic" or entry is None or entry[0] != password:
                    stats.add("refused", grant(None, scopes)[1], user=user)
                    return self.send_json(401, {"details": "incorrect username or password"},
                                          {"WWW-Authenticate": 'Basic realm="koord-test-token"'})
                access, names = grant(entry[1], scopes)
                stats.add("user_tokens", names, user=user)
                sub = user
            else:
                access, names = grant(None, scopes)
                stats.add("anonymous_tokens", names)
                sub = ""
            token, ttl = sign(sub, access)
            self.send_json(200, {"token": token, "access_token": token, "expires_in": ttl,
                                 "issued_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})

        def do_POST(self):
            url = urllib.parse.urlsplit(self.path)
            if url.path != "/token":
                return self.send_json(404, {"error": "not found"})
            form = urllib.parse.parse_qs(self.read_body().decode(errors="replace"))
            one = lambda k: form.get(k, [""])[0]  # noqa: E731
            scopes = one("scope").split()
            if one("grant_type") != "refresh_token" or one("service") != cfg["service"] or not one("client_id"):
                return self.send_json(400, {"error": "unsupported_grant_type"})
            delay_for(grant(None, scopes)[1])
            user = refresh.get(one("refresh_token"))
            if user is None:
                stats.add("refused_refresh", grant(None, scopes)[1])
                return self.send_json(401, {"error": "invalid_grant"})
            access, names = grant(users[user][1], scopes)
            stats.add("refresh_grants", names, user=user)
            token, ttl = sign(user, access)
            self.send_json(200, {"access_token": token, "expires_in": ttl, "scope": " ".join(scopes),
                                 "issued_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})

    return AuthHandler


# --------------------------------------------------------------------------- #
# blob server (CDN stand-in)
# --------------------------------------------------------------------------- #

def make_cdn_handler(root: Path):
    root = root.resolve()
    stats = Stats()

    class CdnHandler(Base):
        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            url = urllib.parse.urlsplit(self.path)
            if url.path == "/stats":
                return self.send_json(200, stats.snapshot(None))
            if url.path == "/healthz":
                return self.send_json(200, {"ok": True})
            if self.headers.get("Authorization") is not None:
                stats.add("refused_authorization")
                body = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>InvalidArgument</Code>"
                        b"<Message>Only one auth mechanism allowed; only the X-Amz-Algorithm query "
                        b"parameter, Signature query string parameter or the Authorization header "
                        b"should be specified</Message></Error>")
                self.send_response(400)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                return
            rel = urllib.parse.unquote(url.path).lstrip("/")
            path = (root / rel).resolve()
            if not str(path).startswith(str(root) + os.sep) or not rel.startswith("docker/registry/v2/blobs/") \
                    or not path.is_file():
                stats.add("not_found")
                return self.send_json(404, {"error": "not found"})
            size = path.stat().st_size
            start, end = 0, size - 1
            status = 200
            rng = self.headers.get("Range")
            if rng:
                try:
                    unit, _, spec = rng.partition("=")
                    a, _, b = spec.split(",")[0].strip().partition("-")
                    if unit.strip() != "bytes":
                        raise ValueError
                    if a == "":
                        start = max(0, size - int(b))
                    else:
                        start = int(a)
                        if b:
                            end = min(int(b), size - 1)
                except ValueError:
                    return self.send_json(400, {"error": "bad range"})
                if start >= size or start > end:
                    stats.add("range_not_satisfiable")
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status = 206
                if self.command == "GET":
                    stats.add("range_gets")
            if self.command == "GET":
                stats.add("blob_gets")
            else:
                stats.add("heads")
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(end - start + 1))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.end_headers()
            if self.command == "HEAD":
                return
            with open(path, "rb") as f:
                f.seek(start)
                left = end - start + 1
                while left > 0:
                    chunk = f.read(min(left, 1 << 16))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    left -= len(chunk)

    return CdnHandler



# --------------------------------------------------------------------------- #
# Harbor stand-in
# --------------------------------------------------------------------------- #

# Harbor's rule for project names (src/common/utils/utils.go, 2.x).
PROJECT_NAME = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*$")
# The repository of a distribution API path: /v2/<name>/{manifests,blobs,tags,referrers}/...
V2_REPO = re.compile(r"^/v2/(.+?)/(manifests|blobs|tags|referrers)(/|$)")
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
              "trailers", "transfer-encoding", "upgrade", "host"}
# Role -> repository actions (Harbor's RBAC, as far as the registry is concerned).
ROLE_ACTIONS = {
    "projectAdmin": ["pull", "push", "delete", "*"],
    "maintainer": ["pull", "push", "delete"],
    "developer": ["pull", "push"],
    "guest": ["pull"],
    "limitedGuest": ["pull"],
}


class HarborState:
    """Users, robot accounts and projects: seeded from the state file, plus the projects created
    through the API (kept in memory: a restart forgets them, as it keeps only the seed)."""

    def __init__(self, doc: dict):
        self.lock = threading.Lock()
        self.users: dict[str, dict] = doc.get("users", {})
        self.robots: dict[str, dict] = doc.get("robots", {})
        self.creation: str = doc.get("project_creation_restriction", "everyone")
        self.projects: dict[str, dict] = {}
        self.next_id = 1
        for name, p in doc.get("projects", {}).items():
            self.add_project(name, bool(p.get("public")), dict(p.get("members", {})))
        self.counts: dict[str, int] = {}

    def add_project(self, name: str, public: bool, members: dict) -> dict:
        p = {"project_id": self.next_id, "name": name, "public": public, "members": members,
             "creation_time": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())}
        self.next_id += 1
        self.projects[name] = p
        return p

    def count(self, kind: str) -> None:
        with self.lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1

    def login(self, header: str | None):
        """(name, kind) for valid basic credentials, ("", "anonymous") without any, None for
        bad ones. kind: "admin", "user" or "robot"."""
        if not header:
            return "", "anonymous"
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            name, _, password = base64.b64decode(value.strip()).decode().partition(":")
        except Exception:  # noqa: BLE001
            return None
        if name in self.robots:
            return (name, "robot") if self.robots[name]["password"] == password else None
        u = self.users.get(name)
        if u is None or u["password"] != password:
            return None
        return name, ("admin" if u.get("sysadmin") else "user")

    def actions(self, who: tuple[str, str], repository: str) -> list[str]:
        """What `who` may do on `repository`: nothing outside an existing project."""
        name, kind = who
        project, sep, _ = repository.partition("/")
        with self.lock:
            p = self.projects.get(project) if sep else None
            if p is None:
                return []
            if kind == "admin":
                return ["pull", "push", "delete", "*"]
            if kind == "robot":
                acts = list(self.robots[name].get("permissions", {}).get(project, []))
                return acts or (["pull"] if p["public"] else [])
            acts = list(ROLE_ACTIONS.get(p["members"].get(name, ""), []))
            if not acts and p["public"]:
                acts = ["pull"]
            return acts

    def visible(self, who: tuple[str, str], p: dict) -> bool:
        name, kind = who
        return kind == "admin" or p["public"] or name in p["members"] or \
            (kind == "robot" and p["name"] in self.robots[name].get("permissions", {}))


def make_harbor_handler(cfg: dict, state: HarborState, public_scheme: str, public_port: int):
    sign = make_signer(cfg)
    upstream_host, _, upstream_port = cfg["upstream"].rpartition(":")
    realm_https = f"https://{cfg['public_host']}:{cfg['https_port']}/service/token"
    realm_here = f"{public_scheme}://{cfg['public_host']}:{public_port}/service/token"

    class HarborHandler(Base):
        server_version = "harbor-koord-test"

        # ---------------------------------------------------------- routing
        def do_GET(self):
            self.route()

        def do_HEAD(self):
            self.route()

        def do_POST(self):
            self.route()

        def do_PUT(self):
            self.route()

        def do_PATCH(self):
            self.route()

        def do_DELETE(self):
            self.route()

        def route(self):
            path = urllib.parse.urlsplit(self.path).path
            if path == "/v2" or path.startswith("/v2/"):
                return self.registry(path)
            if path == "/service/token":
                return self.token()
            if path.startswith("/api/v2.0/"):
                return self.api(path)
            if path == "/koord-test/stats":
                with state.lock:
                    return self.send_json(200, dict(state.counts))
            return self.api_error(404, "NOT_FOUND", f"{path} not found")

        def api_error(self, status: int, code: str, message: str, extra: dict | None = None):
            self.send_json(status, {"errors": [{"code": code, "message": message}]}, extra)

        # ---------------------------------------------------------- registry (/v2/)
        def registry(self, path: str):
            m = V2_REPO.match(path)
            if m and "/" not in m.group(1):
                # Harbor has no project for a one-component repository: it answers 500, which
                # docker retries for ever.
                state.count("one_component_500")
                self.drain()
                return self.api_error(500, "UNKNOWN", "unknown error")
            if self.command in ("POST", "PUT", "PATCH", "DELETE"):
                state.count("writes")
            self.proxy()

        def drain(self):
            n = int(self.headers.get("Content-Length") or 0)
            while n > 0:
                got = self.rfile.read(min(n, 1 << 16))
                if not got:
                    break
                n -= len(got)
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                for _ in self.chunks():
                    pass

        def chunks(self):
            """The decoded chunks of a chunked request body."""
            while True:
                line = self.rfile.readline(1024).strip()
                size = int(line.split(b";")[0] or b"0", 16)
                if size == 0:
                    while self.rfile.readline(1024).strip():
                        pass
                    return
                left = size
                while left > 0:
                    got = self.rfile.read(min(left, 1 << 16))
                    if not got:
                        return
                    left -= len(got)
                    yield got
                self.rfile.readline(8)

        def proxy(self):
            import http.client
            conn = http.client.HTTPConnection(upstream_host, int(upstream_port), timeout=120)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            headers["Host"] = cfg["upstream"]
            headers["X-Forwarded-Proto"] = public_scheme
            body = None
            chunked = "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()
            if chunked:
                body = self.chunks()
                headers.pop("Content-Length", None)
            elif int(self.headers.get("Content-Length") or 0) > 0:
                n = int(self.headers["Content-Length"])

                def fixed(n=n):
                    left = n
                    while left > 0:
                        got = self.rfile.read(min(left, 1 << 16))
                        if not got:
                            return
                        left -= len(got)
                        yield got
                body = fixed()
            try:
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for k, v in headers.items():
                    conn.putheader(k, v)
                if chunked:
                    conn.putheader("Transfer-Encoding", "chunked")
                conn.endheaders()
                if body is not None:
                    for piece in body:
                        if chunked:
                            conn.send(b"%x\r\n%s\r\n" % (len(piece), piece))
                        else:
                            conn.send(piece)
                    if chunked:
                        conn.send(b"0\r\n\r\n")
                resp = conn.getresponse()
            except OSError as e:
                conn.close()
                return self.api_error(502, "UNKNOWN", f"registry unreachable: {e}")
            try:
                self.send_response(resp.status, resp.reason)
                length = resp.getheader("Content-Length")
                data = None
                if length is None and self.command != "HEAD" and resp.status not in (204, 304):
                    data = resp.read()
                    length = str(len(data))
                for k, v in resp.getheaders():
                    kl = k.lower()
                    if kl in HOP_BY_HOP or kl == "content-length":
                        continue
                    if kl == "www-authenticate":
                        v = v.replace(realm_https, realm_here)
                    self.send_header(k, v)
                if length is not None:
                    self.send_header("Content-Length", length)
                self.end_headers()
                if self.command == "HEAD":
                    return
                if data is not None:
                    self.wfile.write(data)
                    return
                while True:
                    piece = resp.read(1 << 16)
                    if not piece:
                        break
                    self.wfile.write(piece)
            finally:
                conn.close()

        # ---------------------------------------------------------- token service
        def token(self):
            if self.command != "GET":
                # Harbor's token service has no OAuth2 POST flow: containerd (helm 3) falls
                # back to GET on 405.
                self.drain()
                return self.api_error(405, "METHOD_NOT_ALLOWED", "method not allowed")
            q = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            who = state.login(self.headers.get("Authorization"))
            if who is None:
                state.count("token_refused")
                return self.api_error(401, "UNAUTHORIZED", "authentication required")
            access = []
            for s in q.get("scope", []):
                for one in s.split():
                    parts = one.split(":")
                    if len(parts) < 3:
                        continue
                    typ, name, wanted = parts[0], ":".join(parts[1:-1]), parts[-1].split(",")
                    if typ == "repository":
                        allowed = state.actions(who, name)
                        acts = [a for a in wanted if a in allowed]
                    elif typ == "registry":
                        acts = ["*"] if who[1] == "admin" and "*" in wanted else []
                    else:
                        acts = []
                    access.append({"type": typ, "name": name, "actions": acts})
            state.count("tokens")
            token, ttl = sign(who[0], access)
            self.send_json(200, {"token": token, "access_token": token, "expires_in": ttl,
                                 "issued_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})

        # ---------------------------------------------------------- API
        def api(self, path: str):
            url = urllib.parse.urlsplit(self.path)
            q = urllib.parse.parse_qs(url.query)
            if path == "/api/v2.0/systeminfo" and self.command == "GET":
                state.count("systeminfo")
                return self.send_json(200, {
                    "harbor_version": cfg["version"], "auth_mode": "db_auth",
                    "primary_auth_mode": False, "self_registration": False,
                    "banner_message": "", "oidc_provider_name": "",
                    "registry_url": f"{cfg['public_host']}:{cfg['https_port']}",
                    "external_url": f"https://{cfg['public_host']}:{cfg['https_port']}",
                })
            who = state.login(self.headers.get("Authorization"))
            if who is None or who[1] == "anonymous":
                self.drain()
                return self.api_error(401, "UNAUTHORIZED", "UnAuthorized")
            if path == "/api/v2.0/projects":
                if self.command == "HEAD":
                    name = q.get("project_name", [""])[0]
                    state.count("project_heads")
                    with state.lock:
                        found = name in state.projects
                    if not name:
                        return self.api_error(400, "BAD_REQUEST", "project_name is required")
                    self.send_response(200 if found else 404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.command == "GET":
                    name = q.get("name", [""])[0]
                    with state.lock:
                        out = [self.project_json(p) for p in state.projects.values()
                               if state.visible(who, p) and name in p["name"]]
                    return self.send_json(200, out, {"X-Total-Count": str(len(out))})
                if self.command == "POST":
                    return self.create(who)
            if path.startswith("/api/v2.0/projects/") and self.command in ("GET", "HEAD"):
                name = urllib.parse.unquote(path[len("/api/v2.0/projects/"):])
                with state.lock:
                    p = state.projects.get(name) or next(
                        (x for x in state.projects.values() if str(x["project_id"]) == name), None)
                    if p is None:
                        return self.api_error(404, "NOT_FOUND", f"project {name} not found")
                    if not state.visible(who, p):
                        return self.api_error(403, "FORBIDDEN", "forbidden")
                    return self.send_json(200, self.project_json(p))
            self.drain()
            self.api_error(404, "NOT_FOUND", f"{self.command} {path} not found")

        @staticmethod
        def project_json(p: dict) -> dict:
            return {"project_id": p["project_id"], "name": p["name"], "creation_time": p["creation_time"],
                    "metadata": {"public": "true" if p["public"] else "false"}}

        def create(self, who):
            try:
                doc = json.loads(self.read_body() or b"{}")
            except ValueError:
                return self.api_error(400, "BAD_REQUEST", "invalid JSON")
            name = doc.get("project_name") or ""
            if who[1] == "robot" or (state.creation == "adminonly" and who[1] != "admin"):
                state.count("project_create_forbidden")
                return self.api_error(403, "FORBIDDEN", "forbidden")
            if not isinstance(name, str) or not (1 <= len(name) <= 255) or not PROJECT_NAME.match(name):
                return self.api_error(400, "BAD_REQUEST",
                                      "project name is not in lower case or contains illegal characters!")
            public = str((doc.get("metadata") or {}).get("public", "false")).lower() == "true"
            with state.lock:
                if name in state.projects:
                    return self.api_error(409, "CONFLICT", f"The project named {name} already exists")
                p = state.add_project(name, public, {} if who[1] == "admin" else {who[0]: "projectAdmin"})
            state.count("projects_created")
            log(f"project {name} created by {who[0]} (public={public})")
            self.send_response(201)
            self.send_header("Location", f"/api/v2.0/projects/{p['project_id']}")
            self.send_header("Content-Length", "0")
            self.end_headers()

    return HarborHandler


def serve_harbor(args) -> None:
    doc = json.loads(Path(args.state).read_text())
    state = HarborState(doc)
    cfg = {
        "key": args.key, "cert": args.cert, "issuer": args.issuer, "service": args.service,
        "ttl": args.ttl, "upstream": args.upstream, "version": args.harbor_version,
        "public_host": args.host, "https_port": args.port,
    }
    threads = []
    entrances = [("https", args.port, args.tls_cert, args.tls_key)]
    if args.http_port:
        entrances.append(("http", args.http_port, None, None))
    for scheme, port, cert, key in entrances:
        handler = make_harbor_handler(cfg, state, scheme, port)
        t = threading.Thread(target=serve, args=(handler, args.host, port, cert, key), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    a = sub.add_parser("auth", help="the token service")
    a.add_argument("--port", type=int, required=True)
    a.add_argument("--key", required=True, help="signer private key (PEM)")
    a.add_argument("--cert", required=True, help="signer certificate (PEM; first is the leaf)")
    a.add_argument("--issuer", required=True)
    a.add_argument("--service", required=True)
    a.add_argument("--users", required=True, help="JSON file: {users: {name: {password, role}}, refresh: {token: name}}")
    a.add_argument("--ttl", type=int, default=300)
    c = sub.add_parser("cdn", help="the blob server")
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--root", required=True, help="the registry's storage root directory")
    h = sub.add_parser("harbor", help="the Harbor stand-in: /v2/ proxy, /service/token, /api/v2.0/")
    h.add_argument("--port", type=int, required=True, help="the HTTPS entrance")
    h.add_argument("--http-port", type=int, help="a plain-HTTP entrance too (helm 3 on loopback)")
    h.add_argument("--upstream", required=True, help="HOST:PORT of the docker-registry behind (plain HTTP)")
    h.add_argument("--key", required=True, help="token signer private key (PEM)")
    h.add_argument("--cert", required=True, help="token signer certificate (PEM)")
    h.add_argument("--issuer", required=True)
    h.add_argument("--service", required=True)
    h.add_argument("--state", required=True, help="JSON file: users, robots, projects (the seed)")
    h.add_argument("--ttl", type=int, default=1800)
    h.add_argument("--harbor-version", default="v2.11.1-koord-test")
    for p in (a, c, h):
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--tls-cert")
        p.add_argument("--tls-key")
    args = ap.parse_args()
    if args.mode == "harbor":
        serve_harbor(args)
    elif args.mode == "auth":
        doc = json.loads(Path(args.users).read_text())
        cfg = {
            "key": args.key, "cert": args.cert, "issuer": args.issuer, "service": args.service,
            "ttl": args.ttl,
            "users": {n: (u["password"], u["role"]) for n, u in doc["users"].items()},
            "refresh": doc.get("refresh", {}),
        }
        serve(make_auth_handler(cfg), args.host, args.port, args.tls_cert, args.tls_key)
    else:
        serve(make_cdn_handler(Path(args.root)), args.host, args.port, args.tls_cert, args.tls_key)
    return 0


if __name__ == "__main__":
    sys.exit(main())
