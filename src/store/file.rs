//! Byte ranges of files as blob streams: what the blob cache and a bundle read in place serve.

use super::content::{BlobStream, StoreError};
use bytes::Bytes;
use futures_util::StreamExt;
use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// Bytes read per piece of a stream.
pub const PIECE: u64 = 1 << 20;

/// A contiguous range of an open file.
#[derive(Debug, Clone)]
pub struct Region {
    /// The file (shared: reads are positional).
    pub file: Arc<File>,
    /// Its path, for messages.
    pub path: PathBuf,
    /// Where the range starts.
    pub offset: u64,
    /// Its length.
    pub len: u64,
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
    use std::os::fd::AsRawFd as _;
    let len_off = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file too large"))?;
    // SAFETY: posix_fallocate on an open file descriptor owned by `file`, which outlives the
    // call; it only reads its integer arguments.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len_off) };
    match rc {
        0 => Ok(()),
        libc::EOPNOTSUPP | libc::EINVAL => file.set_len(len),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// Room on the file system holding `dir` (`statvfs`): (bytes free to an unprivileged user,
/// bytes in all).
pub fn space(dir: &std::path::Path) -> io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))?;
    // SAFETY: statvfs fills the zeroed struct it is given, from a NUL-terminated path that
    // outlives the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let unit = st.f_frsize as u64;
    Ok((
        (st.f_bavail as u64).saturating_mul(unit),
        (st.f_blocks as u64).saturating_mul(unit),
    ))
}

/// `offset` and `len` for `sync_file_range` and `posix_fadvise`; `None` when they do not fit,
/// or when `len` is 0, which both calls read as "to the end of the file".
fn hint_range(offset: u64, len: u64) -> Option<(libc::off64_t, libc::off64_t)> {
    let off = libc::off64_t::try_from(offset).ok()?;
    let n = libc::off64_t::try_from(len).ok()?;
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
    // SAFETY: sync_file_range on an open file descriptor owned by `file`, which outlives the
    // call; it only reads its integer arguments.
    let _ = unsafe { libc::sync_file_range(file.as_raw_fd(), off, n, libc::SYNC_FILE_RANGE_WRITE) };
}

/// Ask the kernel to start reading `len` bytes at `offset` of `file` into the page cache
/// (`posix_fadvise(WILLNEED)`), so the disk works on the next piece while this one is
/// computed on. A hint: failures are ignored.
pub fn will_need(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd as _;
    let Some((off, n)) = hint_range(offset, len) else {
        return;
    };
    // SAFETY: posix_fadvise on an open file descriptor owned by `file`, which outlives the
    // call; it only reads its integer arguments.
    let _ = unsafe { libc::posix_fadvise(file.as_raw_fd(), off, n, libc::POSIX_FADV_WILLNEED) };
}

/// The regions' bytes in order, `PIECE` at a time, read on the blocking pool.
pub fn stream(store: String, regions: Vec<Region>) -> BlobStream {
    let pieces = regions.into_iter().flat_map(|r| {
        let n = r.len.div_ceil(PIECE);
        (0..n).map(move |i| {
            let at = i * PIECE;
            (r.clone(), r.offset + at, (r.len - at).min(PIECE))
        })
    });
    futures_util::stream::iter(pieces)
        .then(move |(r, at, n)| {
            let store = store.clone();
            async move {
                let read = tokio::task::spawn_blocking(move || {
                    let mut buf = vec![0u8; n as usize];
                    read_at(&r.file, &mut buf, at)
                        .map(|()| Bytes::from(buf))
                        .map_err(|e| format!("{}: {e}", r.path.display()))
                })
                .await;
                match read {
                    Ok(Ok(b)) => Ok(b),
                    Ok(Err(e)) => Err(StoreError::other(store, e)),
                    Err(e) => Err(StoreError::other(store, e.to_string())),
                }
            }
        })
        .boxed()
}
