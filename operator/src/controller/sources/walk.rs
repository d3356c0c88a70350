//! The organization walk (organization and enterprise targets): every pass advances the walk,
//! reading only the repositories due (`github::walk`); new queued jobs are recorded as soon as it
//! sees them, jobs it saw leave the queue at once, and entries it no longer sees leave once per
//! interval after a complete cycle. Then the job checks.

use std::collections::HashMap;

use futures_util::future::BoxFuture;
use runner_manager_crds::policy::ScalePolicy;
use runner_manager_crds::target::TargetKind;
use tokio::time::Instant;

use super::candidates::Candidates;
use super::checks::JobChecks;
use super::poll::before;
use super::source::{DemandSource, Observed, Pass, SourceKind};
use crate::controller::errors::{GitHubRead, ReconcileError};
use crate::github::client::GitHubClient;
use crate::policy::ledger::{additions, left_queue, stale_after_poll};
use crate::policy::matching::JobLabels;

/// How long a job the walk recorded is not recorded again while the cache catches up with the
/// write.
const RECORDED_MEMORY: std::time::Duration = std::time::Duration::from_secs(30);

#[derive(Debug)]
pub struct OrganizationWalk {
    settle: std::time::Duration,
    last_cycle: Option<Instant>,
    /// Jobs the walk recorded lately, by id: when.
    recorded: HashMap<String, Instant>,
    checks: JobChecks,
}

impl OrganizationWalk {
    pub fn new(settle: std::time::Duration) -> Self {
        Self {
            settle,
            last_cycle: None,
            recorded: HashMap::new(),
            checks: JobChecks::default(),
        }
    }
}

impl DemandSource for OrganizationWalk {
    fn kind(&self) -> SourceKind {
        SourceKind::OrganizationWalk
    }

    fn pass<'a>(&'a mut self, p: Pass<'a>) -> BoxFuture<'a, Observed> {
        Box::pin(async move {
            let mut out = Observed::default();
            let client = &p.resolved.client;
            let poll = p.policy.spec.scaling.poll_interval.as_duration();
            match client.walk_queued_jobs(poll, self.settle).await {
                Ok(view) => {
                    let jobs = walked_jobs_of(client, p.policy, &(p.candidates)(), &view.jobs);
                    self.recorded.retain(|_, at| at.elapsed() < RECORDED_MEMORY);
                    let fresh: Vec<i64> = jobs
                        .iter()
                        .copied()
                        .filter(|j| !self.recorded.contains_key(&j.to_string()))
                        .collect();
                    let mut change = additions(p.ledger, fresh, p.now);
                    change.extend(left_queue(p.ledger, &view.left));
                    for k in change.keys() {
                        self.recorded.insert(k.clone(), Instant::now());
                    }
                    if let Some(since) = view.complete_since
                        && self.last_cycle.is_none_or(|t| t.elapsed() >= poll)
                    {
                        self.last_cycle = Some(Instant::now());
                        // Every repository was read after `since`; a run's list can lag its
                        // job's `queued` delivery, so only entries a poll interval older go.
                        let cutoff = before(p.now, since.elapsed() + poll);
                        change.extend(stale_after_poll(p.ledger, &jobs, cutoff));
                    }
                    out.change = change;
                }
                Err(source) => out.errors.push(ReconcileError::GitHubRead {
                    what: GitHubRead::RepositoryWalk,
                    source,
                }),
            }
            self.checks.check(&p, &mut out).await;
            out
        })
    }
}

/// The walked jobs (organization and enterprise targets) that belong to `policy`. Pure.
pub fn walked_jobs_of(
    client: &GitHubClient,
    policy: &ScalePolicy,
    candidates: &Candidates,
    jobs: &[crate::github::walk::QueuedJob],
) -> Vec<i64> {
    let host = &client.target().host;
    let enterprise = match &client.target().kind {
        TargetKind::Enterprise { enterprise } => Some(enterprise.as_str()),
        _ => None,
    };
    jobs.iter()
        .filter(|q| {
            let labels = JobLabels {
                host,
                repository: &q.repository,
                enterprise,
                labels: &q.job.labels,
            };
            candidates
                .matching(&labels)
                .is_some_and(|p| p.metadata.uid == policy.metadata.uid && p.metadata.uid.is_some())
        })
        .map(|q| q.job.id)
        .collect()
}
