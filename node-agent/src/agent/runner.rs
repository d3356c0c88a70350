//! The attempt's started runner, whichever provider runs it (DESIGN §12 "Provider seam"):
//! supervision asks it whether it is alive, how it exited and to stop, and never needs to know
//! whether it is a host process (the launcher's identity) or a pod (the OCI provider's).

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

use kube::api::Api;
use runner_manager_crds::attempt::{
    AttemptJournal, ProcessIdentity, RunnerAttempt, StartedIdentity, Transition,
};
use runner_manager_crds::outcome::{FailureReason, Outcome};
use runner_manager_crds::policy::ExecutionMode;
use runner_manager_crds::state::AttemptState;

use super::attempt_ctx::{Step, StepError, conclude, names, runtime_of, take};
use super::node::Agent;
use crate::providers::launcher::StopError;
use crate::providers::oci::{self, KubePods, OciProvider, PodObservation, PodRef};
use crate::providers::{NativeProvider, RunnerProvider};
use crate::termination::{IntentReason, TerminationError, record_intent, terminate};

/// A started runner.
#[derive(Clone, Debug)]
pub enum Runner {
    Process(ProcessIdentity),
    Pod(PodRef),
}

/// What one look at a runner saw.
#[derive(Clone, Copy, Debug)]
pub struct Seen {
    pub alive: bool,
    /// The exit status, when the provider knows it (the direct launcher's own child; a pod's
    /// terminated container).
    pub exit: Option<ExitStatus>,
    /// A pod's closed observation (logged with the conclusion).
    pub pod: Option<PodObservation>,
}

impl Runner {
    /// The journalled runner of a started attempt.
    pub fn of(a: &RunnerAttempt, journal: &AttemptJournal) -> Option<Self> {
        match a.spec.snapshot.execution.mode {
            ExecutionMode::Native => journal.process().cloned().map(Self::Process),
            ExecutionMode::Oci => journal.environment().map(|e| {
                Self::Pod(PodRef {
                    namespace: a.metadata.namespace.clone().unwrap_or_default(),
                    identity: e.clone(),
                })
            }),
        }
    }

    pub async fn look(&self, agent: &Agent) -> Result<Seen, StepError> {
        match self {
            Self::Process(id) => {
                let native = NativeProvider(agent.launcher.as_ref());
                let inspection = native
                    .inspect(id)
                    .await
                    .map_err(|e| StepError::Local(e.to_string()))?;
                let alive = inspection.is_alive();
                Ok(Seen {
                    alive,
                    exit: if alive {
                        None
                    } else {
                        agent.launcher.exit_status(id)
                    },
                    pod: None,
                })
            }
            Self::Pod(pod) => {
                let seen = pods(agent)
                    .inspect_pod(pod)
                    .await
                    .map_err(|e| StepError::Local(format!("pod inspection failed: {e}")))?;
                Ok(Seen {
                    alive: seen.is_alive(),
                    exit: seen
                        .exit_code()
                        .map(|c| ExitStatus::from_raw((c & 0xff) << 8)),
                    pod: Some(seen),
                })
            }
        }
    }

    /// Ordered termination: durable intent, stop through the provider, death proven by looking
    /// again, then the outcome of `reason` in `state`.
    pub async fn terminate(
        &self,
        agent: &Agent,
        runtime: &Path,
        reason: IntentReason,
        state: AttemptState,
    ) -> Result<Outcome, TerminationError> {
        match self {
            Self::Process(id) => tokio::task::block_in_place(|| {
                terminate(agent.launcher.as_ref(), id, runtime, reason, state)
            }),
            Self::Pod(pod) => {
                record_intent(runtime, reason)
                    .map_err(|e| TerminationError::IntentNotDurable(e.kind()))?;
                let oci = pods(agent);
                oci.stop_pod(pod)
                    .await
                    .map_err(|_| TerminationError::Deferred(StopError::StillRunning))?;
                match oci.inspect_pod(pod).await {
                    Ok(seen) if !seen.is_alive() => Ok(reason.outcome(state)),
                    Ok(_) => Err(TerminationError::Deferred(StopError::StillRunning)),
                    Err(_) => Err(TerminationError::Inspect(std::io::ErrorKind::Other)),
                }
            }
        }
    }
}

/// The agent's OCI provider, or (an agent restarted without `--oci` that still has OCI
/// attempts) one made for supervising and destroying their pods: such an agent admits no new
/// OCI attempt, but never leaves a started pod unwatched.
pub fn pods(agent: &Agent) -> std::borrow::Cow<'_, OciProvider<KubePods>> {
    match agent.oci.as_ref() {
        Some(p) => std::borrow::Cow::Borrowed(p),
        None => std::borrow::Cow::Owned(OciProvider {
            pods: KubePods(agent.kube.clone()),
            node: agent.node.clone(),
            start_deadline: std::time::Duration::from_secs(1),
            handoff_deadline: std::time::Duration::from_secs(1),
        }),
    }
}

/// (OCI) `JitReceived` found at start: the helper in the pod took the handoff (its marker is in
/// the runtime and the pod runs) → `Starting` with the journalled pod; otherwise the JIT lived
/// only in the dead agent's memory or in a handoff nobody took: `JitExpired`, never re-requested.
pub async fn pod_jit_received(
    agent: &Agent,
    api: &Api<RunnerAttempt>,
    a: &RunnerAttempt,
    journal: &AttemptJournal,
) -> Result<Step, StepError> {
    let (_, name, ns) = names(a)?;
    let Some(Runner::Pod(pod)) = Runner::of(a, journal) else {
        conclude(api, &name, Outcome::Failed(FailureReason::JitExpired)).await?;
        return Ok(Step::Again);
    };
    let taken = runtime_of(journal)
        .is_some_and(|r| std::fs::symlink_metadata(r.join(oci::TAKEN_MARKER)).is_ok());
    let seen = Runner::Pod(pod.clone()).look(agent).await?;
    if taken && seen.alive {
        tracing::info!(namespace = %ns, attempt = %name, "re-adopted runner pod (started before the crash)");
        take(
            api,
            &name,
            AttemptState::JitReceived,
            Transition::Start {
                identity: StartedIdentity::Environment(pod.identity),
            },
        )
        .await?;
    } else {
        conclude(api, &name, Outcome::Failed(FailureReason::JitExpired)).await?;
    }
    Ok(Step::Again)
}
