//! The overlay materialize (issue 15 item 9): instead of copying the package into a runtime, the
//! runtime directory becomes the *upper* layer of an overlay mounted on itself, over the cache's
//! verified, read-only tree as the *lower* layer. Materialize is one `mount(2)` whatever the
//! package's size, and dropping an ephemeral runtime is one unmount plus removing only what the
//! job wrote.
//!
//! Layout, for a runtime `R` (`<hostRoot>/runners/<12 hex>` or a slot `<…>/<policy uid>/sN`):
//! the overlay is mounted at `R` with `upperdir=R`, `workdir=<parent of R>/.overlay-work/<name
//! of R>`, `lowerdir=<hostRoot>/packages/<sha256>`. So:
//! - a persistent slot's `_work` is a real directory of the slot (a pure-upper directory, written
//!   straight through) and stays one across an unmount, where the scrub finds it as before;
//! - once unmounted, `R` holds exactly what the job wrote (copied-up files, whiteouts, `.runner`,
//!   `_diag`, …), which the existing fd-relative removal and the seven-check scrub remove;
//! - the lower is never written: overlay copies a file up before any write, chmod, chown or
//!   rename, and a deletion is a whiteout in the upper.
//!
//! Mount options, and why:
//! - trusted xattrs (no `userxattr`): the agent mounts as root, and `trusted.overlay.*` cannot be
//!   set by the runner account; with `userxattr` a job could plant `user.overlay.redirect` or
//!   `user.overlay.opaque` on its own files in a persistent slot's `_work` and have the next
//!   mount interpret them.
//! - `redirect_dir=nofollow`: a rename of a lower directory fails with `EXDEV` (tools fall back
//!   to copying) instead of writing a redirect, and no redirect is ever followed.
//! - `index=off`: the index ties the upper to one lower's file handles; a reinstalled version
//!   (a new tree, new inodes) must still mount over a slot's retained upper.
//! - `metacopy=off`: a metadata-only copy-up would leave the data of a chmod-ed file in the
//!   lower, and the kernel documents metacopy as unsafe with an upper it does not fully trust.
//! - `xino=off`: inode numbers are the layers' own; nothing here relies on `st_ino` uniqueness
//!   across layers, and `xino=auto` would make the number space depend on the filesystem.
//! - `nosuid,nodev` on the mount: nothing in a runtime needs privilege, and a file the job
//!   marks set-id stays inert.

use std::io;
use std::path::{Path, PathBuf};

/// `--materialize`: how a package is laid into a runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MaterializeChoice {
    /// Overlay when a probe mount succeeds at start on every runtime volume, else the copy.
    Auto,
    /// The overlay mount; the agent does not start if the probe fails.
    Overlay,
    /// The checked copy (reflink where the volume clones).
    Copy,
}

/// What the agent uses (closed: a metric label and a log field).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Materializer {
    Overlay,
    #[default]
    Copy,
}

impl Materializer {
    pub const ALL: [Self; 2] = [Self::Overlay, Self::Copy];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Overlay => "overlay",
            Self::Copy => "copy",
        }
    }
}

/// Why an overlay could not be mounted or unmounted.
#[derive(Debug, thiserror::Error)]
pub enum OverlayError {
    #[error("a path holds a character overlay options cannot carry (`,`, `:`, `\\` or a newline)")]
    UnsafePath,
    #[error("the runtime has no parent directory for the overlay's workdir")]
    NoParent,
    #[error("mounting the overlay failed ({0:?})")]
    Mount(io::ErrorKind),
    #[error("preparing the overlay's workdir failed ({0:?})")]
    WorkDir(io::ErrorKind),
    #[error("unmounting the overlay failed ({0:?})")]
    Unmount(io::ErrorKind),
}

/// How an unmount went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unmounted {
    /// Nothing was mounted there.
    NotMounted,
    /// Unmounted normally (`layers` mounts, normally one).
    Unmounted { layers: u32 },
    /// A process still held something inside (a late child of the runner): detached
    /// (`MNT_DETACH`), so the path is free now and the kernel drops the mount when the last
    /// holder lets go. The caller still removes the upper; the holder sees an overlay whose upper
    /// changed underneath, which the kernel tolerates (no crash), and the lower stays read-only.
    Detached,
}

/// `<parent of runtime>/.overlay-work/<name of runtime>`: the overlay's workdir, on the same
/// volume as the upper (overlay requires it) and outside it.
pub fn work_dir(runtime: &Path) -> Option<PathBuf> {
    let parent = runtime.parent()?;
    let name = runtime.file_name()?;
    Some(parent.join(WORK_ROOT).join(name))
}

/// The directory beside runtimes holding their workdirs.
pub const WORK_ROOT: &str = ".overlay-work";

fn option_safe(p: &Path) -> bool {
    p.to_str()
        .is_some_and(|s| !s.contains([',', ':', '\\', '\n']) && !s.is_empty())
}

/// The option string for a package at `lower` over the runtime `upper` (also the mount point).
pub fn options(lower: &Path, upper: &Path, work: &Path) -> Result<String, OverlayError> {
    if ![lower, upper, work].iter().all(|p| option_safe(p)) {
        return Err(OverlayError::UnsafePath);
    }
    Ok(format!(
        "lowerdir={},upperdir={},workdir={},redirect_dir=nofollow,index=off,metacopy=off,xino=off",
        lower.display(),
        upper.display(),
        work.display()
    ))
}

/// Mounts `lower` (a verified, read-only package tree) under `runtime`, at `runtime`. The runtime
/// must be empty or hold only a slot's `_work`: the caller's preparation proved that. The workdir
/// is emptied first (a stale one from a crash is untrusted).
pub fn mount_package(lower: &Path, runtime: &Path) -> Result<(), OverlayError> {
    use std::os::unix::fs::DirBuilderExt;
    let work = work_dir(runtime).ok_or(OverlayError::NoParent)?;
    // Refused before anything is made.
    options(lower, runtime, &work)?;
    let root = work.parent().ok_or(OverlayError::NoParent)?;
    let wd = |e: io::Error| OverlayError::WorkDir(e.kind());
    remove_work_dir(runtime).map_err(wd)?;
    // The workdirs' root is removed by the last removal that empties it, so it may vanish
    // between its creation and the workdir's: try again then.
    let mut made = Ok(());
    for _ in 0..3 {
        made = std::fs::DirBuilder::new()
            .mode(0o700)
            .create(root)
            .or_else(|e| {
                if e.kind() == io::ErrorKind::AlreadyExists {
                    Ok(())
                } else {
                    Err(e)
                }
            })
            .and_then(|()| std::fs::DirBuilder::new().mode(0o700).create(&work));
        match &made {
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            _ => break,
        }
    }
    made.map_err(wd)?;
    mount_layers(SOURCE, lower, runtime, &work, runtime)
}

/// Mounts the overlay of `lower` under `upper` (workdir `work`) at `at`, `nosuid,nodev`, with
/// [`options`] and the mount source `source` by which [`unmount_source`] tells it from anything
/// else. The package overlay is one; the dependency caches' (`crate::caches`) are the other.
pub fn mount_layers(
    source: &str,
    lower: &Path,
    upper: &Path,
    work: &Path,
    at: &Path,
) -> Result<(), OverlayError> {
    use rustix::mount::MountFlags;
    if !option_safe(at) {
        return Err(OverlayError::UnsafePath);
    }
    // `options` refused every path that could hold a NUL byte's neighbours; a NUL itself cannot
    // be in a path.
    let data = std::ffi::CString::new(options(lower, upper, work)?)
        .map_err(|_| OverlayError::UnsafePath)?;
    rustix::mount::mount(
        source,
        at,
        "overlay",
        MountFlags::NOSUID | MountFlags::NODEV,
        Some(data.as_c_str()),
    )
    .map_err(|e| OverlayError::Mount(io::Error::from(e).kind()))
}

/// Removes a runtime's workdir (what overlay keeps there is root's, mode 000 inside).
pub fn remove_work_dir(runtime: &Path) -> io::Result<()> {
    let Some(work) = work_dir(runtime) else {
        return Ok(());
    };
    match crate::workspace::remove::remove_tree(&work) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // The root goes with its last workdir (`rmdir` refuses while another remains), so a node
    // that stops mounting keeps nothing of it.
    if let Some(root) = work.parent() {
        let _ = std::fs::remove_dir(root);
    }
    Ok(())
}

/// The mount source the agent's overlays carry, so an unmount can tell them from anything else.
const SOURCE: &str = "runner-package";

/// Whether the topmost mount at `path` (its parent resolved, the last component not followed, as
/// mountinfo shows it) is one of the agent's overlays of mount source `source`.
pub fn own_overlay_at(path: &Path, source: &str) -> Result<bool, OverlayError> {
    let io = |e: io::Error| OverlayError::Unmount(e.kind());
    let resolved = match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => match std::fs::canonicalize(parent) {
            Ok(parent) => parent.join(name),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io(e)),
        },
        _ => return Ok(false),
    };
    // mountinfo lists mounts in the order they were made: the last at a path is the topmost.
    Ok(mount_points()
        .map_err(io)?
        .iter()
        .rev()
        .find(|m| m.path == resolved)
        .is_some_and(|m| m.fs_type == "overlay" && m.source == source))
}

/// Unmounts the agent's package overlay at `path` (never following a link there), every layer of
/// it; anything else mounted there (another filesystem, someone else's overlay) is left alone,
/// and so is what lies under it. A busy mount is detached (see [`Unmounted::Detached`]).
pub fn unmount(path: &Path) -> Result<Unmounted, OverlayError> {
    unmount_source(path, SOURCE)
}

/// [`unmount`] for the agent's overlays of mount source `source`.
pub fn unmount_source(path: &Path, source: &str) -> Result<Unmounted, OverlayError> {
    use rustix::mount::UnmountFlags;
    let mut layers = 0;
    // Bounded: a runner account cannot mount, so more than a few layers means a loop gone wrong.
    for _ in 0..8 {
        if !own_overlay_at(path, source)? {
            return Ok(if layers == 0 {
                Unmounted::NotMounted
            } else {
                Unmounted::Unmounted { layers }
            });
        }
        match rustix::mount::unmount(path, UnmountFlags::NOFOLLOW) {
            Ok(()) => layers += 1,
            // Not a mount point (or the path is gone): done.
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOENT) => {
                return Ok(if layers == 0 {
                    Unmounted::NotMounted
                } else {
                    Unmounted::Unmounted { layers }
                });
            }
            Err(rustix::io::Errno::BUSY) => {
                return match rustix::mount::unmount(
                    path,
                    UnmountFlags::NOFOLLOW | UnmountFlags::DETACH,
                ) {
                    Ok(()) => Ok(Unmounted::Detached),
                    Err(e) => Err(OverlayError::Unmount(io::Error::from(e).kind())),
                };
            }
            Err(e) => return Err(OverlayError::Unmount(io::Error::from(e).kind())),
        }
    }
    Err(OverlayError::Unmount(io::ErrorKind::Other))
}

/// Whether `path` is a mount point in this process's mount namespace.
pub fn is_mounted(path: &Path) -> io::Result<bool> {
    Ok(mount_points()?.iter().any(|m| m.path == path))
}

pub use crate::mounts::{MountPoint, mount_points, parse_mountinfo};

/// The overlay mounts strictly under `root` (tests and diagnostics: the agent finds its mounts by
/// the runtimes' names, every mount point being a runtime).
pub fn overlays_under(root: &Path) -> io::Result<Vec<PathBuf>> {
    Ok(mount_points()?
        .into_iter()
        .filter(|m| m.fs_type == "overlay" && m.path.starts_with(root) && m.path != root)
        .map(|m| m.path)
        .collect())
}

/// Whether `tree` is a lower layer of any overlay mounted in this process's mount namespace
/// (a restarted agent's runners still run on it, journalled or not).
pub fn is_lower_of_a_mount(tree: &Path) -> io::Result<bool> {
    Ok(mount_points()?
        .iter()
        .any(|m| m.fs_type == "overlay" && m.lowers.iter().any(|l| l == tree)))
}

/// Resolves `--materialize` at start: probes overlay on each runtime volume (`dirs`, created
/// when missing) unless told to copy; a success is recorded in `records` (the host root), where
/// the next start finds it. `Err` only for an explicit `overlay` whose probe failed.
pub fn choose(
    choice: MaterializeChoice,
    dirs: &[PathBuf],
    records: &Path,
) -> Result<Materializer, OverlayError> {
    if choice == MaterializeChoice::Copy {
        return Ok(Materializer::Copy);
    }
    let probed = dirs.iter().try_for_each(|dir| {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(dir)
            .map_err(|e| OverlayError::WorkDir(e.kind()))?;
        // A probe of an agent that crashed mid-probe: its overlay is detached and its residue
        // removed before anything else, whatever the probe's outcome below.
        sweep_probes(dir);
        if recorded_probe(records, dir) {
            tracing::info!(
                "overlay probe of {} skipped: it succeeded on this volume in this boot, recorded in {}",
                dir.display(),
                probe_record_path(records, dir).display()
            );
            return Ok(());
        }
        probe(dir)?;
        record_probe(records, dir);
        Ok(())
    });
    match (probed, choice) {
        (Ok(()), _) => Ok(Materializer::Overlay),
        (Err(e), MaterializeChoice::Overlay) => Err(e),
        (Err(e), _) => {
            tracing::warn!("overlay probe failed ({e}); packages are copied into runtimes");
            Ok(Materializer::Copy)
        }
    }
}

/// The prefix of a probe's throwaway directory in a runtime volume's directory.
pub const PROBE_PREFIX: &str = ".overlay-probe-";

/// The prefix of a successful probe's record: the boot id, the volume's device and the time, in
/// the records directory (the host root), one file per probed directory
/// ([`probe_record_path`]). Not in the probed directory itself: that is `runners/` or the slots
/// root, where every entry is a runtime or a slot and anything else reads as one left behind.
/// Only a success is recorded: a failure is probed again at the next start (cheap, and an admin
/// may have fixed the kernel meanwhile).
pub const PROBE_RECORD: &str = ".overlay-probed-";

/// The record of `dir`'s probe in `records`: [`PROBE_RECORD`] and a digest of the directory's
/// path (two probed directories on one volume have a record each).
#[must_use]
pub fn probe_record_path(records: &Path, dir: &Path) -> PathBuf {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(dir.as_os_str().as_encoded_bytes());
    records.join(format!("{PROBE_RECORD}{}", &hex::encode(digest)[..16]))
}

/// How long a recorded success stands (within the same boot and on the same volume).
pub const PROBE_RECORD_FOR: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Removes every `.overlay-probe-*` in `dir`, detaching what is mounted inside (the one removal
/// primitive). One that cannot go is logged: the agent must still start, and no probe reuses a
/// name.
pub fn sweep_probes(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(PROBE_PREFIX) {
            continue;
        }
        match crate::workspace::remove::remove_tree(&dir.join(&name)) {
            Ok(removed) => tracing::info!(
                "an overlay probe left by an earlier agent in {} was swept ({} mount(s) detached)",
                dir.display(),
                removed.detached
            ),
            Err(error) => tracing::warn!(
                %error,
                "an overlay probe left by an earlier agent in {} could not be swept",
                dir.display()
            ),
        }
    }
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_owned())
}

fn probe_record_body(dir: &Path, at: std::time::SystemTime) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir).ok()?.dev();
    let secs = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
    Some(format!("ok {} {dev} {secs}\n", boot_id()?))
}

/// Whether `record` (a [`PROBE_RECORD`]'s text) stands for `dir` now: a success in this boot,
/// on this volume, within [`PROBE_RECORD_FOR`]. Pure but for the boot id and the device.
pub fn probe_record_stands(dir: &Path, record: &str, now: std::time::SystemTime) -> bool {
    let Some(expected) = probe_record_body(dir, now) else {
        return false;
    };
    let (mut got, mut want) = (record.split_whitespace(), expected.split_whitespace());
    // `ok`, the boot id and the device must be the same; the time recent.
    for _ in 0..3 {
        if got.next() != want.next() {
            return false;
        }
    }
    let (Some(Ok(then)), Some(Ok(now))) = (
        got.next().map(str::parse::<u64>),
        want.next().map(str::parse::<u64>),
    ) else {
        return false;
    };
    now >= then && now - then <= PROBE_RECORD_FOR.as_secs()
}

/// Whether a success recorded for `dir` in `records` stands.
pub fn recorded_probe(records: &Path, dir: &Path) -> bool {
    std::fs::read_to_string(probe_record_path(records, dir))
        .is_ok_and(|r| probe_record_stands(dir, &r, std::time::SystemTime::now()))
}

fn record_probe(records: &Path, dir: &Path) {
    let Some(body) = probe_record_body(dir, std::time::SystemTime::now()) else {
        return;
    };
    let path = probe_record_path(records, dir);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Err(error) = crate::durable::write_file(records, &name, body.as_bytes()) {
        tracing::warn!(
            %error,
            "the overlay probe's success in {} could not be recorded; the next start probes again",
            dir.display()
        );
    }
}

/// The start-up probe: a throwaway overlay in `dir` (a directory on a runtime volume), mounted,
/// written through, unmounted and removed. `Ok` means overlay works there with these options.
pub fn probe(dir: &Path) -> Result<(), OverlayError> {
    let base = dir.join(format!("{PROBE_PREFIX}{}", uuid::Uuid::new_v4().simple()));
    let io = |e: io::Error| OverlayError::WorkDir(e.kind());
    let lower = base.join("lower");
    let runtime = base.join("rt");
    let result = (|| {
        std::fs::create_dir_all(&lower).map_err(io)?;
        std::fs::write(lower.join("probe"), b"lower").map_err(io)?;
        std::fs::create_dir(&runtime).map_err(io)?;
        mount_package(&lower, &runtime)?;
        let wrote = std::fs::write(runtime.join("probe"), b"upper");
        let read = std::fs::read(lower.join("probe"));
        unmount(&runtime)?;
        wrote.map_err(io)?;
        if read.map_err(io)? != b"lower" {
            return Err(OverlayError::Mount(io::ErrorKind::InvalidData));
        }
        Ok(())
    })();
    let _ = unmount(&runtime);
    let _ = crate::workspace::remove::remove_tree(&base);
    result
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_recorded_probe_stands_only_in_its_boot_on_its_volume_and_for_a_day() {
        let dir = tempfile::tempdir().unwrap();
        let now = std::time::SystemTime::now();
        let record = probe_record_body(dir.path(), now).unwrap();
        assert!(probe_record_stands(dir.path(), &record, now));
        let later = now + PROBE_RECORD_FOR + std::time::Duration::from_secs(1);
        assert!(!probe_record_stands(dir.path(), &record, later), "too old");
        let mut fields: Vec<&str> = record.split_whitespace().collect();
        fields[1] = "another-boot";
        assert!(!probe_record_stands(dir.path(), &fields.join(" "), now));
        let mut fields: Vec<&str> = record.split_whitespace().collect();
        fields[2] = "1";
        assert!(
            !probe_record_stands(dir.path(), &fields.join(" "), now),
            "another volume"
        );
        assert!(!probe_record_stands(dir.path(), "failed", now));
    }

    #[test]
    fn options_refuse_paths_that_would_inject_layers() {
        let ok = options(Path::new("/p/l"), Path::new("/r/u"), Path::new("/r/w")).unwrap();
        assert!(ok.contains("redirect_dir=nofollow"));
        assert!(ok.contains("index=off"));
        assert!(!ok.contains("userxattr"));
        for bad in ["/p/l,upperdir=/etc", "/p/a:/etc", "/p/a\\b"] {
            assert!(matches!(
                options(Path::new(bad), Path::new("/r/u"), Path::new("/r/w")),
                Err(OverlayError::UnsafePath)
            ));
        }
    }

    #[test]
    fn the_workdir_is_beside_the_runtime_not_inside_it() {
        assert_eq!(
            work_dir(Path::new("/h/runners/0123456789ab")),
            Some(PathBuf::from("/h/runners/.overlay-work/0123456789ab"))
        );
    }
}
