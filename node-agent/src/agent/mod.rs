//! The agent process: the host fence, the node Lease, the startup recovery gate, and the
//! controller over the node's attempts (DESIGN §3–§6).
//!
//! The controller (`controller`) reconciles each attempt from `Pending` to `Cleaned` with
//! journal-before-effect steps; the same `step` is recovery after a restart ("recovery is
//! supervision"). The agent writes status only, through the journal's CAS; never spec, never
//! finalizers.
//!
//! The folders are the attempt's life on the node (issue 30 item 7): `recovery` (after a
//! restart, before anything launches), `launching` (`Pending` → `Starting`), `supervision` (a
//! started runner, one decision per reconcile), `cleaning` (a concluded attempt taken apart,
//! and the orphan sweep); below them `cluster` (the agent's edges to the API server) and
//! `reporting` (metrics, health and their vocabularies). Here: the process, its `controller`, its
//! shared context (`node`) and the crash-test `fault` points.

pub mod controller;
pub mod fault;
pub mod node;
#[cfg(test)]
pub mod scripted;

pub mod cleaning;
pub mod cluster;
pub mod launching;
pub mod recovery;
pub mod reporting;
pub mod supervision;

// The steps' modules under their old names: `crate::agent::launch` is
// `crate::agent::launching::launch`.
pub use cleaning::{abandoned, cleanup, orphans};
pub use cluster::{api_requests, attempt_ctx, attempts, conditions, events, lease};
pub use launching::{
    accounts, admission, caches, docker, job_gates, launch, placeholder, preparation, pruning,
};
pub use recovery::{fence, gate, rebuild};
pub use reporting::{health, labels, metrics};
pub use supervision::{edges, runner, supervise, watched};

pub use node::Agent;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::broker_client::BrokerClient;
use crate::cli::{Cli, LauncherKind};
use crate::packages::PackageCache;
use crate::packages::download::{Downloader, RetryPolicy, Timeouts};
use crate::providers::RunnerLauncher;
use crate::providers::cgroup::{CgroupParent, DefaultsError, RunnerDefaults};
use crate::providers::direct::DirectLauncher;
use crate::providers::systemd::SystemdLauncher;
use crate::workspace::allocation::AllocationLock;
use crate::workspace::backoff::CleanupBackoff;
use crate::workspace::slot_table::SlotTable;
use accounts::AccountPool;
use admission::CapacityBook;
use fence::{FenceError, HostFence};
use gate::RecoveryGate;

/// Why the agent could not run. Each maps to an exit code in `main`.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Fence(#[from] FenceError),
    #[error(transparent)]
    Roots(#[from] crate::roots::RootError),
    #[error("the host root {0} could not be prepared: {1:?}")]
    HostRoot(PathBuf, std::io::ErrorKind),
    #[error(
        "{0} is not searchable by the runner accounts (mode {1:o}): runners could not reach their runtime under it; choose a --host-root/--slots-root whose every parent directory has o+x (or g+x for the runner group), e.g. /var/lib/runner-manager"
    )]
    NotTraversable(PathBuf, u32),
    #[error("no Kubernetes configuration (KUBECONFIG or in-cluster): {0}")]
    KubeConfig(String),
    #[error("the launcher could not be set up: {0}")]
    Launcher(String),
    #[error(transparent)]
    Defaults(#[from] DefaultsError),
    #[error("the package cache could not be set up: {0}")]
    Packages(String),
    #[error("signal handling: {0:?}")]
    Signals(std::io::ErrorKind),
    #[error(transparent)]
    RunnerNetwork(#[from] crate::providers::sandbox::NetworkError),
    #[error("binding --health-addr {0}: {1:?}")]
    Bind(std::net::SocketAddr, std::io::ErrorKind),
}

impl AgentError {
    /// A closed name for the log line's `error` field: the message keeps the path and the fix,
    /// the field says what kind of refusal it was and carries no path.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Fence(_) => "fenced",
            Self::Roots(_) => "root_refused",
            Self::HostRoot(..) => "host_root_unusable",
            Self::NotTraversable(..) => "root_not_traversable",
            Self::KubeConfig(_) => "kube_config",
            Self::Launcher(_) => "launcher",
            Self::RunnerNetwork(_) => "runner_network",
            Self::Defaults(_) => "runner_defaults",
            Self::Packages(_) => "package_cache",
            Self::Signals(_) => "signals",
            Self::Bind(..) => "bind",
        }
    }
}

fn entry_helper(cli: &Cli) -> Result<PathBuf, AgentError> {
    if let Some(p) = &cli.entry_helper {
        return Ok(p.clone());
    }
    let exe = std::env::current_exe().map_err(|e| AgentError::Launcher(e.to_string()))?;
    Ok(exe
        .parent()
        .map(|d| d.join("runner-manager-runner-entry"))
        .unwrap_or_else(|| PathBuf::from("/usr/bin/runner-manager-runner-entry")))
}

/// Where the node's systemd resolves paths: PID 1's root. In the agent's hostPID pod that is the
/// node's file system, which the runner units traverse, while the agent's own `/var/lib` is its
/// image's: on a real node a 0700 `/var/lib` (made by a container runtime) failed every runner
/// with 200/CHDIR although the preflight in the container's view passed.
const SYSTEMD_VIEW: &str = "/proc/1/root";

/// Runner-root preflight: every existing ancestor of `root` (and `root` itself), as seen under
/// `view` (`/`: the agent's own view; [`SYSTEMD_VIEW`]: the host's), must be searchable by the
/// runner accounts, which are neither root nor the owner. A root under a 0700 home directory
/// would otherwise fail every launch at `exec` of the listener, after a JIT was already spent.
fn traversable_by_runners(
    view: &std::path::Path,
    root: &std::path::Path,
    runner_gid: u32,
) -> Result<(), AgentError> {
    use std::os::unix::fs::MetadataExt;
    for dir in root.ancestors() {
        let seen = view.join(dir.strip_prefix("/").unwrap_or(dir));
        let Ok(meta) = std::fs::metadata(&seen) else {
            continue; // Not created yet: it is made 0755 (or by the slot code) later.
        };
        let mode = meta.mode() & 0o7777;
        if !searchable(mode, meta.gid(), runner_gid) {
            return Err(AgentError::NotTraversable(dir.to_path_buf(), mode));
        }
    }
    Ok(())
}

/// Whether a directory with `mode` and group `gid` lets a runner account (group `runner_gid`,
/// not the owner) pass through it. Pure.
fn searchable(mode: u32, gid: u32, runner_gid: u32) -> bool {
    mode & 0o001 != 0 || (gid == runner_gid && mode & 0o010 != 0)
}

fn prepare_host_root(root: &std::path::Path) -> Result<(), AgentError> {
    use std::os::unix::fs::DirBuilderExt;
    let failed = |e: std::io::Error| AgentError::HostRoot(root.to_path_buf(), e.kind());
    // Runners traverse the host root to reach their runtime; only the agent writes to it.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(root)
        .map_err(failed)?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root.join("diagnostics"))
        .map_err(failed)
}

/// The runner units' network filter from the flags and the node's own addresses: those of
/// PID 1's network namespace (the host's, in the agent's hostPID pod) and the agent's own.
fn runner_network(cli: &Cli) -> Result<crate::providers::sandbox::RunnerNetwork, AgentError> {
    use crate::providers::sandbox::{RunnerNetwork, namespace_addresses};
    let mut node = namespace_addresses("1");
    node.extend(namespace_addresses("self"));
    node.sort();
    node.dedup();
    Ok(RunnerNetwork::new(
        &cli.runner_pod_cidrs.0,
        &cli.runner_service_cidrs.0,
        &node,
        &cli.runner_ip_allow.0,
    )?)
}

/// How long the start-up network proof may take (systemd starting a unit, a 3 s connect).
const NETWORK_PROOF_DEADLINE: Duration = Duration::from_secs(30);

/// The start-up proof that a runner unit cannot reach a denied address
/// (`sandbox::prove_denied_unreachable`). `Some(refusal)`: native runners are refused (their
/// attempts rejected, the Lease's `native-refused` says why); the agent keeps serving the rest.
async fn prove_runner_network(
    launcher: &SystemdLauncher,
    host_root: &std::path::Path,
) -> Option<crate::providers::sandbox::SandboxRefusal> {
    use crate::providers::sandbox::{PROBE_ACCOUNT, namespace_addresses, prove_denied_unreachable};
    let launcher = launcher.clone();
    let root = host_root.to_path_buf();
    let proof = tokio::task::spawn_blocking(move || {
        prove_denied_unreachable(
            &launcher,
            &launcher.network,
            &namespace_addresses("self"),
            &root,
            PROBE_ACCOUNT,
            NETWORK_PROOF_DEADLINE,
        )
    })
    .await
    .unwrap_or(Err(crate::providers::sandbox::SandboxRefusal::ProbeSetup));
    match proof {
        Ok(target) => {
            tracing::info!(
                "runner network filter proven: a probe unit could not reach {target}, which the agent listened on"
            );
            None
        }
        Err(refusal) => {
            tracing::error!(
                error = refusal.as_str(),
                "native runners refused (the systemd launcher's sandbox is not proven): {refusal}"
            );
            Some(refusal)
        }
    }
}

/// Runs the agent until SIGTERM (or SIGINT). Runners keep running: they outlive the agent.
pub async fn run(cli: Cli) -> Result<(), AgentError> {
    // Before anything is created under them.
    crate::roots::check_roots(&cli.host_root, &cli.slots_root)?;
    if cli.launcher == LauncherKind::Systemd {
        crate::roots::check_unit_safe(&cli.host_root, &cli.slots_root)?;
    }
    let runner_defaults = RunnerDefaults {
        nice: cli.runner_nice,
        ..RunnerDefaults::from_flags(
            &cli.default_runner_memory,
            cli.runner_tasks_max,
            cli.capacity,
        )?
    };
    prepare_host_root(&cli.host_root)?;
    let own_view = std::path::Path::new("/");
    traversable_by_runners(own_view, &cli.host_root, cli.runner_gid)?;
    traversable_by_runners(own_view, &cli.slots_root, cli.runner_gid)?;
    // The systemd launcher's runners resolve the roots in the host's mount namespace. Without
    // access to PID 1's root (no hostPID) there is no other view to check.
    let host_view = std::path::Path::new(SYSTEMD_VIEW);
    if cli.launcher == LauncherKind::Systemd && std::fs::metadata(host_view).is_ok() {
        traversable_by_runners(host_view, &cli.host_root, cli.runner_gid)?;
        traversable_by_runners(host_view, &cli.slots_root, cli.runner_gid)?;
    }
    let fence = HostFence::acquire(&cli.host_root)?;
    let config = kube::Config::infer()
        .await
        .map_err(|e| AgentError::KubeConfig(e.to_string()))?;
    // The agent's metrics and journal context live in its `Agent` (no process statics); the
    // client counts its requests into the same metrics.
    let metrics = Arc::new(metrics::AgentMetrics::new());
    let kube = api_requests::client(config, Arc::clone(&metrics))
        .map_err(|e| AgentError::KubeConfig(e.to_string()))?;
    let helper = entry_helper(&cli)?;
    let mut native_refused = None;
    // The helper as the runners see it: the job gate's hook runs it too.
    let mut runners_helper = helper.clone();
    let launcher: Box<dyn RunnerLauncher> = match cli.launcher {
        LauncherKind::Direct => Box::new(DirectLauncher::new(
            CgroupParent::open(&cli.cgroup_parent)
                .map_err(|e| AgentError::Launcher(e.to_string()))?,
            helper,
        )),
        LauncherKind::Systemd => {
            runners_helper = crate::providers::systemd::install_helper(&helper, &cli.host_root)
                .map_err(|e| AgentError::Launcher(format!("installing the entry helper: {e}")))?;
            let launcher =
                SystemdLauncher::new(runners_helper.clone()).with_network(runner_network(&cli)?);
            native_refused = prove_runner_network(&launcher, &cli.host_root).await;
            Box::new(launcher)
        }
    };
    let limits = cli.download_limits().map_err(|e| {
        AgentError::Packages(format!(
            "reading --download-ca-file {}: {e}",
            cli.download_ca_file
                .as_deref()
                .unwrap_or(Path::new(""))
                .display()
        ))
    })?;
    let downloader = Downloader::with_limits(RetryPolicy::PRODUCTION, Timeouts::PRODUCTION, limits)
        .map_err(|e| AgentError::Packages(e.to_string()))?;
    // The slots root is where persistent runtimes live: on another volume than the cache, a
    // seed of each version there lets slots clone instead of copying (DESIGN §6).
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&cli.slots_root)
            .map_err(|e| AgentError::HostRoot(cli.slots_root.clone(), e.kind()))?;
    }
    let materializer = crate::packages::overlay::choose(
        cli.materialize,
        &[
            crate::workspace::ephemeral::runners_dir(&cli.host_root),
            cli.slots_root.clone(),
        ],
        &cli.host_root,
    )
    .map_err(|e| AgentError::Packages(format!("--materialize overlay: {e}")))?;
    tracing::info!(
        "packages are laid into runtimes by {} (--materialize {:?})",
        materializer.as_str(),
        cli.materialize
    );
    metrics.materializer(materializer);
    let packages = PackageCache::new(cli.host_root.join("packages"), downloader)
        .map_err(|e| AgentError::Packages(format!("{:?}", e.kind())))?
        .with_materializer(materializer)
        .with_extract_limits(cli.extract_limits())
        .with_seed_root(&cli.slots_root)
        .map_err(|e| AgentError::Packages(format!("seed root: {:?}", e.kind())))?;
    let pod_watch = Arc::new(crate::pod_watch::PodWatch::default());
    let broker = Arc::new(BrokerClient::new(
        cli.broker_url.clone(),
        cli.broker_token_file.clone(),
        kube.clone(),
        cli.system_namespace.clone(),
    ));
    let agent = Arc::new(Agent {
        host: node::Host {
            root: cli.host_root.clone(),
            slots_root: cli.slots_root.clone(),
            capacity: cli.capacity,
            runner_defaults,
            packages,
            allocation: AllocationLock::default(),
            accounts: Mutex::new(AccountPool::new(cli.runner_uid_range, cli.runner_gid)),
            slots: Mutex::new(SlotTable::default()),
            cleanup_backoff: Mutex::new(CleanupBackoff::default()),
            wanted_packages: Mutex::new(BTreeSet::new()),
            preparation: preparation::PreparationBound::new(cli.preparation_permits),
            job_gates: job_gates::JobGates::new(runners_helper, cli.host_root.clone()),
            caches: Arc::new(crate::caches::CacheRoot::new(
                &cli.host_root,
                cli.runner_gid,
                cli.cache_max_gib.saturating_mul(1 << 30),
            )),
            docker: crate::docker::DockerJobs::new(cli.podman.clone()),
        },
        providers: crate::providers::Providers::new(
            launcher,
            native_refused,
            crate::providers::oci::OciProvider {
                pods: crate::providers::oci::KubePods {
                    client: kube.clone(),
                    watch: Arc::clone(&pod_watch),
                    broker: Arc::clone(&broker),
                },
                node: cli.node_name.clone(),
                // Without `--oci` the provider only supervises and destroys the pods an earlier
                // run started: it makes none, so its deadlines are never waited for.
                start_deadline: Duration::from_secs(if cli.oci {
                    cli.oci_start_deadline_seconds
                } else {
                    1
                }),
                handoff_deadline: Duration::from_secs(if cli.oci {
                    cli.oci_handoff_deadline_seconds
                } else {
                    1
                }),
            },
            cli.oci,
        ),
        cluster: node::Cluster {
            node: cli.node_name.clone(),
            system_namespace: cli.system_namespace.clone(),
            attempts: attempts::Attempts::new(
                kube::Api::all(kube.clone()),
                Arc::new(crate::journal::Journal::default()),
                Arc::clone(&metrics),
            ),
            events: events::recorder(&kube, &cli.node_name),
            kube,
            pod_watch,
            foreign_pods: Arc::default(),
            broker: Arc::clone(&broker),
            heartbeat: Duration::from_secs(cli.heartbeat_seconds),
            last_renewed: Mutex::new(None),
            advert_changed: Notify::new(),
            placeholders: placeholder::Settings::from_flags(
                cli.placeholders,
                cli.placeholder_wait_seconds,
            ),
        },
        poll: Duration::from_millis(cli.supervision_millis),
        deadline_grace: Duration::from_secs(cli.deadline_grace_seconds),
        gate: RecoveryGate::default(),
        book: Mutex::new(CapacityBook::default()),
        pending: Mutex::new(BTreeSet::new()),
        spec_warned: Mutex::new(std::collections::BTreeSet::new()),
        orphan_sweep: Duration::from_secs(cli.orphan_sweep_seconds),
        orphans: orphans::OrphanState::default(),
    });
    let health = match cli.health_addr {
        Some(addr) => Some(
            health::serve(Arc::clone(&agent), addr)
                .await
                .map_err(|e| AgentError::Bind(addr, e.kind()))?,
        ),
        None => None,
    };
    tracing::info!(
        node = %agent.cluster.node,
        capacity = agent.host.capacity,
        health = %health.as_ref().map(|(a, _)| a.to_string()).unwrap_or_default(),
        "node {} serving (capacity {}, launcher {:?}, host root {})",
        agent.cluster.node,
        agent.host.capacity,
        cli.launcher,
        agent.host.root.display()
    );
    let heartbeat = tokio::spawn(lease::heartbeat(Arc::clone(&agent)));
    let foreign = {
        let agent = Arc::clone(&agent);
        tokio::spawn(async move {
            agent
                .cluster
                .foreign_pods
                .run(agent.cluster.kube.clone(), agent.cluster.node.clone())
                .await;
        })
    };
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| AgentError::Signals(e.kind()))?;
    let watching = controller::run(Arc::clone(&agent));
    tokio::select! {
        _ = sigterm.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
        () = watching => {}
    }
    // Stop watching and supervising; the runners run on and the next agent adopts them.
    heartbeat.abort();
    foreign.abort();
    if let Some((_, task)) = health {
        task.abort();
    }
    drop(fence);
    tracing::info!("stopped on signal; runners keep running");
    Ok(())
}

#[cfg(test)]
mod preflight_tests {
    use super::{AgentError, searchable, traversable_by_runners};
    use std::os::unix::fs::PermissionsExt;

    /// The check follows the view it is given: a directory the runners cannot search in the
    /// host's tree refuses the root even when the agent's own tree (`/`) lets them through.
    #[test]
    fn ancestors_are_checked_in_the_given_view() {
        let host = tempfile::tempdir().expect("tempdir");
        let lib = host.path().join("var/lib");
        std::fs::create_dir_all(lib.join("runner-manager")).expect("mkdir");
        for d in [host.path(), &host.path().join("var")] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let root = std::path::Path::new("/var/lib/runner-manager");
        match traversable_by_runners(host.path(), root, 20000) {
            Err(AgentError::NotTraversable(dir, 0o700)) => {
                assert_eq!(dir, std::path::Path::new("/var/lib"))
            }
            other => panic!("a 0700 /var/lib in the host's view passed: {other:?}"),
        }
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        traversable_by_runners(host.path(), root, 20000).expect("searchable once 0755");
    }

    #[test]
    fn runner_accounts_need_other_or_group_search() {
        assert!(searchable(0o755, 0, 20000));
        assert!(searchable(0o751, 0, 20000));
        assert!(!searchable(0o700, 0, 20000), "a home directory");
        assert!(
            !searchable(0o750, 0, 20000),
            "group search for another group"
        );
        assert!(
            searchable(0o750, 20000, 20000),
            "group search for the runner group"
        );
    }
}
