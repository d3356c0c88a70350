//! The journal: every `state` write goes through a `crds` edge and a compare-and-swap on
//! `metadata.resourceVersion`. A conflict is re-read and re-decided, never overwritten: the
//! decision is a function of the object, so it is taken again on the fresh one.

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use runner_manager_crds::attempt::{RunnerAttempt, Transition, spec_hash};
use runner_manager_crds::state::{Actor, EdgeError};

/// How many times a conflicting write is re-read and re-decided before giving up. A conflict
/// means someone else wrote in between; more than a few in a row means something is wrong.
const MAX_CONFLICTS: usize = 8;

/// Why a journal write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("the state machine refused the edge: {0}")]
    Edge(#[from] EdgeError),
    #[error(
        "the attempt's spec no longer matches the hash recorded at admission; only a conclusion may be written"
    )]
    SpecChanged,
    #[error("gave up after {MAX_CONFLICTS} conflicting writes in a row")]
    Contended,
    #[error("the attempt has no resourceVersion (not read from the API server)")]
    NoResourceVersion,
    #[error("API server: {0}")]
    Kube(#[from] kube::Error),
    #[error("serializing the journal: {0}")]
    Encode(#[from] serde_json::Error),
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
            Err(JournalError::Kube(kube::Error::Api(status))) if status.code == 409 => continue,
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
    let resource_version = current
        .metadata
        .resource_version
        .as_deref()
        .ok_or(JournalError::NoResourceVersion)?;
    let status = current.status.clone().unwrap_or_default();
    let is_conclusion = matches!(transition, Transition::Conclude(_));
    // The spec is immutable after admission; acting on a changed one could run a runner the
    // operator never asked for. A conclusion stays allowed, so the attempt can still end.
    if let Some(admitted) = status.journal.spec_hash()
        && admitted != spec_hash(&current.spec)
        && !is_conclusion
    {
        return Err(JournalError::SpecChanged);
    }
    let next = status
        .journal
        .apply(actor, current.spec.snapshot.kind(), transition, now)?;
    // A merge patch of the journal's own fields, carrying the resourceVersion: the API server
    // refuses it with 409 if anyone wrote since `current` was read, and it leaves the operator's
    // fact fields (github, job) as they are.
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": resource_version},
        "status": serde_json::to_value(&next)?,
    });
    let name = current.metadata.name.as_deref().unwrap_or_default();
    Ok(api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?)
}
