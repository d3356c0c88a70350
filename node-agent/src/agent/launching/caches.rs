//! The agent's side of a native runner's dependency cache (`spec.caches`,
//! [`crate::caches`]): attached before the JIT is asked for, its variables in the listener's
//! environment, its verdict recorded by the job gate, released once the runner is proven gone.

use std::path::PathBuf;
use std::sync::Arc;

use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::names::short_hex;
use runner_manager_crds::policy::ExecutionMode;

use crate::account::RunnerAccount;
use crate::agent::node::Agent;
use crate::caches::{CacheRoot, Released};

/// The cache root `a`'s gate records its verdict in, when `a` keeps caches.
pub fn verdicts_for(agent: &Agent, a: &RunnerAttempt) -> Option<Arc<CacheRoot>> {
    a.spec
        .snapshot
        .caches
        .as_ref()
        .filter(|_| a.spec.snapshot.execution.mode == ExecutionMode::Native)
        .map(|_| agent.host.caches.clone())
}

/// A mounted cache: its mount point and the variables pointing the tools at it.
#[derive(Debug)]
pub struct Attached {
    pub mount: PathBuf,
    pub environment: Vec<(String, String)>,
}

/// Mounts `a`'s cache for `account` (`None`: the attempt keeps none). A failure fails the launch
/// before its JIT: a runner whose policy keeps caches never runs writing into the node.
pub async fn attach(
    agent: &Agent,
    a: &RunnerAttempt,
    account: RunnerAccount,
) -> Result<Option<Attached>, String> {
    let Some(snapshot) = a.spec.snapshot.caches.clone() else {
        return Ok(None);
    };
    let id = a
        .spec
        .attempt_uuid()
        .ok_or_else(|| "the attempt has no valid id".to_owned())?;
    let caches = agent.host.caches.clone();
    let namespace = snapshot.namespace.clone();
    let mount =
        tokio::task::spawn_blocking(move || caches.attach(&short_hex(id), &namespace, account.uid))
            .await
            .map_err(|e| format!("the cache attach did not finish: {e}"))?
            .map_err(|e| e.to_string())?;
    let environment = runner_manager_crds::caches::cache_environment(
        &snapshot.tools,
        &mount,
        &a.spec.snapshot.env,
    );
    Ok(Some(Attached { mount, environment }))
}

/// Releases `a`'s cache, its runner gone: commits a trusted job's writes, discards the rest,
/// then, after a commit (the only release that grows the caches), prunes them to their cap. A
/// failure is logged; the orphan sweep releases what is left (discarding it).
pub async fn release(agent: &Agent, a: &RunnerAttempt) {
    let Some(id) = a.spec.attempt_uuid() else {
        return;
    };
    let short = short_hex(id);
    if !agent.host.caches.attached(&short) {
        return;
    }
    let ns = a.metadata.namespace.clone().unwrap_or_default();
    let name = a.metadata.name.clone().unwrap_or_default();
    let caches = agent.host.caches.clone();
    let released = tokio::task::spawn_blocking(move || {
        let released = caches.release(&short, true)?;
        // A walk of every cache: only when this release made one larger.
        let pruned = match released {
            Released::Committed { .. } => Some(caches.prune(caches.cap())?),
            _ => None,
        };
        Ok::<_, crate::caches::CacheError>((released, pruned))
    })
    .await;
    match released {
        Ok(Ok((released, pruned))) => {
            match released {
                Released::Committed { generation } => tracing::info!(
                    namespace = %ns, attempt = %name,
                    "cache: the job's writes are generation {generation} of its namespace"
                ),
                Released::Discarded => tracing::info!(
                    namespace = %ns, attempt = %name,
                    "cache: the job's writes were discarded (not trusted to write back)"
                ),
                Released::NotAttached => {}
            }
            if let Some(pruned) = pruned {
                pruned_report(agent, &pruned);
            }
        }
        Ok(Err(e)) => tracing::warn!(
            namespace = %ns, attempt = %name,
            "cache not released (the orphan sweep will discard it): {e}"
        ),
        Err(e) => tracing::warn!(
            namespace = %ns, attempt = %name,
            "cache release did not finish (the orphan sweep will discard it): {e}"
        ),
    }
}

/// Says what a prune removed, and sets the caches' size gauge.
fn pruned_report(agent: &Agent, pruned: &crate::caches::Pruned) {
    agent.metrics().cache_bytes(pruned.bytes);
    if !pruned.removed.is_empty() {
        tracing::info!(
            "cache prune: removed {} namespace(s) over the cap ({} bytes left): {}",
            pruned.removed.len(),
            pruned.bytes,
            pruned.removed.join(", ")
        );
    }
}

/// The periodic prune (from the orphan sweep), when [`crate::caches::PRUNE_INTERVAL`] has
/// passed: a node whose runners stopped releasing caches still gets back under its cap.
/// Blocking.
pub fn prune_if_due(agent: &Agent) {
    if !agent.host.caches.prune_due() {
        return;
    }
    match agent.host.caches.prune(agent.host.caches.cap()) {
        Ok(pruned) => pruned_report(agent, &pruned),
        Err(e) => tracing::warn!("cache prune failed: {e}"),
    }
}
