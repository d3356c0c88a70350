//! How an attempt's runner runs (DESIGN §6, §12 "Provider seam"): [`provider::Provider`]
//! (prepare / start / handover / look / stop / destroy, object-safe) with native and OCI behind
//! it, held by the agent in one [`registry::Providers`]. A native runner
//! is a host process that outlives the agent, through one launcher trait with two launchers:
//! [`direct`] forks the entry helper into its own cgroup v2 (the agent on the host: bare metal,
//! `make demo`, tests); [`systemd`] asks the host's systemd for a transient unit (the agent in a
//! cluster). An OCI runner is a pod on the agent's node ([`oci`]).

pub mod cgroup;
pub mod direct;
pub mod launcher;
pub mod oci;
pub mod provider;
pub mod registry;
pub mod sandbox;
pub mod systemd;

pub use launcher::{LaunchSpec, RunnerLauncher, StartError, StartFailure, StopError, Stopped};
pub use provider::{NativeProvider, Provider, RunnerRef, Seen};
pub use registry::Providers;
