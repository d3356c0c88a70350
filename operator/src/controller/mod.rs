//! The controllers the leader runs: a kube-runtime `Controller<ScalePolicy>` (`runtime`) over
//! the cached policies, triggered by their attempts, agent Leases and Nodes, with the one
//! placement worker in its context.
//!
//! Each policy's reconcile: housekeeping of its attempts (finalizers, abandon, the operator's
//! two edges, history), then resolution → observation of GitHub → job ledger repairs
//! (`policy::prepare`), the pure plan (`plan`) and its application — placement and creation,
//! scale-down, terminations, status (`policy::apply`).

pub mod attempts;
pub mod cache;
pub mod errors;
pub mod events;
pub mod failures;
pub mod job_ledger;
pub mod leader;
pub mod ledger_batch;
pub mod placement_worker;
pub mod plan;
pub mod policy;
pub mod resolve;
pub mod runtime;
pub mod scaleset_listener;
pub mod snapshot;
pub mod supervisor;
pub mod timeouts;
pub mod writes;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use runner_manager_crds::state::AttemptState;
use tokio::time::Instant;

use crate::github::registry::Clients;
use crate::github::types::Runner;
use crate::metrics::Metrics;
use cache::Caches;
use events::Events;
use resolve::{Invalid, Resolved};
use writes::Writer;

pub use runtime::run;

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

/// A resolution and when it was made.
pub struct ResolvedEntry {
    pub generation: i64,
    pub at: Instant,
    pub result: Result<Resolved, Invalid>,
}

/// What the leader remembers of one policy between reconciles (rebuilt after failover; nothing
/// here is needed for safety, only to space out work).
#[derive(Default)]
pub struct PolicyMemory {
    pub resolved: Option<ResolvedEntry>,
    pub last_observe: Option<Instant>,
    pub last_poll: Option<Instant>,
    /// The last runner listing of the policy's target, by runner name.
    pub listing: Option<HashMap<String, Runner>>,
    /// Orphan registrations by runner id: when first seen orphaned.
    pub orphans: HashMap<i64, Instant>,
    /// Pending jobs by id: when last checked with GitHub.
    pub job_checks: HashMap<String, Instant>,
    /// Jobs the organization walk recorded lately, by id: not written again while the cache
    /// catches up with the write.
    pub walk_added: HashMap<String, Instant>,
    /// Attempts created for the policy and not yet in the cache, by name: when created.
    pub created: HashMap<String, Instant>,
    /// The status fields last written, and when.
    pub status_written: Option<(serde_json::Value, Instant)>,
    /// `ScaleSet` policies: the message-session listener (dropped, and its session deleted,
    /// with this memory: leadership lost, policy gone).
    pub scale_set_listener: Option<scaleset_listener::Listener>,
    /// After a failed reconcile: when the policy may be reconciled again.
    pub backoff: Option<errors::Backoff>,
}

fn key(namespace: &str, name: &str) -> String {
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

impl std::fmt::Debug for ResolvedEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedEntry").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for PolicyMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyMemory").finish_non_exhaustive()
    }
}
