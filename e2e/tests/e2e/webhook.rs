//! The operator's webhook receiver against the simulated GitHub: the fake signs and delivers
//! `workflow_job` webhooks to the receiver served on a loopback port, as GitHub would.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use runner_manager_e2e::harness::github::{ORG, SimulatedGitHub};
use runner_manager_e2e::harness::wait::until;
use runner_manager_operator::metrics::Metrics;
use runner_manager_operator::webhook::{
    JobAction, JobEvent, MemorySink, WebhookConfig, WebhookReceiver, router,
};
use secrecy::SecretString;
use serde_json::json;

const SECRET: &str = "the-hook-secret";
const WITHIN: Duration = Duration::from_secs(20);

struct Receiver {
    url: String,
    sink: Arc<MemorySink>,
    metrics: Arc<Metrics>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn serve_receiver() -> Receiver {
    runner_manager_operator::run::install_crypto_provider();
    let sink = Arc::new(MemorySink::default());
    let metrics = Metrics::new();
    let receiver = WebhookReceiver::new(
        WebhookConfig::new(SecretString::from(SECRET)),
        sink.clone(),
        Some(metrics.clone()),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/webhook", listener.local_addr().unwrap());
    let server =
        tokio::spawn(async move { axum::serve(listener, router(Arc::new(receiver))).await });
    Receiver {
        url,
        sink,
        metrics,
        server,
    }
}

async fn queue_job(github: &SimulatedGitHub, labels: &[&str]) -> u64 {
    let created = github
        .admin(
            "POST",
            "jobs",
            json!({"owner": ORG, "repo": "web", "labels": labels}),
        )
        .await
        .unwrap();
    created["job_id"].as_u64().unwrap()
}

/// The receivers' statuses for every delivery of a job, per hook id.
async fn statuses(github: &SimulatedGitHub, job: u64) -> Vec<(u64, Vec<Option<u64>>)> {
    let all = github.deliveries().await.unwrap();
    all.as_array()
        .unwrap()
        .iter()
        .filter(|d| d["job_id"].as_u64() == Some(job))
        .map(|d| {
            let attempts = d["attempts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a["status"].as_u64())
                .collect();
            (d["hook_id"].as_u64().unwrap(), attempts)
        })
        .collect()
}

fn queued_for(sink: &MemorySink, job: u64) -> Vec<JobEvent> {
    sink.events()
        .into_iter()
        .filter(|e| e.job_id == job && e.action == JobAction::Queued)
        .collect()
}

#[tokio::test]
async fn signed_deliveries_from_the_simulated_github_reach_the_sink_and_a_wrong_secret_is_refused()
{
    let github = SimulatedGitHub::start().await.unwrap();
    let rx = serve_receiver().await;
    let good = github
        .admin("POST", "webhooks", json!({"url": rx.url, "secret": SECRET}))
        .await
        .unwrap()["id"]
        .as_u64()
        .unwrap();
    let forged = github
        .admin(
            "POST",
            "webhooks",
            json!({"url": rx.url, "secret": "not-the-secret"}),
        )
        .await
        .unwrap()["id"]
        .as_u64()
        .unwrap();

    let job = queue_job(&github, &["self-hosted", "linux"]).await;

    // Both hooks' deliveries have been answered: the genuine one accepted, the other refused.
    let answered = until(WITHIN, "both deliveries answered", || async {
        let s = statuses(&github, job).await;
        (s.len() == 2 && s.iter().all(|(_, a)| !a.is_empty())).then_some(s)
    })
    .await
    .unwrap();
    for (hook, attempts) in &answered {
        let want = if *hook == good {
            202
        } else {
            assert_eq!(*hook, forged);
            401
        };
        assert_eq!(attempts, &[Some(want)], "hook {hook}");
    }
    let events = queued_for(&rx.sink, job);
    assert_eq!(events.len(), 1, "only the genuine delivery is handed on");
    let e = &events[0];
    assert_eq!(e.repository, format!("{ORG}/web"));
    assert_eq!(e.labels, ["self-hosted", "linux"]);
    assert_eq!(e.runner_name, None);
    assert!(e.run_id > 0);

    let text = rx.metrics.encode();
    assert!(
        text.contains(r#"runner_manager_webhook_deliveries_total{outcome="bad_signature"} 1"#),
        "{text}"
    );
    rx.server.abort();
}

#[tokio::test]
async fn a_duplicated_delivery_is_handed_on_once() {
    let github = SimulatedGitHub::start().await.unwrap();
    let rx = serve_receiver().await;
    github
        .admin("POST", "webhooks", json!({"url": rx.url, "secret": SECRET}))
        .await
        .unwrap();
    github
        .admin("PUT", "webhooks/controls", json!({"duplicate_next": 1}))
        .await
        .unwrap();

    let job = queue_job(&github, &["self-hosted"]).await;

    // One delivery (one GUID) sent twice; both answered with success.
    let attempts = until(WITHIN, "the duplicate answered", || async {
        let s = statuses(&github, job).await;
        (s.len() == 1 && s[0].1.len() == 2).then(|| s[0].1.clone())
    })
    .await
    .unwrap();
    assert_eq!(attempts, [Some(202), Some(200)]);
    assert_eq!(queued_for(&rx.sink, job).len(), 1);
    rx.server.abort();
}
