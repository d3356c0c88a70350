//! The systemd launcher: in a cluster the agent's own process tree lives in its container and
//! dies with it, so each runner becomes a transient unit on the host's systemd
//! (`rm-<12hex>.service` in `runnermanager.slice`) whose command is the entry helper, run as
//! the runner account with no privileges and the snapshot's limits. The unit's properties are
//! built purely ([`unit_properties`]), and the JIT is never among them: it stays in the handoff
//! file, which the helper reads and deletes.
//!
//! No tenant-chosen text becomes a property, nor a `--setenv` variable: every local account
//! reads a unit's environment (`systemctl show -p Environment`, `systemctl cat`, the unit file
//! under `/run/systemd/transient` is 0644), so another tenant's runner would read this one's
//! `runner.env`. The listener's environment goes to the helper in a 0600 file of the runner's
//! account in its runtime, made and checked like the JIT's handoff
//! ([`RestrictiveHandoff::create_environment`]), read once and deleted by the helper, which
//! applies it at its final `exec`. The unit's own environment is the fixed `PATH` and `LANG`.
//! Every property is its own `--property=` argument, and the command is argv after `--`, never
//! a string split on spaces.
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

use super::cgroup::{CgroupLimits, attempt_cgroup_name};
use super::launcher::{
    LaunchSpec, Prestart, PrestartedStart, RunnerLauncher, StartError, StartFailure, StopError,
    Stopped,
};
use super::sandbox::{Probe, ProbeUnits, RunnerNetwork};
use crate::docker::engine::{self, EngineSpec};
use crate::entry::{
    AWAIT_HANDOFF_SECONDS, EntryArgs, HANDOFF_POINTER, HELPER_LANG, HELPER_PATH, RECEIPT, Receipt,
    TAKEN_MARKER, encode_environment,
};
use crate::handoff::RestrictiveHandoff;
use crate::process::stat::{ProcStat, read_cgroup_v2, read_stat};
use crate::process::{Inspection, identity_file, inspect};

/// The slice every runner unit goes into. No dash: in a slice's name a dash means a parent
/// slice, so `runner-manager.slice` would have nested the runners in a `runner.slice`.
pub const SLICE: &str = "runnermanager.slice";

/// The sandbox every runner unit gets, each line what it takes from a job (systemd.exec(5)).
pub const SANDBOX: [(&str, &str); 22] = [
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
    // Its own IPC namespace: no System V or POSIX message queue, semaphore or segment of
    // another runner (or the host) is visible, whatever its mode.
    ("PrivateIPC", "yes"),
    // No new namespace of any kind: `unshare -Urn` gives an unprivileged job CAP_NET_ADMIN in
    // a user namespace of its own, which opens nf_tables and the rest of the kernel's
    // namespaced-root surface to it (CVE-2024-1086 and its class: node root, then every
    // Secret on the node).
    ("RestrictNamespaces", "yes"),
    // systemd's allow-list for ordinary services: no mount, module, reboot, swap, clock,
    // raw I/O, kexec, keyring-admin, ptrace/perf (@debug) or obsolete calls. Measured: the
    // stand-in runner, git, curl over TLS, node, python, perl and tar run under it unchanged,
    // so no call is added (docs/security.md lists the jobs it costs: strace/gdb, LeakSanitizer).
    ("SystemCallFilter", SYSTEM_CALL_FILTER),
    // A refused call fails with EPERM instead of killing the job: tools probe for calls
    // (io_uring, clone3 flags) and fall back, which SIGSYS would not let them do.
    ("SystemCallErrorNumber", "EPERM"),
    // Only the native ABI: the 32-bit x86 entry points (int 0x80) would bypass a filter
    // written for x86-64 numbers.
    ("SystemCallArchitectures", "native"),
    // Sockets a job needs: local, IPv4/IPv6, and netlink, which glibc's getaddrinfo
    // (AI_ADDRCONFIG) and getifaddrs use (node's os.networkInterfaces() fails with EAFNOSUPPORT
    // without it, measured). No AF_PACKET (raw frames past the IP filter), no AF_VSOCK, AF_BLUETOOTH,
    // AF_ALG and the other rarely-audited families. Without a user namespace netlink gives a
    // job no CAP_NET_ADMIN, so nf_tables stays closed.
    (
        "RestrictAddressFamilies",
        "AF_UNIX AF_INET AF_INET6 AF_NETLINK",
    ),
    // The node's credentials and other workloads' data: the kubelet's pods (their Secret and
    // token volumes), its kubeconfig and PKI, the container runtimes' state and sockets, every
    // pod's log. `-`: a path the node does not have is skipped, not a failed start. No runner
    // gets the Docker socket (DESIGN §6: no policy asks for it).
    ("InaccessiblePaths", INACCESSIBLE_PATHS),
];

/// The filter set of [`SANDBOX`].
pub const SYSTEM_CALL_FILTER: &str = "@system-service";

/// What [`SANDBOX`] hides (systemd's `-` prefix: skipped where missing).
pub const INACCESSIBLE_PATHS: &str = "-/var/lib/kubelet -/etc/kubernetes -/var/lib/containerd -/run/containerd -/var/lib/docker -/run/docker.sock -/run/docker -/run/crio -/var/lib/crio -/var/log/pods -/var/log/containers -/var/lib/etcd";

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

/// The properties every unit of a runner's account gets, runner or probe: the account, no
/// privileges, the sandbox and the network filter.
fn sandboxed(
    account: crate::account::RunnerAccount,
    network: &RunnerNetwork,
) -> Vec<(String, String)> {
    let mut p: Vec<(String, String)> = Vec::new();
    let mut set = |k: &str, v: String| p.push((k.to_owned(), v));
    set("Slice", SLICE.to_owned());
    set("Type", "exec".to_owned());
    set("User", account.uid.to_string());
    set("Group", account.gid.to_string());
    set("NoNewPrivileges", "yes".to_owned());
    // Empty: no capabilities at all, bounding or ambient.
    set("CapabilityBoundingSet", String::new());
    set("AmbientCapabilities", String::new());
    set("KillMode", "control-group".to_owned());
    for (k, v) in SANDBOX {
        set(k, (*v).to_owned());
    }
    p.extend(network.properties());
    p
}

/// The helper's own environment in a unit: fixed, nothing of a policy's.
fn unit_environment() -> Vec<(String, String)> {
    vec![
        ("PATH".to_owned(), HELPER_PATH.to_owned()),
        ("LANG".to_owned(), HELPER_LANG.to_owned()),
    ]
}

/// The unit for `spec`, running `entry_helper` on `handoff`, with the listener's environment in
/// `environment_file` (never in the unit).
/// A unit's share of the node: memory, CPU, tasks and niceness, as systemd properties. The
/// runner's unit and its Docker engine's each get the attempt's limits.
fn limit_properties(limits: &CgroupLimits) -> Vec<(String, String)> {
    let mut p = Vec::new();
    if let Some(m) = limits.memory_max {
        p.push(("MemoryMax".to_owned(), m.to_string()));
    }
    if let Some(c) = limits.cpu_quota_percent() {
        p.push(("CPUQuota".to_owned(), format!("{c}%")));
    }
    if let Some(t) = limits.tasks_max {
        p.push(("TasksMax".to_owned(), t.to_string()));
    }
    if limits.nice > 0 {
        p.push(("Nice".to_owned(), limits.nice.to_string()));
    }
    p
}

/// How a unit's helper finds the JIT's handoff.
#[derive(Clone, Copy, Debug)]
pub enum Handing<'a> {
    /// The handoff is there when the unit starts (the JIT came first): its path.
    File(&'a Path),
    /// The unit starts before the JIT exists ([`RunnerLauncher::prestart`]): the helper waits
    /// this many seconds at most for the agent's pointer to the handoff (`--await-handoff`).
    Awaited(u64),
}

pub fn unit_properties(
    spec: &LaunchSpec<'_>,
    entry_helper: &Path,
    handing: Handing<'_>,
    environment_file: &Path,
    network: &RunnerNetwork,
) -> TransientUnit {
    let mut p = sandboxed(spec.account, network);
    p.extend(limit_properties(&spec.limits));
    let mut set = |k: &str, v: String| p.push((k.to_owned(), v));
    // The sandbox (docs/security.md, "Runners on a shared host"): a job sees the host read-only
    // but for its own runtime, its own /tmp and /var/tmp, no devices, no other account's
    // processes, no kernel knobs, and cannot reach the cloud's metadata service (instance
    // credentials). What it leaves outside its runtime dies with the unit: the private /tmp and
    // /var/tmp with it, and RemoveIPC takes the account's IPC objects and /dev/shm files, so a
    // later runner under the same account (another tenant's, for ephemeral runners) inherits
    // nothing. The runtime is the only path in a value, and the roots preflight allows only
    // characters that need no quoting in a unit (`roots::check_unit_safe`). The network filter
    // is `sandbox::RunnerNetwork`'s; the agent proved at start that it takes effect.
    set(
        "ReadWritePaths",
        std::iter::once(spec.runtime)
            .chain(spec.cache)
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" "),
    );
    set("WorkingDirectory", spec.runtime.display().to_string());
    set("StandardInput", "null".to_owned());
    set("StandardOutput", "null".to_owned());
    set("StandardError", "null".to_owned());
    let (handoff, await_handoff) = match handing {
        Handing::File(path) => (path.to_path_buf(), None),
        Handing::Awaited(seconds) => (spec.runtime.join(HANDOFF_POINTER), Some(seconds)),
    };
    let args = EntryArgs {
        handoff,
        runtime: spec.runtime.to_path_buf(),
        cgroup: None,
        uid: None,
        gid: None,
        await_handoff,
        environment: Some(environment_file.to_path_buf()),
        // `Nice=` above sets the process's; the helper sets its session's autogroup too.
        nice: Some(spec.limits.nice).filter(|n| *n > 0),
        receipt: Some(spec.runtime.join(RECEIPT)),
    };
    let mut command = vec![entry_helper.as_os_str().to_owned()];
    command.extend(args.to_args());
    TransientUnit {
        name: unit_name(&spec.attempt),
        properties: p,
        environment: unit_environment(),
        command,
    }
}

/// The throw-away unit of the start-up network proof: a runner's sandbox and network filter,
/// writable only in its own directory, running the entry helper's probe mode.
pub fn probe_unit(probe: &Probe, entry_helper: &Path, network: &RunnerNetwork) -> TransientUnit {
    // RemoveIPC would remove, at the probe's stop, the IPC objects and /dev/shm files of
    // everything running as its account.
    let mut p: Vec<(String, String)> = sandboxed(probe.account, network)
        .into_iter()
        .filter(|(k, _)| k != "RemoveIPC")
        .collect();
    p.push(("ReadWritePaths".to_owned(), probe.dir.display().to_string()));
    p.push((
        "WorkingDirectory".to_owned(),
        probe.dir.display().to_string(),
    ));
    p.push(("RuntimeMaxSec".to_owned(), "30".to_owned()));
    for k in ["StandardInput", "StandardOutput", "StandardError"] {
        p.push((k.to_owned(), "null".to_owned()));
    }
    TransientUnit {
        name: probe.unit.clone(),
        properties: p,
        environment: unit_environment(),
        command: vec![
            entry_helper.as_os_str().to_owned(),
            "--probe-connect".into(),
            probe.target.to_string().into(),
            "--probe-result".into(),
            probe.result.clone().into_os_string(),
        ],
    }
}

/// The transient unit of an attempt's Docker engine (`crate::docker::engine`): the runner's
/// sandbox but for what an engine cannot run without (user namespaces and the mount calls in
/// them, `newuidmap`, which is setuid, `/dev/net/tun`, hostnames and sysctls of its own
/// namespaces), so a container reaches no more of the host than the job itself.
pub fn engine_unit(
    spec: &EngineSpec<'_>,
    entry_helper: &Path,
    network: &RunnerNetwork,
) -> TransientUnit {
    let mut p: Vec<(String, String)> = Vec::new();
    let mut set = |k: &str, v: String| p.push((k.to_owned(), v));
    set("Slice", SLICE.to_owned());
    set("Type", "exec".to_owned());
    set("User", spec.account.uid.to_string());
    set("Group", spec.account.gid.to_string());
    set("KillMode", "control-group".to_owned());
    // Only what needs no seccomp filter: with `User=`, systemd implies `NoNewPrivileges=yes`
    // for `PrivateDevices=`, `ProtectKernel*=`, `ProtectClock=`, `RestrictRealtime=`,
    // `LockPersonality=`, `SystemCallArchitectures=` and `RestrictAddressFamilies=` (measured:
    // newuidmap's write of the uid map is then refused). What they would refuse an unprivileged
    // account is refused by its lack of capabilities on the node all the same.
    for (k, v) in [
        // Its own /tmp and /var/tmp, which Podman writes (an image copy's staging).
        ("PrivateTmp", "yes"),
        // The node's devices stay visible but unopenable but for the engine's own tun.
        ("DevicePolicy", "closed"),
        ("DeviceAllow", "/dev/net/tun rw"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("ProtectProc", "invisible"),
        ("ProtectControlGroups", "yes"),
        ("RemoveIPC", "yes"),
        ("PrivateIPC", "yes"),
    ] {
        set(k, v.to_owned());
    }
    // The node's hidden paths, and systemd's own marker: a rootless Podman that sees a systemd
    // reaches for the account's user manager over D-Bus (to move its processes into scopes),
    // which a runner account does not have; measured, its container starts and clean-ups then
    // hung at random. Without the marker it manages its processes itself, all in this unit.
    set(
        "InaccessiblePaths",
        format!("{INACCESSIBLE_PATHS} -/run/systemd/system"),
    );
    set(
        "BindPaths",
        format!("{}:/dev/net/tun", spec.dirs.tun().display()),
    );
    // netavark's `systemd-run --user --scope` for its DNS server, which a runner's account
    // cannot do, run in place instead (engine::SCOPE_SHIM).
    set(
        "BindReadOnlyPaths",
        format!(
            "{}:{}",
            spec.dirs.scope_shim().display(),
            engine::SYSTEMD_RUN
        ),
    );
    // Where Podman's rootless network binds a directory of its own: present, empty and the
    // engine's (engine::CNI_DIR).
    set("TemporaryFileSystem", format!("{}:ro", engine::CNI_DIR));
    set(
        "ReadWritePaths",
        [spec.dirs.root.as_path(), spec.runtime]
            .into_iter()
            .chain(spec.cache)
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" "),
    );
    set("WorkingDirectory", spec.dirs.root.display().to_string());
    // Its XDG_RUNTIME_DIR in the node's /run, short and gone with the unit (EngineDirs::run).
    set("RuntimeDirectory", spec.dirs.runtime_directory());
    set("RuntimeDirectoryMode", "0700".to_owned());
    set("StandardInput", "null".to_owned());
    set("StandardOutput", "null".to_owned());
    // The engine's own log, in its directory (gone with it): what Podman said about a job's
    // container that would not start.
    set(
        "StandardError",
        format!("append:{}", spec.dirs.root.join("engine.log").display()),
    );
    p.extend(network.properties());
    // The attempt's limits again, for what the job runs through Docker: its containers are
    // processes of this unit, not of the runner's.
    p.extend(limit_properties(spec.limits));
    let d = spec.dirs;
    let environment = vec![
        ("PATH".to_owned(), crate::entry::HELPER_PATH.to_owned()),
        ("LANG".to_owned(), crate::entry::HELPER_LANG.to_owned()),
        ("HOME".to_owned(), d.home().display().to_string()),
        ("XDG_RUNTIME_DIR".to_owned(), d.run().display().to_string()),
        (
            "XDG_CONFIG_HOME".to_owned(),
            d.home().join(".config").display().to_string(),
        ),
        (
            "XDG_DATA_HOME".to_owned(),
            d.home().join(".local/share").display().to_string(),
        ),
        (
            "CONTAINERS_CONF".to_owned(),
            d.containers_conf().display().to_string(),
        ),
        (
            "CONTAINERS_STORAGE_CONF".to_owned(),
            d.storage_conf().display().to_string(),
        ),
    ];
    let mut socket = OsString::from("unix://");
    socket.push(d.socket());
    TransientUnit {
        name: engine::unit_name(&spec.attempt),
        properties: p,
        environment,
        command: vec![
            entry_helper.as_os_str().to_owned(),
            crate::entry::ENGINE_EXEC.into(),
            spec.podman.as_os_str().to_owned(),
            "system".into(),
            "service".into(),
            "--time=0".into(),
            socket,
        ],
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
    /// The runner units' network filter (the agent's flags).
    pub network: RunnerNetwork,
    pub systemd_run: PathBuf,
    pub systemctl: PathBuf,
    pub ready_deadline: Duration,
    pub stop_deadline: Duration,
}

impl SystemdLauncher {
    pub fn new(entry_helper: PathBuf) -> Self {
        Self {
            entry_helper,
            network: RunnerNetwork::default(),
            systemd_run: "systemd-run".into(),
            systemctl: "systemctl".into(),
            ready_deadline: Duration::from_secs(10),
            stop_deadline: Duration::from_secs(10),
        }
    }

    pub fn with_network(mut self, network: RunnerNetwork) -> Self {
        self.network = network;
        self
    }

    fn run(&self, program: &Path, args: &[OsString]) -> io::Result<(ExitStatus, String)> {
        run_program(program, args)
    }

    /// The listener's environment in a file beside the handoff: never a property or variable
    /// of the unit, which every account on the node can read.
    fn environment_file(spec: &LaunchSpec<'_>) -> Result<RestrictiveHandoff, StartError> {
        let encoded =
            secrecy::SecretString::from(format!("{}\n", encode_environment(&spec.environment)));
        RestrictiveHandoff::create_environment(spec.runtime, spec.account, &encoded)
            .map_err(|_| StartError::before_child(StartFailure::EnvironmentFile))
    }

    /// A start failed with a unit submitted: its whole cgroup is killed, and the JIT counts as
    /// seen.
    fn failed_with_unit(&self, unit: &str, failure: StartFailure) -> StartError {
        let _ = self.kill_unit(unit);
        StartError {
            failure,
            child_existed: true,
            live: None,
        }
    }

    /// The end of a start, once the helper took the handoff: the handoff and environment files
    /// gone, the runner's identity from the helper's receipt, made durable.
    fn identify(
        &self,
        spec: &LaunchSpec<'_>,
        unit: &str,
        handoff: RestrictiveHandoff,
        environment_file: RestrictiveHandoff,
    ) -> Result<ProcessIdentity, StartError> {
        let fail = |failure| self.failed_with_unit(unit, failure);
        let _ = handoff.delete();
        // Taken by the helper before the handoff; gone already, or removed now.
        let _ = environment_file.delete();
        // The helper's receipt, not systemd's MainPID: a runner that took a queued job, ran it
        // and exited before the question was asked has none left.
        let receipt_path = spec.runtime.join(RECEIPT);
        let receipt = Receipt::read(&receipt_path, spec.account.uid);
        let _ = std::fs::remove_file(&receipt_path);
        let Some(receipt) = receipt else {
            return Err(fail(StartFailure::NoStartTime));
        };
        let now = read_stat(receipt.pid).ok().flatten();
        let cgroup = read_cgroup_v2(receipt.pid).ok().flatten();
        let Some(cgroup) = believed_cgroup(unit, receipt, now, cgroup) else {
            return Err(fail(StartFailure::NoStartTime));
        };
        let identity = ProcessIdentity {
            launcher: Launcher::Systemd,
            unit: Some(unit.to_owned()),
            pid: receipt.pid,
            start_time: receipt.start_time,
            cgroup,
        };
        identity_file::write(spec.runtime, &identity).map_err(|e| fail(e.into()))?;
        Ok(identity)
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

/// Runs `systemd-run` or `systemctl`: its exit status and standard output.
fn run_program(program: &Path, args: &[OsString]) -> io::Result<(ExitStatus, String)> {
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

/// Whether the helper that wrote the receipt in `runtime` has ended. No receipt yet: not known
/// to have ended (it writes one first thing).
fn helper_ended(runtime: &Path, uid: u32) -> bool {
    let Some(receipt) = Receipt::read(&runtime.join(RECEIPT), uid) else {
        return false;
    };
    !read_stat(receipt.pid)
        .ok()
        .flatten()
        .is_some_and(|s| s.start_time == receipt.start_time && !s.is_exited())
}

/// What `/proc/<pid>/cgroup` appends to the path of a cgroup2 that has been removed
/// (`proc_cgroup_show` in the kernel's cgroup.c).
const DEAD_CGROUP: &str = " (deleted)";

/// The cgroup to record with the helper's `receipt`, or `None` when the receipt cannot be the
/// unit's main process. The runner's account wrote the receipt, so it is believed only as far
/// as it can harm that account's own runner: a process that still has the receipt's pid and
/// start time must sit in the unit's cgroup (seen as the agent sees it, which is what
/// [`inspect`] compares later); one that is gone already (the runner ran its job and ended
/// before this read) is recorded as gone, in the cgroup systemd gave the unit.
fn believed_cgroup(
    unit: &str,
    receipt: Receipt,
    now: Option<ProcStat>,
    cgroup: Option<String>,
) -> Option<String> {
    let living = now.filter(|s| s.start_time == receipt.start_time && !s.is_exited());
    let own = |c: &str| c.ends_with(&format!("/{unit}"));
    match (living, cgroup) {
        (Some(_), Some(c)) if own(&c) => Some(c),
        // Exiting: past the kernel's cgroup_exit, so the unit's cgroup was empty and systemd
        // removed it, but not yet a zombie. The kernel names a removed cgroup2 with this suffix
        // (most likely why a clean-clone run once refused a runner that ended at once, as
        // NoStartTime; not reproduced).
        (Some(_), Some(c)) if c.strip_suffix(DEAD_CGROUP).is_some_and(own) => {
            c.strip_suffix(DEAD_CGROUP).map(str::to_owned)
        }
        // Alive outside the unit: not the unit's process, whoever wrote the receipt.
        (Some(_), Some(_)) => None,
        // Gone (or exiting between the two reads).
        _ => Some(format!("/{SLICE}/{unit}")),
    }
}

impl ProbeUnits for SystemdLauncher {
    fn start_probe(&self, probe: &Probe) -> io::Result<()> {
        let unit = probe_unit(probe, &self.entry_helper, &self.network);
        let (status, _) = self.run(&self.systemd_run, &unit.systemd_run_args())?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other("systemd-run refused the probe unit"))
        }
    }

    fn remove_probe(&self, probe: &Probe) {
        let _ = self.kill_unit(&probe.unit);
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
        let environment_file = Self::environment_file(spec)?;
        let unit = unit_properties(
            spec,
            &self.entry_helper,
            Handing::File(handoff.path()),
            environment_file.path(),
            &self.network,
        );
        let submitted = self.run(&self.systemd_run, &unit.systemd_run_args());
        match submitted {
            Ok((status, _)) if status.success() => {}
            // systemd-run failing leaves no unit (Type=exec fails the start itself).
            Ok(_) => return Err(StartError::before_child(StartFailure::Unit)),
            Err(e) => return Err(StartError::before_child(StartFailure::Spawn(e.kind()))),
        }
        // The helper deletes the handoff before it execs the listener.
        let until = Instant::now() + self.ready_deadline;
        loop {
            match handoff.exists() {
                Ok(false) => break,
                Ok(true) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
                _ => return Err(self.failed_with_unit(&unit.name, StartFailure::NotReadyInTime)),
            }
        }
        self.identify(spec, &unit.name, handoff, environment_file)
    }

    fn prestart(&self, spec: &LaunchSpec<'_>) -> Option<Prestart> {
        // What an earlier runner of a persistent slot (or a launch a crash cut short) left
        // would be read as this helper's: its receipt, a pointer to a handoff, a taken marker.
        let _ = std::fs::remove_file(spec.runtime.join(RECEIPT));
        crate::handoff::clear_stale_offer(spec.runtime);
        let environment_file = Self::environment_file(spec).ok()?;
        let unit = unit_properties(
            spec,
            &self.entry_helper,
            Handing::Awaited(AWAIT_HANDOFF_SECONDS),
            environment_file.path(),
            &self.network,
        );
        let (program, args) = (self.systemd_run.clone(), unit.systemd_run_args());
        // A thread, not the runtime's blocking pool: the caller's JIT request runs meanwhile on
        // the task that started it, and the launcher holds no `'static` handle to lend.
        let submitted = std::thread::Builder::new()
            .name("rm-prestart".to_owned())
            .spawn(move || matches!(run_program(&program, &args), Ok((s, _)) if s.success()))
            .ok()?;
        Some(Prestart {
            unit: unit.name,
            environment_file,
            submitted,
        })
    }

    fn start_prestarted(
        &self,
        spec: &LaunchSpec<'_>,
        prestart: Prestart,
        handoff: RestrictiveHandoff,
    ) -> Result<ProcessIdentity, PrestartedStart> {
        let Prestart {
            unit,
            environment_file,
            submitted,
        } = prestart;
        // systemd-run failing leaves no unit (Type=exec fails the start itself).
        if !submitted.join().unwrap_or(false) {
            return Err(PrestartedStart::Unseen(handoff));
        }
        let runtime = spec.runtime;
        let failed = |failure| PrestartedStart::Failed(self.failed_with_unit(&unit, failure));
        if crate::handoff::offer(runtime, spec.account, handoff.name()).is_err() {
            // Nothing was offered: the helper never learns the handoff's name.
            let _ = self.kill_unit(&unit);
            let _ = std::fs::remove_file(runtime.join(HANDOFF_POINTER));
            return Err(PrestartedStart::Unseen(handoff));
        }
        // Taken once the helper marked it and the handoff is gone (it deletes the handoff, then
        // marks, then execs the listener).
        let marker = runtime.join(TAKEN_MARKER);
        let until = Instant::now() + self.ready_deadline;
        loop {
            let marked = std::fs::symlink_metadata(&marker).is_ok();
            match handoff.exists() {
                Ok(false) if marked => break,
                // The helper ended (its await ran out, or it was killed) with the handoff still
                // there: once its unit is killed, nothing of it can read the JIT, which the
                // caller may then hand to a runner started the ordinary way.
                Ok(true) if helper_ended(runtime, spec.account.uid) => {
                    // Proven stopped and unloaded: the ordinary start reuses the unit's name.
                    let _ = self.stop_unit_named(&unit);
                    let _ = std::fs::remove_file(runtime.join(HANDOFF_POINTER));
                    return match handoff.exists() {
                        Ok(true) => Err(PrestartedStart::Unseen(handoff)),
                        _ => Err(failed(StartFailure::NotReadyInTime)),
                    };
                }
                Ok(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(2)),
                _ => return Err(failed(StartFailure::NotReadyInTime)),
            }
        }
        // A persistent slot keeps its runtime: no marker may speak for the next runner in it.
        let _ = std::fs::remove_file(&marker);
        self.identify(spec, &unit, handoff, environment_file)
            .map_err(PrestartedStart::Failed)
    }

    fn stop_prestarted(&self, short: &str) -> Result<Stopped, StopError> {
        // The same unit, found the same way: by the name only attempt `short` derives.
        self.stop_leftover(short)
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
        self.units_of_slice("rm-*.service", runner_unit_attempt)
    }

    fn stop_leftover(&self, short: &str) -> Result<Stopped, StopError> {
        if !super::launcher::is_attempt_short(short) {
            return Err(StopError::NotOurs);
        }
        self.stop_unit_named(&format!("rm-{short}.service"))
    }

    fn start_engine(&self, spec: &EngineSpec<'_>) -> Result<(), String> {
        let unit = engine_unit(spec, &self.entry_helper, &self.network);
        match self.run(&self.systemd_run, &unit.systemd_run_args()) {
            Ok((status, _)) if status.success() => Ok(()),
            Ok(_) => Err(format!(
                "systemd refused the engine's unit {} (is Podman at {}?)",
                unit.name,
                spec.podman.display()
            )),
            Err(e) => Err(format!("systemd-run could not be run ({:?})", e.kind())),
        }
    }

    fn stop_engine(&self, short: &str) -> Result<Stopped, StopError> {
        if !super::launcher::is_attempt_short(short) {
            return Err(StopError::NotOurs);
        }
        self.stop_unit_named(&format!("rm-{short}-docker.service"))
    }

    fn engine_leftovers(&self) -> io::Result<Vec<String>> {
        self.units_of_slice("rm-*-docker.service", engine::unit_attempt_prefix)
    }
}

impl SystemdLauncher {
    /// The attempt names `parse` reads from the loaded units matching `pattern` that sit in the
    /// runners' own slice: a unit of that name elsewhere is not ours.
    fn units_of_slice(
        &self,
        pattern: &str,
        parse: fn(&str) -> Option<&str>,
    ) -> io::Result<Vec<String>> {
        let (status, out) = self.run(
            &self.systemctl,
            &[
                "list-units".into(),
                "--all".into(),
                "--plain".into(),
                "--no-legend".into(),
                "--type=service".into(),
                pattern.into(),
            ],
        )?;
        if !status.success() {
            return Err(io::Error::other("systemctl list-units failed"));
        }
        let mut ours = Vec::new();
        for unit in listed_units(&out) {
            let Some(short) = parse(&unit) else { continue };
            let (ok, slice) = self.run(
                &self.systemctl,
                &[
                    "show".into(),
                    "--property=Slice".into(),
                    "--value".into(),
                    unit.as_str().into(),
                ],
            )?;
            if ok.success() && slice.trim() == SLICE {
                ours.push(short.to_owned());
            }
        }
        ours.sort();
        ours.dedup();
        Ok(ours)
    }

    /// Kills every process of `unit` and proves it gone (no main pid, inactive or unloaded).
    fn stop_unit_named(&self, unit: &str) -> Result<Stopped, StopError> {
        let (_, _, before) = self.show(unit).map_err(|_| StopError::Unit)?;
        self.kill_unit(unit).map_err(|_| StopError::Unit)?;
        let until = Instant::now() + self.stop_deadline;
        loop {
            let (pid, _, state) = self.show(unit).map_err(|_| StopError::Unit)?;
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

/// The unit names of a `systemctl list-units --plain --no-legend` listing.
fn listed_units(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("rm-")))
        .map(str::to_owned)
        .collect()
}

/// The attempt name of a runner's unit (`rm-<12hex>.service`), and of nothing else.
fn runner_unit_attempt(unit: &str) -> Option<&str> {
    unit.strip_prefix("rm-")?
        .strip_suffix(".service")
        .filter(|h| super::launcher::is_attempt_short(h))
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
    use crate::providers::sandbox::Probe;

    /// A `runner.env` value with spaces or a newline cannot add a property or a variable: it
    /// stays inside the one encoded word, and decodes back to exactly itself.
    #[test]
    fn only_attempt_units_are_listed_as_leftovers() {
        let listing = "rm-0123456789ab.service loaded active running rm\n\
            ● rm-abcdefabcdef.service loaded failed failed rm\n\
            rm-0123.service loaded active running short\n\
            rm-0123456789AB.service loaded active running upper\n\
            sshd.service loaded active running OpenSSH\n";
        let units = listed_units(listing);
        let runners: Vec<&str> = units
            .iter()
            .filter_map(|u| runner_unit_attempt(u))
            .collect();
        assert_eq!(runners, ["0123456789ab", "abcdefabcdef"]);
    }

    fn hostile_spec(runtime: &Path) -> LaunchSpec<'_> {
        let environment: BTreeMap<String, String> = [
            ("A", "x Environment=LD_PRELOAD=/tmp/x.so"),
            ("B", "y User=root"),
            ("C", "z\nUser=root"),
            ("D", "\"q\" 'r' \\ $HOME %n"),
            ("TENANT_SECRET", "s3cr3tvalue"),
            ("PATH", "/usr/bin:/bin"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        LaunchSpec {
            attempt: uuid::Uuid::from_u128(0x0123456789ab4cde8f0123456789abcd),
            runtime,
            account: RunnerAccount {
                uid: 1201,
                gid: 1200,
            },
            environment,
            limits: CgroupLimits::default(),
            cache: None,
        }
    }

    /// A unit started ahead of its JIT (issue 32) names no handoff: its helper waits for the
    /// agent's pointer (`--await-handoff`), and reads its environment file and writes its
    /// receipt as an ordinary start's does. An ordinary start names its handoff and waits for
    /// nothing.
    #[test]
    fn a_unit_started_ahead_awaits_its_handoff_and_names_none() {
        let runtime = Path::new("/var/lib/runner-manager/runners/0123456789ab");
        let spec = hostile_spec(runtime);
        let environment = runtime.join("jit-env-1.tmp");
        let helper_args = |handing| {
            let unit = unit_properties(
                &spec,
                Path::new("/h"),
                handing,
                &environment,
                &RunnerNetwork::default(),
            );
            EntryArgs::parse(unit.command[1..].iter().cloned()).unwrap()
        };
        let ahead = helper_args(Handing::Awaited(AWAIT_HANDOFF_SECONDS));
        assert_eq!(ahead.await_handoff, Some(AWAIT_HANDOFF_SECONDS));
        assert_eq!(ahead.handoff, runtime.join(HANDOFF_POINTER));
        assert_eq!(ahead.environment.as_deref(), Some(environment.as_path()));
        assert_eq!(ahead.receipt, Some(runtime.join(RECEIPT)));
        let handoff = runtime.join("jit-6f1c2a.tmp");
        let ordinary = helper_args(Handing::File(&handoff));
        assert_eq!(ordinary.await_handoff, None);
        assert_eq!(ordinary.handoff, handoff);
        assert_eq!(
            (ordinary.environment, ordinary.receipt),
            (ahead.environment, ahead.receipt)
        );
    }

    /// Nothing of a policy's environment is in the unit: no property, no variable, no argument
    /// (issue 28 item 4). It reaches the helper only through the environment file.
    #[test]
    fn no_policy_environment_reaches_the_unit() {
        let runtime = Path::new("/var/lib/runner-manager/runners/0123456789ab");
        let spec = hostile_spec(runtime);
        let unit = unit_properties(
            &spec,
            Path::new("/usr/bin/runner-manager-runner-entry"),
            Handing::File(&runtime.join("jit-6f1c2a.tmp")),
            &runtime.join("jit-env-77aa.tmp"),
            &RunnerNetwork::default(),
        );
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
        for a in &argv {
            for (name, value) in &spec.environment {
                // One-letter names are in every argument; the values and the long name are not.
                if name != "PATH" {
                    assert!(!a.contains(value.as_str()), "{value} in {a}");
                }
                assert!(!a.contains("TENANT_SECRET"), "{a}");
            }
            assert!(!a.contains(ENVIRONMENT_VARIABLE), "{a}");
        }
        let end = argv.iter().position(|a| a == "--").unwrap();
        let options = &argv[..end];
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
        assert_eq!(
            setenv,
            ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"],
            "only the helper's fixed environment"
        );
        assert_eq!(options.len(), 4 + properties.len() + setenv.len());
        assert_eq!(
            &argv[end + 1..],
            [
                "/usr/bin/runner-manager-runner-entry",
                "--handoff",
                "/var/lib/runner-manager/runners/0123456789ab/jit-6f1c2a.tmp",
                "--runtime",
                "/var/lib/runner-manager/runners/0123456789ab",
                "--environment",
                "/var/lib/runner-manager/runners/0123456789ab/jit-env-77aa.tmp",
                "--receipt",
                "/var/lib/runner-manager/runners/0123456789ab/.entry-receipt",
            ]
        );
    }

    /// What the environment file holds decodes back to exactly the policy's environment, and is
    /// one inert word (a hostile value cannot add a record).
    #[test]
    fn the_environment_file_content_round_trips() {
        let spec = hostile_spec(Path::new("/rt"));
        let encoded = encode_environment(&spec.environment);
        assert!(!encoded.contains('\n') && !encoded.contains(' '));
        let back: BTreeMap<String, String> =
            decode_environment(&encoded).unwrap().into_iter().collect();
        assert_eq!(back, spec.environment);
    }

    /// The sandbox of issue 28 item 3 is in every runner unit, and the network filter with it.
    #[test]
    fn a_runner_unit_carries_the_whole_sandbox() {
        let runtime = Path::new("/var/lib/runner-manager/runners/0123456789ab");
        let network = RunnerNetwork::new(
            &["10.98.0.0/24".parse().unwrap()],
            &["10.97.0.0/24".parse().unwrap()],
            &["10.213.7.2".parse().unwrap()],
            &["169.254.20.10".parse().unwrap()],
        )
        .unwrap();
        let unit = unit_properties(
            &hostile_spec(runtime),
            Path::new("/h"),
            Handing::File(&runtime.join("jit-1.tmp")),
            &runtime.join("jit-env-1.tmp"),
            &network,
        );
        let get = |k: &str| -> Vec<&str> {
            unit.properties
                .iter()
                .filter(|(p, _)| p == k)
                .map(|(_, v)| v.as_str())
                .collect()
        };
        assert_eq!(get("SystemCallFilter"), ["@system-service"]);
        assert_eq!(get("SystemCallArchitectures"), ["native"]);
        assert_eq!(get("RestrictNamespaces"), ["yes"]);
        assert_eq!(get("PrivateIPC"), ["yes"]);
        assert_eq!(
            get("RestrictAddressFamilies"),
            ["AF_UNIX AF_INET AF_INET6 AF_NETLINK"]
        );
        let hidden = get("InaccessiblePaths");
        for p in [
            "-/var/lib/kubelet",
            "-/var/lib/containerd",
            "-/var/log/pods",
            "-/etc/kubernetes",
        ] {
            assert!(hidden[0].split(' ').any(|h| h == p), "{p}: {hidden:?}");
        }
        let deny = get("IPAddressDeny");
        for p in [
            "169.254.0.0/16",
            "fe80::/10",
            "168.63.129.16",
            "fd20:ce::254",
            "fd00:ec2::23",
            "fd00:ec2::254",
            "100.100.100.200",
            "10.98.0.0/24",
            "10.97.0.0/24",
            "10.213.7.2",
        ] {
            assert!(deny[0].split(' ').any(|d| d == p), "{p}: {deny:?}");
        }
        assert_eq!(get("IPAddressAllow"), ["169.254.20.10"]);
        // The probe unit has the same filter, and no RemoveIPC (it would empty nobody's IPC).
        let probe = Probe {
            unit: "rm-probe-0123456789ab.service".into(),
            target: "10.98.0.9:4242".parse().unwrap(),
            dir: "/var/lib/runner-manager/.network-probe-0123456789ab".into(),
            result: "/var/lib/runner-manager/.network-probe-0123456789ab/result".into(),
            account: crate::providers::sandbox::PROBE_ACCOUNT,
        };
        let pu = probe_unit(&probe, Path::new("/h"), &network);
        let same = |k: &str| {
            pu.properties
                .iter()
                .filter(|(p, _)| p == k)
                .map(|(_, v)| v.as_str())
                .collect::<Vec<_>>()
                == get(k)
        };
        for k in [
            "IPAddressDeny",
            "IPAddressAllow",
            "RestrictNamespaces",
            "SystemCallFilter",
        ] {
            assert!(same(k), "{k}");
        }
        assert!(!pu.properties.iter().any(|(k, _)| k == "RemoveIPC"));
        assert_eq!(
            pu.command[1..3],
            ["--probe-connect".into(), OsString::from("10.98.0.9:4242")]
        );
    }

    #[test]
    fn a_receipt_is_believed_only_for_the_units_own_process_or_one_already_gone() {
        let unit = "rm-0123456789ab.service";
        let receipt = Receipt {
            pid: 4242,
            start_time: 100,
        };
        let running = |start_time| {
            Some(ProcStat {
                state: 'S',
                start_time,
            })
        };
        let own = format!("/{SLICE}/{unit}");
        assert_eq!(
            believed_cgroup(unit, receipt, running(100), Some(own.clone())),
            Some(own.clone())
        );
        // Seen from a cgroup namespace, the path is the agent's view: that is what is compared.
        let nested = format!("/kubepods/x/{unit}");
        assert_eq!(
            believed_cgroup(unit, receipt, running(100), Some(nested.clone())),
            Some(nested)
        );
        // A living process elsewhere (another runner, the agent): never adopted.
        for other in [
            format!("/{SLICE}/rm-ffffffffffff.service"),
            format!("/{SLICE}/x{unit}"),
            "/".to_owned(),
        ] {
            assert_eq!(
                believed_cgroup(unit, receipt, running(100), Some(other.clone())),
                None,
                "{other}"
            );
        }
        // The runner took a queued job, ran it and ended before the read: started, and gone.
        for now in [
            None,
            running(101),
            Some(ProcStat {
                state: 'Z',
                start_time: 100,
            }),
        ] {
            assert_eq!(believed_cgroup(unit, receipt, now, None), Some(own.clone()));
        }
        assert_eq!(
            believed_cgroup(unit, receipt, running(100), None),
            Some(own.clone())
        );
        // Exiting, its cgroup already removed: the unit's process, ending.
        assert_eq!(
            believed_cgroup(
                unit,
                receipt,
                running(100),
                Some(format!("{own} (deleted)"))
            ),
            Some(own)
        );
        // A removed cgroup that was not the unit's is still someone else's.
        assert_eq!(
            believed_cgroup(
                unit,
                receipt,
                running(100),
                Some(format!("/{SLICE}/rm-ffffffffffff.service (deleted)"))
            ),
            None
        );
    }
    #[test]
    fn a_docker_engine_keeps_its_state_in_the_attempts_directory_and_lacks_what_a_job_lacks() {
        let attempt = uuid::Uuid::parse_str("0123456789ab4def8000000000000000").unwrap();
        let dirs = engine::EngineDirs::new(Path::new("/var/lib/runner-manager"), &attempt);
        assert_eq!(
            dirs.root,
            Path::new("/var/lib/runner-manager/docker/0123456789ab")
        );
        // Its state in the attempt's directory, its runtime state in the unit's own /run
        // directory (short enough for the sockets Podman binds there).
        for text in [dirs.containers_conf_text(), dirs.storage_conf_text()] {
            for line in text.lines().filter(|l| l.contains('/')) {
                assert!(
                    line.contains("/var/lib/runner-manager/docker/0123456789ab/")
                        || line.contains("/run/rm-0123456789ab-docker/"),
                    "{line}"
                );
            }
        }
        assert_eq!(dirs.run(), Path::new("/run/rm-0123456789ab-docker"));
        assert_eq!(dirs.socket_too_long(), None);
        let long = engine::EngineDirs::new(&Path::new("/var/lib").join("x".repeat(80)), &attempt);
        assert!(
            long.socket_too_long()
                .is_some_and(|why| why.contains("a shorter --host-root"))
        );
        let spec = EngineSpec {
            attempt,
            account: crate::account::RunnerAccount {
                uid: 20001,
                gid: 20000,
            },
            dirs: &dirs,
            runtime: Path::new("/var/lib/runner-manager/runners/0123456789ab"),
            cache: None,
            podman: Path::new("/usr/bin/podman"),
            limits: &CgroupLimits {
                memory_max: Some(1 << 30),
                tasks_max: Some(512),
                ..CgroupLimits::default()
            },
        };
        let unit = engine_unit(
            &spec,
            Path::new("/var/lib/runner-manager/bin/runner-manager-runner-entry"),
            &RunnerNetwork::default(),
        );
        let get = |k: &str| {
            unit.properties
                .iter()
                .filter(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(get("User"), ["20001"]);
        assert!(get("InaccessiblePaths")[0].starts_with(INACCESSIBLE_PATHS));
        assert_eq!(get("ProtectSystem"), ["strict"]);
        assert_eq!(
            get("BindReadOnlyPaths"),
            ["/var/lib/runner-manager/docker/0123456789ab/systemd-run:/usr/bin/systemd-run"]
        );
        assert_eq!(get("TemporaryFileSystem"), ["/var/lib/cni:ro"]);
        assert_eq!(get("RuntimeDirectory"), ["rm-0123456789ab-docker"]);
        // The attempt's limits hold for its containers too.
        assert_eq!(get("MemoryMax"), ["1073741824"]);
        assert_eq!(get("TasksMax"), ["512"]);
        assert_eq!(
            get("ReadWritePaths"),
            [
                "/var/lib/runner-manager/docker/0123456789ab /var/lib/runner-manager/runners/0123456789ab"
            ]
        );
        assert!(
            !get("IPAddressDeny").is_empty(),
            "the runners' network filter"
        );
        // What an engine needs and a runner's unit refuses.
        for absent in [
            "NoNewPrivileges",
            "RestrictNamespaces",
            "SystemCallFilter",
            "CapabilityBoundingSet",
        ] {
            assert!(get(absent).is_empty(), "{absent}");
        }
        assert_eq!(unit.command[1], crate::entry::ENGINE_EXEC);
        assert_eq!(
            unit.command.last().unwrap(),
            "unix:///var/lib/runner-manager/docker/0123456789ab/sock/engine.sock"
        );
    }
}
