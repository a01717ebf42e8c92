#!/usr/bin/env python3
"""Generate synthetic, deterministic OCI images and push them to the test registries.

Only the Python standard library is used. Images are written into one OCI image
layout (shared blobs) and pushed with `skopeo copy --all --preserve-digests`.

Default mode (used by scripts/test-env.sh):

  * For every chart in tests/fixtures/charts (all 21 published versions), every
    image that real `helm template` renders from it with its default values is
    pushed to the PLAIN registry under exactly that repository path and tag
    (`koordinatorsh/*` for 0.1-0.4, `koordinator-sh/*` after; the host is
    dropped). helm comes from --helm (default .tools/helm3/helm).
  * As upstream: images of charts 1.4.0 and later are OCI image indexes with
    linux/amd64 and linux/arm64 manifests; older ones a single linux/amd64
    image manifest. Each manifest has a shared per-arch BASE layer and a tiny
    per-image layer. The 1.8.0 koordlet index also carries a buildx-style
    attestation manifest (platform unknown/unknown).
  * The 1.8.0 images are also pushed to the TLS registry (with credentials)
    and to the PLAIN registry under `mirror-partial/` (all but
    koord-descheduler).
  * The 1.8.0 images are also pushed to the TOKEN registry (Docker token auth,
    blobs redirected to a CDN stand-in): koord-manager and koord-scheduler as
    Docker schema 2 manifest lists (Docker media types throughout, pushed from
    skopeo's `dir:` transport, which keeps them), the others as OCI indexes
    (koordlet with its buildx attestation). Their digests are recorded under
    `token` in images.json.
  * A summary is printed and <env-dir>/images.json is written.

Big mode (memory benchmarks): `--big MiB --repo R --tag T` generates a
single-platform linux/amd64 image with one layer of MiB MiB of incompressible
deterministic data, streamed to disk, and pushes it.
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
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER_GZ = "application/vnd.oci.image.layer.v1.tar+gzip"
MT_INTOTO = "application/vnd.in-toto+json"
MT_DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MT_DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MT_DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
MT_DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
DOCKER_FORMAT_REPOS = ("koordinator-sh/koord-manager", "koordinator-sh/koord-scheduler")

ARCHES = ("amd64", "arm64")
CREATED = "2024-01-01T00:00:00Z"
BASE_LAYER_RANDOM_BYTES = 384 * 1024  # incompressible part of the shared base layer
MIRROR_PARTIAL_PREFIX = "mirror-partial"
MIRROR_PARTIAL_SKIP = "koord-descheduler"
TLS_CHART_VERSION = "1.8.0"
ATTESTATION_IMAGE = ("koordinator-sh/koordlet", "v1.8.0")


def log(msg: str) -> None:
    print(f"[gen-images] {msg}", file=sys.stderr, flush=True)


def die(msg: str) -> "None":
    print(f"[gen-images] ERROR: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def canonical_json(obj) -> bytes:
    # Stable bytes: sorted keys, compact separators.
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- #
# what each chart deploys: rendered by real helm
# --------------------------------------------------------------------------- #

IMAGE_LINE = re.compile(r"""^\s*(?:-\s+)?image:\s*["']?([^"'\s#]+)["']?\s*(?:#.*)?$""")
MULTI_ARCH_SINCE = (1, 4, 0)  # upstream publishes linux/amd64 + linux/arm64 since v1.4.0


def split_image(ref: str) -> tuple[str, str, str]:
    """Docker-style split of `[host/]repository:tag` into (host, repository, tag)."""
    name, _, tag = ref.rpartition(":")
    if not name or "/" in tag:
        die(f"image {ref!r} has no tag")
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest, tag
    return "", name, tag


def render_chart(helm: str, tgz: Path) -> list[tuple[str, str, str]]:
    """[(component, repository, tag)] of every image `helm template` renders from `tgz`
    with its default values (the component is the repository's last path segment)."""
    p = subprocess.run([helm, "template", "koordinator", str(tgz)], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        die(f"helm template {tgz} failed: {p.stderr.strip()[-500:]}")
    out = set()
    for line in p.stdout.splitlines():
        m = IMAGE_LINE.match(line)
        if m:
            _, repo, tag = split_image(m.group(1))
            out.add((repo.rsplit("/", 1)[-1], repo, tag))
    return sorted(out)


def chart_images(charts_dir: Path, helm: str) -> dict[str, list[tuple[str, str, str]]]:
    """{chart_version: [(component, repository, tag)]} for every koordinator-*.tgz."""
    if not helm or not os.access(helm, os.X_OK):
        die(f"helm not found at {helm!r} (run scripts/install-deps.sh, or pass --helm)")
    charts = sorted(charts_dir.glob("koordinator-*.tgz"))
    if not charts:
        die(f"no koordinator-*.tgz in {charts_dir}")
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as ex:
        rendered = list(ex.map(lambda t: render_chart(helm, t), charts))
    result = {}
    for tgz, imgs in zip(charts, rendered):
        version = tgz.name[len("koordinator-"):-len(".tgz")]
        if not imgs:
            die(f"{tgz}: helm template renders no image")
        result[version] = imgs
    return result


def version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("-")[0].split("."))


# --------------------------------------------------------------------------- #
# OCI layout writer
# --------------------------------------------------------------------------- #

class Layout:
    def __init__(self, root: Path):
        self.root = root
        self.blobs = root / "blobs" / "sha256"
        self.blobs.mkdir(parents=True, exist_ok=True)
        (root / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
        self.refs: dict[str, dict] = {}

    def put(self, data: bytes) -> tuple[str, int]:
        h = sha256_hex(data)
        p = self.blobs / h
        if not p.exists() or p.stat().st_size != len(data):
            tmp = p.with_suffix(".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, p)
        return "sha256:" + h, len(data)

    def put_json(self, obj, media_type: str, **extra) -> dict:
        digest, size = self.put(canonical_json(obj))
        d = {"mediaType": media_type, "digest": digest, "size": size}
        d.update(extra)
        return d

    def tag(self, ref: str, desc: dict) -> None:
        d = dict(desc)
        d["annotations"] = {"org.opencontainers.image.ref.name": ref}
        self.refs[ref] = d

    def write_index(self) -> None:
        idx = {
            "schemaVersion": 2,
            "mediaType": MT_INDEX,
            "manifests": [self.refs[k] for k in sorted(self.refs)],
        }
        tmp = self.root / "index.json.tmp"
        tmp.write_bytes(canonical_json(idx))
        os.replace(tmp, self.root / "index.json")


def _tarinfo(name: str, size: int = 0, dir_: bool = False, mode: int = 0o644) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.mtime = 0
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    if dir_:
        ti.type = tarfile.DIRTYPE
        ti.mode = 0o755
    else:
        ti.size = size
        ti.mode = mode
    return ti


def make_tar(entries: list[tuple[str, bytes | None, int]]) -> bytes:
    """entries: (path, content or None for a directory, mode)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for path, content, mode in entries:
            if content is None:
                tf.addfile(_tarinfo(path, dir_=True))
            else:
                tf.addfile(_tarinfo(path, len(content), mode=mode), io.BytesIO(content))
    return buf.getvalue()


def gzip_bytes(data: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=6) as gz:
        gz.write(data)
    return buf.getvalue()


class Generator:
    def __init__(self, layout: Layout):
        self.layout = layout
        self._base: dict[str, tuple[dict, str]] = {}

    def layer(self, tar_bytes: bytes) -> tuple[dict, str]:
        gz = gzip_bytes(tar_bytes)
        digest, size = self.layout.put(gz)
        return {"mediaType": MT_LAYER_GZ, "digest": digest, "size": size}, "sha256:" + sha256_hex(tar_bytes)

    def base_layer(self, arch: str) -> tuple[dict, str]:
        if arch not in self._base:
            rnd = random.Random(f"koord-bundle-base-{arch}")
            entries = [
                ("etc", None, 0),
                ("etc/os-release", f'NAME="koord-test-base"\nID=koordtest\nVERSION_ID=1\nARCH={arch}\n'.encode(), 0o644),
                ("usr", None, 0),
                ("usr/lib", None, 0),
                ("usr/lib/libkoordtest.so", rnd.randbytes(BASE_LAYER_RANDOM_BYTES), 0o755),
                ("usr/share", None, 0),
                ("usr/share/koordtest.txt", ("koord test base layer for " + arch + "\n").encode() * 512, 0o644),
            ]
            self._base[arch] = self.layer(make_tar(entries))
        return self._base[arch]

    def image_layer(self, repo: str, tag: str, arch: str) -> tuple[dict, str]:
        name = repo.rsplit("/", 1)[-1]
        info = f"image={repo}\ntag={tag}\narch={arch}\nos=linux\n".encode()
        rnd = random.Random(f"koord-bundle-image-{repo}-{tag}-{arch}")
        entries = [
            ("koord", None, 0),
            ("koord/image-info.txt", info, 0o644),
            (f"koord/{name}", b"#!/bin/sh\n# synthetic " + info.replace(b"\n", b" ") + b"\n" + rnd.randbytes(4096).hex().encode() + b"\n", 0o755),
        ]
        return self.layer(make_tar(entries))

    def platform_manifest(self, repo: str, tag: str, arch: str, docker: bool = False) -> dict:
        base_desc, base_diff = self.base_layer(arch)
        img_desc, img_diff = self.image_layer(repo, tag, arch)
        name = repo.rsplit("/", 1)[-1]
        config = {
            "architecture": arch,
            "os": "linux",
            "created": CREATED,
            "config": {
                "Entrypoint": [f"/koord/{name}"],
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                "Labels": {
                    "org.opencontainers.image.title": name,
                    "org.opencontainers.image.version": tag,
                    "org.opencontainers.image.source": "koord-bundle synthetic test image",
                },
            },
            "rootfs": {"type": "layers", "diff_ids": [base_diff, img_diff]},
            "history": [
                {"created": CREATED, "created_by": "koord-bundle gen-images: base layer"},
                {"created": CREATED, "created_by": f"koord-bundle gen-images: {repo}:{tag}"},
            ],
        }
        if docker:
            # The same bytes (config and layers), described with Docker media types.
            cfg_desc = self.layout.put_json(config, MT_DOCKER_CONFIG)
            layers = [dict(d, mediaType=MT_DOCKER_LAYER) for d in (base_desc, img_desc)]
            manifest = {"schemaVersion": 2, "mediaType": MT_DOCKER_MANIFEST, "config": cfg_desc, "layers": layers}
            return self.layout.put_json(manifest, MT_DOCKER_MANIFEST,
                                        platform={"architecture": arch, "os": "linux"})
        cfg_desc = self.layout.put_json(config, MT_CONFIG)
        manifest = {
            "schemaVersion": 2,
            "mediaType": MT_MANIFEST,
            "config": cfg_desc,
            "layers": [base_desc, img_desc],
        }
        return self.layout.put_json(manifest, MT_MANIFEST, platform={"architecture": arch, "os": "linux"})

    def attestation_manifest(self, repo: str, tag: str, subject: dict) -> dict:
        statement = {
            "_type": "https://in-toto.io/Statement/v0.1",
            "predicateType": "https://slsa.dev/provenance/v0.2",
            "subject": [{"name": f"pkg:docker/{repo}@{tag}?platform=linux%2Famd64",
                         "digest": {"sha256": subject["digest"].split(":", 1)[1]}}],
            "predicate": {
                "builder": {"id": "koord-bundle-gen-images"},
                "buildType": "https://mobyproject.org/buildkit@v1",
                "metadata": {"buildStartedOn": CREATED, "buildFinishedOn": CREATED},
            },
        }
        data = canonical_json(statement)
        digest, size = self.layout.put(data)
        layer = {"mediaType": MT_INTOTO, "digest": digest, "size": size,
                 "annotations": {"in-toto.io/predicate-type": "https://slsa.dev/provenance/v0.2"}}
        config = {"architecture": "unknown", "os": "unknown", "config": {},
                  "rootfs": {"type": "layers", "diff_ids": ["sha256:" + sha256_hex(data)]}}
        cfg_desc = self.layout.put_json(config, MT_CONFIG)
        manifest = {"schemaVersion": 2, "mediaType": MT_MANIFEST, "config": cfg_desc, "layers": [layer]}
        return self.layout.put_json(
            manifest, MT_MANIFEST,
            platform={"architecture": "unknown", "os": "unknown"},
            annotations={
                "vnd.docker.reference.digest": subject["digest"],
                "vnd.docker.reference.type": "attestation-manifest",
            },
        )

    def image(self, repo: str, tag: str, attestation: bool = False,
              multi_arch: bool = True) -> tuple[dict, list[dict]]:
        if not multi_arch:
            # As upstream before v1.4.0: one linux/amd64 image manifest, no index.
            m = self.platform_manifest(repo, tag, "amd64")
            top = {k: v for k, v in m.items() if k != "platform"}
            return top, [m]
        manifests = [self.platform_manifest(repo, tag, arch) for arch in ARCHES]
        if attestation:
            manifests.append(self.attestation_manifest(repo, tag, manifests[0]))
        index = {"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": manifests}
        return self.layout.put_json(index, MT_INDEX), manifests


    def docker_image(self, repo: str, tag: str, dest: Path) -> dict:
        """A Docker schema 2 manifest list, written as skopeo's `dir:` layout at `dest`
        (`manifest.json`, `<hex>.manifest.json` per instance, blobs by hex)."""
        manifests = [self.platform_manifest(repo, tag, arch, docker=True) for arch in ARCHES]
        index = {"schemaVersion": 2, "mediaType": MT_DOCKER_LIST, "manifests": manifests}
        desc = self.layout.put_json(index, MT_DOCKER_LIST)
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        blobs = self.layout.blobs

        def copy_blob(digest: str, name: str | None = None) -> None:
            hexd = digest.split(":", 1)[1]
            shutil.copyfile(blobs / hexd, dest / (name or hexd))

        copy_blob(desc["digest"], "manifest.json")
        for m in manifests:
            hexd = m["digest"].split(":", 1)[1]
            copy_blob(m["digest"], f"{hexd}.manifest.json")
            doc = json.loads((blobs / hexd).read_bytes())
            for b in [doc["config"], *doc["layers"]]:
                copy_blob(b["digest"])
        (dest / "version").write_text("Directory Transport Version: 1.1\n")
        return desc


def layout_ref(repo: str, tag: str) -> str:
    return (repo + "_" + tag).replace("/", "_").replace(":", "_")


# --------------------------------------------------------------------------- #
# big single-layer image, streamed
# --------------------------------------------------------------------------- #

class _HashWriter(io.RawIOBase):
    def __init__(self, f):
        self.f = f
        self.h = hashlib.sha256()
        self.n = 0

    def writable(self):
        return True

    def write(self, b):
        self.h.update(b)
        self.n += len(b)
        return self.f.write(b)


class _RandomReader(io.RawIOBase):
    def __init__(self, seed: str, size: int):
        self.rnd = random.Random(seed)
        self.left = size

    def readable(self):
        return True

    def readinto(self, b):
        n = min(len(b), self.left, 1 << 20)
        if n <= 0:
            return 0
        b[:n] = self.rnd.randbytes(n)
        self.left -= n
        return n


def build_big(layout: Layout, repo: str, tag: str, mib: int) -> dict:
    size = mib * 1024 * 1024
    tmp = layout.blobs / f"big-{os.getpid()}.tmp"
    with open(tmp, "wb") as out:
        comp = _HashWriter(out)
        with gzip.GzipFile(filename="", mode="wb", fileobj=comp, mtime=0, compresslevel=1) as gz:
            raw = _HashWriter(gz)
            with tarfile.open(fileobj=raw, mode="w|", format=tarfile.PAX_FORMAT, bufsize=1 << 20) as tf:
                tf.addfile(_tarinfo("big", dir_=True))
                reader = io.BufferedReader(_RandomReader(f"koord-bundle-big-{repo}-{tag}-{mib}", size), 1 << 20)
                tf.addfile(_tarinfo("big/data.bin", size), reader)
    blob = layout.blobs / comp.h.hexdigest()
    os.replace(tmp, blob)
    layer = {"mediaType": MT_LAYER_GZ, "digest": "sha256:" + comp.h.hexdigest(), "size": comp.n}
    config = {"architecture": "amd64", "os": "linux", "created": CREATED,
              "config": {"Labels": {"org.opencontainers.image.title": repo, "koord-bundle.test/big-mib": str(mib)}},
              "rootfs": {"type": "layers", "diff_ids": ["sha256:" + raw.h.hexdigest()]}}
    cfg = layout.put_json(config, MT_CONFIG)
    manifest = {"schemaVersion": 2, "mediaType": MT_MANIFEST, "config": cfg, "layers": [layer]}
    return layout.put_json(manifest, MT_MANIFEST)


# --------------------------------------------------------------------------- #
# pushing
# --------------------------------------------------------------------------- #

class Pusher:
    def __init__(self, args, layout: Layout, policy: Path):
        self.args = args
        self.layout = layout
        self.policy = policy

    def push(self, ref: str, dest: str, tls: bool, source: str | None = None) -> None:
        cmd = ["skopeo", "--policy", str(self.policy), "copy", "--all", "--preserve-digests",
               "--retry-times", "2", "-q"]
        if tls:
            cmd += ["--dest-creds", f"{self.args.username}:{self.args.password}"]
            if self.args.cert_dir:
                cmd += ["--dest-cert-dir", self.args.cert_dir, "--dest-tls-verify=true"]
            else:
                cmd += ["--dest-tls-verify=false"]
        else:
            cmd += ["--dest-tls-verify=false"]
        cmd += [source or f"oci:{self.layout.root}:{ref}", f"docker://{dest}"]
        last = None
        for attempt in range(3):
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if p.returncode == 0:
                return
            last = p.stdout.strip()
            time.sleep(0.5 * (attempt + 1))
        raise RuntimeError(f"skopeo copy to {dest} failed:\n{last}")


def verify(args, env_dir: Path) -> int:
    """Check that every registry path in images.json serves its expected index digest."""
    import base64
    import ssl
    import urllib.error
    import urllib.parse
    import urllib.request

    path = env_dir / "images.json"
    if not path.exists():
        log(f"verify: {path} missing")
        return 1
    images = json.loads(path.read_text())
    ctx = ssl.create_default_context(cafile=args.ca_file) if args.ca_file else ssl._create_unverified_context()
    auth = "Basic " + base64.b64encode(f"{args.username}:{args.password}".encode()).decode()
    accept = ", ".join([MT_INDEX, MT_MANIFEST,
                        "application/vnd.docker.distribution.manifest.list.v2+json",
                        "application/vnd.docker.distribution.manifest.v2+json"])
    expected_hosts = {args.plain, args.tls}
    bad = 0

    def check(ref: str, expected: str, head) -> None:
        """Count `ref` as bad (and say why, for the first three) unless `head()` answers the
        expected digest."""
        nonlocal bad
        try:
            got = head()
        except (urllib.error.URLError, OSError, KeyError, ValueError) as e:
            problem = str(e)
        else:
            if got == expected:
                return
            problem = f"digest {got}, expected {expected}"
        bad += 1
        if bad <= 3:
            log(f"verify: {ref}: {problem}")

    def head_digest(req, tls: bool):
        with urllib.request.urlopen(req, timeout=5, context=ctx if tls else None) as resp:
            return resp.headers.get("Docker-Content-Digest")

    for img in images:
        for ref in img["registry_paths"]:
            host, _, rest = ref.partition("/")
            if host not in expected_hosts:
                log(f"verify: {ref} is for another registry (ports changed?)")
                return 1
            repo, _, tag = rest.rpartition(":")
            tls = bool(args.tls) and host == args.tls
            url = f"{'https' if tls else 'http'}://{host}/v2/{repo}/manifests/{tag}"
            req = urllib.request.Request(url, method="HEAD", headers={"Accept": accept})
            if tls:
                req.add_header("Authorization", auth)
            check(ref, img["index_digest"], lambda: head_digest(req, tls))
    for img in images:
        tok = img.get("token")
        if not tok:
            continue
        if not args.token or not tok["ref"].startswith(args.token + "/"):
            log(f"verify: {tok['ref']} is for another token registry (ports changed?)")
            return 1
        repo, _, tag = tok["ref"][len(args.token) + 1:].rpartition(":")

        def token_head():
            q = urllib.parse.urlencode({"service": args.token_service, "scope": f"repository:{repo}:pull"})
            treq = urllib.request.Request(f"{args.token_auth}?{q}", headers={"Authorization": auth})
            with urllib.request.urlopen(treq, timeout=5, context=ctx) as resp:
                token = json.loads(resp.read())["token"]
            return head_digest(urllib.request.Request(
                f"https://{args.token}/v2/{repo}/manifests/{tag}", method="HEAD",
                headers={"Accept": accept, "Authorization": f"Bearer {token}"}), True)

        check(tok["ref"], tok["digest"], token_head)
    if bad:
        log(f"verify: {bad} image reference(s) missing or wrong")
        return 1
    return 0


def write_policy(path: Path) -> None:
    path.write_text('{"default":[{"type":"insecureAcceptAnything"}]}\n')


def main() -> int:
    env_dir_default = os.environ.get("KB_ENV_DIR", str(REPO_ROOT / "target" / "test-env"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env-dir", default=env_dir_default)
    ap.add_argument("--charts-dir", default=str(REPO_ROOT / "tests" / "fixtures" / "charts"))
    ap.add_argument("--plain", default=f"127.0.0.1:{os.environ.get('KB_PLAIN_PORT', '15000')}",
                    help="plain HTTP registry host:port")
    ap.add_argument("--tls", default=f"127.0.0.1:{os.environ.get('KB_TLS_PORT', '15001')}",
                    help="TLS registry host:port ('' to skip)")
    ap.add_argument("--token", default="",
                    help="token-auth registry host:port (TLS; '' to skip)")
    ap.add_argument("--token-auth", default="", help="its token service URL (for --verify)")
    ap.add_argument("--token-service", default="", help="its token service name (for --verify)")
    ap.add_argument("--cert-dir", default=None,
                    help="directory holding ca.crt for the TLS registry (default: verify off)")
    ap.add_argument("--ca-file", default=None, help="CA certificate for --verify against the TLS registry")
    ap.add_argument("--verify", action="store_true",
                    help="only check that the images listed in <env-dir>/images.json are in the registries")
    ap.add_argument("--username", default="koord")
    ap.add_argument("--password", default="koord-test-pw")
    ap.add_argument("--no-push", action="store_true", help="only write the OCI layout")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--helm", default=os.environ.get("KB_HELM", str(REPO_ROOT / ".tools" / "helm3" / "helm")),
                    help="helm binary that renders the charts (default .tools/helm3/helm)")
    ap.add_argument("--big", type=int, metavar="MiB", help="generate one big single-layer amd64 image")
    ap.add_argument("--repo", help="repository for --big")
    ap.add_argument("--tag", help="tag for --big")
    ap.add_argument("--registry", help="registry host:port for --big (default: --plain)")
    ap.add_argument("--keep-layout", action="store_true", help="--big: keep the OCI layout after pushing")
    args = ap.parse_args()

    if args.verify:
        return verify(args, Path(args.env_dir).resolve())

    if shutil.which("skopeo") is None and not args.no_push:
        die("skopeo not found (run scripts/install-deps.sh)")

    env_dir = Path(args.env_dir).resolve()
    env_dir.mkdir(parents=True, exist_ok=True)
    layout = Layout(env_dir / "oci-layout")
    policy = env_dir / "skopeo-policy.json"
    write_policy(policy)
    pusher = Pusher(args, layout, policy)

    # ---- big mode
    if args.big is not None:
        if not args.repo or not args.tag:
            die("--big needs --repo and --tag")
        if args.big <= 0:
            die("--big must be a positive number of MiB")
        t0 = time.time()
        ref = layout_ref(args.repo, args.tag)
        big_root = env_dir / "oci-big" / ref
        shutil.rmtree(big_root, ignore_errors=True)
        big_layout = Layout(big_root)
        desc = build_big(big_layout, args.repo, args.tag, args.big)
        big_layout.tag(ref, desc)
        big_layout.write_index()
        log(f"built {args.repo}:{args.tag} ({args.big} MiB) in {time.time() - t0:.1f}s: {desc['digest']}")
        dest = f"{args.registry or args.plain}/{args.repo}:{args.tag}"
        if not args.no_push:
            Pusher(args, big_layout, policy).push(ref, dest, tls=(args.registry == args.tls and bool(args.tls)))
            log(f"pushed {dest}")
            if not args.keep_layout:
                shutil.rmtree(big_root, ignore_errors=True)
        else:
            log(f"OCI layout: {big_root} (ref {ref})")
        print(f"{dest} -> {desc['digest']}")
        return 0

    # ---- default mode
    t0 = time.time()
    charts = chart_images(Path(args.charts_dir), args.helm)
    gen = Generator(layout)
    images: dict[tuple[str, str], dict] = {}
    for version, imgs in charts.items():
        for comp, repo, tag in imgs:
            key = (repo, tag)
            if key in images:
                images[key]["charts"].append(version)
                continue
            attest = key == ATTESTATION_IMAGE
            multi = version_key(version) >= MULTI_ARCH_SINCE
            desc, manifests = gen.image(repo, tag, attestation=attest, multi_arch=multi)
            ref = layout_ref(repo, tag)
            layout.tag(ref, desc)
            images[key] = {
                "repository": repo,
                "tag": tag,
                "component": comp,
                "charts": [version],
                "index_digest": desc["digest"],
                "media_type": desc["mediaType"],
                "platforms": [f"{m['platform']['os']}/{m['platform']['architecture']}" for m in manifests
                              if m["platform"]["os"] != "unknown"],
                "manifests": [{"digest": m["digest"],
                               "platform": f"{m['platform']['os']}/{m['platform']['architecture']}",
                               **({"annotations": m["annotations"]} if "annotations" in m else {})}
                              for m in manifests],
                "registry_paths": [],
                "_ref": ref,
                "_pushes": [],
            }
    layout.write_index()
    log(f"wrote {len(images)} images to OCI layout {layout.root} in {time.time() - t0:.1f}s")

    docker_dirs = env_dir / "docker-dirs"
    for (repo, tag), info in images.items():
        if TLS_CHART_VERSION in info["charts"] and args.token:
            dest = f"{args.token}/{repo}:{tag}"
            if repo in DOCKER_FORMAT_REPOS:
                ddir = docker_dirs / info["_ref"]
                desc = gen.docker_image(repo, tag, ddir)
                info["_token_push"] = (dest, f"dir:{ddir}")
                info["token"] = {"ref": dest, "digest": desc["digest"], "media_type": MT_DOCKER_LIST}
            else:
                info["_token_push"] = (dest, None)
                info["token"] = {"ref": dest, "digest": info["index_digest"], "media_type": MT_INDEX}
    layout.write_index()
    for (repo, tag), info in images.items():
        info["_pushes"].append((f"{args.plain}/{repo}:{tag}", False))
        if TLS_CHART_VERSION in info["charts"]:
            if args.tls:
                info["_pushes"].append((f"{args.tls}/{repo}:{tag}", True))
            if repo.rsplit("/", 1)[-1] != MIRROR_PARTIAL_SKIP:
                info["_pushes"].append((f"{args.plain}/{MIRROR_PARTIAL_PREFIX}/{repo}:{tag}", False))
        info["registry_paths"] = [d for d, _ in info["_pushes"]]

    if not args.no_push:
        t1 = time.time()
        jobs = [(info["_ref"], dest, tls) for info in images.values() for dest, tls in info["_pushes"]]
        jobs += [(info["_ref"], info["_token_push"][0], True, info["_token_push"][1])
                 for info in images.values() if "_token_push" in info]
        failures = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
            futs = {ex.submit(pusher.push, *j): j for j in jobs}
            for fut in concurrent.futures.as_completed(futs):
                try:
                    fut.result()
                except Exception as e:  # noqa: BLE001
                    failures.append(str(e))
        if failures:
            for f in failures:
                log(f)
            die(f"{len(failures)} of {len(jobs)} pushes failed")
        log(f"pushed {len(jobs)} image copies in {time.time() - t1:.1f}s")

    out = []
    for info in sorted(images.values(), key=lambda i: (i["repository"], i["tag"])):
        out.append({k: v for k, v in info.items() if not k.startswith("_")})
        print(f"{info['repository']}:{info['tag']} -> {info['index_digest']}")
    tmp = env_dir / "images.json.tmp"
    tmp.write_text(json.dumps(out, indent=2) + "\n")
    os.replace(tmp, env_dir / "images.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
