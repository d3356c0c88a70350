//! The systemd launcher: in a cluster the agent's own process tree lives in its container and
//! dies with it, so each runner becomes a transient unit on the host's systemd
//! (`rm-<12hex>.service` in `runner-manager.slice`) whose command is the entry helper, run as
//! the runner account with no privileges and the snapshot's limits. The unit's properties are
//! built purely ([`unit_properties`]), and the JIT is never among them: it stays in the handoff
//! file, which the helper reads and deletes.
//!
//! No tenant-chosen text becomes a property: `systemd-run` splits an `Environment=` value on
//! white space, so `A=x Environment=LD_PRELOAD=/x.so` would have set a second variable. The
//! listener's environment goes to the helper as one `--setenv` variable whose value is a single
//! inert word ([`crate::entry::encode_environment`]), and the helper applies it at its final
//! `exec`; every property is its own `--property=` argument, and the command is argv after `--`,
//! never a string split on spaces.
//!
//! Submission goes through `systemd-run`/`systemctl` (the agent's image carries them, the
//! DaemonSet mounts `/run/systemd`). This machine does not boot systemd, so only the property
//! list is tested here.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use runner_manager_crds::attempt::{Launcher, ProcessIdentity};

use super::cgroup::attempt_cgroup_name;
use super::launcher::{LaunchSpec, RunnerLauncher, StartError, StartFailure, StopError, Stopped};
use crate::entry::{EntryArgs, helper_environment};
use crate::handoff::RestrictiveHandoff;
use crate::process::stat::read_stat;
use crate::process::{Inspection, identity_file, inspect};

/// The slice every runner unit goes into. No dash: in a slice's name a dash means a parent
/// slice, so `runner-manager.slice` would have nested the runners in a `runner.slice`.
pub const SLICE: &str = "runnermanager.slice";

/// The sandbox every runner unit gets, each line what it takes from a job (systemd.exec(5)).
pub const SANDBOX: [(&str, &str); 15] = [
    // Its own /tmp and /var/tmp, removed with the unit.
    ("PrivateTmp", "yes"),
    // A /dev with only the pseudo devices: no disks, no /dev/kvm, no /dev/fuse.
    ("PrivateDevices", "yes"),
    // The whole file system read-only, /dev, /proc and /sys API mounts aside; the runtime is
    // made writable again by ReadWritePaths.
    ("ProtectSystem", "strict"),
    // /home, /root and /run/user unreachable (the roots preflight keeps runtimes out of them).
    ("ProtectHome", "yes"),
    // Other accounts' processes absent from /proc (the agent's, other runners').
    ("ProtectProc", "invisible"),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectKernelLogs", "yes"),
    ("ProtectControlGroups", "yes"),
    ("ProtectClock", "yes"),
    ("ProtectHostname", "yes"),
    // No setuid/setgid files made, no realtime scheduling, no personality changes.
    ("RestrictSUIDSGID", "yes"),
    ("RestrictRealtime", "yes"),
    ("LockPersonality", "yes"),
    // The account's System V and POSIX IPC objects (and its /dev/shm files) removed at stop.
    ("RemoveIPC", "yes"),
];

/// Cloud instance metadata services (instance credentials): AWS, GCP, Azure, Oracle and
/// OpenStack at 169.254.169.254, AWS ECS task metadata, Alibaba Cloud, AWS's IPv6 endpoint.
/// Exact addresses, not 169.254.0.0/16: link-local also carries node-local DNS caches.
pub const METADATA_ADDRESSES: [&str; 4] = [
    "169.254.169.254",
    "169.254.170.2",
    "100.100.100.200",
    "fd00:ec2::254",
];

/// A runner's unit name.
pub fn unit_name(attempt: &uuid::Uuid) -> String {
    format!("{}.service", attempt_cgroup_name(attempt))
}

/// The transient unit one launch submits: its name, its properties in submission order, the
/// helper's environment and its command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransientUnit {
    pub name: String,
    /// Agent-made values only (ids, paths, limits): none comes from a policy.
    pub properties: Vec<(String, String)>,
    /// `--setenv` variables: the helper's fixed environment and the encoded listener's one.
    pub environment: Vec<(String, String)>,
    /// The helper's argv, program first.
    pub command: Vec<OsString>,
}

impl TransientUnit {
    /// `systemd-run`'s argv (without the program): one argument per property and per variable,
    /// then `--` and the command, each of its arguments its own.
    pub fn systemd_run_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            format!("--unit={}", self.name).into(),
            "--no-ask-password".into(),
            "--quiet".into(),
            // Unloaded once inactive, failed or not: a failed start would otherwise hold the
            // unit's name ("already loaded") until someone ran `systemctl reset-failed`.
            "--collect".into(),
        ];
        for (k, v) in &self.properties {
            args.push(format!("--property={k}={v}").into());
        }
        for (k, v) in &self.environment {
            args.push(format!("--setenv={k}={v}").into());
        }
        args.push("--".into());
        args.extend(self.command.iter().cloned());
        args
    }
}

/// The unit for `spec`, running `entry_helper` on `handoff`.
pub fn unit_properties(
    spec: &LaunchSpec<'_>,
    entry_helper: &Path,
    handoff: &Path,
) -> TransientUnit {
    let mut p: Vec<(String, String)> = Vec::new();
    let mut set = |k: &str, v: String| p.push((k.to_owned(), v));
    set("Slice", SLICE.to_owned());
    set("Type", "exec".to_owned());
    set("User", spec.account.uid.to_string());
    set("Group", spec.account.gid.to_string());
    set("NoNewPrivileges", "yes".to_owned());
    // Empty: no capabilities at all, bounding or ambient.
    set("CapabilityBoundingSet", String::new());
    set("AmbientCapabilities", String::new());
    set("KillMode", "control-group".to_owned());
    if let Some(m) = spec.limits.memory_max {
        set("MemoryMax", m.to_string());
    }
    if let Some(c) = spec.limits.cpu_quota_percent() {
        set("CPUQuota", format!("{c}%"));
    }
    if let Some(t) = spec.limits.tasks_max {
        set("TasksMax", t.to_string());
    }
    // The sandbox (docs/security.md, "Runners on a shared host"): a job sees the host read-only
    // but for its own runtime, its own /tmp and /var/tmp, no devices, no other account's
    // processes, no kernel knobs, and cannot reach the cloud's metadata service (instance
    // credentials). What it leaves outside its runtime dies with the unit: the private /tmp and
    // /var/tmp with it, and RemoveIPC takes the account's IPC objects and /dev/shm files, so a
    // later runner under the same account (another tenant's, for ephemeral runners) inherits
    // nothing. The runtime is the only path in a value, and the roots preflight allows only
    // characters that need no quoting in a unit (`roots::check_unit_safe`).
    for (k, v) in SANDBOX {
        set(k, (*v).to_owned());
    }
    set("ReadWritePaths", spec.runtime.display().to_string());
    set("IPAddressDeny", METADATA_ADDRESSES.join(" "));
    set("WorkingDirectory", spec.runtime.display().to_string());
    set("StandardInput", "null".to_owned());
    set("StandardOutput", "null".to_owned());
    set("StandardError", "null".to_owned());
    let args = EntryArgs {
        handoff: handoff.to_path_buf(),
        runtime: spec.runtime.to_path_buf(),
        cgroup: None,
        uid: None,
        gid: None,
        await_handoff: None,
    };
    let mut command = vec![entry_helper.as_os_str().to_owned()];
    command.extend(args.to_args());
    TransientUnit {
        name: unit_name(&spec.attempt),
        properties: p,
        environment: helper_environment(&spec.environment),
        command,
    }
}

/// The entry helper's file name on the host.
pub const HELPER_NAME: &str = "runner-manager-runner-entry";

/// Puts the entry helper where the host's systemd can run it:
/// `<hostRoot>/bin/runner-manager-runner-entry`. The agent's own copy is in its image, which
/// the host cannot see; the host root is mounted at the same path in the agent's container and
/// on the host, so this copy is where both look (`systemd-run` checks the command in the agent's
/// namespace, systemd execs it in the host's). Rewritten, through a new file and a rename, only
/// when its bytes or mode differ (an agent upgrade); never written through a link.
pub fn install_helper(from: &Path, host_root: &Path) -> io::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    let dir = host_root.join("bin");
    match std::fs::DirBuilder::new().mode(0o755).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    if !std::fs::symlink_metadata(&dir)?.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    let dest = dir.join(HELPER_NAME);
    let want = std::fs::read(from)?;
    let current = std::fs::symlink_metadata(&dest)
        .ok()
        .filter(|m| m.is_file() && m.permissions().mode() & 0o7777 == 0o755);
    if current.is_some() && std::fs::read(&dest)? == want {
        return Ok(dest);
    }
    let staged = dir.join(format!(".{HELPER_NAME}.{}", uuid::Uuid::new_v4().simple()));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o755)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&staged)?;
        file.write_all(&want)?;
        // The umask may have narrowed the mode.
        file.set_permissions(std::fs::Permissions::from_mode(0o755))?;
        file.sync_all()?;
        std::fs::rename(&staged, &dest)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&staged);
    }
    written.map(|()| dest)
}

/// The systemd launcher.
#[derive(Clone, Debug)]
pub struct SystemdLauncher {
    pub entry_helper: PathBuf,
    pub systemd_run: PathBuf,
    pub systemctl: PathBuf,
    pub ready_deadline: Duration,
    pub stop_deadline: Duration,
}

impl SystemdLauncher {
    pub fn new(entry_helper: PathBuf) -> Self {
        Self {
            entry_helper,
            systemd_run: "systemd-run".into(),
            systemctl: "systemctl".into(),
            ready_deadline: Duration::from_secs(10),
            stop_deadline: Duration::from_secs(10),
        }
    }

    fn run(&self, program: &Path, args: &[OsString]) -> io::Result<(ExitStatus, String)> {
        // In the agent's pod (hostPID, the node's /run/systemd by hostPath) PID 1's root is not
        // ours, and systemctl takes that for a chroot: "Running in chroot, ignoring command
        // 'show'", exit 0, nothing done (found on a real node, e2e/cluster/check.sh).
        let out = Command::new(program)
            .env("SYSTEMD_IGNORE_CHROOT", "1")
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()?;
        Ok((
            out.status,
            String::from_utf8_lossy(&out.stdout).into_owned(),
        ))
    }

    /// `MainPID`, `ControlGroup` and `ActiveState` of a unit.
    fn show(&self, unit: &str) -> io::Result<(u32, String, String)> {
        let (status, out) = self.run(
            &self.systemctl,
            &[
                "show".into(),
                "--property=MainPID,ControlGroup,ActiveState".into(),
                unit.into(),
            ],
        )?;
        if !status.success() {
            return Err(io::Error::other("systemctl show failed"));
        }
        let (mut pid, mut cgroup, mut state) = (0, String::new(), String::new());
        for line in out.lines() {
            match line.split_once('=') {
                Some(("MainPID", v)) => pid = v.parse().unwrap_or(0),
                Some(("ControlGroup", v)) => cgroup = v.to_owned(),
                Some(("ActiveState", v)) => state = v.to_owned(),
                _ => {}
            }
        }
        Ok((pid, cgroup, state))
    }

    /// SIGKILL to every process of the unit, then a stop that does not wait: `systemctl stop`
    /// alone sends SIGTERM and blocks up to `TimeoutStopSec` (90 s by default) for a job that
    /// ignores it. The runner has nothing to save by then (it is deregistered, or its job is
    /// over), and the caller proves the end itself by polling the unit and the process.
    fn kill_unit(&self, unit: &str) -> io::Result<ExitStatus> {
        let (killed, _) = self.run(
            &self.systemctl,
            &[
                "kill".into(),
                "--kill-whom=all".into(),
                "--signal=SIGKILL".into(),
                unit.into(),
            ],
        )?;
        let (stopped, _) = self.run(
            &self.systemctl,
            &["stop".into(), "--no-block".into(), unit.into()],
        )?;
        // A unit already gone answers "not loaded" to both: that is stopped too.
        Ok(if killed.success() { stopped } else { killed })
    }
}

impl RunnerLauncher for SystemdLauncher {
    fn kind(&self) -> Launcher {
        Launcher::Systemd
    }

    fn start(
        &self,
        spec: &LaunchSpec<'_>,
        handoff: RestrictiveHandoff,
    ) -> Result<ProcessIdentity, StartError> {
        let unit = unit_properties(spec, &self.entry_helper, handoff.path());
        let submitted = self.run(&self.systemd_run, &unit.systemd_run_args());
        match submitted {
            Ok((status, _)) if status.success() => {}
            // systemd-run failing leaves no unit (Type=exec fails the start itself).
            Ok(_) => return Err(StartError::before_child(StartFailure::Unit)),
            Err(e) => return Err(StartError::before_child(StartFailure::Spawn(e.kind()))),
        }
        let fail = |failure| {
            let _ = self.kill_unit(&unit.name);
            StartError {
                failure,
                child_existed: true,
                live: None,
            }
        };
        // The helper deletes the handoff before it execs the listener.
        let until = Instant::now() + self.ready_deadline;
        loop {
            match handoff.exists() {
                Ok(false) => break,
                Ok(true) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
                _ => return Err(fail(StartFailure::NotReadyInTime)),
            }
        }
        let _ = handoff.delete();
        let Ok((pid, cgroup, _)) = self.show(&unit.name) else {
            return Err(fail(StartFailure::Unit));
        };
        let Some(stat) = read_stat(pid).ok().flatten().filter(|_| pid != 0) else {
            return Err(fail(StartFailure::NoStartTime));
        };
        let identity = ProcessIdentity {
            launcher: Launcher::Systemd,
            unit: Some(unit.name.clone()),
            pid,
            start_time: stat.start_time,
            cgroup,
        };
        identity_file::write(spec.runtime, &identity).map_err(|e| fail(e.into()))?;
        Ok(identity)
    }

    fn inspect(&self, identity: &ProcessIdentity) -> io::Result<Inspection> {
        inspect(identity)
    }

    fn stop(&self, identity: &ProcessIdentity) -> Result<Stopped, StopError> {
        if identity.launcher != Launcher::Systemd {
            return Err(StopError::WrongLauncher);
        }
        let Some(unit) = identity
            .unit
            .as_deref()
            .filter(|u| u.starts_with("rm-") && u.ends_with(".service"))
        else {
            return Err(StopError::NotOurs);
        };
        let before = inspect(identity).map_err(|e| StopError::Inspect(e.kind()))?;
        // The unit's whole cgroup, never a pid by number; whether a unit that answered neither
        // is gone is for the polling below to prove.
        self.kill_unit(unit).map_err(|_| StopError::Unit)?;
        let until = Instant::now() + self.stop_deadline;
        loop {
            let (_, _, state) = self.show(unit).map_err(|_| StopError::Unit)?;
            let alive = inspect(identity)
                .map_err(|e| StopError::Inspect(e.kind()))?
                .is_alive();
            if !alive && matches!(state.as_str(), "inactive" | "failed" | "") {
                break;
            }
            if Instant::now() >= until {
                return Err(StopError::StillRunning);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(if before.is_alive() {
            Stopped::Stopped
        } else {
            Stopped::AlreadyGone
        })
    }

    fn exit_status(&self, _identity: &ProcessIdentity) -> Option<ExitStatus> {
        // systemd keeps it (ExecMainStatus); supervision reads it from the unit.
        None
    }

    fn leftovers(&self) -> io::Result<Vec<String>> {
        let (status, out) = self.run(
            &self.systemctl,
            &[
                "list-units".into(),
                "--all".into(),
                "--plain".into(),
                "--no-legend".into(),
                "--type=service".into(),
                "rm-*.service".into(),
            ],
        )?;
        if !status.success() {
            return Err(io::Error::other("systemctl list-units failed"));
        }
        // Only units in the runners' own slice: a unit of that name elsewhere is not ours.
        let mut ours = Vec::new();
        for short in attempt_units(&out) {
            let (ok, slice) = self.run(
                &self.systemctl,
                &[
                    "show".into(),
                    "--property=Slice".into(),
                    "--value".into(),
                    format!("rm-{short}.service").into(),
                ],
            )?;
            if ok.success() && slice.trim() == SLICE {
                ours.push(short);
            }
        }
        Ok(ours)
    }

    fn stop_leftover(&self, short: &str) -> Result<Stopped, StopError> {
        if !super::launcher::is_attempt_short(short) {
            return Err(StopError::NotOurs);
        }
        let unit = format!("rm-{short}.service");
        let (_, _, before) = self.show(&unit).map_err(|_| StopError::Unit)?;
        self.kill_unit(&unit).map_err(|_| StopError::Unit)?;
        let until = Instant::now() + self.stop_deadline;
        loop {
            let (pid, _, state) = self.show(&unit).map_err(|_| StopError::Unit)?;
            if pid == 0 && matches!(state.as_str(), "inactive" | "failed" | "") {
                break;
            }
            if Instant::now() >= until {
                return Err(StopError::StillRunning);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // A failed transient unit stays loaded (and listed) until reset.
        let _ = self.run(&self.systemctl, &["reset-failed".into(), unit.into()]);
        Ok(
            if matches!(before.as_str(), "active" | "activating" | "deactivating") {
                Stopped::Stopped
            } else {
                Stopped::AlreadyGone
            },
        )
    }
}

/// The attempt names of the `rm-<12hex>.service` units in `systemctl list-units --plain
/// --no-legend` output (the unit is the first column; a leading status mark is skipped).
pub fn attempt_units(listing: &str) -> Vec<String> {
    let mut found: Vec<String> = listing
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .find(|w| w.starts_with("rm-"))
                .and_then(|u| u.strip_prefix("rm-")?.strip_suffix(".service"))
                .filter(|h| super::launcher::is_attempt_short(h))
                .map(str::to_owned)
        })
        .collect();
    found.sort();
    found.dedup();
    found
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn the_helper_is_installed_on_the_host_root_once_and_replaced_when_it_differs() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("helper-v1");
        std::fs::write(&from, b"v1").unwrap();
        let host = dir.path().join("host");
        std::fs::create_dir(&host).unwrap();
        let dest = install_helper(&from, &host).unwrap();
        assert_eq!(dest, host.join("bin").join(HELPER_NAME));
        assert_eq!(std::fs::read(&dest).unwrap(), b"v1");
        let mode = std::fs::metadata(&dest).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o755);
        let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&dest).unwrap());
        install_helper(&from, &host).unwrap();
        let again = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&dest).unwrap());
        assert_eq!(inode, again, "unchanged bytes are not rewritten");
        // An upgrade, and a link planted where the helper was: replaced, never followed.
        let outside = dir.path().join("outside");
        std::fs::write(&outside, b"keep").unwrap();
        std::fs::remove_file(&dest).unwrap();
        std::os::unix::fs::symlink(&outside, &dest).unwrap();
        std::fs::write(&from, b"v2").unwrap();
        install_helper(&from, &host).unwrap();
        assert!(
            !std::fs::symlink_metadata(&dest)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read(&dest).unwrap(), b"v2");
        assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
        let leftovers = std::fs::read_dir(host.join("bin")).unwrap().count();
        assert_eq!(leftovers, 1, "no staged copy left behind");
    }
    use crate::account::RunnerAccount;
    use crate::entry::{ENVIRONMENT_VARIABLE, decode_environment};
    use crate::providers::cgroup::CgroupLimits;

    /// A `runner.env` value with spaces or a newline cannot add a property or a variable: it
    /// stays inside the one encoded word, and decodes back to exactly itself.
    #[test]
    fn only_attempt_units_are_listed_as_leftovers() {
        let listing = "rm-0123456789ab.service loaded active running rm\n\
            ● rm-abcdefabcdef.service loaded failed failed rm\n\
            rm-0123.service loaded active running short\n\
            rm-0123456789AB.service loaded active running upper\n\
            sshd.service loaded active running OpenSSH\n";
        assert_eq!(
            attempt_units(listing),
            vec!["0123456789ab".to_owned(), "abcdefabcdef".to_owned()]
        );
    }

    #[test]
    fn a_hostile_environment_value_cannot_smuggle_an_assignment() {
        let runtime = Path::new("/var/lib/runner-manager/runners/0123456789ab");
        let environment: BTreeMap<String, String> = [
            ("A", "x Environment=LD_PRELOAD=/tmp/x.so"),
            ("B", "y User=root"),
            ("C", "z\nUser=root"),
            ("D", "\"q\" 'r' \\ $HOME %n"),
            ("PATH", "/usr/bin:/bin"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let spec = LaunchSpec {
            attempt: uuid::Uuid::from_u128(0x0123456789ab4cde8f0123456789abcd),
            runtime,
            account: RunnerAccount {
                uid: 1201,
                gid: 1200,
            },
            environment: environment.clone(),
            limits: CgroupLimits::default(),
        };
        let unit = unit_properties(
            &spec,
            Path::new("/usr/bin/runner-manager-runner-entry"),
            &runtime.join("jit-6f1c2a.tmp"),
        );
        // No property carries anything of the policy: not one Environment=, one User=.
        assert!(!unit.properties.iter().any(|(k, _)| k == "Environment"));
        let users: Vec<&str> = unit
            .properties
            .iter()
            .filter(|(k, _)| k == "User")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(users, ["1201"]);

        let argv: Vec<String> = unit
            .systemd_run_args()
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let end = argv.iter().position(|a| a == "--").unwrap();
        let options = &argv[..end];
        // Every option is one known kind; the properties are exactly the agent's.
        let properties: Vec<&str> = options
            .iter()
            .filter_map(|a| a.strip_prefix("--property="))
            .collect();
        let expected: Vec<String> = unit
            .properties
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(properties, expected);
        let setenv: Vec<&str> = options
            .iter()
            .filter_map(|a| a.strip_prefix("--setenv="))
            .collect();
        assert_eq!(setenv.len(), 3, "{setenv:?}");
        assert_eq!(setenv[0], "PATH=/usr/sbin:/usr/bin:/sbin:/bin");
        assert_eq!(setenv[1], "LANG=C.UTF-8");
        let encoded = setenv[2]
            .strip_prefix(&format!("{ENVIRONMENT_VARIABLE}="))
            .unwrap();
        assert!(
            !encoded
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || "\"'\\$".contains(c)),
            "{encoded}"
        );
        let back: BTreeMap<String, String> =
            decode_environment(encoded).unwrap().into_iter().collect();
        assert_eq!(back, environment);
        assert_eq!(
            options.len(),
            4 + properties.len() + setenv.len(),
            "{options:?}"
        );
        // The hostile text appears in no argument but the encoded one.
        for a in &argv {
            if a.contains("User=root") || a.contains("LD_PRELOAD") {
                assert!(
                    a.starts_with(&format!("--setenv={ENVIRONMENT_VARIABLE}=")),
                    "{a}"
                );
            }
        }
        // The command is argv: the helper and its flags, each its own argument.
        assert_eq!(
            &argv[end + 1..],
            [
                "/usr/bin/runner-manager-runner-entry",
                "--handoff",
                "/var/lib/runner-manager/runners/0123456789ab/jit-6f1c2a.tmp",
                "--runtime",
                "/var/lib/runner-manager/runners/0123456789ab",
            ]
        );
    }
}
