//! Test fixtures (feature `fixtures`, for the workspace's tests only; the shape of kube-rs
//! controller-rs's `fixtures.rs`): journals in every state, reached through the public edge
//! functions only (so a test never builds a journal the machine could not produce), and
//! [`AttemptBuilder`], the one way a test makes a `RunnerAttempt`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::attempt::{
    AttemptJournal, AttemptKind, EnvironmentIdentity, Launcher, ProcessIdentity, RunnerAttempt,
    RunnerAttemptStatus, RunnerRegistration, StartedIdentity, TargetScope, Transition,
    WorkspacePlacement,
};
use crate::outcome::{FailureReason, Outcome};
use crate::policy::{ExecutionMode, WorkspaceMode};
use crate::state::{AttemptState, EdgeKind};

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
        EdgeKind::Reject => {
            Transition::Conclude(Outcome::Rejected(crate::outcome::RejectReason::NodeFull))
        }
        EdgeKind::ExpireAdmission => Transition::Conclude(Outcome::Rejected(
            crate::outcome::RejectReason::AdmissionTimeout,
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
        EdgeKind::Orphan => {
            Transition::Conclude(Outcome::Orphaned(crate::outcome::OrphanReason::ProcessLost))
        }
        EdgeKind::LoseNode => {
            Transition::Conclude(Outcome::Orphaned(crate::outcome::OrphanReason::NodeLost))
        }
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

/// A `RunnerAttempt` as a test needs it: the defaults are a native, ephemeral attempt of policy
/// `policy` on node `n1`, no namespace, no status; each method changes one thing. A state is
/// reached through the journal's edges ([`journal_in`]), never written.
#[derive(Clone, Debug)]
pub struct AttemptBuilder {
    name: String,
    policy: String,
    namespace: Option<String>,
    node: String,
    kind: AttemptKind,
    state: Option<AttemptState>,
    scale_set: Option<String>,
    url: String,
    scope: &'static str,
    created: Option<Timestamp>,
    uid: Option<String>,
}

impl AttemptBuilder {
    pub fn new(name: &str, policy: &str) -> Self {
        Self {
            name: name.to_owned(),
            policy: policy.to_owned(),
            namespace: None,
            node: "n1".to_owned(),
            kind: NATIVE,
            state: None,
            scale_set: None,
            url: "https://github.com/a/b".to_owned(),
            scope: "Repository",
            created: None,
            uid: None,
        }
    }

    /// The policy's target (`url`, `Repository`, `Organization` or `Enterprise`).
    pub fn target(mut self, url: &str, scope: TargetScope) -> Self {
        url.clone_into(&mut self.url);
        self.scope = match scope {
            TargetScope::Repository => "Repository",
            TargetScope::Organization => "Organization",
            TargetScope::Enterprise => "Enterprise",
        };
        self
    }

    /// `metadata.creationTimestamp`.
    pub fn created(mut self, at: Timestamp) -> Self {
        self.created = Some(at);
        self
    }

    /// `metadata.uid`.
    pub fn uid(mut self, uid: &str) -> Self {
        self.uid = Some(uid.to_owned());
        self
    }

    pub fn namespace(mut self, ns: &str) -> Self {
        self.namespace = Some(ns.to_owned());
        self
    }

    pub fn node(mut self, node: &str) -> Self {
        node.clone_into(&mut self.node);
        self
    }

    pub fn execution(mut self, mode: ExecutionMode) -> Self {
        self.kind.execution = mode;
        self
    }

    pub fn workspace(mut self, mode: WorkspaceMode) -> Self {
        self.kind.workspace = mode;
        self
    }

    /// A journal in `state`, walked there by the edges (panics for a state the kind never
    /// reaches, see [`reachable`]).
    pub fn state(mut self, state: AttemptState) -> Self {
        self.state = Some(state);
        self
    }

    /// Minted through this scale set.
    pub fn scale_set(mut self, set: &str) -> Self {
        self.scale_set = Some(set.to_owned());
        self
    }

    pub fn build(self) -> RunnerAttempt {
        let mode = match self.kind.execution {
            ExecutionMode::Native => "Native",
            ExecutionMode::Oci => "Oci",
        };
        let workspace = match self.kind.workspace {
            WorkspaceMode::Ephemeral => "Ephemeral",
            WorkspaceMode::Persistent => "Persistent",
        };
        let mut snapshot = serde_json::json!({
            "policyUid": "u", "target": {"url": self.url, "scope": self.scope},
            "labels": ["x"], "runnerGroupId": 1, "workspace": workspace, "maxSlots": 1,
            "execution": {"mode": mode},
            "runner": {"version": "2.330.0", "url": "u", "sha256": "a".repeat(64)},
            "timeouts": {"registration": "60s", "idle": "120s", "jitHandoff": "120s"}
        });
        if self.kind.execution == ExecutionMode::Oci {
            snapshot["execution"]["image"] =
                serde_json::json!(format!("r/i@sha256:{}", "b".repeat(64)));
        }
        if let Some(set) = &self.scale_set {
            snapshot["scaleSet"] = serde_json::json!(set);
        }
        let mut a: RunnerAttempt = serde_json::from_value(serde_json::json!({
            "apiVersion": "runner-manager.dev/v1alpha1", "kind": "RunnerAttempt",
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid,
              "creationTimestamp": self.created.map(|t| t.to_string())},
            "spec": {"id": "01234567-89ab-4def-8123-456789abcdef", "policy": self.policy,
              "nodeName": self.node, "snapshot": snapshot}
        }))
        .expect("the fixture is a valid RunnerAttempt");
        if let Some(state) = self.state {
            a.status = Some(RunnerAttemptStatus {
                journal: journal_in(self.kind, state),
                facts: Default::default(),
            });
        }
        a
    }
}
