//! Job checks: one `GET …/actions/jobs/{id}` for a ledger entry pending past its grace, which
//! removes an entry whose job GitHub no longer queues (a delivery or a poll missed its leaving).
//! Shared by the pull sources that key the ledger by job id (not the scale set's, keyed by
//! runner request id).

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use runner_manager_crds::target::TargetKind;
use serde_json::{Map, Value};
use tokio::time::Instant;

use super::source::{Observed, Pass};
use crate::controller::errors::{DemandError, GitHubRead, ReadFailed};
use crate::github::client::GitHubClient;
use crate::github::errors::GitHubError;

/// When each pending job was last checked, by id.
#[derive(Debug, Default)]
pub struct JobChecks {
    checked: HashMap<String, Instant>,
}

impl JobChecks {
    /// Check each ledger entry of the pass pending longer than its grace and not checked within
    /// it; the removals found join `out`'s change, what failed its errors.
    pub async fn check(&mut self, p: &Pass<'_>, out: &mut Observed) {
        let remove = self
            .removals(
                &p.resolved.client,
                p.ledger,
                p.grace,
                p.now,
                &mut out.errors,
            )
            .await;
        out.change.extend(remove);
    }

    async fn removals(
        &mut self,
        client: &GitHubClient,
        ledger: &BTreeMap<String, Time>,
        grace: std::time::Duration,
        now: Timestamp,
        errors: &mut Vec<DemandError>,
    ) -> Map<String, Value> {
        let mut remove = Map::new();
        for (job, queued) in ledger {
            let age = now
                .as_millisecond()
                .saturating_sub(queued.0.as_millisecond());
            if age < i64::try_from(grace.as_millis()).unwrap_or(i64::MAX) {
                continue;
            }
            if self.checked.get(job).is_some_and(|t| t.elapsed() < grace) {
                continue;
            }
            self.checked.insert(job.clone(), Instant::now());
            let Ok(id) = job.parse::<i64>() else {
                remove.insert(job.clone(), Value::Null);
                continue;
            };
            match no_longer_pending(client, id).await {
                Ok(true) => {
                    remove.insert(job.clone(), Value::Null);
                }
                Ok(false) => {}
                Err(source) => errors.push(DemandError::Read(ReadFailed {
                    what: GitHubRead::QueuedJobs,
                    source,
                })),
            }
        }
        self.checked.retain(|k, _| ledger.contains_key(k));
        remove
    }
}

/// Whether a pending job should leave the ledger: GitHub says it is no longer queued (taken,
/// done, cancelled) or no longer exists. At organization and enterprise scope the job's
/// repository is the one the walk saw it in; a job the walk never saw is left to the walk (a
/// complete cycle without it removes it, `stale_after_poll`).
pub async fn no_longer_pending(client: &GitHubClient, job_id: i64) -> Result<bool, GitHubError> {
    let (owner, repo) = match &client.target().kind {
        TargetKind::Repository { owner, repo } => (owner.clone(), repo.clone()),
        _ => match client.walked_repository_of(job_id).await {
            Some(found) => found,
            None => return Ok(false),
        },
    };
    match client.job(&owner, &repo, job_id).await {
        Ok(job) => Ok(job.status != "queued" && job.status != "waiting"),
        Err(e) if e.status() == Some(404) => Ok(true),
        Err(e) => Err(e),
    }
}
