//! The admin API (`/_admin/…`): set the world up, queue jobs, inject faults, read counters,
//! steer webhook deliveries. It is for tests and people, so it is neither authenticated nor
//! counted nor rate limited.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use jsonwebtoken::DecodingKey;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::{Value, json};

use super::auth::{self, AppRegistration, Installation, TargetType};
use super::clock::unix_now;
use super::endpoint::Resource;
use super::error::ApiError;
use super::faults::FaultRequest;
use super::ratelimit::{Bucket, ExceededStatus};
use super::runners::RunnerGroup;
use super::scope::Scope;
use super::state::FakeGithub;
use super::webhooks::{Hook, WebhookControls};
use crate::standin_runner::behaviour::JobBehaviour;

type Fake = State<Arc<FakeGithub>>;

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, message)
}

#[derive(Debug, Deserialize)]
pub struct AppBody {
    pub app_id: u64,
    pub client_id: Option<String>,
    pub slug: Option<String>,
    pub public_key_pem: String,
}

/// `POST /_admin/app`: registers the GitHub App by its public key.
pub async fn register_app(
    State(fake): Fake,
    Json(b): Json<AppBody>,
) -> Result<StatusCode, ApiError> {
    let key = DecodingKey::from_rsa_pem(b.public_key_pem.as_bytes())
        .map_err(|_| bad("public_key_pem is not an RSA public key in PEM"))?;
    fake.world().app = Some(AppRegistration {
        app_id: b.app_id,
        client_id: b
            .client_id
            .unwrap_or_else(|| format!("Iv1.fake{}", b.app_id)),
        slug: b.slug.unwrap_or_else(|| "fake-app".into()),
        public_key: key,
    });
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
pub struct InstallationBody {
    pub id: u64,
    pub account: String,
    pub target_type: Option<TargetType>,
    #[serde(default)]
    pub suspended: bool,
}

/// `POST /_admin/installations`.
pub async fn add_installation(State(fake): Fake, Json(b): Json<InstallationBody>) -> StatusCode {
    fake.world().installations.insert(
        b.id,
        Installation {
            id: b.id,
            account: b.account,
            target_type: b.target_type.unwrap_or(TargetType::Organization),
            suspended: b.suspended,
        },
    );
    StatusCode::NO_CONTENT
}

#[derive(Debug, Deserialize)]
pub struct PatBody {
    pub token: SecretString,
}

/// `POST /_admin/pats`: a personal access token good for every scope.
pub async fn add_pat(State(fake): Fake, Json(b): Json<PatBody>) -> StatusCode {
    fake.world()
        .pats
        .insert(auth::token_hash(b.token.expose_secret()));
    StatusCode::NO_CONTENT
}

#[derive(Debug, Deserialize)]
pub struct GroupBody {
    /// `orgs/<org>` or `enterprises/<enterprise>`.
    pub owner: String,
    pub name: String,
    #[serde(default = "yes")]
    pub usable: bool,
}

fn yes() -> bool {
    true
}

/// `POST /_admin/runner-groups` → `{"id"}`.
pub async fn add_group(
    State(fake): Fake,
    Json(b): Json<GroupBody>,
) -> Result<Json<Value>, ApiError> {
    let scope = match b.owner.split_once('/') {
        Some(("orgs", org)) => Scope::org(org),
        Some(("enterprises", e)) => Scope::enterprise(e),
        _ => return Err(bad("owner must be orgs/<org> or enterprises/<enterprise>")),
    };
    let mut world = fake.world();
    let groups = world.groups_of(&scope);
    let id = groups.iter().map(|g| g.id).max().unwrap_or(1) + 1;
    groups.push(RunnerGroup {
        id,
        name: b.name,
        default: false,
        usable: b.usable,
    });
    Ok(Json(json!({"id": id})))
}

#[derive(Debug, Deserialize)]
pub struct JobBody {
    pub owner: String,
    pub repo: String,
    pub labels: Vec<String>,
    pub name: Option<String>,
    #[serde(default)]
    pub behaviour: JobBehaviour,
    /// A pull request's run (its head repository: a fork's makes a fork pull request).
    #[serde(default)]
    pub pull_request: Option<crate::fake_github::jobs::PullRequestOrigin>,
}

/// `POST /_admin/jobs`: queues a job → `{"job_id", "run_id"}`.
pub async fn queue_job(State(fake): Fake, Json(b): Json<JobBody>) -> (StatusCode, Json<Value>) {
    let name = b.name.unwrap_or_else(|| "build".into());
    let (job_id, run_id) = fake.queue_job(
        &b.owner,
        &b.repo,
        name,
        b.labels,
        b.behaviour,
        b.pull_request,
    );
    (
        StatusCode::CREATED,
        Json(json!({"job_id": job_id, "run_id": run_id})),
    )
}

/// `GET /_admin/jobs/{id}`.
pub async fn get_job(State(fake): Fake, Path(id): Path<u64>) -> Result<Json<Value>, ApiError> {
    let world = fake.world();
    let j = world.jobs.get(&id).ok_or_else(ApiError::not_found)?;
    Ok(Json(json!({
        "id": j.id,
        "run_id": j.run_id,
        "status": j.status,
        "conclusion": j.conclusion,
        "runner_id": j.runner.as_ref().map(|r| r.id),
        "runner_name": j.runner.as_ref().map(|r| r.name.clone()),
    })))
}

/// An admin list: one JSON row of each of `items`.
fn rows<T>(items: impl Iterator<Item = T>, row: impl Fn(T) -> Value) -> Json<Value> {
    Json(Value::Array(items.map(row).collect()))
}

/// `GET /_admin/runners`: every registration, in every scope.
pub async fn list_runners(State(fake): Fake) -> Json<Value> {
    let world = fake.world();
    rows(world.runners.values(), |r| {
        json!({
            "id": r.id, "name": r.name, "scope": r.scope.path(),
            "status": r.status().as_str(), "busy": r.busy(), "jit_used": r.jit_used,
        })
    })
}

/// `GET /_admin/jits`: every encoded JIT config this simulated GitHub minted, in order. Only the
/// simulated GitHub's admin API says them: the real node's leak scan (e2e/cluster/oci-check.sh)
/// searches pod specs, events and logs for each.
pub async fn issued_jits(State(fake): Fake) -> Json<Value> {
    let world = fake.world();
    let list: Vec<&str> = world
        .issued_jits
        .iter()
        .map(|j| j.expose_secret())
        .collect();
    Json(json!(list))
}

/// `GET /_admin/mints`: every registration a JIT was minted for, in order, with whether GitHub
/// still lists it and how many session openings its credentials made — never the JIT itself.
/// The real node's checks join it with the attempts' journal: each mint must belong to one
/// attempt (`runner-manager-<attempt uuid>`) and be either that attempt's journalled runner or
/// deregistered.
pub async fn mints(State(fake): Fake) -> Json<Value> {
    let world = fake.world();
    rows(world.mints.iter(), |m| {
        json!({
            "id": m.id, "name": m.name, "scope": m.scope, "at": m.at,
            "sessions": m.sessions, "registered": world.runners.contains_key(&m.id),
        })
    })
}

/// `POST /_admin/faults`.
pub async fn add_fault(State(fake): Fake, Json(b): Json<FaultRequest>) -> StatusCode {
    let mut world = fake.world();
    let queue = world.faults.entry(b.endpoint).or_default();
    for _ in 0..b.count {
        queue.push_back(b.fault.clone());
    }
    StatusCode::NO_CONTENT
}

/// `DELETE /_admin/faults`.
pub async fn clear_faults(State(fake): Fake) -> StatusCode {
    fake.world().faults.clear();
    StatusCode::NO_CONTENT
}

/// `GET /_admin/counters` → `{"<endpoint>": {"<status>|dropped": n}}`.
pub async fn counters(State(fake): Fake) -> Json<Value> {
    Json(json!(fake.world().counters))
}

/// `DELETE /_admin/counters`.
pub async fn reset_counters(State(fake): Fake) -> StatusCode {
    fake.world().counters.clear();
    StatusCode::NO_CONTENT
}

#[derive(Debug, Deserialize)]
pub struct RateLimitBody {
    pub resource: Resource,
    pub limit: u64,
    pub window_secs: Option<i64>,
    #[serde(default)]
    pub exceeded_status: ExceededStatus,
}

/// `POST /_admin/rate-limits`: sets a bucket's budget and starts a fresh window.
pub async fn set_rate_limit(State(fake): Fake, Json(b): Json<RateLimitBody>) -> StatusCode {
    let mut bucket = Bucket::new(b.limit, b.window_secs.unwrap_or(3600), unix_now());
    bucket.exceeded_status = b.exceeded_status;
    fake.world().buckets.insert(b.resource, bucket);
    StatusCode::NO_CONTENT
}

#[derive(Debug, Deserialize)]
pub struct HookBody {
    pub url: String,
    pub secret: SecretString,
}

/// `POST /_admin/webhooks` → `{"id"}`.
pub async fn add_hook(State(fake): Fake, Json(b): Json<HookBody>) -> Json<Value> {
    let mut world = fake.world();
    let id = world.hooks.len() as u64 + 1;
    world.hooks.push(Hook {
        id,
        url: b.url,
        secret: b.secret,
    });
    Json(json!({"id": id}))
}

/// `PUT /_admin/webhooks/controls`.
pub async fn set_controls(State(fake): Fake, Json(b): Json<WebhookControls>) -> StatusCode {
    fake.world().webhook_controls = b;
    StatusCode::NO_CONTENT
}

/// `GET /_admin/deliveries`.
pub async fn deliveries(State(fake): Fake) -> Json<Value> {
    let world = fake.world();
    rows(world.deliveries.iter(), |d| {
        json!({
            "guid": d.guid, "hook_id": d.hook_id, "event": "workflow_job",
            "action": d.action, "job_id": d.job_id, "dropped": d.dropped,
            "attempts": d.attempts,
            // What a captured delivery carries, for replay tests (its signature is the
            // HMAC of exactly these bytes).
            "body": String::from_utf8_lossy(&d.body),
        })
    })
}

/// `POST /_admin/deliveries/{guid}/redeliver`.
pub async fn redeliver(
    State(fake): Fake,
    Path(guid): Path<String>,
) -> Result<StatusCode, ApiError> {
    fake.redeliver(&guid)?;
    Ok(StatusCode::ACCEPTED)
}

#[derive(Debug, Deserialize)]
pub struct VersionBody {
    pub version: Option<String>,
}

/// `PUT /_admin/minimum-runner-version`: older runners are refused and exit 7.
pub async fn set_minimum_version(State(fake): Fake, Json(b): Json<VersionBody>) -> StatusCode {
    fake.world().minimum_runner_version = b.version;
    StatusCode::NO_CONTENT
}

/// `GET /_admin/package`: where the served stand-in package is and its digest.
pub async fn package(State(fake): Fake) -> Result<Json<Value>, ApiError> {
    let p = fake.package.as_ref().ok_or_else(ApiError::not_found)?;
    Ok(Json(json!({
        "version": p.version, "file_name": p.file_name, "sha256": p.sha256,
        "size": p.size, "path": p.path,
        "download_url": format!("{}/_downloads/{}", fake.base_url, p.file_name),
    })))
}

/// `POST /_admin/downloads`: the downloads listing also names this Linux package (of another
/// architecture; listed, not served).
pub async fn add_download(
    State(fake): Fake,
    Json(b): Json<super::state::ListedDownload>,
) -> StatusCode {
    fake.world().other_downloads.push(b);
    StatusCode::NO_CONTENT
}

/// Route table of the admin API.
#[derive(Debug, Deserialize)]
pub struct ReposBody {
    pub owner: String,
    /// Names to add.
    #[serde(default)]
    pub names: Vec<String>,
    /// Or this many, named `repo-<n>` (a large organization in one call).
    #[serde(default)]
    pub count: Option<u32>,
}

/// `POST /_admin/repos`: adds repositories to an organization (`GET /orgs/{org}/repos`).
pub async fn add_repos(State(fake): Fake, Json(b): Json<ReposBody>) -> Json<Value> {
    let mut world = fake.world();
    let generated = (0..b.count.unwrap_or(0)).map(|i| format!("repo-{i}"));
    for name in b.names.iter().cloned().chain(generated) {
        world.add_repo(&b.owner, &name);
    }
    Json(json!({"repositories": world.repos_of(&b.owner).len()}))
}

#[derive(Debug, Deserialize)]
pub struct EnterpriseOrgsBody {
    pub organizations: Vec<String>,
}

/// `PUT /_admin/enterprises/{enterprise}/organizations`: the enterprise's organizations, as
/// GitHub's GraphQL API lists them.
pub async fn set_enterprise_orgs(
    State(fake): Fake,
    Path(enterprise): Path<String>,
    Json(b): Json<EnterpriseOrgsBody>,
) -> StatusCode {
    fake.world().enterprise_orgs.insert(
        enterprise.to_ascii_lowercase(),
        b.organizations
            .iter()
            .map(|o| o.to_ascii_lowercase())
            .collect(),
    );
    StatusCode::NO_CONTENT
}

/// `PUT /_admin/scale-sets/settings`: token lifetimes, the long-poll wait, session idling.
pub async fn set_scale_set_settings(
    State(fake): Fake,
    Json(b): Json<super::scaleset_world::Settings>,
) -> StatusCode {
    fake.world().scale_sets.settings = b;
    StatusCode::NO_CONTENT
}

/// `GET /_admin/scale-sets`: sets, live sessions, sessions opened, acquisitions.
pub async fn scale_sets(State(fake): Fake) -> Json<Value> {
    let world = fake.world();
    let w = &world.scale_sets;
    Json(json!({
        "sets": w.sets.values().map(|s| json!({"id": s.id, "name": s.name, "labels": s.labels,
            "runners": s.runners, "acquired": s.acquired})).collect::<Vec<_>>(),
        "sessions": w.sessions.iter().map(|(id, s)| json!({"id": id, "set": s.set, "owner": s.owner})).collect::<Vec<_>>(),
        "sessions_opened": w.sessions_opened,
        "acquired_by": w.acquired_by.iter().map(|(j, s)| json!([j, s])).collect::<Vec<_>>(),
    }))
}

pub fn router() -> axum::Router<Arc<FakeGithub>> {
    use axum::routing::{MethodRouter, get, post, put};
    // One row a route: the path and what answers it.
    #[rustfmt::skip]
    let routes: [(&str, MethodRouter<Arc<FakeGithub>>); 23] = [
        ("/_admin/app", post(register_app)),
        ("/_admin/installations", post(add_installation)),
        ("/_admin/pats", post(add_pat)),
        ("/_admin/runner-groups", post(add_group)),
        ("/_admin/jobs", post(queue_job)),
        ("/_admin/repos", post(add_repos)),
        ("/_admin/scale-sets", get(scale_sets)),
        ("/_admin/scale-sets/settings", put(set_scale_set_settings)),
        ("/_admin/enterprises/{enterprise}/organizations", put(set_enterprise_orgs)),
        ("/_admin/jobs/{id}", get(get_job)),
        ("/_admin/runners", get(list_runners)),
        ("/_admin/jits", get(issued_jits)),
        ("/_admin/mints", get(mints)),
        ("/_admin/faults", post(add_fault).delete(clear_faults)),
        ("/_admin/counters", get(counters).delete(reset_counters)),
        ("/_admin/rate-limits", post(set_rate_limit)),
        ("/_admin/webhooks", post(add_hook)),
        ("/_admin/webhooks/controls", put(set_controls)),
        ("/_admin/deliveries", get(deliveries)),
        ("/_admin/deliveries/{guid}/redeliver", post(redeliver)),
        ("/_admin/minimum-runner-version", put(set_minimum_version)),
        ("/_admin/package", get(package)),
        ("/_admin/downloads", post(add_download)),
    ];
    routes
        .into_iter()
        .fold(axum::Router::new(), |r, (path, method)| {
            r.route(path, method)
        })
}
