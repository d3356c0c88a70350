//! The pods of runner-manager (issue 16, issue 28): OCI runner pods and the placeholder pods that
//! make a native runner visible to the scheduler, built here and only here. The **operator**
//! creates and deletes them, from the attempt (and, for a runner pod, the few node-local
//! inputs the agent orders it with: [`RunnerPodInputs`]), when an agent of the attempt's node
//! asks through the broker (`operator/src/broker/pods.rs`). Agents hold no pod write right at
//! all: a stolen node's token cannot make a pod that names a Secret, another node, another
//! image or another label, because it makes no pod (docs/security.md). Every pod follows one
//! convention:
//!
//! - namespace = the RunnerAttempt's namespace, one `ownerReference` to the attempt (controller,
//!   uid included, `blockOwnerDeletion: false`: deleting the attempt never waits for its pods);
//! - labels: [`ATTEMPT_LABEL`], [`GENERATION_LABEL`], [`ROLE_LABEL`] (closed: [`PodRole`]) and the
//!   node ([`NODE_LABEL`]);
//! - `spec.nodeName` = the attempt's node (the caller's, proven by the broker), set directly: the
//!   scheduler never picks the node of a runner's pod (a `nodeName` pod still counts in the
//!   node's allocated resources and the kubelet's admission still refuses one that does not
//!   fit);
//! - no service account token, no host namespaces, nothing privileged, non-root.
//!
//! Pure: no I/O. [`runner_pod`] and [`placeholder_pod`] build on [`owned_pod_meta`] and
//! [`confined_spec`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EnvVar, HostPathVolumeSource, Pod, PodSecurityContext, PodSpec,
    ResourceRequirements, SeccompProfile, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use crate::NODE_LABEL;
use crate::attempt::RunnerAttempt;
use runner_manager_core::helper_env;

/// The attempt (object name) a pod belongs to.
pub const ATTEMPT_LABEL: &str = "runner-manager.dev/attempt";
/// The runner generation the pod was made for: proves a pod is this allocation's, not a leftover
/// of an earlier one with the same name.
pub const GENERATION_LABEL: &str = "runner-manager.dev/generation";
/// What the pod is ([`PodRole`]).
pub const ROLE_LABEL: &str = "runner-manager.dev/pod-role";

/// Why a pod of runner-manager is there. Closed: the broker makes exactly these, and they reach
/// logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodRole {
    /// An OCI runner: the runner itself.
    Runner,
    /// A native runner's stand-in for the scheduler: the pause image with the runner's requests.
    Placeholder,
}

impl PodRole {
    pub const ALL: [Self; 2] = [Self::Runner, Self::Placeholder];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Runner => "runner",
            Self::Placeholder => "placeholder",
        }
    }

    /// The role a label value names, if it is one.
    pub fn from_label(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == value)
    }
}

/// Why the metadata of an owned pod could not be built. Each is a property of the attempt the
/// API server gave us, so never a panic.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PodMetaError {
    #[error("the attempt has no {0} (not read from the API server)")]
    Missing(&'static str),
    #[error("label {key} cannot hold {len} characters (63 at most)")]
    LabelTooLong { key: &'static str, len: usize },
}

/// The most a label value may hold.
const LABEL_VALUE_MAX: usize = 63;

/// `<attempt name>-<role>`: one pod per attempt and role, so a create that raced a crash finds
/// its own pod by name (AlreadyExists) instead of making a second one.
pub fn pod_name(attempt_name: &str, role: PodRole) -> String {
    format!("{attempt_name}-{}", role.as_str())
}

/// The attempt a pod named by [`pod_name`] for `role` belongs to.
pub fn attempt_of_pod(pod_name: &str, role: PodRole) -> Option<&str> {
    pod_name
        .strip_suffix(role.as_str())
        .and_then(|n| n.strip_suffix('-'))
        .filter(|n| !n.is_empty())
}

/// The label selector of the pods of one node (optionally of one role): what the agent lists
/// and what its orphan sweep considers.
pub fn node_selector(node: &str, role: Option<PodRole>) -> String {
    match role {
        Some(role) => format!("{NODE_LABEL}={node},{ROLE_LABEL}={}", role.as_str()),
        None => format!("{NODE_LABEL}={node},{ROLE_LABEL}"),
    }
}

/// The metadata of a pod made for `attempt` on `node`: name, namespace, labels and
/// the controller reference to the attempt.
pub fn owned_pod_meta(
    attempt: &RunnerAttempt,
    node: &str,
    role: PodRole,
    generation: &str,
) -> Result<ObjectMeta, PodMetaError> {
    let name = attempt
        .metadata
        .name
        .as_deref()
        .ok_or(PodMetaError::Missing("name"))?;
    let namespace = attempt
        .metadata
        .namespace
        .as_deref()
        .ok_or(PodMetaError::Missing("namespace"))?;
    let uid = attempt
        .metadata
        .uid
        .as_deref()
        .ok_or(PodMetaError::Missing("uid"))?;
    let labels: BTreeMap<String, String> = [
        (ATTEMPT_LABEL, name),
        (GENERATION_LABEL, generation),
        (ROLE_LABEL, role.as_str()),
        (NODE_LABEL, node),
    ]
    .into_iter()
    .map(|(k, v)| {
        if v.len() > LABEL_VALUE_MAX {
            Err(PodMetaError::LabelTooLong {
                key: k,
                len: v.len(),
            })
        } else {
            Ok((k.to_owned(), v.to_owned()))
        }
    })
    .collect::<Result<_, _>>()?;
    Ok(ObjectMeta {
        name: Some(pod_name(name, role)),
        namespace: Some(namespace.to_owned()),
        labels: Some(labels),
        owner_references: Some(vec![OwnerReference {
            api_version: RunnerAttempt::api_version(&()).into_owned(),
            kind: RunnerAttempt::kind(&()).into_owned(),
            name: name.to_owned(),
            uid: uid.to_owned(),
            controller: Some(true),
            block_owner_deletion: Some(false),
        }]),
        ..ObjectMeta::default()
    })
}

/// The pod spec every owned pod starts from: pinned to `node`, no token, no host namespaces,
/// non-root with the runtime's default seccomp profile, never restarted (a pod that ends is
/// concluded by the agent, not revived by the kubelet). Providers add containers and volumes.
pub fn confined_spec(node: &str) -> PodSpec {
    PodSpec {
        node_name: Some(node.to_owned()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        host_network: Some(false),
        host_pid: Some(false),
        host_ipc: Some(false),
        restart_policy: Some("Never".to_owned()),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
        ..PodSpec::default()
    }
}

/// The security context of every container of an owned pod: no privilege or escalation, no
/// capability, a read-only root, non-root. Both pod kinds take it from here rather than each
/// spelling it out.
pub fn confined_container() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            add: None,
        }),
        ..SecurityContext::default()
    }
}

/// The attempt a pod is owned by, as (name, uid), when its controller reference names a
/// RunnerAttempt: how the orphan sweep tells a pod whose attempt is gone.
pub fn owner_attempt(meta: &ObjectMeta) -> Option<(&str, &str)> {
    let kind = RunnerAttempt::kind(&());
    meta.owner_references
        .as_deref()?
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == kind)
        .map(|o| (o.name.as_str(), o.uid.as_str()))
}

/// The role a pod's labels name, if it is one of ours.
pub fn role_of(meta: &ObjectMeta) -> Option<PodRole> {
    meta.labels
        .as_ref()?
        .get(ROLE_LABEL)
        .and_then(|v| PodRole::from_label(v))
}

/// The runner pod's one container.
pub const RUNNER_CONTAINER: &str = "runner";
/// Where the runner image holds the entry helper (the project's image and the documented
/// `Containerfile` both install it here).
pub const ENTRY_IN_IMAGE: &str = "/usr/local/bin/runner-manager-runner-entry";
/// The runner pod's runtime volume.
const RUNTIME_VOLUME: &str = "runtime";
/// A stop asks the listener to finish for this long before the kubelet kills it.
const RUNNER_GRACE_SECONDS: i64 = 10;
/// The placeholder's one container.
pub const PLACEHOLDER_CONTAINER: &str = "placeholder";
/// The annotation cluster autoscalers (and Karpenter, which honours it too) read before removing
/// a node: a busy runner's node must not be drained under it.
pub const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";
/// The uid the pause process runs as: `nobody`, as the upstream image's own user.
pub const PAUSE_UID: i64 = 65_535;

/// Why a pod cannot be built for an attempt. Closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BuildRefusal {
    #[error("the image is not pinned by a sha256 digest")]
    ImageNotPinned,
    #[error("the attempt has no name, namespace or uid, or a name too long for a label")]
    AttemptUnnamed,
}

/// Whether `image` is `name@sha256:<64 lower-case hex>` with a non-empty name.
pub fn pinned_by_digest(image: &str) -> bool {
    let Some((name, digest)) = image.rsplit_once("@sha256:") else {
        return false;
    };
    !name.is_empty()
        && !name.contains(char::is_whitespace)
        && digest.len() == 64
        && digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The attempt's resources as a quantity map (`cpu`, `memory`).
fn quantities(a: &RunnerAttempt) -> BTreeMap<String, Quantity> {
    let mut out = BTreeMap::new();
    if let Some(r) = a.spec.snapshot.execution.resources.as_ref() {
        if let Some(cpu) = &r.cpu {
            out.insert("cpu".to_owned(), cpu.clone());
        }
        if let Some(memory) = &r.memory {
            out.insert("memory".to_owned(), memory.clone());
        }
    }
    out
}

/// What a runner pod is made of besides the attempt: the node-local facts only its agent knows.
/// The broker takes them from the agent's order and checks them (`operator/src/broker/pods.rs`).
#[derive(Clone, Debug)]
pub struct RunnerPodInputs<'a> {
    pub node: &'a str,
    /// The runtime directory as the host (the kubelet) names it; mounted at the same path.
    pub host_runtime: &'a str,
    /// The runner account of the attempt (uid, gid): the runtime (0700) and the handoff (0600)
    /// are its.
    pub run_as_user: u32,
    pub run_as_group: u32,
    /// The listener's environment but for the JIT, as for native runners.
    pub environment: &'a BTreeMap<String, String>,
    /// How long the helper waits for the handoff before it gives up (seconds).
    pub await_handoff_seconds: u64,
}

/// The runner pod of one OCI attempt: pinned to the node, owned by the attempt, labelled with
/// attempt, generation (its uid), role and node, image by digest, the policy's resources as
/// requests and limits, `restartPolicy: Never`, no service-account token, no host namespaces,
/// non-root as the attempt's runner account, a read-only root, and the attempt's runtime
/// directory mounted from the host at the same path.
///
/// The JIT never enters the spec: the container's command is the entry helper waiting for the
/// handoff file in the mounted runtime (`--await-handoff`). The spec carries the listener's
/// environment (the policy's `runner.env`, never a secret) in the helper's one opaque variable,
/// exactly as the native launchers pass it. Pure.
pub fn runner_pod(a: &RunnerAttempt, inputs: &RunnerPodInputs<'_>) -> Result<Pod, BuildRefusal> {
    let generation = a
        .metadata
        .uid
        .as_deref()
        .ok_or(BuildRefusal::AttemptUnnamed)?;
    let metadata = owned_pod_meta(a, inputs.node, PodRole::Runner, generation)
        .map_err(|_| BuildRefusal::AttemptUnnamed)?;
    let image = a
        .spec
        .snapshot
        .execution
        .image
        .as_deref()
        .filter(|i| pinned_by_digest(i))
        .ok_or(BuildRefusal::ImageNotPinned)?;
    let quantities = quantities(a);
    let resources = ResourceRequirements {
        // Requests equal to limits: the scheduler's count and the kubelet's admission see what
        // the runner may use, and the pod is Guaranteed when both are set.
        requests: (!quantities.is_empty()).then(|| quantities.clone()),
        limits: (!quantities.is_empty()).then_some(quantities),
        ..ResourceRequirements::default()
    };
    let env = helper_env::helper_environment(inputs.environment)
        .into_iter()
        .map(|(name, value)| EnvVar {
            name,
            value: Some(value),
            value_from: None,
        })
        .collect();
    let base = confined_spec(inputs.node);
    let mut security = base.security_context.clone().unwrap_or_default();
    security.run_as_user = Some(i64::from(inputs.run_as_user));
    security.run_as_group = Some(i64::from(inputs.run_as_group));
    Ok(Pod {
        metadata,
        spec: Some(PodSpec {
            termination_grace_period_seconds: Some(RUNNER_GRACE_SECONDS),
            security_context: Some(security),
            containers: vec![Container {
                name: RUNNER_CONTAINER.to_owned(),
                image: Some(image.to_owned()),
                // Imported or pulled by digest: the kubelet never resolves a tag for a runner.
                image_pull_policy: Some("IfNotPresent".to_owned()),
                command: Some(vec![ENTRY_IN_IMAGE.to_owned()]),
                args: Some(vec![
                    "--await-handoff".to_owned(),
                    inputs.await_handoff_seconds.to_string(),
                    "--runtime".to_owned(),
                    inputs.host_runtime.to_owned(),
                ]),
                env: Some(env),
                working_dir: Some(inputs.host_runtime.to_owned()),
                resources: Some(resources),
                security_context: Some(confined_container()),
                volume_mounts: Some(vec![VolumeMount {
                    name: RUNTIME_VOLUME.to_owned(),
                    mount_path: inputs.host_runtime.to_owned(),
                    ..VolumeMount::default()
                }]),
                ..Container::default()
            }],
            volumes: Some(vec![Volume {
                name: RUNTIME_VOLUME.to_owned(),
                host_path: Some(HostPathVolumeSource {
                    path: inputs.host_runtime.to_owned(),
                    // The agent made it (0700, the runner account's): never created by the
                    // kubelet as root.
                    type_: Some("Directory".to_owned()),
                }),
                ..Volume::default()
            }]),
            ..base
        }),
        status: None,
    })
}

/// How placeholders are made (the operator's `--placeholder-image` and
/// `--placeholder-priority-class`; the chart's `placeholders.*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlaceholderSpec {
    /// The pause image.
    pub image: String,
    /// The chart's PriorityClass, if any.
    pub priority_class: Option<String>,
}

/// The placeholder of native attempt `a` on `node` (docs/placeholder-pods.md): the pause image
/// with the policy's resources as requests, owned by the attempt, not evictable by autoscalers,
/// tolerating every taint (it stands for a host process no taint evicts). Pure.
pub fn placeholder_pod(
    a: &RunnerAttempt,
    node: &str,
    made: &PlaceholderSpec,
) -> Result<Pod, BuildRefusal> {
    let generation = a
        .metadata
        .uid
        .as_deref()
        .ok_or(BuildRefusal::AttemptUnnamed)?;
    let mut metadata = owned_pod_meta(a, node, PodRole::Placeholder, generation)
        .map_err(|_| BuildRefusal::AttemptUnnamed)?;
    metadata.annotations = Some(BTreeMap::from([(
        SAFE_TO_EVICT.to_owned(),
        "false".to_owned(),
    )]));
    let requests = quantities(a);
    let mut spec = confined_spec(node);
    if let Some(sc) = spec.security_context.as_mut() {
        sc.run_as_user = Some(PAUSE_UID);
        sc.run_as_group = Some(PAUSE_UID);
    }
    spec.priority_class_name = made.priority_class.clone();
    // The pause process holds nothing: removed at once, never waited for.
    spec.termination_grace_period_seconds = Some(0);
    // It stands for a runner that runs whatever the node's taints say (a host process is not
    // evicted by a NoExecute taint), so it stays while the runner does.
    spec.tolerations = Some(vec![Toleration {
        operator: Some("Exists".to_owned()),
        ..Toleration::default()
    }]);
    spec.containers = vec![Container {
        name: PLACEHOLDER_CONTAINER.to_owned(),
        image: Some(made.image.clone()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        // Requests only: they are what the scheduler counts; the runner's own cgroup holds its
        // limits, and the pause process uses next to nothing.
        resources: Some(ResourceRequirements {
            requests: (!requests.is_empty()).then_some(requests),
            ..ResourceRequirements::default()
        }),
        security_context: Some(confined_container()),
        ..Container::default()
    }];
    Ok(Pod {
        metadata,
        spec: Some(spec),
        status: None,
    })
}

/// The grace a deletion of a pod of `role` gives: none for a placeholder (the pause process
/// holds nothing, and a node without a kubelet would keep the object terminating forever), the
/// pod's own for a runner (the listener is asked to finish).
pub fn deletion_grace(role: PodRole) -> Option<i64> {
    match role {
        PodRole::Placeholder => Some(0),
        PodRole::Runner => None,
    }
}

/// The label selector of every runner pod of `attempt` (any generation).
pub fn runner_selector(attempt: &str) -> String {
    format!(
        "{ATTEMPT_LABEL}={attempt},{ROLE_LABEL}={}",
        PodRole::Runner.as_str()
    )
}

/// Whether `pod` is `attempt`'s pod of `role` and of this generation: its controller is the
/// attempt of that uid, and the attempt, generation and role labels match. Anything else is not
/// ours to adopt or delete.
pub fn is_ours(pod: &Pod, attempt: &str, generation: &str, role: PodRole) -> bool {
    let label = |k: &str| {
        pod.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(k))
            .map(String::as_str)
    };
    owner_attempt(&pod.metadata) == Some((attempt, generation))
        && label(ATTEMPT_LABEL) == Some(attempt)
        && label(GENERATION_LABEL) == Some(generation)
        && role_of(&pod.metadata) == Some(role)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(name: &str) -> RunnerAttempt {
        crate::fixtures::AttemptBuilder::new(name, "web")
            .namespace("team")
            .uid("u-1")
            .build()
    }

    #[test]
    fn an_owned_pod_carries_the_convention() {
        let meta = owned_pod_meta(
            &attempt("web-3f2a9c0177aa"),
            "n1",
            PodRole::Placeholder,
            "g1",
        )
        .expect("meta");
        assert_eq!(meta.name.as_deref(), Some("web-3f2a9c0177aa-placeholder"));
        assert_eq!(meta.namespace.as_deref(), Some("team"));
        let labels = meta.labels.as_ref().expect("labels");
        assert_eq!(labels[ATTEMPT_LABEL], "web-3f2a9c0177aa");
        assert_eq!(labels[GENERATION_LABEL], "g1");
        assert_eq!(labels[ROLE_LABEL], "placeholder");
        assert_eq!(labels[NODE_LABEL], "n1");
        let owners = meta.owner_references.as_ref().expect("owner");
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].kind, "RunnerAttempt");
        assert_eq!(owners[0].api_version, "runner-manager.dev/v1alpha1");
        assert_eq!(owners[0].uid, "u-1");
        assert_eq!(owners[0].controller, Some(true));
        assert_eq!(owners[0].block_owner_deletion, Some(false));
        assert_eq!(owner_attempt(&meta), Some(("web-3f2a9c0177aa", "u-1")));
        assert_eq!(role_of(&meta), Some(PodRole::Placeholder));
    }

    #[test]
    fn an_attempt_without_uid_or_a_label_too_long_is_refused_not_panicked() {
        let mut a = attempt("web-3f2a9c0177aa");
        a.metadata.uid = None;
        assert_eq!(
            owned_pod_meta(&a, "n1", PodRole::Runner, "g"),
            Err(PodMetaError::Missing("uid"))
        );
        let long = format!("{}-3f2a9c0177aa", "p".repeat(60));
        assert!(matches!(
            owned_pod_meta(&attempt(&long), "n1", PodRole::Runner, "g"),
            Err(PodMetaError::LabelTooLong {
                key: ATTEMPT_LABEL,
                ..
            })
        ));
    }

    #[test]
    fn the_base_spec_is_confined_and_roles_are_closed() {
        let spec = confined_spec("n1");
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.host_pid, Some(false));
        assert_eq!(spec.host_network, Some(false));
        assert_eq!(spec.host_ipc, Some(false));
        assert_eq!(
            spec.security_context.and_then(|s| s.run_as_non_root),
            Some(true)
        );
        for role in PodRole::ALL {
            assert_eq!(PodRole::from_label(role.as_str()), Some(role));
            assert_eq!(
                attempt_of_pod(&pod_name("web-3f2a9c0177aa", role), role),
                Some("web-3f2a9c0177aa")
            );
        }
        assert_eq!(attempt_of_pod("-runner", PodRole::Runner), None);
        assert_eq!(attempt_of_pod("web-x-placeholder", PodRole::Runner), None);
        assert_eq!(PodRole::from_label("debug"), None);
        assert_eq!(
            node_selector("n1", Some(PodRole::Runner)),
            "runner-manager.dev/node=n1,runner-manager.dev/pod-role=runner"
        );
    }

    const IMAGE: &str = "registry.local/runner@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    /// The fixture attempt as an OCI one of `image`, with resources and a `runner.env`.
    fn oci_attempt(image: Option<&str>) -> RunnerAttempt {
        let mut a = attempt("oci-3f2a9c0177aa");
        let execution = &mut a.spec.snapshot.execution;
        execution.mode = crate::policy::ExecutionMode::Oci;
        execution.image = image.map(str::to_owned);
        execution.resources = Some(crate::policy::RunnerResources {
            cpu: Some(Quantity("2".into())),
            memory: Some(Quantity("4Gi".into())),
        });
        a.spec.snapshot.env = BTreeMap::from([("FOO".to_owned(), "bar".to_owned())]);
        a
    }

    fn runner_inputs(env: &BTreeMap<String, String>) -> RunnerPodInputs<'_> {
        RunnerPodInputs {
            node: "n1",
            host_runtime: "/var/lib/runner-manager/runners/3f2a9c0177aa",
            run_as_user: 20001,
            run_as_group: 20000,
            environment: env,
            await_handoff_seconds: 300,
        }
    }

    fn requests(pod: &Pod) -> BTreeMap<String, Quantity> {
        pod.spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.resources.as_ref())
            .and_then(|r| r.requests.clone())
            .unwrap_or_default()
    }

    #[test]
    fn the_runner_pod_is_pinned_owned_confined_and_holds_no_jit() {
        let env = BTreeMap::from([("FOO".to_owned(), "bar".to_owned())]);
        let pod = runner_pod(&oci_attempt(Some(IMAGE)), &runner_inputs(&env)).expect("a pod");
        let meta = &pod.metadata;
        assert_eq!(meta.name.as_deref(), Some("oci-3f2a9c0177aa-runner"));
        assert_eq!(meta.namespace.as_deref(), Some("team"));
        let labels = meta.labels.as_ref().expect("labels");
        assert_eq!(labels[ATTEMPT_LABEL], "oci-3f2a9c0177aa");
        assert_eq!(labels[GENERATION_LABEL], "u-1");
        assert_eq!(labels[ROLE_LABEL], "runner");
        assert!(is_ours(&pod, "oci-3f2a9c0177aa", "u-1", PodRole::Runner));
        assert!(
            !is_ours(&pod, "oci-3f2a9c0177aa", "u-2", PodRole::Runner),
            "another generation"
        );
        assert!(!is_ours(
            &pod,
            "oci-3f2a9c0177aa",
            "u-1",
            PodRole::Placeholder
        ));
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.host_network, Some(false));
        assert_eq!(spec.host_pid, Some(false));
        assert_eq!(spec.host_ipc, Some(false));
        let sc = spec.security_context.as_ref().expect("pod security");
        assert_eq!(sc.run_as_user, Some(20001));
        assert_eq!(sc.run_as_group, Some(20000));
        assert_eq!(sc.run_as_non_root, Some(true));
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some(IMAGE));
        let csc = c.security_context.as_ref().expect("container security");
        assert_eq!(csc.read_only_root_filesystem, Some(true));
        assert_eq!(csc.allow_privilege_escalation, Some(false));
        assert_eq!(csc.privileged, Some(false));
        let req = requests(&pod);
        assert_eq!(req["cpu"].0, "2");
        assert_eq!(req["memory"].0, "4Gi");
        assert_eq!(
            c.resources.as_ref().and_then(|r| r.limits.clone()),
            Some(req)
        );
        let host = spec.volumes.as_ref().expect("volumes")[0]
            .host_path
            .as_ref()
            .expect("hostPath");
        assert_eq!(host.path, "/var/lib/runner-manager/runners/3f2a9c0177aa");
        assert_eq!(host.type_.as_deref(), Some("Directory"));
        assert_eq!(
            c.volume_mounts.as_ref().expect("mounts")[0].mount_path,
            host.path
        );
        // The listener's environment travels encoded in the helper's one variable; no JIT name.
        let text = serde_json::to_string(&pod).expect("json");
        assert!(!text.contains("ACTIONS_RUNNER_INPUT"), "{text}");
        assert!(!text.contains("secretKeyRef") && !text.contains("serviceAccountName"));
        let names: Vec<&str> = c
            .env
            .as_ref()
            .expect("env")
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(names, ["PATH", "LANG", helper_env::ENVIRONMENT_VARIABLE]);
        assert_eq!(c.command.as_deref(), Some(&[ENTRY_IN_IMAGE.to_owned()][..]));
        assert_eq!(deletion_grace(PodRole::Runner), None);
    }

    #[test]
    fn an_image_not_pinned_by_digest_makes_no_runner_pod() {
        let env = BTreeMap::new();
        for image in [
            None,
            Some("registry.local/runner:latest"),
            Some("registry.local/runner@sha256:abc"),
            Some("@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"),
            Some(
                "registry.local/runner@sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
            ),
        ] {
            assert_eq!(
                runner_pod(&oci_attempt(image), &runner_inputs(&env)).err(),
                Some(BuildRefusal::ImageNotPinned),
                "{image:?}"
            );
        }
        assert!(pinned_by_digest(IMAGE));
    }

    #[test]
    fn no_resources_means_no_requests() {
        let env = BTreeMap::new();
        let mut a = oci_attempt(Some(IMAGE));
        a.spec.snapshot.execution.resources = None;
        let pod = runner_pod(&a, &runner_inputs(&env)).expect("a pod");
        assert!(requests(&pod).is_empty());
        let placeholder = placeholder_pod(&a, "n1", &pause()).expect("a placeholder");
        assert!(requests(&placeholder).is_empty());
    }

    fn pause() -> PlaceholderSpec {
        PlaceholderSpec {
            image: "pause:1".into(),
            priority_class: Some("rm-placeholder".into()),
        }
    }

    #[test]
    fn a_placeholder_requests_the_policys_resources_and_is_not_evictable_by_autoscalers() {
        let mut a = attempt("web-3f2a9c0177aa");
        a.spec.snapshot.execution.resources = Some(crate::policy::RunnerResources {
            cpu: Some(Quantity("1500m".into())),
            memory: Some(Quantity("2Gi".into())),
        });
        let pod = placeholder_pod(&a, "n1", &pause()).expect("pod");
        assert_eq!(
            pod.metadata.name.as_deref(),
            Some("web-3f2a9c0177aa-placeholder")
        );
        assert_eq!(
            pod.metadata.annotations.as_ref().expect("annotations")[SAFE_TO_EVICT],
            "false"
        );
        assert_eq!(role_of(&pod.metadata), Some(PodRole::Placeholder));
        assert_eq!(
            owner_attempt(&pod.metadata),
            Some(("web-3f2a9c0177aa", "u-1"))
        );
        let spec = pod.spec.expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.priority_class_name.as_deref(), Some("rm-placeholder"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert!(spec.volumes.is_none(), "a placeholder mounts nothing");
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("pause:1"));
        let r = c.resources.as_ref().expect("resources");
        let requests = r.requests.as_ref().expect("requests");
        assert_eq!(requests["cpu"], Quantity("1500m".into()));
        assert_eq!(requests["memory"], Quantity("2Gi".into()));
        assert!(r.limits.is_none());
        let sc = spec.security_context.expect("pod security");
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.run_as_user, Some(PAUSE_UID));
        assert_eq!(deletion_grace(PodRole::Placeholder), Some(0));
    }
}
