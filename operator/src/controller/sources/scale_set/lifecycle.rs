//! The end of a policy's runner scale set (issue 19; docs/demand-modes.md, "Lifecycle"): the
//! set is registered on GitHub by the listener, so it outlives the operator's memory; its
//! deletion goes through the policy's finalizer [`SCALE_SET_FINALIZER`], which the listener adds
//! before the set is created.
//!
//! The leader deletes the set (its recorded session first, then every set of the policy's name:
//! the recorded id and any found by name, so a set created but never recorded goes too) when
//! - the policy is being deleted and every attempt of it is gone (drained: no runner of the set
//!   is still running a job), or
//! - the policy left the scale-set mode and no attempt minted through the set is left.
//!
//! Only then is the finalizer removed (and, for a mode switch, the set's annotations); a GitHub
//! outage backs off (1 s doubling to 5 min) and keeps the finalizer, and a restart or failover
//! finds the finalizer and deletes on its next pass. A set GitHub no longer has (404) is gone.
//! A credentials Secret that is gone (a namespace being deleted takes it with the policy) can
//! never delete anything: the finalizer is released with a warning, the set left on GitHub.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kube::Resource;
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::policy::{DemandMode, ScalePolicy, scale_set_name};
use runner_manager_crds::state::AttemptState;
use tokio::time::Instant;

use crate::controller::Ctx;
use crate::controller::events::Reason;
use crate::github::scaleset::{ScaleSetError, Session};

/// Where the live session's id is recorded on the policy.
pub const SESSION_ANNOTATION: &str = "runner-manager.dev/scale-set-session";
/// Where the policy's scale-set id is recorded (its deletion needs no lookup by name).
pub const SET_ID_ANNOTATION: &str = "runner-manager.dev/scale-set-id";
/// Held by a `ScaleSet` policy from before its scale set is created until the set is deleted.
pub const SCALE_SET_FINALIZER: &str = "runner-manager.dev/scale-set";

const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Why the set goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retire {
    /// The policy is being deleted and drained.
    Deleted,
    /// The policy's demand mode is no longer `ScaleSet`.
    LeftMode,
}

/// Whether the policy holds [`SCALE_SET_FINALIZER`] (only then can it have a set to delete).
fn holds_set_finalizer(policy: &ScalePolicy) -> bool {
    policy
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == SCALE_SET_FINALIZER))
}

/// Whether the policy's scale set should be deleted now, given the policy's attempts. Pure.
pub fn retirement(policy: &ScalePolicy, attempts: &[&RunnerAttempt]) -> Option<Retire> {
    if !holds_set_finalizer(policy) {
        return None;
    }
    if policy.metadata.deletion_timestamp.is_some() {
        // Drained first: a busy runner of the set finishes its job before the set goes.
        return attempts.is_empty().then_some(Retire::Deleted);
    }
    if policy.spec.github.demand == DemandMode::ScaleSet {
        return None;
    }
    let minted_through_set = attempts
        .iter()
        .any(|a| a.spec.snapshot.scale_set.is_some() && a.state() != AttemptState::Cleaned);
    (!minted_through_set).then_some(Retire::LeftMode)
}

/// Why a deletion did not happen (yet).
#[derive(Debug, thiserror::Error)]
enum RetireError {
    #[error("reading the credentials Secret: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Client(#[from] crate::github::registry::ClientError),
    #[error(transparent)]
    ScaleSet(#[from] ScaleSetError),
}

/// Run until dropped (with the leader's controllers): every resync interval, delete the scale
/// sets of the policies [`retirement`] names.
pub async fn run(ctx: Arc<Ctx>) {
    if !ctx.caches.ready().await {
        return;
    }
    // Per policy uid: when the next try is due and the wait after it.
    let mut backoff: HashMap<String, (Instant, Duration)> = HashMap::new();
    loop {
        let attempts = ctx.caches.attempts.state();
        let policies = ctx.caches.policies.state();
        // Only a policy holding the set's finalizer has a set to delete: the attempts are
        // scanned for those alone. Scanning them for every policy was quadratic (10,000,000
        // string comparisons per resync at 1,000 policies and 10,000 attempts, ~20 % of the
        // leader's CPU in a fresh install's first pass), and this loop shares its task with
        // the policy Controller, whose reconciles wait while it runs.
        for policy in policies.iter().filter(|p| holds_set_finalizer(p)) {
            let ns = policy.metadata.namespace.as_deref().unwrap_or_default();
            let name = policy.metadata.name.as_deref().unwrap_or_default();
            let mine: Vec<&RunnerAttempt> = attempts
                .iter()
                .filter(|a| a.metadata.namespace.as_deref() == Some(ns) && a.spec.policy == name)
                .map(AsRef::as_ref)
                .collect();
            let Some(why) = retirement(policy, &mine) else {
                continue;
            };
            let uid = policy.metadata.uid.clone().unwrap_or_default();
            if backoff
                .get(&uid)
                .is_some_and(|(at, _)| Instant::now() < *at)
            {
                continue;
            }
            match retire(&ctx, policy, why).await {
                Ok(()) => {
                    backoff.remove(&uid);
                }
                Err(e) => {
                    let wait = backoff
                        .get(&uid)
                        .map_or(BACKOFF_FIRST, |(_, w)| (*w * 2).min(BACKOFF_MAX));
                    backoff.insert(uid, (Instant::now() + wait, wait));
                    tracing::warn!(
                        policy.namespace = ns,
                        policy.name = name,
                        error = %e,
                        retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                        "deleting the policy's scale set failed; the finalizer stays"
                    );
                    ctx.events.publish(
                        &policy.object_ref(&()),
                        Reason::ScaleSetDeleteFailed,
                        format!("deleting the runner scale set failed ({e}); trying again"),
                    );
                }
            }
        }
        let live: std::collections::HashSet<String> = policies
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        backoff.retain(|uid, _| live.contains(uid));
        tokio::time::sleep(ctx.settings.resync_interval).await;
    }
}

/// Delete the policy's scale set (and its recorded session), then release the finalizer.
async fn retire(ctx: &Ctx, policy: &ScalePolicy, why: Retire) -> Result<(), RetireError> {
    let ns = policy.metadata.namespace.as_deref().unwrap_or_default();
    let name = policy.metadata.name.as_deref().unwrap_or_default();
    let set_name = scale_set_name(ns, name);
    let secret_name = &policy.spec.github.credentials_secret_ref.name;
    let annotations = policy.metadata.annotations.clone().unwrap_or_default();
    match ctx.clients.secret(ns, secret_name).await? {
        None => {
            tracing::warn!(
                policy.namespace = ns,
                policy.name = name,
                "the credentials Secret is gone: the scale set cannot be deleted and is left on GitHub"
            );
            ctx.events.publish(
                &policy.object_ref(&()),
                Reason::ScaleSetDeleteFailed,
                format!(
                    "credentials Secret {secret_name} is gone: runner scale set {set_name} is left on GitHub"
                ),
            );
        }
        Some(secret) => {
            let gh = ctx
                .clients
                .for_secret(ns, &policy.spec.github.url, &secret)?;
            let client = ctx.clients.scale_set_client(&gh, &set_name);
            // The annotation is the tenant's to edit: an id is used only when GitHub says it is
            // this policy's set (by name), never to delete or end another's.
            let recorded = match annotations
                .get(SET_ID_ANNOTATION)
                .and_then(|v| v.parse::<i64>().ok())
            {
                Some(id) => client.own_scale_set(id, &set_name).await?.map(|s| s.id),
                None => None,
            };
            if let (Some(set), Some(session)) = (recorded, annotations.get(SESSION_ANNOTATION)) {
                let stale = Session {
                    id: session.clone(),
                    queue_url: String::new(),
                    queue_token: String::new().into(),
                    statistics: Default::default(),
                };
                client.delete_session(set, &stale).await?;
            }
            let mut ids: Vec<i64> = recorded.into_iter().collect();
            // A set created but never recorded is found by name (without its runner group,
            // which a deleted policy may no longer resolve); a lookup GitHub refuses outright
            // (a 4xx) cannot find it and must not hold the policy forever.
            match client.find_scale_sets(&set_name, None).await {
                Ok(found) => {
                    for s in found {
                        if !ids.contains(&s.id) {
                            ids.push(s.id);
                        }
                    }
                }
                Err(e) if e.is_retryable() => return Err(e.into()),
                Err(e) => tracing::warn!(
                    policy.namespace = ns,
                    policy.name = name,
                    error = %e,
                    "looking the scale set up by name was refused; deleting the recorded one only"
                ),
            }
            for id in &ids {
                client.delete_scale_set(*id).await?;
            }
            ctx.clients.forget_scale_set(&gh, &set_name);
            tracing::info!(policy.namespace = ns, policy.name = name, sets = ids.len(), reason = ?why, "the policy's scale set is deleted");
            ctx.events.publish(
                &policy.object_ref(&()),
                Reason::ScaleSetDeleted,
                match why {
                    Retire::Deleted => format!("runner scale set {set_name} deleted with the policy"),
                    Retire::LeftMode => format!(
                        "runner scale set {set_name} deleted: the policy left the ScaleSet demand mode"
                    ),
                },
            );
        }
    }
    let rest: Vec<String> = policy
        .metadata
        .finalizers
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f != SCALE_SET_FINALIZER)
        .collect();
    if why == Retire::LeftMode {
        // The set and its session are gone: a later switch back registers a new one.
        ctx.writer
            .policy_annotations(
                ns,
                name,
                &[(SET_ID_ANNOTATION, None), (SESSION_ANNOTATION, None)],
            )
            .await?;
    }
    ctx.writer.policy_finalizers(policy, rest).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_manager_crds::attempt::TargetScope;
    use runner_manager_crds::fixtures::AttemptBuilder;
    use serde_json::Value;
    use serde_json::json;

    fn policy(demand: &str, finalizer: bool, deleting: bool) -> ScalePolicy {
        let mut v = json!({
            "apiVersion": "runner-manager.dev/v1alpha1", "kind": "ScalePolicy",
            "metadata": {"namespace": "t", "name": "p", "uid": "u1"},
            "spec": {
                "github": {"url": "https://github.com/acme", "credentialsSecretRef": {"name": "creds"},
                           "demand": demand},
                "labels": ["self-hosted", "linux"], "maxRunners": 2
            }
        });
        if finalizer {
            v["metadata"]["finalizers"] = json!([SCALE_SET_FINALIZER]);
        }
        if deleting {
            v["metadata"]["deletionTimestamp"] = Value::from("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(v).unwrap()
    }

    fn attempt(scale_set: bool, cleaned: bool) -> RunnerAttempt {
        let mut a = AttemptBuilder::new("p-1", "p")
            .namespace("t")
            .node("n")
            .target("https://github.com/acme", TargetScope::Organization)
            .state(if cleaned {
                AttemptState::Cleaned
            } else {
                AttemptState::Idle
            });
        if scale_set {
            a = a.scale_set("t-p");
        }
        a.build()
    }

    #[test]
    fn a_deleted_policy_keeps_its_set_until_drained() {
        let p = policy("ScaleSet", true, true);
        let a = attempt(true, false);
        assert_eq!(
            retirement(&p, &[&a]),
            None,
            "a runner of the set is still there"
        );
        assert_eq!(retirement(&p, &[]), Some(Retire::Deleted));
        assert_eq!(
            retirement(&policy("ScaleSet", false, true), &[]),
            None,
            "no set was made"
        );
    }

    #[test]
    fn a_policy_that_left_the_mode_deletes_its_set_once_no_runner_of_it_is_left() {
        assert_eq!(retirement(&policy("ScaleSet", true, false), &[]), None);
        let p = policy("Webhook", true, false);
        let live = attempt(true, false);
        let rest = attempt(false, false);
        let cleaned = attempt(true, true);
        assert_eq!(retirement(&p, &[&live]), None);
        assert_eq!(retirement(&p, &[&rest, &cleaned]), Some(Retire::LeftMode));
    }
}
