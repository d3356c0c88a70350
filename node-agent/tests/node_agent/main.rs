//! The node agent's integration tests, in one test binary: one module per former test file (see
//! e2e/tests/e2e/main.rs for why; `removal.rs` stays a binary of its own: each of its tests runs
//! itself again by its exact name under `unshare --mount`). Run one module with
//! `cargo nextest run -p runner-manager-node-agent -E 'test(/^packages::/)'`.
mod archive_support;
mod launch_support;
mod workspace_support;

mod docker_systemd;
mod launch_direct;
mod launch_lifecycle;
mod launch_systemd;
mod packages;
mod packages_overlay;
mod packages_reflink;
mod packages_streamed;
mod roots_preflight;
mod workspace_hostile;
mod workspace_parallel_removal;
mod workspace_pathological;
