//! The operator's probes. `/healthz`: the process serves. `/readyz`: this replica can do its
//! part, which every replica shares whether or not it leads (leadership is not readiness: a
//! standby serves the webhook receiver and the JIT broker, and both match against the policy
//! cache). Ready once the policy cache has synced (its first list is in); until then a
//! delivery could match no policy and be dropped, so the replica takes no traffic.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::http::StatusCode;
use kube::runtime::reflector::Store;
use runner_manager_crds::policy::ScalePolicy;

/// What `/readyz` reports.
#[derive(Debug, Default)]
pub struct Readiness {
    policies_synced: AtomicBool,
}

impl Readiness {
    /// Marks the policy cache synced once its first list is in.
    pub fn watch(self: &Arc<Self>, policies: Store<ScalePolicy>) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            if policies.wait_until_ready().await.is_ok() {
                me.set_policies_synced();
            }
        })
    }

    pub fn set_policies_synced(&self) {
        self.policies_synced.store(true, Ordering::Release);
    }

    /// The probe's answer: 200 when ready, 503 naming what is missing.
    pub fn report(&self) -> (StatusCode, &'static str) {
        if self.policies_synced.load(Ordering::Acquire) {
            (StatusCode::OK, "ok")
        } else {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: the policy cache has not synced",
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_once_the_policy_cache_synced() {
        let r = Readiness::default();
        assert_eq!(r.report().0, StatusCode::SERVICE_UNAVAILABLE);
        r.set_policies_synced();
        assert_eq!(r.report(), (StatusCode::OK, "ok"));
    }

    #[tokio::test]
    async fn the_cache_watch_marks_it_ready_without_leadership() {
        use kube::runtime::reflector;
        use kube::runtime::watcher::Event;
        let (reader, mut writer) = reflector::store::<ScalePolicy>();
        let r = Arc::new(Readiness::default());
        let task = r.watch(reader);
        tokio::task::yield_now().await;
        assert_eq!(r.report().0, StatusCode::SERVICE_UNAVAILABLE);
        // The first (empty) list completes: the store is ready, no Lease involved.
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitDone);
        task.await.unwrap();
        assert_eq!(r.report().0, StatusCode::OK);
    }
}
