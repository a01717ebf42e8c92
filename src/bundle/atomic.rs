//! Output files written atomically: the bytes go to a hidden temporary file next to the
//! destination (`.NAME.XXXXXX.partial`), which is fsynced and renamed over the destination only
//! when complete. A process that dies half-way (SIGKILL, power loss) leaves its temporary file
//! behind; every temporary file is held under an exclusive `flock` while it is written, so the
//! next writer of the same destination removes the ones no live process owns.

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

    /// The temporary file's path (for messages).
    pub fn path(&self) -> &Path {
        self.tmp.path()
    }

    /// fsync, make it world-readable (0644), rename it over the destination, fsync the
    /// directory.
    pub fn commit(self) -> io::Result<()> {
        self.tmp.as_file().sync_all()?;
        #[cfg(unix)]
        std::fs::set_permissions(
            self.tmp.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o644),
        )?;
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
pub fn remove_stale(dir: &Path, name: &str) -> io::Result<usize> {
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
        if middle.is_empty() || middle.contains('.') || !e.file_type()?.is_file() {
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
        assert!(live.path().exists());
        assert!(other.exists(), "other names are not touched");
        second.file().write_all(b"data").unwrap();
        second.commit().unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"data");
        let live_path = live.path().to_path_buf();
        drop(live);
        assert!(
            !live_path.exists(),
            "an uncommitted file is removed on drop"
        );
    }
}
