//! The agent's command line. Every flag can also come from the environment (DaemonSet env).

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

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
    /// Prefix of the runner account pool (accounts <prefix>1..<prefix>N, one per concurrent
    /// runner).
    #[arg(long, env = "RM_RUNNER_ACCOUNT_PREFIX", default_value = "rm-runner")]
    pub runner_account_prefix: String,
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
    #[arg(long, env = "RM_HEARTBEAT_SECONDS", default_value_t = 10)]
    pub heartbeat_seconds: u64,
    /// Log format.
    #[arg(long, env = "RM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}
