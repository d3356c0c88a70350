//! The agent's command line. Every flag can also come from the environment (DaemonSet env).

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use crate::packages::extract::ExtractLimits;

/// How native runners become host processes that outlive the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LauncherKind {
    /// A transient systemd unit on the host (in a cluster).
    Systemd,
    /// A child in its own cgroup v2 (bare metal, `make demo`, tests).
    Direct,
}

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// runner-manager node agent: admits, prepares, starts, supervises and cleans the runner
/// attempts bound to its node.
#[derive(Debug, Parser)]
#[command(name = "runner-manager-node-agent", version)]
pub struct Cli {
    /// The node this agent serves (the DaemonSet passes spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// The agent's host root: packages, ephemeral runtimes, diagnostics, the agent lock.
    #[arg(long, env = "RM_HOST_ROOT", default_value = "/var/lib/runner-manager")]
    pub host_root: PathBuf,
    /// Where persistent slots live: <slots-root>/<namespace>/<policy uid>/sN.
    #[arg(
        long,
        env = "RM_SLOTS_ROOT",
        default_value = "/var/lib/runner-manager/slots"
    )]
    pub slots_root: PathBuf,
    /// How many runners this node hosts at once (the agent's own count is the authority).
    #[arg(long, env = "RM_CAPACITY", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub capacity: u32,
    /// How native runners are launched.
    #[arg(long, env = "RM_LAUNCHER", value_enum, default_value_t = LauncherKind::Systemd)]
    pub launcher: LauncherKind,
    /// The runner account pool: uids `<first>-<last>`, one per concurrent runner (created by the
    /// installer: `e2e/setup-runner-accounts.sh` in the tests, the chart later).
    #[arg(long, env = "RM_RUNNER_UID_RANGE", default_value = "20001-20064", value_parser = parse_uid_range)]
    pub runner_uid_range: (u32, u32),
    /// The pool's group (caches are shared through it).
    #[arg(long, env = "RM_RUNNER_GID", default_value_t = 20000)]
    pub runner_gid: u32,
    /// The size cap of the node's dependency caches (`spec.caches`), in GiB: over it, whole
    /// namespaces are removed least recently used first, never one a live runner reads.
    #[arg(long, env = "RM_CACHE_MAX_GIB", default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pub cache_max_gib: u64,
    /// Podman on the node, which runs each runner's own Docker engine (`spec.docker`), as the
    /// node's systemd sees it.
    #[arg(long, env = "RM_PODMAN", default_value = "/usr/bin/podman")]
    pub podman: std::path::PathBuf,
    /// The cgroup v2 parent of the direct launcher's runners (relative to the v2 mount).
    #[arg(long, env = "RM_CGROUP_PARENT", default_value = "runner-manager.slice")]
    pub cgroup_parent: String,
    /// The entry helper (`runner-manager-runner-entry`); by default the one beside this binary.
    #[arg(long, env = "RM_ENTRY_HELPER")]
    pub entry_helper: Option<PathBuf>,
    /// Milliseconds between two supervision passes of one attempt.
    #[arg(long, env = "RM_SUPERVISION_MILLIS", default_value_t = 500, value_parser = clap::value_parser!(u64).range(50..=60_000))]
    pub supervision_millis: u64,
    /// How long after a registration or idle deadline the agent stops a runner on its own. The
    /// operator owns those deadlines and stops in order — deregister first, then request the
    /// termination (DESIGN §4 rule 3), so a job landing at that moment is never cut off; the
    /// agent's copy is a backstop for an operator that is down, and must come later.
    #[arg(long, env = "RM_DEADLINE_GRACE_SECONDS", default_value_t = 120)]
    pub deadline_grace_seconds: u64,
    /// The operator's JIT broker.
    #[arg(
        long,
        env = "RM_BROKER_URL",
        default_value = "https://runner-manager-broker.runner-manager-system.svc:8443"
    )]
    pub broker_url: String,
    /// The namespace of the operator (its broker CA ConfigMap and the agent Leases).
    #[arg(
        long,
        env = "RM_SYSTEM_NAMESPACE",
        default_value = "runner-manager-system"
    )]
    pub system_namespace: String,
    /// The projected service-account token (audience runner-manager-broker) shown to the broker.
    #[arg(
        long,
        env = "RM_BROKER_TOKEN_FILE",
        default_value = "/var/run/secrets/runner-manager/broker-token"
    )]
    pub broker_token_file: PathBuf,
    /// Seconds between Lease renewals (the heartbeat the operator places by).
    #[arg(long, env = "RM_HEARTBEAT_SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub heartbeat_seconds: u64,
    /// Seconds between orphan sweeps: cgroups or units, runtimes and handoff files named for an
    /// attempt no longer on this node are stopped and removed (also once at every start).
    #[arg(long, env = "RM_ORPHAN_SWEEP_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub orphan_sweep_seconds: u64,
    /// Placeholder pods (docs/placeholder-pods.md): beside each native runner a pod with the
    /// runner's resources as requests, so the scheduler counts the runner. The agent orders them
    /// from the operator, whose `--placeholder-image` and `--placeholder-priority-class` they
    /// take (the agent has no pod write right).
    #[arg(long, env = "RM_PLACEHOLDERS", default_value_t = false, action = clap::ArgAction::Set)]
    pub placeholders: bool,
    /// How long a launch waits for the kubelet to run its placeholder before it concludes
    /// without starting the runner; 0: do not wait for the kubelet's verdict.
    #[arg(long, env = "RM_PLACEHOLDER_WAIT_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub placeholder_wait_seconds: u64,
    /// How many launches may materialize their package and prepare their runtime at once
    /// (the rest wait their turn, first come first served).
    #[arg(long, env = "RM_PREPARATION_PERMITS", default_value_t = crate::agent::preparation::DEFAULT_PREPARATION_PERMITS, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub preparation_permits: u32,
    /// How the runner package is laid into a runtime: `overlay` mounts the cache's verified
    /// tree read-only under the runtime (O(1) per launch; the agent refuses to start if a probe
    /// mount fails), `copy` is the checked copy (reflink where the volume clones), `auto` (the
    /// default) is overlay when the probe succeeds on every runtime volume, else the copy: the
    /// 50-job burst of a runner-sized package starts in 6 s by overlay against 78–110 s by the
    /// copy on the same 2-core node, and a volume without overlay still works.
    #[arg(long, env = "RM_MATERIALIZE", value_enum, default_value_t = crate::packages::overlay::MaterializeChoice::Auto)]
    pub materialize: crate::packages::overlay::MaterializeChoice,
    /// Run OCI attempts as runner pods on this node (DESIGN §6 "OCI provider"). Without it the
    /// agent rejects them (`SnapshotUnusable`).
    #[arg(long, env = "RM_OCI", default_value_t = false)]
    pub oci: bool,
    /// How long a runner pod may take to run its container (image pull included) before the
    /// launch concludes `ImageUnavailable` (stuck pulling) or `ProcessStartFailed`.
    #[arg(long, env = "RM_OCI_START_DEADLINE_SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub oci_start_deadline_seconds: u64,
    /// How long the entry helper in a running runner pod may take to take its handoff.
    #[arg(long, env = "RM_OCI_HANDOFF_DEADLINE_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub oci_handoff_deadline_seconds: u64,
    /// The most bytes one runner package archive may inflate to (all files together).
    #[arg(long, env = "RM_PACKAGE_MAX_BYTES", default_value_t = ExtractLimits::default().max_total_bytes, value_parser = clap::value_parser!(u64).range(1..))]
    pub package_max_bytes: u64,
    /// The most entries one runner package archive may hold.
    #[arg(long, env = "RM_PACKAGE_MAX_ENTRIES", default_value_t = ExtractLimits::default().max_entries, value_parser = clap::value_parser!(u64).range(1..))]
    pub package_max_entries: u64,
    /// The most bytes one file of a runner package may have.
    #[arg(long, env = "RM_PACKAGE_MAX_FILE_BYTES", default_value_t = ExtractLimits::default().max_file_bytes, value_parser = clap::value_parser!(u64).range(1..))]
    pub package_max_file_bytes: u64,
    /// The memory a runner may use when its policy sets none: a quantity (`4Gi`, `512Mi`),
    /// `auto` (the node's memory shared equally by --capacity runners) or `none`.
    #[arg(long, env = "RM_DEFAULT_RUNNER_MEMORY", default_value = "auto")]
    pub default_runner_memory: String,
    /// The most tasks (processes and threads) one runner may have (a fork bomb stops there);
    /// 0 for no limit.
    #[arg(long, env = "RM_RUNNER_TASKS_MAX", default_value_t = 4096)]
    pub runner_tasks_max: u64,
    /// How much lower than the agent's every runner's CPU priority is (its niceness, 0-19; 0
    /// for the same). A node is busy exactly when its runners compile: at 10 a runner's thread
    /// weighs a tenth of the agent's, so the next launch, the supervision and the kubelet are
    /// not starved by the jobs already running, and the runners still take every idle core.
    #[arg(long, env = "RM_RUNNER_NICE", default_value_t = 10, value_parser = clap::value_parser!(u8).range(0..=19))]
    pub runner_nice: u8,
    /// The most bytes one runner package download may have; a longer one is refused while it
    /// streams (PackageRefused, PackageCapExceeded).
    #[arg(long, env = "RM_PACKAGE_MAX_DOWNLOAD_BYTES", default_value_t = crate::packages::download::DEFAULT_MAX_DOWNLOAD_BYTES, value_parser = clap::value_parser!(u64).range(1..))]
    pub package_max_download_bytes: u64,
    /// Hosts a package may be downloaded from over plain http (`host` or `host:port`,
    /// comma-separated); every other URL and redirect must be https. Empty in production.
    #[arg(long, env = "RM_ALLOW_HTTP_HOSTS", default_value = "", value_parser = host_list)]
    pub allow_http_hosts: runner_manager_crds::hosts::HostList,
    /// A PEM file of CA certificates trusted, beside the system's, for package downloads: a
    /// GitHub Enterprise Server or mirror whose certificate a private CA signed. Chart value
    /// `caBundle`.
    #[arg(long, env = "RM_DOWNLOAD_CA_FILE")]
    pub download_ca_file: Option<PathBuf>,
    /// The cluster's pod ranges (CIDR, comma-separated): native runners (systemd launcher) may
    /// reach no pod. The agent's own pod IP must lie in one: the start-up proof of the runner
    /// network filter connects to it.
    #[arg(long, env = "RM_RUNNER_POD_CIDRS", default_value = "10.244.0.0/16", value_parser = prefix_list)]
    pub runner_pod_cidrs: crate::providers::sandbox::PrefixList,
    /// The cluster's Service ranges (CIDR, comma-separated): native runners reach no Service
    /// address.
    #[arg(long, env = "RM_RUNNER_SERVICE_CIDRS", default_value = "10.96.0.0/12", value_parser = prefix_list)]
    pub runner_service_cidrs: crate::providers::sandbox::PrefixList,
    /// Addresses native runners may reach although the deny list covers them (`IPAddressAllow=`,
    /// which wins over it): a node-local DNS cache on link-local, a registry Service. Never one
    /// that covers a cloud metadata address (refused at start).
    #[arg(long, env = "RM_RUNNER_IP_ALLOW", default_value = "", value_parser = prefix_list)]
    pub runner_ip_allow: crate::providers::sandbox::PrefixList,
    /// Log format.
    #[arg(long, env = "RM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (e.g. `0.0.0.0:9090`, what the
    /// chart sets; port 0 lets the system choose, and the address is logged as `health`). Not
    /// served when unset.
    #[arg(long, env = "RM_HEALTH_ADDR")]
    pub health_addr: Option<std::net::SocketAddr>,
}

fn prefix_list(s: &str) -> Result<crate::providers::sandbox::PrefixList, String> {
    crate::providers::sandbox::parse_prefixes(s)
        .map(crate::providers::sandbox::PrefixList)
        .map_err(|e| e.to_string())
}

fn host_list(s: &str) -> Result<runner_manager_crds::hosts::HostList, String> {
    runner_manager_crds::hosts::HostList::parse(s).map_err(|e| e.to_string())
}

impl Cli {
    /// The download limits the flags set, with `--download-ca-file` read.
    pub fn download_limits(
        &self,
    ) -> Result<crate::packages::download::DownloadLimits, std::io::Error> {
        Ok(crate::packages::download::DownloadLimits {
            max_bytes: self.package_max_download_bytes,
            http_hosts: self.allow_http_hosts.clone(),
            extra_roots_pem: self
                .download_ca_file
                .as_ref()
                .map(std::fs::read)
                .transpose()?,
        })
    }

    /// The package extraction caps the flags set.
    pub fn extract_limits(&self) -> ExtractLimits {
        ExtractLimits {
            max_total_bytes: self.package_max_bytes,
            max_entries: self.package_max_entries,
            max_file_bytes: self.package_max_file_bytes,
        }
    }
}

/// `<first>-<last>`, first ≤ last, never root.
fn parse_uid_range(s: &str) -> Result<(u32, u32), String> {
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| "expected <first uid>-<last uid>".to_owned())?;
    let first: u32 = a
        .trim()
        .parse()
        .map_err(|_| "the first uid is not a number")?;
    let last: u32 = b
        .trim()
        .parse()
        .map_err(|_| "the last uid is not a number")?;
    if first == 0 || first > last {
        return Err("the range must be non-empty and must not include root".to_owned());
    }
    Ok((first, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_ranges_are_checked() {
        assert_eq!(parse_uid_range("20001-20064"), Ok((20001, 20064)));
        assert!(parse_uid_range("0-5").is_err());
        assert!(parse_uid_range("9-5").is_err());
        assert!(parse_uid_range("x").is_err());
    }
}
