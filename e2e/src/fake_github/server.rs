//! Binding, routing, the per-call layer (faults, rate limits, counters) and the webhook sender.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post};
use futures_util::StreamExt;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::admin;
use super::clock::unix_now;
use super::endpoint::Endpoint;
use super::error::ApiError;
use super::ratelimit::ExceededStatus;
use super::routes::{actions, app, releases, runner_protocol, runners};
use super::state::{FakeGithub, PackageInfo};
use super::webhooks::{self, Outgoing};

/// The REST and runner-protocol routes, under the per-call layer.
fn api_routes() -> Router<Arc<FakeGithub>> {
    let mut r = Router::new();
    for prefix in [
        "/repos/{owner}/{repo}",
        "/orgs/{org}",
        "/enterprises/{enterprise}",
    ] {
        r = r
            .route(&format!("{prefix}/actions/runners"), get(runners::list))
            .route(
                &format!("{prefix}/actions/runners/{{runner_id}}"),
                get(runners::get).delete(runners::delete),
            )
            .route(
                &format!("{prefix}/actions/runners/generate-jitconfig"),
                post(runners::generate_jitconfig),
            )
            .route(
                &format!("{prefix}/actions/runners/registration-token"),
                post(runners::registration_token),
            )
            .route(
                &format!("{prefix}/actions/runners/downloads"),
                get(runners::downloads),
            );
    }
    // One row a route: the path and what answers it.
    #[rustfmt::skip]
    let routes: [(&str, MethodRouter<Arc<FakeGithub>>); 18] = [
        ("/orgs/{org}/actions/runner-groups", get(runners::groups)),
        ("/enterprises/{enterprise}/actions/runner-groups", get(runners::groups)),
        ("/repos/{owner}/{repo}/actions/runs", get(actions::list_runs)),
        ("/repos/{owner}/{repo}/actions/runs/{run_id}/jobs", get(actions::list_run_jobs)),
        ("/repos/{owner}/{repo}/actions/jobs/{job_id}", get(actions::get_job)),
        ("/repos/{owner}/{repo}/actions/runs/{run_id}", get(actions::get_run)),
        ("/orgs/{org}/repos", get(actions::list_org_repos)),
        ("/graphql", post(actions::graphql)),
        ("/repos/{owner}/{repo}/installation", get(app::installation)),
        ("/orgs/{org}/installation", get(app::installation)),
        ("/app/installations/{installation_id}/access_tokens", post(app::access_tokens)),
        ("/rate_limit", get(app::rate_limit)),
        ("/repos/{owner}/{repo}/releases/latest", get(releases::latest)),
        ("/_downloads/{file}", get(releases::download)),
        ("/_runner/sessions", post(runner_protocol::open_session)),
        ("/_runner/sessions/{session}", delete(runner_protocol::close_session)),
        ("/_runner/jobs/next", get(runner_protocol::next_job)),
        ("/_runner/jobs/{job_id}/complete", post(runner_protocol::complete)),
    ];
    for (path, method) in routes {
        r = r.route(path, method);
    }
    r.merge(super::scaleset::routes())
}

/// The whole application.
pub fn router(fake: Arc<FakeGithub>) -> Router {
    let api = api_routes().route_layer(middleware::from_fn_with_state(fake.clone(), per_call));
    // GitHub Enterprise Server serves the same REST API under `/api/v3`; answer there too, so a
    // client configured with a GHES base is exercised with its path prefix. (Calls under the
    // prefix are answered and authorized but not counted per endpoint.)
    Router::new()
        .nest("/api/v3", api.clone())
        .merge(api)
        .merge(admin::router())
        .with_state(fake)
}

/// A response whose body fails at once, so the server closes the connection without a
/// complete answer: what a client sees when GitHub's edge drops it.
fn dropped() -> Response {
    let stream = futures_util::stream::once(async {
        Err::<Vec<u8>, _>(std::io::Error::other("fault injection: dropped connection"))
    });
    Body::from_stream(stream).into_response()
}

/// The answer's status and headers, then half its body, then a broken connection: the client
/// knows the request took effect and cannot read what it returned.
async fn truncated(resp: Response) -> Response {
    let (parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let half = bytes.slice(..bytes.len() / 2);
    // The break comes a moment after the first half, so the status line and headers are on
    // the wire first, as when GitHub's edge loses a connection mid-answer.
    let stream = futures_util::stream::iter([0u8, 1]).then(move |i| {
        let half = half.clone();
        async move {
            if i == 0 {
                Ok::<_, std::io::Error>(half.to_vec())
            } else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Err(std::io::Error::other("fault injection: body lost"))
            }
        }
    });
    let mut parts = parts;
    // A declared length would let the client notice the truncation before reading; GitHub's
    // JSON answers are chunked anyway.
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from_stream(stream))
}

fn outcome(status: StatusCode) -> String {
    status.as_u16().to_string()
}

/// Faults first, then the rate-limit budget, then the handler; every answer is counted and the
/// REST ones carry rate-limit headers.
async fn per_call(
    State(fake): State<Arc<FakeGithub>>,
    matched: Option<MatchedPath>,
    req: Request,
    next: Next,
) -> Response {
    let Some(endpoint) = matched.and_then(|m| Endpoint::classify(req.method(), m.as_str())) else {
        return next.run(req).await;
    };
    let resource = endpoint.resource();
    let with_headers = |fake: &FakeGithub, mut resp: Response| {
        if let Some(res) = resource {
            let now = unix_now();
            let mut world = fake.world();
            world
                .bucket(res, now)
                .write_headers(res, resp.headers_mut());
        }
        resp
    };
    let mut lose_body = false;
    if let Some(fault) = fake.take_fault(endpoint) {
        lose_body = fault.lose_body;
        if fault.latency_ms > 0 {
            tokio::time::sleep(Duration::from_millis(fault.latency_ms)).await;
        }
        if fault.drop_connection {
            fake.count(endpoint, "dropped".into());
            return dropped();
        }
        if let Some(code) = fault.status {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut err = ApiError::new(status, "Fault injected by fake-github");
            err.retry_after = fault.retry_after_secs;
            fake.count(endpoint, outcome(status));
            return with_headers(&fake, err.into_response());
        }
    }
    if let Some(res) = resource {
        let now = unix_now();
        let refused = {
            let mut world = fake.world();
            let bucket = world.bucket(res, now);
            (!bucket.take(now)).then(|| (bucket.exceeded_status, bucket.reset_at - now))
        };
        if let Some((how, wait)) = refused {
            let status = match how {
                ExceededStatus::Forbidden => StatusCode::FORBIDDEN,
                ExceededStatus::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
            };
            let mut err = ApiError::new(
                status,
                format!("API rate limit exceeded for resource {}.", res.as_str()),
            );
            err.retry_after = Some(u64::try_from(wait.max(0)).unwrap_or(0));
            fake.count(endpoint, outcome(status));
            return with_headers(&fake, err.into_response());
        }
    }
    let resp = next.run(req).await;
    fake.count(endpoint, outcome(resp.status()));
    if resp.status() == StatusCode::NOT_MODIFIED
        && let Some(res) = resource
    {
        // A conditional request answered 304 costs no budget at GitHub.
        fake.world().bucket(res, unix_now()).give_back();
    }
    if lose_body {
        return with_headers(&fake, truncated(resp).await);
    }
    with_headers(&fake, resp)
}

/// Delivery lanes: GitHub sends deliveries concurrently, each its own HTTP request. The fake
/// keeps one job's deliveries in order (a lane per job, by id) and sends different jobs' at
/// once, so a burst of 50 queued jobs is not 50 round trips one after the other.
const LANES: u64 = 8;

/// Sends queued deliveries, in order within a job's lane; a delayed one goes on its own task so
/// later ones can overtake it, as GitHub's can.
async fn webhook_sender(fake: Arc<FakeGithub>, mut rx: mpsc::UnboundedReceiver<Outgoing>) {
    let client = reqwest::Client::new();
    let lanes: Vec<mpsc::UnboundedSender<Outgoing>> = (0..LANES)
        .map(|_| {
            let (tx, mut lane) = mpsc::unbounded_channel::<Outgoing>();
            let fake = fake.clone();
            let client = client.clone();
            tokio::spawn(async move {
                while let Some(out) = lane.recv().await {
                    let status = webhooks::send(&client, &out).await;
                    fake.record_attempt(&out.guid, status, out.redelivery);
                }
            });
            tx
        })
        .collect();
    while let Some(out) = rx.recv().await {
        if out.delay.is_zero() {
            // The lane count is a small constant: the index always fits.
            let lane = usize::try_from(out.job_id % LANES).unwrap_or(0);
            let _ = lanes[lane].send(out);
        } else {
            let fake = fake.clone();
            let client = client.clone();
            tokio::spawn(async move {
                tokio::time::sleep(out.delay).await;
                let status = webhooks::send(&client, &out).await;
                fake.record_attempt(&out.guid, status, out.redelivery);
            });
        }
    }
}

/// A fake serving on a loopback port.
#[derive(Debug)]
pub struct RunningFake {
    pub base_url: String,
    pub addr: SocketAddr,
    pub fake: Arc<FakeGithub>,
    pub server: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Like [`start`], served over HTTPS, as a GitHub Enterprise Server whose certificate an
/// internal CA signed looks to the operator and the agent: a fresh private CA signs a serving
/// certificate for `127.0.0.1` and `localhost`. Returns the fake and the CA's certificate (PEM),
/// which nothing trusts unless told to.
pub async fn start_tls(
    addr: SocketAddr,
    package: Option<PackageInfo>,
) -> std::io::Result<(RunningFake, String)> {
    use runner_manager_operator::broker::tls::{generate_ca, issue};
    use secrecy::ExposeSecret;
    let other = |e: &dyn std::fmt::Display| std::io::Error::other(e.to_string());
    let (ca_pem, ca_key) = generate_ca().map_err(|e| other(&e))?;
    let (cert_pem, key_pem) = issue(
        &ca_key,
        &["127.0.0.1".to_owned(), "localhost".to_owned()],
        Duration::from_secs(24 * 3600),
    )
    .map_err(|e| other(&e))?;
    let certs = rustls_pemfile::certs(&mut cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?;
    let key = rustls_pemfile::private_key(&mut key_pem.expose_secret().as_bytes())?
        .ok_or_else(|| std::io::Error::other("the issued key is not PEM"))?;
    // aws-lc-rs, the one provider the workspace compiles (a second install is refused, harmlessly).
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let tls = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| other(&e))?;
    Ok((serve_on(addr, package, Some(tls)).await?, ca_pem))
}

/// Binds `addr` (port 0 picks a free one), starts serving and the webhook sender.
pub async fn start(addr: SocketAddr, package: Option<PackageInfo>) -> std::io::Result<RunningFake> {
    serve_on(addr, package, None).await
}

/// The fake on `addr`, over plain http or through `tls`, with its webhook sender.
async fn serve_on(
    addr: SocketAddr,
    package: Option<PackageInfo>,
    tls: Option<rustls::ServerConfig>,
) -> std::io::Result<RunningFake> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let base_url = format!("{scheme}://{addr}");
    let (fake, rx) = FakeGithub::new(base_url.clone(), package);
    tokio::spawn(webhook_sender(fake.clone(), rx));
    let app = router(fake.clone());
    let server = match tls {
        None => tokio::spawn(async move { axum::serve(listener, app).await }),
        Some(tls) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
            tokio::spawn(async move {
                runner_manager_operator::listen::serve(
                    listener,
                    Some(acceptor),
                    app,
                    runner_manager_operator::listen::Limits::default(),
                )
                .await;
                Ok(())
            })
        }
    };
    Ok(RunningFake {
        base_url,
        addr,
        fake,
        server,
    })
}
