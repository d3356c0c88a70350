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

/// Fingerprints the tree under `root` (the root itself included).
pub fn fingerprint(root: &Path) -> io::Result<Fingerprint> {
    let mut hasher = Sha256::new();
    let meta = std::fs::symlink_metadata(root)?;
    feed(&mut hasher, b"", &meta);
    walk(root, &mut Vec::new(), &mut hasher)?;
    Ok(hasher.finalize().into())
}

fn feed(hasher: &mut Sha256, rel: &[u8], meta: &std::fs::Metadata) {
    hasher.update(rel);
    hasher.update([0u8]);
    for value in [
        meta.ino(),
        meta.size(),
        u64::from(meta.mode()),
        u64::from(meta.uid()),
        u64::from(meta.gid()),
    ] {
        hasher.update(value.to_le_bytes());
    }
    hasher.update(meta.ctime().to_le_bytes());
    hasher.update(meta.ctime_nsec().to_le_bytes());
}

fn walk(root: &Path, rel: &mut Vec<u8>, hasher: &mut Sha256) -> io::Result<()> {
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
        feed(hasher, rel, &meta);
        if meta.file_type().is_dir() {
            walk(root, rel, hasher)?;
        }
        rel.truncate(len);
    }
    Ok(())
}
