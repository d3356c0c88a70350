//! Waiting on a condition with a deadline: never a bare sleep standing in for synchronisation.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use kube::Api;
use serde::de::DeserializeOwned;
use tokio::time::{Instant, sleep};

/// The condition did not hold by the deadline.
#[derive(Debug, thiserror::Error)]
#[error("timed out after {0:?} waiting for {1}")]
pub struct TimedOut(pub Duration, pub String);

/// Poll `check` until it returns `Some`, or fail at `within`. `what` names the condition in the
/// error. The poll interval only bounds how soon a met condition is noticed.
pub async fn until<T, F, Fut>(within: Duration, what: &str, mut check: F) -> Result<T, TimedOut>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            return Err(TimedOut(within, what.to_owned()));
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// Wait (at most `within`) until `api` no longer has the object `name`; `what` names the wait
/// in the error. A failed read counts as gone, as it did in the scenarios that waited this way.
pub async fn gone<K>(api: &Api<K>, name: &str, within: Duration, what: &str) -> Result<(), TimedOut>
where
    K: Clone + DeserializeOwned + Debug,
{
    until(within, what, || async {
        api.get_opt(name)
            .await
            .ok()
            .flatten()
            .is_none()
            .then_some(())
    })
    .await
}
