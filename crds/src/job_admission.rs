//! Which job a runner may run (`spec.workspace.forkPullRequests`, issue 31 item 3): the pure
//! decision and the wire types of the gate.
//!
//! GitHub hands a queued job to any online runner whose labels match, so no launch can choose
//! its job: a persistent slot's runner started for a main-branch job may be handed a fork's pull
//! request. The check therefore runs when the job starts, before any of its steps: the runner's
//! job-started hook asks the agent (over a socket only that runner's account can open), the
//! agent asks the broker, and the broker decides from GitHub's record of the run. The runner's
//! claim (which repository and run) only says where to look: the broker confirms that GitHub
//! shows this runner on that run, and reads the run's head repository from GitHub itself.

use serde::{Deserialize, Serialize};

use crate::caches::{CacheWriteBack, Discarded};
use crate::policy::ForkPullRequests;

/// The request path of a job's admission.
pub fn job_path(namespace: &str, name: &str) -> String {
    format!("/v1/attempts/{namespace}/{name}/job")
}

/// The agent's question: the runner of this attempt started a job of `run_id` in `repository`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobAdmissionRequest {
    pub attempt_uid: String,
    /// `OWNER/REPO`, as the runner was told by GitHub (`GITHUB_REPOSITORY`).
    pub repository: String,
    /// The workflow run (`GITHUB_RUN_ID`).
    pub run_id: i64,
}

/// The broker's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobAdmissionAnswer {
    /// `None`: admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<JobRefusal>,
    /// For the job's log: what was decided and, on a refusal, the fix.
    pub message: String,
    /// Whether the job's cache writes are kept (`spec.caches.writeBack`): `false` for a policy
    /// without caches, and for every job its rule does not trust.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub write_back: bool,
}

/// Why a job was refused. Closed: it reaches events, metrics and the job's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum JobRefusal {
    /// The run's head repository is not the policy's repository (or GitHub shows none: a
    /// deleted fork).
    ForkPullRequest,
    /// The claimed repository is outside the policy's target.
    OutsideTarget,
    /// GitHub does not show this runner on that run: the claim is not the runner's job.
    NotAssigned,
    /// GitHub could not be asked; the gate fails closed.
    Unconfirmed,
}

impl JobRefusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ForkPullRequest => "ForkPullRequest",
            Self::OutsideTarget => "OutsideTarget",
            Self::NotAssigned => "NotAssigned",
            Self::Unconfirmed => "Unconfirmed",
        }
    }
}

/// What GitHub's run record says, as the broker read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunFacts {
    /// `repository.full_name`.
    pub repository: String,
    /// `head_repository.full_name`; `None` when GitHub shows none (a deleted fork).
    pub head_repository: Option<String>,
    /// Whether GitHub lists this attempt's runner on one of the run's jobs.
    pub runs_on_this_runner: bool,
    /// The run's `event` (`push`, `pull_request`, …).
    pub event: String,
    /// The run's `head_branch`.
    pub head_branch: Option<String>,
}

/// The decision for `rule`, given GitHub's facts of the run. Pure.
pub fn decide(rule: ForkPullRequests, facts: &RunFacts) -> Result<(), JobRefusal> {
    if rule == ForkPullRequests::Allow {
        return Ok(());
    }
    if !facts.runs_on_this_runner {
        return Err(JobRefusal::NotAssigned);
    }
    match &facts.head_repository {
        Some(head) if head.eq_ignore_ascii_case(&facts.repository) => Ok(()),
        _ => Err(JobRefusal::ForkPullRequest),
    }
}

/// The claimed `repository` (`OWNER/REPO`) as its two parts, if it is a repository of `target`
/// (an enterprise holds every repository of its organizations, which are not in the snapshot:
/// the run's record must still show this runner). Pure.
pub fn claimed_in<'c>(
    target: &runner_manager_core::target::GitHubTarget,
    repository: &'c str,
) -> Option<(&'c str, &'c str)> {
    use runner_manager_core::target::TargetKind;
    let (owner, repo) = repository.split_once('/')?;
    if owner.is_empty() || repo.is_empty() || repo.contains('/') {
        return None;
    }
    let within = match &target.kind {
        TargetKind::Repository { owner: o, repo: r } => {
            o.eq_ignore_ascii_case(owner) && r.eq_ignore_ascii_case(repo)
        }
        TargetKind::Organization { org } => org.eq_ignore_ascii_case(owner),
        TargetKind::Enterprise { .. } => true,
    };
    within.then_some((owner, repo))
}

/// Whether a job of the run GitHub describes in `facts` may keep its cache writes. Pure.
pub fn write_back(rule: &CacheWriteBack, facts: &RunFacts) -> Result<(), Discarded> {
    if !facts.runs_on_this_runner {
        return Err(Discarded::NotAssigned);
    }
    match &facts.head_repository {
        Some(head) if head.eq_ignore_ascii_case(&facts.repository) => {}
        _ => return Err(Discarded::ForkPullRequest),
    }
    let event_trusted = if rule.events.is_empty() {
        !crate::caches::UNTRUSTED_BY_DEFAULT.contains(&facts.event.as_str())
    } else {
        facts.event != crate::caches::NEVER_TRUSTED_EVENT && rule.events.contains(&facts.event)
    };
    if !event_trusted {
        return Err(Discarded::Event);
    }
    if !rule.branches.is_empty() {
        let branch = facts.head_branch.as_deref().unwrap_or_default();
        if !rule
            .branches
            .iter()
            .any(|p| crate::caches::wildcard(p, branch))
        {
            return Err(Discarded::Branch);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_manager_core::target::GitHubTarget;

    fn facts(head: Option<&str>, ours: bool) -> RunFacts {
        RunFacts {
            repository: "acme/web".into(),
            head_repository: head.map(str::to_owned),
            runs_on_this_runner: ours,
            event: "pull_request".into(),
            head_branch: Some("main".into()),
        }
    }

    #[test]
    fn refuse_admits_only_a_run_of_the_repository_itself_on_this_runner() {
        let r = ForkPullRequests::Refuse;
        assert_eq!(decide(r, &facts(Some("acme/web"), true)), Ok(()));
        assert_eq!(decide(r, &facts(Some("ACME/Web"), true)), Ok(()));
        assert_eq!(
            decide(r, &facts(Some("mallory/web"), true)),
            Err(JobRefusal::ForkPullRequest)
        );
        // A deleted fork: GitHub shows no head repository.
        assert_eq!(
            decide(r, &facts(None, true)),
            Err(JobRefusal::ForkPullRequest)
        );
        // A claim of another runner's run is no claim.
        assert_eq!(
            decide(r, &facts(Some("acme/web"), false)),
            Err(JobRefusal::NotAssigned)
        );
    }

    #[test]
    fn allow_admits_everything_without_asking() {
        let a = ForkPullRequests::Allow;
        assert_eq!(decide(a, &facts(Some("mallory/web"), false)), Ok(()));
        assert_eq!(decide(a, &facts(None, false)), Ok(()));
    }

    #[test]
    fn a_claim_must_name_a_repository_of_the_target() {
        let target = |url: &str| GitHubTarget::parse(url).unwrap();
        let repo = target("https://github.com/acme/web");
        assert_eq!(claimed_in(&repo, "acme/web"), Some(("acme", "web")));
        assert_eq!(claimed_in(&repo, "Acme/WEB"), Some(("Acme", "WEB")));
        for outside in [
            "acme/api",
            "mallory/web",
            "acme/web/x",
            "acme",
            "acme/",
            "/web",
        ] {
            assert_eq!(claimed_in(&repo, outside), None, "{outside}");
        }
        let org = target("https://ghe.example.com/acme");
        assert_eq!(claimed_in(&org, "acme/api"), Some(("acme", "api")));
        assert_eq!(claimed_in(&org, "mallory/api"), None);
    }

    fn cache_facts(head: Option<&str>, event: &str, branch: &str) -> RunFacts {
        RunFacts {
            repository: "acme/web".into(),
            head_repository: head.map(str::to_owned),
            runs_on_this_runner: true,
            event: event.into(),
            head_branch: Some(branch.into()),
        }
    }

    #[test]
    fn only_the_repositorys_own_runs_write_back_by_default() {
        let rule = CacheWriteBack::default();
        assert_eq!(
            write_back(&rule, &cache_facts(Some("acme/web"), "push", "main")),
            Ok(())
        );
        assert_eq!(
            write_back(
                &rule,
                &cache_facts(Some("acme/web"), "pull_request", "topic")
            ),
            Ok(()),
            "a pull request from the repository itself"
        );
        assert_eq!(
            write_back(
                &rule,
                &cache_facts(Some("mallory/web"), "pull_request", "main")
            ),
            Err(Discarded::ForkPullRequest)
        );
        assert_eq!(
            write_back(&rule, &cache_facts(None, "pull_request", "main")),
            Err(Discarded::ForkPullRequest),
            "a deleted fork"
        );
        assert_eq!(
            write_back(
                &rule,
                &cache_facts(Some("acme/web"), "pull_request_target", "main")
            ),
            Err(Discarded::Event)
        );
        let mut other = cache_facts(Some("acme/web"), "push", "main");
        other.runs_on_this_runner = false;
        assert_eq!(write_back(&rule, &other), Err(Discarded::NotAssigned));
    }

    #[test]
    fn a_rule_narrows_events_and_branches_and_never_admits_pull_request_target() {
        let rule = CacheWriteBack {
            branches: vec!["main".into(), "release/*".into()],
            events: vec!["push".into(), "pull_request_target".into()],
        };
        let ok = |e: &str, b: &str| write_back(&rule, &cache_facts(Some("acme/web"), e, b));
        assert_eq!(ok("push", "main"), Ok(()));
        assert_eq!(ok("push", "release/1.2"), Ok(()));
        assert_eq!(ok("push", "topic"), Err(Discarded::Branch));
        assert_eq!(ok("pull_request", "main"), Err(Discarded::Event));
        assert_eq!(ok("pull_request_target", "main"), Err(Discarded::Event));
        // workflow_run writes back only where the rule names it.
        let default = CacheWriteBack::default();
        assert_eq!(
            write_back(
                &default,
                &cache_facts(Some("acme/web"), "workflow_run", "main")
            ),
            Err(Discarded::Event)
        );
        let named = CacheWriteBack {
            events: vec!["workflow_run".into()],
            ..CacheWriteBack::default()
        };
        assert_eq!(
            write_back(
                &named,
                &cache_facts(Some("acme/web"), "workflow_run", "main")
            ),
            Ok(())
        );
    }
}
