//! The one convention every Pod the agent creates follows (issue 16): OCI runner pods and the
//! placeholder pods that make a native runner visible to the scheduler. One shape, so one
//! admission rule (the chart's `agent-pods` ValidatingAdmissionPolicy) can confine the agent's
//! pod rights to exactly these pods on its own node:
//!
//! - namespace = the RunnerAttempt's namespace, one `ownerReference` to the attempt (controller,
//!   uid included, `blockOwnerDeletion: false`: the agent may not set finalizers' blocking on an
//!   object it cannot update);
//! - labels: [`ATTEMPT_LABEL`], [`GENERATION_LABEL`], [`ROLE_LABEL`] (closed: [`PodRole`]) and the
//!   node ([`NODE_LABEL`]);
//! - `spec.nodeName` = the agent's node, set directly: the agent never asks the scheduler to pick
//!   the node of its own pods (a `nodeName` pod still counts in the node's allocated resources and
//!   the kubelet's admission still refuses one that does not fit);
//! - no service account token, no host namespaces, nothing privileged, non-root.
//!
//! Pure: no I/O. The providers build their containers on top of [`owned_pod_meta`] and
//! [`confined_spec`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, PodSecurityContext, PodSpec, SeccompProfile, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use runner_manager_crds::NODE_LABEL;
use runner_manager_crds::attempt::RunnerAttempt;

/// The attempt (object name) a pod belongs to.
pub const ATTEMPT_LABEL: &str = "runner-manager.dev/attempt";
/// The runner generation the pod was made for: proves a pod is this allocation's, not a leftover
/// of an earlier one with the same name.
pub const GENERATION_LABEL: &str = "runner-manager.dev/generation";
/// What the pod is ([`PodRole`]).
pub const ROLE_LABEL: &str = "runner-manager.dev/pod-role";

/// Why a pod the agent creates is there. Closed: the admission rule allows exactly these values,
/// and they reach logs and metrics.
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

/// The metadata of a pod the agent creates for `attempt` on `node`: name, namespace, labels and
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
/// capability, a read-only root, non-root. The agent-pods admission rule refuses anything
/// looser, so both pod kinds take it from here rather than each spelling it out.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(name: &str) -> RunnerAttempt {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "runner-manager.dev/v1alpha1", "kind": "RunnerAttempt",
            "metadata": {"name": name, "namespace": "team", "uid": "u-1"},
            "spec": {
                "id": "3f2a9c01-77aa-4bcd-8e00-123456789abc", "policy": "web", "nodeName": "n1",
                "snapshot": {
                    "policyUid": "p", "target": {"url": "https://github.com/o/r", "scope": "Repository"},
                    "labels": [], "runnerGroupId": 1, "workspace": "Ephemeral", "maxSlots": 1,
                    "execution": {"mode": "Native"},
                    "runner": {"version": "2.330.0", "url": "https://example.invalid/r.tgz", "sha256": "0".repeat(64)},
                    "timeouts": {"registration": "5m", "idle": "5m", "jitHandoff": "2m"}
                }
            }
        }))
        .expect("a valid attempt")
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
}
