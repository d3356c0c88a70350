//! Laying a package out in a runtime: a reflink clone (`FICLONE`) of every file where the
//! runtime's volume supports it, else an in-kernel copy (`copy_file_range`), on several threads.
//! The walk is over the *source*, entries are created only where nothing stands (`O_EXCL`,
//! `O_NOFOLLOW`, `mkdir` failing on an existing name), and a source with a top-level `_work` is
//! refused, so a persistent slot's retained `_work` is never opened, overwritten or followed.
//!
//! [`copy_tree_checked`] also proves what it copies byte for byte: a file that is not cloned is
//! read once, hashed as it is read and written from the very buffer that was hashed, so the
//! copy holds exactly the hashed bytes and a second read of the copy would prove nothing more.

use std::fs::{DirBuilder, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use sha2::{Digest, Sha256};

use super::contents::{CopyCheck, EntryRecord, PackageContents};
use crate::workspace::WORK_DIR;

/// Why a copy failed.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("the package source has a top-level `_work`; it is never copied into a runtime")]
    TopLevelWork,
    #[error("the runtime already holds an entry the package would lay down")]
    Occupied,
    #[error("copying the package failed ({0})")]
    Io(#[from] io::Error),
}

/// What a copy did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyReport {
    pub files: u64,
    /// Files cloned by reflink (sharing extents with the source).
    pub reflinked: u64,
    pub bytes: u64,
    /// Files copied byte for byte and checked against the contents as they were read (checked
    /// copies only).
    pub hashed: u64,
    /// Of those, files whose bytes differ from the contents, or that the contents do not list
    /// as a file: the origin changed since it was verified.
    pub differing: u64,
}

impl CopyReport {
    /// What the copy's verification must still read ([`CopyCheck`]), from this report and
    /// whether its origin is proven intact (its bytes were read against the contents at
    /// fingerprint F, and it still had F after the copy).
    ///
    /// Why a clone needs no second read: `FICLONE` makes the new file share the origin's extents
    /// as they are at that instant, so at creation the clone holds exactly the origin's bytes.
    /// A clone can differ from the contents only if the origin did, and an origin with the same
    /// fingerprint before and after the copy was not written in between (any write, truncation,
    /// replacement or rename moves a ctime, which only the superuser can set). What remains is
    /// an origin mutated *before* the copy while keeping its fingerprint, which the origin's own
    /// proof excludes: it was read in full after that fingerprint was taken.
    ///
    /// Counted, not assumed: every file must be either hashed as copied or a clone of an intact
    /// origin, so a plain (unchecked) copy always gets the full check.
    pub fn check(&self, origin_intact: bool) -> CopyCheck {
        let clones_proven = if origin_intact { self.reflinked } else { 0 };
        if self.hashed + clones_proven >= self.files {
            CopyCheck::LayoutOnly
        } else {
            CopyCheck::Full
        }
    }
}

/// Copies the tree under `origin` into the existing directory `dest`.
pub fn copy_tree(origin: &Path, dest: &Path, threads: usize) -> Result<CopyReport, CopyError> {
    copy_tree_with(origin, dest, None, threads)
}

/// Copies like [`copy_tree`], hashing every file that is not cloned against `contents` as it is
/// copied; the report counts the files that differ. A cloned file is not read: what proves it
/// is the origin's own proof (see `super::origin`).
pub fn copy_tree_checked(
    origin: &Path,
    dest: &Path,
    contents: &PackageContents,
    threads: usize,
) -> Result<CopyReport, CopyError> {
    copy_tree_with(origin, dest, Some(contents), threads)
}

fn copy_tree_with(
    origin: &Path,
    dest: &Path,
    contents: Option<&PackageContents>,
    threads: usize,
) -> Result<CopyReport, CopyError> {
    match std::fs::symlink_metadata(origin.join(WORK_DIR)) {
        Ok(_) => return Err(CopyError::TopLevelWork),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    let mut files = Vec::new();
    lay_out_dirs(origin, dest, Path::new(""), &mut files)?;
    copy_files(origin, dest, &files, contents, threads)
}

struct FileJob {
    rel: PathBuf,
    mode: u32,
    size: u64,
}

/// Creates directories and links in walk order (parents first) and collects the files.
fn lay_out_dirs(
    origin: &Path,
    dest: &Path,
    rel: &Path,
    files: &mut Vec<FileJob>,
) -> Result<(), CopyError> {
    for entry in std::fs::read_dir(origin.join(rel))? {
        let entry = entry?;
        let child = rel.join(entry.file_name());
        // An `lstat` relative to the open directory.
        let meta = entry.metadata()?;
        let kind = meta.file_type();
        let target = dest.join(&child);
        let created = if kind.is_dir() {
            DirBuilder::new()
                .mode(meta.permissions().mode() & 0o777)
                .create(&target)
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(origin.join(&child))?, &target)
        } else if kind.is_file() {
            files.push(FileJob {
                rel: child.clone(),
                mode: meta.permissions().mode() & 0o777,
                size: meta.len(),
            });
            Ok(())
        } else {
            // A verified package holds no special files; one here means the tree changed.
            return Err(CopyError::Io(io::Error::new(
                io::ErrorKind::InvalidData,
                "the package source holds a special file",
            )));
        };
        match created {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Err(CopyError::Occupied),
            other => other?,
        }
        if kind.is_dir() {
            lay_out_dirs(origin, dest, &child, files)?;
        }
    }
    Ok(())
}

/// What the contents say a file must hold.
#[derive(Clone, Copy)]
enum Expected<'a> {
    /// A plain copy: nothing to check against.
    Unchecked,
    File {
        size: u64,
        sha256: &'a [u8; 32],
    },
    /// The contents hold no file by that name.
    NotAFile,
}

impl<'a> Expected<'a> {
    fn of(contents: Option<&'a PackageContents>, rel: &Path) -> Self {
        match contents.map(|c| c.entries.get(rel)) {
            None => Self::Unchecked,
            Some(Some(EntryRecord::File { size, sha256, .. })) => Self::File {
                size: *size,
                sha256,
            },
            Some(_) => Self::NotAFile,
        }
    }
}

/// How one file was laid down.
enum Laid {
    Cloned,
    Copied,
    CopiedMatching,
    CopiedDiffering,
}

fn copy_files(
    origin: &Path,
    dest: &Path,
    files: &[FileJob],
    contents: Option<&PackageContents>,
    threads: usize,
) -> Result<CopyReport, CopyError> {
    let next = AtomicUsize::new(0);
    let reflinked = AtomicU64::new(0);
    let hashed = AtomicU64::new(0);
    let differing = AtomicU64::new(0);
    let bytes = AtomicU64::new(0);
    // Once the volume says it cannot clone, stop asking for every file.
    let can_clone = AtomicBool::new(true);
    let failure: Mutex<Option<CopyError>> = Mutex::new(None);
    // Lays down the next file; `false` once there is none left or the copy failed.
    let step = |buf: &mut Vec<u8>| -> bool {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(job) = files.get(i) else {
            return false;
        };
        let expected = Expected::of(contents, &job.rel);
        match copy_one(origin, dest, job, expected, &can_clone, buf) {
            Ok(laid) => {
                let counter = match laid {
                    Laid::Cloned => Some(&reflinked),
                    Laid::Copied => None,
                    Laid::CopiedMatching => Some(&hashed),
                    Laid::CopiedDiffering => {
                        hashed.fetch_add(1, Ordering::Relaxed);
                        Some(&differing)
                    }
                };
                if let Some(counter) = counter {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                bytes.fetch_add(job.size, Ordering::Relaxed);
                true
            }
            Err(e) => {
                if let Ok(mut slot) = failure.lock() {
                    slot.get_or_insert(e);
                }
                // Stop the others too: the copy is rejected as a whole.
                next.store(files.len(), Ordering::Relaxed);
                false
            }
        }
    };
    // One buffer per thread, for checked copies only.
    let mut buf = Vec::new();
    // The first file goes alone and tells whether the volume clones. Clones are metadata
    // operations that contend for the same directories and log when run side by side: on XFS
    // the 9,000-file package cloned in 590 ms on one thread and 852 ms on two. Byte copies
    // (and their hashing) get every thread.
    if step(&mut buf) {
        let threads = if reflinked.load(Ordering::Relaxed) > 0 {
            1
        } else {
            threads.max(1)
        };
        std::thread::scope(|scope| {
            for _ in 1..threads {
                scope.spawn(|| {
                    let mut buf = Vec::new();
                    while step(&mut buf) {}
                });
            }
            while step(&mut buf) {}
        });
    }
    if let Some(e) = failure.into_inner().ok().flatten() {
        return Err(e);
    }
    Ok(CopyReport {
        files: files.len() as u64,
        reflinked: reflinked.into_inner(),
        bytes: bytes.into_inner(),
        hashed: hashed.into_inner(),
        differing: differing.into_inner(),
    })
}

fn copy_one(
    origin: &Path,
    dest: &Path,
    job: &FileJob,
    expected: Expected<'_>,
    can_clone: &AtomicBool,
    buf: &mut Vec<u8>,
) -> Result<Laid, CopyError> {
    let nofollow = rustix::fs::OFlags::NOFOLLOW.bits() as i32;
    let mut src = File::options()
        .read(true)
        .custom_flags(nofollow)
        .open(origin.join(&job.rel))?;
    let mut dst = match File::options()
        .write(true)
        .create_new(true)
        .mode(job.mode)
        .custom_flags(nofollow)
        .open(dest.join(&job.rel))
    {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Err(CopyError::Occupied),
        other => other?,
    };
    let mut laid = None;
    if can_clone.load(Ordering::Relaxed) {
        match rustix::fs::ioctl_ficlone(&dst, &src) {
            Ok(()) => laid = Some(Laid::Cloned),
            Err(e)
                if e == rustix::io::Errno::OPNOTSUPP
                    || e == rustix::io::Errno::XDEV
                    || e == rustix::io::Errno::INVAL
                    || e == rustix::io::Errno::NOTTY =>
            {
                can_clone.store(false, Ordering::Relaxed);
            }
            Err(e) => return Err(CopyError::Io(e.into())),
        }
    }
    let laid = match (laid, expected) {
        (Some(laid), _) => laid,
        (None, Expected::Unchecked) => {
            // `io::copy` between files uses copy_file_range: an in-kernel copy.
            io::copy(&mut src, &mut dst)?;
            Laid::Copied
        }
        (None, Expected::File { size, sha256 }) => {
            // A size that moved means the origin changed, even where the first `size` bytes
            // still match: the copy would be right, but the origin must be forgotten.
            if job.size == size && copy_hashing(&mut src, &mut dst, size, buf)? == *sha256 {
                Laid::CopiedMatching
            } else {
                Laid::CopiedDiffering
            }
        }
        (None, Expected::NotAFile) => {
            io::copy(&mut src, &mut dst)?;
            Laid::CopiedDiffering
        }
    };
    dst.set_permissions(std::fs::Permissions::from_mode(job.mode))?;
    Ok(laid)
}

/// Copies at most `size` bytes (what the contents say the file holds), hashing each buffer
/// before writing that same buffer; returns the hash of exactly what was written. Stopping at
/// `size` is sound: a source that grew yields a copy of `size` bytes whose hash is checked, and
/// one that shrank yields a short copy whose hash cannot match.
fn copy_hashing(
    src: &mut File,
    dst: &mut File,
    size: u64,
    buf: &mut Vec<u8>,
) -> io::Result<[u8; 32]> {
    const CHUNK: usize = 256 * 1024;
    if buf.len() < CHUNK {
        buf.resize(CHUNK, 0);
    }
    let mut hasher = Sha256::new();
    let mut left = size;
    while left > 0 {
        let want = usize::try_from(left).map_or(CHUNK, |l| l.min(CHUNK));
        let n = match src.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        dst.write_all(&buf[..n])?;
        left -= n as u64;
    }
    Ok(hasher.finalize().into())
}
