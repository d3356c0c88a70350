//! One policy's reconcile as a pipeline of stages, in stackable's shape (dereference → validate
//! → build → apply → status): [`reconcile`] runs them in order, each a function of its own here
//! with its own error type (`errors::Stage`):
//!
//! | stage | needs a client | what |
//! | --- | --- | --- |
//! | housekeeping | API server | the core's housekeeping plan of the attempts, carried out (`attempts::housekeeping`) |
//! | resolve | API server, GitHub | the Secret, the target, the runner package: the policy's `Resolved` view ([`resolve_stage`]) |
//! | observe | GitHub, API server | the target's runner listing: facts, concluded registrations, orphans ([`observe_stage`]) |
//! | demand | GitHub, API server | a pass of the policy's demand source and its ledger write ([`demand_stage`]) |
//! | plan | none (pure) | `plan::plan`: creations, terminations, status, events ([`plan_stage`]) |
//! | apply | API server, GitHub | the finalizer, creation with placement, terminations, deletions ([`apply_stage`]) |
//! | status | API server | the policy's status, when it changed ([`status_stage`]) |
//!
//! A stage's failures are kept and the next stage runs on what is known, as a level-triggered
//! pass would on its next round, except where the next stage needs what failed: nothing is
//! observed, polled or created without a resolution, and nothing is created when the finalizer
//! could not be added. A policy that is not Ready creates nothing and changes nothing already
//! running. The caller counts the failures by stage and backs the policy off.

use std::collections::HashSet;
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use runner_manager_crds::conditions::ConditionStatus;
use runner_manager_crds::policy::{PolicyConditionType, ScalePolicy, ScalePolicyStatus};
use runner_manager_crds::validate::attempt::Attempt;
use serde_json::Value;
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::attempts::housekeeping;
use super::errors::{
    ApplyError, DemandError, ObserveError, ReconcileError, ResolveError, Stage, StatusError,
    WriteFailed,
};
use super::events::Reason;
use super::placement_worker::{PlacementWorker, node_facts};
use super::plan::{
    Drain, Inputs, Limits, Placed, Plan, PolicyEvent, Readiness, Run, Scaled, Scaling, Termination,
    creation_note, creation_reason, place, scaling_condition, settle,
};
use super::resolve::{Invalid, Resolved, resolve};
use super::snapshot::Pinned;
use super::sources::candidates::Candidates;
use super::sources::{self, Chosen, Pass};
use super::supervisor::{Terminated, observe, terminate};
use super::writes::WriteKind;
use super::{Ctx, PolicyMemory, ResolvedEntry};

/// What one reconcile reads besides the policy's memory.
#[derive(Clone, Copy)]
pub struct Reading<'a> {
    pub policy: &'a Arc<ScalePolicy>,
    /// The policy's attempts, each validated once.
    pub attempts: &'a [Attempt],
    /// Nodes marked unschedulable now.
    pub cordoned: &'a HashSet<String>,
    /// Policies of other namespaces naming the same target.
    pub conflicts: &'a [String],
    /// The job matcher, built on first use (only polling reads it).
    pub candidates: &'a (dyn Fn() -> Arc<Candidates> + Send + Sync),
}

impl std::fmt::Debug for Reading<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reading")
            .field("policy", &self.policy.metadata.name)
            .field("attempts", &self.attempts.len())
            .finish_non_exhaustive()
    }
}

/// The time each stage took (microseconds, by `Stage::ALL`'s order): the round's profile.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageTimes(pub [u64; Stage::ALL.len()]);

impl StageTimes {
    fn add(&mut self, stage: Stage, since: Instant) {
        let us = u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX);
        if let Some(slot) = self.0.get_mut(stage.index()) {
            *slot = slot.saturating_add(us);
        }
    }

    pub fn of(&self, stage: Stage) -> u64 {
        self.0.get(stage.index()).copied().unwrap_or(0)
    }
}

/// What a reconcile did, as its Controller needs it.
#[derive(Debug, Default)]
pub struct Reconciled {
    /// What failed, with the stage it failed in; the rest was carried out.
    pub errors: Vec<ReconcileError>,
    /// More runners were wanted than placement found room for: a change of capacity anywhere
    /// (an attempt ending, an agent's advert, a node) should reconcile this policy again.
    pub wants_capacity: bool,
    /// When a time-based gate the plan waits on opens (the replacement backoff).
    pub wake_at: Option<Timestamp>,
    /// Whether the status was written.
    pub status_written: bool,
    pub took: StageTimes,
}

/// One policy's reconcile: the stages in order (see the module's table).
#[tracing::instrument(name = "reconcile", skip_all, fields(
    policy.namespace = r.policy.metadata.namespace.as_deref().unwrap_or_default(),
    policy.name = r.policy.metadata.name.as_deref().unwrap_or_default(),
))]
pub async fn reconcile(
    ctx: &Ctx,
    placement: &Mutex<PlacementWorker>,
    mem: &mut PolicyMemory,
    r: Reading<'_>,
    now: Timestamp,
) -> Reconciled {
    let mut out = Reconciled::default();
    let deleting = r.policy.metadata.deletion_timestamp.is_some();

    let t = Instant::now();
    let housekept = housekeeping(ctx, r.attempts, now).await;
    out.errors.extend(housekept.into_iter().map(Into::into));
    out.took.add(Stage::Housekeeping, t);

    let t = Instant::now();
    out.errors
        .extend(resolve_stage(ctx, mem, r.policy).await.map(Into::into));
    out.took.add(Stage::Resolve, t);

    // A policy being deleted is drained: nothing is observed or polled for it.
    if !deleting && let Some(resolved) = resolved(mem).cloned() {
        let t = Instant::now();
        let observed = observe_stage(ctx, mem, &r, &resolved).await;
        out.errors.extend(observed.into_iter().map(Into::into));
        out.took.add(Stage::Observe, t);

        let t = Instant::now();
        let demanded = demand_stage(ctx, mem, &r, &resolved, now).await;
        out.errors.extend(demanded.into_iter().map(Into::into));
        out.took.add(Stage::Demand, t);
    }

    let t = Instant::now();
    let plan = plan_stage(ctx, mem, &r, now);
    out.took.add(Stage::Plan, t);

    let t = Instant::now();
    let applied = apply_stage(ctx, placement, mem, &r, plan, now).await;
    out.errors
        .extend(applied.errors.into_iter().map(Into::into));
    out.wants_capacity = applied.wants_capacity;
    out.wake_at = applied.wake_at;
    for name in &applied.created {
        mem.created.insert(name.clone(), Instant::now());
    }
    out.took.add(Stage::Apply, t);

    if let Some(status) = applied.status {
        let t = Instant::now();
        match status_stage(ctx, mem, r.policy, status).await {
            Ok(written) => out.status_written = written,
            Err(e) => out.errors.push(e.into()),
        }
        out.took.add(Stage::Status, t);
    }
    out
}

/// The stored `Ready` condition of this generation, if the status has one: whether it is True.
fn stored_ready(policy: &ScalePolicy, generation: i64) -> Option<bool> {
    let status = policy.status.as_ref()?;
    let ready =
        runner_manager_crds::conditions::find(&status.conditions, PolicyConditionType::Ready)?;
    (ready.observed_generation == Some(generation)).then_some(ready.status == ConditionStatus::True)
}

/// The nodes marked unschedulable (`kubectl cordon`, a drain, a node upgrade).
pub fn cordoned_nodes(ctx: &Ctx) -> HashSet<String> {
    ctx.caches
        .nodes
        .state()
        .iter()
        .filter(|n| n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true))
        .filter_map(|n| n.metadata.name.clone())
        .collect()
}

/// How long a resolution is trusted: a valid one is re-checked every few minutes (a Secret or
/// the latest runner may change), a transient failure retried soon.
fn resolution_fresh(e: &ResolvedEntry, generation: i64) -> bool {
    let ttl = match &e.result {
        Ok(_) => std::time::Duration::from_secs(300),
        Err(i) if i.is_transient() => std::time::Duration::from_secs(10),
        Err(_) => std::time::Duration::from_secs(30),
    };
    e.generation == generation && e.at.elapsed() < ttl
}

/// The resolve stage: dereference and validate the policy (its Secret, target and runner
/// package), once per generation and then at the resolution's TTL; kept in the policy's memory.
/// A policy being deleted is resolved only when this process never did (a new leader meeting a
/// policy already being deleted, as after `helm upgrade` on the real node): its drain
/// deregisters each runner with the policy's client, and without one the runner is stopped and
/// its registration stays on GitHub.
async fn resolve_stage(
    ctx: &Ctx,
    mem: &mut PolicyMemory,
    policy: &ScalePolicy,
) -> Option<ResolveError> {
    let generation = policy.metadata.generation.unwrap_or(0);
    let deleting = policy.metadata.deletion_timestamp.is_some();
    let due = if deleting {
        resolved(mem).is_none()
    } else {
        !mem.resolved
            .as_ref()
            .is_some_and(|e| resolution_fresh(e, generation))
    };
    if !due {
        return None;
    }
    // After a restart or failover the memory is empty: the stored condition says what a
    // person last saw, so a thousand unchanged policies publish no thousand events.
    let was_ok = mem
        .resolved
        .as_ref()
        .map(|e| e.result.is_ok())
        .or_else(|| stored_ready(policy, generation));
    let result = resolve_now(ctx, policy).await;
    if !deleting {
        match (&result, was_ok) {
            (Err(i), Some(true) | None) => {
                ctx.events.publish(
                    &policy.object_ref(&()),
                    Reason::PolicyInvalid,
                    i.message.clone(),
                );
            }
            (Ok(r), Some(false) | None) => {
                ctx.events.publish(
                    &policy.object_ref(&()),
                    Reason::PolicyReady,
                    format!(
                        "runner {} pinned for {}; runner group {}",
                        r.packages.version(),
                        r.packages.architectures(),
                        r.runner_group_id
                    ),
                );
            }
            _ => {}
        }
    }
    let error = result.as_ref().err().map(|i| {
        let (reason, message) = (i.reason, i.message.clone());
        if i.is_transient() || deleting {
            ResolveError::Unresolved { reason, message }
        } else {
            ResolveError::Invalid { reason, message }
        }
    });
    mem.resolved = Some(ResolvedEntry {
        generation,
        at: Instant::now(),
        result,
    });
    error
}

/// The observe stage: GitHub's runner listing of the target, at the observe interval.
async fn observe_stage(
    ctx: &Ctx,
    mem: &mut PolicyMemory,
    r: &Reading<'_>,
    resolved: &Resolved,
) -> Vec<ObserveError> {
    if mem
        .last_observe
        .is_some_and(|t| t.elapsed() < ctx.settings.observe_interval)
    {
        return Vec::new();
    }
    mem.last_observe = Some(Instant::now());
    observe(ctx, mem, r.policy, r.attempts, &resolved.client).await
}

/// The demand stage: a pass of the policy's demand source (`sources::DemandSource`, chosen
/// once per generation), whose ledger change is written here, through the one writer.
async fn demand_stage(
    ctx: &Ctx,
    mem: &mut PolicyMemory,
    r: &Reading<'_>,
    resolved: &Resolved,
    now: Timestamp,
) -> Vec<DemandError> {
    let policy = r.policy;
    let generation = policy.metadata.generation.unwrap_or(0);
    if mem
        .demand
        .as_ref()
        .is_none_or(|c| c.generation != generation)
    {
        // The old source goes first: a scale-set session is deleted before its successor opens.
        mem.demand = None;
        let source = sources::choose(ctx, policy, resolved);
        tracing::debug!(
            policy.namespace = policy.metadata.namespace.as_deref().unwrap_or_default(),
            policy.name = policy.metadata.name.as_deref().unwrap_or_default(),
            kind = source.kind().as_str(),
            "demand source chosen"
        );
        mem.demand = Some(Chosen { generation, source });
    }
    let Some(chosen) = mem.demand.as_mut() else {
        return Vec::new();
    };
    let empty = std::collections::BTreeMap::new();
    let ledger = policy.status.as_ref().map_or(&empty, |s| &s.pending_jobs);
    let observed = chosen
        .source
        .pass(Pass {
            policy,
            resolved,
            ledger,
            candidates: r.candidates,
            grace: ctx.settings.job_check_grace,
            now,
        })
        .await;
    let mut errors = observed.errors;
    let ns = policy.metadata.namespace.as_deref().unwrap_or_default();
    let name = policy.metadata.name.as_deref().unwrap_or_default();
    if let Err(source) = ctx.writer.pending_jobs(ns, name, observed.change).await {
        errors.push(WriteFailed::of(WriteKind::PendingJobs)(source).into());
    }
    errors
}

/// Attempt creates sent at once by one policy.
const CREATE_CONCURRENCY: usize = 8;

/// The operator's settings a plan depends on.
fn limits(s: &super::Settings) -> Limits {
    Limits {
        admission_timeout: s.admission_timeout,
        node_lost_grace: s.node_lost_grace,
        max_consecutive_failures: s.max_consecutive_failures,
        replacement_backoff: s.replacement_backoff,
        replacement_backoff_max: s.replacement_backoff_max,
    }
}

/// The plan stage: the policy's decisions (`plan::plan`), pure. Attempts this leader created
/// that the cache does not show yet supply the plan's counts (expectations, as a
/// ReplicaSet's); one the cache never shows within the placement TTL is given up.
fn plan_stage(ctx: &Ctx, mem: &mut PolicyMemory, r: &Reading<'_>, now: Timestamp) -> Plan {
    mem.created.retain(|name, at| {
        at.elapsed() < IN_FLIGHT_TTL && !r.attempts.iter().any(|a| a.name() == name.as_str())
    });
    let in_flight: Vec<String> = mem.created.keys().cloned().collect();
    let readiness = match mem.resolved.as_ref().map(|e| &e.result) {
        Some(Ok(r)) => Readiness::Valid {
            version: r.packages.version(),
            runner_group_id: r.runner_group_id,
        },
        Some(Err(i)) => Readiness::Invalid {
            reason: i.reason,
            message: &i.message,
        },
        None => Readiness::Unresolved,
    };
    super::plan::plan(&Inputs {
        policy: r.policy,
        attempts: r.attempts,
        readiness,
        cordoned: r.cordoned,
        conflicts: r.conflicts,
        in_flight: &in_flight,
        limits: limits(&ctx.settings),
        now,
    })
}

/// Status fields without their timestamps (`lastTransitionTime`, `lastScaleTime`). Pure.
fn without_times(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !matches!(k.as_str(), "lastTransitionTime" | "lastScaleTime"))
                .map(|(k, v)| (k.clone(), without_times(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_times).collect()),
        other => other.clone(),
    }
}

/// How long a status this leader wrote is taken as current when the cache does not show it yet.
const STATUS_ECHO: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a created attempt the cache does not show is still counted as supply (the
/// placement worker's expectations last as long).
const IN_FLIGHT_TTL: std::time::Duration = std::time::Duration::from_secs(120);

/// What the apply stage did.
#[derive(Debug, Default)]
struct Applied {
    /// What failed; the rest was carried out.
    errors: Vec<ApplyError>,
    wants_capacity: bool,
    wake_at: Option<Timestamp>,
    /// The attempts created.
    created: Vec<String>,
    /// What the status stage writes (nothing for a drain).
    status: Option<NextStatus>,
}

/// The status the plan settled on, for the status stage.
#[derive(Debug)]
struct NextStatus {
    next: ScalePolicyStatus,
    /// The finalizers the status write's response should hold (ours, once written).
    finalizers: Option<Vec<String>>,
}

/// The apply stage: carry out a plan. Every step is tried whatever an earlier one did (as a
/// level-triggered pass would on its next round), except that nothing is created when the
/// finalizer could not be added: an attempt must never outlive a policy deleted before it held
/// its finalizer.
async fn apply_stage(
    ctx: &Ctx,
    placement: &Mutex<PlacementWorker>,
    mem: &PolicyMemory,
    r: &Reading<'_>,
    plan: Plan,
    now: Timestamp,
) -> Applied {
    match plan {
        Plan::Drain(d) => Applied {
            errors: apply_drain(ctx, mem, r.policy, r.attempts, d, now).await,
            ..Applied::default()
        },
        Plan::Run(run) => apply_run(ctx, placement, mem, r.policy, r.attempts, *run, now).await,
    }
}

/// Dereference and validate the policy against this process's clients, hosts and bindings.
async fn resolve_now(ctx: &Ctx, policy: &ScalePolicy) -> Result<Resolved, Invalid> {
    resolve(
        ctx.kube(),
        &ctx.clients,
        policy,
        &ctx.settings.hosts,
        &ctx.settings.owner_bindings,
    )
    .await
}

fn resolved(mem: &PolicyMemory) -> Option<&Resolved> {
    mem.resolved.as_ref().and_then(|e| e.result.as_ref().ok())
}

fn publish(ctx: &Ctx, policy: &ScalePolicy, events: Vec<PolicyEvent>) {
    for e in events {
        ctx.events
            .publish(&policy.object_ref(&()), e.reason, e.note);
    }
}

/// Terminate each named attempt (as cached); returns how many were asked to stop.
async fn terminate_all(
    ctx: &Ctx,
    mem: &PolicyMemory,
    attempts: &[Attempt],
    terminations: impl IntoIterator<Item = Termination>,
    errors: &mut Vec<ApplyError>,
    now: Timestamp,
) -> u32 {
    let client = resolved(mem).map(|r| r.client.as_ref());
    let mut asked = 0;
    for t in terminations {
        let Some(a) = attempts.iter().find(|a| a.name() == t.attempt) else {
            continue;
        };
        match terminate(ctx, mem, client, &a.object, t.reason, now).await {
            Ok(Terminated::Requested) => asked += 1,
            Ok(Terminated::TookJob | Terminated::Skipped) => {}
            Err(e) => errors.push(e),
        }
    }
    asked
}

async fn apply_drain(
    ctx: &Ctx,
    mem: &PolicyMemory,
    policy: &ScalePolicy,
    attempts: &[Attempt],
    d: Drain,
    now: Timestamp,
) -> Vec<ApplyError> {
    let ns = policy.metadata.namespace.as_deref().unwrap_or_default();
    let name = policy.metadata.name.as_deref().unwrap_or_default();
    ctx.metrics.forget_policy(ns, name);
    let mut errors = Vec::new();
    for attempt in &d.delete {
        if let Err(source) = ctx.writer.delete_attempt(ns, attempt).await {
            errors.push(WriteFailed::of(WriteKind::AttemptDelete)(source).into());
        }
    }
    terminate_all(ctx, mem, attempts, d.terminate, &mut errors, now).await;
    publish(ctx, policy, d.events);
    if let Some(rest) = d.release
        && let Err(source) = ctx.writer.policy_finalizers_echoed(policy, rest).await
    {
        errors.push(WriteFailed::of(WriteKind::PolicyFinalizer)(source).into());
    }
    errors
}

async fn apply_run(
    ctx: &Ctx,
    placement: &Mutex<PlacementWorker>,
    mem: &PolicyMemory,
    policy: &ScalePolicy,
    attempts: &[Attempt],
    run: Run,
    now: Timestamp,
) -> Applied {
    let ns = policy.metadata.namespace.as_deref().unwrap_or_default();
    let name = policy.metadata.name.as_deref().unwrap_or_default();
    let mut errors = Vec::new();
    let mut created = Vec::new();
    let mut finalized = true;
    let wake_at = match &run.scaling {
        Scaling::BackingOff { until, .. } => Some(*until),
        _ => None,
    };
    // Not sent beside the status write: this write's compare-and-swap on the resourceVersion
    // (which keeps other writers' finalizers) would then fail against the status write's.
    // The finalizers the status write's response should hold (ours, once written).
    let mut finalizers = None;
    if let Some(with) = run.finalizer {
        match ctx
            .writer
            .policy_finalizers_echoed(policy, with.clone())
            .await
        {
            Ok(()) => finalizers = Some(with),
            Err(source) => {
                finalized = false;
                errors.push(WriteFailed::of(WriteKind::PolicyFinalizer)(source).into());
            }
        }
    }
    let scaled = match (&run.scaling, resolved(mem)) {
        (Scaling::Create { count, replaces }, Some(r)) if finalized => {
            tracing::debug!(
                desired = run.status.base.desired,
                create = *count,
                pending_jobs = run.gauges.pending_jobs,
                "scaling up"
            );
            create_attempts(
                ctx,
                placement,
                r,
                *count,
                replaces,
                &mut errors,
                &mut created,
                now,
            )
            .await
        }
        (Scaling::Probe { replaces }, Some(r)) if finalized => {
            tracing::debug!("Degraded past its cool-down: one probe launch");
            create_attempts(
                ctx,
                placement,
                r,
                1,
                replaces,
                &mut errors,
                &mut created,
                now,
            )
            .await
        }
        (Scaling::ScaleDown { idle }, _) => {
            let victims: Vec<Termination> = idle
                .iter()
                .map(|a| Termination {
                    attempt: a.clone(),
                    reason: runner_manager_crds::attempt::TerminationReason::ScaleDown,
                })
                .collect();
            Scaled::Asked(terminate_all(ctx, mem, attempts, victims, &mut errors, now).await)
        }
        _ => Scaled::Nothing,
    };
    terminate_all(ctx, mem, attempts, run.terminations, &mut errors, now).await;
    let wants_capacity = matches!(
        scaled,
        Scaled::Created {
            refused: Some(_),
            ..
        }
    );

    ctx.metrics.policy(ns, name, run.gauges);
    let (scaling, unplaceable) = scaling_condition(&run.scaling, scaled);
    let next = settle(&run.status, scaling);
    let mut events = run.events;
    events.extend(unplaceable);
    publish(ctx, policy, events);
    Applied {
        errors,
        wants_capacity,
        wake_at,
        created,
        status: Some(NextStatus { next, finalizers }),
    }
}

/// The status stage: the status the plan settled on, written when it differs from the stored
/// one. Returns whether it was written.
async fn status_stage(
    ctx: &Ctx,
    mem: &mut PolicyMemory,
    policy: &ScalePolicy,
    s: NextStatus,
) -> Result<bool, StatusError> {
    let old = policy.status.clone().unwrap_or_default();
    let fields = status_fields(&s.next);
    // A reconcile triggered by an event older than this leader's last status write (its own
    // finalizer write, say) sees the status before that write: the same fields are not sent
    // again while the cache catches up.
    // Timestamps aside: such a reconcile sets a fresh transition time on conditions the stale
    // copy lacks.
    let just_written = mem.status_written.as_ref().is_some_and(|(v, at)| {
        at.elapsed() < STATUS_ECHO && without_times(v) == without_times(&fields)
    });
    if s.next == old || just_written {
        return Ok(false);
    }
    ctx.writer
        .policy_status(policy, s.finalizers.as_deref(), fields.clone())
        .await
        .map_err(StatusError)?;
    mem.status_written = Some((fields, Instant::now()));
    Ok(true)
}

/// The status fields the leader owns (never `pendingJobs`).
fn status_fields(s: &ScalePolicyStatus) -> Value {
    let mut v = serde_json::to_value(s).unwrap_or(Value::Null);
    if let Some(o) = v.as_object_mut() {
        o.remove("pendingJobs");
    }
    v
}

/// Create up to `count` attempts. Nodes are chosen one by one under the placement worker's lock
/// (`plan::place`) and each choice is recorded as an expectation before its create is sent, so
/// the lock is released before the creates, which go out at once (a burst of 50 does not wait
/// on 50 sequential round trips). A create that fails forgets its expectation and is an error.
#[allow(clippy::too_many_arguments)]
async fn create_attempts(
    ctx: &Ctx,
    placement: &Mutex<PlacementWorker>,
    resolved: &Resolved,
    count: u32,
    replaces: &[String],
    errors: &mut Vec<ApplyError>,
    names: &mut Vec<String>,
    now: Timestamp,
) -> Scaled {
    let pinned = Pinned {
        policy: &resolved.policy,
        runner_group_id: resolved.runner_group_id,
        packages: &resolved.packages,
        env: &resolved.env,
    };
    let placed = {
        let mut worker = placement.lock().await;
        let nodes = ctx.caches.nodes.state();
        let leases = ctx.caches.leases.state();
        // Expectations the cache now shows are dropped here, under the lock, right before the
        // capacity they hold is read (the sightings are drained before the snapshot is read).
        let all_attempts = worker.observe(|| ctx.caches.attempts.state(), now);
        let mut facts = node_facts(
            &nodes.iter().map(AsRef::as_ref).collect::<Vec<_>>(),
            &leases.iter().map(AsRef::as_ref).collect::<Vec<_>>(),
            &all_attempts.iter().map(AsRef::as_ref).collect::<Vec<_>>(),
            now,
            ctx.settings.max_runners_per_node,
        );
        place(
            &mut worker,
            &mut facts,
            &pinned,
            count,
            replaces,
            now,
            uuid::Uuid::new_v4,
        )
    };
    let Placed {
        attempts: planned,
        refused,
    } = placed;
    tracing::debug!(
        planned = planned.len(),
        create = count,
        unplaceable = refused.as_ref().map_or("", |w| w.as_str()),
        "placed"
    );
    let results: Vec<_> = futures_util::stream::iter(planned)
        .map(|new| async move {
            let result = ctx.writer.create_attempt(&new.attempt).await;
            (new, result)
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect()
        .await;
    let mut created = 0;
    for (new, result) in results {
        match result {
            Ok(done) => {
                created += 1;
                names.extend(new.attempt.metadata.name.clone());
                ctx.metrics.attempt_created(creation_reason(&new));
                ctx.events.publish(
                    &done.object_ref(&()),
                    Reason::AttemptCreated,
                    creation_note(&new),
                );
            }
            Err(source) => {
                placement
                    .lock()
                    .await
                    .forget(new.attempt.metadata.name.as_deref().unwrap_or_default());
                errors.push(WriteFailed::of(WriteKind::AttemptCreate)(source).into());
            }
        }
    }
    if let Some(why) = refused {
        ctx.metrics.placement_failure(why.as_str());
    }
    Scaled::Created {
        created,
        wanted: count,
        refused,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::scripted;
    use serde_json::json;

    fn deleting_policy() -> ScalePolicy {
        serde_json::from_value(json!({
            "apiVersion": "runner-manager.dev/v1alpha1", "kind": "ScalePolicy",
            "metadata": {"name": "web", "namespace": "team", "uid": "u-1", "generation": 2,
                         "resourceVersion": "41", "deletionTimestamp": "2026-12-07T16:00:00Z",
                         "finalizers": [crate::controller::POLICY_FINALIZER, "example.com/keep"]},
            "spec": {"github": {"url": "https://github.com/acme/web",
                                "credentialsSecretRef": {"name": "gh"}},
                     "labels": ["self-hosted", "linux"], "maxRunners": 2}
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The drain of the attempts `web-a` and `web-b`, releasing `release` once they are gone.
    fn drain(release: Option<Vec<String>>) -> Drain {
        Drain {
            delete: vec!["web-a".into(), "web-b".into()],
            terminate: Vec::new(),
            release,
            events: Vec::new(),
        }
    }

    fn answer(req: &scripted::Seen) -> scripted::Answer {
        match req.method.as_str() {
            "DELETE" => scripted::deleted(),
            _ => (
                200,
                serde_json::to_value(deleting_policy()).unwrap_or_default(),
            ),
        }
    }

    /// A deleted policy's drain, against a scripted API server: the attempts the plan names are
    /// deleted, then the policy's own finalizer is released (a CAS on the version read, the
    /// other controllers' finalizers kept); a failed deletion is reported by kind and the rest
    /// still goes.
    #[tokio::test]
    async fn a_drain_deletes_the_attempts_then_releases_only_its_own_finalizer() {
        let (kube, seen) = scripted::client(answer);
        let ctx = scripted::ctx(kube);
        let first = drain(Some(vec!["example.com/keep".into()]));
        let p = deleting_policy();
        let now = Timestamp::from_second(1_800_000_000).unwrap_or_else(|e| panic!("{e}"));
        let errors = apply_drain(&ctx, &PolicyMemory::default(), &p, &[], first, now).await;
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            seen.writes(),
            [
                "DELETE runnerattempts/web-a",
                "DELETE runnerattempts/web-b",
                "PATCH scalepolicies/web"
            ]
        );
        assert_eq!(
            seen.body_of("PATCH scalepolicies/web")["metadata"],
            json!({"finalizers": ["example.com/keep"], "resourceVersion": "41"})
        );

        let (kube, seen) = scripted::client(|req| match req.short().as_str() {
            "DELETE runnerattempts/web-a" => scripted::internal_error(),
            _ => answer(req),
        });
        let ctx = scripted::ctx(kube);
        let errors = apply_drain(&ctx, &PolicyMemory::default(), &p, &[], drain(None), now).await;
        assert_eq!(
            seen.writes(),
            ["DELETE runnerattempts/web-a", "DELETE runnerattempts/web-b"]
        );
        assert!(
            matches!(
                errors.as_slice(),
                [ApplyError::Write(WriteFailed {
                    kind: WriteKind::AttemptDelete,
                    ..
                })]
            ),
            "{errors:?}"
        );
    }

    /// A live policy whose credentials Secret is missing, with one attempt a person abandoned.
    fn unresolvable_policy() -> ScalePolicy {
        serde_json::from_value(json!({
            "apiVersion": "runner-manager.dev/v1alpha1", "kind": "ScalePolicy",
            "metadata": {"name": "web", "namespace": "team", "uid": "u-1", "generation": 2,
                         "resourceVersion": "41"},
            "spec": {"github": {"url": "https://github.com/acme/web",
                                "credentialsSecretRef": {"name": "gh"}},
                     "labels": ["self-hosted", "linux"], "minIdle": 1, "maxRunners": 2}
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The whole pipeline against a scripted API server: housekeeping's writes come first, then
    /// the resolution's read, then (no resolution: nothing observed, polled or created) the
    /// finalizer and last the status; the one failure is the resolve stage's and does not back
    /// the policy off; every stage that ran is timed, and the plan is the only one without a
    /// client.
    #[tokio::test]
    async fn the_stages_run_in_order_and_a_failed_resolution_creates_nothing() {
        use runner_manager_crds::fixtures::AttemptBuilder;
        let policy = Arc::new(unresolvable_policy());
        let (kube, seen) = scripted::client(|req| match req.method.as_str() {
            "GET" => scripted::not_found(),
            "DELETE" => scripted::deleted(),
            _ if req.path.contains("/scalepolicies/") => (
                200,
                serde_json::to_value(unresolvable_policy()).unwrap_or_default(),
            ),
            _ => (
                200,
                serde_json::to_value(AttemptBuilder::new("ab", "web").namespace("team").build())
                    .unwrap_or_default(),
            ),
        });
        let mut ctx = scripted::ctx(kube);
        ctx.settings.hosts.github_hosts =
            runner_manager_crds::hosts::HostList::parse("github.com").unwrap_or_default();
        let mut abandoned = AttemptBuilder::new("ab", "web")
            .namespace("team")
            .state(runner_manager_crds::state::AttemptState::Busy)
            .annotation(runner_manager_crds::ABANDON_ANNOTATION, "true")
            .build();
        abandoned.metadata.finalizers = Some(vec![runner_manager_crds::CLEANUP_FINALIZER.into()]);
        let (attempts, _) = Attempt::all([Arc::new(abandoned)]);
        let placement = Mutex::new(PlacementWorker::default());
        let mut mem = PolicyMemory::default();
        let candidates = || {
            Arc::new(Candidates::of(
                Vec::new(),
                false,
                &ctx.settings.owner_bindings,
            ))
        };
        let reading = Reading {
            policy: &policy,
            attempts: &attempts,
            cordoned: &HashSet::new(),
            conflicts: &[],
            candidates: &candidates,
        };
        let now = Timestamp::from_second(1_800_000_000).unwrap_or_else(|e| panic!("{e}"));
        let done = reconcile(&ctx, &placement, &mut mem, reading, now).await;

        let writes = seen.writes();
        let secret = writes
            .iter()
            .position(|w| w.starts_with("GET ") && w.contains("/secrets/gh"));
        assert_eq!(
            seen.changes(),
            [
                "PATCH runnerattempts/ab",
                "DELETE runnerattempts/ab",
                "PATCH scalepolicies/web",
                "PATCH scalepolicies/web/status",
            ],
            "{writes:?}"
        );
        assert_eq!(
            secret,
            Some(2),
            "resolution reads after housekeeping: {writes:?} {:?}",
            done.errors
        );
        assert!(
            !writes.iter().any(|w| w.starts_with("POST ")),
            "nothing created without a resolution: {writes:?}"
        );
        let stages: Vec<Stage> = done.errors.iter().map(ReconcileError::stage).collect();
        assert_eq!(stages, [Stage::Resolve], "{:?}", done.errors);
        assert!(!done.errors.iter().any(ReconcileError::backs_off));
        assert!(done.status_written);
        for stage in [Stage::Observe, Stage::Demand] {
            assert_eq!(done.took.of(stage), 0, "{stage:?} did not run");
        }
    }
}
