//! One attempt's step: read where the attempt is, take one decision and its effect. The agent's
//! controller (`agent::controller`) calls it on every reconcile of the attempt, so the same
//! `step` is recovery after a restart and ordinary supervision ("recovery is supervision",
//! DESIGN §4 rule 8): every decision on an attempt the agent is not bringing up goes through
//! `crds::recovery::recovery_decision`, with the facts the operator wrote and what the agent
//! sees of the process.

use std::path::Path;

use k8s_openapi::jiff::Timestamp;
use runner_manager_crds::attempt::spec_hash;
use runner_manager_crds::attempt::{
    AttemptJournal, RunnerAttempt, StartedIdentity, TerminationReason, Transition,
};
use runner_manager_crds::lease::RecoveryBlocked;
use runner_manager_crds::outcome::{FailureReason, Outcome};
use runner_manager_crds::recovery::{ProcessObservation, RecoveryDecision, recovery_decision};
use runner_manager_crds::state::AttemptState;

use crate::agent::attempt_ctx::{AttemptCtx, Step, StepError, runtime_of, timeouts};
use crate::agent::cleanup;
use crate::agent::edges::{
    EXIT_WITNESS_GRACE, assignment_never_taken, awaits_newer_witness, exit_outcome, fact_edge,
    github_observation, observe_edge,
};
use crate::agent::events::{self, EventReason};
use crate::agent::fault::{self, Boundary};
use crate::agent::launch;
use crate::agent::node::Agent;
use crate::agent::placeholder::{self, Kept};
use crate::agent::rebuild::journal_of;
use crate::evidence::{ExitReading, JobEvidence, job_evidence};
use crate::pods::{self, PodRole};
use crate::providers::provider::Handover;
use crate::termination::{IntentReason, read_intent, record_intent};

/// What the agent remembers of one attempt between its steps (lost on a restart, which only
/// restarts the clocks it holds).
#[derive(Debug, Default)]
pub struct AttemptMemory {
    /// When the runner was first seen gone while the last fact still listed it idle
    /// ([`awaits_newer_witness`]).
    gone_while_listed: Option<std::time::Instant>,
    /// A native runner's placeholder was recreated (or its recreation refused): not again
    /// before this ([`placeholder::KEEP_RETRY`]).
    placeholder_retry: Option<std::time::Instant>,
}

/// One decision and its effect.
pub async fn step(
    agent: &Agent,
    ctx: &AttemptCtx,
    a: &RunnerAttempt,
    memory: &mut AttemptMemory,
) -> Result<Step, StepError> {
    let uid = ctx.uid.clone();
    if a.spec.node_name != agent.cluster.node {
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
        let (name, ns) = (&ctx.name, &ctx.namespace);
        tracing::warn!(namespace = %ns, attempt = %name, "the spec changed after admission; refusing to act on it");
        events::warn(
            agent,
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
        && jit_received_is_dead(agent, a, &journal).await
    {
        ctx.conclude(Outcome::Failed(FailureReason::SpecChanged))
            .await?;
        return Ok(Step::Again);
    }
    match state {
        AttemptState::Cleaned => {
            agent.accounts().release(&uid);
            agent.host.packages.release(&uid);
            Ok(Step::Done)
        }
        AttemptState::Pending => {
            if !agent.gate.is_complete() {
                return Ok(Step::Wait);
            }
            launch::admit_and_launch(agent, ctx.api(), a).await?;
            Ok(Step::Again)
        }
        s if s.is_terminal() => cleanup::clean(agent, ctx.api(), a).await,
        AttemptState::JitReceived => jit_received(agent, ctx, a, &journal).await,
        AttemptState::Starting | AttemptState::Idle | AttemptState::Busy => {
            live(agent, ctx, a, &journal, frozen, memory).await
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
                    ctx.conclude(o).await?;
                    Ok(Step::Again)
                }
                RecoveryDecision::RequestJit => {
                    launch::resume_prepared(agent, ctx.api(), a).await?;
                    Ok(Step::Again)
                }
                _ => Ok(Step::Wait),
            }
        }
    }
}

/// `JitReceived` found at start: the runner may have been started just before the crash. What
/// its provider finds of it (a native identity durable on the host before the spawn returned; a
/// pod whose helper left its marker) goes through the recovery table: alive → `Starting`, gone
/// or never taken → the JIT is lost (`JitExpired`).
async fn jit_received(
    agent: &Agent,
    ctx: &AttemptCtx,
    a: &RunnerAttempt,
    journal: &AttemptJournal,
) -> Result<Step, StepError> {
    let (name, ns) = (&ctx.name, &ctx.namespace);
    let provider = agent.providers.of(a.spec.snapshot.execution.mode);
    let runtime = runtime_of(journal);
    let (identity, alive) = match provider.handover(ns, journal, runtime.as_deref()).await {
        Handover::NotTaken => (None, ProcessObservation::Gone),
        Handover::Runner { identity, alive } => (
            Some(identity),
            if alive {
                ProcessObservation::Alive
            } else {
                ProcessObservation::Gone
            },
        ),
        Handover::Unreadable => {
            return Err(StepError::Blocked(RecoveryBlocked::IdentityUnreadable));
        }
        Handover::Unknown(e) => {
            return Err(StepError::Local(format!(
                "the runner could not be looked at: {e}"
            )));
        }
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
            if let Some(identity) = identity {
                tracing::info!(
                    namespace = %ns, attempt = %name, "re-adopted runner {} (started before the crash)",
                    describe(&identity)
                );
                ctx.take(AttemptState::JitReceived, Transition::Start { identity })
                    .await?;
            }
            Ok(Step::Again)
        }
        RecoveryDecision::Conclude(o) => {
            ctx.conclude(o).await?;
            Ok(Step::Again)
        }
        _ => Ok(Step::Wait),
    }
}

/// A started identity in a log line: the pid, or the pod.
fn describe(identity: &StartedIdentity) -> String {
    match identity {
        StartedIdentity::Process(p) => format!("pid {}", p.pid),
        StartedIdentity::Environment(e) => format!("pod {}", e.pod_name),
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
    ctx: &AttemptCtx,
    a: &RunnerAttempt,
    journal: &AttemptJournal,
    frozen: bool,
    memory: &mut AttemptMemory,
) -> Result<Step, StepError> {
    let (name, ns) = (&ctx.name, &ctx.namespace);
    let state = journal.state();
    let runtime = runtime_of(journal)
        .ok_or_else(|| StepError::Local("a started attempt without a workspace".into()))?;
    let Some(runner) = crate::agent::runner::Runner::of(agent, a, journal) else {
        return Err(StepError::Local(
            "a started attempt without a process or pod identity".into(),
        ));
    };
    let facts = a
        .status
        .as_ref()
        .map(|s| s.facts.clone())
        .unwrap_or_default();
    let github = github_observation(&facts);
    let seen = runner.look().await?;
    let request = requested(a);
    if seen.alive {
        if let Some(reason) = request {
            return stop(ctx, &runner, &runtime, reason, state).await;
        }
        keep_placeholder(agent, ctx, a, memory).await;
        reopen_job_gate(agent, a, &runtime);
        crate::agent::docker::serve_again(agent, a, &runtime);
        if frozen {
            return Ok(Step::Wait);
        }
        if let Some(t) = fact_edge(state, &facts, || evidence(&runtime)) {
            ctx.take(state, t).await?;
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
                    ctx.take(state, t).await?;
                }
                Ok(Step::Again)
            }
            RecoveryDecision::Terminate(r) => {
                stop(ctx, &runner, &runtime, IntentReason::Deadline(r), state).await
            }
            RecoveryDecision::Conclude(o) => {
                ctx.conclude(o).await?;
                Ok(Step::Again)
            }
            RecoveryDecision::Defer => deferred(agent),
            _ => Ok(Step::Wait),
        };
    }
    // Gone: the exit, `_diag`, an intent or a request, then GitHub's witness.
    let exit = ExitReading::of(seen.exit);
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
                // `ExitedIdleWithoutWork` is concluded from `Idle`: walk the assignment back
                // first, in the same write (no effect lies between the two edges).
                ctx.conclude_via((state, Transition::AssignmentNotTaken), outcome)
                    .await?;
            } else {
                ctx.conclude(outcome).await?;
            }
            Ok(Step::Again)
        }
        // Only a deferral leaves an exit undecided.
        None => deferred(agent),
    }
}

/// A live runner whose gate is not open (the agent restarted) gets it back, for the account
/// that owns its runtime; until then its hook finds no listener and refuses.
fn reopen_job_gate(agent: &Agent, a: &RunnerAttempt, runtime: &Path) {
    use std::os::unix::fs::MetadataExt;
    let uid = a.metadata.uid.as_deref().unwrap_or_default();
    if !crate::agent::job_gates::JobGates::wanted(a) || agent.host.job_gates.is_open(uid) {
        return;
    }
    // The runtime's own entry (never a link's target): its owner is the runner's account.
    let reopened = std::fs::symlink_metadata(runtime)
        .map_err(|e| e.to_string())
        .and_then(|m| {
            if !m.is_dir() {
                return Err("the runtime is not a directory".to_owned());
            }
            agent
                .host
                .job_gates
                .open(
                    agent.gate_services(),
                    a,
                    (m.uid(), m.gid()),
                    crate::agent::caches::verdicts_for(agent, a),
                )
                .map_err(|e| e.to_string())
        });
    if let Err(e) = reopened {
        tracing::warn!(attempt = %uid, "the job gate was not reopened (its job will be refused): {e}");
    }
}

/// A running native runner's placeholder, kept standing (docs/placeholder-pods.md): read from
/// the pod watch's store (no request), recreated with a Warning event when it was deleted,
/// evicted or ended; never a reason to stop the runner.
async fn keep_placeholder(
    agent: &Agent,
    ctx: &AttemptCtx,
    a: &RunnerAttempt,
    memory: &mut AttemptMemory,
) {
    if agent.cluster.placeholders.is_none() {
        return;
    }
    let provider = agent.providers.of(a.spec.snapshot.execution.mode);
    if !provider.needs_placeholder() || !agent.cluster.pod_watch.is_running() {
        return;
    }
    let now = std::time::Instant::now();
    if memory.placeholder_retry.is_some_and(|at| now < at) {
        return;
    }
    let (name, ns) = (&ctx.name, &ctx.namespace);
    let found = agent
        .cluster
        .pod_watch
        .get(ns, &pods::pod_name(name, PodRole::Placeholder));
    let message = match placeholder::keep(&agent.cluster.broker, a, found.as_deref()).await {
        Kept::Standing => return,
        Kept::Recreated(lost) => {
            tracing::warn!(namespace = %ns, attempt = %name, reason = lost.as_str(), "the placeholder of a running runner was lost; recreated");
            format!(
                "the placeholder pod was lost while its runner ran ({}); recreated so the scheduler counts the runner",
                lost.as_str()
            )
        }
        Kept::Lost(lost, refused) => {
            tracing::warn!(namespace = %ns, attempt = %name, reason = refused.as_str(), "the placeholder of a running runner was lost and not recreated; the runner runs on");
            format!(
                "the placeholder pod was lost while its runner ran ({}) and could not be recreated ({}); the scheduler does not count this runner until it is; tried again in {} s",
                lost.as_str(),
                refused.as_str(),
                placeholder::KEEP_RETRY.as_secs()
            )
        }
    };
    memory.placeholder_retry = Some(now + placeholder::KEEP_RETRY);
    events::warn(agent, a, EventReason::PlaceholderLost, message).await;
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

/// Ordered termination: durable intent with its reason, stop through the provider, death proven,
/// then the conclusion from the reason and the state it was stopped in.
async fn stop(
    ctx: &AttemptCtx,
    runner: &crate::agent::runner::Runner<'_>,
    runtime: &Path,
    reason: IntentReason,
    state: AttemptState,
) -> Result<Step, StepError> {
    let (name, ns) = (&ctx.name, &ctx.namespace);
    if let Err(e) = record_intent(runtime, reason) {
        tracing::warn!(
            namespace = %ns, attempt = %name, "termination intent not durable ({:?}); nothing signalled",
            e.kind()
        );
        return Ok(Step::Wait);
    }
    fault::at(Boundary::AfterTerminationIntent);
    match runner.terminate(runtime, reason, state).await {
        Ok(outcome) => {
            tracing::info!(namespace = %ns, attempt = %name, "stopped ({}): {outcome:?}", reason.token());
            ctx.conclude(outcome).await?;
            Ok(Step::Again)
        }
        Err(e) => {
            tracing::warn!(namespace = %ns, attempt = %name, "termination deferred: {e}");
            Ok(Step::Wait)
        }
    }
}

/// Whether a `JitReceived` attempt's runner (if the state is that) is proven not running, so it
/// may be concluded; other pre-start states have no runner. A look that fails, or a record that
/// cannot be read, proves nothing.
async fn jit_received_is_dead(agent: &Agent, a: &RunnerAttempt, journal: &AttemptJournal) -> bool {
    if journal.state() != AttemptState::JitReceived {
        return true;
    }
    let provider = agent.providers.of(a.spec.snapshot.execution.mode);
    let ns = a.metadata.namespace.as_deref().unwrap_or_default();
    let runtime = runtime_of(journal);
    match provider.handover(ns, journal, runtime.as_deref()).await {
        Handover::NotTaken => true,
        Handover::Runner { alive, .. } => !alive,
        Handover::Unreadable | Handover::Unknown(_) => false,
    }
}
