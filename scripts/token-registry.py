#!/usr/bin/env python3
"""The two helpers that make a CNCF distribution 2.8 registry behave like Docker Hub, ghcr.io,
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

Both count what they see and serve the counts as JSON on `GET /stats` (`?prefix=P` limits the
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


def make_auth_handler(cfg: dict):
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding
    from cryptography import x509

    key = serialization.load_pem_private_key(Path(cfg["key"]).read_bytes(), password=None)
    certs = x509.load_pem_x509_certificates(Path(cfg["cert"]).read_bytes()) \
        if hasattr(x509, "load_pem_x509_certificates") else [x509.load_pem_x509_certificate(Path(cfg["cert"]).read_bytes())]
    x5c = [base64.b64encode(c.public_bytes(serialization.Encoding.DER)).decode() for c in certs]
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
    for p in (a, c):
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--tls-cert")
        p.add_argument("--tls-key")
    args = ap.parse_args()
    if args.mode == "auth":
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
