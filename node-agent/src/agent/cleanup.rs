//! Cleanup of a concluded attempt, in order (lifecycle spec §2.5): anything of the runner still
//! running is stopped and proven gone (a pid whose start time changed is never signalled: the
//! launcher stops by cgroup or unit); the redacted diagnostics; the workspace (ephemeral
//! removed whole, persistent scrubbed by the seven checks); the package lease and the account;
//! then `Cleaned`. Each step is idempotent, so a crash anywhere is finished by the next pass.

use kube::api::Api;
use runner_manager_crds::attempt::{
    AttemptConditionType, AttemptJournal, AttemptReason, RunnerAttempt, Transition,
};
use runner_manager_crds::conditions::ConditionStatus;
use runner_manager_crds::policy::WorkspaceMode;
use runner_manager_crds::state::AttemptState;

use super::Agent;
use super::conditions;
use super::events::{self, EventReason};
use super::fault::{self, Boundary};
use super::launch::take;
use super::rebuild::journal_of;
use super::supervise::{Step, StepError, names, runtime_of, uuid_of};
use crate::process::identity_file;
use crate::workspace::ephemeral::{EphemeralError, remove_ephemeral_runtime};
use crate::workspace::scrub::scrub_slot;
use crate::workspace::scrub_plan::SlotOwner;
use crate::workspace::slot_table::SlotKey;

/// `<hostRoot>/diagnostics/<attempt>.log`: ids and kinds only, never runner output.
pub fn diagnostics(a: &RunnerAttempt, journal: &AttemptJournal) -> String {
    let outcome = journal.outcome();
    format!(
        "attempt={}/{} id={} node={} runner_id={} state={:?} outcome={:?} launcher={:?}\n",
        a.metadata.namespace.as_deref().unwrap_or_default(),
        a.metadata.name.as_deref().unwrap_or_default(),
        a.spec.id,
        a.spec.node_name,
        journal.runner().map(|r| r.id).unwrap_or_default(),
        journal.state(),
        outcome,
        journal.process().map(|p| p.launcher),
    )
}

pub async fn clean(
    agent: &Agent,
    api: &Api<RunnerAttempt>,
    a: &RunnerAttempt,
) -> Result<Step, StepError> {
    let (uid, name, ns) = names(a)?;
    let journal = journal_of(a);
    let runtime = runtime_of(&journal);

    // 1. Nothing of the runner may outlive its cleanup.
    let recorded = journal.process().cloned().or_else(|| {
        runtime
            .as_deref()
            .and_then(|r| identity_file::read(r).ok().flatten())
    });
    if let Some(identity) = recorded
        && let Err(e) = tokio::task::block_in_place(|| agent.launcher.stop(&identity))
    {
        super::metrics::global().cleanup_deferred();
        tracing::warn!(namespace = %ns, attempt = %name, "cleanup deferred: the runner is not proven stopped: {e}");
        return Ok(Step::Wait);
    }

    // 2. Redacted diagnostics.
    if let Err(e) = crate::durable::write_file(
        &agent.host_root.join("diagnostics"),
        &format!("{name}.log"),
        diagnostics(a, &journal).as_bytes(),
    ) {
        tracing::warn!(namespace = %ns, attempt = %name, "diagnostics not written ({:?})", e.kind());
    }

    // 3. The workspace, dispatched on the journalled kind.
    if let Some(w) = journal.workspace() {
        match w.kind() {
            WorkspaceMode::Ephemeral => {
                // Like a refused scrub, a failed removal backs off (30 s doubling to 15 min):
                // a tree that failed once will most likely fail again right away, and each try
                // costs a walk of what is left.
                if !agent.cleanup_backoff().due(&uid, std::time::Instant::now()) {
                    return Ok(Step::Wait);
                }
                match remove_ephemeral_runtime(&agent.host_root, uuid_of(a)?, w.runtime_path()) {
                    Err(e) => {
                        let retry = agent
                            .cleanup_backoff()
                            .failed(&uid, std::time::Instant::now());
                        super::metrics::global().cleanup_deferred();
                        tracing::warn!(
                            namespace = %ns, attempt = %name, "cleanup deferred: {e}; next try in {}s",
                            retry.as_secs()
                        );
                        let reason = match e {
                            EphemeralError::NotTheDerivedPath { .. } => {
                                AttemptReason::OwnershipUnproven
                            }
                            _ => AttemptReason::DeletionFailed,
                        };
                        let newly = conditions::set(
                            api,
                            a,
                            AttemptConditionType::CleanupDeferred,
                            ConditionStatus::True,
                            reason,
                            e.to_string(),
                        )
                        .await?;
                        if newly {
                            events::warn(
                                &agent.kube,
                                &agent.node,
                                a,
                                EventReason::CleanupDeferred,
                                format!("the ephemeral runtime was not removed: {e}"),
                            )
                            .await;
                        }
                        return Ok(Step::Wait);
                    }
                    Ok(_) => {
                        agent.cleanup_backoff().succeeded(&uid);
                        if conditions::holds(a, AttemptConditionType::CleanupDeferred) {
                            conditions::set(
                                api,
                                a,
                                AttemptConditionType::CleanupDeferred,
                                ConditionStatus::False,
                                AttemptReason::Resolved,
                                "the ephemeral runtime was removed".to_owned(),
                            )
                            .await?;
                            // The condition write moved the resourceVersion: decide again.
                            return Ok(Step::Again);
                        }
                    }
                }
            }
            WorkspaceMode::Persistent => {
                // A refused scrub is retried with backoff (30 s doubling to 15 min), not at the
                // supervision interval: a quarantined slot waits for a person, and hammering it
                // would also repeat the event.
                if !agent.cleanup_backoff().due(&uid, std::time::Instant::now()) {
                    return Ok(Step::Wait);
                }
                let owner = SlotOwner {
                    namespace: &ns,
                    policy_uid: &a.spec.snapshot.policy_uid,
                };
                match scrub_slot(w, &agent.slots_root, owner) {
                    Err(q) => {
                        let retry = agent
                            .cleanup_backoff()
                            .failed(&uid, std::time::Instant::now());
                        super::metrics::global().quarantined();
                        tracing::warn!(
                            namespace = %ns, attempt = %name, "slot quarantined ({}); next try in {}s",
                            q.refusal.event_class(),
                            retry.as_secs()
                        );
                        let newly = conditions::set(
                            api,
                            a,
                            AttemptConditionType::Quarantined,
                            ConditionStatus::True,
                            q.refusal.reason(),
                            q.to_string(),
                        )
                        .await?;
                        if newly {
                            events::warn(
                                &agent.kube,
                                &agent.node,
                                a,
                                EventReason::CleanupDeferred,
                                format!("the persistent slot was quarantined: {q}"),
                            )
                            .await;
                        }
                        return Ok(Step::Wait);
                    }
                    Ok(_) => {
                        agent.cleanup_backoff().succeeded(&uid);
                        if conditions::holds(a, AttemptConditionType::Quarantined) {
                            conditions::set(
                                api,
                                a,
                                AttemptConditionType::Quarantined,
                                ConditionStatus::False,
                                AttemptReason::Resolved,
                                "the slot passed every cleanup check".to_owned(),
                            )
                            .await?;
                            // The condition write moved the resourceVersion: decide again.
                            return Ok(Step::Again);
                        }
                    }
                }
            }
        }
    }
    fault::at(Boundary::MidCleanup);

    // 4. Leases, then `Cleaned`.
    agent.packages.release(&uid);
    let state = journal.state();
    if state.is_concluded() {
        take(api, &name, state, Transition::Clean).await?;
    }
    if w_is_slot(&journal) {
        agent.slots().release(
            &SlotKey {
                namespace: ns.clone(),
                policy_uid: a.spec.snapshot.policy_uid.clone(),
            },
            &name,
        );
    }
    agent.accounts().release(&uid);
    agent.book().forget(&uid);
    tracing::info!(namespace = %ns, attempt = %name, "cleaned");
    Ok(if state == AttemptState::Cleaned {
        Step::Done
    } else {
        Step::Again
    })
}

fn w_is_slot(journal: &AttemptJournal) -> bool {
    journal
        .workspace()
        .is_some_and(|w| w.kind() == WorkspaceMode::Persistent)
}
