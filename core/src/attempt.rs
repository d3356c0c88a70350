//! A `RunnerAttempt` as the operator's decisions read it ([`ValidatedAttempt`], issue 30 item
//! 2): built once per reconcile from the custom resource
//! (`runner_manager_crds::validate::attempt`), with its names resolved, its annotations parsed
//! and its timestamps unwrapped. Housekeeping ([`crate::housekeeping`]), the timeouts
//! ([`crate::timeouts`]), the failure count ([`crate::failures`]), the policy's decisions
//! ([`crate::scaling`]), demand's view ([`ValidatedAttempt::demand_view`]) and the job ledger's
//! presumption ([`crate::ledger`]) read it instead of the object, so none of them parses an
//! annotation or unwraps a name again, and all of them are tested without Kubernetes.

use std::time::Duration;

use jiff::Timestamp;

use crate::demand::AttemptView;
use crate::outcome::Outcome;
use crate::recovery::TerminationReason;
use crate::state::AttemptState;

/// The operator's termination request (`spec.termination`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TerminationAsked {
    pub reason: TerminationReason,
    pub requested_at: Timestamp,
}

/// When each step of the attempt's journal happened (`status.timestamps`), as the operator's
/// decisions read them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Times {
    pub jit_received_at: Option<Timestamp>,
    pub registered_at: Option<Timestamp>,
    pub busy_at: Option<Timestamp>,
    pub concluded_at: Option<Timestamp>,
    pub cleaned_at: Option<Timestamp>,
    pub last_state_change_at: Option<Timestamp>,
}

/// The attempt's own limits, frozen in its snapshot (`spec.snapshot.timeouts`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// From the JIT to GitHub listing the runner.
    pub registration: Duration,
    /// An idle runner's longest wait for a job.
    pub idle: Duration,
}

/// One attempt, validated: every field a decision reads, typed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidatedAttempt {
    pub namespace: String,
    pub name: String,
    /// The policy it belongs to (`spec.policy`, in the same namespace).
    pub policy: String,
    /// The node it was placed on.
    pub node: String,
    /// `metadata.creationTimestamp` (None only for an object never stored).
    pub created_at: Option<Timestamp>,
    /// The policy generation it was made for (its annotation); None when the annotation is
    /// missing or is not a number, so it counts toward no generation.
    pub policy_generation: Option<i64>,
    /// The attempt it replaces (`spec.replaces`).
    pub replaces: Option<String>,
    pub termination: Option<TerminationAsked>,
    pub timeouts: Timeouts,
    /// A person or the drain deleted it (`metadata.deletionTimestamp`).
    pub deleting: bool,
    /// It still holds the agent's cleanup finalizer.
    pub holds_cleanup_finalizer: bool,
    /// A person released it with the abandon annotation set to `true`.
    pub abandoned: bool,
    pub state: AttemptState,
    pub outcome: Option<Outcome>,
    pub times: Times,
    /// The job GitHub said the runner took (`status.job`, from the `in_progress` delivery).
    pub job: Option<i64>,
}

impl ValidatedAttempt {
    /// The operator asked it to stop, or it is being deleted: it supplies nothing.
    pub fn leaving(&self) -> bool {
        self.termination.is_some() || self.deleting
    }

    /// What the attempt is doing for demand and scale-down: a runner GitHub already said took
    /// a job (webhook `in_progress`) is busy, even before the agent takes the edge.
    pub fn effective_state(&self) -> AttemptState {
        if matches!(self.state, AttemptState::Idle | AttemptState::Starting) && self.job.is_some() {
            AttemptState::Busy
        } else {
            self.state
        }
    }

    /// The attempt as demand and scale-down see it.
    pub fn demand_view(&self) -> AttemptView<'_> {
        let state = self.effective_state();
        AttemptView {
            name: &self.name,
            state,
            termination_requested: self.leaving(),
            idle_since: (state == AttemptState::Idle)
                .then_some(self.times.last_state_change_at)
                .flatten(),
        }
    }

    /// Its last change (the journal's, else its creation): how long ago its node could last
    /// have vouched for it.
    pub fn last_change(&self) -> Option<Timestamp> {
        self.times.last_state_change_at.or(self.created_at)
    }
}

impl AsRef<ValidatedAttempt> for ValidatedAttempt {
    fn as_ref(&self) -> &ValidatedAttempt {
        self
    }
}

#[cfg(test)]
pub mod testing {
    //! One builder of validated attempts for the core's tests.
    use super::*;

    pub fn t(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap_or_else(|e| panic!("{e}"))
    }

    /// An attempt `name` of policy `web` on `node-a`, created at `created`, `Pending`.
    pub fn attempt(name: &str, created: i64) -> ValidatedAttempt {
        ValidatedAttempt {
            namespace: "team".into(),
            name: name.into(),
            policy: "web".into(),
            node: "node-a".into(),
            created_at: Some(t(created)),
            policy_generation: Some(1),
            replaces: None,
            termination: None,
            timeouts: Timeouts {
                registration: Duration::from_secs(300),
                idle: Duration::from_secs(3600),
            },
            deleting: false,
            holds_cleanup_finalizer: true,
            abandoned: false,
            state: AttemptState::Pending,
            outcome: None,
            times: Times::default(),
            job: None,
        }
    }

    /// `a` in `state`, its last change at `at`.
    pub fn in_state(mut a: ValidatedAttempt, state: AttemptState, at: i64) -> ValidatedAttempt {
        a.state = state;
        a.times.last_state_change_at = Some(t(at));
        a
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn a_runner_github_says_took_a_job_is_busy_for_demand_and_only_idle_ones_have_an_idle_time() {
        let idle = in_state(attempt("a", 0), AttemptState::Idle, 50);
        assert_eq!(idle.demand_view().state, AttemptState::Idle);
        assert_eq!(idle.demand_view().idle_since, Some(t(50)));
        let mut took = idle.clone();
        took.job = Some(7);
        assert_eq!(took.demand_view().state, AttemptState::Busy);
        assert_eq!(took.demand_view().idle_since, None);
        let mut leaving = idle;
        leaving.deleting = true;
        assert!(leaving.demand_view().termination_requested);
    }
}
