//! Shared by the workspace and package tests (and `removal.rs`, its own binary): FIFOs to plant
//! in hostile trees, a bound on a removal that must not block on one, a wide tree, what a
//! directory holds and what a scrubbed slot keeps (and the workspace benchmark, for its wide
//! tree).
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

/// A FIFO at `path`: a removal that opened it would block forever.
pub fn make_fifo(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
}

/// Runs `f` on another thread and fails the test if it has not returned `within`: a removal
/// that opened a FIFO would block forever instead of failing.
pub fn bounded<T: Send + 'static>(within: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(f()));
    rx.recv_timeout(within)
        .expect("the removal blocked (did it open a FIFO?)")
}

/// `dir/path` holds exactly `contents`.
#[track_caller]
pub fn assert_file(dir: &Path, path: &str, contents: &[u8]) {
    assert_eq!(
        fs::read(dir.join(path)).unwrap(),
        contents,
        "{}",
        dir.join(path).display()
    );
}

/// Writes `contents` to `dir/path`, making its parent directories: what a job (or an
/// attacker) left in a runtime, for [`assert_file`] to find again.
pub fn write_file(dir: &Path, path: &str, contents: &[u8]) {
    let file = dir.join(path);
    fs::create_dir_all(file.parent().unwrap()).unwrap();
    fs::write(file, contents).unwrap();
}

/// `dirs` subdirectories of `top` holding a file each, and one directory of `files` files.
pub fn wide_tree(top: &Path, dirs: u32, files: u32) {
    fs::create_dir(top).unwrap();
    for i in 0..dirs {
        let d = top.join(format!("d{i}"));
        fs::create_dir(&d).unwrap();
        fs::write(d.join("f"), b"x").unwrap();
    }
    let flat = top.join("flat");
    fs::create_dir(&flat).unwrap();
    for i in 0..files {
        fs::File::create(flat.join(format!("f{i}"))).unwrap();
    }
}

/// The names in `dir`, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// A scrubbed `slot` keeps only `_work`: nothing else of the last job is left at its top.
pub fn assert_only_work_left(slot: &Path) {
    let names: Vec<_> = fs::read_dir(slot)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["_work"]);
}

/// A scrubbed `slot` keeps only `_work`, and the checkout in it (`_work/repo/checkout.txt`).
pub fn assert_only_the_checkout_kept(slot: &Path) {
    assert_only_work_left(slot);
    assert!(slot.join("_work/repo/checkout.txt").exists());
}

/// Sets the immutable flag on a path (root only: it cannot be removed, even by root) and clears
/// it again on drop, so the temporary directory can be removed.
pub struct Immutable(PathBuf);

impl Immutable {
    pub fn set(path: &Path) -> Self {
        Self::flags(path, rustix::fs::IFlags::IMMUTABLE)
            .expect("setting the immutable flag needs root on a filesystem that has it");
        Self(path.to_path_buf())
    }

    fn flags(path: &Path, flags: rustix::fs::IFlags) -> rustix::io::Result<()> {
        let fd = rustix::fs::open(
            path,
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NOFOLLOW,
            rustix::fs::Mode::empty(),
        )?;
        rustix::fs::ioctl_setflags(&fd, flags)
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        // The test may have gone on to remove the path itself; a panic in drop would abort.
        let _ = Self::flags(&self.0, rustix::fs::IFlags::empty());
    }
}
