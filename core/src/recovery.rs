//! The recovery table ([`decide`]): what supervision does with one attempt it is not bringing
//! up, from the journal, what it sees of the process and of GitHub, and the clock. The same
//! function runs at agent start-up and on every supervision pass ("recovery is supervision").
//! It reads the journal through [`JournalView`]; `runner_manager_crds::recovery::recovery_decision`
//! builds that view from an attempt's journal.
//!
//! Evaluation order (lifecycle spec §2.4, supplement §1.7, adapted to the Kubernetes states):
//! `Cleaned` → Nothing; other terminal → Clean; `Pending` → Admit; GitHub unreachable → Defer;
//! then per state. Every comparison is `elapsed >= timeout`.

use std::time::Duration;

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::outcome::{FailureReason, OrphanReason, Outcome};
use crate::state::AttemptState;

/// Why an attempt is asked to terminate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum TerminationReason {
    RegistrationTimeout,
    IdleTimeout,
    PolicyDeleted,
    Drain,
    Deleted,
    ScaleDown,
}

/// What the table reads of an attempt's journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalView {
    pub state: AttemptState,
    /// `status.timestamps.lastStateChangeAt`.
    pub last_state_change_at: Option<Timestamp>,
    /// `status.timestamps.jitReceivedAt`.
    pub jit_received_at: Option<Timestamp>,
}

/// What the agent sees of the runner's process or pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProcessObservation {
    /// The journalled identity (pid + start time + cgroup, or pod uid + generation) is alive.
    Alive,
    /// Nothing alive matches the journalled identity (or none is journalled).
    Gone,
}

/// What GitHub's runner list says of the attempt's runner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GitHubObservation {
    /// GitHub could not be asked (or the operator's fact says so).
    Unreachable,
    /// No runner of that name.
    NotRegistered,
    /// Listed, busy or not.
    Registered { busy: bool },
}

/// The deadlines recovery measures against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecoveryTimeouts {
    /// Longest time in `Prepared` without a JIT.
    pub jit_handoff: Duration,
    /// Longest time from `jitReceivedAt` to being listed online.
    pub registration: Duration,
    /// Longest time `Idle` without a job.
    pub idle: Duration,
}

/// Why a runner is terminated (the agent journals this reason in its intent file before any
/// signal, so a crash between signal and conclusion is concluded with the right outcome).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TerminateReason {
    RegistrationTimeout,
    IdleTimeout,
}

impl TerminateReason {
    /// The outcome once the process is proven gone.
    pub fn outcome(self) -> Outcome {
        match self {
            Self::RegistrationTimeout => {
                Outcome::Failed(FailureReason::TerminatedAfterRegistrationTimeout)
            }
            Self::IdleTimeout => Outcome::ExitedIdleWithoutWork,
        }
    }
}

/// The outcome of a runner the operator asked to terminate (`spec.termination`), once it is
/// proven stopped. A registration timeout is a failure to replace. Any other request ends an
/// idle runner as an idle exit — scale-down, drain, policy deletion and `kubectl delete` of an
/// idle runner are not failures and are never replaced — and ends a runner that was not idle
/// (still starting, or busy when deleted) as `Failed(TerminationRequested)`.
pub fn requested_termination_outcome(reason: TerminationReason, state: AttemptState) -> Outcome {
    use TerminationReason as R;
    match (reason, state) {
        (R::RegistrationTimeout, _) => TerminateReason::RegistrationTimeout.outcome(),
        (_, AttemptState::Idle) => TerminateReason::IdleTimeout.outcome(),
        _ => Outcome::Failed(FailureReason::TerminationRequested),
    }
}

/// What to do with the attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecoveryDecision {
    /// `Cleaned`: nothing left to do.
    Nothing,
    /// Not yet admitted: run admission.
    Admit,
    /// Keep supervising what is alive.
    Adopt,
    /// Too early to tell.
    Wait,
    /// GitHub unreachable: decide later. Blocks `recoveryComplete` until resolved.
    Defer,
    /// Ask the broker for the JIT (an agent restarting with the attempt `Prepared`).
    RequestJit,
    /// Record what is observed (the caller must persist it, or the decision repeats forever).
    Observe(AttemptState),
    /// The supervised thing is gone: deregister if listed, conclude, then clean.
    Conclude(Outcome),
    /// Stop the live runner: intent first, signal, prove death, then conclude with
    /// `reason.outcome()`.
    Terminate(TerminateReason),
    /// Concluded: clean (or tear down, OCI).
    Clean,
}

fn elapsed_since(since: Option<Timestamp>, now: Timestamp) -> Duration {
    // A missing timestamp reads as "just now": never time out on data we do not have.
    since
        .and_then(|t| now.duration_since(t).try_into().ok())
        .unwrap_or(Duration::ZERO)
}

/// The decision for one attempt. Pure.
pub fn decide(
    journal: JournalView,
    process: ProcessObservation,
    github: GitHubObservation,
    timeouts: &RecoveryTimeouts,
    now: Timestamp,
) -> RecoveryDecision {
    use AttemptState as S;
    use GitHubObservation as G;
    use ProcessObservation::{Alive, Gone};
    use RecoveryDecision as D;

    let state = journal.state;
    if state == S::Cleaned {
        return D::Nothing;
    }
    if state.is_terminal() {
        return D::Clean;
    }
    if state == S::Pending {
        return D::Admit;
    }
    if github == G::Unreachable {
        return D::Defer;
    }
    let in_state = elapsed_since(journal.last_state_change_at, now);
    // The registration deadline runs from the JIT, so a slow start cannot stretch it.
    let since_jit = elapsed_since(
        journal.jit_received_at.or(journal.last_state_change_at),
        now,
    );
    match (state, github, process) {
        // Preparation was interrupted: no JIT was ever requested, nothing on GitHub to lose.
        (S::Allocated | S::Preparing, _, _) => {
            D::Conclude(Outcome::Failed(FailureReason::PreparationInterrupted))
        }
        // The broker deletes any registration a crashed mint left before it mints again.
        (S::Prepared, _, _) if in_state >= timeouts.jit_handoff => {
            D::Conclude(Outcome::Failed(FailureReason::JitRequestFailed))
        }
        (S::Prepared, _, _) => D::RequestJit,
        // The spawn crash gap: the identity reached the host before spawn returned.
        (S::JitReceived, _, Alive) => D::Observe(S::Starting),
        // The JIT lived only in the dead agent's memory: it is lost, never re-requested.
        (S::JitReceived, _, Gone) => D::Conclude(Outcome::Failed(FailureReason::JitExpired)),
        (S::Starting, G::Registered { busy: true }, _) => D::Observe(S::Busy),
        (S::Starting, G::Registered { busy: false }, _) => D::Observe(S::Idle),
        (S::Starting, G::NotRegistered, Gone) => {
            D::Conclude(Outcome::Failed(FailureReason::ProcessExitedUnexpectedly))
        }
        (S::Starting, G::NotRegistered, Alive) if since_jit >= timeouts.registration => {
            D::Terminate(TerminateReason::RegistrationTimeout)
        }
        (S::Starting, G::NotRegistered, Alive) => D::Adopt,
        (S::Idle, G::Registered { busy: true }, _) => D::Observe(S::Busy),
        // Listed idle but no process: whether it ran something is not guessed.
        (S::Idle, G::Registered { busy: false }, Gone) => {
            D::Conclude(Outcome::Orphaned(OrphanReason::ProcessLost))
        }
        (S::Idle, G::Registered { busy: false }, Alive) if in_state >= timeouts.idle => {
            D::Terminate(TerminateReason::IdleTimeout)
        }
        (S::Idle, G::Registered { busy: false }, Alive) => D::Adopt,
        (S::Idle, G::NotRegistered, Alive) => D::Adopt,
        (S::Idle, G::NotRegistered, Gone) if in_state >= timeouts.idle => {
            D::Conclude(Outcome::ExitedIdleWithoutWork)
        }
        (S::Idle, G::NotRegistered, Gone) => {
            D::Conclude(Outcome::Failed(FailureReason::ProcessExitedUnexpectedly))
        }
        (S::Busy, _, Alive) => D::Adopt,
        // Never guessed as success: `_diag` evidence, read by the caller first, decides that.
        (S::Busy, _, Gone) => D::Conclude(Outcome::Orphaned(OrphanReason::ProcessLost)),
        // Unreachable was handled above; every live state is matched.
        (S::Pending | S::Finished | S::Failed | S::Orphaned, _, _)
        | (S::Destroying | S::CleanupDeferred | S::Cleaned, _, _)
        | (_, G::Unreachable, _) => D::Wait,
    }
}
