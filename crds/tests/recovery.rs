//! `recovery_decision`, row by row (supplement §1.7 adapted to the Kubernetes states), plus the
//! exhaustive sweep: every reachable state × process × GitHub observation × before/after the
//! deadline gets a decision consistent with the rules that hold across rows.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use runner_manager_crds::fixtures as support;

use std::time::Duration;

use runner_manager_crds::attempt::AttemptJournal;
use runner_manager_crds::outcome::{FailureReason, OrphanReason, Outcome};
use runner_manager_crds::policy::ExecutionMode;
use runner_manager_crds::recovery::{
    GitHubObservation as G, ProcessObservation as P, RecoveryDecision as D, RecoveryTimeouts,
    TerminateReason, recovery_decision,
};
use runner_manager_crds::state::{AttemptState as S, EdgeKind};
use support::*;

const TIMEOUTS: RecoveryTimeouts = RecoveryTimeouts {
    jit_handoff: Duration::from_secs(120),
    registration: Duration::from_secs(300),
    idle: Duration::from_secs(600),
};

fn decide(j: &AttemptJournal, p: P, g: G, after_secs: i64) -> D {
    recovery_decision(j, p, g, &TIMEOUTS, at(after_secs))
}

/// A live runner of `j` GitHub does not list is adopted before t0 + 300 s (its JIT's deadline
/// in these journals) and stopped for its registration timeout from then on.
fn assert_registration_deadline_at_300s(j: &AttemptJournal) {
    assert_eq!(decide(j, P::Alive, G::NotRegistered, 299), D::Adopt);
    assert_eq!(
        decide(j, P::Alive, G::NotRegistered, 300),
        D::Terminate(TerminateReason::RegistrationTimeout)
    );
}

const REG_BUSY: G = G::Registered { busy: true };
const REG_IDLE: G = G::Registered { busy: false };

#[test]
fn terminal_and_pending_states_come_first() {
    for kind in [NATIVE, OCI] {
        for s in reachable_states(kind) {
            let j = journal_in(kind, s);
            for g in [G::Unreachable, G::NotRegistered, REG_IDLE, REG_BUSY] {
                for p in [P::Alive, P::Gone] {
                    let d = decide(&j, p, g, 10_000);
                    match s {
                        S::Cleaned => assert_eq!(d, D::Nothing),
                        s if s.is_terminal() => assert_eq!(d, D::Clean, "{s:?}"),
                        S::Pending => assert_eq!(d, D::Admit),
                        _ if g == G::Unreachable => assert_eq!(d, D::Defer, "{s:?}"),
                        _ => {}
                    }
                }
            }
        }
    }
}

#[test]
fn interrupted_preparation_concludes_without_touching_github() {
    for (kind, s) in [
        (NATIVE, S::Allocated),
        (OCI, S::Allocated),
        (OCI, S::Preparing),
    ] {
        let j = journal_in(kind, s);
        for p in [P::Alive, P::Gone] {
            for g in [G::NotRegistered, REG_IDLE] {
                assert_eq!(
                    decide(&j, p, g, 0),
                    D::Conclude(Outcome::Failed(FailureReason::PreparationInterrupted))
                );
            }
        }
    }
}

#[test]
fn prepared_asks_for_its_jit_until_the_handoff_deadline() {
    let j = journal_in(NATIVE, S::Prepared);
    assert_eq!(decide(&j, P::Gone, G::NotRegistered, 0), D::RequestJit);
    assert_eq!(decide(&j, P::Gone, G::NotRegistered, 119), D::RequestJit);
    // A registration a crashed broker left behind does not change this: the broker deletes it.
    assert_eq!(decide(&j, P::Gone, REG_IDLE, 60), D::RequestJit);
    assert_eq!(
        decide(&j, P::Gone, G::NotRegistered, 120),
        D::Conclude(Outcome::Failed(FailureReason::JitRequestFailed)),
        "elapsed >= timeout"
    );
}

#[test]
fn jit_received_is_adopted_only_with_a_live_process() {
    let j = journal_in(NATIVE, S::JitReceived);
    for g in [G::NotRegistered, REG_IDLE, REG_BUSY] {
        assert_eq!(
            decide(&j, P::Alive, g, 0),
            D::Observe(S::Starting),
            "spawn crash gap"
        );
        assert_eq!(
            decide(&j, P::Gone, g, 0),
            D::Conclude(Outcome::Failed(FailureReason::JitExpired)),
            "the JIT died with the agent and is never re-requested"
        );
    }
}

#[test]
fn starting_rows() {
    let j = journal_in(NATIVE, S::Starting);
    for p in [P::Alive, P::Gone] {
        assert_eq!(decide(&j, p, REG_BUSY, 0), D::Observe(S::Busy));
        assert_eq!(decide(&j, p, REG_IDLE, 0), D::Observe(S::Idle));
    }
    assert_eq!(
        decide(&j, P::Gone, G::NotRegistered, 0),
        D::Conclude(Outcome::Failed(FailureReason::ProcessExitedUnexpectedly))
    );
    assert_registration_deadline_at_300s(&j);
}

#[test]
fn the_registration_deadline_runs_from_the_jit_not_from_the_start() {
    // JIT at t0, started 200 s later: the deadline is t0 + 300 s, not t0 + 500 s.
    let jit = journal_in(NATIVE, S::JitReceived);
    let started = step(&jit, NATIVE, EdgeKind::Start, at(200));
    assert_registration_deadline_at_300s(&started);
}

#[test]
fn idle_rows() {
    let j = journal_in(NATIVE, S::Idle);
    for p in [P::Alive, P::Gone] {
        assert_eq!(decide(&j, p, REG_BUSY, 0), D::Observe(S::Busy));
    }
    assert_eq!(
        decide(&j, P::Gone, REG_IDLE, 0),
        D::Conclude(Outcome::Orphaned(OrphanReason::ProcessLost))
    );
    assert_eq!(decide(&j, P::Alive, REG_IDLE, 599), D::Adopt);
    assert_eq!(
        decide(&j, P::Alive, REG_IDLE, 600),
        D::Terminate(TerminateReason::IdleTimeout)
    );
    assert_eq!(decide(&j, P::Alive, G::NotRegistered, 10_000), D::Adopt);
    assert_eq!(
        decide(&j, P::Gone, G::NotRegistered, 600),
        D::Conclude(Outcome::ExitedIdleWithoutWork)
    );
    assert_eq!(
        decide(&j, P::Gone, G::NotRegistered, 599),
        D::Conclude(Outcome::Failed(FailureReason::ProcessExitedUnexpectedly))
    );
}

#[test]
fn a_busy_runner_is_never_guessed_a_success_nor_stopped() {
    let j = journal_in(NATIVE, S::Busy);
    for g in [G::NotRegistered, REG_IDLE, REG_BUSY] {
        assert_eq!(decide(&j, P::Alive, g, 1_000_000), D::Adopt);
        assert_eq!(
            decide(&j, P::Gone, g, 0),
            D::Conclude(Outcome::Orphaned(OrphanReason::ProcessLost))
        );
    }
}

#[test]
fn termination_outcomes() {
    assert_eq!(
        TerminateReason::RegistrationTimeout.outcome(),
        Outcome::Failed(FailureReason::TerminatedAfterRegistrationTimeout)
    );
    assert_eq!(
        TerminateReason::IdleTimeout.outcome(),
        Outcome::ExitedIdleWithoutWork
    );
    assert!(!TerminateReason::IdleTimeout.outcome().wants_replacement());
}

#[test]
fn a_requested_termination_of_an_idle_runner_is_an_idle_exit() {
    use runner_manager_crds::attempt::TerminationReason as R;
    use runner_manager_crds::recovery::requested_termination_outcome as outcome;
    for r in [
        R::IdleTimeout,
        R::ScaleDown,
        R::Drain,
        R::PolicyDeleted,
        R::Deleted,
    ] {
        assert_eq!(outcome(r, S::Idle), Outcome::ExitedIdleWithoutWork, "{r:?}");
        assert!(!outcome(r, S::Idle).wants_replacement());
        for s in [S::Starting, S::Busy] {
            assert_eq!(
                outcome(r, s),
                Outcome::Failed(FailureReason::TerminationRequested),
                "{r:?} in {s:?}"
            );
        }
    }
    for s in [S::Starting, S::Idle] {
        assert_eq!(
            outcome(R::RegistrationTimeout, s),
            Outcome::Failed(FailureReason::TerminatedAfterRegistrationTimeout)
        );
    }
    // Every outcome is one the state machine lets that state conclude with.
    for r in [
        R::RegistrationTimeout,
        R::IdleTimeout,
        R::ScaleDown,
        R::Drain,
        R::PolicyDeleted,
        R::Deleted,
    ] {
        for s in [S::Starting, S::Idle, S::Busy] {
            let edge = runner_manager_crds::attempt::Transition::Conclude(outcome(r, s)).kind();
            if r == R::RegistrationTimeout && s == S::Busy {
                continue; // never requested for a busy runner
            }
            assert!(
                edge.target(s, ExecutionMode::Native).is_ok(),
                "{r:?} in {s:?}"
            );
        }
    }
}

/// Rules that hold across the whole table, over every combination.
#[test]
fn sweep_every_state_observation_and_clock() {
    let mut combos = 0;
    for kind in [NATIVE, OCI] {
        for s in reachable_states(kind) {
            let j = journal_in(kind, s);
            for g in [G::Unreachable, G::NotRegistered, REG_IDLE, REG_BUSY] {
                for p in [P::Alive, P::Gone] {
                    for secs in [0, 119, 120, 299, 300, 599, 600, 86_400] {
                        combos += 1;
                        let d = decide(&j, p, g, secs);
                        // A conclusion is only for a supervised thing that is gone, and only
                        // from a live state; the edge it implies must be legal from `s`.
                        if let D::Conclude(o) = d {
                            assert!(s.is_live(), "{s:?} concluded");
                            let edge = runner_manager_crds::attempt::Transition::Conclude(o).kind();
                            assert!(edge.target(s, kind.execution).is_ok(), "{s:?} {o:?}");
                            if matches!(s, S::Starting | S::Idle | S::Busy) {
                                assert_eq!(p, P::Gone, "{s:?} concluded a live process");
                            }
                        }
                        // Terminate is only for a live process that is registered-or-starting.
                        if let D::Terminate(_) = d {
                            assert_eq!(p, P::Alive);
                            assert!(matches!(s, S::Starting | S::Idle));
                        }
                        // Observe names a state reachable by one legal edge.
                        if let D::Observe(to) = d {
                            let reachable = EdgeKind::ALL
                                .iter()
                                .any(|e| e.target(s, kind.execution) == Ok(to));
                            assert!(reachable, "{s:?} -> {to:?}");
                        }
                        // GitHub unreachable never yields an effect on a live attempt.
                        if g == G::Unreachable && s.is_live() {
                            assert_eq!(d, D::Defer);
                        }
                    }
                }
            }
        }
    }
    assert_eq!(combos, (11 + 14) * 4 * 2 * 8);
}
