//! Kubernetes Events for every decision a person would want to see (DESIGN §8). Reasons are a
//! closed vocabulary; notes never echo workflow-controlled text.

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;

use crate::controller::writes::Writer;

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
    TargetConflict,
    ScaleSetDeleted,
    ScaleSetDeleteFailed,
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
            Self::TargetConflict => "TargetConflict",
            Self::ScaleSetDeleted => "ScaleSetDeleted",
            Self::ScaleSetDeleteFailed => "ScaleSetDeleteFailed",
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
                | Self::TargetConflict
                | Self::ScaleSetDeleteFailed
        )
    }
}

/// Publishes events; a failure to publish is logged, never fatal.
/// Events wait here for the sender: a pass never waits on an Event write (a burst of 50
/// creations or a thousand policies turning Ready would otherwise wait on as many POSTs).
const QUEUE: usize = 4096;
/// Events sent at once.
const SENDERS: usize = 8;

/// The Event publisher: a bounded queue drained by one background task. When the queue is full
/// an Event is dropped and counted, as client-go's broadcaster does: Events are for people, and
/// no decision depends on one.
#[derive(Clone)]
pub struct Events {
    queue: mpsc::Sender<(ObjectReference, Event)>,
    writer: Writer,
}

impl Events {
    /// Start the sender (needs a tokio runtime).
    pub fn new(writer: Writer, instance: String) -> Self {
        let reporter = Reporter {
            controller: "runner-manager-operator".into(),
            instance: Some(instance),
        };
        let recorder = Recorder::new(writer.kube.clone(), reporter);
        let (queue, mut rx) = mpsc::channel::<(ObjectReference, Event)>(QUEUE);
        tokio::spawn(async move {
            futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
                .for_each_concurrent(SENDERS, |(regarding, event)| {
                    let recorder = recorder.clone();
                    async move {
                        if let Err(e) = recorder.publish(&event, &regarding).await {
                            tracing::debug!(error = %e, reason = %event.reason, "event not published");
                        }
                    }
                })
                .await;
        });
        Self { queue, writer }
    }

    /// Queue an Event; it is written in the background.
    pub fn publish(&self, regarding: &ObjectReference, reason: Reason, note: String) {
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
        match self.queue.try_send((regarding.clone(), event)) {
            Ok(()) => self.writer.counted_event(),
            Err(_) => {
                self.writer.dropped_event();
                tracing::warn!(reason = reason.as_str(), "event queue full; event dropped");
            }
        }
    }
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}
