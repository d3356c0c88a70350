//! The leader's scale-set listener (issue 19; docs/demand-modes.md): for each `ScaleSet` policy,
//! one message session on its runner scale set, long-polled; job events feed the same ledger
//! as webhooks (`status.pendingJobs`), so demand, placement and the broker work as for any policy.
//!
//! - Only the leader listens: the listener lives in the leader's per-policy memory and is
//!   aborted with it (leadership lost, policy deleted or changed).
//! - The session's id is kept on the policy (annotation [`SESSION_ANNOTATION`]): a new leader
//!   whose session conflicts deletes the session recorded there (the old leader's) and opens its
//!   own at once instead of waiting for it to lapse.
//! - A message is deleted only after its jobs are written to the ledger: a leader killed
//!   mid-message loses nothing (GitHub gives the message to the next session), and the ledger is
//!   keyed by runner request id, so a message handled twice adds no job twice.
//! - `JobAvailable` is acquired only when the policy's labels cover the job's (the scale set was
//!   created with them); `JobAssigned` records the job too (a job the old leader acquired before
//!   it died); `JobStarted` and `JobCompleted` remove it.
//! - An expired message-queue token is renewed (`PATCH`); a session that cannot be renewed is
//!   opened again; any other failure backs off and tries again.
//! - **Lifecycle** (issue 19): before the set is created the policy carries the finalizer
//!   [`lifecycle::SCALE_SET_FINALIZER`]; each start makes the set match the policy's labels and
//!   runner group (`PATCH` in place) and records its id ([`SET_ID_ANNOTATION`]); the set is
//!   deleted by [`lifecycle`] once the policy is deleted and drained, or left the mode.
//! - **Backpressure**: no more jobs are acquired than the policy can serve (`maxRunners` minus
//!   busy runners and pending jobs, and the ledger's bound); the rest stay available on GitHub
//!   (another scale set may take them) and are acquired later from `acquirablejobs` as room
//!   frees.
//! - **Ledger repair**: a job whose `JobStarted` was lost is removed by its `JobCompleted`; and
//!   while entries are older than [`LEDGER_GRACE`], the set's statistics (read fresh) bound how
//!   many jobs can still be pending, the oldest surplus entries removed.

pub mod lifecycle;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use runner_manager_crds::policy::{DemandMode, PENDING_JOBS_BOUND, ScalePolicy};
use serde_json::{Map, Value};

use crate::controller::writes::Writer;
use crate::github::client::GitHubClient;
use crate::github::registry::Clients;
use crate::github::scaleset::{
    JobMessage, Message, ScaleSetClient, ScaleSetError, Session, Statistics,
};

// The policy's annotations live with the set's lifecycle, which both sides use.
pub use lifecycle::{SESSION_ANNOTATION, SET_ID_ANNOTATION};
/// A ledger entry this old is checked against the set's statistics (a lost `JobStarted`).
pub const LEDGER_GRACE: Duration = Duration::from_secs(20);
/// How often jobs left available for want of room are looked at again.
const DEFERRED_RETRY: Duration = Duration::from_secs(2);

/// What a listener needs.
#[derive(Clone)]
pub struct Params {
    pub writer: Writer,
    pub clients: Arc<Clients>,
    pub rest: Arc<GitHubClient>,
    pub namespace: String,
    pub name: String,
    pub set_name: String,
    /// The policy's labels (which jobs it serves).
    pub labels: Vec<String>,
    /// The labels the scale set is created with (the policy's and the ownership label).
    pub set_labels: Vec<String>,
    pub runner_group_id: i64,
    /// This replica (the session's owner name).
    pub owner: String,
}

type Live = Arc<Mutex<Option<(Arc<ScaleSetClient>, i64, Session)>>>;

/// A running listener; dropping it stops it and deletes its session.
pub struct Listener {
    pub generation: i64,
    task: tokio::task::JoinHandle<()>,
    live: Live,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Params {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Params")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("set_name", &self.set_name)
            .finish_non_exhaustive()
    }
}

impl Listener {
    pub fn start(generation: i64, p: Params) -> Self {
        let live: Live = Arc::default();
        let task = tokio::spawn(run(p, live.clone()));
        Self {
            generation,
            task,
            live,
        }
    }
}

impl Listener {
    /// The listener of a `ScaleSet` policy as resolved: the set carries the policy's labels and
    /// the ownership label, in the resolved runner group.
    pub fn for_policy(
        ctx: &crate::controller::Ctx,
        policy: &ScalePolicy,
        resolved: &crate::controller::resolve::Resolved,
        generation: i64,
    ) -> Self {
        let ns = policy.metadata.namespace.as_deref().unwrap_or_default();
        let name = policy.metadata.name.as_deref().unwrap_or_default();
        let mut set_labels = policy.spec.labels.clone();
        set_labels.push(ctx.settings.ownership_label.clone());
        Self::start(
            generation,
            Params {
                writer: ctx.writer.clone(),
                clients: ctx.clients.clone(),
                rest: resolved.client.clone(),
                namespace: ns.to_owned(),
                name: name.to_owned(),
                set_name: runner_manager_crds::policy::scale_set_name(ns, name),
                labels: policy.spec.labels.clone(),
                set_labels,
                runner_group_id: resolved.runner_group_id,
                owner: std::env::var("HOSTNAME")
                    .unwrap_or_else(|_| "runner-manager-operator".into()),
            },
        )
    }
}

/// The session long-polls in its own task and writes the ledger itself (through the one writer,
/// after each message, before the message is deleted): a pass has nothing to read. No job
/// checks: the ledger's keys are runner request ids, and `JobStarted`/`JobCompleted` remove them.
impl super::source::DemandSource for Listener {
    fn kind(&self) -> super::source::SourceKind {
        super::source::SourceKind::ScaleSet
    }

    fn pass<'a>(
        &'a mut self,
        _: super::source::Pass<'a>,
    ) -> futures_util::future::BoxFuture<'a, super::source::Observed> {
        Box::pin(std::future::ready(super::source::Observed::default()))
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
        let taken = self
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some((client, set, session)) = taken
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move {
                let _ = client.delete_session(set, &session).await;
            });
        }
    }
}

/// Whether the policy's labels cover a job's `runs-on` (`self-hosted` is implied). Pure.
pub fn serves(policy_labels: &[String], request: &[String]) -> bool {
    !request.is_empty()
        && request.iter().all(|l| {
            l.eq_ignore_ascii_case("self-hosted")
                || policy_labels.iter().any(|p| p.eq_ignore_ascii_case(l))
        })
}

/// The ledger change a message makes (runner request id → queued time, or null to remove),
/// and the jobs to acquire. Pure.
pub fn ledger_change(
    labels: &[String],
    message: &Message,
    now: Time,
) -> (Map<String, Value>, Vec<i64>) {
    let mut change = Map::new();
    let mut acquire = Vec::new();
    let stamp = serde_json::to_value(&now).unwrap_or(Value::Null);
    for j in &message.jobs {
        let key = j.runner_request_id.to_string();
        match j.message_type.as_str() {
            "JobAvailable" if serves(labels, &j.request_labels) => {
                acquire.push(j.runner_request_id);
            }
            "JobAssigned" => {
                change.entry(key).or_insert_with(|| stamp.clone());
            }
            "JobStarted" | "JobCompleted" => {
                change.insert(key, Value::Null);
            }
            _ => {}
        }
    }
    (change, acquire)
}

async fn record_session(p: &Params, id: Option<&str>) {
    if let Err(e) = p
        .writer
        .policy_annotations(&p.namespace, &p.name, &[(SESSION_ANNOTATION, id)])
        .await
    {
        tracing::warn!(error = %e, "recording the scale-set session failed");
    }
}

async fn recorded_session(p: &Params) -> Option<String> {
    let api: Api<ScalePolicy> = Api::namespaced(p.writer.kube.clone(), &p.namespace);
    api.get_opt(&p.name)
        .await
        .ok()
        .flatten()?
        .metadata
        .annotations?
        .remove(SESSION_ANNOTATION)
}

/// Open the set's session: a conflict with the session recorded on the policy (the previous
/// leader's) deletes it and tries again; any other conflict waits for the session to lapse.
async fn open(p: &Params, client: &ScaleSetClient, set: i64) -> Result<Session, ScaleSetError> {
    loop {
        match client.create_session(set, &p.owner).await {
            Ok(s) => return Ok(s),
            Err(ScaleSetError::SessionConflict) => {
                if let Some(old) = recorded_session(p).await {
                    tracing::info!(policy = %p.name, "the scale set's session is held by a previous leader: deleting it");
                    let stale = Session {
                        id: old,
                        queue_url: String::new(),
                        queue_token: String::new().into(),
                        statistics: Default::default(),
                    };
                    client.delete_session(set, &stale).await?;
                    record_session(p, None).await;
                    continue;
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// How many more jobs the policy can take on now: `maxRunners` less its busy runners (the
/// larger of its status's count and the set's latest statistics, which know a job started
/// before the policy's status does) and pending jobs, and no more than the ledger's bound
/// leaves room for. Pure.
pub fn room(policy: &ScalePolicy, stats: &Statistics) -> usize {
    // A suspended policy takes no job: they stay in the set's queue.
    if policy.spec.suspend {
        return 0;
    }
    let status = policy.status.clone().unwrap_or_default();
    let pending = status.pending_jobs.len();
    let busy = usize::try_from(status.busy)
        .unwrap_or(0)
        .max(usize::try_from(stats.total_running_jobs.max(stats.total_busy_runners)).unwrap_or(0));
    let max = usize::try_from(policy.spec.max_runners).unwrap_or(usize::MAX);
    max.saturating_sub(busy + pending)
        .min(PENDING_JOBS_BOUND.saturating_sub(pending))
}

/// How many of the set's jobs can still be waiting for a runner, by its statistics: acquired
/// and not yet assigned, or assigned and not yet running, whichever is larger (GitHub's two
/// counts overlap differently by version; the larger never removes a job still waiting). Pure.
pub fn still_pending(stats: &Statistics) -> usize {
    let assigned_waiting = stats.total_assigned_jobs - stats.total_running_jobs;
    usize::try_from(stats.total_acquired_jobs.max(assigned_waiting)).unwrap_or(0)
}

/// The ledger entries the set's statistics prove stale: when the ledger holds more entries than
/// `still_pending` jobs, the oldest surplus among entries recorded before `cutoff` (a
/// `JobStarted` lost on the way; younger entries may not be in the statistics yet). Pure.
pub fn stale_entries(
    ledger: &BTreeMap<String, Time>,
    stats: &Statistics,
    cutoff: k8s_openapi::jiff::Timestamp,
) -> Map<String, Value> {
    let surplus = ledger.len().saturating_sub(still_pending(stats));
    let mut old: Vec<(&String, &Time)> = ledger.iter().filter(|(_, t)| t.0 < cutoff).collect();
    old.sort_by(|a, b| a.1.0.cmp(&b.1.0).then(a.0.cmp(b.0)));
    old.into_iter()
        .take(surplus)
        .map(|(k, _)| (k.clone(), Value::Null))
        .collect()
}

/// Why the listener stops for good.
enum Stop {
    /// The policy is being deleted, left the scale-set mode or is gone: no more jobs for it.
    Retired,
}

async fn run(p: Params, live: Live) {
    let mut backoff = Duration::from_millis(500);
    loop {
        match session(&p, &live).await {
            Ok(Stop::Retired) => {
                let taken = live.lock().unwrap_or_else(PoisonError::into_inner).take();
                if let Some((client, set, session)) = taken {
                    let _ = client.delete_session(set, &session).await;
                }
                tracing::info!(policy = %p.name, "the policy left the scale-set mode: its listener stops");
                return;
            }
            Err(e) => {
                tracing::warn!(policy = %p.name, error = %e, "scale-set listener failed; trying again");
                if matches!(e, ScaleSetError::Service { status: 404, .. }) {
                    p.clients.forget_scale_set(&p.rest, &p.set_name);
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// The policy as the API server has it now; `None` when it is gone, being deleted or no
/// longer in the scale-set mode (the listener must not acquire for it, nor create its set).
async fn current(p: &Params) -> Result<Option<ScalePolicy>, ScaleSetError> {
    let api: Api<ScalePolicy> = Api::namespaced(p.writer.kube.clone(), &p.namespace);
    let policy = api
        .get_opt(&p.name)
        .await
        .map_err(|_| ScaleSetError::Transport)?;
    Ok(policy.filter(|sp| {
        sp.metadata.deletion_timestamp.is_none() && sp.spec.github.demand == DemandMode::ScaleSet
    }))
}

/// The scale set's finalizer on the policy before the set may be created, so that its deletion
/// (or a crash in between) never leaks the set.
async fn hold_finalizer(p: &Params, policy: &ScalePolicy) -> Result<(), ScaleSetError> {
    let mut finalizers = policy.metadata.finalizers.clone().unwrap_or_default();
    if finalizers
        .iter()
        .any(|f| f == lifecycle::SCALE_SET_FINALIZER)
    {
        return Ok(());
    }
    finalizers.push(lifecycle::SCALE_SET_FINALIZER.to_owned());
    p.writer
        .policy_finalizers(policy, finalizers)
        .await
        .map_err(|_| ScaleSetError::Transport)
}

async fn record_set_id(p: &Params, policy: &ScalePolicy, id: i64) {
    let recorded = policy
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SET_ID_ANNOTATION))
        .and_then(|v| v.parse::<i64>().ok());
    if recorded == Some(id) {
        return;
    }
    let id = id.to_string();
    if let Err(e) = p
        .writer
        .policy_annotations(&p.namespace, &p.name, &[(SET_ID_ANNOTATION, Some(&id))])
        .await
    {
        tracing::warn!(error = %e, "recording the scale-set id failed");
    }
}

/// Acquire up to `room` of `wanted` (runner request ids), recording the acquired ones in
/// `change`; the others are left available on GitHub and remembered in `deferred`.
#[allow(clippy::too_many_arguments)]
async fn acquire(
    client: &ScaleSetClient,
    set: i64,
    session: &Session,
    wanted: Vec<i64>,
    room: usize,
    deferred: &mut BTreeSet<i64>,
    change: &mut Map<String, Value>,
    stamp: &Value,
) -> Result<(), ScaleSetError> {
    let (now, later) = wanted.split_at(room.min(wanted.len()));
    deferred.extend(later.iter().copied());
    if now.is_empty() {
        return Ok(());
    }
    for id in now {
        deferred.remove(id);
    }
    for id in client.acquire_jobs(set, session, now).await? {
        change.entry(id.to_string()).or_insert(stamp.clone());
    }
    Ok(())
}

/// One session, until it cannot go on (an error) or the policy leaves the mode.
async fn session(p: &Params, live: &Live) -> Result<Stop, ScaleSetError> {
    let Some(policy) = current(p).await? else {
        return Ok(Stop::Retired);
    };
    hold_finalizer(p, &policy).await?;
    let known = policy
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SET_ID_ANNOTATION))
        .and_then(|v| v.parse::<i64>().ok());
    let (client, set) = p
        .clients
        .reconcile_scale_set(
            &p.rest,
            &p.set_name,
            p.runner_group_id,
            &p.set_labels,
            known,
        )
        .await?;
    record_set_id(p, &policy, set).await;
    let mut session = open(p, &client, set).await?;
    record_session(p, Some(&session.id)).await;
    *live.lock().unwrap_or_else(PoisonError::into_inner) =
        Some((client.clone(), set, session.clone()));
    tracing::info!(policy = %p.name, scale_set = set, "scale-set session opened");
    let mut last = 0;
    // Jobs left available for want of room (acquired later from `acquirablejobs`).
    let mut deferred: BTreeSet<i64> = BTreeSet::new();
    // Jobs may have queued while no session listened: look once.
    let mut look_again = true;
    // The set's latest statistics (the session's, then each message's).
    let mut stats = session.statistics.clone();
    let mut last_ledger_check = tokio::time::Instant::now();
    // Whether the ledger may hold entries (then it is checked every `LEDGER_GRACE`); an idle
    // set with an empty ledger keeps its long polls whole.
    let mut ledger_held = !policy
        .status
        .as_ref()
        .is_none_or(|s| s.pending_jobs.is_empty());
    loop {
        if look_again || !deferred.is_empty() {
            look_again = false;
            take_deferred(p, &client, set, &session, &stats, &mut deferred).await?;
        }
        if ledger_held && last_ledger_check.elapsed() >= LEDGER_GRACE {
            last_ledger_check = tokio::time::Instant::now();
            match check_ledger(p, &client, set).await? {
                None => return Ok(Stop::Retired),
                Some(left) => ledger_held = left > 0,
            }
        }
        // A long poll, cut short to look at deferred jobs or the ledger again (cancelling it
        // loses nothing: a message is given until it is deleted).
        let wake = if !deferred.is_empty() {
            DEFERRED_RETRY
        } else if ledger_held {
            LEDGER_GRACE.saturating_sub(last_ledger_check.elapsed())
        } else {
            crate::github::scaleset::LONG_POLL_TIMEOUT * 2
        };
        let polled = tokio::select! {
            m = client.get_message(&session, last) => m,
            () = tokio::time::sleep(wake) => continue,
        };
        let message = match polled {
            Ok(None) => continue,
            Ok(Some(m)) => m,
            Err(ScaleSetError::Expired) => {
                session = client.refresh_session(set, &session).await?;
                *live.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some((client.clone(), set, session.clone()));
                continue;
            }
            Err(e) if e.is_retryable() && !matches!(e, ScaleSetError::SessionConflict) => {
                tracing::debug!(error = %e, "long poll failed; polling again");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        stats = message.statistics.clone();
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let (mut change, wanted) = ledger_change(&p.labels, &message, now.clone());
        if !wanted.is_empty() {
            // Backpressure: only what the policy can serve now; the API server's view of the
            // policy (its ledger and busy count), read after this listener's own writes.
            let Some(policy) = current(p).await? else {
                return Ok(Stop::Retired);
            };
            let stamp = serde_json::to_value(&now).unwrap_or(Value::Null);
            let room = room(&policy, &message.statistics);
            acquire(
                &client,
                set,
                &session,
                wanted,
                room,
                &mut deferred,
                &mut change,
                &stamp,
            )
            .await?;
        }
        tracing::debug!(
            policy = %p.name,
            message_id = message.id,
            jobs = message.jobs.len(),
            available = message.statistics.total_available_jobs,
            assigned = message.statistics.total_assigned_jobs,
            deferred = deferred.len(),
            "scale-set message"
        );
        if change.values().any(|v| !v.is_null()) {
            ledger_held = true;
        }
        if !change.is_empty() {
            // The message is deleted only once its jobs are in the ledger.
            p.writer
                .pending_jobs(&p.namespace, &p.name, change)
                .await
                .map_err(|_| ScaleSetError::Transport)?;
        }
        client.delete_message(&session, message.id).await?;
        last = message.id;
        // A job completed frees room; more available than acquired may be waiting.
        if message
            .jobs
            .iter()
            .any(|j| j.message_type == "JobCompleted")
            && message.statistics.total_available_jobs > 0
        {
            look_again = true;
        }
    }
}

/// Acquire jobs left available (deferred here, or queued while no session listened) while the
/// policy has room: read from `acquirablejobs`, only those the policy serves.
async fn take_deferred(
    p: &Params,
    client: &ScaleSetClient,
    set: i64,
    session: &Session,
    stats: &Statistics,
    deferred: &mut BTreeSet<i64>,
) -> Result<(), ScaleSetError> {
    let Some(policy) = current(p).await? else {
        return Ok(());
    };
    let room = room(&policy, stats);
    if room == 0 {
        return Ok(());
    }
    let available: Vec<JobMessage> = client.acquirable_jobs(set).await?;
    let ledger = policy.status.clone().unwrap_or_default().pending_jobs;
    let wanted: Vec<i64> = available
        .iter()
        .filter(|j| serves(&p.labels, &j.request_labels))
        .map(|j| j.runner_request_id)
        .filter(|id| !ledger.contains_key(&id.to_string()))
        .collect();
    // Deferred jobs no longer available were taken elsewhere (or cancelled).
    let still: BTreeSet<i64> = available.iter().map(|j| j.runner_request_id).collect();
    deferred.retain(|id| still.contains(id));
    if wanted.is_empty() {
        return Ok(());
    }
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let stamp = serde_json::to_value(&now).unwrap_or(Value::Null);
    let mut change = Map::new();
    acquire(
        client,
        set,
        session,
        wanted,
        room,
        deferred,
        &mut change,
        &stamp,
    )
    .await?;
    if !change.is_empty() {
        tracing::debug!(policy = %p.name, acquired = change.len(), "deferred jobs acquired");
        p.writer
            .pending_jobs(&p.namespace, &p.name, change)
            .await
            .map_err(|_| ScaleSetError::Transport)?;
    }
    Ok(())
}

/// Repair the ledger from the set's statistics (read now, after every write of this listener):
/// entries older than [`LEDGER_GRACE`] beyond what can still be pending leave it. Returns the
/// entries left, `None` when the policy left the mode.
async fn check_ledger(
    p: &Params,
    client: &ScaleSetClient,
    set: i64,
) -> Result<Option<usize>, ScaleSetError> {
    let Some(policy) = current(p).await? else {
        return Ok(None);
    };
    let ledger = policy.status.clone().unwrap_or_default().pending_jobs;
    let now = k8s_openapi::jiff::Timestamp::now();
    let cutoff = now
        .checked_sub(k8s_openapi::jiff::SignedDuration::try_from(LEDGER_GRACE).unwrap_or_default())
        .unwrap_or(now);
    if !ledger.values().any(|t| t.0 < cutoff) {
        return Ok(Some(ledger.len()));
    }
    let Some(stats) = client.get_scale_set(set).await?.and_then(|s| s.statistics) else {
        return Ok(Some(ledger.len()));
    };
    let stale = stale_entries(&ledger, &stats, cutoff);
    let removed = stale.len();
    if removed > 0 {
        tracing::info!(
            policy = %p.name,
            entries = removed,
            still_pending = still_pending(&stats),
            "ledger entries the scale set's statistics no longer count (a lost JobStarted): removed"
        );
        p.writer
            .pending_jobs(&p.namespace, &p.name, stale)
            .await
            .map_err(|_| ScaleSetError::Transport)?;
    }
    Ok(Some(ledger.len() - removed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::github::scaleset::{JobMessage, Statistics};
    use serde_json::json;

    fn job(kind: &str, id: i64, labels: &[&str]) -> JobMessage {
        JobMessage {
            message_type: kind.into(),
            runner_request_id: id,
            repository_name: "web".into(),
            owner_name: "acme".into(),
            job_id: id.to_string(),
            request_labels: labels.iter().map(|l| (*l).to_owned()).collect(),
            runner_name: None,
            result: None,
        }
    }

    #[test]
    fn a_message_acquires_only_the_jobs_the_policy_serves_and_moves_the_ledger() {
        let labels = vec!["linux".to_owned(), "x64".to_owned()];
        let m = Message {
            id: 1,
            kind: "RunnerScaleSetJobMessages".into(),
            jobs: vec![
                job("JobAvailable", 1, &["self-hosted", "linux"]),
                job("JobAvailable", 2, &["self-hosted", "gpu"]),
                job("JobAssigned", 3, &["linux"]),
                job("JobStarted", 4, &["linux"]),
                job("JobCompleted", 5, &["linux"]),
            ],
            statistics: Statistics::default(),
        };
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let (change, acquire) = ledger_change(&labels, &m, now);
        assert_eq!(acquire, vec![1]);
        assert!(change.get("3").is_some_and(|v| !v.is_null()));
        assert!(change.get("4").is_some_and(Value::is_null));
        assert!(change.get("5").is_some_and(Value::is_null));
        assert!(!change.contains_key("1") && !change.contains_key("2"));
    }

    fn stats(acquired: i64, assigned: i64, running: i64) -> Statistics {
        Statistics {
            total_acquired_jobs: acquired,
            total_assigned_jobs: assigned,
            total_running_jobs: running,
            total_busy_runners: running,
            ..Statistics::default()
        }
    }

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn the_statistics_remove_only_the_oldest_surplus_entries_past_the_cutoff() {
        let ledger: BTreeMap<String, Time> = [
            ("1".into(), at(10)),
            ("2".into(), at(20)),
            ("3".into(), at(100)),
        ]
        .into();
        let cutoff = at(50).0;
        // Two still waiting: one surplus, the oldest.
        let stale = stale_entries(&ledger, &stats(2, 3, 1), cutoff);
        assert_eq!(stale.keys().collect::<Vec<_>>(), vec!["1"]);
        // Nothing waits any more: both old entries go, the young one (maybe not counted yet)
        // stays.
        let stale = stale_entries(&ledger, &stats(0, 1, 1), cutoff);
        assert_eq!(stale.keys().collect::<Vec<_>>(), vec!["1", "2"]);
        // As many waiting as recorded: nothing.
        assert!(stale_entries(&ledger, &stats(3, 3, 0), cutoff).is_empty());
        // Either count may say a job waits: the larger wins.
        assert_eq!(still_pending(&stats(0, 4, 1)), 3);
        assert_eq!(still_pending(&stats(2, 0, 0)), 2);
    }

    fn policy(max: u32, busy: u32, pending: usize) -> ScalePolicy {
        let ledger: Map<String, Value> = (0..pending)
            .map(|i| (i.to_string(), json!("2026-01-01T00:00:00Z")))
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "runner-manager.dev/v1alpha1", "kind": "ScalePolicy",
            "metadata": {"namespace": "t", "name": "p"},
            "spec": {"github": {"url": "https://github.com/acme", "credentialsSecretRef": {"name": "c"},
                                "demand": "ScaleSet"},
                     "labels": ["linux"], "maxRunners": max},
            "status": {"busy": busy, "pendingJobs": ledger}
        }))
        .unwrap()
    }

    #[test]
    fn room_is_max_runners_less_busy_and_pending_within_the_ledger_bound() {
        assert_eq!(room(&policy(4, 1, 1), &Statistics::default()), 2);
        assert_eq!(room(&policy(4, 3, 2), &Statistics::default()), 0);
        // The set's statistics know of a started job before the status does.
        assert_eq!(room(&policy(4, 0, 1), &stats(0, 2, 2)), 1);
        // The ledger's bound holds whatever maxRunners says.
        assert_eq!(
            room(
                &policy(1000, 0, PENDING_JOBS_BOUND - 1),
                &Statistics::default()
            ),
            1
        );
        assert_eq!(
            room(&policy(1000, 0, PENDING_JOBS_BOUND), &Statistics::default()),
            0
        );
        // Suspended (issue 31 item 4): no job is acquired; they stay in the set's queue.
        let mut suspended = policy(4, 0, 0);
        suspended.spec.suspend = true;
        assert_eq!(room(&suspended, &Statistics::default()), 0);
    }
}
