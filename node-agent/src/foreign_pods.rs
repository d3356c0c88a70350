//! The node's pods of other workloads, watched for what they request (issue 16): the scheduler
//! and the kubelet count every pod bound to a node, so placement must too, or it chooses a node
//! whose kubelet refuses the placeholder (`OutOfcpu`/`OutOfmemory`). The agent already sees its
//! node; the operator would need a watch of every pod of the cluster. So the agent keeps one
//! reflector over the pods bound to its node (`spec.nodeName=<node>`) *without* the role label
//! (`!runner-manager.dev/pod-role`: our runner pods and placeholders are counted by their
//! attempts already) and publishes their sum in its Lease advert
//! (`AgentAdvert::foreign_requests`), which rides the heartbeat's renewal: no write of its own.
//!
//! What a pod requests is simplified from the scheduler's rule: per resource the larger of the
//! sum of its containers' requests and the largest init container's request, plus the pod's
//! `overhead`. Restartable (sidecar) init containers are treated as ordinary init containers,
//! and in-place resizes are read from the spec, not from the status.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use runner_manager_crds::lease::ForeignRequests;
use runner_manager_crds::validate::{parse_cpu_millis, parse_memory_bytes};

use crate::pod_watch::node_field_selector;
use crate::pods::ROLE_LABEL;

/// Other workloads' pods on the agent's node, as the watch last showed them.
pub struct ForeignPods {
    store: Store<Pod>,
    /// Taken once by [`ForeignPods::run`].
    writer: Mutex<Option<reflector::store::Writer<Pod>>>,
    /// The watch listed once: only then is the sum published.
    ready: AtomicBool,
}

impl std::fmt::Debug for ForeignPods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForeignPods")
            .field("ready", &self.ready.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Default for ForeignPods {
    fn default() -> Self {
        let (store, writer) = reflector::store();
        Self {
            store,
            writer: Mutex::new(Some(writer)),
            ready: AtomicBool::new(false),
        }
    }
}

/// The label selector of pods that are not ours.
pub fn foreign_label_selector() -> String {
    format!("!{ROLE_LABEL}")
}

impl ForeignPods {
    /// What the node's other pods request; `None` before the watch has listed (unknown, so
    /// the operator's placement keeps its earlier view rather than reading zero).
    pub fn requests(&self) -> Option<ForeignRequests> {
        if !self.ready.load(Ordering::Acquire) {
            return None;
        }
        Some(sum(self.store.state().iter().map(AsRef::as_ref)))
    }

    /// Watches the node's foreign pods until the process ends (a second call returns at once).
    pub async fn run(&self, kube: Client, node: String) {
        let Some(writer) = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        else {
            return;
        };
        let config = watcher::Config::default()
            .labels(&foreign_label_selector())
            .fields(&node_field_selector(&node));
        let mut events = std::pin::pin!(
            watcher::watcher(Api::<Pod>::all(kube), config)
                .default_backoff()
                .modify(|p| p.managed_fields_mut().clear())
                .reflect(writer)
        );
        let ready = async {
            if self.store.wait_until_ready().await.is_ok() {
                self.ready.store(true, Ordering::Release);
            }
            std::future::pending::<()>().await;
        };
        let drain = async {
            while let Some(event) = events.next().await {
                if let Err(e) = event {
                    tracing::debug!("foreign pod watch: {e}");
                }
            }
        };
        tokio::select! {
            () = ready => {}
            () = drain => {}
        }
    }
}

/// Whether the pod still holds its node's resources (the scheduler frees them once it ends).
fn holds_resources(pod: &Pod) -> bool {
    !matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn requests(c: &Container) -> ForeignRequests {
    let r = c.resources.as_ref().and_then(|r| r.requests.as_ref());
    let get = |k: &str, parse: fn(&Quantity) -> Option<u64>| {
        r.and_then(|r| r.get(k)).and_then(parse).unwrap_or(0)
    };
    ForeignRequests {
        cpu_millis: get("cpu", parse_cpu_millis),
        memory_bytes: get("memory", parse_memory_bytes),
    }
}

/// What one pod requests (the module's simplified scheduler rule).
pub fn pod_requests(pod: &Pod) -> ForeignRequests {
    let Some(spec) = pod.spec.as_ref() else {
        return ForeignRequests::default();
    };
    let add = |a: ForeignRequests, b: ForeignRequests| ForeignRequests {
        cpu_millis: a.cpu_millis.saturating_add(b.cpu_millis),
        memory_bytes: a.memory_bytes.saturating_add(b.memory_bytes),
    };
    let max = |a: ForeignRequests, b: ForeignRequests| ForeignRequests {
        cpu_millis: a.cpu_millis.max(b.cpu_millis),
        memory_bytes: a.memory_bytes.max(b.memory_bytes),
    };
    let containers = spec
        .containers
        .iter()
        .map(requests)
        .fold(ForeignRequests::default(), add);
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(requests)
        .fold(ForeignRequests::default(), max);
    let overhead = spec.overhead.as_ref();
    let overhead = ForeignRequests {
        cpu_millis: overhead
            .and_then(|o| o.get("cpu"))
            .and_then(parse_cpu_millis)
            .unwrap_or(0),
        memory_bytes: overhead
            .and_then(|o| o.get("memory"))
            .and_then(parse_memory_bytes)
            .unwrap_or(0),
    };
    add(max(containers, init), overhead)
}

/// What the pods that still hold resources request together.
pub fn sum<'a>(pods: impl Iterator<Item = &'a Pod>) -> ForeignRequests {
    pods.filter(|p| holds_resources(p)).map(pod_requests).fold(
        ForeignRequests::default(),
        |a, b| ForeignRequests {
            cpu_millis: a.cpu_millis.saturating_add(b.cpu_millis),
            memory_bytes: a.memory_bytes.saturating_add(b.memory_bytes),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(phase: &str, spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db", "namespace": "other"},
            "spec": spec,
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    fn c(cpu: &str, memory: &str) -> serde_json::Value {
        serde_json::json!({"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}})
    }

    #[test]
    fn a_pod_requests_its_containers_or_its_largest_init_container_whichever_is_more() {
        let p = pod(
            "Running",
            serde_json::json!({
                "containers": [c("500m", "1Gi"), c("250m", "1Gi")],
                "initContainers": [c("1", "512Mi"), c("100m", "256Mi")],
                "overhead": {"cpu": "10m"}
            }),
        );
        assert_eq!(
            pod_requests(&p),
            ForeignRequests {
                cpu_millis: 1010,
                memory_bytes: 2 << 30
            }
        );
        let bare = pod(
            "Pending",
            serde_json::json!({"containers": [{"name": "c"}]}),
        );
        assert_eq!(pod_requests(&bare), ForeignRequests::default());
    }

    #[test]
    fn ended_pods_hold_nothing() {
        let spec = || serde_json::json!({"containers": [c("1", "1Gi")]});
        let pods = [
            pod("Running", spec()),
            pod("Pending", spec()),
            pod("Succeeded", spec()),
            pod("Failed", spec()),
        ];
        assert_eq!(
            sum(pods.iter()),
            ForeignRequests {
                cpu_millis: 2000,
                memory_bytes: 2 << 30
            }
        );
        assert_eq!(foreign_label_selector(), "!runner-manager.dev/pod-role");
    }

    #[test]
    fn a_watch_that_has_not_listed_knows_nothing() {
        assert_eq!(ForeignPods::default().requests(), None);
    }
}
