//! `ScalePolicy`: what a team asks for — runners for one GitHub target, with labels, bounds,
//! nodes, workspace and execution modes. Tenants never name host paths or download URLs: slots
//! are derived by the agent and packages are resolved by the operator.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::conditions::Condition;
use runner_manager_core::duration::ManifestDuration;
pub use runner_manager_core::state::ExecutionMode;

/// A repository, organization or enterprise URL on github.com or a GitHub Enterprise Server host.
/// No user-info part (`user:token@`): credentials belong in the Secret.
pub const GITHUB_URL_PATTERN: &str = r"^https://[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?/(enterprises/[A-Za-z0-9_.-]+|[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)?)/?$";
/// A runner label as GitHub accepts it: no spaces, no commas.
pub const LABEL_PATTERN: &str = r"^[A-Za-z0-9][A-Za-z0-9._:/+-]*$";
/// `latest` or `MAJOR.MINOR.PATCH`.
pub const RUNNER_VERSION_PATTERN: &str = r"^(latest|[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4})$";
/// Upper bound of `maxRunners`: a sanity ceiling, and the highest persistent slot number.
pub const MAX_RUNNERS_CEILING: u32 = 1000;
/// How many pending jobs a policy's status remembers (oldest dropped first).
pub const PENDING_JOBS_BOUND: usize = 1000;

/// Runners for one GitHub target: how many, with which labels, on which nodes, and how they run.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "runner-manager.dev",
    version = "v1alpha1",
    kind = "ScalePolicy",
    doc = "Runners for one GitHub target: labels, bounds, nodes, workspace and execution. `kubectl explain scalepolicy.spec` documents every field.",
    plural = "scalepolicies",
    shortname = "sp",
    category = "runner-manager",
    namespaced,
    status = "ScalePolicyStatus",
    printcolumn = r#"{"name":"Target","type":"string","jsonPath":".spec.github.url"}"#,
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".status.desired"}"#,
    printcolumn = r#"{"name":"Idle","type":"integer","jsonPath":".status.idle"}"#,
    printcolumn = r#"{"name":"Busy","type":"integer","jsonPath":".status.busy"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Health","type":"string","description":"The Degraded condition's reason: Healthy, or LaunchesFailing while replacements are paused.","jsonPath":".status.conditions[?(@.type==\"Degraded\")].reason"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"description":"Why the policy is (not) Ready: a closed reason naming what to fix.","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Starting","type":"integer","priority":1,"jsonPath":".status.starting"}"#,
    printcolumn = r#"{"name":"Quarantined","type":"integer","priority":1,"jsonPath":".status.quarantined"}"#,
    printcolumn = r#"{"name":"Version","type":"string","priority":1,"description":"The runner version runner.version resolved to.","jsonPath":".status.runnerVersion"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ScalePolicySpec {
    /// The GitHub target and how to authenticate to it.
    pub github: GitHubSpec,
    /// The runners' labels, which jobs' `runs-on` are matched against: a job goes to the policy
    /// whose labels cover its `runs-on` with the fewest extra labels. 1 to 99 (GitHub allows
    /// 100; the cluster's ownership label takes one); no spaces or commas.
    #[schemars(
        length(min = 1, max = 99),
        inner(pattern(LABEL_PATTERN), length(min = 1, max = 100))
    )]
    pub labels: Vec<String>,
    /// Idle runners kept registered on top of the work, so a new job starts without waiting for
    /// a launch. At most `maxRunners`.
    #[serde(default)]
    #[schemars(range(min = 0, max = 1000))]
    pub min_idle: u32,
    /// The most runners of this policy alive at once, across the cluster.
    #[schemars(range(min = 1, max = 1000))]
    pub max_runners: u32,
    /// Pause the policy (as a CronJob's `suspend`): nothing is launched, idle runners are
    /// drained (deregistered, then stopped), busy runners finish their job, and demand is still
    /// observed (`status.pendingJobs`, the metrics; `status.desired` is 0). A `ScaleSet`
    /// policy acquires no job from its scale set while suspended. `false`, the default, runs it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
    /// Node labels (`key: value`) a node must carry to host this policy's runners; every node
    /// with a node agent when empty. Keys must have the `node-restriction.kubernetes.io/`
    /// prefix, which a kubelet cannot set on its own Node (the NodeRestriction admission plugin):
    /// a compromised node cannot label itself into another team's pool.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Where a runner's `_work` lives.
    #[serde(default)]
    pub workspace: WorkspaceSpec,
    /// Dependency caches kept on each node and shared by the runners (npm, pip, go, the tool
    /// cache, …; `docs/operations.md`, "Dependency caches"): absent, the default, keeps none.
    /// Native runners only. Every job reads the cache; only a job of the repository itself, with
    /// an event and branch `writeBack` trusts, has its writes kept for the next one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caches: Option<crate::caches::CacheSpec>,
    /// Docker for the policy's jobs, experimental (`docs/operations.md`, "Docker for jobs"): each runner gets
    /// an engine of its own on the node (rootless Podman, as the runner's account) behind a
    /// socket that is its `DOCKER_HOST`, and everything the job built, pulled, started or
    /// created there is removed with it when the runner ends. Native runners only.
    #[serde(default, skip_serializing_if = "DockerSpec::is_off")]
    pub docker: DockerSpec,
    /// How a runner runs: a host process or an OCI pod.
    #[serde(default)]
    pub execution: ExecutionSpec,
    /// Which runner version, and the runners' environment.
    #[serde(default)]
    pub runner: RunnerSpec,
    /// How long a runner may take to register, and stay idle.
    #[serde(default)]
    pub timeouts: PolicyTimeouts,
    /// How demand is learnt.
    #[serde(default)]
    pub scaling: ScalingSpec,
    /// This policy's own `workflow_job` webhook: deliveries signed with its secret and sent to
    /// `/webhook/<namespace>/<name>` may change only the policies of this namespace that name
    /// the same Secret. Without it the policy takes deliveries on `/webhook`, signed with the
    /// cluster-wide secret that every team using that path shares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookSpec>,
}

/// `spec.docker`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DockerSpec {
    /// Give each runner its own Docker engine. `false`, the default: a job has no Docker.
    #[serde(default)]
    pub enabled: bool,
}

impl DockerSpec {
    fn is_off(&self) -> bool {
        !self.enabled
    }
}

/// A policy's own webhook.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookSpec {
    /// The Secret in this namespace whose key `secret` holds the hook's HMAC secret, as set on
    /// GitHub for the hook that posts to `/webhook/<namespace>/<name>`.
    pub secret_ref: SecretRef,
}

/// The GitHub target and its credentials.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitHubSpec {
    /// `https://github.com/OWNER/REPO` (repository), `https://github.com/ORG` (organization) or
    /// `https://github.com/enterprises/ENTERPRISE` (enterprise); a GitHub Enterprise Server host
    /// in place of github.com works the same way. Never with credentials in it.
    #[schemars(pattern(GITHUB_URL_PATTERN), length(max = 512))]
    pub url: String,
    /// The Secret in this namespace with the credentials: a GitHub App (`appId`, `privateKey`,
    /// optionally `installationId`) or a token (`token`).
    pub credentials_secret_ref: SecretRef,
    /// The runner group: a name (resolved to its id) or an id. Default `Default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_group: Option<IntOrString>,
    /// How this policy learns of its jobs: `Webhook` (default: `workflow_job` deliveries and
    /// polling, as `spec.scaling` says) or `ScaleSet` (the operator registers a runner scale set
    /// with this policy's labels and runner group and long-polls its message queue: outbound
    /// HTTPS only, no webhook endpoint; deliveries and polling are not used for it).
    #[serde(default, skip_serializing_if = "DemandMode::is_webhook")]
    pub demand: DemandMode,
}

/// How a policy learns of its jobs (docs/demand-modes.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum DemandMode {
    /// `workflow_job` webhooks and polling (`spec.scaling`).
    #[default]
    Webhook,
    /// GitHub's runner scale-set message queue, long-polled by the leader.
    ScaleSet,
}

impl DemandMode {
    pub fn is_webhook(&self) -> bool {
        *self == Self::Webhook
    }
}

/// The name of a policy's runner scale set: `<namespace>-<name>`, unique in the cluster (GitHub
/// allows 1 to 128 characters; a longer one is cut and suffixed with a hash of the whole).
pub fn scale_set_name(namespace: &str, name: &str) -> String {
    let whole = format!("{namespace}-{name}");
    if whole.len() <= 128 {
        return whole;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in whole.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{}-{h:016x}", &whole[..111])
}

/// A Secret in the policy's namespace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SecretRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A ConfigMap in the policy's namespace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ConfigMapRef {
    /// The ConfigMap's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Where `_work` lives.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceSpec {
    /// `Ephemeral` (a fresh directory per runner, removed after) or `Persistent` (a slot per
    /// concurrent runner whose `_work` is kept warm between jobs; repository targets only).
    #[serde(default)]
    pub mode: WorkspaceMode,
    /// Whether a job of a fork's pull request may run on this policy's runners: `Refuse` (the
    /// default for `Persistent`: a fork's job could leave a poisoned `_work` for the next
    /// main-branch job) or `Allow` (the default for `Ephemeral`). Checked when the job starts,
    /// before any of its steps, from GitHub's record of the run (never from the job); a refused
    /// job fails with the reason in its log and leaves the slot as it was. Native runners only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork_pull_requests: Option<ForkPullRequests>,
}

impl WorkspaceSpec {
    /// The rule in effect: the field, else the mode's default.
    pub fn fork_rule(&self) -> ForkPullRequests {
        self.fork_pull_requests.unwrap_or(match self.mode {
            WorkspaceMode::Persistent => ForkPullRequests::Refuse,
            WorkspaceMode::Ephemeral => ForkPullRequests::Allow,
        })
    }
}

/// Whether a job of a fork's pull request may run on this policy's runners: `Refuse` (the default
/// for a `Persistent` workspace) fails such a job at its start, before any step, from GitHub's
/// record of the run; `Allow` (the default for `Ephemeral`) runs any job the labels match.
/// Native runners only: an `Oci` policy must say `Allow`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ForkPullRequests {
    /// Any job the runner's labels match.
    #[default]
    Allow,
    /// A job whose run's head repository is not the policy's repository fails at its start.
    Refuse,
}

/// A workspace mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum WorkspaceMode {
    /// A fresh directory per runner, removed whole after its job.
    #[default]
    Ephemeral,
    /// A slot per concurrent runner (`s1..s<maxRunners>` on each node) whose `_work` is kept.
    Persistent,
}

/// How a runner runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionSpec {
    /// `Native` (a host process in its own cgroup) or `Oci` (a pod on the node).
    #[serde(default)]
    pub mode: ExecutionMode,
    /// `Oci` only: the runner image, pinned by digest (`name@sha256:<64 hex>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,
    /// Per runner: cgroup limits (native) or pod resources (OCI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<RunnerResources>,
}

/// Per-runner limits.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunnerResources {
    /// CPU limit, e.g. `4` or `1500m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
    /// Memory limit, e.g. `8Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
}

/// Which runner, and its environment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunnerSpec {
    /// `latest` or a version such as `2.330.0`. The operator resolves version, download URL and
    /// sha256 from GitHub's runner downloads (or the admin's mirror) and pins them per attempt.
    #[serde(default = "latest")]
    #[schemars(pattern(RUNNER_VERSION_PATTERN))]
    pub version: String,
    /// A ConfigMap whose `runner.env` key holds `NAME=value` lines for the runners' environment.
    /// The operator validates it and copies it into each attempt, so agents never read team
    /// namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_from: Option<EnvFrom>,
}

fn latest() -> String {
    "latest".to_owned()
}

impl Default for RunnerSpec {
    fn default() -> Self {
        Self {
            version: latest(),
            env_from: None,
        }
    }
}

/// Where the runners' environment comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvFrom {
    /// The ConfigMap holding `runner.env`.
    pub config_map_ref: ConfigMapRef,
}

/// Timeouts of a runner's life.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyTimeouts {
    /// How long a runner may take from receiving its JIT to being listed online. Default `5m`.
    #[serde(default = "default_registration")]
    pub registration: ManifestDuration,
    /// How long a registered runner may wait for a job before it is stopped (deregistered
    /// first). Default `10m`.
    #[serde(default = "default_idle")]
    pub idle: ManifestDuration,
}

fn default_registration() -> ManifestDuration {
    ManifestDuration::from_secs(300)
}

fn default_idle() -> ManifestDuration {
    ManifestDuration::from_secs(600)
}

impl Default for PolicyTimeouts {
    fn default() -> Self {
        Self {
            registration: default_registration(),
            idle: default_idle(),
        }
    }
}

/// How demand is learnt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalingSpec {
    /// Take demand from `workflow_job` webhooks. Default `true`.
    #[serde(default = "yes")]
    pub webhook: bool,
    /// How often queued jobs are polled to repair missed deliveries (every target scope).
    /// Default `60s`.
    #[serde(default = "default_poll")]
    pub poll_interval: ManifestDuration,
}

fn yes() -> bool {
    true
}

fn default_poll() -> ManifestDuration {
    ManifestDuration::from_secs(60)
}

impl Default for ScalingSpec {
    fn default() -> Self {
        Self {
            webhook: true,
            poll_interval: default_poll(),
        }
    }
}

/// What the operator last saw and decided for a policy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalePolicyStatus {
    /// The `metadata.generation` the status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (the policy is valid and resolves; only a Ready policy takes jobs), `Scaling` (the
    /// runner count is changing), `Degraded` (launches keep failing and replacement is paused)
    /// and `Conflict` (another namespace names the same target), one of each type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition<PolicyConditionType, PolicyReason>>,
    /// Runners wanted now: `min(maxRunners, busy + pendingJobs + minIdle)`.
    #[serde(default)]
    pub desired: u32,
    /// Attempts on their way up (not yet listed online).
    #[serde(default)]
    pub starting: u32,
    /// Runners online without a job.
    #[serde(default)]
    pub idle: u32,
    /// Runners running a job.
    #[serde(default)]
    pub busy: u32,
    /// Attempts concluded and not yet cleaned.
    #[serde(default)]
    pub cleaning: u32,
    /// Attempts whose workspace is quarantined for a person.
    #[serde(default)]
    pub quarantined: u32,
    /// The runner group id `runnerGroup` resolved to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_group_id: Option<i64>,
    /// The runner version `runner.version` resolved to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_version: Option<String>,
    /// When the desired count last changed (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,
    /// Jobs queued for this policy and not yet taken: GitHub job id → when it was queued
    /// (RFC 3339, UTC). Written by every webhook receiver and by polling, so demand survives
    /// operator restarts and failover. At most 1,000, the oldest dropped first.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "pending_jobs_schema")]
    pub pending_jobs: BTreeMap<String, Time>,
}

/// `pendingJobs`' schema: an object of timestamps, described without k8s `Time`'s Go text.
fn pending_jobs_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": {
            "type": "string",
            "format": "date-time",
            "description": "When GitHub queued the job (RFC 3339, UTC)."
        }
    })
}

/// The condition types of a policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum PolicyConditionType {
    /// The policy is valid and its target, credentials and runner group resolve.
    Ready,
    /// The policy is changing its runner count.
    Scaling,
    /// Launches keep failing; replacement is paused until the spec changes.
    Degraded,
    /// A policy of another namespace names the same GitHub target (host and target). Jobs still
    /// go only to Ready policies whose credentials were proven on that target.
    Conflict,
}

/// Why a policy condition is what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum PolicyReason {
    Valid,
    InvalidSpec,
    SecretNotFound,
    SecretKeyMissing,
    CredentialsRejected,
    RunnerGroupNotFound,
    RunnerVersionUnresolvable,
    ImageUnresolvable,
    RunnerEnvInvalid,
    GitHubUnreachable,
    NoEligibleNode,
    ScalingUp,
    ScalingDown,
    Steady,
    AtMaxRunners,
    LaunchesFailing,
    Healthy,
    /// The target's GitHub owner is bound to other namespaces by the operator's
    /// `--owner-namespaces` setting.
    OwnerBoundElsewhere,
    /// Another namespace's policy names the same target.
    TargetClaimedElsewhere,
    /// No other namespace names this target.
    NoConflict,
    /// The policy's GitHub host is not on the operator's `--github-hosts`, or the runner package
    /// it resolves to is on a host (or scheme) the admin did not allow.
    HostNotAllowed,
    /// `spec.suspend` is true: nothing is launched; idle runners are drained.
    Suspended,
}
