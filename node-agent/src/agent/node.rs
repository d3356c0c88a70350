//! The agent's shared context: what every reconcile, the Lease, the health endpoint and the
//! orphan sweep are handed (`Agent`), below all of them so none imports the process root
//! (`agent/mod.rs`) and no module of `agent/` imports another in a circle.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use kube::Client;
use runner_manager_crds::attempt::RunnerAttempt;
use tokio::sync::Notify;

use super::abandoned::OrphanState;
use super::accounts::AccountPool;
use super::admission::CapacityBook;
use super::gate::RecoveryGate;
use super::placeholder;
use super::preparation::PreparationBound;
use crate::broker_client::BrokerClient;
use crate::packages::PackageCache;
use crate::providers::cgroup::RunnerDefaults;
use crate::workspace::allocation::AllocationLock;
use crate::workspace::backoff::CleanupBackoff;
use crate::workspace::slot_table::SlotTable;

/// Everything the reconciles share (the controller's context holds it), in three parts: what
/// the agent keeps on its host, the runner providers, and its side of the cluster; beside them,
/// the agent's own loop (its clocks, the recovery gate, the capacity book).
pub struct Agent {
    /// What the agent keeps on its host.
    pub host: Host,
    /// The runner providers, one of each kind, and what is offered for new attempts: the launch,
    /// supervision, cleanup and admission reach a runner only through them.
    pub providers: crate::providers::Providers,
    /// The agent's side of the cluster.
    pub cluster: Cluster,
    /// One supervision pass per attempt this often.
    pub poll: Duration,
    /// Backstop grace after the operator-owned registration and idle deadlines.
    pub deadline_grace: Duration,
    pub gate: RecoveryGate,
    pub(super) book: Mutex<CapacityBook>,
    /// Uids of the node's `Pending` attempts at the last watch event (they count against free
    /// capacity until admitted, and once: see `CapacityBook::counted_with`).
    pub(super) pending: Mutex<BTreeSet<String>>,
    /// Attempts whose changed spec was already reported (one event each).
    pub(super) spec_warned: Mutex<std::collections::BTreeSet<String>>,
    /// Between orphan sweeps.
    pub orphan_sweep: Duration,
    pub orphans: OrphanState,
}

/// What the agent keeps on its host: its roots, the package cache, the runner accounts and
/// slots, the dependency caches and the job gates.
pub struct Host {
    /// `--host-root`.
    pub root: PathBuf,
    pub slots_root: PathBuf,
    /// How many runners the node hosts at once.
    pub capacity: u32,
    /// Limits for runners whose policy sets none.
    pub runner_defaults: RunnerDefaults,
    pub packages: PackageCache,
    pub allocation: AllocationLock,
    pub(super) accounts: Mutex<AccountPool>,
    pub(super) slots: Mutex<SlotTable>,
    /// Per-attempt backoff of refused slot scrubs.
    pub(super) cleanup_backoff: Mutex<CleanupBackoff>,
    /// The package versions (sha256) of the node's attempts not yet `Cleaned`, as the watch last
    /// showed them: a prune keeps them.
    pub(super) wanted_packages: Mutex<BTreeSet<String>>,
    /// Launches preparing at once (`--preparation-permits`).
    pub preparation: PreparationBound,
    /// The job gates of live runners whose policy refuses fork pull requests or keeps caches.
    pub job_gates: super::job_gates::JobGates,
    /// The node's dependency caches (`spec.caches`).
    pub caches: std::sync::Arc<crate::caches::CacheRoot>,
    /// The Docker sockets served to live runners (`spec.docker`).
    pub docker: crate::docker::DockerJobs,
}

/// The agent's side of the cluster: the API client, the node's attempts, Events, the pod
/// watches, the broker, the node Lease.
pub struct Cluster {
    pub node: String,
    pub system_namespace: String,
    pub kube: Client,
    /// The node's attempts, with the journal context and the metrics every write goes with.
    pub attempts: super::attempts::Attempts,
    /// The Event recorder (`events::warn`).
    pub events: kube::runtime::events::Recorder,
    /// The agent's pods on its node (runner pods, placeholders), watched; run by the
    /// controller when the agent makes pods (`--oci` or placeholders).
    pub pod_watch: std::sync::Arc<crate::pod_watch::PodWatch>,
    /// Other workloads' pods on the node, watched for what they request (the Lease advert's
    /// `foreign_requests`).
    pub foreign_pods: std::sync::Arc<crate::foreign_pods::ForeignPods>,
    pub broker: std::sync::Arc<BrokerClient>,
    /// Between Lease renewals.
    pub heartbeat: Duration,
    /// When the node Lease was last renewed (readiness, the heartbeat-age gauge).
    pub(super) last_renewed: Mutex<Option<std::time::Instant>>,
    /// Renew the Lease now: the advert changed.
    pub advert_changed: Notify,
    /// Placeholder pods beside native runners (`--placeholders`); `None`: none.
    pub placeholders: Option<placeholder::Settings>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("root", &self.root)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("node", &self.cluster.node)
            .finish_non_exhaustive()
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks is one insert or remove: a panic elsewhere leaves them
    // consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Agent {
    pub fn metrics(&self) -> &super::metrics::AgentMetrics {
        &self.cluster.attempts.metrics
    }
    /// What a job gate's decisions use (`job_gates`).
    pub fn gate_services(&self) -> super::job_gates::GateServices {
        super::job_gates::GateServices {
            broker: self.cluster.broker.clone(),
            events: self.cluster.events.clone(),
            metrics: self.cluster.attempts.metrics.clone(),
        }
    }
    /// When this agent last renewed its node Lease.
    pub fn last_renewed(&self) -> Option<std::time::Instant> {
        *lock(&self.cluster.last_renewed)
    }
    pub fn book(&self) -> MutexGuard<'_, CapacityBook> {
        lock(&self.book)
    }
    pub fn accounts(&self) -> MutexGuard<'_, AccountPool> {
        lock(&self.host.accounts)
    }
    pub fn slots(&self) -> MutexGuard<'_, SlotTable> {
        lock(&self.host.slots)
    }
    pub fn cleanup_backoff(&self) -> MutexGuard<'_, CleanupBackoff> {
        lock(&self.host.cleanup_backoff)
    }

    pub fn wanted_packages(&self) -> BTreeSet<String> {
        lock(&self.host.wanted_packages).clone()
    }

    /// True the first time an attempt's changed spec is seen.
    pub fn warn_spec_changed(&self, attempt: &str) -> bool {
        lock(&self.spec_warned).insert(attempt.to_owned())
    }

    /// The uids of the node's `Pending` attempts as the watch last showed them.
    pub fn pending(&self) -> BTreeSet<String> {
        lock(&self.pending).clone()
    }

    /// Records the node's `Pending` attempts; true when they changed (the Lease says them).
    pub fn set_pending(&self, pending: BTreeSet<String>) -> bool {
        let mut held = lock(&self.pending);
        let changed = *held != pending;
        *held = pending;
        changed
    }

    /// Records the package versions the node's attempts not yet `Cleaned` want (a prune keeps
    /// them).
    pub fn set_wanted_packages(&self, wanted: BTreeSet<String>) {
        *lock(&self.host.wanted_packages) = wanted;
    }

    /// The launch's placeholder step (native attempts, before `Prepared` and the JIT request):
    /// the placeholder stands and the kubelet admitted it, or the launch concludes. Nothing
    /// without placeholders.
    pub async fn placeholder_before_start(
        &self,
        a: &RunnerAttempt,
    ) -> Result<(), placeholder::Refusal> {
        match self.cluster.placeholders.as_ref() {
            Some(settings) => {
                placeholder::ensure(&self.cluster.kube, &self.cluster.broker, a, settings).await
            }
            None => Ok(()),
        }
    }

    /// Cleanup's placeholder step (once the runner is stopped and its workspace cleaned, before
    /// `Cleaned`).
    pub async fn placeholder_after_cleanup(
        &self,
        a: &RunnerAttempt,
    ) -> Result<(), placeholder::RemoveError> {
        if self.cluster.placeholders.is_none() {
            return Ok(());
        }
        placeholder::remove_of(&self.cluster.kube, &self.cluster.broker, a).await
    }

    /// The orphan sweep's placeholder step: a failure only warns (the next sweep tries again).
    pub async fn sweep_placeholder_orphans(&self, claims: &(dyn Fn() -> BTreeSet<String> + Sync)) {
        if self.cluster.placeholders.is_none() {
            return;
        }
        match placeholder::sweep(
            &self.cluster.kube,
            &self.cluster.broker,
            &self.cluster.node,
            claims,
        )
        .await
        {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                "orphans removed (no attempt of this node claims them): {n} placeholder pod(s)"
            ),
            Err(e) => tracing::warn!("placeholder orphans not swept: {e}"),
        }
    }
}
