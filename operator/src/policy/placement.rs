//! Placement (DESIGN §6, §4 rules 8–9): which node a new attempt goes to.
//!
//! Filter: the node matches the policy's `nodeSelector`, is not cordoned, its agent's Lease is
//! fresh, the agent has finished recovery, and it has free capacity. Prefer a node with a free
//! cleaned slot of this policy (its `_work` is warm), then one with the package cached, then the
//! one with the fewest attempts (spread); ties by name.
//!
//! Capacity is counted conservatively from three sources, and the tightest wins: the capacity
//! the agent publishes minus every attempt bound to the node whose state counts against capacity,
//! minus the attempts this operator created but its cache has not shown yet (ReplicaSet-style
//! expectations, so two passes in quick succession cannot both take the last unit); and the free
//! capacity the agent itself published. The agent is the final authority: it rejects what would
//! overfill its node.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use runner_manager_crds::policy::PolicyReason;

/// What the agent publishes on its Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentLease {
    /// `spec.renewTime`.
    pub renewed_at: Option<Timestamp>,
    /// `spec.leaseDurationSeconds`.
    pub duration: Duration,
    pub recovery_complete: bool,
    /// Runners the node may hold at once.
    pub capacity: u32,
    /// Free units by the agent's own count, when published.
    pub free: Option<u32>,
}

impl AgentLease {
    /// Renewed within its duration. A renew time in the future (clock skew) counts as fresh.
    pub fn is_fresh(&self, now: Timestamp) -> bool {
        let Some(renewed) = self.renewed_at else {
            return false;
        };
        let age = now
            .as_millisecond()
            .saturating_sub(renewed.as_millisecond());
        age <= i64::try_from(self.duration.as_millis()).unwrap_or(i64::MAX)
    }
}

/// One candidate node.
#[derive(Clone, Debug)]
pub struct NodeView<'a> {
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    /// `spec.unschedulable`.
    pub cordoned: bool,
    /// `None`: no agent Lease for this node.
    pub agent: Option<AgentLease>,
    /// Names of the attempts bound to this node (from the cache) whose state counts against
    /// capacity (`AttemptState::counts_against_capacity`).
    pub counted: BTreeSet<&'a str>,
    /// Cleaned persistent slots of this policy on the node that nothing leases.
    pub free_cleaned_slots: u32,
    /// The policy's runner package (by sha256) is in the agent's cache.
    pub package_cached: bool,
}

/// Why no node fits: closed, for the `Scaling` condition and the placement-failure metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Unplaceable {
    /// No node carries the policy's `nodeSelector` labels.
    NoneMatchingSelector,
    /// Every matching node is cordoned.
    AllCordoned,
    /// No matching node has an agent with a fresh Lease.
    NoAgent,
    /// The matching nodes' agents are still recovering after a restart.
    RecoveryIncomplete,
    /// Every eligible node is full.
    AllFull,
}

impl Unplaceable {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoneMatchingSelector => "none_matching_selector",
            Self::AllCordoned => "all_cordoned",
            Self::NoAgent => "no_agent",
            Self::RecoveryIncomplete => "recovery_incomplete",
            Self::AllFull => "all_full",
        }
    }

    /// The `Scaling` condition's reason.
    pub fn reason(self) -> PolicyReason {
        PolicyReason::NoEligibleNode
    }

    /// The `Scaling` condition's message: what blocks, and what a person can do.
    pub fn message(self) -> &'static str {
        match self {
            Self::NoneMatchingSelector => {
                "no node carries the labels of spec.nodeSelector; label nodes or change the selector"
            }
            Self::AllCordoned => "every node matching spec.nodeSelector is cordoned",
            Self::NoAgent => {
                "no node matching spec.nodeSelector has a live runner-manager agent; check the agent DaemonSet"
            }
            Self::RecoveryIncomplete => {
                "the agents of the matching nodes are still recovering after a restart; placement resumes when they finish"
            }
            Self::AllFull => "every eligible node is at capacity; runners start as others finish",
        }
    }
}

/// Attempts created but not yet seen in the cache, per node (ReplicaSet-style expectations).
/// An expectation is forgotten when the cache shows the attempt, or after `ttl` (a lost watch
/// event must not block a node for ever).
#[derive(Clone, Debug)]
pub struct Expectations {
    ttl: Duration,
    pending: BTreeMap<String, (String, Timestamp)>,
}

impl Expectations {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            pending: BTreeMap::new(),
        }
    }

    /// The attempt `name` was created on `node`.
    pub fn created(&mut self, name: &str, node: &str, now: Timestamp) {
        self.pending.insert(name.to_owned(), (node.to_owned(), now));
    }

    /// The cache shows `name` (or its creation failed): stop expecting it.
    pub fn observed(&mut self, name: &str) {
        self.pending.remove(name);
    }

    /// Drop expectations older than the TTL.
    pub fn expire(&mut self, now: Timestamp) {
        let ttl = i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX);
        self.pending
            .retain(|_, (_, at)| now.as_millisecond().saturating_sub(at.as_millisecond()) < ttl);
    }

    /// Names expected on `node`.
    pub fn on(&self, node: &str) -> impl Iterator<Item = &str> {
        self.pending
            .iter()
            .filter(move |(_, (n, _))| n == node)
            .map(|(name, _)| name.as_str())
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

fn selector_matches(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// How far a node got through the filters: the furthest any node got is the reason reported
/// when none fits (the most actionable one: nodes that do not match the selector say nothing
/// about why the matching ones are unusable).
enum Verdict {
    Unfit(Unplaceable),
    Fits { used: u32 },
}

fn judge(
    node: &NodeView<'_>,
    selector: &BTreeMap<String, String>,
    expected: &Expectations,
    now: Timestamp,
) -> Verdict {
    if !selector_matches(selector, node.labels) {
        return Verdict::Unfit(Unplaceable::NoneMatchingSelector);
    }
    if node.cordoned {
        return Verdict::Unfit(Unplaceable::AllCordoned);
    }
    let Some(agent) = node.agent.as_ref().filter(|a| a.is_fresh(now)) else {
        return Verdict::Unfit(Unplaceable::NoAgent);
    };
    if !agent.recovery_complete {
        return Verdict::Unfit(Unplaceable::RecoveryIncomplete);
    }
    // An expected attempt the cache already shows is counted once.
    let unseen = expected
        .on(node.name)
        .filter(|n| !node.counted.contains(n))
        .count();
    let used = u32::try_from(node.counted.len() + unseen).unwrap_or(u32::MAX);
    let mut free = agent.capacity.saturating_sub(used);
    if let Some(published) = agent.free {
        free = free.min(published);
    }
    if free == 0 {
        return Verdict::Unfit(Unplaceable::AllFull);
    }
    Verdict::Fits { used }
}

/// The node for one new attempt of a policy with `selector`, or why there is none.
pub fn choose<'n, 'a>(
    nodes: &'n [NodeView<'a>],
    selector: &BTreeMap<String, String>,
    expected: &Expectations,
    now: Timestamp,
) -> Result<&'a str, Unplaceable> {
    let mut worst = Unplaceable::NoneMatchingSelector;
    let mut best: Option<(&NodeView<'a>, u32)> = None;
    for node in nodes {
        match judge(node, selector, expected, now) {
            Verdict::Unfit(why) => worst = worst.max(why),
            Verdict::Fits { used, .. } => {
                let better = match best {
                    None => true,
                    Some((b, b_used)) => rank(node, used) < rank(b, b_used),
                };
                if better {
                    best = Some((node, used));
                }
            }
        }
    }
    best.map(|(n, _)| n.name).ok_or(worst)
}

/// Lower is better: warm slot, then cached package, then fewest attempts, then name.
fn rank<'x>(node: &'x NodeView<'_>, used: u32) -> (bool, bool, u32, &'x str) {
    (
        node.free_cleaned_slots == 0,
        !node.package_cached,
        used,
        node.name,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000_000;

    fn now() -> Timestamp {
        Timestamp::from_second(NOW).unwrap()
    }

    fn lease(capacity: u32) -> AgentLease {
        AgentLease {
            renewed_at: Some(Timestamp::from_second(NOW - 5).unwrap()),
            duration: Duration::from_secs(40),
            recovery_complete: true,
            capacity,
            free: None,
        }
    }

    fn pool() -> BTreeMap<String, String> {
        [("pool".to_owned(), "ci".to_owned())].into()
    }

    fn node<'a>(
        name: &'a str,
        labels: &'a BTreeMap<String, String>,
        capacity: u32,
    ) -> NodeView<'a> {
        NodeView {
            name,
            labels,
            cordoned: false,
            agent: Some(lease(capacity)),
            counted: BTreeSet::new(),
            free_cleaned_slots: 0,
            package_cached: false,
        }
    }

    fn none() -> Expectations {
        Expectations::new(Duration::from_secs(300))
    }

    #[test]
    fn lease_freshness() {
        let mut l = lease(1);
        assert!(l.is_fresh(now()));
        l.renewed_at = Some(Timestamp::from_second(NOW - 41).unwrap());
        assert!(!l.is_fresh(now()));
        l.renewed_at = Some(Timestamp::from_second(NOW + 3).unwrap());
        assert!(l.is_fresh(now()), "clock skew ahead is fresh");
        l.renewed_at = None;
        assert!(!l.is_fresh(now()));
    }

    #[test]
    fn preference_order_slot_then_package_then_spread_then_name() {
        let ci = pool();
        let mut a = node("a", &ci, 4);
        let mut b = node("b", &ci, 4);
        let mut c = node("c", &ci, 4);
        let d = node("d", &ci, 4);
        a.counted = ["x1", "x2"].into();
        b.counted = ["y1"].into();
        c.counted = ["z1", "z2", "z3"].into();
        let sel = pool();
        // Spread: d has none.
        let nodes = [a.clone(), b.clone(), c.clone(), d.clone()];
        assert_eq!(choose(&nodes, &sel, &none(), now()), Ok("d"));
        // Package cached beats spread.
        b.package_cached = true;
        let nodes = [a.clone(), b.clone(), c.clone(), d.clone()];
        assert_eq!(choose(&nodes, &sel, &none(), now()), Ok("b"));
        // A free cleaned slot beats both.
        c.free_cleaned_slots = 1;
        let nodes = [a.clone(), b.clone(), c.clone(), d.clone()];
        assert_eq!(choose(&nodes, &sel, &none(), now()), Ok("c"));
        // Ties by name.
        let e = node("e", &ci, 4);
        let nodes = [e, d.clone(), node("dd", &ci, 4)];
        assert_eq!(choose(&nodes, &sel, &none(), now()), Ok("d"));
    }

    #[test]
    fn filters() {
        let ci = pool();
        let other: BTreeMap<String, String> = [("pool".to_owned(), "gpu".to_owned())].into();
        let sel = pool();
        let mut stale = node("stale", &ci, 4);
        stale.agent = Some(AgentLease {
            renewed_at: Some(Timestamp::from_second(NOW - 120).unwrap()),
            ..lease(4)
        });
        let mut recovering = node("recovering", &ci, 4);
        recovering.agent = Some(AgentLease {
            recovery_complete: false,
            ..lease(4)
        });
        let mut cordoned = node("cordoned", &ci, 4);
        cordoned.cordoned = true;
        let mut full = node("full", &ci, 1);
        full.counted = ["f1"].into();
        let mut agent_says_full = node("agent-full", &ci, 4);
        agent_says_full.agent = Some(AgentLease {
            free: Some(0),
            ..lease(4)
        });
        let mut no_agent = node("no-agent", &ci, 4);
        no_agent.agent = None;
        let wrong = node("wrong-pool", &other, 4);
        let good = node("zz-good", &ci, 4);
        let nodes = [
            stale,
            recovering,
            cordoned,
            full,
            agent_says_full,
            no_agent,
            wrong,
            good,
        ];
        assert_eq!(choose(&nodes, &sel, &none(), now()), Ok("zz-good"));
        assert_eq!(
            choose(&nodes[..7], &sel, &none(), now()),
            Err(Unplaceable::AllFull)
        );
    }

    #[test]
    fn reasons_when_nothing_fits() {
        let ci = pool();
        let other: BTreeMap<String, String> = BTreeMap::new();
        let sel = pool();
        assert_eq!(
            choose(&[], &sel, &none(), now()),
            Err(Unplaceable::NoneMatchingSelector)
        );
        let wrong = node("w", &other, 4);
        assert_eq!(
            choose(std::slice::from_ref(&wrong), &sel, &none(), now()),
            Err(Unplaceable::NoneMatchingSelector)
        );
        let mut cordoned = node("c", &ci, 4);
        cordoned.cordoned = true;
        assert_eq!(
            choose(&[wrong.clone(), cordoned.clone()], &sel, &none(), now()),
            Err(Unplaceable::AllCordoned)
        );
        let mut no_agent = node("n", &ci, 4);
        no_agent.agent = None;
        assert_eq!(
            choose(&[cordoned.clone(), no_agent.clone()], &sel, &none(), now()),
            Err(Unplaceable::NoAgent)
        );
        let mut recovering = node("r", &ci, 4);
        recovering.agent = Some(AgentLease {
            recovery_complete: false,
            ..lease(4)
        });
        assert_eq!(
            choose(&[no_agent, recovering.clone()], &sel, &none(), now()),
            Err(Unplaceable::RecoveryIncomplete)
        );
        let full = node("f", &ci, 0);
        assert_eq!(
            choose(&[recovering, full], &sel, &none(), now()),
            Err(Unplaceable::AllFull)
        );
        for why in [
            Unplaceable::NoneMatchingSelector,
            Unplaceable::AllCordoned,
            Unplaceable::NoAgent,
            Unplaceable::RecoveryIncomplete,
            Unplaceable::AllFull,
        ] {
            assert_eq!(why.reason(), PolicyReason::NoEligibleNode);
            assert!(!why.message().is_empty() && !why.as_str().is_empty());
        }
    }

    #[test]
    fn expectations_count_as_placed_until_seen() {
        let ci = pool();
        let sel = pool();
        let mut exp = Expectations::new(Duration::from_secs(300));
        let mut a = node("a", &ci, 2);
        let b = node("b", &ci, 1);
        // Spread: a and b both empty → a by name; record the creation.
        let placed = choose(&[a.clone(), b.clone()], &sel, &exp, now()).unwrap();
        assert_eq!(placed, "a");
        exp.created("web-1", "a", now());
        // Not yet in the cache: a holds one, so b (none) is preferred.
        assert_eq!(choose(&[a.clone(), b.clone()], &sel, &exp, now()), Ok("b"));
        exp.created("web-2", "b", now());
        // b is full by expectation; a has one left.
        assert_eq!(choose(&[a.clone(), b.clone()], &sel, &exp, now()), Ok("a"));
        exp.created("web-3", "a", now());
        assert_eq!(
            choose(&[a.clone(), b.clone()], &sel, &exp, now()),
            Err(Unplaceable::AllFull)
        );
        // The cache now shows web-1 on a: counted once, not twice.
        a.counted = ["web-1"].into();
        assert_eq!(
            choose(&[a.clone(), b.clone()], &sel, &exp, now()),
            Err(Unplaceable::AllFull)
        );
        exp.observed("web-1");
        exp.observed("web-3");
        assert_eq!(choose(&[a.clone(), b.clone()], &sel, &exp, now()), Ok("a"));
        // Expectations expire so a lost watch event cannot block a node for ever.
        exp.expire(Timestamp::from_second(NOW + 301).unwrap());
        assert!(exp.is_empty());
    }
}
