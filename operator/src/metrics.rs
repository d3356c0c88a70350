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

/// Every metric of the operator.
pub struct Metrics {
    registry: Registry,
    github_calls: Family<CallLabels, Counter>,
    rate_limit_remaining: Family<BucketLabels, Gauge>,
    rate_limit_reset: Family<BucketLabels, Gauge>,
    broker_requests: Family<OutcomeLabels, Counter>,
    broker_duration: Histogram,
    webhook_deliveries: Family<OutcomeLabels, Counter>,
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
        Arc::new(Self {
            registry,
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
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
