//! The bodies of status writes, built without I/O so every writer sends the same shape.
//!
//! A journal write is a merge patch of the journal's own fields carrying the
//! `metadata.resourceVersion` it was decided on: the API server refuses it with 409 if anyone
//! wrote since (a compare-and-swap), and the operator's fact fields are left as they are. A fact
//! write is a merge patch of the facts alone, without a resourceVersion: facts do not race edges.

use k8s_openapi::jiff::Timestamp;

use crate::attempt::{AttemptFacts, AttemptJournal, RunnerAttempt, Transition, spec_hash};
use crate::state::{Actor, EdgeError};

/// Why a journal patch could not be built.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    #[error("the state machine refused the edge: {0}")]
    Edge(#[from] EdgeError),
    #[error(
        "the attempt's spec no longer matches the hash recorded at admission; only a conclusion may be written"
    )]
    SpecChanged,
    #[error("the attempt has no resourceVersion (it was not read from the API server)")]
    NoResourceVersion,
    #[error("serializing the journal: {0}")]
    Encode(#[from] serde_json::Error),
}

/// The next journal of `current` after `transition`, and the CAS merge patch that writes it.
pub fn journal_patch(
    current: &RunnerAttempt,
    actor: Actor,
    transition: Transition,
    now: Timestamp,
) -> Result<(AttemptJournal, serde_json::Value), PatchError> {
    let resource_version = current
        .metadata
        .resource_version
        .as_deref()
        .ok_or(PatchError::NoResourceVersion)?;
    let journal = current
        .status
        .as_ref()
        .map(|s| s.journal.clone())
        .unwrap_or_default();
    // The spec is immutable after admission; acting on a changed one could run a runner the
    // operator never asked for. A conclusion and the cleanup after it stay allowed, so the
    // attempt can still end and release what it holds.
    let is_conclusion = matches!(transition, Transition::Conclude(_) | Transition::Clean);
    if let Some(admitted) = journal.spec_hash()
        && admitted != spec_hash(&current.spec)
        && !is_conclusion
    {
        return Err(PatchError::SpecChanged);
    }
    let next = journal.apply(actor, current.spec.snapshot.kind(), transition, now)?;
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": resource_version},
        "status": serde_json::to_value(&next)?,
    });
    Ok((next, patch))
}

/// The merge patch of the operator's facts (no resourceVersion: the facts are the operator's
/// alone, and a fact written between an agent's read and its CAS makes that CAS conflict, which
/// is what re-deciding on fresh facts needs).
pub fn facts_patch(facts: &AttemptFacts) -> Result<serde_json::Value, PatchError> {
    Ok(serde_json::json!({ "status": serde_json::to_value(facts)? }))
}
