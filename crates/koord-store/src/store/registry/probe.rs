//! The first contact with the registry `load` pushes into: is it Harbor? One `GET
//! /api/v2.0/systeminfo` (Harbor answers it anonymously, with `harbor_version`); any other answer
//! means "not Harbor" and costs nothing more. The same request tells a host name that does not
//! resolve (a typo: exit 1) from a registry that is down (exit 3), before anything is pushed.

use super::body::read_capped;
use super::client::classify_send_error;
use super::{Registry, RegistryError};
use crate::store::dns;
use crate::store::error_chain;
use std::time::Duration;

/// How long the probe waits for an answer: a registry that says nothing in that time is taken
/// for "not Harbor" (the push then finds out more, with its own retries).
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);
/// Largest systeminfo answer read (Harbor's is about 1 KiB).
const MAX_SYSTEMINFO: usize = 64 * 1024;

/// What kind of registry answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Flavor {
    /// Harbor (its `systeminfo` answered with `harbor_version`).
    Harbor {
        /// `harbor_version` as Harbor gave it (`v2.11.0-...`), or empty.
        version: String,
    },
    /// Any other registry (distribution, Zot, Nexus, Quay, `koord-bundle serve`...), or one
    /// that did not answer the probe in time.
    Other,
}

/// The probe failed in a way the push would too.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The name service says the host name does not exist.
    #[error("the registry host {name} does not resolve (the name service knows no such host; from --registry {registry}): check the spelling{hint}, and that this machine's DNS or /etc/hosts knows the name")]
    DoesNotResolve {
        /// `HOST[:PORT]` as given.
        registry: String,
        /// The host name alone.
        name: String,
        /// " (did you mean localhost?)" or "".
        hint: &'static str,
    },
    /// Unreachable, TLS, plain HTTP...: what the push would have said.
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

impl koord_base::exit::Classify for ProbeError {
    fn exit_class(&self) -> Option<koord_base::exit::ExitClass> {
        match self {
            // A name the name service does not know: a typo, most often (see the README).
            ProbeError::DoesNotResolve { .. } => Some(koord_base::exit::ExitClass::Input),
            ProbeError::Registry(r) => r.exit_class(),
        }
    }
}

impl Registry {
    /// Ask `registry` (`HOST[:PORT]`; `name` is its host name alone) whether it is Harbor. A
    /// transport failure is retried as every request is; an answer of any status is final.
    pub async fn probe(&self, registry: &str, name: &str) -> Result<Flavor, ProbeError> {
        let url = format!("{}/api/v2.0/systeminfo", self.transport.base(registry));
        // Named as the first contact it is: a TLS or connection failure here is no Harbor problem.
        let what = "the first request to the registry (GET /api/v2.0/systeminfo)";
        let answer = self
            .with_retry(what, || async {
                let sent = self
                    .transport
                    .http()
                    .get(&url)
                    .header(reqwest::header::ACCEPT, "application/json")
                    .timeout(PROBE_TIMEOUT)
                    .send()
                    .await;
                let resp = match sent {
                    Ok(r) => r,
                    Err(e) if e.is_timeout() => return Ok(None),
                    Err(e) if dns::does_not_resolve(&error_chain(&e)) => return Ok(Some(Err(()))),
                    Err(e) => return Err(classify_send_error(registry, what, &e)),
                };
                if resp.status() != reqwest::StatusCode::OK {
                    return Ok(Some(Ok(Flavor::Other)));
                }
                // A body that breaks off or is not Harbor's JSON: not Harbor.
                let body = read_capped(resp, MAX_SYSTEMINFO).await.unwrap_or_default();
                Ok(Some(Ok(harbor_version(&body)
                    .map(|version| Flavor::Harbor { version })
                    .unwrap_or(Flavor::Other))))
            })
            .await?;
        match answer {
            None => Ok(Flavor::Other),
            Some(Ok(f)) => Ok(f),
            Some(Err(())) => Err(ProbeError::DoesNotResolve {
                registry: registry.to_string(),
                name: name.to_string(),
                hint: dns::localhost_hint(name),
            }),
        }
    }
}

/// `harbor_version` of a systeminfo answer (empty when Harbor hides it), or `None` when the
/// body is not Harbor's.
fn harbor_version(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let o = v.as_object()?;
    match o.get("harbor_version") {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        // Harbor always names its authentication mode; an anonymous caller of a newer Harbor
        // may not see the version.
        _ if o.contains_key("auth_mode") && o.contains_key("registry_url") => Some(String::new()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn harbor_is_told_by_its_systeminfo() {
        assert_eq!(
            harbor_version(br#"{"harbor_version":"v2.11.0-abc","auth_mode":"db_auth"}"#),
            Some("v2.11.0-abc".into())
        );
        assert_eq!(
            harbor_version(br#"{"auth_mode":"oidc_auth","registry_url":"h.example"}"#),
            Some(String::new())
        );
        assert_eq!(
            harbor_version(br#"{"errors":[{"code":"NOT_FOUND"}]}"#),
            None
        );
        assert_eq!(harbor_version(b"404 page not found"), None);
        assert_eq!(harbor_version(b"[]"), None);
    }
}
