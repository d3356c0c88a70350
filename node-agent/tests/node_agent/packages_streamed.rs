//! The cold install's ordering (issue 15 item 9): the archive is extracted into staging while it
//! downloads, and nothing of it reaches `packages/<sha256>` (or the cache's trust) before the
//! whole download's digest matched. A real HTTP server on loopback holds back the body's last
//! bytes, so the extraction has run ahead of the digest when the test looks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::archive_support;

use archive_support::tar_gz;

use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use runner_manager_node_agent::packages::cache::PackageRefusal;
use runner_manager_node_agent::packages::download::{
    DownloadLimits, Downloader, RetryPolicy, Timeouts,
};
use runner_manager_node_agent::packages::extract::ExtractError;
use runner_manager_node_agent::packages::{
    InstallProof, Materialized, PackageCache, PackageError, PackageRef, RuntimeKind,
};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;

use crate::workspace_support::Immutable;

fn package(listener: &[u8]) -> Vec<u8> {
    tar_gz(&[
        ("bin/Runner.Listener", listener, 0o755),
        ("run.sh", b"#!/bin/sh\n", 0o755),
        ("config.sh", b"#!/bin/sh\n", 0o755),
    ])
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// What the server sends for one request: `head` at once, then — once `release` is notified —
/// `tail`; the Content-Length is `declared`.
struct Held {
    head: Vec<u8>,
    tail: Vec<u8>,
    declared: usize,
}

impl Held {
    /// `body` less its gzip trailer at once, the trailer on release: every tar entry can be
    /// extracted before the digest is known.
    fn split(body: &[u8]) -> Self {
        let (head, tail) = split(body);
        Self {
            declared: body.len(),
            head,
            tail,
        }
    }

    /// `body` whole at once, then the connection closes.
    fn whole(body: Vec<u8>) -> Self {
        Self {
            declared: body.len(),
            head: body,
            tail: Vec::new(),
        }
    }
}

/// Serves `held` to the first request; the test notifies the returned `Notify` to release the
/// tail.
async fn serve(held: Held) -> (String, Arc<Notify>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/runner.tar.gz", listener.local_addr().unwrap());
    let release = Arc::new(Notify::new());
    let gate = Arc::clone(&release);
    tokio::spawn(async move {
        let Ok((mut socket, _)) = listener.accept().await else {
            return;
        };
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            held.declared
        );
        let _ = socket.write_all(head.as_bytes()).await;
        let _ = socket.write_all(&held.head).await;
        let _ = socket.flush().await;
        gate.notified().await;
        let _ = socket.write_all(&held.tail).await;
        let _ = socket.shutdown().await;
    });
    (url, release)
}

/// Serves `held` with nothing held back: its URL.
async fn serve_released(held: Held) -> String {
    let (url, release) = serve(held).await;
    release.notify_one();
    url
}

struct Host {
    dir: tempfile::TempDir,
    cache: PackageCache,
}

impl Host {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cache = PackageCache::new(dir.path().join("packages"), downloader()).unwrap();
        Self { dir, cache }
    }

    fn packages(&self) -> PathBuf {
        self.dir.path().join("packages")
    }

    fn runtime(&self) -> PathBuf {
        let path = self.dir.path().join("runners").join("r1");
        fs::create_dir_all(&path).unwrap();
        path
    }

    /// The staging directories' entries (what an extraction wrote so far).
    fn staged(&self, name: &str) -> bool {
        fs::read_dir(self.packages().join(".staging"))
            .unwrap()
            .any(|e| e.unwrap().path().join(name).exists())
    }

    fn staging_is_empty(&self) -> bool {
        fs::read_dir(self.packages().join(".staging"))
            .unwrap()
            .next()
            .is_none()
    }

    /// Nothing of `digest` is usable: no tree, no kept archive, no trust, no staging.
    fn holds_nothing_of(&self, digest: &str) {
        assert!(!self.cache.tree(digest).exists(), "no tree");
        assert!(!self.cache.is_trusted(digest), "no trust");
        assert!(
            !self
                .packages()
                .join(".archives")
                .join(format!("{digest}.tar.gz"))
                .exists(),
            "no kept archive"
        );
        assert!(self.staging_is_empty(), "staging swept");
    }
}

/// One try only, so a failed try is the end.
fn downloader() -> Downloader {
    Downloader::with_limits(
        RetryPolicy {
            max_attempts: 1,
            initial: Duration::from_millis(1),
            maximum: Duration::from_millis(1),
        },
        Timeouts::PRODUCTION,
        DownloadLimits {
            http_hosts: runner_manager_crds::hosts::HostList::parse("127.0.0.1").unwrap(),
            ..DownloadLimits::default()
        },
    )
    .unwrap()
}

/// Polls `cond` until it holds (a condition, not a timed guess); fails after a minute.
async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "waited for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The body minus its gzip trailer (CRC and size): every tar entry can be extracted from it.
fn split(body: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let at = body.len() - 8;
    (body[..at].to_vec(), body[at..].to_vec())
}

/// The genuine package and its digest.
fn genuine() -> (Vec<u8>, String) {
    let body = package(b"#!/bin/sh\necho listener\n");
    let digest = sha(&body);
    (body, digest)
}

/// A launch of `digest` on a fresh host, from a server sending `body` less its gzip trailer,
/// once the extraction running ahead of the digest has written `staged` into staging: the
/// host, the trailer's release and the launch.
async fn extracting(
    body: &[u8],
    digest: &str,
    staged: &str,
) -> (
    Arc<Host>,
    Arc<Notify>,
    tokio::task::JoinHandle<Result<Materialized, PackageError>>,
) {
    let (url, release) = serve(Held::split(body)).await;
    let host = Arc::new(Host::new());
    let launch = launched(&host, digest, &url);
    until(
        &format!("the extraction to write {staged} into staging"),
        || host.staged(staged),
    )
    .await;
    (host, release, launch)
}

/// [`materialized`] on a task of its own, for the test to watch while it runs.
fn launched(
    host: &Arc<Host>,
    digest: &str,
    url: &str,
) -> tokio::task::JoinHandle<Result<Materialized, PackageError>> {
    let (host, digest, url) = (Arc::clone(host), digest.to_owned(), url.to_owned());
    tokio::spawn(async move { materialized(&host, &digest, &url).await })
}

async fn materialize(host: &Arc<Host>, digest: &str, url: &str) -> Result<(), PackageError> {
    materialized(host, digest, url).await.map(drop)
}

async fn materialized(
    host: &Arc<Host>,
    digest: &str,
    url: &str,
) -> Result<Materialized, PackageError> {
    host.cache
        .materialize(
            "a1",
            PackageRef {
                sha256: digest,
                url,
            },
            &host.runtime(),
            RuntimeKind::Ephemeral,
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_archive_extracted_while_it_downloads_reaches_the_cache_only_after_its_digest_matched() {
    let (body, digest) = genuine();
    // The extraction ran ahead of the digest: its files stand in staging...
    let (host, release, launch) = extracting(&body, &digest, "run.sh").await;
    // ...and nothing is in the cache while the digest is still open.
    assert!(!host.cache.tree(&digest).exists());
    assert!(!host.cache.is_trusted(&digest));
    assert!(!launch.is_finished());
    release.notify_one();
    let done = launch.await.unwrap().unwrap();
    // The tree in the cache is the streamed one, proven as it was written (not extracted again
    // from the kept archive, nor left to a proof by reading).
    assert_eq!(
        done.timings.installed,
        Some(InstallProof::StreamedByConstruction)
    );
    assert!(host.cache.is_trusted(&digest));
    assert_eq!(
        fs::read(host.cache.tree(&digest).join("bin/Runner.Listener")).unwrap(),
        b"#!/bin/sh\necho listener\n"
    );
    assert_eq!(
        fs::read(host.runtime().join("bin/Runner.Listener")).unwrap(),
        b"#!/bin/sh\necho listener\n"
    );
    assert!(
        host.staging_is_empty(),
        "the staging was renamed, not copied"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_archive_extracted_while_it_downloads_leaves_nothing_usable() {
    // The pinned digest is the genuine package's; the server sends another, well-formed one.
    let (_, digest) = genuine();
    let forged = package(b"#!/bin/sh\necho forged\n");
    let (host, release, launch) = extracting(&forged, &digest, "bin/Runner.Listener").await;
    assert!(!host.cache.tree(&digest).exists());
    release.notify_one();
    let err = launch.await.unwrap().unwrap_err();
    assert!(matches!(err, PackageError::Download(_)), "{err:?}");
    host.holds_nothing_of(&digest);
    assert!(!host.runtime().join("bin").exists(), "nothing materialized");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_download_leaves_nothing_usable() {
    let (body, digest) = genuine();
    let (head, _) = split(&body);
    // The connection closes 8 bytes short of its Content-Length.
    let (url, release) = serve(Held {
        declared: body.len(),
        head,
        tail: Vec::new(),
    })
    .await;
    release.notify_one();
    let host = Arc::new(Host::new());
    let err = materialize(&host, &digest, &url).await.unwrap_err();
    assert!(matches!(err, PackageError::Download(_)), "{err:?}");
    host.holds_nothing_of(&digest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsafe_stream_that_fails_its_digest_is_not_a_refusal_of_the_digest() {
    // A man in the middle sends an archive with a climbing path: the streamed extraction refuses
    // it, but the bytes are not the pinned digest's, so the digest is not marked refused and the
    // genuine archive installs on the next launch.
    let (genuine, digest) = genuine();
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(4);
    let name = b"../escape";
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.set_cksum();
    let mut b = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    b.append(&h, &b"evil"[..]).unwrap();
    let unsafe_body = b.into_inner().unwrap().finish().unwrap();
    let url = serve_released(Held::whole(unsafe_body)).await;
    let host = Arc::new(Host::new());
    let err = materialize(&host, &digest, &url).await.unwrap_err();
    assert!(matches!(err, PackageError::Download(_)), "{err:?}");
    assert_eq!(err.refusal(), None, "{err:?}");
    host.holds_nothing_of(&digest);
    // `../escape` resolves against the extraction's staging directory: it would land beside
    // it, in `.staging`, and one level up, in the packages root.
    assert!(!host.packages().join(".staging/escape").exists());
    assert!(!host.packages().join("escape").exists());
    assert!(!host.dir.path().join("escape").exists());
    let url = serve_released(Held::split(&genuine)).await;
    materialize(&host, &digest, &url).await.unwrap();
    assert!(host.cache.is_trusted(&digest));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_crash_mid_install_left_in_staging_is_swept_and_never_used() {
    let (body, digest) = genuine();
    // What an agent killed mid-install leaves: a half-extracted staging tree and a partial
    // download beside it.
    let dir = tempfile::tempdir().unwrap();
    let staging = dir.path().join("packages/.staging");
    let half = staging.join("0123456789abcdef0123456789abcdef");
    fs::create_dir_all(half.join("bin")).unwrap();
    fs::write(half.join("bin/Runner.Listener"), b"#!/bin/sh\necho half\n").unwrap();
    fs::write(staging.join("download-0123"), &body[..body.len() / 2]).unwrap();
    let cache = PackageCache::new(dir.path().join("packages"), downloader()).unwrap();
    assert!(
        fs::read_dir(&staging).unwrap().next().is_none(),
        "swept when the cache is made"
    );
    let host = Arc::new(Host { dir, cache });
    host.holds_nothing_of(&digest);
    let url = serve_released(Held::split(&body)).await;
    materialize(&host, &digest, &url).await.unwrap();
    assert_eq!(
        fs::read(host.runtime().join("bin/Runner.Listener")).unwrap(),
        b"#!/bin/sh\necho listener\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_name_declaring_gigabytes_fails_fast_and_leaves_nothing() {
    // A GNU long-name header declaring 8 GiB, followed by 64 MiB of its body (a 64 KiB gzip):
    // the tar reader would read all of it into one buffer before the first entry. The stream is
    // its own digest, so the refusal is the archive's.
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::GNULongName);
    h.set_mode(0o644);
    h.set_size(8 << 30);
    let name = b"././@LongLink";
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.set_cksum();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, h.as_bytes()).unwrap();
    std::io::Write::write_all(&mut gz, &vec![b'a'; 64 << 20]).unwrap();
    let body = gz.finish().unwrap();
    let digest = sha(&body);
    let url = serve_released(Held::whole(body)).await;
    let host = Arc::new(Host::new());
    let err = materialize(&host, &digest, &url).await.unwrap_err();
    assert!(
        matches!(
            err,
            PackageError::Unsafe(ExtractError::OversizedHeader { .. })
        ),
        "{err:?}"
    );
    assert_eq!(err.refusal(), Some(PackageRefusal::Unsafe));
    host.holds_nothing_of(&digest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_dropped_mid_install_leaves_no_staging() {
    // The launch goes away while the extraction runs; the download goes on (it is shared) and
    // the extraction finishes into staging that no one will rename in.
    let (body, digest) = genuine();
    let (host, release, launch) = extracting(&body, &digest, "run.sh").await;
    launch.abort();
    let _ = launch.await;
    release.notify_one();
    until("the abandoned staging to be removed", || {
        host.staging_is_empty()
    })
    .await;
    assert!(!host.cache.tree(&digest).exists());
}

#[test]
fn a_staging_entry_that_cannot_be_swept_does_not_stop_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let staging = dir.path().join("packages/.staging");
    let stuck = staging.join("stuck");
    fs::create_dir_all(&stuck).unwrap();
    fs::write(staging.join("download-0123"), b"partial").unwrap();
    // An immutable file in it: it cannot be removed (EPERM), even by root. (A mount on it no
    // longer stops the sweep: the removal detaches it, see removal.rs.)
    let locked = stuck.join("locked");
    fs::write(&locked, b"x").unwrap();
    let _unlock = Immutable::set(&locked);
    let made = PackageCache::new(dir.path().join("packages"), downloader());
    assert!(made.is_ok(), "{:?}", made.err());
    assert!(!staging.join("download-0123").exists(), "the rest swept");
    assert!(locked.exists(), "what cannot go is left");
}
