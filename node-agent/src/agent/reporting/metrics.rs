//! The agent's own `/metrics` (prometheus-client, OpenMetrics text): names
//! `runner_manager_agent_*`, labels from closed vocabularies only (outcomes and their reasons,
//! launch steps, Event reasons, slot states): never a namespace, policy, attempt or anything a
//! workflow chose, so one agent's series are bounded whatever runs on its node.
//!
//! One registry per process ([`global`]): the counters are bumped where things happen (the
//! launch, the conclusion, cleanup, Events); the gauges that describe the agent now (slots,
//! recovery gate, heartbeat age, package cache) are set from the agent at each scrape.

use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::gauge::Gauge as FloatGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use runner_manager_crds::outcome::{Outcome, OutcomeWire};
use runner_manager_telemetry::registry::{registered, registered_as};

use crate::agent::labels::{EventReason, OrphanKind, PruneResult, ReconcileStage};
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConcludedLabels {
    outcome: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    step: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbLabels {
    verb: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabels {
    stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabels {
    mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

/// The verbs of API requests (`api_requests::ApiVerb`), every one exposed from the start.
pub const API_VERBS: [&str; 7] = [
    "read", "watch", "create", "patch", "update", "delete", "other",
];

/// The launch steps timed (`LaunchTimings`), and `total`.
pub const STEPS: [&str; 5] = ["materialize", "prepare", "register", "spawn", "total"];

/// Every metric of the agent.
pub struct AgentMetrics {
    registry: Registry,
    launches: Family<OutcomeLabels, Counter>,
    concluded: Family<ConcludedLabels, Counter>,
    steps: Family<StepLabels, Histogram>,
    package_downloads: Counter,
    events: Family<ReasonLabels, Counter>,
    cleanup_deferrals: Counter,
    quarantines: Counter,
    slots: Family<StateLabels, Gauge>,
    recovery_complete: Gauge,
    recovery_blocked: Gauge,
    ready: Gauge,
    heartbeat_age: FloatGauge<f64, AtomicU64>,
    lease_renewals: Family<OutcomeLabels, Counter>,
    cached_packages: Gauge,
    cache_bytes: Gauge,
    orphans_removed: Family<KindLabels, Counter>,
    package_prunes: Family<ResultLabels, Counter>,
    api_requests: Family<VerbLabels, Counter>,
    reconcile_errors: Family<StageLabels, Counter>,
    materializer: Family<ModeLabels, Gauge>,
    started: Instant,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for AgentMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentMetrics").finish_non_exhaustive()
    }
}

/// What the agent is now, set at each scrape.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Now {
    pub capacity: u32,
    pub held: usize,
    pub recovery_complete: bool,
    pub recovery_blocked: bool,
    pub ready: bool,
    /// Since the last successful Lease renewal (`None` before the first).
    pub heartbeat_age: Option<Duration>,
    pub cached_packages: usize,
}

impl AgentMetrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("runner_manager_agent");
        // The span export path's counts (the process's one tracer provider).
        runner_manager_telemetry::spans::register(&mut registry);
        registry.register(
            "build",
            "The agent's version",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        // Each family registered as its field is made, in this order (the order `/metrics`
        // lists them after the span counts and the build); the registry itself goes in last.
        let metrics = Self {
            launches: registered(
                &mut registry,
                "launches",
                "Launches by outcome: started (the runner process exists), rejected (not admitted) or failed (concluded before it started)",
            ),
            concluded: registered(
                &mut registry,
                "attempts_concluded",
                "Attempts this agent concluded, by outcome kind and reason (none for a completed job or an idle exit)",
            ),
            steps: registered_as(
                &mut registry,
                "launch_step_duration_seconds",
                "Time each launch step took (materialize, prepare, register = the JIT request, spawn, total)",
                Family::<StepLabels, Histogram>::new_with_constructor(|| {
                    Histogram::new(exponential_buckets(0.01, 2.0, 14))
                }),
            ),
            package_downloads: registered(
                &mut registry,
                "package_downloads",
                "Launches whose runner package had to be downloaded (not in the node's cache)",
            ),
            events: registered(
                &mut registry,
                "events",
                "Kubernetes Events the agent emitted, by reason",
            ),
            cleanup_deferrals: registered(
                &mut registry,
                "cleanup_deferrals",
                "Cleanups deferred (a runner not proven stopped, an ephemeral runtime not removable): each is retried with backoff",
            ),
            quarantines: registered(
                &mut registry,
                "slot_quarantines",
                "Persistent slots quarantined because their scrub was refused",
            ),
            slots: registered(
                &mut registry,
                "slots",
                "Runner capacity of the node (state=capacity) and what is held of it (state=used)",
            ),
            recovery_complete: registered(
                &mut registry,
                "recovery_complete",
                "1 once the startup recovery gate opened (every attempt found at start reconciled)",
            ),
            recovery_blocked: registered(
                &mut registry,
                "recovery_blocked",
                "1 while recovery is blocked on an attempt a person must look at (RecoveryBlocked Event)",
            ),
            ready: registered(
                &mut registry,
                "ready",
                "1 while /readyz answers 200 (fence held, Lease renewed recently, recovery gate open, launcher ready)",
            ),
            heartbeat_age: registered(
                &mut registry,
                "heartbeat_age_seconds",
                "Seconds since the node Lease was last renewed (-1 before the first renewal)",
            ),
            lease_renewals: registered(
                &mut registry,
                "lease_renewals",
                "Node Lease renewals by outcome (ok, failed)",
            ),
            cached_packages: registered(
                &mut registry,
                "cached_packages",
                "Runner packages materialized in the node's package cache",
            ),
            cache_bytes: registered(
                &mut registry,
                "cache_bytes",
                "Bytes in the node's dependency caches (spec.caches), as the last prune counted them",
            ),
            api_requests: registered(
                &mut registry,
                "api_requests",
                "Requests the agent sent to the Kubernetes API server, by verb (read = a GET or LIST, watch = a watch request)",
            ),
            orphans_removed: registered(
                &mut registry,
                "orphans_removed",
                "What the orphan sweep removed for attempts no longer on this node (runner, cgroup, runtime, handoff)",
            ),
            package_prunes: registered(
                &mut registry,
                "package_prunes",
                "Package prunes after launches, by result (ran, skipped, failed)",
            ),
            materializer: registered(
                &mut registry,
                "materializer",
                "How packages are laid into runtimes (1 for the one in use: overlay or copy; `--materialize`)",
            ),
            reconcile_errors: registered(
                &mut registry,
                "reconcile_errors",
                "Reconciles of an attempt that failed, by the stage of its life the attempt was in (launch, resume, supervise, cleanup, read); each is retried with backoff",
            ),
            registry,
            started: Instant::now(),
        };
        for mode in crate::packages::overlay::Materializer::ALL {
            let _ = metrics.materializer.get_or_create(&ModeLabels {
                mode: mode.as_str().into(),
            });
        }
        for stage in ReconcileStage::ALL {
            let _ = metrics.reconcile_errors.get_or_create(&StageLabels {
                stage: stage.as_str().into(),
            });
        }
        for kind in OrphanKind::ALL {
            let _ = metrics.orphans_removed.get_or_create(&KindLabels {
                kind: kind.as_str().into(),
            });
        }
        for result in PruneResult::ALL {
            let _ = metrics.package_prunes.get_or_create(&ResultLabels {
                result: result.as_str().into(),
            });
        }
        // Every series of the closed vocabularies exists from the start, at 0, so a rate or an
        // alert has a series to read before the first occurrence.
        for verb in API_VERBS {
            let _ = metrics
                .api_requests
                .get_or_create(&VerbLabels { verb: verb.into() });
        }
        for outcome in ["started", "rejected", "failed"] {
            let _ = metrics.launches.get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            });
        }
        for reason in EventReason::ALL {
            let _ = metrics.events.get_or_create(&ReasonLabels {
                reason: reason.as_str().into(),
            });
        }
        for outcome in ["ok", "failed"] {
            let _ = metrics.lease_renewals.get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            });
        }
        metrics
    }

    /// A runner process was started; the step timings in milliseconds as journalled.
    pub fn launch_started(&self, timings: &runner_manager_crds::attempt::LaunchTimings) {
        self.launches
            .get_or_create(&OutcomeLabels {
                outcome: "started".into(),
            })
            .inc();
        let ms = [
            timings.materialize_ms,
            timings.prepare_ms,
            timings.register_ms,
            timings.spawn_ms,
        ];
        let total: u64 = ms.iter().copied().fold(0, u64::saturating_add);
        for (step, v) in STEPS.iter().zip(ms.iter().chain(std::iter::once(&total))) {
            #[allow(clippy::cast_precision_loss)]
            self.steps
                .get_or_create(&StepLabels {
                    step: (*step).into(),
                })
                .observe(*v as f64 / 1000.0);
        }
        if timings.package_downloaded {
            self.package_downloads.inc();
        }
    }

    /// An attempt concluded (`from_launch`: before its runner started).
    pub fn concluded(&self, outcome: Outcome, from_launch: bool) {
        let wire = OutcomeWire::from(outcome);
        let kind = format!("{:?}", wire.kind);
        let reason = wire.reason.map_or_else(String::new, |r| format!("{r:?}"));
        self.concluded
            .get_or_create(&ConcludedLabels {
                outcome: kind,
                reason,
            })
            .inc();
        if from_launch {
            let outcome = match outcome {
                Outcome::Rejected(_) => "rejected",
                _ => "failed",
            };
            self.launches
                .get_or_create(&OutcomeLabels {
                    outcome: outcome.into(),
                })
                .inc();
        }
    }

    pub fn event(&self, reason: &'static str) {
        self.events
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc();
    }

    pub fn cleanup_deferred(&self) {
        self.cleanup_deferrals.inc();
    }

    /// The bytes the node's dependency caches hold (after a prune).
    pub fn cache_bytes(&self, bytes: u64) {
        self.cache_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    pub fn orphan_removed(&self, kind: OrphanKind) {
        self.orphans_removed
            .get_or_create(&KindLabels {
                kind: kind.as_str().into(),
            })
            .inc();
    }

    pub fn package_prune(&self, result: PruneResult) {
        self.package_prunes
            .get_or_create(&ResultLabels {
                result: result.as_str().into(),
            })
            .inc();
    }

    /// Which materializer the agent uses (set once at start).
    pub fn materializer(&self, used: crate::packages::overlay::Materializer) {
        for mode in crate::packages::overlay::Materializer::ALL {
            self.materializer
                .get_or_create(&ModeLabels {
                    mode: mode.as_str().into(),
                })
                .set(i64::from(mode == used));
        }
    }

    /// A reconcile of an attempt failed in `stage`.
    pub fn reconcile_failed(&self, stage: ReconcileStage) {
        self.reconcile_errors
            .get_or_create(&StageLabels {
                stage: stage.as_str().into(),
            })
            .inc();
    }

    pub fn quarantined(&self) {
        self.quarantines.inc();
    }

    pub fn lease_renewal(&self, ok: bool) {
        self.lease_renewals
            .get_or_create(&OutcomeLabels {
                outcome: if ok { "ok" } else { "failed" }.into(),
            })
            .inc();
    }

    /// One request sent to the API server.
    /// One request sent to the API server, by its verb (one of [`API_VERBS`]).
    pub fn api_request(&self, verb: &'static str) {
        self.api_requests
            .get_or_create(&VerbLabels { verb: verb.into() })
            .inc();
    }

    /// Seconds since the process started its metrics.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// The text exposition, with the gauges set from `now`.
    pub fn encode(&self, now: &Now) -> String {
        let set = |state: &str, v: i64| {
            self.slots
                .get_or_create(&StateLabels {
                    state: state.into(),
                })
                .set(v);
        };
        set("capacity", i64::from(now.capacity));
        set("used", i64::try_from(now.held).unwrap_or(i64::MAX));
        self.recovery_complete.set(i64::from(now.recovery_complete));
        self.recovery_blocked.set(i64::from(now.recovery_blocked));
        self.ready.set(i64::from(now.ready));
        self.heartbeat_age
            .set(now.heartbeat_age.map_or(-1.0, |d| d.as_secs_f64()));
        self.cached_packages
            .set(i64::try_from(now.cached_packages).unwrap_or(i64::MAX));
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_manager_crds::attempt::LaunchTimings;
    use runner_manager_crds::outcome::{FailureReason, RejectReason};

    #[test]
    fn launches_steps_and_conclusions_are_exposed_with_closed_labels() {
        let m = AgentMetrics::new();
        m.launch_started(&LaunchTimings {
            materialize_ms: 1500,
            prepare_ms: 20,
            register_ms: 300,
            spawn_ms: 40,
            package_downloaded: true,
        });
        m.concluded(Outcome::Rejected(RejectReason::NodeFull), true);
        m.concluded(Outcome::Failed(FailureReason::JitExpired), true);
        m.concluded(Outcome::CompletedJob, false);
        m.event("CleanupDeferred");
        m.reconcile_failed(ReconcileStage::Cleanup);
        let text = m.encode(&Now {
            capacity: 4,
            held: 1,
            recovery_complete: true,
            heartbeat_age: Some(Duration::from_millis(1500)),
            ready: true,
            ..Now::default()
        });
        for line in [
            "runner_manager_agent_launches_total{outcome=\"started\"} 1",
            "runner_manager_agent_launches_total{outcome=\"rejected\"} 1",
            "runner_manager_agent_launches_total{outcome=\"failed\"} 1",
            "runner_manager_agent_attempts_concluded_total{outcome=\"Failed\",reason=\"JitExpired\"} 1",
            "runner_manager_agent_attempts_concluded_total{outcome=\"CompletedJob\",reason=\"\"} 1",
            "runner_manager_agent_launch_step_duration_seconds_count{step=\"total\"} 1",
            "runner_manager_agent_launch_step_duration_seconds_sum{step=\"materialize\"} 1.5",
            "runner_manager_agent_package_downloads_total 1",
            "runner_manager_agent_events_total{reason=\"CleanupDeferred\"} 1",
            "runner_manager_agent_reconcile_errors_total{stage=\"cleanup\"} 1",
            "runner_manager_agent_reconcile_errors_total{stage=\"launch\"} 0",
            "runner_manager_agent_slots{state=\"capacity\"} 4",
            "runner_manager_agent_slots{state=\"used\"} 1",
            "runner_manager_agent_recovery_complete 1",
            "runner_manager_agent_heartbeat_age_seconds 1.5",
            "runner_manager_agent_build_info{version=\"",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }
}
