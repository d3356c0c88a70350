//! Every decision a policy's reconcile makes, without a cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use runner_manager_crds::POLICY_GENERATION_ANNOTATION;
use runner_manager_crds::attempt::{RunnerPackage, TargetScope, TerminationReason};
use runner_manager_crds::fixtures::AttemptBuilder;
use runner_manager_crds::outcome::{FailureReason, OrphanReason, RejectReason};
use runner_manager_crds::policy::PolicyReason;
use runner_manager_crds::state::AttemptState;
use serde_json::json;

use super::*;
use crate::controller::resolve::RunnerPackages;
use crate::policy::placement::AgentLease;

const NOW: i64 = 100_000;

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(s).unwrap()
}

fn limits() -> Limits {
    Limits {
        admission_timeout: Duration::from_secs(60),
        node_lost_grace: Duration::from_secs(600),
        max_consecutive_failures: 3,
        replacement_backoff: Duration::from_secs(10),
        replacement_backoff_max: Duration::from_secs(300),
    }
}

/// A policy of generation 2 holding our finalizer; `spec` is merged over the defaults.
fn policy(spec: Value) -> ScalePolicy {
    let mut base = json!({"github": {"url": "https://github.com/acme/web",
                                     "credentialsSecretRef": {"name": "gh"}},
                          "labels": ["self-hosted", "linux"], "maxRunners": 10});
    if let (Some(b), Some(s)) = (base.as_object_mut(), spec.as_object()) {
        for (k, v) in s {
            b.insert(k.clone(), v.clone());
        }
    }
    let mut p: ScalePolicy = serde_json::from_value(json!({
        "apiVersion": "runner-manager.dev/v1alpha1", "kind": "ScalePolicy",
        "metadata": {"name": "web", "namespace": "team", "uid": "u-1", "generation": 2,
                     "finalizers": [POLICY_FINALIZER]},
        "spec": base
    }))
    .unwrap();
    p.metadata.generation = Some(2);
    p
}

fn with_pending(mut p: ScalePolicy, jobs: usize) -> ScalePolicy {
    let mut s = p.status.take().unwrap_or_default();
    for j in 0..jobs {
        s.pending_jobs
            .insert(format!("{}", 1000 + j), Time(t(NOW - 5)));
    }
    p.status = Some(s);
    p
}

/// An attempt of generation 2 of policy `web` created at `created` on `node`, no status yet.
fn attempt(name: &str, node: &str, created: i64) -> AttemptBuilder {
    AttemptBuilder::new(name, "web")
        .namespace("team")
        .node(node)
        .created(t(created))
        .annotation(POLICY_GENERATION_ANNOTATION, "2")
        .policy_uid("u-1")
        .target("https://github.com/acme/web", TargetScope::Repository)
}

fn pending(name: &str) -> Arc<RunnerAttempt> {
    Arc::new(
        attempt(name, "n1", NOW - 5)
            .state(AttemptState::Pending)
            .build(),
    )
}

fn starting(name: &str, jit_at: i64) -> Arc<RunnerAttempt> {
    Arc::new(
        attempt(name, "n1", jit_at - 5)
            .state(AttemptState::Starting)
            .edges_at(t(jit_at))
            .build(),
    )
}

fn idle_on(name: &str, node: &str, since: i64) -> Arc<RunnerAttempt> {
    Arc::new(
        attempt(name, node, since - 10)
            .state(AttemptState::Idle)
            .edges_at(t(since))
            .build(),
    )
}

fn idle(name: &str, since: i64) -> Arc<RunnerAttempt> {
    idle_on(name, "n1", since)
}

/// Busy since NOW-80.
fn busy(name: &str) -> Arc<RunnerAttempt> {
    Arc::new(
        attempt(name, "n1", NOW - 100)
            .state(AttemptState::Busy)
            .edges_at(t(NOW - 80))
            .build(),
    )
}

/// Concluded with `outcome` 10 s after its creation; `registered`: whether its runner had
/// registered (a job's completion and an idle exit always had).
fn concluded(name: &str, created: i64, outcome: Outcome, registered: bool) -> Arc<RunnerAttempt> {
    let from = match outcome {
        Outcome::CompletedJob => AttemptState::Busy,
        Outcome::ExitedIdleWithoutWork => AttemptState::Idle,
        Outcome::Rejected(_) => AttemptState::Pending,
        Outcome::Failed(_) | Outcome::Orphaned(_) if registered => AttemptState::Idle,
        Outcome::Failed(_) | Outcome::Orphaned(_) => AttemptState::Allocated,
    };
    Arc::new(
        attempt(name, "n1", created)
            .concluded(outcome, from)
            .edges_at(t(created + 10))
            .build(),
    )
}

/// A job's runner, cleaned at NOW-400.
fn cleaned(name: &str) -> Arc<RunnerAttempt> {
    Arc::new(
        attempt(name, "n1", NOW - 500)
            .concluded(Outcome::CompletedJob, AttemptState::Busy)
            .state(AttemptState::Cleaned)
            .edges_at(t(NOW - 400))
            .build(),
    )
}

fn with(a: Arc<RunnerAttempt>, f: impl FnOnce(&mut RunnerAttempt)) -> Arc<RunnerAttempt> {
    let mut a = (*a).clone();
    f(&mut a);
    Arc::new(a)
}

fn asked(a: Arc<RunnerAttempt>) -> Arc<RunnerAttempt> {
    with(a, |a| {
        a.spec.termination = Some(runner_manager_crds::attempt::TerminationRequest {
            reason: TerminationReason::ScaleDown,
            requested_at: Time(t(NOW - 1)),
            deregistered: true,
        });
    })
}

fn deleted(a: Arc<RunnerAttempt>) -> Arc<RunnerAttempt> {
    with(a, |a| {
        a.metadata.deletion_timestamp = Some(Time(t(NOW - 1)))
    })
}

const VALID: Readiness<'static> = Readiness::Valid {
    version: "2.330.0",
    runner_group_id: 1,
};

struct Case {
    policy: ScalePolicy,
    attempts: Vec<Arc<RunnerAttempt>>,
    readiness: Readiness<'static>,
    cordoned: HashSet<String>,
    conflicts: Vec<String>,
    in_flight: Vec<String>,
    now: i64,
}

impl Case {
    fn new(policy: ScalePolicy, attempts: Vec<Arc<RunnerAttempt>>) -> Self {
        Self {
            policy,
            attempts,
            readiness: VALID,
            cordoned: HashSet::new(),
            conflicts: vec![],
            in_flight: vec![],
            now: NOW,
        }
    }

    fn plan(&self) -> Plan {
        let (attempts, refused) = Attempt::all(self.attempts.iter().cloned());
        assert!(refused.is_empty(), "{refused:?}");
        plan(&Inputs {
            policy: &self.policy,
            attempts: &attempts,
            readiness: self.readiness,
            cordoned: &self.cordoned,
            conflicts: &self.conflicts,
            in_flight: &self.in_flight,
            limits: limits(),
            now: t(self.now),
        })
    }

    fn run(&self) -> Run {
        match self.plan() {
            Plan::Run(r) => *r,
            Plan::Drain(d) => panic!("a live policy drained: {d:?}"),
        }
    }

    fn drain(&self) -> Drain {
        match self.plan() {
            Plan::Drain(d) => d,
            Plan::Run(r) => panic!("a deleted policy ran: {r:?}"),
        }
    }
}

fn condition(s: &ScalePolicyStatus, t: PolicyConditionType) -> &Cond {
    s.conditions.iter().find(|c| c.type_ == t).unwrap()
}

fn settled(run: &Run, scaled: Scaled) -> ScalePolicyStatus {
    settle(&run.status, scaling_condition(&run.scaling, scaled).0)
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

// --- deletion: drain and the finalizer -------------------------------------------------------

#[test]
fn a_deleted_policy_drains_idle_starting_and_pending_leaves_busy_and_deletes_cleaned() {
    let mut p = policy(json!({}));
    p.metadata.deletion_timestamp = Some(Time(t(NOW - 10)));
    let c = Case::new(
        p,
        vec![
            idle("idle", NOW - 30),
            starting("starting", NOW - 5),
            pending("pending"),
            busy("busy"),
            asked(idle("leaving", NOW - 30)),
            concluded(
                "failed",
                NOW - 50,
                Outcome::Failed(FailureReason::JitExpired),
                false,
            ),
            cleaned("cleaned"),
            deleted(cleaned("cleaned-going")),
        ],
    );
    let d = c.drain();
    assert_eq!(
        d.delete,
        names(&["cleaned"]),
        "a Cleaned attempt is deleted once"
    );
    assert_eq!(
        by_attempt(&d.terminate),
        BTreeMap::from([
            ("idle", TerminationReason::PolicyDeleted),
            ("pending", TerminationReason::PolicyDeleted),
            ("starting", TerminationReason::PolicyDeleted),
        ]),
        "busy runners finish their job; asked and concluded ones are not asked again"
    );
    assert_eq!(d.release, None, "the finalizer stays while attempts remain");
    assert!(d.events.is_empty());
}

#[test]
fn a_drained_policy_releases_its_finalizer_once_with_an_event() {
    let mut p = policy(json!({}));
    p.metadata.deletion_timestamp = Some(Time(t(NOW - 10)));
    p.metadata.finalizers = Some(names(&["other/keep", POLICY_FINALIZER]));
    let d = Case::new(p.clone(), vec![]).drain();
    assert_eq!(d.release, Some(names(&["other/keep"])));
    assert_eq!(d.events.len(), 1);
    assert_eq!(d.events[0].reason, Reason::Drained);
    // Already released: nothing more to write.
    p.metadata.finalizers = Some(names(&["other/keep"]));
    assert_eq!(Case::new(p, vec![]).drain(), Drain::default());
}

#[test]
fn a_live_policy_without_the_finalizer_gets_it_first() {
    let mut p = policy(json!({}));
    p.metadata.finalizers = Some(names(&["other/keep"]));
    let run = Case::new(p, vec![]).run();
    assert_eq!(
        run.finalizer,
        Some(names(&["other/keep", POLICY_FINALIZER]))
    );
    assert_eq!(Case::new(policy(json!({})), vec![]).run().finalizer, None);
}

// --- readiness ------------------------------------------------------------------------------

#[test]
fn a_policy_that_is_not_ready_creates_and_scales_down_nothing_and_says_why() {
    let mut c = Case::new(policy(json!({"minIdle": 2})), vec![idle("a", NOW - 30)]);
    for (readiness, reason, message) in [
        (
            Readiness::Unresolved,
            PolicyReason::GitHubUnreachable,
            "not resolved yet",
        ),
        (
            Readiness::Invalid {
                reason: PolicyReason::SecretNotFound,
                message: "Secret gh not found",
            },
            PolicyReason::SecretNotFound,
            "Secret gh not found",
        ),
    ] {
        c.readiness = readiness;
        let run = c.run();
        assert_eq!(run.scaling, Scaling::NotReady);
        let s = settled(&run, Scaled::Nothing);
        let ready = condition(&s, PolicyConditionType::Ready);
        assert_eq!(ready.status, ConditionStatus::False);
        assert_eq!((ready.reason, ready.message.as_str()), (reason, message));
        let scaling = condition(&s, PolicyConditionType::Scaling);
        assert_eq!(scaling.status, ConditionStatus::False);
        assert_eq!(scaling.reason, PolicyReason::Steady);
        assert_eq!(s.runner_version, None, "nothing pinned");
    }
    // Not Ready still stops an idle runner on a cordoned node: that is the node's business.
    c.cordoned.insert("n1".into());
    assert_eq!(
        by_attempt(&c.run().terminations),
        BTreeMap::from([("a", TerminationReason::Drain)])
    );
}

#[test]
fn a_ready_policy_pins_its_version_and_group() {
    let run = Case::new(policy(json!({})), vec![]).run();
    let s = settled(&run, Scaled::Nothing);
    assert_eq!(s.runner_version.as_deref(), Some("2.330.0"));
    assert_eq!(s.runner_group_id, Some(1));
    assert_eq!(s.observed_generation, Some(2));
    let ready = condition(&s, PolicyConditionType::Ready);
    assert_eq!(ready.status, ConditionStatus::True);
    assert_eq!(ready.message, "valid; runner 2.330.0 pinned");
}

// --- demand ---------------------------------------------------------------------------------

#[test]
fn attempts_created_but_not_yet_cached_are_supply_and_are_not_created_again() {
    // Three jobs, three attempts created by the previous reconcile that the cache does not show
    // yet (the policy's own status write triggered this one before their watch events came).
    let p = with_pending(policy(json!({"minIdle": 0})), 3);
    let mut case = Case::new(p, vec![]);
    assert_eq!(
        case.run().scaling,
        Scaling::Create {
            count: 3,
            replaces: vec![]
        },
        "nothing in flight: all three"
    );
    case.in_flight = names(&["web-a", "web-b"]);
    let run = case.run();
    assert_eq!(
        run.scaling,
        Scaling::Create {
            count: 1,
            replaces: vec![]
        },
        "two in flight: one more"
    );
    assert_eq!(run.status.base.starting, 2, "in flight counts as starting");
    case.in_flight = names(&["web-a", "web-b", "web-c"]);
    assert_eq!(case.run().scaling, Scaling::Steady);
}

#[test]
fn min_idle_and_pending_jobs_create_the_difference_and_set_the_scale_time() {
    let p = with_pending(policy(json!({"minIdle": 2})), 3);
    let run = Case::new(
        p,
        vec![busy("b"), idle("i", NOW - 30), starting("s", NOW - 5)],
    )
    .run();
    // desired = busy 1 + pending 3 + minIdle 2 = 6; supply = 3.
    assert_eq!(
        run.scaling,
        Scaling::Create {
            count: 3,
            replaces: vec![]
        }
    );
    assert_eq!(run.status.base.desired, 6);
    assert_eq!(
        (
            run.status.base.starting,
            run.status.base.idle,
            run.status.base.busy
        ),
        (1, 1, 1)
    );
    assert_eq!(run.status.base.last_scale_time, Some(Time(t(NOW))));
    assert_eq!(
        run.gauges,
        PolicyGauges {
            desired: 6,
            starting: 1,
            idle: 1,
            busy: 1,
            cleaning: 0,
            pending_jobs: 3,
            min: 2,
            max: 10
        }
    );
}

#[test]
fn a_runner_github_says_took_a_job_counts_busy_and_is_never_scaled_down() {
    let took = with(idle("took", NOW - 30), |a| {
        a.status.as_mut().unwrap().facts.job = serde_json::from_value(json!({"id": 7})).ok();
    });
    let run = Case::new(policy(json!({})), vec![took]).run();
    assert_eq!(run.status.base.busy, 1);
    assert_eq!(run.status.base.idle, 0);
    assert_eq!(run.status.base.desired, 1, "busy 1 + 0 + 0");
    assert_eq!(run.scaling, Scaling::Steady);
}

#[test]
fn max_runners_caps_creation_and_leaving_runners_count_against_it() {
    let p = with_pending(policy(json!({"maxRunners": 3})), 5);
    let run = Case::new(p.clone(), vec![busy("b")]).run();
    assert_eq!(run.status.base.desired, 3);
    assert_eq!(
        run.scaling,
        Scaling::Create {
            count: 2,
            replaces: vec![]
        }
    );
    let full = Case::new(
        p,
        vec![
            busy("b"),
            asked(idle("x", NOW - 30)),
            asked(starting("y", NOW - 5)),
        ],
    )
    .run();
    assert_eq!(full.scaling, Scaling::AtMaxRunners { max: 3 });
    assert_eq!(
        full.status.base.cleaning, 2,
        "leaving runners show as cleaning"
    );
    let s = settled(&full, Scaled::Nothing);
    let c = condition(&s, PolicyConditionType::Scaling);
    assert_eq!(
        (c.reason, c.message.as_str()),
        (PolicyReason::AtMaxRunners, "at spec.maxRunners (3)")
    );
}

#[test]
fn surplus_idle_runners_are_scaled_down_oldest_first_and_never_busy_or_starting_ones() {
    let run = Case::new(
        policy(json!({"minIdle": 1})),
        vec![
            idle("newest", NOW - 10),
            idle("oldest", NOW - 300),
            idle("middle", NOW - 100),
            busy("b"),
            starting("s", NOW - 5),
        ],
    )
    .run();
    // desired = 1 busy + 1 minIdle = 2; supply 5; surplus 3, at most the 3 idle.
    assert_eq!(
        run.scaling,
        Scaling::ScaleDown {
            idle: names(&["oldest", "middle", "newest"])
        }
    );
    // desired = 1 busy + 1 minIdle = 2; supply 3: the oldest idle goes.
    let run = Case::new(
        policy(json!({"minIdle": 1})),
        vec![
            idle("newest", NOW - 10),
            idle("oldest", NOW - 300),
            busy("b"),
        ],
    )
    .run();
    assert_eq!(
        run.scaling,
        Scaling::ScaleDown {
            idle: names(&["oldest"])
        }
    );
    let s = settled(&run, Scaled::Asked(1));
    let c = condition(&s, PolicyConditionType::Scaling);
    assert_eq!(c.reason, PolicyReason::ScalingDown);
    assert_eq!(c.message, "1 idle runner(s) deregistered and asked to stop");
    // Only starting runners in surplus: wait for them.
    let wait = Case::new(policy(json!({})), vec![starting("s", NOW - 5)]).run();
    assert_eq!(wait.scaling, Scaling::Steady);
}

/// Issue 31 item 4: a suspended policy launches nothing whatever its demand, drains its idle
/// runners (oldest first, as a scale-down), lets busy and starting ones be, and still counts
/// its pending jobs; with nothing left to drain it says `Suspended`. Resumed, it creates again.
#[test]
fn a_suspended_policy_creates_nothing_drains_idle_runners_and_still_counts_demand() {
    let suspended = with_pending(policy(json!({"minIdle": 2, "suspend": true})), 3);
    let run = Case::new(
        suspended.clone(),
        vec![
            idle("newest", NOW - 10),
            idle("oldest", NOW - 300),
            busy("b"),
            starting("s", NOW - 5),
        ],
    )
    .run();
    assert_eq!(
        run.scaling,
        Scaling::ScaleDown {
            idle: names(&["oldest", "newest"])
        },
        "every idle runner drained, the busy and the starting one left"
    );
    assert_eq!(run.status.base.desired, 0);
    assert_eq!(run.gauges.pending_jobs, 3, "demand is still observed");
    let quiet = Case::new(suspended.clone(), vec![busy("b")]).run();
    assert_eq!(quiet.scaling, Scaling::Suspended);
    let s = settled(&quiet, Scaled::Nothing);
    let c = condition(&s, PolicyConditionType::Scaling);
    assert_eq!(c.reason, PolicyReason::Suspended);
    assert!(c.message.contains("spec.suspend"), "{}", c.message);
    assert_eq!(
        Case::new(suspended, vec![]).run().scaling,
        Scaling::Suspended
    );
    // Resumed: the same demand creates runners again.
    let resumed = with_pending(policy(json!({"minIdle": 2})), 3);
    assert!(matches!(
        Case::new(resumed, vec![]).run().scaling,
        Scaling::Create { count: 5, .. }
    ));
}

// --- failures, backoff, Degraded ------------------------------------------------------------

const JIT: Outcome = Outcome::Failed(FailureReason::JitExpired);

#[test]
fn a_failed_launch_is_replaced_with_lineage_after_its_backoff() {
    let p = policy(json!({"minIdle": 1}));
    let failed = concluded("f1", NOW - 60, JIT, false);
    // Concluded at NOW-50; one failure waits the 10 s base: due at NOW-40, so now.
    let run = Case::new(p.clone(), vec![failed.clone()]).run();
    assert_eq!(
        run.scaling,
        Scaling::Create {
            count: 1,
            replaces: names(&["f1"])
        }
    );
    // Two in a row wait 20 s from the newest conclusion.
    let newer = concluded("f2", NOW - 20, JIT, false);
    let c = Case::new(p, vec![failed, newer]);
    let run = c.run();
    assert_eq!(
        run.scaling,
        Scaling::BackingOff {
            failures: 2,
            until: t(NOW + 10)
        }
    );
    let s = settled(&run, Scaled::Nothing);
    let scaling = condition(&s, PolicyConditionType::Scaling);
    assert_eq!(scaling.status, ConditionStatus::True);
    assert_eq!(scaling.reason, PolicyReason::ScalingUp);
    assert!(scaling.message.contains("(backoff)"), "{}", scaling.message);
    let degraded = condition(&s, PolicyConditionType::Degraded);
    assert_eq!(degraded.status, ConditionStatus::False);
}

#[test]
fn a_registration_timeout_is_a_failure_from_its_request_not_from_the_agents_conclusion() {
    // The operator asked a runner that never registered to stop; the agent has not concluded
    // it yet. The request settles the outcome, so the creation it causes is a replacement
    // (lineage) and waits the backoff from the request, never a plain scale-up.
    let p = policy(json!({"minIdle": 1}));
    let timed_out = with(starting("s1", NOW - 400), |a| {
        a.spec.termination = Some(runner_manager_crds::attempt::TerminationRequest {
            reason: TerminationReason::RegistrationTimeout,
            requested_at: Time(t(NOW - 2)),
            deregistered: true,
        });
    });
    let run = Case::new(p.clone(), vec![timed_out.clone()]).run();
    assert_eq!(
        run.scaling,
        Scaling::BackingOff {
            failures: 1,
            until: t(NOW + 8)
        }
    );
    let mut later = Case::new(p, vec![timed_out]);
    later.now = NOW + 8;
    assert_eq!(
        later.run().scaling,
        Scaling::Create {
            count: 1,
            replaces: names(&["s1"])
        }
    );
}

#[test]
fn enough_failed_launches_degrade_the_policy_once_and_a_new_generation_starts_afresh() {
    let attempts = vec![
        concluded("f1", NOW - 300, JIT, false),
        concluded("f2", NOW - 200, JIT, false),
        concluded("f3", NOW - 100, JIT, false),
    ];
    let c = Case::new(policy(json!({"minIdle": 1})), attempts.clone());
    let run = c.run();
    assert_eq!(run.scaling, Scaling::Degraded);
    assert_eq!(
        run.events.iter().map(|e| e.reason).collect::<Vec<_>>(),
        vec![Reason::Degraded]
    );
    let s = settled(&run, Scaled::Nothing);
    let d = condition(&s, PolicyConditionType::Degraded);
    assert_eq!(d.status, ConditionStatus::True);
    assert_eq!(d.reason, PolicyReason::LaunchesFailing);
    assert!(d.message.contains("(last: JitExpired)"), "{}", d.message);
    let scaling = condition(&s, PolicyConditionType::Scaling);
    assert_eq!(
        (scaling.status, scaling.reason),
        (ConditionStatus::False, PolicyReason::LaunchesFailing)
    );
    // Stored as Degraded already: no second Event.
    let mut again = c.policy.clone();
    again.status = Some(s);
    assert!(Case::new(again, attempts.clone()).run().events.is_empty());
    // A spec change (generation 3) counts afresh: the failures were generation 2's.
    let mut changed = policy(json!({"minIdle": 1}));
    changed.metadata.generation = Some(3);
    assert!(matches!(
        Case::new(changed, attempts).run().scaling,
        Scaling::Create { count: 1, .. }
    ));
}

#[test]
fn a_degraded_policy_sends_one_probe_after_the_cool_down_and_none_while_one_is_in_flight() {
    // The cool-down is the backoff cap (300 s here); the newest failure concluded 790 s ago.
    let failed = vec![
        concluded("f1", NOW - 1000, JIT, false),
        concluded("f2", NOW - 900, JIT, false),
        concluded("f3", NOW - 800, JIT, false),
    ];
    let run = Case::new(policy(json!({"minIdle": 2})), failed.clone()).run();
    assert_eq!(
        run.scaling,
        Scaling::Probe {
            replaces: names(&["f3", "f2", "f1"])
        },
        "one probe, whatever the demand"
    );
    let s = settled(
        &run,
        Scaled::Created {
            created: 1,
            wanted: 1,
            refused: None,
        },
    );
    assert_eq!(
        condition(&s, PolicyConditionType::Degraded).status,
        ConditionStatus::True,
        "still Degraded until the probe works"
    );
    let scaling = condition(&s, PolicyConditionType::Scaling);
    assert_eq!(
        (scaling.status, scaling.reason),
        (ConditionStatus::False, PolicyReason::LaunchesFailing)
    );
    assert!(scaling.message.contains("probe"), "{}", scaling.message);
    // The probe is in flight: nothing more.
    let mut with_probe = failed.clone();
    with_probe.push(starting("probe", NOW - 5));
    assert_eq!(
        Case::new(policy(json!({"minIdle": 2})), with_probe)
            .run()
            .scaling,
        Scaling::Degraded
    );
    // The probe failed too: a new cool-down from its conclusion.
    let mut probe_failed = failed.clone();
    probe_failed.push(concluded("probe", NOW - 100, JIT, false));
    assert_eq!(
        Case::new(policy(json!({"minIdle": 2})), probe_failed)
            .run()
            .scaling,
        Scaling::Degraded
    );
    // The probe registered: the streak is over and Degraded clears.
    let mut probe_worked = failed;
    probe_worked.push(idle("probe", NOW - 5));
    let run = Case::new(policy(json!({"minIdle": 2})), probe_worked).run();
    assert!(
        matches!(run.scaling, Scaling::Create { count: 1, .. }),
        "{:?}",
        run.scaling
    );
    let s = settled(&run, Scaled::Nothing);
    assert_eq!(
        condition(&s, PolicyConditionType::Degraded).status,
        ConditionStatus::False
    );
}

#[test]
fn a_registered_launch_ends_the_failure_streak() {
    let attempts = vec![
        concluded("f1", NOW - 300, JIT, false),
        concluded("f2", NOW - 250, JIT, false),
        concluded("ok", NOW - 200, Outcome::CompletedJob, true),
        concluded("f3", NOW - 100, JIT, false),
    ];
    let run = Case::new(policy(json!({"minIdle": 1})), attempts).run();
    assert!(
        matches!(run.scaling, Scaling::Create { .. }),
        "{:?}",
        run.scaling
    );
}

#[test]
fn infrastructure_faults_never_degrade_a_policy() {
    // Five agent restarts during preparation (a DaemonSet rollout), a node lost, admission
    // rejections and terminations: none is the policy's fault (issue 15 item 7).
    let attempts = vec![
        concluded(
            "r1",
            NOW - 500,
            Outcome::Failed(FailureReason::PreparationInterrupted),
            false,
        ),
        concluded(
            "r2",
            NOW - 450,
            Outcome::Failed(FailureReason::PreparationInterrupted),
            false,
        ),
        concluded(
            "r3",
            NOW - 400,
            Outcome::Failed(FailureReason::PreparationInterrupted),
            false,
        ),
        concluded(
            "r4",
            NOW - 350,
            Outcome::Failed(FailureReason::PreparationInterrupted),
            false,
        ),
        concluded(
            "r5",
            NOW - 300,
            Outcome::Failed(FailureReason::PreparationInterrupted),
            false,
        ),
        concluded(
            "lost",
            NOW - 250,
            Outcome::Orphaned(OrphanReason::NodeLost),
            false,
        ),
        concluded(
            "full",
            NOW - 200,
            Outcome::Rejected(RejectReason::NodeFull),
            false,
        ),
        concluded(
            "late",
            NOW - 150,
            Outcome::Rejected(RejectReason::AdmissionTimeout),
            false,
        ),
        concluded(
            "asked",
            NOW - 100,
            Outcome::Failed(FailureReason::TerminationRequested),
            false,
        ),
        concluded(
            "moved",
            NOW - 90,
            Outcome::Failed(FailureReason::SpecChanged),
            false,
        ),
    ];
    let run = Case::new(policy(json!({"minIdle": 1})), attempts).run();
    assert!(
        matches!(run.scaling, Scaling::Create { count: 1, .. }),
        "{:?}",
        run.scaling
    );
    let s = settled(&run, Scaled::Nothing);
    assert_eq!(
        condition(&s, PolicyConditionType::Degraded).status,
        ConditionStatus::False
    );
}

/// A kubelet that refuses the pod for CPU or memory contradicts the placement that chose its
/// node; replaced at once, the next attempt is likely placed there again. Its replacement waits
/// the backoff, yet it is the node's state, not the policy's, so it never degrades the policy.
#[test]
fn a_refusal_for_resources_backs_off_its_replacement_and_never_degrades() {
    const REFUSED: Outcome = Outcome::Failed(FailureReason::NodeOutOfResources);
    let p = policy(json!({"minIdle": 1}));
    // One refusal concluded at NOW-5: the next create waits the 10 s base, until NOW+5.
    let run = Case::new(p.clone(), vec![concluded("o1", NOW - 15, REFUSED, false)]).run();
    assert_eq!(
        run.scaling,
        Scaling::BackingOff {
            failures: 1,
            until: t(NOW + 5)
        }
    );
    // Five in a row (past the limit of 3): backing off (10 s x 2^4 from NOW-90), not Degraded.
    let five = |base: i64| -> Vec<Arc<RunnerAttempt>> {
        (0..5)
            .map(|k| concluded(&format!("o{k}"), base + 100 * k, REFUSED, false))
            .collect()
    };
    let run = Case::new(p.clone(), five(NOW - 500)).run();
    assert_eq!(
        run.scaling,
        Scaling::BackingOff {
            failures: 5,
            until: t(NOW + 70)
        }
    );
    let s = settled(&run, Scaled::Nothing);
    assert_eq!(
        condition(&s, PolicyConditionType::Degraded).status,
        ConditionStatus::False
    );
    // Once the backoff has passed, the next one is created, replacing the newest refusal.
    let run = Case::new(p, five(NOW - 1000)).run();
    assert_eq!(
        run.scaling,
        Scaling::Create {
            count: 1,
            replaces: names(&["o4", "o3", "o2", "o1", "o0"])
        }
    );
    let s = settled(&run, Scaled::Nothing);
    assert_eq!(
        condition(&s, PolicyConditionType::Degraded).status,
        ConditionStatus::False
    );
}

// --- terminations besides scale-down ---------------------------------------------------------

#[test]
fn idle_runners_on_cordoned_nodes_are_drained_busy_ones_finish() {
    let mut c = Case::new(
        policy(json!({"minIdle": 3})),
        vec![
            idle_on("on-cordoned", "n1", NOW - 30),
            idle_on("elsewhere", "n2", NOW - 30),
            with(busy("busy-on-cordoned"), |a| a.spec.node_name = "n1".into()),
            asked(idle_on("already-leaving", "n1", NOW - 30)),
        ],
    );
    c.cordoned.insert("n1".into());
    assert_eq!(
        by_attempt(&c.run().terminations),
        BTreeMap::from([("on-cordoned", TerminationReason::Drain)])
    );
}

#[test]
fn timeouts_and_deleted_attempts_are_terminated_once_each() {
    let c = Case::new(
        policy(json!({"minIdle": 5})),
        vec![
            // Registration timeout: 60 s after the JIT.
            starting("slow", NOW - 61),
            starting("fresh", NOW - 30),
            // Idle timeout: 120 s idle.
            idle("stale", NOW - 121),
            idle("recent", NOW - 60),
            // A person deleted it: stop it (never a busy one, which finishes its job).
            deleted(idle("gone", NOW - 10)),
            deleted(busy("gone-busy")),
            // Already asked: never asked twice.
            asked(starting("asked-slow", NOW - 61)),
        ],
    );
    assert_eq!(
        by_attempt(&c.run().terminations),
        BTreeMap::from([
            ("gone", TerminationReason::Deleted),
            ("slow", TerminationReason::RegistrationTimeout),
            ("stale", TerminationReason::IdleTimeout),
        ])
    );
}

#[test]
fn an_attempt_named_by_scale_down_is_not_terminated_twice() {
    let mut c = Case::new(
        policy(json!({})),
        vec![idle("old", NOW - 200), idle("new", NOW - 10)],
    );
    c.cordoned.insert("n1".into());
    let run = c.run();
    assert_eq!(
        run.scaling,
        Scaling::ScaleDown {
            idle: names(&["old", "new"])
        }
    );
    assert!(run.terminations.is_empty(), "{:?}", run.terminations);
}

// --- conflicts and the status write --------------------------------------------------------

#[test]
fn a_conflict_is_a_condition_and_one_event() {
    let mut c = Case::new(policy(json!({})), vec![]);
    c.conflicts = (0..7).map(|i| format!("ns{i}/web")).collect();
    let run = c.run();
    assert_eq!(run.events.len(), 1);
    assert_eq!(run.events[0].reason, Reason::TargetConflict);
    let s = settled(&run, Scaled::Nothing);
    let conflict = condition(&s, PolicyConditionType::Conflict);
    assert_eq!(conflict.status, ConditionStatus::True);
    assert!(
        conflict.message.contains("ns4/web and 2 more"),
        "{}",
        conflict.message
    );
    c.policy.status = Some(s);
    assert!(c.run().events.is_empty(), "already stored: no second Event");
    c.conflicts.clear();
    let s = settled(&c.run(), Scaled::Nothing);
    assert_eq!(
        condition(&s, PolicyConditionType::Conflict).reason,
        PolicyReason::NoConflict
    );
}

#[test]
fn an_unchanged_policy_plans_an_unchanged_status_so_nothing_is_written() {
    let mut c = Case::new(policy(json!({"minIdle": 1})), vec![idle("i", NOW - 30)]);
    let first = settled(&c.run(), Scaled::Nothing);
    assert_eq!(
        first.conditions.iter().map(|c| c.type_).collect::<Vec<_>>(),
        vec![
            PolicyConditionType::Ready,
            PolicyConditionType::Scaling,
            PolicyConditionType::Degraded,
            PolicyConditionType::Conflict
        ]
    );
    c.policy.status = Some(first.clone());
    c.now = NOW + 5;
    let second = settled(&c.run(), Scaled::Nothing);
    assert_eq!(second, first, "same decisions, same status: no write");
}

// --- what apply made of the scaling step -----------------------------------------------------

#[test]
fn the_scaling_condition_reports_creation_refusal_and_build_failure() {
    let create = Scaling::Create {
        count: 3,
        replaces: vec![],
    };
    let ((ok, reason, message), event) = scaling_condition(
        &create,
        Scaled::Created {
            created: 3,
            wanted: 3,
            refused: None,
        },
    );
    assert!(ok);
    assert_eq!(reason, PolicyReason::ScalingUp);
    assert_eq!(message, "3 attempt(s) created toward 3");
    assert!(event.is_none());
    // Nothing placed: the condition says why, and one Event does.
    let ((ok, reason, message), event) = scaling_condition(
        &create,
        Scaled::Created {
            created: 0,
            wanted: 3,
            refused: Some(Unplaceable::AllFull),
        },
    );
    assert!(!ok);
    assert_eq!(reason, PolicyReason::NoEligibleNode);
    assert_eq!(message, Unplaceable::AllFull.message());
    assert_eq!(event.map(|e| e.reason), Some(Reason::Unplaceable));
    // Some placed: the condition still names the refusal, without an Event.
    let ((ok, _, _), event) = scaling_condition(
        &create,
        Scaled::Created {
            created: 1,
            wanted: 3,
            refused: Some(Unplaceable::NoAgent),
        },
    );
    assert!(!ok);
    assert!(event.is_none());
    let ((ok, reason, message), _) = scaling_condition(&Scaling::Steady, Scaled::Nothing);
    assert!(ok);
    assert_eq!(
        (reason, message.as_str()),
        (PolicyReason::Steady, "supply matches demand")
    );
}

// --- placement ------------------------------------------------------------------------------

fn node(name: &str, capacity: u32) -> NodeFacts {
    NodeFacts {
        name: name.into(),
        labels: BTreeMap::from([("pool".to_owned(), "ci".to_owned())]),
        arch: Some(runner_manager_crds::arch::Arch::X64),
        cordoned: false,
        agent: Some(AgentLease {
            renewed_at: Some(t(NOW - 1)),
            duration: Duration::from_secs(40),
            recovery_complete: true,
            capacity,
            free: Some(capacity),
        }),
        advert: None,
        counted: BTreeSet::new(),
        room: None,
    }
}

fn pkg() -> RunnerPackages {
    RunnerPackages::single(RunnerPackage {
        version: "2.330.0".into(),
        url: "u".into(),
        sha256: "a".repeat(64),
        architecture: None,
    })
}

/// `place` for `p` as resolution would pin it: its validated view and these packages.
fn place_for(
    worker: &mut PlacementWorker,
    facts: &mut [NodeFacts],
    p: &ScalePolicy,
    packages: &RunnerPackages,
    count: u32,
    replaces: &[String],
) -> Placed {
    let env = BTreeMap::new();
    let valid = runner_manager_crds::validate::validated(p).unwrap();
    let pinned = Pinned {
        policy: &valid,
        runner_group_id: 1,
        packages,
        env: &env,
    };
    place(worker, facts, &pinned, count, replaces, t(NOW), ids())
}

fn ids() -> impl FnMut() -> uuid::Uuid {
    let mut n = 0u128;
    move || {
        n += 1;
        // Attempt names carry the first 12 hex digits: vary those.
        uuid::Uuid::from_u128((n << 96) | 0x89ab_4def_8123_0000_0000_0000)
    }
}

#[test]
fn placement_fills_free_slots_then_refuses_and_records_what_it_placed() {
    let package = pkg();
    let pinned = &package;
    let p = policy(json!({}));
    let mut worker = PlacementWorker::new();
    let mut facts = vec![node("n1", 1), node("n2", 1)];
    let placed = place_for(&mut worker, &mut facts, &p, pinned, 3, &names(&["old-1"]));
    assert_eq!(placed.attempts.len(), 2);
    assert_eq!(placed.refused, Some(Unplaceable::AllFull));
    let nodes: BTreeSet<&str> = placed.attempts.iter().map(|a| a.node.as_str()).collect();
    assert_eq!(nodes, BTreeSet::from(["n1", "n2"]), "one per free slot");
    assert_eq!(placed.attempts[0].replaces.as_deref(), Some("old-1"));
    assert_eq!(placed.attempts[1].replaces, None);
    assert_eq!(creation_reason(&placed.attempts[0]), "replacement");
    assert_eq!(creation_reason(&placed.attempts[1]), "scale_up");
    assert!(creation_note(&placed.attempts[0]).ends_with("replacing old-1"));
    // The worker expects them: a later placement (facts rebuilt from a cache that does not
    // show them yet) finds no room.
    let mut fresh = vec![node("n1", 1), node("n2", 1)];
    let again = place_for(&mut worker, &mut fresh, &p, pinned, 1, &[]);
    assert!(again.attempts.is_empty());
    assert_eq!(again.refused, Some(Unplaceable::AllFull));
}

#[test]
fn placement_refuses_without_a_matching_node_or_agent() {
    let package = pkg();
    let pinned = &package;
    let picky = policy(json!({"nodeSelector": {"node-restriction.kubernetes.io/pool": "gpu"}}));
    let mut worker = PlacementWorker::new();
    let placed = place_for(&mut worker, &mut [node("n1", 4)], &picky, pinned, 1, &[]);
    assert_eq!(placed.refused, Some(Unplaceable::NoneMatchingSelector));
    let mut agentless = node("n1", 4);
    agentless.agent = None;
    let placed = place_for(
        &mut worker,
        &mut [agentless],
        &policy(json!({})),
        pinned,
        1,
        &[],
    );
    assert_eq!(placed.refused, Some(Unplaceable::NoAgent));
    let mut cordoned = node("n1", 4);
    cordoned.cordoned = true;
    let placed = place_for(
        &mut worker,
        &mut [cordoned],
        &policy(json!({})),
        pinned,
        1,
        &[],
    );
    assert_eq!(placed.refused, Some(Unplaceable::AllCordoned));
}

#[test]
fn a_runner_labelled_with_an_architecture_is_placed_only_on_nodes_of_it() {
    use runner_manager_crds::arch::Arch;
    let package = |arch: Arch, sha: &str| RunnerPackage {
        version: "2.330.0".into(),
        url: format!("https://x/actions-runner-linux-{arch}-2.330.0.tar.gz"),
        sha256: sha.repeat(64),
        architecture: Some(arch),
    };
    let packages =
        RunnerPackages::of([package(Arch::X64, "a"), package(Arch::Arm64, "b")]).unwrap();
    let pinned = &packages;
    let arm_node = || {
        let mut n = node("arm", 4);
        n.arch = Some(Arch::Arm64);
        n
    };
    // Unlabelled by architecture: the arm64 node runs the arm64 package.
    let mut worker = PlacementWorker::new();
    let placed = place_for(
        &mut worker,
        &mut [arm_node()],
        &policy(json!({})),
        pinned,
        1,
        &[],
    );
    assert_eq!(
        placed.attempts[0].attempt.spec.snapshot.runner,
        package(Arch::Arm64, "b")
    );
    // Labelled `X64` (GitHub's labels ignore case): not on an arm64 node.
    let placed = place_for(
        &mut worker,
        &mut [arm_node()],
        &policy(json!({"labels": ["self-hosted", "X64"]})),
        pinned,
        1,
        &[],
    );
    assert!(placed.attempts.is_empty());
    assert_eq!(placed.refused, Some(Unplaceable::NoPackageForArchitecture));
    // Labelled `arm`, which GitHub does not publish here: nowhere.
    let placed = place_for(
        &mut worker,
        &mut [arm_node(), node("amd", 4)],
        &policy(json!({"labels": ["arm"]})),
        pinned,
        1,
        &[],
    );
    assert_eq!(placed.refused, Some(Unplaceable::NoPackageForArchitecture));
}
