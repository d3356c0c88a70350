//! Fault injection for the crash-recovery tests: `RM_AGENT_FAULT=<boundary>` makes the agent
//! `abort()` the moment it reaches that boundary, as a power cut or OOM kill would; and
//! `RM_AGENT_FAIL=<step>` makes a step inside the launcher after the spawn fail (the agent goes
//! on: what it does with a failure once a child existed is under test).
//!
//! Compiled only under `debug_assertions`: a release build has no hook at all (the function is
//! an empty inline), so no environment variable can crash a production agent.

/// A named instant in an attempt's life where a crash is most dangerous.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Boundary {
    /// `Allocated` is journalled; no package, no JIT yet.
    AfterAllocated,
    /// The package is in the runtime; no JIT was asked for (native: the attempt is `Allocated`).
    AfterMaterialize,
    /// The broker answered (the JIT is in memory only); nothing was spawned.
    AfterJitBeforeSpawn,
    /// The runner runs and its identity is durable; `Starting` is not journalled.
    AfterSpawnBeforeStarting,
    /// The termination intent is durable; nothing was signalled.
    AfterTerminationIntent,
    /// The workspace is removed; `Cleaned` is not journalled.
    MidCleanup,
    /// (OCI) `Preparing` is journalled and the runner pod exists; `Prepared` is not journalled.
    AfterPodCreated,
    /// (OCI) `Prepared` is journalled with the pod's identity; no JIT was asked for.
    AfterPrepared,
}

impl Boundary {
    pub const ALL: [Self; 8] = [
        Self::AfterAllocated,
        Self::AfterMaterialize,
        Self::AfterJitBeforeSpawn,
        Self::AfterSpawnBeforeStarting,
        Self::AfterTerminationIntent,
        Self::MidCleanup,
        Self::AfterPodCreated,
        Self::AfterPrepared,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::AfterAllocated => "after-allocated",
            Self::AfterMaterialize => "after-materialize",
            Self::AfterJitBeforeSpawn => "after-jit-before-spawn",
            Self::AfterSpawnBeforeStarting => "after-spawn-before-starting",
            Self::AfterTerminationIntent => "after-termination-intent",
            Self::MidCleanup => "mid-cleanup",
            Self::AfterPodCreated => "after-pod-created",
            Self::AfterPrepared => "after-prepared",
        }
    }
}

/// The environment variable naming the boundary to crash at.
pub const FAULT_ENV: &str = "RM_AGENT_FAULT";

/// Aborts the process if `RM_AGENT_FAULT` names `boundary` (debug builds only).
#[cfg(debug_assertions)]
pub fn at(boundary: Boundary) {
    if std::env::var(FAULT_ENV).is_ok_and(|v| v == boundary.as_str()) {
        eprintln!("agent: fault injected at {}: aborting", boundary.as_str());
        std::process::abort();
    }
}

/// Release builds: no hook.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn at(_boundary: Boundary) {}

/// A step inside the launcher, after the child exists, that can be made to fail — not crash
/// — for the post-spawn tests (parity rows 52 and 61): `RM_AGENT_FAIL=<step>[,<step>…]`. A
/// failure at any of the first three is final for the JIT (the child may have consumed it);
/// `stop-after-start-failure` makes the launcher's stop of that child fail too, so it cannot be
/// proven dead and stays supervised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LaunchFault {
    /// The handoff file reads as surviving the start.
    HandoffDelete,
    /// The identity file cannot be written.
    IdentityWrite,
    /// The child cannot be recorded among the launcher's children.
    ChildMapInsert,
    /// The stop of a child whose start failed does not take.
    StopAfterStartFailure,
}

impl LaunchFault {
    pub const ALL: [Self; 4] = [
        Self::HandoffDelete,
        Self::IdentityWrite,
        Self::ChildMapInsert,
        Self::StopAfterStartFailure,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::HandoffDelete => "handoff-delete",
            Self::IdentityWrite => "identity-write",
            Self::ChildMapInsert => "child-map-insert",
            Self::StopAfterStartFailure => "stop-after-start-failure",
        }
    }
}

/// The environment variable naming the launcher steps to fail.
pub const FAIL_ENV: &str = "RM_AGENT_FAIL";

/// Whether `RM_AGENT_FAIL` names `step` (debug builds only).
#[cfg(debug_assertions)]
pub fn fails(step: LaunchFault) -> bool {
    let named =
        std::env::var(FAIL_ENV).is_ok_and(|v| v.split(',').any(|s| s.trim() == step.as_str()));
    if named {
        eprintln!("agent: failure injected at {}", step.as_str());
    }
    named
}

/// Release builds: no hook.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn fails(_step: LaunchFault) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundary_names_are_distinct() {
        let names: std::collections::BTreeSet<_> =
            Boundary::ALL.iter().map(|b| b.as_str()).collect();
        assert_eq!(names.len(), Boundary::ALL.len());
    }

    #[test]
    fn launch_fault_names_are_distinct() {
        let names: std::collections::BTreeSet<_> =
            LaunchFault::ALL.iter().map(|f| f.as_str()).collect();
        assert_eq!(names.len(), LaunchFault::ALL.len());
    }
}
