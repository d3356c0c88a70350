//! A policy's decisions on its attempts (issue 30 item 1, the plan split into its parts): for a
//! live policy ([`decide`]) how it scales — create with lineage, back off, `Degraded` and its
//! probe, scale down, or nothing — and which attempts are terminated and why; for a policy being
//! deleted ([`drain`]) which attempts are deleted and which stopped. From the policy's few
//! numbers ([`PolicyView`]) and its validated attempts. The operator's `controller::plan`
//! renders the decision into the policy's status, conditions, events and gauges (Kubernetes
//! types, its wire format); nothing here knows them. Pure.

use std::collections::HashSet;
use std::time::Duration;

use jiff::Timestamp;

use crate::attempt::ValidatedAttempt;
use crate::demand::{AttemptView, Counts, DemandInput, ScaleDecision, decide_holding};
use crate::failures::{
    consecutive_backoffs, consecutive_failures, is_launch_failure, launches, lineages, probe_due,
    resume_at,
};
use crate::outcome::Outcome;
use crate::recovery::TerminationReason;
use crate::state::AttemptState;
use crate::timeouts::{Due, due};

/// The operator's settings a decision depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub admission_timeout: Duration,
    pub node_lost_grace: Duration,
    pub max_consecutive_failures: u32,
    pub replacement_backoff: Duration,
    pub replacement_backoff_max: Duration,
}

/// What a decision reads of the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyView {
    pub generation: i64,
    pub min_idle: u32,
    pub max_runners: u32,
    /// `spec.suspend`.
    pub suspend: bool,
    /// Entries in the job ledger.
    pub pending_jobs: u32,
    /// How many of them the policy's own runners evidently took (`ledger::presumed_taken`).
    pub presumed_taken: u32,
    /// Resolution said the current generation is runnable (`Ready`).
    pub ready: bool,
}

/// Deregister a runner, then ask its agent to stop it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Termination {
    pub attempt: String,
    pub reason: TerminationReason,
}

/// What the scale decision asks of apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scaling {
    /// The policy is not Ready: nothing is created and nothing scaled down.
    NotReady,
    /// More runners are wanted, but launches keep failing: replacements stop (until the
    /// cool-down's probe, or while a launch is still in flight).
    Degraded,
    /// Degraded past its cool-down with nothing in flight: one probe launch; a probe that
    /// registers ends the failure streak and clears `Degraded` (issue 15 item 7).
    Probe {
        replaces: Vec<String>,
    },
    /// More runners are wanted, after the replacement backoff.
    BackingOff {
        failures: u32,
        until: Timestamp,
    },
    /// Create `count` attempts; the first ones replace these (lineage), newest first.
    Create {
        count: u32,
        replaces: Vec<String>,
    },
    /// Deregister, then terminate, these idle attempts (oldest idle first).
    ScaleDown {
        idle: Vec<String>,
    },
    AtMaxRunners {
        max: u32,
    },
    /// `spec.suspend`: nothing to create, no idle runner left to drain.
    Suspended,
    Steady,
}

/// A live policy's decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub scaling: Scaling,
    /// Terminations besides scale-down: idle runners on cordoned nodes, timeouts, attempts a
    /// person deleted. One per attempt.
    pub terminations: Vec<Termination>,
    /// How many runners the policy wants.
    pub desired: u32,
    /// Its attempts by what they are doing.
    pub counts: Counts,
    /// Failed launches of this generation in a row (toward `Degraded`).
    pub failures: u32,
    pub degraded: bool,
    /// The newest launch failure's outcome.
    pub last_failure: Option<Outcome>,
}

/// A policy being deleted: idle and starting runners are deregistered and asked to stop, busy
/// ones finish their job, `Cleaned` attempts are deleted (the finalizer goes when none is
/// left: the operator's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Drained {
    pub delete: Vec<String>,
    pub terminate: Vec<Termination>,
}

/// The drain of a deleted policy's attempts.
pub fn drain<A: AsRef<ValidatedAttempt>>(attempts: &[A]) -> Drained {
    let mut d = Drained::default();
    for a in attempts.iter().map(AsRef::as_ref) {
        let state = a.state;
        if state == AttemptState::Cleaned {
            if !a.deleting {
                d.delete.push(a.name.clone());
            }
            continue;
        }
        if a.termination.is_none()
            && state != AttemptState::Busy
            && (state.is_live() || state == AttemptState::Pending)
        {
            d.terminate.push(Termination {
                attempt: a.name.clone(),
                reason: TerminationReason::PolicyDeleted,
            });
        }
    }
    d
}

/// A live policy's decision. `in_flight`: attempts created that the cache does not show yet
/// (supply, as a ReplicaSet's expectations); `cordoned`: nodes marked unschedulable now.
pub fn decide<A: AsRef<ValidatedAttempt>>(
    policy: &PolicyView,
    attempts: &[A],
    in_flight: &[String],
    cordoned: &HashSet<String>,
    limits: Limits,
    now: Timestamp,
) -> Decision {
    let mut attempt_views: Vec<AttemptView<'_>> =
        attempts.iter().map(|a| a.as_ref().demand_view()).collect();
    attempt_views.extend(in_flight.iter().map(|name| AttemptView {
        name,
        state: AttemptState::Pending,
        termination_requested: false,
        idle_since: None,
    }));
    // Suspended, the policy wants no runner: nothing is created, and every idle runner is a
    // surplus the scale-down drains; busy ones finish (scale-down never names them). The pending
    // jobs are still counted in the status.
    let (min_idle, max_runners) = if policy.suspend {
        (0, 0)
    } else {
        (policy.min_idle, policy.max_runners)
    };
    let scale = decide_holding(
        DemandInput {
            min_idle,
            max_runners,
            pending_jobs: policy.pending_jobs,
        },
        &attempt_views,
        policy.presumed_taken,
    );
    let generation = policy.generation;
    let history = launches(attempts);
    let failures = consecutive_failures(&history, generation);
    let degraded = failures >= limits.max_consecutive_failures;
    let last_failure = history
        .iter()
        .filter(|l| is_launch_failure(l.outcome))
        .max_by_key(|l| l.created)
        .and_then(|l| l.outcome);

    let scaling = match &scale.decision {
        _ if !policy.ready => Scaling::NotReady,
        ScaleDecision::Steady | ScaleDecision::AtMaxRunners if policy.suspend => Scaling::Suspended,
        ScaleDecision::Up { .. } if degraded => {
            if probe_due(&history, generation, limits.replacement_backoff_max, now) {
                Scaling::Probe {
                    replaces: lineages(&history).into_iter().map(str::to_owned).collect(),
                }
            } else {
                Scaling::Degraded
            }
        }
        ScaleDecision::Up { create } => {
            // Backing off counts more than `Degraded` does: a kubelet's refusal for resources.
            let failures = consecutive_backoffs(&history, generation);
            let gate = resume_at(
                &history,
                failures,
                limits.replacement_backoff,
                limits.replacement_backoff_max,
            );
            match gate.filter(|at| *at > now) {
                Some(until) => Scaling::BackingOff { failures, until },
                None => Scaling::Create {
                    count: *create,
                    replaces: lineages(&history).into_iter().map(str::to_owned).collect(),
                },
            }
        }
        ScaleDecision::Down { idle } => Scaling::ScaleDown {
            idle: idle.iter().map(|s| (*s).to_owned()).collect(),
        },
        ScaleDecision::AtMaxRunners => Scaling::AtMaxRunners {
            max: policy.max_runners,
        },
        ScaleDecision::Steady => Scaling::Steady,
    };

    // One termination per attempt: the first reason found wins (scale-down, then a cordoned
    // node, then a timeout or a deletion), as the live re-read before each one would decide.
    let mut named: HashSet<&str> = match &scaling {
        Scaling::ScaleDown { idle } => idle.iter().map(String::as_str).collect(),
        _ => HashSet::new(),
    };
    let mut terminations = Vec::new();
    // A cordoned node keeps its busy runners until their jobs end; its idle ones are
    // deregistered and stopped now (DESIGN §11), and demand places their successors elsewhere.
    for (a, view) in attempts.iter().map(AsRef::as_ref).zip(&attempt_views) {
        if view.state == AttemptState::Idle
            && !view.termination_requested
            && cordoned.contains(a.node.as_str())
            && named.insert(view.name)
        {
            terminations.push(Termination {
                attempt: view.name.to_owned(),
                reason: TerminationReason::Drain,
            });
        }
    }
    // Timeouts that need a deregistration, and attempts a person deleted.
    for a in attempts.iter().map(AsRef::as_ref) {
        let reason = match due(
            a,
            now,
            limits.admission_timeout,
            None,
            limits.node_lost_grace,
        ) {
            Some(Due::Terminate(r)) => Some(r),
            _ => (a.deleting
                && a.termination.is_none()
                && a.state.is_live()
                && a.state != AttemptState::Busy)
                .then_some(TerminationReason::Deleted),
        };
        if let Some(reason) = reason
            && named.insert(a.name.as_str())
        {
            terminations.push(Termination {
                attempt: a.name.clone(),
                reason,
            });
        }
    }
    Decision {
        scaling,
        terminations,
        desired: scale.desired,
        counts: scale.counts,
        failures,
        degraded,
        last_failure,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempt::testing::{attempt, in_state, t};

    const LIMITS: Limits = Limits {
        admission_timeout: Duration::from_secs(60),
        node_lost_grace: Duration::from_secs(60),
        max_consecutive_failures: 3,
        replacement_backoff: Duration::from_secs(10),
        replacement_backoff_max: Duration::from_secs(300),
    };

    fn policy(min_idle: u32, max_runners: u32) -> PolicyView {
        PolicyView {
            generation: 1,
            min_idle,
            max_runners,
            suspend: false,
            pending_jobs: 0,
            presumed_taken: 0,
            ready: true,
        }
    }

    /// The decision without Kubernetes: `minIdle` creates the difference, an idle runner on a
    /// cordoned node is drained, and a policy that is not Ready creates nothing whatever it
    /// wants (the operator's `plan_tests` cover the rest through the status they render).
    #[test]
    fn a_policy_view_and_validated_attempts_are_all_a_decision_reads() {
        let idle = in_state(attempt("web-a", 0), AttemptState::Idle, 900);
        let attempts = [idle];
        let cordoned: HashSet<String> = ["node-a".to_owned()].into();
        let d = decide(&policy(2, 5), &attempts, &[], &cordoned, LIMITS, t(1000));
        assert_eq!(
            d.scaling,
            Scaling::Create {
                count: 1,
                replaces: Vec::new()
            }
        );
        assert_eq!(
            d.terminations,
            [Termination {
                attempt: "web-a".into(),
                reason: TerminationReason::Drain
            }]
        );
        assert_eq!((d.desired, d.counts.idle), (2, 1));
        let not_ready = PolicyView {
            ready: false,
            ..policy(2, 5)
        };
        let d = decide(&not_ready, &attempts, &[], &HashSet::new(), LIMITS, t(1000));
        assert_eq!(d.scaling, Scaling::NotReady);
    }

    #[test]
    fn a_drain_deletes_cleaned_attempts_and_stops_all_but_busy_ones() {
        let attempts = [
            in_state(attempt("done", 0), AttemptState::Cleaned, 10),
            in_state(attempt("busy", 0), AttemptState::Busy, 10),
            in_state(attempt("idle", 0), AttemptState::Idle, 10),
            attempt("pending", 0),
        ];
        let d = drain(&attempts);
        assert_eq!(d.delete, ["done"]);
        let stopped: Vec<&str> = d.terminate.iter().map(|t| t.attempt.as_str()).collect();
        assert_eq!(stopped, ["idle", "pending"]);
    }
}
