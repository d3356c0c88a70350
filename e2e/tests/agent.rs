//! The node agent as a process on the real control plane, with the simulated GitHub, the
//! operator binary serving the broker, the stand-in runner package and real processes in real
//! cgroups: launch, supervision, ordered termination, admission, the host fence, re-adoption
//! after a restart, and a crash at each named boundary. The test plays the operator's facts
//! (`status.github`, `status.job`) and requests (`spec.termination`, deregistration). Runs as
//! root with the runner accounts of `e2e/setup-runner-accounts.sh`. Skipped without KUBECONFIG.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::outcome::{FailureReason, Outcome, RejectReason};
use runner_manager_crds::state::AttemptState;
use runner_manager_e2e::harness::agent::{AgentWorld, STEP};
use runner_manager_e2e::harness::process::Running;
use runner_manager_e2e::harness::wait;

fn name(a: &RunnerAttempt) -> String {
    a.metadata.name.clone().unwrap()
}

fn outcome(a: &RunnerAttempt) -> Option<Outcome> {
    a.status.as_ref().and_then(|s| s.journal.outcome())
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

async fn wait_exit(agent: &mut Running) -> std::process::ExitStatus {
    wait::until(STEP, "the agent to exit", || {
        let status = agent.child.try_wait().ok().flatten();
        async move { status }
    })
    .await
    .unwrap()
}

/// Online → `Idle`: the fake lists the runner online, the test writes the fact.
async fn bring_to_idle(w: &AgentWorld, a: &RunnerAttempt) -> RunnerAttempt {
    let n = name(a);
    w.wait_online(a).await.unwrap();
    w.set_github(&n, true, false, 1).await.unwrap();
    w.wait_state(&n, AttemptState::Idle).await.unwrap()
}

/// The operator's ordered termination of an idle runner: the request, then the
/// deregistration at once (the agent must conclude the same whichever it sees first).
async fn stop_idle(w: &AgentWorld, a: &RunnerAttempt, reason: &str) {
    w.request_termination(&name(a), reason).await.unwrap();
    w.deregister(a).await.unwrap();
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
    let l = a.status.as_ref().unwrap().journal.launch.clone().unwrap();
    println!(
        "status.launch ({label}): materializeMs={} prepareMs={} registerMs={} spawnMs={} packageDownloaded={}",
        l.materialize_ms, l.prepare_ms, l.register_ms, l.spawn_ms, l.package_downloaded
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_goes_from_pending_to_a_completed_job_and_is_cleaned() {
    let Some(w) = AgentWorld::start("a_runner_goes_from_pending_to_a_completed_job")
        .await
        .unwrap()
    else {
        return;
    };
    let agent = w.agent(4, &[]).unwrap();
    w.wait_recovered().await.unwrap();
    let a = w.pending_attempt().await.unwrap();
    let n = name(&a);
    let started = w
        .wait_for(&n, "Starting or later", |s| {
            s.journal.state() >= AttemptState::Starting
        })
        .await
        .unwrap();
    let journal = &started.status.as_ref().unwrap().journal;
    let process = journal.process().unwrap().clone();
    assert!(journal.runner().is_some());
    assert!(journal.launch.as_ref().unwrap().package_downloaded, "a cold launch downloads");
    print_launch("cold", &started);
    assert!(w.handoff_files().is_empty(), "the handoff survived the start");
    assert!(pid_alive(process.pid));
    assert_eq!(
        std::fs::metadata(journal.workspace().unwrap().runtime_path())
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
            .unwrap(),
        20001,
        "the runtime belongs to the first pool account"
    );

    bring_to_idle(&w, &a).await;
    let job = w.queue_job(3000).await.unwrap();
    let runner = w.wait_assigned(job).await.unwrap();
    assert_eq!(runner, started.status.as_ref().unwrap().journal.runner().unwrap().name);
    w.set_job(&n, job).await.unwrap();
    w.set_github(&n, true, true, 2).await.unwrap();
    w.wait_state(&n, AttemptState::Busy).await.unwrap();
    let done = w.wait_state(&n, AttemptState::Cleaned).await.unwrap();
    assert_eq!(outcome(&done), Some(Outcome::CompletedJob));
    assert!(!pid_alive(process.pid));
    assert_settled(&w, &a, 1).await;
    let diag = std::fs::read_to_string(w.host_root().join("diagnostics").join(format!("{n}.log")))
        .unwrap();
    assert!(diag.contains("CompletedJob"), "{diag}");

    // A second launch on the same node is warm: the package is cached.
    let b = w.pending_attempt().await.unwrap();
    let warm = w
        .wait_for(&name(&b), "Starting or later", |s| {
            s.journal.state() >= AttemptState::Starting
        })
        .await
        .unwrap();
    assert!(!warm.status.as_ref().unwrap().journal.launch.as_ref().unwrap().package_downloaded);
    print_launch("warm", &warm);
    bring_to_idle(&w, &b).await;
    stop_idle(&w, &b, "ScaleDown").await;
    assert_settled(&w, &b, 2).await;
    drop(agent);
}
