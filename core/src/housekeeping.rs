//! The housekeeping plan ([`plan`]): what a policy's attempts need that needs no GitHub call —
//! the cleanup finalizer of `Cleaned` attempts released, the abandon annotation honoured, the
//! operator's two edges (`ExpireAdmission`, `LoseNode`) taken and the history of `Cleaned`
//! attempts bounded. Decided here from the validated attempts; the operator's
//! `controller::attempts::housekeeping` carries each step out. Pure.

use std::collections::BTreeMap;

use jiff::Timestamp;

use crate::attempt::ValidatedAttempt;
use crate::state::AttemptState;
use crate::timeouts::{Due, due};

/// One step of housekeeping, naming the attempt it is for (`A`: whatever the caller keeps
/// beside the validated view, so that carrying the step out needs no lookup).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Housekeep<A> {
    /// Released by the abandon annotation: an Event, the finalizer released, the attempt
    /// deleted; the agent's cleanup is not waited for.
    Abandon(A),
    /// `Cleaned` and still holding the cleanup finalizer: agents write status only, so the
    /// operator releases what the agent cleaned.
    Release(A),
    /// `Pending` past the admission timeout: the operator's `ExpireAdmission` edge.
    ExpireAdmission(A),
    /// Its node's agent Lease expired past the grace: the operator's `LoseNode` edge.
    LoseNode(A),
    /// A `Cleaned` attempt beyond the policy's history: deleted.
    Prune(A),
}

impl<A> Housekeep<A> {
    /// The attempt the step is for.
    pub fn attempt(&self) -> &A {
        match self {
            Self::Abandon(a)
            | Self::Release(a)
            | Self::ExpireAdmission(a)
            | Self::LoseNode(a)
            | Self::Prune(a) => a,
        }
    }
}

/// What housekeeping bounds by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub admission_timeout: std::time::Duration,
    pub node_lost_grace: std::time::Duration,
    /// `Cleaned` attempts kept per policy.
    pub history: usize,
}

/// The housekeeping of `attempts`, in the order it is carried out: each attempt's step in the
/// given order, then the prunes. `node_gone` says when a node's agent stopped renewing its
/// Lease (`None` while it is fresh; the second argument is the attempt's last change, the
/// fallback for a node whose Lease is gone).
pub fn plan<'a, A: AsRef<ValidatedAttempt>>(
    attempts: &'a [A],
    now: Timestamp,
    bounds: Bounds,
    node_gone: impl Fn(&str, Option<Timestamp>) -> Option<Timestamp>,
) -> Vec<Housekeep<&'a A>> {
    let mut steps = Vec::new();
    let mut cleaned: BTreeMap<(&str, &str), Vec<&'a A>> = BTreeMap::new();
    for held in attempts {
        let a = held.as_ref();
        if a.abandoned && a.holds_cleanup_finalizer {
            steps.push(Housekeep::Abandon(held));
            continue;
        }
        if a.state == AttemptState::Cleaned {
            if a.holds_cleanup_finalizer {
                steps.push(Housekeep::Release(held));
            }
            cleaned
                .entry((a.namespace.as_str(), a.policy.as_str()))
                .or_default()
                .push(held);
            continue;
        }
        let gone = node_gone(&a.node, a.last_change());
        match due(
            a,
            now,
            bounds.admission_timeout,
            gone,
            bounds.node_lost_grace,
        ) {
            Some(Due::ExpireAdmission) => steps.push(Housekeep::ExpireAdmission(held)),
            Some(Due::LoseNode) => steps.push(Housekeep::LoseNode(held)),
            Some(Due::Terminate(_)) | None => {}
        }
    }
    // History: keep the newest `history` Cleaned attempts of each policy.
    for (_, mut list) in cleaned {
        if list.len() <= bounds.history {
            continue;
        }
        list.sort_by_key(|a| std::cmp::Reverse(a.as_ref().times.cleaned_at));
        steps.extend(
            list.into_iter()
                .skip(bounds.history)
                .filter(|a| !a.as_ref().deleting)
                .map(Housekeep::Prune),
        );
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempt::testing::{attempt, in_state, t};

    fn cleaned(name: &str, at: i64, finalizer: bool) -> ValidatedAttempt {
        let mut a = in_state(attempt(name, 0), AttemptState::Cleaned, at);
        a.times.cleaned_at = Some(t(at));
        a.holds_cleanup_finalizer = finalizer;
        a
    }

    /// `Idle` on `node` since `since`.
    fn idle_on(name: &str, node: &str, since: i64) -> ValidatedAttempt {
        let mut a = in_state(attempt(name, 0), AttemptState::Idle, since);
        a.node = node.into();
        a
    }

    const BOUNDS: Bounds = Bounds {
        admission_timeout: std::time::Duration::from_secs(60),
        node_lost_grace: std::time::Duration::from_secs(60),
        history: 2,
    };

    fn names(steps: &[Housekeep<&ValidatedAttempt>]) -> Vec<String> {
        steps
            .iter()
            .map(|s| {
                let what = match s {
                    Housekeep::Abandon(_) => "abandon",
                    Housekeep::Release(_) => "release",
                    Housekeep::ExpireAdmission(_) => "expire",
                    Housekeep::LoseNode(_) => "lose",
                    Housekeep::Prune(_) => "prune",
                };
                format!("{what} {}", s.attempt().name)
            })
            .collect()
    }

    /// Each attempt's step in the order given, the history's prunes last; an abandoned attempt
    /// is released whatever else would be due for it.
    #[test]
    fn housekeeping_plans_each_attempts_step_in_order_and_prunes_last() {
        let mut abandoned = in_state(attempt("ab", 0), AttemptState::Busy, 0);
        abandoned.node = "lost".into();
        abandoned.abandoned = true;
        let attempts = vec![
            cleaned("c-old", 100, true),
            cleaned("c-mid", 200, true),
            cleaned("c-new", 300, false),
            attempt("p", 0),
            idle_on("i", "lost", 900),
            abandoned,
            in_state(attempt("fresh", 0), AttemptState::Idle, 990),
        ];
        let gone = |node: &str, _: Option<Timestamp>| (node == "lost").then(|| t(0));
        let steps = plan(&attempts, t(1000), BOUNDS, gone);
        assert_eq!(
            names(&steps),
            [
                "release c-old",
                "release c-mid",
                "expire p",
                "lose i",
                "abandon ab",
                "prune c-old",
            ]
        );
    }

    #[test]
    fn nothing_is_due_within_the_bounds_and_a_pruned_attempt_being_deleted_is_left() {
        let mut deleting = cleaned("c-old", 100, false);
        deleting.deleting = true;
        let attempts = vec![
            deleting,
            cleaned("c-mid", 200, false),
            cleaned("c-new", 300, false),
            attempt("p", 990),
            idle_on("i", "quiet", 990),
        ];
        // The node went quiet 30 s ago: within the grace.
        let steps = plan(&attempts, t(1000), BOUNDS, |_, _| Some(t(970)));
        assert!(steps.is_empty(), "{:?}", names(&steps));
    }

    /// An abandoned attempt that no longer holds the finalizer (released already, its delete
    /// pending) is left to the rest of the rules; a `false` annotation is no release.
    #[test]
    fn only_an_abandoned_attempt_still_holding_the_finalizer_is_abandoned() {
        let mut released = cleaned("gone", 100, false);
        released.abandoned = true;
        let mut kept = in_state(attempt("kept", 0), AttemptState::Busy, 990);
        kept.abandoned = false;
        let attempts = [released, kept];
        let steps = plan(&attempts, t(1000), BOUNDS, |_, _| None);
        assert!(steps.is_empty(), "{:?}", names(&steps));
    }
}
