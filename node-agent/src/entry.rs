//! The entry helper (`runner-manager-runner-entry`): the process a launcher starts for a
//! runner. It joins the runner's cgroup (direct launcher), takes the JIT from the handoff file
//! (reading and deleting it), and execs exactly `<runtime>/bin/Runner.Listener run` with the JIT
//! in `ACTIONS_RUNNER_INPUT_JITCONFIG` in the listener's own environment only, as the runner
//! account. Its own argv holds paths and ids only, never the JIT.
//!
//! Status to the direct launcher goes over the helper's stdout, which the launcher gives it as
//! a pipe: the helper moves that pipe to a close-on-exec descriptor and points stdout at
//! `/dev/null` (a runner must not hold a pipe to an agent that may die before it), writes
//! [`READY`] once the handoff is gone, then execs. A successful exec closes the pipe, so the
//! launcher's end reads `READY` then end-of-file; a failure reads [`FAILED`] and a closed kind.
//! Under systemd the pipe is the journal and the launcher watches the handoff file instead.
//!
//! The helper starts as root under the direct launcher, so nothing of a tenant's may be in its
//! own environment: a `runner.env` `LD_PRELOAD` (or any loader or C-library variable) would act
//! in a root process. The launchers start it with a fixed environment ([`helper_environment`]:
//! `PATH`, `LANG`) plus one opaque variable, [`ENVIRONMENT_VARIABLE`], holding the listener's
//! whole environment percent-encoded; neither the loader nor the C library reads that name. The
//! helper decodes it and applies it only to the final `exec`, which changes the uid first.
//!
//! Under the systemd launcher that variable would be a unit property, and every local account
//! reads a unit's properties (`systemctl show -p Environment`, `systemctl cat`, the unit file
//! under `/run/systemd/transient`): another tenant's runner would read this one's `runner.env`.
//! There the encoded environment comes instead in a file made like the JIT's handoff
//! (`--environment`, [`crate::handoff::RestrictiveHandoff::create_environment`]), which the
//! helper reads and deletes before it takes the JIT.

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use secrecy::ExposeSecret;

use crate::handoff;
use crate::process::environment::JIT_VARIABLE;

pub use crate::handoff::{HANDOFF_POINTER, TAKEN_MARKER};
/// How long a helper started before its JIT (a runner pod's, or a unit the systemd launcher
/// pre-started) waits for its handoff before it gives up and ends: the JIT request's own bound
/// and the placeholder's, and then some.
pub const AWAIT_HANDOFF_SECONDS: u64 = 600;
/// In the runtime: the systemd launcher's [`Receipt`], written by the helper.
pub const RECEIPT: &str = ".entry-receipt";
/// The first status line once the handoff is read and deleted and exec is next.
pub const READY: &str = "ready";
/// The status line's prefix on failure, followed by an [`EntryFailure`] kind.
pub const FAILED: &str = "failed ";
/// The listener, relative to the runtime.
pub const LISTENER: &str = "bin/Runner.Listener";
/// The exit code of a helper that failed before exec.
pub const EXIT_FAILED: i32 = 125;
use runner_manager_crds::helper_env::plain;
pub use runner_manager_crds::helper_env::{
    ENVIRONMENT_VARIABLE, HELPER_LANG, HELPER_PATH, encode_environment, helper_environment,
};

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'A'..=b'F' => Some(b - b'A' + 10),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

/// Reads back what [`encode_environment`] wrote. Refuses anything else: a byte that should
/// have been escaped, a bad escape, a record without a valid name, a value that is not UTF-8,
/// and a `ACTIONS_RUNNER_INPUT_*` name (only the helper sets the JIT).
pub fn decode_environment(encoded: &str) -> Result<Vec<(String, String)>, EntryFailure> {
    let mut bytes = Vec::with_capacity(encoded.len());
    let mut it = encoded.bytes();
    while let Some(b) = it.next() {
        if b == b'%' {
            let hi = it
                .next()
                .and_then(hex_digit)
                .ok_or(EntryFailure::Environment)?;
            let lo = it
                .next()
                .and_then(hex_digit)
                .ok_or(EntryFailure::Environment)?;
            bytes.push((hi << 4) | lo);
        } else if plain(b) {
            bytes.push(b);
        } else {
            return Err(EntryFailure::Environment);
        }
    }
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    bytes
        .split(|b| *b == 0)
        .map(|record| {
            let text = std::str::from_utf8(record).map_err(|_| EntryFailure::Environment)?;
            let (name, value) = text.split_once('=').ok_or(EntryFailure::Environment)?;
            let mut chars = name.bytes();
            let valid = matches!(chars.next(), Some(c) if c == b'_' || c.is_ascii_alphabetic())
                && chars.all(|c| c == b'_' || c.is_ascii_alphanumeric());
            if !valid || is_reserved_input(name) {
                return Err(EntryFailure::Environment);
            }
            Ok((name.to_owned(), value.to_owned()))
        })
        .collect()
}

fn is_reserved_input(name: &str) -> bool {
    name.to_ascii_uppercase()
        .starts_with("ACTIONS_RUNNER_INPUT_")
}

/// What the helper is told. Paths and ids only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryArgs {
    /// The handoff file. In a runner pod ([`Self::await_handoff`]) the agent writes it after the
    /// helper started, so the helper learns its name from the pointer the agent writes next to
    /// it ([`HANDOFF_POINTER`]).
    pub handoff: PathBuf,
    /// Runner pod: wait this many seconds at most for the pointer to the handoff, and leave
    /// [`TAKEN_MARKER`] once it is taken.
    pub await_handoff: Option<u64>,
    pub runtime: PathBuf,
    /// Direct launcher: the cgroup directory to join before anything else.
    pub cgroup: Option<PathBuf>,
    /// Direct launcher: the account to become at exec (systemd already started us as it).
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Systemd launcher: the environment file (`jit-env-<uuid>.tmp`) holding the encoded
    /// listener's environment, in place of [`ENVIRONMENT_VARIABLE`].
    pub environment: Option<PathBuf>,
    /// Direct launcher: added to the helper's niceness before the exec (`--runner-nice`;
    /// systemd sets a unit's `Nice=` itself).
    pub nice: Option<u8>,
    /// Systemd launcher: where the helper writes its [`Receipt`] before it takes the handoff.
    pub receipt: Option<PathBuf>,
}

impl EntryArgs {
    /// The helper's argv after the program name.
    pub fn to_args(&self) -> Vec<OsString> {
        // A helper awaiting its handoff learns its name from the pointer: `--handoff` and
        // `--await-handoff` together are refused.
        let mut a: Vec<OsString> = match self.await_handoff {
            None => vec!["--handoff".into(), self.handoff.clone().into()],
            Some(_) => Vec::new(),
        };
        a.push("--runtime".into());
        a.push(self.runtime.clone().into());
        // Each optional flag, when set, in this order.
        let number = |n: u64| OsString::from(n.to_string());
        let optional: [(&str, Option<OsString>); 7] = [
            ("--cgroup", self.cgroup.clone().map(Into::into)),
            ("--uid", self.uid.map(u64::from).map(number)),
            ("--gid", self.gid.map(u64::from).map(number)),
            ("--await-handoff", self.await_handoff.map(number)),
            ("--environment", self.environment.clone().map(Into::into)),
            ("--nice", self.nice.map(u64::from).map(number)),
            ("--receipt", self.receipt.clone().map(Into::into)),
        ];
        for (flag, value) in optional {
            if let Some(value) = value {
                a.push(flag.into());
                a.push(value);
            }
        }
        a
    }

    /// Parses what [`to_args`](Self::to_args) wrote.
    pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Self, EntryFailure> {
        let (mut handoff, mut runtime, mut cgroup, mut uid, mut gid, mut await_handoff) =
            (None, None, None, None, None, None);
        let (mut environment, mut nice, mut receipt) = (None, None, None);
        let mut it = args.into_iter();
        while let Some(flag) = it.next() {
            let value = it.next().ok_or(EntryFailure::Usage)?;
            let id = || {
                value
                    .to_str()
                    .and_then(|s| s.parse::<u32>().ok())
                    .ok_or(EntryFailure::Usage)
            };
            match flag.to_str() {
                Some("--handoff") => handoff = Some(PathBuf::from(&value)),
                Some("--runtime") => runtime = Some(PathBuf::from(&value)),
                Some("--cgroup") => cgroup = Some(PathBuf::from(&value)),
                Some("--uid") => uid = Some(id()?),
                Some("--gid") => gid = Some(id()?),
                Some("--await-handoff") => await_handoff = Some(u64::from(id()?)),
                Some("--environment") => environment = Some(PathBuf::from(&value)),
                Some("--receipt") => receipt = Some(PathBuf::from(&value)),
                Some("--nice") => {
                    nice = Some(
                        u8::try_from(id()?)
                            .ok()
                            .filter(|n| *n <= 19)
                            .ok_or(EntryFailure::Usage)?,
                    );
                }
                _ => return Err(EntryFailure::Usage),
            }
        }
        let runtime: PathBuf = runtime.ok_or(EntryFailure::Usage)?;
        let handoff = match (handoff, await_handoff) {
            (Some(h), None) => h,
            // Named by the pointer once the agent offers it.
            (None, Some(_)) => runtime.join(HANDOFF_POINTER),
            _ => return Err(EntryFailure::Usage),
        };
        Ok(Self {
            handoff,
            await_handoff,
            runtime,
            cgroup,
            uid,
            gid,
            environment,
            nice,
            receipt,
        })
    }
}

/// Why the helper stopped before exec. Closed: it is all the launcher learns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EntryFailure {
    #[error("usage")]
    Usage,
    #[error("status-channel")]
    StatusChannel,
    #[error("join-cgroup")]
    JoinCgroup,
    #[error("handoff")]
    Handoff,
    #[error("no-new-privileges")]
    NoNewPrivileges,
    #[error("environment")]
    Environment,
    #[error("exec")]
    Exec,
    #[error("receipt")]
    Receipt,
}

impl EntryFailure {
    pub const ALL: [Self; 8] = [
        Self::Usage,
        Self::StatusChannel,
        Self::JoinCgroup,
        Self::Handoff,
        Self::NoNewPrivileges,
        Self::Environment,
        Self::Exec,
        Self::Receipt,
    ];

    /// Reads a kind back from a status line.
    pub fn from_kind(kind: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.to_string() == kind)
    }
}

/// Moves stdout to a close-on-exec descriptor (the status channel) and points stdout at
/// `/dev/null`.
fn take_status_channel() -> Result<std::fs::File, EntryFailure> {
    let status: OwnedFd = rustix::io::fcntl_dupfd_cloexec(std::io::stdout(), 3)
        .map_err(|_| EntryFailure::StatusChannel)?;
    let null = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .map_err(|_| EntryFailure::StatusChannel)?;
    rustix::stdio::dup2_stdout(&null).map_err(|_| EntryFailure::StatusChannel)?;
    Ok(std::fs::File::from(status))
}

/// Joins the cgroup by writing our own pid ("0" means the writer) to its `cgroup.procs`.
fn join_cgroup(dir: &std::path::Path) -> Result<(), EntryFailure> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut procs = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(dir.join("cgroup.procs"))
        .map_err(|_| EntryFailure::JoinCgroup)?;
    procs.write_all(b"0").map_err(|_| EntryFailure::JoinCgroup)
}

/// Runner pod: waits (at most `seconds`) for the agent's pointer to the handoff, removes the
/// pointer and returns the handoff's path. Only a handoff name in the runtime itself is accepted:
/// the pointer cannot send the helper anywhere else.
fn await_offer(runtime: &std::path::Path, seconds: u64) -> Option<PathBuf> {
    let pointer = runtime.join(HANDOFF_POINTER);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    loop {
        // Not there yet, or still the agent's (root's) until it hands it over: wait.
        if let Ok(name) = std::fs::read_to_string(&pointer) {
            let name = name.trim();
            let _ = std::fs::remove_file(&pointer);
            let plain = !name.contains('/') && handoff::is_handoff_name(name.as_ref());
            return plain.then(|| runtime.join(name));
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        // Short: the runner pod's start waits here on the launch's path.
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Runner pod: tells the agent the handoff was taken (a file it reads on the host).
fn mark_taken(runtime: &std::path::Path) -> std::io::Result<()> {
    crate::durable::write_file(runtime, TAKEN_MARKER, b"taken\n")
}

/// The listener's environment: from the environment file when the launcher gave one (read
/// once and deleted), else from [`ENVIRONMENT_VARIABLE`]. Both at once is refused: a launcher
/// sets exactly one channel, and a second one could only be someone else's.
fn listener_environment(
    args: &EntryArgs,
    owner: u32,
) -> Result<Vec<(String, String)>, EntryFailure> {
    let variable = std::env::var_os(ENVIRONMENT_VARIABLE);
    match (&args.environment, variable) {
        (Some(path), None) => {
            let encoded =
                handoff::take_environment(path, owner).map_err(|_| EntryFailure::Environment)?;
            let text = encoded.expose_secret();
            decode_environment(text.strip_suffix('\n').unwrap_or(text))
        }
        (None, Some(v)) => decode_environment(v.to_str().ok_or(EntryFailure::Environment)?),
        _ => Err(EntryFailure::Environment),
    }
}

/// The runner's CPU priority, `nice` below the default: the niceness of this process (inherited
/// by the listener and its jobs) and of its session's scheduler autogroup. With autogroups
/// (`kernel.sched_autogroup_enabled`, on in most distributions' kernels) the `setsid` above made
/// a group of its own, weighed against the agent's as a whole whatever its threads' niceness:
/// without the second write the busy-node benchmark measured the same launch latency with and
/// without `--runner-nice`. Lowering one's own priority needs no privilege; a kernel without
/// autogroups has no file to write, and the runner then runs a little faster than asked, nothing
/// worse.
fn lower_priority(nice: u8) {
    let _ = rustix::process::setpriority_process(None, i32::from(nice));
    let _ = std::fs::write("/proc/self/autogroup", nice.to_string());
}

/// The helper's pid and start time, which `exec` keeps: what the systemd launcher records as the
/// runner's identity. Written by the helper before it takes the handoff, so it is there once the
/// handoff is gone, however soon the runner ends; asking systemd for the unit's main pid after
/// that (as the launcher once did) found none when the runner had already run its job and exited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Receipt {
    pub pid: u32,
    pub start_time: u64,
}

impl Receipt {
    /// Longer than any receipt: a bigger file is not one.
    const MAX_LEN: usize = 64;

    fn encode(self) -> String {
        format!("{} {}\n", self.pid, self.start_time)
    }

    /// `None` for anything but exactly what [`Self::encode`] writes.
    pub fn parse(text: &str) -> Option<Self> {
        let (pid, start) = text.strip_suffix('\n')?.split_once(' ')?;
        let pid = pid.parse().ok().filter(|p| *p != 0)?;
        Some(Self {
            pid,
            start_time: start.parse().ok()?,
        })
    }

    /// The launcher's read of a receipt in a directory the runner's account owns: never through
    /// a link, only a small regular file of that account.
    pub fn read(path: &std::path::Path, owner_uid: u32) -> Option<Self> {
        use std::io::Read;
        use std::os::unix::fs::MetadataExt;
        let fd = rustix::fs::open(
            path,
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .ok()?;
        let file = std::fs::File::from(fd);
        let meta = file.metadata().ok()?;
        if !meta.is_file() || meta.uid() != owner_uid || meta.len() > Self::MAX_LEN as u64 {
            return None;
        }
        let mut text = String::new();
        file.take(Self::MAX_LEN as u64)
            .read_to_string(&mut text)
            .ok()?;
        Self::parse(&text)
    }
}

/// Writes this process's [`Receipt`] at `path`, replacing whatever is there (a link planted by
/// an earlier job of the account is removed, not followed).
fn write_receipt(path: &std::path::Path) -> Result<(), EntryFailure> {
    let pid = std::process::id();
    let stat = crate::process::stat::read_stat(pid)
        .ok()
        .flatten()
        .ok_or(EntryFailure::Receipt)?;
    let receipt = Receipt {
        pid,
        start_time: stat.start_time,
    };
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(EntryFailure::Receipt),
        _ => {}
    }
    let fd = rustix::fs::open(
        path,
        rustix::fs::OFlags::WRONLY
            | rustix::fs::OFlags::CREATE
            | rustix::fs::OFlags::EXCL
            | rustix::fs::OFlags::NOFOLLOW
            | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .map_err(|_| EntryFailure::Receipt)?;
    std::fs::File::from(fd)
        .write_all(receipt.encode().as_bytes())
        .map_err(|_| EntryFailure::Receipt)
}

/// Runs the helper. Returns only on failure (success is an exec).
pub fn run(args: &EntryArgs, status: &mut impl Write) -> EntryFailure {
    // Out of the agent's session and process group: a signal to the agent's group, or its
    // terminal going away, does not reach the runner. Already a leader (systemd) is fine.
    let _ = rustix::process::setsid();
    if let Some(cgroup) = &args.cgroup
        && let Err(e) = join_cgroup(cgroup)
    {
        return e;
    }
    if let Some(n) = args.nice.filter(|n| *n > 0) {
        lower_priority(n);
    }
    // Before the handoff is taken: the launcher reads it once the handoff is gone.
    if let Some(path) = &args.receipt
        && let Err(e) = write_receipt(path)
    {
        return e;
    }
    // Decoded before the handoff is taken, so a malformed channel does not consume the JIT.
    // Missing is malformed: every launcher sets it, and a listener silently started without the
    // policy's environment would be harder to diagnose than a failed start.
    let owner = args
        .uid
        .unwrap_or_else(|| rustix::process::geteuid().as_raw());
    let env = match listener_environment(args, owner) {
        Ok(env) => env,
        Err(e) => return e,
    };
    let handoff_path = match args.await_handoff {
        None => args.handoff.clone(),
        Some(seconds) => match await_offer(&args.runtime, seconds) {
            Some(path) => path,
            None => return EntryFailure::Handoff,
        },
    };
    let jit = match handoff::take(&handoff_path, owner) {
        Ok(jit) => jit,
        Err(_) => return EntryFailure::Handoff,
    };
    if args.await_handoff.is_some() && mark_taken(&args.runtime).is_err() {
        return EntryFailure::Handoff;
    }
    let mut listener = Command::new(args.runtime.join(LISTENER));
    listener.arg("run").current_dir(&args.runtime);
    // The helper's own environment (the launcher's fixed one, or systemd's for the unit's user)
    // stays, less the channel and any JIT-shaped name; the listener's environment goes over it.
    listener.env_remove(ENVIRONMENT_VARIABLE);
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(is_reserved_input) {
            listener.env_remove(name);
        }
    }
    listener.envs(env);
    listener.env(JIT_VARIABLE, jit.expose_secret());
    drop(jit);
    if let Some(gid) = args.gid {
        listener.gid(gid);
    }
    if let Some(uid) = args.uid {
        // std clears the supplementary groups when it changes the uid as root.
        listener.uid(uid);
    }
    // The runner and everything it starts can never gain privileges (setuid binaries, file
    // capabilities), as systemd's NoNewPrivileges=yes does for the other launcher.
    if rustix::thread::set_no_new_privs(true).is_err() {
        return EntryFailure::NoNewPrivileges;
    }
    if writeln!(status, "{READY}")
        .and_then(|()| status.flush())
        .is_err()
    {
        return EntryFailure::StatusChannel;
    }
    let _ = listener.exec();
    EntryFailure::Exec
}

/// The binary's `main`: argv, status channel, run, report.
/// The helper's first argument when it starts a job's Docker engine (`crate::docker::engine`):
/// it execs the absolute program that follows with the rest. `systemd-run` looks for a unit's
/// command in the caller's file system, and the agent's container has no Podman; the helper is
/// on the host root, where both the agent and the node's systemd find it.
pub const ENGINE_EXEC: &str = "--engine-exec";

fn engine_exec(args: &[OsString]) -> Option<i32> {
    let (first, rest) = args.split_first()?;
    if first != ENGINE_EXEC {
        return None;
    }
    let Some((program, rest)) = rest.split_first() else {
        return Some(EXIT_FAILED);
    };
    if !std::path::Path::new(program).is_absolute() {
        return Some(EXIT_FAILED);
    }
    let _ = Command::new(program).args(rest).exec();
    Some(EXIT_FAILED)
}

pub fn main_with_args(args: impl IntoIterator<Item = OsString>) -> i32 {
    let args: Vec<OsString> = args.into_iter().collect();
    if let Some(code) = engine_exec(&args) {
        return code;
    }
    // The agent's start-up network proof runs this binary too (in a throw-away unit).
    if let Some(code) = crate::providers::sandbox::probe_main(&args) {
        return code;
    }

    let Ok(mut status) = take_status_channel() else {
        return EXIT_FAILED;
    };
    let failure = match EntryArgs::parse(args) {
        Ok(args) => run(&args, &mut status),
        Err(e) => e,
    };
    let _ = writeln!(status, "{FAILED}{failure}");
    EXIT_FAILED
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn args_round_trip_and_hold_no_secret_shaped_value() {
        let a = EntryArgs {
            handoff: "/rt/jit-x.tmp".into(),
            runtime: "/rt".into(),
            cgroup: Some("/sys/fs/cgroup/runner-manager.slice/rm-0123456789ab".into()),
            uid: Some(1001),
            gid: Some(1001),
            await_handoff: None,
            environment: Some("/rt/jit-env-x.tmp".into()),
            nice: Some(10),
            receipt: Some("/rt/.entry-receipt".into()),
        };
        assert_eq!(EntryArgs::parse(a.to_args()).unwrap(), a);
        for bad in ["20", "-1", "x"] {
            assert_eq!(
                EntryArgs::parse(
                    ["--runtime", "/rt", "--handoff", "/rt/h", "--nice", bad].map(OsString::from)
                ),
                Err(EntryFailure::Usage),
                "niceness {bad}"
            );
        }
        let pod =
            EntryArgs::parse(["--await-handoff", "300", "--runtime", "/rt"].map(OsString::from))
                .unwrap();
        assert_eq!(pod.await_handoff, Some(300));
        assert_eq!(pod.handoff, PathBuf::from("/rt/.jit-handoff"));
        // What `to_args` writes for a helper that awaits its handoff parses back.
        let waiting = EntryArgs {
            handoff: "/rt/.jit-handoff".into(),
            await_handoff: Some(600),
            ..a.clone()
        };
        assert_eq!(EntryArgs::parse(waiting.to_args()).unwrap(), waiting);
        assert_eq!(
            EntryArgs::parse(["--runtime", "/rt"].map(OsString::from)),
            Err(EntryFailure::Usage),
            "neither a handoff nor a wait for one"
        );
        assert_eq!(
            EntryArgs::parse(vec!["--handoff".into()]),
            Err(EntryFailure::Usage)
        );
    }

    #[test]
    fn the_environment_round_trips_as_one_inert_word() {
        let env: BTreeMap<String, String> = [
            ("PATH", "/usr/bin:/bin"),
            ("A", "x Environment=LD_PRELOAD=/tmp/x.so"),
            ("B", "y\nUser=root"),
            ("C", "quote\" back\\slash $HOME %41 ;&|`"),
            ("D", ""),
            ("E", "ünïcode ✓"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let encoded = encode_environment(&env);
        assert!(encoded.bytes().all(plain_or_escape), "{encoded}");
        assert!(!encoded.contains(' ') && !encoded.contains('\n'));
        let back: BTreeMap<String, String> =
            decode_environment(&encoded).unwrap().into_iter().collect();
        assert_eq!(back, env);
        assert_eq!(
            decode_environment(&encode_environment(&BTreeMap::new())).unwrap(),
            vec![]
        );
    }

    fn plain_or_escape(b: u8) -> bool {
        plain(b) || b == b'%'
    }

    #[test]
    fn a_malformed_or_jit_shaped_environment_is_refused() {
        for bad in [
            "A=1 B=2",
            "A=%4",
            "A=%zz",
            "=x",
            "1A=x",
            "noequals",
            "A=1%00ACTIONS_RUNNER_INPUT_JITCONFIG=x",
            "A=%FF",
        ] {
            assert_eq!(
                decode_environment(bad),
                Err(EntryFailure::Environment),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_helper_environment_is_fixed_and_holds_the_listeners_only_encoded() {
        let listener: BTreeMap<String, String> =
            [("LD_PRELOAD".to_owned(), "/tmp/x.so".to_owned())].into();
        let helper = helper_environment(&listener);
        let names: Vec<&str> = helper.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["PATH", "LANG", ENVIRONMENT_VARIABLE]);
        assert_eq!(helper[0].1, HELPER_PATH);
        assert_eq!(helper[1].1, HELPER_LANG);
    }

    #[test]
    fn failure_kinds_read_back() {
        for f in EntryFailure::ALL {
            assert_eq!(EntryFailure::from_kind(&f.to_string()), Some(f));
        }
    }

    #[test]
    fn a_receipt_is_read_back_only_as_written_and_only_from_the_accounts_own_file() {
        let r = Receipt {
            pid: 4242,
            start_time: 987_654,
        };
        assert_eq!(Receipt::parse(&r.encode()), Some(r));
        for bad in [
            "",
            "4242 987654",
            "0 1\n",
            "4242  987654\n",
            "x 1\n",
            "1 2 3\n",
        ] {
            assert_eq!(Receipt::parse(bad), None, "{bad:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        let me = rustix::process::geteuid().as_raw();
        let path = dir.path().join(RECEIPT);
        // The helper's own write, over a link an earlier job planted: the link is replaced.
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "kept").unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        write_receipt(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "kept");
        let mine = Receipt::read(&path, me).unwrap();
        assert_eq!(mine.pid, std::process::id());
        assert_eq!(Receipt::read(&path, me + 1), None, "another account's file");
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        std::fs::write(&target, r.encode()).unwrap();
        assert_eq!(Receipt::read(&path, me), None, "never through a link");
    }
}
