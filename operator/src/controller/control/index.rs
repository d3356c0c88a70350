//! The leader's trigger index (the shape of linkerd2 policy-controller's `index.rs`): what the
//! attempt, agent Lease and Node events showed, kept so that the Controller's mappers answer
//! "which policies does this event concern" from the index alone, never by scanning the caches.
//! One `apply`/`delete` per event kind; each returns the policies to reconcile. Pure: no client,
//! no clock, no lock (the caller holds it), unit-tested below.
//!
//! - An **attempt** concerns its own policy, and the policies waiting for capacity (an attempt
//!   that ends frees room on its node).
//! - An agent **Lease** or a **Node** concerns the policies with a live (not `Cleaned`) attempt on
//!   that node, and those waiting for capacity — but only when what placement reads of it
//!   changed (a Lease's advert annotations; a Node's labels, cordon and allocatable), so a
//!   renewal or a status heartbeat triggers nothing.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::runtime::reflector::ObjectRef;
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::policy::ScalePolicy;
use runner_manager_crds::state::AttemptState;

/// The agent Lease name prefix (`names::agent_lease_name`).
const AGENT_LEASE_PREFIX: &str = "runner-manager-agent-";

/// What placement reads of a Node: labels, cordon, allocatable.
type NodeFacts = (
    Option<BTreeMap<String, String>>,
    bool,
    Option<BTreeMap<String, Quantity>>,
);

type PolicyRef = ObjectRef<ScalePolicy>;
type AttemptRef = ObjectRef<RunnerAttempt>;

/// See the module documentation.
#[derive(Debug, Default)]
pub struct PolicyIndex {
    /// Each policy's attempts (any state): a reconcile reads its own from the cache by
    /// reference instead of scanning every attempt (10,000 at scale, once per policy per round).
    members: HashMap<PolicyRef, HashSet<AttemptRef>>,
    /// Live attempts by node, each with its policy.
    live_on: HashMap<String, HashMap<AttemptRef, PolicyRef>>,
    /// Where each live attempt was indexed, to move or drop it on its next event.
    node_of: HashMap<AttemptRef, String>,
    /// Policies whose last reconcile wanted capacity placement could not give.
    waiting: HashSet<PolicyRef>,
    /// Advert annotations of each agent Lease, by node.
    adverts: HashMap<String, Option<BTreeMap<String, String>>>,
    nodes: HashMap<String, NodeFacts>,
}

/// The policy an attempt belongs to.
pub fn policy_of(a: &RunnerAttempt) -> PolicyRef {
    let r = ObjectRef::new(&a.spec.policy);
    match a.metadata.namespace.as_deref() {
        Some(ns) => r.within(ns),
        None => r,
    }
}

impl PolicyIndex {
    /// An attempt as it now is (created or changed).
    pub fn apply_attempt(&mut self, a: &RunnerAttempt) -> Vec<PolicyRef> {
        let policy = policy_of(a);
        let me = ObjectRef::from_obj(a);
        self.members
            .entry(policy.clone())
            .or_default()
            .insert(me.clone());
        self.unplace(&me);
        if a.state() != AttemptState::Cleaned {
            self.live_on
                .entry(a.spec.node_name.clone())
                .or_default()
                .insert(me.clone(), policy.clone());
            self.node_of.insert(me, a.spec.node_name.clone());
        }
        self.with_waiting(vec![policy])
    }

    /// An attempt that is gone.
    pub fn delete_attempt(&mut self, a: &RunnerAttempt) -> Vec<PolicyRef> {
        let policy = policy_of(a);
        let me = ObjectRef::from_obj(a);
        if let Some(set) = self.members.get_mut(&policy) {
            set.remove(&me);
            if set.is_empty() {
                self.members.remove(&policy);
            }
        }
        self.unplace(&me);
        self.with_waiting(vec![policy])
    }

    /// An agent Lease as it now is.
    pub fn apply_lease(&mut self, lease: &Lease) -> Vec<PolicyRef> {
        let Some(node) = lease_node(lease) else {
            return Vec::new();
        };
        let advert = lease.metadata.annotations.clone();
        if self.adverts.get(node) == Some(&advert) {
            return Vec::new();
        }
        self.adverts.insert(node.to_owned(), advert);
        self.concerning(node)
    }

    /// An agent Lease that is gone.
    pub fn delete_lease(&mut self, lease: &Lease) -> Vec<PolicyRef> {
        let Some(node) = lease_node(lease) else {
            return Vec::new();
        };
        self.adverts.remove(node);
        self.concerning(node)
    }

    /// A Node as it now is.
    pub fn apply_node(&mut self, n: &Node) -> Vec<PolicyRef> {
        let Some(name) = n.metadata.name.as_deref() else {
            return Vec::new();
        };
        let facts = (
            n.metadata.labels.clone(),
            n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true),
            n.status.as_ref().and_then(|s| s.allocatable.clone()),
        );
        if self.nodes.get(name) == Some(&facts) {
            return Vec::new();
        }
        self.nodes.insert(name.to_owned(), facts);
        self.concerning(name)
    }

    /// A Node that is gone.
    pub fn delete_node(&mut self, n: &Node) -> Vec<PolicyRef> {
        let Some(name) = n.metadata.name.as_deref() else {
            return Vec::new();
        };
        self.nodes.remove(name);
        self.concerning(name)
    }

    /// Record whether the policy's last reconcile waited for capacity.
    pub fn set_waiting(&mut self, policy: PolicyRef, waiting: bool) {
        if waiting {
            self.waiting.insert(policy);
        } else {
            self.waiting.remove(&policy);
        }
    }

    /// Keep waiting only the policies `live` says still exist.
    pub fn retain_waiting(&mut self, live: impl Fn(&PolicyRef) -> bool) {
        self.waiting.retain(|p| live(p));
    }

    /// The policy's attempts as the events showed them.
    pub fn attempts_of(&self, policy: &PolicyRef) -> Vec<AttemptRef> {
        self.members
            .get(policy)
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn unplace(&mut self, me: &AttemptRef) {
        if let Some(node) = self.node_of.remove(me)
            && let Some(on) = self.live_on.get_mut(&node)
        {
            on.remove(me);
            if on.is_empty() {
                self.live_on.remove(&node);
            }
        }
    }

    /// The policies with live attempts on `node`, and those waiting for capacity.
    fn concerning(&self, node: &str) -> Vec<PolicyRef> {
        let on: HashSet<PolicyRef> = self
            .live_on
            .get(node)
            .map(|on| on.values().cloned().collect())
            .unwrap_or_default();
        self.with_waiting(on.into_iter().collect())
    }

    fn with_waiting(&self, mut refs: Vec<PolicyRef>) -> Vec<PolicyRef> {
        for w in &self.waiting {
            if !refs.contains(w) {
                refs.push(w.clone());
            }
        }
        refs
    }
}

/// The node an agent Lease speaks for; `None` for any other Lease.
fn lease_node(lease: &Lease) -> Option<&str> {
    lease
        .metadata
        .name
        .as_deref()
        .and_then(|n| n.strip_prefix(AGENT_LEASE_PREFIX))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use runner_manager_crds::fixtures::AttemptBuilder;

    fn policy(name: &str) -> PolicyRef {
        ObjectRef::new(name)
    }

    fn lease(node: &str, advert: &[(&str, &str)]) -> Lease {
        let mut l = Lease::default();
        l.metadata.name = Some(format!("{AGENT_LEASE_PREFIX}{node}"));
        l.metadata.annotations = Some(
            advert
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        l
    }

    fn node(name: &str, cordoned: bool) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.to_owned());
        n.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            unschedulable: Some(cordoned),
            ..Default::default()
        });
        n
    }

    fn sorted(mut v: Vec<PolicyRef>) -> Vec<String> {
        let mut out: Vec<String> = v.drain(..).map(|r| r.name).collect();
        out.sort();
        out
    }

    #[test]
    fn an_attempt_belongs_to_its_policy_in_its_namespace_and_agents_leases_name_their_node() {
        let a = AttemptBuilder::new("web-1", "web")
            .namespace("team-a")
            .build();
        assert_eq!(
            policy_of(&a),
            ObjectRef::<ScalePolicy>::new("web").within("team-a")
        );
        assert_eq!(
            runner_manager_crds::names::agent_lease_name("n1").strip_prefix(AGENT_LEASE_PREFIX),
            Some("n1"),
            "the Lease prefix is the one agents use"
        );
    }

    #[test]
    fn an_attempt_concerns_its_policy_and_the_waiting_ones_and_is_its_policys_member() {
        let mut ix = PolicyIndex::default();
        ix.set_waiting(policy("hungry"), true);
        let a = AttemptBuilder::new("web-1", "web").node("n1").build();
        assert_eq!(sorted(ix.apply_attempt(&a)), ["hungry", "web"]);
        assert_eq!(ix.attempts_of(&policy("web")).len(), 1);
        assert_eq!(sorted(ix.delete_attempt(&a)), ["hungry", "web"]);
        assert!(ix.attempts_of(&policy("web")).is_empty());
        ix.set_waiting(policy("hungry"), false);
        assert_eq!(sorted(ix.apply_attempt(&a)), ["web"]);
    }

    #[test]
    fn a_node_or_lease_change_concerns_the_policies_with_live_attempts_there_only() {
        let mut ix = PolicyIndex::default();
        ix.apply_attempt(&AttemptBuilder::new("web-1", "web").node("n1").build());
        ix.apply_attempt(&AttemptBuilder::new("api-1", "api").node("n2").build());
        ix.apply_attempt(
            &AttemptBuilder::new("old-1", "old")
                .node("n1")
                .state(AttemptState::Cleaned)
                .build(),
        );
        assert_eq!(sorted(ix.apply_node(&node("n1", false))), ["web"]);
        assert_eq!(sorted(ix.apply_lease(&lease("n2", &[("a", "1")]))), ["api"]);
        // A policy waiting for capacity hears of every node.
        ix.set_waiting(policy("hungry"), true);
        assert_eq!(
            sorted(ix.delete_node(&node("n1", false))),
            ["hungry", "web"]
        );
    }

    #[test]
    fn an_attempt_that_is_cleaned_or_moves_leaves_its_old_node() {
        let mut ix = PolicyIndex::default();
        let a = AttemptBuilder::new("web-1", "web").node("n1").build();
        ix.apply_attempt(&a);
        assert_eq!(sorted(ix.apply_node(&node("n1", false))), ["web"]);
        ix.apply_attempt(
            &AttemptBuilder::new("web-1", "web")
                .node("n1")
                .state(AttemptState::Cleaned)
                .build(),
        );
        assert!(ix.apply_node(&node("n1", true)).is_empty());
        // Still a member until deleted: housekeeping reads cleaned attempts.
        assert_eq!(ix.attempts_of(&policy("web")).len(), 1);
    }

    #[test]
    fn a_renewal_or_heartbeat_that_changes_nothing_placement_reads_concerns_no_policy() {
        let mut ix = PolicyIndex::default();
        ix.apply_attempt(&AttemptBuilder::new("web-1", "web").node("n1").build());
        assert_eq!(sorted(ix.apply_lease(&lease("n1", &[("a", "1")]))), ["web"]);
        assert!(ix.apply_lease(&lease("n1", &[("a", "1")])).is_empty());
        assert_eq!(sorted(ix.apply_lease(&lease("n1", &[("a", "2")]))), ["web"]);
        assert_eq!(sorted(ix.apply_node(&node("n1", false))), ["web"]);
        assert!(ix.apply_node(&node("n1", false)).is_empty());
        assert_eq!(sorted(ix.apply_node(&node("n1", true))), ["web"]);
        // Not an agent's Lease: nothing.
        let mut other = lease("n1", &[]);
        other.metadata.name = Some("kube-scheduler".into());
        assert!(ix.apply_lease(&other).is_empty());
    }
}
