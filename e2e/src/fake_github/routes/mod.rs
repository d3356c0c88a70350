//! Handlers of the GitHub REST endpoints and of the runner's own protocol.

pub mod actions;
pub mod app;
pub mod pagination;
pub mod releases;
pub mod runner_protocol;
pub mod runners;
