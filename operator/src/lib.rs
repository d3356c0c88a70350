//! `runner-manager-operator`: the only part that holds GitHub credentials and talks to GitHub.
//! Today: its command line and the GitHub client; the JIT broker and the controllers follow.

pub mod broker;
pub mod cli;
pub mod github;
