//! Polling at organization and enterprise scope (DESIGN §7): GitHub lists queued workflow runs
//! only per repository, so an organization target's queued jobs are found by walking its
//! repositories (an enterprise target's: its organizations' repositories), and a lost
//! `workflow_job` delivery is repaired within one poll interval.
//!
//! The walk keeps the GitHub budget:
//! - **ETags everywhere**: the repository pages, each repository's queued-run list and each
//!   run's job list are conditional requests; an unchanged answer is a 304, which GitHub does not
//!   charge.
//! - **Runs are read once**: a run's jobs are listed when the run is first seen queued (and
//!   settled); while it stays queued none of its jobs has started, so its jobs are not asked again.
//! - **Pacing**: one cycle over the repositories takes half a poll interval, each repository read
//!   at its slot in the cycle rather than all at once, at most [`WALK_CONCURRENCY`] at a time; the
//!   repository list is read once per interval. Every call is admitted as `Priority::Observe`,
//!   which keeps the credential's reserve (10 % of the window) for JIT mints and stretches when
//!   half the window is spent (`ratelimit`).
//!
//! Every policy of one client (one target, one Secret) shares the walk: a thousand policies of
//! one organization cost one walk.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use runner_manager_crds::target::TargetKind;
use tokio::time::Instant;

use super::errors::GitHubError;
use super::types::{Job, WorkflowRun};

/// Repositories read at once during a walk.
pub const WALK_CONCURRENCY: usize = 4;

/// Jobs whose repository is remembered for the per-job check, at most.
const REMEMBERED_JOBS: usize = 20_000;

/// The calls a walk makes: the client's (`GitHubClient` implements it), behind this seam so the
/// walk sits below the client that holds its state, and a walk can be driven by a script.
pub trait WalkSource: Sync {
    fn target_kind(&self) -> &TargetKind;
    fn enterprise_orgs(
        &self,
        enterprise: &str,
    ) -> impl Future<Output = Result<Vec<String>, GitHubError>> + Send;
    fn org_repos(&self, org: &str)
    -> impl Future<Output = Result<Vec<String>, GitHubError>> + Send;
    fn queued_runs_in(
        &self,
        owner: &str,
        repo: &str,
    ) -> impl Future<Output = Result<Vec<WorkflowRun>, GitHubError>> + Send;
    fn run_jobs_in(
        &self,
        owner: &str,
        repo: &str,
        run_id: i64,
    ) -> impl Future<Output = Result<Vec<Job>, GitHubError>> + Send;
}

/// A queued job and the repository it was found in (`owner/repo`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedJob {
    pub repository: String,
    pub job: Job,
}

/// What the walk knows now.
#[derive(Clone, Debug)]
pub struct WalkView {
    /// The queued jobs last seen across every repository read.
    pub jobs: Arc<Vec<QueuedJob>>,
    /// When the last complete cycle started: every repository was read after this instant.
    /// `None` until one cycle completed.
    pub complete_since: Option<Instant>,
    /// Repositories walked.
    pub repositories: usize,
    /// Jobs seen queued by an earlier read of their repository and absent from a later one
    /// (in the last interval): they left the queue, so their ledger entries can go at once,
    /// without the cycle's margin that entries recorded from deliveries need.
    pub left: Arc<Vec<i64>>,
}

/// The walk's state (inside the client).
#[derive(Debug, Default)]
pub struct Walk {
    repos: Vec<String>,
    listed_at: Option<Instant>,
    cycle_start: Option<Instant>,
    cursor: usize,
    complete_since: Option<Instant>,
    /// Per repository: its queued runs (ids) and their queued jobs.
    by_repo: HashMap<String, Vec<QueuedJob>>,
    /// Jobs of runs already listed, by run id (a queued run's jobs do not start while it stays
    /// queued).
    run_jobs: HashMap<i64, Vec<Job>>,
    /// Repository of every job seen, for the per-job check.
    job_repo: HashMap<i64, String>,
    jobs: Arc<Vec<QueuedJob>>,
    /// Per queued job: its repository and the last read that listed it.
    seen_at: HashMap<i64, (String, Instant)>,
    /// Jobs that left the queue, and when that was seen.
    left: HashMap<i64, Instant>,
}

/// How many repositories of `n` should have been read `elapsed` into a cycle of `span`: the
/// cycle reads them evenly (repository `i` at `i/n` of the span), the first at once. Pure.
pub fn due(n: usize, elapsed: Duration, span: Duration) -> usize {
    if n == 0 {
        return 0;
    }
    if span.is_zero() || elapsed >= span {
        return n;
    }
    let share = elapsed.as_secs_f64() / span.as_secs_f64();
    ((share * n as f64).floor() as usize + 1).min(n)
}

impl Walk {
    /// The repository a job was seen in.
    pub fn repository_of(&self, job: i64) -> Option<&str> {
        self.job_repo.get(&job).map(String::as_str)
    }

    fn remember(&mut self, jobs: &[QueuedJob]) {
        if self.job_repo.len() + jobs.len() > REMEMBERED_JOBS {
            // Keep the jobs still queued; the others' checks fall back to the walk.
            let live: HashSet<i64> = self.by_repo.values().flatten().map(|q| q.job.id).collect();
            self.job_repo.retain(|id, _| live.contains(id));
        }
        for q in jobs {
            self.job_repo.insert(q.job.id, q.repository.clone());
        }
    }

    fn view(&self) -> WalkView {
        WalkView {
            jobs: self.jobs.clone(),
            complete_since: self.complete_since,
            repositories: self.repos.len(),
            left: Arc::new(self.left.keys().copied().collect()),
        }
    }

    /// A read of `repository` at `at` listed `found` queued: the jobs an earlier read listed
    /// there and this one does not have left the queue; `left` keeps them for `keep`.
    fn read(&mut self, repository: &str, found: &[QueuedJob], at: Instant, keep: Duration) {
        let listed: HashSet<i64> = found.iter().map(|q| q.job.id).collect();
        let gone: Vec<i64> = self
            .seen_at
            .iter()
            .filter(|(id, (repo, seen))| repo == repository && *seen < at && !listed.contains(*id))
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.seen_at.remove(&id);
            self.left.insert(id, at);
        }
        for id in listed {
            self.seen_at.insert(id, (repository.to_owned(), at));
            self.left.remove(&id);
        }
        self.left.retain(|_, t| t.elapsed() < keep);
    }
}

/// The repositories of the target: an organization's, or every organization's of an enterprise.
async fn repositories<S: WalkSource>(client: &S) -> Result<Vec<String>, GitHubError> {
    let orgs = match client.target_kind() {
        TargetKind::Organization { org } => vec![org.clone()],
        TargetKind::Enterprise { enterprise } => client.enterprise_orgs(enterprise).await?,
        TargetKind::Repository { owner, repo } => return Ok(vec![format!("{owner}/{repo}")]),
    };
    let mut all = Vec::new();
    for org in orgs {
        all.extend(client.org_repos(&org).await?);
    }
    Ok(all)
}

/// One repository's queued jobs: its queued runs (conditional), the jobs of runs not seen
/// before (conditional), runs younger than `settle` skipped. Returns the jobs and the runs'
/// jobs read now.
async fn read_repo<S: WalkSource>(
    client: &S,
    repository: &str,
    known: &HashMap<i64, Vec<Job>>,
    settle: Duration,
) -> Result<(Vec<QueuedJob>, Vec<(i64, Vec<Job>)>), GitHubError> {
    let Some((owner, repo)) = repository.split_once('/') else {
        return Ok((vec![], vec![]));
    };
    let runs: Vec<WorkflowRun> = client.queued_runs_in(owner, repo).await?;
    let now = k8s_openapi::jiff::Timestamp::now();
    let mut found = Vec::new();
    let mut fresh = Vec::new();
    for run in runs {
        if run.is_younger_than(now, settle) {
            continue;
        }
        let jobs = match known.get(&run.id) {
            Some(jobs) => jobs.clone(),
            None => {
                let jobs = client.run_jobs_in(owner, repo, run.id).await?;
                fresh.push((run.id, jobs.clone()));
                jobs
            }
        };
        found.extend(
            jobs.into_iter()
                .filter(|j| j.status == "queued")
                .map(|job| QueuedJob {
                    repository: repository.to_owned(),
                    job,
                }),
        );
    }
    Ok((found, fresh))
}

/// Advance the walk: list the repositories when the list is an `interval` old, read the
/// repositories due in the current cycle (half an `interval` long), and give the view. A failed
/// read stops this step; what was read before it counts, and the next step resumes there.
pub async fn step<S: WalkSource>(
    client: &S,
    walk: &tokio::sync::Mutex<Walk>,
    interval: Duration,
    settle: Duration,
) -> Result<WalkView, GitHubError> {
    let mut w = walk.lock().await;
    if w.listed_at.is_none_or(|t| t.elapsed() >= interval) {
        let repos = repositories(client).await?;
        let keep: HashSet<&String> = repos.iter().collect();
        w.by_repo.retain(|r, _| keep.contains(r));
        w.seen_at.retain(|_, (r, _)| keep.contains(r));
        if repos != w.repos {
            // A new list starts a new cycle.
            w.cursor = 0;
            w.cycle_start = None;
        }
        w.repos = repos;
        w.listed_at = Some(Instant::now());
    }
    let span = interval / 2;
    let n = w.repos.len();
    let start = match w.cycle_start {
        Some(s) if w.cursor < n || s.elapsed() < span => s,
        _ => {
            let s = Instant::now();
            w.cycle_start = Some(s);
            w.cursor = 0;
            s
        }
    };
    let until = due(n, start.elapsed(), span);
    if w.cursor < until {
        let batch: Vec<String> = w.repos[w.cursor..until].to_vec();
        let known = &w.run_jobs;
        // The reads are built before they are streamed: a closure over `&String` inside the
        // stream would make the reconcile's future not provably `Send` (a higher-ranked
        // lifetime the compiler cannot see through), and the Controller spawns it.
        let reads: Vec<_> = batch
            .iter()
            .map(|r| read_repo(client, r, known, settle))
            .collect();
        let results: Vec<_> = futures_util::stream::iter(reads)
            .buffered(WALK_CONCURRENCY)
            .collect()
            .await;
        let mut failed = None;
        let mut read = 0;
        let mut updates = Vec::new();
        for (repo, result) in batch.iter().zip(results) {
            match result {
                Ok(found) => {
                    read += 1;
                    updates.push((repo.clone(), found));
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let at = Instant::now();
        for (repo, (found, fresh)) in updates {
            w.run_jobs.extend(fresh);
            w.remember(&found);
            w.read(&repo, &found, at, interval.max(Duration::from_secs(10)));
            w.by_repo.insert(repo, found);
        }
        w.cursor += read;
        // Runs no longer queued anywhere are forgotten once a cycle completes.
        if w.cursor == n {
            w.complete_since = Some(start);
            let queued: HashSet<i64> = w.by_repo.values().flatten().map(|q| q.job.run_id).collect();
            w.run_jobs.retain(|run, _| queued.contains(run));
        }
        let jobs: Vec<QueuedJob> = w.by_repo.values().flatten().cloned().collect();
        w.jobs = Arc::new(jobs);
        if let Some(e) = failed {
            return Err(e);
        }
    }
    Ok(w.view())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cycle_reads_its_repositories_evenly_across_its_span() {
        let span = Duration::from_secs(30);
        assert_eq!(due(0, Duration::ZERO, span), 0);
        assert_eq!(due(1000, Duration::ZERO, span), 1, "the first at once");
        assert_eq!(due(1000, Duration::from_secs(15), span), 501);
        assert_eq!(due(1000, Duration::from_secs(29), span), 967);
        assert_eq!(due(1000, span, span), 1000);
        assert_eq!(due(10, Duration::from_secs(1), span), 1);
        assert_eq!(due(10, Duration::from_secs(3), span), 2);
        assert_eq!(due(10, Duration::from_secs(100), span), 10);
        assert_eq!(due(5, Duration::ZERO, Duration::ZERO), 5);
    }

    fn queued(id: i64, repository: &str) -> QueuedJob {
        QueuedJob {
            repository: repository.to_owned(),
            job: serde_json::from_value(serde_json::json!({
                "id": id, "run_id": 1, "status": "queued", "labels": ["self-hosted"]
            }))
            .unwrap(),
        }
    }

    #[test]
    fn a_job_missing_from_a_later_read_of_its_repository_left_the_queue() {
        let mut w = Walk::default();
        let keep = Duration::from_secs(60);
        let t0 = Instant::now();
        w.read(
            "acme/web",
            &[queued(1, "acme/web"), queued(2, "acme/web")],
            t0,
            keep,
        );
        w.read("acme/api", &[queued(3, "acme/api")], t0, keep);
        assert!(w.left.is_empty());
        // A later read of web without job 1: it left; api's job is not touched by web's read.
        let t1 = t0 + Duration::from_millis(1);
        w.read("acme/web", &[queued(2, "acme/web")], t1, keep);
        assert_eq!(w.view().left.as_slice(), &[1]);
        // Listed queued again (a list that lagged): no longer counted as left.
        w.read(
            "acme/web",
            &[queued(1, "acme/web"), queued(2, "acme/web")],
            t1 + Duration::from_millis(1),
            keep,
        );
        assert!(w.view().left.is_empty());
    }
}
