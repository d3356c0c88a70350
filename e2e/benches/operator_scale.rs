//! The operator at scale (DESIGN §10: 1,000 policies and 10,000 attempts → RSS ≤ 200 MiB, a
//! full pass ≤ 10 s), on the real control plane with the operator as a process and the simulated
//! GitHub (GitHub App credentials, so installation tokens are minted for real).
//!
//! The API server is filled first (every policy at its `maxRunners`, so the operator creates
//! nothing), then the operator starts. Printed:
//! - the baseline, in the same run: one plain LIST of every policy and attempt by this process
//!   (what any controller's first sync costs at least);
//! - operator start → the first pass done, and the first pass alone (the operator's own log
//!   line), which resolves every policy, observes every target and writes every status;
//! - the API server's requests during it by verb, resource and code (`apiserver_request_total`,
//!   so a write that lost its compare-and-swap shows as a 409), and the operator's own write and
//!   error counters;
//! - the steady pass afterwards (`runner_manager_reconcile_pass_seconds`);
//! - the operator's peak RSS over the sampling window;
//! - the GitHub calls the first pass made.
//!
//! `cargo bench -p runner-manager-e2e --bench operator_scale --profile dev` (1,000 policies,
//! 10,000 attempts); `-- --quick` (100 and 1,000) is what `make test` runs; `-- --policies 5000`
//! is the scale model's second point (docs/scale.md). Needs `KUBECONFIG`
//! (skips with a reason without it) and the workspace binaries built.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use kube::api::{ListParams, PostParams};
use runner_manager_e2e::harness::fixtures::native_attempt;
use runner_manager_e2e::harness::process::{cpu_seconds, rss_kib};
use runner_manager_e2e::harness::product::{Cadence, Product, ProductOptions};
use runner_manager_e2e::harness::wait;
use runner_manager_e2e::harness::world::World;
use serde_json::{Value, json};

/// A gauge's value from the operator's `/metrics`.
async fn metric(health: &str, name: &str) -> Option<f64> {
    let text = runner_manager_e2e::harness::telemetry::get(health, "/metrics")
        .await
        .ok()?
        .body;
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
}

/// [`first_pass`], waited for at most `secs` seconds; `what` names the wait.
async fn first_pass_within(p: &Product, secs: u64, what: &str) -> (u64, u64, u64, String) {
    wait::until(Duration::from_secs(secs), what, || async { first_pass(p) })
        .await
        .unwrap()
}

/// The operator's "first reconcile pass done" log line: (elapsed ms, policies, attempts, where
/// the time went: reconciles, status writes, and time summed per stage over all reconciles).
fn first_pass(p: &Product) -> Option<(u64, u64, u64, String)> {
    p.all_log_lines().iter().find_map(|l| {
        let v: Value = serde_json::from_str(l).ok()?;
        let f = v.get("fields")?;
        (f.get("message")?.as_str()? == "first reconcile pass done").then(|| {
            let n = |k: &str| f.get(k).and_then(Value::as_u64).unwrap_or(0);
            let profile = [
                "reconciles",
                "status_writes",
                "housekeeping_ms",
                "prepare_ms",
                "apply_ms",
            ]
            .iter()
            .map(|k| format!("{k} {}", n(k)))
            .collect::<Vec<_>>()
            .join(", ");
            (n("elapsed_ms"), n("policies"), n("attempts"), profile)
        })
    })
}

/// The operator's counters whose names start with `prefix` (`name{labels} value` lines).
async fn counters(health: &str, prefix: &str) -> Vec<String> {
    let Ok(r) = reqwest::get(format!("http://{health}/metrics")).await else {
        return Vec::new();
    };
    let text = r.text().await.unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

/// What the API server counts by request (`apiserver_request_total`), for the kinds the
/// operator reads and writes: (verb, resource[/subresource], code) → requests so far. The
/// control plane is shared with whatever else runs on it, so a delta is an upper bound.
async fn apiserver_requests(kube: &kube::Client) -> BTreeMap<(String, String, String), u64> {
    const KINDS: [&str; 6] = [
        "scalepolicies",
        "runnerattempts",
        "events",
        "leases",
        "secrets",
        "nodes",
    ];
    let Ok(req) = kube::core::Request::new("").get("metrics", &Default::default()) else {
        return BTreeMap::new();
    };
    let text = kube.request_text(req).await.unwrap_or_default();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |k: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{k}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let (verb, resource, sub, code) = (
            label("verb"),
            label("resource"),
            label("subresource"),
            label("code"),
        );
        if verb == "WATCH" || !KINDS.contains(&resource.as_str()) {
            continue;
        }
        let what = if sub.is_empty() {
            resource
        } else {
            format!("{resource}/{sub}")
        };
        let n = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        *out.entry((verb, what, code)).or_default() += n;
    }
    out
}

/// `after - before`, the non-zero lines, one per (verb, resource, code).
fn delta(
    before: &BTreeMap<(String, String, String), u64>,
    after: &BTreeMap<(String, String, String), u64>,
) -> Vec<String> {
    after
        .iter()
        .filter_map(|(k, n)| {
            let d = n.saturating_sub(before.get(k).copied().unwrap_or(0));
            (d > 0).then(|| format!("{} {} {}: {d}", k.0, k.1, k.2))
        })
        .collect()
}

async fn scale(policies: usize, per_policy: usize) {
    let options = ProductOptions {
        nodes: vec![],
        operators: 0,
        operator_flags: [
            // Nothing times out or is collected while measuring.
            ("--admission-timeout", "1h"),
            ("--attempt-history", "1000000"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect(),
        // The product's observe and resync intervals (30 s, 10 s; the resync was 5 s here): a
        // resync reconciles every policy again, so while the first pass lasts each extra round
        // is 1,000 reconciles that write nothing but take the operator's share of the 2 cores
        // that the API server, which bounds the pass, also needs.
        cadence: Cadence::Product,
        ..ProductOptions::default()
    };
    let Some(mut p) = World::builder("bench_operator_scale")
        .product(options)
        .await
        .unwrap()
    else {
        return;
    };
    let filled = Instant::now();
    let names: Vec<String> = (0..policies).map(|i| format!("p{i:04}")).collect();
    let spec = json!({"maxRunners": per_policy, "minIdle": 0});
    let created: Vec<_> = futures_util::stream::iter(&names)
        .map(|n| p.policy(n, spec.clone()))
        .buffer_unordered(16)
        .collect()
        .await;
    let attempts: Vec<_> = created
        .into_iter()
        .map(Result::unwrap)
        .flat_map(|sp| {
            let name = sp.metadata.name.clone().unwrap();
            let uid = sp.metadata.uid.clone().unwrap();
            (0..per_policy).map(move |_| {
                native_attempt(uuid::Uuid::new_v4(), &name, &uid, "rm-bench-no-such-node")
            })
        })
        .collect();
    let api = p.attempts();
    futures_util::stream::iter(&attempts)
        .for_each_concurrent(32, |a| {
            let api = api.clone();
            async move {
                let mut a = a.clone();
                a.metadata.namespace = None;
                api.create(&PostParams::default(), &a).await.unwrap();
            }
        })
        .await;
    println!(
        "filled the API server: {policies} policies, {} attempts in {:.1} s",
        attempts.len(),
        filled.elapsed().as_secs_f64()
    );

    let listed = Instant::now();
    let n_policies = p.policies().list(&ListParams::default()).await.unwrap();
    let n_attempts = p.attempts().list(&ListParams::default()).await.unwrap();
    let baseline = listed.elapsed();
    assert_eq!(n_attempts.items.len(), attempts.len());
    drop((n_policies, n_attempts));

    let (calls_before, _) = p.operator_github_calls().await.unwrap();
    let requests_before = apiserver_requests(&p.kube).await;
    let started = Instant::now();
    let op = p.start_operator("operator-0").await.unwrap();
    let pid = op.process.as_ref().unwrap().child.id();
    let health = op.health.clone();
    p.operators.push(op);
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    // The operator's log line, not a LIST: polling every policy at 10 Hz is load on the API
    // server the pass is bound by (one LIST of 1,000 policies costs it more than a status write).
    let first = first_pass_within(&p, 900, "the first-pass log line").await;
    let all_reconciled = started.elapsed();
    let requests = delta(&requests_before, &apiserver_requests(&p.kube).await);
    let (calls_after, _) = p.operator_github_calls().await.unwrap();
    let errors = counters(&health, "runner_manager_reconcile_errors_total").await;
    let writes = counters(&health, "runner_manager_api_writes_total").await;
    // The pass reconciled every policy once; each has its status (a failed status write would
    // show here as a wait).
    wait::until(
        Duration::from_secs(300),
        "every policy has a status",
        || async {
            let all = p.policies().list(&ListParams::default()).await.ok()?;
            let done = all
                .items
                .iter()
                .filter(|sp| sp.status.as_ref().is_some_and(|s| !s.conditions.is_empty()))
                .count();
            (done == policies).then_some(())
        },
    )
    .await
    .unwrap();
    // Steady state: sample RSS while the operator keeps passing over everything.
    let mut steady = Vec::new();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        if let Some(seconds) = metric(&health, "runner_manager_reconcile_pass_seconds").await {
            steady.push(seconds * 1000.0);
        }
    }
    sampler.abort();
    let peak = peak.load(Ordering::Relaxed);
    let cpu = cpu_seconds(pid);

    // A restart (an upgrade, a failover): finalizers are in place and statuses current, so the
    // first pass writes next to nothing.
    p.kill_operator(0);
    let restarted = Instant::now();
    let op = p.start_operator("operator-1").await.unwrap();
    p.operators.push(op);
    let again = first_pass_within(&p, 300, "the restarted operator's first pass").await;
    let restart_total = restarted.elapsed();

    let after = p.attempts().list(&ListParams::default()).await.unwrap();
    assert_eq!(
        after.items.len(),
        attempts.len(),
        "the operator created nothing"
    );
    println!(
        "baseline: one LIST of every policy and attempt by this process {:.2} s",
        baseline.as_secs_f64()
    );
    println!(
        "operator start -> every policy reconciled {:.1} s; first pass {:.1} s over {} policies / {} attempts (target: full pass <= 10 s at 1,000 / 10,000)",
        all_reconciled.as_secs_f64(),
        first.0 as f64 / 1000.0,
        first.1,
        first.2
    );
    println!(
        "  first pass profile (stage times summed over concurrent reconciles): {}; after the restart: {}",
        first.3, again.3
    );
    println!(
        "  API server requests from operator start to the first-pass line (verb, resource, code; shared control plane, so an upper bound): {}",
        requests.join("; ")
    );
    println!(
        "  operator counters after the first pass: {}",
        writes
            .iter()
            .chain(&errors)
            .cloned()
            .collect::<Vec<_>>()
            .join("; ")
    );
    println!(
        "operator CPU from start to the end of sampling {cpu:.1} s; after a kill and restart: start -> first pass done {:.1} s (waits out the dead leader's Lease), the pass itself {:.1} s",
        restart_total.as_secs_f64(),
        again.0 as f64 / 1000.0
    );
    println!(
        "steady pass {:.0}..{:.0} ms; operator peak RSS {} MiB (target: <= 200 MiB); GitHub calls in the first pass {} ({:.2} per policy)",
        steady.iter().copied().fold(f64::INFINITY, f64::min),
        steady.iter().copied().fold(0.0, f64::max),
        peak / 1024,
        calls_after - calls_before,
        (calls_after - calls_before) as f64 / policies as f64
    );
    release(&mut p).await;
}

/// Remove everything the bench made. The harness leaves a scenario's namespace behind (it is
/// small and CI's control plane is fresh), but these are 1,000 policies and 10,000 attempts,
/// each holding a finalizer no operator will release once this one is stopped: left in place,
/// every later run on the same control plane pays for them (a developer's control plane held
/// eleven such namespaces, ~120,000 objects, and the API server spent a quarter of its CPU in
/// garbage collection). The operator is stopped first so it does not act on the deletions.
async fn release(p: &mut Product) {
    p.stop_operators();
    release_all(&p.attempts(), "attempts").await;
    release_all(&p.policies(), "policies").await;
}

/// Drop every finalizer of the namespace's `K`s, then delete them all.
async fn release_all<K>(api: &kube::Api<K>, what: &str)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    use kube::api::{DeleteParams, Patch, PatchParams};
    let strip = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    let names: Vec<String> = api
        .list_metadata(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter_map(|o| o.metadata.name)
                .collect()
        })
        .unwrap_or_default();
    futures_util::stream::iter(names)
        .for_each_concurrent(32, |n| {
            let strip = &strip;
            async move {
                let _ = api.patch(&n, &PatchParams::default(), strip).await;
            }
        })
        .await;
    if let Err(e) = api
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
    {
        eprintln!("could not delete the bench's {what}: {e}");
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    // `--policies N`: the scale model's second point (docs/scale.md: 5,000 policies, 50,000
    // attempts), ten attempts per policy as always.
    let policies = args
        .iter()
        .position(|a| a == "--policies")
        .and_then(|i| args.get(i + 1)?.parse().ok());
    match (policies, quick) {
        (Some(n), _) => scale(n, 10).await,
        (None, true) => scale(100, 10).await,
        (None, false) => scale(1000, 10).await,
    }
}
