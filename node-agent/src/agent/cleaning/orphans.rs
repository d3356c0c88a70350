//! The orphan sweep: what this agent's launcher and workspace left on the host for an attempt
//! that no longer exists (deleted without its finalizer while its runner lived, lost while the
//! agent was down) or that is already `Cleaned` (a late child recreating its runtime). Run after
//! the first complete list of the node's attempts (so at every start) and then every
//! `--orphan-sweep-seconds`.
//!
//! Only what is provably ours is touched: names derived from an attempt uuid (`rm-<12hex>`
//! cgroups under the agent's own parent or `rm-<12hex>.service` units, `<hostRoot>/runners/<12hex>`
//! runtimes) that no attempt of this node claims, and handoff files (`jit-*.tmp`) at the top of a
//! persistent slot no attempt leases. A claim is any attempt of the node not yet `Cleaned`, and
//! any attempt a reconcile is running for, so an attempt being launched is never an orphan.
//! Slots themselves are never removed: a slot keeps its `_work` for the next attempt of its policy.
//! An abandoned attempt's slot is unmounted (overlay materialize) before its leases are released.
//!
//! A runner is stopped (its whole cgroup or unit, proven empty) before its runtime is removed.
//! What fails is retried with the cleanup backoff and never blocks recovery. Everything removed
//! is counted in `runner_manager_agent_orphans_removed_total{kind}` and said in one log line.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Instant;

use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::names::short_hex;

use crate::handoff::is_handoff_name;
use crate::packages::overlay;
use crate::providers::launcher::Stopped;
use crate::workspace::ephemeral::{EphemeralRemoval, remove_runtime_named, runtime_names};
use crate::workspace::slot_path::{self, derive_slot_path};
use crate::workspace::slot_table::SlotKey;

use crate::agent::node::Agent;

pub use crate::agent::labels::OrphanKind;

pub use crate::agent::abandoned::{Abandoned, OrphanState};

/// What `a` holds on this host, to be released by the sweep should its object go away.
pub fn held_by(a: &RunnerAttempt) -> Option<(String, Abandoned)> {
    let uuid = a.spec.attempt_uuid()?;
    let uid = a.metadata.uid.clone()?;
    let slot = crate::agent::rebuild::journal_of(a)
        .workspace()
        .filter(|w| w.slot_number().is_some())
        .and_then(|_| {
            Some((
                SlotKey {
                    namespace: a.metadata.namespace.clone()?,
                    policy_uid: a.spec.snapshot.policy_uid.clone(),
                },
                a.metadata.name.clone()?,
            ))
        });
    Some((short_hex(uuid), Abandoned { uid, slot }))
}

/// An attempt's object went away (handed over after its running reconcile, if any). Before,
/// its runner, runtime, account and leases were simply forgotten; now the sweep stops and
/// removes what is left and then releases what it held.
pub fn gone(agent: &Agent, uid: &str, held: Option<(String, Abandoned)>) {
    match held {
        Some((short, what)) => agent.orphans.abandon(short, what),
        None => agent.book().forget(uid),
    }
}

/// The names among `found` that no attempt claims. Pure.
pub fn unclaimed<'a>(found: &'a [String], claimed: &BTreeSet<String>) -> Vec<&'a str> {
    found
        .iter()
        .filter(|n| !claimed.contains(n.as_str()))
        .map(String::as_str)
        .collect()
}

/// What one sweep did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub removed: Vec<(OrphanKind, String)>,
    /// Names whose stop or removal failed this time (retried with backoff).
    pub failed: Vec<String>,
}

/// A listing of the sweep, or `None` (logged, naming `what`): the sweep stops there.
fn listed(what: &str, listing: std::io::Result<Vec<String>>) -> Option<Vec<String>> {
    listing
        .map_err(|e| tracing::warn!("orphan sweep: {what} could not be listed ({:?})", e.kind()))
        .ok()
}

fn backoff_key(short: &str) -> String {
    format!("orphan/{short}")
}

/// One sweep. `claims` gives the attempt names (12 hex) of every attempt of the node not yet
/// `Cleaned` and of every attempt a reconcile runs for. It is asked again after each listing,
/// never before: whatever a listing finds was made by a reconcile of an attempt already in the
/// store, so a later answer claims it, while an answer taken before the listing could miss an
/// attempt that arrived, and launched, in between (and its runtime or placeholder would be
/// swept from under its launch).
pub async fn sweep(agent: &Agent, claims: &(dyn Fn() -> BTreeSet<String> + Sync)) -> SweepReport {
    // Docker engines first (`spec.docker`): every container of one is stopped with it before
    // the runtime it may have mounted is removed below.
    let engines = tokio::task::block_in_place(|| {
        let mut found = listed(
            "the Docker engines' units",
            agent.providers.launcher().engine_leftovers(),
        )
        .unwrap_or_default();
        found.extend(
            listed(
                "the Docker engines' directories",
                crate::agent::docker::engine_dir_names(&agent.host.root),
            )
            .unwrap_or_default(),
        );
        found.sort();
        found.dedup();
        found
    });
    let claimed = claims();
    let unclaimed: Vec<String> = unclaimed(&engines, &claimed)
        .into_iter()
        .map(str::to_owned)
        .collect();
    let engines_removed = crate::agent::docker::sweep_orphans(agent, &unclaimed).await;
    let mut report = tokio::task::block_in_place(|| sweep_runners(agent, claims));
    report
        .removed
        .extend(engines_removed.into_iter().map(|s| (OrphanKind::Docker, s)));
    {
        // Under the allocation lock: a slot is recorded in the table under it before any
        // handoff is made in it, so an unleased slot stays unleased while it is swept.
        let _held = agent.host.allocation.lock().await;
        tokio::task::block_in_place(|| sweep_slot_handoffs(agent, &mut report));
    }
    release_abandoned(agent, claims, &report);
    agent.sweep_placeholder_orphans(claims).await;
    if !report.removed.is_empty() {
        let count = |k: OrphanKind| report.removed.iter().filter(|(x, _)| *x == k).count();
        let names: BTreeSet<&str> = report.removed.iter().map(|(_, n)| n.as_str()).collect();
        tracing::warn!(
            "orphans removed (no attempt of this node claims them): {} runner(s) stopped, {} cgroup(s) or unit(s), {} runtime(s), {} handoff file(s), {} job gate(s), {} Docker engine(s); attempt names {}",
            count(OrphanKind::Runner),
            count(OrphanKind::Cgroup),
            count(OrphanKind::Runtime),
            count(OrphanKind::Handoff),
            count(OrphanKind::Gate),
            count(OrphanKind::Docker),
            names.into_iter().collect::<Vec<_>>().join(",")
        );
        for (kind, _) in &report.removed {
            agent.metrics().orphan_removed(*kind);
        }
    }
    report
}

fn sweep_runners(agent: &Agent, claims: &dyn Fn() -> BTreeSet<String>) -> SweepReport {
    let mut report = SweepReport::default();
    let now = Instant::now();
    let due = |short: &str| agent.cleanup_backoff().due(&backoff_key(short), now);
    let failed = |report: &mut SweepReport, short: &str, what: String| {
        let retry = agent.cleanup_backoff().failed(&backoff_key(short), now);
        tracing::warn!(
            "orphan {short} not removed: {what}; next try in {}s",
            retry.as_secs()
        );
        report.failed.push(short.to_owned());
    };
    // Runners first: a runtime is removed only once nothing of its attempt runs.
    let Some(leftovers) = listed(
        "the launcher's cgroups or units",
        agent.providers.launcher().leftovers(),
    ) else {
        return report;
    };
    let claimed = claims();
    for short in unclaimed(&leftovers, &claimed) {
        if !due(short) {
            report.failed.push(short.to_owned());
            continue;
        }
        match agent.providers.launcher().stop_leftover(short) {
            Ok(Stopped::Stopped) => report.removed.push((OrphanKind::Runner, short.to_owned())),
            Ok(Stopped::AlreadyGone) => report.removed.push((OrphanKind::Cgroup, short.to_owned())),
            Err(e) => failed(&mut report, short, e.to_string()),
        }
    }
    let Some(runtimes) = listed("the runtimes", runtime_names(&agent.host.root)) else {
        return report;
    };
    let claimed = claims();
    for short in unclaimed(&runtimes, &claimed) {
        if report.failed.iter().any(|f| f == short) || !due(short) {
            continue;
        }
        match remove_runtime_named(&agent.host.root, short) {
            Ok(EphemeralRemoval::Removed { .. }) => {
                agent.cleanup_backoff().succeeded(&backoff_key(short));
                report.removed.push((OrphanKind::Runtime, short.to_owned()));
            }
            Ok(EphemeralRemoval::AlreadyGone) => {}
            Err(e) => failed(&mut report, short, e.to_string()),
        }
    }
    // Job gates last: a gate goes with its attempt's cleanup; one whose attempt was deleted
    // without it (a forced finalizer removal) is left here.
    let Some(gates) = listed(
        "the job gates",
        crate::job_gate::gate_names(&agent.host.root),
    ) else {
        return report;
    };
    let claimed = claims();
    for short in unclaimed(&gates, &claimed) {
        match crate::job_gate::remove_named(&agent.host.root, short) {
            Ok(true) => report.removed.push((OrphanKind::Gate, short.to_owned())),
            Ok(false) => {}
            Err(e) => tracing::warn!("orphan job gate {short} not removed ({:?})", e.kind()),
        }
    }
    // Caches of attempts no longer here: their runner is stopped above (a cache whose runner
    // could not be stopped waits), and their writes are discarded, never committed: nothing
    // says the job that wrote them finished.
    let Some(caches) = listed("the dependency caches", agent.host.caches.attempt_names()) else {
        return report;
    };
    let claimed = claims();
    for short in unclaimed(&caches, &claimed) {
        if report.failed.iter().any(|f| f == short) {
            continue;
        }
        match agent.host.caches.release(short, false) {
            Ok(crate::caches::Released::NotAttached) => {}
            Ok(_) => report.removed.push((OrphanKind::Cache, short.to_owned())),
            Err(e) => tracing::warn!("orphan dependency cache {short} not released: {e}"),
        }
    }
    crate::agent::caches::prune_if_due(agent);
    report
}

/// Handoff files at the top of a slot no attempt leases: a launch that died between writing one
/// and the helper taking it, for an attempt that is gone. A leased slot is its attempt's
/// cleanup's to scrub.
fn sweep_slot_handoffs(agent: &Agent, report: &mut SweepReport) {
    let slots = agent.slots().clone();
    for (namespace, policy_uid, n, dir) in slot_path::slot_dirs(&agent.host.slots_root) {
        let key = SlotKey {
            namespace,
            policy_uid,
        };
        if slots.leased(&key).contains(&n) {
            continue;
        }
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if !is_handoff_name(&e.file_name()) {
                continue;
            }
            // Unlinked, never followed: a link named like a handoff goes as a link.
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            if !is_dir && std::fs::remove_file(e.path()).is_ok() {
                report
                    .removed
                    .push((OrphanKind::Handoff, format!("{}/s{n}", key.policy_uid)));
            }
        }
    }
}

/// Releases what abandoned attempts held once the sweep saw nothing of them running: no
/// leftover cgroup or unit and no runtime left under their name.
fn release_abandoned(agent: &Agent, claims: &dyn Fn() -> BTreeSet<String>, report: &SweepReport) {
    // Fail closed: what cannot be listed may still run.
    let (Ok(running), Ok(runtimes)) = (
        agent.providers.launcher().leftovers(),
        runtime_names(&agent.host.root),
    ) else {
        return;
    };
    let claimed = claims();
    let still: BTreeSet<String> = running.into_iter().chain(runtimes).collect();
    let mut abandoned = agent.orphans.lock();
    let before = abandoned.len();
    abandoned.retain(|short, what| {
        if claimed.contains(short) || still.contains(short) || report.failed.contains(short) {
            return true;
        }
        if let Some((key, name)) = &what.slot {
            let slot = agent.slots().slot_of(key, name);
            if let Some(n) = slot
                && let Err(e) = free_slot_overlay(&agent.host.slots_root, key, n)
            {
                // Kept, and tried again next sweep: released now, the slot would go to an
                // attempt that finds it mounted, and the lower to a prune.
                tracing::warn!("unmounting an abandoned attempt's slot s{n} failed: {e}");
                return true;
            }
        }
        agent.accounts().release(&what.uid);
        agent.host.packages.release(&what.uid);
        if let Some((key, name)) = &what.slot {
            agent.slots().release(key, name);
        }
        agent.book().forget(&what.uid);
        false
    });
    let released = abandoned.len() < before;
    drop(abandoned);
    if released {
        agent.cluster.advert_changed.notify_one();
    }
}

/// An abandoned attempt's slot may still carry its overlay (the sweep stopped the runner, and
/// slots are never removed, so nothing else unmounts it): unmounted and its workdir removed
/// before the slot and the package lease are released. Otherwise the next attempt on the slot
/// finds it not reusable for good, and a prune may remove the lower from under the mount.
fn free_slot_overlay(slots_root: &Path, key: &SlotKey, slot: u32) -> Result<(), String> {
    let Ok(path) = derive_slot_path(slots_root, &key.namespace, &key.policy_uid, slot) else {
        // Never a path the agent made, so never a mount of its own.
        return Ok(());
    };
    overlay::unmount(&path).map_err(|e| e.to_string())?;
    overlay::remove_work_dir(&path).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_abandoned_slot_is_unmounted_and_its_overlay_workdir_removed() {
        let root = tempfile::tempdir().unwrap();
        let key = SlotKey {
            namespace: "team".into(),
            policy_uid: "uid-1".into(),
        };
        let slots = root.path().join("slots");
        let slot = crate::workspace::prepare::prepare_slot(&slots, "team", "uid-1", 2)
            .unwrap()
            .path;
        let lower = root.path().join("lower");
        std::fs::create_dir(&lower).unwrap();
        std::fs::write(lower.join("run.sh"), b"x").unwrap();
        overlay::mount_package(&lower, &slot).unwrap();
        assert!(overlay::is_mounted(&slot).unwrap());
        free_slot_overlay(&slots, &key, 2).unwrap();
        assert!(!overlay::is_mounted(&slot).unwrap());
        assert!(!overlay::work_dir(&slot).unwrap().exists());
        assert!(!slot.join("run.sh").exists(), "the lower shows no more");
        // Idempotent: a slot never mounted (copy mode) is left as it is.
        free_slot_overlay(&slots, &key, 2).unwrap();
        assert!(slot.exists());
    }

    #[test]
    fn only_names_no_attempt_claims_are_orphans() {
        let found = vec![
            "0123456789ab".to_owned(),
            "abcdefabcdef".to_owned(),
            "ffffffffffff".to_owned(),
        ];
        let claimed: BTreeSet<String> = ["abcdefabcdef".to_owned()].into();
        assert_eq!(
            unclaimed(&found, &claimed),
            vec!["0123456789ab", "ffffffffffff"]
        );
        assert!(unclaimed(&found, &found.iter().cloned().collect()).is_empty());
    }
}
