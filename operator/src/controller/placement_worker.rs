//! The one placement worker (DESIGN §4 rule 9, §6): node views built from the cached Nodes, the
//! agents' Lease adverts (`crds::lease::AgentAdvert`) and the journal, plus ReplicaSet-style
//! expectations — an attempt created but not yet in the cache still occupies its node, so two
//! passes can never overfill one.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::lease::AgentAdvert;
use runner_manager_crds::names::agent_lease_name;

use crate::policy::placement::{self, AgentLease, Expectations, NodeView, Unplaceable};

/// What placement knows of one node, owned (the views borrow from it).
#[derive(Clone, Debug)]
pub struct NodeFacts {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub cordoned: bool,
    pub agent: Option<AgentLease>,
    pub advert: Option<AgentAdvert>,
    pub counted: BTreeSet<String>,
}

/// The agent Lease of a node, read as placement needs it. A Lease whose advert cannot be parsed
/// is treated as no agent: placing on an agent we cannot understand would be a guess.
pub fn agent_of(lease: &Lease) -> Option<(AgentLease, AgentAdvert)> {
    let advert = AgentAdvert::from_annotations(lease.metadata.annotations.as_ref()?).ok()?;
    let spec = lease.spec.as_ref()?;
    let renewed_at = spec
        .renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .map(|t| t.0);
    let duration = Duration::from_secs(
        spec.lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .unwrap_or(40),
    );
    Some((
        AgentLease {
            renewed_at,
            duration,
            recovery_complete: advert.recovery_complete,
            capacity: advert.capacity,
            free: Some(advert.free),
        },
        advert,
    ))
}

/// Every node with what counts against it. Pure over the cached objects.
pub fn node_facts(
    nodes: &[&Node],
    leases: &[&Lease],
    attempts: &[&RunnerAttempt],
) -> Vec<NodeFacts> {
    let by_name: BTreeMap<&str, &Lease> = leases
        .iter()
        .filter_map(|l| Some((l.metadata.name.as_deref()?, *l)))
        .collect();
    let mut counted: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for a in attempts {
        let state = a
            .status
            .as_ref()
            .map(|s| s.journal.state())
            .unwrap_or_default();
        if state.counts_against_capacity(a.spec.snapshot.execution.mode)
            && let Some(name) = a.metadata.name.as_deref()
        {
            counted
                .entry(a.spec.node_name.as_str())
                .or_default()
                .insert(name.to_owned());
        }
    }
    nodes
        .iter()
        .filter_map(|n| {
            let name = n.metadata.name.as_deref()?;
            let agent = by_name
                .get(agent_lease_name(name).as_str())
                .and_then(|l| agent_of(l));
            Some(NodeFacts {
                name: name.to_owned(),
                labels: n.metadata.labels.clone().unwrap_or_default(),
                cordoned: n
                    .spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false),
                agent: agent.as_ref().map(|(a, _)| a.clone()),
                advert: agent.map(|(_, ad)| ad),
                counted: counted.remove(name).unwrap_or_default(),
            })
        })
        .collect()
}

/// The placement worker: expectations survive from pass to pass.
#[derive(Debug)]
pub struct PlacementWorker {
    pub expectations: Expectations,
}

impl PlacementWorker {
    pub fn new() -> Self {
        Self {
            expectations: Expectations::new(Duration::from_secs(120)),
        }
    }

    /// Forget expectations the cache now shows (or that are too old to still be in flight).
    pub fn observe<'a>(&mut self, cached: impl Iterator<Item = &'a str>, now: Timestamp) {
        for name in cached {
            self.expectations.observed(name);
        }
        self.expectations.expire(now);
    }

    /// Choose a node for one attempt of a policy (`policy_uid`, `sha256` of its package).
    pub fn choose(
        &self,
        facts: &[NodeFacts],
        selector: &BTreeMap<String, String>,
        policy_uid: &str,
        sha256: &str,
        now: Timestamp,
    ) -> Result<String, Unplaceable> {
        let views: Vec<NodeView<'_>> = facts
            .iter()
            .map(|f| NodeView {
                name: &f.name,
                labels: &f.labels,
                cordoned: f.cordoned,
                agent: f.agent.clone(),
                counted: f.counted.iter().map(String::as_str).collect(),
                free_cleaned_slots: f
                    .advert
                    .as_ref()
                    .and_then(|a| a.free_slots.get(policy_uid).copied())
                    .unwrap_or(0),
                package_cached: f
                    .advert
                    .as_ref()
                    .is_some_and(|a| a.packages.contains(sha256)),
            })
            .collect();
        placement::choose(&views, selector, &self.expectations, now).map(str::to_owned)
    }

    pub fn created(&mut self, name: &str, node: &str, now: Timestamp) {
        self.expectations.created(name, node, now);
    }
}

impl Default for PlacementWorker {
    fn default() -> Self {
        Self::new()
    }
}
