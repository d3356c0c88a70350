//! Pods for agents (issue 28): the operator, not the agent, creates and deletes the runner pods
//! of OCI attempts and the placeholder pods of native ones. An agent orders them through the
//! broker (`POST /v1/attempts/{ns}/{name}/pods`, `POST /v1/pods/{ns}/{name}/removal`), proven
//! by its bound token to run on a node (`super::authn`), and holds no pod write right of its
//! own: RBAC cannot say "only the pods the operator would build", so the agent gets none, and a
//! stolen node's token cannot make a pod that names a Secret, another node, another image or
//! another label, or change one.
//!
//! The stages, each with its own refusal:
//! 1. dereference: the attempt, by namespace, name and uid ([`BrokerErrorCode::UnknownAttempt`]);
//! 2. validate ([`check_order`], pure): the attempt runs on the caller's node (`WrongNode`), is
//!    in a state that wants the pod, of the mode the pod serves, and the order's node-local
//!    inputs are what the agent journalled and could have meant (`PodRefused`);
//! 3. build: `runner_manager_crds::pods` (the one builder), for the caller's node;
//! 4. apply: create; a pod of the name that is provably this attempt's (an order repeated after
//!    a crash or a lost answer) is answered as it is (200), any other is `PodConflict`.
//!
//! A removal deletes only a runner or placeholder pod of a RunnerAttempt on the caller's node
//! ([`check_removal`]), with the uid the agent names as a precondition.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::broker::{BrokerError, BrokerErrorCode, OrderedPod, PodOrder, PodRemoval};
use runner_manager_crds::pods::{
    self, PlaceholderSpec, PodRole, RunnerPodInputs, placeholder_pod, runner_pod,
};
use runner_manager_crds::policy::ExecutionMode;
use runner_manager_crds::state::AttemptState;

use super::authn::Caller;
use super::{confine, refused};

/// The most bytes of an ordered runner environment (names and values): `runner.env` is a
/// handful of variables; a pod object is at most 1.5 MiB.
pub const ENVIRONMENT_LIMIT: usize = 64 * 1024;
/// The longest wait for the handoff an order may ask of the entry helper (seconds).
pub const AWAIT_HANDOFF_LIMIT: u64 = 3600;

/// What an order came to.
#[derive(Debug)]
pub enum Made {
    /// Created now (201).
    Created(Pod),
    /// This attempt's pod of that role was there already (200).
    Existing(Pod),
}

fn valid_env_name(name: &str) -> bool {
    let mut b = name.bytes();
    matches!(b.next(), Some(c) if c == b'_' || c.is_ascii_alphabetic())
        && b.all(|c| c == b'_' || c.is_ascii_alphanumeric())
        // Only the entry helper sets the JIT, from the handoff file.
        && !name.to_ascii_uppercase().starts_with("ACTIONS_RUNNER_INPUT_")
}

/// Checks an order against the attempt and builds the pod it asks for, on `caller`'s node.
/// Pure: the whole decision of what pod an agent may have.
pub fn check_order(
    attempt: &RunnerAttempt,
    caller: &Caller,
    order: &PodOrder,
    placeholders: Option<&PlaceholderSpec>,
) -> Result<Pod, BrokerError> {
    confine(attempt, &order.attempt_uid, caller)?;
    if attempt.metadata.deletion_timestamp.is_some() {
        return Err(refused(
            BrokerErrorCode::PodRefused,
            "the attempt is being deleted: no new pod",
        ));
    }
    let journal = attempt.status.as_ref().map(|s| &s.journal);
    let state = journal.map(|j| j.state()).unwrap_or_default();
    let mode = attempt.spec.snapshot.execution.mode;
    let node = caller.node_name.as_str();
    let built = match &order.pod {
        OrderedPod::Runner {
            host_runtime,
            run_as_user,
            run_as_group,
            environment,
            await_handoff_seconds,
        } => {
            if mode != ExecutionMode::Oci {
                return Err(refused(
                    BrokerErrorCode::PodRefused,
                    "a runner pod is made only for an attempt of execution mode Oci",
                ));
            }
            if state != AttemptState::Preparing {
                return Err(refused(
                    BrokerErrorCode::PodRefused,
                    format!(
                        "a runner pod is made only while the attempt is Preparing (it is {state:?})"
                    ),
                ));
            }
            // The runtime the agent journalled for the attempt, and only it, is mounted.
            let journalled = journal
                .and_then(|j| j.workspace())
                .map(|w| w.runtime_path());
            if journalled != Some(host_runtime.as_str()) {
                return Err(refused(
                    BrokerErrorCode::PodRefused,
                    "pod.hostRuntime is not the runtime path journalled in the attempt's workspace",
                ));
            }
            if *run_as_user == 0 || *run_as_group == 0 {
                return Err(refused(
                    BrokerErrorCode::PodRefused,
                    "pod.runAsUser and pod.runAsGroup must not be 0 (root)",
                ));
            }
            let size: usize = environment.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
            if let Some(bad) = environment.keys().find(|k| !valid_env_name(k)) {
                return Err(refused(
                    BrokerErrorCode::PodRefused,
                    format!("pod.environment: {bad:?} is not a variable name a runner may get"),
                ));
            }
            if size > ENVIRONMENT_LIMIT {
                return Err(refused(
                    BrokerErrorCode::PodRefused,
                    format!("pod.environment holds {size} bytes; at most {ENVIRONMENT_LIMIT}"),
                ));
            }
            if !(1..=AWAIT_HANDOFF_LIMIT).contains(await_handoff_seconds) {
                return Err(refused(
                    BrokerErrorCode::PodRefused,
                    format!("pod.awaitHandoffSeconds must be 1 to {AWAIT_HANDOFF_LIMIT}"),
                ));
            }
            runner_pod(
                attempt,
                &RunnerPodInputs {
                    node,
                    host_runtime,
                    run_as_user: *run_as_user,
                    run_as_group: *run_as_group,
                    environment,
                    await_handoff_seconds: *await_handoff_seconds,
                },
            )
        }
        OrderedPod::Placeholder => {
            let Some(spec) = placeholders else {
                return Err(refused(
                    BrokerErrorCode::PodRefused,
                    "placeholders are not configured on the operator (--placeholder-image; the chart's placeholders.enabled)",
                ));
            };
            if mode != ExecutionMode::Native {
                return Err(refused(
                    BrokerErrorCode::PodRefused,
                    "a placeholder is made only for an attempt of execution mode Native",
                ));
            }
            if state.is_concluded() {
                return Err(refused(
                    BrokerErrorCode::PodRefused,
                    "the attempt is concluded: its runner needs no placeholder",
                ));
            }
            placeholder_pod(attempt, node, spec)
        }
    };
    built.map_err(|e| refused(BrokerErrorCode::PodRefused, e.to_string()))
}

/// Whether `existing` (found under the name an order's pod takes) is that pod: this attempt's,
/// of this role, on the caller's node. Pure.
pub fn is_repeat(existing: &Pod, attempt: &RunnerAttempt, role: PodRole, node: &str) -> bool {
    let (Some(name), Some(uid)) = (
        attempt.metadata.name.as_deref(),
        attempt.metadata.uid.as_deref(),
    ) else {
        return false;
    };
    pods::is_ours(existing, name, uid, role)
        && existing.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
}

/// Whether `pod` may be removed for `caller`: a runner or placeholder pod, controlled by a
/// RunnerAttempt, bound to the caller's node. Its role, for the deletion's grace. Pure.
pub fn check_removal(pod: &Pod, caller: &Caller) -> Result<PodRole, BrokerError> {
    let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    match (
        pods::role_of(&pod.metadata),
        pods::owner_attempt(&pod.metadata),
    ) {
        (Some(role), Some(_)) if node == Some(caller.node_name.as_str()) => Ok(role),
        _ => Err(refused(
            BrokerErrorCode::NotYourPod,
            "not a runner or placeholder pod of a RunnerAttempt on the caller's node",
        )),
    }
}

fn api_refusal(e: &kube::Error) -> BrokerError {
    match e {
        kube::Error::Api(s) if matches!(s.code, 400 | 403 | 422) => refused(
            BrokerErrorCode::PodRefused,
            format!("the API server refused the pod: {}", s.message),
        ),
        _ => refused(
            BrokerErrorCode::Internal,
            "the API server could not be asked",
        ),
    }
}

/// Makes the pod `order` asks for of `attempt` (dereferenced by the caller: `super::server`),
/// in the module's stages.
pub async fn order(
    kube: &kube::Client,
    attempt: &RunnerAttempt,
    caller: &Caller,
    order: &PodOrder,
    placeholders: Option<&PlaceholderSpec>,
) -> Result<Made, BrokerError> {
    let (Some(namespace), Some(name)) = (
        attempt.metadata.namespace.as_deref(),
        attempt.metadata.name.as_deref(),
    ) else {
        return Err(refused(BrokerErrorCode::UnknownAttempt, "no such attempt"));
    };
    let pod = check_order(attempt, caller, order, placeholders)?;
    let pods_api = Api::<Pod>::namespaced(kube.clone(), namespace);
    match pods_api.create(&PostParams::default(), &pod).await {
        Ok(p) => Ok(Made::Created(p)),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let pod_name = pods::pod_name(name, order.pod.role());
            match pods_api.get_opt(&pod_name).await {
                Ok(Some(existing))
                    if is_repeat(&existing, attempt, order.pod.role(), &caller.node_name) =>
                {
                    Ok(Made::Existing(existing))
                }
                Ok(_) => Err(refused(
                    BrokerErrorCode::PodConflict,
                    "a pod of the attempt's pod name exists and is not this attempt's",
                )),
                Err(e) => Err(api_refusal(&e)),
            }
        }
        Err(e) => Err(api_refusal(&e)),
    }
}

/// Removes pod `namespace/name` while it has `removal.uid`, if [`check_removal`] allows it. Gone
/// already (or the name another pod's now) is done.
pub async fn remove(
    kube: &kube::Client,
    namespace: &str,
    name: &str,
    caller: &Caller,
    removal: &PodRemoval,
) -> Result<(), BrokerError> {
    let api = Api::<Pod>::namespaced(kube.clone(), namespace);
    let Some(pod) = api.get_opt(name).await.map_err(|e| api_refusal(&e))? else {
        return Ok(());
    };
    if pod.metadata.uid.as_deref() != Some(removal.uid.as_str()) {
        return Ok(());
    }
    let role = check_removal(&pod, caller)?;
    let params = DeleteParams {
        grace_period_seconds: pods::deletion_grace(role).and_then(|g| u32::try_from(g).ok()),
        preconditions: Some(Preconditions {
            uid: Some(removal.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        // 404: gone; 409: the uid precondition failed, the name is another pod's now.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(api_refusal(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_manager_crds::fixtures::{AttemptBuilder, RUNTIME_PATH};
    use std::collections::BTreeMap;

    /// Attempt `oci-3f2a9c0177aa` (uid `u-1`) of policy `oci` on node `n1`, walked to `state`.
    fn attempt(mode: ExecutionMode, state: AttemptState) -> RunnerAttempt {
        AttemptBuilder::new("oci-3f2a9c0177aa", "oci")
            .namespace("team")
            .uid("u-1")
            .execution(mode)
            .state(state)
            .build()
    }

    fn caller(node: &str) -> Caller {
        Caller {
            pod_name: "agent-x".into(),
            pod_uid: "pu".into(),
            node_name: node.into(),
        }
    }

    fn runner(edit: impl FnOnce(&mut OrderedPod)) -> PodOrder {
        let mut pod = OrderedPod::Runner {
            host_runtime: RUNTIME_PATH.into(),
            run_as_user: 20001,
            run_as_group: 20000,
            environment: BTreeMap::from([("FOO".into(), "bar".into())]),
            await_handoff_seconds: 300,
        };
        edit(&mut pod);
        PodOrder {
            attempt_uid: "u-1".into(),
            pod,
        }
    }

    fn pause() -> PlaceholderSpec {
        PlaceholderSpec {
            image: "pause:1".into(),
            priority_class: None,
        }
    }

    fn code(r: Result<Pod, BrokerError>) -> BrokerErrorCode {
        r.expect_err("refused").code
    }

    #[test]
    fn an_order_from_the_attempts_node_gets_the_builders_pod_on_that_node() {
        let a = attempt(ExecutionMode::Oci, AttemptState::Preparing);
        let pod = check_order(&a, &caller("n1"), &runner(|_| {}), None).expect("a pod");
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert!(is_repeat(&pod, &a, PodRole::Runner, "n1"));
        assert!(!is_repeat(&pod, &a, PodRole::Runner, "n2"));
        assert!(!is_repeat(&pod, &a, PodRole::Placeholder, "n1"));
        assert_eq!(check_removal(&pod, &caller("n1")), Ok(PodRole::Runner));
        let native = attempt(ExecutionMode::Native, AttemptState::Allocated);
        let placeholder = check_order(&native, &caller("n1"), &placeholder_order(), Some(&pause()))
            .expect("a placeholder");
        assert_eq!(
            check_removal(&placeholder, &caller("n1")),
            Ok(PodRole::Placeholder)
        );
    }

    fn placeholder_order() -> PodOrder {
        PodOrder {
            attempt_uid: "u-1".into(),
            pod: OrderedPod::Placeholder,
        }
    }

    #[test]
    fn a_stolen_nodes_order_for_what_the_attempt_does_not_want_is_refused() {
        let a = attempt(ExecutionMode::Oci, AttemptState::Preparing);
        assert_eq!(
            code(check_order(&a, &caller("n2"), &runner(|_| {}), None)),
            BrokerErrorCode::WrongNode,
            "another node's attempt"
        );
        let mut other = runner(|_| {});
        other.attempt_uid = "u-0".into();
        assert_eq!(
            code(check_order(&a, &caller("n1"), &other, None)),
            BrokerErrorCode::UnknownAttempt,
            "an earlier attempt of the name"
        );
        let refusals: [(&str, PodOrder); 6] = [
            (
                "another host path",
                runner(|p| {
                    if let OrderedPod::Runner { host_runtime, .. } = p {
                        *host_runtime = "/etc/kubernetes".into();
                    }
                }),
            ),
            (
                "root",
                runner(|p| {
                    if let OrderedPod::Runner { run_as_user, .. } = p {
                        *run_as_user = 0;
                    }
                }),
            ),
            (
                "root group",
                runner(|p| {
                    if let OrderedPod::Runner { run_as_group, .. } = p {
                        *run_as_group = 0;
                    }
                }),
            ),
            (
                "the JIT's variable",
                runner(|p| {
                    if let OrderedPod::Runner { environment, .. } = p {
                        environment.insert("ACTIONS_RUNNER_INPUT_JITCONFIG".into(), "x".into());
                    }
                }),
            ),
            (
                "a huge environment",
                runner(|p| {
                    if let OrderedPod::Runner { environment, .. } = p {
                        environment.insert("BIG".into(), "x".repeat(ENVIRONMENT_LIMIT));
                    }
                }),
            ),
            ("a placeholder for an OCI attempt", placeholder_order()),
        ];
        for (why, order) in refusals {
            assert_eq!(
                code(check_order(&a, &caller("n1"), &order, Some(&pause()))),
                BrokerErrorCode::PodRefused,
                "{why}"
            );
        }
        assert_eq!(
            code(check_order(
                &attempt(ExecutionMode::Oci, AttemptState::Idle),
                &caller("n1"),
                &runner(|_| {}),
                None
            )),
            BrokerErrorCode::PodRefused,
            "a runner pod only while Preparing"
        );
        // The mode alone differs from `a`: a native attempt never journals Preparing.
        let mut native_preparing = a.clone();
        native_preparing.spec.snapshot.execution.mode = ExecutionMode::Native;
        assert_eq!(
            code(check_order(
                &native_preparing,
                &caller("n1"),
                &runner(|_| {}),
                None
            )),
            BrokerErrorCode::PodRefused,
            "a runner pod for a native attempt"
        );
        assert_eq!(
            code(check_order(
                &attempt(ExecutionMode::Native, AttemptState::Allocated),
                &caller("n1"),
                &placeholder_order(),
                None
            )),
            BrokerErrorCode::PodRefused,
            "no placeholder without the operator's image"
        );
    }

    #[test]
    fn only_an_attempts_pod_on_the_callers_node_is_removed() {
        let a = attempt(ExecutionMode::Oci, AttemptState::Preparing);
        let pod = check_order(&a, &caller("n1"), &runner(|_| {}), None).expect("a pod");
        assert_eq!(
            check_removal(&pod, &caller("n2")).map_err(|e| e.code),
            Err(BrokerErrorCode::NotYourPod),
            "another node's pod"
        );
        let mut unowned = pod.clone();
        unowned.metadata.owner_references = None;
        assert!(
            check_removal(&unowned, &caller("n1")).is_err(),
            "no RunnerAttempt controls it"
        );
        let mut unlabelled = pod;
        unlabelled.metadata.labels = None;
        assert!(
            check_removal(&unlabelled, &caller("n1")).is_err(),
            "not a runner-manager pod"
        );
    }
}
