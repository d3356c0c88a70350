//! The node agent as a process on the real control plane, with the simulated GitHub, the
//! operator binary serving the broker, the stand-in runner package and real processes in real
//! cgroups: launch, supervision, ordered termination, admission, the host fence, re-adoption
//! after a restart, and a crash at each named boundary. The test plays the operator's facts
//! (`status.github`, `status.job`) and requests (`spec.termination`, deregistration). Runs as
//! root with the runner accounts of `e2e/setup-runner-accounts.sh`. Skipped without KUBECONFIG.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::outcome::{FailureReason, Outcome, RejectReason};
use runner_manager_crds::state::AttemptState;
use runner_manager_e2e::harness::agent::{AgentWorld, STEP};
use runner_manager_e2e::harness::attempt::{
    journal_of, name, outcome, pid_alive, pid_of, registration, runtime_path,
};
use runner_manager_e2e::harness::cluster::list_all;
use runner_manager_e2e::harness::pin::Pinned;
use runner_manager_e2e::harness::process::Running;
use runner_manager_e2e::harness::wait;

async fn wait_exit(agent: &mut Running) -> std::process::ExitStatus {
    wait::until(STEP, "the agent to exit", || {
        let status = agent.child.try_wait().ok().flatten();
        async move { status }
    })
    .await
    .unwrap()
}

/// The operator's ordered termination of an idle runner: the request, then the
/// deregistration at once (the agent must conclude the same whichever it sees first).
async fn stop_idle(w: &AgentWorld, a: &RunnerAttempt, reason: &str) {
    w.request_termination(&name(a), reason).await.unwrap();
    w.deregister(a).await.unwrap();
}

/// The operator's part once a launch is lost or refused: it deletes the registration `done`
/// left; then everything [`assert_settled`] asserts of `a`.
async fn deregistered_and_settled(
    w: &AgentWorld,
    done: &RunnerAttempt,
    a: &RunnerAttempt,
    attempts_in_world: u64,
) {
    w.deregister(done).await.unwrap();
    assert_settled(w, a, attempts_in_world).await;
}

/// A failed start's end: one JIT asked once and no handoff left ([`one_jit_asked_once_and_no_handoff`]),
/// then the lost JIT's registration deleted and `a` settled ([`deregistered_and_settled`]).
async fn lost_jit_deregistered_and_settled(
    w: &AgentWorld,
    done: &RunnerAttempt,
    a: &RunnerAttempt,
) {
    one_jit_asked_once_and_no_handoff(w).await;
    deregistered_and_settled(w, done, a, 1).await;
}

/// One JIT in the world, asked once, and no handoff file left.
async fn one_jit_asked_once_and_no_handoff(w: &AgentWorld) {
    assert!(w.handoff_files().is_empty(), "{:?}", w.handoff_files());
    let (second_sessions, mints) = w.second_sessions_and_mints().await.unwrap();
    assert_eq!((second_sessions, mints), (0, 1), "one JIT, asked once");
}

/// An idle runner whose attempt's spec is then edited (its labels): the agent, the attempt and
/// its name.
async fn idle_with_a_changed_spec(w: &AgentWorld) -> (Running, RunnerAttempt, String) {
    use kube::api::{Patch, PatchParams};
    let (agent, a, n) = w.serving_one().await;
    w.started_to_idle(&a).await;
    w.attempts()
        .patch(
            &n,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"snapshot": {"labels": ["self-hosted", "linux", "gpu"]}}})),
        )
        .await
        .unwrap();
    (agent, a, n)
}

/// The attempt `name` is still `Pending` (`why`: what admitting it would have been), and one JIT
/// was minted in all.
async fn still_pending_with_one_mint(w: &AgentWorld, name: &str, why: &str) {
    let still = w.attempts().get(name).await.unwrap();
    assert_eq!(
        still
            .status
            .as_ref()
            .map_or(AttemptState::Pending, |s| s.journal.state()),
        AttemptState::Pending,
        "{why}"
    );
    assert_eq!(w.second_sessions_and_mints().await.unwrap().1, 1);
}

/// A new attempt whose registration deadline is 3 s, once its runner started: the attempt, its
/// name, and the attempt at `Starting`.
async fn started_with_a_short_registration(
    w: &AgentWorld,
) -> (RunnerAttempt, String, RunnerAttempt) {
    use runner_manager_crds::duration::ManifestDuration;
    let a = w
        .pending_attempt_with(|s| s.timeouts.registration = ManifestDuration::from_secs(3))
        .await
        .unwrap();
    let n = name(&a);
    let started = w.wait_state(&n, AttemptState::Starting).await.unwrap();
    (a, n, started)
}

/// `agent` has logged a line containing `text`.
fn assert_logged(agent: &Running, text: &str) {
    assert!(
        agent.lines().iter().any(|l| l.contains(text)),
        "{:?}",
        agent.lines()
    );
}

/// A new attempt's runner brought to `Idle`: the attempt, the runner's pid, its runtime and its
/// cgroup directory.
async fn idle_runner(
    w: &AgentWorld,
) -> (RunnerAttempt, u32, std::path::PathBuf, std::path::PathBuf) {
    let a = w.pending_attempt().await.unwrap();
    let idle = w.bring_to_idle(&a).await;
    let pid = pid_of(&idle);
    let (runtime, cgroup) = (
        runtime_path(&idle),
        w.cgroup_dir().join(format!("rm-{}", short_of(&a))),
    );
    (a, pid, runtime, cgroup)
}

/// A new attempt on a persistent slot, at most `max_slots` slots on the node.
async fn slot_attempt(w: &AgentWorld, max_slots: u32) -> RunnerAttempt {
    use runner_manager_crds::policy::WorkspaceMode;
    w.pending_attempt_with(|s| {
        s.workspace = WorkspaceMode::Persistent;
        s.max_slots = max_slots;
    })
    .await
    .unwrap()
}

/// The names of the entries of `dir`.
fn names_in(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Everything the scenarios assert once an attempt is settled.
async fn assert_settled(w: &AgentWorld, a: &RunnerAttempt, attempts_in_world: u64) {
    let done = w.wait_state(&name(a), AttemptState::Cleaned).await.unwrap();
    assert!(w.runtimes().is_empty(), "runtimes left: {:?}", w.runtimes());
    assert!(w.handoff_files().is_empty(), "{:?}", w.handoff_files());
    assert!(
        w.registrations(&done).await.unwrap().is_empty(),
        "a registration is left"
    );
    let (second_sessions, mints) = w.second_sessions_and_mints().await.unwrap();
    assert_eq!(second_sessions, 0, "a second runner used the JIT");
    assert!(
        mints <= attempts_in_world,
        "{mints} JITs minted for {attempts_in_world} attempt(s)"
    );
    let entries: Vec<_> = std::fs::read_dir(w.cgroup_dir())
        .map(|d| d.flatten().filter(|e| e.path().is_dir()).count())
        .into_iter()
        .collect();
    assert!(entries.iter().all(|n| *n == 0), "runner cgroups left");
}

fn print_launch(label: &str, a: &RunnerAttempt) {
    let l = journal_of(a).launch.clone().unwrap();
    println!(
        "status.launch ({label}): materializeMs={} prepareMs={} registerMs={} spawnMs={} packageDownloaded={}",
        l.materialize_ms, l.prepare_ms, l.register_ms, l.spawn_ms, l.package_downloaded
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_goes_from_pending_to_a_completed_job_and_is_cleaned() {
    let Some(w) = AgentWorld::start("a_runner_goes_from_pending_to_a_completed_job").await else {
        return;
    };
    let (agent, a, n) = w.serving_one().await;
    let started = w
        .wait_from(&n, AttemptState::Starting, "Starting or later")
        .await;
    let journal = journal_of(&started);
    let process = journal.process().unwrap().clone();
    assert!(journal.runner().is_some());
    assert!(
        journal.launch.as_ref().unwrap().package_downloaded,
        "a cold launch downloads"
    );
    print_launch("cold", &started);
    assert!(
        w.handoff_files().is_empty(),
        "the handoff survived the start"
    );
    assert!(pid_alive(process.pid));
    assert_eq!(
        std::fs::metadata(journal.workspace().unwrap().runtime_path())
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
            .unwrap(),
        20001,
        "the runtime belongs to the first pool account"
    );

    w.bring_to_idle(&a).await;
    let job = w.queue_job(3000).await.unwrap();
    let runner = w.wait_assigned(job).await.unwrap();
    assert_eq!(runner, registration(&started).name);
    w.set_job(&n, job).await.unwrap();
    w.set_github(&n, true, true, 2).await.unwrap();
    w.wait_state(&n, AttemptState::Busy).await.unwrap();
    w.wait_concluded(&n, Outcome::CompletedJob).await;
    assert!(!pid_alive(process.pid));
    assert_settled(&w, &a, 1).await;
    let diag = std::fs::read_to_string(w.host_root().join("diagnostics").join(format!("{n}.log")))
        .unwrap();
    assert!(diag.contains("CompletedJob"), "{diag}");

    // A second launch on the same node is warm: the package is cached.
    let b = w.pending_attempt().await.unwrap();
    let warm = w
        .wait_from(&name(&b), AttemptState::Starting, "Starting or later")
        .await;
    assert!(
        !journal_of(&warm)
            .launch
            .as_ref()
            .unwrap()
            .package_downloaded
    );
    print_launch("warm", &warm);
    w.bring_to_idle(&b).await;
    stop_idle(&w, &b, "ScaleDown").await;
    assert_settled(&w, &b, 2).await;
    drop(agent);
}

/// A job that leaves a tree far deeper than any legitimate one (with a FIFO and a link out at
/// its bottom) and a directory far wider, against an agent limited to 1024 descriptors: the
/// runtime is removed and the attempt cleaned, while the agent launches another attempt; the
/// agent never exits. Before the iterative removal the agent held a descriptor per level (the
/// removal failed with "too many open files" on every pass, forever) and recursed per level on
/// a tokio worker's stack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_leaving_pathological_trees_is_cleaned_while_the_agent_serves_others() {
    let Some(w) = AgentWorld::start("a_job_leaving_pathological_trees").await else {
        return;
    };
    let mut agent = w.agent_with_fd_limit(2, &[], 1024).unwrap();
    w.wait_recovered().await.unwrap();
    let (a, n) = w.pending_named().await;
    w.bring_to_idle(&a).await;
    let job = w
        .queue_job_with(serde_json::json!({"deep_tree_depth": 20_000, "wide_tree_entries": 20_000}))
        .await
        .unwrap();
    w.wait_assigned(job).await.unwrap();
    w.set_job(&n, job).await.unwrap();
    w.set_github(&n, true, true, 2).await.unwrap();
    // Launched while the job builds its trees and the agent removes them.
    let b = w.pending_attempt().await.unwrap();
    let done = w.wait_concluded(&n, Outcome::CompletedJob).await;
    let deferred = journal_of(&done)
        .conditions
        .iter()
        .any(|c| format!("{:?}", c.type_) == "CleanupDeferred");
    assert!(!deferred, "the removal never failed");
    w.bring_to_idle(&b).await;
    stop_idle(&w, &b, "ScaleDown").await;
    assert_settled(&w, &b, 2).await;
    assert!(
        agent.child.try_wait().unwrap().is_none(),
        "the agent is still running"
    );
    assert!(std::path::Path::new("/etc/passwd").exists());
}

/// Waits for the agent's Lease to be renewed `times` more times (one heartbeat is 2 s here, ten
/// supervision passes): the clock the backoff is judged against, observed rather than slept.
async fn heartbeats(w: &AgentWorld, times: usize) {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases = kube::Api::<Lease>::namespaced(w.kube.clone(), &w.system);
    let lease = runner_manager_crds::names::agent_lease_name(&w.node().name);
    let renewed = || async {
        leases
            .get(&lease)
            .await
            .ok()
            .and_then(|l| l.spec.and_then(|s| s.renew_time))
            .map(|t| t.0)
    };
    let mut last = renewed().await;
    for _ in 0..times {
        let seen = last;
        last = wait::until(STEP, "a Lease renewal", || async {
            let now = renewed().await;
            (now.is_some() && now != seen).then_some(now)
        })
        .await
        .unwrap();
    }
}

fn condition<'a>(
    a: &'a RunnerAttempt,
    type_: &str,
) -> Option<
    &'a runner_manager_crds::conditions::Condition<
        runner_manager_crds::attempt::AttemptConditionType,
        runner_manager_crds::attempt::AttemptReason,
    >,
> {
    a.status
        .as_ref()?
        .journal
        .conditions
        .iter()
        .find(|c| format!("{:?}", c.type_) == type_)
}

/// An ephemeral runtime that cannot be removed (a file made immutable, as `chattr +i` leaves
/// it) is retried with backoff, not on every supervision pass, under a `CleanupDeferred`
/// condition and one event; once the file can go, the next try removes the runtime, resolves the
/// condition and cleans the attempt. Before: retried (and logged) every pass, no condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unremovable_ephemeral_runtime_backs_off_under_a_cleanup_deferred_condition() {
    let Some(w) = AgentWorld::start("an_unremovable_ephemeral_runtime_backs_off").await else {
        return;
    };
    let (agent, a, n) = w.serving_one().await;
    let runtime = runtime_path(&w.bring_to_idle(&a).await);
    let pinned = Pinned::set(runtime.join("pinned")).unwrap();
    stop_idle(&w, &a, "ScaleDown").await;
    let deferred = w
        .wait_for(&n, "a CleanupDeferred condition", |s| {
            s.journal.conditions.iter().any(|c| {
                format!("{:?}", c.type_) == "CleanupDeferred"
                    && c.status == runner_manager_crds::conditions::ConditionStatus::True
            })
        })
        .await
        .unwrap();
    let c = condition(&deferred, "CleanupDeferred").unwrap();
    assert_eq!(format!("{:?}", c.reason), "DeletionFailed");
    assert!(c.message.contains("PermissionDenied"), "{}", c.message);
    let tries = || {
        agent
            .lines()
            .iter()
            .filter(|l| l.contains(&n) && l.contains("could not be removed"))
            .count()
    };
    // About twenty supervision passes later, still the one try.
    heartbeats(&w, 2).await;
    assert_eq!(tries(), 1, "retried without backoff");
    drop(pinned);
    let done = w.wait_state(&n, AttemptState::Cleaned).await.unwrap();
    let c = condition(&done, "CleanupDeferred").unwrap();
    assert_eq!(
        c.status,
        runner_manager_crds::conditions::ConditionStatus::False
    );
    assert_eq!(format!("{:?}", c.reason), "Resolved");
    assert!(!runtime.exists());
    assert_eq!(tries(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_runner_is_terminated_in_order_and_exits_idle() {
    let Some(w) = AgentWorld::start("an_idle_runner_is_terminated_in_order").await else {
        return;
    };
    let (_agent, a, n, idle) = w.serving_idle().await;
    let pid = pid_of(&idle);
    stop_idle(&w, &a, "IdleTimeout").await;
    let done = w.wait_concluded(&n, Outcome::ExitedIdleWithoutWork).await;
    assert!(!outcome(&done).unwrap().wants_replacement());
    assert!(!pid_alive(pid));
    assert_settled(&w, &a, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_rejects_the_surplus_over_capacity() {
    let Some(w) = AgentWorld::start("admission_rejects_the_surplus").await else {
        return;
    };
    let _agent = w.recovered(w.agent(1, &[])).await;
    let first = w.pending_attempt().await.unwrap();
    let second = w.pending_attempt().await.unwrap();
    let mut admitted = None;
    let mut rejected = None;
    for a in [&first, &second] {
        let settled = w
            .wait_from(&name(a), AttemptState::Starting, "admitted or rejected")
            .await;
        match outcome(&settled) {
            Some(o) => rejected = Some((a.clone(), settled, o)),
            None => admitted = Some(a.clone()),
        }
    }
    let (rejected, settled, o) = rejected.expect("one attempt rejected");
    assert_eq!(o, Outcome::Rejected(RejectReason::NodeFull));
    let journal = journal_of(&settled);
    assert_eq!(journal.state(), AttemptState::Cleaned);
    assert!(
        journal.workspace().is_none(),
        "a rejection allocates nothing"
    );
    assert!(w.registrations(&rejected).await.unwrap().is_empty());
    let advert = wait::until(STEP, "the Lease to show the node full", || async {
        w.advert().await.filter(|a| a.capacity == 1 && a.free == 0)
    })
    .await
    .unwrap();
    assert!(advert.recovery_complete);
    let lease = kube::Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        w.kube.clone(),
        &w.system,
    )
    .get(&runner_manager_crds::names::agent_lease_name(
        &w.node().name,
    ))
    .await
    .unwrap();
    let spec = lease.spec.unwrap();
    assert_eq!(
        spec.lease_duration_seconds,
        Some(6),
        "three heartbeats of 2 s"
    );
    assert!(spec.renew_time.is_some() && spec.holder_identity.is_some());
    let admitted = admitted.expect("one attempt admitted");
    w.bring_to_idle(&admitted).await;
    stop_idle(&w, &admitted, "ScaleDown").await;
    assert_settled(&w, &admitted, 1).await;
    wait::until(STEP, "the Lease to show the node free", || async {
        w.advert().await.filter(|a| a.free == 1)
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_on_the_same_host_refuses_to_act() {
    let Some(w) = AgentWorld::start("a_second_agent_on_the_same_host_refuses").await else {
        return;
    };
    let _first = w.serving().await;
    let mut second = w.agent(4, &[]).unwrap();
    let status = wait_exit(&mut second).await;
    assert_eq!(status.code(), Some(3), "{:?}", second.lines());
    assert_logged(&second, "refusing to act");
    // The first one still serves.
    let a = w.pending_attempt().await.unwrap();
    w.wait_state(&name(&a), AttemptState::Starting)
        .await
        .unwrap();
    w.bring_to_idle(&a).await;
    stop_idle(&w, &a, "ScaleDown").await;
    assert_settled(&w, &a, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_readopts_its_live_runner() {
    let Some(w) = AgentWorld::start("a_restarted_agent_readopts").await else {
        return;
    };
    let (mut agent, a, n) = w.serving_one().await;
    let idle = w.started_to_idle(&a).await;
    let process = journal_of(&idle).process().unwrap().clone();

    agent.terminate().unwrap();
    let status = wait_exit(&mut agent).await;
    assert!(status.success(), "{status:?}");
    assert!(pid_alive(process.pid), "the runner died with the agent");

    let _again = w.serving().await;
    let journal = w.journal_in(&n, AttemptState::Idle).await;
    assert_eq!(
        journal.process(),
        Some(&process),
        "the same runner, re-adopted"
    );
    assert!(pid_alive(process.pid));

    // Supervised again: a job runs on it and it is concluded and cleaned.
    let job = w.queue_job(0).await.unwrap();
    w.wait_assigned(job).await.unwrap();
    w.set_job(&n, job).await.unwrap();
    w.wait_concluded(&n, Outcome::CompletedJob).await;
    assert_settled(&w, &a, 1).await;
}

/// Kill the agent at `boundary`, restart it without the fault, let things settle (the test
/// playing the operator), and check the invariants. Returns the final attempt.
async fn crash_at(boundary: &str, expected: Outcome) {
    // The world is named for the boundary: `crash_after_allocated` for `after-allocated`.
    let test = format!("crash_{}", boundary.replace('-', "_"));
    let Some(w) = AgentWorld::start(&test).await else {
        return;
    };
    let mut agent = w.agent(4, &[("RM_AGENT_FAULT", boundary)]).unwrap();
    w.wait_recovered().await.unwrap();
    let (a, n) = w.pending_named().await;
    match boundary {
        // The request alone: the agent must see a live runner to write its intent. The
        // deregistration follows the crash.
        "after-termination-intent" => {
            w.started_to_idle(&a).await;
            w.request_termination(&n, "IdleTimeout").await.unwrap();
        }
        "mid-cleanup" => {
            w.started_to_idle(&a).await;
            stop_idle(&w, &a, "IdleTimeout").await;
        }
        _ => {}
    }
    let status = wait_exit(&mut agent).await;
    assert!(!status.success(), "the agent did not crash at {boundary}");
    // The line is read from the pipe by the harness's reader thread, which may not have
    // reached it at the moment the exit is seen: wait for it, don't sample.
    let named = wait::until(STEP, "the agent's fault line", || {
        let seen = agent.lines().iter().any(|l| l.contains(boundary));
        async move { seen.then_some(()) }
    })
    .await;
    assert!(named.is_ok(), "{:?}", agent.lines());
    drop(agent);
    if matches!(boundary, "after-allocated" | "after-materialize") {
        // The reservation is journalled before any effect (parity row 63): at `Allocated`
        // nothing was minted, and right after the CAS nothing was downloaded or materialized.
        let crashed = w.attempts().get(&n).await.unwrap();
        assert_eq!(journal_of(&crashed).state(), AttemptState::Allocated);
        assert!(journal_of(&crashed).workspace().is_some());
        assert_eq!(w.second_sessions_and_mints().await.unwrap().1, 0);
    }
    if boundary == "after-allocated" {
        let counters = w.fake.counters().await.unwrap();
        let downloads: u64 = counters["download_package"]
            .as_object()
            .map(|m| m.values().filter_map(serde_json::Value::as_u64).sum())
            .unwrap_or(0);
        assert_eq!(
            downloads, 0,
            "a package download before the reservation held"
        );
        assert!(w.runtimes().is_empty(), "{:?}", w.runtimes());
    }
    if boundary == "after-termination-intent" {
        w.deregister(&a).await.unwrap();
    }

    let _again = w.serving().await;
    // Settle as the operator would: a re-adopted runner is brought online and stopped; a lost
    // JIT's registration is deleted.
    let seen = w
        .wait_for(&n, "a settled or re-adopted attempt", |s| {
            matches!(
                s.journal.state(),
                AttemptState::Starting | AttemptState::Idle | AttemptState::Cleaned
            )
        })
        .await
        .unwrap();
    let state = journal_of(&seen).state();
    if state == AttemptState::Starting {
        w.bring_to_idle(&a).await;
    }
    if state != AttemptState::Cleaned {
        stop_idle(&w, &a, "IdleTimeout").await;
    }
    let done = w.wait_concluded_saying(&n, expected, boundary).await;
    if expected.wants_replacement() {
        // The operator deregisters what a lost launch left on GitHub, then replaces it.
        w.deregister(&done).await.unwrap();
    }
    assert_settled(&w, &a, 1).await;
}

/// One test per fault boundary: [`crash_at`] the boundary, and the outcome the restarted agent
/// must reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_allocated_concludes_preparation_interrupted() {
    crash_at(
        "after-allocated",
        Outcome::Failed(FailureReason::PreparationInterrupted),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_materialize_concludes_preparation_interrupted() {
    crash_at(
        "after-materialize",
        Outcome::Failed(FailureReason::PreparationInterrupted),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_jit_and_the_spawn_loses_the_jit() {
    crash_at(
        "after-jit-before-spawn",
        Outcome::Failed(FailureReason::JitExpired),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_spawn_and_starting_readopts_the_runner() {
    crash_at(
        "after-spawn-before-starting",
        Outcome::ExitedIdleWithoutWork,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_termination_intent_finishes_the_stop() {
    crash_at("after-termination-intent", Outcome::ExitedIdleWithoutWork).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_mid_cleanup_finishes_the_cleanup() {
    crash_at("mid-cleanup", Outcome::ExitedIdleWithoutWork).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_version_github_refuses_exits_7_and_is_concluded_distinctly() {
    let Some(w) = AgentWorld::start("a_runner_version_github_refuses").await else {
        return;
    };
    w.fake
        .admin(
            "PUT",
            "minimum-runner-version",
            serde_json::json!({"version": "9.9.9"}),
        )
        .await
        .unwrap();
    let _agent = w.serving().await;
    let a = w.pending_attempt().await.unwrap();
    let refused = Outcome::Failed(FailureReason::RunnerVersionRejected);
    let done = w.wait_concluded(&name(&a), refused).await;
    // The operator deletes the registration GitHub refused to serve.
    deregistered_and_settled(&w, &done, &a, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_dies_before_registering_is_a_failure() {
    let Some(w) = AgentWorld::start("a_runner_that_dies_before_registering").await else {
        return;
    };
    let (_agent, a, n) = w.serving_one().await;
    let started = w.wait_state(&n, AttemptState::Starting).await.unwrap();
    let process = journal_of(&started).process().unwrap().clone();
    // Its registration vanishes under it (no termination was asked): the listener exits.
    w.wait_online(&a).await.unwrap();
    w.deregister(&a).await.unwrap();
    w.wait_concluded(
        &n,
        Outcome::Failed(FailureReason::ProcessExitedUnexpectedly),
    )
    .await;
    assert!(!pid_alive(process.pid));
    assert_settled(&w, &a, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_an_attempt_stops_its_runner_in_order_before_the_finalizer_goes() {
    use kube::api::{DeleteParams, Patch, PatchParams};
    let Some(w) = AgentWorld::start("deleting_an_attempt_stops_its_runner").await else {
        return;
    };
    let (agent, a, n) = w.serving_one().await;
    // The operator creates attempts with its cleanup finalizer.
    w.attempts()
        .patch(
            &n,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": [runner_manager_crds::CLEANUP_FINALIZER]}})),
        )
        .await
        .unwrap();
    let idle = w.started_to_idle(&a).await;
    let pid = pid_of(&idle);
    w.attempts()
        .delete(&n, &DeleteParams::default())
        .await
        .unwrap();
    w.deregister(&a).await.unwrap();
    let done = w
        .wait_state(&n, AttemptState::Cleaned)
        .await
        .unwrap_or_else(|e| panic!("{e}: {:?}", agent.lines()));
    assert!(done.metadata.deletion_timestamp.is_some());
    assert_eq!(outcome(&done), Some(Outcome::ExitedIdleWithoutWork));
    assert!(!pid_alive(pid));
    assert_eq!(
        done.metadata.finalizers.as_deref(),
        Some(&[runner_manager_crds::CLEANUP_FINALIZER.to_owned()][..]),
        "the agent never removes the finalizer"
    );
    assert_settled(&w, &a, 1).await;
    // The operator's part: the finalizer goes once the attempt is Cleaned.
    w.attempts()
        .patch(
            &n,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_identity_keeps_recovery_incomplete_and_says_why() {
    let Some(w) = AgentWorld::start("an_unreadable_identity_keeps_recovery_incomplete").await
    else {
        return;
    };
    let mut agent = w
        .agent(4, &[("RM_AGENT_FAULT", "after-spawn-before-starting")])
        .unwrap();
    w.wait_recovered().await.unwrap();
    let (a, n) = w.pending_named().await;
    assert!(!wait_exit(&mut agent).await.success());
    drop(agent);
    let jit_received = w.attempts().get(&n).await.unwrap();
    let journal = journal_of(&jit_received);
    assert_eq!(journal.state(), AttemptState::JitReceived);
    let identity_file = std::path::Path::new(journal.workspace().unwrap().runtime_path())
        .join(".runner-process.json");
    let original = std::fs::read(&identity_file).unwrap();
    std::fs::write(&identity_file, b"{ not an identity").unwrap();

    let _again = w.agent(4, &[]).unwrap();
    let blocked = wait::until(STEP, "the Lease to say recovery is blocked", || async {
        w.advert().await.filter(|a| a.recovery_blocked.is_some())
    })
    .await
    .unwrap();
    assert!(!blocked.recovery_complete);
    assert_eq!(
        blocked.recovery_blocked,
        Some(runner_manager_crds::lease::RecoveryBlocked::IdentityUnreadable)
    );
    w.wait_event(&n, "RecoveryBlocked").await;
    // Nothing is admitted while blocked: the new attempt stays `Pending`, nothing is minted.
    let waiting = w.pending_attempt().await.unwrap();
    heartbeats(&w, 3).await;
    still_pending_with_one_mint(&w, &name(&waiting), "admitted while recovery was blocked").await;

    // A person restores the identity: the runner is re-adopted and recovery completes.
    std::fs::write(&identity_file, &original).unwrap();
    w.wait_recovered().await.unwrap();
    w.wait_state(&n, AttemptState::Starting).await.unwrap();
    for x in [&a, &waiting] {
        w.wait_from(&name(x), AttemptState::Starting, "Starting")
            .await;
        w.bring_to_idle(x).await;
        stop_idle(&w, x, "ScaleDown").await;
    }
    for x in [&a, &waiting] {
        w.wait_state(&name(x), AttemptState::Cleaned).await.unwrap();
    }
    assert_settled(&w, &a, 2).await;
    assert_settled(&w, &waiting, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_slot_keeps_its_work_and_its_account_across_attempts() {
    use runner_manager_crds::policy::WorkspaceMode;
    let Some(w) = AgentWorld::start("a_persistent_slot_keeps_its_work").await else {
        return;
    };
    let _agent = w.serving().await;
    let mut uids = Vec::new();
    for round in 1..=2 {
        let a = w
            .pending_attempt_with(|s| s.workspace = WorkspaceMode::Persistent)
            .await
            .unwrap();
        let n = name(&a);
        let started = w.wait_from(&n, AttemptState::Starting, "Starting").await;
        let placement = journal_of(&started).workspace().unwrap().clone();
        assert_eq!(
            placement.slot_number(),
            Some(1),
            "round {round}: the lowest free slot"
        );
        let slot = std::path::PathBuf::from(placement.runtime_path());
        uids.push(std::os::unix::fs::MetadataExt::uid(
            &std::fs::metadata(&slot).unwrap(),
        ));
        w.bring_to_idle(&a).await;
        let job = w.queue_job(0).await.unwrap();
        w.wait_assigned(job).await.unwrap();
        w.set_job(&n, job).await.unwrap();
        let done = w
            .wait_concluded_saying(&n, Outcome::CompletedJob, &format!("round {round}"))
            .await;
        let left = names_in(&slot);
        assert!(
            left.iter().all(|e| e == "_work"),
            "round {round}: the scrub keeps only _work: {left:?}"
        );
        assert!(w.registrations(&done).await.unwrap().is_empty());
        let free = wait::until(STEP, "the cleaned slot advertised", || async {
            w.advert()
                .await
                .and_then(|a| a.free_slots.get(&w.policy_uid).copied())
        })
        .await
        .unwrap();
        assert_eq!(free, 1);
    }
    assert_eq!(uids[0], uids[1], "the slot's account is bound to it");
    assert!(w.handoff_files().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_never_listed_online_is_stopped_at_its_registration_deadline() {
    let Some(w) = AgentWorld::start("a_runner_never_listed_online").await else {
        return;
    };
    let _agent = w.serving().await;
    let (a, n, started) = started_with_a_short_registration(&w).await;
    let pid = pid_of(&started);
    // The operator never reports it online: the agent's own deadline stops it, in order.
    let done = w
        .wait_concluded(
            &n,
            Outcome::Failed(FailureReason::TerminatedAfterRegistrationTimeout),
        )
        .await;
    assert!(outcome(&done).unwrap().wants_replacement());
    assert!(!pid_alive(pid));
    deregistered_and_settled(&w, &done, &a, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_spec_is_refused_but_the_runner_is_still_stopped_and_cleaned() {
    let Some(w) = AgentWorld::start("a_changed_spec_is_refused").await else {
        return;
    };
    let (_agent, a, n) = idle_with_a_changed_spec(&w).await;
    w.wait_event(&n, "SpecChanged").await;
    stop_idle(&w, &a, "IdleTimeout").await;
    w.wait_concluded(&n, Outcome::ExitedIdleWithoutWork).await;
    assert_settled(&w, &a, 1).await;
}

/// An idle runner whose spec is edited, then takes a job and exits: its path is `AssignJob`
/// then `Conclude(CompletedJob)` in one write. The `AssignJob` records what the runner already
/// did, so the changed spec does not refuse it (before, the whole write was refused, the
/// reconcile retried forever and the attempt held its capacity and workspace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_takes_a_job_under_a_changed_spec_still_concludes_and_cleans() {
    let Some(w) = AgentWorld::start("a_job_under_a_changed_spec").await else {
        return;
    };
    let (_agent, a, n) = idle_with_a_changed_spec(&w).await;
    wait::until(STEP, "a SpecChanged warning on the attempt", || async {
        warnings_on(&w, &n)
            .await
            .iter()
            .any(|r| r.starts_with("Some(\"SpecChanged\")"))
            .then_some(())
    })
    .await
    .unwrap();
    // Taken between two passes, no job fact written: the exit walks `AssignJob` first.
    w.queue_job(100).await.unwrap();
    w.wait_concluded(&n, Outcome::CompletedJob).await;
    assert_settled(&w, &a, 1).await;
}

/// SIGKILL a runner process (as the OOM killer would) and wait until it is gone.
async fn kill_runner(pid: u32) {
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    wait::until(STEP, "the runner process gone", || {
        let alive = pid_alive(pid);
        async move { (!alive).then_some(()) }
    })
    .await
    .unwrap();
}

/// Waits until the agent's log has a line with every one of `needles`.
async fn wait_logged(agent: &Running, what: &str, needles: &[&str]) {
    wait::until(STEP, what, || {
        let seen = agent
            .lines()
            .iter()
            .any(|l| needles.iter().all(|n| l.contains(n)));
        async move { seen.then_some(()) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?}", agent.lines()));
}

/// Warning events on the attempt named `n`.
async fn warnings_on(w: &AgentWorld, n: &str) -> Vec<String> {
    let events =
        kube::Api::<k8s_openapi::api::core::v1::Event>::namespaced(w.kube.clone(), &w.team);
    list_all(&events)
        .await
        .into_iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(n) && e.type_.as_deref() == Some("Warning")
        })
        .map(|e| format!("{:?}: {:?}", e.reason, e.message))
        .collect()
}

/// Issue 20, item 2 (the two `Orphaned(ProcessLost)` runners of the 50-job burst): the
/// operator's ordered termination deregisters an idle runner first, the runner exits as its
/// registration goes, and `spec.termination` lands only after; meanwhile the last fact still
/// lists the runner online and idle, which read as a lost process. The test forces that
/// interleaving: deregistered, the runner seen dead by the agent, only then the request. The
/// agent waits for a witness newer than the exit and concludes by the request
/// (`ExitedIdleWithoutWork`, not a failure). A runner whose request never comes is lost once
/// the grace has passed: the wait is bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_runner_deregistered_before_its_stop_request_is_not_lost() {
    let Some(w) = AgentWorld::start("an_idle_runner_deregistered_before_its_stop_request").await
    else {
        return;
    };
    let agent = w.serving().await;
    let mut settled = Vec::new();
    for requested in [true, false] {
        let (a, n) = w.pending_named().await;
        w.wait_state(&n, AttemptState::Starting).await.unwrap();
        let pid = pid_of(&w.bring_to_idle(&a).await);
        w.deregister(&a).await.unwrap();
        wait::until(STEP, "the runner to exit as its registration goes", || {
            let alive = pid_alive(pid);
            async move { (!alive).then_some(()) }
        })
        .await
        .unwrap();
        // The agent has seen the exit and holds the conclusion (before the fix it concluded
        // `Orphaned(ProcessLost)` here, on the fact the operator had not yet replaced).
        let held = wait::until(STEP, "the agent to see the exit", || {
            let logged = agent
                .lines()
                .iter()
                .any(|l| l.contains("waiting up to") && l.contains(&n));
            let api = w.attempts();
            let n = n.clone();
            async move {
                if logged {
                    return Some(None);
                }
                let now = api.get(&n).await.ok()?;
                outcome(&now).map(Some)
            }
        })
        .await
        .unwrap();
        assert_eq!(held, None, "concluded on a fact older than the exit");
        let expected = if requested {
            w.request_termination(&n, "ScaleDown").await.unwrap();
            Outcome::ExitedIdleWithoutWork
        } else {
            // Nobody asked: GitHub still lists it, no process: lost, after the grace.
            Outcome::Orphaned(runner_manager_crds::outcome::OrphanReason::ProcessLost)
        };
        w.wait_concluded_saying(&n, expected, &format!("requested: {requested}"))
            .await;
        settled.push(a);
    }
    for a in &settled {
        assert_settled(&w, a, 2).await;
    }
}

/// A runner found dead is concluded only on a witness that decides (parity rows 54, 43, 30, 55,
/// 50). An agent restarted while the operator's fact says GitHub is `unreachable` keeps recovery
/// incomplete (`GitHubUnreachable` on the Lease) and a new attempt waits `Pending`, nothing
/// minted; an idle runner that dies meanwhile concludes nothing. Once GitHub answers it is not
/// listed, past the idle timeout, the runner is `ExitedIdleWithoutWork` (not a failure in the
/// journal or the events) and recovery completes. A busy runner whose process dies and that
/// GitHub does not list is `Orphaned(ProcessLost)`, never guessed a success, and cleaned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_deaths_are_concluded_only_on_a_witness_that_decides() {
    use runner_manager_crds::duration::ManifestDuration;
    use runner_manager_crds::lease::RecoveryBlocked;
    let Some(w) = AgentWorld::start("runner_deaths_are_concluded_only_on_a_witness").await else {
        return;
    };
    let first = w.serving().await;
    let idle_timeout = 6;
    let a = w
        .pending_attempt_with(|s| s.timeouts.idle = ManifestDuration::from_secs(idle_timeout))
        .await
        .unwrap();
    let n = name(&a);
    let idle = w.started_to_idle(&a).await;
    // GitHub stops answering (the operator writes `unreachable`) and the agent restarts.
    w.set_github_status(&n, "unreachable", false, 2)
        .await
        .unwrap();
    drop(first);
    let _agent = w.agent(4, &[]).unwrap();
    let blocked = wait::until(STEP, "the Lease to say GitHub is unreachable", || async {
        w.advert()
            .await
            .filter(|a| a.recovery_blocked == Some(RecoveryBlocked::GitHubUnreachable))
    })
    .await
    .unwrap();
    assert!(!blocked.recovery_complete);
    let b = w.pending_attempt().await.unwrap();
    let nb = name(&b);
    // The runner dies while GitHub cannot say whether it is listed.
    kill_runner(pid_of(&idle)).await;
    heartbeats(&w, 3).await;
    let waiting = w.attempts().get(&n).await.unwrap();
    assert_eq!(
        journal_of(&waiting).state(),
        AttemptState::Idle,
        "concluded while GitHub was unreachable"
    );
    still_pending_with_one_mint(&w, &nb, "admitted while recovery was incomplete").await;
    // Past the idle timeout (measured from `Idle`), GitHub answers: not listed.
    let idle_since = journal_of(&idle)
        .timestamps()
        .last_state_change_at
        .clone()
        .unwrap()
        .0;
    wait::until(STEP, "the idle timeout to pass", || async {
        let elapsed = k8s_openapi::jiff::Timestamp::now().duration_since(idle_since);
        (elapsed.as_secs() > i64::try_from(idle_timeout).unwrap()).then_some(())
    })
    .await
    .unwrap();
    w.set_github_status(&n, "absent", false, 3).await.unwrap();
    let done = w.wait_concluded(&n, Outcome::ExitedIdleWithoutWork).await;
    assert!(!outcome(&done).unwrap().is_failure());
    assert!(!outcome(&done).unwrap().wants_replacement());
    let warnings = warnings_on(&w, &n).await;
    assert!(
        warnings.iter().all(|e| e.contains("RecoveryBlocked")),
        "{warnings:?}"
    );
    w.wait_recovered().await.unwrap();

    // The attempt that waited launches; busy, its runner dies and GitHub does not list it.
    w.wait_state(&nb, AttemptState::Starting).await.unwrap();
    w.bring_to_idle(&b).await;
    w.set_job(&nb, 4242).await.unwrap();
    let busy = w.wait_state(&nb, AttemptState::Busy).await.unwrap();
    kill_runner(pid_of(&busy)).await;
    w.set_github_status(&nb, "absent", false, 2).await.unwrap();
    w.wait_concluded(
        &nb,
        Outcome::Orphaned(runner_manager_crds::outcome::OrphanReason::ProcessLost),
    )
    .await;
    for x in [&a, &b] {
        deregistered_and_settled(&w, x, x, 2).await;
    }
}

/// A job too short to be seen busy is a completed job, from `Starting` and from `Idle` (parity
/// rows 38, 39): no fact says busy and no job fact is written; the runner takes the job, runs it
/// and exits cleanly, and its `_diag` (a `Worker_*.log`) decides `CompletedJob`, walking the
/// `AssignJob` edge first. A live busy runner whose assignment GitHub withdraws, with only the
/// listener's log, goes back to `Idle` and its idle clock restarts; with a worker's log it stays
/// `Busy` and its exit is a completed job (row 42).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_evidence_decides_short_jobs_and_withdrawn_assignments() {
    let Some(w) = AgentWorld::start("job_evidence_decides_short_jobs").await else {
        return;
    };
    let _agent = w.serving().await;

    // Row 38: the job is queued before the runner connects; the agent never sees it busy.
    let job = w.queue_job(100).await.unwrap();
    let (a, n) = w.pending_named().await;
    let done = w.wait_concluded(&n, Outcome::CompletedJob).await;
    assert_eq!(
        w.wait_assigned(job).await.unwrap(),
        runner_manager_crds::names::runner_name(a.spec.attempt_uuid().unwrap())
    );
    assert!(done.status.as_ref().unwrap().facts.github.is_none());

    // Row 39: from `Idle`, the job taken between two passes, no job fact written.
    let b = w.pending_attempt().await.unwrap();
    let nb = name(&b);
    w.wait_state(&nb, AttemptState::Starting).await.unwrap();
    w.bring_to_idle(&b).await;
    w.queue_job(100).await.unwrap();
    let done = w.wait_concluded(&nb, Outcome::CompletedJob).await;
    assert!(done.status.as_ref().unwrap().facts.job.is_none());

    // Row 42: an assignment withdrawn from a live runner.
    let c = w.pending_attempt().await.unwrap();
    let nc = name(&c);
    w.wait_state(&nc, AttemptState::Starting).await.unwrap();
    let idle = w.bring_to_idle(&c).await;
    let first_idle = journal_of(&idle)
        .timestamps()
        .last_state_change_at
        .clone()
        .map(|t| t.0);
    w.set_github(&nc, true, true, 2).await.unwrap();
    w.wait_state(&nc, AttemptState::Busy).await.unwrap();
    w.set_github(&nc, true, false, 3).await.unwrap();
    let back = w.wait_state(&nc, AttemptState::Idle).await.unwrap();
    let journal = journal_of(&back);
    assert!(
        journal
            .timestamps()
            .last_state_change_at
            .clone()
            .map(|t| t.0)
            >= first_idle,
        "the idle clock restarted (the wire has whole seconds; the edge's own rule is \
         crds/tests/journal.rs::assignment_not_taken_restarts_the_idle_clock)"
    );
    assert!(pid_alive(journal.process().unwrap().pid));
    // Busy again, and this time the worker started: its log keeps the runner busy.
    w.set_github(&nc, true, true, 4).await.unwrap();
    let busy = w.wait_state(&nc, AttemptState::Busy).await.unwrap();
    let diag = runtime_path(&busy).join("_diag");
    std::fs::write(diag.join("Worker_20260101-000000-utc.log"), b"").unwrap();
    w.set_github(&nc, true, false, 5).await.unwrap();
    heartbeats(&w, 2).await;
    let still = w.attempts().get(&nc).await.unwrap();
    assert_eq!(journal_of(&still).state(), AttemptState::Busy);
    kill_runner(pid_of(&busy)).await;
    w.wait_concluded(&nc, Outcome::CompletedJob).await;

    // Row 45: no `_diag` at all, an exit at `Starting`: still a failure, never a completed job.
    let d = w.pending_attempt().await.unwrap();
    let nd = name(&d);
    let started = w.wait_state(&nd, AttemptState::Starting).await.unwrap();
    w.wait_online(&d).await.unwrap();
    let runtime = runtime_path(&started);
    std::fs::remove_dir_all(runtime.join("_diag")).unwrap();
    w.deregister(&d).await.unwrap();
    w.wait_concluded(
        &nd,
        Outcome::Failed(FailureReason::ProcessExitedUnexpectedly),
    )
    .await;
    for x in [&a, &b, &c, &d] {
        deregistered_and_settled(&w, x, x, 4).await;
    }
}

/// A launch that fails at registration still reports its step timings (parity row 21): GitHub
/// refuses the mint with a 403, which the broker does not retry (one call, parity row 32 in
/// part); the attempt concludes `JitRequestFailed` with `status.launch` written in the same CAS:
/// the package step measured (a cold download), the spawn never reached and read 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_that_fails_at_registration_still_reports_its_timings() {
    let Some(w) = AgentWorld::start("a_launch_that_fails_at_registration").await else {
        return;
    };
    // GitHub will refuse the attempt's mint: set before the agent is there to ask.
    w.fake
        .fault(serde_json::json!({"endpoint": "generate_jitconfig", "count": 1, "status": 403}))
        .await
        .unwrap();
    let agent = w.serving().await;
    let (_, n) = w.pending_named().await;
    let done = w
        .wait_concluded(&n, Outcome::Failed(FailureReason::JitRequestFailed))
        .await;
    let launch = journal_of(&done)
        .launch
        .clone()
        .expect("no status.launch on a failed launch");
    print_launch("failed at registration", &done);
    assert!(launch.package_downloaded, "a cold launch downloads");
    assert_eq!(launch.spawn_ms, 0, "never spawned");
    let counters = w.fake.counters().await.unwrap();
    assert_eq!(
        counters["generate_jitconfig"],
        serde_json::json!({"403": 1}),
        "a 403 is never retried"
    );
    wait_logged(&agent, "the failed launch at warn", &["launch failed", &n]).await;
    assert!(w.runtimes().is_empty());
}

/// The termination intent (parity rows 58, 57). An intent that cannot be made durable (a
/// directory stands where its file goes) means no signal and no conclusion: the runner lives on
/// `Idle`, the agent says why, and the stop goes ahead once the intent can be written. A
/// registration-timeout intent written just before a crash, whose runner then died, concludes
/// `TerminatedAfterRegistrationTimeout` for the restarted agent (the operator replaces it once:
/// `end_to_end.rs::a_runner_that_never_registers_is_stopped_and_its_job_runs_elsewhere`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_termination_intent_is_durable_before_any_signal_and_outlives_a_crash() {
    let Some(w) = AgentWorld::start("the_termination_intent_is_durable").await else {
        return;
    };
    let (agent, a, n, idle) = w.serving_idle().await;
    let intent = runtime_path(&idle).join(".terminate-intent");
    let pid = pid_of(&idle);
    std::fs::create_dir(&intent).unwrap();
    // The request alone: a deregistration would end the runner by itself.
    w.request_termination(&n, "IdleTimeout").await.unwrap();
    wait_logged(
        &agent,
        "the agent to say the intent is not durable",
        &["termination intent not durable", &n],
    )
    .await;
    heartbeats(&w, 2).await;
    assert!(pid_alive(pid), "signalled without a durable intent");
    let still = w.attempts().get(&n).await.unwrap();
    assert_eq!(journal_of(&still).state(), AttemptState::Idle);
    std::fs::remove_dir(&intent).unwrap();
    w.wait_concluded(&n, Outcome::ExitedIdleWithoutWork).await;
    assert!(!pid_alive(pid));
    deregistered_and_settled(&w, &a, &a, 1).await;
    drop(agent);

    // Row 57: the registration deadline's intent, then a crash before any signal.
    let mut crashing = w
        .agent(4, &[("RM_AGENT_FAULT", "after-termination-intent")])
        .unwrap();
    w.wait_recovered().await.unwrap();
    let (b, nb, started) = started_with_a_short_registration(&w).await;
    assert!(!wait_exit(&mut crashing).await.success());
    drop(crashing);
    let pid = pid_of(&started);
    assert!(pid_alive(pid), "signalled before the crash");
    kill_runner(pid).await;
    let _again = w.agent(4, &[]).unwrap();
    let done = w
        .wait_concluded(
            &nb,
            Outcome::Failed(FailureReason::TerminatedAfterRegistrationTimeout),
        )
        .await;
    deregistered_and_settled(&w, &done, &b, 2).await;
}

/// The runner's environment (parity rows 70, 72): `runner.env` over the platform defaults, the
/// runtime's `tmp` last for `TMPDIR`/`TEMP`/`TMP`, no `USERPROFILE` and no home directory; and a
/// `runner.env` the agent refuses (it would move the runner's tmp) is rejected at admission,
/// before a workspace, a package or a JIT, without its value in the event or the log. The
/// listener runs at the agent's `--runner-nice` (10 by default) below the agent's priority: a
/// node's running jobs do not starve the next launch (issue 32).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_environment_is_layered_and_a_refused_one_stops_before_any_effect() {
    let Some(w) = AgentWorld::start("the_runner_environment_is_layered").await else {
        return;
    };
    let agent = w.serving().await;
    let a = w
        .pending_attempt_with(|s| {
            s.env
                .insert("TEAM_SETTING".into(), "from-runner-env".into());
            s.env.insert(
                "POWERSHELL_TELEMETRY_OPTOUT".into(),
                "0-from-runner-env".into(),
            );
        })
        .await
        .unwrap();
    let n = name(&a);
    let started = w.wait_state(&n, AttemptState::Starting).await.unwrap();
    let runtime = runtime_path(&started);
    let niceness = |pid: u32| -> i64 {
        // Field 19 of stat; the fields after the command's closing parenthesis start at 3.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let rest = &stat[stat.rfind(')').unwrap() + 1..];
        rest.split_whitespace()
            .nth(19 - 3)
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(
        niceness(pid_of(&started)) - niceness(std::process::id()),
        10,
        "the listener runs --runner-nice below the agent (here: below the test)"
    );
    // And so does its session's scheduler autogroup, where the kernel has them: the helper's
    // `setsid` made one, which the scheduler weighs against the agent's whatever its threads'
    // niceness.
    if let Ok(group) = std::fs::read_to_string(format!("/proc/{}/autogroup", pid_of(&started))) {
        assert!(group.trim_end().ends_with("nice 10"), "{group}");
    }
    let environ = std::fs::read(format!("/proc/{}/environ", pid_of(&started))).unwrap();
    let env: std::collections::BTreeMap<String, String> = environ
        .split(|b| *b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        })
        .collect();
    assert_eq!(env["TEAM_SETTING"], "from-runner-env");
    assert_eq!(
        env["POWERSHELL_TELEMETRY_OPTOUT"], "0-from-runner-env",
        "runner.env wins over the platform defaults"
    );
    assert_eq!(
        env["ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE"],
        "1"
    );
    for tmp in ["TMPDIR", "TEMP", "TMP"] {
        assert_eq!(env[tmp], format!("{}/tmp", runtime.display()), "{tmp}");
    }
    // Names only in messages: the listener's environment holds its JIT.
    let names: Vec<&String> = env.keys().collect();
    assert!(!env.contains_key("USERPROFILE"), "{names:?}");
    assert!(!env.contains_key("HOME"), "{names:?}");
    assert!(
        !std::path::Path::new(&runtime).join("home").exists()
            && !std::path::Path::new(&runtime).join("profile").exists(),
        "a home directory in the attempt"
    );
    w.bring_to_idle(&a).await;
    stop_idle(&w, &a, "ScaleDown").await;
    assert_settled(&w, &a, 1).await;

    let secret_like = "value-that-must-not-be-echoed-7f3a";
    let (_, mints_before) = w.second_sessions_and_mints().await.unwrap();
    let refused = w
        .pending_attempt_with(|s| {
            s.env.insert("TMPDIR".into(), secret_like.into());
        })
        .await
        .unwrap();
    let nr = name(&refused);
    let done = w
        .wait_concluded(&nr, Outcome::Rejected(RejectReason::SnapshotUnusable))
        .await;
    assert!(journal_of(&done).workspace().is_none());
    let (_, mints_after) = w.second_sessions_and_mints().await.unwrap();
    assert_eq!(mints_after, mints_before, "a JIT was minted");
    assert!(w.runtimes().is_empty());
    let warnings = wait::until(STEP, "the Rejected event", || async {
        let found = warnings_on(&w, &nr).await;
        (!found.is_empty()).then_some(found)
    })
    .await
    .unwrap();
    assert!(
        warnings.iter().all(|e| !e.contains(secret_like)),
        "{warnings:?}"
    );
    assert!(
        agent.lines().iter().all(|l| !l.contains(secret_like)),
        "the refused value in the agent's log"
    );
}

// ---- Issue 20, part B: orphans, late residue, blocked removals across restarts, pruning, and
// ---- persistent slots after restarts and policy changes (docs/parity.md groups M, N, O, P).

fn short_of(a: &RunnerAttempt) -> String {
    runner_manager_crds::names::short_hex(a.spec.attempt_uuid().unwrap())
}

/// Waits until `check` holds of the host (files, processes).
async fn until_host(what: &str, check: impl Fn() -> bool) {
    wait::until(STEP, what, || {
        let ok = check();
        async move { ok.then_some(()) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// The agent's default (`--materialize auto`) lays packages by overlay where the probe mount
/// succeeds (this host's ext4 `/tmp`), and a world that goes while its agent's runtimes are mounted
/// (the agent killed, its runner live) leaves no mount behind: the world unmounts its agents'
/// overlays before its scratch directory goes. Before, only an agent world did, and the product
/// worlds of the other suites left one mount per live runtime in the machine's mount table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_materializer_is_the_overlay_and_a_world_leaves_no_mount_behind() {
    use runner_manager_node_agent::packages::overlay;
    let Some(w) = AgentWorld::start("the_default_materializer_is_the_overlay").await else {
        return;
    };
    let scratch = w.scratch().to_path_buf();
    let agent = w.serving().await;
    assert_logged(&agent, "packages are laid into runtimes by overlay");
    let a = w.pending_attempt().await.unwrap();
    let runtime = runtime_path(&w.bring_to_idle(&a).await);
    assert_eq!(overlay::overlays_under(&scratch).unwrap(), vec![runtime]);
    drop(agent);
    drop(w);
    assert_eq!(
        overlay::overlays_under(&scratch).unwrap(),
        Vec::<std::path::PathBuf>::new(),
        "mounts left behind"
    );
}

/// An attempt on a persistent slot deleted without its finalizer while its runner lives, with the
/// overlay materialize: slots are never removed, so before its slot and package leases are
/// released the sweep unmounts the slot and removes its overlay workdir (before: the slot stayed
/// mounted for good, and its next attempt found it not reusable).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_slot_attempt_s_overlay_is_unmounted_before_its_slot_is_released() {
    use kube::api::DeleteParams;
    use runner_manager_crds::policy::WorkspaceMode;
    use runner_manager_node_agent::packages::overlay;
    let Some(w) = AgentWorld::start("abandoned_slot_overlay").await else {
        return;
    };
    let _agent = w.serving_with(&[("RM_MATERIALIZE", "overlay")]).await;
    let a = w
        .pending_attempt_with(|s| s.workspace = WorkspaceMode::Persistent)
        .await
        .unwrap();
    let idle = w.bring_to_idle(&a).await;
    let pid = pid_of(&idle);
    let slot = runtime_path(&idle);
    assert!(
        overlay::is_mounted(&slot).unwrap(),
        "materialized by overlay"
    );
    w.attempts()
        .delete(&name(&a), &DeleteParams::default())
        .await
        .unwrap();
    until_host(
        "the abandoned slot's runner stopped and its overlay unmounted",
        || !pid_alive(pid) && !overlay::is_mounted(&slot).unwrap(),
    )
    .await;
    until_host("the slot's overlay workdir removed", || {
        !overlay::work_dir(&slot).unwrap().exists()
    })
    .await;
    assert!(slot.is_dir(), "slots are never removed");
}

/// Orphan discovery: an attempt deleted without its finalizer while its runner lives (before:
/// its task ended on the 404 and the runner, cgroup and runtime were forgotten), a late child
/// recreating a `Cleaned` attempt's runtime (row 24), and an attempt deleted while the agent was
/// down (found by the sweep after the next start's first list), with a handoff left in a slot
/// no attempt leases. Each is stopped and removed and said in one line; a live attempt, a
/// directory of another name under `runners/` and a cgroup of another name are never touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_an_attempt_deleted_without_its_finalizer_leaves_is_stopped_and_removed() {
    use kube::api::DeleteParams;
    let Some(w) = AgentWorld::start("orphans_are_stopped_and_removed").await else {
        return;
    };
    let mut agent = w.serving().await;
    // A live attempt every sweep must leave alone.
    let keep = w.pending_attempt().await.unwrap();
    let kept = w.bring_to_idle(&keep).await;
    let keep_pid = pid_of(&kept);

    // Deleted while its runner lives.
    let (a, pid, runtime, cgroup) = idle_runner(&w).await;
    assert!(cgroup.is_dir() && runtime.is_dir());
    w.attempts()
        .delete(&name(&a), &DeleteParams::default())
        .await
        .unwrap();
    until_host("the deleted attempt's runner stopped and removed", || {
        !pid_alive(pid) && !runtime.exists() && !cgroup.exists()
    })
    .await;
    // What it held is released once nothing of it runs: only `keep` counts.
    wait::until(STEP, "the deleted attempt's capacity released", || async {
        w.advert().await.filter(|ad| ad.free == 3)
    })
    .await
    .unwrap();

    // A late child recreating a cleaned attempt's runtime: reaped, the attempt stays Cleaned.
    let b = w.pending_attempt().await.unwrap();
    let b_idle = w.bring_to_idle(&b).await;
    stop_idle(&w, &b, "ScaleDown").await;
    let b_done = w
        .wait_state(&name(&b), AttemptState::Cleaned)
        .await
        .unwrap();
    let residue = runtime_path(&b_idle);
    std::fs::create_dir_all(residue.join("_work").join("late")).unwrap();
    std::fs::write(residue.join("_work").join("late").join("out.log"), b"x").unwrap();
    until_host("the late residue reaped", || !residue.exists()).await;
    let b_now = w.attempts().get(&name(&b)).await.unwrap();
    assert_eq!(journal_of(&b_now).state(), AttemptState::Cleaned);
    assert_eq!(outcome(&b_now), outcome(&b_done));

    // Deleted while the agent is down.
    let (c, c_pid, c_runtime, c_cgroup) = idle_runner(&w).await;
    agent.terminate().unwrap();
    assert!(wait_exit(&mut agent).await.success());
    drop(agent);
    w.attempts()
        .delete(&name(&c), &DeleteParams::default())
        .await
        .unwrap();
    assert!(pid_alive(c_pid), "the runner outlives the agent");
    let slot = w
        .host_root()
        .join("slots")
        .join(&w.team)
        .join(&w.policy_uid)
        .join("s3");
    std::fs::create_dir_all(&slot).unwrap();
    let handoff = slot.join(format!("jit-{}.tmp", uuid::Uuid::new_v4()));
    std::fs::write(&handoff, b"spent").unwrap();
    std::fs::write(slot.join("_keep"), b"a slot's content is not the sweep's").unwrap();
    let stranger = w.host_root().join("runners").join("not-an-attempt");
    std::fs::create_dir_all(&stranger).unwrap();
    // A job gate its attempt's cleanup never removed (as if the attempt were deleted without
    // its finalizer), and a stranger among the gates.
    let gate = w.host_root().join("gates").join(short_of(&c));
    std::fs::create_dir_all(&gate).unwrap();
    std::fs::write(gate.join("job-started.sh"), b"#!/bin/sh\n").unwrap();
    let stranger_gate = w.host_root().join("gates").join("not-an-attempt");
    std::fs::create_dir_all(&stranger_gate).unwrap();
    // A dependency cache its attempt's cleanup never released, mounted, with a trusted verdict
    // and a write: the sweep unmounts it and discards the write (nothing says its job finished).
    let caches = runner_manager_node_agent::caches::CacheRoot::new(w.host_root(), 0, u64::MAX);
    let cache_ns = "team/github.com/acme/web";
    let cache_mount = caches.attach(&short_of(&c), cache_ns, 0).unwrap();
    std::fs::write(cache_mount.join("planted"), b"x").unwrap();
    caches.keep_writes(&short_of(&c)).unwrap();
    let cache_dir = cache_mount.parent().unwrap().to_path_buf();
    let generations = caches.path().join("ns").join(cache_ns);
    let other_cgroup = w.cgroup_dir().join("other");
    std::fs::create_dir(&other_cgroup).unwrap();

    let again = w.serving().await;
    until_host("what the down agent's deleted attempt left removed", || {
        !pid_alive(c_pid)
            && !c_runtime.exists()
            && !c_cgroup.exists()
            && !handoff.exists()
            && !gate.exists()
            && !cache_dir.exists()
    })
    .await;
    assert!(
        !generations.join("gen-1").exists() && !generations.join("gen-0/planted").exists(),
        "an orphan cache's writes are discarded, never committed"
    );
    assert!(
        !runner_manager_node_agent::mounts::mount_points()
            .unwrap()
            .iter()
            .any(|m| m.path == cache_mount),
        "the orphan cache is unmounted"
    );
    assert!(
        stranger_gate.is_dir(),
        "a gate name no attempt derives is never removed"
    );
    assert!(
        stranger.is_dir(),
        "a name no attempt uuid derives is never removed"
    );
    assert!(other_cgroup.is_dir());
    assert!(slot.join("_keep").exists(), "slots are never removed");
    std::fs::remove_dir(&other_cgroup).unwrap();
    wait::until(STEP, "the sweep's line", || {
        let seen = again.lines().iter().any(|l| {
            l.contains("orphans removed")
                && l.contains(&short_of(&c))
                && l.contains("1 runner(s) stopped")
        });
        async move { seen.then_some(()) }
    })
    .await
    .unwrap();

    // The live attempt was never touched and is supervised as before.
    assert!(pid_alive(keep_pid));
    assert!(runtime_path(&kept).is_dir());
    stop_idle(&w, &keep, "ScaleDown").await;
    w.wait_concluded(&name(&keep), Outcome::ExitedIdleWithoutWork)
        .await;
    assert!(!pid_alive(keep_pid));
}

/// A runtime that cannot be removed across agent restarts (rows 25, 26, 93): an uncleaned
/// attempt's blocked runtime beside the blocked late residue of a `Cleaned` one. Each start's
/// recovery completes past both; the blocked attempt stays concluded and not `Cleaned` under its
/// `CleanupDeferred` condition and event, the cleaned one stays `Cleaned`; once unblocked both
/// are removed and the first is cleaned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_removals_never_block_recovery_and_are_finished_once_unblocked() {
    use k8s_openapi::api::core::v1::Event;
    let Some(w) = AgentWorld::start("blocked_removals_never_block_recovery").await else {
        return;
    };
    let (mut agent, a, n) = w.serving_one().await;
    let a_runtime = runtime_path(&w.bring_to_idle(&a).await);
    let pin_a = Pinned::set(a_runtime.join("pinned")).unwrap();
    stop_idle(&w, &a, "ScaleDown").await;
    w.wait_for(&n, "a CleanupDeferred condition", |s| {
        s.journal.conditions.iter().any(|c| {
            format!("{:?}", c.type_) == "CleanupDeferred"
                && c.status == runner_manager_crds::conditions::ConditionStatus::True
        })
    })
    .await
    .unwrap();

    let b = w.pending_attempt().await.unwrap();
    let b_runtime = runtime_path(&w.bring_to_idle(&b).await);
    stop_idle(&w, &b, "ScaleDown").await;
    w.wait_state(&name(&b), AttemptState::Cleaned)
        .await
        .unwrap();
    std::fs::create_dir_all(b_runtime.join("_work")).unwrap();
    let pin_b = Pinned::set(b_runtime.join("_work").join("pinned")).unwrap();

    // Two restarts: each start's recovery completes past both blocked removals.
    for round in 0..2 {
        agent.terminate().unwrap();
        assert!(wait_exit(&mut agent).await.success());
        drop(agent);
        agent = w.agent(4, &[]).unwrap();
        w.wait_recovered()
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let short = short_of(&b);
        wait::until(STEP, "the sweep trying the blocked residue", || {
            let seen = agent
                .lines()
                .iter()
                .any(|l| l.contains(&format!("orphan {short} not removed")));
            async move { seen.then_some(()) }
        })
        .await
        .unwrap();
        let a_now = w.attempts().get(&n).await.unwrap();
        let state = journal_of(&a_now).state();
        assert!(
            state.is_concluded() && state != AttemptState::Cleaned,
            "round {round}: {state:?}"
        );
        let b_now = w.attempts().get(&name(&b)).await.unwrap();
        assert_eq!(journal_of(&b_now).state(), AttemptState::Cleaned);
        assert!(a_runtime.exists() && b_runtime.exists());
    }
    let events = kube::Api::<Event>::namespaced(w.kube.clone(), &w.team);
    let list = events.list(&Default::default()).await.unwrap();
    assert!(
        list.items
            .iter()
            .any(|e| e.reason.as_deref() == Some("CleanupDeferred")
                && e.involved_object.name.as_deref() == Some(n.as_str())),
        "a clean-failure event on the blocked attempt"
    );

    drop(pin_a);
    drop(pin_b);
    let done = w.wait_state(&n, AttemptState::Cleaned).await.unwrap();
    let c = condition(&done, "CleanupDeferred").unwrap();
    assert_eq!(format!("{:?}", c.reason), "Resolved");
    until_host("both runtimes removed", || {
        !a_runtime.exists() && !b_runtime.exists()
    })
    .await;
}

/// Every launch prunes obsolete package versions once, under the allocation lock, keeping the
/// version it leased; a version that cannot be removed only warns and the launch goes on
/// (row 68). Before, the agent never pruned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_launch_prunes_obsolete_packages_and_a_failed_prune_only_warns() {
    let Some(w) = AgentWorld::start("every_launch_prunes_obsolete_packages").await else {
        return;
    };
    let packages = w.host_root().join("packages");
    let (old, stuck) = ("a".repeat(64), "b".repeat(64));
    std::fs::create_dir_all(packages.join(&old).join("bin")).unwrap();
    std::fs::write(
        packages.join(&old).join("bin").join("Runner.Listener"),
        b"old",
    )
    .unwrap();
    std::fs::create_dir_all(packages.join(".archives")).unwrap();
    let old_archive = packages.join(".archives").join(format!("{old}.tar.gz"));
    std::fs::write(&old_archive, b"old").unwrap();
    std::fs::create_dir_all(packages.join(&stuck)).unwrap();
    let pin = Pinned::set(packages.join(&stuck).join("pinned")).unwrap();

    let agent = w.serving().await;
    let prunes = || {
        agent
            .lines()
            .iter()
            .filter(|l| l.contains("package prune"))
            .count()
    };
    let a = w.pending_attempt().await.unwrap();
    w.wait_from(&name(&a), AttemptState::Starting, "Starting or later")
        .await;
    assert!(
        !packages.join(&old).exists() && !old_archive.exists(),
        "pruned"
    );
    assert!(packages.join(&stuck).exists());
    assert!(
        packages.join(&w.package.sha256).is_dir(),
        "the launch's own version is kept"
    );
    assert_logged(&agent, "package prune failed");
    assert_eq!(prunes(), 1, "one prune per launch");

    drop(pin);
    let b = w.pending_attempt().await.unwrap();
    w.wait_from(&name(&b), AttemptState::Starting, "Starting or later")
        .await;
    assert!(!packages.join(&stuck).exists());
    assert!(
        packages.join(&w.package.sha256).is_dir(),
        "leased by both: kept"
    );
    assert_eq!(prunes(), 2, "one prune per launch");
    for x in [&a, &b] {
        w.bring_to_idle(x).await;
        stop_idle(&w, x, "ScaleDown").await;
    }
    for x in [&a, &b] {
        w.wait_state(&name(x), AttemptState::Cleaned).await.unwrap();
    }
}

/// Persistent slots through racing admissions, a restart and a policy switched back to
/// ephemeral: two attempts admitted at once get `s1` and `s2` (row 79); a restart leaves the
/// cleaned slots alone, not scrubbing them again (row 29); an ephemeral attempt holds no slot and
/// lives under the host root (row 78), and every old slot with its `_work` is untouched by it
/// and its cleanup (row 95).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_slots_a_restart_and_a_switch_back_to_ephemeral_leave_cleaned_slots_alone() {
    use runner_manager_crds::policy::WorkspaceMode;
    let Some(w) = AgentWorld::start("racing_slots_and_a_switch_back").await else {
        return;
    };
    let mut agent = w.serving().await;
    let (x, y) = tokio::join!(
        w.pending_attempt_with(|s| s.workspace = WorkspaceMode::Persistent),
        w.pending_attempt_with(|s| s.workspace = WorkspaceMode::Persistent),
    );
    let (x, y) = (x.unwrap(), y.unwrap());
    let mut slots = Vec::new();
    for a in [&x, &y] {
        let started = w
            .wait_from(&name(a), AttemptState::Starting, "Starting")
            .await;
        slots.push(
            journal_of(&started)
                .workspace()
                .unwrap()
                .slot_number()
                .unwrap(),
        );
    }
    slots.sort_unstable();
    assert_eq!(
        slots,
        vec![1, 2],
        "two racing admissions never share a slot"
    );
    for a in [&x, &y] {
        w.bring_to_idle(a).await;
        stop_idle(&w, a, "ScaleDown").await;
    }
    for a in [&x, &y] {
        w.wait_state(&name(a), AttemptState::Cleaned).await.unwrap();
    }
    let policy_root = w
        .host_root()
        .join("slots")
        .join(&w.team)
        .join(&w.policy_uid);
    // What a scrub would remove (anything but `_work`) and what it keeps.
    for s in ["s1", "s2"] {
        std::fs::create_dir_all(policy_root.join(s).join("_work")).unwrap();
        std::fs::write(policy_root.join(s).join("_work").join("checkout"), s).unwrap();
        std::fs::write(policy_root.join(s).join("marker"), s).unwrap();
    }

    agent.terminate().unwrap();
    assert!(wait_exit(&mut agent).await.success());
    drop(agent);
    let _again = w.serving().await;
    let free = wait::until(STEP, "both cleaned slots advertised", || async {
        w.advert()
            .await
            .and_then(|a| a.free_slots.get(&w.policy_uid).copied())
            .filter(|n| *n == 2)
    })
    .await
    .unwrap();
    assert_eq!(free, 2);

    // The policy switched back to ephemeral.
    let e = w.pending_attempt().await.unwrap();
    let started = w
        .wait_from(&name(&e), AttemptState::Starting, "Starting")
        .await;
    let placement = journal_of(&started).workspace().unwrap().clone();
    assert_eq!(placement.kind(), WorkspaceMode::Ephemeral);
    assert_eq!(
        placement.slot_number(),
        None,
        "an ephemeral attempt holds no slot"
    );
    assert_eq!(
        std::path::Path::new(placement.runtime_path()),
        w.host_root().join("runners").join(short_of(&e))
    );
    assert_eq!(
        w.advert()
            .await
            .unwrap()
            .free_slots
            .get(&w.policy_uid)
            .copied(),
        Some(2)
    );
    w.bring_to_idle(&e).await;
    stop_idle(&w, &e, "ScaleDown").await;
    w.wait_state(&name(&e), AttemptState::Cleaned)
        .await
        .unwrap();
    for s in ["s1", "s2"] {
        assert_eq!(
            std::fs::read_to_string(policy_root.join(s).join("_work").join("checkout")).unwrap(),
            s
        );
        assert!(
            policy_root.join(s).join("marker").exists(),
            "{s}: a cleaned slot is never scrubbed again"
        );
    }
}

/// A launch rolled back after its package was laid out dispatches on the journalled kind, not on
/// what the directory holds (rows 87, 108): a persistent slot keeps its `_work` and loses the
/// runner material; an ephemeral runtime holding a `_work` goes whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_launch_keeps_a_slot_s_work_and_removes_an_ephemeral_runtime_whole() {
    use runner_manager_crds::policy::WorkspaceMode;
    let Some(w) = AgentWorld::start("a_rolled_back_launch_keeps_a_slot_s_work").await else {
        return;
    };
    for mode in [WorkspaceMode::Persistent, WorkspaceMode::Ephemeral] {
        let mut agent = w
            .agent(4, &[("RM_AGENT_FAULT", "after-materialize")])
            .unwrap();
        w.wait_recovered().await.unwrap();
        let a = w
            .pending_attempt_with(|s| s.workspace = mode)
            .await
            .unwrap();
        assert!(!wait_exit(&mut agent).await.success(), "{mode:?}");
        drop(agent);
        let allocated = w.attempts().get(&name(&a)).await.unwrap();
        let runtime = runtime_path(&allocated);
        assert!(
            runtime.join("bin").is_dir(),
            "{mode:?}: the package was laid out"
        );
        std::fs::create_dir_all(runtime.join("_work")).unwrap();
        std::fs::write(runtime.join("_work").join("checkout"), b"kept?").unwrap();

        let _again = w.agent(4, &[]).unwrap();
        w.wait_concluded(
            &name(&a),
            Outcome::Failed(FailureReason::PreparationInterrupted),
        )
        .await;
        match mode {
            WorkspaceMode::Persistent => {
                let left = names_in(&runtime);
                assert_eq!(left, vec!["_work".to_owned()], "only _work is kept");
                assert!(runtime.join("_work").join("checkout").exists());
            }
            WorkspaceMode::Ephemeral => assert!(!runtime.exists(), "removed whole"),
        }
    }
}

/// A slot whose scrub cannot finish (an entry the filesystem refuses to delete) is quarantined
/// across a restart, and recovery completes past it (row 92); a ceiling lowered to the
/// quarantined slot refuses the next launch naming the slot range and deletes nothing, and raised
/// again it hands out `s2` with its retained `_work` (row 77); once the entry can go, the slot
/// is scrubbed and the attempt cleaned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partly_deleted_slot_stays_quarantined_across_a_restart_and_the_ceiling_decides_the_next_slot()
 {
    use runner_manager_crds::policy::WorkspaceMode;
    let Some(w) = AgentWorld::start("a_partly_deleted_slot_stays_quarantined").await else {
        return;
    };
    let mut agent = w.serving().await;
    let x = w
        .pending_attempt_with(|s| s.workspace = WorkspaceMode::Persistent)
        .await
        .unwrap();
    let s1 = runtime_path(&w.bring_to_idle(&x).await);
    let pin = Pinned::set(s1.join("pinned")).unwrap();
    stop_idle(&w, &x, "ScaleDown").await;
    let quarantined = |s: &runner_manager_crds::attempt::RunnerAttemptStatus| {
        s.journal.conditions.iter().any(|c| {
            format!("{:?}", c.type_) == "Quarantined"
                && c.status == runner_manager_crds::conditions::ConditionStatus::True
        })
    };
    w.wait_for(&name(&x), "the slot quarantined", quarantined)
        .await
        .unwrap();

    agent.terminate().unwrap();
    assert!(wait_exit(&mut agent).await.success());
    drop(agent);
    let again = w.serving().await;
    let x_now = w.attempts().get(&name(&x)).await.unwrap();
    let state = journal_of(&x_now).state();
    assert!(
        state.is_concluded() && state != AttemptState::Cleaned,
        "{state:?}"
    );
    assert!(quarantined(x_now.status.as_ref().unwrap()));
    assert!(s1.join("pinned").exists());

    // The ceiling lowered to the held slot: refused, naming the range; nothing deleted.
    let s2 = s1.parent().unwrap().join("s2");
    std::fs::create_dir_all(s2.join("_work")).unwrap();
    std::fs::write(s2.join("_work").join("checkout"), b"from an earlier job").unwrap();
    let y = slot_attempt(&w, 1).await;
    w.wait_concluded(&name(&y), Outcome::Rejected(RejectReason::NodeFull))
        .await;
    assert!(
        again
            .lines()
            .iter()
            .any(|l| l.contains(&name(&y)) && l.contains("s1 to s1")),
        "{:?}",
        again.lines()
    );
    assert!(s1.join("pinned").exists() && s2.join("_work").join("checkout").exists());

    // Raised again: the next launch gets s2, its retained work intact.
    let z = slot_attempt(&w, 2).await;
    let started = w
        .wait_from(&name(&z), AttemptState::Starting, "Starting")
        .await;
    assert_eq!(
        journal_of(&started).workspace().unwrap().slot_number(),
        Some(2)
    );
    assert_eq!(
        std::fs::read(s2.join("_work").join("checkout")).unwrap(),
        b"from an earlier job"
    );
    w.bring_to_idle(&z).await;
    stop_idle(&w, &z, "ScaleDown").await;
    w.wait_state(&name(&z), AttemptState::Cleaned)
        .await
        .unwrap();

    // Released: the scrub finishes and the attempt is cleaned.
    drop(pin);
    let done = w
        .wait_state(&name(&x), AttemptState::Cleaned)
        .await
        .unwrap();
    assert_eq!(
        format!("{:?}", condition(&done, "Quarantined").unwrap().reason),
        "Resolved"
    );
    let left = names_in(&s1);
    assert!(left.iter().all(|e| e == "_work"), "{left:?}");
}

/// A start that never had a child is tried three times, 10 ms then 20 ms apart, with a fresh
/// handoff each time and none left after any failed try, and the one JIT is never asked again
/// (parity row 31): the entry helper cannot be spawned (it does not exist), so every try fails
/// before a child; the attempt concludes `ProcessStartFailed` with the spawn step's time
/// including both waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_without_a_child_is_tried_three_times_and_leaves_no_handoff() {
    let Some(w) = AgentWorld::start("a_start_without_a_child_is_tried_three_times").await else {
        return;
    };
    let missing = w.host_root().join("no-such-entry-helper");
    let agent = w
        .serving_with(&[("RM_ENTRY_HELPER", &missing.display().to_string())])
        .await;
    let (a, n) = w.pending_named().await;
    let done = w
        .wait_concluded(&n, Outcome::Failed(FailureReason::ProcessStartFailed))
        .await;
    wait_logged(&agent, "the failed launch at warn", &["launch failed", &n]).await;
    let retries = agent
        .lines()
        .iter()
        .filter(|l| l.contains("start failed before a child existed") && l.contains(&n))
        .count();
    assert_eq!(retries, 3, "three tries, each failing before a child");
    let launch = journal_of(&done).launch.clone().unwrap();
    print_launch("three failed starts", &done);
    assert!(
        launch.spawn_ms >= 30,
        "the tries were not 10 ms then 20 ms apart: {} ms",
        launch.spawn_ms
    );
    // The operator deletes the registration the lost JIT left.
    lost_jit_deregistered_and_settled(&w, &done, &a).await;
}

/// A start that fails once its child existed is never tried again (parity row 52 in part): the
/// entry helper (`/bin/false`) is spawned and exits at once without taking the handoff, so the
/// JIT may have been consumed; the agent tries once, journals no second JIT request and
/// concludes `ProcessStartFailed`, leaving no handoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_failed_after_its_child_existed_is_never_retried() {
    let Some(w) = AgentWorld::start("a_start_that_failed_after_its_child_existed").await else {
        return;
    };
    let agent = w.serving_with(&[("RM_ENTRY_HELPER", "/bin/false")]).await;
    let (a, n) = w.pending_named().await;
    let done = w
        .wait_concluded(&n, Outcome::Failed(FailureReason::ProcessStartFailed))
        .await;
    wait_logged(&agent, "the failed launch at warn", &["launch failed", &n]).await;
    let tries = |what: &str| {
        agent
            .lines()
            .iter()
            .filter(|l| l.contains(what) && l.contains(&n))
            .count()
    };
    assert_eq!(tries("start failed after a child existed"), 1, "one try");
    assert_eq!(tries("start failed before a child existed"), 0);
    lost_jit_deregistered_and_settled(&w, &done, &a).await;
}

/// A persistent slot is scrubbed only once its runner is signalled and gone, keeping `_work`
/// (parity row 96): the agent is killed right after the durable intent of a requested stop, so
/// nothing is signalled yet; at that instant the runner lives and the slot holds all it held.
/// The restarted agent finishes the stop (signal, proven death, conclusion by the intent) and
/// only then scrubs: the slot keeps `_work` and its contents, nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_slot_is_scrubbed_only_once_its_runner_is_gone() {
    use runner_manager_crds::policy::WorkspaceMode;
    let Some(w) = AgentWorld::start("a_persistent_slot_is_scrubbed_only_once").await else {
        return;
    };
    let mut crashing = w
        .agent(4, &[("RM_AGENT_FAULT", "after-termination-intent")])
        .unwrap();
    w.wait_recovered().await.unwrap();
    let a = w
        .pending_attempt_with(|s| s.workspace = WorkspaceMode::Persistent)
        .await
        .unwrap();
    let n = name(&a);
    let idle = w.started_to_idle(&a).await;
    let pid = pid_of(&idle);
    let slot = runtime_path(&idle);
    std::fs::create_dir_all(slot.join("_work")).unwrap();
    std::fs::write(slot.join("_work").join("kept.txt"), b"kept").unwrap();
    std::fs::write(slot.join("left-by-the-job.txt"), b"scrubbed").unwrap();
    w.request_termination(&n, "IdleTimeout").await.unwrap();
    assert!(!wait_exit(&mut crashing).await.success());
    drop(crashing);
    // The intent is durable, nothing was signalled, nothing was scrubbed.
    assert!(slot.join(".terminate-intent").exists());
    assert!(pid_alive(pid), "signalled before the crash");
    assert!(
        slot.join("left-by-the-job.txt").exists(),
        "scrubbed before the stop"
    );
    assert!(slot.join("_diag").exists());

    let _again = w.agent(4, &[]).unwrap();
    let done = w.wait_concluded(&n, Outcome::ExitedIdleWithoutWork).await;
    assert!(!pid_alive(pid));
    let left = names_in(&slot);
    assert_eq!(left, vec!["_work".to_owned()], "the scrub keeps only _work");
    assert_eq!(
        std::fs::read(slot.join("_work").join("kept.txt")).unwrap(),
        b"kept"
    );
    w.deregister(&done).await.unwrap();
    assert!(w.handoff_files().is_empty());
    assert!(w.registrations(&done).await.unwrap().is_empty());
}
