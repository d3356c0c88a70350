//! The broker's wire types (DESIGN §5): the JIT (`POST /v1/attempts/{namespace}/{name}/jit`)
//! and, since issue 28, the pods of an attempt (`POST /v1/attempts/{namespace}/{name}/pods`,
//! `POST /v1/pods/{namespace}/{name}/removal`): agents hold no pod write right, so they order
//! their attempts' runner and placeholder pods from the operator, which builds them
//! ([`crate::pods`]) for the caller's own node.
//!
//! The JIT response carries the one-shot JIT config in a [`SecretString`]: it is never printed by
//! `Debug`, and it is exposed only where it is written to the restrictive handoff file.

use std::collections::BTreeMap;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize, Serializer};

use crate::attempt::RunnerRegistration;

/// The audience of the bound service-account token an agent presents.
pub const BROKER_AUDIENCE: &str = "runner-manager-broker";

/// The request path of an attempt's JIT.
pub fn jit_path(namespace: &str, name: &str) -> String {
    format!("/v1/attempts/{namespace}/{name}/jit")
}

/// The request path of an attempt's pod orders.
pub fn pods_path(namespace: &str, name: &str) -> String {
    format!("/v1/attempts/{namespace}/{name}/pods")
}

/// The request path of a pod's removal.
pub fn pod_removal_path(namespace: &str, name: &str) -> String {
    format!("/v1/pods/{namespace}/{name}/removal")
}

/// An order for one pod of an attempt, made by the agent of the attempt's node. The operator
/// answers with the pod as the API server stored it (200), the same for an order repeated after
/// a crash (the pod of the derived name, if it is this attempt's), or a [`BrokerError`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodOrder {
    /// The attempt exactly: a name can be reused after deletion; a uid cannot.
    pub attempt_uid: String,
    pub pod: OrderedPod,
}

/// Which pod, with what only the agent knows. Closed: the broker makes no other.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "role",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum OrderedPod {
    /// An OCI attempt's runner ([`crate::pods::runner_pod`]). The broker checks each input
    /// (`operator/src/broker/pods.rs`): none can name a Secret, a node, an image or a label.
    Runner {
        /// The attempt's runtime directory on the host, mounted at the same path.
        host_runtime: String,
        /// The attempt's runner account.
        run_as_user: u32,
        run_as_group: u32,
        /// The listener's environment but for the JIT (plain values, never a reference).
        environment: BTreeMap<String, String>,
        /// How long the entry helper waits for the handoff (seconds).
        await_handoff_seconds: u64,
    },
    /// A native attempt's placeholder ([`crate::pods::placeholder_pod`]): the image and
    /// PriorityClass are the operator's.
    Placeholder,
}

impl OrderedPod {
    pub fn role(&self) -> crate::pods::PodRole {
        match self {
            Self::Runner { .. } => crate::pods::PodRole::Runner,
            Self::Placeholder => crate::pods::PodRole::Placeholder,
        }
    }
}

/// The removal of one pod the broker made: the pod of that name only while it has this uid.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRemoval {
    pub uid: String,
}

/// The request body: which attempt, exactly (a name can be reused after deletion; a uid cannot).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JitRequest {
    pub attempt_uid: String,
    /// The spec hash the agent admitted; the broker refuses a mismatch.
    pub spec_hash: String,
}

/// The answer: the registration (already journalled) and the JIT config.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JitResponse {
    pub runner: RunnerRegistration,
    pub encoded_jit_config: SecretString,
}

impl Serialize for JitResponse {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Serialized exactly once, into the broker's HTTPS response body.
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Wire<'a> {
            runner: &'a RunnerRegistration,
            encoded_jit_config: &'a str,
        }
        Wire {
            runner: &self.runner,
            encoded_jit_config: self.encoded_jit_config.expose_secret(),
        }
        .serialize(s)
    }
}

/// Why the broker refused. Closed, so agents can act on it without parsing text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BrokerErrorCode {
    /// 401: no token, or the TokenReview refused it (wrong audience, expired, unbound).
    Unauthenticated,
    /// 403: the token's pod is not an agent pod on the attempt's node.
    WrongNode,
    /// 403: the pod to remove is not a runner or placeholder pod of a RunnerAttempt on the
    /// caller's node.
    NotYourPod,
    /// 409: a pod of the attempt's pod name exists and is not this attempt's.
    PodConflict,
    /// 422: the order is not one the broker builds a pod from (its inputs, the attempt's mode,
    /// placeholders not configured), or the API server refused the pod (quota, admission).
    PodRefused,
    /// 429: the caller's address sent too many tokens the broker could not prove; nothing was
    /// asked of the API server for this one. Try again later.
    Throttled,
    /// 404: no such attempt (or its uid differs).
    UnknownAttempt,
    /// 409: the attempt is not `Prepared`, its spec hash differs, or a concurrent CAS won.
    NotPrepared,
    /// 410: a JIT was already issued for this attempt; it is lost, conclude `JitExpired`.
    AlreadyIssued,
    /// 502/503: GitHub refused or could not be reached; the attempt stays `Prepared`.
    GitHubUnavailable,
    /// 500: the journal write failed; no JIT left the broker.
    Internal,
    /// 400: the request's body is missing or not the route's shape.
    InvalidRequest,
}

impl BrokerErrorCode {
    pub fn http_status(self) -> u16 {
        match self {
            Self::Unauthenticated => 401,
            Self::WrongNode | Self::NotYourPod => 403,
            Self::PodConflict => 409,
            Self::PodRefused => 422,
            Self::Throttled => 429,
            Self::UnknownAttempt => 404,
            Self::NotPrepared => 409,
            Self::AlreadyIssued => 410,
            Self::GitHubUnavailable => 503,
            Self::Internal => 500,
            Self::InvalidRequest => 400,
        }
    }
}

/// An error body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerError {
    pub code: BrokerErrorCode,
    /// For people; never carries a token or a JIT.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_prints_the_jit() {
        let r = JitResponse {
            runner: RunnerRegistration {
                name: "runner-manager-x".into(),
                id: 7,
            },
            encoded_jit_config: SecretString::from("SUPERSECRETJIT"),
        };
        assert!(!format!("{r:?}").contains("SUPERSECRETJIT"));
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("SUPERSECRETJIT"), "the wire carries it once");
        let back: JitResponse = serde_json::from_str(&json).unwrap();
        assert_eq!(back.encoded_jit_config.expose_secret(), "SUPERSECRETJIT");
        assert_eq!(jit_path("team", "web-abc"), "/v1/attempts/team/web-abc/jit");
        assert_eq!(BrokerErrorCode::AlreadyIssued.http_status(), 410);
    }

    #[test]
    fn a_pod_order_names_its_role_on_the_wire() {
        let placeholder = PodOrder {
            attempt_uid: "u-1".into(),
            pod: OrderedPod::Placeholder,
        };
        assert_eq!(
            serde_json::to_value(&placeholder).unwrap(),
            serde_json::json!({"attemptUid": "u-1", "pod": {"role": "placeholder"}})
        );
        let runner: PodOrder = serde_json::from_value(serde_json::json!({
            "attemptUid": "u-1",
            "pod": {"role": "runner", "hostRuntime": "/r", "runAsUser": 20001,
                    "runAsGroup": 20000, "environment": {"A": "b"}, "awaitHandoffSeconds": 300}
        }))
        .unwrap();
        assert_eq!(runner.pod.role(), crate::pods::PodRole::Runner);
        assert!(
            serde_json::from_value::<PodOrder>(serde_json::json!({
                "attemptUid": "u-1", "pod": {"role": "debug"}
            }))
            .is_err(),
            "no other pod"
        );
        assert_eq!(
            pods_path("team", "web-abc"),
            "/v1/attempts/team/web-abc/pods"
        );
        assert_eq!(pod_removal_path("team", "p"), "/v1/pods/team/p/removal");
    }
}
