//! The closed vocabularies the agent's metrics, Events and logs are labelled with, below
//! `metrics` and everything that counts: `metrics` registers every value of each at 0 from the
//! start, the module that names the thing (`events`, `orphans`, `pruning`, `controller`) counts
//! it, and none of them imports another to do so.

use kube::runtime::events::{Event, EventType, Recorder};

/// Why an Event is emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventReason {
    RecoveryBlocked,
    CleanupDeferred,
    Rejected,
    SpecChanged,
    PackageRefused,
    /// A running native runner's placeholder was deleted, evicted or ended (recreated, or
    /// not).
    PlaceholderLost,
    /// The job gate refused the job the runner started (`spec.workspace.forkPullRequests`).
    JobRefused,
}

impl EventReason {
    pub const ALL: [Self; 7] = [
        Self::RecoveryBlocked,
        Self::CleanupDeferred,
        Self::Rejected,
        Self::SpecChanged,
        Self::PackageRefused,
        Self::PlaceholderLost,
        Self::JobRefused,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::RecoveryBlocked => "RecoveryBlocked",
            Self::CleanupDeferred => "CleanupDeferred",
            Self::Rejected => "Rejected",
            Self::SpecChanged => "SpecChanged",
            Self::PackageRefused => "PackageRefused",
            Self::PlaceholderLost => "PlaceholderLost",
            Self::JobRefused => "JobRefused",
        }
    }
}

/// What an orphan sweep removes, as counted and logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OrphanKind {
    /// A runner process (its cgroup or unit held one) stopped.
    Runner,
    /// An empty attempt cgroup or a dead unit removed.
    Cgroup,
    /// An ephemeral runtime removed.
    Runtime,
    /// A handoff file removed from an unleased slot.
    Handoff,
    /// A job gate's directory removed (`crate::job_gate`).
    Gate,
    /// A runner's dependency cache unmounted and its writes discarded (`crate::caches`).
    Cache,
    /// A runner's Docker engine stopped and its directory removed (`crate::docker`).
    Docker,
}

impl OrphanKind {
    pub const ALL: [Self; 7] = [
        Self::Runner,
        Self::Cgroup,
        Self::Runtime,
        Self::Handoff,
        Self::Gate,
        Self::Cache,
        Self::Docker,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Runner => "runner",
            Self::Cgroup => "cgroup",
            Self::Runtime => "runtime",
            Self::Handoff => "handoff",
            Self::Gate => "gate",
            Self::Cache => "cache",
            Self::Docker => "docker",
        }
    }
}

/// What a package prune came to, as counted in `runner_manager_agent_package_prunes_total{result}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PruneResult {
    /// It ran (it may have found nothing to remove).
    Ran,
    /// It gave way to a running install or copy.
    Skipped,
    /// A version could not be removed.
    Failed,
}

impl PruneResult {
    pub const ALL: [Self; 3] = [Self::Ran, Self::Skipped, Self::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ran => "ran",
            Self::Skipped => "skipped",
            Self::Failed => "failed",
        }
    }
}

/// The part of an attempt's life a reconcile was in, from the state it found: what
/// `runner_manager_agent_reconcile_errors_total{stage}` counts a failed reconcile under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReconcileStage {
    /// `Pending`: admission and the launch.
    Launch,
    /// `Allocated`, `Preparing`, `Prepared`, `JitReceived`: a launch found unfinished (after a
    /// restart, or a launch whose reconcile failed part-way).
    Resume,
    /// `Starting`, `Idle`, `Busy`: a live runner.
    Supervise,
    /// Concluded: stop, diagnostics, workspace, leases, `Cleaned`.
    Cleanup,
    /// An object the agent cannot act on (no uid, name or namespace).
    Read,
}

impl ReconcileStage {
    pub const ALL: [Self; 5] = [
        Self::Launch,
        Self::Resume,
        Self::Supervise,
        Self::Cleanup,
        Self::Read,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Launch => "launch",
            Self::Resume => "resume",
            Self::Supervise => "supervise",
            Self::Cleanup => "cleanup",
            Self::Read => "read",
        }
    }
}

/// Publishes a Warning event on `object` through `events`. Best effort, logged. Here, beside
/// the reasons, so what sits below the agent's context (`job_gates`) can publish too.
pub async fn publish_warning(
    events: &Recorder,
    object: &k8s_openapi::api::core::v1::ObjectReference,
    reason: EventReason,
    message: String,
) {
    let event = Event {
        type_: EventType::Warning,
        reason: reason.as_str().into(),
        note: Some(message),
        action: reason.as_str().into(),
        secondary: None,
    };
    if let Err(e) = events.publish(&event, object).await {
        tracing::warn!(
            reason = reason.as_str(),
            "event {} not written: {e}",
            reason.as_str()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn distinct(names: &[&str]) {
        let set: BTreeSet<&str> = names.iter().copied().collect();
        assert_eq!(set.len(), names.len(), "{names:?}");
    }

    #[test]
    fn every_vocabulary_has_distinct_names() {
        distinct(&EventReason::ALL.map(EventReason::as_str));
        distinct(&OrphanKind::ALL.map(OrphanKind::as_str));
        distinct(&PruneResult::ALL.map(PruneResult::as_str));
        distinct(&ReconcileStage::ALL.map(ReconcileStage::as_str));
        for n in OrphanKind::ALL
            .map(OrphanKind::as_str)
            .iter()
            .chain(&PruneResult::ALL.map(PruneResult::as_str))
            .chain(&ReconcileStage::ALL.map(ReconcileStage::as_str))
        {
            assert!(n.bytes().all(|b| b.is_ascii_lowercase()), "{n}");
        }
    }
}
