//! Durable small files in a directory the agent does not fully trust (the runner account owns
//! the runtime): an exclusive temporary name opened without following links, written and
//! fsynced, renamed over the final name (a rename replaces a link, never follows it), then the
//! directory fsynced. Returns only once all of that succeeded.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{AtFlags, Mode, OFlags};

/// Opens a directory without following a link at its last component.
pub fn open_dir(dir: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Writes `body` to `<dir>/<name>` durably (mode 0600, the agent's own file).
pub fn write_file(dir: &Path, name: &str, body: &[u8]) -> io::Result<()> {
    let dirfd = open_dir(dir)?;
    let tmp = format!("{name}.{}.tmp", uuid::Uuid::new_v4());
    let fd = rustix::fs::openat(
        &dirfd,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    let mut file = File::from(fd);
    let written = file
        .write_all(body)
        .and_then(|()| file.sync_all())
        .and_then(|()| Ok(rustix::fs::renameat(&dirfd, tmp.as_str(), &dirfd, name)?));
    if let Err(e) = written {
        let _ = rustix::fs::unlinkat(&dirfd, tmp.as_str(), AtFlags::empty());
        return Err(e);
    }
    rustix::fs::fsync(&dirfd)?;
    Ok(())
}

/// Removes `<dir>/<name>` (already gone is fine) and fsyncs the directory.
pub fn remove_file(dir: &Path, name: &str) -> io::Result<()> {
    let dirfd = open_dir(dir)?;
    match rustix::fs::unlinkat(&dirfd, name, AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(e.into()),
    }
    rustix::fs::fsync(&dirfd)?;
    Ok(())
}
