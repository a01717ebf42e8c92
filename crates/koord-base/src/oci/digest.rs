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
}
