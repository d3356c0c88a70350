//! The one placement worker (DESIGN §4 rule 9, §6): node views built from the cached Nodes, the
//! agents' Lease adverts (`crds::lease::AgentAdvert`) and the journal, plus ReplicaSet-style
//! expectations — an attempt created but not yet in the cache still occupies its node, so two
//! passes can never overfill one.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use runner_manager_crds::arch::Arch;
use runner_manager_crds::attempt::{RunnerAttempt, RunnerPackage};
use runner_manager_crds::lease::AgentAdvert;
use runner_manager_crds::names::agent_lease_name;
use runner_manager_crds::outcome::{Outcome, RejectReason};

use crate::controller::resolve::RunnerPackages;
use crate::policy::placement::{self, AgentLease, Expectations, NodeView, Resources, Unplaceable};

/// What placement knows of one node, owned (the views borrow from it).
#[derive(Clone, Debug)]
pub struct NodeFacts {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// From `kubernetes.io/arch`; `None`: an architecture GitHub publishes no runner for.
    pub arch: Option<Arch>,
    pub cordoned: bool,
    pub agent: Option<AgentLease>,
    pub advert: Option<AgentAdvert>,
    pub counted: BTreeSet<String>,
    /// The node's allocatable CPU and memory less what its agent says other workloads' pods
    /// request (`AgentAdvert::foreign_requests`) and what its counted attempts request (their
    /// placeholder or runner pod's requests); `None` when the Node publishes no allocatable.
    pub room: Option<Resources>,
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

/// How long a node that rejected an attempt is treated as full, whatever its advert says: the
/// agent is the authority on its capacity, and its advert may lag its own count.
pub const REJECTION_COOLDOWN: Duration = Duration::from_secs(30);

fn rejected_recently(a: &RunnerAttempt, now: Timestamp) -> bool {
    let Some(journal) = a.status.as_ref().map(|s| &s.journal) else {
        return false;
    };
    let rejected = matches!(
        journal.outcome(),
        Some(Outcome::Rejected(
            RejectReason::NodeFull | RejectReason::SnapshotUnusable
        ))
    );
    let at = journal.timestamps().concluded_at.as_ref().map(|t| t.0);
    rejected
        && at.is_some_and(|at| {
            now.as_millisecond().saturating_sub(at.as_millisecond())
                < i64::try_from(REJECTION_COOLDOWN.as_millis()).unwrap_or(i64::MAX)
        })
}

/// Every node with what counts against it. Pure over the cached objects.
pub fn node_facts(
    nodes: &[&Node],
    leases: &[&Lease],
    attempts: &[&RunnerAttempt],
    now: Timestamp,
    max_per_node: Option<u32>,
) -> Vec<NodeFacts> {
    let by_name: BTreeMap<&str, &Lease> = leases
        .iter()
        .filter_map(|l| Some((l.metadata.name.as_deref()?, *l)))
        .collect();
    let mut counted: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    let mut requested: BTreeMap<&str, Resources> = BTreeMap::new();
    let mut refused: BTreeSet<&str> = BTreeSet::new();
    for a in attempts {
        if rejected_recently(a, now) {
            refused.insert(a.spec.node_name.as_str());
        }
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
            let r = a.spec.snapshot.execution.resources.as_ref();
            let need = Resources::of(
                r.and_then(|r| r.cpu.as_ref()).map(|q| q.0.as_str()),
                r.and_then(|r| r.memory.as_ref()).map(|q| q.0.as_str()),
            );
            let sum = requested.entry(a.spec.node_name.as_str()).or_default();
            sum.cpu_millis = sum.cpu_millis.saturating_add(need.cpu_millis);
            sum.memory_bytes = sum.memory_bytes.saturating_add(need.memory_bytes);
        }
    }
    nodes
        .iter()
        .filter_map(|n| {
            let name = n.metadata.name.as_deref()?;
            let mut agent = by_name
                .get(agent_lease_name(name).as_str())
                .and_then(|l| agent_of(l));
            if refused.contains(name)
                && let Some((lease, _)) = agent.as_mut()
            {
                lease.free = Some(0);
            }
            // The admin's cap bounds what the agent advertises (a node's own claim is not
            // trusted past it): free units follow as capacity minus what counts against it.
            if let (Some(cap), Some((lease, _))) = (max_per_node, agent.as_mut()) {
                lease.capacity = lease.capacity.min(cap);
            }
            let advert = agent.as_ref().map(|(_, ad)| ad);
            let room = n
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .map(|a| {
                    Resources::of(
                        a.get("cpu").map(|q| q.0.as_str()),
                        a.get("memory").map(|q| q.0.as_str()),
                    )
                })
                .map(|allocatable| {
                    // Other workloads' pods, as the node's agent counts them (it watches its
                    // node's pods; the operator watches none): an older agent that does not
                    // publish them leaves the room as before.
                    let foreign: Vec<Resources> = advert
                        .and_then(|a| a.foreign_requests)
                        .map(|f| Resources {
                            cpu_millis: f.cpu_millis,
                            memory_bytes: f.memory_bytes,
                        })
                        .into_iter()
                        .collect();
                    placement::room(
                        allocatable,
                        &foreign,
                        requested.get(name).copied().unwrap_or_default(),
                    )
                });
            let labels = n.metadata.labels.clone().unwrap_or_default();
            Some(NodeFacts {
                name: name.to_owned(),
                arch: Arch::of_node(&labels),
                labels,
                cordoned: n
                    .spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false),
                agent: agent.as_ref().map(|(a, _)| a.clone()),
                advert: agent.map(|(_, ad)| ad),
                counted: counted.remove(name).unwrap_or_default(),
                room,
            })
        })
        .collect()
}

/// Attempt names the watch has shown (created, changed or deleted) since the last
/// [`PlacementWorker::observe`], written from the Controller's synchronous event mapper.
pub type Sightings = std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>;

/// The placement worker: expectations survive from pass to pass.
#[derive(Debug)]
pub struct PlacementWorker {
    pub expectations: Expectations,
    /// An attempt created and deleted between two create passes is never in the cache when
    /// the next pass looks; its expectation would hold its node's room (and an agent capacity
    /// unit) for the whole TTL. Its watch events end the expectation instead.
    sightings: Sightings,
}

impl PlacementWorker {
    pub fn new() -> Self {
        Self {
            expectations: Expectations::new(Duration::from_secs(120)),
            sightings: Sightings::default(),
        }
    }

    /// Where the attempt events record what they showed (drained by [`Self::observe`]).
    pub fn sightings(&self) -> Sightings {
        self.sightings.clone()
    }

    /// Forget expectations the cache shows or the watch showed since the last call (or that
    /// are too old to still be in flight), and return the cache's attempts as `snapshot` read
    /// them.
    ///
    /// The sightings are drained BEFORE `snapshot` is called: reconciles run as concurrent
    /// tasks, so the event mapper can record an attempt another pass just created between the
    /// two. The reflector stores an attempt before the mapper sees it, so every name drained
    /// first is in the snapshot taken after; drained after, a name could be in neither the
    /// snapshot nor the expectations and its node would be over-placed.
    pub fn observe<T: AsRef<RunnerAttempt>>(
        &mut self,
        snapshot: impl FnOnce() -> Vec<T>,
        now: Timestamp,
    ) -> Vec<T> {
        let seen = std::mem::take(&mut *self.sightings.lock().unwrap_or_else(|e| e.into_inner()));
        let cached = snapshot();
        for name in cached
            .iter()
            .filter_map(|a| a.as_ref().metadata.name.as_deref())
            .chain(seen.iter().map(String::as_str))
        {
            self.expectations.observed(name);
        }
        self.expectations.expire(now);
        cached
    }

    /// Choose a node for one attempt of a policy (`policy_uid`, its `packages`): the node and
    /// the package of its architecture.
    #[allow(clippy::too_many_arguments)]
    pub fn choose<'p>(
        &self,
        facts: &[NodeFacts],
        selector: &BTreeMap<String, String>,
        need: Resources,
        policy_uid: &str,
        packages: &'p RunnerPackages,
        now: Timestamp,
    ) -> Result<(String, &'p RunnerPackage), Unplaceable> {
        let package_of = move |f: &NodeFacts| f.arch.and_then(|a| packages.get(a));
        let views: Vec<NodeView<'_>> = facts
            .iter()
            .map(|f| {
                let package = package_of(f);
                NodeView {
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
                    has_package: package.is_some(),
                    package_cached: package.is_some_and(|p| {
                        f.advert
                            .as_ref()
                            .is_some_and(|a| a.packages.contains(&p.sha256))
                    }),
                    room: f.room,
                }
            })
            .collect();
        let node = placement::choose_fitting(&views, selector, need, &self.expectations, now)?;
        // Chosen only with a package (the filter above): a missing one is a broken filter.
        facts
            .iter()
            .find(|f| f.name == node)
            .and_then(package_of)
            .map(|p| (node.to_owned(), p))
            .ok_or(Unplaceable::NoPackageForArchitecture)
    }

    pub fn created(&mut self, name: &str, node: &str, now: Timestamp) {
        self.expectations.created(name, node, now);
    }

    /// A create that failed: its place is free again.
    pub fn forget(&mut self, name: &str) {
        self.expectations.observed(name);
    }
}

impl Default for PlacementWorker {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_the_watch_showed_and_the_cache_lost_holds_no_room() {
        let now = Timestamp::from_second(1_000).unwrap_or_else(|e| panic!("{e}"));
        let mut worker = PlacementWorker::new();
        worker.created("web-1", "n1", now);
        worker.created("web-2", "n1", now);
        // web-1 was created and deleted before the next create pass: the cache no longer has
        // it, but its events were seen.
        worker
            .sightings()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert("web-1".to_owned());
        worker.observe(Vec::<std::sync::Arc<RunnerAttempt>>::new, now);
        assert_eq!(worker.expectations.on("n1").collect::<Vec<_>>(), ["web-2"]);
        assert!(
            worker
                .sightings()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty(),
            "drained"
        );
    }

    #[test]
    fn a_sighting_recorded_after_the_snapshot_still_holds_its_room() {
        let now = Timestamp::from_second(1_000).unwrap_or_else(|e| panic!("{e}"));
        let mut worker = PlacementWorker::new();
        worker.created("web-1", "n1", now);
        let sightings = worker.sightings();
        // The snapshot is read before the reflector stores web-1; the mapper then records it.
        // Ending the expectation on that sighting would leave web-1 in neither the snapshot
        // nor the expectations.
        let cached = worker.observe(
            || {
                sightings
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert("web-1".to_owned());
                Vec::<std::sync::Arc<RunnerAttempt>>::new()
            },
            now,
        );
        assert!(cached.is_empty());
        assert_eq!(worker.expectations.on("n1").collect::<Vec<_>>(), ["web-1"]);
        // The next pass drains it (its snapshot, taken after, shows web-1).
        worker.observe(Vec::<std::sync::Arc<RunnerAttempt>>::new, now);
        assert_eq!(worker.expectations.on("n1").count(), 0);
    }
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use runner_manager_crds::attempt::{RunnerAttemptStatus, Transition};
    use runner_manager_crds::state::Actor;

    fn node(name: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"pool": "ci"}}, "spec": {}
        }))
        .unwrap()
    }

    /// The x64 package every test lease advertises as cached.
    fn packages() -> RunnerPackages {
        RunnerPackages::single(RunnerPackage {
            version: "2.330.0".into(),
            url: "u".into(),
            sha256: "ab".repeat(32),
            architecture: Some(Arch::X64),
        })
    }

    #[test]
    fn each_node_gets_the_package_of_its_architecture_and_a_node_without_one_none() {
        let now = Timestamp::from_second(10_000).unwrap();
        let labelled = |name: &str, arch: &str| {
            let mut n = node(name);
            n.metadata
                .labels
                .get_or_insert_default()
                .insert(runner_manager_crds::arch::ARCH_LABEL.into(), arch.into());
            n
        };
        let package = |arch: Arch, sha: &str| RunnerPackage {
            version: "2.330.0".into(),
            url: format!("https://x/actions-runner-linux-{arch}-2.330.0.tar.gz"),
            sha256: sha.repeat(32),
            architecture: Some(arch),
        };
        let both =
            RunnerPackages::of([package(Arch::X64, "ab"), package(Arch::Arm64, "cd")]).unwrap();
        // `a` is an s390x node (first by name, empty), `b` arm64, `c` amd64.
        let (a, b, c) = (
            labelled("a", "s390x"),
            labelled("b", "arm64"),
            labelled("c", "amd64"),
        );
        let leases = [
            lease("a", 8, 9_990),
            lease("b", 8, 9_990),
            lease("c", 8, 9_990),
        ];
        let facts = facts_of(&[&a, &b, &c], &leases, &[], now, None);
        let w = PlacementWorker::new();
        let sel = ci_pool();
        let none = Resources::default();
        // Every lease advertises the x64 package cached: `c` is preferred for it, and the
        // s390x node, first by name, is never chosen.
        let (chosen, p) = w.choose(&facts, &sel, none, "u", &both, now).unwrap();
        assert_eq!((chosen.as_str(), p.architecture), ("c", Some(Arch::X64)));
        let (chosen, p) = w.choose(&facts[..2], &sel, none, "u", &both, now).unwrap();
        assert_eq!((chosen.as_str(), p.architecture), ("b", Some(Arch::Arm64)));
        assert!(p.url.contains("linux-arm64"), "{}", p.url);
        // With only x64 published, the arm64 and s390x nodes get nothing, and say why.
        assert_eq!(
            chosen_by(&w, &facts[..2], &sel, none, now),
            Err(Unplaceable::NoPackageForArchitecture)
        );
        // A node without the label (only a hand-made Node object) is taken as amd64.
        let facts = node_facts(&[&node("d")], &[&lease("d", 8, 9_990)], &[], now, None);
        assert_eq!(facts[0].arch, Some(Arch::X64));
    }

    /// The room node `a` has left in the resource scenarios: 1 CPU and 6 GiB.
    const ONE_CPU_SIX_GIB: Resources = Resources {
        cpu_millis: 1000,
        memory_bytes: 6 << 30,
    };

    /// What the resource scenarios ask room for.
    const TWO_CPUS: Resources = Resources {
        cpu_millis: 2000,
        memory_bytes: 1 << 30,
    };

    /// The selector of the `pool: ci` nodes.
    fn ci_pool() -> BTreeMap<String, String> {
        BTreeMap::from([("pool".to_owned(), "ci".to_owned())])
    }

    /// Two CPUs go to node `b` of the ci pool: `a` (the first of `facts`) alone cannot hold
    /// them.
    fn assert_two_cpus_go_to_b(w: &PlacementWorker, facts: &[NodeFacts], now: Timestamp) {
        let sel = ci_pool();
        assert_eq!(chosen_by(w, facts, &sel, TWO_CPUS, now), Ok("b".to_owned()));
        assert_eq!(
            chosen_by(w, &facts[..1], &sel, TWO_CPUS, now),
            Err(Unplaceable::InsufficientResources)
        );
    }

    /// [`node_facts`] over the leases as the tests hold them.
    fn facts_of(
        nodes: &[&Node],
        leases: &[Lease],
        attempts: &[&RunnerAttempt],
        now: Timestamp,
        max_per_node: Option<u32>,
    ) -> Vec<NodeFacts> {
        node_facts(
            nodes,
            &leases.iter().collect::<Vec<_>>(),
            attempts,
            now,
            max_per_node,
        )
    }

    /// The node `w` chooses among `facts` for `need`, with the x64 package published.
    fn chosen_by(
        w: &PlacementWorker,
        facts: &[NodeFacts],
        sel: &BTreeMap<String, String>,
        need: Resources,
        now: Timestamp,
    ) -> Result<String, Unplaceable> {
        w.choose(facts, sel, need, "u", &packages(), now)
            .map(|(n, _)| n)
    }

    fn lease(node: &str, capacity: u32, renewed: i64) -> Lease {
        let advert = AgentAdvert {
            capacity,
            free: capacity,
            recovery_complete: true,
            packages: ["ab".repeat(32)].into(),
            ..AgentAdvert::default()
        };
        let mut l = Lease::default();
        l.metadata.name = Some(agent_lease_name(node));
        l.metadata.annotations = Some(advert.to_annotations());
        l.spec = Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
            lease_duration_seconds: Some(40),
            ..Default::default()
        });
        l
    }

    fn attempt(name: &str, node: &str) -> RunnerAttempt {
        runner_manager_crds::fixtures::AttemptBuilder::new(name, "web")
            .node(node)
            .build()
    }

    #[test]
    fn a_nodes_room_is_its_allocatable_less_its_counted_attempts_requests_and_placement_honours_it()
    {
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let now = Timestamp::from_second(10_000).unwrap();
        let mut a = node("a");
        a.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            allocatable: Some(BTreeMap::from([
                ("cpu".to_owned(), Quantity("4".into())),
                ("memory".to_owned(), Quantity("8Gi".into())),
            ])),
            ..Default::default()
        });
        let b = node("b");
        let leases = [lease("a", 8, 9_990), lease("b", 8, 9_990)];
        let mut big = attempt("p1", "a");
        big.spec.snapshot.execution.resources =
            Some(runner_manager_crds::policy::RunnerResources {
                cpu: Some(Quantity("3".into())),
                memory: Some(Quantity("2Gi".into())),
            });
        let facts = facts_of(&[&a, &b], &leases, &[&big], now, None);
        assert_eq!(facts[0].room, Some(ONE_CPU_SIX_GIB));
        assert_eq!(facts[1].room, None, "no allocatable published: unknown");
        let w = PlacementWorker::new();
        // By name `a` would win; its room cannot hold two CPUs, `b`'s is unknown.
        assert_two_cpus_go_to_b(&w, &facts, now);
    }

    #[test]
    fn other_workloads_pods_the_agent_advertises_take_their_share_of_the_room() {
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        use runner_manager_crds::lease::ForeignRequests;
        let now = Timestamp::from_second(10_000).unwrap();
        let with_allocatable = |name: &str| {
            let mut n = node(name);
            n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
                allocatable: Some(BTreeMap::from([
                    ("cpu".to_owned(), Quantity("4".into())),
                    ("memory".to_owned(), Quantity("8Gi".into())),
                ])),
                ..Default::default()
            });
            n
        };
        let (a, b) = (with_allocatable("a"), with_allocatable("b"));
        let mut ours = attempt("p1", "a");
        ours.spec.snapshot.execution.resources =
            Some(runner_manager_crds::policy::RunnerResources {
                cpu: Some(Quantity("1500m".into())),
                memory: Some(Quantity("1Gi".into())),
            });
        let advertising = |node: &str, foreign: Option<ForeignRequests>| {
            let mut l = lease(node, 8, 9_990);
            let mut advert =
                AgentAdvert::from_annotations(l.metadata.annotations.as_ref().unwrap()).unwrap();
            advert.foreign_requests = foreign;
            l.metadata.annotations = Some(advert.to_annotations());
            l
        };
        let busy = Some(ForeignRequests {
            cpu_millis: 1500,
            memory_bytes: 1 << 30,
        });
        let w = PlacementWorker::new();
        let sel = ci_pool();
        // a: 4 CPUs less 1.5 of another workload less our 1.5 = 1: cannot hold 2; b can.
        let leases = [advertising("a", busy), advertising("b", None)];
        let facts = facts_of(&[&a, &b], &leases, &[&ours], now, None);
        assert_eq!(facts[0].room, Some(ONE_CPU_SIX_GIB));
        assert_two_cpus_go_to_b(&w, &facts, now);
        // An older agent publishes no foreign requests: the room is as before (2.5 CPUs) and
        // `a` holds two CPUs again.
        let leases = [advertising("a", None), advertising("b", None)];
        let facts = facts_of(&[&a, &b], &leases, &[&ours], now, None);
        assert_eq!(facts[0].room.map(|r| r.cpu_millis), Some(2500));
        assert_eq!(
            chosen_by(&w, &facts[..1], &sel, TWO_CPUS, now),
            Ok("a".to_owned())
        );
    }

    #[test]
    fn facts_count_the_journal_and_a_recent_rejection_fills_the_node() {
        let now = Timestamp::from_second(10_000).unwrap();
        let (a, b) = (node("a"), node("b"));
        let leases = [lease("a", 2, 9_990), lease("b", 2, 9_990)];
        let pending = attempt("p1", "a");
        let mut rejected = attempt("r1", "b");
        let j = RunnerAttemptStatus::default()
            .journal
            .apply(
                Actor::Agent,
                rejected.spec.snapshot.kind(),
                Transition::Conclude(Outcome::Rejected(RejectReason::NodeFull)),
                Timestamp::from_second(9_995).unwrap(),
            )
            .unwrap();
        rejected.status = Some(RunnerAttemptStatus {
            journal: j,
            ..RunnerAttemptStatus::default()
        });
        let facts = facts_of(&[&a, &b], &leases, &[&pending, &rejected], now, None);
        assert_eq!(facts[0].counted, BTreeSet::from(["p1".to_owned()]));
        assert!(
            facts[1].counted.is_empty(),
            "a rejected attempt holds nothing"
        );
        assert_eq!(
            facts[1].agent.as_ref().unwrap().free,
            Some(0),
            "cooling down"
        );
        let w = PlacementWorker::new();
        let sel = ci_pool();
        assert_eq!(
            chosen_by(&w, &facts, &sel, Resources::default(), now),
            Ok("a".into())
        );
        let later = Timestamp::from_second(10_040).unwrap();
        let leases = [lease("a", 2, 10_030), lease("b", 2, 10_030)];
        let facts = facts_of(&[&a, &b], &leases, &[&pending, &rejected], later, None);
        assert_eq!(
            facts[1].agent.as_ref().unwrap().free,
            Some(2),
            "cooled down"
        );
        assert_eq!(
            chosen_by(&w, &facts, &sel, Resources::default(), later),
            Ok("b".into()),
            "spread: b holds nothing"
        );
    }

    #[test]
    fn the_admin_cap_bounds_what_an_agent_advertises() {
        let now = Timestamp::from_second(10_000).unwrap();
        let a = node("a");
        // The agent claims 50; the admin allows 2 per node; one attempt is already there.
        let leases = [lease("a", 50, 9_990)];
        let pending = attempt("p1", "a");
        let facts = facts_of(&[&a], &leases, &[&pending], now, Some(2));
        assert_eq!(facts[0].agent.as_ref().unwrap().capacity, 2);
        let mut w = PlacementWorker::new();
        let sel = ci_pool();
        assert_eq!(
            chosen_by(&w, &facts, &sel, Resources::default(), now),
            Ok("a".into())
        );
        w.created("p2", "a", now);
        assert!(
            chosen_by(&w, &facts, &sel, Resources::default(), now).is_err(),
            "2 of 2 used: full, whatever the advert says"
        );
        // A cap above the advert changes nothing.
        let facts = facts_of(&[&a], &leases, &[&pending], now, Some(100));
        assert_eq!(facts[0].agent.as_ref().unwrap().capacity, 50);
    }
}
