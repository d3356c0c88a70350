//! The validating admission webhook (DESIGN §6, issue 13 finding 3), served by every operator
//! replica on the broker's TLS listener (the broker CA is the webhook's `caBundle`):
//! `POST /admission/runnerattempts` and `POST /admission/leases`. It confines each node agent to
//! its own node, which RBAC cannot: an agent's request is placed by its token's pod (the
//! `authentication.kubernetes.io/pod-name`/`pod-uid` extra fields of a pod-bound token, as the
//! broker reads them from a TokenReview) and that pod's `spec.nodeName`, looked up once and
//! cached by pod uid. One validator per kind, each a pure function: [`attempts`], [`leases`].
//!
//! Registered with `failurePolicy: Fail` (chart `ValidatingWebhookConfiguration`, its
//! `caBundle` injected by the operator at start, see [`inject_ca_bundle`]).

pub mod attempts;
pub mod leases;
pub mod review;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::post;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::Value;

use crate::broker::authn::{AgentIdentity, controlling_daemonset};
use review::{AdmissionReview, Principals, Requester, Verdict, Who, requester, response};

/// How long a proven pod's node is trusted. A pod's node never changes and its uid pins it; a
/// deleted pod's bound tokens stop authenticating at the API server, so the entry only ages out.
const POD_TTL: Duration = Duration::from_secs(600);
/// Entries kept at most (the cache is cleared when full).
const POD_CACHE_MAX: usize = 4096;

/// What the webhook needs.
pub struct Admission {
    pub kube: kube::Client,
    /// The operator's namespace (agent pods, agent Leases, the leader Lease).
    pub namespace: String,
    pub principals: Principals,
    /// The agent pods' identity (service account, DaemonSet by uid), as the broker checks it.
    pub agents: AgentIdentity,
    /// pod uid → (node, when proven).
    pods: Mutex<HashMap<String, (String, Instant)>>,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("namespace", &self.namespace)
            .field("principals", &self.principals)
            .finish_non_exhaustive()
    }
}

impl Admission {
    pub fn new(
        kube: kube::Client,
        namespace: String,
        principals: Principals,
        agents: AgentIdentity,
    ) -> Self {
        Self {
            kube,
            namespace,
            principals,
            agents,
            pods: Mutex::new(HashMap::new()),
        }
    }

    fn cached(&self, uid: &str) -> Option<String> {
        let pods = self.pods.lock().ok()?;
        pods.get(uid)
            .filter(|(_, at)| at.elapsed() < POD_TTL)
            .map(|(node, _)| node.clone())
    }

    fn remember(&self, uid: &str, node: &str) {
        if let Ok(mut pods) = self.pods.lock() {
            if pods.len() >= POD_CACHE_MAX {
                pods.clear();
            }
            pods.insert(uid.to_owned(), (node.to_owned(), Instant::now()));
        }
    }

    /// The node of the agent pod `name`/`uid`, if it is a live pod of the agent DaemonSet
    /// running as the agent service account; `None` otherwise (or when it cannot be read).
    async fn agent_node(&self, name: &str, uid: &str) -> Option<String> {
        if let Some(node) = self.cached(uid) {
            return Some(node);
        }
        let pod = Api::<Pod>::namespaced(self.kube.clone(), &self.namespace)
            .get_opt(name)
            .await
            .map_err(|e| tracing::warn!(pod = name, error = %e, "admission: the caller's pod could not be read"))
            .ok()??;
        if pod.metadata.uid.as_deref() != Some(uid) || pod.metadata.deletion_timestamp.is_some() {
            return None;
        }
        let spec = pod.spec.as_ref()?;
        if spec.service_account_name.as_deref() != Some(self.agents.service_account.as_str()) {
            return None;
        }
        let owner = controlling_daemonset(&pod)?;
        let agent_ds = self.agents.daemonset_uid(&self.kube, owner).await.ok()?;
        if agent_ds.as_deref() != Some(owner) {
            tracing::warn!(
                pod = name,
                owner,
                "admission: the caller's pod is not the agent DaemonSet's"
            );
            return None;
        }
        let node = spec.node_name.clone().filter(|n| !n.is_empty())?;
        self.remember(uid, &node);
        Some(node)
    }

    /// Who asks, the agent placed on its node.
    pub async fn who(&self, user: &review::UserInfo) -> Who {
        match requester(&self.principals, user) {
            Requester::Agent { pod_name, pod_uid } => Who::Agent {
                node: self.agent_node(&pod_name, &pod_uid).await,
            },
            Requester::UnboundAgent => Who::Agent { node: None },
            Requester::Operator => Who::Operator,
            Requester::Admin => Who::Admin,
            Requester::Other => Who::Other,
        }
    }
}

/// Which validator.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Attempts,
    Leases,
}

async fn review(admission: &Admission, kind: Kind, body: &Value) -> Value {
    let Ok(review) = serde_json::from_value::<AdmissionReview>(body.clone()) else {
        let uid = body
            .pointer("/request/uid")
            .and_then(Value::as_str)
            .unwrap_or_default();
        return response(uid, &Verdict::deny("unreadable AdmissionReview"));
    };
    let Some(req) = review.request else {
        return response("", &Verdict::deny("an AdmissionReview without a request"));
    };
    let who = admission.who(&req.user_info).await;
    let verdict = match kind {
        Kind::Attempts => attempts::decide(
            &who,
            req.operation,
            req.sub_resource.as_deref(),
            req.old_object.as_ref(),
            req.object.as_ref(),
        ),
        Kind::Leases => leases::decide(
            &who,
            req.operation,
            &admission.namespace,
            req.namespace.as_deref(),
            req.name.as_deref(),
            req.object.as_ref(),
        ),
    };
    if let Verdict::Deny(why) = &verdict {
        tracing::warn!(
            kind = ?kind,
            namespace = req.namespace.as_deref().unwrap_or_default(),
            name = req.name.as_deref().unwrap_or_default(),
            user = req.user_info.username.as_deref().unwrap_or_default(),
            caller = ?who,
            reason = %why,
            "admission refused"
        );
    }
    response(&req.uid, &verdict)
}

async fn attempts_handler(
    State(admission): State<Arc<Admission>>,
    Json(body): Json<Value>,
) -> impl IntoResponse {
    Json(review(&admission, Kind::Attempts, &body).await)
}

async fn leases_handler(
    State(admission): State<Arc<Admission>>,
    Json(body): Json<Value>,
) -> impl IntoResponse {
    Json(review(&admission, Kind::Leases, &body).await)
}

/// The webhook's routes, merged into the broker's router.
pub fn router(admission: Arc<Admission>) -> axum::Router {
    axum::Router::new()
        .route("/admission/runnerattempts", post(attempts_handler))
        .route("/admission/leases", post(leases_handler))
        .with_state(admission)
}

/// Put `ca_pem` as the `caBundle` of every webhook of the ValidatingWebhookConfiguration `name`
/// (the chart's, which cannot know the CA the operator made). A missing configuration is
/// logged, not fatal: a cluster may run without the webhook.
pub async fn inject_ca_bundle(
    kube: &kube::Client,
    name: &str,
    ca_pem: &str,
) -> Result<bool, kube::Error> {
    let api = Api::<ValidatingWebhookConfiguration>::all(kube.clone());
    for _ in 0..5 {
        let Some(mut config) = api.get_opt(name).await? else {
            tracing::warn!(
                configuration = name,
                "ValidatingWebhookConfiguration not found; agents are not confined to their nodes"
            );
            return Ok(false);
        };
        let want = ByteString(ca_pem.as_bytes().to_vec());
        let hooks = config.webhooks.get_or_insert_with(Vec::new);
        if hooks
            .iter()
            .all(|h| h.client_config.ca_bundle.as_ref() == Some(&want))
        {
            return Ok(true);
        }
        for hook in hooks.iter_mut() {
            hook.client_config.ca_bundle = Some(want.clone());
        }
        match api.replace(name, &PostParams::default(), &config).await {
            Ok(_) => {
                tracing::info!(
                    configuration = name,
                    "admission webhook caBundle set to the broker CA"
                );
                return Ok(true);
            }
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}
