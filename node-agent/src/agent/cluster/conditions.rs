//! The agent's attempt conditions (`Quarantined`, `CleanupDeferred`, `PackageRefused`): part of
//! the journal, so the agent is their one writer, through the one journal writer
//! (`runner_manager_crds::writer`): a compare-and-swap on `resourceVersion` like every journal
//! write, and only when they change, so a condition re-asserted on every retry is not a status
//! write every retry.

use crate::agent::attempt_ctx::Attempts;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use runner_manager_crds::attempt::{AttemptConditionType, AttemptReason, RunnerAttempt};
use runner_manager_crds::conditions::{Condition, ConditionStatus};
use runner_manager_crds::state::Actor;
use runner_manager_crds::writer::{Decision, JournalError, JournalWriter};

/// Set one condition on `a` (as read: the write is a CAS against its resourceVersion; a stale
/// copy is re-read once it conflicts and the condition decided again on the fresh one). Returns
/// whether anything was written.
pub async fn set(
    api: &Attempts,
    a: &RunnerAttempt,
    type_: AttemptConditionType,
    status: ConditionStatus,
    reason: AttemptReason,
    message: String,
) -> Result<bool, JournalError> {
    let new = Condition {
        type_,
        status,
        reason,
        message,
        last_transition_time: Some(Time(Timestamp::now())),
        observed_generation: a.metadata.generation,
    };
    let name = a.metadata.name.as_deref().unwrap_or_default();
    let written = JournalWriter::new((**api).clone(), Actor::Agent)
        .advance(name, Some(a), |_| Decision::Condition(new.clone()))
        .await?;
    if let Some(w) = &written {
        api.journal.record_written(w);
    }
    Ok(written.is_some())
}

/// Whether `a` carries `type_` with status `True`.
pub fn holds(a: &RunnerAttempt, type_: AttemptConditionType) -> bool {
    a.status.as_ref().is_some_and(|s| {
        s.journal
            .conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == ConditionStatus::True)
    })
}
