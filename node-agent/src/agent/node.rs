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

/// Everything the reconciles share (the controller's context holds it).
pub struct Agent {
    pub node: String,
    pub host_root: PathBuf,
    pub slots_root: PathBuf,
    pub capacity: u32,
    pub system_namespace: String,
    pub heartbeat: Duration,
    pub poll: Duration,
    /// Backstop grace after the operator-owned registration and idle deadlines.
    pub deadline_grace: Duration,
    /// Limits for runners whose policy sets none.
    pub runner_defaults: RunnerDefaults,
    pub kube: Client,
    /// The runner providers, one of each kind, and what is offered for new attempts: the launch,
    /// supervision, cleanup and admission reach a runner only through them.
    pub providers: crate::providers::Providers,
    /// The node's attempts, with the journal context and the metrics every write goes with.
    pub attempts: super::attempts::Attempts,
    /// The Event recorder (`events::warn`).
    pub events: kube::runtime::events::Recorder,
    /// When the node Lease was last renewed (readiness, the heartbeat-age gauge).
    pub(super) last_renewed: Mutex<Option<std::time::Instant>>,
    /// The agent's pods on its node (runner pods, placeholders), watched; run by the
    /// controller when the agent makes pods (`--oci` or placeholders).
    pub pod_watch: std::sync::Arc<crate::pod_watch::PodWatch>,
    /// Other workloads' pods on the node, watched for what they request (the Lease advert's
    /// `foreign_requests`).
    pub foreign_pods: std::sync::Arc<crate::foreign_pods::ForeignPods>,
    pub packages: PackageCache,
    pub allocation: AllocationLock,
    pub broker: std::sync::Arc<BrokerClient>,
    pub gate: RecoveryGate,
    pub(super) book: Mutex<CapacityBook>,
    pub(super) accounts: Mutex<AccountPool>,
    pub(super) slots: Mutex<SlotTable>,
    /// Uids of the node's `Pending` attempts at the last watch event (they count against free
    /// capacity until admitted, and once: see `CapacityBook::counted_with`).
    pub(super) pending: Mutex<BTreeSet<String>>,
    /// Per-attempt backoff of refused slot scrubs.
    pub(super) cleanup_backoff: Mutex<CleanupBackoff>,
    /// Renew the Lease now: the advert changed.
    pub advert_changed: Notify,
    /// Attempts whose changed spec was already reported (one event each).
    pub(super) spec_warned: Mutex<std::collections::BTreeSet<String>>,
    /// Between orphan sweeps.
    pub orphan_sweep: Duration,
    pub orphans: OrphanState,
    /// Placeholder pods beside native runners (`--placeholders`); `None`: none.
    pub placeholders: Option<placeholder::Settings>,
    /// The package versions (sha256) of the node's attempts not yet `Cleaned`, as the watch last
    /// showed them: a prune keeps them.
    pub(super) wanted_packages: Mutex<BTreeSet<String>>,
    /// Launches preparing at once (`--preparation-permits`).
    pub preparation: PreparationBound,
    /// The job gates of live runners whose policy refuses fork pull requests or keeps caches.
    pub job_gates: super::job_gates::JobGates,
    /// The node's dependency caches (`spec.caches`).
    pub caches: std::sync::Arc<crate::caches::CacheRoot>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("node", &self.node)
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
        &self.attempts.metrics
    }
    /// What a job gate's decisions use (`job_gates`).
    pub fn gate_services(&self) -> super::job_gates::GateServices {
        super::job_gates::GateServices {
            broker: self.broker.clone(),
            events: self.events.clone(),
            metrics: self.attempts.metrics.clone(),
        }
    }
    /// When this agent last renewed its node Lease.
    pub fn last_renewed(&self) -> Option<std::time::Instant> {
        *lock(&self.last_renewed)
    }
    pub fn book(&self) -> MutexGuard<'_, CapacityBook> {
        lock(&self.book)
    }
    pub fn accounts(&self) -> MutexGuard<'_, AccountPool> {
        lock(&self.accounts)
    }
    pub fn slots(&self) -> MutexGuard<'_, SlotTable> {
        lock(&self.slots)
    }
    pub fn cleanup_backoff(&self) -> MutexGuard<'_, CleanupBackoff> {
        lock(&self.cleanup_backoff)
    }

    pub fn wanted_packages(&self) -> BTreeSet<String> {
        lock(&self.wanted_packages).clone()
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
        *lock(&self.wanted_packages) = wanted;
    }

    /// The launch's placeholder step (native attempts, before `Prepared` and the JIT request):
    /// the placeholder stands and the kubelet admitted it, or the launch concludes. Nothing
    /// without placeholders.
    pub async fn placeholder_before_start(
        &self,
        a: &RunnerAttempt,
    ) -> Result<(), placeholder::Refusal> {
        match self.placeholders.as_ref() {
            Some(settings) => placeholder::ensure(&self.kube, &self.broker, a, settings).await,
            None => Ok(()),
        }
    }

    /// Cleanup's placeholder step (once the runner is stopped and its workspace cleaned, before
    /// `Cleaned`).
    pub async fn placeholder_after_cleanup(
        &self,
        a: &RunnerAttempt,
    ) -> Result<(), placeholder::RemoveError> {
        if self.placeholders.is_none() {
            return Ok(());
        }
        placeholder::remove_of(&self.kube, &self.broker, a).await
    }

    /// The orphan sweep's placeholder step: a failure only warns (the next sweep tries again).
    pub async fn sweep_placeholder_orphans(&self, claims: &(dyn Fn() -> BTreeSet<String> + Sync)) {
        if self.placeholders.is_none() {
            return;
        }
        match placeholder::sweep(&self.kube, &self.broker, &self.node, claims).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                "orphans removed (no attempt of this node claims them): {n} placeholder pod(s)"
            ),
            Err(e) => tracing::warn!("placeholder orphans not swept: {e}"),
        }
    }
}
