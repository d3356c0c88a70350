//! The persistent scrub (DESIGN §4 rule 5): seven ordered checks. Any refusal quarantines the
//! slot and nothing after it is removed. Checks 1, 2 and the allow-list are pure
//! ([`super::scrub_plan`]); this file does the filesystem part, fd-relative from the moment the
//! slot is opened with `O_NOFOLLOW`, so nothing a job plants can redirect a removal.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use runner_manager_crds::attempt::WorkspacePlacement;
use rustix::fs::AtFlags;

use super::refusal::{Quarantine, SlotRefusal};
use super::remove::{
    ListedEntry, TreeMount, is_link_or_not_dir, list_entries, open_dir_nofollow, open_dir_on_tree,
};
use super::remove_parallel::{removal_threads, remove_entry_at_parallel};
use super::scrub_plan::{
    ScrubTarget, SlotOwner, check_journal, entries_to_remove, is_kept, residue,
};
use super::slot_path::SENSITIVE_SLOT_ENTRIES;
use crate::mounts::MountLeft;

/// A scrub that refused nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scrubbed {
    /// The slot does not exist: nothing to scrub.
    Absent,
    /// Everything but a real `_work` is gone; `removed` counts removed entries at every depth.
    Clean { removed: u64 },
}

/// Scrubs the journalled slot of an attempt. Needs only journal facts (the placement, the
/// attempt's namespace and snapshot policy uid) and the agent's slots root: no policy, and no
/// directory is scanned to decide ownership.
pub fn scrub_slot(
    placement: &WorkspacePlacement,
    slots_root: &Path,
    owner: SlotOwner<'_>,
) -> Result<Scrubbed, Quarantine> {
    // The one root validation (as the preflight's): a slots root that is or lies in a host
    // root's own directories, the filesystem root or a kernel filesystem is never scrubbed.
    crate::roots::validate_root(crate::roots::Root::Slots, slots_root)
        .map_err(|e| Quarantine::new(SlotRefusal::Containment, e.to_string()))?;
    // Checks 1 and 2.
    let target = check_journal(placement, slots_root, owner)?;
    // Check 3.
    if !check_containment(&target, owner)? {
        return Ok(Scrubbed::Absent);
    }
    // An overlay-materialized slot is unmounted before anything is opened in it: the checks
    // below then see the slot itself (the upper: `_work` and what the job wrote), never the
    // package, which is not theirs to remove. The path was just proven contained, and the
    // unmount does not follow a link standing at the slot.
    if let Err(e) = crate::packages::overlay::unmount(&target.slot) {
        return Err(Quarantine::new(
            SlotRefusal::Deletion,
            format!("{} could not be unmounted: {e}", target.slot.display()),
        ));
    }
    // Its workdir (overlay's scratch, beside the slot) goes too; the next mount makes a new one.
    if let Err(e) = crate::packages::overlay::remove_work_dir(&target.slot) {
        return Err(Quarantine::new(
            SlotRefusal::Deletion,
            format!(
                "the overlay workdir of {} could not be removed ({:?})",
                target.slot.display(),
                e.kind()
            ),
        ));
    }
    // Check 4.
    let slot = match std::fs::symlink_metadata(&target.slot) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Scrubbed::Absent),
        Err(e) => return Err(enumeration(&target.slot, e.kind())),
        Ok(meta) if !meta.file_type().is_dir() => return Err(not_a_directory(&target.slot)),
        Ok(_) => match open_slot(&target) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Scrubbed::Absent),
            Err(e) if is_link_or_not_dir(&e) => return Err(not_a_directory(&target.slot)),
            Err(e) if MountLeft::of(&e).is_some() => {
                return Err(Quarantine::new(
                    SlotRefusal::Deletion,
                    format!(
                        "{} could not be opened on its own volume: {e}",
                        target.slot.display()
                    ),
                ));
            }
            Err(e) => return Err(enumeration(&target.slot, e.kind())),
        },
    };
    // Check 5.
    let entries = list_entries(slot.as_fd()).map_err(|e| enumeration(&target.slot, e.kind()))?;
    // Check 6.
    let doomed = entries_to_remove(&entries)?;
    let removed = remove_listed(slot.as_fd(), &doomed, &target.slot)?;
    // Check 7.
    verify(slot.as_fd(), &target.slot)?;
    Ok(Scrubbed::Clean { removed })
}

/// The slot's own directory, opened from its policy root's descriptor: a mount stacked on the
/// slot itself (not the agent's overlay, unmounted above) is detached exactly first, so the
/// scrub never lists, and so never removes, what another mount shows there.
fn open_slot(target: &ScrubTarget) -> io::Result<std::os::fd::OwnedFd> {
    let parent = open_dir_nofollow(&target.policy_root)?;
    let name = target.slot.file_name().unwrap_or_default();
    let name = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(name))
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a name holds a NUL byte"))?;
    let mut detached = 0;
    open_dir_on_tree(
        parent.as_fd(),
        &name,
        &mut TreeMount::default(),
        &mut detached,
    )
}

/// Check 3: the slots root, the policy root and the slot resolve where the agent derives them.
/// Returns `false` when the policy root does not exist (so neither does the slot).
fn check_containment(target: &ScrubTarget, owner: SlotOwner<'_>) -> Result<bool, Quarantine> {
    let escapes = |detail: String| Quarantine::new(SlotRefusal::Containment, detail);
    let root = std::fs::canonicalize(&target.slots_root).map_err(|e| {
        escapes(format!(
            "the slots root {} could not be resolved ({:?})",
            target.slots_root.display(),
            e.kind()
        ))
    })?;
    let expected_policy_root = root.join(owner.namespace).join(owner.policy_uid);
    match std::fs::canonicalize(&target.policy_root) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => {
            return Err(escapes(format!(
                "{} could not be resolved ({:?})",
                target.policy_root.display(),
                e.kind()
            )));
        }
        Ok(resolved) if resolved != expected_policy_root => {
            return Err(escapes(format!(
                "{} resolves outside the slots root",
                target.policy_root.display()
            )));
        }
        Ok(_) => {}
    }
    // A slot that is a link to somewhere inside the root passes here and is refused by check 4;
    // a dangling link is refused by check 4 too.
    match std::fs::canonicalize(&target.slot) {
        Ok(resolved) if !resolved.starts_with(&expected_policy_root) => Err(escapes(format!(
            "{} resolves outside its policy's root; the link was left in place",
            target.slot.display()
        ))),
        _ => Ok(true),
    }
}

/// Check 6's removals, in listing order, one entry at a time (each large one on several
/// threads). The first failure stops the scrub: nothing after it is removed. An entry that
/// vanished since it was listed counts as removed.
pub(crate) fn remove_listed(
    slot: BorrowedFd<'_>,
    doomed: &[&ListedEntry],
    slot_path: &Path,
) -> Result<u64, Quarantine> {
    let mut removed = 0;
    let threads = removal_threads();
    for (done, entry) in doomed.iter().enumerate() {
        match remove_entry_at_parallel(slot, &entry.name, entry.kind, threads) {
            Ok(r) => removed += r.entries,
            Err(e) => {
                let which = sensitive_name(entry)
                    .map(|n| format!("`{n}`"))
                    .unwrap_or_else(|| "an entry".to_owned());
                let mount = MountLeft::of(&e).map_or_else(String::new, |m| format!(": {m}"));
                return Err(Quarantine::new(
                    SlotRefusal::Deletion,
                    format!(
                        "{which} of {} could not be removed ({:?}{mount}); {done} of {} entries were removed before it and nothing after it",
                        slot_path.display(),
                        e.kind(),
                        doomed.len()
                    ),
                ));
            }
        }
    }
    Ok(removed)
}

/// Check 7, two independent passes: a fresh listing counting everything but a real `_work`, and
/// a direct `lstat` of every sensitive name (which does not trust the listing).
fn verify(slot: BorrowedFd<'_>, slot_path: &Path) -> Result<(), Quarantine> {
    let listing = list_entries(slot).map_err(|e| enumeration(slot_path, e.kind()))?;
    let listed = listing.iter().filter(|e| !is_kept(e)).count();
    let mut named: Vec<&'static str> = SENSITIVE_SLOT_ENTRIES
        .iter()
        .copied()
        .filter(|name| {
            // Anything but "not there" fails closed: absence is what must be proven.
            !matches!(
                rustix::fs::statat(slot, *name, AtFlags::SYMLINK_NOFOLLOW),
                Err(rustix::io::Errno::NOENT)
            )
        })
        .collect();
    // A handoff's name carries a fresh uuid, so it cannot be asked for by name: the listing's
    // survivors are matched by its form and named by prefix only.
    if listing.iter().any(is_handoff) {
        named.push(HANDOFF_SURVIVOR);
    }
    residue(slot_path, listed, &named).map_or(Ok(()), Err)
}

/// How a surviving JIT handoff file is named in a refusal: by its prefix, never its uuid.
pub const HANDOFF_SURVIVOR: &str = "jit-*.tmp";

fn is_handoff(entry: &ListedEntry) -> bool {
    use std::os::unix::ffi::OsStrExt;
    crate::handoff::is_handoff_name(std::ffi::OsStr::from_bytes(entry.name.to_bytes()))
}

fn sensitive_name(entry: &ListedEntry) -> Option<&'static str> {
    SENSITIVE_SLOT_ENTRIES
        .iter()
        .copied()
        .find(|n| n.as_bytes() == entry.name.to_bytes())
        .or_else(|| is_handoff(entry).then_some(HANDOFF_SURVIVOR))
}

fn not_a_directory(slot: &Path) -> Quarantine {
    Quarantine::new(
        SlotRefusal::SlotNotADirectory,
        format!(
            "{} is a link or a file, not a directory; it was left in place",
            slot.display()
        ),
    )
}

fn enumeration(slot: &Path, kind: io::ErrorKind) -> Quarantine {
    Quarantine::new(
        SlotRefusal::Enumeration,
        format!("{} could not be listed ({kind:?})", slot.display()),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::fs;

    use super::*;

    #[test]
    fn an_entry_that_vanishes_between_listing_and_removal_counts_as_removed() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("tmp/deep")).unwrap();
        fs::write(dir.path().join("run.sh"), b"#!/bin/sh").unwrap();
        fs::create_dir(dir.path().join("_work")).unwrap();
        let fd = open_dir_nofollow(dir.path()).unwrap();
        let entries = list_entries(fd.as_fd()).unwrap();
        let doomed = entries_to_remove(&entries).unwrap();
        assert_eq!(doomed.len(), 2);
        // Between the listing and the removal, something else removes both entries.
        fs::remove_dir_all(dir.path().join("tmp")).unwrap();
        fs::remove_file(dir.path().join("run.sh")).unwrap();
        assert_eq!(remove_listed(fd.as_fd(), &doomed, dir.path()), Ok(0));
        verify(fd.as_fd(), dir.path()).unwrap();
    }

    #[test]
    fn verification_asks_the_filesystem_rather_than_the_listing_that_missed_an_entry() {
        let dir = tempfile::tempdir().unwrap();
        let fd = open_dir_nofollow(dir.path()).unwrap();
        verify(fd.as_fd(), dir.path()).unwrap();
        // Created after the scrub's listing: the second pass must see it by name.
        fs::write(dir.path().join(".credentials"), b"x").unwrap();
        let q = verify(fd.as_fd(), dir.path()).unwrap_err();
        assert_eq!(q.refusal, SlotRefusal::Residue);
        assert!(q.detail.contains("`.credentials`"), "{}", q.detail);
    }

    #[test]
    fn a_surviving_handoff_is_named_by_its_prefix_only() {
        let dir = tempfile::tempdir().unwrap();
        let fd = open_dir_nofollow(dir.path()).unwrap();
        let id = "6f1c2a7e-0d1b-4c55-9f3e-2b8a1c0d9e7f";
        fs::write(dir.path().join(format!("jit-{id}.tmp")), b"spent").unwrap();
        fs::write(dir.path().join("workflow-chosen-name"), b"x").unwrap();
        let q = verify(fd.as_fd(), dir.path()).unwrap_err();
        assert_eq!(q.refusal, SlotRefusal::Residue);
        assert!(
            q.detail
                .starts_with("2 entries other than `_work` survived"),
            "{}",
            q.detail
        );
        assert!(q.detail.contains("`jit-*.tmp`"), "{}", q.detail);
        assert!(!q.detail.contains(id), "{}", q.detail);
        assert!(!q.detail.contains("workflow-chosen-name"), "{}", q.detail);
    }
}
