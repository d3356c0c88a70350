//! Which edge a fact implies, and which conclusion an exit implies: pure, so every rule has a
//! unit test without a cluster. The agent is the one writer of `state` (DESIGN §3); these
//! functions are how the operator's facts and the runner's own evidence become edges.

use runner_manager_crds::attempt::{AttemptFacts, GitHubRunnerStatus, Transition};
use runner_manager_crds::outcome::{FailureReason, OrphanReason, Outcome};
use runner_manager_crds::policy::ExecutionMode;
use runner_manager_crds::recovery::{GitHubObservation, RecoveryDecision};
use runner_manager_crds::state::{AttemptState, EdgeKind};

use crate::evidence::{ExitReading, JobEvidence};
use crate::termination::IntentReason;

/// What `recovery_decision` takes from the operator's `status.github`. No fact yet reads as not
/// registered: the registration deadline, measured from the JIT, bounds that.
pub fn github_observation(facts: &AttemptFacts) -> GitHubObservation {
    match facts.github.as_ref() {
        Some(g) if g.status == GitHubRunnerStatus::Online => {
            GitHubObservation::Registered { busy: g.busy }
        }
        Some(g) if g.status == GitHubRunnerStatus::Unreachable => GitHubObservation::Unreachable,
        _ => GitHubObservation::NotRegistered,
    }
}

/// The edge a live runner's facts imply beyond `recovery_decision` (which knows GitHub's list
/// but not the job assignment): `Starting|Idle → Busy` on an assigned job, `Busy → Idle` when
/// GitHub shows the runner idle again, the assignment is withdrawn and `_diag` shows no job ran.
pub fn fact_edge(
    state: AttemptState,
    facts: &AttemptFacts,
    evidence: impl FnOnce() -> JobEvidence,
) -> Option<Transition> {
    let busy = facts.github.as_ref().is_some_and(|g| g.busy);
    let online = facts
        .github
        .as_ref()
        .is_some_and(|g| g.status == GitHubRunnerStatus::Online);
    match state {
        AttemptState::Starting | AttemptState::Idle if busy || facts.job.is_some() => {
            Some(Transition::AssignJob)
        }
        AttemptState::Busy
            if online && !busy && facts.job.is_none() && evidence() != JobEvidence::RanAJob =>
        {
            Some(Transition::AssignmentNotTaken)
        }
        _ => None,
    }
}

/// The edge a `recovery_decision` of `Observe(state)` asks for.
pub fn observe_edge(from: AttemptState, to: AttemptState) -> Option<Transition> {
    match (from, to) {
        (AttemptState::JitReceived, AttemptState::Starting) => None, // needs the identity
        (AttemptState::Starting, AttemptState::Idle) => Some(Transition::RegisterIdle),
        (AttemptState::Starting | AttemptState::Idle, AttemptState::Busy) => {
            Some(Transition::AssignJob)
        }
        (AttemptState::Busy, AttemptState::Idle) => Some(Transition::AssignmentNotTaken),
        _ => None,
    }
}

/// The conclusion of a runner whose process is gone, in order of authority: the exit code 7
/// (GitHub refuses the version), `_diag` showing a job ran, a termination the agent or the
/// operator asked for, then `recovery_decision` on GitHub's witness. `None` = not yet (GitHub is
/// unreachable and nothing else decides).
pub fn exit_outcome(
    state: AttemptState,
    exit: ExitReading,
    evidence: JobEvidence,
    intent: Option<IntentReason>,
    recovery: RecoveryDecision,
) -> Option<Outcome> {
    if let Some(o) = exit.decided_outcome() {
        return Some(o);
    }
    if evidence == JobEvidence::RanAJob {
        return Some(Outcome::CompletedJob);
    }
    if let Some(reason) = intent {
        return Some(reason.outcome(state));
    }
    match recovery {
        RecoveryDecision::Conclude(o) => Some(o),
        RecoveryDecision::Defer => None,
        _ => Some(Outcome::Failed(FailureReason::ProcessExitedUnexpectedly)),
    }
}

/// Whether a gone runner never took up the job it was assigned: journalled `Busy`, a clean
/// exit, `_diag` showing the listener only, no termination asked and GitHub no longer listing
/// it (the assignment was withdrawn or went elsewhere and the runner's session ended). It
/// concludes `ExitedIdleWithoutWork` through `Busy → Idle` (`AssignmentNotTaken`): not
/// `CompletedJob`, which needs worker evidence, and not a lost process, whose exit is not clean
/// (parity row 40).
pub fn assignment_never_taken(
    state: AttemptState,
    exit: ExitReading,
    evidence: JobEvidence,
    intent: Option<IntentReason>,
    github: GitHubObservation,
) -> bool {
    state == AttemptState::Busy
        && exit == ExitReading::Clean
        && evidence == JobEvidence::NoJob
        && intent.is_none()
        && github == GitHubObservation::NotRegistered
}

/// How long an exit whose only witness is a fact listing the runner idle waits for a newer
/// witness (see [`awaits_newer_witness`]): the operator writes `spec.termination` right after its
/// DELETE, one API write, which a loaded API server can delay by seconds.
pub const EXIT_WITNESS_GRACE: std::time::Duration = std::time::Duration::from_secs(15);

/// Whether the conclusion of a gone runner must wait for a witness newer than its exit. An
/// `Idle` runner that GitHub's last fact lists online and idle, gone with no termination asked
/// and no evidence of its own, reads `Orphaned(ProcessLost)`. But that is exactly what the
/// operator's ordered termination looks like between its DELETE (the runner's session ends and
/// it exits at once) and its `spec.termination` write: the fact predates the exit. Within
/// [`EXIT_WITNESS_GRACE`] of the first sighting, the request (or a newer fact) decides instead;
/// after it, a runner GitHub still lists with no process is lost. This was the cause of the two
/// `Orphaned(ProcessLost)` runners of the 50-job burst, whose overshoot is scaled down (issue 20).
pub fn awaits_newer_witness(
    state: AttemptState,
    github: GitHubObservation,
    outcome: Option<Outcome>,
) -> bool {
    state == AttemptState::Idle
        && github == (GitHubObservation::Registered { busy: false })
        && outcome == Some(Outcome::Orphaned(OrphanReason::ProcessLost))
}

/// The edges that conclude `outcome` from `state`: a completed job is concluded from `Busy`
/// (through `AssignJob` when the assignment was never observed); an outcome the table does not
/// allow from `state` becomes `ProcessExitedUnexpectedly`, which any live state may take.
pub fn conclusion_path(state: AttemptState, outcome: Outcome) -> Vec<Transition> {
    let allowed = |t: &Transition| t.kind().target(state, ExecutionMode::Native).is_ok();
    if outcome == Outcome::CompletedJob
        && matches!(state, AttemptState::Starting | AttemptState::Idle)
    {
        return vec![Transition::AssignJob, Transition::Conclude(outcome)];
    }
    let direct = Transition::Conclude(outcome);
    if allowed(&direct) {
        return vec![direct];
    }
    let fallback = Transition::Conclude(Outcome::Failed(FailureReason::ProcessExitedUnexpectedly));
    if EdgeKind::Fail.target(state, ExecutionMode::Native).is_ok() {
        vec![fallback]
    } else {
        vec![]
    }
}

/// Every edge of a conclusion from `state`, written in one CAS: first `via` = (`from`, edge) when
/// the attempt is in `from` and the table allows it, then [`conclusion_path`] from where that
/// led. No effect of the agent lies between these edges (the exit was seen before any of them),
/// so a crash leaves the attempt before all of them or after all of them.
pub fn conclusion_edges(
    state: AttemptState,
    execution: ExecutionMode,
    via: Option<&(AttemptState, Transition)>,
    outcome: Outcome,
) -> Vec<Transition> {
    let mut state = state;
    let mut path = Vec::new();
    if let Some((from, t)) = via
        && *from == state
        && let Ok(next) = t.kind().target(state, execution)
    {
        path.push(t.clone());
        state = next;
    }
    path.extend(conclusion_path(state, outcome));
    path
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_manager_crds::attempt::{GitHubFact, JobFact, TerminationReason};
    use runner_manager_crds::recovery::TerminateReason;

    fn facts(status: Option<GitHubRunnerStatus>, busy: bool, job: bool) -> AttemptFacts {
        AttemptFacts {
            github: status.map(|status| GitHubFact {
                status,
                busy,
                generation: 1,
            }),
            job: job.then_some(JobFact {
                id: 1,
                run_id: None,
                repository: None,
                workflow_ref: None,
            }),
        }
    }

    #[test]
    fn an_assigned_job_makes_a_started_or_idle_runner_busy() {
        use AttemptState as S;
        let none = || JobEvidence::Unknown;
        for s in [S::Starting, S::Idle] {
            let f = facts(Some(GitHubRunnerStatus::Online), false, true);
            assert_eq!(fact_edge(s, &f, none), Some(Transition::AssignJob));
            let f = facts(Some(GitHubRunnerStatus::Online), true, false);
            assert_eq!(fact_edge(s, &f, none), Some(Transition::AssignJob));
        }
        let online_idle = facts(Some(GitHubRunnerStatus::Online), false, false);
        assert_eq!(fact_edge(S::Idle, &online_idle, none), None);
        assert_eq!(fact_edge(S::Starting, &online_idle, none), None);
    }

    #[test]
    fn busy_goes_back_to_idle_only_when_the_job_was_not_taken() {
        use AttemptState as S;
        let idle = facts(Some(GitHubRunnerStatus::Online), false, false);
        assert_eq!(
            fact_edge(S::Busy, &idle, || JobEvidence::NoJob),
            Some(Transition::AssignmentNotTaken)
        );
        assert_eq!(fact_edge(S::Busy, &idle, || JobEvidence::RanAJob), None);
        let still_assigned = facts(Some(GitHubRunnerStatus::Online), false, true);
        assert_eq!(
            fact_edge(S::Busy, &still_assigned, || JobEvidence::NoJob),
            None
        );
        let busy = facts(Some(GitHubRunnerStatus::Online), true, false);
        assert_eq!(fact_edge(S::Busy, &busy, || JobEvidence::NoJob), None);
    }

    #[test]
    fn github_facts_read_as_recovery_observations() {
        assert_eq!(
            github_observation(&facts(Some(GitHubRunnerStatus::Online), true, false)),
            GitHubObservation::Registered { busy: true }
        );
        assert_eq!(
            github_observation(&facts(Some(GitHubRunnerStatus::Unreachable), false, false)),
            GitHubObservation::Unreachable
        );
        for s in [
            None,
            Some(GitHubRunnerStatus::Offline),
            Some(GitHubRunnerStatus::Absent),
        ] {
            assert_eq!(
                github_observation(&facts(s, false, false)),
                GitHubObservation::NotRegistered
            );
        }
    }

    #[test]
    fn an_exit_is_concluded_by_the_strongest_evidence() {
        use AttemptState as S;
        let lost = RecoveryDecision::Conclude(Outcome::Orphaned(OrphanReason::ProcessLost));
        assert_eq!(
            exit_outcome(
                S::Busy,
                ExitReading::VersionRejected,
                JobEvidence::RanAJob,
                None,
                lost
            ),
            Some(Outcome::Failed(FailureReason::RunnerVersionRejected))
        );
        assert_eq!(
            exit_outcome(
                S::Busy,
                ExitReading::Clean,
                JobEvidence::RanAJob,
                None,
                lost
            ),
            Some(Outcome::CompletedJob)
        );
        let idle_stop = IntentReason::Requested(TerminationReason::IdleTimeout);
        assert_eq!(
            exit_outcome(
                S::Idle,
                ExitReading::Other,
                JobEvidence::NoJob,
                Some(idle_stop),
                lost
            ),
            Some(Outcome::ExitedIdleWithoutWork)
        );
        let reg = IntentReason::Deadline(TerminateReason::RegistrationTimeout);
        assert_eq!(
            exit_outcome(
                S::Starting,
                ExitReading::Other,
                JobEvidence::Unknown,
                Some(reg),
                lost
            ),
            Some(Outcome::Failed(
                FailureReason::TerminatedAfterRegistrationTimeout
            ))
        );
        assert_eq!(
            exit_outcome(
                S::Busy,
                ExitReading::Other,
                JobEvidence::Unknown,
                None,
                lost
            ),
            Some(Outcome::Orphaned(OrphanReason::ProcessLost))
        );
        assert_eq!(
            exit_outcome(
                S::Idle,
                ExitReading::Other,
                JobEvidence::NoJob,
                None,
                RecoveryDecision::Defer
            ),
            None
        );
        assert_eq!(
            exit_outcome(
                S::Idle,
                ExitReading::Clean,
                JobEvidence::NoJob,
                None,
                RecoveryDecision::Adopt
            ),
            Some(Outcome::Failed(FailureReason::ProcessExitedUnexpectedly))
        );
    }

    #[test]
    fn an_assignment_the_runner_never_took_up_is_not_a_completed_job() {
        use AttemptState as S;
        let gone = GitHubObservation::NotRegistered;
        let clean = ExitReading::Clean;
        let listener_only = JobEvidence::NoJob;
        assert!(assignment_never_taken(
            S::Busy,
            clean,
            listener_only,
            None,
            gone
        ));
        // Worker evidence: the job ran, whatever GitHub says.
        assert!(!assignment_never_taken(
            S::Busy,
            clean,
            JobEvidence::RanAJob,
            None,
            gone
        ));
        assert_eq!(
            exit_outcome(
                S::Busy,
                clean,
                JobEvidence::RanAJob,
                None,
                RecoveryDecision::Conclude(Outcome::Orphaned(OrphanReason::ProcessLost))
            ),
            Some(Outcome::CompletedJob)
        );
        // Unreadable `_diag`, an unclean exit, a requested stop, a runner still listed, or a
        // state other than `Busy`: the other rules decide.
        let requested = Some(IntentReason::Requested(TerminationReason::Deleted));
        let listed = GitHubObservation::Registered { busy: true };
        for (state, exit, evidence, intent, github) in [
            (S::Busy, clean, JobEvidence::Unknown, None, gone),
            (S::Busy, ExitReading::Other, listener_only, None, gone),
            (S::Busy, clean, listener_only, requested, gone),
            (S::Busy, clean, listener_only, None, listed),
            (
                S::Busy,
                clean,
                listener_only,
                None,
                GitHubObservation::Unreachable,
            ),
            (S::Idle, clean, listener_only, None, gone),
        ] {
            assert!(
                !assignment_never_taken(state, exit, evidence, intent, github),
                "{state:?} {exit:?} {evidence:?} {intent:?} {github:?}"
            );
        }
        // The walk: back to `Idle`, from where `ExitedIdleWithoutWork` is legal.
        assert_eq!(
            observe_edge(S::Busy, S::Idle),
            Some(Transition::AssignmentNotTaken)
        );
        assert_eq!(
            conclusion_path(S::Idle, Outcome::ExitedIdleWithoutWork),
            vec![Transition::Conclude(Outcome::ExitedIdleWithoutWork)]
        );
    }

    #[test]
    fn only_a_lost_idle_runner_still_listed_idle_waits_for_a_newer_witness() {
        use AttemptState as S;
        let lost = Some(Outcome::Orphaned(OrphanReason::ProcessLost));
        let listed_idle = GitHubObservation::Registered { busy: false };
        assert!(awaits_newer_witness(S::Idle, listed_idle, lost));
        // A requested stop, `_diag` or the exit code decided: nothing to wait for.
        assert!(!awaits_newer_witness(
            S::Idle,
            listed_idle,
            Some(Outcome::ExitedIdleWithoutWork)
        ));
        assert!(!awaits_newer_witness(
            S::Idle,
            listed_idle,
            Some(Outcome::CompletedJob)
        ));
        // A busy runner is never deregistered for a stop: its loss is not this race.
        assert!(!awaits_newer_witness(S::Busy, listed_idle, lost));
        assert!(!awaits_newer_witness(
            S::Idle,
            GitHubObservation::Registered { busy: true },
            lost
        ));
        assert!(!awaits_newer_witness(
            S::Idle,
            GitHubObservation::NotRegistered,
            lost
        ));
    }

    #[test]
    fn conclusions_follow_the_table() {
        use AttemptState as S;
        assert_eq!(
            conclusion_path(S::Idle, Outcome::CompletedJob),
            vec![
                Transition::AssignJob,
                Transition::Conclude(Outcome::CompletedJob)
            ]
        );
        assert_eq!(
            conclusion_path(S::Busy, Outcome::CompletedJob),
            vec![Transition::Conclude(Outcome::CompletedJob)]
        );
        assert_eq!(
            conclusion_path(S::Idle, Outcome::ExitedIdleWithoutWork),
            vec![Transition::Conclude(Outcome::ExitedIdleWithoutWork)]
        );
        let unexpected = Outcome::Failed(FailureReason::ProcessExitedUnexpectedly);
        assert_eq!(
            conclusion_path(S::Busy, Outcome::ExitedIdleWithoutWork),
            vec![Transition::Conclude(unexpected)]
        );
        assert!(conclusion_path(S::Cleaned, unexpected).is_empty());
        assert_eq!(
            observe_edge(S::Starting, S::Idle),
            Some(Transition::RegisterIdle)
        );
    }

    #[test]
    fn a_conclusion_is_one_path_of_every_edge_it_needs() {
        use ExecutionMode::Native;
        let done = Outcome::CompletedJob;
        // The runner took its job and exited before the job was journalled: both edges at once.
        assert_eq!(
            conclusion_edges(AttemptState::Starting, Native, None, done),
            vec![Transition::AssignJob, Transition::Conclude(done)]
        );
        assert_eq!(
            conclusion_edges(AttemptState::Busy, Native, None, done),
            vec![Transition::Conclude(done)]
        );
        // GitHub never gave the job: back to Idle, then exited idle, in the same write.
        let idle = Outcome::ExitedIdleWithoutWork;
        let back = (AttemptState::Busy, Transition::AssignmentNotTaken);
        assert_eq!(
            conclusion_edges(AttemptState::Busy, Native, Some(&back), idle),
            vec![Transition::AssignmentNotTaken, Transition::Conclude(idle)]
        );
        // Already walked back (a re-decision on a fresher copy): the conclusion alone.
        assert_eq!(
            conclusion_edges(AttemptState::Idle, Native, Some(&back), idle),
            vec![Transition::Conclude(idle)]
        );
    }
}
