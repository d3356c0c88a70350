//! The scripted API server (`runner_manager_crds::scripted`) with an agent over it, for unit
//! tests of what the agent writes (issue 30 item 7): the cleanup and the launch's steps, one
//! request at a time, against real files under a temporary host root and no cluster. The
//! agent's runners come from a launcher that starts nothing ([`Inert`]): a test that needs a
//! real runner is a process test.

use std::collections::BTreeSet;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runner_manager_crds::attempt::{Launcher, ProcessIdentity};
use tokio::sync::Notify;

pub use runner_manager_crds::scripted::*;

use super::abandoned::OrphanState;
use super::accounts::AccountPool;
use super::admission::CapacityBook;
use super::gate::RecoveryGate;
use super::node::{Agent, Cluster, Host};
use super::preparation::PreparationBound;
use crate::broker_client::BrokerClient;
use crate::handoff::RestrictiveHandoff;
use crate::packages::PackageCache;
use crate::packages::download::{Downloader, RetryPolicy, Timeouts};
use crate::process::Inspection;
use crate::process::inspect::GoneBecause;
use crate::providers::cgroup::RunnerDefaults;
use crate::providers::launcher::{
    LaunchSpec, RunnerLauncher, StartError, StartFailure, StopError, Stopped,
};
use crate::workspace::allocation::AllocationLock;
use crate::workspace::backoff::CleanupBackoff;
use crate::workspace::slot_table::SlotTable;

/// A launcher that starts nothing: every start is refused, and nothing it could have started
/// is running.
#[derive(Debug)]
pub struct Inert;

impl RunnerLauncher for Inert {
    fn kind(&self) -> Launcher {
        Launcher::Direct
    }
    fn start(
        &self,
        _: &LaunchSpec<'_>,
        _: RestrictiveHandoff,
    ) -> Result<ProcessIdentity, StartError> {
        Err(StartError::before_child(StartFailure::ListenerMissing))
    }
    fn inspect(&self, _: &ProcessIdentity) -> io::Result<Inspection> {
        Ok(Inspection::Gone(GoneBecause::NoProcess))
    }
    fn stop(&self, _: &ProcessIdentity) -> Result<Stopped, StopError> {
        Ok(Stopped::AlreadyGone)
    }
    fn exit_status(&self, _: &ProcessIdentity) -> Option<std::process::ExitStatus> {
        None
    }
}

/// An agent of node `n1` over `kube`, its host root and slots under `root` (which must exist),
/// with the default flags' settings and no OCI.
pub fn agent(kube: kube::Client, root: &Path) -> Agent {
    let host_root = root.join("host");
    let slots_root = root.join("slots");
    for dir in [&host_root, &slots_root] {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    }
    let metrics = Arc::new(super::metrics::AgentMetrics::new());
    let downloader = Downloader::new(RetryPolicy::PRODUCTION, Timeouts::PRODUCTION)
        .unwrap_or_else(|e| panic!("{e}"));
    let packages =
        PackageCache::new(host_root.join("packages"), downloader).unwrap_or_else(|e| panic!("{e}"));
    let pod_watch = Arc::new(crate::pod_watch::PodWatch::default());
    let broker = Arc::new(BrokerClient::new(
        "https://broker.invalid".into(),
        root.join("broker-token"),
        kube.clone(),
        "rm-system".into(),
    ));
    let node = "n1".to_owned();
    Agent {
        host: Host {
            root: host_root.clone(),
            slots_root,
            capacity: 4,
            runner_defaults: RunnerDefaults::from_flags("2Gi", 4096, 4)
                .unwrap_or_else(|e| panic!("{e}")),
            packages,
            allocation: AllocationLock::default(),
            accounts: Mutex::new(AccountPool::new((200_000, 200_099), 200_000)),
            slots: Mutex::new(SlotTable::default()),
            cleanup_backoff: Mutex::new(CleanupBackoff::default()),
            wanted_packages: Mutex::new(BTreeSet::new()),
            preparation: PreparationBound::new(2),
            job_gates: super::job_gates::JobGates::new(
                root.join("entry-helper"),
                host_root.clone(),
            ),
            caches: Arc::new(crate::caches::CacheRoot::new(&host_root, 200_000, 1 << 30)),
            docker: crate::docker::DockerJobs::new(root.join("podman")),
        },
        providers: crate::providers::Providers::new(
            Box::new(Inert),
            None,
            crate::providers::oci::OciProvider {
                pods: crate::providers::oci::KubePods {
                    client: kube.clone(),
                    watch: Arc::clone(&pod_watch),
                    broker: Arc::clone(&broker),
                },
                node: node.clone(),
                start_deadline: Duration::from_secs(1),
                handoff_deadline: Duration::from_secs(1),
            },
            false,
        ),
        cluster: Cluster {
            attempts: super::attempts::Attempts::new(
                kube::Api::all(kube.clone()),
                Arc::new(crate::journal::Journal::default()),
                Arc::clone(&metrics),
            ),
            events: super::events::recorder(&kube, &node),
            node,
            system_namespace: "rm-system".into(),
            kube,
            pod_watch,
            foreign_pods: Arc::default(),
            broker,
            heartbeat: Duration::from_secs(10),
            last_renewed: Mutex::new(None),
            advert_changed: Notify::new(),
            placeholders: None,
        },
        poll: Duration::from_millis(500),
        deadline_grace: Duration::from_secs(30),
        gate: RecoveryGate::default(),
        book: Mutex::new(CapacityBook::default()),
        pending: Mutex::new(BTreeSet::new()),
        spec_warned: Mutex::new(BTreeSet::new()),
        orphan_sweep: Duration::from_secs(60),
        orphans: OrphanState::default(),
    }
}
