//! The agent's side of the journal: its writes go through the one journal writer
//! (`runner_manager_crds::writer`), as the broker's and the operator's do.

use kube::api::Api;
use runner_manager_crds::attempt::{LaunchTimings, RunnerAttempt};
use runner_manager_crds::state::Actor;
use runner_manager_crds::writer::JournalWriter;
pub use runner_manager_crds::writer::{Decision, JournalError};

/// Apply the edge `decide` picks for the current object, with a CAS. On a conflict the object is
/// re-read and `decide` runs again on it. Returns the written object, or `None` when the decision
/// was `Nothing`.
pub async fn advance(
    api: &Api<RunnerAttempt>,
    name: &str,
    actor: Actor,
    decide: impl FnMut(&RunnerAttempt) -> Decision,
) -> Result<Option<RunnerAttempt>, JournalError> {
    JournalWriter::new(api.clone(), actor)
        .advance(name, None, decide)
        .await
}

/// Like [`advance`], with `launch` (the launch step timings) written in the same CAS as the edge,
/// so `Starting` and its timings appear together.
pub async fn advance_with_launch(
    api: &Api<RunnerAttempt>,
    name: &str,
    actor: Actor,
    launch: &LaunchTimings,
    mut decide: impl FnMut(&RunnerAttempt) -> Decision,
) -> Result<Option<RunnerAttempt>, JournalError> {
    JournalWriter::new(api.clone(), actor)
        .advance(name, None, |cur| match decide(cur) {
            Decision::Take(t) => Decision::TakeWithLaunch(t, Box::new(launch.clone())),
            other => other,
        })
        .await
}
