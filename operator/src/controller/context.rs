//! What every step of the leader's controllers is handed ([`Ctx`]: the one writer, the client
//! registry, the caches, Events, metrics, the settings) and the names they share. Below every
//! stage: a stage's module may use it, it uses no stage (module-cycles.py).

use std::sync::Arc;
use std::time::Duration;

use runner_manager_crds::state::AttemptState;

use super::cache::Caches;
use super::events::Events;
use super::writes::Writer;
use crate::github::registry::Clients;
use crate::metrics::Metrics;

/// The policy finalizer: a policy being deleted drains before it goes.
pub const POLICY_FINALIZER: &str = "runner-manager.dev/drain";

/// Settings from the command line.
#[derive(Clone, Debug)]
pub struct Settings {
    pub namespace: String,
    pub ownership_label: String,
    pub runner_mirror_url: Option<String>,
    pub observe_interval: Duration,
    pub resync_interval: Duration,
    pub orphan_grace: Duration,
    pub admission_timeout: Duration,
    pub node_lost_grace: Duration,
    pub job_check_grace: Duration,
    pub attempt_history: u32,
    pub max_consecutive_failures: u32,
    pub replacement_backoff: Duration,
    pub replacement_backoff_max: Duration,
    /// GitHub owners bound to namespaces (`--owner-namespaces`).
    pub owner_bindings: crate::policy::tenancy::OwnerBindings,
    /// Which GitHub and download hosts policies may lead to (`--github-hosts` and friends).
    pub hosts: crate::controller::resolve::HostPolicy,
    /// `--max-runners-per-node`: placement uses the smaller of this and each agent's advert.
    pub max_runners_per_node: Option<u32>,
}

/// What every step needs.
pub struct Ctx {
    pub writer: Writer,
    pub clients: Arc<Clients>,
    pub settings: Settings,
    pub caches: Caches,
    pub events: Events,
    pub metrics: Arc<Metrics>,
    /// When this replica's controllers started (after leadership and the first lists): node
    /// silence is counted from here at the earliest (`attempts::counted_from`).
    pub leading_since: std::sync::OnceLock<k8s_openapi::jiff::Timestamp>,
}

impl Ctx {
    pub fn kube(&self) -> &kube::Client {
        &self.writer.kube
    }
}

pub(crate) fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

pub fn state_name(s: AttemptState) -> &'static str {
    match s {
        AttemptState::Pending => "Pending",
        AttemptState::Allocated => "Allocated",
        AttemptState::Preparing => "Preparing",
        AttemptState::Prepared => "Prepared",
        AttemptState::JitReceived => "JitReceived",
        AttemptState::Starting => "Starting",
        AttemptState::Idle => "Idle",
        AttemptState::Busy => "Busy",
        AttemptState::Finished => "Finished",
        AttemptState::Failed => "Failed",
        AttemptState::Orphaned => "Orphaned",
        AttemptState::Destroying => "Destroying",
        AttemptState::CleanupDeferred => "CleanupDeferred",
        AttemptState::Cleaned => "Cleaned",
    }
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx").finish_non_exhaustive()
    }
}
