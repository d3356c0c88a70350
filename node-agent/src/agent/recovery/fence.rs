//! The host fence (DESIGN §4 rule 7): an exclusive `flock` on `<hostRoot>/agent.lock`, held for
//! the agent's whole life. A second agent on the same host (a surge rollout, a stray process)
//! cannot take it and refuses to act. The kernel drops the lock when the holder dies, however it
//! dies, so a crashed agent never blocks its successor.

use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, flock};

/// The lock file's name in the host root.
pub const LOCK_FILE: &str = "agent.lock";

/// Why the fence was not taken.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    #[error(
        "another node agent holds {}: refusing to act (one agent per host)",
        .0.display()
    )]
    Held(PathBuf),
    #[error("cannot open {}: {kind:?}", path.display())]
    Io { path: PathBuf, kind: io::ErrorKind },
}

/// The held fence; dropping it (or dying) releases the lock.
#[derive(Debug)]
pub struct HostFence {
    _file: File,
}

impl HostFence {
    /// Takes the lock without waiting.
    pub fn acquire(host_root: &Path) -> Result<Self, FenceError> {
        let path = host_root.join(LOCK_FILE);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&path)
            .map_err(|e| FenceError::Io {
                path: path.clone(),
                kind: e.kind(),
            })?;
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Self { _file: file }),
            Err(rustix::io::Errno::WOULDBLOCK) => Err(FenceError::Held(path)),
            Err(e) => Err(FenceError::Io {
                path,
                kind: io::Error::from(e).kind(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_until_the_first_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = HostFence::acquire(dir.path()).unwrap();
        assert!(matches!(
            HostFence::acquire(dir.path()),
            Err(FenceError::Held(_))
        ));
        drop(first);
        HostFence::acquire(dir.path()).unwrap();
    }
}
