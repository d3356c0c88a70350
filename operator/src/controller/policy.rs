//! One policy's reconcile: resolution → demand → creation with placement → scale-down →
//! timeouts → GitHub observation → job-ledger repairs → status. A policy that is not Ready
//! creates nothing and changes nothing already running.

use std::collections::HashSet;
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use runner_manager_crds::attempt::{RunnerAttempt, TerminationReason};
use runner_manager_crds::conditions::{Condition, ConditionStatus, upsert};
use runner_manager_crds::policy::{
    PolicyConditionType, PolicyReason, ScalePolicy, ScalePolicyStatus,
};
use runner_manager_crds::state::AttemptState;
use serde_json::{Map, Value};
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::attempts::state_of;
use super::events::Reason;
use super::failures::{Launch, consecutive_failures, lineages, resume_at};
use super::job_ledger::{
    Candidates, additions, no_longer_pending, poll_queued, stale_after_poll, walked_jobs_of,
};
use super::placement_worker::{PlacementWorker, node_facts};
use super::resolve::{Resolved, resolve};
use super::snapshot::{POLICY_GENERATION_ANNOTATION, Pinned, build};
use super::supervisor::{Terminated, observe, terminate};
use super::timeouts::{Due, due};
use super::{Ctx, POLICY_FINALIZER, PolicyMemory, ResolvedEntry};
use crate::policy::demand::{AttemptView, DemandInput, ScaleDecision, decide_holding};

type Cond = Condition<PolicyConditionType, PolicyReason>;

fn cond(
    t: PolicyConditionType,
    ok: bool,
    reason: PolicyReason,
    message: String,
    generation: i64,
    now: Timestamp,
) -> Cond {
    Condition {
        type_: t,
        status: if ok {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        },
        reason,
        message,
        last_transition_time: Some(Time(now)),
        observed_generation: Some(generation),
    }
}

fn launches(attempts: &[Arc<RunnerAttempt>]) -> Vec<Launch<'_>> {
    let replaced: HashSet<&str> = attempts
        .iter()
        .filter_map(|a| a.spec.replaces.as_deref())
        .collect();
    attempts
        .iter()
        .filter_map(|a| {
            let name = a.metadata.name.as_deref()?;
            let journal = a.status.as_ref().map(|s| &s.journal);
            let ts = journal.map(|j| j.timestamps());
            Some(Launch {
                name,
                created: a.metadata.creation_timestamp.as_ref()?.0,
                generation: a
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|m| m.get(POLICY_GENERATION_ANNOTATION))
                    .and_then(|g| g.parse().ok())
                    .unwrap_or(-1),
                outcome: journal.and_then(|j| j.outcome()),
                registered: ts.is_some_and(|t| t.registered_at.is_some() || t.busy_at.is_some()),
                concluded_at: ts.and_then(|t| t.concluded_at.as_ref()).map(|t| t.0),
                replaced: replaced.contains(name),
            })
        })
        .collect()
}

fn views(attempts: &[Arc<RunnerAttempt>]) -> Vec<AttemptView<'_>> {
    attempts
        .iter()
        .map(|a| {
            let mut state = state_of(a);
            // GitHub already said this runner took a job (webhook `in_progress`): it is busy
            // for demand and scale-down, even before the agent takes the edge.
            if matches!(state, AttemptState::Idle | AttemptState::Starting)
                && a.status.as_ref().is_some_and(|s| s.facts.job.is_some())
            {
                state = AttemptState::Busy;
            }
            AttemptView {
                name: a.metadata.name.as_deref().unwrap_or_default(),
                state,
                termination_requested: a.spec.termination.is_some()
                    || a.metadata.deletion_timestamp.is_some(),
                idle_since: (state == AttemptState::Idle)
                    .then(|| {
                        a.status
                            .as_ref()
                            .and_then(|s| s.journal.timestamps().last_state_change_at.clone())
                            .map(|t| t.0)
                    })
                    .flatten(),
            }
        })
        .collect()
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

/// A policy's I/O before its decisions: its finalizer, its resolution, the GitHub observation of
/// its target, polling and job checks.
pub async fn prepare(
    ctx: &Ctx,
    mem: &mut PolicyMemory,
    policy: &Arc<ScalePolicy>,
    attempts: &[Arc<RunnerAttempt>],
    candidates: &Candidates,
    attempt_ids: &HashSet<String>,
    now: Timestamp,
) {
    if policy.metadata.deletion_timestamp.is_some() {
        return;
    }
    let ns = policy.metadata.namespace.as_deref().unwrap_or_default();
    let name = policy.metadata.name.as_deref().unwrap_or_default();
    let generation = policy.metadata.generation.unwrap_or(0);
    let finalizers = policy.metadata.finalizers.clone().unwrap_or_default();
    if !finalizers.iter().any(|f| f == POLICY_FINALIZER) {
        let mut with = finalizers;
        with.push(POLICY_FINALIZER.to_owned());
        let _ = ctx.writer.policy_finalizers(policy, with).await;
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
        let result = resolve(
            ctx.kube(),
            &ctx.clients,
            policy,
            &ctx.settings.hosts,
            &ctx.settings.owner_bindings,
        )
        .await;
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
                        "runner {} pinned; runner group {}",
                        r.package.version, r.runner_group_id
                    ),
                );
            }
            _ => {}
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
    let old = policy.status.clone().unwrap_or_default();
    // GitHub observation, polling and ledger repairs, each at its own interval.
    if let Some(r) = &resolved {
        if mem
            .last_observe
            .is_none_or(|t| t.elapsed() >= ctx.settings.observe_interval)
        {
            mem.last_observe = Some(Instant::now());
            observe(ctx, mem, policy, attempts, &r.client, attempt_ids).await;
        }
        if policy.spec.github.demand == runner_manager_crds::policy::DemandMode::ScaleSet {
            // Demand comes from the scale set's message queue only: no polling, no per-job
            // check (the ledger's keys are runner request ids, and JobStarted/JobCompleted
            // remove them).
            if mem
                .scale_set_listener
                .as_ref()
                .is_none_or(|l| l.generation != generation)
            {
                let mut set_labels = policy.spec.labels.clone();
                set_labels.push(ctx.settings.ownership_label.clone());
                mem.scale_set_listener = None;
                mem.scale_set_listener = Some(super::scaleset_listener::Listener::start(
                    generation,
                    super::scaleset_listener::Params {
                        writer: ctx.writer.clone(),
                        clients: ctx.clients.clone(),
                        rest: r.client.clone(),
                        namespace: ns.to_owned(),
                        name: name.to_owned(),
                        set_name: runner_manager_crds::policy::scale_set_name(ns, name),
                        labels: policy.spec.labels.clone(),
                        set_labels,
                        runner_group_id: r.runner_group_id,
                        owner: std::env::var("HOSTNAME")
                            .unwrap_or_else(|_| "runner-manager-operator".into()),
                    },
                ));
            }
            return;
        }
        mem.scale_set_listener = None;
        let poll = policy.spec.scaling.poll_interval.as_duration();
        // With webhooks on, a run is polled once it is a poll interval old: until then its
        // deliveries are most likely in flight. Without them, at once.
        let settle = if policy.spec.scaling.webhook {
            poll
        } else {
            std::time::Duration::ZERO
        };
        let repository_target = matches!(
            r.client.target().kind,
            runner_manager_crds::target::TargetKind::Repository { .. }
        );
        if !repository_target {
            // Organization and enterprise targets: the walk advances every pass, reading only
            // the repositories due (`github::walk`); new queued jobs are recorded as soon as it
            // sees them, entries it no longer sees leave once per interval after a full cycle.
            match r.client.walk_queued_jobs(poll, settle).await {
                Ok(view) => {
                    let jobs = walked_jobs_of(&r.client, policy, candidates, &view.jobs);
                    mem.walk_added
                        .retain(|_, at| at.elapsed() < std::time::Duration::from_secs(30));
                    let fresh: Vec<i64> = jobs
                        .iter()
                        .copied()
                        .filter(|j| !mem.walk_added.contains_key(&j.to_string()))
                        .collect();
                    let mut change = additions(&old.pending_jobs, fresh, now);
                    change.extend(super::job_ledger::left_queue(&old.pending_jobs, &view.left));
                    for k in change.keys() {
                        mem.walk_added.insert(k.clone(), Instant::now());
                    }
                    if let Some(since) = view.complete_since
                        && mem.last_poll.is_none_or(|t| t.elapsed() >= poll)
                    {
                        mem.last_poll = Some(Instant::now());
                        // Every repository was read after `since`; a run's list can lag its
                        // job's `queued` delivery, so only entries a poll interval older go.
                        let back = since.elapsed() + poll;
                        let cutoff = now
                            .checked_sub(
                                k8s_openapi::jiff::SignedDuration::try_from(back)
                                    .unwrap_or_default(),
                            )
                            .unwrap_or(now);
                        change.extend(stale_after_poll(&old.pending_jobs, &jobs, cutoff));
                    }
                    if !change.is_empty() {
                        let _ = ctx.writer.pending_jobs(ns, name, change).await;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "walking the target's repositories failed"),
            }
        } else if mem.last_poll.is_none_or(|t| t.elapsed() >= poll) {
            mem.last_poll = Some(Instant::now());
            let cutoff = now
                .checked_sub(k8s_openapi::jiff::SignedDuration::try_from(poll).unwrap_or_default())
                .unwrap_or(now);
            match poll_queued(&r.client, policy, candidates, poll / 2, settle).await {
                Ok(jobs) => {
                    let mut change = stale_after_poll(&old.pending_jobs, &jobs, cutoff);
                    change.extend(additions(&old.pending_jobs, jobs, now));
                    if !change.is_empty() {
                        let _ = ctx.writer.pending_jobs(ns, name, change).await;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "polling queued runs failed"),
            }
        }
        let grace = ctx.settings.job_check_grace;
        let mut remove = Map::new();
        for (job, queued) in &old.pending_jobs {
            let age = now
                .as_millisecond()
                .saturating_sub(queued.0.as_millisecond());
            if age < i64::try_from(grace.as_millis()).unwrap_or(i64::MAX) {
                continue;
            }
            if mem.job_checks.get(job).is_some_and(|t| t.elapsed() < grace) {
                continue;
            }
            mem.job_checks.insert(job.clone(), Instant::now());
            let Ok(id) = job.parse::<i64>() else {
                remove.insert(job.clone(), Value::Null);
                continue;
            };
            if let Ok(true) = no_longer_pending(&r.client, id).await {
                remove.insert(job.clone(), Value::Null);
            }
        }
        mem.job_checks
            .retain(|k, _| old.pending_jobs.contains_key(k));
        let _ = ctx.writer.pending_jobs(ns, name, remove).await;
    }
}

/// Attempt creates sent at once by one policy.
const CREATE_CONCURRENCY: usize = 8;

/// A policy's decisions: demand, creation with placement, scale-down, timeouts, status.
/// `conflicts` are the policies of other namespaces naming the same target.
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
    attempts: &[Arc<RunnerAttempt>],
    conflicts: &[String],
    now: Timestamp,
) {
    let ns = policy.metadata.namespace.as_deref().unwrap_or_default();
    let name = policy.metadata.name.as_deref().unwrap_or_default();
    let generation = policy.metadata.generation.unwrap_or(0);
    if policy.metadata.deletion_timestamp.is_some() {
        ctx.metrics.forget_policy(ns, name);
        drain(ctx, mem, policy, attempts, now).await;
        return;
    }
    let resolved: Option<Resolved> = mem
        .resolved
        .as_ref()
        .and_then(|e| e.result.as_ref().ok().cloned());

    let old = policy.status.clone().unwrap_or_default();
    let pending_jobs = u32::try_from(old.pending_jobs.len()).unwrap_or(u32::MAX);
    let attempt_views = views(attempts);
    let input = DemandInput {
        min_idle: policy.spec.min_idle,
        max_runners: policy.spec.max_runners,
        pending_jobs,
    };
    let scale = decide_holding(
        input,
        &attempt_views,
        super::job_ledger::presumed_taken_of(policy, attempts, now),
    );
    let history = launches(attempts);
    let failures = consecutive_failures(&history, generation);
    let degraded = failures >= ctx.settings.max_consecutive_failures;
    let last_failure = history
        .iter()
        .filter(|l| super::failures::is_launch_failure(l.outcome))
        .max_by_key(|l| l.created)
        .and_then(|l| l.outcome);

    let mut scaling = (
        true,
        PolicyReason::Steady,
        "supply matches demand".to_owned(),
    );
    match (&resolved, &scale.decision) {
        (None, _) => {
            scaling = (
                false,
                PolicyReason::Steady,
                "nothing is created while the policy is not Ready".into(),
            );
        }
        (Some(_), ScaleDecision::Up { .. }) if degraded => {
            scaling = (
                false,
                PolicyReason::LaunchesFailing,
                "replacements stopped: the policy is Degraded until its spec changes".into(),
            );
        }
        (Some(r), ScaleDecision::Up { create }) => {
            tracing::debug!(
                policy = name,
                desired = scale.desired,
                create = *create,
                pending_jobs,
                "scaling up"
            );
            let gate = resume_at(
                &history,
                failures,
                ctx.settings.replacement_backoff,
                ctx.settings.replacement_backoff_max,
            );
            if let Some(at) = gate.filter(|at| *at > now) {
                scaling = (
                    true,
                    PolicyReason::ScalingUp,
                    format!(
                        "{failures} launch(es) failed in a row; next replacement after {at} (backoff)"
                    ),
                );
            } else {
                scaling = create_attempts(ctx, placement, policy, r, *create, &history, now).await;
            }
        }
        (Some(_), ScaleDecision::Down { idle }) => {
            let mut asked = 0;
            for victim in idle {
                let Some(a) = attempts
                    .iter()
                    .find(|a| a.metadata.name.as_deref() == Some(victim))
                else {
                    continue;
                };
                let client = resolved.as_ref().map(|r| r.client.as_ref());
                if terminate(ctx, mem, client, a, TerminationReason::ScaleDown, now).await
                    == Terminated::Requested
                {
                    asked += 1;
                }
            }
            scaling = (
                true,
                PolicyReason::ScalingDown,
                format!("{asked} idle runner(s) deregistered and asked to stop"),
            );
        }
        (Some(_), ScaleDecision::AtMaxRunners) => {
            scaling = (
                true,
                PolicyReason::AtMaxRunners,
                format!("at spec.maxRunners ({})", policy.spec.max_runners),
            );
        }
        (Some(_), ScaleDecision::Steady) => {}
    }

    let client = resolved.as_ref().map(|r| r.client.clone());
    // A cordoned node keeps its busy runners until their jobs end; its idle ones are
    // deregistered and stopped now (DESIGN §11), and demand places their successors elsewhere.
    for (a, view) in attempts.iter().zip(&attempt_views) {
        if view.state == AttemptState::Idle
            && !view.termination_requested
            && cordoned.contains(a.spec.node_name.as_str())
        {
            terminate(
                ctx,
                mem,
                client.as_deref(),
                a,
                TerminationReason::Drain,
                now,
            )
            .await;
        }
    }

    // Timeouts that need a deregistration, and attempts a person deleted.
    for a in attempts {
        let reason = match due(
            a,
            now,
            ctx.settings.admission_timeout,
            None,
            ctx.settings.node_lost_grace,
        ) {
            Some(Due::Terminate(r)) => Some(r),
            _ => {
                let state = state_of(a);
                (a.metadata.deletion_timestamp.is_some()
                    && a.spec.termination.is_none()
                    && state.is_live()
                    && state != AttemptState::Busy)
                    .then_some(TerminationReason::Deleted)
            }
        };
        if let Some(reason) = reason {
            terminate(ctx, mem, client.as_deref(), a, reason, now).await;
        }
    }

    // Status: the leader's own fields, written only when they change.
    let mut next = old.clone();
    next.observed_generation = Some(generation);
    next.desired = scale.desired;
    next.starting = scale.counts.starting;
    next.idle = scale.counts.idle;
    next.busy = scale.counts.busy;
    next.cleaning = scale.counts.cleaning + scale.counts.terminating;
    if let Some(r) = &resolved {
        next.runner_group_id = Some(r.runner_group_id);
        next.runner_version = Some(r.package.version.clone());
    }
    if next.desired != old.desired {
        next.last_scale_time = Some(Time(now));
    }
    ctx.metrics.policy(
        ns,
        name,
        crate::metrics::PolicyGauges {
            desired: next.desired,
            starting: next.starting,
            idle: next.idle,
            busy: next.busy,
            pending_jobs,
            min: policy.spec.min_idle,
            max: policy.spec.max_runners,
        },
    );
    let ready = match mem.resolved.as_ref().map(|e| &e.result) {
        Some(Ok(r)) => cond(
            PolicyConditionType::Ready,
            true,
            PolicyReason::Valid,
            format!("valid; runner {} pinned", r.package.version),
            generation,
            now,
        ),
        Some(Err(i)) => cond(
            PolicyConditionType::Ready,
            false,
            i.reason,
            i.message.clone(),
            generation,
            now,
        ),
        None => cond(
            PolicyConditionType::Ready,
            false,
            PolicyReason::GitHubUnreachable,
            "not resolved yet".into(),
            generation,
            now,
        ),
    };
    upsert(&mut next.conditions, ready);
    upsert(
        &mut next.conditions,
        cond(
            PolicyConditionType::Scaling,
            scaling.0,
            scaling.1,
            scaling.2,
            generation,
            now,
        ),
    );
    let degraded_cond = if degraded {
        cond(
            PolicyConditionType::Degraded,
            true,
            PolicyReason::LaunchesFailing,
            format!(
                "{failures} consecutive launches failed (last: {}); no replacements until spec changes",
                last_failure.map_or_else(
                    || "unknown".to_owned(),
                    |o| {
                        serde_json::to_value(o)
                            .ok()
                            .and_then(|v| {
                                v.get("reason").and_then(Value::as_str).map(str::to_owned)
                            })
                            .unwrap_or_default()
                    }
                )
            ),
            generation,
            now,
        )
    } else {
        cond(
            PolicyConditionType::Degraded,
            false,
            PolicyReason::Healthy,
            "launches succeed".into(),
            generation,
            now,
        )
    };
    let newly_degraded = degraded
        && !old
            .conditions
            .iter()
            .any(|c| c.type_ == PolicyConditionType::Degraded && c.status == ConditionStatus::True);
    upsert(&mut next.conditions, degraded_cond);
    let conflict_cond = conflict_condition(conflicts, generation, now);
    let newly_conflicting = !conflicts.is_empty()
        && !old
            .conditions
            .iter()
            .any(|c| c.type_ == PolicyConditionType::Conflict && c.status == ConditionStatus::True);
    if newly_conflicting {
        ctx.events.publish(
            &policy.object_ref(&()),
            Reason::TargetConflict,
            conflict_cond.message.clone(),
        );
    }
    upsert(&mut next.conditions, conflict_cond);
    if newly_degraded {
        ctx.events.publish(
            &policy.object_ref(&()),
            Reason::Degraded,
            format!("{failures} consecutive launches failed; replacements stopped"),
        );
    }
    if next != old {
        let _ = ctx
            .writer
            .policy_status(ns, name, status_fields(&next))
            .await;
    }
}

/// How many conflicting policies a message names before it says "and N more".
const CONFLICTS_NAMED: usize = 5;

/// The `Conflict` condition: True naming the other namespaces' policies on the same target.
/// Pure.
pub fn conflict_condition(conflicts: &[String], generation: i64, now: Timestamp) -> Cond {
    if conflicts.is_empty() {
        return cond(
            PolicyConditionType::Conflict,
            false,
            PolicyReason::NoConflict,
            "no other namespace names this target".into(),
            generation,
            now,
        );
    }
    let mut named = conflicts
        .iter()
        .take(CONFLICTS_NAMED)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if conflicts.len() > CONFLICTS_NAMED {
        named.push_str(&format!(" and {} more", conflicts.len() - CONFLICTS_NAMED));
    }
    cond(
        PolicyConditionType::Conflict,
        true,
        PolicyReason::TargetClaimedElsewhere,
        format!(
            "spec.github.url: the same target is named by {named} in another namespace; jobs go \
             only to Ready policies whose credentials were proven on it. If that namespace should \
             not serve this owner, ask the cluster admin to bind the owner to this namespace \
             (--owner-namespaces)"
        ),
        generation,
        now,
    )
}

/// The status fields the leader owns (never `pendingJobs`).
fn status_fields(s: &ScalePolicyStatus) -> Value {
    let mut v = serde_json::to_value(s).unwrap_or(Value::Null);
    if let Some(o) = v.as_object_mut() {
        o.remove("pendingJobs");
        // Counts that are zero are skipped by nothing; absent optional fields stay absent.
    }
    v
}

/// Create up to `create` attempts. Nodes are chosen one by one under the placement worker's
/// lock and each choice is recorded as an expectation before its create is sent, so the lock is
/// released before the creates, which go out at once (a burst of 50 does not wait on 50
/// sequential round trips). A create that fails forgets its expectation; the next pass retries.
#[allow(clippy::too_many_arguments)]
async fn create_attempts(
    ctx: &Ctx,
    placement: &Mutex<PlacementWorker>,
    policy: &ScalePolicy,
    resolved: &Resolved,
    create: u32,
    history: &[Launch<'_>],
    now: Timestamp,
) -> (bool, PolicyReason, String) {
    let uid = policy.metadata.uid.clone().unwrap_or_default();
    let pinned = Pinned {
        runner_group_id: resolved.runner_group_id,
        package: &resolved.package,
        env: &resolved.env,
    };
    let mut lineage = lineages(history).into_iter();
    let mut planned = Vec::new();
    let mut unplaceable = None;
    {
        let mut placement = placement.lock().await;
        let nodes = ctx.caches.nodes.state();
        let leases = ctx.caches.leases.state();
        let all_attempts = ctx.caches.attempts.state();
        let mut facts = node_facts(
            &nodes.iter().map(AsRef::as_ref).collect::<Vec<_>>(),
            &leases.iter().map(AsRef::as_ref).collect::<Vec<_>>(),
            &all_attempts.iter().map(AsRef::as_ref).collect::<Vec<_>>(),
            now,
            ctx.settings.max_runners_per_node,
        );
        for _ in 0..create {
            let node = match placement.choose(
                &facts,
                &policy.spec.node_selector,
                &uid,
                &resolved.package.sha256,
                now,
            ) {
                Ok(n) => n,
                Err(why) => {
                    unplaceable = Some(why);
                    break;
                }
            };
            let replaces = lineage.next().map(str::to_owned);
            let Some(attempt) = build(
                policy,
                &pinned,
                uuid::Uuid::new_v4(),
                &node,
                replaces.clone(),
            ) else {
                return (
                    false,
                    PolicyReason::InvalidSpec,
                    "spec.github.url cannot be parsed".into(),
                );
            };
            let name = attempt.metadata.name.clone().unwrap_or_default();
            placement.created(&name, &node, now);
            if let Some(f) = facts.iter_mut().find(|f| f.name == node) {
                f.counted.insert(name);
            }
            planned.push((attempt, node, replaces));
        }
    }
    tracing::debug!(
        planned = planned.len(),
        create,
        unplaceable = unplaceable.as_ref().map_or("", |w| w.as_str()),
        "placed"
    );
    let results: Vec<_> = futures_util::stream::iter(planned)
        .map(|(attempt, node, replaces)| async move {
            let result = ctx.writer.create_attempt(&attempt).await;
            (attempt, node, replaces, result)
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect()
        .await;
    let mut created = 0;
    for (attempt, node, replaces, result) in results {
        match result {
            Ok(done) => {
                created += 1;
                ctx.metrics.attempt_created(if replaces.is_some() {
                    "replacement"
                } else {
                    "scale_up"
                });
                let note = match &replaces {
                    Some(old) => format!("created on node {node}, replacing {old}"),
                    None => format!("created on node {node}"),
                };
                ctx.events
                    .publish(&done.object_ref(&()), Reason::AttemptCreated, note);
            }
            Err(e) => {
                tracing::warn!(error = %e, "creating an attempt failed; the next pass retries");
                placement
                    .lock()
                    .await
                    .forget(attempt.metadata.name.as_deref().unwrap_or_default());
            }
        }
    }
    if let Some(why) = unplaceable {
        ctx.metrics.placement_failure(why.as_str());
        if created == 0 {
            ctx.events.publish(
                &policy.object_ref(&()),
                Reason::Unplaceable,
                why.message().into(),
            );
        }
        return (false, why.reason(), why.message().to_owned());
    }
    (
        true,
        PolicyReason::ScalingUp,
        format!("{created} attempt(s) created toward {create}"),
    )
}

/// A policy being deleted: idle and starting runners are deregistered and asked to stop, busy
/// ones finish their job, `Cleaned` attempts are deleted, and the finalizer goes when none is
/// left.
async fn drain(
    ctx: &Ctx,
    mem: &PolicyMemory,
    policy: &ScalePolicy,
    attempts: &[Arc<RunnerAttempt>],
    now: Timestamp,
) {
    let ns = policy.metadata.namespace.as_deref().unwrap_or_default();
    let client = mem
        .resolved
        .as_ref()
        .and_then(|e| e.result.as_ref().ok())
        .map(|r| r.client.clone());
    for a in attempts {
        let state = state_of(a);
        let name = a.metadata.name.as_deref().unwrap_or_default();
        if state == AttemptState::Cleaned {
            if a.metadata.deletion_timestamp.is_none() {
                let _ = ctx.writer.delete_attempt(ns, name).await;
            }
            continue;
        }
        if a.spec.termination.is_none()
            && state != AttemptState::Busy
            && (state.is_live() || state == AttemptState::Pending)
        {
            terminate(
                ctx,
                mem,
                client.as_deref(),
                a,
                TerminationReason::PolicyDeleted,
                now,
            )
            .await;
        }
    }
    if attempts.is_empty() {
        let rest: Vec<String> = policy
            .metadata
            .finalizers
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|f| f != POLICY_FINALIZER)
            .collect();
        if rest.len() != policy.metadata.finalizers.as_ref().map_or(0, Vec::len) {
            ctx.events.publish(
                &policy.object_ref(&()),
                Reason::Drained,
                "every attempt is gone; the policy is released".into(),
            );
            let _ = ctx.writer.policy_finalizers(policy, rest).await;
        }
    }
}
