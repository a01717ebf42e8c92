//! What every store speaks: a narrow content interface in the manner of go-containerregistry's
//! `v1.Image` / `remote` / `layout`. Raw manifest bytes are the truth (a digest is always that of
//! the bytes), blobs are streams, and a store is a [`Source`], a [`Sink`], or both.
//!
//! Names: a store holds repositories (`koordinator-sh/koordlet`; for a store spanning several
//! registries the host is the first component, `ghcr.io/koordinator-sh/koordlet`) whose tags and
//! digests ([`Reference`]) name manifests. Content-addressed stores (the blob cache, the bundle)
//! hold every blob once, whatever the repository.

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use koord_base::oci::{Descriptor, Digest};
use std::fmt;
use std::future::Future;

/// A tag or a digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reference {
    /// `v1.8.0`.
    Tag(String),
    /// `sha256:...`.
    Digest(Digest),
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reference::Tag(t) => f.write_str(t),
            Reference::Digest(d) => f.write_str(d.as_str()),
        }
    }
}

impl Reference {
    /// `repo:tag` or `repo@digest`.
    pub fn qualify(&self, repo: &str) -> String {
        match self {
            Reference::Tag(t) => format!("{repo}:{t}"),
            Reference::Digest(d) => format!("{repo}@{d}"),
        }
    }
}

/// A manifest as a store holds it: its exact bytes, their digest, and its media type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawManifest {
    /// The bytes (never re-serialised).
    pub bytes: Bytes,
    /// sha256 of `bytes`.
    pub digest: Digest,
    /// Media type (as served or recorded; else the document's own).
    pub media_type: String,
}

impl RawManifest {
    /// Wrap bytes, computing their digest.
    pub fn new(bytes: impl Into<Bytes>, media_type: impl Into<String>) -> RawManifest {
        let bytes = bytes.into();
        RawManifest {
            digest: Digest::of(&bytes),
            bytes,
            media_type: media_type.into(),
        }
    }

    /// Its descriptor.
    pub fn descriptor(&self) -> Descriptor {
        Descriptor {
            media_type: self.media_type.clone(),
            digest: self.digest.clone(),
            size: self.bytes.len() as u64,
            platform: None,
            annotations: None,
        }
    }
}

/// A blob's bytes, in order, from some offset.
pub type BlobStream = BoxStream<'static, Result<Bytes, StoreError>>;

/// Told of blob bytes as they are taken (a progress bar).
pub type OnBytes = std::sync::Arc<dyn Fn(u64) + Send + Sync>;

/// Opens a blob's bytes from an offset: the source side of one transfer, handed to
/// [`Sink::put_blob`], which may open it again to retry (a registry upload restarts with a new
/// session).
pub trait Opener: Send + Sync {
    /// The blob's bytes from `offset` to its end.
    fn open(&self, offset: u64) -> BoxFuture<'_, Result<BlobStream, StoreError>>;
}

/// How much of a blob a sink holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Have {
    /// None of it.
    Nothing,
    /// Its first N bytes (a download that was interrupted): resume there.
    Partial(u64),
    /// All of it, checked.
    Complete,
}

/// A failure of a store. Messages name the store and the content.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The manifest, tag or blob is not there.
    #[error("{what} not found in {store}")]
    NotFound {
        /// The store.
        store: String,
        /// What was asked for.
        what: String,
    },
    /// Content that does not match its descriptor.
    #[error("{store}: {what} has digest {actual} ({size} bytes), expected {expected}: refused")]
    DigestMismatch {
        /// The store.
        store: String,
        /// What.
        what: String,
        /// The descriptor's digest.
        expected: Digest,
        /// What arrived.
        actual: Digest,
        /// Bytes that arrived.
        size: u64,
    },
    /// More or fewer bytes than the descriptor says.
    #[error("{store}: {what} should be {expected} bytes but {actual} arrived: refused")]
    SizeMismatch {
        /// The store.
        store: String,
        /// What.
        what: String,
        /// The descriptor's size.
        expected: u64,
        /// Bytes that arrived (so far).
        actual: u64,
    },
    /// A store's own failure (a registry's answer, the blob cache's disk): the engine asks it
    /// only what [`StoreFailure`] tells, its exit class included.
    #[error(transparent)]
    Failed(Failure),
    /// Any other failure of a store (a bundle, a file).
    #[error("{store}: {source}")]
    Other {
        /// The store.
        store: String,
        /// The failure.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl koord_base::exit::Classify for StoreError {
    fn exit_class(&self) -> Option<koord_base::exit::ExitClass> {
        use koord_base::exit::ExitClass as C;
        match self {
            // A store's own failure (a registry, the cache): it says its class.
            StoreError::Failed(f) => f.exit_class(),
            // A bundle or file store: its cause decides.
            StoreError::Other { .. } => None,
            // Not there, or content that does not match what names it: what the source holds.
            StoreError::NotFound { .. }
            | StoreError::DigestMismatch { .. }
            | StoreError::SizeMismatch { .. } => Some(C::Input),
        }
    }
}

impl StoreError {
    /// "That is not there" (another source may have it; a sink must get it).
    pub fn is_not_found(&self) -> bool {
        match self {
            StoreError::NotFound { .. } => true,
            StoreError::Failed(f) => f.0.is_not_found(),
            _ => false,
        }
    }

    /// Worth another try later (the network, the far side's load): another source may answer
    /// now, the same one on the next run.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Failed(f) if f.0.is_transient())
    }

    /// The store's own failure underneath, if that is what it is.
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            StoreError::Failed(f) => Some(f),
            _ => None,
        }
    }

    /// What [`koord_base::oci::BlobCheck`] found wrong with `what` arriving at `store`.
    pub fn mismatch(
        store: impl Into<String>,
        what: impl Into<String>,
        m: koord_base::oci::BlobMismatch,
    ) -> StoreError {
        let (store, what) = (store.into(), what.into());
        match m {
            koord_base::oci::BlobMismatch::Size { expected, actual } => StoreError::SizeMismatch {
                store,
                what,
                expected,
                actual,
            },
            koord_base::oci::BlobMismatch::Digest {
                expected,
                actual,
                size,
            } => StoreError::DigestMismatch {
                store,
                what,
                expected,
                actual,
                size,
            },
        }
    }

    /// Wrap any error of a store.
    pub fn other(
        store: impl Into<String>,
        e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> StoreError {
        StoreError::Other {
            store: store.into(),
            source: e.into(),
        }
    }
}

/// What a store's own error tells the engine, whatever the store: the copy engine and the
/// source fallback need no more than this, so [`StoreError`] names no concrete store. A store
/// gives its error type this trait and `From<ItsError> for StoreError`.
///
/// It says its exit class too ([`koord_base::exit::Classify`]), which [`StoreError::Failed`]
/// forwards.
pub trait StoreFailure: koord_base::exit::Classify + Send + Sync + 'static {
    /// The content is not there (another source may have it).
    fn is_not_found(&self) -> bool {
        false
    }
    /// Worth another try later (the network, the far side's load).
    fn is_transient(&self) -> bool {
        false
    }
    /// Itself as a plain error, to be downcast to the concrete type (by `cmd`, for exit codes).
    fn as_error(&self) -> &(dyn std::error::Error + 'static);
}

/// A store's own failure, boxed (see [`StoreFailure`]). Its message is the failure's own.
#[derive(Debug)]
pub struct Failure(Box<dyn StoreFailure>);

impl koord_base::exit::Classify for Failure {
    fn exit_class(&self) -> Option<koord_base::exit::ExitClass> {
        self.0.exit_class()
    }
}

impl Failure {
    /// Box a store's failure.
    pub fn new(e: impl StoreFailure) -> Self {
        Failure(Box::new(e))
    }
    /// The concrete failure, if it is a `T`.
    pub fn downcast_ref<T: std::error::Error + 'static>(&self) -> Option<&T> {
        self.0.as_error().downcast_ref()
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Any store.
pub trait Store: Send + Sync {
    /// What it is, for messages (`registry ghcr.io`, `bundle koordinator-1.8.0.tar`).
    fn describe(&self) -> String;
}

/// Where content comes from.
pub trait Source: Store {
    /// The manifest `repo` names by `reference`: its exact bytes. A digest reference is checked
    /// against the bytes by the store.
    fn manifest(
        &self,
        repo: &str,
        reference: &Reference,
    ) -> impl Future<Output = Result<RawManifest, StoreError>> + Send;

    /// A blob's bytes from `offset` on. The stream ends after the blob's last byte; its
    /// content is checked by whoever consumes it (a [`Sink`] refuses what does not match).
    fn blob(
        &self,
        repo: &str,
        desc: &Descriptor,
        offset: u64,
    ) -> impl Future<Output = Result<BlobStream, StoreError>> + Send;

    /// The OCI 1.1 referrers list of the manifest `subject` in `repo` (a registry's `GET
    /// /v2/<repo>/referrers/<digest>`): its bytes, not parsed; `None` when the source serves no
    /// referrers API (a registry's 404, or a store that has none), and the reader falls back to
    /// the referrers tag schema. No default: each store says which it is.
    fn referrers(
        &self,
        repo: &str,
        subject: &Digest,
    ) -> impl Future<Output = Result<Option<Bytes>, StoreError>> + Send;
}

/// A source that can list what it holds: what `serve` answers its catalog and tags from.
pub trait Catalog: Source {
    /// Repository → its tags.
    fn catalog(&self) -> std::collections::BTreeMap<String, Vec<String>>;
}

/// Where content goes.
pub trait Sink: Store {
    /// How much of the blob `repo` already holds.
    fn blob_state(
        &self,
        repo: &str,
        desc: &Descriptor,
    ) -> impl Future<Output = Result<Have, StoreError>> + Send;

    /// Take a blob whose bytes from `offset` (what [`Sink::blob_state`] said the sink holds)
    /// `data` opens. The sink refuses content whose size or digest differs from `desc`
    /// (nothing of it is then kept); it may open `data` again to retry by its transport's
    /// policy. `on_bytes` is told of the bytes taken.
    fn put_blob(
        &self,
        repo: &str,
        desc: &Descriptor,
        offset: u64,
        data: &dyn Opener,
        on_bytes: &OnBytes,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Make a blob that `from_repo` of this sink holds available in `repo` without its bytes
    /// (a registry's cross-repository mount). `Ok(false)` when the sink cannot or did not:
    /// the caller then uploads it. A mount is an optimisation, never a reason to fail.
    fn mount_blob(
        &self,
        repo: &str,
        from_repo: &str,
        desc: &Descriptor,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let _ = (repo, from_repo, desc);
        async { Ok(false) }
    }

    /// Does `repo` hold the manifest `digest` under `reference` (a tag must point at it)?
    fn has_manifest(
        &self,
        repo: &str,
        reference: &Reference,
        digest: &Digest,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Put a manifest's exact bytes under `reference` (a tag, or its own digest). Everything
    /// it references is already in the sink.
    fn put_manifest(
        &self,
        repo: &str,
        reference: &Reference,
        manifest: &RawManifest,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}
