//! Credentials the fake accepts: the GitHub App's JWT (RS256), installation tokens minted from
//! it, and personal access tokens registered through the admin API. Tokens are stored only as
//! SHA-256 hashes.

use axum::http::{HeaderMap, StatusCode};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::error::ApiError;

/// GitHub refuses App JWTs that live longer than ten minutes.
pub const MAX_JWT_LIFETIME_SECS: i64 = 600;
/// Clock drift GitHub tolerates on `iat` and `exp`.
pub const CLOCK_SKEW_SECS: i64 = 60;
/// Installation tokens live one hour.
pub const INSTALLATION_TOKEN_TTL_SECS: i64 = 3600;

/// The one GitHub App the fake knows.
pub struct AppRegistration {
    pub app_id: u64,
    pub client_id: String,
    pub slug: String,
    pub public_key: DecodingKey,
}

impl std::fmt::Debug for AppRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppRegistration")
            .field("app_id", &self.app_id)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TargetType {
    Organization,
    User,
    Enterprise,
}

impl TargetType {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Organization => "Organization",
            Self::User => "User",
            Self::Enterprise => "Enterprise",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Installation {
    pub id: u64,
    pub account: String,
    pub target_type: TargetType,
    pub suspended: bool,
}

/// An installation token the fake minted.
#[derive(Debug, Clone)]
pub struct IssuedToken {
    pub installation_id: u64,
    pub expires_at: i64,
}

/// Who is calling a REST endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    Installation(u64),
    PersonalAccessToken,
}

#[derive(Debug, Deserialize)]
struct Claims {
    iss: Option<serde_json::Value>,
    iat: Option<i64>,
    exp: Option<i64>,
}

/// The token in `Authorization: Bearer …` or `Authorization: token …`.
#[must_use]
pub fn presented_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get("authorization")?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") || scheme.eq_ignore_ascii_case("token"))
        .then(|| token.trim())
}

/// SHA-256 hex of a token: what the fake keeps instead of the token.
#[must_use]
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A fresh random token with GitHub's prefix for its kind (`ghs_` installation, `ghr_` runner…).
#[must_use]
pub fn mint_token(prefix: &str) -> SecretString {
    let a = uuid::Uuid::new_v4().simple().to_string();
    let b = uuid::Uuid::new_v4().simple().to_string();
    SecretString::from(format!("{prefix}{a}{b}"))
}

fn jwt_error(message: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, message)
}

/// Verifies an App JWT the way GitHub does: RS256 signature against the App's public key,
/// `iss` equal to the App id (number or string) or its client id, `iat` not in the future,
/// `exp` in the future and at most ten minutes ahead (both with GitHub's drift allowance).
pub fn verify_app_jwt(app: &AppRegistration, jwt: &str, now: i64) -> Result<(), ApiError> {
    let mut validation = Validation::new(Algorithm::RS256);
    validation.validate_exp = false;
    validation.validate_aud = false;
    validation.required_spec_claims.clear();
    let data = jsonwebtoken::decode::<Claims>(jwt, &app.public_key, &validation)
        .map_err(|_| jwt_error("A JSON web token could not be decoded"))?;
    let claims = data.claims;
    let iss_ok = match &claims.iss {
        Some(serde_json::Value::Number(n)) => n.as_u64() == Some(app.app_id),
        Some(serde_json::Value::String(s)) => *s == app.app_id.to_string() || *s == app.client_id,
        _ => false,
    };
    if !iss_ok {
        return Err(jwt_error("'Issuer' claim ('iss') must be an Integer"));
    }
    let iat = claims.iat.ok_or_else(|| {
        jwt_error("'Issued at' claim ('iat') must be an Integer representing the time that the assertion was issued")
    })?;
    if iat > now + CLOCK_SKEW_SECS {
        return Err(jwt_error(
            "'Issued at' claim ('iat') must be an Integer representing the time that the assertion was issued",
        ));
    }
    let exp = claims.exp.ok_or_else(|| {
        jwt_error("'Expiration time' claim ('exp') must be a numeric value representing the future time at which the assertion expires")
    })?;
    if exp <= now {
        return Err(jwt_error(
            "'Expiration time' claim ('exp') must be a numeric value representing the future time at which the assertion expires",
        ));
    }
    if exp > now + MAX_JWT_LIFETIME_SECS + CLOCK_SKEW_SECS
        || exp - iat > MAX_JWT_LIFETIME_SECS + CLOCK_SKEW_SECS
    {
        return Err(jwt_error(
            "'Expiration time' claim ('exp') is too far in the future",
        ));
    }
    Ok(())
}
