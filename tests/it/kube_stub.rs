//! A tiny stand-in for a Kubernetes API server: std-only HTTP/1.1 on 127.0.0.1, one thread per
//! connection, serving the real-format API responses of `tests/fixtures/kube/<cluster>/` by
//! API path (`routes.json` maps a path to a file). No real API server can run where these tests
//! run (no kind, k3s or envtest): this stub is what the cluster code is tested against.
//!
//! Like the API server it answers 404 with a `Status` object for anything it does not hold,
//! 401 `Status` without the right bearer token, 403 `Status` for paths made forbidden with
//! [`KubeStub::forbid`], and applies equality `labelSelector`s to list responses.
#![allow(dead_code)]

use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The identity the stub's 403 messages name, as an API server names the authenticated user.
pub const STUB_IDENTITY: &str = "system:serviceaccount:kube-system:koord-bundle";
/// The kubeconfig user entry written for the stub.
pub const STUB_USER: &str = "stub-admin";

/// A running stub.
pub struct KubeStub {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// A kubeconfig (in a temporary directory) whose current context points at the stub with
    /// a token user.
    pub kubeconfig: PathBuf,
    /// The bearer token the stub expects.
    pub token: String,
    /// The fixture directory served.
    pub fixtures: PathBuf,
    /// Requests seen, `GET /path?query`, with whether they carried the right token.
    pub requests: Arc<Mutex<Vec<(String, bool)>>>,
    forbidden: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    dir: tempfile::TempDir,
    anonymous: Arc<AtomicBool>,
}

/// The fixture root.
pub fn fixture_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kube")
}

/// Serve the fixtures of `cluster` (`kind`, `eks`, `ack`, `old`).
pub fn start(cluster: &str) -> KubeStub {
    let fixtures = fixture_root().join(cluster);
    let routes_text = std::fs::read_to_string(fixtures.join("routes.json")).unwrap_or_else(|e| {
        panic!(
            "no routes.json for cluster {cluster:?} in {}: {e}",
            fixtures.display()
        )
    });
    let routes: HashMap<String, String> =
        serde_json::from_str(&routes_text).expect("routes.json maps paths to files");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let url = format!("http://{}", listener.local_addr().expect("local addr"));
    let token = format!("stub-token-{cluster}-0123456789abcdef");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kubeconfig_text(cluster, &url, &token)).expect("write kubeconfig");

    let requests = Arc::new(Mutex::new(Vec::new()));
    let forbidden = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let anonymous = Arc::new(AtomicBool::new(false));
    let state = Arc::new(State {
        anonymous: anonymous.clone(),
        routes,
        fixtures: fixtures.clone(),
        token: token.clone(),
        requests: requests.clone(),
        forbidden: forbidden.clone(),
    });
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let state = state.clone();
                std::thread::spawn(move || {
                    let _ = serve(conn, &state);
                });
            }
        });
    }
    KubeStub {
        url,
        kubeconfig,
        token,
        fixtures,
        requests,
        forbidden,
        stop,
        dir,
        anonymous,
    }
}

impl KubeStub {
    /// Answer requests without the bearer token too. Only for real helm talking to the stub:
    /// client-go sends no bearer token over plain HTTP and this stub has no TLS.
    pub fn allow_anonymous(&self) {
        self.anonymous.store(true, Ordering::SeqCst);
    }

    /// Answer 403 for this API path (no query).
    pub fn forbid(&self, path: &str) {
        self.forbidden.lock().unwrap().push(path.to_string());
    }

    /// Write another kubeconfig next to the default one (for other users/contexts) and return
    /// its path.
    pub fn write_kubeconfig(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).expect("write kubeconfig");
        p
    }

    /// The request lines seen so far.
    pub fn seen(&self) -> Vec<String> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .map(|(r, _)| r.clone())
            .collect()
    }
}

impl Drop for KubeStub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees the flag.
        let _ = TcpStream::connect(self.url.trim_start_matches("http://"));
    }
}

fn kubeconfig_text(cluster: &str, url: &str, token: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
preferences: {{}}
current-context: stub-{cluster}
clusters:
- name: stub-{cluster}
  cluster:
    server: {url}
contexts:
- name: stub-{cluster}
  context:
    cluster: stub-{cluster}
    user: {STUB_USER}
    namespace: default
users:
- name: {STUB_USER}
  user:
    token: {token}
"
    )
}

struct State {
    anonymous: Arc<AtomicBool>,
    routes: HashMap<String, String>,
    fixtures: PathBuf,
    token: String,
    requests: Arc<Mutex<Vec<(String, bool)>>>,
    forbidden: Arc<Mutex<Vec<String>>>,
}

fn serve(mut conn: TcpStream, state: &State) -> std::io::Result<()> {
    conn.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > 64 * 1024 {
            return respond(&mut conn, 431, "text/plain", b"request header too large");
        }
    }
    let text = String::from_utf8_lossy(&head).to_string();
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or("").to_string();
    let mut parts = request_line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
    let auth = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("authorization"))
        .map(|(_, v)| v.trim().to_string());
    let authorized = auth.as_deref() == Some(&format!("Bearer {}", state.token));
    state
        .requests
        .lock()
        .unwrap()
        .push((format!("{method} {target}"), authorized));

    if !authorized && !state.anonymous.load(Ordering::SeqCst) {
        let body = status(401, "Unauthorized", "Unauthorized", json!({}));
        return respond(&mut conn, 401, "application/json", body.as_bytes());
    }
    if method != "GET" {
        let body = status(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
            json!({}),
        );
        return respond(&mut conn, 405, "application/json", body.as_bytes());
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    if state.forbidden.lock().unwrap().iter().any(|p| p == path) {
        let body = forbidden_status(path);
        return respond(&mut conn, 403, "application/json", body.as_bytes());
    }
    let Some(file) = state.routes.get(path) else {
        let body = not_found_status(path);
        return respond(&mut conn, 404, "application/json", body.as_bytes());
    };
    let bytes = std::fs::read(state.fixtures.join(file))?;
    let selector = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "labelSelector")
        .map(|(_, v)| percent_decode(v));
    let body = match selector {
        Some(sel) if !sel.is_empty() => {
            let mut v: Value = serde_json::from_slice(&bytes).expect("fixture is JSON");
            if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
                items.retain(|item| matches_selector(item, &sel));
            }
            serde_json::to_vec(&v).expect("serialize")
        }
        _ => bytes,
    };
    respond(&mut conn, 200, "application/json", &body)
}

fn respond(
    conn: &mut TcpStream,
    code: u16,
    content_type: &str,
    body: &[u8],
) -> std::io::Result<()> {
    let reason = match code {
        200 => "OK",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Error",
    };
    write!(
        conn,
        "HTTP/1.1 {code} {reason}\r\nAudit-Id: 3f6c1a52-8e0d-4c57-b7a2-5d1e0c9b4a21\r\nCache-Control: no-cache, private\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    conn.write_all(body)?;
    conn.flush()
}

/// A `Status` object as the API server writes it.
fn status(code: u16, reason: &str, message: &str, details: Value) -> String {
    let mut v = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code});
    if details.as_object().is_some_and(|d| !d.is_empty()) {
        v["details"] = details;
    }
    v.to_string()
}

/// `(group, namespace, resource, name)` of an API path.
fn parse_api_path(path: &str) -> Option<(String, Option<String>, String, Option<String>)> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segs.as_slice() {
        ["api", "v1", rest @ ..] => (String::new(), rest),
        ["apis", group, _version, rest @ ..] => (group.to_string(), rest),
        _ => return None,
    };
    match rest {
        ["namespaces", ns, res] => Some((group, Some(ns.to_string()), res.to_string(), None)),
        ["namespaces", ns, res, name] => Some((
            group,
            Some(ns.to_string()),
            res.to_string(),
            Some(name.to_string()),
        )),
        [res] => Some((group, None, res.to_string(), None)),
        [res, name] => Some((group, None, res.to_string(), Some(name.to_string()))),
        _ => None,
    }
}

fn not_found_status(path: &str) -> String {
    match parse_api_path(path) {
        Some((group, _, res, Some(name))) => {
            let qualified = if group.is_empty() {
                res.clone()
            } else {
                format!("{res}.{group}")
            };
            let mut details = json!({"name": name, "kind": res});
            if !group.is_empty() {
                details["group"] = json!(group);
            }
            status(
                404,
                "NotFound",
                &format!("{qualified} \"{name}\" not found"),
                details,
            )
        }
        _ => status(
            404,
            "NotFound",
            "the server could not find the requested resource",
            json!({}),
        ),
    }
}

fn forbidden_status(path: &str) -> String {
    let Some((group, ns, res, name)) = parse_api_path(path) else {
        return status(
            403,
            "Forbidden",
            &format!("forbidden: User \"{STUB_IDENTITY}\" cannot get path \"{path}\""),
            json!({}),
        );
    };
    let verb = if name.is_some() { "get" } else { "list" };
    let what = if group.is_empty() {
        res.clone()
    } else {
        format!("{res}.{group}")
    };
    let subject = match &name {
        Some(n) => format!("{what} \"{n}\""),
        None => what.clone(),
    };
    let scope = match &ns {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_string(),
    };
    let mut details = json!({"kind": res});
    if let Some(n) = &name {
        details["name"] = json!(n);
    }
    if !group.is_empty() {
        details["group"] = json!(group);
    }
    status(
        403,
        "Forbidden",
        &format!("{subject} is forbidden: User \"{STUB_IDENTITY}\" cannot {verb} resource \"{res}\" in API group \"{group}\" {scope}"),
        details,
    )
}

/// Equality-based selectors only: `a=b,c==d,e!=f`.
fn matches_selector(item: &Value, selector: &str) -> bool {
    let labels = item.pointer("/metadata/labels");
    let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        if let Some((k, v)) = term.split_once("!=") {
            label(k.trim()) != Some(v.trim())
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            label(k.trim()) == Some(v.trim())
        } else {
            label(term.trim()).is_some()
        }
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Some(v) = std::str::from_utf8(&b[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).to_string()
}
