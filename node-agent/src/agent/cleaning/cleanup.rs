//! Cleanup of a concluded attempt, in order (lifecycle spec §2.5): anything of the runner still
//! running is stopped and proven gone (a pid whose start time changed is never signalled: the
//! launcher stops by cgroup or unit); the redacted diagnostics; the workspace (ephemeral
//! removed whole, persistent scrubbed by the seven checks); the package lease and the account;
//! then `Cleaned`. Each step is idempotent, so a crash anywhere is finished by the next pass.
//!
//! An OCI attempt is torn down first (DESIGN §3): `Destroying` is journalled, then every runner
//! pod of the attempt's generation is deleted and proven gone (the journalled one, and one an
//! interrupted preparation created before its identity was journalled); a pod that will not go
//! journals `CleanupDeferred` and is tried again with backoff. Only then the workspace, and
//! `Cleaned` from `Destroying`. Pods of another generation are not ours and are left alone.

use crate::agent::attempt_ctx::Attempts;
use runner_manager_crds::attempt::{
    AttemptConditionType, AttemptJournal, AttemptReason, RunnerAttempt, StartedIdentity, Transition,
};
use runner_manager_crds::conditions::ConditionStatus;
use runner_manager_crds::policy::WorkspaceMode;
use runner_manager_crds::state::AttemptState;

use crate::agent::attempt_ctx::{Step, StepError, names, runtime_of, take, uuid_of};
use crate::agent::conditions;
use crate::agent::events::{self, EventReason};
use crate::agent::fault::{self, Boundary};
use crate::agent::node::Agent;
use crate::agent::rebuild::journal_of;
use crate::providers::provider::ProviderError;
use crate::providers::{Provider, RunnerRef};
use crate::workspace::ephemeral::{EphemeralError, remove_ephemeral_runtime};
use crate::workspace::scrub::scrub_slot;
use crate::workspace::scrub_plan::SlotOwner;
use crate::workspace::slot_table::SlotKey;

/// `<hostRoot>/diagnostics/<attempt>.log`: ids and kinds only, never runner output.
pub fn diagnostics(a: &RunnerAttempt, journal: &AttemptJournal) -> String {
    let outcome = journal.outcome();
    format!(
        "attempt={}/{} id={} node={} runner_id={} state={:?} outcome={:?} launcher={:?}\n",
        a.metadata.namespace.as_deref().unwrap_or_default(),
        a.metadata.name.as_deref().unwrap_or_default(),
        a.spec.id,
        a.spec.node_name,
        journal.runner().map(|r| r.id).unwrap_or_default(),
        journal.state(),
        outcome,
        journal.process().map(|p| p.launcher),
    )
}

pub async fn clean(agent: &Agent, api: &Attempts, a: &RunnerAttempt) -> Result<Step, StepError> {
    let (uid, name, ns) = names(a)?;
    let journal = journal_of(a);
    let runtime = runtime_of(&journal);

    // 0. A destruction the provider journals (OCI: every runner pod of the generation) goes
    //    first, under `Destroying`.
    let provider = agent.providers.of(a.spec.snapshot.execution.mode);
    let leftover = provider.leftover(a, &journal, runtime.as_deref());
    if provider.journals_destruction()
        && let Some(step) = destroy_journalled(
            agent,
            api,
            a,
            &journal,
            provider,
            leftover.as_ref(),
            &uid,
            &name,
            &ns,
        )
        .await?
    {
        return Ok(step);
    }

    // 1. Nothing of the runner may outlive its cleanup (native: the journalled process, or the
    //    one whose identity reached the host before a crash journalled it).
    if !provider.journals_destruction()
        && let Some(identity) = &leftover
        && let Err(e) = provider
            .destroy(RunnerRef {
                namespace: &ns,
                identity,
            })
            .await
    {
        agent.metrics().cleanup_deferred();
        tracing::warn!(namespace = %ns, attempt = %name, "cleanup deferred: the runner is not proven stopped: {e}");
        return Ok(Step::Wait);
    }

    // 1b. A runner started ahead of its JIT that never became the journalled one (its JIT
    //     refused, its launch failed, the agent crashed before `Starting`): stopped by the
    //     attempt's name. Only a launch that placed a workspace can have started one.
    if leftover.is_none()
        && journal.workspace().is_some()
        && let Err(e) = provider.abandon(uuid_of(a)?).await
    {
        agent.metrics().cleanup_deferred();
        tracing::warn!(namespace = %ns, attempt = %name, "cleanup deferred: the runner started ahead of its JIT is not proven stopped: {e}");
        return Ok(Step::Wait);
    }

    // The runner is gone: so is its job gate, and its cache is committed (a trusted job's) or
    // discarded.
    agent.host.job_gates.close(a);
    crate::agent::caches::release(agent, a).await;
    // Its Docker engine (`spec.docker`), with every container the job left running: proven
    // stopped before its directory goes, and before the runtime it may have mounted.
    if let Err(e) = crate::agent::docker::release(agent, a).await {
        agent.metrics().cleanup_deferred();
        tracing::warn!(namespace = %ns, attempt = %name, "cleanup deferred: {e}");
        return Ok(Step::Wait);
    }

    // 2. Redacted diagnostics.
    if let Err(e) = crate::durable::write_file(
        &agent.host.root.join("diagnostics"),
        &format!("{name}.log"),
        diagnostics(a, &journal).as_bytes(),
    ) {
        tracing::warn!(namespace = %ns, attempt = %name, "diagnostics not written ({:?})", e.kind());
    }

    // 3. The workspace, dispatched on the journalled kind. A failure is retried with backoff
    // (30 s doubling to 15 min), not at the supervision interval: a quarantined slot waits for a
    // person, a tree that failed to go will most likely fail again at once (and each try walks
    // what is left), and hammering either would repeat its event.
    if let Some(w) = journal.workspace() {
        if !agent.cleanup_backoff().due(&uid, std::time::Instant::now()) {
            return Ok(Step::Wait);
        }
        let (condition, done) = match w.kind() {
            WorkspaceMode::Ephemeral => (
                AttemptConditionType::CleanupDeferred,
                remove_ephemeral_runtime(&agent.host.root, uuid_of(a)?, w.runtime_path())
                    .map(|_| "the ephemeral runtime was removed")
                    .map_err(|e| Unfinished {
                        reason: match e {
                            EphemeralError::NotTheDerivedPath { .. } | EphemeralError::Root(_) => {
                                AttemptReason::OwnershipUnproven
                            }
                            _ => AttemptReason::DeletionFailed,
                        },
                        log: format!("cleanup deferred: {e}"),
                        event: format!("the ephemeral runtime was not removed: {e}"),
                        message: e.to_string(),
                    }),
            ),
            WorkspaceMode::Persistent => {
                let owner = SlotOwner {
                    namespace: &ns,
                    policy_uid: &a.spec.snapshot.policy_uid,
                };
                (
                    AttemptConditionType::Quarantined,
                    scrub_slot(w, &agent.host.slots_root, owner)
                        .map(|_| "the slot passed every cleanup check")
                        .map_err(|q| Unfinished {
                            reason: q.refusal.reason(),
                            log: format!("slot quarantined ({})", q.refusal.event_class()),
                            event: format!("the persistent slot was quarantined: {q}"),
                            message: q.to_string(),
                        }),
                )
            }
        };
        match done {
            Err(unfinished) => {
                let retry = agent
                    .cleanup_backoff()
                    .failed(&uid, std::time::Instant::now());
                match condition {
                    AttemptConditionType::Quarantined => agent.metrics().quarantined(),
                    _ => agent.metrics().cleanup_deferred(),
                }
                tracing::warn!(
                    namespace = %ns, attempt = %name, "{}; next try in {}s",
                    unfinished.log,
                    retry.as_secs()
                );
                let newly = conditions::set(
                    api,
                    a,
                    condition,
                    ConditionStatus::True,
                    unfinished.reason,
                    unfinished.message,
                )
                .await?;
                if newly {
                    events::warn(agent, a, EventReason::CleanupDeferred, unfinished.event).await;
                }
                return Ok(Step::Wait);
            }
            Ok(resolved) => {
                agent.cleanup_backoff().succeeded(&uid);
                if conditions::holds(a, condition) {
                    conditions::set(
                        api,
                        a,
                        condition,
                        ConditionStatus::False,
                        AttemptReason::Resolved,
                        resolved.to_owned(),
                    )
                    .await?;
                    // The condition write moved the resourceVersion: decide again.
                    return Ok(Step::Again);
                }
            }
        }
    }
    fault::at(Boundary::MidCleanup);

    // 3b. The runner's placeholder pod: the runner is stopped and its workspace gone.
    agent
        .placeholder_after_cleanup(a)
        .await
        .map_err(|e| StepError::Local(e.to_string()))?;

    // 4. Leases, then `Cleaned`.
    agent.host.packages.release(&uid);
    let state = journal.state();
    let cleanable = if provider.journals_destruction() {
        // Cleaned only from `Destroying`: what the provider made is proven gone.
        state == AttemptState::Destroying
    } else {
        state.is_concluded()
    };
    if cleanable {
        take(api, &name, state, Transition::Clean).await?;
    }
    if w_is_slot(&journal) {
        agent.slots().release(
            &SlotKey {
                namespace: ns.clone(),
                policy_uid: a.spec.snapshot.policy_uid.clone(),
            },
            &name,
        );
    }
    agent.accounts().release(&uid);
    agent.book().forget(&uid);
    tracing::info!(namespace = %ns, attempt = %name, "cleaned");
    Ok(if state == AttemptState::Cleaned {
        Step::Done
    } else {
        Step::Again
    })
}

/// A workspace cleanup that did not finish: the condition's reason and message, the log line and
/// the event (each says what the removal or scrub said, never a workflow's names).
struct Unfinished {
    reason: AttemptReason,
    message: String,
    log: String,
    event: String,
}

fn w_is_slot(journal: &AttemptJournal) -> bool {
    journal
        .workspace()
        .is_some_and(|w| w.kind() == WorkspaceMode::Persistent)
}

/// (A journalled destruction: OCI) Concluded or deferred → `Destroying`; in `Destroying`, what
/// the provider made for the runner (every pod of the attempt's generation) destroyed and proven
/// gone, or `CleanupDeferred` (with its condition and event) and a retry with backoff. `None`:
/// it is gone and cleanup goes on in `Destroying`.
#[allow(clippy::too_many_arguments)]
async fn destroy_journalled(
    agent: &Agent,
    api: &Attempts,
    a: &RunnerAttempt,
    journal: &AttemptJournal,
    provider: &dyn Provider,
    leftover: Option<&StartedIdentity>,
    uid: &str,
    name: &str,
    ns: &str,
) -> Result<Option<Step>, StepError> {
    let state = journal.state();
    if state.is_concluded() || state == AttemptState::CleanupDeferred {
        if state == AttemptState::CleanupDeferred
            && !agent.cleanup_backoff().due(uid, std::time::Instant::now())
        {
            return Ok(Some(Step::Wait));
        }
        take(api, name, state, Transition::BeginDestroy).await?;
        return Ok(Some(Step::Again));
    }
    if state != AttemptState::Destroying {
        return Ok(None);
    }
    let destroyed = match leftover {
        Some(identity) => {
            provider
                .destroy(RunnerRef {
                    namespace: ns,
                    identity,
                })
                .await
        }
        None => Err(ProviderError::Unnamed),
    };
    match destroyed {
        Ok(()) => {
            agent.cleanup_backoff().succeeded(uid);
            if conditions::holds(a, AttemptConditionType::CleanupDeferred) {
                conditions::set(
                    api,
                    a,
                    AttemptConditionType::CleanupDeferred,
                    ConditionStatus::False,
                    AttemptReason::Resolved,
                    "the runner pod is gone".to_owned(),
                )
                .await?;
                return Ok(Some(Step::Again));
            }
            Ok(None)
        }
        Err(e) => {
            let retry = agent
                .cleanup_backoff()
                .failed(uid, std::time::Instant::now());
            agent.metrics().cleanup_deferred();
            tracing::warn!(
                namespace = %ns, attempt = %name, "cleanup deferred: the runner pod is not proven gone ({e}); next try in {}s",
                retry.as_secs()
            );
            let newly = conditions::set(
                api,
                a,
                AttemptConditionType::CleanupDeferred,
                ConditionStatus::True,
                // A pod of another generation is not ours to remove: it waits for its owner's
                // garbage collection or a person (parity row 15).
                if e.ownership_unproven() {
                    AttemptReason::OwnershipUnproven
                } else {
                    AttemptReason::ProviderResourceRemains
                },
                format!("the runner pod is not proven gone: {e}"),
            )
            .await?;
            if newly {
                events::warn(
                    agent,
                    a,
                    EventReason::CleanupDeferred,
                    format!("the runner pod is not proven gone: {e}"),
                )
                .await;
            }
            take(
                api,
                name,
                AttemptState::Destroying,
                Transition::DeferCleanup,
            )
            .await?;
            Ok(Some(Step::Wait))
        }
    }
}

#[cfg(test)]
mod scripted_tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use runner_manager_crds::attempt::WorkspacePlacement;
    use runner_manager_crds::fixtures::{AttemptBuilder, at};
    use runner_manager_crds::outcome::{FailureReason, Outcome};
    use runner_manager_crds::state::Actor;

    use super::*;
    use crate::agent::scripted;
    use crate::workspace::ephemeral::ephemeral_runtime_path;

    /// `web-1`, native and ephemeral, admitted into `runtime` and concluded before its start
    /// (its preparation interrupted): a runtime to remove and no runner to stop.
    fn concluded_in(runtime: &Path) -> RunnerAttempt {
        let mut a = AttemptBuilder::new("web-1", "web")
            .namespace("team")
            .uid("u-1")
            .resource_version("7")
            .build();
        let kind = a.spec.snapshot.kind();
        let journal = [
            Transition::Admit {
                placement: WorkspacePlacement::ephemeral(runtime.display().to_string()),
                spec_hash: "hash".into(),
            },
            Transition::Conclude(Outcome::Failed(FailureReason::PreparationInterrupted)),
        ]
        .into_iter()
        .try_fold(AttemptJournal::default(), |j, t| {
            j.apply(Actor::Agent, kind, t, at(100))
        })
        .unwrap_or_else(|e| panic!("{e:?}"));
        a.status = Some(runner_manager_crds::attempt::RunnerAttemptStatus {
            journal,
            ..Default::default()
        });
        a
    }

    use std::path::Path;

    /// The cleanup of `a` on a scripted agent whose API server answers every read with `a`
    /// and every write with `a` too; also whether the runtime was still there when the first
    /// status write arrived.
    async fn clean_against(
        root: &Path,
        a: &RunnerAttempt,
        runtime: &Path,
    ) -> (Result<Step, StepError>, scripted::Recorded, bool) {
        let there_at_write = Arc::new(AtomicBool::new(false));
        let (seen_there, watched, body) = (
            Arc::clone(&there_at_write),
            runtime.to_owned(),
            serde_json::to_value(a).unwrap_or_default(),
        );
        let (kube, seen) = scripted::client(move |req| {
            if req.method == "PATCH" && req.path.ends_with("/status") && !req.is_event() {
                seen_there.fetch_or(watched.exists(), Ordering::SeqCst);
            }
            (200, body.clone())
        });
        let agent = scripted::agent(kube, root);
        let api = agent.cluster.attempts.in_namespace("team");
        let step = clean(&agent, &api, a).await;
        (step, seen, there_at_write.load(Ordering::SeqCst))
    }

    /// Against a scripted API server: an ephemeral runtime is removed whole before `Cleaned`
    /// is written, and `Cleaned` is the one write (a CAS on the version read).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_runtime_is_removed_before_cleaned_is_written() {
        let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let host_root = root.path().join("host");
        let runtime = ephemeral_runtime_path(
            &host_root,
            uuid::Uuid::parse_str("01234567-89ab-4def-8123-456789abcdef")
                .unwrap_or_else(|e| panic!("{e}")),
        );
        std::fs::create_dir_all(runtime.join("_work")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(runtime.join("_work/left.txt"), b"x").unwrap_or_else(|e| panic!("{e}"));
        let a = concluded_in(&runtime);
        let (step, seen, there) = clean_against(root.path(), &a, &runtime).await;
        assert!(matches!(step, Ok(Step::Again)), "{step:?}");
        assert!(!runtime.exists(), "the runtime is gone");
        assert!(!there, "the runtime was gone before the status write");
        assert_eq!(seen.changes(), ["PATCH runnerattempts/web-1/status"]);
        let body = seen.body_of("PATCH runnerattempts/web-1/status");
        assert_eq!(body["status"]["state"], "Cleaned", "{body}");
        assert_eq!(body["metadata"]["resourceVersion"], "7", "{body}");
    }

    /// A journalled runtime that is not the path the agent derives for the attempt (an edited
    /// status) is not removed, `Cleaned` is not written, and the deferral is said on the
    /// attempt: the one status write is the `CleanupDeferred` condition, naming ownership.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_runtime_that_is_not_the_derived_path_is_left_and_cleaned_is_not_written() {
        let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let elsewhere = root.path().join("precious");
        std::fs::create_dir_all(&elsewhere).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(elsewhere.join("keep.txt"), b"x").unwrap_or_else(|e| panic!("{e}"));
        let a = concluded_in(&elsewhere);
        let (step, seen, _) = clean_against(root.path(), &a, &elsewhere).await;
        assert!(matches!(step, Ok(Step::Wait)), "{step:?}");
        assert!(elsewhere.join("keep.txt").exists(), "nothing removed");
        assert_eq!(seen.changes(), ["PATCH runnerattempts/web-1/status"]);
        let body = seen.body_of("PATCH runnerattempts/web-1/status");
        let text = body.to_string();
        assert!(
            text.contains("CleanupDeferred") && text.contains("OwnershipUnproven"),
            "{text}"
        );
        assert!(!text.contains("\"Cleaned\""), "{text}");
    }
}
