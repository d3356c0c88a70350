//! The GitHub client: targets, App and token auth, the endpoints runner-manager uses, error
//! classification, retries and rate-limit discipline (DESIGN §4 rules 10–11).

pub mod auth;
pub mod client;
pub mod endpoint;
pub mod errors;
pub mod ratelimit;
pub mod recent;
pub mod registry;
pub mod retry;
pub mod scaleset;
pub mod types;
pub mod walk;

pub use client::{GitHubClient, GitHubConfig};
pub use errors::GitHubError;
