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

use super::Ctx;
use super::errors::ReconcileError;
use super::events::Reason;
use super::placement_worker::agent_of;
use super::timeouts::{Due, due};
use super::writes::{FIELD_MANAGER, WriteKind};

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

/// Housekeeping of `attempts` (one policy's, or those whose policy is gone). Each failed write
/// is returned, and the rest goes on; the next reconcile decides again on the fresh objects.
pub async fn housekeeping(
    ctx: &Ctx,
    attempts: &[Arc<RunnerAttempt>],
    now: Timestamp,
) -> Vec<ReconcileError> {
    let mut failed = Vec::new();
    let mut cleaned: BTreeMap<(String, String), Vec<&Arc<RunnerAttempt>>> = BTreeMap::new();
    for a in attempts {
        let state = a.state();
        let name = a.metadata.name.as_deref().unwrap_or_default();
        let ns = a.metadata.namespace.as_deref().unwrap_or_default();
        let abandoned = a
            .metadata
            .annotations
            .as_ref()
            .and_then(|m| m.get(ABANDON_ANNOTATION))
            .is_some_and(|v| v == "true");
        if abandoned && has_finalizer(a) {
            ctx.events
                .publish(
                    &a.object_ref(&()),
                    Reason::Abandoned,
                    format!("released by the {ABANDON_ANNOTATION} annotation in state {state:?}; the agent's cleanup is not waited for"),
                );
            if let Err(source) = ctx.writer.attempt_finalizers(a, without_finalizer(a)).await {
                failed.push(ReconcileError::write(WriteKind::AttemptFinalizer)(source));
            }
            if let Err(source) = ctx.writer.delete_attempt(ns, name).await {
                failed.push(ReconcileError::write(WriteKind::AttemptDelete)(source));
            }
            continue;
        }
        if state == AttemptState::Cleaned {
            if has_finalizer(a) {
                // Agents write status only: the operator releases what the agent cleaned.
                if let Err(source) = ctx.writer.attempt_finalizers(a, without_finalizer(a)).await {
                    failed.push(ReconcileError::write(WriteKind::AttemptFinalizer)(source));
                }
            }
            cleaned
                .entry((ns.to_owned(), a.spec.policy.clone()))
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
        let gone = node_gone_since(ctx, &a.spec.node_name, now, fallback);
        match due(
            a,
            now,
            ctx.settings.admission_timeout,
            gone,
            ctx.settings.node_lost_grace,
        ) {
            Some(Due::ExpireAdmission) => {
                let outcome = Outcome::Rejected(RejectReason::AdmissionTimeout);
                if take_edge(ctx, a, outcome, now).await {
                    ctx.events.publish(
                        &a.object_ref(&()),
                        Reason::AdmissionExpired,
                        format!(
                            "no agent admitted the attempt within {}s; a replacement is placed",
                            ctx.settings.admission_timeout.as_secs()
                        ),
                    );
                }
            }
            Some(Due::LoseNode) => {
                let outcome = Outcome::Orphaned(OrphanReason::NodeLost);
                if take_edge(ctx, a, outcome, now).await {
                    ctx.events
                        .publish(
                            &a.object_ref(&()),
                            Reason::NodeLost,
                            "the node's agent Lease expired past the grace period; a replacement is placed".into(),
                        );
                }
            }
            Some(Due::Terminate(_)) | None => {}
        }
    }
    // History: keep the newest `attempt_history` Cleaned attempts of each policy.
    let keep = usize::try_from(ctx.settings.attempt_history).unwrap_or(usize::MAX);
    for ((ns, _), mut list) in cleaned {
        if list.len() <= keep {
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
        for a in list.into_iter().skip(keep) {
            let name = a.metadata.name.as_deref().unwrap_or_default();
            if a.metadata.deletion_timestamp.is_none()
                && let Err(source) = ctx.writer.delete_attempt(&ns, name).await
            {
                failed.push(ReconcileError::write(WriteKind::AttemptDelete)(source));
            }
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

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
