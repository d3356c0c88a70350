//! GitHub App endpoints (installation lookup, installation tokens) and `/rate_limit`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use secrecy::ExposeSecret;
use serde_json::{Value, json};

use super::runners::Params;
use crate::fake_github::auth::{self, INSTALLATION_TOKEN_TTL_SECS, Installation, IssuedToken};
use crate::fake_github::clock::{iso8601, unix_now};
use crate::fake_github::endpoint::Resource;
use crate::fake_github::error::ApiError;
use crate::fake_github::shapes;
use crate::fake_github::state::FakeGithub;

const PERMISSIONS: &str = r#"{"administration":"write","actions":"read","organization_self_hosted_runners":"write","metadata":"read"}"#;

fn permissions() -> Value {
    serde_json::from_str(PERMISSIONS).unwrap_or_else(|_| json!({}))
}

fn installation_json(base: &str, app_id: u64, slug: &str, inst: &Installation) -> Value {
    let account_id = shapes::name_id(&inst.account);
    let account = match inst.target_type {
        auth::TargetType::Enterprise => json!({
            "id": account_id,
            "node_id": format!("E_fake{account_id}"),
            "name": inst.account,
            "slug": inst.account,
            "html_url": format!("{base}/_html/enterprises/{}", inst.account),
            "website_url": null,
            "description": null,
            "created_at": iso8601(1_600_000_000),
            "updated_at": iso8601(1_600_000_000),
            "avatar_url": format!("{base}/_avatars/{account_id}"),
        }),
        other => shapes::simple_user(base, &inst.account, account_id, other.as_str()),
    };
    json!({
        "id": inst.id,
        "account": account,
        "repository_selection": "all",
        "access_tokens_url": format!("{base}/app/installations/{}/access_tokens", inst.id),
        "repositories_url": format!("{base}/installation/repositories"),
        "html_url": format!("{base}/_html/settings/installations/{}", inst.id),
        "app_id": app_id,
        "app_slug": slug,
        "target_id": account_id,
        "target_type": inst.target_type.as_str(),
        "permissions": permissions(),
        "events": ["workflow_job"],
        "created_at": iso8601(1_600_000_000),
        "updated_at": iso8601(1_600_000_000),
        "single_file_name": null,
        "suspended_by": null,
        "suspended_at": null,
    })
}

/// `GET /repos/{owner}/{repo}/installation` and `GET /orgs/{org}/installation` (App JWT).
pub async fn installation(
    State(fake): State<Arc<FakeGithub>>,
    Path(params): Params,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let app_id = fake.authenticate_app(&headers)?;
    let account = params
        .get("owner")
        .or_else(|| params.get("org"))
        .ok_or_else(ApiError::not_found)?;
    let world = fake.world();
    let slug = world
        .app
        .as_ref()
        .map_or("", |a| a.slug.as_str())
        .to_owned();
    world
        .installations
        .values()
        .find(|i| {
            i.account.eq_ignore_ascii_case(account) && i.target_type != auth::TargetType::Enterprise
        })
        .map(|i| Json(installation_json(&fake.base_url, app_id, &slug, i)))
        .ok_or_else(ApiError::not_found)
}

/// `POST /app/installations/{installation_id}/access_tokens` (App JWT).
pub async fn access_tokens(
    State(fake): State<Arc<FakeGithub>>,
    Path(params): Path<BTreeMap<String, String>>,
    headers: HeaderMap,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    fake.authenticate_app(&headers)?;
    let id: u64 = params
        .get("installation_id")
        .and_then(|s| s.parse().ok())
        .ok_or_else(ApiError::not_found)?;
    let mut world = fake.world();
    let inst = world
        .installations
        .get(&id)
        .cloned()
        .ok_or_else(ApiError::not_found)?;
    if inst.suspended {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "This installation has been suspended",
        ));
    }
    let token = auth::mint_token("ghs_");
    let expires_at = unix_now() + INSTALLATION_TOKEN_TTL_SECS;
    world.tokens.insert(
        auth::token_hash(token.expose_secret()),
        IssuedToken {
            installation_id: id,
            expires_at,
        },
    );
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "token": token.expose_secret(),
            "expires_at": iso8601(expires_at),
            "permissions": permissions(),
            "repository_selection": "all",
        })),
    ))
}

/// `GET /rate_limit`: not charged; shows every bucket.
pub async fn rate_limit(State(fake): State<Arc<FakeGithub>>) -> Json<Value> {
    let now = unix_now();
    let mut world = fake.world();
    let core = world.bucket(Resource::Core, now).to_json(now);
    let reg = world
        .bucket(Resource::ActionsRunnerRegistration, now)
        .to_json(now);
    let search = json!({"limit": 30, "remaining": 30, "reset": now + 60, "used": 0});
    Json(json!({
        "resources": {
            "core": core,
            "search": search,
            "actions_runner_registration": reg,
        },
        "rate": core,
    }))
}
