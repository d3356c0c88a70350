//! `.runner-process.json`: the runner's identity, durable on the host before the launcher's
//! `start` returns (DESIGN §4 rule 1), so an agent that dies between spawn and the `Starting`
//! CAS finds the process again on restart.
//!
//! The file lives in the attempt's runtime directory, which the runner account owns, so the
//! runner could try to plant or replace it. Writing goes to a fresh exclusive temporary name
//! (never following a link) and is renamed over the final name (a rename replaces a link, never
//! follows it), then the file and the directory are fsynced. Reading refuses a link, a
//! non-regular file and a file not owned by the agent's own uid; and inspection still requires
//! the recorded pid to sit in the recorded cgroup, which only the agent can create.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use runner_manager_crds::attempt::ProcessIdentity;
use rustix::fs::{FileType, Mode, OFlags};

/// The identity file's name.
pub const IDENTITY_FILE: &str = ".runner-process.json";
/// Anything larger is not an identity.
const MAX_IDENTITY_BYTES: u64 = 4096;

/// Why the identity file could not be written or read. Closed; I/O by kind only.
#[derive(Debug, thiserror::Error)]
pub enum IdentityFileError {
    #[error("identity file I/O failed: {0}")]
    Io(io::ErrorKind),
    #[error("the identity file is a link or not a regular file")]
    NotARegularFile,
    #[error("the identity file is not owned by the agent")]
    WrongOwner,
    #[error("the identity file is too large")]
    TooLarge,
    #[error("the identity file does not hold an identity")]
    Malformed,
}

impl From<io::Error> for IdentityFileError {
    fn from(e: io::Error) -> Self {
        Self::Io(e.kind())
    }
}

impl From<rustix::io::Errno> for IdentityFileError {
    fn from(e: rustix::io::Errno) -> Self {
        Self::Io(io::Error::from(e).kind())
    }
}

fn open_dir(dir: &Path) -> Result<std::os::fd::OwnedFd, IdentityFileError> {
    Ok(crate::durable::open_dir(dir)?)
}

/// Writes `identity` to `<dir>/.runner-process.json` durably ([`crate::durable::write_file`]).
pub fn write(dir: &Path, identity: &ProcessIdentity) -> Result<(), IdentityFileError> {
    let body = serde_json::to_vec(identity).map_err(|_| IdentityFileError::Malformed)?;
    Ok(crate::durable::write_file(dir, IDENTITY_FILE, &body)?)
}

/// Reads `<dir>/.runner-process.json`. `Ok(None)`: there is none.
pub fn read(dir: &Path) -> Result<Option<ProcessIdentity>, IdentityFileError> {
    let dirfd = open_dir(dir)?;
    let fd = match rustix::fs::openat(
        &dirfd,
        IDENTITY_FILE,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(rustix::io::Errno::LOOP) => return Err(IdentityFileError::NotARegularFile),
        Err(e) => return Err(e.into()),
    };
    let st = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(IdentityFileError::NotARegularFile);
    }
    if st.st_uid != rustix::process::geteuid().as_raw() {
        return Err(IdentityFileError::WrongOwner);
    }
    let mut body = Vec::new();
    File::from(fd)
        .take(MAX_IDENTITY_BYTES + 1)
        .read_to_end(&mut body)?;
    if body.len() as u64 > MAX_IDENTITY_BYTES {
        return Err(IdentityFileError::TooLarge);
    }
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(|_| IdentityFileError::Malformed)
}

/// Removes the identity file (after death is proven, before the workspace goes).
pub fn remove(dir: &Path) -> Result<(), IdentityFileError> {
    Ok(crate::durable::remove_file(dir, IDENTITY_FILE)?)
}
