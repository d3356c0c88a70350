//! Ephemeral runtimes: `<hostRoot>/runners/<12 hex>`, created 0700 for one attempt and removed
//! whole, without opening FIFOs or following links. Removal dispatches on the journalled kind
//! and refuses a path that is not the one derived for the attempt, so a damaged journal can
//! never aim a recursive removal elsewhere.

use std::fs::DirBuilder;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use runner_manager_crds::names::{ephemeral_runtime_dir, short_hex};
use rustix::fs::{AtFlags, FileType};
use uuid::Uuid;

use super::remove::{EntryKind, open_dir_nofollow};
use super::remove_parallel::{removal_threads, remove_entry_at_parallel};

/// `<hostRoot>/runners`.
pub fn runners_dir(host_root: &Path) -> PathBuf {
    host_root.join("runners")
}

/// `<hostRoot>/runners/<12 hex>`.
pub fn ephemeral_runtime_path(host_root: &Path, attempt: Uuid) -> PathBuf {
    host_root.join(ephemeral_runtime_dir(attempt))
}

/// Why an ephemeral runtime was not removed. Tolerated by supervision and retried with backoff.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum EphemeralError {
    #[error(
        "the journalled runtime is not the path derived for the attempt ({}); nothing was removed", expected.display()
    )]
    NotTheDerivedPath { expected: PathBuf },
    #[error("the ephemeral runtime {} could not be removed ({kind:?}); retried with backoff", path.display())]
    CouldNotBeRemoved { path: PathBuf, kind: io::ErrorKind },
    /// A mount inside the runtime (or stacked on it) could not be detached: the removal stopped
    /// there, the mount's contents untouched, and is retried with backoff.
    #[error("the ephemeral runtime {} could not be removed: {mount}; retried with backoff", path.display())]
    MountInside {
        path: PathBuf,
        mount: crate::mounts::MountLeft,
    },
    #[error("the ephemeral runtime {} could not be created ({kind:?})", path.display())]
    CouldNotBeCreated { path: PathBuf, kind: io::ErrorKind },
    #[error(transparent)]
    Root(#[from] crate::roots::RootError),
}

/// What a removal found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EphemeralRemoval {
    /// Removed; `entries` counts entries at every depth.
    Removed { entries: u64 },
    /// Nothing was there: already clean.
    AlreadyGone,
}

/// Creates a fresh runtime for an attempt. An existing one is refused: a runtime is never
/// shared, and what stands there is residue for cleanup.
pub fn create_ephemeral_runtime(
    host_root: &Path,
    attempt: Uuid,
) -> Result<PathBuf, EphemeralError> {
    crate::roots::validate_root(crate::roots::Root::Host, host_root)?;
    let path = ephemeral_runtime_path(host_root, attempt);
    let failed = |e: io::Error| EphemeralError::CouldNotBeCreated {
        path: path.clone(),
        kind: e.kind(),
    };
    DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(runners_dir(host_root))
        .map_err(failed)?;
    DirBuilder::new()
        .mode(0o700)
        .create(&path)
        .map_err(failed)?;
    Ok(path)
}

/// Removes an attempt's ephemeral runtime whole. Also the reaper of late residue: after an
/// attempt is `Cleaned`, a late child may recreate part of its runtime, and the next pass calls
/// this again (the caller must not release the package lease a second time).
pub fn remove_ephemeral_runtime(
    host_root: &Path,
    attempt: Uuid,
    journalled: &str,
) -> Result<EphemeralRemoval, EphemeralError> {
    let expected = ephemeral_runtime_path(host_root, attempt);
    if Path::new(journalled) != expected {
        return Err(EphemeralError::NotTheDerivedPath { expected });
    }
    remove_runtime_named(host_root, &short_hex(attempt))
}

/// The attempt names (12 hex) of the runtimes under `<hostRoot>/runners`: what the orphan sweep
/// compares with the journal. Entries of any other name are not listed (nor ever removed).
pub fn runtime_names(host_root: &Path) -> io::Result<Vec<String>> {
    use crate::providers::launcher::attempt_names_in;
    let mut found = attempt_names_in(&runners_dir(host_root))?;
    // An overlay workdir whose runtime is gone (a crash between the two removals) is listed by
    // its attempt name too, so the sweep removes it with `remove_runtime_named`. (Unreadable:
    // none listed, as before.)
    let work_root = runners_dir(host_root).join(crate::packages::overlay::WORK_ROOT);
    found.extend(attempt_names_in(&work_root).unwrap_or_default());
    found.sort();
    found.dedup();
    Ok(found)
}

/// Removes `<hostRoot>/runners/<name>` whole, for an attempt name (12 hex) that no attempt
/// claims any more: the orphan sweep's removal, the same fd-relative walk as an attempt's.
pub fn remove_runtime_named(
    host_root: &Path,
    name: &str,
) -> Result<EphemeralRemoval, EphemeralError> {
    let expected = runners_dir(host_root).join(name);
    let failed = |e: io::Error| match crate::mounts::MountLeft::of(&e) {
        Some(mount) => EphemeralError::MountInside {
            path: expected.clone(),
            mount: mount.clone(),
        },
        None => EphemeralError::CouldNotBeRemoved {
            path: expected.clone(),
            kind: e.kind(),
        },
    };
    if !crate::providers::launcher::is_attempt_short(name) {
        return Err(EphemeralError::NotTheDerivedPath { expected });
    }
    crate::roots::validate_root(crate::roots::Root::Host, host_root)?;
    // An overlay-materialized runtime is unmounted first (never followed: `UMOUNT_NOFOLLOW`),
    // so what is removed below is the upper alone — only what the job wrote — and never the
    // package under it. A busy mount is detached (see `Unmounted::Detached`).
    if let Err(e) = crate::packages::overlay::unmount(&expected) {
        tracing::warn!(
            "the overlay at {} could not be unmounted: {e}",
            expected.display()
        );
        return Err(EphemeralError::CouldNotBeRemoved {
            path: expected.clone(),
            kind: io::ErrorKind::ResourceBusy,
        });
    }
    // The runners directory is the anchor; from here on nothing is resolved by path. Anything
    // else still mounted on the runtime or inside it (a mount stacked on the overlay, a bind
    // mount in a copied runtime's `_work`) is detached by the removal, exactly, and never
    // walked into.
    let runners = match open_dir_nofollow(&runners_dir(host_root)) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(EphemeralRemoval::AlreadyGone),
        Err(e) => return Err(failed(e)),
    };
    let kind = match rustix::fs::statat(runners.as_fd(), name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) if FileType::from_raw_mode(stat.st_mode) == FileType::Directory => {
            Some(EntryKind::Directory)
        }
        // A link or a file where the runtime was: unlinked, never followed.
        Ok(_) => Some(EntryKind::File),
        Err(rustix::io::Errno::NOENT) => None,
        Err(e) => return Err(failed(e.into())),
    };
    let removed = match kind {
        Some(kind) => Some(
            remove_entry_at_parallel(runners.as_fd(), &cstring(name), kind, removal_threads())
                .map_err(failed)?,
        ),
        None => None,
    };
    // The workdir after the runtime: while an overlay was still stacked under another mount,
    // its workdir was in use.
    crate::packages::overlay::remove_work_dir(&expected).map_err(failed)?;
    Ok(match removed {
        Some(removed) => EphemeralRemoval::Removed {
            entries: removed.entries,
        },
        None => EphemeralRemoval::AlreadyGone,
    })
}

fn cstring(name: &str) -> std::ffi::CString {
    // A 12-hex name has no NUL byte.
    std::ffi::CString::new(name).unwrap_or_default()
}
