//! The attempt's started runner, whichever provider runs it (DESIGN §12 "Provider seam"):
//! supervision asks it whether it is alive, how it exited and to stop, and never needs to know
//! whether it is a host process or a pod. The provider is chosen once, by the attempt's
//! execution mode, from the agent's registry ([`Runner::of`]); every look, stop and destruction
//! then goes through `&dyn Provider` and `termination::terminate_with`, so every kind shares
//! one code path.

use std::path::Path;

use runner_manager_crds::attempt::{AttemptJournal, RunnerAttempt, StartedIdentity};
use runner_manager_crds::outcome::Outcome;
use runner_manager_crds::state::AttemptState;

use crate::agent::attempt_ctx::StepError;
use crate::agent::node::Agent;
use crate::providers::{Provider, RunnerRef, Seen};
use crate::termination::{IntentReason, TerminationError, terminate_with};

/// A started runner: the identity its provider journalled, and that provider.
pub struct Runner<'a> {
    provider: &'a dyn Provider,
    namespace: String,
    identity: StartedIdentity,
}

impl std::fmt::Debug for Runner<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("mode", &self.provider.mode())
            .field("identity", &self.identity)
            .finish()
    }
}

impl<'a> Runner<'a> {
    /// The journalled runner of a started attempt, for the provider of its execution mode.
    pub fn of(agent: &'a Agent, a: &RunnerAttempt, journal: &AttemptJournal) -> Option<Self> {
        let provider = agent.providers.of(a.spec.snapshot.execution.mode);
        Some(Self {
            identity: provider.started(journal)?,
            namespace: a.metadata.namespace.clone().unwrap_or_default(),
            provider,
        })
    }

    fn runner(&self) -> RunnerRef<'_> {
        RunnerRef {
            namespace: &self.namespace,
            identity: &self.identity,
        }
    }

    pub async fn look(&self) -> Result<Seen, StepError> {
        self.provider
            .look(self.runner())
            .await
            .map_err(|e| StepError::Local(e.to_string()))
    }

    /// Ordered termination: durable intent, stop through the provider, death proven by looking
    /// again, then the outcome of `reason` in `state`.
    pub async fn terminate(
        &self,
        runtime: &Path,
        reason: IntentReason,
        state: AttemptState,
    ) -> Result<Outcome, TerminationError> {
        terminate_with(self.provider, self.runner(), runtime, reason, state).await
    }
}
