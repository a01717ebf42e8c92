//! Credential holders that never show their value in `Debug` (and have no `Display`).

use std::fmt;

pub use crate::store::auth::Secret;

/// Secret bytes (a PEM private key). `Debug` prints `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretBytes(Vec<u8>);

impl SecretBytes {
    /// Wrap a value.
    pub fn new(value: Vec<u8>) -> Self {
        SecretBytes(value)
    }
    /// The bytes, for the one place that uses them.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretBytes(<redacted>)")
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // typed test parses of tiny literals
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_value() {
        let s = Secret::new("hunter2-token");
        assert!(!format!("{s:?}").contains("hunter2"));
        let b = SecretBytes::new(b"-----BEGIN PRIVATE KEY-----".to_vec());
        assert!(!format!("{b:?}").contains("PRIVATE"));
        assert_eq!(s.expose(), "hunter2-token");
    }

    #[test]
    fn any_scalar_deserializes() {
        #[derive(serde::Deserialize)]
        struct U {
            password: Secret,
        }
        let u: U = serde_yaml_ng::from_str("password: 123456").unwrap();
        assert_eq!(u.password.expose(), "123456");
        let u: U = serde_yaml_ng::from_str("password: 'abc'").unwrap();
        assert_eq!(u.password.expose(), "abc");
        // A map is refused without quoting its content.
        let e = serde_yaml_ng::from_str::<U>("password: {inner: s3cr3t}")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(!e.contains("s3cr3t"), "{e}");
    }
}
