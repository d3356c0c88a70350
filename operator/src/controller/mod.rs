//! The controllers the leader runs: a kube-runtime `Controller<ScalePolicy>` (`runtime`) over
//! the cached policies, triggered by their attempts, agent Leases and Nodes, with the one
//! placement worker in its context.
//!
//! Each policy's reconcile is a pipeline of stages (`policy::reconcile`, one error type per
//! stage in `errors`): housekeeping of its attempts (finalizers, abandon, the operator's two
//! edges, history) → resolve → observe GitHub → a pass of its demand source (`sources`) → the
//! pure plan (`plan`) → apply (placement and creation, scale-down, terminations) → status.
//!
//! The folders are the reconcile's stages (issue 30 item 7; the stackable operators' shape):
//! `resolving` (what a policy needs beyond its spec), `sources` (where its demand comes from),
//! `planning` (the decisions, without I/O), `applying` (the writes, housekeeping, the attempts'
//! GitHub side, Events); `control` is the loop that runs them (the Controller, its trigger
//! index, the caches, leader election). Here: the pipeline itself (`policy`), and what every
//! stage is handed (`context`), remembers (`memory`) and fails with (`errors`).

pub mod context;
pub mod errors;
pub mod memory;
pub mod policy;

pub mod applying;
pub mod control;
pub mod planning;
pub mod resolving;
#[cfg(test)]
pub(crate) mod scripted;
pub mod sources;

// The stages' modules under their old names: `crate::controller::plan` is
// `crate::controller::planning::plan`.
pub use applying::{attempts, events, ledger_batch, supervisor, writes};
pub use control::{cache, index, leader, runtime};
pub use planning::{failures, placement_worker, plan, timeouts};
pub use resolving::{resolve, snapshot};

pub(crate) use context::key;
pub use context::{Ctx, POLICY_FINALIZER, Settings, state_name};
pub use memory::{PolicyMemory, ResolvedEntry};
pub use runtime::run;
