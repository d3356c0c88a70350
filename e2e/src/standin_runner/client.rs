//! The stand-in's calls to the fake's runner protocol, with the retries a real runner makes
//! through transient failures (connection errors, 5xx, 429, anything with `retry-after`).

use std::time::Duration;

use reqwest::{Response, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use serde_json::json;

use crate::fake_github::jit::JitSettings;
use crate::fake_github::jobs::{AcquiredJob, Conclusion};

/// How long the runner keeps retrying one call before giving up.
const RETRY_BUDGET: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the service refused this runner version")]
    VersionDeprecated,
    #[error("the JIT configuration was already used")]
    JitAlreadyUsed,
    #[error("the runner registration is gone")]
    RegistrationGone,
    #[error("the service answered {0}")]
    Refused(u16),
    #[error("the service stayed unreachable or failing")]
    GaveUp,
}

/// A connected runner's client.
#[derive(Debug)]
pub struct RunnerClient {
    http: reqwest::Client,
    server_url: String,
    session: Option<SecretString>,
}

enum Attempt {
    Done(Response),
    Retry(Duration),
}

fn classify(result: reqwest::Result<Response>, backoff: Duration) -> Attempt {
    match result {
        Err(_) => Attempt::Retry(backoff),
        Ok(resp) => {
            let retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .map(Duration::from_secs);
            let s = resp.status();
            if let Some(wait) = retry_after {
                Attempt::Retry(wait)
            } else if s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS {
                Attempt::Retry(backoff)
            } else {
                Attempt::Done(resp)
            }
        }
    }
}

impl RunnerClient {
    #[must_use]
    pub fn new(server_url: &str) -> Self {
        Self {
            http: reqwest::Client::new(),
            server_url: server_url.trim_end_matches('/').to_owned(),
            session: None,
        }
    }

    async fn call(
        &self,
        make: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Result<Response, ClientError> {
        let deadline = tokio::time::Instant::now() + RETRY_BUDGET;
        let mut backoff = Duration::from_millis(100);
        loop {
            let mut req = make(&self.http);
            if let Some(token) = &self.session {
                req = req.bearer_auth(token.expose_secret());
            }
            match classify(req.send().await, backoff) {
                Attempt::Done(resp) => return Ok(resp),
                Attempt::Retry(wait) => {
                    if tokio::time::Instant::now() + wait > deadline {
                        return Err(ClientError::GaveUp);
                    }
                    tokio::time::sleep(wait).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// Opens the runner's session with the credentials from its JIT settings.
    pub async fn connect(
        &mut self,
        settings: &JitSettings,
        version: &str,
    ) -> Result<(), ClientError> {
        let body = json!({
            "client_id": settings.credentials.data.client_id,
            "client_secret": settings.rsa_params.d,
            "version": version,
        });
        let url = format!("{}/sessions", self.server_url);
        let resp = self.call(|c| c.post(&url).json(&body)).await?;
        match resp.status() {
            StatusCode::CREATED => {
                let v: serde_json::Value =
                    resp.json().await.map_err(|_| ClientError::Refused(201))?;
                let token = v
                    .get("session_token")
                    .and_then(|t| t.as_str())
                    .ok_or(ClientError::Refused(201))?;
                self.session = Some(SecretString::from(token.to_owned()));
                Ok(())
            }
            StatusCode::FORBIDDEN => {
                let text = resp.text().await.unwrap_or_default();
                if text.contains("deprecated") {
                    Err(ClientError::VersionDeprecated)
                } else {
                    Err(ClientError::Refused(403))
                }
            }
            StatusCode::CONFLICT => Err(ClientError::JitAlreadyUsed),
            StatusCode::NOT_FOUND => Err(ClientError::RegistrationGone),
            other => Err(ClientError::Refused(other.as_u16())),
        }
    }

    /// One long poll; `None` when it timed out without a job.
    pub async fn next_job(&self, wait_secs: u64) -> Result<Option<AcquiredJob>, ClientError> {
        let url = format!("{}/jobs/next?wait_secs={wait_secs}", self.server_url);
        let resp = self.call(|c| c.get(&url)).await?;
        match resp.status() {
            StatusCode::OK => resp
                .json()
                .await
                .map(Some)
                .map_err(|_| ClientError::Refused(200)),
            StatusCode::NO_CONTENT => Ok(None),
            StatusCode::NOT_FOUND | StatusCode::UNAUTHORIZED => Err(ClientError::RegistrationGone),
            other => Err(ClientError::Refused(other.as_u16())),
        }
    }

    pub async fn complete(&self, job_id: u64, conclusion: Conclusion) -> Result<(), ClientError> {
        let url = format!("{}/jobs/{job_id}/complete", self.server_url);
        let body = json!({"conclusion": conclusion});
        let resp = self.call(|c| c.post(&url).json(&body)).await?;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(ClientError::Refused(resp.status().as_u16()))
        }
    }

    /// Closes the session; the registration may already be gone after an ephemeral job.
    pub async fn disconnect(&self) {
        let url = format!("{}/sessions/current", self.server_url);
        let _ = self.http_delete(&url).await;
    }

    async fn http_delete(&self, url: &str) -> reqwest::Result<Response> {
        let mut req = self.http.delete(url);
        if let Some(token) = &self.session {
            req = req.bearer_auth(token.expose_secret());
        }
        req.send().await
    }
}
