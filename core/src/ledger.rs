//! What the job ledger (`status.pendingJobs`, DESIGN §7) is worth against the policy's own
//! runners ([`presumed_taken`]). The ledger's entries and the patches that add and remove them
//! are the operator's (`policy::ledger`: they are the status's wire format); the decision that
//! reads the attempts is here. Pure.

use std::collections::BTreeSet;

use jiff::Timestamp;

use crate::attempt::ValidatedAttempt;
use crate::outcome::Outcome;

/// How many of a policy's pending jobs its own runners have evidently taken already, though the
/// ledger does not know it yet (polling: no `in_progress` delivery; the entry stays until a poll
/// proves the job left the queue, up to a couple of intervals). Without this a runner that took
/// a job leaves "idle" while the job's entry still counts, and the policy mints a second runner
/// for the same job (issue 19: 8 runners for 4 jobs). `ledger` is each entry's job id (as the
/// ledger keys it) and when it was recorded.
///
/// - An entry whose job an attempt is known to run (`job`, from the delivery) is taken.
/// - A runner that took a job not known to us (busy, or concluded having completed one, within
///   `horizon`) explains one entry recorded before it took its job: matched oldest entry to
///   earliest runner, so a job queued after a runner went busy is never explained by it.
///
/// Only a scale-up is held back by it (`demand::decide_holding`); scale-down counts the whole
/// ledger, so a runner is never removed on a presumption.
pub fn presumed_taken<'l, A: AsRef<ValidatedAttempt>>(
    ledger: impl IntoIterator<Item = (&'l str, Timestamp)>,
    attempts: &[A],
    now: Timestamp,
    horizon: std::time::Duration,
) -> u32 {
    let known: BTreeSet<String> = attempts
        .iter()
        .filter_map(|a| a.as_ref().job)
        .map(|j| j.to_string())
        .collect();
    let mut taken = 0usize;
    let mut entries: Vec<Timestamp> = Vec::new();
    for (job, at) in ledger {
        if known.contains(job) {
            taken += 1;
        } else {
            entries.push(at);
        }
    }
    entries.sort();
    let since = now
        .checked_sub(jiff::SignedDuration::try_from(horizon).unwrap_or_default())
        .unwrap_or(now);
    let mut takers: Vec<Timestamp> = attempts
        .iter()
        .map(AsRef::as_ref)
        .filter(|a| a.job.is_none())
        .filter_map(|a| {
            let completed = matches!(a.outcome, Some(Outcome::CompletedJob));
            a.times.busy_at.or(if completed {
                a.times.concluded_at
            } else {
                None
            })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempt::testing::{attempt, in_state, t};
    use crate::state::AttemptState;

    fn taker(
        busy_at: Option<i64>,
        completed_at: Option<i64>,
        job: Option<i64>,
    ) -> ValidatedAttempt {
        let mut a = attempt("web-1", 0);
        match (busy_at, completed_at) {
            (_, Some(c)) => {
                a = in_state(a, AttemptState::Finished, c);
                a.outcome = Some(Outcome::CompletedJob);
                a.times.concluded_at = Some(t(c));
            }
            (Some(b), None) => {
                a = in_state(a, AttemptState::Busy, b);
                a.times.busy_at = Some(t(b));
            }
            (None, None) => a = in_state(a, AttemptState::Idle, 0),
        }
        a.job = job;
        a
    }

    fn ledger(entries: &[(&'static str, i64)]) -> Vec<(&'static str, Timestamp)> {
        entries.iter().map(|(k, at)| (*k, t(*at))).collect()
    }

    /// Why a concluded runner's job fact is written (`supervisor::job_facts`): its delivery
    /// removed its own job's entry, and without the fact it explained another job's.
    #[test]
    fn a_concluded_runner_whose_job_is_known_explains_no_other_entry() {
        // Jobs 1 and 2 queued together; the runner took 1, concluded, and 1's entry is gone.
        let l = ledger(&[("2", 100)]);
        let now = t(170);
        let h = std::time::Duration::from_secs(120);
        assert_eq!(
            presumed_taken(l.clone(), &[taker(None, Some(160), None)], now, h),
            1,
            "without its fact the runner hides job 2's demand"
        );
        assert_eq!(
            presumed_taken(l, &[taker(None, Some(160), Some(1))], now, h),
            0,
            "with it job 2 is demand"
        );
    }

    #[test]
    fn a_runner_that_took_a_job_explains_one_older_entry_within_the_horizon() {
        let l = ledger(&[("1", 100), ("2", 100), ("3", 200)]);
        let now = t(210);
        let h = std::time::Duration::from_secs(60);
        // Nothing taken: an idle runner explains nothing.
        assert_eq!(
            presumed_taken(l.clone(), &[taker(None, None, None)], now, h),
            0
        );
        // A busy runner and one that completed its job explain two entries older than them.
        let two = [taker(Some(150), None, None), taker(None, Some(160), None)];
        assert_eq!(presumed_taken(l.clone(), &two, now, h), 2);
        // A runner busy before a job was recorded does not explain that job.
        let early = [
            taker(Some(150), None, None),
            taker(Some(151), None, None),
            taker(Some(152), None, None),
        ];
        assert_eq!(
            presumed_taken(l.clone(), &early, now, h),
            2,
            "entry 3 came after them"
        );
        // Past the horizon the ledger is trusted again.
        assert_eq!(
            presumed_taken(l.clone(), &[taker(Some(100), None, None)], now, h),
            0
        );
        // A job known to run on one of ours counts, whatever its age; its runner explains no
        // other entry.
        assert_eq!(
            presumed_taken(l, &[taker(Some(150), None, Some(3))], now, h),
            1
        );
    }
}
