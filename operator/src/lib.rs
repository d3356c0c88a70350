//! `runner-manager-operator`: the only part that holds GitHub credentials and talks to GitHub.
//! Today: its command line, its CRDs applied at start, the GitHub client and the JIT broker;
//! the policy and attempt controllers follow.

pub mod broker;
pub mod cli;
pub mod crd_apply;
pub mod github;
pub mod metrics;
pub mod policy;
pub mod run;
pub mod telemetry;
pub mod webhook;
