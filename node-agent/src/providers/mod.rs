//! How a native runner becomes a host process that outlives the agent (DESIGN §6
//! "Launchers"): one trait, two launchers. [`direct`] forks the entry helper into its own
//! cgroup v2 (the agent on the host: bare metal, `make demo`, tests); [`systemd`] asks the
//! host's systemd for a transient unit (the agent in a cluster).

pub mod cgroup;
pub mod direct;
pub mod launcher;
pub mod systemd;

pub use launcher::{LaunchSpec, RunnerLauncher, StartError, StartFailure, StopError, Stopped};
