//! `serve`: a read-only OCI distribution registry straight from a bundle (or the first part of
//! a split bundle), with no extraction, for sites that have no registry yet: containerd nodes,
//! skopeo and `helm pull oci://` read from it as from CNCF distribution.
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
//! Nothing is served before the whole bundle verified ([`Served::open`]: signature, every byte,
//! the layout graph). Manifests and configs are served from the copies held in memory during
//! that pass, so they cannot change afterwards. Layers are read in place from the bundle file(s),
//! which could be altered after verification; so:
//!
//! * the files are opened once; their size, modification time and identity (device, inode) must
//!   be those seen before verification began, and the size and modification time are checked
//!   again (one `fstat`) before each blob is served: a changed bundle answers 500 and a warning;
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

pub mod conns;

use crate::bundle::parts::BundleFile;
use crate::bundle::reader::{self, SignaturePolicy, VerifyError, VerifyReport};
use crate::bundle::BundleManifest;
use crate::oci::{Digest, Manifest};
use bytes::Bytes;
use conns::{Admission, Conn, Conns};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use sha2::Digest as _;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};
use tokio_rustls::rustls;

/// Bytes read from the bundle per chunk of a streamed blob.
const CHUNK: u64 = 512 * 1024;
/// Chunks read ahead of the network per transfer.
const READ_AHEAD: usize = 4;
/// Time a client has to finish the TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The realm of the basic-auth challenge.
pub const REALM: &str = "koord-bundle";

/// Why serving cannot start (or stopped).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The bundle did not verify.
    #[error(transparent)]
    Verify(#[from] VerifyError),
    /// A gzip bundle: blobs cannot be read in place.
    #[error("{path} is gzip-compressed: serve reads blobs in place, so decompress it first (gunzip -k {path})")]
    Compressed {
        /// The bundle.
        path: String,
    },
    /// The bundle's files changed while (or after) they were verified.
    #[error("bundle file {path} changed since it was verified ({what}): verify it again")]
    Changed {
        /// The file.
        path: PathBuf,
        /// What changed.
        what: String,
    },
    /// The verified bundle does not hold what serving needs.
    #[error("bundle {path}: {reason}")]
    Content {
        /// The bundle.
        path: PathBuf,
        /// Why.
        reason: String,
    },
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

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ServeError + '_ {
    move |source| ServeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

// ------------------------------------------------------------------------------------------
// The verified bundle.

/// What identifies a file's content cheaply: size, modification time and (on unix) identity.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    #[cfg(unix)]
    id: (u64, u64),
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Self {
        Stamp {
            len: m.len(),
            modified: m.modified().ok(),
            #[cfg(unix)]
            id: {
                use std::os::unix::fs::MetadataExt as _;
                (m.dev(), m.ino())
            },
        }
    }
    /// What differs from `then`, if anything.
    fn differs(&self, then: &Stamp, identity: bool) -> Option<String> {
        if self.len != then.len {
            return Some(format!("{} bytes, was {}", self.len, then.len));
        }
        if self.modified != then.modified {
            return Some("modified".into());
        }
        #[cfg(unix)]
        if identity && self.id != then.id {
            return Some("replaced by another file".into());
        }
        let _ = identity;
        None
    }
}

/// One file of the bundle, opened once.
#[derive(Debug)]
struct Part {
    path: PathBuf,
    file: File,
    /// Where this part's bundle bytes start in the bundle stream.
    start: u64,
    /// Bundle bytes in this part.
    len: u64,
    /// Where they start in the file.
    file_offset: u64,
    stamp: Stamp,
}

/// A repository: its tags, the manifests and blobs they reach.
#[derive(Debug, Default, Clone)]
pub struct Repository {
    /// Tag → top manifest digest.
    pub tags: BTreeMap<String, Digest>,
    manifests: HashSet<Digest>,
    blobs: HashSet<Digest>,
}

/// Where a blob's bytes are.
#[derive(Debug, Clone)]
enum Source {
    /// In memory (manifests, configs: every JSON blob of at most 4 MiB).
    Memory(Bytes),
    /// In the bundle stream at this offset.
    File(u64),
}

#[derive(Debug, Clone)]
struct Blob {
    size: u64,
    source: Source,
}

/// A verified bundle, ready to serve.
#[derive(Debug)]
pub struct Served {
    path: PathBuf,
    report: VerifyReport,
    repos: BTreeMap<String, Repository>,
    /// Manifest digest → media type (its bytes are in `blobs`, in memory).
    manifest_types: HashMap<Digest, String>,
    blobs: HashMap<Digest, Blob>,
    parts: Vec<Part>,
}

fn parts_err(path: &Path, e: crate::bundle::parts::PartsError) -> ServeError {
    ServeError::Verify(VerifyError::Parts {
        path: path.to_path_buf(),
        source: e,
    })
}

/// An incremental bundle cannot be served alone.
fn incremental(path: &Path, manifest: &BundleManifest) -> Result<(), ServeError> {
    if manifest.omitted_blobs.is_empty() {
        return Ok(());
    }
    let base = manifest
        .base
        .as_ref()
        .map(|b| format!(" on the {} bundle created {}", b.chart_version, b.created))
        .unwrap_or_default();
    Err(ServeError::Content {
        path: path.to_path_buf(),
        reason: format!(
            "an incremental bundle (it builds{base} and leaves out {} blobs the site already holds) cannot be served on its own: serve the full bundle, or load this one into the registry that holds its base",
            manifest.omitted_blobs.len()
        ),
    })
}

impl Served {
    /// Verify the bundle at `path` (a file, or the first part of a split bundle) completely,
    /// then index it for serving. A gzip bundle, and an incremental one (it leaves out blobs
    /// the site already holds, so cannot be served alone), are refused before verification.
    pub fn open(
        path: &Path,
        policy: SignaturePolicy<'_>,
        on_bytes: &dyn Fn(u64),
    ) -> Result<Served, ServeError> {
        let bf = BundleFile::open(path).map_err(|e| parts_err(path, e))?;
        let compressed = || ServeError::Compressed {
            path: path.display().to_string(),
        };
        if bf
            .read_range(0, 2)
            .map_err(|e| parts_err(path, e))?
            .starts_with(&[0x1f, 0x8b])
        {
            return Err(compressed());
        }
        // Only for a quick refusal: the verified manifest is checked again below.
        let head = reader::read_head(path)?;
        if let Ok(m) = serde_json::from_slice::<BundleManifest>(&head.manifest) {
            incremental(path, &m)?;
        }
        let before = bf
            .parts
            .iter()
            .map(|s| {
                std::fs::metadata(&s.path)
                    .map(|m| Stamp::of(&m))
                    .map_err(io_err(&s.path))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let report = reader::verify(path, policy, on_bytes)?;
        if report.compressed {
            return Err(compressed());
        }
        let layout = report.file.clone().unwrap_or(bf.clone());
        if layout.parts != bf.parts {
            return Err(ServeError::Changed {
                path: path.to_path_buf(),
                what: "its parts changed".into(),
            });
        }
        let mut parts = Vec::new();
        let mut start = 0;
        for (seg, then) in layout.parts.iter().zip(&before) {
            let file = File::open(&seg.path).map_err(io_err(&seg.path))?;
            let stamp = Stamp::of(&file.metadata().map_err(io_err(&seg.path))?);
            if let Some(what) = stamp.differs(then, true) {
                return Err(ServeError::Changed {
                    path: seg.path.clone(),
                    what,
                });
            }
            parts.push(Part {
                path: seg.path.clone(),
                file,
                start,
                len: seg.len,
                file_offset: seg.offset,
                stamp,
            });
            start += seg.len;
        }
        Self::index(path, report, parts)
    }

    /// Index a verified report: repositories, tags, manifests and blobs.
    fn index(path: &Path, report: VerifyReport, parts: Vec<Part>) -> Result<Served, ServeError> {
        let content = |reason: String| ServeError::Content {
            path: path.to_path_buf(),
            reason,
        };
        let manifest = report
            .manifest
            .as_ref()
            .ok_or_else(|| content("no bundle manifest".into()))?;
        incremental(path, manifest)?;
        let mut tops: Vec<(String, String, Digest, String)> = Vec::new();
        let split_ref = |r: &str| -> Result<(String, String), ServeError> {
            match r.rsplit_once(':') {
                Some((repo, tag)) if !repo.is_empty() && !tag.is_empty() && !tag.contains('/') => {
                    Ok((repo.to_string(), tag.to_string()))
                }
                _ => Err(content(format!("ref name {r:?} is not REPOSITORY:TAG"))),
            }
        };
        for img in &manifest.images {
            let (repo, tag) = split_ref(&img.ref_name)?;
            tops.push((repo, tag, img.digest.clone(), img.media_type.clone()));
        }
        let oci = &manifest.chart.oci;
        let (repo, tag) = split_ref(&oci.ref_name)?;
        tops.push((repo, tag, oci.digest.clone(), oci.media_type.clone()));

        let mut manifest_types: HashMap<Digest, String> = HashMap::new();
        for (_, _, d, mt) in &tops {
            manifest_types
                .entry(d.clone())
                .or_insert_with(|| mt.clone());
        }
        let mut repos: BTreeMap<String, Repository> = BTreeMap::new();
        for (name, tag, digest, mt) in &tops {
            let repo = repos.entry(name.clone()).or_default();
            repo.tags.insert(tag.clone(), digest.clone());
            let mut stack = vec![(digest.clone(), mt.clone(), true)];
            while let Some((d, mt, top)) = stack.pop() {
                if repo.manifests.contains(&d) {
                    continue;
                }
                let parsed = report
                    .small_blobs
                    .get(&d)
                    .and_then(|b| Manifest::parse(b, Some(&mt)).ok());
                let Some(parsed) = parsed else {
                    if top {
                        return Err(content(format!(
                            "{name}:{tag} ({d}) is not a readable manifest"
                        )));
                    }
                    // An index entry that is not a manifest document: a plain blob.
                    repo.blobs.insert(d);
                    continue;
                };
                repo.manifests.insert(d.clone());
                repo.blobs.insert(d.clone());
                manifest_types.entry(d.clone()).or_insert_with(|| {
                    if mt.is_empty() {
                        parsed.media_type().to_string()
                    } else {
                        mt.clone()
                    }
                });
                match parsed {
                    Manifest::Index { manifests, .. } => {
                        for c in manifests {
                            stack.push((c.digest, c.media_type, false));
                        }
                    }
                    m @ Manifest::Image { .. } => {
                        for b in m.blobs() {
                            repo.blobs.insert(b.digest.clone());
                        }
                    }
                }
            }
        }
        let mut blobs = HashMap::new();
        for repo in repos.values() {
            for d in &repo.blobs {
                if blobs.contains_key(d) {
                    continue;
                }
                let blob = if let Some(b) = report.small_blobs.get(d) {
                    Blob {
                        size: b.len() as u64,
                        source: Source::Memory(Bytes::from(b.clone())),
                    }
                } else if let Some(&(offset, size)) = report.blob_locations.get(d) {
                    Blob {
                        size,
                        source: Source::File(offset),
                    }
                } else {
                    return Err(content(format!("{d} is referenced but not in the bundle")));
                };
                blobs.insert(d.clone(), blob);
            }
        }
        let total: u64 = parts.iter().map(|p| p.len).sum();
        for (d, b) in &blobs {
            if let Source::File(offset) = b.source {
                if offset + b.size > total {
                    return Err(content(format!("{d} lies beyond the end of the bundle")));
                }
            }
        }
        Ok(Served {
            path: path.to_path_buf(),
            report,
            repos,
            manifest_types,
            blobs,
            parts,
        })
    }

    /// The verification report.
    pub fn report(&self) -> &VerifyReport {
        &self.report
    }

    /// The repositories served, by name.
    pub fn repositories(&self) -> &BTreeMap<String, Repository> {
        &self.repos
    }

    /// The bundle (as named by the user).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where bytes `offset..offset+len` of the bundle stream are: (part index, file offset, len).
    fn segments(&self, mut offset: u64, mut len: u64) -> Vec<(usize, u64, u64)> {
        let mut out = Vec::new();
        for (i, p) in self.parts.iter().enumerate() {
            if len == 0 {
                break;
            }
            if offset >= p.start + p.len {
                continue;
            }
            let within = offset - p.start;
            let take = (p.len - within).min(len);
            out.push((i, p.file_offset + within, take));
            offset += take;
            len -= take;
        }
        out
    }

    /// Check that the files behind these segments did not change since verification.
    fn check_unchanged(&self, segs: &[(usize, u64, u64)]) -> Result<(), ServeError> {
        for &(i, _, _) in segs {
            let p = &self.parts[i];
            let now = Stamp::of(&p.file.metadata().map_err(io_err(&p.path))?);
            if let Some(what) = now.differs(&p.stamp, false) {
                return Err(ServeError::Changed {
                    path: p.path.clone(),
                    what,
                });
            }
        }
        Ok(())
    }

    /// Read `buf.len()` bytes of part `i` at file offset `off`.
    fn read_at(&self, i: usize, buf: &mut [u8], off: u64) -> io::Result<()> {
        let f = &self.parts[i].file;
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileExt as _;
            f.read_exact_at(buf, off)
        }
        #[cfg(windows)]
        {
            use std::os::windows::fs::FileExt as _;
            let mut done = 0;
            while done < buf.len() {
                match f.seek_read(&mut buf[done..], off + done as u64)? {
                    0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                    n => done += n,
                }
            }
            Ok(())
        }
    }
}

// ------------------------------------------------------------------------------------------
// Basic auth.

/// Users and bcrypt hashes from an htpasswd file (`htpasswd -B` entries).
pub struct Htpasswd {
    users: BTreeMap<String, String>,
    /// Hashes of `Authorization` values already accepted (bcrypt is slow by design).
    accepted: Mutex<HashSet<[u8; 32]>>,
}

impl std::fmt::Debug for Htpasswd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Htpasswd")
            .field("users", &self.users.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Htpasswd {
    /// Read an htpasswd file. Only bcrypt entries (`$2y$`, `$2a$`, `$2b$`) are accepted; any
    /// other kind (MD5 `$apr1$`, `{SHA}`, crypt, plain) is an error naming the line.
    pub fn load(path: &Path) -> Result<Htpasswd, ServeError> {
        let text = std::fs::read_to_string(path).map_err(io_err(path))?;
        Self::parse(&text).map_err(|reason| ServeError::Htpasswd {
            path: path.to_path_buf(),
            reason,
        })
    }

    /// Parse htpasswd text (see [`Htpasswd::load`]).
    pub fn parse(text: &str) -> Result<Htpasswd, String> {
        let mut users = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((user, hash)) = line.split_once(':') else {
                return Err(format!("line {}: not USER:HASH", n + 1));
            };
            if user.is_empty() {
                return Err(format!("line {}: empty user name", n + 1));
            }
            let kind = if hash.starts_with("$apr1$") {
                Some("MD5 ($apr1$)")
            } else if hash.starts_with("{SHA}") {
                Some("SHA-1 ({SHA})")
            } else if hash.starts_with("$5$") || hash.starts_with("$6$") {
                Some("SHA-crypt")
            } else {
                None
            };
            let bcrypt = ["$2y$", "$2a$", "$2b$"].iter().any(|p| hash.starts_with(p))
                && hash.parse::<bcrypt::HashParts>().is_ok();
            if !bcrypt {
                return Err(format!(
                    "line {} (user {user}): {} entry; only bcrypt is supported: re-create it with htpasswd -B",
                    n + 1,
                    kind.unwrap_or("not a bcrypt")
                ));
            }
            users.entry(user.to_string()).or_insert(hash.to_string());
        }
        if users.is_empty() {
            return Err("no users".into());
        }
        Ok(Htpasswd {
            users,
            accepted: Mutex::new(HashSet::new()),
        })
    }

    /// The user names.
    pub fn users(&self) -> impl Iterator<Item = &str> {
        self.users.keys().map(String::as_str)
    }

    /// Check an `Authorization` header value (blocking: bcrypt).
    fn check(&self, authorization: &[u8]) -> bool {
        use base64::Engine as _;
        let key: [u8; 32] = sha2::Sha256::digest(authorization).into();
        if self.accepted.lock().is_ok_and(|s| s.contains(&key)) {
            return true;
        }
        // The scheme is case-insensitive (RFC 9110 11.1): `Basic`, `basic`, `BASIC`.
        let authorization = authorization.trim_ascii_start();
        let Some(b64) = authorization
            .get(..6)
            .filter(|scheme| scheme.eq_ignore_ascii_case(b"basic "))
            .map(|_| &authorization[6..])
        else {
            return false;
        };
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(b64.trim_ascii()) else {
            return false;
        };
        let Ok(decoded) = String::from_utf8(decoded) else {
            return false;
        };
        let Some((user, password)) = decoded.split_once(':') else {
            return false;
        };
        let ok = match self.users.get(user) {
            Some(hash) => bcrypt::verify(password, hash).unwrap_or(false),
            None => {
                // Same work for an unknown user, so timing does not tell users apart.
                if let Some(any) = self.users.values().next() {
                    let _ = bcrypt::verify(password, any);
                }
                false
            }
        };
        if ok {
            if let Ok(mut s) = self.accepted.lock() {
                if s.len() >= 1024 {
                    s.clear();
                }
                s.insert(key);
            }
        }
        ok
    }
}

// ------------------------------------------------------------------------------------------
// TLS.

/// A TLS server configuration from PEM files: the certificate chain (leaf first) and its
/// private key. HTTP/1.1 is announced through ALPN.
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, ServeError> {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| ServeError::Tls(format!("certificate {}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(ServeError::Tls(format!(
            "{} holds no PEM certificate",
            cert.display()
        )));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        ServeError::Tls(format!(
            "private key {}: {e} (expected an unencrypted PEM key: PKCS#8, RSA or EC)",
            key.display()
        ))
    })?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServeError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| ServeError::Tls(format!("{} with {}: {e}", cert.display(), key.display())))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
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

struct State {
    served: Served,
    htpasswd: Option<Htpasswd>,
    events: EventSink,
    /// Blobs that failed their digest check while streaming: refused from then on.
    tainted: Mutex<HashSet<Digest>>,
    /// The sha256 of each [`CHUNK`] of a blob, taken (with a whole-blob digest check) at its
    /// first range request: ranges are checked against them chunk by chunk.
    chunk_digests: Mutex<HashMap<Digest, Arc<tokio::sync::OnceCell<ChunkDigests>>>>,
}

/// The digest of every chunk of a blob, or why they could not be taken.
type ChunkDigests = Result<Arc<Vec<[u8; 32]>>, String>;

/// Serve `served` on `listener` until `shutdown` resolves; then stop accepting, let open
/// requests finish for up to `options.grace`, and return.
pub async fn serve(
    listener: Listener,
    served: Served,
    options: Options,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let state = Arc::new(State {
        served,
        htpasswd: options.htpasswd,
        events: options.events,
        tainted: Mutex::new(HashSet::new()),
        chunk_digests: Mutex::new(HashMap::new()),
    });
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

async fn serve_connection<I>(
    io: I,
    remote: SocketAddr,
    state: Arc<State>,
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
        async move { Ok::<_, std::convert::Infallible>(respond(state, req, remote, conn).await) }
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

async fn respond(
    state: Arc<State>,
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

async fn handle(state: &Arc<State>, req: &Request<Incoming>) -> Response<Body> {
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
    let served = &state.served;
    let query = req.uri().query().unwrap_or("");
    match route(req.uri().path()) {
        Route::Base => json_response(StatusCode::OK, &serde_json::json!({})),
        Route::Catalog => {
            let names: Vec<&str> = served.repos.keys().map(String::as_str).collect();
            let (page, next) = paginate(&names, query);
            let mut r = json_response(StatusCode::OK, &serde_json::json!({ "repositories": page }));
            if let Some(link) = next.map(|(last, n)| link("/v2/_catalog", last, n)) {
                r.headers_mut().insert(header::LINK, link);
            }
            r
        }
        Route::Tags(name) => match served.repos.get(name) {
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
        Route::Manifest(name, r) => manifest(served, name, r),
        Route::Blob(name, r) => blob(state, name, r, req),
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

fn manifest(served: &Served, name: &str, r: &str) -> Response<Body> {
    let Some(repo) = served.repos.get(name) else {
        return manifest_unknown(r);
    };
    let digest = match reference(r) {
        Reference::Tag => repo.tags.get(r).cloned(),
        Reference::Digest(d) => repo.manifests.contains(&d).then_some(d),
        Reference::Invalid => return digest_invalid(),
        Reference::OtherAlgorithm => None,
    };
    let Some(digest) = digest else {
        return manifest_unknown(r);
    };
    let (
        Some(media_type),
        Some(Blob {
            source: Source::Memory(bytes),
            ..
        }),
    ) = (
        served.manifest_types.get(&digest),
        served.blobs.get(&digest),
    )
    else {
        return manifest_unknown(r);
    };
    let mut resp = Response::new(Body::full(bytes.clone()));
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(media_type) {
        h.insert(header::CONTENT_TYPE, v);
    }
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    digest_headers(h, &digest);
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

fn blob(state: &Arc<State>, name: &str, r: &str, req: &Request<Incoming>) -> Response<Body> {
    let headers = req.headers();
    let served = &state.served;
    let digest = match reference(r) {
        Reference::Digest(d) => d,
        Reference::Tag | Reference::Invalid => return digest_invalid(),
        Reference::OtherAlgorithm => return blob_unknown(r),
    };
    let Some(blob) = served
        .repos
        .get(name)
        .filter(|repo| repo.blobs.contains(&digest))
        .and_then(|_| served.blobs.get(&digest))
    else {
        return blob_unknown(r);
    };
    if state.tainted.lock().is_ok_and(|t| t.contains(&digest)) {
        return internal(
            "this blob no longer matches its digest on disk: the bundle changed after verification",
        );
    }
    let size = blob.size;
    let range = parse_range(
        headers.get(header::RANGE).and_then(|v| v.to_str().ok()),
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
    let body = match &blob.source {
        _ if req.method() == Method::HEAD => Body::empty(),
        Source::Memory(b) => Body::full(b.slice(start as usize..(start + len) as usize)),
        Source::File(offset) => {
            let segs = served.segments(offset + start, len);
            if let Err(e) = served.check_unchanged(&segs) {
                (state.events)(Event::Warning(format!(
                    "{e}; refusing to serve {digest} (restart serve to verify the bundle again)"
                )));
                return internal("the bundle changed on disk after verification");
            }
            let check = match range {
                RangeReq::Whole => Check::Whole,
                _ => Check::Chunks,
            };
            stream(
                state.clone(),
                digest.clone(),
                Extent {
                    offset: *offset,
                    size,
                },
                start,
                len,
                check,
            )
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

/// Where a blob lies in the bundle stream.
#[derive(Debug, Clone, Copy)]
struct Extent {
    offset: u64,
    size: u64,
}

/// How the bytes of a streamed blob are checked against what was verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// The whole blob is hashed as it streams; its last chunk is held back until the digest
    /// matched.
    Whole,
    /// Each chunk a range touches is read whole and checked against the chunk digests taken at
    /// the blob's first range request (themselves checked against the blob's digest).
    Chunks,
}

/// Read bytes `pos..pos+n` of a blob.
fn read_blob(state: &State, blob: Extent, pos: u64, n: u64) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; n as usize];
    let mut done = 0usize;
    for (part, off, len) in state.served.segments(blob.offset + pos, n) {
        state
            .served
            .read_at(part, &mut buf[done..done + len as usize], off)?;
        done += len as usize;
    }
    if done as u64 != n {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(buf)
}

/// Mark a blob as changed on disk (refused from now on) and tell the operator.
fn taint(state: &State, digest: &Digest, what: &str) {
    if let Ok(mut t) = state.tainted.lock() {
        t.insert(digest.clone());
    }
    (state.events)(Event::Warning(format!(
        "blob {digest} {what}: the bundle changed after verification; the transfer was broken off and the blob is refused from now on (restart serve to verify the bundle again)"
    )));
}

/// The chunk digests of a blob, taken once (one read of the whole blob, whose digest must be
/// the verified one).
async fn chunk_digests(state: &Arc<State>, digest: &Digest, blob: Extent) -> ChunkDigests {
    let cell = {
        let Ok(mut m) = state.chunk_digests.lock() else {
            return Err("internal lock poisoned".into());
        };
        m.entry(digest.clone()).or_default().clone()
    };
    cell.get_or_init(|| async {
        let st = state.clone();
        let d = digest.clone();
        let taken = tokio::task::spawn_blocking(move || {
            let mut whole = sha2::Sha256::new();
            let mut chunks = Vec::new();
            let mut pos = 0;
            while pos < blob.size {
                let n = (blob.size - pos).min(CHUNK);
                let buf = read_blob(&st, blob, pos, n).map_err(|e| e.to_string())?;
                whole.update(&buf);
                chunks.push(sha2::Sha256::digest(&buf).into());
                pos += n;
            }
            let actual = Digest::from_hasher(whole);
            if actual != d {
                taint(&st, &d, &format!("read back as {actual}"));
                return Err(format!("read back as {actual}"));
            }
            Ok(Arc::new(chunks))
        })
        .await;
        taken.unwrap_or_else(|e| Err(e.to_string()))
    })
    .await
    .clone()
}

/// Stream bytes `start..start+len` of a blob, reading ahead of the network, checked as `check`
/// says. A mismatch breaks the transfer off (the client never receives a complete, wrong
/// answer) and refuses the blob from then on.
fn stream(
    state: Arc<State>,
    digest: Digest,
    blob: Extent,
    start: u64,
    len: u64,
    check: Check,
) -> Body {
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(READ_AHEAD);
    tokio::spawn(async move {
        let broken = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
        let chunks = match check {
            Check::Whole => None,
            Check::Chunks => match chunk_digests(&state, &digest, blob).await {
                Ok(c) => Some(c),
                Err(e) => {
                    let _ = tx.send(Err(broken(&e))).await;
                    return;
                }
            },
        };
        let mut hasher = (check == Check::Whole).then(sha2::Sha256::new);
        let mut held: Option<Bytes> = None;
        // Whole: the requested bytes in CHUNK steps. Chunks: every chunk the range touches.
        let (first, end) = match check {
            Check::Whole => (start, start + len),
            Check::Chunks => ((start / CHUNK) * CHUNK, start + len),
        };
        let mut pos = first;
        while pos < end {
            let n = match check {
                Check::Whole => (end - pos).min(CHUNK),
                Check::Chunks => (blob.size - pos).min(CHUNK),
            };
            let st = state.clone();
            let h = hasher.take();
            let read = tokio::task::spawn_blocking(move || {
                let r = read_blob(&st, blob, pos, n);
                let h = h.map(|mut h| {
                    if let Ok(b) = &r {
                        h.update(b);
                    }
                    h
                });
                (r, h)
            })
            .await;
            let (chunk, h) = match read {
                Ok(x) => x,
                Err(e) => (Err(io::Error::other(e.to_string())), None),
            };
            hasher = h;
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    (state.events)(Event::Warning(format!(
                        "reading blob {digest} from {}: {e}",
                        state.served.path.display()
                    )));
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            let out = match &chunks {
                None => held.replace(Bytes::from(chunk)),
                Some(c) => {
                    let i = (pos / CHUNK) as usize;
                    let actual: [u8; 32] = sha2::Sha256::digest(&chunk).into();
                    if c.get(i) != Some(&actual) {
                        taint(
                            &state,
                            &digest,
                            &format!("changed in bytes {pos}..{}", pos + n),
                        );
                        let _ = tx.send(Err(broken("blob does not match its digest"))).await;
                        return;
                    }
                    // The part of this chunk the range asked for.
                    let from = start.saturating_sub(pos) as usize;
                    let to = ((start + len).min(pos + n) - pos) as usize;
                    Some(Bytes::from(chunk).slice(from..to))
                }
            };
            pos += n;
            if let Some(c) = out {
                if tx.send(Ok(c)).await.is_err() {
                    return; // The client went away.
                }
            }
        }
        if let Some(h) = hasher {
            let actual = Digest::from_hasher(h);
            if actual != digest {
                taint(&state, &digest, &format!("read back as {actual}"));
                let _ = tx.send(Err(broken("blob does not match its digest"))).await;
                return;
            }
        }
        if let Some(c) = held {
            let _ = tx.send(Ok(c)).await;
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
            "last" => last = Some(percent_decode(v)),
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
        percent_encode(&last)
    );
    HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static(""))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.bytes() {
        if c.is_ascii_alphanumeric() || b"-._~".contains(&c) {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

/// The set of (repository, tag) pairs served, for printing.
pub fn tags(served: &Served) -> BTreeSet<(String, String)> {
    served
        .repos
        .iter()
        .flat_map(|(r, repo)| repo.tags.keys().map(move |t| (r.clone(), t.clone())))
        .collect()
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
        assert_eq!(percent_decode("a%2Fb%zz%"), "a/b%zz%");
    }

    #[test]
    fn htpasswd_accepts_bcrypt_only() {
        let hash = bcrypt::hash_with_result("pw", 4)
            .unwrap()
            .format_for_version(bcrypt::Version::TwoY);
        let h = Htpasswd::parse(&format!("# comment\n\nkoord:{hash}\n")).unwrap();
        assert_eq!(h.users().collect::<Vec<_>>(), ["koord"]);
        use base64::Engine as _;
        let basic = |u: &str, p: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        };
        assert!(h.check(basic("koord", "pw").as_bytes()));
        assert!(h.check(basic("koord", "pw").as_bytes()), "cached");
        assert!(!h.check(basic("koord", "nope").as_bytes()));
        assert!(!h.check(basic("other", "pw").as_bytes()));
        assert!(!h.check(b"Bearer x"));
        assert!(!h.check(b"Basic !!!"));
        // The scheme is case-insensitive.
        for scheme in ["BASIC", "basic", "bAsIc"] {
            let v = basic("koord", "pw").replacen("Basic", scheme, 1);
            assert!(h.check(v.as_bytes()), "{v}");
        }
        for (line, needle) in [
            ("u:$apr1$abc$def", "MD5"),
            ("u:{SHA}abcdef=", "SHA-1"),
            ("u:plain", "not a bcrypt"),
            ("u:$2y$05$short", "not a bcrypt"),
            ("nocolon", "USER:HASH"),
        ] {
            let e = Htpasswd::parse(line).unwrap_err();
            assert!(e.contains(needle) && e.contains("line 1"), "{line}: {e}");
            if line.contains(':') {
                assert!(e.contains("htpasswd -B"), "{e}");
            }
        }
        assert!(Htpasswd::parse("\n# only\n").is_err());
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
