//! A response body read to a cap, and what a registry makes of a body that broke off or grew
//! too large. Beside the registry client, which is its main reader (the Helm repository
//! fetcher of `store::http` reads through it too).

use super::RegistryError;
use crate::store::error_chain as chain;
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

impl BodyError {
    pub fn into_error(self, registry: &str, what: &str) -> RegistryError {
        match self {
            BodyError::TooLarge(cap) => RegistryError::Status {
                registry: registry.to_string(),
                what: what.to_string(),
                message: format!("the answer is larger than {cap} bytes: refused"),
            },
            BodyError::Read(e) => RegistryError::transport(
                registry,
                what,
                format!("the answer broke off: {}", chain(&e)),
                String::new(),
                true,
            ),
        }
    }
}
