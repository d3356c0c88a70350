//! The pure parts of the persistent scrub: checks 1 and 2 (journalled slot, policy agreement),
//! the allow-list of check 6, and the wording of a residue refusal (check 7). No I/O here, so
//! the order and the redaction are tested without a filesystem.

use std::path::{Component, Path, PathBuf};

use runner_manager_crds::attempt::WorkspacePlacement;
use runner_manager_crds::policy::WorkspaceMode;

use super::refusal::{Quarantine, SlotRefusal};
use super::remove::{EntryKind, ListedEntry};
use super::slot_path::{WORK_DIR, policy_slots_root, slot_name};

/// A slot that passed the journal checks: every path here is derived by the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScrubTarget {
    /// The admin-configured slots root.
    pub slots_root: PathBuf,
    /// `<slotsRoot>/<namespace>/<policy uid>`.
    pub policy_root: PathBuf,
    /// `<policy root>/s<N>`.
    pub slot: PathBuf,
}

/// Whose slot this is, from the attempt's own object (namespace and snapshot policy uid), so a
/// deleted policy still cleans and a recreated one (new uid) is not confused with the old.
#[derive(Clone, Copy, Debug)]
pub struct SlotOwner<'a> {
    pub namespace: &'a str,
    pub policy_uid: &'a str,
}

/// Checks 1 and 2, in that order.
///
/// 1. The journalled runtime path is `<its parent>/s<journalled N>`: absolute, no `.`/`..`, and
///    its last component is exactly `s<N>` (so `s01`, `s1/nested`, `not-a-slot` and `s1`
///    journalled as slot 2 all refuse).
/// 2. Its parent is the root the agent derives for the attempt's policy.
pub fn check_journal(
    placement: &WorkspacePlacement,
    slots_root: &Path,
    owner: SlotOwner<'_>,
) -> Result<ScrubTarget, Quarantine> {
    let not_journalled = |detail: &str| Quarantine::new(SlotRefusal::NotTheJournalledSlot, detail);
    let (WorkspaceMode::Persistent, Some(slot)) = (placement.kind(), placement.slot_number())
    else {
        return Err(not_journalled("the attempt journals no persistent slot"));
    };
    let runtime = Path::new(placement.runtime_path());
    let plain = runtime.is_absolute()
        && runtime
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    let expected_name = slot_name(slot);
    let parent = runtime.parent().filter(|_| plain);
    let Some(parent) = parent.filter(|p| p.join(&expected_name) == runtime) else {
        return Err(not_journalled(&format!(
            "the journalled runtime path is not `{expected_name}` of its parent"
        )));
    };
    let policy_root = policy_slots_root(slots_root, owner.namespace, owner.policy_uid)
        .map_err(|e| Quarantine::new(SlotRefusal::PolicyRootDisagrees, e.to_string()))?;
    if parent != policy_root {
        return Err(Quarantine::new(
            SlotRefusal::PolicyRootDisagrees,
            format!(
                "the journalled `{expected_name}` is not under {}, the root derived for the attempt's policy",
                policy_root.display()
            ),
        ));
    }
    Ok(ScrubTarget {
        slots_root: slots_root.to_path_buf(),
        slot: policy_root.join(&expected_name),
        policy_root,
    })
}

/// Check 6's allow-list: a real `_work` directory is kept, everything else is removed. A `_work`
/// that is anything but a real directory stops the whole scrub before anything is removed.
pub fn entries_to_remove(entries: &[ListedEntry]) -> Result<Vec<&ListedEntry>, Quarantine> {
    if let Some(work) = entries
        .iter()
        .find(|e| e.name.to_bytes() == WORK_DIR.as_bytes() && e.kind != EntryKind::Directory)
    {
        let shape = match work.kind {
            EntryKind::Symlink => "a link",
            EntryKind::File => "a file",
            EntryKind::Special | EntryKind::Directory => "a special file",
        };
        return Err(Quarantine::new(
            SlotRefusal::WorkNotADirectory,
            format!("the retained `{WORK_DIR}` is {shape}; nothing was removed"),
        ));
    }
    Ok(entries.iter().filter(|e| !is_kept(e)).collect())
}

/// Whether an entry is the one the slot retains.
pub fn is_kept(entry: &ListedEntry) -> bool {
    entry.name.to_bytes() == WORK_DIR.as_bytes() && entry.kind == EntryKind::Directory
}

/// Check 7's verdict from its two independent passes: how many entries other than a real
/// `_work` the re-listing counted, and which sensitive names a direct `lstat` found. Names from
/// the listing are counted, never echoed.
pub fn residue(slot: &Path, listed: usize, named: &[&'static str]) -> Option<Quarantine> {
    if listed == 0 && named.is_empty() {
        return None;
    }
    let names = named
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let detail = if listed == 0 {
        // The listing under-reported: say so rather than state a count the filesystem
        // contradicts.
        format!(
            "the listing reported nothing but `{WORK_DIR}`, yet {names} survived cleanup of {}",
            slot.display()
        )
    } else {
        let entries = if listed == 1 { "entry" } else { "entries" };
        let including = if named.is_empty() {
            String::new()
        } else {
            format!(", including {names}")
        };
        format!(
            "{listed} {entries} other than `{WORK_DIR}` survived cleanup of {}{including}",
            slot.display()
        )
    };
    Some(Quarantine::new(SlotRefusal::Residue, detail))
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;

    use super::*;

    const ROOT: &str = "/srv/slots";
    const OWNER: SlotOwner<'static> = SlotOwner {
        namespace: "team",
        policy_uid: "uid-1",
    };

    fn slot(n: u32, path: &str) -> WorkspacePlacement {
        WorkspacePlacement::slot(n, path).expect("slot numbers from 1")
    }

    fn entry(name: &str, kind: EntryKind) -> ListedEntry {
        ListedEntry {
            name: CString::new(name).expect("no NUL"),
            kind,
        }
    }

    #[test]
    fn the_journalled_slot_must_be_s_n_of_its_parent() {
        let ok = check_journal(&slot(1, "/srv/slots/team/uid-1/s1"), Path::new(ROOT), OWNER);
        assert_eq!(
            ok.map(|t| t.slot),
            Ok(PathBuf::from("/srv/slots/team/uid-1/s1"))
        );
        for (n, path) in [
            (2, "/srv/slots/team/uid-1/s1"),
            (1, "/srv/slots/team/uid-1/s1/nested"),
            (1, "/srv/slots/team/uid-1/not-a-slot"),
            (1, "/srv/slots/team/uid-1/s01"),
            (1, "/srv/slots/team/uid-1/../uid-1/s1"),
            (1, "srv/slots/team/uid-1/s1"),
        ] {
            let refusal = check_journal(&slot(n, path), Path::new(ROOT), OWNER).map(|_| ());
            assert_eq!(
                refusal.map_err(|q| q.refusal),
                Err(SlotRefusal::NotTheJournalledSlot),
                "{n} {path}"
            );
        }
        let ephemeral = WorkspacePlacement::ephemeral("/var/lib/runner-manager/runners/abc");
        assert_eq!(
            check_journal(&ephemeral, Path::new(ROOT), OWNER).map_err(|q| q.refusal),
            Err(SlotRefusal::NotTheJournalledSlot)
        );
    }

    #[test]
    fn check_one_runs_before_check_two() {
        // Wrong parent *and* wrong name: the journalled-slot check must be the one that answers.
        let refusal = check_journal(&slot(2, "/elsewhere/s1"), Path::new(ROOT), OWNER);
        assert_eq!(
            refusal.map_err(|q| q.refusal),
            Err(SlotRefusal::NotTheJournalledSlot)
        );
    }

    #[test]
    fn a_slot_under_another_policy_root_disagrees() {
        for path in [
            "/srv/slots/team/uid-2/s1",
            "/srv/slots/other/uid-1/s1",
            "/tmp/s1",
        ] {
            let refusal = check_journal(&slot(1, path), Path::new(ROOT), OWNER);
            assert_eq!(
                refusal.map_err(|q| q.refusal),
                Err(SlotRefusal::PolicyRootDisagrees),
                "{path}"
            );
        }
    }

    #[test]
    fn a_work_that_is_not_a_directory_stops_the_scrub_before_any_removal() {
        for kind in [EntryKind::Symlink, EntryKind::File, EntryKind::Special] {
            let entries = [entry("bin", EntryKind::Directory), entry("_work", kind)];
            let refusal = entries_to_remove(&entries).map(|_| ());
            assert_eq!(
                refusal.map_err(|q| q.refusal),
                Err(SlotRefusal::WorkNotADirectory)
            );
        }
    }

    #[test]
    fn the_allow_list_keeps_exactly_one_real_work_directory() {
        let entries = [
            entry("_work", EntryKind::Directory),
            entry("_work2", EntryKind::Directory),
            entry("_Work", EntryKind::Directory),
            entry("bin", EntryKind::Symlink),
            entry("tmp", EntryKind::Directory),
            entry(".credentials", EntryKind::File),
        ];
        let removed: Vec<_> = entries_to_remove(&entries)
            .expect("no refusal")
            .into_iter()
            .map(|e| e.name.to_str().expect("utf-8").to_owned())
            .collect();
        assert_eq!(removed, ["_work2", "_Work", "bin", "tmp", ".credentials"]);
    }

    #[test]
    fn a_residue_refusal_counts_and_names_only_sensitive_entries() {
        let slot = Path::new("/srv/slots/team/uid/s1");
        assert_eq!(residue(slot, 0, &[]), None);
        let one = residue(slot, 1, &[]).expect("refusal");
        assert_eq!(one.refusal, SlotRefusal::Residue);
        assert!(
            one.detail
                .starts_with("1 entry other than `_work` survived")
        );
        let two = residue(slot, 2, &["bin", ".credentials"]).expect("refusal");
        assert!(two.detail.ends_with("s1, including `bin`, `.credentials`"));
    }

    #[test]
    fn a_residue_refusal_never_reports_the_under_count_as_the_fact() {
        let slot = Path::new("/srv/slots/team/uid/s1");
        let q = residue(slot, 0, &[".credentials"]).expect("refusal");
        assert!(
            q.detail
                .contains("reported nothing but `_work`, yet `.credentials` survived")
        );
        assert!(!q.detail.contains('0'), "{}", q.detail);
    }
}
