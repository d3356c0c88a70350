//! `runner-manager-node-agent`: the per-node agent. Today it holds its command line and the
//! journal (CAS status writes through the `crds` edges); packages, workspaces, providers,
//! supervision and recovery land with the node-agent issues.

pub mod account;
pub mod cli;
pub mod durable;
pub mod entry;
pub mod evidence;
pub mod handoff;
pub mod journal;
pub mod packages;
pub mod process;
pub mod providers;
pub mod termination;
pub mod workspace;
