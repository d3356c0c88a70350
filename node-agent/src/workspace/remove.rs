//! Removing a directory entry without following it: fd-relative, `O_NOFOLLOW` at every level,
//! and non-directories (FIFOs, sockets, devices, links) are unlinked, never opened. The .NET
//! runner leaves diagnostic FIFOs in `tmp`; opening one for reading would block forever.
//!
//! One filesystem (issue 29): this is the agent's one removal primitive (runtimes, slot scrubs,
//! staging sweeps, prunes, set-aside trees all come here), and it never descends into another
//! mount. Each directory is opened first and its [`MountIdentity`] (device and mount id)
//! compared with the tree's own (its anchor's) before it is listed; one on another mount (a bind
//! mount of a host directory, a tmpfs, an overlay stacked on a runtime) is detached exactly
//! ([`crate::mounts::detach_exact`]) and the directory under it, the tree's own, removed; what
//! the mount showed is never listed, so never touched. A mount that cannot be detached stops the
//! removal with a `ResourceBusy` error carrying [`crate::mounts::MountLeft`], its closed reason
//! and the mount's name, for the caller to report (a deferred cleanup, a quarantined slot).

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};

use crate::mounts::{MAX_LAYERS, MountIdentity, detach_exact};

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
    /// The most directory descriptors this removal held open at once (at most
    /// [`MAX_OPEN_DIRS`] + 1, whatever the tree's depth or width).
    pub peak_open_dirs: u64,
    /// Mounts found inside the tree and detached (their contents untouched).
    pub detached: u64,
}

impl Removed {
    /// Adds another removal's figures (a parallel removal's threads).
    pub fn merge(&mut self, other: Removed) {
        self.entries += other.entries;
        self.peak_open_dirs = self.peak_open_dirs.max(other.peak_open_dirs);
        self.detached += other.detached;
    }
}

/// How many directory descriptors one removal keeps open, however deep the tree: the deepest
/// levels of the walk. A shallower level's descriptor is closed when the walk goes deeper than
/// this and reopened through `..` from its child when the walk climbs back, its device and inode
/// checked against the ones it had. 32 levels cover every legitimate tree without a reopen
/// (GitHub's runner is 12 deep); a job's tree 100,000 deep costs one extra `openat` + `fstat`
/// per 32 levels climbed, and never more than 33 descriptors.
pub const MAX_OPEN_DIRS: usize = 32;

/// Removes `name` under `dir`, whatever it is, without following it. A directory's tree is
/// removed depth first through descriptors opened with `O_NOFOLLOW`, so a link planted anywhere
/// is unlinked as a link and its target is never reached. `NotFound` anywhere counts as
/// success: something else removed it first. A directory whose entries cannot be unlinked for
/// want of permission (a read-only subdirectory a job made) gets its owner bits back once, through
/// its own descriptor, and is retried. The first other failure stops the removal.
///
/// Iterative, with at most [`MAX_OPEN_DIRS`] + 1 directory descriptors open and no recursion: a
/// job's tree of any depth can neither overflow the caller's stack (a tokio worker's) nor exhaust
/// the process's descriptors, which the rest of the agent needs meanwhile.
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
    let mut walk = Walk::default();
    let result = match remove_one(dir, name, kind, &mut walk.tree, removed)? {
        Next::Done => Ok(()),
        Next::Descend(frame) => {
            walk.push(frame)?;
            walk.run(dir, removed)
        }
    };
    removed.peak_open_dirs = removed.peak_open_dirs.max(walk.peak);
    result
}

/// The mount of the tree being removed: its anchor's, every directory the walk enters being on
/// it. Taken when first needed (a file's unlink needs it only when refused busy).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TreeMount(Option<MountIdentity>);

impl TreeMount {
    /// `dir` is the anchor or any directory the walk entered (all on the same mount).
    pub(crate) fn get(&mut self, dir: BorrowedFd<'_>) -> io::Result<MountIdentity> {
        if let Some(m) = self.0 {
            return Ok(m);
        }
        let m = MountIdentity::of(dir)?;
        self.0 = Some(m);
        Ok(m)
    }
}

/// Opens the directory `name` under `dir` on the tree's own mount: whatever is mounted on it is
/// detached first, the topmost layer at a time (bounded by [`MAX_LAYERS`]), and never listed.
/// `Ok(fd)` is the tree's own directory; errors are `open_dir_at`'s, or `ResourceBusy` with
/// [`crate::mounts::MountLeft`] for a mount left in place.
pub(crate) fn open_dir_on_tree(
    dir: BorrowedFd<'_>,
    name: &CStr,
    tree: &mut TreeMount,
    detached: &mut u64,
) -> io::Result<OwnedFd> {
    let reference = tree.get(dir)?;
    for _ in 0..=MAX_LAYERS {
        let fd = open_dir_at(dir, name)?;
        let found = MountIdentity::of(fd.as_fd())?;
        if reference.same_mount(&found) {
            return Ok(fd);
        }
        // Closed before the detach: an open descriptor inside would only keep the detached
        // mount alive.
        drop(fd);
        detach_exact(dir, name, reference, found)?;
        *detached += 1;
    }
    Err(io::Error::new(
        io::ErrorKind::ResourceBusy,
        crate::mounts::MountLeft {
            reason: crate::mounts::MountRefusal::TooManyLayers,
            id: None,
            path: None,
            fs_type: None,
            errno: None,
        },
    ))
}

/// A non-directory whose unlink was refused busy: a mount stacked on it (a file bind mount) is
/// detached, exactly. `Ok(true)`: detached, unlink again; `Ok(false)`: no mount there.
fn detach_from_file(
    dir: BorrowedFd<'_>,
    name: &CStr,
    tree: &mut TreeMount,
    removed: &mut Removed,
) -> io::Result<bool> {
    let reference = tree.get(dir)?;
    let found = MountIdentity::at(dir, name)?;
    if reference.same_mount(&found) {
        return Ok(false);
    }
    detach_exact(dir, name, reference, found)?;
    removed.detached += 1;
    Ok(true)
}

/// What removing one entry left to do.
enum Next {
    /// Gone (or was never there).
    Done,
    /// A directory, opened and listed: its entries go first.
    Descend(Frame),
}

/// Removes a non-directory, or opens and lists a directory for the walk. Races are met as the
/// entry is now: a listed file that became a directory is removed as one; a listed directory
/// that became a link or a file is unlinked, never followed.
fn remove_one(
    dir: BorrowedFd<'_>,
    name: &CStr,
    mut kind: EntryKind,
    tree: &mut TreeMount,
    removed: &mut Removed,
) -> io::Result<Next> {
    // At most two rounds: a kind can change once between the listing and here and be met as
    // what it is now; a second change is a failure, not a loop. A file's detached mounts get
    // rounds of their own, bounded like a directory's.
    let mut rounds = 0;
    let mut file_layers = 0;
    while rounds < 2 {
        rounds += 1;
        if kind != EntryKind::Directory {
            match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
                Ok(()) => {
                    removed.entries += 1;
                    return Ok(Next::Done);
                }
                Err(rustix::io::Errno::NOENT) => return Ok(Next::Done),
                // The entry became a directory since it was listed: remove it as one.
                Err(rustix::io::Errno::ISDIR) => {
                    kind = EntryKind::Directory;
                    continue;
                }
                // A mount on the file (a bind mount of a host file): detach it, unlink again.
                Err(rustix::io::Errno::BUSY)
                    if file_layers < MAX_LAYERS && detach_from_file(dir, name, tree, removed)? =>
                {
                    file_layers += 1;
                    rounds -= 1;
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
        }
        match open_dir_on_tree(dir, name, tree, &mut removed.detached) {
            Ok(fd) => {
                let (listing, entries) = list_owned(fd)?;
                return Ok(Next::Descend(Frame::listed(
                    name.to_owned(),
                    listing,
                    entries,
                )));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Next::Done),
            // ELOOP / ENOTDIR: it was replaced by a link or a file since it was listed. Unlink
            // it as what it is now; never follow it.
            Err(e) if is_link_or_not_dir(&e) => kind = EntryKind::File,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other(
        "an entry kept changing kind while it was removed",
    ))
}

pub(crate) fn is_link_or_not_dir(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(code) if code == rustix::io::Errno::LOOP.raw_os_error() || code == rustix::io::Errno::NOTDIR.raw_os_error())
}

/// A directory's descriptor while the walk is in it: the listing's own (no second open), or one
/// reopened through `..` after it was closed.
#[derive(Debug)]
enum Handle {
    Listed(Dir),
    Reopened(OwnedFd),
}

impl Handle {
    fn fd(&self) -> io::Result<BorrowedFd<'_>> {
        match self {
            Self::Listed(dir) => Ok(dir.fd()?),
            Self::Reopened(fd) => Ok(fd.as_fd()),
        }
    }
}

/// One directory on the walk's path.
#[derive(Debug)]
struct Frame {
    /// Its name in its parent.
    name: CString,
    /// `None` while closed to bound the walk's descriptors (see [`MAX_OPEN_DIRS`]).
    handle: Option<Handle>,
    /// Device and inode, taken when the descriptor is closed: what a reopen through a child's
    /// `..` must find, or the tree was moved under the walk and it stops.
    identity: Option<(u64, u64)>,
    /// Entries still to remove, last first (the listing reversed, so they go in listing order).
    pending: Vec<ListedEntry>,
    /// Whether this directory's owner bits were given back already (once only).
    granted: bool,
}

impl Frame {
    fn listed(name: CString, listing: Dir, mut entries: Vec<ListedEntry>) -> Self {
        entries.reverse();
        Self {
            name,
            handle: Some(Handle::Listed(listing)),
            identity: None,
            pending: entries,
            granted: false,
        }
    }
}

/// The directories from the removed entry down to where the walk is.
#[derive(Debug, Default)]
struct Walk {
    path: Vec<Frame>,
    open: usize,
    peak: u64,
    tree: TreeMount,
}

impl Walk {
    /// Goes one level deeper, closing the descriptor that falls out of the window.
    fn push(&mut self, frame: Frame) -> io::Result<()> {
        self.path.push(frame);
        self.open += 1;
        self.peak = self.peak.max(self.open as u64);
        if self.open > MAX_OPEN_DIRS {
            let at = self.path.len() - 1 - MAX_OPEN_DIRS;
            let frame = &mut self.path[at];
            if let Some(handle) = frame.handle.take() {
                let stat = rustix::fs::fstat(handle.fd()?)?;
                frame.identity = Some((stat.st_dev, stat.st_ino));
                self.open -= 1;
            }
        }
        Ok(())
    }

    /// Runs until the entry the walk started from is gone; `anchor` is its parent.
    fn run(&mut self, anchor: BorrowedFd<'_>, removed: &mut Removed) -> io::Result<()> {
        while let Some(top) = self.path.last_mut() {
            let Some(entry) = top.pending.pop() else {
                self.climb(anchor, removed)?;
                continue;
            };
            let fd = top.handle.as_ref().map(Handle::fd).transpose()?;
            let Some(fd) = fd else {
                return Err(io::Error::other("the walk lost its directory"));
            };
            match remove_one(fd, &entry.name, entry.kind, &mut self.tree, removed) {
                Ok(Next::Done) => {}
                Ok(Next::Descend(frame)) => self.push(frame)?,
                Err(e) if is_denied(&e) && !top.granted => {
                    // Only the owner bits of this very directory, through its descriptor: no
                    // path is resolved, so nothing a job planted can redirect the chmod.
                    top.granted = true;
                    grant_owner(fd)?;
                    top.pending.push(entry);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Leaves the emptied deepest directory and removes it from its parent: the next frame up,
    /// reopened through `..` if its descriptor was closed, or the anchor.
    fn climb(&mut self, anchor: BorrowedFd<'_>, removed: &mut Removed) -> io::Result<()> {
        let Some(child) = self.path.pop() else {
            return Ok(());
        };
        if child.handle.is_some() {
            self.open -= 1;
        }
        let Some(parent) = self.path.last_mut() else {
            drop(child.handle);
            return rmdir(anchor, &child.name, removed);
        };
        if parent.handle.is_none() {
            let Some(from) = child.handle.as_ref() else {
                return Err(io::Error::other("the walk lost its directory"));
            };
            let up = rustix::fs::openat(
                from.fd()?,
                c"..",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            let stat = rustix::fs::fstat(&up)?;
            if parent.identity != Some((stat.st_dev, stat.st_ino)) {
                // Only a process still running in the tree can move it, and the runner's are
                // stopped before any removal; refusing is the safe answer either way.
                return Err(io::Error::other(
                    "a directory was moved out of the tree while it was being removed",
                ));
            }
            parent.handle = Some(Handle::Reopened(up));
            self.open += 1;
            self.peak = self.peak.max(self.open as u64 + 1);
        }
        drop(child.handle);
        let fd = parent
            .handle
            .as_ref()
            .map(Handle::fd)
            .transpose()?
            .ok_or_else(|| io::Error::other("the walk lost its directory"))?;
        match rmdir(fd, &child.name, removed) {
            Err(e) if is_denied(&e) && !parent.granted => {
                parent.granted = true;
                grant_owner(fd)?;
                rmdir(fd, &child.name, removed)
            }
            other => other,
        }
    }
}

fn rmdir(dir: BorrowedFd<'_>, name: &CStr, removed: &mut Removed) -> io::Result<()> {
    match rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
        Ok(()) => {
            removed.entries += 1;
            Ok(())
        }
        Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn is_denied(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied
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

/// Removes the tree at `path` (its final component never followed) with [`remove_entry_at`]:
/// bounded descriptors and no recursion, for trees the agent made itself from input it does not
/// control (a package archive's staging). Nothing there counts as success.
pub fn remove_tree(path: &std::path::Path) -> io::Result<Removed> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a tree to remove needs a parent directory and a name",
        ));
    };
    let parent = match open_dir_nofollow(if parent.as_os_str().is_empty() {
        std::path::Path::new(".")
    } else {
        parent
    }) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Removed::default()),
        Err(e) => return Err(e),
    };
    let name = CString::new(std::os::unix::ffi::OsStrExt::as_bytes(name))
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a name holds a NUL byte"))?;
    let kind = match rustix::fs::statat(&parent, &name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => {
            EntryKind::of(FileType::from_raw_mode(stat.st_mode)).unwrap_or(EntryKind::Special)
        }
        Err(rustix::io::Errno::NOENT) => return Ok(Removed::default()),
        Err(e) => return Err(e.into()),
    };
    remove_entry_at(parent.as_fd(), &name, kind)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn identity(path: &std::path::Path) -> (u64, u64) {
        let stat = rustix::fs::stat(path).unwrap();
        (stat.st_dev, stat.st_ino)
    }

    /// A closed parent is reopened through its child's `..`; if that is not the directory the
    /// walk left (the tree was moved under it), the walk stops before removing anything there.
    #[test]
    fn a_parent_reopened_through_dotdot_must_be_the_directory_it_left() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::create_dir(dir.path().join("elsewhere")).unwrap();
        let anchor = open_dir_nofollow(dir.path()).unwrap();
        let walk_from = |parent_identity| {
            let mut walk = Walk::default();
            walk.path.push(Frame {
                name: c"a".to_owned(),
                handle: None,
                identity: Some(parent_identity),
                pending: Vec::new(),
                granted: false,
            });
            walk.path.push(Frame {
                name: c"b".to_owned(),
                handle: Some(Handle::Reopened(
                    open_dir_nofollow(&dir.path().join("a/b")).unwrap(),
                )),
                identity: None,
                pending: Vec::new(),
                granted: false,
            });
            walk.open = 1;
            let mut removed = Removed::default();
            walk.run(anchor.as_fd(), &mut removed).map(|()| removed)
        };
        let moved = walk_from(identity(&dir.path().join("elsewhere"))).unwrap_err();
        assert!(moved.to_string().contains("moved"), "{moved}");
        assert!(
            dir.path().join("a/b").exists(),
            "nothing removed past the check"
        );
        let removed = walk_from(identity(&dir.path().join("a"))).unwrap();
        assert_eq!(removed.entries, 2);
        assert!(!dir.path().join("a").exists());
    }
}
