//! The overlay materialize (issue 15 item 9) against real mounts: the package cache's verified
//! tree as the read-only lower, the runtime as the upper, attacks performed through the mount by
//! a runner account, and removal, scrub and restart finding and unmounting what was mounted.
//! Needs root (mounts) and the runner accounts (uid 20001, gid 20000).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::archive_support;

use archive_support::tar_gz;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use runner_manager_crds::attempt::WorkspacePlacement;
use runner_manager_node_agent::packages::download::{Downloader, RetryPolicy, Timeouts};
use runner_manager_node_agent::packages::fingerprint::fingerprint;
use runner_manager_node_agent::packages::overlay::{self, Materializer, Unmounted};
use runner_manager_node_agent::packages::{Materialized, PackageCache, PackageRef, RuntimeKind};
use runner_manager_node_agent::workspace::ephemeral::{
    EphemeralRemoval, create_ephemeral_runtime, remove_runtime_named, runtime_names,
};
use runner_manager_node_agent::workspace::prepare::prepare_slot;
use runner_manager_node_agent::workspace::scrub::{Scrubbed, scrub_slot};
use runner_manager_node_agent::workspace::scrub_plan::SlotOwner;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::workspace_support::assert_file;

const RUNNER_UID: u32 = 20001;
const RUNNER_GID: u32 = 20000;

struct Host {
    dir: tempfile::TempDir,
    cache: PackageCache,
    sha: String,
}

impl Host {
    /// A cache in overlay mode whose archive is already kept (so no download happens: the
    /// install verifies the kept archive's digest and extracts it).
    fn new() -> Self {
        // Under /tmp (ext4 here); the tempdir is root's and 0700, so the runner account reaches
        // only what the runtime's own ownership gives it.
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o711)).unwrap();
        let archive = tar_gz(&[
            ("bin/Runner.Listener", b"#!/bin/sh\necho listener\n", 0o755),
            ("bin/Runner.Worker.dll", b"worker", 0o644),
            ("externals/node20/bin/node", b"node", 0o755),
            ("run.sh", b"#!/bin/sh\n", 0o755),
            ("config.sh", b"#!/bin/sh\n", 0o755),
        ]);
        let sha = hex::encode(Sha256::digest(&archive));
        let packages = dir.path().join("packages");
        fs::create_dir_all(packages.join(".archives")).unwrap();
        fs::write(
            packages.join(".archives").join(format!("{sha}.tar.gz")),
            archive,
        )
        .unwrap();
        let downloader = Downloader::new(RetryPolicy::PRODUCTION, Timeouts::PRODUCTION).unwrap();
        let cache = PackageCache::new(packages, downloader)
            .unwrap()
            .with_materializer(Materializer::Overlay);
        Self { dir, cache, sha }
    }

    fn package(&self) -> PackageRef<'_> {
        PackageRef {
            sha256: &self.sha,
            url: "https://example.invalid/never-fetched.tar.gz",
        }
    }

    fn lower(&self) -> PathBuf {
        self.cache.tree(&self.sha)
    }

    async fn ephemeral(&self, attempt: &str) -> (Uuid, PathBuf) {
        let id = Uuid::new_v4();
        let runtime = create_ephemeral_runtime(self.dir.path(), id).unwrap();
        let m = self
            .overlaid(attempt, &runtime, RuntimeKind::Ephemeral)
            .await;
        assert_eq!(m.copy.files, 0, "nothing is copied");
        (id, runtime)
    }

    /// The package materialized for `attempt` in `dir` (a `kind` runtime): by overlay.
    async fn overlaid(&self, attempt: &str, dir: &Path, kind: RuntimeKind) -> Materialized {
        let m = self
            .cache
            .materialize(attempt, self.package(), dir, kind)
            .await
            .unwrap();
        assert_eq!(m.by, Materializer::Overlay);
        m
    }
}

/// Runs `script` with `sh` as the runner account, in `dir`; returns its standard output.
/// `setpriv` drops root's supplementary groups too (std's `groups` is unstable).
fn as_runner_output(dir: &Path, script: &str) -> String {
    let out = std::process::Command::new("setpriv")
        .arg(format!("--reuid={RUNNER_UID}"))
        .arg(format!("--regid={RUNNER_GID}"))
        .arg("--clear-groups")
        .args(["/bin/sh", "-c", script])
        .current_dir(dir)
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

fn mounted(path: &Path) -> bool {
    overlay::is_mounted(path).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_writing_through_the_mount_leaves_the_lower_and_the_next_view_pristine() {
    let host = Host::new();
    let (id, runtime) = host.ephemeral("a-1").await;
    assert!(mounted(&runtime));
    assert_file(
        &runtime,
        "bin/Runner.Listener",
        b"#!/bin/sh\necho listener\n",
    );
    let lower = host.lower();
    let before = fingerprint(&lower).unwrap();
    // The lower is root's and offers the runner account no write bit anywhere.
    for entry in walk(&lower) {
        let meta = fs::symlink_metadata(&entry).unwrap();
        assert_eq!(meta.uid(), 0, "{}", entry.display());
        assert_eq!(meta.mode() & 0o022, 0, "{}", entry.display());
    }
    // The launch gives the runtime's root to the account (`own_runtime`), as it does today.
    std::os::unix::fs::lchown(&runtime, Some(RUNNER_UID), Some(RUNNER_GID)).unwrap();
    // The attack, as the runner: rewrite, chmod, delete, rename, create set-id files, and try
    // the lower itself directly. Each step says how it ended (`name=<status> <stderr>`).
    let out = as_runner_output(
        &runtime,
        &format!(
            "step() {{ name=$1; shift; err=$(\"$@\" 2>&1 >/dev/null); echo \"$name=$? $err\"; }}; \
             step write sh -c 'printf evil > bin/Runner.Listener'; \
             step chmod chmod 777 bin/Runner.Worker.dll; \
             step rm rm -f run.sh; \
             step mv mv externals ext2; \
             step setid sh -c 'printf x > setid && chmod 6755 setid'; \
             step own sh -c 'printf a > mine && printf b >> mine && chmod 600 mine'; \
             step lower-write sh -c 'printf x > {lower}/bin/Runner.Listener'; \
             step lower-create touch {lower}/planted",
            lower = lower.display()
        ),
    );
    let step = |name: &str| -> String {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in {out}"))
            .to_owned()
    };
    // A package file is root's in the lower and overlay checks the runner against it: the
    // runner can neither write nor chmod it, so no runner write ever copies a package file up.
    assert!(step("write").contains("Permission denied"), "{out}");
    assert!(step("chmod").contains("Operation not permitted"), "{out}");
    // The runtime's root is the runner's (the upper's root): a deletion there is a whiteout
    // in the upper, a file of its own is written, appended and chmod-ed in the upper, and so
    // is a set-id file (inert, below).
    assert!(step("rm").starts_with("0"), "{out}");
    assert!(step("setid").starts_with("0"), "{out}");
    assert!(step("own").starts_with("0"), "{out}");
    assert_file(&runtime, "mine", b"ab");
    assert_eq!(
        fs::metadata(runtime.join("mine")).unwrap().uid(),
        RUNNER_UID
    );
    assert!(!runtime.join("run.sh").exists());
    // The lower itself is out of reach (the cache's root is root's, 0700 above it).
    assert!(!step("lower-write").starts_with("0"), "{out}");
    assert!(!step("lower-create").starts_with("0"), "{out}");
    // Root's own writes through the mount (a runner that escalated) are copied up too.
    fs::write(runtime.join("bin/Runner.Worker.dll"), b"root-evil").unwrap();
    assert_eq!(fingerprint(&lower).unwrap(), before, "the lower changed");
    assert_file(&lower, "bin/Runner.Listener", b"#!/bin/sh\necho listener\n");
    assert!(lower.join("run.sh").exists());
    // A set-id bit on the mount is inert (`nosuid`).
    let opts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = opts
        .lines()
        .find(|l| l.contains(&format!(" {} ", runtime.display())))
        .unwrap();
    assert!(line.contains("nosuid"), "{line}");
    // Removal: unmount, then only what the job wrote.
    let name = runner_manager_crds::names::short_hex(id);
    let removed = remove_runtime_named(host.dir.path(), &name).unwrap();
    assert!(matches!(removed, EphemeralRemoval::Removed { .. }));
    assert!(!runtime.exists());
    assert!(!mounted(&runtime));
    assert!(!overlay::work_dir(&runtime).unwrap().exists());
    host.cache.release("a-1");
    // The next launch's view is the package as verified.
    let (_, next) = host.ephemeral("a-2").await;
    assert_file(&next, "bin/Runner.Listener", b"#!/bin/sh\necho listener\n");
    assert_file(&next, "bin/Runner.Worker.dll", b"worker");
    assert!(next.join("run.sh").exists() && next.join("externals").exists());
    assert!(!next.join("setid").exists());
    assert_eq!(fingerprint(&lower).unwrap(), before);
    overlay::unmount(&next).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_edited_behind_the_cache_is_caught_by_the_next_launch_and_reinstalled() {
    let host = Host::new();
    let (_, first) = host.ephemeral("a-1").await;
    overlay::unmount(&first).unwrap();
    host.cache.release("a-1");
    // Someone with root on the node edits the cache's tree.
    fs::write(host.lower().join("bin/Runner.Listener"), b"tampered").unwrap();
    let (_, second) = host.ephemeral("a-2").await;
    // Found by the walk after the mount (the one walk of a warm launch), unmounted, reinstalled
    // from the kept archive and mounted again: the view is the verified package.
    assert_file(
        &second,
        "bin/Runner.Listener",
        b"#!/bin/sh\necho listener\n",
    );
    overlay::unmount(&second).unwrap();
}

impl Host {
    /// A second cache on the same root, as a restarted agent builds it: no trust in memory.
    fn restarted_cache(&self) -> PackageCache {
        let downloader = Downloader::new(RetryPolicy::PRODUCTION, Timeouts::PRODUCTION).unwrap();
        PackageCache::new(self.dir.path().join("packages"), downloader)
            .unwrap()
            .with_materializer(Materializer::Overlay)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_cache_proves_the_live_lower_in_place_instead_of_removing_it() {
    let host = Host::new();
    let (_, first) = host.ephemeral("a-1").await;
    let lower_inode = fs::metadata(host.lower()).unwrap().ino();
    // The agent restarts: a new cache on the same root, the adopted runner still mounted.
    let cache = host.restarted_cache();
    cache.restore_lease("a-1", &host.sha);
    let second = create_ephemeral_runtime(host.dir.path(), Uuid::new_v4()).unwrap();
    cache
        .materialize("a-2", host.package(), &second, RuntimeKind::Ephemeral)
        .await
        .unwrap();
    // The running job's next exec of a package file still finds it through the FIRST mount.
    assert_file(&first, "bin/Runner.Listener", b"#!/bin/sh\necho listener\n");
    assert_eq!(fs::metadata(host.lower()).unwrap().ino(), lower_inode);
    assert_file(&second, "externals/node20/bin/node", b"node");
    overlay::unmount(&second).unwrap();
    overlay::unmount(&first).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_cache_keeps_a_tampered_lower_that_a_mount_still_uses() {
    let host = Host::new();
    let (_, first) = host.ephemeral("a-1").await;
    fs::write(host.lower().join("config.sh"), b"tampered").unwrap();
    // No lease restored (a crash before the journal named it): the mount alone protects it.
    let cache = host.restarted_cache();
    let second = create_ephemeral_runtime(host.dir.path(), Uuid::new_v4()).unwrap();
    let refused = cache
        .materialize("a-2", host.package(), &second, RuntimeKind::Ephemeral)
        .await;
    assert!(
        matches!(
            refused,
            Err(runner_manager_node_agent::packages::PackageError::TreeInUse)
        ),
        "{refused:?}"
    );
    assert!(!mounted(&second));
    assert_file(&first, "run.sh", b"#!/bin/sh\n");
    // Once nothing runs on it, the next launch replaces it with the verified package.
    overlay::unmount(&first).unwrap();
    cache
        .materialize("a-3", host.package(), &second, RuntimeKind::Ephemeral)
        .await
        .unwrap();
    assert_file(&second, "config.sh", b"#!/bin/sh\n");
    overlay::unmount(&second).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_keeps_a_real_work_across_the_unmount_and_its_scrub_unmounts_first() {
    let host = Host::new();
    let slots = host.dir.path().join("slots");
    let owner = SlotOwner {
        namespace: "team",
        policy_uid: "uid-1",
    };
    let slot = prepare_slot(&slots, "team", "uid-1", 1).unwrap().path;
    fs::create_dir(slot.join("_work")).unwrap();
    fs::write(slot.join("_work/warm"), b"from the last job").unwrap();
    let placement = WorkspacePlacement::slot(1, slot.display().to_string()).unwrap();
    for (round, attempt) in ["s-1", "s-2"].into_iter().enumerate() {
        prepare_slot(&slots, "team", "uid-1", 1).unwrap();
        host.overlaid(attempt, &slot, RuntimeKind::PersistentSlot)
            .await;
        assert!(mounted(&slot));
        // The retained workspace is visible through the mount.
        assert_file(&slot, "_work/warm", b"from the last job");
        fs::write(slot.join(format!("_work/job-{round}")), b"checkout").unwrap();
        fs::write(slot.join(".runner"), b"identity").unwrap();
        fs::write(slot.join("bin/Runner.Listener"), b"job-edited").unwrap();
        let scrubbed = scrub_slot(&placement, &slots, owner).unwrap();
        assert!(matches!(scrubbed, Scrubbed::Clean { .. }), "{scrubbed:?}");
        host.cache.release(attempt);
        assert!(!mounted(&slot), "the scrub left the slot mounted");
        // `_work` is a real directory of the slot, with every job's writes.
        let work = fs::symlink_metadata(slot.join("_work")).unwrap();
        assert!(work.is_dir());
        assert_eq!(work.dev(), fs::metadata(&slots).unwrap().dev());
        for r in 0..=round {
            assert!(slot.join(format!("_work/job-{r}")).exists());
        }
        let mut left: Vec<_> = fs::read_dir(&slot)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        left.sort();
        assert_eq!(left, vec![std::ffi::OsString::from("_work")]);
        assert_eq!(
            fs::read(host.lower().join("bin/Runner.Listener")).unwrap(),
            b"#!/bin/sh\necho listener\n"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_finds_its_mounts_and_the_sweep_unmounts_unclaimed_ones() {
    let host = Host::new();
    // A launch mounted, then the agent died before it journalled anything more (the crash
    // boundary after materialize): the mount and the runtime are all that is left.
    let (id, runtime) = host.ephemeral("a-1").await;
    fs::write(runtime.join(".runner"), b"half-launched").unwrap();
    drop(host.cache);
    let runners = host.dir.path().join("runners");
    assert_eq!(
        overlay::overlays_under(&runners).unwrap(),
        vec![runtime.clone()]
    );
    let name = runner_manager_crds::names::short_hex(id);
    assert_eq!(runtime_names(host.dir.path()).unwrap(), vec![name.clone()]);
    // The sweep's removal of an unclaimed name: unmounted first, nothing of it left.
    remove_runtime_named(host.dir.path(), &name).unwrap();
    assert!(overlay::overlays_under(&runners).unwrap().is_empty());
    assert!(!runtime.exists());
    assert!(runtime_names(host.dir.path()).unwrap().is_empty());
    // A workdir orphaned alone (a crash between the two removals) is listed and removed too.
    let work = overlay::work_dir(&runtime).unwrap();
    fs::create_dir_all(work.join("work")).unwrap();
    assert_eq!(runtime_names(host.dir.path()).unwrap(), vec![name.clone()]);
    assert_eq!(
        remove_runtime_named(host.dir.path(), &name).unwrap(),
        EphemeralRemoval::AlreadyGone
    );
    assert!(!work.exists());
}

#[test]
fn a_busy_mount_is_detached_so_its_runtime_can_still_go() {
    let dir = tempfile::tempdir().unwrap();
    let lower = dir.path().join("lower");
    let runtime = dir.path().join("rt");
    fs::create_dir_all(&lower).unwrap();
    fs::write(lower.join("f"), b"x").unwrap();
    fs::create_dir(&runtime).unwrap();
    overlay::mount_package(&lower, &runtime).unwrap();
    // A late child of the runner still holds a file inside.
    let held = fs::File::open(runtime.join("f")).unwrap();
    assert_eq!(overlay::unmount(&runtime).unwrap(), Unmounted::Detached);
    assert!(!mounted(&runtime));
    drop(held);
    assert_eq!(overlay::unmount(&runtime).unwrap(), Unmounted::NotMounted);
}

#[test]
fn unmount_leaves_alone_what_is_not_the_agents_package_overlay() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("rt");
    let lower = dir.path().join("lower");
    let (upper, work) = (dir.path().join("upper"), dir.path().join("work"));
    for d in [&target, &lower, &upper, &work] {
        fs::create_dir(d).unwrap();
    }
    let run = |cmd: &str, args: &[&str]| {
        let status = std::process::Command::new(cmd)
            .args(args)
            .arg(&target)
            .status()
            .unwrap();
        assert!(status.success(), "{cmd} {args:?}");
    };
    // Another filesystem.
    run("mount", &["-t", "tmpfs", "not-ours"]);
    assert_eq!(overlay::unmount(&target).unwrap(), Unmounted::NotMounted);
    assert!(mounted(&target));
    run("umount", &[]);
    // Someone else's overlay (another source).
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    run("mount", &["-t", "overlay", "someone-else", "-o", &opts]);
    assert_eq!(overlay::unmount(&target).unwrap(), Unmounted::NotMounted);
    assert!(mounted(&target));
    run("umount", &[]);
    // The agent's own overlay under another mount: only the topmost counts.
    overlay::mount_package(&lower, &target).unwrap();
    run("mount", &["-t", "tmpfs", "not-ours"]);
    assert_eq!(overlay::unmount(&target).unwrap(), Unmounted::NotMounted);
    run("umount", &[]);
    assert_eq!(
        overlay::unmount(&target).unwrap(),
        Unmounted::Unmounted { layers: 1 }
    );
    assert!(!mounted(&target));
}

fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let p = out[i].clone();
        if fs::symlink_metadata(&p).unwrap().is_dir() {
            for e in fs::read_dir(&p).unwrap() {
                out.push(e.unwrap().path());
            }
        }
        i += 1;
    }
    out
}
