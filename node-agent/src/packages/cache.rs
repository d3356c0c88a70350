//! The package cache (DESIGN §6): `packages/<sha256>/` extracted trees, their verified archives
//! in `packages/.archives/`, and trust held only in this process's memory (after a restart every
//! tree is proven again before use against the kept archive's contents, once its digest checks
//! again: in place when a tree stands there, which running overlays may have as their lower).
//!
//! Seeds (`<seed root>/.seed/<sha256>/`): a runtime on another volume than the cache cannot
//! clone from it, so each registered seed root (a directory on such a volume: a slots root, a
//! runner root) gets one copy of a version, made once under the exclusive hold, read in full
//! against the contents, fingerprinted, and cloned from by every later launch on that volume.
//! A seed that cannot be made means a slower launch (a byte copy from the cache), not a failure.
//!
//! Concurrency: `trees` is held shared to copy from a tree and exclusively to install or prune
//! one, so there is one install at a time. A launch that queued behind an install that failed
//! gets that failure instead of starting another download; its own retry policy decides when to
//! try again.
//!
//! Shared downloads (parity row 48): a version's download runs as its own task, apart from the
//! launch that started it, and every launch that needs the version while it runs waits for that
//! one. A launch whose attempt stops wanting the package (terminated, deleted) stops waiting —
//! for the hold or for the download — without cancelling the download another launch still
//! waits for; the download's retries go on only while some launch still wants the version.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{RwLock, watch};

use super::contents::{CopyCheck, PackageContents, RetainedWork, TreeMismatch, sha256_file};
use super::copy::{CopyError, CopyReport, copy_tree_checked};
use super::download::{DownloadError, Downloader, Tap, tap};
use super::extract::{ExtractError, ExtractLimits, extract_tar_gz_from};
use super::fingerprint::{Fingerprint, fingerprint};
use super::origin::{prove_origin, proven_by_construction, still_intact};
use super::overlay::{Materializer, OverlayError};
use super::timings::InstallProof;
use super::timings::PackageTimings;
use crate::workspace::allocation::AllocationGuard;
use crate::workspace::remove::remove_tree;

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
    #[error("the package archive was refused before: {1}")]
    RefusedBefore(PackageRefusal, String),
    #[error("the install this launch waited behind failed: {0}")]
    QueuedBehindFailedInstall(String),
    #[error("copying the package into the runtime failed: {0}")]
    Copy(#[from] CopyError),
    #[error("mounting the package into the runtime failed: {0}")]
    Overlay(#[from] OverlayError),
    #[error("the runtime copy does not match the verified package: {0}")]
    CopyDiffers(TreeMismatch),
    /// The installed tree does not hold what its archive holds, and a runner still runs on it
    /// (leased, or the lower of a mount): it is not removed from under them; a launch after
    /// they ended replaces it.
    #[error("the installed tree differs from its archive and runners still run on it")]
    TreeInUse,
    #[error("the package cache failed ({0:?})")]
    Io(io::ErrorKind),
    /// The launch stopped wanting the package (its attempt was terminated or deleted) while it
    /// waited for it; a download other launches wait for goes on.
    #[error("the launch no longer wants the package")]
    NoLongerWanted,
}

impl From<io::Error> for PackageError {
    fn from(e: io::Error) -> Self {
        Self::Io(e.kind())
    }
}

/// Why an archive was refused for its digest (closed: it reaches conditions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackageRefusal {
    /// It inflates past an extraction cap.
    CapExceeded,
    /// It holds an unsafe entry.
    Unsafe,
}

impl PackageError {
    /// Whether (and why) the archive itself was refused, now or by an earlier launch.
    pub fn refusal(&self) -> Option<PackageRefusal> {
        match self {
            Self::Unsafe(ExtractError::TooLarge { .. })
            | Self::Download(DownloadError::TooLarge { .. }) => Some(PackageRefusal::CapExceeded),
            Self::Download(DownloadError::InsecureUrl) => Some(PackageRefusal::Unsafe),
            Self::Unsafe(_) => Some(PackageRefusal::Unsafe),
            Self::RefusedBefore(refusal, _) => Some(*refusal),
            _ => None,
        }
    }

    /// Terminal for the launch: the archive is unverified or unsafe, and retrying downloads the
    /// same thing. Terminal failures are not shared with queued launches.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Self::BadDigest
                | Self::Unsafe(_)
                | Self::RefusedBefore(..)
                | Self::Download(DownloadError::TooLarge { .. } | DownloadError::InsecureUrl)
        ) || matches!(self, Self::Copy(CopyError::TopLevelWork))
    }
}

/// What one round of a materialize did.
enum Laid {
    Done(Materialized),
    /// (Overlay) the trusted tree changed or vanished since it was trusted: it is forgotten and
    /// the runtime is as before the round; a second round installs it again.
    OriginChanged,
}

/// What one launch asked [`PackageCache::materialize_while`] for, handed to each of its rounds.
#[derive(Clone, Copy)]
struct Launch<'a> {
    attempt: &'a str,
    package: PackageRef<'a>,
    runtime: &'a Path,
    kind: RuntimeKind,
    demand: Demand<'a>,
}

/// A materialized package.
#[derive(Clone, Copy, Debug)]
pub struct Materialized {
    pub timings: PackageTimings,
    pub copy: CopyReport,
    /// How the copy's bytes were checked after it was laid out.
    pub check: CopyCheck,
    /// How the package was laid in: an overlay mount (no copy: `copy` is all zeros) or a copy.
    pub by: Materializer,
}

struct Trusted {
    fingerprint: Fingerprint,
    contents: Arc<PackageContents>,
    /// Whether the tree was read in full against the contents after `fingerprint` was taken
    /// (done once, by the first launch that clones from it).
    proven: bool,
    /// Seeds of this version, by the device of their volume. Always proven.
    seeds: HashMap<u64, Seed>,
    /// Volumes where making a seed of this version failed: not retried for this install, so a
    /// full volume does not put every launch behind the exclusive hold.
    unseedable: HashSet<u64>,
}

#[derive(Clone, Debug)]
struct Seed {
    path: PathBuf,
    fingerprint: Fingerprint,
}

/// A directory on a volume other than the cache's, where seeds go.
#[derive(Clone, Debug)]
struct SeedRoot {
    /// `<root>/.seed`.
    dir: PathBuf,
    dev: u64,
}

/// Where a copy is made from, and what is known about it.
#[derive(Clone, Debug)]
struct Origin {
    path: PathBuf,
    fingerprint: Fingerprint,
    proven: bool,
    /// The seed's device, when the origin is a seed.
    seed: Option<u64>,
}

/// A trusted version, read under a hold.
struct Ready {
    contents: Arc<PackageContents>,
    tree: Origin,
    seed: Option<Origin>,
}

#[derive(Default)]
struct State {
    trusted: HashMap<String, Trusted>,
    /// attempt → sha256.
    leases: HashMap<String, String>,
    /// The last non-terminal install failure and its serial.
    failed: Option<(u64, String)>,
    /// Digests whose archive was refused (unsafe, or past a cap), with why: the same archive
    /// refuses the same way, so later launches fail at once instead of downloading and
    /// inflating it again. Kept until the agent restarts (which is how a raised cap applies).
    refused: HashMap<String, (PackageRefusal, String)>,
    /// When each version was last leased by this process: the agent keeps recently used
    /// versions through a prune, so two policies on different versions do not evict each other.
    used: HashMap<String, Instant>,
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
    /// The cache's own device: a runtime there clones from the tree itself.
    dev: u64,
    seed_roots: Vec<SeedRoot>,
    downloader: Downloader,
    limits: ExtractLimits,
    threads: usize,
    /// Overlay or copy, decided once at start (`--materialize`).
    materializer: Materializer,
    trees: RwLock<()>,
    state: Mutex<State>,
    failures: AtomicU64,
    /// Launches inside `materialize` for each version, by sha256: a shared download retries
    /// only while one remains.
    interest: Arc<Mutex<HashMap<String, usize>>>,
    /// Downloads in flight, by sha256, with their result once done.
    downloads: Arc<Mutex<HashMap<String, DownloadWatch>>>,
}

/// A shared download's result, `None` while it runs.
type DownloadWatch = watch::Receiver<Option<Result<(), DownloadError>>>;

/// What a launch asks to know whether it still wants its package.
pub type Demand<'a> = &'a (dyn Fn() -> bool + Send + Sync);

/// How often a waiting launch asks whether it is still wanted.
const DEMAND_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Resolves once `demand` says the package is no longer wanted.
async fn until_unwanted(demand: Demand<'_>) {
    while demand() {
        tokio::time::sleep(DEMAND_POLL).await;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every update under these locks is one insert or remove: a panic elsewhere leaves them
    // consistent.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One launch's interest in a version, for as long as it is inside `materialize`.
struct Interest {
    map: Arc<Mutex<HashMap<String, usize>>>,
    sha: String,
}

impl Interest {
    fn new(map: &Arc<Mutex<HashMap<String, usize>>>, sha: &str) -> Self {
        *lock(map).entry(sha.to_owned()).or_default() += 1;
        Self {
            map: Arc::clone(map),
            sha: sha.to_owned(),
        }
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        let mut map = lock(&self.map);
        if let Some(n) = map.get_mut(&self.sha) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.sha);
            }
        }
    }
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

/// A staging directory removed when this goes, on every path (an error's `?`, a panic, a task
/// output nobody awaited), unless it was renamed into the cache (`.0` taken).
struct Staging(Option<PathBuf>);

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(path) = self.0.take()
            && let Err(error) = remove_tree(&path)
            && error.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(%error, "a staging directory could not be removed");
        }
    }
}

impl PackageCache {
    /// `root` is `<hostRoot>/packages`.
    pub fn new(root: impl Into<PathBuf>, downloader: Downloader) -> io::Result<Self> {
        let root = root.into();
        for dir in [root.clone(), root.join(".archives"), root.join(".staging")] {
            std::fs::create_dir_all(dir)?;
        }
        // Whatever staging holds is an install or a download this process never finished (one
        // cache per agent, made at its start): nothing there was ever trusted, and a crash
        // mid-install must not leave it for good.
        // One that cannot go (a mount on it, a disk error) is left and logged: the agent must
        // still start, and nothing reads staging but the install that made it.
        for entry in std::fs::read_dir(root.join(".staging"))? {
            let swept = entry.and_then(|e| remove_tree(&e.path()).map(drop));
            if let Err(error) = swept {
                tracing::warn!(%error, "a staging entry left by an earlier agent could not be swept");
            }
        }
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let dev = std::fs::metadata(&root)?.dev();
        Ok(Self {
            root,
            dev,
            seed_roots: Vec::new(),
            downloader,
            limits: ExtractLimits::default(),
            threads,
            materializer: Materializer::Copy,
            trees: RwLock::new(()),
            state: Mutex::new(State::default()),
            failures: AtomicU64::new(0),
            interest: Arc::default(),
            downloads: Arc::default(),
        })
    }

    /// Caps what one archive may inflate to (the defaults otherwise).
    pub fn with_extract_limits(mut self, limits: ExtractLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Lays packages in by `materializer` (the copy unless told otherwise).
    pub fn with_materializer(mut self, materializer: Materializer) -> Self {
        self.materializer = materializer;
        self
    }

    /// How this cache lays packages into runtimes.
    pub fn materializer(&self) -> Materializer {
        self.materializer
    }

    /// Registers `root`, a directory on a volume where runtimes live, for seeds
    /// (`<root>/.seed/<sha256>`). A root on the cache's own volume is ignored: runtimes there
    /// clone from the cache. Needs an existing `root`.
    pub fn with_seed_root(mut self, root: &Path) -> io::Result<Self> {
        let dev = std::fs::metadata(root)?.dev();
        if dev != self.dev && !self.seed_roots.iter().any(|r| r.dev == dev) {
            self.seed_roots.push(SeedRoot {
                dir: root.join(".seed"),
                dev,
            });
        }
        Ok(self)
    }

    /// `packages/<sha256>`.
    pub fn tree(&self, sha256: &str) -> PathBuf {
        self.root.join(sha256)
    }

    /// The seed path of `sha256` on the volume of a registered seed root.
    pub fn seed_path(&self, seed_root: &Path, sha256: &str) -> PathBuf {
        seed_root.join(".seed").join(sha256)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means a panic elsewhere; the table itself is still consistent
        // (every update is a single insert or remove).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The trusted contents of `sha256` if its tree still has the recorded fingerprint, with
    /// the seed on `seed_root`'s volume if that one still has its own. A tree whose fingerprint
    /// moved is forgotten (and reinstalled by the caller); so is a seed. Without `walk` the
    /// fingerprints are not taken here: the caller checks the tree once it is in use (the
    /// overlay, after its mount).
    async fn ready(
        &self,
        sha256: &str,
        seed_root: Option<&SeedRoot>,
        timings: &mut PackageTimings,
        walk: bool,
    ) -> Option<Ready> {
        let (tree, contents, seed) = {
            let state = self.state();
            let t = state.trusted.get(sha256)?;
            let tree = Origin {
                path: self.tree(sha256),
                fingerprint: t.fingerprint,
                proven: t.proven,
                seed: None,
            };
            let seed = seed_root
                .and_then(|r| t.seeds.get(&r.dev).map(|s| (r.dev, s.clone())))
                .map(|(dev, s)| Origin {
                    path: s.path,
                    fingerprint: s.fingerprint,
                    proven: true,
                    seed: Some(dev),
                });
            (tree, Arc::clone(&t.contents), seed)
        };
        let started = Instant::now();
        let (tree2, seed2) = (tree.clone(), seed.clone());
        let intact = if walk {
            blocking(move || {
                Ok((
                    still_intact(&tree2.path, tree2.fingerprint),
                    seed2.is_some_and(|s| still_intact(&s.path, s.fingerprint)),
                ))
            })
            .await
            .ok()
        } else {
            Some((true, false))
        };
        timings.verify += started.elapsed();
        match intact {
            Some((true, seed_intact)) => {
                if !seed_intact && let Some(dev) = seed.as_ref().and_then(|s| s.seed) {
                    self.forget_seed(sha256, dev);
                }
                Some(Ready {
                    contents,
                    tree,
                    seed: seed.filter(|_| seed_intact),
                })
            }
            _ => {
                self.state().trusted.remove(sha256);
                None
            }
        }
    }

    fn forget_seed(&self, sha256: &str, dev: u64) {
        if let Some(t) = self.state().trusted.get_mut(sha256) {
            t.seeds.remove(&dev);
        }
    }

    /// Forgets whichever origin a copy came from.
    fn forget_origin(&self, sha256: &str, origin: &Origin) {
        match origin.seed {
            Some(dev) => self.forget_seed(sha256, dev),
            None => {
                self.state().trusted.remove(sha256);
            }
        }
    }

    /// Lays the package out in `runtime` (an existing directory), leases it to `attempt`, and
    /// verifies the copy: every byte of it is checked against the verified contents, either as
    /// it is copied or, for a clone, through its proven origin (see [`CopyReport::check`]).
    /// On failure the runtime may hold part of the package: the attempt's cleanup, dispatched
    /// on its journalled kind, removes it.
    pub async fn materialize(
        &self,
        attempt: &str,
        package: PackageRef<'_>,
        runtime: &Path,
        kind: RuntimeKind,
    ) -> Result<Materialized, PackageError> {
        self.materialize_while(attempt, package, runtime, kind, &|| true)
            .await
    }

    /// [`Self::materialize`] for a launch that may stop wanting the package: while it waits for
    /// the cache's hold or for the version's download, `demand` is asked every
    /// [`DEMAND_POLL`], and once it says no the launch gets `NoLongerWanted` at once — the
    /// download itself goes on for any other launch that waits for it.
    pub async fn materialize_while(
        &self,
        attempt: &str,
        package: PackageRef<'_>,
        runtime: &Path,
        kind: RuntimeKind,
        demand: Demand<'_>,
    ) -> Result<Materialized, PackageError> {
        if !valid_digest(package.sha256) {
            return Err(PackageError::BadDigest);
        }
        // An overlay's tree is walked once per launch, after its mount (it was walked before the
        // mount too, the same check an instant earlier: 30-60 ms of each warm launch). A tree
        // that changed since it was trusted is found there, forgotten and unmounted, and the
        // launch goes round once more, which installs it again, as the walk before the mount
        // made it do.
        let launch = Launch {
            attempt,
            package,
            runtime,
            kind,
            demand,
        };
        for _ in 0..2 {
            if let Laid::Done(m) = self.materialize_once(launch).await? {
                return Ok(m);
            }
        }
        // Changed again under the fresh install: not a tree this launch can trust.
        Err(PackageError::CopyDiffers(TreeMismatch {
            missing: 0,
            extra: 0,
            changed: 1,
        }))
    }

    async fn materialize_once(&self, launch: Launch<'_>) -> Result<Laid, PackageError> {
        let Launch {
            attempt,
            package,
            runtime,
            kind,
            demand,
        } = launch;
        let _interest = Interest::new(&self.interest, package.sha256);
        // The overlay checks its tree after the mount instead (see `materialize_while`).
        let walk = self.materializer != Materializer::Overlay;
        let sha = package.sha256.to_owned();
        let queued_after = self.failures.load(Ordering::SeqCst);
        let mut timings = PackageTimings::default();
        // Only asked when seeds are configured (most hosts keep runtimes on the cache's volume),
        // and never for an overlay: its lower may be on any volume.
        let seed_root = if self.seed_roots.is_empty() || self.materializer == Materializer::Overlay
        {
            None
        } else {
            let runtime = runtime.to_path_buf();
            let roots = self.seed_roots.clone();
            let dev = self.dev;
            blocking(move || {
                let rt = std::fs::metadata(&runtime)?.dev();
                Ok((rt != dev)
                    .then(|| roots.into_iter().find(|r| r.dev == rt))
                    .flatten())
            })
            .await?
        };
        let waited = Instant::now();
        let mut shared = tokio::select! {
            held = self.trees.read() => held,
            () = until_unwanted(demand) => return Err(PackageError::NoLongerWanted),
        };
        timings.wait += waited.elapsed();
        let ready = match self
            .ready(&sha, seed_root.as_ref(), &mut timings, walk)
            .await
        {
            Some(ready)
                if ready.seed.is_some()
                    || seed_root
                        .as_ref()
                        .is_none_or(|r| self.unseedable(&sha, r.dev)) =>
            {
                ready
            }
            early => {
                drop(shared);
                let waited = Instant::now();
                let exclusive = tokio::select! {
                    held = self.trees.write() => held,
                    () = until_unwanted(demand) => return Err(PackageError::NoLongerWanted),
                };
                timings.wait += waited.elapsed();
                if early.is_none()
                    && let Some((serial, cause)) = &self.state().failed
                    && *serial > queued_after
                {
                    return Err(PackageError::QueuedBehindFailedInstall(cause.clone()));
                }
                if let Some((refusal, why)) = self.state().refused.get(&sha) {
                    return Err(PackageError::RefusedBefore(*refusal, why.clone()));
                }
                let mut ready = match self
                    .ready(&sha, seed_root.as_ref(), &mut timings, walk)
                    .await
                {
                    // Someone installed it while this launch waited.
                    Some(ready) => ready,
                    None => match self.install(package, &mut timings, demand).await {
                        Ok(ready) => ready,
                        Err(e) => {
                            if let (Some(refusal), PackageError::Unsafe(why)) = (e.refusal(), &e) {
                                self.state()
                                    .refused
                                    .insert(sha.clone(), (refusal, why.to_string()));
                            }
                            // A launch that stopped wanting the package failed nothing for
                            // those queued behind it.
                            if !e.is_terminal() && !matches!(e, PackageError::NoLongerWanted) {
                                let serial = self.failures.fetch_add(1, Ordering::SeqCst) + 1;
                                self.state().failed = Some((serial, e.to_string()));
                            }
                            return Err(e);
                        }
                    },
                };
                if let Some(root) = &seed_root
                    && ready.seed.is_none()
                    && !self.unseedable(&sha, root.dev)
                {
                    let started = Instant::now();
                    ready.seed = self.make_seed(&sha, root, &ready).await;
                    timings.install += started.elapsed();
                }
                shared = exclusive.downgrade();
                ready
            }
        };
        if self.materializer == Materializer::Overlay {
            return self
                .mount_overlay(attempt, &sha, ready, runtime, shared, timings)
                .await;
        }
        self.copy_into(attempt, &sha, ready, runtime, kind, shared, timings)
            .await
            .map(Laid::Done)
    }

    /// The copy materializer's part of [`Self::materialize_once`]: lay `ready` into `runtime`,
    /// check it and lease it, under the shared hold.
    #[allow(clippy::too_many_arguments)]
    async fn copy_into(
        &self,
        attempt: &str,
        sha: &str,
        ready: Ready,
        runtime: &Path,
        kind: RuntimeKind,
        shared: tokio::sync::RwLockReadGuard<'_, ()>,
        mut timings: PackageTimings,
    ) -> Result<Materialized, PackageError> {
        let sha = sha.to_owned();
        let origin = ready.seed.clone().unwrap_or_else(|| ready.tree.clone());
        let started = Instant::now();
        let copied = {
            let (origin, dest, threads) = (origin.clone(), runtime.to_path_buf(), self.threads);
            let contents = Arc::clone(&ready.contents);
            blocking(move || {
                let copy = copy_tree_checked(&origin.path, &dest, &contents, threads)?;
                Ok(copy)
            })
            .await
        };
        timings.copy += started.elapsed();
        let copy = match copied {
            Ok(copy) => copy,
            Err(e) => {
                drop(shared);
                // A failed copy may mean the origin changed: re-check it, and forget it if so.
                // A tainted runtime is never a reason to download.
                let (path, contents, threads) = (
                    origin.path.clone(),
                    Arc::clone(&ready.contents),
                    self.threads,
                );
                let intact = blocking(move || {
                    Ok(contents
                        .verify_tree(&path, RetainedWork::Include, threads)?
                        .is_ok())
                })
                .await;
                if !matches!(intact, Ok(true)) {
                    self.forget_origin(&sha, &origin);
                }
                return Err(e);
            }
        };
        if copy.differing > 0 {
            // Bytes read from the origin differ from the verified contents: the origin was
            // changed since it was trusted. Forget it; the next launch reinstalls or reseeds.
            drop(shared);
            self.forget_origin(&sha, &origin);
            return Err(PackageError::CopyDiffers(TreeMismatch {
                missing: 0,
                extra: 0,
                changed: usize::try_from(copy.differing).unwrap_or(usize::MAX),
            }));
        }
        if let Some(dev) = origin.seed
            && copy.reflinked == 0
        {
            // The seed's volume cannot clone: a seed there only moves reads onto that disk.
            // Later launches copy from the cache; the seed goes with its version's prune.
            if let Some(t) = self.state().trusted.get_mut(&sha) {
                t.seeds.remove(&dev);
                t.unseedable.insert(dev);
            }
        }
        // Still under the shared hold, so the origin is neither pruned nor reseeded meanwhile.
        let started = Instant::now();
        let origin_intact = if copy.reflinked == 0 {
            false
        } else {
            let (origin2, contents, threads) =
                (origin.clone(), Arc::clone(&ready.contents), self.threads);
            let intact = blocking(move || {
                // The first clone from a tree pays for the tree's proof, once per install.
                let proven = origin2.proven
                    || prove_origin(&origin2.path, &contents, origin2.fingerprint, threads)?;
                Ok((
                    proven,
                    proven && still_intact(&origin2.path, origin2.fingerprint),
                ))
            })
            .await;
            match intact {
                Ok((proven, intact)) => {
                    if proven && !origin.proven && origin.seed.is_none() {
                        self.mark_proven(&sha, origin.fingerprint);
                    }
                    if !intact {
                        // Changed while cloned, or never held what the contents say.
                        self.forget_origin(&sha, &origin);
                    }
                    intact
                }
                Err(_) => false,
            }
        };
        timings.verify += started.elapsed();
        // Leased while still holding the shared hold, so a prune cannot slip in between.
        {
            let mut state = self.state();
            state.leases.insert(attempt.to_owned(), sha.clone());
            state.used.insert(sha.clone(), Instant::now());
        }
        drop(shared);
        let started = Instant::now();
        let work = match kind {
            RuntimeKind::Ephemeral => RetainedWork::Include,
            RuntimeKind::PersistentSlot => RetainedWork::Skip,
        };
        let check = copy.check(origin_intact);
        let (dest, threads, contents) = (runtime.to_path_buf(), self.threads, ready.contents);
        let verified =
            blocking(move || Ok(contents.verify_copy(&dest, work, check, threads)?)).await;
        timings.verify += started.elapsed();
        match verified {
            Ok(Ok(())) => Ok(Materialized {
                timings,
                copy,
                check,
                by: Materializer::Copy,
            }),
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

    /// The overlay materialize, under the shared hold `ready` was read under (so the tree is
    /// neither pruned nor reinstalled meanwhile): the tree's bytes are read against the contents
    /// once per install (the first mount pays, as the first clone does); then the mount, and
    /// the tree's fingerprint, so what the runtime shows is the trusted tree from the mount on.
    /// No byte is copied or read per launch after the first, and the tree is walked once. A tree
    /// that changed (or vanished) since it was trusted is forgotten, the runtime unmounted, and
    /// the caller goes round once more ([`Laid::OriginChanged`]).
    async fn mount_overlay(
        &self,
        attempt: &str,
        sha: &str,
        ready: Ready,
        runtime: &Path,
        shared: tokio::sync::RwLockReadGuard<'_, ()>,
        mut timings: PackageTimings,
    ) -> Result<Laid, PackageError> {
        let tree = ready.tree;
        let started = Instant::now();
        let proven = {
            let (tree, contents, threads) =
                (tree.clone(), Arc::clone(&ready.contents), self.threads);
            blocking(move || {
                Ok(tree.proven || prove_origin(&tree.path, &contents, tree.fingerprint, threads)?)
            })
            .await?
        };
        timings.verify += started.elapsed();
        if !proven {
            // The tree does not hold what its archive held: forget it; the next launch
            // reinstalls it from the kept archive.
            drop(shared);
            self.state().trusted.remove(sha);
            return Err(PackageError::CopyDiffers(TreeMismatch {
                missing: 0,
                extra: 0,
                changed: 1,
            }));
        }
        if !tree.proven {
            self.mark_proven(sha, tree.fingerprint);
        }
        let started = Instant::now();
        let (lower, rt) = (tree.path.clone(), runtime.to_path_buf());
        let mounted = blocking(move || {
            super::overlay::mount_package(&lower, &rt)?;
            Ok(())
        })
        .await;
        timings.copy += started.elapsed();
        if let Err(e) = mounted {
            // No walk before the mount any more: a tree that vanished or changed is found here.
            let (path, fingerprint) = (tree.path.clone(), tree.fingerprint);
            if !blocking(move || Ok(still_intact(&path, fingerprint)))
                .await
                .unwrap_or(false)
            {
                drop(shared);
                self.state().trusted.remove(sha);
                return Ok(Laid::OriginChanged);
            }
            return Err(e);
        }
        {
            let mut state = self.state();
            state.leases.insert(attempt.to_owned(), sha.to_owned());
            state.used.insert(sha.to_owned(), Instant::now());
        }
        let started = Instant::now();
        let path = tree.path.clone();
        let intact = blocking(move || Ok(still_intact(&path, tree.fingerprint))).await?;
        timings.verify += started.elapsed();
        drop(shared);
        if !intact {
            // Changed since it was trusted: the runtime shows what it holds now, unproven.
            // Forgotten and unmounted here, so this launch installs it again; an unmount that
            // fails leaves the mount to the attempt's cleanup and fails this launch.
            self.state().trusted.remove(sha);
            self.release(attempt);
            let rt = runtime.to_path_buf();
            blocking(move || {
                super::overlay::unmount(&rt)?;
                super::overlay::remove_work_dir(&rt)?;
                Ok(())
            })
            .await?;
            return Ok(Laid::OriginChanged);
        }
        Ok(Laid::Done(Materialized {
            timings,
            copy: CopyReport::default(),
            check: CopyCheck::LayoutOnly,
            by: Materializer::Overlay,
        }))
    }

    fn unseedable(&self, sha256: &str, dev: u64) -> bool {
        self.state()
            .trusted
            .get(sha256)
            .is_some_and(|t| t.unseedable.contains(&dev))
    }

    fn mark_proven(&self, sha256: &str, at: Fingerprint) {
        if let Some(t) = self.state().trusted.get_mut(sha256)
            && t.fingerprint == at
        {
            t.proven = true;
        }
    }

    /// Makes the seed of a trusted version on `root`'s volume, under the exclusive hold: a
    /// checked copy into a staging directory, a rename, a fingerprint, then a full read against
    /// the contents (the seed's proof). `None` when any step fails: the launch copies from the
    /// cache instead.
    async fn make_seed(&self, sha256: &str, root: &SeedRoot, ready: &Ready) -> Option<Origin> {
        let (dir, sha, cache) = (root.dir.clone(), sha256.to_owned(), self.root.clone());
        let (tree, contents, threads) = (
            ready.tree.path.clone(),
            Arc::clone(&ready.contents),
            self.threads,
        );
        let made = blocking(move || {
            let seed = dir.join(&sha);
            // Whatever stands there is untrusted (a stale seed, an interrupted staging), and a
            // seed of a version the cache no longer holds is abandoned (its prune did not reach
            // it, or it predates a restart): all go. Seeds of installed versions stay.
            for entry in std::fs::read_dir(&dir).into_iter().flatten() {
                let name = entry?.file_name();
                let name_str = name.to_string_lossy();
                let abandoned = valid_digest(&name_str) && !cache.join(&name).exists();
                if name == sha.as_str() || name_str.starts_with(".staging-") || abandoned {
                    remove_tree(&dir.join(&name))?;
                }
            }
            std::fs::create_dir_all(&dir)?;
            let staging = dir.join(format!(".staging-{}", uuid::Uuid::new_v4().simple()));
            std::fs::create_dir(&staging)?;
            let copied = copy_tree_checked(&tree, &staging, &contents, threads);
            if !matches!(copied, Ok(CopyReport { differing: 0, .. })) {
                let _ = remove_tree(&staging);
                return Ok(None);
            }
            std::fs::rename(&staging, &seed)?;
            let print = fingerprint(&seed)?;
            if !prove_origin(&seed, &contents, print, threads)? {
                let _ = remove_tree(&seed);
                return Ok(None);
            }
            Ok(Some((seed, print)))
        })
        .await;
        let Some((path, print)) = made.ok().flatten() else {
            if let Some(t) = self.state().trusted.get_mut(sha256) {
                t.unseedable.insert(root.dev);
            }
            return None;
        };
        if let Some(t) = self.state().trusted.get_mut(sha256) {
            t.seeds.insert(
                root.dev,
                Seed {
                    path: path.clone(),
                    fingerprint: print,
                },
            );
        }
        Some(Origin {
            path,
            fingerprint: print,
            proven: true,
            seed: Some(root.dev),
        })
    }

    /// Install under the exclusive hold: reuse the kept archive when its digest still checks,
    /// else download it — extracting it into a staging directory of its own as it streams in,
    /// which is used only once the download's digest matched (otherwise it is removed, and the
    /// kept archive is extracted after the download's retries, as before); extract into staging;
    /// then adopt a tree standing there if it proves against the contents (it may be the lower
    /// of running overlays), else replace it by the staging's rename unless something runs on it
    /// ([`PackageError::TreeInUse`]); record trust. A tree renamed in from this process's own
    /// extraction is proven by construction ([`proven_by_construction`]), so its first mount or
    /// clone reads nothing again.
    async fn install(
        &self,
        package: PackageRef<'_>,
        timings: &mut PackageTimings,
        demand: Demand<'_>,
    ) -> Result<Ready, PackageError> {
        let started = Instant::now();
        let sha = package.sha256.to_owned();
        let tree = self.tree(&sha);
        let archive = self.root.join(".archives").join(format!("{sha}.tar.gz"));
        let new_staging = || {
            self.root
                .join(".staging")
                .join(uuid::Uuid::new_v4().simple().to_string())
        };
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
        let (limits, threads) = (self.limits, self.threads);
        let mut streamed = None;
        if !kept {
            let downloading = Instant::now();
            let (tap, reader) = tap();
            let stream_staging = new_staging();
            let extraction = {
                let staging = stream_staging.clone();
                tokio::task::spawn_blocking(move || {
                    // Held by the task's output: a launch that stops waiting for it (dropped, or
                    // failed elsewhere) drops the output and with it the staging.
                    let guard = Staging(Some(staging.clone()));
                    std::fs::create_dir(&staging)
                        .map_err(ExtractError::from)
                        .and_then(|()| extract_tar_gz_from(reader, &staging, limits))
                        .map(|extracted| (guard, extracted))
                })
            };
            if let Err(e) = self
                .shared_download(package, &archive, demand, Some(tap))
                .await
            {
                // The extraction's staging goes with its output (see `Staging`), on a blocking
                // thread: a finished extraction's staging is a whole runner-sized tree.
                let cleanup = async move {
                    if let Ok(out) = extraction.await {
                        let _ = tokio::task::spawn_blocking(move || drop(out)).await;
                    }
                };
                if matches!(e, PackageError::NoLongerWanted) {
                    // The download may go on for other launches and still feed this extraction:
                    // whatever it leaves goes when it ends.
                    tokio::spawn(cleanup);
                } else {
                    // The download ended, and with it the tap: the extraction ends at once.
                    cleanup.await;
                }
                return Err(e);
            }
            timings.downloaded = true;
            timings.download = downloading.elapsed();
            let waited = Instant::now();
            // Any failure here (the try that fed it failed, an unverified stream it refused, a
            // disk error) leaves nothing and falls back to the verified kept archive, whose
            // extraction decides what the archive is.
            if let Ok(Ok((guard, extracted))) = extraction.await {
                streamed = Some((stream_staging, guard, extracted));
            }
            timings.extract = waited.elapsed();
        }
        // A tree already standing there (from before a restart, or one that moved) may be the
        // live lower of running overlays, whose next read would fail if it went: it is proven in
        // place against the archive's contents and adopted if it holds them, and replaced only
        // when nothing runs on it.
        // A copy leaves nothing running on the tree: a lease there only keeps it from a prune.
        let in_use_by_lease = self.materializer == Materializer::Overlay
            && self.state().leases.values().any(|l| *l == sha);
        let (archive2, tree2) = (archive.clone(), tree.clone());
        let (file_staging, aside) = (new_staging(), new_staging());
        let streamed_in = streamed.is_some();
        let extracting = Instant::now();
        let extracted = blocking(move || {
            let (staging2, mut guard, extracted) = match streamed {
                Some(done) => done,
                None => {
                    let guard = Staging(Some(file_staging.clone()));
                    std::fs::create_dir(&file_staging)?;
                    let from_file = std::fs::File::open(&archive2)
                        .map_err(ExtractError::from)
                        .and_then(|file| extract_tar_gz_from(file, &file_staging, limits));
                    match from_file {
                        Ok(extracted) => (file_staging, guard, extracted),
                        Err(e) => {
                            let _ = remove_tree(&file_staging);
                            return Err(if e.is_unsafe_archive() {
                                // The verified archive itself is unsafe: keeping it helps nobody.
                                let _ = std::fs::remove_file(&archive2);
                                PackageError::Unsafe(e)
                            } else {
                                PackageError::Io(match e {
                                    ExtractError::Io(e) => e.kind(),
                                    _ => io::ErrorKind::Other,
                                })
                            });
                        }
                    }
                }
            };
            let extract_done = Instant::now();
            if std::fs::symlink_metadata(&tree2).is_ok() {
                let proven = fingerprint(&tree2).ok().and_then(|print| {
                    prove_origin(&tree2, &extracted.contents, print, threads)
                        .ok()
                        .filter(|proven| *proven)
                        .map(|_| print)
                });
                if let Some(print) = proven {
                    remove_tree(&staging2)?;
                    return Ok((extracted.contents, print, true, extract_done));
                }
                if in_use_by_lease || super::overlay::is_lower_of_a_mount(&tree2)? {
                    let _ = remove_tree(&staging2);
                    return Err(PackageError::TreeInUse);
                }
                std::fs::rename(&tree2, &aside)?;
                let _aside = Staging(Some(aside.clone()));
                remove_tree(&aside)?;
            }
            std::fs::rename(&staging2, &tree2)?;
            // Renamed in: the tree is the cache's now, not staging to remove.
            guard.0 = None;
            let (print, proven) = match proven_by_construction(&tree2, &extracted)? {
                Some(print) => (print, true),
                None => (fingerprint(&tree2)?, false),
            };
            Ok((extracted.contents, print, proven, extract_done))
        })
        .await;
        timings.install += started.elapsed();
        let (contents, print, proven, extract_done) = extracted?;
        let fingerprinted = extract_done.elapsed();
        if !streamed_in {
            timings.extract += extracting.elapsed().saturating_sub(fingerprinted);
        }
        // One line per step, on the log's closed field names (the split of a cold launch).
        let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let proof = match (streamed_in, proven) {
            (true, true) => InstallProof::StreamedByConstruction,
            (false, true) => InstallProof::ByConstruction,
            (_, false) => InstallProof::Pending,
        };
        timings.installed = Some(proof);
        let outcome = proof.as_str();
        for (step, took) in [
            ("package_download", timings.download),
            ("package_extract", timings.extract),
            ("package_fingerprint", fingerprinted),
            ("package_install", timings.install),
        ] {
            tracing::info!(step, elapsed_ms = ms(took), outcome, "package install step");
        }
        let contents = Arc::new(contents);
        self.state().trusted.insert(
            sha,
            Trusted {
                fingerprint: print,
                contents: Arc::clone(&contents),
                proven,
                seeds: HashMap::new(),
                unseedable: HashSet::new(),
            },
        );
        Ok(Ready {
            contents,
            tree: Origin {
                path: tree,
                fingerprint: print,
                proven,
                seed: None,
            },
            seed: None,
        })
    }

    /// Waits for the version's download into `archive`: the one in flight, or a new one. Gives
    /// up waiting (not the download) once `demand` says no.
    async fn shared_download(
        &self,
        package: PackageRef<'_>,
        archive: &Path,
        demand: Demand<'_>,
        mut tap: Option<Tap>,
    ) -> Result<(), PackageError> {
        loop {
            let mut done = {
                let mut downloads = lock(&self.downloads);
                match downloads.get(package.sha256) {
                    Some(running) => running.clone(),
                    None => {
                        let started = self.start_download(package, archive, tap.take());
                        downloads.insert(package.sha256.to_owned(), started.clone());
                        started
                    }
                }
            };
            let result = tokio::select! {
                r = done.wait_for(Option::is_some) => r.ok().and_then(|r| (*r).clone()),
                () = until_unwanted(demand) => return Err(PackageError::NoLongerWanted),
            };
            match result {
                Some(Ok(())) => return Ok(()),
                // Given up for want of a waiter just before this launch joined: start again.
                Some(Err(DownloadError::NoLongerWanted { .. })) if demand() => continue,
                Some(Err(DownloadError::NoLongerWanted { .. })) => {
                    return Err(PackageError::NoLongerWanted);
                }
                Some(Err(e)) => return Err(e.into()),
                // The download's task ended without a word (it panicked).
                None => return Err(PackageError::Io(io::ErrorKind::Other)),
            }
        }
    }

    /// Starts the version's download as its own task: it retries while any launch is inside
    /// `materialize` for the version, moves the verified archive into place, and says how it
    /// ended.
    fn start_download(
        &self,
        package: PackageRef<'_>,
        archive: &Path,
        tap: Option<Tap>,
    ) -> DownloadWatch {
        let (tx, rx) = watch::channel(None);
        let downloader = self.downloader.clone();
        let (url, sha) = (package.url.to_owned(), package.sha256.to_owned());
        let part = self
            .root
            .join(".staging")
            .join(format!("download-{}", uuid::Uuid::new_v4().simple()));
        let archive = archive.to_path_buf();
        let (interest, downloads) = (Arc::clone(&self.interest), Arc::clone(&self.downloads));
        tokio::spawn(async move {
            let wanted = {
                let sha = sha.clone();
                move || lock(&interest).get(&sha).is_some_and(|n| *n > 0)
            };
            let result = match downloader
                .fetch_tapped(&url, &sha, &part, &wanted, tap)
                .await
            {
                Ok(_) => tokio::fs::rename(&part, &archive)
                    .await
                    .map_err(DownloadError::from),
                Err(e) => Err(e),
            };
            lock(&downloads).remove(&sha);
            let _ = tx.send(Some(result));
        });
        rx
    }

    /// Launches inside `materialize` for `sha256` now.
    pub fn launches_waiting(&self, sha256: &str) -> usize {
        lock(&self.interest).get(sha256).copied().unwrap_or(0)
    }

    /// Versions being downloaded now.
    pub fn downloads_in_flight(&self) -> usize {
        lock(&self.downloads).len()
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

    /// The versions this process leased within the last `within`.
    pub fn used_within(&self, within: std::time::Duration) -> Vec<String> {
        self.state()
            .used
            .iter()
            .filter(|(_, at)| at.elapsed() <= within)
            .map(|(sha, _)| sha.clone())
            .collect()
    }

    /// Removes every installed version that no attempt leases, no mounted overlay has as its
    /// lower ([`Self::lowers_in_use`]) and `keep` does not name, with its seeds and its kept
    /// archive. Runs under the allocation lock (so no allocation is about to lease), and gives
    /// way without waiting to a running copy or install: a launch holds `trees` shared from
    /// reading its version's trust until its lease is recorded (after its mount or copy), and a
    /// prune needs it exclusively, so the two never interleave. A version that
    /// cannot be removed does not stop the others: the first error is returned after all were
    /// tried.
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
        let mut leased: Vec<String> = self.state().leases.values().cloned().collect();
        // The durable truth besides the journal (whose attempts arrive as `keep` and as the
        // leases restored at start): the mount table. A runner still running on an overlay
        // whose lower is a tree here uses it, with or without a lease this process knows of (a
        // restart, an attempt gone from the journal). Read under the exclusive hold, so no
        // launch of this process mounts meanwhile; unreadable, nothing is pruned.
        leased.extend(self.lowers_in_use()?);
        let mut first_error = None;
        for entry in std::fs::read_dir(&self.root)? {
            let name = entry?.file_name();
            let Some(sha) = name.to_str().filter(|n| valid_digest(n)) else {
                continue;
            };
            if keep.contains(&sha) || leased.iter().any(|l| l == sha) {
                continue;
            }
            self.state().trusted.remove(sha);
            let removed = self.remove_version(sha);
            match removed {
                Ok(()) => report.removed.push(sha.to_owned()),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        report.removed.sort();
        match first_error {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// The versions whose tree is a lower layer of an overlay mounted in this mount namespace,
    /// however the cache's root was spelled when it was mounted.
    pub fn lowers_in_use(&self) -> io::Result<Vec<String>> {
        let canonical = std::fs::canonicalize(&self.root)?;
        let mut used = Vec::new();
        for mount in super::overlay::mount_points()? {
            if mount.fs_type != "overlay" {
                continue;
            }
            for lower in &mount.lowers {
                let (Some(parent), Some(sha)) =
                    (lower.parent(), lower.file_name().and_then(|n| n.to_str()))
                else {
                    continue;
                };
                let here = parent == self.root
                    || std::fs::canonicalize(parent).is_ok_and(|p| p == canonical);
                if here && valid_digest(sha) {
                    used.push(sha.to_owned());
                }
            }
        }
        Ok(used)
    }

    /// A version's tree, seeds and kept archive.
    fn remove_version(&self, sha: &str) -> io::Result<()> {
        remove_tree(&self.tree(sha))?;
        for root in &self.seed_roots {
            match remove_tree(&root.dir.join(sha)).map(drop) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        match std::fs::remove_file(self.root.join(".archives").join(format!("{sha}.tar.gz"))) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}
