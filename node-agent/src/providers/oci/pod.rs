//! The runner pod of one OCI attempt, built from the attempt alone (pure, unit-tested): pinned to
//! the agent's node, owned by the attempt, labelled with attempt, generation, role and node,
//! image by digest, the policy's resources as requests and limits, `restartPolicy: Never`, no
//! service-account token, no host namespaces, non-root as the attempt's runner account, a
//! read-only root, and the attempt's runtime directory mounted from the host at the same path.
//!
//! The JIT never enters the spec: the container's command is the entry helper waiting for the
//! handoff file in the mounted runtime ([`crate::entry`]'s `--await-handoff`). The spec carries
//! the listener's environment (the policy's `runner.env`, never a secret) in the helper's one
//! opaque variable, exactly as the native launchers pass it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, EnvVar, HostPathVolumeSource, Pod, PodSpec, ResourceRequirements, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use runner_manager_crds::attempt::RunnerAttempt;

use crate::account::RunnerAccount;
use crate::entry;
use crate::pods::{self, GENERATION_LABEL, PodRole};

/// The container's name.
pub const CONTAINER: &str = "runner";
/// Where the runner image holds the entry helper (the project's image and the documented
/// `Containerfile` both install it here).
pub const ENTRY_IN_IMAGE: &str = "/usr/local/bin/runner-manager-runner-entry";
/// The runtime volume's name.
const RUNTIME_VOLUME: &str = "runtime";
/// A stop asks the listener to finish for this long before the kubelet kills it.
const GRACE_SECONDS: i64 = 10;

/// Why a pod cannot be built for an attempt. Closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PodRefusal {
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

/// The attempt's runner generation: its uid.
pub fn generation_of(a: &RunnerAttempt) -> Option<&str> {
    a.metadata.uid.as_deref()
}

/// What one runner pod is made of, besides the attempt.
#[derive(Clone, Debug)]
pub struct PodInputs<'a> {
    pub node: &'a str,
    /// The runtime directory as the host (the kubelet) names it; mounted at the same path.
    pub host_runtime: &'a str,
    pub account: RunnerAccount,
    /// The listener's environment but for the JIT, as for native runners.
    pub environment: &'a BTreeMap<String, String>,
    /// How long the helper waits for the handoff before it gives up (seconds).
    pub await_handoff_seconds: u64,
}

/// The label selector of every runner pod of `attempt` (any generation).
pub fn selector(attempt: &str) -> String {
    format!(
        "{}={attempt},{}={}",
        pods::ATTEMPT_LABEL,
        pods::ROLE_LABEL,
        PodRole::Runner.as_str()
    )
}

/// Builds the pod. Pure.
pub fn runner_pod(a: &RunnerAttempt, inputs: &PodInputs<'_>) -> Result<Pod, PodRefusal> {
    let generation = generation_of(a).ok_or(PodRefusal::AttemptUnnamed)?;
    let metadata = pods::owned_pod_meta(a, inputs.node, PodRole::Runner, generation)
        .map_err(|_| PodRefusal::AttemptUnnamed)?;
    let image = a
        .spec
        .snapshot
        .execution
        .image
        .as_deref()
        .filter(|i| pinned_by_digest(i))
        .ok_or(PodRefusal::ImageNotPinned)?;
    let mut quantities = BTreeMap::new();
    if let Some(r) = a.spec.snapshot.execution.resources.as_ref() {
        if let Some(cpu) = &r.cpu {
            quantities.insert("cpu".to_owned(), cpu.clone());
        }
        if let Some(memory) = &r.memory {
            quantities.insert("memory".to_owned(), memory.clone());
        }
    }
    let resources = ResourceRequirements {
        // Requests equal to limits: the scheduler's count and the kubelet's admission see what
        // the runner may use, and the pod is Guaranteed when both are set.
        requests: (!quantities.is_empty()).then(|| quantities.clone()),
        limits: (!quantities.is_empty()).then_some(quantities),
        ..ResourceRequirements::default()
    };
    let env = entry::helper_environment(inputs.environment)
        .into_iter()
        .map(|(name, value)| EnvVar {
            name,
            value: Some(value),
            value_from: None,
        })
        .collect();
    let uid_i64 = i64::from(inputs.account.uid);
    let gid_i64 = i64::from(inputs.account.gid);
    let base = pods::confined_spec(inputs.node);
    let mut security = base.security_context.clone().unwrap_or_default();
    // The runner account of this attempt: the runtime (0700) and the handoff (0600) are its.
    security.run_as_user = Some(uid_i64);
    security.run_as_group = Some(gid_i64);
    Ok(Pod {
        metadata,
        spec: Some(PodSpec {
            termination_grace_period_seconds: Some(GRACE_SECONDS),
            security_context: Some(security),
            containers: vec![Container {
                name: CONTAINER.to_owned(),
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
                security_context: Some(pods::confined_container()),
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

/// Whether `pod` is this attempt's runner of this generation: its controller is the attempt of
/// that uid, and the attempt, generation and role labels match. Anything else is not ours to
/// adopt or delete.
pub fn is_ours(pod: &Pod, attempt: &str, generation: &str) -> bool {
    let label = |k: &str| {
        pod.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(k))
            .map(String::as_str)
    };
    pods::owner_attempt(&pod.metadata) == Some((attempt, generation))
        && label(pods::ATTEMPT_LABEL) == Some(attempt)
        && label(GENERATION_LABEL) == Some(generation)
        && pods::role_of(&pod.metadata) == Some(PodRole::Runner)
}

/// The resources of a pod as a quantity map, for tests and the docs.
pub fn requests(pod: &Pod) -> BTreeMap<String, Quantity> {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.resources.as_ref())
        .and_then(|r| r.requests.clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const IMAGE: &str = "registry.local/runner@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn attempt(image: Option<&str>) -> RunnerAttempt {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "runner-manager.dev/v1alpha1", "kind": "RunnerAttempt",
            "metadata": {"name": "oci-3f2a9c0177aa", "namespace": "team", "uid": "u-1"},
            "spec": {
                "id": "3f2a9c01-77aa-4bcd-8e00-123456789abc", "policy": "oci", "nodeName": "n1",
                "snapshot": {
                    "policyUid": "p", "target": {"url": "https://github.com/o/r", "scope": "Repository"},
                    "labels": [], "runnerGroupId": 1, "workspace": "Ephemeral", "maxSlots": 1,
                    "execution": {"mode": "Oci", "image": image, "resources": {"cpu": "2", "memory": "4Gi"}},
                    "runner": {"version": "2.330.0", "url": "https://example.invalid/r.tgz", "sha256": "0".repeat(64)},
                    "env": {"FOO": "bar"},
                    "timeouts": {"registration": "5m", "idle": "5m", "jitHandoff": "2m"}
                }
            }
        }))
        .expect("a valid attempt")
    }

    fn inputs<'a>(env: &'a BTreeMap<String, String>) -> PodInputs<'a> {
        PodInputs {
            node: "n1",
            host_runtime: "/var/lib/runner-manager/runners/3f2a9c0177aa",
            account: RunnerAccount {
                uid: 20001,
                gid: 20000,
            },
            environment: env,
            await_handoff_seconds: 300,
        }
    }

    #[test]
    fn the_runner_pod_is_pinned_owned_confined_and_holds_no_jit() {
        let env = BTreeMap::from([("FOO".to_owned(), "bar".to_owned())]);
        let pod = runner_pod(&attempt(Some(IMAGE)), &inputs(&env)).expect("a pod");
        let meta = &pod.metadata;
        assert_eq!(meta.name.as_deref(), Some("oci-3f2a9c0177aa-runner"));
        assert_eq!(meta.namespace.as_deref(), Some("team"));
        let labels = meta.labels.as_ref().expect("labels");
        assert_eq!(labels[pods::ATTEMPT_LABEL], "oci-3f2a9c0177aa");
        assert_eq!(labels[GENERATION_LABEL], "u-1");
        assert_eq!(labels[pods::ROLE_LABEL], "runner");
        assert!(is_ours(&pod, "oci-3f2a9c0177aa", "u-1"));
        assert!(
            !is_ours(&pod, "oci-3f2a9c0177aa", "u-2"),
            "another generation"
        );
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
        assert_eq!(names, ["PATH", "LANG", entry::ENVIRONMENT_VARIABLE]);
        assert_eq!(c.command.as_deref(), Some(&[ENTRY_IN_IMAGE.to_owned()][..]));
    }

    #[test]
    fn an_image_not_pinned_by_digest_makes_no_pod() {
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
                runner_pod(&attempt(image), &inputs(&env)).err(),
                Some(PodRefusal::ImageNotPinned),
                "{image:?}"
            );
        }
        assert!(pinned_by_digest(IMAGE));
    }

    #[test]
    fn no_resources_means_no_requests() {
        let env = BTreeMap::new();
        let mut a = attempt(Some(IMAGE));
        a.spec.snapshot.execution.resources = None;
        let pod = runner_pod(&a, &inputs(&env)).expect("a pod");
        assert!(requests(&pod).is_empty());
    }
}
