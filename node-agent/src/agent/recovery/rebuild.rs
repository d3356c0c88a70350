//! What the agent's memory is rebuilt from at start: the journal, never the disk alone. The
//! capacity book, the slot table, the account pool (the owners of the runtimes of uncleaned
//! attempts) and the package leases; and the set of attempts the recovery gate waits for.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use runner_manager_crds::attempt::{AttemptJournal, RunnerAttempt};
use runner_manager_crds::state::AttemptState;

use crate::agent::node::Agent;
use crate::workspace::slot_table::JournalledLease;

pub fn journal_of(a: &RunnerAttempt) -> AttemptJournal {
    a.status
        .as_ref()
        .map(|s| s.journal.clone())
        .unwrap_or_default()
}

/// The owner uid of a path, not following a link.
pub fn owner_of(path: &Path) -> Option<u32> {
    std::fs::symlink_metadata(path).ok().map(|m| m.uid())
}

pub fn rebuild(agent: &Agent, attempts: &[RunnerAttempt]) {
    let mut expected = Vec::new();
    for a in attempts {
        let Some(uid) = a.metadata.uid.clone() else {
            continue;
        };
        let journal = journal_of(a);
        let state = journal.state();
        agent
            .book()
            .observe(&uid, state, a.spec.snapshot.execution.mode);
        if state == AttemptState::Cleaned {
            continue;
        }
        if state != AttemptState::Pending && a.spec.node_name == agent.cluster.node {
            expected.push(uid.clone());
        }
        if let Some(lease) = JournalledLease::of(a) {
            let _ = agent.slots().record(lease);
        }
        if let Some(w) = journal.workspace() {
            let runtime = Path::new(w.runtime_path());
            if let Some(owner) = owner_of(runtime) {
                agent.accounts().restore(owner, &uid);
                if let Some(slot) = w.slot_number() {
                    agent
                        .accounts()
                        .restore_binding(owner, &format!("{}/s{slot}", a.spec.snapshot.policy_uid));
                }
            }
            agent
                .host
                .packages
                .restore_lease(&uid, &a.spec.snapshot.runner.sha256);
        }
    }
    restore_slot_bindings(agent);
    tracing::info!(
        "recovery: {} attempt(s) of this node to reconcile before admitting",
        expected.len()
    );
    agent.gate.expect(expected);
    agent.cluster.advert_changed.notify_one();
}

/// Persistent slots keep their account between attempts: a slot directory owned by a pool
/// account binds that account to the slot.
fn restore_slot_bindings(agent: &Agent) {
    for (_, policy_uid, n, path) in crate::workspace::slot_path::slot_dirs(&agent.host.slots_root) {
        if let Some(owner) = owner_of(&path) {
            // The key `accounts::assign_for_slot` binds a slot's account under.
            agent.accounts().restore_binding(
                owner,
                &format!("{policy_uid}/{}", crate::workspace::slot_path::slot_name(n)),
            );
        }
    }
}
