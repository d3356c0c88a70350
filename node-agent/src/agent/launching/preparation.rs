//! The preparation bound (parity row 67): at most `--preparation-permits` launches of this node
//! materialize their package and prepare their runtime at once. A burst of admitted attempts
//! would otherwise copy a package (hundreds of MiB) into every runtime at the same time and
//! starve the disk and the runners already working; the cache's one install at a time does
//! not bound the copies. Turns are handed out first come, first served (tokio's semaphore is
//! fair), so a launch waits at most for the launches admitted before it.
//!
//! A turn is taken after the `Allocated` CAS (the reservation already counts against capacity)
//! and given back once the runtime is prepared, before the JIT request: the wait for GitHub
//! and the spawn are not preparation. Each turn says when it is taken and given back, with the
//! wait, in one line each: how long launches queue is visible without a metric per launch.

use std::time::Instant;

use crate::agent::attempt_ctx::Attempts;
use tokio::sync::{Semaphore, SemaphorePermit};

/// The default number of launches that may prepare at once: the default capacity, so a node
/// left at its defaults never queues, and a node raised to many runners copies four at a time.
pub const DEFAULT_PREPARATION_PERMITS: u32 = 4;

/// The node's preparation turns.
#[derive(Debug)]
pub struct PreparationBound {
    turns: Semaphore,
}

/// One launch's turn; given back when dropped (on every path out of preparation).
#[derive(Debug)]
pub struct Turn<'a> {
    _permit: Option<SemaphorePermit<'a>>,
    namespace: String,
    attempt: String,
    taken: Instant,
}

impl PreparationBound {
    /// `permits` turns (at least one).
    pub fn new(permits: u32) -> Self {
        Self {
            turns: Semaphore::new(permits.max(1) as usize),
        }
    }

    /// Waits for a turn, in the order asked.
    pub async fn turn(&self, namespace: &str, attempt: &str) -> Turn<'_> {
        let asked = Instant::now();
        // The semaphore is never closed (nothing calls `close`); were it closed, a launch
        // would prepare unbounded rather than never.
        let permit = self.turns.acquire().await.ok();
        let elapsed_ms = u64::try_from(asked.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::info!(namespace, attempt, elapsed_ms, "preparation turn taken");
        Turn {
            _permit: permit,
            namespace: namespace.to_owned(),
            attempt: attempt.to_owned(),
            taken: Instant::now(),
        }
    }

    /// Turns not taken now.
    pub fn free(&self) -> usize {
        self.turns.available_permits()
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let elapsed_ms = u64::try_from(self.taken.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::info!(
            namespace = %self.namespace,
            attempt = %self.attempt,
            elapsed_ms,
            "preparation turn given back"
        );
    }
}

/// Whether the launch of attempt `uid` (`name` in `api`'s namespace) is still wanted, as the
/// watch shows it now: the same object, not being deleted, no termination requested. Asked by a
/// launch waiting for its package (parity row 48). Without a watch (a unit test) it is wanted.
pub fn still_wanted(api: &Attempts, name: &str, uid: &str) -> bool {
    if !api.journal.is_watching() {
        return true;
    }
    api.journal.watched(api, name).is_some_and(|a| {
        a.metadata.uid.as_deref() == Some(uid)
            && a.metadata.deletion_timestamp.is_none()
            && a.spec.termination.is_none()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn turns_are_bounded_and_given_back_on_drop() {
        let bound = PreparationBound::new(2);
        let a = bound.turn("ns", "a").await;
        let _b = bound.turn("ns", "b").await;
        assert_eq!(bound.free(), 0);
        let waiting =
            tokio::time::timeout(std::time::Duration::from_millis(50), bound.turn("ns", "c")).await;
        assert!(
            waiting.is_err(),
            "a third turn was handed out with two taken"
        );
        drop(a);
        assert_eq!(bound.free(), 1);
        let _c = bound.turn("ns", "c").await;
        assert_eq!(bound.free(), 0);
    }

    #[test]
    fn zero_permits_still_lets_one_launch_prepare() {
        assert_eq!(PreparationBound::new(0).free(), 1);
    }
}
