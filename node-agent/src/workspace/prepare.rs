//! Create-or-validate a persistent slot before it is leased: the policy root and the slot are
//! created when missing and refused when a link or a non-directory stands there; the slot must
//! resolve where the agent derives it; and it is reused only when empty or holding exactly one
//! real `_work`. Leftovers are cleanup's job, never this function's: it removes nothing.

use std::fs::DirBuilder;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::slot_path::{SENSITIVE_SLOT_ENTRIES, SlotPathError, WORK_DIR, derive_slot_path};

/// A slot ready for a package.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedSlot {
    pub path: PathBuf,
    /// Whether a retained `_work` is there (the slot is warm).
    pub retained_work: bool,
}

/// Why a slot cannot be used. Paths here are agent-derived; entry names a workflow chose are
/// counted, never echoed.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SlotPrepareError {
    #[error(transparent)]
    Path(#[from] SlotPathError),
    #[error(transparent)]
    Root(#[from] crate::roots::RootError),
    #[error("{} is a link; slots and their parents are never followed", path.display())]
    Link { path: PathBuf },
    #[error("{} is not a directory; it was left untouched", path.display())]
    NotADirectory { path: PathBuf },
    #[error("{} resolves outside the slots root", path.display())]
    Escapes { path: PathBuf },
    #[error("{} is not reusable: {others} {} other than one real `_work`{}; cleanup must clear it first", path.display(), if *others == 1 { "entry" } else { "entries" }, including(named))]
    NotReusable {
        path: PathBuf,
        others: usize,
        named: Vec<&'static str>,
    },
    #[error("{} could not be prepared ({kind:?})", path.display())]
    Io { path: PathBuf, kind: io::ErrorKind },
}

fn including(named: &[&'static str]) -> String {
    if named.is_empty() {
        String::new()
    } else {
        let names: Vec<_> = named.iter().map(|n| format!("`{n}`")).collect();
        format!(", including {}", names.join(", "))
    }
}

/// Creates or validates `<slotsRoot>/<namespace>/<policy uid>/s<slot>`.
pub fn prepare_slot(
    slots_root: &Path,
    namespace: &str,
    policy_uid: &str,
    slot: u32,
) -> Result<PreparedSlot, SlotPrepareError> {
    // The one root validation, here too: a slots root inside the package cache (whose
    // reinstall sets a tree aside whole) would lose every retained `_work` with it.
    crate::roots::validate_root(crate::roots::Root::Slots, slots_root)?;
    let path = derive_slot_path(slots_root, namespace, policy_uid, slot)?;
    let io_error = |path: &Path, e: io::Error| SlotPrepareError::Io {
        path: path.to_path_buf(),
        kind: e.kind(),
    };
    DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(slots_root)
        .map_err(|e| io_error(slots_root, e))?;
    let namespace_dir = slots_root.join(namespace);
    let policy_root = namespace_dir.join(policy_uid);
    for (dir, mode) in [
        (&namespace_dir, 0o755),
        (&policy_root, 0o755),
        (&path, 0o700),
    ] {
        create_or_validate(dir, mode)?;
    }
    let root = std::fs::canonicalize(slots_root).map_err(|e| io_error(slots_root, e))?;
    let resolved = std::fs::canonicalize(&path).map_err(|e| io_error(&path, e))?;
    if resolved
        != root
            .join(namespace)
            .join(policy_uid)
            .join(path.file_name().unwrap_or_default())
    {
        return Err(SlotPrepareError::Escapes { path });
    }
    let retained_work = accept_reusable(&path)?;
    Ok(PreparedSlot {
        path,
        retained_work,
    })
}

/// A missing directory is created; an existing real directory is accepted; a link or anything
/// else is refused and left as it is.
fn create_or_validate(dir: &Path, mode: u32) -> Result<(), SlotPrepareError> {
    match DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(SlotPrepareError::Io {
                path: dir.to_path_buf(),
                kind: e.kind(),
            });
        }
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| SlotPrepareError::Io {
        path: dir.to_path_buf(),
        kind: e.kind(),
    })?;
    if meta.file_type().is_symlink() {
        Err(SlotPrepareError::Link {
            path: dir.to_path_buf(),
        })
    } else if !meta.is_dir() {
        Err(SlotPrepareError::NotADirectory {
            path: dir.to_path_buf(),
        })
    } else {
        Ok(())
    }
}

/// One level deep, nothing followed: empty, or exactly one real `_work` directory. Returns
/// whether `_work` is there.
fn accept_reusable(slot: &Path) -> Result<bool, SlotPrepareError> {
    let io_error = |e: io::Error| SlotPrepareError::Io {
        path: slot.to_path_buf(),
        kind: e.kind(),
    };
    let mut others = 0;
    let mut named = Vec::new();
    let mut work = false;
    for entry in std::fs::read_dir(slot).map_err(io_error)? {
        let entry = entry.map_err(io_error)?;
        let name = entry.file_name();
        let kind = match entry.file_type() {
            Ok(kind) => kind,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error(e)),
        };
        if name == WORK_DIR && kind.is_dir() {
            work = true;
            continue;
        }
        others += 1;
        if let Some(n) = SENSITIVE_SLOT_ENTRIES
            .iter()
            .copied()
            .chain([WORK_DIR])
            .find(|n| name == *n)
        {
            named.push(n);
        }
    }
    if others == 0 {
        Ok(work)
    } else {
        named.sort_unstable();
        Err(SlotPrepareError::NotReusable {
            path: slot.to_path_buf(),
            others,
            named,
        })
    }
}
