//! GitHub's runner scale-set protocol, as actions-runner-controller's listener speaks it
//! (`github/actions/client.go` in its repository; the API is not in GitHub's public OpenAPI
//! description): demand with no inbound connection, only outbound HTTPS.
//!
//! 1. A registration token of the target (REST), exchanged at `POST /actions/runner-registration`
//!    (`RemoteAuth <token>`, `{"url", "runner_event": "register"}`) for the Actions service URL
//!    and an admin token; exchanged again when the admin token is refused (401) or old.
//! 2. The policy's scale set, found by runner group and name or created with its labels.
//! 3. One message session per scale set (`POST …/runnerscalesets/{id}/sessions`): a live
//!    session elsewhere is a [`ScaleSetError::SessionConflict`] (the standby waits for the old
//!    leader's session to be deleted or to lapse); an expired message-queue token
//!    ([`ScaleSetError::Expired`]) is renewed with `PATCH …/sessions/{id}`.
//! 4. Long polls of the message queue (`GET <messageQueueUrl>?lastMessageId=`; 202 = nothing
//!    came), each message deleted once its jobs are recorded, so a listener that dies mid-message
//!    loses nothing: the message is given again to the next session.
//! 5. Jobs acquired (`POST …/{id}/acquirejobs`, the message-queue token), runners minted with
//!    `POST …/{id}/generatejitconfig`.

use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::time::Instant;

use runner_manager_crds::hosts::{HostList, check_scheme};

use super::client::GitHubClient;
use super::errors::GitHubError;

/// Why a scale-set call failed.
#[derive(Debug, thiserror::Error)]
pub enum ScaleSetError {
    #[error(transparent)]
    GitHub(#[from] GitHubError),
    /// Another session of this scale set is live (another replica, or one that died and whose
    /// session has not lapsed yet).
    #[error("the scale set already has a live message session")]
    SessionConflict,
    /// The message-queue token (or the session) expired: refresh or recreate the session.
    #[error("the message session or its token expired")]
    Expired,
    /// The Actions service answered with this status (5xx: retry later).
    #[error("the Actions service answered {status} ({kind})")]
    Service { status: u16, kind: String },
    #[error("the Actions service could not be reached")]
    Transport,
    #[error("the Actions service's answer could not be read")]
    Malformed,
    /// GitHub named an Actions service (or message queue) on a host the operator's
    /// `--github-hosts` does not list, or over plain http not allowed by `--allow-http-hosts`:
    /// no token is sent there.
    #[error("the Actions service URL GitHub returned is refused: {0}")]
    HostNotAllowed(String),
}

impl ScaleSetError {
    /// Whether trying again later may succeed without a person.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::GitHub(e) => e.is_retryable(),
            Self::Service { status, .. } => *status >= 500 || *status == 429,
            Self::SessionConflict | Self::Expired | Self::Transport => true,
            Self::Malformed | Self::HostNotAllowed(_) => false,
        }
    }
}

/// The statistics GitHub sends with sessions and messages.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct Statistics {
    pub total_available_jobs: i64,
    pub total_acquired_jobs: i64,
    pub total_assigned_jobs: i64,
    pub total_running_jobs: i64,
    pub total_registered_runners: i64,
    pub total_busy_runners: i64,
    pub total_idle_runners: i64,
}

/// A scale set.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScaleSet {
    pub id: i64,
    pub name: String,
    #[serde(default)]
    pub runner_group_id: i64,
    #[serde(default)]
    pub labels: Vec<SetLabel>,
    /// Present on reads of the set (`GET …/{id}`); absent, `None`.
    pub statistics: Option<Statistics>,
}

/// A label of a scale set (`{"type": "System", "name": …}`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct SetLabel {
    pub name: String,
}

impl ScaleSet {
    /// Whether the set already has exactly these labels (case-insensitive, in any order) and
    /// this runner group: nothing to update. Pure.
    pub fn matches(&self, runner_group_id: i64, labels: &[String]) -> bool {
        let have: std::collections::BTreeSet<String> = self
            .labels
            .iter()
            .map(|l| l.name.to_ascii_lowercase())
            .collect();
        let want: std::collections::BTreeSet<String> =
            labels.iter().map(|l| l.to_ascii_lowercase()).collect();
        self.runner_group_id == runner_group_id && have == want
    }
}

/// The body that creates or updates a scale set (`RunnerScaleSet` in actions-runner-controller's
/// client): its name, runner group and labels, ephemeral elastic runners that do not update.
fn set_body(name: &str, runner_group_id: i64, labels: &[String]) -> Value {
    let labels: Vec<Value> = labels
        .iter()
        .map(|l| json!({"type": "System", "name": l}))
        .collect();
    json!({
        "name": name, "runnerGroupId": runner_group_id, "labels": labels,
        "RunnerSetting": {"ephemeral": true, "isElastic": true, "disableUpdate": true},
    })
}

/// A message session.
#[derive(Clone, Debug)]
pub struct Session {
    pub id: String,
    pub queue_url: String,
    pub queue_token: SecretString,
    pub statistics: Statistics,
}

/// A list the Actions service answers with: `{"count": …, "value": […]}`.
#[derive(Deserialize)]
struct List<T> {
    value: Vec<T>,
}

/// The path of a scale set's message session.
fn session_path(scale_set: i64, session: &Session) -> String {
    format!(
        "_apis/runtime/runnerscalesets/{scale_set}/sessions/{}",
        session.id
    )
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SessionWire {
    session_id: String,
    message_queue_url: String,
    message_queue_access_token: SecretString,
    #[serde(default)]
    statistics: Option<Statistics>,
}

/// One job event of a `RunnerScaleSetJobMessages` message.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct JobMessage {
    /// `JobAvailable`, `JobAssigned`, `JobStarted` or `JobCompleted`.
    pub message_type: String,
    pub runner_request_id: i64,
    #[serde(default)]
    pub repository_name: String,
    #[serde(default)]
    pub owner_name: String,
    #[serde(default)]
    pub job_id: String,
    #[serde(default)]
    pub request_labels: Vec<String>,
    #[serde(default)]
    pub runner_name: Option<String>,
    #[serde(default)]
    pub result: Option<String>,
}

/// A message of the queue.
#[derive(Clone, Debug)]
pub struct Message {
    pub id: i64,
    pub kind: String,
    pub jobs: Vec<JobMessage>,
    pub statistics: Statistics,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MessageWire {
    message_id: i64,
    message_type: String,
    #[serde(default)]
    body: String,
    #[serde(default)]
    statistics: Option<Statistics>,
}

/// A runner minted for the scale set.
pub struct ScaleSetJit {
    pub runner_id: i64,
    pub runner_name: String,
    pub encoded_jit_config: SecretString,
}

impl std::fmt::Debug for ScaleSetJit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScaleSetJit")
            .field("runner_id", &self.runner_id)
            .field("runner_name", &self.runner_name)
            .finish_non_exhaustive()
    }
}

struct Admin {
    url: String,
    token: SecretString,
    at: Instant,
}

/// An admin token is exchanged again after this long even if never refused (GitHub's last an
/// hour).
const ADMIN_MAX_AGE: Duration = Duration::from_secs(45 * 60);
/// What a long poll may take before the client gives up on it (GitHub holds it ~50 s).
pub const LONG_POLL_TIMEOUT: Duration = Duration::from_secs(70);
const API_VERSION: &str = "6.0-preview";

/// The scale-set client of one target and credential (it borrows the REST client's HTTP
/// client and credentials for the registration token).
pub struct ScaleSetClient {
    gh: Arc<GitHubClient>,
    admin: tokio::sync::Mutex<Option<Admin>>,
    /// Calls sent, by name (for the figures).
    calls: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// `--github-hosts` and `--allow-http-hosts`: where the Actions service and message queue
    /// GitHub names may be (no check when `None`, as in the protocol tests).
    hosts: Option<(HostList, HostList)>,
    /// Scale sets GitHub answered 404 for (deleted, e.g. by a policy's deletion or a mode
    /// switch in another replica): the next lookup finds or creates the set again rather than
    /// minting against a dead id.
    missing: std::sync::Mutex<std::collections::HashSet<i64>>,
}

impl std::fmt::Debug for ScaleSetClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScaleSetClient").finish_non_exhaustive()
    }
}

/// The span of one scale-set call: the same name and fields as the REST client's
/// `github.request` (never the URL: it carries session and scale-set ids).
fn request_span(name: &'static str, method: &Method) -> tracing::Span {
    tracing::info_span!(
        "github.request",
        otel.kind = "client",
        http.request.method = method.as_str(),
        github.endpoint = name,
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

fn record(span: &tracing::Span, status: Result<u16, &ScaleSetError>) {
    match status {
        Ok(s) => {
            span.record("http.response.status_code", s);
            if s >= 400 {
                span.record("otel.status_code", "ERROR");
            }
        }
        Err(_) => {
            span.record("otel.status_code", "ERROR");
        }
    }
}

/// Send a message-queue call (its token, not the admin token) in its span.
async fn spanned(
    name: &'static str,
    method: Method,
    rb: reqwest::RequestBuilder,
) -> Result<(u16, bytes::Bytes), ScaleSetError> {
    use tracing::Instrument;
    let span = request_span(name, &method);
    let result = async {
        let resp = rb.send().await.map_err(|_| ScaleSetError::Transport)?;
        let status = resp.status().as_u16();
        let body = resp.bytes().await.map_err(|_| ScaleSetError::Transport)?;
        Ok((status, body))
    }
    .instrument(span.clone())
    .await;
    record(&span, result.as_ref().map(|(s, _)| *s));
    result
}

fn type_key(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("typeKey").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_default()
}

impl ScaleSetClient {
    pub fn new(gh: Arc<GitHubClient>) -> Self {
        Self {
            gh,
            admin: tokio::sync::Mutex::new(None),
            calls: std::sync::Mutex::default(),
            hosts: None,
            missing: std::sync::Mutex::default(),
        }
    }

    /// Refuse an Actions service or message-queue URL whose host is not on `github_hosts`, or
    /// that is plain http to a host not on `http_hosts`, before any token is sent to it.
    pub fn with_hosts(mut self, github_hosts: HostList, http_hosts: HostList) -> Self {
        self.hosts = Some((github_hosts, http_hosts));
        self
    }

    fn check_host(&self, url: &str) -> Result<(), ScaleSetError> {
        let Some((github, http)) = &self.hosts else {
            return Ok(());
        };
        let h =
            check_scheme(url, http).map_err(|e| ScaleSetError::HostNotAllowed(e.to_string()))?;
        if github.contains(&h.authority) {
            Ok(())
        } else {
            Err(ScaleSetError::HostNotAllowed(format!(
                "its host {} is not on --github-hosts",
                h.authority
            )))
        }
    }

    /// The REST client this one borrows.
    pub fn rest(&self) -> &Arc<GitHubClient> {
        &self.gh
    }

    /// Calls sent so far, by name.
    pub fn calls(&self) -> std::collections::BTreeMap<&'static str, u64> {
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether GitHub said scale set `id` does not exist (since [`Self::found`]).
    pub fn is_missing(&self, id: i64) -> bool {
        self.missing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(&id)
    }

    fn gone(&self, id: i64) {
        self.missing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id);
    }

    /// Scale set `id` exists (found or created).
    pub fn found(&self, id: i64) {
        self.missing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&id);
    }

    fn count(&self, name: &'static str) {
        *self
            .calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(name)
            .or_insert(0) += 1;
    }

    /// The Actions service URL and admin token, exchanged when missing or old.
    async fn admin(&self, fresh: bool) -> Result<(String, SecretString), ScaleSetError> {
        let mut slot = self.admin.lock().await;
        if !fresh
            && let Some(a) = slot.as_ref()
            && a.at.elapsed() < ADMIN_MAX_AGE
        {
            return Ok((a.url.clone(), a.token.clone()));
        }
        let registration = self.gh.registration_token().await?;
        self.count("runner_registration");
        let resp = self
            .gh
            .http()
            .post(format!(
                "{}/actions/runner-registration",
                self.gh.api_base()
            ))
            .header(
                "Authorization",
                format!("RemoteAuth {}", registration.expose_secret()),
            )
            .json(&json!({"url": self.gh.target_url(), "runner_event": "register"}))
            .send()
            .await
            .map_err(|_| ScaleSetError::Transport)?;
        let status = resp.status().as_u16();
        let body = resp.bytes().await.map_err(|_| ScaleSetError::Transport)?;
        if !(200..300).contains(&status) {
            return Err(ScaleSetError::Service {
                status,
                kind: "runner-registration".into(),
            });
        }
        #[derive(Deserialize)]
        struct Wire {
            url: String,
            token: SecretString,
        }
        let w: Wire = serde_json::from_slice(&body).map_err(|_| ScaleSetError::Malformed)?;
        let url = w.url.trim_end_matches('/').to_owned();
        self.check_host(&url)?;
        *slot = Some(Admin {
            url: url.clone(),
            token: w.token.clone(),
            at: Instant::now(),
        });
        Ok((url, w.token))
    }

    /// One Actions-service call with the admin token; a 401 exchanges the token once. In its
    /// span `github.request`, as the REST client's calls are.
    async fn service(
        &self,
        name: &'static str,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
    ) -> Result<(u16, bytes::Bytes), ScaleSetError> {
        use tracing::Instrument;
        let span = request_span(name, &method);
        let result = async {
            let mut fresh = false;
            loop {
                let (url, token) = self.admin(fresh).await?;
                self.count(name);
                let mut rb = self
                    .gh
                    .http()
                    .request(method.clone(), format!("{url}/{path}"))
                    .query(&[("api-version", API_VERSION)])
                    .query(query)
                    .bearer_auth(token.expose_secret());
                if let Some(b) = &body {
                    rb = rb.json(b);
                }
                let resp = rb.send().await.map_err(|_| ScaleSetError::Transport)?;
                let status = resp.status().as_u16();
                let bytes = resp.bytes().await.map_err(|_| ScaleSetError::Transport)?;
                if status == 401 && !fresh {
                    fresh = true;
                    continue;
                }
                return Ok((status, bytes));
            }
        }
        .instrument(span.clone())
        .await;
        record(&span, result.as_ref().map(|(s, _)| *s));
        result
    }

    /// A service answer of `200` with a JSON `T`; any other status is refused.
    fn answered<T: DeserializeOwned>(
        (status, body): (u16, bytes::Bytes),
    ) -> Result<T, ScaleSetError> {
        if status != 200 {
            return Err(Self::refused(status, &body));
        }
        serde_json::from_slice(&body).map_err(|_| ScaleSetError::Malformed)
    }

    /// A service answer with no body to read: one of the `ok` statuses, or refused.
    fn accepted((status, body): (u16, bytes::Bytes), ok: &[u16]) -> Result<(), ScaleSetError> {
        if ok.contains(&status) {
            Ok(())
        } else {
            Err(Self::refused(status, &body))
        }
    }

    fn refused(status: u16, body: &[u8]) -> ScaleSetError {
        let kind = type_key(body);
        if status == 409 && kind.contains("SessionConflict") {
            return ScaleSetError::SessionConflict;
        }
        if status == 401 || kind.contains("SessionExpired") {
            return ScaleSetError::Expired;
        }
        ScaleSetError::Service { status, kind }
    }

    /// The scale set of that name in that runner group, created with `labels` when missing.
    pub async fn ensure_scale_set(
        &self,
        name: &str,
        runner_group_id: i64,
        labels: &[String],
    ) -> Result<ScaleSet, ScaleSetError> {
        let path = "_apis/runtime/runnerscalesets";
        let query = [
            ("runnerGroupId", runner_group_id.to_string()),
            ("name", name.to_owned()),
        ];
        let answer = self
            .service("get_scale_set", Method::GET, path, &query, None)
            .await?;
        let list: List<ScaleSet> = Self::answered(answer)?;
        if let Some(found) = list.value.into_iter().next() {
            return Ok(found);
        }
        let body = set_body(name, runner_group_id, labels);
        let answer = self
            .service("create_scale_set", Method::POST, path, &[], Some(body))
            .await?;
        Self::answered(answer)
    }

    /// The scale sets of that name (in that runner group when given; the deletion of a policy
    /// whose set id was never recorded may not know its group).
    pub async fn find_scale_sets(
        &self,
        name: &str,
        runner_group_id: Option<i64>,
    ) -> Result<Vec<ScaleSet>, ScaleSetError> {
        let mut query = vec![("name", name.to_owned())];
        if let Some(g) = runner_group_id {
            query.push(("runnerGroupId", g.to_string()));
        }
        let path = "_apis/runtime/runnerscalesets";
        let answer = self
            .service("get_scale_set", Method::GET, path, &query, None)
            .await?;
        let list: List<ScaleSet> = Self::answered(answer)?;
        Ok(list.value.into_iter().filter(|s| s.name == name).collect())
    }

    /// The scale set with this id, with its labels and statistics (`None`: GitHub has no such
    /// set, it was deleted).
    pub async fn get_scale_set(&self, id: i64) -> Result<Option<ScaleSet>, ScaleSetError> {
        let (status, body) = self
            .service(
                "get_scale_set",
                Method::GET,
                &format!("_apis/runtime/runnerscalesets/{id}"),
                &[],
                None,
            )
            .await?;
        match status {
            200 => serde_json::from_slice(&body)
                .map(Some)
                .map_err(|_| ScaleSetError::Malformed),
            404 => Ok(None),
            s => Err(Self::refused(s, &body)),
        }
    }

    /// Give the set new labels and runner group (`PATCH …/{id}`, as actions-runner-controller's
    /// `UpdateRunnerScaleSet`): the set keeps its id, its runners and its message queue.
    pub async fn update_scale_set(
        &self,
        id: i64,
        name: &str,
        runner_group_id: i64,
        labels: &[String],
    ) -> Result<ScaleSet, ScaleSetError> {
        let path = format!("_apis/runtime/runnerscalesets/{id}");
        let body = set_body(name, runner_group_id, labels);
        let answer = self
            .service("update_scale_set", Method::PATCH, &path, &[], Some(body))
            .await?;
        Self::answered(answer)
    }

    /// Delete the scale set (its sessions and runner registrations go with it). A set GitHub
    /// no longer has is deleted already.
    /// The set `id` names, only when it is the set called `name` (issue 28 item 6): an id read
    /// from a policy's annotations is the tenant's to edit, and one naming another tenant's set
    /// must neither be renamed to this policy's (hijacking its jobs) nor deleted with it.
    pub async fn own_scale_set(
        &self,
        id: i64,
        name: &str,
    ) -> Result<Option<ScaleSet>, ScaleSetError> {
        let set = self.get_scale_set(id).await?;
        Ok(set.filter(|s| {
            let own = s.name == name;
            if !own {
                tracing::warn!(
                    scale_set = id,
                    "a recorded scale-set id names a set of another name; it is ignored"
                );
            }
            own
        }))
    }

    pub async fn delete_scale_set(&self, id: i64) -> Result<(), ScaleSetError> {
        let path = format!("_apis/runtime/runnerscalesets/{id}");
        let answer = self
            .service("delete_scale_set", Method::DELETE, &path, &[], None)
            .await?;
        Self::accepted(answer, &[204, 200, 404])
    }

    /// The jobs still available to the set (`GET …/{id}/acquirablejobs`; 204: none): what a
    /// listener that deferred jobs acquires once it has room.
    pub async fn acquirable_jobs(&self, id: i64) -> Result<Vec<JobMessage>, ScaleSetError> {
        let (status, body) = self
            .service(
                "acquirable_jobs",
                Method::GET,
                &format!("_apis/runtime/runnerscalesets/{id}/acquirablejobs"),
                &[],
                None,
            )
            .await?;
        match status {
            204 => Ok(vec![]),
            200 => {
                #[derive(Deserialize)]
                struct List {
                    #[serde(default)]
                    value: Vec<JobMessage>,
                }
                Ok(serde_json::from_slice::<List>(&body)
                    .map_err(|_| ScaleSetError::Malformed)?
                    .value)
            }
            s => Err(Self::refused(s, &body)),
        }
    }

    /// The session a `200` answer describes, its queue on a host this client may call.
    fn session_of(&self, answer: (u16, bytes::Bytes)) -> Result<Session, ScaleSetError> {
        let w: SessionWire = Self::answered(answer)?;
        self.check_host(&w.message_queue_url)?;
        Ok(Session {
            id: w.session_id,
            queue_url: w.message_queue_url,
            queue_token: w.message_queue_access_token,
            statistics: w.statistics.unwrap_or_default(),
        })
    }

    /// Open the scale set's message session (`owner`: this replica).
    pub async fn create_session(
        &self,
        scale_set: i64,
        owner: &str,
    ) -> Result<Session, ScaleSetError> {
        let path = format!("_apis/runtime/runnerscalesets/{scale_set}/sessions");
        let body = json!({"ownerName": owner});
        let answer = self
            .service("create_session", Method::POST, &path, &[], Some(body))
            .await?;
        self.session_of(answer)
    }

    /// A new message-queue token for the session.
    pub async fn refresh_session(
        &self,
        scale_set: i64,
        session: &Session,
    ) -> Result<Session, ScaleSetError> {
        let path = session_path(scale_set, session);
        let answer = self
            .service("refresh_session", Method::PATCH, &path, &[], None)
            .await?;
        self.session_of(answer)
    }

    /// Close the session (leadership handed over, shutdown): the standby need not wait for it
    /// to lapse.
    pub async fn delete_session(
        &self,
        scale_set: i64,
        session: &Session,
    ) -> Result<(), ScaleSetError> {
        let path = session_path(scale_set, session);
        let answer = self
            .service("delete_session", Method::DELETE, &path, &[], None)
            .await?;
        Self::accepted(answer, &[204, 404])
    }

    /// One long poll: `None` when nothing came before GitHub ended it (202).
    pub async fn get_message(
        &self,
        session: &Session,
        last_message_id: i64,
    ) -> Result<Option<Message>, ScaleSetError> {
        self.count("get_message");
        let mut rb = self
            .gh
            .http()
            .get(&session.queue_url)
            .timeout(LONG_POLL_TIMEOUT)
            .header(
                "Accept",
                format!("application/json; api-version={API_VERSION}"),
            )
            .bearer_auth(session.queue_token.expose_secret());
        if last_message_id > 0 {
            rb = rb.query(&[("lastMessageId", last_message_id)]);
        }
        let (status, body) = spanned("get_message", Method::GET, rb).await?;
        match status {
            202 => Ok(None),
            200 => {
                let w: MessageWire =
                    serde_json::from_slice(&body).map_err(|_| ScaleSetError::Malformed)?;
                let jobs = if w.message_type == "RunnerScaleSetJobMessages" && !w.body.is_empty() {
                    serde_json::from_str(&w.body).map_err(|_| ScaleSetError::Malformed)?
                } else {
                    vec![]
                };
                Ok(Some(Message {
                    id: w.message_id,
                    kind: w.message_type,
                    jobs,
                    statistics: w.statistics.unwrap_or_default(),
                }))
            }
            s => Err(Self::refused(s, &body)),
        }
    }

    /// Delete a handled message.
    pub async fn delete_message(
        &self,
        session: &Session,
        message_id: i64,
    ) -> Result<(), ScaleSetError> {
        self.count("delete_message");
        let rb = self
            .gh
            .http()
            .delete(format!(
                "{}/{message_id}",
                session.queue_url.trim_end_matches('/')
            ))
            .bearer_auth(session.queue_token.expose_secret());
        Self::accepted(spanned("delete_message", Method::DELETE, rb).await?, &[204])
    }

    /// Acquire jobs (runner request ids) for the scale set: the ones GitHub gives back are ours.
    pub async fn acquire_jobs(
        &self,
        scale_set: i64,
        session: &Session,
        ids: &[i64],
    ) -> Result<Vec<i64>, ScaleSetError> {
        let (url, _) = self.admin(false).await?;
        self.count("acquire_jobs");
        let rb = self
            .gh
            .http()
            .post(format!(
                "{url}/_apis/runtime/runnerscalesets/{scale_set}/acquirejobs"
            ))
            .query(&[("api-version", API_VERSION)])
            .bearer_auth(session.queue_token.expose_secret())
            .json(ids);
        let list: List<i64> = Self::answered(spanned("acquire_jobs", Method::POST, rb).await?)?;
        Ok(list.value)
    }

    /// Mint a runner of the scale set.
    pub async fn generate_jit(
        &self,
        scale_set: i64,
        name: &str,
        work_folder: &str,
    ) -> Result<ScaleSetJit, ScaleSetError> {
        let (status, body) = self
            .service(
                "generate_jit",
                Method::POST,
                &format!("_apis/runtime/runnerscalesets/{scale_set}/generatejitconfig"),
                &[],
                Some(json!({"name": name, "workFolder": work_folder})),
            )
            .await?;
        if status == 404 {
            self.gone(scale_set);
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Runner {
            id: i64,
            name: String,
        }
        #[derive(Deserialize)]
        struct Wire {
            runner: Runner,
            #[serde(rename = "encodedJITConfig")]
            encoded: SecretString,
        }
        let w: Wire = Self::answered((status, body))?;
        Ok(ScaleSetJit {
            runner_id: w.runner.id,
            runner_name: w.runner.name,
            encoded_jit_config: w.encoded,
        })
    }
}
