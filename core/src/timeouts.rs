//! What is due for one attempt at a moment (DESIGN §4 rules 3 and 9, §3's two operator edges):
//! a termination request for a runner past its registration or idle timeout, the
//! `ExpireAdmission` edge for a `Pending` attempt nobody admitted, the `LoseNode` edge for a live
//! attempt whose node's agent has been gone past the grace. Pure.

use std::time::Duration;

use jiff::Timestamp;

use crate::attempt::ValidatedAttempt;
use crate::recovery::TerminationReason;
use crate::state::AttemptState;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// Deregister, then ask the agent to stop it.
    Terminate(TerminationReason),
    /// The operator's `Pending → Cleaned (Rejected(AdmissionTimeout))` edge.
    ExpireAdmission,
    /// The operator's `live → Orphaned(NodeLost)` edge.
    LoseNode,
}

fn older_than(since: Option<Timestamp>, limit: Duration, now: Timestamp) -> bool {
    let Some(since) = since else {
        return false;
    };
    let age = now.as_millisecond().saturating_sub(since.as_millisecond());
    age > i64::try_from(limit.as_millis()).unwrap_or(i64::MAX)
}

/// `node_gone_since`: when the attempt's node's agent Lease expired (None while it is fresh).
pub fn due(
    a: &ValidatedAttempt,
    now: Timestamp,
    admission_timeout: Duration,
    node_gone_since: Option<Timestamp>,
    node_lost_grace: Duration,
) -> Option<Due> {
    if a.state == AttemptState::Pending {
        return older_than(a.created_at, admission_timeout, now).then_some(Due::ExpireAdmission);
    }
    if a.state.is_live() && older_than(node_gone_since, node_lost_grace, now) {
        return Some(Due::LoseNode);
    }
    if a.termination.is_some() {
        return None;
    }
    match a.state {
        AttemptState::JitReceived | AttemptState::Starting => {
            older_than(a.times.jit_received_at, a.timeouts.registration, now)
                .then_some(Due::Terminate(TerminationReason::RegistrationTimeout))
        }
        AttemptState::Idle => {
            let since = a.times.last_state_change_at.or(a.times.registered_at);
            older_than(since, a.timeouts.idle, now)
                .then_some(Due::Terminate(TerminationReason::IdleTimeout))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempt::TerminationAsked;
    use crate::attempt::testing::{attempt, in_state, t};

    const ADMIT: Duration = Duration::from_secs(60);
    const GRACE: Duration = Duration::from_secs(600);

    /// `web-1`, created at 1000, its JIT received at `at` (registration timeout 60 s).
    fn starting(at: i64) -> ValidatedAttempt {
        let mut a = in_state(attempt("web-1", 1000), AttemptState::Starting, at);
        a.times.jit_received_at = Some(t(at));
        a.timeouts.registration = Duration::from_secs(60);
        a.timeouts.idle = Duration::from_secs(120);
        a
    }

    #[test]
    fn pending_past_admission_expires() {
        let a = attempt("web-1", 1000);
        assert_eq!(due(&a, t(1030), ADMIT, None, GRACE), None);
        assert_eq!(
            due(&a, t(1061), ADMIT, None, GRACE),
            Some(Due::ExpireAdmission)
        );
    }

    #[test]
    fn registration_and_idle_timeouts() {
        let mut a = starting(2000);
        assert_eq!(due(&a, t(2050), ADMIT, None, GRACE), None);
        assert_eq!(
            due(&a, t(2061), ADMIT, None, GRACE),
            Some(Due::Terminate(TerminationReason::RegistrationTimeout))
        );
        a.termination = Some(TerminationAsked {
            reason: TerminationReason::RegistrationTimeout,
            requested_at: t(2061),
        });
        assert_eq!(due(&a, t(3000), ADMIT, None, GRACE), None, "asked once");
        a.termination = None;
        a.state = AttemptState::Idle;
        a.times.registered_at = Some(t(2100));
        a.times.last_state_change_at = Some(t(2100));
        assert_eq!(due(&a, t(2200), ADMIT, None, GRACE), None);
        assert_eq!(
            due(&a, t(2221), ADMIT, None, GRACE),
            Some(Due::Terminate(TerminationReason::IdleTimeout))
        );
        a.state = AttemptState::Busy;
        a.times.last_state_change_at = Some(t(2150));
        assert_eq!(due(&a, t(9999), ADMIT, None, GRACE), None, "busy: never");
    }

    #[test]
    fn a_live_attempt_on_a_lost_node_is_orphaned_after_the_grace() {
        let a = starting(2000);
        assert_eq!(due(&a, t(2030), ADMIT, Some(t(2000)), GRACE), None);
        assert_eq!(
            due(&a, t(2601), ADMIT, Some(t(2000)), GRACE),
            Some(Due::LoseNode)
        );
    }
}
