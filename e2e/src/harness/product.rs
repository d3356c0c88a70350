//! The whole product as a cluster runs it, for the end-to-end scenarios (issue 8): the simulated
//! GitHub publishing the stand-in runner package and delivering signed webhooks, one or two
//! operator processes (controllers under leader election, broker and webhook receiver on every
//! replica), and N node agents as processes — each a simulated node with its own Node object
//! (labels, so `nodeSelector` works), agent Pod, bound broker token, host root and cgroup parent.
//!
//! Every process is stopped by pid when the world is dropped (also on a failed assertion), and
//! the output of every process is written to `target/e2e-logs/<test>/` for a failed run.

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::Api;
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::state::AttemptState;
use serde_json::{Value, json};

use super::attempt::state;
use super::process::{OperatorAddrs, Running, operator_addrs};
use super::wait;
use super::world::{NodeHost, World, WorldBuilder, fail, kill_cgroup_tree, over_world};
use crate::fake_github::PackageInfo;

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

/// The node label that selects a runner pool: one a kubelet cannot set on its own node.
pub const POOL_LABEL: &str = "node-restriction.kubernetes.io/runner-pool";

impl NodeOptions {
    /// A node of runner pool `pool` (its [`POOL_LABEL`]).
    pub fn in_pool(prefix: &str, capacity: u32, pool: &str) -> Self {
        Self::new(prefix, capacity, &[(POOL_LABEL, pool)])
    }

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
    /// Environment every operator and agent process gets (e.g. `OTEL_*`, a fault hook).
    pub env: Vec<(String, String)>,
    /// How often the operators observe GitHub and resync ([`Cadence::Scenario`] unless said).
    pub cadence: Cadence,
}

impl ProductOptions {
    /// The default product with one more tenant namespace (by prefix).
    pub fn extra_namespace(prefix: &str) -> Self {
        Self {
            extra_namespaces: vec![prefix.into()],
            ..Self::default()
        }
    }

    /// The default product with one more operator flag (`--flag`, `value`).
    pub fn operator_flag(flag: &str, value: &str) -> Self {
        Self {
            operator_flags: vec![(flag.into(), value.into())],
            ..Self::default()
        }
    }
}

/// The operators' observation and resync cadence.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Cadence {
    /// Every second: a scenario's waits must see an observation (a runner's GitHub fact, an
    /// orphan, a missed delivery) happen within them.
    #[default]
    Scenario,
    /// The operator's own defaults (`--observe-interval`, `--resync-interval` not passed): what
    /// a bench measures, so that its call and write counts are the product's, not the pace's.
    Product,
}

impl Cadence {
    /// The operator flags that set this cadence (none for the product's defaults).
    pub fn operator_flags(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Self::Scenario => &[("--observe-interval", "1s"), ("--resync-interval", "1s")],
            Self::Product => &[],
        }
    }

    /// For a printout.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Scenario => "scenario cadence (observe and resync every 1 s)",
            Self::Product => {
                "product cadence (the operator's default observe and resync intervals)"
            }
        }
    }
}

impl Default for ProductOptions {
    fn default() -> Self {
        Self {
            nodes: vec![NodeOptions::new("node", 4, &[])],
            operators: 1,
            operator_flags: Vec::new(),
            webhooks_to: 0,
            extra_namespaces: Vec::new(),
            env: Vec::new(),
            cadence: Cadence::default(),
        }
    }
}

/// One operator replica.
#[derive(Debug)]
pub struct OperatorProcess {
    pub identity: String,
    pub process: Option<Running>,
    pub broker: String,
    /// The admission webhook's listener (HTTPS, the broker's certificate).
    pub admission: String,
    pub webhook: String,
    pub health: String,
}

/// One node agent on its simulated node (`node`, `host`, `cgroup_parent` through `Deref`).
#[derive(Debug)]
pub struct AgentProcess {
    pub on: NodeHost,
    pub capacity: u32,
    pub process: Option<Running>,
}

impl std::ops::Deref for AgentProcess {
    type Target = NodeHost;
    fn deref(&self) -> &NodeHost {
        &self.on
    }
}

/// The whole product over a [`World`] (whose fields and helpers it offers through `Deref`).
pub struct Product {
    pub world: World,
    /// The stand-in runner package the simulated GitHub publishes.
    pub package: PackageInfo,
    pub operators: Vec<OperatorProcess>,
    pub agents: Vec<AgentProcess>,
    /// The broker "Service": a TCP pass-through to every live replica's broker, so agents keep
    /// one address across operator restarts and failover, as a Service gives them in a cluster.
    broker_service: ServiceProxy,
    options: ProductOptions,
    /// Environment every operator and agent process gets (e.g. `OTEL_*`).
    env: Vec<(String, String)>,
}

over_world!(Product);

impl Product {
    /// The product with the default options for `test`: `None` (the reason printed) without
    /// `KUBECONFIG`; a failure to start it fails the test.
    pub async fn start(test: &str) -> Option<Product> {
        Self::start_with(test, ProductOptions::default()).await
    }

    /// Like [`Self::start`], with `options`.
    pub async fn start_with(test: &str, options: ProductOptions) -> Option<Product> {
        World::builder(test)
            .product(options)
            .await
            .unwrap_or_else(|e| panic!("{test}: the product did not start: {e}"))
    }
}

impl WorldBuilder {
    /// The whole product over this world: the stand-in runner package published, the App
    /// Secret in every tenant namespace, the webhook Secret, `options.operators` operator
    /// replicas (controllers, broker, webhook receiver) and one agent process per
    /// `options.nodes`. `None` (with the reason printed) without `KUBECONFIG`.
    pub async fn product(self, options: ProductOptions) -> Result<Option<Product>, String> {
        let Some(world) = self
            .package_or_stand_in()
            .app_secret()
            .webhook_secret(WEBHOOK_SECRET)
            .extra_namespaces(&options.extra_namespaces)
            .build()
            .await?
        else {
            return Ok(None);
        };
        let package = world.published_package()?;
        let mut this = Product {
            world,
            package,
            operators: Vec::new(),
            agents: Vec::new(),
            broker_service: ServiceProxy::start()
                .await
                .map_err(|e| fail("broker service", e))?,
            env: options.env.clone(),
            options: options.clone(),
        };
        for i in 0..options.operators {
            let op = this.start_operator(&format!("operator-{i}")).await?;
            this.operators.push(op);
        }
        this.update_broker_service();
        // Webhooks go to one replica (a failover test points them at the standby); with none,
        // the caller starts its operator later (a bench that fills the API server first).
        if let Some(last) = options.operators.checked_sub(1) {
            this.hook_to(options.webhooks_to.min(last)).await?;
        }
        for node in &options.nodes {
            let on = this
                .world
                .add_node(&node.prefix, node.labels.clone())
                .await?;
            this.agents.push(AgentProcess {
                on,
                capacity: node.capacity,
                process: None,
            });
        }
        for i in 0..this.agents.len() {
            this.start_agent(i)?;
        }
        Ok(Some(this))
    }
}

impl Product {
    fn operator_command(&self, identity: &str) -> Result<std::process::Command, String> {
        // The world's cadence (scenario pace: observe GitHub and resync every second), then the
        // world's flags, each replacing one of the same name (`World::operator_command`).
        // The leader Lease keeps its default duration: a loaded 2-core machine can delay a
        // renewal by seconds, and a leader that misses one stops at once (there is no
        // Deployment here to restart it).
        let mut flags = vec![("--identity", identity), ("--replacement-backoff", "1s")];
        flags.extend(self.options.cadence.operator_flags().iter().copied());
        flags.extend(
            self.options
                .operator_flags
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str())),
        );
        let mut cmd = self.world.operator_command(&flags)?;
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
            admission,
            health,
            webhook,
        } = operator_addrs(&process, STEP).await?;
        Ok(OperatorProcess {
            identity: identity.to_owned(),
            process: Some(process),
            broker,
            admission,
            webhook,
            health,
        })
    }

    /// (Re)start agent `i` with `env` (e.g. `RM_AGENT_FAULT`). The broker is the first live
    /// operator replica's.
    pub fn start_agent_with(&mut self, i: usize, env: &[(&str, &str)]) -> Result<(), String> {
        let broker = format!("https://{}", self.broker_service.addr);
        let a = &self.agents[i];
        let mut cmd = self.world.agent_command(
            World::agent_binary()?,
            &a.on,
            a.capacity,
            &broker,
            &[
                ("--heartbeat-seconds", "1"),
                ("--supervision-millis", "200"),
                // /metrics, /healthz and /readyz on a port of the system's choosing (logged as
                // `health`, see `telemetry::agent_health`).
                ("--health-addr", "127.0.0.1:0"),
            ],
        );
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

    /// Queue a job on `acme/web` with `labels` and a stand-in `behaviour`; returns its id.
    pub async fn queue_job(&self, labels: &[&str], behaviour: Value) -> Result<u64, String> {
        self.queue_job_body(
            json!({"owner": "acme", "repo": "web", "labels": labels, "behaviour": behaviour}),
        )
        .await
    }

    /// Like [`queue_job`](Self::queue_job), for a pull request whose head is in `head`
    /// (`OWNER/REPO`: `acme/web` itself, or a fork).
    pub async fn queue_pull_request_job(
        &self,
        labels: &[&str],
        behaviour: Value,
        head: &str,
    ) -> Result<u64, String> {
        self.queue_job_body(json!({
            "owner": "acme", "repo": "web", "labels": labels, "behaviour": behaviour,
            "pull_request": {"head_repository": head},
        }))
        .await
    }

    async fn queue_job_body(&self, body: Value) -> Result<u64, String> {
        self.fake
            .queue_job(body)
            .await
            .map_err(|e| fail("queue job", e))
    }

    /// The fake's view of job `id`.
    pub async fn job(&self, id: u64) -> Result<Value, String> {
        self.fake
            .admin("GET", &format!("jobs/{id}"), Value::Null)
            .await
            .map_err(|e| fail("job", e))
    }

    /// Queue `n` `self-hosted`, `linux` jobs that take `duration_ms` each, one after the other;
    /// returns their ids in that order.
    pub async fn queue_jobs(&self, n: usize, duration_ms: u64) -> Result<Vec<u64>, String> {
        let mut jobs = Vec::with_capacity(n);
        for _ in 0..n {
            jobs.push(self.queue_linux_job(duration_ms).await?);
        }
        Ok(jobs)
    }

    /// A `self-hosted`, `linux` job of `duration_ms` ([`queue_job`](Self::queue_job)).
    pub async fn queue_linux_job(&self, duration_ms: u64) -> Result<u64, String> {
        self.queue_job(
            &["self-hosted", "linux"],
            json!({"duration_ms": duration_ms}),
        )
        .await
    }

    /// Queue a `self-hosted`, `linux` job that takes `duration_ms` and wait until it is
    /// `completed` at the fake (at most `within`); returns its id.
    pub async fn run_job(&self, duration_ms: u64, within: Duration) -> Result<u64, String> {
        let job = self
            .queue_job(
                &["self-hosted", "linux"],
                json!({"duration_ms": duration_ms}),
            )
            .await?;
        self.wait_jobs_completed(&[job], within).await?;
        Ok(job)
    }

    /// The fake's view of job `id` once it is `completed` (waited for up to `deadline`).
    pub async fn completed_job(&self, id: u64, deadline: Duration) -> Result<Value, String> {
        self.wait_jobs_completed(&[id], deadline).await?;
        self.job(id).await
    }

    /// Wait until a delivery about `job` was answered by the operator (whatever it answered):
    /// what a test that needs the delivery behind it (found no policy, say) waits for.
    pub async fn wait_delivery_answered(&self, job: u64) {
        wait::until(STEP, "the job's delivery answered", || async {
            let all = self
                .fake
                .admin("GET", "deliveries", Value::Null)
                .await
                .ok()?;
            all.as_array()?
                .iter()
                .filter(|d| d["job_id"].as_u64() == Some(job))
                .any(|d| d["attempts"].as_array().is_some_and(|a| !a.is_empty()))
                .then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}; logs in {}", self.logs().display()));
    }

    /// Wait until `job` is `completed` at the fake, at most `within`; the panic says what the
    /// job must have waited for (`waited_for`) and where the logs are.
    pub async fn job_completes_within(&self, job: u64, within: Duration, waited_for: &str) {
        self.wait_jobs_completed(&[job], within)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{e}: the job waited for {waited_for}; logs in {}",
                    self.logs().display()
                )
            });
    }

    /// Wait until the team's policy `name` says Ready (panics after [`STEP`], naming the logs).
    pub async fn wait_ready(&self, name: &str) {
        use runner_manager_crds::conditions::{ConditionStatus, find};
        use runner_manager_crds::policy::{PolicyConditionType, ScalePolicy};
        let api = self.policies();
        wait::until(STEP, "the policy Ready", || {
            let api = api.clone();
            async move {
                let sp: ScalePolicy = api.get(name).await.ok()?;
                let ready = find(&sp.status?.conditions, PolicyConditionType::Ready)?.status
                    == ConditionStatus::True;
                ready.then_some(())
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}; logs in {}", self.logs().display()));
    }

    /// Create the team's policy `name` with `spec` and wait until it says Ready.
    pub async fn policy_ready(&self, name: &str, spec: Value) {
        self.policy(name, spec)
            .await
            .unwrap_or_else(|e| panic!("policy {name}: {e}"));
        self.wait_ready(name).await;
    }

    /// Wait until the fake holds no runner registration at all.
    pub async fn wait_no_registrations(&self) -> Result<(), wait::TimedOut> {
        wait::until(STEP, "no registration left at the fake", || async {
            self.fake.runners().await.ok()?.is_empty().then_some(())
        })
        .await
    }

    /// Wait until the team's policy `name` is gone: its finalizer let it go (panics after
    /// [`STEP`], naming the logs).
    pub async fn wait_policy_gone(&self, name: &str) {
        self.wait_gone(&self.policies(), name, &format!("policy {name} gone"))
            .await;
    }

    /// Wait until `api` no longer has the object `name` (a failed read is not an answer);
    /// panics after [`STEP`], saying `what` and naming the logs.
    pub async fn wait_gone<K>(&self, api: &Api<K>, name: &str, what: &str)
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        wait::until(STEP, what, || async {
            api.get_opt(name).await.ok()?.is_none().then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}; logs in {}", self.logs().display()));
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
        .map_err(|e| format!("{e}; logs in {}", self.logs().display()))
    }

    /// The GitHub REST calls the operator made so far (every endpoint but the runner protocol and
    /// package downloads, which are the runner's and the agent's), and the raw counters.
    pub async fn operator_github_calls(&self) -> Result<(u64, Value), String> {
        let c = self.fake_counters().await?;
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

    /// The team's attempts once `check` holds for the whole list (panics after `deadline`,
    /// saying `what` and naming the logs).
    /// Waits (at most `deadline`) until an attempt is in `s`; `what` names the wait. That
    /// attempt.
    pub async fn one_in(&self, s: AttemptState, what: &str, deadline: Duration) -> RunnerAttempt {
        let list = self
            .wait_attempts(what, deadline, |list| list.iter().any(|a| state(a) == s))
            .await;
        list.into_iter()
            .find(|a| state(a) == s)
            .unwrap_or_else(|| panic!("{what}: gone"))
    }

    pub async fn wait_attempts(
        &self,
        what: &str,
        deadline: Duration,
        check: impl Fn(&[RunnerAttempt]) -> bool,
    ) -> Vec<RunnerAttempt> {
        let check = &check;
        wait::until(deadline, what, || async move {
            let list = self.all_attempts().await;
            check(&list).then_some(list)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}; logs in {}", self.logs().display()))
    }

    /// Wait until every attempt of the team is `Cleaned` (panics after [`STEP`], naming the
    /// logs).
    pub async fn wait_every_attempt_cleaned(&self) -> Vec<RunnerAttempt> {
        self.wait_attempts("every attempt Cleaned", STEP, |list| {
            list.iter().all(|a| state(a) == AttemptState::Cleaned)
        })
        .await
    }

    /// Stop every operator replica, keeping its log as `Drop` would.
    pub fn stop_operators(&mut self) {
        for (i, o) in self.operators.iter().enumerate() {
            if let Some(p) = &o.process {
                self.keep_log(&format!("operator-{i}"), p);
            }
        }
        self.operators.clear();
    }

    fn keep_log(&self, name: &str, p: &Running) {
        let _ = std::fs::create_dir_all(self.logs());
        let _ = std::fs::write(
            self.logs().join(format!("{name}.log")),
            p.lines().join("\n"),
        );
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

/// Counts the writes to every attempt of a namespace from a watch (one `ADDED` or `MODIFIED` event
/// per write that changed the object; the API server drops no-op patches), for the "API writes per
/// attempt" figure, each attributed to its writer ([`writer_of`]) and kept in order per attempt.
#[derive(Debug)]
pub struct WriteCounter {
    writes: std::sync::Arc<std::sync::Mutex<BTreeMap<String, Vec<Write>>>>,
    task: tokio::task::JoinHandle<()>,
}

/// Who wrote an attempt, as far as a watcher can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Writer {
    Operator,
    Broker,
    Agent,
}

impl Writer {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Operator => "operator",
            Self::Broker => "broker",
            Self::Agent => "agent",
        }
    }
}

/// One write seen: its writer and what it did (the state it led to, or what it changed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    pub writer: Writer,
    pub what: String,
}

/// The writer of the change `prev → cur`. The journal (`status` less the facts) is the agent's
/// but for one edge each of the broker (`→ JitReceived`) and the operator (a lost node,
/// an expired admission); the creation, metadata (finalizers) and the facts are the operator's.
pub fn writer_of(prev: Option<&RunnerAttempt>, cur: &RunnerAttempt) -> Write {
    use runner_manager_crds::outcome::{OrphanReason, Outcome, RejectReason};
    use runner_manager_crds::state::AttemptState as S;
    let Some(prev) = prev else {
        return Write {
            writer: Writer::Operator,
            what: "create".into(),
        };
    };
    let state = |a: &RunnerAttempt| a.status.as_ref().map(|s| s.journal.state());
    let (from, to) = (state(prev), state(cur));
    if from != to {
        let to = to.unwrap_or_default();
        let outcome = cur.status.as_ref().and_then(|s| s.journal.outcome());
        let writer = match (from.unwrap_or_default(), to) {
            (S::Allocated | S::Prepared, S::JitReceived) => Writer::Broker,
            (_, S::Orphaned) if outcome == Some(Outcome::Orphaned(OrphanReason::NodeLost)) => {
                Writer::Operator
            }
            (S::Pending, S::Cleaned)
                if outcome == Some(Outcome::Rejected(RejectReason::AdmissionTimeout)) =>
            {
                Writer::Operator
            }
            _ => Writer::Agent,
        };
        return Write {
            writer,
            what: format!("{to:?}"),
        };
    }
    let journal = |a: &RunnerAttempt| a.status.as_ref().map(|s| s.journal.clone());
    if journal(prev) != journal(cur) {
        return Write {
            writer: Writer::Agent,
            what: "journal".into(),
        };
    }
    let facts = |a: &RunnerAttempt| a.status.as_ref().map(|s| s.facts.clone());
    let what = if facts(prev) == facts(cur) {
        "metadata"
    } else {
        "facts"
    };
    Write {
        writer: Writer::Operator,
        what: what.into(),
    }
}

impl WriteCounter {
    /// Start counting now (only attempts created from now on are counted in full).
    pub async fn start(api: Api<RunnerAttempt>) -> Result<Self, String> {
        use futures_util::StreamExt;
        use kube::api::{WatchEvent, WatchParams};
        let writes = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::new()));
        let list = api
            .list(&Default::default())
            .await
            .map_err(|e| fail("list", e))?;
        let mut version = list.metadata.resource_version.unwrap_or_default();
        let mut last: BTreeMap<String, RunnerAttempt> = list
            .items
            .into_iter()
            .map(|a| (a.metadata.name.clone().unwrap_or_default(), a))
            .collect();
        let sink = writes.clone();
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
                    let write = writer_of(last.get(&name), &object);
                    last.insert(name.clone(), object);
                    sink.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .entry(name)
                        .or_insert_with(Vec::new)
                        .push(write);
                }
            }
        });
        Ok(Self { writes, task })
    }

    /// Writes seen per attempt name.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.writes()
            .into_iter()
            .map(|(name, w)| (name, w.len() as u64))
            .collect()
    }

    /// Every write seen per attempt name, in order.
    pub fn writes(&self) -> BTreeMap<String, Vec<Write>> {
        self.writes
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
