//! The journal's edge functions: every state × every edge through `apply`, the actor rule, the
//! records each edge keeps, and a property test over random edge sequences.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use runner_manager_crds::fixtures as support;

use proptest::prelude::*;
use runner_manager_crds::attempt::{
    AttemptJournal, AttemptKind, RunnerRegistration, StartedIdentity, Transition,
    WorkspacePlacement,
};
use runner_manager_crds::outcome::{FailureReason, Outcome};
use runner_manager_crds::policy::{ExecutionMode, WorkspaceMode};
use runner_manager_crds::state::{Actor, AttemptState, EdgeError, EdgeKind};
use support::*;

/// Runs `check` for each kind, each state it can reach (and a journal in it), and each edge.
fn for_every_state_and_edge(
    mut check: impl FnMut(AttemptKind, AttemptState, &AttemptJournal, EdgeKind),
) {
    for kind in [NATIVE, OCI] {
        for from in reachable_states(kind) {
            let j = journal_in(kind, from);
            for edge in EdgeKind::ALL {
                check(kind, from, &j, edge);
            }
        }
    }
}

/// The agent may not take `t` from journal `j` (of `kind`).
fn agent_refused(j: &AttemptJournal, kind: AttemptKind, t: Transition) -> bool {
    j.apply(Actor::Agent, kind, t, at(1)).is_err()
}

#[test]
fn apply_agrees_with_the_table_for_every_state_and_edge() {
    for_every_state_and_edge(|kind, from, j, edge| {
        let table = edge.target(from, kind.execution);
        let got = j.apply(edge.actor(), kind, transition_of(kind, edge), at(5));
        match (table, got) {
            (Ok(to), Ok(next)) => {
                assert_eq!(next.state(), to, "{edge:?} from {from:?}");
                next.check_invariants(kind)
                    .unwrap_or_else(|e| panic!("{edge:?} from {from:?} broke an invariant: {e}"));
                assert_eq!(
                    next.timestamps().last_state_change_at.as_ref().map(|t| t.0),
                    Some(at(5))
                );
            }
            (Err(_), Err(_)) => {}
            (Ok(_), Err(e)) if from == AttemptState::Prepared && edge == EdgeKind::ReceiveJit => {
                panic!("a fresh Prepared journal must accept a JIT: {e}")
            }
            (t, g) => panic!("{edge:?} from {from:?} ({kind:?}): table {t:?}, apply {g:?}"),
        }
    });
}

#[test]
fn each_edge_is_refused_to_every_other_actor() {
    for_every_state_and_edge(|kind, from, j, edge| {
        for actor in [Actor::Agent, Actor::Broker, Actor::Operator] {
            if actor == edge.actor() {
                continue;
            }
            let r = j.apply(actor, kind, transition_of(kind, edge), at(1));
            assert!(
                matches!(r, Err(EdgeError::WrongActor { .. })),
                "{actor:?} took {edge:?} from {from:?}"
            );
        }
    });
}

#[test]
fn a_jit_is_never_received_twice() {
    // Even if something put a Prepared journal back (it cannot through apply), a journal with a
    // runner id refuses a second JIT: the attempt concludes JitExpired instead.
    let j = journal_in(NATIVE, AttemptState::JitReceived);
    let again = j.apply(
        Actor::Broker,
        NATIVE,
        Transition::ReceiveJit {
            runner: RunnerRegistration {
                name: "runner-manager-y".into(),
                id: 74,
            },
        },
        at(1),
    );
    assert!(again.is_err());
    assert_eq!(j.runner().map(|r| r.id), Some(73));
}

#[test]
fn edges_refuse_missing_records() {
    let pending = AttemptJournal::default();
    // Persistent policy, ephemeral placement.
    let persistent = runner_manager_crds::attempt::AttemptKind {
        execution: ExecutionMode::Native,
        workspace: WorkspaceMode::Persistent,
    };
    let wrong = pending.apply(
        Actor::Agent,
        persistent,
        Transition::Admit {
            placement: WorkspacePlacement::ephemeral("/x"),
            spec_hash: "h".into(),
        },
        at(0),
    );
    assert!(matches!(wrong, Err(EdgeError::Precondition { .. })));
    assert!(
        WorkspacePlacement::slot(0, "/x").is_none(),
        "slots are 1-based"
    );
    let no_hash = pending.apply(
        Actor::Agent,
        NATIVE,
        Transition::Admit {
            placement: WorkspacePlacement::ephemeral("/x"),
            spec_hash: String::new(),
        },
        at(0),
    );
    assert!(no_hash.is_err());
    // OCI prepared without a pod identity; native started with a pod identity.
    let allocated_oci = journal_in(OCI, AttemptState::Preparing);
    assert!(agent_refused(
        &allocated_oci,
        OCI,
        Transition::MarkPrepared { environment: None }
    ));
    let jit = journal_in(NATIVE, AttemptState::JitReceived);
    assert!(agent_refused(
        &jit,
        NATIVE,
        Transition::Start {
            identity: StartedIdentity::Environment(env_identity())
        }
    ));
    // An OCI start must name the pod that was prepared.
    let mut other = env_identity();
    other.uid = "someone-else".into();
    let jit_oci = journal_in(OCI, AttemptState::JitReceived);
    assert!(agent_refused(
        &jit_oci,
        OCI,
        Transition::Start {
            identity: StartedIdentity::Environment(other)
        }
    ));
}

#[test]
fn conclusions_are_only_from_the_states_that_justify_them() {
    // CompletedJob only from Busy; ExitedIdleWithoutWork only from Idle.
    for from in reachable_states(NATIVE) {
        let j = journal_in(NATIVE, from);
        for (outcome, justified_by) in [
            (Outcome::CompletedJob, AttemptState::Busy),
            (Outcome::ExitedIdleWithoutWork, AttemptState::Idle),
        ] {
            let concluded = j.apply(Actor::Agent, NATIVE, Transition::Conclude(outcome), at(1));
            assert_eq!(
                concluded.is_ok(),
                from == justified_by,
                "{outcome:?} from {from:?}"
            );
        }
    }
    let busy = journal_in(NATIVE, AttemptState::Busy);
    let done = step(&busy, NATIVE, EdgeKind::CompleteJob, at(9));
    assert_eq!(done.outcome(), Some(Outcome::CompletedJob));
    assert_eq!(
        done.timestamps().concluded_at.as_ref().map(|t| t.0),
        Some(at(9))
    );
    let rejected = step(&AttemptJournal::default(), NATIVE, EdgeKind::Reject, at(2));
    assert_eq!(rejected.state(), AttemptState::Cleaned);
    assert!(rejected.workspace().is_none());
    assert_eq!(
        rejected.timestamps().cleaned_at.as_ref().map(|t| t.0),
        Some(at(2))
    );
}

#[test]
fn assignment_not_taken_restarts_the_idle_clock() {
    let busy = journal_in(NATIVE, AttemptState::Busy);
    let idle = step(&busy, NATIVE, EdgeKind::AssignmentNotTaken, at(100));
    assert_eq!(idle.state(), AttemptState::Idle);
    assert_eq!(
        idle.timestamps().last_state_change_at.as_ref().map(|t| t.0),
        Some(at(100))
    );
}

#[test]
fn a_persistent_slot_is_held_until_cleaned() {
    let kind = runner_manager_crds::attempt::AttemptKind {
        execution: ExecutionMode::Native,
        workspace: WorkspaceMode::Persistent,
    };
    let failed = journal_in(kind, AttemptState::Failed);
    assert!(failed.holds_slot_lease());
    assert!(
        !failed
            .state()
            .counts_against_capacity(ExecutionMode::Native)
    );
    let cleaned = step(&failed, kind, EdgeKind::Clean, at(3));
    assert!(!cleaned.holds_slot_lease());
    assert_eq!(failed.workspace().and_then(|w| w.slot_number()), Some(1));
}

#[test]
fn status_round_trips_and_keeps_its_two_owners_apart() {
    use runner_manager_crds::attempt::{
        AttemptFacts, GitHubFact, GitHubRunnerStatus, RunnerAttemptStatus,
    };
    let status = RunnerAttemptStatus {
        journal: journal_in(NATIVE, AttemptState::Idle),
        facts: AttemptFacts {
            github: Some(GitHubFact {
                status: GitHubRunnerStatus::Online,
                busy: false,
                generation: 2,
            }),
            job: None,
        },
    };
    let json = serde_json::to_value(&status).unwrap();
    assert_eq!(json["state"], "Idle");
    assert_eq!(json["github"]["status"], "online");
    assert_eq!(json["runner"]["id"], 73);
    let back: RunnerAttemptStatus = serde_json::from_value(json).unwrap();
    assert_eq!(back, status);
    // The journal serialized alone carries none of the operator's fields, and vice versa: each
    // writer's merge patch touches only its own half.
    let journal_only = serde_json::to_value(&status.journal).unwrap();
    assert!(journal_only.get("github").is_none());
    let facts_only = serde_json::to_value(&status.facts).unwrap();
    assert!(facts_only.get("state").is_none());
}

fn any_edge() -> impl Strategy<Value = EdgeKind> {
    proptest::sample::select(EdgeKind::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Random edge sequences, each taken by its own actor: whatever is accepted keeps every
    /// invariant, and once concluded the attempt only moves toward Cleaned.
    #[test]
    fn random_edge_sequences_never_reach_an_illegal_state(
        oci in any::<bool>(),
        persistent in any::<bool>(),
        edges in proptest::collection::vec(any_edge(), 0..40),
    ) {
        let kind = runner_manager_crds::attempt::AttemptKind {
            execution: if oci { ExecutionMode::Oci } else { ExecutionMode::Native },
            workspace: if persistent { WorkspaceMode::Persistent } else { WorkspaceMode::Ephemeral },
        };
        let mut j = AttemptJournal::default();
        let mut concluded = false;
        for (i, edge) in edges.into_iter().enumerate() {
            let before = j.state();
            match j.apply(edge.actor(), kind, transition_of(kind, edge), at(i as i64)) {
                Ok(next) => {
                    prop_assert!(next.check_invariants(kind).is_ok(), "{:?}", next.check_invariants(kind));
                    prop_assert_ne!(next.state(), before);
                    if concluded {
                        prop_assert!(next.state().is_terminal(), "{:?} -> {:?}", before, next.state());
                        prop_assert_eq!(next.outcome(), j.outcome(), "an outcome is never rewritten");
                    }
                    concluded |= next.state().is_terminal();
                    j = next;
                }
                Err(_) => {
                    // A refused edge changes nothing (apply takes &self).
                    prop_assert_eq!(j.state(), before);
                }
            }
        }
        if j.state() == AttemptState::Cleaned {
            prop_assert!(!j.holds_slot_lease());
            prop_assert!(!j.state().counts_against_capacity(kind.execution));
        }
    }
}

#[test]
fn failure_reasons_on_a_failed_journal_survive_the_wire() {
    let j = journal_in(NATIVE, AttemptState::Prepared);
    let failed = j
        .apply(
            Actor::Agent,
            NATIVE,
            Transition::Conclude(Outcome::Failed(FailureReason::JitRequestFailed)),
            at(1),
        )
        .unwrap();
    let json = serde_json::to_value(&failed).unwrap();
    assert_eq!(
        json["outcome"],
        serde_json::json!({"kind": "Failed", "reason": "JitRequestFailed"})
    );
}
