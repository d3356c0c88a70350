//! The broker's HTTPS server: `POST /v1/attempts/{namespace}/{name}/jit`, and the pods agents
//! order (`POST /v1/attempts/{namespace}/{name}/pods`, `POST /v1/pods/{namespace}/{name}/removal`;
//! `super::pods`). Stateless apart from the GitHub clients' token caches, so every operator
//! replica serves it.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Path, Request};
use axum::http::{HeaderMap, StatusCode, header::AUTHORIZATION};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use kube::api::Api;
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::broker::{
    BrokerError, BrokerErrorCode, JitRequest, JitResponse, PodOrder, PodRemoval,
};
use runner_manager_crds::job_admission::JobAdmissionRequest;
use runner_manager_crds::pods::PlaceholderSpec;
use secrecy::SecretString;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::authn::{AgentIdentity, Caller, authenticate};
use super::pods::{self, Made};
use super::protocol::issue;
use super::refused;
use crate::github::registry::Clients;

/// What the broker needs to answer.
pub struct Broker {
    pub kube: kube::Client,
    pub agents: AgentIdentity,
    /// Shared with the controllers: one token and budget per installation.
    pub clients: Arc<Clients>,
    /// `rm-<12 hex>`: this cluster's label on every runner it registers.
    pub ownership_label: String,
    pub metrics: Option<Arc<crate::metrics::Metrics>>,
    /// How placeholder pods are made (`--placeholder-image`); `None`: agents get none.
    pub placeholders: Option<PlaceholderSpec>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("agents", &self.agents)
            .field("ownership_label", &self.ownership_label)
            .finish_non_exhaustive()
    }
}

fn answer(e: BrokerError) -> Response {
    let status =
        StatusCode::from_u16(e.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(e)).into_response()
}

fn bearer(headers: &HeaderMap) -> Option<SecretString> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let token = value.strip_prefix("Bearer ")?.trim();
    (!token.is_empty()).then(|| SecretString::from(token.to_owned()))
}

/// An agent's exchange with the broker, as every route reads it, in the order its handlers once
/// took the parts one by one: the [`Call`], then the JSON body (`None` when there is none).
struct Exchange<T>(Call, Option<Json<T>>);

/// Who asks about what: the broker, the connection's peer, the path's namespace and name (an
/// attempt's, or for a removal a pod's), the headers; and when the route began.
struct Call {
    broker: Arc<Broker>,
    peer: SocketAddr,
    namespace: String,
    name: String,
    headers: HeaderMap,
    started: std::time::Instant,
}

impl<T> FromRequest<Arc<Broker>> for Exchange<T>
where
    Option<Json<T>>: FromRequest<Arc<Broker>>,
    <Option<Json<T>> as FromRequest<Arc<Broker>>>::Rejection: IntoResponse,
{
    type Rejection = Response;

    async fn from_request(req: Request, broker: &Arc<Broker>) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = req.into_parts();
        let ConnectInfo(peer) = ConnectInfo::<SocketAddr>::from_request_parts(&mut parts, broker)
            .await
            .map_err(IntoResponse::into_response)?;
        let Path((namespace, name)) =
            Path::<(String, String)>::from_request_parts(&mut parts, broker)
                .await
                .map_err(IntoResponse::into_response)?;
        let headers = parts.headers.clone();
        let body = Option::<Json<T>>::from_request(Request::from_parts(parts, body), broker)
            .await
            .map_err(IntoResponse::into_response)?;
        let call = Call {
            broker: Arc::clone(broker),
            peer,
            namespace,
            name,
            headers,
            started: std::time::Instant::now(),
        };
        Ok(Self(call, body))
    }
}

async fn jit(Exchange(call, body): Exchange<JitRequest>) -> Response {
    let (namespace, name) = (&call.namespace, &call.name);
    // One span per exchange. It is entered only once the attempt is read and the span joined to
    // the attempt's trace (its traceparent annotation), so the mint's GitHub spans sit under it.
    let span = tracing::info_span!(
        "broker.exchange",
        otel.kind = "server",
        attempt.namespace = %namespace,
        attempt.name = %name,
        attempt.uid = tracing::field::Empty,
        outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    let result = handle(&call, body, &span).await;
    let outcome = match &result {
        Ok(_) => "issued",
        Err(e) => error_label(e.code),
    };
    span.record("outcome", outcome);
    if result.is_err() {
        span.record("otel.status_code", "ERROR");
    }
    drop(span);
    call.record(JIT_ROUTE, outcome);
    match result {
        Ok(response) => (StatusCode::OK, Json(response)).into_response(),
        Err(e) => answer(e),
    }
}

/// The attempt a request names, read from the API server (every request reads it fresh: its
/// journal decides).
async fn dereference(
    attempts: &Api<RunnerAttempt>,
    name: &str,
) -> Result<RunnerAttempt, BrokerError> {
    attempts
        .get_opt(name)
        .await
        .map_err(|_| {
            refused(
                BrokerErrorCode::Internal,
                "the API server could not be read",
            )
        })?
        .ok_or_else(|| refused(BrokerErrorCode::UnknownAttempt, "no such attempt"))
}

/// An agent's request about one attempt, before its route's own work: the caller proven, the
/// body present, the attempt read fresh.
struct AttemptRequest<T> {
    caller: Caller,
    body: T,
    attempts: Api<RunnerAttempt>,
    attempt: RunnerAttempt,
}

/// Proves the caller, takes the body (`missing` when there is none) and reads the attempt, in
/// that order: nothing is read for a caller that is not proven.
async fn attempt_request<T>(
    call: &Call,
    body: Option<Json<T>>,
    missing: BrokerError,
) -> Result<AttemptRequest<T>, BrokerError> {
    let caller = call.caller().await?;
    let Json(body) = body.ok_or(missing)?;
    let attempts: Api<RunnerAttempt> = Api::namespaced(call.broker.kube.clone(), &call.namespace);
    let attempt = dereference(&attempts, &call.name).await?;
    Ok(AttemptRequest {
        caller,
        body,
        attempts,
        attempt,
    })
}

impl Call {
    /// The caller, proven (`super::authn`): a live agent pod of the agent DaemonSet, on a node.
    async fn caller(&self) -> Result<Caller, BrokerError> {
        let (broker, peer, namespace, name) =
            (&self.broker, self.peer, &self.namespace, &self.name);
        let token = bearer(&self.headers).ok_or_else(|| {
            refused(
                BrokerErrorCode::Unauthenticated,
                "a bound service-account token is required",
            )
        })?;
        authenticate(&broker.kube, &broker.agents, &token, peer.ip())
            .await
            .map_err(|e| {
                // The precise reason is for the operator's log; the caller gets a closed code.
                tracing::warn!(namespace, name, peer = %peer.ip(), reason = %e, "broker caller refused");
                let code = match e.http_status() {
                    401 => BrokerErrorCode::Unauthenticated,
                    403 => BrokerErrorCode::WrongNode,
                    429 => BrokerErrorCode::Throttled,
                    _ => BrokerErrorCode::Internal,
                };
                refused(code, e.public_message())
            })
    }

    /// Records the exchange's outcome on `route` (metric and log line).
    fn record(&self, route: &'static str, outcome: &'static str) {
        record(
            &self.broker,
            self.started,
            route,
            &self.namespace,
            &self.name,
            outcome,
        );
    }
}

/// The broker's routes, as they reach logs (`http.route`). Closed.
const JIT_ROUTE: &str = "/v1/attempts/{namespace}/{name}/jit";
const POD_ORDER_ROUTE: &str = "/v1/attempts/{namespace}/{name}/pods";
const POD_REMOVAL_ROUTE: &str = "/v1/pods/{namespace}/{name}/removal";
const JOB_ROUTE: &str = "/v1/attempts/{namespace}/{name}/job";

/// Records one exchange's outcome (metric and log line). `name` is the attempt's, or for a
/// removal the pod's (the log's allowed fields: `operator/src/telemetry.rs`).
fn record(
    broker: &Broker,
    started: std::time::Instant,
    route: &'static str,
    namespace: &str,
    name: &str,
    outcome: &'static str,
) {
    let elapsed = started.elapsed();
    if let Some(m) = &broker.metrics {
        m.broker_request(outcome, elapsed.as_secs_f64());
    }
    let elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
    if route == POD_REMOVAL_ROUTE {
        tracing::info!(namespace = %namespace, pod = %name, http.route = route, outcome, elapsed_ms, "broker request");
    } else {
        tracing::info!(namespace = %namespace, attempt = %name, http.route = route, outcome, elapsed_ms, "broker request");
    }
}

/// `POST /v1/attempts/{namespace}/{name}/pods`: an agent orders a pod of its node's attempt.
async fn pod_order(Exchange(call, body): Exchange<PodOrder>) -> Response {
    let missing = refused(
        BrokerErrorCode::PodRefused,
        "a JSON body {attemptUid, pod: {role, ...}} is required",
    );
    let result = async {
        let r = attempt_request(&call, body, missing).await?;
        let broker = &call.broker;
        let placeholders = broker.placeholders.as_ref();
        pods::order(&broker.kube, &r.attempt, &r.caller, &r.body, placeholders).await
    }
    .await;
    let outcome = match &result {
        Ok(Made::Created(_)) => "pod_created",
        Ok(Made::Existing(_)) => "pod_existing",
        Err(e) => error_label(e.code),
    };
    call.record(POD_ORDER_ROUTE, outcome);
    match result {
        Ok(Made::Created(pod)) => (StatusCode::CREATED, Json(pod)).into_response(),
        Ok(Made::Existing(pod)) => (StatusCode::OK, Json(pod)).into_response(),
        Err(e) => answer(e),
    }
}

/// `POST /v1/attempts/{namespace}/{name}/job`: an agent relays its runner's job-started claim
/// (`super::job`). A decision, refused or not, is a 200; an error is a caller the broker
/// will not answer for.
async fn job_admission(Exchange(call, body): Exchange<JobAdmissionRequest>) -> Response {
    let result = async {
        let missing = refused(
            BrokerErrorCode::InvalidRequest,
            "a JSON body {attemptUid, repository, runId} is required",
        );
        let r = attempt_request(&call, body, missing).await?;
        super::confine(&r.attempt, &r.body.attempt_uid, &r.caller)?;
        Ok::<_, BrokerError>(super::job::admit(&call.broker.clients, &r.attempt, &r.body).await)
    }
    .await;
    let outcome = match &result {
        Ok(a) if a.refused.is_none() => "job_admitted",
        Ok(_) => "job_refused",
        Err(e) => error_label(e.code),
    };
    call.record(JOB_ROUTE, outcome);
    match result {
        Ok(answer) => (StatusCode::OK, Json(answer)).into_response(),
        Err(e) => answer(e),
    }
}

/// `POST /v1/pods/{namespace}/{name}/removal`: an agent removes a pod the broker made on its
/// node.
async fn pod_removal(Exchange(call, body): Exchange<PodRemoval>) -> Response {
    let result = async {
        let caller = call.caller().await?;
        let Json(removal) = body
            .ok_or_else(|| refused(BrokerErrorCode::PodRefused, "a JSON body {uid} is required"))?;
        pods::remove(
            &call.broker.kube,
            &call.namespace,
            &call.name,
            &caller,
            &removal,
        )
        .await
    }
    .await;
    let outcome = match &result {
        Ok(()) => "pod_removed",
        Err(e) => error_label(e.code),
    };
    call.record(POD_REMOVAL_ROUTE, outcome);
    match result {
        Ok(()) => (StatusCode::OK, Json(serde_json::json!({}))).into_response(),
        Err(e) => answer(e),
    }
}

async fn handle(
    call: &Call,
    body: Option<Json<JitRequest>>,
    span: &tracing::Span,
) -> Result<JitResponse, BrokerError> {
    use tracing::Instrument;
    let (broker, namespace) = (&call.broker, &call.namespace);
    let missing = refused(
        BrokerErrorCode::NotPrepared,
        "a JSON body {attemptUid, specHash} is required",
    );
    let AttemptRequest {
        caller,
        body: request,
        attempts,
        attempt,
    } = attempt_request(call, body, missing).await?;
    span.record(
        "attempt.uid",
        attempt.metadata.uid.as_deref().unwrap_or_default(),
    );
    crate::telemetry::join(
        span,
        attempt
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::telemetry::TRACEPARENT_ANNOTATION))
            .map(String::as_str),
    );
    let client = broker
        .clients
        .for_policy(namespace, &attempt.spec.policy)
        .await
        .map_err(|e| refused(BrokerErrorCode::GitHubUnavailable, e.to_string()))?;
    if let Some(set_name) = attempt.spec.snapshot.scale_set.clone() {
        // A `ScaleSet` policy's runner: minted with its scale set's JIT endpoint, under the
        // same journal rules (`super::scaleset`).
        let mut labels = attempt.spec.snapshot.labels.clone();
        labels.push(broker.ownership_label.clone());
        let (set, id) = broker
            .clients
            .scale_set(
                &client,
                &set_name,
                attempt.spec.snapshot.runner_group_id,
                &labels,
            )
            .await
            .map_err(|e| refused(BrokerErrorCode::GitHubUnavailable, e.to_string()))?;
        let registrar = super::scaleset::ScaleSetRegistrar {
            rest: client.clone(),
            set,
            id,
        };
        return issue(
            &attempts,
            &registrar,
            &broker.ownership_label,
            attempt,
            &request,
            &caller,
        )
        .await;
    }
    issue(
        &attempts,
        client.as_ref(),
        &broker.ownership_label,
        attempt,
        &request,
        &caller,
    )
    .instrument(span.clone())
    .await
}

fn error_label(code: BrokerErrorCode) -> &'static str {
    match code {
        BrokerErrorCode::Unauthenticated => "unauthenticated",
        BrokerErrorCode::Throttled => "throttled",
        BrokerErrorCode::WrongNode => "wrong_node",
        BrokerErrorCode::NotYourPod => "not_your_pod",
        BrokerErrorCode::PodConflict => "pod_conflict",
        BrokerErrorCode::PodRefused => "pod_refused",
        BrokerErrorCode::UnknownAttempt => "unknown_attempt",
        BrokerErrorCode::NotPrepared => "not_prepared",
        BrokerErrorCode::AlreadyIssued => "already_issued",
        BrokerErrorCode::GitHubUnavailable => "github_unavailable",
        BrokerErrorCode::Internal => "internal",
        BrokerErrorCode::InvalidRequest => "invalid_request",
    }
}

/// The most bytes of a broker request body, read before the caller is authenticated: a JIT
/// request (`{attemptUid, specHash}`) is under 200, a runner pod order carries the listener's
/// environment (at most `pods::ENVIRONMENT_LIMIT`).
pub const BODY_LIMIT: usize = pods::ENVIRONMENT_LIMIT + 4 * 1024;

/// The broker's routes.
pub fn router(broker: Arc<Broker>) -> axum::Router {
    axum::Router::new()
        .route(JIT_ROUTE, post(jit))
        .route(POD_ORDER_ROUTE, post(pod_order))
        .route(POD_REMOVAL_ROUTE, post(pod_removal))
        .route(JOB_ROUTE, post(job_admission))
        .layer(axum::extract::DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(broker)
}

/// Serve HTTPS on `listener` until the task is dropped, within the process's listener limits
/// (`crate::listen`: connection cap, handshake/header/request/idle timeouts, in-flight cap).
/// Each connection is its own task; a failed handshake closes that connection only. Each
/// request carries its connection's peer: the broker compares it with the caller pod's IP.
pub async fn serve(listener: TcpListener, tls: rustls::ServerConfig, app: axum::Router) {
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    crate::listen::serve(
        listener,
        Some(acceptor),
        app,
        crate::listen::Limits::configured(),
    )
    .await;
}

/// Bind and serve; returns the bound address (port 0 picks one) and the server task.
pub async fn start(
    addr: SocketAddr,
    tls: rustls::ServerConfig,
    broker: Arc<Broker>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(serve(listener, tls, router(broker)));
    Ok((bound, task))
}
