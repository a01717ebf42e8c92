#!/usr/bin/env python3
"""Reference reader of the koord-bundle format v1 (bundle-spec/README.md), written from the spec.

Python 3 standard library only. Checks, in one streaming pass: the tar entries (§1: kind, path,
order, mode, owner), SHA256SUMS (§4: every file listed, every listed file present, each sha256),
the minisign signature (§5, with --key; Ed25519 in pure Python below), koord-bundle.json (§3),
the OCI layout (§2: oci-layout, index.json, every manifest reachable, every descriptor's blob with
its size and digest) and the reader limits (LIMITS). Prints one line per check, then a verdict.

  kbread.py BUNDLE [--key PUB]      exit 0 accepted, 1 refused (the line names what), 2 usage
  kbread.py --expect EXPECTED.json  the test vectors: every file's sha256, then the bundle's facts
"""
import base64, gzip, hashlib, json, os, re, sys, tarfile

# The reader limits. Not yet in the spec's prose: these are koord-bundle's
# (crates/koord-store/src/copy.rs, src/bundle/reader.rs), see README.md beside this file.
LIMITS = {"children": 256,             # entries of one index (manifest list)
          "depth": 4,                  # an index nested this deep (top index: 0) is refused
          "manifests": 1000,           # manifests walked per bundle (each image's walk counts its own)
          "manifestBytes": 64 << 20,   # their bytes together
          "manifestSize": 4 << 20,     # one manifest
          "blobs": 10000,              # configs and layers, counted per image
          "smallFile": 64 << 20,       # SHA256SUMS, its signature, koord-bundle.json, index.json
          "headBytes": 256 << 20, "headFiles": 10000}  # the files before blobs/
INDEX_TYPES = {"application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json"}
MANIFEST_TYPES = INDEX_TYPES | {"application/vnd.oci.image.manifest.v1+json",
                                "application/vnd.docker.distribution.manifest.v2+json"}
HEX64 = re.compile(r"[0-9a-f]{64}")

# --- Ed25519 verification (RFC 8032 §5.1.7), extended coordinates.
P = 2 ** 255 - 19
Q = 2 ** 252 + 27742317777372353535851937790883648493
D = -121665 * pow(121666, P - 2, P) % P
SQRT_M1 = pow(2, (P - 1) // 4, P)

def _add(a, b):
    A, B = (a[1] - a[0]) * (b[1] - b[0]) % P, (a[1] + a[0]) * (b[1] + b[0]) % P
    C, E = 2 * a[3] * b[3] * D % P, 2 * a[2] * b[2] % P
    e, f, g, h = B - A, E - C, E + C, B + A
    return (e * f % P, g * h % P, f * g % P, e * h % P)

def _mul(s, p):
    q = (0, 1, 1, 0)
    while s:
        if s & 1:
            q = _add(q, p)
        p, s = _add(p, p), s >> 1
    return q

def _decode(b):
    y = int.from_bytes(b, "little")
    sign, y = y >> 255, y & ((1 << 255) - 1)
    if y >= P:
        return None
    x2 = (y * y - 1) * pow(D * y * y + 1, P - 2, P) % P
    x = pow(x2, (P + 3) // 8, P)
    if (x * x - x2) % P:
        x = x * SQRT_M1 % P
    if (x * x - x2) % P or (x == 0 and sign):
        return None
    if x & 1 != sign:
        x = P - x
    return (x, y, 1, x * y % P)

BASE = _decode((4 * pow(5, P - 2, P) % P).to_bytes(32, "little"))

def ed25519_verify(pk, msg, sig):
    a, r, s = _decode(pk), _decode(sig[:32]), int.from_bytes(sig[32:], "little")
    if a is None or r is None or s >= Q or len(sig) != 64:
        return False
    h = int.from_bytes(hashlib.sha512(sig[:32] + pk + msg).digest(), "little") % Q
    lhs, rhs = _mul(s, BASE), _add(r, _mul(h, a))
    return (lhs[0] * rhs[2] - rhs[0] * lhs[2]) % P == 0 and (lhs[1] * rhs[2] - rhs[1] * lhs[2]) % P == 0

class Refused(Exception):
    pass

def say(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)

def key_id(keynum):  # as minisign prints it
    return "%016X" % int.from_bytes(keynum, "little")

def verify_minisig(sig_text, data, pub_text):
    """§5: minisign, Ed25519 over BLAKE2b-512(data) ("ED"; "Ed": over data), then the global
    signature over signature + trusted comment. Returns (key id, trusted comment)."""
    lines = sig_text.decode("utf-8").split("\n")
    if len(lines) < 4 or not lines[2].startswith("trusted comment: "):
        raise Refused("SHA256SUMS.minisig is not a minisign signature")
    sig, glob = base64.b64decode(lines[1], validate=True), base64.b64decode(lines[3], validate=True)
    pk = base64.b64decode([l for l in pub_text.decode().split("\n") if l and not l.startswith("untrusted")][0])
    if len(sig) != 74 or sig[:2] not in (b"ED", b"Ed") or len(pk) != 42 or pk[:2] != b"Ed":
        raise Refused("SHA256SUMS.minisig or the public key is not minisign Ed25519")
    if sig[2:10] != pk[2:10]:
        raise Refused(f"signed by key {key_id(sig[2:10])}, the key given is {key_id(pk[2:10])}")
    msg = hashlib.blake2b(data, digest_size=64).digest() if sig[:2] == b"ED" else data
    comment = lines[2][len("trusted comment: "):]
    if not ed25519_verify(pk[10:], msg, sig[10:]):
        raise Refused("the signature of SHA256SUMS does not verify")
    if not ed25519_verify(pk[10:], sig[10:] + comment.encode("utf-8"), glob):
        raise Refused("the trusted comment's signature does not verify")
    return key_id(sig[2:10]), comment

def rank(name):
    """§1: the entry's place in the fixed order (sort key), or None for a name the format lacks."""
    fixed = ["SHA256SUMS", "SHA256SUMS.minisig", "koord-bundle.json", "oci-layout", "index.json"]
    if name in fixed:
        return (fixed.index(name) + 1, "")
    for n, top in ((6, "charts"), (7, "crds"), (8, "bom.cdx.json"), (9, "blobs"), (10, "tools")):
        if name == top or name.startswith(top + "/"):
            return (n, name if n == 9 else "")
    return None

def check_header(m):
    """§1: regular files and directories, safe unique relative paths, mode, uid, gid."""
    if not (m.isreg() or m.isdir()):
        raise Refused(f"entry {m.name!r}: only files and directories are allowed")
    parts = m.name.split("/")
    if m.name.startswith("/") or "\\" in m.name or any(p in ("", ".", "..") for p in parts):
        raise Refused(f"entry {m.name!r}: unsafe path")
    want = 0o755 if m.isdir() or m.name.startswith("tools/") else 0o644
    if m.mode != want or m.uid != 0 or m.gid != 0:
        raise Refused(f"entry {m.name!r}: mode {m.mode:04o} uid {m.uid} gid {m.gid}, "
                      f"the format gives {want:04o}, 0, 0")

def parse_sums(b):
    """§4: `<hex>  <path>` lines, sorted by path (byte order), each path once."""
    sums, last = {}, None
    for line in b.decode("utf-8").split("\n")[:-1] if b.endswith(b"\n") else [None]:
        hexd, sep, path = (line or "").partition("  ")
        if not sep or not HEX64.fullmatch(hexd) or not path or (last is not None and path <= last):
            raise Refused(f"SHA256SUMS: malformed or unsorted line {line!r}")
        sums[path], last = hexd, path
    return sums

def read_bundle(path, pub=None):
    """Check the bundle at `path`; its facts (for --expect). Raises Refused naming what."""
    facts, files, blobs, seen, last, sums = {}, {}, {}, set(), (0, ""), None
    head_bytes = head_files = 0
    with tarfile.open(path, "r|*") as tf:
        for m in tf:
            check_header(m)
            r = rank(m.name.rstrip("/"))
            if r is None or r < last or m.name in seen or (not seen and m.name != "SHA256SUMS"):
                raise Refused(f"entry {m.name!r}: unknown, duplicate or out of the order of §1")
            seen.add(m.name)
            last = r
            if pub is not None and len(seen) == 2 and m.name != "SHA256SUMS.minisig":  # §9.1: first
                raise Refused("the bundle is not signed (no SHA256SUMS.minisig after SHA256SUMS), and a key was given")
            if m.isdir():
                continue
            if r[0] < 9:
                head_bytes, head_files = head_bytes + m.size, head_files + 1
                if head_bytes > LIMITS["headBytes"] or head_files > LIMITS["headFiles"]:
                    raise Refused(f"entry {m.name!r}: the files before blobs/ pass the head limits")
            small = m.name in ("SHA256SUMS", "SHA256SUMS.minisig", "koord-bundle.json", "index.json")
            if small and m.size > LIMITS["smallFile"]:
                raise Refused(f"entry {m.name!r}: {m.size} bytes is over the limit {LIMITS['smallFile']}")
            f, h, data = tf.extractfile(m), hashlib.sha256(), bytearray()
            keep = small or m.name == "oci-layout" or (r[0] == 9 and m.size <= LIMITS["manifestSize"])
            while chunk := f.read(1 << 20):
                h.update(chunk)
                if keep:
                    data += chunk
            if m.name == "SHA256SUMS":
                sums_bytes, sums = bytes(data), parse_sums(bytes(data))
                say(True, f"SHA256SUMS: {len(sums)} files listed, sorted")
                continue
            if m.name == "SHA256SUMS.minisig":
                if pub is not None:
                    facts["keyId"], facts["trustedComment"] = verify_minisig(bytes(data), sums_bytes, pub)
                    say(True, f"signature: key {facts['keyId']}, trusted comment {facts['trustedComment']!r}")
                continue
            if m.name not in sums:
                raise Refused(f"entry {m.name!r} is not listed in SHA256SUMS")
            if h.hexdigest() != sums[m.name]:
                raise Refused(f"entry {m.name!r} has sha256 {h.hexdigest()}, SHA256SUMS says {sums[m.name]}")
            files[m.name] = (h.hexdigest(), m.size, bytes(data) if keep else None)
            if r[0] == 9:
                if m.name[len("blobs/sha256/"):] != h.hexdigest() or not m.name.startswith("blobs/sha256/"):
                    raise Refused(f"blob {m.name!r}: its name is not its sha256 {h.hexdigest()}")
                blobs["sha256:" + h.hexdigest()] = files[m.name]
        end = tf.offset  # the end-of-archive block, or a header tarfile could not read
    with open(path, "rb") as f:  # only zeros after it (tarfile stops at an unreadable header)
        gz = f.read(2) == b"\x1f\x8b"
        f.seek(0)
        f = gzip.GzipFile(fileobj=f) if gz else f
        f.seek(end)
        while chunk := f.read(1 << 20):
            if chunk.strip(b"\0"):
                raise Refused(f"bytes after the end of the tar archive, or an unreadable tar header at byte {end}")
    if sums is None:
        raise Refused("the bundle does not start with SHA256SUMS")
    if pub is not None and "keyId" not in facts:
        raise Refused("the bundle is not signed, and a key was given")
    if pub is None:
        say(True, "signature: not checked (no --key)")
    missing = sorted(set(sums) - set(files))
    if missing:
        raise Refused(f"listed in SHA256SUMS but missing: {', '.join(missing[:12])}")
    say(True, f"sha256 of every file: {len(files)} files, {len(blobs)} blobs, each blob named by its digest")
    return check_content(files, blobs, facts)

def load_json(files, name):
    if name not in files:
        raise Refused(f"{name} is missing")
    return json.loads(files[name][2])  # not JSON: refused by main

def check_content(files, blobs, facts):
    man = load_json(files, "koord-bundle.json")
    facts["manifestDigest"] = "sha256:" + files["koord-bundle.json"][0]
    if man.get("formatVersion") != "koord-bundle/v1":
        raise Refused(f"koord-bundle.json: formatVersion {man.get('formatVersion')!r} is not koord-bundle/v1")
    chart = man.get("chart") or {}
    if chart.get("file") not in files or chart.get("digest") != "sha256:" + files[chart["file"]][0]:
        raise Refused(f"chart {chart.get('file')!r}: missing, or not the digest {chart.get('digest')} the manifest says")
    facts["chartDigest"] = chart["digest"]
    for t in man.get("tools") or []:
        if files.get(t.get("file"), (None, None))[:2] != (t.get("sha256", "").removeprefix("sha256:"), t.get("size")):
            raise Refused(f"tool {t.get('file')!r}: not the sha256 and size the manifest says")
    for c in man.get("crds") or []:
        if "sha256" in c and files.get(c["file"], [None])[0] != c["sha256"].removeprefix("sha256:"):
            raise Refused(f"CRD {c.get('file')!r}: not the sha256 the manifest says")
    omitted = {o["digest"]: o["size"] for o in man.get("omittedBlobs") or []}
    if man.get("blobList") is not None and sorted(man["blobList"]) != sorted(blobs):
        raise Refused("koord-bundle.json: blobList is not the bundle's blobs")
    if (man.get("blobs") or {}).get("count") != len(blobs):
        raise Refused(f"koord-bundle.json: blobs.count is {(man.get('blobs') or {}).get('count')}, the bundle has {len(blobs)}")
    say(True, f"koord-bundle.json: {man['formatVersion']}, chart {chart.get('name')} {chart.get('version')} "
              f"{chart['digest']}, blob list, tools and CRDs match")
    if load_json(files, "oci-layout") != {"imageLayoutVersion": "1.0.0"}:
        raise Refused("oci-layout is not {\"imageLayoutVersion\":\"1.0.0\"}")
    index = load_json(files, "index.json")
    if index.get("schemaVersion") != 2 or not isinstance(index.get("manifests"), list):
        raise Refused("index.json is not an OCI image index")
    roots = {}
    for d in index["manifests"]:
        ref = (d.get("annotations") or {}).get("org.opencontainers.image.ref.name")
        if not ref or ref in roots:
            raise Refused(f"index.json: descriptor {d.get('digest')} has no, or a duplicate, ref name")
        roots[ref] = d
    budget, declared, unique = {"manifests": 0, "manifestBytes": 0, "blobs": 0}, {}, set()

    def blob(d, what):
        size = d.get("size")
        if not isinstance(size, int) or not 0 <= size < 2 ** 63 or not isinstance(d.get("digest"), str):
            raise Refused(f"{what}: descriptor {d.get('digest')} has no valid size or digest")
        if d["digest"] not in blobs:
            if omitted.get(d["digest"]) == size:
                return None
            raise Refused(f"{what}: {d['digest']} ({d.get('mediaType')}) is referenced but not in the bundle")
        if blobs[d["digest"]][1] != size:
            raise Refused(f"{what}: {d['digest']} is {blobs[d['digest']][1]} bytes, its descriptor says {size}")
        return blobs[d["digest"]]

    def walk(d, depth, ref, seen):
        if declared.setdefault(d.get("digest"), d.get("size")) != d.get("size"):
            raise Refused(f"{ref}: {d.get('digest')} is declared with two sizes in the bundle")
        if d.get("digest") in seen:  # each image's walk takes a digest once
            return
        seen.add(d.get("digest"))
        b = blob(d, ref)
        if d.get("mediaType") not in MANIFEST_TYPES:
            budget["blobs"] += 1
            if budget["blobs"] > LIMITS["blobs"]:
                raise Refused(f"{ref}: over the limit of {LIMITS['blobs']} blobs")
            return
        if d["mediaType"] in INDEX_TYPES and depth >= LIMITS["depth"]:
            raise Refused(f"{ref}: index {d['digest']} nested deeper than the limit {LIMITS['depth']}")
        budget["manifests"] += 1
        unique.add(d["digest"])
        budget["manifestBytes"] += d["size"]
        if budget["manifests"] > LIMITS["manifests"] or budget["manifestBytes"] > LIMITS["manifestBytes"]:
            raise Refused(f"{ref}: over the limit of {LIMITS['manifests']} manifests or {LIMITS['manifestBytes']} bytes of them")
        if b is None or b[2] is None:
            raise Refused(f"{ref}: manifest {d['digest']} is absent or over the limit of {LIMITS['manifestSize']} bytes")
        doc = json.loads(b[2])  # not JSON: refused by main
        if doc.get("schemaVersion") != 2 or doc.get("mediaType", d["mediaType"]) != d["mediaType"]:
            raise Refused(f"{ref}: manifest {d['digest']} is not schemaVersion 2 of its descriptor's media type")
        if "manifests" in doc:
            if len(doc["manifests"]) > LIMITS["children"]:
                raise Refused(f"{ref}: index {d['digest']} lists {len(doc['manifests'])} manifests, "
                              f"over the limit of {LIMITS['children']} children")
            for c in doc["manifests"]:
                walk(c, depth + 1, ref, seen)
        elif isinstance(doc.get("config"), dict):
            for c in [doc["config"]] + list(doc.get("layers") or []):
                walk(dict(c, mediaType=c.get("mediaType") or "config"), depth + 1, ref, seen)
        else:
            raise Refused(f"{ref}: manifest {d['digest']} has neither manifests nor config")

    for ref, d in roots.items():
        walk(d, 0, ref, set())
    facts["images"] = {}
    for img in man.get("images") or []:
        d = roots.get(img.get("ref"))
        if d is None or d.get("digest") != img.get("digest") or d.get("mediaType") != img.get("mediaType"):
            raise Refused(f"image {img.get('ref')}: not in index.json with digest {img.get('digest')}")
        facts["images"][img["ref"]] = img["digest"]
        # Carried cosign signatures (optional): roots under their own ref, as the images.
        for sig in img.get("signatures") or []:
            sd = roots.get(sig.get("ref"))
            if sd is None or sd.get("digest") != sig.get("digest"):
                raise Refused(f"image {img.get('ref')}: signature {sig.get('ref')}: not in index.json with digest {sig.get('digest')}")
            # An OCI 1.1 referrer: named <repository>@<digest>, its manifest's subject the
            # digest it signs.
            if sig.get("scheme") == "referrer":
                subject = (json.loads(blobs[sig["digest"]][2]).get("subject") or {}).get("digest")
                if not sig["ref"].endswith("@" + sig["digest"]) or subject != sig.get("signs"):
                    raise Refused(f"image {img.get('ref')}: referrer {sig['ref']}: not named by its digest, "
                                  f"or its subject {subject} is not {sig.get('signs')}")
    oci = chart.get("oci") or {}
    cd = roots.get(oci.get("ref"))
    if cd is None or cd.get("digest") != oci.get("digest"):
        raise Refused(f"chart artifact {oci.get('ref')}: not in index.json with digest {oci.get('digest')}")
    art = json.loads(blobs[cd["digest"]][2])
    if (art.get("config") or {}).get("mediaType") != "application/vnd.cncf.helm.config.v1+json" or \
            [l.get("digest") for l in art.get("layers") or []] != [chart["digest"]]:
        raise Refused(f"chart artifact {oci['ref']}: not a Helm chart manifest whose one layer is {chart['digest']}")
    facts["blobs"], facts["manifests"] = len(blobs), len(unique)
    say(True, f"OCI layout: {len(roots)} refs, {len(unique)} manifests, every descriptor's "
              f"blob present with its size and digest, within the limits; chart artifact {oci['ref']}")
    return facts

def expect(path):
    """The test vectors: every file's sha256 as EXPECTED.json lists it, then the bundle's facts."""
    exp, base = json.load(open(path)), os.path.dirname(os.path.abspath(path))
    for name, want in sorted(exp["files"].items()):
        got = hashlib.sha256(open(os.path.join(base, name), "rb").read()).hexdigest()
        if got != want:
            raise Refused(f"{name}: sha256 {got}, {os.path.basename(path)} says {want}")
    say(True, f"{len(exp['files'])} files have the sha256 {os.path.basename(path)} lists")
    b = exp["bundle"]
    pub = open(os.path.join(base, b["key"]), "rb").read()
    facts = read_bundle(os.path.join(base, b["file"]), pub)
    for k in ("manifestDigest", "keyId", "trustedComment", "chartDigest", "images", "blobs", "manifests"):
        if facts.get(k) != b[k]:
            raise Refused(f"{b['file']}: {k} is {facts.get(k)!r}, {os.path.basename(path)} says {b[k]!r}")
    say(True, f"{b['file']}: manifest digest, key ID, chart and image digests as expected")

def main(argv):
    args, opts = list(argv), {}
    while any(a.startswith("--") for a in args):
        i = next(i for i, a in enumerate(args) if a.startswith("--"))
        if args[i] in ("--key", "--expect") and i + 1 < len(args) and args[i] not in opts:
            opts[args[i]] = args[i + 1]
            del args[i:i + 2]
        else:
            args = []
    key, exp = opts.get("--key"), opts.get("--expect")
    if (exp is None) != (len(args) == 1) or (exp and key):
        print("usage:\n" + __doc__.strip().split("\n\n")[-1], file=sys.stderr)
        return 2
    try:
        if exp:
            expect(exp)
        else:
            read_bundle(args[0], open(key, "rb").read() if key else None)
    except Exception as e:  # a tar, JSON or file of another shape than the spec's is refused
        say(False, str(e) if isinstance(e, Refused) else f"malformed ({type(e).__name__}: {e})")
        print(f"verdict: refused: {e}")
        return 1
    print("verdict: accepted")
    return 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
