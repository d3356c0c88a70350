//! The node agent's launch under its bounds and at its faults, as a process on the real control
//! plane with the simulated GitHub, the operator binary serving the broker and real processes in
//! real cgroups (the world of `e2e/tests/e2e/agent.rs`): the preparation bound (parity row 67), a
//! launch that stops waiting for its package (row 48), and failures inside the launcher once its
//! child exists (rows 52 and 61, `RM_AGENT_FAIL`).
//! The test plays the operator's facts and requests. Runs as root with the runner accounts of
//! `e2e/setup-runner-accounts.sh`. Skipped without KUBECONFIG.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::outcome::{FailureReason, Outcome, RejectReason};
use runner_manager_crds::state::AttemptState;
use runner_manager_e2e::harness::agent::{AgentWorld, STEP};
use runner_manager_e2e::harness::attempt::{journal_of, name, outcome, pid_alive, pid_of};
use runner_manager_e2e::harness::process::Running;
use runner_manager_e2e::harness::wait;

/// GitHub holds the next package download for `latency_ms`.
async fn slow_package_download(w: &AgentWorld, latency_ms: u64) {
    w.fake
        .fault(serde_json::json!({"endpoint": "download_package", "count": 1, "latency_ms": latency_ms}))
        .await
        .unwrap();
}

/// Online → `Idle` → stopped in order → `Cleaned` (the test plays the operator).
async fn stop_in_order(w: &AgentWorld, a: &RunnerAttempt) -> RunnerAttempt {
    let n = name(a);
    w.bring_to_idle(a).await;
    w.request_termination(&n, "ScaleDown").await.unwrap();
    w.deregister(a).await.unwrap();
    w.wait_state(&n, AttemptState::Cleaned).await.unwrap()
}

/// The most preparation turns held at once, read from the agent's log in order: a turn says
/// `preparation turn taken` once it holds its permit and `preparation turn given back` before it
/// lets it go, so the count read from the lines never exceeds the permits really held.
fn most_turns_at_once(lines: &[String]) -> (usize, usize, usize) {
    let (mut now, mut most, mut taken, mut given) = (0usize, 0usize, 0usize, 0usize);
    for l in lines {
        if l.contains("preparation turn taken") {
            now += 1;
            taken += 1;
            most = most.max(now);
        } else if l.contains("preparation turn given back") {
            now = now.saturating_sub(1);
            given += 1;
        }
    }
    (most, taken, given)
}

/// Parity row 67 (`runners_prepare_at_once_within_the_bound`): four bring-ups with two
/// preparation permits all succeed, and at most two materialize and prepare at once. The
/// package download is slowed so the first launches are still preparing when the others are
/// admitted: without the bound all four would prepare together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launches_prepare_at_once_within_the_bound() {
    let Some(w) = AgentWorld::start("launches_prepare_at_once_within_the_bound").await else {
        return;
    };
    slow_package_download(&w, 3000).await;
    let agent = w
        .recovered(w.agent(4, &[("RM_PREPARATION_PERMITS", "2")]))
        .await;
    let mut attempts = Vec::new();
    for _ in 0..4 {
        attempts.push(w.pending_attempt().await.unwrap());
    }
    for a in &attempts {
        let started = w
            .wait_state(&name(a), AttemptState::Starting)
            .await
            .unwrap();
        assert_eq!(outcome(&started), None, "{}", name(a));
    }
    let lines = agent.lines();
    let (most, taken, given) = most_turns_at_once(&lines);
    println!("preparation turns: {taken} taken, {given} given back, at most {most} at once");
    assert_eq!(taken, 4, "one turn per launch: {lines:?}");
    assert_eq!(given, 4, "every turn given back: {lines:?}");
    assert_eq!(most, 2, "two permits, four launches: {lines:?}");
    for a in &attempts {
        let done = stop_in_order(&w, a).await;
        assert_eq!(outcome(&done), Some(Outcome::ExitedIdleWithoutWork));
    }
    assert!(w.runtimes().is_empty(), "runtimes left: {:?}", w.runtimes());
}

/// Lines of the agent's log naming `attempt` and holding `what`.
fn logged(agent: &Running, attempt: &str, what: &str) -> usize {
    agent
        .lines()
        .iter()
        .filter(|l| l.contains(what) && l.contains(attempt))
        .count()
}

/// Parity row 61 (`post_spawn_boundaries_are_bounded_durable_and_never_retry_jit`): a failure
/// inside the launcher once the child exists — the handoff reads as surviving, the identity
/// file cannot be written, the child cannot be recorded — is final for the JIT: one try, one
/// mint, the child killed and proven dead (no runner cgroup left), no identity and no handoff
/// left, the attempt `Failed(ProcessStartFailed)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_after_the_spawn_is_never_retried_and_leaves_no_child_identity_or_handoff() {
    let Some(w) = AgentWorld::start("a_failure_after_the_spawn_is_never_retried").await else {
        return;
    };
    let steps = ["handoff-delete", "identity-write", "child-map-insert"];
    for (i, step) in steps.into_iter().enumerate() {
        let agent = w.recovered(w.agent(4, &[("RM_AGENT_FAIL", step)])).await;
        let a = w.pending_attempt().await.unwrap();
        let n = name(&a);
        let done = w
            .wait_concluded_saying(&n, Outcome::Failed(FailureReason::ProcessStartFailed), step)
            .await;
        assert!(
            agent
                .lines()
                .iter()
                .any(|l| l.contains("failure injected at") && l.contains(step)),
            "{step}: the fault was not reached: {:?}",
            agent.lines()
        );
        assert_eq!(
            logged(&agent, &n, "start failed after a child existed"),
            1,
            "{step}"
        );
        assert_eq!(
            logged(&agent, &n, "start failed before a child existed"),
            0,
            "{step}"
        );
        assert!(
            w.handoff_files().is_empty(),
            "{step}: {:?}",
            w.handoff_files()
        );
        assert!(w.runtimes().is_empty(), "{step}: {:?}", w.runtimes());
        let (second_sessions, mints) = w.second_sessions_and_mints().await.unwrap();
        assert_eq!(
            (second_sessions, mints),
            (0, i as u64 + 1),
            "{step}: one JIT per attempt"
        );
        let left = std::fs::read_dir(w.cgroup_dir())
            .map(|d| d.flatten().filter(|e| e.path().is_dir()).count())
            .unwrap_or(0);
        assert_eq!(left, 0, "{step}: a runner cgroup is left");
        // The operator deletes what the consumed JIT may have registered.
        w.deregister(&done).await.unwrap();
        drop(agent);
    }
}

/// Parity row 52 (`failed_post_spawn_stop_keeps_capacity_until_supervision_proves_death`): a
/// start fails once its child exists and the launcher cannot stop that child either. The
/// attempt is journalled `Starting` with the child's pid and no outcome, and holds its place
/// (capacity 1: the node advertises none free and a second attempt is rejected `NodeFull`).
/// Only once the child is dead does supervision conclude it — a failure that asks for one
/// replacement — and clean it; one JIT in all, no handoff and no identity left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_the_launcher_cannot_stop_keeps_its_place_until_supervision_proves_it_dead() {
    let Some(w) = AgentWorld::start("a_child_the_launcher_cannot_stop").await else {
        return;
    };
    let agent = w
        .recovered(w.agent(
            1,
            &[("RM_AGENT_FAIL", "child-map-insert,stop-after-start-failure")],
        ))
        .await;
    let a = w.pending_attempt().await.unwrap();
    let n = name(&a);
    let started = w.wait_state(&n, AttemptState::Starting).await.unwrap();
    assert_eq!(outcome(&started), None);
    let pid = pid_of(&started);
    assert!(pid_alive(pid), "the child the stop did not take lives");
    assert_eq!(logged(&agent, &n, "start failed after a child existed"), 1);
    wait::until(STEP, "the Lease to show the node full", || async {
        w.advert()
            .await
            .filter(|ad| ad.capacity == 1 && ad.free == 0)
    })
    .await
    .unwrap();
    let second = w.pending_attempt().await.unwrap();
    w.wait_concluded(&name(&second), Outcome::Rejected(RejectReason::NodeFull))
        .await;
    // Still `Starting`, still its pid: nothing concluded it while it lives.
    let still = w.attempts().get(&n).await.unwrap();
    assert_eq!(journal_of(&still).state(), AttemptState::Starting);
    assert_eq!(outcome(&still), None);

    // The child dies; supervision proves it and concludes once.
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let done = w.wait_state(&n, AttemptState::Cleaned).await.unwrap();
    let o = outcome(&done).unwrap();
    println!("concluded once the child was dead: {o:?}");
    assert!(o.wants_replacement(), "{o:?} asks for no replacement");
    assert!(!pid_alive(pid));
    assert!(w.handoff_files().is_empty(), "{:?}", w.handoff_files());
    assert!(
        w.runtimes().is_empty(),
        "identity and runtime left: {:?}",
        w.runtimes()
    );
    let (second_sessions, mints) = w.second_sessions_and_mints().await.unwrap();
    assert_eq!((second_sessions, mints), (0, 1), "one JIT in all");
    w.deregister(&done).await.unwrap();
}

/// Parity row 48 through the agent: a launch waiting for its package download stops waiting
/// once its attempt's termination is requested, and concludes `Failed(TerminationRequested)`
/// (no replacement) without a JIT ever being asked; the download it started is not what it waits
/// for any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_waiting_for_its_package_stops_when_its_attempt_is_terminated() {
    let Some(w) = AgentWorld::start("a_launch_waiting_for_its_package_stops").await else {
        return;
    };
    // GitHub holds the package download long enough for the request to land during it.
    slow_package_download(&w, 20000).await;
    let agent = w.recovered(w.agent(4, &[])).await;
    let a = w.pending_attempt().await.unwrap();
    let n = name(&a);
    wait::until(STEP, "the launch to wait for its package", || {
        let taken = logged(&agent, &n, "preparation turn taken") == 1;
        async move { taken.then_some(()) }
    })
    .await
    .unwrap();
    let asked = std::time::Instant::now();
    w.request_termination(&n, "ScaleDown").await.unwrap();
    let done = w.wait_state(&n, AttemptState::Cleaned).await.unwrap();
    let waited = asked.elapsed();
    println!("concluded {waited:?} after the request (the download was held 20 s)");
    assert_eq!(
        outcome(&done),
        Some(Outcome::Failed(FailureReason::TerminationRequested))
    );
    assert!(
        waited < std::time::Duration::from_secs(15),
        "the launch waited for the download: {waited:?}"
    );
    assert_eq!(
        logged(&agent, &n, "launch stopped waiting for its package"),
        1
    );
    let (_, mints) = w.second_sessions_and_mints().await.unwrap();
    assert_eq!(mints, 0, "a JIT for a terminated attempt");
    assert!(w.runtimes().is_empty(), "{:?}", w.runtimes());
}
