//! Removal against trees no legitimate job makes (issue 14): far deeper than the default
//! descriptor limit, and far wider than the parallel remover's skeleton, removed on a small
//! thread stack under a 1024-descriptor limit while other I/O of the same process goes on.
//! Every safety property holds meanwhile: no link followed, no FIFO opened.
//!
//! Its own test binary: the descriptor limit is per process.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::CString;
use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use runner_manager_node_agent::workspace::ephemeral::{
    EphemeralRemoval, create_ephemeral_runtime, remove_ephemeral_runtime,
};
use runner_manager_node_agent::workspace::remove::{
    EntryKind, MAX_OPEN_DIRS, Removed, remove_entry_at,
};
use runner_manager_node_agent::workspace::remove_parallel::{
    MAX_SKELETON_DIRS, remove_entry_at_parallel,
};
use rustix::fs::{Mode, OFlags};
use uuid::Uuid;

use crate::workspace_support::wide_tree;

/// Deeper than any descriptor limit a distribution ships by default, and far deeper than a
/// recursion on a 64 KiB stack survives.
const DEPTH: u32 = 30_000;
/// Wider than the skeleton could ever open, and than the descriptor limit.
const WIDE_DIRS: u32 = 3_000;
const WIDE_FILES: u32 = 50_000;
/// The stack the removals run on: a recursion per level overflows it within a few hundred.
const SMALL_STACK: usize = 64 * 1024;

fn limit_descriptors() {
    rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(1024),
            maximum: None,
        },
    )
    .or_else(|_| {
        // Without CAP_SYS_RESOURCE the hard limit stays; lowering the soft one always works.
        let now = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit {
                current: Some(1024),
                maximum: now.maximum,
            },
        )
    })
    .unwrap();
}

fn open_dir(path: &Path) -> OwnedFd {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap()
}

/// A chain `d/d/d/…` `depth` deep under `top`, built fd-relative (its path is far past
/// `PATH_MAX`), with a FIFO, a link out of the tree and a read-only directory at the bottom.
fn deep_tree(top: &Path, depth: u32, outside: &Path) {
    fs::create_dir(top).unwrap();
    let mut dir = open_dir(top);
    for _ in 0..depth {
        rustix::fs::mkdirat(&dir, "d", Mode::from_raw_mode(0o755)).unwrap();
        dir = rustix::fs::openat(
            &dir,
            "d",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
    }
    rustix::fs::mknodat(
        &dir,
        "fifo",
        rustix::fs::FileType::Fifo,
        Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    rustix::fs::symlinkat(outside, &dir, "escape").unwrap();
    rustix::fs::mkdirat(&dir, "ro", Mode::from_raw_mode(0o755)).unwrap();
    let ro = rustix::fs::openat(
        &dir,
        "ro",
        OFlags::RDONLY | OFlags::DIRECTORY,
        Mode::empty(),
    )
    .unwrap();
    rustix::fs::mkdirat(&ro, "inner", Mode::from_raw_mode(0o755)).unwrap();
    rustix::fs::fchmod(&ro, Mode::from_raw_mode(0o555)).unwrap();
}

/// A `DEPTH`-deep tree at `<dir>/job`, its link out to `<dir>/outside` (returned).
fn deep_job(dir: &Path) -> std::path::PathBuf {
    let outside = outside(dir);
    deep_tree(&dir.join("job"), DEPTH, &outside);
    outside
}

fn outside(dir: &Path) -> std::path::PathBuf {
    let outside = dir.join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("keep.txt"), b"operator data").unwrap();
    outside
}

/// What the process's other I/O saw while a removal ran: how many rounds of opening 16 files
/// it made, how many failed, and the most descriptors the process had open at once.
struct Bystander {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
    failures: Arc<AtomicU64>,
    peak_fds: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl Bystander {
    fn start(file: &Path) -> Self {
        let (stop, rounds, failures, peak_fds) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
        );
        fs::write(file, b"other I/O").unwrap();
        let file = file.to_path_buf();
        let thread = {
            let (stop, rounds, failures, peak_fds) = (
                Arc::clone(&stop),
                Arc::clone(&rounds),
                Arc::clone(&failures),
                Arc::clone(&peak_fds),
            );
            std::thread::spawn(move || {
                // At least one round, however quickly the removal ends.
                loop {
                    let mut held = Vec::new();
                    for _ in 0..16 {
                        match fs::File::open(&file) {
                            Ok(f) => held.push(f),
                            Err(_) => {
                                failures.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    let open = fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
                    peak_fds.fetch_max(open, Ordering::Relaxed);
                    drop(held);
                    rounds.fetch_add(1, Ordering::Relaxed);
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
            })
        };
        Self {
            stop,
            rounds,
            failures,
            peak_fds,
            thread,
        }
    }

    /// (rounds, failures, peak descriptors)
    fn finish(self) -> (u64, u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        (
            self.rounds.load(Ordering::Relaxed),
            self.failures.load(Ordering::Relaxed),
            self.peak_fds.load(Ordering::Relaxed),
        )
    }
}

/// Runs `f` on a thread with a small stack (a stack overflow aborts the test binary: a failure).
fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(SMALL_STACK)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

fn remove(parent: &Path, name: &str, threads: usize) -> std::io::Result<Removed> {
    let parent = open_dir(parent);
    let name = CString::new(name).unwrap();
    if threads < 2 {
        remove_entry_at(parent.as_fd(), &name, EntryKind::Directory)
    } else {
        remove_entry_at_parallel(parent.as_fd(), &name, EntryKind::Directory, threads)
    }
}

#[test]
fn a_tree_thirty_thousand_deep_is_removed_on_a_small_stack_with_bounded_descriptors() {
    limit_descriptors();
    let dir = tempfile::tempdir().unwrap();
    let outside = deep_job(dir.path());
    let bystander = Bystander::start(&dir.path().join("other"));
    let parent = dir.path().to_path_buf();
    let removed = on_small_stack(move || remove(&parent, "job", 1)).unwrap();
    let (rounds, failures, peak_fds) = bystander.finish();
    println!(
        "deep {DEPTH}: {} entries, peak {} directory descriptors held by the removal, {peak_fds} in the process; bystander {rounds} rounds, {failures} failures",
        removed.entries, removed.peak_open_dirs
    );
    assert!(!dir.path().join("job").exists());
    // Every level, the FIFO, the link and `ro` with its child, and the top.
    assert_eq!(removed.entries, u64::from(DEPTH) + 5);
    assert!(removed.peak_open_dirs <= MAX_OPEN_DIRS as u64 + 1);
    assert_eq!(failures, 0, "the process's other I/O failed meanwhile");
    assert!(rounds >= 1);
    assert_eq!(
        fs::read(outside.join("keep.txt")).unwrap(),
        b"operator data",
        "the link was unlinked, never followed"
    );
}

#[test]
fn a_deep_tree_is_removed_by_the_parallel_remover_too() {
    limit_descriptors();
    let dir = tempfile::tempdir().unwrap();
    let outside = deep_job(dir.path());
    let parent = dir.path().to_path_buf();
    let removed = on_small_stack(move || remove(&parent, "job", 2)).unwrap();
    assert!(!dir.path().join("job").exists());
    assert_eq!(removed.entries, u64::from(DEPTH) + 5);
    assert!(outside.join("keep.txt").exists());
}

#[test]
fn a_tree_wider_than_the_descriptor_limit_is_removed_on_every_path() {
    limit_descriptors();
    for threads in [1, 2] {
        let dir = tempfile::tempdir().unwrap();
        wide_tree(&dir.path().join("job"), WIDE_DIRS, WIDE_FILES);
        let bystander = Bystander::start(&dir.path().join("other"));
        let parent = dir.path().to_path_buf();
        let removed = on_small_stack(move || remove(&parent, "job", threads)).unwrap();
        let (rounds, failures, peak_fds) = bystander.finish();
        println!(
            "wide {WIDE_DIRS} dirs + {WIDE_FILES} files, {threads} thread(s): {} entries, peak {} directory descriptors (bound), {peak_fds} in the process; bystander {rounds} rounds, {failures} failures",
            removed.entries, removed.peak_open_dirs
        );
        assert!(!dir.path().join("job").exists());
        assert_eq!(
            removed.entries,
            u64::from(WIDE_DIRS) * 2 + u64::from(WIDE_FILES) + 2
        );
        assert!(
            removed.peak_open_dirs <= (MAX_SKELETON_DIRS + threads * (MAX_OPEN_DIRS + 1)) as u64,
            "{}",
            removed.peak_open_dirs
        );
        assert_eq!(failures, 0, "the process's other I/O failed meanwhile");
    }
}

#[test]
fn an_ephemeral_runtime_holding_a_deep_tree_is_removed_whole() {
    limit_descriptors();
    let host = tempfile::tempdir().unwrap();
    let outside = outside(host.path());
    let attempt = Uuid::new_v4();
    let runtime = create_ephemeral_runtime(host.path(), attempt).unwrap();
    deep_tree(&runtime.join("_work"), DEPTH, &outside);
    let (root, journalled) = (host.path().to_path_buf(), runtime.display().to_string());
    let removal =
        on_small_stack(move || remove_ephemeral_runtime(&root, attempt, &journalled)).unwrap();
    assert!(matches!(removal, EphemeralRemoval::Removed { .. }));
    assert!(!runtime.exists());
    assert!(outside.join("keep.txt").exists());
}
