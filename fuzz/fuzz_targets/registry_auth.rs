#![no_main]
//! What a registry and its token service answer, read by the registry client: `WWW-Authenticate`
//! challenges and their scopes, the token service's JSON, `Retry-After`, error bodies.
//!
//! Input: up to four parts separated by NUL bytes: `WWW-Authenticate` values (one per line),
//! a token service answer, a `Retry-After` value, an error body (its status from its length).
//!
//! Checked on top of "no panic" (a 1 MiB header included, within `-max_len`):
//! * a Bearer challenge the client accepts has a realm;
//! * every scope the client read prints as text that reads back as itself;
//! * merging scope lists is idempotent (the token cache's key is stable);
//! * a token is kept at most a day, and only when there is one.

use koord_bundle::store::registry::fuzzing;
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(4, |&b| b == 0);
    let headers = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let token = parts.next().unwrap_or_default();
    let retry = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let body = parts.next().unwrap_or_default();

    let values: Vec<&str> = headers.lines().collect();
    let read = fuzzing::challenges(&values);
    let mut lists = Vec::new();
    for (realm, _service, scopes) in read.into_iter().flatten() {
        assert!(
            !realm.is_empty(),
            "a Bearer challenge without a realm was accepted"
        );
        for s in &scopes {
            assert_eq!(
                fuzzing::scope(s).as_deref(),
                Some(s.as_str()),
                "scope {s:?} does not read back as itself"
            );
        }
        lists.push(scopes);
    }
    let merged = fuzzing::merged(&lists);
    let again: Vec<String> = merged
        .split(' ')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    assert_eq!(
        fuzzing::merged(&[again]),
        merged,
        "merging is not idempotent"
    );

    if let Some((len, keep)) = fuzzing::token_answer(token) {
        assert!(len > 0, "an empty token was kept");
        assert!(
            keep <= Duration::from_secs(24 * 3600),
            "a token kept {keep:?}"
        );
    }
    let _ = fuzzing::retry_after(&retry);
    let _ = fuzzing::error_text(400 + (body.len() % 200) as u16, body);
});
