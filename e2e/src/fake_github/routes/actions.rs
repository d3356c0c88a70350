//! Workflow runs and jobs of a repository.

use std::sync::Arc;

use axum::Json;
use axum::extract::{OriginalUri, Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::Value;

use super::pagination::{PageQuery, page_response};
use super::runners::{Params, scope_of};
use crate::fake_github::error::ApiError;
use crate::fake_github::jobs::Job;
use crate::fake_github::shapes;
use crate::fake_github::state::FakeGithub;

fn repo_jobs(fake: &FakeGithub, owner: &str, repo: &str) -> Vec<Job> {
    fake.world()
        .jobs
        .values()
        .filter(|j| j.owner.eq_ignore_ascii_case(owner) && j.repo.eq_ignore_ascii_case(repo))
        .cloned()
        .collect()
}

fn param<'a>(p: &'a std::collections::BTreeMap<String, String>, k: &str) -> &'a str {
    p.get(k).map_or("", String::as_str)
}

pub async fn list_runs(
    State(fake): State<Arc<FakeGithub>>,
    Path(params): Params,
    Query(query): Query<PageQuery>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    fake.authorize(&headers, &scope_of(&params)?)?;
    let mut jobs = repo_jobs(&fake, param(&params, "owner"), param(&params, "repo"));
    // Newest first, as GitHub lists runs.
    jobs.reverse();
    let runs: Vec<Value> = jobs
        .iter()
        .filter(|j| query.status.as_ref().is_none_or(|s| j.status.as_str() == s))
        .map(|j| shapes::workflow_run(&fake.base_url, j))
        .collect();
    Ok(page_response(
        &runs,
        "workflow_runs",
        &query,
        &fake.base_url,
        &uri,
    ))
}

pub async fn list_run_jobs(
    State(fake): State<Arc<FakeGithub>>,
    Path(params): Params,
    Query(query): Query<PageQuery>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    fake.authorize(&headers, &scope_of(&params)?)?;
    let run_id: u64 = param(&params, "run_id")
        .parse()
        .map_err(|_| ApiError::not_found())?;
    let jobs: Vec<Value> = repo_jobs(&fake, param(&params, "owner"), param(&params, "repo"))
        .iter()
        .filter(|j| j.run_id == run_id)
        .map(|j| shapes::job(&fake.base_url, j))
        .collect();
    if jobs.is_empty() {
        return Err(ApiError::not_found());
    }
    Ok(page_response(&jobs, "jobs", &query, &fake.base_url, &uri))
}

pub async fn get_job(
    State(fake): State<Arc<FakeGithub>>,
    Path(params): Params,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    fake.authorize(&headers, &scope_of(&params)?)?;
    let job_id: u64 = param(&params, "job_id")
        .parse()
        .map_err(|_| ApiError::not_found())?;
    repo_jobs(&fake, param(&params, "owner"), param(&params, "repo"))
        .iter()
        .find(|j| j.id == job_id)
        .map(|j| Json(shapes::job(&fake.base_url, j)))
        .ok_or_else(ApiError::not_found)
}
