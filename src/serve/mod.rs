//! `serve`: a read-only OCI distribution registry over any [`Catalog`] source; `koord-bundle
//! serve` gives it a bundle read in place (or the first part of a split bundle), with no
//! extraction, for sites that have no registry yet: containerd nodes, skopeo and
//! `helm pull oci://` read from it as from CNCF distribution.
//!
//! Layout: `index` (what is served: every tag walked by the copy engine), `http` (routes,
//! handlers, checked blob streams), `conns` (who may hold a connection), `auth` (htpasswd),
//! `tls`; this module binds, accepts and runs connections.
//!
//! # What is served
//!
//! * Repositories: each image's repository path (`koordinator-sh/koordlet`) with its tag, and
//!   `charts/<chart name>` with the chart version as tag (the Helm OCI artifact), from the ref
//!   names of the bundle manifest. A repository holds exactly what its tags reach: the top
//!   manifest, the child manifests of an index, their configs and layers.
//! * `GET/HEAD /v2/`, `/v2/_catalog`, `/v2/<name>/tags/list` (both with `?n=&last=` paging and a
//!   `Link` header), `/v2/<name>/manifests/<tag|digest>` and `/v2/<name>/blobs/<digest>` (with
//!   single `Range: bytes=` requests). Every other method answers 405 `UNSUPPORTED`.
//! * Manifests carry the media type the bundle recorded for a top manifest, else the one of the
//!   descriptor that reached it, else the document's own `mediaType`. They are served whatever
//!   the client's `Accept` says: their bytes and digest are fixed, and containerd, skopeo and
//!   helm all accept what they asked for (distribution 2.8 would answer 404 for an index fetched
//!   without the index type in `Accept`; nothing here is converted).
//! * HTTP/1.1, plain or TLS (rustls), optionally with basic auth from an htpasswd file (bcrypt
//!   entries only). Multi-range requests are answered with the whole blob (RFC 9110 allows a
//!   server to ignore `Range`).
//!
//! # Trust
//!
//! Nothing is served before the whole bundle verified (`BundleSource::open`: signature, every
//! byte, the layout graph). Manifests are served from the copies held in memory since then, so
//! they cannot change afterwards. Layers are read in place from the bundle file(s), which could
//! be altered after verification; so:
//!
//! * the source checks the files' size, modification time and identity before each blob is
//!   read (see `bundle::source`): a changed bundle answers 500 and a warning;
//! * every whole-blob `GET` is hashed as it streams, and its last chunk is held back until the
//!   digest matched: a mismatch breaks the connection (the client never receives a complete,
//!   wrong blob) and the blob is refused from then on;
//! * a range request is answered from whole 512 KiB chunks, each checked against the sha256 of
//!   that chunk taken at the blob's first range request (one read of the whole blob, whose
//!   digest must be the verified one) before any of its bytes are sent: changed bytes break the
//!   transfer off and refuse the blob from then on. (What is not promised: a change made and
//!   undone between two reads is not seen, since nothing then differs.)
//!
//! # Connections
//!
//! At most 1 024 connections (`--max-connections`), 64 per client address (see [`conns`]):
//! a client's further sockets are closed at once; when the server is full, the longest-idle
//! connection (no request in flight) of the client holding the most is closed for a newcomer.
//! More than half the connections taken shortens the time to send request headers from 30 to 5
//! seconds.

mod auth;
pub mod conns;
mod http;
mod index;
mod tls;

pub use auth::Htpasswd;
pub use http::REALM;
pub use index::{Index, Repository};
pub use tls::tls_config;

use crate::store::Catalog;
use conns::{Admission, Conn, Conns};
use http::State;
use hyper::body::Incoming;
use hyper::Request;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio_rustls::rustls;

/// Time a client has to finish the TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why serving cannot start (or stopped).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Cannot read a file.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The htpasswd file is unusable.
    #[error("htpasswd file {path}: {reason}")]
    Htpasswd {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The TLS certificate or key is unusable.
    #[error("TLS: {0}")]
    Tls(String),
    /// Cannot listen.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The error.
        source: io::Error,
    },
}

impl crate::exit::Classify for ServeError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        match self {
            // Reading a file, binding the address: the kind of I/O error decides (a port in
            // use is the input).
            ServeError::Io { .. } | ServeError::Bind { .. } => None,
            // An htpasswd file or TLS material that is not right.
            ServeError::Htpasswd { .. } | ServeError::Tls(_) => Some(crate::exit::ExitClass::Input),
        }
    }
}

// ------------------------------------------------------------------------------------------
// Events (the command layer prints them).

/// One answered request.
#[derive(Debug, Clone)]
pub struct RequestLog {
    /// The client.
    pub remote: SocketAddr,
    /// Method.
    pub method: String,
    /// Path and query (credentials never appear there).
    pub path: String,
    /// Status code.
    pub status: u16,
    /// Body bytes sent.
    pub bytes: u64,
    /// Whether the whole body was sent.
    pub complete: bool,
    /// From the request to the end of the response.
    pub elapsed: Duration,
}

/// What the server reports while it runs.
#[derive(Debug, Clone)]
pub enum Event {
    /// A request was answered (logged when its body ended or was abandoned).
    Request(RequestLog),
    /// Something the operator must know (the bundle changed on disk).
    Warning(String),
    /// A connection failed outside any request (TLS handshake, malformed HTTP).
    Connection {
        /// The client.
        remote: SocketAddr,
        /// What happened.
        error: String,
    },
}

/// Receives the server's events.
pub type EventSink = Arc<dyn Fn(Event) + Send + Sync>;

/// How to serve.
pub struct Options {
    /// Basic auth on every request.
    pub htpasswd: Option<Htpasswd>,
    /// TLS (else plain HTTP).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Where events go.
    pub events: EventSink,
    /// After the shutdown signal, how long open transfers may go on.
    pub grace: Duration,
    /// Most connections open at once (see [`conns`]).
    pub max_connections: usize,
}

// ------------------------------------------------------------------------------------------
// The server.

/// A bound listening socket (bind before the long verification, so a busy port fails fast).
pub struct Listener {
    tcp: tokio::net::TcpListener,
}

impl Listener {
    /// Listen on `addr` (`HOST:PORT`; port 0 picks a free one).
    pub async fn bind(addr: &str) -> Result<Listener, ServeError> {
        let tcp = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Bind {
                addr: addr.to_string(),
                source,
            })?;
        Ok(Listener { tcp })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

/// Serve what `src` holds (as `index` lists it) on `listener` until `shutdown` resolves; then
/// stop accepting, let open requests finish for up to `options.grace`, and return.
pub async fn serve<S: Catalog + 'static>(
    listener: Listener,
    src: Arc<S>,
    index: Index,
    options: Options,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let state = Arc::new(State::new(src, index, options.htpasswd, options.events));
    let tls = options.tls.map(tokio_rustls::TlsAcceptor::from);
    let (stop_tx, stop_rx) = watch::channel(false);
    let conns = Conns::with_limits(
        options.max_connections,
        conns::MAX_PER_CLIENT.min(options.max_connections / 2),
    );
    let mut refused = RefusedLog::default();
    let mut tasks = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        while tasks.try_join_next().is_some() {}
        let (tcp, remote) = tokio::select! {
            _ = &mut shutdown => break,
            r = listener.tcp.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: report, breathe, go on.
                    (state.events)(Event::Warning(format!("accept: {e}")));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (guard, header_timeout) = match conns.admit(remote.ip()) {
            Admission::Admitted(g, t) => (g, t),
            Admission::Refused(why) => {
                drop(tcp);
                refused.note(&state.events, remote, why);
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let state = state.clone();
        let tls = tls.clone();
        let stop = stop_rx.clone();
        tasks.spawn(async move {
            let conn = guard.conn.clone();
            let _guard = guard;
            match tls {
                None => serve_connection(tcp, remote, state, stop, conn, header_timeout).await,
                Some(acceptor) => {
                    let handshake =
                        tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
                    let done = tokio::select! {
                        r = handshake => r,
                        // Given up for a newcomer while it had not even finished its handshake.
                        _ = conn.evict.notified() => return,
                    };
                    match done {
                        Ok(Ok(io)) => {
                            serve_connection(io, remote, state, stop, conn, header_timeout).await
                        }
                        Ok(Err(e)) => (state.events)(Event::Connection {
                            remote,
                            error: format!("TLS handshake failed: {e}"),
                        }),
                        Err(_) => (state.events)(Event::Connection {
                            remote,
                            error: "TLS handshake timed out".into(),
                        }),
                    }
                }
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(options.grace, drain).await.is_err() {
        tasks.abort_all();
    }
    Ok(())
}

/// Refused connections, reported at most once every 5 seconds (an attack would flood the log).
#[derive(Default)]
struct RefusedLog {
    count: u64,
    last: Option<Instant>,
}

impl RefusedLog {
    fn note(&mut self, events: &EventSink, remote: SocketAddr, why: &str) {
        self.count += 1;
        if self
            .last
            .is_some_and(|t| t.elapsed() < Duration::from_secs(5))
        {
            return;
        }
        self.last = Some(Instant::now());
        events(Event::Connection {
            remote,
            error: format!(
                "connection closed at once: {why}, and none of them idle ({} closed so far)",
                self.count
            ),
        });
    }
}

async fn serve_connection<S: Catalog + 'static, I>(
    io: I,
    remote: SocketAddr,
    state: Arc<State<S>>,
    mut stop: watch::Receiver<bool>,
    conn_state: Arc<Conn>,
    header_timeout: Duration,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc_state = state.clone();
    let svc_conn = conn_state.clone();
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let state = svc_state.clone();
        let conn = svc_conn.clone();
        conn.request_started();
        async move { Ok::<_, std::convert::Infallible>(http::respond(state, req, remote, conn).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_timeout)
        .keep_alive(true);
    let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(io), svc);
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = async { stop.wait_for(|s| *s).await.map(|_| ()) } => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        // Given up for a newcomer while idle: close it (an idle HTTP/1 connection closes at
        // once; one half-way through its request headers gets a second).
        _ = conn_state.evict.notified() => {
            conn.as_mut().graceful_shutdown();
            match tokio::time::timeout(Duration::from_secs(1), conn.as_mut()).await {
                Ok(r) => r,
                Err(_) => return,
            }
        }
    };
    if let Err(e) = result {
        // A client that goes away mid-body is routine; the request log already says so.
        let io_kind = std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<io::Error>())
            .map(io::Error::kind);
        let client_left = matches!(
            io_kind,
            Some(
                io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
            )
        );
        if !(client_left
            || e.is_incomplete_message()
            || e.is_canceled()
            || e.is_closed()
            || e.is_user())
        {
            let error = if e.is_parse() {
                format!("not an HTTP/1 request ({e}): a TLS client on a plain-HTTP port?")
            } else {
                match std::error::Error::source(&e) {
                    Some(cause) => format!("{e}: {cause}"),
                    None => e.to_string(),
                }
            };
            (state.events)(Event::Connection { remote, error });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oci::{media, Digest};
    use crate::store::{MemoryStore, RawManifest};
    use serde_json::json;

    /// serve answers from any catalog source: here a store in memory, read with plain HTTP.
    #[tokio::test(flavor = "multi_thread")]
    async fn serves_a_memory_store() {
        let src = MemoryStore::new("m");
        let layer: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
        let config = src.add_blob(
            "a/b",
            "application/vnd.oci.image.config.v1+json",
            b"{}".to_vec(),
        );
        let l = src.add_blob(
            "a/b",
            "application/vnd.oci.image.layer.v1.tar",
            layer.clone(),
        );
        let m = RawManifest::new(
            serde_json::to_vec(
                &json!({"schemaVersion": 2, "mediaType": media::OCI_MANIFEST,
                "config": config, "layers": [l]}),
            )
            .unwrap(),
            media::OCI_MANIFEST,
        );
        src.add_manifest("a/b", Some("v1"), m.clone());
        let index = Index::build(&src).await.unwrap();
        let listener = Listener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            listener,
            Arc::new(src),
            index,
            Options {
                htpasswd: None,
                tls: None,
                events: Arc::new(|_| {}),
                grace: Duration::from_secs(1),
                max_connections: 16,
            },
            async {
                let _ = stop_rx.await;
            },
        ));
        let http = reqwest::Client::new();
        let get = |path: String, range: Option<&'static str>| {
            let mut r = http.get(format!("http://{addr}{path}"));
            if let Some(v) = range {
                r = r.header("range", v);
            }
            r.send()
        };
        let cat: serde_json::Value = serde_json::from_slice(
            &get("/v2/_catalog".into(), None)
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap(),
        )
        .unwrap();
        assert_eq!(cat["repositories"], json!(["a/b"]));
        let r = get("/v2/a/b/manifests/v1".into(), None).await.unwrap();
        assert_eq!(r.headers()["docker-content-digest"], m.digest.as_str());
        assert_eq!(r.bytes().await.unwrap(), m.bytes);
        let whole = get(format!("/v2/a/b/blobs/{}", l.digest), None)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(Digest::of(&whole), l.digest);
        let part = get(
            format!("/v2/a/b/blobs/{}", l.digest),
            Some("bytes=600000-1500000"),
        )
        .await
        .unwrap();
        assert_eq!(part.status(), 206);
        assert_eq!(part.bytes().await.unwrap(), &layer[600_000..=1_500_000]);
        let other = get(format!("/v2/x/blobs/{}", l.digest), None)
            .await
            .unwrap();
        assert_eq!(other.status(), 404);
        let _ = stop_tx.send(());
        server.await.unwrap().unwrap();
    }
}
