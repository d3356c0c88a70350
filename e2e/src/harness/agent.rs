//! A node agent on the real control plane, for the agent scenario tests: the simulated GitHub
//! publishing the stand-in runner package, the operator binary serving only the broker, one
//! simulated node (Node, agent Pod, bound token), a private host root and cgroup parent, and the
//! agent binary as a process. The test plays the operator's facts and requests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use runner_manager_crds::attempt::{AttemptJournal, RunnerAttempt, RunnerAttemptStatus};
use runner_manager_crds::lease::AgentAdvert;
use runner_manager_crds::names::{agent_lease_name, runner_name};
use runner_manager_crds::outcome::Outcome;
use runner_manager_crds::state::AttemptState;
use serde_json::{Value, json};

use super::attempt::{name, outcome};
use super::fixtures::native_attempt;
use super::github::ORG;
use super::node::SimNode;
use super::process::{Running, binary, operator_addrs};
use super::wait;
use super::world::{NodeHost, World, WorldBuilder, fail, kill_cgroup_tree, over_world};
use crate::fake_github::PackageInfo;
use crate::fake_github::scope::Scope;

/// How long a scenario step may take on this shared 2-core machine.
pub const STEP: Duration = Duration::from_secs(120);

/// One agent scenario's world (its [`World`] through `Deref`).
pub struct AgentWorld {
    pub world: World,
    /// The stand-in runner package the simulated GitHub publishes.
    pub package: PackageInfo,
    pub operator: Running,
    pub broker_url: String,
    /// The node under test, its host root and cgroup parent.
    pub on: NodeHost,
}

over_world!(AgentWorld);

impl WorldBuilder {
    /// A world for one node agent under test: the stand-in runner package published, the
    /// team's policy `web` and its App Secret, one simulated node, and the operator binary
    /// serving only the broker (controllers and leader election off: the test plays the
    /// operator). The test starts the agent ([`AgentWorld::agent`]). `None` (with the reason
    /// printed) without `KUBECONFIG`.
    pub async fn agent_under_test(self) -> Result<Option<AgentWorld>, String> {
        let Some(world) = self
            .package_or_stand_in()
            .app_secret()
            .web_policy()
            .build()
            .await?
        else {
            return Ok(None);
        };
        let package = world.published_package()?;
        let on = world.add_node("agent-node", BTreeMap::new()).await?;
        let mut cmd = world.operator_command(&[])?;
        cmd.env("RM_CONTROLLERS", "false")
            .env("RM_LEADER_ELECTION", "false");
        let operator =
            Running::spawn("runner-manager-operator", cmd).map_err(|e| fail("operator", e))?;
        let broker = operator_addrs(&operator, STEP).await?.broker;
        Ok(Some(AgentWorld {
            world,
            package,
            operator,
            broker_url: format!("https://{broker}"),
            on,
        }))
    }
}

impl AgentWorld {
    /// Shorthand for `World::builder(test).agent_under_test()`, for a scenario: `None` when
    /// there is no control plane to run on (the test is skipped), a panic when set-up fails.
    pub async fn start(test: &str) -> Option<Self> {
        World::builder(test)
            .agent_under_test()
            .await
            .unwrap_or_else(|e| panic!("{test}: setting up the agent's world: {e}"))
    }

    /// The simulated node under test.
    pub fn node(&self) -> &SimNode {
        &self.on.node
    }

    pub fn host_root(&self) -> &Path {
        &self.on.host
    }

    /// The agent binary with this world's flags; `extra` env (e.g. `RM_AGENT_FAULT`).
    pub fn agent(&self, capacity: u32, extra: &[(&str, &str)]) -> Result<Running, String> {
        self.agent_command(World::agent_binary()?, capacity, extra)
    }

    /// [`Self::agent`] (capacity 4) placing a placeholder pod before each native runner and
    /// waiting `wait_seconds` for the kubelet to admit it; `extra` env on top.
    pub fn placeholder_agent(
        &self,
        wait_seconds: &str,
        extra: &[(&str, &str)],
    ) -> Result<Running, String> {
        let mut env = vec![
            ("RM_PLACEHOLDERS", "true"),
            ("RM_PLACEHOLDER_WAIT_SECONDS", wait_seconds),
        ];
        env.extend_from_slice(extra);
        self.agent(4, &env)
    }

    /// Like [`Self::agent`], with at most `nofile` open descriptors (soft and hard
    /// `RLIMIT_NOFILE`, set by util-linux's `prlimit`, which then becomes the agent).
    pub fn agent_with_fd_limit(
        &self,
        capacity: u32,
        extra: &[(&str, &str)],
        nofile: u32,
    ) -> Result<Running, String> {
        let mut cmd = std::process::Command::new("prlimit");
        cmd.arg(format!("--nofile={nofile}:{nofile}"))
            .arg("--")
            .arg(binary("runner-manager-node-agent").map_err(|e| fail("binary", e))?);
        self.agent_command(cmd, capacity, extra)
    }

    fn agent_command(
        &self,
        program: std::process::Command,
        capacity: u32,
        extra: &[(&str, &str)],
    ) -> Result<Running, String> {
        let mut cmd = self.world.agent_command(
            program,
            &self.on,
            capacity,
            &self.broker_url,
            &[
                ("--runner-uid-range", "20001-20064"),
                ("--runner-gid", "20000"),
                ("--heartbeat-seconds", "2"),
                ("--supervision-millis", "200"),
                ("--orphan-sweep-seconds", "2"),
                // No operator controllers run here: the agent's backstop deadlines are under test.
                ("--deadline-grace-seconds", "0"),
                ("--log-format", "json"),
            ],
        );
        for (k, v) in extra {
            cmd.env(k, v);
        }
        Running::spawn("runner-manager-node-agent", cmd).map_err(|e| fail("agent", e))
    }

    /// A new `Pending` native, ephemeral attempt bound to this node, pinning the published
    /// package.
    pub async fn pending_attempt(&self) -> Result<RunnerAttempt, String> {
        self.pending_attempt_with(|_| {}).await
    }

    /// Like [`pending_attempt`](Self::pending_attempt), with the snapshot changed by `edit`.
    pub async fn pending_attempt_with(
        &self,
        edit: impl FnOnce(&mut runner_manager_crds::attempt::AttemptSnapshot),
    ) -> Result<RunnerAttempt, String> {
        let mut a = native_attempt(
            uuid::Uuid::new_v4(),
            "web",
            &self.policy_uid,
            &self.on.node.name,
        );
        edit(&mut a.spec.snapshot);
        a.spec.snapshot.runner.url = format!(
            "{}/_downloads/{}",
            self.fake.base_url(),
            self.package.file_name
        );
        a.spec.snapshot.runner.sha256 = self.package.sha256.clone();
        a.spec.snapshot.runner.version = self.package.version.clone();
        self.attempts()
            .create(&PostParams::default(), &a)
            .await
            .map_err(|e| fail("create attempt", e))
    }

    /// Waits until `check` holds for the attempt's status.
    pub async fn wait_for(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&RunnerAttemptStatus) -> bool,
    ) -> Result<RunnerAttempt, String> {
        let api = self.attempts();
        let check = &check;
        wait::until(STEP, what, || {
            let api = api.clone();
            async move {
                let a = api.get(name).await.ok()?;
                a.status.as_ref().filter(|s| check(s)).map(|_| a.clone())
            }
        })
        .await
        .map_err(|e| e.to_string())
    }

    pub async fn wait_state(
        &self,
        name: &str,
        state: AttemptState,
    ) -> Result<RunnerAttempt, String> {
        self.wait_for(name, &format!("{name} to be {state:?}"), |s| {
            s.journal.state() == state
        })
        .await
    }

    /// Wait until attempt `name` is `Cleaned` and assert that it concluded `expected`; the
    /// attempt as it ended.
    pub async fn wait_concluded(&self, name: &str, expected: Outcome) -> RunnerAttempt {
        self.wait_concluded_saying(name, expected, "").await
    }

    /// Like [`Self::wait_concluded`], `context` saying which case of the scenario failed.
    pub async fn wait_concluded_saying(
        &self,
        name: &str,
        expected: Outcome,
        context: &str,
    ) -> RunnerAttempt {
        let done = self
            .wait_state(name, AttemptState::Cleaned)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(outcome(&done), Some(expected), "{context}");
        done
    }

    /// The operator's fact: what GitHub's list says of the runner.
    pub async fn set_github(
        &self,
        name: &str,
        online: bool,
        busy: bool,
        generation: i64,
    ) -> Result<(), String> {
        let status = if online { "online" } else { "offline" };
        self.set_github_status(name, status, busy, generation).await
    }

    /// The operator's fact with any status: `online`, `offline`, `absent` (not listed) or
    /// `unreachable` (GitHub did not answer).
    pub async fn set_github_status(
        &self,
        name: &str,
        status: &str,
        busy: bool,
        generation: i64,
    ) -> Result<(), String> {
        let body = json!({"status": {"github": {
            "status": status, "busy": busy, "generation": generation}}});
        self.attempts()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .map(|_| ())
            .map_err(|e| fail("github fact", e))
    }

    /// The operator's fact: the job the runner was assigned.
    pub async fn set_job(&self, name: &str, job: u64) -> Result<(), String> {
        let body = json!({"status": {"job": {"id": job}}});
        self.attempts()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .map(|_| ())
            .map_err(|e| fail("job fact", e))
    }

    /// The operator's request: `spec.termination`.
    pub async fn request_termination(&self, name: &str, reason: &str) -> Result<(), String> {
        let body = json!({"spec": {"termination": {
            "reason": reason, "requestedAt": k8s_openapi::jiff::Timestamp::now().to_string(), "deregistered": true}}});
        self.attempts()
            .patch(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .map(|_| ())
            .map_err(|e| fail("termination", e))
    }

    /// The fake's registrations named for `attempt`.
    pub async fn registrations(&self, attempt: &RunnerAttempt) -> Result<Vec<Value>, String> {
        let name = attempt
            .spec
            .attempt_uuid()
            .map(runner_name)
            .unwrap_or_default();
        self.fake
            .runners_named(&name)
            .await
            .map_err(|e| fail("runners", e))
    }

    /// The operator's deregistration: deletes every registration named for `attempt`.
    pub async fn deregister(&self, attempt: &RunnerAttempt) -> Result<(), String> {
        for r in self.registrations(attempt).await? {
            let id = r["id"].as_u64().unwrap_or_default();
            self.fake
                .running
                .fake
                .delete_runner(&Scope::repo(ORG, "web"), id)
                .map_err(|e| format!("delete runner {id}: {e:?}"))?;
        }
        Ok(())
    }

    /// Waits until the fake lists the attempt's runner online.
    pub async fn wait_online(&self, attempt: &RunnerAttempt) -> Result<(), String> {
        wait::until(STEP, "the runner online at the fake", || async {
            let regs = self.registrations(attempt).await.ok()?;
            regs.iter().any(|r| r["status"] == "online").then_some(())
        })
        .await
        .map_err(|e| e.to_string())
    }

    /// Queues a job the runner's labels match; returns its id.
    pub async fn queue_job(&self, duration_ms: u64) -> Result<u64, String> {
        self.queue_job_with(json!({"duration_ms": duration_ms}))
            .await
    }

    /// Queues a job with the stand-in's `behaviour` (`standin_runner::behaviour::JobBehaviour`).
    pub async fn queue_job_with(&self, behaviour: Value) -> Result<u64, String> {
        self.fake
            .queue_job(
                json!({"owner": ORG, "repo": "web", "labels": ["self-hosted", "linux"],
                       "behaviour": behaviour}),
            )
            .await
            .map_err(|e| fail("queue job", e))
    }

    /// Waits until the fake assigned job `id` to a runner; returns the runner's name.
    pub async fn wait_assigned(&self, id: u64) -> Result<String, String> {
        wait::until(STEP, "the job assigned", || async {
            let v = self
                .fake
                .admin("GET", &format!("jobs/{id}"), Value::Null)
                .await
                .ok()?;
            v["runner_name"].as_str().map(str::to_owned)
        })
        .await
        .map_err(|e| e.to_string())
    }

    /// Waits until the attempt `name` is in `state` or later; `what` names the wait.
    pub async fn wait_from(&self, name: &str, state: AttemptState, what: &str) -> RunnerAttempt {
        self.wait_for(name, what, |s| s.journal.state() >= state)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The agent at the tests' usual capacity (4) and settings, once it has recovered.
    pub async fn serving(&self) -> Running {
        self.serving_with(&[]).await
    }

    /// [`Self::serving`] with `extra` settings besides.
    pub async fn serving_with(&self, extra: &[(&str, &str)]) -> Running {
        self.recovered(self.agent(4, extra)).await
    }

    /// A new `Pending` attempt ([`Self::pending_attempt`]) and its name.
    pub async fn pending_named(&self) -> (RunnerAttempt, String) {
        let a = self
            .pending_attempt()
            .await
            .unwrap_or_else(|e| panic!("a pending attempt: {e}"));
        let n = name(&a);
        (a, n)
    }

    /// [`Self::serving`], then one attempt of it ([`Self::pending_named`]).
    pub async fn serving_one(&self) -> (Running, RunnerAttempt, String) {
        let agent = self.serving().await;
        let (a, n) = self.pending_named().await;
        (agent, a, n)
    }

    /// [`Self::serving_one`], its runner started and brought online ([`Self::started_to_idle`]):
    /// the agent, the attempt, its name and the attempt once `Idle`.
    pub async fn serving_idle(&self) -> (Running, RunnerAttempt, String, RunnerAttempt) {
        let (agent, a, n) = self.serving_one().await;
        let idle = self.started_to_idle(&a).await;
        (agent, a, n, idle)
    }

    /// The attempt `a` once its runner started, brought online ([`Self::bring_to_idle`]): the
    /// attempt once `Idle`.
    pub async fn started_to_idle(&self, a: &RunnerAttempt) -> RunnerAttempt {
        let n = name(a);
        self.wait_state(&n, AttemptState::Starting)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        self.bring_to_idle(a).await
    }

    /// The journal of the attempt `name` as it is now, which must be in `state`.
    pub async fn journal_in(&self, name: &str, state: AttemptState) -> AttemptJournal {
        let now = self
            .attempts()
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let journal = super::attempt::journal_of(&now).clone();
        assert_eq!(journal.state(), state);
        journal
    }

    /// Waits until the attempt `name` has an Event of `reason` (a failed read is tried again).
    pub async fn wait_event(&self, name: &str, reason: &str) {
        let events = Api::<Event>::namespaced(self.kube.clone(), &self.team);
        wait::until(
            STEP,
            &format!("a {reason} event on the attempt"),
            || async {
                let list = events.list(&ListParams::default()).await.ok()?;
                list.items
                    .into_iter()
                    .any(|e| {
                        e.reason.as_deref() == Some(reason)
                            && e.involved_object.name.as_deref() == Some(name)
                    })
                    .then_some(())
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }

    /// The agent's Lease advert, once the Lease exists.
    pub async fn advert(&self) -> Option<AgentAdvert> {
        let lease = Api::<Lease>::namespaced(self.kube.clone(), &self.system)
            .get(&agent_lease_name(&self.on.node.name))
            .await
            .ok()?;
        AgentAdvert::from_annotations(&lease.metadata.annotations.unwrap_or_default()).ok()
    }

    /// Online → `Idle`: the fake lists the runner of `a` online and the test, playing the
    /// operator, writes that fact; the attempt once `Idle`.
    pub async fn bring_to_idle(&self, a: &RunnerAttempt) -> RunnerAttempt {
        let n = name(a);
        self.wait_online(a)
            .await
            .unwrap_or_else(|e| panic!("{n} online: {e}"));
        self.set_github(&n, true, false, 1)
            .await
            .unwrap_or_else(|e| panic!("{n}'s GitHub fact: {e}"));
        self.wait_state(&n, AttemptState::Idle)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The agent just started (`agent`, as [`Self::agent`] and its kin answer), once it has
    /// completed its recovery ([`Self::wait_recovered`]); a failure to start or recover fails
    /// the test.
    pub async fn recovered(&self, agent: Result<Running, String>) -> Running {
        let agent = agent.unwrap_or_else(|e| panic!("starting the agent: {e}"));
        self.wait_recovered()
            .await
            .unwrap_or_else(|e| panic!("the agent's recovery: {e}"));
        agent
    }

    pub async fn wait_recovered(&self) -> Result<AgentAdvert, String> {
        wait::until(STEP, "recoveryComplete on the Lease", || async {
            self.advert().await.filter(|a| a.recovery_complete)
        })
        .await
        .map_err(|e| e.to_string())
    }

    /// Sessions refused because the JIT was already used (a second runner with one JIT), and
    /// JIT mints, from the fake's counters.
    pub async fn second_sessions_and_mints(&self) -> Result<(u64, u64), String> {
        let c = self.fake_counters().await?;
        let refused = c["runner_session"]["409"].as_u64().unwrap_or(0);
        let mints = c["generate_jitconfig"]["201"].as_u64().unwrap_or(0);
        Ok((refused, mints))
    }

    /// Every handoff file (`jit-*.tmp`) under the host root.
    pub fn handoff_files(&self) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let mut stack = vec![self.on.host.clone()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let Ok(t) = e.file_type() else { continue };
                if t.is_dir() {
                    stack.push(e.path());
                } else if e.file_name().to_string_lossy().starts_with("jit-") {
                    found.push(e.path());
                }
            }
        }
        found
    }

    /// What is left under `<hostRoot>/runners`.
    pub fn runtimes(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.on.host.join("runners"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect()
    }

    /// The cgroup v2 directory of this world's runners.
    pub fn cgroup_dir(&self) -> PathBuf {
        self.on.cgroup_dir()
    }
}

impl Drop for AgentWorld {
    fn drop(&mut self) {
        // Whatever a failed test left running in this world's cgroups is killed and removed.
        kill_cgroup_tree(&self.cgroup_dir());
        // The agent's overlays are unmounted by the world's own `Drop`, next.
    }
}
