//! What launch, cleanup and supervision share about one attempt, below all three so none of
//! them imports another in a circle: the vocabulary of a step (`Step`, `StepError`), the
//! attempt's names and derived paths, and the two journal operations every stage uses — take one
//! edge from a known state (`take`) and conclude along the edges the table allows (`conclude`).
//! [`AttemptCtx`] holds the attempt's names and its namespace's API, so a stage says
//! `ctx.conclude(outcome)` instead of carrying the three; the free functions are what it calls
//! (and what stages that still pass `api` and `name` call).

use std::path::PathBuf;

use runner_manager_crds::attempt::{AttemptJournal, RunnerAttempt, Transition};
use runner_manager_crds::lease::RecoveryBlocked;
use runner_manager_crds::outcome::Outcome;
use runner_manager_crds::recovery::RecoveryTimeouts;
use runner_manager_crds::state::{Actor, AttemptState};

pub use crate::agent::attempts::Attempts;
use crate::agent::edges::conclusion_edges;
use crate::journal::{Decision, JournalError};

/// What a step came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Something was journalled: read again at once.
    Again,
    /// Nothing to do until facts change.
    Wait,
    /// The attempt is `Cleaned` (or not this node's): the task ends.
    Done,
}

/// Why a step did not finish.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("API server: {0}")]
    Kube(#[from] kube::Error),
    #[error("recovery blocked: {0:?}")]
    Blocked(RecoveryBlocked),
    #[error("{0}")]
    Local(String),
}

/// One attempt as a stage acts on it: its names and the API of its namespace. Built once per
/// reconcile from the object the step reads.
#[derive(Clone)]
pub struct AttemptCtx {
    api: Attempts,
    pub uid: String,
    pub name: String,
    pub namespace: String,
}

impl std::fmt::Debug for AttemptCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttemptCtx")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl AttemptCtx {
    /// The context of `a` (`all`: the agent's attempts of every namespace, for their journal
    /// and metrics); an object without uid, name or namespace cannot be acted on.
    pub fn of(all: &Attempts, a: &RunnerAttempt) -> Result<Self, StepError> {
        let (uid, name, namespace) = names(a)?;
        Ok(Self {
            api: all.in_namespace(&namespace),
            uid,
            name,
            namespace,
        })
    }

    /// The attempts of this attempt's namespace (for the stages that take `api`).
    pub fn api(&self) -> &Attempts {
        &self.api
    }

    /// [`take`] on this attempt.
    pub async fn take(&self, from: AttemptState, t: Transition) -> Result<bool, StepError> {
        take(&self.api, &self.name, from, t).await
    }

    /// [`conclude`] this attempt.
    pub async fn conclude(&self, outcome: Outcome) -> Result<(), StepError> {
        conclude(&self.api, &self.name, outcome).await
    }

    /// [`conclude_via`] this attempt.
    pub async fn conclude_via(
        &self,
        via: (AttemptState, Transition),
        outcome: Outcome,
    ) -> Result<(), StepError> {
        conclude_via(&self.api, &self.name, Some(via), outcome).await
    }
}

pub fn names(a: &RunnerAttempt) -> Result<(String, String, String), StepError> {
    match (
        a.metadata.uid.clone(),
        a.metadata.name.clone(),
        a.metadata.namespace.clone(),
    ) {
        (Some(u), Some(n), Some(ns)) => Ok((u, n, ns)),
        _ => Err(StepError::Local(
            "an attempt without uid, name or namespace".into(),
        )),
    }
}

pub fn uuid_of(a: &RunnerAttempt) -> Result<uuid::Uuid, StepError> {
    a.spec
        .attempt_uuid()
        .ok_or_else(|| StepError::Local("the attempt's id is not a uuid".into()))
}

/// The deadlines the agent enforces: the snapshot's, with the registration and idle deadlines
/// pushed back by the agent's backstop grace (the operator stops those in order first; see
/// `--deadline-grace-seconds`). The JIT handoff deadline is the agent's own.
pub fn timeouts(a: &RunnerAttempt, grace: std::time::Duration) -> RecoveryTimeouts {
    let t = &a.spec.snapshot.timeouts;
    RecoveryTimeouts {
        jit_handoff: t.jit_handoff.as_duration(),
        registration: t.registration.as_duration().saturating_add(grace),
        idle: t.idle.as_duration().saturating_add(grace),
    }
}

pub fn runtime_of(journal: &AttemptJournal) -> Option<PathBuf> {
    journal.workspace().map(|w| PathBuf::from(w.runtime_path()))
}

/// Concludes with `outcome` along the edges the table allows, in one CAS (no effect lies between
/// them: `AssignJob` then `CompleteJob` for a runner that took its job and exited before its job
/// was journalled is one write, not two), unless the attempt is already concluded.
pub async fn conclude(api: &Attempts, name: &str, outcome: Outcome) -> Result<(), StepError> {
    conclude_via(api, name, None, outcome).await
}

/// [`conclude`], first taking `via` = (`from`, edge) in the same write when the attempt is in
/// `from` (a runner GitHub never gave its job: `AssignmentNotTaken` back to `Idle`, then
/// `ExitedIdleWithoutWork`). Each edge is checked by the state machine in turn, as if written
/// alone; a crash leaves the attempt before all of them or after all of them, and no effect of
/// the agent's lies between them, so no recovery boundary is hidden.
pub async fn conclude_via(
    api: &Attempts,
    name: &str,
    via: Option<(AttemptState, Transition)>,
    outcome: Outcome,
) -> Result<(), StepError> {
    // The state the conclusion started from: before `Starting`, it is a launch that failed.
    let mut from = None;
    let written = api
        .journal
        .advance(api, name, Actor::Agent, |cur| {
            let state = cur.state();
            if state.is_terminal() {
                return Decision::Nothing;
            }
            from.get_or_insert(state);
            let path = conclusion_edges(
                state,
                cur.spec.snapshot.execution.mode,
                via.as_ref(),
                outcome,
            );
            Decision::TakePath(path)
        })
        .await?;
    if written.is_some_and(|a| a.state().is_terminal()) {
        let launching = from.is_some_and(|s| {
            matches!(
                s,
                AttemptState::Pending
                    | AttemptState::Allocated
                    | AttemptState::Preparing
                    | AttemptState::Prepared
                    | AttemptState::JitReceived
            )
        });
        api.metrics.concluded(outcome, launching);
    }
    Ok(())
}

/// Takes the one edge `t` if the attempt is still in `from` (a CAS; a conflict is re-read and
/// re-decided). Returns whether it was taken.
pub async fn take(
    api: &Attempts,
    name: &str,
    from: AttemptState,
    t: Transition,
) -> Result<bool, StepError> {
    Ok(take_written(api, name, from, t).await?.is_some())
}

/// [`take`], returning the attempt as written (what the next step of a launch decides on: the
/// watch may not show the write yet).
pub async fn take_written(
    api: &Attempts,
    name: &str,
    from: AttemptState,
    t: Transition,
) -> Result<Option<RunnerAttempt>, StepError> {
    let taken = api
        .journal
        .advance(api, name, Actor::Agent, |cur| {
            if cur.state() == from {
                Decision::Take(t.clone())
            } else {
                Decision::Nothing
            }
        })
        .await?;
    Ok(taken)
}
