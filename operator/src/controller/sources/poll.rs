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
use crate::controller::errors::{DemandError, GitHubRead, ReadFailed};
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
    /// Whether a read made while the policy was proven has succeeded since it last became
    /// proven: until then, deliveries were dropped and nothing is left to settle.
    caught_up: bool,
    /// The last catch-up read failed: the next waits for the usual interval, so a GitHub that
    /// keeps failing is not asked again at every pass.
    catch_up_failed: bool,
    checks: JobChecks,
}

impl RepositoryPoll {
    pub fn new(settle: std::time::Duration) -> Self {
        Self {
            settle,
            last_poll: None,
            caught_up: false,
            catch_up_failed: false,
            checks: JobChecks::default(),
        }
    }
}

/// How a pass reads the repository's queue: how old a shared answer may be, and how young a run
/// it skips.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    pub max_age: std::time::Duration,
    pub settle: std::time::Duration,
}

/// Whether this pass reads the queue, and how. Pure.
///
/// The settle margin exists only for runs whose deliveries the policy receives. The webhook sink
/// drops every delivery for a policy that is not proven (`Candidates::eligible`), and the poll
/// matches no job to it either. So at the first pass after the policy becomes proven (created,
/// its spec changed, its credentials repaired, the operator restarted) the read is at once,
/// fresh (no older answer another policy shared, settled) and skips no run: a job queued
/// before the policy was Ready starts then, not one or two poll intervals late. A catch-up read
/// that failed (`retry_waits`) is tried again at the usual interval only.
pub fn plan(
    proven: bool,
    caught_up: bool,
    retry_waits: bool,
    since_last: Option<std::time::Duration>,
    poll: std::time::Duration,
    settle: std::time::Duration,
) -> Option<Read> {
    use std::time::Duration;
    let due = since_last.is_none_or(|d| d >= poll);
    let settled = Read {
        max_age: poll / 2,
        settle,
    };
    if proven && !caught_up && (due || !retry_waits) {
        Some(Read {
            max_age: Duration::ZERO,
            settle: Duration::ZERO,
        })
    } else {
        due.then_some(settled)
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
            let candidates = (p.candidates)();
            // As the matcher sees it (the webhook sink's and the poll's): a Ready status it
            // was built before does not count yet.
            let proven = candidates.eligible(p.policy);
            self.caught_up &= proven;
            self.catch_up_failed &= proven;
            let since_last = self.last_poll.map(|t| t.elapsed());
            let planned = plan(
                proven,
                self.caught_up,
                self.catch_up_failed,
                since_last,
                poll,
                self.settle,
            );
            if let Some(read) = planned {
                self.last_poll = Some(Instant::now());
                let cutoff = before(p.now, poll);
                let catching_up = proven && !self.caught_up;
                let polled = poll_queued(client, p.policy, &candidates, read).await;
                self.catch_up_failed = catching_up && polled.is_err();
                match polled {
                    Ok(jobs) => {
                        self.caught_up = proven;
                        out.change = stale_after_poll(p.ledger, &jobs, cutoff);
                        out.change.extend(additions(p.ledger, jobs, p.now));
                    }
                    Err(source) => out.errors.push(DemandError::Read(ReadFailed {
                        what: GitHubRead::QueuedJobs,
                        source,
                    })),
                }
            }
            self.checks.check(&p, &mut out).await;
            out
        })
    }
}

/// Queued jobs of a repository target that belong to `policy` (polling repairs missed
/// deliveries). The repository's queued jobs are polled once per `read.max_age` for all its
/// policies (one call for the queued runs, one per queued run for its jobs); `candidates` is
/// built once per pass.
pub async fn poll_queued(
    client: &GitHubClient,
    policy: &ScalePolicy,
    candidates: &Candidates,
    read: Read,
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
        .recent_queued_jobs(read.max_age, read.settle)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_first_read_after_the_policy_is_proven_is_at_once_fresh_and_skips_no_run() {
        let poll = Duration::from_secs(60);
        let settle = poll;
        let settled = Some(Read {
            max_age: Duration::from_secs(30),
            settle,
        });
        let unsettled = Some(Read {
            max_age: Duration::ZERO,
            settle: Duration::ZERO,
        });
        let just = Some(Duration::from_secs(1));
        // Unproven: matched jobs are none, deliveries dropped: the usual rhythm.
        assert_eq!(plan(false, false, false, None, poll, settle), settled);
        assert_eq!(plan(false, false, false, just, poll, settle), None);
        // Proven a second after the last read: read again now, skipping nothing.
        assert_eq!(plan(true, false, false, just, poll, settle), unsettled);
        assert_eq!(plan(true, false, false, None, poll, settle), unsettled);
        // That read failed: tried again at the interval, not at every pass.
        assert_eq!(plan(true, false, true, just, poll, settle), None);
        assert_eq!(plan(true, false, true, Some(poll), poll, settle), unsettled);
        // Caught up: once per interval, a poll interval behind the webhooks.
        assert_eq!(plan(true, true, false, just, poll, settle), None);
        assert_eq!(plan(true, true, false, Some(poll), poll, settle), settled);
    }
}
