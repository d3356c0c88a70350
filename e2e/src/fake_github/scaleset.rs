//! GitHub's runner scale-set protocol (the "Actions service"), as actions-runner-controller's
//! listener speaks it. It is not in GitHub's public OpenAPI description: the endpoints, payloads
//! and headers here follow actions-runner-controller's Go client (`github/actions/client.go`,
//! `types.go` and `sessionservice.go` in its repository, Apache-2.0), which is the reference
//! implementation GitHub maintains for this API.
//!
//! - `POST /actions/runner-registration` (`Authorization: RemoteAuth <registration token>`,
//!   body `{"url": <target URL>, "runner_event": "register"}`) → `{"url": <Actions service
//!   URL>, "token": <admin token>}`. The fake's Actions service lives under `<base>/_actions/`.
//! - Under the Actions service URL, with `Authorization: Bearer <admin token>` and
//!   `api-version=6.0-preview`: `GET|POST _apis/runtime/runnerscalesets` (by `runnerGroupId`
//!   and `name`), `GET|PATCH|DELETE …/{id}` (a deleted set takes its sessions and its runners'
//!   registrations with it), `GET …/{id}/acquirablejobs`, `POST …/{id}/sessions` (`{"ownerName"}` → session with
//!   `sessionId`, `messageQueueUrl`, `messageQueueAccessToken`, `statistics`), `PATCH|DELETE
//!   …/{id}/sessions/{sessionId}`, `POST …/{id}/generatejitconfig` (`{"name", "workFolder"}` →
//!   `{"runner", "encodedJITConfig"}`).
//! - With `Authorization: Bearer <message queue token>`: `GET <messageQueueUrl>` (long poll,
//!   `lastMessageId` acknowledges; 202 when nothing came), `DELETE <messageQueueUrl>/{id}`, and
//!   `POST …/{id}/acquirejobs` (a JSON array of runner request ids → `{"count", "value"}`).
//!
//! Messages are kept per scale set, not per session: a message not deleted is given again to
//! the next session (a listener that died mid-message loses nothing). One message carries every
//! job event since the last (`messageType: RunnerScaleSetJobMessages`, `body`: a JSON string of
//! `JobAvailable`/`JobAssigned`/`JobStarted`/`JobCompleted` entries) and the set's `statistics`.
//!
//! Failure modes, each settable through the admin API (`/_admin/scale-sets/settings`) or the
//! fault queue (endpoints `scale_set_*`): a second session while one is live → 409
//! `TaskAgentSessionConflictException`; an admin or message-queue token past its lifetime → 401;
//! any 5xx; a long poll that ends with 202 after `long_poll_ms`; `drop_job_started` `JobStarted`
//! events lost (never put in a message, as a message lost on GitHub's side).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{FromRequestParts, Path, Query};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use secrecy::ExposeSecret;
use serde::Deserialize;
use serde_json::{Value, json};

use super::auth;
use super::clock::unix_now;
use super::jobs::JobStatus;
use super::scope::Scope;
use super::state::{FakeGithub, JitRequest};

pub use super::scaleset_world::{ScaleSet, ScaleSetWorld, Session, Settings};

fn actions_error(status: StatusCode, type_key: &str, message: &str) -> Response {
    (
        status,
        Json(json!({
            "$id": "1", "innerException": null, "message": message,
            "typeName": format!("GitHub.DistributedTask.WebApi.{type_key}, GitHub.DistributedTask.WebApi"),
            "typeKey": type_key, "errorCode": 0, "eventId": 3000
        })),
    )
        .into_response()
}

/// Who calls, as every handler here reads it first: the fake and the request's headers.
#[derive(Debug)]
pub struct Caller {
    fake: Arc<FakeGithub>,
    headers: HeaderMap,
}

impl FromRequestParts<Arc<FakeGithub>> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        fake: &Arc<FakeGithub>,
    ) -> Result<Self, Self::Rejection> {
        Ok(Self {
            fake: Arc::clone(fake),
            headers: parts.headers.clone(),
        })
    }
}

/// No set of that id (in the caller's scope).
fn set_not_found() -> Response {
    actions_error(
        StatusCode::NOT_FOUND,
        "RunnerScaleSetNotFoundException",
        "No runner scale set with this id.",
    )
}

/// A set as the Actions service answers with it: with its statistics.
fn set_answer(fake: &FakeGithub, set: &ScaleSet) -> Response {
    Json(set_json(&fake.base_url, set, gather(fake, set.id, false).0)).into_response()
}

fn unauthorized() -> Response {
    actions_error(
        StatusCode::UNAUTHORIZED,
        "UnauthorizedException",
        "The access token has expired or is not valid.",
    )
}

fn bearer(headers: &HeaderMap) -> Option<String> {
    auth::presented_token(headers).map(auth::token_hash)
}

impl FakeGithub {
    /// The scope of a live admin token, or 401.
    fn admin_scope(&self, headers: &HeaderMap) -> Result<Scope, ()> {
        let hash = bearer(headers).ok_or(())?;
        let world = self.world();
        match world.scale_sets.admin_tokens.get(&hash) {
            Some((scope, exp)) if *exp > unix_now() => Ok(scope.clone()),
            _ => Err(()),
        }
    }

    /// The session a live message-queue token belongs to, or 401.
    fn queue_session(&self, headers: &HeaderMap) -> Result<String, ()> {
        let hash = bearer(headers).ok_or(())?;
        let world = self.world();
        let now = unix_now();
        world
            .scale_sets
            .sessions
            .iter()
            .find(|(_, s)| s.token_hash == hash && s.token_expires > now)
            .map(|(id, _)| id.clone())
            .ok_or(())
    }
}

/// Whether a set takes a job: its scope covers the repository and its labels every `runs-on`
/// label but `self-hosted`.
fn takes(set: &ScaleSet, owner: &str, repo: &str, labels: &[String]) -> bool {
    set.scope.covers_repo(owner, repo)
        && !labels.is_empty()
        && labels.iter().all(|l| {
            l.eq_ignore_ascii_case("self-hosted")
                || set.labels.iter().any(|s| s.eq_ignore_ascii_case(l))
        })
}

fn set_json(base: &str, set: &ScaleSet, stats: Value) -> Value {
    json!({
        "id": set.id, "name": set.name, "runnerGroupId": set.group_id,
        "runnerGroupName": "Default",
        "labels": set.labels.iter().map(|l| json!({"type": "System", "name": l})).collect::<Vec<_>>(),
        "RunnerSetting": {"ephemeral": true, "isElastic": true, "disableUpdate": true},
        "runnerJitConfigUrl": format!("{base}/_actions/_apis/runtime/runnerscalesets/{}/generatejitconfig", set.id),
        "statistics": stats,
    })
}

/// The set's statistics and the job events not yet told, as `RunnerScaleSetJobMessages`
/// entries (marked told).
fn gather(fake: &FakeGithub, set_id: u64, mark: bool) -> (Value, Vec<Value>) {
    let mut world = fake.world();
    let Some(set) = world.scale_sets.sets.get(&set_id).cloned() else {
        return (json!({}), vec![]);
    };
    let mut events = Vec::new();
    let mut told = set.told.clone();
    let mut drop_started = world.scale_sets.settings.drop_job_started;
    let (mut available, mut acquired, mut running) = (0, 0, 0);
    for j in world.jobs.values() {
        let ours_by_runner = j
            .runner
            .as_ref()
            .is_some_and(|r| set.runners.contains(&r.id));
        let is_acquired = set.acquired.contains(&j.id);
        if !(takes(&set, &j.owner, &j.repo, &j.labels) || ours_by_runner || is_acquired) {
            continue;
        }
        let base = |kind: &str| {
            json!({
                "messageType": kind, "runnerRequestId": j.id, "repositoryName": j.repo,
                "ownerName": j.owner, "jobId": j.id.to_string(),
                "jobWorkflowRef": format!("{}/{}/.github/workflows/fake.yml@refs/heads/main", j.owner, j.repo),
                "jobDisplayName": j.name, "workflowRunId": j.run_id, "eventName": "push",
                "requestLabels": j.labels,
            })
        };
        match j.status {
            JobStatus::Queued if !is_acquired => available += 1,
            JobStatus::Queued => acquired += 1,
            JobStatus::InProgress if ours_by_runner => running += 1,
            _ => {}
        }
        let mut say = |kind: u8, v: Value| {
            if told.insert((kind, j.id)) {
                if kind == 2 && mark && drop_started > 0 {
                    // A `JobStarted` lost on the way: told, never sent.
                    drop_started -= 1;
                } else {
                    events.push(v);
                }
            }
        };
        if j.status == JobStatus::Queued
            && !is_acquired
            && !world.scale_sets.acquired_by.contains_key(&j.id)
        {
            let mut v = base("JobAvailable");
            v["acquireJobUrl"] = json!(format!(
                "{}/_actions/_apis/runtime/runnerscalesets/{set_id}/acquirejobs",
                fake.base_url
            ));
            say(0, v);
        }
        if is_acquired {
            say(1, base("JobAssigned"));
        }
        if ours_by_runner && j.status != JobStatus::Queued {
            let r = j
                .runner
                .as_ref()
                .map(|r| (r.id, r.name.clone()))
                .unwrap_or_default();
            let mut v = base("JobStarted");
            v["runnerId"] = json!(r.0);
            v["runnerName"] = json!(r.1);
            say(2, v);
            if j.status == JobStatus::Completed {
                let mut v = base("JobCompleted");
                v["runnerId"] = json!(r.0);
                v["runnerName"] = json!(r.1);
                v["result"] = json!(j.conclusion.map_or("succeeded", |c| match c.as_str() {
                    "success" => "succeeded",
                    "failure" => "failed",
                    other => other,
                }));
                say(3, v);
            }
        }
    }
    let registered = world
        .runners
        .values()
        .filter(|r| set.runners.contains(&r.id))
        .count();
    let busy = world
        .runners
        .values()
        .filter(|r| set.runners.contains(&r.id) && r.busy())
        .count();
    let stats = json!({
        "totalAvailableJobs": available, "totalAcquiredJobs": acquired,
        "totalAssignedJobs": acquired + running, "totalRunningJobs": running,
        "totalRegisteredRunners": registered, "totalBusyRunners": busy,
        "totalIdleRunners": registered - busy,
    });
    if mark && let Some(s) = world.scale_sets.sets.get_mut(&set_id) {
        s.told = told;
        world.scale_sets.settings.drop_job_started = drop_started;
    }
    (stats, events)
}

#[derive(Debug, Deserialize)]
pub struct RegistrationBody {
    pub url: String,
    pub runner_event: Option<String>,
}

/// `POST /actions/runner-registration`.
pub async fn runner_registration(c: Caller, Json(b): Json<RegistrationBody>) -> Response {
    let Caller { fake, headers } = c;
    let presented = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("RemoteAuth "))
        .map(str::trim);
    let now = unix_now();
    let mut world = fake.world();
    let Some((scope, _)) = presented
        .map(auth::token_hash)
        .and_then(|h| world.scale_sets.registration_tokens.get(&h).cloned())
        .filter(|(_, exp)| *exp > now)
    else {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"message": "Bad credentials"})),
        )
            .into_response();
    };
    let named = b
        .url
        .trim_end_matches('/')
        .rsplit('/')
        .take(2)
        .collect::<Vec<_>>();
    let matches = match &scope {
        Scope::Repo { owner, repo } => {
            named.len() == 2
                && named[0].eq_ignore_ascii_case(repo)
                && named[1].eq_ignore_ascii_case(owner)
        }
        Scope::Org { org } => named.first().is_some_and(|n| n.eq_ignore_ascii_case(org)),
        Scope::Enterprise { enterprise } => named
            .first()
            .is_some_and(|n| n.eq_ignore_ascii_case(enterprise)),
    };
    if !matches || b.runner_event.as_deref() != Some("register") {
        return (StatusCode::NOT_FOUND, Json(json!({"message": "Not Found"}))).into_response();
    }
    let token = auth::mint_token("eyJ0");
    let lifetime = world.scale_sets.settings.admin_token_secs;
    world.scale_sets.admin_tokens.insert(
        auth::token_hash(token.expose_secret()),
        (scope, now + lifetime),
    );
    Json(json!({"url": format!("{}/_actions/", fake.base_url), "token": token.expose_secret()}))
        .into_response()
}

#[derive(Debug, Deserialize)]
pub struct SetQuery {
    #[serde(rename = "runnerGroupId")]
    pub runner_group_id: Option<u64>,
    pub name: Option<String>,
}

/// `GET _apis/runtime/runnerscalesets?runnerGroupId=&name=`.
pub async fn list_sets(c: Caller, Query(q): Query<SetQuery>) -> Response {
    let Caller { fake, headers } = c;
    let Ok(scope) = fake.admin_scope(&headers) else {
        return unauthorized();
    };
    let found: Vec<ScaleSet> = fake
        .world()
        .scale_sets
        .sets
        .values()
        .filter(|s| s.scope == scope)
        .filter(|s| q.runner_group_id.is_none_or(|g| s.group_id == g))
        .filter(|s| q.name.as_ref().is_none_or(|n| s.name == *n))
        .cloned()
        .collect();
    let value: Vec<Value> = found
        .iter()
        .map(|s| set_json(&fake.base_url, s, gather(&fake, s.id, false).0))
        .collect();
    Json(json!({"count": value.len(), "value": value})).into_response()
}

/// `POST _apis/runtime/runnerscalesets`.
pub async fn create_set(c: Caller, Json(b): Json<Value>) -> Response {
    let Caller { fake, headers } = c;
    let Ok(scope) = fake.admin_scope(&headers) else {
        return unauthorized();
    };
    let name = b["name"].as_str().unwrap_or_default().to_owned();
    let group_id = b["runnerGroupId"].as_u64().unwrap_or(1);
    let labels: Vec<String> = b["labels"]
        .as_array()
        .map(|ls| {
            ls.iter()
                .filter_map(|l| l["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    if name.is_empty() || labels.is_empty() {
        return actions_error(
            StatusCode::BAD_REQUEST,
            "ArgumentException",
            "A runner scale set needs a name and labels.",
        );
    }
    let mut world = fake.world();
    if world
        .scale_sets
        .sets
        .values()
        .any(|s| s.scope == scope && s.name == name && s.group_id == group_id)
    {
        return actions_error(
            StatusCode::CONFLICT,
            "RunnerScaleSetExistsException",
            "A runner scale set with this name already exists.",
        );
    }
    let id = world.scale_sets.sets.keys().last().copied().unwrap_or(0) + 1;
    let set = ScaleSet {
        id,
        name,
        group_id,
        labels,
        scope,
        runners: BTreeSet::new(),
        acquired: BTreeSet::new(),
        told: BTreeSet::new(),
        unacked: None,
        next_message: 1,
    };
    world.scale_sets.sets.insert(id, set.clone());
    drop(world);
    set_answer(&fake, &set)
}

/// `DELETE _apis/runtime/runnerscalesets/{id}`.
pub async fn delete_set(c: Caller, Path(id): Path<u64>) -> Response {
    let Caller { fake, headers } = c;
    if fake.admin_scope(&headers).is_err() {
        return unauthorized();
    }
    let mut world = fake.world();
    let Some(set) = world.scale_sets.sets.remove(&id) else {
        return set_not_found();
    };
    world.scale_sets.sessions.retain(|_, s| s.set != id);
    // The set's runners are unregistered with it.
    world.runners.retain(|rid, _| !set.runners.contains(rid));
    drop(world);
    fake.bump_public();
    StatusCode::NO_CONTENT.into_response()
}

/// `GET _apis/runtime/runnerscalesets/{id}`: the set with its statistics.
pub async fn get_set(c: Caller, Path(id): Path<u64>) -> Response {
    let Caller { fake, headers } = c;
    let Ok(scope) = fake.admin_scope(&headers) else {
        return unauthorized();
    };
    let Some(set) = fake
        .world()
        .scale_sets
        .sets
        .get(&id)
        .filter(|s| s.scope == scope)
        .cloned()
    else {
        return set_not_found();
    };
    set_answer(&fake, &set)
}

/// `PATCH _apis/runtime/runnerscalesets/{id}` (`UpdateRunnerScaleSet`): new name, runner group
/// or labels; the set keeps its id, runners and queue.
pub async fn update_set(c: Caller, Path(id): Path<u64>, Json(b): Json<Value>) -> Response {
    let Caller { fake, headers } = c;
    let Ok(scope) = fake.admin_scope(&headers) else {
        return unauthorized();
    };
    let set = {
        let mut world = fake.world();
        let Some(set) = world
            .scale_sets
            .sets
            .get_mut(&id)
            .filter(|s| s.scope == scope)
        else {
            return set_not_found();
        };
        if let Some(n) = b["name"].as_str().filter(|n| !n.is_empty()) {
            set.name = n.to_owned();
        }
        if let Some(g) = b["runnerGroupId"].as_u64() {
            set.group_id = g;
        }
        if let Some(ls) = b["labels"].as_array() {
            let labels: Vec<String> = ls
                .iter()
                .filter_map(|l| l["name"].as_str().map(str::to_owned))
                .collect();
            if !labels.is_empty() {
                set.labels = labels;
            }
        }
        set.clone()
    };
    fake.bump_public();
    set_answer(&fake, &set)
}

/// `GET _apis/runtime/runnerscalesets/{id}/acquirablejobs` (admin token): the jobs the set
/// takes that no set acquired yet; 204 when none.
pub async fn acquirable_jobs(c: Caller, Path(id): Path<u64>) -> Response {
    let Caller { fake, headers } = c;
    if fake.admin_scope(&headers).is_err() {
        return unauthorized();
    }
    let world = fake.world();
    let Some(set) = world.scale_sets.sets.get(&id) else {
        return set_not_found();
    };
    let value: Vec<Value> = world
        .jobs
        .values()
        .filter(|j| {
            j.status == JobStatus::Queued
                && takes(set, &j.owner, &j.repo, &j.labels)
                && !world.scale_sets.acquired_by.contains_key(&j.id)
        })
        .map(|j| {
            json!({
                "acquireJobUrl": format!("{}/_actions/_apis/runtime/runnerscalesets/{id}/acquirejobs", fake.base_url),
                "messageType": "JobAvailable", "runnerRequestId": j.id,
                "repositoryName": j.repo, "ownerName": j.owner,
                "jobWorkflowRef": format!("{}/{}/.github/workflows/fake.yml@refs/heads/main", j.owner, j.repo),
                "eventName": "push", "requestLabels": j.labels,
            })
        })
        .collect();
    if value.is_empty() {
        return StatusCode::NO_CONTENT.into_response();
    }
    Json(json!({"count": value.len(), "value": value})).into_response()
}

fn session_json(fake: &FakeGithub, id: &str, s: &Session, token: &str) -> Value {
    let set = fake.world().scale_sets.sets.get(&s.set).cloned();
    let stats = gather(fake, s.set, false).0;
    json!({
        "sessionId": id, "ownerName": s.owner,
        "runnerScaleSet": set.map(|set| set_json(&fake.base_url, &set, stats.clone())),
        "messageQueueUrl": format!("{}/_actions/message-queues/{id}", fake.base_url),
        "messageQueueAccessToken": token,
        "statistics": stats,
    })
}

/// `POST _apis/runtime/runnerscalesets/{id}/sessions`: 409 while another session is live.
pub async fn create_session(c: Caller, Path(set): Path<u64>, Json(b): Json<Value>) -> Response {
    let Caller { fake, headers } = c;
    if fake.admin_scope(&headers).is_err() {
        return unauthorized();
    }
    let now = unix_now();
    let token = auth::mint_token("mq");
    let (id, session) = {
        let mut world = fake.world();
        let w = &mut world.scale_sets;
        if !w.sets.contains_key(&set) {
            return set_not_found();
        }
        let idle = w.settings.session_idle_secs;
        w.sessions.retain(|_, s| now - s.last_seen < idle);
        if w.sessions.values().any(|s| s.set == set) {
            return actions_error(
                StatusCode::CONFLICT,
                "TaskAgentSessionConflictException",
                "The runner scale set already has an active session for owner.",
            );
        }
        let id = uuid::Uuid::new_v4().to_string();
        let session = Session {
            set,
            owner: b["ownerName"].as_str().unwrap_or_default().to_owned(),
            token_hash: auth::token_hash(token.expose_secret()),
            token_expires: now + w.settings.queue_token_secs,
            last_seen: now,
        };
        w.sessions.insert(id.clone(), session.clone());
        w.sessions_opened += 1;
        (id, session)
    };
    Json(session_json(&fake, &id, &session, token.expose_secret())).into_response()
}

/// `PATCH|DELETE _apis/runtime/runnerscalesets/{id}/sessions/{session}`.
pub async fn session(
    c: Caller,
    method: axum::http::Method,
    Path((set, id)): Path<(u64, String)>,
) -> Response {
    let Caller { fake, headers } = c;
    if fake.admin_scope(&headers).is_err() {
        return unauthorized();
    }
    let now = unix_now();
    let mut world = fake.world();
    let w = &mut world.scale_sets;
    if method == axum::http::Method::DELETE {
        w.sessions.remove(&id);
        return StatusCode::NO_CONTENT.into_response();
    }
    let lifetime = w.settings.queue_token_secs;
    let Some(s) = w.sessions.get_mut(&id).filter(|s| s.set == set) else {
        return actions_error(
            StatusCode::NOT_FOUND,
            "TaskAgentSessionExpiredException",
            "The session has expired.",
        );
    };
    let token = auth::mint_token("mq");
    s.token_hash = auth::token_hash(token.expose_secret());
    s.token_expires = now + lifetime;
    s.last_seen = now;
    let s = s.clone();
    drop(world);
    Json(session_json(&fake, &id, &s, token.expose_secret())).into_response()
}

#[derive(Debug, Deserialize)]
pub struct MessageQuery {
    #[serde(rename = "lastMessageId")]
    pub last_message_id: Option<u64>,
}

/// `GET <messageQueueUrl>?lastMessageId=`: the set's next message, waiting up to `long_poll_ms`
/// (then 202).
pub async fn get_message(
    c: Caller,
    Path(session): Path<String>,
    Query(q): Query<MessageQuery>,
) -> Response {
    let Caller { fake, headers } = c;
    let id = match fake.queue_session(&headers) {
        Ok(id) if id == session => id,
        Ok(_) | Err(_) => return unauthorized(),
    };
    let (set, wait) = {
        let mut world = fake.world();
        let w = &mut world.scale_sets;
        let wait = Duration::from_millis(w.settings.long_poll_ms);
        let Some(s) = w.sessions.get_mut(&id) else {
            return unauthorized();
        };
        s.last_seen = unix_now();
        let set = s.set;
        if let (Some(last), Some(st)) = (q.last_message_id, w.sets.get_mut(&set))
            && st.unacked.as_ref().is_some_and(|(m, _)| *m <= last)
        {
            st.unacked = None;
        }
        (set, wait)
    };
    let mut changed = fake.subscribe();
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        {
            let unacked = fake
                .world()
                .scale_sets
                .sets
                .get(&set)
                .and_then(|s| s.unacked.clone());
            if let Some((_, body)) = unacked {
                return Json(body).into_response();
            }
        }
        let (stats, events) = gather(&fake, set, true);
        if !events.is_empty() {
            let mut world = fake.world();
            let Some(st) = world.scale_sets.sets.get_mut(&set) else {
                return unauthorized();
            };
            let mid = st.next_message;
            st.next_message += 1;
            let body = json!({
                "messageId": mid, "messageType": "RunnerScaleSetJobMessages",
                "body": Value::Array(events).to_string(), "statistics": stats,
            });
            st.unacked = Some((mid, body.clone()));
            return Json(body).into_response();
        }
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => return StatusCode::ACCEPTED.into_response(),
            r = changed.changed() => if r.is_err() { return StatusCode::ACCEPTED.into_response() },
        }
        if let Some(s) = fake.world().scale_sets.sessions.get_mut(&id) {
            s.last_seen = unix_now();
        }
    }
}

/// `DELETE <messageQueueUrl>/{messageId}`.
pub async fn delete_message(c: Caller, Path((session, message)): Path<(String, u64)>) -> Response {
    let Caller { fake, headers } = c;
    let id = match fake.queue_session(&headers) {
        Ok(id) if id == session => id,
        _ => return unauthorized(),
    };
    let mut world = fake.world();
    let set = world.scale_sets.sessions.get(&id).map(|s| s.set);
    if let Some(st) = set.and_then(|s| world.scale_sets.sets.get_mut(&s))
        && st.unacked.as_ref().is_some_and(|(m, _)| *m == message)
    {
        st.unacked = None;
    }
    StatusCode::NO_CONTENT.into_response()
}

/// `POST _apis/runtime/runnerscalesets/{id}/acquirejobs` (message-queue token): the jobs of the
/// list still available to this set are acquired by it, once.
pub async fn acquire_jobs(c: Caller, Path(set): Path<u64>, Json(ids): Json<Vec<u64>>) -> Response {
    let Caller { fake, headers } = c;
    let id = match fake.queue_session(&headers) {
        Ok(id) => id,
        Err(()) => return unauthorized(),
    };
    let mut got = Vec::new();
    {
        let mut world = fake.world();
        if world.scale_sets.sessions.get(&id).map(|s| s.set) != Some(set) {
            return unauthorized();
        }
        let Some(st) = world.scale_sets.sets.get(&set).cloned() else {
            return unauthorized();
        };
        for job in ids {
            let free = world.jobs.get(&job).is_some_and(|j| {
                j.status == JobStatus::Queued && takes(&st, &j.owner, &j.repo, &j.labels)
            }) && !world.scale_sets.acquired_by.contains_key(&job);
            if free {
                world.scale_sets.acquired_by.insert(job, set);
                if let Some(s) = world.scale_sets.sets.get_mut(&set) {
                    s.acquired.insert(job);
                }
                got.push(job);
            }
        }
    }
    fake.bump_public();
    Json(json!({"count": got.len(), "value": got})).into_response()
}

/// `POST _apis/runtime/runnerscalesets/{id}/generatejitconfig`: a runner of the set, with its
/// labels, in its runner group.
pub async fn generate_jit(c: Caller, Path(set): Path<u64>, Json(b): Json<Value>) -> Response {
    let Caller { fake, headers } = c;
    let Ok(scope) = fake.admin_scope(&headers) else {
        return unauthorized();
    };
    let Some(st) = fake.world().scale_sets.sets.get(&set).cloned() else {
        return set_not_found();
    };
    let req = JitRequest {
        name: b["name"].as_str().map(str::to_owned),
        runner_group_id: Some(st.group_id),
        // A scale set's runners carry `self-hosted` and the set's labels.
        labels: Some(
            std::iter::once("self-hosted".to_owned())
                .chain(st.labels.iter().cloned())
                .collect(),
        ),
        work_folder: b["workFolder"].as_str().map(str::to_owned),
    };
    match fake.generate_jit(&scope, req) {
        Ok((runner, jit)) => {
            let rid = runner["id"].as_u64().unwrap_or(0);
            if let Some(s) = fake.world().scale_sets.sets.get_mut(&set) {
                s.runners.insert(rid);
            }
            Json(json!({
                "runner": {"id": rid, "name": runner["name"], "runnerScaleSetId": set},
                "encodedJITConfig": jit.expose_secret(),
            }))
            .into_response()
        }
        Err(e) if e.status == StatusCode::CONFLICT => actions_error(
            StatusCode::CONFLICT,
            "AgentExistsException",
            "A runner with this name already exists.",
        ),
        Err(e) => e.into_response(),
    }
}

/// The routes, under the per-call layer (faults and counters).
pub fn routes() -> axum::Router<Arc<FakeGithub>> {
    use axum::routing::{delete, get, patch, post};
    let base = "/_actions/_apis/runtime/runnerscalesets";
    axum::Router::new()
        .route("/actions/runner-registration", post(runner_registration))
        .route(base, get(list_sets).post(create_set))
        .route(
            &format!("{base}/{{id}}"),
            get(get_set).patch(update_set).delete(delete_set),
        )
        .route(
            &format!("{base}/{{id}}/acquirablejobs"),
            get(acquirable_jobs),
        )
        .route(&format!("{base}/{{id}}/sessions"), post(create_session))
        .route(
            &format!("{base}/{{id}}/sessions/{{session}}"),
            patch(session).delete(session),
        )
        .route(&format!("{base}/{{id}}/acquirejobs"), post(acquire_jobs))
        .route(
            &format!("{base}/{{id}}/generatejitconfig"),
            post(generate_jit),
        )
        .route("/_actions/message-queues/{session}", get(get_message))
        .route(
            "/_actions/message-queues/{session}/{message}",
            delete(delete_message),
        )
}
