//! The repository poll: a repository target's queued runs, read once per poll interval (a
//! poll-interval margin behind the webhooks when they are on), repairing missed deliveries;
//! then the job checks.

use futures_util::future::BoxFuture;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use runner_manager_crds::policy::ScalePolicy;
use runner_manager_crds::target::TargetKind;
use tokio::time::Instant;

use super::candidates::Candidates;
use super::checks::JobChecks;
use super::source::{DemandSource, Observed, Pass, SourceKind};
use crate::controller::errors::{GitHubRead, ReconcileError};
use crate::github::client::GitHubClient;
use crate::github::errors::GitHubError;
use crate::policy::ledger::{additions, stale_after_poll};
use crate::policy::matching::JobLabels;

/// With webhooks on, a run is polled once it is a poll interval old: until then its deliveries
/// are most likely in flight. Without them, at once.
pub fn settle(policy: &ScalePolicy) -> std::time::Duration {
    if policy.spec.scaling.webhook {
        policy.spec.scaling.poll_interval.as_duration()
    } else {
        std::time::Duration::ZERO
    }
}

/// `now` less `by`, or `now` when that does not fit.
pub fn before(now: Timestamp, by: std::time::Duration) -> Timestamp {
    now.checked_sub(SignedDuration::try_from(by).unwrap_or_default())
        .unwrap_or(now)
}

#[derive(Debug)]
pub struct RepositoryPoll {
    settle: std::time::Duration,
    last_poll: Option<Instant>,
    checks: JobChecks,
}

impl RepositoryPoll {
    pub fn new(settle: std::time::Duration) -> Self {
        Self {
            settle,
            last_poll: None,
            checks: JobChecks::default(),
        }
    }
}

impl DemandSource for RepositoryPoll {
    fn kind(&self) -> SourceKind {
        SourceKind::RepositoryPoll
    }

    fn pass<'a>(&'a mut self, p: Pass<'a>) -> BoxFuture<'a, Observed> {
        Box::pin(async move {
            let mut out = Observed::default();
            let client = &p.resolved.client;
            let poll = p.policy.spec.scaling.poll_interval.as_duration();
            if self.last_poll.is_none_or(|t| t.elapsed() >= poll) {
                self.last_poll = Some(Instant::now());
                let cutoff = before(p.now, poll);
                match poll_queued(client, p.policy, &(p.candidates)(), poll / 2, self.settle).await
                {
                    Ok(jobs) => {
                        out.change = stale_after_poll(p.ledger, &jobs, cutoff);
                        out.change.extend(additions(p.ledger, jobs, p.now));
                    }
                    Err(source) => out.errors.push(ReconcileError::GitHubRead {
                        what: GitHubRead::QueuedJobs,
                        source,
                    }),
                }
            }
            self.checks.check(&p, &mut out).await;
            out
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
    use tracing::Instrument;
    let repository = format!("{owner}/{repo}");
    let host = &client.target().host;
    let ns = policy.metadata.namespace.as_deref().unwrap_or_default();
    let name = policy.metadata.name.as_deref().unwrap_or_default();
    // The poll's span: the origin (a link) of the traces of the runners its jobs get.
    let span = tracing::info_span!(
        "poll",
        policy.namespace = ns,
        policy.name = name,
        jobs = tracing::field::Empty,
    );
    let queued = client
        .recent_queued_jobs(max_age, settle)
        .instrument(span.clone())
        .await?;
    let mut found = Vec::new();
    for job in queued.iter() {
        let labels = JobLabels {
            host,
            repository: &repository,
            enterprise: None,
            labels: &job.labels,
        };
        let ours = candidates
            .matching(&labels)
            .is_some_and(|p| p.metadata.uid == policy.metadata.uid && p.metadata.uid.is_some());
        if ours {
            found.push(job.id);
            crate::telemetry::origin::origins().record(
                ns,
                name,
                job.id,
                crate::telemetry::origin::Kind::Poll,
                crate::telemetry::origin::span_context(&span),
            );
        }
    }
    span.record("jobs", found.len());
    Ok(found)
}
