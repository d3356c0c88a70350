//! The restrictive JIT handoff file (DESIGN §4 rule 2, lifecycle spec §3, supplement §4.2).
//!
//! The JIT exists on disk only here, and only between [`RestrictiveHandoff::create`] and the
//! entry helper's [`take`]: a file named `jit-<uuid>.tmp`, created exclusively (never following
//! a link) with mode 0600 by the creating call itself, owned by the runner's account, inside the
//! attempt's 0700 runtime directory owned by that same account, written and fsynced. The reader
//! deletes it right after reading; the creator's `Drop` deletes it on every other path, so an
//! error between creation and spawn cannot leave it behind. Its content never reaches `Debug`,
//! an error or a log: errors carry `io::ErrorKind`s and closed checks only.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use secrecy::{ExposeSecret, SecretString};

use crate::account::RunnerAccount;

/// Every handoff file's name starts with this; cleanup verification looks for it.
pub const NAME_PREFIX: &str = "jit-";
/// The listener's environment file (the policy's `runner.env`, encoded): a handoff of its own
/// kind, `jit-env-<uuid>.tmp`. It shares the JIT's prefix on purpose, so every sweep and scrub
/// that removes or refuses a surviving JIT handoff treats it the same way; a JIT handoff's
/// uuid never starts with `env-`.
pub const ENVIRONMENT_PREFIX: &str = "jit-env-";
/// In the runtime: the pointer naming the handoff file, written (after the handoff is whole and
/// fsynced) by the agent ([`offer`]), removed by the helper.
pub const HANDOFF_POINTER: &str = ".jit-handoff";
/// In the runtime: left by the helper once it has read and deleted the handoff, before exec.
pub const TAKEN_MARKER: &str = ".jit-taken";
/// The handoff's name ends with this.
const NAME_SUFFIX: &str = ".tmp";
/// The only mode a runtime directory may have while it holds a handoff.
const RUNTIME_MODE: u32 = 0o700;
/// The only mode a handoff file may have.
const HANDOFF_MODE: u32 = 0o600;
/// A JIT config is a few kilobytes; anything much larger is not one.
const MAX_HANDOFF_BYTES: u64 = 256 * 1024;

/// What was wrong with the runtime directory or the handoff file. Closed: reaches logs and
/// conditions as a kind, never with a path or content.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HandoffRefusal {
    #[error("the runtime directory is a symbolic link or not a directory")]
    RuntimeNotADirectory,
    #[error("the runtime directory's mode is not 0700")]
    RuntimeModeNotPrivate,
    #[error("the runtime directory is not owned by the runner account")]
    RuntimeWrongOwner,
    #[error("the handoff name is not a handoff name")]
    NotAHandoffName,
    #[error("the handoff is not a regular file")]
    NotARegularFile,
    #[error("the handoff's mode is not 0600")]
    ModeNotPrivate,
    #[error("the handoff is not owned by the runner account")]
    WrongOwner,
    #[error("the handoff has more than one link")]
    ExtraLinks,
    #[error("the handoff is empty or too large to be a JIT")]
    BadSize,
    #[error("the handoff is not UTF-8")]
    NotUtf8,
}

/// A handoff failure: a refusal, or an I/O error by kind only.
#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    #[error("handoff refused: {0}")]
    Refused(#[from] HandoffRefusal),
    #[error("handoff I/O failed while {step}: {kind}")]
    Io {
        step: HandoffStep,
        kind: io::ErrorKind,
    },
}

/// Which step an I/O error happened in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HandoffStep {
    #[error("opening the runtime directory")]
    OpenRuntime,
    #[error("creating the file")]
    Create,
    #[error("setting its owner")]
    Chown,
    #[error("writing it")]
    Write,
    #[error("syncing it")]
    Sync,
    #[error("opening it")]
    Open,
    #[error("reading it")]
    Read,
    #[error("deleting it")]
    Delete,
}

fn io_at(step: HandoffStep) -> impl FnOnce(io::Error) -> HandoffError {
    move |e| HandoffError::Io {
        step,
        kind: e.kind(),
    }
}

fn errno_at(step: HandoffStep) -> impl FnOnce(rustix::io::Errno) -> HandoffError {
    move |e| HandoffError::Io {
        step,
        kind: io::Error::from(e).kind(),
    }
}

/// Opens `runtime` without following a link and proves it is a real 0700 directory owned by
/// `account.uid`. Everything later is relative to the returned descriptor, so a rename of the
/// path after the check changes nothing.
pub fn open_private_runtime(
    runtime: &Path,
    account: RunnerAccount,
) -> Result<OwnedFd, HandoffError> {
    let dir = rustix::fs::open(
        runtime,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => {
            HandoffError::Refused(HandoffRefusal::RuntimeNotADirectory)
        }
        e => errno_at(HandoffStep::OpenRuntime)(e),
    })?;
    let st = rustix::fs::fstat(&dir).map_err(errno_at(HandoffStep::OpenRuntime))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return Err(HandoffRefusal::RuntimeNotADirectory.into());
    }
    if st.st_mode & 0o7777 != RUNTIME_MODE {
        return Err(HandoffRefusal::RuntimeModeNotPrivate.into());
    }
    if st.st_uid != account.uid {
        return Err(HandoffRefusal::RuntimeWrongOwner.into());
    }
    Ok(dir)
}

/// The handoff file, from creation until it is deleted. Holds no secret: the JIT is written and
/// forgotten at creation.
pub struct RestrictiveHandoff {
    dir: OwnedFd,
    name: String,
    path: PathBuf,
    deleted: bool,
}

impl std::fmt::Debug for RestrictiveHandoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The name is a random uuid, not the secret; the content is never held.
        f.debug_struct("RestrictiveHandoff")
            .field("name", &self.name)
            .field("deleted", &self.deleted)
            .finish()
    }
}

impl RestrictiveHandoff {
    /// Creates `jit-<uuid>.tmp` in `runtime` (which must be a real 0700 directory owned by
    /// `account`), mode 0600 from the creating call (never chmod-after-create), owned by
    /// `account`, holding `jit`, fsynced, and its directory entry fsynced.
    pub fn create(
        runtime: &Path,
        account: RunnerAccount,
        jit: &SecretString,
    ) -> Result<Self, HandoffError> {
        Self::create_named(runtime, account, NAME_PREFIX, jit)
    }

    /// The listener's environment file, `jit-env-<uuid>.tmp`, made exactly like the JIT's
    /// handoff: under the systemd launcher `runner.env` reaches the runner this way and never
    /// as a unit property, which any local account can read (`systemctl show -p Environment`,
    /// the unit file under `/run/systemd/transient`).
    pub fn create_environment(
        runtime: &Path,
        account: RunnerAccount,
        encoded: &SecretString,
    ) -> Result<Self, HandoffError> {
        Self::create_named(runtime, account, ENVIRONMENT_PREFIX, encoded)
    }

    fn create_named(
        runtime: &Path,
        account: RunnerAccount,
        prefix: &str,
        jit: &SecretString,
    ) -> Result<Self, HandoffError> {
        let dir = open_private_runtime(runtime, account)?;
        let name = format!("{prefix}{}{NAME_SUFFIX}", uuid::Uuid::new_v4());
        let fd = rustix::fs::openat(
            &dir,
            name.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(HANDOFF_MODE),
        )
        .map_err(errno_at(HandoffStep::Create))?;
        // From here on, Drop removes the file whatever fails next.
        let handoff = Self {
            dir,
            path: runtime.join(&name),
            name,
            deleted: false,
        };
        let mut file = File::from(fd);
        let st = rustix::fs::fstat(&file).map_err(errno_at(HandoffStep::Create))?;
        if st.st_mode & 0o7777 != HANDOFF_MODE {
            // A umask that strips owner bits would leave a file the runner cannot read.
            return Err(HandoffRefusal::ModeNotPrivate.into());
        }
        std::os::unix::fs::fchown(&file, Some(account.uid), Some(account.gid))
            .map_err(io_at(HandoffStep::Chown))?;
        file.write_all(jit.expose_secret().as_bytes())
            .map_err(io_at(HandoffStep::Write))?;
        file.sync_all().map_err(io_at(HandoffStep::Sync))?;
        rustix::fs::fsync(&handoff.dir).map_err(errno_at(HandoffStep::Sync))?;
        Ok(handoff)
    }

    /// Where the file is (the path the entry helper is given).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its name (`jit-<uuid>.tmp`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the file is still there (the entry helper deletes it after reading).
    pub fn exists(&self) -> Result<bool, HandoffError> {
        match rustix::fs::statat(&self.dir, self.name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => Ok(true),
            Err(rustix::io::Errno::NOENT) => Ok(false),
            Err(e) => Err(errno_at(HandoffStep::Open)(e)),
        }
    }

    /// Deletes the file if it is still there (already gone counts as deleted) and syncs the
    /// directory, so the removal survives a power loss.
    pub fn delete(mut self) -> Result<(), HandoffError> {
        self.delete_in_place()
    }

    fn delete_in_place(&mut self) -> Result<(), HandoffError> {
        if self.deleted {
            return Ok(());
        }
        match rustix::fs::unlinkat(&self.dir, self.name.as_str(), AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(errno_at(HandoffStep::Delete)(e)),
        }
        rustix::fs::fsync(&self.dir).map_err(errno_at(HandoffStep::Delete))?;
        self.deleted = true;
        Ok(())
    }
}

impl Drop for RestrictiveHandoff {
    fn drop(&mut self) {
        // Best effort on the unwind path; the launcher calls `delete` and checks it on the
        // ordinary path.
        let _ = self.delete_in_place();
    }
}

/// Offers a handoff to an entry helper waiting for it (`--await-handoff`: a runner pod's, or a
/// unit started before its JIT): writes the pointer naming it in the runtime (durably, then the
/// runner account's, 0600), after the handoff itself is whole, so the helper never sees a
/// half-written handoff.
pub fn offer(runtime: &Path, account: RunnerAccount, handoff_name: &str) -> io::Result<()> {
    crate::durable::write_file(runtime, HANDOFF_POINTER, handoff_name.as_bytes())?;
    std::os::unix::fs::lchown(
        runtime.join(HANDOFF_POINTER),
        Some(account.uid),
        Some(account.gid),
    )
}

/// Removes an offer an earlier runner of the same runtime may have left (a persistent slot
/// keeps its runtime, and its jobs run as the account that owns it): the pointer, which a
/// waiting helper would follow to a handoff that job planted, and the taken marker, which would
/// speak for this launch. Called before any helper of a new launch waits in the runtime.
pub fn clear_stale_offer(runtime: &Path) {
    for stale in [HANDOFF_POINTER, TAKEN_MARKER] {
        let _ = std::fs::remove_file(runtime.join(stale));
    }
}

/// Whether a directory entry name is a handoff's (for cleanup verification and tests).
pub fn is_handoff_name(name: &OsStr) -> bool {
    let b = name.as_bytes();
    b.starts_with(NAME_PREFIX.as_bytes()) && b.ends_with(NAME_SUFFIX.as_bytes())
}

/// The entry helper's side: reads the handoff at `path` and deletes it before returning the
/// JIT. Refuses a link, a non-regular file, a file with other links, a mode other than 0600 or
/// an owner other than `owner_uid`, and a runtime directory that is not a real 0700 directory of
/// that same owner.
pub fn take(path: &Path, owner_uid: u32) -> Result<SecretString, HandoffError> {
    take_named(path, owner_uid, |n| {
        is_handoff_name(n) && !n.as_bytes().starts_with(ENVIRONMENT_PREFIX.as_bytes())
    })
}

/// [`take`] for the environment file ([`RestrictiveHandoff::create_environment`]): the same
/// checks, read once and deleted.
pub fn take_environment(path: &Path, owner_uid: u32) -> Result<SecretString, HandoffError> {
    take_named(path, owner_uid, |n| {
        is_handoff_name(n) && n.as_bytes().starts_with(ENVIRONMENT_PREFIX.as_bytes())
    })
}

fn take_named(
    path: &Path,
    owner_uid: u32,
    name_ok: impl Fn(&OsStr) -> bool,
) -> Result<SecretString, HandoffError> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(HandoffRefusal::NotAHandoffName.into());
    };
    if !name_ok(name) {
        return Err(HandoffRefusal::NotAHandoffName.into());
    }
    let dir = open_private_runtime(
        parent,
        RunnerAccount {
            uid: owner_uid,
            gid: 0,
        },
    )?;
    let fd = rustix::fs::openat(
        &dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP => HandoffError::Refused(HandoffRefusal::NotARegularFile),
        e => errno_at(HandoffStep::Open)(e),
    })?;
    let st = rustix::fs::fstat(&fd).map_err(errno_at(HandoffStep::Open))?;
    let refusal = if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        Some(HandoffRefusal::NotARegularFile)
    } else if st.st_mode & 0o7777 != HANDOFF_MODE {
        Some(HandoffRefusal::ModeNotPrivate)
    } else if st.st_uid != owner_uid {
        Some(HandoffRefusal::WrongOwner)
    } else if st.st_nlink != 1 {
        Some(HandoffRefusal::ExtraLinks)
    } else if st.st_size <= 0 || st.st_size as u64 > MAX_HANDOFF_BYTES {
        Some(HandoffRefusal::BadSize)
    } else {
        None
    };
    if let Some(refusal) = refusal {
        return Err(refusal.into());
    }
    let mut bytes = Vec::with_capacity(st.st_size as usize);
    let read = File::from(fd)
        .take(MAX_HANDOFF_BYTES + 1)
        .read_to_end(&mut bytes);
    // Delete whatever the read did: the file is single-use.
    let deleted = rustix::fs::unlinkat(&dir, name, AtFlags::empty())
        .map_err(errno_at(HandoffStep::Delete))
        .and_then(|()| rustix::fs::fsync(&dir).map_err(errno_at(HandoffStep::Delete)));
    let secret =
        read.map_err(io_at(HandoffStep::Read))
            .and_then(|_| match String::from_utf8(bytes) {
                Ok(s) => Ok(SecretString::from(s)),
                Err(e) => {
                    // Zero the rejected bytes too.
                    let mut b = e.into_bytes();
                    secrecy::zeroize::Zeroize::zeroize(&mut b);
                    Err(HandoffRefusal::NotUtf8.into())
                }
            });
    deleted?;
    secret
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_recognised_by_prefix_and_suffix() {
        assert!(is_handoff_name(OsStr::new("jit-0b5c.tmp")));
        assert!(!is_handoff_name(OsStr::new("jit-0b5c")));
        assert!(!is_handoff_name(OsStr::new(".runner-process.json")));
        // The environment file is swept and scrubbed as a handoff.
        assert!(is_handoff_name(OsStr::new("jit-env-0b5c.tmp")));
    }

    /// Each kind is taken only by its own reader: the JIT reader refuses the environment file
    /// and the environment reader a JIT handoff, so neither can be given the other's content.
    #[test]
    fn the_environment_file_is_made_and_taken_like_the_jit() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let runtime = dir.path().join("rt");
        std::fs::create_dir(&runtime).unwrap();
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
        let me = std::fs::metadata(&runtime).unwrap();
        let account = RunnerAccount {
            uid: me.uid(),
            gid: me.gid(),
        };
        let env =
            RestrictiveHandoff::create_environment(&runtime, account, &SecretString::from("A=1\n"))
                .unwrap();
        assert!(env.name().starts_with(ENVIRONMENT_PREFIX));
        let mode = std::fs::metadata(env.path()).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);
        assert!(matches!(
            take(env.path(), account.uid),
            Err(HandoffError::Refused(HandoffRefusal::NotAHandoffName))
        ));
        let got = take_environment(env.path(), account.uid).unwrap();
        assert_eq!(got.expose_secret(), "A=1\n");
        assert!(!env.exists().unwrap(), "read once, then gone");
        let jit = RestrictiveHandoff::create(&runtime, account, &SecretString::from("j")).unwrap();
        assert!(take_environment(jit.path(), account.uid).is_err());
        assert_eq!(take(jit.path(), account.uid).unwrap().expose_secret(), "j");
    }
}
