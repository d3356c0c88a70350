//! The recovery table on an attempt's journal: [`recovery_decision`] reads the journal's state
//! and timestamps into the core crate's [`JournalView`] and asks [`decide`]. The table, its
//! inputs and outcomes are `runner_manager_core::recovery`, re-exported here.

use k8s_openapi::jiff::Timestamp;

use crate::attempt::AttemptJournal;
pub use runner_manager_core::recovery::{
    GitHubObservation, JournalView, ProcessObservation, RecoveryDecision, RecoveryTimeouts,
    TerminateReason, decide, requested_termination_outcome,
};

/// The decision for one attempt, from its journal. Pure.
pub fn recovery_decision(
    journal: &AttemptJournal,
    process: ProcessObservation,
    github: GitHubObservation,
    timeouts: &RecoveryTimeouts,
    now: Timestamp,
) -> RecoveryDecision {
    let ts = journal.timestamps();
    let view = JournalView {
        state: journal.state(),
        last_state_change_at: ts.last_state_change_at.as_ref().map(|t| t.0),
        jit_received_at: ts.jit_received_at.as_ref().map(|t| t.0),
    };
    decide(view, process, github, timeouts, now)
}
