//! Serving the two listeners strangers can reach (the webhook receiver and the broker) without
//! letting an unauthenticated client hold them (issue 13, finding 9): at most
//! `max_connections` open at once (more wait in the kernel's backlog), the TLS handshake and
//! every request's headers within `header_timeout` (hyper's header read timeout), the whole
//! request — body included — within `request_timeout` (tower-http, answered 408), at most
//! `max_in_flight` requests being handled at once (tower's concurrency limit, which also bounds
//! HTTP/2 streams), and a connection with no byte in either direction for `idle_timeout` closed.
//! Bodies are limited by each router before anything is authenticated.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::http::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::time::{Instant, Sleep};
use tokio_rustls::TlsAcceptor;

/// The limits of one listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// TLS handshake, and each request's headers.
    pub header_timeout: Duration,
    /// One request from its first byte to its answer (the body is read inside).
    pub request_timeout: Duration,
    /// No byte in either direction for this long closes the connection.
    pub idle_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
    /// Requests being handled at once (across connections and HTTP/2 streams).
    pub max_in_flight: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(90),
            max_connections: 512,
            max_in_flight: 64,
        }
    }
}

static CONFIGURED: std::sync::OnceLock<Limits> = std::sync::OnceLock::new();

impl Limits {
    /// Set the process's limits (from the command line) once, before serving.
    pub fn configure(limits: Self) {
        let _ = CONFIGURED.set(limits);
    }

    /// The process's limits: as configured, else the defaults.
    pub fn configured() -> Self {
        CONFIGURED.get().copied().unwrap_or_default()
    }
}

/// A stream that fails with `TimedOut` once nothing was read or written for its timeout.
#[derive(Debug)]
pub struct IdleTimeout<T> {
    inner: T,
    timeout: Duration,
    sleep: Pin<Box<Sleep>>,
}

impl<T> IdleTimeout<T> {
    pub fn new(inner: T, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            sleep: Box::pin(tokio::time::sleep(timeout)),
        }
    }

    fn progressed(&mut self) {
        self.sleep.as_mut().reset(Instant::now() + self.timeout);
    }

    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.sleep.as_mut().poll(cx).is_ready()
    }
}

fn idle() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "connection idle")
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleTimeout<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    self.progressed();
                }
                Poll::Ready(r)
            }
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(idle())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.progressed();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(idle())),
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The router with the per-request limits (request timeout, concurrency) applied.
pub fn limited(app: axum::Router, limits: &Limits) -> axum::Router {
    app.layer(tower_http::timeout::TimeoutLayer::with_status_code(
        StatusCode::REQUEST_TIMEOUT,
        limits.request_timeout,
    ))
    .layer(tower::limit::GlobalConcurrencyLimitLayer::new(
        limits.max_in_flight,
    ))
}

/// Serve `app` on `listener` (through `tls` when given) until the task is dropped. Each
/// connection is its own task, holding one of `max_connections` permits; each request carries
/// its connection's peer as [`ConnectInfo`].
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    app: axum::Router,
    limits: Limits,
) {
    let app = limited(app, &limits);
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        let app = app
            .clone()
            .layer(axum::Extension(ConnectInfo::<SocketAddr>(peer)));
        let tls = tls.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let stream = IdleTimeout::new(stream, limits.idle_timeout);
            match tls {
                Some(acceptor) => {
                    let Ok(Ok(stream)) =
                        tokio::time::timeout(limits.header_timeout, acceptor.accept(stream)).await
                    else {
                        return;
                    };
                    serve_connection(stream, app, &limits).await;
                }
                None => serve_connection(stream, app, &limits).await,
            }
        });
    }
}

async fn serve_connection<S>(stream: S, app: axum::Router, limits: &Limits)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper_util::service::TowerToHyperService::new(app);
    let mut builder =
        hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(64 * 1024);
    builder
        .http2()
        .timer(hyper_util::rt::TokioTimer::new())
        .max_concurrent_streams(u32::try_from(limits.max_in_flight).unwrap_or(u32::MAX))
        .keep_alive_interval(limits.idle_timeout / 2)
        .keep_alive_timeout(limits.header_timeout);
    let _ = builder
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn an_idle_stream_times_out_and_a_busy_one_does_not() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut s = IdleTimeout::new(a, Duration::from_millis(400));
        let mut buf = [0u8; 4];
        // A byte every 200 ms keeps it open well past 400 ms.
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            b.write_all(b"x").await.unwrap_or_default();
            let n = s.read(&mut buf).await.unwrap_or(0);
            assert_eq!(n, 1);
        }
        // Nothing for 400 ms: TimedOut.
        let e = s.read(&mut buf).await.err().map(|e| e.kind());
        assert_eq!(e, Some(io::ErrorKind::TimedOut));
    }
}
