//! The runner's process as the agent knows it (DESIGN §6 "Launchers": identity = launcher +
//! unit/cgroup + pid + start time): reading `/proc`, the durable identity file, telling a live
//! runner from a gone or recycled pid, and the listener's environment.

pub mod environment;
pub mod identity_file;
pub mod inspect;
pub mod stat;

pub use inspect::{GoneBecause, Inspection, inspect};
