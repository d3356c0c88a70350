//! A scripted node agent: a test double for the operator's tests, standing in for the real agent
//! until the end-to-end issue runs it. For one simulated node it publishes the agent Lease with
//! the `crds::lease::AgentAdvert` annotations, and takes the agent's edges on the node's attempts
//! with `runner_manager_node_agent::journal::Journal::advance` (a journal without a watched
//! store: it reads before it writes) as `Actor::Agent`: admit (or reject),
//! ask the real broker for the JIT with the node's bound token (the broker takes
//! `Allocated → JitReceived` and registers the runner at the fake GitHub), start with a made-up
//! process identity, register idle, take a job the operator reports, and conclude and clean on a
//! termination request. How far it goes is scripted, and can change while it runs.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use runner_manager_crds::NODE_LABEL;
use runner_manager_crds::attempt::{
    Launcher, ProcessIdentity, RunnerAttempt, StartedIdentity, TerminationReason, Transition,
    WorkspacePlacement, spec_hash,
};
use runner_manager_crds::broker::{JitRequest, jit_path};
use runner_manager_crds::lease::{AgentAdvert, Provider};
use runner_manager_crds::names::{agent_lease_name, ephemeral_runtime_dir};
use runner_manager_crds::outcome::{FailureReason, Outcome, RejectReason};
use runner_manager_crds::state::{Actor, AttemptState};
use runner_manager_node_agent::journal::{self, Decision};

use super::attempt::state;

/// How far the scripted agent takes attempts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Script {
    pub capacity: u32,
    /// Reject every new attempt `NodeFull`.
    pub reject: bool,
    /// Stop at `Starting` (the runner never registers: a registration timeout follows).
    pub never_register: bool,
    /// Publish heartbeats (false: the agent is gone and its Lease goes stale).
    pub heartbeat: bool,
    pub recovery_complete: bool,
    /// Conclude `Failed(JitExpired)` right after the broker's edge (a broken launch).
    pub fail_after_jit: bool,
    /// Conclude a busy runner's job at once (`CompleteJob`), as if its job finished.
    pub finish_busy: bool,
    /// An idle runner takes a job and exits before the operator hears of it: `AssignJob` and
    /// `CompleteJob` in one write, as the real agent journals a runner whose exit it saw before
    /// the job fact.
    pub finish_idle: bool,
    /// Conclude `Failed(PreparationInterrupted)` from `Allocated`, as an agent restarted during
    /// preparation (a DaemonSet rollout) does.
    pub interrupt_preparation: bool,
    /// Package digests advertised as cached (placement prefers such a node).
    pub packages: Vec<String>,
}

impl Default for Script {
    fn default() -> Self {
        Self {
            capacity: 4,
            reject: false,
            never_register: false,
            heartbeat: true,
            recovery_complete: true,
            fail_after_jit: false,
            finish_busy: false,
            finish_idle: false,
            interrupt_preparation: false,
            packages: vec![],
        }
    }
}

/// A running scripted agent; stops when dropped.
pub struct ScriptedAgent {
    pub node: String,
    pub script: Arc<Mutex<Script>>,
    /// Edges written (for the writes-per-attempt measurement).
    pub writes: Arc<Mutex<u64>>,
    /// The broker's HTTP statuses, in order (0: unreachable).
    pub answers: Arc<Mutex<Vec<u16>>>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for ScriptedAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedAgent")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Drop for ScriptedAgent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where the broker is and how to reach it.
#[derive(Clone, Debug)]
pub struct BrokerAccess {
    /// `https://host:port`.
    pub url: String,
    /// The CA the operator published (PEM).
    pub ca_pem: String,
    /// The node's bound token file.
    pub token_file: PathBuf,
}

struct Agent {
    kube: Client,
    system: String,
    /// The namespace whose attempts it watches (a real agent watches all; tests share a cluster).
    namespace: String,
    /// What counted against the node at the last round (the advert's `free`).
    used: u32,
    node: String,
    script: Arc<Mutex<Script>>,
    writes: Arc<Mutex<u64>>,
    broker: BrokerAccess,
    http: reqwest::Client,
    asked: HashSet<String>,
    answers: Arc<Mutex<Vec<u16>>>,
}

impl ScriptedAgent {
    pub fn start(
        kube: Client,
        system: &str,
        namespace: &str,
        node: &str,
        script: Script,
        broker: BrokerAccess,
    ) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .add_root_certificate(
                reqwest::Certificate::from_pem(broker.ca_pem.as_bytes())
                    .map_err(|e| e.to_string())?,
            )
            .build()
            .map_err(|e| e.to_string())?;
        let script = Arc::new(Mutex::new(script));
        let writes = Arc::new(Mutex::new(0));
        let answers = Arc::new(Mutex::new(Vec::new()));
        let mut agent = Agent {
            kube,
            system: system.to_owned(),
            namespace: namespace.to_owned(),
            used: 0,
            node: node.to_owned(),
            script: script.clone(),
            writes: writes.clone(),
            broker,
            http,
            asked: HashSet::new(),
            answers: answers.clone(),
        };
        let task = tokio::spawn(async move {
            loop {
                agent.round().await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Ok(Self {
            node: node.to_owned(),
            script,
            writes,
            answers,
            task,
        })
    }

    pub fn set(&self, change: impl FnOnce(&mut Script)) {
        change(&mut self.script.lock().unwrap_or_else(PoisonError::into_inner));
    }

    pub fn writes(&self) -> u64 {
        *self.writes.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Agent {
    fn script(&self) -> Script {
        self.script
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    async fn round(&mut self) {
        let script = self.script();
        // Heartbeat first, so a slow list never lets the Lease lapse.
        if script.heartbeat {
            let free = script.capacity.saturating_sub(self.used);
            self.heartbeat(&script, free).await;
        }
        let attempts = Api::<RunnerAttempt>::namespaced(self.kube.clone(), &self.namespace)
            .list(&ListParams::default().labels(&format!("{NODE_LABEL}={}", self.node)))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let used = attempts
            .iter()
            .filter(|a| state(a).counts_against_capacity(a.spec.snapshot.execution.mode))
            .count();
        self.used = u32::try_from(used).unwrap_or(u32::MAX);
        for a in attempts {
            self.step(&script, &a).await;
        }
    }

    async fn heartbeat(&self, script: &Script, free: u32) {
        let advert = AgentAdvert {
            capacity: script.capacity,
            free,
            recovery_complete: script.recovery_complete,
            providers: [Provider::Native].into(),
            packages: script.packages.iter().cloned().collect(),
            ..AgentAdvert::default()
        };
        let api = Api::<Lease>::namespaced(self.kube.clone(), &self.system);
        let name = agent_lease_name(&self.node);
        let mut lease = match api.get_opt(&name).await {
            Ok(Some(l)) => l,
            Ok(None) => Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..ObjectMeta::default()
                },
                spec: None,
            },
            Err(_) => return,
        };
        lease.metadata.annotations = Some(advert.to_annotations());
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(format!("scripted-agent-{}", self.node)),
            lease_duration_seconds: Some(10),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..LeaseSpec::default()
        });
        let result = if lease.metadata.resource_version.is_some() {
            api.replace(&name, &PostParams::default(), &lease).await
        } else {
            api.create(&PostParams::default(), &lease).await
        };
        // A failed heartbeat is retried next round, as the real agent does.
        let _ = result;
    }

    fn decide(&self, script: &Script, a: &RunnerAttempt) -> Option<Transition> {
        let s = state(a);
        let terminating = a.spec.termination.as_ref().map(|t| t.reason);
        if let Some(reason) = terminating
            && s.is_live()
        {
            return Some(Transition::Conclude(match (s, reason) {
                (AttemptState::Idle, _) => Outcome::ExitedIdleWithoutWork,
                (_, TerminationReason::RegistrationTimeout) => {
                    Outcome::Failed(FailureReason::TerminatedAfterRegistrationTimeout)
                }
                _ => Outcome::Failed(FailureReason::TerminationRequested),
            }));
        }
        match s {
            AttemptState::Pending if script.reject || terminating.is_some() => Some(
                Transition::Conclude(Outcome::Rejected(RejectReason::NodeFull)),
            ),
            AttemptState::Pending => {
                let id = a.spec.attempt_uuid()?;
                Some(Transition::Admit {
                    placement: WorkspacePlacement::ephemeral(ephemeral_runtime_dir(id)),
                    spec_hash: spec_hash(&a.spec),
                })
            }
            AttemptState::Allocated if script.interrupt_preparation => Some(Transition::Conclude(
                Outcome::Failed(FailureReason::PreparationInterrupted),
            )),
            AttemptState::JitReceived if script.fail_after_jit => Some(Transition::Conclude(
                Outcome::Failed(FailureReason::JitExpired),
            )),
            AttemptState::JitReceived => Some(Transition::Start {
                identity: StartedIdentity::Process(ProcessIdentity {
                    launcher: Launcher::Direct,
                    unit: None,
                    pid: 4242,
                    start_time: 1,
                    cgroup: format!("/runner-manager.slice/{}", a.spec.id),
                }),
            }),
            AttemptState::Starting if !script.never_register => Some(Transition::RegisterIdle),
            AttemptState::Idle
                if a.status.as_ref().is_some_and(|st| {
                    st.facts.job.is_some() || st.facts.github.as_ref().is_some_and(|g| g.busy)
                }) =>
            {
                Some(Transition::AssignJob)
            }
            AttemptState::Busy if script.finish_busy => {
                Some(Transition::Conclude(Outcome::CompletedJob))
            }
            s if s.is_concluded() => Some(Transition::Clean),
            _ => None,
        }
    }

    async fn step(&mut self, script: &Script, a: &RunnerAttempt) {
        let Some(name) = a.metadata.name.clone() else {
            return;
        };
        let ns = a.metadata.namespace.clone().unwrap_or_default();
        if state(a) == AttemptState::Allocated
            && a.spec.termination.is_none()
            && !script.interrupt_preparation
        {
            // As the real agent: nothing of a native preparation is journalled; it asks once per
            // attempt, and the broker takes the `Allocated → JitReceived` edge.
            if self.asked.insert(name.clone()) {
                self.ask_broker(&ns, a).await;
            }
            return;
        }
        let api = Api::<RunnerAttempt>::namespaced(self.kube.clone(), &ns);
        let script = script.clone();
        let written = journal::Journal::default()
            .advance(&api, &name, Actor::Agent, |current| {
                if script.finish_idle
                    && state(current) == AttemptState::Idle
                    && current.spec.termination.is_none()
                {
                    return Decision::TakePath(vec![
                        Transition::AssignJob,
                        Transition::Conclude(Outcome::CompletedJob),
                    ]);
                }
                match self.decide(&script, current) {
                    Some(t) => Decision::Take(t),
                    None => Decision::Nothing,
                }
            })
            .await;
        if let Ok(Some(_)) = written {
            *self.writes.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        }
    }

    async fn ask_broker(&self, ns: &str, a: &RunnerAttempt) {
        let Ok(token) = std::fs::read_to_string(&self.broker.token_file) else {
            return;
        };
        let body = JitRequest {
            attempt_uid: a.metadata.uid.clone().unwrap_or_default(),
            spec_hash: a
                .status
                .as_ref()
                .and_then(|s| s.journal.spec_hash().map(str::to_owned))
                .unwrap_or_default(),
        };
        let url = format!(
            "{}{}",
            self.broker.url,
            jit_path(ns, a.metadata.name.as_deref().unwrap_or_default())
        );
        // The JIT itself is dropped: no runner process runs in these tests.
        let status = match self
            .http
            .post(url)
            .bearer_auth(token.trim())
            .json(&body)
            .send()
            .await
        {
            Ok(r) => r.status().as_u16(),
            Err(_) => 0,
        };
        self.answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(status);
    }
}
