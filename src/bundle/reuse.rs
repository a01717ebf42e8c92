//! Earlier bundles as the cache (issue 23). A bundle already holds every blob it carries at a
//! known offset, so a build host keeps no second copy of them: a small index in the cache
//! directory (`bundles.json`) maps each bundle written (and each bundle read with `--since` or
//! `--reuse`) to its blobs' offsets and sizes, with the file's identity (size, modification
//! time, inode, device). A build copies what it can from the bundles the index names, re-hashing
//! every byte on the way (the index is never trusted without a re-hash: a blob that does not
//! match is refused and fetched again), and fetches only the rest.
//!
//! - A bundle moved, deleted or changed since it was indexed (its identity no longer matches)
//!   is said once and forgotten.
//! - A damaged index is said once and rebuilt (from the bundles of the builds that follow).
//! - The index is written atomically (a temporary file renamed over it) under an exclusive
//!   `flock` of `bundles.lock`, so two builds at once both land.
//! - Only whole plain-tar bundles are sources: a gzip bundle cannot be read at offsets, and a
//!   split set's blobs may straddle its parts (they are not indexed; `--reuse` of one is said
//!   and skipped).

use crate::oci::Digest;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, Read as _, Seek as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The index's file in the cache directory.
pub const INDEX_FILE: &str = "bundles.json";
/// The lock taken while the index is rewritten.
const LOCK_FILE: &str = "bundles.lock";
/// Largest index read (about 90 bytes per blob: far more than any build host's bundles).
const MAX_INDEX: u64 = 64 << 20;
/// The index format written.
const VERSION: u32 = 1;

/// Why the index or a bundle could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ReuseError {
    /// The cache directory or the index could not be read or written.
    #[error("the bundle index {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// A bundle named to be reused that cannot be read at offsets.
    #[error("{path}: {reason}")]
    NotPlain {
        /// The bundle.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

impl crate::exit::Classify for ReuseError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        match self {
            // Reading the bundle index: the kind of I/O error decides.
            ReuseError::Io { .. } => None,
            ReuseError::NotPlain { .. } => Some(crate::exit::ExitClass::Input),
        }
    }
}

/// What says a file is still the one indexed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Identity {
    /// Bytes.
    pub size: u64,
    /// Modification time, seconds.
    pub mtime: i64,
    /// Modification time, nanoseconds.
    pub mtime_nsec: i64,
    /// Inode.
    pub inode: u64,
    /// Device.
    pub dev: u64,
}

impl Identity {
    /// The identity of `path` now.
    pub fn of(path: &Path) -> io::Result<Identity> {
        use std::os::unix::fs::MetadataExt as _;
        let m = std::fs::metadata(path)?;
        Ok(Identity {
            size: m.len(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
            inode: m.ino(),
            dev: m.dev(),
        })
    }
}

/// One bundle of the index.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Entry {
    /// Absolute path.
    path: PathBuf,
    #[serde(flatten)]
    id: Identity,
    /// (digest, offset of its bytes, size).
    blobs: Vec<(Digest, u64, u64)>,
}

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct IndexFile {
    version: u32,
    bundles: Vec<Entry>,
}

/// Where a blob can be copied from.
#[derive(Debug, Clone)]
pub struct Location {
    /// The bundle.
    pub bundle: Arc<PathBuf>,
    /// Offset of the blob's bytes in it.
    pub offset: u64,
    /// Its size.
    pub size: u64,
}

/// Blobs held by earlier bundles, by digest.
#[derive(Debug, Default)]
pub struct Donors {
    map: HashMap<Digest, Vec<Location>>,
    bundles: BTreeSet<PathBuf>,
}

impl Donors {
    /// Where `d` may be found (to be re-hashed).
    pub fn get(&self, d: &Digest) -> &[Location] {
        self.map.get(d).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The bundles that hold some blob wanted.
    pub fn bundles(&self) -> impl Iterator<Item = &PathBuf> {
        self.bundles.iter()
    }

    /// Add `path`'s blobs that are `wanted`.
    pub fn add(&mut self, path: &Path, blobs: &[(Digest, u64, u64)], wanted: &BTreeSet<Digest>) {
        let bundle = Arc::new(path.to_path_buf());
        for (d, offset, size) in blobs {
            if !wanted.contains(d) {
                continue;
            }
            self.bundles.insert(path.to_path_buf());
            self.map.entry(d.clone()).or_default().push(Location {
                bundle: bundle.clone(),
                offset: *offset,
                size: *size,
            });
        }
    }
}

/// The blob regions of a plain-tar bundle, from its tar headers only (nothing hashed here:
/// every byte is re-hashed when copied). A gzip bundle or a split set is refused.
pub fn blob_regions(path: &Path) -> Result<Vec<(Digest, u64, u64)>, ReuseError> {
    let not_plain = |reason: String| ReuseError::NotPlain {
        path: path.to_path_buf(),
        reason,
    };
    let mut file =
        crate::bounded::open_input(path).map_err(|e| not_plain(format!("cannot read it: {e}")))?;
    let mut magic = [0u8; 2];
    if file.read_exact(&mut magic).is_ok() && magic == [0x1f, 0x8b] {
        return Err(not_plain(
            "a gzip bundle cannot be read at offsets: not used as a source of blobs".into(),
        ));
    }
    file.rewind()
        .map_err(|e| not_plain(format!("cannot read it: {e}")))?;
    let bad = |e: io::Error| {
        not_plain(format!("not a plain-tar bundle ({e}): a split set's parts and gzip bundles are not used as a source of blobs"))
    };
    let mut ar = tar::Archive::new(io::BufReader::new(file));
    let mut out = Vec::new();
    for e in ar.entries_with_seek().map_err(bad)? {
        let e = e.map_err(bad)?;
        let p = e.path().map_err(bad)?.to_string_lossy().to_string();
        if let Some(hex) = p.strip_prefix("blobs/sha256/") {
            if let Ok(d) = Digest::from_hex(hex) {
                out.push((d, e.raw_file_position(), e.size()));
                // The bound every bundle keeps (see "Bounds" in the README): a file past it
                // was not written by koord-bundle, and its list is not grown without end.
                if out.len() > crate::copy::MAX_BLOBS {
                    return Err(not_plain(format!(
                        "it holds more than {} blobs, more than a bundle may",
                        crate::copy::MAX_BLOBS
                    )));
                }
            }
        }
    }
    if out.is_empty() {
        return Err(not_plain(
            "no blob in it as a plain tar: a split set's parts and gzip bundles are not used as a source of blobs".into(),
        ));
    }
    Ok(out)
}

/// The index of earlier bundles, in a cache directory.
#[derive(Debug, Clone)]
pub struct Index {
    dir: PathBuf,
}

/// A bundle to add to the index: its path and blob regions.
pub type Record = (PathBuf, Vec<(Digest, u64, u64)>);

impl Index {
    /// The index of the cache directory `dir` (created when first written).
    pub fn new(dir: &Path) -> Index {
        Index {
            dir: dir.to_path_buf(),
        }
    }

    /// Its file.
    pub fn path(&self) -> PathBuf {
        self.dir.join(INDEX_FILE)
    }

    fn io(&self, path: PathBuf) -> impl FnOnce(io::Error) -> ReuseError {
        move |source| ReuseError::Io { path, source }
    }

    /// Read it: `Ok(None)` when damaged (with why).
    fn read(&self) -> Result<Result<IndexFile, String>, ReuseError> {
        let path = self.path();
        let bytes = match crate::bounded::read_file_bounded(&path, MAX_INDEX as usize) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Ok(IndexFile::default())),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => return Ok(Err(e.to_string())),
            Err(e) => return Err(self.io(path)(e)),
        };
        Ok(match serde_json::from_slice::<IndexFile>(&bytes) {
            Ok(f) if f.version == VERSION => Ok(f),
            Ok(f) => Err(format!(
                "format {} (this koord-bundle writes {VERSION})",
                f.version
            )),
            Err(e) => Err(e.to_string()),
        })
    }

    /// The blobs of `wanted` that indexed bundles hold, from the bundles still as they were
    /// indexed, and what to say: each bundle moved, deleted or changed since (forgotten now,
    /// so it is said once), a damaged index (rebuilt).
    pub fn donors(&self, wanted: &BTreeSet<Digest>) -> Result<(Donors, Vec<String>), ReuseError> {
        let mut notes = Vec::new();
        let mut donors = Donors::default();
        let (stale, damaged) = match self.read()? {
            Ok(f) => {
                let mut stale = Vec::new();
                for e in &f.bundles {
                    match Identity::of(&e.path) {
                        Ok(id) if id == e.id => donors.add(&e.path, &e.blobs, wanted),
                        Ok(_) => {
                            notes.push(format!("earlier bundle {} changed since it was indexed: not used as a source of blobs (they are fetched again); forgotten", e.path.display()));
                            stale.push(e.path.clone());
                        }
                        Err(err) => {
                            notes.push(format!("earlier bundle {} is gone ({err}; moved or deleted): its blobs are fetched again; forgotten", e.path.display()));
                            stale.push(e.path.clone());
                        }
                    }
                }
                (stale, false)
            }
            Err(why) => {
                notes.push(format!(
                    "the bundle index {} is damaged ({why}): ignored and rebuilt from this build on; earlier bundles are not used as sources of blobs this time (build with --reuse BUNDLE to use one)",
                    self.path().display()
                ));
                (vec![], true)
            }
        };
        if damaged || !stale.is_empty() {
            self.update(&[], &stale, damaged)?;
        }
        Ok((donors, notes))
    }

    /// Add (or replace) `add`'s bundles and drop `forget`'s, under the lock; `reset` starts
    /// from an empty index (a damaged one). Bundles whose identity cannot be read are left out.
    pub fn update(
        &self,
        add: &[Record],
        forget: &[PathBuf],
        reset: bool,
    ) -> Result<(), ReuseError> {
        std::fs::create_dir_all(&self.dir).map_err(self.io(self.dir.clone()))?;
        let lock_path = self.dir.join(LOCK_FILE);
        // Never through a link another user of a shared cache put there.
        let (lock, _) =
            crate::store::file::open_or_replace(&lock_path).map_err(self.io(lock_path.clone()))?;
        lock.lock().map_err(self.io(lock_path))?;
        // Read again under the lock: another build may have written since.
        let mut bundles: BTreeMap<PathBuf, Entry> = BTreeMap::new();
        if !reset {
            if let Ok(f) = self.read()? {
                bundles.extend(f.bundles.into_iter().map(|e| (e.path.clone(), e)));
            }
        }
        for p in forget {
            bundles.remove(p);
        }
        for (path, blobs) in add {
            let path = std::path::absolute(path).unwrap_or_else(|_| path.clone());
            if let Ok(id) = Identity::of(&path) {
                bundles.insert(
                    path.clone(),
                    Entry {
                        path,
                        id,
                        blobs: blobs.clone(),
                    },
                );
            }
        }
        let file = IndexFile {
            version: VERSION,
            bundles: bundles.into_values().collect(),
        };
        let bytes = serde_json::to_vec(&file).map_err(|e| self.io(self.path())(e.into()))?;
        // A temporary file of a new name (O_EXCL), renamed over the index: no write goes
        // through a link at a name another program could guess.
        let write = || -> io::Result<()> {
            let tmp = koord_splitset::AtomicFile::create(&self.path())?;
            io::Write::write_all(&mut tmp.file(), &bytes)?;
            tmp.commit()
        };
        write().map_err(self.io(self.path()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moved_changed_and_damaged_are_said_once() {
        let dir = tempfile::tempdir().unwrap();
        let idx = Index::new(&dir.path().join("cache"));
        let (a, b) = (dir.path().join("a.tar"), dir.path().join("b.tar"));
        std::fs::write(&a, b"aaaa").unwrap();
        std::fs::write(&b, b"bbbb").unwrap();
        let d = Digest::of(b"x");
        let wanted = BTreeSet::from([d.clone()]);
        idx.update(
            &[
                (a.clone(), vec![(d.clone(), 0, 1)]),
                (b.clone(), vec![(d.clone(), 1, 1)]),
            ],
            &[],
            false,
        )
        .unwrap();
        let (donors, notes) = idx.donors(&wanted).unwrap();
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(donors.get(&d).len(), 2);
        // One deleted, one changed: each said, then forgotten.
        std::fs::remove_file(&a).unwrap();
        std::fs::write(&b, b"bbbbb").unwrap();
        let (donors, notes) = idx.donors(&wanted).unwrap();
        assert!(donors.get(&d).is_empty());
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[0].contains("a.tar is gone"), "{notes:?}");
        assert!(notes[1].contains("b.tar changed"), "{notes:?}");
        assert!(idx.donors(&wanted).unwrap().1.is_empty(), "said once");
        // Damaged: said, rebuilt empty, then quiet.
        std::fs::write(idx.path(), b"{not json").unwrap();
        let (_, notes) = idx.donors(&wanted).unwrap();
        assert!(notes[0].contains("is damaged"), "{notes:?}");
        assert!(idx.donors(&wanted).unwrap().1.is_empty());
    }
}
