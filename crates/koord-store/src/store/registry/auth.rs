//! The pure half of registry auth: `WWW-Authenticate` challenges, token scopes, the token cache
//! and the token service's answer. No I/O here; the client drives it.

use koord_base::secret::Secret;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One challenge of a `WWW-Authenticate` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Challenge {
    /// Docker token auth: get a token from `realm`.
    Bearer {
        /// The token service URL.
        realm: String,
        /// `service` to pass to it.
        service: Option<String>,
        /// Every access the request needs (space-separated in the header).
        scopes: Vec<Scope>,
        /// `error` (`insufficient_scope`, `invalid_token`), if given.
        error: Option<String>,
    },
    /// HTTP basic auth (htpasswd registries).
    Basic,
}

/// Parse every challenge of the `WWW-Authenticate` values (a header may hold several, and
/// there may be several headers). Unknown schemes are skipped.
pub(crate) fn parse_challenges<'a>(values: impl IntoIterator<Item = &'a str>) -> Vec<Challenge> {
    let mut out = Vec::new();
    for v in values {
        for (scheme, params) in split_challenges(v) {
            if scheme.eq_ignore_ascii_case("bearer") {
                let Some(realm) = params.get("realm").filter(|r| !r.is_empty()) else {
                    continue;
                };
                out.push(Challenge::Bearer {
                    realm: realm.clone(),
                    service: params.get("service").cloned(),
                    scopes: params
                        .get("scope")
                        .map(|s| s.split_whitespace().filter_map(Scope::parse).collect())
                        .unwrap_or_default(),
                    error: params.get("error").cloned(),
                });
            } else if scheme.eq_ignore_ascii_case("basic") {
                out.push(Challenge::Basic);
            }
        }
    }
    out
}

/// `Scheme k=v, k="v", Scheme2 k=v` → [(scheme, {k: v})]; keys lower-cased.
fn split_challenges(s: &str) -> Vec<(String, BTreeMap<String, String>)> {
    let b = s.as_bytes();
    let mut i = 0;
    let mut out: Vec<(String, BTreeMap<String, String>)> = Vec::new();
    let skip_ws = |i: &mut usize| {
        while *i < b.len() && (b[*i] == b' ' || b[*i] == b'\t' || b[*i] == b',') {
            *i += 1;
        }
    };
    let token = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && !matches!(b[*i], b' ' | b'\t' | b',' | b'=') {
            *i += 1;
        }
        s[start..*i].to_string()
    };
    loop {
        skip_ws(&mut i);
        if i >= b.len() {
            break;
        }
        let word = token(&mut i);
        // `word=` is a parameter of the current challenge; a bare word starts a new one.
        let mut j = i;
        while j < b.len() && (b[j] == b' ' || b[j] == b'\t') {
            j += 1;
        }
        if j < b.len() && b[j] == b'=' && !out.is_empty() {
            i = j + 1;
            while i < b.len() && (b[i] == b' ' || b[i] == b'\t') {
                i += 1;
            }
            let value = if i < b.len() && b[i] == b'"' {
                i += 1;
                let mut v = String::new();
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' && i + 1 < b.len() {
                        i += 1;
                    }
                    // Push whole UTF-8 characters.
                    let ch_len = s[i..].chars().next().map(|c| c.len_utf8()).unwrap_or(1);
                    v.push_str(&s[i..i + ch_len]);
                    i += ch_len;
                }
                i += 1;
                v
            } else {
                token(&mut i)
            };
            if let Some(last) = out.last_mut() {
                last.1.insert(word.to_ascii_lowercase(), value);
            }
        } else if !word.is_empty() {
            out.push((word, BTreeMap::new()));
        } else {
            i += 1;
        }
    }
    out
}

/// An access scope: `repository:NAME:pull,push`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Scope {
    /// `repository`, `registry`...
    pub kind: String,
    /// The resource.
    pub name: String,
    /// The actions, sorted.
    pub actions: BTreeSet<String>,
}

impl Scope {
    /// `repository:NAME:a,b`.
    pub fn repository(name: &str, actions: &[&str]) -> Scope {
        Scope {
            kind: "repository".into(),
            name: name.to_string(),
            actions: actions.iter().map(|a| a.to_string()).collect(),
        }
    }
    /// Parse `type:name:actions` (the name may hold colons; the actions never do).
    pub fn parse(s: &str) -> Option<Scope> {
        let (kind, rest) = s.split_once(':')?;
        let (name, actions) = rest.rsplit_once(':')?;
        if kind.is_empty() || name.is_empty() {
            return None;
        }
        Some(Scope {
            kind: kind.to_string(),
            name: name.to_string(),
            actions: actions
                .split(',')
                .filter(|a| !a.is_empty())
                .map(String::from)
                .collect(),
        })
    }
    /// True when the scope asks to write.
    pub fn wants_push(&self) -> bool {
        self.actions
            .iter()
            .any(|a| a == "push" || a == "*" || a == "delete")
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let actions: Vec<&str> = self.actions.iter().map(|s| s.as_str()).collect();
        write!(f, "{}:{}:{}", self.kind, self.name, actions.join(","))
    }
}

/// The union of scope lists, one entry per resource, sorted (the token cache key).
pub(crate) fn merge_scopes<'a>(lists: impl IntoIterator<Item = &'a [Scope]>) -> Vec<Scope> {
    let mut by: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for list in lists {
        for s in list {
            by.entry((s.kind.clone(), s.name.clone()))
                .or_default()
                .extend(s.actions.iter().cloned());
        }
    }
    by.into_iter()
        .map(|((kind, name), actions)| Scope {
            kind,
            name,
            actions,
        })
        .collect()
}

/// Scopes as the cache key and as text for messages.
pub(crate) fn scopes_text(scopes: &[Scope]) -> String {
    scopes
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A token and when it stops being good.
#[derive(Clone)]
pub(crate) struct CachedToken {
    pub token: Secret,
    pub until: Instant,
}

/// Tokens by (registry, scope set). Each key has its own async lock, so requests that need the
/// same scopes at once fetch one token, not one each.
#[derive(Default)]
pub(crate) struct TokenCache {
    slots: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<CachedToken>>>>>,
}

impl TokenCache {
    /// The slot for `host` and `scopes` (lock it, check it, fill it).
    pub fn slot(
        &self,
        host: &str,
        scopes: &[Scope],
    ) -> Arc<tokio::sync::Mutex<Option<CachedToken>>> {
        let key = format!("{host} {}", scopes_text(scopes));
        match self.slots.lock() {
            Ok(mut m) => m.entry(key).or_default().clone(),
            // A poisoned map only loses the sharing, not correctness.
            Err(_) => Arc::default(),
        }
    }
}

/// The token service's answer (`token` or `access_token`, `expires_in` seconds).
#[derive(serde::Deserialize)]
pub(crate) struct TokenAnswer {
    token: Option<Secret>,
    access_token: Option<Secret>,
    expires_in: Option<u64>,
}

impl TokenAnswer {
    /// The token and how long to keep it: `expires_in` (60 s when absent, as the spec says),
    /// less a margin so a token never expires in flight.
    pub fn into_cached(self, now: Instant) -> Option<CachedToken> {
        let token = self
            .access_token
            .filter(|t| !t.is_empty())
            .or(self.token.filter(|t| !t.is_empty()))?;
        let secs = self.expires_in.unwrap_or(60).clamp(1, 24 * 3600);
        let keep = Duration::from_secs(secs) - Duration::from_secs(secs.min(20) / 2);
        Some(CachedToken {
            token,
            until: now + keep,
        })
    }
}

/// `Retry-After`: seconds, or an HTTP date (IMF-fixdate), as a wait from now.
pub(crate) fn parse_retry_after(v: &str, now: std::time::SystemTime) -> Option<Duration> {
    let v = v.trim();
    if let Ok(s) = v.parse::<u64>() {
        return Some(Duration::from_secs(s));
    }
    // "Sun, 06 Nov 1994 08:49:37 GMT"
    let parts: Vec<&str> = v.split_whitespace().collect();
    if parts.len() != 6 || parts[5] != "GMT" {
        return None;
    }
    let day: u64 = parts[1].parse().ok()?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == parts[2])? as u64
        + 1;
    let year: i64 = parts[3].parse().ok()?;
    let hms: Vec<u64> = parts[4]
        .split(':')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    // An IMF-fixdate's fields are small: anything else is not one (and would overflow below).
    if hms.len() != 3
        || !(1..=31).contains(&day)
        || !(1970..=9999).contains(&year)
        || hms[0] > 23
        || hms[1] > 59
        || hms[2] > 60
    {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let (y, m) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m as i64 + 2) / 5 + day as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    let at = days as u64 * 86400 + hms[0] * 3600 + hms[1] * 60 + hms[2];
    let now = now.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
    Some(Duration::from_secs(at.saturating_sub(now)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bearer_with_two_scopes_and_basic() {
        let c = parse_challenges([
            r#"Bearer realm="https://auth.example/token",service="reg.example",scope="repository:site/a:pull,push repository:site/b:pull",error="insufficient_scope""#,
            r#"Basic realm="koord-bundle-test""#,
        ]);
        assert_eq!(c.len(), 2);
        let Challenge::Bearer {
            realm,
            service,
            scopes,
            error,
        } = &c[0]
        else {
            panic!("{c:?}")
        };
        assert_eq!(realm, "https://auth.example/token");
        assert_eq!(service.as_deref(), Some("reg.example"));
        assert_eq!(
            scopes_text(scopes),
            "repository:site/a:pull,push repository:site/b:pull"
        );
        assert_eq!(error.as_deref(), Some("insufficient_scope"));
        assert_eq!(c[1], Challenge::Basic);
        // Several challenges in one header, unquoted values, odd spacing.
        let c = parse_challenges([r#"Newauth realm="x", Bearer realm=https://a/t , service = s"#]);
        assert_eq!(
            c,
            vec![Challenge::Bearer {
                realm: "https://a/t".into(),
                service: Some("s".into()),
                scopes: vec![],
                error: None
            }]
        );
        assert!(parse_challenges(["Bearer service=\"x\""]).is_empty());
    }

    #[test]
    fn scopes_merge_per_resource() {
        let a = [Scope::repository("t", &["pull", "push"])];
        let b = [
            Scope::parse("repository:s:pull").unwrap(),
            Scope::parse("repository:t:pull").unwrap(),
        ];
        let m = merge_scopes([&a[..], &b[..]]);
        assert_eq!(scopes_text(&m), "repository:s:pull repository:t:pull,push");
        assert!(m[1].wants_push() && !m[0].wants_push());
        let p = Scope::parse("repository:127.0.0.1:5000/x:pull").unwrap();
        assert_eq!(p.name, "127.0.0.1:5000/x");
    }

    #[test]
    fn token_answers_and_retry_after() {
        let now = Instant::now();
        let a: TokenAnswer =
            serde_json::from_str(r#"{"token":"t1","access_token":"t2","expires_in":300}"#).unwrap();
        let c = a.into_cached(now).unwrap();
        assert_eq!(c.token.expose(), "t2");
        assert!(c.until > now + Duration::from_secs(280));
        let a: TokenAnswer = serde_json::from_str(r#"{"token":"t1"}"#).unwrap();
        assert!(a.into_cached(now).unwrap().until > now + Duration::from_secs(45));
        let a: TokenAnswer = serde_json::from_str(r#"{"token":""}"#).unwrap();
        assert!(a.into_cached(now).is_none());
        let t0 = std::time::UNIX_EPOCH + Duration::from_secs(784111777 - 5);
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", t0),
            Some(Duration::from_secs(5))
        );
        assert_eq!(parse_retry_after(" 3 ", t0), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after("soon", t0), None);
        // Fields no date has: they overflowed the arithmetic (a panic in a debug build).
        for v in [
            "Sun, 06 Nov 1994 99999999999999999:49:37 GMT",
            "Sun, 06 Nov 9223372036854775807 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:18446744073709551615 GMT",
        ] {
            assert_eq!(parse_retry_after(v, t0), None, "{v}");
        }
    }
}
