//! The registry store: the only module that talks to oci-client. Manifests are copied as raw
//! bytes (digests come from the bytes), blobs stream into the cache with resume, and every call
//! goes through one retry policy.

use super::auth::Credentials;
use super::cache::{BlobCache, CacheError};
use super::error_chain as chain;
use super::retry::RetryPolicy;
use crate::oci::{media, Digest, ImageRef};
use futures_util::StreamExt;
use oci_client::client::{
    BlobResponse, Certificate, CertificateEncoding, ClientConfig, ClientProtocol,
};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use std::future::Future;
use std::path::PathBuf;

/// Largest manifest accepted (distribution's own limit is 4 MiB).
pub const MAX_MANIFEST: usize = 4 * 1024 * 1024;

/// How to reach registries.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// Hosts spoken to over plain HTTP.
    pub plain_http_hosts: Vec<String>,
    /// Extra CA certificates (PEM) to trust besides the system roots.
    pub ca_files: Vec<PathBuf>,
    /// Skip TLS verification (only with its flag, and a warning).
    pub insecure_skip_tls_verify: bool,
    /// Logins by host.
    pub credentials: Credentials,
    /// Retry policy.
    pub retry: RetryPolicy,
}

/// A failure talking to a registry. Messages name the reference, digest or registry.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The manifest or blob is not there.
    #[error("{what} not found on {registry}")]
    NotFound {
        /// Reference or digest.
        what: String,
        /// Registry host.
        registry: String,
    },
    /// Authentication failed or is required.
    #[error("{registry} refused the credentials for {what} (401/403): log in with `docker login {registry}` (koord-bundle reads $REGISTRY_AUTH_FILE, $DOCKER_CONFIG/config.json and ~/.docker/config.json) or check the user's rights")]
    Unauthorized {
        /// Registry host.
        registry: String,
        /// What was asked for.
        what: String,
    },
    /// Transport failure (connection, TLS, reset) after all retries.
    #[error("cannot reach {registry} for {what}: {message}{hint}")]
    Transport {
        /// Registry host.
        registry: String,
        /// What was asked for.
        what: String,
        /// The error chain.
        message: String,
        /// What to do.
        hint: String,
        /// The registry asked us to slow down (429).
        throttled: bool,
    },
    /// Any other status.
    #[error("{registry} answered {what}: {message}")]
    Status {
        /// Registry host.
        registry: String,
        /// What was asked for.
        what: String,
        /// The answer.
        message: String,
    },
    /// The registry served bytes that do not match the digest asked for.
    #[error("{registry} served {what} with digest {actual}, expected {expected}: refused")]
    DigestMismatch {
        /// Registry host.
        registry: String,
        /// Reference.
        what: String,
        /// Expected digest.
        expected: String,
        /// Actual digest.
        actual: Digest,
    },
    /// The cache refused or failed.
    #[error("{registry}: {source}")]
    Cache {
        /// Registry host.
        registry: String,
        /// The cache error.
        source: CacheError,
    },
    /// TLS handshake failure (unknown CA, wrong host name): not retried.
    #[error("TLS with {registry} failed for {what}: {message} (pass the registry's CA with --ca-file, or --plain-http if {registry} speaks plain HTTP)")]
    Tls {
        /// Registry host.
        registry: String,
        /// What was asked for.
        what: String,
        /// The error chain.
        message: String,
    },
    /// Client set-up failed (bad CA file).
    #[error("registry client setup: {0}")]
    Setup(String),
}

impl RegistryError {
    /// Worth another try?
    pub fn is_transient(&self) -> bool {
        matches!(self, RegistryError::Transport { .. })
    }
    /// How long to wait before the next try. A 429 waits at least a second: oci-client does not
    /// hand its `Retry-After` header through, so the policy's own backoff (capped at 10 s) stands
    /// in for it.
    pub fn retry_delay(&self, policy: &RetryPolicy, attempt: u32) -> std::time::Duration {
        let d = policy.backoff(attempt);
        match self {
            RegistryError::Transport {
                throttled: true, ..
            } => d.max(std::time::Duration::from_secs(1)),
            _ => d,
        }
    }
    /// Is this "the thing is not there" (so another source may have it)?
    pub fn is_not_found(&self) -> bool {
        matches!(self, RegistryError::NotFound { .. })
    }
}

/// What a blob fetch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fetched {
    /// Already complete in the cache.
    Cached,
    /// Downloaded (bytes downloaded in this run; less than the size when resumed).
    Downloaded(u64),
}

/// A registry client for any number of registries.
pub struct Registry {
    client: Client,
    opts: RegistryOptions,
}

impl Registry {
    /// Build a client.
    pub fn new(opts: RegistryOptions) -> Result<Self, RegistryError> {
        let mut extra = Vec::new();
        for f in &opts.ca_files {
            let data = std::fs::read(f).map_err(|e| {
                RegistryError::Setup(format!("cannot read CA file {}: {e}", f.display()))
            })?;
            if !String::from_utf8_lossy(&data).contains("-----BEGIN CERTIFICATE-----") {
                return Err(RegistryError::Setup(format!(
                    "CA file {} holds no PEM certificate",
                    f.display()
                )));
            }
            extra.push(Certificate {
                encoding: CertificateEncoding::Pem,
                data,
            });
        }
        let config = ClientConfig {
            protocol: ClientProtocol::HttpsExcept(opts.plain_http_hosts.clone()),
            accept_invalid_certificates: opts.insecure_skip_tls_verify,
            extra_root_certificates: extra,
            platform_resolver: None,
            connect_timeout: Some(std::time::Duration::from_secs(15)),
            read_timeout: Some(std::time::Duration::from_secs(60)),
            use_monolithic_push: true,
            user_agent: concat!("koord-bundle/", env!("CARGO_PKG_VERSION")),
            ..Default::default()
        };
        let client = Client::try_from(config).map_err(|e| RegistryError::Setup(chain(&e)))?;
        Ok(Registry { client, opts })
    }

    fn oref(r: &ImageRef) -> Reference {
        match (&r.digest, &r.tag) {
            (Some(d), _) => {
                Reference::with_digest(r.registry.clone(), r.repository.clone(), d.clone())
            }
            (None, t) => Reference::with_tag(
                r.registry.clone(),
                r.repository.clone(),
                t.clone().unwrap_or_else(|| "latest".into()),
            ),
        }
    }

    fn auth(&self, host: &str) -> RegistryAuth {
        match self.opts.credentials.get(host) {
            Some(l) => RegistryAuth::Basic(l.username.clone(), l.password.expose().to_string()),
            None => RegistryAuth::Anonymous,
        }
    }

    fn classify(&self, r: &ImageRef, what: &str, e: OciDistributionError) -> RegistryError {
        let registry = r.registry.clone();
        let what = what.to_string();
        let status = |code: u16, message: String| match code {
            401 | 403 => RegistryError::Unauthorized {
                registry: registry.clone(),
                what: what.clone(),
            },
            404 => RegistryError::NotFound {
                what: what.clone(),
                registry: registry.clone(),
            },
            408 | 429 | 500..=599 => RegistryError::Transport {
                registry: registry.clone(),
                what: what.clone(),
                message: format!("HTTP {code} {message}"),
                hint: String::new(),
                throttled: code == 429,
            },
            _ => RegistryError::Status {
                registry: registry.clone(),
                what: what.clone(),
                message: format!("HTTP {code} {message}"),
            },
        };
        match e {
            OciDistributionError::ImageManifestNotFoundError(_) => status(404, String::new()),
            OciDistributionError::UnauthorizedError { .. }
            | OciDistributionError::AuthenticationFailure(_) => status(401, String::new()),
            OciDistributionError::ServerError { code, message, .. } => status(code, message),
            OciDistributionError::RegistryError { envelope, .. } => {
                let codes: Vec<_> = envelope.errors.iter().map(|e| &e.code).collect();
                let text = envelope
                    .errors
                    .iter()
                    .map(|e| format!("{:?}: {}", e.code, e.message))
                    .collect::<Vec<_>>()
                    .join("; ");
                if codes.iter().any(|c| {
                    matches!(
                        c,
                        OciErrorCode::ManifestUnknown
                            | OciErrorCode::BlobUnknown
                            | OciErrorCode::NameUnknown
                            | OciErrorCode::NotFound
                    )
                }) {
                    status(404, text)
                } else if codes
                    .iter()
                    .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
                {
                    status(401, text)
                } else if codes
                    .iter()
                    .any(|c| matches!(c, OciErrorCode::Toomanyrequests))
                {
                    status(429, text)
                } else if codes.iter().any(
                    |c| matches!(c, OciErrorCode::Other(o) if o.eq_ignore_ascii_case("UNAVAILABLE")),
                ) {
                    // distribution's `UNAVAILABLE` comes with a 503; oci-client keeps the
                    // code, not the status.
                    status(503, text)
                } else {
                    status(400, text)
                }
            }
            OciDistributionError::RequestError(re) => {
                if let Some(code) = re.status() {
                    return status(code.as_u16(), String::new());
                }
                let message = chain(&re);
                let lower = message.to_lowercase();
                if lower.contains("certificate")
                    || lower.contains("tls")
                    || lower.contains("handshake")
                {
                    return RegistryError::Tls {
                        registry: registry.clone(),
                        what: what.clone(),
                        message,
                    };
                }
                let hint = if lower.contains("connect") {
                    format!(" (is {registry} up and reachable from here?)")
                } else {
                    String::new()
                };
                RegistryError::Transport {
                    registry: registry.clone(),
                    what: what.clone(),
                    message,
                    hint,
                    throttled: false,
                }
            }
            OciDistributionError::IoError(io) => RegistryError::Transport {
                registry: registry.clone(),
                what: what.clone(),
                message: io.to_string(),
                hint: String::new(),
                throttled: false,
            },
            other => RegistryError::Status {
                registry: registry.clone(),
                what: what.clone(),
                message: chain(&other),
            },
        }
    }

    async fn with_retry<T, F, Fut>(&self, mut f: F) -> Result<T, RegistryError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, RegistryError>>,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match f().await {
                Err(e) if e.is_transient() && attempt < self.opts.retry.tries => {
                    tokio::time::sleep(e.retry_delay(&self.opts.retry, attempt)).await;
                }
                other => return other,
            }
        }
    }

    /// Fetch a manifest's raw bytes by tag or digest. The digest is computed from the bytes and,
    /// when the reference names one, checked against it.
    pub async fn get_manifest(
        &self,
        r: &ImageRef,
    ) -> Result<(bytes::Bytes, Digest), RegistryError> {
        let oref = Self::oref(r);
        let auth = self.auth(&r.registry);
        let what = r.to_string();
        let (bytes, _) = self
            .with_retry(|| async {
                self.client
                    .pull_manifest_raw(&oref, &auth, &media::ALL_MANIFESTS)
                    .await
                    .map_err(|e| self.classify(r, &what, e))
            })
            .await?;
        if bytes.len() > MAX_MANIFEST {
            return Err(RegistryError::Status {
                registry: r.registry.clone(),
                what,
                message: format!(
                    "manifest of {} bytes is larger than {MAX_MANIFEST}",
                    bytes.len()
                ),
            });
        }
        let digest = Digest::of(&bytes);
        if let Some(expected) = &r.digest {
            if expected != digest.as_str() {
                return Err(RegistryError::DigestMismatch {
                    registry: r.registry.clone(),
                    what,
                    expected: expected.clone(),
                    actual: digest,
                });
            }
        }
        Ok((bytes, digest))
    }

    /// Stream a blob into the cache, resuming a partial download with a range request where the
    /// registry allows it. Nothing reaches the cache unless size and digest match.
    pub async fn fetch_blob(
        &self,
        r: &ImageRef,
        digest: &Digest,
        size: u64,
        cache: &BlobCache,
        on_bytes: &(dyn Fn(u64) + Sync),
    ) -> Result<Fetched, RegistryError> {
        if cache.has(digest, size) {
            on_bytes(size);
            return Ok(Fetched::Cached);
        }
        let oref = Self::oref(r);
        self.client
            .store_auth_if_needed(oref.resolve_registry(), &self.auth(&r.registry))
            .await;
        let what = format!("blob {digest} of {}", r.repository);
        let cache_err = |source| RegistryError::Cache {
            registry: r.registry.clone(),
            source,
        };
        let mut downloaded = 0u64;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut partial = cache.begin(digest, size).map_err(cache_err)?;
            if partial.offset() > 0 && attempt == 1 {
                on_bytes(partial.offset());
            }
            let result: Result<(), RegistryError> = async {
                if partial.offset() < size {
                    let offset = partial.offset();
                    let resp = self
                        .client
                        // Always a range (0- too): the partial stream is not hashed by oci-client,
                        // so each byte is hashed once, by the cache, as it arrives.
                        .pull_blob_stream_partial(
                            &oref,
                            digest.as_str(),
                            offset,
                            Some(size - offset),
                        )
                        .await
                        .map_err(|e| self.classify(r, &what, e))?;
                    let mut stream = match resp {
                        BlobResponse::Partial(s) => s,
                        BlobResponse::Full(s) => {
                            if offset > 0 {
                                partial.restart().map_err(cache_err)?;
                            }
                            s
                        }
                    };
                    while let Some(item) = stream.next().await {
                        match item {
                            Ok(chunk) => {
                                partial.write(&chunk).map_err(cache_err)?;
                                downloaded += chunk.len() as u64;
                                on_bytes(chunk.len() as u64);
                            }
                            // A verification error at the very end is judged by our own
                            // digest check below; anything earlier is a broken transfer.
                            Err(_) if partial.offset() == size => break,
                            Err(e) => {
                                return Err(RegistryError::Transport {
                                    registry: r.registry.clone(),
                                    what: what.clone(),
                                    message: format!(
                                        "transfer broke after {} of {size} bytes: {e}",
                                        partial.offset()
                                    ),
                                    hint: String::new(),
                                    throttled: false,
                                })
                            }
                        }
                    }
                }
                Ok(())
            }
            .await;
            match result {
                Ok(()) => {
                    if partial.offset() < size {
                        if attempt < self.opts.retry.tries {
                            tokio::time::sleep(self.opts.retry.backoff(attempt)).await;
                            continue;
                        }
                        return Err(RegistryError::Transport {
                            registry: r.registry.clone(),
                            what,
                            message: format!(
                                "stream ended after {} of {size} bytes",
                                partial.offset()
                            ),
                            hint: String::new(),
                            throttled: false,
                        });
                    }
                    partial.commit().map_err(cache_err)?;
                    return Ok(Fetched::Downloaded(downloaded));
                }
                Err(e) if e.is_transient() && attempt < self.opts.retry.tries => {
                    tokio::time::sleep(e.retry_delay(&self.opts.retry, attempt)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Does `repo` on this registry hold the blob? (HEAD)
    pub async fn blob_exists(&self, r: &ImageRef, digest: &Digest) -> Result<bool, RegistryError> {
        let oref = Self::oref(r);
        self.client
            .store_auth_if_needed(oref.resolve_registry(), &self.auth(&r.registry))
            .await;
        let what = format!("blob {digest} in {}", r.repository);
        self.with_retry(|| async {
            self.client
                .blob_exists(&oref, digest.as_str())
                .await
                .map_err(|e| self.classify(r, &what, e))
        })
        .await
    }

    /// Ask the registry to mount a blob from another repository of the same registry. `Ok(false)`
    /// when the registry declines (it then expects an upload).
    pub async fn mount_blob(
        &self,
        r: &ImageRef,
        from_repository: &str,
        digest: &Digest,
    ) -> Result<bool, RegistryError> {
        let oref = Self::oref(r);
        let from = Reference::with_digest(
            r.registry.clone(),
            from_repository.to_string(),
            digest.to_string(),
        );
        self.client
            .store_auth_if_needed(oref.resolve_registry(), &self.auth(&r.registry))
            .await;
        match self.client.mount_blob(&oref, &from, digest.as_str()).await {
            Ok(()) => Ok(true),
            Err(OciDistributionError::SpecViolationError(_)) => Ok(false),
            Err(e) => {
                match self.classify(r, &format!("mount of {digest} from {from_repository}"), e) {
                    e @ RegistryError::Unauthorized { .. } => Err(e),
                    _ => Ok(false),
                }
            }
        }
    }

    /// Upload a blob from file regions (a blob of a split bundle may span two parts), streamed
    /// in 1 MiB chunks in one monolithic PUT. A failed upload is restarted from the beginning
    /// (new session).
    pub async fn push_blob_from_file(
        &self,
        r: &ImageRef,
        digest: &Digest,
        segments: &[crate::bundle::parts::Segment],
        on_bytes: std::sync::Arc<dyn Fn(u64) + Send + Sync>,
    ) -> Result<(), RegistryError> {
        let oref = Self::oref(r);
        self.client
            .store_auth_if_needed(oref.resolve_registry(), &self.auth(&r.registry))
            .await;
        let what = format!("upload of blob {digest} to {}", r.repository);
        let size: u64 = segments.iter().map(|s| s.len).sum();
        self.with_retry(|| async {
            let segs: std::collections::VecDeque<_> = segments.iter().cloned().collect();
            let stream = futures_util::stream::unfold(
                (segs, None::<tokio::fs::File>, 0u64),
                |(mut segs, mut file, mut left)| async move {
                    use tokio::io::{AsyncReadExt, AsyncSeekExt};
                    while left == 0 {
                        let seg = segs.pop_front()?;
                        let opened = async {
                            let mut f = tokio::fs::File::open(&seg.path).await?;
                            f.seek(std::io::SeekFrom::Start(seg.offset)).await?;
                            Ok::<_, std::io::Error>(f)
                        }
                        .await;
                        match opened {
                            Ok(f) => {
                                file = Some(f);
                                left = seg.len;
                            }
                            Err(e) => {
                                return Some((
                                    Err(OciDistributionError::IoError(e)),
                                    (segs, None, 0),
                                ))
                            }
                        }
                    }
                    let n = left.min(1 << 20) as usize;
                    let mut buf = vec![0u8; n];
                    let f = file.as_mut()?;
                    match f.read_exact(&mut buf).await {
                        Ok(_) => Some((Ok(bytes::Bytes::from(buf)), (segs, file, left - n as u64))),
                        Err(e) => Some((
                            Err(OciDistributionError::IoError(e)),
                            (std::collections::VecDeque::new(), None, 0),
                        )),
                    }
                },
            );
            let report = on_bytes.clone();
            let counted = futures_util::StreamExt::inspect(stream, move |item| {
                if let Ok(b) = item {
                    report(b.len() as u64);
                }
            });
            self.client
                .push_blob_stream(&oref, counted, digest.as_str(), Some(size))
                .await
                .map(|_| ())
                .map_err(|e| self.classify(r, &what, e))
        })
        .await
    }

    /// Put a manifest as raw bytes under `r`'s tag or digest, then read it back and check the
    /// digest the registry serves.
    pub async fn put_manifest(
        &self,
        r: &ImageRef,
        bytes: &bytes::Bytes,
        media_type: &str,
    ) -> Result<Digest, RegistryError> {
        let oref = Self::oref(r);
        self.client
            .store_auth_if_needed(oref.resolve_registry(), &self.auth(&r.registry))
            .await;
        let what = format!("manifest {}", r);
        let ct = reqwest::header::HeaderValue::from_str(media_type).map_err(|_| {
            RegistryError::Status {
                registry: r.registry.clone(),
                what: what.clone(),
                message: format!("bad media type {media_type:?}"),
            }
        })?;
        self.with_retry(|| async {
            self.client
                .push_manifest_raw(&oref, bytes.clone(), ct.clone())
                .await
                .map(|_| ())
                .map_err(|e| self.classify(r, &what, e))
        })
        .await?;
        let expected = Digest::of(bytes);
        let (_, got) = self.get_manifest(r).await?;
        if got != expected {
            return Err(RegistryError::DigestMismatch {
                registry: r.registry.clone(),
                what,
                expected: expected.to_string(),
                actual: got,
            });
        }
        Ok(got)
    }
}
