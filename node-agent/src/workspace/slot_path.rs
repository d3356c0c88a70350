//! Where a persistent slot lives: `<slotsRoot>/<namespace>/<policy uid>/sN`, derived by the
//! agent from the attempt's snapshot. Tenants never name host paths.

use std::path::{Component, Path, PathBuf};

use runner_manager_crds::names::slot_dir;

/// The one entry a persistent slot keeps between jobs: the job workspace and checkout.
pub const WORK_DIR: &str = "_work";

/// Names whose survival means runner state or identity leaked into the next job. The second
/// verification pass `lstat`s each directly, and these are the only entry names a refusal may
/// print.
pub const SENSITIVE_SLOT_ENTRIES: [&str; 17] = [
    "bin",
    "externals",
    "run.sh",
    "run.cmd",
    "config.sh",
    "config.cmd",
    ".runner",
    ".credentials",
    ".credentials_rsaparams",
    ".env",
    ".path",
    "_diag",
    ".runner-process.json",
    ".runner-process.recovery.json",
    ".runner-process.unresolved",
    ".github-runner-id",
    ".terminate-registration-timeout",
];

/// Why a slot path could not be derived.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SlotPathError {
    #[error("the attempt's namespace is not a single path component")]
    Namespace,
    #[error("the attempt's policy uid is not a single path component")]
    PolicyUid,
    #[error("slot numbers start at 1")]
    SlotZero,
}

/// `s<N>`.
pub fn slot_name(slot: u32) -> String {
    format!("s{slot}")
}

/// A name that is exactly one normal path component, so joining it cannot climb or reset.
fn is_single_component(name: &str) -> bool {
    let mut components = Path::new(name).components();
    matches!(components.next(), Some(Component::Normal(c)) if c == name)
        && components.next().is_none()
}

/// `<slotsRoot>/<namespace>/<policy uid>`: the parent of a policy's slots on this node.
pub fn policy_slots_root(
    slots_root: &Path,
    namespace: &str,
    policy_uid: &str,
) -> Result<PathBuf, SlotPathError> {
    if !is_single_component(namespace) {
        return Err(SlotPathError::Namespace);
    }
    if !is_single_component(policy_uid) {
        return Err(SlotPathError::PolicyUid);
    }
    Ok(slots_root.join(namespace).join(policy_uid))
}

/// `<slotsRoot>/<namespace>/<policy uid>/s<N>`.
pub fn derive_slot_path(
    slots_root: &Path,
    namespace: &str,
    policy_uid: &str,
    slot: u32,
) -> Result<PathBuf, SlotPathError> {
    if slot == 0 {
        return Err(SlotPathError::SlotZero);
    }
    policy_slots_root(slots_root, namespace, policy_uid)?;
    Ok(slots_root.join(slot_dir(namespace, policy_uid, slot)))
}

/// `<slotsRoot>/<namespace>/<policy uid>/s<N>` directories (not following links), in the form
/// [`slot_name`] gives only: the one walk of the slots root (the orphan sweep, the Lease's free
/// slots, the account bindings restored at start).
pub fn slot_dirs(root: &Path) -> Vec<(String, String, u32, std::path::PathBuf)> {
    let dirs = |p: &Path| -> Vec<(String, std::path::PathBuf)> {
        std::fs::read_dir(p)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
            // `.seed` (package seeds) is no namespace.
            .filter(|(n, _)| !n.starts_with('.'))
            .collect()
    };
    let mut found = Vec::new();
    for (ns, ns_dir) in dirs(root) {
        for (policy, policy_dir) in dirs(&ns_dir) {
            for (slot, path) in dirs(&policy_dir) {
                if let Some(n) = slot
                    .strip_prefix('s')
                    .filter(|d| !d.starts_with('0'))
                    .and_then(|d| d.parse::<u32>().ok())
                {
                    found.push((ns.clone(), policy.clone(), n, path));
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_path_is_derived_from_the_snapshot_and_refuses_climbing_components() {
        let root = Path::new("/srv/slots");
        assert_eq!(
            derive_slot_path(root, "team", "uid-1", 3),
            Ok(PathBuf::from("/srv/slots/team/uid-1/s3"))
        );
        for (ns, uid, slot, refused) in [
            ("..", "uid-1", 1, SlotPathError::Namespace),
            ("team", "a/b", 1, SlotPathError::PolicyUid),
            ("team", "", 1, SlotPathError::PolicyUid),
            ("team", "uid", 0, SlotPathError::SlotZero),
        ] {
            assert_eq!(derive_slot_path(root, ns, uid, slot), Err(refused));
        }
    }

    #[test]
    fn the_sensitive_list_has_no_duplicates_and_never_holds_work() {
        let mut names = SENSITIVE_SLOT_ENTRIES.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SENSITIVE_SLOT_ENTRIES.len());
        assert!(!names.contains(&WORK_DIR));
    }

    #[test]
    fn slot_directories_are_found_by_their_derived_form_only() {
        let root = tempfile::tempdir().unwrap();
        for p in [
            "ns/p/s1",
            "ns/p/s2",
            "ns/p/s01",
            "ns/p/x",
            "ns/q/s3",
            ".seed/abc/s1",
        ] {
            std::fs::create_dir_all(root.path().join(p)).unwrap();
        }
        let mut found: Vec<(String, String, u32)> = slot_dirs(root.path())
            .into_iter()
            .map(|(a, b, n, _)| (a, b, n))
            .collect();
        found.sort();
        assert_eq!(
            found,
            vec![
                ("ns".into(), "p".into(), 1),
                ("ns".into(), "p".into(), 2),
                ("ns".into(), "q".into(), 3)
            ]
        );
    }
}
