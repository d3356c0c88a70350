//! `bin/Runner.Worker spawnclient`: writes `_diag/Worker_*.log` and acts out the job's behaviour.

use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use super::behaviour::{BusyLoad, CacheFile, JobBehaviour};
use super::diag::{DiagKind, DiagLog};
use super::listener::runner_root;
use crate::fake_github::jobs::AcquiredJob;

const EXIT_FAILED: i32 = 1;

/// A path under `_work` that stays there.
fn inside(work: &Path, rel: &str) -> Option<PathBuf> {
    let p = Path::new(rel);
    p.components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then(|| work.join(p))
}

fn write_file(path: &Path, bytes: u64) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let f = std::fs::File::create(path)?;
    let mut w = std::io::BufWriter::new(f);
    let chunk = vec![b'x'; 64 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = usize::try_from(left.min(chunk.len() as u64)).unwrap_or(chunk.len());
        std::io::Write::write_all(&mut w, &chunk[..n])?;
        left -= n as u64;
    }
    std::io::Write::flush(&mut w)
}

/// The job's temp directory: `$TMPDIR` when the launcher set one, else `_work/_temp`.
fn temp_dir(work: &Path) -> PathBuf {
    std::env::var_os("TMPDIR").map_or_else(|| work.join("_temp"), PathBuf::from)
}

/// A chain of `depth` directories: built by changing into each level (its path is far longer
/// than `PATH_MAX`, so no absolute path could name the bottom), then back.
fn build_deep_tree(top: &Path, depth: u32) -> std::io::Result<()> {
    let back = std::env::current_dir()?;
    std::fs::create_dir_all(top)?;
    std::env::set_current_dir(top)?;
    for _ in 0..depth {
        std::fs::create_dir("d")?;
        std::env::set_current_dir("d")?;
    }
    let bottom = std::process::Command::new("mkfifo").arg("fifo").status()?;
    std::os::unix::fs::symlink("/etc", "escape")?;
    std::env::set_current_dir(back)?;
    if !bottom.success() {
        return Err(std::io::Error::other("mkfifo failed"));
    }
    Ok(())
}

/// Where cache file `f` is: under the directory its variable names.
fn cache_path(f: &CacheFile) -> std::io::Result<PathBuf> {
    let dir = std::env::var_os(&f.variable)
        .ok_or_else(|| std::io::Error::other(format!("{} is not set", f.variable)))?;
    inside(Path::new(&dir), &f.path)
        .ok_or_else(|| std::io::Error::other("cache paths must stay under their directory"))
}

fn act(root: &Path, b: &JobBehaviour, log: &mut DiagLog) -> std::io::Result<()> {
    let work = root.join("_work");
    std::fs::create_dir_all(&work)?;
    for f in &b.expect_cache {
        let path = cache_path(f)?;
        let found = std::fs::read_to_string(&path).ok();
        if found != f.content {
            return Err(std::io::Error::other(format!(
                "cache {} holds {found:?}, expected {:?}",
                path.display(),
                f.content
            )));
        }
        log.info(&format!("cache {} as expected", path.display()));
    }
    for f in &b.write_cache {
        let path = cache_path(f)?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, f.content.as_deref().unwrap_or_default())?;
        log.info(&format!("wrote cache {}", path.display()));
    }
    for f in &b.write_files {
        let path = inside(&work, &f.path)
            .ok_or_else(|| std::io::Error::other("write_files paths must stay under _work"))?;
        write_file(&path, f.bytes)?;
        log.info(&format!("wrote {} bytes to _work/{}", f.bytes, f.path));
    }
    if b.fifo_in_tmp {
        let tmp = temp_dir(&work);
        std::fs::create_dir_all(&tmp)?;
        let fifo = tmp.join("standin-job.fifo");
        let status = std::process::Command::new("mkfifo").arg(&fifo).status()?;
        if !status.success() {
            return Err(std::io::Error::other("mkfifo failed"));
        }
        log.info(&format!("left a FIFO at {}", fifo.display()));
    }
    if let Some(depth) = b.deep_tree_depth {
        build_deep_tree(&work.join("deep"), depth)?;
        log.info(&format!("left a tree {depth} directories deep"));
    }
    if let Some(entries) = b.wide_tree_entries {
        let wide = work.join("wide");
        std::fs::create_dir_all(&wide)?;
        for i in 0..entries {
            std::fs::File::create(wide.join(format!("f{i}")))?;
        }
        log.info(&format!("left {entries} files in one directory"));
    }
    if let Some(secs) = b.orphan_child_secs {
        let child = std::process::Command::new("sleep")
            .arg(secs.to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        // Not waited for on purpose: it must outlive the worker and the listener.
        std::fs::write(
            root.join("_diag").join("orphan.pid"),
            child.id().to_string(),
        )?;
        log.info(&format!("spawned orphan pid {}", child.id()));
    }
    for (i, step) in b.steps.iter().enumerate() {
        let out = std::process::Command::new("bash")
            .arg("-e")
            .arg("-c")
            .arg(step)
            .current_dir(&work)
            .stdin(std::process::Stdio::null())
            .output()?;
        for line in String::from_utf8_lossy(&out.stdout)
            .lines()
            .chain(String::from_utf8_lossy(&out.stderr).lines())
        {
            log.info(&format!("step {i}: {line}"));
        }
        if !out.status.success() {
            return Err(std::io::Error::other(format!(
                "step {i} failed ({}): {step}",
                out.status
            )));
        }
        log.info(&format!("step {i} passed"));
    }
    // Written, not only reserved: untouched pages would never count against the cgroup.
    let mut held: Vec<Vec<u8>> = Vec::new();
    if let Some(mib) = b.allocate_mib {
        for _ in 0..mib {
            held.push(vec![0x5a; 1 << 20]);
        }
        log.info(&format!("holding {mib} MiB"));
    }
    match &b.busy {
        Some(load) => busy(&work, load, Duration::from_millis(b.duration_ms), log)?,
        None if b.duration_ms > 0 => std::thread::sleep(Duration::from_millis(b.duration_ms)),
        None => {}
    }
    drop(held);
    if let Some(target) = &b.symlink_work_to {
        std::fs::remove_dir_all(&work)?;
        std::os::unix::fs::symlink(target, &work)?;
        log.info(&format!("replaced _work with a symlink to {target}"));
    }
    Ok(())
}

/// Burns `load` for at most `duration` (or until its `until_file` exists): spinning threads and
/// a writer that syncs each MiB, in this process, so in the runner's cgroup.
fn busy(
    work: &Path,
    load: &BusyLoad,
    duration: Duration,
    log: &mut DiagLog,
) -> std::io::Result<()> {
    use std::io::{Seek, Write};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for _ in 0..load.threads {
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || {
            let mut x: u64 = 1;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..100_000 {
                    x = std::hint::black_box(
                        x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1),
                    );
                }
            }
        }));
    }
    if load.write_mib_per_sec > 0 {
        let stop = stop.clone();
        let path = work.join("busy.bin");
        let per_sec = load.write_mib_per_sec;
        threads.push(std::thread::spawn(move || {
            let Ok(mut f) = std::fs::File::create(&path) else {
                return;
            };
            let chunk = vec![0xa5u8; 1 << 20];
            let mut written = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let second = std::time::Instant::now();
                for _ in 0..per_sec {
                    if written == 64 {
                        let _ = f.rewind();
                        written = 0;
                    }
                    if f.write_all(&chunk).and_then(|()| f.sync_data()).is_err() {
                        return;
                    }
                    written += 1;
                }
                if let Some(rest) = Duration::from_secs(1).checked_sub(second.elapsed()) {
                    std::thread::sleep(rest);
                }
            }
        }));
    }
    log.info(&format!(
        "busy: {} threads, {} MiB/s to disk",
        load.threads, load.write_mib_per_sec
    ));
    let end = std::time::Instant::now() + duration;
    let until = load.until_file.as_deref().map(Path::new);
    while std::time::Instant::now() < end && !until.is_some_and(Path::exists) {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

/// The worker's exit code when the job-started hook failed: the job's conclusion is `failure`.
const HOOK_FAILED: i32 = 1;

/// The real runner's job-started hook (`ACTIONS_RUNNER_HOOK_JOB_STARTED`): a script run with
/// `bash -e` in the job's environment before any step; its failure fails the job, and no step
/// runs. Its output goes to the log, as the real runner shows it in the job's log.
fn job_started_hook(job: &AcquiredJob, log: &mut DiagLog) -> Result<(), String> {
    let Some(hook) = std::env::var_os("ACTIONS_RUNNER_HOOK_JOB_STARTED").filter(|h| !h.is_empty())
    else {
        return Ok(());
    };
    let out = std::process::Command::new("bash")
        .arg("-e")
        .arg(&hook)
        .env("GITHUB_REPOSITORY", &job.repository)
        .env("GITHUB_RUN_ID", job.run_id.to_string())
        .env("GITHUB_JOB", &job.name)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("job-started hook could not run: {e}"))?;
    for line in String::from_utf8_lossy(&out.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&out.stderr).lines())
    {
        log.info(&format!("hook: {line}"));
    }
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "job-started hook failed ({}): no step of job {} ran",
            out.status, job.job_id
        ))
    }
}

/// Runs the worker; returns the process exit code.
#[must_use]
pub fn main(args: &[String]) -> i32 {
    if args.first().map(String::as_str) != Some("spawnclient") {
        eprintln!("Usage: Runner.Worker spawnclient");
        return EXIT_FAILED;
    }
    let Ok(root) = runner_root() else {
        return EXIT_FAILED;
    };
    let Ok(mut log) = DiagLog::create(&root, DiagKind::Worker) else {
        return EXIT_FAILED;
    };
    let mut input = String::new();
    if std::io::stdin().read_to_string(&mut input).is_err() {
        log.line("ERROR", "no job on stdin");
        return EXIT_FAILED;
    }
    let job: AcquiredJob = match serde_json::from_str(&input) {
        Ok(j) => j,
        Err(e) => {
            log.line("ERROR", &format!("unreadable job: {e}"));
            return EXIT_FAILED;
        }
    };
    log.info(&format!(
        "job {} ({}) of {} starting",
        job.job_id, job.name, job.repository
    ));
    if let Err(refusal) = job_started_hook(&job, &mut log) {
        log.line("ERROR", &refusal);
        return HOOK_FAILED;
    }
    if let Err(e) = act(&root, &job.behaviour, &mut log) {
        log.line("ERROR", &format!("job step failed: {e}"));
        return EXIT_FAILED;
    }
    log.info(&format!(
        "job {} finished, exit {}",
        job.job_id, job.behaviour.worker_exit_code
    ));
    job.behaviour.worker_exit_code
}
