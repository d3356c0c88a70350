//! The controllers the leader runs: a kube-runtime `Controller<ScalePolicy>` (`runtime`) over
//! the cached policies, triggered by their attempts, agent Leases and Nodes, with the one
//! placement worker in its context.
//!
//! Each policy's reconcile: housekeeping of its attempts (finalizers, abandon, the operator's
//! two edges, history), then resolution → observation of GitHub → a pass of its demand
//! source (`policy::prepare`, `sources`), the pure plan (`plan`) and its application — placement and creation,
//! scale-down, terminations, status (`policy::apply`).

pub mod attempts;
pub mod cache;
pub mod context;
pub mod errors;
pub mod events;
pub mod failures;
pub mod index;
pub mod leader;
pub mod ledger_batch;
pub mod memory;
pub mod placement_worker;
pub mod plan;
pub mod policy;
pub mod resolve;
pub mod runtime;
pub mod snapshot;
pub mod sources;
pub mod supervisor;
pub mod timeouts;
pub mod writes;

pub(crate) use context::key;
pub use context::{Ctx, POLICY_FINALIZER, Settings, state_name};
pub use memory::{PolicyMemory, ResolvedEntry};
pub use runtime::run;
