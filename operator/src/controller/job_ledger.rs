//! Demand signals (DESIGN §7): the webhook receiver's sink, which records jobs in the matching
//! policy's `status.pendingJobs` (every replica), and the leader's repairs — polling queued runs
//! of repository targets and one `GET …/actions/jobs/{id}` for a job pending past its grace.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::Store;
use runner_manager_crds::names::attempt_name;
use runner_manager_crds::policy::{PENDING_JOBS_BOUND, ScalePolicy};
use runner_manager_crds::target::{GitHubTarget, TargetKind};
use serde_json::{Map, Value, json};

use super::ledger_batch::{BatchError, LedgerBatches};
use super::writes::Writer;
use crate::github::client::GitHubClient;
use crate::github::errors::GitHubError;
use crate::policy::matching::{JobLabels, PolicyLabels, match_job};
use crate::webhook::{JobAction, JobEvent, JobSink, SinkError};

/// The policies a job could belong to, parsed once per use.
#[derive(Debug)]
pub struct Candidates {
    policies: Vec<std::sync::Arc<ScalePolicy>>,
    targets: Vec<Option<TargetKind>>,
}

impl Candidates {
    pub fn of(policies: Vec<std::sync::Arc<ScalePolicy>>, webhook_only: bool) -> Self {
        let policies: Vec<_> = policies
            .into_iter()
            .filter(|p| !webhook_only || p.spec.scaling.webhook)
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        let targets = policies
            .iter()
            .map(|p| GitHubTarget::parse(&p.spec.github.url).ok().map(|t| t.kind))
            .collect();
        Self { policies, targets }
    }

    /// The policy a job belongs to: the one whose labels cover its `runs-on` with the fewest
    /// extra labels, ties by namespace and name (DESIGN §7).
    fn matching(&self, job: &JobLabels<'_>) -> Option<&ScalePolicy> {
        let labels: Vec<PolicyLabels<'_>> = self
            .policies
            .iter()
            .zip(&self.targets)
            .filter_map(|(p, t)| {
                Some(PolicyLabels {
                    namespace: p.metadata.namespace.as_deref()?,
                    name: p.metadata.name.as_deref()?,
                    target: t.as_ref()?,
                    labels: &p.spec.labels,
                })
            })
            .collect();
        let chosen = match_job(job, &labels)?;
        self.policies
            .iter()
            .find(|p| {
                p.metadata.namespace.as_deref() == Some(chosen.namespace)
                    && p.metadata.name.as_deref() == Some(chosen.name)
            })
            .map(AsRef::as_ref)
    }
}

/// The entries to add: jobs not yet in the ledger, while it has room. Pure.
pub fn additions(
    ledger: &BTreeMap<String, Time>,
    jobs: impl IntoIterator<Item = i64>,
    now: Timestamp,
) -> Map<String, Value> {
    let mut out = Map::new();
    for id in jobs {
        let key = id.to_string();
        if ledger.contains_key(&key) || out.contains_key(&key) {
            continue;
        }
        if ledger.len() + out.len() >= PENDING_JOBS_BOUND {
            break;
        }
        out.insert(key, json!(Time(now)));
    }
    out
}

/// The entries a complete poll of a repository target proves are no longer queued: recorded
/// before `cutoff` and absent from the poll's queued jobs. Without this, a job whose `in_progress`
/// and `completed` deliveries were lost stays in the ledger until its per-job check and keeps a
/// runner launched for it (over-provisioning). The cutoff lies a poll interval before the poll,
/// because GitHub's run list can lag behind the `queued` delivery of a brand-new job. Pure.
pub fn stale_after_poll(
    ledger: &BTreeMap<String, Time>,
    queued: &[i64],
    cutoff: Timestamp,
) -> Map<String, Value> {
    let found: std::collections::BTreeSet<String> = queued.iter().map(i64::to_string).collect();
    ledger
        .iter()
        .filter(|(job, at)| !found.contains(*job) && at.0 < cutoff)
        .map(|(job, _)| (job.clone(), Value::Null))
        .collect()
}

/// The webhook receiver's sink on every replica.
pub struct KubeSink {
    pub writer: Writer,
    pub policies: Store<ScalePolicy>,
    /// Deliveries for one policy that arrive together share one ledger patch.
    pub batches: LedgerBatches,
}

/// Why a delivery could not be recorded (GitHub redelivers on the 503 it gets).
#[derive(Debug, thiserror::Error)]
enum ApplyError {
    #[error(transparent)]
    Ledger(#[from] BatchError),
    #[error("writing the attempt's job: {0}")]
    JobFact(#[from] kube::Error),
}

impl KubeSink {
    async fn apply(&self, event: JobEvent) -> Result<(), ApplyError> {
        let candidates = Candidates::of(self.policies.state(), true);
        let job = JobLabels {
            repository: &event.repository,
            enterprise: event.enterprise.as_deref(),
            labels: &event.labels,
        };
        let Some(policy) = candidates.matching(&job) else {
            return Ok(());
        };
        let ns = policy.metadata.namespace.as_deref().unwrap_or_default();
        let name = policy.metadata.name.as_deref().unwrap_or_default();
        let empty = BTreeMap::new();
        let ledger = policy.status.as_ref().map_or(&empty, |s| &s.pending_jobs);
        let key = event.job_id.to_string();
        let id = i64::try_from(event.job_id).unwrap_or(i64::MAX);
        match event.action {
            JobAction::Queued => {
                let add = additions(ledger, [id], Timestamp::now());
                self.batches.write(&self.writer, ns, name, add).await?;
            }
            JobAction::Waiting => {}
            JobAction::InProgress | JobAction::Completed => {
                // Removed whether or not our cache shows it yet: a `queued` recorded a moment
                // ago may not have reached the cache, and a null on an absent key is harmless.
                let mut remove = Map::new();
                remove.insert(key, Value::Null);
                self.batches.write(&self.writer, ns, name, remove).await?;
                // The attempt whose runner took it learns its job at once.
                if event.action == JobAction::InProgress
                    && let Some(attempt) = event.attempt()
                {
                    let fact = json!({
                        "id": id,
                        "runId": i64::try_from(event.run_id).unwrap_or(i64::MAX),
                        "repository": event.repository,
                    });
                    self.writer
                        .job_fact(ns, &attempt_name(name, attempt), &fact)
                        .await?;
                }
            }
        }
        Ok(())
    }
}

impl JobSink for KubeSink {
    async fn record(&self, event: JobEvent) -> Result<(), SinkError> {
        self.apply(event).await.map_err(|e| {
            tracing::warn!(error = %e, "recording a job in the ledger failed");
            SinkError::Unavailable
        })
    }
}

/// Queued jobs of a repository target that belong to `policy` (polling repairs missed
/// deliveries). The repository's queued jobs are polled once per `max_age` for all its
/// policies (one call for the queued runs, one per queued run for its jobs); `candidates` is
/// built once per pass.
pub async fn poll_queued(
    client: &GitHubClient,
    policy: &ScalePolicy,
    candidates: &Candidates,
    max_age: std::time::Duration,
    settle: std::time::Duration,
) -> Result<Vec<i64>, GitHubError> {
    let TargetKind::Repository { owner, repo } = &client.target().kind else {
        return Ok(vec![]);
    };
    let repository = format!("{owner}/{repo}");
    let mut found = Vec::new();
    for job in client.recent_queued_jobs(max_age, settle).await?.iter() {
        let labels = JobLabels {
            repository: &repository,
            enterprise: None,
            labels: &job.labels,
        };
        let ours = candidates
            .matching(&labels)
            .is_some_and(|p| p.metadata.uid == policy.metadata.uid && p.metadata.uid.is_some());
        if ours {
            found.push(job.id);
        }
    }
    Ok(found)
}

/// Whether a pending job should leave the ledger: GitHub says it is no longer queued (taken,
/// done, cancelled) or no longer exists.
pub async fn no_longer_pending(client: &GitHubClient, job_id: i64) -> Result<bool, GitHubError> {
    let TargetKind::Repository { owner, repo } = &client.target().kind else {
        return Ok(false);
    };
    match client.job(owner, repo, job_id).await {
        Ok(job) => Ok(job.status != "queued" && job.status != "waiting"),
        Err(e) if e.status() == Some(404) => Ok(true),
        Err(e) => Err(e),
    }
}

impl std::fmt::Debug for KubeSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeSink").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poll_removes_only_old_entries_it_no_longer_sees_queued() {
        let t = |s| Time(Timestamp::from_second(s).unwrap());
        let ledger: BTreeMap<String, Time> = [
            ("1".to_owned(), t(100)), // old, still queued: kept
            ("2".to_owned(), t(100)), // old, no longer queued: removed
            ("3".to_owned(), t(200)), // recorded after the cutoff (a brand-new job): kept
        ]
        .into();
        let cutoff = Timestamp::from_second(150).unwrap();
        let stale = stale_after_poll(&ledger, &[1], cutoff);
        assert_eq!(stale.keys().cloned().collect::<Vec<_>>(), vec!["2"]);
        assert_eq!(stale["2"], Value::Null);
    }

    #[test]
    fn additions_skip_known_jobs_and_respect_the_bound() {
        let now = Timestamp::from_second(100).unwrap();
        let mut ledger = BTreeMap::new();
        ledger.insert("1".to_owned(), Time(now));
        let add = additions(&ledger, [1, 2, 2, 3], now);
        assert_eq!(add.keys().cloned().collect::<Vec<_>>(), vec!["2", "3"]);
        let full: BTreeMap<String, Time> = (0..PENDING_JOBS_BOUND)
            .map(|i| (i.to_string(), Time(now)))
            .collect();
        assert!(additions(&full, [5_000_000], now).is_empty());
    }
}
