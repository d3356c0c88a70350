//! The package cache (DESIGN §6): `packages/<sha256>/` extracted trees, their verified archives
//! in `packages/.archives/`, and trust held only in this process's memory (after a restart every
//! tree is reinstalled before use, from the kept archive once its digest checks again).
//!
//! Concurrency: `trees` is held shared to copy from a tree and exclusively to install or prune
//! one, so there is one install at a time. A launch that queued behind an install that failed
//! gets that failure instead of starting another download; its own retry policy decides when to
//! try again.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::RwLock;

use super::contents::{PackageContents, RetainedWork, TreeMismatch, sha256_file};
use super::copy::{CopyError, CopyReport, copy_tree};
use super::download::{DownloadError, Downloader};
use super::extract::{ExtractError, extract_tar_gz};
use super::fingerprint::{Fingerprint, fingerprint};
use super::timings::PackageTimings;
use crate::workspace::allocation::AllocationGuard;

/// The package an attempt's snapshot pins.
#[derive(Clone, Copy, Debug)]
pub struct PackageRef<'a> {
    /// Lower-case hex sha256 of the archive.
    pub sha256: &'a str,
    pub url: &'a str,
}

/// What kind of runtime the package goes into (from the journal, never from what the directory
/// holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeKind {
    Ephemeral,
    /// A persistent slot: its top-level `_work` is not the package's and is never opened.
    PersistentSlot,
}

/// Why a package could not be materialized.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error("the pinned digest is not 64 lower-case hex digits")]
    BadDigest,
    #[error("downloading the package failed: {0}")]
    Download(#[from] DownloadError),
    #[error("the package archive is unsafe: {0}")]
    Unsafe(ExtractError),
    #[error("the install this launch waited behind failed: {0}")]
    QueuedBehindFailedInstall(String),
    #[error("copying the package into the runtime failed: {0}")]
    Copy(#[from] CopyError),
    #[error("the runtime copy does not match the verified package: {0}")]
    CopyDiffers(TreeMismatch),
    #[error("the package cache failed ({0:?})")]
    Io(io::ErrorKind),
}

impl From<io::Error> for PackageError {
    fn from(e: io::Error) -> Self {
        Self::Io(e.kind())
    }
}

impl PackageError {
    /// Terminal for the launch: the archive is unverified or unsafe, and retrying downloads the
    /// same thing. Terminal failures are not shared with queued launches.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::BadDigest | Self::Unsafe(_))
            || matches!(self, Self::Copy(CopyError::TopLevelWork))
    }
}

/// A materialized package.
#[derive(Clone, Copy, Debug)]
pub struct Materialized {
    pub timings: PackageTimings,
    pub copy: CopyReport,
}

struct Trusted {
    fingerprint: Fingerprint,
    contents: Arc<PackageContents>,
}

#[derive(Default)]
struct State {
    trusted: HashMap<String, Trusted>,
    /// attempt → sha256.
    leases: HashMap<String, String>,
    /// The last non-terminal install failure and its serial.
    failed: Option<(u64, String)>,
}

/// What a prune did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// Versions removed.
    pub removed: Vec<String>,
    /// Whether it ran at all (it gives way to a running copy or install).
    pub ran: bool,
}

/// One per agent.
pub struct PackageCache {
    root: PathBuf,
    downloader: Downloader,
    threads: usize,
    trees: RwLock<()>,
    state: Mutex<State>,
    failures: AtomicU64,
}

impl std::fmt::Debug for PackageCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackageCache")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

fn valid_digest(sha256: &str) -> bool {
    sha256.len() == 64
        && sha256
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Runs filesystem work off the async runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, PackageError> + Send + 'static,
) -> Result<T, PackageError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|_| PackageError::Io(io::ErrorKind::Other))?
}

impl PackageCache {
    /// `root` is `<hostRoot>/packages`.
    pub fn new(root: impl Into<PathBuf>, downloader: Downloader) -> io::Result<Self> {
        let root = root.into();
        for dir in [root.clone(), root.join(".archives"), root.join(".staging")] {
            std::fs::create_dir_all(dir)?;
        }
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        Ok(Self {
            root,
            downloader,
            threads,
            trees: RwLock::new(()),
            state: Mutex::new(State::default()),
            failures: AtomicU64::new(0),
        })
    }

    /// `packages/<sha256>`.
    pub fn tree(&self, sha256: &str) -> PathBuf {
        self.root.join(sha256)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means a panic elsewhere; the table itself is still consistent
        // (every update is a single insert or remove).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The trusted contents of `sha256` if its tree still has the recorded fingerprint. A tree
    /// whose fingerprint moved is forgotten (and reinstalled by the caller).
    async fn ready(
        &self,
        sha256: &str,
        timings: &mut PackageTimings,
    ) -> Option<Arc<PackageContents>> {
        let (recorded, contents) = {
            let state = self.state();
            let t = state.trusted.get(sha256)?;
            (t.fingerprint, Arc::clone(&t.contents))
        };
        let tree = self.tree(sha256);
        let started = Instant::now();
        let now = blocking(move || Ok(fingerprint(&tree)?)).await.ok();
        timings.verify += started.elapsed();
        if now == Some(recorded) {
            Some(contents)
        } else {
            self.state().trusted.remove(sha256);
            None
        }
    }

    /// Lays the package out in `runtime` (an existing directory), leases it to `attempt`, and
    /// verifies the copy in full. On failure the runtime may hold part of the package: the
    /// attempt's cleanup, dispatched on its journalled kind, removes it.
    pub async fn materialize(
        &self,
        attempt: &str,
        package: PackageRef<'_>,
        runtime: &Path,
        kind: RuntimeKind,
    ) -> Result<Materialized, PackageError> {
        if !valid_digest(package.sha256) {
            return Err(PackageError::BadDigest);
        }
        let sha = package.sha256.to_owned();
        let queued_after = self.failures.load(Ordering::SeqCst);
        let mut timings = PackageTimings::default();
        let waited = Instant::now();
        let mut shared = self.trees.read().await;
        timings.wait += waited.elapsed();
        let contents = match self.ready(&sha, &mut timings).await {
            Some(contents) => contents,
            None => {
                drop(shared);
                let waited = Instant::now();
                let exclusive = self.trees.write().await;
                timings.wait += waited.elapsed();
                if let Some((serial, cause)) = &self.state().failed
                    && *serial > queued_after
                {
                    return Err(PackageError::QueuedBehindFailedInstall(cause.clone()));
                }
                let contents = match self.ready(&sha, &mut timings).await {
                    // Someone installed it while this launch waited.
                    Some(contents) => contents,
                    None => match self.install(package, &mut timings).await {
                        Ok(contents) => contents,
                        Err(e) => {
                            if !e.is_terminal() {
                                let serial = self.failures.fetch_add(1, Ordering::SeqCst) + 1;
                                self.state().failed = Some((serial, e.to_string()));
                            }
                            return Err(e);
                        }
                    },
                };
                shared = exclusive.downgrade();
                contents
            }
        };
        let started = Instant::now();
        let (origin, dest, threads) = (self.tree(&sha), runtime.to_path_buf(), self.threads);
        let copied = blocking(move || Ok(copy_tree(&origin, &dest, threads)?)).await;
        timings.copy += started.elapsed();
        let copy = match copied {
            Ok(copy) => copy,
            Err(e) => {
                drop(shared);
                // A failed copy may mean the source changed: re-check it, and forget it if so.
                // A tainted runtime is never a reason to download.
                let (tree, contents, threads) =
                    (self.tree(&sha), Arc::clone(&contents), self.threads);
                let intact = blocking(move || {
                    Ok(contents
                        .verify_tree(&tree, RetainedWork::Include, threads)?
                        .is_ok())
                })
                .await;
                if !matches!(intact, Ok(true)) {
                    self.state().trusted.remove(&sha);
                }
                return Err(e);
            }
        };
        // Leased while still holding the shared hold, so a prune cannot slip in between.
        self.state().leases.insert(attempt.to_owned(), sha.clone());
        drop(shared);
        let started = Instant::now();
        let work = match kind {
            RuntimeKind::Ephemeral => RetainedWork::Include,
            RuntimeKind::PersistentSlot => RetainedWork::Skip,
        };
        let (dest, threads) = (runtime.to_path_buf(), self.threads);
        let verified = blocking(move || Ok(contents.verify_tree(&dest, work, threads)?)).await;
        timings.verify += started.elapsed();
        match verified {
            Ok(Ok(())) => Ok(Materialized { timings, copy }),
            Ok(Err(mismatch)) => {
                self.release(attempt);
                Err(PackageError::CopyDiffers(mismatch))
            }
            Err(e) => {
                self.release(attempt);
                Err(e)
            }
        }
    }

    /// Install under the exclusive hold: reuse the kept archive when its digest still checks,
    /// else download it; extract into staging; commit by rename; record trust.
    async fn install(
        &self,
        package: PackageRef<'_>,
        timings: &mut PackageTimings,
    ) -> Result<Arc<PackageContents>, PackageError> {
        let started = Instant::now();
        let sha = package.sha256.to_owned();
        let tree = self.tree(&sha);
        let archive = self.root.join(".archives").join(format!("{sha}.tar.gz"));
        let staging = self
            .root
            .join(".staging")
            .join(uuid::Uuid::new_v4().simple().to_string());
        // An untrusted tree (edited, or from before a restart) is set aside whole.
        {
            let (tree, staging) = (tree.clone(), staging.clone());
            blocking(move || {
                match std::fs::rename(&tree, &staging) {
                    Ok(()) => std::fs::remove_dir_all(&staging)?,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e.into()),
                }
                Ok(())
            })
            .await?;
        }
        let kept = {
            let (archive, sha) = (archive.clone(), sha.clone());
            blocking(move || {
                Ok(match sha256_file(&archive) {
                    Ok(actual) => hex::encode(actual) == sha,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => false,
                    Err(e) => return Err(e.into()),
                })
            })
            .await?
        };
        if !kept {
            let part = self
                .root
                .join(".staging")
                .join(format!("download-{}", uuid::Uuid::new_v4().simple()));
            self.downloader.fetch(package.url, &sha, &part).await?;
            tokio::fs::rename(&part, &archive).await?;
            timings.downloaded = true;
        }
        let (archive2, staging2, tree2) = (archive.clone(), staging.clone(), tree.clone());
        let extracted = blocking(move || {
            std::fs::create_dir(&staging2)?;
            match extract_tar_gz(&archive2, &staging2) {
                Ok(contents) => {
                    std::fs::rename(&staging2, &tree2)?;
                    let print = fingerprint(&tree2)?;
                    Ok((contents, print))
                }
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&staging2);
                    if e.is_unsafe_archive() {
                        // The verified archive itself is unsafe: keeping it helps nobody.
                        let _ = std::fs::remove_file(&archive2);
                        Err(PackageError::Unsafe(e))
                    } else {
                        Err(PackageError::Io(match e {
                            ExtractError::Io(e) => e.kind(),
                            _ => io::ErrorKind::Other,
                        }))
                    }
                }
            }
        })
        .await;
        timings.install += started.elapsed();
        let (contents, print) = extracted?;
        let contents = Arc::new(contents);
        self.state().trusted.insert(
            sha,
            Trusted {
                fingerprint: print,
                contents: Arc::clone(&contents),
            },
        );
        Ok(contents)
    }

    /// Pins `sha256` for an attempt found in the journal at agent start.
    pub fn restore_lease(&self, attempt: &str, sha256: &str) {
        self.state()
            .leases
            .insert(attempt.to_owned(), sha256.to_owned());
    }

    /// Releases an attempt's lease. Idempotent.
    pub fn release(&self, attempt: &str) {
        self.state().leases.remove(attempt);
    }

    /// Whether an attempt holds a lease.
    pub fn leases(&self, attempt: &str) -> Option<String> {
        self.state().leases.get(attempt).cloned()
    }

    /// The verified contents of a trusted tree.
    pub fn contents(&self, sha256: &str) -> Option<Arc<PackageContents>> {
        self.state()
            .trusted
            .get(sha256)
            .map(|t| Arc::clone(&t.contents))
    }

    /// Whether a tree is trusted by this process.
    pub fn is_trusted(&self, sha256: &str) -> bool {
        self.state().trusted.contains_key(sha256)
    }

    /// Removes every installed version that no attempt leases and `keep` does not name. Runs
    /// under the allocation lock (so no allocation is about to lease), and gives way without
    /// waiting to a running copy or install.
    pub fn prune(
        &self,
        _allocation: &AllocationGuard<'_>,
        keep: &[&str],
    ) -> io::Result<PruneReport> {
        let Ok(_exclusive) = self.trees.try_write() else {
            return Ok(PruneReport::default());
        };
        let mut report = PruneReport {
            ran: true,
            ..PruneReport::default()
        };
        let leased: Vec<String> = self.state().leases.values().cloned().collect();
        for entry in std::fs::read_dir(&self.root)? {
            let name = entry?.file_name();
            let Some(sha) = name.to_str().filter(|n| valid_digest(n)) else {
                continue;
            };
            if keep.contains(&sha) || leased.iter().any(|l| l == sha) {
                continue;
            }
            self.state().trusted.remove(sha);
            std::fs::remove_dir_all(self.tree(sha))?;
            match std::fs::remove_file(self.root.join(".archives").join(format!("{sha}.tar.gz"))) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            report.removed.push(sha.to_owned());
        }
        report.removed.sort();
        Ok(report)
    }
}
