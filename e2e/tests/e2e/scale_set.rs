//! The runner scale-set protocol (issue 19, demand mode 2): the operator's scale-set client
//! against the simulated GitHub's Actions service, each failure mode pinned: session conflict,
//! expired tokens (message queue and admin), 5xx, long-poll timeout, and a message not deleted
//! given again to the next session (a listener killed mid-message loses no job).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use runner_manager_e2e::fake_github::jobs::Conclusion;
use runner_manager_e2e::harness::github::{ORG, SimulatedGitHub, pat_credentials};
use runner_manager_operator::github::scaleset::{ScaleSet, ScaleSetClient, ScaleSetError};
use serde_json::{Value, json};

async fn world() -> (SimulatedGitHub, ScaleSetClient) {
    let fake = SimulatedGitHub::start().await.unwrap();
    fake.admin(
        "PUT",
        "scale-sets/settings",
        json!({"long_poll_ms": 500, "session_idle_secs": 2}),
    )
    .await
    .unwrap();
    let gh = Arc::new(fake.client(&format!("https://github.com/{ORG}"), pat_credentials()));
    (fake, ScaleSetClient::new(gh))
}

fn labels(l: &[&str]) -> Vec<String> {
    l.iter().map(|s| (*s).to_owned()).collect()
}

/// The scale set `s` (runner group 1, label `linux`) most scenarios here run against.
async fn linux_set(ss: &ScaleSetClient) -> ScaleSet {
    ss.ensure_scale_set("s", 1, &labels(&["linux"]))
        .await
        .unwrap()
}

async fn queue(fake: &SimulatedGitHub, labels: &[&str]) -> i64 {
    let v = fake
        .admin(
            "POST",
            "jobs",
            json!({"owner": ORG, "repo": "web", "labels": labels, "behaviour": {}}),
        )
        .await
        .unwrap();
    v["job_id"].as_i64().unwrap()
}

/// The whole exchange: registration token → Actions service and admin token, the scale set
/// created once, a session, JobAvailable with statistics, acquire, JobAssigned, a runner minted
/// through the set, JobStarted and JobCompleted; each message deleted once handled.
#[tokio::test]
async fn a_scale_set_session_sees_a_job_through_its_whole_life() {
    let (fake, ss) = world().await;
    let set = ss
        .ensure_scale_set("linux-big", 1, &labels(&["linux", "big"]))
        .await
        .unwrap();
    let again = ss
        .ensure_scale_set("linux-big", 1, &labels(&["linux", "big"]))
        .await
        .unwrap();
    assert_eq!(set.id, again.id, "found, not created twice");
    let session = ss.create_session(set.id, "operator-0").await.unwrap();
    assert_eq!(session.statistics.total_available_jobs, 0);
    // Not ours (another label) and ours.
    queue(&fake, &["self-hosted", "gpu"]).await;
    let job = queue(&fake, &["self-hosted", "linux", "big"]).await;
    let m = ss
        .get_message(&session, 0)
        .await
        .unwrap()
        .expect("a message");
    assert_eq!(m.kind, "RunnerScaleSetJobMessages");
    assert_eq!(m.jobs.len(), 1, "{:?}", m.jobs);
    assert_eq!(m.jobs[0].message_type, "JobAvailable");
    assert_eq!(m.jobs[0].runner_request_id, job);
    assert_eq!(m.statistics.total_available_jobs, 1);
    let got = ss.acquire_jobs(set.id, &session, &[job]).await.unwrap();
    assert_eq!(got, [job]);
    assert!(
        ss.acquire_jobs(set.id, &session, &[job])
            .await
            .unwrap()
            .is_empty(),
        "a job is acquired once"
    );
    ss.delete_message(&session, m.id).await.unwrap();
    let m = ss.get_message(&session, m.id).await.unwrap().unwrap();
    assert_eq!(m.jobs[0].message_type, "JobAssigned");
    assert_eq!(m.statistics.total_acquired_jobs, 1);
    ss.delete_message(&session, m.id).await.unwrap();
    let jit = ss
        .generate_jit(set.id, "runner-manager-ss-1", "_work")
        .await
        .unwrap();
    assert!(
        !format!("{jit:?}").contains(secrecy::ExposeSecret::expose_secret(
            &jit.encoded_jit_config
        ))
    );
    let world = &fake.running.fake;
    let runner = u64::try_from(jit.runner_id).unwrap();
    let taken = world.try_assign(runner).unwrap().unwrap();
    assert_eq!(i64::try_from(taken.job_id).unwrap(), job);
    world
        .complete_job(runner, taken.job_id, Conclusion::Success)
        .unwrap();
    let m = ss.get_message(&session, 0).await.unwrap().unwrap();
    let kinds: Vec<&str> = m.jobs.iter().map(|j| j.message_type.as_str()).collect();
    assert_eq!(kinds, ["JobStarted", "JobCompleted"]);
    assert_eq!(m.jobs[1].result.as_deref(), Some("succeeded"));
    assert_eq!(
        m.jobs[0].runner_name.as_deref(),
        Some("runner-manager-ss-1")
    );
    ss.delete_message(&session, m.id).await.unwrap();
    let calls = ss.calls();
    println!("scale-set calls for one job: {calls:?}");
    assert_eq!(
        calls["runner_registration"], 1,
        "one exchange serves them all"
    );
}

/// A second session while one is live is a conflict; the standby gets it once the old one is
/// deleted, or once it lapses (a leader killed without deleting it).
#[tokio::test]
async fn a_second_session_conflicts_until_the_first_is_deleted_or_lapses() {
    let (_fake, ss) = world().await;
    let set = linux_set(&ss).await;
    let first = ss.create_session(set.id, "operator-0").await.unwrap();
    let e = ss.create_session(set.id, "operator-1").await.unwrap_err();
    assert!(matches!(e, ScaleSetError::SessionConflict), "{e:?}");
    assert!(e.is_retryable());
    ss.delete_session(set.id, &first).await.unwrap();
    let second = ss.create_session(set.id, "operator-1").await.unwrap();
    // The holder dies without deleting: after the idle lapse (2 s here) the standby takes over.
    let e = ss.create_session(set.id, "operator-2").await.unwrap_err();
    assert!(matches!(e, ScaleSetError::SessionConflict));
    drop(second);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    ss.create_session(set.id, "operator-2").await.unwrap();
}

/// An expired message-queue token is `Expired`; a refreshed session polls again. An expired
/// admin token is exchanged again without the caller seeing it.
#[tokio::test]
async fn expired_tokens_are_refreshed() {
    let (fake, ss) = world().await;
    fake.admin(
        "PUT",
        "scale-sets/settings",
        json!({"long_poll_ms": 300, "queue_token_secs": 1, "admin_token_secs": 1, "session_idle_secs": 60}),
    )
    .await
    .unwrap();
    let set = linux_set(&ss).await;
    let session = ss.create_session(set.id, "operator-0").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let e = ss.get_message(&session, 0).await.unwrap_err();
    assert!(matches!(e, ScaleSetError::Expired), "{e:?}");
    // The admin token expired too: the refresh exchanges it again, transparently.
    let session = ss.refresh_session(set.id, &session).await.unwrap();
    assert!(ss.get_message(&session, 0).await.unwrap().is_none());
    assert_eq!(ss.calls()["runner_registration"], 2);
}

/// A 5xx from the Actions service is a retryable error; the next call succeeds.
#[tokio::test]
async fn a_5xx_is_retryable_and_the_next_call_works() {
    let (fake, ss) = world().await;
    let set = linux_set(&ss).await;
    let session = ss.create_session(set.id, "operator-0").await.unwrap();
    for endpoint in ["scale_set_messages", "scale_set_acquire", "scale_set_jit"] {
        fake.fault(json!({"endpoint": endpoint, "count": 1, "status": 503}))
            .await
            .unwrap();
    }
    let e = ss.get_message(&session, 0).await.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    let e = ss.acquire_jobs(set.id, &session, &[1]).await.unwrap_err();
    assert!(
        matches!(e, ScaleSetError::Service { status: 503, .. }),
        "{e:?}"
    );
    let e = ss.generate_jit(set.id, "r", "_work").await.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    assert!(ss.get_message(&session, 0).await.unwrap().is_none());
    assert!(
        ss.acquire_jobs(set.id, &session, &[1])
            .await
            .unwrap()
            .is_empty()
    );
}

/// A long poll with nothing to say ends with 202 after GitHub's wait: `None`, not an error.
#[tokio::test]
async fn a_long_poll_times_out_with_nothing() {
    let (_fake, ss) = world().await;
    let set = linux_set(&ss).await;
    let session = ss.create_session(set.id, "operator-0").await.unwrap();
    let started = std::time::Instant::now();
    assert!(ss.get_message(&session, 0).await.unwrap().is_none());
    assert!(started.elapsed() >= Duration::from_millis(450));
}

/// A listener killed after receiving a message and before deleting it: the next session (the
/// standby's) gets the same message, so the job is neither lost nor told twice.
#[tokio::test]
async fn a_message_not_deleted_is_given_to_the_next_session() {
    let (fake, ss) = world().await;
    let set = linux_set(&ss).await;
    let first = ss.create_session(set.id, "operator-0").await.unwrap();
    let job = queue(&fake, &["self-hosted", "linux"]).await;
    let m = ss.get_message(&first, 0).await.unwrap().unwrap();
    assert_eq!(m.jobs[0].runner_request_id, job);
    // Killed here: no delete, no acquire. Its session lapses; the standby opens one.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let second = ss.create_session(set.id, "operator-1").await.unwrap();
    let again = ss.get_message(&second, 0).await.unwrap().unwrap();
    assert_eq!(again.id, m.id);
    assert_eq!(again.jobs, m.jobs);
    assert_eq!(
        ss.acquire_jobs(set.id, &second, &[job]).await.unwrap(),
        [job]
    );
    ss.delete_message(&second, again.id).await.unwrap();
    let next = ss.get_message(&second, again.id).await.unwrap().unwrap();
    let kinds: Vec<&str> = next.jobs.iter().map(|j| j.message_type.as_str()).collect();
    assert_eq!(kinds, ["JobAssigned"], "JobAvailable is not told twice");
    let state: Value = fake.admin("GET", "scale-sets", Value::Null).await.unwrap();
    assert_eq!(state["sessions_opened"], 2);
}
