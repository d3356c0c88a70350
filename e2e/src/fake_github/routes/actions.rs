//! Workflow runs and jobs of a repository.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::Value;

use super::runners::{Call, Listing, conditional, scope_of};
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

pub async fn list_runs(l: Listing) -> Result<Response, ApiError> {
    l.fake.authorize(&l.headers, &scope_of(&l.params)?)?;
    let mut jobs = repo_jobs(&l.fake, l.param("owner"), l.param("repo"));
    // Newest first, as GitHub lists runs.
    jobs.reverse();
    let runs: Vec<Value> = jobs
        .iter()
        .filter(|j| {
            l.query
                .status
                .as_ref()
                .is_none_or(|s| j.status.as_str() == s)
        })
        .map(|j| shapes::workflow_run(&l.fake.base_url, j))
        .collect();
    Ok(l.counted(&runs, "workflow_runs"))
}

pub async fn list_run_jobs(l: Listing) -> Result<Response, ApiError> {
    l.fake.authorize(&l.headers, &scope_of(&l.params)?)?;
    let run_id: u64 = l
        .param("run_id")
        .parse()
        .map_err(|_| ApiError::not_found())?;
    let jobs: Vec<Value> = repo_jobs(&l.fake, l.param("owner"), l.param("repo"))
        .iter()
        .filter(|j| j.run_id == run_id)
        .map(|j| shapes::job(&l.fake.base_url, j))
        .collect();
    if jobs.is_empty() {
        return Err(ApiError::not_found());
    }
    Ok(l.counted(&jobs, "jobs"))
}

/// The repository's job whose `id_of` is the path parameter `id_param` (authorized first).
fn repo_job_by(
    fake: &FakeGithub,
    params: &std::collections::BTreeMap<String, String>,
    headers: &HeaderMap,
    id_param: &str,
    id_of: fn(&Job) -> u64,
) -> Result<Job, ApiError> {
    fake.authorize(headers, &scope_of(params)?)?;
    let id: u64 = param(params, id_param)
        .parse()
        .map_err(|_| ApiError::not_found())?;
    repo_jobs(fake, param(params, "owner"), param(params, "repo"))
        .into_iter()
        .find(|j| id_of(j) == id)
        .ok_or_else(ApiError::not_found)
}

pub async fn get_job(c: Call) -> Result<Json<Value>, ApiError> {
    let job = repo_job_by(&c.fake, &c.params, &c.headers, "job_id", |j| j.id)?;
    Ok(Json(shapes::job(&c.fake.base_url, &job)))
}

/// `GET /repos/{owner}/{repo}/actions/runs/{run_id}`: the run (the fake has one job per run).
pub async fn get_run(c: Call) -> Result<Json<Value>, ApiError> {
    let job = repo_job_by(&c.fake, &c.params, &c.headers, "run_id", |j| j.run_id)?;
    Ok(Json(shapes::workflow_run(&c.fake.base_url, &job)))
}

/// `GET /orgs/{org}/repos`: the organization's repositories (those added by the admin API and
/// those a job was queued in), by name, paged, with an ETag. An installation token of the
/// organization and a PAT may list them.
pub async fn list_org_repos(l: Listing) -> Result<Response, ApiError> {
    let org = l.param("org").to_owned();
    l.fake
        .authorize(&l.headers, &crate::fake_github::scope::Scope::org(&org))?;
    let repos: Vec<Value> = l
        .fake
        .world()
        .repos_of(&org)
        .into_iter()
        .map(|(_, name)| shapes::minimal_repository(&l.fake.base_url, &org, &name))
        .collect();
    let (page, link) = l.page(&repos);
    // GitHub answers this one with a bare array.
    Ok(conditional(&l.headers, &Value::Array(page), link))
}

/// `POST /graphql`, for the one query the operator sends: an enterprise's organizations
/// (`enterprise(slug:) { organizations(first:, after:) { nodes { login } pageInfo { … } } }`),
/// paged by a cursor that is the index of the next organization. Anything else is answered with
/// a GraphQL error, as GitHub answers a query it cannot run (status 200, `errors`).
pub async fn graphql(
    State(fake): State<Arc<FakeGithub>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Result<Json<Value>, ApiError> {
    let query = body["query"].as_str().unwrap_or_default();
    let vars = &body["variables"];
    let Some(slug) = vars["slug"]
        .as_str()
        .filter(|_| query.contains("organizations"))
    else {
        return Ok(Json(serde_json::json!({
            "errors": [{"message": "fake-github answers only the enterprise organizations query"}]
        })));
    };
    fake.authorize(
        &headers,
        &crate::fake_github::scope::Scope::enterprise(slug),
    )?;
    let first = vars["first"].as_u64().unwrap_or(100).clamp(1, 100) as usize;
    let after: usize = vars["after"]
        .as_str()
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let Some(orgs) = fake
        .world()
        .enterprise_orgs
        .get(&slug.to_ascii_lowercase())
        .cloned()
    else {
        return Ok(Json(serde_json::json!({
            "data": {"enterprise": null},
            "errors": [{"type": "NOT_FOUND", "message": format!("Could not resolve to an Enterprise with the slug '{slug}'.")}]
        })));
    };
    let page: Vec<Value> = orgs
        .iter()
        .skip(after)
        .take(first)
        .map(|login| serde_json::json!({"login": login}))
        .collect();
    let next = after + page.len();
    Ok(Json(
        serde_json::json!({"data": {"enterprise": {"organizations": {
            "nodes": page,
            "pageInfo": {"hasNextPage": next < orgs.len(), "endCursor": next.to_string()}
        }}}}),
    ))
}
