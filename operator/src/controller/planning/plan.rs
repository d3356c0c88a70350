//! One policy's decisions as data (in the style of linkerd2's policy-controller core): `plan`
//! reads the policy, its attempts, its resolution and the cordoned nodes and returns a [`Plan`]
//! — creations, terminations with reasons, the status and the events — without I/O;
//! the apply stage (`policy::reconcile`) carries it out. Placement ([`place`]) is pure too: it runs under the
//! placement worker's lock against the node facts of that moment, so it is a second pure step
//! rather than part of `plan`. What apply made of the scaling step ([`Scaled`]) settles the
//! `Scaling` condition ([`settle`]).
//!
//! The decisions on the attempts — scaling with lineage, the replacement backoff, `Degraded`
//! and its probe, scale-down, terminations for cordoned nodes, timeouts and deletions, the drain
//! — are the core crate's (`runner_manager_core::scaling`, on the validated attempts and a
//! `PolicyView`); this module adds what is the policy's own (its finalizer, and the status, its
//! conditions, the events and the gauges that render the decision). All of it is unit-tested
//! through [`plan`] in `plan_tests`: drain on deletion, the finalizer, demand (`minIdle`,
//! pending jobs, `maxRunners`), creation with lineage, the replacement backoff, `Degraded`,
//! scale-down, placement refusals, cordoned nodes, timeouts, deleted attempts, and the status
//! with its conditions.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use runner_manager_crds::attempt::{RunnerAttempt, TerminationReason};
use runner_manager_crds::conditions::{Condition, ConditionStatus, upsert};
use runner_manager_crds::outcome::Outcome;
use runner_manager_crds::policy::{
    PolicyConditionType, PolicyReason, ScalePolicy, ScalePolicyStatus,
};
use runner_manager_crds::validate::attempt::Attempt;
use serde_json::Value;

use crate::controller::POLICY_FINALIZER;
use crate::controller::events::Reason;
use crate::controller::placement_worker::{NodeFacts, PlacementWorker};
use crate::controller::snapshot::{Pinned, build};
use crate::metrics::PolicyGauges;
use crate::policy::placement::Unplaceable;
use runner_manager_core::scaling::{Decision, PolicyView, decide};
pub use runner_manager_core::scaling::{Limits, Scaling, Termination};

pub type Cond = Condition<PolicyConditionType, PolicyReason>;

/// What resolution said of the policy's current generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness<'a> {
    /// Not resolved yet (a fresh leader's first pass before resolution answered).
    Unresolved,
    Valid {
        version: &'a str,
        runner_group_id: i64,
    },
    Invalid {
        reason: PolicyReason,
        message: &'a str,
    },
}

/// Everything a plan reads.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    pub policy: &'a ScalePolicy,
    /// The policy's attempts, each validated once (the plan reads only their views).
    pub attempts: &'a [Attempt],
    pub readiness: Readiness<'a>,
    /// Nodes marked unschedulable now.
    pub cordoned: &'a HashSet<String>,
    /// Policies of other namespaces naming the same target.
    pub conflicts: &'a [String],
    /// Attempts this leader created for the policy that the cache does not show yet. They are
    /// supply: without them a reconcile that runs between a create and its watch event (the
    /// policy's own status write triggers one) would create the same runners again.
    pub in_flight: &'a [String],
    pub limits: Limits,
    pub now: Timestamp,
}

/// An Event about the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyEvent {
    pub reason: Reason,
    pub note: String,
}

/// A policy's plan.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// The policy is being deleted.
    Drain(Drain),
    /// The policy is live.
    Run(Box<Run>),
}

/// A policy being deleted: idle and starting runners are deregistered and asked to stop, busy
/// ones finish their job, `Cleaned` attempts are deleted, and the finalizer goes when none is
/// left.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Drain {
    pub delete: Vec<String>,
    pub terminate: Vec<Termination>,
    /// The finalizers without ours, once every attempt is gone.
    pub release: Option<Vec<String>>,
    pub events: Vec<PolicyEvent>,
}

/// A live policy's plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// The finalizers with ours added, when it is missing (applied before anything is created).
    pub finalizer: Option<Vec<String>>,
    pub scaling: Scaling,
    /// Terminations besides scale-down: idle runners on cordoned nodes, timeouts, attempts a
    /// person deleted. One per attempt.
    pub terminations: Vec<Termination>,
    pub status: StatusPlan,
    pub events: Vec<PolicyEvent>,
    pub gauges: PolicyGauges,
}

/// The status to write once the `Scaling` condition is known ([`settle`]).
#[derive(Clone, Debug, PartialEq)]
pub struct StatusPlan {
    /// The stored status with the counts, generation and resolution applied.
    pub base: ScalePolicyStatus,
    pub ready: Cond,
    pub degraded: Cond,
    pub conflict: Cond,
    pub generation: i64,
    pub now: Timestamp,
}

/// What apply made of the scaling step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scaled {
    /// Nothing to carry out.
    Nothing,
    Created {
        created: u32,
        wanted: u32,
        refused: Option<Unplaceable>,
    },
    /// Scale-down: this many idle runners were deregistered and asked to stop.
    Asked(u32),
}

pub fn cond(
    t: PolicyConditionType,
    ok: bool,
    reason: PolicyReason,
    message: String,
    generation: i64,
    now: Timestamp,
) -> Cond {
    Condition {
        type_: t,
        status: if ok {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        },
        reason,
        message,
        last_transition_time: Some(Time(now)),
        observed_generation: Some(generation),
    }
}

/// Plan one policy. Pure.
pub fn plan(i: &Inputs<'_>) -> Plan {
    if i.policy.metadata.deletion_timestamp.is_some() {
        return Plan::Drain(drain(i.policy, i.attempts));
    }
    Plan::Run(Box::new(run(i)))
}

fn drain(policy: &ScalePolicy, attempts: &[Attempt]) -> Drain {
    let drained = runner_manager_core::scaling::drain(attempts);
    let mut d = Drain {
        delete: drained.delete,
        terminate: drained.terminate,
        ..Drain::default()
    };
    if attempts.is_empty() {
        let all = policy.metadata.finalizers.clone().unwrap_or_default();
        let rest: Vec<String> = all
            .iter()
            .filter(|f| *f != POLICY_FINALIZER)
            .cloned()
            .collect();
        if rest.len() != all.len() {
            d.events.push(PolicyEvent {
                reason: Reason::Drained,
                note: "every attempt is gone; the policy is released".into(),
            });
            d.release = Some(rest);
        }
    }
    d
}

fn run(i: &Inputs<'_>) -> Run {
    let policy = i.policy;
    let now = i.now;
    let generation = policy.metadata.generation.unwrap_or(0);
    let old = policy.status.clone().unwrap_or_default();
    let pending_jobs = u32::try_from(old.pending_jobs.len()).unwrap_or(u32::MAX);

    let finalizers = policy.metadata.finalizers.clone().unwrap_or_default();
    let finalizer = (!finalizers.iter().any(|f| f == POLICY_FINALIZER)).then(|| {
        let mut with = finalizers;
        with.push(POLICY_FINALIZER.to_owned());
        with
    });

    let decision = decide(
        &PolicyView {
            generation,
            min_idle: policy.spec.min_idle,
            max_runners: policy.spec.max_runners,
            suspend: policy.spec.suspend,
            pending_jobs,
            presumed_taken: crate::policy::ledger::presumed_taken_of(policy, i.attempts, now),
            ready: matches!(i.readiness, Readiness::Valid { .. }),
        },
        i.attempts,
        i.in_flight,
        i.cordoned,
        i.limits,
        now,
    );
    let Decision {
        scaling,
        terminations,
        desired,
        counts,
        failures,
        degraded,
        last_failure,
    } = decision;

    // Status: the leader's own fields.
    let mut base = old.clone();
    base.observed_generation = Some(generation);
    base.desired = desired;
    base.starting = counts.starting;
    base.idle = counts.idle;
    base.busy = counts.busy;
    base.cleaning = counts.cleaning + counts.terminating;
    if let Readiness::Valid {
        version,
        runner_group_id,
    } = i.readiness
    {
        base.runner_group_id = Some(runner_group_id);
        base.runner_version = Some(version.to_owned());
    }
    if base.desired != old.desired {
        base.last_scale_time = Some(Time(now));
    }
    let gauges = PolicyGauges {
        desired: base.desired,
        starting: base.starting,
        idle: base.idle,
        busy: base.busy,
        cleaning: base.cleaning,
        pending_jobs,
        min: policy.spec.min_idle,
        max: policy.spec.max_runners,
    };
    let ready_cond = match i.readiness {
        Readiness::Valid { version, .. } => cond(
            PolicyConditionType::Ready,
            true,
            PolicyReason::Valid,
            format!("valid; runner {version} pinned"),
            generation,
            now,
        ),
        Readiness::Invalid { reason, message } => cond(
            PolicyConditionType::Ready,
            false,
            reason,
            message.to_owned(),
            generation,
            now,
        ),
        Readiness::Unresolved => cond(
            PolicyConditionType::Ready,
            false,
            PolicyReason::GitHubUnreachable,
            "not resolved yet".into(),
            generation,
            now,
        ),
    };
    let degraded_cond = if degraded {
        cond(
            PolicyConditionType::Degraded,
            true,
            PolicyReason::LaunchesFailing,
            format!(
                "{failures} consecutive launches failed (last: {}); replacements stopped: one probe \
                 launch every {}s clears this if it works, and so does a spec change",
                last_failure.map_or_else(|| "unknown".to_owned(), failure_reason),
                i.limits.replacement_backoff_max.as_secs()
            ),
            generation,
            now,
        )
    } else {
        cond(
            PolicyConditionType::Degraded,
            false,
            PolicyReason::Healthy,
            "launches succeed".into(),
            generation,
            now,
        )
    };
    let was_true = |t: PolicyConditionType| {
        old.conditions
            .iter()
            .any(|c| c.type_ == t && c.status == ConditionStatus::True)
    };
    let conflict_cond = conflict_condition(i.conflicts, generation, now);
    let mut events = Vec::new();
    if !i.conflicts.is_empty() && !was_true(PolicyConditionType::Conflict) {
        events.push(PolicyEvent {
            reason: Reason::TargetConflict,
            note: conflict_cond.message.clone(),
        });
    }
    if degraded && !was_true(PolicyConditionType::Degraded) {
        events.push(PolicyEvent {
            reason: Reason::Degraded,
            note: format!("{failures} consecutive launches failed; replacements stopped"),
        });
    }
    Run {
        finalizer,
        scaling,
        terminations,
        status: StatusPlan {
            base,
            ready: ready_cond,
            degraded: degraded_cond,
            conflict: conflict_cond,
            generation,
            now,
        },
        events,
        gauges,
    }
}

fn failure_reason(o: Outcome) -> String {
    serde_json::to_value(o)
        .ok()
        .and_then(|v| v.get("reason").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_default()
}

/// The `Scaling` condition from the plan's scaling step and what apply made of it, and the
/// Event a placement refusal publishes when nothing could be created. Pure.
pub fn scaling_condition(
    scaling: &Scaling,
    scaled: Scaled,
) -> ((bool, PolicyReason, String), Option<PolicyEvent>) {
    let c = match (scaling, scaled) {
        (Scaling::NotReady, _) => (
            false,
            PolicyReason::Steady,
            "nothing is created while the policy is not Ready".into(),
        ),
        (Scaling::Degraded, _) => (
            false,
            PolicyReason::LaunchesFailing,
            "replacements stopped: the policy is Degraded until a probe launch works or its spec \
             changes"
                .into(),
        ),
        (
            Scaling::Probe { .. },
            Scaled::Created {
                created,
                refused: None,
                ..
            },
        ) => (
            false,
            PolicyReason::LaunchesFailing,
            format!("Degraded: {created} probe launch(es) after the cool-down"),
        ),
        (Scaling::BackingOff { failures, until }, _) => (
            true,
            PolicyReason::ScalingUp,
            format!(
                "{failures} launch(es) failed in a row; next replacement after {until} (backoff)"
            ),
        ),
        (
            Scaling::Create { .. } | Scaling::Probe { .. },
            Scaled::Created {
                created,
                refused: Some(why),
                ..
            },
        ) => {
            let event = (created == 0).then(|| PolicyEvent {
                reason: Reason::Unplaceable,
                note: why.message().into(),
            });
            return (
                (
                    false,
                    PolicyReason::NoEligibleNode,
                    why.message().to_owned(),
                ),
                event,
            );
        }
        (
            Scaling::Create { count, .. },
            Scaled::Created {
                created,
                refused: None,
                ..
            },
        ) => (
            true,
            PolicyReason::ScalingUp,
            format!("{created} attempt(s) created toward {count}"),
        ),
        (Scaling::ScaleDown { .. }, Scaled::Asked(asked)) => (
            true,
            PolicyReason::ScalingDown,
            format!("{asked} idle runner(s) deregistered and asked to stop"),
        ),
        (Scaling::AtMaxRunners { max }, _) => (
            true,
            PolicyReason::AtMaxRunners,
            format!("at spec.maxRunners ({max})"),
        ),
        (Scaling::Suspended, _) => (
            false,
            PolicyReason::Suspended,
            "spec.suspend is true: nothing is launched, busy runners finish their job; set it \
             to false to resume"
                .to_owned(),
        ),
        // Steady, or a step apply did not carry out.
        _ => (
            true,
            PolicyReason::Steady,
            "supply matches demand".to_owned(),
        ),
    };
    (c, None)
}

/// The status to write: the plan's with the `Scaling` condition, conditions in their stored
/// order (Ready, Scaling, Degraded, Conflict). Pure.
pub fn settle(s: &StatusPlan, scaling: (bool, PolicyReason, String)) -> ScalePolicyStatus {
    let mut next = s.base.clone();
    upsert(&mut next.conditions, s.ready.clone());
    upsert(
        &mut next.conditions,
        cond(
            PolicyConditionType::Scaling,
            scaling.0,
            scaling.1,
            scaling.2,
            s.generation,
            s.now,
        ),
    );
    upsert(&mut next.conditions, s.degraded.clone());
    upsert(&mut next.conditions, s.conflict.clone());
    next
}

/// How many conflicting policies a message names before it says "and N more".
const CONFLICTS_NAMED: usize = 5;

/// The `Conflict` condition: True naming the other namespaces' policies on the same target.
/// Pure.
pub fn conflict_condition(conflicts: &[String], generation: i64, now: Timestamp) -> Cond {
    if conflicts.is_empty() {
        return cond(
            PolicyConditionType::Conflict,
            false,
            PolicyReason::NoConflict,
            "no other namespace names this target".into(),
            generation,
            now,
        );
    }
    let mut named = conflicts
        .iter()
        .take(CONFLICTS_NAMED)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if conflicts.len() > CONFLICTS_NAMED {
        named.push_str(&format!(" and {} more", conflicts.len() - CONFLICTS_NAMED));
    }
    cond(
        PolicyConditionType::Conflict,
        true,
        PolicyReason::TargetClaimedElsewhere,
        format!(
            "spec.github.url: the same target is named by {named} in another namespace; jobs go \
             only to Ready policies whose credentials were proven on it. If that namespace should \
             not serve this owner, ask the cluster admin to bind the owner to this namespace \
             (--owner-namespaces)"
        ),
        generation,
        now,
    )
}

/// One attempt placed and built, ready to be created.
#[derive(Clone, Debug)]
pub struct NewAttempt {
    pub attempt: RunnerAttempt,
    pub node: String,
    pub replaces: Option<String>,
}

/// What placement made of a `Create`.
#[derive(Clone, Debug)]
pub struct Placed {
    pub attempts: Vec<NewAttempt>,
    /// Why the rest could not be placed.
    pub refused: Option<Unplaceable>,
}

/// Place and build up to `count` attempts, one node at a time, each recorded in the worker as
/// expected before the next choice (so no two land on one free slot) and counted on its node.
/// Pure over the worker, the facts and `new_id`.
pub fn place(
    worker: &mut PlacementWorker,
    facts: &mut [NodeFacts],
    pinned: &Pinned<'_>,
    count: u32,
    replaces: &[String],
    now: Timestamp,
    mut new_id: impl FnMut() -> uuid::Uuid,
) -> Placed {
    let policy = pinned.policy;
    let uid = policy.uid.clone();
    // The scheduler's view of the runner: its placeholder (native) or pod (OCI) requests this.
    let resources = policy.spec.execution.resources.as_ref();
    let need = crate::policy::placement::Resources::of(
        resources.and_then(|r| r.cpu.as_ref()).map(|q| q.0.as_str()),
        resources
            .and_then(|r| r.memory.as_ref())
            .map(|q| q.0.as_str()),
    );
    let mut lineage = replaces.iter();
    let mut attempts: Vec<NewAttempt> = Vec::new();
    let mut refused = None;
    // A runner labelled with an architecture runs only on nodes of it.
    let Some(packages) = pinned.packages.for_labels(&policy.spec.labels) else {
        return Placed {
            attempts,
            refused: (count > 0).then_some(Unplaceable::NoPackageForArchitecture),
        };
    };
    for _ in 0..count {
        let (node, package) = match worker.choose(
            facts,
            &policy.spec.node_selector,
            need,
            &uid,
            &packages,
            now,
        ) {
            Ok(chosen) => chosen,
            Err(why) => {
                refused = Some(why);
                break;
            }
        };
        let replaces = lineage.next().cloned();
        let attempt = build(pinned, package, new_id(), &node, replaces.clone());
        let name = attempt.metadata.name.clone().unwrap_or_default();
        worker.created(&name, &node, now);
        if let Some(f) = facts.iter_mut().find(|f| f.name == node) {
            f.counted.insert(name);
        }
        attempts.push(NewAttempt {
            attempt,
            node,
            replaces,
        });
    }
    Placed { attempts, refused }
}

/// Creation's metric label: a replacement or new demand.
pub fn creation_reason(n: &NewAttempt) -> &'static str {
    if n.replaces.is_some() {
        "replacement"
    } else {
        "scale_up"
    }
}

/// The `AttemptCreated` Event's note.
pub fn creation_note(n: &NewAttempt) -> String {
    match &n.replaces {
        Some(old) => format!("created on node {}, replacing {old}", n.node),
        None => format!("created on node {}", n.node),
    }
}

/// Stable ordering for tests and logs: terminations by attempt name.
pub fn by_attempt(t: &[Termination]) -> BTreeMap<&str, TerminationReason> {
    t.iter().map(|t| (t.attempt.as_str(), t.reason)).collect()
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
