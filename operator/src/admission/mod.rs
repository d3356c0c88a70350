//! The validating admission webhook (DESIGN §6, issue 13 finding 3), served by every operator
//! replica on a TLS listener of its own (`--admission-addr`, the broker's certificate; the
//! broker CA is the webhook's `caBundle`): `POST /admission/runnerattempts` and
//! `POST /admission/leases`. It confines each node agent to
//! its own node, which RBAC cannot: an agent's request is placed by its token's pod (the
//! `authentication.kubernetes.io/pod-name`/`pod-uid` extra fields of a pod-bound token, as the
//! broker reads them from a TokenReview) and that pod's `spec.nodeName`, looked up once and
//! cached by pod uid. One validator per kind, each a pure function: [`attempts`], [`leases`].
//!
//! Registered with `failurePolicy: Fail` (chart `ValidatingWebhookConfiguration`, its
//! `caBundle` injected by the operator at start, see [`inject_ca_bundle`]).
//!
//! Its own listener because with `failurePolicy: Fail` it is on the path of every attempt and
//! agent Lease write in the cluster (issue 28 item 5): a flood of the broker's port, which every
//! pod can reach where no NetworkPolicy is enforced, must not queue ahead of the API server's
//! calls. On this listener one source address holds at most half the requests in flight
//! ([`LIMITS`]), and what a review makes the operator ask the API server (reading a pod the
//! webhook has not proven) is spent from that address's [`PeerBudget`]: a stream of forged
//! reviews naming made-up agent pods costs the API server a few reads a second, not one each.

pub mod attempts;
pub mod leases;
pub mod review;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, DefaultBodyLimit, State};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Extension, Json};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::Value;

use crate::broker::authn::{AgentIdentity, controlling_daemonset};
use crate::listen::{Limits, PeerBudget};
use review::{AdmissionReview, Principals, Requester, Verdict, Who, requester, response};

/// How long a proven pod's node is trusted. A pod's node never changes and its uid pins it; a
/// deleted pod's bound tokens stop authenticating at the API server, so the entry only ages out.
const POD_TTL: Duration = Duration::from_secs(600);
/// Entries kept at most (the cache is cleared when full).
const POD_CACHE_MAX: usize = 4096;
/// Reads of pods the webhook has not proven one source address may cause: a burst (an agent
/// DaemonSet rolling out on many nodes at once), then a few a second. The API server is one
/// address for all its calls, so the burst is sized for a cluster's agents.
const LOOKUP_BURST: u32 = 256;
const LOOKUP_PER_SECOND: u32 = 20;
/// The largest AdmissionReview read: an object and its old version, each at most etcd's 1.5 MiB.
pub const BODY_LIMIT: usize = 4 * 1024 * 1024;

/// The listener's bounds: twice the broker's in flight (the API server sends one call per
/// write, a burst of attempts is a burst of calls), one address at most half of them.
pub fn limits(base: Limits) -> Limits {
    Limits {
        max_in_flight: 128,
        max_in_flight_per_peer: Some(64),
        ..base
    }
}

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
    /// What each source address may make the webhook read.
    lookups: PeerBudget,
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
            lookups: PeerBudget::new(LOOKUP_BURST, LOOKUP_PER_SECOND),
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
    /// running as the agent service account; `None` otherwise (or when it cannot be read, or
    /// `peer` has spent its budget of reads).
    async fn agent_node(&self, name: &str, uid: &str, peer: IpAddr) -> Option<String> {
        if let Some(node) = self.cached(uid) {
            return Some(node);
        }
        if !self.lookups.try_spend(peer) {
            tracing::debug!(peer = %peer, pod = name, "admission: the caller's pod was not read: its address spent its budget of reads");
            return None;
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
        // A real agent pod: the read was worth it, and a cluster's agents never run the
        // API server's budget down.
        self.lookups.refund(peer);
        Some(node)
    }

    /// Who asks, the agent placed on its node; `peer` is who sent the review.
    pub async fn who(&self, user: &review::UserInfo, peer: IpAddr) -> Who {
        match requester(&self.principals, user) {
            Requester::Agent { pod_name, pod_uid } => Who::Agent {
                node: self.agent_node(&pod_name, &pod_uid, peer).await,
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

async fn review(admission: &Admission, kind: Kind, body: &Value, peer: IpAddr) -> Value {
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
    let who = admission.who(&req.user_info, peer).await;
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

/// One route's reviews: its [`Kind`] is the route's, set on it as an extension.
async fn handler(
    State(admission): State<Arc<Admission>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(kind): Extension<Kind>,
    Json(body): Json<Value>,
) -> impl IntoResponse {
    Json(review(&admission, kind, &body, peer.ip()).await)
}

/// The webhook's routes.
pub fn router(admission: Arc<Admission>) -> axum::Router {
    axum::Router::new()
        .route(
            "/admission/runnerattempts",
            post(handler).layer(Extension(Kind::Attempts)),
        )
        .route(
            "/admission/leases",
            post(handler).layer(Extension(Kind::Leases)),
        )
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(admission)
}

/// Bind `addr` and serve the webhook over `tls` within [`limits`]; returns the bound address
/// (port 0 picks one) and the server task.
pub async fn start(
    addr: SocketAddr,
    tls: rustls::ServerConfig,
    admission: Arc<Admission>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let task = tokio::spawn(crate::listen::serve(
        listener,
        Some(acceptor),
        router(admission),
        limits(Limits::configured()),
    ));
    Ok((bound, task))
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
