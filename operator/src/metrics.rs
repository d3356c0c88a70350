//! `/metrics` (prometheus-client, served as OpenMetrics, or the Prometheus text format when asked): names
//! `runner_manager_*`, labels from closed vocabularies (endpoints, statuses, outcomes, reasons,
//! rate-limit buckets, job actions and results) — never a name a workflow chose. The one
//! exception is the ScalePolicy's namespace and name, on the per-policy family
//! (`runner_manager_policy_*`) and the job families (`runner_manager_jobs_total`, the job
//! durations): series removed when the policy goes; their cardinality is the number of
//! ScalePolicies times the closed vocabularies (docs/observability.md).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use runner_manager_telemetry::registry::{registered, registered_as};

use runner_manager_telemetry::exposition;

use crate::github::endpoint::Endpoint;
use crate::policy::placement::Unplaceable;

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabels {
    stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    namespace: String,
    policy: String,
}

/// A job's series: the policy whose ledger took it (empty when none matched), the delivery's
/// action and the job's result (`none` until completed). Policy names are the platform team's;
/// nothing a workflow chose.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabels {
    namespace: String,
    policy: String,
    action: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobResultLabels {
    namespace: String,
    policy: String,
    result: String,
}

type JobHistogram<L> = Family<L, Histogram, fn() -> Histogram>;

/// Seconds from 1 s to about 4.5 hours.
fn job_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 15))
}

/// One policy's numbers as of the leader's last pass over it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyGauges {
    /// Runners the policy wants (`status.desired`).
    pub desired: u32,
    pub starting: u32,
    pub idle: u32,
    pub busy: u32,
    /// Leaving or being cleaned up (`status.cleaning`): terminations asked, and concluded
    /// attempts not yet `Cleaned`. One that stays up names a cleanup that does not finish.
    pub cleaning: u32,
    /// Jobs queued for it and not yet taken (`status.pendingJobs`).
    pub pending_jobs: u32,
    /// `spec.minIdle`.
    pub min: u32,
    /// `spec.maxRunners`.
    pub max: u32,
}

/// One per-policy gauge: its name, help and which of [`PolicyGauges`] it shows.
struct PolicyGauge {
    name: &'static str,
    help: &'static str,
    value: fn(&PolicyGauges) -> u32,
}

/// The per-policy gauges: a new one is a [`PolicyGauges`] field and a row here (and its
/// docs/observability.md row, which `make test`'s docs stage asks for). Registration, the
/// values of a pass and the removal of a gone policy's series all read this table.
#[rustfmt::skip]
const POLICY_GAUGES: &[PolicyGauge] = &[
    gauge("policy_desired_runners", "Runners the policy wants (status.desired), as of the leader's last pass", |g| g.desired),
    gauge("policy_starting_runners", "The policy's runners launching or registering", |g| g.starting),
    gauge("policy_idle_runners", "The policy's runners registered and waiting for a job", |g| g.idle),
    gauge("policy_busy_runners", "The policy's runners running a job", |g| g.busy),
    gauge("policy_cleaning_runners", "The policy's runners leaving or being cleaned up (status.cleaning)", |g| g.cleaning),
    gauge("policy_pending_jobs", "Jobs queued for the policy that no runner has taken yet", |g| g.pending_jobs),
    gauge("policy_min_runners", "spec.minIdle: idle runners kept ready", |g| g.min),
    gauge("policy_max_runners", "spec.maxRunners", |g| g.max),
];

/// One row of [`POLICY_GAUGES`].
const fn gauge(
    name: &'static str,
    help: &'static str,
    value: fn(&PolicyGauges) -> u32,
) -> PolicyGauge {
    PolicyGauge { name, help, value }
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
    pass_seconds: Gauge<f64, AtomicU64>,
    reconcile_duration: Histogram,
    reconcile_errors: Family<StageLabels, Counter>,
    /// One family per row of [`POLICY_GAUGES`], in its order.
    policy: Vec<Family<PolicyLabels, Gauge>>,
    job_startup: JobHistogram<PolicyLabels>,
    job_execution: JobHistogram<JobResultLabels>,
    jobs: Family<JobLabels, Counter>,
    /// Every job series made, so a gone policy's are removed (a family cannot be searched).
    job_series: std::sync::Mutex<std::collections::HashSet<JobLabels>>,
    jit_mints: Counter,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("runner_manager");
        // Each family registered as its field is made, in this order (the order `/metrics`
        // lists them); the registry itself goes in last, with the span counts and the build.
        let metrics = Self {
            github_calls: registered(
                &mut registry,
                "github_calls",
                "GitHub API calls by endpoint and HTTP status",
            ),
            rate_limit_remaining: registered(
                &mut registry,
                "github_rate_limit_remaining",
                "Requests left in the rate-limit window, per credential and bucket, as GitHub last said",
            ),
            rate_limit_reset: registered(
                &mut registry,
                "github_rate_limit_reset_timestamp_seconds",
                "When the rate-limit window resets (unix seconds), per credential and bucket",
            ),
            broker_requests: registered(
                &mut registry,
                "broker_requests",
                "JIT broker requests by outcome",
            ),
            broker_duration: registered_as(
                &mut registry,
                "broker_request_duration_seconds",
                "Time to answer a JIT broker request",
                Histogram::new(exponential_buckets(0.005, 2.0, 12)),
            ),
            webhook_deliveries: registered(
                &mut registry,
                "webhook_deliveries",
                "workflow_job webhook deliveries by outcome",
            ),
            api_writes: registered(
                &mut registry,
                "api_writes",
                "Writes the operator's controllers sent to the API server, by kind",
            ),
            attempts: registered(
                &mut registry,
                "attempts",
                "RunnerAttempts by state, as of the leader's last pass",
            ),
            attempts_created: registered(
                &mut registry,
                "attempts_created",
                "RunnerAttempts created, by why (scale_up or replacement)",
            ),
            placement_failures: registered(
                &mut registry,
                "placement_failures",
                "Attempts that could not be placed, by why no node fitted",
            ),
            terminations: registered(
                &mut registry,
                "terminations_requested",
                "spec.termination requests, by reason",
            ),
            orphan_registrations_deleted: registered(
                &mut registry,
                "orphan_registrations_deleted",
                "Runner registrations of ours with no attempt, deleted after the grace period",
            ),
            events_dropped: registered(
                &mut registry,
                "events_dropped",
                "Kubernetes Events dropped because the publishing queue was full",
            ),
            leader: registered(
                &mut registry,
                "leader",
                "1 while this replica holds the leader Lease and reconciles",
            ),
            pass_seconds: registered(
                &mut registry,
                "reconcile_pass_seconds",
                "How long the leader's last full reconcile pass took",
            ),
            reconcile_duration: registered_as(
                &mut registry,
                "reconcile_duration_seconds",
                "How long the leader's full reconcile passes take",
                Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            ),
            reconcile_errors: registered(
                &mut registry,
                "reconcile_errors",
                "Failures inside policy reconciles, by stage (housekeeping, resolve, observe, demand, apply, status)",
            ),
            policy: POLICY_GAUGES
                .iter()
                .map(|g| registered(&mut registry, g.name, g.help))
                .collect(),
            job_startup: registered_as(
                &mut registry,
                "job_startup_duration_seconds",
                "From a job queued to a runner taking it (the in_progress delivery's started_at - created_at), by policy",
                Family::new_with_constructor(job_histogram),
            ),
            job_execution: registered_as(
                &mut registry,
                "job_execution_duration_seconds",
                "From a runner taking a job to its completion (the completed delivery's completed_at - started_at), by policy and result",
                Family::new_with_constructor(job_histogram),
            ),
            jobs: registered(
                &mut registry,
                "jobs",
                "workflow_job deliveries accepted, by policy, action (queued, waiting, in_progress, completed) and result",
            ),
            jit_mints: registered(
                &mut registry,
                "jit_mints",
                "JIT runner configurations the broker minted at GitHub and handed to an agent",
            ),
            job_series: std::sync::Mutex::default(),
            registry: {
                // The span export path's counts (the process's one tracer provider).
                runner_manager_telemetry::spans::register(&mut registry);
                registry.register(
                    "build",
                    "The operator's version",
                    prometheus_client::metrics::info::Info::new(vec![(
                        "version",
                        env!("CARGO_PKG_VERSION"),
                    )]),
                );
                registry
            },
        };
        // Every reason at 0 from the start: a rate or increase over a family with no series
        // is no data, not 0, and an alert on it (docs/observability.md) could not be told
        // from one whose metric does not exist.
        for why in Unplaceable::ALL {
            let _ = metrics.placement_failures.get_or_create(&ReasonLabels {
                reason: why.as_str().to_owned(),
            });
        }
        Arc::new(metrics)
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
        if outcome == "issued" {
            self.jit_mints.inc();
        }
    }

    /// One policy's gauges, as of this pass.
    pub fn policy(&self, namespace: &str, name: &str, g: PolicyGauges) {
        let labels = PolicyLabels {
            namespace: namespace.to_owned(),
            policy: name.to_owned(),
        };
        for (gauge, family) in POLICY_GAUGES.iter().zip(&self.policy) {
            family
                .get_or_create(&labels)
                .set(i64::from((gauge.value)(&g)));
        }
    }

    /// A policy that is going: its series are removed.
    pub fn forget_policy(&self, namespace: &str, name: &str) {
        let labels = PolicyLabels {
            namespace: namespace.to_owned(),
            policy: name.to_owned(),
        };
        for family in &self.policy {
            family.remove(&labels);
        }
        self.job_startup.remove(&labels);
        let mut series = self
            .job_series
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        series.retain(|j| {
            let gone = j.namespace == labels.namespace && j.policy == labels.policy;
            if gone {
                self.jobs.remove(j);
                self.job_execution.remove(&JobResultLabels {
                    namespace: j.namespace.clone(),
                    policy: j.policy.clone(),
                    result: j.result.clone(),
                });
            }
            !gone
        });
    }

    /// One accepted `workflow_job` delivery: the policy whose ledger took it (`None`: none
    /// matched), its action and result (both from the receiver's closed lists), and the
    /// durations its timestamps give (startup on `in_progress`, execution on `completed`).
    pub fn job(
        &self,
        policy: Option<(&str, &str)>,
        action: &'static str,
        result: &'static str,
        startup: Option<f64>,
        execution: Option<f64>,
    ) {
        let (namespace, policy) = policy.unwrap_or_default();
        let labels = JobLabels {
            namespace: namespace.to_owned(),
            policy: policy.to_owned(),
            action: action.to_owned(),
            result: result.to_owned(),
        };
        {
            // Under the lock `forget_policy` takes: a series is never made after its policy's
            // removal swept the set, and so never left behind.
            let mut series = self
                .job_series
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            self.jobs.get_or_create(&labels).inc();
            series.insert(labels);
        }
        if let Some(s) = startup.filter(|s| *s >= 0.0) {
            self.job_startup
                .get_or_create(&PolicyLabels {
                    namespace: namespace.to_owned(),
                    policy: policy.to_owned(),
                })
                .observe(s);
        }
        if let Some(s) = execution.filter(|s| *s >= 0.0) {
            self.job_execution
                .get_or_create(&JobResultLabels {
                    namespace: namespace.to_owned(),
                    policy: policy.to_owned(),
                    result: result.to_owned(),
                })
                .observe(s);
        }
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

    /// One failure inside a policy's reconcile; `stage` from `controller::errors::Stage`.
    pub fn reconcile_error(&self, stage: &'static str) {
        self.reconcile_errors
            .get_or_create(&StageLabels {
                stage: stage.to_owned(),
            })
            .inc();
    }

    pub fn reconcile_pass(&self, elapsed: std::time::Duration) {
        self.pass_seconds.set(elapsed.as_secs_f64());
        self.reconcile_duration.observe(elapsed.as_secs_f64());
    }

    /// The `/metrics` answer, in the format the request's `Accept` asks for (OpenMetrics, or the
    /// Prometheus text format: `runner_manager_telemetry::exposition`).
    pub fn response(&self, accept: Option<&str>) -> axum::response::Response {
        use axum::response::IntoResponse;
        let (content_type, body) = exposition::answer(accept, self.encode());
        ([(axum::http::header::CONTENT_TYPE, content_type)], body).into_response()
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_gauges_jobs_and_build_info_are_exposed_and_a_gone_policy_is_removed() {
        let m = Metrics::new();
        m.policy(
            "team-a",
            "web",
            PolicyGauges {
                desired: 3,
                starting: 1,
                idle: 1,
                busy: 1,
                cleaning: 4,
                pending_jobs: 2,
                min: 1,
                max: 5,
            },
        );
        m.job(
            Some(("team-a", "web")),
            "in_progress",
            "none",
            Some(12.0),
            None,
        );
        m.job(
            Some(("team-a", "web")),
            "completed",
            "failure",
            None,
            Some(30.0),
        );
        m.job(None, "queued", "none", None, None);
        m.broker_request("issued", 0.2);
        m.reconcile_pass(std::time::Duration::from_millis(40));
        m.reconcile_error("apply");
        let text = m.encode();
        for line in [
            "runner_manager_policy_desired_runners{namespace=\"team-a\",policy=\"web\"} 3",
            "runner_manager_policy_idle_runners{namespace=\"team-a\",policy=\"web\"} 1",
            "runner_manager_policy_busy_runners{namespace=\"team-a\",policy=\"web\"} 1",
            "runner_manager_policy_cleaning_runners{namespace=\"team-a\",policy=\"web\"} 4",
            "runner_manager_policy_pending_jobs{namespace=\"team-a\",policy=\"web\"} 2",
            "runner_manager_policy_min_runners{namespace=\"team-a\",policy=\"web\"} 1",
            "runner_manager_policy_max_runners{namespace=\"team-a\",policy=\"web\"} 5",
            "runner_manager_job_startup_duration_seconds_sum{namespace=\"team-a\",policy=\"web\"} 12.0",
            "runner_manager_job_execution_duration_seconds_count{namespace=\"team-a\",policy=\"web\",result=\"failure\"} 1",
            "runner_manager_jobs_total{namespace=\"team-a\",policy=\"web\",action=\"in_progress\",result=\"none\"} 1",
            "runner_manager_jobs_total{namespace=\"team-a\",policy=\"web\",action=\"completed\",result=\"failure\"} 1",
            "runner_manager_jobs_total{namespace=\"\",policy=\"\",action=\"queued\",result=\"none\"} 1",
            "runner_manager_jit_mints_total 1",
            "runner_manager_reconcile_duration_seconds_count 1",
            "runner_manager_reconcile_errors_total{stage=\"apply\"} 1",
            "runner_manager_build_info{version=\"",
            // Every placement-failure reason from the start, at 0.
            "runner_manager_placement_failures_total{reason=\"all_full\"} 0",
            "runner_manager_placement_failures_total{reason=\"no_package_for_architecture\"} 0",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
        m.forget_policy("team-a", "web");
        let after = m.encode();
        assert!(!after.contains("policy=\"web\""), "{after}");
        assert!(
            after.contains("action=\"queued\""),
            "another policy's series kept"
        );
        let r = m.response(None);
        assert_eq!(
            r.headers()[axum::http::header::CONTENT_TYPE],
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        let r = m.response(Some("text/plain; version=0.0.4"));
        assert_eq!(
            r.headers()[axum::http::header::CONTENT_TYPE],
            "text/plain; version=0.0.4; charset=utf-8"
        );
    }
}
