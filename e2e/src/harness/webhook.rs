//! Posting `workflow_job` deliveries straight to an operator's webhook receiver, the way GitHub
//! sends them, for the scenarios that forge, replay or flood deliveries themselves.

/// POST the raw `body` to `url` as the `workflow_job` delivery `guid` signed `signature`; the
/// status the receiver answered.
pub async fn post_workflow_job(url: &str, guid: &str, signature: &str, body: Vec<u8>) -> u16 {
    reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("x-github-event", "workflow_job")
        .header("x-github-delivery", guid)
        .header("x-hub-signature-256", signature)
        .body(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"))
        .status()
        .as_u16()
}
