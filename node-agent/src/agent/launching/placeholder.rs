//! Placeholder pods (DESIGN §12 "Kubernetes sees every runner", issue 16 item 4): a native runner
//! is a host process the scheduler cannot see, so beside each one the agent keeps a pod on the
//! runner's node — ordered from the operator, which builds it (issue 28: the agent holds no pod
//! write right; `runner_manager_crds::pods::placeholder_pod`) — the pause image, the policy's resources as requests, owned by the attempt,
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
//! Every removal carries a uid precondition: only a pod whose controller is this attempt (by
//! uid) is removed, never a same-named pod someone else made. The broker checks the same and
//! that the pod is on the caller's node.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::broker::{OrderedPod, PodOrder};

use crate::broker_client::{BrokerClient, Ordered, PodOrderError};
use crate::pods::{self, PodRole};

/// After a placeholder was recreated (or its recreation refused), the next recreation of the
/// same attempt's waits this long: a kubelet that refuses it for resources would otherwise be
/// asked again on every event its refusal makes.
pub const KEEP_RETRY: Duration = Duration::from_secs(30);
/// How the agent keeps placeholders (`--placeholders`, `--placeholder-wait-seconds`; the
/// chart's `placeholders.*`). Their image and PriorityClass are the operator's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
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
    /// The broker or the API server refused to make it (admission, quota, a missing
    /// PriorityClass, an operator without placeholders configured).
    #[error("the placeholder was refused")]
    Forbidden,
    /// The attempt cannot name a pod (no uid, or a name too long for a label).
    #[error("the attempt cannot own a placeholder")]
    Unnamed,
    /// The API server or the broker could not be asked.
    #[error("the API server or the broker could not be reached")]
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
    /// Admitted by the kubelet: it counts on the node. Running, or still `Pending` with the
    /// kubelet's acknowledgement (`status.startTime`): the kubelet writes that only for a pod
    /// it admitted (a pod it refuses is `Failed` in the same status write), before it creates
    /// the pod's sandbox. Waiting for `Running` waited for the sandbox and the pause container
    /// too, which hold nothing the runner needs (issue 32: most of the real node's `prepare`).
    Admitted,
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
        "Running" => Verdict::Admitted,
        "Pending" if status.is_some_and(|s| s.start_time.is_some()) => Verdict::Admitted,
        "Failed" | "Succeeded" => Verdict::Refused(match reason {
            "OutOfcpu" => Refusal::OutOfCpu,
            "OutOfmemory" => Refusal::OutOfMemory,
            "Evicted" => Refusal::Evicted,
            _ => Refusal::Failed,
        }),
        _ => Verdict::Pending,
    }
}

/// Why a placeholder could not be removed. Closed.
#[derive(Debug, thiserror::Error)]
pub enum RemoveError {
    #[error("the placeholder could not be read: {0}")]
    Read(#[from] kube::Error),
    #[error("the placeholder's removal: {0}")]
    Order(#[from] PodOrderError),
}

fn order_refusal(e: PodOrderError) -> Refusal {
    match e {
        // A pod of the placeholder's name that is not this attempt's (the broker checked).
        PodOrderError::Conflict => Refusal::Forbidden,
        PodOrderError::Refused(400 | 403 | 404 | 422) => Refusal::Forbidden,
        PodOrderError::Refused(_) | PodOrderError::Unreachable => Refusal::Api,
    }
}

/// Orders the placeholder of `a` from the broker (an order repeated meets the pod the first
/// made: one name per attempt).
async fn order(broker: &BrokerClient, a: &RunnerAttempt) -> Result<Ordered, Refusal> {
    let (Some(ns), Some(uid)) = (a.metadata.namespace.as_deref(), a.metadata.uid.as_deref()) else {
        return Err(Refusal::Unnamed);
    };
    let order = PodOrder {
        attempt_uid: uid.to_owned(),
        pod: OrderedPod::Placeholder,
    };
    broker
        .order_pod(ns, &a.name_any(), &order)
        .await
        .map_err(order_refusal)
}

/// Orders the placeholder of `a` (or meets the one an earlier try made) and, with a wait,
/// awaits the kubelet's verdict. `Ok` once it runs, or at once without a wait.
pub async fn ensure(
    kube: &Client,
    broker: &BrokerClient,
    a: &RunnerAttempt,
    settings: &Settings,
) -> Result<(), Refusal> {
    let ns = a.metadata.namespace.clone().ok_or(Refusal::Unnamed)?;
    let name = pods::pod_name(&a.name_any(), PodRole::Placeholder);
    if let Err(r) = order(broker, a).await {
        tracing::warn!(namespace = %ns, attempt = %a.name_any(), reason = r.as_str(), "placeholder not made");
        return Err(r);
    }
    if settings.wait.is_zero() {
        return Ok(());
    }
    let api = Api::<Pod>::namespaced(kube.clone(), &ns);
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
            Verdict::Admitted => Ok(()),
            Verdict::Refused(r) => Err(r),
            Verdict::Pending => Err(Refusal::NotRunning),
        },
    };
    if let Err(r) = outcome {
        tracing::warn!(namespace = %ns, attempt = %a.name_any(), reason = r.as_str(), "placeholder refused: the runner is not started");
        // A refused placeholder holds nothing, but its object must not outlive the launch.
        let _ = remove_of(kube, broker, a).await;
    }
    outcome
}

/// Whether `pod`'s controller is the attempt of uid `attempt_uid`.
fn owned_by(pod: &Pod, attempt_uid: &str) -> bool {
    pods::owner_attempt(&pod.metadata).map(|(_, uid)| uid) == Some(attempt_uid)
}

/// Removes the placeholder of `a` (after cleanup, or on a failed launch): the pod of its name
/// only if its controller is `a` (by uid), and only that pod (uid precondition). A same-named
/// pod of anyone else stays.
pub async fn remove_of(
    kube: &Client,
    broker: &BrokerClient,
    a: &RunnerAttempt,
) -> Result<(), RemoveError> {
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
    Ok(broker.remove_pod(ns, &name, uid).await?)
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
            Verdict::Admitted | Verdict::Pending => Loss::Standing,
            Verdict::Refused(r) => Loss::Ended(r, p),
        },
    }
}

/// Keeps the placeholder of a running runner standing, as the pod watch's store shows it
/// (`found`: the pod of the placeholder's name there, `None`: not there). One this attempt
/// does not own, or one that ended (evicted, refused, failed), or none at all is lost: an ended
/// one of ours is removed (uid precondition) and a new one ordered. The runner is never stopped
/// here.
pub async fn keep(broker: &BrokerClient, a: &RunnerAttempt, found: Option<&Pod>) -> Kept {
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
            if let Err(e) = broker.remove_pod(ns, name, uid).await {
                return Kept::Lost(r, order_refusal(e));
            }
            r
        }
    };
    match order(broker, a).await {
        Ok(Ordered::Made(_)) => Kept::Recreated(lost),
        // Ours, made meanwhile (the store had not shown it yet): it stands.
        Ok(Ordered::Existing(_)) => Kept::Standing,
        Err(refused) => Kept::Lost(lost, refused),
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
    broker: &BrokerClient,
    node: &str,
    claims: &(dyn Fn() -> BTreeSet<String> + Sync),
) -> Result<usize, RemoveError> {
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
        broker.remove_pod(ns, name, uid).await?;
        removed += 1;
    }
    Ok(removed)
}

impl Settings {
    /// From the agent's flags: `--placeholders=false`, no placeholders.
    pub fn from_flags(enabled: bool, wait_seconds: u64) -> Option<Self> {
        enabled.then(|| Self {
            wait: Duration::from_secs(wait_seconds),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;

    fn attempt(cpu: Option<&str>, memory: Option<&str>) -> RunnerAttempt {
        runner_manager_crds::fixtures::AttemptBuilder::new("web-3f2a9c0177aa", "web")
            .namespace("team")
            .uid("u-1")
            .resources(cpu, memory)
            .build()
    }

    /// The placeholder the broker makes for `a` (`runner_manager_crds::pods`).
    fn made(a: &RunnerAttempt) -> Pod {
        pods::placeholder_pod(
            a,
            "n1",
            &pods::PlaceholderSpec {
                image: "pause:1".into(),
                priority_class: None,
            },
        )
        .expect("pod")
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
        assert_eq!(verdict(&with_status("Running", None)), Verdict::Admitted);
        assert_eq!(verdict(&with_status("Pending", None)), Verdict::Pending);
        // Acknowledged by the kubelet: admitted, before its sandbox exists.
        let mut acknowledged = with_status("Pending", None);
        if let Some(s) = acknowledged.status.as_mut() {
            s.start_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        }
        assert_eq!(verdict(&acknowledged), Verdict::Admitted);
        // A refusal carries a start time too (the kubelet's status manager sets one on its
        // first write): the phase decides.
        let mut refused = with_status("Failed", Some("OutOfcpu"));
        if let Some(s) = refused.status.as_mut() {
            s.start_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        }
        assert_eq!(verdict(&refused), Verdict::Refused(Refusal::OutOfCpu));
        assert_eq!(verdict(&Pod::default()), Verdict::Pending);
        for (reason, refusal) in [
            ("OutOfcpu", Refusal::OutOfCpu),
            ("OutOfmemory", Refusal::OutOfMemory),
            ("Evicted", Refusal::Evicted),
            ("NodeAffinity", Refusal::Failed),
        ] {
            assert_eq!(
                verdict(&with_status("Failed", Some(reason))),
                Verdict::Refused(refusal),
                "{reason}"
            );
        }
    }

    #[test]
    fn a_running_runners_placeholder_is_lost_when_gone_ended_or_not_its_own() {
        let mine = made(&attempt(None, None));
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
        let mine = made(&attempt(None, None));
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
