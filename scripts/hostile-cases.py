#!/usr/bin/env python3
"""Hostile registry answers against koord-bundle binaries, measured (issue 18).

    scripts/hostile-cases.py --bin NAME=PATH [--bin NAME=PATH ...] [--case CASE ...]
                             [--timeout SECONDS] [--env target/test-env/env.json]

Starts a small hostile registry on 127.0.0.1 (a free port), runs `koord-bundle build` of the
test environment's chart 1.8.0 plus one hostile `--image` per case, in a fresh home each time,
and prints a markdown table: exit code (or "killed" when the timeout ended it), wall time, peak
RSS, bytes the process wrote (`wchar` of /proc/PID/io, last sample) and bytes left on disk in
its home (output directory and cache). Needs the test environment (scripts/test-env.sh start)
for the chart repository and the plain registry that serve the chart's own images.

This is evidence for a closing note, not a test: timings never go into tests. The hostile
answers mirror those of tests/it/fake_registry.rs, which the integration tests use.

Cases:
  wrap        a layer declared 2^64-1 bytes (served as endless zeros)
  wrap-dry    the same with --dry-run
  huge        a layer declared 2^62 bytes
  fanout      an index with 15,000 distinct children (3.5 MB)
  deep        indexes nested 64 deep
  manifests   12 images, each an index of 100 children (1,212 manifests)
  conflict    one blob declared with two sizes by two images
  www-auth    every answer a 401 with a 1 MiB WWW-Authenticate header
  not-json    a manifest whose body is not JSON
  digest      a manifest asked by digest, served with other bytes
"""

import argparse
import hashlib
import http.server
import json
import os
import shutil
import signal
import socketserver
import subprocess
import sys
import tempfile
import threading
import time

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def digest(b):
    return "sha256:" + hashlib.sha256(b).hexdigest()


def canon(doc):
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


class Registry:
    """Repositories of manifests (by tag and digest) and blobs; special answers per case."""

    def __init__(self):
        self.manifests = {}  # (repo, ref) -> (bytes, media type)
        self.blobs = {}  # digest -> bytes
        self.endless = set()  # digests served as endless zeros
        self.lie = {}  # (repo, ref) -> bytes served instead
        self.www_auth = None  # a header value every answer carries with 401

    def blob(self, data):
        d = digest(data)
        self.blobs[d] = data
        return {"mediaType": OCI_CONFIG if data.startswith(b"{") else OCI_LAYER,
                "digest": d, "size": len(data)}

    def manifest(self, repo, doc, tag=None):
        b = canon(doc)
        mt = doc.get("mediaType", OCI_MANIFEST)
        d = digest(b)
        self.manifests[(repo, d)] = (b, mt)
        if tag:
            self.manifests[(repo, tag)] = (b, mt)
        return {"mediaType": mt, "digest": d, "size": len(b)}

    def image(self, repo, layer_desc, tag=None, note=None):
        config = self.blob(canon({"architecture": "amd64", "os": "linux",
                                  "rootfs": {"type": "layers", "diff_ids": []}}))
        doc = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config,
               "layers": [layer_desc]}
        if note is not None:
            doc["annotations"] = {"n": str(note)}
        return self.manifest(repo, doc, tag)

    def index(self, repo, children, tag=None):
        return self.manifest(repo, {"schemaVersion": 2, "mediaType": OCI_INDEX,
                                    "manifests": children}, tag)


def build_case(reg, case):
    """Fill `reg` for `case`; returns (the --image references, extra build arguments)."""
    layer = reg.blob(b"hostile layer " + case.encode())
    if case in ("wrap", "wrap-dry", "huge"):
        size = (1 << 64) - 1 if case.startswith("wrap") else 1 << 62
        d = digest(b"a layer that never ends " + case.encode())
        reg.endless.add(d)
        reg.image("hostile/img", {"mediaType": OCI_LAYER, "digest": d, "size": size}, "v1")
        return ["hostile/img:v1"], ["--dry-run"] if case == "wrap-dry" else []
    if case == "fanout":
        kids = [dict(reg.image("hostile/img", layer, note=i),
                     platform={"os": "linux", "architecture": "amd64"}) for i in range(15000)]
        reg.index("hostile/img", kids, "v1")
        return ["hostile/img:v1"], []
    if case == "deep":
        top = reg.image("hostile/img", layer)
        for _ in range(64):
            top = reg.index("hostile/img", [top])
        reg.manifests[("hostile/img", "v1")] = reg.manifests[("hostile/img", top["digest"])]
        return ["hostile/img:v1"], []
    if case == "manifests":
        refs = []
        for n in range(12):
            kids = [dict(reg.image(f"hostile/img{n}", layer, note=i),
                         platform={"os": "linux", "architecture": "amd64"})
                    for i in range(100)]
            reg.index(f"hostile/img{n}", kids, "v1")
            refs.append(f"hostile/img{n}:v1")
        return refs, []
    if case == "conflict":
        reg.image("hostile/a", layer, "v1")
        reg.image("hostile/b", dict(layer, size=layer["size"] + 1000), "v1")
        return ["hostile/a:v1", "hostile/b:v1"], []
    if case == "www-auth":
        reg.www_auth = 'Bearer realm="http://127.0.0.1:9/token",service="x' + "x" * (1 << 20) + '"'
        return ["hostile/img:v1"], []
    if case == "not-json":
        reg.manifests[("hostile/img", "v1")] = (b"<html>not a manifest</html>", OCI_MANIFEST)
        return ["hostile/img:v1"], []
    if case == "digest":
        real = reg.image("hostile/img", layer, "v1")
        reg.lie[("hostile/img", real["digest"])] = canon({"schemaVersion": 2, "other": True})
        return ["hostile/img:v1@" + real["digest"]], []
    raise SystemExit(f"unknown case {case}")


def handler_for(reg):
    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body are two writes: without TCP_NODELAY each answer waits 40 ms for
        # a delayed ACK, and the walk measures that instead of the client.
        disable_nagle_algorithm = True

        def log_message(self, *a):
            pass

        def send(self, status, body=b"", ctype="application/json", extra=()):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in extra:
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            try:
                self.route()
            except (BrokenPipeError, ConnectionResetError):
                pass

        def route(self):
            if reg.www_auth is not None:
                return self.send(401, b"{}", extra=[("WWW-Authenticate", reg.www_auth)])
            p = self.path.split("?")[0]
            if p in ("/v2/", "/v2"):
                return self.send(200, b"{}")
            if "/manifests/" in p:
                repo, ref = p[len("/v2/"):].rsplit("/manifests/", 1)
                if (repo, ref) in reg.lie:
                    return self.send(200, reg.lie[(repo, ref)], OCI_MANIFEST)
                m = reg.manifests.get((repo, ref))
                if m is None:
                    return self.send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
                return self.send(200, m[0], m[1], [("Docker-Content-Digest", digest(m[0]))])
            if "/blobs/" in p:
                d = p.rsplit("/blobs/", 1)[1]
                if d in reg.endless:
                    return self.endless()
                b = reg.blobs.get(d)
                if b is None:
                    return self.send(404, b'{"errors":[{"code":"BLOB_UNKNOWN"}]}')
                return self.send(200, b, "application/octet-stream")
            return self.send(404, b"{}")

        def endless(self):
            # What a registry that lies about a size sends: bytes until the client stops.
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command == "HEAD":
                return
            zeros = b"\0" * (1 << 20)
            while True:
                self.wfile.write(zeros)

    return H


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def du(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def run_one(binary, env_json, addr, refs, extra, timeout):
    home = tempfile.mkdtemp(prefix="kb-hostile-")
    try:
        args = [binary, "build", "1.8.0", "--repo", env_json["helm_repo"], "--source",
                env_json["plain_registry"], "--plain-http", "--unsigned", "--jobs", "4",
                "-o", os.path.join(home, "out", "koordinator-1.8.0.tar")]
        for r in refs:
            args += ["--image", f"{addr}/{r}"]
        args += extra
        os.makedirs(os.path.join(home, "out"))
        env = dict(os.environ, HOME=home, KOORD_BUNDLE_CACHE_DIR=os.path.join(home, "cache"),
                   KOORD_BUNDLE_CONFIG_DIR=os.path.join(home, "config"))
        # Under GNU time: the peak RSS of a child forked from this (large) Python process would
        # start at the parent's (ru_maxrss survives exec).
        rss_file = os.path.join(home, "rss")
        start = time.monotonic()
        p = subprocess.Popen(["/usr/bin/time", "-f", "%M", "-o", rss_file] + args, env=env,
                             stdout=open(os.path.join(home, "stdout"), "wb"),
                             stderr=open(os.path.join(home, "stderr"), "wb"))
        wchar = 0
        killed = False
        kb = None
        while p.poll() is None:
            if kb is None:
                try:
                    with open(f"/proc/{p.pid}/task/{p.pid}/children") as f:
                        kb = int(f.read().split()[0])
                except (OSError, ValueError, IndexError):
                    pass
            if kb is not None:
                try:
                    with open(f"/proc/{kb}/io") as f:
                        for line in f:
                            if line.startswith("wchar:"):
                                wchar = int(line.split()[1])
                except OSError:
                    pass
            if time.monotonic() - start > timeout and not killed and kb is not None:
                os.kill(kb, signal.SIGKILL)
                killed = True
            time.sleep(0.1)
        wall = time.monotonic() - start
        on_disk = du(home)
        code = p.returncode
        try:
            rss_kb = int(open(rss_file).read().split()[-1])
        except (OSError, ValueError, IndexError):
            rss_kb = 0
        with open(os.path.join(home, "stderr"), "rb") as f:
            err = f.read().decode(errors="replace")
        with open(os.path.join(home, "stdout"), "rb") as f:
            out = f.read().decode(errors="replace")
        # The error and its causes on one line; else what a dry run planned; else the end of
        # the progress output (a run that was killed).
        lines = err.splitlines()
        first = next((i for i, l in enumerate(lines) if l.startswith("error:")), len(lines))
        chain = [l.strip() for l in lines[first:]]
        last = [" / ".join(chain)] if chain else []
        last += [l.strip() for l in out.splitlines() if "to download" in l]
        if not last:
            last = [" ".join(err.split())[-200:]]
        return {"code": "killed" if killed else code, "wall": wall, "rss_kb": rss_kb,
                "wchar": wchar, "disk": on_disk, "error": last[-1]}
    finally:
        shutil.rmtree(home, ignore_errors=True)


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


ALL = ["wrap", "wrap-dry", "huge", "fanout", "deep", "manifests", "conflict", "www-auth",
       "not-json", "digest"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", action="append", required=True, help="NAME=PATH")
    ap.add_argument("--case", action="append")
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--env", default=os.environ.get("KB_ENV_JSON", "target/test-env/env.json"))
    a = ap.parse_args()
    env_json = json.load(open(a.env))
    print("| case | binary | exit | time | peak RSS | written | on disk after | message |")
    print("|---|---|---|---|---|---|---|---|")
    for case in a.case or ALL:
        reg = Registry()
        refs, extra = build_case(reg, case)
        srv = Server(("127.0.0.1", 0), handler_for(reg))
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        addr = f"127.0.0.1:{srv.server_address[1]}"
        for spec in a.bin:
            name, path = spec.split("=", 1)
            r = run_one(path, env_json, addr, refs, extra, a.timeout)
            msg = r["error"].replace("|", "\\|").replace(addr, "HOSTILE")[:400]
            print(f"| {case} | {name} | {r['code']} | {r['wall']:.1f} s | "
                  f"{r['rss_kb'] / 1024:.0f} MiB | {human(r['wchar'])} | {human(r['disk'])} | "
                  f"{msg} |", flush=True)
        srv.shutdown()
        srv.server_close()


if __name__ == "__main__":
    sys.exit(main())
