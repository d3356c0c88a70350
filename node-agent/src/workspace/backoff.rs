//! Per-attempt cleanup backoff: a tolerated cleanup failure (quarantine, a deferred ephemeral
//! removal, late residue) is reported once, then neither retried nor reported again until its
//! delay has passed. Pure: the caller passes the clock.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The first retry comes after this long; each later one after twice the previous.
pub const CLEANUP_BACKOFF_INITIAL: Duration = Duration::from_secs(30);
/// No retry waits longer than this.
pub const CLEANUP_BACKOFF_MAX: Duration = Duration::from_secs(15 * 60);

#[derive(Clone, Copy, Debug)]
struct Backoff {
    failures: u32,
    next_try: Instant,
}

/// Keyed by attempt name.
#[derive(Clone, Debug, Default)]
pub struct CleanupBackoff {
    attempts: HashMap<String, Backoff>,
}

impl CleanupBackoff {
    /// The delay after the n-th consecutive failure (1-based): `initial × 2^(n−1)`, capped.
    pub fn delay(failures: u32) -> Duration {
        let shift = failures.saturating_sub(1).min(31);
        CLEANUP_BACKOFF_INITIAL
            .saturating_mul(1u32 << shift)
            .min(CLEANUP_BACKOFF_MAX)
    }

    /// Whether cleanup of `attempt` may be tried (and a failure reported) now.
    pub fn due(&self, attempt: &str, now: Instant) -> bool {
        self.attempts.get(attempt).is_none_or(|b| now >= b.next_try)
    }

    /// Records a failure; returns how long until the next try.
    pub fn failed(&mut self, attempt: &str, now: Instant) -> Duration {
        let entry = self.attempts.entry(attempt.to_owned()).or_insert(Backoff {
            failures: 0,
            next_try: now,
        });
        entry.failures = entry.failures.saturating_add(1);
        let delay = Self::delay(entry.failures);
        entry.next_try = now + delay;
        delay
    }

    /// Forgets an attempt whose cleanup succeeded.
    pub fn succeeded(&mut self, attempt: &str) {
        self.attempts.remove(attempt);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_retried_only_after_its_delay_and_the_delay_doubles() {
        let start = Instant::now();
        let mut backoff = CleanupBackoff::default();
        assert!(backoff.due("a", start));
        assert_eq!(backoff.failed("a", start), Duration::from_secs(30));
        assert!(
            !backoff.due("a", start),
            "an immediate second pass does not retry"
        );
        assert!(!backoff.due("a", start + Duration::from_secs(29)));
        assert!(backoff.due("a", start + Duration::from_secs(31)));
        assert!(backoff.due("b", start), "per attempt");
        let later = start + Duration::from_secs(31);
        assert_eq!(backoff.failed("a", later), Duration::from_secs(60));
        assert!(!backoff.due("a", later + Duration::from_secs(59)));
        assert!(backoff.due("a", later + Duration::from_secs(61)));
        backoff.succeeded("a");
        assert!(backoff.due("a", later));
    }

    #[test]
    fn the_delay_saturates_at_the_cap() {
        assert_eq!(CleanupBackoff::delay(1), CLEANUP_BACKOFF_INITIAL);
        assert_eq!(CleanupBackoff::delay(100), CLEANUP_BACKOFF_MAX);
        assert_eq!(CleanupBackoff::delay(u32::MAX), CLEANUP_BACKOFF_MAX);
    }
}
