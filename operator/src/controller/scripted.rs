//! The scripted API server (`runner_manager_crds::scripted`) with the leader's context over it,
//! for unit tests of the reconcile's stages.

use std::sync::Arc;
use std::time::Duration;

pub use runner_manager_crds::scripted::*;

use super::applying::events::Events;
use super::applying::writes::Writer;
use super::control::cache::{Caches, Triggers};
use super::{Ctx, Settings};
use crate::github::client::GitHubConfig;
use crate::github::registry::Clients;
use crate::metrics::Metrics;

/// The leader's context over `kube`, with empty caches and the operator's default settings.
pub fn ctx(kube: kube::Client) -> Ctx {
    let metrics = Metrics::new();
    let writer = Writer {
        kube: kube.clone(),
        metrics: metrics.clone(),
        echoes: Arc::default(),
    };
    use kube_runtime::reflector::store;
    let (policies, _) = store();
    let (attempts, _) = store();
    let (leases, _) = store();
    let (nodes, _) = store();
    Ctx {
        events: Events::new(writer.clone(), "operator-test".into()),
        writer,
        clients: Arc::new(Clients::new(kube, GitHubConfig::default())),
        settings: Settings {
            namespace: "rm-system".into(),
            ownership_label: "rm-test".into(),
            runner_mirror_url: None,
            observe_interval: Duration::from_secs(10),
            resync_interval: Duration::from_secs(10),
            orphan_grace: Duration::from_secs(60),
            admission_timeout: Duration::from_secs(60),
            node_lost_grace: Duration::from_secs(60),
            job_check_grace: Duration::from_secs(60),
            attempt_history: 10,
            max_consecutive_failures: 5,
            replacement_backoff: Duration::from_secs(1),
            replacement_backoff_max: Duration::from_secs(60),
            owner_bindings: Default::default(),
            hosts: Default::default(),
            max_runners_per_node: None,
        },
        caches: Caches {
            policies,
            attempts,
            leases,
            nodes,
            touched: Triggers::default(),
        },
        metrics,
        leading_since: std::sync::OnceLock::new(),
    }
}
