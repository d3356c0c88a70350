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
use crate::controller::errors::{DemandError, GitHubRead, ReadFailed};
use crate::github::client::GitHubClient;
use crate::policy::ledger::{additions, left_queue, stale_after_poll};
use crate::policy::matching::JobLabels;

/// How long a job the walk recorded is not recorded again while the cache catches up with the
/// write.
const RECORDED_MEMORY: std::time::Duration = std::time::Duration::from_secs(30);

#[derive(Debug)]
pub struct OrganizationWalk {
    settle: std::time::Duration,
    /// Since when the matcher counts the policy proven (`None`: it does not).
    proven_at: Option<Instant>,
    /// Whether a whole cycle of the walk began after `proven_at`: until then, no run is left
    /// unread for being young (see [`walk_settle`]).
    caught_up: bool,
    last_cycle: Option<Instant>,
    /// Jobs the walk recorded lately, by id: when.
    recorded: HashMap<String, Instant>,
    checks: JobChecks,
}

impl OrganizationWalk {
    pub fn new(settle: std::time::Duration) -> Self {
        Self {
            settle,
            proven_at: None,
            caught_up: false,
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
            let candidates = (p.candidates)();
            self.proven_at = candidates
                .eligible(p.policy)
                .then(|| self.proven_at.unwrap_or_else(Instant::now));
            self.caught_up &= self.proven_at.is_some();
            let settle = walk_settle(self.caught_up, self.settle);
            match client.walk_queued_jobs(poll, settle).await {
                Ok(view) => {
                    self.caught_up |= caught_up_after(view.complete_since, self.proven_at);
                    let jobs = walked_jobs_of(client, p.policy, &candidates, &view.jobs);
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
                Err(source) => out.errors.push(DemandError::Read(ReadFailed {
                    what: GitHubRead::RepositoryWalk,
                    source,
                })),
            }
            self.checks.check(&p, &mut out).await;
            out
        })
    }
}

/// How young a run this pass's walk may leave unread. Pure.
///
/// With webhooks on, a run younger than a poll interval is left to its deliveries (`settle`).
/// But the sink drops every delivery for a policy the matcher does not count proven, so until a
/// whole cycle of the walk began after the policy became proven, no run is left unread: a job
/// queued before the policy was Ready starts at the first read of its repository, not one or
/// two poll intervals later (the repository poll's `plan` does the same).
pub fn walk_settle(caught_up: bool, settle: std::time::Duration) -> std::time::Duration {
    if caught_up {
        settle
    } else {
        std::time::Duration::ZERO
    }
}

/// Whether the walk's last complete cycle (begun at `complete_since`) began once the policy was
/// proven (`proven_at`): every repository was then read after the proof, none leaving a young
/// run unread. Pure.
pub fn caught_up_after(complete_since: Option<Instant>, proven_at: Option<Instant>) -> bool {
    matches!((complete_since, proven_at), (Some(since), Some(at)) if since >= at)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn no_young_run_is_left_unread_until_a_whole_cycle_began_after_the_proof() {
        let settle = Duration::from_secs(60);
        assert_eq!(walk_settle(false, settle), Duration::ZERO);
        assert_eq!(walk_settle(true, settle), settle);
        let proof = Instant::now();
        let before = proof.checked_sub(Duration::from_secs(5)).unwrap_or(proof);
        let after = proof + Duration::from_secs(5);
        assert!(!caught_up_after(None, Some(proof)), "no cycle complete yet");
        assert!(!caught_up_after(Some(after), None), "not proven");
        assert!(
            !caught_up_after(Some(before), Some(proof)),
            "a cycle begun before the proof"
        );
        assert!(caught_up_after(Some(after), Some(proof)));
        assert!(caught_up_after(Some(proof), Some(proof)));
    }
}
