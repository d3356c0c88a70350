//! `/metrics` (prometheus-client): names `runner_manager_*`, labels from closed vocabularies
//! only (endpoints, statuses, outcomes, rate-limit buckets) — never a name a tenant or a
//! workflow chose.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::github::endpoint::Endpoint;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    endpoint: String,
    /// The HTTP status, or `transport` when there was none.
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BucketLabels {
    /// `app-<id>` or `token-<12 hex of its sha256>`: never the credential.
    credential: String,
    resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

/// Every metric of the operator.
pub struct Metrics {
    registry: Registry,
    github_calls: Family<CallLabels, Counter>,
    rate_limit_remaining: Family<BucketLabels, Gauge>,
    rate_limit_reset: Family<BucketLabels, Gauge>,
    broker_requests: Family<OutcomeLabels, Counter>,
    broker_duration: Histogram,
    webhook_deliveries: Family<OutcomeLabels, Counter>,
    api_writes: Family<KindLabels, Counter>,
    attempts: Family<StateLabels, Gauge>,
    attempts_created: Family<ReasonLabels, Counter>,
    placement_failures: Family<ReasonLabels, Counter>,
    terminations: Family<ReasonLabels, Counter>,
    orphan_registrations_deleted: Counter,
    events_dropped: Counter,
    leader: Gauge,
    pass_ms: Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("runner_manager");
        let github_calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "github_calls",
            "GitHub API calls by endpoint and HTTP status",
            github_calls.clone(),
        );
        let rate_limit_remaining = Family::<BucketLabels, Gauge>::default();
        registry.register(
            "github_rate_limit_remaining",
            "Requests left in the rate-limit window, per credential and bucket, as GitHub last said",
            rate_limit_remaining.clone(),
        );
        let rate_limit_reset = Family::<BucketLabels, Gauge>::default();
        registry.register(
            "github_rate_limit_reset_timestamp_seconds",
            "When the rate-limit window resets (unix seconds), per credential and bucket",
            rate_limit_reset.clone(),
        );
        let broker_requests = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "broker_requests",
            "JIT broker requests by outcome",
            broker_requests.clone(),
        );
        let broker_duration = Histogram::new(exponential_buckets(0.005, 2.0, 12));
        registry.register(
            "broker_request_duration_seconds",
            "Time to answer a JIT broker request",
            broker_duration.clone(),
        );
        let webhook_deliveries = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "webhook_deliveries",
            "workflow_job webhook deliveries by outcome",
            webhook_deliveries.clone(),
        );
        let api_writes = Family::<KindLabels, Counter>::default();
        registry.register(
            "api_writes",
            "Writes the operator's controllers sent to the API server, by kind",
            api_writes.clone(),
        );
        let attempts = Family::<StateLabels, Gauge>::default();
        registry.register(
            "attempts",
            "RunnerAttempts by state, as of the leader's last pass",
            attempts.clone(),
        );
        let attempts_created = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "attempts_created",
            "RunnerAttempts created, by why (scale_up or replacement)",
            attempts_created.clone(),
        );
        let placement_failures = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "placement_failures",
            "Attempts that could not be placed, by why no node fitted",
            placement_failures.clone(),
        );
        let terminations = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "terminations_requested",
            "spec.termination requests, by reason",
            terminations.clone(),
        );
        let orphan_registrations_deleted = Counter::default();
        registry.register(
            "orphan_registrations_deleted",
            "Runner registrations of ours with no attempt, deleted after the grace period",
            orphan_registrations_deleted.clone(),
        );
        let events_dropped = Counter::default();
        registry.register(
            "events_dropped",
            "Kubernetes Events dropped because the publishing queue was full",
            events_dropped.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease and reconciles",
            leader.clone(),
        );
        let pass_ms = Gauge::default();
        registry.register(
            "reconcile_pass_milliseconds",
            "How long the leader's last full reconcile pass took",
            pass_ms.clone(),
        );
        Arc::new(Self {
            pass_ms,
            registry,
            api_writes,
            attempts,
            attempts_created,
            placement_failures,
            terminations,
            orphan_registrations_deleted,
            events_dropped,
            leader,
            github_calls,
            rate_limit_remaining,
            rate_limit_reset,
            broker_requests,
            broker_duration,
            webhook_deliveries,
        })
    }

    /// One GitHub call; `status` 0 for a transport failure.
    pub fn github_call(&self, endpoint: Endpoint, status: u16) {
        let status = if status == 0 {
            "transport".to_owned()
        } else {
            status.to_string()
        };
        self.github_calls
            .get_or_create(&CallLabels {
                endpoint: endpoint.as_str().to_owned(),
                status,
            })
            .inc();
    }

    /// What GitHub's headers said of a bucket.
    pub fn rate_limit(&self, credential: &str, resource: &str, remaining: i64, reset_unix: i64) {
        let labels = BucketLabels {
            credential: credential.to_owned(),
            resource: resource.to_owned(),
        };
        self.rate_limit_remaining
            .get_or_create(&labels)
            .set(remaining);
        self.rate_limit_reset.get_or_create(&labels).set(reset_unix);
    }

    /// One broker answer.
    pub fn broker_request(&self, outcome: &'static str, seconds: f64) {
        self.broker_requests
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
        self.broker_duration.observe(seconds);
    }

    /// One webhook delivery; `outcome` from the receiver's closed list.
    pub fn webhook_delivery(&self, outcome: &'static str) {
        self.webhook_deliveries
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// The text exposition.
    pub fn api_write(&self, kind: &'static str) {
        self.api_writes
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// Set the attempts-by-state gauges (every state, so a state that emptied shows 0).
    pub fn attempts_by_state(&self, counts: &[(&'static str, i64)]) {
        for (state, n) in counts {
            self.attempts
                .get_or_create(&StateLabels {
                    state: (*state).to_owned(),
                })
                .set(*n);
        }
    }

    pub fn attempt_created(&self, reason: &'static str) {
        self.attempts_created
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub fn placement_failure(&self, reason: &'static str) {
        self.placement_failures
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub fn termination(&self, reason: &'static str) {
        self.terminations
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub fn orphan_deleted(&self) {
        self.orphan_registrations_deleted.inc();
    }

    pub fn event_dropped(&self) {
        self.events_dropped.inc();
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    pub fn reconcile_pass(&self, elapsed: std::time::Duration) {
        self.pass_ms
            .set(i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX));
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
