//! Workspaces against hostile directories: real trees in temporary directories, no mocks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::Duration;

use runner_manager_crds::attempt::WorkspacePlacement;
use runner_manager_node_agent::workspace::ephemeral::{
    EphemeralError, EphemeralRemoval, create_ephemeral_runtime, ephemeral_runtime_path,
    remove_ephemeral_runtime,
};
use runner_manager_node_agent::workspace::prepare::{SlotPrepareError, prepare_slot};
use runner_manager_node_agent::workspace::scrub::{Scrubbed, scrub_slot};
use runner_manager_node_agent::workspace::scrub_plan::SlotOwner;
use runner_manager_node_agent::workspace::{Quarantine, SlotRefusal};
use uuid::Uuid;

use crate::workspace_support::{Immutable, assert_file, bounded, make_fifo, names, write_file};

/// How long a removal of these small trees may take before it counts as blocked on a FIFO.
const BOUND: Duration = Duration::from_secs(20);

const NS: &str = "team";
const UID: &str = "0f3c5d1e-uid";
const SECRET: &str = "ghp_DO_NOT_LEAK_this_token";
const OWNER: SlotOwner<'static> = SlotOwner {
    namespace: NS,
    policy_uid: UID,
};

struct Host {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Host {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        fs::create_dir_all(root.join("slots")).unwrap();
        fs::create_dir_all(root.join("outside")).unwrap();
        fs::write(root.join("outside/keep.txt"), b"operator data").unwrap();
        Self { _dir: dir, root }
    }
    fn slots(&self) -> PathBuf {
        self.root.join("slots")
    }
    fn slot(&self, n: u32) -> PathBuf {
        self.slots().join(NS).join(UID).join(format!("s{n}"))
    }
    fn outside(&self) -> PathBuf {
        self.root.join("outside")
    }
    fn outside_intact(&self) {
        assert_eq!(
            fs::read(self.outside().join("keep.txt")).unwrap(),
            b"operator data"
        );
    }
    fn placement(&self, n: u32) -> WorkspacePlacement {
        WorkspacePlacement::slot(n, self.slot(n).to_str().unwrap()).unwrap()
    }
    /// A slot as a finished job leaves it: runner package, runner state, a checkout.
    fn used_slot(&self, n: u32) -> PathBuf {
        let slot = prepare_slot(&self.slots(), NS, UID, n).unwrap().path;
        for dir in ["bin", "externals/node20/bin", "_diag", "tmp", "_work/repo"] {
            fs::create_dir_all(slot.join(dir)).unwrap();
        }
        for file in [
            "bin/Runner.Listener",
            "externals/node20/bin/node",
            "run.sh",
            ".runner",
            ".credentials",
            ".github-runner-id",
            ".runner-process.json",
            "_diag/Worker_1.log",
        ] {
            fs::write(slot.join(file), b"x").unwrap();
        }
        fs::write(slot.join("_work/repo/checkout.txt"), b"retained").unwrap();
        slot
    }
    /// Replace the directory `path` of `slot` with a link out to the outside directory.
    fn link_out(&self, slot: &Path, path: &str) {
        fs::remove_dir_all(slot.join(path)).unwrap();
        symlink(self.outside(), slot.join(path)).unwrap();
    }

    fn scrub(&self, n: u32) -> Result<Scrubbed, Quarantine> {
        scrub_slot(&self.placement(n), &self.slots(), OWNER)
    }
}

/// Whether `path` itself is a symbolic link (not what it points to).
fn is_link(path: impl AsRef<Path>) -> bool {
    fs::symlink_metadata(path).unwrap().file_type().is_symlink()
}

fn assert_never_echoes(text: &str) {
    assert!(
        !text.contains(SECRET),
        "a workflow-chosen name leaked: {text}"
    );
    assert!(
        !text.contains("ghp_"),
        "a workflow-chosen name leaked: {text}"
    );
}

// ---- persistent slots: the happy path ------------------------------------------------------

#[test]
fn a_scrub_retains_one_real_work_directory_and_removes_every_other_entry() {
    let host = Host::new();
    let slot = host.used_slot(1);
    make_fifo(&slot.join("tmp/clr-debug-pipe-runner-in"));
    let scrubbed = bounded(BOUND, {
        let placement = host.placement(1);
        let slots = host.slots();
        move || scrub_slot(&placement, &slots, OWNER)
    });
    assert!(matches!(scrubbed, Ok(Scrubbed::Clean { removed }) if removed >= 12));
    assert_eq!(names(&slot), ["_work"]);
    assert_file(&slot, "_work/repo/checkout.txt", b"retained");
    // The next attempt may reuse it, warm.
    let again = prepare_slot(&host.slots(), NS, UID, 1).unwrap();
    assert!(again.retained_work);
}

#[test]
fn a_slot_that_is_gone_is_not_a_refusal() {
    let host = Host::new();
    assert_eq!(host.scrub(1), Ok(Scrubbed::Absent));
    fs::create_dir_all(host.slots().join(NS).join(UID)).unwrap();
    assert_eq!(host.scrub(1), Ok(Scrubbed::Absent));
}

#[test]
fn a_read_only_subdirectory_is_removed() {
    let host = Host::new();
    let slot = host.used_slot(1);
    write_file(&slot, "externals/locked/inner/f", b"x");
    read_only(&slot.join("externals/locked/inner"));
    read_only(&slot.join("externals/locked"));
    assert!(matches!(host.scrub(1), Ok(Scrubbed::Clean { .. })));
    assert_eq!(names(&slot), ["_work"]);
}

#[test]
fn a_symlink_planted_where_bin_was_is_unlinked_and_its_target_survives() {
    let host = Host::new();
    let slot = host.used_slot(1);
    host.link_out(&slot, "bin");
    // And a link inside a directory, pointing out.
    symlink(host.outside(), slot.join("externals/escape")).unwrap();
    assert!(matches!(host.scrub(1), Ok(Scrubbed::Clean { .. })));
    assert_eq!(names(&slot), ["_work"]);
    host.outside_intact();
}

// ---- persistent slots: the seven checks refuse ---------------------------------------------

#[test]
fn a_symlinked_work_quarantines_the_slot_and_removes_nothing() {
    let host = Host::new();
    let slot = host.used_slot(1);
    host.link_out(&slot, "_work");
    let before = names(&slot);
    let q = host.scrub(1).unwrap_err();
    assert_eq!(q.refusal, SlotRefusal::WorkNotADirectory);
    assert!(q.to_string().contains("keeps its slot lease"));
    assert_eq!(names(&slot), before, "nothing removed after the refusal");
    assert!(is_link(slot.join("_work")));
    host.outside_intact();
}

#[test]
fn a_work_that_is_a_file_quarantines_the_slot() {
    let host = Host::new();
    let slot = host.used_slot(1);
    fs::remove_dir_all(slot.join("_work")).unwrap();
    fs::write(slot.join("_work"), b"not a dir").unwrap();
    assert_eq!(
        host.scrub(1).unwrap_err().refusal,
        SlotRefusal::WorkNotADirectory
    );
    assert!(slot.join("bin/Runner.Listener").exists());
}

#[test]
fn a_slot_replaced_by_a_link_out_of_its_root_is_refused_before_anything_is_read() {
    let host = Host::new();
    let slot = host.used_slot(1);
    fs::remove_dir_all(&slot).unwrap();
    fs::create_dir(host.outside().join("bin")).unwrap();
    symlink(host.outside(), &slot).unwrap();
    let q = host.scrub(1).unwrap_err();
    assert_eq!(q.refusal, SlotRefusal::Containment);
    assert!(is_link(&slot), "link left in place");
    assert!(host.outside().join("bin").is_dir());
    host.outside_intact();
}

#[test]
fn a_slot_replaced_by_a_link_inside_its_root_is_not_a_directory() {
    let host = Host::new();
    let s2 = host.used_slot(2);
    let s1 = host.slot(1);
    symlink(&s2, &s1).unwrap();
    assert_eq!(
        host.scrub(1).unwrap_err().refusal,
        SlotRefusal::SlotNotADirectory
    );
    assert!(
        s2.join("bin/Runner.Listener").exists(),
        "the other slot is untouched"
    );
}

#[test]
fn a_slot_that_is_a_file_is_refused_and_left_intact() {
    let host = Host::new();
    let slot = host.used_slot(1);
    fs::remove_dir_all(&slot).unwrap();
    fs::write(&slot, b"operator file").unwrap();
    assert_eq!(
        host.scrub(1).unwrap_err().refusal,
        SlotRefusal::SlotNotADirectory
    );
    assert_eq!(fs::read(&slot).unwrap(), b"operator file");
}

#[test]
fn a_policy_root_replaced_by_a_link_escapes() {
    let host = Host::new();
    fs::create_dir_all(host.slots().join(NS)).unwrap();
    fs::create_dir_all(host.outside().join("s1/bin")).unwrap();
    symlink(host.outside(), host.slots().join(NS).join(UID)).unwrap();
    assert_eq!(host.scrub(1).unwrap_err().refusal, SlotRefusal::Containment);
    assert!(host.outside().join("s1/bin").is_dir());
}

#[test]
fn a_runtime_path_that_is_not_the_journalled_slot_is_refused_and_nothing_is_touched() {
    let host = Host::new();
    let s1 = host.used_slot(1);
    // Journalled as slot 2, path of s1.
    let placement = WorkspacePlacement::slot(2, s1.to_str().unwrap()).unwrap();
    let q = scrub_slot(&placement, &host.slots(), OWNER).unwrap_err();
    assert_eq!(q.refusal, SlotRefusal::NotTheJournalledSlot);
    let nested = WorkspacePlacement::slot(1, s1.join("bin").to_str().unwrap()).unwrap();
    let q = scrub_slot(&nested, &host.slots(), OWNER).unwrap_err();
    assert_eq!(q.refusal, SlotRefusal::NotTheJournalledSlot);
    assert!(s1.join("bin/Runner.Listener").exists());
    assert!(s1.join(".credentials").exists());
}

#[test]
fn a_runtime_path_that_is_not_the_derived_slot_of_the_attempts_policy_is_refused() {
    let host = Host::new();
    // A real slot of another policy, journalled on this attempt.
    let other = prepare_slot(&host.slots(), NS, "other-uid", 1)
        .unwrap()
        .path;
    fs::create_dir(other.join("bin")).unwrap();
    let placement = WorkspacePlacement::slot(1, other.to_str().unwrap()).unwrap();
    let q = scrub_slot(&placement, &host.slots(), OWNER).unwrap_err();
    assert_eq!(q.refusal, SlotRefusal::PolicyRootDisagrees);
    assert!(other.join("bin").is_dir());
    // And a directory outside the slots root altogether.
    let stray = host.outside().join("s1");
    fs::create_dir(&stray).unwrap();
    let placement = WorkspacePlacement::slot(1, stray.to_str().unwrap()).unwrap();
    let q = scrub_slot(&placement, &host.slots(), OWNER).unwrap_err();
    assert_eq!(q.refusal, SlotRefusal::PolicyRootDisagrees);
    assert!(stray.is_dir());
}

#[test]
fn an_unremovable_entry_quarantines_as_deletion_and_nothing_after_it_is_removed() {
    let host = Host::new();
    let slot = host.used_slot(1);
    fs::write(slot.join(SECRET), b"secret").unwrap();
    let _guard = Immutable::set(&slot.join(SECRET));
    // The scrub removes in listing order; an unchanged directory lists in the same order.
    let order: Vec<String> = fs::read_dir(&slot)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "_work")
        .collect();
    let at = order.iter().position(|n| n == SECRET).unwrap();
    let q = host.scrub(1).unwrap_err();
    assert_eq!(q.refusal, SlotRefusal::Deletion);
    assert!(q.detail.contains("could not be removed"), "{}", q.detail);
    let mut left: Vec<String> = names(&slot).into_iter().filter(|n| n != "_work").collect();
    let mut expected = order[at..].to_vec();
    left.sort();
    expected.sort();
    assert_eq!(
        left, expected,
        "entries listed before it removed, none after it"
    );
    for text in [q.to_string(), format!("{q:?}"), q.detail.clone()] {
        assert_never_echoes(&text);
    }
    // The obstruction released, the same scrub succeeds and keeps the checkout.
    drop(_guard);
    assert!(matches!(host.scrub(1), Ok(Scrubbed::Clean { .. })));
    assert_eq!(names(&slot), ["_work"]);
    assert!(slot.join("_work/repo/checkout.txt").exists());
}

// ---- create-or-validate --------------------------------------------------------------------

#[test]
fn a_slot_is_reusable_only_when_empty_or_holding_one_real_work_directory() {
    let host = Host::new();
    let fresh = prepare_slot(&host.slots(), NS, UID, 1).unwrap();
    assert_eq!(fresh.path, host.slot(1));
    assert!(!fresh.retained_work);
    fs::create_dir(fresh.path.join("_work")).unwrap();
    assert!(
        prepare_slot(&host.slots(), NS, UID, 1)
            .unwrap()
            .retained_work
    );
    fs::create_dir(fresh.path.join("bin")).unwrap();
    fs::write(fresh.path.join(".github-runner-id"), b"7").unwrap();
    fs::write(fresh.path.join(SECRET), b"x").unwrap();
    let err = prepare_slot(&host.slots(), NS, UID, 1).unwrap_err();
    assert!(
        matches!(err, SlotPrepareError::NotReusable { others: 3, .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("3 entries")
            && text.contains("`bin`")
            && text.contains("`.github-runner-id`")
    );
    assert_never_echoes(&text);
    assert_never_echoes(&format!("{err:?}"));
    assert!(
        fresh.path.join("bin").is_dir(),
        "validation removes nothing"
    );
}

#[test]
fn a_link_shaped_work_directory_is_refused_rather_than_followed() {
    let host = Host::new();
    let slot = prepare_slot(&host.slots(), NS, UID, 1).unwrap().path;
    symlink(host.outside(), slot.join("_work")).unwrap();
    let err = prepare_slot(&host.slots(), NS, UID, 1).unwrap_err();
    assert!(
        matches!(err, SlotPrepareError::NotReusable { others: 1, .. }),
        "{err:?}"
    );
    fs::remove_file(slot.join("_work")).unwrap();
    fs::write(slot.join("_work"), b"").unwrap();
    assert!(matches!(
        prepare_slot(&host.slots(), NS, UID, 1),
        Err(SlotPrepareError::NotReusable { others: 1, .. })
    ));
    host.outside_intact();
}

#[test]
fn a_slot_standing_where_a_file_or_link_is_refuses_rather_than_replacing_it() {
    let host = Host::new();
    fs::create_dir_all(host.slots().join(NS).join(UID)).unwrap();
    fs::write(host.slot(1), b"operator file").unwrap();
    assert!(matches!(
        prepare_slot(&host.slots(), NS, UID, 1),
        Err(SlotPrepareError::NotADirectory { .. })
    ));
    assert_eq!(fs::read(host.slot(1)).unwrap(), b"operator file");
    symlink(host.outside(), host.slot(2)).unwrap();
    assert!(matches!(
        prepare_slot(&host.slots(), NS, UID, 2),
        Err(SlotPrepareError::Link { .. })
    ));
    // A link planted as the policy root is refused too.
    symlink(host.outside(), host.slots().join(NS).join("linked-uid")).unwrap();
    assert!(matches!(
        prepare_slot(&host.slots(), NS, "linked-uid", 1),
        Err(SlotPrepareError::Link { .. })
    ));
    host.outside_intact();
}

// ---- ephemeral runtimes --------------------------------------------------------------------

/// `dir` made read-only to its owner (0500): what a job leaves to stop a removal that does not
/// restore write access first.
fn read_only(dir: &Path) {
    fs::set_permissions(dir, fs::Permissions::from_mode(0o500)).unwrap();
}

fn ephemeral_tree(host: &Host, attempt: Uuid) -> PathBuf {
    let runtime = create_ephemeral_runtime(&host.root, attempt).unwrap();
    assert_eq!(
        fs::metadata(&runtime).unwrap().permissions().mode() & 0o777,
        0o700
    );
    fs::create_dir_all(runtime.join("tmp")).unwrap();
    write_file(&runtime, "_work/repo/ro/inner/f", b"x");
    read_only(&runtime.join("_work/repo/ro"));
    make_fifo(&runtime.join("tmp/clr-debug-pipe-runner-in"));
    symlink(host.outside(), runtime.join("_work/cache-link")).unwrap();
    fs::hard_link(host.outside().join("keep.txt"), runtime.join("_work/hard")).unwrap();
    runtime
}

#[test]
fn an_ephemeral_runtime_is_removed_whole_without_opening_fifos_or_following_links() {
    let host = Host::new();
    let attempt = Uuid::from_u128(0x3f2a_9c01_77aa_4bcd_8e00_1234_5678_9abc);
    let runtime = ephemeral_tree(&host, attempt);
    let removal = bounded(BOUND, {
        let root = host.root.clone();
        let journalled = runtime.to_str().unwrap().to_owned();
        move || remove_ephemeral_runtime(&root, attempt, &journalled)
    });
    assert!(
        matches!(removal, Ok(EphemeralRemoval::Removed { .. })),
        "{removal:?}"
    );
    assert!(!runtime.exists());
    host.outside_intact();
    assert_eq!(
        remove_ephemeral_runtime(&host.root, attempt, runtime.to_str().unwrap()),
        Ok(EphemeralRemoval::AlreadyGone)
    );
}

#[test]
fn an_ephemeral_runtime_replaced_by_a_link_is_unlinked_not_followed() {
    let host = Host::new();
    let attempt = Uuid::from_u128(7);
    let runtime = create_ephemeral_runtime(&host.root, attempt).unwrap();
    fs::remove_dir(&runtime).unwrap();
    symlink(host.outside(), &runtime).unwrap();
    let removal = remove_ephemeral_runtime(&host.root, attempt, runtime.to_str().unwrap());
    assert!(matches!(
        removal,
        Ok(EphemeralRemoval::Removed { entries: 1 })
    ));
    assert!(fs::symlink_metadata(&runtime).is_err());
    host.outside_intact();
}

#[test]
fn an_ephemeral_path_that_is_not_the_derived_one_is_refused_and_nothing_is_removed() {
    let host = Host::new();
    let attempt = Uuid::from_u128(8);
    let other = Uuid::from_u128(9 << 100);
    let theirs = create_ephemeral_runtime(&host.root, other).unwrap();
    fs::write(theirs.join("f"), b"x").unwrap();
    for journalled in [
        theirs.to_str().unwrap(),
        host.outside().to_str().unwrap(),
        "/",
    ] {
        let refusal = remove_ephemeral_runtime(&host.root, attempt, journalled);
        assert!(matches!(
            refusal,
            Err(EphemeralError::NotTheDerivedPath { .. })
        ));
    }
    assert!(theirs.join("f").exists());
    host.outside_intact();
}

#[test]
fn a_late_child_recreating_a_cleaned_runtime_is_reaped() {
    let host = Host::new();
    let attempt = Uuid::from_u128(0xabc << 80);
    let runtime = ephemeral_tree(&host, attempt);
    let journalled = runtime.to_str().unwrap().to_owned();
    assert!(matches!(
        remove_ephemeral_runtime(&host.root, attempt, &journalled),
        Ok(EphemeralRemoval::Removed { .. })
    ));
    // A late child recreates part of `_work` after cleanup.
    fs::create_dir_all(runtime.join("_work/late-node-process")).unwrap();
    fs::write(
        runtime.join("_work/late-node-process/node_modules.lock"),
        b"",
    )
    .unwrap();
    assert_eq!(
        ephemeral_runtime_path(&host.root, attempt),
        runtime,
        "the reaper derives the same path"
    );
    assert!(matches!(
        remove_ephemeral_runtime(&host.root, attempt, &journalled),
        Ok(EphemeralRemoval::Removed { entries: 4 })
    ));
    assert!(!runtime.exists());
}

#[test]
fn a_blocked_ephemeral_removal_is_reported_as_could_not_be_removed_and_retried() {
    let host = Host::new();
    let attempt = Uuid::from_u128(0xdef << 80);
    let runtime = create_ephemeral_runtime(&host.root, attempt).unwrap();
    fs::write(runtime.join("locked"), b"x").unwrap();
    let guard = Immutable::set(&runtime.join("locked"));
    let journalled = runtime.to_str().unwrap().to_owned();
    let err = remove_ephemeral_runtime(&host.root, attempt, &journalled).unwrap_err();
    assert!(err.to_string().contains("could not be removed"), "{err}");
    assert!(runtime.join("locked").exists());
    drop(guard);
    assert!(matches!(
        remove_ephemeral_runtime(&host.root, attempt, &journalled),
        Ok(EphemeralRemoval::Removed { .. })
    ));
}
