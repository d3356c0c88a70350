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

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use runner_manager_crds::policy::ScalePolicy;
use serde_json::{Map, Value, json};

use super::writes::Writer;
use crate::github::client::GitHubClient;
use crate::github::registry::Clients;
use crate::github::scaleset::{Message, ScaleSetClient, ScaleSetError, Session};

/// Where the live session's id is recorded on the policy.
pub const SESSION_ANNOTATION: &str = "runner-manager.dev/scale-set-session";

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
    let api: Api<ScalePolicy> = Api::namespaced(p.writer.kube.clone(), &p.namespace);
    let body = json!({"metadata": {"annotations": {SESSION_ANNOTATION: id}}});
    if let Err(e) = api
        .patch(&p.name, &PatchParams::default(), &Patch::Merge(body))
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

async fn run(p: Params, live: Live) {
    let mut backoff = Duration::from_millis(500);
    loop {
        match session(&p, &live).await {
            Ok(()) => backoff = Duration::from_millis(500),
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

/// One session, until it cannot go on.
async fn session(p: &Params, live: &Live) -> Result<(), ScaleSetError> {
    let (client, set) = p
        .clients
        .scale_set(&p.rest, &p.set_name, p.runner_group_id, &p.set_labels)
        .await?;
    let mut session = open(p, &client, set).await?;
    record_session(p, Some(&session.id)).await;
    *live.lock().unwrap_or_else(PoisonError::into_inner) =
        Some((client.clone(), set, session.clone()));
    tracing::info!(policy = %p.name, scale_set = set, "scale-set session opened");
    let mut last = 0;
    loop {
        let message = match client.get_message(&session, last).await {
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
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let (mut change, acquire) = ledger_change(&p.labels, &message, now.clone());
        if !acquire.is_empty() {
            let got = client.acquire_jobs(set, &session, &acquire).await?;
            let stamp = serde_json::to_value(&now).unwrap_or(Value::Null);
            for id in got {
                change.entry(id.to_string()).or_insert(stamp.clone());
            }
        }
        tracing::debug!(
            policy = %p.name,
            message = message.id,
            jobs = message.jobs.len(),
            available = message.statistics.total_available_jobs,
            assigned = message.statistics.total_assigned_jobs,
            "scale-set message"
        );
        if !change.is_empty() {
            // The message is deleted only once its jobs are in the ledger.
            p.writer
                .pending_jobs(&p.namespace, &p.name, change)
                .await
                .map_err(|_| ScaleSetError::Transport)?;
        }
        client.delete_message(&session, message.id).await?;
        last = message.id;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::github::scaleset::{JobMessage, Statistics};

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
}
