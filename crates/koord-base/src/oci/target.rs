//! Where `load` pushes: a registry address with an optional path prefix (`HOST[:PORT][/PREFIX]`),
//! checked piece by piece when the flag is read, so that a typo is named with the rule it breaks
//! (the distribution reference grammar, which every registry enforces) before anything is read or
//! sent:
//!
//! - `HOST`: a host name (labels of letters, digits and `-`, joined by dots, as DNS has them), an
//!   IPv4 address, or an IPv6 address in brackets; it must look like a registry (a dot, a port,
//!   `localhost` or an IP address), or `myregistry/site` would mean Docker Hub's `myregistry`;
//! - `PORT`: a number from 1 to 65535;
//! - `PREFIX`: path components of lower-case letters and digits, joined by `.`, `_`, `__` or
//!   dashes, none of them empty.
//!
//! The same host and port rules serve `build --source` and `serve --addr` ([`split_host_port`]).

use super::{ImageRef, RefError};

/// Where a bundle is pushed: `REGISTRY[/PREFIX]`.
#[derive(Debug, Clone)]
pub struct Target {
    /// Registry host\[:port\].
    pub registry: String,
    /// Path prefix (may be empty).
    pub prefix: String,
}

/// A registry address that is not `HOST[:PORT][/PREFIX]`; each message names the flag, the value
/// and the rule that failed.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// `user:password@host`: refused, and never echoed.
    #[error("{flag} {redacted}: a registry address must not carry a user or password (it would be echoed in messages and kept in shell history and process lists): give {shape} and pass the login with --username U --password-stdin (or `docker login HOST`)")]
    Userinfo {
        /// The flag (`--registry`).
        flag: &'static str,
        /// The value with its user and password replaced.
        redacted: String,
        /// `HOST[:PORT][/PREFIX]`.
        shape: &'static str,
    },
    /// `https://host`: no scheme wanted.
    #[error("{flag} {value}: give {shape} without a scheme (HTTPS is the default; --plain-http for plain HTTP)")]
    Scheme {
        /// The flag.
        flag: &'static str,
        /// The value.
        value: String,
        /// `HOST[:PORT][/PREFIX]`.
        shape: &'static str,
    },
    /// A piece of the address breaks a rule of the reference grammar.
    #[error("{flag} {value:?}: {reason}")]
    Invalid {
        /// The flag.
        flag: &'static str,
        /// The value as given.
        value: String,
        /// The rule that failed, naming the piece, and what to give instead.
        reason: String,
    },
}

/// A `--registry` target that does not parse: the input.
impl crate::exit::Classify for TargetError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        Some(crate::exit::ExitClass::Input)
    }
}

/// `HOST[:PORT]`, split and checked by [`split_host_port`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort<'a> {
    /// The host name or IP address (an IPv6 address without its brackets).
    pub host: &'a str,
    /// The port, when one was given.
    pub port: Option<u16>,
}

/// Split and check `HOST[:PORT]` (an IPv6 address in brackets: `[::1]:5000`). `zero_port` lets
/// port 0 through (a listening address: "any free port"). The error names the piece and the rule.
pub fn split_host_port(s: &str, zero_port: bool) -> Result<HostPort<'_>, String> {
    let (host, port, bracketed) = if let Some(rest) = s.strip_prefix('[') {
        let Some((inside, after)) = rest.split_once(']') else {
            return Err(format!(
                "{s:?} opens an IPv6 address with \"[\" but never closes it with \"]\""
            ));
        };
        let port = match after {
            "" => None,
            p => match p.strip_prefix(':') {
                Some(p) => Some(p),
                None => {
                    return Err(format!(
                        "{after:?} after the IPv6 address {inside:?}: only :PORT may follow it"
                    ))
                }
            },
        };
        (inside, port, true)
    } else {
        match s.split_once(':') {
            Some((_, p)) if p.contains(':') => {
                return Err(format!(
                    "{s:?} holds more than one \":\": an IPv6 address goes in brackets ([::1]:5000)"
                ));
            }
            Some((h, p)) => (h, Some(p), false),
            None => (s, None, false),
        }
    };
    let port = match port {
        None => None,
        Some("") => return Err(format!("the port after {host:?} is empty: give a number from 1 to 65535, or leave out the \":\"")),
        Some(p) => Some(parse_port(p, zero_port)?),
    };
    if bracketed {
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("[{host}] is not an IPv6 address"));
        }
    } else {
        check_host_name(host)?;
    }
    Ok(HostPort { host, port })
}

fn parse_port(p: &str, zero_port: bool) -> Result<u16, String> {
    let low = if zero_port { 0 } else { 1 };
    match p.parse::<u16>() {
        Ok(n) if p.bytes().all(|b| b.is_ascii_digit()) && n >= low => Ok(n),
        _ => Err(format!(
            "port {p:?} is not a number from {low} to 65535{}",
            match p.bytes().find(|b| !b.is_ascii_digit()) {
                Some(b) if p.len() <= 6 => format!(" (it holds {:?})", b as char),
                _ => String::new(),
            }
        )),
    }
}

/// A host name as DNS has it (labels of letters, digits and inner `-`, 1 to 63 characters each,
/// at most 253 in all), or an IPv4 address when every label is a number.
fn check_host_name(host: &str) -> Result<(), String> {
    if host.is_empty() {
        return Err("the host name is empty: give HOST[:PORT], e.g. registry.example:5000".into());
    }
    if host.len() > 253 {
        return Err(format!(
            "the host name is {} characters long; a host name has at most 253",
            host.len()
        ));
    }
    let labels: Vec<&str> = host.split('.').collect();
    if labels.len() == 4
        && labels
            .iter()
            .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()))
    {
        return host
            .parse::<std::net::Ipv4Addr>()
            .map(|_| ())
            .map_err(|_| format!("{host:?} is not an IPv4 address (four numbers from 0 to 255)"));
    }
    for label in labels {
        if label.is_empty() {
            return Err(format!(
                "host name {host:?} has an empty label (two dots in a row, or a dot at one end)"
            ));
        }
        if let Some(c) = label
            .chars()
            .find(|c| !c.is_ascii_alphanumeric() && *c != '-')
        {
            return Err(format!(
                "host name {host:?} holds {c:?}, which a host name cannot hold (letters, digits and \"-\" between dots)"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!(
                "host name {host:?}: the label {label:?} starts or ends with \"-\""
            ));
        }
        if label.len() > 63 {
            return Err(format!(
                "host name {host:?}: a label has at most 63 characters, {label:?} has {}",
                label.len()
            ));
        }
    }
    Ok(())
}

/// One path component of a repository name: `[a-z0-9]+` joined by `.`, `_`, `__` or dashes.
fn check_path_component(c: &str, prefix: &str) -> Result<(), String> {
    const RULE: &str = "lower-case letters and digits, joined by \".\", \"_\", \"__\" or \"-\"";
    if c.is_empty() {
        return Err(format!(
            "the prefix {prefix:?} has an empty path component (two \"/\" in a row): give {}",
            suggestion(prefix)
        ));
    }
    if c.chars().any(|ch| ch.is_ascii_uppercase()) {
        let lower = c.to_ascii_lowercase();
        let hint = if check_path_component(&lower, prefix).is_ok() {
            format!(": use {lower:?}")
        } else {
            String::new()
        };
        return Err(format!(
            "repository names are lower case, and the prefix component {c:?} is not{hint}"
        ));
    }
    if let Some(ch) = c
        .chars()
        .find(|ch| !(ch.is_ascii_lowercase() || ch.is_ascii_digit() || "._-".contains(*ch)))
    {
        return Err(format!(
            "the prefix component {c:?} holds {ch:?}, which a repository name cannot hold ({RULE})"
        ));
    }
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let b = c.as_bytes();
    if !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return Err(format!(
            "the prefix component {c:?} must start and end with a lower-case letter or digit ({RULE})"
        ));
    }
    for sep in c
        .split(|ch: char| ch.is_ascii_alphanumeric())
        .filter(|s| !s.is_empty())
    {
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-');
        if !ok {
            return Err(format!(
                "the prefix component {c:?} joins its parts with {sep:?}; a separator is \".\", \"_\", \"__\" or dashes"
            ));
        }
    }
    Ok(())
}

/// The prefix with its empty components dropped and lower-cased, for "give ..." hints.
fn suggestion(prefix: &str) -> String {
    let fixed: Vec<String> = prefix
        .split('/')
        .filter(|c| !c.is_empty())
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if fixed.is_empty() {
        "HOST[:PORT][/PREFIX]".into()
    } else {
        format!("HOST[:PORT]/{}", fixed.join("/"))
    }
}

/// The longest repository name the reference grammar allows (registry and path).
const NAME_MAX: usize = 255;

impl Target {
    /// Parse `--registry HOST[:PORT][/PREFIX]`. A user or password in it is refused without
    /// being echoed.
    pub fn parse(s: &str) -> Result<Self, TargetError> {
        Target::parse_for("--registry", s)
    }

    /// Parse `HOST[:PORT][/PREFIX]` given to `flag` (named in the errors).
    pub fn parse_for(flag: &'static str, s: &str) -> Result<Self, TargetError> {
        let shape = if flag == "--source" {
            "HOST[:PORT][/PATH]"
        } else {
            "HOST[:PORT][/PREFIX]"
        };
        let (scheme, rest) = match s.split_once("://") {
            Some((sch, rest)) => (Some(sch), rest),
            None => (None, s),
        };
        // No registry address or prefix holds an `@`: whatever stands before the last one may
        // be a password (with `/` or `@` in it), so none of it is shown.
        if let Some(at) = rest.rfind('@') {
            let after = &rest[at + 1..];
            return Err(TargetError::Userinfo {
                flag,
                redacted: format!(
                    "{}USER:PASSWORD@{after}",
                    scheme.map(|x| format!("{x}://")).unwrap_or_default()
                ),
                shape,
            });
        }
        if scheme.is_some() {
            return Err(TargetError::Scheme {
                flag,
                value: s.to_string(),
                shape,
            });
        }
        let invalid = |reason: String| TargetError::Invalid {
            flag,
            value: s.to_string(),
            reason,
        };
        if s.is_empty() {
            return Err(invalid(format!(
                "give {shape}, e.g. registry.example:5000/site1"
            )));
        }
        if let Some(c) = s.chars().find(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid(format!(
                "the address holds {c:?}: white space and control characters have no place in {shape}"
            )));
        }
        let trimmed = s.trim_end_matches('/');
        let (registry, prefix) = match trimmed.split_once('/') {
            Some((r, p)) => (r, p),
            None => (trimmed, ""),
        };
        if registry.is_empty() {
            let example = match suggestion(prefix).strip_prefix("HOST[:PORT]/") {
                Some(path) => format!("registry.example:5000/{path}"),
                None => "registry.example:5000".to_string(),
            };
            return Err(invalid(format!(
                "the registry host is missing: the value starts with \"/\" (an empty path component): give {}, e.g. {example}",
                suggestion(prefix)
            )));
        }
        let hp = split_host_port(registry, false).map_err(&invalid)?;
        let looks_like_registry = hp.port.is_some()
            || hp.host.contains('.')
            || hp.host.contains(':')
            || hp.host.eq_ignore_ascii_case("localhost");
        if !looks_like_registry {
            return Err(invalid(format!(
                "{registry:?} is not taken for a registry: the registry must be a host name with a dot or a port (e.g. registry.internal or 10.0.0.5:5000; a one-word host name needs its port, {registry}:443), else {registry}/... would name a repository on Docker Hub"
            )));
        }
        if !prefix.is_empty() {
            for c in prefix.split('/') {
                check_path_component(c, prefix).map_err(&invalid)?;
            }
        }
        if trimmed.len() > NAME_MAX {
            return Err(invalid(format!(
                "the address is {} characters long; a repository name (registry and path) has at most {NAME_MAX}",
                trimmed.len()
            )));
        }
        Ok(Target {
            registry: registry.to_string(),
            prefix: prefix.to_string(),
        })
    }

    /// The host name or IP address alone (no port, no brackets), e.g. for a DNS message.
    pub fn host_name(&self) -> &str {
        split_host_port(&self.registry, false)
            .map(|hp| hp.host)
            .unwrap_or(&self.registry)
    }

    /// `REGISTRY[/PREFIX]`, the chart's new `imageRepositoryHost`.
    pub fn host_and_prefix(&self) -> String {
        if self.prefix.is_empty() {
            self.registry.clone()
        } else {
            format!("{}/{}", self.registry, self.prefix)
        }
    }

    /// The repository path of `repository` under this target (`PREFIX/repository`).
    pub fn repository(&self, repository: &str) -> String {
        if self.prefix.is_empty() {
            repository.to_string()
        } else {
            format!("{}/{repository}", self.prefix)
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

    fn reason(v: &str) -> String {
        let e = Target::parse(v).unwrap_err().to_string();
        assert!(!e.contains("x:t"), "the probe reference leaked: {e}");
        e
    }

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
            "[::1]:5000",
            "Registry.Example.COM",
            "harbor.example:443",
        ] {
            assert_eq!(Target::parse(host).unwrap().registry, host);
        }
        assert!(reason("myregistry/site").contains("a dot or a port"));
        assert!(reason("myregistry/site").contains("myregistry:443"));
    }

    #[test]
    fn each_rule_that_fails_is_named() {
        // The three typos.
        let e = reason("127.0.0.1:1500l");
        assert!(
            e.contains("port \"1500l\" is not a number from 1 to 65535"),
            "{e}"
        );
        let e = reason("/Site1");
        assert!(e.contains("registry host is missing"), "{e}");
        assert!(e.contains("starts with \"/\""), "{e}");
        assert!(e.contains("/site1"), "{e}");
        let e = reason("127.0.0.1:15001/Site1");
        assert!(e.contains("repository names are lower case"), "{e}");
        assert!(e.contains("use \"site1\""), "{e}");
        // Ports.
        for (v, says) in [
            (
                "127.0.0.1:99999",
                "port \"99999\" is not a number from 1 to 65535",
            ),
            ("127.0.0.1:0", "port \"0\" is not a number from 1 to 65535"),
            ("127.0.0.1:", "the port after \"127.0.0.1\" is empty"),
            ("registry.example:-1", "is not a number"),
        ] {
            let e = reason(v);
            assert!(e.contains(says), "{v}: {e}");
        }
        // Hosts.
        for (v, says) in [
            ("reg_istry.example:5000", "holds '_'"),
            ("registry..example", "empty label"),
            ("-registry.example", "starts or ends with \"-\""),
            ("10.0.0.256:5000", "not an IPv4 address"),
            ("[::zz]:5000", "not an IPv6 address"),
            ("[::1:5000", "never closes it"),
            ("::1:5000", "brackets"),
            (":5000", "the host name is empty"),
        ] {
            let e = reason(v);
            assert!(e.contains(says), "{v}: {e}");
        }
        // Prefix components.
        for (v, says) in [
            ("127.0.0.1:5000//site1", "empty path component"),
            ("127.0.0.1:5000/a//b", "empty path component"),
            ("127.0.0.1:5000/-a", "must start and end"),
            ("127.0.0.1:5000/a._b", "separator is"),
            ("127.0.0.1:5000/a___b", "separator is"),
            ("127.0.0.1:5000/s%20", "holds '%'"),
            ("127.0.0.1:5000/a b", "white space"),
        ] {
            let e = reason(v);
            assert!(e.contains(says), "{v}: {e}");
        }
        for ok in [
            "127.0.0.1:5000/a__b/c--d/e.f_g",
            "registry.example/site1/koord",
            "localhost:5000",
        ] {
            Target::parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        let long = format!("registry.example/{}", "a".repeat(300));
        assert!(reason(&long).contains("at most 255"));
        assert!(reason("").contains("give HOST[:PORT][/PREFIX]"));
    }

    #[test]
    fn host_port_for_listening_addresses() {
        assert_eq!(
            split_host_port("127.0.0.1:0", true).unwrap(),
            HostPort {
                host: "127.0.0.1",
                port: Some(0)
            }
        );
        assert_eq!(split_host_port("[::1]:5000", false).unwrap().host, "::1");
        assert!(split_host_port("127.0.0.1:0", false).is_err());
        assert_eq!(Target::parse("[::1]:5000").unwrap().host_name(), "::1");
        assert_eq!(
            Target::parse("locahost:15001").unwrap().host_name(),
            "locahost"
        );
    }
}
