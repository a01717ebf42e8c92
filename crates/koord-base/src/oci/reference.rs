use std::fmt;

/// An image reference split into registry, repository and tag/digest, normalised the way
/// Docker does (`koordinatorsh/x` is `docker.io/koordinatorsh/x`, `busybox` is
/// `docker.io/library/busybox`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ImageRef {
    /// Registry host, with port if any (`docker.io`, `127.0.0.1:5000`).
    pub registry: String,
    /// Repository path (`koordinator-sh/koordlet`).
    pub repository: String,
    /// Tag, if any.
    pub tag: Option<String>,
    /// Digest, if any.
    pub digest: Option<String>,
}

/// A reference that cannot be parsed.
#[derive(Debug, thiserror::Error)]
#[error("invalid image reference {reference:?}: {reason}")]
pub struct RefError {
    /// The input.
    pub reference: String,
    /// What is wrong.
    pub reason: &'static str,
}

/// An image reference that does not parse: the input.
impl crate::exit::Classify for RefError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        Some(crate::exit::ExitClass::Input)
    }
}

impl ImageRef {
    /// Parse `[host[:port]/]path[:tag][@digest]`.
    pub fn parse(s: &str) -> Result<Self, RefError> {
        let err = |reason| RefError {
            reference: s.to_string(),
            reason,
        };
        if s.is_empty() || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(err("empty or contains white space"));
        }
        let (rest, digest) = match s.rsplit_once('@') {
            Some((r, d)) => (r, Some(d.to_string())),
            None => (s, None),
        };
        if let Some(d) = &digest {
            let valid = d.split_once(':').is_some_and(|(alg, hex)| {
                !alg.is_empty()
                    && alg.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b"+._-".contains(&b)
                    })
                    && hex.len() >= 32
                    && hex.bytes().all(|b| b.is_ascii_hexdigit())
            });
            if !valid || rest.contains('@') {
                // Most likely `user:password@host/...`: show none of what stands before the `@`.
                return Err(RefError {
                    reference: format!("USER:PASSWORD@{d}"),
                    reason: "`@` must be followed by a digest (sha256:<hex>); a user or password has no place in an image reference: log in with `docker login HOST` instead",
                });
            }
        }
        let (name, tag) = match rest.rfind(':') {
            Some(i) if !rest[i + 1..].contains('/') => {
                (&rest[..i], Some(rest[i + 1..].to_string()))
            }
            _ => (rest, None),
        };
        let (registry, repository) = match name.split_once('/') {
            Some((first, path))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), path.to_string())
            }
            _ => ("docker.io".to_string(), name.to_string()),
        };
        let repository = if registry == "docker.io" && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository
        };
        let valid_repo = !repository.is_empty()
            && repository.split('/').all(|c| {
                !c.is_empty()
                    && c.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b)
                    })
            });
        if !valid_repo {
            return Err(err("repository must be lowercase path components"));
        }
        if tag
            .as_deref()
            .is_some_and(|t| t.is_empty() || t.len() > 128)
        {
            return Err(err("tag must be 1 to 128 characters"));
        }
        if tag.is_none() && digest.is_none() {
            return Ok(ImageRef {
                registry,
                repository,
                tag: Some("latest".into()),
                digest,
            });
        }
        Ok(ImageRef {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// `tag` or `digest` as used in a manifest URL (digest wins).
    pub fn reference(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// `ref@digest`: how an image pinned to its digest is written (the post-renderer's pins,
/// `load --json`'s `images`, diff's pins).
pub fn pinned(reference: &str, digest: &str) -> String {
    format!("{reference}@{digest}")
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn normalises() {
        let r = ImageRef::parse("koordinatorsh/koordlet:v0.4.1").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("docker.io", "koordinatorsh/koordlet")
        );
        let r = ImageRef::parse("127.0.0.1:5000/koordinator-sh/koordlet:v1.8.0").unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.tag.as_deref(), Some("v1.8.0"));
        let r = ImageRef::parse("localhost:5000/a/b").unwrap();
        assert_eq!(r.tag.as_deref(), Some("latest"));
        assert_eq!(
            ImageRef::parse("busybox").unwrap().repository,
            "library/busybox"
        );
        assert!(ImageRef::parse("Bad/Name").is_err());
        assert!(ImageRef::parse("a b").is_err());
        let d = format!("sha256:{}", "ab".repeat(32));
        let r = ImageRef::parse(&format!("ghcr.io/x/y@{d}")).unwrap();
        assert_eq!(r.reference(), d);
        let e = ImageRef::parse("koord:S3cr3t@127.0.0.1:5000/x:y").unwrap_err();
        assert!(!e.to_string().contains("S3cr3t"), "{e}");
        assert!(ImageRef::parse("ghcr.io/x/y@sha256:abc").is_err());
    }
}
