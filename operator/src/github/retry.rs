//! Backoff between attempts: exponential with full jitter, honouring what GitHub asks for
//! (`retry-after`, or `x-ratelimit-reset` when the bucket is empty), capped so a caller is never
//! parked for an hour.

use std::time::Duration;

/// How a client retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub attempts: u32,
    /// The first backoff's ceiling; doubled each attempt.
    pub base: Duration,
    /// No single wait is longer; a longer `retry-after` is returned to the caller instead.
    pub max_wait: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 4,
            base: Duration::from_millis(250),
            max_wait: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The wait before attempt `attempt + 1` (0-based `attempt` just failed), or `None` to stop.
    /// `asked` is what GitHub asked for; `unit` in [0, 1) is the jitter draw.
    pub fn wait(self, attempt: u32, asked: Option<Duration>, unit: f64) -> Option<Duration> {
        if attempt + 1 >= self.attempts {
            return None;
        }
        let wait = match asked {
            Some(d) => d,
            None => {
                let ceiling = self.base.saturating_mul(1 << attempt.min(16));
                ceiling.mul_f64(unit.clamp(0.0, 1.0))
            }
        };
        (wait <= self.max_wait).then_some(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_full_jitter_within_the_ceiling() {
        let p = RetryPolicy::default();
        assert_eq!(
            p.wait(0, None, 0.999).unwrap(),
            Duration::from_millis(250).mul_f64(0.999)
        );
        assert_eq!(p.wait(2, None, 0.5).unwrap(), Duration::from_millis(500));
        assert_eq!(p.wait(1, None, 0.0).unwrap(), Duration::ZERO);
        assert_eq!(p.wait(3, None, 0.5), None, "four attempts in all");
    }

    #[test]
    fn honours_retry_after_up_to_the_cap() {
        let p = RetryPolicy::default();
        assert_eq!(
            p.wait(0, Some(Duration::from_secs(7)), 0.3),
            Some(Duration::from_secs(7))
        );
        assert_eq!(p.wait(0, Some(Duration::from_secs(3600)), 0.3), None);
    }
}
