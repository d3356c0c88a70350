//! Shared set-up for the launch tests: a runtime owned by a runner account with a shell
//! stand-in for `bin/Runner.Listener`, a private cgroup parent per test, and waits on
//! conditions with deadlines.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use runner_manager_node_agent::account::RunnerAccount;
use runner_manager_node_agent::providers::LaunchSpec;
use runner_manager_node_agent::providers::cgroup::{CgroupLimits, CgroupParent};
use runner_manager_node_agent::providers::direct::DirectLauncher;
use secrecy::SecretString;

/// `nobody`: a real unprivileged account present on every Linux host.
pub const RUNNER: RunnerAccount = RunnerAccount {
    uid: 65534,
    gid: 65534,
};

pub const ENTRY_HELPER: &str = env!("CARGO_BIN_EXE_runner-manager-runner-entry");

/// The stand-in listener. It records what it was given (never the JIT itself: only whether it
/// was there; its environment once the JIT is unset), unsets the JIT so nothing it starts
/// inherits it, then behaves per STANDIN_MODE.
const STANDIN: &str = r#"#!/bin/sh
t="$PWD/tmp"
cat /proc/self/cgroup > "$t/cgroup.tmp" && mv "$t/cgroup.tmp" "$t/cgroup"
id -u > "$t/uid"
printf '%s\n' "$@" > "$t/args"
if [ -n "$ACTIONS_RUNNER_INPUT_JITCONFIG" ]; then echo present > "$t/jit"; else echo absent > "$t/jit"; fi
unset ACTIONS_RUNNER_INPUT_JITCONFIG
env > "$t/env.tmp" && mv "$t/env.tmp" "$t/env"
case "$STANDIN_MODE" in
  exit7) exit 7 ;;
  exit0) exit 0 ;;
  escape)
    # A grandchild that leaves its parent's session and process tree.
    setsid sh -c 'echo $$ > "$0/grandchild.pid.tmp"; mv "$0/grandchild.pid.tmp" "$0/grandchild.pid"; exec sleep 1000' "$t" &
    ;;
esac
echo $$ > "$t/ready.tmp" && mv "$t/ready.tmp" "$t/ready"
sleep 1000 &
wait
"#;

/// A test's world: a base dir (0755, so the runner can reach its runtime), a runtime owned by
/// the runner (0700) with the stand-in, and a cgroup parent of its own.
pub struct World {
    pub base: tempfile::TempDir,
    pub runtime: PathBuf,
    pub parent_name: String,
    pub attempt: uuid::Uuid,
}

impl World {
    pub fn new() -> Self {
        let base = tempfile::tempdir().unwrap();
        std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let runtime = base.path().join("rt");
        std::fs::create_dir(&runtime).unwrap();
        std::fs::create_dir(runtime.join("bin")).unwrap();
        std::fs::create_dir(runtime.join("tmp")).unwrap();
        let listener = runtime.join("bin/Runner.Listener");
        std::fs::write(&listener, STANDIN).unwrap();
        std::fs::set_permissions(&listener, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(runtime.join("tmp"), Some(RUNNER.uid), Some(RUNNER.gid)).unwrap();
        std::os::unix::fs::chown(&runtime, Some(RUNNER.uid), Some(RUNNER.gid)).unwrap();
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
        let attempt = uuid::Uuid::new_v4();
        Self {
            base,
            runtime,
            parent_name: format!(
                "runner-manager-test-{}.slice",
                &uuid::Uuid::new_v4().simple().to_string()[..12]
            ),
            attempt,
        }
    }

    pub fn parent(&self) -> CgroupParent {
        CgroupParent::open(&self.parent_name).unwrap()
    }

    pub fn launcher(&self) -> DirectLauncher {
        DirectLauncher::new(self.parent(), PathBuf::from(ENTRY_HELPER))
    }

    /// Start the stand-in in `mode` with a fresh JIT through `launcher`: the arrange step most
    /// launch tests share.
    pub fn start(
        &self,
        launcher: &DirectLauncher,
        mode: &str,
    ) -> runner_manager_crds::attempt::ProcessIdentity {
        use runner_manager_node_agent::providers::RunnerLauncher;
        let (handoff, _) = self.handoff();
        launcher.start(&self.spec(mode), handoff).unwrap()
    }

    /// A fresh JIT handed off in this world's runtime to the runner account, and the JIT's
    /// text (to look for where it must not be).
    pub fn handoff(
        &self,
    ) -> (
        runner_manager_node_agent::handoff::RestrictiveHandoff,
        String,
    ) {
        let (secret, value) = jit();
        let handoff = runner_manager_node_agent::handoff::RestrictiveHandoff::create(
            &self.runtime,
            RUNNER,
            &secret,
        )
        .unwrap();
        (handoff, value)
    }

    /// [`Self::start`] the stand-in sleeping, and wait until it says it is ready.
    pub fn start_sleeping(
        &self,
        launcher: &DirectLauncher,
    ) -> runner_manager_crds::attempt::ProcessIdentity {
        let id = self.start(launcher, "sleep");
        self.wait_for("ready");
        id
    }

    /// [`Self::start`] the stand-in in `mode`, one that exits by itself, and wait (10 s at the
    /// most) until `launcher` no longer sees it alive.
    pub fn start_and_wait_exit(
        &self,
        launcher: &DirectLauncher,
        mode: &str,
    ) -> runner_manager_crds::attempt::ProcessIdentity {
        use runner_manager_node_agent::providers::RunnerLauncher;
        let id = self.start(launcher, mode);
        wait_until(Duration::from_secs(10), || {
            !launcher.inspect(&id).unwrap().is_alive()
        });
        id
    }

    pub fn spec(&self, mode: &str) -> LaunchSpec<'_> {
        let mut environment = BTreeMap::new();
        environment.insert("STANDIN_MODE".to_owned(), mode.to_owned());
        environment.insert(
            "PATH".to_owned(),
            "/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
        );
        LaunchSpec {
            attempt: self.attempt,
            runtime: &self.runtime,
            account: RUNNER,
            environment,
            limits: CgroupLimits::default(),
            cache: None,
        }
    }

    pub fn tmp(&self, name: &str) -> PathBuf {
        self.runtime.join("tmp").join(name)
    }

    /// Reads a file the stand-in writes, once it exists.
    pub fn wait_for(&self, name: &str) -> String {
        read_when_there(&self.tmp(name), Duration::from_secs(10))
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // Kill and remove anything a failed test left behind in its private parent.
        if let Ok(parent) = CgroupParent::open(&self.parent_name) {
            if let Ok(entries) = std::fs::read_dir(parent.path()) {
                for e in entries.flatten() {
                    if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                        let _ = std::fs::write(e.path().join("cgroup.kill"), "1");
                        wait_until(Duration::from_secs(5), || {
                            std::fs::remove_dir(e.path()).is_ok()
                        });
                    }
                }
            }
            let _ = std::fs::remove_dir(parent.path());
        }
    }
}

/// Waits until `cond` holds, failing the test at the deadline.
pub fn wait_until(deadline: Duration, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + deadline;
    while !cond() {
        assert!(
            Instant::now() < until,
            "condition not met within {deadline:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Reads `path` once it exists, failing the test after `within`.
pub fn read_when_there(path: &Path, within: Duration) -> String {
    wait_until(within, || path.exists());
    std::fs::read_to_string(path).unwrap()
}

pub fn jit() -> (SecretString, String) {
    let value = format!("eyJKSVQiOiJ0ZXN0In0-{}", uuid::Uuid::new_v4().simple());
    (SecretString::from(value.clone()), value)
}

/// Every regular file under `dir` (not following links), for "no file holds the JIT".
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                out.push(e.path());
            }
        }
    }
    out
}

/// The pids whose initial environment holds `needle`.
pub fn pids_with_environ_containing(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Ok(env) = std::fs::read(e.path().join("environ"))
            && env.windows(needle.len()).any(|w| w == needle.as_bytes())
        {
            out.push(pid);
        }
    }
    out
}

/// Whether any process's command line holds `needle`.
pub fn any_cmdline_contains(needle: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read(e.path().join("cmdline"))
            .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle.as_bytes()))
    })
}

pub fn handoffs_in(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| runner_manager_node_agent::handoff::is_handoff_name(&e.file_name()))
        .count()
}

/// An unrelated process standing in for whoever got a runner's pid after a recycle, and its
/// `/proc` start time (the caller kills and reaps it).
pub fn recycled_pid_owner() -> (std::process::Child, u64) {
    let owner = std::process::Command::new("sleep")
        .arg("1000")
        .spawn()
        .unwrap();
    let stat = runner_manager_node_agent::process::stat::read_stat(owner.id())
        .unwrap()
        .unwrap();
    (owner, stat.start_time)
}
