//! The preflight of the agent's two roots (`--host-root`, `--slots-root`), run before anything
//! is created: a root the agent removes trees under must be one nothing else lives in.
//!
//! Refused: a relative path or one with `..`; the filesystem root; anything under `/proc`,
//! `/sys` or `/dev`; the two roots equal; the host root inside the slots root; the slots root
//! being the host root's own directories (the package cache `packages`, the ephemeral `runners`,
//! `diagnostics`) or inside one of them. A slots root inside the package cache would lose every
//! slot's retained `_work` when the package is reinstalled (the cache sets an untrusted tree
//! aside whole). The slots root may sit in a directory of its own under the host root (the
//! default `<hostRoot>/slots`), as the predecessor allowed descent into its runtime directory.
//!
//! Each check is made twice: on the paths as given, and on where they resolve (the deepest
//! existing ancestor canonicalized, the rest appended), so a link cannot smuggle a root into
//! `/proc` or the package cache. Read-only: nothing here creates, removes or changes anything.

use std::io;
use std::path::{Component, Path, PathBuf};

/// The host root's own directories, which the slots root must stay out of.
pub const HOST_ROOT_DIRS: [&str; 3] = ["packages", "runners", "diagnostics"];

/// Kernel filesystems no root may be placed in.
const FORBIDDEN_TREES: [&str; 3] = ["/proc", "/sys", "/dev"];

/// Which root a refusal is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Root {
    Host,
    Slots,
}

impl Root {
    fn flag(self) -> &'static str {
        match self {
            Self::Host => "--host-root (RM_HOST_ROOT)",
            Self::Slots => "--slots-root (RM_SLOTS_ROOT)",
        }
    }
}

impl std::fmt::Display for Root {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.flag())
    }
}

/// Why the roots were refused; each names the flag and the fix.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RootError {
    #[error("{0} is {1}: it must be an absolute path, e.g. /var/lib/runner-manager")]
    NotAbsolute(Root, PathBuf),
    #[error("{0} is {1}: it must not contain `..`; give the directory's own path")]
    Climbs(Root, PathBuf),
    #[error(
        "{0} is {1}, the filesystem root: the agent removes trees under its roots; give a directory of its own, e.g. /var/lib/runner-manager"
    )]
    FilesystemRoot(Root, PathBuf),
    #[error(
        "{0} is {1}, inside {2}: a kernel filesystem is no place for runner files; give a directory on a disk, e.g. /var/lib/runner-manager"
    )]
    KernelFilesystem(Root, PathBuf, &'static str),
    #[error(
        "--host-root and --slots-root are both {0}: give the slots their own directory, e.g. <host root>/slots"
    )]
    Same(PathBuf),
    #[error(
        "--host-root {host} is inside --slots-root {slots}: a slot scrub could remove the package cache; give roots that do not nest this way"
    )]
    HostInsideSlots { host: PathBuf, slots: PathBuf },
    #[error(
        "--slots-root {slots} is inside the host root's own `{dir}` directory ({host}/{dir}): a package reinstall or a runtime removal would take retained workspaces with it; use a directory of its own, e.g. {host}/slots"
    )]
    SlotsInsideHostDir {
        slots: PathBuf,
        host: PathBuf,
        dir: &'static str,
    },
    #[error("{0} {1} could not be resolved ({2:?})")]
    Unresolvable(Root, PathBuf, io::ErrorKind),
    #[error(
        "{0} {1} holds {2:?}: with --launcher systemd a runtime's path becomes a unit property, so roots may hold only letters, digits and `._/@+-`; choose such a path"
    )]
    UnitUnsafe(Root, PathBuf, char),
    #[error(
        "{0} {1} is inside {2}, which the systemd sandbox hides from runners (PrivateTmp, ProtectHome): a runner could not reach its runtime; use e.g. /var/lib/runner-manager"
    )]
    HiddenBySandbox(Root, PathBuf, &'static str),
}

/// Trees the systemd sandbox replaces or hides (`PrivateTmp=`, `ProtectHome=`).
const SANDBOX_HIDDEN: [&str; 5] = ["/tmp", "/var/tmp", "/home", "/root", "/run/user"];

/// For `--launcher systemd`, on top of [`check_roots`]: a runtime's path is a unit property
/// value (`ReadWritePaths=`, `WorkingDirectory=`), where white space separates values and
/// quotes, backslashes and `%` are interpreted, so only characters that need none of that are
/// allowed; and a runtime must be visible through the sandbox.
pub fn check_unit_safe(host: &Path, slots: &Path) -> Result<(), RootError> {
    for (root, path) in [(Root::Host, host), (Root::Slots, slots)] {
        let text = path.to_string_lossy();
        if let Some(c) = text
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || "._/@+-".contains(*c)))
        {
            return Err(RootError::UnitUnsafe(root, path.to_path_buf(), c));
        }
        let resolved = resolve(root, path)?;
        for candidate in [normal(path), resolved] {
            if let Some(tree) = SANDBOX_HIDDEN.iter().find(|t| candidate.starts_with(t)) {
                return Err(RootError::HiddenBySandbox(root, candidate, tree));
            }
        }
    }
    Ok(())
}

/// Checks both roots, as given and as they resolve: each with [`validate_root`], the pair with
/// [`check_lexical`] on the paths as given and on the canonical ones. Creates nothing.
pub fn check_roots(host: &Path, slots: &Path) -> Result<(), RootError> {
    check_lexical(host, slots)?;
    let resolved_host = validate_root(Root::Host, host)?;
    let resolved_slots = validate_root(Root::Slots, slots)?;
    check_lexical(&resolved_host, &resolved_slots)
}

/// The one validation of a root, used by the preflight and by every library function that takes
/// a root (`prepare_slot`, `scrub_slot`, the ephemeral runtimes' creation and removal), so no
/// caller can bypass it: the path as given must be absolute and hold no `..`; then it is
/// resolved once (its deepest existing ancestor canonicalized: links, `.` and a trailing `/.`
/// included) and the canonical path must not be the filesystem root or inside `/proc`, `/sys`,
/// `/dev`; and a slots root must not be a host root or inside a host root's own directories,
/// found on disk without being told the host root: a directory holding `packages/.archives`
/// is one (the cache makes it at start). Returns the canonical path. Creates nothing.
pub fn validate_root(root: Root, path: &Path) -> Result<PathBuf, RootError> {
    check_one(root, path)?;
    let canonical = resolve(root, path)?;
    check_one(root, &canonical)?;
    if root == Root::Slots {
        for host in canonical.ancestors().filter(|a| is_host_root(a)) {
            if host == canonical {
                return Err(RootError::Same(canonical));
            }
            if let Ok(below) = canonical.strip_prefix(host)
                && let Some(Component::Normal(first)) = below.components().next()
                && let Some(dir) = HOST_ROOT_DIRS.iter().find(|d| first == **d)
            {
                return Err(RootError::SlotsInsideHostDir {
                    slots: canonical.clone(),
                    host: host.to_path_buf(),
                    dir,
                });
            }
        }
    }
    Ok(canonical)
}

/// Whether `dir` is a host root: its package cache is there (`packages/.archives`, made by the
/// cache at start).
fn is_host_root(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir.join("packages").join(".archives")).is_ok_and(|m| m.is_dir())
}

/// The pure part: every rule on two absolute paths.
pub fn check_lexical(host: &Path, slots: &Path) -> Result<(), RootError> {
    for (root, path) in [(Root::Host, host), (Root::Slots, slots)] {
        check_one(root, path)?;
    }
    let (host, slots) = (normal(host), normal(slots));
    if host == slots {
        return Err(RootError::Same(host));
    }
    if host.starts_with(&slots) {
        return Err(RootError::HostInsideSlots { host, slots });
    }
    if let Ok(below) = slots.strip_prefix(&host)
        && let Some(Component::Normal(first)) = below.components().next()
        && let Some(dir) = HOST_ROOT_DIRS.iter().find(|d| first == **d)
    {
        return Err(RootError::SlotsInsideHostDir { slots, host, dir });
    }
    Ok(())
}

fn check_one(root: Root, path: &Path) -> Result<(), RootError> {
    if !path.is_absolute() {
        return Err(RootError::NotAbsolute(root, path.to_path_buf()));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(RootError::Climbs(root, path.to_path_buf()));
    }
    let path = normal(path);
    if path.parent().is_none() {
        return Err(RootError::FilesystemRoot(root, path));
    }
    if let Some(tree) = FORBIDDEN_TREES.iter().find(|t| path.starts_with(t)) {
        return Err(RootError::KernelFilesystem(root, path, tree));
    }
    Ok(())
}

/// The path without `.` components or a trailing slash.
fn normal(path: &Path) -> PathBuf {
    path.components()
        .filter(|c| *c != Component::CurDir)
        .collect()
}

/// Where `path` resolves: its deepest existing ancestor canonicalized, the missing rest
/// appended as given (the agent creates it later, as real directories).
fn resolve(root: Root, path: &Path) -> Result<PathBuf, RootError> {
    let path = normal(path);
    let mut missing = Vec::new();
    let mut at = path.as_path();
    loop {
        match std::fs::canonicalize(at) {
            Ok(real) => {
                let mut out = real;
                out.extend(missing.iter().rev());
                return Ok(out);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let (Some(parent), Some(name)) = (at.parent(), at.file_name()) else {
                    return Err(RootError::Unresolvable(root, path.clone(), e.kind()));
                };
                missing.push(name.to_os_string());
                at = parent;
            }
            Err(e) => return Err(RootError::Unresolvable(root, path.clone(), e.kind())),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn check(host: &str, slots: &str) -> Result<(), RootError> {
        check_lexical(Path::new(host), Path::new(slots))
    }

    #[test]
    fn the_defaults_and_separate_roots_pass() {
        check("/var/lib/runner-manager", "/var/lib/runner-manager/slots").unwrap();
        check("/var/lib/runner-manager", "/srv/slots").unwrap();
        check(
            "/var/lib/runner-manager/",
            "/var/lib/runner-manager/./slots/",
        )
        .unwrap();
    }

    #[test]
    fn unsafe_places_are_refused_naming_the_flag() {
        let e = check("relative/root", "/srv/slots").unwrap_err();
        assert!(matches!(e, RootError::NotAbsolute(Root::Host, _)));
        assert!(e.to_string().contains("--host-root"), "{e}");
        assert!(matches!(
            check("/var/lib/rm", "/"),
            Err(RootError::FilesystemRoot(Root::Slots, _))
        ));
        assert!(matches!(
            check("/var/lib/rm", "/srv/../etc"),
            Err(RootError::Climbs(Root::Slots, _))
        ));
        for kernel in [
            "/proc/self/cwd",
            "/sys/fs/cgroup",
            "/dev/shm/slots",
            "/proc",
        ] {
            let e = check(kernel, "/srv/slots").unwrap_err();
            assert!(
                matches!(e, RootError::KernelFilesystem(Root::Host, ..)),
                "{kernel}: {e}"
            );
        }
        // A prefix of the name is not the tree.
        check("/devices/rm", "/srv/slots").unwrap();
    }

    #[test]
    fn roots_that_nest_the_wrong_way_are_refused() {
        assert!(matches!(
            check("/srv/rm", "/srv/rm/"),
            Err(RootError::Same(_))
        ));
        assert!(matches!(
            check("/srv/slots/host", "/srv/slots"),
            Err(RootError::HostInsideSlots { .. })
        ));
        for dir in HOST_ROOT_DIRS {
            let slots = format!("/var/lib/rm/{dir}/slots");
            let e = check("/var/lib/rm", &slots).unwrap_err();
            assert!(
                matches!(e, RootError::SlotsInsideHostDir { dir: d, .. } if d == dir),
                "{slots}: {e}"
            );
            assert!(e.to_string().contains("/var/lib/rm/slots"), "the fix: {e}");
            assert!(check("/var/lib/rm", &format!("/var/lib/rm/{dir}")).is_err());
        }
        // Only the first component below the host root is the host's directory.
        check("/var/lib/rm", "/var/lib/rm/slots/packages").unwrap();
    }

    #[test]
    fn a_link_into_the_package_cache_is_judged_where_it_lands() {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("host");
        std::fs::create_dir_all(host.join("packages")).unwrap();
        std::os::unix::fs::symlink(host.join("packages"), dir.path().join("innocent")).unwrap();
        let slots = dir.path().join("innocent/slots");
        check_lexical(&host, &slots).unwrap();
        assert!(matches!(
            check_roots(&host, &slots),
            Err(RootError::SlotsInsideHostDir {
                dir: "packages",
                ..
            })
        ));
        assert!(!slots.exists(), "the preflight creates nothing");
    }

    #[test]
    fn systemd_roots_need_no_quoting_and_stay_visible_through_the_sandbox() {
        check_unit_safe(
            Path::new("/var/lib/runner-manager"),
            Path::new("/var/lib/runner-manager/slots"),
        )
        .unwrap();
        for bad in [
            "/var/lib/runner manager",
            "/var/lib/rm\nX",
            "/srv/%n",
            "/srv/\"x\"",
        ] {
            let e = check_unit_safe(Path::new(bad), Path::new("/srv/slots")).unwrap_err();
            assert!(
                matches!(e, RootError::UnitUnsafe(Root::Host, ..)),
                "{bad}: {e}"
            );
        }
        for hidden in ["/tmp/rm", "/var/tmp/rm", "/home/ci/rm", "/root/rm"] {
            let e = check_unit_safe(Path::new("/var/lib/rm"), Path::new(hidden)).unwrap_err();
            assert!(
                matches!(e, RootError::HiddenBySandbox(Root::Slots, ..)),
                "{hidden}: {e}"
            );
        }
    }

    #[test]
    fn a_link_to_proc_is_judged_where_it_lands() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/proc/self", dir.path().join("p")).unwrap();
        let e = check_roots(&dir.path().join("p/rm"), &dir.path().join("slots")).unwrap_err();
        assert!(
            matches!(e, RootError::KernelFilesystem(Root::Host, ..)),
            "{e}"
        );
    }
}
