//! The attempt state machine: states, the edges between them, who may take each edge, and what
//! counts against a node's capacity. Pure: the journal (`attempt.rs`) applies these rules to
//! `RunnerAttempt.status` and every writer goes through it.
//!
//! ```text
//! Pending ─Admit→ Allocated ─(Oci: BeginPrepare→ Preparing)─MarkPrepared→ Prepared
//!    │                │                                                      │
//!    │                └── ReceiveJit (broker; native) ──┐   ReceiveJit (broker)
//!    └Reject/ExpireAdmission→ Cleaned                   ▼                    ▼
//!                                    Starting ←Start─ JitReceived ◀──────────┘
//!                                       │ RegisterIdle / AssignJob
//!                                       ▼
//!                              Idle ⇄ Busy      (AssignJob / AssignmentNotTaken)
//! live ─Fail/Orphan/LoseNode→ Failed|Orphaned;  Idle ─ExitIdle→ Finished;  Busy ─CompleteJob→ Finished
//! concluded ─Clean→ Cleaned (native)
//! concluded|CleanupDeferred ─BeginDestroy→ Destroying ─DeferCleanup→ CleanupDeferred
//!                                           Destroying ─Clean→ Cleaned (OCI)
//! ```
//!
//! A native attempt goes `Allocated → JitReceived` in the broker's one CAS (issue 32: one write
//! fewer per attempt). The agent's JIT request is its claim that preparation is done; a native
//! `Prepared` journalled nothing but the state (its `MarkPrepared` carries no pod identity). A
//! crash before the broker's CAS leaves `Allocated`, which recovery concludes
//! `PreparationInterrupted`, as it did between the materialize and `Prepared`. A native
//! `MarkPrepared` stays legal, and the broker serves a native `Prepared`, for an attempt an agent
//! of the previous version prepared before an upgrade.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An execution mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ExecutionMode {
    /// A host process in its own cgroup, as a runner account of the node's pool.
    #[default]
    Native,
    /// A pod pinned to the node, from an image pinned by digest.
    Oci,
}

/// Where an attempt is in its life.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
)]
pub enum AttemptState {
    /// Created by the operator and bound to a node; the agent has not admitted it yet.
    #[default]
    Pending,
    /// Admitted: the workspace placement (and slot lease) is journalled. Nothing external yet.
    Allocated,
    /// (OCI) the pod is being prepared.
    Preparing,
    /// The workspace is materialized (and, OCI, the pod identity journalled): ready for a JIT.
    Prepared,
    /// The broker minted the JIT and journalled the runner id before handing it out.
    JitReceived,
    /// The runner process or pod was started; its identity is journalled.
    Starting,
    /// GitHub lists the runner online without a job.
    Idle,
    /// The runner has a job.
    Busy,
    /// Concluded: completed its job, or exited idle.
    Finished,
    /// Concluded: failed.
    Failed,
    /// Concluded: the process or the node went away.
    Orphaned,
    /// (OCI) the pod is being torn down.
    Destroying,
    /// (OCI) teardown could not prove the pod gone; retried with backoff.
    CleanupDeferred,
    /// Workspace scrubbed (or retained, persistent), package lease released. Final.
    Cleaned,
}

impl AttemptState {
    pub const ALL: [Self; 14] = [
        Self::Pending,
        Self::Allocated,
        Self::Preparing,
        Self::Prepared,
        Self::JitReceived,
        Self::Starting,
        Self::Idle,
        Self::Busy,
        Self::Finished,
        Self::Failed,
        Self::Orphaned,
        Self::Destroying,
        Self::CleanupDeferred,
        Self::Cleaned,
    ];

    /// Admitted and not yet concluded: something may exist on the node or on GitHub.
    pub fn is_live(self) -> bool {
        matches!(
            self,
            Self::Allocated
                | Self::Preparing
                | Self::Prepared
                | Self::JitReceived
                | Self::Starting
                | Self::Idle
                | Self::Busy
        )
    }

    /// Concluded with an outcome and awaiting cleanup.
    pub fn is_concluded(self) -> bool {
        matches!(self, Self::Finished | Self::Failed | Self::Orphaned)
    }

    /// Past the conclusion: an outcome is recorded and the state only moves toward `Cleaned`.
    pub fn is_terminal(self) -> bool {
        self.is_concluded()
            || matches!(
                self,
                Self::Destroying | Self::CleanupDeferred | Self::Cleaned
            )
    }

    /// Whether an attempt in this state holds a unit of its node's capacity. Every attempt that
    /// may still hold a process or pod counts, and every `Pending` one (it was placed on the
    /// node). A concluded native attempt does not: its process was proven gone before the
    /// conclusion. A concluded OCI attempt does until teardown proves its pod gone.
    pub fn counts_against_capacity(self, execution: ExecutionMode) -> bool {
        match self {
            Self::Pending => true,
            s if s.is_live() => true,
            Self::Destroying | Self::CleanupDeferred => true,
            s if s.is_concluded() => execution == ExecutionMode::Oci,
            _ => false,
        }
    }
}

/// Who may take an edge. The agent is the one writer of `state`; two exceptions are named.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Actor {
    /// The node agent of the attempt's node.
    Agent,
    /// The operator's JIT broker: `Prepared → JitReceived`, before the JIT leaves it.
    Broker,
    /// The operator: `NodeLost` when the node's Lease stayed expired, and admission timeouts.
    Operator,
}

/// Every edge of the machine, without payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EdgeKind {
    Admit,
    Reject,
    ExpireAdmission,
    BeginPrepare,
    MarkPrepared,
    ReceiveJit,
    Start,
    RegisterIdle,
    AssignJob,
    AssignmentNotTaken,
    CompleteJob,
    ExitIdle,
    Fail,
    Orphan,
    LoseNode,
    BeginDestroy,
    DeferCleanup,
    Clean,
}

/// An edge was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EdgeError {
    #[error("edge {edge:?} is not allowed from {from:?} for {execution:?} execution")]
    Illegal {
        edge: EdgeKind,
        from: AttemptState,
        execution: ExecutionMode,
    },
    #[error("edge {edge:?} may be taken by {allowed:?}, not {by:?}")]
    WrongActor {
        edge: EdgeKind,
        by: Actor,
        allowed: Actor,
    },
    #[error("edge {edge:?} is missing what it must record: {missing}")]
    Precondition {
        edge: EdgeKind,
        missing: &'static str,
    },
}

impl EdgeKind {
    pub const ALL: [Self; 18] = [
        Self::Admit,
        Self::Reject,
        Self::ExpireAdmission,
        Self::BeginPrepare,
        Self::MarkPrepared,
        Self::ReceiveJit,
        Self::Start,
        Self::RegisterIdle,
        Self::AssignJob,
        Self::AssignmentNotTaken,
        Self::CompleteJob,
        Self::ExitIdle,
        Self::Fail,
        Self::Orphan,
        Self::LoseNode,
        Self::BeginDestroy,
        Self::DeferCleanup,
        Self::Clean,
    ];

    /// Who may take this edge.
    pub fn actor(self) -> Actor {
        match self {
            Self::ReceiveJit => Actor::Broker,
            // Nobody else is left to write them: the agent is gone or never answered.
            Self::LoseNode | Self::ExpireAdmission => Actor::Operator,
            _ => Actor::Agent,
        }
    }

    /// The state this edge leads to from `from`, or why it may not be taken.
    pub fn target(
        self,
        from: AttemptState,
        execution: ExecutionMode,
    ) -> Result<AttemptState, EdgeError> {
        use AttemptState as S;
        use ExecutionMode::{Native, Oci};
        let to = match (self, from, execution) {
            (Self::Admit, S::Pending, _) => Some(S::Allocated),
            (Self::Reject | Self::ExpireAdmission, S::Pending, _) => Some(S::Cleaned),
            (Self::BeginPrepare, S::Allocated, Oci) => Some(S::Preparing),
            (Self::MarkPrepared, S::Allocated, Native) => Some(S::Prepared),
            (Self::MarkPrepared, S::Preparing, Oci) => Some(S::Prepared),
            (Self::ReceiveJit, S::Prepared, _) => Some(S::JitReceived),
            (Self::ReceiveJit, S::Allocated, Native) => Some(S::JitReceived),
            (Self::Start, S::JitReceived, _) => Some(S::Starting),
            (Self::RegisterIdle, S::Starting, _) => Some(S::Idle),
            (Self::AssignJob, S::Starting | S::Idle, _) => Some(S::Busy),
            (Self::AssignmentNotTaken, S::Busy, _) => Some(S::Idle),
            (Self::CompleteJob, S::Busy, _) => Some(S::Finished),
            (Self::ExitIdle, S::Idle, _) => Some(S::Finished),
            (Self::Fail, s, _) if s.is_live() => Some(S::Failed),
            (Self::Orphan | Self::LoseNode, s, _) if s.is_live() => Some(S::Orphaned),
            (Self::BeginDestroy, s, Oci) if s.is_concluded() || s == S::CleanupDeferred => {
                Some(S::Destroying)
            }
            (Self::DeferCleanup, S::Destroying, Oci) => Some(S::CleanupDeferred),
            (Self::Clean, s, Native) if s.is_concluded() => Some(S::Cleaned),
            // An OCI attempt is cleaned only from Destroying: teardown must prove its pod gone.
            (Self::Clean, S::Destroying, Oci) => Some(S::Cleaned),
            _ => None,
        };
        to.ok_or(EdgeError::Illegal {
            edge: self,
            from,
            execution,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AttemptState as S;
    use EdgeKind as E;
    use ExecutionMode::{Native, Oci};

    /// The whole table, written out: every allowed (edge, from, execution) and where it leads.
    /// Anything not listed must be refused.
    fn allowed() -> Vec<(EdgeKind, AttemptState, ExecutionMode, AttemptState)> {
        let live = [
            S::Allocated,
            S::Preparing,
            S::Prepared,
            S::JitReceived,
            S::Starting,
            S::Idle,
            S::Busy,
        ];
        let mut v = Vec::new();
        for x in [Native, Oci] {
            v.push((E::Admit, S::Pending, x, S::Allocated));
            v.push((E::Reject, S::Pending, x, S::Cleaned));
            v.push((E::ExpireAdmission, S::Pending, x, S::Cleaned));
            v.push((E::ReceiveJit, S::Prepared, x, S::JitReceived));
            v.push((E::Start, S::JitReceived, x, S::Starting));
            v.push((E::RegisterIdle, S::Starting, x, S::Idle));
            v.push((E::AssignJob, S::Starting, x, S::Busy));
            v.push((E::AssignJob, S::Idle, x, S::Busy));
            v.push((E::AssignmentNotTaken, S::Busy, x, S::Idle));
            v.push((E::CompleteJob, S::Busy, x, S::Finished));
            v.push((E::ExitIdle, S::Idle, x, S::Finished));
            for s in live {
                // Native never enters Preparing, yet a (corrupt) native Preparing attempt may
                // still conclude: concluding is always safer than being stuck.
                v.push((E::Fail, s, x, S::Failed));
                v.push((E::Orphan, s, x, S::Orphaned));
                v.push((E::LoseNode, s, x, S::Orphaned));
            }
        }
        v.push((E::MarkPrepared, S::Allocated, Native, S::Prepared));
        v.push((E::ReceiveJit, S::Allocated, Native, S::JitReceived));
        v.push((E::BeginPrepare, S::Allocated, Oci, S::Preparing));
        v.push((E::MarkPrepared, S::Preparing, Oci, S::Prepared));
        for s in [S::Finished, S::Failed, S::Orphaned] {
            v.push((E::Clean, s, Native, S::Cleaned));
            v.push((E::BeginDestroy, s, Oci, S::Destroying));
        }
        v.push((E::BeginDestroy, S::CleanupDeferred, Oci, S::Destroying));
        v.push((E::DeferCleanup, S::Destroying, Oci, S::CleanupDeferred));
        v.push((E::Clean, S::Destroying, Oci, S::Cleaned));
        v
    }

    #[test]
    fn every_state_times_every_edge_is_allowed_exactly_as_tabled() {
        let table = allowed();
        let mut checked = 0;
        for x in [Native, Oci] {
            for from in S::ALL {
                for edge in E::ALL {
                    let want = table
                        .iter()
                        .find(|(e, f, ex, _)| *e == edge && *f == from && *ex == x)
                        .map(|t| t.3);
                    let got = edge.target(from, x).ok();
                    assert_eq!(got, want, "{edge:?} from {from:?} ({x:?})");
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 2 * 14 * 18);
    }

    #[test]
    fn self_transitions_are_never_legal_and_cleaned_is_absorbing() {
        for x in [Native, Oci] {
            for from in S::ALL {
                for edge in E::ALL {
                    if let Ok(to) = edge.target(from, x) {
                        assert_ne!(to, from, "{edge:?} loops on {from:?}");
                    }
                }
                assert!(E::ALL.iter().all(|e| e.target(S::Cleaned, x).is_err()));
            }
        }
    }

    #[test]
    fn terminal_states_only_move_toward_cleaned() {
        for x in [Native, Oci] {
            for from in S::ALL.into_iter().filter(|s| s.is_terminal()) {
                for edge in E::ALL {
                    if let Ok(to) = edge.target(from, x) {
                        assert!(to.is_terminal(), "{edge:?}: {from:?} -> {to:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn actors_are_as_designed() {
        for e in E::ALL {
            let want = match e {
                E::ReceiveJit => Actor::Broker,
                E::LoseNode | E::ExpireAdmission => Actor::Operator,
                _ => Actor::Agent,
            };
            assert_eq!(e.actor(), want, "{e:?}");
        }
    }

    #[test]
    fn capacity_counts_what_may_hold_a_process_or_pod() {
        for s in S::ALL {
            let native = s.counts_against_capacity(Native);
            let oci = s.counts_against_capacity(Oci);
            match s {
                S::Pending | S::Destroying | S::CleanupDeferred => assert!(native && oci, "{s:?}"),
                s if s.is_live() => assert!(native && oci, "{s:?}"),
                S::Finished | S::Failed | S::Orphaned => assert!(!native && oci, "{s:?}"),
                S::Cleaned => assert!(!native && !oci),
                _ => unreachable!(),
            }
        }
    }

    #[test]
    fn native_path_skips_preparing_and_oci_needs_it() {
        assert!(E::MarkPrepared.target(S::Allocated, Native).is_ok());
        assert!(E::MarkPrepared.target(S::Allocated, Oci).is_err());
        // The broker takes a native attempt from `Allocated`; an OCI one only once its pod is
        // journalled (`Prepared`): the JIT must never reach a pod nobody recorded.
        assert!(E::ReceiveJit.target(S::Allocated, Native).is_ok());
        assert!(E::ReceiveJit.target(S::Allocated, Oci).is_err());
        assert!(E::ReceiveJit.target(S::Preparing, Oci).is_err());
        assert!(E::BeginPrepare.target(S::Allocated, Native).is_err());
        assert!(
            E::Clean.target(S::Failed, Oci).is_err(),
            "OCI must tear down first"
        );
    }
}
