//! The journal: every `state` write goes through a `crds` edge and a compare-and-swap on
//! `metadata.resourceVersion` (the patch is built by `crds::patch`). A conflict is re-read and
//! re-decided, never overwritten: the decision is a function of the object, so it is taken again
//! on the fresh one.

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use runner_manager_crds::attempt::{LaunchTimings, RunnerAttempt, Transition};
use runner_manager_crds::patch::{PatchError, journal_patch};
use runner_manager_crds::state::Actor;

/// How many times a conflicting write is re-read and re-decided before giving up. A conflict
/// means someone else wrote in between; more than a few in a row means something is wrong.
const MAX_CONFLICTS: usize = 8;

/// Why a journal write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error(transparent)]
    Patch(#[from] PatchError),
    #[error("gave up after {MAX_CONFLICTS} conflicting writes in a row")]
    Contended,
    #[error("API server: {0}")]
    Kube(#[from] kube::Error),
}

impl JournalError {
    /// Whether the write lost a compare-and-swap (the object changed since it was read).
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Kube(kube::Error::Api(s)) if s.code == 409)
    }
}

/// What the caller decides for the attempt as it is now.
#[derive(Debug)]
pub enum Decision {
    /// Nothing to write.
    Nothing,
    /// Take this edge.
    Take(Transition),
}

/// Apply the edge `decide` picks for the current object, with a CAS. On a conflict the object is
/// re-read and `decide` runs again on it. Returns the written object, or `None` when the decision
/// was `Nothing`.
pub async fn advance(
    api: &Api<RunnerAttempt>,
    name: &str,
    actor: Actor,
    mut decide: impl FnMut(&RunnerAttempt) -> Decision,
) -> Result<Option<RunnerAttempt>, JournalError> {
    for _ in 0..MAX_CONFLICTS {
        let current = api.get_status(name).await?;
        let Decision::Take(transition) = decide(&current) else {
            return Ok(None);
        };
        match write(api, &current, actor, transition, Timestamp::now()).await {
            Err(e) if e.is_conflict() => continue,
            other => return other.map(Some),
        }
    }
    Err(JournalError::Contended)
}

/// One CAS write of one edge against `current`. A 409 means `current` is stale.
pub async fn write(
    api: &Api<RunnerAttempt>,
    current: &RunnerAttempt,
    actor: Actor,
    transition: Transition,
    now: Timestamp,
) -> Result<RunnerAttempt, JournalError> {
    write_with(api, current, actor, transition, now, None).await
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
    for _ in 0..MAX_CONFLICTS {
        let current = api.get_status(name).await?;
        let Decision::Take(transition) = decide(&current) else {
            return Ok(None);
        };
        match write_with(
            api,
            &current,
            actor,
            transition,
            Timestamp::now(),
            Some(launch),
        )
        .await
        {
            Err(e) if e.is_conflict() => continue,
            other => return other.map(Some),
        }
    }
    Err(JournalError::Contended)
}

async fn write_with(
    api: &Api<RunnerAttempt>,
    current: &RunnerAttempt,
    actor: Actor,
    transition: Transition,
    now: Timestamp,
    launch: Option<&LaunchTimings>,
) -> Result<RunnerAttempt, JournalError> {
    let (_, mut patch) = journal_patch(current, actor, transition, now)?;
    if let (Some(launch), Some(status)) = (launch, patch.get_mut("status"))
        && let Some(status) = status.as_object_mut()
    {
        status.insert(
            "launch".to_owned(),
            serde_json::to_value(launch).map_err(PatchError::Encode)?,
        );
    }
    let name = current.metadata.name.as_deref().unwrap_or_default();
    Ok(api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?)
}
