//! The package cache against real archives, a real HTTP server on loopback and real
//! directories.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runner_manager_node_agent::packages::cache::PruneReport;
use runner_manager_node_agent::packages::contents::RetainedWork;
use runner_manager_node_agent::packages::copy::CopyError;
use runner_manager_node_agent::packages::download::{
    DownloadError, DownloadLimits, Downloader, RetryPolicy, Timeouts,
};
use runner_manager_node_agent::packages::extract::{ExtractCap, ExtractError, ExtractLimits};
use runner_manager_node_agent::packages::{
    Materialized, PackageCache, PackageError, PackageRef, RuntimeKind,
};
use runner_manager_node_agent::workspace::allocation::AllocationLock;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::workspace_support::{assert_file, names, write_file};

// ---- archives ------------------------------------------------------------------------------

enum Entry<'a> {
    Dir(&'a str),
    File(&'a str, &'a [u8], u32),
    Link(&'a str, &'a str),
    HardLink(&'a str, &'a str),
    CharDevice(&'a str),
    /// A name written raw into the header, bypassing the builder's own path checks.
    RawFile(&'a [u8]),
}

fn tar_gz(entries: &[Entry<'_>]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for entry in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(0);
        match entry {
            Entry::Dir(p) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                b.append_data(&mut h, p, std::io::empty()).unwrap();
            }
            Entry::File(p, data, mode) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, p, *data).unwrap();
            }
            Entry::Link(p, target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                b.append_link(&mut h, p, target).unwrap();
            }
            Entry::HardLink(p, target) => {
                h.set_entry_type(tar::EntryType::Link);
                h.set_size(0);
                b.append_link(&mut h, p, target).unwrap();
            }
            Entry::CharDevice(p) => {
                h.set_entry_type(tar::EntryType::Char);
                h.set_size(0);
                h.set_mode(0o600);
                b.append_data(&mut h, p, std::io::empty()).unwrap();
            }
            Entry::RawFile(name) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(0o644);
                h.set_size(4);
                h.as_old_mut().name[..name.len()].copy_from_slice(name);
                h.set_cksum();
                b.append(&h, &b"evil"[..]).unwrap();
            }
        }
    }
    b.into_inner().unwrap().finish().unwrap()
}

fn runner_package() -> Vec<u8> {
    tar_gz(&[
        Entry::Dir("./"),
        Entry::Dir("./bin"),
        Entry::File(
            "./bin/Runner.Listener",
            b"#!/bin/sh\necho listener\n",
            0o755,
        ),
        Entry::File("./bin/Runner.Worker.dll", b"worker", 0o644),
        Entry::File("./externals/node20/bin/node", b"node", 0o755),
        Entry::File("./externals/_work/nested is fine.txt", b"nested", 0o644),
        Entry::File("./a dir with spaces/file with spaces", b"spaces", 0o644),
        Entry::Link("./externals/node", "node20"),
        Entry::HardLink("./bin/Runner.Listener.copy", "./bin/Runner.Listener"),
        Entry::File("./run.sh", b"#!/bin/sh\n", 0o4755),
        Entry::File("./config.sh", b"#!/bin/sh\n", 0o755),
    ])
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

// ---- a loopback HTTP server ----------------------------------------------------------------

#[derive(Clone)]
enum Reply {
    Body(Vec<u8>),
    Status(u16),
}

struct Server {
    url: String,
    requests: Arc<AtomicUsize>,
    /// Replies in order; the last one repeats.
    replies: Arc<Mutex<VecDeque<Reply>>>,
}

impl Server {
    async fn start(replies: Vec<Reply>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/runner.tar.gz", listener.local_addr().unwrap());
        let requests = Arc::new(AtomicUsize::new(0));
        let replies = Arc::new(Mutex::new(VecDeque::from(replies)));
        let (count, queue) = (Arc::clone(&requests), Arc::clone(&replies));
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let reply = {
                    let mut q = queue.lock().unwrap();
                    if q.len() > 1 {
                        q.pop_front().unwrap()
                    } else {
                        q.front().unwrap().clone()
                    }
                };
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        let Ok(n) = socket.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                    }
                    let (status, body) = match reply {
                        Reply::Body(b) => (200, b),
                        Reply::Status(s) => (s, Vec::new()),
                    };
                    let head = format!(
                        "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = socket.write_all(head.as_bytes()).await;
                    let _ = socket.write_all(&body).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        Self {
            url,
            requests,
            replies,
        }
    }
    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
    fn set(&self, reply: Reply) {
        *self.replies.lock().unwrap() = VecDeque::from([reply]);
    }
    /// The package `digest` at this server's URL.
    fn package<'a>(&'a self, digest: &'a str) -> PackageRef<'a> {
        PackageRef {
            sha256: digest,
            url: &self.url,
        }
    }
}

/// The runner package served, and a fresh host to materialize it on.
async fn runner_served() -> (String, Server, Host) {
    let (digest, server) = serve(runner_package()).await;
    (digest, server, Host::new())
}

/// `archive`'s digest, and a server serving it (its one reply, repeated).
async fn serve(archive: Vec<u8>) -> (String, Server) {
    let digest = sha(&archive);
    (digest, Server::start(vec![Reply::Body(archive)]).await)
}

const TEST_RETRY: RetryPolicy = RetryPolicy {
    max_attempts: 3,
    initial: Duration::from_millis(10),
    maximum: Duration::from_millis(25),
};

struct Host {
    dir: tempfile::TempDir,
    cache: PackageCache,
}

impl Host {
    fn new() -> Self {
        Self::with_retry(TEST_RETRY)
    }
    fn with_retry(retry: RetryPolicy) -> Self {
        let dir = tempfile::tempdir().unwrap();
        // The test servers are plain http on loopback.
        let downloader = Downloader::with_limits(
            retry,
            Timeouts::PRODUCTION,
            DownloadLimits {
                http_hosts: runner_manager_crds::hosts::HostList::parse("127.0.0.1").unwrap(),
                ..DownloadLimits::default()
            },
        )
        .unwrap();
        let cache = PackageCache::new(dir.path().join("packages"), downloader).unwrap();
        Self { dir, cache }
    }
    fn runtime(&self, name: &str) -> PathBuf {
        let path = self.dir.path().join("runners").join(name);
        fs::create_dir_all(&path).unwrap();
        path
    }
    /// Materializes `package` for attempt `attempt` into the ephemeral runtime `runtime`.
    async fn ephemeral(
        &self,
        attempt: &str,
        package: PackageRef<'_>,
        runtime: &Path,
    ) -> Result<Materialized, PackageError> {
        self.cache
            .materialize(attempt, package, runtime, RuntimeKind::Ephemeral)
            .await
    }
    fn staging_is_empty(&self) -> bool {
        fs::read_dir(self.dir.path().join("packages/.staging"))
            .unwrap()
            .next()
            .is_none()
    }
}

// ---- tests ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_package_is_downloaded_once_verified_and_materialized_into_each_runtime() {
    let (digest, server, host) = runner_served().await;
    let package = server.package(&digest);
    let first = host.runtime("aaaaaaaaaaaa");
    let m = host.ephemeral("a-1", package, &first).await.unwrap();
    assert!(m.timings.downloaded);
    assert!(m.timings.install > Duration::ZERO && m.timings.copy > Duration::ZERO);
    assert_eq!(m.copy.files, 8);
    assert_file(&first, "bin/Runner.Listener", b"#!/bin/sh\necho listener\n");
    assert_file(
        &first,
        "bin/Runner.Listener.copy",
        b"#!/bin/sh\necho listener\n",
    );
    assert_file(&first, "a dir with spaces/file with spaces", b"spaces");
    assert_file(&first, "externals/_work/nested is fine.txt", b"nested");
    assert_eq!(
        fs::read_link(first.join("externals/node")).unwrap(),
        Path::new("node20")
    );
    let mode = fs::metadata(first.join("run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o755, "setuid is never applied");
    assert_eq!(host.cache.leases("a-1"), Some(digest.clone()));

    let second = host.runtime("bbbbbbbbbbbb");
    let m = host.ephemeral("a-2", package, &second).await.unwrap();
    assert!(!m.timings.downloaded);
    assert_eq!(m.timings.install, Duration::ZERO);
    assert_eq!(server.requests(), 1);
    assert!(host.staging_is_empty());
    host.cache.release("a-1");
    host.cache.release("a-1");
    assert_eq!(host.cache.leases("a-1"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_package_is_laid_out_around_a_retained_work_without_opening_it() {
    let (digest, server, host) = runner_served().await;
    let slot = host.runtime("s1");
    write_file(&slot, "_work/repo/checkout.txt", b"retained");
    // Not the package's: verification of a slot must skip `_work`, or this would count.
    write_file(&slot, "_work/repo/extra", b"x");
    let package = server.package(&digest);
    host.cache
        .materialize("p-1", package, &slot, RuntimeKind::PersistentSlot)
        .await
        .unwrap();
    assert_file(&slot, "_work/repo/checkout.txt", b"retained");
    assert!(slot.join("bin/Runner.Listener").is_file());
    // The same runtime verified as ephemeral would count `_work` as foreign.
    let contents = host.cache.contents(&digest).unwrap();
    let as_ephemeral = contents
        .verify_tree(&slot, RetainedWork::Include, 2)
        .unwrap();
    assert!(as_ephemeral.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_that_already_holds_a_package_entry_is_refused_and_left_alone() {
    let (digest, server, host) = runner_served().await;
    let runtime = host.runtime("cccccccccccc");
    write_file(&runtime, "bin/Runner.Listener", b"planted");
    let package = server.package(&digest);
    let err = host.ephemeral("o-1", package, &runtime).await.unwrap_err();
    assert!(
        matches!(err, PackageError::Copy(CopyError::Occupied)),
        "{err:?}"
    );
    assert_file(&runtime, "bin/Runner.Listener", b"planted");
    assert_eq!(host.cache.leases("o-1"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_package_with_a_top_level_work_is_refused() {
    let archive = tar_gz(&[
        Entry::File("bin/Runner.Listener", b"x", 0o755),
        Entry::File("_work/repo/leftover", b"from a job", 0o644),
    ]);
    let (digest, server) = serve(archive).await;
    let host = Host::new();
    let runtime = host.runtime("dddddddddddd");
    let package = server.package(&digest);
    let err = host.ephemeral("w-1", package, &runtime).await.unwrap_err();
    assert!(
        matches!(err, PackageError::Unsafe(ExtractError::TopLevelWork)),
        "{err:?}"
    );
    assert!(err.is_terminal());
    assert!(names(&runtime).is_empty());
    assert!(!host.cache.tree(&digest).exists());
    assert!(host.staging_is_empty());
}

#[test]
fn copying_a_tree_with_a_top_level_work_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    fs::create_dir_all(src.join("_work")).unwrap();
    fs::create_dir_all(src.join("bin")).unwrap();
    fs::create_dir_all(&dst).unwrap();
    let err = runner_manager_node_agent::packages::copy::copy_tree(&src, &dst, 2).unwrap_err();
    assert!(matches!(err, CopyError::TopLevelWork));
    assert!(names(&dst).is_empty());
}

async fn refused(entries: &[Entry<'_>]) -> (PackageError, Host) {
    let archive = tar_gz(entries);
    let (digest, server) = serve(archive).await;
    let host = Host::new();
    let runtime = host.runtime("eeeeeeeeeeee");
    let package = server.package(&digest);
    let err = host.ephemeral("x-1", package, &runtime).await.unwrap_err();
    assert!(err.is_terminal(), "{err:?}");
    assert!(host.staging_is_empty());
    assert!(!host.cache.tree(&digest).exists());
    (err, host)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tarball_with_dotdot_or_absolute_entries_is_refused() {
    let (err, host) = refused(&[
        Entry::File("bin/x", b"x", 0o644),
        Entry::RawFile(b"../evil"),
    ])
    .await;
    assert!(
        matches!(err, PackageError::Unsafe(ExtractError::UnsafePath)),
        "{err:?}"
    );
    assert!(!host.dir.path().join("packages/evil").exists());
    assert!(!host.dir.path().join("packages/.staging/evil").exists());
    let (err, _) = refused(&[Entry::RawFile(b"bin/../../evil")]).await;
    assert!(
        matches!(err, PackageError::Unsafe(ExtractError::UnsafePath)),
        "{err:?}"
    );
    let (err, _) = refused(&[Entry::RawFile(b"/tmp/rm-evil-absolute")]).await;
    assert!(
        matches!(err, PackageError::Unsafe(ExtractError::UnsafePath)),
        "{err:?}"
    );
    assert!(!Path::new("/tmp/rm-evil-absolute").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tarball_with_escaping_links_devices_or_writes_through_links_is_refused() {
    let (err, _) = refused(&[Entry::Link("bin/etc", "../../etc")]).await;
    assert!(
        matches!(err, PackageError::Unsafe(ExtractError::EscapingLink)),
        "{err:?}"
    );
    let (err, _) = refused(&[Entry::Link("bin/passwd", "/etc/passwd")]).await;
    assert!(
        matches!(err, PackageError::Unsafe(ExtractError::EscapingLink)),
        "{err:?}"
    );
    let (err, _) = refused(&[Entry::HardLink("bin/shadow", "/etc/shadow")]).await;
    assert!(matches!(err, PackageError::Unsafe(_)), "{err:?}");
    let (err, _) = refused(&[Entry::CharDevice("bin/null")]).await;
    assert!(
        matches!(err, PackageError::Unsafe(ExtractError::SpecialEntry)),
        "{err:?}"
    );
    let (err, _) = refused(&[
        Entry::Dir("sub"),
        Entry::Link("l", "sub"),
        Entry::File("l/through", b"x", 0o644),
    ])
    .await;
    assert!(
        matches!(err, PackageError::Unsafe(ExtractError::ThroughLink)),
        "{err:?}"
    );
    let (err, _) = refused(&[Entry::File("a", b"1", 0o644), Entry::File("a", b"2", 0o644)]).await;
    assert!(
        matches!(err, PackageError::Unsafe(ExtractError::Duplicate)),
        "{err:?}"
    );
}

/// A gzip bomb: one file of `bytes` zeros, which compresses about a thousandfold.
fn bomb(bytes: usize) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let mut b = tar::Builder::new(gz);
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(bytes as u64);
    h.set_mtime(0);
    b.append_data(&mut h, "bin/zeros", std::io::repeat(0).take(bytes as u64))
        .unwrap();
    b.into_inner().unwrap().finish().unwrap()
}

/// Caps small enough for a test to exceed cheaply, the way an admin would set them.
const SMALL: ExtractLimits = ExtractLimits {
    max_total_bytes: 8 << 20,
    max_entries: 50,
    max_file_bytes: 4 << 20,
};

/// Materializes `archive` under `limits` into a fresh host; the error, the host and the server.
async fn capped(archive: Vec<u8>, limits: ExtractLimits) -> (PackageError, Host, Server, String) {
    let (digest, server) = serve(archive).await;
    let mut host = Host::new();
    host.cache = host.cache.with_extract_limits(limits);
    let runtime = host.runtime("cccccccccccc");
    let err = host
        .ephemeral("cap-1", server.package(&digest), &runtime)
        .await
        .unwrap_err();
    assert!(err.is_terminal(), "{err:?}");
    assert!(host.staging_is_empty(), "what the bomb wrote is gone");
    assert!(!host.cache.tree(&digest).exists());
    (err, host, server, digest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_bomb_stops_at_the_cap_and_its_digest_is_refused_without_another_download() {
    // 64 MiB of zeros in a ~64 KiB download, against a 4 MiB per-file cap.
    let archive = bomb(64 << 20);
    assert!(archive.len() < 1 << 20, "{}", archive.len());
    let (err, host, server, digest) = capped(archive, SMALL).await;
    assert!(
        matches!(
            err,
            PackageError::Unsafe(ExtractError::TooLarge {
                cap: ExtractCap::FileBytes,
                limit
            }) if limit == SMALL.max_file_bytes
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("--package-max-file-bytes"),
        "the message names the flag that raises the cap: {err}"
    );
    assert_eq!(server.requests(), 1);
    // Terminal for that digest: the next launch is refused at once, nothing downloaded or
    // inflated again.
    let runtime = host.runtime("dddddddddddd");
    let again = host
        .ephemeral("cap-2", server.package(&digest), &runtime)
        .await
        .unwrap_err();
    assert!(
        matches!(again, PackageError::RefusedBefore(..)),
        "{again:?}"
    );
    assert!(again.is_terminal());
    assert!(
        again.to_string().contains("--package-max-file-bytes"),
        "{again}"
    );
    assert_eq!(server.requests(), 1, "no second download");
}

/// `err` is the refusal of an archive past `cap`.
fn assert_too_large(err: &PackageError, cap: ExtractCap) {
    assert!(
        matches!(err, PackageError::Unsafe(ExtractError::TooLarge { cap: c, .. }) if *c == cap),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archives_past_the_entry_or_total_caps_are_refused() {
    let names: Vec<String> = (0..60).map(|i| format!("bin/f{i}")).collect();
    let many: Vec<Entry<'_>> = names.iter().map(|n| Entry::File(n, b"x", 0o644)).collect();
    let (err, ..) = capped(tar_gz(&many), SMALL).await;
    assert_too_large(&err, ExtractCap::Entries);
    // Three files of 3 MiB: each under the per-file cap, together over the 8 MiB total.
    let chunk = vec![7u8; 3 << 20];
    let (err, ..) = capped(
        tar_gz(&[
            Entry::File("a", &chunk, 0o644),
            Entry::File("b", &chunk, 0o644),
            Entry::File("c", &chunk, 0o644),
        ]),
        SMALL,
    )
    .await;
    assert_too_large(&err, ExtractCap::TotalBytes);
}

#[test]
fn the_default_caps_sit_well_above_githubs_runner() {
    let d = ExtractLimits::default();
    // GitHub's runner: about 9,000 entries, under 300 MB unpacked.
    assert!(d.max_entries >= 10 * 9_000);
    assert!(d.max_total_bytes >= 10 * 300_000_000);
    assert!(d.max_file_bytes >= 512 << 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_package_tree_is_detected_and_reinstalled() {
    let (digest, server, host) = runner_served().await;
    let package = server.package(&digest);
    host.ephemeral("t-1", package, &host.runtime("r1"))
        .await
        .unwrap();
    // A job rewrites the listener in place (same size, so only the fingerprint can tell).
    let listener = host.cache.tree(&digest).join("bin/Runner.Listener");
    let mut f = fs::OpenOptions::new().write(true).open(&listener).unwrap();
    f.write_all(b"#!/bin/sh\necho EVILIIII\n").unwrap();
    drop(f);
    let r2 = host.runtime("r2");
    let m = host.ephemeral("t-2", package, &r2).await.unwrap();
    assert!(m.timings.install > Duration::ZERO, "reinstalled");
    assert!(
        !m.timings.downloaded,
        "from the kept archive, whose digest checked again"
    );
    assert_eq!(server.requests(), 1);
    assert_file(&r2, "bin/Runner.Listener", b"#!/bin/sh\necho listener\n");
    assert_eq!(fs::read(&listener).unwrap(), b"#!/bin/sh\necho listener\n");

    // The kept archive tampered as well: downloaded again.
    let kept = host
        .dir
        .path()
        .join(format!("packages/.archives/{digest}.tar.gz"));
    fs::write(&kept, b"not the archive").unwrap();
    fs::write(host.cache.tree(&digest).join("config.sh"), b"edited").unwrap();
    let m = host
        .ephemeral("t-3", package, &host.runtime("r3"))
        .await
        .unwrap();
    assert!(m.timings.downloaded);
    assert_eq!(server.requests(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_mismatch_is_retried_then_given_up_and_nothing_is_extracted() {
    let server = Server::start(vec![Reply::Body(b"not what was pinned".to_vec())]).await;
    let host = Host::new();
    let digest = sha(b"the pinned archive");
    let package = server.package(&digest);
    let runtime = host.runtime("ffffffffffff");
    let err = host.ephemeral("m-1", package, &runtime).await.unwrap_err();
    assert!(
        matches!(&err, PackageError::Download(DownloadError::Exhausted { attempts: 3, last }) if matches!(**last, DownloadError::ChecksumMismatch)),
        "{err:?}"
    );
    assert_eq!(server.requests(), 3);
    assert!(names(&runtime).is_empty());
    assert!(!host.cache.tree(&digest).exists());
    assert!(host.staging_is_empty());
    assert!(
        !err.to_string().contains("127.0.0.1"),
        "the URL is never in a message"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_package_is_not_retried_and_a_transient_error_is() {
    let server = Server::start(vec![Reply::Status(404)]).await;
    let host = Host::new();
    let digest = sha(b"x");
    let package = server.package(&digest);
    let err = host
        .ephemeral("n-1", package, &host.runtime("n1"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            PackageError::Download(DownloadError::Status { status: 404 })
        ),
        "{err:?}"
    );
    assert_eq!(server.requests(), 1);

    let archive = runner_package();
    let digest = sha(&archive);
    let server = Server::start(vec![Reply::Status(503), Reply::Body(archive)]).await;
    let package = server.package(&digest);
    host.ephemeral("n-2", package, &host.runtime("n2"))
        .await
        .unwrap();
    assert_eq!(server.requests(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launches_queued_behind_a_failed_install_get_its_failure_instead_of_downloading_again() {
    let server = Server::start(vec![Reply::Status(500)]).await;
    let host = Host::new();
    let archive = runner_package();
    let digest = sha(&archive);
    let package = server.package(&digest);
    let (r1, r2) = (host.runtime("q1"), host.runtime("q2"));
    let (first, second) = tokio::join!(
        host.ephemeral("q-1", package, &r1),
        host.ephemeral("q-2", package, &r2),
    );
    assert!(
        matches!(
            first,
            Err(PackageError::Download(DownloadError::Exhausted { .. }))
        ),
        "{first:?}"
    );
    assert!(
        matches!(second, Err(PackageError::QueuedBehindFailedInstall(_))),
        "{second:?}"
    );
    assert_eq!(
        server.requests(),
        TEST_RETRY.max_attempts as usize,
        "one install's tries, not two"
    );
    // A launch that starts after the failure tries again on its own.
    server.set(Reply::Body(archive));
    host.ephemeral("q-3", package, &host.runtime("q3"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruning_removes_only_unleased_versions_and_only_under_the_allocation_lock() {
    let (a, b) = (
        runner_package(),
        tar_gz(&[Entry::File("bin/Runner.Listener", b"v2", 0o755)]),
    );
    let (da, db) = (sha(&a), sha(&b));
    let (sa, sb) = (
        Server::start(vec![Reply::Body(a)]).await,
        Server::start(vec![Reply::Body(b)]).await,
    );
    let host = Host::new();
    host.ephemeral("v-1", sa.package(&da), &host.runtime("v1"))
        .await
        .unwrap();
    host.ephemeral("v-2", sb.package(&db), &host.runtime("v2"))
        .await
        .unwrap();
    let lock = AllocationLock::default();
    let guard = lock.lock().await;
    let report = host.cache.prune(&guard, &[]).unwrap();
    assert_eq!(
        report,
        PruneReport {
            removed: Vec::new(),
            ran: true
        },
        "both leased: nothing removed"
    );
    host.cache.release("v-1");
    let report = host.cache.prune(&guard, &[]).unwrap();
    assert_eq!(report.removed, vec![da.clone()]);
    assert!(!host.cache.tree(&da).exists() && host.cache.tree(&db).exists());
    assert!(!host.cache.is_trusted(&da));
    host.cache.release("v-2");
    assert!(
        host.cache.prune(&guard, &[&db]).unwrap().removed.is_empty(),
        "kept when named"
    );
}

/// Retries far enough apart for a launch to stop in between (the production policy waits 2 s).
const SLOW_RETRY: RetryPolicy = RetryPolicy {
    max_attempts: 3,
    initial: Duration::from_millis(1000),
    maximum: Duration::from_millis(1000),
};

/// Launch `id` materializing the package `sha` from `url` into its ephemeral runtime while
/// `wants` holds.
async fn materialize_wanted(
    host: &Host,
    id: &str,
    sha: &str,
    url: &str,
    wants: &std::sync::atomic::AtomicBool,
) -> Result<Materialized, PackageError> {
    let runtime = host.runtime(id);
    let wanted = || wants.load(Ordering::SeqCst);
    let package = PackageRef { sha256: sha, url };
    host.cache
        .materialize_while(id, package, &runtime, RuntimeKind::Ephemeral, &wanted)
        .await
}

/// A launch's demand, switched off by the test.
fn demand() -> Arc<std::sync::atomic::AtomicBool> {
    Arc::new(std::sync::atomic::AtomicBool::new(true))
}

/// Parity row 48 (`package_materialization_retries_are_bounded_and_demand_adjacent`), the shared
/// download: two launches need one version; the first starts its download, which fails once
/// (503) and waits to try again; that launch stops wanting the package (its attempt was
/// terminated) and gets `NoLongerWanted` at once, during the wait; the download goes on for the
/// second launch, which gets the package from that same download's second try (two requests in
/// all, not a third for a new download).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_that_stops_leaves_the_shared_download_to_the_launch_that_still_waits() {
    let archive = runner_package();
    let digest = sha(&archive);
    let server = Server::start(vec![Reply::Status(503), Reply::Body(archive)]).await;
    let host = Arc::new(Host::with_retry(SLOW_RETRY));
    let package_of = |url: &str| (digest.clone(), url.to_owned());
    let (first_wants, second_wants) = (demand(), demand());
    let start = |id: &'static str, wants: Arc<std::sync::atomic::AtomicBool>| {
        let host = Arc::clone(&host);
        let (sha, url) = package_of(&server.url);
        tokio::spawn(async move {
            let r = materialize_wanted(&host, id, &sha, &url, &wants).await;
            (r, std::time::Instant::now())
        })
    };
    let first = start("first", Arc::clone(&first_wants));
    wait_until("the first try to fail", || server.requests() == 1).await;
    let second = start("second", Arc::clone(&second_wants));
    wait_until("the second launch to wait for the version", || {
        host.cache.launches_waiting(&digest) == 2
    })
    .await;
    first_wants.store(false, Ordering::SeqCst);
    let (first, first_done) = first.await.unwrap();
    assert!(
        matches!(first, Err(PackageError::NoLongerWanted)),
        "{first:?}"
    );
    assert_eq!(
        server.requests(),
        1,
        "the stopped launch returned during the wait, before the next try"
    );
    let (second, second_done) = second.await.unwrap();
    let second = second.unwrap();
    assert!(
        second.timings.downloaded,
        "the second launch's install used the download"
    );
    assert!(first_done < second_done);
    assert_eq!(server.requests(), 2, "one download, tried twice, shared");
    assert_eq!(host.cache.downloads_in_flight(), 0);
    assert!(host.staging_is_empty());
}

/// Parity row 48, the other half: a download's retries stop once no launch waits for its
/// version. The only launch stops during the wait after the first failure; the download then
/// gives up without another try (three otherwise), and nothing is left in staging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_stops_retrying_once_no_launch_waits_for_it() {
    let archive = runner_package();
    let digest = sha(&archive);
    let server = Server::start(vec![Reply::Status(503)]).await;
    let host = Arc::new(Host::with_retry(SLOW_RETRY));
    let wants = demand();
    let launch = {
        let (host, wants, url, sha) = (
            Arc::clone(&host),
            Arc::clone(&wants),
            server.url.clone(),
            digest.clone(),
        );
        tokio::spawn(async move { materialize_wanted(&host, "only", &sha, &url, &wants).await })
    };
    wait_until("the first try to fail", || server.requests() == 1).await;
    wants.store(false, Ordering::SeqCst);
    let r = launch.await.unwrap();
    assert!(matches!(r, Err(PackageError::NoLongerWanted)), "{r:?}");
    wait_until("the download to give up", || {
        host.cache.downloads_in_flight() == 0
    })
    .await;
    assert_eq!(server.requests(), 1, "a retry for nobody");
    assert!(host.staging_is_empty());
    assert!(!host.cache.tree(&digest).exists());
}

/// Waits (at most 30 s) until `cond` holds.
async fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(
            std::time::Instant::now() < until,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
