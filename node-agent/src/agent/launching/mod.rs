//! From a `Pending` attempt to `Starting`: admission, the launch pipeline and what it attaches before the JIT (placeholder pod, dependency cache, Docker, job gate, runner account), the preparation bound and the package prune.

pub mod accounts;
pub mod admission;
pub mod caches;
pub mod docker;
pub mod job_gates;
pub mod launch;
pub mod placeholder;
pub mod preparation;
pub mod pruning;
