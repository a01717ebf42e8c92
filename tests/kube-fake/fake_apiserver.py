#!/usr/bin/env python3
"""A FAKE Kubernetes API server for koord-bundle's tests and demo: stateful, strict where the
real one is strict, and nothing more. It is not Kubernetes. See README.md beside this file for
what it models and what it does not (no controllers, no pods ever run, no admission webhooks,
no watch, no garbage collection by owner references...).

    python3 fake_apiserver.py --state-dir DIR [--port 0] [--tls] [--token T | --anonymous]
                              [--seed-dir FIXTURE_DIR]... [--git-version v1.29.2]

It writes DIR/addr (the base URL, written last, once it listens), DIR/kubeconfig (a kubeconfig
pointing at it), DIR/ca.crt with --tls, and one JSON line per request to DIR/requests.jsonl.
Endpoints outside the Kubernetes API, for tests (no authentication):
    GET  /_fake/state       every object it holds, {"objects": [...]}
    GET  /_fake/requests    the request log
    POST /_fake/hang        {"method": "POST", "path_regex": "...", "count": N}: the next N
                            matching requests never get an answer (to interrupt helm mid-way)
    POST /_fake/fail        {"method": ..., "path_regex": ..., "code": 500, "count": N}
    POST /_fake/objects     {"objects": [...]}: store objects as they are, no admission
    POST /_fake/pages       {"path_regex": ..., "mode": "cycle"|"fresh", "tokens": [...],
                            "pad_bytes": N}: LIST answers of matching paths never end: each
                            carries a continue token (the tokens in a circle, or a new one
                            each time) and N bytes of padding (a hostile server, for the
                            client's bounds)
Standard library only, plus PyYAML when a server-side apply body is YAML rather than JSON.
"""

import argparse
import base64
import copy
import datetime
import json
import os
import re
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# ---------------------------------------------------------------------------------------------
# The resources it serves. (group, version) -> [(plural, kind, namespaced, shortNames)]
BUILTIN = {
    ("", "v1"): [
        ("namespaces", "Namespace", False, ["ns"]),
        ("nodes", "Node", False, ["no"]),
        ("secrets", "Secret", True, []),
        ("configmaps", "ConfigMap", True, ["cm"]),
        ("services", "Service", True, ["svc"]),
        ("serviceaccounts", "ServiceAccount", True, ["sa"]),
        ("pods", "Pod", True, ["po"]),
        ("endpoints", "Endpoints", True, ["ep"]),
        ("events", "Event", True, ["ev"]),
        ("persistentvolumeclaims", "PersistentVolumeClaim", True, ["pvc"]),
        ("persistentvolumes", "PersistentVolume", False, ["pv"]),
        ("limitranges", "LimitRange", True, ["limits"]),
        ("resourcequotas", "ResourceQuota", True, ["quota"]),
    ],
    ("apps", "v1"): [
        ("deployments", "Deployment", True, ["deploy"]),
        ("daemonsets", "DaemonSet", True, ["ds"]),
        ("statefulsets", "StatefulSet", True, ["sts"]),
        ("replicasets", "ReplicaSet", True, ["rs"]),
        ("controllerrevisions", "ControllerRevision", True, []),
    ],
    ("rbac.authorization.k8s.io", "v1"): [
        ("clusterroles", "ClusterRole", False, []),
        ("clusterrolebindings", "ClusterRoleBinding", False, []),
        ("roles", "Role", True, []),
        ("rolebindings", "RoleBinding", True, []),
    ],
    ("admissionregistration.k8s.io", "v1"): [
        ("mutatingwebhookconfigurations", "MutatingWebhookConfiguration", False, []),
        ("validatingwebhookconfigurations", "ValidatingWebhookConfiguration", False, []),
    ],
    ("apiextensions.k8s.io", "v1"): [
        ("customresourcedefinitions", "CustomResourceDefinition", False, ["crd", "crds"]),
    ],
    ("scheduling.k8s.io", "v1"): [("priorityclasses", "PriorityClass", False, ["pc"])],
    ("policy", "v1"): [("poddisruptionbudgets", "PodDisruptionBudget", True, ["pdb"])],
    ("batch", "v1"): [("jobs", "Job", True, []), ("cronjobs", "CronJob", True, ["cj"])],
    ("coordination.k8s.io", "v1"): [("leases", "Lease", True, [])],
    ("storage.k8s.io", "v1"): [("storageclasses", "StorageClass", False, ["sc"])],
    ("networking.k8s.io", "v1"): [
        ("networkpolicies", "NetworkPolicy", True, ["netpol"]),
        ("ingresses", "Ingress", True, ["ing"]),
    ],
}
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]

# Strategic merge patch: the merge key of a list, by (parent field, field) or by field alone,
# for the built-in kinds the Koordinator chart uses (from the Go types' patchMergeKey tags).
SMP_KEYS_BY_PARENT = {
    ("containers", "ports"): "containerPort",
    ("initContainers", "ports"): "containerPort",
    ("ephemeralContainers", "ports"): "containerPort",
}
SMP_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "webhooks": "name",
    "ownerReferences": "uid",
    "conditions": "type",
    "resourceClaims": "name",
    "ports": "port",  # ServiceSpec.ports; container ports are caught above
}
# Lists of scalars merged as sets (patchStrategy=merge).
SMP_PRIMITIVE_MERGE = {"finalizers"}


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    def __init__(self, code, reason, message, details=None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def status_body(code, reason, message, details=None):
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}
    if details:
        body["details"] = details
    return body


def qualified(group, plural):
    return plural if not group else f"{plural}.{group}"


def not_found(group, plural, name):
    return ApiError(404, "NotFound", f'{qualified(group, plural)} "{name}" not found',
                    {"name": name, "group": group, "kind": plural} if group else
                    {"name": name, "kind": plural})


# ---------------------------------------------------------------------------------------------
# Kubernetes protobuf (the "k8s\0" envelope around runtime.Unknown), decoded for the kinds a
# client may send that way: helm's Secret driver (client-go's typed clientset) writes
# release Secrets as protobuf when the server advertises it. Decoded into the JSON shape.

def pb_fields(buf):
    i, out = 0, []
    while i < len(buf):
        key, i = pb_varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = pb_varint(buf, i)
        elif wire == 2:
            n, i = pb_varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"protobuf wire type {wire} not supported")
        out.append((field, wire, v))
    return out


def pb_varint(buf, i):
    shift, result = 0, 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def pb_map(entries):
    out = {}
    for raw in entries:
        k, v = "", b""
        for f, _, val in pb_fields(raw):
            if f == 1:
                k = val.decode()
            elif f == 2:
                v = val
        out[k] = v
    return out


def pb_time(raw):
    secs = 0
    for f, _, v in pb_fields(raw):
        if f == 1:
            secs = v
    return datetime.datetime.fromtimestamp(secs, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def pb_object_meta(raw):
    meta, labels, annotations, finalizers = {}, [], [], []
    names = {1: "name", 2: "generateName", 3: "namespace", 5: "uid", 6: "resourceVersion"}
    for f, _, v in pb_fields(raw):
        if f in names:
            meta[names[f]] = v.decode()
        elif f == 7:
            meta["generation"] = v
        elif f == 8:
            meta["creationTimestamp"] = pb_time(v)
        elif f == 11:
            labels.append(v)
        elif f == 12:
            annotations.append(v)
        elif f == 14:
            finalizers.append(v.decode())
    if labels:
        meta["labels"] = {k: v.decode() for k, v in pb_map(labels).items()}
    if annotations:
        meta["annotations"] = {k: v.decode() for k, v in pb_map(annotations).items()}
    if finalizers:
        meta["finalizers"] = finalizers
    return meta


def decode_protobuf(body):
    if not body.startswith(b"k8s\x00"):
        raise ApiError(415, "UnsupportedMediaType", "protobuf body without the k8s envelope")
    api_version = kind = ""
    raw = b""
    for f, _, v in pb_fields(body[4:]):
        if f == 1:  # TypeMeta
            for tf, _, tv in pb_fields(v):
                if tf == 1:
                    api_version = tv.decode()
                elif tf == 2:
                    kind = tv.decode()
        elif f == 2:
            raw = v
    obj = {"apiVersion": api_version, "kind": kind}
    if kind == "Secret":
        data = []
        for f, _, v in pb_fields(raw):
            if f == 1:
                obj["metadata"] = pb_object_meta(v)
            elif f == 2:
                data.append(v)
            elif f == 3:
                obj["type"] = v.decode()
            elif f == 5:
                obj["immutable"] = bool(v)
        if data:
            obj["data"] = {k: base64.b64encode(v).decode() for k, v in pb_map(data).items()}
        return obj
    if kind == "ConfigMap":
        data = []
        for f, _, v in pb_fields(raw):
            if f == 1:
                obj["metadata"] = pb_object_meta(v)
            elif f == 2:
                data.append(v)
        if data:
            obj["data"] = {k: v.decode() for k, v in pb_map(data).items()}
        return obj
    if kind in ("Namespace",):
        for f, _, v in pb_fields(raw):
            if f == 1:
                obj["metadata"] = pb_object_meta(v)
        return obj
    if kind in ("DeleteOptions",):
        return obj
    raise ApiError(415, "UnsupportedMediaType",
                   f"this fake decodes protobuf only for Secret, ConfigMap and Namespace, not {kind}")


# ---------------------------------------------------------------------------------------------
# Patches.

def merge_patch(target, patch):
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def smp_key(parent, field):
    return SMP_KEYS_BY_PARENT.get((parent, field)) or SMP_KEYS.get(field)


def strategic_merge(target, patch, parent=None):
    """Strategic merge patch for the built-in kinds (merge keys above), with the directives
    `$patch` (replace/delete/merge), `$retainKeys`, `$setElementOrder/F`,
    `$deleteFromPrimitiveList/F`, and null deleting a key."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    orders, deletes = {}, {}
    for k, v in patch.items():
        if k in ("$patch", "$retainKeys"):
            continue
        if k.startswith("$setElementOrder/"):
            orders[k.split("/", 1)[1]] = v
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            deletes[k.split("/", 1)[1]] = v
            continue
        if v is None:
            out.pop(k, None)
            continue
        if isinstance(v, dict):
            merged = strategic_merge(out.get(k), v, k)
            if merged is None:
                out.pop(k, None)
            else:
                out[k] = merged
        elif isinstance(v, list):
            out[k] = smp_list(out.get(k), v, parent, k)
        else:
            out[k] = copy.deepcopy(v)
    for field, values in deletes.items():
        if isinstance(out.get(field), list):
            out[field] = [x for x in out[field] if x not in values]
    for field, order in orders.items():
        if isinstance(out.get(field), list):
            out[field] = smp_order(out[field], order, smp_key(parent, field))
    if isinstance(patch.get("$retainKeys"), list):
        keep = set(patch["$retainKeys"])
        out = {k: v for k, v in out.items() if k in keep}
    return out


def smp_list(current, patch, parent, field):
    current = current if isinstance(current, list) else []
    if any(isinstance(e, dict) and e.get("$patch") == "replace" for e in patch):
        return [copy.deepcopy(e) for e in patch if not (isinstance(e, dict) and "$patch" in e)]
    key = smp_key(parent, field)
    if key is None:
        if field in SMP_PRIMITIVE_MERGE:
            out = list(current)
            for e in patch:
                if e not in out:
                    out.append(e)
            return out
        return copy.deepcopy(patch)  # atomic list: replaced
    out = [copy.deepcopy(e) for e in current]
    for e in patch:
        if not isinstance(e, dict):
            raise ApiError(422, "Invalid", f"strategic merge patch: element of {field} is not an object")
        if key not in e:
            raise ApiError(422, "Invalid", f"strategic merge patch: element of {field} lacks its merge key {key}")
        idx = next((i for i, c in enumerate(out) if isinstance(c, dict) and c.get(key) == e[key]), None)
        if e.get("$patch") == "delete":
            if idx is not None:
                out.pop(idx)
            continue
        if idx is None:
            out.append(strategic_merge({}, e, field))
        else:
            out[idx] = strategic_merge(out[idx], e, field)
    return out


def smp_order(items, order, key):
    if key is None:
        return items
    wanted = [o.get(key) if isinstance(o, dict) else o for o in order]
    pos = {v: i for i, v in enumerate(wanted)}
    listed = sorted((x for x in items if isinstance(x, dict) and x.get(key) in pos),
                    key=lambda x: pos[x.get(key)])
    rest = [x for x in items if not (isinstance(x, dict) and x.get(key) in pos)]
    return listed + rest


def json_patch(doc, ops):
    """RFC 6902."""
    doc = copy.deepcopy(doc)

    def parse(ptr):
        if ptr == "":
            return []
        if not ptr.startswith("/"):
            raise ApiError(422, "Invalid", f"JSON patch: bad path {ptr!r}")
        return [p.replace("~1", "/").replace("~0", "~") for p in ptr[1:].split("/")]

    def walk(parts):
        cur = doc
        for p in parts[:-1]:
            cur = cur[int(p)] if isinstance(cur, list) else cur[p]
        return cur, parts[-1]

    def get(ptr):
        cur = doc
        for p in parse(ptr):
            cur = cur[int(p)] if isinstance(cur, list) else cur[p]
        return cur

    def add(ptr, value):
        parent, last = walk(parse(ptr))
        if isinstance(parent, list):
            parent.insert(len(parent) if last == "-" else int(last), value)
        else:
            parent[last] = value

    def remove(ptr):
        parent, last = walk(parse(ptr))
        if isinstance(parent, list):
            return parent.pop(int(last))
        return parent.pop(last)

    if not isinstance(ops, list):
        raise ApiError(400, "BadRequest", "JSON patch: the body is not a list of operations")
    for op in ops:
        try:
            kind, path = op["op"], op.get("path", "")
            if kind == "add":
                add(path, copy.deepcopy(op["value"]))
            elif kind == "remove":
                remove(path)
            elif kind == "replace":
                remove(path)
                add(path, copy.deepcopy(op["value"]))
            elif kind == "move":
                add(path, remove(op["from"]))
            elif kind == "copy":
                add(path, copy.deepcopy(get(op["from"])))
            elif kind == "test":
                if get(path) != op["value"]:
                    raise ApiError(422, "Invalid", f"JSON patch: test of {path} failed")
            else:
                raise ApiError(422, "Invalid", f"JSON patch: unknown op {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError) as e:
            raise ApiError(422, "Invalid", f"JSON patch: {op!r} cannot be applied: {e}")
    return doc


# ---------------------------------------------------------------------------------------------
# Label selectors (equality and set-based).

SEL_RE = re.compile(r"\s*(!?)([A-Za-z0-9._/-]+)\s*(?:(==|=|!=)\s*([A-Za-z0-9._-]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*$")


def split_selector(sel):
    parts, depth, cur = [], 0, ""
    for ch in sel:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def parse_selector(sel):
    terms = []
    for raw in split_selector(sel or ""):
        m = SEL_RE.match(raw)
        if not m:
            raise ApiError(400, "BadRequest", f'unable to parse requirement: invalid label selector "{sel}"')
        neg, key, op, val, setop, setvals = m.groups()
        if op:
            terms.append((key, "!=" if op == "!=" else "=", val))
        elif setop:
            terms.append((key, setop, {v.strip() for v in setvals.split(",") if v.strip()}))
        else:
            terms.append((key, "!" if neg else "exists", None))
    return terms


def matches(labels, terms):
    labels = labels or {}
    for key, op, val in terms:
        have = labels.get(key)
        if op == "=" and have != val:
            return False
        if op == "!=" and have == val:
            return False
        if op == "in" and have not in val:
            return False
        if op == "notin" and have in val:
            return False
        if op == "exists" and key not in labels:
            return False
        if op == "!" and key in labels:
            return False
    return True


# ---------------------------------------------------------------------------------------------
# The store.

class Store:
    def __init__(self, git_version):
        self.lock = threading.RLock()
        self.objects = {}  # (group, plural, namespace, name) -> object
        self.rv = 1000
        self.git_version = git_version
        self.crd_resources = {}  # (group, version) -> [(plural, kind, namespaced, shortNames)]
        self.configz = {}  # node name -> kubelet config JSON

    def next_rv(self):
        self.rv += 1
        return str(self.rv)

    def resources(self):
        out = {k: list(v) for k, v in BUILTIN.items()}
        for k, v in self.crd_resources.items():
            out.setdefault(k, []).extend(v)
        return out

    def lookup(self, group, version, plural):
        for p, kind, namespaced, _ in self.resources().get((group, version), []):
            if p == plural:
                return kind, namespaced
        return None

    def refresh_crds(self):
        self.crd_resources = {}
        for (g, p, _, _), obj in self.objects.items():
            if (g, p) != ("apiextensions.k8s.io", "customresourcedefinitions"):
                continue
            spec = obj.get("spec", {})
            names = spec.get("names", {})
            for v in spec.get("versions", []):
                if v.get("served", True):
                    self.crd_resources.setdefault((spec.get("group", ""), v.get("name", "")), []).append(
                        (names.get("plural", ""), names.get("kind", ""), spec.get("scope") == "Namespaced",
                         names.get("shortNames", [])))

    def namespace_ok(self, ns):
        obj = self.objects.get(("", "namespaces", "", ns))
        if obj is None:
            raise ApiError(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"})
        if obj.get("status", {}).get("phase") == "Terminating":
            raise ApiError(403, "Forbidden",
                           f"unable to create new content in namespace {ns} because it is being terminated")

    def admit(self, group, plural, kind, version, ns, obj, old=None):
        """Defaults and server-set fields, as the API server fills them."""
        meta = obj.setdefault("metadata", {})
        obj["apiVersion"] = f"{group}/{version}" if group else version
        obj["kind"] = kind
        if ns is not None:
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if old is None:
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now()
            if "spec" in obj and kind not in ("Namespace", "Node"):
                meta["generation"] = 1
        else:
            om = old.get("metadata", {})
            for k in ("uid", "creationTimestamp"):
                if k in om:
                    meta[k] = om[k]
            if "generation" in om:
                meta["generation"] = om["generation"] + (1 if obj.get("spec") != old.get("spec") else 0)
            if "status" in old and kind not in ("Secret", "ConfigMap"):
                obj["status"] = old["status"]  # the main resource does not write status
        meta.pop("selfLink", None)
        meta["resourceVersion"] = self.next_rv()
        if kind == "Namespace":
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj.setdefault("status", {"phase": "Active"})
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta.get("name", "")
        if kind == "Secret":
            obj.setdefault("type", "Opaque")
            string_data = obj.pop("stringData", None) or {}
            data = obj.setdefault("data", {})
            for k, v in string_data.items():
                data[k] = base64.b64encode(v.encode()).decode()
            for k, v in data.items():
                try:
                    base64.b64decode(v, validate=True)
                except Exception:
                    raise ApiError(400, "BadRequest", f"Secret data[{k}] is not base64")
            if not data:
                obj.pop("data")
        if kind == "Service":
            spec = obj.setdefault("spec", {})
            if old is not None and "clusterIP" in old.get("spec", {}):
                spec.setdefault("clusterIP", old["spec"]["clusterIP"])
            spec.setdefault("clusterIP", f"10.96.{(self.rv // 250) % 250}.{self.rv % 250 + 1}")
            spec.setdefault("type", "ClusterIP")
        if kind == "CustomResourceDefinition":
            spec = obj.get("spec", {})
            names = spec.get("names", {})
            want = f"{names.get('plural')}.{spec.get('group')}"
            if meta.get("name") != want:
                raise ApiError(422, "Invalid",
                               f'CustomResourceDefinition.apiextensions.k8s.io "{meta.get("name")}" is invalid: metadata.name: Invalid value: "{meta.get("name")}": must be spec.names.plural+"."+spec.group')
            obj["status"] = {"conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "lastTransitionTime": now()},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "lastTransitionTime": now()}],
                "acceptedNames": names, "storedVersions": [v.get("name") for v in spec.get("versions", []) if v.get("storage")]}
        return obj


class RawBody:
    def __init__(self, data, ctype):
        self.data, self.ctype = data, ctype


STORE = None
LOG_LOCK = threading.Lock()
HANGS, FAILS, PAGES = [], [], []
SNI = []  # the server names clients sent (TLS SNI), in order; None when they sent none
OPTS = None


# ---------------------------------------------------------------------------------------------
# HTTP.

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-kube-apiserver"
    sys_version = ""

    def log_message(self, fmt, *args):  # the JSON request log replaces the default one
        pass

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    def do_PUT(self):
        self.handle_any("PUT")

    def do_PATCH(self):
        self.handle_any("PATCH")

    def do_DELETE(self):
        self.handle_any("DELETE")

    def handle_any(self, method):
        url = urllib.parse.urlsplit(self.path)
        path, query = url.path, urllib.parse.parse_qs(url.query, keep_blank_values=True)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        entry = {"time": time.time(), "method": method, "path": path, "query": url.query,
                 "contentType": self.headers.get("Content-Type", ""), "accept": self.headers.get("Accept", ""),
                 "userAgent": self.headers.get("User-Agent", ""),
                 "authorized": self.authorized()}
        imp = {k.lower(): self.headers.get_all(k) for k in set(self.headers.keys())
               if k.lower().startswith("impersonate-")}
        if imp:
            entry["impersonate"] = imp
        pad = 0
        try:
            if path.startswith("/_fake/"):
                code, out = self.control(method, path, body)
            else:
                if not entry["authorized"]:
                    raise ApiError(401, "Unauthorized", "Unauthorized")
                for h in HANGS:
                    if h["count"] > 0 and h["method"] == method and re.search(h["path_regex"], path):
                        h["count"] -= 1
                        entry["hung"] = True
                        self.write_log(entry)
                        time.sleep(3600)
                        return
                for f in FAILS:
                    if f["count"] > 0 and f["method"] == method and re.search(f["path_regex"], path):
                        f["count"] -= 1
                        raise ApiError(f.get("code", 500), f.get("reason", "InternalError"),
                                       f.get("message", "injected failure (fake API server)"))
                code, out = self.api(method, path, query, body, entry)
                pad = self.hostile_page(method, path, code, out, entry)
        except ApiError as e:
            code, out = e.code, status_body(e.code, e.reason, e.message, e.details)
        except Exception as e:  # a bug of the fake: say so loudly
            code, out = 500, status_body(500, "InternalError", f"fake API server bug: {type(e).__name__}: {e}")
            print(f"fake-apiserver: {method} {self.path}: {type(e).__name__}: {e}", file=sys.stderr)
        entry["status"] = code
        if code >= 400 and isinstance(out, dict):
            entry["message"] = out.get("message")
        if not path.startswith("/_fake/"):  # the log is of API requests only
            self.write_log(entry)
        ctype = "application/json"
        if isinstance(out, RawBody):
            data, ctype = out.data, out.ctype
        else:
            data = json.dumps(out).encode()
            if pad:
                data = data[:-1] + b', "padding": "' + b"x" * pad + b'"}'
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Audit-Id", str(uuid.uuid4()))
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.wfile.write(data)

    def hostile_page(self, method, path, code, out, entry):
        """A LIST answer of a /_fake/pages path: a continue token that never ends the list."""
        if method != "GET" or code != 200 or not isinstance(out, dict):
            return 0
        if not out.get("kind", "").endswith("List"):
            return 0
        for rule in PAGES:
            if re.search(rule["path_regex"], path):
                rule["served"] = rule.get("served", 0) + 1
                n = rule["served"]
                if rule.get("mode") == "fresh":
                    token = f"fresh-{n}"
                else:
                    tokens = rule.get("tokens") or ["A", "B"]
                    token = tokens[(n - 1) % len(tokens)]
                out.setdefault("metadata", {})["continue"] = token
                entry["continueGiven"] = token
                return int(rule.get("pad_bytes", 0))
        return 0

    def authorized(self):
        if OPTS.token is None:
            return True
        return self.headers.get("Authorization", "") == f"Bearer {OPTS.token}"

    def write_log(self, entry):
        with LOG_LOCK, open(os.path.join(OPTS.state_dir, "requests.jsonl"), "a") as f:
            f.write(json.dumps(entry) + "\n")

    # -- control endpoints --------------------------------------------------------------------
    def control(self, method, path, body):
        if path == "/_fake/state":
            with STORE.lock:
                objs = [copy.deepcopy(o) for _, o in sorted(STORE.objects.items())]
            return 200, {"objects": objs, "resourceVersion": str(STORE.rv)}
        if path == "/_fake/sni":
            return 200, {"sni": list(SNI)}
        if path == "/_fake/requests":
            with LOG_LOCK, open(os.path.join(OPTS.state_dir, "requests.jsonl")) as f:
                return 200, {"requests": [json.loads(l) for l in f if l.strip()]}
        if method == "POST" and path in ("/_fake/hang", "/_fake/fail"):
            rule = json.loads(body)
            rule.setdefault("count", 1)
            (HANGS if path.endswith("hang") else FAILS).append(rule)
            return 200, {"ok": True}
        if method == "POST" and path == "/_fake/pages":
            PAGES.append(json.loads(body))
            return 200, {"ok": True}
        if method == "POST" and path == "/_fake/objects":
            with STORE.lock:
                for o in json.loads(body)["objects"]:
                    seed_object(o)
            return 200, {"ok": True}
        raise ApiError(404, "NotFound", f"no control endpoint {method} {path}")

    # -- the API ------------------------------------------------------------------------------
    def api(self, method, path, query, body, entry):
        parts = [p for p in path.split("/") if p]
        if method == "GET":
            d = self.discovery(path, parts)
            if d is not None:
                return 200, d
        if parts[:1] == ["api"] and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ns = None
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
            ns, rest = rest[1], rest[2:]
        if not rest:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        plural, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), rest[2:]
        with STORE.lock:
            found = STORE.lookup(group, version, plural)
            if found is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            kind, namespaced = found
            if namespaced and ns is None and method != "GET":
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if not namespaced:
                if ns is not None:
                    raise ApiError(404, "NotFound", "the server could not find the requested resource")
            entry["resource"] = qualified(group, plural)
            if name:
                entry["name"] = name
            if ns:
                entry["namespace"] = ns
            if sub:
                return self.subresource(method, group, plural, ns, name, sub)
            if method == "GET":
                if query.get("watch", [""])[0] in ("1", "true"):
                    raise ApiError(405, "MethodNotAllowed", "this fake API server does not implement watch")
                if name:
                    return 200, self.get(group, plural, ns, name)
                return 200, self.list(group, version, plural, kind, ns, query)
            if method == "POST" and not name:
                obj = self.parse_body(body)
                entry["bodyKind"] = obj.get("kind")
                entry["bodyName"] = obj.get("metadata", {}).get("name")
                if query.get("dryRun"):
                    return 201, obj
                return 201, self.create(group, version, plural, kind, namespaced, ns, obj)
            if method == "PUT" and name:
                obj = self.parse_body(body)
                entry["bodyKind"] = obj.get("kind")
                return 200, self.replace(group, version, plural, kind, namespaced, ns, name, obj)
            if method == "PATCH" and name:
                entry["patchType"] = self.headers.get("Content-Type", "").split(";")[0]
                entry["body"] = body[:8192].decode("utf-8", "replace")
                entry["fieldManager"] = query.get("fieldManager", [""])[0]
                entry["force"] = query.get("force", [""])[0]
                code, out = self.patch(group, version, plural, kind, namespaced, ns, name, body, query)
                return code, out
            if method == "DELETE" and name:
                opts = self.parse_body(body) if body else {}
                return 200, self.delete(group, plural, ns, name, opts, query)
            if method == "DELETE":
                raise ApiError(405, "MethodNotAllowed", "this fake does not implement deletecollection")
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    def discovery(self, path, parts):
        res = STORE.resources()
        if path in ("/version", "/version/"):
            major, minor = re.match(r"v(\d+)\.(\d+)", STORE.git_version).groups()
            return {"major": major, "minor": minor, "gitVersion": STORE.git_version,
                    "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
                    "buildDate": "2024-01-01T00:00:00Z", "goVersion": "go1.21.0", "compiler": "gc",
                    "platform": "linux/amd64"}
        if path == "/openapi/v2":
            # An empty OpenAPI v2 document (protobuf of gnostic's Document with no fields): the
            # client then finds no schema to validate against. /openapi/v3 is not served.
            return RawBody(b"", "application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}]}
        if path == "/apis":
            groups = {}
            for g, v in res:
                if g:
                    groups.setdefault(g, []).append(v)
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                 "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
                for g, vs in sorted(groups.items())]}
        if len(parts) == 2 and parts[0] == "apis":
            vs = [v for g, v in res if g == parts[1]]
            if not vs:
                return None
            return {"kind": "APIGroup", "apiVersion": "v1", "name": parts[1],
                    "versions": [{"groupVersion": f"{parts[1]}/{v}", "version": v} for v in vs],
                    "preferredVersion": {"groupVersion": f"{parts[1]}/{vs[0]}", "version": vs[0]}}
        gv = None
        if len(parts) == 2 and parts[0] == "api":
            gv = ("", parts[1])
        elif len(parts) == 3 and parts[0] == "apis":
            gv = (parts[1], parts[2])
        if gv is None:
            return None
        if gv not in res:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        items = []
        for plural, kind, namespaced, short in res[gv]:
            r = {"name": plural, "singularName": kind.lower(), "namespaced": namespaced, "kind": kind, "verbs": VERBS}
            if short:
                r["shortNames"] = short
            items.append(r)
            if kind in ("Deployment", "DaemonSet", "StatefulSet", "Namespace", "Node", "CustomResourceDefinition"):
                items.append({"name": f"{plural}/status", "singularName": "", "namespaced": namespaced,
                              "kind": kind, "verbs": ["get", "patch", "update"]})
            if kind == "Node":
                items.append({"name": "nodes/proxy", "singularName": "", "namespaced": False,
                              "kind": "NodeProxyOptions", "verbs": ["create", "delete", "get", "patch", "update"]})
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{gv[0]}/{gv[1]}" if gv[0] else gv[1], "resources": items}

    def subresource(self, method, group, plural, ns, name, sub):
        if (group, plural) == ("", "nodes") and sub[:1] == ["proxy"] and method == "GET":
            if ("", "nodes", "", name) not in STORE.objects:
                raise not_found(group, plural, name)
            if sub[1:] == ["configz"] and name in STORE.configz:
                return 200, STORE.configz[name]
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if sub == ["status"] and method == "GET":
            return 200, self.get(group, plural, ns, name)
        raise ApiError(405, "MethodNotAllowed", f"this fake does not implement {plural}/{'/'.join(sub)}")

    def parse_body(self, body):
        ctype = self.headers.get("Content-Type", "").split(";")[0].strip()
        if ctype == "application/vnd.kubernetes.protobuf":
            return decode_protobuf(body)
        try:
            return json.loads(body)
        except ValueError:
            if ctype.endswith("yaml"):
                import yaml  # PyYAML (python3-yaml)
                return yaml.safe_load(body)
            raise ApiError(400, "BadRequest", "the request body is not JSON")

    def get(self, group, plural, ns, name):
        obj = STORE.objects.get((group, plural, ns or "", name))
        if obj is None:
            raise not_found(group, plural, name)
        return copy.deepcopy(obj)

    def list(self, group, version, plural, kind, ns, query):
        terms = parse_selector(query.get("labelSelector", [""])[0])
        fields = query.get("fieldSelector", [""])[0]
        items = []
        for (g, p, n, _), obj in sorted(STORE.objects.items()):
            if g != group or p != plural or (ns is not None and n != ns):
                continue
            if not matches(obj.get("metadata", {}).get("labels"), terms):
                continue
            ok = True
            for term in filter(None, fields.split(",")):
                k, _, v = term.partition("=")
                k = k.rstrip("=")
                cur = obj
                for seg in k.split("."):
                    cur = cur.get(seg) if isinstance(cur, dict) else None
                if (cur or "") != v:
                    ok = False
            if ok:
                items.append(copy.deepcopy(obj))
        return {"kind": f"{kind}List", "apiVersion": f"{group}/{version}" if group else version,
                "metadata": {"resourceVersion": str(STORE.rv)}, "items": items}

    def check_body(self, group, version, kind, obj, name=None):
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the object is not a JSON object")
        want_av = f"{group}/{version}" if group else version
        if obj.get("kind") and obj.get("kind") != kind:
            raise ApiError(400, "BadRequest", f"the kind {obj.get('kind')} of the body does not match the resource ({kind})")
        if obj.get("apiVersion") and obj.get("apiVersion") != want_av:
            raise ApiError(400, "BadRequest", f"the apiVersion {obj.get('apiVersion')} of the body does not match the path ({want_av})")
        meta = obj.setdefault("metadata", {})
        if name is not None and meta.get("name") not in (None, name):
            raise ApiError(400, "BadRequest", f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})")
        if name is not None:
            meta["name"] = name

    def create(self, group, version, plural, kind, namespaced, ns, obj):
        self.check_body(group, version, kind, obj)
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name")
        if not name:
            raise ApiError(422, "Invalid", f"{kind} is invalid: metadata.name: Required value: name or generateName is required")
        if namespaced:
            if meta.get("namespace") not in (None, "", ns):
                raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the namespace sent on the request")
            STORE.namespace_ok(ns)
        key = (group, plural, ns or "", name)
        if key in STORE.objects:
            raise ApiError(409, "AlreadyExists", f'{qualified(group, plural)} "{name}" already exists',
                           {"name": name, "group": group, "kind": plural})
        meta.pop("resourceVersion", None)
        obj = STORE.admit(group, plural, kind, version, ns if namespaced else None, obj)
        obj["metadata"]["managedFields"] = [
            {"manager": self.field_manager(), "operation": "Update", "apiVersion": obj["apiVersion"], "time": now()}]
        STORE.objects[key] = obj
        if plural == "customresourcedefinitions":
            STORE.refresh_crds()
        return copy.deepcopy(obj)

    def field_manager(self):
        q = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        if q.get("fieldManager"):
            return q["fieldManager"][0]
        ua = self.headers.get("User-Agent", "unknown")
        return ua.split("/")[0]

    def replace(self, group, version, plural, kind, namespaced, ns, name, obj):
        self.check_body(group, version, kind, obj, name)
        key = (group, plural, ns or "", name)
        old = STORE.objects.get(key)
        if old is None:
            raise not_found(group, plural, name)
        rv = obj["metadata"].get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise conflict(group, plural, name)
        obj = STORE.admit(group, plural, kind, version, ns if namespaced else None, obj, old)
        obj["metadata"]["managedFields"] = managed(old, self.field_manager(), "Update", obj["apiVersion"])
        STORE.objects[key] = obj
        if plural == "customresourcedefinitions":
            STORE.refresh_crds()
        return copy.deepcopy(obj)

    def patch(self, group, version, plural, kind, namespaced, ns, name, body, query):
        ctype = self.headers.get("Content-Type", "").split(";")[0].strip()
        key = (group, plural, ns or "", name)
        old = STORE.objects.get(key)
        builtin = any(p == plural for p, *_ in BUILTIN.get((group, version), []))
        if ctype == "application/apply-patch+yaml":
            manager = query.get("fieldManager", [""])[0]
            if not manager:
                raise ApiError(422, "Invalid", "PatchOptions.meta.k8s.io is invalid: fieldManager: Required value: is required for apply patch")
            applied = self.parse_body(body)
            self.check_body(group, version, kind, applied, name)
            force = query.get("force", [""])[0] == "true"
            if old is None:
                if namespaced:
                    STORE.namespace_ok(ns)
                obj = STORE.admit(group, plural, kind, version, ns if namespaced else None, copy.deepcopy(applied))
                obj["metadata"]["managedFields"] = [apply_entry(manager, obj["apiVersion"], applied)]
                STORE.objects[key] = obj
                code = 201
            else:
                obj = server_side_apply(old, applied, manager, force, group, plural, name)
                obj = STORE.admit(group, plural, kind, version, ns if namespaced else None, obj, old)
                STORE.objects[key] = obj
                code = 200
            if plural == "customresourcedefinitions":
                STORE.refresh_crds()
            return code, copy.deepcopy(STORE.objects[key])
        if old is None:
            raise not_found(group, plural, name)
        try:
            patch = json.loads(body)
        except ValueError:
            raise ApiError(400, "BadRequest", "the patch is not JSON")
        base = copy.deepcopy(old)
        if ctype == "application/merge-patch+json":
            obj = merge_patch(base, patch)
        elif ctype == "application/strategic-merge-patch+json":
            if not builtin:
                raise ApiError(415, "UnsupportedMediaType",
                               "strategic merge patch is not supported for custom resources: use a merge patch or JSON patch")
            obj = strategic_merge(base, patch)
        elif ctype == "application/json-patch+json":
            obj = json_patch(base, patch)
        else:
            raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {ctype!r})")
        want_rv = patch.get("metadata", {}).get("resourceVersion") if isinstance(patch, dict) else None
        if want_rv and want_rv != old["metadata"]["resourceVersion"]:
            raise conflict(group, plural, name)
        if obj.get("metadata", {}).get("name") != name:
            raise ApiError(422, "Invalid", "a patch may not change metadata.name")
        obj["metadata"].pop("resourceVersion", None)
        obj = STORE.admit(group, plural, kind, version, ns if namespaced else None, obj, old)
        obj["metadata"]["managedFields"] = managed(old, self.field_manager(), "Update", obj["apiVersion"])
        STORE.objects[key] = obj
        if plural == "customresourcedefinitions":
            STORE.refresh_crds()
        return 200, copy.deepcopy(obj)

    def delete(self, group, plural, ns, name, opts, query):
        key = (group, plural, ns or "", name)
        old = STORE.objects.get(key)
        if old is None:
            raise not_found(group, plural, name)
        pre = opts.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != old["metadata"].get("uid"):
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {qualified(group, plural)} "{name}": Precondition failed: UID in precondition: {pre["uid"]}, UID in object meta: {old["metadata"].get("uid")}')
        if pre.get("resourceVersion") and pre["resourceVersion"] != old["metadata"].get("resourceVersion"):
            raise conflict(group, plural, name)
        if query.get("dryRun") or opts.get("dryRun"):
            return old
        if (group, plural) == ("", "namespaces"):
            # As the real server: the namespace turns Terminating; the namespace controller's
            # part (emptying it, then removing it) runs after --namespace-finalize-seconds.
            if old.get("status", {}).get("phase") != "Terminating":
                old.setdefault("status", {})["phase"] = "Terminating"
                old["metadata"]["deletionTimestamp"] = now()
                old["metadata"]["resourceVersion"] = STORE.next_rv()
                t = threading.Timer(OPTS.namespace_finalize_seconds, finalize_namespace, (name, old["metadata"]["uid"]))
                t.daemon = True
                t.start()
            return copy.deepcopy(old)
        del STORE.objects[key]
        if plural == "customresourcedefinitions":
            crd_group = old.get("spec", {}).get("group")
            crd_plural = old.get("spec", {}).get("names", {}).get("plural")
            for k in [k for k in STORE.objects if k[0] == crd_group and k[1] == crd_plural]:
                del STORE.objects[k]
            STORE.refresh_crds()
        STORE.next_rv()
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": name, "group": group, "kind": plural, "uid": old["metadata"].get("uid")}}


def finalize_namespace(name, uid):
    """The namespace controller's part of a namespace deletion: delete its content, then it."""
    with STORE.lock:
        ns = STORE.objects.get(("", "namespaces", "", name))
        if ns is None or ns["metadata"].get("uid") != uid:
            return
        for k in [k for k in STORE.objects if k[2] == name]:
            del STORE.objects[k]
        del STORE.objects[("", "namespaces", "", name)]
        STORE.next_rv()


def conflict(group, plural, name):
    return ApiError(409, "Conflict",
                    f'Operation cannot be fulfilled on {qualified(group, plural)} "{name}": the object has been modified; please apply your changes to the latest version and try again',
                    {"name": name, "group": group, "kind": plural})


def managed(old, manager, operation, api_version):
    entries = [m for m in old.get("metadata", {}).get("managedFields", []) or []
               if not (m.get("manager") == manager and m.get("operation") == operation)]
    entries.append({"manager": manager, "operation": operation, "apiVersion": api_version, "time": now()})
    return entries


def apply_entry(manager, api_version, applied):
    # fieldsV1 here is the applied configuration itself (the real server stores a field set).
    return {"manager": manager, "operation": "Apply", "apiVersion": api_version, "time": now(),
            "fieldsType": "FieldsV1", "fieldsV1": {"f:applied": applied}}


def prune(obj, previous, current):
    """Remove from obj the fields that `previous` (this manager's last applied config) set and
    `current` no longer sets."""
    if not isinstance(previous, dict) or not isinstance(obj, dict):
        return obj
    for k, pv in previous.items():
        if k not in obj:
            continue
        if not isinstance(current, dict) or k not in current:
            del obj[k]
        elif isinstance(pv, dict) and isinstance(current[k], dict):
            obj[k] = prune(obj[k], pv, current[k])
    return obj


def server_side_apply(old, applied, manager, force, group, plural, name):
    """A simplified server-side apply: fields this manager applied before and no longer applies
    are removed, the applied configuration is merged in (lists with a merge key merged by key,
    other lists replaced), and a field last written by another manager's apply with a different
    value is a conflict unless force=true. The real field-set bookkeeping is not modelled."""
    meta = old.get("metadata", {})
    entries = meta.get("managedFields", []) or []
    mine = next((m for m in entries if m.get("manager") == manager and m.get("operation") == "Apply"), None)
    previous = (mine or {}).get("fieldsV1", {}).get("f:applied", {})
    if not force:
        for m in entries:
            if m.get("manager") == manager or m.get("operation") != "Apply":
                continue
            theirs = m.get("fieldsV1", {}).get("f:applied", {})
            clash = first_clash(theirs, applied)
            if clash:
                raise ApiError(409, "Conflict",
                               f'Apply failed with 1 conflict: conflict with "{m.get("manager")}": {clash}',
                               {"name": name, "group": group, "kind": plural,
                                "causes": [{"reason": "FieldManagerConflict", "message": f'conflict with "{m.get("manager")}"', "field": clash}]})
    base = prune(copy.deepcopy(old), previous, applied)
    obj = strategic_merge(base, strip_nulls(applied))
    obj["metadata"]["managedFields"] = [m for m in entries if not (m.get("manager") == manager and m.get("operation") == "Apply")] + [
        apply_entry(manager, obj.get("apiVersion", ""), applied)]
    obj["metadata"].pop("resourceVersion", None)
    rv = applied.get("metadata", {}).get("resourceVersion")
    if rv and rv != meta.get("resourceVersion"):
        raise conflict(group, plural, name)
    return obj


def strip_nulls(v):
    if isinstance(v, dict):
        return {k: strip_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [strip_nulls(x) for x in v]
    return v


def first_clash(theirs, mine, path=""):
    if isinstance(theirs, dict) and isinstance(mine, dict):
        for k in theirs:
            if k in mine:
                c = first_clash(theirs[k], mine[k], f"{path}.{k}")
                if c:
                    return c
        return None
    if theirs != mine and not isinstance(theirs, (dict, list)):
        return path
    return None


def seed_object(o):
    """Store an object as given (fixtures, control endpoint): no admission, server fields filled."""
    av = o.get("apiVersion", "v1")
    group, version = (av.split("/", 1) if "/" in av else ("", av))
    plural = None
    for (g, v), rs in STORE.resources().items():
        if g == group:
            for p, kind, namespaced, _ in rs:
                if kind == o.get("kind"):
                    plural = p
    if plural is None:
        raise ApiError(400, "BadRequest", f"seed: unknown kind {o.get('kind')} {av}")
    meta = o.setdefault("metadata", {})
    meta.setdefault("uid", str(uuid.uuid4()))
    meta.setdefault("creationTimestamp", now())
    meta["resourceVersion"] = STORE.next_rv()
    meta.pop("managedFields", None)
    if o["kind"] == "Namespace":
        o.setdefault("status", {"phase": "Active"})
    STORE.objects[(group, plural, meta.get("namespace", ""), meta["name"])] = o
    if plural == "customresourcedefinitions":
        STORE.refresh_crds()


def seed_dir(d):
    """Fixture layout of tests/fixtures/kube/<cluster>/: version.json, nodes.json (a list),
    namespace-*.json, secrets-*.json (lists), crds/*.json, daemonsets-*.json (lists),
    configz/<node>.json (kubelet /configz answers)."""
    def load(p):
        with open(p) as f:
            return json.load(f)

    def items(v):
        return v.get("items", []) if isinstance(v, dict) and "items" in v else [v]

    for fn in sorted(os.listdir(d)):
        p = os.path.join(d, fn)
        if fn == "version.json":
            STORE.git_version = load(p).get("gitVersion", STORE.git_version)
        elif fn == "nodes.json":
            for n in items(load(p)):
                n.setdefault("apiVersion", "v1")
                n.setdefault("kind", "Node")
                seed_object(n)
        elif fn.startswith("namespace-") and fn.endswith(".json"):
            o = load(p)
            o.setdefault("apiVersion", "v1")
            o.setdefault("kind", "Namespace")
            seed_object(o)
        elif (fn.startswith("secrets-") or fn.startswith("daemonsets-") or fn.startswith("objects-")) and fn.endswith(".json"):
            kind = {"secrets-": ("v1", "Secret"), "daemonsets-": ("apps/v1", "DaemonSet")}.get(fn.split("-")[0] + "-", (None, None))
            for o in items(load(p)):
                if kind[0]:
                    o.setdefault("apiVersion", kind[0])
                    o.setdefault("kind", kind[1])
                ns = o.get("metadata", {}).get("namespace")
                if ns and ("", "namespaces", "", ns) not in STORE.objects:
                    seed_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
                seed_object(o)
        elif fn == "crds" and os.path.isdir(p):
            for c in sorted(os.listdir(p)):
                o = load(os.path.join(p, c))
                o.setdefault("apiVersion", "apiextensions.k8s.io/v1")
                o.setdefault("kind", "CustomResourceDefinition")
                seed_object(o)
        elif fn == "configz" and os.path.isdir(p):
            for c in sorted(os.listdir(p)):
                STORE.configz[c[:-5]] = load(os.path.join(p, c))


def make_tls(state_dir, tls_name=None):
    """A throw-away CA and a server certificate for 127.0.0.1/localhost (openssl), or for the
    DNS name `tls_name` only (so that a client must check that name, not the URL's host)."""
    ca_key, ca_crt = os.path.join(state_dir, "ca.key"), os.path.join(state_dir, "ca.crt")
    key, csr, crt = (os.path.join(state_dir, n) for n in ("server.key", "server.csr", "server.crt"))
    ext = os.path.join(state_dir, "server.ext")
    run = lambda *a: subprocess.run(a, check=True, capture_output=True)
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
        "/CN=fake-kube-apiserver-ca", "-keyout", ca_key, "-out", ca_crt)
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", csr)
    with open(ext, "w") as f:
        san = f"DNS:{tls_name}" if tls_name else "IP:127.0.0.1,DNS:localhost"
        f.write(f"subjectAltName={san}\nextendedKeyUsage=serverAuth\n")
    run("openssl", "x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial",
        "-days", "2", "-out", crt, "-extfile", ext)
    return ca_crt, crt, key


def main():
    global STORE, OPTS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--addr", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--tls", action="store_true", help="serve HTTPS with a throw-away CA (DIR/ca.crt)")
    ap.add_argument("--token", help="bearer token every API request must carry (default: none needed)")
    ap.add_argument("--tls-name", help="with --tls: the certificate names this DNS name only (not 127.0.0.1)")
    ap.add_argument("--seed-dir", action="append", default=[], help="fixture directory to load first")
    ap.add_argument("--git-version", default="v1.29.2")
    ap.add_argument("--namespace-finalize-seconds", type=float, default=1.0,
                    help="how long a deleted namespace stays Terminating before it and its content go")
    ap.add_argument("--no-default-namespaces", action="store_true",
                    help="do not create default, kube-system, kube-public, kube-node-lease")
    OPTS = ap.parse_args()
    if OPTS.addr.split(".")[0] != "127" and OPTS.addr not in ("localhost", "::1"):
        sys.exit("fake_apiserver: listens on loopback addresses only")
    os.makedirs(OPTS.state_dir, exist_ok=True)
    open(os.path.join(OPTS.state_dir, "requests.jsonl"), "w").close()
    STORE = Store(OPTS.git_version)
    if not OPTS.no_default_namespaces:
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            seed_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    for d in OPTS.seed_dir:
        seed_dir(d)
    server = ThreadingHTTPServer((OPTS.addr, OPTS.port), Handler)
    server.daemon_threads = True
    scheme = "http"
    ca = None
    if OPTS.tls:
        ca, crt, key = make_tls(OPTS.state_dir, OPTS.tls_name)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(crt, key)
        ctx.sni_callback = lambda _sock, name, _ctx: SNI.append(name)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    url = f"{scheme}://{OPTS.addr}:{server.server_address[1]}"
    cluster = {"server": url}
    if ca:
        with open(ca, "rb") as f:
            cluster["certificate-authority-data"] = base64.b64encode(f.read()).decode()
    user = {"token": OPTS.token} if OPTS.token else {}
    kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "fake",
                  "clusters": [{"name": "fake", "cluster": cluster}],
                  "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake-admin"}}],
                  "users": [{"name": "fake-admin", "user": user}]}
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
