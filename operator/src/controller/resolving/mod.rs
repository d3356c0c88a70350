//! The resolve stage of a policy's reconcile (`policy::reconcile`): what a policy needs beyond its spec (`resolve`), and a new attempt built from it without I/O (`snapshot`).

pub mod resolve;
pub mod snapshot;
