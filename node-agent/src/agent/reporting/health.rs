//! The agent's small HTTP listener (`--health-addr`): `/metrics` (OpenMetrics text),
//! `/healthz` (the process answers: liveness) and `/readyz` (200 only while the agent can take
//! work: it holds the host fence, renewed its node Lease within three heartbeats, its startup
//! recovery gate is open and its launcher was set up; 503 naming what is missing otherwise).
//! A broken agent version therefore never becomes Ready, and the DaemonSet's rolling update
//! (maxUnavailable 1) stops at the first node.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use runner_manager_telemetry::exposition;
use tokio::net::TcpListener;

use crate::agent::metrics::Now;
use crate::agent::node::Agent;

/// What readiness needs, as of now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Readiness {
    pub fence_held: bool,
    /// Since the last successful Lease renewal (`None` before the first).
    pub lease_age: Option<Duration>,
    pub heartbeat: Duration,
    pub recovery_complete: bool,
    pub launcher_ready: bool,
}

impl Readiness {
    /// What is missing, in a fixed order; empty when ready. Pure.
    pub fn missing(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if !self.fence_held {
            out.push("host fence not held");
        }
        let fresh = self.heartbeat.saturating_mul(3);
        if self.lease_age.is_none_or(|age| age > fresh) {
            out.push("node Lease not renewed within three heartbeats");
        }
        if !self.recovery_complete {
            out.push("startup recovery not complete");
        }
        if !self.launcher_ready {
            out.push("launcher not ready");
        }
        out
    }
}

fn readiness(agent: &Agent) -> Readiness {
    Readiness {
        // The fence is taken before the listener starts and given up only as the process ends.
        fence_held: true,
        lease_age: agent.last_renewed().map(|t| t.elapsed()),
        heartbeat: agent.cluster.heartbeat,
        recovery_complete: agent.gate.is_complete(),
        // The launcher is set up before the listener starts; a launcher that cannot be set up
        // stops the process.
        launcher_ready: true,
    }
}

fn now(agent: &Agent) -> Now {
    let ready = readiness(agent);
    Now {
        capacity: agent.host.capacity,
        held: agent.book().held(),
        recovery_complete: ready.recovery_complete,
        recovery_blocked: agent.gate.blocked().is_some(),
        ready: ready.missing().is_empty(),
        heartbeat_age: ready.lease_age,
        cached_packages: crate::agent::lease::cached_packages(&agent.host.root.join("packages"))
            .len(),
    }
}

/// Binds `addr` and serves until the task is aborted; the bound address (port 0 is chosen by
/// the system).
pub async fn serve(
    agent: Arc<Agent>,
    addr: SocketAddr,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let ready_agent = agent.clone();
    let app = axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let agent = ready_agent.clone();
                async move {
                    let missing = readiness(&agent).missing();
                    if missing.is_empty() {
                        (StatusCode::OK, "ok".to_owned())
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, missing.join("; "))
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move |headers: axum::http::HeaderMap| {
                let agent = agent.clone();
                async move {
                    // OpenMetrics, or the Prometheus text format when the client asks for it.
                    let accept = headers.get(header::ACCEPT).and_then(|a| a.to_str().ok());
                    let (content_type, body) =
                        exposition::answer(accept, agent.metrics().encode(&now(&agent)));
                    ([(header::CONTENT_TYPE, content_type)], body).into_response()
                }
            }),
        );
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((bound, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_needs_the_fence_a_fresh_lease_recovery_and_the_launcher() {
        let ok = Readiness {
            fence_held: true,
            lease_age: Some(Duration::from_secs(5)),
            heartbeat: Duration::from_secs(10),
            recovery_complete: true,
            launcher_ready: true,
        };
        assert!(ok.missing().is_empty());
        assert_eq!(
            Readiness {
                lease_age: None,
                ..ok
            }
            .missing(),
            ["node Lease not renewed within three heartbeats"]
        );
        assert_eq!(
            Readiness {
                lease_age: Some(Duration::from_secs(31)),
                ..ok
            }
            .missing(),
            ["node Lease not renewed within three heartbeats"]
        );
        assert_eq!(
            Readiness {
                recovery_complete: false,
                launcher_ready: false,
                ..ok
            }
            .missing(),
            ["startup recovery not complete", "launcher not ready"]
        );
    }
}
