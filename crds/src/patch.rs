//! The bodies of status writes, built without I/O so every writer sends the same shape.
//!
//! A journal write is a merge patch of the journal's own fields carrying the
//! `metadata.resourceVersion` it was decided on: the API server refuses it with 409 if anyone
//! wrote since (a compare-and-swap), and the operator's fact fields are left as they are. A fact
//! write is a merge patch of the facts alone, without a resourceVersion: facts do not race edges.

use k8s_openapi::jiff::Timestamp;

use crate::attempt::{
    AttemptConditionType, AttemptFacts, AttemptJournal, AttemptReason, LaunchTimings,
    RunnerAttempt, Transition, spec_hash,
};
use crate::conditions::{Condition, upsert};
use runner_manager_core::state::{Actor, EdgeError};

/// One condition of an attempt's journal.
pub type AttemptCondition = Condition<AttemptConditionType, AttemptReason>;

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
    journal_patch_checked(current, actor, transition, now, SpecRule::Enforce)
}

/// Whether an edge is held to the spec-hash rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SpecRule {
    /// Only a conclusion or a cleanup may be written under a changed spec.
    Enforce,
    /// The edge records what already happened on the way to a conclusion in the same write.
    Recording,
}

fn journal_patch_checked(
    current: &RunnerAttempt,
    actor: Actor,
    transition: Transition,
    now: Timestamp,
    rule: SpecRule,
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
        && rule == SpecRule::Enforce
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

/// The next journal of `current` after every edge of `path` in order, and the one CAS merge
/// patch that writes them: edges with no effect between them (a runner that took its job and
/// exited before the agent journalled the job: `AssignJob` then `CompleteJob`) cost one write,
/// not one each. Each edge is checked as if written alone (the state machine from the state the
/// previous one led to, the actor, the spec-hash rule), so a path is allowed exactly when its
/// edges are, one after another. An empty path is refused as an illegal no-op by the caller.
///
/// One exception to the spec-hash rule: the edges before a conclusion in the same path. They
/// record what the runner already did (it took a job, or it never took the one GitHub showed)
/// before it exited; the rule exists so nobody *acts* on a changed spec, and recording is not
/// acting. Refusing them would refuse the conclusion with them, and an attempt whose runner is
/// gone would hold its capacity and workspace forever.
pub fn journal_path_patch(
    current: &RunnerAttempt,
    actor: Actor,
    path: &[Transition],
    now: Timestamp,
) -> Result<(AttemptJournal, serde_json::Value), PatchError> {
    let concludes = path.iter().any(|t| matches!(t, Transition::Conclude(_)));
    let rule = if concludes {
        SpecRule::Recording
    } else {
        SpecRule::Enforce
    };
    let mut stepped = current.clone();
    let mut next = None;
    for t in path {
        let (journal, _) = journal_patch_checked(&stepped, actor, t.clone(), now, rule)?;
        stepped.status.get_or_insert_with(Default::default).journal = journal.clone();
        next = Some(journal);
    }
    let next = next.unwrap_or_else(|| {
        current
            .status
            .as_ref()
            .map(|s| s.journal.clone())
            .unwrap_or_default()
    });
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": current.metadata.resource_version},
        "status": serde_json::to_value(&next)?,
    });
    Ok((next, patch))
}

/// Like [`journal_patch`], with the launch step timings written in the same CAS as the edge, so
/// `Starting` and its timings appear together.
pub fn journal_patch_with_launch(
    current: &RunnerAttempt,
    actor: Actor,
    transition: Transition,
    launch: &LaunchTimings,
    now: Timestamp,
) -> Result<(AttemptJournal, serde_json::Value), PatchError> {
    let (mut next, _) = journal_patch(current, actor, transition, now)?;
    next.launch = Some(launch.clone());
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": current.metadata.resource_version},
        "status": serde_json::to_value(&next)?,
    });
    Ok((next, patch))
}

/// The conditions of `current` with `new` set, or `None` when the journal already says it
/// (type, status, reason and message): a condition re-asserted on every retry is not a status
/// write every retry. Pure.
pub fn with_condition(
    current: &RunnerAttempt,
    new: AttemptCondition,
) -> Option<Vec<AttemptCondition>> {
    let mut conditions = current
        .status
        .as_ref()
        .map(|s| s.journal.conditions.clone())
        .unwrap_or_default();
    let unchanged = conditions.iter().any(|c| {
        c.type_ == new.type_
            && c.status == new.status
            && c.reason == new.reason
            && c.message == new.message
    });
    if unchanged {
        return None;
    }
    upsert(&mut conditions, new);
    Some(conditions)
}

/// The CAS merge patch that sets `new` among `current`'s journal conditions, or `None` when
/// nothing changes. Conditions are part of the journal: the same CAS on `resourceVersion` as an
/// edge, so a condition decided on a stale read is refused like a stale edge.
pub fn condition_patch(
    current: &RunnerAttempt,
    new: AttemptCondition,
) -> Result<Option<serde_json::Value>, PatchError> {
    let resource_version = current
        .metadata
        .resource_version
        .as_deref()
        .ok_or(PatchError::NoResourceVersion)?;
    Ok(with_condition(current, new).map(|conditions| {
        serde_json::json!({
            "metadata": {"resourceVersion": resource_version},
            "status": {"conditions": conditions},
        })
    }))
}

/// The merge patch of the operator's facts (no resourceVersion: the facts are the operator's
/// alone, and a fact written between an agent's read and its CAS makes that CAS conflict, which
/// is what re-deciding on fresh facts needs).
pub fn facts_patch(facts: &AttemptFacts) -> Result<serde_json::Value, PatchError> {
    Ok(serde_json::json!({ "status": serde_json::to_value(facts)? }))
}
