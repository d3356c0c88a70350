//! Materialize and scrub benchmarks (DESIGN §10), each beside its baseline in the same run:
//! materialize (the cache's checked copy + verification of every byte: hashed as copied, or
//! cloned from a proven origin whose fingerprint held across the copy) vs `cp -a`, scrub of a slot vs `rm -rf` of the same
//! entries, ephemeral removal vs `rm -rf`, plus fingerprint and install (extract + hash) times.
//!
//! `cargo bench -p runner-manager-node-agent --bench workspace_packages -- --quick` (900 files,
//! 20 MB: for `make test`); without `--quick`, the full 9,000-file / 200 MB tree;
//! `RM_BENCH_ONLY=caches` runs the dependency-cache section alone. The trees are
//! built under `RM_BENCH_DIR` (default: the system temp dir); point it at a reflink-capable
//! volume (XFS with `reflink=1`, btrfs) to measure clones.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use runner_manager_crds::attempt::WorkspacePlacement;
use runner_manager_node_agent::packages::contents::{CopyCheck, PackageContents, RetainedWork};
use runner_manager_node_agent::packages::copy::{copy_tree, copy_tree_checked};
use runner_manager_node_agent::packages::extract::{ExtractLimits, extract_tar_gz};
use runner_manager_node_agent::packages::fingerprint::fingerprint;
use runner_manager_node_agent::packages::origin::{prove_origin, still_intact};
use runner_manager_node_agent::packages::overlay;
use runner_manager_node_agent::workspace::ephemeral::{
    create_ephemeral_runtime, remove_ephemeral_runtime, remove_runtime_named,
};
use runner_manager_node_agent::workspace::prepare::prepare_slot;
use runner_manager_node_agent::workspace::scrub::{Scrubbed, scrub_slot};
use runner_manager_node_agent::workspace::scrub_plan::SlotOwner;
use uuid::Uuid;

#[path = "../tests/node_agent/workspace_support/mod.rs"]
mod workspace_support;
use workspace_support::wide_tree;

struct Shape {
    name: &'static str,
    small_files: usize,
    large_files: usize,
    large_size: usize,
    work_files: usize,
    runs: usize,
}

const QUICK: Shape = Shape {
    name: "quick",
    small_files: 890,
    large_files: 10,
    large_size: 1_250_000,
    work_files: 300,
    runs: 3,
};

const FULL: Shape = Shape {
    name: "full",
    small_files: 8_900,
    large_files: 100,
    large_size: 1_250_000,
    work_files: 3_000,
    // Five, not three: on a 2-core machine shared with builds a single run can be off by 2×.
    runs: 5,
};

impl Shape {
    /// This shape's runner package under `root` ([`build_tree`]): (files, bytes).
    fn package_tree(&self, root: &Path, seed: u64) -> (usize, u64) {
        build_tree(
            root,
            self.small_files,
            self.large_files,
            self.large_size,
            seed,
        )
    }
}

/// Deterministic incompressible bytes (xorshift), so no filesystem or gzip shortcut applies.
struct Bytes(u64);

impl Bytes {
    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            let v = self.0.to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// A runner-package-shaped tree: `bin/`, `externals/<n>/…`, small files of 1–16 KiB and a
/// few large ones. Returns (files, bytes).
fn build_tree(
    root: &Path,
    files: usize,
    large: usize,
    large_size: usize,
    seed: u64,
) -> (usize, u64) {
    let mut rng = Bytes(seed | 1);
    let mut buf = vec![0u8; large_size.max(16 * 1024)];
    let mut total = 0u64;
    for i in 0..files + large {
        let dir = if i % 10 == 0 {
            root.join("bin")
        } else {
            root.join(format!("externals/m{}/lib{}", i % 40, i % 7))
        };
        fs::create_dir_all(&dir).unwrap();
        let size = if i < large {
            large_size
        } else {
            1024 + (i * 1531) % (15 * 1024)
        };
        rng.fill(&mut buf[..size]);
        let mut f = fs::File::create(dir.join(format!("f{i}.dll"))).unwrap();
        f.write_all(&buf[..size]).unwrap();
        total += size as u64;
    }
    (files + large, total)
}

fn time<T>(f: impl FnOnce() -> T) -> (Duration, T) {
    let started = Instant::now();
    let out = f();
    (started.elapsed(), out)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn ratio(a: Duration, b: Duration) -> String {
    format!("{:.2}×", a.as_secs_f64() / b.as_secs_f64())
}

fn run(cmd: &mut Command) {
    let status = cmd.status().unwrap();
    assert!(status.success(), "{cmd:?}");
}

/// Writes back dirty pages before a timed step, so no step pays for the previous one's writes.
/// `cp -a` of `tree` to `dst`, timed after a settle.
fn cp_a(tree: &Path, dst: &Path) -> Duration {
    settle();
    let (t, ()) = time(|| {
        run(Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", tree.display()))
            .arg(dst))
    });
    t
}

/// `rm -rf` of `paths`, timed after a settle.
fn rm_rf(paths: &[PathBuf]) -> Duration {
    settle();
    let (t, ()) = time(|| run(Command::new("rm").arg("-rf").args(paths)));
    t
}

/// Run `ours` and `theirs`, alternating which goes first with round `i`, so neither side
/// always follows the other's writeback.
fn alternating(i: usize, ours: &mut dyn FnMut(), theirs: &mut dyn FnMut()) {
    if i.is_multiple_of(2) {
        ours();
        theirs();
    } else {
        theirs();
        ours();
    }
}

fn settle() {
    run(&mut Command::new("sync"));
}

fn fs_type(path: &Path) -> String {
    let out = Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn main() {
    let shape = if std::env::args().any(|a| a == "--quick") {
        QUICK
    } else {
        FULL
    };
    let base = std::env::var_os("RM_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let dir = tempfile::Builder::new()
        .prefix("rm-bench-")
        .tempdir_in(&base)
        .unwrap();
    let root = dir.path();
    // `RM_BENCH_ONLY=caches`: the dependency-cache section alone.
    if std::env::var("RM_BENCH_ONLY").is_ok_and(|v| v == "caches") {
        println!(
            "mode {}, volume {} ({})",
            shape.name,
            base.display(),
            fs_type(root)
        );
        caches_section(root, &shape);
        return;
    }
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    println!(
        "mode {}, volume {} ({}), {} threads",
        shape.name,
        base.display(),
        fs_type(root),
        threads
    );

    // The package: built, archived, then installed the way the cache installs it.
    let source = root.join("source");
    let (files, bytes) = shape.package_tree(&source, 42);
    let archive = root.join("package.tar.gz");
    {
        let gz = flate2::write::GzEncoder::new(
            fs::File::create(&archive).unwrap(),
            flate2::Compression::fast(),
        );
        let mut tar = tar::Builder::new(gz);
        tar.append_dir_all(".", &source).unwrap();
        tar.into_inner().unwrap().finish().unwrap();
    }
    fs::remove_dir_all(&source).unwrap();
    let tree = root.join("packages/pkg");
    fs::create_dir_all(&tree).unwrap();
    let (install, contents): (_, PackageContents) =
        time(|| extract_tar_gz(&archive, &tree, ExtractLimits::default()).unwrap());
    let (fingerprint_time, print) = time(|| fingerprint(&tree).unwrap());
    // What the cache does once per install, on the first launch that clones from the tree.
    settle();
    let (prove_time, proven) = time(|| prove_origin(&tree, &contents, print, threads).unwrap());
    assert!(proven);
    println!("package: {files} files, {:.0} MB", bytes as f64 / 1e6);

    // Materialize vs cp -a, alternating so neither side gets a warmer cache.
    let (mut cp, mut copy_only, mut materialize) = (Vec::new(), Vec::new(), Vec::new());
    let (mut reflinked, mut check) = (0, CopyCheck::Full);
    for i in 0..shape.runs {
        let dst = root.join(format!("cp-{i}"));
        cp.push(cp_a(&tree, &dst));
        let runtime = root.join(format!("mat-{i}"));
        fs::create_dir(&runtime).unwrap();
        settle();
        // The same steps as `PackageCache::materialize`, minus the holds and the lease.
        let (t_copy, report) =
            time(|| copy_tree_checked(&tree, &runtime, &contents, threads).unwrap());
        assert_eq!(report.differing, 0);
        let (t_verify, verdict) = time(|| {
            let intact = report.reflinked > 0 && still_intact(&tree, print);
            check = report.check(intact);
            contents
                .verify_copy(&runtime, RetainedWork::Include, check, threads)
                .unwrap()
        });
        verdict.unwrap();
        reflinked = report.reflinked;
        copy_only.push(t_copy);
        materialize.push(t_copy + t_verify);
        fs::remove_dir_all(&dst).unwrap();
        fs::remove_dir_all(&runtime).unwrap();
    }
    let (cp, copy_only, materialize) = (median(cp), median(copy_only), median(materialize));

    // Scrub a slot holding the package and a large `_work` vs `rm -rf` of the same entries.
    let slots = root.join("slots");
    let owner = SlotOwner {
        namespace: "team",
        policy_uid: "uid",
    };
    let (mut scrub, mut rm) = (Vec::new(), Vec::new());
    for i in 0..shape.runs {
        let make = |n: u32| {
            let slot = prepare_slot(&slots, "team", "uid", n).unwrap().path;
            copy_tree(&tree, &slot, threads).unwrap();
            build_tree(
                &slot.join("_work/repo"),
                shape.work_files,
                0,
                0,
                7 + u64::from(n),
            );
            for state in [".runner", ".credentials", ".github-runner-id"] {
                fs::write(slot.join(state), b"x").unwrap();
            }
            slot
        };
        let n = 2 * i as u32 + 1;
        // Which tree is made first alternates too: on XFS the one made last removes faster.
        let (a, b) = if i % 2 == 0 {
            let a = make(n);
            (a, make(n + 1))
        } else {
            let b = make(n + 1);
            (make(n), b)
        };
        let placement = WorkspacePlacement::slot(n, a.to_str().unwrap()).unwrap();
        let entries: Vec<PathBuf> = fs::read_dir(&b)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().is_some_and(|n| n != "_work"))
            .collect();
        let mut ours = || {
            settle();
            let (t, scrubbed) = time(|| scrub_slot(&placement, &slots, owner).unwrap());
            assert!(matches!(scrubbed, Scrubbed::Clean { .. }));
            scrub.push(t);
        };
        let mut theirs = || rm.push(rm_rf(&entries));
        alternating(i, &mut ours, &mut theirs);
    }
    let (scrub, rm) = (median(scrub), median(rm));

    // Ephemeral removal vs rm -rf of a runtime holding the package.
    let (mut eph, mut rm_eph) = (Vec::new(), Vec::new());
    for i in 0..shape.runs {
        let id = Uuid::from_u128(0x1000 + i as u128);
        let runtime = create_ephemeral_runtime(root, id).unwrap();
        let other = root.join(format!("rm-{i}"));
        fs::create_dir(&other).unwrap();
        let made = if i % 2 == 0 {
            [&runtime, &other]
        } else {
            [&other, &runtime]
        };
        for dest in made {
            copy_tree(&tree, dest, threads).unwrap();
        }
        let journalled = runtime.to_str().unwrap().to_owned();
        let mut ours = || {
            settle();
            let (t, _) = time(|| remove_ephemeral_runtime(root, id, &journalled).unwrap());
            eph.push(t);
        };
        let mut theirs = || rm_eph.push(rm_rf(std::slice::from_ref(&other)));
        alternating(i, &mut ours, &mut theirs);
    }
    let (eph, rm_eph) = (median(eph), median(rm_eph));

    let copy_path = if reflinked > 0 {
        format!("reflink (FICLONE, {reflinked} of {files} files cloned)")
    } else {
        "parallel checked copy (read, hash, write each file once; the volume cannot clone)"
            .to_owned()
    };
    println!("copy path: {copy_path}; after the copy: {check:?}");
    println!("| what | ours | baseline | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| materialize (checked copy + verify) | {} | `cp -a` {} | {} |",
        ms(materialize),
        ms(cp),
        ratio(materialize, cp)
    );
    println!(
        "| materialize, copy only | {} | `cp -a` {} | {} |",
        ms(copy_only),
        ms(cp),
        ratio(copy_only, cp)
    );
    println!(
        "| scrub slot (package + `_work` of {} files kept) | {} | `rm -rf` entries {} | {} |",
        shape.work_files,
        ms(scrub),
        ms(rm),
        ratio(scrub, rm)
    );
    println!(
        "| remove ephemeral runtime | {} | `rm -rf` {} | {} |",
        ms(eph),
        ms(rm_eph),
        ratio(eph, rm_eph)
    );
    println!(
        "| fingerprint the package tree | {} | | |",
        ms(fingerprint_time)
    );
    println!(
        "| install (extract + hash from .tar.gz) | {} | | |",
        ms(install)
    );
    println!(
        "| prove the tree (once per install, first clone only) | {} | | |",
        ms(prove_time)
    );
    println!("(median of {} runs each, warm page cache)", shape.runs);
    overlay_section(root, &shape, &tree, &contents, print, threads);
    caches_section(root, &shape);
    pathological(root, &shape, threads);
}

/// Reads every byte of the files under `dir` (a tool finding its cache warm: it reads what it
/// would otherwise fetch). Returns the bytes read.
fn read_all(dir: &Path) -> u64 {
    let mut total = 0;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                todo.push(e.path());
            } else {
                total += fs::read(e.path()).unwrap().len() as u64;
            }
        }
    }
    total
}

/// Issue 31 item 2: a dependency cache of the package's size (`spec.caches`, `caches::CacheRoot`
/// as the agent drives it). Cold: an empty namespace, the job fetches every file (from a local
/// "registry" directory: a network would be slower) into its cache, and the trusted job's writes
/// are committed at release. Warm: the next runner mounts the committed generation and reads
/// every byte (the tool finds everything). Baseline, same run: `cp -a` of the registry into a
/// plain directory (the install every job repeats without a cache).
fn caches_section(root: &Path, shape: &Shape) {
    use runner_manager_node_agent::caches::{CacheRoot, Released};
    if let Err(e) = overlay::probe(root) {
        println!();
        println!("dependency caches: not measured, the probe mount failed here ({e})");
        return;
    }
    let registry = root.join("registry");
    let (files, bytes) = shape.package_tree(&registry, 7);
    let (mut cold, mut commit, mut warm, mut attach, mut baseline) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..shape.runs {
        // A fresh namespace each run: cold means empty.
        let ns = format!("bench/github.com/acme/run{i}");
        let caches = CacheRoot::new(&root.join(format!("host{i}")), 0, u64::MAX);
        settle();
        let (t_cold, mount) = time(|| {
            let mount = caches.attach("00000000c01d", &ns, 0).unwrap();
            run(Command::new("cp")
                .arg("-a")
                .arg(&registry)
                .arg(mount.join("npm")));
            mount
        });
        caches.keep_writes("00000000c01d").unwrap();
        drop(mount);
        settle();
        let (t_commit, released) = time(|| caches.release("00000000c01d", true).unwrap());
        assert!(
            matches!(released, Released::Committed { .. }),
            "{released:?}"
        );
        cold.push(t_cold);
        commit.push(t_commit);
        settle();
        let (t_attach, mount) = time(|| caches.attach("00000000a4a4", &ns, 0).unwrap());
        let (t_warm, read) = time(|| read_all(&mount.join("npm")));
        assert_eq!(read, bytes, "the warm cache holds every byte");
        assert_eq!(
            caches.release("00000000a4a4", true).unwrap(),
            Released::Discarded
        );
        attach.push(t_attach);
        warm.push(t_warm + t_attach);
        let plain = root.join(format!("plain{i}"));
        settle();
        let (t_cp, ()) = time(|| run(Command::new("cp").arg("-a").arg(&registry).arg(&plain)));
        baseline.push(t_cp);
        fs::remove_dir_all(&plain).unwrap();
        fs::remove_dir_all(root.join(format!("host{i}"))).unwrap();
    }
    let (cold, commit, warm, attach, baseline) = (
        median(cold),
        median(commit),
        median(warm),
        median(attach),
        median(baseline),
    );
    println!();
    println!(
        "dependency cache of {files} files, {:.0} MB (median of {} runs; the registry is a local directory):",
        bytes as f64 / 1e6,
        shape.runs
    );
    println!("| step | ours | baseline `cp -a` into a plain directory | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| cold: mount an empty cache, fetch every file into it | {} | {} | {} |",
        ms(cold),
        ms(baseline),
        ratio(cold, baseline)
    );
    println!(
        "| commit the trusted job's writes (unmount, clone, apply, publish) | {} | | |",
        ms(commit)
    );
    println!(
        "| warm: mount the committed generation ({}), read every byte | {} | {} | {} |",
        ms(attach),
        ms(warm),
        ms(baseline),
        ratio(warm, baseline)
    );
}

/// This process's CPU time so far (user + system, every thread): `/proc/self/stat` fields 14
/// and 15, in clock ticks (100 per second on Linux).
fn cpu() -> Duration {
    let stat = fs::read_to_string("/proc/self/stat").unwrap();
    // The command name (field 2) may hold spaces; fields are counted after its `)`.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<u64> = rest
        .split(' ')
        .skip(11)
        .take(2)
        .map(|v| v.parse().unwrap())
        .collect();
    Duration::from_millis((f[0] + f[1]) * 10)
}

/// Issue 15 item 9: the overlay materialize (the tree's fingerprint checked, the mount, the
/// fingerprint again: what `PackageCache` does per launch once the tree is proven) beside `cp -a`
/// and the checked copy in the same run, the agent's CPU per launch for each, and ephemeral
/// removal after a job wrote a `_work` of `work_files` files: unmount + drop the upper vs
/// `rm -rf` (and our removal) of a copied runtime holding the package and the same `_work`.
fn overlay_section(
    root: &Path,
    shape: &Shape,
    tree: &Path,
    contents: &PackageContents,
    print: [u8; 32],
    threads: usize,
) {
    if let Err(e) = overlay::probe(root) {
        println!();
        println!("overlay: not measured, the probe mount failed here ({e})");
        return;
    }
    let (mut ovl, mut ovl_cpu, mut cp, mut checked, mut checked_cpu) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut ovl_rm, mut copy_rm, mut rm_rf) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..shape.runs {
        // Overlay materialize.
        let id = Uuid::from_u128((0x2000 + i as u128) << 80);
        let runtime = create_ephemeral_runtime(root, id).unwrap();
        settle();
        let c0 = cpu();
        let (t, ()) = time(|| {
            assert!(still_intact(tree, print));
            overlay::mount_package(tree, &runtime).unwrap();
            assert!(still_intact(tree, print));
        });
        ovl_cpu.push(cpu() - c0);
        ovl.push(t);
        // The checked copy, as the cache does it on a volume that cannot clone.
        let copied_id = Uuid::from_u128((0x3000 + i as u128) << 80);
        let copied = create_ephemeral_runtime(root, copied_id).unwrap();
        settle();
        let c0 = cpu();
        let (t, ()) = time(|| {
            let report = copy_tree_checked(tree, &copied, contents, threads).unwrap();
            assert_eq!(report.differing, 0);
            let check = report.check(report.reflinked > 0 && still_intact(tree, print));
            contents
                .verify_copy(&copied, RetainedWork::Include, check, threads)
                .unwrap()
                .unwrap();
        });
        checked_cpu.push(cpu() - c0);
        checked.push(t);
        // `cp -a`.
        let plain = root.join(format!("ovl-cp-{i}"));
        cp.push(cp_a(tree, &plain));
        // A job writes the same `_work` into each runtime.
        for dest in [&runtime, &copied, &plain] {
            build_tree(&dest.join("_work/repo"), shape.work_files, 0, 0, 11);
            fs::write(dest.join(".runner"), b"x").unwrap();
        }
        let ovl_name = runner_manager_crds::names::short_hex(id);
        let copied_journal = copied.to_str().unwrap().to_owned();
        let mut steps: [Box<dyn FnMut()>; 3] = [
            Box::new(|| {
                settle();
                let (t, _) = time(|| remove_runtime_named(root, &ovl_name).unwrap());
                ovl_rm.push(t);
            }),
            Box::new(|| {
                settle();
                let (t, _) =
                    time(|| remove_ephemeral_runtime(root, copied_id, &copied_journal).unwrap());
                copy_rm.push(t);
            }),
            Box::new(|| {
                settle();
                let (t, ()) = time(|| run(Command::new("rm").arg("-rf").arg(&plain)));
                rm_rf.push(t);
            }),
        ];
        // Rotating which removal goes first.
        for k in 0..3 {
            (steps[(i + k) % 3])();
        }
        assert!(!runtime.exists() && !copied.exists() && !plain.exists());
    }
    let per = |v: Vec<Duration>| median(v);
    let (ovl, cp, checked) = (per(ovl), per(cp), per(checked));
    let (ovl_cpu, checked_cpu) = (per(ovl_cpu), per(checked_cpu));
    let (ovl_rm, copy_rm, rm_rf) = (per(ovl_rm), per(copy_rm), per(rm_rf));
    println!();
    println!(
        "issue 15 item 9: overlay materialize (median of {} runs)",
        shape.runs
    );
    println!("| what | wall | agent CPU (user+sys) |");
    println!("|---|---|---|");
    println!(
        "| overlay materialize (fingerprint, mount, fingerprint) | {} | {} |",
        ms(ovl),
        ms(ovl_cpu)
    );
    println!(
        "| checked copy + verify (today's materialize) | {} | {} |",
        ms(checked),
        ms(checked_cpu)
    );
    println!("| `cp -a` | {} | (another process) |", ms(cp));
    println!(
        "| remove ephemeral runtime, overlay (unmount + drop the upper: {} `_work` files) | {} | |",
        shape.work_files,
        ms(ovl_rm)
    );
    println!(
        "| remove ephemeral runtime, copied (package + the same `_work`) | {} | |",
        ms(copy_rm)
    );
    println!(
        "| `rm -rf` of a copied runtime (package + the same `_work`) | {} | |",
        ms(rm_rf)
    );
    println!(
        "overlay vs checked copy: {} wall, removal {} of ours on a copy, {} of `rm -rf`",
        ratio(ovl, checked),
        ratio(ovl_rm, copy_rm),
        ratio(ovl_rm, rm_rf)
    );
}

/// Trees no legitimate job makes (issue 14): a chain far deeper than the descriptor limit, and
/// directories far wider than the parallel remover's skeleton. Removal time and the most
/// descriptors open at once, ours beside `rm -rf` of the same tree (GNU `rm` walks with `fts`,
/// which also bounds its descriptors). Descriptors are sampled from `/proc/<pid>/fd` while the
/// removal runs, so a short peak can be missed; ours also counts its own exactly.
fn pathological(root: &Path, shape: &Shape, threads: usize) {
    // Quick (make test): 4,000 levels is still four times the usual 1,024-descriptor soft limit,
    // which is what the chain is there to exceed; 20,000 took ~75 s of make test's bench stage
    // (built twice and removed twice, ours and `rm -rf`'s) to prove nothing more.
    let (depth, wide_dirs, wide_files) = if shape.name == "quick" {
        (4_000, 2_000, 20_000)
    } else {
        (100_000, 10_000, 200_000)
    };
    println!();
    println!(
        "| pathological tree | ours | peak fds ours (counted / sampled) | `rm -rf` | peak fds `rm -rf` (sampled) |"
    );
    println!("|---|---|---|---|---|");
    for (label, build) in [
        (
            format!("a chain {depth} directories deep"),
            Box::new(move |p: &Path| deep_chain(p, depth)) as Box<dyn Fn(&Path)>,
        ),
        (
            format!("{wide_dirs} directories + {wide_files} files in one"),
            Box::new(move |p: &Path| wide_tree(p, wide_dirs, wide_files)),
        ),
    ] {
        let ours_tree = root.join("patho-ours");
        let rm_tree = root.join("patho-rm");
        build(&ours_tree);
        build(&rm_tree);
        settle();
        let baseline = fd_count(std::process::id());
        let sampler = Sampler::start(std::process::id());
        let anchor = rustix::fs::open(
            root,
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        let (ours, removed) = time(|| {
            runner_manager_node_agent::workspace::remove_parallel::remove_entry_at_parallel(
                std::os::fd::AsFd::as_fd(&anchor),
                c"patho-ours",
                runner_manager_node_agent::workspace::remove::EntryKind::Directory,
                threads,
            )
            .unwrap()
        });
        let ours_sampled = sampler.stop().saturating_sub(baseline);
        settle();
        let started = Instant::now();
        let mut child = Command::new("rm").arg("-rf").arg(&rm_tree).spawn().unwrap();
        let mut rm_peak = 0;
        while child.try_wait().unwrap().is_none() {
            rm_peak = rm_peak.max(fd_count(child.id()));
        }
        let rm = started.elapsed();
        assert!(!ours_tree.exists() && !rm_tree.exists());
        println!(
            "| {label} | {} | {} / {ours_sampled} | {} | {rm_peak} |",
            ms(ours),
            removed.peak_open_dirs,
            ms(rm)
        );
    }
}

fn fd_count(pid: u32) -> u64 {
    fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

/// Samples this process's open descriptors on a thread until stopped; the most it saw.
struct Sampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl Sampler {
    fn start(pid: u32) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            // The sampler's own read of /proc/<pid>/fd holds one descriptor.
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(fd_count(pid).saturating_sub(1));
            }
            peak
        });
        Self { stop, thread }
    }

    fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

fn deep_chain(top: &Path, depth: u32) {
    use rustix::fs::{Mode, OFlags};
    fs::create_dir(top).unwrap();
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut dir = rustix::fs::open(top, flags, Mode::empty()).unwrap();
    for _ in 0..depth {
        rustix::fs::mkdirat(&dir, "d", Mode::from_raw_mode(0o755)).unwrap();
        dir = rustix::fs::openat(&dir, "d", flags, Mode::empty()).unwrap();
    }
}
