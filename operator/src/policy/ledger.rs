//! The job ledger's rules (`status.pendingJobs`, DESIGN §7): which entries a source adds and
//! removes, as the merge patches of the status that add and remove them, and the policy's
//! horizon for `runner_manager_core::ledger::presumed_taken` (how many entries the policy's own
//! runners have evidently taken). Pure: the sources (`controller::sources`) and the plan read
//! them; nothing here reads or writes.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use runner_manager_core::attempt::ValidatedAttempt;
use runner_manager_core::ledger::presumed_taken;
use runner_manager_crds::policy::{PENDING_JOBS_BOUND, ScalePolicy};
use serde_json::{Map, Value, json};

/// The entries to add: jobs not yet in the ledger, while it has room. Pure.
pub fn additions(
    ledger: &BTreeMap<String, Time>,
    jobs: impl IntoIterator<Item = i64>,
    now: Timestamp,
) -> Map<String, Value> {
    let mut out = Map::new();
    for id in jobs {
        let key = id.to_string();
        if ledger.contains_key(&key) || out.contains_key(&key) {
            continue;
        }
        if ledger.len() + out.len() >= PENDING_JOBS_BOUND {
            break;
        }
        out.insert(key, json!(Time(now)));
    }
    out
}

/// [`presumed_taken`] for a policy: the horizon is two poll intervals, the longest a taken
/// job's entry waits for a poll to remove it; a `ScaleSet` policy's entries leave with their
/// `JobStarted` (and the set's statistics), so only known jobs count there.
pub fn presumed_taken_of<A: AsRef<ValidatedAttempt>>(
    policy: &ScalePolicy,
    attempts: &[A],
    now: Timestamp,
) -> u32 {
    let horizon = if policy.spec.github.demand == runner_manager_crds::policy::DemandMode::ScaleSet
    {
        std::time::Duration::ZERO
    } else {
        policy.spec.scaling.poll_interval.as_duration() * 2
    };
    let empty = BTreeMap::new();
    let ledger = policy.status.as_ref().map_or(&empty, |s| &s.pending_jobs);
    presumed_taken(
        ledger.iter().map(|(job, at)| (job.as_str(), at.0)),
        attempts,
        now,
        horizon,
    )
}

/// The entries of jobs the organization walk saw leave the queue (listed queued by one read of
/// their repository, absent from a later one): removed at once, not after a complete cycle and a
/// poll interval's margin, so a job its runner took stops asking for a runner within one cycle.
/// Pure.
pub fn left_queue(ledger: &BTreeMap<String, Time>, left: &[i64]) -> Map<String, Value> {
    left.iter()
        .map(i64::to_string)
        .filter(|k| ledger.contains_key(k))
        .map(|k| (k, Value::Null))
        .collect()
}

/// The entries a complete poll of a repository target proves are no longer queued: recorded
/// before `cutoff` and absent from the poll's queued jobs. Without this, a job whose `in_progress`
/// and `completed` deliveries were lost stays in the ledger until its per-job check and keeps a
/// runner launched for it (over-provisioning). The cutoff lies a poll interval before the poll,
/// because GitHub's run list can lag behind the `queued` delivery of a brand-new job. Pure.
pub fn stale_after_poll(
    ledger: &BTreeMap<String, Time>,
    queued: &[i64],
    cutoff: Timestamp,
) -> Map<String, Value> {
    let found: std::collections::BTreeSet<String> = queued.iter().map(i64::to_string).collect();
    ledger
        .iter()
        .filter(|(job, at)| !found.contains(*job) && at.0 < cutoff)
        .map(|(job, _)| (job.clone(), Value::Null))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poll_removes_only_old_entries_it_no_longer_sees_queued() {
        let t = |s| Time(Timestamp::from_second(s).unwrap());
        let ledger: BTreeMap<String, Time> = [
            ("1".to_owned(), t(100)), // old, still queued: kept
            ("2".to_owned(), t(100)), // old, no longer queued: removed
            ("3".to_owned(), t(200)), // recorded after the cutoff (a brand-new job): kept
        ]
        .into();
        let cutoff = Timestamp::from_second(150).unwrap();
        let stale = stale_after_poll(&ledger, &[1], cutoff);
        assert_eq!(stale.keys().cloned().collect::<Vec<_>>(), vec!["2"]);
        assert_eq!(stale["2"], Value::Null);
    }

    #[test]
    fn additions_skip_known_jobs_and_respect_the_bound() {
        let now = Timestamp::from_second(100).unwrap();
        let mut ledger = BTreeMap::new();
        ledger.insert("1".to_owned(), Time(now));
        let add = additions(&ledger, [1, 2, 2, 3], now);
        assert_eq!(add.keys().cloned().collect::<Vec<_>>(), vec!["2", "3"]);
        let full: BTreeMap<String, Time> = (0..PENDING_JOBS_BOUND)
            .map(|i| (i.to_string(), Time(now)))
            .collect();
        assert!(additions(&full, [5_000_000], now).is_empty());
    }
}
