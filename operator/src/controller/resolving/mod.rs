//! Stage 1 of a policy's reconcile (`policy::prepare`): what a policy needs beyond its spec (`resolve`), and a new attempt built from it without I/O (`snapshot`).

pub mod resolve;
pub mod snapshot;
