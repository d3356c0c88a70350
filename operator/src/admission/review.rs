//! The `admission.k8s.io/v1` AdmissionReview wire shapes the webhook reads and answers (only
//! the fields it uses), and who the request's user is.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Value, json};

/// The extra field a pod-bound service-account token carries: the pod's name.
pub const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
/// The extra field a pod-bound service-account token carries: the pod's uid.
pub const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";
/// The group of cluster administrators (break-glass; the test control plane's admin).
pub const MASTERS_GROUP: &str = "system:masters";

/// `AdmissionReview` as the API server sends it.
#[derive(Debug, Deserialize)]
pub struct AdmissionReview {
    pub request: Option<AdmissionRequest>,
}

/// The request of an `AdmissionReview`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    #[serde(default)]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    pub operation: Operation,
    #[serde(default)]
    pub user_info: UserInfo,
    #[serde(default)]
    pub object: Option<Value>,
    #[serde(default)]
    pub old_object: Option<Value>,
}

/// The operation under review.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

/// The requesting user, as authenticated by the API server.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct UserInfo {
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default)]
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The service accounts the webhook tells apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principals {
    /// `system:serviceaccount:<ns>:<agent sa>`.
    pub agent: String,
    /// `system:serviceaccount:<ns>:<operator sa>`.
    pub operator: String,
}

impl Principals {
    pub fn new(namespace: &str, agent_sa: &str, operator_sa: &str) -> Self {
        Self {
            agent: format!("system:serviceaccount:{namespace}:{agent_sa}"),
            operator: format!("system:serviceaccount:{namespace}:{operator_sa}"),
        }
    }
}

/// Who asks, before the agent's pod is looked up. Pure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requester {
    /// The agent service account with a pod-bound token: the pod's name and uid.
    Agent { pod_name: String, pod_uid: String },
    /// The agent service account with a token not bound to a pod (a legacy Secret token): it
    /// cannot be placed on a node, so it may write nothing the webhook guards.
    UnboundAgent,
    /// The operator's service account.
    Operator,
    /// A member of `system:masters`.
    Admin,
    /// Anyone else (RBAC decides what they may do, except what only the operator may).
    Other,
}

/// Classify the request's user. Pure.
pub fn requester(principals: &Principals, user: &UserInfo) -> Requester {
    let name = user.username.as_deref().unwrap_or_default();
    if name == principals.agent {
        let one = |k: &str| {
            user.extra
                .get(k)
                .and_then(|v| v.first())
                .filter(|v| !v.is_empty())
                .cloned()
        };
        return match (one(POD_NAME_EXTRA), one(POD_UID_EXTRA)) {
            (Some(pod_name), Some(pod_uid)) => Requester::Agent { pod_name, pod_uid },
            _ => Requester::UnboundAgent,
        };
    }
    if name == principals.operator {
        return Requester::Operator;
    }
    if user.groups.iter().any(|g| g == MASTERS_GROUP) {
        return Requester::Admin;
    }
    Requester::Other
}

/// Who asks, with the agent placed on its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Who {
    /// An agent pod; `node` is its pod's `spec.nodeName`, `None` when the pod could not be
    /// proven (gone, replaced, not the agent DaemonSet's, not bound to a node).
    Agent {
        node: Option<String>,
    },
    Operator,
    Admin,
    Other,
}

/// What the webhook answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Deny(String),
}

impl Verdict {
    pub fn deny(why: impl Into<String>) -> Self {
        Self::Deny(why.into())
    }

    pub fn is_allowed(&self) -> bool {
        matches!(self, Self::Allow)
    }
}

/// The `AdmissionReview` answering request `uid`.
pub fn response(uid: &str, verdict: &Verdict) -> Value {
    let body = match verdict {
        Verdict::Allow => json!({"uid": uid, "allowed": true}),
        Verdict::Deny(message) => json!({
            "uid": uid,
            "allowed": false,
            "status": {"code": 403, "reason": "Forbidden", "message": message},
        }),
    };
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": body})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principals() -> Principals {
        Principals::new("rm", "agent", "op")
    }

    fn user(name: &str, groups: &[&str], extra: &[(&str, &str)]) -> UserInfo {
        UserInfo {
            username: Some(name.to_owned()),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            extra: extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), vec![(*v).to_owned()]))
                .collect(),
        }
    }

    #[test]
    fn the_agent_is_known_by_its_service_account_and_pod() {
        let p = principals();
        assert_eq!(
            requester(
                &p,
                &user(
                    "system:serviceaccount:rm:agent",
                    &[],
                    &[(POD_NAME_EXTRA, "agent-x"), (POD_UID_EXTRA, "u1")]
                )
            ),
            Requester::Agent {
                pod_name: "agent-x".into(),
                pod_uid: "u1".into()
            }
        );
        assert_eq!(
            requester(&p, &user("system:serviceaccount:rm:agent", &[], &[])),
            Requester::UnboundAgent
        );
        // Another namespace's account of the same name is someone else.
        assert_eq!(
            requester(
                &p,
                &user(
                    "system:serviceaccount:other:agent",
                    &[],
                    &[(POD_NAME_EXTRA, "agent-x"), (POD_UID_EXTRA, "u1")]
                )
            ),
            Requester::Other
        );
        // A user claiming the agent's account in masters is still the agent (username first).
        assert_eq!(
            requester(
                &p,
                &user("system:serviceaccount:rm:agent", &[MASTERS_GROUP], &[])
            ),
            Requester::UnboundAgent
        );
        assert_eq!(
            requester(&p, &user("system:serviceaccount:rm:op", &[], &[])),
            Requester::Operator
        );
        assert_eq!(
            requester(&p, &user("admin", &[MASTERS_GROUP], &[])),
            Requester::Admin
        );
        assert_eq!(
            requester(&p, &user("alice", &["system:authenticated"], &[])),
            Requester::Other
        );
    }

    #[test]
    fn a_review_is_read_and_answered_in_the_v1_shape() {
        let review: AdmissionReview = serde_json::from_value(json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "abc", "operation": "UPDATE", "subResource": "status",
                "name": "a", "namespace": "team",
                "kind": {"group": "runner-manager.dev", "version": "v1alpha1", "kind": "RunnerAttempt"},
                "userInfo": {"username": "u", "groups": ["g"], "extra": {POD_NAME_EXTRA: ["p"]}},
                "object": {"spec": {}}, "oldObject": {"spec": {}}
            }
        }))
        .unwrap();
        let r = review.request.unwrap();
        assert_eq!(r.operation, Operation::Update);
        assert_eq!(r.sub_resource.as_deref(), Some("status"));
        assert_eq!(r.user_info.extra[POD_NAME_EXTRA], vec!["p".to_owned()]);
        let out = response("abc", &Verdict::deny("no"));
        assert_eq!(out["response"]["uid"], "abc");
        assert_eq!(out["response"]["allowed"], false);
        assert_eq!(out["response"]["status"]["code"], 403);
        assert_eq!(out["response"]["status"]["message"], "no");
        assert_eq!(response("x", &Verdict::Allow)["response"]["allowed"], true);
    }
}
