//! Registry credentials: `--username`/`--password-stdin`, or the user's container auth files
//! (`$REGISTRY_AUTH_FILE`, `$DOCKER_CONFIG/config.json`, `~/.docker/config.json`). Secrets never
//! appear in `Debug` or `Display`.

use base64::Engine as _;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

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

/// Username and password for one registry.
#[derive(Debug, Clone)]
pub struct Login {
    /// User name.
    pub username: String,
    /// Password or token.
    pub password: Secret,
}

/// Credentials by registry host.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    by_host: BTreeMap<String, Login>,
    /// Where they were read from (for messages; never the secrets).
    pub origins: Vec<PathBuf>,
}

/// An auth file that exists but cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read registry auth file {path}: {reason}")]
pub struct AuthFileError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong (never the file's content).
    pub reason: String,
}

impl Credentials {
    /// Add a login for `host`.
    pub fn insert(&mut self, host: &str, login: Login) {
        self.by_host.insert(normalise_host(host), login);
    }

    /// The login for `host`, if any.
    pub fn get(&self, host: &str) -> Option<&Login> {
        self.by_host.get(&normalise_host(host))
    }

    /// Read the auth files that exist, in the order given (earlier wins).
    pub fn from_files(paths: &[PathBuf]) -> Result<Self, AuthFileError> {
        let mut creds = Credentials::default();
        for path in paths.iter().rev() {
            if path.is_file() {
                creds.read_file(path)?;
                creds.origins.push(path.clone());
            }
        }
        Ok(creds)
    }

    fn read_file(&mut self, path: &Path) -> Result<(), AuthFileError> {
        let err = |reason: String| AuthFileError {
            path: path.to_path_buf(),
            reason,
        };
        let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        let doc: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| err(format!("not JSON ({e})")))?;
        let Some(auths) = doc.get("auths").and_then(|a| a.as_object()) else {
            return Ok(());
        };
        for (host, entry) in auths {
            let login = if let Some(auth) = entry.get("auth").and_then(|a| a.as_str()) {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(auth.trim())
                    .map_err(|_| err(format!("the `auth` of {host} is not base64")))?;
                let text = String::from_utf8(decoded)
                    .map_err(|_| err(format!("the `auth` of {host} is not UTF-8")))?;
                let Some((u, p)) = text.split_once(':') else {
                    return Err(err(format!("the `auth` of {host} is not user:password")));
                };
                Login {
                    username: u.to_string(),
                    password: Secret::new(p.to_string()),
                }
            } else {
                match (
                    entry.get("username").and_then(|v| v.as_str()),
                    entry.get("password").and_then(|v| v.as_str()),
                ) {
                    (Some(u), Some(p)) => Login {
                        username: u.into(),
                        password: Secret::new(p),
                    },
                    _ => continue,
                }
            };
            self.insert(host, login);
        }
        Ok(())
    }
}

/// `https://index.docker.io/v1/` and friends all mean `docker.io`.
fn normalise_host(host: &str) -> String {
    let h = host
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let h = h.split('/').next().unwrap_or(h);
    match h {
        "index.docker.io" | "registry-1.docker.io" => "docker.io".to_string(),
        _ => h.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn reads_docker_config_and_redacts() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        let auth = base64::engine::general_purpose::STANDARD.encode("koord:s3cret");
        std::fs::write(&p, format!(r#"{{"auths":{{"127.0.0.1:5001":{{"auth":"{auth}"}},"https://index.docker.io/v1/":{{"auth":"{auth}"}}}}}}"#)).unwrap();
        let c = Credentials::from_files(&[p]).unwrap();
        let l = c.get("127.0.0.1:5001").unwrap();
        assert_eq!(l.username, "koord");
        assert_eq!(l.password.expose(), "s3cret");
        assert!(c.get("docker.io").is_some());
        assert!(!format!("{c:?}").contains("s3cret"));
    }
}
