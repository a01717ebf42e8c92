//! One retry policy for every call over the network: the registry client's requests, its blob
//! stream (which resumes a broken transfer) and the Helm repository fetcher. Exponential
//! backoff with jitter on transient failures (connection errors, 5xx, 408, 429), a bounded
//! number of tries, and a server's `Retry-After` honoured up to [`MAX_RETRY_AFTER`].
//!
//! The jitter comes from a seeded generator ([`fastrand`], already in the tree through
//! tempfile), not from the clock: one generator per call, seeded from the policy's seed and
//! what the call fetches, so concurrent calls do not back off in step, and a test that fixes
//! the seed gets the same waits every run.

use std::future::Future;
use std::hash::{Hash as _, Hasher as _};
use std::time::Duration;

/// The longest wait a server's `Retry-After` is honoured with: a registry asking for an hour
/// gets a minute, and then the try (the tries are bounded anyway).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The least wait after a 429 ("too many requests") that says no `Retry-After`.
pub const MIN_THROTTLED_WAIT: Duration = Duration::from_secs(1);

/// How often and how long to retry.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Total tries, the first included.
    pub tries: u32,
    /// First backoff.
    pub base: Duration,
    /// Backoff ceiling (before a `Retry-After`, which may be longer).
    pub max: Duration,
    /// Seed of the jitter: random for each process by default (two runs against one registry
    /// do not retry in step); fixed in tests.
    pub seed: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            tries: 6,
            base: Duration::from_millis(200),
            max: Duration::from_secs(10),
            seed: fastrand::u64(..),
        }
    }
}

/// What a failed try says about another one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Failure {
    /// Worth another try (a transient failure; false: a refusal, a wrong address, bad content).
    pub retryable: bool,
    /// The server's `Retry-After`, if it sent one.
    pub retry_after: Option<Duration>,
    /// The server said 429: slow down.
    pub throttled: bool,
}

impl Failure {
    /// A failure not worth another try.
    pub const FINAL: Failure = Failure {
        retryable: false,
        retry_after: None,
        throttled: false,
    };
}

/// The tries of one call: counts them and says how long to wait before the next.
#[derive(Debug)]
pub struct Tries {
    policy: RetryPolicy,
    made: u32,
    rng: fastrand::Rng,
}

impl Tries {
    /// The tries of the call that fetches `what` (it seeds the jitter with the policy's seed).
    pub fn new(policy: &RetryPolicy, what: &str) -> Self {
        // `DefaultHasher::new` has fixed keys (unlike `RandomState`'s): the same `what` gives
        // the same salt in every run of one build, so a test's fixed seed fixes the waits.
        let mut salt = std::hash::DefaultHasher::new();
        what.hash(&mut salt);
        Tries {
            policy: *policy,
            made: 0,
            rng: fastrand::Rng::with_seed(policy.seed ^ salt.finish()),
        }
    }

    /// A try failed with `f`: the wait before the next one, or `None` when it is not worth
    /// one or the tries are spent.
    pub fn failed(&mut self, f: Failure) -> Option<Duration> {
        self.made += 1;
        if !f.retryable || self.made >= self.policy.tries.max(1) {
            return None;
        }
        let backoff = self.backoff();
        Some(match f.retry_after {
            Some(after) => after.min(MAX_RETRY_AFTER).max(backoff),
            None if f.throttled => backoff.max(MIN_THROTTLED_WAIT),
            None => backoff,
        })
    }

    /// The try that failed had made progress (a stream moved on before it broke): it does
    /// not spend one of the tries. Called before [`Tries::failed`].
    pub fn progressed(&mut self) {
        self.made = self.made.saturating_sub(1);
    }

    /// Tries made (and failed) so far.
    pub fn made(&self) -> u32 {
        self.made
    }

    /// Exponential backoff before retry number `made`, less up to half of it as jitter.
    fn backoff(&mut self) -> Duration {
        let exp = self.policy.base.saturating_mul(1u32 << self.made.min(16));
        let capped = exp.min(self.policy.max);
        capped.saturating_sub(capped.mul_f64(self.rng.f64() / 2.0))
    }
}

/// Run `f` until it succeeds, fails for good, or the tries are spent; `failure` reads an
/// error, `on_retry` hears of each retry (the error, the tries made, the wait) before the
/// wait. A final error comes back with the tries made.
pub async fn run<T, E, F, Fut>(
    policy: &RetryPolicy,
    what: &str,
    mut f: F,
    failure: impl Fn(&E) -> Failure,
    mut on_retry: impl FnMut(&E, u32, Duration),
) -> Result<T, (E, u32)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut tries = Tries::new(policy, what);
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) => match tries.failed(failure(&e)) {
                Some(wait) => {
                    on_retry(&e, tries.made(), wait);
                    tokio::time::sleep(wait).await;
                }
                None => return Err((e, tries.made())),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(seed: u64) -> RetryPolicy {
        RetryPolicy {
            seed,
            ..RetryPolicy::default()
        }
    }

    const TRANSIENT: Failure = Failure {
        retryable: true,
        retry_after: None,
        throttled: false,
    };

    fn waits(p: &RetryPolicy, what: &str, f: Failure) -> Vec<Duration> {
        let mut t = Tries::new(p, what);
        std::iter::from_fn(|| t.failed(f)).collect()
    }

    /// The tries are bounded, the first included; each wait is the exponential backoff less at
    /// most half of it, never over the ceiling.
    #[test]
    fn backoff_is_bounded_and_jittered() {
        let p = policy(7);
        let w = waits(&p, "blob sha256:aa", TRANSIENT);
        assert_eq!(w.len() as u32, p.tries - 1);
        for (i, d) in w.iter().enumerate() {
            let full = p.base.saturating_mul(1 << (i + 1)).min(p.max);
            assert!(
                *d <= full && *d >= full / 2,
                "retry {}: {d:?} of {full:?}",
                i + 1
            );
        }
        assert!(w
            .iter()
            .any(|d| !d.subsec_nanos().is_multiple_of(1_000_000)));
    }

    /// One seed gives the same waits for the same call; another call or another seed others
    /// (calls in flight together do not retry in step).
    #[test]
    fn the_seed_fixes_the_jitter() {
        let a = waits(&policy(7), "blob sha256:aa", TRANSIENT);
        assert_eq!(a, waits(&policy(7), "blob sha256:aa", TRANSIENT));
        assert_ne!(a, waits(&policy(7), "blob sha256:bb", TRANSIENT));
        assert_ne!(a, waits(&policy(8), "blob sha256:aa", TRANSIENT));
    }

    /// `Retry-After` is honoured up to a minute and never makes a wait shorter than the
    /// backoff; a 429 without it waits at least a second.
    #[test]
    fn retry_after_is_clamped_once() {
        let p = policy(1);
        let after = |s| Failure {
            retry_after: Some(Duration::from_secs(s)),
            ..TRANSIENT
        };
        assert_eq!(waits(&p, "x", after(3))[0], Duration::from_secs(3));
        assert_eq!(waits(&p, "x", after(3600))[0], MAX_RETRY_AFTER);
        assert!(waits(&p, "x", after(0))[0] > Duration::ZERO);
        let throttled = Failure {
            throttled: true,
            ..TRANSIENT
        };
        assert!(waits(&p, "x", throttled)
            .iter()
            .all(|d| *d >= MIN_THROTTLED_WAIT));
    }

    /// A failure not worth a retry ends at once; progress gives the try back.
    #[test]
    fn final_failures_and_progress() {
        let p = policy(1);
        let mut t = Tries::new(&p, "x");
        assert_eq!(t.failed(Failure::FINAL), None);
        assert_eq!(t.made(), 1);
        let mut t = Tries::new(&p, "x");
        for _ in 0..20 {
            t.progressed();
            assert!(
                t.failed(TRANSIENT).is_some(),
                "a stream that moves on never runs out"
            );
        }
        assert_eq!(t.made(), 1);
    }

    /// `run` retries what is worth it and hands back the final error with the tries made.
    #[tokio::test]
    async fn run_counts_the_tries() {
        let p = RetryPolicy {
            base: Duration::ZERO,
            ..policy(3)
        };
        let mut calls = 0;
        let mut heard = Vec::new();
        let r: Result<(), (&str, u32)> = run(
            &p,
            "x",
            || {
                calls += 1;
                async { Err("down") }
            },
            |_| TRANSIENT,
            |_, n, _| heard.push(n),
        )
        .await;
        assert_eq!(r, Err(("down", p.tries)));
        assert_eq!(calls, p.tries);
        assert_eq!(heard, (1..p.tries).collect::<Vec<_>>());
        let r: Result<u8, (&str, u32)> =
            run(&p, "x", || async { Ok(5) }, |_| TRANSIENT, |_, _, _| {}).await;
        assert_eq!(r, Ok(5));
    }
}
