//! File primitives: positional reads and writes, space reserved and hinted, and the one way a
//! file that is written in place is opened ([`open_own`], [`create_new`], [`open_or_replace`]:
//! never through a link, never a special file, never a file with other hard links). They use
//! nothing of the rest of the crate but the bounded input helpers.

use std::fs::File;
use std::io;
use std::path::PathBuf;

/// Reads `file` from `pos` on with positional reads: the descriptor already open, its own
/// offset untouched (no reopening by path).
pub struct Positioned<'a> {
    file: &'a File,
    pos: u64,
}

impl<'a> Positioned<'a> {
    /// From `pos` on.
    pub fn new(file: &'a File, pos: u64) -> Self {
        Positioned { file, pos }
    }
}

impl io::Read for Positioned<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = std::os::unix::fs::FileExt::read_at(self.file, buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// Read `buf.len()` bytes at `offset` (positional: the file's cursor is not used).
pub fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt as _;
    file.read_exact_at(buf, offset)
}

/// Write `buf` at `offset` (positional).
pub fn write_at(file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt as _;
    file.write_all_at(buf, offset)
}

/// Reserve `len` bytes for `file` (`posix_fallocate`): a disk that cannot take them fails now,
/// with `StorageFull`, not half-way through. Where the file system cannot reserve space
/// (`EOPNOTSUPP`), the file is only extended.
pub fn reserve(file: &File, len: u64) -> io::Result<()> {
    use rustix::io::Errno;
    if i64::try_from(len).is_err() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "file too large",
        ));
    }
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, len) {
        Ok(()) => Ok(()),
        Err(Errno::OPNOTSUPP | Errno::INVAL) => file.set_len(len),
        Err(e) => Err(e.into()),
    }
}

/// Room on the file system holding `dir` (`statvfs`): (bytes free to an unprivileged user,
/// bytes in all).
pub fn space(dir: &std::path::Path) -> io::Result<(u64, u64)> {
    let st = rustix::fs::statvfs(dir)?;
    Ok((
        st.f_bavail.saturating_mul(st.f_frsize),
        st.f_blocks.saturating_mul(st.f_frsize),
    ))
}

/// `offset` and `len` for `sync_file_range` and `posix_fadvise`; `None` when they do not fit,
/// or when `len` is 0, which both calls read as "to the end of the file".
fn hint_range(offset: u64, len: u64) -> Option<(i64, i64)> {
    let off = i64::try_from(offset).ok()?;
    let n = i64::try_from(len).ok()?;
    (n > 0).then_some((off, n))
}

/// Start writing `len` bytes of `file` at `offset` back to the disk (`sync_file_range` with
/// `SYNC_FILE_RANGE_WRITE`), without waiting: a writer that fsyncs at the end then finds most of
/// its bytes already on the disk, and its writing overlaps its computing. Best effort: an error
/// here only means the fsync at the end does all the work.
pub fn start_writeback(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd as _;
    let Some((off, n)) = hint_range(offset, len) else {
        return;
    };
    // The one raw call left here: neither rustix nor the standard library wraps
    // sync_file_range(2) (Linux only), and it is what lets split's writes overlap its coding.
    // SAFETY: sync_file_range on an open file descriptor owned by `file`, which outlives the
    // call; it only reads its integer arguments.
    let _ = unsafe { libc::sync_file_range(file.as_raw_fd(), off, n, libc::SYNC_FILE_RANGE_WRITE) };
}

/// Ask the kernel to start reading `len` bytes at `offset` of `file` into the page cache
/// (`posix_fadvise(WILLNEED)`), so the disk works on the next piece while this one is
/// computed on. A hint: failures are ignored.
pub fn will_need(file: &File, offset: u64, len: u64) {
    let Some((_, n)) = hint_range(offset, len) else {
        return;
    };
    let n = std::num::NonZeroU64::new(n as u64);
    let _ = rustix::fs::fadvise(file, offset, n, rustix::fs::Advice::WillNeed);
}

/// Open `path` to write in place, never through a link and never a special file: `Ok(None)`
/// when nothing is there; an error of kind `InvalidInput` naming what is there when it is a
/// symbolic link, FIFO, device or directory (the caller removes it and creates a file of its
/// own: [`create_new`]); an error of kind `PermissionDenied` saying what to do when it is a
/// regular file with other hard links (never written through, never removed).
pub fn open_own(path: &std::path::Path) -> std::io::Result<Option<std::fs::File>> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path);
    let file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "it is a symbolic link",
            ))
        }
        Err(e) => {
            // A directory (EISDIR) or another odd thing: named by its type when it has one.
            return match std::fs::symlink_metadata(path) {
                Ok(m) if !m.is_file() => Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("it is {}", crate::bounded::kind_of(m.file_type())),
                )),
                _ => Err(e),
            };
        }
    };
    let meta = file.metadata()?;
    let t = meta.file_type();
    if !t.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("it is {}", crate::bounded::kind_of(t)),
        ));
    }
    refuse_hard_link(path, &meta)?;
    crate::bounded::clear_nonblock(&file);
    Ok(Some(file))
}

/// A regular file with other hard links shares its bytes with another name: writing it in place
/// would change that other file too (a hard-linked `.partial` had the bundle written into the
/// file it was linked to). Refused, not removed: the user says what it is.
fn refuse_hard_link(path: &std::path::Path, meta: &std::fs::Metadata) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let links = meta.nlink();
    if links > 1 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            HardLinked {
                path: path.to_path_buf(),
                others: links - 1,
            },
        ));
    }
    Ok(())
}

/// A file to be written in place that has other hard links (inside an `io::Error` of kind
/// `PermissionDenied`): the user's to remove.
#[derive(Debug, thiserror::Error)]
#[error("{} has {others} other hard link{} (another file shares its bytes, and writing it would change that file too): remove it (rm {}), then run again", path.display(), if *others == 1 { "" } else { "s" }, path.display())]
pub struct HardLinked {
    /// The file.
    pub path: PathBuf,
    /// Its other links.
    pub others: u64,
}

impl crate::exit::Classify for HardLinked {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        // A file the user hard-linked elsewhere: theirs to remove.
        Some(crate::exit::ExitClass::Input)
    }
}

impl HardLinked {
    /// Whether `e` is this refusal.
    pub fn is(e: &std::io::Error) -> bool {
        e.get_ref().is_some_and(|i| i.is::<HardLinked>())
    }
}

/// Create `path` as a new file (`O_EXCL`: never one that is there, a link included; and
/// `O_NOFOLLOW`), for reading and writing.
pub fn create_new(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// [`open_own`], or when something that is not a regular file is there, that thing removed
/// (never what a link points to) and a new file made; `Ok((file, Some(what was there)))` then.
/// Nothing there: a new file.
pub fn open_or_replace(path: &std::path::Path) -> std::io::Result<(std::fs::File, Option<String>)> {
    match open_own(path) {
        Ok(Some(f)) => Ok((f, None)),
        Ok(None) => Ok((create_new(path)?, None)),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
            std::fs::remove_file(path)?;
            Ok((create_new(path)?, Some(e.to_string())))
        }
        Err(e) => Err(e),
    }
}
