//! The attempt supervisor's GitHub side (DESIGN §4 rules 3, 10, 11): one runner list per target
//! per interval → `status.github` facts written only on change; ordered termination (deregister
//! first, then `spec.termination`); concluded attempts GitHub still lists are deregistered;
//! orphan registrations of ours are deleted in two phases a grace period apart.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use runner_manager_crds::attempt::{
    AttemptFacts, GitHubFact, GitHubRunnerStatus, RunnerAttempt, TerminationReason,
};
use runner_manager_crds::names::{RUNNER_NAME_PREFIX, attempt_of_runner_name};
use runner_manager_crds::policy::ScalePolicy;
use runner_manager_crds::state::AttemptState;
use tokio::time::Instant;

use super::attempts::state_of;
use super::events::Reason;
use super::{Ctx, PolicyMemory};
use crate::github::client::{Deleted, GitHubClient};
use crate::github::ratelimit::Priority;
use crate::github::types::Runner;

/// The fact GitHub's listing gives for a runner (None: not listed). Pure.
pub fn fact_of(listed: Option<&Runner>) -> (GitHubRunnerStatus, bool) {
    match listed {
        None => (GitHubRunnerStatus::Absent, false),
        Some(r) if r.status == "online" => (GitHubRunnerStatus::Online, r.busy),
        Some(r) => (GitHubRunnerStatus::Offline, r.busy),
    }
}

/// The facts to write, or None when they did not change. Pure.
pub fn next_facts(
    current: &AttemptFacts,
    status: GitHubRunnerStatus,
    busy: bool,
) -> Option<AttemptFacts> {
    let old = current.github.as_ref();
    if old.is_some_and(|g| g.status == status && g.busy == busy) {
        return None;
    }
    Some(AttemptFacts {
        github: Some(GitHubFact {
            status,
            busy,
            generation: old.map_or(1, |g| g.generation + 1),
        }),
        job: current.job.clone(),
    })
}

/// A registration that is ours (our name prefix AND our cluster's label), offline, and has no
/// attempt anywhere in the cluster. Pure. A runner without our label is never a candidate.
pub fn is_orphan(r: &Runner, ownership_label: &str, attempt_ids: &HashSet<String>) -> bool {
    r.name.starts_with(RUNNER_NAME_PREFIX)
        && r.has_label(ownership_label)
        && r.status != "online"
        && !r.busy
        && attempt_of_runner_name(&r.name)
            .is_some_and(|id| !attempt_ids.contains(&id.hyphenated().to_string()))
}

/// What became of a termination request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Terminated {
    Requested,
    /// GitHub answered 422: a job landed on the runner; it is left alone.
    TookJob,
    /// The live object no longer qualifies (changed since the decision), or a write failed.
    Skipped,
}

/// Ordered termination (DESIGN §4 rule 3): re-read the live attempt, deregister its runner
/// (a 422 means a job just landed: leave it), then request `spec.termination`.
pub async fn terminate(
    ctx: &Ctx,
    mem: &PolicyMemory,
    client: Option<&GitHubClient>,
    attempt: &RunnerAttempt,
    reason: TerminationReason,
    now: Timestamp,
) -> Terminated {
    let ns = attempt.metadata.namespace.as_deref().unwrap_or_default();
    let name = attempt.metadata.name.as_deref().unwrap_or_default();
    let decided_state = state_of(attempt);
    let live = match ctx.writer.attempts(ns).get_opt(name).await {
        Ok(Some(a)) => a,
        _ => return Terminated::Skipped,
    };
    let took_job = live.status.as_ref().is_some_and(|s| s.facts.job.is_some());
    if live.spec.termination.is_some()
        || state_of(&live) != decided_state
        || decided_state == AttemptState::Busy
        || took_job
    {
        return Terminated::Skipped;
    }
    let runner = live
        .status
        .as_ref()
        .and_then(|s| s.journal.runner().cloned());
    let mut deregistered = runner.is_none();
    if let (Some(runner), Some(client)) = (runner, client) {
        // A DELETE only when GitHub still lists it (or we have not listed yet).
        let listed = mem
            .listing
            .as_ref()
            .is_none_or(|l| l.contains_key(&runner.name));
        if listed {
            match client.delete_runner(runner.id, Priority::Observe).await {
                Ok(Deleted::Deleted | Deleted::AlreadyGone) => deregistered = true,
                Ok(Deleted::Busy) => {
                    ctx.events.publish(
                        &live.object_ref(&()),
                        Reason::RunnerTookJob,
                        format!(
                            "not terminated ({reason:?}): GitHub says the runner is running a job"
                        ),
                    );
                    return Terminated::TookJob;
                }
                Err(e) => {
                    tracing::warn!(error = %e, attempt = name, "deregistering before termination failed; retrying next pass");
                    return Terminated::Skipped;
                }
            }
        } else {
            deregistered = true;
        }
    }
    if ctx
        .writer
        .terminate(ns, name, reason, deregistered, now)
        .await
        .is_err()
    {
        return Terminated::Skipped;
    }
    ctx.metrics.termination(reason_name(reason));
    ctx.events.publish(
        &live.object_ref(&()),
        Reason::TerminationRequested,
        format!("{reason:?}: runner deregistered={deregistered}"),
    );
    Terminated::Requested
}

pub fn reason_name(r: TerminationReason) -> &'static str {
    match r {
        TerminationReason::RegistrationTimeout => "registration_timeout",
        TerminationReason::IdleTimeout => "idle_timeout",
        TerminationReason::PolicyDeleted => "policy_deleted",
        TerminationReason::Drain => "drain",
        TerminationReason::Deleted => "deleted",
        TerminationReason::ScaleDown => "scale_down",
    }
}

/// One observation pass of a policy's target.
pub async fn observe(
    ctx: &Ctx,
    mem: &mut PolicyMemory,
    policy: &ScalePolicy,
    attempts: &[Arc<RunnerAttempt>],
    client: &GitHubClient,
    attempt_ids: &HashSet<String>,
) {
    // Every policy of the target reads one listing per half interval.
    let runners = match client
        .recent_runners(ctx.settings.observe_interval / 2)
        .await
    {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "listing runners failed; facts unchanged");
            return;
        }
    };
    let listing: HashMap<String, Runner> = runners
        .iter()
        .map(|r| (r.name.clone(), r.clone()))
        .collect();
    for a in attempts {
        let Some(runner) = a.status.as_ref().and_then(|s| s.journal.runner()) else {
            continue;
        };
        let ns = a.metadata.namespace.as_deref().unwrap_or_default();
        let name = a.metadata.name.as_deref().unwrap_or_default();
        let state = state_of(a);
        let listed = listing.get(&runner.name);
        if state.is_terminal() {
            // Concluded, yet GitHub still lists it: deregister (never a busy one).
            if let Some(r) = listed
                && !r.busy
            {
                let _ = client.delete_runner(r.id, Priority::Observe).await;
            }
            continue;
        }
        let (status, busy) = fact_of(listed);
        let current = a
            .status
            .as_ref()
            .map(|s| s.facts.clone())
            .unwrap_or_default();
        if let Some(next) = next_facts(&current, status, busy) {
            let _ = ctx.writer.facts(ns, name, &next).await;
        }
    }
    // Orphans: two sightings at least the grace apart before a DELETE.
    let now = Instant::now();
    let mut still = HashMap::new();
    for r in listing.values() {
        if !is_orphan(r, &ctx.settings.ownership_label, attempt_ids) {
            continue;
        }
        let first = mem.orphans.get(&r.id).copied().unwrap_or(now);
        if now.duration_since(first) >= ctx.settings.orphan_grace
            && let Ok(Deleted::Deleted | Deleted::AlreadyGone) =
                client.delete_runner(r.id, Priority::Observe).await
        {
            ctx.metrics.orphan_deleted();
            ctx.events
                    .publish(
                        &policy.object_ref(&()),
                        Reason::OrphanRegistrationDeleted,
                        format!(
                            "deleted runner registration {} (ours, offline, no attempt, seen orphaned {}s apart)",
                            r.id,
                            now.duration_since(first).as_secs()
                        ),
                    );
            continue;
        }
        still.insert(r.id, first);
    }
    mem.orphans = still;
    mem.listing = Some(listing);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::github::types::RunnerLabel;

    fn runner(name: &str, status: &str, labels: &[&str]) -> Runner {
        Runner {
            id: 1,
            name: name.into(),
            status: status.into(),
            busy: false,
            labels: labels
                .iter()
                .map(|l| RunnerLabel {
                    name: (*l).to_owned(),
                })
                .collect(),
        }
    }

    #[test]
    fn only_our_labelled_offline_attemptless_runners_are_orphans() {
        let id = uuid::Uuid::new_v4();
        let name = format!("runner-manager-{}", id.hyphenated());
        let ours = "rm-0123456789ab";
        let none = HashSet::new();
        assert!(is_orphan(
            &runner(&name, "offline", &["linux", ours]),
            ours,
            &none
        ));
        assert!(
            !is_orphan(&runner(&name, "offline", &["linux"]), ours, &none),
            "foreign"
        );
        assert!(
            !is_orphan(&runner(&name, "online", &[ours]), ours, &none),
            "online"
        );
        let has = HashSet::from([id.hyphenated().to_string()]);
        assert!(
            !is_orphan(&runner(&name, "offline", &[ours]), ours, &has),
            "has attempt"
        );
        assert!(!is_orphan(
            &runner("other-runner", "offline", &[ours]),
            ours,
            &none
        ));
    }

    #[test]
    fn facts_change_only_on_change_and_count_generations() {
        let none = AttemptFacts::default();
        let f = next_facts(&none, GitHubRunnerStatus::Offline, false).unwrap();
        assert_eq!(f.github.as_ref().unwrap().generation, 1);
        assert!(next_facts(&f, GitHubRunnerStatus::Offline, false).is_none());
        let g = next_facts(&f, GitHubRunnerStatus::Online, true).unwrap();
        assert_eq!(g.github.as_ref().unwrap().generation, 2);
        assert_eq!(fact_of(None), (GitHubRunnerStatus::Absent, false));
    }
}
