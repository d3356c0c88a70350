//! The provider seam (DESIGN §12 "Provider seam", issue 30 item 3): how one attempt's runner is
//! prepared, started, found after a crash, looked at, stopped and destroyed, whatever it is.
//! [`Provider`] is object-safe: the agent holds one of each kind in its registry
//! ([`super::registry::Providers`]), keyed on the attempt's execution mode; the launch,
//! supervision, cleanup and admission reach a runner only through `&dyn Provider` and never name
//! a kind. Native runners (a host
//! process, through the direct or systemd [`RunnerLauncher`]: [`NativeProvider`]) and OCI
//! runners (a pod: [`super::oci::OciProvider`]) are the two; an attempt never falls back from
//! one to the other.
//!
//! What differs between kinds is said by the provider, not tested by its callers: whether it
//! makes something before the JIT that outlives a crash ([`Preparation`]), whether its runner
//! needs a placeholder pod beside it, how it hands the JIT over (and whether a failed start may
//! be tried again), and what it finds of a runner handed its JIT before a crash
//! ([`Handover`]). Adding a kind is one module implementing [`Provider`] and a line in each of
//! the registry's `of` and `offers`, beside its `ExecutionMode` and the journal's rule for it
//! (docs/architecture.md, "Adding a provider").

use std::collections::BTreeMap;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

use runner_manager_crds::attempt::{
    AttemptJournal, AttemptSnapshot, EnvironmentIdentity, ProcessIdentity, RunnerAttempt,
    StartedIdentity,
};
use runner_manager_crds::broker::OrderedPod;
use runner_manager_crds::policy::ExecutionMode;
use secrecy::SecretString;

use super::launcher::{
    LaunchSpec, Prestart, PrestartedStart, RunnerLauncher, StartError, StopError, Stopped,
};
use super::oci::{self, OciProvider, PodApi, PodFailure, PodRef, PreparedPod};
use crate::account::RunnerAccount;
use crate::handoff::RestrictiveHandoff;
use crate::process::environment::{EnvironmentRefusal, runner_environment};
use crate::process::{Inspection, identity_file};

/// A boxed future (futures-util's): what makes [`Provider`] object-safe.
pub use futures_util::future::BoxFuture;

/// What supervision reads of one look at a started runner, whichever provider runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub alive: bool,
    /// The exit status, when the provider knows it (the direct launcher's own child; a pod's
    /// terminated container).
    pub exit: Option<ExitStatus>,
}

/// A runner as the journal knows it: its identity, and the namespace of its attempt (a pod's).
#[derive(Clone, Copy, Debug)]
pub struct RunnerRef<'a> {
    pub namespace: &'a str,
    pub identity: &'a StartedIdentity,
}

/// What a provider makes before the JIT exists, beside the workspace (runtime, package,
/// account), which the launch prepares for every kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preparation {
    /// Nothing to journal: the broker takes the attempt `Allocated → JitReceived` (native).
    None,
    /// Something that outlives a crash (OCI: the pod): `Preparing` is journalled before it is
    /// made, and its identity with `Prepared`.
    Journalled,
}

/// What [`Provider::prepare`] needs.
#[derive(Debug)]
pub struct PrepareRequest<'a> {
    pub attempt: &'a RunnerAttempt,
    pub runtime: &'a Path,
    pub account: RunnerAccount,
}

/// What [`Provider::start`] needs.
#[derive(Debug)]
pub struct StartRequest<'a> {
    pub namespace: &'a str,
    /// The attempt's name, for the log lines of a start tried again.
    pub name: &'a str,
    pub spec: LaunchSpec<'a>,
    /// What [`Provider::prepare`] made, as journalled with `Prepared` (a journalled preparation).
    pub prepared: Option<&'a EnvironmentIdentity>,
    /// What [`Provider::prestart`] started for this launch, waiting for the handoff.
    pub prestart: Option<Prestart>,
}

/// Why [`Provider::prepare`] failed. Closed.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("runner.env refused: {0}")]
    Environment(String),
    #[error("{0}")]
    Pod(PodFailure),
    /// This provider prepares nothing (its [`Preparation`] is `None`).
    #[error("nothing to prepare")]
    Nothing,
}

/// Why [`Provider::start`] failed: the JIT was handed over to nothing that runs. Closed.
#[derive(Debug, thiserror::Error)]
pub enum StartRefused {
    #[error("the runner did not start")]
    NotStarted,
    #[error("the runner pod: {0}")]
    Pod(PodFailure),
}

/// Why a look, stop or destruction failed. Closed.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("{0}")]
    Native(NativeFailure),
    #[error("the runner pod: {0}")]
    Pod(PodFailure),
    /// The identity is another kind's (the registry picks by identity, so never in practice).
    #[error("the runner's identity is another provider's")]
    OtherKind,
    /// The attempt has no name or uid to find what was made for it by.
    #[error("the attempt names nothing to find its runner by")]
    Unnamed,
}

impl ProviderError {
    /// Whether the failure is a resource that may not be ours (another generation's pod, or a
    /// duplicate): it waits for its owner's garbage collection or a person, not a retry.
    pub fn ownership_unproven(&self) -> bool {
        matches!(self, Self::Pod(PodFailure::NotOurs | PodFailure::Duplicate))
    }
}

/// What a provider finds of an attempt found at `JitReceived` after the agent's crash: the JIT
/// was handed over, `Starting` was not journalled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Handover {
    /// Nothing took the JIT (no identity reached the host; the pod's helper left no marker).
    NotTaken,
    /// A runner took it: its identity, and whether it runs.
    Runner {
        identity: StartedIdentity,
        alive: bool,
    },
    /// The provider's record cannot be read (a native identity file, or the look at it): the
    /// recovery waits for a person.
    Unreadable,
    /// The look failed for now: tried again.
    Unknown(String),
}

/// One kind of runner, object-safe. Each step's failure is the provider's own closed error; the
/// launch turns it into the attempt's outcome in one place.
pub trait Provider: Send + Sync {
    /// The execution mode it runs.
    fn mode(&self) -> ExecutionMode;

    /// Whether its runner needs a placeholder pod beside it (a runner that is not a pod).
    fn needs_placeholder(&self) -> bool;

    /// The kind's own check of an attempt's snapshot before admission (OCI: an image pinned by
    /// digest). Whether the kind is offered at all is the registry's.
    fn admits(&self, snapshot: &AttemptSnapshot) -> bool;

    /// What it makes before the JIT exists.
    fn preparation(&self) -> Preparation;

    /// Makes what [`Preparation::Journalled`] says (for OCI: the pod, running its entry helper),
    /// and returns the identity to journal with `Prepared`.
    fn prepare<'a>(
        &'a self,
        request: PrepareRequest<'a>,
    ) -> BoxFuture<'a, Result<EnvironmentIdentity, PrepareError>>;

    /// Starts what can run before the JIT exists, so that its start overlaps the JIT request
    /// (native under systemd: the runner's unit, its helper waiting for the handoff). Returns at
    /// once, before that start ends; [`Self::start`] finishes it. `None`: the kind starts
    /// nothing ahead, or could not (the start then goes the ordinary way). What it starts is
    /// not journalled: [`Self::abandon`] finds it by the attempt's name.
    fn prestart(&self, _spec: &LaunchSpec<'_>) -> Option<Prestart> {
        None
    }

    /// Stops and proves gone what [`Self::prestart`] may have started for `attempt` when no
    /// runner was journalled for it (its JIT refused, its launch failed, the agent crashed
    /// before `Starting`). Nothing there is success.
    fn abandon<'a>(&'a self, _attempt: uuid::Uuid) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async { Ok(()) })
    }

    /// Hands the JIT over (through a handoff only) and starts the listener; returns the identity
    /// to journal with `Starting`. The JIT is the provider's to drop as soon as it is handed
    /// over. A start that never had a child may be tried again inside
    /// (native); once a runner may have taken the JIT, never. A runner that may live after a
    /// failed start is returned, so supervision proves it.
    fn start<'a>(
        &'a self,
        request: StartRequest<'a>,
        jit: SecretString,
    ) -> BoxFuture<'a, Result<StartedIdentity, StartRefused>>;

    /// What it finds of a runner handed its JIT before the agent's crash (`JitReceived`).
    fn handover<'a>(
        &'a self,
        namespace: &'a str,
        journal: &'a AttemptJournal,
        runtime: Option<&'a Path>,
    ) -> BoxFuture<'a, Handover>;

    /// The runner the journal says was started for this kind (native: its process; OCI: its
    /// pod).
    fn started(&self, journal: &AttemptJournal) -> Option<StartedIdentity>;

    /// The runner the attempt may have left, journalled or not, for its destruction (native:
    /// the journalled process or the identity file; OCI: the journalled pod, or the attempt's
    /// generation when an interrupted preparation journalled none).
    fn leftover(
        &self,
        attempt: &RunnerAttempt,
        journal: &AttemptJournal,
        runtime: Option<&Path>,
    ) -> Option<StartedIdentity>;

    /// Whether its destruction is journalled (`Destroying`, with backoff and the
    /// `CleanupDeferred` condition) before the workspace goes: a pod's deletion is an API call
    /// that may fail for a while; a native runner's stop is proven at once or deferred.
    fn journals_destruction(&self) -> bool;

    /// One look: alive, and how it exited when the provider knows.
    fn look<'a>(&'a self, runner: RunnerRef<'a>) -> BoxFuture<'a, Result<Seen, ProviderError>>;

    /// Stops the runner and proves it gone.
    fn stop<'a>(&'a self, runner: RunnerRef<'a>) -> BoxFuture<'a, Result<Stopped, ProviderError>>;

    /// Removes what the provider made for the runner and proves it gone (native: nothing
    /// beyond the stop, the launcher's cgroup or unit goes with it; OCI: every runner pod of
    /// the identity's generation, also one an interrupted preparation made before it was
    /// journalled).
    fn destroy<'a>(&'a self, runner: RunnerRef<'a>) -> BoxFuture<'a, Result<(), ProviderError>>;
}

/// How many times a native start that never had a child is tried.
const START_TRIES: u32 = 3;
/// The wait before the second try; it doubles before each next one (10 ms, then 20 ms): a
/// spawn refused for want of a resource (a process or descriptor limit, a busy cgroup) gets a
/// moment, and three tries stay well inside the JIT's life.
const START_RETRY_WAIT: std::time::Duration = std::time::Duration::from_millis(10);

/// Native runners: a launcher (owned, or borrowed by the launchers' own tests) behind the seam.
pub struct NativeProvider<L>(pub L);

impl<L> std::fmt::Debug for NativeProvider<L>
where
    L: std::ops::Deref,
    L::Target: RunnerLauncher,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("NativeProvider")
            .field(&self.0.kind())
            .finish()
    }
}

impl<L> NativeProvider<L>
where
    L: std::ops::Deref,
    L::Target: RunnerLauncher,
{
    pub fn launcher(&self) -> &L::Target {
        &self.0
    }
}

impl<L> NativeProvider<L>
where
    L: std::ops::Deref + Send + Sync,
    L::Target: RunnerLauncher,
{
    /// Hands the JIT to the helper [`Provider::prestart`] started.
    fn start_prestarted(
        &self,
        ns: &str,
        name: &str,
        spec: &LaunchSpec<'_>,
        prestart: Prestart,
        jit: &SecretString,
    ) -> Ahead {
        let handoff = match RestrictiveHandoff::create(spec.runtime, spec.account, jit) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(namespace = %ns, attempt = %name, "handoff refused: {e}");
                return Ahead::HandedOver(None);
            }
        };
        let started = tracing::info_span!("spawn").in_scope(|| {
            tokio::task::block_in_place(|| self.0.start_prestarted(spec, prestart, handoff))
        });
        match started {
            Ok(id) => Ahead::HandedOver(Some(id)),
            Err(PrestartedStart::Unseen(handoff)) => {
                drop(handoff);
                tracing::warn!(namespace = %ns, attempt = %name, "the runner started ahead did not take its handoff; starting it again");
                Ahead::Unseen
            }
            Err(PrestartedStart::Failed(e)) => {
                tracing::warn!(namespace = %ns, attempt = %name, "start failed after a child existed ({e}); never retried");
                Ahead::HandedOver(e.live)
            }
        }
    }
}

/// How the hand-over to a runner started ahead of its JIT ended.
enum Ahead {
    /// The JIT went to the runner started ahead (or may have, or no handoff could be made): never
    /// handed over again. The runner's identity when it started, or a child not proven dead,
    /// which is journalled so supervision proves it.
    HandedOver(Option<ProcessIdentity>),
    /// Nothing took the JIT and nothing can: the runner is started the ordinary way with it.
    Unseen,
}

/// Why a native step failed.
#[derive(Debug, thiserror::Error)]
pub enum NativeFailure {
    #[error("{0}")]
    Start(#[from] StartError),
    #[error("{0}")]
    Stop(#[from] StopError),
    #[error("inspection failed: {0}")]
    Inspect(io::ErrorKind),
}

fn process_of(runner: RunnerRef<'_>) -> Result<&ProcessIdentity, ProviderError> {
    match runner.identity {
        StartedIdentity::Process(p) => Ok(p),
        StartedIdentity::Environment(_) => Err(ProviderError::OtherKind),
    }
}

impl<L> Provider for NativeProvider<L>
where
    L: std::ops::Deref + Send + Sync,
    L::Target: RunnerLauncher,
{
    fn mode(&self) -> ExecutionMode {
        ExecutionMode::Native
    }

    fn needs_placeholder(&self) -> bool {
        true
    }

    fn admits(&self, _snapshot: &AttemptSnapshot) -> bool {
        true
    }

    fn preparation(&self) -> Preparation {
        // Nothing of the launcher's exists before the start: the workspace, package and account
        // are the launch's.
        Preparation::None
    }

    fn prepare<'a>(
        &'a self,
        _request: PrepareRequest<'a>,
    ) -> BoxFuture<'a, Result<EnvironmentIdentity, PrepareError>> {
        Box::pin(async { Err(PrepareError::Nothing) })
    }

    fn start<'a>(
        &'a self,
        request: StartRequest<'a>,
        jit: SecretString,
    ) -> BoxFuture<'a, Result<StartedIdentity, StartRefused>> {
        Box::pin(async move {
            let StartRequest {
                namespace: ns,
                name,
                spec,
                prestart,
                ..
            } = request;
            if let Some(prestart) = prestart
                && let Ahead::HandedOver(identity) =
                    self.start_prestarted(ns, name, &spec, prestart, &jit)
            {
                // The JIT leaves memory here.
                drop(jit);
                return identity
                    .map(StartedIdentity::Process)
                    .ok_or(StartRefused::NotStarted);
            }
            let mut identity = None;
            for tried in 0..START_TRIES {
                if tried > 0 {
                    tokio::time::sleep(START_RETRY_WAIT * 2u32.pow(tried - 1)).await;
                }
                let handoff = match RestrictiveHandoff::create(spec.runtime, spec.account, &jit) {
                    Ok(h) => h,
                    Err(e) => {
                        tracing::warn!(namespace = %ns, attempt = %name, "handoff refused: {e}");
                        break;
                    }
                };
                let started = tracing::info_span!("spawn")
                    .in_scope(|| tokio::task::block_in_place(|| self.0.start(&spec, handoff)));
                match started {
                    Ok(id) => {
                        identity = Some(id);
                        break;
                    }
                    Err(e) if e.retryable() => {
                        tracing::warn!(namespace = %ns, attempt = %name, "start failed before a child existed ({e}); retrying");
                    }
                    Err(e) => {
                        tracing::warn!(
                            namespace = %ns, attempt = %name, "start failed after a child existed ({e}); never retried"
                        );
                        // A child that could not be proven dead is journalled so supervision
                        // proves it.
                        identity = e.live;
                        break;
                    }
                }
            }
            // The JIT leaves memory here, whatever happened.
            drop(jit);
            identity
                .map(StartedIdentity::Process)
                .ok_or(StartRefused::NotStarted)
        })
    }

    fn prestart(&self, spec: &LaunchSpec<'_>) -> Option<Prestart> {
        self.0.prestart(spec)
    }

    fn abandon<'a>(&'a self, attempt: uuid::Uuid) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let short = runner_manager_crds::names::short_hex(attempt);
            tokio::task::block_in_place(|| self.0.stop_prestarted(&short))
                .map(|_| ())
                .map_err(|e| ProviderError::Native(NativeFailure::Stop(e)))
        })
    }

    fn handover<'a>(
        &'a self,
        _namespace: &'a str,
        _journal: &'a AttemptJournal,
        runtime: Option<&'a Path>,
    ) -> BoxFuture<'a, Handover> {
        Box::pin(async move {
            // The identity file reaches the host before the spawn returns (the spawn crash gap).
            let identity = match runtime.map(identity_file::read) {
                None | Some(Ok(None)) => return Handover::NotTaken,
                Some(Ok(Some(id))) => id,
                Some(Err(_)) => return Handover::Unreadable,
            };
            match tokio::task::block_in_place(|| self.0.inspect(&identity)) {
                Ok(inspection) => Handover::Runner {
                    alive: inspection.is_alive(),
                    identity: StartedIdentity::Process(identity),
                },
                Err(_) => Handover::Unreadable,
            }
        })
    }

    fn started(&self, journal: &AttemptJournal) -> Option<StartedIdentity> {
        journal.process().cloned().map(StartedIdentity::Process)
    }

    fn leftover(
        &self,
        _attempt: &RunnerAttempt,
        journal: &AttemptJournal,
        runtime: Option<&Path>,
    ) -> Option<StartedIdentity> {
        journal
            .process()
            .cloned()
            .or_else(|| runtime.and_then(|r| identity_file::read(r).ok().flatten()))
            .map(StartedIdentity::Process)
    }

    fn journals_destruction(&self) -> bool {
        false
    }

    fn look<'a>(&'a self, runner: RunnerRef<'a>) -> BoxFuture<'a, Result<Seen, ProviderError>> {
        Box::pin(async move {
            let id = process_of(runner)?;
            let inspection: Inspection = tokio::task::block_in_place(|| self.0.inspect(id))
                .map_err(|e| ProviderError::Native(NativeFailure::Inspect(e.kind())))?;
            let alive = inspection.is_alive();
            Ok(Seen {
                alive,
                exit: if alive { None } else { self.0.exit_status(id) },
            })
        })
    }

    fn stop<'a>(&'a self, runner: RunnerRef<'a>) -> BoxFuture<'a, Result<Stopped, ProviderError>> {
        Box::pin(async move {
            let id = process_of(runner)?;
            tokio::task::block_in_place(|| self.0.stop(id))
                .map_err(|e| ProviderError::Native(NativeFailure::Stop(e)))
        })
    }

    fn destroy<'a>(&'a self, runner: RunnerRef<'a>) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move { self.stop(runner).await.map(|_| ()) })
    }
}

/// The `PATH` of a runner pod's listener: the image's, never the agent's.
const POD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A runner pod's listener environment: as native, with the image's `PATH`.
pub fn pod_environment(
    snapshot_env: &BTreeMap<String, String>,
    runtime: &Path,
) -> Result<BTreeMap<String, String>, EnvironmentRefusal> {
    runner_environment(Some(POD_PATH.to_owned()), snapshot_env, runtime)
}

/// An OCI snapshot names its image by digest: what runs is what was reviewed. Pure.
pub fn oci_admits(snapshot: &AttemptSnapshot) -> bool {
    snapshot
        .execution
        .image
        .as_deref()
        .is_some_and(crate::pods::pinned_by_digest)
}

fn pod_of(runner: RunnerRef<'_>) -> Result<PodRef, ProviderError> {
    match runner.identity {
        StartedIdentity::Environment(e) => Ok(PodRef {
            namespace: runner.namespace.to_owned(),
            identity: e.clone(),
        }),
        StartedIdentity::Process(_) => Err(ProviderError::OtherKind),
    }
}

impl<P: PodApi + 'static> Provider for OciProvider<P> {
    fn mode(&self) -> ExecutionMode {
        ExecutionMode::Oci
    }

    fn needs_placeholder(&self) -> bool {
        // The runner is a pod: the scheduler counts it already.
        false
    }

    fn admits(&self, snapshot: &AttemptSnapshot) -> bool {
        oci_admits(snapshot)
    }

    fn preparation(&self) -> Preparation {
        Preparation::Journalled
    }

    fn prepare<'a>(
        &'a self,
        request: PrepareRequest<'a>,
    ) -> BoxFuture<'a, Result<EnvironmentIdentity, PrepareError>> {
        Box::pin(async move {
            let env = pod_environment(&request.attempt.spec.snapshot.env, request.runtime)
                .map_err(|e| PrepareError::Environment(e.to_string()))?;
            let order = oci::PrepareRequest {
                attempt: request.attempt,
                pod: OrderedPod::Runner {
                    host_runtime: request.runtime.display().to_string(),
                    run_as_user: request.account.uid,
                    run_as_group: request.account.gid,
                    environment: env,
                    await_handoff_seconds: crate::entry::AWAIT_HANDOFF_SECONDS,
                },
                account: request.account,
                runtime: request.runtime,
            };
            let prepared = self.prepare_pod(order).await.map_err(PrepareError::Pod)?;
            Ok(prepared.pod.identity)
        })
    }

    fn start<'a>(
        &'a self,
        request: StartRequest<'a>,
        jit: SecretString,
    ) -> BoxFuture<'a, Result<StartedIdentity, StartRefused>> {
        Box::pin(async move {
            // Never without the prepared pod: the JIT goes to nothing else.
            let Some(identity) = request.prepared else {
                return Err(StartRefused::NotStarted);
            };
            // One try: once offered, the helper may have taken the JIT.
            let handoff =
                RestrictiveHandoff::create(request.spec.runtime, request.spec.account, &jit);
            // In the handoff file, or nowhere: the JIT leaves memory before the wait.
            drop(jit);
            let handoff = match handoff {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!(namespace = %request.namespace, attempt = %request.name, "handoff refused: {e}");
                    return Err(StartRefused::NotStarted);
                }
            };
            let prepared = PreparedPod {
                pod: PodRef {
                    namespace: request.namespace.to_owned(),
                    identity: identity.clone(),
                },
                runtime: request.spec.runtime,
                account: request.spec.account,
            };
            use tracing::Instrument;
            self.start_pod(&prepared, handoff)
                .instrument(tracing::info_span!("spawn"))
                .await
                .map(|pod| StartedIdentity::Environment(pod.identity))
                .map_err(StartRefused::Pod)
        })
    }

    fn handover<'a>(
        &'a self,
        namespace: &'a str,
        journal: &'a AttemptJournal,
        runtime: Option<&'a Path>,
    ) -> BoxFuture<'a, Handover> {
        Box::pin(async move {
            // The helper in the pod took the handoff when its marker is in the runtime.
            let taken = runtime
                .is_some_and(|r| std::fs::symlink_metadata(r.join(oci::TAKEN_MARKER)).is_ok());
            let Some(pod) = journal.environment() else {
                return Handover::NotTaken;
            };
            if !taken {
                return Handover::NotTaken;
            }
            let identity = StartedIdentity::Environment(pod.clone());
            match self
                .look(RunnerRef {
                    namespace,
                    identity: &identity,
                })
                .await
            {
                Ok(seen) => Handover::Runner {
                    alive: seen.alive,
                    identity,
                },
                Err(e) => Handover::Unknown(e.to_string()),
            }
        })
    }

    fn started(&self, journal: &AttemptJournal) -> Option<StartedIdentity> {
        journal
            .environment()
            .cloned()
            .map(StartedIdentity::Environment)
    }

    fn leftover(
        &self,
        attempt: &RunnerAttempt,
        journal: &AttemptJournal,
        _runtime: Option<&Path>,
    ) -> Option<StartedIdentity> {
        // The journalled pod, or (an interrupted preparation journalled none) the attempt's name
        // and generation, which is all `destroy` uses to find every runner pod of that
        // generation.
        let identity = match journal.environment() {
            Some(e) => e.clone(),
            None => EnvironmentIdentity {
                pod_name: crate::pods::pod_name(
                    attempt.metadata.name.as_deref()?,
                    crate::pods::PodRole::Runner,
                ),
                uid: String::new(),
                generation: attempt.metadata.uid.clone()?,
            },
        };
        Some(StartedIdentity::Environment(identity))
    }

    fn journals_destruction(&self) -> bool {
        true
    }

    fn look<'a>(&'a self, runner: RunnerRef<'a>) -> BoxFuture<'a, Result<Seen, ProviderError>> {
        Box::pin(async move {
            let pod = pod_of(runner)?;
            let observation = self.inspect_pod(&pod).await.map_err(ProviderError::Pod)?;
            Ok(Seen {
                alive: observation.is_alive(),
                exit: observation
                    .exit_code()
                    .map(|c| ExitStatus::from_raw((c & 0xff) << 8)),
            })
        })
    }

    fn stop<'a>(&'a self, runner: RunnerRef<'a>) -> BoxFuture<'a, Result<Stopped, ProviderError>> {
        Box::pin(async move {
            let pod = pod_of(runner)?;
            self.stop_pod(&pod).await.map_err(ProviderError::Pod)
        })
    }

    fn destroy<'a>(&'a self, runner: RunnerRef<'a>) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let pod = pod_of(runner)?;
            let attempt =
                crate::pods::attempt_of_pod(&pod.identity.pod_name, crate::pods::PodRole::Runner)
                    .ok_or(ProviderError::Pod(PodFailure::NotOurs))?;
            self.destroy_generation(&pod.namespace, attempt, &pod.identity)
                .await
                .map(|_| ())
                .map_err(ProviderError::Pod)
        })
    }
}

/// Why a termination did not conclude (a provider's stop or look failed). Closed.
#[derive(Debug, thiserror::Error)]
pub enum TerminationError {
    /// The intent could not be made durable: nothing was signalled.
    #[error("the termination intent could not be made durable ({0}); nothing was signalled")]
    IntentNotDurable(io::ErrorKind),
    /// The stop did not end in proven death: no conclusion yet (deferred).
    #[error("the runner could not be proven stopped: {0}")]
    Deferred(StopError),
    #[error("re-inspection failed: {0}")]
    Inspect(io::ErrorKind),
}

impl From<ProviderError> for TerminationError {
    fn from(e: ProviderError) -> Self {
        match e {
            ProviderError::Native(NativeFailure::Stop(e)) => Self::Deferred(e),
            ProviderError::Native(NativeFailure::Inspect(kind)) => Self::Inspect(kind),
            // Never returned by a stop or a look.
            ProviderError::Native(NativeFailure::Start(_)) => {
                Self::Deferred(StopError::StillRunning)
            }
            // The pod is not proven gone (its deletion or the read failed): tried again.
            ProviderError::Pod(_) => Self::Deferred(StopError::StillRunning),
            ProviderError::OtherKind => Self::Deferred(StopError::WrongLauncher),
            ProviderError::Unnamed => Self::Deferred(StopError::StillRunning),
        }
    }
}

#[cfg(test)]
mod prestart_tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::sync::Mutex;

    use runner_manager_crds::attempt::Launcher;

    use super::*;
    use crate::providers::cgroup::CgroupLimits;

    /// A launcher whose start ahead of the JIT ends as the test says, recording which starts
    /// were asked for.
    struct Scripted {
        ahead: fn(RestrictiveHandoff) -> Result<ProcessIdentity, PrestartedStart>,
        calls: Mutex<Vec<&'static str>>,
    }

    fn identity(pid: u32) -> ProcessIdentity {
        ProcessIdentity {
            launcher: Launcher::Systemd,
            unit: Some("rm-0123456789ab.service".into()),
            pid,
            start_time: 1,
            cgroup: "/runnermanager.slice/rm-0123456789ab.service".into(),
        }
    }

    impl RunnerLauncher for Scripted {
        fn kind(&self) -> Launcher {
            Launcher::Systemd
        }
        fn start(
            &self,
            _: &LaunchSpec<'_>,
            _: RestrictiveHandoff,
        ) -> Result<ProcessIdentity, StartError> {
            self.calls.lock().unwrap().push("start");
            Ok(identity(2))
        }
        fn prestart(&self, spec: &LaunchSpec<'_>) -> Option<Prestart> {
            let encoded = SecretString::from("A=1\n".to_owned());
            Some(Prestart {
                unit: "rm-0123456789ab.service".into(),
                environment_file: RestrictiveHandoff::create_environment(
                    spec.runtime,
                    spec.account,
                    &encoded,
                )
                .unwrap(),
                submitted: std::thread::spawn(|| true),
            })
        }
        fn start_prestarted(
            &self,
            _: &LaunchSpec<'_>,
            _: Prestart,
            handoff: RestrictiveHandoff,
        ) -> Result<ProcessIdentity, PrestartedStart> {
            self.calls.lock().unwrap().push("ahead");
            (self.ahead)(handoff)
        }
        fn inspect(&self, _: &ProcessIdentity) -> io::Result<Inspection> {
            unreachable!()
        }
        fn stop(&self, _: &ProcessIdentity) -> Result<Stopped, StopError> {
            unreachable!()
        }
        fn exit_status(&self, _: &ProcessIdentity) -> Option<ExitStatus> {
            None
        }
    }

    /// The native provider's start with a runner started ahead, as the launch makes it: which
    /// starts the launcher was asked for, and what the provider returned.
    async fn start_with(
        ahead: fn(RestrictiveHandoff) -> Result<ProcessIdentity, PrestartedStart>,
    ) -> (Vec<&'static str>, Result<StartedIdentity, StartRefused>) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let meta = std::fs::metadata(dir.path()).unwrap();
        let account = RunnerAccount {
            uid: meta.uid(),
            gid: meta.gid(),
        };
        let provider = NativeProvider(Box::new(Scripted {
            ahead,
            calls: Mutex::new(Vec::new()),
        }));
        let spec = LaunchSpec {
            attempt: uuid::Uuid::new_v4(),
            runtime: dir.path(),
            account,
            environment: BTreeMap::new(),
            limits: CgroupLimits::default(),
            cache: None,
        };
        let prestart = Provider::prestart(&provider, &spec);
        assert!(prestart.is_some());
        let started = provider
            .start(
                StartRequest {
                    namespace: "ns",
                    name: "a",
                    spec,
                    prepared: None,
                    prestart,
                },
                SecretString::from("jit".to_owned()),
            )
            .await;
        let calls = provider.0.calls.lock().unwrap().clone();
        (calls, started)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_runner_started_ahead_that_took_its_jit_is_the_started_one() {
        let (calls, started) = start_with(|_| Ok(identity(1))).await;
        assert_eq!(calls, ["ahead"]);
        assert_eq!(started.unwrap(), StartedIdentity::Process(identity(1)));
    }

    /// Nothing took the JIT: the ordinary start hands the same JIT over.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_jit_the_runner_started_ahead_never_saw_goes_to_an_ordinary_start() {
        let (calls, started) = start_with(|h| Err(PrestartedStart::Unseen(h))).await;
        assert_eq!(calls, ["ahead", "start"]);
        assert_eq!(started.unwrap(), StartedIdentity::Process(identity(2)));
    }

    /// The helper may have taken the JIT: never a second start with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_jit_the_runner_started_ahead_may_have_seen_is_never_handed_over_again() {
        let (calls, started) = start_with(|_| {
            Err(PrestartedStart::Failed(StartError {
                failure: crate::providers::StartFailure::NotReadyInTime,
                child_existed: true,
                live: None,
            }))
        })
        .await;
        assert_eq!(calls, ["ahead"]);
        assert!(matches!(started, Err(StartRefused::NotStarted)));
    }
}
