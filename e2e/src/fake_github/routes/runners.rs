//! Self-hosted runner endpoints at repository, organization and enterprise scope.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{FromRequestParts, OriginalUri, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use secrecy::ExposeSecret;
use serde_json::{Value, json};

use super::pagination::{PageQuery, page_response, paginate};
use crate::fake_github::auth;
use crate::fake_github::clock::{iso8601, unix_now};
use crate::fake_github::error::ApiError;
use crate::fake_github::scope::Scope;
use crate::fake_github::state::{FakeGithub, JitRequest};

pub type Params = Path<BTreeMap<String, String>>;

/// What a route without a body reads of its request, extracted in the order its handlers once
/// took them one by one: the fake, the path's parameters and the headers.
#[derive(Debug)]
pub struct Call {
    pub fake: Arc<FakeGithub>,
    pub params: BTreeMap<String, String>,
    pub headers: HeaderMap,
}

impl FromRequestParts<Arc<FakeGithub>> for Call {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        fake: &Arc<FakeGithub>,
    ) -> Result<Self, Response> {
        let Path(params) = Params::from_request_parts(parts, fake)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Self {
            fake: Arc::clone(fake),
            params,
            headers: parts.headers.clone(),
        })
    }
}

impl Call {
    /// The path parameter `k` (empty when the route has none).
    pub fn param(&self, k: &str) -> &str {
        self.params.get(k).map_or("", String::as_str)
    }

    /// The scope the path names, once the caller is authorized for it.
    pub fn authorized(&self) -> Result<Scope, ApiError> {
        let scope = scope_of(&self.params)?;
        self.fake.authorize(&self.headers, &scope)?;
        Ok(scope)
    }
}

/// What a paged list route reads of its request: a [`Call`]'s, then the page query and the URI
/// (for the `Link` header), in the order its handlers once took them one by one.
#[derive(Debug)]
pub struct Listing {
    call: Call,
    pub query: PageQuery,
    pub uri: Uri,
}

impl std::ops::Deref for Listing {
    type Target = Call;

    fn deref(&self) -> &Call {
        &self.call
    }
}

impl FromRequestParts<Arc<FakeGithub>> for Listing {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        fake: &Arc<FakeGithub>,
    ) -> Result<Self, Self::Rejection> {
        let call = Call::from_request_parts(parts, fake).await?;
        let Query(query) = Query::<PageQuery>::from_request_parts(parts, fake)
            .await
            .map_err(IntoResponse::into_response)?;
        let OriginalUri(uri) = OriginalUri::from_request_parts(parts, fake)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Self { call, query, uri })
    }
}

impl Listing {
    /// This request's page of `items`, and its `Link` header value.
    pub fn page<T: Clone>(&self, items: &[T]) -> (Vec<T>, Option<axum::http::HeaderValue>) {
        paginate(items, &self.query, &self.fake.base_url, &self.uri)
    }

    /// The answer `{"total_count", "<key>": <this page>}`, with its ETag ([`conditional`]) and
    /// `Link` header.
    pub fn counted(&self, items: &[Value], key: &str) -> Response {
        let (page, link) = self.page(items);
        let body = json!({"total_count": items.len(), key: page});
        conditional(&self.headers, &body, link)
    }
}

/// The scope named by a route's path parameters.
pub fn scope_of(params: &BTreeMap<String, String>) -> Result<Scope, ApiError> {
    match (
        params.get("owner"),
        params.get("repo"),
        params.get("org"),
        params.get("enterprise"),
    ) {
        (Some(o), Some(r), _, _) => Ok(Scope::repo(o, r)),
        (_, _, Some(o), _) => Ok(Scope::org(o)),
        (_, _, _, Some(e)) => Ok(Scope::enterprise(e)),
        _ => Err(ApiError::not_found()),
    }
}

fn runner_id(params: &BTreeMap<String, String>) -> Result<u64, ApiError> {
    params
        .get("runner_id")
        .and_then(|s| s.parse().ok())
        .ok_or_else(ApiError::not_found)
}

pub async fn list(l: Listing) -> Result<Response, ApiError> {
    let scope = scope_of(&l.params)?;
    l.fake.authorize(&l.headers, &scope)?;
    let mut world = l.fake.world();
    let ids: Vec<u64> = world
        .runners
        .values()
        .filter(|r| r.scope == scope)
        .filter(|r| l.query.name.as_ref().is_none_or(|n| r.name == *n))
        .map(|r| r.id)
        .collect();
    let all: Vec<Value> = ids.iter().filter_map(|id| world.runner_json(*id)).collect();
    drop(world);
    Ok(l.counted(&all, "runners"))
}

/// GitHub answers list endpoints with an ETag and honours If-None-Match with a 304 and no
/// body; clients use it to make unchanged inventory and polling passes cheap (a 304 costs no
/// rate-limit budget: the per-call layer gives it back).
pub fn conditional(
    headers: &HeaderMap,
    body: &Value,
    link: Option<axum::http::HeaderValue>,
) -> Response {
    let etag = etag_of(body);
    let unchanged = headers
        .get(axum::http::header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == etag);
    let mut resp = if unchanged {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        Json(body.clone()).into_response()
    };
    if let Ok(v) = axum::http::HeaderValue::from_str(&etag) {
        resp.headers_mut().insert(axum::http::header::ETAG, v);
    }
    if let Some(link) = link {
        resp.headers_mut().insert("link", link);
    }
    resp
}

/// A weak validator of a JSON body: `W/"<sha256 hex>"`.
fn etag_of(body: &Value) -> String {
    use sha2::{Digest, Sha256};
    format!(
        "W/\"{}\"",
        hex::encode(Sha256::digest(body.to_string().as_bytes()))
    )
}

pub async fn get(c: Call) -> Result<Json<Value>, ApiError> {
    let scope = c.authorized()?;
    let id = runner_id(&c.params)?;
    let mut world = c.fake.world();
    if world.runners.get(&id).is_none_or(|r| r.scope != scope) {
        return Err(ApiError::not_found());
    }
    world
        .runner_json(id)
        .map(Json)
        .ok_or_else(ApiError::not_found)
}

pub async fn delete(
    State(fake): State<Arc<FakeGithub>>,
    Path(params): Params,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let scope = scope_of(&params)?;
    fake.authorize(&headers, &scope)?;
    fake.delete_runner(&scope, runner_id(&params)?)?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn generate_jitconfig(
    State(fake): State<Arc<FakeGithub>>,
    Path(params): Params,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let scope = scope_of(&params)?;
    fake.authorize(&headers, &scope)?;
    let req: JitRequest = serde_json::from_slice(&body)
        .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, "Problems parsing JSON"))?;
    let (runner, jit) = fake.generate_jit(&scope, req)?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"runner": runner, "encoded_jit_config": jit.expose_secret()})),
    ))
}

pub async fn registration_token(
    State(fake): State<Arc<FakeGithub>>,
    Path(params): Params,
    headers: HeaderMap,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let scope = scope_of(&params)?;
    fake.authorize(&headers, &scope)?;
    // Registration tokens are for `config.sh`, which the stand-in does not support; the fake
    // hands one out so clients can exercise the call, and remembers nothing about it.
    let token = auth::mint_token("AAAA");
    // Remembered for the scale-set exchange (`POST /actions/runner-registration`).
    fake.world().scale_sets.registration_tokens.insert(
        auth::token_hash(token.expose_secret()),
        (scope, unix_now() + 3600),
    );
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "token": token.expose_secret(),
            "expires_at": iso8601(unix_now() + 3600),
        })),
    ))
}

pub async fn downloads(c: Call) -> Result<Json<Value>, ApiError> {
    c.authorized()?;
    let fake = &c.fake;
    let mut list: Vec<Value> = fake
        .package
        .iter()
        .map(|p| {
            json!({
                "os": "linux",
                "architecture": "x64",
                "download_url": format!("{}/_downloads/{}", fake.base_url, p.file_name),
                "filename": p.file_name,
                "sha256_checksum": p.sha256,
            })
        })
        .collect();
    list.extend(fake.world().other_downloads.iter().map(|d| {
        let mut entry = json!({
            "os": "linux",
            "architecture": d.architecture,
            "download_url": format!("{}/_downloads/{}", fake.base_url, d.filename),
            "filename": d.filename,
        });
        // GitHub's description has the checksum optional, never null.
        if let (Some(sha), Some(o)) = (&d.sha256, entry.as_object_mut()) {
            o.insert("sha256_checksum".into(), json!(sha));
        }
        entry
    }));
    Ok(Json(Value::Array(list)))
}

pub async fn groups(l: Listing) -> Result<Response, ApiError> {
    let scope = scope_of(&l.params)?;
    l.fake.authorize(&l.headers, &scope)?;
    let base = l.fake.base_url.clone();
    let groups: Vec<Value> = l
        .fake
        .world()
        .groups_of(&scope)
        .iter()
        .map(|g| {
            json!({
                "id": g.id,
                "name": g.name,
                "visibility": "all",
                "default": g.default,
                "runners_url": format!("{base}/{}/actions/runner-groups/{}/runners", scope.path(), g.id),
                "hosted_runners_url": format!("{base}/{}/actions/runner-groups/{}/hosted-runners", scope.path(), g.id),
                "inherited": false,
                "allows_public_repositories": false,
                "restricted_to_workflows": false,
                "selected_workflows": [],
                "workflow_restrictions_read_only": false,
            })
        })
        .collect();
    Ok(page_response(
        &groups,
        "runner_groups",
        &l.query,
        &base,
        &l.uri,
    ))
}
