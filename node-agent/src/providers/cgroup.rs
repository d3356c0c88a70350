//! cgroup v2 for runners: a parent the agent owns (default `<v2 mount>/runner-manager.slice`),
//! one child `rm-<12hex>` per attempt, limits written before the runner joins, `cgroup.kill`
//! to stop everything in it, and proof of emptiness before it is removed.
//!
//! The v2 mount is found in `/proc/self/mountinfo` (it is `/sys/fs/cgroup` on a unified host,
//! `/sys/fs/cgroup/unified` on a hybrid one). The parent must not lie inside the agent's own
//! cgroup (unless the agent sits at the root), or stopping the agent's cgroup would take the
//! runners with it.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use runner_manager_crds::policy::RunnerResources;
use runner_manager_crds::validate::{parse_cpu_millis, parse_memory_bytes};

/// The parent's default name under the v2 mount.
pub const DEFAULT_PARENT: &str = "runner-manager.slice";
/// `cpu.max`'s period: 100 ms, the kernel's default.
const CPU_PERIOD_US: u64 = 100_000;

/// A cgroup failure. Closed; I/O by kind.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CgroupError {
    #[error("no cgroup v2 hierarchy is mounted")]
    NoUnifiedHierarchy,
    #[error("the runner cgroup parent lies inside the agent's own cgroup")]
    ParentInsideAgent,
    #[error("the {0} controller is not available to the runner cgroups")]
    ControllerUnavailable(Controller),
    #[error("a resource limit is not a quantity")]
    BadLimit,
    #[error("the attempt's cgroup already exists (a second launch of one attempt)")]
    AlreadyExists,
    #[error("cgroup is not one of ours")]
    NotOurs,
    #[error("cgroup I/O failed while {step}: {kind}")]
    Io {
        step: &'static str,
        kind: io::ErrorKind,
    },
}

fn io_at(step: &'static str) -> impl FnOnce(io::Error) -> CgroupError {
    move |e| CgroupError::Io {
        step,
        kind: e.kind(),
    }
}

/// A controller a limit needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Controller {
    #[error("memory")]
    Memory,
    #[error("cpu")]
    Cpu,
    #[error("pids")]
    Pids,
}

/// The limits written into a runner's cgroup, from the snapshot's resources and, where the
/// policy sets none, the agent's defaults ([`RunnerDefaults`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupLimits {
    /// `memory.max` in bytes.
    pub memory_max: Option<u64>,
    /// `cpu.max` quota in microseconds per [`CPU_PERIOD_US`].
    pub cpu_quota_us: Option<u64>,
    /// `pids.max` (systemd's `TasksMax=`): bounds a fork bomb to the runner's own cgroup.
    pub tasks_max: Option<u64>,
    /// Controllers whose limit is an agent default rather than the policy's: applied where the
    /// hierarchy has the controller and skipped where it does not (a policy's own limit is
    /// refused there instead, never silently dropped).
    pub best_effort: Vec<Controller>,
    /// The runner's scheduling niceness (0: the agent's own, 1-19 below it): the agent's
    /// `--runner-nice`, never the policy's. Not a cgroup file: the entry helper lowers its own
    /// priority before its exec (direct launcher), systemd's `Nice=` does it for a unit.
    pub nice: u8,
}

/// What a runner gets when its policy sets no limit (agent flags `--default-runner-memory`,
/// `--runner-tasks-max`). CPU has no default cap: an idle node's cores are better used than
/// left idle, and under contention the kernel already shares CPU between the runners' cgroups
/// equally (systemd gives each unit the same `CPUWeight=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunnerDefaults {
    /// Bytes; `None`: no default.
    pub memory_max: Option<u64>,
    /// Tasks (processes and threads); `None`: no default.
    pub tasks_max: Option<u64>,
    /// Every runner's niceness (`--runner-nice`; 0 leaves it at the agent's).
    pub nice: u8,
}

/// Why `--default-runner-memory` was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DefaultsError {
    #[error(
        "--default-runner-memory {0:?} is not a memory quantity of at least 64Mi (e.g. 4Gi), `auto` or `none`"
    )]
    Memory(String),
    #[error("--default-runner-memory auto: the node's memory could not be read from /proc/meminfo")]
    NodeMemory,
}

impl RunnerDefaults {
    /// From the agent's flags; `auto` reads the node's memory.
    pub fn from_flags(memory: &str, tasks_max: u64, capacity: u32) -> Result<Self, DefaultsError> {
        let memory_max = match memory.trim() {
            "none" => None,
            "auto" => {
                let meminfo = std::fs::read_to_string("/proc/meminfo")
                    .map_err(|_| DefaultsError::NodeMemory)?;
                Some(Self::fair_memory_share(
                    node_memory_bytes(&meminfo).ok_or(DefaultsError::NodeMemory)?,
                    capacity,
                ))
            }
            q => Some(
                runner_manager_crds::quantity::memory_bytes(q)
                    .filter(|b| *b >= 64 << 20)
                    .ok_or_else(|| DefaultsError::Memory(q.to_owned()))?,
            ),
        };
        Ok(Self {
            memory_max,
            tasks_max: (tasks_max > 0).then_some(tasks_max),
            nice: 0,
        })
    }

    /// The node's memory shared equally by `capacity` runners: what one runner may use before
    /// it starts taking another's share.
    pub fn fair_memory_share(node_memory_bytes: u64, capacity: u32) -> u64 {
        node_memory_bytes / u64::from(capacity.max(1))
    }
}

impl CgroupLimits {
    pub fn from_resources(r: Option<&RunnerResources>) -> Result<Self, CgroupError> {
        let Some(r) = r else {
            return Ok(Self::default());
        };
        // `tasks_max` and `best_effort` come from the agent's defaults, not the policy.
        let memory_max = r
            .memory
            .as_ref()
            .map(|q| parse_memory_bytes(q).ok_or(CgroupError::BadLimit))
            .transpose()?;
        let cpu_quota_us = r
            .cpu
            .as_ref()
            .map(|q| {
                parse_cpu_millis(q)
                    .filter(|m| *m > 0)
                    .map(|m| m * CPU_PERIOD_US / 1000)
                    .ok_or(CgroupError::BadLimit)
            })
            .transpose()?;
        Ok(Self {
            memory_max,
            cpu_quota_us,
            ..Self::default()
        })
    }

    /// Fills in the agent's defaults for what the policy left unset, marking them best effort.
    pub fn with_defaults(mut self, defaults: RunnerDefaults) -> Self {
        if self.memory_max.is_none()
            && let Some(m) = defaults.memory_max
        {
            self.memory_max = Some(m);
            self.best_effort.push(Controller::Memory);
        }
        if self.tasks_max.is_none()
            && let Some(t) = defaults.tasks_max
        {
            self.tasks_max = Some(t);
            self.best_effort.push(Controller::Pids);
        }
        self.nice = defaults.nice;
        self
    }

    /// `cpu.max`'s content.
    pub fn cpu_max(&self) -> Option<String> {
        self.cpu_quota_us.map(|q| format!("{q} {CPU_PERIOD_US}"))
    }

    /// systemd's `CPUQuota=` (percent of one CPU).
    pub fn cpu_quota_percent(&self) -> Option<u64> {
        self.cpu_quota_us.map(|q| q * 100 / CPU_PERIOD_US)
    }

    fn controllers(&self) -> Vec<Controller> {
        let mut c = Vec::new();
        if self.memory_max.is_some() {
            c.push(Controller::Memory);
        }
        if self.cpu_quota_us.is_some() {
            c.push(Controller::Cpu);
        }
        if self.tasks_max.is_some() {
            c.push(Controller::Pids);
        }
        c
    }
}

/// `MemTotal` of a `/proc/meminfo` text, in bytes.
pub fn node_memory_bytes(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let kib = l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?;
        kib.trim().parse::<u64>().ok().map(|k| k * 1024)
    })
}

/// Finds the cgroup v2 mount point in a mountinfo text.
pub fn unified_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2")
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))
            .flatten()
    })
}

/// The name of an attempt's cgroup: `rm-` and the first 12 hex of its uuid.
pub fn attempt_cgroup_name(attempt: &uuid::Uuid) -> String {
    format!("rm-{}", &attempt.simple().to_string()[..12])
}

fn is_attempt_name(name: &str) -> bool {
    name.strip_prefix("rm-").is_some_and(|h| {
        h.len() == 12
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The agent's parent cgroup for runners.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupParent {
    /// The v2 mount.
    mount: PathBuf,
    /// The parent, relative to the mount, starting with `/`.
    relative: String,
}

impl CgroupParent {
    /// The parent `relative` (e.g. `/runner-manager.slice`) under this host's v2 mount,
    /// created if missing, refused if it lies inside the agent's own cgroup.
    pub fn open(relative: &str) -> Result<Self, CgroupError> {
        let mountinfo =
            std::fs::read_to_string("/proc/self/mountinfo").map_err(io_at("reading mountinfo"))?;
        let mount = unified_mount(&mountinfo).ok_or(CgroupError::NoUnifiedHierarchy)?;
        let relative = format!("/{}", relative.trim_matches('/'));
        let own = crate::process::stat::read_cgroup_v2(std::process::id())
            .map_err(io_at("reading the agent's cgroup"))?
            .unwrap_or_else(|| "/".to_owned());
        if own != "/" && (relative == own || relative.starts_with(&format!("{own}/"))) {
            return Err(CgroupError::ParentInsideAgent);
        }
        let parent = Self { mount, relative };
        match std::fs::create_dir(parent.path()) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_at("creating the parent")(e)),
        }
        Ok(parent)
    }

    /// The parent's directory.
    pub fn path(&self) -> PathBuf {
        self.mount.join(self.relative.trim_start_matches('/'))
    }

    /// The v2 mount.
    pub fn mount(&self) -> &Path {
        &self.mount
    }

    /// The cgroup of one attempt, relative to the mount (what `/proc/<pid>/cgroup` shows).
    pub fn child_relative(&self, name: &str) -> String {
        format!("{}/{name}", self.relative.trim_end_matches('/'))
    }

    /// The directory of a recorded cgroup, if it is one of this parent's attempt cgroups.
    pub fn owned_dir(&self, relative: &str) -> Result<PathBuf, CgroupError> {
        let name = relative
            .strip_prefix(self.relative.trim_end_matches('/'))
            .and_then(|r| r.strip_prefix('/'))
            .filter(|n| is_attempt_name(n))
            .ok_or(CgroupError::NotOurs)?;
        Ok(self.path().join(name))
    }

    /// The attempt names (the 12 hex after `rm-`) of the attempt cgroups under this parent,
    /// whatever their state: what an orphan sweep compares with the journal. Nothing else under
    /// the parent is named.
    pub fn attempt_children(&self) -> io::Result<Vec<String>> {
        let mut found = Vec::new();
        for e in std::fs::read_dir(self.path())? {
            let e = e?;
            if !e.file_type()?.is_dir() {
                continue;
            }
            if let Some(name) = e.file_name().to_str().filter(|n| is_attempt_name(n)) {
                found.push(name["rm-".len()..].to_owned());
            }
        }
        found.sort();
        Ok(found)
    }

    /// Creates the attempt's cgroup and writes its limits. An existing one is refused: the
    /// name is the attempt's, and an attempt is launched once.
    pub fn create_child(&self, name: &str, limits: &CgroupLimits) -> Result<PathBuf, CgroupError> {
        if !is_attempt_name(name) {
            return Err(CgroupError::NotOurs);
        }
        let (required, optional): (Vec<Controller>, Vec<Controller>) = limits
            .controllers()
            .into_iter()
            .partition(|c| !limits.best_effort.contains(c));
        self.enable_controllers(&required)?;
        let mut skipped = Vec::new();
        for c in optional {
            match self.enable_controllers(&[c]) {
                Ok(()) => {}
                Err(CgroupError::ControllerUnavailable(c)) => skipped.push(c),
                Err(e) => return Err(e),
            }
        }
        let dir = self.path().join(name);
        std::fs::create_dir(&dir).map_err(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                CgroupError::AlreadyExists
            } else {
                io_at("creating the attempt cgroup")(e)
            }
        })?;
        let written = (|| {
            if let Some(m) = limits
                .memory_max
                .filter(|_| !skipped.contains(&Controller::Memory))
            {
                write_file(
                    &dir.join("memory.max"),
                    &m.to_string(),
                    "writing memory.max",
                )?;
            }
            if let Some(c) = limits.cpu_max() {
                write_file(&dir.join("cpu.max"), &c, "writing cpu.max")?;
            }
            if let Some(t) = limits
                .tasks_max
                .filter(|_| !skipped.contains(&Controller::Pids))
            {
                write_file(&dir.join("pids.max"), &t.to_string(), "writing pids.max")?;
            }
            Ok(())
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_dir(&dir);
            return Err(e);
        }
        Ok(dir)
    }

    /// Makes the controllers the limits need available to the parent's children: every
    /// ancestor from the mount down must list them in `cgroup.subtree_control`. A controller
    /// the hierarchy does not have (a hybrid host whose memory controller is bound to v1) is
    /// refused rather than silently running the runner unlimited.
    fn enable_controllers(&self, wanted: &[Controller]) -> Result<(), CgroupError> {
        if wanted.is_empty() {
            return Ok(());
        }
        let mut dir = self.mount.clone();
        let mut chain = vec![dir.clone()];
        for part in self.relative.split('/').filter(|p| !p.is_empty()) {
            dir = dir.join(part);
            chain.push(dir.clone());
        }
        for c in wanted {
            let word = c.to_string();
            let available = std::fs::read_to_string(self.mount.join("cgroup.controllers"))
                .map_err(io_at("reading cgroup.controllers"))?;
            if !available.split_whitespace().any(|w| w == word) {
                return Err(CgroupError::ControllerUnavailable(*c));
            }
            for d in &chain {
                let control = d.join("cgroup.subtree_control");
                let enabled = std::fs::read_to_string(&control)
                    .map_err(io_at("reading cgroup.subtree_control"))?;
                if !enabled.split_whitespace().any(|w| w == word) {
                    write_file(&control, &format!("+{word}"), "enabling a controller")?;
                }
            }
        }
        Ok(())
    }
}

fn write_file(path: &Path, content: &str, step: &'static str) -> Result<(), CgroupError> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .and_then(|mut f| f.write_all(content.as_bytes()))
        .map_err(io_at(step))
}

/// The pids in a cgroup. A missing cgroup has none.
pub fn procs(dir: &Path) -> Result<Vec<u32>, CgroupError> {
    match std::fs::read_to_string(dir.join("cgroup.procs")) {
        Ok(t) => Ok(t.lines().filter_map(|l| l.trim().parse().ok()).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io_at("reading cgroup.procs")(e)),
    }
}

/// Whether the cgroup (or a descendant) still holds a process (`cgroup.events` `populated`).
pub fn populated(dir: &Path) -> Result<bool, CgroupError> {
    match std::fs::read_to_string(dir.join("cgroup.events")) {
        Ok(t) => Ok(t.lines().any(|l| l.trim() == "populated 1")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_at("reading cgroup.events")(e)),
    }
}

/// SIGKILLs every process in the cgroup and its descendants, atomically with respect to forks
/// (the kernel's `cgroup.kill`): a grandchild that double-forked to escape its parent is still
/// in the cgroup and dies with it. A cgroup already gone has nothing to kill.
pub fn kill(dir: &Path) -> Result<(), CgroupError> {
    match write_file(&dir.join("cgroup.kill"), "1", "writing cgroup.kill") {
        Err(CgroupError::Io {
            kind: io::ErrorKind::NotFound,
            ..
        }) => Ok(()),
        r => r,
    }
}

/// Waits until the cgroup holds no process, up to `deadline`. `reap` is called between looks,
/// so an owned child that exited does not stay a zombie.
pub fn wait_empty(
    dir: &Path,
    deadline: Duration,
    mut reap: impl FnMut(),
) -> Result<bool, CgroupError> {
    let until = Instant::now() + deadline;
    loop {
        reap();
        if !populated(dir)? && procs(dir)?.is_empty() {
            return Ok(true);
        }
        if Instant::now() >= until {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Removes an empty attempt cgroup (already gone is fine).
pub fn remove(dir: &Path) -> Result<(), CgroupError> {
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_at("removing the attempt cgroup")(e)),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;

    #[test]
    fn agent_defaults_fill_only_what_the_policy_left_unset_and_are_best_effort() {
        let defaults = RunnerDefaults {
            memory_max: Some(2 << 30),
            tasks_max: Some(4096),
            nice: 10,
        };
        let unset = CgroupLimits::default().with_defaults(defaults);
        assert_eq!(unset.memory_max, Some(2 << 30));
        assert_eq!(unset.tasks_max, Some(4096));
        assert_eq!(
            unset.nice, 10,
            "the agent's priority rule, whatever the policy"
        );
        assert_eq!(unset.best_effort, [Controller::Memory, Controller::Pids]);
        let policy = CgroupLimits {
            memory_max: Some(1 << 30),
            ..CgroupLimits::default()
        }
        .with_defaults(defaults);
        assert_eq!(
            policy.memory_max,
            Some(1 << 30),
            "the policy's own limit wins"
        );
        assert_eq!(
            policy.best_effort,
            [Controller::Pids],
            "and is never best effort"
        );
    }

    #[test]
    fn default_flags_parse_or_name_the_flag() {
        let d = RunnerDefaults::from_flags("4Gi", 100, 4).unwrap();
        assert_eq!(d.memory_max, Some(4 << 30));
        assert_eq!(d.tasks_max, Some(100));
        let none = RunnerDefaults::from_flags("none", 0, 4).unwrap();
        assert_eq!(none, RunnerDefaults::default());
        let auto = RunnerDefaults::from_flags("auto", 1, 4).unwrap();
        assert!(auto.memory_max.is_some_and(|m| m > 0));
        for bad in ["lots", "1Ki", "-1Gi"] {
            let e = RunnerDefaults::from_flags(bad, 1, 4).unwrap_err();
            assert!(e.to_string().contains("--default-runner-memory"), "{e}");
        }
        assert_eq!(
            node_memory_bytes("MemTotal:       24576000 kB\nMemFree: 1 kB\n"),
            Some(24_576_000 * 1024)
        );
        assert_eq!(RunnerDefaults::fair_memory_share(8 << 30, 4), 2 << 30);
    }

    #[test]
    fn the_v2_mount_is_found_on_unified_and_hybrid_hosts() {
        let hybrid = "30 25 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                      35 25 0:31 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        assert_eq!(
            unified_mount(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let unified = "35 25 0:31 / /sys/fs/cgroup rw shared:9 - cgroup2 cgroup2 rw\n";
        assert_eq!(
            unified_mount(unified),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(unified_mount("1 2 3 / / rw - ext4 /dev/x rw\n"), None);
    }

    #[test]
    fn limits_come_from_the_snapshot_resources() {
        let r = RunnerResources {
            cpu: Some(Quantity("1500m".into())),
            memory: Some(Quantity("512Mi".into())),
        };
        let l = CgroupLimits::from_resources(Some(&r)).unwrap();
        assert_eq!(l.memory_max, Some(512 << 20));
        assert_eq!(l.cpu_max().as_deref(), Some("150000 100000"));
        assert_eq!(l.cpu_quota_percent(), Some(150));
        assert_eq!(
            CgroupLimits::from_resources(None).unwrap(),
            CgroupLimits::default()
        );
        let bad = RunnerResources {
            cpu: Some(Quantity("lots".into())),
            memory: None,
        };
        assert_eq!(
            CgroupLimits::from_resources(Some(&bad)),
            Err(CgroupError::BadLimit)
        );
    }

    #[test]
    fn only_attempt_names_under_the_parent_are_ours() {
        let p = CgroupParent {
            mount: "/sys/fs/cgroup".into(),
            relative: "/runner-manager.slice".into(),
        };
        assert_eq!(
            p.owned_dir("/runner-manager.slice/rm-0123456789ab")
                .unwrap(),
            PathBuf::from("/sys/fs/cgroup/runner-manager.slice/rm-0123456789ab")
        );
        for other in [
            "/runner-manager.slice",
            "/runner-manager.slice/rm-0123456789ab/x",
            "/runner-manager.slice/../rm-0123456789ab",
            "/other.slice/rm-0123456789ab",
            "/runner-manager.slice/rm-0123",
        ] {
            assert_eq!(p.owned_dir(other), Err(CgroupError::NotOurs), "{other}");
        }
    }
}
