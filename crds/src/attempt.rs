//! `RunnerAttempt`: one attempt = one runner = at most one job. Its status is the journal.
//!
//! The status has two owners, and the types keep them apart: [`AttemptJournal`] (the `state` and
//! everything recorded with an edge) is written by the node agent (and by the broker and the
//! operator for their one edge each), always through [`AttemptJournal::apply`]; [`AttemptFacts`]
//! (what GitHub and webhooks say) is written by the operator only. Each writer patches its own
//! half, so neither can overwrite the other's fields.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::conditions::Condition;
use crate::policy::{ExecutionMode, ForkPullRequests, RunnerResources, WorkspaceMode};
use runner_manager_core::duration::ManifestDuration;
use runner_manager_core::outcome::Outcome;
pub use runner_manager_core::recovery::TerminationReason;
use runner_manager_core::state::{Actor, AttemptState, EdgeError, EdgeKind};
pub use runner_manager_core::target::TargetScope;

/// One runner's life, bound to one node, never reused.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "runner-manager.dev",
    version = "v1alpha1",
    kind = "RunnerAttempt",
    doc = "One runner's life on one node: created by the operator, driven by the node agent, never reused. Its status is the journal.",
    plural = "runnerattempts",
    shortname = "ra",
    category = "runner-manager",
    namespaced,
    status = "RunnerAttemptStatus",
    printcolumn = r#"{"name":"Policy","type":"string","jsonPath":".spec.policy"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.nodeName"}"#,
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Outcome","type":"string","jsonPath":".status.outcome.kind"}"#,
    printcolumn = r#"{"name":"Job","type":"integer","description":"The GitHub job id the runner was assigned.","jsonPath":".status.job.id"}"#,
    printcolumn = r#"{"name":"Runner","type":"string","priority":0,"jsonPath":".status.runner.name"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"description":"Why the attempt ended (the outcome's reason).","jsonPath":".status.outcome.reason"}"#,
    printcolumn = r#"{"name":"Repository","type":"string","priority":1,"description":"The repository of the job the runner took.","jsonPath":".status.job.repository"}"#,
    printcolumn = r#"{"name":"Quarantined","type":"string","priority":1,"description":"The Quarantined condition's reason, when the workspace is kept for a person.","jsonPath":".status.conditions[?(@.type==\"Quarantined\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct RunnerAttemptSpec {
    /// The attempt's uuid. The object is named `<policy>-<its first 12 hex>` and the GitHub
    /// runner `runner-manager-<uuid>`.
    #[schemars(pattern(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"))]
    pub id: String,
    /// The ScalePolicy (same namespace) this attempt serves.
    pub policy: String,
    /// The node the attempt is bound to at creation.
    pub node_name: String,
    /// Everything the agent needs, copied from the policy and resolved by the operator at
    /// creation. Immutable: the agent records its hash at `Allocated` and refuses a changed one.
    pub snapshot: AttemptSnapshot,
    /// The attempt this one replaces, when it replaces a failed launch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaces: Option<String>,
    /// The one mutable field: a termination request, set by the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination: Option<TerminationRequest>,
}

impl RunnerAttempt {
    /// Where the attempt is in its life: its journal's state (`Pending` before any journal).
    pub fn state(&self) -> AttemptState {
        self.status
            .as_ref()
            .map(|s| s.journal.state())
            .unwrap_or_default()
    }
}

impl RunnerAttemptSpec {
    /// The attempt uuid, if `id` holds one (the schema makes sure it does).
    pub fn attempt_uuid(&self) -> Option<uuid::Uuid> {
        uuid::Uuid::try_parse(&self.id).ok()
    }
}

/// The policy, resolved and frozen for one attempt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptSnapshot {
    /// The policy's uid: persistent slots live under it.
    pub policy_uid: String,
    /// The GitHub target.
    pub target: TargetSnapshot,
    /// The runner's labels, the policy's `labels` (the broker adds the cluster's ownership label).
    pub labels: Vec<String>,
    /// The resolved runner group id.
    pub runner_group_id: i64,
    /// Workspace mode.
    pub workspace: WorkspaceMode,
    /// The policy's fork rule in effect (`spec.workspace.forkPullRequests` or the mode's
    /// default); absent: `Allow` (an attempt made before the rule existed).
    #[serde(default, skip_serializing_if = "is_allow")]
    pub fork_pull_requests: ForkPullRequests,
    /// The policy's dependency caches (`spec.caches`), resolved; absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caches: Option<crate::caches::CacheSnapshot>,
    /// The policy's `spec.docker.enabled` (native runners): the runner gets its own engine.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub docker: bool,
    /// The policy's `maxRunners`: persistent slots are `s1..s<maxSlots>`.
    #[schemars(range(min = 1, max = 1000))]
    pub max_slots: u32,
    /// How the runner runs.
    pub execution: ExecutionSnapshot,
    /// The runner package, pinned by the operator.
    pub runner: RunnerPackage,
    /// The runner's environment (`NAME: value`) from the policy's `runner.env`, validated by the
    /// operator.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Timeouts of this attempt.
    pub timeouts: AttemptTimeouts,
    /// `ScaleSet` policies: the runner scale set (by name, in `runnerGroupId`) whose JIT
    /// endpoint the broker mints this runner with; absent for the REST JIT endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_set: Option<String>,
}

fn is_allow(rule: &ForkPullRequests) -> bool {
    *rule == ForkPullRequests::Allow
}

/// The GitHub target of an attempt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetSnapshot {
    /// The policy's GitHub URL.
    pub url: String,
    /// Repository, organization or enterprise.
    pub scope: TargetScope,
}

/// How one attempt runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionSnapshot {
    /// Native or Oci.
    pub mode: ExecutionMode,
    /// Oci: the image, pinned by digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Per-runner limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<RunnerResources>,
}

/// A runner package pinned by version, URL and sha256.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunnerPackage {
    /// The runner version, e.g. `2.330.0`.
    pub version: String,
    /// Where the operator resolved the package (GitHub's downloads listing or the admin mirror).
    pub url: String,
    /// The package's sha256, lower-case hex.
    #[schemars(pattern(r"^[0-9a-f]{64}$"))]
    pub sha256: String,
    /// The package's architecture (GitHub's word: `x64`, `arm64`, `arm`), the one of the node
    /// the attempt was placed on (its `kubernetes.io/arch` label). Absent on attempts made
    /// before runner-manager placed other architectures: `x64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<runner_manager_core::arch::Arch>,
}

/// The timeouts of one attempt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptTimeouts {
    /// From `jitReceivedAt` to listed online.
    pub registration: ManifestDuration,
    /// In `Idle` without a job.
    pub idle: ManifestDuration,
    /// In `Prepared` without a JIT.
    pub jit_handoff: ManifestDuration,
}

/// A termination request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TerminationRequest {
    /// Why.
    pub reason: TerminationReason,
    /// When the operator asked.
    pub requested_at: Time,
    /// Whether the operator deleted the GitHub registration first (an idle runner is always
    /// deregistered before it is stopped, so it cannot take a job while being stopped).
    #[serde(default)]
    pub deregistered: bool,
}

/// The status: the agent's journal and the operator's facts, side by side on the wire.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunnerAttemptStatus {
    #[serde(flatten)]
    pub journal: AttemptJournal,
    #[serde(flatten)]
    pub facts: AttemptFacts,
}

/// Written by the node agent only (and the broker / operator for their single edges), through
/// [`AttemptJournal::apply`]. Fields are read through accessors so that nobody sets a state
/// without the edge that justifies it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptJournal {
    /// Where the attempt is in its life.
    #[serde(default)]
    state: AttemptState,
    /// How it ended (from the conclusion on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    outcome: Option<Outcome>,
    /// Hash of the spec the agent admitted; a different spec is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    spec_hash: Option<String>,
    /// Where the runner's files live on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    workspace: Option<WorkspacePlacement>,
    /// The GitHub registration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    runner: Option<RunnerRegistration>,
    /// Native: the runner process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    process: Option<ProcessIdentity>,
    /// OCI: the runner pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    environment: Option<EnvironmentIdentity>,
    /// When each step happened.
    #[serde(default)]
    timestamps: AttemptTimestamps,
    /// How long each launch step took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<LaunchTimings>,
    /// `Quarantined` (the workspace refused a cleanup check and is kept for a person),
    /// `CleanupDeferred` (cleanup is retried with backoff), `SpecMismatch` (the spec changed
    /// after admission), `PackageRefused` (the runner package was refused), one of each type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition<AttemptConditionType, AttemptReason>>,
}

/// Written by the operator only: facts from GitHub and webhooks, patched only when they change.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptFacts {
    /// What GitHub's runner list says of this runner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub github: Option<GitHubFact>,
    /// The job the runner was assigned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobFact>,
}

/// What GitHub says of a runner.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitHubFact {
    /// `online`, `offline`, `absent` (not in GitHub's list) or `unreachable` (GitHub could not
    /// be asked).
    pub status: GitHubRunnerStatus,
    /// Whether GitHub lists the runner as running a job.
    #[serde(default)]
    pub busy: bool,
    /// Incremented each time the fact changes, so the agent can tell a new observation.
    #[serde(default)]
    pub generation: i64,
}

/// A runner as GitHub's list shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum GitHubRunnerStatus {
    Online,
    Offline,
    Absent,
    Unreachable,
}

/// A job assignment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobFact {
    /// GitHub's job id.
    pub id: i64,
    /// GitHub's workflow run id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<i64>,
    /// The job's repository, `OWNER/REPO`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    /// The workflow file and ref the job came from. Reserved: not written yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_ref: Option<String>,
}

/// Where an attempt's files live. Cleanup dispatches on this journalled kind, never on what a
/// directory looks like.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspacePlacement {
    /// `Ephemeral` (a runtime directory removed whole) or `Persistent` (a slot whose `_work` is
    /// kept).
    kind: WorkspaceMode,
    /// The persistent slot number (1-based), for `Persistent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    slot: Option<u32>,
    /// The runtime directory on the node.
    runtime_path: String,
}

impl WorkspacePlacement {
    pub fn ephemeral(runtime_path: impl Into<String>) -> Self {
        Self {
            kind: WorkspaceMode::Ephemeral,
            slot: None,
            runtime_path: runtime_path.into(),
        }
    }

    /// A persistent slot; `None` for slot 0 (slots are 1-based).
    pub fn slot(slot: u32, runtime_path: impl Into<String>) -> Option<Self> {
        (slot >= 1).then(|| Self {
            kind: WorkspaceMode::Persistent,
            slot: Some(slot),
            runtime_path: runtime_path.into(),
        })
    }

    pub fn kind(&self) -> WorkspaceMode {
        self.kind
    }

    pub fn slot_number(&self) -> Option<u32> {
        self.slot
    }

    pub fn runtime_path(&self) -> &str {
        &self.runtime_path
    }

    fn is_consistent(&self) -> bool {
        match self.kind {
            WorkspaceMode::Ephemeral => self.slot.is_none(),
            WorkspaceMode::Persistent => self.slot.is_some_and(|s| s >= 1),
        }
    }
}

/// A GitHub runner registration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunnerRegistration {
    /// `runner-manager-<attempt uuid>`.
    pub name: String,
    /// GitHub's runner id.
    pub id: i64,
}

/// How a native runner was launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Launcher {
    Systemd,
    Direct,
}

/// A native runner process: launcher + unit/cgroup + pid + start time. A recycled pid has a
/// different start time and is refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProcessIdentity {
    /// `systemd` (a transient unit on the host) or `direct` (a child in its own cgroup).
    pub launcher: Launcher,
    /// The transient systemd unit, `rm-<12 hex>.service` (systemd launcher only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// The runner's process id on the node.
    pub pid: u32,
    /// Start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_time: u64,
    /// The runner's cgroup v2 path, relative to the cgroup mount.
    pub cgroup: String,
}

/// An OCI runner pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentIdentity {
    /// The runner pod's name.
    pub pod_name: String,
    /// The runner pod's uid.
    pub uid: String,
    /// A fresh uuid per allocation, on the pod's labels: proves the pod is this allocation's.
    pub generation: String,
}

/// What was started: a process (native) or a pod (OCI).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartedIdentity {
    Process(ProcessIdentity),
    Environment(EnvironmentIdentity),
}

/// When each step happened.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptTimestamps {
    /// When the agent admitted the attempt and placed its workspace (`Allocated`; RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_at: Option<Time>,
    /// When the broker recorded the runner id and handed out the JIT (`JitReceived`); the
    /// registration timeout runs from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jit_received_at: Option<Time>,
    /// When the runner process or pod was started (`Starting`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When GitHub first listed the runner online (`Idle`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registered_at: Option<Time>,
    /// When the runner was first seen with a job (`Busy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_at: Option<Time>,
    /// When the attempt concluded (`Finished`, `Failed`, `Orphaned`, or `Rejected`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concluded_at: Option<Time>,
    /// When cleanup finished (`Cleaned`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleaned_at: Option<Time>,
    /// Every edge sets it; recovery timeouts measure from it, never from creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_state_change_at: Option<Time>,
}

/// How long each launch step took.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LaunchTimings {
    /// Milliseconds to put the runner package in place (download when not cached, then clone
    /// or copy).
    #[serde(default)]
    pub materialize_ms: u64,
    /// Milliseconds to prepare the runtime: its directory and runner account (and the pod, OCI).
    #[serde(default)]
    pub prepare_ms: u64,
    /// Milliseconds from asking the broker for the JIT to having it (GitHub's mint included).
    #[serde(default)]
    pub register_ms: u64,
    /// Milliseconds to start the runner process or pod.
    #[serde(default)]
    pub spawn_ms: u64,
    /// Whether this launch downloaded the package (false: it was cached on the node).
    #[serde(default)]
    pub package_downloaded: bool,
}

/// The condition types of an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum AttemptConditionType {
    /// The workspace refused a cleanup check and is kept for a person.
    Quarantined,
    /// Cleanup could not finish and is retried with backoff.
    CleanupDeferred,
    /// The spec no longer matches what the agent admitted.
    SpecMismatch,
    /// The agent refused the runner package archive (unsafe, or past an extraction cap); the
    /// message names the cap and the agent flag that raises it.
    PackageRefused,
}

/// Why an attempt condition is what it is (closed: classes, never names from a workflow).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum AttemptReason {
    SlotNotJournalled,
    PolicyRootMismatch,
    OutsideSlotsRoot,
    SlotMissing,
    UnexpectedEntries,
    SymlinkOrSpecialFile,
    /// The slot itself was replaced by a link or a file.
    SlotNotADirectory,
    /// The retained `_work` was replaced by a link or a file.
    RetainedWorkNotADirectory,
    /// The slot's entries could not be listed.
    EnumerationFailed,
    /// An entry could not be removed.
    DeletionFailed,
    VerificationFailed,
    ProviderResourceRemains,
    OwnershipUnproven,
    IoError,
    SpecHashMismatch,
    /// The package archive inflates past one of the agent's extraction caps.
    PackageCapExceeded,
    /// The package archive holds an unsafe entry (a climbing path, an escaping link, a device).
    PackageUnsafe,
    Resolved,
}

/// One edge with what it records.
#[derive(Clone, Debug, PartialEq)]
pub enum Transition {
    /// Pending → Allocated: the workspace placement and the admitted spec's hash.
    Admit {
        placement: WorkspacePlacement,
        spec_hash: String,
    },
    /// Allocated → Preparing (OCI).
    BeginPrepare,
    /// → Prepared; OCI records the pod identity it prepared.
    MarkPrepared {
        environment: Option<EnvironmentIdentity>,
    },
    /// Prepared (native: Allocated) → JitReceived: the runner id, durable before the JIT exists
    /// anywhere else.
    ReceiveJit { runner: RunnerRegistration },
    /// JitReceived → Starting: the process or pod identity.
    Start { identity: StartedIdentity },
    /// Starting → Idle.
    RegisterIdle,
    /// Starting | Idle → Busy.
    AssignJob,
    /// Busy → Idle: GitHub showed an assignment the runner's `_diag` shows it never took.
    AssignmentNotTaken,
    /// Any conclusion, including a rejection from `Pending`.
    Conclude(Outcome),
    /// (OCI) → Destroying.
    BeginDestroy,
    /// (OCI) Destroying → CleanupDeferred.
    DeferCleanup,
    /// → Cleaned.
    Clean,
}

impl Transition {
    pub fn kind(&self) -> EdgeKind {
        use runner_manager_core::outcome::{OrphanReason, RejectReason};
        match self {
            Self::Admit { .. } => EdgeKind::Admit,
            Self::BeginPrepare => EdgeKind::BeginPrepare,
            Self::MarkPrepared { .. } => EdgeKind::MarkPrepared,
            Self::ReceiveJit { .. } => EdgeKind::ReceiveJit,
            Self::Start { .. } => EdgeKind::Start,
            Self::RegisterIdle => EdgeKind::RegisterIdle,
            Self::AssignJob => EdgeKind::AssignJob,
            Self::AssignmentNotTaken => EdgeKind::AssignmentNotTaken,
            Self::Conclude(o) => match o {
                Outcome::CompletedJob => EdgeKind::CompleteJob,
                Outcome::ExitedIdleWithoutWork => EdgeKind::ExitIdle,
                Outcome::Failed(_) => EdgeKind::Fail,
                Outcome::Orphaned(OrphanReason::NodeLost) => EdgeKind::LoseNode,
                Outcome::Orphaned(_) => EdgeKind::Orphan,
                Outcome::Rejected(RejectReason::AdmissionTimeout) => EdgeKind::ExpireAdmission,
                Outcome::Rejected(_) => EdgeKind::Reject,
            },
            Self::BeginDestroy => EdgeKind::BeginDestroy,
            Self::DeferCleanup => EdgeKind::DeferCleanup,
            Self::Clean => EdgeKind::Clean,
        }
    }
}

/// What kind of attempt a journal belongs to (from its snapshot).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttemptKind {
    pub execution: ExecutionMode,
    pub workspace: WorkspaceMode,
}

impl AttemptSnapshot {
    pub fn kind(&self) -> AttemptKind {
        AttemptKind {
            execution: self.execution.mode,
            workspace: self.workspace,
        }
    }
}

fn time(t: Timestamp) -> Option<Time> {
    Some(Time(t))
}

impl AttemptJournal {
    pub fn state(&self) -> AttemptState {
        self.state
    }
    pub fn outcome(&self) -> Option<Outcome> {
        self.outcome
    }
    pub fn spec_hash(&self) -> Option<&str> {
        self.spec_hash.as_deref()
    }
    pub fn workspace(&self) -> Option<&WorkspacePlacement> {
        self.workspace.as_ref()
    }
    pub fn runner(&self) -> Option<&RunnerRegistration> {
        self.runner.as_ref()
    }
    pub fn process(&self) -> Option<&ProcessIdentity> {
        self.process.as_ref()
    }
    pub fn environment(&self) -> Option<&EnvironmentIdentity> {
        self.environment.as_ref()
    }
    pub fn timestamps(&self) -> &AttemptTimestamps {
        &self.timestamps
    }

    /// Whether a persistent slot is still leased: until `Cleaned`, even when concluded.
    pub fn holds_slot_lease(&self) -> bool {
        self.state != AttemptState::Cleaned
            && self
                .workspace
                .as_ref()
                .is_some_and(|w| w.kind == WorkspaceMode::Persistent)
    }

    /// Take one edge as `actor`, returning the next journal. Refuses an edge the table does not
    /// allow from the current state, taken by the wrong party, or missing what it must record.
    pub fn apply(
        &self,
        actor: Actor,
        kind: AttemptKind,
        transition: Transition,
        now: Timestamp,
    ) -> Result<Self, EdgeError> {
        let edge = transition.kind();
        if edge.actor() != actor {
            return Err(EdgeError::WrongActor {
                edge,
                by: actor,
                allowed: edge.actor(),
            });
        }
        let to = edge.target(self.state, kind.execution)?;
        let missing = |what| EdgeError::Precondition {
            edge,
            missing: what,
        };
        let mut next = self.clone();
        match transition {
            Transition::Admit {
                placement,
                spec_hash,
            } => {
                if !placement.is_consistent() || placement.kind != kind.workspace {
                    return Err(missing("a placement of the snapshot's workspace kind"));
                }
                if spec_hash.is_empty() {
                    return Err(missing("the admitted spec's hash"));
                }
                next.workspace = Some(placement);
                next.spec_hash = Some(spec_hash);
                next.timestamps.allocated_at = time(now);
            }
            Transition::BeginPrepare | Transition::AssignmentNotTaken => {}
            Transition::MarkPrepared { environment } => match (kind.execution, environment) {
                (ExecutionMode::Native, None) => {}
                (ExecutionMode::Oci, Some(env)) => next.environment = Some(env),
                (ExecutionMode::Native, Some(_)) => {
                    return Err(missing("no pod identity for a native attempt"));
                }
                (ExecutionMode::Oci, None) => return Err(missing("the prepared pod identity")),
            },
            Transition::ReceiveJit { runner } => {
                // A JIT is never minted twice for one attempt: a second one means the first was
                // lost, and the attempt concludes JitExpired instead.
                if self.runner.is_some() {
                    return Err(missing("no runner id yet (a JIT is never re-requested)"));
                }
                next.runner = Some(runner);
                next.timestamps.jit_received_at = time(now);
            }
            Transition::Start { identity } => {
                match (kind.execution, identity) {
                    (ExecutionMode::Native, StartedIdentity::Process(p)) => next.process = Some(p),
                    (ExecutionMode::Oci, StartedIdentity::Environment(e)) => {
                        if self.environment.as_ref() != Some(&e) {
                            return Err(missing("the same pod identity that was prepared"));
                        }
                    }
                    _ => return Err(missing("an identity of the attempt's execution mode")),
                }
                next.timestamps.started_at = time(now);
            }
            Transition::RegisterIdle => next.timestamps.registered_at = time(now),
            Transition::AssignJob => {
                if next.timestamps.registered_at.is_none() {
                    next.timestamps.registered_at = time(now);
                }
                next.timestamps.busy_at = time(now);
            }
            Transition::Conclude(outcome) => {
                next.outcome = Some(outcome);
                next.timestamps.concluded_at = time(now);
                if to == AttemptState::Cleaned {
                    next.timestamps.cleaned_at = time(now);
                }
            }
            Transition::BeginDestroy | Transition::DeferCleanup => {}
            Transition::Clean => next.timestamps.cleaned_at = time(now),
        }
        next.state = to;
        next.timestamps.last_state_change_at = time(now);
        Ok(next)
    }

    /// The rules every journal reachable through [`apply`](Self::apply) satisfies. Used by the
    /// property test, and by readers that want to refuse a hand-edited status.
    pub fn check_invariants(&self, kind: AttemptKind) -> Result<(), &'static str> {
        use AttemptState as S;
        let s = self.state;
        if s.is_terminal() != self.outcome.is_some() {
            return Err("an outcome is recorded exactly from the conclusion on");
        }
        if let Some(o) = self.outcome {
            let rejected = matches!(o, Outcome::Rejected(_));
            if rejected != (self.workspace.is_none() && s == S::Cleaned) {
                return Err("a rejection allocates nothing and is cleaned at once");
            }
        }
        if s != S::Pending
            && self.workspace.is_none()
            && !matches!(self.outcome, Some(Outcome::Rejected(_)))
        {
            return Err("every admitted attempt has a journalled workspace");
        }
        if let Some(w) = &self.workspace
            && (!w.is_consistent() || w.kind != kind.workspace)
        {
            return Err("the workspace placement matches the snapshot");
        }
        let past_jit = matches!(s, S::JitReceived | S::Starting | S::Idle | S::Busy);
        if past_jit && self.runner.is_none() {
            return Err("a runner id is journalled before the JIT leaves the broker");
        }
        let past_start = matches!(s, S::Starting | S::Idle | S::Busy);
        if past_start {
            let has_identity = match kind.execution {
                ExecutionMode::Native => self.process.is_some(),
                ExecutionMode::Oci => self.environment.is_some(),
            };
            if !has_identity {
                return Err("a started attempt has its process or pod identity journalled");
            }
        }
        if kind.execution == ExecutionMode::Native && self.environment.is_some() {
            return Err("a native attempt has no pod");
        }
        if kind.execution == ExecutionMode::Oci && self.process.is_some() {
            return Err("an OCI attempt has no host process");
        }
        if matches!(s, S::Preparing | S::Destroying | S::CleanupDeferred)
            && kind.execution == ExecutionMode::Native
        {
            return Err("only OCI attempts prepare and tear down pods");
        }
        Ok(())
    }
}

/// The canonical hash of what the agent acts on: the spec without the mutable `termination`.
/// Keys are sorted (serde_json's map is ordered), so field order on the wire does not matter.
pub fn spec_hash(spec: &RunnerAttemptSpec) -> String {
    let projection = serde_json::json!({
        "id": spec.id,
        "policy": spec.policy,
        "nodeName": spec.node_name,
        "snapshot": spec.snapshot,
        "replaces": spec.replaces,
    });
    let mut h = Sha256::new();
    h.update(projection.to_string().as_bytes());
    hex::encode(h.finalize())
}
