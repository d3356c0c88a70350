//! Demand with no inbound connection (issue 19): polling at organization and enterprise scope
//! (the client's walk against the simulated GitHub: what it finds, how soon, what it costs), and
//! the scenario of an organization target whose every webhook is dropped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use runner_manager_crds::policy::ScalePolicy;
use runner_manager_e2e::harness::github::{ORG, SimulatedGitHub, pat_credentials};
use runner_manager_e2e::harness::product::{Product, STEP};
use runner_manager_e2e::harness::wait;
use runner_manager_operator::github::GitHubClient;
use runner_manager_operator::github::walk::WalkView;
use serde_json::{Value, json};

async fn queue(fake: &SimulatedGitHub, owner: &str, repo: &str, labels: &[&str]) -> u64 {
    fake.queue_job(json!({"owner": owner, "repo": repo, "labels": labels, "behaviour": {}}))
        .await
        .unwrap()
}

/// The organization-wide policy `org` (`minIdle` 0, webhooks on), walking the organization's
/// repositories every `poll_interval`.
async fn org_policy(p: &Product, poll_interval: &str) {
    p.policy(
        "org",
        json!({"github": {"url": "https://github.com/acme"}, "minIdle": 0,
               "scaling": {"webhook": true, "pollInterval": poll_interval}}),
    )
    .await
    .unwrap();
}

fn ids(view: &WalkView) -> BTreeSet<u64> {
    view.jobs
        .iter()
        .map(|q| u64::try_from(q.job.id).unwrap())
        .collect()
}

/// Steps the walk until `check` holds or `deadline` passes.
async fn walk_until(
    gh: &GitHubClient,
    interval: Duration,
    deadline: Duration,
    check: impl Fn(&WalkView) -> bool,
) -> (WalkView, Duration) {
    let started = Instant::now();
    loop {
        let view = gh.walk_queued_jobs(interval, Duration::ZERO).await.unwrap();
        if check(&view) {
            return (view, started.elapsed());
        }
        assert!(
            started.elapsed() < deadline,
            "the walk did not get there in {deadline:?}: {} jobs over {} repositories",
            view.jobs.len(),
            view.repositories
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An organization target's queued jobs are found in every repository, a job queued later is
/// found within one interval, each with its repository (for the per-job check), and a job taken
/// leaves the view.
#[tokio::test]
async fn an_organization_walk_finds_every_queued_job_within_one_interval() {
    let fake = SimulatedGitHub::start().await.unwrap();
    fake.add_repos(ORG, &["web", "api", "docs"]).await.unwrap();
    let a = queue(&fake, ORG, "web", &["self-hosted", "linux"]).await;
    let b = queue(&fake, ORG, "api", &["self-hosted", "gpu"]).await;
    // Another organization's job is not this target's.
    let foreign = queue(&fake, "other", "web", &["self-hosted"]).await;
    let gh = fake.client(&format!("https://github.com/{ORG}"), pat_credentials());
    let interval = Duration::from_secs(2);
    let (view, _) = walk_until(&gh, interval, Duration::from_secs(10), |v| {
        v.complete_since.is_some()
    })
    .await;
    assert_eq!(view.repositories, 3);
    assert_eq!(ids(&view), BTreeSet::from([a, b]));
    assert!(!ids(&view).contains(&foreign));
    let repo_of = |id| {
        let gh = &gh;
        async move { gh.walked_repository_of(i64::try_from(id).unwrap()).await }
    };
    assert_eq!(repo_of(b).await, Some((ORG.to_owned(), "api".to_owned())));
    // A job queued now (its delivery lost) is seen within one interval.
    let c = queue(&fake, ORG, "docs", &["self-hosted", "linux"]).await;
    let (_, took) = walk_until(&gh, interval, interval * 2, |v| ids(v).contains(&c)).await;
    println!("org walk: a new job seen after {took:?} (interval {interval:?})");
    assert!(took <= interval, "seen after {took:?}");
    // The per-job check at organization scope reads the job where the walk saw it.
    let job = gh
        .job(ORG, "docs", i64::try_from(c).unwrap())
        .await
        .unwrap();
    assert_eq!(job.status, "queued");
}

/// An enterprise target walks every organization of the enterprise (GraphQL lists them).
#[tokio::test]
async fn an_enterprise_walk_reads_every_organization() {
    let fake = SimulatedGitHub::start().await.unwrap();
    fake.admin(
        "PUT",
        "enterprises/bigcorp/organizations",
        json!({"organizations": [ORG, "other"]}),
    )
    .await
    .unwrap();
    let a = queue(&fake, ORG, "web", &["self-hosted"]).await;
    let b = queue(&fake, "other", "svc", &["self-hosted"]).await;
    let outside = queue(&fake, "elsewhere", "svc", &["self-hosted"]).await;
    let gh = fake.client("https://github.com/enterprises/bigcorp", pat_credentials());
    let (view, _) = walk_until(&gh, Duration::from_secs(2), Duration::from_secs(10), |v| {
        v.complete_since.is_some()
    })
    .await;
    assert_eq!(ids(&view), BTreeSet::from([a, b]));
    assert!(!ids(&view).contains(&outside));
    assert_eq!(fake.calls("graphql").await.unwrap(), 1);
}

fn sum(counters: &Value, endpoint: &str, status: Option<&str>) -> u64 {
    counters
        .get(endpoint)
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter(|(s, _)| status.is_none_or(|w| s.as_str() == w))
                .filter_map(|(_, n)| n.as_u64())
                .sum()
        })
        .unwrap_or(0)
}

/// One full poll (a zero interval: the step lists the repositories and reads them all):
/// (calls, calls charged), and a table row printed.
async fn poll(
    fake: &SimulatedGitHub,
    gh: &GitHubClient,
    n: u32,
    label: &str,
    expect: &BTreeSet<u64>,
) -> (u64, u64) {
    let endpoints = ["list_org_repos", "list_runs", "list_run_jobs"];
    fake.admin("DELETE", "counters", Value::Null).await.unwrap();
    let started = Instant::now();
    let view = gh
        .walk_queued_jobs(Duration::ZERO, Duration::ZERO)
        .await
        .unwrap();
    let wall = started.elapsed();
    assert_eq!(&ids(&view), expect, "{label}");
    let c = fake.counters().await.unwrap();
    let calls: u64 = endpoints.iter().map(|e| sum(&c, e, None)).sum();
    let free: u64 = endpoints.iter().map(|e| sum(&c, e, Some("304"))).sum();
    println!(
        "| {n} | {label} | {calls} | {} | {} / {} / {} | {} ms |",
        calls - free,
        sum(&c, "list_org_repos", None),
        sum(&c, "list_runs", None),
        sum(&c, "list_run_jobs", None),
        wall.as_millis()
    );
    (calls, calls - free)
}

/// Calls per full poll of an organization at 10, 100 and 1,000 repositories (one queued run in
/// every tenth): the first poll, a poll with nothing changed (304s, which GitHub does not
/// charge), and a poll after one new job. Printed for docs/benchmarks.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_per_organization_poll_at_10_100_and_1000_repositories() {
    println!(
        "| repositories | poll | calls | charged (not 304) | of which: repo pages / run lists / job lists | wall |"
    );
    println!("|---|---|---|---|---|---|");
    for n in [10u32, 100, 1000] {
        let fake = SimulatedGitHub::start().await.unwrap();
        let org = format!("org{n}");
        fake.admin("POST", "repos", json!({"owner": org, "count": n}))
            .await
            .unwrap();
        let mut queued = BTreeSet::new();
        for i in (0..n).step_by(10) {
            queued.insert(queue(&fake, &org, &format!("repo-{i}"), &["self-hosted"]).await);
        }
        let gh = fake.client(&format!("https://github.com/{org}"), pat_credentials());
        let (first, _) = poll(&fake, &gh, n, "first", &queued).await;
        let (again, charged) = poll(&fake, &gh, n, "unchanged", &queued).await;
        let pages = u64::from(n.div_ceil(100));
        assert_eq!(first, pages + u64::from(n) + queued.len() as u64);
        assert_eq!(again, pages + u64::from(n), "no run's jobs listed twice");
        assert_eq!(charged, 0, "an unchanged organization costs no budget");
        queued.insert(queue(&fake, &org, "repo-1", &["self-hosted"]).await);
        let (_, charged) = poll(&fake, &gh, n, "one new job", &queued).await;
        // The repository page (the job's repository is not new) stays 304; its run list and
        // the new run's jobs are charged.
        assert_eq!(charged, 2);
    }
}

/// The organization walk's side of `end_to_end.rs`'s
/// `a_job_queued_before_its_policy_was_ready_starts_without_waiting_a_poll_interval`: a job
/// queued before its organization policy existed (its delivery found no policy). The walk leaves
/// no run unread for being young until a whole cycle began after the policy was proven, so the
/// job starts at the first read of its repository, not a poll interval later (5 minutes; the
/// deadline is one).
#[tokio::test]
async fn a_job_queued_before_its_organization_policy_was_ready_starts_without_waiting_an_interval()
{
    let Some(p) = Product::start("org_queued_before_ready").await else {
        return;
    };
    let job = queue(&p.fake, "acme", "web", &["self-hosted", "linux"]).await;
    p.wait_delivery_answered(job).await;
    org_policy(&p, "300s").await;
    p.job_completes_within(job, Duration::from_secs(60), "the walk")
        .await;
}

/// An organization target with every webhook dropped still runs all its jobs: the walk over the
/// organization's repositories finds them (three repositories, four jobs in all three), runners registered
/// at organization scope take them, and everything is cleaned.
#[tokio::test]
async fn an_organization_target_with_every_webhook_dropped_still_runs_all_its_jobs() {
    let Some(p) = Product::start("org_polling_dropped_webhooks").await else {
        return;
    };
    p.fake.drop_webhooks(1000).await.unwrap();
    p.fake
        .add_repos("acme", &["web", "api", "docs"])
        .await
        .unwrap();
    org_policy(&p, "10s").await;
    p.wait_ready("org").await;
    let mut jobs = Vec::new();
    for repo in ["web", "api", "api", "docs"] {
        let v = p
            .fake
            .admin(
                "POST",
                "jobs",
                json!({"owner": "acme", "repo": repo, "labels": ["self-hosted", "linux"],
                       "behaviour": {"duration_ms": 200}}),
            )
            .await
            .unwrap();
        jobs.push(v["job_id"].as_u64().unwrap());
    }
    p.wait_jobs_completed(&jobs, Duration::from_secs(180))
        .await
        .unwrap();
    let deliveries = p.fake.assert_every_delivery_dropped().await;
    assert!(!deliveries.is_empty(), "no delivery was even recorded");
    let mut runners = BTreeSet::new();
    for id in &jobs {
        let job = p.job(*id).await.unwrap();
        assert_eq!(job["conclusion"], "success", "{job}");
        let name = job["runner_name"].as_str().unwrap().to_owned();
        assert!(runners.insert(name), "two jobs on one runner: {job}");
    }
    let (calls, counters) = p.operator_github_calls().await.unwrap();
    println!(
        "org polling: {calls} operator GitHub calls for {} runners; {counters}",
        jobs.len()
    );
    p.wait_every_attempt_cleaned().await;
    p.wait_no_registrations().await.unwrap();
    // No runner minted twice for one job (minIdle 0): with no delivery to say a job started,
    // a runner that took one must not leave its job's entry asking for another runner until
    // the walk proves the job gone. Counted once the ledger is empty (nothing asks any more).
    wait::until(STEP, "the ledger empty", || async {
        let sp: ScalePolicy = p.policies().get("org").await.ok()?;
        sp.status?.pending_jobs.is_empty().then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs in {}", p.logs().display()));
    let (_, counters) = p.operator_github_calls().await.unwrap();
    let minted = sum(&counters, "generate_jitconfig", Some("201"));
    println!(
        "org polling: {minted} runners minted for {} jobs",
        jobs.len()
    );
    assert_eq!(
        minted,
        jobs.len() as u64,
        "runners minted for {} jobs: {counters}",
        jobs.len()
    );
}
