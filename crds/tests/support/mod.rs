//! Journals in every state, reached through the public edge functions only (so a test never
//! builds a journal the machine could not produce).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use runner_manager_crds::attempt::{
    AttemptJournal, AttemptKind, EnvironmentIdentity, Launcher, ProcessIdentity,
    RunnerRegistration, StartedIdentity, Transition, WorkspacePlacement,
};
use runner_manager_crds::outcome::{FailureReason, Outcome};
use runner_manager_crds::policy::{ExecutionMode, WorkspaceMode};
use runner_manager_crds::state::{AttemptState, EdgeKind};

pub const NATIVE: AttemptKind = AttemptKind {
    execution: ExecutionMode::Native,
    workspace: WorkspaceMode::Ephemeral,
};
pub const OCI: AttemptKind = AttemptKind {
    execution: ExecutionMode::Oci,
    workspace: WorkspaceMode::Ephemeral,
};

pub fn t0() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

pub fn at(secs: i64) -> Timestamp {
    t0() + SignedDuration::from_secs(secs)
}

pub fn env_identity() -> EnvironmentIdentity {
    EnvironmentIdentity {
        pod_name: "web-abc-runner".into(),
        uid: "pod-uid".into(),
        generation: "gen-1".into(),
    }
}

pub fn process_identity() -> ProcessIdentity {
    ProcessIdentity {
        launcher: Launcher::Direct,
        unit: None,
        pid: 4242,
        start_time: 99,
        cgroup: "/runner-manager.slice/rm-abc".into(),
    }
}

/// A transition of the given edge kind with a plausible payload.
pub fn transition_of(kind: AttemptKind, edge: EdgeKind) -> Transition {
    match edge {
        EdgeKind::Admit => Transition::Admit {
            placement: match kind.workspace {
                WorkspaceMode::Ephemeral => {
                    WorkspacePlacement::ephemeral("/var/lib/rm/runners/abc")
                }
                WorkspaceMode::Persistent => {
                    WorkspacePlacement::slot(1, "/slots/ns/uid/s1").unwrap()
                }
            },
            spec_hash: "hash".into(),
        },
        EdgeKind::Reject => Transition::Conclude(Outcome::Rejected(
            runner_manager_crds::outcome::RejectReason::NodeFull,
        )),
        EdgeKind::ExpireAdmission => Transition::Conclude(Outcome::Rejected(
            runner_manager_crds::outcome::RejectReason::AdmissionTimeout,
        )),
        EdgeKind::BeginPrepare => Transition::BeginPrepare,
        EdgeKind::MarkPrepared => Transition::MarkPrepared {
            environment: (kind.execution == ExecutionMode::Oci).then(env_identity),
        },
        EdgeKind::ReceiveJit => Transition::ReceiveJit {
            runner: RunnerRegistration {
                name: "runner-manager-x".into(),
                id: 73,
            },
        },
        EdgeKind::Start => Transition::Start {
            identity: match kind.execution {
                ExecutionMode::Native => StartedIdentity::Process(process_identity()),
                ExecutionMode::Oci => StartedIdentity::Environment(env_identity()),
            },
        },
        EdgeKind::RegisterIdle => Transition::RegisterIdle,
        EdgeKind::AssignJob => Transition::AssignJob,
        EdgeKind::AssignmentNotTaken => Transition::AssignmentNotTaken,
        EdgeKind::CompleteJob => Transition::Conclude(Outcome::CompletedJob),
        EdgeKind::ExitIdle => Transition::Conclude(Outcome::ExitedIdleWithoutWork),
        EdgeKind::Fail => Transition::Conclude(Outcome::Failed(FailureReason::ProcessStartFailed)),
        EdgeKind::Orphan => Transition::Conclude(Outcome::Orphaned(
            runner_manager_crds::outcome::OrphanReason::ProcessLost,
        )),
        EdgeKind::LoseNode => Transition::Conclude(Outcome::Orphaned(
            runner_manager_crds::outcome::OrphanReason::NodeLost,
        )),
        EdgeKind::BeginDestroy => Transition::BeginDestroy,
        EdgeKind::DeferCleanup => Transition::DeferCleanup,
        EdgeKind::Clean => Transition::Clean,
    }
}

pub fn step(
    j: &AttemptJournal,
    kind: AttemptKind,
    edge: EdgeKind,
    now: Timestamp,
) -> AttemptJournal {
    j.apply(edge.actor(), kind, transition_of(kind, edge), now)
        .unwrap_or_else(|e| panic!("{edge:?} from {:?}: {e}", j.state()))
}

/// A journal in `state`, walked there along the shortest legal path, each edge at `t0`.
/// Panics for a state the kind never reaches (native: Preparing, Destroying, CleanupDeferred);
/// see [`reachable`].
pub fn journal_in(kind: AttemptKind, state: AttemptState) -> AttemptJournal {
    assert!(
        reachable(kind, state),
        "{state:?} is not reachable for {kind:?}"
    );
    use AttemptState as S;
    use EdgeKind as E;
    let oci = kind.execution == ExecutionMode::Oci;
    let mut path = vec![];
    let up_to_prepared: Vec<EdgeKind> = if oci {
        vec![E::Admit, E::BeginPrepare, E::MarkPrepared]
    } else {
        vec![E::Admit, E::MarkPrepared]
    };
    match state {
        S::Pending => {}
        S::Allocated => path.push(E::Admit),
        S::Preparing => path.extend([E::Admit, E::BeginPrepare]),
        S::Prepared => path.extend(up_to_prepared),
        S::JitReceived => path.extend(up_to_prepared.into_iter().chain([E::ReceiveJit])),
        S::Starting => path.extend(up_to_prepared.into_iter().chain([E::ReceiveJit, E::Start])),
        S::Idle => path.extend(up_to_prepared.into_iter().chain([
            E::ReceiveJit,
            E::Start,
            E::RegisterIdle,
        ])),
        S::Busy => {
            path.extend(
                up_to_prepared
                    .into_iter()
                    .chain([E::ReceiveJit, E::Start, E::AssignJob]),
            )
        }
        S::Finished => path.extend(up_to_prepared.into_iter().chain([
            E::ReceiveJit,
            E::Start,
            E::AssignJob,
            E::CompleteJob,
        ])),
        S::Failed => path.extend(up_to_prepared.into_iter().chain([E::Fail])),
        S::Orphaned => {
            path.extend(
                up_to_prepared
                    .into_iter()
                    .chain([E::ReceiveJit, E::Start, E::Orphan]),
            )
        }
        S::Destroying => path.extend(up_to_prepared.into_iter().chain([E::Fail, E::BeginDestroy])),
        S::CleanupDeferred => path.extend(up_to_prepared.into_iter().chain([
            E::Fail,
            E::BeginDestroy,
            E::DeferCleanup,
        ])),
        S::Cleaned => {
            path.extend(up_to_prepared.into_iter().chain([E::Fail]));
            if oci {
                path.push(E::BeginDestroy);
            }
            path.push(E::Clean);
        }
    }
    let mut j = AttemptJournal::default();
    for e in path {
        j = step(&j, kind, e, t0());
    }
    assert_eq!(j.state(), state);
    j
}

/// Whether an attempt of `kind` can be in `state` at all.
pub fn reachable(kind: AttemptKind, state: AttemptState) -> bool {
    kind.execution == ExecutionMode::Oci
        || !matches!(
            state,
            AttemptState::Preparing | AttemptState::Destroying | AttemptState::CleanupDeferred
        )
}

/// Every state an attempt of `kind` can be in.
pub fn reachable_states(kind: AttemptKind) -> impl Iterator<Item = AttemptState> {
    AttemptState::ALL
        .into_iter()
        .filter(move |s| reachable(kind, *s))
}
