//! The e2e package's scenario tests, in one test binary: one module per former test file. One
//! binary links once and instantiates each generic of kube, tokio and serde once, where nineteen
//! binaries did each of those nineteen times (issue 27: the test build was the largest part of a
//! cold `make test`). nextest still runs every test in a process of its own. Run one module with
//! `cargo nextest run -p runner-manager-e2e -E 'test(/^agent::/)'` or
//! `cargo test -p runner-manager-e2e --test e2e agent::`.
mod agent;
mod agent_launch;
mod attacks;
mod attacks_limits;
mod attacks_pods;
mod broker;
mod control_plane;
mod demand_modes;
mod end_to_end;
mod fake_github;
mod github_client;
mod observability;
mod oci;
mod operator;
mod parity;
mod placeholders;
mod scale_set;
mod scale_set_demand;
mod webhook;
