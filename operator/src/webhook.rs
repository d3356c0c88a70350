//! The `workflow_job` webhook receiver (DESIGN §7, §4 rule 12), served on every replica at
//! `POST /webhook` (the cluster-wide secret, shared by every team that uses it) and at
//! `POST /webhook/{namespace}/{policy}` (that policy's own secret, `spec.webhook.secretRef`).
//!
//! Order of checks, each answering before anything changes: the body size (413), the HMAC-SHA256
//! signature over the raw body in constant time with the route's secret (401 — checked before
//! anything else is read, so an unauthenticated caller learns nothing and cannot fill the
//! de-duplication memory), the event type (400 but for `ping`, which GitHub sends when a hook is
//! created and which answers 200 so the hook does not show as failing), the delivery GUID and
//! the payload (400). Then a delivery already handed on is acknowledged without being handed on
//! again — by its GUID, and by its repository, job and action, because the GUID is a header the
//! signature does not cover and a captured delivery replays with a fresh one (issue 13,
//! finding 5). A new one is handed to the [`JobSink`] with the route it came through; the sink
//! refuses a delivery whose job belongs to a policy that route's secret does not vouch for (403),
//! so one team's secret cannot move another team's demand. Whatever is refused or fails (503) is
//! forgotten, so the genuine delivery or a redelivery is still taken.
//!
//! Nothing a workflow controls (labels, repository, runner name) is logged; logs and metrics
//! carry the closed [`WebhookOutcome`] only.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use hmac::{Hmac, KeyInit, Mac};
use runner_manager_crds::names::attempt_of_runner_name;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use sha2::Sha256;

use crate::metrics::Metrics;

/// GitHub caps webhook payloads at 25 MB, but a `workflow_job` payload is 7-14 KiB (GitHub's
/// examples in e2e/testdata/github; ~150 bytes more per step): at most this much is read before
/// the signature is checked (`--webhook-max-body-bytes`).
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;
/// Recent delivery GUIDs remembered for de-duplication. GitHub's duplicates and manual
/// redeliveries come within minutes; this covers thousands of deliveries.
pub const DEFAULT_DEDUP_CAPACITY: usize = 4096;
/// A GUID is 36 characters; anything far longer is not one.
const MAX_DELIVERY_ID_LEN: usize = 100;

/// The `action` of a `workflow_job` delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobAction {
    /// Queued: a pending job.
    Queued,
    /// Waiting for an environment's approval: not yet runnable.
    Waiting,
    /// A runner took it (`runner_name` says which).
    InProgress,
    /// Done, whatever the conclusion.
    Completed,
}

impl JobAction {
    pub const ALL: [Self; 4] = [
        Self::Queued,
        Self::Waiting,
        Self::InProgress,
        Self::Completed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Waiting => "waiting",
            Self::InProgress => "in_progress",
            Self::Completed => "completed",
        }
    }
}

/// A policy by namespace and name: the one whose ledger took a job.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PolicyKey {
    pub namespace: String,
    pub name: String,
}

/// How a job ended (`workflow_job.conclusion` of its `completed` delivery): GitHub's seven
/// conclusions, `none` before completion (or when GitHub sends none), `other` for a word GitHub
/// adds later. Closed: it labels the job metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JobResult {
    Success,
    Failure,
    Cancelled,
    Skipped,
    TimedOut,
    ActionRequired,
    Neutral,
    None,
    Other,
}

impl JobResult {
    pub const ALL: [Self; 9] = [
        Self::Success,
        Self::Failure,
        Self::Cancelled,
        Self::Skipped,
        Self::TimedOut,
        Self::ActionRequired,
        Self::Neutral,
        Self::None,
        Self::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Failure => "failure",
            Self::Cancelled => "cancelled",
            Self::Skipped => "skipped",
            Self::TimedOut => "timed_out",
            Self::ActionRequired => "action_required",
            Self::Neutral => "neutral",
            Self::None => "none",
            Self::Other => "other",
        }
    }

    /// From a delivery's action and conclusion: only a `completed` job has a result.
    pub fn of(action: JobAction, conclusion: Option<&str>) -> Self {
        match (action, conclusion) {
            (JobAction::Completed, Some(c)) => Self::ALL
                .into_iter()
                .find(|r| r.as_str() == c && !matches!(r, Self::None | Self::Other))
                .unwrap_or(Self::Other),
            _ => Self::None,
        }
    }
}

/// Which hook a delivery came through, and so whose secret signed it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum HookRoute {
    /// `POST /webhook`: the cluster-wide secret. It may change only policies that set no
    /// `spec.webhook` of their own.
    Cluster,
    /// `POST /webhook/{namespace}/{name}`: that policy's own secret. It may change only the
    /// policies of that namespace naming the same Secret.
    Policy { namespace: String, name: String },
}

/// One `workflow_job` delivery, as the controller needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobEvent {
    /// `X-GitHub-Delivery`.
    pub delivery: String,
    /// The hook the delivery came through.
    pub route: HookRoute,
    /// The GitHub host of the repository (from `repository.html_url`), lowercase.
    pub host: String,
    pub action: JobAction,
    pub job_id: u64,
    pub run_id: u64,
    /// The job's `runs-on` labels. Workflow-controlled: never logged.
    pub labels: Vec<String>,
    /// The runner that took the job (`in_progress`, `completed`). Workflow-visible: never logged.
    pub runner_name: Option<String>,
    /// `owner/repo`.
    pub repository: String,
    /// The enterprise slug, when the delivery names one.
    pub enterprise: Option<String>,
    /// How the job ended (`completed` deliveries; `None` otherwise).
    pub result: JobResult,
}

impl JobEvent {
    /// The attempt whose runner took the job, if its name is one of ours in form.
    pub fn attempt(&self) -> Option<uuid::Uuid> {
        self.runner_name.as_deref().and_then(attempt_of_runner_name)
    }
}

/// Why a sink could not record an event.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// The store behind the sink (the API server) could not take it now.
    #[error("the job ledger is unavailable")]
    Unavailable,
    /// The job belongs to a policy the delivery's route does not vouch for: a secret of one
    /// team signing for another team's repository.
    #[error("the delivery's job belongs to a policy this hook's secret does not cover")]
    ForeignPolicy,
}

/// Where accepted events go. The policy controller implements it by recording the job in the
/// matching policy's `status.pendingJobs` (and `in_progress` in the attempt's `status.job`).
pub trait JobSink: Send + Sync + 'static {
    /// `Ok(Some(policy))`: the policy whose ledger took the job; `Ok(None)`: no policy's
    /// labels match it (the delivery is accepted and nothing is recorded).
    fn record(
        &self,
        event: JobEvent,
    ) -> impl Future<Output = Result<Option<PolicyKey>, SinkError>> + Send;

    /// The secret of policy `namespace/name`'s own hook: `None` when there is no such policy or
    /// it sets no `spec.webhook` (its route then verifies nothing). A sink without policies has
    /// no per-policy routes.
    fn policy_secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<SecretString>, SinkError>> + Send {
        let _ = (namespace, name);
        async { Ok(None) }
    }
}

/// An in-memory sink: the events in arrival order. For tests, and a receiver without a cluster.
#[derive(Debug, Default)]
pub struct MemorySink {
    events: Mutex<Vec<JobEvent>>,
}

impl MemorySink {
    pub fn events(&self) -> Vec<JobEvent> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }
}

impl JobSink for MemorySink {
    async fn record(&self, event: JobEvent) -> Result<Option<PolicyKey>, SinkError> {
        self.events
            .lock()
            .map_err(|_| SinkError::Unavailable)?
            .push(event);
        Ok(None)
    }
}

/// What became of a delivery: closed, for logs and the deliveries metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WebhookOutcome {
    Accepted,
    Duplicate,
    Ping,
    TooLarge,
    BadSignature,
    WrongEvent,
    Malformed,
    ForeignPolicy,
    SinkFailed,
}

impl WebhookOutcome {
    pub const ALL: [Self; 9] = [
        Self::Accepted,
        Self::Duplicate,
        Self::Ping,
        Self::TooLarge,
        Self::BadSignature,
        Self::WrongEvent,
        Self::Malformed,
        Self::ForeignPolicy,
        Self::SinkFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Duplicate => "duplicate",
            Self::Ping => "ping",
            Self::TooLarge => "too_large",
            Self::BadSignature => "bad_signature",
            Self::WrongEvent => "wrong_event",
            Self::Malformed => "malformed",
            Self::ForeignPolicy => "foreign_policy",
            Self::SinkFailed => "sink_failed",
        }
    }

    pub fn status(self) -> StatusCode {
        match self {
            Self::Accepted => StatusCode::ACCEPTED,
            Self::Duplicate | Self::Ping => StatusCode::OK,
            Self::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BadSignature => StatusCode::UNAUTHORIZED,
            Self::WrongEvent | Self::Malformed => StatusCode::BAD_REQUEST,
            Self::ForeignPolicy => StatusCode::FORBIDDEN,
            Self::SinkFailed => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The response body: fixed text, never an echo of the request.
    fn body(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Duplicate => "duplicate delivery",
            Self::Ping => "pong",
            Self::TooLarge => "payload too large",
            Self::BadSignature => "bad or missing X-Hub-Signature-256",
            Self::WrongEvent => "only workflow_job events are accepted",
            Self::Malformed => "malformed workflow_job delivery",
            Self::ForeignPolicy => "this hook's secret does not cover the job's policy",
            Self::SinkFailed => "try again later",
        }
    }
}

/// The receiver's configuration.
#[derive(Clone, Debug)]
pub struct WebhookConfig {
    /// The hook's secret, as configured on GitHub.
    pub secret: SecretString,
    pub body_limit: usize,
    pub dedup_capacity: usize,
}

impl WebhookConfig {
    /// `secret` is the cluster-wide one (`POST /webhook`); policies' own secrets come from the
    /// sink.
    pub fn new(secret: SecretString) -> Self {
        Self {
            secret,
            body_limit: DEFAULT_BODY_LIMIT,
            dedup_capacity: DEFAULT_DEDUP_CAPACITY,
        }
    }
}

/// Why a receiver cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WebhookConfigError {
    #[error("the webhook secret is empty: anyone could sign deliveries; set the hook's secret")]
    EmptySecret,
}

/// The last `capacity` delivery keys, oldest forgotten first: GUIDs, and the
/// `host/repository#job:action` of each delivery (what a replay with a fresh GUID repeats).
#[derive(Debug)]
struct RecentDeliveries {
    capacity: usize,
    order: VecDeque<String>,
    seen: HashSet<String>,
}

/// The replay key of a delivery: what it is about, not how it was sent. The repository is part
/// of it so that a team signing for its own repository cannot pre-empt another repository's
/// job ids (one key per job and action is exactly what GitHub sends).
fn job_key(event: &JobEvent) -> String {
    format!(
        "job:{}/{}#{}:{}",
        event.host,
        event.repository.to_ascii_lowercase(),
        event.job_id,
        event.action.as_str()
    )
}

impl RecentDeliveries {
    fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            order: VecDeque::new(),
            seen: HashSet::new(),
        }
    }

    /// Remember `guid`; false if it was already remembered.
    fn insert(&mut self, guid: &str) -> bool {
        if self.seen.contains(guid) {
            return false;
        }
        if self.order.len() == self.capacity
            && let Some(old) = self.order.pop_front()
        {
            self.seen.remove(&old);
        }
        self.order.push_back(guid.to_owned());
        self.seen.insert(guid.to_owned());
        true
    }

    fn contains(&self, key: &str) -> bool {
        self.seen.contains(key)
    }

    fn forget(&mut self, guid: &str) {
        if self.seen.remove(guid) {
            self.order.retain(|g| g != guid);
        }
    }
}

/// Hook routes whose memories are kept at once besides the cluster's: one per policy with a
/// hook of its own that has signed a delivery. Past it the policies' memories are forgotten
/// (never the cluster route's), which only a team recreating thousands of policies can cause,
/// and which then costs that team's and others' replay memory, not the cluster hook's.
const MAX_ROUTES: usize = 4096;

/// The receiver: its secret, its memory of recent deliveries and where events go.
///
/// The memory is kept per hook route (issue 28 item 6): a team that can sign deliveries for its
/// own policy's hook can push only its own route's memory out with fresh GUIDs, never the
/// cluster hook's or another team's, so a delivery captured on another route cannot be replayed
/// after a flush.
pub struct WebhookReceiver<S> {
    secret: SecretString,
    body_limit: usize,
    capacity: usize,
    recent: Mutex<HashMap<HookRoute, RecentDeliveries>>,
    sink: Arc<S>,
    metrics: Option<Arc<Metrics>>,
}

impl<S> std::fmt::Debug for WebhookReceiver<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookReceiver")
            .field("body_limit", &self.body_limit)
            .finish_non_exhaustive()
    }
}

impl<S: JobSink> WebhookReceiver<S> {
    pub fn new(
        config: WebhookConfig,
        sink: Arc<S>,
        metrics: Option<Arc<Metrics>>,
    ) -> Result<Self, WebhookConfigError> {
        if config.secret.expose_secret().is_empty() {
            return Err(WebhookConfigError::EmptySecret);
        }
        Ok(Self {
            secret: config.secret,
            body_limit: config.body_limit,
            capacity: config.dedup_capacity,
            recent: Mutex::new(HashMap::new()),
            sink,
            metrics,
        })
    }

    /// Judge one delivery to `POST /webhook` and hand it on if it is new and well-formed.
    pub async fn receive(&self, headers: &HeaderMap, body: &[u8]) -> WebhookOutcome {
        self.receive_on(&HookRoute::Cluster, headers, body).await
    }

    /// Judge one delivery that came through `route`.
    pub async fn receive_on(
        &self,
        route: &HookRoute,
        headers: &HeaderMap,
        body: &[u8],
    ) -> WebhookOutcome {
        use tracing::Instrument;
        // The origin of the trace of the runner this delivery's job gets (see
        // `telemetry::origin`): the ledger write runs in it and remembers its context.
        let span = tracing::info_span!(
            "webhook.delivery",
            otel.kind = "server",
            outcome = tracing::field::Empty,
        );
        let outcome = self
            .judge(route, headers, body)
            .instrument(span.clone())
            .await;
        span.record("outcome", outcome.as_str());
        if let Some(m) = &self.metrics {
            m.webhook_delivery(outcome.as_str());
        }
        match outcome {
            WebhookOutcome::BadSignature
            | WebhookOutcome::SinkFailed
            | WebhookOutcome::ForeignPolicy => {
                tracing::warn!(outcome = outcome.as_str(), "webhook delivery refused");
            }
            _ => tracing::debug!(outcome = outcome.as_str(), "webhook delivery"),
        }
        outcome
    }

    async fn judge(&self, route: &HookRoute, headers: &HeaderMap, body: &[u8]) -> WebhookOutcome {
        if body.len() > self.body_limit {
            return WebhookOutcome::TooLarge;
        }
        let signature = headers
            .get("x-hub-signature-256")
            .and_then(|v| v.to_str().ok());
        let policy_secret;
        let secret = match route {
            HookRoute::Cluster => &self.secret,
            HookRoute::Policy { namespace, name } => {
                policy_secret = match self.sink.policy_secret(namespace, name).await {
                    Ok(Some(s)) => s,
                    // No such policy, or it has no hook of its own: nothing can sign for it.
                    Ok(None) => return WebhookOutcome::BadSignature,
                    Err(_) => return WebhookOutcome::SinkFailed,
                };
                &policy_secret
            }
        };
        if !signature.is_some_and(|s| verify_signature(secret, body, s)) {
            return WebhookOutcome::BadSignature;
        }
        match headers.get("x-github-event").and_then(|v| v.to_str().ok()) {
            Some("workflow_job") => {}
            Some("ping") => return WebhookOutcome::Ping,
            _ => return WebhookOutcome::WrongEvent,
        }
        let Some(delivery) = headers
            .get("x-github-delivery")
            .and_then(|v| v.to_str().ok())
            .filter(|g| is_delivery_id(g))
        else {
            return WebhookOutcome::Malformed;
        };
        let Ok(mut event) = parse(delivery, body) else {
            return WebhookOutcome::Malformed;
        };
        event.route = route.clone();
        let job = job_key(&event);
        if !self.remember(route, delivery, &job) {
            return WebhookOutcome::Duplicate;
        }
        let (action, result) = (event.action, event.result);
        match self.sink.record(event).await {
            Ok(policy) => {
                if let Some(m) = &self.metrics {
                    let (startup, execution) = job_durations(action, body);
                    m.job(
                        policy
                            .as_ref()
                            .map(|p| (p.namespace.as_str(), p.name.as_str())),
                        action.as_str(),
                        result.as_str(),
                        startup,
                        execution,
                    );
                }
                WebhookOutcome::Accepted
            }
            Err(e) => {
                // Not handed on: the genuine delivery (refused here) or a redelivery (the sink
                // failed) must still be taken.
                if let Some(recent) = self.recent().get_mut(route) {
                    recent.forget(delivery);
                    recent.forget(&job);
                }
                match e {
                    SinkError::Unavailable => WebhookOutcome::SinkFailed,
                    SinkError::ForeignPolicy => WebhookOutcome::ForeignPolicy,
                }
            }
        }
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, HashMap<HookRoute, RecentDeliveries>> {
        // A poisoned lock only means another request panicked mid-insert; the set is still a
        // valid memory, so keep using it.
        self.recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Remember the delivery's GUID and job key in `route`'s memory; false (and nothing
    /// remembered) when either is already known there.
    fn remember(&self, route: &HookRoute, guid: &str, job: &str) -> bool {
        let mut routes = self.recent();
        if !routes.contains_key(route) && routes.len() > MAX_ROUTES {
            routes.retain(|r, _| *r == HookRoute::Cluster);
        }
        let recent = routes
            .entry(route.clone())
            .or_insert_with(|| RecentDeliveries::new(self.capacity));
        if recent.contains(guid) || recent.contains(job) {
            return false;
        }
        recent.insert(guid);
        recent.insert(job);
        true
    }
}

fn is_delivery_id(g: &str) -> bool {
    !g.is_empty()
        && g.len() <= MAX_DELIVERY_ID_LEN
        && g.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// `sha256=<hex>` checked against the HMAC-SHA256 of `body` under `secret`, in constant time.
pub fn verify_signature(secret: &SecretString, body: &[u8], header: &str) -> bool {
    let Some(sig) = header
        .strip_prefix("sha256=")
        .and_then(|h| hex::decode(h).ok())
    else {
        return false;
    };
    let Ok(mut mac) = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.expose_secret().as_bytes())
    else {
        return false;
    };
    mac.update(body);
    mac.verify_slice(&sig).is_ok()
}

/// `sha256=<hex HMAC-SHA256 of body>`: what GitHub sends (for tests and tools).
pub fn sign(secret: &SecretString, body: &[u8]) -> String {
    match <Hmac<Sha256> as KeyInit>::new_from_slice(secret.expose_secret().as_bytes()) {
        Ok(mut mac) => {
            mac.update(body);
            format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
        }
        // HMAC takes keys of any length.
        Err(_) => String::new(),
    }
}

#[derive(Deserialize)]
struct Payload {
    action: JobAction,
    workflow_job: WorkflowJob,
    repository: Repository,
    #[serde(default)]
    enterprise: Option<Enterprise>,
}

#[derive(Deserialize)]
struct WorkflowJob {
    id: u64,
    run_id: u64,
    labels: Vec<String>,
    #[serde(default)]
    runner_name: Option<String>,
    #[serde(default)]
    conclusion: Option<String>,
}

#[derive(Deserialize)]
struct Repository {
    full_name: String,
    html_url: String,
}

/// The host (with its port, lowercase) of `https://HOST/owner/repo`.
fn host_of(html_url: &str) -> Option<String> {
    let rest = html_url.strip_prefix("https://")?;
    let host = rest.split('/').next()?;
    (!host.is_empty() && !host.contains('@')).then(|| host.to_ascii_lowercase())
}

#[derive(Deserialize)]
struct Enterprise {
    #[serde(default)]
    slug: Option<String>,
}

#[derive(Deserialize)]
struct TimedPayload {
    workflow_job: JobTimes,
}

#[derive(Deserialize)]
struct JobTimes {
    #[serde(default)]
    created_at: Option<String>,
    #[serde(default)]
    started_at: Option<String>,
    #[serde(default)]
    completed_at: Option<String>,
}

/// The job's startup (queued → taken, on `in_progress`) and execution (taken → done, on
/// `completed`) in seconds, from the payload's timestamps. Pure.
pub fn job_durations(action: JobAction, body: &[u8]) -> (Option<f64>, Option<f64>) {
    use k8s_openapi::jiff::Timestamp;
    let Ok(p) = serde_json::from_slice::<TimedPayload>(body) else {
        return (None, None);
    };
    let at = |s: &Option<String>| s.as_deref().and_then(|s| s.parse::<Timestamp>().ok());
    let between = |a: Option<Timestamp>, b: Option<Timestamp>| {
        let (a, b) = (a?, b?);
        let ms = b.as_millisecond() - a.as_millisecond();
        #[allow(clippy::cast_precision_loss)]
        (ms >= 0).then(|| ms as f64 / 1000.0)
    };
    let j = &p.workflow_job;
    match action {
        JobAction::InProgress => (between(at(&j.created_at), at(&j.started_at)), None),
        JobAction::Completed => (None, between(at(&j.started_at), at(&j.completed_at))),
        JobAction::Queued | JobAction::Waiting => (None, None),
    }
}

/// Why a body is not a `workflow_job` payload. The serde message is dropped: it may quote the
/// body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a workflow_job payload")]
pub struct Malformed;

/// Parse a `workflow_job` payload.
pub fn parse(delivery: &str, body: &[u8]) -> Result<JobEvent, Malformed> {
    let p: Payload = serde_json::from_slice(body).map_err(|_| Malformed)?;
    if !p.repository.full_name.contains('/') {
        return Err(Malformed);
    }
    let host = host_of(&p.repository.html_url).ok_or(Malformed)?;
    Ok(JobEvent {
        delivery: delivery.to_owned(),
        route: HookRoute::Cluster,
        host,
        action: p.action,
        job_id: p.workflow_job.id,
        run_id: p.workflow_job.run_id,
        labels: p.workflow_job.labels,
        runner_name: p.workflow_job.runner_name.filter(|n| !n.is_empty()),
        repository: p.repository.full_name,
        enterprise: p.enterprise.and_then(|e| e.slug),
        result: JobResult::of(p.action, p.workflow_job.conclusion.as_deref()),
    })
}

async fn handle<S: JobSink>(
    State(receiver): State<Arc<WebhookReceiver<S>>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> (StatusCode, &'static str) {
    respond(&receiver, &HookRoute::Cluster, &headers, body).await
}

async fn handle_policy<S: JobSink>(
    State(receiver): State<Arc<WebhookReceiver<S>>>,
    Path((namespace, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> (StatusCode, &'static str) {
    let route = HookRoute::Policy { namespace, name };
    respond(&receiver, &route, &headers, body).await
}

async fn respond<S: JobSink>(
    receiver: &WebhookReceiver<S>,
    route: &HookRoute,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> (StatusCode, &'static str) {
    let outcome = match body {
        Ok(body) => receiver.receive_on(route, headers, &body).await,
        Err(rejection) => {
            let outcome = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                WebhookOutcome::TooLarge
            } else {
                WebhookOutcome::Malformed
            };
            if let Some(m) = &receiver.metrics {
                m.webhook_delivery(outcome.as_str());
            }
            outcome
        }
    };
    (outcome.status(), outcome.body())
}

/// `POST /webhook` and `POST /webhook/{namespace}/{policy}`, with the body limit applied before
/// anything is buffered past it.
pub fn router<S: JobSink>(receiver: Arc<WebhookReceiver<S>>) -> Router {
    let limit = receiver.body_limit;
    Router::new()
        .route("/webhook", post(handle::<S>))
        .route("/webhook/{namespace}/{policy}", post(handle_policy::<S>))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(receiver)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const SECRET: &str = "It's a Secret to Everybody";

    fn examples() -> Vec<serde_json::Value> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../e2e/testdata/github/webhook-examples-workflow_job.json"
        );
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("{path}: {e} (GitHub's examples, e2e/testdata/github)"));
        serde_json::from_str(&text).unwrap()
    }

    /// The body of GitHub's example delivery of a queued job (`examples()[5]`), `change`d.
    fn example_with(change: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
        let mut e = examples().remove(5);
        change(&mut e);
        serde_json::to_vec(&e).unwrap()
    }

    fn secret() -> SecretString {
        SecretString::from(SECRET)
    }

    fn receiver() -> (WebhookReceiver<MemorySink>, Arc<MemorySink>) {
        let sink = Arc::new(MemorySink::default());
        let r = WebhookReceiver::new(WebhookConfig::new(secret()), sink.clone(), None).unwrap();
        (r, sink)
    }

    fn headers(event: &str, guid: &str, signature: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-github-event", HeaderValue::from_str(event).unwrap());
        h.insert("x-github-delivery", HeaderValue::from_str(guid).unwrap());
        if let Some(s) = signature {
            h.insert("x-hub-signature-256", HeaderValue::from_str(s).unwrap());
        }
        h
    }

    fn signed(guid: &str, body: &[u8]) -> HeaderMap {
        headers("workflow_job", guid, Some(&sign(&secret(), body)))
    }

    #[test]
    fn githubs_documented_signature_verifies() {
        // GitHub's documentation example ("Validating webhook deliveries").
        let s = secret();
        let want = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert_eq!(sign(&s, b"Hello, World!"), want);
        assert!(verify_signature(&s, b"Hello, World!", want));
        assert!(verify_signature(
            &s,
            b"Hello, World!",
            &want.to_uppercase().replace("SHA256", "sha256")
        ));
        assert!(!verify_signature(&s, b"Hello, World?", want));
        assert!(!verify_signature(&s, b"Hello, World!", &want[7..]));
        assert!(!verify_signature(&s, b"Hello, World!", "sha256=zz"));
        assert!(!verify_signature(
            &SecretString::from("other"),
            b"Hello, World!",
            want
        ));
    }

    #[test]
    fn every_example_payload_parses() {
        let all = examples();
        assert_eq!(all.len(), 8);
        for (i, ex) in all.iter().enumerate() {
            let body = serde_json::to_vec(ex).unwrap();
            let e = parse("guid", &body).unwrap_or_else(|_| panic!("example {i}"));
            assert_eq!(
                e.action.as_str(),
                ex["action"].as_str().unwrap(),
                "example {i}"
            );
            assert_eq!(e.job_id, ex["workflow_job"]["id"].as_u64().unwrap());
            assert_eq!(e.run_id, ex["workflow_job"]["run_id"].as_u64().unwrap());
            assert!(!e.labels.is_empty());
            assert!(e.repository.contains('/'));
        }
        let first = parse("g", &serde_json::to_vec(&all[0]).unwrap()).unwrap();
        assert_eq!(first.action, JobAction::InProgress);
        assert_eq!(first.labels, ["gpu", "db-app", "dc-03"]);
        assert_eq!(first.runner_name.as_deref(), Some("my runner"));
        assert_eq!(first.repository, "octo-org/example-workflow");
        assert_eq!(first.attempt(), None);
        let waiting = parse("g", &serde_json::to_vec(&all[7]).unwrap()).unwrap();
        assert_eq!(waiting.action, JobAction::Waiting);
        assert_eq!(waiting.runner_name, None);
    }

    #[test]
    fn runner_names_of_ours_name_the_attempt() {
        let mut ex = examples().remove(0);
        let id = uuid::Uuid::from_u128(7);
        ex["workflow_job"]["runner_name"] = runner_manager_crds::names::runner_name(id).into();
        let e = parse("g", &serde_json::to_vec(&ex).unwrap()).unwrap();
        assert_eq!(e.attempt(), Some(id));
    }

    #[tokio::test]
    async fn signed_examples_are_accepted_and_handed_on() {
        let (r, sink) = receiver();
        for (i, ex) in examples().iter().enumerate() {
            let body = serde_json::to_vec(ex).unwrap();
            let guid = format!("00000000-0000-0000-0000-{i:012}");
            // Examples 1 and 2 are two `completed` deliveries of one job: the second is what a
            // replay with a fresh GUID looks like, and is not handed on.
            let want = if i == 2 {
                WebhookOutcome::Duplicate
            } else {
                WebhookOutcome::Accepted
            };
            assert_eq!(r.receive(&signed(&guid, &body), &body).await, want, "{i}");
        }
        let got = sink.events();
        assert_eq!(got.len(), 7);
        assert_eq!(got[4].action, JobAction::Queued);
        assert_eq!(got[4].job_id, 289_782_451);
        assert_eq!(got[4].host, "github.com");
        assert_eq!(got[4].route, HookRoute::Cluster);
    }

    #[tokio::test]
    async fn a_replay_with_a_fresh_guid_is_not_handed_on() {
        let (r, sink) = receiver();
        let body = serde_json::to_vec(&examples()[5]).unwrap();
        assert_eq!(
            r.receive(&signed("replay-1", &body), &body).await,
            WebhookOutcome::Accepted
        );
        // The signature covers the body only: the captured signature still verifies.
        assert_eq!(
            r.receive(&signed("replay-2-fresh", &body), &body).await,
            WebhookOutcome::Duplicate
        );
        // Another action of the same job is news.
        let taken = example_with(|e| e["action"] = "in_progress".into());
        assert_eq!(
            r.receive(&signed("replay-3", &taken), &taken).await,
            WebhookOutcome::Accepted
        );
        assert_eq!(sink.events().len(), 2);
    }

    /// A sink with one policy hook (`team/web`, secret `team-secret`) that vouches only for
    /// repository `Codertocat/Hello-World` on that route.
    #[derive(Debug, Default)]
    struct Scoped {
        inner: MemorySink,
    }

    impl JobSink for Scoped {
        async fn record(&self, event: JobEvent) -> Result<Option<PolicyKey>, SinkError> {
            let ours = match &event.route {
                HookRoute::Policy { namespace, .. } => {
                    namespace == "team" && event.repository == "Codertocat/Hello-World"
                }
                HookRoute::Cluster => false,
            };
            if !ours {
                return Err(SinkError::ForeignPolicy);
            }
            self.inner.record(event).await
        }

        async fn policy_secret(
            &self,
            namespace: &str,
            name: &str,
        ) -> Result<Option<SecretString>, SinkError> {
            Ok((namespace == "team" && name == "web").then(|| SecretString::from("team-secret")))
        }
    }

    #[tokio::test]
    async fn a_policy_route_takes_only_its_own_secret_and_its_own_policies() {
        let sink = Arc::new(Scoped::default());
        let r = WebhookReceiver::new(WebhookConfig::new(secret()), sink.clone(), None).unwrap();
        let team = HookRoute::Policy {
            namespace: "team".into(),
            name: "web".into(),
        };
        let body = serde_json::to_vec(&examples()[5]).unwrap();
        let with = |key: &str, guid: &str| {
            headers(
                "workflow_job",
                guid,
                Some(&sign(&SecretString::from(key), &body)),
            )
        };
        // The cluster secret does not sign for a policy route, nor for an unknown policy.
        assert_eq!(
            r.receive_on(&team, &with(SECRET, "p-1"), &body).await,
            WebhookOutcome::BadSignature
        );
        let unknown = HookRoute::Policy {
            namespace: "team".into(),
            name: "nope".into(),
        };
        assert_eq!(
            r.receive_on(&unknown, &with("team-secret", "p-2"), &body)
                .await,
            WebhookOutcome::BadSignature
        );
        // Signed right but about a policy the route does not cover: refused, and forgotten, so
        // the genuine delivery of that job is still taken.
        let foreign = example_with(|e| e["repository"]["full_name"] = "victim/repo".into());
        let h = headers(
            "workflow_job",
            "p-3",
            Some(&sign(&SecretString::from("team-secret"), &foreign)),
        );
        assert_eq!(
            r.receive_on(&team, &h, &foreign).await,
            WebhookOutcome::ForeignPolicy
        );
        assert_eq!(
            WebhookOutcome::ForeignPolicy.status(),
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            r.receive_on(&team, &with("team-secret", "p-4"), &body)
                .await,
            WebhookOutcome::Accepted
        );
        let got = sink.inner.events();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].route, team);
    }

    #[tokio::test]
    async fn bad_or_missing_signature_is_401_and_nothing_changes() {
        let (r, sink) = receiver();
        let body = serde_json::to_vec(&examples()[5]).unwrap();
        let wrong = sign(&SecretString::from("wrong"), &body);
        let cases = [
            headers("workflow_job", "a-1", None),
            headers("workflow_job", "a-1", Some(&wrong)),
            headers("workflow_job", "a-1", Some("sha1=abcdef")),
            headers("workflow_job", "a-1", Some("")),
        ];
        for h in &cases {
            assert_eq!(r.receive(h, &body).await, WebhookOutcome::BadSignature);
        }
        // A signature over another body does not carry over.
        let h = signed("a-1", b"{}");
        assert_eq!(r.receive(&h, &body).await, WebhookOutcome::BadSignature);
        assert!(sink.events().is_empty());
        // The refused GUID was not remembered: the genuine delivery is taken.
        assert_eq!(
            r.receive(&signed("a-1", &body), &body).await,
            WebhookOutcome::Accepted
        );
        assert_eq!(
            WebhookOutcome::BadSignature.status(),
            StatusCode::UNAUTHORIZED
        );
    }

    #[tokio::test]
    async fn duplicate_delivery_is_acknowledged_but_not_handed_on_twice() {
        let (r, sink) = receiver();
        let body = serde_json::to_vec(&examples()[5]).unwrap();
        let h = signed("dup-1", &body);
        assert_eq!(r.receive(&h, &body).await, WebhookOutcome::Accepted);
        assert_eq!(r.receive(&h, &body).await, WebhookOutcome::Duplicate);
        assert!(WebhookOutcome::Duplicate.status().is_success());
        assert_eq!(sink.events().len(), 1);
    }

    #[tokio::test]
    async fn malformed_or_other_events_are_400_and_nothing_changes() {
        let (r, sink) = receiver();
        let garbage = b"{not json";
        assert_eq!(
            r.receive(&signed("m-1", garbage), garbage).await,
            WebhookOutcome::Malformed
        );
        let wrong_shape = br#"{"action":"queued","workflow_job":{"id":"x"}}"#;
        assert_eq!(
            r.receive(&signed("m-2", wrong_shape), wrong_shape).await,
            WebhookOutcome::Malformed
        );
        let unknown = example_with(|e| e["action"] = "exploded".into());
        assert_eq!(
            r.receive(&signed("m-3", &unknown), &unknown).await,
            WebhookOutcome::Malformed
        );
        let body = serde_json::to_vec(&examples()[5]).unwrap();
        let push = headers("push", "m-4", Some(&sign(&secret(), &body)));
        assert_eq!(r.receive(&push, &body).await, WebhookOutcome::WrongEvent);
        let mut no_event = signed("m-5", &body);
        no_event.remove("x-github-event");
        assert_eq!(
            r.receive(&no_event, &body).await,
            WebhookOutcome::WrongEvent
        );
        let mut no_guid = signed("m-6", &body);
        no_guid.remove("x-github-delivery");
        assert_eq!(r.receive(&no_guid, &body).await, WebhookOutcome::Malformed);
        let bad_guid = signed("not a guid; really", &body);
        assert_eq!(r.receive(&bad_guid, &body).await, WebhookOutcome::Malformed);
        let ping = headers("ping", "p-1", Some(&sign(&secret(), b"{}")));
        assert_eq!(r.receive(&ping, b"{}").await, WebhookOutcome::Ping);
        assert!(sink.events().is_empty());
        // A malformed delivery's GUID was not remembered either.
        assert_eq!(
            r.receive(&signed("m-1", &body), &body).await,
            WebhookOutcome::Accepted
        );
    }

    #[tokio::test]
    async fn a_failing_sink_answers_503_and_the_redelivery_is_taken() {
        #[derive(Debug, Default)]
        struct Flaky {
            fail: std::sync::atomic::AtomicBool,
            inner: MemorySink,
        }
        impl JobSink for Flaky {
            async fn record(&self, event: JobEvent) -> Result<Option<PolicyKey>, SinkError> {
                if self.fail.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    return Err(SinkError::Unavailable);
                }
                self.inner.record(event).await
            }
        }
        let sink = Arc::new(Flaky::default());
        sink.fail.store(true, std::sync::atomic::Ordering::SeqCst);
        let r = WebhookReceiver::new(WebhookConfig::new(secret()), sink.clone(), None).unwrap();
        let body = serde_json::to_vec(&examples()[5]).unwrap();
        let h = signed("s-1", &body);
        assert_eq!(r.receive(&h, &body).await, WebhookOutcome::SinkFailed);
        assert_eq!(r.receive(&h, &body).await, WebhookOutcome::Accepted);
        assert_eq!(sink.inner.events().len(), 1);
    }

    /// A team signing for its own hook floods its route's memory with fresh GUIDs: a delivery
    /// already taken on the cluster route is still a duplicate there.
    #[tokio::test]
    async fn a_team_cannot_flush_the_cluster_hooks_replay_memory() {
        /// The cluster route's jobs and the team's own, both taken.
        #[derive(Debug, Default)]
        struct Both(MemorySink);
        impl JobSink for Both {
            async fn record(&self, event: JobEvent) -> Result<Option<PolicyKey>, SinkError> {
                self.0.record(event).await
            }
            async fn policy_secret(
                &self,
                namespace: &str,
                name: &str,
            ) -> Result<Option<SecretString>, SinkError> {
                Ok((namespace == "team" && name == "web")
                    .then(|| SecretString::from("team-secret")))
            }
        }
        let sink = Arc::new(Both::default());
        let mut config = WebhookConfig::new(secret());
        config.dedup_capacity = 4;
        let r = WebhookReceiver::new(config, sink.clone(), None).unwrap();
        let body = serde_json::to_vec(&examples()[5]).unwrap();
        assert_eq!(
            r.receive(&signed("cluster-1", &body), &body).await,
            WebhookOutcome::Accepted
        );
        let team = HookRoute::Policy {
            namespace: "team".into(),
            name: "web".into(),
        };
        for i in 0..32 {
            let b = example_with(|e| e["workflow_job"]["id"] = (1_000_000 + i).into());
            let sig = sign(&SecretString::from("team-secret"), &b);
            let h = headers("workflow_job", &format!("flood-{i}"), Some(&sig));
            assert_eq!(r.receive_on(&team, &h, &b).await, WebhookOutcome::Accepted);
        }
        assert_eq!(
            r.receive(&signed("cluster-replay", &body), &body).await,
            WebhookOutcome::Duplicate,
            "the team's flood pushed the cluster route's memory out"
        );
    }

    #[test]
    fn recent_deliveries_are_bounded() {
        let mut r = RecentDeliveries::new(2);
        assert!(r.insert("a"));
        assert!(r.insert("b"));
        assert!(!r.insert("a"));
        assert!(r.insert("c"));
        assert!(r.insert("a"), "a was the oldest and was forgotten");
        assert_eq!(r.order.len(), 2);
        assert_eq!(r.seen.len(), 2);
    }

    #[test]
    fn an_empty_secret_is_refused() {
        let sink = Arc::new(MemorySink::default());
        let e = WebhookReceiver::new(WebhookConfig::new(SecretString::from("")), sink, None);
        assert_eq!(e.err(), Some(WebhookConfigError::EmptySecret));
    }

    #[tokio::test]
    async fn served_router_enforces_the_body_limit_and_the_signature() {
        crate::run::install_crypto_provider();
        let sink = Arc::new(MemorySink::default());
        let metrics = Metrics::new();
        let config = WebhookConfig {
            body_limit: 64 * 1024,
            ..WebhookConfig::new(secret())
        };
        let r =
            Arc::new(WebhookReceiver::new(config, sink.clone(), Some(metrics.clone())).unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/webhook", listener.local_addr().unwrap());
        let server = tokio::spawn(async move { axum::serve(listener, router(r)).await });
        let http = reqwest::Client::new();
        let post = |body: Vec<u8>, guid: &str, sig: Option<String>| {
            let mut req = http
                .post(&url)
                .header("x-github-event", "workflow_job")
                .header("x-github-delivery", guid)
                .body(body);
            if let Some(s) = sig {
                req = req.header("x-hub-signature-256", s);
            }
            req.send()
        };
        let body = serde_json::to_vec(&examples()[5]).unwrap();
        let ok = post(body.clone(), "r-1", Some(sign(&secret(), &body)))
            .await
            .unwrap();
        assert_eq!(ok.status(), StatusCode::ACCEPTED);
        let unsigned = post(body.clone(), "r-2", None).await.unwrap();
        assert_eq!(unsigned.status(), StatusCode::UNAUTHORIZED);
        let big = vec![b' '; 64 * 1024 + 1];
        let sig = sign(&secret(), &big);
        let too_large = post(big, "r-3", Some(sig)).await.unwrap();
        assert_eq!(too_large.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let garbage = b"garbage".to_vec();
        let sig = sign(&secret(), &garbage);
        let bad = post(garbage, "r-4", Some(sig)).await.unwrap();
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
        assert_eq!(sink.events().len(), 1);
        let text = metrics.encode();
        for outcome in ["accepted", "bad_signature", "too_large", "malformed"] {
            assert!(
                text.contains(&format!(
                    "runner_manager_webhook_deliveries_total{{outcome=\"{outcome}\"}} 1"
                )),
                "{outcome}: {text}"
            );
        }
        server.abort();
    }
}

#[cfg(test)]
mod duration_tests {
    use super::{JobAction, job_durations};

    #[test]
    fn startup_and_execution_come_from_the_payload_timestamps() {
        let body = br#"{"workflow_job": {"created_at": "2024-05-01T10:00:00Z",
            "started_at": "2024-05-01T10:00:42Z", "completed_at": "2024-05-01T10:02:12Z"}}"#;
        assert_eq!(
            job_durations(JobAction::InProgress, body),
            (Some(42.0), None)
        );
        assert_eq!(
            job_durations(JobAction::Completed, body),
            (None, Some(90.0))
        );
        assert_eq!(job_durations(JobAction::Queued, body), (None, None));
        let backwards = br#"{"workflow_job": {"created_at": "2024-05-01T10:00:42Z",
            "started_at": "2024-05-01T10:00:00Z"}}"#;
        assert_eq!(
            job_durations(JobAction::InProgress, backwards),
            (None, None)
        );
        assert_eq!(job_durations(JobAction::Completed, b"{}"), (None, None));
    }
}
