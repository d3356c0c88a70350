//! An attempt's validated view (issue 30 item 2): `runner_manager_core::attempt::
//! ValidatedAttempt`, built once from the object ([`validated_attempt`]), and the object and its
//! view held together ([`Attempt`]) for the operator's reconcile, whose decisions read the view
//! and whose writes (a CAS on the resourceVersion read, an Event's object reference) the object.

use std::sync::Arc;

use runner_manager_core::attempt::{TerminationAsked, Timeouts, Times, ValidatedAttempt};

use super::Problem;
use crate::attempt::RunnerAttempt;
use crate::{ABANDON_ANNOTATION, CLEANUP_FINALIZER, POLICY_GENERATION_ANNOTATION};

/// The attempt's validated view, or what makes it unusable: a name (an object read from the API
/// server always has one). A missing namespace reads as the empty one, as for any object this
/// crate writes; an unreadable generation annotation reads as no generation, so the attempt
/// counts toward none (a person may edit annotations; nothing breaks).
pub fn validated_attempt(a: &RunnerAttempt) -> Result<ValidatedAttempt, Problem> {
    let meta = &a.metadata;
    let name = meta
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| Problem {
            field: "metadata.name".to_owned(),
            message: "missing: an attempt read from the API server always has one".to_owned(),
        })?;
    let annotation = |key: &str| meta.annotations.as_ref().and_then(|m| m.get(key));
    let journal = a.status.as_ref().map(|s| &s.journal);
    let ts = journal.map(|j| j.timestamps());
    let at = |pick: fn(
        &crate::attempt::AttemptTimestamps,
    ) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
        ts.and_then(pick).map(|t| t.0)
    };
    let timeouts = &a.spec.snapshot.timeouts;
    Ok(ValidatedAttempt {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name,
        policy: a.spec.policy.clone(),
        node: a.spec.node_name.clone(),
        created_at: meta.creation_timestamp.as_ref().map(|t| t.0),
        policy_generation: annotation(POLICY_GENERATION_ANNOTATION).and_then(|g| g.parse().ok()),
        replaces: a.spec.replaces.clone(),
        termination: a.spec.termination.as_ref().map(|t| TerminationAsked {
            reason: t.reason,
            requested_at: t.requested_at.0,
        }),
        timeouts: Timeouts {
            registration: timeouts.registration.as_duration(),
            idle: timeouts.idle.as_duration(),
        },
        deleting: meta.deletion_timestamp.is_some(),
        holds_cleanup_finalizer: meta
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| x == CLEANUP_FINALIZER)),
        abandoned: annotation(ABANDON_ANNOTATION).is_some_and(|v| v == "true"),
        state: a.state(),
        outcome: journal.and_then(|j| j.outcome()),
        times: Times {
            jit_received_at: at(|t| t.jit_received_at.as_ref()),
            registered_at: at(|t| t.registered_at.as_ref()),
            busy_at: at(|t| t.busy_at.as_ref()),
            concluded_at: at(|t| t.concluded_at.as_ref()),
            cleaned_at: at(|t| t.cleaned_at.as_ref()),
            last_state_change_at: at(|t| t.last_state_change_at.as_ref()),
        },
        job: a
            .status
            .as_ref()
            .and_then(|s| s.facts.job.as_ref())
            .map(|j| j.id),
    })
}

/// An attempt as the operator's reconcile holds it: the object as cached, and its view,
/// validated once. Decisions read [`view`](Self::view) (through `AsRef`); only the I/O that
/// writes back reads [`object`](Self::object).
#[derive(Clone, Debug)]
pub struct Attempt {
    pub object: Arc<RunnerAttempt>,
    pub view: ValidatedAttempt,
}

impl Attempt {
    /// The object with its view, or why it has none ([`validated_attempt`]).
    pub fn of(object: Arc<RunnerAttempt>) -> Result<Self, Problem> {
        let view = validated_attempt(&object)?;
        Ok(Self { object, view })
    }

    /// Each object that validates, with its view; each that does not is named in the second
    /// list with its problem.
    pub fn all(objects: impl IntoIterator<Item = Arc<RunnerAttempt>>) -> (Vec<Self>, Vec<Problem>) {
        let mut held = Vec::new();
        let mut refused = Vec::new();
        for o in objects {
            match Self::of(o) {
                Ok(a) => held.push(a),
                Err(p) => refused.push(p),
            }
        }
        (held, refused)
    }

    pub fn name(&self) -> &str {
        &self.view.name
    }

    pub fn namespace(&self) -> &str {
        &self.view.namespace
    }
}

impl AsRef<ValidatedAttempt> for Attempt {
    fn as_ref(&self) -> &ValidatedAttempt {
        &self.view
    }
}

#[cfg(all(test, feature = "fixtures"))]
mod tests {
    use super::*;
    use crate::attempt::{TerminationReason, TerminationRequest};
    use crate::fixtures::{AttemptBuilder, at};
    use crate::outcome::Outcome;
    use crate::state::AttemptState;

    /// Every field a decision reads comes from where the object keeps it, parsed once.
    #[test]
    fn the_view_reads_each_field_from_the_object() {
        let mut o = AttemptBuilder::new("web-1", "web")
            .namespace("team")
            .node("node-a")
            .created(at(100))
            .state(AttemptState::Busy)
            .edges_at(at(200))
            .job(42)
            .annotation(POLICY_GENERATION_ANNOTATION, "3")
            .annotation(ABANDON_ANNOTATION, "true")
            .build();
        o.metadata.finalizers = Some(vec![CLEANUP_FINALIZER.to_owned()]);
        o.spec.replaces = Some("web-0".into());
        o.spec.termination = Some(TerminationRequest {
            reason: TerminationReason::Drain,
            requested_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(250)),
            deregistered: false,
        });
        let v = validated_attempt(&o).unwrap_or_else(|p| panic!("{p}"));
        assert_eq!(
            (
                v.namespace.as_str(),
                v.name.as_str(),
                v.policy.as_str(),
                v.node.as_str()
            ),
            ("team", "web-1", "web", "node-a")
        );
        assert_eq!(v.created_at, Some(at(100)));
        assert_eq!(v.policy_generation, Some(3));
        assert_eq!(v.replaces.as_deref(), Some("web-0"));
        assert_eq!(
            v.termination,
            Some(TerminationAsked {
                reason: TerminationReason::Drain,
                requested_at: at(250)
            })
        );
        assert_eq!(v.timeouts.registration, std::time::Duration::from_secs(60));
        assert_eq!(v.timeouts.idle, std::time::Duration::from_secs(120));
        assert!(v.holds_cleanup_finalizer && v.abandoned && !v.deleting);
        assert_eq!(v.state, AttemptState::Busy);
        assert_eq!(v.times.busy_at, Some(at(200)));
        assert_eq!(v.times.last_state_change_at, Some(at(200)));
        assert_eq!(v.job, Some(42));

        let done = AttemptBuilder::new("web-2", "web")
            .concluded(Outcome::CompletedJob, AttemptState::Busy)
            .edges_at(at(300))
            .build();
        let v = validated_attempt(&done).unwrap_or_else(|p| panic!("{p}"));
        assert_eq!(v.outcome, Some(Outcome::CompletedJob));
        assert_eq!(v.times.concluded_at, Some(at(300)));
    }

    /// An annotation a person edited into nonsense counts toward no generation; `abandon` must
    /// say `true`; a nameless object has no view, and the problem names the field.
    #[test]
    fn bad_annotations_read_as_absent_and_a_nameless_object_is_refused() {
        let o = AttemptBuilder::new("web-1", "web")
            .annotation(POLICY_GENERATION_ANNOTATION, "two")
            .annotation(ABANDON_ANNOTATION, "yes")
            .build();
        let v = validated_attempt(&o).unwrap_or_else(|p| panic!("{p}"));
        assert_eq!(v.policy_generation, None);
        assert!(!v.abandoned);
        let mut nameless = o;
        nameless.metadata.name = None;
        let (held, refused) = Attempt::all([Arc::new(nameless)]);
        assert!(held.is_empty());
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].field, "metadata.name");
    }
}
