//! One policy's reconcile: `prepare` does the I/O its decisions depend on (resolution, GitHub
//! observation, polling and job checks), `plan::plan` decides without I/O, and `apply` carries
//! the plan out — finalizer, creation with placement, terminations, status, events. Each step
//! reports what failed as a typed [`ReconcileError`]; the caller counts them by stage and backs
//! the policy off. A policy that is not Ready creates nothing and changes nothing already
//! running.

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

use super::errors::ReconcileError;
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

/// The stored `Ready` condition of this generation, if the status has one: whether it is True.
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

/// A policy's I/O before its decisions: its resolution, the GitHub observation of its target,
/// and a pass of its demand source (`sources::DemandSource`, chosen once per generation), whose
/// ledger change is written here. What failed is returned; the rest went on.
pub async fn prepare(
    ctx: &Ctx,
    mem: &mut PolicyMemory,
    policy: &Arc<ScalePolicy>,
    attempts: &[Attempt],
    candidates: &(dyn Fn() -> Arc<Candidates> + Send + Sync),
    now: Timestamp,
) -> Vec<ReconcileError> {
    let mut errors = Vec::new();
    let generation = policy.metadata.generation.unwrap_or(0);
    if policy.metadata.deletion_timestamp.is_some() {
        // The drain deregisters each runner before asking it to stop, with the policy's
        // client. A process that never resolved the policy (a new leader meeting a policy
        // already being deleted, as after `helm upgrade` on the real node) must resolve it
        // now: without a client the runner is stopped and its registration stays on GitHub.
        if resolved(mem).is_none() {
            let result = resolve_now(ctx, policy).await;
            if let Err(i) = &result {
                let (reason, message) = (i.reason, i.message.clone());
                errors.push(ReconcileError::Unresolved { reason, message });
            }
            mem.resolved = Some(ResolvedEntry {
                generation,
                at: Instant::now(),
                result,
            });
        }
        return errors;
    }

    // Resolution (once per generation, not per pass).
    if !mem
        .resolved
        .as_ref()
        .is_some_and(|e| resolution_fresh(e, generation))
    {
        // After a restart or failover the memory is empty: the stored condition says what a
        // person last saw, so a thousand unchanged policies publish no thousand events.
        let was_ok = mem
            .resolved
            .as_ref()
            .map(|e| e.result.is_ok())
            .or_else(|| stored_ready(policy, generation));
        let result = resolve_now(ctx, policy).await;
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
        if let Err(i) = &result {
            let (reason, message) = (i.reason, i.message.clone());
            errors.push(if i.is_transient() {
                ReconcileError::Unresolved { reason, message }
            } else {
                ReconcileError::Invalid { reason, message }
            });
        }
        mem.resolved = Some(ResolvedEntry {
            generation,
            at: Instant::now(),
            result,
        });
    }
    let resolved: Option<Resolved> = mem
        .resolved
        .as_ref()
        .and_then(|e| e.result.as_ref().ok().cloned());
    // GitHub observation, then the policy's demand source, each at its own interval.
    let Some(r) = &resolved else {
        return errors;
    };
    if mem
        .last_observe
        .is_none_or(|t| t.elapsed() >= ctx.settings.observe_interval)
    {
        mem.last_observe = Some(Instant::now());
        errors.extend(observe(ctx, mem, policy, attempts, &r.client).await);
    }
    if mem
        .demand
        .as_ref()
        .is_none_or(|c| c.generation != generation)
    {
        // The old source goes first: a scale-set session is deleted before its successor opens.
        mem.demand = None;
        let source = sources::choose(ctx, policy, r);
        tracing::debug!(
            policy.namespace = policy.metadata.namespace.as_deref().unwrap_or_default(),
            policy.name = policy.metadata.name.as_deref().unwrap_or_default(),
            kind = source.kind().as_str(),
            "demand source chosen"
        );
        mem.demand = Some(Chosen { generation, source });
    }
    let Some(chosen) = mem.demand.as_mut() else {
        return errors;
    };
    let empty = std::collections::BTreeMap::new();
    let ledger = policy.status.as_ref().map_or(&empty, |s| &s.pending_jobs);
    let observed = chosen
        .source
        .pass(Pass {
            policy,
            resolved: r,
            ledger,
            candidates,
            grace: ctx.settings.job_check_grace,
            now,
        })
        .await;
    errors.extend(observed.errors);
    let ns = policy.metadata.namespace.as_deref().unwrap_or_default();
    let name = policy.metadata.name.as_deref().unwrap_or_default();
    if let Err(source) = ctx.writer.pending_jobs(ns, name, observed.change).await {
        errors.push(ReconcileError::write(WriteKind::PendingJobs)(source));
    }
    errors
}

/// Attempt creates sent at once by one policy.
const CREATE_CONCURRENCY: usize = 8;

impl Limits {
    pub fn of(s: &super::Settings) -> Self {
        Self {
            admission_timeout: s.admission_timeout,
            node_lost_grace: s.node_lost_grace,
            max_consecutive_failures: s.max_consecutive_failures,
            replacement_backoff: s.replacement_backoff,
            replacement_backoff_max: s.replacement_backoff_max,
        }
    }
}

/// A policy's decisions (`plan::plan`) and their application. `conflicts` are the policies of
/// other namespaces naming the same target. What failed is returned; the rest was carried out.
#[allow(clippy::too_many_arguments)]
#[tracing::instrument(name = "reconcile", skip_all, fields(
    policy.namespace = policy.metadata.namespace.as_deref().unwrap_or_default(),
    policy.name = policy.metadata.name.as_deref().unwrap_or_default(),
))]
pub async fn reconcile(
    ctx: &Ctx,
    placement: &Mutex<PlacementWorker>,
    cordoned: &HashSet<String>,
    mem: &mut PolicyMemory,
    policy: &Arc<ScalePolicy>,
    attempts: &[Attempt],
    conflicts: &[String],
    now: Timestamp,
) -> Applied {
    // Created before and still not cached: supply the plan counts (expectations, as a
    // ReplicaSet's). One the cache never shows within the placement TTL is given up.
    mem.created.retain(|name, at| {
        at.elapsed() < IN_FLIGHT_TTL && !attempts.iter().any(|a| a.name() == name.as_str())
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
    let plan = super::plan::plan(&Inputs {
        policy,
        attempts,
        readiness,
        cordoned,
        conflicts,
        in_flight: &in_flight,
        limits: Limits::of(&ctx.settings),
        now,
    });
    let applied = apply(ctx, placement, mem, policy, attempts, plan, now).await;
    for name in &applied.created {
        mem.created.insert(name.clone(), Instant::now());
    }
    if let Some(v) = &applied.status_written {
        mem.status_written = Some((v.clone(), Instant::now()));
    }
    applied
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

/// What a reconcile did, as its Controller needs it.
#[derive(Debug, Default)]
pub struct Applied {
    /// What failed; the rest was carried out.
    pub errors: Vec<ReconcileError>,
    /// More runners were wanted than placement found room for: a change of capacity anywhere
    /// (an attempt ending, an agent's advert, a node) should reconcile this policy again.
    pub wants_capacity: bool,
    /// When a time-based gate the plan waits on opens (the replacement backoff).
    pub wake_at: Option<Timestamp>,
    /// The attempts created.
    pub created: Vec<String>,
    /// The status fields written.
    pub status_written: Option<Value>,
}

/// Carry out a plan. Every step is tried whatever an earlier one did (as a level-triggered pass
/// would on its next round), except that nothing is created when the finalizer could not be
/// added: an attempt must never outlive a policy deleted before it held its finalizer.
pub async fn apply(
    ctx: &Ctx,
    placement: &Mutex<PlacementWorker>,
    mem: &PolicyMemory,
    policy: &ScalePolicy,
    attempts: &[Attempt],
    plan: Plan,
    now: Timestamp,
) -> Applied {
    match plan {
        Plan::Drain(d) => Applied {
            errors: apply_drain(ctx, mem, policy, attempts, d, now).await,
            ..Applied::default()
        },
        Plan::Run(run) => apply_run(ctx, placement, mem, policy, attempts, *run, now).await,
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
    errors: &mut Vec<ReconcileError>,
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
) -> Vec<ReconcileError> {
    let ns = policy.metadata.namespace.as_deref().unwrap_or_default();
    let name = policy.metadata.name.as_deref().unwrap_or_default();
    ctx.metrics.forget_policy(ns, name);
    let mut errors = Vec::new();
    for attempt in &d.delete {
        if let Err(source) = ctx.writer.delete_attempt(ns, attempt).await {
            errors.push(ReconcileError::write(WriteKind::AttemptDelete)(source));
        }
    }
    terminate_all(ctx, mem, attempts, d.terminate, &mut errors, now).await;
    publish(ctx, policy, d.events);
    if let Some(rest) = d.release
        && let Err(source) = ctx.writer.policy_finalizers_echoed(policy, rest).await
    {
        errors.push(ReconcileError::write(WriteKind::PolicyFinalizer)(source));
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
                errors.push(ReconcileError::write(WriteKind::PolicyFinalizer)(source));
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
    let old = policy.status.clone().unwrap_or_default();
    let fields = status_fields(&next);
    // A reconcile triggered by an event older than this leader's last status write (its own
    // finalizer write, say) sees the status before that write: the same fields are not sent
    // again while the cache catches up.
    // Timestamps aside: such a reconcile sets a fresh transition time on conditions the stale
    // copy lacks.
    let just_written = mem.status_written.as_ref().is_some_and(|(v, at)| {
        at.elapsed() < STATUS_ECHO && without_times(v) == without_times(&fields)
    });
    let mut status_written = None;
    if next != old && !just_written {
        match ctx
            .writer
            .policy_status(policy, finalizers.as_deref(), fields.clone())
            .await
        {
            Ok(()) => status_written = Some(fields),
            Err(source) => errors.push(ReconcileError::Status(source)),
        }
    }
    Applied {
        errors,
        wants_capacity,
        wake_at,
        created,
        status_written,
    }
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
    errors: &mut Vec<ReconcileError>,
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
                errors.push(ReconcileError::write(WriteKind::AttemptCreate)(source));
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
                [ReconcileError::Write {
                    kind: WriteKind::AttemptDelete,
                    ..
                }]
            ),
            "{errors:?}"
        );
    }
}
