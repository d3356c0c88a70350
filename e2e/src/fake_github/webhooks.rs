//! `workflow_job` webhook deliveries: signed like GitHub's, with admin controls to drop, delay,
//! duplicate and re-deliver them.

use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// A configured webhook receiver.
#[derive(Debug, Clone)]
pub struct Hook {
    pub id: u64,
    pub url: String,
    pub secret: SecretString,
}

/// Admin controls, applied to the next deliveries.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WebhookControls {
    /// Deliveries to record but never send.
    #[serde(default)]
    pub drop_next: u32,
    /// Deliveries to send twice, with the same GUID.
    #[serde(default)]
    pub duplicate_next: u32,
    /// Delay before every delivery is sent (lets a test reorder or outrun them).
    #[serde(default)]
    pub delay_ms: u64,
}

/// The `action` of a `workflow_job` delivery: the status the job moved into (the same three
/// words, spelled the same on the wire).
pub type JobAction = super::jobs::JobStatus;

/// One sending attempt, as the admin API reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Attempt {
    /// The receiver's status, or `None` when the request failed.
    pub status: Option<u16>,
    pub redelivery: bool,
}

/// A delivery the fake generated, sent or not.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub guid: String,
    pub hook_id: u64,
    pub action: JobAction,
    pub job_id: u64,
    pub body: Arc<Vec<u8>>,
    pub dropped: bool,
    pub attempts: Vec<Attempt>,
}

/// What the sender task needs to send a delivery.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub guid: String,
    /// The job it is about: deliveries of one job go out in order, of different jobs at once.
    pub job_id: u64,
    pub hook_id: u64,
    pub url: String,
    pub secret: SecretString,
    pub body: Arc<Vec<u8>>,
    pub delay: Duration,
    pub redelivery: bool,
}

/// `sha256=<hex HMAC-SHA256 of the body>`, the `X-Hub-Signature-256` value.
#[must_use]
pub fn signature(secret: &SecretString, body: &[u8]) -> String {
    // HMAC accepts keys of any length, so the error arm is never taken.
    match <Hmac<Sha256> as KeyInit>::new_from_slice(secret.expose_secret().as_bytes()) {
        Ok(mut mac) => {
            mac.update(body);
            format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
        }
        Err(_) => String::new(),
    }
}

/// Checks a delivery's signature the way a receiver must (constant time).
#[must_use]
pub fn verify_signature(secret: &SecretString, body: &[u8], header: &str) -> bool {
    let Some(hex_sig) = header.strip_prefix("sha256=") else {
        return false;
    };
    let Ok(sig) = hex::decode(hex_sig) else {
        return false;
    };
    let Ok(mut mac) = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.expose_secret().as_bytes())
    else {
        return false;
    };
    mac.update(body);
    mac.verify_slice(&sig).is_ok()
}

/// Sends one delivery; returns the receiver's status, or `None` if it could not be reached.
pub async fn send(client: &reqwest::Client, out: &Outgoing) -> Option<u16> {
    let resp = client
        .post(&out.url)
        .header("content-type", "application/json")
        .header("user-agent", "GitHub-Hookshot/fake")
        .header("x-github-event", "workflow_job")
        .header("x-github-delivery", &out.guid)
        .header("x-github-hook-id", out.hook_id.to_string())
        .header("x-github-hook-installation-target-type", "repository")
        .header("x-hub-signature-256", signature(&out.secret, &out.body))
        .body(out.body.as_ref().clone())
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .ok()?;
    Some(resp.status().as_u16())
}
