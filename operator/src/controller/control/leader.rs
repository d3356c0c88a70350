//! Leader election on a `coordination.k8s.io/v1` Lease (`runner-manager-operator` in the
//! operator's namespace). Every write is a compare-and-swap on the Lease's resourceVersion, so two
//! replicas can never both believe they took it. A holder that cannot renew before its own lease
//! would lapse reports the loss at once: the caller stops reconciling and exits (DESIGN §11).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};

pub const LEASE_NAME: &str = "runner-manager-operator";

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("leadership lost: {0}")]
    Lost(&'static str),
}

/// Who holds a Lease, as far as the decision needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    pub holder: Option<String>,
    pub renewed_at: Option<Timestamp>,
    pub duration: Duration,
}

impl Holding {
    fn of(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        Self {
            holder: spec.and_then(|s| s.holder_identity.clone()),
            renewed_at: spec
                .and_then(|s| s.renew_time.as_ref().or(s.acquire_time.as_ref()))
                .map(|t| t.0),
            duration: Duration::from_secs(
                spec.and_then(|s| s.lease_duration_seconds)
                    .and_then(|s| u64::try_from(s).ok())
                    .unwrap_or(15),
            ),
        }
    }

    /// May `me` take (or keep) the Lease at `now`? Pure.
    pub fn may_take(&self, me: &str, now: Timestamp) -> bool {
        match (&self.holder, self.renewed_at) {
            (None, _) => true,
            (Some(h), _) if h == me || h.is_empty() => true,
            (Some(_), None) => true,
            (Some(_), Some(at)) => {
                let age = now.as_millisecond().saturating_sub(at.as_millisecond());
                age > i64::try_from(self.duration.as_millis()).unwrap_or(i64::MAX)
            }
        }
    }
}

/// The elector of one replica.
#[derive(Clone)]
pub struct Elector {
    api: Api<Lease>,
    identity: String,
    duration: Duration,
}

impl Elector {
    pub fn new(kube: kube::Client, namespace: &str, identity: String, duration: Duration) -> Self {
        Self {
            api: Api::namespaced(kube, namespace),
            identity,
            duration,
        }
    }

    fn spec(&self, now: Timestamp, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.duration.as_secs().max(1)).unwrap_or(i32::MAX),
            ),
            acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// One try: Ok(true) when we hold the Lease after it (taken or renewed).
    async fn try_hold(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let Some(current) = self.api.get_opt(LEASE_NAME).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(LEASE_NAME.into()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(now, None, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let holding = Holding::of(&current);
        if !holding.may_take(&self.identity, now) {
            return Ok(false);
        }
        let ours = holding.holder.as_deref() == Some(self.identity.as_str());
        let old = current.spec.clone().unwrap_or_default();
        let transitions = old.lease_transitions.unwrap_or(0) + i32::from(!ours);
        let acquired = if ours { old.acquire_time } else { None };
        let mut next = current.clone();
        next.spec = Some(self.spec(now, acquired, transitions));
        // `replace` carries the resourceVersion we read: a CAS.
        match self
            .api
            .replace(LEASE_NAME, &PostParams::default(), &next)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Wait until this replica holds the Lease.
    pub async fn acquire(&self) {
        loop {
            match self.try_hold().await {
                Ok(true) => {
                    tracing::info!(identity = %self.identity, "leadership acquired");
                    return;
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "leader Lease unavailable"),
            }
            tokio::time::sleep(self.retry_period()).await;
        }
    }

    fn retry_period(&self) -> Duration {
        (self.duration / 5).max(Duration::from_millis(200))
    }

    /// Renew until renewal fails; returns why leadership is lost. A renewal that sees another
    /// holder, or that cannot succeed before our own lease would lapse, is a loss: we must stop
    /// before a standby may take over.
    pub async fn hold(&self) -> LeaderError {
        let mut last = tokio::time::Instant::now();
        // Stop well before the lease lapses, so a standby never overlaps with us.
        let deadline = self.duration.mul_f64(0.7);
        loop {
            tokio::time::sleep(self.retry_period()).await;
            // One try may take up to half the lease: a slow API server is not yet a lost lease.
            match tokio::time::timeout(self.duration / 2, self.try_hold()).await {
                Ok(Ok(true)) => last = tokio::time::Instant::now(),
                Ok(Ok(false)) => return LeaderError::Lost("another replica holds the Lease"),
                Ok(Err(e)) => tracing::warn!(error = %e, "renewing the leader Lease failed"),
                Err(_) => tracing::warn!("renewing the leader Lease timed out"),
            }
            if last.elapsed() >= deadline {
                return LeaderError::Lost("the Lease could not be renewed in time");
            }
        }
    }
}

impl Elector {
    /// Give the Lease up on a clean stop (SIGTERM, a rolling upgrade), so a standby takes over
    /// at its next try instead of waiting out the lease. Called only once this replica's
    /// controllers have stopped; a CAS, so a Lease someone else took meanwhile is left alone.
    pub async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(LEASE_NAME).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        // An empty holder is free to take (`Holding::may_take`), as client-go's release does.
        spec.holder_identity = Some(String::new());
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self
            .api
            .replace(LEASE_NAME, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!(identity = %self.identity, "leadership released"),
            Err(e) => {
                tracing::warn!(error = %e, "releasing the leader Lease failed; a standby waits it out")
            }
        }
    }
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Option<Timestamp> {
        Some(Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn who_may_take_the_lease() {
        let now = Timestamp::from_second(1000).unwrap();
        let h = |holder: Option<&str>, renewed| Holding {
            holder: holder.map(str::to_owned),
            renewed_at: renewed,
            duration: Duration::from_secs(15),
        };
        assert!(h(None, None).may_take("a", now));
        assert!(h(Some("a"), at(999)).may_take("a", now), "ours");
        assert!(
            !h(Some("b"), at(990)).may_take("a", now),
            "fresh, someone else's"
        );
        assert!(h(Some("b"), at(984)).may_take("a", now), "expired");
        assert!(h(Some(""), at(999)).may_take("a", now), "released");
    }
}
