//! How an attempt ended. In Rust an [`Outcome`] is an enum whose reasons are closed per kind, so
//! "completed a job because the node was lost" cannot be written; on the wire it is
//! `{kind, reason}`, the shape `kubectl get` and people read.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::state::AttemptState;

/// How an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "OutcomeWire", into = "OutcomeWire")]
pub enum Outcome {
    /// The runner ran its one job (`_diag` shows a worker) and exited.
    CompletedJob,
    /// The runner was registered, got no job, and was stopped at its idle timeout or scale-down.
    /// Not a failure and never replaced.
    ExitedIdleWithoutWork,
    /// The launch or the runner failed.
    Failed(FailureReason),
    /// The runner's process or node went away without a conclusion of its own.
    Orphaned(OrphanReason),
    /// The agent did not admit the attempt; nothing was allocated.
    Rejected(RejectReason),
}

/// Why an attempt failed. A closed list: nothing free-text reaches status, events or logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum FailureReason {
    /// No JIT config was obtained within the handoff deadline.
    JitRequestFailed,
    /// A JIT was minted for the attempt but never reached a runner; it is never re-requested.
    JitExpired,
    /// The runner package's checksum was absent or wrong, or its archive unsafe.
    RunnerPackageUnverified,
    /// GitHub refuses this runner version.
    RunnerVersionRejected,
    /// The workspace could not be materialized (disk full, I/O error).
    WorkspaceUnavailable,
    /// Preparation was interrupted (agent restart before `Prepared`).
    PreparationInterrupted,
    /// The runner process or pod could not be started.
    ProcessStartFailed,
    /// The runner exited before concluding on its own terms.
    ProcessExitedUnexpectedly,
    /// The agent stopped a runner that never registered within the registration timeout.
    TerminatedAfterRegistrationTimeout,
    /// The attempt's spec changed after it was allocated; the agent refused to act on it.
    SpecChanged,
    /// The OCI provider could not pull or run the image.
    ImageUnavailable,
    /// A provider resource did not match the journal; left for a person.
    OwnershipMismatch,
    /// The runner refused the JIT handoff file.
    JitHandoffRejected,
    /// The attempt was asked to terminate (deleted, drained, policy deleted) before it ran a job.
    TerminationRequested,
    /// The kubelet refused the attempt's placeholder or runner pod for want of CPU or memory
    /// (`OutOfcpu`, `OutOfmemory`): the node was fuller than placement knew. The node's fault,
    /// not the policy's: replaced, never counted toward `Degraded`.
    NodeOutOfResources,
}

/// Why an attempt was orphaned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum OrphanReason {
    /// The node's agent Lease stayed expired past the grace period (written by the operator).
    NodeLost,
    /// The process went away while registered; whether a job ran is not guessed.
    ProcessLost,
}

/// Why the agent did not admit an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum RejectReason {
    /// The node is full by the agent's own count.
    NodeFull,
    /// The snapshot cannot run on this node (provider missing, slot range, architecture).
    SnapshotUnusable,
    /// No agent admitted the attempt in time (written by the operator).
    AdmissionTimeout,
}

/// The kind of an outcome, as the wire and the printer column show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum OutcomeKind {
    CompletedJob,
    ExitedIdleWithoutWork,
    Failed,
    Orphaned,
    Rejected,
}

/// Every reason of every kind, for the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum OutcomeReason {
    JitRequestFailed,
    JitExpired,
    RunnerPackageUnverified,
    RunnerVersionRejected,
    WorkspaceUnavailable,
    PreparationInterrupted,
    ProcessStartFailed,
    ProcessExitedUnexpectedly,
    TerminatedAfterRegistrationTimeout,
    SpecChanged,
    ImageUnavailable,
    OwnershipMismatch,
    JitHandoffRejected,
    TerminationRequested,
    NodeOutOfResources,
    NodeLost,
    ProcessLost,
    NodeFull,
    SnapshotUnusable,
    AdmissionTimeout,
}

/// An outcome as stored: `{kind, reason}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OutcomeWire {
    /// How the attempt ended.
    pub kind: OutcomeKind,
    /// Why, for `Failed`, `Orphaned` and `Rejected`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = no_null_in_enum)]
    pub reason: Option<OutcomeReason>,
}

/// An optional enum's schema lists `null` among its values; API servers before 1.30 refuse a
/// CRD whose enum holds `null`. The field is omitted rather than null, so drop it.
fn no_null_in_enum(schema: &mut schemars::Schema) {
    let strip = |v: &mut serde_json::Value| {
        if let Some(values) = v.get_mut("enum").and_then(|e| e.as_array_mut()) {
            values.retain(|x| !x.is_null());
        }
    };
    if let Some(obj) = schema.as_object_mut() {
        let mut value = serde_json::Value::Object(std::mem::take(obj));
        strip(&mut value);
        if let Some(any_of) = value.get_mut("anyOf").and_then(|a| a.as_array_mut()) {
            any_of.iter_mut().for_each(strip);
        }
        if let serde_json::Value::Object(o) = value {
            *obj = o;
        }
    }
}

/// A stored outcome whose kind and reason do not belong together.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("outcome kind {kind:?} cannot carry reason {reason:?}")]
pub struct OutcomeMismatch {
    pub kind: OutcomeKind,
    pub reason: Option<OutcomeReason>,
}

impl Outcome {
    pub fn kind(self) -> OutcomeKind {
        match self {
            Self::CompletedJob => OutcomeKind::CompletedJob,
            Self::ExitedIdleWithoutWork => OutcomeKind::ExitedIdleWithoutWork,
            Self::Failed(_) => OutcomeKind::Failed,
            Self::Orphaned(_) => OutcomeKind::Orphaned,
            Self::Rejected(_) => OutcomeKind::Rejected,
        }
    }

    /// The state a conclusion with this outcome moves to. `Rejected` skips the concluded states:
    /// nothing was allocated, so there is nothing to clean.
    pub fn terminal_state(self) -> AttemptState {
        match self {
            Self::CompletedJob | Self::ExitedIdleWithoutWork => AttemptState::Finished,
            Self::Failed(_) => AttemptState::Failed,
            Self::Orphaned(_) => AttemptState::Orphaned,
            Self::Rejected(_) => AttemptState::Cleaned,
        }
    }

    /// Failures and orphans count towards a policy's consecutive-failure budget; an idle exit and
    /// a rejection do not.
    pub fn is_failure(self) -> bool {
        matches!(self, Self::Failed(_) | Self::Orphaned(_))
    }

    /// Whether demand should place a replacement: every failure before a job was accepted. An idle
    /// exit (surplus) and a completed job are never replaced; a rejection is re-placed by demand.
    pub fn wants_replacement(self) -> bool {
        matches!(
            self,
            Self::Failed(r) if r != FailureReason::TerminationRequested
        ) || matches!(self, Self::Orphaned(OrphanReason::NodeLost))
    }
}

impl From<Outcome> for OutcomeWire {
    fn from(o: Outcome) -> Self {
        use OutcomeReason as R;
        let reason = match o {
            Outcome::CompletedJob | Outcome::ExitedIdleWithoutWork => None,
            Outcome::Failed(f) => Some(match f {
                FailureReason::JitRequestFailed => R::JitRequestFailed,
                FailureReason::JitExpired => R::JitExpired,
                FailureReason::RunnerPackageUnverified => R::RunnerPackageUnverified,
                FailureReason::RunnerVersionRejected => R::RunnerVersionRejected,
                FailureReason::WorkspaceUnavailable => R::WorkspaceUnavailable,
                FailureReason::PreparationInterrupted => R::PreparationInterrupted,
                FailureReason::ProcessStartFailed => R::ProcessStartFailed,
                FailureReason::ProcessExitedUnexpectedly => R::ProcessExitedUnexpectedly,
                FailureReason::TerminatedAfterRegistrationTimeout => {
                    R::TerminatedAfterRegistrationTimeout
                }
                FailureReason::SpecChanged => R::SpecChanged,
                FailureReason::ImageUnavailable => R::ImageUnavailable,
                FailureReason::OwnershipMismatch => R::OwnershipMismatch,
                FailureReason::JitHandoffRejected => R::JitHandoffRejected,
                FailureReason::TerminationRequested => R::TerminationRequested,
                FailureReason::NodeOutOfResources => R::NodeOutOfResources,
            }),
            Outcome::Orphaned(OrphanReason::NodeLost) => Some(R::NodeLost),
            Outcome::Orphaned(OrphanReason::ProcessLost) => Some(R::ProcessLost),
            Outcome::Rejected(RejectReason::NodeFull) => Some(R::NodeFull),
            Outcome::Rejected(RejectReason::SnapshotUnusable) => Some(R::SnapshotUnusable),
            Outcome::Rejected(RejectReason::AdmissionTimeout) => Some(R::AdmissionTimeout),
        };
        Self {
            kind: o.kind(),
            reason,
        }
    }
}

impl TryFrom<OutcomeWire> for Outcome {
    type Error = OutcomeMismatch;

    fn try_from(w: OutcomeWire) -> Result<Self, Self::Error> {
        use OutcomeReason as R;
        let mismatch = OutcomeMismatch {
            kind: w.kind,
            reason: w.reason,
        };
        let failed = |f| Ok(Outcome::Failed(f));
        match (w.kind, w.reason) {
            (OutcomeKind::CompletedJob, None) => Ok(Outcome::CompletedJob),
            (OutcomeKind::ExitedIdleWithoutWork, None) => Ok(Outcome::ExitedIdleWithoutWork),
            (OutcomeKind::Failed, Some(r)) => match r {
                R::JitRequestFailed => failed(FailureReason::JitRequestFailed),
                R::JitExpired => failed(FailureReason::JitExpired),
                R::RunnerPackageUnverified => failed(FailureReason::RunnerPackageUnverified),
                R::RunnerVersionRejected => failed(FailureReason::RunnerVersionRejected),
                R::WorkspaceUnavailable => failed(FailureReason::WorkspaceUnavailable),
                R::PreparationInterrupted => failed(FailureReason::PreparationInterrupted),
                R::ProcessStartFailed => failed(FailureReason::ProcessStartFailed),
                R::ProcessExitedUnexpectedly => failed(FailureReason::ProcessExitedUnexpectedly),
                R::TerminatedAfterRegistrationTimeout => {
                    failed(FailureReason::TerminatedAfterRegistrationTimeout)
                }
                R::SpecChanged => failed(FailureReason::SpecChanged),
                R::ImageUnavailable => failed(FailureReason::ImageUnavailable),
                R::OwnershipMismatch => failed(FailureReason::OwnershipMismatch),
                R::JitHandoffRejected => failed(FailureReason::JitHandoffRejected),
                R::TerminationRequested => failed(FailureReason::TerminationRequested),
                R::NodeOutOfResources => failed(FailureReason::NodeOutOfResources),
                _ => Err(mismatch),
            },
            (OutcomeKind::Orphaned, Some(R::NodeLost)) => {
                Ok(Outcome::Orphaned(OrphanReason::NodeLost))
            }
            (OutcomeKind::Orphaned, Some(R::ProcessLost)) => {
                Ok(Outcome::Orphaned(OrphanReason::ProcessLost))
            }
            (OutcomeKind::Rejected, Some(R::NodeFull)) => {
                Ok(Outcome::Rejected(RejectReason::NodeFull))
            }
            (OutcomeKind::Rejected, Some(R::SnapshotUnusable)) => {
                Ok(Outcome::Rejected(RejectReason::SnapshotUnusable))
            }
            (OutcomeKind::Rejected, Some(R::AdmissionTimeout)) => {
                Ok(Outcome::Rejected(RejectReason::AdmissionTimeout))
            }
            _ => Err(mismatch),
        }
    }
}

impl JsonSchema for Outcome {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Outcome".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        OutcomeWire::json_schema(generator)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = OutcomeWire::from(*self);
        match w.reason {
            Some(r) => write!(f, "{:?}({r:?})", w.kind),
            None => write!(f, "{:?}", w.kind),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every outcome the Rust type can hold, so the wire round trip is checked for all of them.
    pub(crate) fn all_outcomes() -> Vec<Outcome> {
        use FailureReason as F;
        let mut v = vec![Outcome::CompletedJob, Outcome::ExitedIdleWithoutWork];
        for f in [
            F::JitRequestFailed,
            F::JitExpired,
            F::RunnerPackageUnverified,
            F::RunnerVersionRejected,
            F::WorkspaceUnavailable,
            F::PreparationInterrupted,
            F::ProcessStartFailed,
            F::ProcessExitedUnexpectedly,
            F::TerminatedAfterRegistrationTimeout,
            F::SpecChanged,
            F::ImageUnavailable,
            F::OwnershipMismatch,
            F::JitHandoffRejected,
            F::TerminationRequested,
            F::NodeOutOfResources,
        ] {
            v.push(Outcome::Failed(f));
        }
        v.push(Outcome::Orphaned(OrphanReason::NodeLost));
        v.push(Outcome::Orphaned(OrphanReason::ProcessLost));
        for r in [
            RejectReason::NodeFull,
            RejectReason::SnapshotUnusable,
            RejectReason::AdmissionTimeout,
        ] {
            v.push(Outcome::Rejected(r));
        }
        v
    }

    #[test]
    fn every_outcome_round_trips_through_the_wire() {
        let all = all_outcomes();
        // 2 + 15 failures + 2 orphans + 3 rejections: one wire reason per Rust reason.
        assert_eq!(all.len(), 22);
        for o in all {
            let json = serde_json::to_value(o).unwrap();
            let back: Outcome = serde_json::from_value(json.clone()).unwrap();
            assert_eq!(back, o, "{json}");
        }
    }

    #[test]
    fn mismatched_wire_pairs_are_refused() {
        for json in [
            r#"{"kind":"CompletedJob","reason":"NodeLost"}"#,
            r#"{"kind":"Failed"}"#,
            r#"{"kind":"Failed","reason":"NodeLost"}"#,
            r#"{"kind":"Orphaned","reason":"JitExpired"}"#,
            r#"{"kind":"Rejected","reason":"ProcessLost"}"#,
        ] {
            assert!(serde_json::from_str::<Outcome>(json).is_err(), "{json}");
        }
    }

    #[test]
    fn replacement_rules() {
        assert!(!Outcome::ExitedIdleWithoutWork.wants_replacement());
        assert!(!Outcome::CompletedJob.wants_replacement());
        assert!(Outcome::Failed(FailureReason::JitExpired).wants_replacement());
        assert!(!Outcome::Failed(FailureReason::TerminationRequested).wants_replacement());
        assert!(Outcome::Orphaned(OrphanReason::NodeLost).wants_replacement());
        assert!(!Outcome::Orphaned(OrphanReason::ProcessLost).wants_replacement());
        assert!(!Outcome::ExitedIdleWithoutWork.is_failure());
        assert_eq!(
            Outcome::Rejected(RejectReason::NodeFull).terminal_state(),
            AttemptState::Cleaned
        );
    }
}
