//! The runner's side of the service. The real runner speaks the Actions broker protocol; the
//! stand-in needs only its shape: open a session with its JIT credentials (once), long-poll for a
//! job, report the job's completion, close the session.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use secrecy::ExposeSecret;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::fake_github::error::ApiError;
use crate::fake_github::jobs::Conclusion;
use crate::fake_github::state::FakeGithub;

/// Longest long poll the fake holds open.
const MAX_WAIT_SECS: u64 = 50;

/// The runner's credentials from its JIT settings. `Debug` redacts the secret.
#[derive(Debug, Deserialize)]
pub struct SessionRequest {
    pub client_id: String,
    pub client_secret: secrecy::SecretString,
    pub version: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct CompleteRequest {
    pub conclusion: Conclusion,
}

#[derive(Debug, Deserialize)]
pub struct PollQuery {
    pub wait_secs: Option<u64>,
}

pub async fn open_session(
    State(fake): State<Arc<FakeGithub>>,
    Json(req): Json<SessionRequest>,
) -> Result<Response, ApiError> {
    let token = fake.open_session(
        &req.client_id,
        req.client_secret.expose_secret(),
        &req.version,
    )?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"session_token": token.expose_secret()})),
    )
        .into_response())
}

pub async fn close_session(
    State(fake): State<Arc<FakeGithub>>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let runner = fake.session_runner(&headers)?;
    fake.close_session(runner);
    Ok(StatusCode::NO_CONTENT)
}

/// Long poll: answers 200 with a job as soon as one the runner can take is queued, 204 when
/// `wait_secs` pass without one.
pub async fn next_job(
    State(fake): State<Arc<FakeGithub>>,
    Query(q): Query<PollQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let runner = fake.session_runner(&headers)?;
    let wait = Duration::from_secs(q.wait_secs.unwrap_or(20).min(MAX_WAIT_SECS));
    let deadline = tokio::time::Instant::now() + wait;
    let mut changes = fake.subscribe();
    loop {
        // Mark the current generation seen before looking, so a change after the look wakes us.
        changes.borrow_and_update();
        if let Some(job) = fake.try_assign(runner)? {
            return Ok(Json(job).into_response());
        }
        match tokio::time::timeout_at(deadline, changes.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => return Ok(StatusCode::NO_CONTENT.into_response()),
        }
    }
}

pub async fn complete(
    State(fake): State<Arc<FakeGithub>>,
    Path(params): Path<BTreeMap<String, String>>,
    headers: HeaderMap,
    Json(req): Json<CompleteRequest>,
) -> Result<StatusCode, ApiError> {
    let runner = fake.session_runner(&headers)?;
    let job: u64 = params
        .get("job_id")
        .and_then(|s| s.parse().ok())
        .ok_or_else(ApiError::not_found)?;
    fake.complete_job(runner, job, req.conclusion)?;
    Ok(StatusCode::NO_CONTENT)
}
