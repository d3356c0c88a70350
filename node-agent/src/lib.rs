//! `runner-manager-node-agent`: the per-node agent. [`agent`] is the process (fence, Lease,
//! watch, admission, launch, supervision, recovery, cleanup); the other modules are its parts:
//! the journal (CAS status writes through the `crds` edges), packages, workspaces, providers.

pub mod account;
pub mod agent;
pub mod broker_client;
pub mod caches;
pub mod cli;
pub mod docker;
pub mod durable;
pub mod entry;
pub mod evidence;
pub mod foreign_pods;
pub mod handoff;
pub mod job_gate;
pub mod journal;
pub mod mounts;
pub mod packages;
pub mod pod_watch;
/// The pods of runner-manager, built by the operator (shared with it through the API crate).
pub use runner_manager_crds::pods;
pub mod process;
pub mod providers;
pub mod roots;
pub mod telemetry;
pub mod termination;
pub mod workspace;
