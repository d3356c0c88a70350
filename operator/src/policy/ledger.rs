//! The job ledger's rules (`status.pendingJobs`, DESIGN §7): which entries a source adds and
//! removes, and how many entries the policy's own runners have evidently taken. Pure: the
//! sources (`controller::sources`) and the plan read them; nothing here reads or writes.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
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

/// How many of a policy's pending jobs its own runners have evidently taken already, though the
/// ledger does not know it yet (polling: no `in_progress` delivery; the entry stays until a poll
/// proves the job left the queue, up to a couple of intervals). Without this a runner that took
/// a job leaves "idle" while the job's entry still counts, and the policy mints a second runner
/// for the same job (issue 19: 8 runners for 4 jobs).
///
/// - An entry whose job an attempt is known to run (`facts.job`, from the delivery) is taken.
/// - A runner that took a job not known to us (busy, or concluded having completed one, within
///   `horizon`) explains one entry recorded before it took its job: matched oldest entry to
///   earliest runner, so a job queued after a runner went busy is never explained by it.
///
/// Only a scale-up is held back by it (`demand::decide_holding`); scale-down counts the whole
/// ledger, so a runner is never removed on a presumption. Pure.
pub fn presumed_taken(
    ledger: &BTreeMap<String, Time>,
    attempts: &[std::sync::Arc<runner_manager_crds::attempt::RunnerAttempt>],
    now: Timestamp,
    horizon: std::time::Duration,
) -> u32 {
    use runner_manager_crds::outcome::Outcome;
    let known: std::collections::BTreeSet<String> = attempts
        .iter()
        .filter_map(|a| a.status.as_ref()?.facts.job.as_ref())
        .map(|j| j.id.to_string())
        .collect();
    let mut taken = ledger.keys().filter(|k| known.contains(*k)).count();
    let mut entries: Vec<Timestamp> = ledger
        .iter()
        .filter(|(k, _)| !known.contains(*k))
        .map(|(_, t)| t.0)
        .collect();
    entries.sort();
    let since = now
        .checked_sub(k8s_openapi::jiff::SignedDuration::try_from(horizon).unwrap_or_default())
        .unwrap_or(now);
    let mut takers: Vec<Timestamp> = attempts
        .iter()
        .filter_map(|a| {
            let status = a.status.as_ref()?;
            if status.facts.job.is_some() {
                return None;
            }
            let ts = status.journal.timestamps();
            let completed = matches!(status.journal.outcome(), Some(Outcome::CompletedJob));
            ts.busy_at
                .as_ref()
                .or(if completed {
                    ts.concluded_at.as_ref()
                } else {
                    None
                })
                .map(|t| t.0)
        })
        .filter(|t| *t >= since)
        .collect();
    takers.sort();
    let mut next = 0;
    for took in takers {
        if next < entries.len() && entries[next] <= took {
            next += 1;
            taken += 1;
        }
    }
    u32::try_from(taken).unwrap_or(u32::MAX)
}

/// [`presumed_taken`] for a policy: the horizon is two poll intervals, the longest a taken
/// job's entry waits for a poll to remove it; a `ScaleSet` policy's entries leave with their
/// `JobStarted` (and the set's statistics), so only known jobs count there.
pub fn presumed_taken_of(
    policy: &ScalePolicy,
    attempts: &[std::sync::Arc<runner_manager_crds::attempt::RunnerAttempt>],
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
    presumed_taken(ledger, attempts, now, horizon)
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

    fn taker(
        busy_at: Option<i64>,
        completed_at: Option<i64>,
        job: Option<i64>,
    ) -> std::sync::Arc<runner_manager_crds::attempt::RunnerAttempt> {
        use runner_manager_crds::fixtures::AttemptBuilder;
        use runner_manager_crds::state::AttemptState;
        let (state, at) = match (busy_at, completed_at) {
            (_, Some(c)) => (AttemptState::Finished, c),
            (Some(b), None) => (AttemptState::Busy, b),
            (None, None) => (AttemptState::Idle, 0),
        };
        let mut a = AttemptBuilder::new("web-1", "web")
            .node("n")
            .state(state)
            .edges_at(Timestamp::from_second(at).unwrap());
        if let Some(j) = job {
            a = a.job(j);
        }
        std::sync::Arc::new(a.build())
    }

    /// Why a concluded runner's job fact is written (`supervisor::job_facts`): its delivery
    /// removed its own job's entry, and without the fact it explained another job's.
    #[test]
    fn a_concluded_runner_whose_job_is_known_explains_no_other_entry() {
        let t = |s: i64| Time(Timestamp::from_second(s).unwrap());
        // Jobs 1 and 2 queued together; the runner took 1, concluded, and 1's entry is gone.
        let ledger: BTreeMap<String, Time> = [("2".into(), t(100))].into();
        let now = Timestamp::from_second(170).unwrap();
        let h = std::time::Duration::from_secs(120);
        assert_eq!(
            presumed_taken(&ledger, &[taker(None, Some(160), None)], now, h),
            1,
            "without its fact the runner hides job 2's demand"
        );
        assert_eq!(
            presumed_taken(&ledger, &[taker(None, Some(160), Some(1))], now, h),
            0,
            "with it job 2 is demand"
        );
    }

    #[test]
    fn a_runner_that_took_a_job_explains_one_older_entry_within_the_horizon() {
        let t = |s: i64| Time(Timestamp::from_second(s).unwrap());
        let ledger: BTreeMap<String, Time> = [
            ("1".into(), t(100)),
            ("2".into(), t(100)),
            ("3".into(), t(200)),
        ]
        .into();
        let now = Timestamp::from_second(210).unwrap();
        let h = std::time::Duration::from_secs(60);
        // Nothing taken: an idle runner explains nothing.
        assert_eq!(
            presumed_taken(&ledger, &[taker(None, None, None)], now, h),
            0
        );
        // A busy runner and one that completed its job explain two entries older than them.
        let two = [taker(Some(150), None, None), taker(None, Some(160), None)];
        assert_eq!(presumed_taken(&ledger, &two, now, h), 2);
        // A runner busy before a job was recorded does not explain that job.
        let early = [
            taker(Some(150), None, None),
            taker(Some(151), None, None),
            taker(Some(152), None, None),
        ];
        assert_eq!(
            presumed_taken(&ledger, &early, now, h),
            2,
            "entry 3 came after them"
        );
        // Past the horizon the ledger is trusted again.
        assert_eq!(
            presumed_taken(&ledger, &[taker(Some(100), None, None)], now, h),
            0
        );
        // A job known to run on one of ours counts, whatever its age; its runner explains no
        // other entry.
        assert_eq!(
            presumed_taken(&ledger, &[taker(Some(150), None, Some(3))], now, h),
            1
        );
    }
}
