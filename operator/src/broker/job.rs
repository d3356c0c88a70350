//! `POST /v1/attempts/{namespace}/{name}/job`: the job gate's decision
//! ([`runner_manager_crds::job_admission`]). The agent relays what its runner's hook was told
//! (a repository and a run); the broker reads the run from GitHub, confirms that GitHub shows
//! this attempt's runner on it, and decides on the run's head repository; for a policy with
//! dependency caches it also decides whether the job's cache writes are kept
//! ([`runner_manager_crds::job_admission::write_back`]). Nothing the job could write decides: the claim
//! only says where to look.

use std::time::Duration;

use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::caches::Discarded;
use runner_manager_crds::job_admission::{
    JobAdmissionAnswer, JobAdmissionRequest, JobRefusal, RunFacts, claimed_in, decide, write_back,
};
use runner_manager_crds::names::runner_name;
use runner_manager_crds::policy::ForkPullRequests;
use runner_manager_crds::target::GitHubTarget;

use crate::github::GitHubClient;
use crate::github::registry::Clients;

/// GitHub may list the job's runner a moment after the runner received the job: the claim is
/// looked for this many times, this far apart, before it counts as not this runner's.
const ASSIGNMENT_LOOKS: u32 = 4;
const ASSIGNMENT_PAUSE: Duration = Duration::from_millis(750);

/// The answer for `request` about `attempt` (already confined to the caller's node).
pub async fn admit(
    clients: &Clients,
    attempt: &RunnerAttempt,
    request: &JobAdmissionRequest,
) -> JobAdmissionAnswer {
    let snapshot = &attempt.spec.snapshot;
    let namespace = attempt.metadata.namespace.as_deref().unwrap_or_default();
    let policy = format!("{namespace}/{}", attempt.spec.policy);
    let (repo, run) = (&request.repository, request.run_id);
    let refuses_forks = snapshot.fork_pull_requests == ForkPullRequests::Refuse;
    let caches = snapshot.caches.as_ref();
    // What a job of a policy that does not refuse forks gets when its run cannot be read: it
    // runs, and its cache writes (if any) are discarded.
    let admitted_without_facts = |why: Discarded, detail: String| JobAdmissionAnswer {
        refused: None,
        message: format!(
            "runner-manager: policy {policy} allows every job{}",
            caches.map_or(String::new(), |_| format!(
                "; this job's cache writes are discarded ({}: {detail})",
                why.as_str()
            ))
        ),
        write_back: false,
    };
    let refuse = |why: JobRefusal, message: String| JobAdmissionAnswer {
        refused: Some(why),
        message: format!("runner-manager: {message}"),
        write_back: false,
    };
    if !refuses_forks && caches.is_none() {
        return JobAdmissionAnswer {
            refused: None,
            message: format!("runner-manager: policy {policy} allows every job"),
            write_back: false,
        };
    }
    let claimed = GitHubTarget::parse(&snapshot.target.url)
        .ok()
        .and_then(|target| claimed_in(&target, repo));
    let Some((owner, name)) = claimed else {
        let message = format!(
            "run {run} names {repo}, which is not a repository of policy {policy}'s target"
        );
        return if refuses_forks {
            refuse(JobRefusal::OutsideTarget, format!("{message}; no step ran"))
        } else {
            admitted_without_facts(Discarded::NotAssigned, message)
        };
    };
    let Some(id) = attempt.spec.attempt_uuid() else {
        return refuse(JobRefusal::NotAssigned, "the attempt has no id".into());
    };
    let unconfirmed = |e: String| {
        if refuses_forks {
            refuse(
                JobRefusal::Unconfirmed,
                format!(
                    "GitHub could not confirm run {run} of {repo} ({e}); the gate refuses what it cannot confirm, no step ran: re-run the job"
                ),
            )
        } else {
            admitted_without_facts(
                Discarded::Unconfirmed,
                format!("GitHub could not confirm run {run} of {repo}: {e}"),
            )
        }
    };
    let client = match clients.for_policy(namespace, &attempt.spec.policy).await {
        Ok(c) => c,
        Err(e) => return unconfirmed(e.to_string()),
    };
    let facts = match run_facts(&client, owner, name, run, &runner_name(id)).await {
        Ok(f) => f,
        Err(e) => return unconfirmed(e.to_string()),
    };
    let kept = caches.map(|c| (&c.write_back, write_back(&c.write_back, &facts)));
    let cache_line = match kept {
        None => String::new(),
        Some((_, Ok(()))) => "; this job's cache writes are kept for the next job".to_owned(),
        Some((rule, Err(why))) => format!(
            "; this job reads the cache but its writes are discarded ({}: spec.caches.writeBack trusts {})",
            why.as_str(),
            trusted(rule),
        ),
    };
    let write_back = matches!(kept, Some((_, Ok(()))));
    match decide(snapshot.fork_pull_requests, &facts) {
        Ok(()) => JobAdmissionAnswer {
            refused: None,
            message: if refuses_forks {
                format!(
                    "runner-manager: run {run} of {repo} admitted (policy {policy} refuses fork pull requests; this run's head is {repo} itself){cache_line}"
                )
            } else {
                format!("runner-manager: policy {policy} allows every job{cache_line}")
            },
            write_back,
        },
        Err(JobRefusal::ForkPullRequest) => refuse(
            JobRefusal::ForkPullRequest,
            format!(
                "policy {policy} refuses jobs of fork pull requests, and run {run}'s head is {}: what it left in this runner's persistent workspace would reach the next job of {repo}. No step ran. Run fork pull requests on a policy whose spec.workspace.mode is Ephemeral (give it its own labels), or set spec.workspace.forkPullRequests: Allow on this one to accept them",
                facts.head_repository.as_deref().unwrap_or("a deleted fork"),
            ),
        ),
        Err(why) => refuse(
            why,
            format!("GitHub does not show this runner on run {run} of {repo}; no step ran"),
        ),
    }
}

/// The jobs a write-back rule trusts, for the job's log.
fn trusted(rule: &runner_manager_crds::caches::CacheWriteBack) -> String {
    let events = if rule.events.is_empty() {
        "any event but pull_request_target and workflow_run".to_owned()
    } else {
        format!("events {}", rule.events.join(", "))
    };
    let branches = if rule.branches.is_empty() {
        "any branch".to_owned()
    } else {
        format!("branches {}", rule.branches.join(", "))
    };
    format!("runs of the repository itself, {events}, {branches}")
}

/// GitHub's record of the run, and whether this runner is on one of its jobs.
async fn run_facts(
    client: &GitHubClient,
    owner: &str,
    repo: &str,
    run: i64,
    runner: &str,
) -> Result<RunFacts, crate::github::GitHubError> {
    let mut looks = 0;
    let runs_on_this_runner = loop {
        looks += 1;
        let jobs = client.run_jobs_in(owner, repo, run).await?;
        if jobs
            .iter()
            .any(|j| j.runner_name.as_deref() == Some(runner))
        {
            break true;
        }
        if looks >= ASSIGNMENT_LOOKS {
            break false;
        }
        tokio::time::sleep(ASSIGNMENT_PAUSE).await;
    };
    let origin = client.run_origin(owner, repo, run).await?;
    Ok(RunFacts {
        repository: origin.repository.full_name,
        head_repository: origin.head_repository.map(|r| r.full_name),
        runs_on_this_runner,
        event: origin.event,
        head_branch: origin.head_branch,
    })
}
