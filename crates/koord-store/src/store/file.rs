//! Byte ranges of files as blob streams: what the blob cache and a bundle read in place serve.
//! The file primitives under them are `koord_base::fsio`'s, re-exported here.

use super::content::{BlobStream, StoreError};
use bytes::Bytes;
use futures_util::StreamExt;
use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

pub use koord_base::fsio::{
    create_new, open_or_replace, open_own, read_at, reserve, space, start_writeback, will_need,
    write_at, HardLinked, Positioned,
};

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

/// A file of this machine as the source of one blob (the programs `build --with-tools`
/// carries): opened once, read from any offset by [`stream`].
pub struct FileOpener {
    region: Region,
    store: String,
}

impl FileOpener {
    /// Open `path` (a regular file only, never blocking: [`koord_base::bounded::open_input`]).
    pub fn open(path: &std::path::Path) -> io::Result<FileOpener> {
        let file = koord_base::bounded::open_input(path)?;
        let len = file.metadata()?.len();
        Ok(FileOpener {
            region: Region {
                file: Arc::new(file),
                path: path.to_path_buf(),
                offset: 0,
                len,
            },
            store: format!("file {}", path.display()),
        })
    }
}

impl crate::store::Opener for FileOpener {
    fn open(
        &self,
        offset: u64,
    ) -> futures_util::future::BoxFuture<'_, Result<BlobStream, StoreError>> {
        let offset = offset.min(self.region.len);
        let region = Region {
            offset,
            len: self.region.len - offset,
            ..self.region.clone()
        };
        let s = stream(self.store.clone(), vec![region]);
        Box::pin(async move { Ok(s) })
    }
}
