//! The node's open job gates ([`crate::job_gate`]): one per live native runner whose policy
//! refuses fork pull requests or keeps dependency caches (the gate's answer carries the cache's
//! verdict: whether the job's writes are kept, recorded beside its cache). Opened before the runner's JIT is asked for (a runner never runs
//! without its gate), opened again for a live runner after an agent restart (until then its
//! hook finds no listener and refuses: closed, never open), closed when the attempt is cleaned.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use kube::Resource;
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::job_admission::{JobAdmissionAnswer, JobAdmissionRequest};
use runner_manager_crds::policy::{ExecutionMode, ForkPullRequests};

use crate::agent::labels::{EventReason, publish_warning};
use crate::agent::metrics::AgentMetrics;
use crate::broker_client::BrokerClient;
use crate::caches::CacheRoot;
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

fn refuses_forks(a: &RunnerAttempt) -> bool {
    a.spec.snapshot.fork_pull_requests == ForkPullRequests::Refuse
}

impl JobGates {
    pub fn new(helper: PathBuf, host_root: PathBuf) -> Self {
        Self {
            helper,
            host_root,
            open: Mutex::new(BTreeMap::new()),
        }
    }

    /// Whether `a`'s runner has a gate: it is a host process (an OCI policy can neither refuse
    /// fork pull requests nor keep caches: the operator's validation says so) and its policy
    /// refuses fork pull requests or keeps caches.
    pub fn wanted(a: &RunnerAttempt) -> bool {
        a.spec.snapshot.execution.mode == ExecutionMode::Native
            && (refuses_forks(a) || a.spec.snapshot.caches.is_some())
    }

    pub fn is_open(&self, uid: &str) -> bool {
        lock(&self.open).contains_key(uid)
    }

    /// Opens `a`'s gate for the account `uid:gid` (replacing one already open) and returns the
    /// hook the listener's environment must name. An admission whose answer keeps the job's
    /// cache writes is recorded in `caches` before the hook hears it.
    pub fn open(
        &self,
        services: GateServices,
        a: &RunnerAttempt,
        (uid, gid): (u32, u32),
        caches: Option<Arc<CacheRoot>>,
    ) -> Result<PathBuf, GateError> {
        let GateServices {
            broker,
            events,
            metrics,
        } = services;
        let attempt_uid = a.metadata.uid.clone().unwrap_or_default();
        let id = a.spec.attempt_uuid().ok_or(GateError::NoAttemptId)?;
        let paths = GatePaths::of(&self.host_root, &id);
        let fails_closed = refuses_forks(a);
        let listener = job_gate::prepare(&paths, &self.helper, (uid, gid), fails_closed)?;
        let short = runner_manager_crds::names::short_hex(id);
        let listener = tokio::net::UnixListener::from_std(listener).map_err(GateError::Bind)?;
        let namespace = a.metadata.namespace.clone().unwrap_or_default();
        let name = a.metadata.name.clone().unwrap_or_default();
        let object = a.object_ref(&());
        let asked_for = attempt_uid.clone();
        let task = tokio::spawn(job_gate::serve(listener, move |claim: Claim| {
            let (broker, events, object, metrics, caches, short) = (
                broker.clone(),
                events.clone(),
                object.clone(),
                metrics.clone(),
                caches.clone(),
                short.clone(),
            );
            let (namespace, name, attempt_uid) =
                (namespace.clone(), name.clone(), asked_for.clone());
            async move {
                let mut answer: JobAdmissionAnswer = broker
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
                if !fails_closed && answer.refused.is_some() {
                    // Only the agent's own failures to get an answer refuse here (the broker
                    // refuses nothing of a policy that allows forks): the job runs, its cache
                    // writes are discarded.
                    answer = JobAdmissionAnswer {
                        refused: None,
                        message: format!(
                            "{}; the job runs, and its cache writes are discarded",
                            answer.message
                        ),
                        write_back: false,
                    };
                }
                if answer.refused.is_none()
                    && answer.write_back
                    && let Some(caches) = &caches
                {
                    let recorded = tokio::task::spawn_blocking({
                        let (caches, short) = (caches.clone(), short.clone());
                        move || caches.keep_writes(&short)
                    })
                    .await;
                    if !matches!(recorded, Ok(Ok(()))) {
                        tracing::warn!(
                            namespace = %namespace, attempt = %name,
                            "the cache's write-back verdict was not recorded: the job's cache writes will be discarded"
                        );
                        answer.write_back = false;
                        answer
                            .message
                            .push_str(" (not recorded on the node: discarded after all)");
                    }
                }
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
