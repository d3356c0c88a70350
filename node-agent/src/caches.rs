//! Dependency caches on the node (`spec.caches`, issue 31 item 2;
//! [`runner_manager_crds::caches`] holds the policy's field and the trust decision).
//!
//! Layout under `<host root>/caches` (root's):
//! - `ns/<namespace>/gen-<N>/`: the namespace's generations (`<Kubernetes namespace>/<host>/
//!   <owner>/<repo>`, `…/_org/<org>`, `…/_shared/<name>`). The newest is what a runner reads.
//!   `ns/` is root's, mode 0700: no runner reaches a generation except through its overlay, so
//!   none can write one (they are group-writable for the pool, so that a copy-up through the
//!   overlay is allowed to change a file).
//! - `ns/<namespace>/.used`: touched at each lease, the prune's LRU clock.
//! - `attempts/<12 hex>/`: one per runner (root's, 0711): `lease` (the namespace and the
//!   generation it reads: durable truth for the prune), `layers/` (root's, 0700: the runner
//!   reaches its writes only through the overlay, never the layer itself) holding `upper/` (the
//!   runner's writes, its account's) and `work/` (overlay's), `mnt/` (the overlay: the runner's
//!   cache directory), and `keep` when the broker trusted the job to write back.
//!
//! At release (the runner proven gone) the overlay is unmounted, a trusted upper is committed as
//! the next generation (a hard-link clone of the newest, with the upper applied: whiteouts
//! delete, opaque directories replace, files move in, all made root's and the pool group's with
//! group = owner bits), an untrusted one is discarded, and the attempt's directory is removed.
//! Generations no lease reads are removed; whole namespaces go by LRU over the size cap, never
//! one a lease reads. Both are moved aside into `trash/` under a short lock a launch also takes,
//! and removed after it: a launch never waits for a commit or a removal.

use std::collections::BTreeSet;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use runner_manager_crds::caches::is_namespace_path;

use crate::packages::overlay::{OverlayError, mount_layers, own_overlay_at, unmount_source};

/// Under the agent's host root.
pub const CACHES_DIR: &str = "caches";
/// The mount source of a cache overlay (the package overlays carry `runner-package`).
pub const SOURCE: &str = "runner-cache";
const GENERATION_PREFIX: &str = "gen-";
const USED: &str = ".used";
const LEASE: &str = "lease";
const KEEP: &str = "keep";
/// Where generations and namespaces no lease reads are moved before their removal.
const TRASH: &str = "trash";

/// Why a cache could not be attached or released.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("the cache namespace {0:?} is not a namespace path")]
    BadNamespace(String),
    #[error("{0}: {1}")]
    Io(String, io::Error),
    #[error("the cache overlay: {0}")]
    Overlay(#[from] OverlayError),
}

fn at(what: impl Into<String>) -> impl FnOnce(io::Error) -> CacheError {
    let what = what.into();
    move |e| CacheError::Io(what, e)
}

/// How a release went. Closed: a log field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// The attempt had no cache.
    NotAttached,
    /// The runner's writes were dropped (its job was not trusted, or it ran none).
    Discarded,
    /// The runner's writes are generation `generation` of the namespace.
    Committed { generation: u64 },
}

/// One attempt's cache directory.
#[derive(Clone, Debug)]
struct AttemptCache {
    dir: PathBuf,
    layers: PathBuf,
    upper: PathBuf,
    work: PathBuf,
    mnt: PathBuf,
    lease: PathBuf,
    keep: PathBuf,
}

/// What a lease says: the namespace and the generation mounted.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Lease {
    namespace: String,
    generation: u64,
}

impl Lease {
    fn parse(text: &str) -> Option<Self> {
        let mut lines = text.lines();
        let namespace = lines.next()?.to_owned();
        let generation = lines.next()?.parse().ok()?;
        is_namespace_path(&namespace).then_some(Self {
            namespace,
            generation,
        })
    }
}

/// The node's cache root.
#[derive(Debug)]
pub struct CacheRoot {
    root: PathBuf,
    /// The pool group: generations are its, group-writable.
    pool_gid: u32,
    /// The size cap in bytes ([`CacheRoot::prune`]).
    cap: u64,
    /// Commits, generation clean-ups and prunes, one at a time (a commit reads the newest
    /// generation and writes the next; two at once would both write the same number). Never
    /// taken on a launch's path: a commit of a large cache takes hundreds of milliseconds.
    writers: Mutex<()>,
    /// Held briefly by a launch choosing its generation and writing its lease, and by a
    /// clean-up or prune deciding what no lease reads and moving it aside (a rename): no
    /// generation goes from under a lease being written. What is moved aside is removed after.
    leases: Mutex<()>,
    /// When the last prune ran (the orphan sweep prunes when [`PRUNE_INTERVAL`] has passed).
    last_prune: Mutex<Option<Instant>>,
}

/// What a prune did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    /// The namespaces removed, least recently used first.
    pub removed: Vec<String>,
    /// The bytes the caches hold after it.
    pub bytes: u64,
}

/// Between two prunes when no runner releases a cache (a release prunes too): the predecessor's
/// interval.
pub const PRUNE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30 * 60);

impl CacheRoot {
    pub fn new(host_root: &Path, pool_gid: u32, cap: u64) -> Self {
        Self {
            root: host_root.join(CACHES_DIR),
            pool_gid,
            cap,
            writers: Mutex::new(()),
            leases: Mutex::new(()),
            last_prune: Mutex::new(None),
        }
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    /// The size cap in bytes.
    pub fn cap(&self) -> u64 {
        self.cap
    }

    fn attempt(&self, short: &str) -> AttemptCache {
        let dir = self.root.join("attempts").join(short);
        let layers = dir.join("layers");
        AttemptCache {
            upper: layers.join("upper"),
            work: layers.join("work"),
            layers,
            mnt: dir.join("mnt"),
            lease: dir.join(LEASE),
            keep: dir.join(KEEP),
            dir,
        }
    }

    fn namespace_dir(&self, namespace: &str) -> Result<PathBuf, CacheError> {
        if !is_namespace_path(namespace) {
            return Err(CacheError::BadNamespace(namespace.to_owned()));
        }
        Ok(self.root.join("ns").join(namespace))
    }

    /// The mount point of attempt `short`'s cache (whether or not it is mounted).
    pub fn mount_point(&self, short: &str) -> PathBuf {
        self.attempt(short).mnt
    }

    /// Mounts attempt `short`'s cache of `namespace` for the account `uid:gid` and returns the
    /// mount point. Idempotent: a cache already mounted (an agent restarted before the runner
    /// started) is returned as it is. Blocking.
    pub fn attach(&self, short: &str, namespace: &str, uid: u32) -> Result<PathBuf, CacheError> {
        let ns = self.namespace_dir(namespace)?;
        let a = self.attempt(short);
        if own_overlay_at(&a.mnt, SOURCE)? {
            return Ok(a.mnt);
        }
        let mk = |p: &Path, mode: u32| -> Result<(), CacheError> {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(mode)
                .create(p)
                .and_then(|()| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)))
                .map_err(at(format!("making {}", p.display())))
        };
        mk(&self.root, 0o711)?;
        mk(&self.root.join("ns"), 0o700)?;
        mk(&self.root.join("attempts"), 0o711)?;
        // A crashed attach's residue is untrusted: start over.
        crate::workspace::remove::remove_tree(&a.dir)
            .map_err(at(format!("removing {}", a.dir.display())))?;
        let generation = {
            let _leases = self.leases.lock().unwrap_or_else(|p| p.into_inner());
            mk(&ns, 0o755)?;
            let newest = match newest_generation(&ns)? {
                Some(n) => n,
                None => {
                    let first = ns.join(format!("{GENERATION_PREFIX}0"));
                    mk(&first, 0o775)?;
                    std::os::unix::fs::chown(&first, Some(0), Some(self.pool_gid))
                        .map_err(at("owning the first generation"))?;
                    0
                }
            };
            let _ = std::fs::File::create(ns.join(USED));
            mk(&a.dir, 0o711)?;
            crate::durable::write_file(
                &a.dir,
                LEASE,
                format!("{namespace}\n{newest}\n").as_bytes(),
            )
            .map_err(at("writing the cache lease"))?;
            newest
        };
        mk(&a.layers, 0o700)?;
        mk(&a.work, 0o700)?;
        mk(&a.mnt, 0o755)?;
        mk(&a.upper, 0o700)?;
        std::os::unix::fs::chown(&a.upper, Some(uid), Some(self.pool_gid))
            .map_err(at("owning the cache's upper layer"))?;
        let lower = ns.join(format!("{GENERATION_PREFIX}{generation}"));
        mount_layers(SOURCE, &lower, &a.upper, &a.work, &a.mnt)?;
        Ok(a.mnt)
    }

    /// Records that attempt `short`'s job may write back (the broker's verdict). Durable: a
    /// restarted agent commits it.
    pub fn keep_writes(&self, short: &str) -> io::Result<()> {
        crate::durable::write_file(&self.attempt(short).dir, KEEP, b"trusted\n")
    }

    /// Whether attempt `short` has a cache directory.
    pub fn attached(&self, short: &str) -> bool {
        self.attempt(short).dir.exists()
    }

    /// Releases attempt `short`'s cache: unmount, commit (when trusted and `commit` allows) or
    /// discard, remove. Idempotent. Blocking; its runner must be gone.
    pub fn release(&self, short: &str, commit: bool) -> Result<Released, CacheError> {
        let a = self.attempt(short);
        if !a.dir.exists() {
            return Ok(Released::NotAttached);
        }
        unmount_source(&a.mnt, SOURCE)?;
        let lease = std::fs::read_to_string(&a.lease)
            .ok()
            .and_then(|t| Lease::parse(&t));
        let released = match lease {
            Some(lease) if commit && a.keep.exists() => {
                let _one = self.writers.lock().unwrap_or_else(|p| p.into_inner());
                let generation = self.commit(&lease.namespace, &a.upper)?;
                Released::Committed { generation }
            }
            _ => Released::Discarded,
        };
        crate::workspace::remove::remove_tree(&a.dir)
            .map_err(at(format!("removing {}", a.dir.display())))?;
        if let Released::Committed { .. } = released {
            let _one = self.writers.lock().unwrap_or_else(|p| p.into_inner());
            self.drop_unread_generations()?;
        }
        Ok(released)
    }

    /// The attempt names (12 hex) with a cache directory.
    pub fn attempt_names(&self) -> io::Result<Vec<String>> {
        crate::providers::launcher::attempt_names_in(&self.root.join("attempts"))
    }

    /// The generations leases read, as `(namespace, generation)`.
    fn leased(&self) -> io::Result<BTreeSet<(String, u64)>> {
        let mut out = BTreeSet::new();
        for short in self.attempt_names()? {
            if let Some(l) = std::fs::read_to_string(self.attempt(&short).lease)
                .ok()
                .and_then(|t| Lease::parse(&t))
            {
                out.insert((l.namespace, l.generation));
            }
        }
        Ok(out)
    }

    /// Every namespace on the node (four levels under `ns/`).
    fn namespaces(&self) -> io::Result<Vec<String>> {
        let mut level = vec![String::new()];
        for _ in 0..4 {
            let mut next = Vec::new();
            for prefix in level {
                let dir = self.root.join("ns").join(&prefix);
                let entries = match std::fs::read_dir(&dir) {
                    Ok(e) => e,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                };
                for e in entries {
                    let e = e?;
                    if !e.file_type()?.is_dir() {
                        continue;
                    }
                    let name = e.file_name().to_string_lossy().into_owned();
                    next.push(if prefix.is_empty() {
                        name
                    } else {
                        format!("{prefix}/{name}")
                    });
                }
            }
            level = next;
        }
        Ok(level.into_iter().filter(|n| is_namespace_path(n)).collect())
    }

    /// Moves `path` aside (a rename, quick) into `trash/`, to be removed outside the lease lock.
    fn set_aside(&self, path: &Path) -> Result<PathBuf, CacheError> {
        let trash = self.root.join(TRASH);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&trash)
            .or_else(|e| {
                if e.kind() == io::ErrorKind::AlreadyExists {
                    Ok(())
                } else {
                    Err(e)
                }
            })
            .map_err(at("making the caches' trash"))?;
        let aside = trash.join(uuid::Uuid::new_v4().simple().to_string());
        std::fs::rename(path, &aside).map_err(at(format!("moving {} aside", path.display())))?;
        Ok(aside)
    }

    /// Removes what was moved aside (after a crash too: nothing there is read).
    fn empty_trash(&self) -> Result<(), CacheError> {
        let trash = self.root.join(TRASH);
        let entries = match std::fs::read_dir(&trash) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(CacheError::Io("listing the caches' trash".into(), e)),
        };
        for e in entries.flatten() {
            crate::workspace::remove::remove_tree(&e.path())
                .map_err(at(format!("removing {}", e.path().display())))?;
        }
        Ok(())
    }

    /// Removes every generation but the newest that no lease reads. The caller holds
    /// `writers`.
    fn drop_unread_generations(&self) -> Result<(), CacheError> {
        let namespaces = self.namespaces().map_err(at("listing cache namespaces"))?;
        {
            let _leases = self.leases.lock().unwrap_or_else(|p| p.into_inner());
            let leased = self.leased().map_err(at("listing cache leases"))?;
            for namespace in namespaces {
                let ns = self.namespace_dir(&namespace)?;
                let gens = generations(&ns)?;
                let Some(newest) = gens.iter().max().copied() else {
                    continue;
                };
                for g in gens {
                    if g != newest && !leased.contains(&(namespace.clone(), g)) {
                        self.set_aside(&ns.join(format!("{GENERATION_PREFIX}{g}")))?;
                    }
                }
            }
        }
        self.empty_trash()
    }

    /// Removes whole namespaces, least recently leased first, until the caches hold at most
    /// `cap` bytes; never one a lease reads.
    pub fn prune(&self, cap: u64) -> Result<Pruned, CacheError> {
        let _one = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        self.empty_trash()?;
        // Sized without the lease lock (a walk of every cache): published generations do not
        // change, and the leases are read again under the lock before anything moves.
        let mut sized = Vec::new();
        let mut total = 0u64;
        for namespace in self.namespaces().map_err(at("listing cache namespaces"))? {
            let ns = self.namespace_dir(&namespace)?;
            let size = tree_bytes(&ns).map_err(at(format!("sizing {}", ns.display())))?;
            let used = std::fs::metadata(ns.join(USED))
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            total += size;
            sized.push((used, namespace, size));
        }
        sized.sort();
        let mut removed = Vec::new();
        {
            let _leases = self.leases.lock().unwrap_or_else(|p| p.into_inner());
            let leased: BTreeSet<String> = self
                .leased()
                .map_err(at("listing cache leases"))?
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            for (_, namespace, size) in sized {
                if total <= cap {
                    break;
                }
                if leased.contains(&namespace) {
                    continue;
                }
                self.set_aside(&self.namespace_dir(&namespace)?)?;
                total = total.saturating_sub(size);
                removed.push(namespace);
            }
        }
        self.empty_trash()?;
        *self.last_prune.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        Ok(Pruned {
            removed,
            bytes: total,
        })
    }

    /// Whether [`PRUNE_INTERVAL`] has passed since the last prune (or none ran yet).
    pub fn prune_due(&self) -> bool {
        self.last_prune
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none_or(|at| at.elapsed() >= PRUNE_INTERVAL)
    }

    /// Builds generation N+1 of `namespace` from its newest and `upper`; returns N+1.
    fn commit(&self, namespace: &str, upper: &Path) -> Result<u64, CacheError> {
        let ns = self.namespace_dir(namespace)?;
        let newest = newest_generation(&ns)?;
        let next = newest.map_or(0, |n| n + 1);
        let staging = ns.join(format!(".{GENERATION_PREFIX}{next}.partial"));
        crate::workspace::remove::remove_tree(&staging)
            .map_err(at(format!("removing {}", staging.display())))?;
        match newest {
            Some(n) => link_clone(&ns.join(format!("{GENERATION_PREFIX}{n}")), &staging)
                .map_err(at("cloning the newest generation"))?,
            None => std::fs::create_dir(&staging).map_err(at("making the first generation"))?,
        }
        self.normalise(&staging)
            .map_err(at("owning the new generation"))?;
        apply_upper(upper, &staging, self.pool_gid).map_err(at("applying the runner's writes"))?;
        std::fs::rename(&staging, ns.join(format!("{GENERATION_PREFIX}{next}")))
            .map_err(at("publishing the new generation"))?;
        Ok(next)
    }

    fn normalise(&self, path: &Path) -> io::Result<()> {
        normalise(path, self.pool_gid)
    }
}

/// Root's and the pool group's, group bits = owner bits, no set-id or sticky bit. A link keeps
/// its own (never followed).
fn normalise(path: &Path, gid: u32) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    std::os::unix::fs::lchown(path, Some(0), Some(gid))?;
    if !meta.file_type().is_symlink() {
        let m = meta.mode() & 0o777;
        let mode = (m & 0o707) | ((m & 0o700) >> 3);
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// The generation numbers in namespace directory `ns`.
fn generations(ns: &Path) -> Result<Vec<u64>, CacheError> {
    let entries = match std::fs::read_dir(ns) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(CacheError::Io(format!("listing {}", ns.display()), e)),
    };
    Ok(entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix(GENERATION_PREFIX)?
                .parse()
                .ok()
        })
        .collect())
}

fn newest_generation(ns: &Path) -> Result<Option<u64>, CacheError> {
    Ok(generations(ns)?.into_iter().max())
}

/// A copy of `from` at `to` whose files are hard links of `from`'s (directories are new; links
/// are linked, never followed). Iterative: a deep tree costs no stack.
fn link_clone(from: &Path, to: &Path) -> io::Result<()> {
    let mut todo = vec![(from.to_path_buf(), to.to_path_buf())];
    while let Some((src, dst)) = todo.pop() {
        let meta = std::fs::symlink_metadata(&src)?;
        std::fs::DirBuilder::new().mode(0o700).create(&dst)?;
        // Explicitly: the umask would take the group's write bit.
        std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(meta.mode() & 0o777))?;
        std::os::unix::fs::lchown(&dst, Some(meta.uid()), Some(meta.gid()))?;
        for e in std::fs::read_dir(&src)? {
            let e = e?;
            let (s, d) = (e.path(), dst.join(e.file_name()));
            if e.file_type()?.is_dir() {
                todo.push((s, d));
            } else {
                std::fs::hard_link(&s, &d)?;
            }
        }
    }
    Ok(())
}

/// An overlay whiteout: a character device 0/0.
fn is_whiteout(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt;
    meta.file_type().is_char_device() && meta.rdev() == 0
}

/// Whether overlay marked upper directory `dir` opaque (it replaces the lower's directory).
fn is_opaque(dir: &Path) -> bool {
    let mut value = [0u8; 8];
    matches!(
        rustix::fs::lgetxattr(dir, "trusted.overlay.opaque", &mut value),
        Ok(n) if value[..n] == *b"y"
    )
}

/// Removes whatever is at `path` (a tree, a file, a link; never followed). Missing is done.
fn remove_any(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(m) if m.is_dir() => crate::workspace::remove::remove_tree(path).map(|_| ()),
        Ok(_) => std::fs::remove_file(path),
    }
}

/// Applies overlay upper layer `upper` to the tree `gen` (a clone of the lower it was mounted
/// over): what the merged view showed becomes `gen`. Every directory descended into in `gen` is
/// a real directory this function made or checked, so no path component is a link.
fn apply_upper(upper: &Path, gen_dir: &Path, gid: u32) -> io::Result<()> {
    let mut todo = vec![(upper.to_path_buf(), gen_dir.to_path_buf())];
    while let Some((src, dst)) = todo.pop() {
        for e in std::fs::read_dir(&src)? {
            let e = e?;
            let (s, d) = (e.path(), dst.join(e.file_name()));
            let meta = std::fs::symlink_metadata(&s)?;
            if is_whiteout(&meta) {
                remove_any(&d)?;
            } else if meta.is_dir() {
                let here = std::fs::symlink_metadata(&d);
                let keep = matches!(&here, Ok(m) if m.is_dir()) && !is_opaque(&s);
                if !keep {
                    remove_any(&d)?;
                    std::fs::DirBuilder::new().mode(0o700).create(&d)?;
                }
                std::fs::set_permissions(&d, std::fs::Permissions::from_mode(meta.mode() & 0o777))?;
                normalise(&d, gid)?;
                todo.push((s, d));
            } else if meta.is_file() || meta.file_type().is_symlink() {
                remove_any(&d)?;
                if meta.is_file() && meta.nlink() > 1 {
                    // Linked elsewhere too: its inode is not the layer's alone, so it is copied
                    // (a new inode) rather than moved and made root's.
                    std::fs::copy(&s, &d)?;
                } else {
                    std::fs::rename(&s, &d)?;
                }
                normalise(&d, gid)?;
            }
            // Sockets, FIFOs and devices are not cache content: left out.
        }
    }
    Ok(())
}

/// The bytes of the regular files under `path`, each inode once.
fn tree_bytes(path: &Path) -> io::Result<u64> {
    let mut seen = BTreeSet::new();
    let mut total = 0;
    let mut todo = vec![path.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            let meta = std::fs::symlink_metadata(e.path())?;
            if meta.is_dir() {
                todo.push(e.path());
            } else if meta.is_file() && seen.insert((meta.dev(), meta.ino())) {
                total += meta.len();
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_user() -> bool {
        rustix::process::geteuid().is_root()
    }

    /// A fresh cache root with no size cap, for a test that must run as root (`None`
    /// otherwise: the test does nothing). The directory is held by the caller.
    fn caches_as_root() -> Option<(tempfile::TempDir, CacheRoot)> {
        if !root_user() {
            return None;
        }
        let t = tempfile::tempdir().unwrap();
        let caches = CacheRoot::new(t.path(), 0, u64::MAX);
        Some((t, caches))
    }

    const NS: &str = "team/github.com/acme/web";

    fn write(p: &Path, s: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, s).unwrap();
    }

    #[test]
    fn leases_parse_only_namespace_paths() {
        assert_eq!(
            Lease::parse("team/github.com/acme/web\n3\n"),
            Some(Lease {
                namespace: NS.into(),
                generation: 3
            })
        );
        assert_eq!(Lease::parse("../../etc/x\n3\n"), None);
        assert_eq!(Lease::parse("team/github.com/acme/web\nx\n"), None);
    }

    /// The commit without a mount: an upper as overlay leaves it (a whiteout, an opaque
    /// directory, a replaced file, a new link) applied to a clone, the old generation untouched.
    #[test]
    fn an_upper_is_applied_to_a_clone_and_the_old_generation_is_untouched() {
        let Some((t, caches)) = caches_as_root() else {
            return;
        };
        let ns = caches.namespace_dir(NS).unwrap();
        let g0 = ns.join("gen-0");
        write(&g0.join("npm/a.js"), "a0");
        write(&g0.join("npm/gone.js"), "x");
        write(&g0.join("pip/old/1"), "1");
        write(&g0.join("pip/keep"), "k");
        let upper = t.path().join("upper");
        write(&upper.join("npm/a.js"), "a1");
        write(&upper.join("npm/new.js"), "n");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            upper.join("npm/gone.js"),
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::empty(),
            0,
        )
        .unwrap();
        std::fs::create_dir_all(upper.join("pip/old")).unwrap();
        rustix::fs::setxattr(
            upper.join("pip/old").as_path(),
            "trusted.overlay.opaque",
            b"y",
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
        write(&upper.join("pip/old/2"), "2");
        std::os::unix::fs::symlink("/etc", upper.join("link")).unwrap();
        // A file linked from outside the layer: committed as a copy, its inode left alone.
        let outside = t.path().join("outside");
        write(&outside, "o");
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::hard_link(&outside, upper.join("npm/linked.js")).unwrap();
        assert_eq!(caches.commit(NS, &upper).unwrap(), 1);
        let g1 = ns.join("gen-1");
        let read = |p: &Path| std::fs::read_to_string(p).ok();
        assert_eq!(read(&g1.join("npm/a.js")).as_deref(), Some("a1"));
        assert_eq!(read(&g1.join("npm/new.js")).as_deref(), Some("n"));
        assert!(!g1.join("npm/gone.js").exists());
        assert!(
            !g1.join("pip/old/1").exists(),
            "the opaque directory replaced"
        );
        assert_eq!(read(&g1.join("pip/old/2")).as_deref(), Some("2"));
        assert_eq!(read(&g1.join("pip/keep")).as_deref(), Some("k"));
        assert_eq!(
            std::fs::read_link(g1.join("link")).unwrap(),
            PathBuf::from("/etc"),
            "a link is moved, never followed"
        );
        assert_eq!(read(&g1.join("npm/linked.js")).as_deref(), Some("o"));
        assert_ne!(
            std::fs::metadata(g1.join("npm/linked.js")).unwrap().ino(),
            std::fs::metadata(&outside).unwrap().ino()
        );
        assert_eq!(
            std::fs::metadata(&outside).unwrap().mode() & 0o777,
            0o600,
            "the outside inode keeps its mode"
        );
        assert_eq!(read(&g0.join("npm/a.js")).as_deref(), Some("a0"));
        assert!(g0.join("npm/gone.js").exists());
        let mode = std::fs::metadata(g1.join("npm/new.js")).unwrap().mode();
        assert_eq!(mode & 0o070, (mode & 0o700) >> 3, "group bits = owner bits");
    }

    /// The prune removes least recently used namespaces over the cap, never a leased one.
    #[test]
    fn the_prune_removes_the_least_recently_used_unleased_namespaces() {
        let Some((_t, caches)) = caches_as_root() else {
            return;
        };
        let names = [
            "t/github.com/acme/old",
            "t/github.com/acme/leased",
            "t/github.com/acme/new",
        ];
        for (i, n) in names.iter().enumerate() {
            let ns = caches.namespace_dir(n).unwrap();
            write(&ns.join("gen-0/blob"), &"x".repeat(1000));
            std::fs::File::create(ns.join(USED))
                .unwrap()
                .set_modified(
                    std::time::UNIX_EPOCH + std::time::Duration::from_secs(100 * i as u64 + 1),
                )
                .unwrap();
        }
        // `leased` is the oldest but one and read by a live attempt.
        let a = caches.attempt("0123456789ab");
        std::fs::create_dir_all(&a.dir).unwrap();
        std::fs::write(&a.lease, format!("{}\n0\n", names[1])).unwrap();
        std::fs::File::open(caches.namespace_dir(names[1]).unwrap().join(USED))
            .unwrap()
            .set_modified(std::time::UNIX_EPOCH)
            .unwrap();
        // What a crash left moved aside is removed by the next prune.
        write(&caches.path().join("trash/0123/blob"), "x");
        assert!(caches.prune_due());
        let pruned = caches.prune(2000).unwrap();
        assert!(
            std::fs::read_dir(caches.path().join("trash"))
                .unwrap()
                .next()
                .is_none(),
            "nothing stays moved aside"
        );
        assert_eq!(pruned.removed, vec![names[0].to_owned()]);
        assert_eq!(pruned.bytes, 2000);
        assert!(!caches.prune_due(), "pruned just now");
        assert!(caches.namespace_dir(names[1]).unwrap().exists());
        assert!(caches.namespace_dir(names[2]).unwrap().exists());
        let pruned = caches.prune(0).unwrap();
        assert_eq!(
            pruned.removed,
            vec![names[2].to_owned()],
            "never a leased one"
        );
        assert_eq!(
            pruned.bytes, 1000,
            "the leased namespace stays, over the cap"
        );
    }
}
