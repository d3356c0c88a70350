//! The whole product as a cluster runs it, for the end-to-end scenarios (issue 8): the simulated
//! GitHub publishing the stand-in runner package and delivering signed webhooks, one or two
//! operator processes (controllers under leader election, broker and webhook receiver on every
//! replica), and N node agents as processes — each a simulated node with its own Node object
//! (labels, so `nodeSelector` works), agent Pod, bound broker token, host root and cgroup parent.
//!
//! Every process is stopped by pid when the world is dropped (also on a failed assertion), and
//! the output of every process is written to `target/e2e-logs/<test>/` for a failed run.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::policy::ScalePolicy;
use serde_json::{Value, json};

use super::cluster::{client_or_skip, fresh_namespace, install_crds};
use super::github::{APP_ID, SimulatedGitHub, app_keys};
use super::node::{SimNode, unique_node_name};
use super::process::{OperatorAddrs, Running, binary, operator_addrs};
use super::wait;
use crate::fake_github::PackageInfo;
use crate::standin_runner::package::{PackageSpec, build};

/// How long one scenario step may take on this shared 2-core machine.
pub const STEP: Duration = Duration::from_secs(90);

/// The webhook HMAC secret every world configures on both sides (the cluster-wide one).
pub const WEBHOOK_SECRET: &str = "e2e-webhook-secret-0123456789";

/// One simulated node of a world.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// Prefix of the node's (unique) name.
    pub prefix: String,
    pub labels: BTreeMap<String, String>,
    pub capacity: u32,
}

impl NodeOptions {
    pub fn new(prefix: &str, capacity: u32, labels: &[(&str, &str)]) -> Self {
        Self {
            prefix: prefix.to_owned(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            capacity,
        }
    }
}

/// What a world runs.
#[derive(Clone, Debug)]
pub struct ProductOptions {
    pub nodes: Vec<NodeOptions>,
    /// Operator replicas (two for failover).
    pub operators: usize,
    /// Extra operator flags (`--flag`, `value`).
    pub operator_flags: Vec<(String, String)>,
    /// The operator replica the simulated GitHub delivers webhooks to.
    pub webhooks_to: usize,
    /// More tenant namespaces (by prefix), watched by the operators like the team's, each with
    /// the App Secret `github-app`. Operator flag values may name them: `{team}` and `{extraN}`
    /// are replaced with the team's and the N-th extra namespace's names.
    pub extra_namespaces: Vec<String>,
}

impl Default for ProductOptions {
    fn default() -> Self {
        Self {
            nodes: vec![NodeOptions::new("node", 4, &[])],
            operators: 1,
            operator_flags: Vec::new(),
            webhooks_to: 0,
            extra_namespaces: Vec::new(),
        }
    }
}

/// One operator replica.
#[derive(Debug)]
pub struct OperatorProcess {
    pub identity: String,
    pub process: Option<Running>,
    pub broker: String,
    pub webhook: String,
    pub health: String,
}

/// One node agent and its simulated node.
#[derive(Debug)]
pub struct AgentProcess {
    pub node: SimNode,
    pub capacity: u32,
    pub host: PathBuf,
    pub cgroup_parent: String,
    pub process: Option<Running>,
}

impl AgentProcess {
    /// The cgroup v2 directory of this agent's runners.
    pub fn cgroup_dir(&self) -> PathBuf {
        PathBuf::from("/sys/fs/cgroup/unified").join(&self.cgroup_parent)
    }
}

/// Everything a scenario needs.
pub struct Product {
    pub test: String,
    pub kube: Client,
    pub system: String,
    pub team: String,
    /// The namespaces of `ProductOptions::extra_namespaces`, in order.
    pub extra: Vec<String>,
    pub fake: SimulatedGitHub,
    pub package: PackageInfo,
    pub operators: Vec<OperatorProcess>,
    pub agents: Vec<AgentProcess>,
    /// The broker "Service": a TCP pass-through to every live replica's broker, so agents keep
    /// one address across operator restarts and failover, as a Service gives them in a cluster.
    broker_service: ServiceProxy,
    options: ProductOptions,
    /// Environment every operator and agent process gets (e.g. `OTEL_*`).
    env: Vec<(String, String)>,
    logs: PathBuf,
    scratch: tempfile::TempDir,
}

impl std::fmt::Debug for Product {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Product")
            .field("test", &self.test)
            .field("team", &self.team)
            .finish_non_exhaustive()
    }
}

fn fail(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

impl Product {
    /// Start a world; `None` (with the reason printed) without `KUBECONFIG`.
    pub async fn start(test: &str, options: ProductOptions) -> Result<Option<Self>, String> {
        Self::start_with_env(test, options, &[]).await
    }

    /// Like [`start`](Self::start), with `env` in every operator's and agent's environment.
    pub async fn start_with_env(
        test: &str,
        options: ProductOptions,
        env: &[(&str, &str)],
    ) -> Result<Option<Self>, String> {
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
        std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755))
            .map_err(|e| fail("chmod", e))?;
        let listener = binary("standin-runner-listener").map_err(|e| fail("binary", e))?;
        let package_dir = scratch.path().join("package");
        std::fs::create_dir_all(&package_dir).map_err(|e| fail("package dir", e))?;
        let package =
            build(&PackageSpec::small(listener), &package_dir).map_err(|e| fail("package", e))?;
        let fake = SimulatedGitHub::start_with_package(Some(package.clone()))
            .await
            .map_err(|e| fail("fake github", e))?;
        create_secret(
            &kube,
            &system,
            "runner-manager-webhook",
            &[("secret", WEBHOOK_SECRET)],
        )
        .await?;
        let (private, _) = app_keys().map_err(|e| fail("keys", e))?;
        let mut extra = Vec::new();
        for prefix in &options.extra_namespaces {
            extra.push(
                fresh_namespace(&kube, prefix)
                    .await
                    .map_err(|e| fail("ns", e))?,
            );
        }
        for ns in std::iter::once(&team).chain(&extra) {
            create_secret(
                &kube,
                ns,
                "github-app",
                &[("appId", &APP_ID.to_string()), ("privateKey", private)],
            )
            .await?;
        }
        let logs = logs_dir(test);
        let _ = std::fs::remove_dir_all(&logs);
        eprintln!(
            "{test}: team namespace {team}, system namespace {system}, logs in {}",
            logs.display()
        );
        let mut this = Self {
            test: test.to_owned(),
            kube,
            system,
            team,
            extra,
            fake,
            package,
            operators: Vec::new(),
            agents: Vec::new(),
            broker_service: ServiceProxy::start()
                .await
                .map_err(|e| fail("broker service", e))?,
            options: options.clone(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            logs,
            scratch,
        };
        for i in 0..options.operators {
            let op = this.start_operator(&format!("operator-{i}")).await?;
            this.operators.push(op);
        }
        this.update_broker_service();
        // Webhooks go to one replica (a failover test points them at the standby); with none,
        // the caller starts its operator later (a bench that fills the API server first).
        if let Some(last) = options.operators.checked_sub(1) {
            let url = format!(
                "http://{}/webhook",
                this.operators[options.webhooks_to.min(last)].webhook
            );
            this.fake
                .admin(
                    "POST",
                    "webhooks",
                    json!({"url": url, "secret": WEBHOOK_SECRET}),
                )
                .await
                .map_err(|e| fail("webhook", e))?;
        }
        for node in &options.nodes {
            let agent = this.create_agent(node).await?;
            this.agents.push(agent);
        }
        for i in 0..this.agents.len() {
            this.start_agent(i)?;
        }
        Ok(Some(this))
    }

    fn operator_command(&self, identity: &str) -> Result<std::process::Command, String> {
        let mut cmd = std::process::Command::new(
            binary("runner-manager-operator").map_err(|e| fail("binary", e))?,
        );
        let watched = std::iter::once(&self.team)
            .chain(&self.extra)
            .cloned()
            .collect::<Vec<_>>()
            .join(",");
        cmd.args([
            "--namespace",
            &self.system,
            "--broker-addr",
            "127.0.0.1:0",
            "--webhook-addr",
            "127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
            "--github-api-url",
            self.fake.base_url(),
            "--identity",
            identity,
            // The test cluster is shared by every test: this world's operators reconcile only its
            // team namespace.
            "--watch-namespace",
            &watched,
            "--log-format",
            "json",
        ]);
        // Scenario pace unless the world says otherwise: observe GitHub and resync every second.
        // The leader Lease keeps its default duration: a loaded 2-core machine can delay a
        // renewal by seconds, and a leader that misses one stops at once (there is no
        // Deployment here to restart it).
        for (k, v) in [
            ("--observe-interval", "1s"),
            ("--resync-interval", "1s"),
            ("--replacement-backoff", "1s"),
        ] {
            if !self.options.operator_flags.iter().any(|(f, _)| f == k) {
                cmd.args([k, v]);
            }
        }
        for (k, v) in &self.options.operator_flags {
            let mut v = v.replace("{team}", &self.team);
            for (i, ns) in self.extra.iter().enumerate() {
                v = v.replace(&format!("{{extra{i}}}"), ns);
            }
            cmd.args([k, &v]);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        Ok(cmd)
    }

    /// Start an operator replica and wait until it serves.
    pub async fn start_operator(&self, identity: &str) -> Result<OperatorProcess, String> {
        let cmd = self.operator_command(identity)?;
        let process =
            Running::spawn("runner-manager-operator", cmd).map_err(|e| fail("operator", e))?;
        let OperatorAddrs {
            broker,
            health,
            webhook,
        } = operator_addrs(&process, STEP).await?;
        Ok(OperatorProcess {
            identity: identity.to_owned(),
            process: Some(process),
            broker,
            webhook,
            health,
        })
    }

    async fn create_agent(&self, node: &NodeOptions) -> Result<AgentProcess, String> {
        let name = unique_node_name(&node.prefix);
        let dir = self.scratch.path().join(&name);
        let sim = SimNode::create(&self.kube, &self.system, &name, node.labels.clone(), &dir)
            .await
            .map_err(|e| fail("node", e))?;
        let host = dir.join("host");
        std::fs::create_dir_all(&host).map_err(|e| fail("host root", e))?;
        std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| fail("chmod", e))?;
        Ok(AgentProcess {
            node: sim,
            capacity: node.capacity,
            host,
            cgroup_parent: format!(
                "runner-manager-e2e-{}.slice",
                &uuid::Uuid::new_v4().simple().to_string()[..12]
            ),
            process: None,
        })
    }

    /// (Re)start agent `i` with `env` (e.g. `RM_AGENT_FAULT`). The broker is the first live
    /// operator replica's.
    pub fn start_agent_with(&mut self, i: usize, env: &[(&str, &str)]) -> Result<(), String> {
        let broker = format!("https://{}", self.broker_service.addr);
        let a = &self.agents[i];
        let mut cmd = std::process::Command::new(
            binary("runner-manager-node-agent").map_err(|e| fail("binary", e))?,
        );
        let capacity = a.capacity.to_string();
        cmd.args([
            "--node-name",
            &a.node.name,
            "--host-root",
            &a.host.display().to_string(),
            "--slots-root",
            &a.host.join("slots").display().to_string(),
            "--capacity",
            &capacity,
            "--launcher",
            "direct",
            "--cgroup-parent",
            &a.cgroup_parent,
            "--broker-url",
            &broker,
            "--system-namespace",
            &self.system,
            "--broker-token-file",
            &a.node.token_file.display().to_string(),
            "--heartbeat-seconds",
            "1",
            "--supervision-millis",
            "200",
            // /metrics, /healthz and /readyz on a port of the system's choosing (logged as
            // `health`, see `telemetry::agent_health`).
            "--health-addr",
            "127.0.0.1:0",
        ]);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let process =
            Running::spawn("runner-manager-node-agent", cmd).map_err(|e| fail("agent", e))?;
        if let Some(old) = self.agents[i].process.replace(process) {
            self.keep_log(&format!("agent-{i}-previous"), &old);
        }
        Ok(())
    }

    /// Set (`Some`) or remove (`None`) a variable of the environment every process started from
    /// now on gets (e.g. drop a fault before restarting the process it crashed).
    pub fn set_env(&mut self, key: &str, value: Option<&str>) {
        self.env.retain(|(k, _)| k != key);
        if let Some(v) = value {
            self.env.push((key.to_owned(), v.to_owned()));
        }
    }

    /// Restart operator replica `i` (after [`kill_operator`](Self::kill_operator)).
    pub async fn restart_operator(&mut self, i: usize) -> Result<(), String> {
        let identity = self.operators[i].identity.clone();
        let op = self.start_operator(&identity).await?;
        self.operators[i] = op;
        self.update_broker_service();
        Ok(())
    }

    fn update_broker_service(&self) {
        self.broker_service.set_backends(
            self.operators
                .iter()
                .filter(|o| o.process.is_some())
                .map(|o| o.broker.clone())
                .collect(),
        );
    }

    /// Also deliver webhooks to replica `i` (a restarted replica listens on a new port).
    pub async fn hook_to(&self, i: usize) -> Result<(), String> {
        let url = format!("http://{}/webhook", self.operators[i].webhook);
        self.fake
            .admin(
                "POST",
                "webhooks",
                json!({"url": url, "secret": WEBHOOK_SECRET}),
            )
            .await
            .map(|_| ())
            .map_err(|e| fail("webhook", e))
    }

    /// The holder of the operators' leader Lease.
    pub async fn leader(&self) -> Option<String> {
        let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
            self.kube.clone(),
            &self.system,
        )
        .get("runner-manager-operator")
        .await
        .ok()?;
        lease.spec?.holder_identity
    }

    pub fn start_agent(&mut self, i: usize) -> Result<(), String> {
        self.start_agent_with(i, &[])
    }

    /// SIGKILL agent `i` (its runners live on: they are not its children's cgroup).
    pub fn kill_agent(&mut self, i: usize) {
        if let Some(p) = self.agents[i].process.take() {
            self.keep_log(&format!("agent-{i}-killed"), &p);
            drop(p);
        }
    }

    /// SIGKILL operator replica `i`.
    pub fn kill_operator(&mut self, i: usize) {
        if let Some(p) = self.operators[i].process.take() {
            self.keep_log(&format!("operator-{i}-killed"), &p);
            drop(p);
        }
        self.update_broker_service();
    }

    /// Create a ScalePolicy `name` in the team namespace with `spec` merged over the world's
    /// defaults (repository `acme/web`, the App Secret, labels `self-hosted, linux`).
    pub async fn policy(&self, name: &str, spec: Value) -> Result<ScalePolicy, String> {
        self.policy_in(&self.team, name, spec).await
    }

    /// Like [`policy`](Self::policy), in namespace `namespace` (the team's or an extra one).
    pub async fn policy_in(
        &self,
        namespace: &str,
        name: &str,
        spec: Value,
    ) -> Result<ScalePolicy, String> {
        let mut base = json!({
            "github": {"url": "https://github.com/acme/web", "credentialsSecretRef": {"name": "github-app"}},
            "labels": ["self-hosted", "linux"],
            "maxRunners": 4,
            "runner": {"version": "latest"},
            "timeouts": {"registration": "60s", "idle": "10m"},
            "scaling": {"webhook": true, "pollInterval": "10s"}
        });
        merge(&mut base, spec);
        let policy: ScalePolicy = serde_json::from_value(json!({
            "apiVersion": "runner-manager.dev/v1alpha1", "kind": "ScalePolicy",
            "metadata": {"name": name}, "spec": base
        }))
        .map_err(|e| fail("policy", e))?;
        Api::<ScalePolicy>::namespaced(self.kube.clone(), namespace)
            .create(&PostParams::default(), &policy)
            .await
            .map_err(|e| fail("create policy", e))
    }

    pub fn attempts(&self) -> Api<RunnerAttempt> {
        Api::namespaced(self.kube.clone(), &self.team)
    }

    pub fn policies(&self) -> Api<ScalePolicy> {
        Api::namespaced(self.kube.clone(), &self.team)
    }

    /// Queue a job on `acme/web` with `labels` and a stand-in `behaviour`; returns its id.
    pub async fn queue_job(&self, labels: &[&str], behaviour: Value) -> Result<u64, String> {
        let v = self
            .fake
            .admin(
                "POST",
                "jobs",
                json!({"owner": "acme", "repo": "web", "labels": labels, "behaviour": behaviour}),
            )
            .await
            .map_err(|e| fail("queue job", e))?;
        v["job_id"]
            .as_u64()
            .ok_or_else(|| format!("no job id in {v}"))
    }

    /// The fake's view of job `id`.
    pub async fn job(&self, id: u64) -> Result<Value, String> {
        self.fake
            .admin("GET", &format!("jobs/{id}"), Value::Null)
            .await
            .map_err(|e| fail("job", e))
    }

    /// Wait until every job in `ids` is `completed` at the fake.
    pub async fn wait_jobs_completed(&self, ids: &[u64], deadline: Duration) -> Result<(), String> {
        wait::until(deadline, "every job completed", || async {
            for id in ids {
                if self.job(*id).await.ok()?["status"] != "completed" {
                    return None;
                }
            }
            Some(())
        })
        .await
        .map_err(|e| format!("{e}; logs in {}", self.logs.display()))
    }

    /// The GitHub REST calls the operator made so far (every endpoint but the runner protocol and
    /// package downloads, which are the runner's and the agent's), and the raw counters.
    pub async fn operator_github_calls(&self) -> Result<(u64, Value), String> {
        let c = self
            .fake
            .counters()
            .await
            .map_err(|e| fail("counters", e))?;
        let mut total = 0;
        if let Value::Object(m) = &c {
            for (endpoint, outcomes) in m {
                if matches!(
                    endpoint.as_str(),
                    "download_package" | "runner_session" | "runner_poll" | "runner_complete"
                ) {
                    continue;
                }
                total += outcomes
                    .as_object()
                    .map(|o| o.values().filter_map(Value::as_u64).sum::<u64>())
                    .unwrap_or(0);
            }
        }
        Ok((total, c))
    }

    /// Every attempt of the team namespace.
    pub async fn all_attempts(&self) -> Vec<RunnerAttempt> {
        self.attempts()
            .list(&Default::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    }

    /// The directory this world's process logs go to.
    pub fn logs(&self) -> &Path {
        &self.logs
    }

    fn keep_log(&self, name: &str, p: &Running) {
        let _ = std::fs::create_dir_all(&self.logs);
        let _ = std::fs::write(self.logs.join(format!("{name}.log")), p.lines().join("\n"));
    }

    /// Every line every running process has written so far (for "no JIT in any log").
    pub fn all_log_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for o in &self.operators {
            if let Some(p) = &o.process {
                lines.extend(p.lines());
            }
        }
        for a in &self.agents {
            if let Some(p) = &a.process {
                lines.extend(p.lines());
            }
        }
        lines
    }
}

impl Drop for Product {
    fn drop(&mut self) {
        for (i, o) in self.operators.iter().enumerate() {
            if let Some(p) = &o.process {
                self.keep_log(&format!("operator-{i}"), p);
            }
        }
        for (i, a) in self.agents.iter().enumerate() {
            if let Some(p) = &a.process {
                self.keep_log(&format!("agent-{i}"), p);
            }
        }
        // Agents first, so none starts a runner while the runners are being stopped; then every
        // runner of this world's cgroups (they outlive their agent by design).
        for a in &mut self.agents {
            a.process.take();
        }
        for o in &mut self.operators {
            o.process.take();
        }
        for a in &self.agents {
            kill_cgroup_tree(&a.cgroup_dir());
        }
    }
}

/// Kill every process in every cgroup under `dir` and remove the cgroups.
fn kill_cgroup_tree(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            let _ = std::fs::write(e.path().join("cgroup.kill"), "1");
            // The kill is asynchronous: give the kernel a bounded moment to empty the group.
            for _ in 0..50 {
                if std::fs::remove_dir(e.path()).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// `target/e2e-logs/<test>`.
fn logs_dir(test: &str) -> PathBuf {
    let target = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.to_path_buf()))
        .unwrap_or_else(std::env::temp_dir);
    target.join("e2e-logs").join(test)
}

async fn create_secret(
    kube: &Client,
    ns: &str,
    name: &str,
    data: &[(&str, &str)],
) -> Result<(), String> {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(kube.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .map(|_| ())
        .map_err(|e| fail("secret", e))
}

/// JSON merge of `over` into `base` (objects merged key by key, everything else replaced).
fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, o) => *b = o,
    }
}

/// Counts the writes to every attempt of a namespace from a watch (one `ADDED` or `MODIFIED` event
/// per write that changed the object; the API server drops no-op patches), for the "API writes per
/// attempt" figure.
#[derive(Debug)]
pub struct WriteCounter {
    counts: std::sync::Arc<std::sync::Mutex<BTreeMap<String, u64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl WriteCounter {
    /// Start counting now (only attempts created from now on are counted in full).
    pub async fn start(api: Api<RunnerAttempt>) -> Result<Self, String> {
        use futures_util::StreamExt;
        use kube::api::{WatchEvent, WatchParams};
        let counts = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::new()));
        let list = api
            .list(&Default::default())
            .await
            .map_err(|e| fail("list", e))?;
        let mut version = list.metadata.resource_version.unwrap_or_default();
        let sink = counts.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok(stream) = api.watch(&WatchParams::default(), &version).await else {
                    return;
                };
                let mut stream = std::pin::pin!(stream);
                while let Some(Ok(event)) = stream.next().await {
                    let object = match event {
                        WatchEvent::Added(o) | WatchEvent::Modified(o) => o,
                        WatchEvent::Deleted(o) => {
                            version = o.metadata.resource_version.clone().unwrap_or(version);
                            continue;
                        }
                        WatchEvent::Bookmark(b) => {
                            version = b.metadata.resource_version;
                            continue;
                        }
                        WatchEvent::Error(_) => return,
                    };
                    version = object.metadata.resource_version.clone().unwrap_or(version);
                    let name = object.metadata.name.clone().unwrap_or_default();
                    *sink
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .entry(name)
                        .or_insert(0) += 1;
                }
            }
        });
        Ok(Self { counts, task })
    }

    /// Writes seen per attempt name.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Drop for WriteCounter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A TCP pass-through on a fixed loopback port to the first backend that accepts: what a
/// Kubernetes Service does for the broker's clients (TLS is end to end; the broker's certificate
/// covers `127.0.0.1`).
#[derive(Debug)]
struct ServiceProxy {
    addr: std::net::SocketAddr,
    backends: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ServiceProxy {
    async fn start() -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let backends = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let shared = backends.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let candidates = shared
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone();
                tokio::spawn(async move {
                    for backend in candidates {
                        if let Ok(mut server) = tokio::net::TcpStream::connect(&backend).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                            return;
                        }
                    }
                });
            }
        });
        Ok(Self {
            addr,
            backends,
            task,
        })
    }

    fn set_backends(&self, backends: Vec<String>) {
        *self
            .backends
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = backends;
    }
}

impl Drop for ServiceProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
