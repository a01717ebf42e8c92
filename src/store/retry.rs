//! One retry policy for every registry call: exponential backoff with jitter on transient
//! failures (connection errors, 5xx, 408, 429), a bounded number of tries.

use std::time::Duration;

/// How often and how long to retry.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Total tries, the first included.
    pub tries: u32,
    /// First backoff.
    pub base: Duration,
    /// Backoff ceiling.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            tries: 6,
            base: Duration::from_millis(200),
            max: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// Backoff before try `attempt` (1-based retry count), with up to 50% jitter.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = self.base.saturating_mul(1u32 << attempt.min(16));
        let capped = exp.min(self.max);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let jitter = capped.mul_f64((nanos % 1000) as f64 / 2000.0);
        capped.saturating_sub(jitter)
    }
}
