//! What a runner pod's status says, in a closed vocabulary (pure): the launch waits for
//! [`PodObservation::Running`], supervision reads alive or gone and how it ended. Nothing a
//! workflow or the image controls (messages, container output) is kept: only the kubelet's
//! reason *kinds* the agent recognises, everything else is `Other`.

use k8s_openapi::api::core::v1::Pod;

/// Why a pod is not running yet. Closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waiting {
    /// Not bound or not yet seen by the kubelet (no container status).
    NotStarted,
    /// The kubelet cannot pull the image (`ErrImagePull`, `ImagePullBackOff`,
    /// `InvalidImageName`, `ErrImageNeverPull`).
    ImagePull,
    /// The container is being created, or waits for another reason.
    Creating,
}

/// How a pod that no longer runs ended. Closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The container exited with this code (`OOMKilled` reads as its own kind).
    Exited(i32),
    /// The kernel's OOM killer ended it.
    OomKilled,
    /// The kubelet evicted the pod (node pressure) or an eviction API call did.
    Evicted,
    /// The kubelet refused the pod for want of CPU or memory on the node (`OutOfcpu`,
    /// `OutOfmemory`): the node's state, not the runner's.
    OutOfResources,
    /// The pod failed without a container exit for another reason (the kubelet refused it: a
    /// node affinity mismatch, a deadline).
    Refused,
    /// The pod is gone from the API server (deleted by someone, or by its owner's deletion).
    Deleted,
}

/// A runner pod as the agent sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodObservation {
    Waiting(Waiting),
    Running,
    Ended(Ended),
}

impl PodObservation {
    /// Whether the runner may still be running (or about to): not yet ended.
    pub fn is_alive(self) -> bool {
        !matches!(self, Self::Ended(_))
    }

    /// The exit code supervision reads, when the container exited with one.
    pub fn exit_code(self) -> Option<i32> {
        match self {
            Self::Ended(Ended::Exited(c)) => Some(c),
            Self::Ended(Ended::OomKilled) => Some(137),
            _ => None,
        }
    }
}

const IMAGE_PULL_REASONS: [&str; 4] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
];

/// Classifies a pod read from the API server (`None`: it is not there).
pub fn observe(pod: Option<&Pod>) -> PodObservation {
    let Some(pod) = pod else {
        return PodObservation::Ended(Ended::Deleted);
    };
    let Some(status) = pod.status.as_ref() else {
        return PodObservation::Waiting(Waiting::NotStarted);
    };
    let container = status.container_statuses.as_ref().and_then(|c| {
        c.iter()
            .find(|c| c.name == runner_manager_crds::pods::RUNNER_CONTAINER)
    });
    let terminated = container
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref());
    match status.phase.as_deref() {
        Some("Succeeded") | Some("Failed") => {
            match status.reason.as_deref() {
                Some("Evicted") => return PodObservation::Ended(Ended::Evicted),
                Some("OutOfcpu" | "OutOfmemory") if terminated.is_none() => {
                    return PodObservation::Ended(Ended::OutOfResources);
                }
                _ => {}
            }
            return PodObservation::Ended(match terminated {
                Some(t) if t.reason.as_deref() == Some("OOMKilled") => Ended::OomKilled,
                Some(t) => Ended::Exited(t.exit_code),
                None => Ended::Refused,
            });
        }
        _ => {}
    }
    if let Some(t) = terminated {
        // Phase not updated yet: the container's own state is the newer word.
        return PodObservation::Ended(if t.reason.as_deref() == Some("OOMKilled") {
            Ended::OomKilled
        } else {
            Ended::Exited(t.exit_code)
        });
    }
    let state = container.and_then(|c| c.state.as_ref());
    if state.and_then(|s| s.running.as_ref()).is_some() {
        return PodObservation::Running;
    }
    match state.and_then(|s| s.waiting.as_ref()) {
        Some(w)
            if w.reason
                .as_deref()
                .is_some_and(|r| IMAGE_PULL_REASONS.contains(&r)) =>
        {
            PodObservation::Waiting(Waiting::ImagePull)
        }
        Some(_) => PodObservation::Waiting(Waiting::Creating),
        None => PodObservation::Waiting(Waiting::NotStarted),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
        ContainerStatus, PodStatus,
    };

    fn with(phase: &str, reason: Option<&str>, state: Option<ContainerState>) -> Pod {
        Pod {
            status: Some(PodStatus {
                phase: Some(phase.to_owned()),
                reason: reason.map(str::to_owned),
                container_statuses: state.map(|s| {
                    vec![ContainerStatus {
                        name: "runner".to_owned(),
                        state: Some(s),
                        ..ContainerStatus::default()
                    }]
                }),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    fn terminated(code: i32, reason: &str) -> ContainerState {
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                reason: Some(reason.to_owned()),
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        }
    }

    fn waiting(reason: &str) -> ContainerState {
        ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.to_owned()),
                message: Some("secret-looking message never kept".to_owned()),
            }),
            ..ContainerState::default()
        }
    }

    #[test]
    fn each_pod_status_reads_as_its_closed_kind() {
        use PodObservation as O;
        assert_eq!(observe(None), O::Ended(Ended::Deleted));
        assert_eq!(
            observe(Some(&Pod::default())),
            O::Waiting(Waiting::NotStarted)
        );
        assert_eq!(
            observe(Some(&with("Pending", None, None))),
            O::Waiting(Waiting::NotStarted)
        );
        for r in IMAGE_PULL_REASONS {
            assert_eq!(
                observe(Some(&with("Pending", None, Some(waiting(r))))),
                O::Waiting(Waiting::ImagePull),
                "{r}"
            );
        }
        assert_eq!(
            observe(Some(&with(
                "Pending",
                None,
                Some(waiting("ContainerCreating"))
            ))),
            O::Waiting(Waiting::Creating)
        );
        let running = ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..ContainerState::default()
        };
        assert_eq!(
            observe(Some(&with("Running", None, Some(running)))),
            O::Running
        );
        assert_eq!(
            observe(Some(&with(
                "Failed",
                None,
                Some(terminated(137, "OOMKilled"))
            ))),
            O::Ended(Ended::OomKilled)
        );
        assert_eq!(
            observe(Some(&with("Running", None, Some(terminated(1, "Error"))))),
            O::Ended(Ended::Exited(1)),
            "a terminated container ends the pod before the phase says so"
        );
        assert_eq!(
            observe(Some(&with(
                "Succeeded",
                None,
                Some(terminated(0, "Completed"))
            ))),
            O::Ended(Ended::Exited(0))
        );
        // A pod the kubelet failed, by the reason it gave.
        let failed = |reason| observe(Some(&with("Failed", Some(reason), None)));
        assert_eq!(failed("Evicted"), O::Ended(Ended::Evicted));
        assert_eq!(failed("OutOfcpu"), O::Ended(Ended::OutOfResources));
        assert_eq!(failed("OutOfmemory"), O::Ended(Ended::OutOfResources));
        assert_eq!(failed("NodeAffinity"), O::Ended(Ended::Refused));
    }

    #[test]
    fn only_an_ended_pod_is_gone_and_oom_reads_as_137() {
        assert!(PodObservation::Running.is_alive());
        assert!(PodObservation::Waiting(Waiting::ImagePull).is_alive());
        assert!(!PodObservation::Ended(Ended::Deleted).is_alive());
        assert_eq!(
            PodObservation::Ended(Ended::OomKilled).exit_code(),
            Some(137)
        );
        assert_eq!(PodObservation::Ended(Ended::Evicted).exit_code(), None);
    }
}
