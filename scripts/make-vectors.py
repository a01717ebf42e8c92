#!/usr/bin/env python3
"""Make the test vectors of the bundle format (bundle-spec/vectors/) from fixed inputs.

  make-vectors.py OUT_DIR --koord-bundle BIN --helm HELM

Inputs (bundle-spec/vectors/inputs/): the chart archive `koordinator-1.0.0.tgz` (one Deployment
per image, one CRD) and the minisign key pair `test-key.*` (TEST ONLY: unencrypted, committed).
The two images are made here, byte for byte the same on every machine (uncompressed layers,
sorted JSON): `koordinator-sh/vectors-multi:v1` (an OCI index, linux/amd64 and linux/arm64) and
`koordinator-sh/vectors-single:v1` (one linux/amd64 manifest). They are served by a registry
in this process under the fixed name `koord-bundle-vectors.invalid` (reached through this
process as an HTTP proxy on a free port), so that the bundle, which names its source, is the
same whatever port the test environment uses. With SOURCE_DATE_EPOCH fixed, `build` then
writes the same bytes, and `split` (its header signed, deterministic) the same parts.

Writes into OUT_DIR: koordinator-1.0.0.tar (the bundle), split/ (2 data parts and 1 parity
part), damaged/ (part001 with 4 bytes changed in its first data block) and expected.json.
Standard library only.
"""
import hashlib, http.server, io, json, os, shutil, subprocess, sys, tarfile, tempfile, threading

HERE = os.path.dirname(os.path.abspath(__file__))
INPUTS = os.path.join(HERE, "..", "bundle-spec", "vectors", "inputs")
HOST = "koord-bundle-vectors.invalid"
EPOCH = "1704067200"  # 2024-01-01T00:00:00Z
BUNDLE = "koordinator-1.0.0.tar"
PART_SIZE = "64K"
DAMAGE_AT = 100  # bytes into the data of part001: 4 bytes changed there
CREATED = "2024-01-01T00:00:00Z"


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def sha256(b):
    return hashlib.sha256(b).hexdigest()


class Images:
    """Blobs and manifests of the two images, and the tags naming them."""

    def __init__(self):
        self.blobs, self.tags = {}, {}

    def put(self, data, media_type):
        d = "sha256:" + sha256(data)
        self.blobs[d] = (data, media_type)
        return {"mediaType": media_type, "digest": d, "size": len(data)}

    def layer(self, text):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
            data = text.encode()
            ti = tarfile.TarInfo("etc/vectors")
            ti.size, ti.mtime, ti.mode, ti.uname, ti.gname = len(data), 0, 0o644, "", ""
            tf.addfile(ti, io.BytesIO(data))
        return buf.getvalue()

    def manifest(self, name, arch):
        layer = self.layer(f"{name} linux/{arch}\n")
        ld = self.put(layer, "application/vnd.oci.image.layer.v1.tar")
        config = canonical({"architecture": arch, "os": "linux", "created": CREATED, "config": {},
                            "rootfs": {"type": "layers", "diff_ids": [ld["digest"]]}})
        cd = self.put(config, "application/vnd.oci.image.config.v1+json")
        return self.put(canonical({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                                   "config": cd, "layers": [ld]}), "application/vnd.oci.image.manifest.v1+json")

    def make(self):
        repo = "koordinator-sh/vectors-multi"
        kids = [dict(self.manifest(repo, a), platform={"architecture": a, "os": "linux"}) for a in ("amd64", "arm64")]
        self.tags[(repo, "v1")] = self.put(canonical({"schemaVersion": 2, "manifests": kids,
                                                      "mediaType": "application/vnd.oci.image.index.v1+json"}),
                                           "application/vnd.oci.image.index.v1+json")["digest"]
        repo = "koordinator-sh/vectors-single"
        self.tags[(repo, "v1")] = self.manifest(repo, "amd64")["digest"]
        return self


def serve(images):
    """A read-only registry (distribution API: /v2/, manifests, blobs), reached as a proxy."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def answer(self, body):
            path = self.path.split("://", 1)[-1]
            path = path[path.index("/"):] if "://" in self.path else path
            parts = path.split("?")[0].strip("/").split("/")
            found = None
            if parts == ["v2"]:
                found = (b"{}", "application/json")
            elif len(parts) >= 4 and parts[0] == "v2" and parts[-2] in ("manifests", "blobs"):
                repo, ref = "/".join(parts[1:-2]), parts[-1]
                ref = images.tags.get((repo, ref), ref)
                found = images.blobs.get(ref) if any(k[0] == repo for k in images.tags) else None
            if found is None:
                self.send_response(404)
                found = (b'{"errors":[{"code":"NAME_UNKNOWN","message":"not here"}]}', "application/json")
            else:
                self.send_response(200)
                self.send_header("Docker-Content-Digest", "sha256:" + sha256(found[0]))
            self.send_header("Content-Type", found[1])
            self.send_header("Content-Length", str(len(found[0])))
            self.end_headers()
            if body:
                self.wfile.write(found[0])

        def do_GET(self):
            self.answer(True)

        def do_HEAD(self):
            self.answer(False)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def run(cmd, env, what):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        sys.exit(f"make-vectors: {what} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.stdout


def tar_file(path, name):
    with tarfile.open(path) as tf:
        return tf.extractfile(name).read()


def main(argv):
    if len(argv) != 5 or argv[1] != "--koord-bundle" or argv[3] != "--helm":
        sys.exit(__doc__.strip().split("\n\n")[0])
    out, kb, helm = os.path.abspath(argv[0]), argv[2], argv[4]
    os.makedirs(out, exist_ok=True)
    images = Images().make()
    server = serve(images)
    home = tempfile.mkdtemp(prefix="make-vectors-")
    try:
        proxy = f"http://127.0.0.1:{server.server_address[1]}"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "TMPDIR": home,
               "KOORD_BUNDLE_CONFIG_DIR": home, "KOORD_BUNDLE_CACHE_DIR": os.path.join(home, "cache"),
               "SOURCE_DATE_EPOCH": EPOCH, "HTTP_PROXY": proxy, "http_proxy": proxy,
               "NO_PROXY": "", "no_proxy": "", "LC_ALL": "C"}
        key = os.path.join(INPUTS, "test-key.key")
        bundle = os.path.join(out, BUNDLE)
        run([kb, "build", "--chart", os.path.join(INPUTS, "koordinator-1.0.0.tgz"), "--source", HOST,
             "--plain-http", "--helm", helm, "--sign-key", key, "--no-cache", "-o", bundle], env, "build")
        for d in ("split", "damaged"):
            shutil.rmtree(os.path.join(out, d), ignore_errors=True)
            os.makedirs(os.path.join(out, d))
        run([kb, "split", bundle, "--size", PART_SIZE, "--parity", "1", "--output-dir",
             os.path.join(out, "split"), "--sign-key", key], env, "split")
    finally:
        server.shutdown()
        shutil.rmtree(home, ignore_errors=True)
    parts = sorted(os.listdir(os.path.join(out, "split")))
    first = open(os.path.join(out, "split", parts[0]), "rb").read()
    head = first.split(b"\n", 3)
    header = json.loads(head[3][:int(head[2])])
    part = f"{BUNDLE}.part001"
    data = bytearray(open(os.path.join(out, "split", part), "rb").read())
    at = header["dataOffset"] + DAMAGE_AT
    for i in range(at, at + 4):
        data[i] ^= 0xFF
    open(os.path.join(out, "damaged", part), "wb").write(data)
    manifest = tar_file(bundle, "koord-bundle.json")
    m = json.loads(manifest)
    pub = open(os.path.join(INPUTS, "test-key.pub")).read().split("\n")[1]
    import base64
    keynum = base64.b64decode(pub)[2:10]
    sig = tar_file(bundle, "SHA256SUMS.minisig").decode().split("\n")
    names = ([BUNDLE] + [f"split/{p}" for p in parts] + [f"damaged/{part}"])
    expected = {
        "comment": "Made by scripts/make-vectors.py; checked by bundle-spec/reference/kbread.py --expect "
                   "and tests/it/reference_reader.rs. test-key.* is a TEST-ONLY key.",
        "files": {n: sha256(open(os.path.join(out, n), "rb").read()) for n in names},
        "bundle": {"file": BUNDLE, "key": "inputs/test-key.pub",
                   "manifestDigest": "sha256:" + sha256(manifest),
                   "keyId": "%016X" % int.from_bytes(keynum, "little"),
                   "trustedComment": sig[2][len("trusted comment: "):],
                   "chartDigest": m["chart"]["digest"],
                   "images": {"koordinator-sh/vectors-multi:v1": images.tags[("koordinator-sh/vectors-multi", "v1")],
                              "koordinator-sh/vectors-single:v1": images.tags[("koordinator-sh/vectors-single", "v1")]},
                   "blobs": len(images.blobs) + 3,  # and the chart's: manifest, config, archive
                   "manifests": 5},
        "split": {"header": header, "parts": [f"split/{p}" for p in parts]},
        "damaged": {
            "file": f"damaged/{part}",
            "changed": {"offset": at, "bytes": 4},
            "block": {"part": 1, "index": DAMAGE_AT // header["blockSize"]},
            "readerMust": "read the set with damaged/" + part + " in place of split/" + part +
                          ": find block " + str(DAMAGE_AT // header["blockSize"]) + " of part 1 damaged "
                          "(its BLAKE3-128 is not the block table's), rebuild it from the stripe's parity "
                          "block (1 damaged block, 1 parity part), say so, and give the bundle whole",
            "repairRestores": {"file": part, "sha256": sha256(open(os.path.join(out, "split", part), "rb").read())},
        },
    }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:])
