use sha2::{Digest as _, Sha256};
use std::fmt;
use std::str::FromStr;

/// A `sha256:<64 lowercase hex>` content digest, validated on parse.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

/// A digest string that is not `sha256:` followed by 64 lowercase hex characters.
#[derive(Debug, thiserror::Error)]
#[error("invalid digest {0:?}: expected sha256:<64 lowercase hex characters>")]
pub struct DigestError(pub String);

/// A digest that does not parse: what a bundle, a registry or a flag gave.
impl crate::exit::Classify for DigestError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        Some(crate::exit::ExitClass::Input)
    }
}

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Digest(format!("sha256:{}", hex::encode(Sha256::digest(bytes))))
    }
    /// From a finished hasher.
    pub fn from_hasher(h: Sha256) -> Self {
        Digest(format!("sha256:{}", hex::encode(h.finalize())))
    }
    /// The 64 hex characters.
    pub fn hex(&self) -> &str {
        &self.0[7..]
    }
    /// The full `sha256:...` string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// Path of this blob inside an OCI layout: `blobs/sha256/<hex>`.
    pub fn layout_path(&self) -> String {
        format!("blobs/sha256/{}", self.hex())
    }
    /// From bare hex (as in a sha256sum line).
    pub fn from_hex(hex: &str) -> Result<Self, DigestError> {
        format!("sha256:{hex}").parse()
    }
}

impl FromStr for Digest {
    type Err = DigestError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let ok = s.len() == 71
            && s.starts_with("sha256:")
            && s[7..]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if ok {
            Ok(Digest(s.to_string()))
        } else {
            Err(DigestError(s.chars().take(100).collect()))
        }
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}
impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A writer adapter that hashes and counts what passes through it.
pub struct Sha256Writer<W> {
    inner: W,
    hasher: Sha256,
    count: u64,
}

impl<W> Sha256Writer<W> {
    /// Wrap `inner`.
    pub fn new(inner: W) -> Self {
        Sha256Writer {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }
    /// Digest and byte count of everything written, and the inner writer.
    pub fn finish(self) -> (Digest, u64, W) {
        (Digest::from_hasher(self.hasher), self.count, self.inner)
    }
}

impl<W: std::io::Write> std::io::Write for Sha256Writer<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// An incoming blob checked against its descriptor as it arrives: never a byte past its size
/// (refused as soon as it would be), and at the end exactly its size and digest. The one check
/// of what comes in, whoever receives it (the bundle writer, the blob cache, the in-memory
/// store); each words the mismatch in its own error.
#[derive(Clone)]
pub struct BlobCheck {
    digest: Digest,
    size: u64,
    hasher: Sha256,
    got: u64,
}

/// What an incoming blob got wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlobMismatch {
    /// More bytes than its size (`actual` so far), or fewer at the end.
    Size {
        /// The descriptor's size.
        expected: u64,
        /// The bytes that came.
        actual: u64,
    },
    /// The right size, another digest.
    Digest {
        /// The descriptor's digest.
        expected: Digest,
        /// The digest of what came.
        actual: Digest,
        /// Its size.
        size: u64,
    },
}

impl BlobCheck {
    /// Expect `size` bytes that hash to `digest`.
    pub fn new(digest: &Digest, size: u64) -> Self {
        Self::resumed(digest, size, Sha256::new(), 0)
    }
    /// Go on from `got` bytes already received and hashed into `hasher`.
    pub fn resumed(digest: &Digest, size: u64, hasher: Sha256, got: u64) -> Self {
        BlobCheck {
            digest: digest.clone(),
            size,
            hasher,
            got,
        }
    }
    /// Take the next piece: refused, and not counted, when it would pass the size.
    pub fn update(&mut self, piece: &[u8]) -> Result<(), BlobMismatch> {
        let next = self.got.saturating_add(piece.len() as u64);
        if next > self.size {
            return Err(BlobMismatch::Size {
                expected: self.size,
                actual: next,
            });
        }
        self.hasher.update(piece);
        self.got = next;
        Ok(())
    }
    /// The digest expected.
    pub fn digest(&self) -> &Digest {
        &self.digest
    }
    /// Bytes taken so far.
    pub fn received(&self) -> u64 {
        self.got
    }
    /// Throw away what was taken: the blob comes again from its first byte.
    pub fn restart(&mut self) {
        self.hasher = Sha256::new();
        self.got = 0;
    }
    /// All of it came: its size and digest must be the descriptor's.
    pub fn finish(self) -> Result<(), BlobMismatch> {
        if self.got != self.size {
            return Err(BlobMismatch::Size {
                expected: self.size,
                actual: self.got,
            });
        }
        let actual = Digest::from_hasher(self.hasher);
        if actual != self.digest {
            return Err(BlobMismatch::Digest {
                expected: self.digest,
                actual,
                size: self.got,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn parses_and_rejects() {
        let d = Digest::of(b"");
        assert_eq!(
            d.as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(d.as_str().parse::<Digest>().unwrap(), d);
        assert!("sha256:E3B0".parse::<Digest>().is_err());
        assert!("sha512:abc".parse::<Digest>().is_err());
        assert!(format!("sha256:{}/", &d.hex()[1..])
            .parse::<Digest>()
            .is_err());
    }

    /// The blob check: a piece past the size is refused at once (and not counted), a short or
    /// altered blob at the end; a resumed check goes on from the hasher it is given.
    #[test]
    fn blob_check() {
        let d = Digest::of(b"hello");
        let mut c = BlobCheck::new(&d, 5);
        c.update(b"hel").unwrap();
        assert_eq!(
            c.clone().update(b"lo!"),
            Err(BlobMismatch::Size {
                expected: 5,
                actual: 6
            })
        );
        assert_eq!(
            c.clone().finish(),
            Err(BlobMismatch::Size {
                expected: 5,
                actual: 3
            })
        );
        let mut resumed = BlobCheck::resumed(&d, 5, c.hasher.clone(), c.received());
        c.update(b"lo").unwrap();
        c.finish().unwrap();
        resumed.update(b"lp").unwrap();
        assert_eq!(
            resumed.finish(),
            Err(BlobMismatch::Digest {
                expected: d.clone(),
                actual: Digest::of(b"hellp"),
                size: 5
            })
        );
        let mut again = BlobCheck::new(&d, 5);
        again.update(b"xx").unwrap();
        again.restart();
        again.update(b"hello").unwrap();
        again.finish().unwrap();
    }
}
