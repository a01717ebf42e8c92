//! Credential holders that never show their value in `Debug` or `Display`: registry passwords
//! and tokens, kubeconfig tokens and keys, helm's registry login. Layer 1: the registry store,
//! the cluster client and helm all hold them.

use std::fmt;

/// A secret string whose `Debug`/`Display` are redacted.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wrap a secret.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
    /// True when the value is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Any YAML/JSON scalar becomes the secret's text (a numeric password stays a password, and a
/// parse error never quotes it).
impl<'de> serde::Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Secret;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Secret, E> {
                Ok(Secret(v.to_string()))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Secret, E> {
                Ok(Secret(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Secret, E> {
                Ok(Secret(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Secret, E> {
                Ok(Secret(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Secret, E> {
                Ok(Secret(v.to_string()))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Secret, E> {
                Ok(Secret(v.to_string()))
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Secret, E> {
                Ok(Secret(String::new()))
            }
            fn visit_none<E: serde::de::Error>(self) -> Result<Secret, E> {
                Ok(Secret(String::new()))
            }
        }
        d.deserialize_any(V)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}
impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

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
