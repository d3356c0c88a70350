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

    /// `XDG_RUNTIME_DIR`: the engine's runtime state, its rootless network namespace, its socket.
    pub fn run(&self) -> PathBuf {
        self.root.join("run")
    }

    /// `HOME` (registry credentials of `docker login`).
    pub fn home(&self) -> PathBuf {
        self.root.join("home")
    }

    /// The networks a job creates. Under [`Self::run`]: Podman sets a rootless network up in a
    /// mount namespace where `/var/lib` may be replaced (when the node has no `/var/lib/cni`)
    /// and only the runtime directory is carried over, so a network kept anywhere else under
    /// `/var/lib` is created but never found again (measured with Podman 4.3).
    pub fn networks(&self) -> PathBuf {
        self.run().join("networks")
    }

    /// The engine's API socket: the proxy's only way in.
    pub fn socket(&self) -> PathBuf {
        self.run().join("engine.sock")
    }

    pub fn containers_conf(&self) -> PathBuf {
        self.root.join("containers.conf")
    }

    pub fn storage_conf(&self) -> PathBuf {
        self.root.join("storage.conf")
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

    /// `containers-storage.conf(5)`: overlay in the engine's user namespace.
    pub fn storage_conf_text(&self) -> String {
        format!(
            "[storage]\n\
             driver = \"overlay\"\n\
             graphroot = \"{}\"\n\
             runroot = \"{}\"\n",
            self.storage().display(),
            self.run().join("storage").display(),
        )
    }

    /// Makes the directory (0700, the account's) and its configuration (root's, 0644: the engine
    /// reads it and cannot change it).
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
        for (path, text) in [
            (self.containers_conf(), self.containers_conf_text()),
            (self.storage_conf(), self.storage_conf_text()),
        ] {
            std::fs::write(&path, text)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
        }
        for dir in [self.storage(), self.run(), self.home(), self.networks()] {
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
