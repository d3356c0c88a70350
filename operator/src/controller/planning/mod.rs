//! The decisions, without I/O: one policy's plan (`plan`), on which node its new attempts go (`placement_worker`), the replacement backoff (`failures`) and what is due for an attempt (`timeouts`).

pub mod placement_worker;
pub mod plan;

// Pure and free of Kubernetes types since they read the validated attempt: in the core crate.
pub use runner_manager_core::{failures, timeouts};
