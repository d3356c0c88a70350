//! Downloading the operator-pinned package over HTTP(S): connect, read and overall timeouts,
//! retries with exponential backoff for what may pass (5xx, 429, transport errors, a digest
//! mismatch), none for what will not (other 4xx). The body streams to a file and is hashed on
//! the way; a file whose sha256 differs from the pinned one is deleted and never extracted.
//!
//! A tap ([`Tap`], read by a [`TapReader`]) hands the first try's body, chunk by chunk, to a
//! reader on another thread (the cache extracts it into staging while it downloads), followed by
//! a verdict: the reader's stream ends cleanly only once the whole body's sha256 matched the
//! pinned digest; a try that fails in any way (transport, cap, digest) ends it with an error.
//! A retry does not feed the tap: its reader has already seen the failed try's bytes.
//!
//! Size and scheme limits (issue 13, finding 8): a body is counted as it streams and refused
//! past `--package-max-download-bytes` (a Content-Length past it is refused before reading, a
//! false or missing one does not help); only https is fetched — the URL and every redirect —
//! unless the admin allows plain http for that host (`--allow-http-hosts`).

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use runner_manager_crds::hosts::{HostList, check_scheme};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tokio::sync::{Semaphore, mpsc};

/// The default of `--package-max-download-bytes`: the runner's Linux package is ~200 MB.
pub const DEFAULT_MAX_DOWNLOAD_BYTES: u64 = 1024 * 1024 * 1024;

/// What a download may be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DownloadLimits {
    /// The most bytes of one package download.
    pub max_bytes: u64,
    /// Hosts that may be fetched over plain http (URL or redirect); https everywhere else.
    pub http_hosts: HostList,
    /// CA certificates (PEM) trusted beside the system's (`--download-ca-file`): a GitHub
    /// Enterprise Server or mirror whose certificate a private CA signed.
    pub extra_roots_pem: Option<Vec<u8>>,
}

impl Default for DownloadLimits {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_MAX_DOWNLOAD_BYTES,
            http_hosts: HostList::default(),
            extra_roots_pem: None,
        }
    }
}

/// Tries, first delay and ceiling. The delay after the n-th failure (1-based) is
/// `min(initial × 2^(n−1), maximum)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub initial: Duration,
    pub maximum: Duration,
}

impl RetryPolicy {
    pub const PRODUCTION: Self = Self {
        max_attempts: 3,
        initial: Duration::from_secs(2),
        maximum: Duration::from_secs(30),
    };

    pub fn delay(&self, failures: u32) -> Duration {
        let shift = failures.saturating_sub(1).min(31);
        self.initial.saturating_mul(1u32 << shift).min(self.maximum)
    }
}

/// Timeouts of one download try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    pub connect: Duration,
    /// Between two reads of the body.
    pub read: Duration,
    /// The whole try.
    pub total: Duration,
}

impl Timeouts {
    pub const PRODUCTION: Self = Self {
        connect: Duration::from_secs(10),
        read: Duration::from_secs(30),
        total: Duration::from_secs(15 * 60),
    };
}

/// Why a download failed. Messages hold status codes and kinds, never the URL (a mirror URL may
/// carry credentials).
#[derive(Clone, Debug, thiserror::Error)]
pub enum DownloadError {
    #[error("the HTTP client could not be built")]
    Client,
    #[error("the agent's --download-ca-file holds no readable PEM certificate")]
    CaBundle,
    #[error("the server answered {status}")]
    Status { status: u16 },
    #[error("the transfer failed{}", if *timeout { " (timed out)" } else { "" })]
    Transport { timeout: bool },
    #[error("the download's sha256 differs from the pinned digest; it was deleted unextracted")]
    ChecksumMismatch,
    #[error("writing the download failed ({0:?})")]
    Io(io::ErrorKind),
    #[error(
        "the download passed {limit} bytes, the agent's --package-max-download-bytes; it was refused and deleted"
    )]
    TooLarge { limit: u64 },
    #[error(
        "the package URL (or a redirect) is plain http, which the agent refuses unless --allow-http-hosts names its host"
    )]
    InsecureUrl,
    /// Retries stopped: no launch waits for the package any more (parity row 48).
    #[error("no launch waits for the package any more; stopped after {attempts} tries")]
    NoLongerWanted { attempts: u32 },
    #[error("gave up after {attempts} tries: {last}")]
    Exhausted {
        attempts: u32,
        last: Box<DownloadError>,
    },
}

impl DownloadError {
    fn retryable(&self) -> bool {
        match self {
            Self::Status { status } => *status == 429 || *status >= 500,
            Self::Transport { .. } | Self::ChecksumMismatch | Self::Io(_) => true,
            Self::Client
            | Self::CaBundle
            | Self::Exhausted { .. }
            | Self::TooLarge { .. }
            | Self::InsecureUrl
            | Self::NoLongerWanted { .. } => false,
        }
    }
}

impl From<reqwest::Error> for DownloadError {
    fn from(e: reqwest::Error) -> Self {
        Self::Transport {
            timeout: e.is_timeout(),
        }
    }
}

impl From<io::Error> for DownloadError {
    fn from(e: io::Error) -> Self {
        Self::Io(e.kind())
    }
}

/// What a tap carries.
#[derive(Debug)]
enum TapMsg {
    /// A chunk, with the share of the tap's byte budget it holds until it is read.
    Data(bytes::Bytes, tokio::sync::OwnedSemaphorePermit),
    /// The body ended and its sha256 is the pinned digest.
    Verified,
}

/// The sending end of a download's tap: give it to [`Downloader::fetch_tapped`].
#[derive(Debug)]
pub struct Tap {
    tx: mpsc::Sender<TapMsg>,
    budget: Arc<Semaphore>,
}

impl Tap {
    /// Hands `chunk` to the reader once the bytes in flight leave room for it (a chunk larger
    /// than the whole budget waits for all of it); an error when the reader went away.
    async fn send(&self, chunk: bytes::Bytes) -> Result<(), ()> {
        let want = u32::try_from(chunk.len())
            .unwrap_or(u32::MAX)
            .clamp(1, TAP_BYTES);
        let permit = Arc::clone(&self.budget)
            .acquire_many_owned(want)
            .await
            .map_err(drop)?;
        self.tx
            .send(TapMsg::Data(chunk, permit))
            .await
            .map_err(drop)
    }

    async fn verified(self) {
        let _ = self.tx.send(TapMsg::Verified).await;
    }
}

/// The reading end: the first try's body as a blocking [`io::Read`] (for a blocking thread, never
/// the async runtime), which ends (`Ok(0)`) only after the body's digest matched; any other end
/// (the try failed, the download went on without the tap, the tap was dropped) is an error.
#[derive(Debug)]
pub struct TapReader {
    rx: mpsc::Receiver<TapMsg>,
    chunk: bytes::Bytes,
    /// The current chunk's share of the budget, given back when the next one is taken.
    held: Option<tokio::sync::OwnedSemaphorePermit>,
    verified: bool,
}

/// Bytes a tap holds before the download waits for its reader: the download goes no faster
/// than the extraction behind it, and memory stays bounded whatever size the HTTP stack's chunks
/// have (they reach hundreds of KiB: a bound by chunk count held ~100 MiB).
pub const TAP_BYTES: u32 = 8 << 20;

/// Chunks a tap's channel holds (the bytes bound them first unless chunks are tiny).
const TAP_DEPTH: usize = 1024;

/// A tap and its reader.
pub fn tap() -> (Tap, TapReader) {
    let (tx, rx) = mpsc::channel(TAP_DEPTH);
    (
        Tap {
            tx,
            budget: Arc::new(Semaphore::new(TAP_BYTES as usize)),
        },
        TapReader {
            rx,
            chunk: bytes::Bytes::new(),
            held: None,
            verified: false,
        },
    )
}

impl io::Read for TapReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.chunk.is_empty() {
            if self.verified {
                return Ok(0);
            }
            // A chunk read to its end gives its share back before the wait: held across it, a
            // next chunk wanting more than what is left of the budget would wait for this
            // reader, which waits for it.
            self.held = None;
            match self.rx.blocking_recv() {
                Some(TapMsg::Data(chunk, permit)) => {
                    self.chunk = chunk;
                    self.held = Some(permit);
                }
                Some(TapMsg::Verified) => self.verified = true,
                None => {
                    return Err(io::Error::other(
                        "the download ended without a verified digest",
                    ));
                }
            }
        }
        let n = out.len().min(self.chunk.len());
        out[..n].copy_from_slice(&self.chunk.split_to(n));
        Ok(n)
    }
}

/// The package downloader.
#[derive(Clone, Debug)]
pub struct Downloader {
    client: reqwest::Client,
    retry: RetryPolicy,
    limits: DownloadLimits,
}

impl Downloader {
    /// A downloader with the default limits (https only, [`DEFAULT_MAX_DOWNLOAD_BYTES`]).
    pub fn new(retry: RetryPolicy, timeouts: Timeouts) -> Result<Self, DownloadError> {
        Self::with_limits(retry, timeouts, DownloadLimits::default())
    }

    pub fn with_limits(
        retry: RetryPolicy,
        timeouts: Timeouts,
        limits: DownloadLimits,
    ) -> Result<Self, DownloadError> {
        // rustls with aws-lc-rs, the one provider the workspace compiles; installing it twice is
        // harmless (the second call reports the first).
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let http_hosts = limits.http_hosts.clone();
        // Every redirect obeys the scheme rule too (an https URL may not lead to plain http).
        let redirects = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= 10 {
                attempt.error("too many redirects")
            } else if check_scheme(attempt.url().as_str(), &http_hosts).is_err() {
                attempt.error("a redirect to a refused scheme")
            } else {
                attempt.follow()
            }
        });
        let extra_roots = match &limits.extra_roots_pem {
            None => Vec::new(),
            Some(pem) => reqwest::Certificate::from_pem_bundle(pem)
                .ok()
                .filter(|certs| !certs.is_empty())
                .ok_or(DownloadError::CaBundle)?,
        };
        let client = reqwest::Client::builder()
            .connect_timeout(timeouts.connect)
            .read_timeout(timeouts.read)
            .timeout(timeouts.total)
            .redirect(redirects)
            .tls_certs_merge(extra_roots)
            .build()
            .map_err(|_| DownloadError::Client)?;
        Ok(Self {
            client,
            retry,
            limits,
        })
    }

    /// Downloads `url` to `dest` (replacing it) and checks its sha256 against `sha256` (lower-
    /// case hex). Returns the size.
    pub async fn fetch(&self, url: &str, sha256: &str, dest: &Path) -> Result<u64, DownloadError> {
        self.fetch_while(url, sha256, dest, &|| true).await
    }

    /// [`Self::fetch`], demand-adjacent: `wanted` is asked before each wait between tries and
    /// again after it, and once it says no the download stops (`NoLongerWanted`) instead of
    /// trying again for nobody.
    pub async fn fetch_while(
        &self,
        url: &str,
        sha256: &str,
        dest: &Path,
        wanted: &(dyn Fn() -> bool + Send + Sync),
    ) -> Result<u64, DownloadError> {
        self.fetch_tapped(url, sha256, dest, wanted, None).await
    }

    /// [`Self::fetch_while`], handing the first try's body to `tap` as it streams (see
    /// [`TapReader`]).
    pub async fn fetch_tapped(
        &self,
        url: &str,
        sha256: &str,
        dest: &Path,
        wanted: &(dyn Fn() -> bool + Send + Sync),
        mut tap: Option<Tap>,
    ) -> Result<u64, DownloadError> {
        let mut failures = 0;
        loop {
            // Only the first try: `take` drops the tap after it, ending its reader.
            match self.fetch_once(url, sha256, dest, tap.take()).await {
                Ok(size) => return Ok(size),
                Err(e) if e.retryable() => {
                    failures += 1;
                    if failures >= self.retry.max_attempts.max(1) {
                        return Err(DownloadError::Exhausted {
                            attempts: failures,
                            last: Box::new(e),
                        });
                    }
                    let gone = DownloadError::NoLongerWanted { attempts: failures };
                    if !wanted() {
                        return Err(gone);
                    }
                    tokio::time::sleep(self.retry.delay(failures)).await;
                    if !wanted() {
                        return Err(gone);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn fetch_once(
        &self,
        url: &str,
        sha256: &str,
        dest: &Path,
        mut tap: Option<Tap>,
    ) -> Result<u64, DownloadError> {
        check_scheme(url, &self.limits.http_hosts).map_err(|_| DownloadError::InsecureUrl)?;
        let mut response = match self.client.get(url).send().await {
            Ok(r) => r,
            Err(e) if e.is_redirect() => return Err(DownloadError::InsecureUrl),
            Err(e) => return Err(e.into()),
        };
        let status = response.status();
        if !status.is_success() {
            return Err(DownloadError::Status {
                status: status.as_u16(),
            });
        }
        let limit = self.limits.max_bytes;
        if response.content_length().is_some_and(|n| n > limit) {
            return Err(DownloadError::TooLarge { limit });
        }
        let mut file = tokio::fs::File::create(dest).await?;
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        let streamed = async {
            while let Some(chunk) = response.chunk().await? {
                // Counted as it streams: a false or absent Content-Length does not get past it.
                if size + chunk.len() as u64 > limit {
                    return Err(DownloadError::TooLarge { limit });
                }
                hasher.update(&chunk);
                file.write_all(&chunk).await?;
                size += chunk.len() as u64;
                // A reader that went away (it refused the archive, or gave up) stops the tap,
                // not the download.
                if let Some(t) = &tap
                    && t.send(chunk).await.is_err()
                {
                    tap = None;
                }
            }
            // No fsync: a kept archive is used only after its digest checks again (a torn one
            // after a crash is downloaded again), so durability buys nothing but a wait.
            file.flush().await?;
            Ok::<_, DownloadError>(())
        }
        .await;
        if let Err(e) = streamed {
            let _ = tokio::fs::remove_file(dest).await;
            return Err(e);
        }
        if hex::encode(hasher.finalize()) != sha256 {
            let _ = tokio::fs::remove_file(dest).await;
            return Err(DownloadError::ChecksumMismatch);
        }
        if let Some(t) = tap {
            t.verified().await;
        }
        Ok(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_and_saturates() {
        let p = RetryPolicy {
            max_attempts: 3,
            initial: Duration::from_millis(10),
            maximum: Duration::from_millis(25),
        };
        assert_eq!(p.delay(1), Duration::from_millis(10));
        assert_eq!(p.delay(2), Duration::from_millis(20));
        assert_eq!(p.delay(3), Duration::from_millis(25));
        assert_eq!(p.delay(u32::MAX), Duration::from_millis(25));
    }

    #[test]
    fn only_what_may_pass_is_retried() {
        assert!(DownloadError::Status { status: 503 }.retryable());
        assert!(DownloadError::Status { status: 429 }.retryable());
        assert!(!DownloadError::Status { status: 404 }.retryable());
        assert!(!DownloadError::Status { status: 403 }.retryable());
        assert!(DownloadError::ChecksumMismatch.retryable());
        assert!(DownloadError::Transport { timeout: true }.retryable());
        assert!(!DownloadError::TooLarge { limit: 1 }.retryable());
        assert!(!DownloadError::InsecureUrl.retryable());
    }

    /// Serves one answer per connection: `head` then `body_len` bytes of `x`, without a
    /// Content-Length when `declare` is false.
    async fn serve(body_len: usize, declare: bool) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let head = if declare {
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {body_len}\r\nconnection: close\r\n\r\n"
                    )
                } else {
                    "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n".to_owned()
                };
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(&vec![b'x'; body_len]).await;
            }
        });
        format!("http://{addr}/pkg.tar.gz")
    }

    fn quick() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 1,
            initial: Duration::from_millis(1),
            maximum: Duration::from_millis(1),
        }
    }

    #[tokio::test]
    async fn a_body_past_the_cap_is_refused_while_streaming_and_deleted() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dest = dir.path().join("p");
        let limits = DownloadLimits {
            max_bytes: 1000,
            http_hosts: HostList::parse("127.0.0.1").unwrap_or_default(),
            extra_roots_pem: None,
        };
        let d = Downloader::with_limits(quick(), Timeouts::PRODUCTION, limits)
            .unwrap_or_else(|e| panic!("{e}"));
        for declare in [true, false] {
            let url = serve(5000, declare).await;
            let e = d.fetch(&url, &"0".repeat(64), &dest).await.err();
            assert!(
                matches!(e, Some(DownloadError::TooLarge { limit: 1000 })),
                "declared={declare}: {e:?}"
            );
            assert!(!dest.exists(), "nothing left behind");
        }
        // Under the cap: read whole (and refused only for its digest).
        let url = serve(900, false).await;
        let e = d.fetch(&url, &"0".repeat(64), &dest).await.err();
        assert!(matches!(e, Some(DownloadError::Exhausted { .. })), "{e:?}");
    }

    /// A tap's reader ends cleanly only after the verdict; a tap dropped without one (a failed
    /// try, a digest mismatch) is an error even after every byte arrived.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_taps_stream_ends_cleanly_only_after_its_digest_matched() {
        use std::io::Read;
        for verified in [true, false] {
            let (tx, mut reader) = tap();
            let read = tokio::task::spawn_blocking(move || {
                let mut out = Vec::new();
                reader.read_to_end(&mut out).map(|_| out)
            });
            tx.send(bytes::Bytes::from_static(b"all the bytes"))
                .await
                .unwrap_or_else(|()| panic!("reader gone"));
            if verified {
                tx.verified().await;
            } else {
                drop(tx);
            }
            let read = read.await.unwrap_or_else(|e| panic!("{e}"));
            if verified {
                assert_eq!(read.ok().as_deref(), Some(&b"all the bytes"[..]));
            } else {
                assert!(read.is_err(), "an unverified end is not an end");
            }
        }
    }

    /// A tap holds at most [`TAP_BYTES`] its reader has not taken: the next chunk waits, and
    /// goes once the reader took one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tap_holds_a_bounded_number_of_bytes() {
        use std::io::Read;
        let (tx, mut reader) = tap();
        let mib = bytes::Bytes::from(vec![0u8; 1 << 20]);
        for _ in 0..(TAP_BYTES >> 20) {
            tx.send(mib.clone())
                .await
                .unwrap_or_else(|()| panic!("reader gone"));
        }
        let mut next = std::pin::pin!(tx.send(mib.clone()));
        // One poll: a chunk that fits is sent at once, so pending means it waits for room.
        assert!(
            futures_util::poll!(next.as_mut()).is_pending(),
            "a chunk past the budget waits"
        );
        // The reader takes the first chunk and the second's first byte (giving the first back).
        let reader = tokio::task::spawn_blocking(move || {
            let mut out = vec![0u8; (1 << 20) + 1];
            reader.read_exact(&mut out).map(|()| reader)
        });
        next.await.unwrap_or_else(|()| panic!("reader gone"));
        drop(reader.await);
    }

    #[tokio::test]
    async fn a_chunk_read_to_its_end_gives_its_share_back_before_the_reader_waits() {
        use std::io::Read;
        let (tx, mut reader) = tap();
        let five = bytes::Bytes::from(vec![1u8; 5 << 20]);
        tx.send(five.clone())
            .await
            .unwrap_or_else(|()| panic!("reader gone"));
        let reader = tokio::task::spawn_blocking(move || {
            let mut out = vec![0u8; 10 << 20];
            reader.read_exact(&mut out).map(|()| reader)
        });
        // The second chunk wants more than the first's share leaves of the budget: with that
        // share held while the reader waits for it, neither side would ever move (the bound is
        // only how long to wait before calling it a deadlock).
        tokio::time::timeout(std::time::Duration::from_secs(60), tx.send(five))
            .await
            .unwrap_or_else(|_| panic!("the tap deadlocked"))
            .unwrap_or_else(|()| panic!("reader gone"));
        assert!(
            matches!(reader.await, Ok(Ok(_))),
            "the reader read both chunks"
        );
    }

    #[tokio::test]
    async fn plain_http_only_for_listed_hosts() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dest = dir.path().join("p");
        let d = Downloader::new(quick(), Timeouts::PRODUCTION).unwrap_or_else(|e| panic!("{e}"));
        let url = serve(10, true).await;
        let e = d.fetch(&url, &"0".repeat(64), &dest).await.err();
        assert!(matches!(e, Some(DownloadError::InsecureUrl)), "{e:?}");
    }
}
