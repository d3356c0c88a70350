//! Placeholder pods (DESIGN §12 "Kubernetes sees every runner", issue 16 item 4): a native runner
//! is a host process the scheduler cannot see, so beside each one the agent keeps a pod on the
//! runner's node — the pause image, the policy's resources as requests, owned by the attempt,
//! `cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`, the chart's PriorityClass. The
//! scheduler then counts the runner in the node's allocated resources (`kubectl describe node`),
//! will not place a pod that would not fit beside it, and autoscalers do not remove the node
//! under a busy runner.
//!
//! Ordering (docs/placeholder-pods.md): the placeholder is created, and the kubelet's verdict
//! awaited ([`Settings::wait`]), during preparation, before `Prepared` and the one JIT request:
//! a node that cannot fit the runner refuses the placeholder (`OutOfcpu`, `OutOfmemory`) and the
//! launch concludes without a JIT spent and without a runner started. It is removed once the
//! runner is stopped and its workspace cleaned, and on every failed launch; the orphan sweep
//! removes any whose attempt is gone ([`sweep`]).
//!
//! While the runner runs, supervision keeps its placeholder standing ([`keep`], from the pod
//! watch's store, on the watch's events): one deleted, evicted or otherwise ended is recreated
//! with a Warning event, because without it the scheduler no longer counts the runner. The
//! runner is never stopped for it; a recreation the API server or the kubelet refuses is said
//! in an event and tried again after [`KEEP_RETRY`].
//!
//! Every delete carries a uid precondition: only a pod whose controller is this attempt (by
//! uid) is removed, never a same-named pod someone else made.
//!
//! The pod follows the one convention of agent-made pods (`crate::pods`), which the chart's
//! agent-pods ValidatingAdmissionPolicy enforces.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kube::{Client, ResourceExt};
use runner_manager_crds::attempt::RunnerAttempt;

use crate::pods::{self, PodRole};

/// The annotation cluster autoscalers (and Karpenter, which honours it too) read before removing
/// a node: a busy runner's node must not be drained under it.
pub const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";
/// The one container of a placeholder.
pub const CONTAINER: &str = "placeholder";
/// After a placeholder was recreated (or its recreation refused), the next recreation of the
/// same attempt's waits this long: a kubelet that refuses it for resources would otherwise be
/// asked again on every event its refusal makes.
pub const KEEP_RETRY: Duration = Duration::from_secs(30);
/// The uid the pause process runs as: `nobody`, as the upstream image's own user.
const PAUSE_UID: i64 = 65_535;

/// How the agent makes placeholders (`--placeholder-image`, `--placeholder-priority-class`,
/// `--placeholder-wait-seconds`; the chart's `placeholders.*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The pause image.
    pub image: String,
    /// The chart's PriorityClass, if any.
    pub priority_class: Option<String>,
    /// How long to wait for the kubelet to run the placeholder before the launch goes on;
    /// zero: do not wait (a node without a kubelet, as in the development control plane).
    pub wait: Duration,
}

/// Why a placeholder did not stand beside its runner. Closed: it reaches logs, events and the
/// `LaunchFailure` that concludes the launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Refusal {
    /// The kubelet refused it: the node's allocatable CPU cannot fit it beside its other pods.
    #[error("the kubelet refused the placeholder: OutOfcpu")]
    OutOfCpu,
    /// The same for memory.
    #[error("the kubelet refused the placeholder: OutOfmemory")]
    OutOfMemory,
    /// The kubelet evicted it (node pressure).
    #[error("the placeholder was evicted")]
    Evicted,
    /// It failed for another reason the kubelet gave.
    #[error("the placeholder failed")]
    Failed,
    /// It did not run within the wait.
    #[error("the placeholder did not run in time")]
    NotRunning,
    /// It was deleted by someone else while awaited.
    #[error("the placeholder was deleted")]
    Deleted,
    /// The API server refused to create it (admission, quota, a missing PriorityClass).
    #[error("the API server refused the placeholder")]
    Forbidden,
    /// The attempt cannot name a pod (no uid, or a name too long for a label).
    #[error("the attempt cannot own a placeholder")]
    Unnamed,
    /// The API server could not be asked.
    #[error("the API server could not be reached")]
    Api,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OutOfCpu => "OutOfcpu",
            Self::OutOfMemory => "OutOfmemory",
            Self::Evicted => "Evicted",
            Self::Failed => "Failed",
            Self::NotRunning => "NotRunning",
            Self::Deleted => "Deleted",
            Self::Forbidden => "Forbidden",
            Self::Unnamed => "Unnamed",
            Self::Api => "Api",
        }
    }
}

/// What the kubelet made of a placeholder, from its status. Pure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted and running: it counts on the node.
    Running,
    /// Not decided yet.
    Pending,
    /// Refused or ended: the runner must not start (or, later, is no longer accounted for).
    Refused(Refusal),
}

/// The kubelet's verdict on `pod`.
pub fn verdict(pod: &Pod) -> Verdict {
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let reason = status.and_then(|s| s.reason.as_deref()).unwrap_or("");
    match phase {
        "Running" => Verdict::Running,
        "Failed" | "Succeeded" => Verdict::Refused(match reason {
            "OutOfcpu" => Refusal::OutOfCpu,
            "OutOfmemory" => Refusal::OutOfMemory,
            "Evicted" => Refusal::Evicted,
            _ => Refusal::Failed,
        }),
        _ => Verdict::Pending,
    }
}

/// The placeholder of `a` on `node`. Pure.
pub fn placeholder_pod(a: &RunnerAttempt, node: &str, settings: &Settings) -> Result<Pod, Refusal> {
    let generation = a.metadata.uid.as_deref().ok_or(Refusal::Unnamed)?;
    let mut metadata = pods::owned_pod_meta(a, node, PodRole::Placeholder, generation)
        .map_err(|_| Refusal::Unnamed)?;
    metadata.annotations = Some(BTreeMap::from([(
        SAFE_TO_EVICT.to_owned(),
        "false".to_owned(),
    )]));
    let mut requests = BTreeMap::<String, Quantity>::new();
    if let Some(r) = a.spec.snapshot.execution.resources.as_ref() {
        if let Some(cpu) = &r.cpu {
            requests.insert("cpu".to_owned(), cpu.clone());
        }
        if let Some(memory) = &r.memory {
            requests.insert("memory".to_owned(), memory.clone());
        }
    }
    let mut spec = pods::confined_spec(node);
    if let Some(sc) = spec.security_context.as_mut() {
        sc.run_as_user = Some(PAUSE_UID);
        sc.run_as_group = Some(PAUSE_UID);
    }
    spec.priority_class_name = settings.priority_class.clone();
    // The pause process holds nothing: removed at once, never waited for.
    spec.termination_grace_period_seconds = Some(0);
    // It stands for a runner that runs whatever the node's taints say (a host process is not
    // evicted by a NoExecute taint), so it stays while the runner does.
    spec.tolerations = Some(vec![Toleration {
        operator: Some("Exists".to_owned()),
        ..Toleration::default()
    }]);
    spec.containers = vec![Container {
        name: CONTAINER.to_owned(),
        image: Some(settings.image.clone()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        // Requests only: they are what the scheduler counts; the runner's own cgroup holds its
        // limits, and the pause process uses next to nothing.
        resources: Some(ResourceRequirements {
            requests: (!requests.is_empty()).then_some(requests),
            ..ResourceRequirements::default()
        }),
        security_context: Some(pods::confined_container()),
        ..Container::default()
    }];
    Ok(Pod {
        metadata,
        spec: Some(spec),
        status: None,
    })
}

fn refusal_of(e: &kube::Error) -> Refusal {
    match e {
        kube::Error::Api(s) if matches!(s.code, 400 | 403 | 422) => Refusal::Forbidden,
        _ => Refusal::Api,
    }
}

/// Creates the placeholder of `a` (or finds the one an earlier try made: one name per attempt)
/// and, with a wait, awaits the kubelet's verdict. `Ok` once it runs, or at once without a wait.
pub async fn ensure(
    kube: &Client,
    a: &RunnerAttempt,
    node: &str,
    settings: &Settings,
) -> Result<(), Refusal> {
    let pod = placeholder_pod(a, node, settings)?;
    let ns = pod.metadata.namespace.clone().ok_or(Refusal::Unnamed)?;
    let name = pod.metadata.name.clone().ok_or(Refusal::Unnamed)?;
    let api = Api::<Pod>::namespaced(kube.clone(), &ns);
    match api.create(&PostParams::default(), &pod).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {
            // Made by an earlier try of this launch: ours if its controller is this attempt.
            let existing = api.get(&name).await.map_err(|e| refusal_of(&e))?;
            if pods::owner_attempt(&existing.metadata).map(|(_, uid)| uid)
                != a.metadata.uid.as_deref()
            {
                return Err(Refusal::Forbidden);
            }
        }
        Err(e) => {
            tracing::warn!(namespace = %ns, attempt = %a.name_any(), "placeholder not created: {e}");
            return Err(refusal_of(&e));
        }
    }
    if settings.wait.is_zero() {
        return Ok(());
    }
    let decided = |p: Option<&Pod>| p.is_none_or(|p| verdict(p) != Verdict::Pending);
    let awaited = tokio::time::timeout(
        settings.wait,
        kube::runtime::wait::await_condition(api.clone(), &name, decided),
    )
    .await;
    let outcome = match awaited {
        Err(_) => Err(Refusal::NotRunning),
        Ok(Err(_)) => Err(Refusal::Api),
        Ok(Ok(None)) => Err(Refusal::Deleted),
        Ok(Ok(Some(p))) => match verdict(&p) {
            Verdict::Running => Ok(()),
            Verdict::Refused(r) => Err(r),
            Verdict::Pending => Err(Refusal::NotRunning),
        },
    };
    if let Err(r) = outcome {
        tracing::warn!(namespace = %ns, attempt = %a.name_any(), reason = r.as_str(), "placeholder refused: the runner is not started");
        // A refused placeholder holds nothing, but its object must not outlive the launch.
        let _ = remove_of(kube, a).await;
    }
    outcome
}

/// Deletes the pod `name` in `namespace` only if it is still the one of uid `uid` (a
/// precondition: a same-named pod made since is not touched). Gone already, or replaced, is
/// fine. Grace 0: the pause process holds nothing, and a node without a kubelet would otherwise
/// keep the object terminating forever.
async fn delete_exact(
    kube: &Client,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<(), kube::Error> {
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match Api::<Pod>::namespaced(kube.clone(), namespace)
        .delete(name, &dp)
        .await
    {
        Ok(_) => Ok(()),
        // 404: gone; 409: the uid precondition failed, the name is another pod's now.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether `pod`'s controller is the attempt of uid `attempt_uid`.
fn owned_by(pod: &Pod, attempt_uid: &str) -> bool {
    pods::owner_attempt(&pod.metadata).map(|(_, uid)| uid) == Some(attempt_uid)
}

/// Removes the placeholder of `a` (after cleanup, or on a failed launch): the pod of its name
/// only if its controller is `a` (by uid), and only that pod (uid precondition). A same-named
/// pod of anyone else stays.
pub async fn remove_of(kube: &Client, a: &RunnerAttempt) -> Result<(), kube::Error> {
    let (Some(ns), Some(attempt_uid)) =
        (a.metadata.namespace.as_deref(), a.metadata.uid.as_deref())
    else {
        return Ok(());
    };
    let name = pods::pod_name(&a.name_any(), PodRole::Placeholder);
    let Some(pod) = Api::<Pod>::namespaced(kube.clone(), ns)
        .get_opt(&name)
        .await?
    else {
        return Ok(());
    };
    let Some(uid) = pod
        .metadata
        .uid
        .as_deref()
        .filter(|_| owned_by(&pod, attempt_uid))
    else {
        tracing::warn!(namespace = %ns, attempt = %a.name_any(), "a pod with the placeholder's name is not this attempt's: left alone");
        return Ok(());
    };
    delete_exact(kube, ns, &name, uid).await
}

/// What [`keep`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kept {
    /// It stands (running, or not yet decided by the kubelet).
    Standing,
    /// It was lost for this reason and has been recreated.
    Recreated(Refusal),
    /// It was lost for the first reason and could not be recreated for the second.
    Lost(Refusal, Refusal),
}

/// What the store's copy of a running runner's placeholder says. Pure.
#[derive(Debug, PartialEq)]
pub enum Loss<'p> {
    /// It stands: running, not yet decided by the kubelet, or being deleted (its deletion's
    /// event comes, and then it is gone).
    Standing,
    /// It is not there, or the pod of its name is not this attempt's (never touched): create.
    Gone(Refusal),
    /// It is this attempt's and ended (evicted, refused, failed): delete exactly it, create.
    Ended(Refusal, &'p Pod),
}

/// Whether the placeholder of the attempt of uid `attempt_uid`, as `found`, was lost. Pure.
pub fn loss<'p>(found: Option<&'p Pod>, attempt_uid: &str) -> Loss<'p> {
    match found {
        None => Loss::Gone(Refusal::Deleted),
        Some(p) if !owned_by(p, attempt_uid) => Loss::Gone(Refusal::Deleted),
        Some(p) if p.metadata.deletion_timestamp.is_some() => Loss::Standing,
        Some(p) => match verdict(p) {
            Verdict::Running | Verdict::Pending => Loss::Standing,
            Verdict::Refused(r) => Loss::Ended(r, p),
        },
    }
}

/// Keeps the placeholder of a running runner standing, as the pod watch's store shows it
/// (`found`: the pod of the placeholder's name there, `None`: not there). One this attempt
/// does not own, or one that ended (evicted, refused, failed), or none at all is lost: an ended
/// one of ours is deleted (uid precondition) and a new one created. The runner is never stopped
/// here.
pub async fn keep(
    kube: &Client,
    a: &RunnerAttempt,
    node: &str,
    settings: &Settings,
    found: Option<&Pod>,
) -> Kept {
    let attempt_uid = a.metadata.uid.as_deref().unwrap_or_default();
    let lost = match loss(found, attempt_uid) {
        Loss::Standing => return Kept::Standing,
        Loss::Gone(r) => r,
        Loss::Ended(r, ended) => {
            let (Some(ns), Some(name), Some(uid)) = (
                ended.metadata.namespace.as_deref(),
                ended.metadata.name.as_deref(),
                ended.metadata.uid.as_deref(),
            ) else {
                return Kept::Lost(r, Refusal::Unnamed);
            };
            if delete_exact(kube, ns, name, uid).await.is_err() {
                return Kept::Lost(r, Refusal::Api);
            }
            r
        }
    };
    let Ok(pod) = placeholder_pod(a, node, settings) else {
        return Kept::Lost(lost, Refusal::Unnamed);
    };
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    match Api::<Pod>::namespaced(kube.clone(), &ns)
        .create(&PostParams::default(), &pod)
        .await
    {
        Ok(_) => Kept::Recreated(lost),
        // Ours, made meanwhile (the store had not shown it yet): it stands.
        Err(kube::Error::Api(s))
            if s.code == 409 && found.is_none_or(|p| owned_by(p, attempt_uid)) =>
        {
            Kept::Standing
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Kept::Lost(lost, Refusal::Forbidden),
        Err(e) => Kept::Lost(lost, refusal_of(&e)),
    }
}

/// The short name (12 hex) of the attempt a pod's attempt label names (`<policy>-<12 hex>`).
fn short_of(pod: &Pod) -> Option<&str> {
    pod.labels()
        .get(pods::ATTEMPT_LABEL)
        .and_then(|n| n.rsplit('-').next())
}

/// The placeholders among `listed` whose attempt no attempt of the node claims (`claimed`: the
/// 12-hex short names, as the orphan sweep counts claims): what the sweep removes. Only a pod a
/// RunnerAttempt controls is one the agent made; one that only carries the labels is someone
/// else's, never removed. Pure.
pub fn orphans<'a>(listed: &'a [Pod], claimed: &BTreeSet<String>) -> Vec<&'a Pod> {
    listed
        .iter()
        .filter(|p| pods::role_of(&p.metadata) == Some(PodRole::Placeholder))
        .filter(|p| pods::owner_attempt(&p.metadata).is_some())
        .filter(|p| short_of(p).is_some_and(|s| !claimed.contains(s)))
        .collect()
}

/// The orphan sweep's part: lists `node`'s placeholders in every namespace and removes those
/// no attempt claims, the claims read after the listing (see `orphans::sweep`). Returns how
/// many were removed.
pub async fn sweep(
    kube: &Client,
    node: &str,
    claims: &(dyn Fn() -> BTreeSet<String> + Sync),
) -> Result<usize, kube::Error> {
    let all = Api::<Pod>::all(kube.clone());
    let lp = ListParams::default().labels(&pods::node_selector(node, Some(PodRole::Placeholder)));
    let listed = all.list(&lp).await?.items;
    let claimed = claims();
    let mut removed = 0;
    for pod in orphans(&listed, &claimed) {
        let (Some(ns), Some(name), Some(uid)) = (
            pod.metadata.namespace.as_deref(),
            pod.metadata.name.as_deref(),
            pod.metadata.uid.as_deref(),
        ) else {
            continue;
        };
        // The pod listed, and only it: one made since under the name is not touched.
        delete_exact(kube, ns, name, uid).await?;
        removed += 1;
    }
    Ok(removed)
}

impl Settings {
    /// From the agent's flags: no image, no placeholders.
    pub fn from_flags(image: &str, priority_class: &str, wait_seconds: u64) -> Option<Self> {
        (!image.is_empty()).then(|| Self {
            image: image.to_owned(),
            priority_class: (!priority_class.is_empty()).then(|| priority_class.to_owned()),
            wait: Duration::from_secs(wait_seconds),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;

    fn attempt(cpu: Option<&str>, memory: Option<&str>) -> RunnerAttempt {
        let mut resources = serde_json::Map::new();
        if let Some(c) = cpu {
            resources.insert("cpu".into(), c.into());
        }
        if let Some(m) = memory {
            resources.insert("memory".into(), m.into());
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "runner-manager.dev/v1alpha1", "kind": "RunnerAttempt",
            "metadata": {"name": "web-3f2a9c0177aa", "namespace": "team", "uid": "u-1"},
            "spec": {
                "id": "3f2a9c01-77aa-4bcd-8e00-123456789abc", "policy": "web", "nodeName": "n1",
                "snapshot": {
                    "policyUid": "p", "target": {"url": "https://github.com/o/r", "scope": "Repository"},
                    "labels": [], "runnerGroupId": 1, "workspace": "Ephemeral", "maxSlots": 1,
                    "execution": {"mode": "Native", "resources": resources},
                    "runner": {"version": "2.330.0", "url": "https://example.invalid/r.tgz", "sha256": "0".repeat(64)},
                    "timeouts": {"registration": "5m", "idle": "5m", "jitHandoff": "2m"}
                }
            }
        }))
        .expect("a valid attempt")
    }

    fn settings() -> Settings {
        Settings {
            image: "pause:1".into(),
            priority_class: Some("rm-placeholder".into()),
            wait: Duration::ZERO,
        }
    }

    #[test]
    fn a_placeholder_requests_the_policys_resources_and_is_not_evictable_by_autoscalers() {
        let pod =
            placeholder_pod(&attempt(Some("1500m"), Some("2Gi")), "n1", &settings()).expect("pod");
        assert_eq!(
            pod.metadata.name.as_deref(),
            Some("web-3f2a9c0177aa-placeholder")
        );
        assert_eq!(
            pod.metadata.annotations.as_ref().expect("annotations")[SAFE_TO_EVICT],
            "false"
        );
        assert_eq!(pods::role_of(&pod.metadata), Some(PodRole::Placeholder));
        assert_eq!(
            pods::owner_attempt(&pod.metadata),
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
    }

    #[test]
    fn a_policy_without_resources_gets_a_placeholder_without_requests() {
        let pod = placeholder_pod(&attempt(None, None), "n1", &settings()).expect("pod");
        let spec = pod.spec.expect("spec");
        assert!(
            spec.containers[0]
                .resources
                .as_ref()
                .expect("resources")
                .requests
                .is_none()
        );
    }

    fn with_status(phase: &str, reason: Option<&str>) -> Pod {
        Pod {
            status: Some(PodStatus {
                phase: Some(phase.into()),
                reason: reason.map(str::to_owned),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn the_kubelets_refusals_are_closed_verdicts() {
        assert_eq!(verdict(&with_status("Running", None)), Verdict::Running);
        assert_eq!(verdict(&with_status("Pending", None)), Verdict::Pending);
        assert_eq!(verdict(&Pod::default()), Verdict::Pending);
        assert_eq!(
            verdict(&with_status("Failed", Some("OutOfcpu"))),
            Verdict::Refused(Refusal::OutOfCpu)
        );
        assert_eq!(
            verdict(&with_status("Failed", Some("OutOfmemory"))),
            Verdict::Refused(Refusal::OutOfMemory)
        );
        assert_eq!(
            verdict(&with_status("Failed", Some("Evicted"))),
            Verdict::Refused(Refusal::Evicted)
        );
        assert_eq!(
            verdict(&with_status("Failed", Some("NodeAffinity"))),
            Verdict::Refused(Refusal::Failed)
        );
    }

    #[test]
    fn a_running_runners_placeholder_is_lost_when_gone_ended_or_not_its_own() {
        let mine = placeholder_pod(&attempt(None, None), "n1", &settings()).expect("pod");
        let with = |phase: &str, reason: Option<&str>| {
            let mut p = mine.clone();
            p.status = with_status(phase, reason).status;
            p
        };
        assert_eq!(loss(None, "u-1"), Loss::Gone(Refusal::Deleted));
        assert_eq!(loss(Some(&mine), "u-1"), Loss::Standing, "not decided yet");
        let running = with("Running", None);
        assert_eq!(loss(Some(&running), "u-1"), Loss::Standing);
        let evicted = with("Failed", Some("Evicted"));
        assert_eq!(
            loss(Some(&evicted), "u-1"),
            Loss::Ended(Refusal::Evicted, &evicted)
        );
        let refused = with("Failed", Some("OutOfcpu"));
        assert_eq!(
            loss(Some(&refused), "u-1"),
            Loss::Ended(Refusal::OutOfCpu, &refused)
        );
        assert_eq!(
            loss(Some(&running), "u-2"),
            Loss::Gone(Refusal::Deleted),
            "a same-named pod of another owner is never ours to delete"
        );
        let mut deleting = evicted.clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(loss(Some(&deleting), "u-1"), Loss::Standing);
    }

    #[test]
    fn the_sweep_takes_only_placeholders_whose_attempt_is_unclaimed() {
        let relabel = |pod: &Pod, key: &str, value: &str| {
            let mut p = pod.clone();
            p.metadata
                .labels
                .as_mut()
                .expect("labels")
                .insert(key.into(), value.into());
            p
        };
        let mine = placeholder_pod(&attempt(None, None), "n1", &settings()).expect("pod");
        let other = relabel(&mine, pods::ATTEMPT_LABEL, "web-00000000dead");
        let runner = relabel(&other, pods::ROLE_LABEL, "runner");
        // Someone else's pod with a placeholder's labels and no RunnerAttempt controller.
        let mut unowned = relabel(&mine, pods::ATTEMPT_LABEL, "web-0000000000ff");
        unowned.metadata.owner_references = None;
        let listed = [mine, other, runner, unowned];
        let claimed = BTreeSet::from(["3f2a9c0177aa".to_owned()]);
        let swept = orphans(&listed, &claimed);
        assert_eq!(swept.len(), 1);
        assert_eq!(short_of(swept[0]), Some("00000000dead"));
        assert_eq!(
            pods::role_of(&swept[0].metadata),
            Some(PodRole::Placeholder)
        );
    }
}
