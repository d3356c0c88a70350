//! Events on attempts, for what a person must see (a blocked recovery, a quarantined slot).
//! Reasons are a closed vocabulary; messages carry ids and kinds, never workflow-chosen names.

use super::log::say;
use k8s_openapi::api::core::v1::{Event, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{Api, ObjectMeta, PostParams};
use runner_manager_crds::attempt::RunnerAttempt;

/// Why an event is emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventReason {
    RecoveryBlocked,
    CleanupDeferred,
    Rejected,
    SpecChanged,
    PackageRefused,
}

impl EventReason {
    fn as_str(self) -> &'static str {
        match self {
            Self::RecoveryBlocked => "RecoveryBlocked",
            Self::CleanupDeferred => "CleanupDeferred",
            Self::Rejected => "Rejected",
            Self::SpecChanged => "SpecChanged",
            Self::PackageRefused => "PackageRefused",
        }
    }
}

/// Emits a Warning event on `attempt`. Best effort: an event that cannot be written is logged.
pub async fn warn(
    kube: &kube::Client,
    node: &str,
    attempt: &RunnerAttempt,
    reason: EventReason,
    message: String,
) {
    let Some(ns) = attempt.metadata.namespace.clone() else {
        return;
    };
    let now = Timestamp::now();
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!(
                "{}-",
                attempt.metadata.name.as_deref().unwrap_or("attempt")
            )),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some(RunnerAttempt::api_version(&()).into_owned()),
            kind: Some(RunnerAttempt::kind(&()).into_owned()),
            name: attempt.metadata.name.clone(),
            namespace: Some(ns.clone()),
            uid: attempt.metadata.uid.clone(),
            ..ObjectReference::default()
        },
        reason: Some(reason.as_str().to_owned()),
        message: Some(message),
        type_: Some("Warning".to_owned()),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        source: Some(k8s_openapi::api::core::v1::EventSource {
            component: Some("runner-manager-node-agent".to_owned()),
            host: Some(node.to_owned()),
        }),
        ..Event::default()
    };
    if let Err(e) = Api::<Event>::namespaced(kube.clone(), &ns)
        .create(&PostParams::default(), &event)
        .await
    {
        say!("event {} not written: {e}", reason.as_str());
    }
}
