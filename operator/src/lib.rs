//! `runner-manager-operator`: the only part that holds GitHub credentials and talks to GitHub.
//! Its command line, its CRDs applied at start, the GitHub client, the JIT broker, the webhook
//! receiver and the controllers (policy, placement, attempt supervision) under leader election.

pub mod admission;
pub mod broker;
pub mod cli;
pub mod controller;
pub mod crd_apply;
pub mod fault;
pub mod github;
pub mod health;
pub mod listen;
pub mod metrics;
pub mod policy;
pub mod run;
pub mod telemetry;
pub mod webhook;
