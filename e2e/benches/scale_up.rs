//! Scale-up figures of the whole loop (issue 8, DESIGN §10), on the real control plane with the
//! operator and a node agent as processes and the simulated GitHub delivering webhooks:
//!
//! - webhook `queued` → runner process started (the attempt's journal shows a process), cold
//!   (package not cached) and warm, p50/p95;
//! - a burst of jobs queued at once on one node with that capacity: time until every runner has
//!   started, and until every job is done;
//! - GitHub calls (the operator's REST calls) per launched runner, API writes per attempt, and
//!   the operator's and the agent's peak RSS;
//! - steady state: the agent's API reads (GET/LIST, from its own request counter) per attempt
//!   per minute while runners sit idle, then busy, over an idle agent's baseline.
//!
//! Latency and burst launch the runner-sized stand-in package (`Package::RunnerSized`: 9,112
//! files, a 170 MB archive, cached under `target/e2e-cache/packages`), so materialize costs what
//! GitHub's runner costs; each prints its timeline per attempt and writes per attempt by writer.
//!
//! `cargo bench -p runner-manager-e2e --bench scale_up --profile dev` (full: 20 warm samples, a
//! 50-job burst); `-- --quick` (3 warm samples, a 10-job burst) is what `make test` runs. Needs
//! `KUBECONFIG` (skips with a reason without it) and the workspace binaries built.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use kube::api::{Api, WatchEvent, WatchParams};
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::state::AttemptState;
use runner_manager_e2e::harness::process::{cpu_seconds, rss_kib};
use runner_manager_e2e::harness::product::{
    Cadence, NodeOptions, Product, ProductOptions, Write, WriteCounter, Writer,
};
use runner_manager_e2e::harness::telemetry::{agent_health, get, sample};
use runner_manager_e2e::harness::wait;
use runner_manager_e2e::harness::world::{Package, World};
use serde_json::json;

/// When each attempt was first seen with a runner process in its journal (and, in `created`,
/// when it was first seen at all; in the third map, when it was first seen in each state).
#[derive(Clone, Default)]
struct Started(
    Arc<Mutex<BTreeMap<String, Instant>>>,
    Arc<Mutex<BTreeMap<String, Instant>>>,
    Arc<Mutex<BTreeMap<String, BTreeMap<AttemptState, Instant>>>>,
);

impl Started {
    fn spawn(api: Api<RunnerAttempt>) -> (Self, tokio::task::JoinHandle<()>) {
        let this = Self::default();
        let sink = this.clone();
        let task = tokio::spawn(async move {
            let mut version = "0".to_owned();
            loop {
                let Ok(stream) = api.watch(&WatchParams::default(), &version).await else {
                    return;
                };
                let mut stream = std::pin::pin!(stream);
                while let Some(Ok(event)) = stream.next().await {
                    let (WatchEvent::Added(a) | WatchEvent::Modified(a)) = event else {
                        continue;
                    };
                    version = a.metadata.resource_version.clone().unwrap_or(version);
                    let seen = Instant::now();
                    sink.1
                        .lock()
                        .unwrap()
                        .entry(a.metadata.name.clone().unwrap_or_default())
                        .or_insert(seen);
                    let state = a
                        .status
                        .as_ref()
                        .map(|s| s.journal.state())
                        .unwrap_or_default();
                    sink.2
                        .lock()
                        .unwrap()
                        .entry(a.metadata.name.clone().unwrap_or_default())
                        .or_default()
                        .entry(state)
                        .or_insert(seen);
                    let started = a
                        .status
                        .as_ref()
                        .is_some_and(|s| s.journal.process().is_some());
                    if started {
                        let name = a.metadata.name.clone().unwrap_or_default();
                        sink.0
                            .lock()
                            .unwrap()
                            .entry(name)
                            .or_insert_with(Instant::now);
                    }
                }
            }
        });
        (this, task)
    }

    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    fn all(&self) -> Vec<Instant> {
        self.0.lock().unwrap().values().copied().collect()
    }

    /// When the attempts not named in `before` were first seen started: the burst's, however
    /// late the watch's initial listing delivers the earlier attempts (the warm-up's).
    fn started_except(&self, before: &std::collections::HashSet<String>) -> Vec<Instant> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(name, _)| !before.contains(*name))
            .map(|(_, t)| *t)
            .collect()
    }

    /// Per attempt first seen at or after `since`: when it was first seen in each state.
    fn timelines(&self, since: Instant) -> Vec<BTreeMap<AttemptState, Instant>> {
        let created = self.1.lock().unwrap().clone();
        self.2
            .lock()
            .unwrap()
            .iter()
            .filter(|(name, _)| created.get(*name).is_some_and(|c| *c >= since))
            .map(|(_, t)| t.clone())
            .collect()
    }

    /// When the attempts not named in `before` were first seen, in order: the burst's, whatever
    /// order the watch's initial listing of earlier attempts (the warm-up's) arrives in.
    fn created_except(&self, before: &std::collections::HashSet<String>) -> Vec<Instant> {
        let mut all: Vec<Instant> = self
            .1
            .lock()
            .unwrap()
            .iter()
            .filter(|(name, _)| !before.contains(*name))
            .map(|(_, t)| *t)
            .collect();
        all.sort();
        all
    }

    /// The timeline of the one attempt created at or after `queued` (a single-job sample).
    fn sample_steps(&self, queued: Instant) -> Vec<(&'static str, Duration)> {
        let created: Vec<Instant> = self
            .created()
            .into_iter()
            .filter(|c| *c >= queued)
            .collect();
        let line = self
            .timelines(queued)
            .into_iter()
            .next()
            .unwrap_or_default();
        steps(queued, &line, created.first().copied())
    }

    /// Every attempt the watch has seen, the ones history collection deleted since included.
    fn seen(&self) -> std::collections::HashSet<String> {
        self.1.lock().unwrap().keys().cloned().collect()
    }

    /// When the attempts were first seen, in order.
    fn created(&self) -> Vec<Instant> {
        let mut all: Vec<Instant> = self.1.lock().unwrap().values().copied().collect();
        all.sort();
        all
    }
}

/// Writes per attempt by writer (mean, max) and the commonest sequence of writes.
fn by_writer(writes: &BTreeMap<String, Vec<Write>>) -> String {
    let n = writes.len().max(1) as f64;
    let mut out = Vec::new();
    for writer in [Writer::Operator, Writer::Broker, Writer::Agent] {
        let per: Vec<usize> = writes
            .values()
            .map(|w| w.iter().filter(|w| w.writer == writer).count())
            .collect();
        out.push(format!(
            "{} mean {:.1} max {}",
            writer.as_str(),
            per.iter().sum::<usize>() as f64 / n,
            per.iter().max().copied().unwrap_or(0)
        ));
    }
    let mut sequences: BTreeMap<String, usize> = BTreeMap::new();
    for w in writes.values() {
        let seq: Vec<String> = w
            .iter()
            .map(|w| format!("{}:{}", w.writer.as_str(), w.what))
            .collect();
        *sequences.entry(seq.join(" ")).or_default() += 1;
    }
    // The three commonest sequences: the commonest alone hid which writes the others add.
    let mut ranked: Vec<(&String, &usize)> = sequences.iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(a.1));
    let common = ranked
        .iter()
        .take(3)
        .map(|(s, k)| format!("{k} of {}: {s}", writes.len()))
        .collect::<Vec<_>>()
        .join("\n  ");
    format!(
        "by writer: {}\n  commonest sequences:\n  {common}",
        out.join(", ")
    )
}

/// The calls per endpoint between two readings of the simulated GitHub's counters.
fn by_endpoint(after: &serde_json::Value, before: &serde_json::Value) -> String {
    let total = |v: &serde_json::Value, e: &str| -> u64 {
        v.get(e)
            .and_then(serde_json::Value::as_object)
            .map_or(0, |m| {
                m.values().filter_map(serde_json::Value::as_u64).sum()
            })
    };
    after
        .as_object()
        .map(|m| {
            m.keys()
                .filter(|e| {
                    !matches!(
                        e.as_str(),
                        "download_package" | "runner_session" | "runner_poll" | "runner_complete"
                    )
                })
                .map(|e| (e, total(after, e) - total(before, e)))
                .filter(|(_, n)| *n > 0)
                .map(|(e, n)| format!("{e} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

async fn wait_recovered(p: &Product) {
    let leases =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(p.kube.clone(), &p.system);
    let name = runner_manager_crds::names::agent_lease_name(&p.agents[0].node.name);
    wait::until(
        Duration::from_secs(120),
        "the agent's recovery complete",
        || async {
            let lease = leases.get(&name).await.ok()?;
            let advert = runner_manager_crds::lease::AgentAdvert::from_annotations(
                &lease.metadata.annotations.unwrap_or_default(),
            )
            .ok()?;
            advert.recovery_complete.then_some(())
        },
    )
    .await
    .unwrap();
}

/// A product for single-job samples: one node, no idle runner, Ready, its agent's recovery gate
/// passed (cold means "package not cached", not "agent still starting"). None: skipped.
async fn sample_product(name: &str) -> Option<Product> {
    let p = World::builder(name)
        .package(Package::RunnerSized)
        .product(ProductOptions {
            env: materialize_env(),
            ..ProductOptions::default()
        })
        .await
        .unwrap()?;
    p.policy("web", json!({"minIdle": 0})).await.unwrap();
    wait::until(Duration::from_secs(90), "the policy Ready", || async {
        let sp = p.policies().get("web").await.ok()?;
        (sp.status?.runner_version.is_some()).then_some(())
    })
    .await
    .unwrap();
    wait_recovered(&p).await;
    Some(p)
}

/// GNU tar extracting the same archive beside the agent's host root, timed: the baseline a cold
/// launch is read against. On this project's CI machine the same extraction takes 2.2 s or 8.5 s
/// depending on the disk's state (right after other trees were written and deleted it is slow;
/// inflating alone takes 1.9 s and extracting into tmpfs 2.1 s), so a cold figure means little
/// without the file system's own speed beside it, measured in the same run.
fn tar_baseline(p: &Product) -> Option<Duration> {
    let archive = &p.package.path;
    let dir = p.agents[0].host.parent()?.join("tar-baseline");
    std::fs::create_dir_all(&dir).ok()?;
    let started = Instant::now();
    let status = std::process::Command::new("tar")
        .arg("xzf")
        .arg(archive)
        .arg("-C")
        .arg(&dir)
        .status()
        .ok()?;
    let took = started.elapsed();
    let _ = std::fs::remove_dir_all(&dir);
    status.success().then_some(took)
}

/// `runs` cold launches, each on a fresh product (a fresh agent: nothing cached), one after the
/// other: queued → started and the agent's launch steps of each (issue 32 item 3: ≤ 1.5 s in
/// five of five), each beside `tar xzf` of the same archive on the same file system.
async fn cold(runs: usize) {
    let mut all = Vec::new();
    let mut baselines = Vec::new();
    for run in 1..=runs {
        let Some(p) = sample_product("bench_cold").await else {
            return;
        };
        let (started, _watch) = Started::spawn(p.attempts());
        let load = load_average();
        let (job, latency, steps) = single_job(&p, &started).await;
        // `launch_steps` reads only the attempts that journalled launch timings.
        let launched = p.all_attempts().await;
        p.wait_jobs_completed(&[job], Duration::from_secs(120))
            .await
            .unwrap();
        let baseline = tar_baseline(&p);
        baselines.push(baseline);
        let line: Vec<String> = steps
            .iter()
            .map(|(label, d)| format!("{label} {}", ms(*d)))
            .collect();
        println!(
            "cold run {run} of {runs} (load {load:.1}): queued -> started {} ({}; the agent's steps: {}); baseline `tar xzf` of the same archive just after: {}",
            ms(latency),
            line.join(", "),
            launch_steps(&launched),
            baseline.map_or_else(|| "not measured".to_owned(), ms)
        );
        all.push(latency);
    }
    let within = all
        .iter()
        .filter(|d| **d <= Duration::from_millis(1500))
        .count();
    println!(
        "cold launches of the runner-sized package, queued -> started: {} (target <= 1.5 s in {runs} of {runs}: {within} of {runs}); `tar xzf` of the same archive on the same file system, each just after: {}",
        all.iter().map(|d| ms(*d)).collect::<Vec<_>>().join(", "),
        baselines
            .iter()
            .map(|b| b.map_or_else(|| "-".to_owned(), ms))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// Cold then warm scale-from-zero latencies.
async fn latency(warm_samples: usize) {
    let Some(p) = sample_product("bench_latency").await else {
        return;
    };
    let (started, _watch) = Started::spawn(p.attempts());
    let agent_pid = p.agents[0].process.as_ref().unwrap().child.id();
    let mut cold = None;
    let mut cold_steps = Vec::new();
    let mut warm = Vec::new();
    let mut warm_steps: Vec<Vec<(&'static str, Duration)>> = Vec::new();
    let mut warm_cpu = 0.0;
    // Each sample's attempt as it started (with the agent's `status.launch`), kept here because
    // history collection deletes cleaned attempts.
    let mut launched: BTreeMap<String, RunnerAttempt> = BTreeMap::new();
    for i in 0..=warm_samples {
        let cpu_before = cpu_seconds(agent_pid);
        let (job, latency, steps) = single_job(&p, &started).await;
        if i == 0 {
            cold = Some(latency);
            cold_steps = steps;
        } else {
            warm.push(latency);
            warm_steps.push(steps);
            warm_cpu += cpu_seconds(agent_pid) - cpu_before;
        }
        for a in p.all_attempts().await {
            if a.status
                .as_ref()
                .is_some_and(|s| s.journal.launch.is_some())
                && let Some(name) = a.metadata.name.clone()
            {
                launched.entry(name).or_insert(a);
            }
        }
        p.wait_jobs_completed(&[job], Duration::from_secs(120))
            .await
            .unwrap();
        // The next sample starts from zero again: wait until no runner is live.
        let none = std::collections::HashSet::new();
        until_concluded(&p, &none, 120, "no live runner").await;
    }
    warm.sort();
    println!(
        "webhook queued -> runner process started ({} package): cold {} (package downloaded); warm p50 {} p95 {} max {} over {} samples (target: warm p50 <= 250 ms, p95 <= 500 ms; cold <= 1.5 s)",
        package_label(&p).await,
        ms(cold.unwrap_or_default()),
        ms(percentile(&warm, 0.5)),
        ms(percentile(&warm, 0.95)),
        ms(warm.last().copied().unwrap_or_default()),
        warm.len()
    );
    let cold_line: Vec<String> = cold_steps
        .iter()
        .map(|(label, d)| format!("{label} {}", ms(*d)))
        .collect();
    println!("  cold timeline after queueing: {}", cold_line.join("; "));
    println!(
        "  warm timeline after queueing: {}",
        steps_line(&warm_steps)
    );
    println!(
        "  the agent's launch steps, cold and warm: {}",
        launch_steps(&launched.into_values().collect::<Vec<_>>())
    );
    println!(
        "  agent CPU per warm launch (its whole lifecycle: admit, materialize, spawn, supervise, scrub): {:.2} s",
        warm_cpu / warm_steps.len().max(1) as f64
    );
}

/// `--materialize overlay|copy|auto`: how the agent lays the package into a runtime
/// (`RM_MATERIALIZE`); without it, the agent's default.
fn materialize_env() -> Vec<(String, String)> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--materialize")
        .and_then(|i| args.get(i + 1))
        .map(|m| vec![("RM_MATERIALIZE".to_owned(), m.clone())])
        .unwrap_or_default()
}

/// The timeline steps, in order: when the attempt was first seen, then first seen in each state.
/// A native attempt has no `Prepared` (the broker takes it `Allocated → JitReceived`): the
/// materialize and the preparation lie between "admitted" and "JIT", and [`launch_steps`] prints
/// them from the agent's own `status.launch`.
const STEPS: [&str; 4] = ["created", "admitted", "JIT", "spawned"];
const STATE_STEPS: [(&str, AttemptState); 3] = [
    ("admitted", AttemptState::Allocated),
    ("JIT", AttemptState::JitReceived),
    ("spawned", AttemptState::Starting),
];

/// Each step of [`STEPS`] over single-job samples: p50 / max after queueing.
/// `{label} p50 … / {top} …` of the durations `at` (sorted here), when there are any.
fn spread(label: &str, at: &mut [Duration], top: &str) -> Option<String> {
    at.sort();
    let last = *at.last()?;
    Some(format!(
        "{label} p50 {} / {top} {}",
        ms(percentile(at, 0.5)),
        ms(last)
    ))
}

fn steps_line(samples: &[Vec<(&'static str, Duration)>]) -> String {
    let mut line = Vec::new();
    for label in STEPS {
        let mut at: Vec<Duration> = samples
            .iter()
            .filter_map(|s| s.iter().find(|(l, _)| *l == label).map(|(_, d)| *d))
            .collect();
        line.extend(spread(label, &mut at, "max"));
    }
    line.join("; ")
}

/// The agent's launch steps of `attempts` (`status.launch`: materialize, prepare, register,
/// spawn), p50 / max of each, for the attempts that started.
fn launch_steps(attempts: &[RunnerAttempt]) -> String {
    let timings: Vec<_> = attempts
        .iter()
        .filter_map(|a| a.status.as_ref()?.journal.launch.clone())
        .collect();
    let step = |label: &str, f: fn(&runner_manager_crds::attempt::LaunchTimings) -> u64| {
        let mut at: Vec<u64> = timings.iter().map(f).collect();
        at.sort_unstable();
        let p50 = at.get(at.len() / 2).copied().unwrap_or_default();
        format!(
            "{label} p50 {p50} ms / max {} ms",
            at.last().copied().unwrap_or_default()
        )
    };
    format!(
        "{} (of {} launches)",
        [
            step("materialize", |t| t.materialize_ms),
            step("prepare", |t| t.prepare_ms),
            step("register", |t| t.register_ms),
            step("spawn", |t| t.spawn_ms),
        ]
        .join("; "),
        timings.len()
    )
}

/// One attempt's timeline after `queued`: each step of [`STEPS`] the watch caught.
fn steps(
    queued: Instant,
    line: &BTreeMap<AttemptState, Instant>,
    created: Option<Instant>,
) -> Vec<(&'static str, Duration)> {
    let mut out: Vec<(&'static str, Duration)> = created
        .map(|c| ("created", c.saturating_duration_since(queued)))
        .into_iter()
        .collect();
    for (label, state) in STATE_STEPS {
        if let Some(t) = line.get(&state) {
            out.push((label, t.saturating_duration_since(queued)));
        }
    }
    out
}

/// What the world publishes (the archive's size) and how the agent lays it into runtimes: what
/// `--materialize` asked for and what the agent chose (`auto` chooses at start).
async fn package_label(p: &Product) -> String {
    let how = materialize_env()
        .first()
        .map_or_else(|| "the agent's default".to_owned(), |(_, m)| m.clone());
    format!(
        "{} MB archive, materialize: {how}, the agent uses {}",
        p.package.size / (1024 * 1024),
        agent_materializer(p).await
    )
}

/// Which materializer the agent chose at start: the mode its
/// `runner_manager_agent_materializer{mode}` gauge sets to 1.
async fn agent_materializer(p: &Product) -> &'static str {
    use runner_manager_node_agent::packages::overlay::Materializer;
    let health = first_agent_health(p).await;
    let m = get(&health, "/metrics").await.unwrap();
    Materializer::ALL
        .into_iter()
        .map(Materializer::as_str)
        .find(|mode| {
            sample(
                &m.body,
                "runner_manager_agent_materializer",
                &format!("mode=\"{mode}\""),
            ) == Some(1.0)
        })
        .unwrap_or_else(|| panic!("no runner_manager_agent_materializer of 1 in {}", m.body))
}

/// `jobs` queued at once on one node of that capacity.
/// The operator's `runner_manager_api_writes_total` by kind (every object it writes: attempts,
/// policies, ledgers, events).
async fn operator_writes(p: &Product) -> BTreeMap<String, f64> {
    let Ok(m) = get(&p.operators[0].health, "/metrics").await else {
        return BTreeMap::new();
    };
    m.body
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("runner_manager_api_writes_total{kind=\"")?;
            let (kind, value) = rest.split_once("\"} ")?;
            Some((kind.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// What one burst measured: all runners started after queueing, and attempts created for it.
struct BurstFigures {
    all_started: Duration,
    created: usize,
}

/// The timeline of a burst's attempts: for each step, when (after queueing) the median and the
/// last attempt first showed it. A state the watch never caught (passed between two events) is
/// left out of its step.
fn timeline(
    queued: Instant,
    lines: &[BTreeMap<AttemptState, Instant>],
    created: &[Instant],
) -> String {
    let mut out = Vec::new();
    let mut step = |label: &str, mut at: Vec<Duration>| out.extend(spread(label, &mut at, "last"));
    step(
        "created",
        created
            .iter()
            .map(|t| t.saturating_duration_since(queued))
            .collect(),
    );
    for (label, state) in STATE_STEPS {
        step(
            label,
            lines
                .iter()
                .filter_map(|l| l.get(&state))
                .map(|t| t.saturating_duration_since(queued))
                .collect(),
        );
    }
    out.join("; ")
}

/// The burst benches' policy (`maxRunners` as given, no idle runner, the product's webhook
/// scaling: poll interval 60 s, not the world's scenario pace of 10 s, whose polls listed the
/// jobs of every run queued longer than that, a dozen calls in a burst under load), Ready, and
/// the package cache warmed by one job: a burst measures launches, not one download.
async fn burst_policy(p: &Product, max_runners: usize) {
    let scaling =
        serde_json::to_value(runner_manager_crds::policy::ScalingSpec::default()).unwrap();
    p.policy(
        "web",
        json!({"minIdle": 0, "maxRunners": max_runners, "scaling": scaling}),
    )
    .await
    .unwrap();
    wait::until(Duration::from_secs(90), "the policy Ready", || async {
        let sp = p.policies().get("web").await.ok()?;
        (sp.status?.runner_version.is_some()).then_some(())
    })
    .await
    .unwrap();
    wait_recovered(p).await;
    let warmup = p.queue_linux_job(0).await.unwrap();
    p.wait_jobs_completed(&[warmup], Duration::from_secs(180))
        .await
        .unwrap();
}

/// A burst's start: its jobs, when they were queued, how long queueing them took, and when
/// (after queueing) the last of their runners started.
struct BurstStart {
    ids: Vec<u64>,
    queued: Instant,
    all_queued: Duration,
    all_started: Duration,
}

/// Queues `jobs` one-second jobs at once ("at once": concurrently, so the figure is the
/// product's, not this loop's round trips) and waits until a runner started for each of them.
/// Attempts named in `before` are not the burst's: the watch may list an earlier one (the
/// warm-up's) only now, and it must neither stand in for one of the burst's nor hide the last.
async fn queue_burst(
    p: &Product,
    started: &Started,
    jobs: usize,
    before: &std::collections::HashSet<String>,
) -> BurstStart {
    let queued = Instant::now();
    let ids: Vec<u64> = futures_util::future::join_all((0..jobs).map(|_| p.queue_linux_job(1000)))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let all_queued = queued.elapsed();
    wait::until(
        Duration::from_secs(600),
        "every burst runner started",
        || async { (started.started_except(before).len() >= jobs).then_some(()) },
    )
    .await
    .unwrap();
    let all_started = started
        .started_except(before)
        .into_iter()
        .max()
        .unwrap()
        .saturating_duration_since(queued);
    BurstStart {
        ids,
        queued,
        all_queued,
        all_started,
    }
}

async fn burst(jobs: usize) -> Option<BurstFigures> {
    let options = ProductOptions {
        nodes: vec![NodeOptions::new("burst", jobs as u32, &[])],
        env: materialize_env(),
        // The calls and writes counted are the product's: an observation every second (the
        // scenarios' pace) would add a runner list per second of the burst.
        cadence: Cadence::Product,
        ..ProductOptions::default()
    };
    let cadence = options.cadence;
    let p = World::builder("bench_burst")
        .package(Package::RunnerSized)
        .product(options)
        .await
        .unwrap()?;
    burst_policy(&p, jobs).await;
    let (calls_before, by_endpoint_before) = p.operator_github_calls().await.unwrap();
    let operator_writes_before = operator_writes(&p).await;
    let writes = WriteCounter::start(p.attempts()).await.unwrap();
    let (started, _watch) = Started::spawn(p.attempts());
    let operator_pid = p.operators[0].process.as_ref().unwrap().child.id();
    let agent_pid = p.agents[0].process.as_ref().unwrap().child.id();
    let peak = Arc::new(Mutex::new((0u64, 0u64)));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                {
                    let mut g = peak.lock().unwrap();
                    g.0 = g.0.max(rss_kib(operator_pid));
                    g.1 = g.1.max(rss_kib(agent_pid));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    // The attempts that exist before queueing (the warm-up's, Cleaned by now), by a LIST: the
    // watch above lists them too, but maybe only after queueing, so a count by the watch alone
    // took the warm-up's attempt for the burst's.
    let before_burst: std::collections::HashSet<String> = p
        .all_attempts()
        .await
        .into_iter()
        .filter_map(|a| a.metadata.name)
        .collect();
    let agent_cpu_before = cpu_seconds(agent_pid);
    let BurstStart {
        ids,
        queued,
        all_queued,
        all_started,
    } = queue_burst(&p, &started, jobs, &before_burst).await;
    // The agent's launch timings now, before history collection deletes cleaned attempts.
    let burst_objects: Vec<RunnerAttempt> = p
        .all_attempts()
        .await
        .into_iter()
        .filter(|a| {
            a.metadata
                .name
                .as_ref()
                .is_some_and(|n| !before_burst.contains(n))
        })
        .collect();
    let burst_created = &started.created_except(&before_burst);
    let lines = started.timelines(queued);
    let first_created = burst_created.first().map(|t| *t - queued);
    let last_created = burst_created.last().map(|t| *t - queued);
    p.wait_jobs_completed(&ids, Duration::from_secs(600))
        .await
        .unwrap();
    let all_done = queued.elapsed();
    let agent_cpu = cpu_seconds(agent_pid) - agent_cpu_before;
    sampler.abort();
    let (calls_after, by_endpoint_after) = p.operator_github_calls().await.unwrap();
    let calls = calls_after - calls_before;
    let breakdown = by_endpoint(&by_endpoint_after, &by_endpoint_before);
    // Writes per attempt, once the burst's attempts are cleaned and released: the operator's
    // finalizer release is the last write of an attempt's life, and a count taken at `Cleaned`
    // missed it for the attempts released after the last was cleaned.
    wait::until(Duration::from_secs(300), "the burst cleaned", || async {
        let live = p.all_attempts().await.into_iter().any(|a| {
            a.metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| !f.is_empty())
                || a.status.as_ref().is_none_or(|s| {
                    s.journal.state() != runner_manager_crds::state::AttemptState::Cleaned
                })
        });
        (!live).then_some(())
    })
    .await
    .unwrap();
    let counts: Vec<u64> = writes
        .counts()
        .into_iter()
        .filter(|(name, _)| !before_burst.contains(name))
        .map(|(_, n)| n)
        .collect();
    let mean = counts.iter().sum::<u64>() as f64 / counts.len().max(1) as f64;
    let (op_rss, agent_rss) = *peak.lock().unwrap();
    println!(
        "burst of {jobs} jobs on one node (capacity {jobs}), operator at the {}: all runners started {} after queueing (target for 50: <= 10 s), all jobs done {}",
        cadence.describe(),
        ms(all_started),
        ms(all_done)
    );
    println!(
        "  timeline: every job queued {}; attempts created from {} to {}; runners started by {}",
        ms(all_queued),
        ms(first_created.unwrap_or_default()),
        ms(last_created.unwrap_or_default()),
        ms(all_started)
    );
    println!(
        "  per attempt, after queueing: {}",
        timeline(queued, &lines, burst_created)
    );
    println!(
        "  the agent's launch steps: {}",
        launch_steps(&burst_objects)
    );
    println!("  package: {}", package_label(&p).await);
    // Every attempt created from the burst on, the ones that never started included: one per
    // job is the target (minIdle is 0 here).
    let burst_attempts = started.created_except(&before_burst).len();
    println!("  attempts created for the burst: {burst_attempts} for {jobs} jobs (target: = jobs)");
    println!(
        "GitHub REST calls by the operator during the burst: {calls} for {} runners = {:.2} per runner ({}, the policy's default poll interval; target <= 1.05)",
        burst_attempts,
        calls as f64 / burst_attempts.max(1) as f64,
        cadence.describe()
    );
    println!("  by endpoint: {breakdown}");
    println!(
        "API writes per attempt: mean {mean:.1}, max {} (target <= 8); {}",
        counts.iter().max().copied().unwrap_or(0),
        by_writer(
            &writes
                .writes()
                .into_iter()
                .filter(|(name, _)| !before_burst.contains(name))
                .collect()
        )
    );
    let operator_writes_after = operator_writes(&p).await;
    let by_kind: Vec<String> = operator_writes_after
        .iter()
        .map(|(kind, after)| {
            let before = operator_writes_before.get(kind).copied().unwrap_or(0.0);
            (kind, after - before)
        })
        .filter(|(_, n)| *n > 0.0)
        .map(|(kind, n)| format!("{kind} {n:.0}"))
        .collect();
    let total: f64 =
        operator_writes_after.values().sum::<f64>() - operator_writes_before.values().sum::<f64>();
    println!(
        "the operator's API writes during the burst (runner_manager_api_writes_total, every object): {total:.0} = {:.1} per job; by kind: {}",
        total / jobs.max(1) as f64,
        by_kind.join(", ")
    );
    println!(
        "agent CPU during the burst: {agent_cpu:.1} s = {:.2} s per launch",
        agent_cpu / jobs.max(1) as f64
    );
    println!(
        "peak RSS during the burst: operator {} MiB, agent {} MiB",
        op_rss / 1024,
        agent_rss / 1024
    );
    Some(BurstFigures {
        all_started,
        created: burst_attempts,
    })
}

/// The agent's requests of `verb` so far, from its `/metrics`.
async fn agent_requests(health: &str, verb: &str) -> f64 {
    let m = get(health, "/metrics").await.unwrap();
    sample(
        &m.body,
        "runner_manager_agent_api_requests_total",
        &format!("verb=\"{verb}\""),
    )
    .unwrap_or_else(|| panic!("no api_requests_total{{verb={verb}}} in {}", m.body))
}

/// The agent's reads (GET/LIST) per minute over `window`: a measurement window, not a wait.
async fn reads_per_minute(health: &str, window: Duration) -> f64 {
    let before = agent_requests(health, "read").await;
    tokio::time::sleep(window).await;
    let after = agent_requests(health, "read").await;
    (after - before) * 60.0 / window.as_secs_f64()
}

/// Attempts of the team namespace in `state`.
/// Waits (at most five minutes) until `n` attempts are in `state`; `what` names the wait.
async fn all_in_state(p: &Product, n: usize, state: AttemptState, what: &str) {
    wait::until(Duration::from_secs(300), what, || async {
        (in_state(p, state).await >= n).then_some(())
    })
    .await
    .unwrap();
}

/// The first agent's health address, once it logged it.
async fn first_agent_health(p: &Product) -> String {
    wait::until(
        Duration::from_secs(30),
        "the agent's health address",
        || async { agent_health(&p.agents[0].process.as_ref()?.lines()) },
    )
    .await
    .unwrap()
}

async fn in_state(p: &Product, state: runner_manager_crds::state::AttemptState) -> usize {
    p.all_attempts()
        .await
        .iter()
        .filter(|a| {
            a.status
                .as_ref()
                .is_some_and(|s| s.journal.state() == state)
        })
        .count()
}

/// Steady state: `n` runners idle, then busy, on one node; the agent's API reads per attempt per
/// minute over its baseline with no attempt (Lease, watch re-lists, broker token reviews).
async fn steady(n: usize, window: Duration) {
    use runner_manager_crds::state::AttemptState;
    let options = ProductOptions {
        nodes: vec![NodeOptions::new("steady", n as u32, &[])],
        ..ProductOptions::default()
    };
    let Some(p) = World::builder("bench_steady")
        .product(options)
        .await
        .unwrap()
    else {
        return;
    };
    wait_recovered(&p).await;
    let health = first_agent_health(&p).await;
    let baseline = reads_per_minute(&health, window).await;
    p.policy("web", json!({"minIdle": n, "maxRunners": n}))
        .await
        .unwrap();
    all_in_state(&p, n, AttemptState::Idle, "every runner idle").await;
    let idle = reads_per_minute(&health, window).await;
    // Jobs longer than the window keep every runner busy through it.
    let busy_for = window.as_millis() as u64 * 3;
    for _ in 0..n {
        p.queue_linux_job(busy_for).await.unwrap();
    }
    all_in_state(&p, n, AttemptState::Busy, "every runner busy").await;
    let busy = reads_per_minute(&health, window).await;
    let per = |total: f64| (total - baseline).max(0.0) / n as f64;
    println!(
        "steady state, {n} runners on one node ({}s windows): agent API reads (GET/LIST) per attempt per minute: idle {:.1}, busy {:.1} (agent totals per minute: no attempt {baseline:.0}, {n} idle {idle:.0}, {n} busy {busy:.0})",
        window.as_secs(),
        per(idle),
        per(busy)
    );
}

/// What one phase of the busy-node benchmark measured.
struct Phase {
    /// Warm single-job latencies, sorted.
    warm: Vec<Duration>,
    /// Their timelines.
    steps: Vec<Vec<(&'static str, Duration)>>,
    /// The burst: every runner started after queueing.
    burst: Duration,
    /// `/proc/loadavg`'s 1-minute figure at the end of the phase.
    load: f64,
}

impl Phase {
    fn describe(&self, jobs: usize) -> String {
        format!(
            "warm p50 {} p95 {} max {} over {} samples; {jobs}-job burst all started {}; load average (1 min) {:.1}\n    warm timeline after queueing: {}",
            ms(percentile(&self.warm, 0.5)),
            ms(percentile(&self.warm, 0.95)),
            ms(self.warm.last().copied().unwrap_or_default()),
            self.warm.len(),
            ms(self.burst),
            self.load,
            steps_line(&self.steps)
        )
    }
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or_default()
}

/// One single-job sample: a job queued, its runner started: (the job, queued → started, the
/// attempt's timeline).
async fn single_job(
    p: &Product,
    started: &Started,
) -> (u64, Duration, Vec<(&'static str, Duration)>) {
    let before = started.count();
    let queued = Instant::now();
    let job = p.queue_linux_job(0).await.unwrap();
    wait::until(Duration::from_secs(120), "the runner started", || async {
        (started.count() > before).then_some(())
    })
    .await
    .unwrap();
    let at = started.all().into_iter().max().unwrap();
    (
        job,
        at.saturating_duration_since(queued),
        started.sample_steps(queued),
    )
}

/// Waits (at most `secs`, failing with `what`) until every attempt not in `keep` concluded.
async fn until_concluded(
    p: &Product,
    keep: &std::collections::HashSet<String>,
    secs: u64,
    what: &str,
) {
    wait::until(Duration::from_secs(secs), what, || async {
        let live = p.all_attempts().await.into_iter().any(|a| {
            a.metadata.name.as_ref().is_some_and(|n| !keep.contains(n))
                && a.status
                    .as_ref()
                    .is_none_or(|s| !s.journal.state().is_terminal())
        });
        (!live).then_some(())
    })
    .await
    .unwrap();
}

/// `samples` warm single-job latencies, then a burst of `jobs`, beside the runners in `keep`
/// (left running).
async fn phase(
    p: &Product,
    started: &Started,
    samples: usize,
    jobs: usize,
    keep: &std::collections::HashSet<String>,
) -> Phase {
    let (mut warm, mut steps) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        let (job, latency, timeline) = single_job(p, started).await;
        warm.push(latency);
        steps.push(timeline);
        p.wait_jobs_completed(&[job], Duration::from_secs(120))
            .await
            .unwrap();
        until_concluded(p, keep, 120, "no live runner").await;
    }
    warm.sort();
    // What existed before: what the watch saw (history collection deletes concluded attempts,
    // so a LIST alone took the idle phase's for the burst's) and what a LIST shows now.
    let mut before = started.seen();
    before.extend(
        p.all_attempts()
            .await
            .into_iter()
            .filter_map(|a| a.metadata.name),
    );
    let BurstStart {
        ids,
        all_started: burst,
        ..
    } = queue_burst(p, started, jobs, &before).await;
    let load = load_average();
    p.wait_jobs_completed(&ids, Duration::from_secs(600))
        .await
        .unwrap();
    until_concluded(p, keep, 300, "the burst concluded").await;
    Phase {
        warm,
        steps,
        burst,
        load,
    }
}

/// The busy phase's load, the by default; `--busy-write-mib N` and `--no-hog` take a part
/// away, to see which part a slowdown comes from.
#[derive(Clone, Copy)]
struct BusyOptions {
    write_mib_per_sec: u64,
    hog: bool,
}

impl BusyOptions {
    fn from_args(args: &[String]) -> Self {
        Self {
            write_mib_per_sec: args
                .iter()
                .position(|a| a == "--busy-write-mib")
                .and_then(|i| args.get(i + 1)?.parse().ok())
                .unwrap_or(8),
            hog: !args.iter().any(|a| a == "--no-hog"),
        }
    }
}

/// The busy-node benchmark (issue 32): the warm single-job latency and the burst on the idle
/// machine, then again with its cores saturated by jobs: one busy runner per core (a spinning
/// thread and 8 MiB/s synced to disk, inside the product's runner cgroups) plus one CPU hog
/// outside them, as an unrelated process of the node. Both phases in one run, one product.
async fn busy_node(samples: usize, jobs: usize, load: BusyOptions) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let options = ProductOptions {
        nodes: vec![NodeOptions::new("busy", (jobs + cores) as u32, &[])],
        env: materialize_env(),
        cadence: Cadence::Product,
        ..ProductOptions::default()
    };
    let Some(p) = World::builder("bench_busy")
        .package(Package::RunnerSized)
        .product(options)
        .await
        .unwrap()
    else {
        return;
    };
    burst_policy(&p, jobs + cores).await;
    let (started, _watch) = Started::spawn(p.attempts());
    let none = std::collections::HashSet::new();
    until_concluded(&p, &none, 120, "the warm-up concluded").await;
    let idle = phase(&p, &started, samples, jobs, &none).await;

    // The load: one busy runner per core, until the stop file exists (the runners' accounts
    // read it: a world-readable directory).
    let stop_dir = tempfile::Builder::new()
        .prefix("rm-bench-busy")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(
        stop_dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let stop = stop_dir.path().join("stop");
    let busy_jobs: Vec<u64> = futures_util::future::join_all((0..cores).map(|_| {
        p.queue_job(
            &["self-hosted", "linux"],
            json!({"duration_ms": 1_800_000, "busy": {
                "threads": 1,
                "write_mib_per_sec": load.write_mib_per_sec,
                "until_file": stop.display().to_string(),
            }}),
        )
    }))
    .await
    .into_iter()
    .map(Result::unwrap)
    .collect();
    wait::until(
        Duration::from_secs(180),
        "every busy runner busy",
        || async { (in_state(&p, AttemptState::Busy).await >= cores).then_some(()) },
    )
    .await
    .unwrap();
    let busy_runners: std::collections::HashSet<String> = p
        .all_attempts()
        .await
        .into_iter()
        .filter(|a| {
            a.status
                .as_ref()
                .is_some_and(|s| s.journal.state() == AttemptState::Busy)
        })
        .filter_map(|a| a.metadata.name)
        .collect();
    // In a session of its own, as an unrelated daemon of the node is (with the scheduler's
    // autogroups a session is weighed as a whole): not one more thread among the product's.
    let mut hog = (load.hog).then(|| {
        std::process::Command::new("setsid")
            .args(["sh", "-c", "while :; do :; done"])
            .spawn()
            .unwrap()
    });
    let busy = phase(&p, &started, samples, jobs, &busy_runners).await;
    if let Some(hog) = hog.as_mut() {
        let _ = hog.kill();
        let _ = hog.wait();
    }
    std::fs::write(&stop, b"").unwrap();
    p.wait_jobs_completed(&busy_jobs, Duration::from_secs(120))
        .await
        .unwrap();
    println!(
        "busy node ({cores} cores; {cores} busy runners each spinning a thread and syncing {} MiB/s, {} outside the runner cgroups):",
        load.write_mib_per_sec,
        if load.hog {
            "plus one CPU hog"
        } else {
            "no CPU hog"
        }
    );
    println!("  idle: {}", idle.describe(jobs));
    println!("  busy: {}", busy.describe(jobs));
    println!(
        "  targets on the busy node: warm p50 <= 250 ms, p95 <= 500 ms; burst <= 10 s; package: {}",
        package_label(&p).await
    );
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    if std::env::var_os("KUBECONFIG").is_none() {
        println!("SKIP scale_up: KUBECONFIG is not set (make test starts a control plane)");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (warm, jobs) = if quick { (3, 10) } else { (20, 50) };
        println!(
            "scale_up ({}): {} cores; binaries of the dev profile",
            if quick { "quick" } else { "full" },
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        // `--only burst`, `--only latency` or `--only steady` runs one part; `--only busy` the
        // busy-node benchmark, which runs only when asked.
        let args: Vec<String> = std::env::args().collect();
        let only = args
            .iter()
            .position(|a| a == "--only")
            .and_then(|i| args.get(i + 1))
            .cloned();
        if only.is_none() || only.as_deref() == Some("latency") {
            latency(warm).await;
        }
        // `--runs N` repeats the burst N times, each in a fresh world, and prints the best and
        // the median.
        let runs: usize = args
            .iter()
            .position(|a| a == "--runs")
            .and_then(|i| args.get(i + 1)?.parse().ok())
            .unwrap_or(1);
        if only.is_none() || only.as_deref() == Some("burst") {
            let mut all = Vec::new();
            for run in 0..runs {
                if runs > 1 {
                    println!("burst run {} of {runs}", run + 1);
                }
                all.extend(burst(jobs).await);
            }
            if all.len() > 1 {
                let mut times: Vec<Duration> = all.iter().map(|f| f.all_started).collect();
                times.sort();
                println!(
                    "burst of {jobs} over {} runs: all started best {}, median {}, worst {}; attempts created per run {:?} (target: {jobs})",
                    all.len(),
                    ms(times[0]),
                    ms(percentile(&times, 0.5)),
                    ms(*times.last().unwrap()),
                    all.iter().map(|f| f.created).collect::<Vec<_>>()
                );
            }
        }
        // `--only cold --runs N`: N cold launches, each on a fresh product (not in the default
        // run: the latency part has its one cold sample).
        if only.as_deref() == Some("cold") {
            cold(runs).await;
        }
        // Not part of the default run: it saturates the machine for minutes.
        if only.as_deref() == Some("busy") {
            busy_node(warm, jobs, BusyOptions::from_args(&args)).await;
        }
        if only.is_none() || only.as_deref() == Some("steady") {
            let (n, window) = if quick { (4, 20) } else { (10, 60) };
            steady(n, Duration::from_secs(window)).await;
        }
    });
}
