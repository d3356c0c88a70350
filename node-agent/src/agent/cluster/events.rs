//! Events on attempts, for what a person must see (a blocked recovery, a quarantined slot).
//! Reasons are a closed vocabulary; messages carry ids and kinds, never workflow-chosen names.

use kube::Resource;
use kube::runtime::events::{Recorder, Reporter};
use runner_manager_crds::attempt::RunnerAttempt;

use crate::agent::node::Agent;

pub use crate::agent::labels::{EventReason, publish_warning};

/// The agent's Event recorder (events.k8s.io/v1 through kube's `Recorder`: repeats of one
/// Event on one object become a series instead of new objects). The reporting controller is
/// `runner-manager-node-agent`, the instance the node. One per agent, in its `Agent`.
pub fn recorder(kube: &kube::Client, node: &str) -> Recorder {
    Recorder::new(
        kube.clone(),
        Reporter {
            controller: "runner-manager-node-agent".into(),
            instance: Some(node.to_owned()),
        },
    )
}

/// Emits a Warning event on `attempt`. Best effort: an event that cannot be written is logged.
pub async fn warn(agent: &Agent, attempt: &RunnerAttempt, reason: EventReason, message: String) {
    if attempt.metadata.namespace.is_none() {
        return;
    }
    agent.metrics().event(reason.as_str());
    publish_warning(
        &agent.cluster.events,
        &attempt.object_ref(&()),
        reason,
        message,
    )
    .await;
}
