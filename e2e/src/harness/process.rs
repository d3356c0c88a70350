//! The project's own binaries as real processes: found beside the test binary in the shared
//! `target/` (`make test` builds them first), killed when dropped, output kept for a failed run.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::wait;

/// The host the simulated GitHub serves on (http).
pub const LOOPBACK: &str = "127.0.0.1";

/// Why a binary could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error(
        "{0} is not built next to the tests; run `cargo build --workspace --bins` (make test does)"
    )]
    NotBuilt(String),
    #[error("starting {0}: {1}")]
    Spawn(String, std::io::Error),
}

/// The path of a workspace binary, next to the running test binary's `deps/` directory.
pub fn binary(name: &str) -> Result<PathBuf, ProcessError> {
    let exe = std::env::current_exe().map_err(|e| ProcessError::Spawn(name.to_owned(), e))?;
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .ok_or_else(|| ProcessError::NotBuilt(name.to_owned()))?;
    let path = dir.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(ProcessError::NotBuilt(name.to_owned()))
    }
}

/// A child process whose stderr lines are collected; killed (SIGKILL) and reaped when dropped.
pub struct Running {
    pub child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("pid", &self.child.id())
            .finish_non_exhaustive()
    }
}

impl Running {
    /// Start `cmd` with stderr captured line by line.
    ///
    /// The operator and the agent refuse plain http and hosts the admin did not list (issue 13,
    /// finding 8); the simulated GitHub serves its API and packages on http://127.0.0.1. So
    /// both are started with the admin flags naming that host, through their environment
    /// (`RM_ALLOW_HTTP_HOSTS`, `RM_DOWNLOAD_HOSTS`), unless the test set them itself — an attack
    /// test sets them empty to see http refused.
    pub fn spawn(name: &str, mut cmd: Command) -> Result<Self, ProcessError> {
        let set = |cmd: &Command, key: &str| cmd.get_envs().any(|(k, _)| k == key);
        let loopback: &[&str] = match name {
            "runner-manager-operator" => &["RM_ALLOW_HTTP_HOSTS", "RM_DOWNLOAD_HOSTS"],
            "runner-manager-node-agent" => &["RM_ALLOW_HTTP_HOSTS"],
            _ => &[],
        };
        for key in loopback {
            if !set(&cmd, key) {
                cmd.env(key, LOOPBACK);
            }
        }
        // The simulated GitHub's Actions service (the scale-set protocol) is on its loopback
        // host, as GitHub's is on a host of its own: the admin lists it next to github.com.
        if name == "runner-manager-operator" && !set(&cmd, "RM_GITHUB_HOSTS") {
            cmd.env("RM_GITHUB_HOSTS", format!("github.com,{LOOPBACK}"));
        }
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| ProcessError::Spawn(name.to_owned(), e))?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        if let Some(stderr) = child.stderr.take() {
            let sink = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    sink.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(line);
                }
            });
        }
        Ok(Self { child, lines })
    }

    /// Every stderr line so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Send SIGTERM (graceful stop).
    pub fn terminate(&self) -> std::io::Result<()> {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other("kill -TERM failed"))
        }
    }

    /// Waits (at most `within`) for the process to exit, by itself or on a signal already sent;
    /// `what` names the wait in the error.
    pub async fn exited(
        &mut self,
        within: Duration,
        what: &str,
    ) -> Result<std::process::ExitStatus, wait::TimedOut> {
        let child = &mut self.child;
        wait::until(within, what, || {
            let status = child.try_wait().ok().flatten();
            async move { status }
        })
        .await
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where an operator process serves, from the JSON line it logs once it does
/// (`--log-format json`: `fields.broker`, `fields.admission`, `fields.health`,
/// `fields.webhook`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorAddrs {
    pub broker: String,
    pub admission: String,
    pub health: String,
    pub webhook: String,
}

/// Waits until `operator` has logged where it serves; the error carries its output so far.
pub async fn operator_addrs(
    operator: &Running,
    deadline: std::time::Duration,
) -> Result<OperatorAddrs, String> {
    super::wait::until(deadline, "the operator to log its addresses", || {
        let lines = operator.lines();
        async move {
            lines.iter().find_map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).ok()?;
                let f = &v["fields"];
                Some(OperatorAddrs {
                    broker: f["broker"].as_str()?.to_owned(),
                    admission: f["admission"].as_str()?.to_owned(),
                    health: f["health"].as_str()?.to_owned(),
                    webhook: f["webhook"].as_str()?.to_owned(),
                })
            })
        }
    })
    .await
    .map_err(|e| format!("{e}: {:?}", operator.lines()))
}

/// A process's resident set size in KiB (0 once it is gone).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// User + system CPU seconds a process has used.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name (which may hold spaces) come state, then numeric fields; utime and
    // stime are the 14th and 15th fields of the line, in clock ticks (100 per second here).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}
