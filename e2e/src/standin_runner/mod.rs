//! The stand-in runner package: a tarball laid out like `actions-runner-linux-x64-<v>.tar.gz`
//! whose `bin/Runner.Listener` and `bin/Runner.Worker` are our own small program, acting like
//! `actions/runner` where runner-manager depends on it. See `e2e/README.md`.

pub mod behaviour;
pub mod client;
pub mod diag;
pub mod listener;
pub mod package;
pub mod worker;
