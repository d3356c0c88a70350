//! The operator's probes. `/healthz`: the process serves. `/readyz`: this replica can do its
//! part, which every replica shares whether or not it leads (leadership is not readiness: a
//! standby serves the webhook receiver and the JIT broker, and both match against the policy
//! cache). Ready once the policy cache has synced (its first list is in); until then a
//! delivery could match no policy and be dropped, so the replica takes no traffic.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::http::StatusCode;

/// What `/readyz` reports.
#[derive(Debug, Default)]
pub struct Readiness {
    /// Set by the policy cache's reflector on its first full list (`cache::policies`); not
    /// by awaiting `Store::wait_until_ready`, whose single waker the controller needs.
    policies_synced: Arc<AtomicBool>,
}

impl Readiness {
    /// The flag the policy cache sets once synced.
    pub fn policies_synced(&self) -> Arc<AtomicBool> {
        self.policies_synced.clone()
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

    #[test]
    fn the_cache_flag_is_the_probe_flag() {
        // What the policy cache's reflector sets on its first full list; no Lease involved.
        let r = Readiness::default();
        let flag = r.policies_synced();
        assert_eq!(r.report().0, StatusCode::SERVICE_UNAVAILABLE);
        flag.store(true, Ordering::Release);
        assert_eq!(r.report().0, StatusCode::OK);
    }
}
