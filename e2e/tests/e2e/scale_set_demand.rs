//! The scale-set demand mode end to end (issue 19): the real operator (and, for failover, two of
//! them) and agent against the simulated GitHub's Actions service, with every webhook dropped.
//! A `ScaleSet` policy learns of jobs only from its scale set's message queue, acquires them,
//! and its runners are minted with the set's JIT endpoint through the broker.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use runner_manager_crds::policy::ScalePolicy;
use runner_manager_e2e::harness::attempt::outcome;
use runner_manager_e2e::harness::product::{Product, ProductOptions, STEP};
use runner_manager_e2e::harness::wait;
use serde_json::{Value, json};

async fn scale_sets(p: &Product) -> Value {
    p.fake
        .admin("GET", "scale-sets", Value::Null)
        .await
        .unwrap()
}

/// Wait until `n` sessions are live (one per ScaleSet policy).
async fn wait_sessions(p: &Product, n: usize) {
    wait::until(STEP, "the scale-set sessions open", || async {
        let v = scale_sets(p).await;
        (v["sessions"].as_array()?.len() == n).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs in {}", p.logs().display()));
}

async fn queue(p: &Product, repo: &str, labels: &[&str], ms: u64) -> u64 {
    p.fake
        .queue_job(json!({"owner": "acme", "repo": repo, "labels": labels,
                          "behaviour": {"duration_ms": ms}}))
        .await
        .unwrap()
}

/// Queue a `self-hosted`, `linux` job of 200 ms on `acme/web` and wait (at most 60 s) until
/// it is completed.
async fn run_web_job(p: &Product) {
    let job = queue(p, "web", &["self-hosted", "linux"], 200).await;
    p.wait_jobs_completed(&[job], Duration::from_secs(60))
        .await
        .unwrap();
}

async fn drop_every_webhook(p: &Product) {
    p.fake.drop_webhooks(100_000).await.unwrap();
}

/// Every job completed once, successfully, each on its own runner, that runner minted through
/// the scale set `set` (by name). Returns the runner names.
async fn each_once_on_the_set(p: &Product, jobs: &[u64], set: &str) -> BTreeSet<String> {
    let sets = scale_sets(p).await;
    let minted: BTreeSet<u64> = sets["sets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["name"] == set)
        .flat_map(|s| s["runners"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r.as_u64())
        .collect();
    let mut runners = BTreeSet::new();
    for id in jobs {
        let job = p.job(*id).await.unwrap();
        assert_eq!(job["conclusion"], "success", "{job}");
        let name = job["runner_name"].as_str().unwrap().to_owned();
        assert!(runners.insert(name), "two jobs on one runner: {job}");
        let rid = job["runner_id"].as_u64();
        if let Some(rid) = rid {
            assert!(
                minted.contains(&rid),
                "job {id}'s runner was not minted through {set}: {sets}"
            );
        }
    }
    // No job acquired twice, and every job acquired by this set.
    let acquired: BTreeMap<u64, u64> = sets["acquired_by"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_u64().unwrap(), p[1].as_u64().unwrap()))
        .collect();
    for id in jobs {
        assert!(acquired.contains_key(id), "job {id} never acquired: {sets}");
    }
    runners
}

fn scale_set_calls(counters: &Value) -> u64 {
    counters
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| k.starts_with("scale_set") || k.contains("runner_registration"))
                .flat_map(|(_, v)| v.as_object().cloned().unwrap_or_default())
                .filter_map(|(_, n)| n.as_u64())
                .sum()
        })
        .unwrap_or(0)
}

/// A scale-set policy runs a burst with no webhook endpoint: every delivery dropped, webhooks
/// off in the policy, four jobs queued at once in two repositories of the organization.
#[tokio::test]
async fn a_scale_set_policy_runs_a_burst_with_no_webhook() {
    let Some(p) = scale_set_world_with(
        "scale_set_burst",
        ProductOptions::default(),
        &["web", "api"],
    )
    .await
    else {
        return;
    };
    scale_set_policy(&p, "sets", json!({})).await;
    wait_sessions(&p, 1).await;
    let started = Instant::now();
    let mut jobs = Vec::new();
    for repo in ["web", "api", "web", "api"] {
        jobs.push(queue(&p, repo, &["self-hosted", "linux"], 200).await);
    }
    p.wait_jobs_completed(&jobs, Duration::from_secs(60))
        .await
        .unwrap();
    let wall = started.elapsed();
    let set = format!("{}-sets", p.team);
    each_once_on_the_set(&p, &jobs, &set).await;
    p.fake.assert_every_delivery_dropped().await;
    let (rest, counters) = p.operator_github_calls().await.unwrap();
    println!(
        "scale-set burst: {} jobs in {} ms; {rest} REST calls, {} scale-set calls; {counters}",
        jobs.len(),
        wall.as_millis(),
        scale_set_calls(&counters)
    );
}

/// Two policies of one organization with different labels each get only their jobs: one scale
/// set each, and each job runs on a runner of the policy whose labels it asked for.
#[tokio::test]
async fn two_scale_set_policies_of_one_organization_each_get_only_their_jobs() {
    let Some(p) = scale_set_world("scale_set_two_policies").await else {
        return;
    };
    for (name, label) in [("linux", "linux"), ("gpu", "gpu")] {
        p.policy(
            name,
            json!({"github": {"url": "https://github.com/acme", "demand": "ScaleSet"},
                   "labels": ["self-hosted", label], "maxRunners": 2, "minIdle": 0,
                   "scaling": {"webhook": false}}),
        )
        .await
        .unwrap();
    }
    p.wait_ready("linux").await;
    p.wait_ready("gpu").await;
    wait_sessions(&p, 2).await;
    let linux = vec![
        queue(&p, "web", &["self-hosted", "linux"], 200).await,
        queue(&p, "web", &["self-hosted", "linux"], 200).await,
    ];
    let gpu = vec![queue(&p, "web", &["self-hosted", "gpu"], 200).await];
    let all: Vec<u64> = linux.iter().chain(&gpu).copied().collect();
    p.wait_jobs_completed(&all, Duration::from_secs(60))
        .await
        .unwrap();
    let ns = p.team.clone();
    let on_linux = each_once_on_the_set(&p, &linux, &format!("{ns}-linux")).await;
    let on_gpu = each_once_on_the_set(&p, &gpu, &format!("{ns}-gpu")).await;
    // Each runner belongs to an attempt of the policy whose labels the job asked for.
    let by_runner: BTreeMap<String, String> = p
        .all_attempts()
        .await
        .into_iter()
        .filter_map(|a| {
            let r = a.status.as_ref()?.journal.runner()?.name.clone();
            Some((r, a.spec.policy.clone()))
        })
        .collect();
    for r in &on_linux {
        assert_eq!(by_runner.get(r).map(String::as_str), Some("linux"), "{r}");
    }
    for r in &on_gpu {
        assert_eq!(by_runner.get(r).map(String::as_str), Some("gpu"), "{r}");
    }
}

/// The leader is killed mid-session (jobs just queued, some not yet acquired or started): the
/// standby takes the scale set's session over (deleting the one the dead leader recorded on the
/// policy rather than waiting for it to lapse) and every job runs exactly once.
#[tokio::test]
async fn the_standby_takes_the_scale_set_session_over_without_losing_or_duplicating_a_job() {
    let options = ProductOptions {
        operators: 2,
        ..ProductOptions::default()
    };
    let Some(mut p) = scale_set_world_with("scale_set_failover", options, &["web"]).await else {
        return;
    };
    scale_set_policy(&p, "sets", json!({})).await;
    wait_sessions(&p, 1).await;
    let first = vec![
        queue(&p, "web", &["self-hosted", "linux"], 200).await,
        queue(&p, "web", &["self-hosted", "linux"], 200).await,
    ];
    p.wait_jobs_completed(&first, Duration::from_secs(60))
        .await
        .unwrap();
    let leader = p.leader().await.expect("a leader");
    let i = p
        .operators
        .iter()
        .position(|o| o.identity == leader)
        .expect("the leader is one of ours");
    // Mid-session: jobs queued, then the leader killed at once.
    let mut second = Vec::new();
    for _ in 0..3 {
        second.push(queue(&p, "web", &["self-hosted", "linux"], 200).await);
    }
    p.kill_operator(i);
    let opened_before = scale_sets(&p).await["sessions_opened"].as_u64().unwrap();
    p.wait_jobs_completed(&second, Duration::from_secs(90))
        .await
        .unwrap();
    let sets = scale_sets(&p).await;
    assert!(
        sets["sessions_opened"].as_u64().unwrap() > opened_before,
        "the standby never opened a session: {sets}"
    );
    // The standby reclaimed the dead leader's session (recorded on the policy) rather than
    // waiting for it to lapse.
    assert!(
        p.all_log_lines()
            .iter()
            .any(|l| l.contains("held by a previous leader")),
        "the standby did not reclaim the session; logs in {}",
        p.logs().display()
    );
    let all: Vec<u64> = first.iter().chain(&second).copied().collect();
    let set = format!("{}-sets", p.team);
    each_once_on_the_set(&p, &all, &set).await;
    // No job duplicated: no more runners minted than jobs (minIdle 0), and the ledger empty.
    let minted: usize = sets["sets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["runners"].as_array().map_or(0, Vec::len))
        .sum();
    assert!(
        minted <= all.len(),
        "{minted} runners for {} jobs: {sets}",
        all.len()
    );
    wait::until(STEP, "the ledger empty", || async {
        let sp: ScalePolicy = p.policies().get("sets").await.ok()?;
        sp.status?.pending_jobs.is_empty().then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs in {}", p.logs().display()));
}

fn set_named<'a>(sets: &'a Value, name: &str) -> Option<&'a Value> {
    sets["sets"].as_array()?.iter().find(|s| s["name"] == name)
}

/// Waits until policy `name` is gone (its finalizers released); the failure names the logs.
async fn scale_set_policy(p: &Product, name: &str, extra: Value) {
    let mut spec = json!({"github": {"url": "https://github.com/acme", "demand": "ScaleSet"},
                          "minIdle": 0, "scaling": {"webhook": false}});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    p.policy(name, spec).await.unwrap();
    p.wait_ready(name).await;
}

/// [`scale_set_world_with`] the default options and the repository `web`.
async fn scale_set_world(test: &str) -> Option<Product> {
    scale_set_world_with(test, ProductOptions::default(), &["web"]).await
}

/// A [`scale_set_world`] whose `ScaleSet` policy `sets` is Ready and has its session open.
async fn sets_world(test: &str) -> Option<Product> {
    let p = scale_set_world(test).await?;
    scale_set_policy(&p, "sets", json!({})).await;
    wait_sessions(&p, 1).await;
    Some(p)
}

/// A product whose webhooks are all dropped, with the organization's repositories `repos`.
async fn scale_set_world_with(
    test: &str,
    options: ProductOptions,
    repos: &[&str],
) -> Option<Product> {
    let p = Product::start_with(test, options).await?;
    drop_every_webhook(&p).await;
    p.fake.add_repos("acme", repos).await.unwrap();
    Some(p)
}

/// Deleting a `ScaleSet` policy deletes its runner scale set on GitHub through the policy's
/// finalizer: through a GitHub outage (the finalizer holds, the deletion backs off and tries
/// again) and an operator crash in the middle of it (the restarted operator finds the finalizer
/// and finishes). Afterwards GitHub lists no scale set of the policy, no session and no runner
/// registration.
#[tokio::test]
async fn deleting_a_scale_set_policy_deletes_its_scale_set_through_an_outage_and_a_crash() {
    let Some(mut p) = sets_world("scale_set_deleted").await else {
        return;
    };
    run_web_job(&p).await;
    let set = format!("{}-sets", p.team);
    let sets = scale_sets(&p).await;
    assert!(set_named(&sets, &set).is_some(), "{sets}");
    let sp: ScalePolicy = p.policies().get("sets").await.unwrap();
    assert!(
        sp.metadata
            .finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f == "runner-manager.dev/scale-set"),
        "the set exists without the policy's scale-set finalizer"
    );
    // GitHub's scale-set API is down.
    p.fake
        .fault(json!({"endpoint": "scale_sets", "count": 100_000, "status": 503}))
        .await
        .unwrap();
    p.policies()
        .delete("sets", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    wait::until(STEP, "a deletion refused by GitHub", || async {
        let c = p.fake.counters().await.ok()?;
        (c["scale_sets"]["503"].as_u64().unwrap_or(0) >= 2).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs in {}", p.logs().display()));
    let held: ScalePolicy = p
        .policies()
        .get("sets")
        .await
        .expect("the policy went while its scale set could not be deleted");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert!(set_named(&scale_sets(&p).await, &set).is_some());
    // The operator dies mid-deletion; GitHub comes back; a new operator finishes.
    p.kill_operator(0);
    p.fake.admin("DELETE", "faults", Value::Null).await.unwrap();
    p.restart_operator(0).await.unwrap();
    p.wait_policy_gone("sets").await;
    let sets = scale_sets(&p).await;
    assert!(
        set_named(&sets, &set).is_none(),
        "the scale set leaked: {sets}"
    );
    assert!(
        sets["sessions"].as_array().unwrap().is_empty(),
        "a session leaked: {sets}"
    );
    assert!(
        p.fake.runners().await.unwrap().is_empty(),
        "a runner registration leaked"
    );
}

/// A policy switched away from the scale-set mode deletes its scale set (once no runner minted
/// through it is left) and drops the set's finalizer and annotations; the policy lives on.
#[tokio::test]
async fn a_policy_leaving_the_scale_set_mode_deletes_its_scale_set() {
    let Some(p) = sets_world("scale_set_mode_switch").await else {
        return;
    };
    run_web_job(&p).await;
    let set = format!("{}-sets", p.team);
    assert!(set_named(&scale_sets(&p).await, &set).is_some());
    p.policies()
        .patch(
            "sets",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"github": {"demand": "Webhook"}}})),
        )
        .await
        .unwrap();
    wait::until(
        STEP,
        "the scale set deleted and its finalizer released",
        || async {
            let sp: ScalePolicy = p.policies().get("sets").await.ok()?;
            let released = !sp
                .metadata
                .finalizers
                .unwrap_or_default()
                .iter()
                .any(|f| f == "runner-manager.dev/scale-set");
            let annotated = sp
                .metadata
                .annotations
                .unwrap_or_default()
                .keys()
                .any(|k| k.starts_with("runner-manager.dev/scale-set"));
            let v = scale_sets(&p).await;
            (released && !annotated && set_named(&v, &set).is_none()).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; logs in {}", p.logs().display()));
    let sets = scale_sets(&p).await;
    assert!(sets["sessions"].as_array().unwrap().is_empty(), "{sets}");
}

/// A changed `spec.labels` reaches the existing scale set (updated in place, as
/// actions-runner-controller's `UpdateRunnerScaleSet`): jobs with the new labels are acquired
/// and run, a job with the old labels no longer is.
#[tokio::test]
async fn a_label_change_updates_the_scale_set_in_place() {
    let Some(p) = sets_world("scale_set_labels").await else {
        return;
    };
    let set = format!("{}-sets", p.team);
    let before = scale_sets(&p).await;
    let id = set_named(&before, &set).unwrap()["id"].as_u64().unwrap();
    p.policies()
        .patch(
            "sets",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"labels": ["self-hosted", "gpu"]}})),
        )
        .await
        .unwrap();
    wait::until(STEP, "the scale set's labels updated", || async {
        let v = scale_sets(&p).await;
        let s = set_named(&v, &set)?;
        let labels: Vec<&str> = s["labels"]
            .as_array()?
            .iter()
            .filter_map(Value::as_str)
            .collect();
        (labels.contains(&"gpu") && !labels.contains(&"linux")).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs in {}", p.logs().display()));
    let after = scale_sets(&p).await;
    assert_eq!(
        set_named(&after, &set).unwrap()["id"].as_u64(),
        Some(id),
        "the set was replaced, not updated: {after}"
    );
    assert_eq!(after["sets"].as_array().unwrap().len(), 1, "{after}");
    wait_sessions(&p, 1).await;
    // The old label first, then the new: by the time the new one ran, the listener has seen both.
    let old = queue(&p, "web", &["self-hosted", "linux"], 200).await;
    let new = queue(&p, "web", &["self-hosted", "gpu"], 200).await;
    p.wait_jobs_completed(&[new], Duration::from_secs(60))
        .await
        .unwrap();
    each_once_on_the_set(&p, &[new], &set).await;
    let sets = scale_sets(&p).await;
    assert!(
        !sets["acquired_by"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a[0].as_u64() == Some(old)),
        "a job with the old label was acquired: {sets}"
    );
    assert_eq!(p.job(old).await.unwrap()["status"], "queued");
}

/// A `JobStarted` lost on GitHub's side leaves no ledger entry for the whole job: the set's
/// statistics say no job waits, and the entry goes while the job is still running (its
/// `JobCompleted` would have removed it only at the end).
#[tokio::test]
async fn a_lost_job_started_leaves_no_stale_ledger_entry() {
    let Some(p) = scale_set_world("scale_set_lost_started").await else {
        return;
    };
    p.fake
        .admin("PUT", "scale-sets/settings", json!({"drop_job_started": 1}))
        .await
        .unwrap();
    scale_set_policy(&p, "sets", json!({})).await;
    wait_sessions(&p, 1).await;
    let job = queue(&p, "web", &["self-hosted", "linux"], 90_000).await;
    wait::until(STEP, "the job running", || async {
        (p.job(job).await.ok()?["status"] == "in_progress").then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs in {}", p.logs().display()));
    let started = Instant::now();
    wait::until(Duration::from_secs(75), "the ledger empty", || async {
        let sp: ScalePolicy = p.policies().get("sets").await.ok()?;
        sp.status?.pending_jobs.is_empty().then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs in {}", p.logs().display()));
    println!(
        "stale entry removed {:?} after the job started",
        started.elapsed()
    );
    assert_eq!(
        p.job(job).await.unwrap()["status"],
        "in_progress",
        "the entry went only with JobCompleted"
    );
}

/// The listener acquires no more jobs than the policy can serve (`maxRunners` 1, three jobs at
/// once): the others stay available on GitHub and are acquired one by one as room frees, and
/// every job runs.
#[tokio::test]
async fn a_scale_set_policy_acquires_no_more_than_it_can_serve() {
    let Some(p) = scale_set_world("scale_set_backpressure").await else {
        return;
    };
    scale_set_policy(&p, "sets", json!({"maxRunners": 1})).await;
    wait_sessions(&p, 1).await;
    let mut jobs = Vec::new();
    for _ in 0..3 {
        jobs.push(queue(&p, "web", &["self-hosted", "linux"], 1500).await);
    }
    let most = std::sync::atomic::AtomicUsize::new(0);
    wait::until(Duration::from_secs(120), "every job completed", || {
        let (p, jobs, most) = (&p, &jobs, &most);
        async move {
            let acquired: BTreeSet<u64> = scale_sets(p).await["acquired_by"]
                .as_array()?
                .iter()
                .filter_map(|a| a[0].as_u64())
                .collect();
            let mut open = 0;
            let mut done = 0;
            for id in jobs {
                let status = p.job(*id).await.ok()?["status"].clone();
                if status == "completed" {
                    done += 1;
                } else if acquired.contains(id) {
                    open += 1;
                }
            }
            most.fetch_max(open, std::sync::atomic::Ordering::Relaxed);
            assert!(
                open <= 1,
                "{open} jobs acquired and not completed with maxRunners 1"
            );
            (done == jobs.len()).then_some(())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs in {}", p.logs().display()));
    assert_eq!(most.into_inner(), 1);
    let set = format!("{}-sets", p.team);
    each_once_on_the_set(&p, &jobs, &set).await;
}

/// Queued → started for each job (the fake's job leaves `queued`), polled every 50 ms.
async fn started_after(p: &Product, jobs: &[u64], queued_at: Instant) -> Vec<Duration> {
    let mut started: BTreeMap<u64, Duration> = BTreeMap::new();
    let deadline = queued_at + Duration::from_secs(90);
    while started.len() < jobs.len() && Instant::now() < deadline {
        for id in jobs {
            if started.contains_key(id) {
                continue;
            }
            if p.job(*id)
                .await
                .map(|j| j["status"] != "queued")
                .unwrap_or(false)
            {
                started.insert(*id, queued_at.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(started.len(), jobs.len(), "not every job started");
    started.into_values().collect()
}

/// Latency (queued → started) and the operator's GitHub calls per runner for webhook, polling
/// and scale-set modes, side by side in one run: one world per mode, the same organization
/// target, four jobs queued at once after the policy is Ready (and, for the scale set, its
/// session open). Printed for docs/benchmarks.md and docs/demand-modes.md.
#[tokio::test]
#[ignore = "a benchmark (three worlds): cargo test --test e2e scale_set_demand:: -- --ignored --nocapture"]
async fn demand_modes_side_by_side() {
    let mut rows = Vec::new();
    for mode in ["webhook", "polling", "scale-set"] {
        let Some(p) = Product::start(&format!("side_by_side_{}", mode.replace('-', "_"))).await
        else {
            return;
        };
        p.fake.add_repos("acme", &["web"]).await.unwrap();
        let spec = match mode {
            "webhook" => json!({"github": {"url": "https://github.com/acme"}, "minIdle": 0,
                                "scaling": {"webhook": true, "pollInterval": "60s"}}),
            "polling" => json!({"github": {"url": "https://github.com/acme"}, "minIdle": 0,
                                "scaling": {"webhook": false, "pollInterval": "10s"}}),
            _ => json!({"github": {"url": "https://github.com/acme", "demand": "ScaleSet"},
                        "minIdle": 0, "scaling": {"webhook": false}}),
        };
        if mode != "webhook" {
            drop_every_webhook(&p).await;
        }
        p.policy("bench", spec).await.unwrap();
        p.wait_ready("bench").await;
        if mode == "scale-set" {
            wait_sessions(&p, 1).await;
        }
        // Settle, then count only what the burst costs.
        tokio::time::sleep(Duration::from_secs(2)).await;
        p.fake
            .admin("DELETE", "counters", Value::Null)
            .await
            .unwrap();
        let queued_at = Instant::now();
        let mut jobs = Vec::new();
        for _ in 0..4 {
            jobs.push(queue(&p, "web", &["self-hosted", "linux"], 200).await);
        }
        let mut lat = started_after(&p, &jobs, queued_at).await;
        p.wait_jobs_completed(&jobs, Duration::from_secs(90))
            .await
            .unwrap();
        // Calls until every attempt is cleaned (deregistration included).
        p.wait_attempts("every attempt concluded", STEP, |list| {
            list.iter().all(|a| outcome(a).is_some())
        })
        .await;
        let (calls, counters) = p.operator_github_calls().await.unwrap();
        lat.sort();
        let ms = |d: Duration| d.as_millis();
        let row = format!(
            "| {mode} | {} ms | {} ms | {} ms | {:.1} | {} |",
            ms(lat[0]),
            ms(lat[lat.len() / 2]),
            ms(lat[lat.len() - 1]),
            calls as f64 / jobs.len() as f64,
            scale_set_calls(&counters),
        );
        println!("{row}\n  counters: {counters}");
        rows.push(row);
    }
    println!(
        "| mode | queued → started, fastest | median | slowest | operator GitHub calls per runner | of which scale-set service |"
    );
    println!("|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
}

/// Issue 28 item 6: the scale-set id the operator records on a policy is an annotation its
/// tenant can edit. A tenant who writes another tenant's set id there (then makes the operator
/// open a new session, and deletes its policy) must neither rename that set to its own (and so
/// take its jobs) nor delete it: an id is used only when GitHub says the set it names is this
/// policy's, by name. Without that check the victim's set is renamed `…-thief` and then deleted.
#[tokio::test]
async fn a_scale_set_id_written_into_a_policy_never_reaches_another_policys_set() {
    use kube::api::{Patch, PatchParams};
    use runner_manager_operator::controller::sources::scale_set::SET_ID_ANNOTATION;
    let Some(mut p) = scale_set_world("scale_set_id_forged").await else {
        return;
    };
    scale_set_policy(&p, "victim", json!({"labels": ["self-hosted", "victim"]})).await;
    scale_set_policy(&p, "thief", json!({"labels": ["self-hosted", "thief"]})).await;
    wait_sessions(&p, 2).await;
    let victim_set = format!("{}-victim", p.team);
    let sets = scale_sets(&p).await;
    let victim = set_named(&sets, &victim_set)
        .cloned()
        .unwrap_or_else(|| panic!("{sets}"));
    let victim_id = victim["id"].as_i64().unwrap();
    p.policies()
        .patch(
            "thief",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {SET_ID_ANNOTATION: victim_id.to_string()}}}),
            ),
        )
        .await
        .unwrap();
    // A new operator opens new sessions, each from the id recorded on its policy.
    p.kill_operator(0);
    p.restart_operator(0).await.unwrap();
    wait_sessions(&p, 2).await;
    let sets = scale_sets(&p).await;
    let now = set_named(&sets, &victim_set)
        .unwrap_or_else(|| panic!("the victim's set was renamed: {sets}"));
    assert_eq!(now["id"], victim["id"], "{sets}");
    assert_eq!(now["labels"], victim["labels"], "{sets}");
    // The thief's policy goes: its own set goes with it, the victim's stays.
    p.policies()
        .delete("thief", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    p.wait_policy_gone("thief").await;
    let sets = scale_sets(&p).await;
    assert!(
        set_named(&sets, &format!("{}-thief", p.team)).is_none(),
        "the thief's own set leaked: {sets}"
    );
    let after = set_named(&sets, &victim_set)
        .unwrap_or_else(|| panic!("the victim's set was deleted: {sets}"));
    assert_eq!(after["id"], victim["id"]);
    // And the victim still gets its jobs.
    let job = queue(&p, "web", &["self-hosted", "victim"], 200).await;
    p.wait_jobs_completed(&[job], Duration::from_secs(60))
        .await
        .unwrap();
}
