//! Kubernetes Events for every decision a person would want to see (DESIGN §8). Reasons are a
//! closed vocabulary; notes never echo workflow-controlled text.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use super::writes::Writer;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    AttemptCreated,
    Unplaceable,
    PolicyInvalid,
    PolicyReady,
    Degraded,
    ScaleDown,
    RunnerTookJob,
    TerminationRequested,
    AdmissionExpired,
    NodeLost,
    Abandoned,
    OrphanRegistrationDeleted,
    Drained,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AttemptCreated => "AttemptCreated",
            Self::Unplaceable => "Unplaceable",
            Self::PolicyInvalid => "PolicyInvalid",
            Self::PolicyReady => "PolicyReady",
            Self::Degraded => "Degraded",
            Self::ScaleDown => "ScaleDown",
            Self::RunnerTookJob => "RunnerTookJob",
            Self::TerminationRequested => "TerminationRequested",
            Self::AdmissionExpired => "AdmissionExpired",
            Self::NodeLost => "NodeLost",
            Self::Abandoned => "Abandoned",
            Self::OrphanRegistrationDeleted => "OrphanRegistrationDeleted",
            Self::Drained => "Drained",
        }
    }

    fn is_warning(self) -> bool {
        matches!(
            self,
            Self::Unplaceable
                | Self::PolicyInvalid
                | Self::Degraded
                | Self::AdmissionExpired
                | Self::NodeLost
                | Self::Abandoned
        )
    }
}

/// Publishes events; a failure to publish is logged, never fatal.
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
    writer: Writer,
}

impl Events {
    pub fn new(writer: Writer, instance: String) -> Self {
        let reporter = Reporter {
            controller: "runner-manager-operator".into(),
            instance: Some(instance),
        };
        Self {
            recorder: Recorder::new(writer.kube.clone(), reporter),
            writer,
        }
    }

    pub async fn publish(&self, regarding: &ObjectReference, reason: Reason, note: String) {
        self.writer.counted_event();
        let event = Event {
            type_: if reason.is_warning() {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.as_str().into(),
            note: Some(note),
            action: reason.as_str().into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, regarding).await {
            tracing::debug!(error = %e, reason = reason.as_str(), "event not published");
        }
    }
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}
