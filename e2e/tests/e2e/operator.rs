//! The operator process's controllers on the real control plane, with the simulated GitHub and a
//! scripted agent per simulated node (`harness::scripted_agent`): scale from zero on a signed
//! webhook and by polling, an invalid policy, a bad signature, minIdle, scale-down that
//! deregisters first and leaves a runner that took a job, registration timeout → replacement with
//! lineage, orphan registrations cleaned in two phases while a foreign one survives, and leader
//! failover between two operator processes. Skipped without `KUBECONFIG`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use runner_manager_crds::arch::{ARCH_LABEL, Arch};
use runner_manager_crds::attempt::{RunnerAttempt, TerminationReason};
use runner_manager_crds::conditions::ConditionStatus;
use runner_manager_crds::names::runner_name;
use runner_manager_crds::outcome::{FailureReason, Outcome};
use runner_manager_crds::policy::{PolicyConditionType, PolicyReason, ScalePolicy};
use runner_manager_crds::state::AttemptState;
use runner_manager_e2e::fake_github::PackageInfo;
use runner_manager_e2e::harness;
use runner_manager_e2e::harness::attempt::{registration, state};
use runner_manager_e2e::harness::cluster::list_all;
use runner_manager_e2e::harness::github::{ORG, app_secret_data, pat_credentials};
use runner_manager_e2e::harness::node::SimNode;
use runner_manager_e2e::harness::process::{OperatorAddrs, Running, operator_addrs};
use runner_manager_e2e::harness::scripted_agent::{BrokerAccess, Script, ScriptedAgent};
use runner_manager_e2e::harness::wait;
use runner_manager_e2e::harness::webhook::post_workflow_job;
use runner_manager_e2e::harness::world::Package;
use runner_manager_operator::webhook::sign;
use secrecy::SecretString;
use serde_json::{Value, json};

const WEBHOOK_SECRET: &str = "operator-test-webhook-secret";
const VERSION: &str = "2.330.0";
const LONG: Duration = Duration::from_secs(60);

fn sha() -> String {
    "5e".repeat(32)
}

/// A started operator and the addresses it logged.
struct Operator {
    process: Running,
    broker: String,
    health: String,
    webhook: String,
}

impl Operator {
    async fn metrics(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.health))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    async fn metric(&self, line_prefix: &str) -> f64 {
        self.metrics()
            .await
            .lines()
            .find(|l| l.starts_with(line_prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }
}

/// The node label this test's pool is routed by: one a kubelet cannot set on itself (policies
/// may route only by such labels).
const POOL_LABEL: &str = "node-restriction.kubernetes.io/runner-pool";

struct World {
    world: harness::world::World,
    pool: String,
    nodes: Vec<SimNode>,
    agents: Vec<ScriptedAgent>,
    operators: Vec<Operator>,
    ownership: String,
}

impl std::ops::Deref for World {
    type Target = harness::world::World;
    fn deref(&self) -> &harness::world::World {
        &self.world
    }
}

async fn world(test: &str) -> Option<World> {
    let pool = format!("ci-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let world = harness::world::World::builder(test)
        .namespaces("rm-op-sys", "rm-op-team")
        .package(Package::Published(PackageInfo {
            version: VERSION.into(),
            file_name: format!("actions-runner-linux-x64-{VERSION}.tar.gz"),
            sha256: sha(),
            size: 1,
            path: "/nonexistent/runner.tar.gz".into(),
        }))
        .pat_secret("github")
        .webhook_secret(WEBHOOK_SECRET)
        // A policy for `acme/web` on this test's pool.
        .policy_defaults(json!({
            "github": {"url": format!("https://github.com/{ORG}/web"), "credentialsSecretRef": {"name": "github"}},
            "labels": ["self-hosted", "linux"],
            "maxRunners": 4,
            "nodeSelector": {POOL_LABEL: pool},
        }))
        .build()
        .await
        .unwrap()?;
    let ownership = world.ownership_label().await.unwrap();
    Some(World {
        world,
        pool,
        nodes: vec![],
        agents: vec![],
        operators: vec![],
        ownership,
    })
}

impl World {
    /// Start an operator process with the world's flags, the scenario pace and `extra` (a flag
    /// in `extra` replaces the one before).
    async fn start_operator(&mut self, extra: &[&str]) -> usize {
        let mut flags = vec![
            ("--observe-interval", "1s"),
            ("--resync-interval", "1s"),
            ("--lease-duration", "15s"),
            ("--replacement-backoff", "1s"),
        ];
        flags.extend(extra.chunks(2).map(|pair| (pair[0], pair[1])));
        let cmd = self.world.operator_command(&flags).unwrap();
        let process = Running::spawn("runner-manager-operator", cmd).unwrap();
        let OperatorAddrs {
            broker,
            health,
            webhook,
            ..
        } = operator_addrs(&process, LONG).await.unwrap();
        self.operators.push(Operator {
            process,
            broker,
            health,
            webhook,
        });
        self.operators.len() - 1
    }

    /// A simulated node in this test's pool with a scripted agent talking to operator `via`.
    async fn add_node(&mut self, script: Script, via: usize) -> String {
        let pool = self.pool.clone();
        self.add_node_labelled(script, via, &[(POOL_LABEL, pool.as_str())])
            .await
    }

    /// A simulated node with `labels` (and no others) with a scripted agent talking to
    /// operator `via`.
    async fn add_node_labelled(
        &mut self,
        script: Script,
        via: usize,
        labels: &[(&str, &str)],
    ) -> String {
        let labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let node = self.world.add_node("rm-op", labels).await.unwrap().node;
        let name = node.name.clone();
        let ca = self.broker_ca(LONG).await.unwrap();
        let agent = ScriptedAgent::start(
            self.kube.clone(),
            &self.system,
            &self.team,
            &name,
            script,
            BrokerAccess {
                url: format!("https://{}", self.operators[via].broker),
                ca_pem: ca,
                token_file: node.token_file.clone(),
            },
        )
        .unwrap();
        self.nodes.push(node);
        self.agents.push(agent);
        name
    }

    /// An operator ([`Self::start_operator`] with no extra flag) and one node with the default
    /// script talking to it: the operator's index.
    async fn operator_and_node(&mut self) -> usize {
        self.operator_with_node().await.0
    }

    /// [`Self::operator_and_node`], and the node's name.
    async fn operator_with_node(&mut self) -> (usize, String) {
        let op = self.start_operator(&[]).await;
        let node = self.add_node(Script::default(), op).await;
        (op, node)
    }

    /// [`Self::operator_and_node`], then the policy `name` ([`Self::policy`]): the operator's
    /// index.
    async fn serving_policy(&mut self, name: &str, spec: Value) -> usize {
        let op = self.operator_and_node().await;
        self.policy(name, spec).await;
        op
    }

    /// Waits until every attempt is `Cleaned` and its finalizer released; `what` names the wait.
    async fn until_all_cleaned_and_released(&self, what: &str) {
        self.attempts_until(what, LONG, |l| {
            l.iter()
                .all(|a| {
                    state(a) == AttemptState::Cleaned
                        && a.metadata.finalizers.as_ref().is_none_or(Vec::is_empty)
                })
                .then_some(())
        })
        .await;
    }

    /// Waits until every attempt is in `s`; `what` names the wait.
    async fn until_all_in(&self, s: AttemptState, what: &str) {
        self.attempts_until(what, LONG, |l| {
            l.iter().all(|a| state(a) == s).then_some(())
        })
        .await;
    }

    /// Waits until some attempt is in `s`; `what` names the wait.
    async fn until_any_in(&self, s: AttemptState, what: &str) {
        self.attempts_until(what, LONG, |l| {
            l.iter().any(|a| state(a) == s).then_some(())
        })
        .await;
    }

    /// Waits until the replacement of `replaced` is `Idle` (`what` names the wait), and asserts
    /// it is on `node`.
    async fn replaced_idle_on(&self, replaced: &RunnerAttempt, node: &str, what: &str) {
        let replacement = self
            .attempts_until(what, LONG, |l| {
                l.iter()
                    .find(|a| {
                        a.spec.replaces == replaced.metadata.name && state(a) == AttemptState::Idle
                    })
                    .cloned()
            })
            .await;
        assert_eq!(replacement.spec.node_name, node);
    }

    /// Waits until an attempt on `node` is `Idle` (`what` names the wait): that attempt.
    async fn idle_on(&self, node: &str, what: &str) -> RunnerAttempt {
        self.attempts_until(what, LONG, |l| {
            l.iter()
                .find(|a| state(a) == AttemptState::Idle && a.spec.node_name == node)
                .cloned()
        })
        .await
    }

    /// Waits until the policy `name` is `Ready`.
    async fn wait_ready(&self, name: &str) {
        wait::until(LONG, "the policy to be Ready", || async {
            matches!(
                self.condition(name, PolicyConditionType::Ready).await,
                Some((ConditionStatus::True, ..))
            )
            .then_some(())
        })
        .await
        .unwrap();
    }

    /// A policy for `acme/web` on this test's pool; `spec` is merged over the defaults.
    async fn policy(&self, name: &str, spec: Value) -> ScalePolicy {
        self.world.policy(name, spec).await.unwrap()
    }

    async fn patch_policy(&self, name: &str, spec: Value) {
        self.policies()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": spec})),
            )
            .await
            .unwrap();
    }

    async fn list(&self) -> Vec<RunnerAttempt> {
        list_all(&self.attempts()).await
    }

    /// Wait until `check` holds over the team's attempts.
    async fn attempts_until<T>(
        &self,
        what: &str,
        within: Duration,
        check: impl Fn(&[RunnerAttempt]) -> Option<T>,
    ) -> T {
        let check = &check;
        match wait::until(within, what, || async move { check(&self.list().await) }).await {
            Ok(v) => v,
            Err(e) => panic!("{e}\n{}", self.diagnose().await),
        }
    }

    /// What a failed wait should show: policies' status, attempts, deliveries, metrics, logs.
    async fn diagnose(&self) -> String {
        let policies = self.policies().list(&ListParams::default()).await.unwrap();
        let mut out = String::new();
        for p in policies.items {
            out += &format!(
                "policy {}: {}\n",
                p.metadata.name.unwrap_or_default(),
                serde_json::to_string(&p.status).unwrap()
            );
        }
        for a in self.list().await {
            out += &format!(
                "attempt {}: spec.termination={:?} status={}\n",
                a.metadata.name.unwrap_or_default(),
                a.spec.termination,
                serde_json::to_string(&a.status).unwrap()
            );
        }
        out += &format!("deliveries: {}\n", self.fake.deliveries().await.unwrap());
        for o in &self.operators {
            if let Ok(m) = reqwest::get(format!("http://{}/metrics", o.health)).await {
                let text = m.text().await.unwrap_or_default();
                out += &text
                    .lines()
                    .filter(|l| !l.starts_with('#') && l.contains("runner_manager_"))
                    .filter(|l| !l.contains("bucket"))
                    .collect::<Vec<_>>()
                    .join("\n");
            }
            let l = o.process.lines();
            out += "\n";
            out += &l[l.len().saturating_sub(30)..].join("\n");
        }
        out
    }

    /// Waits until the policy's condition `t` has `status`; `what` names the wait. The
    /// condition then: its status, reason and message.
    async fn until_condition(
        &self,
        policy: &str,
        t: PolicyConditionType,
        status: ConditionStatus,
        what: &str,
    ) -> (ConditionStatus, PolicyReason, String) {
        wait::until(LONG, what, || async {
            self.condition(policy, t).await.filter(|c| c.0 == status)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Waits until the policy is not `Ready` ([`Self::until_condition`]).
    async fn until_not_ready(&self, policy: &str) -> (ConditionStatus, PolicyReason, String) {
        let what = format!("{policy} not Ready");
        self.until_condition(
            policy,
            PolicyConditionType::Ready,
            ConditionStatus::False,
            &what,
        )
        .await
    }

    async fn condition(
        &self,
        policy: &str,
        t: PolicyConditionType,
    ) -> Option<(ConditionStatus, PolicyReason, String)> {
        let p = self.policies().get(policy).await.ok()?;
        let c = p.status?.conditions.into_iter().find(|c| c.type_ == t)?;
        Some((c.status, c.reason, c.message))
    }

    async fn hook_to(&self, operator: usize) {
        self.fake
            .admin(
                "POST",
                "webhooks",
                json!({"url": format!("http://{}/webhook", self.operators[operator].webhook), "secret": WEBHOOK_SECRET}),
            )
            .await
            .unwrap();
    }

    async fn queue_job(&self) -> u64 {
        self.fake
            .admin(
                "POST",
                "jobs",
                json!({"owner": ORG, "repo": "web", "labels": ["self-hosted", "linux"]}),
            )
            .await
            .unwrap()["job_id"]
            .as_u64()
            .unwrap()
    }

    /// Wait until exactly one of replicas `a` and `b` leads: (leader, standby).
    async fn one_leader(&self, a: usize, b: usize) -> (usize, usize) {
        wait::until(LONG, "one leader", || async {
            let la = self.operators[a].metric("runner_manager_leader").await;
            let lb = self.operators[b].metric("runner_manager_leader").await;
            match (la as i64, lb as i64) {
                (1, 0) => Some((a, b)),
                (0, 1) => Some((b, a)),
                _ => None,
            }
        })
        .await
        .unwrap()
    }

    async fn registrations(&self) -> Vec<Value> {
        self.fake.runners().await.unwrap()
    }
}

fn live(list: &[RunnerAttempt]) -> Vec<&RunnerAttempt> {
    list.iter()
        .filter(|a| state(a) != AttemptState::Cleaned)
        .collect()
}

#[tokio::test]
async fn scale_from_zero_on_a_signed_webhook() {
    let Some(mut w) = world("scale_from_zero_on_a_signed_webhook").await else {
        return;
    };
    let (op, node) = w.operator_with_node().await;
    // Webhooks only: the fake keeps the job queued (no runner session takes it), so polling
    // would put it back after the synthetic `in_progress` below.
    w.policy("web", json!({"scaling": {"pollInterval": "1h"}}))
        .await;
    w.wait_ready("web").await;
    assert!(w.list().await.is_empty(), "minIdle 0: nothing before a job");
    w.hook_to(op).await;
    let calls_before = w.fake.counters().await.unwrap();
    let job = w.queue_job().await;

    // The job lands in the ledger and one attempt is created on the node, pinned.
    let a = w
        .attempts_until("one attempt for the queued job", LONG, |l| {
            (l.len() == 1).then(|| l[0].clone())
        })
        .await;
    let p = w.policies().get("web").await.unwrap();
    assert!(
        p.status
            .as_ref()
            .unwrap()
            .pending_jobs
            .contains_key(&job.to_string()),
        "{:?}",
        p.status
    );
    assert_eq!(a.spec.node_name, node);
    assert_eq!(a.spec.policy, "web");
    assert_eq!(a.spec.snapshot.runner.version, VERSION);
    assert_eq!(a.spec.snapshot.runner.sha256, sha());
    assert!(a.spec.snapshot.runner.url.ends_with(".tar.gz"));
    assert_eq!(a.spec.snapshot.policy_uid, p.metadata.uid.clone().unwrap());
    let name = a.metadata.name.clone().unwrap();
    assert!(
        name.starts_with("web-") && name.len() == "web-".len() + 12,
        "{name}"
    );
    assert_eq!(
        a.metadata.finalizers.as_deref(),
        Some(&["runner-manager.dev/cleanup".to_owned()][..])
    );
    // Its policy controls it (Argo CD's tree shows it there), by uid.
    let owner = &a.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("ScalePolicy", "web")
    );
    assert_eq!(Some(&owner.uid), p.metadata.uid.as_ref());
    assert_eq!(owner.controller, Some(true));
    let labels = a.metadata.labels.clone().unwrap();
    assert_eq!(labels["runner-manager.dev/policy"], "web");
    assert_eq!(labels["runner-manager.dev/node"], node);

    // The scripted agent walks it through the real broker to Idle; the supervisor records
    // GitHub's fact about the registration.
    let idle = w
        .attempts_until("the attempt idle with a GitHub fact", LONG, |l| {
            l.iter()
                .find(|a| {
                    state(a) == AttemptState::Idle
                        && a.status.as_ref().unwrap().facts.github.is_some()
                })
                .cloned()
        })
        .await;
    let runner = registration(&idle);
    assert_eq!(runner.name, runner_name(idle.spec.attempt_uuid().unwrap()));
    let listed = w
        .fake
        .client(&format!("https://github.com/{ORG}/web"), pat_credentials())
        .list_runners()
        .await
        .unwrap();
    let reg = listed.iter().find(|r| r.name == runner.name).unwrap();
    assert!(reg.has_label(&w.ownership), "{reg:?}");

    // GitHub calls per launched runner: everything the fake answered since the job was queued
    // (JIT mint, lookups, runner-list passes, polling) over the one runner launched.
    let calls_after = w.fake.counters().await.unwrap();
    let total = |c: &Value| -> u64 {
        c.as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| !k.starts_with("_") && !k.contains("download"))
            .flat_map(|(_, m)| m.as_object().unwrap().values().filter_map(Value::as_u64))
            .sum()
    };
    eprintln!(
        "MEASURE github calls from queued job to idle runner: {} ({calls_after})",
        total(&calls_after) - total(&calls_before)
    );

    // The webhook `in_progress` for our runner name lands as the attempt's job fact, and the
    // agent takes it to Busy; `completed` empties the ledger.
    post_in_progress(&w, op, job, &runner.name).await;
    w.attempts_until("the attempt busy with its job", LONG, |l| {
        l.iter()
            .find(|a| {
                state(a) == AttemptState::Busy
                    && a.status.as_ref().unwrap().facts.job.as_ref().map(|j| j.id)
                        == Some(job as i64)
            })
            .cloned()
    })
    .await;
    wait::until(LONG, "the job to leave the ledger", || async {
        let p = w.policies().get("web").await.ok()?;
        p.status
            .unwrap_or_default()
            .pending_jobs
            .is_empty()
            .then_some(())
    })
    .await
    .unwrap();

    // The job ends: the agent concludes and cleans, the operator deregisters the concluded
    // runner GitHub still lists and releases the finalizer.
    w.agents[0].set(|s| s.finish_busy = true);
    w.until_all_cleaned_and_released("the attempt cleaned and released")
        .await;
    wait::until(LONG, "the concluded runner deregistered", || async {
        (!w.registrations()
            .await
            .iter()
            .any(|r| r["name"] == runner.name.as_str()))
        .then_some(())
    })
    .await
    .unwrap();
    assert_eq!(
        w.list().await.len(),
        1,
        "no second attempt: demand was one job"
    );
    let metrics = w.operators[op].metrics().await;
    let writes: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("runner_manager_api_writes_total"))
        .collect();
    let per_attempt: f64 = writes
        .iter()
        .filter(|l| l.contains("kind=\"attempt_"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    eprintln!("MEASURE operator writes: {}", writes.join(" | "));
    eprintln!(
        "MEASURE attempt object writes over one lifecycle: operator {per_attempt} + broker 1 + agent {} = {}",
        w.agents[0].writes(),
        per_attempt + 1.0 + w.agents[0].writes() as f64
    );
}

/// A runner that took its job and concluded before GitHub's `in_progress` delivery arrived still
/// gets its job fact: `presumed_taken` takes a `CompletedJob` runner without a known job to
/// explain one pending entry, so once the delivery has removed its own job's entry it would
/// explain another's (unit test
/// `a_concluded_runner_whose_job_is_known_explains_no_other_entry`; the 50-job burst's last
/// runners came 27–137 s late while the fact was skipped on concluded attempts). The fact is
/// written through the compare-and-swap on a `Cleaned` attempt, the entry leaves, and the next
/// job gets its runner.
#[tokio::test]
async fn a_runner_concluded_before_its_in_progress_delivery_still_records_its_job() {
    let Some(mut w) = world("a_runner_concluded_before_its_in_progress").await else {
        return;
    };
    let op = w
        .serving_policy("web", json!({"scaling": {"pollInterval": "1h"}}))
        .await;
    w.wait_ready("web").await;
    w.hook_to(op).await;
    let job = w.queue_job().await;
    let idle = w
        .attempts_until("the runner idle", LONG, |l| {
            l.iter().find(|a| state(a) == AttemptState::Idle).cloned()
        })
        .await;
    let runner = registration(&idle);
    // The runner takes the job and exits; the agent concludes and cleans before any delivery.
    w.agents[0].set(|s| s.finish_idle = true);
    w.until_all_in(AttemptState::Cleaned, "the runner concluded and cleaned")
        .await;
    w.agents[0].set(|s| s.finish_idle = false);
    post_in_progress(&w, op, job, &runner.name).await;
    let done = w
        .attempts_until("the concluded runner's job recorded", LONG, |l| {
            l.iter()
                .find(|a| {
                    a.status
                        .as_ref()
                        .and_then(|s| s.facts.job.as_ref())
                        .map(|j| j.id)
                        == Some(job as i64)
                })
                .cloned()
        })
        .await;
    assert_eq!(state(&done), AttemptState::Cleaned);
    wait::until(LONG, "the job to leave the ledger", || async {
        let p = w.policies().get("web").await.ok()?;
        (!p.status?.pending_jobs.contains_key(&job.to_string())).then_some(())
    })
    .await
    .unwrap();
    // A second job gets its own runner at once: the concluded runner explains no entry.
    w.queue_job().await;
    w.attempts_until("a runner for the second job", LONG, |l| {
        (l.len() == 2).then_some(())
    })
    .await;
}

/// The burst's creation tail (issue 15, session 8) in two jobs: both queued before the first
/// runner took one, so a `CompletedJob` runner without a known job explains one of their entries
/// (`presumed_taken`). That runner concludes before its `in_progress` arrives; the delivery
/// removes its own job's entry. Without the job fact on the concluded attempt the runner then
/// explains the *other* job's entry, and that job, which has no runner, waits two poll intervals
/// (here 2 h) for one. The node refuses new attempts while this is set up, so the second job has
/// no runner when the delivery arrives; once it accepts again, the second job must get one.
#[tokio::test]
async fn a_concluded_runner_explains_no_other_jobs_entry_after_its_delivery() {
    let Some(mut w) = world("a_concluded_runner_explains_no_other").await else {
        return;
    };
    let spec = json!({"maxRunners": 1, "scaling": {"pollInterval": "1h"}});
    let op = w.serving_policy("web", spec).await;
    w.wait_ready("web").await;
    w.hook_to(op).await;
    let first = w.queue_job().await;
    let second = w.queue_job().await;
    wait::until(LONG, "both jobs in the ledger", || async {
        let p = w.policies().get("web").await.ok()?;
        (p.status?.pending_jobs.len() == 2).then_some(())
    })
    .await
    .unwrap();
    let idle = w
        .attempts_until("one runner idle", LONG, |l| {
            l.iter().find(|a| state(a) == AttemptState::Idle).cloned()
        })
        .await;
    let runner = registration(&idle);
    // The node refuses new attempts; the runner takes a job and exits before any delivery.
    w.agents[0].set(|s| {
        s.reject = true;
        s.finish_idle = true;
    });
    let name = idle.metadata.name.clone();
    w.attempts_until("the runner concluded and cleaned", LONG, |l| {
        l.iter()
            .any(|a| a.metadata.name == name && state(a) == AttemptState::Cleaned)
            .then_some(())
    })
    .await;
    w.agents[0].set(|s| s.finish_idle = false);
    post_in_progress(&w, op, first, &runner.name).await;
    wait::until(LONG, "the first job to leave the ledger", || async {
        let p = w.policies().get("web").await.ok()?;
        let ledger = p.status?.pending_jobs;
        (!ledger.contains_key(&first.to_string()) && ledger.contains_key(&second.to_string()))
            .then_some(())
    })
    .await
    .unwrap();
    // No attempt created before the delivery may still be waiting for the node's answer.
    w.attempts_until("every attempt so far concluded", LONG, |l| {
        l.iter().all(|a| state(a).is_terminal()).then_some(())
    })
    .await;
    w.agents[0].set(|s| s.reject = false);
    w.attempts_until("a runner for the second job", LONG, |l| {
        l.iter()
            .any(|a| a.metadata.name != name && state(a) == AttemptState::Idle)
            .then_some(())
    })
    .await;
}

/// The policy `name` is not `Degraded`.
async fn assert_not_degraded(w: &World, name: &str) {
    let degraded = w.condition(name, PolicyConditionType::Degraded).await;
    assert!(
        degraded
            .as_ref()
            .is_none_or(|c| c.0 != ConditionStatus::True),
        "{degraded:?}"
    );
}

/// The default agent script, edited by `edit`.
fn script(edit: impl FnOnce(&mut Script)) -> Script {
    let mut s = Script::default();
    edit(&mut s);
    s
}

/// The `in_progress` delivery of `job` taken by `runner`, posted signed to operator `op`, which
/// accepts it.
async fn post_in_progress(w: &World, op: usize, job: u64, runner: &str) {
    let delivery = json!({
        "action": "in_progress",
        "workflow_job": {"id": job, "run_id": 1, "labels": ["self-hosted", "linux"], "runner_name": runner,
                          "status": "in_progress"},
        "repository": {"full_name": format!("{ORG}/web"), "html_url": format!("https://github.com/{ORG}/web")},
    });
    let code = post_webhook(&w.operators[op].webhook, &delivery, WEBHOOK_SECRET).await;
    assert_eq!(code, 202, "in_progress accepted");
}

async fn post_webhook(addr: &str, body: &Value, secret: &str) -> u16 {
    let bytes = serde_json::to_vec(body).unwrap();
    let signature = sign(&SecretString::from(secret), &bytes);
    let guid = uuid::Uuid::new_v4().to_string();
    post_workflow_job(&format!("http://{addr}/webhook"), &guid, &signature, bytes).await
}

#[tokio::test]
async fn an_invalid_policy_is_not_ready_names_the_field_and_creates_nothing() {
    let Some(mut w) = world("an_invalid_policy_is_not_ready").await else {
        return;
    };
    let spec = json!({"minIdle": 2, "github": {"credentialsSecretRef": {"name": "missing"}}});
    let op = w.serving_policy("nosecret", spec).await;
    w.policy(
        "orgpersistent",
        json!({"minIdle": 1, "github": {"url": format!("https://github.com/{ORG}")}, "workspace": {"mode": "Persistent"}}),
    )
    .await;
    let (status, reason, message) = w.until_not_ready("nosecret").await;
    assert_eq!(
        (status, reason),
        (ConditionStatus::False, PolicyReason::SecretNotFound)
    );
    assert!(
        message.contains("spec.github.credentialsSecretRef"),
        "{message}"
    );
    let (_, reason, message) = w.until_not_ready("orgpersistent").await;
    assert_eq!(reason, PolicyReason::InvalidSpec);
    assert!(message.contains("spec.workspace.mode"), "{message}");
    // A few passes later, still nothing created.
    let passes_before = w.operators[op]
        .metric("runner_manager_api_writes_total{kind=\"policy_status\"}")
        .await;
    wait::until(LONG, "more reconcile passes", || async {
        // The condition is rewritten only on change; the Scaling condition says why nothing runs.
        let s = w
            .condition("nosecret", PolicyConditionType::Scaling)
            .await?;
        (s.0 == ConditionStatus::False).then_some(())
    })
    .await
    .unwrap();
    let _ = passes_before;
    assert!(
        w.list().await.is_empty(),
        "an invalid policy creates nothing"
    );
    // Each failed resolution is counted by its stage (a missing Secret and an invalid spec are
    // `resolve`), and none backs the policy off: the resolution retries at its own interval.
    assert!(
        w.operators[op]
            .metric("runner_manager_reconcile_errors_total{stage=\"resolve\"}")
            .await
            >= 2.0,
        "{}",
        w.operators[op].metrics().await
    );

    // Fixing the Secret makes it Ready and minIdle is honoured.
    w.patch_policy(
        "nosecret",
        json!({"github": {"credentialsSecretRef": {"name": "github"}}}),
    )
    .await;
    w.attempts_until("minIdle 2 once valid", LONG, |l| {
        (l.iter().filter(|a| a.spec.policy == "nosecret").count() == 2).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_bad_signature_is_refused_and_changes_nothing() {
    let Some(mut w) = world("a_bad_signature_is_refused").await else {
        return;
    };
    let op = w.serving_policy("web", json!({})).await;
    let delivery = json!({
        "action": "queued",
        "workflow_job": {"id": 991, "run_id": 1, "labels": ["self-hosted", "linux"], "status": "queued"},
        "repository": {"full_name": format!("{ORG}/web"), "html_url": format!("https://github.com/{ORG}/web")},
    });
    let addr = w.operators[op].webhook.clone();
    let code = wait::until(LONG, "the webhook receiver to serve", || {
        let addr = addr.clone();
        let delivery = delivery.clone();
        async move {
            let bytes = serde_json::to_vec(&delivery).unwrap();
            reqwest::Client::new()
                .post(format!("http://{addr}/webhook"))
                .header("X-GitHub-Event", "workflow_job")
                .header("X-GitHub-Delivery", uuid::Uuid::new_v4().to_string())
                .header(
                    "X-Hub-Signature-256",
                    sign(&SecretString::from("not-the-secret"), &bytes),
                )
                .body(bytes)
                .send()
                .await
                .ok()
                .map(|r| r.status().as_u16())
        }
    })
    .await
    .unwrap();
    assert_eq!(code, 401);
    // A correctly signed delivery afterwards is accepted: the receiver is live, and only the bad
    // one changed nothing. Only a Ready policy takes jobs (issue 13): wait for it first.
    w.wait_ready("web").await;
    let p = w.policies().get("web").await.unwrap();
    assert!(p.status.unwrap_or_default().pending_jobs.is_empty());
    assert!(w.list().await.is_empty());
    let good = post_webhook(&addr, &delivery, WEBHOOK_SECRET).await;
    assert_eq!(good, 202);
    wait::until(LONG, "the signed job in the ledger", || async {
        let p = w.policies().get("web").await.ok()?;
        p.status?.pending_jobs.contains_key("991").then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn min_idle_then_scale_down_deregisters_first_and_leaves_a_runner_that_took_a_job() {
    let Some(mut w) = world("min_idle_then_scale_down").await else {
        return;
    };
    w.serving_policy("web", json!({"minIdle": 2})).await;
    let idle = w
        .attempts_until("two idle runners (minIdle 2)", LONG, |l| {
            let idle: Vec<_> = l
                .iter()
                .filter(|a| state(a) == AttemptState::Idle)
                .cloned()
                .collect();
            (idle.len() == 2 && l.len() == 2).then_some(idle)
        })
        .await;
    // Steady: no third attempt.
    assert_eq!(w.list().await.len(), 2);

    // Every DELETE of a runner answers 422 (a job just landed): scale-down leaves them alone.
    w.fake
        .fault(json!({"endpoint": "delete_runner", "count": 1000, "status": 422}))
        .await
        .unwrap();
    w.patch_policy("web", json!({"minIdle": 0})).await;
    wait::until(LONG, "scale-down to try both runners", || async {
        let c = w.fake.counters().await.ok()?;
        (c["delete_runner"]["422"].as_u64().unwrap_or(0) >= 2).then_some(())
    })
    .await
    .unwrap();
    for a in w.list().await {
        assert!(
            a.spec.termination.is_none(),
            "a runner GitHub says is busy is left alone: {:?}",
            a.spec.termination
        );
    }
    assert_eq!(w.registrations().await.len(), 2);

    // Once GitHub lets go, both are deregistered first, then asked to stop.
    w.fake.admin("DELETE", "faults", Value::Null).await.unwrap();
    let names: Vec<String> = idle.iter().map(|a| registration(a).name).collect();
    w.attempts_until("both terminated with ScaleDown, deregistered", LONG, |l| {
        l.iter()
            .all(|a| {
                a.spec
                    .termination
                    .as_ref()
                    .is_some_and(|t| t.reason == TerminationReason::ScaleDown && t.deregistered)
            })
            .then_some(())
    })
    .await;
    let regs = w.registrations().await;
    for n in &names {
        assert!(
            !regs.iter().any(|r| r["name"] == n.as_str()),
            "{n} deregistered before its termination"
        );
    }
    // The agent concludes and cleans; the operator releases the finalizers; nothing new starts.
    w.until_all_cleaned_and_released("attempts cleaned and released")
        .await;
    assert!(live(&w.list().await).is_empty());
}

/// Issue 33 item 5: one owner of the CRDs. An operator that does not apply them
/// (`--apply-crds=false`, the chart's `crds.managedBy: external`) reads them at start and says
/// whether they can hold what it writes (a stale CRD's missing fields are named:
/// `crd_apply::tests`).
#[tokio::test]
async fn an_operator_that_does_not_own_the_crds_checks_them_at_start() {
    let Some(mut w) = world("crds_checked").await else {
        return;
    };
    let op = w.start_operator(&["--apply-crds", "false"]).await;
    wait::until(LONG, "the operator's word on the CRDs", || async {
        w.operators[op]
            .process
            .lines()
            .iter()
            .any(|l| l.contains("CRDs current"))
            .then_some(())
    })
    .await
    .unwrap();
    assert!(
        !w.operators[op]
            .process
            .lines()
            .iter()
            .any(|l| l.contains("CRDs applied") || l.contains("older than this operator")),
        "the operator applied or doubted CRDs it does not own"
    );
}

/// Issue 31 item 5: every architecture GitHub publishes a Linux runner for. The simulated
/// GitHub lists an x64 and an arm64 package of one version (and an s390x one, which is not an
/// architecture runner-manager places); the pool has an amd64, an arm64 and an s390x node. Each
/// attempt pins the package of its node's `kubernetes.io/arch`, and the s390x node, which
/// spreading would fill first (it is as empty as the others), gets none. A policy whose only
/// node is an s390x one creates nothing and its `Scaling` condition says why.
#[tokio::test]
async fn each_node_runs_the_package_of_its_architecture_and_a_node_of_another_gets_none() {
    let Some(mut w) = world("package_of_its_architecture").await else {
        return;
    };
    let arm64_sha = "c".repeat(64);
    for (arch, sha) in [("arm64", arm64_sha.clone()), ("s390x", "d".repeat(64))] {
        w.fake
            .admin(
                "POST",
                "downloads",
                json!({"architecture": arch, "sha256": sha,
                       "filename": format!("actions-runner-linux-{arch}-{VERSION}.tar.gz")}),
            )
            .await
            .unwrap();
    }
    let op = w.start_operator(&[]).await;
    let pool = w.pool.clone();
    let mut by_arch = std::collections::BTreeMap::new();
    for arch in ["amd64", "arm64", "s390x"] {
        // Two each: four runners must use both nodes with a package, whichever Lease the
        // operator saw first.
        let node = w
            .add_node_labelled(
                script(|s| s.capacity = 2),
                op,
                &[(POOL_LABEL, pool.as_str()), (ARCH_LABEL, arch)],
            )
            .await;
        by_arch.insert(arch, node);
    }
    let mainframes = format!("{pool}-s390x");
    w.add_node_labelled(
        Script::default(),
        op,
        &[(POOL_LABEL, mainframes.as_str()), (ARCH_LABEL, "s390x")],
    )
    .await;

    w.policy("web", json!({"minIdle": 4})).await;
    let attempts = w
        .attempts_until("four attempts", LONG, |l| {
            (l.len() >= 4).then(|| l.to_vec())
        })
        .await;
    let on = |arch: &str| {
        attempts
            .iter()
            .filter(|a| a.spec.node_name == by_arch[arch])
            .collect::<Vec<_>>()
    };
    assert!(on("s390x").is_empty(), "an attempt on the s390x node");
    assert!(
        !on("amd64").is_empty() && !on("arm64").is_empty(),
        "spread over both"
    );
    for a in on("amd64") {
        let p = &a.spec.snapshot.runner;
        assert_eq!(
            (p.architecture, p.sha256.as_str()),
            (Some(Arch::X64), sha().as_str())
        );
        assert!(
            p.url.ends_with(&format!("linux-x64-{VERSION}.tar.gz")),
            "{}",
            p.url
        );
    }
    for a in on("arm64") {
        let p = &a.spec.snapshot.runner;
        assert_eq!(
            (p.architecture, p.sha256.as_str()),
            (Some(Arch::Arm64), arm64_sha.as_str())
        );
        assert!(
            p.url.ends_with(&format!("linux-arm64-{VERSION}.tar.gz")),
            "{}",
            p.url
        );
    }

    w.policy(
        "mainframe",
        json!({"minIdle": 1, "nodeSelector": {POOL_LABEL: mainframes}}),
    )
    .await;
    let (status, reason, message) =
        wait::until(LONG, "the s390x-only policy to say why", || async {
            w.condition("mainframe", PolicyConditionType::Scaling)
                .await
                .filter(|(_, r, _)| *r == PolicyReason::NoEligibleNode)
        })
        .await
        .unwrap();
    assert_eq!(
        (status, reason),
        (ConditionStatus::False, PolicyReason::NoEligibleNode)
    );
    assert!(message.contains("kubernetes.io/arch"), "{message}");
    assert!(
        w.list().await.iter().all(|a| a.spec.policy != "mainframe"),
        "an attempt for a node of no package"
    );
}

/// Issue 31 item 4: `spec.suspend` pauses a policy. Its idle runners are drained the way a
/// scale-down drains them (deregistered first, then stopped and cleaned), a job queued while it
/// is suspended is counted (`status.pendingJobs`) and launches nothing, the `Scaling` condition
/// says `Suspended`, and once resumed the policy launches for the job and its `minIdle` again.
#[tokio::test]
async fn a_suspended_policy_drains_its_idle_runners_launches_nothing_and_still_counts_jobs() {
    let Some(mut w) = world("suspended_policy").await else {
        return;
    };
    let op = w.operator_and_node().await;
    // Webhooks only: the queued job stays in the ledger while the policy is suspended.
    w.policy(
        "web",
        json!({"minIdle": 2, "scaling": {"pollInterval": "1h"}}),
    )
    .await;
    w.attempts_until("two idle runners (minIdle 2)", LONG, |l| {
        (l.iter().filter(|a| state(a) == AttemptState::Idle).count() == 2).then_some(())
    })
    .await;

    w.patch_policy("web", json!({"suspend": true})).await;
    w.attempts_until(
        "both drained: ScaleDown, deregistered, cleaned",
        LONG,
        |l| {
            l.iter()
                .all(|a| {
                    state(a) == AttemptState::Cleaned
                        && a.spec.termination.as_ref().is_some_and(|t| {
                            t.reason == TerminationReason::ScaleDown && t.deregistered
                        })
                })
                .then_some(())
        },
    )
    .await;
    assert!(
        w.registrations().await.is_empty(),
        "a drained runner is still registered"
    );

    w.hook_to(op).await;
    let job = w.queue_job().await.to_string();
    wait::until(LONG, "the job counted while Suspended", || async {
        let s = w.policies().get("web").await.ok()?.status?;
        let suspended = matches!(
            w.condition("web", PolicyConditionType::Scaling).await,
            Some((ConditionStatus::False, PolicyReason::Suspended, _))
        );
        (s.pending_jobs.contains_key(&job) && s.desired == 0 && suspended).then_some(())
    })
    .await
    .unwrap();
    assert!(
        live(&w.list().await).is_empty(),
        "a suspended policy launched a runner"
    );

    w.patch_policy("web", json!({"suspend": false})).await;
    w.attempts_until("runners launched again once resumed", LONG, |l| {
        (live(l).len() >= 2).then_some(())
    })
    .await;
}

#[tokio::test]
async fn scale_from_zero_with_webhooks_dropped_by_polling() {
    let Some(mut w) = world("scale_from_zero_by_polling").await else {
        return;
    };
    let op = w.operator_and_node().await;
    w.hook_to(op).await;
    w.fake.drop_webhooks(100).await.unwrap();
    w.policy("web", json!({"scaling": {"pollInterval": "10s"}}))
        .await;
    let job = w.queue_job().await;
    w.attempts_until("an attempt for the polled job", LONG, |l| {
        (l.len() == 1).then_some(())
    })
    .await;
    let p = w.policies().get("web").await.unwrap();
    assert!(
        p.status
            .unwrap()
            .pending_jobs
            .contains_key(&job.to_string())
    );
    w.fake.assert_every_delivery_dropped().await;
}

#[tokio::test]
async fn registration_timeout_requests_termination_and_a_replacement_carries_lineage() {
    let Some(mut w) = world("registration_timeout_replacement").await else {
        return;
    };
    let op = w.start_operator(&[]).await;
    w.add_node(script(|s| s.never_register = true), op).await;
    w.policy(
        "web",
        json!({"minIdle": 1, "timeouts": {"registration": "30s"}}),
    )
    .await;
    let first = w
        .attempts_until("the first attempt stuck in Starting", LONG, |l| {
            l.iter()
                .find(|a| state(a) == AttemptState::Starting)
                .cloned()
        })
        .await;
    let first_name = first.metadata.name.clone().unwrap();
    let runner = registration(&first);
    let terminated = w
        .attempts_until("termination RegistrationTimeout", LONG, |l| {
            l.iter()
                .find(|a| a.metadata.name.as_deref() == Some(first_name.as_str()))
                .and_then(|a| a.spec.termination.clone())
        })
        .await;
    assert_eq!(terminated.reason, TerminationReason::RegistrationTimeout);
    assert!(terminated.deregistered);
    assert!(
        !w.registrations()
            .await
            .iter()
            .any(|r| r["name"] == runner.name.as_str()),
        "deregistered first"
    );
    let replacement = w
        .attempts_until("a replacement naming the first", LONG, |l| {
            l.iter()
                .find(|a| a.spec.replaces.as_deref() == Some(first_name.as_str()))
                .cloned()
        })
        .await;
    assert_ne!(
        replacement.metadata.name.as_deref(),
        Some(first_name.as_str())
    );
}

#[tokio::test]
async fn orphan_registrations_are_cleaned_in_two_phases_and_a_foreign_runner_survives() {
    let Some(mut w) = world("orphan_registrations").await else {
        return;
    };
    let op = w.start_operator(&["--orphan-grace", "4s"]).await;
    w.add_node(Script::default(), op).await;
    w.policy("web", json!({})).await;
    let client = w
        .fake
        .client(&format!("https://github.com/{ORG}/web"), pat_credentials());
    let orphan = runner_name(uuid::Uuid::new_v4());
    let foreign = runner_name(uuid::Uuid::new_v4());
    client
        .generate_jit(
            &orphan,
            1,
            &["self-hosted".into(), w.ownership.clone()],
            "_work",
        )
        .await
        .unwrap();
    client
        .generate_jit(
            &foreign,
            1,
            &["self-hosted".into(), "rm-000000000000".into()],
            "_work",
        )
        .await
        .unwrap();
    let created = Instant::now();
    wait::until(LONG, "the orphan registration deleted", || async {
        let regs = w.registrations().await;
        (!regs.iter().any(|r| r["name"] == orphan.as_str())).then_some(())
    })
    .await
    .unwrap();
    let took = created.elapsed();
    assert!(
        took >= Duration::from_secs(4),
        "deleted after {took:?}: two sightings a grace apart"
    );
    // Several more observation passes: the foreign runner is never touched.
    let deletes = w.fake.calls("delete_runner").await.unwrap();
    wait::until(LONG, "three more observation passes", || async {
        let lists = w.fake.calls("list_runners").await.ok()?;
        (lists >= 8).then_some(())
    })
    .await
    .unwrap();
    assert!(
        w.registrations()
            .await
            .iter()
            .any(|r| r["name"] == foreign.as_str()),
        "a runner without our label survives"
    );
    assert_eq!(w.fake.calls("delete_runner").await.unwrap(), deletes);
    assert_eq!(
        w.operators[op]
            .metric("runner_manager_orphan_registrations_deleted_total")
            .await,
        1.0
    );
}

#[tokio::test]
async fn leader_failover_between_two_operator_processes() {
    let Some(mut w) = world("leader_failover").await else {
        return;
    };
    let a = w
        .start_operator(&["--leader-election", "true", "--lease-duration", "8s"])
        .await;
    let b = w
        .start_operator(&["--leader-election", "true", "--lease-duration", "8s"])
        .await;
    w.add_node(Script::default(), a).await;
    let (leader, standby) = w.one_leader(a, b).await;
    w.policy("web", json!({"minIdle": 1})).await;
    w.attempts_until("the leader creates the minIdle attempt", LONG, |l| {
        (l.len() == 1).then_some(())
    })
    .await;
    assert_eq!(
        w.operators[standby]
            .metric("runner_manager_attempts_created_total")
            .await,
        0.0,
        "the standby does not reconcile"
    );
    // Kill the leader outright: the standby takes over within the lease duration and reconciles.
    let killed = Instant::now();
    w.operators[leader].process.child.kill().unwrap();
    w.operators[leader].process.child.wait().unwrap();
    wait::until(LONG, "the standby to lead", || async {
        (w.operators[standby].metric("runner_manager_leader").await == 1.0).then_some(())
    })
    .await
    .unwrap();
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(20), "took over after {took:?}");
    w.patch_policy("web", json!({"minIdle": 2})).await;
    w.attempts_until("the new leader honours minIdle 2", LONG, |l| {
        (l.len() == 2).then_some(())
    })
    .await;

    // A leader that finds another holder on renewal stops at once and exits non-zero.
    let leases =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(w.kube.clone(), &w.system);
    let mut lease = leases.get("runner-manager-operator").await.unwrap();
    let spec = lease.spec.as_mut().unwrap();
    spec.holder_identity = Some("someone-else".into());
    spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    spec.lease_duration_seconds = Some(3600);
    leases
        .replace("runner-manager-operator", &PostParams::default(), &lease)
        .await
        .unwrap();
    let mut deposed = w.operators.swap_remove(standby);
    let status = wait::until(LONG, "the deposed leader to exit", || {
        let s = deposed.process.child.try_wait().ok().flatten();
        async move { s }
    })
    .await
    .unwrap();
    assert!(!status.success(), "exits non-zero: {status:?}");
}

#[tokio::test]
async fn a_rejected_attempt_is_replaced_on_another_node_with_lineage() {
    let Some(mut w) = world("a_rejected_attempt_is_replaced").await else {
        return;
    };
    let op = w.start_operator(&[]).await;
    // The full node advertises the package, so placement prefers it first; its agent rejects.
    let full = w
        .add_node(
            Script {
                reject: true,
                packages: vec![sha()],
                ..Script::default()
            },
            op,
        )
        .await;
    let roomy = w.add_node(Script::default(), op).await;
    w.policy("web", json!({"minIdle": 1})).await;
    let rejected = w
        .attempts_until("an attempt rejected on the full node", LONG, |l| {
            l.iter()
                .find(|a| {
                    a.spec.node_name == full
                        && a.status
                            .as_ref()
                            .and_then(|s| s.journal.outcome())
                            .is_some()
                })
                .cloned()
        })
        .await;
    assert_eq!(state(&rejected), AttemptState::Cleaned);
    w.replaced_idle_on(&rejected, &roomy, "its replacement idle on the other node")
        .await;
}

#[tokio::test]
async fn failed_launches_back_off_then_degrade_the_policy_until_its_spec_changes() {
    let Some(mut w) = world("failed_launches_degrade").await else {
        return;
    };
    let flags = ["--max-consecutive-failures", "3"];
    let op = w.start_operator(&flags).await;
    w.add_node(script(|s| s.fail_after_jit = true), op).await;
    w.policy("web", json!({"minIdle": 1})).await;
    let (_, reason, message) = w
        .until_condition(
            "web",
            PolicyConditionType::Degraded,
            ConditionStatus::True,
            "the policy Degraded",
        )
        .await;
    assert_eq!(reason, PolicyReason::LaunchesFailing);
    assert!(message.contains("JitExpired"), "{message}");
    let failed = w.list().await;
    assert_eq!(failed.len(), 3, "three launches, then no more");
    // Each replacement names the one before it (lineage), and waited its backoff.
    let mut by_created = failed.clone();
    by_created.sort_by_key(|a| a.metadata.creation_timestamp.clone().map(|t| t.0));
    for pair in by_created.windows(2) {
        assert_eq!(pair[1].spec.replaces, pair[0].metadata.name);
    }
    // Degraded stops replacing: several passes later, still three.
    let before = w.operators[op]
        .metric("runner_manager_api_writes_total{kind=\"policy_status\"}")
        .await;
    wait::until(LONG, "more passes", || async {
        let now = w.operators[op]
            .metric("runner_manager_api_writes_total{kind=\"policy_status\"}")
            .await;
        let lists = w.fake.calls("list_runners").await.ok()?;
        (now >= before && lists >= 10).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(w.list().await.len(), 3);
    // A spec change clears it; with the agent fixed, the next launch works.
    w.agents[0].set(|s| s.fail_after_jit = false);
    w.patch_policy("web", json!({"labels": ["self-hosted", "linux", "x64"]}))
        .await;
    w.attempts_until("a working launch after the spec change", LONG, |l| {
        l.iter().find(|a| state(a) == AttemptState::Idle).cloned()
    })
    .await;
    w.until_condition(
        "web",
        PolicyConditionType::Degraded,
        ConditionStatus::False,
        "Degraded cleared",
    )
    .await;
}

#[tokio::test]
async fn a_lost_node_orphans_its_attempts_and_they_are_replaced_elsewhere() {
    let Some(mut w) = world("a_lost_node").await else {
        return;
    };
    let op = w.start_operator(&["--node-lost-grace", "2s"]).await;
    let doomed = w.add_node(script(|s| s.packages = vec![sha()]), op).await;
    w.policy("web", json!({"minIdle": 1})).await;
    let first = w
        .attempts_until("an idle attempt on the preferred node", LONG, |l| {
            l.iter()
                .find(|a| a.spec.node_name == doomed && state(a) == AttemptState::Idle)
                .cloned()
        })
        .await;
    // The node dies: its agent stops heartbeating and taking edges.
    w.agents[0].set(|s| {
        s.heartbeat = false;
    });
    let survivor = w.add_node(Script::default(), op).await;
    let _ = w.agents.remove(0);
    let orphaned = w
        .attempts_until(
            "the attempt Orphaned(NodeLost) by the operator",
            LONG,
            |l| {
                l.iter()
                    .find(|a| {
                        a.metadata.name == first.metadata.name && state(a) == AttemptState::Orphaned
                    })
                    .cloned()
            },
        )
        .await;
    let outcome = serde_json::to_value(orphaned.status.unwrap().journal.outcome()).unwrap();
    assert_eq!(outcome, json!({"kind": "Orphaned", "reason": "NodeLost"}));
    let what = "a replacement idle on the surviving node";
    w.replaced_idle_on(&first, &survivor, what).await;
}

/// DESIGN §10: GitHub calls per launched runner, amortized over a burst of ten jobs (printed as
/// MEASURE; the broker's look-up-before-mint is one of them by design, DESIGN §5).
/// The broker and the controllers share one client registry (DESIGN deviation 17): the
/// controllers' resolution and observation and the broker's JIT mint for one installation go out
/// under one installation token, so GitHub is asked for it once. With a registry each, the
/// broker minted its own token and spent its own budget.
#[tokio::test]
async fn one_installation_token_serves_the_controllers_and_the_broker() {
    let Some(mut w) = world("one_installation_token").await else {
        return;
    };
    let app = Secret {
        metadata: ObjectMeta {
            name: Some("github-app".into()),
            ..ObjectMeta::default()
        },
        data: Some(app_secret_data(None).unwrap()),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(w.kube.clone(), &w.team)
        .create(&PostParams::default(), &app)
        .await
        .unwrap();
    let spec = json!({"minIdle": 1, "github": {"credentialsSecretRef": {"name": "github-app"}}});
    w.serving_policy("web", spec).await;
    w.until_any_in(
        AttemptState::Idle,
        "an idle runner, its JIT minted by the broker",
    )
    .await;
    let counters = w.fake.counters().await.unwrap();
    assert_eq!(
        counters["generate_jitconfig"]["201"].as_u64(),
        Some(1),
        "the broker minted: {counters}"
    );
    assert!(
        w.fake.calls("list_runners").await.unwrap() >= 1,
        "the controllers called GitHub: {counters}"
    );
    assert_eq!(
        w.fake.calls("access_tokens").await.unwrap(),
        1,
        "one installation token for the controllers and the broker: {counters}"
    );
}

/// Infrastructure faults never degrade a policy (issue 15 item 7): agents restarted during
/// preparation (as a DaemonSet rollout does) conclude `Failed(PreparationInterrupted)` again and
/// again. With `--max-consecutive-failures 3` and a 30 s replacement backoff the policy neither
/// degrades nor waits: each is replaced at once, and it serves as soon as the agents are back.
#[tokio::test]
async fn agent_restarts_during_preparation_never_degrade_the_policy() {
    let Some(mut w) = world("interrupted_preparation").await else {
        return;
    };
    let op = w
        .start_operator(&[
            "--max-consecutive-failures",
            "3",
            "--replacement-backoff",
            "30s",
        ])
        .await;
    w.add_node(script(|s| s.interrupt_preparation = true), op)
        .await;
    w.policy("web", json!({"minIdle": 1})).await;
    let interrupted = |l: &[RunnerAttempt]| {
        l.iter()
            .filter(|a| {
                a.status.as_ref().and_then(|s| s.journal.outcome())
                    == Some(Outcome::Failed(FailureReason::PreparationInterrupted))
            })
            .count()
    };
    w.attempts_until("five interrupted preparations", LONG, |l| {
        (interrupted(l) >= 5).then_some(())
    })
    .await;
    assert_not_degraded(&w, "web").await;
    w.agents[0].set(|s| s.interrupt_preparation = false);
    w.until_any_in(
        AttemptState::Idle,
        "an idle runner once the agents are back",
    )
    .await;
    assert_not_degraded(&w, "web").await;
}

#[tokio::test]
async fn github_calls_per_launched_runner_in_a_burst() {
    let Some(mut w) = world("github_calls_per_launched_runner").await else {
        return;
    };
    let op = w.start_operator(&["--observe-interval", "10s"]).await;
    w.add_node(script(|s| s.capacity = 10), op).await;
    w.policy("web", json!({"maxRunners": 10})).await;
    w.wait_ready("web").await;
    w.hook_to(op).await;
    w.fake
        .admin("DELETE", "counters", Value::Null)
        .await
        .unwrap();
    for _ in 0..10 {
        w.queue_job().await;
    }
    w.attempts_until("ten idle runners", LONG, |l| {
        (l.iter().filter(|a| state(a) == AttemptState::Idle).count() == 10).then_some(())
    })
    .await;
    let counters = w.fake.counters().await.unwrap();
    let calls: u64 = counters
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| !k.starts_with('_') && !k.contains("download"))
        .flat_map(|(_, m)| m.as_object().unwrap().values().filter_map(Value::as_u64))
        .sum();
    eprintln!(
        "MEASURE github calls per launched runner (burst of 10): {:.2} ({counters})",
        calls as f64 / 10.0
    );
    assert!(calls > 0);
}

/// Runners per job in a burst (issue 15 item 6): ten jobs queued at once make exactly ten
/// attempts, however the reconciles triggered by the ledger writes, the creates and the policy's
/// own status writes interleave with the watch events. The policy settles `Steady` at ten idle
/// runners for ten pending jobs (the scripted runners take no job), and no attempt beyond ten
/// was ever created, scale-down included.
#[tokio::test]
async fn a_burst_of_jobs_creates_one_runner_per_job() {
    let Some(mut w) = world("a_burst_creates_one_runner_per_job").await else {
        return;
    };
    let op = w.start_operator(&[]).await;
    w.add_node(script(|s| s.capacity = 20), op).await;
    w.policy("web", json!({"maxRunners": 20, "minIdle": 0}))
        .await;
    w.wait_ready("web").await;
    w.hook_to(op).await;
    futures_util::future::join_all((0..10).map(|_| w.queue_job())).await;
    w.attempts_until("ten idle runners", LONG, |l| {
        (l.iter().filter(|a| state(a) == AttemptState::Idle).count() == 10).then_some(())
    })
    .await;
    wait::until(LONG, "the policy Steady at ten", || async {
        let p = w.policies().get("web").await.ok()?;
        let s = p.status?;
        let steady = s
            .conditions
            .iter()
            .any(|c| c.type_ == PolicyConditionType::Scaling && c.reason == PolicyReason::Steady);
        (steady && s.desired == 10 && s.idle == 10).then_some(())
    })
    .await
    .unwrap();
    let all = w.list().await;
    assert_eq!(
        all.len(),
        10,
        "one attempt per job: {:?}",
        all.iter()
            .map(|a| (a.metadata.name.clone(), state(a)))
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn deleting_a_policy_drains_it_and_abandon_releases_a_stuck_attempt() {
    let Some(mut w) = world("deleting_a_policy_drains").await else {
        return;
    };
    w.serving_policy("web", json!({"minIdle": 1})).await;
    w.policy(
        "stuck",
        json!({"minIdle": 1, "labels": ["self-hosted", "gpu"]}),
    )
    .await;
    w.attempts_until("one idle attempt per policy", LONG, |l| {
        (l.iter().filter(|a| state(a) == AttemptState::Idle).count() == 2).then_some(())
    })
    .await;
    // Deleting `web` drains: its idle runner is deregistered and stopped, the Cleaned attempt
    // deleted, and the policy released.
    w.policies()
        .delete("web", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    wait::until(LONG, "the policy gone", || async {
        w.policies()
            .get_opt("web")
            .await
            .ok()
            .and_then(|p| p.is_none().then_some(()))
    })
    .await
    .unwrap();
    let left = w.list().await;
    assert!(left.iter().all(|a| a.spec.policy == "stuck"), "{left:?}");
    // An attempt whose agent is gone for good is released by the abandon annotation.
    w.agents.clear();
    let stuck = left[0].metadata.name.clone().unwrap();
    w.attempts()
        .delete(&stuck, &kube::api::DeleteParams::default())
        .await
        .unwrap();
    w.attempts()
        .patch(
            &stuck,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"runner-manager.dev/abandon": "true"}}}),
            ),
        )
        .await
        .unwrap();
    w.attempts_until("the abandoned attempt released", LONG, |l| {
        (!l.iter()
            .any(|a| a.metadata.name.as_deref() == Some(stuck.as_str())))
        .then_some(())
    })
    .await;
}

/// DESIGN §11: a cordoned node gets no new attempts and its idle runners are drained: the idle
/// runner is deregistered first, then asked to stop (`Drain`), and its successor is placed on the
/// node that is still schedulable.
#[tokio::test]
async fn a_cordoned_nodes_idle_runner_is_drained_and_replaced_elsewhere() {
    let Some(mut w) = world("cordoned_node_drained").await else {
        return;
    };
    let (op, first) = w.operator_with_node().await;
    w.policy("web", json!({"minIdle": 1})).await;
    let idle = w.idle_on(&first, "an idle runner on the first node").await;
    let runner = idle
        .status
        .as_ref()
        .and_then(|s| s.journal.runner())
        .map(|r| r.name.clone())
        .unwrap();
    let second = w.add_node(Script::default(), op).await;
    Api::<k8s_openapi::api::core::v1::Node>::all(w.kube.clone())
        .patch(
            &first,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    let successor = w
        .idle_on(&second, "an idle successor on the second node")
        .await;
    let drained = w
        .attempts()
        .get(idle.metadata.name.as_deref().unwrap())
        .await
        .unwrap();
    let termination = drained.spec.termination.as_ref().expect("asked to stop");
    assert_eq!(termination.reason, TerminationReason::Drain);
    assert!(termination.deregistered, "deregistered before the stop");
    assert!(
        !w.registrations()
            .await
            .iter()
            .any(|r| r["name"].as_str() == Some(runner.as_str())),
        "GitHub no longer lists the drained runner"
    );
    assert_ne!(successor.metadata.name, idle.metadata.name);
    assert!(
        w.list()
            .await
            .iter()
            .filter(|a| a.spec.node_name == first)
            .count()
            == 1,
        "nothing new on the cordoned node"
    );
}

/// A leader stopped cleanly (SIGTERM: a rolling upgrade, a drained node) stops reconciling,
/// then releases its Lease: the standby takes over at its next try, not after the lease lapses.
#[tokio::test]
async fn a_leader_stopped_by_sigterm_hands_over_before_its_lease_would_lapse() {
    let Some(mut w) = world("leader_sigterm_release").await else {
        return;
    };
    // A long lease, so waiting it out and a release cannot be confused.
    let flags = ["--leader-election", "true", "--lease-duration", "40s"];
    let a = w.start_operator(&flags).await;
    let b = w.start_operator(&flags).await;
    let (leader, standby) = w.one_leader(a, b).await;
    let stopped = Instant::now();
    w.operators[leader].process.terminate().unwrap();
    let status = wait::until(LONG, "the old leader to exit", || {
        let s = w.operators[leader].process.child.try_wait().ok().flatten();
        async move { s }
    })
    .await
    .unwrap();
    assert!(status.success(), "a clean stop exits 0: {status:?}");
    wait::until(
        Duration::from_secs(30),
        "the standby to lead before the 40 s lease would lapse",
        || async {
            (w.operators[standby].metric("runner_manager_leader").await == 1.0).then_some(())
        },
    )
    .await
    .unwrap();
    eprintln!("MEASURE standby led {:?} after SIGTERM", stopped.elapsed());
}
