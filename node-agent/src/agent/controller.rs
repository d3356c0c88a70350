//! The agent's control loop: a kube-runtime [`Controller`] over the node's attempts (DESIGN
//! §3–§6), in the shape of kube-rs's controller-rs.
//!
//! One watch (label-selected to this node: one initial list, served from the API server's watch
//! cache, then incremental events) feeds a reflector store and is the controller's trigger. Each
//! reconcile reads its attempt from that store — never from the API server — and takes one
//! [`supervise::step`]; where the attempt waits it returns `Action::requeue` (the supervision
//! interval, or until the watch shows the agent's own write), so there is no task or poll loop
//! per attempt and no API read per attempt. The controller never reconciles one attempt twice
//! at once and coalesces the events that arrive meanwhile into one more reconcile.
//!
//! Beside the reconciles, the stream's events keep what the node as a whole needs: the first
//! complete list rebuilds the agent's memory and arms the recovery gate, the `Pending` attempts
//! and wanted package versions go to the Lease and the package prune, the order in which the
//! watch showed each version goes to [`Freshness`], and an attempt whose object went away
//! (deleted, or missing from a re-list) is handed to the orphan sweep — after its running
//! reconcile, if one runs. A failed reconcile is counted in
//! `runner_manager_agent_reconcile_errors_total{stage}` and retried with a per-attempt backoff
//! ([`error_policy`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{FutureExt, StreamExt, TryStreamExt};
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use runner_manager_crds::NODE_LABEL;
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::lease::RecoveryBlocked;
use runner_manager_crds::names::short_hex;
use runner_manager_crds::state::AttemptState;
use tokio::sync::Notify;

use super::attempt_ctx::{AttemptCtx, Step, StepError};
use super::events::{self, EventReason};
use super::labels::ReconcileStage;
use super::node::Agent;
use super::orphans::{self, Abandoned};
use super::rebuild;
use super::supervise::{self, AttemptMemory};
use super::watched::{Freshness, Verdict, WRITE_SEEN_WITHIN};

/// The longest a failed reconcile waits before it is tried again (the first retry waits one
/// supervision interval, each next one twice as long).
pub const MAX_ERROR_BACKOFF: Duration = Duration::from_secs(10);

/// A reconcile that failed, with the stage of the attempt's life it failed in.
#[derive(Debug, thiserror::Error)]
#[error("{} failed: {source}", stage.as_str())]
pub struct ReconcileError {
    pub stage: ReconcileStage,
    #[source]
    pub source: StepError,
}

/// The stage of an attempt's life a reconcile starts in, from the state its copy shows.
pub fn stage_of(state: AttemptState) -> ReconcileStage {
    match state {
        AttemptState::Pending => ReconcileStage::Launch,
        AttemptState::Allocated
        | AttemptState::Preparing
        | AttemptState::Prepared
        | AttemptState::JitReceived => ReconcileStage::Resume,
        AttemptState::Starting | AttemptState::Idle | AttemptState::Busy => {
            ReconcileStage::Supervise
        }
        _ => ReconcileStage::Cleanup,
    }
}

/// The wait before the next try after `failures` failed reconciles in a row (at least one): one
/// supervision interval `poll`, doubling, at most [`MAX_ERROR_BACKOFF`]. Pure.
pub fn error_backoff(poll: Duration, failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    poll.saturating_mul(1 << doublings).min(MAX_ERROR_BACKOFF)
}

/// What the controller keeps of one attempt between its reconciles, by uid.
#[derive(Debug, Default)]
struct PerAttempt {
    memory: AttemptMemory,
    /// Failed reconciles in a row.
    failures: u32,
    /// Its `RecoveryBlocked` was said (one Event per attempt).
    reported: bool,
    /// A reconcile runs now, for the attempt of this name (12 hex): the orphan sweep must not
    /// touch what it is bringing up.
    running: Option<String>,
    /// Its object went away while a reconcile ran: what it held goes to the sweep when that
    /// reconcile ends.
    gone: Option<Option<(String, Abandoned)>>,
}

/// The attempts the controller knows between reconciles. Pure bookkeeping: which reconciles
/// run, and when an attempt whose object went away is handed to the sweep.
#[derive(Debug, Default)]
struct Book {
    by_uid: HashMap<String, PerAttempt>,
}

impl Book {
    /// A reconcile of `uid` (named `short`) starts: its memory, taken until [`Book::end`].
    fn begin(&mut self, uid: &str, short: Option<String>) -> AttemptMemory {
        let entry = self.by_uid.entry(uid.to_owned()).or_default();
        entry.running = Some(short.unwrap_or_default());
        std::mem::take(&mut entry.memory)
    }

    /// The reconcile of `uid` ended. Returns what the attempt held when its object went away
    /// meanwhile (`Some`: hand it to the sweep now).
    #[allow(clippy::option_option)]
    fn end(&mut self, uid: &str, memory: AttemptMemory) -> Option<Option<(String, Abandoned)>> {
        let entry = self.by_uid.entry(uid.to_owned()).or_default();
        entry.running = None;
        entry.memory = memory;
        let gone = entry.gone.take();
        if gone.is_some() {
            self.by_uid.remove(uid);
        }
        gone
    }

    /// The object of `uid` went away holding `held`. Returns it when nothing reconciles the
    /// attempt now (hand it to the sweep now); otherwise [`Book::end`] returns it.
    #[allow(clippy::option_option)]
    fn gone(
        &mut self,
        uid: &str,
        held: Option<(String, Abandoned)>,
    ) -> Option<Option<(String, Abandoned)>> {
        match self.by_uid.get_mut(uid) {
            Some(entry) if entry.running.is_some() => {
                entry.gone = Some(held);
                None
            }
            _ => {
                self.by_uid.remove(uid);
                Some(held)
            }
        }
    }

    /// The names (12 hex) of the attempts a reconcile runs for now.
    fn running(&self) -> impl Iterator<Item = &String> {
        self.by_uid
            .values()
            .filter_map(|e| e.running.as_ref())
            .filter(|s| !s.is_empty())
    }
}

/// The controller's context: the agent, the store its reconciles read, and the bookkeeping.
pub struct Supervision {
    agent: Arc<Agent>,
    store: Store<RunnerAttempt>,
    freshness: Freshness,
    book: Mutex<Book>,
    /// The first complete list was seen and the agent's memory rebuilt from it.
    rebuilt: AtomicBool,
    rebuilt_now: Notify,
}

impl std::fmt::Debug for Supervision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervision").finish_non_exhaustive()
    }
}

impl Supervision {
    fn new(agent: Arc<Agent>, store: Store<RunnerAttempt>) -> Self {
        Self {
            agent,
            store,
            freshness: Freshness::default(),
            book: Mutex::default(),
            rebuilt: AtomicBool::new(false),
            rebuilt_now: Notify::new(),
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        // Every update under it is a few map operations: a panic elsewhere leaves it consistent.
        self.book
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn is_rebuilt(&self) -> bool {
        self.rebuilt.load(Ordering::Acquire)
    }

    /// The attempt names (12 hex) no orphan sweep may touch: every attempt of the node not yet
    /// `Cleaned`, and every attempt a reconcile runs for (whatever its object's fate).
    fn claims(&self) -> BTreeSet<String> {
        let mut claimed: BTreeSet<String> = self
            .store
            .state()
            .iter()
            .filter(|a| a.state() != AttemptState::Cleaned)
            .filter_map(|a| a.spec.attempt_uuid())
            .map(short_hex)
            .collect();
        claimed.extend(self.book().running().cloned());
        claimed
    }

    /// Hands what an attempt whose object went away held to the orphan sweep, and forgets it.
    fn release_gone(&self, uid: &str, held: Option<(String, Abandoned)>) {
        orphans::gone(&self.agent, uid, held);
        self.agent.gate.reconciled(uid);
        self.freshness.forget(uid);
        self.agent.cluster.attempts.journal.forget_written(uid);
        self.agent.cluster.advert_changed.notify_one();
    }

    /// The object of `uid` went away; `last` is the last copy the watch showed.
    fn object_gone(&self, uid: &str, last: &RunnerAttempt) {
        if last.state() == AttemptState::Cleaned {
            // Its cleanup released everything: only the bookkeeping goes.
            let _ = self.book().gone(uid, None);
            self.freshness.forget(uid);
            self.agent.cluster.attempts.journal.forget_written(uid);
            return;
        }
        let decided = self.book().gone(uid, orphans::held_by(last));
        if let Some(held) = decided {
            self.release_gone(uid, held);
        }
    }
}

/// What the stream's events keep for the node as a whole (see the module doc).
struct NodeView {
    ctx: Arc<Supervision>,
    /// The node's attempts by uid as the watch last showed them, and the re-list under way.
    known: HashMap<String, Arc<RunnerAttempt>>,
    listing: HashMap<String, Arc<RunnerAttempt>>,
}

impl NodeView {
    fn on_event(&mut self, event: &Event<RunnerAttempt>) {
        match event {
            Event::Init => self.listing.clear(),
            Event::InitApply(a) => {
                self.shown(a);
                if let Some(uid) = &a.metadata.uid {
                    self.listing.insert(uid.clone(), Arc::new(a.clone()));
                }
                return;
            }
            Event::InitDone => {
                let listed = std::mem::take(&mut self.listing);
                // Missing from a re-list: deleted while the watch was away.
                let gone: Vec<Arc<RunnerAttempt>> = self
                    .known
                    .iter()
                    .filter(|(uid, _)| !listed.contains_key(*uid))
                    .map(|(_, a)| Arc::clone(a))
                    .collect();
                self.known = listed;
                for a in gone {
                    if let Some(uid) = &a.metadata.uid {
                        self.ctx.object_gone(uid, &a);
                    }
                }
                if !self.ctx.is_rebuilt() {
                    let all: Vec<RunnerAttempt> =
                        self.known.values().map(|a| (**a).clone()).collect();
                    rebuild::rebuild(&self.ctx.agent, &all);
                    self.ctx.rebuilt.store(true, Ordering::Release);
                    self.ctx.rebuilt_now.notify_one();
                }
            }
            Event::Apply(a) => {
                self.shown(a);
                if let Some(uid) = &a.metadata.uid {
                    self.known.insert(uid.clone(), Arc::new(a.clone()));
                }
            }
            Event::Delete(a) => {
                if let Some(uid) = &a.metadata.uid {
                    self.known.remove(uid);
                    self.ctx.object_gone(uid, a);
                }
            }
        }
        if self.ctx.is_rebuilt() {
            self.publish();
        }
    }

    fn shown(&self, a: &RunnerAttempt) {
        if let (Some(uid), Some(version)) = (&a.metadata.uid, &a.metadata.resource_version) {
            self.ctx.freshness.shown(uid, version);
        }
    }

    /// The `Pending` attempts (they count against free capacity until admitted) to the Lease,
    /// and the package versions of attempts not yet `Cleaned` to the prune.
    fn publish(&self) {
        let agent = &self.ctx.agent;
        let pending: BTreeSet<String> = self
            .known
            .iter()
            .filter(|(_, a)| a.state() == AttemptState::Pending)
            .map(|(uid, _)| uid.clone())
            .collect();
        if agent.set_pending(pending) {
            agent.cluster.advert_changed.notify_one();
        }
        agent.set_wanted_packages(
            self.known
                .values()
                .filter(|a| a.state() != AttemptState::Cleaned)
                .map(|a| a.spec.snapshot.runner.sha256.clone())
                .collect(),
        );
    }
}

/// One reconcile of attempt `a`: one step on the store's copy (see the module doc).
pub async fn reconcile(
    a: Arc<RunnerAttempt>,
    ctx: Arc<Supervision>,
) -> Result<Action, ReconcileError> {
    let stage = stage_of(a.state());
    let attempt =
        AttemptCtx::of(&ctx.agent.cluster.attempts, &a).map_err(|source| ReconcileError {
            stage: ReconcileStage::Read,
            source,
        })?;
    if !ctx.is_rebuilt() {
        // The first complete list rebuilds the agent's memory before anything is decided.
        return Ok(Action::requeue(ctx.agent.poll));
    }
    // Never a copy older than the agent's own last write of it.
    let written = ctx
        .agent
        .cluster
        .attempts
        .journal
        .last_written(&attempt.uid);
    if let Verdict::Behind(wait) = ctx.freshness.check(
        &attempt.uid,
        a.metadata.resource_version.as_deref(),
        written.as_deref(),
        tokio::time::Instant::now(),
    ) {
        return Ok(Action::requeue(wait));
    }
    let short = a.spec.attempt_uuid().map(short_hex);
    let mut memory = ctx.book().begin(&attempt.uid, short);
    // The controller may start this reconcile from a copy whose object the watch has since shown
    // deleted, after that deletion was handed to the sweep (nothing ran then). The store is
    // updated before the event is seen, and `begin` is now marked, so: if the store no longer
    // holds this object, no step runs, and what it held goes to the sweep exactly once (here if
    // the deletion came after `begin`, else it already went or goes with the event).
    let present = ctx
        .store
        .get(&reflector::ObjectRef::from_obj(a.as_ref()))
        .is_some_and(|now| now.metadata.uid.as_deref() == Some(attempt.uid.as_str()));
    if !present {
        let mut book = ctx.book();
        let gone = book.end(&attempt.uid, memory);
        if gone.is_none() {
            book.by_uid.remove(&attempt.uid);
        }
        drop(book);
        if let Some(held) = gone {
            ctx.release_gone(&attempt.uid, held);
        }
        return Ok(Action::await_change());
    }
    // A panic in one attempt's step fails that reconcile, not the controller.
    let stepped =
        std::panic::AssertUnwindSafe(supervise::step(&ctx.agent, &attempt, &a, &mut memory))
            .catch_unwind()
            .await
            .unwrap_or_else(|_| Err(StepError::Local("the step panicked".into())));
    let gone = ctx.book().end(&attempt.uid, memory);
    if let Some(held) = gone {
        ctx.release_gone(&attempt.uid, held);
        return Ok(Action::await_change());
    }
    let agent = &ctx.agent;
    let action = match stepped {
        Ok(Step::Done) => {
            agent.gate.reconciled(&attempt.uid);
            agent.cluster.advert_changed.notify_one();
            Action::await_change()
        }
        Ok(Step::Again) => {
            // The write's watch event reconciles it again at once; a step that wrote nothing
            // after all looks again after this bound.
            agent.cluster.advert_changed.notify_one();
            Action::requeue(WRITE_SEEN_WITHIN)
        }
        Ok(Step::Wait) => {
            agent.gate.reconciled(&attempt.uid);
            Action::requeue(agent.poll)
        }
        Err(StepError::Blocked(why)) => {
            blocked(&ctx, &attempt, &a, why).await;
            return Err(ReconcileError {
                stage,
                source: StepError::Blocked(why),
            });
        }
        Err(source) => return Err(ReconcileError { stage, source }),
    };
    if let Some(e) = ctx.book().by_uid.get_mut(&attempt.uid) {
        e.failures = 0;
    }
    Ok(action)
}

/// Recovery of this attempt cannot finish: said on the Lease (through the gate), and once in
/// the log and an Event.
async fn blocked(ctx: &Supervision, attempt: &AttemptCtx, a: &RunnerAttempt, why: RecoveryBlocked) {
    let agent = &ctx.agent;
    agent.gate.block(&attempt.uid, why);
    agent.cluster.advert_changed.notify_one();
    let first = {
        let mut book = ctx.book();
        let entry = book.by_uid.entry(attempt.uid.clone()).or_default();
        !std::mem::replace(&mut entry.reported, true)
    };
    if !first {
        return;
    }
    tracing::warn!(
        namespace = %attempt.namespace,
        attempt = %attempt.name,
        "recovery blocked: {}",
        why.as_str()
    );
    let what = match why {
        RecoveryBlocked::IdentityUnreadable => {
            "the runner's identity file cannot be read; a person must check the runtime"
        }
        RecoveryBlocked::GitHubUnreachable => {
            "GitHub did not answer and this attempt's decision needs it; it is decided once GitHub answers"
        }
        RecoveryBlocked::ListFailed | RecoveryBlocked::JournalWriteFailed => {
            "the API server did not serve what recovery needs"
        }
    };
    events::warn(
        agent,
        a,
        EventReason::RecoveryBlocked,
        format!(
            "recovery of this node is incomplete: {} ({what})",
            why.as_str()
        ),
    )
    .await;
}

/// A failed reconcile: counted by stage, logged, and tried again after the attempt's backoff
/// (an event on the attempt reconciles it sooner).
pub fn error_policy(a: Arc<RunnerAttempt>, e: &ReconcileError, ctx: Arc<Supervision>) -> Action {
    ctx.agent.metrics().reconcile_failed(e.stage);
    let failures = match a.metadata.uid.as_deref() {
        Some(uid) => {
            let mut book = ctx.book();
            let entry = book.by_uid.entry(uid.to_owned()).or_default();
            entry.failures = entry.failures.saturating_add(1);
            entry.failures
        }
        None => 1,
    };
    let wait = error_backoff(ctx.agent.poll, failures);
    if !matches!(e.source, StepError::Blocked(_)) {
        tracing::warn!(
            namespace = a.metadata.namespace.as_deref().unwrap_or_default(),
            attempt = a.metadata.name.as_deref().unwrap_or_default(),
            stage = e.stage.as_str(),
            "{e}; next try in {} ms",
            wait.as_millis()
        );
    }
    Action::requeue(wait)
}

/// Runs the controller over the node's attempts, and the orphan sweep beside it, until the
/// watch ends.
pub async fn run(agent: Arc<Agent>) {
    let api = Api::<RunnerAttempt>::all(agent.cluster.kube.clone());
    let selector = format!("{NODE_LABEL}={}", agent.cluster.node);
    let (store, writer) = reflector::store();
    // Journal writes are decided on the same copies the reconciles read.
    agent
        .cluster
        .attempts
        .journal
        .decide_on_watched(store.clone());
    let ctx = Arc::new(Supervision::new(agent, store.clone()));
    let mut view = NodeView {
        ctx: Arc::clone(&ctx),
        known: HashMap::new(),
        listing: HashMap::new(),
    };
    let on_error = Arc::clone(&ctx);
    let trigger = watcher::watcher(api, watcher::Config::default().labels(&selector))
        .default_backoff()
        .reflect(writer)
        .inspect_ok(move |event| view.on_event(event))
        .inspect_err(move |_| {
            if !on_error.is_rebuilt() {
                // Before the first complete list recovery cannot even start: say so.
                on_error.agent.gate.list_failed();
                on_error.agent.cluster.advert_changed.notify_one();
            }
        })
        .applied_objects();
    // The pods the agent made on this node trigger their attempt's reconcile (by the controller
    // owner reference): a runner pod that ended, a placeholder deleted or evicted. Watched only
    // when the agent makes pods.
    let pod_watch = Arc::clone(&ctx.agent.cluster.pod_watch);
    let makes_pods = ctx.agent.providers.makes_pods() || ctx.agent.cluster.placeholders.is_some();
    let controller = Controller::for_stream(trigger, store);
    let controller = match makes_pods
        .then(|| pod_watch.stream(&ctx.agent.cluster.kube, &ctx.agent.cluster.node))
        .flatten()
    {
        Some(pods) => controller.owns_stream(pods),
        None => controller,
    };
    let pods_ready = async move {
        if makes_pods {
            pod_watch.mark_running_when_ready().await;
        }
        std::future::pending::<()>().await
    };
    let controller = controller
        .run(reconcile, error_policy, Arc::clone(&ctx))
        .for_each(|result| async move {
            if let Err(controller::Error::QueueError(e)) = result {
                tracing::warn!("watching attempts failed: {e}");
            }
        });
    tokio::select! {
        () = controller => {}
        () = sweep_orphans(ctx) => {}
        () = pods_ready => {}
    }
}

/// The orphan sweep: first right after the first complete list (what a previous run left for
/// attempts deleted while it was down), then every `--orphan-sweep-seconds`.
async fn sweep_orphans(ctx: Arc<Supervision>) {
    while !ctx.is_rebuilt() {
        ctx.rebuilt_now.notified().await;
    }
    let mut tick = tokio::time::interval(ctx.agent.orphan_sweep);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        orphans::sweep(&ctx.agent, &|| ctx.claims()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(uid: &str) -> Option<(String, Abandoned)> {
        Some((
            "0123456789ab".to_owned(),
            Abandoned {
                uid: uid.to_owned(),
                slot: None,
            },
        ))
    }

    #[test]
    fn an_attempt_gone_while_nothing_reconciles_it_goes_to_the_sweep_at_once() {
        let mut book = Book::default();
        let memory = book.begin("u", Some("0123456789ab".into()));
        assert_eq!(book.end("u", memory), None);
        assert_eq!(book.gone("u", held("u")), Some(held("u")));
        assert!(book.by_uid.is_empty(), "forgotten");
    }

    #[test]
    fn an_attempt_gone_during_its_reconcile_goes_to_the_sweep_when_that_ends() {
        let mut book = Book::default();
        let memory = book.begin("u", Some("0123456789ab".into()));
        assert_eq!(
            book.running().cloned().collect::<Vec<_>>(),
            ["0123456789ab"],
            "claimed while its reconcile runs"
        );
        assert_eq!(book.gone("u", held("u")), None, "not while it runs");
        assert_eq!(book.running().count(), 1, "still claimed");
        assert_eq!(book.end("u", memory), Some(held("u")));
        assert_eq!(book.running().count(), 0);
        assert!(book.by_uid.is_empty(), "forgotten");
    }

    #[test]
    fn memory_survives_between_reconciles() {
        let mut book = Book::default();
        let memory = book.begin("u", None);
        book.end("u", memory);
        assert!(book.by_uid.contains_key("u"));
        assert_eq!(
            book.running().count(),
            0,
            "a nameless attempt claims nothing"
        );
    }

    #[test]
    fn failed_reconciles_back_off_from_the_supervision_interval_to_the_cap() {
        let poll = Duration::from_millis(500);
        assert_eq!(error_backoff(poll, 1), poll);
        assert_eq!(error_backoff(poll, 2), poll * 2);
        assert_eq!(error_backoff(poll, 4), poll * 8);
        assert_eq!(error_backoff(poll, 6), MAX_ERROR_BACKOFF);
        assert_eq!(error_backoff(poll, u32::MAX), MAX_ERROR_BACKOFF);
        assert_eq!(error_backoff(poll, 0), poll, "counted from one");
    }

    #[test]
    fn each_state_counts_its_failures_under_its_stage() {
        use AttemptState as S;
        assert_eq!(stage_of(S::Pending), ReconcileStage::Launch);
        for s in [S::Allocated, S::Preparing, S::Prepared, S::JitReceived] {
            assert_eq!(stage_of(s), ReconcileStage::Resume, "{s:?}");
        }
        for s in [S::Starting, S::Idle, S::Busy] {
            assert_eq!(stage_of(s), ReconcileStage::Supervise, "{s:?}");
        }
        for s in S::ALL.into_iter().filter(|s| s.is_terminal()) {
            assert_eq!(stage_of(s), ReconcileStage::Cleanup, "{s:?}");
        }
    }
}
