//! The one journal writer: every write of an attempt's journal (its `state` edges, the launch
//! timings that go with `Starting`, its conditions) by the agent, the broker and the operator
//! goes through [`JournalWriter`]. Each write is built by [`crate::patch`] (so an edge the state
//! machine refuses, or one on a changed spec, is refused before anything is sent) and sent as a
//! compare-and-swap on the `metadata.resourceVersion` it was decided on. A conflict is re-read
//! and re-decided, never overwritten: the decision is a function of the object, so it is taken
//! again on the fresh one — or, for a writer whose decision rests on more than the object (the
//! operator's `NodeLost` rests on a Lease it read from a cache), left to its next pass.

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};

use crate::attempt::{LaunchTimings, RunnerAttempt, Transition};
use crate::patch::{
    AttemptCondition, PatchError, condition_patch, journal_patch, journal_patch_with_launch,
    journal_path_patch,
};
use runner_manager_core::state::Actor;

/// How many times a conflicting write is re-read and re-decided before giving up. A conflict
/// means someone else wrote in between; more than a few in a row means something is wrong.
pub const MAX_CONFLICTS: usize = 8;

/// Why a journal write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error(transparent)]
    Patch(#[from] PatchError),
    #[error("gave up after {MAX_CONFLICTS} conflicting writes in a row")]
    Contended,
    #[error("API server: {0}")]
    Kube(#[from] kube::Error),
}

impl JournalError {
    /// Whether the write lost a compare-and-swap (the object changed since it was read).
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Kube(kube::Error::Api(s)) if s.code == 409)
    }

    /// Whether the attempt is gone.
    pub fn is_gone(&self) -> bool {
        matches!(self, Self::Kube(kube::Error::Api(s)) if s.code == 404)
    }
}

/// What the writer decides for the attempt as it is now.
#[derive(Debug)]
pub enum Decision {
    /// Nothing to write.
    Nothing,
    /// Take this edge.
    Take(Transition),
    /// Take this edge and record the launch step timings in the same write.
    TakeWithLaunch(Transition, Box<LaunchTimings>),
    /// Take these edges in order in one write (no effect lies between them); empty = nothing.
    TakePath(Vec<Transition>),
    /// Set this condition (nothing is written when the journal already says it).
    Condition(AttemptCondition),
}

/// What a writer does when its compare-and-swap loses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnConflict {
    /// Re-read the attempt and decide again (up to [`MAX_CONFLICTS`] times).
    Reread,
    /// Return the conflict: the caller decides again on its next pass.
    Return,
}

/// The CAS merge patch of `decision` on `current`, or `None` when there is nothing to write.
/// Pure: the state machine and the spec-hash rule are applied here.
pub fn decision_patch(
    current: &RunnerAttempt,
    actor: Actor,
    decision: Decision,
    now: Timestamp,
) -> Result<Option<serde_json::Value>, PatchError> {
    Ok(match decision {
        Decision::Nothing => None,
        Decision::Take(t) => Some(journal_patch(current, actor, t, now)?.1),
        Decision::TakeWithLaunch(t, launch) => {
            Some(journal_patch_with_launch(current, actor, t, &launch, now)?.1)
        }
        Decision::TakePath(path) if path.is_empty() => None,
        Decision::TakePath(path) => Some(journal_path_patch(current, actor, &path, now)?.1),
        Decision::Condition(c) => condition_patch(current, c)?,
    })
}

/// The journal writer of one actor in one namespace.
#[derive(Clone)]
pub struct JournalWriter {
    api: Api<RunnerAttempt>,
    actor: Actor,
    params: PatchParams,
    on_conflict: OnConflict,
}

impl std::fmt::Debug for JournalWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalWriter")
            .field("actor", &self.actor)
            .field("on_conflict", &self.on_conflict)
            .finish_non_exhaustive()
    }
}

impl JournalWriter {
    /// `actor`'s writer through `api`; conflicts are re-read and re-decided.
    pub fn new(api: Api<RunnerAttempt>, actor: Actor) -> Self {
        Self {
            api,
            actor,
            params: PatchParams::default(),
            on_conflict: OnConflict::Reread,
        }
    }

    /// Writes carry this field manager.
    #[must_use]
    pub fn field_manager(mut self, manager: &str) -> Self {
        self.params.field_manager = Some(manager.to_owned());
        self
    }

    /// What to do when a write loses its compare-and-swap.
    #[must_use]
    pub fn on_conflict(mut self, on_conflict: OnConflict) -> Self {
        self.on_conflict = on_conflict;
        self
    }

    /// Write what `decide` picks for the attempt `name`, deciding first on `known` (the object
    /// as last read — a watch event or a cache — whose resourceVersion the CAS carries) or, with
    /// none, on a fresh read. A conflict re-reads (one GET) and decides again. Returns the
    /// written object, or `None` when the decision was to write nothing.
    pub async fn advance(
        &self,
        name: &str,
        known: Option<&RunnerAttempt>,
        mut decide: impl FnMut(&RunnerAttempt) -> Decision,
    ) -> Result<Option<RunnerAttempt>, JournalError> {
        let mut fresh;
        let mut current = match known {
            Some(a) => a,
            None => {
                fresh = self.api.get_status(name).await?;
                &fresh
            }
        };
        for _ in 0..MAX_CONFLICTS {
            match self.write(current, decide(current), Timestamp::now()).await {
                Err(e) if e.is_conflict() && self.on_conflict == OnConflict::Reread => {
                    fresh = self.api.get_status(name).await?;
                    current = &fresh;
                }
                other => return other,
            }
        }
        Err(JournalError::Contended)
    }

    /// One CAS write of `decision` against `current`. A 409 means `current` is stale.
    pub async fn write(
        &self,
        current: &RunnerAttempt,
        decision: Decision,
        now: Timestamp,
    ) -> Result<Option<RunnerAttempt>, JournalError> {
        let Some(patch) = decision_patch(current, self.actor, decision, now)? else {
            return Ok(None);
        };
        let name = current.metadata.name.as_deref().unwrap_or_default();
        Ok(Some(
            self.api
                .patch_status(name, &self.params, &Patch::Merge(&patch))
                .await?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempt::{
        AttemptConditionType, AttemptJournal, AttemptReason, WorkspacePlacement, spec_hash,
    };
    use crate::conditions::ConditionStatus;
    use runner_manager_core::outcome::Outcome;

    fn attempt() -> RunnerAttempt {
        crate::fixtures::AttemptBuilder::new("web-1", "web")
            .node("n")
            .resource_version("7")
            .build()
    }

    fn condition(status: ConditionStatus) -> AttemptCondition {
        AttemptCondition {
            type_: AttemptConditionType::PackageRefused,
            status,
            reason: AttemptReason::PackageUnsafe,
            message: "m".into(),
            last_transition_time: None,
            observed_generation: None,
        }
    }

    #[test]
    fn an_edge_the_state_machine_refuses_is_never_sent() {
        let a = attempt();
        let now = Timestamp::now();
        // Pending cannot complete a job, and the agent may not take the broker's edge.
        for (actor, t) in [
            (Actor::Agent, Transition::Conclude(Outcome::CompletedJob)),
            (
                Actor::Agent,
                Transition::ReceiveJit {
                    runner: crate::attempt::RunnerRegistration {
                        name: "r".into(),
                        id: 1,
                    },
                },
            ),
        ] {
            let r = decision_patch(&a, actor, Decision::Take(t), now);
            assert!(matches!(r, Err(PatchError::Edge(_))), "{r:?}");
        }
        // The admission the machine allows carries the resourceVersion it was decided on.
        let admit = Transition::Admit {
            placement: WorkspacePlacement::ephemeral("/r/x"),
            spec_hash: spec_hash(&a.spec),
        };
        let patch = decision_patch(&a, Actor::Agent, Decision::Take(admit), now)
            .unwrap()
            .unwrap();
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        assert_eq!(patch["status"]["state"], "Allocated");
        assert!(
            decision_patch(&a, Actor::Agent, Decision::Nothing, now)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn a_read_without_a_resource_version_is_refused_for_edges_and_conditions() {
        let mut a = attempt();
        a.metadata.resource_version = None;
        let now = Timestamp::now();
        let c = decision_patch(
            &a,
            Actor::Agent,
            Decision::Condition(condition(ConditionStatus::True)),
            now,
        );
        assert!(matches!(c, Err(PatchError::NoResourceVersion)), "{c:?}");
    }

    #[test]
    fn a_condition_is_a_cas_and_is_written_only_when_it_changes() {
        let mut a = attempt();
        let now = Timestamp::now();
        let set = |a: &RunnerAttempt, s| {
            decision_patch(a, Actor::Agent, Decision::Condition(condition(s)), now).unwrap()
        };
        let first = set(&a, ConditionStatus::True).unwrap();
        assert_eq!(first["metadata"]["resourceVersion"], "7");
        let mut status = crate::attempt::RunnerAttemptStatus::default();
        status.journal.conditions =
            serde_json::from_value(first["status"]["conditions"].clone()).unwrap();
        a.status = Some(status);
        assert!(set(&a, ConditionStatus::True).is_none(), "unchanged");
        let resolved = set(&a, ConditionStatus::False).unwrap();
        let conditions = resolved["status"]["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 1, "one condition per type");
        assert_eq!(conditions[0]["status"], "False");
    }

    #[test]
    fn a_path_is_one_write_allowed_exactly_when_each_edge_is_in_turn() {
        let a = attempt();
        let now = Timestamp::now();
        let admit = Transition::Admit {
            placement: WorkspacePlacement::ephemeral("/r/x"),
            spec_hash: spec_hash(&a.spec),
        };
        let prepared = Transition::MarkPrepared { environment: None };
        let path =
            |p: Vec<Transition>| decision_patch(&a, Actor::Agent, Decision::TakePath(p), now);
        let both = path(vec![admit.clone(), prepared.clone()])
            .unwrap()
            .unwrap();
        assert_eq!(
            both["metadata"]["resourceVersion"], "7",
            "one CAS on the read"
        );
        assert_eq!(both["status"]["state"], "Prepared");
        // A conclusion and its cleanup from the admission, as one write.
        let concluded = path(vec![
            admit.clone(),
            Transition::Conclude(Outcome::Failed(
                runner_manager_core::outcome::FailureReason::WorkspaceUnavailable,
            )),
            Transition::Clean,
        ])
        .unwrap()
        .unwrap();
        assert_eq!(concluded["status"]["state"], "Cleaned");
        assert_eq!(
            concluded["status"]["outcome"]["reason"],
            "WorkspaceUnavailable"
        );
        // Any edge the machine refuses in turn refuses the whole path: out of order, twice, or
        // another actor's.
        for bad in [
            vec![prepared.clone(), admit.clone()],
            vec![admit.clone(), admit.clone()],
            vec![
                admit.clone(),
                prepared.clone(),
                Transition::ReceiveJit {
                    runner: crate::attempt::RunnerRegistration {
                        name: "r".into(),
                        id: 1,
                    },
                },
            ],
        ] {
            let r = path(bad);
            assert!(matches!(r, Err(PatchError::Edge(_))), "{r:?}");
        }
        assert!(
            path(vec![]).unwrap().is_none(),
            "an empty path writes nothing"
        );
    }

    /// The attempt of [`attempt`] walked to `Starting` by the actors that own each edge.
    fn started() -> RunnerAttempt {
        use crate::attempt::{Launcher, ProcessIdentity, RunnerRegistration, StartedIdentity};
        let mut a = attempt();
        let now = Timestamp::now();
        let mut journal = AttemptJournal::default();
        for (actor, t) in [
            (
                Actor::Agent,
                Transition::Admit {
                    placement: WorkspacePlacement::ephemeral("/r/x"),
                    spec_hash: spec_hash(&a.spec),
                },
            ),
            (Actor::Agent, Transition::MarkPrepared { environment: None }),
            (
                Actor::Broker,
                Transition::ReceiveJit {
                    runner: RunnerRegistration {
                        name: "r".into(),
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
                        pid: 42,
                        start_time: 1,
                        cgroup: "/rm/x".into(),
                    }),
                },
            ),
        ] {
            journal = journal
                .apply(actor, a.spec.snapshot.kind(), t, now)
                .unwrap();
        }
        a.status.get_or_insert_with(Default::default).journal = journal;
        a
    }

    #[test]
    fn a_runner_that_exited_under_a_changed_spec_still_concludes_along_its_path() {
        let now = Timestamp::now();
        let mut a = started();
        // Edited after admission: the admitted hash no longer matches.
        a.spec.snapshot.labels.push("edited".into());
        let path = |a: &RunnerAttempt, p: Vec<Transition>| {
            decision_patch(a, Actor::Agent, Decision::TakePath(p), now)
        };
        // A path to a conclusion, through `edge` on the way: written.
        let concluded = |a: &RunnerAttempt, edge: Transition, outcome: Outcome| {
            path(a, vec![edge, Transition::Conclude(outcome)])
                .unwrap()
                .unwrap()
        };
        // Acting on the changed spec stays refused: a job edge alone is not a conclusion.
        let alone = path(&a, vec![Transition::AssignJob]);
        assert!(matches!(alone, Err(PatchError::SpecChanged)), "{alone:?}");
        // The runner took a job and exited: recording that on the way to the conclusion is not
        // acting on the spec.
        let done = concluded(&a, Transition::AssignJob, Outcome::CompletedJob);
        assert_eq!(done["status"]["outcome"]["kind"], "CompletedJob", "{done}");
        // GitHub showed an assignment the runner never took, then it exited idle.
        let mut busy = a.clone();
        let journal = busy.status.as_ref().unwrap().journal.clone();
        busy.status.as_mut().unwrap().journal = journal
            .apply(
                Actor::Agent,
                busy.spec.snapshot.kind(),
                Transition::AssignJob,
                now,
            )
            .unwrap();
        let idle = concluded(
            &busy,
            Transition::AssignmentNotTaken,
            Outcome::ExitedIdleWithoutWork,
        );
        assert_eq!(
            idle["status"]["outcome"]["kind"], "ExitedIdleWithoutWork",
            "{idle}"
        );
        let alone = path(&busy, vec![Transition::AssignmentNotTaken]);
        assert!(matches!(alone, Err(PatchError::SpecChanged)), "{alone:?}");
    }
}
