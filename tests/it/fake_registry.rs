//! A tiny in-process registry for fault tests only (a blob that does not match its digest, a
//! transfer that stops half-way). Every other test uses the real docker-registry.

use crate::common::sha256;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// How the blob is served.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum BlobMode {
    /// Correctly, with range support.
    Good,
    /// Different bytes than the digest says.
    Corrupt,
    /// Send this many bytes, then hang (the client is killed by the test).
    StallAfter(usize),
}

pub struct FakeRegistry {
    pub addr: String,
    pub mode: Arc<Mutex<BlobMode>>,
    /// Range requests seen for the layer: their start offsets.
    pub ranges: Arc<Mutex<Vec<u64>>>,
    pub layer_gets: Arc<AtomicUsize>,
    pub layer_digest: String,
}

/// Serve repository `repo` with tag `tag`: one linux/amd64 image with one layer of `layer`.
pub fn start(repo: &str, tag: &str, layer: Vec<u8>, mode: BlobMode) -> FakeRegistry {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let config =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#
            .to_vec();
    let layer_digest = sha256(&layer);
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{}","size":{}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{}","size":{}}}]}}"#,
        sha256(&config),
        config.len(),
        layer_digest,
        layer.len()
    )
    .into_bytes();
    let mut blobs: HashMap<String, Vec<u8>> = HashMap::new();
    blobs.insert(sha256(&config), config);
    blobs.insert(layer_digest.clone(), layer);
    let mode = Arc::new(Mutex::new(mode));
    let ranges = Arc::new(Mutex::new(Vec::new()));
    let layer_gets = Arc::new(AtomicUsize::new(0));
    let state = Arc::new((
        repo.to_string(),
        tag.to_string(),
        manifest,
        blobs,
        layer_digest.clone(),
    ));
    {
        let (mode, ranges, layer_gets) = (mode.clone(), ranges.clone(), layer_gets.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (state, mode, ranges, layer_gets) = (
                    state.clone(),
                    mode.clone(),
                    ranges.clone(),
                    layer_gets.clone(),
                );
                std::thread::spawn(move || {
                    let _ = serve(conn, &state, &mode, &ranges, &layer_gets);
                });
            }
        });
    }
    FakeRegistry {
        addr,
        mode,
        ranges,
        layer_gets,
        layer_digest,
    }
}

type State = (String, String, Vec<u8>, HashMap<String, Vec<u8>>, String);

/// One HTTP/1.1 request as these servers read it.
struct Request {
    method: String,
    path: String,
    /// `Range: bytes=N-`'s N.
    range_start: Option<u64>,
    body: Vec<u8>,
}

/// Read the next request of a keep-alive connection: `None` at its end.
fn read_request(reader: &mut impl BufRead) -> std::io::Result<Option<Request>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let parts: Vec<&str> = line.split_whitespace().collect();
    if parts.len() < 2 {
        return Ok(None);
    }
    let (method, path) = (parts[0].to_string(), parts[1].to_string());
    let mut range_start = None;
    let mut content_len = 0usize;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 {
            return Ok(None);
        }
        let t = h.trim_end();
        if t.is_empty() {
            break;
        }
        let lower = t.to_ascii_lowercase();
        if let Some(r) = lower.strip_prefix("range: bytes=") {
            range_start = r.split('-').next().and_then(|s| s.parse::<u64>().ok());
        }
        if let Some(l) = lower.strip_prefix("content-length:") {
            content_len = l.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; content_len];
    reader.read_exact(&mut body)?;
    Ok(Some(Request {
        method,
        path,
        range_start,
        body,
    }))
}

fn serve(
    conn: TcpStream,
    state: &State,
    mode: &Mutex<BlobMode>,
    ranges: &Mutex<Vec<u64>>,
    layer_gets: &AtomicUsize,
) -> std::io::Result<()> {
    let (repo, tag, manifest, blobs, layer_digest) = state;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut out = conn;
    loop {
        let Some(Request {
            method,
            path,
            range_start,
            ..
        }) = read_request(&mut reader)?
        else {
            return Ok(());
        };
        let head = method == "HEAD";
        let respond = |out: &mut TcpStream,
                       status: &str,
                       ctype: &str,
                       extra: &str,
                       body: &[u8]|
         -> std::io::Result<()> {
            write!(
                out,
                "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n{extra}\r\n",
                body.len()
            )?;
            if !head {
                out.write_all(body)?;
            }
            out.flush()
        };
        if path == "/v2/" {
            respond(&mut out, "200 OK", "application/json", "", b"{}")?;
            continue;
        }
        let man_prefix = format!("/v2/{repo}/manifests/");
        let blob_prefix = format!("/v2/{repo}/blobs/");
        if let Some(r) = path.strip_prefix(&man_prefix) {
            if r == tag || r == sha256(manifest) {
                let extra = format!("Docker-Content-Digest: {}\r\n", sha256(manifest));
                respond(
                    &mut out,
                    "200 OK",
                    "application/vnd.oci.image.manifest.v1+json",
                    &extra,
                    manifest,
                )?;
            } else {
                respond(
                    &mut out,
                    "404 Not Found",
                    "application/json",
                    "",
                    br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#,
                )?;
            }
            continue;
        }
        if let Some(d) = path.strip_prefix(&blob_prefix) {
            let Some(data) = blobs.get(d) else {
                respond(
                    &mut out,
                    "404 Not Found",
                    "application/json",
                    "",
                    br#"{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown"}]}"#,
                )?;
                continue;
            };
            let m = *mode.lock().unwrap();
            if d != layer_digest || m == BlobMode::Good {
                if d == layer_digest && !head {
                    layer_gets.fetch_add(1, Ordering::SeqCst);
                    ranges.lock().unwrap().push(range_start.unwrap_or(0));
                }
                match range_start {
                    Some(s) if (s as usize) < data.len() => {
                        let extra = format!(
                            "Content-Range: bytes {s}-{}/{}\r\n",
                            data.len() - 1,
                            data.len()
                        );
                        respond(
                            &mut out,
                            "206 Partial Content",
                            "application/octet-stream",
                            &extra,
                            &data[s as usize..],
                        )?;
                    }
                    _ => respond(&mut out, "200 OK", "application/octet-stream", "", data)?,
                }
                continue;
            }
            layer_gets.fetch_add(1, Ordering::SeqCst);
            match m {
                BlobMode::Corrupt => {
                    let mut bad = data.clone();
                    bad[0] ^= 0xff;
                    respond(&mut out, "200 OK", "application/octet-stream", "", &bad)?;
                }
                BlobMode::StallAfter(n) => {
                    write!(out, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n", data.len())?;
                    out.write_all(&data[..n.min(data.len())])?;
                    out.flush()?;
                    std::thread::sleep(std::time::Duration::from_secs(600));
                    return Ok(());
                }
                BlobMode::Good => unreachable!(),
            }
            continue;
        }
        respond(&mut out, "404 Not Found", "application/json", "", b"{}")?;
    }
}

// ---------------------------------------------------------------------------------------------
// A registry that answers whatever a test makes it answer (issue 18: hostile graphs and sizes).

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// What a [`Hostile`] registry holds and how it misbehaves. Fill it, then [`Hostile::start`].
#[derive(Default, Clone)]
pub struct Hostile {
    /// (repository, tag or digest) → (body, media type).
    manifests: HashMap<(String, String), (Vec<u8>, String)>,
    /// digest → bytes.
    blobs: HashMap<String, Vec<u8>>,
    /// Blobs answered with zeros until the client stops reading.
    endless: Vec<String>,
    /// A `WWW-Authenticate` value every answer carries, with status 401.
    pub www_authenticate: Option<String>,
}

/// A running [`Hostile`] registry.
pub struct HostileRegistry {
    pub addr: String,
    /// Manifest GETs answered.
    pub manifest_gets: Arc<AtomicUsize>,
    /// Requests answered, all kinds.
    pub requests: Arc<AtomicUsize>,
    /// Bytes of endless blobs sent.
    pub endless_bytes: Arc<AtomicUsize>,
}

/// A descriptor as JSON.
pub fn desc(media_type: &str, digest: &str, size: u64) -> serde_json::Value {
    serde_json::json!({"mediaType": media_type, "digest": digest, "size": size})
}

impl Hostile {
    /// A blob; its descriptor.
    pub fn blob(&mut self, data: &[u8]) -> serde_json::Value {
        let d = sha256(data);
        self.blobs.insert(d.clone(), data.to_vec());
        let mt = if data.starts_with(b"{") {
            OCI_CONFIG
        } else {
            OCI_LAYER
        };
        desc(mt, &d, data.len() as u64)
    }

    /// A blob that is never served whole: `size` is what its descriptor says, the registry
    /// sends zeros until the client stops. Its descriptor.
    pub fn endless_blob(&mut self, seed: &str, size: u64) -> serde_json::Value {
        let d = sha256(format!("endless {seed}").as_bytes());
        self.endless.push(d.clone());
        desc(OCI_LAYER, &d, size)
    }

    /// A manifest document under its digest (and `tag`); its descriptor.
    pub fn manifest(
        &mut self,
        repo: &str,
        doc: &serde_json::Value,
        tag: Option<&str>,
    ) -> serde_json::Value {
        let body = serde_json::to_vec(doc).unwrap();
        let mt = doc["mediaType"]
            .as_str()
            .unwrap_or(OCI_MANIFEST)
            .to_string();
        let d = sha256(&body);
        if let Some(t) = tag {
            self.raw_manifest(repo, t, body.clone(), &mt);
        }
        self.raw_manifest(repo, &d, body.clone(), &mt);
        desc(&mt, &d, body.len() as u64)
    }

    /// Any bytes as the manifest `repo:reference` (no check at all).
    pub fn raw_manifest(&mut self, repo: &str, reference: &str, body: Vec<u8>, media_type: &str) {
        self.manifests.insert(
            (repo.to_string(), reference.to_string()),
            (body, media_type.to_string()),
        );
    }

    /// A linux/amd64 image of `layers` (its config added); `note` makes it distinct.
    pub fn image(
        &mut self,
        repo: &str,
        layers: &[serde_json::Value],
        tag: Option<&str>,
        note: Option<usize>,
    ) -> serde_json::Value {
        let config = self.blob(
            br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#,
        );
        let mut doc = serde_json::json!({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": config, "layers": layers});
        if let Some(n) = note {
            doc["annotations"] = serde_json::json!({"n": n.to_string()});
        }
        self.manifest(repo, &doc, tag)
    }

    /// An index of `children` (each given a linux/amd64 platform unless it has one).
    pub fn index(
        &mut self,
        repo: &str,
        children: Vec<serde_json::Value>,
        tag: Option<&str>,
    ) -> serde_json::Value {
        let children: Vec<serde_json::Value> = children
            .into_iter()
            .map(|mut c| {
                if c.get("platform").is_none() {
                    c["platform"] = serde_json::json!({"os": "linux", "architecture": "amd64"});
                }
                c
            })
            .collect();
        let doc = serde_json::json!({"schemaVersion": 2, "mediaType": OCI_INDEX,
            "manifests": children});
        self.manifest(repo, &doc, tag)
    }

    /// Serve it on 127.0.0.1 (a free port).
    pub fn start(self) -> HostileRegistry {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let reg = HostileRegistry {
            addr,
            manifest_gets: Arc::default(),
            requests: Arc::default(),
            endless_bytes: Arc::default(),
        };
        let state = Arc::new(self);
        let counters = (
            reg.manifest_gets.clone(),
            reg.requests.clone(),
            reg.endless_bytes.clone(),
        );
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (state, counters) = (state.clone(), counters.clone());
                std::thread::spawn(move || {
                    let _ = serve_hostile(conn, &state, &counters);
                });
            }
        });
        reg
    }
}

type Counters = (Arc<AtomicUsize>, Arc<AtomicUsize>, Arc<AtomicUsize>);

fn serve_hostile(conn: TcpStream, h: &Hostile, counters: &Counters) -> std::io::Result<()> {
    let (manifest_gets, requests, endless_bytes) = counters;
    // One write per answer, sent at once (no 40 ms of Nagle and delayed ACK per request).
    conn.set_nodelay(true)?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut out = conn;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let parts: Vec<&str> = line.split_whitespace().collect();
        if parts.len() < 2 {
            return Ok(());
        }
        let (method, path) = (parts[0].to_string(), parts[1].to_string());
        loop {
            let mut hl = String::new();
            if reader.read_line(&mut hl)? == 0 || hl.trim_end().is_empty() {
                break;
            }
        }
        requests.fetch_add(1, Ordering::SeqCst);
        let head = method == "HEAD";
        let mut respond = |status: &str, ctype: &str, extra: &str, body: &[u8]| {
            let mut answer = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n{extra}\r\n",
                body.len()
            )
            .into_bytes();
            if !head {
                answer.extend_from_slice(body);
            }
            out.write_all(&answer)?;
            out.flush()
        };
        if let Some(w) = &h.www_authenticate {
            respond(
                "401 Unauthorized",
                "application/json",
                &format!("WWW-Authenticate: {w}\r\n"),
                br#"{"errors":[{"code":"UNAUTHORIZED"}]}"#,
            )?;
            continue;
        }
        let path = path.split('?').next().unwrap_or("").to_string();
        if path == "/v2/" || path == "/v2" {
            respond("200 OK", "application/json", "", b"{}")?;
            continue;
        }
        if let Some((repo, r)) = path
            .strip_prefix("/v2/")
            .and_then(|p| p.rsplit_once("/manifests/"))
        {
            manifest_gets.fetch_add(1, Ordering::SeqCst);
            match h.manifests.get(&(repo.to_string(), r.to_string())) {
                Some((body, mt)) => {
                    let extra = format!("Docker-Content-Digest: {}\r\n", sha256(body));
                    respond("200 OK", mt, &extra, body)?
                }
                None => respond(
                    "404 Not Found",
                    "application/json",
                    "",
                    br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#,
                )?,
            }
            continue;
        }
        if let Some((_, d)) = path.rsplit_once("/blobs/") {
            if h.endless.iter().any(|e| e == d) {
                write!(
                    out,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n"
                )?;
                if head {
                    return Ok(());
                }
                let zeros = vec![0u8; 1 << 20];
                loop {
                    out.write_all(&zeros)?;
                    endless_bytes.fetch_add(zeros.len(), Ordering::SeqCst);
                }
            }
            match h.blobs.get(d) {
                Some(b) => respond("200 OK", "application/octet-stream", "", b)?,
                None => respond(
                    "404 Not Found",
                    "application/json",
                    "",
                    br#"{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown"}]}"#,
                )?,
            }
            continue;
        }
        respond("404 Not Found", "application/json", "", b"{}")?;
    }
}

/// A registry that says yes to everything and keeps nothing: 200 to every `HEAD` (with no
/// length), 202 and 201 to every upload, the right `Docker-Content-Digest` on every manifest
/// `PUT`, 404 to every other `GET`. Its requests, as `METHOD PATH`, in order.
pub fn liar() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let log = log.clone();
            std::thread::spawn(move || -> std::io::Result<()> {
                let mut r = BufReader::new(stream.try_clone()?);
                let mut w = stream;
                while let Some(Request {
                    method, path, body, ..
                }) = read_request(&mut r)?
                {
                    let n = {
                        let mut l = log.lock().unwrap();
                        l.push(format!("{method} {path}"));
                        l.len()
                    };
                    let not_here =
                        r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"not here"}]}"#;
                    let head = match (method.as_str(), path.as_str()) {
                        ("GET", "/v2/") => "200 OK\r\nContent-Length: 2\r\n\r\n{}".to_string(),
                        ("HEAD", _) => "200 OK\r\n\r\n".to_string(),
                        ("POST", _) | ("PATCH", _) => format!(
                            "202 Accepted\r\nLocation: /v2/x/blobs/uploads/{n}\r\nContent-Length: 0\r\n\r\n"
                        ),
                        ("PUT", p) if p.contains("/manifests/") => format!(
                            "201 Created\r\nDocker-Content-Digest: {}\r\nContent-Length: 0\r\n\r\n",
                            sha256(&body)
                        ),
                        ("PUT", _) => "201 Created\r\nContent-Length: 0\r\n\r\n".to_string(),
                        _ => format!(
                            "404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{not_here}",
                            not_here.len()
                        ),
                    };
                    w.write_all(format!("HTTP/1.1 {head}").as_bytes())?;
                }
                Ok(())
            });
        }
    });
    (addr, seen)
}
