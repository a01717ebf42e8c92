//! Bounded reads of what comes from outside: an HTTP body stops at its cap while it is read
//! (announced length or chunked), a file or stream at its own. Registries, Helm repositories,
//! the cluster's API server and local input files all read through here.

use bytes::Bytes;

/// A body read that stopped.
pub(crate) enum BodyError {
    /// More than the cap.
    TooLarge(usize),
    /// The transfer broke.
    Read(reqwest::Error),
}

/// Read a body, stopping at `cap` bytes while reading (chunked or not): an endless body costs
/// `cap` bytes of memory, no more.
pub(crate) async fn read_capped(
    mut resp: reqwest::Response,
    cap: usize,
) -> Result<Bytes, BodyError> {
    if resp.content_length().is_some_and(|l| l > cap as u64) {
        return Err(BodyError::TooLarge(cap));
    }
    let mut buf = bytes::BytesMut::new();
    while let Some(chunk) = resp.chunk().await.map_err(BodyError::Read)? {
        if buf.len() + chunk.len() > cap {
            return Err(BodyError::TooLarge(cap));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// Read at most `max` bytes from `r`; more is an error ("larger than the MAX bytes allowed for
/// it"), found without reading the rest.
pub fn read_bounded(r: impl std::io::Read, max: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut out = Vec::new();
    r.take(max as u64 + 1).read_to_end(&mut out)?;
    if out.len() > max {
        return Err(std::io::Error::other(format!(
            "larger than the {max} bytes allowed for it"
        )));
    }
    Ok(out)
}

/// [`read_bounded`] of a file.
pub fn read_file_bounded(path: &std::path::Path, max: usize) -> std::io::Result<Vec<u8>> {
    std::fs::File::open(path).and_then(|f| read_bounded(f, max))
}
