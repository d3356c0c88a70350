//! The harness the scenario tests share: a client for the control plane under test (or a reason
//! to skip), CRD installation, throwaway namespaces, and waiting on conditions with deadlines.

pub mod admission;
pub mod agent;
pub mod attempt;
pub mod cluster;
pub mod fixtures;
pub mod github;
pub mod node;
pub mod pin;
pub mod process;
pub mod product;
pub mod scripted_agent;
pub mod telemetry;
pub mod wait;
pub mod webhook;
pub mod world;
