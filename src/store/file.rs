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
