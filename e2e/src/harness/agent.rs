//! A node agent on the real control plane, for the agent scenario tests: the simulated GitHub
//! publishing the stand-in runner package, the operator binary serving only the broker, one
//! simulated node (Node, agent Pod, bound token), a private host root and cgroup parent, and the
//! agent binary as a process. The test plays the operator's facts and requests.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use runner_manager_crds::attempt::{RunnerAttempt, RunnerAttemptStatus};
use runner_manager_crds::lease::AgentAdvert;
use runner_manager_crds::names::{agent_lease_name, runner_name};
use runner_manager_crds::policy::ScalePolicy;
use runner_manager_crds::state::AttemptState;
use serde_json::{Value, json};

use super::cluster::{client_or_skip, fresh_namespace, install_crds};
use super::fixtures::native_attempt;
use super::github::{APP_ID, ORG, SimulatedGitHub, app_keys};
use super::node::SimNode;
use super::process::{Running, binary, operator_addrs};
use super::wait;
use crate::fake_github::PackageInfo;
use crate::fake_github::scope::Scope;
use crate::standin_runner::package::{PackageSpec, build};

/// How long a scenario step may take on this shared 2-core machine.
pub const STEP: Duration = Duration::from_secs(120);

/// One agent scenario's world.
pub struct AgentWorld {
    pub kube: Client,
    pub system: String,
    pub team: String,
    pub fake: SimulatedGitHub,
    pub package: PackageInfo,
    pub operator: Running,
    pub broker_url: String,
    pub node: SimNode,
    pub host: tempfile::TempDir,
    pub cgroup_parent: String,
    pub policy_uid: String,
    _scratch: tempfile::TempDir,
}

impl std::fmt::Debug for AgentWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentWorld")
            .field("team", &self.team)
            .finish_non_exhaustive()
    }
}

fn fail(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

impl AgentWorld {
    /// `None` (with the reason printed) without `KUBECONFIG`.
    pub async fn start(test: &str) -> Result<Option<Self>, String> {
        let Some(kube) = client_or_skip(test).await.map_err(|e| fail("client", e))? else {
            return Ok(None);
        };
        install_crds(&kube).await.map_err(|e| fail("crds", e))?;
        let system = fresh_namespace(&kube, "rm-sys")
            .await
            .map_err(|e| fail("ns", e))?;
        let team = fresh_namespace(&kube, "rm-team")
            .await
            .map_err(|e| fail("ns", e))?;
        let scratch = tempfile::tempdir().map_err(|e| fail("tempdir", e))?;
        let listener = binary("standin-runner-listener").map_err(|e| fail("binary", e))?;
        let package =
            build(&PackageSpec::small(listener), scratch.path()).map_err(|e| fail("package", e))?;
        let fake = SimulatedGitHub::start_with_package(Some(package.clone()))
            .await
            .map_err(|e| fail("fake github", e))?;
        let policy_uid = team_policy(&kube, &team).await?;
        let node_name = super::node::unique_node_name("agent-node");
        let node = SimNode::create(
            &kube,
            &system,
            &node_name,
            BTreeMap::new(),
            &scratch.path().join("node"),
        )
        .await
        .map_err(|e| fail("node", e))?;
        let (operator, broker_url) = start_operator(&system, fake.base_url()).await?;
        let host = tempfile::tempdir().map_err(|e| fail("tempdir", e))?;
        std::fs::set_permissions(host.path(), std::fs::Permissions::from_mode(0o755))
            .map_err(|e| fail("chmod", e))?;
        Ok(Some(Self {
            kube,
            system,
            team,
            fake,
            package,
            operator,
            broker_url,
            node,
            host,
            cgroup_parent: format!(
                "runner-manager-e2e-{}.slice",
                &uuid::Uuid::new_v4().simple().to_string()[..12]
            ),
            policy_uid,
            _scratch: scratch,
        }))
    }

    pub fn host_root(&self) -> &Path {
        self.host.path()
    }

    /// The agent binary with this world's flags; `extra` env (e.g. `RM_AGENT_FAULT`).
    pub fn agent(&self, capacity: u32, extra: &[(&str, &str)]) -> Result<Running, String> {
        let cmd = std::process::Command::new(
            binary("runner-manager-node-agent").map_err(|e| fail("binary", e))?,
        );
        self.agent_command(cmd, capacity, extra)
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
        mut cmd: std::process::Command,
        capacity: u32,
        extra: &[(&str, &str)],
    ) -> Result<Running, String> {
        let capacity = capacity.to_string();
        cmd.args([
            "--node-name",
            &self.node.name,
            "--host-root",
            &self.host.path().display().to_string(),
            "--slots-root",
            &self.host.path().join("slots").display().to_string(),
            "--capacity",
            &capacity,
            "--launcher",
            "direct",
            "--cgroup-parent",
            &self.cgroup_parent,
            "--runner-uid-range",
            "20001-20064",
            "--runner-gid",
            "20000",
            "--broker-url",
            &self.broker_url,
            "--system-namespace",
            &self.system,
            "--broker-token-file",
            &self.node.token_file.display().to_string(),
            "--heartbeat-seconds",
            "2",
            "--supervision-millis",
            "200",
            "--orphan-sweep-seconds",
            "2",
            // No operator controllers run here: the agent's backstop deadlines are under test.
            "--deadline-grace-seconds",
            "0",
            "--log-format",
            "json",
        ]);
        for (k, v) in extra {
            cmd.env(k, v);
        }
        Running::spawn("runner-manager-node-agent", cmd).map_err(|e| fail("agent", e))
    }

    pub fn attempts(&self) -> Api<RunnerAttempt> {
        Api::namespaced(self.kube.clone(), &self.team)
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
            &self.node.name,
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
        Ok(self
            .fake
            .runners()
            .await
            .map_err(|e| fail("runners", e))?
            .into_iter()
            .filter(|r| r["name"] == name.as_str())
            .collect())
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
        let v = self
            .fake
            .admin(
                "POST",
                "jobs",
                json!({"owner": ORG, "repo": "web", "labels": ["self-hosted", "linux"],
                       "behaviour": behaviour}),
            )
            .await
            .map_err(|e| fail("queue job", e))?;
        v["job_id"]
            .as_u64()
            .ok_or_else(|| format!("no job id in {v}"))
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

    /// The agent's Lease advert, once the Lease exists.
    pub async fn advert(&self) -> Option<AgentAdvert> {
        let lease = Api::<Lease>::namespaced(self.kube.clone(), &self.system)
            .get(&agent_lease_name(&self.node.name))
            .await
            .ok()?;
        AgentAdvert::from_annotations(&lease.metadata.annotations.unwrap_or_default()).ok()
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
        let c = self
            .fake
            .counters()
            .await
            .map_err(|e| fail("counters", e))?;
        let refused = c["runner_session"]["409"].as_u64().unwrap_or(0);
        let mints = c["generate_jitconfig"]["201"].as_u64().unwrap_or(0);
        Ok((refused, mints))
    }

    /// Every handoff file (`jit-*.tmp`) under the host root.
    pub fn handoff_files(&self) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let mut stack = vec![self.host.path().to_path_buf()];
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
        std::fs::read_dir(self.host.path().join("runners"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect()
    }

    /// The cgroup v2 directory of this world's runners.
    pub fn cgroup_dir(&self) -> PathBuf {
        PathBuf::from("/sys/fs/cgroup/unified").join(&self.cgroup_parent)
    }
}

impl Drop for AgentWorld {
    fn drop(&mut self) {
        // Whatever a failed test left running in this world's cgroups is killed and removed.
        let parent = self.cgroup_dir();
        for e in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = std::fs::write(e.path().join("cgroup.kill"), "1");
                for _ in 0..100 {
                    if std::fs::remove_dir(e.path()).is_ok() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        let _ = std::fs::remove_dir(parent);
    }
}

/// The team's policy `web` (the broker reads its credentials) and its App Secret.
async fn team_policy(kube: &Client, team: &str) -> Result<String, String> {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("github-app".into()),
            ..ObjectMeta::default()
        },
        data: Some(
            [
                (
                    "appId".to_owned(),
                    ByteString(APP_ID.to_string().into_bytes()),
                ),
                (
                    "privateKey".to_owned(),
                    ByteString(
                        app_keys()
                            .map_err(|e| fail("keys", e))?
                            .0
                            .clone()
                            .into_bytes(),
                    ),
                ),
            ]
            .into(),
        ),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(kube.clone(), team)
        .create(&PostParams::default(), &secret)
        .await
        .map_err(|e| fail("secret", e))?;
    let policy: ScalePolicy = serde_json::from_value(json!({
        "apiVersion": "runner-manager.dev/v1alpha1", "kind": "ScalePolicy",
        "metadata": {"name": "web"},
        "spec": {"github": {"url": format!("https://github.com/{ORG}/web"), "credentialsSecretRef": {"name": "github-app"}},
                 "labels": ["self-hosted", "linux"], "maxRunners": 4}
    }))
    .map_err(|e| fail("policy", e))?;
    let created = Api::<ScalePolicy>::namespaced(kube.clone(), team)
        .create(&PostParams::default(), &policy)
        .await
        .map_err(|e| fail("policy", e))?;
    created
        .metadata
        .uid
        .ok_or_else(|| "the policy has no uid".to_owned())
}

/// The operator binary serving only the broker (controllers and leader election off).
async fn start_operator(system: &str, github: &str) -> Result<(Running, String), String> {
    let mut cmd = std::process::Command::new(
        binary("runner-manager-operator").map_err(|e| fail("binary", e))?,
    );
    cmd.args([
        "--namespace",
        system,
        "--broker-addr",
        "127.0.0.1:0",
        "--webhook-addr",
        "127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
        "--github-api-url",
        github,
        "--log-format",
        "json",
    ])
    .env("RM_CONTROLLERS", "false")
    .env("RM_LEADER_ELECTION", "false");
    let operator =
        Running::spawn("runner-manager-operator", cmd).map_err(|e| fail("operator", e))?;
    let broker = operator_addrs(&operator, STEP).await?.broker;
    Ok((operator, format!("https://{broker}")))
}
