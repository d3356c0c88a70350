//! Rate-limit discipline: one budget per (credential, GitHub resource bucket), sized from what
//! GitHub's headers say (`x-ratelimit-limit/remaining/reset/resource`), with admission by
//! priority. JIT mints may spend the budget to the last request; observation passes keep a
//! reserve and are paced across the window once half of it is spent, so they stretch before any
//! mint is delayed. Pure: the caller supplies the clock and sleeps.

use std::collections::HashMap;
use std::time::Duration;

/// Who is asking.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Priority {
    /// A JIT mint (or anything on the launch path): a runner waits for it.
    Launch,
    /// Inventory, job polling, lookups: can wait.
    Observe,
}

/// What GitHub said of one bucket, from response headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observed {
    pub limit: u32,
    pub remaining: u32,
    /// Unix seconds when the window resets.
    pub reset_unix: i64,
}

/// Whether a request may go now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    Go,
    /// Wait this long, then ask again.
    Wait(Duration),
}

/// Every budget the client has seen, keyed by (credential key, resource bucket).
#[derive(Debug, Default)]
pub struct Budgets {
    buckets: HashMap<(String, String), Bucket>,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    seen: Observed,
    /// Unix ms of the last observation request admitted (for pacing); `None` before the first.
    last_observe_ms: Option<i64>,
}

/// Observation keeps this share of the window for launches: 10 %, at least 10 requests.
fn reserve(limit: u32) -> u32 {
    (limit / 10).max(10).min(limit)
}

impl Budgets {
    /// Record what a response said.
    pub fn observe(&mut self, credential: &str, resource: &str, seen: Observed) {
        let entry = self
            .buckets
            .entry((credential.to_owned(), resource.to_owned()))
            .or_insert(Bucket {
                seen,
                last_observe_ms: None,
            });
        entry.seen = seen;
    }

    /// What GitHub last said of a bucket.
    pub fn get(&self, credential: &str, resource: &str) -> Option<Observed> {
        self.buckets
            .get(&(credential.to_owned(), resource.to_owned()))
            .map(|b| b.seen)
    }

    /// Every bucket (for metrics).
    pub fn all(&self) -> impl Iterator<Item = (&str, &str, Observed)> {
        self.buckets
            .iter()
            .map(|((c, r), b)| (c.as_str(), r.as_str(), b.seen))
    }

    /// May a request of `priority` go now against this bucket? Counts it when it may.
    pub fn admit(
        &mut self,
        credential: &str,
        resource: &str,
        priority: Priority,
        now_ms: i64,
    ) -> Admission {
        let Some(bucket) = self
            .buckets
            .get_mut(&(credential.to_owned(), resource.to_owned()))
        else {
            // Nothing known yet: the first answer will tell.
            return Admission::Go;
        };
        let now_s = now_ms.div_euclid(1000);
        if now_s >= bucket.seen.reset_unix {
            // The window has reset since the last answer; assume it is full until told.
            bucket.seen.remaining = bucket.seen.limit;
            bucket.seen.reset_unix = now_s + 3600;
        }
        let until_reset = Duration::from_millis(
            u64::try_from(bucket.seen.reset_unix * 1000 - now_ms).unwrap_or(0),
        );
        let remaining = bucket.seen.remaining;
        let floor = match priority {
            Priority::Launch => 0,
            Priority::Observe => reserve(bucket.seen.limit),
        };
        if remaining <= floor {
            return Admission::Wait(until_reset.max(Duration::from_millis(1)));
        }
        if priority == Priority::Observe && remaining < bucket.seen.limit / 2 {
            // Pace what is left above the reserve evenly across the rest of the window.
            let spendable = u64::from(remaining - floor);
            let spacing_ms =
                i64::try_from(until_reset.as_millis() as u64 / spendable).unwrap_or(i64::MAX);
            let next_ok = bucket.last_observe_ms.map(|t| t.saturating_add(spacing_ms));
            if let Some(next_ok) = next_ok
                && now_ms < next_ok
            {
                return Admission::Wait(Duration::from_millis(
                    u64::try_from(next_ok - now_ms).unwrap_or(0),
                ));
            }
        }
        bucket.seen.remaining -= 1;
        if priority == Priority::Observe {
            bucket.last_observe_ms = Some(now_ms);
        }
        Admission::Go
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budgets(limit: u32, remaining: u32, reset_unix: i64) -> Budgets {
        let mut b = Budgets::default();
        b.observe(
            "inst-1",
            "core",
            Observed {
                limit,
                remaining,
                reset_unix,
            },
        );
        b
    }

    /// Admission for the `inst-1`/`core` bucket [`budgets`] observed.
    fn admit(b: &mut Budgets, priority: Priority, now_ms: i64) -> Admission {
        b.admit("inst-1", "core", priority, now_ms)
    }

    #[test]
    fn unknown_buckets_go() {
        let mut b = Budgets::default();
        assert_eq!(b.admit("x", "core", Priority::Observe, 0), Admission::Go);
    }

    #[test]
    fn observation_stops_at_the_reserve_and_launches_go_on() {
        // 5,000/h with 400 left: the observe reserve is 500, so observation waits for the reset;
        // a JIT mint still goes.
        let mut b = budgets(5000, 400, 1_000);
        assert_eq!(
            admit(&mut b, Priority::Observe, 400_000),
            Admission::Wait(Duration::from_secs(600))
        );
        assert_eq!(admit(&mut b, Priority::Launch, 400_000), Admission::Go);
        assert_eq!(b.get("inst-1", "core").unwrap().remaining, 399);
    }

    #[test]
    fn launches_wait_only_when_nothing_is_left() {
        let mut b = budgets(5000, 1, 1_000);
        assert_eq!(admit(&mut b, Priority::Launch, 999_000), Admission::Go);
        assert_eq!(
            admit(&mut b, Priority::Launch, 999_000),
            Admission::Wait(Duration::from_secs(1))
        );
        // After the reset the window is assumed full again.
        assert_eq!(admit(&mut b, Priority::Launch, 1_000_000), Admission::Go);
    }

    #[test]
    fn observation_is_paced_once_half_the_window_is_spent() {
        // 1,000/h, 600 left... above half: no pacing.
        let mut b = budgets(1000, 600, 3600);
        assert_eq!(admit(&mut b, Priority::Observe, 0), Admission::Go);
        assert_eq!(admit(&mut b, Priority::Observe, 0), Admission::Go);
        // 400 left (reserve 100): 300 spendable over 3,600 s = one per 12 s.
        let mut b = budgets(1000, 400, 3600);
        assert_eq!(admit(&mut b, Priority::Observe, 0), Admission::Go);
        match admit(&mut b, Priority::Observe, 1_000) {
            Admission::Wait(d) => assert!(
                d > Duration::from_secs(10) && d <= Duration::from_secs(12),
                "{d:?}"
            ),
            Admission::Go => panic!("observation must be paced"),
        }
        // A launch is never paced.
        assert_eq!(admit(&mut b, Priority::Launch, 1_000), Admission::Go);
    }
}
