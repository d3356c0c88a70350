//! The agent's attempt conditions (`Quarantined`, `CleanupDeferred`): part of the journal, so the
//! agent is their one writer. Written with a compare-and-swap on `resourceVersion` like every
//! journal write, and only when they change, so a condition re-asserted on every retry is not a
//! status write every retry.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use runner_manager_crds::attempt::{AttemptConditionType, AttemptReason, RunnerAttempt};
use runner_manager_crds::conditions::{Condition, ConditionStatus, upsert};

/// The conditions of `a` with `new` set, or `None` when `new` is already what the journal says.
pub fn with_condition(
    a: &RunnerAttempt,
    new: Condition<AttemptConditionType, AttemptReason>,
) -> Option<Vec<Condition<AttemptConditionType, AttemptReason>>> {
    let mut conditions = a
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

/// Set one condition on `a` (as read: the write is a CAS against its resourceVersion). Returns
/// whether anything was written; a conflict is not an error — the next pass re-reads and decides
/// again.
pub async fn set(
    api: &Api<RunnerAttempt>,
    a: &RunnerAttempt,
    type_: AttemptConditionType,
    status: ConditionStatus,
    reason: AttemptReason,
    message: String,
) -> Result<bool, kube::Error> {
    let new = Condition {
        type_,
        status,
        reason,
        message,
        last_transition_time: Some(Time(Timestamp::now())),
        observed_generation: a.metadata.generation,
    };
    let Some(conditions) = with_condition(a, new) else {
        return Ok(false);
    };
    let (Some(name), Some(version)) = (
        a.metadata.name.as_deref(),
        a.metadata.resource_version.as_deref(),
    ) else {
        return Ok(false);
    };
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": version},
        "status": {"conditions": conditions},
    });
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(
        status: ConditionStatus,
        message: &str,
    ) -> Condition<AttemptConditionType, AttemptReason> {
        Condition {
            type_: AttemptConditionType::Quarantined,
            status,
            reason: AttemptReason::RetainedWorkNotADirectory,
            message: message.into(),
            last_transition_time: None,
            observed_generation: None,
        }
    }

    #[test]
    fn an_unchanged_condition_is_not_written_again() {
        let mut a: RunnerAttempt = serde_json::from_value(serde_json::json!({
            "apiVersion": "runner-manager.dev/v1alpha1", "kind": "RunnerAttempt",
            "metadata": {"name": "web-1"},
            "spec": {"id": "00000000-0000-4000-8000-000000000001", "policy": "web", "nodeName": "n",
                     "snapshot": {"policyUid": "u", "target": {"url": "https://github.com/a/b", "scope": "Repository"},
                                  "labels": ["x"], "runnerGroupId": 1, "workspace": "Persistent", "maxSlots": 1,
                                  "execution": {"mode": "Native"},
                                  "runner": {"version": "2.330.0", "url": "https://x/y.tar.gz", "sha256": "a".repeat(64)},
                                  "timeouts": {"registration": "5m", "idle": "10m", "jitHandoff": "2m"}}}
        }))
        .unwrap();
        let first = with_condition(&a, condition(ConditionStatus::True, "m")).unwrap();
        assert_eq!(first.len(), 1);
        a.status = Some(Default::default());
        if let Some(s) = a.status.as_mut() {
            s.journal.conditions = first;
        }
        assert!(with_condition(&a, condition(ConditionStatus::True, "m")).is_none());
        let resolved = with_condition(&a, condition(ConditionStatus::False, "m")).unwrap();
        assert_eq!(resolved.len(), 1, "one condition per type");
        assert_eq!(resolved[0].status, ConditionStatus::False);
    }
}
