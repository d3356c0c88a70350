//! The operator process: CRDs applied, broker certificate ensured; the JIT broker, the webhook
//! receiver and the health endpoints served on every replica; the controllers run on the one
//! replica holding the leader Lease (or on this one, without leader election) until SIGTERM.
//! Leadership lost means the process stops reconciling at once and exits non-zero.
//!
//! Start-up waits for an API server that does not answer (restarting, overloaded, unreachable)
//! instead of exiting: a leader that lost its Lease in an API server outage exits, and a new
//! process that exited again at each start would put the kubelet's crash-loop back-off (10 s,
//! 20 s, 40 s, …) between the API server's return and the admission webhook's, and every
//! agent's Lease and journal write waits for that webhook (issue 27 item 4: 4 restarts and the
//! agents' Leases renewed 84 s after a 34 s API server outage). The health endpoint is served
//! first, so the liveness probe does not kill a process that is only waiting.

use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use runner_manager_crds::names::ownership_label;
use secrecy::SecretString;
use tokio::net::TcpListener;

use crate::webhook::{self, WebhookConfig, WebhookReceiver};

use crate::admission::{self, Admission, review::Principals};
use crate::broker::authn::AgentIdentity;
use crate::broker::{server, tls};
use crate::cli::Cli;
use crate::controller::leader::{Elector, LeaderError};
use crate::controller::{
    self, Ctx, Settings, cache, events::Events, ledger_batch::LedgerBatches,
    sources::webhook::KubeSink, writes::Writer,
};
use crate::crd_apply::{apply_crds, check_crds};
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
    #[error(transparent)]
    Leadership(#[from] LeaderError),
    #[error("{0}: the URL {1}")]
    Url(&'static str, runner_manager_crds::hosts::UrlRefused),
    #[error("--github-ca-file {0}: {1}")]
    CaFile(std::path::PathBuf, String),
}

/// The CA certificates of `--github-ca-file`: every one of the PEM bundle, at least one.
fn extra_roots(path: &std::path::Path) -> Result<Vec<reqwest::Certificate>, RunError> {
    let pem = std::fs::read(path).map_err(|e| RunError::CaFile(path.to_owned(), e.to_string()))?;
    reqwest::Certificate::from_pem_bundle(&pem)
        .ok()
        .filter(|certs| !certs.is_empty())
        .ok_or_else(|| {
            RunError::CaFile(
                path.to_owned(),
                "holds no readable PEM certificate (it must hold the CA's certificate, -----BEGIN CERTIFICATE-----)".into(),
            )
        })
}

/// Select aws-lc-rs as the TLS crypto provider (the one the workspace compiles).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// Run until SIGTERM or SIGINT.
pub async fn run(cli: Cli) -> Result<(), RunError> {
    install_crypto_provider();
    check_admin_urls(&cli)?;
    crate::listen::Limits::configure(crate::listen::Limits {
        header_timeout: cli.listener_header_timeout,
        idle_timeout: cli.listener_idle_timeout,
        max_connections: usize::try_from(cli.listener_max_connections).unwrap_or(512),
        max_connections_per_peer: usize::try_from(cli.listener_max_connections_per_peer)
            .unwrap_or(256),
        ..crate::listen::Limits::default()
    });
    let config = kube::Config::infer()
        .await
        .map_err(|e| RunError::Config(e.to_string()))?;
    let kube = kube::Client::try_from(config)?;
    let metrics = Metrics::new();
    let readiness = Arc::new(crate::health::Readiness::default());
    let (health, health_addr) = bind(cli.metrics_addr).await?;
    let health_app = axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get({
                let readiness = readiness.clone();
                move || async move { readiness.report() }
            }),
        )
        .route(
            "/metrics",
            get({
                let metrics = metrics.clone();
                move |headers: axum::http::HeaderMap| async move {
                    let accept = headers.get(axum::http::header::ACCEPT);
                    metrics.response(accept.and_then(|a| a.to_str().ok()))
                }
            }),
        );
    let health_task = tokio::spawn(async move { axum::serve(health, health_app).await });
    let started = async {
        if cli.apply_crds {
            until_answered("applying the CRDs", || {
                apply_crds(&kube, "runner-manager-operator", Duration::from_secs(60))
            })
            .await?;
            tracing::info!("CRDs applied");
        } else {
            // Another owner applies them (`crds.managedBy: external`): read, never written.
            match until_answered("reading the CRDs", || check_crds(&kube)).await? {
                problems if problems.is_empty() => {
                    tracing::info!("CRDs current (applied by another owner)");
                }
                problems => tracing::error!(
                    error = %problems.join("; "),
                    "the installed CRDs are older than this operator and the API server drops \
                     what it writes to the fields they lack: apply the chart's crds/ (kubectl \
                     apply --server-side -f crds/) or let their owner sync them"
                ),
            }
        }
        let namespaces = Api::<Namespace>::all(kube.clone());
        let kube_system = until_answered("reading the kube-system namespace", || {
            namespaces.get("kube-system")
        })
        .await?;
        let certificate = until_answered("the broker certificate", || {
            tls::ensure(
                &kube,
                &cli.namespace,
                tls::serving_names(&cli.namespace, &cli.broker_service),
                cli.broker_cert_lifetime,
            )
        })
        .await?;
        Ok::<_, RunError>((kube_system, certificate))
    };
    let (kube_system, certificate) = tokio::select! {
        () = shutdown_signal() => {
            health_task.abort();
            tracing::info!("shutting down");
            return Ok(());
        }
        r = started => match r {
            Ok(v) => v,
            Err(e) => {
                health_task.abort();
                return Err(e);
            }
        },
    };
    let ownership = ownership_label(
        kube_system.metadata.uid.as_deref().unwrap_or_default(),
        &cli.namespace,
    );
    // Each replica issues its own serving certificate from the kept CA and the next one at two
    // thirds of its lifetime.
    let rotation = certificate.spawn_rotation();
    let github_config = GitHubConfig {
        api_base: cli.github_api_url.clone(),
        metrics: Some(metrics.clone()),
        max_response_bytes: cli.github_max_response_bytes,
        http_hosts: cli.allow_http_hosts.clone(),
        extra_roots: match &cli.github_ca_file {
            None => Vec::new(),
            Some(path) => extra_roots(path)?,
        },
        ..GitHubConfig::default()
    };
    // One client registry for the broker and the controllers (DESIGN deviation 17): one
    // installation token and one rate-limit budget per installation, whichever of them calls.
    let clients = Arc::new(
        Clients::new(kube.clone(), github_config).with_github_hosts(cli.github_hosts.clone()),
    );
    let broker = Arc::new(server::Broker {
        kube: kube.clone(),
        agents: AgentIdentity::new(
            cli.namespace.clone(),
            cli.agent_service_account.clone(),
            cli.agent_pod_selector.clone(),
            cli.agent_daemonset.clone(),
        ),
        clients: clients.clone(),
        ownership_label: ownership.clone(),
        metrics: Some(metrics.clone()),
        placeholders: cli.placeholder_spec(),
    });
    // The admission webhook shares the broker's CA and certificate (DESIGN §6), not its
    // listener (issue 28 item 5): each port has its own connection and in-flight bounds.
    let admission = Arc::new(Admission::new(
        kube.clone(),
        cli.namespace.clone(),
        Principals::new(
            &cli.namespace,
            &cli.agent_service_account,
            &cli.operator_service_account,
        ),
        AgentIdentity::new(
            cli.namespace.clone(),
            cli.agent_service_account.clone(),
            cli.agent_pod_selector.clone(),
            cli.agent_daemonset.clone(),
        ),
    ));
    let serving = tls::server_config(&certificate)?;
    let (broker_addr, broker_task) = server::start(cli.broker_addr, serving.clone(), broker)
        .await
        .map_err(|e| RunError::Bind(cli.broker_addr, e))?;
    let (admission_addr, admission_task) = admission::start(cli.admission_addr, serving, admission)
        .await
        .map_err(|e| RunError::Bind(cli.admission_addr, e))?;
    if let Some(name) = cli.admission_webhook_configuration.as_deref() {
        until_answered("the admission webhook's CA bundle", || {
            admission::inject_ca_bundle(&kube, name, &certificate.ca_pem)
        })
        .await?;
    }
    let writer = Writer {
        kube: kube.clone(),
        metrics: metrics.clone(),
        echoes: Default::default(),
    };
    // Every replica matches webhook deliveries against the policies, so every replica caches them.
    let touched_policies = cache::Touched::default();
    let policies = cache::policies(
        &kube,
        cli.watch_namespace.as_deref(),
        touched_policies.clone(),
        readiness.policies_synced(),
    );
    let (webhook, webhook_addr) = bind(cli.webhook_addr).await?;
    let webhook_task = tokio::spawn(serve_webhook(
        kube.clone(),
        cli.namespace.clone(),
        cli.webhook_secret_name.clone(),
        webhook,
        Arc::new(KubeSink {
            writer: writer.clone(),
            policies: policies.clone(),
            batches: LedgerBatches::default(),
            bindings: cli.owner_namespaces.clone(),
            hook_secrets: Default::default(),
        }),
        metrics.clone(),
        usize::try_from(cli.webhook_max_body_bytes).unwrap_or(webhook::DEFAULT_BODY_LIMIT),
    ));
    tracing::info!(
        broker = %broker_addr,
        admission = %admission_addr,
        health = %health_addr,
        webhook = %webhook_addr,
        ownership_label = %ownership,
        controllers = cli.controllers,
        "serving the JIT broker, the webhook receiver and health"
    );
    let result = if cli.controllers {
        let identity = cli.identity.clone().unwrap_or_else(|| {
            format!(
                "operator-{}",
                &uuid::Uuid::new_v4().simple().to_string()[..12]
            )
        });
        let ctx = Arc::new(Ctx {
            events: Events::new(writer.clone(), identity.clone()),
            writer,
            clients,
            caches: cache::Caches::start(
                &kube,
                &cli.namespace,
                cli.watch_namespace.as_deref(),
                (policies, touched_policies),
            ),
            settings: settings(&cli, ownership.clone()),
            metrics: metrics.clone(),
            leading_since: std::sync::OnceLock::new(),
        });
        let elector = cli
            .leader_election
            .then(|| Elector::new(kube.clone(), &cli.namespace, identity, cli.lease_duration));
        let lead = async {
            if let Some(elector) = &elector {
                elector.acquire().await;
                metrics.set_leader(true);
                tokio::select! {
                    () = leader_loops(ctx) => Ok(()),
                    lost = elector.hold() => Err(lost),
                }
            } else {
                metrics.set_leader(true);
                leader_loops(ctx).await;
                Ok(())
            }
        };
        let stopped = tokio::select! {
            () = shutdown_signal() => Ok(()),
            r = lead => r.map_err(RunError::from),
        };
        // The controllers stopped with `lead` above; only now may a standby take over. A lost
        // Lease is not ours to release.
        if stopped.is_ok()
            && let Some(elector) = &elector
        {
            elector.release().await;
        }
        stopped
    } else {
        shutdown_signal().await;
        Ok(())
    };
    match &result {
        Ok(()) => tracing::info!("shutting down"),
        Err(e) => tracing::error!(error = %e, "stopping at once"),
    }
    broker_task.abort();
    admission_task.abort();
    rotation.abort();
    health_task.abort();
    webhook_task.abort();
    result
}

/// A listener on `addr` and the address it got (port 0 picks one), or which address failed.
async fn bind(addr: std::net::SocketAddr) -> Result<(TcpListener, std::net::SocketAddr), RunError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| RunError::Bind(addr, e))?;
    let bound = listener.local_addr().map_err(|e| RunError::Bind(addr, e))?;
    Ok((listener, bound))
}

/// Whether a failed API call may succeed when retried as it is: the API server unreachable,
/// restarting or overloaded. A refusal (403, 404, 422…) is not: start-up exits on it, as before.
trait Unanswered {
    fn unanswered(&self) -> bool;
}

impl Unanswered for kube::Error {
    fn unanswered(&self) -> bool {
        match self {
            kube::Error::Api(s) => s.code >= 500 || s.code == 429,
            kube::Error::HyperError(_) | kube::Error::Service(_) => true,
            _ => false,
        }
    }
}

impl Unanswered for crate::crd_apply::CrdError {
    fn unanswered(&self) -> bool {
        match self {
            Self::Apply(_, e) => e.unanswered(),
            // Served late by a slow API server: asked again.
            Self::NotEstablished(..) => true,
        }
    }
}

impl Unanswered for tls::TlsError {
    fn unanswered(&self) -> bool {
        matches!(self, Self::Kube(e) if e.unanswered())
    }
}

/// Runs one start-up step until the API server answers it: a step that fails unanswered is
/// tried again (0.5 s, doubling to 5 s between tries), one that is refused returns its error.
async fn until_answered<T, E, F, Fut>(step: &'static str, mut call: F) -> Result<T, RunError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    E: Unanswered + std::fmt::Display + Into<RunError>,
{
    let mut delay = Duration::from_millis(500);
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(e) if e.unanswered() => {
                tracing::warn!(
                    stage = step,
                    error = %e,
                    retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    "the API server did not answer at start: waiting for it"
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn settings(cli: &Cli, ownership_label: String) -> Settings {
    Settings {
        namespace: cli.namespace.clone(),
        ownership_label,
        runner_mirror_url: cli.runner_mirror_url.clone(),
        observe_interval: cli.observe_interval,
        resync_interval: cli.resync_interval,
        orphan_grace: cli.orphan_grace,
        admission_timeout: cli.admission_timeout,
        node_lost_grace: cli.node_lost_grace,
        job_check_grace: cli.job_check_grace,
        attempt_history: cli.attempt_history,
        max_consecutive_failures: cli.max_consecutive_failures,
        replacement_backoff: cli.replacement_backoff,
        replacement_backoff_max: cli.replacement_backoff_max,
        owner_bindings: cli.owner_namespaces.clone(),
        hosts: host_policy(cli),
        max_runners_per_node: cli.max_runners_per_node,
    }
}

fn host_policy(cli: &Cli) -> crate::controller::resolve::HostPolicy {
    crate::controller::resolve::HostPolicy {
        github_hosts: cli.github_hosts.clone(),
        download_hosts: cli.download_hosts.clone(),
        http_hosts: cli.allow_http_hosts.clone(),
        mirror: cli.runner_mirror_url.clone(),
    }
}

/// The admin's own URLs obey the same scheme rule as the tenants': https, or http to a host on
/// `--allow-http-hosts`. Checked at start so a mistake stops the process with the flag's name.
fn check_admin_urls(cli: &Cli) -> Result<(), RunError> {
    for (flag, url) in [
        ("--github-api-url", cli.github_api_url.as_deref()),
        ("--runner-mirror-url", cli.runner_mirror_url.as_deref()),
    ] {
        if let Some(url) = url {
            runner_manager_crds::hosts::check_scheme(url, &cli.allow_http_hosts)
                .map_err(|e| RunError::Url(flag, e))?;
        }
    }
    Ok(())
}

/// Serve `POST /webhook` once the HMAC secret can be read (Secret `--webhook-secret-name`, key
/// `secret`, in the operator namespace). Until then deliveries get 503, and the Secret is looked
/// for again every few seconds.
async fn serve_webhook(
    kube: kube::Client,
    namespace: String,
    secret_name: String,
    listener: TcpListener,
    sink: Arc<KubeSink>,
    metrics: Arc<Metrics>,
    body_limit: usize,
) {
    use k8s_openapi::api::core::v1::Secret;
    // Until the secret is found, deliveries are answered 503 (GitHub records a failed delivery
    // that can be redelivered) from a clone of the same socket; then the receiver takes over.
    let sockets = listener.into_std().and_then(|l| {
        let spare = l.try_clone()?;
        Ok((TcpListener::from_std(l)?, TcpListener::from_std(spare)?))
    });
    let (interim_listener, listener) = match sockets {
        Ok(pair) => pair,
        Err(e) => {
            tracing::error!(error = %e, "webhook socket unusable");
            return;
        }
    };
    let (found, found_rx) = tokio::sync::oneshot::channel::<()>();
    let pending = axum::Router::new().route(
        "/webhook",
        axum::routing::post(|| async {
            (
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "webhook secret not configured",
            )
        }),
    );
    let limits = crate::listen::Limits::configured();
    let interim = tokio::spawn(async move {
        tokio::select! {
            () = crate::listen::serve(interim_listener, None, pending, limits) => {}
            _ = found_rx => {}
        }
    });
    let secrets = Api::<Secret>::namespaced(kube, &namespace);
    let receiver = loop {
        let found = secrets.get_opt(&secret_name).await;
        let value = found.ok().flatten().and_then(|s| {
            let bytes = s.data?.remove("secret")?.0;
            String::from_utf8(bytes).ok()
        });
        if let Some(v) = value {
            match WebhookReceiver::new(
                WebhookConfig {
                    body_limit,
                    ..WebhookConfig::new(SecretString::from(v))
                },
                sink.clone(),
                Some(metrics.clone()),
            ) {
                Ok(r) => break Arc::new(r),
                Err(e) => tracing::warn!(error = %e, "webhook secret unusable"),
            }
        } else {
            tracing::warn!(secret = %secret_name, "webhook secret not found (key `secret`); deliveries are answered 503 until it exists");
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    };
    let _ = found.send(());
    let _ = interim.await;
    crate::listen::serve(listener, None, webhook::router(receiver), limits).await;
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

/// What only the leader runs: the policy Controller, and beside it the deletion of scale sets
/// whose policies are gone or left the mode (`demand::scale_set::lifecycle`). Both stop together.
async fn leader_loops(ctx: Arc<Ctx>) {
    tokio::select! {
        () = controller::run(ctx.clone()) => {}
        () = controller::sources::scale_set::lifecycle::run(ctx) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("x", "X")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn start_up_waits_only_for_an_api_server_that_did_not_answer() {
        // Unreachable, restarting or overloaded: asked again.
        assert!(kube::Error::Service("connection refused".into()).unanswered());
        for code in [500, 502, 503, 504, 429] {
            assert!(api(code).unanswered(), "{code}");
        }
        assert!(crate::crd_apply::CrdError::Apply("x".into(), api(503)).unanswered());
        assert!(
            crate::crd_apply::CrdError::NotEstablished("x".into(), Duration::from_secs(1))
                .unanswered()
        );
        assert!(tls::TlsError::Kube(api(503)).unanswered());
        // A refusal is an answer: start-up exits on it and says why.
        for code in [400, 401, 403, 404, 409, 422] {
            assert!(!api(code).unanswered(), "{code}");
        }
        assert!(!crate::crd_apply::CrdError::Apply("x".into(), api(403)).unanswered());
        assert!(!tls::TlsError::Pem.unanswered());
        assert!(!tls::TlsError::Kube(api(403)).unanswered());
    }
}
