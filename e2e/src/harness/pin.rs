//! Pinning a file with the immutable flag (`chattr +i`) so that removing it fails: how scenarios
//! make a runtime, a slot or a package tree the agent cannot remove.
//!
//! A runtime materialized by overlay (the agent's default `--materialize auto`) is an overlay
//! mounted on its own directory, which is also its upper layer. `chattr +i` through the overlay
//! does not set the upper inode's flag: the kernel stores it as the upper's
//! `trusted.overlay.protattr` xattr, which only the overlay obeys, so once the agent unmounts the
//! runtime the file goes and the scenario no longer sees a removal fail. A file under an overlay
//! is therefore pinned on the upper itself, reached through a non-recursive bind mount of the
//! overlay's parent directory (a plain `--bind` does not carry submounts, so the runtime appears
//! there as its bare upper directory); the bind is unmounted at once. Anything else is pinned in
//! place.

use std::path::{Path, PathBuf};
use std::process::Command;

use runner_manager_node_agent::packages::overlay;

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error(
        "`{0}` failed ({1}): the host root must be on ext4/xfs/btrfs and the tests run as root"
    )]
    Command(String, std::process::ExitStatus),
}

/// A file made immutable (`chattr +i`) on the inode that outlives any overlay above it; the flag
/// is cleared (by the same route) on drop, so a failed test still leaves a removable tempdir.
#[derive(Debug)]
pub struct Pinned(PathBuf);

impl Pinned {
    /// Writes `path` (through whatever is mounted there, as a job would) and pins it.
    pub fn set(path: PathBuf) -> Result<Self, PinError> {
        std::fs::write(&path, b"pinned")
            .map_err(|e| PinError::Io(path.display().to_string(), e))?;
        chattr("+i", &path)?;
        Ok(Self(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // Resolved again: the agent may have unmounted the overlay meanwhile.
        if let Err(e) = chattr("-i", &self.0) {
            eprintln!("could not unpin {}: {e}", self.0.display());
        }
    }
}

/// `chattr flag path`, on the upper layer when `path` lies under an overlay mounted now.
fn chattr(flag: &str, path: &Path) -> Result<(), PinError> {
    let io = |what: &Path, e| PinError::Io(what.display().to_string(), e);
    let mounts = overlay::mount_points().map_err(|e| io(Path::new("/proc/self/mountinfo"), e))?;
    // The innermost overlay holding `path` (the last mounted at a path is the visible one).
    let under = mounts
        .iter()
        .filter(|m| m.fs_type == "overlay" && path.starts_with(&m.path))
        .max_by_key(|m| m.path.components().count());
    let (Some(point), Some(parent), Some(name)) = (
        under.map(|m| &m.path),
        under.and_then(|m| m.path.parent()),
        under.and_then(|m| m.path.file_name()),
    ) else {
        return run(Command::new("chattr").arg(flag).arg(path));
    };
    let Ok(rest) = path.strip_prefix(point) else {
        return run(Command::new("chattr").arg(flag).arg(path));
    };
    // Kept, not a `TempDir`: a recursive removal of it with the bind still mounted would delete
    // the runtime's files through the bind. Removed (empty) once unmounted.
    let view = tempfile::Builder::new()
        .prefix("rm-pin-view-")
        .tempdir()
        .map_err(|e| io(Path::new("a temporary directory"), e))?
        .keep();
    run(Command::new("mount").arg("--bind").arg(parent).arg(&view))?;
    let pinned = run(Command::new("chattr")
        .arg(flag)
        .arg(view.join(name).join(rest)));
    let unmounted = run(Command::new("umount").arg(&view));
    if unmounted.is_ok() {
        let _ = std::fs::remove_dir(&view);
    }
    pinned.and(unmounted)
}

fn run(cmd: &mut Command) -> Result<(), PinError> {
    let what = format!("{cmd:?}");
    let status = cmd
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| PinError::Io(what.clone(), e))?;
    if status.success() {
        Ok(())
    } else {
        Err(PinError::Command(what, status))
    }
}
