//! The launch pipeline of one attempt (DESIGN §4 rule 1, lifecycle spec §2): each step is
//! journalled by CAS before the next effect. Pending → admission → workspace placed
//! (`Allocated`, with the spec hash) → package materialized → runner.env and account prepared
//! → (the runner's unit started ahead of its JIT, under systemd; the placeholder pod awaited
//! meanwhile) → one JIT request (the broker's CAS takes `Allocated → JitReceived`: nothing of a
//! native preparation needs journalling, so the request is its claim) → handoff file → launcher
//! start (or the handoff offered to the unit started ahead) → `Starting` with the identity and
//! the step timings. Only a start that never had a child is retried.
//!
//! OCI attempts (DESIGN §6 "OCI provider") take the same steps with the provider's pod between
//! the account and the JIT: `Preparing` is journalled (CAS) before the pod is created, the pod's
//! identity with `Prepared` once its container runs; the JIT then goes through the same handoff
//! file to the entry helper in the pod. An attempt never falls back from one provider to the
//! other.
//!
//! Every stage returns a [`LaunchFailure`] when the launch cannot go on; [`settle`] is the one
//! place that turns it into the attempt's closed outcome, logs it and concludes.

use std::collections::BTreeMap;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use tracing::Instrument;

use crate::agent::attempt_ctx::Attempts;
use runner_manager_crds::attempt::{
    AttemptConditionType, AttemptReason, EnvironmentIdentity, LaunchTimings, RunnerAttempt,
    StartedIdentity, Transition, WorkspacePlacement, spec_hash,
};
use runner_manager_crds::broker::JitRequest;
use runner_manager_crds::conditions::ConditionStatus;
use runner_manager_crds::outcome::{FailureReason, Outcome};
use runner_manager_crds::policy::WorkspaceMode;
use runner_manager_crds::state::{Actor, AttemptState};

use crate::account::RunnerAccount;
use crate::agent::admission::{self, Admission};
use crate::agent::attempt_ctx::{StepError, conclude, names, take, take_written, uuid_of};
use crate::agent::conditions;
use crate::agent::events::{self, EventReason};
use crate::agent::fault::{self, Boundary};
use crate::agent::node::Agent;
use crate::agent::placeholder::Refusal;
use crate::agent::rebuild::{journal_of, owner_of};
use crate::broker_client::JitAnswer;
use crate::journal::Decision;
use crate::packages::cache::{PackageError, PackageRefusal};
use crate::packages::{PackageRef, RuntimeKind};
use crate::process::environment::runner_environment;
use crate::providers::cgroup::CgroupLimits;
use crate::providers::oci::PodFailure;
use crate::providers::oci::observe::Ended;
use crate::providers::provider::{
    Preparation, PrepareError, PrepareRequest, StartRefused, StartRequest,
};
use crate::providers::{LaunchSpec, Provider, RunnerRef};
use crate::workspace::ephemeral::{create_ephemeral_runtime, ephemeral_runtime_path};
use crate::workspace::prepare::prepare_slot;
use crate::workspace::slot_path::derive_slot_path;
use crate::workspace::slot_table::{JournalledLease, SlotKey};

/// Why a launch stage ended the launch. Closed in kind; the text (never a secret, never a
/// workflow's name) reaches the warn line. [`LaunchFailure::outcome`] is the one mapping to the
/// attempt's outcome.
#[derive(Debug, thiserror::Error)]
pub enum LaunchFailure {
    #[error("workspace unavailable: {0}")]
    Workspace(String),
    #[error("package not materialized: {0}")]
    Package(String),
    #[error("no free runner account")]
    NoAccount,
    #[error("runtime not prepared: {0:?}")]
    Runtime(std::io::ErrorKind),
    #[error("runner.env refused: {0}")]
    Environment(String),
    #[error("resources refused: {0}")]
    Resources(String),
    #[error(
        "the JIT is lost (the broker's answer was not received whole, or it was issued before)"
    )]
    JitLost,
    #[error("the broker refused the JIT request ({0})")]
    JitRefused(u16),
    #[error("the JIT request was not sent: {0}")]
    JitNotSent(&'static str),
    #[error("the runner did not start")]
    NotStarted,
    #[error("the runner pod: {0}")]
    Pod(PodFailure),
    #[error("the placeholder pod: {0}")]
    Placeholder(crate::agent::placeholder::Refusal),
    #[error("the job gate: {0}")]
    JobGate(String),
    #[error("the dependency cache: {0}")]
    Cache(String),
    #[error("the runner's Docker socket: {0}")]
    Docker(String),
}

impl LaunchFailure {
    /// The attempt's outcome for this failure.
    pub fn outcome(&self) -> Outcome {
        use FailureReason as F;
        Outcome::Failed(match self {
            Self::Workspace(_)
            | Self::NoAccount
            | Self::Runtime(_)
            | Self::Environment(_)
            | Self::JobGate(_)
            | Self::Cache(_)
            | Self::Docker(_) => F::WorkspaceUnavailable,
            Self::Package(_) => F::RunnerPackageUnverified,
            // The kubelet found the node too full: the node's fault, not the policy's (issue 15
            // item 7), so it does not count toward `Degraded`.
            Self::Placeholder(Refusal::OutOfCpu | Refusal::OutOfMemory)
            | Self::Pod(PodFailure::Ended(Ended::OutOfResources)) => F::NodeOutOfResources,
            Self::Resources(_) | Self::NotStarted | Self::Placeholder(_) => F::ProcessStartFailed,
            Self::JitLost => F::JitExpired,
            Self::JitRefused(_) | Self::JitNotSent(_) => F::JitRequestFailed,
            Self::Pod(p) => match p {
                PodFailure::ImageUnavailable => F::ImageUnavailable,
                PodFailure::NotOurs | PodFailure::Duplicate => F::OwnershipMismatch,
                PodFailure::HandoffNotTaken => F::JitHandoffRejected,
                PodFailure::Spec(_)
                | PodFailure::Api(_)
                | PodFailure::NotStarted(_)
                | PodFailure::Ended(_)
                | PodFailure::Pointer(_)
                | PodFailure::StillThere => F::ProcessStartFailed,
            },
        })
    }
}

/// How a launch stage stopped short of `Starting`.
enum Halt {
    /// The launch failed: conclude with the failure's outcome (with the timings of the steps it
    /// ran once a JIT was asked for: a failed launch reports them as a started one does).
    Failed(LaunchFailure, Option<LaunchTimings>),
    /// The journal or the API server: the task retries the step.
    Step(StepError),
    /// Nothing to do: a CAS found the attempt moved on (another writer, a conclusion).
    Quiet,
}

impl From<StepError> for Halt {
    fn from(e: StepError) -> Self {
        Self::Step(e)
    }
}

impl From<LaunchFailure> for Halt {
    fn from(f: LaunchFailure) -> Self {
        Self::Failed(f, None)
    }
}

/// The one place a launch failure becomes the attempt's outcome: said at warn, then concluded
/// (with the step timings, once a JIT was asked for).
async fn settle(
    api: &Attempts,
    ns: &str,
    name: &str,
    staged: Result<(), Halt>,
) -> Result<(), StepError> {
    match staged {
        Ok(()) | Err(Halt::Quiet) => Ok(()),
        Err(Halt::Step(e)) => Err(e),
        Err(Halt::Failed(failure, timings)) => {
            let outcome = failure.outcome();
            tracing::warn!(namespace = %ns, attempt = %name, "{failure}");
            match timings {
                None => conclude(api, name, outcome).await.map(|_| ()),
                Some(t) => conclude_launch(api, ns, name, outcome, &t).await,
            }
        }
    }
}

/// The runner's environment from the snapshot (the agent passes only its own `PATH` through).
pub fn environment(
    snapshot_env: &BTreeMap<String, String>,
    runtime: &Path,
) -> Result<BTreeMap<String, String>, crate::process::environment::EnvironmentRefusal> {
    runner_environment(std::env::var("PATH").ok(), snapshot_env, runtime)
}

/// The span of one attempt's launch on this node: a child of the span the operator's
/// `traceparent` annotation names, so the launch joins the runner's trace. Its fields are the
/// attempt's ids and the node.
fn launch_span(agent: &Agent, a: &RunnerAttempt, what: &'static str) -> tracing::Span {
    let span = tracing::info_span!(
        "launch",
        otel.name = what,
        attempt.uid = a.metadata.uid.as_deref().unwrap_or_default(),
        attempt.namespace = a.metadata.namespace.as_deref().unwrap_or_default(),
        attempt.name = a.metadata.name.as_deref().unwrap_or_default(),
        node = agent.cluster.node.as_str(),
    );
    crate::telemetry::join(
        &span,
        a.metadata
            .annotations
            .as_ref()
            .and_then(|m| m.get(crate::telemetry::TRACEPARENT_ANNOTATION))
            .map(String::as_str),
    );
    span
}

/// Admission and the whole launch of a `Pending` attempt.
pub async fn admit_and_launch(
    agent: &Agent,
    api: &Attempts,
    a: &RunnerAttempt,
) -> Result<(), StepError> {
    launch_steps(agent, api, a)
        .instrument(launch_span(agent, a, "launch"))
        .await
}

async fn launch_steps(agent: &Agent, api: &Attempts, a: &RunnerAttempt) -> Result<(), StepError> {
    let (uid, name, ns) = names(a)?;
    let snapshot = &a.spec.snapshot;
    let usable = admission::usable(snapshot, agent.providers.admits(snapshot))
        && environment(&snapshot.env, Path::new("/nonexistent-runtime")).is_ok();
    let decision = agent.book().admit(&uid, agent.host.capacity, usable);
    agent.cluster.advert_changed.notify_one();
    if let Admission::Reject(reason) = decision {
        tracing::warn!(namespace = %ns, attempt = %name, "rejected ({reason:?})");
        conclude(api, &name, Outcome::Rejected(reason)).await?;
        events::warn(
            agent,
            a,
            EventReason::Rejected,
            format!("the node agent rejected the attempt: {reason:?}"),
        )
        .await;
        return Ok(());
    }
    let admitted = allocate(agent, api, a, &name, &ns)
        .instrument(tracing::info_span!("admit"))
        .await;
    let Some(admitted) = admitted.inspect_err(|_| agent.book().forget(&uid))? else {
        agent.book().forget(&uid);
        return Ok(());
    };
    fault::at(Boundary::AfterAllocated);
    let staged = prepare_and_start(agent, api, a, &uid, &name, &ns, admitted).await;
    settle(api, &ns, &name, staged).await
}

/// `Allocated` → runtime, package, account → (`Preparing` → pod → `Prepared`, OCI) → JIT →
/// start → `Starting`.
async fn prepare_and_start(
    agent: &Agent,
    api: &Attempts,
    a: &RunnerAttempt,
    uid: &str,
    name: &str,
    ns: &str,
    Admitted {
        placement,
        spec_hash: admitted_hash,
    }: Admitted,
) -> Result<(), Halt> {
    let snapshot = &a.spec.snapshot;
    let runtime = PathBuf::from(placement.runtime_path());
    let uuid = uuid_of(a)?;

    // A preparation turn (`--preparation-permits`) until the runtime is prepared; given back
    // on every way out.
    let turn = agent.host.preparation.turn(ns, name).await;
    // The runtime, then the package in it.
    let made = match placement.kind() {
        WorkspaceMode::Ephemeral => create_ephemeral_runtime(&agent.host.root, uuid)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        WorkspaceMode::Persistent => prepare_slot(
            &agent.host.slots_root,
            ns,
            &snapshot.policy_uid,
            placement.slot_number().unwrap_or_default(),
        )
        .map(|_| ())
        .map_err(|e| e.to_string()),
    };
    made.map_err(LaunchFailure::Workspace)?;
    // Waited for only while the attempt wants it (terminated or deleted: the wait stops, a
    // download another launch needs goes on).
    let wanted = || crate::agent::preparation::still_wanted(api, name, uid);
    let materialized = agent
        .host
        .packages
        .materialize_while(
            uid,
            PackageRef {
                sha256: &snapshot.runner.sha256,
                url: &snapshot.runner.url,
            },
            &runtime,
            match placement.kind() {
                WorkspaceMode::Ephemeral => RuntimeKind::Ephemeral,
                WorkspaceMode::Persistent => RuntimeKind::PersistentSlot,
            },
            &wanted,
        )
        .instrument(tracing::info_span!("materialize"))
        .await;
    let package = match materialized {
        Ok(m) => m,
        Err(PackageError::NoLongerWanted) => {
            tracing::info!(namespace = %ns, attempt = %name, "launch stopped waiting for its package: the attempt was terminated or deleted");
            conclude(
                api,
                name,
                Outcome::Failed(FailureReason::TerminationRequested),
            )
            .await?;
            return Err(Halt::Quiet);
        }
        Err(e) => {
            package_refused(agent, api, a, &e).await?;
            return Err(LaunchFailure::Package(e.to_string()).into());
        }
    };
    fault::at(Boundary::AfterMaterialize);
    // Leased now, so the prune keeps it; a failed prune only warns.
    crate::agent::pruning::after_launch(agent, &snapshot.runner.sha256).await;
    let timings = LaunchTimings {
        materialize_ms: package.timings.total_ms(),
        package_downloaded: package.timings.downloaded,
        ..LaunchTimings::default()
    };

    // The account and the runtime's ownership, then `Prepared`.
    let prepared_at = Instant::now();
    let account = {
        let mut pool = agent.accounts();
        match placement.slot_number() {
            Some(n) => pool.assign_for_slot(uid, &format!("{}/s{n}", snapshot.policy_uid)),
            None => pool.assign(uid),
        }
    };
    let account = account.map_err(|_| LaunchFailure::NoAccount)?;
    tracing::info_span!("prepare")
        .in_scope(|| own_runtime(&runtime, account))
        .map_err(|e| LaunchFailure::Runtime(e.kind()))?;
    let provider = agent.providers.of(snapshot.execution.mode);
    drop(turn);
    let environment = match provider.preparation() {
        // Nothing is journalled: the JIT request is the claim that preparation is done, and the
        // broker's CAS takes `Allocated → JitReceived` (one write fewer per attempt, issue 32).
        // A crash from here to that CAS leaves `Allocated`: `PreparationInterrupted`.
        Preparation::None => None,
        Preparation::Journalled => Some(
            prepare_journalled(api, a, name, provider, &runtime, account)
                .await?
                .1,
        ),
    };
    let request = JitRequest {
        attempt_uid: uid.to_owned(),
        spec_hash: admitted_hash,
    };
    request_and_start(
        agent,
        api,
        a,
        &request,
        name,
        ns,
        runtime,
        account,
        timings,
        environment,
        Some(prepared_at),
    )
    .await
}

/// (A journalled preparation: OCI) `Allocated → Preparing` (CAS, before anything exists), what
/// the provider makes (the pod, running its entry helper), then `Preparing → Prepared` with its
/// identity.
async fn prepare_journalled(
    api: &Attempts,
    a: &RunnerAttempt,
    name: &str,
    provider: &dyn Provider,
    runtime: &Path,
    account: RunnerAccount,
) -> Result<(RunnerAttempt, EnvironmentIdentity), Halt> {
    take_written(api, name, AttemptState::Allocated, Transition::BeginPrepare)
        .await?
        .ok_or(Halt::Quiet)?;
    let identity = provider
        .prepare(PrepareRequest {
            attempt: a,
            runtime,
            account,
        })
        .instrument(tracing::info_span!("pod"))
        .await
        .map_err(|e| match e {
            PrepareError::Environment(e) => LaunchFailure::Environment(e),
            PrepareError::Pod(f) => LaunchFailure::Pod(f),
            PrepareError::Nothing => LaunchFailure::NotStarted,
        })?;
    fault::at(Boundary::AfterPodCreated);
    let written = take_written(
        api,
        name,
        AttemptState::Preparing,
        Transition::MarkPrepared {
            environment: Some(identity.clone()),
        },
    )
    .await?
    .ok_or(Halt::Quiet)?;
    fault::at(Boundary::AfterPrepared);
    Ok((written, identity))
}

/// A refused archive (unsafe, or past an extraction cap) is said in the `PackageRefused`
/// condition and an event before the attempt concludes, so `kubectl describe` names the cap and
/// the flag that raises it; other package failures (download, disk) say it in the log only.
async fn package_refused(
    agent: &Agent,
    api: &Attempts,
    a: &RunnerAttempt,
    e: &PackageError,
) -> Result<(), StepError> {
    let reason = match e.refusal() {
        Some(PackageRefusal::CapExceeded) => AttemptReason::PackageCapExceeded,
        Some(PackageRefusal::Unsafe) => AttemptReason::PackageUnsafe,
        None => return Ok(()),
    };
    // The condition is a CAS: decided on the launch's copy, re-read if that is stale by now.
    conditions::set(
        api,
        a,
        AttemptConditionType::PackageRefused,
        ConditionStatus::True,
        reason,
        e.to_string(),
    )
    .await?;
    events::warn(agent, a, EventReason::PackageRefused, e.to_string()).await;
    Ok(())
}

/// What `Admit` journalled: the workspace placement and the admitted spec's hash (the JIT
/// request carries it, and the broker checks it against the journal's).
struct Admitted {
    placement: WorkspacePlacement,
    spec_hash: String,
}

/// `Pending → Allocated`: the placement and the spec hash, journalled before any effect. A
/// persistent placement holds the allocation lock from the slot choice to the table update after
/// the CAS.
async fn allocate(
    agent: &Agent,
    api: &Attempts,
    a: &RunnerAttempt,
    name: &str,
    ns: &str,
) -> Result<Option<Admitted>, StepError> {
    let snapshot = &a.spec.snapshot;
    let uuid = uuid_of(a)?;
    // Only a slot choice needs the lock: the lowest free slot must stay free until the table
    // records it after the CAS. An ephemeral runtime is named by its attempt, so a burst's
    // admissions do not queue behind one another's API writes (50 of them took 8-15 s).
    let _held = match snapshot.workspace {
        WorkspaceMode::Persistent => Some(agent.host.allocation.lock().await),
        WorkspaceMode::Ephemeral => None,
    };
    let (placement, lease) = match snapshot.workspace {
        WorkspaceMode::Ephemeral => (
            WorkspacePlacement::ephemeral(
                ephemeral_runtime_path(&agent.host.root, uuid)
                    .display()
                    .to_string(),
            ),
            None,
        ),
        WorkspaceMode::Persistent => {
            let key = SlotKey {
                namespace: ns.to_owned(),
                policy_uid: snapshot.policy_uid.clone(),
            };
            let chosen = agent.slots().lowest_free(&key, snapshot.max_slots);
            let slot = match chosen {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(namespace = %ns, attempt = %name, "{e}");
                    conclude(
                        api,
                        name,
                        Outcome::Rejected(runner_manager_crds::outcome::RejectReason::NodeFull),
                    )
                    .await?;
                    return Ok(None);
                }
            };
            let path = derive_slot_path(&agent.host.slots_root, ns, &snapshot.policy_uid, slot)
                .map_err(|e| StepError::Local(e.to_string()))?;
            let placement = WorkspacePlacement::slot(slot, path.display().to_string())
                .ok_or_else(|| StepError::Local("slot 0".to_owned()))?;
            (
                placement,
                Some(JournalledLease {
                    key,
                    slot,
                    attempt: name.to_owned(),
                }),
            )
        }
    };
    let hash = spec_hash(&a.spec);
    let admitted = take(
        api,
        name,
        AttemptState::Pending,
        Transition::Admit {
            placement: placement.clone(),
            spec_hash: hash.clone(),
        },
    )
    .await?;
    if !admitted {
        return Ok(None);
    }
    if let Some(lease) = lease {
        let _ = agent.slots().record(lease);
    }
    Ok(Some(Admitted {
        placement,
        spec_hash: hash,
    }))
}

/// Owned by the runner's account, 0700, with its private `tmp` (TMPDIR), and no offer of an
/// earlier runner's left in it for this launch's helper to follow (either provider's helper
/// waits for the pointer in the runtime).
fn own_runtime(runtime: &Path, account: RunnerAccount) -> std::io::Result<()> {
    crate::handoff::clear_stale_offer(runtime);
    let tmp = runtime.join("tmp");
    match std::fs::DirBuilder::new().mode(0o700).create(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    for dir in [&tmp, &runtime.to_path_buf()] {
        if std::fs::symlink_metadata(dir)?.file_type().is_symlink() {
            return Err(std::io::Error::other("a link stands where the runtime is"));
        }
        std::os::unix::fs::lchown(dir, Some(account.uid), Some(account.gid))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// A launch's step timings as its log lines give them: `materialize 1 ms, prepare 2 ms,
/// register 3 ms, spawn 4 ms, downloaded true`.
struct Steps<'a>(&'a LaunchTimings);

impl std::fmt::Display for Steps<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self.0;
        write!(
            f,
            "materialize {} ms, prepare {} ms, register {} ms, spawn {} ms, downloaded {}",
            t.materialize_ms, t.prepare_ms, t.register_ms, t.spawn_ms, t.package_downloaded
        )
    }
}

fn millis(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// A `Prepared` attempt found at start (recovery's `RequestJit`): its runtime and account are
/// on disk (and, OCI, its pod is journalled), so it goes on from the one JIT request.
pub async fn resume_prepared(
    agent: &Agent,
    api: &Attempts,
    a: &RunnerAttempt,
) -> Result<(), StepError> {
    let span = launch_span(agent, a, "launch.resume");
    let (uid, name, ns) = names(a)?;
    let journal = journal_of(a);
    let runtime = journal
        .workspace()
        .map(|w| PathBuf::from(w.runtime_path()))
        .ok_or_else(|| StepError::Local("a prepared attempt without a workspace".into()))?;
    // What a crash interrupted cannot be resumed: the attempt concludes.
    let named = name.as_str();
    let interrupted = move || async move {
        conclude(
            api,
            named,
            Outcome::Failed(FailureReason::PreparationInterrupted),
        )
        .await
    };
    let owner = owner_of(&runtime).filter(|u| agent.accounts().contains(*u));
    let Some(uid_owner) = owner else {
        return interrupted().await;
    };
    agent.accounts().restore(uid_owner, &uid);
    let account = RunnerAccount {
        uid: uid_owner,
        gid: std::fs::symlink_metadata(&runtime)
            .map(|m| std::os::unix::fs::MetadataExt::gid(&m))
            .unwrap_or_default(),
    };
    let provider = agent.providers.of(a.spec.snapshot.execution.mode);
    let environment = journal.environment().cloned();
    if provider.preparation() == Preparation::Journalled {
        // Never another kind: one journalled without what it prepared concludes. And the one
        // JIT is asked only for a prepared runner still there to take it: a pod whose entry
        // helper gave up waiting while the agent was down (or that was deleted) concludes first,
        // and so does one of a kind this agent no longer offers.
        let alive = match &environment {
            Some(e) if agent.providers.offers(provider.mode()) => {
                let identity = StartedIdentity::Environment(e.clone());
                let runner = RunnerRef {
                    namespace: &ns,
                    identity: &identity,
                };
                match provider.look(runner).await {
                    Ok(seen) => seen.alive,
                    Err(e) => {
                        return Err(StepError::Local(format!(
                            "the prepared runner pod could not be inspected: {e}"
                        )));
                    }
                }
            }
            _ => false,
        };
        if !alive {
            return interrupted().await;
        }
    }
    let request = JitRequest {
        attempt_uid: uid.clone(),
        spec_hash: journal.spec_hash().unwrap_or_default().to_owned(),
    };
    let staged = request_and_start(
        agent,
        api,
        a,
        &request,
        &name,
        &ns,
        runtime,
        account,
        LaunchTimings::default(),
        environment,
        None,
    )
    .instrument(span)
    .await;
    settle(api, &ns, &name, staged).await
}

/// Concludes a launch that failed after its JIT request, with the timings of the steps it ran
/// in `status.launch` in the same CAS (steps never reached read 0), and says so at warn: a failed
/// launch reports how long it took as a started one does (parity row 21).
async fn conclude_launch(
    api: &Attempts,
    ns: &str,
    name: &str,
    outcome: Outcome,
    timings: &LaunchTimings,
) -> Result<(), StepError> {
    let written = api
        .journal
        .advance_with_launch(api, name, Actor::Agent, timings, |cur| {
            let state = cur.state();
            if state.is_terminal() {
                return Decision::Nothing;
            }
            crate::agent::edges::conclusion_path(state, outcome)
                .into_iter()
                .next()
                .map_or(Decision::Nothing, Decision::Take)
        })
        .await?;
    if written.is_some() {
        api.metrics.concluded(outcome, true);
    }
    tracing::warn!(
        namespace = %ns, attempt = %name, "launch failed ({}): {outcome:?}", Steps(timings)
    );
    Ok(())
}

/// Prepared (a native attempt: `Allocated`; `current` holds its spec) → one JIT request →
/// handoff → start (the launcher's process, or the handoff taken by the pod's helper) →
/// `Starting`. The broker refuses a request for an attempt no longer in that state.
///
/// `prepared_at`: a fresh launch (not one resumed after a crash), whose `prepare` step began
/// then and ends with the JIT request; its runner's placeholder pod is awaited here, while the
/// runner itself is started ahead of its JIT ([`Provider::prestart`]): the kubelet's admission,
/// the JIT's mint and the unit's start overlap instead of following one another (issue 32).
#[allow(clippy::too_many_arguments)]
async fn request_and_start(
    agent: &Agent,
    api: &Attempts,
    current: &RunnerAttempt,
    request: &JitRequest,
    name: &str,
    ns: &str,
    runtime: PathBuf,
    account: RunnerAccount,
    mut timings: LaunchTimings,
    prepared: Option<EnvironmentIdentity>,
    prepared_at: Option<Instant>,
) -> Result<(), Halt> {
    let snapshot = current.spec.snapshot.clone();
    let uuid = uuid_of(current)?;
    let mut env = environment(&snapshot.env, &runtime)
        .map_err(|e| LaunchFailure::Environment(e.to_string()))?;
    let limits = CgroupLimits::from_resources(snapshot.execution.resources.as_ref())
        .map(|l| l.with_defaults(agent.host.runner_defaults))
        .map_err(|e| LaunchFailure::Resources(e.to_string()))?;
    let failed = |f: LaunchFailure, t: &LaunchTimings| Halt::Failed(f, Some(t.clone()));
    // The provider of the attempt's mode, chosen here once and before the JIT request: a kind
    // this agent does not offer, or a journalled preparation without what it made, fails
    // without a JIT minted and dropped. Never another kind.
    let provider = agent.providers.of(snapshot.execution.mode);
    if !agent.providers.offers(provider.mode())
        || (provider.preparation() == Preparation::Journalled && prepared.is_none())
    {
        return Err(failed(LaunchFailure::NotStarted, &timings));
    }
    // The dependency cache, before the JIT: mounted, its variables in the environment (a tool
    // `runner.env` points elsewhere is left alone).
    let cache = crate::agent::caches::attach(agent, current, account)
        .await
        .map_err(|e| failed(LaunchFailure::Cache(e), &timings))?;
    if let Some(c) = &cache {
        env.extend(c.environment.iter().cloned());
    }
    // The runner's own Docker engine (`spec.docker`), before the JIT: its socket is in the
    // runtime when the listener starts. `DOCKER_HOST` is the agent's, whatever `runner.env` says.
    if let Some((k, v)) = crate::agent::docker::attach(
        agent,
        current,
        &runtime,
        account,
        cache.as_ref().map(|c| c.mount.as_path()),
        &limits,
    )
    .await
    .map_err(|e| failed(LaunchFailure::Docker(e), &timings))?
    {
        env.insert(k, v);
    }
    // The job gate, before the JIT: a runner whose policy refuses fork pull requests never runs
    // without it, and one whose policy keeps caches learns there whether its writes are kept.
    // A hook the policy's `runner.env` named runs after an admission.
    if crate::agent::job_gates::JobGates::wanted(current) {
        let hook = agent
            .host
            .job_gates
            .open(
                agent.gate_services(),
                current,
                (account.uid, account.gid),
                crate::agent::caches::verdicts_for(agent, current),
            )
            .map_err(|e| failed(LaunchFailure::JobGate(e.to_string()), &timings))?;
        if let Some(theirs) = env.insert(
            crate::job_gate::HOOK_VARIABLE.to_owned(),
            hook.display().to_string(),
        ) {
            env.insert(crate::job_gate::NEXT_HOOK_VARIABLE.to_owned(), theirs);
        }
    }
    let spec = LaunchSpec {
        attempt: uuid,
        runtime: &runtime,
        account,
        environment: env,
        limits,
        cache: cache.as_ref().map(|c| c.mount.as_path()),
    };
    let prestart = match prepared_at {
        Some(_) => provider.prestart(&spec),
        None => None,
    };
    let minted = placeholder_and_jit(
        agent,
        current,
        request,
        (ns, name),
        provider,
        prepared_at,
        &timings,
    )
    .await;
    let jit = match minted {
        Ok(jit) => jit,
        Err(halt) => {
            // What was started ahead goes with the launch (cleanup stops it by name again if
            // this fails).
            if let Some(p) = prestart {
                tokio::task::block_in_place(|| p.settled());
                if let Err(e) = provider.abandon(uuid).await {
                    tracing::warn!(namespace = %ns, attempt = %name, "the runner started ahead of its JIT is not proven stopped yet: {e}");
                }
            }
            return Err(halt);
        }
    };
    timings.prepare_ms = jit.prepare_ms;
    timings.register_ms = jit.register_ms;
    fault::at(Boundary::AfterJitBeforeSpawn);

    let spawned = Instant::now();
    let started = provider
        .start(
            StartRequest {
                namespace: ns,
                name,
                spec,
                prepared: prepared.as_ref(),
                prestart,
            },
            jit.config,
        )
        .await;
    timings.spawn_ms = millis(spawned);
    let identity = started.map_err(|f| {
        failed(
            match f {
                StartRefused::NotStarted => LaunchFailure::NotStarted,
                StartRefused::Pod(p) => LaunchFailure::Pod(p),
            },
            &timings,
        )
    })?;
    fault::at(Boundary::AfterSpawnBeforeStarting);
    let start = Transition::Start { identity };
    api.journal
        .advance_with_launch(api, name, Actor::Agent, &timings, |cur| {
            if cur.state() == AttemptState::JitReceived {
                Decision::Take(start.clone())
            } else {
                Decision::Nothing
            }
        })
        .instrument(tracing::info_span!("journal_started"))
        .await
        .map_err(|e| Halt::Step(e.into()))?;
    agent.metrics().launch_started(&timings);
    if is_slow(&timings) {
        tracing::warn!(namespace = %ns, attempt = %name, "started slowly ({})", Steps(&timings));
    } else {
        tracing::info!(namespace = %ns, attempt = %name, "started ({})", Steps(&timings));
    }
    Ok(())
}

/// The JIT of a launch, and how long the steps up to it took.
struct Minted {
    config: secrecy::SecretString,
    prepare_ms: u64,
    register_ms: u64,
}

/// A fresh launch's placeholder pod (a runner that is not a pod has one beside it, standing and
/// admitted by the kubelet before the JIT is asked for; its wait is part of `prepare` and holds
/// no preparation turn), then the one JIT request of this attempt (DESIGN §5): whatever
/// happens, never a second. A failed request concludes with the timings of the steps it ran.
async fn placeholder_and_jit(
    agent: &Agent,
    current: &RunnerAttempt,
    request: &JitRequest,
    (ns, name): (&str, &str),
    provider: &dyn Provider,
    prepared_at: Option<Instant>,
    timings: &LaunchTimings,
) -> Result<Minted, Halt> {
    if prepared_at.is_some() && provider.needs_placeholder() {
        agent
            .placeholder_before_start(current)
            .instrument(tracing::info_span!("placeholder"))
            .await
            .map_err(LaunchFailure::Placeholder)?;
    }
    let prepare_ms = prepared_at.map_or(timings.prepare_ms, millis);
    let asked = Instant::now();
    let answer = agent
        .cluster
        .broker
        .request_jit(ns, name, request)
        .instrument(tracing::info_span!("register"))
        .await;
    let register_ms = millis(asked);
    let failed = |f: LaunchFailure| {
        let ran = LaunchTimings {
            prepare_ms,
            register_ms,
            ..timings.clone()
        };
        Halt::Failed(f, Some(ran))
    };
    match answer {
        JitAnswer::Issued(r) => Ok(Minted {
            config: r.encoded_jit_config,
            prepare_ms,
            register_ms,
        }),
        JitAnswer::AlreadyIssued | JitAnswer::Lost => Err(failed(LaunchFailure::JitLost)),
        JitAnswer::Refused(code) => Err(failed(LaunchFailure::JitRefused(code))),
        JitAnswer::NotSent(why) => Err(failed(LaunchFailure::JitNotSent(why))),
    }
}

/// A launch whose steps took this long in total is reported at warn, not info: the
/// predecessor's `SLOW_LAUNCH`, so a person sees a node that brings runners up slowly without
/// reading every launch line (parity row 20).
pub const SLOW_LAUNCH_MS: u64 = 60_000;

/// Whether a started launch is slow: its steps' total reaches [`SLOW_LAUNCH_MS`].
fn is_slow(t: &LaunchTimings) -> bool {
    t.materialize_ms
        .saturating_add(t.prepare_ms)
        .saturating_add(t.register_ms)
        .saturating_add(t.spawn_ms)
        >= SLOW_LAUNCH_MS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A persistent slot's earlier job can leave a pointer to a handoff it planted, and a taken
    /// marker: a new launch's runtime keeps neither, whichever provider's helper will wait in it.
    #[test]
    fn a_runtime_keeps_no_offer_an_earlier_runner_left() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let runtime = dir.path();
        for stale in [
            crate::handoff::HANDOFF_POINTER,
            crate::handoff::TAKEN_MARKER,
        ] {
            std::fs::write(runtime.join(stale), "jit-planted.tmp").unwrap();
        }
        let meta = std::fs::metadata(runtime).unwrap();
        let account = RunnerAccount {
            uid: meta.uid(),
            gid: meta.gid(),
        };
        own_runtime(runtime, account).unwrap();
        assert!(!runtime.join(crate::handoff::HANDOFF_POINTER).exists());
        assert!(!runtime.join(crate::handoff::TAKEN_MARKER).exists());
        assert!(runtime.join("tmp").is_dir());
    }

    #[test]
    fn a_launch_of_sixty_seconds_or_more_is_slow() {
        let quick = LaunchTimings {
            materialize_ms: 20_000,
            prepare_ms: 19_999,
            register_ms: 10_000,
            spawn_ms: 10_000,
            package_downloaded: true,
        };
        assert!(!is_slow(&quick), "59.999 s is not slow");
        let slow = LaunchTimings {
            prepare_ms: 20_000,
            ..quick.clone()
        };
        assert!(is_slow(&slow), "60 s is slow");
        let huge = LaunchTimings {
            materialize_ms: u64::MAX,
            ..quick
        };
        assert!(is_slow(&huge), "a total past u64 saturates and is slow");
    }
}

#[cfg(test)]
mod scripted_tests {
    use runner_manager_crds::fixtures::AttemptBuilder;
    use runner_manager_crds::policy::ExecutionMode;

    use super::*;
    use crate::agent::scripted;

    /// The launch of `a` on a scripted agent that already holds `held` attempts, against an
    /// API server answering every request with `a`: the requests it sent, and whether anything
    /// was made under the host root's runners.
    async fn launch_against(a: &RunnerAttempt, held: u32) -> (scripted::Recorded, bool) {
        let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let body = serde_json::to_value(a).unwrap_or_default();
        let (kube, seen) = scripted::client(move |_| (200, body.clone()));
        let agent = scripted::agent(kube, root.path());
        for n in 0..held {
            let _ = agent
                .book()
                .admit(&format!("other-{n}"), agent.host.capacity, true);
        }
        let api = agent.cluster.attempts.in_namespace("team");
        let result = admit_and_launch(&agent, &api, a).await;
        assert!(result.is_ok(), "{result:?}");
        let made = crate::workspace::ephemeral::runners_dir(&agent.host.root).exists();
        (seen, made)
    }

    fn pending(mode: ExecutionMode) -> RunnerAttempt {
        AttemptBuilder::new("web-1", "web")
            .namespace("team")
            .uid("u-1")
            .resource_version("7")
            .execution(mode)
            .build()
    }

    /// Against a scripted API server: an attempt this node cannot run (an OCI one on a
    /// native-only agent) and one that would overfill the node are each concluded `Rejected`
    /// from `Pending` by one status write, and nothing is allocated for them: no runtime, no
    /// admission edge, no JIT.
    #[tokio::test]
    async fn a_rejected_attempt_is_one_status_write_and_nothing_on_the_host() {
        for (a, held, reason) in [
            (pending(ExecutionMode::Oci), 0, "SnapshotUnusable"),
            (pending(ExecutionMode::Native), 4, "NodeFull"),
        ] {
            let (seen, made) = launch_against(&a, held).await;
            assert_eq!(
                seen.changes(),
                ["PATCH runnerattempts/web-1/status"],
                "{reason}"
            );
            let body = seen
                .body_of("PATCH runnerattempts/web-1/status")
                .to_string();
            assert!(
                body.contains("Rejected") && body.contains(reason),
                "{reason}: {body}"
            );
            assert!(!body.contains("Allocated"), "{reason}: {body}");
            assert!(!made, "{reason}: nothing allocated on the host");
        }
    }
}
