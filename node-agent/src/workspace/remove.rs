//! Removing a directory entry without following it: fd-relative, `O_NOFOLLOW` at every level,
//! and non-directories (FIFOs, sockets, devices, links) are unlinked, never opened. The .NET
//! runner leaves diagnostic FIFOs in `tmp`; opening one for reading would block forever.

use std::ffi::CStr;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};

/// Opens the directory `name` under `dir` without following a link standing there.
pub(crate) fn open_dir_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// What one entry of a directory is, as the listing (or an `lstat` when the listing cannot say)
/// reports it. Never obtained by following a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    Directory,
    Symlink,
    File,
    /// A FIFO, socket or device: unlinked, never opened.
    Special,
}

impl EntryKind {
    fn of(file_type: FileType) -> Option<Self> {
        match file_type {
            FileType::Directory => Some(Self::Directory),
            FileType::Symlink => Some(Self::Symlink),
            FileType::RegularFile => Some(Self::File),
            FileType::Unknown => None,
            _ => Some(Self::Special),
        }
    }
}

/// One direct entry of a directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedEntry {
    pub name: std::ffi::CString,
    pub kind: EntryKind,
}

/// Lists the direct entries of `dir` (without `.` and `..`). An entry whose kind the listing
/// does not give is `lstat`ed; one that vanished in between is skipped, because a vanished
/// entry needs no removal.
pub(crate) fn list_entries(dir: BorrowedFd<'_>) -> io::Result<Vec<ListedEntry>> {
    let raw = read_listing(&mut Dir::read_from(dir)?)?;
    resolve_kinds(raw, dir)
}

/// Lists a directory whose descriptor the caller owns and needs afterwards only for fd-relative
/// calls: the listing takes the descriptor itself (`Dir::read_from` would open a second one)
/// and lends it back through [`Dir::fd`].
pub(crate) fn list_owned(dir: OwnedFd) -> io::Result<(Dir, Vec<ListedEntry>)> {
    let mut listing = Dir::new(dir)?;
    let raw = read_listing(&mut listing)?;
    let entries = resolve_kinds(raw, listing.fd()?)?;
    Ok((listing, entries))
}

/// Names and kinds as the listing gives them (`None`: the listing could not say).
fn read_listing(listing: &mut Dir) -> io::Result<Vec<(std::ffi::CString, Option<EntryKind>)>> {
    let mut raw = Vec::new();
    while let Some(entry) = listing.read() {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        raw.push((name.to_owned(), EntryKind::of(entry.file_type())));
    }
    Ok(raw)
}

fn resolve_kinds(
    raw: Vec<(std::ffi::CString, Option<EntryKind>)>,
    dir: BorrowedFd<'_>,
) -> io::Result<Vec<ListedEntry>> {
    let mut entries = Vec::with_capacity(raw.len());
    for (name, kind) in raw {
        let kind = match kind {
            Some(kind) => kind,
            None => match rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => EntryKind::of(FileType::from_raw_mode(stat.st_mode))
                    .unwrap_or(EntryKind::Special),
                Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            },
        };
        entries.push(ListedEntry { name, kind });
    }
    Ok(entries)
}

/// How much a removal removed, for benchmarks and logs (counts only, never names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    pub entries: u64,
}

/// Removes `name` under `dir`, whatever it is, without following it. A directory's tree is
/// removed depth first through descriptors opened with `O_NOFOLLOW`, so a link planted anywhere
/// is unlinked as a link and its target is never reached. `NotFound` anywhere counts as
/// success: something else removed it first. A directory whose entries cannot be unlinked for
/// want of permission (a read-only subdirectory a job made) gets its owner bits back once, through
/// its own descriptor, and is retried.
pub fn remove_entry_at(dir: BorrowedFd<'_>, name: &CStr, kind: EntryKind) -> io::Result<Removed> {
    let mut removed = Removed::default();
    remove_at(dir, name, kind, &mut removed)?;
    Ok(removed)
}

pub(crate) fn remove_at(
    dir: BorrowedFd<'_>,
    name: &CStr,
    kind: EntryKind,
    removed: &mut Removed,
) -> io::Result<()> {
    if kind != EntryKind::Directory {
        return match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) => {
                removed.entries += 1;
                Ok(())
            }
            Err(rustix::io::Errno::NOENT) => Ok(()),
            // The entry became a directory since it was listed: remove it as one.
            Err(rustix::io::Errno::ISDIR) => remove_at(dir, name, EntryKind::Directory, removed),
            Err(e) => Err(e.into()),
        };
    }
    let child = match open_dir_at(dir, name) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        // ELOOP / ENOTDIR: it was replaced by a link or a file since it was listed. Unlink it
        // as what it is now; never follow it.
        Err(e) if matches!(e.raw_os_error(), Some(code) if code == rustix::io::Errno::LOOP.raw_os_error() || code == rustix::io::Errno::NOTDIR.raw_os_error()) =>
        {
            return remove_at(dir, name, EntryKind::File, removed);
        }
        Err(e) => return Err(e),
    };
    empty_dir(child, removed)?;
    match rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
        Ok(()) => {
            removed.entries += 1;
            Ok(())
        }
        Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Removes every entry of the open directory `dir`, then closes it.
pub(crate) fn empty_dir(dir: OwnedFd, removed: &mut Removed) -> io::Result<()> {
    let (listing, entries) = list_owned(dir)?;
    let dir = listing.fd()?;
    let mut granted = false;
    for entry in entries {
        match remove_at(dir, &entry.name, entry.kind, removed) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied && !granted => {
                // Only the owner bits of this very directory, through its descriptor: no path is
                // resolved, so nothing a job planted can redirect the chmod.
                granted = true;
                grant_owner(dir)?;
                remove_at(dir, &entry.name, entry.kind, removed)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub(crate) fn grant_owner(dir: BorrowedFd<'_>) -> io::Result<()> {
    let stat = rustix::fs::fstat(dir)?;
    let mode = Mode::from_raw_mode(stat.st_mode) | Mode::RWXU;
    Ok(rustix::fs::fchmod(dir, mode)?)
}

/// Opens `path` as a directory without following a final link: the anchor of an fd-relative
/// removal or scrub.
pub(crate) fn open_dir_nofollow(path: &std::path::Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}
