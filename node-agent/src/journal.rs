//! The agent's side of the journal: its writes go through the one journal writer
//! (`runner_manager_crds::writer`), as the broker's and the operator's do. A write is decided on
//! the attempt as the agent's watch last showed it (the reflector store the watcher keeps, see
//! [`decide_on_watched`]): no read before a write; the API server's compare-and-swap on that
//! object's resourceVersion catches a stale copy, and only then is the attempt read (one GET per
//! conflict) and the decision taken again.

use std::sync::{Arc, OnceLock};

use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use runner_manager_crds::attempt::{LaunchTimings, RunnerAttempt};
use runner_manager_crds::state::Actor;
use runner_manager_crds::writer::JournalWriter;
pub use runner_manager_crds::writer::{Decision, JournalError};

/// The watcher's store of the node's attempts: one per process, like the watch itself.
static WATCHED: OnceLock<Store<RunnerAttempt>> = OnceLock::new();

/// Decide journal writes on the objects of `store` (the watcher's reflector store) from now on.
/// Without it (before the watcher starts, or in a test) every write reads the attempt first.
pub fn decide_on_watched(store: Store<RunnerAttempt>) {
    // One watcher per process: a second store would be the same view.
    let _ = WATCHED.set(store);
}

/// The attempt `name` of `api`'s namespace as the watch last showed it.
pub fn watched(api: &Api<RunnerAttempt>, name: &str) -> Option<Arc<RunnerAttempt>> {
    let store = WATCHED.get()?;
    store.get(&ObjectRef::new(name).within(api.namespace()?))
}

/// Apply the edge `decide` picks for the attempt as watched (or, unwatched, as read), with a
/// CAS. On a conflict the object is re-read and `decide` runs again on it. Returns the written
/// object, or `None` when the decision was `Nothing`.
pub async fn advance(
    api: &Api<RunnerAttempt>,
    name: &str,
    actor: Actor,
    decide: impl FnMut(&RunnerAttempt) -> Decision,
) -> Result<Option<RunnerAttempt>, JournalError> {
    let known = watched(api, name);
    JournalWriter::new(api.clone(), actor)
        .advance(name, known.as_deref(), decide)
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
    let known = watched(api, name);
    JournalWriter::new(api.clone(), actor)
        .advance(name, known.as_deref(), |cur| match decide(cur) {
            Decision::Take(t) => Decision::TakeWithLaunch(t, Box::new(launch.clone())),
            other => other,
        })
        .await
}
