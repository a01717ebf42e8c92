//! A store in memory, both [`Source`] and [`Sink`]: for fast tests of the copy engine and of
//! `serve`, and as the model the other stores follow. It is as strict as a registry where the
//! engine depends on it, as CNCF distribution 2.8 is (each rule checked against
//! `docker-registry`): a manifest is accepted only when every blob it references is a blob of
//! that repository and every child of an index is in that repository, and only up to 4 MiB;
//! blobs are checked against their descriptors; a mount works only from a repository that
//! holds the blob; a manifest is not a blob (HEAD, GET and mount of its digest as a blob find
//! nothing).

use super::content::{
    BlobStream, Catalog, Have, Opener, RawManifest, Reference, Sink, Source, Store, StoreError,
};
use super::registry::MAX_MANIFEST;
use bytes::Bytes;
use futures_util::StreamExt;
use koord_base::oci::{BlobCheck, Descriptor, Digest, Manifest};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

/// Blobs of a memory store are served in pieces of this size (so consumers see streams).
const PIECE: usize = 64 * 1024;

#[derive(Debug, Default)]
struct Repo {
    tags: BTreeMap<String, Digest>,
    /// Blobs this repository holds (distribution's `_layers` links).
    blobs: BTreeSet<Digest>,
    /// Manifests this repository holds (distribution's `_manifests/revisions` links).
    manifests: BTreeSet<Digest>,
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
        i.repos.entry(repo.to_string()).or_default().blobs.insert(d);
        desc
    }

    /// Add a manifest to `repo`, under `tag` when given (test set-up; not checked).
    pub fn add_manifest(&self, repo: &str, tag: Option<&str>, m: RawManifest) {
        let mut i = self.lock();
        let r = i.repos.entry(repo.to_string()).or_default();
        r.manifests.insert(m.digest.clone());
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
            .is_some_and(|r| r.blobs.contains(d) || r.manifests.contains(d))
    }

    /// Remove a blob everywhere (test set-up for missing content).
    pub fn remove_blob(&self, d: &Digest) {
        let mut i = self.lock();
        i.blobs.remove(d);
        for r in i.repos.values_mut() {
            r.blobs.remove(d);
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
            Reference::Digest(d) => r.filter(|r| r.manifests.contains(d)).map(|_| d.clone()),
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
                .is_some_and(|r| r.blobs.contains(&desc.digest));
            i.blobs.get(&desc.digest).filter(|_| held).cloned()
        }
        .ok_or_else(|| self.not_found(format!("blob {} in {repo}", desc.digest)))?;
        let start = (offset as usize).min(bytes.len());
        let pieces: Vec<Result<Bytes, StoreError>> = (start..bytes.len())
            .step_by(PIECE)
            .map(|a| Ok(bytes.slice(a..(a + PIECE).min(bytes.len()))))
            .collect();
        Ok(futures_util::stream::iter(pieces).boxed())
    }

    /// No referrers API: a reader falls back to the referrers tag schema, as with a registry
    /// that answers 404.
    async fn referrers(&self, _repo: &str, _subject: &Digest) -> Result<Option<Bytes>, StoreError> {
        Ok(None)
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
            .is_some_and(|r| r.blobs.contains(&desc.digest));
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
        let mut check = BlobCheck::new(&desc.digest, desc.size);
        let mismatch = |m| StoreError::mismatch(self.describe(), what.clone(), m);
        while let Some(piece) = data.next().await {
            let piece = piece?;
            check.update(&piece).map_err(mismatch)?;
            on_bytes(piece.len() as u64);
            buf.extend_from_slice(&piece);
        }
        check.finish().map_err(mismatch)?;
        let mut i = self.lock();
        i.log
            .push(("put_blob".into(), repo.into(), desc.digest.to_string()));
        i.blobs.insert(desc.digest.clone(), Bytes::from(buf));
        i.repos
            .entry(repo.to_string())
            .or_default()
            .blobs
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
            .is_some_and(|r| r.blobs.contains(&desc.digest));
        if !self.mounts || !there {
            return Ok(false);
        }
        i.log
            .push(("mount_blob".into(), repo.into(), desc.digest.to_string()));
        i.repos
            .entry(repo.to_string())
            .or_default()
            .blobs
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
            Reference::Digest(d) => d == digest && r.manifests.contains(d),
        })
    }

    async fn put_manifest(
        &self,
        repo: &str,
        reference: &Reference,
        m: &RawManifest,
    ) -> Result<(), StoreError> {
        if m.bytes.len() > MAX_MANIFEST {
            return Err(StoreError::other(
                self.describe(),
                format!(
                    "manifest {} is {} bytes, more than {MAX_MANIFEST}: refused (as a registry does)",
                    reference.qualify(repo),
                    m.bytes.len()
                ),
            ));
        }
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
        // Strict as a registry: everything referenced must already be in this repository; an
        // image's config and layers as blobs (a manifest of the same digest does not count), an
        // index's children as manifests or blobs (distribution 2.8 accepts either).
        let parsed = Manifest::parse(&m.bytes, Some(&m.media_type))
            .map_err(|e| StoreError::other(self.describe(), e))?;
        let mut i = self.lock();
        let repo_entry = i.repos.entry(repo.to_string()).or_default();
        let missing = match &parsed {
            Manifest::Index { manifests, .. } => manifests.iter().find(|d| {
                !repo_entry.manifests.contains(&d.digest) && !repo_entry.blobs.contains(&d.digest)
            }),
            img @ Manifest::Image { .. } => img
                .blobs()
                .into_iter()
                .find(|d| !repo_entry.blobs.contains(&d.digest)),
        };
        if let Some(missing) = missing {
            return Err(self.not_found(format!(
                "{}, referenced by manifest {} (put its content first)",
                missing.digest,
                reference.qualify(repo)
            )));
        }
        repo_entry.manifests.insert(m.digest.clone());
        if let Reference::Tag(t) = reference {
            repo_entry.tags.insert(t.clone(), m.digest.clone());
        }
        i.log
            .push(("put_manifest".into(), repo.into(), reference.to_string()));
        i.manifests.insert(m.digest.clone(), m.clone());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::future::BoxFuture;
    use koord_base::oci::media;
    use serde_json::json;

    /// The bytes of one blob, as an upload source.
    struct Held(Bytes);

    impl Opener for Held {
        fn open(&self, offset: u64) -> BoxFuture<'_, Result<BlobStream, StoreError>> {
            let b = self.0.slice(offset as usize..);
            Box::pin(async move { Ok(futures_util::stream::iter([Ok(b)]).boxed()) })
        }
    }

    fn image_manifest(config: &Descriptor, layers: &[&Descriptor], pad: usize) -> RawManifest {
        RawManifest::new(
            serde_json::to_vec(
                &json!({"schemaVersion": 2, "mediaType": media::OCI_MANIFEST,
                "config": config, "layers": layers,
                "annotations": {"pad": "a".repeat(pad)}}),
            )
            .unwrap(),
            media::OCI_MANIFEST,
        )
    }

    /// Each refusal below was checked against docker-registry 2.8.2 (curl).
    #[tokio::test]
    async fn refuses_what_distribution_refuses() {
        let s = MemoryStore::new("m");
        let tag = |t: &str| Reference::Tag(t.into());
        let config = s.add_blob("r", "application/vnd.oci.image.config.v1+json", "{}");
        let m1 = image_manifest(&config, &[], 0);
        s.put_manifest("r", &tag("m1"), &m1).await.unwrap();

        // A manifest over 4 MiB: 400 MANIFEST_INVALID "http: request body too large".
        let big = image_manifest(&config, &[], MAX_MANIFEST);
        let e = s.put_manifest("r", &tag("big"), &big).await.unwrap_err();
        assert!(e.to_string().contains("more than 4194304"), "{e}");

        // A layer that is a manifest of the repository, not a blob: 400 MANIFEST_BLOB_UNKNOWN.
        let m1_desc = m1.descriptor();
        let m2 = image_manifest(&config, &[&m1_desc], 0);
        let e = s.put_manifest("r", &tag("m2"), &m2).await.unwrap_err();
        assert!(e.is_not_found(), "{e}");
        // An index child that is not there at all: 400 MANIFEST_BLOB_UNKNOWN.
        let absent = Descriptor {
            digest: Digest::of(b"absent"),
            ..m1_desc.clone()
        };
        let idx = RawManifest::new(
            serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX,
                "manifests": [absent]}))
            .unwrap(),
            media::OCI_INDEX,
        );
        let e = s.put_manifest("r", &tag("i"), &idx).await.unwrap_err();
        assert!(e.is_not_found(), "{e}");

        // A manifest's digest is no blob: HEAD and GET 404, a mount of it opens an upload.
        assert_eq!(s.blob_state("r", &m1_desc).await.unwrap(), Have::Nothing);
        assert!(s.blob("r", &m1_desc, 0).await.is_err());
        assert!(!s.mount_blob("o", "r", &m1_desc).await.unwrap());
        // A blob is mounted from a repository that holds it, not from one that lacks it.
        assert!(!s.mount_blob("o", "elsewhere", &config).await.unwrap());
        assert!(s.mount_blob("o", "r", &config).await.unwrap());

        // A blob whose bytes do not match its digest is not kept.
        let wrong = Descriptor {
            digest: Digest::of(b"other"),
            ..config.clone()
        };
        let on: crate::store::OnBytes = std::sync::Arc::new(|_| {});
        let held = Held(Bytes::from_static(b"{}"));
        let e = s.put_blob("r2", &wrong, 0, &held, &on).await.unwrap_err();
        assert!(e.to_string().contains("digest"), "{e}");
        assert!(!s.holds("r2", &wrong.digest));
    }
}
