//! Output files written atomically: the bytes go to a hidden temporary file next to the
//! destination (`.NAME.XXXXXX.partial`), which is fsynced and renamed over the destination only
//! when complete. A process that dies half-way (SIGKILL, power loss) leaves its temporary file
//! behind; every temporary file is held under an exclusive `flock` while it is written, so the
//! next writer of the same destination removes the ones no live process owns.
//!
//! A bundle being built is different: its temporary file is what a resumed build starts from
//! (issue 23), so it has a name derived from the output alone (`.NAME.partial`, see
//! [`PartialFile`]), is kept when the build stops before its end (an error, Ctrl-C, SIGKILL),
//! and is found again by the same build run again.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// Suffix of the temporary files.
const SUFFIX: &str = ".partial";

/// A file being written; renamed over its destination by [`AtomicFile::commit`], removed when
/// dropped uncommitted.
#[derive(Debug)]
pub struct AtomicFile {
    tmp: tempfile::NamedTempFile,
    dest: PathBuf,
}

/// 0644 on the open file itself (fchmod), not on whatever its path names by now.
fn world_readable(file: &File) -> io::Result<()> {
    rustix::fs::fchmod(file, rustix::fs::Mode::from_raw_mode(0o644)).map_err(io::Error::from)
}

fn dir_of(dest: &Path) -> PathBuf {
    match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn name_of(dest: &Path) -> io::Result<String> {
    dest.file_name()
        .map(|n| n.to_string_lossy().to_string())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} has no file name", dest.display()),
            )
        })
}

impl AtomicFile {
    /// Start writing `dest`: stale temporary files of earlier, dead writers of the same name are
    /// removed first.
    pub fn create(dest: &Path) -> io::Result<AtomicFile> {
        let dir = dir_of(dest);
        let name = name_of(dest)?;
        remove_stale(&dir, &name)?;
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(SUFFIX)
            .tempfile_in(&dir)?;
        // Held until the file is closed (committed, dropped, or the process died).
        tmp.as_file().try_lock().map_err(|e| match e {
            std::fs::TryLockError::Error(e) => e,
            std::fs::TryLockError::WouldBlock => io::Error::other("temporary file is locked"),
        })?;
        Ok(AtomicFile {
            tmp,
            dest: dest.to_path_buf(),
        })
    }

    /// The file to write.
    pub fn file(&self) -> &File {
        self.tmp.as_file()
    }

    /// fsync, make it world-readable (0644, on the descriptor: never a path that may have
    /// been replaced meanwhile), rename it over the destination, fsync the directory.
    pub fn commit(self) -> io::Result<()> {
        self.tmp.as_file().sync_all()?;
        world_readable(self.tmp.as_file())?;
        let dir = dir_of(&self.dest);
        self.tmp.persist(&self.dest).map_err(|e| e.error)?;
        if let Ok(d) = File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

/// Remove `.NAME.*.partial` files in `dir` that no live process holds (their writer died).
/// Returns how many were removed.
pub(crate) fn remove_stale(dir: &Path, name: &str) -> io::Result<usize> {
    let prefix = format!(".{name}.");
    let mut removed = 0;
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    for e in entries {
        let e = e?;
        let file_name = e.file_name().to_string_lossy().to_string();
        let Some(middle) = file_name
            .strip_prefix(&prefix)
            .and_then(|s| s.strip_suffix(SUFFIX))
        else {
            continue;
        };
        // Only what `create` makes: one random component, no further dots.
        // (tempfile's six random letters and digits: `.b.tar.partial`, a bundle's resumable
        // file, is not `-o b`'s temporary.)
        if middle.len() != 6
            || !middle.chars().all(|c| c.is_ascii_alphanumeric())
            || !e.file_type()?.is_file()
        {
            continue;
        }
        let path = e.path();
        let Ok(f) = File::open(&path) else { continue };
        if f.try_lock().is_ok() {
            // Nobody writes it: a dead writer's leftover.
            std::fs::remove_file(&path)?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// The resumable temporary file of the bundle `dest`: `.NAME.partial` next to it.
pub fn partial_path(dest: &Path) -> io::Result<PathBuf> {
    Ok(dir_of(dest).join(format!(".{}{SUFFIX}", name_of(dest)?)))
}

/// Leftovers of interrupted builds older than this are removed by the next build in the same
/// folder (7 days).
pub(crate) const PARTIAL_MAX_AGE: std::time::Duration =
    std::time::Duration::from_secs(7 * 24 * 3600);

/// A bundle's temporary file, `.NAME.partial` next to the bundle: opened as it is when an
/// earlier, stopped build of the same output left it (what it holds is re-hashed before it is
/// kept: the bundle writer of koord-bundle), held under an exclusive `flock` while
/// written, renamed over the destination by [`PartialFile::commit`], and KEPT when dropped
/// uncommitted, for the next run to resume from.
#[derive(Debug)]
pub struct PartialFile {
    file: File,
    path: PathBuf,
    dest: PathBuf,
    found: u64,
    replaced: Option<String>,
}

/// Why the temporary file of a bundle cannot be had.
fn locked(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::ResourceBusy,
        format!(
            "{} is locked: another koord-bundle build is writing the same output; wait for it, or build to another -o",
            path.display()
        ),
    )
}

impl PartialFile {
    /// Open (or create) `.NAME.partial` for `dest`, locked; stale random temporaries of the
    /// same name are removed first.
    ///
    /// Never through a link, never a special file (issue 30: a `.partial` that was a symbolic
    /// link got its target overwritten, and the output became the link): what is at that name
    /// and is not a regular file is removed (the link itself, never what it points to) and a
    /// new file made with `O_EXCL`; [`PartialFile::replaced`] says what was there.
    pub fn open(dest: &Path) -> io::Result<PartialFile> {
        let dir = dir_of(dest);
        let name = name_of(dest)?;
        remove_stale(&dir, &name)?;
        let path = partial_path(dest)?;
        let (file, replaced) = crate::fsio::open_or_replace(&path)?;
        file.try_lock().map_err(|e| match e {
            std::fs::TryLockError::Error(e) => e,
            std::fs::TryLockError::WouldBlock => locked(&path),
        })?;
        let found = file.metadata()?.len();
        Ok(PartialFile {
            file,
            path,
            dest: dest.to_path_buf(),
            found,
            replaced,
        })
    }

    /// What was at its name and was removed, not being a regular file (a link, a FIFO).
    pub fn replaced(&self) -> Option<&str> {
        self.replaced.as_deref()
    }

    /// What an earlier run left is not for this build: emptied (the caller says why).
    pub fn discard(&mut self) -> io::Result<()> {
        self.file.set_len(0)?;
        self.found = 0;
        Ok(())
    }

    /// The file to write.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Its path (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its length when opened: what an earlier run left (0 for a new file).
    pub fn found(&self) -> u64 {
        self.found
    }

    /// fsync, make it world-readable (0644, on the descriptor), rename it over the
    /// destination, fsync the directory.
    pub fn commit(self) -> io::Result<()> {
        self.file.sync_all()?;
        world_readable(&self.file)?;
        std::fs::rename(&self.path, &self.dest)?;
        if let Ok(d) = File::open(dir_of(&self.dest)) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    /// Done with it (what was made of it is committed elsewhere: a gzip file, parts).
    pub fn remove(self) -> io::Result<()> {
        std::fs::remove_file(&self.path)
    }
}

/// A kept temporary file of another output in a folder: its path, size and age.
#[derive(Debug, Clone)]
pub struct Leftover {
    /// `.NAME.partial`.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Removed now (older than 7 days).
    pub removed: bool,
}

/// The `.NAME.partial` files of interrupted builds in the folder of `dest` that no live build
/// holds, but `dest`'s own: those older than 7 days are removed, the others
/// listed (the build command names them, with their size, so none stays unseen).
pub fn leftovers(dest: &Path) -> io::Result<Vec<Leftover>> {
    let own = partial_path(dest)?;
    let mut found = Vec::new();
    let entries = match std::fs::read_dir(dir_of(dest)) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(found),
        Err(e) => return Err(e),
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        // Only what [`PartialFile`] makes: `.NAME.partial`, NAME without a random part.
        if !name.starts_with('.') || !name.ends_with(SUFFIX) || name.len() <= SUFFIX.len() + 1 {
            continue;
        }
        let path = e.path();
        let Ok(meta) = e.metadata() else { continue };
        if path == own || !meta.is_file() {
            continue;
        }
        let Ok(f) = File::open(&path) else { continue };
        if f.try_lock().is_err() {
            continue; // A live build's.
        }
        let old = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age > PARTIAL_MAX_AGE);
        let removed = old && std::fs::remove_file(&path).is_ok();
        found.push(Leftover {
            path,
            bytes: meta.len(),
            removed,
        });
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn commit_renames_and_stale_files_of_dead_writers_go() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("b.tar");
        // A leftover of a dead writer (nobody holds its lock) and a live writer's file.
        let dead = dir.path().join(".b.tar.AbC123.partial");
        std::fs::write(&dead, b"half").unwrap();
        let live = AtomicFile::create(&dest).unwrap();
        assert!(!dead.exists(), "the dead writer's file is removed");
        let other = dir.path().join(".other.tar.AbC123.partial");
        std::fs::write(&other, b"x").unwrap();
        // A second writer of the same name does not remove the live one's file.
        let second = AtomicFile::create(&dest).unwrap();
        assert!(live.tmp.path().exists());
        assert!(other.exists(), "other names are not touched");
        second.file().write_all(b"data").unwrap();
        second.commit().unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"data");
        let live_path = live.tmp.path().to_path_buf();
        drop(live);
        assert!(
            !live_path.exists(),
            "an uncommitted file is removed on drop"
        );
    }

    #[test]
    fn a_bundles_partial_file_is_kept_found_again_and_locked() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("b.tar");
        let p = PartialFile::open(&dest).unwrap();
        assert_eq!(p.path(), dir.path().join(".b.tar.partial"));
        assert_eq!(p.found(), 0);
        // A second build of the same output is refused while the first writes.
        let e = PartialFile::open(&dest).unwrap_err();
        assert!(e.to_string().contains("another koord-bundle build"), "{e}");
        p.file().write_all(b"half").unwrap();
        drop(p);
        assert!(
            dir.path().join(".b.tar.partial").exists(),
            "kept when dropped"
        );
        // Another output in the folder lists it; the same output finds it again.
        let other = leftovers(&dir.path().join("c.tar")).unwrap();
        assert_eq!(other.len(), 1);
        assert_eq!((other[0].bytes, other[0].removed), (4, false));
        assert!(
            leftovers(&dest).unwrap().is_empty(),
            "its own is not a leftover"
        );
        let p = PartialFile::open(&dest).unwrap();
        assert_eq!(p.found(), 4);
        p.commit().unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"half");
        assert!(!dir.path().join(".b.tar.partial").exists());
    }
}
