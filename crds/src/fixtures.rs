//! Test fixtures (feature `fixtures`, for the workspace's tests only; the shape of kube-rs
//! controller-rs's `fixtures.rs`): journals in every state, reached through the public edge
//! functions only (so a test never builds a journal the machine could not produce), and
//! [`AttemptBuilder`], the one way a test makes a `RunnerAttempt`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::attempt::{
    AttemptFacts, AttemptJournal, AttemptKind, EnvironmentIdentity, JobFact, Launcher,
    ProcessIdentity, RunnerAttempt, RunnerAttemptStatus, RunnerRegistration, StartedIdentity,
    TargetScope, Transition, WorkspacePlacement,
};
use crate::policy::{ExecutionMode, WorkspaceMode};
use runner_manager_core::outcome::{FailureReason, Outcome};
use runner_manager_core::state::{AttemptState, EdgeKind};

pub const NATIVE: AttemptKind = AttemptKind {
    execution: ExecutionMode::Native,
    workspace: WorkspaceMode::Ephemeral,
};
pub const OCI: AttemptKind = AttemptKind {
    execution: ExecutionMode::Oci,
    workspace: WorkspaceMode::Ephemeral,
};

/// Where an ephemeral attempt's admission places its runtime (`workspace.runtimePath`).
pub const RUNTIME_PATH: &str = "/var/lib/rm/runners/abc";

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
    transition_in_slot(kind, edge, 1)
}

/// [`transition_of`], a persistent attempt's admission placing it in slot `slot`.
pub fn transition_in_slot(kind: AttemptKind, edge: EdgeKind, slot: u32) -> Transition {
    match edge {
        EdgeKind::Admit => Transition::Admit {
            placement: match kind.workspace {
                WorkspaceMode::Ephemeral => WorkspacePlacement::ephemeral(RUNTIME_PATH),
                WorkspaceMode::Persistent => {
                    WorkspacePlacement::slot(slot, format!("/slots/ns/uid/s{slot}")).unwrap()
                }
            },
            spec_hash: "hash".into(),
        },
        EdgeKind::Reject => Transition::Conclude(Outcome::Rejected(
            runner_manager_core::outcome::RejectReason::NodeFull,
        )),
        EdgeKind::ExpireAdmission => Transition::Conclude(Outcome::Rejected(
            runner_manager_core::outcome::RejectReason::AdmissionTimeout,
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
            runner_manager_core::outcome::OrphanReason::ProcessLost,
        )),
        EdgeKind::LoseNode => Transition::Conclude(Outcome::Orphaned(
            runner_manager_core::outcome::OrphanReason::NodeLost,
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
    step_in_slot(j, kind, edge, now, 1)
}

fn step_in_slot(
    j: &AttemptJournal,
    kind: AttemptKind,
    edge: EdgeKind,
    now: Timestamp,
    slot: u32,
) -> AttemptJournal {
    step_with(j, kind, edge, transition_in_slot(kind, edge, slot), now)
}

fn step_with(
    j: &AttemptJournal,
    kind: AttemptKind,
    edge: EdgeKind,
    transition: Transition,
    now: Timestamp,
) -> AttemptJournal {
    j.apply(edge.actor(), kind, transition, now)
        .unwrap_or_else(|e| panic!("{edge:?} from {:?}: {e}", j.state()))
}

/// A journal in `state`, walked there along the shortest legal path, each edge at `t0`.
/// Panics for a state the kind never reaches (native: Preparing, Destroying, CleanupDeferred);
/// see [`reachable`].
pub fn journal_in(kind: AttemptKind, state: AttemptState) -> AttemptJournal {
    journal_in_slot(kind, state, 1)
}

/// [`journal_in`], a persistent attempt in slot `slot`.
pub fn journal_in_slot(kind: AttemptKind, state: AttemptState, slot: u32) -> AttemptJournal {
    journal_along(kind, state, t0(), |edge| {
        transition_in_slot(kind, edge, slot)
    })
}

/// A journal in `state` along the shortest legal path, each edge at `at` carrying the payload
/// `transition` gives it.
fn journal_along(
    kind: AttemptKind,
    state: AttemptState,
    at: Timestamp,
    transition: impl Fn(EdgeKind) -> Transition,
) -> AttemptJournal {
    assert!(
        reachable(kind, state),
        "{state:?} is not reachable for {kind:?}"
    );
    use AttemptState as S;
    use EdgeKind as E;
    let oci = kind.execution == ExecutionMode::Oci;
    let mut path = vec![];
    // The path a launch takes to its JIT: the agent journals a native preparation nowhere (the
    // broker takes `Allocated → JitReceived`); a native `Prepared` is an older agent's.
    let up_to_jit: Vec<EdgeKind> = if oci {
        vec![E::Admit, E::BeginPrepare, E::MarkPrepared, E::ReceiveJit]
    } else {
        vec![E::Admit, E::ReceiveJit]
    };
    let up_to_prepared: Vec<EdgeKind> = if oci {
        vec![E::Admit, E::BeginPrepare, E::MarkPrepared]
    } else {
        vec![E::Admit, E::MarkPrepared]
    };
    match state {
        S::Pending => {}
        S::Allocated => path.push(E::Admit),
        S::Preparing => path.extend([E::Admit, E::BeginPrepare]),
        S::Prepared => path.extend(up_to_prepared.clone()),
        S::JitReceived => path.extend(up_to_jit),
        S::Starting => path.extend(up_to_jit.into_iter().chain([E::Start])),
        S::Idle => path.extend(up_to_jit.into_iter().chain([E::Start, E::RegisterIdle])),
        S::Busy => path.extend(up_to_jit.into_iter().chain([E::Start, E::AssignJob])),
        S::Finished => {
            path.extend(
                up_to_jit
                    .into_iter()
                    .chain([E::Start, E::AssignJob, E::CompleteJob]),
            )
        }
        S::Failed => path.extend(up_to_prepared.into_iter().chain([E::Fail])),
        S::Orphaned => path.extend(up_to_jit.into_iter().chain([E::Start, E::Orphan])),
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
        j = step_with(&j, kind, e, transition(e), at);
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
    resource_version: Option<String>,
    policy_uid: String,
    slot: u32,
    max_slots: u32,
    resources: serde_json::Map<String, serde_json::Value>,
    edges_at: Option<Timestamp>,
    job: Option<i64>,
    registration: Option<RunnerRegistration>,
    conclusion: Option<(Outcome, AttemptState)>,
    annotations: std::collections::BTreeMap<String, String>,
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
            resource_version: None,
            policy_uid: "u".to_owned(),
            slot: 1,
            max_slots: 1,
            resources: serde_json::Map::new(),
            edges_at: None,
            job: None,
            registration: None,
            conclusion: None,
            annotations: std::collections::BTreeMap::new(),
        }
    }

    /// Concluded with `outcome` from the live state `from` (`Pending` for a rejection) rather
    /// than the journal's default conclusion: what a test of the outcome, or of whether the
    /// runner ever registered (from `Idle` or `Busy`), needs. The state is the conclusion's, or
    /// [`state`](Self::state)'s when that is `Cleaned` (the cleanup follows the conclusion).
    pub fn concluded(mut self, outcome: Outcome, from: AttemptState) -> Self {
        self.conclusion = Some((outcome, from));
        self
    }

    /// A `metadata.annotations` entry.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.to_owned(), value.to_owned());
        self
    }

    /// The GitHub registration the journal's JIT edge records (`status.runner`): whatever the
    /// broker was told, the agent may journal any name and id, so a test can give another
    /// runner's.
    pub fn registration(mut self, name: &str, id: i64) -> Self {
        self.registration = Some(RunnerRegistration {
            name: name.to_owned(),
            id,
        });
        self
    }

    /// Every edge of the journal at `at` ([`t0`] unless set): its timestamps (`busyAt`,
    /// `concludedAt`…) are `at`.
    pub fn edges_at(mut self, at: Timestamp) -> Self {
        self.edges_at = Some(at);
        self
    }

    /// The operator's fact that the runner took job `id` (of run 1 in `acme/web`).
    pub fn job(mut self, id: i64) -> Self {
        self.job = Some(id);
        self
    }

    /// `metadata.resourceVersion`.
    pub fn resource_version(mut self, v: &str) -> Self {
        self.resource_version = Some(v.to_owned());
        self
    }

    /// The policy's uid in the snapshot (persistent slots live under it).
    pub fn policy_uid(mut self, uid: &str) -> Self {
        uid.clone_into(&mut self.policy_uid);
        self
    }

    /// A persistent attempt in slot `slot` of `max_slots`.
    pub fn slot(mut self, slot: u32, max_slots: u32) -> Self {
        self.kind.workspace = WorkspaceMode::Persistent;
        self.slot = slot;
        self.max_slots = max_slots;
        self
    }

    /// The runner's limits (`execution.resources`: Kubernetes quantities).
    pub fn resources(mut self, cpu: Option<&str>, memory: Option<&str>) -> Self {
        for (k, v) in [("cpu", cpu), ("memory", memory)] {
            if let Some(v) = v {
                self.resources.insert(k.to_owned(), serde_json::json!(v));
            }
        }
        self
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
            "policyUid": self.policy_uid, "target": {"url": self.url, "scope": self.scope},
            "labels": ["x"], "runnerGroupId": 1, "workspace": workspace, "maxSlots": self.max_slots,
            "execution": {"mode": mode,
                "resources": (!self.resources.is_empty()).then_some(&self.resources)},
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
              "annotations": (!self.annotations.is_empty()).then_some(&self.annotations),
              "resourceVersion": self.resource_version,
              "creationTimestamp": self.created.map(|t| t.to_string())},
            "spec": {"id": "01234567-89ab-4def-8123-456789abcdef", "policy": self.policy,
              "nodeName": self.node, "snapshot": snapshot}
        }))
        .expect("the fixture is a valid RunnerAttempt");
        if self.state.is_some() || self.job.is_some() || self.conclusion.is_some() {
            let state = self.state.unwrap_or_default();
            let at = self.edges_at.unwrap_or_else(t0);
            let facts = AttemptFacts {
                job: self.job.map(|id| JobFact {
                    id,
                    run_id: Some(1),
                    repository: Some("acme/web".to_owned()),
                    workflow_ref: None,
                }),
                ..AttemptFacts::default()
            };
            let payload = |edge| match (edge, &self.registration) {
                (EdgeKind::ReceiveJit, Some(runner)) => Transition::ReceiveJit {
                    runner: runner.clone(),
                },
                _ => transition_in_slot(self.kind, edge, self.slot),
            };
            let journal = match self.conclusion {
                None => journal_along(self.kind, state, at, payload),
                Some((outcome, from)) => {
                    let live = journal_along(self.kind, from, at, payload);
                    let conclude = Transition::Conclude(outcome);
                    let mut j = step_with(&live, self.kind, conclude.kind(), conclude, at);
                    if self.state == Some(AttemptState::Cleaned) {
                        let cleanup: &[EdgeKind] = match (j.state(), self.kind.execution) {
                            (AttemptState::Cleaned, _) => &[],
                            (_, ExecutionMode::Oci) => &[EdgeKind::BeginDestroy, EdgeKind::Clean],
                            (_, ExecutionMode::Native) => &[EdgeKind::Clean],
                        };
                        for e in cleanup {
                            j = step_with(&j, self.kind, *e, payload(*e), at);
                        }
                    }
                    assert!(
                        self.state.is_none_or(|s| s == j.state()),
                        "{outcome:?} from {from:?} never reaches {:?}",
                        self.state
                    );
                    j
                }
            };
            a.status = Some(RunnerAttemptStatus { journal, facts });
        }
        a
    }
}
