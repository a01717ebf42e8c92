//! A store in memory, both [`Source`] and [`Sink`]: for fast tests of the copy engine and of
//! `serve`, and as the model the other stores follow. It is as strict as a registry where the
//! engine depends on it: a manifest is accepted only when every blob and child manifest it
//! references is in that repository, blobs are checked against their descriptors, and a mount
//! works only from a repository that holds the blob.

use super::content::{
    BlobStream, Catalog, Have, Opener, RawManifest, Reference, Sink, Source, Store, StoreError,
};
use crate::oci::{Descriptor, Digest, Manifest};
use bytes::Bytes;
use futures_util::StreamExt;
use sha2::Digest as _;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

/// Blobs of a memory store are served in pieces of this size (so consumers see streams).
const PIECE: usize = 64 * 1024;

#[derive(Debug, Default)]
struct Repo {
    tags: BTreeMap<String, Digest>,
    /// Manifests and blobs this repository holds.
    content: BTreeSet<Digest>,
}

#[derive(Debug, Default)]
struct Inner {
    blobs: BTreeMap<Digest, Bytes>,
    manifests: BTreeMap<Digest, RawManifest>,
    repos: BTreeMap<String, Repo>,
    /// Calls, for tests: ("put_blob", repo, digest) and the like.
    log: Vec<(String, String, String)>,
}

/// An in-memory store.
#[derive(Debug, Default)]
pub struct MemoryStore {
    name: String,
    inner: Mutex<Inner>,
    /// Whether `mount_blob` works (a registry may not offer mounts).
    pub mounts: bool,
}

impl MemoryStore {
    /// An empty store called `name`.
    pub fn new(name: &str) -> MemoryStore {
        MemoryStore {
            name: name.to_string(),
            inner: Mutex::default(),
            mounts: true,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock is a test failure anyway: keep going.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Add a blob to `repo` (test set-up); returns its descriptor.
    pub fn add_blob(&self, repo: &str, media_type: &str, bytes: impl Into<Bytes>) -> Descriptor {
        let bytes = bytes.into();
        let d = Digest::of(&bytes);
        let mut i = self.lock();
        let desc = Descriptor {
            media_type: media_type.to_string(),
            digest: d.clone(),
            size: bytes.len() as u64,
            platform: None,
            annotations: None,
        };
        i.blobs.insert(d.clone(), bytes);
        i.repos
            .entry(repo.to_string())
            .or_default()
            .content
            .insert(d);
        desc
    }

    /// Add a manifest to `repo`, under `tag` when given (test set-up; not checked).
    pub fn add_manifest(&self, repo: &str, tag: Option<&str>, m: RawManifest) {
        let mut i = self.lock();
        let r = i.repos.entry(repo.to_string()).or_default();
        r.content.insert(m.digest.clone());
        if let Some(t) = tag {
            r.tags.insert(t.to_string(), m.digest.clone());
        }
        i.manifests.insert(m.digest.clone(), m);
    }

    /// Every call to a sink method so far: (method, repo, digest or reference).
    pub fn log(&self) -> Vec<(String, String, String)> {
        self.lock().log.clone()
    }

    /// The digest `repo:tag` points at.
    pub fn tag(&self, repo: &str, tag: &str) -> Option<Digest> {
        self.lock().repos.get(repo)?.tags.get(tag).cloned()
    }

    /// Does `repo` hold this blob or manifest?
    pub fn holds(&self, repo: &str, d: &Digest) -> bool {
        self.lock()
            .repos
            .get(repo)
            .is_some_and(|r| r.content.contains(d))
    }

    /// Remove a blob everywhere (test set-up for missing content).
    pub fn remove_blob(&self, d: &Digest) {
        let mut i = self.lock();
        i.blobs.remove(d);
        for r in i.repos.values_mut() {
            r.content.remove(d);
        }
    }

    /// The repositories and their tags.
    pub fn tags_by_repo(&self) -> BTreeMap<String, Vec<String>> {
        self.lock()
            .repos
            .iter()
            .map(|(n, r)| (n.clone(), r.tags.keys().cloned().collect()))
            .collect()
    }

    fn not_found(&self, what: String) -> StoreError {
        StoreError::NotFound {
            store: self.describe(),
            what,
        }
    }
}

impl Store for MemoryStore {
    fn describe(&self) -> String {
        format!("memory store {}", self.name)
    }
}

impl Source for MemoryStore {
    async fn manifest(&self, repo: &str, reference: &Reference) -> Result<RawManifest, StoreError> {
        let i = self.lock();
        let r = i.repos.get(repo);
        let digest = match reference {
            Reference::Tag(t) => r.and_then(|r| r.tags.get(t)).cloned(),
            Reference::Digest(d) => r.filter(|r| r.content.contains(d)).map(|_| d.clone()),
        };
        digest
            .and_then(|d| i.manifests.get(&d).cloned())
            .ok_or_else(|| self.not_found(format!("manifest {}", reference.qualify(repo))))
    }

    async fn blob(
        &self,
        repo: &str,
        desc: &Descriptor,
        offset: u64,
    ) -> Result<BlobStream, StoreError> {
        let bytes = {
            let i = self.lock();
            let held = i
                .repos
                .get(repo)
                .is_some_and(|r| r.content.contains(&desc.digest));
            i.blobs
                .get(&desc.digest)
                .or_else(|| i.manifests.get(&desc.digest).map(|m| &m.bytes))
                .filter(|_| held)
                .cloned()
        }
        .ok_or_else(|| self.not_found(format!("blob {} in {repo}", desc.digest)))?;
        let start = (offset as usize).min(bytes.len());
        let pieces: Vec<Result<Bytes, StoreError>> = (start..bytes.len())
            .step_by(PIECE)
            .map(|a| Ok(bytes.slice(a..(a + PIECE).min(bytes.len()))))
            .collect();
        Ok(futures_util::stream::iter(pieces).boxed())
    }
}

impl Catalog for MemoryStore {
    fn catalog(&self) -> BTreeMap<String, Vec<String>> {
        self.tags_by_repo()
    }
}

impl Sink for MemoryStore {
    async fn blob_state(&self, repo: &str, desc: &Descriptor) -> Result<Have, StoreError> {
        let i = self.lock();
        let held = i
            .repos
            .get(repo)
            .is_some_and(|r| r.content.contains(&desc.digest));
        Ok(if held && i.blobs.contains_key(&desc.digest) {
            Have::Complete
        } else {
            Have::Nothing
        })
    }

    async fn put_blob(
        &self,
        repo: &str,
        desc: &Descriptor,
        offset: u64,
        data: &dyn Opener,
        on_bytes: &super::OnBytes,
    ) -> Result<(), StoreError> {
        let what = format!("blob {}", desc.digest);
        if offset != 0 {
            return Err(StoreError::other(
                self.describe(),
                format!("{what}: cannot resume at {offset} (nothing partial is kept)"),
            ));
        }
        let mut data = data.open(0).await?;
        let mut buf = Vec::new();
        while let Some(piece) = data.next().await {
            let piece = piece?;
            if (buf.len() + piece.len()) as u64 > desc.size {
                return Err(StoreError::SizeMismatch {
                    store: self.describe(),
                    what,
                    expected: desc.size,
                    actual: (buf.len() + piece.len()) as u64,
                });
            }
            on_bytes(piece.len() as u64);
            buf.extend_from_slice(&piece);
        }
        if buf.len() as u64 != desc.size {
            return Err(StoreError::SizeMismatch {
                store: self.describe(),
                what,
                expected: desc.size,
                actual: buf.len() as u64,
            });
        }
        let actual = Digest::from_hasher(sha2::Sha256::new_with_prefix(&buf));
        if actual != desc.digest {
            return Err(StoreError::DigestMismatch {
                store: self.describe(),
                what,
                expected: desc.digest.clone(),
                actual,
                size: buf.len() as u64,
            });
        }
        let mut i = self.lock();
        i.log
            .push(("put_blob".into(), repo.into(), desc.digest.to_string()));
        i.blobs.insert(desc.digest.clone(), Bytes::from(buf));
        i.repos
            .entry(repo.to_string())
            .or_default()
            .content
            .insert(desc.digest.clone());
        Ok(())
    }

    async fn mount_blob(
        &self,
        repo: &str,
        from_repo: &str,
        desc: &Descriptor,
    ) -> Result<bool, StoreError> {
        let mut i = self.lock();
        let there = i
            .repos
            .get(from_repo)
            .is_some_and(|r| r.content.contains(&desc.digest));
        if !self.mounts || !there {
            return Ok(false);
        }
        i.log
            .push(("mount_blob".into(), repo.into(), desc.digest.to_string()));
        i.repos
            .entry(repo.to_string())
            .or_default()
            .content
            .insert(desc.digest.clone());
        Ok(true)
    }

    async fn has_manifest(
        &self,
        repo: &str,
        reference: &Reference,
        digest: &Digest,
    ) -> Result<bool, StoreError> {
        let i = self.lock();
        let Some(r) = i.repos.get(repo) else {
            return Ok(false);
        };
        Ok(match reference {
            Reference::Tag(t) => r.tags.get(t) == Some(digest),
            Reference::Digest(d) => d == digest && r.content.contains(d),
        })
    }

    async fn put_manifest(
        &self,
        repo: &str,
        reference: &Reference,
        m: &RawManifest,
    ) -> Result<(), StoreError> {
        if Digest::of(&m.bytes) != m.digest {
            return Err(StoreError::DigestMismatch {
                store: self.describe(),
                what: format!("manifest {}", reference.qualify(repo)),
                expected: m.digest.clone(),
                actual: Digest::of(&m.bytes),
                size: m.bytes.len() as u64,
            });
        }
        if let Reference::Digest(d) = reference {
            if d != &m.digest {
                return Err(self.not_found(format!("manifest {d} (the bytes are {})", m.digest)));
            }
        }
        // Strict as a registry: everything referenced must already be in this repository.
        let parsed = Manifest::parse(&m.bytes, Some(&m.media_type))
            .map_err(|e| StoreError::other(self.describe(), e))?;
        let referenced: Vec<Digest> = match &parsed {
            Manifest::Index { manifests, .. } => {
                manifests.iter().map(|d| d.digest.clone()).collect()
            }
            img @ Manifest::Image { .. } => img.blobs().iter().map(|d| d.digest.clone()).collect(),
        };
        let mut i = self.lock();
        let repo_entry = i.repos.entry(repo.to_string()).or_default();
        if let Some(missing) = referenced.iter().find(|d| !repo_entry.content.contains(d)) {
            let missing = missing.clone();
            return Err(self.not_found(format!(
                "{missing}, referenced by manifest {} (put its content first)",
                reference.qualify(repo)
            )));
        }
        repo_entry.content.insert(m.digest.clone());
        if let Reference::Tag(t) = reference {
            repo_entry.tags.insert(t.clone(), m.digest.clone());
        }
        i.log
            .push(("put_manifest".into(), repo.into(), reference.to_string()));
        i.manifests.insert(m.digest.clone(), m.clone());
        Ok(())
    }
}
