//! `POST /v1/attempts/{namespace}/{name}/job`: the job gate's decision
//! ([`runner_manager_crds::job_admission`]). The agent relays what its runner's hook was told
//! (a repository and a run); the broker reads the run from GitHub, confirms that GitHub shows
//! this attempt's runner on it, and decides on the run's head repository. Nothing the job could
//! write decides: the claim only says where to look.

use std::time::Duration;

use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::job_admission::{
    JobAdmissionAnswer, JobAdmissionRequest, JobRefusal, RunFacts, claimed_in, decide,
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
    let refuse = |why: JobRefusal, message: String| JobAdmissionAnswer {
        refused: Some(why),
        message: format!("runner-manager: {message}"),
    };
    if snapshot.fork_pull_requests == ForkPullRequests::Allow {
        return JobAdmissionAnswer {
            refused: None,
            message: format!("runner-manager: policy {policy} allows every job"),
        };
    }
    let claimed = GitHubTarget::parse(&snapshot.target.url)
        .ok()
        .and_then(|target| claimed_in(&target, repo));
    let Some((owner, name)) = claimed else {
        return refuse(
            JobRefusal::OutsideTarget,
            format!(
                "run {run} names {repo}, which is not a repository of policy {policy}'s target; no step ran"
            ),
        );
    };
    let Some(id) = attempt.spec.attempt_uuid() else {
        return refuse(JobRefusal::NotAssigned, "the attempt has no id".into());
    };
    let unconfirmed = |e: String| {
        refuse(
            JobRefusal::Unconfirmed,
            format!(
                "GitHub could not confirm run {run} of {repo} ({e}); the gate refuses what it cannot confirm, no step ran: re-run the job"
            ),
        )
    };
    let client = match clients.for_policy(namespace, &attempt.spec.policy).await {
        Ok(c) => c,
        Err(e) => return unconfirmed(e.to_string()),
    };
    let facts = match run_facts(&client, owner, name, run, &runner_name(id)).await {
        Ok(f) => f,
        Err(e) => return unconfirmed(e.to_string()),
    };
    match decide(snapshot.fork_pull_requests, &facts) {
        Ok(()) => JobAdmissionAnswer {
            refused: None,
            message: format!(
                "runner-manager: run {run} of {repo} admitted (policy {policy} refuses fork pull requests; this run's head is {repo} itself)"
            ),
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
    })
}
