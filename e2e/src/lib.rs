//! The end-to-end harness of runner-manager: the control plane under test, the simulated GitHub,
//! the stand-in runner package and the scenario helpers. Nothing depends on this crate.

pub mod fake_github;
pub mod harness;
pub mod standin_runner;
