//! Where `load` pushes: a registry address with an optional path prefix (`HOST[:PORT][/PREFIX]`).

use super::{ImageRef, RefError};

/// Where a bundle is pushed: `REGISTRY[/PREFIX]`.
#[derive(Debug, Clone)]
pub struct Target {
    /// Registry host\[:port\].
    pub registry: String,
    /// Path prefix (may be empty).
    pub prefix: String,
}

/// A `--registry` value that is not `HOST[:PORT][/PREFIX]`.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// `user:password@host`: refused, and never echoed.
    #[error("--registry {redacted}: a registry address must not carry a user or password (it would be echoed in messages and kept in shell history and process lists): give HOST[:PORT][/PREFIX] and pass the login with --username U --password-stdin (or `docker login HOST`)")]
    Userinfo {
        /// The value with its user and password replaced.
        redacted: String,
    },
    /// `https://host`: no scheme wanted.
    #[error("--registry {value}: give HOST[:PORT][/PREFIX] without a scheme (HTTPS is the default; --plain-http for plain HTTP)")]
    Scheme {
        /// The value.
        value: String,
    },
    /// Not a registry address.
    #[error(transparent)]
    Ref(#[from] RefError),
}

impl Target {
    /// Parse `HOST[:PORT][/PREFIX]`. A user or password in it is refused without being echoed.
    pub fn parse(s: &str) -> Result<Self, TargetError> {
        let (scheme, rest) = match s.split_once("://") {
            Some((sch, rest)) => (Some(sch), rest),
            None => (None, s),
        };
        // No registry address or prefix holds an `@`: whatever stands before the last one may
        // be a password (with `/` or `@` in it), so none of it is shown.
        if let Some(at) = rest.rfind('@') {
            let after = &rest[at + 1..];
            return Err(TargetError::Userinfo {
                redacted: format!(
                    "{}USER:PASSWORD@{after}",
                    scheme.map(|x| format!("{x}://")).unwrap_or_default()
                ),
            });
        }
        if scheme.is_some() {
            return Err(TargetError::Scheme {
                value: s.to_string(),
            });
        }
        let s = s.trim_end_matches('/');
        let (registry, prefix) = match s.split_once('/') {
            Some((r, p)) => (r.to_string(), p.to_string()),
            None => (s.to_string(), String::new()),
        };
        // Validate by parsing a reference under it: a first component that the reference
        // parser does not take for a host (no dot, no port, not localhost) is no registry.
        let probe = ImageRef::parse(&format!(
            "{registry}/{}x:t",
            if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            }
        ))?;
        if probe.registry != registry {
            return Err(RefError {
                reference: s.to_string(),
                reason: "the registry must be a host name with a dot or a port (e.g. registry.internal or 10.0.0.5:5000)",
            }
            .into());
        }
        Ok(Target { registry, prefix })
    }
    /// `REGISTRY[/PREFIX]`, the chart's new `imageRepositoryHost`.
    pub fn host_and_prefix(&self) -> String {
        if self.prefix.is_empty() {
            self.registry.clone()
        } else {
            format!("{}/{}", self.registry, self.prefix)
        }
    }
    /// The reference of `repository:tag` under this target.
    pub fn image(&self, repository: &str, tag: &str) -> Result<ImageRef, RefError> {
        ImageRef::parse(&format!("{}/{repository}:{tag}", self.host_and_prefix()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_refuses_userinfo_without_echoing_it() {
        for v in [
            "user:s3cr3t@127.0.0.1:5000/site",
            "https://user:s3cr3t@127.0.0.1:5000/site",
            "user:s3/cr@3t@registry.example",
        ] {
            let e = Target::parse(v).unwrap_err().to_string();
            assert!(!e.contains("s3"), "{e}");
            assert!(e.contains("--password-stdin"), "{e}");
        }
        assert!(Target::parse("https://registry.example/site")
            .unwrap_err()
            .to_string()
            .contains("without a scheme"));
        let t = Target::parse("127.0.0.1:5000/site/").unwrap();
        assert_eq!(t.host_and_prefix(), "127.0.0.1:5000/site");
        for host in [
            "localhost",
            "docker.io",
            "registry.internal",
            "10.0.0.5:5000",
        ] {
            assert_eq!(Target::parse(host).unwrap().registry, host);
        }
        assert!(Target::parse("myregistry/site")
            .unwrap_err()
            .to_string()
            .contains("a dot or a port"));
    }
}
