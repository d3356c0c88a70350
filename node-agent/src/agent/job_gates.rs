//! The node's open job gates ([`crate::job_gate`]): one per live native runner whose policy
//! refuses fork pull requests. Opened before the runner's JIT is asked for (a runner never runs
//! without its gate), opened again for a live runner after an agent restart (until then its
//! hook finds no listener and refuses: closed, never open), closed when the attempt is cleaned.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use kube::Resource;
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::job_admission::{JobAdmissionAnswer, JobAdmissionRequest};
use runner_manager_crds::policy::{ExecutionMode, ForkPullRequests};

use super::labels::{EventReason, publish_warning};
use super::metrics::AgentMetrics;
use crate::broker_client::BrokerClient;
use crate::job_gate::{self, Claim, GateError, GatePaths};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Each update is one insert or remove: a panic elsewhere leaves the map consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a gate's decisions use: the broker that decides, and where a refusal is reported (an
/// Event on the attempt, counted like every agent Event).
pub struct GateServices {
    pub broker: Arc<BrokerClient>,
    pub events: kube::runtime::events::Recorder,
    pub metrics: Arc<AgentMetrics>,
}

impl std::fmt::Debug for GateServices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GateServices").finish_non_exhaustive()
    }
}

/// The open gates, by attempt uid.
#[derive(Debug)]
pub struct JobGates {
    /// The entry helper, in the host's view: the hook runs it as the gate's client.
    helper: PathBuf,
    host_root: PathBuf,
    open: Mutex<BTreeMap<String, tokio::task::AbortHandle>>,
}

impl JobGates {
    pub fn new(helper: PathBuf, host_root: PathBuf) -> Self {
        Self {
            helper,
            host_root,
            open: Mutex::new(BTreeMap::new()),
        }
    }

    /// Whether `a`'s runner has a gate: its policy refuses fork pull requests and it is a host
    /// process (an OCI policy cannot refuse them: the operator's validation says so).
    pub fn wanted(a: &RunnerAttempt) -> bool {
        a.spec.snapshot.fork_pull_requests == ForkPullRequests::Refuse
            && a.spec.snapshot.execution.mode == ExecutionMode::Native
    }

    pub fn is_open(&self, uid: &str) -> bool {
        lock(&self.open).contains_key(uid)
    }

    /// Opens `a`'s gate for the account `uid:gid` (replacing one already open) and returns the
    /// hook the listener's environment must name.
    pub fn open(
        &self,
        services: GateServices,
        a: &RunnerAttempt,
        (uid, gid): (u32, u32),
    ) -> Result<PathBuf, GateError> {
        let GateServices {
            broker,
            events,
            metrics,
        } = services;
        let attempt_uid = a.metadata.uid.clone().unwrap_or_default();
        let id = a.spec.attempt_uuid().ok_or(GateError::NoAttemptId)?;
        let paths = GatePaths::of(&self.host_root, &id);
        let listener = job_gate::prepare(&paths, &self.helper, uid, gid)?;
        let listener = tokio::net::UnixListener::from_std(listener).map_err(GateError::Bind)?;
        let namespace = a.metadata.namespace.clone().unwrap_or_default();
        let name = a.metadata.name.clone().unwrap_or_default();
        let object = a.object_ref(&());
        let asked_for = attempt_uid.clone();
        let task = tokio::spawn(job_gate::serve(listener, move |claim: Claim| {
            let (broker, events, object, metrics) = (
                broker.clone(),
                events.clone(),
                object.clone(),
                metrics.clone(),
            );
            let (namespace, name, attempt_uid) =
                (namespace.clone(), name.clone(), asked_for.clone());
            async move {
                let answer: JobAdmissionAnswer = broker
                    .admit_job(
                        &namespace,
                        &name,
                        &JobAdmissionRequest {
                            attempt_uid,
                            repository: claim.repository.clone(),
                            run_id: claim.run_id,
                        },
                    )
                    .await;
                match answer.refused {
                    None => tracing::info!(
                        namespace = %namespace, attempt = %name,
                        "job gate: run {} admitted", claim.run_id
                    ),
                    Some(why) => {
                        tracing::warn!(
                            namespace = %namespace, attempt = %name, reason = why.as_str(),
                            "job gate: run {} refused", claim.run_id
                        );
                        metrics.event(EventReason::JobRefused.as_str());
                        publish_warning(
                            &events,
                            &object,
                            EventReason::JobRefused,
                            format!(
                                "run {} refused ({}): {}",
                                claim.run_id,
                                why.as_str(),
                                answer.message
                            ),
                        )
                        .await;
                    }
                }
                answer
            }
        }));
        if let Some(old) = lock(&self.open).insert(attempt_uid, task.abort_handle()) {
            old.abort();
        }
        Ok(paths.hook)
    }

    /// Closes `a`'s gate, if open, and removes its directory.
    pub fn close(&self, a: &RunnerAttempt) {
        let uid = a.metadata.uid.clone().unwrap_or_default();
        if let Some(task) = lock(&self.open).remove(&uid) {
            task.abort();
        }
        if let Some(id) = a.spec.attempt_uuid()
            && let Err(e) = job_gate::remove(&GatePaths::of(&self.host_root, &id))
        {
            tracing::warn!(attempt = %uid, "the job gate's directory was not removed: {e}");
        }
    }
}
