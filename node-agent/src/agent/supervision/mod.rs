//! A started runner, step by step: one decision per reconcile from the facts read, the provider-neutral runner, and whether the watched copy is recent enough to act on.

pub mod edges;
pub mod runner;
pub mod supervise;
pub mod watched;
