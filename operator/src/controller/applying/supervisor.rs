//! The attempt supervisor's GitHub side (DESIGN §4 rules 3, 10, 11): one runner list per target
//! per interval → `status.github` facts written only on change; ordered termination (deregister
//! first, then `spec.termination`); concluded attempts GitHub still lists are deregistered;
//! orphan registrations of ours are deleted in two phases a grace period apart.

use std::collections::{HashMap, HashSet};

use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use runner_manager_crds::attempt::{
    AttemptFacts, GitHubFact, GitHubRunnerStatus, JobFact, RunnerAttempt, TerminationReason,
};
use runner_manager_crds::names::{RUNNER_NAME_PREFIX, attempt_of_runner_name, runner_name};
use runner_manager_crds::policy::ScalePolicy;
use runner_manager_crds::state::AttemptState;
use runner_manager_crds::validate::attempt::Attempt;
use tokio::time::Instant;

use crate::controller::errors::{
    ApplyError, DeregisterFailed, GitHubRead, ObserveError, ReadFailed, WriteFailed,
};
use crate::controller::events::Reason;
use crate::controller::writes::{Cas, WriteKind, Writer};
use crate::controller::{Ctx, PolicyMemory};
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

/// The GitHub fact to write on `a`, or None: not on a concluded attempt (nobody reads its facts:
/// the agent turns facts into edges only while the runner lives, and cleanup, demand and the
/// ledger never read `status.github`), nor when it did not change. Pure.
pub fn github_facts(
    a: &RunnerAttempt,
    status: GitHubRunnerStatus,
    busy: bool,
) -> Option<AttemptFacts> {
    if a.state().is_terminal() {
        return None;
    }
    next_facts(&current_facts(a), status, busy)
}

/// The job fact to write on `a`, with the GitHub fact it holds (one write), or None when it
/// already holds this job. Written on a concluded attempt too: `core::ledger::presumed_taken`
/// reads it there. A `CompletedJob` runner without a known job is taken to explain one pending
/// entry for two poll intervals; once the delivery has removed its own job's entry it would
/// explain another job's, and that job would wait for a runner until the horizon passed (the
/// 50-job burst's last runners were created 27–137 s late while the fact was skipped). Pure.
pub fn job_facts(a: &RunnerAttempt, job: &JobFact) -> Option<AttemptFacts> {
    let current = current_facts(a);
    if current.job.as_ref() == Some(job) {
        return None;
    }
    Some(AttemptFacts {
        github: current.github,
        job: Some(job.clone()),
    })
}

fn current_facts(a: &RunnerAttempt) -> AttemptFacts {
    a.status
        .as_ref()
        .map(|s| s.facts.clone())
        .unwrap_or_default()
}

/// How often a facts write is decided again on a fresh read after a conflict (the agent writes
/// the same object; each conflict means it moved on).
const FACTS_ATTEMPTS: usize = 4;

/// Write the facts `decide` asks for on `seen` (None: nothing to write), a compare-and-swap on
/// the version decided on; a conflict re-reads the attempt and decides again on the fresh object,
/// so a fact is never written on an attempt that concluded after the decision's view. `Ok(true)`
/// when written.
pub async fn write_facts(
    writer: &Writer,
    seen: &RunnerAttempt,
    decide: impl Fn(&RunnerAttempt) -> Option<AttemptFacts>,
) -> Result<bool, kube::Error> {
    let ns = seen.metadata.namespace.as_deref().unwrap_or_default();
    let name = seen.metadata.name.as_deref().unwrap_or_default();
    let mut fresh: Option<RunnerAttempt> = None;
    for _ in 0..FACTS_ATTEMPTS {
        let a = fresh.as_ref().unwrap_or(seen);
        let Some(facts) = decide(a) else {
            return Ok(false);
        };
        let version = a.metadata.resource_version.as_deref().unwrap_or_default();
        match writer.facts(ns, name, &facts, version).await? {
            Cas::Written => return Ok(true),
            Cas::Gone => return Ok(false),
            Cas::Conflict => match writer.attempts(ns).get_opt(name).await? {
                Some(a) => fresh = Some(a),
                None => return Ok(false),
            },
        }
    }
    Err(kube::Error::Service(
        "the attempt kept changing under the facts write".into(),
    ))
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

/// The GitHub runner name of an attempt, derived from its spec (`runner-manager-<uuid>`), never
/// read from its status: the status is the agent's to write, so a forged `status.runner` must not
/// choose which registration the operator deletes. Pure.
pub fn registration_name(a: &RunnerAttempt) -> Option<String> {
    a.spec.attempt_uuid().map(runner_name)
}

/// The registration GitHub lists for `a`'s own runner name. Pure.
pub fn listed_runner<'l>(
    listing: &'l HashMap<String, Runner>,
    a: &RunnerAttempt,
) -> Option<&'l Runner> {
    listing.get(&registration_name(a)?)
}

/// The registration to delete for a concluded attempt: the one GitHub lists under the attempt's
/// own runner name, never a busy one. With or without a runner id in the journal: a broker that
/// died between GitHub's 201 and its CAS left a registration that no JIT reached (the agent
/// concludes such an attempt `JitExpired` without a runner id); its name derives from the
/// attempt's uuid, so it goes on the next pass rather than after history garbage collection and
/// the orphan grace (issue 20). Pure.
pub fn concluded_registration<'l>(
    listing: &'l HashMap<String, Runner>,
    a: &RunnerAttempt,
) -> Option<&'l Runner> {
    if !a.state().is_terminal() {
        return None;
    }
    listed_runner(listing, a).filter(|r| !r.busy)
}

/// What became of a termination request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Terminated {
    Requested,
    /// GitHub answered 422: a job landed on the runner; it is left alone.
    TookJob,
    /// The live object is gone or no longer qualifies (it changed since the decision).
    Skipped,
}

/// Ordered termination (DESIGN §4 rule 3): re-read the live attempt, deregister its runner
/// (a 422 means a job just landed: leave it), then request `spec.termination`. A failed read
/// or write is an error: the next reconcile decides again, after the policy's backoff.
pub async fn terminate(
    ctx: &Ctx,
    mem: &PolicyMemory,
    client: Option<&GitHubClient>,
    attempt: &RunnerAttempt,
    reason: TerminationReason,
    now: Timestamp,
) -> Result<Terminated, ApplyError> {
    let ns = attempt.metadata.namespace.as_deref().unwrap_or_default();
    let name = attempt.metadata.name.as_deref().unwrap_or_default();
    let decided_state = attempt.state();
    let live = match ctx.writer.attempts(ns).get_opt(name).await {
        Ok(Some(a)) => a,
        Ok(None) => return Ok(Terminated::Skipped),
        Err(source) => {
            return Err(ApplyError::ReadAttempt {
                attempt: name.to_owned(),
                source,
            });
        }
    };
    let took_job = live.status.as_ref().is_some_and(|s| s.facts.job.is_some());
    if live.spec.termination.is_some()
        || live.state() != decided_state
        || decided_state == AttemptState::Busy
        || took_job
    {
        return Ok(Terminated::Skipped);
    }
    let registered = live
        .status
        .as_ref()
        .is_some_and(|s| s.journal.runner().is_some());
    let mut deregistered = !registered;
    if registered && let Some(client) = client {
        // A DELETE only when GitHub still lists it, and only of the id GitHub lists for this
        // attempt's own runner name: never an id read from the status, which an agent writes
        // (issue 13, finding 3). A runner the last listing lacks is looked up: the listing may
        // predate its registration (it is up to an observe interval old), and a runner taken
        // for deregistered without a DELETE could take a job while it is being stopped.
        let cached = registration_name(&live)
            .map(|name| (mem.listing.as_ref().and_then(|l| l.get(&name)), name));
        let listed = match cached {
            None => None,
            Some((Some(r), _)) => Some(r.id),
            Some((None, name)) => match client.find_runner(&name, Priority::Observe).await {
                Ok(found) => found.map(|r| r.id),
                Err(source) => {
                    return Err(ReadFailed {
                        what: GitHubRead::RunnerLookup,
                        source,
                    }
                    .into());
                }
            },
        };
        if let Some(id) = listed {
            match client.delete_runner(id, Priority::Observe).await {
                Ok(Deleted::Deleted | Deleted::AlreadyGone) => deregistered = true,
                Ok(Deleted::Busy) => {
                    ctx.events.publish(
                        &live.object_ref(&()),
                        Reason::RunnerTookJob,
                        format!(
                            "not terminated ({reason:?}): GitHub says the runner is running a job"
                        ),
                    );
                    return Ok(Terminated::TookJob);
                }
                Err(source) => {
                    return Err(DeregisterFailed {
                        runner_id: id,
                        source,
                    }
                    .into());
                }
            }
        } else {
            deregistered = true;
        }
    }
    ctx.writer
        .terminate(ns, name, reason, deregistered, now)
        .await
        .map_err(WriteFailed::of(WriteKind::AttemptTermination))?;
    ctx.metrics.termination(reason_name(reason));
    ctx.events.publish(
        &live.object_ref(&()),
        Reason::TerminationRequested,
        format!("{reason:?}: runner deregistered={deregistered}"),
    );
    Ok(Terminated::Requested)
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

/// One observation pass of a policy's target; what failed is returned (the rest went on).
pub async fn observe(
    ctx: &Ctx,
    mem: &mut PolicyMemory,
    policy: &ScalePolicy,
    attempts: &[Attempt],
    client: &GitHubClient,
) -> Vec<ObserveError> {
    let mut errors = Vec::new();
    // Every policy of the target reads one listing per half interval.
    let runners = match client
        .recent_runners(ctx.settings.observe_interval / 2)
        .await
    {
        Ok(r) => r,
        Err(source) => {
            // Facts stay as they were.
            errors.push(
                ReadFailed {
                    what: GitHubRead::Runners,
                    source,
                }
                .into(),
            );
            return errors;
        }
    };
    let listing: HashMap<String, Runner> = runners
        .iter()
        .map(|r| (r.name.clone(), r.clone()))
        .collect();
    for held in attempts {
        // The facts are written with a CAS on the object as read.
        let a = held.object.as_ref();
        if held.view.state.is_terminal() {
            if let Some(r) = concluded_registration(&listing, a)
                && let Err(source) = client.delete_runner(r.id, Priority::Observe).await
            {
                errors.push(
                    DeregisterFailed {
                        runner_id: r.id,
                        source,
                    }
                    .into(),
                );
            }
            continue;
        }
        if a.status.as_ref().and_then(|s| s.journal.runner()).is_none() {
            continue;
        }
        // By the name derived from the attempt, never the status's (an agent writes the status).
        let listed = listed_runner(&listing, a);
        let (status, busy) = fact_of(listed);
        if let Err(source) =
            write_facts(&ctx.writer, a, |fresh| github_facts(fresh, status, busy)).await
        {
            errors.push(WriteFailed::of(WriteKind::AttemptFacts)(source).into());
        }
    }
    // Orphans: two sightings at least the grace apart before a DELETE. Every attempt id in the
    // cluster is gathered only when the listing holds a registration that could be one (ours,
    // offline, idle): the common listing has none, and the scan is the size of the cache.
    let now = Instant::now();
    let mut still = HashMap::new();
    let label = &ctx.settings.ownership_label;
    let attempt_ids: HashSet<String> = if listing
        .values()
        .any(|r| is_orphan(r, label, &HashSet::new()))
    {
        ctx.caches
            .attempts
            .state()
            .iter()
            .map(|a| a.spec.id.clone())
            .collect()
    } else {
        HashSet::new()
    };
    for r in listing.values() {
        if !is_orphan(r, label, &attempt_ids) {
            continue;
        }
        let first = mem.orphans.get(&r.id).copied().unwrap_or(now);
        let deleted = if now.duration_since(first) >= ctx.settings.orphan_grace {
            match client.delete_runner(r.id, Priority::Observe).await {
                Ok(d) => Some(d),
                Err(source) => {
                    errors.push(
                        DeregisterFailed {
                            runner_id: r.id,
                            source,
                        }
                        .into(),
                    );
                    None
                }
            }
        } else {
            None
        };
        if let Some(Deleted::Deleted | Deleted::AlreadyGone) = deleted {
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
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::github::types::RunnerLabel;
    use runner_manager_crds::fixtures::AttemptBuilder;

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
    fn a_forged_status_runner_never_chooses_the_registration_deleted() {
        let own = "01234567-89ab-4def-8123-456789abcdef";
        // The agent (or anyone with status rights) journalled another runner's id and name.
        let a = AttemptBuilder::new("web-1", "web")
            .state(AttemptState::Finished)
            .registration("victim", 99)
            .build();
        assert_eq!(a.spec.id, own);
        assert_eq!(a.status.as_ref().unwrap().journal.runner().unwrap().id, 99);
        let mine = format!("runner-manager-{own}");
        assert_eq!(registration_name(&a).as_deref(), Some(mine.as_str()));
        let mut victim = runner("victim", "offline", &[]);
        victim.id = 99;
        let mut ours = runner(&mine, "offline", &[]);
        ours.id = 7;
        let listing: HashMap<String, Runner> = [victim, ours]
            .into_iter()
            .map(|r| (r.name.clone(), r))
            .collect();
        assert_eq!(listed_runner(&listing, &a).map(|r| r.id), Some(7));
        // Not listed under its own name: nothing to delete, whatever the status says.
        let only_victim: HashMap<String, Runner> =
            listing.into_iter().filter(|(n, _)| n == "victim").collect();
        assert!(listed_runner(&only_victim, &a).is_none());
    }

    /// Attempt `web-1` in `state`, its JIT edge (if its path has one) journalling runner `id`.
    fn attempt_in(state: AttemptState, runner: Option<i64>) -> RunnerAttempt {
        let a = AttemptBuilder::new("web-1", "web").state(state);
        match runner {
            Some(id) => a.registration("n", id),
            None => a,
        }
        .build()
    }

    #[test]
    fn a_concluded_attempt_is_deregistered_by_its_name_even_without_a_runner_id() {
        let name = "runner-manager-01234567-89ab-4def-8123-456789abcdef";
        let mut listed = runner(name, "offline", &[]);
        listed.id = 42;
        let listing: HashMap<String, Runner> = [(name.to_owned(), listed.clone())].into();
        // A broker died between GitHub's 201 and its CAS: the agent concluded JitExpired, no id.
        let lost = attempt_in(AttemptState::Failed, None);
        assert_eq!(
            concluded_registration(&listing, &lost).map(|r| r.id),
            Some(42)
        );
        assert_eq!(
            concluded_registration(&listing, &attempt_in(AttemptState::Finished, Some(42)))
                .map(|r| r.id),
            Some(42)
        );
        // Live attempts are the termination's business, never this path's.
        assert!(
            concluded_registration(&listing, &attempt_in(AttemptState::Prepared, None)).is_none()
        );
        assert!(
            concluded_registration(&listing, &attempt_in(AttemptState::Idle, Some(42))).is_none()
        );
        // A busy registration is never deleted.
        listed.busy = true;
        let busy: HashMap<String, Runner> = [(name.to_owned(), listed)].into();
        assert!(concluded_registration(&busy, &lost).is_none());
        assert!(concluded_registration(&HashMap::new(), &lost).is_none());
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

    fn job(id: i64) -> JobFact {
        JobFact {
            id,
            run_id: Some(1),
            repository: Some("a/b".into()),
            workflow_ref: None,
        }
    }

    #[test]
    fn no_github_fact_is_written_on_a_concluded_attempt_but_its_job_is() {
        for state in [
            AttemptState::Finished,
            AttemptState::Failed,
            AttemptState::Cleaned,
        ] {
            let a = attempt_in(state, Some(42));
            assert!(
                github_facts(&a, GitHubRunnerStatus::Online, true).is_none(),
                "{state:?}: a GitHub fact"
            );
            // The job fact is: the ledger's presumption reads it on a concluded runner.
            assert_eq!(
                job_facts(&a, &job(7)).unwrap().job,
                Some(job(7)),
                "{state:?}"
            );
        }
        // A live runner gets both: the agent decides on them.
        for state in [
            AttemptState::Starting,
            AttemptState::Idle,
            AttemptState::Busy,
        ] {
            let a = attempt_in(state, Some(42));
            assert!(github_facts(&a, GitHubRunnerStatus::Online, true).is_some());
            assert_eq!(job_facts(&a, &job(7)).unwrap().job, Some(job(7)));
        }
    }

    #[test]
    fn a_job_fact_carries_the_github_fact_and_is_not_written_twice() {
        let mut a = attempt_in(AttemptState::Starting, Some(42));
        let github = github_facts(&a, GitHubRunnerStatus::Online, false).unwrap();
        a.status.as_mut().unwrap().facts = github.clone();
        let both = job_facts(&a, &job(7)).unwrap();
        assert_eq!(both.github, github.github, "one write holds both facts");
        a.status.as_mut().unwrap().facts = both;
        assert!(job_facts(&a, &job(7)).is_none(), "already recorded");
        assert!(
            github_facts(&a, GitHubRunnerStatus::Online, false).is_none(),
            "unchanged"
        );
    }
}
