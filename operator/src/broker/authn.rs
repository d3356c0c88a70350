//! Who is calling: a `TokenReview` of the bound service-account token (audience
//! `runner-manager-broker`), the pod it is bound to, and that pod's node. Only a live agent pod
//! (right service account, agent labels, matching uid, not being deleted) is a caller.

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use runner_manager_crds::broker::BROKER_AUDIENCE;
use secrecy::{ExposeSecret, SecretString};

const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";

/// Who may call: the agents' namespace, service account and pod labels.
#[derive(Clone, Debug)]
pub struct AgentIdentity {
    pub namespace: String,
    pub service_account: String,
    /// Every one of these labels must be on the caller's pod (the DaemonSet's selector).
    pub pod_labels: BTreeMap<String, String>,
}

/// A proven caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub pod_name: String,
    pub pod_uid: String,
    pub node_name: String,
}

/// Why a caller was refused. Closed: the broker maps each to a status, never echoes the token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthnError {
    #[error("no bearer token")]
    NoToken,
    #[error("the token was not accepted for the broker audience")]
    NotAuthenticated,
    #[error("the token is not bound to a pod")]
    NotPodBound,
    #[error("the token belongs to another service account")]
    WrongServiceAccount,
    #[error("the token's pod no longer exists or was replaced")]
    PodGone,
    #[error("the token's pod is not an agent pod")]
    NotAnAgent,
    #[error("the token's pod is not bound to a node")]
    NoNode,
    #[error("the API server could not be asked")]
    Unavailable,
}

impl AuthnError {
    /// 401 for anything about the token, 403 for a valid token of the wrong pod.
    pub fn http_status(self) -> u16 {
        match self {
            Self::NoToken | Self::NotAuthenticated | Self::NotPodBound | Self::PodGone => 401,
            Self::WrongServiceAccount | Self::NotAnAgent | Self::NoNode => 403,
            Self::Unavailable => 503,
        }
    }
}

/// Prove the caller.
pub async fn authenticate(
    client: &kube::Client,
    identity: &AgentIdentity,
    token: &SecretString,
) -> Result<Caller, AuthnError> {
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.expose_secret().to_owned()),
            audiences: Some(vec![BROKER_AUDIENCE.to_owned()]),
        },
        ..TokenReview::default()
    };
    let reviewed = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(|_| AuthnError::Unavailable)?;
    let status = reviewed.status.ok_or(AuthnError::NotAuthenticated)?;
    let audience_ok = status
        .audiences
        .as_ref()
        .is_some_and(|a| a.iter().any(|x| x == BROKER_AUDIENCE));
    if status.authenticated != Some(true) || !audience_ok {
        return Err(AuthnError::NotAuthenticated);
    }
    let user = status.user.ok_or(AuthnError::NotAuthenticated)?;
    let want = format!(
        "system:serviceaccount:{}:{}",
        identity.namespace, identity.service_account
    );
    if user.username.as_deref() != Some(want.as_str()) {
        return Err(AuthnError::WrongServiceAccount);
    }
    let extra = user.extra.unwrap_or_default();
    let one = |k: &str| extra.get(k).and_then(|v| v.first()).cloned();
    let (Some(pod_name), Some(pod_uid)) = (one(POD_NAME_EXTRA), one(POD_UID_EXTRA)) else {
        return Err(AuthnError::NotPodBound);
    };
    let pod = Api::<Pod>::namespaced(client.clone(), &identity.namespace)
        .get_opt(&pod_name)
        .await
        .map_err(|_| AuthnError::Unavailable)?
        .ok_or(AuthnError::PodGone)?;
    if pod.metadata.uid.as_deref() != Some(pod_uid.as_str())
        || pod.metadata.deletion_timestamp.is_some()
    {
        return Err(AuthnError::PodGone);
    }
    let labels = pod.metadata.labels.unwrap_or_default();
    if !identity
        .pod_labels
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
    {
        return Err(AuthnError::NotAnAgent);
    }
    let spec = pod.spec.unwrap_or_default();
    if spec.service_account_name.as_deref() != Some(identity.service_account.as_str()) {
        return Err(AuthnError::WrongServiceAccount);
    }
    let node_name = spec
        .node_name
        .filter(|n| !n.is_empty())
        .ok_or(AuthnError::NoNode)?;
    Ok(Caller {
        pod_name,
        pod_uid,
        node_name,
    })
}
