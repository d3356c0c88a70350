//! The cheap pre-copy check of a trusted tree: SHA-256 over a sorted recursive `lstat` walk,
//! hashing each entry's relative path, a NUL, then inode, size, mode, uid and gid (64-bit little
//! endian) and ctime seconds and nanoseconds. Any edit, replacement or rename moves a ctime,
//! which only the superuser can set, so a job that rewrites `bin/Runner.Listener` in place is
//! caught without reading a byte of content.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use sha2::{Digest, Sha256};

/// A tree's fingerprint.
pub type Fingerprint = [u8; 32];

/// What the fingerprint takes of one entry. Equal stamps of a file at two moments mean it was
/// neither written, truncated, chmodded, renamed nor replaced in between (each moves its ctime
/// or its inode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub ino: u64,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub ctime: i64,
    pub ctime_nsec: i64,
}

impl Stamp {
    pub fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            ino: meta.ino(),
            size: meta.size(),
            mode: meta.mode(),
            uid: meta.uid(),
            gid: meta.gid(),
            ctime: meta.ctime(),
            ctime_nsec: meta.ctime_nsec(),
        }
    }

    /// `S_IFMT` says directory.
    pub fn is_dir(&self) -> bool {
        self.mode & 0o170_000 == 0o040_000
    }
}

/// Fingerprints the tree under `root` (the root itself included).
pub fn fingerprint(root: &Path) -> io::Result<Fingerprint> {
    fingerprint_visiting(root, &mut |_, _| {})
}

/// [`fingerprint`], handing each entry below the root (relative path, stamp) to `visit` in the
/// walk's order, so a caller can check the tree's entries in the same walk.
pub fn fingerprint_visiting(
    root: &Path,
    visit: &mut dyn FnMut(&Path, &Stamp),
) -> io::Result<Fingerprint> {
    let mut hasher = Sha256::new();
    let meta = std::fs::symlink_metadata(root)?;
    feed(&mut hasher, b"", &Stamp::of(&meta));
    walk(root, &mut Vec::new(), &mut hasher, visit)?;
    Ok(hasher.finalize().into())
}

fn feed(hasher: &mut Sha256, rel: &[u8], stamp: &Stamp) {
    hasher.update(rel);
    hasher.update([0u8]);
    for value in [
        stamp.ino,
        stamp.size,
        u64::from(stamp.mode),
        u64::from(stamp.uid),
        u64::from(stamp.gid),
    ] {
        hasher.update(value.to_le_bytes());
    }
    hasher.update(stamp.ctime.to_le_bytes());
    hasher.update(stamp.ctime_nsec.to_le_bytes());
}

fn walk(
    root: &Path,
    rel: &mut Vec<u8>,
    hasher: &mut Sha256,
    visit: &mut dyn FnMut(&Path, &Stamp),
) -> io::Result<()> {
    let dir = root.join(std::ffi::OsStr::from_bytes(rel));
    // `DirEntry::metadata` is an `lstat` relative to the open directory (no link followed).
    let mut entries: Vec<_> = std::fs::read_dir(&dir)?
        .map(|e| e.and_then(|e| Ok((e.file_name(), e.metadata()?))))
        .collect::<Result<_, _>>()?;
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, meta) in entries {
        let len = rel.len();
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(name.as_bytes());
        let stamp = Stamp::of(&meta);
        feed(hasher, rel, &stamp);
        visit(Path::new(std::ffi::OsStr::from_bytes(rel)), &stamp);
        if meta.file_type().is_dir() {
            walk(root, rel, hasher, visit)?;
        }
        rel.truncate(len);
    }
    Ok(())
}
