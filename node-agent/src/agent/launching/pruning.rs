//! Package pruning, once per launch (DESIGN §6: "prune old versions under the allocation lock
//! when nothing leases them"). After a launch's package is materialized and leased, every
//! other installed version is removed unless an attempt of this node still wants it (any
//! attempt not yet `Cleaned`, `Pending` ones included, so a version about to be leased is
//! kept), an attempt leases it, or this agent leased it within [`RECENT`]. A failed prune only
//! warns (`package prune failed`); it never fails the launch.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::agent::node::Agent;

/// How long a version this agent used stays through a prune with no attempt wanting it: two
/// policies pinned to different versions, launching in turns, would otherwise evict each
/// other's version (and download it again) at every launch.
pub const RECENT: Duration = Duration::from_secs(3600);

pub use crate::agent::labels::PruneResult;

/// The versions a prune keeps: `current` (the launch's), every version an attempt of the node
/// wants, and those this agent used since `recent`. Pure.
pub fn keep(current: &str, wanted: &BTreeSet<String>, recent: &[String]) -> BTreeSet<String> {
    let mut keep: BTreeSet<String> = wanted.clone();
    keep.insert(current.to_owned());
    keep.extend(recent.iter().cloned());
    keep
}

/// Prunes under the allocation lock, after a launch leased `current`.
pub async fn after_launch(agent: &Agent, current: &str) -> PruneResult {
    let keep = keep(
        current,
        &agent.wanted_packages(),
        &agent.host.packages.used_within(RECENT),
    );
    let keep: Vec<&str> = keep.iter().map(String::as_str).collect();
    let held = agent.host.allocation.lock().await;
    let pruned = tokio::task::block_in_place(|| agent.host.packages.prune(&held, &keep));
    drop(held);
    let result = match pruned {
        Ok(r) if r.ran => {
            tracing::info!(
                "package prune: {} obsolete version(s) removed",
                r.removed.len()
            );
            PruneResult::Ran
        }
        Ok(_) => {
            tracing::info!("package prune: skipped (an install or copy is running)");
            PruneResult::Skipped
        }
        Err(e) => {
            tracing::warn!(
                "package prune failed ({:?}); the launch goes on and the next one prunes again",
                e.kind()
            );
            PruneResult::Failed
        }
    };
    agent.metrics().package_prune(result);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prune_keeps_the_launch_s_version_every_wanted_one_and_the_recent_ones() {
        let wanted: BTreeSet<String> = ["b".to_owned()].into();
        let kept = keep("a", &wanted, &["c".to_owned()]);
        assert_eq!(
            kept,
            ["a", "b", "c"].iter().map(|s| (*s).to_owned()).collect()
        );
        assert_eq!(keep("a", &BTreeSet::new(), &[]).len(), 1);
    }
}
