#!/usr/bin/env python3
"""Helper of scripts/bench (Python standard library only).

  bench_report.py gen-set --registry HOST:PORT --prefix P --work DIR --stamp FILE [--big-mib N]
      Make sure the benchmark's synthetic image set is in the (plain HTTP) registry; build and
      push it only when it is not already there. Prints a JSON summary on stdout. --big-mib
      makes <prefix>/big:v<N> one layer of N MiB instead of 256 (1834: the 2 GiB set).
  bench_report.py report --records TSV --meta TSV --set JSON --out FILE
      Medians, ratios and targets as markdown: printed and written to FILE.
  bench_report.py gen-scale --registry HOST:PORT --prefix P --work DIR --layers N [--layer-mib M]
      Push <prefix>/scale:l<k> images (linux/amd64, k layers of M MiB of incompressible data,
      the first k of N layers) for k in --tags (default 6 and N): the big images of the scaling
      run. Layers are made with openssl's AES-CTR keystream (fast), one at a time in DIR.
  bench_report.py scale-report --records TSV --sizes TSV --meta TSV --out FILE
      The scaling section (seconds per GiB and peak RSS per size, koord-bundle next to the
      peers), printed and put into FILE in place of its former "## Scaling" section.

  bench_report.py peer-manifests --set JSON --registry HOST:PORT --prefix P --helm-repo URL --out-dir DIR
      The Hauler manifest (DIR/hauler.yaml) and the Zarf package definition (DIR/zarf/zarf.yaml)
      of the image set and the chart, from the templates in scripts/peers/.
  bench_report.py peers-report --records TSV --meta TSV --tools TSV --bytes TSV --digests TSV --out FILE [--title T]
      The "Peers side by side" section (scripts/bench --peers), printed and put into FILE
      (--title: its heading, for the 2 GiB set's section).

The image set (deterministic, incompressible data, so sizes are real):

  <prefix>/koordinator-sh/{koord-manager,koord-scheduler,koord-descheduler,koordlet,
  koord-device-daemon}:v1.8.0 -- OCI index, linux/amd64 + linux/arm64; every platform
  manifest has three gzip layers: a 10 MiB base layer and a 1 MiB runtime layer, both shared by
  all five images (one per architecture), and the image's own application layer (6-26 MiB).
  <prefix>/big:v256 -- linux/amd64 only, one 256 MiB layer.
  About 470 MiB of unique blobs in all.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import hashlib
import io
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER_GZ = "application/vnd.oci.image.layer.v1.tar+gzip"
CREATED = "2025-01-01T00:00:00Z"
MIB = 1024 * 1024

# The set. Changing anything here changes the stamp, so the set is rebuilt and re-pushed.
SPEC = {
    "version": 1,
    "namespace": "koordinator-sh",
    "tag": "v1.8.0",
    "arches": ["amd64", "arm64"],
    "base_kib": 10 * 1024,  # shared by all five images, one per architecture
    "runtime_kib": 1024,  # shared by all five images, one per architecture
    "components": {  # application layer per image and architecture, KiB
        "koord-manager": 22 * 1024,
        "koord-scheduler": 26 * 1024,
        "koord-descheduler": 18 * 1024,
        "koordlet": 24 * 1024,
        "koord-device-daemon": 6 * 1024,
    },
    "big": {"repository": "big", "tag": "v256", "kib": 256 * 1024},
    "gzip_level": 1,
}


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def spec_hash() -> str:
    return hashlib.sha256(canonical(SPEC)).hexdigest()


# ------------------------------------------------------------------------------------------ #
# OCI layout writer (streamed layers)
# ------------------------------------------------------------------------------------------ #

class _HashCount(io.RawIOBase):
    """A write-through sink that hashes and counts."""

    def __init__(self, f=None):
        self.f = f
        self.h = hashlib.sha256()
        self.n = 0

    def writable(self):
        return True

    def write(self, b):
        self.h.update(b)
        self.n += len(b)
        if self.f is not None:
            self.f.write(b)
        return len(b)


class _Random(io.RawIOBase):
    def __init__(self, seed: str, size: int):
        self.rnd = random.Random(seed)
        self.left = size

    def readable(self):
        return True

    def readinto(self, b):
        n = min(len(b), self.left, MIB)
        if n <= 0:
            return 0
        b[:n] = self.rnd.randbytes(n)
        self.left -= n
        return n


def _tarinfo(name: str, size: int = 0, directory: bool = False) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.mtime = 1735689600
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    if directory:
        ti.type = tarfile.DIRTYPE
        ti.mode = 0o755
    else:
        ti.size = size
        ti.mode = 0o755
    return ti


class Layout:
    def __init__(self, root: Path):
        self.root = root
        self.blobs = root / "blobs" / "sha256"
        self.blobs.mkdir(parents=True, exist_ok=True)
        (root / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
        self.refs: list[dict] = []
        self.sizes: dict[str, int] = {}

    def put(self, data: bytes) -> dict:
        h = hashlib.sha256(data).hexdigest()
        p = self.blobs / h
        if not p.exists():
            p.write_bytes(data)
        self.sizes["sha256:" + h] = len(data)
        return {"digest": "sha256:" + h, "size": len(data)}

    def layer(self, seed: str, path: str, size: int) -> tuple[dict, str]:
        """A gzip tar layer holding one file of `size` random bytes: (descriptor, diff_id)."""
        tmp = self.blobs / f".{hashlib.sha256(seed.encode()).hexdigest()[:16]}.tmp"
        with open(tmp, "wb") as out:
            comp = _HashCount(out)
            with gzip.GzipFile(filename="", mode="wb", fileobj=comp, mtime=0,
                               compresslevel=SPEC["gzip_level"]) as gz:
                raw = _HashCount(gz)
                with tarfile.open(fileobj=raw, mode="w|", format=tarfile.PAX_FORMAT,
                                  bufsize=MIB) as tf:
                    parts = path.split("/")
                    for i in range(1, len(parts)):
                        tf.addfile(_tarinfo("/".join(parts[:i]), directory=True))
                    tf.addfile(_tarinfo(path, size), io.BufferedReader(_Random(seed, size), MIB))
        digest = comp.h.hexdigest()
        os.replace(tmp, self.blobs / digest)
        self.sizes["sha256:" + digest] = comp.n
        return ({"mediaType": MT_LAYER_GZ, "digest": "sha256:" + digest, "size": comp.n},
                "sha256:" + raw.h.hexdigest())

    def write_index(self) -> None:
        idx = {"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": self.refs}
        (self.root / "index.json").write_bytes(canonical(idx))


def build_set(root: Path, jobs: int) -> list[dict]:
    """Write the whole set into an OCI layout at `root`; return the images."""
    lay = Layout(root)
    arches = SPEC["arches"]
    ns, tag = SPEC["namespace"], SPEC["tag"]
    # Every layer, generated in parallel (zlib and hashlib release the GIL).
    jobs_list: dict[str, tuple[str, str, int]] = {}
    for arch in arches:
        jobs_list[f"base-{arch}"] = (f"bench-base-{arch}", "usr/lib/libbase.so", SPEC["base_kib"] * 1024)
        jobs_list[f"runtime-{arch}"] = (f"bench-runtime-{arch}", "usr/share/runtime.dat",
                                        SPEC["runtime_kib"] * 1024)
        for comp, kib in SPEC["components"].items():
            jobs_list[f"{comp}-{arch}"] = (f"bench-app-{comp}-{arch}", f"koord/{comp}", kib * 1024)
    big = SPEC["big"]
    jobs_list["big"] = (f"bench-big-{big['kib']}", "big/data.bin", big["kib"] * 1024)
    layers: dict[str, tuple[dict, str]] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        futs = {ex.submit(lay.layer, *v): k for k, v in sorted(jobs_list.items(),
                                                                key=lambda kv: -kv[1][2])}
        for f in concurrent.futures.as_completed(futs):
            layers[futs[f]] = f.result()

    images = []

    def config_and_manifest(arch: str, title: str, lyrs: list[tuple[dict, str]]) -> dict:
        config = {
            "architecture": arch, "os": "linux", "created": CREATED,
            "config": {"Entrypoint": [f"/koord/{title}"],
                       "Labels": {"org.opencontainers.image.title": title,
                                  "org.opencontainers.image.source": "koord-bundle scripts/bench"}},
            "rootfs": {"type": "layers", "diff_ids": [d for _, d in lyrs]},
            "history": [{"created": CREATED, "created_by": f"scripts/bench layer {i}"}
                        for i in range(len(lyrs))],
        }
        cfg = lay.put(canonical(config))
        manifest = {"schemaVersion": 2, "mediaType": MT_MANIFEST,
                    "config": {"mediaType": MT_CONFIG, **cfg},
                    "layers": [d for d, _ in lyrs]}
        m = lay.put(canonical(manifest))
        return {"mediaType": MT_MANIFEST, **m}

    for comp in SPEC["components"]:
        entries = []
        for arch in arches:
            d = config_and_manifest(arch, comp, [layers[f"base-{arch}"], layers[f"runtime-{arch}"],
                                                 layers[f"{comp}-{arch}"]])
            d["platform"] = {"architecture": arch, "os": "linux"}
            entries.append(d)
        idx = lay.put(canonical({"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": entries}))
        ref = f"{ns}/{comp}:{tag}"
        lay.refs.append({"mediaType": MT_INDEX, **idx,
                         "annotations": {"org.opencontainers.image.ref.name": ref}})
        images.append({"ref": ref, "repository": f"{ns}/{comp}", "tag": tag,
                       "digest": idx["digest"], "mediaType": MT_INDEX})
    d = config_and_manifest("amd64", "big", [layers["big"]])
    ref = f"{big['repository']}:{big['tag']}"
    lay.refs.append({**d, "annotations": {"org.opencontainers.image.ref.name": ref}})
    images.append({"ref": ref, "repository": big["repository"], "tag": big["tag"],
                   "digest": d["digest"], "mediaType": MT_MANIFEST})
    lay.write_index()
    return images, lay.sizes


def registry_digest(registry: str, repository: str, tag: str) -> str | None:
    accept = ", ".join([MT_INDEX, MT_MANIFEST,
                        "application/vnd.docker.distribution.manifest.list.v2+json",
                        "application/vnd.docker.distribution.manifest.v2+json"])
    req = urllib.request.Request(f"http://{registry}/v2/{repository}/manifests/{tag}",
                                 method="HEAD", headers={"Accept": accept})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.headers.get("Docker-Content-Digest")
    except (urllib.error.URLError, OSError):
        return None


def _manifest(registry: str, repository: str, reference: str) -> dict:
    accept = ", ".join([MT_INDEX, MT_MANIFEST,
                        "application/vnd.docker.distribution.manifest.list.v2+json",
                        "application/vnd.docker.distribution.manifest.v2+json"])
    req = urllib.request.Request(f"http://{registry}/v2/{repository}/manifests/{reference}",
                                 headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def cmd_blob_urls(a) -> int:
    """A curl config (`url` + `output`) for every unique blob of the given images: what the
    registry alone serves for a build, without any client work. Into /dev/null, or with
    `--dir D` into one file per blob in D."""
    seen: set[str] = set()
    lines = []
    for ref in a.refs:
        repo, _, tag = ref.rpartition(":")
        repository = f"{a.prefix}/{repo}"
        todo = [_manifest(a.registry, repository, tag)]
        while todo:
            m = todo.pop()
            for child in m.get("manifests", []):
                todo.append(_manifest(a.registry, repository, child["digest"]))
            for b in ([m["config"]] if "config" in m else []) + m.get("layers", []):
                if b["digest"] not in seen:
                    seen.add(b["digest"])
                    lines.append(f'url = "http://{a.registry}/v2/{repository}/blobs/{b["digest"]}"')
                    out = f"{a.dir}/b{len(seen)}" if a.dir else "/dev/null"
                    lines.append(f'output = "{out}"')
    print("\n".join(lines))
    log(f"{len(seen)} unique blobs")
    return 0


def cmd_blob_uploads(a) -> int:
    """A curl config that PUTs every blob named in a `blob-urls` config (its digests) into
    `--repo` of the TLS registry, from the plain registry's storage files: what the registry
    alone needs to receive the set, load's bound. The upload sessions (one POST each) are opened
    here, before the timing; the password comes from KB_REGISTRY_PASSWORD and goes into the
    config, not into curl's argv."""
    import base64
    import re
    import ssl
    digests = []
    for line in Path(a.urls).read_text().splitlines():
        m = re.search(r"/blobs/(sha256:[0-9a-f]{64})", line)
        if m and m.group(1) not in digests:
            digests.append(m.group(1))
    password = os.environ["KB_REGISTRY_PASSWORD"]
    auth = "Basic " + base64.b64encode(f"{a.user}:{password}".encode()).decode()
    ctx = ssl.create_default_context(cafile=a.ca)
    lines = [f'user = "{a.user}:{password}"', f'cacert = "{a.ca}"']
    for d in digests:
        path = Path(a.storage) / "blobs" / "sha256" / d[7:9] / d[7:] / "data"
        if not path.is_file():
            raise SystemExit(f"blob-uploads: {path} is missing from the source registry's storage")
        req = urllib.request.Request(f"https://{a.registry}/v2/{a.repo}/blobs/uploads/", method="POST",
                                     headers={"Authorization": auth, "Content-Length": "0"})
        with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
            loc = urllib.parse.urljoin(resp.url, resp.headers["Location"])
        sep = "&" if "?" in loc else "?"
        lines += [f'url = "{loc}{sep}digest={d}"', f'upload-file = "{path}"', 'output = "/dev/null"']
    print("\n".join(lines))
    log(f"{len(digests)} upload sessions opened in {a.registry}/{a.repo}")
    return 0


def cmd_gen_set(a) -> int:
    if a.big_mib != 256:
        SPEC["big"] = {"repository": "big", "tag": f"v{a.big_mib}", "kib": a.big_mib * 1024}
    stamp = Path(a.stamp)
    want = spec_hash()
    if stamp.exists():
        try:
            s = json.loads(stamp.read_text())
        except ValueError:
            s = {}
        if s.get("spec") == want and s.get("registry") == a.registry and s.get("prefix") == a.prefix:
            ok = all(registry_digest(a.registry, f"{a.prefix}/{i['repository']}", i["tag"]) == i["digest"]
                     for i in s["images"])
            if ok:
                log(f"image set already in {a.registry}/{a.prefix} (stamp {stamp}): reused")
                s["reused"] = True
                print(json.dumps(s))
                return 0
            log("image set stamp found but the registry does not serve it: rebuilding")
    t0 = time.time()
    root = Path(a.work) / "set-layout"
    shutil.rmtree(root, ignore_errors=True)
    images, sizes = build_set(root, a.jobs)
    total = sum(sizes.values())
    log(f"wrote the image set ({len(sizes)} blobs, {total / MIB:.1f} MiB) in {time.time() - t0:.1f}s")
    policy = Path(a.work) / "policy.json"
    policy.write_text('{"default":[{"type":"insecureAcceptAnything"}]}\n')
    t1 = time.time()

    def push(img):
        dest = f"docker://{a.registry}/{a.prefix}/{img['repository']}:{img['tag']}"
        cmd = ["skopeo", "--policy", str(policy), "copy", "--all", "--preserve-digests", "-q",
               "--retry-times", "2", "--dest-tls-verify=false", f"oci:{root}:{img['ref']}", dest]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}:\n{p.stdout}")

    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as ex:
        for f in [ex.submit(push, i) for i in images]:
            f.result()
    for i in images:
        got = registry_digest(a.registry, f"{a.prefix}/{i['repository']}", i["tag"])
        if got != i["digest"]:
            log(f"{a.prefix}/{i['repository']}:{i['tag']}: registry serves {got}, expected {i['digest']}")
            return 1
    log(f"pushed the image set to {a.registry}/{a.prefix} in {time.time() - t1:.1f}s")
    shutil.rmtree(root, ignore_errors=True)
    s = {"spec": want, "registry": a.registry, "prefix": a.prefix, "images": images,
         "unique_blobs": len(sizes), "unique_bytes": total,
         "layer_bytes": sum(v for k, v in sizes.items() if v > 64 * 1024)}
    stamp.parent.mkdir(parents=True, exist_ok=True)
    tmp = stamp.with_suffix(".tmp")
    tmp.write_text(json.dumps(s, indent=2) + "\n")
    os.replace(tmp, stamp)
    s["reused"] = False
    print(json.dumps(s))
    return 0


# ------------------------------------------------------------------------------------------ #
# gen-scale
# ------------------------------------------------------------------------------------------ #

def _http(method: str, url: str, data=None, headers=None, length: int | None = None):
    h = dict(headers or {})
    if length is not None:
        h["Content-Length"] = str(length)
    req = urllib.request.Request(url, method=method, data=data, headers=h)
    return urllib.request.urlopen(req, timeout=600)


def _blob_exists(registry: str, repo: str, digest: str) -> bool:
    try:
        with _http("HEAD", f"http://{registry}/v2/{repo}/blobs/{digest}"):
            return True
    except urllib.error.HTTPError:
        return False


def _push_blob(registry: str, repo: str, digest: str, path: Path | None, data: bytes | None) -> None:
    if _blob_exists(registry, repo, digest):
        return
    with _http("POST", f"http://{registry}/v2/{repo}/blobs/uploads/", data=b"", length=0) as r:
        loc = r.headers["Location"]
    if not loc.startswith("http"):
        loc = f"http://{registry}{loc}"
    url = loc + ("&" if "?" in loc else "?") + f"digest={digest}"
    hdr = {"Content-Type": "application/octet-stream"}
    if path is not None:
        with open(path, "rb") as f, _http("PUT", url, data=f, headers=hdr, length=path.stat().st_size):
            pass
    else:
        with _http("PUT", url, data=data, headers=hdr, length=len(data)):
            pass


def cmd_gen_scale(a) -> int:
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    repo = f"{a.prefix}/scale"
    size = a.layer_mib * MIB
    tags = sorted(set(a.tags + [a.layers]))
    layers = []
    t0 = time.time()
    for i in range(a.layers):
        path = work / f"layer-{i}"
        # AES-CTR keystream of a fixed key: deterministic, incompressible, ~1 GB/s.
        key = hashlib.sha256(f"koord-bundle scale layer {i}".encode()).hexdigest()[:64]
        with open(path, "wb") as out:
            gen = subprocess.Popen(["openssl", "enc", "-aes-256-ctr", "-nosalt", "-K", key,
                                    "-iv", "0" * 32, "-in", "/dev/zero"], stdout=subprocess.PIPE)
            h = hashlib.sha256()
            left = size
            while left:
                chunk = gen.stdout.read(min(left, 4 * MIB))
                if not chunk:
                    raise RuntimeError("openssl ended early")
                h.update(chunk)
                out.write(chunk)
                left -= len(chunk)
            gen.kill()
            gen.wait()
        digest = "sha256:" + h.hexdigest()
        _push_blob(a.registry, repo, digest, path, None)
        path.unlink()
        layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                       "digest": digest, "size": size})
        log(f"scale layer {i + 1}/{a.layers} pushed ({time.time() - t0:.0f}s)")
    images = []
    for k in tags:
        lyrs = layers[:k]
        config = canonical({"architecture": "amd64", "os": "linux",
                            "rootfs": {"type": "layers", "diff_ids": [l["digest"] for l in lyrs]}})
        cdig = "sha256:" + hashlib.sha256(config).hexdigest()
        _push_blob(a.registry, repo, cdig, None, config)
        manifest = canonical({"schemaVersion": 2, "mediaType": MT_MANIFEST,
                              "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                         "digest": cdig, "size": len(config)},
                              "layers": lyrs})
        with _http("PUT", f"http://{a.registry}/v2/{repo}/manifests/l{k}", data=manifest,
                   headers={"Content-Type": MT_MANIFEST}, length=len(manifest)):
            pass
        images.append({"ref": f"scale:l{k}", "layers": k, "bytes": k * size})
    print(json.dumps({"images": images}))
    return 0


def cmd_scale_report(a) -> int:
    rec: dict[tuple[str, str, str], dict] = {}
    for line in Path(a.records).read_text().splitlines():
        f = line.split("\t")
        if len(f) < 8:
            continue
        measure, tool, size = f[0], f[1], f[2]
        rec[(measure, tool, size)] = {"wall": float(f[3]), "rss": int(f[4]), "cpu": float(f[5]),
                                      "reg": float(f[7])}
    sizes = []
    for line in Path(a.sizes).read_text().splitlines():
        name, blob_bytes = line.split("\t")
        sizes.append((name, int(blob_bytes)))
    meta = read_meta(Path(a.meta))
    L = ["## Scaling", ""]
    L.append(f"Written by `scripts/bench --scale` on {meta.get('date', '?')} (one run per size; "
             "wall-clock seconds per GiB of unique blob bytes, and peak RSS). The sets: the image "
             "set above (about 0.5 GiB), then the same plus `bench/scale:l6` (6 × 256 MiB) and "
             "plus `bench/scale:l30` (30 × 256 MiB). koord-bundle builds with its cache (each blob "
             "written once into the bundle, once appended to the cache).")
    L.append("")
    L.append("| set | measure | koord-bundle s | s/GiB | peak RSS | peer | peer s | peer s/GiB | peer RSS |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    peers = {"build": "skopeo copy + tar", "verify": "openssl dgst -sha256", "load": "skopeo copy"}
    for name, nbytes in sizes:
        gib = nbytes / (1 << 30)
        for m in ("build", "verify", "load"):
            k = rec.get((m, "kb", name))
            p = rec.get((m, "peer", name))
            if not k:
                continue
            row = [f"{name} ({gib:.2f} GiB)", m, f"{k['wall']:.2f}", f"{k['wall'] / gib:.2f}",
                   f"{k['rss'] / 1024:.0f} MiB", peers[m]]
            if p:
                row += [f"{p['wall']:.2f}", f"{p['wall'] / gib:.2f}", f"{p['rss'] / 1024:.0f} MiB"]
            else:
                row += ["", "", ""]
            L.append("| " + " | ".join(row) + " |")
    L.append("")
    L.append("Build against receiving and writing every blob once: the registry alone serving the "
             "set's unique blobs to curl (4 at a time, as build's `--jobs`) into /dev/null, and "
             "into one file each followed by `sync -f` of their file system. Target: build within "
             "1.2× of the second.")
    L.append("")
    L.append("| set | registry → /dev/null | registry → files + sync | build, cache on (default) "
             "| ÷ | build `--no-cache` | ÷ | target | |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    for name, nbytes in sizes:
        gib = nbytes / (1 << 30)
        null, files = rec.get(("serve", "null", name)), rec.get(("serve", "files", name))
        kb, nc = rec.get(("build", "kb", name)), rec.get(("build-nocache", "kb", name))
        if not (null and files and kb and nc):
            continue
        r_kb, r_nc = kb["wall"] / files["wall"], nc["wall"] / files["wall"]
        L.append(f"| {name} ({gib:.2f} GiB) | {null['wall']:.2f} s | {files['wall']:.2f} s "
                 f"| {kb['wall']:.2f} s ({kb['rss'] / 1024:.0f} MiB) | {r_kb:.2f}× "
                 f"| {nc['wall']:.2f} s ({nc['rss'] / 1024:.0f} MiB) | {r_nc:.2f}× | ≤ 1.2× "
                 f"| {'**met**' if r_kb <= 1.2 else '**missed**'} (cache on), "
                 f"{'**met**' if r_nc <= 1.2 else '**missed**'} (no cache) |")
    L.append("")
    for k in ("loadavg_before", "loadavg_after", "cpu_summary", "other_builds", "disk"):
        if k in meta:
            L.append(f"- {k.replace('_', ' ')}: {meta[k]}")
    L.append("")
    section = "\n".join(L)
    print(section)
    _replace_section(Path(a.out), '## Scaling', section)
    return 0


# ------------------------------------------------------------------------------------------ #
# every byte once (scripts/bench --floor, --cache-size)
# ------------------------------------------------------------------------------------------ #

EVERY_BYTE = "## Every byte once"


def _replace_section(out: Path, heading: str, section: str) -> None:
    """Put `section` (which starts with `heading`, a `## ` line) into `out` in place of the
    former section of that heading, or at the end; the other sections stay. Written whole or
    not at all (a temporary file renamed into place)."""
    text = out.read_text() if out.exists() else "# koord-bundle benchmark\n\n"
    marker = "\n" + heading + "\n"  # the whole line: "## X" is not "## X, 2 GiB"
    if marker in text:
        head, _, rest = text.partition(marker)
        nxt = rest.find("\n## ")
        tail = rest[nxt:] if nxt >= 0 else ""
        text = head.rstrip("\n") + "\n\n" + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section
    tmp = out.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, out)


def _put_section(out: Path, title: str, sub: str, body: str) -> None:
    """Put `body` under `sub` (a ### heading) of section `title` of `out`, in place of the
    former `sub`; the section's other subsections stay."""
    text = out.read_text() if out.exists() else "# koord-bundle benchmark\n\n"
    if "\n" + title not in text:
        text = text.rstrip("\n") + "\n\n" + title + "\n\n"
    head, _, rest = text.partition("\n" + title)
    nxt = rest.find("\n## ")
    section, tail = (rest[:nxt], rest[nxt:]) if nxt >= 0 else (rest, "")
    parts = section.split("\n### ")
    kept = [p for p in parts[1:] if not p.startswith(sub)]
    new = parts[0].rstrip("\n") + "\n"
    blocks = sorted(kept + [sub + "\n\n" + body.strip("\n") + "\n"])
    for b in blocks:
        new += "\n### " + b.rstrip("\n") + "\n"
    text = head.rstrip("\n") + "\n\n" + title + new + tail
    tmp = out.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, out)


def cmd_floor_report(a) -> int:
    recs: dict[tuple[str, str], dict[str, dict]] = {}
    for line in Path(a.records).read_text().splitlines():
        f = line.split("\t")
        if len(f) < 8:
            continue
        recs.setdefault((f[0], f[1]), {})[f[2]] = {"wall": float(f[3]), "rss": int(f[4])}
    cachedir: dict[tuple[str, str], int] = {}
    for line in Path(a.extra).read_text().splitlines():
        f = line.split("\t")
        if f[0] == "cachedir":
            key = (f[1], f[2])
            cachedir[key] = max(cachedir.get(key, 0), int(f[4] or 0))
    sizes = [tuple(l.split("\t")) for l in Path(a.sizes).read_text().splitlines() if l.strip()]
    meta = read_meta(Path(a.meta))

    def ratios(tool, size):
        fl, t = recs.get(("floor", size), {}), recs.get(("build-" + tool, size), {})
        return [t[r]["wall"] / fl[r]["wall"] for r in sorted(t) if r in fl and fl[r]["wall"] > 0]

    def cell(tool, size):
        r = ratios(tool, size)
        if not r:
            return "–"
        walls = [v["wall"] for v in recs[("build-" + tool, size)].values()]
        rss = max(v["rss"] for v in recs[("build-" + tool, size)].values()) / 1024
        return (f"{min(r):.2f}–{max(r):.2f}× (median {statistics.median(r):.2f}×; "
                f"{statistics.median(walls):.2f} s, {rss:.0f} MiB)")

    def human(n):
        for unit in ("B", "KiB", "MiB", "GiB"):
            if n < 1024 or unit == "GiB":
                return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
            n /= 1024
        return str(n)

    before = meta.get("before") or ""
    L = [f"Written by `scripts/bench --floor --runs {meta.get('runs', '?')}"
         + (f" --before {before}" if before else "") + f"` on {meta.get('date', '?')} "
         f"(commit {meta.get('commit', '?')}). Each build is a first build: a fresh cache "
         "directory, no bundle before it. The floor: every unique blob of the set fetched from "
         "the registry into one file each, curl 4 at a time (build's `--jobs`), then `sync -f`. "
         "Pairs alternate which goes first (A/B/A/B); each ratio is a build's wall time over "
         "the floor of its pair, given as min–max over the pairs. Target (issue 23): the default "
         "build within 1.1× of the floor (median) at 2 and 8 GiB, memory ≤ 64 MiB.", ""]
    L.append("| bundle | floor (median) | default build ÷ floor | `--no-cache` ÷ floor | "
             + ("before: default build (blob cache on) ÷ floor | " if before else "")
             + "skopeo copy + tar ÷ floor | cache dir after the build (default"
             + (" / before" if before else "") + ") | target |")
    L.append("|---|---|---|---|" + ("---|" if before else "") + "---|---|---|")
    for size, nbytes in sizes:
        gib = int(nbytes) / (1 << 30)
        fl = [v["wall"] for v in recs.get(("floor", size), {}).values()]
        if not fl:
            continue
        flm = statistics.median(fl)
        peer = recs.get(("build-peer", size), {})
        peer_cell = "–"
        if peer:
            pw = statistics.median(v["wall"] for v in peer.values())
            peer_cell = f"{pw / flm:.2f}× ({pw:.2f} s)"
        kb = ratios("kb", size)
        rss = max((v["rss"] for v in recs.get(("build-kb", size), {}).values()), default=0) / 1024
        met = kb and statistics.median(kb) <= 1.1 and rss <= 64
        cd = human(cachedir.get(("kb", size), 0))
        if before:
            cd += " / " + human(cachedir.get(("before", size), 0))
        row = [f"{gib:.2f} GiB", f"{flm:.2f} s", cell("kb", size), cell("kb-nocache", size)]
        if before:
            row.append(cell("before", size))
        # The goal names 2 and 8 GiB (at 0.5 GiB fixed costs, helm and signing, weigh more).
        target = ("**met**" if met else "**missed**") if gib >= 1.5 else "— (the goal is at 2 and 8 GiB)"
        row += [peer_cell, cd, target]
        L.append("| " + " | ".join(row) + " |")
    L.append("")
    for k in ("loadavg_before", "loadavg_after", "disk"):
        if k in meta:
            L.append(f"- {k.replace('_', ' ')}: {meta[k]}")
    body = "\n".join(L)
    print(body)
    _put_section(Path(a.out), EVERY_BYTE, "Builds beside the floor", body)
    return 0


def cmd_cache_size_report(a) -> int:
    meta = read_meta(Path(a.meta))
    rows = [l.split("\t") for l in Path(a.extra).read_text().splitlines() if l.startswith("cachesize")]
    L = [f"Written by `scripts/bench --cache-size` on {meta.get('date', '?')} (commit "
         f"{meta.get('commit', '?')}): every chart version of the test environment's Helm "
         "repository built once, oldest first, one cache directory for all (`du -sb` after each "
         "build; the bundles themselves are elsewhere).", "",
         "| version | bundle | downloaded / reused from earlier bundles | cache dir after | holds |",
         "|---|---|---|---|---|"]
    for _, v, cache, bundle, fetched, files in rows:
        d, c = (int(x) for x in fetched.split())
        L.append(f"| {v} | {int(bundle) / (1 << 20):.1f} MiB | {d / (1 << 20):.2f} MiB / "
                 f"{c / (1 << 20):.2f} MiB | {int(cache) / 1024:.1f} KiB | {files.strip()} |")
    body = "\n".join(L)
    print(body)
    _put_section(Path(a.out), EVERY_BYTE, "The cache directory after every chart version", body)
    return 0


# ------------------------------------------------------------------------------------------ #
# report
# ------------------------------------------------------------------------------------------ #

def read_records(path: Path) -> dict[tuple[str, str], list[dict]]:
    out: dict[tuple[str, str], list[dict]] = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        measure, tool, run, wall, rss, user, sys_, reg = line.split("\t")
        out.setdefault((measure, tool), []).append({
            "run": int(run), "wall": float(wall), "rss_kib": int(rss), "user": float(user),
            "sys": float(sys_), "registry_cpu": float(reg)})
    return out


def read_meta(path: Path) -> dict[str, str]:
    meta = {}
    for line in path.read_text().splitlines():
        if "\t" in line:
            k, v = line.split("\t", 1)
            meta[k] = v.strip()
    return meta


def fmt_s(x: float) -> str:
    return f"{x:.2f} s" if x >= 0.1 else f"{x * 1000:.0f} ms"


def fmt_mib(kib: float) -> str:
    return f"{kib / 1024:.1f} MiB"


def cmd_report(a) -> int:
    rec = read_records(Path(a.records))
    meta = read_meta(Path(a.meta))
    st = json.loads(Path(a.set).read_text())

    def med(m, t, key="wall"):
        return statistics.median(r[key] for r in rec[(m, t)])

    def peak(m, t):
        return max(r["rss_kib"] for r in rec[(m, t)])

    def met(ok: bool) -> str:
        return "**met**" if ok else "**missed**"

    runs = int(meta.get("runs", "0"))
    L = []
    L.append("# koord-bundle benchmark")
    L.append("")
    L.append(f"Written by `scripts/bench` on {meta['date']} ({runs} runs of each measure, median "
             "reported; peak RSS is the largest of the runs). Timings are wall-clock; they are a "
             "benchmark, never a test.")
    L.append("")
    L.append("## Results")
    L.append("")
    L.append("| measure | koord-bundle | peer | peer ÷ koord-bundle | target | |")
    L.append("|---|---|---|---|---|---|")
    kb_b, pe_b = med("build", "kb"), med("build", "peer")
    L.append(f"| build, fresh cache | {fmt_s(kb_b)} | {fmt_s(pe_b)} (skopeo copy ×{meta['images']} + tar cf) "
             f"| {pe_b / kb_b:.2f}× | ≥ 3× faster | {met(pe_b / kb_b >= 3)} |")
    if ("serve", "files") in rec:
        null, files = med("serve", "null"), med("serve", "files")
        L.append(f"| build vs the registry alone | {fmt_s(kb_b)} | {fmt_s(files)} registry → files + "
                 f"sync, {fmt_s(null)} registry → /dev/null (curl, 4 at a time) | {files / kb_b:.2f}× "
                 f"(files), {null / kb_b:.2f}× (/dev/null) | ≤ 1.3× the registry alone (into files) "
                 f"| {met(kb_b / files <= 1.3)} |")
    kb_l, pe_l = med("load", "kb"), med("load", "peer")
    L.append(f"| load into TLS + auth registry, empty | {fmt_s(kb_l)} | {fmt_s(pe_l)} (skopeo copy ×{meta['images']}) "
             f"| {pe_l / kb_l:.2f}× | ≥ 2× faster | {met(pe_l / kb_l >= 2)} |")
    if ("push", "alone") in rec:
        alone = med("push", "alone")
        bound = med("verify", "kb") + alone
        L.append(f"| load vs the registry alone | {fmt_s(kb_l)} | {fmt_s(alone)} registry ← every blob "
                 f"(curl PUT, 4 at a time); + verify {fmt_s(med('verify', 'kb'))} = {fmt_s(bound)} | "
                 f"{bound / kb_l:.2f}× | none: what the registry alone needs to receive the set | — |")
    kb_r, pe_r = med("reload", "kb"), med("reload", "peer")
    L.append(f"| re-load, everything present | {fmt_s(kb_r)} | {fmt_s(pe_r)} | {pe_r / kb_r:.2f}× "
             f"| ≤ 0.2 s and ≥ 5× | {met(kb_r <= 0.2 and pe_r / kb_r >= 5)} |")
    kb_v, sha, ossl = med("verify", "kb"), med("verify", "sha256sum"), med("verify", "openssl")
    L.append(f"| verify | {fmt_s(kb_v)} | {fmt_s(sha)} sha256sum, {fmt_s(ossl)} openssl dgst -sha256 "
             f"| {sha / kb_v:.2f}× (sha256sum), {ossl / kb_v:.2f}× (openssl) | ≥ 1.8× openssl (both cores) | {met(ossl / kb_v >= 1.8)} |")
    for m, label, peer_label in [("build", "build", "skopeo/tar"), ("load", "load", "skopeo"),
                                 ("reload", "re-load", "skopeo"), ("verify", "verify", "sha256sum")]:
        kb = peak(m, "kb")
        pt = "sha256sum" if m == "verify" else "peer"
        pe = peak(m, pt)
        extra = f", openssl {fmt_mib(peak('verify', 'openssl'))}" if m == "verify" else ""
        L.append(f"| peak RSS, {label} | {fmt_mib(kb)} | {fmt_mib(pe)} ({peer_label}{extra}) "
                 f"| {pe / kb:.2f}× | ≤ 64 MiB | {met(kb <= 64 * 1024)} |")
    bsize = int(meta["bundle_bytes"])
    ubytes = int(meta["bundle_blob_bytes"])
    ratio = bsize / ubytes
    L.append(f"| bundle size vs unique blob bytes | {bsize / MIB:.2f} MiB bundle | {ubytes / MIB:.2f} MiB "
             f"unique blobs | {ratio:.5f} (+{(ratio - 1) * 100:.3f} %) | within 1 % | {met(abs(ratio - 1) <= 0.01)} |")
    if ("build", "before") in rec:
        L.append("")
        L.append(f"Before and after, measured in the same run (before: {meta.get('before', '?')}):")
        L.append("")
        L.append("| measure | before | after | after ÷ before |")
        L.append("|---|---|---|---|")
        for m, label in [("build", "build, fresh cache"), ("load", "load"), ("reload", "re-load"),
                         ("verify", "verify")]:
            if (m, "before") in rec:
                b, k = med(m, "before"), med(m, "kb")
                L.append(f"| {label} | {fmt_s(b)} (peak RSS {fmt_mib(peak(m, 'before'))}) | "
                         f"{fmt_s(k)} (peak RSS {fmt_mib(peak(m, 'kb'))}) | {k / b:.2f} |")
    L.append("")
    L.append(f"Unique blob bytes are the bundle's own count (`koord-bundle.json` `blobs`: {meta['bundle_blob_count']} "
             f"blobs, the image set plus the chart's Helm artifact); the image set alone is "
             f"{st['unique_blobs']} blobs, {st['unique_bytes'] / MIB:.2f} MiB "
             f"({st['unique_bytes']} bytes), and the peer's OCI layout holds "
             f"{int(meta['peer_layout_blob_bytes']) / MIB:.2f} MiB of blobs in a "
             f"{int(meta['peer_tar_bytes']) / MIB:.2f} MiB tar.")
    L.append("")
    L.append("### Every run")
    L.append("")
    L.append("| measure | tool | wall (min / median / max) | CPU user+sys (median) | registry CPU during it (median) | peak RSS |")
    L.append("|---|---|---|---|---|---|")
    names = {"kb": "koord-bundle", "peer": "skopeo", "sha256sum": "sha256sum", "openssl": "openssl dgst",
             "before": "koord-bundle before", "null": "registry alone → /dev/null (curl ×4)",
             "files": "registry alone → files + sync (curl ×4)",
             "alone": "registry alone ← every blob (curl PUT ×4, TLS + auth)"}
    for m in ["serve", "push", "build", "load", "reload", "verify"]:
        for t in ["kb", "before", "peer", "sha256sum", "openssl", "null", "files", "alone"]:
            if (m, t) not in rec:
                continue
            rs = rec[(m, t)]
            walls = [r["wall"] for r in rs]
            L.append(f"| {m} | {names[t] + (' + tar' if (m, t) == ('build', 'peer') else '')} | {fmt_s(min(walls))} / {fmt_s(statistics.median(walls))} / "
                     f"{fmt_s(max(walls))} | {fmt_s(statistics.median(r['user'] + r['sys'] for r in rs))} | "
                     f"{fmt_s(statistics.median(r['registry_cpu'] for r in rs))} | {fmt_mib(peak(m, t))} |")
    L.append("")
    L.append("## What was measured")
    L.append("")
    L.append(f"- Image set: `{st['registry']}/{st['prefix']}/koordinator-sh/{{koord-manager,koord-scheduler,"
             "koord-descheduler,koordlet,koord-device-daemon}:v1.8.0` (OCI index, linux/amd64 + linux/arm64; "
             "per platform a 10 MiB base layer and a 1 MiB runtime layer shared by all five images, plus a "
             "6–26 MiB application layer) and `" + f"{st['registry']}/{st['prefix']}/big:v256" + "` (one 256 MiB layer); "
             "incompressible deterministic data (gzip level 1 over a seeded PRNG), "
             + ("reused from an earlier run." if st.get("reused") else "built and pushed by this run."))
    L.append("- build: `koord-bundle build 1.8.0 --repo http://127.0.0.1:15080/ --source 127.0.0.1:15000/bench "
             "--plain-http --cache C -o B.tar --image 127.0.0.1:15000/bench/big:v256` (cache and output removed "
             "before each run). Peer: `skopeo copy --all --preserve-digests --src-tls-verify=false` of each image, "
             "one after the other, into one `oci:DIR:REF` layout, then `tar cf` of it (layout and tar removed "
             "before each run). The peer does not fetch the chart, extract CRDs, write checksums or sign.")
    L.append("- load: `koord-bundle load B.tar --registry 127.0.0.1:15001/<fresh prefix> --ca-file CA --username koord "
             "--password-stdin --no-install --key PUB` (it verifies the whole bundle first, then pushes, also the "
             "chart artifact). Peer: `skopeo copy --all --preserve-digests --dest-cert-dir CA_DIR --dest-creds …` "
             "of each image from the peer's layout to its own fresh prefix, after removing skopeo's blob info "
             f"cache ({meta['blob_info_cache']}).")
    L.append("- re-load: the same commands again, same prefix (skopeo's blob info cache removed again).")
    L.append("- the registry alone (build's bound): `curl --parallel --parallel-max 4 -K CFG` fetching every "
             "unique blob of the set once from the plain registry, into /dev/null, and into one file each "
             "followed by `sync -f` (a bundle has to be received and written to disk once; the build also "
             "hashes, signs and fsyncs).")
    L.append("- the registry alone receiving (load's pushes without koord-bundle): `curl --parallel --parallel-max 4 -K CFG` PUTting every "
             "unique blob of the set once into a fresh repository of the TLS + basic-auth registry, the "
             "upload sessions (one POST each) opened before the timing; load adds its verify before the "
             "first byte is pushed (kept: nothing is pushed from a bundle that does not verify), the "
             "mounts into the other repositories, the manifests and the chart.")
    L.append("- verify: `koord-bundle verify B.tar --key PUB` vs `sha256sum B.tar` and `openssl dgst -sha256 B.tar`.")
    L.append("- Runs alternate which tool goes first. `sync` before every measure, outside the timing.")
    L.append("- Each command runs under `/usr/bin/time -v` (peak RSS, CPU); wall time from bash's "
             "`$EPOCHREALTIME`. Registry CPU is the docker-registry processes' utime+stime across the "
             "measure (/proc/PID/stat). Everything runs on 127.0.0.1; the bundle, cache and layouts sit in "
             f"`{meta['workdir_parent']}` (same disk as the registries' storage); with "
             f"{meta['mem_total']} of RAM the registries' blobs and the bundles stay in the page cache.")
    L.append("")
    L.append("## Machine")
    L.append("")
    for k, label in [("nproc", "nproc"), ("cpu", "CPU"), ("cpu_flags", "SHA/AVX flags"), ("mem_total", "memory"),
                     ("disk", "disk free"), ("kernel", "kernel"), ("kb_version", "koord-bundle"),
                     ("kb_commit", "koord-bundle commit"), ("skopeo", "skopeo"), ("registry", "docker-registry"),
                     ("sha256sum", "sha256sum"), ("openssl", "openssl"), ("date", "date")]:
        L.append(f"- {label}: {meta.get(k, '?')}")
    L.append("")
    L.append("## Load on the machine during the run")
    L.append("")
    L.append(f"- load average before: {meta.get('loadavg_before', '?')}; after: {meta.get('loadavg_after', '?')}")
    L.append(f"- CPU time over the measurements: {meta.get('cpu_summary', '?')}")
    L.append(f"- {meta.get('other_builds', 'no other build seen')}")
    L.append(f"- bench wall time: {meta.get('bench_seconds', '?')} s (image set: {meta.get('set_seconds', '?')} s)")
    L.append("")
    text = "\n".join(L) + "\n"
    sys.stdout.write(text)
    out = Path(a.out)
    # The sections of earlier `--scale`, `--parity` and `--diff` runs stay (each has its own date).
    old = out.read_text() if out.exists() else ""
    for kept in ("\n## Scaling", "\n## Parity parts and par2", "\n## diff", "\n" + EVERY_BYTE):
        if kept in old:
            rest = old.partition(kept)[2]
            nxt = rest.find("\n## ")
            text += kept + (rest[:nxt] if nxt >= 0 else rest).rstrip("\n") + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, out)
    return 0


# ------------------------------------------------------------------------------------------ #
# parity parts against par2 (scripts/bench --parity)
# ------------------------------------------------------------------------------------------ #

# Damage scenarios, on a set of 10 data parts (and 2 parity parts, or par2 files beside them).
# Offsets are in the data of a part (after koord-bundle's header area), so both sets get the
# same bundle bytes damaged. Each: (name, description, [(action, part, start MiB, end MiB)]).
SCENARIOS = {
    "lost2": "2 of the 10 data parts lost (parts 3 and 7)",
    "mix80": "80 MiB: part 2 lost, 33 MiB zeroed in part 6",
    "lost1same3": "part 1 lost, the same 1 MiB zeroed in parts 4 and 8",
    "scratch80": "80 MiB in 40 scratches of 2 MiB, 4 per data part, random offsets",
    "flips200": "200 bytes flipped, random offsets over the 10 data parts",
    "flips600": "600 bytes flipped, random offsets over the 10 data parts",
    "lost3": "3 of the 10 data parts lost (parts 0, 5, 9)",
}


def split_header(part: Path) -> dict:
    with open(part, "rb") as f:
        for _ in range(3):
            line = f.readline()
        return json.loads(f.read(int(line)))


def cmd_damage(a) -> int:
    d = Path(a.dir)
    parts = sorted(p for p in d.iterdir() if ".part" in p.name and p.name.rsplit(".part", 1)[1].isdigit())
    # The header of the koord-bundle set these data parts come from (any part has it).
    h = split_header(parts[0] if parts[0].exists() else parts[1])
    off, k = h["dataOffset"], h["dataParts"]
    data = parts[:k]
    sizes = [h["parts"][i]["size"] for i in range(k)]
    rng = random.Random(a.seed)

    def lose(i):
        data[i].unlink()

    def zero(i, start, end):
        with open(data[i], "r+b") as f:
            f.seek(off + start)
            f.write(bytes(end - start))

    def flip(i, at):
        with open(data[i], "r+b") as f:
            f.seek(off + at)
            b = f.read(1)
            f.seek(off + at)
            f.write(bytes([b[0] ^ 0x5A]))

    s = a.scenario
    if s == "lost2":
        lose(3), lose(7)
    elif s == "mix80":
        lose(2)
        zero(6, 5 * MIB, 38 * MIB)
    elif s == "lost1same3":
        lose(1)
        zero(4, 10 * MIB, 11 * MIB)
        zero(8, 10 * MIB, 11 * MIB)
    elif s == "scratch80":
        for i in range(k):
            for _ in range(4):
                at = rng.randrange(0, sizes[i] - 2 * MIB)
                zero(i, at, at + 2 * MIB)
    elif s.startswith("flips"):
        for _ in range(int(s[5:])):
            i = rng.randrange(k)
            flip(i, rng.randrange(sizes[i]))
    elif s == "lost3":
        lose(0), lose(5), lose(9)
    else:
        log(f"unknown scenario {s}")
        return 2
    return 0


def cmd_same(a) -> int:
    """Exit 0 when every part of --pristine is in --dir with the same bytes."""
    bad = []
    for p in sorted(Path(a.pristine).iterdir()):
        if ".part" not in p.name:
            continue
        q = Path(a.dir) / p.name
        if not q.exists() or q.stat().st_size != p.stat().st_size or \
                hashlib.sha256(q.read_bytes()).digest() != hashlib.sha256(p.read_bytes()).digest():
            bad.append(p.name)
    if bad:
        log(f"differ from the pristine set: {', '.join(bad)}")
        return 1
    return 0


def cmd_random_file(a) -> int:
    """--size bytes of incompressible data (seeded), written once and reused."""
    out = Path(a.out)
    if out.exists() and out.stat().st_size == a.size:
        return 0
    rng = random.Random(a.seed)
    with open(out, "wb") as f:
        left = a.size
        while left:
            n = min(left, 16 * MIB)
            f.write(rng.randbytes(n))
            left -= n
    return 0


def cmd_diff_report(a) -> int:
    """The "## diff" section: koord-bundle diff of two bench bundles, next to sha256sum."""
    rec = read_records(Path(a.records))
    meta = read_meta(Path(a.meta))
    mib = lambda k: f"{int(meta[k]) / MIB:.0f} MiB"
    L = ["## diff", "",
         f"`koord-bundle diff OLD NEW --key PUB --format F`, median of {meta.get('runs')} runs, "
         f"{meta.get('date')}, commit {meta.get('commit')}. OLD (`a.tar`, {mib('bytes_a')}) and NEW "
         f"(`b.tar`, {mib('bytes_b')}) are the bench set built at two creation times; `c.tar` "
         f"({mib('bytes_c')}) is the same set with `--platform linux/amd64`. diff reads only the "
         "heads (the files before `blobs/`); `sha256sum a.tar` is what reading one bundle whole costs.",
         "", "| what | wall (median) | peak RSS |", "|---|---|---|"]
    for (m, t), runs in sorted(rec.items()):
        wall = statistics.median(r["wall"] for r in runs)
        rss = max(r["rss_kib"] for r in runs)
        name = {"read-whole": "`sha256sum a.tar`"}.get(m, f"`diff` {m.removeprefix('diff-')}")
        L.append(f"| {name} | {fmt_s(wall)} | {fmt_mib(rss)} |")
    L += ["", f"- load average before and after: {meta.get('loadavg_before')} / {meta.get('loadavg_after')}",
          "", "<details><summary>diff a.tar c.tar --format markdown</summary>", "",
          # Its headings two levels down: no "## " line inside this section.
          "\n".join("##" + x if x.startswith("#") else x for x in Path(a.sample).read_text().rstrip().splitlines()),
          "", "</details>", ""]
    section = "\n".join(L)
    print(section)
    _replace_section(Path(a.out), '## diff', section)
    return 0


def cmd_parity_report(a) -> int:
    rec = read_records(Path(a.records))
    meta = read_meta(Path(a.meta))
    outcomes = [l.split("\t") for l in Path(a.outcomes).read_text().splitlines() if l.strip()]

    def med(m, t):
        runs = rec.get((m, t), [])
        return (statistics.median(r["wall"] for r in runs), max(r["rss_kib"] for r in runs)) if runs else None

    def fmt(x):
        return f"{x[0]:.2f} s ({x[1] / 1024:.0f} MiB)" if x else "—"

    L = ["## Parity parts and par2", ""]
    L.append(f"Written by `scripts/bench --parity` on {meta.get('date', '?')} (koord-bundle: "
             f"{meta.get('runs', '?')} runs of each timing; par2: one run of each, minutes apiece here; "
             f"median, peak RSS the largest; before every split, create, repair and copy bound the "
             f"page cache is dropped after a sync (`/proc/sys/vm/drop_caches` as root, else only the "
             f"files' pages), so each reads from the disk and neither side pays for reclaiming the "
             f"pages the other left; the output folder is emptied before the clock starts). The bundle: the image set above built "
             f"into one bundle ({int(meta['bundle_bytes']) / MIB:.1f} MiB), split into "
             f"{meta['parts']} data parts of {meta['part_size']} (`--size`) with `--parity 2`: 20 % "
             f"redundancy. par2cmdline ({meta.get('par2', '?')}) at the same redundancy (`-r20`, its "
             f"default block count and memory, both cores) over the same 10 data parts, written by "
             f"`koord-bundle split --parity 0` (the same discs, without parity parts).")
    L.append("")
    L.append("koord-bundle twice: `--parity 2` (a code per stripe, the default) and `--parity 2 "
             "--spread` (one code over the whole set, as par2 makes).")
    L.append("")
    L.append("| measure | koord-bundle | koord-bundle --spread | par2 | par2 ÷ koord-bundle | par2 ÷ --spread | goal | |")
    L.append("|---|---|---|---|---|---|---|---|")
    for name, m in (("create the recovery data", "create"),
                    ("repair after the same 80 MiB of damage (part 2 lost, 33 MiB of part 6 zeroed)", "repair-mix80")):
        k, ks, p = med(m, "kb"), med(m, "kbs"), med(m, "par2")
        if m == "create" and not ks:
            ks = med("split2s", "kb")
        r1 = p[0] / k[0] if k and p else 0
        r2 = p[0] / ks[0] if ks and p else 0
        L.append(f"| {name} | {fmt(k)} | {fmt(ks)} | {fmt(p)} | {r1:.1f}× | {r2:.1f}× | ≥ 10× | "
                 f"{'**met**' if min(r1, r2) >= 10 else '**missed**'} |")
    L.append(f"| bytes of recovery data | {int(meta['kb_recovery']) / MIB:.1f} MiB (2 parity parts) | "
             f"{int(meta.get('kbs_recovery', 0)) / MIB:.1f} MiB (2 parity parts) | "
             f"{int(meta['par2_recovery']) / MIB:.1f} MiB (.par2 files) | | | | |")
    L.append("")
    L.append("Which damage each repairs (the same bytes of the same data parts damaged in both sets; "
             "repaired means the tool exited 0 and every data part is byte-identical to the one "
             "written; seeded, so every run damages the same bytes):")
    L.append("")
    L.append("| damage | koord-bundle repair | koord-bundle --spread repair | par2 repair |")
    L.append("|---|---|---|---|")
    res = {}
    for sc, tool, rc, same, wall in outcomes:
        res.setdefault(sc, {})[tool] = (rc, same, float(wall))
    for sc, desc in SCENARIOS.items():
        if sc not in res:
            continue
        cells = []
        for t in ("kb", "kbs", "par2"):
            rc, same, wall = res[sc].get(t, ("?", "no", 0.0))
            ok = rc == "0" and same == "yes"
            cells.append(f"{'repaired' if ok else 'refused' if rc != '0' else 'WRONG BYTES'} ({wall:.1f} s)")
        L.append(f"| {desc} | {cells[0]} | {cells[1]} | {cells[2]} |")
    L.append("")
    L.append("Where each is stronger: koord-bundle by default codes each stripe of blocks across the "
             "parts on its own (any 2 damaged blocks of a stripe are rebuilt, however much else is "
             "damaged, at disk speed, and readers rebuild a block from its stripe alone); par2 and "
             "koord-bundle `--spread` code the whole set at once (any damaged blocks up to the "
             "recovery block count, wherever they are). A partly damaged block costs a whole one: "
             "`--spread` makes about 4096 data blocks (par2 about 2000 by default), so the same "
             "damage costs it fewer blocks.")
    L.append("")
    def ok(sc, t):
        r = res.get(sc, {}).get(t)
        return bool(r) and r[0] == "0" and r[1] == "yes"
    groups = {"only koord-bundle repairs": [], "only par2 repairs": [], "both repair": [], "neither repairs": []}
    for sc, desc in SCENARIOS.items():
        if sc in res:
            k, p = ok(sc, "kb"), ok(sc, "par2")
            key = ("both repair" if k and p else "only koord-bundle repairs" if k
                   else "only par2 repairs" if p else "neither repairs")
            groups[key].append(desc)
    for key, descs in groups.items():
        if descs:
            L.append(f"- {key}: " + "; ".join(descs) + ".")
    weaker = [desc for sc, desc in SCENARIOS.items() if sc in res and ok(sc, "par2") and not ok(sc, "kbs")]
    more = [desc for sc, desc in SCENARIOS.items() if sc in res and ok(sc, "kbs") and not ok(sc, "par2")]
    L.append(f"- `--spread` no weaker than par2 (repairs every damage par2 repairs): "
             f"{'**met**' if not weaker else '**missed**: ' + '; '.join(weaker)}"
             + (f"; it also repairs: {'; '.join(more)}" if more else "") + ".")
    L.append("")
    L.append("Split with and without parity, and repair against the disk (a copy of the same "
             "bytes): split goal ≤ 1.3× split without parity; repair of 2 lost parts at least at "
             "the speed of reading the 10 surviving parts from the disk and writing the 2 rebuilt "
             "ones (`cat` to /dev/null, then `dd conv=fsync`, from a dropped page cache as "
             "above); memory ≤ 128 MiB.")
    L.append("")
    L.append("| size | split | split --parity 2 | ÷ | goal | repair 2 lost parts | copy of the same bytes | ÷ | goal | peak RSS (split, repair) |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for tag, label in (("", f"bench bundle ({int(meta['bundle_bytes']) / MIB:.0f} MiB)"), ("-2g", "2 GiB")):
        rows.append((tag, label, "split2", "kb"))
    for tag, label in (("", f"bench bundle ({int(meta['bundle_bytes']) / MIB:.0f} MiB), --spread"), ("-2g", "2 GiB, --spread")):
        rows.append((tag, label, "split2s", "kbs"))
    for tag, label, split, tool in rows:
        s0, s2 = med("split0" + tag, "kb"), med(split + tag, "kb")
        rp, cp = med("repair-lost2" + tag, tool), med("copy-lost2" + tag, "io")
        if not (s0 and s2 and rp and cp):
            continue
        r1, r2 = s2[0] / s0[0], rp[0] / cp[0]
        rss = max(s2[1], rp[1]) / 1024
        if tool == "kbs":
            # The speed goals are the default's; --spread trades them for par2's reach.
            g1 = g2 = "(none: the default's)"
        else:
            g1 = f"≤ 1.3× {'**met**' if r1 <= 1.3 else '**missed**'}"
            g2 = f"≤ 1× {'**met**' if r2 <= 1.0 else '**missed**'}"
        L.append(f"| {label} | {s0[0]:.2f} s | {s2[0]:.2f} s | {r1:.2f}× | {g1} "
                 f"| {rp[0]:.2f} s | {cp[0]:.2f} s | {r2:.2f}× | {g2} "
                 f"| {s2[1] / 1024:.0f} MiB, {rp[1] / 1024:.0f} MiB ({'**met**' if rss <= 128 else '**missed**'}) |")
    L.append("")
    for k in ("commands", "loadavg_before", "loadavg_after", "other_builds", "disk", "commit"):
        if k in meta:
            L.append(f"- {k.replace('_', ' ')}: {meta[k]}")
    L.append("")
    section = "\n".join(L)
    print(section)
    _replace_section(Path(a.out), "## Parity parts and par2", section)
    return 0


# ------------------------------------------------------------------------------------------ #
# peers side by side (scripts/bench --peers)
# ------------------------------------------------------------------------------------------ #

def cmd_peer_manifests(a) -> int:
    """The peers' inputs for the bench set: a Hauler manifest (Images + Charts) and a Zarf
    package definition (one required component with the images, pinned by tag@digest so that
    Zarf keeps the whole index instead of one platform, and the chart)."""
    st = json.loads(Path(a.set).read_text())
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    refs = [f"{a.registry}/{a.prefix}/{i['ref']}" for i in st["images"]]
    pinned = [f"{a.registry}/{a.prefix}/{i['ref']}@{i['digest']}" for i in st["images"]]
    tmpl = Path(__file__).resolve().parent / "peers"
    h = (tmpl / "hauler.yaml.in").read_text()
    h = h.replace("@IMAGES@", "\n".join(f"    - name: {r}" for r in refs))
    h = h.replace("@HELM_REPO@", a.helm_repo).replace("@CHART_VERSION@", a.chart_version)
    (out / "hauler.yaml").write_text(h)
    z = (tmpl / "zarf.yaml.in").read_text()
    z = z.replace("@IMAGES@", "\n".join(f"      - {r}" for r in pinned))
    z = z.replace("@HELM_REPO@", a.helm_repo).replace("@CHART_VERSION@", a.chart_version)
    (out / "zarf").mkdir(exist_ok=True)
    (out / "zarf" / "zarf.yaml").write_text(z)
    return 0


PEER_ORDER = ["kb", "skopeo", "crane", "regctl", "regctl-j", "hauler", "zarf", "zarf-j"]


def cmd_peers_report(a) -> int:
    rec = read_records(Path(a.records))
    meta = read_meta(Path(a.meta))
    tools = {}  # name -> {version, build, load, notes}
    for line in Path(a.tools).read_text().splitlines():
        f = line.split("\t")
        if len(f) >= 5:
            tools[f[0]] = {"label": f[1], "version": f[2], "build": f[3], "load": f[4],
                           "note": f[5] if len(f) > 5 else ""}
    sizes = {}
    for line in Path(a.bytes).read_text().splitlines():
        f = line.split("\t")
        if len(f) == 3:
            sizes[f[0]] = (int(f[1]), f[2])
    digests: dict[str, list[tuple[str, str, str, str]]] = {}
    for line in Path(a.digests).read_text().splitlines():
        f = line.split("\t")
        if len(f) == 5:
            digests.setdefault(f[0], []).append((f[1], f[2], f[3], f[4]))
    failed = {}
    if a.failed and Path(a.failed).exists():
        for line in Path(a.failed).read_text().splitlines():
            f = line.split("\t", 1)
            if len(f) == 2:
                failed[f[0]] = f[1]

    def med(m, t):
        r = rec.get((m, t))
        return statistics.median(x["wall"] for x in r) if r else None

    def peak(m, t):
        r = rec.get((m, t))
        return max(x["rss_kib"] for x in r) if r else None

    def n(m, t):
        return len(rec.get((m, t), []))

    L = [a.title, ""]
    L.append(f"Written by `scripts/bench --peers --runs {meta.get('runs')}` on {meta.get('date')}: "
             f"every tool moves the same image set ({meta.get('set')}) from the plain registry "
             f"(`{meta.get('plain')}`, HTTP) into a fresh repository prefix of the TLS + basic-auth "
             f"registry (`{meta.get('tls')}`), both docker-registry on loopback. Median of the runs "
             "(each tool's build then load, the order of the tools reversed on even runs); peak "
             "RSS is the largest process of a step, the largest of the runs. Fresh stores, caches "
             f"and target prefixes every run; {meta.get('cold', 'the page cache is not dropped (cold-ish)')}. "
             "\"build\" ends with the artifact that crosses on disk; \"load\" starts from it "
             "(unpacking included where the tool needs it).")
    L.append("")
    L.append("| tool | version | build | build peak RSS | load | load peak RSS | artifact | "
             "digests at the far side | runs |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    for t in PEER_ORDER:
        if t not in tools:
            continue
        info = tools[t]
        b, l = med("build", t), med("load", t)
        bs = f"{fmt_s(b)}" if b is not None else "—"
        ls_ = f"{fmt_s(l)}" if l is not None else "—"
        br = fmt_mib(peak("build", t)) if b is not None else "—"
        lr = fmt_mib(peak("load", t)) if l is not None else "—"
        sz = f"{sizes[t][0] / MIB:.1f} MiB ({sizes[t][1]})" if t in sizes else "—"
        d = digests.get(t, [])
        if d:
            same = sum(1 for x in d if x[2] == x[3])
            dg = f"{same} of {len(d)} equal"
            where = sorted({x[1] for x in d})
            if where:
                dg += f" (at {', '.join(where)})"
        else:
            dg = "not checked"
        runs = f"{n('build', t)}/{n('load', t)}"
        L.append(f"| {info['label']} | {info['version']} | {bs} | {br} | {ls_} | {lr} | {sz} | {dg} | {runs} |")
    L.append("")
    kb_b, kb_l = med("build", "kb"), med("load", "kb")
    peers_b = [(med("build", t), t) for t in tools if t != "kb" and med("build", t)]
    peers_l = [(med("load", t), t) for t in tools if t != "kb" and med("load", t)]
    if kb_b and peers_b:
        fb, ft = min(peers_b)
        L.append(f"- build: the fastest peer is {tools[ft]['label']} ({fmt_s(fb)}); koord-bundle "
                 f"{fmt_s(kb_b)}: {fb / kb_b:.2f}× (goal ≥ 1.5×: "
                 f"{'**met**' if fb / kb_b >= 1.5 else '**missed**'}).")
    if kb_l and peers_l:
        fl, ft = min(peers_l)
        L.append(f"- load: the fastest peer is {tools[ft]['label']} ({fmt_s(fl)}); koord-bundle "
                 f"{fmt_s(kb_l)}: {fl / kb_l:.2f}× (goal ≥ 1.5×: "
                 f"{'**met**' if fl / kb_l >= 1.5 else '**missed**'}).")
    if "kb" in sizes:
        others = [(v[0], k) for k, v in sizes.items() if k != "kb"]
        if others:
            smin, sk = min(others)
            pct = 100 * (sizes["kb"][0] - smin) / smin
            L.append(f"- artifact: the smallest peer artifact is {tools[sk]['label']}'s "
                     f"({smin / MIB:.1f} MiB); the bundle is {pct:+.2f} % of it (goal ≤ +2 %: "
                     f"{'**met**' if pct <= 2 else '**missed**'}).")
    rss = [(max(peak("build", t) or 0, peak("load", t) or 0), t) for t in tools
           if t != "kb" and (peak("build", t) or peak("load", t))]
    if rss and (peak("build", "kb") or peak("load", "kb")):
        kbr = max(peak("build", "kb") or 0, peak("load", "kb") or 0)
        lo, lt = min(rss)
        L.append(f"- peak RSS: koord-bundle {fmt_mib(kbr)}, the lowest peer {tools[lt]['label']} "
                 f"{fmt_mib(lo)} (goal: no higher: {'**met**' if kbr <= lo else '**missed**'}).")
    if meta.get("kb_own_rss"):
        ob, oh, ol = (int(x) for x in meta["kb_own_rss"].split())
        lo_b = min((peak("build", t), t) for t in tools if t != "kb" and peak("build", t))
        lo_l = min((peak("load", t), t) for t in tools if t != "kb" and peak("load", t))
        L.append(f"- peak RSS split (one untimed build and load; `/usr/bin/time` reports the largest "
                 f"process of a tree): koord-bundle's own process {fmt_mib(ob)} in build and "
                 f"{fmt_mib(ol)} in load (VmHWM polled every 10 ms); build's `helm template` child, "
                 f"which finds the chart's images (the peers are given a list), {fmt_mib(oh)}. "
                 f"The lowest peers: build {tools[lo_b[1]]['label']} {fmt_mib(lo_b[0])}, load "
                 f"{tools[lo_l[1]]['label']} {fmt_mib(lo_l[0])}.")
    ff, pf = med("serve", "files"), med("push", "alone")
    if ff and kb_b:
        L.append(f"- the fetch floor (every unique blob once, curl 4 at a time, into files + sync): "
                 f"{fmt_s(ff)}; koord-bundle's build is {kb_b / ff:.2f}× it.")
    if pf and kb_l:
        L.append(f"- the push floor (every unique blob once, curl monolithic PUT 4 at a time): "
                 f"{fmt_s(pf)}; koord-bundle's load is {kb_l / pf:.2f}× it (goal ≤ 1.2×: "
                 f"{'**met**' if kb_l / pf <= 1.2 else '**missed**'}).")
    if a.title == "## Peers side by side":
        L.append("- the 2 GiB set: its own section, \"Peers side by side, 2 GiB\" (`--big 1834`).")
    L.append("")
    L.append("What each tool ran (the `build` and `load` steps; `$P` = plain registry/bench, "
             "`$T` = TLS registry/prefix):")
    L.append("")
    for t in PEER_ORDER:
        if t in tools:
            info = tools[t]
            L.append(f"- **{info['label']}** {info['version']}: build `{info['build']}`; load `{info['load']}`."
                     + (f" {info['note']}" if info["note"] else ""))
    for t, why in failed.items():
        L.append(f"- **{t}**: not measured: {why}")
    L.append("")
    mism = [(t, x) for t, d in digests.items() for x in d if x[2] != x[3]]
    if mism:
        L.append("Digests that differ at the far side (source → far side):")
        L.append("")
        for t, x in mism:
            L.append(f"- {tools.get(t, {}).get('label', t)}: `{x[0]}` {x[2][:19]} → {x[3][:19] or 'not found'} ({x[1]})")
        L.append("")
    L.append("Machine:")
    L.append("")
    for k in ("cpu", "nproc", "mem_total", "kernel", "loadavg_before", "loadavg_during", "loadavg_after",
              "disk", "kb_commit", "peer_builds", "bench_seconds"):
        if k in meta:
            L.append(f"- {k.replace('_', ' ')}: {meta[k]}")
    L.append("")
    L.append(f"Reproduce: `{meta.get('command', 'scripts/bench --peers')}` (builds the peers once into "
             "target/peers/ with scripts/peers/build.sh).")
    L.append("")
    section = "\n".join(L)
    print(section)
    _replace_section(Path(a.out), a.title, section)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen-set")
    g.add_argument("--registry", required=True)
    g.add_argument("--prefix", required=True)
    g.add_argument("--work", required=True)
    g.add_argument("--stamp", required=True)
    g.add_argument("--jobs", type=int, default=2)
    g.add_argument("--big-mib", type=int, default=256)
    r = sub.add_parser("report")
    r.add_argument("--records", required=True)
    r.add_argument("--meta", required=True)
    r.add_argument("--set", required=True)
    r.add_argument("--out", required=True)
    gs = sub.add_parser("gen-scale")
    gs.add_argument("--registry", required=True)
    gs.add_argument("--prefix", required=True)
    gs.add_argument("--work", required=True)
    gs.add_argument("--layers", type=int, required=True)
    gs.add_argument("--layer-mib", type=int, default=256)
    gs.add_argument("--tags", type=int, nargs="*", default=[6])
    bu = sub.add_parser("blob-urls")
    bu.add_argument("--registry", required=True)
    bu.add_argument("--prefix", required=True)
    bu.add_argument("--dir")
    bu.add_argument("refs", nargs="+")
    bp = sub.add_parser("blob-uploads")
    bp.add_argument("--registry", required=True)
    bp.add_argument("--repo", required=True)
    bp.add_argument("--user", required=True)
    bp.add_argument("--ca", required=True)
    bp.add_argument("--storage", required=True)
    bp.add_argument("--urls", required=True)
    sr = sub.add_parser("scale-report")
    sr.add_argument("--records", required=True)
    sr.add_argument("--sizes", required=True)
    sr.add_argument("--meta", required=True)
    sr.add_argument("--out", required=True)
    fr = sub.add_parser("floor-report")
    fr.add_argument("--records", required=True)
    fr.add_argument("--extra", required=True)
    fr.add_argument("--sizes", required=True)
    fr.add_argument("--meta", required=True)
    fr.add_argument("--out", required=True)
    cs = sub.add_parser("cache-size-report")
    cs.add_argument("--extra", required=True)
    cs.add_argument("--meta", required=True)
    cs.add_argument("--out", required=True)
    dm = sub.add_parser("damage")
    dm.add_argument("--dir", required=True)
    dm.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    dm.add_argument("--seed", type=int, default=20)
    sm = sub.add_parser("same")
    sm.add_argument("--dir", required=True)
    sm.add_argument("--pristine", required=True)
    rf = sub.add_parser("random-file")
    rf.add_argument("--out", required=True)
    rf.add_argument("--size", type=int, required=True)
    rf.add_argument("--seed", type=int, default=2)
    dr = sub.add_parser("diff-report")
    dr.add_argument("--records", required=True)
    dr.add_argument("--meta", required=True)
    dr.add_argument("--sample", required=True)
    dr.add_argument("--out", required=True)
    pr = sub.add_parser("parity-report")
    pr.add_argument("--records", required=True)
    pr.add_argument("--outcomes", required=True)
    pr.add_argument("--meta", required=True)
    pr.add_argument("--out", required=True)
    pm = sub.add_parser("peer-manifests")
    pm.add_argument("--set", required=True)
    pm.add_argument("--registry", required=True)
    pm.add_argument("--prefix", required=True)
    pm.add_argument("--helm-repo", required=True)
    pm.add_argument("--chart-version", default="1.8.0")
    pm.add_argument("--out-dir", required=True)
    pp = sub.add_parser("peers-report")
    pp.add_argument("--records", required=True)
    pp.add_argument("--meta", required=True)
    pp.add_argument("--tools", required=True)
    pp.add_argument("--bytes", required=True)
    pp.add_argument("--digests", required=True)
    pp.add_argument("--failed")
    pp.add_argument("--out", required=True)
    pp.add_argument("--title", default="## Peers side by side")
    a = ap.parse_args()
    return {"peer-manifests": cmd_peer_manifests, "peers-report": cmd_peers_report,
            "gen-set": cmd_gen_set, "report": cmd_report, "gen-scale": cmd_gen_scale,
            "scale-report": cmd_scale_report, "blob-urls": cmd_blob_urls,
            "blob-uploads": cmd_blob_uploads, "damage": cmd_damage, "same": cmd_same,
            "random-file": cmd_random_file, "parity-report": cmd_parity_report,
            "diff-report": cmd_diff_report, "floor-report": cmd_floor_report,
            "cache-size-report": cmd_cache_size_report}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
