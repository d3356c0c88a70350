//! Placement (DESIGN §6, §4 rules 8–9): which node a new attempt goes to.
//!
//! Filter: the node matches the policy's `nodeSelector`, GitHub publishes a runner package for
//! its architecture (issue 31 item 5), is not cordoned, its agent's Lease is
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
//!
//! Resources (issue 16): a node whose unrequested resources — its allocatable minus the requests
//! of the pods on it, placeholders of native runners included — cannot hold the policy's
//! `execution.resources` is not chosen, since the scheduler would refuse that runner's pod (and
//! the kubelet its placeholder). Attempts bound to the node that have no pod counted yet (created
//! but not yet launched, or expected but not yet seen) take their share from the room first, so
//! a burst cannot overfill a node between two observations. A node whose room is unknown is not
//! filtered on resources.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;

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
    /// GitHub publishes a runner package for the node's architecture (`kubernetes.io/arch`).
    pub has_package: bool,
    /// The runner package for the node's architecture (by sha256) is in the agent's cache.
    pub package_cached: bool,
    /// What the node can still give: allocatable minus the requests of its pods, minus what its
    /// attempts without a pod yet will request. `None`: unknown (not filtered).
    pub room: Option<Resources>,
}

/// CPU (millicores) and memory (bytes): a request or a room.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

impl Resources {
    /// From optional Kubernetes quantities (`1500m`, `2Gi`: a `Quantity`'s text); an
    /// unparseable or absent one counts 0 (validation refuses unparseable ones before a policy
    /// is served).
    pub fn of(cpu: Option<&str>, memory: Option<&str>) -> Self {
        Self {
            cpu_millis: cpu.and_then(crate::quantity::cpu_millis).unwrap_or(0),
            memory_bytes: memory.and_then(crate::quantity::memory_bytes).unwrap_or(0),
        }
    }

    /// `self` less `other`, never below zero.
    pub fn less(self, other: Self) -> Self {
        Self {
            cpu_millis: self.cpu_millis.saturating_sub(other.cpu_millis),
            memory_bytes: self.memory_bytes.saturating_sub(other.memory_bytes),
        }
    }

    /// `n` times `self`.
    pub fn times(self, n: u64) -> Self {
        Self {
            cpu_millis: self.cpu_millis.saturating_mul(n),
            memory_bytes: self.memory_bytes.saturating_mul(n),
        }
    }

    /// Whether `need` fits in `self`.
    pub fn holds(self, need: Self) -> bool {
        need.cpu_millis <= self.cpu_millis && need.memory_bytes <= self.memory_bytes
    }
}

/// The room of a node: `allocatable` minus the requests of the pods bound to it that have not
/// ended (`pod_requests`), minus `pending` (attempts bound to the node whose pod is not among
/// them yet). Pure.
pub fn room(allocatable: Resources, pod_requests: &[Resources], pending: Resources) -> Resources {
    pod_requests
        .iter()
        .fold(allocatable, |left, r| left.less(*r))
        .less(pending)
}

/// Why no node fits: closed, for the `Scaling` condition and the placement-failure metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Unplaceable {
    /// No node carries the policy's `nodeSelector` labels.
    NoneMatchingSelector,
    /// The matching nodes are of architectures GitHub publishes no runner package for (of the
    /// pinned version).
    NoPackageForArchitecture,
    /// Every matching node is cordoned.
    AllCordoned,
    /// No matching node has an agent with a fresh Lease.
    NoAgent,
    /// The matching nodes' agents are still recovering after a restart.
    RecoveryIncomplete,
    /// Every eligible node is full.
    AllFull,
    /// Every node with capacity lacks the CPU or memory the policy's runner requests.
    InsufficientResources,
}

impl Unplaceable {
    /// Every reason: the placement-failure metric exposes each from the start.
    pub const ALL: [Self; 7] = [
        Self::NoneMatchingSelector,
        Self::NoPackageForArchitecture,
        Self::AllCordoned,
        Self::NoAgent,
        Self::RecoveryIncomplete,
        Self::AllFull,
        Self::InsufficientResources,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoneMatchingSelector => "none_matching_selector",
            Self::NoPackageForArchitecture => "no_package_for_architecture",
            Self::AllCordoned => "all_cordoned",
            Self::NoAgent => "no_agent",
            Self::RecoveryIncomplete => "recovery_incomplete",
            Self::AllFull => "all_full",
            Self::InsufficientResources => "insufficient_resources",
        }
    }

    /// The `Scaling` condition's message: what blocks, and what a person can do.
    pub fn message(self) -> &'static str {
        match self {
            Self::NoneMatchingSelector => {
                "no node carries the labels of spec.nodeSelector; label nodes or change the selector"
            }
            Self::NoPackageForArchitecture => {
                "no node matching spec.nodeSelector is of an architecture (kubernetes.io/arch) that GitHub publishes a runner package of the pinned version for and that spec.labels allow (a label x64, arm64 or arm restricts runners to it); select nodes of such an architecture"
            }
            Self::AllCordoned => "every node matching spec.nodeSelector is cordoned",
            Self::NoAgent => {
                "no node matching spec.nodeSelector has a live runner-manager agent; check the agent DaemonSet"
            }
            Self::RecoveryIncomplete => {
                "the agents of the matching nodes are still recovering after a restart; placement resumes when they finish"
            }
            Self::AllFull => "every eligible node is at capacity; runners start as others finish",
            Self::InsufficientResources => {
                "no eligible node has the CPU or memory spec.execution.resources requests beside its pods; runners start as others finish"
            }
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
    need: Resources,
    expected: &Expectations,
    now: Timestamp,
) -> Verdict {
    if !selector_matches(selector, node.labels) {
        return Verdict::Unfit(Unplaceable::NoneMatchingSelector);
    }
    // Before everything the node could fix by itself: no wait makes a package appear for its
    // architecture.
    if !node.has_package {
        return Verdict::Unfit(Unplaceable::NoPackageForArchitecture);
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
    // Expected attempts not yet in the cache will request as much as this one (they are of a
    // policy placed in this pass or the last).
    if let Some(room) = node.room
        && !room
            .less(need.times(u64::try_from(unseen).unwrap_or(u64::MAX)))
            .holds(need)
    {
        return Verdict::Unfit(Unplaceable::InsufficientResources);
    }
    Verdict::Fits { used }
}

/// The node for one new attempt of a policy with `selector`, or why there is none.
pub fn choose<'a>(
    nodes: &[NodeView<'a>],
    selector: &BTreeMap<String, String>,
    expected: &Expectations,
    now: Timestamp,
) -> Result<&'a str, Unplaceable> {
    choose_fitting(nodes, selector, Resources::default(), expected, now)
}

/// [`choose`] for a runner that requests `need`: a node whose room cannot hold it is not chosen.
pub fn choose_fitting<'n, 'a>(
    nodes: &'n [NodeView<'a>],
    selector: &BTreeMap<String, String>,
    need: Resources,
    expected: &Expectations,
    now: Timestamp,
) -> Result<&'a str, Unplaceable> {
    let mut worst = Unplaceable::NoneMatchingSelector;
    let mut best: Option<(&NodeView<'a>, u32)> = None;
    for node in nodes {
        match judge(node, selector, need, expected, now) {
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
            has_package: true,
            package_cached: false,
            room: None,
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
    fn a_node_whose_architecture_has_no_package_is_never_chosen() {
        let ci = pool();
        // The warmest, emptiest node, of an architecture GitHub publishes no runner for.
        let mut s390x = node("a", &ci, 8);
        s390x.has_package = false;
        s390x.package_cached = true;
        s390x.free_cleaned_slots = 3;
        let mut busy = node("b", &ci, 4);
        busy.counted = ["x1", "x2", "x3"].into();
        assert_eq!(choose(&[s390x, busy], &pool(), &none(), now()), Ok("b"));
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
        let mut foreign_arch = node("s", &ci, 4);
        foreign_arch.has_package = false;
        assert_eq!(
            choose(&[wrong.clone(), foreign_arch.clone()], &sel, &none(), now()),
            Err(Unplaceable::NoPackageForArchitecture)
        );
        let mut cordoned = node("c", &ci, 4);
        cordoned.cordoned = true;
        assert_eq!(
            choose(&[foreign_arch, cordoned.clone()], &sel, &none(), now()),
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
            Unplaceable::NoPackageForArchitecture,
            Unplaceable::AllCordoned,
            Unplaceable::NoAgent,
            Unplaceable::RecoveryIncomplete,
            Unplaceable::AllFull,
            Unplaceable::InsufficientResources,
        ] {
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

    fn res(cpu_millis: u64, memory_gib: u64) -> Resources {
        Resources {
            cpu_millis,
            memory_bytes: memory_gib << 30,
        }
    }

    #[test]
    fn the_room_is_allocatable_less_the_pods_requests_and_the_attempts_without_a_pod() {
        let allocatable = res(4000, 8);
        // A placeholder of 1.5 CPU / 2 GiB and an ordinary pod of 0.5 / 1; one attempt not yet
        // launched (no placeholder) that will request 1 / 1.
        let r = room(allocatable, &[res(1500, 2), res(500, 1)], res(1000, 1));
        assert_eq!(r, res(1000, 4));
        // Never below zero.
        assert_eq!(room(res(1000, 1), &[res(4000, 8)], res(0, 0)), res(0, 0));
        let parsed = Resources::of(Some("1500m"), Some("2Gi"));
        assert_eq!(parsed, res(1500, 2));
        assert_eq!(Resources::of(None, None), Resources::default());
    }

    #[test]
    fn a_node_whose_room_cannot_hold_the_runner_is_not_chosen() {
        let ci = pool();
        let sel = pool();
        let need = res(2000, 4);
        let mut tight = node("a-tight", &ci, 4);
        tight.room = Some(res(1500, 16));
        let mut low_memory = node("b-low-memory", &ci, 4);
        low_memory.room = Some(res(8000, 3));
        let mut roomy = node("c-roomy", &ci, 4);
        roomy.room = Some(res(2000, 4));
        let unknown = node("d-unknown", &ci, 4);
        // By name a-tight would win; it and b cannot hold the runner.
        let nodes = [tight.clone(), low_memory.clone(), roomy.clone()];
        assert_eq!(
            choose_fitting(&nodes, &sel, need, &none(), now()),
            Ok("c-roomy")
        );
        assert_eq!(
            choose_fitting(&nodes[..2], &sel, need, &none(), now()),
            Err(Unplaceable::InsufficientResources)
        );
        // A node whose room is unknown is not filtered; a runner that requests nothing fits.
        assert_eq!(
            choose_fitting(&[tight.clone(), unknown], &sel, need, &none(), now()),
            Ok("d-unknown")
        );
        assert_eq!(
            choose_fitting(&[tight.clone()], &sel, Resources::default(), &none(), now()),
            Ok("a-tight")
        );
        // Full by count is reported before resources (the furthest filter reached wins).
        let mut full = node("e-full", &ci, 0);
        full.room = Some(res(0, 0));
        assert_eq!(
            choose_fitting(&[full, tight], &sel, need, &none(), now()),
            Err(Unplaceable::InsufficientResources)
        );
    }

    #[test]
    fn expected_attempts_take_their_share_of_the_room() {
        let ci = pool();
        let sel = pool();
        let need = res(1000, 1);
        let mut exp = none();
        let mut a = node("a", &ci, 8);
        a.room = Some(res(2000, 8));
        assert_eq!(
            choose_fitting(&[a.clone()], &sel, need, &exp, now()),
            Ok("a")
        );
        exp.created("web-1", "a", now());
        assert_eq!(
            choose_fitting(&[a.clone()], &sel, need, &exp, now()),
            Ok("a")
        );
        exp.created("web-2", "a", now());
        // Two created, neither seen yet: their 2 CPUs fill the room.
        assert_eq!(
            choose_fitting(&[a.clone()], &sel, need, &exp, now()),
            Err(Unplaceable::InsufficientResources)
        );
        // Seen in the cache, the room (computed with them pending) is what counts.
        a.counted = ["web-1", "web-2"].into();
        a.room = Some(res(0, 6));
        assert_eq!(
            choose_fitting(&[a], &sel, need, &exp, now()),
            Err(Unplaceable::InsufficientResources)
        );
    }
}
