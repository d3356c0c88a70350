//! Fault injection for the crash-recovery tests: `RM_AGENT_FAULT=<boundary>` makes the agent
//! `abort()` the moment it reaches that boundary, as a power cut or OOM kill would.
//!
//! Compiled only under `debug_assertions`: a release build has no hook at all (the function is
//! an empty inline), so no environment variable can crash a production agent.

/// A named instant in an attempt's life where a crash is most dangerous.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Boundary {
    /// `Allocated` is journalled; no package, no JIT yet.
    AfterAllocated,
    /// The package is in the runtime; `Prepared` is not journalled.
    AfterMaterialize,
    /// The broker answered (the JIT is in memory only); nothing was spawned.
    AfterJitBeforeSpawn,
    /// The runner runs and its identity is durable; `Starting` is not journalled.
    AfterSpawnBeforeStarting,
    /// The termination intent is durable; nothing was signalled.
    AfterTerminationIntent,
    /// The workspace is removed; `Cleaned` is not journalled.
    MidCleanup,
}

impl Boundary {
    pub const ALL: [Self; 6] = [
        Self::AfterAllocated,
        Self::AfterMaterialize,
        Self::AfterJitBeforeSpawn,
        Self::AfterSpawnBeforeStarting,
        Self::AfterTerminationIntent,
        Self::MidCleanup,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::AfterAllocated => "after-allocated",
            Self::AfterMaterialize => "after-materialize",
            Self::AfterJitBeforeSpawn => "after-jit-before-spawn",
            Self::AfterSpawnBeforeStarting => "after-spawn-before-starting",
            Self::AfterTerminationIntent => "after-termination-intent",
            Self::MidCleanup => "mid-cleanup",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundary_names_are_distinct() {
        let names: std::collections::BTreeSet<_> =
            Boundary::ALL.iter().map(|b| b.as_str()).collect();
        assert_eq!(names.len(), Boundary::ALL.len());
    }
}
