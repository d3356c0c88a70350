//! The decisions, without I/O: one policy's plan (`plan`), on which node its new attempts go (`placement_worker`), the replacement backoff (`failures`) and what is due for an attempt (`timeouts`).

pub mod failures;
pub mod placement_worker;
pub mod plan;
pub mod timeouts;
