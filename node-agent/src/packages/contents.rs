//! What a verified archive holds (`PackageContents`): every entry's kind, and every file's size,
//! exec bit and sha256, read while extracting the archive whose digest was checked. The decisive
//! check of a tree: a cache entry after a suspected edit, and every runtime copy.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use sha2::{Digest, Sha256};

use crate::workspace::WORK_DIR;

/// One entry of a package.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryRecord {
    Dir,
    File {
        size: u64,
        executable: bool,
        sha256: [u8; 32],
    },
    Symlink {
        target: PathBuf,
    },
}

/// Every entry of a package, by relative path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackageContents {
    pub entries: BTreeMap<PathBuf, EntryRecord>,
}

/// How a tree differs from the contents. Counts only: a tree a job could have touched may hold
/// names chosen by a workflow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the tree differs from the verified package: {missing} missing, {extra} unexpected, {changed} changed"
)]
pub struct TreeMismatch {
    pub missing: usize,
    pub extra: usize,
    pub changed: usize,
}

/// Whether a runtime's top-level `_work` belongs to the check (a persistent slot's is not the
/// package's and is never opened).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetainedWork {
    Skip,
    Include,
}

impl PackageContents {
    pub fn files(&self) -> usize {
        self.entries
            .values()
            .filter(|e| matches!(e, EntryRecord::File { .. }))
            .count()
    }

    /// The top-level names the package lays down in a runtime.
    pub fn top_level(&self) -> impl Iterator<Item = &Path> {
        self.entries
            .keys()
            .filter(|p| p.components().count() == 1)
            .map(PathBuf::as_path)
    }

    /// Reads `root` in full against these contents: the entry set, every kind, every file's
    /// size, exec bit and bytes. Files are hashed on `threads` threads.
    pub fn verify_tree(
        &self,
        root: &Path,
        work: RetainedWork,
        threads: usize,
    ) -> io::Result<Result<(), TreeMismatch>> {
        self.check(root, work, Some(threads))
    }

    /// Checks everything [`Self::verify_tree`] checks except the files' bytes: the entry set,
    /// every kind, link target, file size and exec bit. Only for a tree whose bytes are proven
    /// otherwise (see [`CopyCheck`]).
    pub fn verify_layout(
        &self,
        root: &Path,
        work: RetainedWork,
    ) -> io::Result<Result<(), TreeMismatch>> {
        self.check(root, work, None)
    }

    /// Verifies a runtime copy as `check` says: in full, or its layout only.
    pub fn verify_copy(
        &self,
        root: &Path,
        work: RetainedWork,
        check: CopyCheck,
        threads: usize,
    ) -> io::Result<Result<(), TreeMismatch>> {
        match check {
            CopyCheck::Full => self.verify_tree(root, work, threads),
            CopyCheck::LayoutOnly => self.verify_layout(root, work),
        }
    }

    /// `hash_threads: None` checks the layout only.
    fn check(
        &self,
        root: &Path,
        work: RetainedWork,
        hash_threads: Option<usize>,
    ) -> io::Result<Result<(), TreeMismatch>> {
        let mut found = BTreeMap::new();
        walk(root, Path::new(""), work, &mut found)?;
        let mut mismatch = TreeMismatch {
            missing: 0,
            extra: 0,
            changed: 0,
        };
        let mut to_hash = Vec::new();
        for (path, expected) in &self.entries {
            match (expected, found.remove(path)) {
                (_, None) => mismatch.missing += 1,
                (EntryRecord::Dir, Some(Found::Dir)) => {}
                (EntryRecord::Symlink { target }, Some(Found::Symlink(actual))) => {
                    if *target != actual {
                        mismatch.changed += 1;
                    }
                }
                (
                    EntryRecord::File {
                        size, executable, ..
                    },
                    Some(Found::File {
                        size: actual_size,
                        executable: actual_exec,
                    }),
                ) => {
                    if *size != actual_size || *executable != actual_exec {
                        mismatch.changed += 1;
                    } else {
                        to_hash.push((path, expected));
                    }
                }
                _ => mismatch.changed += 1,
            }
        }
        mismatch.extra = found.len();
        if let Some(threads) = hash_threads {
            mismatch.changed += hash_in_parallel(root, &to_hash, threads)?;
        }
        Ok(
            if mismatch.missing + mismatch.extra + mismatch.changed == 0 {
                Ok(())
            } else {
                Err(mismatch)
            },
        )
    }
}

/// How much of a runtime copy its verification must read again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyCheck {
    /// Every file's bytes: some cloned file's origin is not proven intact.
    Full,
    /// The layout only: every byte is proven already, each file either hashed as it was copied
    /// or cloned from an origin proven intact across the clone.
    LayoutOnly,
}

enum Found {
    Dir,
    File { size: u64, executable: bool },
    Symlink(PathBuf),
    Other,
}

fn walk(
    root: &Path,
    rel: &Path,
    work: RetainedWork,
    found: &mut BTreeMap<PathBuf, Found>,
) -> io::Result<()> {
    for entry in std::fs::read_dir(root.join(rel))? {
        let entry = entry?;
        let child = rel.join(entry.file_name());
        if rel.as_os_str().is_empty() && work == RetainedWork::Skip && entry.file_name() == WORK_DIR
        {
            continue;
        }
        // `DirEntry::metadata` is an `lstat` relative to the open directory: no link followed,
        // no path walked again.
        let meta = entry.metadata()?;
        let kind = meta.file_type();
        let record = if kind.is_dir() {
            walk(root, &child, work, found)?;
            Found::Dir
        } else if kind.is_symlink() {
            Found::Symlink(std::fs::read_link(root.join(&child))?)
        } else if kind.is_file() {
            Found::File {
                size: meta.len(),
                executable: meta.permissions().mode() & 0o111 != 0,
            }
        } else {
            Found::Other
        };
        found.insert(child, record);
    }
    Ok(())
}

/// Hashes the listed files on `threads` threads; returns how many differ.
fn hash_in_parallel(
    root: &Path,
    files: &[(&PathBuf, &EntryRecord)],
    threads: usize,
) -> io::Result<usize> {
    let next = AtomicUsize::new(0);
    let differing = AtomicUsize::new(0);
    let failure: Mutex<Option<io::Error>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((path, EntryRecord::File { sha256, .. })) = files.get(i) else {
                        break;
                    };
                    match sha256_file(&root.join(path)) {
                        Ok(actual) if actual == *sha256 => {}
                        Ok(_) => {
                            differing.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            if let Ok(mut slot) = failure.lock() {
                                slot.get_or_insert(e);
                            }
                            break;
                        }
                    }
                }
            });
        }
    });
    match failure.into_inner().ok().flatten() {
        Some(e) => Err(e),
        None => Ok(differing.into_inner()),
    }
}

/// The sha256 of a file's bytes, without following a link.
pub fn sha256_file(path: &Path) -> io::Result<[u8; 32]> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = File::options()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)?;
    sha256_reader(&mut file)
}

pub(crate) fn sha256_reader(reader: &mut impl Read) -> io::Result<[u8; 32]> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().into())
}
