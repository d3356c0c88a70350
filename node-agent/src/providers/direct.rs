//! The direct launcher: the agent on the host forks the entry helper, which joins the
//! attempt's own cgroup v2 (`<parent>/rm-<12hex>`, limits already written) before it reads the
//! handoff and execs the listener. The cgroup is not the agent's, so the runner outlives an
//! agent restart; `cgroup.kill` stops it with everything it started; death is proven by an
//! empty cgroup and a gone pid+start time before the cgroup is removed.

use std::collections::HashMap;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use runner_manager_crds::attempt::{Launcher, ProcessIdentity};

use super::cgroup::{self, CgroupParent, attempt_cgroup_name};
use super::launcher::{LaunchSpec, RunnerLauncher, StartError, StartFailure, StopError, Stopped};
use crate::agent::fault::{self, LaunchFault};
use crate::entry::{EntryArgs, EntryFailure, FAILED, LISTENER, READY, helper_environment};
use crate::handoff::RestrictiveHandoff;
use crate::process::stat::{read_cgroup_v2, read_stat};
use crate::process::{Inspection, identity_file, inspect};

/// How long the helper has to join, take the handoff and exec.
pub const DEFAULT_READY_DEADLINE: Duration = Duration::from_secs(10);
/// How long a stop waits for the cgroup to empty.
pub const DEFAULT_STOP_DEADLINE: Duration = Duration::from_secs(10);

/// The direct launcher.
#[derive(Debug)]
pub struct DirectLauncher {
    parent: CgroupParent,
    entry_helper: PathBuf,
    ready_deadline: Duration,
    stop_deadline: Duration,
    /// Children this agent started and has not reaped, by pid. A pid held here cannot be
    /// recycled (it is not reaped), which is what makes signalling it directly safe.
    children: Mutex<HashMap<u32, Child>>,
    /// Exit statuses of reaped children, by pid and start time.
    exits: Mutex<HashMap<(u32, u64), ExitStatus>>,
}

impl DirectLauncher {
    pub fn new(parent: CgroupParent, entry_helper: PathBuf) -> Self {
        Self {
            parent,
            entry_helper,
            ready_deadline: DEFAULT_READY_DEADLINE,
            stop_deadline: DEFAULT_STOP_DEADLINE,
            children: Mutex::new(HashMap::new()),
            exits: Mutex::new(HashMap::new()),
        }
    }

    pub fn with_deadlines(mut self, ready: Duration, stop: Duration) -> Self {
        self.ready_deadline = ready;
        self.stop_deadline = stop;
        self
    }

    pub fn parent(&self) -> &CgroupParent {
        &self.parent
    }

    /// Reaps owned children that have exited, remembering their status.
    fn reap(&self) {
        let Ok(mut children) = self.children.lock() else {
            return;
        };
        let mut done = Vec::new();
        for (pid, child) in children.iter_mut() {
            // The start time must be read before the reap frees the pid.
            let start = read_stat(*pid).ok().flatten().map(|s| s.start_time);
            if let Ok(Some(status)) = child.try_wait() {
                done.push(*pid);
                if let (Some(start), Ok(mut exits)) = (start, self.exits.lock()) {
                    exits.insert((*pid, start), status);
                }
            }
        }
        for pid in done {
            children.remove(&pid);
        }
    }

    /// Post-spawn failure: the child existed, so the JIT may be consumed and the start is never
    /// retried. Kill it (cgroup and the unreaped child itself, in case it had not joined yet),
    /// and prove it dead; if that cannot be proven, leave a durable identity and say so.
    fn abort(
        &self,
        mut child: Child,
        cgroup_dir: &Path,
        identity: Option<ProcessIdentity>,
        runtime: &Path,
        failure: StartFailure,
    ) -> StartError {
        // A stop that does not take (the post-spawn tests' fault) leaves the child running.
        let (reaped, empty) = if fault::fails(LaunchFault::StopAfterStartFailure) {
            (false, false)
        } else {
            let _ = cgroup::kill(cgroup_dir);
            // Safe by pid: the child is ours and unreaped, so its pid cannot have been recycled.
            let _ = child.kill();
            let reaped = wait_child(&mut child, self.stop_deadline);
            let empty = cgroup::wait_empty(cgroup_dir, self.stop_deadline, || {}).unwrap_or(false);
            (reaped, empty)
        };
        if reaped && empty {
            let _ = cgroup::remove(cgroup_dir);
            if identity.is_some() {
                let _ = identity_file::remove(runtime);
            }
            return StartError {
                failure,
                child_existed: true,
                live: None,
            };
        }
        // Could not prove it dead: keep it supervised and durable. A failure before the identity
        // was made still has the unreaped child, whose pid is its own: read its start time now.
        let identity = identity.or_else(|| {
            let stat = read_stat(child.id()).ok().flatten()?;
            Some(ProcessIdentity {
                launcher: Launcher::Direct,
                unit: None,
                pid: child.id(),
                start_time: stat.start_time,
                cgroup: self
                    .parent
                    .child_relative(&cgroup_dir.file_name()?.to_string_lossy()),
            })
        });
        let live = identity.filter(|id| identity_file::write(runtime, id).is_ok());
        if let Ok(mut children) = self.children.lock() {
            children.insert(child.id(), child);
        }
        StartError {
            failure,
            child_existed: true,
            live,
        }
    }
}

fn wait_child(child: &mut Child, deadline: Duration) -> bool {
    let until = std::time::Instant::now() + deadline;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return true,
            Ok(None) if std::time::Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(5));
            }
            _ => return false,
        }
    }
}

/// An executable regular file, not followed through a link.
fn listener_present(runtime: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(runtime.join(LISTENER))
        .is_ok_and(|m| m.file_type().is_file() && m.permissions().mode() & 0o111 != 0)
}

/// What the helper reported: `Ok(())` for READY then end-of-file (the exec closed the channel).
fn read_report(out: std::process::ChildStdout, deadline: Duration) -> Result<(), StartFailure> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let mut out = out.take(4096);
        let r = out.read_to_string(&mut text).map(|_| text);
        let _ = tx.send(r);
    });
    let text = rx
        .recv_timeout(deadline)
        .map_err(|_| StartFailure::NotReadyInTime)?
        .map_err(|_| StartFailure::BadReport)?;
    let mut lines = text.lines();
    match (lines.next(), lines.next()) {
        (Some(READY), None) => Ok(()),
        (Some(READY), Some(l)) | (Some(l), _) if l.starts_with(FAILED) => {
            Err(EntryFailure::from_kind(&l[FAILED.len()..])
                .map_or(StartFailure::BadReport, StartFailure::Entry))
        }
        _ => Err(StartFailure::BadReport),
    }
}

impl RunnerLauncher for DirectLauncher {
    fn kind(&self) -> Launcher {
        Launcher::Direct
    }

    fn start(
        &self,
        spec: &LaunchSpec<'_>,
        handoff: RestrictiveHandoff,
    ) -> Result<ProcessIdentity, StartError> {
        // Checked with the handoff already on disk, so this unwind path deletes it (Drop).
        if !listener_present(spec.runtime) {
            return Err(StartError::before_child(StartFailure::ListenerMissing));
        }
        let name = attempt_cgroup_name(&spec.attempt);
        let cgroup_dir = self.parent.create_child(&name, &spec.limits).map_err(|e| {
            let mut err = StartError::before_child(e);
            // An existing cgroup may hold an earlier start of this very attempt.
            if matches!(
                err.failure,
                StartFailure::Cgroup(cgroup::CgroupError::AlreadyExists)
            ) {
                err.child_existed = true;
            }
            err
        })?;
        let relative = self.parent.child_relative(&name);
        let args = EntryArgs {
            handoff: handoff.path().to_path_buf(),
            runtime: spec.runtime.to_path_buf(),
            cgroup: Some(cgroup_dir.clone()),
            uid: Some(spec.account.uid),
            gid: Some(spec.account.gid),
            await_handoff: None,
            environment: None,
            nice: Some(spec.limits.nice).filter(|n| *n > 0),
            // The launcher is the helper's parent: it has the pid from the fork.
            receipt: None,
        };
        // The helper runs as root until its final exec: its own environment is fixed, and the
        // listener's (the policy's `runner.env` among it) travels encoded, applied only at that
        // exec, after the uid change.
        let spawned = Command::new(&self.entry_helper)
            .args(args.to_args())
            .env_clear()
            .envs(helper_environment(&spec.environment))
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                let _ = cgroup::remove(&cgroup_dir);
                return Err(StartError::before_child(StartFailure::Spawn(e.kind())));
            }
        };
        // From here on a child exists: every failure is final for this JIT.
        let Some(out) = child.stdout.take() else {
            return Err(self.abort(
                child,
                &cgroup_dir,
                None,
                spec.runtime,
                StartFailure::BadReport,
            ));
        };
        if let Err(f) = read_report(out, self.ready_deadline) {
            return Err(self.abort(child, &cgroup_dir, None, spec.runtime, f));
        }
        match handoff.exists() {
            Ok(false) if !fault::fails(LaunchFault::HandoffDelete) => {}
            _ => {
                return Err(self.abort(
                    child,
                    &cgroup_dir,
                    None,
                    spec.runtime,
                    StartFailure::HandoffSurvived,
                ));
            }
        }
        // Consumes the handle; the file is already gone.
        let _ = handoff.delete();
        let pid = child.id();
        // Unreaped, so the pid is still this child's and its start time is the runner's.
        let Some(stat) = read_stat(pid).ok().flatten() else {
            return Err(self.abort(
                child,
                &cgroup_dir,
                None,
                spec.runtime,
                StartFailure::NoStartTime,
            ));
        };
        let identity = ProcessIdentity {
            launcher: Launcher::Direct,
            unit: None,
            pid,
            start_time: stat.start_time,
            cgroup: relative.clone(),
        };
        if !stat.is_exited() && read_cgroup_v2(pid).ok().flatten().as_deref() != Some(&relative) {
            return Err(self.abort(
                child,
                &cgroup_dir,
                None,
                spec.runtime,
                StartFailure::NotInCgroup,
            ));
        }
        let written = if fault::fails(LaunchFault::IdentityWrite) {
            Err(identity_file::IdentityFileError::Io(io::ErrorKind::Other))
        } else {
            identity_file::write(spec.runtime, &identity)
        };
        if let Err(e) = written {
            return Err(self.abort(child, &cgroup_dir, Some(identity), spec.runtime, e.into()));
        }
        if fault::fails(LaunchFault::ChildMapInsert) {
            return Err(self.abort(
                child,
                &cgroup_dir,
                Some(identity),
                spec.runtime,
                StartFailure::NotTracked,
            ));
        }
        if let Ok(mut children) = self.children.lock() {
            children.insert(pid, child);
        }
        Ok(identity)
    }

    fn inspect(&self, identity: &ProcessIdentity) -> io::Result<Inspection> {
        self.reap();
        inspect(identity)
    }

    fn stop(&self, identity: &ProcessIdentity) -> Result<Stopped, StopError> {
        if identity.launcher != Launcher::Direct {
            return Err(StopError::WrongLauncher);
        }
        let dir = self.parent.owned_dir(&identity.cgroup)?;
        let before = self
            .inspect(identity)
            .map_err(|e| StopError::Inspect(e.kind()))?;
        let was_populated = cgroup::populated(&dir)?;
        // The whole cgroup, never a pid by number: a recycled pid lives elsewhere and is not
        // touched.
        cgroup::kill(&dir)?;
        let until = Instant::now() + self.stop_deadline;
        if !cgroup::wait_empty(&dir, self.stop_deadline, || self.reap())? {
            return Err(StopError::StillRunning);
        }
        // Death is proven by looking again, not by having sent the kill. An empty cgroup is
        // not yet a dead process: the kernel takes an exiting task off its cgroup
        // (`cgroup_exit`) before it marks it a zombie (`exit_notify`), and on a busy node the
        // task can be preempted between the two, still reading `R` in its cgroup. So keep
        // looking, within the same deadline, until it reads gone.
        loop {
            let alive = self
                .inspect(identity)
                .map_err(|e| StopError::Inspect(e.kind()))?
                .is_alive();
            if !alive {
                break;
            }
            if Instant::now() >= until {
                return Err(StopError::StillRunning);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        cgroup::remove(&dir)?;
        Ok(if before.is_alive() || was_populated {
            Stopped::Stopped
        } else {
            Stopped::AlreadyGone
        })
    }

    fn leftovers(&self) -> io::Result<Vec<String>> {
        self.parent.attempt_children()
    }

    fn stop_leftover(&self, short: &str) -> Result<Stopped, StopError> {
        if !super::launcher::is_attempt_short(short) {
            return Err(StopError::NotOurs);
        }
        let dir = self
            .parent
            .owned_dir(&self.parent.child_relative(&format!("rm-{short}")))?;
        let was_populated = cgroup::populated(&dir)?;
        // The whole cgroup: everything in it is the attempt's by construction.
        cgroup::kill(&dir)?;
        if !cgroup::wait_empty(&dir, self.stop_deadline, || self.reap())? {
            return Err(StopError::StillRunning);
        }
        cgroup::remove(&dir)?;
        Ok(if was_populated {
            Stopped::Stopped
        } else {
            Stopped::AlreadyGone
        })
    }

    fn exit_status(&self, identity: &ProcessIdentity) -> Option<ExitStatus> {
        self.reap();
        self.exits
            .lock()
            .ok()?
            .get(&(identity.pid, identity.start_time))
            .copied()
    }
}
