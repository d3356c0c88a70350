//! The client for one GitHub target and one set of credentials. Every call goes through
//! [`GitHubClient::call`]: budget admission, authentication, a conditional request where it
//! helps, classification, and retries where a retry is safe. A JIT mint is never resent blindly.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use reqwest::header::{ACCEPT, AUTHORIZATION, ETAG, HeaderMap, IF_NONE_MATCH, USER_AGENT};
use reqwest::{Method, StatusCode};
use runner_manager_crds::target::{GitHubTarget, TargetKind};
use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;

use super::auth::{CachedToken, Credentials, app_jwt, bearer};
use super::endpoint::Endpoint;
use super::errors::{GitHubError, TransportKind, classify};
use super::ratelimit::{Admission, Budgets, Observed, Priority};
use super::recent::Recent;
use super::retry::RetryPolicy;
use super::types::{
    EnterpriseOrgsAnswer, Installation, InstallationTokenWire, JitConfig, JitConfigWire, Job,
    JobPage, Repository, Runner, RunnerDownload, RunnerGroupPage, RunnerPage, WorkflowRun,
    WorkflowRunPage,
};

/// Client settings.
#[derive(Clone, Debug)]
pub struct GitHubConfig {
    /// Overrides the API base derived from the target (tests, a proxy).
    pub api_base: Option<String>,
    pub retry: RetryPolicy,
    /// Per request.
    pub timeout: Duration,
    /// Record every request sent (contract tests).
    pub record: bool,
    /// Where calls and rate limits are counted.
    pub metrics: Option<std::sync::Arc<crate::metrics::Metrics>>,
    /// The most bytes of one response body read; a longer body is refused while it streams.
    pub max_response_bytes: u64,
    /// Hosts the API may be reached on over plain http (`--allow-http-hosts`); https otherwise.
    pub http_hosts: runner_manager_crds::hosts::HostList,
    /// CA certificates trusted beside the system's (`--github-ca-file`): a GitHub Enterprise
    /// Server whose certificate a private CA signed.
    pub extra_roots: Vec<reqwest::Certificate>,
}

/// The default of `--github-max-response-bytes`.
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 8 * 1024 * 1024;

impl Default for GitHubConfig {
    fn default() -> Self {
        Self {
            api_base: None,
            retry: RetryPolicy::default(),
            timeout: Duration::from_secs(30),
            record: false,
            metrics: None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            http_hosts: runner_manager_crds::hosts::HostList::default(),
            extra_roots: Vec::new(),
        }
    }
}

/// One request as sent (for the contract test): no headers, so no credential.
#[derive(Clone, Debug, PartialEq)]
pub struct SentRequest {
    pub endpoint: Endpoint,
    pub method: String,
    pub path: String,
    pub query: Vec<(String, String)>,
    pub body: Option<serde_json::Value>,
}

/// The outcome of deleting a runner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deleted {
    Deleted,
    /// 404: already gone (GitHub removes finished ephemeral runners itself).
    AlreadyGone,
    /// 422: the runner is running a job; not now.
    Busy,
}

#[derive(Clone)]
struct Request {
    endpoint: Endpoint,
    method: Method,
    path: String,
    query: Vec<(String, String)>,
    body: Option<serde_json::Value>,
    priority: Priority,
    conditional: bool,
}

impl Request {
    fn new(endpoint: Endpoint, method: Method, path: String) -> Self {
        Self {
            endpoint,
            method,
            path,
            query: vec![],
            body: None,
            priority: Priority::Observe,
            conditional: false,
        }
    }

    /// `GET` of a repository's Actions resource: `/repos/{owner}/{repo}/actions/{rest}`.
    fn repo_actions(endpoint: Endpoint, owner: &str, repo: &str, rest: &str) -> Self {
        Self::get(endpoint, format!("/repos/{owner}/{repo}/actions/{rest}"))
    }

    fn get(endpoint: Endpoint, path: String) -> Self {
        Self::new(endpoint, Method::GET, path)
    }

    fn query(mut self, name: &str, value: impl ToString) -> Self {
        self.query.push((name.to_owned(), value.to_string()));
        self
    }

    /// `per_page` at its maximum and `page`.
    fn page(self, page: usize) -> Self {
        self.query("per_page", PER_PAGE).query("page", page)
    }

    fn body(mut self, body: serde_json::Value) -> Self {
        self.body = Some(body);
        self
    }

    fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// Sent with `If-None-Match` when an ETag is cached: a 304 answer is served from the cache.
    fn conditional(mut self) -> Self {
        self.conditional = true;
        self
    }
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    /// A page of a paged list with a page after it (its `Link` header has `rel="next"`).
    fn has_next_page(&self) -> bool {
        self.headers
            .get("link")
            .and_then(|l| l.to_str().ok())
            .is_some_and(|l| l.contains("rel=\"next\""))
    }
}

#[derive(Default)]
struct InstallationState {
    id: Option<u64>,
    token: Option<CachedToken>,
}

/// What every client of one credential at one installation shares: one installation token (a
/// thousand policies of one organisation mint one token, not a thousand) and the rate-limit
/// budget GitHub keeps per credential, so their calls are admitted against one count.
pub struct SharedCredential {
    // A tokio mutex: holding it across the token request is the point (one refresh at a time).
    installation: tokio::sync::Mutex<InstallationState>,
    budgets: Mutex<Budgets>,
}

impl SharedCredential {
    pub fn new(credentials: &Credentials) -> Self {
        let id = match credentials {
            Credentials::App {
                installation_id, ..
            } => *installation_id,
            Credentials::Token(_) => None,
        };
        Self {
            installation: tokio::sync::Mutex::new(InstallationState { id, token: None }),
            budgets: Mutex::new(Budgets::default()),
        }
    }
}

impl std::fmt::Debug for SharedCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCredential").finish_non_exhaustive()
    }
}

/// The HTTP client (connection pool, TLS roots) every GitHub client of the process shares:
/// building one per policy cost a TLS root store and a pool each.
pub fn http_client(config: &GitHubConfig) -> Result<reqwest::Client, GitHubError> {
    reqwest::Client::builder()
        .timeout(config.timeout)
        .connect_timeout(Duration::from_secs(10))
        .tls_certs_merge(config.extra_roots.iter().cloned())
        .build()
        .map_err(|_| GitHubError::Transport {
            endpoint: Endpoint::RateLimit,
            kind: TransportKind::Connect,
        })
}

enum Capped {
    TooLarge,
    Transport(reqwest::Error),
}

/// The body, read chunk by chunk and refused as soon as it passes `limit` bytes (a declared
/// Content-Length past it is refused before reading; an undeclared or false one is counted).
async fn read_capped(mut resp: reqwest::Response, limit: u64) -> Result<Bytes, Capped> {
    if resp.content_length().is_some_and(|n| n > limit) {
        return Err(Capped::TooLarge);
    }
    let mut body = bytes::BytesMut::new();
    while let Some(chunk) = resp.chunk().await.map_err(Capped::Transport)? {
        if (body.len() + chunk.len()) as u64 > limit {
            return Err(Capped::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// Pages are asked for 100 at a time, the most GitHub gives.
const PER_PAGE: usize = 100;
/// A runner list is at most this many pages (10,000 runners): a bound, not an expectation.
const MAX_PAGES: usize = 100;

/// The client of one target.
pub struct GitHubClient {
    http: reqwest::Client,
    api_base: String,
    target: GitHubTarget,
    credentials: Credentials,
    /// Budgets are per credential: an App installation, or a token.
    credential_key: String,
    retry: RetryPolicy,
    /// Shared by every client of this credential at this installation.
    shared: Arc<SharedCredential>,
    max_response_bytes: u64,
    /// The API base is plain http to a host not on `--allow-http-hosts`: nothing is sent.
    insecure: bool,
    /// The target's runner list and queued jobs, shared by every policy of the target.
    runners: Recent<Vec<Runner>>,
    queued_jobs: Recent<Vec<Job>>,
    /// The organization or enterprise walk (`walk`), shared by every policy of the target.
    walk: tokio::sync::Mutex<super::walk::Walk>,
    downloads: Recent<Vec<RunnerDownload>>,
    etags: Mutex<HashMap<String, (String, Bytes)>>,
    groups: Mutex<HashMap<String, i64>>,
    counters: Mutex<BTreeMap<(Endpoint, u16), u64>>,
    sent: Option<Arc<Mutex<Vec<SentRequest>>>>,
    metrics: Option<Arc<crate::metrics::Metrics>>,
}

impl std::fmt::Debug for GitHubClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitHubClient")
            .field("api_base", &self.api_base)
            .field("target", &self.target)
            .field("credential", &self.credential_key)
            .finish_non_exhaustive()
    }
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these maps cannot leave it inconsistent in a way that
    // matters (each update is a single insert), so a poisoned lock is used as is.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn header_i64(headers: &HeaderMap, name: &str) -> Option<i64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// Whether what a mint is for still stands, asked between its tries (the broker: the attempt
/// is still issuable, not terminated, not deleted).
pub trait MintDemand: Sync {
    fn still_wanted(&self) -> impl std::future::Future<Output = bool> + Send;
}

/// A mint wanted until it is done (a caller with no attempt behind it).
#[derive(Clone, Copy, Debug)]
pub struct AlwaysWanted;

impl MintDemand for AlwaysWanted {
    async fn still_wanted(&self) -> bool {
        true
    }
}

/// What GitHub asks the client to wait: `retry-after`, or the reset of an empty bucket.
fn asked_wait(headers: &HeaderMap) -> Option<Duration> {
    if let Some(secs) = header_i64(headers, "retry-after") {
        return Some(Duration::from_secs(u64::try_from(secs).unwrap_or(0)));
    }
    if header_i64(headers, "x-ratelimit-remaining") == Some(0) {
        let reset = header_i64(headers, "x-ratelimit-reset")?;
        return Some(Duration::from_secs(
            u64::try_from(reset - now_unix()).unwrap_or(0).max(1),
        ));
    }
    None
}

fn transport(endpoint: Endpoint, e: &reqwest::Error) -> GitHubError {
    let kind = if e.is_timeout() {
        TransportKind::Timeout
    } else if e.is_connect() {
        TransportKind::Connect
    } else {
        TransportKind::Broken
    };
    GitHubError::Transport { endpoint, kind }
}

fn jitter() -> f64 {
    rand::random::<f64>()
}

impl GitHubClient {
    /// A client for `target` with `credentials`.
    /// A client with its own HTTP client and credential state (tests, one-off tools).
    pub fn new(
        target: GitHubTarget,
        credentials: Credentials,
        config: GitHubConfig,
    ) -> Result<Self, GitHubError> {
        let http = http_client(&config)?;
        let shared = Arc::new(SharedCredential::new(&credentials));
        Ok(Self::sharing(target, credentials, config, http, shared))
    }

    /// A client of one target that shares the process's HTTP client and the credential's
    /// token and budget with every other client of that credential.
    pub fn sharing(
        target: GitHubTarget,
        credentials: Credentials,
        config: GitHubConfig,
        http: reqwest::Client,
        shared: Arc<SharedCredential>,
    ) -> Self {
        let api_base = config
            .api_base
            .clone()
            .unwrap_or_else(|| target.api_base())
            .trim_end_matches('/')
            .to_owned();
        let credential_key = match &credentials {
            Credentials::App { app_id, .. } => format!("app-{app_id}"),
            Credentials::Token(t) => format!("token-{}", token_key(t)),
        };
        let insecure =
            runner_manager_crds::hosts::check_scheme(&api_base, &config.http_hosts).is_err();
        Self {
            http,
            api_base,
            target,
            credentials,
            credential_key,
            retry: config.retry,
            shared,
            max_response_bytes: config.max_response_bytes,
            insecure,
            runners: Recent::default(),
            queued_jobs: Recent::default(),
            walk: tokio::sync::Mutex::default(),
            downloads: Recent::default(),
            etags: Mutex::new(HashMap::new()),
            groups: Mutex::new(HashMap::new()),
            counters: Mutex::new(BTreeMap::new()),
            sent: config.record.then(|| Arc::new(Mutex::new(Vec::new()))),
            metrics: config.metrics.clone(),
        }
    }

    pub fn target(&self) -> &GitHubTarget {
        &self.target
    }

    /// Every request sent so far (when recording).
    pub fn sent(&self) -> Vec<SentRequest> {
        self.sent
            .as_ref()
            .map(|s| lock(s).clone())
            .unwrap_or_default()
    }

    /// Calls per (endpoint, status); status 0 for a transport failure.
    pub fn counters(&self) -> BTreeMap<(Endpoint, u16), u64> {
        lock(&self.counters).clone()
    }

    /// What GitHub last said of this credential's buckets: (resource, observed).
    pub fn rate_limits(&self) -> Vec<(String, Observed)> {
        lock(&self.shared.budgets)
            .all()
            .map(|(_, r, o)| (r.to_owned(), o))
            .collect()
    }

    fn count(&self, endpoint: Endpoint, status: u16) {
        *lock(&self.counters).entry((endpoint, status)).or_insert(0) += 1;
        if let Some(m) = &self.metrics {
            m.github_call(endpoint, status);
        }
    }

    /// The installation token (App) or the token (PAT); one refresh at a time.
    async fn token(&self) -> Result<SecretString, GitHubError> {
        if let Credentials::Token(t) = &self.credentials {
            return Ok(t.clone());
        }
        let mut state = self.shared.installation.lock().await;
        if let Some(t) = &state.token
            && t.is_fresh(now_unix())
        {
            return Ok(t.token.clone());
        }
        let id = match state.id {
            Some(id) => id,
            None => {
                let id = self.lookup_installation().await?;
                state.id = Some(id);
                id
            }
        };
        let answer = self
            .send(
                Request::new(
                    Endpoint::CreateInstallationToken,
                    Method::POST,
                    format!("/app/installations/{id}/access_tokens"),
                )
                .priority(Priority::Launch),
            )
            .await?;
        let wire: InstallationTokenWire = parse(Endpoint::CreateInstallationToken, &answer.body)?;
        let expires =
            k8s_openapi::jiff::Timestamp::strptime("%Y-%m-%dT%H:%M:%S%#z", &wire.expires_at)
                .or_else(|_| wire.expires_at.parse::<k8s_openapi::jiff::Timestamp>())
                .map(|t| t.as_second())
                .map_err(|_| GitHubError::Malformed {
                    endpoint: Endpoint::CreateInstallationToken,
                })?;
        let cached = CachedToken::new(wire.token, expires);
        let token = cached.token.clone();
        state.token = Some(cached);
        Ok(token)
    }

    async fn forget_token(&self) {
        self.shared.installation.lock().await.token = None;
    }

    async fn lookup_installation(&self) -> Result<u64, GitHubError> {
        let path = match &self.target.kind {
            TargetKind::Repository { owner, repo } => format!("/repos/{owner}/{repo}/installation"),
            TargetKind::Organization { org } => format!("/orgs/{org}/installation"),
            // GitHub has no installation lookup by enterprise: the Secret must say it.
            TargetKind::Enterprise { .. } => {
                return Err(super::auth::CredentialsError::Missing(
                    super::auth::KEY_INSTALLATION_ID,
                )
                .into());
            }
        };
        let answer = self
            .send(Request::get(Endpoint::GetInstallation, path).priority(Priority::Launch))
            .await?;
        Ok(parse::<Installation>(Endpoint::GetInstallation, &answer.body)?.id)
    }

    async fn authorization(&self, endpoint: Endpoint) -> Result<String, GitHubError> {
        if endpoint.uses_app_jwt() {
            return match &self.credentials {
                Credentials::App { app_id, key, .. } => {
                    Ok(bearer(&app_jwt(*app_id, key, now_unix())?))
                }
                // A token never needs the App endpoints.
                Credentials::Token(t) => Ok(bearer(t)),
            };
        }
        Ok(bearer(&self.token().await?))
    }

    async fn admitted(&self, endpoint: Endpoint, priority: Priority) {
        let resource = resource_of(endpoint);
        loop {
            let admission = lock(&self.shared.budgets).admit(
                &self.credential_key,
                resource,
                priority,
                now_ms(),
            );
            match admission {
                Admission::Go => return,
                Admission::Wait(d) => tokio::time::sleep(d.min(self.retry.max_wait)).await,
            }
        }
    }

    /// One call with retries where they are safe.
    /// `req`'s answer, its body parsed as a `T` (one that is not: `Malformed` for its endpoint).
    async fn call_parsed<T: DeserializeOwned>(&self, req: Request) -> Result<T, GitHubError> {
        let endpoint = req.endpoint;
        let answer = self.call(req).await?;
        parse(endpoint, &answer.body)
    }

    async fn call(&self, req: Request) -> Result<Answer, GitHubError> {
        let mut attempt = 0;
        let mut refreshed = false;
        loop {
            let result = self.send(req.clone()).await;
            let err = match result {
                Ok(a) => return Ok(a),
                Err(e) => e,
            };
            // A 401 on an installation token: it may have been revoked early. Refresh once.
            if err.status() == Some(401)
                && !refreshed
                && !req.endpoint.uses_app_jwt()
                && matches!(self.credentials, Credentials::App { .. })
            {
                refreshed = true;
                self.forget_token().await;
                continue;
            }
            if !err.is_retryable() || !req.endpoint.is_idempotent() {
                return Err(err);
            }
            self.back_off(attempt, err).await?;
            attempt += 1;
        }
    }

    /// Wait before the next attempt after `err` (what GitHub asked for, else exponential with
    /// jitter), or give `err` back when the attempts are spent or the wait is too long.
    async fn back_off(&self, attempt: u32, err: GitHubError) -> Result<(), GitHubError> {
        let asked = match &err {
            GitHubError::Retryable { retry_after, .. } => *retry_after,
            _ => None,
        };
        match self.retry.wait(attempt, asked, jitter()) {
            Some(wait) => {
                tokio::time::sleep(wait).await;
                Ok(())
            }
            None => Err(err),
        }
    }

    /// One HTTP exchange in its span `github.request` (method, route template, endpoint, status,
    /// rate-limit remaining; never the URL, whose path names repositories and ids).
    async fn send(&self, req: Request) -> Result<Answer, GitHubError> {
        use tracing::Instrument;
        let span = tracing::info_span!(
            "github.request",
            otel.kind = "client",
            http.request.method = req.method.as_str(),
            http.route = req.endpoint.route(),
            github.endpoint = req.endpoint.as_str(),
            http.response.status_code = tracing::field::Empty,
            github.ratelimit.remaining = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let result = self.send_unspanned(req).instrument(span.clone()).await;
        // The status and the budget left are recorded as the answer arrives.
        if result.is_err() {
            span.record("otel.status_code", "ERROR");
        }
        result
    }

    /// One HTTP exchange: admission, auth, conditional request, rate-limit bookkeeping,
    /// classification. No retry.
    async fn send_unspanned(&self, req: Request) -> Result<Answer, GitHubError> {
        let endpoint = req.endpoint;
        if self.insecure {
            return Err(GitHubError::InsecureUrl { endpoint });
        }
        self.admitted(endpoint, req.priority).await;
        let auth = Box::pin(self.authorization(endpoint)).await?;
        let url = format!("{}{}", self.api_base, req.path);
        let cache_key = format!("{}?{:?}", req.path, req.query);
        let mut rb = self
            .http
            .request(req.method.clone(), &url)
            .header(AUTHORIZATION, auth)
            .header(ACCEPT, "application/vnd.github+json")
            .header("X-GitHub-Api-Version", "2022-11-28")
            .header(
                USER_AGENT,
                concat!("runner-manager/", env!("CARGO_PKG_VERSION")),
            );
        if !req.query.is_empty() {
            rb = rb.query(&req.query);
        }
        if let Some(body) = &req.body {
            rb = rb.json(body);
        }
        let cached = req
            .conditional
            .then(|| lock(&self.etags).get(&cache_key).cloned())
            .flatten();
        if let Some((etag, _)) = &cached {
            rb = rb.header(IF_NONE_MATCH, etag.as_str());
        }
        if let Some(sent) = &self.sent {
            lock(sent).push(SentRequest {
                endpoint,
                method: req.method.as_str().to_owned(),
                path: req.path.clone(),
                query: req.query.clone(),
                body: req.body.clone(),
            });
        }
        let resp = match rb.send().await {
            Ok(r) => r,
            Err(e) => {
                self.count(endpoint, 0);
                return Err(transport(endpoint, &e));
            }
        };
        let status = resp.status();
        let headers = resp.headers().clone();
        let span = tracing::Span::current();
        span.record("http.response.status_code", status.as_u16());
        if let Some(remaining) = header_i64(&headers, "x-ratelimit-remaining") {
            span.record("github.ratelimit.remaining", remaining);
        }
        self.count(endpoint, status.as_u16());
        self.record_rate_limit(&headers);
        let body = match read_capped(resp, self.max_response_bytes).await {
            Ok(b) => b,
            // A success too long to read took effect: a mint is resolved by name like a lost
            // body; anything else is refused as too large.
            Err(Capped::TooLarge) if status.is_success() && !endpoint.is_idempotent() => {
                tracing::warn!(%endpoint, limit = self.max_response_bytes, "GitHub's answer was too long to read");
                return Err(GitHubError::BodyLost {
                    endpoint,
                    status: status.as_u16(),
                });
            }
            Err(Capped::TooLarge) => {
                return Err(GitHubError::TooLarge {
                    endpoint,
                    status: status.as_u16(),
                    limit: self.max_response_bytes,
                });
            }
            // A success whose body broke took effect: say so, so a mint is resolved by name
            // and never sent again.
            Err(Capped::Transport(_)) if status.is_success() => {
                return Err(GitHubError::BodyLost {
                    endpoint,
                    status: status.as_u16(),
                });
            }
            Err(Capped::Transport(e)) => return Err(transport(endpoint, &e)),
        };
        if status == StatusCode::NOT_MODIFIED
            && let Some((_, cached_body)) = cached
        {
            return Ok(Answer {
                status: StatusCode::OK,
                headers,
                body: cached_body,
            });
        }
        if status.is_success() {
            if req.conditional
                && let Some(etag) = headers.get(ETAG).and_then(|v| v.to_str().ok())
            {
                lock(&self.etags).insert(cache_key, (etag.to_owned(), body.clone()));
            }
            return Ok(Answer {
                status,
                headers,
                body,
            });
        }
        let message = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
            .unwrap_or_default();
        Err(classify(
            endpoint,
            status.as_u16(),
            &message,
            asked_wait(&headers),
        ))
    }

    fn record_rate_limit(&self, headers: &HeaderMap) {
        let (Some(limit), Some(remaining), Some(reset)) = (
            header_i64(headers, "x-ratelimit-limit"),
            header_i64(headers, "x-ratelimit-remaining"),
            header_i64(headers, "x-ratelimit-reset"),
        ) else {
            return;
        };
        let resource = headers
            .get("x-ratelimit-resource")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("core")
            .to_owned();
        if let Some(m) = &self.metrics {
            m.rate_limit(&self.credential_key, &resource, remaining, reset);
        }
        lock(&self.shared.budgets).observe(
            &self.credential_key,
            &resource,
            Observed {
                limit: u32::try_from(limit).unwrap_or(u32::MAX),
                remaining: u32::try_from(remaining).unwrap_or(0),
                reset_unix: reset,
            },
        );
    }

    fn runners_path(&self) -> String {
        self.target.runners_path()
    }

    /// A `method` call on the target's runners' resource `rest` (`/{id}`,
    /// `/generate-jitconfig`, …).
    fn runners_request(&self, endpoint: Endpoint, method: Method, rest: &str) -> Request {
        Request::new(endpoint, method, format!("{}{rest}", self.runners_path()))
    }

    /// Every runner of the target, all pages; conditional per page (a 304 costs no budget).
    pub async fn list_runners(&self) -> Result<Vec<Runner>, GitHubError> {
        let mut all = Vec::new();
        for page in 1..=MAX_PAGES {
            let answer = self
                .call(
                    Request::get(Endpoint::ListRunners, self.runners_path())
                        .page(page)
                        .conditional(),
                )
                .await?;
            let parsed: RunnerPage = parse(Endpoint::ListRunners, &answer.body)?;
            let n = parsed.runners.len();
            all.extend(parsed.runners);
            if !answer.has_next_page() || n == 0 {
                break;
            }
        }
        Ok(all)
    }

    /// The target's runner list, at most `max_age` old: every policy of the target reads the
    /// same answer, and callers arriving while it is fetched wait for it.
    pub async fn recent_runners(&self, max_age: Duration) -> Result<Arc<Vec<Runner>>, GitHubError> {
        self.runners.get(max_age, || self.list_runners()).await
    }

    /// The runner of that exact name, if registered.
    pub async fn find_runner(
        &self,
        name: &str,
        priority: Priority,
    ) -> Result<Option<Runner>, GitHubError> {
        let answer = self
            .call(
                Request::get(Endpoint::ListRunners, self.runners_path())
                    .query("name", name)
                    .priority(priority),
            )
            .await?;
        let page: RunnerPage = parse(Endpoint::ListRunners, &answer.body)?;
        Ok(page.runners.into_iter().find(|r| r.name == name))
    }

    /// Delete a runner registration.
    pub async fn delete_runner(&self, id: i64, priority: Priority) -> Result<Deleted, GitHubError> {
        let request =
            self.runners_request(Endpoint::DeleteRunner, Method::DELETE, &format!("/{id}"));
        let result = self.call(request.priority(priority)).await;
        match result {
            Ok(_) => Ok(Deleted::Deleted),
            Err(e) if e.status() == Some(404) => Ok(Deleted::AlreadyGone),
            Err(e) if e.status() == Some(422) => Ok(Deleted::Busy),
            Err(e) => Err(e),
        }
    }

    /// Mint a JIT config, wanted until it is done (see [`Self::generate_jit_while`]).
    pub async fn generate_jit(
        &self,
        name: &str,
        runner_group_id: i64,
        labels: &[String],
        work_folder: &str,
    ) -> Result<JitConfig, GitHubError> {
        self.generate_jit_while(name, runner_group_id, labels, work_folder, &AlwaysWanted)
            .await
    }

    /// Mint a JIT config. Never resent blindly: after an ambiguous failure (5xx, a broken
    /// connection, a 201 whose body cannot be read) the name is looked up, and a registration
    /// found is deleted — its JIT is lost — before another mint is tried. A 201 whose body was
    /// lost is not minted again at all: the caller gets a retryable error. A terminal failure
    /// (a 403 that is not a rate limit, …) is never tried again.
    ///
    /// Demand-adjacent (parity row 32): between tries `demand` is asked whether the mint is
    /// still wanted, before the backoff and again after it; once it is not, the mint is given up
    /// (`NoLongerWanted`) and no further call is spent on an attempt that was concluded,
    /// terminated or deleted meanwhile.
    pub async fn generate_jit_while(
        &self,
        name: &str,
        runner_group_id: i64,
        labels: &[String],
        work_folder: &str,
        demand: &impl MintDemand,
    ) -> Result<JitConfig, GitHubError> {
        let body = serde_json::json!({
            "name": name,
            "runner_group_id": runner_group_id,
            "labels": labels,
            "work_folder": work_folder,
        });
        let mut attempt = 0;
        loop {
            let request = self
                .runners_request(
                    Endpoint::GenerateJitConfig,
                    Method::POST,
                    "/generate-jitconfig",
                )
                .body(body.clone())
                .priority(Priority::Launch);
            let sent = self.call(request).await;
            let err = match sent {
                Ok(answer) => match serde_json::from_slice::<JitConfigWire>(&answer.body) {
                    Ok(w) => {
                        return Ok(JitConfig {
                            runner: w.runner,
                            encoded_jit_config: w.encoded_jit_config,
                        });
                    }
                    // A body that arrived but cannot be read is a lost JIT all the same.
                    Err(_) => {
                        self.discard_registration(name).await?;
                        return Err(GitHubError::BodyLost {
                            endpoint: Endpoint::GenerateJitConfig,
                            status: answer.status.as_u16(),
                        });
                    }
                },
                Err(e @ GitHubError::BodyLost { .. }) => {
                    // Registered, JIT lost: delete the registration, never mint again here.
                    self.discard_registration(name).await?;
                    return Err(e);
                }
                Err(e) => e,
            };
            if !err.is_retryable() {
                return Err(err);
            }
            // Did the mint register before failing? Its JIT never reached us: delete it.
            self.discard_registration(name).await?;
            let gone = GitHubError::NoLongerWanted {
                endpoint: Endpoint::GenerateJitConfig,
            };
            if !demand.still_wanted().await {
                return Err(gone);
            }
            self.back_off(attempt, err).await?;
            // The wait may have been long (a Retry-After): ask again before the next mint.
            if !demand.still_wanted().await {
                return Err(gone);
            }
            attempt += 1;
        }
    }

    /// Delete the registration of that name, if any (its JIT is lost).
    pub async fn discard_registration(&self, name: &str) -> Result<Option<i64>, GitHubError> {
        match self.find_runner(name, Priority::Launch).await? {
            Some(r) => {
                self.delete_runner(r.id, Priority::Launch).await?;
                Ok(Some(r.id))
            }
            None => Ok(None),
        }
    }

    /// The id of a runner group by name (cached). Repository targets have only `Default` (id 1).
    pub async fn runner_group_id(&self, name: &str) -> Result<i64, GitHubError> {
        if let Some(id) = lock(&self.groups).get(name) {
            return Ok(*id);
        }
        let path = match &self.target.kind {
            TargetKind::Repository { .. } => {
                return if name.eq_ignore_ascii_case("default") {
                    Ok(1)
                } else {
                    Err(GitHubError::Terminal {
                        endpoint: Endpoint::ListRunnerGroups,
                        status: 404,
                        reason: super::errors::Terminal::RunnerGroupUnusable,
                    })
                };
            }
            TargetKind::Organization { org } => format!("/orgs/{org}/actions/runner-groups"),
            TargetKind::Enterprise { enterprise } => {
                format!("/enterprises/{enterprise}/actions/runner-groups")
            }
        };
        for page in 1..=MAX_PAGES {
            let answer = self
                .call(Request::get(Endpoint::ListRunnerGroups, path.clone()).page(page))
                .await?;
            let groups: RunnerGroupPage = parse(Endpoint::ListRunnerGroups, &answer.body)?;
            let n = groups.runner_groups.len();
            let mut cache = lock(&self.groups);
            for g in groups.runner_groups {
                cache.insert(g.name, g.id);
            }
            if let Some(id) = cache.get(name) {
                return Ok(*id);
            }
            if n < PER_PAGE {
                break;
            }
        }
        Err(GitHubError::Terminal {
            endpoint: Endpoint::ListRunnerGroups,
            status: 404,
            reason: super::errors::Terminal::RunnerGroupUnusable,
        })
    }

    /// The runner packages GitHub lists for this target.
    pub async fn runner_downloads(&self) -> Result<Vec<RunnerDownload>, GitHubError> {
        let answer = self
            .call(
                Request::get(
                    Endpoint::ListRunnerDownloads,
                    format!("{}/downloads", self.runners_path()),
                )
                .conditional(),
            )
            .await?;
        parse(Endpoint::ListRunnerDownloads, &answer.body)
    }

    /// The downloads listing, at most `max_age` old (the same for every policy of the target).
    pub async fn recent_downloads(
        &self,
        max_age: Duration,
    ) -> Result<Arc<Vec<RunnerDownload>>, GitHubError> {
        self.downloads
            .get(max_age, || self.runner_downloads())
            .await
    }

    fn repo(&self) -> Option<(&str, &str)> {
        match &self.target.kind {
            TargetKind::Repository { owner, repo } => Some((owner, repo)),
            _ => None,
        }
    }

    /// Queued workflow runs of a repository target (empty for other scopes).
    pub async fn queued_runs(&self) -> Result<Vec<WorkflowRun>, GitHubError> {
        let Some((owner, repo)) = self.repo() else {
            return Ok(vec![]);
        };
        self.queued_runs_in(owner, repo).await
    }

    /// Queued workflow runs of one repository (conditional: an unchanged list is a free 304).
    pub async fn queued_runs_in(
        &self,
        owner: &str,
        repo: &str,
    ) -> Result<Vec<WorkflowRun>, GitHubError> {
        let request = Request::repo_actions(Endpoint::ListQueuedRuns, owner, repo, "runs")
            .query("status", "queued")
            .query("per_page", PER_PAGE)
            .conditional();
        let answer = self.call(request).await?;
        Ok(parse::<WorkflowRunPage>(Endpoint::ListQueuedRuns, &answer.body)?.workflow_runs)
    }

    /// The jobs of a run.
    pub async fn run_jobs(&self, run_id: i64) -> Result<Vec<Job>, GitHubError> {
        let Some((owner, repo)) = self.repo() else {
            return Ok(vec![]);
        };
        self.run_jobs_in(owner, repo, run_id).await
    }

    /// The jobs of a run of one repository.
    pub async fn run_jobs_in(
        &self,
        owner: &str,
        repo: &str,
        run_id: i64,
    ) -> Result<Vec<Job>, GitHubError> {
        let rest = format!("runs/{run_id}/jobs");
        let request = Request::repo_actions(Endpoint::ListRunJobs, owner, repo, &rest)
            .query("per_page", PER_PAGE);
        let answer = self.call(request).await?;
        Ok(parse::<JobPage>(Endpoint::ListRunJobs, &answer.body)?.jobs)
    }

    /// An organization's repositories (`owner/name`), all pages, each conditional; archived
    /// ones (which run nothing) left out.
    pub async fn org_repos(&self, org: &str) -> Result<Vec<String>, GitHubError> {
        let mut all = Vec::new();
        for page in 1..=MAX_PAGES {
            let answer = self
                .call(
                    Request::get(Endpoint::ListOrgRepos, format!("/orgs/{org}/repos"))
                        .page(page)
                        .conditional(),
                )
                .await?;
            let repos: Vec<Repository> = parse(Endpoint::ListOrgRepos, &answer.body)?;
            let n = repos.len();
            all.extend(
                repos
                    .into_iter()
                    .filter(|r| !r.archived)
                    .map(|r| r.full_name),
            );
            if !answer.has_next_page() || n == 0 {
                break;
            }
        }
        Ok(all)
    }

    /// An enterprise's organizations (logins), through GraphQL: REST has no such listing.
    pub async fn enterprise_orgs(&self, enterprise: &str) -> Result<Vec<String>, GitHubError> {
        const QUERY: &str = "query($slug: String!, $first: Int!, $after: String) { enterprise(slug: $slug) { organizations(first: $first, after: $after) { nodes { login } pageInfo { hasNextPage endCursor } } } }";
        let mut all = Vec::new();
        let mut after: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let answer = self
                .call(
                    Request::new(
                        Endpoint::ListEnterpriseOrgs,
                        Method::POST,
                        "/graphql".into(),
                    )
                    .body(serde_json::json!({
                        "query": QUERY,
                        "variables": {"slug": enterprise, "first": PER_PAGE, "after": after},
                    })),
                )
                .await?;
            let page: EnterpriseOrgsAnswer = parse(Endpoint::ListEnterpriseOrgs, &answer.body)?;
            let Some(orgs) = page
                .data
                .and_then(|d| d.enterprise)
                .map(|e| e.organizations)
            else {
                // GraphQL answers 200 with `errors`: no such enterprise, or no access to it.
                return Err(GitHubError::Terminal {
                    endpoint: Endpoint::ListEnterpriseOrgs,
                    status: 200,
                    reason: super::errors::Terminal::NotFound,
                });
            };
            all.extend(orgs.nodes.into_iter().map(|n| n.login));
            if !orgs.page_info.has_next_page {
                break;
            }
            after = orgs.page_info.end_cursor;
        }
        Ok(all)
    }

    /// A runner registration token of the target (the scale-set exchange's first step).
    pub async fn registration_token(&self) -> Result<SecretString, GitHubError> {
        let request = self
            .runners_request(
                Endpoint::CreateRegistrationToken,
                Method::POST,
                "/registration-token",
            )
            .priority(Priority::Launch);
        let answer = self.call(request).await?;
        #[derive(serde::Deserialize)]
        struct Wire {
            token: SecretString,
        }
        Ok(parse::<Wire>(Endpoint::CreateRegistrationToken, &answer.body)?.token)
    }

    /// The process's HTTP client (the scale-set client shares it).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// The REST API base this client speaks to.
    pub fn api_base(&self) -> &str {
        &self.api_base
    }

    /// The target's URL as a person writes it (`https://<host>/<owner>[/<repo>]`).
    pub fn target_url(&self) -> String {
        let path = match &self.target.kind {
            TargetKind::Repository { owner, repo } => format!("{owner}/{repo}"),
            TargetKind::Organization { org } => org.clone(),
            TargetKind::Enterprise { enterprise } => format!("enterprises/{enterprise}"),
        };
        format!("https://{}/{path}", self.target.host)
    }

    /// One step of the organization or enterprise walk (see `walk`): the queued jobs last seen
    /// in every repository of the target, the repositories due now read first.
    pub async fn walk_queued_jobs(
        &self,
        interval: Duration,
        settle: Duration,
    ) -> Result<super::walk::WalkView, GitHubError> {
        super::walk::step(self, &self.walk, interval, settle).await
    }

    /// The repository (`owner`, `repo`) the walk last saw a job in.
    pub async fn walked_repository_of(&self, job: i64) -> Option<(String, String)> {
        let w = self.walk.lock().await;
        let (o, r) = w.repository_of(job)?.split_once('/')?;
        Some((o.to_owned(), r.to_owned()))
    }

    /// The queued jobs of the repository's queued runs, at most `max_age` old (one poll per
    /// repository, however many policies it has). Empty for other scopes. Runs created less than
    /// `settle` ago are skipped: their webhook deliveries are most likely in flight, and a burst
    /// of 50 fresh runs would otherwise cost 50 job listings; a run whose delivery was lost is
    /// read at the first poll after it settles.
    pub async fn recent_queued_jobs(
        &self,
        max_age: Duration,
        settle: Duration,
    ) -> Result<Arc<Vec<Job>>, GitHubError> {
        self.queued_jobs
            .get(max_age, || async {
                let mut queued = Vec::new();
                let now = k8s_openapi::jiff::Timestamp::now();
                for run in self.queued_runs().await? {
                    if run.is_younger_than(now, settle) {
                        continue;
                    }
                    queued.extend(
                        self.run_jobs(run.id)
                            .await?
                            .into_iter()
                            .filter(|j| j.status == "queued"),
                    );
                }
                Ok(queued)
            })
            .await
    }

    /// A run's repository, head repository, event and head branch.
    pub async fn run_origin(
        &self,
        owner: &str,
        repo: &str,
        run_id: i64,
    ) -> Result<super::types::RunOrigin, GitHubError> {
        let rest = format!("runs/{run_id}");
        self.call_parsed(Request::repo_actions(Endpoint::GetRun, owner, repo, &rest))
            .await
    }

    /// One job of a repository (`None` for other scopes).
    pub async fn job(&self, owner: &str, repo: &str, job_id: i64) -> Result<Job, GitHubError> {
        let rest = format!("jobs/{job_id}");
        self.call_parsed(Request::repo_actions(Endpoint::GetJob, owner, repo, &rest))
            .await
    }
}

/// The walk's calls are the client's (the walk sits below the client, which holds its state).
impl super::walk::WalkSource for GitHubClient {
    fn target_kind(&self) -> &runner_manager_crds::target::TargetKind {
        &self.target.kind
    }

    async fn enterprise_orgs(&self, enterprise: &str) -> Result<Vec<String>, GitHubError> {
        GitHubClient::enterprise_orgs(self, enterprise).await
    }

    async fn org_repos(&self, org: &str) -> Result<Vec<String>, GitHubError> {
        GitHubClient::org_repos(self, org).await
    }

    async fn queued_runs_in(
        &self,
        owner: &str,
        repo: &str,
    ) -> Result<Vec<WorkflowRun>, GitHubError> {
        GitHubClient::queued_runs_in(self, owner, repo).await
    }

    async fn run_jobs_in(
        &self,
        owner: &str,
        repo: &str,
        run_id: i64,
    ) -> Result<Vec<Job>, GitHubError> {
        GitHubClient::run_jobs_in(self, owner, repo, run_id).await
    }
}

/// Which rate-limit bucket an endpoint draws from (GitHub's `x-ratelimit-resource`).
fn resource_of(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::GenerateJitConfig | Endpoint::CreateRegistrationToken => {
            "actions_runner_registration"
        }
        Endpoint::ListEnterpriseOrgs => "graphql",
        _ => "core",
    }
}

fn parse<T: DeserializeOwned>(endpoint: Endpoint, body: &[u8]) -> Result<T, GitHubError> {
    serde_json::from_slice(body).map_err(|_| GitHubError::Malformed { endpoint })
}

/// A short, non-reversible name for a token, so budgets are keyed by credential without the
/// token itself ever sitting in a map key or a log field.
fn token_key(token: &SecretString) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(token.expose_secret().as_bytes())[..6])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(created_at: Option<&str>) -> WorkflowRun {
        WorkflowRun {
            id: 1,
            status: Some("queued".into()),
            created_at: created_at.map(str::to_owned),
        }
    }

    #[test]
    fn a_run_is_polled_once_it_has_settled_and_an_unreadable_time_is_polled_at_once() {
        let now: k8s_openapi::jiff::Timestamp = "2026-11-30T17:00:10Z".parse().unwrap();
        let settle = Duration::from_secs(10);
        assert!(run(Some("2026-11-30T17:00:05Z")).is_younger_than(now, settle));
        assert!(!run(Some("2026-11-30T17:00:00Z")).is_younger_than(now, settle));
        assert!(!run(None).is_younger_than(now, settle));
        assert!(!run(Some("yesterday")).is_younger_than(now, settle));
        assert!(!run(Some("2026-11-30T17:00:09Z")).is_younger_than(now, Duration::ZERO));
    }
}
