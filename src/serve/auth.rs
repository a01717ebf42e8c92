//! Basic auth for `serve`: users and bcrypt hashes from an htpasswd file.

use super::ServeError;
use sha2::Digest as _;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Mutex;

/// Users and bcrypt hashes from an htpasswd file (`htpasswd -B` entries).
pub struct Htpasswd {
    users: BTreeMap<String, String>,
    /// Hashes of `Authorization` values already accepted (bcrypt is slow by design).
    accepted: Mutex<HashSet<[u8; 32]>>,
}

impl std::fmt::Debug for Htpasswd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Htpasswd")
            .field("users", &self.users.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// An htpasswd file of a few thousand users is well under a MiB.
const MAX_HTPASSWD_FILE: usize = 16 * 1024 * 1024;

impl Htpasswd {
    /// Read an htpasswd file. Only bcrypt entries (`$2y$`, `$2a$`, `$2b$`) are accepted; any
    /// other kind (MD5 `$apr1$`, `{SHA}`, crypt, plain) is an error naming the line.
    pub fn load(path: &Path) -> Result<Htpasswd, ServeError> {
        // Opened as every input file is (a FIFO is refused, not waited on), read to a bound.
        let bytes =
            crate::bounded::read_file_bounded(path, MAX_HTPASSWD_FILE).map_err(|source| {
                ServeError::Io {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
        let text = String::from_utf8(bytes).map_err(|_| ServeError::Htpasswd {
            path: path.to_path_buf(),
            reason: "not UTF-8 text".into(),
        })?;
        Self::parse(&text).map_err(|reason| ServeError::Htpasswd {
            path: path.to_path_buf(),
            reason,
        })
    }

    /// Parse htpasswd text (see [`Htpasswd::load`]).
    pub fn parse(text: &str) -> Result<Htpasswd, String> {
        let mut users = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((user, hash)) = line.split_once(':') else {
                return Err(format!("line {}: not USER:HASH", n + 1));
            };
            if user.is_empty() {
                return Err(format!("line {}: empty user name", n + 1));
            }
            let kind = if hash.starts_with("$apr1$") {
                Some("MD5 ($apr1$)")
            } else if hash.starts_with("{SHA}") {
                Some("SHA-1 ({SHA})")
            } else if hash.starts_with("$5$") || hash.starts_with("$6$") {
                Some("SHA-crypt")
            } else {
                None
            };
            let bcrypt = ["$2y$", "$2a$", "$2b$"].iter().any(|p| hash.starts_with(p))
                && hash.parse::<bcrypt::HashParts>().is_ok();
            if !bcrypt {
                return Err(format!(
                    "line {} (user {user}): {} entry; only bcrypt is supported: re-create it with htpasswd -B",
                    n + 1,
                    kind.unwrap_or("not a bcrypt")
                ));
            }
            users.entry(user.to_string()).or_insert(hash.to_string());
        }
        if users.is_empty() {
            return Err("no users".into());
        }
        Ok(Htpasswd {
            users,
            accepted: Mutex::new(HashSet::new()),
        })
    }

    /// The user names.
    pub fn users(&self) -> impl Iterator<Item = &str> {
        self.users.keys().map(String::as_str)
    }

    /// Check an `Authorization` header value (blocking: bcrypt).
    pub(crate) fn check(&self, authorization: &[u8]) -> bool {
        use base64::Engine as _;
        let key: [u8; 32] = sha2::Sha256::digest(authorization).into();
        if self.accepted.lock().is_ok_and(|s| s.contains(&key)) {
            return true;
        }
        // The scheme is case-insensitive (RFC 9110 11.1): `Basic`, `basic`, `BASIC`.
        let authorization = authorization.trim_ascii_start();
        let Some(b64) = authorization
            .get(..6)
            .filter(|scheme| scheme.eq_ignore_ascii_case(b"basic "))
            .map(|_| &authorization[6..])
        else {
            return false;
        };
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(b64.trim_ascii()) else {
            return false;
        };
        let Ok(decoded) = String::from_utf8(decoded) else {
            return false;
        };
        let Some((user, password)) = decoded.split_once(':') else {
            return false;
        };
        let ok = match self.users.get(user) {
            Some(hash) => bcrypt::verify(password, hash).unwrap_or(false),
            None => {
                // Same work for an unknown user, so timing does not tell users apart.
                if let Some(any) = self.users.values().next() {
                    let _ = bcrypt::verify(password, any);
                }
                false
            }
        };
        if ok {
            if let Ok(mut s) = self.accepted.lock() {
                if s.len() >= 1024 {
                    s.clear();
                }
                s.insert(key);
            }
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn htpasswd_accepts_bcrypt_only() {
        let hash = bcrypt::hash_with_result("pw", 4)
            .unwrap()
            .format_for_version(bcrypt::Version::TwoY);
        let h = Htpasswd::parse(&format!("# comment\n\nkoord:{hash}\n")).unwrap();
        assert_eq!(h.users().collect::<Vec<_>>(), ["koord"]);
        use base64::Engine as _;
        let basic = |u: &str, p: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        };
        assert!(h.check(basic("koord", "pw").as_bytes()));
        assert!(h.check(basic("koord", "pw").as_bytes()), "cached");
        assert!(!h.check(basic("koord", "nope").as_bytes()));
        assert!(!h.check(basic("other", "pw").as_bytes()));
        assert!(!h.check(b"Bearer x"));
        assert!(!h.check(b"Basic !!!"));
        // The scheme is case-insensitive.
        for scheme in ["BASIC", "basic", "bAsIc"] {
            let v = basic("koord", "pw").replacen("Basic", scheme, 1);
            assert!(h.check(v.as_bytes()), "{v}");
        }
        for (line, needle) in [
            ("u:$apr1$abc$def", "MD5"),
            ("u:{SHA}abcdef=", "SHA-1"),
            ("u:plain", "not a bcrypt"),
            ("u:$2y$05$short", "not a bcrypt"),
            ("nocolon", "USER:HASH"),
        ] {
            let e = Htpasswd::parse(line).unwrap_err();
            assert!(e.contains(needle) && e.contains("line 1"), "{line}: {e}");
            if line.contains(':') {
                assert!(e.contains("htpasswd -B"), "{e}");
            }
        }
        assert!(Htpasswd::parse("\n# only\n").is_err());
    }
}
