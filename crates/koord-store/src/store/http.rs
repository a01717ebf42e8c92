//! Plain HTTP(S) fetches for the Helm repository (index and chart archive), with the same retry
//! policy as registry calls. A repository may also be a local directory.

use super::error_chain as chain;
use super::retry::{self, Failure, RetryPolicy};
use std::path::PathBuf;

/// A fetch failure, naming the URL.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Transport or status failure.
    #[error("GET {url}: {message}")]
    Get {
        /// The URL.
        url: String,
        /// What went wrong.
        message: String,
        /// A transport failure, 5xx, 408 or 429 that outlived the retries (another try later may
        /// work), as opposed to an answer such as 404.
        transient: bool,
    },
    /// Client setup failure.
    #[error("HTTP client setup: {0}")]
    Setup(String),
}

impl koord_base::exit::Classify for HttpError {
    fn exit_class(&self) -> Option<koord_base::exit::ExitClass> {
        use koord_base::exit::ExitClass as C;
        match self {
            // Unreachable, or failing on its side, after the retries.
            HttpError::Get { .. } if self.is_transient() => Some(C::Machine),
            // Not there, refused, not what was asked for; a client that cannot be set up.
            _ => Some(C::Input),
        }
    }
}

/// A small HTTP client for Helm repositories.
pub struct HttpFetcher {
    client: reqwest::Client,
    retry: RetryPolicy,
}

impl HttpError {
    /// The repository could not be reached, or failed on its side, after every retry.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            HttpError::Get {
                transient: true,
                ..
            }
        )
    }
}

impl HttpFetcher {
    /// A client trusting the system roots plus `ca_files`.
    pub fn new(ca_files: &[PathBuf], retry: RetryPolicy) -> Result<Self, HttpError> {
        let mut b = reqwest::Client::builder()
            .user_agent(concat!("koord-bundle/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(std::time::Duration::from_secs(15))
            .read_timeout(std::time::Duration::from_secs(60));
        for c in super::read_ca_files(ca_files).map_err(HttpError::Setup)? {
            b = b.add_root_certificate(c);
        }
        Ok(HttpFetcher {
            client: b.build().map_err(|e| HttpError::Setup(e.to_string()))?,
            retry,
        })
    }

    /// GET `url` (or read it, for a local path) into memory, at most `max` bytes: the read
    /// stops as soon as the body passes `max`, whether the server announced a length or sends
    /// it chunked (an endless body costs `max` bytes of memory, no more).
    pub async fn get(&self, url: &str, max: usize) -> Result<Vec<u8>, HttpError> {
        let err = |message: String, transient: bool| HttpError::Get {
            url: url.to_string(),
            message,
            transient,
        };
        if let Some(path) = url
            .strip_prefix("file://")
            .or_else(|| (!url.contains("://")).then_some(url))
        {
            return koord_base::bounded::open_input(std::path::Path::new(path))
                .and_then(|f| koord_base::bounded::read_bounded(f, max))
                .map_err(|e| err(e.to_string(), false));
        }
        // Why an attempt failed: what the retry policy reads, transient (a try later may
        // work), the text.
        struct Fail {
            failure: Failure,
            transient: bool,
            message: String,
        }
        let final_fail = |message: String| Fail {
            failure: Failure::FINAL,
            transient: false,
            message,
        };
        let transport = |e: &reqwest::Error| {
            // As for registries: refused on a loopback address or no such host is said at
            // once, with a hint, instead of after every retry.
            let host = reqwest::Url::parse(url)
                .map(|u| crate::store::registry::host_of(&u, url).into_owned())
                .unwrap_or_else(|_| url.to_string());
            match crate::store::registry::classify_send_error(&host, url, e) {
                crate::store::RegistryError::Transport {
                    message, retryable, ..
                } => Fail {
                    failure: Failure {
                        retryable,
                        ..Failure::FINAL
                    },
                    transient: true,
                    message,
                },
                _ => final_fail(chain(e)),
            }
        };
        let attempt = || async {
            let resp = self
                .client
                .get(url)
                .send()
                .await
                .map_err(|e| transport(&e))?;
            let status = resp.status();
            if !status.is_success() {
                // The registries' rules: which statuses are worth another try, Retry-After.
                let failure = crate::store::registry::status_failure(&resp);
                return Err(Fail {
                    failure,
                    transient: failure.retryable,
                    message: format!("HTTP {status}"),
                });
            }
            match crate::store::registry::body::read_capped(resp, max).await {
                Ok(body) => Ok(body.to_vec()),
                Err(crate::store::registry::body::BodyError::Read(e)) => Err(transport(&e)),
                Err(crate::store::registry::body::BodyError::TooLarge(_)) => Err(final_fail(
                    format!("larger than the {max} bytes allowed for it"),
                )),
            }
        };
        retry::run(&self.retry, url, attempt, |f| f.failure, |_, _, _| {})
            .await
            .map_err(|(f, made)| {
                let tries = match made {
                    1 => "gave up after 1 attempt".to_string(),
                    n => format!("after {n} attempts"),
                };
                let message = if f.transient {
                    format!("{} ({tries})", f.message)
                } else {
                    f.message
                };
                err(message, f.transient)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same `--ca-file` is refused by the Helm repository client as by the registry client
    /// when it holds no certificate (it was silently trusted as nothing here).
    #[test]
    fn a_ca_file_without_a_certificate_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("ca.crt");
        std::fs::write(&f, "not a certificate\n").unwrap();
        let e = HttpFetcher::new(std::slice::from_ref(&f), RetryPolicy::default())
            .err()
            .expect("refused");
        assert!(e.to_string().contains("holds no PEM certificate"), "{e}");
        assert!(e.to_string().contains(&f.display().to_string()), "{e}");
    }
}
