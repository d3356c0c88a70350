//! What is due for one attempt at a moment (DESIGN §4 rules 3 and 9, §3's two operator edges):
//! a termination request for a runner past its registration or idle timeout, the
//! `ExpireAdmission` edge for a `Pending` attempt nobody admitted, the `LoseNode` edge for a live
//! attempt whose node's agent has been gone past the grace. Pure.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use runner_manager_crds::attempt::{RunnerAttempt, TerminationReason};
use runner_manager_crds::state::AttemptState;

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
    a: &RunnerAttempt,
    now: Timestamp,
    admission_timeout: Duration,
    node_gone_since: Option<Timestamp>,
    node_lost_grace: Duration,
) -> Option<Due> {
    let journal = a.status.as_ref().map(|s| &s.journal);
    let state = journal.map(|j| j.state()).unwrap_or_default();
    let ts = journal.map(|j| j.timestamps());
    let created = a.metadata.creation_timestamp.as_ref().map(|t| t.0);
    if state == AttemptState::Pending {
        return older_than(created, admission_timeout, now).then_some(Due::ExpireAdmission);
    }
    if state.is_live() && older_than(node_gone_since, node_lost_grace, now) {
        return Some(Due::LoseNode);
    }
    if a.spec.termination.is_some() {
        return None;
    }
    let timeouts = &a.spec.snapshot.timeouts;
    match state {
        AttemptState::JitReceived | AttemptState::Starting => {
            let since = ts.and_then(|t| t.jit_received_at.as_ref()).map(|t| t.0);
            older_than(since, timeouts.registration.as_duration(), now)
                .then_some(Due::Terminate(TerminationReason::RegistrationTimeout))
        }
        AttemptState::Idle => {
            let since = ts
                .and_then(|t| t.last_state_change_at.as_ref().or(t.registered_at.as_ref()))
                .map(|t| t.0);
            older_than(since, timeouts.idle.as_duration(), now)
                .then_some(Due::Terminate(TerminationReason::IdleTimeout))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use runner_manager_crds::attempt::{
        AttemptJournal, Launcher, ProcessIdentity, RunnerAttemptStatus, RunnerRegistration,
        StartedIdentity, TerminationRequest, Transition, WorkspacePlacement,
    };
    use runner_manager_crds::state::Actor;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn attempt() -> RunnerAttempt {
        runner_manager_crds::fixtures::AttemptBuilder::new("web-1", "web")
            .node("n")
            .created(t(1000))
            .build()
    }

    fn walk(a: &mut RunnerAttempt, steps: Vec<(Actor, Transition)>, at: i64) {
        let kind = a.spec.snapshot.kind();
        let mut j = a
            .status
            .as_ref()
            .map(|s| s.journal.clone())
            .unwrap_or_default();
        for (actor, tr) in steps {
            j = j.apply(actor, kind, tr, t(at)).unwrap();
        }
        a.status = Some(RunnerAttemptStatus {
            journal: j,
            ..RunnerAttemptStatus::default()
        });
    }

    fn to_starting(a: &mut RunnerAttempt, at: i64) {
        walk(
            a,
            vec![
                (
                    Actor::Agent,
                    Transition::Admit {
                        placement: WorkspacePlacement::ephemeral("/r"),
                        spec_hash: "h".into(),
                    },
                ),
                (Actor::Agent, Transition::MarkPrepared { environment: None }),
                (
                    Actor::Broker,
                    Transition::ReceiveJit {
                        runner: RunnerRegistration {
                            name: "runner-manager-x".into(),
                            id: 1,
                        },
                    },
                ),
                (
                    Actor::Agent,
                    Transition::Start {
                        identity: StartedIdentity::Process(ProcessIdentity {
                            launcher: Launcher::Direct,
                            unit: None,
                            pid: 1,
                            start_time: 1,
                            cgroup: "/x".into(),
                        }),
                    },
                ),
            ],
            at,
        );
    }

    const ADMIT: Duration = Duration::from_secs(60);
    const GRACE: Duration = Duration::from_secs(600);

    #[test]
    fn pending_past_admission_expires() {
        let a = attempt();
        assert_eq!(due(&a, t(1030), ADMIT, None, GRACE), None);
        assert_eq!(
            due(&a, t(1061), ADMIT, None, GRACE),
            Some(Due::ExpireAdmission)
        );
    }

    #[test]
    fn registration_and_idle_timeouts() {
        let mut a = attempt();
        to_starting(&mut a, 2000);
        assert_eq!(due(&a, t(2050), ADMIT, None, GRACE), None);
        assert_eq!(
            due(&a, t(2061), ADMIT, None, GRACE),
            Some(Due::Terminate(TerminationReason::RegistrationTimeout))
        );
        a.spec.termination = Some(TerminationRequest {
            reason: TerminationReason::RegistrationTimeout,
            requested_at: Time(t(2061)),
            deregistered: true,
        });
        assert_eq!(due(&a, t(3000), ADMIT, None, GRACE), None, "asked once");
        a.spec.termination = None;
        walk(&mut a, vec![(Actor::Agent, Transition::RegisterIdle)], 2100);
        assert_eq!(due(&a, t(2200), ADMIT, None, GRACE), None);
        assert_eq!(
            due(&a, t(2221), ADMIT, None, GRACE),
            Some(Due::Terminate(TerminationReason::IdleTimeout))
        );
        walk(&mut a, vec![(Actor::Agent, Transition::AssignJob)], 2150);
        assert_eq!(due(&a, t(9999), ADMIT, None, GRACE), None, "busy: never");
    }

    #[test]
    fn a_live_attempt_on_a_lost_node_is_orphaned_after_the_grace() {
        let mut a = attempt();
        to_starting(&mut a, 2000);
        assert_eq!(due(&a, t(2030), ADMIT, Some(t(2000)), GRACE), None);
        assert_eq!(
            due(&a, t(2601), ADMIT, Some(t(2000)), GRACE),
            Some(Due::LoseNode)
        );
        let _ = AttemptJournal::default();
    }
}
