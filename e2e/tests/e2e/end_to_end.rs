//! End to end (issue 8): the operator and node agents as processes on the real control plane, the
//! simulated GitHub delivering signed webhooks, the stand-in runner taking real jobs. Every
//! scenario asserts on the API, the fake's inventory and counters, and the disk, and ends with the
//! hygiene checks: no registration left, no runtime or handoff left, no JIT anywhere.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use kube::api::DeleteParams;
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::conditions::{ConditionStatus, find};
use runner_manager_crds::names::runner_name;
use runner_manager_crds::outcome::Outcome;
use runner_manager_crds::policy::{PolicyConditionType, ScalePolicy};
use runner_manager_crds::state::AttemptState;
use runner_manager_e2e::harness::attempt::{journal_of, outcome, state};
use runner_manager_e2e::harness::cluster::list_all;
use runner_manager_e2e::harness::product::{
    NodeOptions, Product, ProductOptions, STEP, WriteCounter,
};
use runner_manager_e2e::harness::wait;
use runner_manager_e2e::harness::world::World;
use serde_json::{Value, json};

/// A product whose team's policy `web` (`spec`) is Ready.
async fn product_with_web(test: &str, spec: Value) -> Option<Product> {
    let p = Product::start(test).await?;
    p.policy_ready("web", spec).await;
    Some(p)
}

/// A product whose policy `web` is `spec` with a `Persistent` workspace, Ready; and where its
/// slots live on agent 0's host (`<slots root>/<team>/<policy uid>`).
async fn persistent_product(test: &str, mut spec: Value) -> Option<(Product, std::path::PathBuf)> {
    let p = Product::start(test).await?;
    spec["workspace"] = json!({"mode": "Persistent"});
    let sp = p.policy("web", spec).await.unwrap();
    p.wait_ready("web").await;
    let slots = p.agents[0]
        .host
        .join("slots")
        .join(&p.team)
        .join(sp.metadata.uid.as_deref().unwrap());
    Some((p, slots))
}

/// A product whose policy `web` (one runner at a time) keeps npm's cache (issue 31 item 2),
/// Ready.
async fn cache_product(test: &str) -> Option<Product> {
    let p = Product::start(test).await?;
    p.policy(
        "web",
        json!({"minIdle": 0, "maxRunners": 1, "caches": {"tools": ["npm"]}}),
    )
    .await
    .unwrap();
    p.wait_ready("web").await;
    Some(p)
}

/// The directory of `acme/web`'s cache namespace on the first agent's host, once it exists.
fn cache_namespace_dir(p: &Product) -> Option<std::path::PathBuf> {
    let team = p.agents[0].host.join("caches").join("ns").join(&p.team);
    let host = std::fs::read_dir(team).ok()?.next()?.ok()?.path();
    Some(host.join("acme").join("web"))
}

/// No runner's cache directory is left on the first agent's host, and no cache overlay mounted.
fn assert_no_cache_left(p: &Product) {
    let caches = p.agents[0].host.join("caches");
    let attempts: Vec<_> = std::fs::read_dir(caches.join("attempts"))
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        attempts.is_empty(),
        "a runner's cache outlived it: {attempts:?}"
    );
    let mounts = runner_manager_node_agent::mounts::mount_points().unwrap();
    assert!(
        !mounts.iter().any(|m| m.path.starts_with(&caches)),
        "a cache overlay is still mounted"
    );
}

/// Job `job` once it completed and every attempt of the team is `Cleaned` (what the runner
/// left is released by then).
async fn completed_and_cleaned(p: &Product, job: u64) -> Value {
    let j = p
        .completed_job(job, Duration::from_secs(180))
        .await
        .unwrap();
    p.wait_every_attempt_cleaned().await;
    j
}

/// What `dir` holds (nothing when it is not there).
fn entries(dir: impl AsRef<Path>) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect()
}

/// The hygiene every scenario ends with, once the work is done: every attempt `Cleaned` (or
/// garbage-collected), no registration of ours left at the fake, no runtime or handoff file under
/// any host root, no runner process left in any agent's cgroup, and none of the JITs the fake
/// issued anywhere — attempts and events in the API server, every process's log, every host root.
async fn assert_settled_and_clean(p: &Product) {
    p.wait_every_attempt_cleaned().await;
    p.wait_no_registrations()
        .await
        .unwrap_or_else(|e| panic!("{e}: {:?}", logs_hint(p)));
    for a in &p.agents {
        let runners = a.host.join("runners");
        let left = entries(&runners);
        assert!(left.is_empty(), "runtimes left: {left:?}");
        let gates = entries(a.host.join("gates"));
        assert!(gates.is_empty(), "job gates left: {gates:?}");
        let caches = entries(a.host.join("caches").join("attempts"));
        assert!(
            caches.is_empty(),
            "runners' dependency caches left: {caches:?}"
        );
        assert!(
            files_named(&a.host, "jit-").is_empty(),
            "handoff files left"
        );
        let procs = cgroup_procs(&a.cgroup_dir());
        assert!(procs.is_empty(), "runner processes left: {procs:?}");
    }
    let jits: Vec<String> = p.fake.issued_jits();
    assert!(!jits.is_empty(), "no JIT was ever issued");
    let attempts = serde_json::to_string(&p.all_attempts().await).unwrap();
    let events = {
        let api = kube::Api::<k8s_openapi::api::core::v1::Event>::all(p.kube.clone());
        serde_json::to_string(&list_all(&api).await).unwrap()
    };
    let logs = p.all_log_lines().join("\n");
    for jit in &jits {
        assert!(!attempts.contains(jit), "a JIT in an attempt");
        assert!(!events.contains(jit), "a JIT in an event");
        assert!(!logs.contains(jit), "a JIT in a process log");
        for a in &p.agents {
            assert!(
                !tree_contains(&a.host, jit.as_bytes()),
                "a JIT under the host root {}",
                a.host.display()
            );
        }
    }
}

/// Every job succeeded, each on a runner of its own.
async fn assert_each_job_ran_once(p: &Product, jobs: &[u64]) {
    let mut runners = BTreeSet::new();
    for id in jobs {
        let job = p.job(*id).await.unwrap();
        assert_eq!(job["conclusion"], "success", "{job}");
        let name = job["runner_name"].as_str().unwrap().to_owned();
        assert!(name.starts_with("runner-manager-"), "{job}");
        assert!(runners.insert(name), "two jobs on one runner: {job}");
    }
}

fn logs_hint(p: &Product) -> String {
    format!("logs in {}", p.logs().display())
}

fn files_named(root: &Path, prefix: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                stack.push(e.path());
            } else if e.file_name().to_string_lossy().starts_with(prefix) {
                found.push(e.path());
            }
        }
    }
    found
}

/// Whether any regular file under `root` contains `needle` (the package cache is skipped: it is
/// the runner package as downloaded, written before any JIT exists).
fn tree_contains(root: &Path, needle: &[u8]) -> bool {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                if e.file_name() != "packages" {
                    stack.push(e.path());
                }
            } else if t.is_file()
                && std::fs::read(e.path())
                    .map(|b| b.windows(needle.len()).any(|w| w == needle))
                    .unwrap_or(false)
            {
                return true;
            }
        }
    }
    false
}

fn cgroup_procs(dir: &Path) -> Vec<String> {
    let mut procs = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if let Ok(s) = std::fs::read_to_string(e.path().join("cgroup.procs")) {
            procs.extend(s.lines().map(str::to_owned));
        }
    }
    procs
}

/// Scale from zero on `workflow_job` webhooks: three jobs queued, three fresh runners take them,
/// every attempt ends `CompletedJob` → `Cleaned`, nothing is left behind. Prints the GitHub calls
/// per launched runner and the API writes per attempt.
#[tokio::test]
async fn webhook_jobs_scale_from_zero_and_everything_is_cleaned() {
    let Some(p) = Product::start("webhook_jobs_scale_from_zero").await else {
        return;
    };
    let writes = WriteCounter::start(p.attempts()).await.unwrap();
    p.policy_ready("web", json!({"minIdle": 0})).await;
    assert!(
        p.all_attempts().await.is_empty(),
        "minIdle 0 and no job: nothing to launch"
    );
    let jobs = p.queue_jobs(3, 300).await.unwrap();
    p.wait_jobs_completed(&jobs, Duration::from_secs(180))
        .await
        .unwrap();
    // Every job ran on one of our runners, each on its own.
    let mut runners = BTreeSet::new();
    for id in &jobs {
        let job = p.job(*id).await.unwrap();
        let name = job["runner_name"].as_str().unwrap().to_owned();
        assert!(name.starts_with("runner-manager-"), "{job}");
        assert!(runners.insert(name), "two jobs on one runner");
    }
    let attempts = p
        .wait_attempts("the job attempts concluded", STEP, |list| {
            list.iter()
                .filter(|a| runners.contains(&runner_name(a.spec.attempt_uuid().unwrap())))
                .filter(|a| outcome(a) == Some(Outcome::CompletedJob))
                .count()
                == jobs.len()
        })
        .await;
    for a in &attempts {
        let name = a.metadata.name.as_deref().unwrap();
        assert!(name.starts_with("web-"), "{name}");
        assert_eq!(a.spec.policy, "web");
    }
    assert_settled_and_clean(&p).await;

    let (calls, counters) = p.operator_github_calls().await.unwrap();
    let launched = attempts.len() as f64;
    let mints = counters["generate_jitconfig"]["201"].as_u64().unwrap_or(0);
    let counts = writes.counts();
    let per_attempt: Vec<u64> = attempts
        .iter()
        .filter_map(|a| counts.get(a.metadata.name.as_deref()?).copied())
        .collect();
    eprintln!(
        "FIGURES webhook scale-from-zero: {} runners, {mints} JIT mints, {calls} operator GitHub calls \
         ({:.2} per runner, observation passes every 1 s included); API writes per attempt {per_attempt:?}; \
         counters {counters}",
        attempts.len(),
        calls as f64 / launched
    );
    assert_eq!(mints as usize, attempts.len(), "one JIT mint per runner");
}

/// A job queued before its policy existed: its delivery reached the operator and found no policy
/// (as it finds none for a policy not yet Ready). With webhooks on, the poll skips runs younger
/// than a poll interval; the policy's first read once it is Ready skips none, so the job starts
/// then, not a poll interval later. The interval is 5 minutes and the deadline one.
#[tokio::test]
async fn a_job_queued_before_its_policy_was_ready_starts_without_waiting_a_poll_interval() {
    let Some(p) = Product::start("queued_before_ready").await else {
        return;
    };
    let job = p.queue_linux_job(200).await.unwrap();
    p.wait_delivery_answered(job).await;
    p.policy(
        "web",
        json!({"minIdle": 0, "scaling": {"webhook": true, "pollInterval": "300s"}}),
    )
    .await
    .unwrap();
    p.job_completes_within(job, Duration::from_secs(60), "the poll")
        .await;
    completed_and_cleaned(&p, job).await;
}

/// Issue 33 item 5: a GitHub Enterprise Server whose certificate a private CA signed. The
/// simulated GitHub serves HTTPS only, with such a certificate. The operator is given the CA for
/// the API (`--github-ca-file`) and the agent for the runner package (`--download-ca-file`),
/// as the chart's `caBundle` gives them; the runner, which trusts what its node trusts, is
/// pointed at it through `runner.env` (`SSL_CERT_FILE`). A job runs on a fresh runner and
/// everything is cleaned. Without the CA the operator's client fails at the handshake
/// (`github_client.rs::an_enterprise_server_signed_by_a_private_ca_is_reached_only_with_its_ca`).
#[tokio::test]
async fn a_job_runs_against_a_server_whose_certificate_a_private_ca_signed() {
    let Some(p) = World::builder("github_private_ca")
        .github_tls()
        .product(ProductOptions::default())
        .await
        .unwrap()
    else {
        return;
    };
    assert!(
        p.fake.base_url().starts_with("https://"),
        "{}",
        p.fake.base_url()
    );
    let ca = p.github_ca_file.clone().unwrap();
    let env = k8s_openapi::api::core::v1::ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("runner-env".into()),
            ..Default::default()
        },
        data: Some(
            [(
                "runner.env".to_owned(),
                format!("SSL_CERT_FILE={}\n", ca.display()),
            )]
            .into(),
        ),
        ..Default::default()
    };
    kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(p.kube.clone(), &p.team)
        .create(&kube::api::PostParams::default(), &env)
        .await
        .unwrap();
    p.policy(
        "web",
        json!({"minIdle": 0, "runner": {"version": "latest", "envFrom": {"configMapRef": {"name": "runner-env"}}}}),
    )
    .await
    .unwrap();
    p.wait_ready("web").await;
    let job = p.queue_linux_job(300).await.unwrap();
    p.wait_jobs_completed(&[job], Duration::from_secs(180))
        .await
        .unwrap_or_else(|e| panic!("{e}; logs in {}", p.logs().display()));
    assert_settled_and_clean(&p).await;
}

/// `minIdle: 2` holds two idle runners and no more, across several observation passes.
#[tokio::test]
async fn min_idle_holds_two_idle_runners_and_no_more() {
    let Some(p) = product_with_web("min_idle_holds_two", json!({"minIdle": 2})).await else {
        return;
    };
    p.wait_attempts("two idle runners", Duration::from_secs(120), |list| {
        list.iter()
            .filter(|a| state(a) == AttemptState::Idle)
            .count()
            == 2
    })
    .await;
    // Stability, measured in the operator's own progress rather than time: three more runner-list
    // passes of the target, and still exactly two live attempts.
    let lists = |c: Value| {
        c["list_runners"]["200"].as_u64().unwrap_or(0)
            + c["list_runners"]["304"].as_u64().unwrap_or(0)
    };
    let before = lists(p.fake.counters().await.unwrap());
    wait::until(STEP, "three more observation passes", || async {
        (lists(p.fake.counters().await.ok()?) >= before + 3).then_some(())
    })
    .await
    .unwrap();
    let live: Vec<_> = p
        .all_attempts()
        .await
        .into_iter()
        .filter(|a| {
            state(a).counts_against_capacity(runner_manager_crds::policy::ExecutionMode::Native)
        })
        .collect();
    assert_eq!(
        live.len(),
        2,
        "{:?}",
        live.iter().map(state).collect::<Vec<_>>()
    );
    let registered = p.fake.runners().await.unwrap();
    assert_eq!(registered.len(), 2, "{registered:?}");

    // Deleting the policy drains the idle runners and lets the policy go.
    p.policies()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    p.wait_policy_gone("web").await;
    p.wait_no_registrations().await.unwrap();
}

/// Job `job` completed (within `within`) with success, on the runner of `a` (`why`).
async fn succeeded_on(p: &Product, job: u64, a: &RunnerAttempt, within: Duration, why: &str) {
    let done = p.completed_job(job, within).await.unwrap();
    assert_eq!(done["conclusion"], "success", "{done}");
    assert_eq!(
        done["runner_name"].as_str(),
        Some(runner_name(a.spec.attempt_uuid().unwrap()).as_str()),
        "{why}"
    );
}

/// The runner that ran job `job`, once it completed (within three minutes).
async fn runner_of(p: &Product, job: u64) -> String {
    p.completed_job(job, Duration::from_secs(180))
        .await
        .unwrap()["runner_name"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// How long a runner takes at most to be seen busy or idle in the scenarios that wait so.
const TWO_MINUTES: Duration = Duration::from_secs(120);

/// The policy `web` with `min_idle` runners on the nodes of `pool`.
async fn pool_policy(p: &Product, min_idle: u32, pool: &str) {
    let spec = json!({
        "minIdle": min_idle,
        "nodeSelector": {"node-restriction.kubernetes.io/runner-pool": pool},
    });
    p.policy("web", spec).await.unwrap();
}

/// Two node pools: attempts land only on nodes the policy's `nodeSelector` allows.
#[tokio::test]
async fn attempts_land_only_where_the_node_selector_allows() {
    let options = ProductOptions {
        nodes: vec![
            NodeOptions::in_pool("pool-a", 2, "a"),
            NodeOptions::in_pool("pool-b", 2, "b"),
        ],
        ..ProductOptions::default()
    };
    let Some(p) = Product::start_with("node_selector_pools", options).await else {
        return;
    };
    pool_policy(&p, 2, "b").await;
    let b = p.agents[1].node.name.clone();
    let list = p
        .wait_attempts(
            "two idle runners on pool b",
            Duration::from_secs(120),
            |list| {
                list.iter()
                    .filter(|a| state(a) == AttemptState::Idle)
                    .count()
                    == 2
            },
        )
        .await;
    for a in &list {
        assert_eq!(a.spec.node_name, b, "placed outside the node selector");
    }
}

/// Scale from zero with every webhook dropped: the polling reconciliation (queued runs → jobs)
/// finds the work.
#[tokio::test]
async fn jobs_are_found_by_polling_when_every_webhook_is_dropped() {
    let Some(p) = Product::start("polling_repairs_dropped_webhooks").await else {
        return;
    };
    p.fake.drop_webhooks(1000).await.unwrap();
    p.policy_ready("web", json!({"minIdle": 0})).await;
    let jobs = p.queue_jobs(2, 200).await.unwrap();
    p.wait_jobs_completed(&jobs, Duration::from_secs(180))
        .await
        .unwrap();
    let deliveries = p.fake.assert_every_delivery_dropped().await;
    assert!(!deliveries.is_empty(), "no delivery was even recorded");
    assert_settled_and_clean(&p).await;
}

/// A busy runner is never stopped: the policy is deleted while its runner works; the job finishes
/// with success, then everything drains and the policy's finalizer goes.
#[tokio::test]
async fn a_policy_deleted_while_its_runner_is_busy_drains_after_the_job() {
    let Some(p) = product_with_web("policy_deleted_while_busy", json!({"minIdle": 0})).await else {
        return;
    };
    let job = p.queue_linux_job(6000).await.unwrap();
    let busy = p
        .one_in(AttemptState::Busy, "a busy runner", TWO_MINUTES)
        .await;
    p.policies()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    succeeded_on(
        &p,
        job,
        &busy,
        Duration::from_secs(120),
        "the busy runner took it",
    )
    .await;
    p.wait_policy_gone("web").await;
    let this = p
        .attempts()
        .get_opt(busy.metadata.name.as_deref().unwrap())
        .await
        .unwrap();
    if let Some(a) = this {
        assert_eq!(outcome(&a), Some(Outcome::CompletedJob));
    }
    p.wait_no_registrations().await.unwrap();
}

/// The agent is killed (abort) after the broker answered and before the runner was spawned: the
/// JIT is lost. The restarted agent concludes `Failed(JitExpired)` without asking again; the
/// operator deregisters and replaces it (lineage), the job runs on the replacement, and at most
/// one runner session ever ran per attempt.
#[tokio::test]
async fn an_agent_killed_between_jit_and_spawn_recovers_without_a_second_runner() {
    let Some(mut p) = Product::start("agent_killed_mid_launch").await else {
        return;
    };
    p.kill_agent(0);
    p.start_agent_with(0, &[("RM_AGENT_FAULT", "after-jit-before-spawn")])
        .unwrap();
    p.policy_ready("web", json!({"minIdle": 0})).await;
    let job = p.queue_linux_job(200).await.unwrap();
    let agent = p.agents[0].process.as_mut().unwrap();
    let aborted = agent.exited(STEP, "the agent to abort at the fault").await;
    aborted.unwrap_or_else(|e| panic!("{e}; logs in {}", p.logs().display()));
    p.start_agent(0).unwrap();
    p.wait_jobs_completed(&[job], Duration::from_secs(180))
        .await
        .unwrap();
    let list = p.all_attempts().await;
    let lost: Vec<_> = list
        .iter()
        .filter(|a| {
            outcome(a)
                == Some(Outcome::Failed(
                    runner_manager_crds::outcome::FailureReason::JitExpired,
                ))
        })
        .collect();
    assert_eq!(lost.len(), 1, "one attempt lost its JIT");
    let lost_name = lost[0].metadata.name.clone().unwrap();
    assert!(
        list.iter()
            .any(|a| a.spec.replaces.as_deref() == Some(lost_name.as_str())),
        "no replacement names {lost_name}"
    );
    // One session per runner: the lost JIT never reached a listener, so sessions = runners - 1.
    let counters = p.fake.counters().await.unwrap();
    let sessions = counters["runner_session"]["201"].as_u64().unwrap_or(0);
    let mints = counters["generate_jitconfig"]["201"].as_u64().unwrap_or(0);
    assert_eq!(mints, list.len() as u64, "one mint per attempt");
    assert!(sessions < mints, "the lost JIT was used: {counters}");
    assert_settled_and_clean(&p).await;
}

/// A leader that meets a policy already being deleted (the old one died, or `helm upgrade` rolled
/// it, between the delete and the drain) deregisters each idle runner before stopping it, as the
/// leader that saw the policy live would. Before, the new process had never resolved the policy,
/// drained with no GitHub client, and the stopped runner's registration stayed on GitHub (found
/// by the real node's Helm scenario: `helm upgrade`, then the policy deleted).
#[tokio::test]
async fn a_new_leader_draining_a_deleted_policy_deregisters_its_runners() {
    let options = ProductOptions::operator_flag("--orphan-grace", "1h");
    let Some(mut p) = Product::start_with("new_leader_drains_deleted_policy", options).await else {
        return;
    };
    p.policy_ready("web", json!({"minIdle": 1})).await;
    let idle = p
        .wait_attempts("an idle runner", Duration::from_secs(120), |list| {
            list.iter().any(|a| state(a) == AttemptState::Idle)
        })
        .await
        .into_iter()
        .find(|a| state(a) == AttemptState::Idle)
        .unwrap();
    let registration = runner_name(idle.spec.attempt_uuid().unwrap());
    assert_eq!(registrations_named(&p, &registration).await, 1);

    p.kill_operator(0);
    p.policies()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    p.restart_operator(0).await.unwrap();
    p.wait_policy_gone("web").await;
    // The finalizer goes only after every attempt is gone, each deregistered before its stop
    // was asked: no wait here, and the orphan sweep (an hour's grace) cannot have done it.
    assert_eq!(
        registrations_named(&p, &registration).await,
        0,
        "the drained runner's registration stayed on GitHub; logs in {}",
        p.logs().display()
    );
}

async fn registrations_named(p: &Product, name: &str) -> usize {
    p.fake.runners_named(name).await.unwrap().len()
}

/// The operator dies between GitHub's 201 and the broker's journal write (issue 20, item 3): a
/// registration exists under the attempt's runner name, no runner id is journalled and no JIT
/// left. The agent's answer is lost, so it concludes `Failed(JitExpired)` without a runner id.
/// The restarted operator deregisters that registration by the attempt's derived name on its next
/// observation pass, long before the orphan sweep could (its grace is an hour here, and it skips
/// registrations whose attempt still exists); the replacement runs the job.
#[tokio::test]
async fn an_operator_killed_between_the_mint_and_the_journal_leaves_no_registration() {
    const FAULT: &str = "RM_OPERATOR_FAULT";
    let options = ProductOptions {
        operator_flags: vec![("--orphan-grace".into(), "1h".into())],
        env: vec![(FAULT.into(), "after-mint-before-journal".into())],
        ..ProductOptions::default()
    };
    let Some(mut p) = Product::start_with("operator_killed_after_the_mint", options).await else {
        return;
    };
    p.policy_ready("web", json!({"minIdle": 0})).await;
    let job = p.queue_linux_job(200).await.unwrap();
    let operator = p.operators[0].process.as_mut().unwrap();
    let aborted = operator
        .exited(STEP, "the operator to abort after the mint")
        .await;
    aborted.unwrap_or_else(|e| panic!("{e}; logs in {}", p.logs().display()));
    let lost = p
        .wait_attempts("the attempt concluded JitExpired", STEP, |list| {
            list.iter().any(|a| {
                outcome(a)
                    == Some(Outcome::Failed(
                        runner_manager_crds::outcome::FailureReason::JitExpired,
                    ))
            })
        })
        .await
        .into_iter()
        .find(|a| outcome(a).is_some())
        .unwrap();
    assert!(
        journal_of(&lost).runner().is_none(),
        "the broker died before journalling a runner id"
    );
    let registration = runner_name(lost.spec.attempt_uuid().unwrap());
    assert_eq!(
        registrations_named(&p, &registration).await,
        1,
        "GitHub holds the minted registration"
    );

    p.kill_operator(0);
    p.set_env(FAULT, None);
    p.restart_operator(0).await.unwrap();
    p.hook_to(0).await.unwrap();
    wait::until(STEP, "the lost attempt's registration deleted", || async {
        (registrations_named(&p, &registration).await == 0).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs in {}", p.logs().display()));
    p.wait_jobs_completed(&[job], Duration::from_secs(180))
        .await
        .unwrap();
    let list = p.all_attempts().await;
    let lost_name = lost.metadata.name.clone().unwrap();
    assert!(
        list.iter()
            .any(|a| a.spec.replaces.as_deref() == Some(lost_name.as_str())),
        "no replacement names {lost_name}"
    );
    assert_each_job_ran_once(&p, &[job]).await;
    assert_settled_and_clean(&p).await;
}

/// The operator is SIGKILLed mid-burst and restarted: every job still runs once and everything
/// settles clean.
#[tokio::test]
async fn the_operator_killed_mid_burst_converges_after_restart() {
    let Some(mut p) = product_with_web("operator_killed_mid_burst", json!({"minIdle": 0})).await
    else {
        return;
    };
    let jobs = p.queue_jobs(4, 500).await.unwrap();
    p.wait_attempts("the burst under way", STEP, |list| !list.is_empty())
        .await;
    p.kill_operator(0);
    p.restart_operator(0).await.unwrap();
    p.hook_to(0).await.unwrap();
    p.wait_jobs_completed(&jobs, Duration::from_secs(180))
        .await
        .unwrap();
    assert_each_job_ran_once(&p, &jobs).await;
    assert_settled_and_clean(&p).await;
}

/// Leader failover with webhooks delivered to the standby: the standby's receiver records the
/// job for the leader; when the leader is SIGKILLed the standby takes over within the lease
/// duration and the next job runs too.
#[tokio::test]
async fn the_standby_takes_over_and_webhooks_it_received_count() {
    let options = ProductOptions {
        operators: 2,
        webhooks_to: 1,
        ..ProductOptions::default()
    };
    let Some(mut p) = Product::start_with("leader_failover", options).await else {
        return;
    };
    let leader = wait::until(STEP, "a leader", || p.leader()).await.unwrap();
    let (leader_i, standby_i) = if leader == p.operators[0].identity {
        (0, 1)
    } else {
        (1, 0)
    };
    // Webhooks go to the standby (replica 1 unless it won the election).
    if standby_i != 1 {
        p.hook_to(standby_i).await.unwrap();
    }
    p.policy_ready("web", json!({"minIdle": 0})).await;
    p.run_job(200, Duration::from_secs(120)).await.unwrap();
    p.kill_operator(leader_i);
    let standby = p.operators[standby_i].identity.clone();
    wait::until(STEP, "the standby to lead", || async {
        (p.leader().await? == standby).then_some(())
    })
    .await
    .unwrap();
    p.run_job(200, Duration::from_secs(120)).await.unwrap();
    assert_settled_and_clean(&p).await;
}

/// GitHub 5xx and 429 storms during a burst: everything converges, every job runs once, no
/// attempt is lost and no registration is left.
#[tokio::test]
async fn a_burst_converges_through_github_5xx_and_429_storms() {
    let options = ProductOptions::operator_flag("--attempt-history", "2");
    let Some(p) = Product::start_with("github_storms", options).await else {
        return;
    };
    p.policy_ready("web", json!({"minIdle": 0})).await;
    for (endpoint, fault) in [
        ("generate_jitconfig", json!({"status": 502, "count": 2})),
        (
            "generate_jitconfig",
            json!({"status": 429, "retry_after_secs": 1, "count": 1}),
        ),
        ("list_runners", json!({"status": 503, "count": 3})),
        (
            "list_runners",
            json!({"status": 429, "retry_after_secs": 1, "count": 2}),
        ),
        ("delete_runner", json!({"status": 500, "count": 1})),
    ] {
        let mut body = fault;
        body["endpoint"] = json!(endpoint);
        p.fake.admin("POST", "faults", body).await.unwrap();
    }
    let jobs = p.queue_jobs(4, 300).await.unwrap();
    p.wait_jobs_completed(&jobs, Duration::from_secs(180))
        .await
        .unwrap();
    assert_each_job_ran_once(&p, &jobs).await;
    assert_settled_and_clean(&p).await;
    // History: Cleaned attempts past the policy's limit (2 here) are garbage-collected.
    p.wait_attempts("at most two Cleaned attempts kept", STEP, |list| {
        list.iter()
            .filter(|a| state(a) == AttemptState::Cleaned)
            .count()
            <= 2
    })
    .await;
}

/// A runner that never registers (its session hangs at the fake) is stopped at the registration
/// deadline; the job runs on another runner and the timed-out one is a registration failure.
#[tokio::test]
async fn a_runner_that_never_registers_is_stopped_and_its_job_runs_elsewhere() {
    let Some(p) = Product::start("registration_timeout").await else {
        return;
    };
    p.fake
        .fault(json!({"endpoint": "runner_session", "latency_ms": 600_000, "count": 1}))
        .await
        .unwrap();
    p.policy(
        "web",
        json!({"minIdle": 0, "timeouts": {"registration": "30s", "idle": "10m"}}),
    )
    .await
    .unwrap();
    p.wait_ready("web").await;
    let job = p.run_job(200, Duration::from_secs(240)).await.unwrap();
    let list = p.all_attempts().await;
    // Whichever sees the deadline first stops it: the operator (deregister, then
    // `spec.termination`) or the agent, which holds the same deadline from `jitReceivedAt`.
    let timed_out: Vec<_> = list
        .iter()
        .filter(|a| {
            a.spec.termination.as_ref().is_some_and(|t| {
                t.reason == runner_manager_crds::attempt::TerminationReason::RegistrationTimeout
            }) || outcome(a)
                == Some(Outcome::Failed(
                    runner_manager_crds::outcome::FailureReason::TerminatedAfterRegistrationTimeout,
                ))
        })
        .collect();
    assert_eq!(
        timed_out.len(),
        1,
        "one attempt hit its registration deadline"
    );
    // The job ran on another runner. When the operator takes the deadline it requests the
    // termination and its demand places a fresh attempt at once (the terminating one no longer
    // counts), which may carry no lineage; when the agent's backstop concludes first, the
    // replacement names it in `spec.replaces`. Either way the timed-out runner took nothing.
    let first = timed_out[0].clone();
    let ran_on = p.job(job).await.unwrap()["runner_name"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(ran_on, runner_name(first.spec.attempt_uuid().unwrap()));
    assert_settled_and_clean(&p).await;
    let first = p
        .attempts()
        .get(first.metadata.name.as_deref().unwrap())
        .await
        .unwrap();
    assert_eq!(
        outcome(&first),
        Some(Outcome::Failed(
            runner_manager_crds::outcome::FailureReason::TerminatedAfterRegistrationTimeout
        ))
    );
}

/// An idle runner past its idle timeout is deregistered, stopped and concluded
/// `ExitedIdleWithoutWork` — not a failure, never replaced (minIdle may ask for a new one, which
/// carries no lineage).
#[tokio::test]
async fn an_idle_timeout_exits_idle_without_work_and_is_not_replaced() {
    let Some(p) = Product::start("idle_timeout").await else {
        return;
    };
    p.policy(
        "web",
        json!({"minIdle": 1, "timeouts": {"registration": "5m", "idle": "30s"}}),
    )
    .await
    .unwrap();
    let list = p
        .wait_attempts("an idle-timeout exit", Duration::from_secs(180), |list| {
            list.iter()
                .any(|a| outcome(a) == Some(Outcome::ExitedIdleWithoutWork))
        })
        .await;
    let exited = list
        .iter()
        .find(|a| outcome(a) == Some(Outcome::ExitedIdleWithoutWork))
        .unwrap();
    // The operator deregisters first, then requests the termination (DESIGN §4 rule 3). A
    // listener whose registration is gone may exit by itself before the request lands; either
    // way the exit is idle, and any request there is names the idle timeout, deregistered.
    if let Some(t) = &exited.spec.termination {
        assert_eq!(
            t.reason,
            runner_manager_crds::attempt::TerminationReason::IdleTimeout
        );
        assert!(t.deregistered, "stopped before it was deregistered");
    }
    let name = exited.metadata.name.clone().unwrap();
    let list = p.all_attempts().await;
    assert!(
        list.iter()
            .all(|a| a.spec.replaces.as_deref() != Some(name.as_str())),
        "an idle exit was replaced"
    );
    let sp = p.policies().get("web").await.unwrap();
    let degraded = find(
        &sp.status.unwrap().conditions,
        PolicyConditionType::Degraded,
    )
    .map(|c| c.status == ConditionStatus::True);
    assert_ne!(degraded, Some(true), "an idle exit counted as a failure");
}

/// The fork gate (issue 31 item 3): on a persistent slot, a job of a fork's pull request fails
/// at its start, before any step (its write never reaches the slot), with a `JobRefused` event
/// naming the reason; a pull request from the repository itself runs. The same fork job on the
/// same policy switched to `forkPullRequests: Allow` poisons the slot: the attack the gate stops
/// is real.
#[tokio::test]
async fn a_fork_pull_request_never_touches_a_persistent_slot() {
    let spec = json!({"minIdle": 0, "maxRunners": 1});
    let Some((p, slots)) = persistent_product("fork_gate", spec).await else {
        return;
    };
    let work = slots.join("s1").join("_work");
    let labels = ["self-hosted", "linux"];
    let writes =
        |file: &str| json!({"duration_ms": 100, "write_files": [{"path": file, "bytes": 16}]});
    let run = |job: u64| completed_and_cleaned(&p, job);
    // A pull request from `head` writing `file` runs to success: whether its write reached the
    // slot.
    let (product, slot_work) = (&p, &work);
    let wrote = |file: &'static str, head: &'static str| async move {
        let job = product
            .queue_pull_request_job(&labels, writes(file), head)
            .await
            .unwrap();
        assert_eq!(run(job).await["conclusion"], "success");
        slot_work.join(file).is_file()
    };

    // A pull request from acme/web itself runs on the slot.
    assert!(
        wrote("own.txt", "acme/web").await,
        "the repository's own job ran"
    );

    // A fork's pull request fails before its first step.
    let fork = p
        .queue_pull_request_job(&labels, writes("poison.txt"), "mallory/web")
        .await
        .unwrap();
    let j = run(fork).await;
    assert_eq!(j["conclusion"], "failure", "{j}");
    assert!(
        !work.join("poison.txt").exists(),
        "the fork's job wrote into the persistent slot"
    );
    assert!(
        work.join("own.txt").is_file(),
        "the slot was left as it was"
    );
    let runner = j["runner_name"].as_str().unwrap().to_owned();
    let attempt = p
        .all_attempts()
        .await
        .into_iter()
        .find(|a| runner_name(a.spec.attempt_uuid().unwrap()) == runner)
        .unwrap();
    let name = attempt.metadata.name.clone().unwrap();
    let refused = p.event_on(&name, "JobRefused", STEP).await.unwrap();
    let note = refused.note.unwrap_or_default();
    assert!(
        note.contains("ForkPullRequest") && note.contains("mallory/web"),
        "{note}"
    );
    // The gate is gone with its runner.
    let gate = p.agents[0]
        .host
        .join("gates")
        .join(runner_manager_crds::names::short_hex(
            attempt.spec.attempt_uuid().unwrap(),
        ));
    assert!(
        !gate.exists(),
        "the gate outlived its attempt: {}",
        gate.display()
    );

    // Without the gate the same job poisons the slot.
    kube::Api::<ScalePolicy>::namespaced(p.kube.clone(), &p.team)
        .patch(
            "web",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                &json!({"spec": {"workspace": {"forkPullRequests": "Allow"}}}),
            ),
        )
        .await
        .unwrap();
    assert!(
        wrote("poison.txt", "mallory/web").await,
        "with forkPullRequests: Allow the fork's write reaches the slot"
    );
}

/// Dependency caches with a trust tier (issue 31 item 2): a main-branch job's npm cache is kept
/// for the next job; a fork's pull request reads it, overwrites it in its own view (the attack,
/// performed), and its write is discarded with its runner; the next main-branch job reads what
/// the trusted job left. Nothing of any runner's cache outlives its cleanup.
#[tokio::test]
async fn a_fork_job_reads_the_cache_but_never_poisons_it() {
    let Some(p) = cache_product("cache_trust").await else {
        return;
    };
    let labels = ["self-hosted", "linux"];
    let file = |content: Option<&str>| json!({"variable": "npm_config_cache", "path": "pkg/index.js", "content": content});
    let run = |job: u64| completed_and_cleaned(&p, job);
    // The namespace's newest generation, as the next runner will read it.
    let newest = || {
        let ns = cache_namespace_dir(&p)?;
        let newest = std::fs::read_dir(&ns)
            .ok()?
            .filter_map(Result::ok)
            .filter_map(|e| {
                e.file_name()
                    .to_str()?
                    .strip_prefix("gen-")?
                    .parse::<u64>()
                    .ok()
            })
            .max()?;
        Some((newest, ns.join(format!("gen-{newest}"))))
    };
    let nothing_left = || assert_no_cache_left(&p);

    // A push to main fills the cache, and its writes are kept.
    let main = p
        .queue_job(&labels, json!({"write_cache": [file(Some("good"))]}))
        .await
        .unwrap();
    assert_eq!(run(main).await["conclusion"], "success");
    let (first, gen_dir) = newest().expect("the trusted job's writes are a generation");
    assert_eq!(
        std::fs::read_to_string(gen_dir.join("npm/pkg/index.js")).unwrap(),
        "good"
    );
    nothing_left();

    // A fork's pull request reads the warm cache and poisons it in its own view.
    let fork = p
        .queue_pull_request_job(
            &labels,
            json!({
                "expect_cache": [file(Some("good"))],
                "write_cache": [file(Some("evil"))],
            }),
            "mallory/web",
        )
        .await
        .unwrap();
    let j = run(fork).await;
    assert_eq!(j["conclusion"], "success", "the fork's job runs: {j}");
    let (after, gen_dir) = newest().unwrap();
    assert_eq!(after, first, "the fork's writes made no generation");
    assert_eq!(
        std::fs::read_to_string(gen_dir.join("npm/pkg/index.js")).unwrap(),
        "good"
    );
    nothing_left();

    // The next main-branch job reads what the trusted job left.
    let next = p
        .queue_job(&labels, json!({"expect_cache": [file(Some("good"))]}))
        .await
        .unwrap();
    let j = run(next).await;
    assert_eq!(
        j["conclusion"], "success",
        "the poisoned file reached a trusted job: {j}"
    );
    nothing_left();
    assert_settled_and_clean(&p).await;
}

/// An agent SIGKILLed while a trusted job writes its cache: the runner's overlay, its lease and
/// the broker's verdict are on disk, so the restarted agent commits the job's writes at cleanup
/// and leaves no cache, mount or gate behind.
#[tokio::test]
async fn a_trusted_jobs_cache_survives_an_agent_killed_mid_job() {
    let Some(mut p) = cache_product("cache_crash").await else {
        return;
    };
    let caches = p.agents[0].host.join("caches");
    let job = p
        .queue_job(
            &["self-hosted", "linux"],
            json!({
                "duration_ms": 4000,
                "write_cache": [{"variable": "npm_config_cache", "path": "pkg/index.js", "content": "kept"}],
            }),
        )
        .await
        .unwrap();
    // The broker's verdict is recorded beside the runner's cache before any step runs.
    let attempts = caches.join("attempts");
    wait::until(STEP, "the job's write-back verdict on disk", || {
        let kept = std::fs::read_dir(&attempts)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.path().join("keep").is_file());
        async move { kept.then_some(()) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs in {}", p.logs().display()));
    p.kill_agent(0);
    p.start_agent(0).unwrap();
    let j = completed_and_cleaned(&p, job).await;
    assert_eq!(j["conclusion"], "success", "{j}");
    let ns = cache_namespace_dir(&p).expect("the namespace exists");
    assert_eq!(
        std::fs::read_to_string(ns.join("gen-1/npm/pkg/index.js")).unwrap(),
        "kept",
        "the restarted agent committed the trusted job's writes"
    );
    assert_no_cache_left(&p);
    assert_settled_and_clean(&p).await;
}

/// An agent killed under an idle gated runner reopens the runner's gate once it is back (until
/// then the hook finds no listener and would refuse): the job that runner then takes is
/// admitted through the reopened gate, and nothing of either gate is left after cleanup.
#[tokio::test]
async fn a_restarted_agent_reopens_the_job_gate_of_a_live_runner() {
    let Some((mut p, _)) =
        persistent_product("fork_gate_restart", json!({"minIdle": 1, "maxRunners": 1})).await
    else {
        return;
    };
    let idle = p.one_in(AttemptState::Idle, "a runner idle", STEP).await;
    let socket = p.agents[0]
        .host
        .join("gates")
        .join(runner_manager_crds::names::short_hex(
            idle.spec.attempt_uuid().unwrap(),
        ))
        .join("gate.sock");
    assert!(
        std::os::unix::net::UnixStream::connect(&socket).is_ok(),
        "the gate serves"
    );
    p.kill_agent(0);
    assert!(
        std::os::unix::net::UnixStream::connect(&socket).is_err(),
        "no gate while the agent is down"
    );
    p.start_agent(0).unwrap();
    wait::until(STEP, "the gate reopened", || {
        let up = std::os::unix::net::UnixStream::connect(&socket).ok();
        async move { up.map(|_| ()) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs in {}", p.logs().display()));
    let job = p
        .queue_pull_request_job(
            &["self-hosted", "linux"],
            json!({"duration_ms": 100}),
            "acme/web",
        )
        .await
        .unwrap();
    let took = "the restarted agent's runner took it";
    succeeded_on(&p, job, &idle, Duration::from_secs(180), took).await;
    p.policies()
        .patch(
            "web",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&json!({"spec": {"minIdle": 0}})),
        )
        .await
        .unwrap();
    assert_settled_and_clean(&p).await;
}

/// Persistent slots: job 1 writes into `_work`, job 2 on the same node and slot finds it; a job
/// that replaces `_work` with a symlink quarantines its slot (condition + event, nothing outside
/// removed) and later jobs use another slot.
#[tokio::test]
async fn persistent_slots_keep_work_and_a_symlinked_work_quarantines_the_slot() {
    let Some((p, slots)) =
        persistent_product("persistent_slots", json!({"minIdle": 0, "maxRunners": 2})).await
    else {
        return;
    };
    let slot_of = |a: &RunnerAttempt| {
        a.status
            .as_ref()
            .and_then(|s| s.journal.workspace())
            .and_then(|w| w.slot_number())
    };
    // Job 1 writes a file; job 2 runs after it (one at a time) and writes another.
    for (i, file) in ["cache/one.txt", "cache/two.txt"].iter().enumerate() {
        let job = p
            .queue_job(
                &["self-hosted", "linux"],
                json!({"duration_ms": 200, "write_files": [{"path": file, "bytes": 64}]}),
            )
            .await
            .unwrap();
        p.wait_jobs_completed(&[job], Duration::from_secs(180))
            .await
            .unwrap();
        let list = p
            .wait_attempts("the job's attempt cleaned", STEP, |list| {
                list.iter().all(|a| state(a) == AttemptState::Cleaned)
            })
            .await;
        assert!(
            list.iter().all(|a| slot_of(a) == Some(1)),
            "round {i}: the lowest slot, reused: {:?}",
            list.iter().map(slot_of).collect::<Vec<_>>()
        );
    }
    let work = slots.join("s1").join("_work");
    assert!(work.join("cache/one.txt").is_file(), "job 1's file kept");
    assert!(work.join("cache/two.txt").is_file(), "job 2's file kept");

    // A hostile job points `_work` at a directory outside the slot.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("precious"), b"keep me").unwrap();
    let hostile = p
        .queue_job(
            &["self-hosted", "linux"],
            json!({"duration_ms": 200, "symlink_work_to": outside.path()}),
        )
        .await
        .unwrap();
    let runner = runner_of(&p, hostile).await;
    let list = p
        .wait_attempts("the hostile job's slot quarantined", STEP, |list| {
            list.iter().any(|a| {
                runner_name(a.spec.attempt_uuid().unwrap()) == runner
                    && a.status.as_ref().is_some_and(|s| {
                        s.journal.conditions.iter().any(|c| {
                            c.type_
                                == runner_manager_crds::attempt::AttemptConditionType::Quarantined
                                && c.status == ConditionStatus::True
                        })
                    })
            })
        })
        .await;
    let quarantined = list
        .iter()
        .find(|a| runner_name(a.spec.attempt_uuid().unwrap()) == runner)
        .unwrap();
    assert_eq!(slot_of(quarantined), Some(1));
    assert_eq!(
        std::fs::read(outside.path().join("precious")).unwrap(),
        b"keep me",
        "cleanup followed the symlink"
    );
    // The next job gets slot 2.
    let next = p.queue_linux_job(200).await.unwrap();
    let runner = runner_of(&p, next).await;
    let list = p.all_attempts().await;
    let a = list
        .iter()
        .find(|a| runner_name(a.spec.attempt_uuid().unwrap()) == runner)
        .unwrap();
    assert_eq!(slot_of(a), Some(2), "a quarantined slot is not reused");
}

/// An agent that never comes back: its node's Lease expires, its attempts are concluded
/// `Orphaned(NodeLost)` after the grace and replaced on the other node; a person releases the
/// orphan with the abandon annotation and the object goes.
#[tokio::test]
async fn a_lost_node_is_orphaned_replaced_elsewhere_and_released_by_abandon() {
    let options = ProductOptions {
        nodes: ["lost", "kept"]
            .map(|n| NodeOptions::in_pool(n, 1, "ci"))
            .to_vec(),
        operator_flags: vec![("--node-lost-grace".into(), "5s".into())],
        ..ProductOptions::default()
    };
    let Some(mut p) = Product::start_with("node_lost", options).await else {
        return;
    };
    pool_policy(&p, 1, "ci").await;
    let idle = p
        .one_in(AttemptState::Idle, "one idle runner", TWO_MINUTES)
        .await;
    let lost_i = p
        .agents
        .iter()
        .position(|a| a.node.name == idle.spec.node_name)
        .unwrap();
    let kept_node = p.agents[1 - lost_i].node.name.clone();
    // The node dies: its agent and its runner with it.
    p.kill_agent(lost_i);
    for pid in cgroup_procs(&p.agents[lost_i].cgroup_dir()) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status();
    }
    let name = idle.metadata.name.clone().unwrap();
    p.wait_attempts(
        "the orphan replaced on the other node",
        Duration::from_secs(120),
        |list| {
            let orphaned = list.iter().any(|a| {
                a.metadata.name.as_deref() == Some(name.as_str())
                    && outcome(a)
                        == Some(Outcome::Orphaned(
                            runner_manager_crds::outcome::OrphanReason::NodeLost,
                        ))
            });
            let replaced = list
                .iter()
                .any(|a| a.spec.node_name == kept_node && state(a) == AttemptState::Idle);
            orphaned && replaced
        },
    )
    .await;
    // Nobody can clean the orphan: a person releases it.
    let patch = json!({"metadata": {"annotations": {"runner-manager.dev/abandon": "true"}}});
    p.attempts()
        .patch(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    p.wait_gone(&p.attempts(), &name, "the abandoned attempt released")
        .await;
    // The dead runner's registration is gone; only the replacement's remains.
    let uuid = idle.spec.attempt_uuid().unwrap();
    wait::until(STEP, "the dead runner deregistered", || async {
        let regs = p.fake.runners().await.ok()?;
        regs.iter()
            .all(|r| r["name"] != runner_name(uuid).as_str())
            .then_some(())
    })
    .await
    .unwrap();
}
