//! The controllers' view of the cluster: one reflector (watch + local store) per kind, so a
//! reconcile reads memory, not the API server. Each reflector hands the objects its events
//! touched to whoever subscribed ([`Touched`]): the leader's `Controller<ScalePolicy>` while it
//! runs, which maps them to the policies they affect. The reflectors run on every replica (the
//! webhook receivers match against the policies), so a new leader starts on warm stores.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::policy::ScalePolicy;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

/// The subscribers to one reflector's touched objects. A subscriber that went away (the
/// Controller stopped with leadership) is dropped at the next event. Unbounded: the
/// Controller's scheduler takes every item at once (it deduplicates by object), so nothing
/// accumulates while it runs, and with no subscriber nothing is kept.
pub struct Touched<K>(Arc<std::sync::Mutex<Vec<mpsc::UnboundedSender<K>>>>);

impl<K> Clone for Touched<K> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<K> Default for Touched<K> {
    fn default() -> Self {
        Self(Arc::default())
    }
}

impl<K: Clone> Touched<K> {
    fn send(&self, object: &K) {
        let Ok(mut subscribers) = self.0.lock() else {
            return;
        };
        subscribers.retain(|s| s.send(object.clone()).is_ok());
    }

    /// Every object touched from now on, as the `Controller`'s trigger streams take them.
    pub fn subscribe(
        &self,
    ) -> impl futures_util::Stream<Item = Result<K, kube::runtime::watcher::Error>> + Send + 'static
    where
        K: Send + 'static,
    {
        let (tx, mut rx) = mpsc::unbounded_channel();
        if let Ok(mut subscribers) = self.0.lock() {
            subscribers.push(tx);
        }
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(Ok)))
    }
}

impl<K> std::fmt::Debug for Touched<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Touched").finish_non_exhaustive()
    }
}

/// The stores the controllers read.
#[derive(Clone)]
pub struct Caches {
    pub policies: Store<ScalePolicy>,
    pub attempts: Store<RunnerAttempt>,
    pub leases: Store<Lease>,
    pub nodes: Store<Node>,
    pub touched: Triggers,
}

/// What each reflector's events touched, for the Controller's trigger streams.
#[derive(Clone, Debug, Default)]
pub struct Triggers {
    pub policies: Touched<ScalePolicy>,
    pub attempts: Touched<RunnerAttempt>,
    pub leases: Touched<Lease>,
    pub nodes: Touched<Node>,
}

/// Keep only what the controllers read: managed fields are dropped from every cached object
/// (they are often the largest part of it), and `trim` drops more per kind.
fn reflect<K>(
    (api, only): (Api<K>, Option<Arc<BTreeSet<String>>>),
    touched: Touched<K>,
    trim: fn(&mut K),
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    reflect_marked((api, only), touched, trim, None)
}

/// [`reflect`], and `synced` set once the first full list is in. (A second task awaiting
/// `Store::wait_until_ready` could take the wake-up from the controller's: the store's ready
/// signal keeps one waker.)
fn reflect_marked<K>(
    (api, only): (Api<K>, Option<Arc<BTreeSet<String>>>),
    touched: Touched<K>,
    trim: fn(&mut K),
    synced: Option<Arc<AtomicBool>>,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        // Several watched namespaces: one cluster-wide watch, objects of the others dropped
        // before they reach the store.
        .try_filter(move |event| {
            let keep = match (&only, event) {
                (
                    Some(only),
                    watcher::Event::Apply(o)
                    | watcher::Event::InitApply(o)
                    | watcher::Event::Delete(o),
                ) => o
                    .meta()
                    .namespace
                    .as_ref()
                    .is_some_and(|ns| only.contains(ns)),
                _ => true,
            };
            std::future::ready(keep)
        })
        .modify(move |o: &mut K| {
            o.meta_mut().managed_fields = None;
            trim(o);
        })
        .reflect(writer)
        .inspect_ok(move |event| {
            if let (Some(synced), watcher::Event::InitDone) = (&synced, event) {
                synced.store(true, Ordering::Release);
            }
        })
        .touched_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            match item {
                Ok(object) => touched.send(&object),
                Err(e) => tracing::warn!(error = %e, "watch interrupted; resuming"),
            }
        }
    });
    reader
}

/// `watch` is one namespace, several separated by commas, or (`None`) every namespace.
fn scoped<K>(
    kube: &kube::Client,
    namespace: Option<&str>,
) -> (Api<K>, Option<Arc<BTreeSet<String>>>)
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    let several: BTreeSet<String> = namespace
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect();
    match several.len() {
        0 => (Api::all(kube.clone()), None),
        1 => (
            Api::namespaced(kube.clone(), several.iter().next().map_or("", |n| n)),
            None,
        ),
        _ => (Api::all(kube.clone()), Some(Arc::new(several))),
    }
}

/// Only the ScalePolicies (the webhook receivers of every replica match jobs against them), of
/// `watch` (one or several namespaces, comma-separated) or of every namespace.
pub fn policies(
    kube: &kube::Client,
    watch: Option<&str>,
    touched: Touched<ScalePolicy>,
    synced: Arc<AtomicBool>,
) -> Store<ScalePolicy> {
    reflect_marked(scoped(kube, watch), touched, |_| {}, Some(synced))
}

/// A Node's status (images, conditions, addresses) is large and placement reads only its
/// allocatable resources (a node that cannot hold a policy's requests beside its attempts is
/// not chosen), so that is all that is kept.
fn trim_node(n: &mut Node) {
    n.status = n.status.take().map(|s| NodeStatus {
        allocatable: s.allocatable,
        ..NodeStatus::default()
    });
    n.metadata.annotations = None;
}

impl Caches {
    /// Start the reflectors the leader needs; `policies` may be shared with the webhook sink.
    pub fn start(
        kube: &kube::Client,
        namespace: &str,
        watch: Option<&str>,
        policies: (Store<ScalePolicy>, Touched<ScalePolicy>),
    ) -> Self {
        let touched = Triggers {
            policies: policies.1,
            ..Triggers::default()
        };
        Self {
            policies: policies.0,
            attempts: reflect(scoped(kube, watch), touched.attempts.clone(), |_| {}),
            leases: reflect(
                (Api::namespaced(kube.clone(), namespace), None),
                touched.leases.clone(),
                |_| {},
            ),
            nodes: reflect(
                (Api::all(kube.clone()), None),
                touched.nodes.clone(),
                trim_node,
            ),
            touched,
        }
    }

    /// Wait until every store has its first full list: deciding on a partial view would create
    /// attempts that already exist.
    pub async fn ready(&self) -> bool {
        self.policies.wait_until_ready().await.is_ok()
            && self.attempts.wait_until_ready().await.is_ok()
            && self.leases.wait_until_ready().await.is_ok()
            && self.nodes.wait_until_ready().await.is_ok()
    }
}

impl std::fmt::Debug for Caches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caches").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trimmed_node_keeps_the_allocatable_placement_reads_and_nothing_else() {
        let mut n: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "annotations": {"a": "b"}, "labels": {"l": "v"}},
            "spec": {"unschedulable": true},
            "status": {
                "allocatable": {"cpu": "2", "memory": "4Gi"},
                "capacity": {"cpu": "2", "memory": "4Gi"},
                "images": [{"names": ["pause"], "sizeBytes": 1}],
                "conditions": [{"type": "Ready", "status": "True"}]
            }
        }))
        .unwrap();
        trim_node(&mut n);
        let status = n.status.expect("the status is kept");
        let allocatable = status.allocatable.expect("allocatable is kept");
        assert_eq!(allocatable["cpu"].0, "2");
        assert_eq!(allocatable["memory"].0, "4Gi");
        assert!(status.capacity.is_none() && status.images.is_none());
        assert!(status.conditions.is_none());
        assert!(n.metadata.annotations.is_none());
        assert!(n.metadata.labels.is_some() && n.spec.is_some());
    }
}
