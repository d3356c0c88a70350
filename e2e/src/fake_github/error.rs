//! Error answers in GitHub's shape: `{"message", "documentation_url"}`.

use axum::Json;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

const DOCS: &str = "https://docs.github.com/rest";

#[derive(Debug, Clone, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub errors: Vec<String>,
    pub retry_after: Option<u64>,
}

impl ApiError {
    #[must_use]
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            errors: Vec::new(),
            retry_after: None,
        }
    }

    #[must_use]
    pub fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "Not Found")
    }

    #[must_use]
    pub fn unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "Bad credentials")
    }

    #[must_use]
    pub fn requires_auth() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "Requires authentication")
    }

    #[must_use]
    pub fn validation(message: impl Into<String>, errors: Vec<String>) -> Self {
        Self {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            message: message.into(),
            errors,
            retry_after: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"message": self.message, "documentation_url": DOCS});
        if !self.errors.is_empty() {
            body["errors"] = json!(self.errors);
        }
        let mut resp = (self.status, Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert("retry-after", HeaderValue::from(secs));
        }
        resp
    }
}
