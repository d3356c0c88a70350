//! The leader's `kube::runtime::Controller<ScalePolicy>` (DESIGN §12, "control loops").
//!
//! Its triggers are the reflectors the process already runs (`cache`), never a second watch:
//! a policy's own changes; its RunnerAttempts (by `spec.policy`); agent Leases and Nodes, mapped
//! to the policies they can affect — those with attempts on the node, and those waiting for
//! capacity (a reconcile whose creations placement refused). A Lease renewal or a Node status
//! heartbeat that changes nothing placement reads triggers nothing. Every policy is also
//! reconciled once per `--resync-interval` (`reconcile_all_on`): time-based rules (timeouts,
//! node loss, observation and poll intervals) are checked at least that often, as the old
//! single pass did.
//!
//! A reconcile is the stage pipeline `policy::reconcile` (housekeeping → resolve → observe →
//! demand → plan → apply → status) on the policy's attempts, each validated once here
//! (`attempts_of`). Errors come back typed by stage; `error_policy` counts each in
//! `runner_manager_reconcile_errors_total{stage}` and requeues the policy after its backoff.
//! Only the leader runs this: `run` is dropped when leadership is lost.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::ObjectRef;
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::policy::ScalePolicy;
use runner_manager_crds::state::AttemptState;
use runner_manager_crds::validate::attempt::Attempt;
use tokio::time::Instant;

use crate::controller::errors::{self, ReconcileError, Stage};
use crate::controller::index::{PolicyIndex, policy_of};
use crate::controller::placement_worker::PlacementWorker;
use crate::controller::sources::candidates::{Candidates, target_conflicts};
use crate::controller::{Ctx, PolicyMemory, attempts, key, policy, state_name};

/// Policies reconciled at once (bounded: GitHub budgets and the API server).
const POLICY_CONCURRENCY: u16 = 32;

/// A reconcile that failed somewhere: every error, and when to try again.
#[derive(Debug, thiserror::Error)]
#[error("{} reconcile error(s); first: {}", errors.len(), errors.first().map(ToString::to_string).unwrap_or_default())]
pub struct Failed {
    pub errors: Vec<ReconcileError>,
    pub retry: Duration,
}

/// What the leader's Controller holds while it runs (its context); dropped with leadership.
pub struct Leading {
    pub ctx: Arc<Ctx>,
    /// The one placement worker: its lock is held from reading capacity to recording what was
    /// created, so no two policies place against the same free slot.
    pub placement: tokio::sync::Mutex<PlacementWorker>,
    /// What the leader remembers per policy (`namespace/name`). The Controller never runs two
    /// reconciles of one policy at once, so each lock is uncontended.
    memory: Mutex<HashMap<String, Arc<tokio::sync::Mutex<PolicyMemory>>>>,
    /// What the attempt, Lease and Node events showed: which policies each event concerns,
    /// and each policy's attempts (pure, `index`).
    index: Mutex<PolicyIndex>,
    /// The per-pass views of every policy (the job matcher, the target conflicts).
    views: Mutex<Views>,
    rounds: Mutex<Rounds>,
    /// Attempt names the events showed, for the placement worker's expectations.
    sightings: crate::controller::placement_worker::Sightings,
    /// Where a round's time went, logged with the first pass (the one a fresh install and a
    /// failover wait for) so a slow one can be explained from its log line alone.
    profile: Profile,
}

/// Reconciles and time per stage since the round began; summed over concurrent reconciles.
#[derive(Default)]
struct Profile {
    reconciles: AtomicU64,
    status_writes: AtomicU64,
    /// Microseconds per stage, by `errors::Stage::ALL`'s order.
    stage_us: [AtomicU64; Stage::ALL.len()],
}

impl Profile {
    fn add(&self, took: &policy::StageTimes) {
        for (at, us) in self.stage_us.iter().zip(took.0) {
            at.fetch_add(us, Ordering::Relaxed);
        }
    }

    /// Reconciles, status writes and the time per stage, reset for the next round.
    fn take(&self) -> (u64, u64, policy::StageTimes) {
        let take = |a: &AtomicU64| a.swap(0, Ordering::Relaxed);
        (
            take(&self.reconciles),
            take(&self.status_writes),
            policy::StageTimes(self.stage_us.each_ref().map(take)),
        )
    }
}

/// The per-pass views of every policy, rebuilt only when a policy's spec, deletion or proof
/// changed: building them parses every policy's URL.
#[derive(Default)]
struct Views {
    /// What each cached policy looked like when the views were built.
    marks: HashMap<String, (i64, bool, bool)>,
    conflicts: Option<Arc<HashMap<String, Vec<String>>>>,
    /// The job matcher, when it was built, and whether a proof (`Ready`) changed since. A stale
    /// one is rebuilt at most once per [`CANDIDATES_MAX_AGE`]: in a fresh install's first round
    /// every policy's first status write proves it, and rebuilding per write would parse every
    /// URL a thousand times. Polling, its only reader, repairs missed deliveries on intervals of
    /// seconds, so a matcher a second old loses nothing.
    candidates: Option<(Arc<Candidates>, Instant, bool)>,
}

const CANDIDATES_MAX_AGE: Duration = Duration::from_secs(1);

fn mark(p: &ScalePolicy) -> (i64, bool, bool) {
    (
        p.metadata.generation.unwrap_or(0),
        p.metadata.deletion_timestamp.is_some(),
        crate::controller::sources::candidates::proven(p),
    )
}

/// A full round of reconciles: every policy cached when it started, reconciled once.
#[derive(Default)]
struct Rounds {
    current: Option<(Instant, HashSet<String>)>,
    done: u64,
}

impl Leading {
    /// Subscribe to the attempt events before this is built: an attempt created in between is
    /// then both in the store read here and in the events read later.
    pub fn new(ctx: Arc<Ctx>) -> Self {
        let mut index = PolicyIndex::default();
        for a in ctx.caches.attempts.state() {
            index.apply_attempt(&a);
        }
        let placement = PlacementWorker::default();
        Self {
            index: Mutex::new(index),
            ctx,
            sightings: placement.sightings(),
            placement: tokio::sync::Mutex::new(placement),
            memory: Mutex::default(),
            views: Mutex::default(),
            rounds: Mutex::default(),
            profile: Profile::default(),
        }
    }

    fn index(&self) -> std::sync::MutexGuard<'_, PolicyIndex> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An attempt event: the policies it concerns (its own, and those waiting for capacity).
    fn attempt_touched(&self, a: &RunnerAttempt) -> Vec<ObjectRef<ScalePolicy>> {
        if let Some(name) = &a.metadata.name {
            self.sightings
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(name.clone());
        }
        if gone(&self.ctx.caches.attempts, a) {
            self.index().delete_attempt(a)
        } else {
            self.index().apply_attempt(a)
        }
    }

    /// The policy's attempts as the cache holds them now, each validated once for this
    /// reconcile.
    fn attempts_of(&self, p: &ScalePolicy) -> Vec<Attempt> {
        let refs = self.index().attempts_of(&ObjectRef::from_obj(p));
        let store = &self.ctx.caches.attempts;
        validated(refs.iter().filter_map(|r| store.get(r)))
    }

    fn memory_of(&self, key: &str) -> Arc<tokio::sync::Mutex<PolicyMemory>> {
        let mut all = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        all.entry(key.to_owned()).or_default().clone()
    }

    /// A policy event: the views go stale when what they read of it changed (or it is gone).
    fn policy_touched(&self, p: &ScalePolicy) {
        let k = key(
            p.metadata.namespace.as_deref().unwrap_or_default(),
            p.metadata.name.as_deref().unwrap_or_default(),
        );
        let gone = gone(&self.ctx.caches.policies, p);
        let mut index = self.views.lock().unwrap_or_else(|e| e.into_inner());
        if index.conflicts.is_none() && index.candidates.is_none() {
            // Nothing built yet: the next build reads every policy anyway.
            return;
        }
        let now = (!gone).then(|| mark(p));
        let before = index.marks.get(&k).copied();
        if before == now {
            return;
        }
        let spec_changed = before.map(|(g, d, _)| (g, d)) != now.map(|(g, d, _)| (g, d));
        match now {
            Some(m) => index.marks.insert(k, m),
            None => index.marks.remove(&k),
        };
        if let Some((_, _, stale)) = index.candidates.as_mut() {
            *stale = true;
        }
        if spec_changed {
            index.conflicts = None;
        }
    }

    fn conflicts(&self) -> Arc<HashMap<String, Vec<String>>> {
        let mut index = self.views.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = &index.conflicts {
            return c.clone();
        }
        let all = self.ctx.caches.policies.state();
        self.remark(&mut index, &all);
        let c = Arc::new(target_conflicts(&all));
        index.conflicts = Some(c.clone());
        c
    }

    fn candidates(&self) -> Arc<Candidates> {
        let mut index = self.views.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((c, at, stale)) = &index.candidates
            && (!*stale || at.elapsed() < CANDIDATES_MAX_AGE)
        {
            return c.clone();
        }
        let all = self.ctx.caches.policies.state();
        self.remark(&mut index, &all);
        let c = Arc::new(Candidates::of(
            all,
            false,
            &self.ctx.settings.owner_bindings,
        ));
        index.candidates = Some((c.clone(), Instant::now(), false));
        c
    }

    fn remark(&self, index: &mut Views, all: &[Arc<ScalePolicy>]) {
        index.marks = all
            .iter()
            .map(|p| {
                (
                    key(
                        p.metadata.namespace.as_deref().unwrap_or_default(),
                        p.metadata.name.as_deref().unwrap_or_default(),
                    ),
                    mark(p),
                )
            })
            .collect();
    }

    /// A Lease event: the policies it concerns when its advert changed (or it came or went).
    fn lease_touched(&self, lease: &Lease) -> Vec<ObjectRef<ScalePolicy>> {
        if gone(&self.ctx.caches.leases, lease) {
            self.index().delete_lease(lease)
        } else {
            self.index().apply_lease(lease)
        }
    }

    /// A Node event: the policies it concerns when what placement reads of it changed.
    fn node_touched(&self, n: &Node) -> Vec<ObjectRef<ScalePolicy>> {
        if gone(&self.ctx.caches.nodes, n) {
            self.index().delete_node(n)
        } else {
            self.index().apply_node(n)
        }
    }

    /// Start a round when none is running: every cached policy is about to be reconciled.
    fn start_round(&self) {
        let mut rounds = self.rounds.lock().unwrap_or_else(|e| e.into_inner());
        if rounds.current.is_some() {
            return;
        }
        let keys = self
            .ctx
            .caches
            .policies
            .state()
            .iter()
            .map(|p| {
                key(
                    p.metadata.namespace.as_deref().unwrap_or_default(),
                    p.metadata.name.as_deref().unwrap_or_default(),
                )
            })
            .collect();
        rounds.current = Some((Instant::now(), keys));
    }

    /// A policy was reconciled: close the round when it was the last one the round waited for.
    /// Policies deleted meanwhile are dropped from the round by the sweep (`forget_gone`), not
    /// here: checking every pending key on every reconcile is quadratic in a round.
    fn reconciled(&self, k: &str) {
        let mut rounds = self.rounds.lock().unwrap_or_else(|e| e.into_inner());
        let Some((_, pending)) = rounds.current.as_mut() else {
            return;
        };
        pending.remove(k);
        if pending.is_empty() {
            self.close_round(&mut rounds);
        }
    }

    /// Drop from the current round the policies no longer cached.
    fn forget_gone(&self, live: &HashSet<String>) {
        let mut rounds = self.rounds.lock().unwrap_or_else(|e| e.into_inner());
        let Some((_, pending)) = rounds.current.as_mut() else {
            return;
        };
        pending.retain(|k| live.contains(k));
        if pending.is_empty() {
            self.close_round(&mut rounds);
        }
    }

    fn close_round(&self, rounds: &mut Rounds) {
        let Some((started, _)) = rounds.current.as_ref() else {
            return;
        };
        let elapsed = started.elapsed();
        rounds.current = None;
        rounds.done += 1;
        self.ctx.metrics.reconcile_pass(elapsed);
        let elapsed_ms = elapsed.as_millis() as u64;
        let (reconciles, status_writes, took) = self.profile.take();
        let ms = |stages: &[Stage]| stages.iter().map(|s| took.of(*s)).sum::<u64>() / 1000;
        if rounds.done == 1 {
            // The round that resolves every policy and writes every status: the one a failover
            // or an upgrade waits for.
            tracing::info!(
                elapsed_ms,
                policies = self.ctx.caches.policies.state().len(),
                attempts = self.ctx.caches.attempts.state().len(),
                reconciles,
                status_writes,
                housekeeping_ms = ms(&[Stage::Housekeeping]),
                prepare_ms = ms(&[Stage::Resolve, Stage::Observe, Stage::Demand]),
                apply_ms = ms(&[Stage::Plan, Stage::Apply, Stage::Status]),
                "first reconcile pass done"
            );
        } else {
            tracing::debug!(elapsed_ms, reconciles, status_writes, "pass done");
        }
    }
}

/// Whether the cache no longer holds `obj`: the touched stream shows an object both when it
/// changes and when it goes, and the store, updated first, tells which.
fn gone<K>(store: &kube::runtime::reflector::Store<K>, obj: &K) -> bool
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    store.get(&ObjectRef::from_obj(obj)).is_none()
}

/// Run the Controller until the future is dropped (leadership lost or shutdown).
pub async fn run(ctx: Arc<Ctx>) {
    if !ctx.caches.ready().await {
        tracing::error!("the controller caches stopped before their first list");
        return;
    }
    let _ = ctx.leading_since.set(Timestamp::now());
    tracing::info!("controllers reconciling");
    let touched = ctx.caches.touched.clone();
    // Subscribed before `Leading::new` reads the attempt cache (see there).
    let attempt_events = touched.attempts.subscribe();
    let lead = Arc::new(Leading::new(ctx.clone()));
    let resync = ctx.settings.resync_interval;
    let rounds = {
        let lead = lead.clone();
        // The first round at once (the first pass), then one per resync interval.
        futures_util::stream::once(std::future::ready(()))
            .chain(futures_util::stream::unfold((), move |()| async move {
                tokio::time::sleep(resync).await;
                Some(((), ()))
            }))
            .map(move |()| lead.start_round())
    };
    let policies = {
        let lead = lead.clone();
        touched
            .policies
            .subscribe()
            .inspect({
                let lead = lead.clone();
                move |p| {
                    if let Ok(p) = p {
                        lead.policy_touched(p);
                    }
                }
            })
            // The policy as this leader's own finalizer or status write left it triggers
            // nothing: the reconcile that wrote it knew that object (`writes::Echoes`).
            .filter(move |p| {
                let echo = p.as_ref().is_ok_and(|p| lead.ctx.writer.echoes.is_echo(p));
                std::future::ready(!echo)
            })
    };
    let attempt_mapper = {
        let lead = lead.clone();
        move |a: RunnerAttempt| lead.attempt_touched(&a)
    };
    let lease_mapper = {
        let lead = lead.clone();
        move |l: Lease| lead.lease_touched(&l)
    };
    let node_mapper = {
        let lead = lead.clone();
        move |n: Node| lead.node_touched(&n)
    };
    let controller = Controller::for_stream(policies, ctx.caches.policies.clone())
        .watches_stream(attempt_events, attempt_mapper)
        .watches_stream(touched.leases.subscribe(), lease_mapper)
        .watches_stream(touched.nodes.subscribe(), node_mapper)
        .reconcile_all_on(rounds)
        .with_config(Config::default().concurrency(POLICY_CONCURRENCY))
        .run(reconcile, error_policy, lead.clone())
        .for_each(|result| async move {
            if let Err(e) = result {
                // The reconcile's own failures were counted by `error_policy`; these are the
                // Controller's (a request for an object no longer cached, a trigger stream
                // error).
                tracing::debug!(error = %e, "controller");
            }
        });
    tokio::select! {
        () = controller => tracing::warn!("the controller stopped"),
        () = sweep(lead) => {}
    }
}

/// What belongs to no one policy, once per resync interval: the attempts-by-state gauge, the
/// housekeeping of attempts whose policy is gone from the cache, and the memory of policies
/// that are gone (dropping a scale-set listener deletes its session).
async fn sweep(lead: Arc<Leading>) {
    let ctx = &lead.ctx;
    loop {
        let all = ctx.caches.attempts.state();
        let mut states: BTreeMap<AttemptState, i64> =
            AttemptState::ALL.iter().map(|s| (*s, 0)).collect();
        for a in &all {
            *states.entry(a.state()).or_default() += 1;
        }
        let counts: Vec<(&'static str, i64)> =
            states.iter().map(|(s, n)| (state_name(*s), *n)).collect();
        ctx.metrics.attempts_by_state(&counts);
        let policies = &ctx.caches.policies;
        let orphaned = validated(
            all.into_iter()
                .filter(|a| policies.get(&policy_of(a)).is_none()),
        );
        if !orphaned.is_empty() {
            let failed = attempts::housekeeping(ctx, &orphaned, Timestamp::now()).await;
            for e in failed.into_iter().map(ReconcileError::from) {
                ctx.metrics.reconcile_error(e.stage().as_str());
                tracing::debug!(stage = e.stage().as_str(), error = %e, "housekeeping of an attempt without a policy");
            }
        }
        {
            let live: HashSet<String> = policies
                .state()
                .iter()
                .map(|p| {
                    key(
                        p.metadata.namespace.as_deref().unwrap_or_default(),
                        p.metadata.name.as_deref().unwrap_or_default(),
                    )
                })
                .collect();
            lead.memory
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|k, _| live.contains(k));
            lead.index().retain_waiting(|r| policies.get(r).is_some());
            ctx.writer.echoes.retain(&live);
            // Drains the sightings when no policy creates for a while (they would only grow).
            lead.placement
                .lock()
                .await
                .observe(Vec::<Arc<RunnerAttempt>>::new, Timestamp::now());
            lead.forget_gone(&live);
        }
        tokio::time::sleep(ctx.settings.resync_interval).await;
    }
}

/// Attempts as the reconcile holds them: each object with its validated view. An object
/// without one (no name: the API server never serves such) is left out and logged.
fn validated(objects: impl IntoIterator<Item = Arc<RunnerAttempt>>) -> Vec<Attempt> {
    let (held, refused) = Attempt::all(objects);
    for problem in refused {
        tracing::error!(error = %problem, "an attempt that cannot be read is left out of the reconcile");
    }
    held
}

/// One policy: its backoff, then the stage pipeline (`policy::reconcile`).
async fn reconcile(p: Arc<ScalePolicy>, lead: Arc<Leading>) -> Result<Action, Failed> {
    // The store may not show this leader's last writes of the policy yet: work from what they
    // returned then (`writes::Echoes`), not from the copy they replaced.
    let p = lead.ctx.writer.echoes.fresher(p);
    let ns = p.metadata.namespace.as_deref().unwrap_or_default();
    let name = p.metadata.name.as_deref().unwrap_or_default();
    let k = key(ns, name);
    let memory = lead.memory_of(&k);
    let mut mem = memory.lock().await;
    let result = reconcile_locked(&lead, &p, &k, &mut mem).await;
    drop(mem);
    lead.reconciled(&k);
    result
}

async fn reconcile_locked(
    lead: &Leading,
    p: &Arc<ScalePolicy>,
    k: &str,
    mem: &mut PolicyMemory,
) -> Result<Action, Failed> {
    let ctx = &lead.ctx;
    let generation = p.metadata.generation.unwrap_or(0);
    let deleting = p.metadata.deletion_timestamp.is_some();
    if let Some(b) = mem.backoff
        && b.holds(generation, deleting, Instant::now())
    {
        // A failed write backs the policy off: the events its own writes cause do not retry it
        // sooner.
        return Ok(Action::requeue(
            b.retry_at.saturating_duration_since(Instant::now()),
        ));
    }
    let now = Timestamp::now();
    let mine = lead.attempts_of(p);
    let profile = &lead.profile;
    profile.reconciles.fetch_add(1, Ordering::Relaxed);
    let candidates = || lead.candidates();
    let conflicts = lead.conflicts();
    let cordoned = policy::cordoned_nodes(ctx);
    let reading = policy::Reading {
        policy: p,
        attempts: &mine,
        cordoned: &cordoned,
        conflicts: conflicts.get(k).map(Vec::as_slice).unwrap_or_default(),
        candidates: &candidates,
    };
    let applied = policy::reconcile(ctx, &lead.placement, mem, reading, now).await;
    profile.add(&applied.took);
    if applied.status_written {
        profile.status_writes.fetch_add(1, Ordering::Relaxed);
    }
    let failed = applied.errors;
    lead.index()
        .set_waiting(ObjectRef::from_obj(p.as_ref()), applied.wants_capacity);
    // Housekeeping's failed writes (finalizers, deletions of cleaned attempts) are counted and
    // retried with the next reconcile, but never back the policy off (`ReconcileError::backs_off`).
    mem.backoff = errors::Backoff::after(mem.backoff, &failed, generation, Instant::now());
    let resync = ctx.settings.resync_interval;
    // The replacement backoff opens between resync rounds: wake for it.
    let next = applied
        .wake_at
        .map(|at| {
            let ms = at.as_millisecond().saturating_sub(now.as_millisecond());
            Duration::from_millis(u64::try_from(ms).unwrap_or(0)).min(resync)
        })
        .unwrap_or(resync);
    if failed.is_empty() {
        return Ok(Action::requeue(next));
    }
    let retry = mem.backoff.map_or(next, |b| {
        b.retry_at.saturating_duration_since(Instant::now())
    });
    Err(Failed {
        errors: failed,
        retry,
    })
}

/// Count and log a policy's reconcile errors (one line per error, at warn for what backs off),
/// and requeue it after its backoff.
fn error_policy(p: Arc<ScalePolicy>, failed: &Failed, lead: Arc<Leading>) -> Action {
    let ns = p.metadata.namespace.as_deref().unwrap_or_default();
    let name = p.metadata.name.as_deref().unwrap_or_default();
    for e in &failed.errors {
        let stage = e.stage().as_str();
        lead.ctx.metrics.reconcile_error(stage);
        if e.backs_off() {
            tracing::warn!(policy.namespace = ns, policy.name = name, stage, error = %e, "reconcile failed; the policy backs off");
        } else {
            tracing::debug!(policy.namespace = ns, policy.name = name, stage, error = %e, "reconcile: not available yet");
        }
    }
    Action::requeue(failed.retry)
}

impl std::fmt::Debug for Leading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leading").finish_non_exhaustive()
    }
}
