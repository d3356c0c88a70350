//! Laying a package out in a runtime: a reflink clone (`FICLONE`) of every file where the
//! runtime's volume supports it, else an in-kernel copy (`copy_file_range`), on several threads.
//! The walk is over the *source*, entries are created only where nothing stands (`O_EXCL`,
//! `O_NOFOLLOW`, `mkdir` failing on an existing name), and a source with a top-level `_work` is
//! refused, so a persistent slot's retained `_work` is never opened, overwritten or followed.

use std::fs::{DirBuilder, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

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
}

/// Copies the tree under `origin` into the existing directory `dest`.
pub fn copy_tree(origin: &Path, dest: &Path, threads: usize) -> Result<CopyReport, CopyError> {
    match std::fs::symlink_metadata(origin.join(WORK_DIR)) {
        Ok(_) => return Err(CopyError::TopLevelWork),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    let mut files = Vec::new();
    lay_out_dirs(origin, dest, Path::new(""), &mut files)?;
    copy_files(origin, dest, &files, threads)
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
        let meta = std::fs::symlink_metadata(origin.join(&child))?;
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

fn copy_files(
    origin: &Path,
    dest: &Path,
    files: &[FileJob],
    threads: usize,
) -> Result<CopyReport, CopyError> {
    let next = AtomicUsize::new(0);
    let reflinked = AtomicU64::new(0);
    let bytes = AtomicU64::new(0);
    // Once the volume says it cannot clone, stop asking for every file.
    let can_clone = AtomicBool::new(true);
    let failure: Mutex<Option<CopyError>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = files.get(i) else { break };
                    match copy_one(origin, dest, job, &can_clone) {
                        Ok(cloned) => {
                            if cloned {
                                reflinked.fetch_add(1, Ordering::Relaxed);
                            }
                            bytes.fetch_add(job.size, Ordering::Relaxed);
                        }
                        Err(e) => {
                            if let Ok(mut slot) = failure.lock() {
                                slot.get_or_insert(e);
                            }
                            // Stop the others too: the copy is rejected as a whole.
                            next.store(files.len(), Ordering::Relaxed);
                            break;
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = failure.into_inner().ok().flatten() {
        return Err(e);
    }
    Ok(CopyReport {
        files: files.len() as u64,
        reflinked: reflinked.into_inner(),
        bytes: bytes.into_inner(),
    })
}

/// Returns whether the file was cloned.
fn copy_one(
    origin: &Path,
    dest: &Path,
    job: &FileJob,
    can_clone: &AtomicBool,
) -> Result<bool, CopyError> {
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
    let mut cloned = false;
    if can_clone.load(Ordering::Relaxed) {
        match rustix::fs::ioctl_ficlone(&dst, &src) {
            Ok(()) => cloned = true,
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
    if !cloned {
        // `io::copy` between files uses copy_file_range: an in-kernel copy.
        io::copy(&mut src, &mut dst)?;
    }
    dst.set_permissions(std::fs::Permissions::from_mode(job.mode))?;
    Ok(cloned)
}
