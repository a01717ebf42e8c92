#!/usr/bin/env python3
"""Write the seed corpora of the fuzz targets (standard library only, deterministic).

    fuzz/seeds/gen_seeds.py OUT_DIR REPO_ROOT

OUT_DIR/<target>/ receives the seeds of each target (bundle_reader, split_header, helm_index,
chart_archive). The chart fixtures and repository indexes are read from
REPO_ROOT/tests/fixtures/charts at run time, not copied into git.
"""

import gzip
import hashlib
import io
import json
import os
import sys
import tarfile

FORMAT_VERSION = "koord-bundle/v1"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def sha(b):
    return hashlib.sha256(b).hexdigest()


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def gz(b):
    return gzip.compress(b, compresslevel=6, mtime=0)


def tar_bytes(entries):
    """entries: (name, data or None for a directory)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for name, data in entries:
            info = tarfile.TarInfo(name.rstrip("/"))
            info.mtime = 1_700_000_000
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if data is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                t.addfile(info)
            else:
                info.mode = 0o644
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def b64(b):
    import base64

    return base64.b64encode(b).decode()


def fake_minisig(comment):
    sig = b"ED" + bytes([7] * 8) + bytes([9] * 64)
    return (
        "untrusted comment: signature from koord-bundle\n"
        f"{b64(sig)}\ntrusted comment: {comment}\n{b64(bytes([3] * 64))}\n"
    ).encode()


def bundle(signed, platforms=("amd64", "arm64")):
    """A small, valid koord-bundle/v1 tar: one multi-arch image."""
    blobs = {}

    def blob(data):
        blobs[sha(data)] = data
        return {"digest": "sha256:" + sha(data), "size": len(data)}

    children = []
    for arch in platforms:
        config = json.dumps({"architecture": arch, "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}).encode()
        layer = gz(f"layer for {arch}\n".encode())
        m = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **blob(config)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **blob(layer)}],
            }
        ).encode()
        children.append({"mediaType": OCI_MANIFEST, **blob(m), "platform": {"architecture": arch, "os": "linux"}})
    top = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": children}).encode()
    top_desc = blob(top)
    ref = "koordinator-sh/koord-manager:v1.8.0"
    index = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [
                {"mediaType": OCI_INDEX, **top_desc, "annotations": {"org.opencontainers.image.ref.name": ref}}
            ],
        }
    ).encode()
    digest = top_desc["digest"]
    manifest = json.dumps(
        {
            "formatVersion": FORMAT_VERSION,
            "tool": {"name": "koord-bundle", "version": "0.1.0"},
            "created": "2026-01-01T00:00:00Z",
            "chart": {
                "name": "koordinator",
                "version": "1.8.0",
                "appVersion": "1.8.0",
                "digest": "sha256:" + sha(b"chart"),
                "file": "charts/koordinator-1.8.0.tgz",
                "url": None,
                "indexDigest": None,
                "digestMismatchAllowed": False,
                "oci": {"ref": "charts/koordinator:1.8.0", "digest": digest, "mediaType": OCI_MANIFEST, "size": 1},
            },
            "images": [
                {
                    "ref": ref,
                    "component": "manager",
                    "repository": "koordinator-sh/koord-manager",
                    "tag": "v1.8.0",
                    "original": "registry.cn-beijing.aliyuncs.com/" + ref,
                    "source": "ghcr",
                    "sourceRef": "ghcr.io/" + ref,
                    "digest": digest,
                    "upstreamDigest": digest,
                    "mediaType": OCI_INDEX,
                    "size": top_desc["size"],
                    "platforms": ["linux/" + p for p in platforms],
                    "attestations": 0,
                    "totalSize": sum(len(b) for b in blobs.values()),
                }
            ],
            "crds": [],
            "platformFilter": None,
            "sources": ["ghcr"],
            "overrides": {"valuesFiles": [], "setKeys": [], "extraImages": []},
            "blobs": {"count": len(blobs), "bytes": sum(len(b) for b in blobs.values())},
        },
        indent=2,
    ).encode()
    files = {
        "koord-bundle.json": manifest,
        "oci-layout": b'{"imageLayoutVersion":"1.0.0"}',
        "index.json": index,
    }
    for h, data in blobs.items():
        files["blobs/sha256/" + h] = data
    sums = "".join(f"{sha(data)}  {p}\n" for p, data in sorted(files.items())).encode()
    entries = [("SHA256SUMS", sums)]
    if signed:
        entries.append(("SHA256SUMS.minisig", fake_minisig("koord-bundle koordinator 1.8.0 created 2026-01-01T00:00:00Z")))
    entries += [(p, files[p]) for p in ("koord-bundle.json", "oci-layout", "index.json")]
    entries += [("blobs/", None), ("blobs/sha256/", None)]
    entries += [("blobs/sha256/" + h, blobs[h]) for h in sorted(blobs)]
    return tar_bytes(entries), sums, manifest


def bundle_reader(out):
    plain, sums, manifest = bundle(signed=False)
    signed, _, _ = bundle(signed=True, platforms=("amd64",))
    seeds = {
        "plain-unsigned": b"\x00" + plain,
        "plain-signed": b"\x00" + signed,
        "gzip-signed": b"\x02" + gz(signed),
        "checksums": b"\x03" + sums,
        "checksums-dup": b"\x03" + sums + sums.splitlines(keepends=True)[0],
        "manifest": b"\x04" + manifest,
        "file-plain": b"\x05" + plain,
        "file-gzip": b"\x05" + gz(signed),
        "structured-empty": b"\x06",
        "structured-some": b"\x06" + bytes(range(256)),
        "structured-more": b"\x07" + bytes((i * 37) % 256 for i in range(1024)),
    }
    for name, data in seeds.items():
        write(os.path.join(out, "bundle_reader", name), data)


def split_header(out):
    """A split bundle as the split_header target reads it: parts joined by \\0PART\\0."""
    import json
    plain, _, _ = bundle(signed=False)
    size = 700
    chunks = [plain[i:i + size] for i in range(0, len(plain), size)][:4]
    whole = b"".join(chunks)
    parts = [{"file": "b.tar.part%03d" % i, "size": len(c), "sha256": "sha256:" + sha(c)}
             for i, c in enumerate(chunks)]
    header = {"format": "koord-bundle-split/v1",
              "bundle": {"file": "b.tar", "size": len(whole), "sha256": "sha256:" + sha(whole)},
              "parts": parts}
    def first(h, sig=b""):
        j = json.dumps(h).encode()
        return b"koord-bundle-split v1\n%d\n" % len(j) + j + b"\n%d\n" % len(sig) + sig + chunks[0]
    marker = b"\0PART\0"
    write(os.path.join(out, "split_header", "good"), marker.join([first(header)] + chunks[1:]))
    evil = json.loads(json.dumps(header))
    evil["bundle"]["file"] = "../../escape.tar"
    evil["parts"][1]["file"] = "../b.tar.part001"
    write(os.path.join(out, "split_header", "evil-names"), marker.join([first(evil)] + chunks[1:]))
    write(os.path.join(out, "split_header", "signed-garbage"),
          marker.join([first(header, fake_minisig("x"))] + chunks[1:]))
    write(os.path.join(out, "split_header", "one-part"), first(dict(header, parts=parts[:1])))
    # Format v2: a code per stripe and a set-wide code (--spread), each as a plausible small set
    # (block digests that do not match: every block damaged) and as a claim no file holds (200
    # blocks of 64 MiB in a 20 KiB part), which a reader must refuse within its memory budget.
    def v2(k, n, block, stride, wide, offset=16384, data=b"x" * 512):
        total = stride * k
        psize = -(-stride // block) * block if wide else stride + stride % 2
        names = ["b.tar.part%03d" % i for i in range(k)] + ["b.tar.parity%03d" % j for j in range(n)]
        sizes = [stride] * k + [psize] * n
        blocks = sum(-(-z // block) for z in sizes)
        table = bytes(16 * blocks)
        h = {"format": "koord-bundle-split/v2",
             "bundle": {"file": "b.tar", "size": total, "sha256": "sha256:" + "0" * 64},
             "partSize": offset + max(sizes), "dataOffset": offset, "blockSize": block,
             "dataParts": k, "parityParts": n,
             "code": "reed-solomon-gf16-leopard-set" if wide else "reed-solomon-gf16-leopard",
             "parts": [{"file": f, "size": z} for f, z in zip(names, sizes)],
             "blockDigest": "blake3-128",
             "blockTable": {"size": len(table), "sha256": "sha256:" + sha(table)}}
        j = json.dumps(h, separators=(",", ":")).encode()
        set_id = hashlib.sha256(j).hexdigest()[:32]
        def area(i):
            rest = "part %d of %d set %s" % (i, k + n, set_id)
            check = hashlib.sha256(rest.encode()).hexdigest()[:8]
            a = b"koord-bundle-split v2\n" + ("%s check %s\n" % (rest, check)).encode()
            a += b"%d\n" % len(j) + j + b"\n0\n\n" + b"%d\n" % len(table) + table
            return a.ljust(offset, b"\0") + data
        return marker.join(area(i) for i in range(min(k + n, 3)))
    write(os.path.join(out, "split_header", "v2-stripe"), v2(3, 1, 4096, 8192, False))
    write(os.path.join(out, "split_header", "v2-spread"), v2(3, 2, 4096, 8192, True))
    write(os.path.join(out, "split_header", "v2-spread-huge-claim"),
          v2(199, 1, 64 << 20, 64 << 20, True, data=b"y" * 4096))


def helm_index(out, charts):
    local = open(os.path.join(charts, "index.yaml"), "rb").read()
    upstream = open(os.path.join(charts, "index.upstream.yaml"), "rb").read()
    specs = ["", "latest", "1.8.0", "v1.4.1", "=1.8.0", "~1.7", ">=1.6 <1.8", ">= 1.6, < 1.8", "^0.6",
             "1.4 - 1.6", "1.7.x", "=> 1.6", "~> 1.6", "<1", "1", "*", "1.9.0-rc.1", "1.6 || 1.8", "!=1.7.0"]
    for i, s in enumerate(specs):
        write(os.path.join(out, "helm_index", f"local-{i:02}"), s.encode() + b"\0" + local)
    for i, s in enumerate(["latest", "~1.7", "<1", "0.0.1"]):
        write(os.path.join(out, "helm_index", f"upstream-{i:02}"), s.encode() + b"\0" + upstream)
    tricky = (b"apiVersion: v1\nentries:\n  koordinator:\n"
              b"  - {name: koordinator, version: 1.9.0-rc.1, urls: [c-1.9.0-rc.1.tgz], futureField: {x: 1}}\n"
              b"  - {name: koordinator, version: 1.8.0, urls: ['../up/c-1.8.0.tgz', '//cdn/c.tgz', '/abs/c.tgz?x=1']}\n"
              b"  - {name: koordinator, version: not-a-version}\n  - {name: koordinator, version: v1.7}\n"
              b"  - {name: koordinator}\n  - 42\n  other: [{version: '1', urls: a.tgz}]\n")
    write(os.path.join(out, "helm_index", "tricky"), b">=1.0\0" + tricky)
    write(os.path.join(out, "helm_index", "json"),
          b"1.0.0\0" + b'{"apiVersion":"v1","entries":{"koordinator":[{"version":"1.0.0","urls":["a.tgz"]}]}}')


def file_list(members):
    """The chart_archive file-list shape: path NUL content NUL ..."""
    out = b""
    for path, data in members:
        out += path.encode() + b"\0" + data + b"\0"
    return out


CRD = b"""{{- if and .Values.crds.managed .Values.crds.foos }}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: foos.x.io
spec:
  group: x.io
  names:
    kind: Foo
    plural: foos
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
{{- end }}
"""

TEMPLATE = b"""apiVersion: apps/v1
kind: Deployment
metadata:
  name: demo
spec:
  template:
    spec:
      containers:
      - name: a
        image: {{ .Values.imageRepositoryHost }}/{{ .Values.manager.image.repository }}:{{ .Values.manager.image.tag }}
      {{- if .Values.sidecar.enabled }}
      - name: b
        image: "{{ .Values.sidecar.image.repository }}:{{ .Values.sidecar.image.tag }}"
      {{- else }}
      - name: c
        image: busybox
      {{- end }}
"""

VALUES = b"""imageRepositoryHost: ghcr.io
manager:
  image:
    repository: koordinator-sh/koord-manager
    tag: v1.8.0
sidecar:
  enabled: false
  image:
    repository: library/sidecar
    tag: "1.0"
crds:
  managed: true
  foos: true
"""


def chart_archive(out, charts):
    for name in sorted(os.listdir(charts)):
        if name.endswith(".tgz"):
            data = open(os.path.join(charts, name), "rb").read()
            write(os.path.join(out, "chart_archive", name), data)
    # Two real charts in the file-list shape (mutations there keep the tar intact). Of 1.8.0's
    # 13 large CRD files only two are kept: they would make every run slow.
    for name in ("koordinator-0.4.1.tgz", "koordinator-1.8.0.tgz"):
        members = []
        crds = 0
        with tarfile.open(os.path.join(charts, name), "r:gz") as t:
            for m in t.getmembers():
                if m.isfile():
                    if "/templates/crd/" in m.name and name.startswith("koordinator-1.8"):
                        crds += 1
                        if crds > 2:
                            continue
                    members.append((m.name, t.extractfile(m).read()))
        write(os.path.join(out, "chart_archive", name.replace(".tgz", ".list")), file_list(members))
    chart_yaml = b"apiVersion: v2\nname: demo\nversion: 0.1.0\nappVersion: '1.0'\n"
    small = [
        ("demo/Chart.yaml", chart_yaml),
        ("demo/values.yaml", VALUES),
        ("demo/templates/deploy.yaml", TEMPLATE),
        ("demo/templates/crd/foos.yaml", CRD),
        ("demo/templates/_helpers.tpl", b'{{ define "x" }}image: {{ .Values.nope }}{{ end }}\n'),
    ]
    write(os.path.join(out, "chart_archive", "small.list"), file_list(small))
    plain_crd = CRD.split(b"\n", 1)[1].rsplit(b"{{- end }}", 1)[0]
    write(os.path.join(out, "chart_archive", "crds-folder.list"),
          file_list([("demo/Chart.yaml", chart_yaml), ("demo/crds/foo.yaml", plain_crd),
                     ("demo/templates/crd/two.yaml",
                      b"{{- if .Values.crds.managed }}\n---\n" + plain_crd.replace(b"foos", b"bars").replace(b"Foo", b"Bar")
                      + b"---\n" + plain_crd.replace(b"foos", b"bazs").replace(b"Foo", b"Baz") + b"{{- end }}\n")]))
    write(os.path.join(out, "chart_archive", "odd-entries.list"),
          file_list([("demo/Chart.yaml", chart_yaml), ("\x05demo/templates/", b""),
                     ("\x02demo/link", b"../../etc/passwd"), ("./demo/values.yaml", b"a: &x {b: 1}\nc: *x\n<<: *x\n")]))
    write(os.path.join(out, "chart_archive", "small.tgz"),
          gz(tar_bytes([("demo/", None)] + small)))


def yaml_sources(out, repo):
    """One selector byte (see fuzz_targets/yaml_sources.rs), then YAML of that source."""
    charts = os.path.join(repo, "tests", "fixtures", "charts")
    synth = os.path.join(repo, "tests", "fixtures", "charts-synthetic", "idioms")
    local = open(os.path.join(charts, "index.yaml"), "rb").read()
    kube = b"apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\nclusters: [{name: k, cluster: {server: 'https://127.0.0.1:6443'}}]\nusers: [{name: u, user: {token: t}}]\n"
    manifests = b"---\n# Source: c/templates/a.yaml\nkind: Deployment\nspec:\n  template:\n    spec:\n      containers: [{name: a, image: 'r/a:1'}]\n"
    seeds = {
        "values": b"\0image: {tag: v2}\nlist: [a, {b: c}]\nanchor: &a {x: 1}\nref: *a\n",
        "values-walkaround": b"\0a: it's\nb: [[[[[[[[x]]]]]]]]\n",
        "index-local": b"\1" + local,
        "index-json": b"\1" + b'{"apiVersion":"v1","entries":{"koordinator":[{"version":"1.0.0","urls":["a.tgz"]}],"x":[]}}',
        "kubeconfig": b"\2" + kube,
        "manifests": b"\3" + manifests,
        "chart-yaml": b"\4apiVersion: v2\nname: demo\nversion: 1.0.0\nkeywords: [a, b]\n",
        "values-yaml": b"\5image: {repository: org/app, tag: v1}\nregistry: ''\n",
        "crd": b"\6apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: foos.x.io}\nspec: {group: x.io, names: {kind: Foo, plural: foos}}\n",
    }
    # Selector 7: rendered manifests as helm prints them, of the demo chart.
    seeds["rendered-demo"] = (b"\7---\n# Source: demo/templates/x.yaml\nspec:\n  containers:\n"
                              b"  - {name: app, image: 'r.example/org/app:v1'}\n  - {name: side, image: busybox}\n")
    for name in ("deployment.yaml", "cronjob.yaml"):
        seeds["rendered-" + name] = (b"\7---\n# Source: idioms/templates/" + name.encode() + b"\n"
                                     + open(os.path.join(synth, "templates", name), "rb").read())
    for name, data in seeds.items():
        write(os.path.join(out, "yaml_sources", name), data)


def registry_auth(out):
    """WWW-Authenticate values (one per line) NUL token answer NUL Retry-After NUL error body:
    what distribution, Docker Hub, ghcr.io, Harbor and the test environment send, and the
    1 MiB head of issue 18."""
    seeds = {
        "distribution": b'Bearer realm="https://auth.example/token",service="registry.example",'
        b'scope="repository:site/a:pull,push repository:site/b:pull"\n'
        b'Basic realm="koord-bundle-test"\0'
        b'{"token":"t1","access_token":"t2","expires_in":300,"issued_at":"2026-01-01T00:00:00Z"}\0'
        b"120\0"
        b'{"errors":[{"code":"UNAUTHORIZED","message":"authentication required","detail":null}]}',
        "error-insufficient": b'Bearer realm="https://ghcr.io/token",service="ghcr.io",'
        b'scope="repository:koordinator-sh/koordlet:pull",error="insufficient_scope"\0'
        b'{"token":""}\0Sun, 06 Nov 1994 08:49:37 GMT\0<html>502 Bad Gateway</html>',
        "harbor-robot": b'Bearer realm="https://harbor.example/service/token",service="harbor-registry",'
        b'scope="repository:library/x:pull,push"\0{"access_token":"abc"}\0'
        b"Wed, 21 Oct 2015 07:28:00 GMT\0",
        "odd-spacing": b'Newauth realm="x", Bearer realm=https://a/t , service = s ,scope="a:b:c"\0\0 3 \0',
        "escapes": b'Bearer realm="https://a/t\\"q",service="\xc3\xa9t\xc3\xa9"\0{"expires_in":18446744073709551615,"token":"x"}\0\0',
        "huge-head": b'Bearer realm="http://127.0.0.1:9/token",service="' + b"x" * (1 << 20) + b'"\0\0\0',
    }
    for name, data in seeds.items():
        write(os.path.join(out, "registry_auth", name), data)


def graph_walk(out):
    """Arbitrary bytes for the `arbitrary` input of graph_walk (no structure to seed beyond
    a few shapes: the fuzzer finds the rest)."""
    for i, data in enumerate([b"\0" * 64, b"\1" * 256, bytes(range(256)) * 4, b"\xff" * 512]):
        write(os.path.join(out, "graph_walk", f"shape-{i}"), data)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    out, repo = sys.argv[1], sys.argv[2]
    charts = os.path.join(repo, "tests", "fixtures", "charts")
    bundle_reader(out)
    split_header(out)
    helm_index(out, charts)
    chart_archive(out, charts)
    yaml_sources(out, repo)
    registry_auth(out)
    graph_walk(out)


if __name__ == "__main__":
    main()
