//! The controllers the leader runs: one level-triggered reconcile pass over the cached policies,
//! attempts, agent Leases and Nodes, woken by any watch event and at least every resync
//! interval. One pass holds the one placement worker, so its expectations are never shared.
//!
//! Each pass: per attempt, housekeeping (finalizers, abandon, timeouts, the operator's two
//! edges); per policy, resolution → demand → placement/creation → scale-down → observation of
//! GitHub → job ledger repairs → status.

pub mod attempts;
pub mod cache;
pub mod errors;
pub mod events;
pub mod failures;
pub mod job_ledger;
pub mod leader;
pub mod ledger_batch;
pub mod placement_worker;
pub mod plan;
pub mod policy;
pub mod resolve;
pub mod scaleset_listener;
pub mod snapshot;
pub mod supervisor;
pub mod timeouts;
pub mod writes;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::jiff::Timestamp;
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::policy::ScalePolicy;
use runner_manager_crds::state::AttemptState;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::github::registry::Clients;
use crate::github::types::Runner;
use crate::metrics::Metrics;
use cache::Caches;
use events::Events;
use placement_worker::PlacementWorker;
use resolve::{Invalid, Resolved};
use writes::Writer;

/// Policies reconciled at once in a pass (bounded: GitHub budgets and the API server).
const POLICY_CONCURRENCY: usize = 32;

/// The policy finalizer: a policy being deleted drains before it goes.
pub const POLICY_FINALIZER: &str = "runner-manager.dev/drain";

/// Settings from the command line.
#[derive(Clone, Debug)]
pub struct Settings {
    pub namespace: String,
    pub ownership_label: String,
    pub runner_mirror_url: Option<String>,
    pub observe_interval: Duration,
    pub resync_interval: Duration,
    pub orphan_grace: Duration,
    pub admission_timeout: Duration,
    pub node_lost_grace: Duration,
    pub job_check_grace: Duration,
    pub attempt_history: u32,
    pub max_consecutive_failures: u32,
    pub replacement_backoff: Duration,
    pub replacement_backoff_max: Duration,
    /// GitHub owners bound to namespaces (`--owner-namespaces`).
    pub owner_bindings: crate::policy::tenancy::OwnerBindings,
    /// Which GitHub and download hosts policies may lead to (`--github-hosts` and friends).
    pub hosts: crate::controller::resolve::HostPolicy,
    /// `--max-runners-per-node`: placement uses the smaller of this and each agent's advert.
    pub max_runners_per_node: Option<u32>,
}

/// What every step needs.
pub struct Ctx {
    pub writer: Writer,
    pub clients: Arc<Clients>,
    pub settings: Settings,
    pub caches: Caches,
    pub events: Events,
    pub metrics: Arc<Metrics>,
    /// When this replica's controllers started (after leadership and the first lists): node
    /// silence is counted from here at the earliest (`attempts::counted_from`).
    pub leading_since: std::sync::OnceLock<k8s_openapi::jiff::Timestamp>,
}

impl Ctx {
    pub fn kube(&self) -> &kube::Client {
        &self.writer.kube
    }
}

/// A resolution and when it was made.
pub struct ResolvedEntry {
    pub generation: i64,
    pub at: Instant,
    pub result: Result<Resolved, Invalid>,
}

/// What the leader remembers of one policy between passes (rebuilt after failover; nothing
/// here is needed for safety, only to space out work).
#[derive(Default)]
pub struct PolicyMemory {
    pub resolved: Option<ResolvedEntry>,
    pub last_observe: Option<Instant>,
    pub last_poll: Option<Instant>,
    /// The last runner listing of the policy's target, by runner name.
    pub listing: Option<HashMap<String, Runner>>,
    /// Orphan registrations by runner id: when first seen orphaned.
    pub orphans: HashMap<i64, Instant>,
    /// Pending jobs by id: when last checked with GitHub.
    pub job_checks: HashMap<String, Instant>,
    /// Jobs the organization walk recorded lately, by id: not written again while the cache
    /// catches up with the write.
    pub walk_added: HashMap<String, Instant>,
    /// `ScaleSet` policies: the message-session listener (dropped, and its session deleted,
    /// with this memory: leadership lost, policy gone).
    pub scale_set_listener: Option<scaleset_listener::Listener>,
    /// After a failed reconcile: when the policy may be reconciled again.
    pub backoff: Option<errors::Backoff>,
}

/// The leader's memory.
#[derive(Default)]
pub struct Memory {
    pub placement: PlacementWorker,
    pub policies: HashMap<String, PolicyMemory>,
}

fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Run reconcile passes until the future is dropped (leadership lost or shutdown).
pub async fn run(ctx: Arc<Ctx>, wake: Arc<Notify>) {
    if !ctx.caches.ready().await {
        tracing::error!("the controller caches stopped before their first list");
        return;
    }
    let _ = ctx.leading_since.set(k8s_openapi::jiff::Timestamp::now());
    tracing::info!("controllers reconciling");
    let mut memory = Memory::default();
    let mut first = true;
    loop {
        let started = Instant::now();
        pass(&ctx, &mut memory).await;
        let elapsed_ms = started.elapsed().as_millis() as u64;
        ctx.metrics.reconcile_pass(started.elapsed());
        if first {
            // The pass that resolves every policy and writes every status: the one a failover
            // or an upgrade waits for.
            tracing::info!(
                elapsed_ms,
                policies = memory.policies.len(),
                attempts = ctx.caches.attempts.state().len(),
                "first reconcile pass done"
            );
            first = false;
        } else {
            tracing::debug!(elapsed_ms, "pass done");
        }
        // Coalesce bursts of watch events: at most a few passes a second.
        tokio::select! {
            () = wake.notified() => tokio::time::sleep(Duration::from_millis(200)).await,
            () = tokio::time::sleep(ctx.settings.resync_interval) => {}
        }
    }
}

/// One pass over everything.
pub async fn pass(ctx: &Ctx, memory: &mut Memory) {
    let now = Timestamp::now();
    let attempts = ctx.caches.attempts.state();
    memory.placement.observe(
        attempts.iter().filter_map(|a| a.metadata.name.as_deref()),
        now,
    );
    let mut by_policy: BTreeMap<String, Vec<Arc<RunnerAttempt>>> = BTreeMap::new();
    let mut states: BTreeMap<AttemptState, i64> =
        AttemptState::ALL.iter().map(|s| (*s, 0)).collect();
    for a in &attempts {
        let ns = a.metadata.namespace.as_deref().unwrap_or_default();
        by_policy
            .entry(key(ns, &a.spec.policy))
            .or_default()
            .push(a.clone());
        let s = a
            .status
            .as_ref()
            .map(|s| s.journal.state())
            .unwrap_or_default();
        *states.entry(s).or_default() += 1;
    }
    let counts: Vec<(&'static str, i64)> =
        states.iter().map(|(s, n)| (state_name(*s), *n)).collect();
    ctx.metrics.attempts_by_state(&counts);
    attempts::housekeeping(ctx, &attempts, now).await;
    let all_policies = ctx.caches.policies.state();
    let attempt_ids: std::collections::HashSet<String> =
        attempts.iter().map(|a| a.spec.id.clone()).collect();
    // Each policy's own I/O (resolution, GitHub observation, polling) runs concurrently: it
    // touches nothing shared. Decisions that share the placement worker run one at a time.
    let keys: Vec<String> = all_policies
        .iter()
        .map(|p| {
            key(
                p.metadata.namespace.as_deref().unwrap_or_default(),
                p.metadata.name.as_deref().unwrap_or_default(),
            )
        })
        .collect();
    for k in &keys {
        memory.policies.entry(k.clone()).or_default();
    }
    let empty: Vec<Arc<RunnerAttempt>> = Vec::new();
    // The job→policy matcher, built once per pass (it parses every policy's URL).
    let candidates =
        job_ledger::Candidates::of(all_policies.clone(), false, &ctx.settings.owner_bindings);
    // Targets named from more than one namespace, for the `Conflict` conditions.
    let conflicts = job_ledger::target_conflicts(&all_policies);
    // Policies reconcile concurrently: their I/O (resolution, GitHub observation, polling,
    // status) touches nothing shared. Creation shares the placement worker: it holds the lock
    // from reading capacity to recording what it created, so no two policies place against the
    // same free slot.
    let placement = tokio::sync::Mutex::new(std::mem::take(&mut memory.placement));
    {
        let by_key: HashMap<&str, &Arc<ScalePolicy>> = keys
            .iter()
            .map(String::as_str)
            .zip(all_policies.iter())
            .collect();
        let work: Vec<_> = memory
            .policies
            .iter_mut()
            .filter_map(|(k, mem)| {
                let p = by_key.get(k.as_str())?;
                Some((*p, by_policy.get(k).unwrap_or(&empty), mem))
            })
            .collect();
        // Nodes cordoned now, read once for every policy of the pass.
        let cordoned = policy::cordoned_nodes(ctx);
        let (candidates, attempt_ids, placement, cordoned, conflicts) =
            (&candidates, &attempt_ids, &placement, &cordoned, &conflicts);
        futures_util::stream::iter(work)
            .for_each_concurrent(POLICY_CONCURRENCY, |(p, mine, mem)| async move {
                let generation = p.metadata.generation.unwrap_or(0);
                let deleting = p.metadata.deletion_timestamp.is_some();
                if mem
                    .backoff
                    .is_some_and(|b| b.holds(generation, deleting, Instant::now()))
                {
                    return;
                }
                let mut failed =
                    policy::prepare(ctx, mem, p, mine, candidates, attempt_ids, now).await;
                let key = key(
                    p.metadata.namespace.as_deref().unwrap_or_default(),
                    p.metadata.name.as_deref().unwrap_or_default(),
                );
                let conflict = conflicts.get(&key).map(Vec::as_slice).unwrap_or_default();
                failed.extend(
                    policy::reconcile(ctx, placement, cordoned, mem, p, mine, conflict, now).await,
                );
                report(ctx, p, &failed);
                mem.backoff =
                    errors::Backoff::after(mem.backoff, &failed, generation, Instant::now());
            })
            .await;
    }
    memory.placement = placement.into_inner();
    let live: std::collections::HashSet<&String> = keys.iter().collect();
    memory.policies.retain(|k, _| live.contains(k));
}

/// Count and log a policy's reconcile errors: one line per error, at warn for what backs off.
fn report(ctx: &Ctx, p: &ScalePolicy, failed: &[errors::ReconcileError]) {
    for e in failed {
        let stage = e.stage().as_str();
        ctx.metrics.reconcile_error(stage);
        let ns = p.metadata.namespace.as_deref().unwrap_or_default();
        let name = p.metadata.name.as_deref().unwrap_or_default();
        if e.backs_off() {
            tracing::warn!(policy.namespace = ns, policy.name = name, stage, error = %e, "reconcile failed; the policy backs off");
        } else {
            tracing::debug!(policy.namespace = ns, policy.name = name, stage, error = %e, "reconcile: not available yet");
        }
    }
}

pub fn state_name(s: AttemptState) -> &'static str {
    match s {
        AttemptState::Pending => "Pending",
        AttemptState::Allocated => "Allocated",
        AttemptState::Preparing => "Preparing",
        AttemptState::Prepared => "Prepared",
        AttemptState::JitReceived => "JitReceived",
        AttemptState::Starting => "Starting",
        AttemptState::Idle => "Idle",
        AttemptState::Busy => "Busy",
        AttemptState::Finished => "Finished",
        AttemptState::Failed => "Failed",
        AttemptState::Orphaned => "Orphaned",
        AttemptState::Destroying => "Destroying",
        AttemptState::CleanupDeferred => "CleanupDeferred",
        AttemptState::Cleaned => "Cleaned",
    }
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for ResolvedEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedEntry").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for PolicyMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyMemory").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memory").finish_non_exhaustive()
    }
}
