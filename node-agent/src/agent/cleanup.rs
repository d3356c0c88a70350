//! Cleanup of a concluded attempt, in order (lifecycle spec §2.5): anything of the runner still
//! running is stopped and proven gone (a pid whose start time changed is never signalled: the
//! launcher stops by cgroup or unit); the redacted diagnostics; the workspace (ephemeral
//! removed whole, persistent scrubbed by the seven checks); the package lease and the account;
//! then `Cleaned`. Each step is idempotent, so a crash anywhere is finished by the next pass.

use super::log::say;
use kube::api::Api;
use runner_manager_crds::attempt::{AttemptJournal, RunnerAttempt, Transition};
use runner_manager_crds::policy::WorkspaceMode;
use runner_manager_crds::state::AttemptState;

use super::Agent;
use super::events::{self, EventReason};
use super::fault::{self, Boundary};
use super::launch::take;
use super::rebuild::journal_of;
use super::supervise::{Step, StepError, names, runtime_of, uuid_of};
use crate::process::identity_file;
use crate::workspace::ephemeral::remove_ephemeral_runtime;
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
        say!("{ns}/{name}: cleanup deferred: the runner is not proven stopped: {e}");
        return Ok(Step::Wait);
    }

    // 2. Redacted diagnostics.
    if let Err(e) = crate::durable::write_file(
        &agent.host_root.join("diagnostics"),
        &format!("{name}.log"),
        diagnostics(a, &journal).as_bytes(),
    ) {
        say!("{ns}/{name}: diagnostics not written ({:?})", e.kind());
    }

    // 3. The workspace, dispatched on the journalled kind.
    if let Some(w) = journal.workspace() {
        match w.kind() {
            WorkspaceMode::Ephemeral => {
                if let Err(e) =
                    remove_ephemeral_runtime(&agent.host_root, uuid_of(a)?, w.runtime_path())
                {
                    say!("{ns}/{name}: cleanup deferred: {e}");
                    return Ok(Step::Wait);
                }
            }
            WorkspaceMode::Persistent => {
                let owner = SlotOwner {
                    namespace: &ns,
                    policy_uid: &a.spec.snapshot.policy_uid,
                };
                if let Err(q) = scrub_slot(w, &agent.slots_root, owner) {
                    say!("{ns}/{name}: slot quarantined: {q:?}");
                    events::warn(
                        &agent.kube,
                        &agent.node,
                        a,
                        EventReason::CleanupDeferred,
                        format!("the persistent slot was quarantined: {q:?}"),
                    )
                    .await;
                    return Ok(Step::Wait);
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
    say!("{ns}/{name}: cleaned");
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
