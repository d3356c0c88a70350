//! Housekeeping of attempts that needs no GitHub call, carried out: the cleanup finalizer of
//! `Cleaned` attempts, the abandon annotation, the operator's two edges (`ExpireAdmission`,
//! `LoseNode`) and the history limit of `Cleaned` attempts per policy. What is due is decided
//! by `runner_manager_core::housekeeping::plan` from the validated attempts; this module reads
//! the Leases it needs and writes.

use k8s_openapi::jiff::Timestamp;
use kube::Resource;
pub use runner_manager_core::housekeeping::{Bounds, Housekeep, plan};
use runner_manager_crds::attempt::{RunnerAttempt, Transition};
use runner_manager_crds::names::agent_lease_name;
use runner_manager_crds::outcome::{OrphanReason, Outcome, RejectReason};
use runner_manager_crds::state::Actor;
use runner_manager_crds::validate::attempt::Attempt;
use runner_manager_crds::writer::{Decision, JournalError, JournalWriter};
use runner_manager_crds::{ABANDON_ANNOTATION, CLEANUP_FINALIZER};

use crate::controller::Ctx;
use crate::controller::errors::{HousekeepingError, WriteFailed};
use crate::controller::events::Reason;
use crate::controller::placement_worker::agent_of;
use crate::controller::writes::{FIELD_MANAGER, WriteKind};

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

/// Housekeeping of `attempts` (one policy's, or those whose policy is gone): [`plan`], then
/// each step carried out. Each failed write is returned, and the rest goes on; the next
/// reconcile decides again on the fresh objects.
pub async fn housekeeping(
    ctx: &Ctx,
    attempts: &[Attempt],
    now: Timestamp,
) -> Vec<HousekeepingError> {
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
        let held = *step.attempt();
        let (a, ns, name) = (held.object.as_ref(), held.namespace(), held.name());
        match step {
            Housekeep::Abandon(_) => {
                ctx.events.publish(
                    &a.object_ref(&()),
                    Reason::Abandoned,
                    format!(
                        "released by the {ABANDON_ANNOTATION} annotation in state {:?}; the agent's cleanup is not waited for",
                        held.view.state
                    ),
                );
                if let Err(source) = ctx.writer.attempt_finalizers(a, without_finalizer(a)).await {
                    failed.push(HousekeepingError(WriteFailed::of(
                        WriteKind::AttemptFinalizer,
                    )(source)));
                }
                if let Err(source) = ctx.writer.delete_attempt(ns, name).await {
                    failed.push(HousekeepingError(
                        WriteFailed::of(WriteKind::AttemptDelete)(source),
                    ));
                }
            }
            Housekeep::Release(_) => {
                if let Err(source) = ctx.writer.attempt_finalizers(a, without_finalizer(a)).await {
                    failed.push(HousekeepingError(WriteFailed::of(
                        WriteKind::AttemptFinalizer,
                    )(source)));
                }
            }
            Housekeep::ExpireAdmission(_) => {
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
            Housekeep::LoseNode(_) => {
                let outcome = Outcome::Orphaned(OrphanReason::NodeLost);
                if take_edge(ctx, a, outcome, now).await {
                    ctx.events.publish(
                        &a.object_ref(&()),
                        Reason::NodeLost,
                        "the node's agent Lease expired past the grace period; a replacement is placed".into(),
                    );
                }
            }
            Housekeep::Prune(_) => {
                if let Err(source) = ctx.writer.delete_attempt(ns, name).await {
                    failed.push(HousekeepingError(
                        WriteFailed::of(WriteKind::AttemptDelete)(source),
                    ));
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
    use runner_manager_crds::state::AttemptState;
    use std::sync::Arc;

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
    ) -> (
        Vec<HousekeepingError>,
        crate::controller::scripted::Recorded,
    ) {
        use crate::controller::scripted;
        let (kube, seen) = scripted::client(answer);
        let ctx = scripted::ctx(kube);
        let (attempts, _) = Attempt::all([abandoned("ab"), cleaned("done", 100, true)]);
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
                [HousekeepingError(WriteFailed {
                    kind: WriteKind::AttemptFinalizer,
                    ..
                })]
            ),
            "{failed:?}"
        );
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
