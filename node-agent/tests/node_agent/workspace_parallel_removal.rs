//! The multi-threaded removal (scrub and ephemeral removal of large trees) against hostile
//! trees large enough to take the parallel path: links and FIFOs at the opened top levels and
//! deep inside the shared-out subtrees, an unremovable entry deep inside, and the same counts as
//! the sequential remover.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::CString;
use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;

use runner_manager_crds::attempt::WorkspacePlacement;
use runner_manager_node_agent::workspace::SlotRefusal;
use runner_manager_node_agent::workspace::ephemeral::{
    EphemeralRemoval, create_ephemeral_runtime, remove_ephemeral_runtime,
};
use runner_manager_node_agent::workspace::prepare::prepare_slot;
use runner_manager_node_agent::workspace::remove::{EntryKind, remove_entry_at};
use runner_manager_node_agent::workspace::remove_parallel::remove_entry_at_parallel;
use runner_manager_node_agent::workspace::scrub::{Scrubbed, scrub_slot};
use runner_manager_node_agent::workspace::scrub_plan::SlotOwner;
use uuid::Uuid;

use crate::workspace_support::{
    Immutable, assert_only_the_checkout_kept, assert_only_work_left, bounded, make_fifo,
};

/// How long a removal of these large trees may take before it counts as blocked on a FIFO.
const BOUND: Duration = Duration::from_secs(30);

const OWNER: SlotOwner<'static> = SlotOwner {
    namespace: "team",
    policy_uid: "uid",
};

/// An `externals`-shaped tree under `root` (40 × 7 directories of files) with links out to
/// `outside` and FIFOs at every level. Returns how many entries it holds below `root`.
fn hostile_tree(root: &Path, outside: &Path) -> u64 {
    let mut entries = 0;
    for m in 0..40 {
        let module = root.join(format!("externals/m{m}"));
        for lib in 0..7 {
            let dir = module.join(format!("lib{lib}/deep"));
            fs::create_dir_all(&dir).unwrap();
            for f in 0..4 {
                fs::write(dir.join(format!("f{f}")), b"x").unwrap();
            }
            symlink(outside, dir.join("escape")).unwrap();
            entries += 2 + 4 + 1;
        }
        // At the opened levels: a link to a directory, a FIFO.
        symlink(outside, module.join("escape")).unwrap();
        make_fifo(&module.join("pipe"));
        entries += 1 + 2;
    }
    symlink(outside, root.join("externals/escape")).unwrap();
    make_fifo(&root.join("externals/pipe"));
    entries + 1 + 2
}

/// `(outside, slots, slot, below)`: slot 1 under `<base>/slots`, holding a hostile tree of
/// `below` entries with links out to `<base>/outside`, and the `_work` a scrub keeps.
fn hostile_slot(base: &Path) -> (PathBuf, PathBuf, PathBuf, u64) {
    let outside = outside_dir(base);
    let slots = base.join("slots");
    let slot = prepare_slot(&slots, OWNER.namespace, OWNER.policy_uid, 1)
        .unwrap()
        .path;
    let below = hostile_tree(&slot, &outside);
    fs::create_dir_all(slot.join("_work")).unwrap();
    (outside, slots, slot, below)
}

fn outside_dir(base: &Path) -> PathBuf {
    let outside = base.join("outside");
    fs::create_dir_all(outside.join("sub")).unwrap();
    fs::write(outside.join("keep.txt"), b"operator data").unwrap();
    outside
}

fn outside_intact(outside: &Path) {
    assert_eq!(
        fs::read(outside.join("keep.txt")).unwrap(),
        b"operator data"
    );
    assert!(outside.join("sub").is_dir());
}

fn open_dir(path: &Path) -> OwnedFd {
    rustix::fs::open(
        path,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::NOFOLLOW,
        rustix::fs::Mode::empty(),
    )
    .unwrap()
}

#[test]
fn the_parallel_remover_removes_what_the_sequential_one_does_and_follows_nothing() {
    let base = tempfile::tempdir().unwrap();
    let outside = outside_dir(base.path());
    let (a, b) = (base.path().join("a"), base.path().join("b"));
    let expected = hostile_tree(&a, &outside);
    assert_eq!(hostile_tree(&b, &outside), expected);
    let parent = open_dir(base.path());
    let name = CString::new("a").unwrap();
    let sequential = remove_entry_at(parent.as_fd(), &name, EntryKind::Directory).unwrap();
    let parallel = bounded(BOUND, move || {
        let parent = open_dir(b.parent().unwrap());
        let name = CString::new("b").unwrap();
        remove_entry_at_parallel(parent.as_fd(), &name, EntryKind::Directory, 4).unwrap()
    });
    // Every entry below, plus the directory itself.
    assert_eq!(sequential.entries, expected + 1);
    assert_eq!(parallel.entries, sequential.entries);
    assert!(!a.exists() && !base.path().join("b").exists());
    outside_intact(&outside);
}

#[test]
fn a_large_slot_is_scrubbed_on_several_threads_without_following_links_or_opening_fifos() {
    let base = tempfile::tempdir().unwrap();
    let (outside, slots, slot, below) = hostile_slot(base.path());
    fs::create_dir_all(slot.join("_work/repo")).unwrap();
    fs::write(slot.join("_work/repo/checkout.txt"), b"retained").unwrap();
    fs::write(slot.join(".credentials"), b"x").unwrap();
    let placement = WorkspacePlacement::slot(1, slot.to_str().unwrap()).unwrap();
    let scrubbed = bounded(BOUND, move || scrub_slot(&placement, &slots, OWNER));
    assert_eq!(scrubbed, Ok(Scrubbed::Clean { removed: below + 1 }));
    assert_only_the_checkout_kept(&slot);
    outside_intact(&outside);
}

#[test]
fn an_unremovable_entry_deep_in_a_large_tree_quarantines_and_is_retried() {
    let base = tempfile::tempdir().unwrap();
    let (outside, slots, slot, _) = hostile_slot(base.path());
    let stuck = slot.join("externals/m17/lib3/deep/f2");
    let frozen = Immutable::set(&stuck);
    let placement = WorkspacePlacement::slot(1, slot.to_str().unwrap()).unwrap();
    let q = scrub_slot(&placement, &slots, OWNER).unwrap_err();
    assert_eq!(q.refusal, SlotRefusal::Deletion);
    assert!(stuck.exists());
    outside_intact(&outside);
    drop(frozen);
    assert!(matches!(
        scrub_slot(&placement, &slots, OWNER),
        Ok(Scrubbed::Clean { .. })
    ));
    assert_only_work_left(&slot);
}

#[test]
fn a_large_ephemeral_runtime_is_removed_whole_on_several_threads() {
    let base = tempfile::tempdir().unwrap();
    let outside = outside_dir(base.path());
    let attempt = Uuid::from_u128(0xabc);
    let runtime = create_ephemeral_runtime(base.path(), attempt).unwrap();
    let below = hostile_tree(&runtime, &outside);
    let journalled = runtime.to_str().unwrap().to_owned();
    let host = base.path().to_path_buf();
    let removal = bounded(BOUND, move || {
        remove_ephemeral_runtime(&host, attempt, &journalled)
    });
    assert_eq!(
        removal.unwrap(),
        EphemeralRemoval::Removed { entries: below + 1 }
    );
    assert!(!runtime.exists());
    outside_intact(&outside);
}
