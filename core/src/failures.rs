//! Replacement without loops (DESIGN §11): launches that failed are counted per policy
//! generation, each replacement waits an exponential backoff, and past the limit the policy is
//! Degraded and creates nothing until its spec changes. The history is each attempt of the
//! policy as a [`Launch`] ([`launches`], from the validated attempts). Pure.

use std::collections::HashSet;
use std::time::Duration;

use jiff::Timestamp;

use crate::attempt::ValidatedAttempt;
use crate::outcome::{FailureReason, Outcome};
use crate::recovery::{TerminateReason, TerminationReason};

/// One attempt as the failure count sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch<'a> {
    pub name: &'a str,
    pub created: Timestamp,
    /// The policy generation it was made for (None: unknown, counted toward none).
    pub generation: Option<i64>,
    pub outcome: Option<Outcome>,
    /// GitHub listed it (or it took a job): the launch worked, whatever came after.
    pub registered: bool,
    pub concluded_at: Option<Timestamp>,
    /// Another attempt names it in `spec.replaces`.
    pub replaced: bool,
}

/// The outcome an attempt the operator terminated for a registration timeout will conclude
/// with, and when it was decided. The request already settles it (the runner never
/// registered, so it ends `Failed(TerminatedAfterRegistrationTimeout)` whatever the agent
/// finds), and demand stops counting the attempt as supply the moment the request is written:
/// without this, the creation that request causes could run before the agent concludes and be
/// made as a plain scale-up, with no lineage and no backoff (a CI run met that interleaving).
fn foreseen(a: &ValidatedAttempt) -> Option<(Outcome, Timestamp)> {
    let t = a.termination?;
    (t.reason == TerminationReason::RegistrationTimeout).then(|| {
        (
            TerminateReason::RegistrationTimeout.outcome(),
            t.requested_at,
        )
    })
}

/// The attempts as the failure count sees them (one without a creation time, never stored, is
/// not a launch).
pub fn launches<A: AsRef<ValidatedAttempt>>(attempts: &[A]) -> Vec<Launch<'_>> {
    let replaced: HashSet<&str> = attempts
        .iter()
        .filter_map(|a| a.as_ref().replaces.as_deref())
        .collect();
    attempts
        .iter()
        .map(AsRef::as_ref)
        .filter_map(|a| {
            Some(Launch {
                name: &a.name,
                created: a.created_at?,
                generation: a.policy_generation,
                outcome: a.outcome.or_else(|| foreseen(a).map(|(o, _)| o)),
                registered: a.times.registered_at.is_some() || a.times.busy_at.is_some(),
                concluded_at: a
                    .times
                    .concluded_at
                    .or_else(|| foreseen(a).map(|(_, at)| at)),
                replaced: replaced.contains(a.name.as_str()),
            })
        })
        .collect()
}

/// A launch that failed for a reason the policy causes, which a replacement may hit again: its
/// image, runner version, registration, or the runner's own launch. Never an infrastructure
/// fault (issue 15 item 7): an agent restarted during preparation (a DaemonSet rollout), an
/// attempt the operator or a person asked to stop, a spec changed under the agent, a kubelet
/// that refused the placeholder or runner pod for want of CPU or memory (the node was fuller
/// than placement saw: another workload, not the policy) — nor node loss or the agent's
/// admission rejections, which are not `Failed` at all. Those never count toward `Degraded`; all
/// but the kubelet's refusal are also replaced without backoff (see [`backs_off`]).
pub fn is_launch_failure(outcome: Option<Outcome>) -> bool {
    matches!(outcome, Some(Outcome::Failed(r)) if policy_caused(r))
}

/// A launch whose replacement waits the backoff: every launch failure, and a kubelet's refusal
/// for CPU or memory too. That refusal is not the policy's fault, but placement chose the node
/// from a view the kubelet contradicted (a Lease behind, a DaemonSet pod landing between), so
/// an immediate replacement is likely placed on the same node and refused again: a tight loop
/// of create/admit/pod/refusal/clean. Counting toward `Degraded` and backing off are separate.
pub fn backs_off(outcome: Option<Outcome>) -> bool {
    is_launch_failure(outcome)
        || matches!(
            outcome,
            Some(Outcome::Failed(FailureReason::NodeOutOfResources))
        )
}

fn policy_caused(r: FailureReason) -> bool {
    !matches!(
        r,
        FailureReason::TerminationRequested
            | FailureReason::PreparationInterrupted
            | FailureReason::SpecChanged
            | FailureReason::NodeOutOfResources
    )
}

fn wants_lineage(l: &Launch<'_>) -> bool {
    !l.replaced
        && matches!(
            l.outcome,
            Some(o) if o.wants_replacement() || matches!(o, Outcome::Rejected(_))
        )
}

/// Failed launches of `generation` since its last working one, newest first until a success:
/// the count toward `Degraded`.
pub fn consecutive_failures(launches: &[Launch<'_>], generation: i64) -> u32 {
    trailing(launches, generation, is_launch_failure)
}

/// Launches of `generation` since its last working one that [`back off`](backs_off): the count
/// the replacement backoff grows with.
pub fn consecutive_backoffs(launches: &[Launch<'_>], generation: i64) -> u32 {
    trailing(launches, generation, backs_off)
}

fn trailing(launches: &[Launch<'_>], generation: i64, counts: fn(Option<Outcome>) -> bool) -> u32 {
    let mut mine: Vec<&Launch<'_>> = launches
        .iter()
        .filter(|l| l.generation == Some(generation))
        .collect();
    mine.sort_by(|a, b| b.created.cmp(&a.created).then(b.name.cmp(a.name)));
    let mut n = 0;
    for l in mine {
        if l.registered {
            break;
        }
        if counts(l.outcome) {
            n += 1;
        }
    }
    n
}

/// The wait before the next replacement after `failures` consecutive failures.
pub fn backoff(failures: u32, base: Duration, max: Duration) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(20));
    base.saturating_mul(factor).min(max)
}

/// When creation may resume: the newest conclusion that [`backs_off`] plus the backoff of
/// `failures` (from [`consecutive_backoffs`]).
pub fn resume_at(
    launches: &[Launch<'_>],
    failures: u32,
    base: Duration,
    max: Duration,
) -> Option<Timestamp> {
    if failures == 0 {
        return None;
    }
    let last = launches
        .iter()
        .filter(|l| backs_off(l.outcome))
        .filter_map(|l| l.concluded_at)
        .max()?;
    let wait = backoff(failures, base, max);
    last.checked_add(jiff::SignedDuration::try_from(wait).ok()?)
        .ok()
}

/// The attempt a new one replaces (`spec.replaces`): the newest failed, rejected or lost one
/// that nobody replaced yet.
pub fn lineage<'a>(launches: &[Launch<'a>]) -> Option<&'a str> {
    launches
        .iter()
        .filter(|l| wants_lineage(l))
        .max_by(|a, b| a.created.cmp(&b.created).then(a.name.cmp(b.name)))
        .map(|l| l.name)
}

/// Every attempt the next creations will replace, newest first.
pub fn lineages<'a>(launches: &[Launch<'a>]) -> Vec<&'a str> {
    let mut v: Vec<&Launch<'a>> = launches.iter().filter(|l| wants_lineage(l)).collect();
    v.sort_by(|a, b| b.created.cmp(&a.created).then(b.name.cmp(a.name)));
    v.into_iter().map(|l| l.name).collect()
}

/// Whether a Degraded policy may send its probe: nothing of this generation is in flight (a
/// launch neither concluded nor registered) and the newest failure concluded at least
/// `cooldown` ago. Pure.
pub fn probe_due(
    history: &[Launch<'_>],
    generation: i64,
    cooldown: Duration,
    now: Timestamp,
) -> bool {
    let mine = || history.iter().filter(|l| l.generation == Some(generation));
    if mine().any(|l| l.outcome.is_none() && !l.registered) {
        return false;
    }
    let Some(last) = mine()
        .filter(|l| is_launch_failure(l.outcome))
        .filter_map(|l| l.concluded_at)
        .max()
    else {
        return false;
    };
    let age = now.as_millisecond().saturating_sub(last.as_millisecond());
    age >= i64::try_from(cooldown.as_millis()).unwrap_or(i64::MAX)
}

/// The reason of a failed outcome as its wire form names it (`JitExpired`).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::RejectReason;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn launch(name: &str, created: i64, outcome: Option<Outcome>, registered: bool) -> Launch<'_> {
        Launch {
            name,
            created: t(created),
            generation: Some(1),
            outcome,
            registered,
            concluded_at: outcome.map(|_| t(created + 10)),
            replaced: false,
        }
    }

    const JIT: Option<Outcome> = Some(Outcome::Failed(FailureReason::JitExpired));

    #[test]
    fn counts_trailing_failures_of_the_generation() {
        let ls = [
            launch("a", 1, JIT, false),
            launch("b", 2, Some(Outcome::CompletedJob), true),
            launch("c", 3, JIT, false),
            launch("d", 4, JIT, false),
            launch("e", 5, None, false),
        ];
        assert_eq!(consecutive_failures(&ls, 1), 2);
        assert_eq!(
            consecutive_failures(&ls, 2),
            0,
            "a new generation starts afresh"
        );
        let asked = [launch(
            "x",
            1,
            Some(Outcome::Failed(FailureReason::TerminationRequested)),
            false,
        )];
        assert_eq!(consecutive_failures(&asked, 1), 0);
    }

    /// Issue 15 item 7: a kubelet refusing a pod for resources is the node's state, not the
    /// policy's; five such refusals in a row leave the policy with no failure to back off from,
    /// while five launch failures of its own count.
    #[test]
    fn a_kubelet_refusal_for_resources_never_counts_toward_degraded() {
        const REFUSED: Option<Outcome> = Some(Outcome::Failed(FailureReason::NodeOutOfResources));
        assert!(!is_launch_failure(REFUSED));
        assert!(is_launch_failure(Some(Outcome::Failed(
            FailureReason::ProcessStartFailed
        ))));
        let refused: Vec<Launch<'_>> = ["a", "b", "c", "d", "e"]
            .iter()
            .zip(1..)
            .map(|(n, at)| launch(n, at, REFUSED, false))
            .collect();
        assert_eq!(consecutive_failures(&refused, 1), 0);
        // Still replaced, after the backoff: placement would likely choose the same node again.
        assert!(backs_off(REFUSED));
        assert_eq!(consecutive_backoffs(&refused, 1), 5);
        let b = Duration::from_secs(5);
        let m = Duration::from_secs(300);
        let one = [launch("a", 100, REFUSED, false)];
        assert_eq!(
            resume_at(&one, consecutive_backoffs(&one, 1), b, m),
            Some(t(115)),
            "one refusal: the next create waits the base backoff after its conclusion"
        );
        assert!(REFUSED.unwrap().wants_replacement());
        assert_eq!(lineage(&refused), Some("e"));
        // Between two failures of the policy's own, a refusal neither counts nor resets.
        let mixed = [
            launch("x", 1, JIT, false),
            launch("y", 2, REFUSED, false),
            launch("z", 3, JIT, false),
        ];
        assert_eq!(consecutive_failures(&mixed, 1), 2);
        assert_eq!(consecutive_backoffs(&mixed, 1), 3);
        // Infrastructure faults that are not the node's room are replaced at once.
        for r in [
            FailureReason::TerminationRequested,
            FailureReason::PreparationInterrupted,
            FailureReason::SpecChanged,
        ] {
            assert!(!backs_off(Some(Outcome::Failed(r))), "{r:?}");
        }
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let b = Duration::from_secs(5);
        let m = Duration::from_secs(60);
        assert_eq!(backoff(0, b, m), Duration::ZERO);
        assert_eq!(backoff(1, b, m), Duration::from_secs(5));
        assert_eq!(backoff(3, b, m), Duration::from_secs(20));
        assert_eq!(backoff(30, b, m), m);
        let ls = [launch("a", 100, JIT, false)];
        assert_eq!(resume_at(&ls, 1, b, m), Some(t(115)));
    }

    #[test]
    fn lineage_is_the_newest_unreplaced_failure() {
        let mut old = launch("old", 1, JIT, false);
        old.replaced = true;
        let ls = [
            old,
            launch(
                "rej",
                2,
                Some(Outcome::Rejected(RejectReason::NodeFull)),
                false,
            ),
            launch("ok", 3, Some(Outcome::CompletedJob), true),
        ];
        assert_eq!(lineage(&ls), Some("rej"));
        assert_eq!(lineages(&ls), vec!["rej"]);
    }

    /// The history read from validated attempts: a registration-timeout request counts as the
    /// failure it settles, from when it was asked; a replaced attempt is marked; one never
    /// stored is no launch; an unreadable generation counts toward none.
    #[test]
    fn launches_read_the_validated_attempts() {
        use crate::attempt::TerminationAsked;
        use crate::attempt::testing::{attempt, in_state};
        use crate::recovery::TerminationReason;
        use crate::state::AttemptState;
        let mut timed_out = in_state(attempt("a", 100), AttemptState::Starting, 150);
        timed_out.termination = Some(TerminationAsked {
            reason: TerminationReason::RegistrationTimeout,
            requested_at: t(400),
        });
        let mut replacement = attempt("b", 500);
        replacement.replaces = Some("a".into());
        replacement.policy_generation = None;
        let mut unstored = attempt("c", 0);
        unstored.created_at = None;
        let all = [timed_out, replacement, unstored];
        let ls = launches(&all);
        assert_eq!(ls.len(), 2, "{ls:?}");
        assert_eq!(
            ls[0].outcome,
            Some(TerminateReason::RegistrationTimeout.outcome())
        );
        assert_eq!(ls[0].concluded_at, Some(t(400)));
        assert!(ls[0].replaced && !ls[0].registered);
        assert!(is_launch_failure(ls[0].outcome));
        assert_eq!(ls[1].generation, None);
        assert_eq!(consecutive_failures(&ls, 1), 1);
    }
}
