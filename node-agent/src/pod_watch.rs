//! The pods this agent made on its node, watched (issue 16): one reflector over every pod with
//! the role label (`runner-manager.dev/pod-role`: OCI runner pods and placeholders) bound to the
//! node (`spec.nodeName=<node>`, a field selector the API server applies). One initial list,
//! then incremental events, instead of a read of the API server every 200 ms per starting pod.
//!
//! - The OCI provider reads its pods from the store ([`PodWatch::get`]) and waits on its events
//!   ([`PodWatch::changed`]); a pod the store does not hold (a create the watch has not shown
//!   yet, or a deletion) is read once from the API server before anything is concluded from its
//!   absence.
//! - The same events trigger the reconcile of the owning attempt (the agent's Controller maps
//!   each pod to its attempt by the controller owner reference: `Controller::owns_stream`), so
//!   a runner pod that ended or a placeholder deleted or evicted is seen at once, not at the
//!   next supervision interval.
//!
//! Without `--oci` and without placeholders the agent makes no pod and nothing is watched: the
//! store stays empty and not running, and the few reads an OCI attempt left by an earlier run
//! needs go to the API server.
//!
//! RBAC cannot restrict a list or watch by field, so the agent's role still grants list/watch of
//! pods cluster-wide; the field selector only confines what it asks for (docs/oci.md).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::{Stream, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use crate::pods;

/// The agent's pods on its node, as the watch last showed them.
pub struct PodWatch {
    store: Store<Pod>,
    /// Taken once by [`PodWatch::stream`].
    writer: Mutex<Option<reflector::store::Writer<Pod>>>,
    /// Bumped on every event the watch shows.
    changed: tokio::sync::watch::Sender<u64>,
    /// The watch runs (its stream was taken and has listed once).
    running: AtomicBool,
}

impl std::fmt::Debug for PodWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodWatch")
            .field("running", &self.running.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Default for PodWatch {
    fn default() -> Self {
        let (store, writer) = reflector::store();
        Self {
            store,
            writer: Mutex::new(Some(writer)),
            changed: tokio::sync::watch::channel(0).0,
            running: AtomicBool::new(false),
        }
    }
}

/// The field selector of the pods bound to `node`.
pub fn node_field_selector(node: &str) -> String {
    format!("spec.nodeName={node}")
}

impl PodWatch {
    /// Whether the store holds the node's pods (the watch listed them once): only then is its
    /// word taken.
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// The pod `ns/name` as the store holds it (`None`: not held, or the watch does not run).
    pub fn get(&self, ns: &str, name: &str) -> Option<std::sync::Arc<Pod>> {
        if !self.is_running() {
            return None;
        }
        self.store.get(&ObjectRef::new(name).within(ns))
    }

    /// A receiver that sees the next event the watch shows (subscribe before looking, then
    /// await `changed()`: no event between the look and the wait is missed).
    pub fn changed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Waits for the next event, at most `max` (a backstop: nothing is decided on the wake-up
    /// alone, the caller looks again).
    pub async fn next_change(rx: &mut tokio::sync::watch::Receiver<u64>, max: Duration) {
        let _ = tokio::time::timeout(max, rx.changed()).await;
    }

    /// The watch of the node's pods, reflected into the store: the stream of pods each event
    /// touched (applied or deleted), for the Controller's `owns_stream`. `None` when it was
    /// already taken.
    pub fn stream(
        &self,
        kube: &Client,
        node: &str,
    ) -> Option<impl Stream<Item = Result<Pod, watcher::Error>> + Send + 'static + use<>> {
        let writer = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()?;
        let api = Api::<Pod>::all(kube.clone());
        let config = watcher::Config::default()
            .labels(pods::ROLE_LABEL)
            .fields(&node_field_selector(node));
        let changed = self.changed.clone();
        Some(
            watcher::watcher(api, config)
                .default_backoff()
                // What the store keeps: no managed fields (most of a pod object's bytes).
                .modify(|p| p.managed_fields_mut().clear())
                .reflect(writer)
                .inspect_ok(move |_| changed.send_modify(|n| *n = n.wrapping_add(1)))
                .touched_objects(),
        )
    }

    /// Marks the watch as running once its store is ready (the first complete list).
    pub async fn mark_running_when_ready(&self) {
        if self.store.wait_until_ready().await.is_ok() {
            self.running.store(true, Ordering::Release);
            self.changed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_that_does_not_run_holds_nothing() {
        let w = PodWatch::default();
        assert!(!w.is_running());
        assert!(w.get("team", "web-3f2a9c0177aa-runner").is_none());
        assert_eq!(node_field_selector("n1"), "spec.nodeName=n1");
    }
}
