//! The operator process: CRDs applied, broker certificate ensured, the JIT broker and the health
//! endpoints served until SIGTERM. The controllers are not wired yet; the log says so.

use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use runner_manager_crds::names::ownership_label;
use tokio::net::TcpListener;

use crate::broker::authn::AgentIdentity;
use crate::broker::{server, tls};
use crate::cli::Cli;
use crate::crd_apply::apply_crds;
use crate::github::GitHubConfig;
use crate::github::registry::Clients;
use crate::metrics::Metrics;

/// Why the operator stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("kubeconfig: {0}")]
    Config(String),
    #[error("API server: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Crds(#[from] crate::crd_apply::CrdError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("binding {0}: {1}")]
    Bind(std::net::SocketAddr, std::io::Error),
}

/// Select aws-lc-rs as the TLS crypto provider (the one the workspace compiles).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// Run until SIGTERM or SIGINT.
pub async fn run(cli: Cli) -> Result<(), RunError> {
    install_crypto_provider();
    let config = kube::Config::infer()
        .await
        .map_err(|e| RunError::Config(e.to_string()))?;
    let kube = kube::Client::try_from(config)?;
    if cli.apply_crds {
        apply_crds(&kube, "runner-manager-operator", Duration::from_secs(60)).await?;
        tracing::info!("CRDs applied");
    }
    let kube_system = Api::<Namespace>::all(kube.clone())
        .get("kube-system")
        .await?;
    let ownership = ownership_label(
        kube_system.metadata.uid.as_deref().unwrap_or_default(),
        &cli.namespace,
    );
    let certificate = tls::ensure(
        &kube,
        &cli.namespace,
        tls::serving_names(&cli.namespace, &cli.broker_service),
    )
    .await?;
    let metrics = Metrics::new();
    let broker = Arc::new(server::Broker {
        kube: kube.clone(),
        agents: AgentIdentity {
            namespace: cli.namespace.clone(),
            service_account: cli.agent_service_account.clone(),
            pod_labels: cli.agent_pod_selector.clone(),
        },
        clients: Clients::new(
            kube.clone(),
            GitHubConfig {
                api_base: cli.github_api_url.clone(),
                metrics: Some(metrics.clone()),
                ..GitHubConfig::default()
            },
        ),
        ownership_label: ownership.clone(),
        metrics: Some(metrics.clone()),
    });
    let (broker_addr, broker_task) =
        server::start(cli.broker_addr, tls::server_config(&certificate)?, broker)
            .await
            .map_err(|e| RunError::Bind(cli.broker_addr, e))?;
    let health = TcpListener::bind(cli.metrics_addr)
        .await
        .map_err(|e| RunError::Bind(cli.metrics_addr, e))?;
    let health_addr = health
        .local_addr()
        .map_err(|e| RunError::Bind(cli.metrics_addr, e))?;
    let health_app = axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .route("/metrics", get(move || async move { metrics.encode() }));
    let health_task = tokio::spawn(async move { axum::serve(health, health_app).await });
    tracing::info!(
        broker = %broker_addr,
        health = %health_addr,
        ownership_label = %ownership,
        "serving the JIT broker; the policy and attempt controllers are not part of this build"
    );
    shutdown_signal().await;
    tracing::info!("shutting down");
    broker_task.abort();
    health_task.abort();
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
