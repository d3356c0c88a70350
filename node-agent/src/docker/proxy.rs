//! The job's Docker socket: an HTTP/1 proxy on a unix socket in the runner's directory, in front
//! of the attempt's own engine ([`super::engine`]). Every request is parsed, classified and
//! checked ([`super::rules`]) before one byte of it reaches the engine; a kept-alive connection
//! is parsed request by request, so a second request cannot slip past the first one's check.
//! `attach` and `exec start` upgrade the connection: the proxy forwards the upgrade and then
//! copies the raw stream both ways.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, TRANSFER_ENCODING};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};

use super::rules::{Endpoint, MAX_CHECKED_BODY, Refusal, Rules, classify, wait_query};

type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// One attempt's proxy: its rules and its engine's socket.
#[derive(Debug)]
pub struct Proxy {
    pub rules: Rules,
    pub engine: PathBuf,
    /// How long a request waits for an engine that is still starting (it starts beside the
    /// runner, not before it: a job's first `docker` call is seconds after the launch).
    pub engine_wait: Duration,
    /// Why this node runs no engine for the attempt (the launcher cannot, or the engine's unit
    /// was refused): every request is answered with it, so the job's `docker` says why.
    pub unavailable: Option<String>,
}

/// Serves `listener` until the returned task is aborted; aborting it ends every connection too.
pub fn spawn(listener: UnixListener, proxy: Arc<Proxy>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    let proxy = Arc::clone(&proxy);
                    connections.spawn(async move {
                        let service = hyper::service::service_fn(move |req| {
                            handle(Arc::clone(&proxy), req)
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .with_upgrades()
                            .await;
                    });
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
    })
}

fn full(body: impl Into<Bytes>) -> ProxyBody {
    Full::new(body.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

fn refused(attempt: &str, refusal: &Refusal) -> Response<ProxyBody> {
    tracing::warn!(
        attempt,
        reason = refusal.kind(),
        "a Docker request was refused: {refusal}"
    );
    let mut response = Response::new(full(refusal.response_body()));
    *response.status_mut() = StatusCode::FORBIDDEN;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn engine_unavailable(attempt: &str, why: &str) -> Response<ProxyBody> {
    tracing::warn!(attempt, "the job's Docker engine is not available: {why}");
    let body = serde_json::json!({
        "message": format!("runner-manager: this job's Docker engine is not available: {why}")
    });
    let mut response = Response::new(full(body.to_string()));
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

async fn connect_engine(proxy: &Proxy) -> std::io::Result<UnixStream> {
    let until = Instant::now() + proxy.engine_wait;
    loop {
        match UnixStream::connect(&proxy.engine).await {
            Ok(stream) => return Ok(stream),
            Err(e) if Instant::now() >= until => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// One request on a fresh connection to the engine (kept for an upgrade, if the engine answers
/// with one).
async fn send(
    stream: UnixStream,
    request: Request<ProxyBody>,
) -> Result<Response<Incoming>, hyper::Error> {
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection.with_upgrades());
    sender.send_request(request).await
}

async fn handle(
    proxy: Arc<Proxy>,
    mut req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let attempt = proxy.rules.attempt.as_str();
    if let Some(why) = &proxy.unavailable {
        return Ok(engine_unavailable(attempt, why));
    }
    let endpoint = match classify(req.method().as_str(), req.uri().path()) {
        Ok(e) => e,
        Err(refusal) => return Ok(refused(attempt, &refusal)),
    };
    // Taken before the request is forwarded: the job's side of an `attach` or `exec start`.
    let upgrade_from_job = hyper::upgrade::on(&mut req);
    let (mut parts, body) = req.into_parts();
    let body = if endpoint.checks_body() {
        let bytes = match Limited::new(body, MAX_CHECKED_BODY).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(_) => return Ok(refused(attempt, &Refusal::Body)),
        };
        let checked = match proxy.rules.check_body(endpoint, &bytes) {
            Ok(checked) => checked,
            Err(refusal) => return Ok(refused(attempt, &refusal)),
        };
        parts.headers.remove(TRANSFER_ENCODING);
        parts
            .headers
            .insert(CONTENT_LENGTH, HeaderValue::from(checked.len()));
        full(checked)
    } else {
        body.boxed()
    };
    let query = parts.uri.query().unwrap_or("");
    let rewritten = match endpoint {
        Endpoint::Build => match proxy.rules.check_build_query(query) {
            Ok(q) => Some(q),
            Err(refusal) => return Ok(refused(attempt, &refusal)),
        },
        Endpoint::Wait => Some(wait_query(query)),
        Endpoint::Pass
        | Endpoint::ContainerCreate
        | Endpoint::ExecCreate
        | Endpoint::VolumeCreate
        | Endpoint::NetworkCreate => None,
    };
    if let Some(query) = rewritten {
        let Ok(uri) = format!("{}?{query}", parts.uri.path()).parse() else {
            return Ok(refused(attempt, &Refusal::Body));
        };
        parts.uri = uri;
    }
    let stream = match connect_engine(&proxy).await {
        Ok(s) => s,
        Err(e) => {
            let why = format!("it did not answer on its socket ({})", e.kind());
            return Ok(engine_unavailable(attempt, &why));
        }
    };
    let mut response = match send(stream, Request::from_parts(parts, body)).await {
        Ok(r) => r,
        Err(e) => return Ok(engine_unavailable(attempt, &e.to_string())),
    };
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let upgrade_from_engine = hyper::upgrade::on(&mut response);
        tokio::spawn(async move {
            if let (Ok(job), Ok(engine)) = (upgrade_from_job.await, upgrade_from_engine.await) {
                let _ = tokio::io::copy_bidirectional(
                    &mut TokioIo::new(job),
                    &mut TokioIo::new(engine),
                )
                .await;
            }
        });
    }
    let (parts, body) = response.into_parts();
    Ok(Response::from_parts(parts, body.boxed()))
}

/// What a job left in its engine, counted when its runner has ended, before the engine goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    pub containers: usize,
    pub volumes: usize,
    pub networks: usize,
    pub images: usize,
}

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Counts what the engine at `socket` holds (the default network aside). `None`: the engine did
/// not answer (it is stopped and removed all the same).
pub async fn leftovers(socket: &std::path::Path) -> Option<Leftovers> {
    async fn count(
        socket: &std::path::Path,
        path: &str,
        key: Option<&str>,
        skip: &[&str],
    ) -> Option<usize> {
        let stream = UnixStream::connect(socket).await.ok()?;
        let request = Request::get(path)
            .header(hyper::header::HOST, "docker")
            .body(full(Bytes::new()))
            .ok()?;
        let response = send(stream, request).await.ok()?;
        let body = Limited::new(response.into_body(), 16 << 20)
            .collect()
            .await
            .ok()?
            .to_bytes();
        let value: serde_json::Value = serde_json::from_slice(&body).ok()?;
        let list = match key {
            Some(k) => value.get(k)?.as_array()?.clone(),
            None => value.as_array()?.clone(),
        };
        Some(
            list.iter()
                .filter(|item| {
                    let name = item.get("Name").and_then(serde_json::Value::as_str);
                    !name.is_some_and(|n| skip.contains(&n))
                })
                .count(),
        )
    }
    let within = Duration::from_secs(5);
    tokio::time::timeout(within, async {
        Some(Leftovers {
            containers: count(socket, "/containers/json?all=1", None, &[]).await?,
            volumes: count(socket, "/volumes", Some("Volumes"), &[]).await?,
            // The engine's own networks are not the job's.
            networks: count(
                socket,
                "/networks",
                None,
                &["podman", "bridge", "host", "none"],
            )
            .await?,
            images: count(socket, "/images/json", None, &[]).await?,
        })
    })
    .await
    .ok()
    .flatten()
}
