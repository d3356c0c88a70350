//! Serving the two listeners strangers can reach (the webhook receiver and the broker) without
//! letting an unauthenticated client hold them (issue 13, finding 9): at most
//! `max_connections` open at once (more wait in the kernel's backlog), the TLS handshake and
//! every request's headers within `header_timeout` (hyper's header read timeout), the whole
//! request — body included — within `request_timeout` (tower-http, answered 408), at most
//! `max_in_flight` requests being handled at once (tower's concurrency limit, which also bounds
//! HTTP/2 streams), and a connection with no byte in either direction for `idle_timeout` closed.
//! Bodies are limited by each router before anything is authenticated.
//!
//! One source address cannot take a whole listener (issue 28 item 5): it holds at most
//! `max_connections_per_peer` of the connections, and, where the listener sets
//! `max_in_flight_per_peer`, at most that many of the requests in flight — a request beyond it is
//! answered 429 at once rather than queued, so a flood never sits in the queue ahead of another
//! caller. [`PeerBudget`] is the token bucket the broker and the admission webhook spend before a
//! request costs the API server anything (a TokenReview, a pod read).

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
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
    /// Connections one source address may hold open at once; a connection beyond it is closed
    /// as soon as it is accepted.
    pub max_connections_per_peer: usize,
    /// Requests one source address may have in flight at once (beyond: 429 at once). `None` for
    /// a listener whose callers may all share one address (the broker: agents behind one SNAT
    /// address, or every agent of the test harness on loopback), which is protected by the
    /// budget of what an unknown caller may cost instead.
    pub max_in_flight_per_peer: Option<usize>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(90),
            max_connections: 512,
            max_in_flight: 64,
            max_connections_per_peer: 256,
            max_in_flight_per_peer: None,
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

/// The router with the per-request limits (request timeout, concurrency, per-peer in-flight)
/// applied. The per-peer check is the outermost layer: a request it refuses never waits for one
/// of the listener's in-flight permits.
pub fn limited(app: axum::Router, limits: &Limits) -> axum::Router {
    let app = app
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            limits.request_timeout,
        ))
        .layer(tower::limit::GlobalConcurrencyLimitLayer::new(
            limits.max_in_flight,
        ));
    match limits.max_in_flight_per_peer {
        None => app,
        Some(max) => {
            let slots = Arc::new(PeerSlots::default());
            app.layer(axum::middleware::from_fn(
                move |request: axum::extract::Request, next: axum::middleware::Next| {
                    let slots = slots.clone();
                    async move {
                        let peer = request
                            .extensions()
                            .get::<ConnectInfo<SocketAddr>>()
                            .map(|c| c.0.ip());
                        let _slot = match peer {
                            Some(ip) => match slots.try_take(ip, max) {
                                Some(slot) => Some(slot),
                                None => return too_many(),
                            },
                            None => None,
                        };
                        next.run(request).await
                    }
                },
            ))
        }
    }
}

fn too_many() -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(axum::http::header::RETRY_AFTER, "1")],
        "too many requests from this address\n",
    )
        .into_response()
}

/// How many of something (connections, requests) each source address holds. A slot is given
/// back when its [`PeerSlot`] drops; an address holding none has no entry, so the map is as
/// large as the set of addresses holding something, which the listener's own caps bound.
#[derive(Debug, Default)]
pub struct PeerSlots(Arc<std::sync::Mutex<std::collections::HashMap<IpAddr, usize>>>);

/// One slot of one address.
#[derive(Debug)]
pub struct PeerSlot {
    slots: Arc<std::sync::Mutex<std::collections::HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl PeerSlots {
    /// A slot for `ip`, unless it already holds `max`.
    pub fn try_take(&self, ip: IpAddr, max: usize) -> Option<PeerSlot> {
        let ip = ip.to_canonical();
        let mut held = self.0.lock().ok()?;
        let n = held.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            slots: self.0.clone(),
            ip,
        })
    }

    /// Slots `ip` holds now.
    pub fn held(&self, ip: IpAddr) -> usize {
        self.0
            .lock()
            .ok()
            .and_then(|h| h.get(&ip.to_canonical()).copied())
            .unwrap_or(0)
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        if let Ok(mut held) = self.slots.lock()
            && let Some(n) = held.get_mut(&self.ip)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

/// A token bucket per source address: what requests from one address may cost the API server
/// (TokenReviews of tokens the broker has not seen, reads of pods the webhook has not proven).
/// Each address starts with `burst` tokens and earns `per_second` back up to `burst`.
///
/// Hand-written rather than `governor`'s keyed limiter: it is these thirty lines and their
/// tests, against five more crates in the operator's build; and the map must stay bounded under
/// a flood from many addresses, which is one line here ([`BUDGET_ADDRESSES`]).
#[derive(Debug)]
pub struct PeerBudget {
    burst: f64,
    per_second: f64,
    buckets: std::sync::Mutex<std::collections::HashMap<IpAddr, (f64, Instant)>>,
}

/// Addresses a [`PeerBudget`] remembers at once. When full, the addresses whose buckets have
/// refilled are forgotten (they are as good as new); if that frees nothing, all are.
pub const BUDGET_ADDRESSES: usize = 4096;

impl PeerBudget {
    pub fn new(burst: u32, per_second: u32) -> Self {
        Self {
            burst: f64::from(burst.max(1)),
            per_second: f64::from(per_second),
            buckets: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Take one token of `ip`'s; `false` (nothing taken) when it has none left.
    pub fn try_spend(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        let now = Instant::now();
        let Ok(mut buckets) = self.buckets.lock() else {
            return false;
        };
        if buckets.len() >= BUDGET_ADDRESSES && !buckets.contains_key(&ip) {
            let (burst, rate) = (self.burst, self.per_second);
            buckets.retain(|_, (left, at)| {
                *left + rate * now.duration_since(*at).as_secs_f64() < burst
            });
            if buckets.len() >= BUDGET_ADDRESSES {
                buckets.clear();
            }
        }
        let (left, at) = buckets.entry(ip).or_insert((self.burst, now));
        *left = (*left + self.per_second * now.duration_since(*at).as_secs_f64()).min(self.burst);
        *at = now;
        if *left >= 1.0 {
            *left -= 1.0;
            true
        } else {
            false
        }
    }

    /// Give back a token spent on what turned out to be a known caller (a token that passed its
    /// review): a legitimate caller never runs its address's budget down.
    pub fn refund(&self, ip: IpAddr) {
        if let Ok(mut buckets) = self.buckets.lock()
            && let Some((left, _)) = buckets.get_mut(&ip.to_canonical())
        {
            *left = (*left + 1.0).min(self.burst);
        }
    }
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
    let peers = PeerSlots::default();
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        // Closed at once (the permit goes back with it): one address cannot hold the listener.
        let Some(peer_slot) = peers.try_take(peer.ip(), limits.max_connections_per_peer.max(1))
        else {
            tracing::debug!(peer = %peer.ip(), "connection refused: its address holds its share");
            continue;
        };
        let app = app
            .clone()
            .layer(axum::Extension(ConnectInfo::<SocketAddr>(peer)));
        let tls = tls.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _peer_slot = peer_slot;
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

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or(IpAddr::from([0, 0, 0, 0]))
    }

    #[test]
    fn an_address_holds_at_most_its_share_and_gets_slots_back() {
        let slots = PeerSlots::default();
        let a: Vec<_> = (0..3)
            .filter_map(|_| slots.try_take(ip("10.0.0.1"), 3))
            .collect();
        assert_eq!(a.len(), 3);
        assert!(slots.try_take(ip("10.0.0.1"), 3).is_none(), "a fourth of 3");
        // Another address is not touched by the first's share; nor is the IPv4-mapped form a
        // second address.
        assert!(slots.try_take(ip("10.0.0.2"), 3).is_some());
        assert!(slots.try_take(ip("::ffff:10.0.0.1"), 3).is_none());
        drop(a);
        assert_eq!(slots.held(ip("10.0.0.1")), 0);
        assert!(slots.try_take(ip("10.0.0.1"), 3).is_some());
    }

    #[test]
    fn a_budget_is_spent_per_address_and_refunds_give_it_back() {
        // No refill: the burst is all an address has.
        let budget = PeerBudget::new(4, 0);
        let spent = (0..10).filter(|_| budget.try_spend(ip("10.0.0.9"))).count();
        assert_eq!(spent, 4, "the burst, then nothing");
        assert!(
            budget.try_spend(ip("10.0.0.8")),
            "another address has its own"
        );
        budget.refund(ip("10.0.0.9"));
        assert!(budget.try_spend(ip("10.0.0.9")), "a refund is one more");
        assert!(!budget.try_spend(ip("10.0.0.9")));
    }

    #[test]
    fn a_budget_refills_at_its_rate() {
        let budget = PeerBudget::new(1, 1000);
        assert!(budget.try_spend(ip("10.0.0.7")));
        std::thread::sleep(Duration::from_millis(5));
        assert!(
            budget.try_spend(ip("10.0.0.7")),
            "1000/s refills one in 1 ms"
        );
    }

    #[test]
    fn a_flood_of_addresses_keeps_the_budget_map_bounded() {
        let budget = PeerBudget::new(2, 0);
        for i in 0..(BUDGET_ADDRESSES as u32 * 3) {
            budget.try_spend(IpAddr::from(i.to_be_bytes()));
        }
        let held = budget.buckets.lock().map(|b| b.len()).unwrap_or(usize::MAX);
        assert!(held <= BUDGET_ADDRESSES, "{held}");
    }

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
