//! Housekeeping of attempts that needs no GitHub call: the cleanup finalizer of `Cleaned`
//! attempts, the abandon annotation, the operator's two edges (`ExpireAdmission`, `LoseNode`)
//! and the history limit of `Cleaned` attempts per policy.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use runner_manager_crds::attempt::{RunnerAttempt, Transition};
use runner_manager_crds::names::agent_lease_name;
use runner_manager_crds::outcome::{OrphanReason, Outcome, RejectReason};
use runner_manager_crds::state::{Actor, AttemptState};
use runner_manager_crds::writer::{Decision, JournalError, JournalWriter};
use runner_manager_crds::{ABANDON_ANNOTATION, CLEANUP_FINALIZER};

use crate::controller::Ctx;
use crate::controller::errors::ReconcileError;
use crate::controller::events::Reason;
use crate::controller::placement_worker::agent_of;
use crate::controller::timeouts::{Due, due};
use crate::controller::writes::{FIELD_MANAGER, WriteKind};

fn has_finalizer(a: &RunnerAttempt) -> bool {
    a.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == CLEANUP_FINALIZER))
}

fn without_finalizer(a: &RunnerAttempt) -> Vec<String> {
    a.metadata
        .finalizers
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f != CLEANUP_FINALIZER)
        .collect()
}

/// When the agent of `node` stopped renewing its Lease (None while it is fresh). A node whose
/// Lease is gone entirely is measured from `fallback` (the attempt's last change).
pub fn node_gone_since(
    ctx: &Ctx,
    node: &str,
    now: Timestamp,
    fallback: Option<Timestamp>,
) -> Option<Timestamp> {
    let lease = ctx
        .caches
        .leases
        .find(|l| l.metadata.name.as_deref() == Some(agent_lease_name(node).as_str()));
    let leading_since = ctx.leading_since.get().copied();
    let Some(lease) = lease else {
        return fallback.map(|f| counted_from(f, leading_since));
    };
    let spec = lease.spec.as_ref()?;
    let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?.0;
    let duration = agent_of(&lease).map_or(std::time::Duration::from_secs(40), |(a, _)| a.duration);
    let expires = renewed
        .checked_add(k8s_openapi::jiff::SignedDuration::try_from(duration).ok()?)
        .ok()?;
    let expires = counted_from(expires, leading_since);
    (expires < now).then_some(expires)
}

/// A node's silence is counted from when this replica began leading at the earliest. Agents
/// write their Lease through the admission webhook every replica serves (`failurePolicy: Fail`),
/// so while no operator runs no agent can renew: a leader arriving after a long outage must not
/// judge every node lost at its first pass. Pure.
pub fn counted_from(since: Timestamp, leading_since: Option<Timestamp>) -> Timestamp {
    leading_since.map_or(since, |l| since.max(l))
}

/// Take one of the operator's edges with a CAS on the cached resourceVersion, through the one
/// journal writer. A conflict is not re-read: someone wrote since (perhaps the agent, which would
/// mean its node is not lost), and the next pass decides again on the fresh object.
async fn take_edge(ctx: &Ctx, a: &RunnerAttempt, outcome: Outcome, now: Timestamp) -> bool {
    let ns = a.metadata.namespace.as_deref().unwrap_or_default();
    let name = a.metadata.name.as_deref().unwrap_or_default();
    let writer =
        JournalWriter::new(ctx.writer.attempts(ns), Actor::Operator).field_manager(FIELD_MANAGER);
    let edge = Decision::Take(Transition::Conclude(outcome));
    match writer.write(a, edge, now).await {
        // Refused by the state machine: nothing was sent.
        Err(JournalError::Patch(_)) => false,
        written => {
            ctx.metrics.api_write(WriteKind::AttemptEdge.as_str());
            written
                .inspect_err(
                    |e| tracing::debug!(error = %e, attempt = name, "operator edge not taken"),
                )
                .is_ok_and(|w| w.is_some())
        }
    }
}

/// One step of housekeeping, decided without I/O ([`plan`]).
#[derive(Clone, Copy, Debug)]
pub enum Housekeep<'a> {
    /// Released by the abandon annotation: an Event, the finalizer released, the attempt
    /// deleted; the agent's cleanup is not waited for.
    Abandon(&'a RunnerAttempt),
    /// `Cleaned` and still holding the cleanup finalizer: agents write status only, so the
    /// operator releases what the agent cleaned.
    Release(&'a RunnerAttempt),
    /// `Pending` past the admission timeout: the operator's `ExpireAdmission` edge.
    ExpireAdmission(&'a RunnerAttempt),
    /// Its node's agent Lease expired past the grace: the operator's `LoseNode` edge.
    LoseNode(&'a RunnerAttempt),
    /// A `Cleaned` attempt beyond the policy's history: deleted.
    Prune(&'a RunnerAttempt),
}

/// What housekeeping bounds by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub admission_timeout: std::time::Duration,
    pub node_lost_grace: std::time::Duration,
    /// `Cleaned` attempts kept per policy.
    pub history: usize,
}

/// The housekeeping of `attempts`, in the order it is carried out: each attempt's step in the
/// given order, then the prunes. `node_gone` says when a node's agent stopped renewing its
/// Lease (`None` while it is fresh; the second argument is the attempt's last change, the
/// fallback for a node whose Lease is gone). Pure.
pub fn plan<'a>(
    attempts: &'a [Arc<RunnerAttempt>],
    now: Timestamp,
    bounds: Bounds,
    node_gone: impl Fn(&str, Option<Timestamp>) -> Option<Timestamp>,
) -> Vec<Housekeep<'a>> {
    let mut steps = Vec::new();
    let mut cleaned: BTreeMap<(&str, &str), Vec<&'a RunnerAttempt>> = BTreeMap::new();
    for a in attempts {
        let a: &'a RunnerAttempt = a;
        let abandoned = a
            .metadata
            .annotations
            .as_ref()
            .and_then(|m| m.get(ABANDON_ANNOTATION))
            .is_some_and(|v| v == "true");
        if abandoned && has_finalizer(a) {
            steps.push(Housekeep::Abandon(a));
            continue;
        }
        if a.state() == AttemptState::Cleaned {
            if has_finalizer(a) {
                steps.push(Housekeep::Release(a));
            }
            cleaned
                .entry((
                    a.metadata.namespace.as_deref().unwrap_or_default(),
                    a.spec.policy.as_str(),
                ))
                .or_default()
                .push(a);
            continue;
        }
        let fallback = a
            .status
            .as_ref()
            .and_then(|s| s.journal.timestamps().last_state_change_at.as_ref())
            .or(a.metadata.creation_timestamp.as_ref())
            .map(|t| t.0);
        let gone = node_gone(&a.spec.node_name, fallback);
        match due(
            a,
            now,
            bounds.admission_timeout,
            gone,
            bounds.node_lost_grace,
        ) {
            Some(Due::ExpireAdmission) => steps.push(Housekeep::ExpireAdmission(a)),
            Some(Due::LoseNode) => steps.push(Housekeep::LoseNode(a)),
            Some(Due::Terminate(_)) | None => {}
        }
    }
    // History: keep the newest `history` Cleaned attempts of each policy.
    for (_, mut list) in cleaned {
        if list.len() <= bounds.history {
            continue;
        }
        list.sort_by_key(|a| {
            std::cmp::Reverse(
                a.status
                    .as_ref()
                    .and_then(|s| s.journal.timestamps().cleaned_at.clone())
                    .map(|t| t.0),
            )
        });
        steps.extend(
            list.into_iter()
                .skip(bounds.history)
                .filter(|a| a.metadata.deletion_timestamp.is_none())
                .map(Housekeep::Prune),
        );
    }
    steps
}

/// Housekeeping of `attempts` (one policy's, or those whose policy is gone): [`plan`], then
/// each step carried out. Each failed write is returned, and the rest goes on; the next
/// reconcile decides again on the fresh objects.
pub async fn housekeeping(
    ctx: &Ctx,
    attempts: &[Arc<RunnerAttempt>],
    now: Timestamp,
) -> Vec<ReconcileError> {
    let bounds = Bounds {
        admission_timeout: ctx.settings.admission_timeout,
        node_lost_grace: ctx.settings.node_lost_grace,
        history: usize::try_from(ctx.settings.attempt_history).unwrap_or(usize::MAX),
    };
    let steps = plan(attempts, now, bounds, |node, fallback| {
        node_gone_since(ctx, node, now, fallback)
    });
    let mut failed = Vec::new();
    for step in steps {
        match step {
            Housekeep::Abandon(a) => {
                let ns = a.metadata.namespace.as_deref().unwrap_or_default();
                let name = a.metadata.name.as_deref().unwrap_or_default();
                ctx.events.publish(
                    &a.object_ref(&()),
                    Reason::Abandoned,
                    format!(
                        "released by the {ABANDON_ANNOTATION} annotation in state {:?}; the agent's cleanup is not waited for",
                        a.state()
                    ),
                );
                if let Err(source) = ctx.writer.attempt_finalizers(a, without_finalizer(a)).await {
                    failed.push(ReconcileError::write(WriteKind::AttemptFinalizer)(source));
                }
                if let Err(source) = ctx.writer.delete_attempt(ns, name).await {
                    failed.push(ReconcileError::write(WriteKind::AttemptDelete)(source));
                }
            }
            Housekeep::Release(a) => {
                if let Err(source) = ctx.writer.attempt_finalizers(a, without_finalizer(a)).await {
                    failed.push(ReconcileError::write(WriteKind::AttemptFinalizer)(source));
                }
            }
            Housekeep::ExpireAdmission(a) => {
                let outcome = Outcome::Rejected(RejectReason::AdmissionTimeout);
                if take_edge(ctx, a, outcome, now).await {
                    ctx.events.publish(
                        &a.object_ref(&()),
                        Reason::AdmissionExpired,
                        format!(
                            "no agent admitted the attempt within {}s; a replacement is placed",
                            bounds.admission_timeout.as_secs()
                        ),
                    );
                }
            }
            Housekeep::LoseNode(a) => {
                let outcome = Outcome::Orphaned(OrphanReason::NodeLost);
                if take_edge(ctx, a, outcome, now).await {
                    ctx.events.publish(
                        &a.object_ref(&()),
                        Reason::NodeLost,
                        "the node's agent Lease expired past the grace period; a replacement is placed".into(),
                    );
                }
            }
            Housekeep::Prune(a) => {
                let ns = a.metadata.namespace.as_deref().unwrap_or_default();
                let name = a.metadata.name.as_deref().unwrap_or_default();
                if let Err(source) = ctx.writer.delete_attempt(ns, name).await {
                    failed.push(ReconcileError::write(WriteKind::AttemptDelete)(source));
                }
            }
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_manager_crds::fixtures::AttemptBuilder;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn held(mut a: RunnerAttempt) -> RunnerAttempt {
        a.metadata.finalizers = Some(vec![CLEANUP_FINALIZER.to_owned()]);
        a
    }

    fn cleaned(name: &str, at: i64, finalizer: bool) -> Arc<RunnerAttempt> {
        let a = AttemptBuilder::new(name, "web")
            .state(AttemptState::Cleaned)
            .edges_at(t(at))
            .build();
        Arc::new(if finalizer { held(a) } else { a })
    }

    fn pending(name: &str, created: i64) -> Arc<RunnerAttempt> {
        Arc::new(AttemptBuilder::new(name, "web").created(t(created)).build())
    }

    /// `Idle` on `node` since `since`.
    fn idle_on(name: &str, node: &str, since: i64) -> Arc<RunnerAttempt> {
        Arc::new(
            AttemptBuilder::new(name, "web")
                .node(node)
                .state(AttemptState::Idle)
                .edges_at(t(since))
                .build(),
        )
    }

    const BOUNDS: Bounds = Bounds {
        admission_timeout: std::time::Duration::from_secs(60),
        node_lost_grace: std::time::Duration::from_secs(60),
        history: 2,
    };

    fn names(steps: &[Housekeep<'_>]) -> Vec<String> {
        steps
            .iter()
            .map(|s| {
                let (what, a) = match s {
                    Housekeep::Abandon(a) => ("abandon", a),
                    Housekeep::Release(a) => ("release", a),
                    Housekeep::ExpireAdmission(a) => ("expire", a),
                    Housekeep::LoseNode(a) => ("lose", a),
                    Housekeep::Prune(a) => ("prune", a),
                };
                format!("{what} {}", a.metadata.name.as_deref().unwrap_or_default())
            })
            .collect()
    }

    /// Each attempt's step in the order given, the history's prunes last; an abandoned attempt
    /// is released whatever else would be due for it.
    #[test]
    fn housekeeping_plans_each_attempts_step_in_order_and_prunes_last() {
        let mut abandoned = held(
            AttemptBuilder::new("ab", "web")
                .node("lost")
                .state(AttemptState::Busy)
                .build(),
        );
        abandoned.metadata.annotations =
            Some([(ABANDON_ANNOTATION.to_owned(), "true".to_owned())].into());
        let attempts = vec![
            cleaned("c-old", 100, true),
            cleaned("c-mid", 200, true),
            cleaned("c-new", 300, false),
            pending("p", 0),
            idle_on("i", "lost", 900),
            Arc::new(abandoned),
            Arc::new(
                AttemptBuilder::new("fresh", "web")
                    .state(AttemptState::Idle)
                    .edges_at(t(990))
                    .build(),
            ),
        ];
        let gone = |node: &str, _: Option<Timestamp>| (node == "lost").then(|| t(0));
        let steps = plan(&attempts, t(1000), BOUNDS, gone);
        assert_eq!(
            names(&steps),
            [
                "release c-old",
                "release c-mid",
                "expire p",
                "lose i",
                "abandon ab",
                "prune c-old",
            ]
        );
    }

    fn abandoned(name: &str) -> Arc<RunnerAttempt> {
        let mut a = held(
            AttemptBuilder::new(name, "web")
                .state(AttemptState::Busy)
                .resource_version("7")
                .build(),
        );
        a.metadata.annotations = Some([(ABANDON_ANNOTATION.to_owned(), "true".to_owned())].into());
        Arc::new(a)
    }

    /// Housekeeping of an abandoned attempt, then a cleaned one, against a scripted API server
    /// that answers with `answer`: what failed, and the requests sent.
    async fn housekeep_abandoned_then_cleaned(
        answer: impl Fn(&crate::controller::scripted::Seen) -> crate::controller::scripted::Answer
        + Send
        + Sync
        + 'static,
    ) -> (Vec<ReconcileError>, crate::controller::scripted::Recorded) {
        use crate::controller::scripted;
        let (kube, seen) = scripted::client(answer);
        let ctx = scripted::ctx(kube);
        let attempts = vec![abandoned("ab"), cleaned("done", 100, true)];
        (housekeeping(&ctx, &attempts, t(1000)).await, seen)
    }

    /// The abandoned attempt's finalizer, then its deletion, then the next attempt's step.
    const IN_ORDER: [&str; 3] = [
        "PATCH runnerattempts/ab",
        "DELETE runnerattempts/ab",
        "PATCH runnerattempts/done",
    ];

    /// Against a scripted API server: an abandoned attempt's finalizer is removed (a CAS on the
    /// version read) before the attempt is deleted, then the next attempt's step; nothing else is
    /// written.
    #[tokio::test]
    async fn housekeeping_writes_each_step_in_order_the_finalizer_before_the_delete() {
        let (failed, seen) = housekeep_abandoned_then_cleaned(|req| {
            let name = req.path.rsplit('/').next().unwrap_or_default();
            let attempt = AttemptBuilder::new(name, "web").namespace("team").build();
            (200, serde_json::to_value(attempt).unwrap_or_default())
        })
        .await;
        assert!(failed.is_empty(), "{failed:?}");
        assert_eq!(seen.writes(), IN_ORDER);
        let patch = seen.body_of("PATCH runnerattempts/ab");
        assert_eq!(patch["metadata"]["finalizers"], serde_json::json!([]));
        assert_eq!(
            patch["metadata"]["resourceVersion"], "7",
            "a CAS on the version read"
        );
    }

    /// A failed write is reported with its kind and the steps after it still run; a write to an
    /// attempt already gone (404) is no failure.
    #[tokio::test]
    async fn a_failed_housekeeping_write_is_reported_and_the_later_steps_still_run() {
        use crate::controller::scripted;
        let (failed, seen) = housekeep_abandoned_then_cleaned(|req| match req.short().as_str() {
            "PATCH runnerattempts/ab" => scripted::internal_error(),
            _ => scripted::not_found(),
        })
        .await;
        assert_eq!(seen.writes(), IN_ORDER);
        assert!(
            matches!(
                failed.as_slice(),
                [ReconcileError::Write {
                    kind: WriteKind::AttemptFinalizer,
                    ..
                }]
            ),
            "{failed:?}"
        );
    }

    #[test]
    fn nothing_is_due_within_the_bounds_and_a_pruned_attempt_being_deleted_is_left() {
        let mut deleting = (*cleaned("c-old", 100, false)).clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(999)));
        let attempts = vec![
            Arc::new(deleting),
            cleaned("c-mid", 200, false),
            cleaned("c-new", 300, false),
            pending("p", 990),
            idle_on("i", "quiet", 990),
        ];
        // The node went quiet 30 s ago: within the grace.
        let steps = plan(&attempts, t(1000), BOUNDS, |_, _| Some(t(970)));
        assert!(steps.is_empty(), "{:?}", names(&steps));
    }

    #[test]
    fn silence_before_this_leader_started_is_not_counted() {
        let t = |s: i64| Timestamp::from_second(s).unwrap();
        // Expired long before the leader started (the operator, hence the webhook, was down).
        assert_eq!(counted_from(t(100), Some(t(5000))), t(5000));
        // Expired while leading: counted from the expiry.
        assert_eq!(counted_from(t(6000), Some(t(5000))), t(6000));
        assert_eq!(counted_from(t(100), None), t(100));
    }
}
