//! The mount table and the one way the agent detaches a mount it finds inside a tree it removes
//! (issue 29). Every removal is one-filesystem: before it descends into a directory it compares
//! the directory's [`MountIdentity`] with the tree's own, and a directory on another mount is
//! never listed. Such a mount is detached by [`detach_exact`]: found in `/proc/self/mountinfo` by
//! its mount id, proven to be stacked on exactly the entry met (its chain of parents reaches the
//! tree's own mount at that one mount point), and detached (`umount2(MNT_DETACH |
//! UMOUNT_NOFOLLOW)`) through the parent directory's own descriptor
//! (`/proc/self/fd/<parent>/<name>`), so no path is resolved again and nothing is guessed. What
//! the mount showed is never touched: a bind mount's host directory keeps every byte.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, StatxFlags};

/// One line of `/proc/self/mountinfo`, what the agent needs of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountPoint {
    /// The mount id (field 1): what `statx(STATX_MNT_ID)` and `fdinfo`'s `mnt_id` report.
    pub id: u64,
    /// The id of the mount this one is mounted on (field 2).
    pub parent: u64,
    pub path: PathBuf,
    pub fs_type: String,
    /// The mount source (`runner-package` for the agent's own overlays).
    pub source: String,
    /// An overlay's lower layers (`lowerdir=` of its super options), empty for anything else.
    pub lowers: Vec<PathBuf>,
}

/// The mount points of this process's mount namespace.
pub fn mount_points() -> io::Result<Vec<MountPoint>> {
    Ok(parse_mountinfo(&std::fs::read_to_string(
        "/proc/self/mountinfo",
    )?))
}

/// Parses mountinfo (proc(5)): fields 1 and 2 are the mount's id and its parent's, field 5 the
/// mount point (octal-escaped); after the ` - ` separator come the filesystem type, the source
/// and the super options.
pub fn parse_mountinfo(text: &str) -> Vec<MountPoint> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mut fields = left.split(' ');
            let id = fields.next()?.parse().ok()?;
            let parent = fields.next()?.parse().ok()?;
            let point = fields.nth(2)?;
            let mut right = right.split(' ');
            let fs_type = right.next()?;
            let source = right.next().unwrap_or_default();
            let lowers = if fs_type == "overlay" {
                right
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .find_map(|o| o.strip_prefix("lowerdir="))
                    .map(|l| l.split(':').map(|p| PathBuf::from(unescape(p))).collect())
                    .unwrap_or_default()
            } else {
                Vec::new()
            };
            Some(MountPoint {
                id,
                parent,
                path: PathBuf::from(unescape(point)),
                fs_type: fs_type.to_owned(),
                source: unescape(source).to_string_lossy().into_owned(),
                lowers,
            })
        })
        .collect()
}

/// Undoes mountinfo's `\ooo` escapes (space, tab, newline, backslash).
fn unescape(s: &str) -> std::ffi::OsString {
    use std::os::unix::ffi::OsStringExt;
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    std::ffi::OsString::from_vec(out)
}

/// Which mount an open file is on: its device, and its mount id (from `statx(STATX_MNT_ID)`,
/// Linux 5.8, else from `/proc/self/fdinfo`'s `mnt_id`, Linux 3.15). The id tells a bind mount
/// of the same filesystem apart, which the device alone does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MountIdentity {
    pub dev: u64,
    pub mnt_id: Option<u64>,
}

impl MountIdentity {
    /// The identity of the open file `fd`, not following anything.
    pub fn of(fd: BorrowedFd<'_>) -> io::Result<Self> {
        Self::statx(fd, c"", AtFlags::EMPTY_PATH).or_else(|e| match e.raw_os_error() {
            // No statx (an old kernel, a seccomp filter): fstat and fdinfo say the same.
            Some(code) if code == rustix::io::Errno::NOSYS.raw_os_error() => {
                let stat = rustix::fs::fstat(fd)?;
                Ok(Self {
                    dev: stat.st_dev,
                    mnt_id: fdinfo_mnt_id(fd),
                })
            }
            _ => Err(e),
        })
    }

    /// The identity of `name` under `dir`, its last component not followed (a mount stacked on
    /// it is crossed: the identity is the topmost mount's).
    pub fn at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Self> {
        Self::statx(dir, name, AtFlags::SYMLINK_NOFOLLOW)
    }

    fn statx(dir: BorrowedFd<'_>, name: &CStr, flags: AtFlags) -> io::Result<Self> {
        let stx = rustix::fs::statx(dir, name, flags, StatxFlags::MNT_ID)?;
        let mnt_id = (stx.stx_mask & StatxFlags::MNT_ID.bits() != 0).then_some(stx.stx_mnt_id);
        let mut identity = Self {
            dev: rustix::fs::makedev(stx.stx_dev_major, stx.stx_dev_minor),
            mnt_id,
        };
        if identity.mnt_id.is_none() && name.is_empty() {
            identity.mnt_id = fdinfo_mnt_id(dir);
        }
        Ok(identity)
    }

    /// Whether `other` is on this same mount. Two ids decide; without both, the devices do.
    pub fn same_mount(&self, other: &Self) -> bool {
        self.dev == other.dev
            && match (self.mnt_id, other.mnt_id) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }
}

/// `mnt_id:` of `/proc/self/fdinfo/<fd>`.
fn fdinfo_mnt_id(fd: BorrowedFd<'_>) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Why a mount found inside a tree being removed was left in place. Closed: it reaches logs,
/// conditions and quarantine details.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MountRefusal {
    /// The kernel refused the detach (`EPERM`: a mount locked by a less privileged namespace;
    /// `EINVAL`: not a mount of this namespace).
    DetachRefused,
    /// The mount table does not show the mount stacked on exactly this entry: nothing is
    /// detached on a guess.
    NotInMountTable,
    /// The mount table could not be read.
    MountTableUnreadable,
    /// Still another mount there after [`MAX_LAYERS`] detaches.
    TooManyLayers,
}

impl MountRefusal {
    pub const ALL: [Self; 4] = [
        Self::DetachRefused,
        Self::NotInMountTable,
        Self::MountTableUnreadable,
        Self::TooManyLayers,
    ];

    /// Fixed, lowercase: what logs and alerts match on.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DetachRefused => "mount_detach_refused",
            Self::NotInMountTable => "mount_not_in_mount_table",
            Self::MountTableUnreadable => "mount_table_unreadable",
            Self::TooManyLayers => "mount_has_too_many_layers",
        }
    }
}

impl std::fmt::Display for MountRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How many mounts stacked on one entry are detached before the removal gives up on it.
pub const MAX_LAYERS: usize = 8;

/// A mount inside a tree being removed that was left in place, and its contents untouched.
/// Carried as the inner error of an `io::Error` of kind `ResourceBusy`, so every caller that
/// maps an I/O error by kind keeps reporting busy, and those that name it find it with
/// [`MountLeft::of`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{} (mount {}{}) is mounted inside the tree being removed and was left in place, its contents untouched ({reason}{}); unmount it by hand (`umount -l`), then the next cleanup pass finishes",
    path.as_ref().map_or_else(|| "a mount".to_owned(), |p| p.display().to_string()),
    id.map_or_else(|| "id unknown".to_owned(), |i| i.to_string()),
    fs_type.as_ref().map_or_else(String::new, |t| format!(", {t}")),
    errno.map_or_else(String::new, |e| format!(": {e:?}"))
)]
pub struct MountLeft {
    pub reason: MountRefusal,
    pub id: Option<u64>,
    /// Where the mount table shows it (a mount point is placed by root: a runner account cannot
    /// mount, so this is an admin's or a privileged tool's path).
    pub path: Option<PathBuf>,
    pub fs_type: Option<String>,
    pub errno: Option<io::ErrorKind>,
}

impl MountLeft {
    /// The mount an I/O error of a removal reports, if it reports one.
    pub fn of(e: &io::Error) -> Option<&Self> {
        e.get_ref().and_then(|inner| inner.downcast_ref::<Self>())
    }

    fn into_io(self) -> io::Error {
        io::Error::new(io::ErrorKind::ResourceBusy, self)
    }
}

/// What [`detach_exact`] detached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detached {
    pub id: u64,
    pub path: PathBuf,
    pub fs_type: String,
}

/// The pure half of [`detach_exact`]: the mount `top` (the id the entry reports) must be in
/// `table` at a mount point whose last component is `name`, and its chain of parents, all at that
/// same mount point (mounts stacked there), must reach `tree` (the tree's own mount id).
pub fn stacked_on_entry<'t>(
    table: &'t [MountPoint],
    top: u64,
    tree: u64,
    name: &[u8],
) -> Result<&'t MountPoint, MountRefusal> {
    use std::os::unix::ffi::OsStrExt;
    let find = |id: u64| table.iter().find(|m| m.id == id);
    let found = find(top).ok_or(MountRefusal::NotInMountTable)?;
    if found.path.file_name().map(OsStrExt::as_bytes) != Some(name) {
        return Err(MountRefusal::NotInMountTable);
    }
    let mut at = found;
    for _ in 0..=MAX_LAYERS {
        if at.parent == tree {
            return Ok(found);
        }
        match find(at.parent) {
            // The mount below, at the same point: keep climbing the stack.
            Some(below) if below.path == found.path => at = below,
            _ => return Err(MountRefusal::NotInMountTable),
        }
    }
    Err(MountRefusal::TooManyLayers)
}

/// Detaches the topmost mount stacked on `name` under `dir` (a directory on the mount `tree`
/// of the tree being removed), whose identity the caller found to be `found`. Refused, and
/// nothing done, unless the mount table shows exactly that mount there.
pub fn detach_exact(
    dir: BorrowedFd<'_>,
    name: &CStr,
    tree: MountIdentity,
    found: MountIdentity,
) -> io::Result<Detached> {
    let left = |reason, m: Option<&MountPoint>, errno| MountLeft {
        reason,
        id: m.map(|m| m.id).or(found.mnt_id),
        path: m.map(|m| m.path.clone()),
        fs_type: m.map(|m| m.fs_type.clone()),
        errno,
    };
    let (Some(top), Some(tree_id)) = (found.mnt_id, tree.mnt_id) else {
        return Err(left(MountRefusal::NotInMountTable, None, None).into_io());
    };
    let table = match mount_points() {
        Ok(table) => table,
        Err(e) => {
            return Err(left(MountRefusal::MountTableUnreadable, None, Some(e.kind())).into_io());
        }
    };
    let mount = stacked_on_entry(&table, top, tree_id, name.to_bytes())
        .map_err(|reason| left(reason, table.iter().find(|m| m.id == top), None).into_io())?;
    // Through the parent's own descriptor: the kernel resolves `<parent>/<name>` from that very
    // directory, so a path renamed or replaced meanwhile cannot redirect the detach.
    let mut target = std::ffi::OsString::from(format!("/proc/self/fd/{}/", dir.as_raw_fd()));
    target.push(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name.to_bytes()));
    use rustix::mount::UnmountFlags;
    if let Err(e) = rustix::mount::unmount(
        Path::new(&target),
        UnmountFlags::DETACH | UnmountFlags::NOFOLLOW,
    ) {
        return Err(left(
            MountRefusal::DetachRefused,
            Some(mount),
            Some(io::Error::from(e).kind()),
        )
        .into_io());
    }
    tracing::warn!(
        "a mount inside a tree being removed was detached, its contents untouched: mount {} ({}) at {}",
        mount.id,
        mount.fs_type,
        mount.path.display()
    );
    Ok(Detached {
        id: mount.id,
        path: mount.path.clone(),
        fs_type: mount.fs_type.clone(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn point(id: u64, parent: u64, path: &str) -> MountPoint {
        MountPoint {
            id,
            parent,
            path: PathBuf::from(path),
            fs_type: "tmpfs".into(),
            source: "tmpfs".into(),
            lowers: Vec::new(),
        }
    }

    #[test]
    fn mountinfo_is_parsed_with_ids_and_escapes() {
        let text = "47 27 0:40 / /tmp/a\\040b/rt rw,relatime - overlay runner-package rw,lowerdir=/x,upperdir=/tmp/a\\040b/rt\n\
                    22 1 8:1 / / rw - ext4 /dev/sda1 rw\n";
        let points = parse_mountinfo(text);
        assert_eq!(
            points,
            vec![
                MountPoint {
                    id: 47,
                    parent: 27,
                    path: PathBuf::from("/tmp/a b/rt"),
                    fs_type: "overlay".into(),
                    source: "runner-package".into(),
                    lowers: vec![PathBuf::from("/x")],
                },
                MountPoint {
                    id: 22,
                    parent: 1,
                    path: PathBuf::from("/"),
                    fs_type: "ext4".into(),
                    source: "/dev/sda1".into(),
                    lowers: Vec::new(),
                },
            ]
        );
    }

    #[test]
    fn only_a_mount_stacked_on_exactly_the_entry_is_detached() {
        let table = [
            point(20, 1, "/"),
            point(30, 20, "/h/runners/rt"),
            point(31, 30, "/h/runners/rt"),
            point(40, 20, "/elsewhere/rt"),
            point(50, 31, "/h/runners/rt/_work/x"),
        ];
        assert_eq!(stacked_on_entry(&table, 30, 20, b"rt").unwrap().id, 30);
        // Stacked twice: the top one, its chain reaching the tree's mount at the same point.
        assert_eq!(stacked_on_entry(&table, 31, 20, b"rt").unwrap().id, 31);
        // Another name, a mount the table does not hold, a chain leaving the point.
        for (top, name) in [(30, &b"other"[..]), (99, b"rt"), (50, b"x")] {
            assert_eq!(
                stacked_on_entry(&table, top, 20, name).map(|m| m.id),
                Err(MountRefusal::NotInMountTable),
                "{top}"
            );
        }
        // Mounted on another tree's mount.
        assert_eq!(
            stacked_on_entry(&table, 40, 30, b"rt").map(|m| m.id),
            Err(MountRefusal::NotInMountTable)
        );
    }

    #[test]
    fn a_stack_deeper_than_the_bound_is_refused() {
        let mut table = vec![point(1, 0, "/")];
        for id in 2..(MAX_LAYERS as u64 + 4) {
            table.push(point(id, id - 1, "/rt"));
        }
        let top = table.last().unwrap().id;
        assert_eq!(
            stacked_on_entry(&table, top, 1, b"rt").map(|m| m.id),
            Err(MountRefusal::TooManyLayers)
        );
    }

    #[test]
    fn every_refusal_has_a_distinct_lowercase_name() {
        let names: std::collections::HashSet<_> =
            MountRefusal::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), MountRefusal::ALL.len());
        assert!(
            names
                .iter()
                .all(|n| n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        );
    }
}
