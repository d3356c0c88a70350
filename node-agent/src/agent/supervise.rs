//! One attempt's task: read the attempt, take one step, again, until it is `Cleaned`. The same
//! `step` is recovery after a restart and ordinary supervision ("recovery is supervision",
//! DESIGN §4 rule 8): every decision on an attempt the agent is not bringing up goes through
//! `crds::recovery::recovery_decision`, with the facts the operator wrote and what the agent
//! sees of the process.

use std::path::Path;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use runner_manager_crds::attempt::spec_hash;
use runner_manager_crds::attempt::{
    AttemptJournal, RunnerAttempt, StartedIdentity, TerminationReason, Transition,
};
use runner_manager_crds::lease::RecoveryBlocked;
use runner_manager_crds::outcome::{FailureReason, Outcome};
use runner_manager_crds::recovery::{ProcessObservation, RecoveryDecision, recovery_decision};
use runner_manager_crds::state::AttemptState;

use super::attempt_ctx::take;
pub use super::attempt_ctx::{Step, StepError, conclude, names, runtime_of, timeouts, uuid_of};
use super::edges::{
    EXIT_WITNESS_GRACE, assignment_never_taken, awaits_newer_witness, exit_outcome, fact_edge,
    github_observation, observe_edge,
};
use super::events::{self, EventReason};
use super::fault::{self, Boundary};
use super::launch;
use super::rebuild::journal_of;
use super::watched::Watched;
use super::{Agent, cleanup};
use crate::evidence::{ExitReading, JobEvidence, job_evidence};
use crate::process::identity_file;
use crate::termination::{IntentReason, read_intent, record_intent, terminate};

/// What one attempt's task remembers between its steps (lost on a restart, which only restarts
/// the clocks it holds).
#[derive(Debug, Default)]
pub struct TaskMemory {
    /// When the runner was first seen gone while the last fact still listed it idle
    /// ([`awaits_newer_witness`]).
    gone_while_listed: Option<std::time::Instant>,
}

/// The task of one attempt: it steps on the attempt as the watch shows it ([`Watched`]), when
/// the object changes and once per poll interval, never reading it from the API server.
pub async fn attempt_task(
    agent: Arc<Agent>,
    namespace: String,
    name: String,
    uid: String,
    mut watched: Watched,
) {
    let api = Api::<RunnerAttempt>::namespaced(agent.kube.clone(), &namespace);
    let mut reported = false;
    let mut memory = TaskMemory::default();
    // What the attempt held when last read, for the orphan sweep if its object goes away.
    let mut held = None;
    loop {
        let Some(a) = watched.next().await else {
            // Gone (or replaced by a new object of the same name): nothing left to drive.
            // What of it still runs or lies on disk is the orphan sweep's.
            super::orphans::gone(&agent, &uid, held.take());
            agent.gate.reconciled(&uid);
            return;
        };
        held = super::orphans::held_by(&a);
        match step(&agent, &api, &a, &mut memory).await {
            Ok(Step::Done) => {
                agent.gate.reconciled(&uid);
                agent.advert_changed.notify_one();
                return;
            }
            Ok(Step::Again) => {
                watched.wrote();
                agent.advert_changed.notify_one();
            }
            Ok(Step::Wait) => {
                agent.gate.reconciled(&uid);
                tokio::time::sleep(agent.poll).await;
            }
            Err(StepError::Blocked(why)) => {
                agent.gate.block(&uid, why);
                agent.advert_changed.notify_one();
                if !reported {
                    reported = true;
                    tracing::warn!("{namespace}/{name}: recovery blocked: {}", why.as_str());
                    let what = match why {
                        RecoveryBlocked::IdentityUnreadable => {
                            "the runner's identity file cannot be read; a person must check the runtime"
                        }
                        RecoveryBlocked::GitHubUnreachable => {
                            "GitHub did not answer and this attempt's decision needs it; it is decided once GitHub answers"
                        }
                        RecoveryBlocked::ListFailed | RecoveryBlocked::JournalWriteFailed => {
                            "the API server did not serve what recovery needs"
                        }
                    };
                    events::warn(
                        &agent.kube,
                        &agent.node,
                        &a,
                        EventReason::RecoveryBlocked,
                        format!(
                            "recovery of this node is incomplete: {} ({what})",
                            why.as_str()
                        ),
                    )
                    .await;
                }
                tokio::time::sleep(agent.poll).await;
            }
            Err(e) => {
                tracing::warn!("{namespace}/{name}: {e}");
                tokio::time::sleep(agent.poll).await;
            }
        }
    }
}

/// One decision and its effect.
pub async fn step(
    agent: &Agent,
    api: &Api<RunnerAttempt>,
    a: &RunnerAttempt,
    memory: &mut TaskMemory,
) -> Result<Step, StepError> {
    let (uid, _, _) = names(a)?;
    if a.spec.node_name != agent.node {
        // Labelled for this node but bound elsewhere: not ours to touch.
        return Ok(Step::Done);
    }
    let journal = journal_of(a);
    let state = journal.state();
    agent
        .book()
        .observe(&uid, state, a.spec.snapshot.execution.mode);
    // The spec is immutable after admission (DESIGN §3): a changed one is refused. A launch not
    // yet started is concluded `SpecChanged`; a started runner is only stopped or concluded,
    // never moved on by facts.
    let frozen = journal
        .spec_hash()
        .is_some_and(|admitted| admitted != spec_hash(&a.spec));
    if frozen && state.is_live() && agent.warn_spec_changed(&uid) {
        let (_, name, ns) = names(a)?;
        tracing::warn!(namespace = %ns, attempt = %name, "the spec changed after admission; refusing to act on it");
        events::warn(
            &agent.kube,
            &agent.node,
            a,
            EventReason::SpecChanged,
            "the attempt's spec no longer matches the hash recorded at admission; the agent only stops and concludes it".to_owned(),
        )
        .await;
    }
    if frozen
        && matches!(
            state,
            AttemptState::Allocated
                | AttemptState::Preparing
                | AttemptState::Prepared
                | AttemptState::JitReceived
        )
        && jit_received_is_dead(agent, &journal)
    {
        conclude(
            api,
            &names(a)?.1,
            Outcome::Failed(FailureReason::SpecChanged),
        )
        .await?;
        return Ok(Step::Again);
    }
    match state {
        AttemptState::Cleaned => {
            agent.accounts().release(&uid);
            agent.packages.release(&uid);
            Ok(Step::Done)
        }
        AttemptState::Pending => {
            if !agent.gate.is_complete() {
                return Ok(Step::Wait);
            }
            launch::admit_and_launch(agent, api, a).await?;
            Ok(Step::Again)
        }
        s if s.is_terminal() => cleanup::clean(agent, api, a).await,
        AttemptState::JitReceived => jit_received(agent, api, a, &journal).await,
        AttemptState::Starting | AttemptState::Idle | AttemptState::Busy => {
            live(agent, api, a, &journal, frozen, memory).await
        }
        // Allocated, Preparing, Prepared: a launch a previous agent did not finish.
        _ => {
            let github = github_observation(
                &a.status
                    .as_ref()
                    .map(|s| s.facts.clone())
                    .unwrap_or_default(),
            );
            match recovery_decision(
                &journal,
                ProcessObservation::Gone,
                github,
                &timeouts(a, agent.deadline_grace),
                Timestamp::now(),
            ) {
                RecoveryDecision::Conclude(o) => {
                    conclude(api, &names(a)?.1, o).await?;
                    Ok(Step::Again)
                }
                RecoveryDecision::RequestJit => {
                    launch::resume_prepared(agent, api, a).await?;
                    Ok(Step::Again)
                }
                _ => Ok(Step::Wait),
            }
        }
    }
}

/// `JitReceived` found at start: the runner may have been spawned just before the crash. Its
/// identity is durable on the host before spawn returned; alive → `Starting`, gone → the JIT is
/// lost (`JitExpired`).
async fn jit_received(
    agent: &Agent,
    api: &Api<RunnerAttempt>,
    a: &RunnerAttempt,
    journal: &AttemptJournal,
) -> Result<Step, StepError> {
    let (_, name, ns) = names(a)?;
    let identity = match runtime_of(journal).map(|r| identity_file::read(&r)) {
        None | Some(Ok(None)) => None,
        Some(Ok(Some(id))) => Some(id),
        Some(Err(_)) => return Err(StepError::Blocked(RecoveryBlocked::IdentityUnreadable)),
    };
    let alive = match &identity {
        Some(id) => tokio::task::block_in_place(|| agent.launcher.inspect(id))
            .map_err(|_| StepError::Blocked(RecoveryBlocked::IdentityUnreadable))?
            .observation(),
        None => ProcessObservation::Gone,
    };
    let facts = a
        .status
        .as_ref()
        .map(|s| s.facts.clone())
        .unwrap_or_default();
    match recovery_decision(
        journal,
        alive,
        github_observation(&facts),
        &timeouts(a, agent.deadline_grace),
        Timestamp::now(),
    ) {
        RecoveryDecision::Observe(AttemptState::Starting) => {
            if let Some(id) = identity {
                tracing::info!(
                    namespace = %ns, attempt = %name, "re-adopted runner pid {} (spawned before the crash)",
                    id.pid
                );
                take(
                    api,
                    &name,
                    AttemptState::JitReceived,
                    Transition::Start {
                        identity: StartedIdentity::Process(id),
                    },
                )
                .await?;
            }
            Ok(Step::Again)
        }
        RecoveryDecision::Conclude(o) => {
            conclude(api, &name, o).await?;
            Ok(Step::Again)
        }
        _ => Ok(Step::Wait),
    }
}

/// The termination the operator asked for: `spec.termination`, or the attempt's deletion.
fn requested(a: &RunnerAttempt) -> Option<IntentReason> {
    a.spec
        .termination
        .as_ref()
        .map(|t| IntentReason::Requested(t.reason))
        .or_else(|| {
            a.metadata
                .deletion_timestamp
                .as_ref()
                .map(|_| IntentReason::Requested(TerminationReason::Deleted))
        })
}

fn evidence(runtime: &Path) -> JobEvidence {
    tokio::task::block_in_place(|| job_evidence(runtime))
}

/// A started runner: facts become edges, deadlines and requests become ordered terminations,
/// an exit becomes a conclusion.
async fn live(
    agent: &Agent,
    api: &Api<RunnerAttempt>,
    a: &RunnerAttempt,
    journal: &AttemptJournal,
    frozen: bool,
    memory: &mut TaskMemory,
) -> Result<Step, StepError> {
    let (_, name, ns) = names(a)?;
    let state = journal.state();
    let runtime = runtime_of(journal)
        .ok_or_else(|| StepError::Local("a started attempt without a workspace".into()))?;
    let Some(identity) = journal.process().cloned() else {
        return Err(StepError::Local(
            "a started attempt without a process identity".into(),
        ));
    };
    let facts = a
        .status
        .as_ref()
        .map(|s| s.facts.clone())
        .unwrap_or_default();
    let github = github_observation(&facts);
    let inspection = tokio::task::block_in_place(|| agent.launcher.inspect(&identity))
        .map_err(|e| StepError::Local(format!("inspection failed: {:?}", e.kind())))?;
    let request = requested(a);
    if inspection.is_alive() {
        if let Some(reason) = request {
            return stop(agent, api, a, &identity, &runtime, reason, state).await;
        }
        if frozen {
            return Ok(Step::Wait);
        }
        if let Some(t) = fact_edge(state, &facts, || evidence(&runtime)) {
            take(api, &name, state, t).await?;
            return Ok(Step::Again);
        }
        return match recovery_decision(
            journal,
            ProcessObservation::Alive,
            github,
            &timeouts(a, agent.deadline_grace),
            Timestamp::now(),
        ) {
            RecoveryDecision::Observe(to) => {
                if let Some(t) = observe_edge(state, to) {
                    take(api, &name, state, t).await?;
                }
                Ok(Step::Again)
            }
            RecoveryDecision::Terminate(r) => {
                stop(
                    agent,
                    api,
                    a,
                    &identity,
                    &runtime,
                    IntentReason::Deadline(r),
                    state,
                )
                .await
            }
            RecoveryDecision::Conclude(o) => {
                conclude(api, &name, o).await?;
                Ok(Step::Again)
            }
            RecoveryDecision::Defer => deferred(agent),
            _ => Ok(Step::Wait),
        };
    }
    // Gone: the exit, `_diag`, an intent or a request, then GitHub's witness.
    let exit = ExitReading::of(agent.launcher.exit_status(&identity));
    let seen = evidence(&runtime);
    let intent = request.or_else(|| read_intent(&runtime).ok().flatten());
    let rec = recovery_decision(
        journal,
        ProcessObservation::Gone,
        github,
        &timeouts(a, agent.deadline_grace),
        Timestamp::now(),
    );
    let not_taken = assignment_never_taken(state, exit, seen, intent, github);
    let decided = if not_taken {
        Some(Outcome::ExitedIdleWithoutWork)
    } else {
        exit_outcome(state, exit, seen, intent, rec)
    };
    if awaits_newer_witness(state, github, decided) {
        if memory.gone_while_listed.is_none() {
            tracing::info!(
                namespace = %ns, attempt = %name,
                "runner exited while GitHub's last fact lists it idle; waiting up to {} s for a termination request or a newer fact",
                EXIT_WITNESS_GRACE.as_secs()
            );
        }
        let since = *memory
            .gone_while_listed
            .get_or_insert_with(std::time::Instant::now);
        if since.elapsed() < EXIT_WITNESS_GRACE {
            return Ok(Step::Wait);
        }
    }
    match decided {
        Some(outcome) => {
            tracing::info!(namespace = %ns, attempt = %name, "runner exited ({exit:?}, {seen:?}): {outcome:?}");
            if not_taken {
                // `ExitedIdleWithoutWork` is concluded from `Idle`: walk the assignment back first.
                take(api, &name, state, Transition::AssignmentNotTaken).await?;
            }
            conclude(api, &name, outcome).await?;
            Ok(Step::Again)
        }
        // Only a deferral leaves an exit undecided.
        None => deferred(agent),
    }
}

/// A decision deferred because GitHub did not answer. While the node recovers this keeps
/// recovery incomplete (DESIGN §4 rule 8: nothing launches on the node before every attempt is
/// reconciled, and this one is not); after that the attempt just waits for an answer.
fn deferred(agent: &Agent) -> Result<Step, StepError> {
    if agent.gate.is_complete() {
        Ok(Step::Wait)
    } else {
        Err(StepError::Blocked(RecoveryBlocked::GitHubUnreachable))
    }
}

/// Ordered termination: durable intent with its reason, stop through the launcher, death proven,
/// then the conclusion from the reason and the state it was stopped in.
#[allow(clippy::too_many_arguments)]
async fn stop(
    agent: &Agent,
    api: &Api<RunnerAttempt>,
    a: &RunnerAttempt,
    identity: &runner_manager_crds::attempt::ProcessIdentity,
    runtime: &Path,
    reason: IntentReason,
    state: AttemptState,
) -> Result<Step, StepError> {
    let (_, name, ns) = names(a)?;
    if let Err(e) = record_intent(runtime, reason) {
        tracing::warn!(
            namespace = %ns, attempt = %name, "termination intent not durable ({:?}); nothing signalled",
            e.kind()
        );
        return Ok(Step::Wait);
    }
    fault::at(Boundary::AfterTerminationIntent);
    match tokio::task::block_in_place(|| {
        terminate(agent.launcher.as_ref(), identity, runtime, reason, state)
    }) {
        Ok(outcome) => {
            tracing::info!(namespace = %ns, attempt = %name, "stopped ({}): {outcome:?}", reason.token());
            conclude(api, &name, outcome).await?;
            Ok(Step::Again)
        }
        Err(e) => {
            tracing::warn!(namespace = %ns, attempt = %name, "termination deferred: {e}");
            Ok(Step::Wait)
        }
    }
}

/// Whether a `JitReceived` attempt's runner (if the state is that) is proven not running, so it
/// may be concluded; other pre-start states have no runner.
fn jit_received_is_dead(agent: &Agent, journal: &AttemptJournal) -> bool {
    if journal.state() != AttemptState::JitReceived {
        return true;
    }
    match runtime_of(journal).map(|r| identity_file::read(&r)) {
        None | Some(Ok(None)) => true,
        Some(Ok(Some(id))) => {
            tokio::task::block_in_place(|| agent.launcher.inspect(&id)).is_ok_and(|i| !i.is_alive())
        }
        Some(Err(_)) => false,
    }
}
