//! The node's attempts as this agent writes them ([`Attempts`]): below every stage and the
//! agent's context, so each of them can hold or take it.

use kube::api::Api;
use runner_manager_crds::attempt::RunnerAttempt;

/// The attempts of one namespace as this agent writes them: the API, with the agent's journal
/// context and metrics every write goes with (they were process statics; issue 30 item 6).
/// Derefs to the API, so a stage reads and writes through it as it did through the API.
#[derive(Clone)]
pub struct Attempts {
    api: Api<RunnerAttempt>,
    pub journal: std::sync::Arc<crate::journal::Journal>,
    pub metrics: std::sync::Arc<crate::agent::metrics::AgentMetrics>,
}

impl Attempts {
    /// The same journal and metrics, for the attempts of `namespace`.
    pub fn in_namespace(&self, namespace: &str) -> Self {
        Self {
            api: Api::namespaced(self.api.clone().into_client(), namespace),
            journal: std::sync::Arc::clone(&self.journal),
            metrics: std::sync::Arc::clone(&self.metrics),
        }
    }

    pub fn new(
        api: Api<RunnerAttempt>,
        journal: std::sync::Arc<crate::journal::Journal>,
        metrics: std::sync::Arc<crate::agent::metrics::AgentMetrics>,
    ) -> Self {
        Self {
            api,
            journal,
            metrics,
        }
    }
}

impl std::ops::Deref for Attempts {
    type Target = Api<RunnerAttempt>;
    fn deref(&self) -> &Api<RunnerAttempt> {
        &self.api
    }
}

impl std::fmt::Debug for Attempts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attempts").finish_non_exhaustive()
    }
}
