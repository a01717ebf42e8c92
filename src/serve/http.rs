//! The distribution API's read-only half over HTTP/1.1: `/v2/`, the catalog, tags, manifests
//! (from memory) and blobs (streamed from the source, checked as they go: whole blobs are hashed
//! and their last piece held back until the digest matched; ranges are answered from whole
//! chunks checked against chunk digests taken at the blob's first range request).

use super::auth::Htpasswd;
use super::conns::Conn;
use super::index::Index;
use super::{Event, EventSink, RequestLog};
use crate::oci::{Descriptor, Digest};
use crate::store::{BlobStream, Catalog, StoreError};
use bytes::Bytes;
use futures_util::StreamExt;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use sha2::Digest as _;
use std::collections::{HashMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Bytes of a blob checked at once for a range request.
const CHUNK: u64 = 512 * 1024;
/// Pieces read ahead of the network per transfer.
const READ_AHEAD: usize = 4;
/// The realm of the basic-auth challenge.
pub const REALM: &str = "koord-bundle";

/// The digest of every chunk of a blob, or why they could not be taken.
type ChunkDigests = Result<Arc<Vec<[u8; 32]>>, String>;

/// What the handlers share.
pub(super) struct State<S> {
    pub src: Arc<S>,
    pub index: Index,
    pub htpasswd: Option<Htpasswd>,
    pub events: EventSink,
    /// Blobs that failed their digest check while streaming: refused from then on.
    pub tainted: Mutex<HashSet<Digest>>,
    /// The sha256 of each [`CHUNK`] of a blob, taken (with a whole-blob digest check) at its
    /// first range request.
    pub chunk_digests: Mutex<HashMap<Digest, Arc<tokio::sync::OnceCell<ChunkDigests>>>>,
}

impl<S> State<S> {
    pub(super) fn new(
        src: Arc<S>,
        index: Index,
        htpasswd: Option<Htpasswd>,
        events: EventSink,
    ) -> Self {
        State {
            src,
            index,
            htpasswd,
            events,
            tainted: Mutex::new(HashSet::new()),
            chunk_digests: Mutex::new(HashMap::new()),
        }
    }
}

/// The response body: nothing, bytes in memory, or a blob streamed from the bundle. It logs
/// the request when it is dropped (after the last byte, or when the client went away).
pub struct Body {
    kind: Kind,
    expected: u64,
    sent: u64,
    log: Option<(EventSink, RequestLog, Instant)>,
    /// The connection it answers on, told when the response is over.
    conn: Option<Arc<Conn>>,
}

enum Kind {
    Empty,
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<io::Result<Bytes>>),
}

impl Body {
    fn empty() -> Body {
        Body::of(Kind::Empty, 0)
    }
    fn full(b: impl Into<Bytes>) -> Body {
        let b = b.into();
        let n = b.len() as u64;
        Body::of(Kind::Full(Some(b)), n)
    }
    fn of(kind: Kind, expected: u64) -> Body {
        Body {
            kind,
            expected,
            sent: 0,
            log: None,
            conn: None,
        }
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        let next = match &mut this.kind {
            Kind::Empty => None,
            Kind::Full(b) => b.take().map(Ok),
            Kind::Stream(rx) => match rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(r) => r,
            },
        };
        Poll::Ready(next.map(|r| {
            r.map(|b| {
                this.sent += b.len() as u64;
                Frame::data(b)
            })
        }))
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Empty | Kind::Full(None) => true,
            Kind::Full(Some(_)) => false,
            Kind::Stream(_) => self.expected == self.sent,
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.expected.saturating_sub(self.sent))
    }
}

impl Drop for Body {
    fn drop(&mut self) {
        if let Some(c) = self.conn.take() {
            c.request_ended();
        }
        if let Some((sink, mut log, started)) = self.log.take() {
            log.bytes = self.sent;
            log.complete = self.sent == self.expected;
            log.elapsed = started.elapsed();
            sink(Event::Request(log));
        }
    }
}

/// Answer one request, and log it when its body ends.
pub(super) async fn respond<S: Catalog + 'static>(
    state: Arc<State<S>>,
    req: Request<Incoming>,
    remote: SocketAddr,
    conn: Arc<Conn>,
) -> Response<Body> {
    let started = Instant::now();
    let mut path: String = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .chars()
        .take(512)
        .collect();
    if path.is_empty() {
        path.push('/');
    }
    let method = req.method().clone();
    let mut resp = handle(&state, &req).await;
    if method == Method::HEAD {
        // Headers as for GET (Content-Length included), no body.
        *resp.body_mut() = Body::empty();
    }
    resp.headers_mut().insert(
        "docker-distribution-api-version",
        HeaderValue::from_static("registry/2.0"),
    );
    let status = resp.status().as_u16();
    resp.body_mut().conn = Some(conn);
    resp.body_mut().log = Some((
        state.events.clone(),
        RequestLog {
            remote,
            method: method.to_string(),
            path,
            status,
            bytes: 0,
            complete: false,
            elapsed: Duration::ZERO,
        },
        started,
    ));
    resp
}

/// An OCI distribution error response.
fn error(
    status: StatusCode,
    code: &str,
    message: &str,
    detail: serde_json::Value,
) -> Response<Body> {
    let body =
        serde_json::json!({"errors": [{"code": code, "message": message, "detail": detail}]});
    json_response(status, &body)
}

fn json_response(status: StatusCode, v: &serde_json::Value) -> Response<Body> {
    let bytes = serde_json::to_vec(v).unwrap_or_default();
    let mut r = Response::new(Body::full(bytes.clone()));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    r
}

/// A request's route under `/v2/`.
#[derive(Debug, PartialEq, Eq)]
enum Route<'a> {
    Base,
    Catalog,
    Tags(&'a str),
    Manifest(&'a str, &'a str),
    Blob(&'a str, &'a str),
    NotFound,
}

fn route(path: &str) -> Route<'_> {
    if path == "/v2" || path == "/v2/" {
        return Route::Base;
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return Route::NotFound;
    };
    if rest == "_catalog" {
        return Route::Catalog;
    }
    if let Some(name) = rest.strip_suffix("/tags/list") {
        return Route::Tags(name);
    }
    if let Some((name, r)) = rest.rsplit_once("/manifests/") {
        if !r.is_empty() && !r.contains('/') && !name.is_empty() {
            return Route::Manifest(name, r);
        }
    }
    if let Some((name, r)) = rest.rsplit_once("/blobs/") {
        if !r.is_empty() && !r.contains('/') && !name.is_empty() {
            return Route::Blob(name, r);
        }
    }
    Route::NotFound
}

/// A digest reference: `Ok(Some)` a sha256 digest, `Ok(None)` not a digest (a tag), `Err` a
/// malformed sha256 digest, or another algorithm (then unknown here).
enum Reference {
    Digest(Digest),
    Tag,
    Invalid,
    OtherAlgorithm,
}

fn reference(r: &str) -> Reference {
    if !r.contains(':') {
        return Reference::Tag;
    }
    match r.parse::<Digest>() {
        Ok(d) => Reference::Digest(d),
        Err(_) if r.starts_with("sha256:") => Reference::Invalid,
        Err(_) => Reference::OtherAlgorithm,
    }
}

async fn handle<S: Catalog + 'static>(
    state: &Arc<State<S>>,
    req: &Request<Incoming>,
) -> Response<Body> {
    if state.htpasswd.is_some() {
        let ok = match req.headers().get(header::AUTHORIZATION) {
            None => false,
            Some(v) => {
                let v = v.as_bytes().to_vec();
                let state = state.clone();
                tokio::task::spawn_blocking(move || {
                    state.htpasswd.as_ref().is_some_and(|h| h.check(&v))
                })
                .await
                .unwrap_or(false)
            }
        };
        if !ok {
            let mut r = error(
                StatusCode::UNAUTHORIZED,
                "UNAUTHORIZED",
                "authentication required",
                serde_json::Value::Null,
            );
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"koord-bundle\""),
            );
            return r;
        }
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = error(
            StatusCode::METHOD_NOT_ALLOWED,
            "UNSUPPORTED",
            "The operation is unsupported.",
            serde_json::Value::String(
                "koord-bundle serve is a read-only registry: only GET and HEAD are answered".into(),
            ),
        );
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let index = &state.index;
    let query = req.uri().query().unwrap_or("");
    match route(req.uri().path()) {
        Route::Base => json_response(StatusCode::OK, &serde_json::json!({})),
        Route::Catalog => {
            let names: Vec<&str> = index.repos.keys().map(String::as_str).collect();
            let (page, next) = paginate(&names, query);
            let mut r = json_response(StatusCode::OK, &serde_json::json!({ "repositories": page }));
            if let Some(link) = next.map(|(last, n)| link("/v2/_catalog", last, n)) {
                r.headers_mut().insert(header::LINK, link);
            }
            r
        }
        Route::Tags(name) => match index.repos.get(name) {
            None => error(
                StatusCode::NOT_FOUND,
                "NAME_UNKNOWN",
                "repository name not known to registry",
                serde_json::json!({ "name": name }),
            ),
            Some(repo) => {
                let tags: Vec<&str> = repo.tags.keys().map(String::as_str).collect();
                let (page, next) = paginate(&tags, query);
                let mut r = json_response(
                    StatusCode::OK,
                    &serde_json::json!({ "name": name, "tags": page }),
                );
                if let Some(l) =
                    next.map(|(last, n)| link(&format!("/v2/{name}/tags/list"), last, n))
                {
                    r.headers_mut().insert(header::LINK, l);
                }
                r
            }
        },
        Route::Manifest(name, r) => manifest(index, name, r),
        Route::Blob(name, r) => blob(state, name, r, req).await,
        Route::NotFound => {
            let mut r = Response::new(Body::full(&b"404 page not found\n"[..]));
            *r.status_mut() = StatusCode::NOT_FOUND;
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            r.headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from(19u64));
            r
        }
    }
}

fn manifest_unknown(r: &str) -> Response<Body> {
    let detail = if r.contains(':') {
        serde_json::json!({ "Digest": r })
    } else {
        serde_json::json!({ "Tag": r })
    };
    error(
        StatusCode::NOT_FOUND,
        "MANIFEST_UNKNOWN",
        "manifest unknown",
        detail,
    )
}

fn digest_invalid() -> Response<Body> {
    error(
        StatusCode::BAD_REQUEST,
        "DIGEST_INVALID",
        "provided digest did not match uploaded content",
        serde_json::json!({}),
    )
}

fn manifest(index: &Index, name: &str, r: &str) -> Response<Body> {
    let Some(repo) = index.repos.get(name) else {
        return manifest_unknown(r);
    };
    let digest = match reference(r) {
        Reference::Tag => repo.tags.get(r).cloned(),
        Reference::Digest(d) => repo.manifests.contains(&d).then_some(d),
        Reference::Invalid => return digest_invalid(),
        Reference::OtherAlgorithm => None,
    };
    let Some(m) = digest.and_then(|d| index.manifests.get(&d)) else {
        return manifest_unknown(r);
    };
    let mut resp = Response::new(Body::full(m.bytes.clone()));
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&m.media_type) {
        h.insert(header::CONTENT_TYPE, v);
    }
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(m.bytes.len()));
    digest_headers(h, &m.digest);
    resp
}

fn digest_headers(h: &mut HeaderMap, digest: &Digest) {
    if let Ok(v) = HeaderValue::from_str(digest.as_str()) {
        h.insert("docker-content-digest", v);
    }
    if let Ok(v) = HeaderValue::from_str(&format!("\"{digest}\"")) {
        h.insert(header::ETAG, v);
    }
}

/// What a `Range` header asks of a blob of `size` bytes.
#[derive(Debug, PartialEq, Eq)]
enum RangeReq {
    /// No (usable) range: the whole blob.
    Whole,
    /// Bytes `start..=end`.
    Part(u64, u64),
    /// Malformed or unsatisfiable: 416.
    Unsatisfiable,
}

fn parse_range(value: Option<&str>, size: u64) -> RangeReq {
    let Some(v) = value else {
        return RangeReq::Whole;
    };
    let v = v.trim();
    let Some(spec) = v.strip_prefix("bytes=") else {
        // Another unit: ignored, as RFC 9110 allows.
        return RangeReq::Whole;
    };
    if spec.contains(',') {
        // Several ranges: answered with the whole blob (no multipart).
        return RangeReq::Whole;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return RangeReq::Unsatisfiable;
    };
    let (a, b) = (a.trim(), b.trim());
    let num = |s: &str| -> Option<u64> {
        (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    if a.is_empty() {
        // Suffix: the last b bytes.
        return match num(b) {
            Some(n) if n > 0 && size > 0 => RangeReq::Part(size - n.min(size), size - 1),
            _ => RangeReq::Unsatisfiable,
        };
    }
    let Some(start) = num(a) else {
        return RangeReq::Unsatisfiable;
    };
    if start >= size {
        return RangeReq::Unsatisfiable;
    }
    if b.is_empty() {
        return RangeReq::Part(start, size - 1);
    }
    match num(b) {
        Some(end) if end >= start => RangeReq::Part(start, end.min(size - 1)),
        _ => RangeReq::Unsatisfiable,
    }
}

fn blob_unknown(r: &str) -> Response<Body> {
    error(
        StatusCode::NOT_FOUND,
        "BLOB_UNKNOWN",
        "blob unknown to registry",
        serde_json::Value::String(r.to_string()),
    )
}

fn internal(message: &str) -> Response<Body> {
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "UNKNOWN",
        message,
        serde_json::Value::Null,
    )
}

async fn blob<S: Catalog + 'static>(
    state: &Arc<State<S>>,
    name: &str,
    r: &str,
    req: &Request<Incoming>,
) -> Response<Body> {
    let index = &state.index;
    let digest = match reference(r) {
        Reference::Digest(d) => d,
        Reference::Tag | Reference::Invalid => return digest_invalid(),
        Reference::OtherAlgorithm => return blob_unknown(r),
    };
    let Some(repo) = index.repos.get(name) else {
        return blob_unknown(r);
    };
    // A manifest fetched as a blob comes from memory; everything else from the source.
    let in_memory = repo
        .manifests
        .contains(&digest)
        .then(|| index.manifests.get(&digest))
        .flatten();
    let desc = match (in_memory, repo.blobs.contains(&digest)) {
        (Some(m), _) => m.descriptor(),
        (None, true) => match index.blobs.get(&digest) {
            Some(d) => d.clone(),
            None => return blob_unknown(r),
        },
        (None, false) => return blob_unknown(r),
    };
    if state.tainted.lock().is_ok_and(|t| t.contains(&digest)) {
        return internal(
            "this blob no longer matches its digest on disk: the bundle changed after verification",
        );
    }
    let size = desc.size;
    let range = parse_range(
        req.headers()
            .get(header::RANGE)
            .and_then(|v| v.to_str().ok()),
        size,
    );
    let (start, end) = match range {
        RangeReq::Whole => (0, size.saturating_sub(1)),
        RangeReq::Part(a, b) => (a, b),
        RangeReq::Unsatisfiable => {
            let mut resp = error(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "RANGE_INVALID",
                "requested range not satisfiable",
                serde_json::json!({ "size": size }),
            );
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                resp.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return resp;
        }
    };
    let len = if size == 0 { 0 } else { end - start + 1 };
    let body = match in_memory {
        _ if req.method() == Method::HEAD => Body::empty(),
        Some(m) => match usize::try_from(start.saturating_add(len)) {
            Ok(end) if end <= m.bytes.len() => Body::full(m.bytes.slice(start as usize..end)),
            _ => return internal("a range beyond the manifest"),
        },
        None => {
            // Opened here, before the answer: a source that cannot serve it (the bundle changed
            // on disk) answers 500, not a broken transfer.
            let from = match range {
                RangeReq::Whole => 0,
                _ => (start / CHUNK) * CHUNK,
            };
            match state.src.blob(name, &desc, from).await {
                Ok(stream) => match range {
                    RangeReq::Whole => stream_whole(state.clone(), desc, stream),
                    _ => stream_range(state.clone(), name.to_string(), desc, stream, start, len),
                },
                Err(e) => {
                    (state.events)(Event::Warning(format!(
                        "{e}; refusing to serve {digest} (restart serve to verify the bundle again)"
                    )));
                    return internal("the bundle changed on disk after verification");
                }
            }
        }
    };
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("max-age=31536000"),
    );
    digest_headers(h, &digest);
    if let RangeReq::Part(a, b) = range {
        *resp.status_mut() = StatusCode::PARTIAL_CONTENT;
        if let Ok(v) = HeaderValue::from_str(&format!("bytes {a}-{b}/{size}")) {
            resp.headers_mut().insert(header::CONTENT_RANGE, v);
        }
    }
    resp
}

/// Mark a blob as changed (refused from now on) and tell the operator.
fn taint<S>(state: &State<S>, digest: &Digest, what: &str) {
    if let Ok(mut t) = state.tainted.lock() {
        t.insert(digest.clone());
    }
    (state.events)(Event::Warning(format!(
        "blob {digest} {what}: the bundle changed after verification; the transfer was broken off and the blob is refused from now on (restart serve to verify the bundle again)"
    )));
}

fn broken(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Exactly-sized pieces from a stream of any pieces.
struct Exact {
    stream: BlobStream,
    carry: Bytes,
}

impl Exact {
    /// The next `n` bytes (fewer only at the end of the stream).
    async fn take(&mut self, n: usize) -> Result<Bytes, StoreError> {
        let mut out = bytes::BytesMut::new();
        while out.len() < n {
            if self.carry.is_empty() {
                match self.stream.next().await {
                    Some(piece) => self.carry = piece?,
                    None => break,
                }
            }
            let k = (n - out.len()).min(self.carry.len());
            out.extend_from_slice(&self.carry.split_to(k));
        }
        Ok(out.freeze())
    }
}

/// A whole blob, hashed as it streams; its last piece is held back until the digest matched.
fn stream_whole<S: Catalog + 'static>(
    state: Arc<State<S>>,
    desc: Descriptor,
    mut stream: BlobStream,
) -> Body {
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(READ_AHEAD);
    let len = desc.size;
    tokio::spawn(async move {
        let mut hasher = sha2::Sha256::new();
        let mut held: Option<Bytes> = None;
        let mut n = 0u64;
        while let Some(piece) = stream.next().await {
            let piece = match piece {
                Ok(p) => p,
                Err(e) => {
                    (state.events)(Event::Warning(format!("reading blob {}: {e}", desc.digest)));
                    let _ = tx.send(Err(io::Error::other(e.to_string()))).await;
                    return;
                }
            };
            hasher.update(&piece);
            n += piece.len() as u64;
            if let Some(c) = held.replace(piece) {
                if tx.send(Ok(c)).await.is_err() {
                    return; // The client went away.
                }
            }
        }
        let actual = Digest::from_hasher(hasher);
        if actual != desc.digest || n != desc.size {
            taint(&state, &desc.digest, &format!("read back as {actual}"));
            let _ = tx.send(Err(broken("blob does not match its digest"))).await;
            return;
        }
        if let Some(c) = held {
            let _ = tx.send(Ok(c)).await;
        }
    });
    Body::of(Kind::Stream(rx), len)
}

/// The chunk digests of a blob, taken once (one read of the whole blob, whose digest must be
/// the verified one).
async fn chunk_digests<S: Catalog + 'static>(
    state: &Arc<State<S>>,
    repo: &str,
    desc: &Descriptor,
) -> ChunkDigests {
    let cell = {
        let Ok(mut m) = state.chunk_digests.lock() else {
            return Err("internal lock poisoned".into());
        };
        m.entry(desc.digest.clone()).or_default().clone()
    };
    cell.get_or_init(|| async {
        let stream = state
            .src
            .blob(repo, desc, 0)
            .await
            .map_err(|e| e.to_string())?;
        let mut exact = Exact {
            stream,
            carry: Bytes::new(),
        };
        let mut whole = sha2::Sha256::new();
        let mut chunks = Vec::new();
        let mut pos = 0;
        while pos < desc.size {
            let n = (desc.size - pos).min(CHUNK);
            let buf = exact.take(n as usize).await.map_err(|e| e.to_string())?;
            if buf.len() as u64 != n {
                return Err("the blob ended early".to_string());
            }
            whole.update(&buf);
            chunks.push(sha2::Sha256::digest(&buf).into());
            pos += n;
        }
        let actual = Digest::from_hasher(whole);
        if actual != desc.digest {
            taint(state, &desc.digest, &format!("read back as {actual}"));
            return Err(format!("read back as {actual}"));
        }
        Ok(Arc::new(chunks))
    })
    .await
    .clone()
}

/// Bytes `start..start+len` of a blob, from whole chunks each checked against its digest
/// before any of its bytes are sent. `stream` starts at the chunk holding `start`.
fn stream_range<S: Catalog + 'static>(
    state: Arc<State<S>>,
    repo: String,
    desc: Descriptor,
    stream: BlobStream,
    start: u64,
    len: u64,
) -> Body {
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(READ_AHEAD);
    tokio::spawn(async move {
        let digests = match chunk_digests(&state, &repo, &desc).await {
            Ok(c) => c,
            Err(e) => {
                let _ = tx.send(Err(broken(&e))).await;
                return;
            }
        };
        let mut exact = Exact {
            stream,
            carry: Bytes::new(),
        };
        let mut pos = (start / CHUNK) * CHUNK;
        let stop = start.saturating_add(len).min(desc.size);
        while pos < stop {
            let n = (desc.size - pos).min(CHUNK);
            let chunk = match exact.take(n as usize).await {
                Ok(c) if c.len() as u64 == n => c,
                Ok(_) => {
                    let _ = tx.send(Err(broken("the blob ended early"))).await;
                    return;
                }
                Err(e) => {
                    let _ = tx.send(Err(io::Error::other(e.to_string()))).await;
                    return;
                }
            };
            let actual: [u8; 32] = sha2::Sha256::digest(&chunk).into();
            if digests.get((pos / CHUNK) as usize) != Some(&actual) {
                taint(
                    &state,
                    &desc.digest,
                    &format!("changed in bytes {pos}..{}", pos + n),
                );
                let _ = tx.send(Err(broken("blob does not match its digest"))).await;
                return;
            }
            // The part of this chunk the range asked for.
            let from = start.saturating_sub(pos) as usize;
            let to = (stop.min(pos + n) - pos) as usize;
            if tx.send(Ok(chunk.slice(from..to))).await.is_err() {
                return; // The client went away.
            }
            pos += n;
        }
    });
    Body::of(Kind::Stream(rx), len)
}

/// Paging of a sorted list by `n` and `last` (OCI distribution): the page and, when more
/// remain, the `last` and `n` of the next page.
fn paginate<'a>(items: &[&'a str], query: &str) -> (Vec<&'a str>, Option<(String, usize)>) {
    let mut n = None;
    let mut last = None;
    for kv in query.split('&') {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        match k {
            "n" => n = v.parse::<usize>().ok(),
            "last" => last = Some(crate::text::percent_decode(v)),
            _ => {}
        }
    }
    let rest: Vec<&str> = items
        .iter()
        .copied()
        .filter(|i| last.as_deref().is_none_or(|l| *i > l))
        .collect();
    match n {
        Some(n) if n < rest.len() => {
            let page: Vec<&str> = rest[..n].to_vec();
            let next = page.last().map(|l| (l.to_string(), n));
            (page, next)
        }
        _ => (rest, None),
    }
}

fn link(path: &str, last: String, n: usize) -> HeaderValue {
    let v = format!(
        "<{path}?last={}&n={n}>; rel=\"next\"",
        crate::text::percent_encode(&last)
    );
    HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(route("/v2/"), Route::Base);
        assert_eq!(route("/v2"), Route::Base);
        assert_eq!(route("/v2/_catalog"), Route::Catalog);
        assert_eq!(route("/v2/a/b/tags/list"), Route::Tags("a/b"));
        assert_eq!(
            route("/v2/koordinator-sh/koordlet/manifests/v1.8.0"),
            Route::Manifest("koordinator-sh/koordlet", "v1.8.0")
        );
        assert_eq!(
            route("/v2/charts/koordinator/blobs/sha256:ab"),
            Route::Blob("charts/koordinator", "sha256:ab")
        );
        // A repository whose path holds "manifests" still routes on the last one.
        assert_eq!(
            route("/v2/x/manifests/y/manifests/z"),
            Route::Manifest("x/manifests/y", "z")
        );
        assert_eq!(route("/v2/x/blobs/uploads/"), Route::NotFound);
        assert_eq!(route("/v2/x/blobs/"), Route::NotFound);
        assert_eq!(route("/v1/x"), Route::NotFound);
        assert_eq!(route("/"), Route::NotFound);
    }

    #[test]
    fn ranges() {
        use RangeReq::*;
        assert_eq!(parse_range(None, 10), Whole);
        assert_eq!(parse_range(Some("bytes=0-4"), 10), Part(0, 4));
        assert_eq!(parse_range(Some("bytes=5-"), 10), Part(5, 9));
        assert_eq!(parse_range(Some("bytes=5-100"), 10), Part(5, 9));
        assert_eq!(parse_range(Some("bytes=-3"), 10), Part(7, 9));
        assert_eq!(parse_range(Some("bytes=-30"), 10), Part(0, 9));
        assert_eq!(parse_range(Some("bytes=10-"), 10), Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=4-2"), 10), Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=x-2"), 10), Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=-0"), 10), Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=0-0"), 0), Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=0-1,4-5"), 10), Whole);
        assert_eq!(parse_range(Some("items=0-1"), 10), Whole);
        // Numbers at and past u64's end: answered or refused, never wrapped.
        let max = u64::MAX;
        assert_eq!(
            parse_range(Some("bytes=18446744073709551615-"), 10),
            Unsatisfiable
        );
        assert_eq!(
            parse_range(Some("bytes=18446744073709551616-"), 10),
            Unsatisfiable
        );
        assert_eq!(
            parse_range(Some("bytes=0-18446744073709551615"), 10),
            Part(0, 9)
        );
        assert_eq!(
            parse_range(Some("bytes=-18446744073709551615"), 10),
            Part(0, 9)
        );
        assert_eq!(
            parse_range(Some("bytes=-99999999999999999999"), 10),
            Unsatisfiable
        );
        assert_eq!(parse_range(Some("bytes=5-"), max), Part(5, max - 1));
        assert_eq!(parse_range(Some("bytes=-1"), max), Part(max - 1, max - 1));
        for r in [
            "bytes=0-",
            "bytes=-18446744073709551615",
            "bytes=18446744073709551614-",
        ] {
            if let Part(a, b) = parse_range(Some(r), max) {
                assert!(b >= a && b - a < max, "{r}: the length {b} - {a} + 1 fits");
            }
        }
    }

    #[test]
    fn paging() {
        let items = ["a", "b/c", "d", "e"];
        assert_eq!(paginate(&items, ""), (items.to_vec(), None));
        assert_eq!(
            paginate(&items, "n=2"),
            (vec!["a", "b/c"], Some(("b/c".to_string(), 2)))
        );
        assert_eq!(paginate(&items, "n=2&last=b%2Fc"), (vec!["d", "e"], None));
        assert_eq!(paginate(&items, "last=d"), (vec!["e"], None));
        assert_eq!(paginate(&items, "n=0"), (vec![], None));
        assert_eq!(
            link("/v2/_catalog", "b/c".into(), 2),
            "</v2/_catalog?last=b%2Fc&n=2>; rel=\"next\""
        );
        assert_eq!(crate::text::percent_decode("a%2Fb%zz%"), "a/b%zz%");
    }

    #[test]
    fn references() {
        assert!(matches!(reference("v1.8.0"), Reference::Tag));
        assert!(matches!(
            reference(Digest::of(b"x").as_str()),
            Reference::Digest(_)
        ));
        assert!(matches!(reference("sha256:xyz"), Reference::Invalid));
        assert!(matches!(
            reference("sha512:abcd"),
            Reference::OtherAlgorithm
        ));
    }
}
