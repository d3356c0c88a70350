//! How a runtime copy's bytes are proven: hashed as copied (any volume), or cloned from a proven
//! origin (a reflink volume: a loop-mounted XFS image made here, skipped with a printed reason
//! when this host cannot mount one), and seeds on a runtime volume other than the cache's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use runner_manager_node_agent::packages::contents::{CopyCheck, PackageContents, RetainedWork};
use runner_manager_node_agent::packages::copy::{CopyReport, copy_tree_checked};
use runner_manager_node_agent::packages::download::{Downloader, RetryPolicy, Timeouts};
use runner_manager_node_agent::packages::extract::{ExtractLimits, extract_tar_gz};
use runner_manager_node_agent::packages::fingerprint::fingerprint;
use runner_manager_node_agent::packages::origin::prove_origin;
use runner_manager_node_agent::packages::{Materialized, PackageCache, PackageRef, RuntimeKind};
use sha2::{Digest, Sha256};

/// A small package: files in nested directories, a link, an executable.
fn archive() -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for i in 0..40 {
        let data = format!("file {i} ").repeat(100 + i * 50);
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(if i % 5 == 0 { 0o755 } else { 0o644 });
        h.set_size(data.len() as u64);
        h.set_mtime(0);
        let path = format!("./externals/m{}/f{i}.dll", i % 4);
        b.append_data(&mut h, path, data.as_bytes()).unwrap();
    }
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    b.append_link(&mut h, "./externals/node", "m1").unwrap();
    b.into_inner().unwrap().finish().unwrap()
}

fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// An installed tree and its verified contents, under `dir`.
fn installed(dir: &Path) -> (PathBuf, PackageContents) {
    let archive_path = dir.join("package.tar.gz");
    fs::write(&archive_path, archive()).unwrap();
    let tree = dir.join("tree");
    fs::create_dir(&tree).unwrap();
    let contents = extract_tar_gz(&archive_path, &tree, ExtractLimits::default()).unwrap();
    (tree, contents)
}

/// Appends to a file without replacing it (its inode stays, its ctime moves).
fn tamper(path: &Path) {
    fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap()
        .write_all(b"tampered")
        .unwrap();
}

/// A loop-mounted XFS image with `reflink=1`, unmounted on drop.
struct Xfs {
    _dir: tempfile::TempDir,
    mount: PathBuf,
}

impl Xfs {
    /// `None`, with the reason printed, when this host cannot make or mount one.
    fn mount() -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("xfs.img");
        let mount = dir.path().join("mnt");
        fs::create_dir(&mount).unwrap();
        fs::File::create(&image)
            .unwrap()
            .set_len(512 << 20)
            .unwrap();
        let mut mkfs = Command::new("mkfs.xfs");
        mkfs.args(["-q", "-f", "-m", "reflink=1"]).arg(&image);
        let mut mount_it = Command::new("mount");
        mount_it.arg("-o").arg("loop").arg(&image).arg(&mount);
        for step in [&mut mkfs, &mut mount_it] {
            match step.output() {
                Ok(out) if out.status.success() => {}
                Ok(out) => {
                    eprintln!(
                        "skipped: {step:?} failed: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                    return None;
                }
                Err(e) => {
                    eprintln!("skipped: {step:?} could not run ({e})");
                    return None;
                }
            }
        }
        Some(Self { _dir: dir, mount })
    }

    fn dir(&self, name: &str) -> PathBuf {
        let path = self.mount.join(name);
        fs::create_dir_all(&path).unwrap();
        path
    }
}

impl Drop for Xfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
    }
}

fn report(files: u64, reflinked: u64, hashed: u64) -> CopyReport {
    CopyReport {
        files,
        reflinked,
        hashed,
        ..CopyReport::default()
    }
}

// ---- any volume ----------------------------------------------------------------------------

#[test]
fn only_copies_whose_every_byte_is_proven_skip_the_second_read() {
    // A plain copy proves nothing.
    assert_eq!(report(9, 0, 0).check(true), CopyCheck::Full);
    // Every file hashed as copied.
    assert_eq!(report(9, 0, 9).check(false), CopyCheck::LayoutOnly);
    // Clones count only when their origin stayed intact.
    assert_eq!(report(9, 9, 0).check(false), CopyCheck::Full);
    assert_eq!(report(9, 9, 0).check(true), CopyCheck::LayoutOnly);
    assert_eq!(report(9, 4, 5).check(true), CopyCheck::LayoutOnly);
    assert_eq!(report(9, 4, 4).check(true), CopyCheck::Full);
}

#[test]
fn a_checked_copy_catches_an_origin_whose_bytes_changed_after_it_was_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let (tree, contents) = installed(dir.path());
    let print = fingerprint(&tree).unwrap();
    assert!(prove_origin(&tree, &contents, print, 2).unwrap());
    tamper(&tree.join("externals/m2/f6.dll"));
    // Same size, different bytes: only reading the bytes can tell.
    let f7 = tree.join("externals/m3/f7.dll");
    let mut bytes = fs::read(&f7).unwrap();
    bytes[0] ^= 1;
    fs::write(&f7, bytes).unwrap();

    let runtime = dir.path().join("runtime");
    fs::create_dir(&runtime).unwrap();
    let copy = copy_tree_checked(&tree, &runtime, &contents, 2).unwrap();
    if copy.reflinked == 0 {
        assert_eq!((copy.hashed, copy.differing), (40, 2), "{copy:?}");
    }
    // The origin's proof fails too, so no clone of it would skip the bytes.
    assert!(!prove_origin(&tree, &contents, fingerprint(&tree).unwrap(), 2).unwrap());
    assert!(!prove_origin(&tree, &contents, print, 2).unwrap());
}

#[test]
fn a_checked_copy_of_an_intact_tree_needs_only_its_layout_checked() {
    let dir = tempfile::tempdir().unwrap();
    let (tree, contents) = installed(dir.path());
    let runtime = dir.path().join("runtime");
    fs::create_dir(&runtime).unwrap();
    let copy = copy_tree_checked(&tree, &runtime, &contents, 2).unwrap();
    assert_eq!((copy.files, copy.differing), (40, 0));
    assert_eq!(copy.hashed + copy.reflinked, 40);
    let check = copy.check(copy.reflinked == 0);
    assert_eq!(check, CopyCheck::LayoutOnly);
    contents
        .verify_copy(&runtime, RetainedWork::Include, check, 2)
        .unwrap()
        .unwrap();
    // The layout check still sees a changed size, mode, link or entry set.
    fs::write(runtime.join("externals/extra"), b"x").unwrap();
    let mismatch = contents
        .verify_layout(&runtime, RetainedWork::Include)
        .unwrap()
        .unwrap_err();
    assert_eq!(mismatch.extra, 1);
    fs::remove_file(runtime.join("externals/extra")).unwrap();
    tamper(&runtime.join("externals/m0/f0.dll"));
    let mismatch = contents
        .verify_layout(&runtime, RetainedWork::Include)
        .unwrap()
        .unwrap_err();
    assert_eq!(mismatch.changed, 1);
}

// ---- a reflink volume ----------------------------------------------------------------------

#[test]
fn a_clone_of_a_tampered_origin_is_caught_by_the_full_check_its_origin_cannot_pass() {
    let Some(xfs) = Xfs::mount() else { return };
    let (tree, contents) = installed(&xfs.dir("packages"));
    let print = fingerprint(&tree).unwrap();
    // Edited after the contents were read from the archive and before the fingerprint: the
    // fingerprint records the edit, so only the origin's proof can refuse it.
    tamper(&tree.join("externals/m1/f5.dll"));
    let print_after = fingerprint(&tree).unwrap();
    assert_ne!(print, print_after);
    let runtime = xfs.dir("runtime");
    let copy = copy_tree_checked(&tree, &runtime, &contents, 2).unwrap();
    assert_eq!(copy.reflinked, 40, "{copy:?}");
    let proven = prove_origin(&tree, &contents, print_after, 2).unwrap();
    assert!(!proven);
    let check = copy.check(proven);
    assert_eq!(check, CopyCheck::Full);
    let mismatch = contents
        .verify_copy(&runtime, RetainedWork::Include, check, 2)
        .unwrap()
        .unwrap_err();
    assert_eq!(mismatch.changed, 1);
}

/// A cache at `packages` holding the test package's archive, seeding under `seed_root` when
/// given: the cache and the package's digest.
fn cache_with(packages: &Path, seed_root: Option<&Path>) -> (PackageCache, String) {
    let archive = archive();
    let sha = digest(&archive);
    // The archive is kept where the cache keeps verified archives, so no download happens; the
    // URL is never asked.
    fs::create_dir_all(packages.join(".archives")).unwrap();
    fs::write(packages.join(format!(".archives/{sha}.tar.gz")), archive).unwrap();
    let retry = RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::PRODUCTION
    };
    let downloader = Downloader::new(retry, Timeouts::PRODUCTION).unwrap();
    let cache = PackageCache::new(packages, downloader).unwrap();
    let cache = match seed_root {
        Some(root) => cache.with_seed_root(root).unwrap(),
        None => cache,
    };
    (cache, sha)
}

/// The package `sha`, at a URL never asked (its archive is kept: [`cache_with`]).
fn kept(sha: &str) -> PackageRef<'_> {
    PackageRef {
        sha256: sha,
        url: "http://127.0.0.1:9/never",
    }
}

/// Materializes the kept package `sha` for `attempt` into the ephemeral `runtime`.
async fn ephemeral(cache: &PackageCache, attempt: &str, sha: &str, runtime: &Path) -> Materialized {
    cache
        .materialize(attempt, kept(sha), runtime, RuntimeKind::Ephemeral)
        .await
        .unwrap()
}

fn runtime_in(root: &Path, name: &str) -> PathBuf {
    let path = root.join("runners").join(name);
    fs::create_dir_all(&path).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_from_the_cache_are_proven_once_then_checked_by_layout() {
    let Some(xfs) = Xfs::mount() else { return };
    let (cache, sha) = cache_with(&xfs.mount.join("packages"), None);
    for (attempt, name) in [("a-1", "aaaaaaaaaaaa"), ("a-2", "bbbbbbbbbbbb")] {
        let runtime = runtime_in(&xfs.mount, name);
        let m = ephemeral(&cache, attempt, &sha, &runtime).await;
        assert_eq!((m.copy.files, m.copy.reflinked), (40, 40), "{m:?}");
        assert_eq!(m.check, CopyCheck::LayoutOnly);
    }
    assert!(!xfs.mount.join(".seed").exists(), "same volume: no seed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_is_made_once_on_the_runtime_volume_reused_and_remade_when_edited() {
    let Some(xfs) = Xfs::mount() else { return };
    let host = tempfile::tempdir().unwrap();
    let (cache, sha) = cache_with(&host.path().join("packages"), Some(&xfs.mount));
    let seed = cache.seed_path(&xfs.mount, &sha);

    let first = runtime_in(&xfs.mount, "aaaaaaaaaaaa");
    let m = ephemeral(&cache, "a-1", &sha, &first).await;
    assert_eq!((m.copy.reflinked, m.check), (40, CopyCheck::LayoutOnly));
    let seed_inode = fs::metadata(&seed).unwrap().ino();
    assert_eq!(
        fs::read(first.join("externals/m1/f5.dll")).unwrap(),
        fs::read(seed.join("externals/m1/f5.dll")).unwrap()
    );

    // Reused: same seed, nothing installed, still clones.
    let second = runtime_in(&xfs.mount, "bbbbbbbbbbbb");
    let m = ephemeral(&cache, "a-2", &sha, &second).await;
    assert_eq!(m.timings.install, std::time::Duration::ZERO);
    assert_eq!((m.copy.reflinked, m.check), (40, CopyCheck::LayoutOnly));
    assert_eq!(fs::metadata(&seed).unwrap().ino(), seed_inode);

    // An edited seed is not cloned from: it is remade, and the copy is the package.
    tamper(&seed.join("externals/m1/f5.dll"));
    let third = runtime_in(&xfs.mount, "cccccccccccc");
    let m = ephemeral(&cache, "a-3", &sha, &third).await;
    assert_eq!((m.copy.reflinked, m.check), (40, CopyCheck::LayoutOnly));
    assert_ne!(fs::metadata(&seed).unwrap().ino(), seed_inode);
    let (_, contents) = installed(host.path());
    contents
        .verify_tree(&third, RetainedWork::Include, 2)
        .unwrap()
        .unwrap();

    // A runtime on the cache's own volume still copies from the cache, hashing as it copies.
    let local = runtime_in(host.path(), "dddddddddddd");
    let m = ephemeral(&cache, "a-4", &sha, &local).await;
    assert_eq!((m.copy.reflinked, m.copy.hashed), (0, 40));
    assert_eq!(m.check, CopyCheck::LayoutOnly);
}

/// A seed this process never recorded (one made before a restart) is rebuilt, not trusted
/// (row 113); making it removes an interrupted staging and the seed of a version the cache no
/// longer holds, and keeps the seed of an installed one (row 114).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_from_before_a_restart_is_rebuilt_and_abandoned_entries_are_dropped() {
    let Some(xfs) = Xfs::mount() else { return };
    let host = tempfile::tempdir().unwrap();
    let packages = host.path().join("packages");
    let (before, sha) = cache_with(&packages, Some(&xfs.mount));
    ephemeral(
        &before,
        "a-1",
        &sha,
        &runtime_in(&xfs.mount, "aaaaaaaaaaaa"),
    )
    .await;
    let seed = before.seed_path(&xfs.mount, &sha);
    let inode = fs::metadata(&seed).unwrap().ino();
    drop(before);

    // What a crash or an old version left under `.seed`.
    let seeds = xfs.mount.join(".seed");
    let staging = seeds.join(".staging-0123456789abcdef");
    fs::create_dir_all(staging.join("bin")).unwrap();
    let abandoned = seeds.join("c".repeat(64));
    fs::create_dir_all(abandoned.join("bin")).unwrap();
    let installed_other = "d".repeat(64);
    fs::create_dir_all(packages.join(&installed_other)).unwrap();
    fs::create_dir_all(seeds.join(&installed_other)).unwrap();
    let unrelated = seeds.join("README");
    fs::write(&unrelated, b"not a seed").unwrap();

    // The restarted process has recorded nothing: the seed is rebuilt, never reused.
    let (after, _) = cache_with(&packages, Some(&xfs.mount));
    let runtime = runtime_in(&xfs.mount, "bbbbbbbbbbbb");
    let m = ephemeral(&after, "a-2", &sha, &runtime).await;
    assert_eq!((m.copy.reflinked, m.check), (40, CopyCheck::LayoutOnly));
    assert_ne!(fs::metadata(&seed).unwrap().ino(), inode, "rebuilt");
    assert!(!staging.exists(), "an interrupted staging is dropped");
    assert!(
        !abandoned.exists(),
        "a seed of a version not in the cache is dropped"
    );
    assert!(
        seeds.join(&installed_other).exists(),
        "an installed version's seed stays"
    );
    assert!(unrelated.exists(), "only digest and staging names are ours");
    let (_, contents) = installed(host.path());
    contents
        .verify_tree(&runtime, RetainedWork::Include, 2)
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruning_a_version_removes_its_seeds() {
    let Some(xfs) = Xfs::mount() else { return };
    let host = tempfile::tempdir().unwrap();
    let (cache, sha) = cache_with(&host.path().join("packages"), Some(&xfs.mount));
    let runtime = runtime_in(&xfs.mount, "aaaaaaaaaaaa");
    ephemeral(&cache, "a-1", &sha, &runtime).await;
    let seed = cache.seed_path(&xfs.mount, &sha);
    assert!(seed.is_dir());
    cache.release("a-1");
    let lock = runner_manager_node_agent::workspace::allocation::AllocationLock::default();
    let report = cache.prune(&lock.lock().await, &[]).unwrap();
    assert_eq!(report.removed, vec![sha.clone()]);
    assert!(!seed.exists());
    // Nothing of it is trusted any more: the next launch installs again.
    assert!(!cache.is_trusted(&sha));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_on_a_volume_that_cannot_clone_is_not_used_again() {
    // tmpfs: another volume than the temporary directory's, and one that cannot clone.
    let Ok(other) = tempfile::tempdir_in("/dev/shm") else {
        eprintln!("skipped: no /dev/shm");
        return;
    };
    let host = tempfile::tempdir().unwrap();
    if fs::metadata(other.path()).unwrap().dev() == fs::metadata(host.path()).unwrap().dev() {
        eprintln!("skipped: /dev/shm is on the temporary directory's volume");
        return;
    }
    let (cache, sha) = cache_with(&host.path().join("packages"), Some(other.path()));
    let first = runtime_in(other.path(), "aaaaaaaaaaaa");
    let m = ephemeral(&cache, "a-1", &sha, &first).await;
    assert_eq!((m.copy.reflinked, m.copy.hashed), (0, 40));
    let seed = cache.seed_path(other.path(), &sha);
    let made = fs::metadata(&seed).unwrap().ino();
    // Were the seed still in use, this edit would have it remade (a new inode).
    tamper(&seed.join("externals/m1/f5.dll"));
    // Not remade, not copied from: the next copy comes from the cache, hashed as it is copied.
    let second = runtime_in(other.path(), "bbbbbbbbbbbb");
    let m = ephemeral(&cache, "a-2", &sha, &second).await;
    assert_eq!(m.timings.install, std::time::Duration::ZERO);
    assert_eq!(
        (m.copy.reflinked, m.copy.hashed, m.check),
        (0, 40, CopyCheck::LayoutOnly)
    );
    assert_eq!(fs::metadata(&seed).unwrap().ino(), made);
}
