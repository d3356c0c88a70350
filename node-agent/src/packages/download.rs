//! Downloading the operator-pinned package over HTTP(S): connect, read and overall timeouts,
//! retries with exponential backoff for what may pass (5xx, 429, transport errors, a digest
//! mismatch), none for what will not (other 4xx). The body streams to a file and is hashed on
//! the way; a file whose sha256 differs from the pinned one is deleted and never extracted.

use std::io;
use std::path::Path;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

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
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    #[error("the HTTP client could not be built")]
    Client,
    #[error("the server answered {status}")]
    Status { status: u16 },
    #[error("the transfer failed{}", if *timeout { " (timed out)" } else { "" })]
    Transport { timeout: bool },
    #[error("the download's sha256 differs from the pinned digest; it was deleted unextracted")]
    ChecksumMismatch,
    #[error("writing the download failed ({0:?})")]
    Io(io::ErrorKind),
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
            Self::Client | Self::Exhausted { .. } => false,
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

/// The package downloader.
#[derive(Clone, Debug)]
pub struct Downloader {
    client: reqwest::Client,
    retry: RetryPolicy,
}

impl Downloader {
    pub fn new(retry: RetryPolicy, timeouts: Timeouts) -> Result<Self, DownloadError> {
        // rustls with aws-lc-rs, the one provider the workspace compiles; installing it twice is
        // harmless (the second call reports the first).
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(timeouts.connect)
            .read_timeout(timeouts.read)
            .timeout(timeouts.total)
            .build()
            .map_err(|_| DownloadError::Client)?;
        Ok(Self { client, retry })
    }

    /// Downloads `url` to `dest` (replacing it) and checks its sha256 against `sha256` (lower-
    /// case hex). Returns the size.
    pub async fn fetch(&self, url: &str, sha256: &str, dest: &Path) -> Result<u64, DownloadError> {
        let mut failures = 0;
        loop {
            match self.fetch_once(url, sha256, dest).await {
                Ok(size) => return Ok(size),
                Err(e) if e.retryable() => {
                    failures += 1;
                    if failures >= self.retry.max_attempts.max(1) {
                        return Err(DownloadError::Exhausted {
                            attempts: failures,
                            last: Box::new(e),
                        });
                    }
                    tokio::time::sleep(self.retry.delay(failures)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn fetch_once(&self, url: &str, sha256: &str, dest: &Path) -> Result<u64, DownloadError> {
        let mut response = self.client.get(url).send().await?;
        let status = response.status();
        if !status.is_success() {
            return Err(DownloadError::Status {
                status: status.as_u16(),
            });
        }
        let mut file = tokio::fs::File::create(dest).await?;
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        let streamed = async {
            while let Some(chunk) = response.chunk().await? {
                hasher.update(&chunk);
                file.write_all(&chunk).await?;
                size += chunk.len() as u64;
            }
            file.sync_all().await?;
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
    }
}
