//! A GitHub answer shared by every policy of one target: fetched at most once per `max_age`
//! however many callers ask at once. A thousand policies on one repository cost one runner list
//! per observation interval, not a thousand.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

/// The last answer and when it was fetched. The lock is held across the fetch on purpose: the
/// callers that arrive meanwhile wait for that answer instead of sending their own request.
pub struct Recent<T> {
    slot: Mutex<Option<(Instant, Arc<T>)>>,
}

impl<T> Default for Recent<T> {
    fn default() -> Self {
        Self {
            slot: Mutex::new(None),
        }
    }
}

impl<T> std::fmt::Debug for Recent<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recent").finish_non_exhaustive()
    }
}

impl<T> Recent<T> {
    /// The cached answer when it is younger than `max_age`, else a fresh one. A failure is not
    /// cached: the next caller tries again.
    pub async fn get<E, F, Fut>(&self, max_age: Duration, fetch: F) -> Result<Arc<T>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut slot = self.slot.lock().await;
        if let Some((at, value)) = slot.as_ref()
            && at.elapsed() < max_age
        {
            return Ok(value.clone());
        }
        let fresh = Arc::new(fetch().await?);
        *slot = Some((Instant::now(), fresh.clone()));
        Ok(fresh)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn concurrent_callers_share_one_fetch_and_failures_are_not_kept() {
        let recent: Recent<u32> = Recent::default();
        let fetches = AtomicU32::new(0);
        let fetch = || async {
            fetches.fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
            Ok::<_, ()>(7)
        };
        let all = futures_util::future::join_all(
            (0..20).map(|_| recent.get(Duration::from_secs(60), fetch)),
        )
        .await;
        assert!(all.iter().all(|r| r.as_deref() == Ok(&7)));
        assert_eq!(
            fetches.load(Ordering::SeqCst),
            1,
            "one request for 20 callers"
        );

        let fresh: Recent<u32> = Recent::default();
        assert_eq!(
            fresh
                .get(Duration::from_secs(60), || async { Err::<u32, _>("down") })
                .await,
            Err("down")
        );
        let again = fresh
            .get(Duration::from_secs(60), || async { Ok::<_, &str>(8) })
            .await;
        assert_eq!(again.as_deref(), Ok(&8), "the failure was not cached");
    }

    #[tokio::test]
    async fn an_answer_older_than_max_age_is_fetched_again() {
        let recent: Recent<u32> = Recent::default();
        let n = AtomicU32::new(0);
        let fetch = || async { Ok::<_, ()>(n.fetch_add(1, Ordering::SeqCst)) };
        assert_eq!(*recent.get(Duration::ZERO, fetch).await.unwrap(), 0);
        assert_eq!(*recent.get(Duration::ZERO, fetch).await.unwrap(), 1);
        assert_eq!(
            *recent.get(Duration::from_secs(60), fetch).await.unwrap(),
            1
        );
    }
}
