//! The agent's side of the journal: its writes go through the one journal writer
//! (`runner_manager_crds::writer`), as the broker's and the operator's do. A write is decided on
//! the attempt as the agent's watch last showed it (the reflector store the watcher keeps, see
//! [`Journal::decide_on_watched`]): no read before a write; the API server's compare-and-swap on that
//! object's resourceVersion catches a stale copy, and only then is the attempt read (one GET per
//! conflict) and the decision taken again. A decision to write nothing cannot be caught that way
//! (a step that just wrote may decide its next edge on a copy from before its own write, find
//! the attempt not yet in the state it expects, and skip the edge), so it is confirmed on a fresh
//! read; no write and no read happen in steady state, where nothing is decided.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use runner_manager_crds::attempt::{LaunchTimings, RunnerAttempt};
use runner_manager_crds::state::Actor;
use runner_manager_crds::writer::JournalWriter;
pub use runner_manager_crds::writer::{Decision, JournalError};

/// The agent's journal context (one per agent, in its `Agent`): the watcher's store of the
/// node's attempts that writes are decided on, and the resourceVersion of this agent's last
/// write of each attempt.
#[derive(Debug, Default)]
pub struct Journal {
    /// Set once the watcher runs; before it (or in a test) every write reads the attempt first.
    watched: OnceLock<Store<RunnerAttempt>>,
    /// By uid: the watched copy a task steps on must have caught up with it (`agent::watched`),
    /// or a step could act on a state from before the agent's own write (an `Allocated` the
    /// launch already took to `Starting`).
    written: Mutex<HashMap<String, String>>,
}

impl Journal {
    /// Decide journal writes on the objects of `store` (the watcher's reflector store) from now
    /// on.
    pub fn decide_on_watched(&self, store: Store<RunnerAttempt>) {
        // One watcher per agent: a second store would be the same view.
        let _ = self.watched.set(store);
    }

    fn written_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.written
            .lock()
            // One insert or remove per use: a panic elsewhere leaves it consistent.
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Remember `a` as this agent's last write of its attempt.
    pub fn record_written(&self, a: &RunnerAttempt) {
        if let (Some(uid), Some(version)) = (&a.metadata.uid, &a.metadata.resource_version) {
            self.written_map().insert(uid.clone(), version.clone());
        }
    }

    /// The resourceVersion of this agent's last write of the attempt `uid`.
    pub fn last_written(&self, uid: &str) -> Option<String> {
        self.written_map().get(uid).cloned()
    }

    /// Forget the attempt `uid` (its task ended).
    pub fn forget_written(&self, uid: &str) {
        self.written_map().remove(uid);
    }

    /// Whether the watcher's store is in use (else every read is an API read).
    pub fn is_watching(&self) -> bool {
        self.watched.get().is_some()
    }

    /// The attempt `name` of `api`'s namespace as the watch last showed it.
    pub fn watched(&self, api: &Api<RunnerAttempt>, name: &str) -> Option<Arc<RunnerAttempt>> {
        let store = self.watched.get()?;
        store.get(&ObjectRef::new(name).within(api.namespace()?))
    }

    /// Apply the edge `decide` picks for the attempt as watched (or, unwatched, as read), with
    /// a CAS. On a conflict the object is re-read and `decide` runs again on it. Returns the
    /// written object, or `None` when the decision was `Nothing`.
    pub async fn advance(
        &self,
        api: &Api<RunnerAttempt>,
        name: &str,
        actor: Actor,
        decide: impl FnMut(&RunnerAttempt) -> Decision,
    ) -> Result<Option<RunnerAttempt>, JournalError> {
        self.on_watched_then_fresh(api, name, actor, decide).await
    }

    /// `decide` on the watched attempt; when it writes nothing there, again on a fresh read.
    async fn on_watched_then_fresh(
        &self,
        api: &Api<RunnerAttempt>,
        name: &str,
        actor: Actor,
        mut decide: impl FnMut(&RunnerAttempt) -> Decision,
    ) -> Result<Option<RunnerAttempt>, JournalError> {
        let writer = JournalWriter::new(api.clone(), actor);
        let known = self.watched(api, name);
        let written = match writer.advance(name, known.as_deref(), &mut decide).await {
            Ok(None) if known.is_some() => writer.advance(name, None, decide).await,
            other => other,
        }?;
        if let Some(a) = &written {
            self.record_written(a);
        }
        Ok(written)
    }

    /// Like [`Journal::advance`], with `launch` (the launch step timings) written in the same
    /// CAS as the edge, so `Starting` and its timings appear together.
    pub async fn advance_with_launch(
        &self,
        api: &Api<RunnerAttempt>,
        name: &str,
        actor: Actor,
        launch: &LaunchTimings,
        mut decide: impl FnMut(&RunnerAttempt) -> Decision,
    ) -> Result<Option<RunnerAttempt>, JournalError> {
        self.on_watched_then_fresh(api, name, actor, |cur| match decide(cur) {
            Decision::Take(t) => Decision::TakeWithLaunch(t, Box::new(launch.clone())),
            other => other,
        })
        .await
    }
}
