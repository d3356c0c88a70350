//! The attempt's started runner, whichever provider runs it (DESIGN §12 "Provider seam"):
//! supervision asks it whether it is alive, how it exited and to stop, and never needs to know
//! whether it is a host process (the launcher's identity) or a pod (the OCI provider's). The
//! provider is chosen once, by the attempt's execution mode ([`Runner::of`]); every look, stop
//! and destruction then goes through [`RunnerProvider`] and the generic steps of
//! `providers::look` and `termination::terminate`, so native and OCI share one code path.

use std::path::Path;

use kube::api::Api;
use runner_manager_crds::attempt::{
    AttemptJournal, EnvironmentIdentity, ProcessIdentity, RunnerAttempt, StartedIdentity,
    Transition,
};
use runner_manager_crds::outcome::{FailureReason, Outcome};
use runner_manager_crds::policy::ExecutionMode;
use runner_manager_crds::state::AttemptState;

use super::attempt_ctx::{Step, StepError, conclude, names, runtime_of, take};
use super::node::Agent;
use crate::pods::{self, PodRole};
use crate::providers::oci::{self, KubePods, OciProvider, PodRef};
use crate::providers::{NativeProvider, Seen, look};
use crate::termination::{IntentReason, TerminationError, terminate_with as terminate};

/// A started runner: the identity its provider journalled.
#[derive(Clone, Debug)]
pub enum Runner {
    Process(ProcessIdentity),
    Pod(PodRef),
}

impl Runner {
    /// The journalled runner of a started attempt, for the provider of its execution mode.
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
        let seen = match self {
            Self::Process(id) => look(&NativeProvider(agent.launcher.as_ref()), id)
                .await
                .map_err(|e| e.to_string()),
            Self::Pod(pod) => look(pods(agent).as_ref(), pod)
                .await
                .map_err(|e| format!("pod inspection failed: {e}")),
        };
        seen.map_err(StepError::Local)
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
            Self::Process(id) => {
                terminate(
                    &NativeProvider(agent.launcher.as_ref()),
                    id,
                    runtime,
                    reason,
                    state,
                )
                .await
            }
            Self::Pod(pod) => terminate(pods(agent).as_ref(), pod, runtime, reason, state).await,
        }
    }
}

/// The runner pods of an OCI attempt to destroy: the journalled one, or (an interrupted
/// preparation journalled none) the attempt's name and generation, which is all the provider's
/// `destroy` uses to find every runner pod of that generation.
pub fn pods_of(a: &RunnerAttempt, journal: &AttemptJournal) -> Option<PodRef> {
    let namespace = a.metadata.namespace.clone()?;
    let identity = match journal.environment() {
        Some(e) => e.clone(),
        None => EnvironmentIdentity {
            pod_name: pods::pod_name(a.metadata.name.as_deref()?, PodRole::Runner),
            uid: String::new(),
            generation: a.metadata.uid.clone()?,
        },
    };
    Some(PodRef {
        namespace,
        identity,
    })
}

/// The agent's OCI provider, or (an agent restarted without `--oci` that still has OCI
/// attempts) one made for supervising and destroying their pods: such an agent admits no new
/// OCI attempt, but never leaves a started pod unwatched.
pub fn pods(agent: &Agent) -> std::borrow::Cow<'_, OciProvider<KubePods>> {
    match agent.oci.as_ref() {
        Some(p) => std::borrow::Cow::Borrowed(p),
        None => std::borrow::Cow::Owned(OciProvider {
            pods: KubePods {
                client: agent.kube.clone(),
                watch: std::sync::Arc::clone(&agent.pod_watch),
                broker: std::sync::Arc::clone(&agent.broker),
            },
            node: agent.node.clone(),
            start_deadline: std::time::Duration::from_secs(1),
            handoff_deadline: std::time::Duration::from_secs(1),
        }),
    }
}

/// (OCI, `JitReceived`) Whether the helper in the journalled pod took the JIT (its marker is in
/// the runtime) and the pod runs: then the runner lives with the JIT, and the attempt is
/// `Starting`, not expired or dead.
pub async fn pod_took_jit(
    agent: &Agent,
    journal: &AttemptJournal,
    pod: &PodRef,
) -> Result<bool, StepError> {
    let taken = runtime_of(journal)
        .is_some_and(|r| std::fs::symlink_metadata(r.join(oci::TAKEN_MARKER)).is_ok());
    Ok(taken && Runner::Pod(pod.clone()).look(agent).await?.alive)
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
    if pod_took_jit(agent, journal, &pod).await? {
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
