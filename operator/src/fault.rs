//! Fault injection for the crash tests: `RM_OPERATOR_FAULT=<boundary>` makes the operator
//! `abort()` the moment it reaches that boundary, as a power cut or an OOM kill would (the
//! agent's counterpart is `node-agent/src/agent/fault.rs`).
//!
//! Compiled only under `debug_assertions`: a release build has no hook at all (the function is
//! an empty inline), so no environment variable can crash a production operator.

/// A named instant where a crash of the operator is most dangerous.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Boundary {
    /// The broker holds GitHub's 201 (a registration exists under the attempt's runner name);
    /// the runner id is not journalled and no JIT has left.
    AfterMintBeforeJournal,
}

impl Boundary {
    pub const ALL: [Self; 1] = [Self::AfterMintBeforeJournal];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::AfterMintBeforeJournal => "after-mint-before-journal",
        }
    }
}

/// The environment variable naming the boundary to crash at.
pub const FAULT_ENV: &str = "RM_OPERATOR_FAULT";

/// Aborts the process if `RM_OPERATOR_FAULT` names `boundary` (debug builds only).
#[cfg(debug_assertions)]
pub fn at(boundary: Boundary) {
    if std::env::var(FAULT_ENV).is_ok_and(|v| v == boundary.as_str()) {
        eprintln!(
            "operator: fault injected at {}: aborting",
            boundary.as_str()
        );
        std::process::abort();
    }
}

/// Release builds: no hook.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn at(_boundary: Boundary) {}
