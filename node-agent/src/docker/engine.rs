//! The attempt's own Docker engine: rootless Podman's Docker-compatible service, run by the
//! node's systemd as a unit of the runner's account beside the runner's unit, with its storage,
//! networks and runtime state in one directory of the attempt (`<hostRoot>/docker/<12hex>`).
//!
//! One engine per attempt, not one per account or node: nothing a job builds, pulls or starts is
//! there for the next tenant of the account, and the clean-up is the unit's end (every container
//! process is in its cgroup) and the directory's removal, not a sweep of a shared engine that a
//! label could miss. The price is a cold image store per job (docs/operations.md says so).
//!
//! The unit has the runner's sandbox but for what an engine cannot run without: user namespaces
//! (a container is one), the mount calls inside them, `newuidmap` (setuid: no
//! `NoNewPrivileges`), `/dev/net/tun` for slirp4netns, its own hostname per container and the
//! network's sysctls inside its own namespace. docs/security.md, "Docker for jobs", is the
//! account of what that gives a job.

use std::io;
use std::path::{Path, PathBuf};

use runner_manager_crds::names::short_hex;

use crate::account::RunnerAccount;

/// Under the host root: one directory per attempt with an engine.
pub const DOCKER_DIR: &str = "docker";

/// `/dev/net/tun`'s device number (Linux's `misc` major, `TUN_MINOR`).
const TUN_MAJOR: u32 = 10;
const TUN_MINOR: u32 = 200;

/// Where Podman's rootless network set-up binds a directory of its own (Podman 4.3: the first
/// of `/var/lib/cni`, `/var/lib`, `/var` that exists). On a node without `/var/lib/cni` that is
/// `/var/lib`, which hides the engine's own directory under it: every container start then
/// failed with "failed to mount /run for rootless netns" (measured). The engine's unit mounts an
/// empty file system here, which also keeps the node's CNI state out of the engine's sight.
pub const CNI_DIR: &str = "/var/lib/cni";

/// The node's `systemd-run`, which netavark (1.4) runs as `systemd-run -q --user --scope
/// aardvark-dns ...` whenever it finds one on `PATH`: a runner's account has no user manager, so
/// that failed ("Failed to connect to bus") and a job's container names did not resolve
/// (measured). The engine's unit binds [`SCOPE_SHIM`] over it.
pub const SYSTEMD_RUN: &str = "/usr/bin/systemd-run";

/// What the engine finds at [`SYSTEMD_RUN`]: the command run in place, in the engine's own unit
/// (a scope would only have moved it to another cgroup; here it ends with the engine). Only the
/// options netavark passes are accepted; any other is an error, not a guess.
pub const SCOPE_SHIM: &str = r#"#!/bin/sh
# runner-manager: a job's Docker engine's stand-in for systemd-run (no user manager here).
for a in "$@"; do
  case "$a" in
    -q|--quiet|--user|--scope) shift ;;
    -*) echo "runner-manager: systemd-run $a is not available to a job's engine" >&2; exit 1 ;;
    *) break ;;
  esac
done
exec "$@"
"#;

/// The longest path a unix socket can be bound at (`sun_path` less its terminating NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// In the runner's runtime: the proxy's socket, the job's `DOCKER_HOST`.
pub const JOB_SOCKET: &str = ".docker.sock";

/// The engine's unit: `rm-<12hex>-docker.service`, beside the runner's `rm-<12hex>.service`.
pub fn unit_name(attempt: &uuid::Uuid) -> String {
    format!("rm-{}-docker.service", short_hex(*attempt))
}

/// The attempt of an engine unit's name, by its 12 hex digits.
pub fn unit_attempt_prefix(unit: &str) -> Option<&str> {
    let hex = unit.strip_prefix("rm-")?.strip_suffix("-docker.service")?;
    (hex.len() == 12
        && hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
    .then_some(hex)
}

/// Where one attempt's engine keeps everything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineDirs {
    pub root: PathBuf,
}

impl EngineDirs {
    pub fn new(host_root: &Path, attempt: &uuid::Uuid) -> Self {
        Self::named(host_root, &short_hex(*attempt))
    }

    /// By the attempt's name (12 hex), as the orphan sweep lists them.
    pub fn named(host_root: &Path, short: &str) -> Self {
        Self {
            root: host_root.join(DOCKER_DIR).join(short),
        }
    }

    /// Images, layers and containers (`graphroot`).
    pub fn storage(&self) -> PathBuf {
        self.root.join("storage")
    }

    /// `XDG_RUNTIME_DIR`: the engine's runtime state and rootless network namespace, in the
    /// node's `/run` (`rm-<12hex>-docker`, the unit's `RuntimeDirectory=`: systemd makes it the
    /// account's at the start and removes it at the stop). Not under the host root: Podman binds
    /// unix sockets below it (rootlessport's `libpod/tmp/rootlessport<9 digits>/.bp.sock`), and
    /// a path past the 107 bytes a socket name allows made rootlessport wait for a socket it
    /// never had, which Podman 4.3 waits for without end: a container with a published port
    /// never started and held its lock (measured with a 114-byte path; the agent cannot see it,
    /// only the engine and systemd use it).
    pub fn run(&self) -> PathBuf {
        Path::new("/run").join(self.runtime_directory())
    }

    /// [`Self::run`]'s name under `/run`, the unit's `RuntimeDirectory=`.
    pub fn runtime_directory(&self) -> String {
        let short = self
            .root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        format!("rm-{short}-docker")
    }

    /// `HOME` (registry credentials of `docker login`).
    pub fn home(&self) -> PathBuf {
        self.root.join("home")
    }

    /// The networks a job creates. Under [`Self::run`], which Podman carries into the mount
    /// namespace it sets a rootless network up in (where it binds a directory of its own over
    /// `/var/lib/cni`, or over `/var/lib` on a node without one: the unit gives it one, see
    /// [`CNI_DIR`]); Podman makes it.
    pub fn networks(&self) -> PathBuf {
        self.run().join("networks")
    }

    /// The engine's API socket: the proxy's only way in. In the attempt's directory (the agent
    /// connects to it), in a directory of the account's.
    pub fn socket(&self) -> PathBuf {
        self.root.join("sock").join("engine.sock")
    }

    /// Why the engine's socket cannot be bound, if it cannot: a unix socket's name has at most
    /// 107 bytes, and a long `--host-root` makes it longer.
    pub fn socket_too_long(&self) -> Option<String> {
        let len = self.socket().as_os_str().len();
        (len > MAX_SOCKET_PATH).then(|| {
            format!(
                "its socket path {} is {len} bytes, over the {MAX_SOCKET_PATH} a unix socket allows: a shorter --host-root",
                self.socket().display()
            )
        })
    }

    pub fn containers_conf(&self) -> PathBuf {
        self.root.join("containers.conf")
    }

    pub fn storage_conf(&self) -> PathBuf {
        self.root.join("storage.conf")
    }

    /// [`SCOPE_SHIM`], root's, bound over the node's [`SYSTEMD_RUN`] in the engine's unit.
    pub fn scope_shim(&self) -> PathBuf {
        self.root.join("systemd-run")
    }

    /// The engine's own `/dev/net/tun` (slirp4netns needs one): a node of the account's, bound
    /// over the unit's, so the node's device keeps its mode (often root's alone).
    pub fn tun(&self) -> PathBuf {
        self.root.join("tun")
    }

    /// `containers.conf(5)`: `runc` (the node's runtime, which ignores the cgroups a rootless
    /// process cannot make), `cgroupfs` (no user session's systemd to ask), netavark networks in
    /// this directory, events in a file.
    pub fn containers_conf_text(&self) -> String {
        format!(
            "[containers]\n\
             [engine]\n\
             runtime = \"runc\"\n\
             cgroup_manager = \"cgroupfs\"\n\
             events_logger = \"file\"\n\
             events_logfile_path = \"{events}\"\n\
             [network]\n\
             network_backend = \"netavark\"\n\
             network_config_dir = \"{networks}\"\n",
            events = self.run().join("events.log").display(),
            networks = self.networks().display(),
        )
    }

    /// `containers-storage.conf(5)`: overlay in the engine's user namespace. A rootless engine
    /// reads its image store's place from `rootless_storage_path` and ignores `graphroot` and
    /// `runroot` (measured: without it the store was under `$XDG_DATA_HOME`; its run root is
    /// `$XDG_RUNTIME_DIR/containers` either way, in [`Self::run`]).
    pub fn storage_conf_text(&self) -> String {
        format!(
            "[storage]\n\
             driver = \"overlay\"\n\
             rootless_storage_path = \"{}\"\n",
            self.storage().display(),
        )
    }

    /// Makes the directory (0700, the account's) and its configuration and scope shim (root's,
    /// 0644 and 0755: the engine reads them and cannot change them).
    pub fn prepare(&self, account: RunnerAccount) -> io::Result<()> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let parent = self
            .root
            .parent()
            .ok_or_else(|| io::Error::other("no parent"))?;
        match std::fs::DirBuilder::new().mode(0o711).create(parent) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        if !std::fs::symlink_metadata(parent)?.is_dir() {
            return Err(io::Error::other(format!(
                "{} is not a directory",
                parent.display()
            )));
        }
        std::fs::DirBuilder::new().mode(0o755).create(&self.root)?;
        for (path, text, mode) in [
            (self.containers_conf(), self.containers_conf_text(), 0o644),
            (self.storage_conf(), self.storage_conf_text(), 0o644),
            (self.scope_shim(), SCOPE_SHIM.to_owned(), 0o755),
        ] {
            std::fs::write(&path, text)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        }
        for dir in [self.storage(), self.home(), self.root.join("sock")] {
            std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
            std::os::unix::fs::lchown(&dir, Some(account.uid), Some(account.gid))?;
        }
        rustix::fs::mknodat(
            rustix::fs::CWD,
            self.tun(),
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0o600),
            rustix::fs::makedev(TUN_MAJOR, TUN_MINOR),
        )?;
        std::os::unix::fs::lchown(self.tun(), Some(account.uid), Some(account.gid))?;
        Ok(())
    }
}

/// What the engine's unit needs from the agent.
#[derive(Clone, Debug)]
pub struct EngineSpec<'a> {
    pub attempt: uuid::Uuid,
    pub account: RunnerAccount,
    pub dirs: &'a EngineDirs,
    /// The runner's runtime (bind mounts of the job's workspace) and cache.
    pub runtime: &'a Path,
    pub cache: Option<&'a Path>,
    pub podman: &'a Path,
    /// The attempt's limits, which the engine's unit gets as the runner's does.
    pub limits: &'a crate::providers::cgroup::CgroupLimits,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shim(args: &[&str]) -> std::process::Output {
        std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(SCOPE_SHIM)
            .arg("systemd-run")
            .args(args)
            .output()
            .unwrap()
    }

    #[test]
    fn the_scope_shim_runs_netavarks_command_in_place_and_refuses_any_other_option() {
        // netavark 1.4's call, with an argument that looks like an option after the command.
        let out = shim(&["-q", "--user", "--scope", "/bin/echo", "--config", "x"]);
        assert!(out.status.success());
        assert_eq!(String::from_utf8_lossy(&out.stdout), "--config x\n");
        let out = shim(&["--unit", "x", "/bin/echo", "no"]);
        assert!(!out.status.success());
        assert!(out.stdout.is_empty());
        assert!(String::from_utf8_lossy(&out.stderr).contains("--unit is not available"));
    }

    #[test]
    fn an_engine_unit_is_named_by_its_attempt_and_read_back_only_so() {
        let attempt = uuid::Uuid::parse_str("0123456789ab4def8000000000000000").unwrap();
        let name = unit_name(&attempt);
        assert_eq!(name, "rm-0123456789ab-docker.service");
        assert_eq!(unit_attempt_prefix(&name), Some("0123456789ab"));
        for other in [
            "rm-0123456789ab.service",
            "rm-0123456789AB-docker.service",
            "rm-0123456789a-docker.service",
            "xrm-0123456789ab-docker.service",
        ] {
            assert_eq!(unit_attempt_prefix(other), None, "{other}");
        }
    }
}
