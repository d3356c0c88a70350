//! `fake-github`: a GitHub that behaves like the real one where runner-manager depends on it.
//!
//! One process, state in memory, a loopback port. REST endpoints for self-hosted runners at
//! repository, organization and enterprise scope, runner groups, workflow runs and jobs, GitHub
//! App installation tokens, `rate_limit` and the runner's latest release, all shaped by GitHub's
//! official OpenAPI description; a runner-facing protocol the stand-in runner uses to go online,
//! take a job and finish it; `workflow_job` webhooks; and an admin API (`/_admin/…`) for
//! fault injection, counters, rate-limit budgets, jobs and webhook controls. See `e2e/README.md`.

pub mod admin;
pub mod auth;
pub mod clock;
pub mod conformance;
pub mod endpoint;
pub mod error;
pub mod faults;
pub mod jit;
pub mod jobs;
pub mod ratelimit;
pub mod routes;
pub mod runners;
pub mod scaleset;
pub mod scaleset_world;
pub mod scope;
pub mod server;
pub mod shapes;
pub mod state;
pub mod webhooks;

pub use server::{RunningFake, start, start_tls};
pub use state::{FakeGithub, PackageInfo};
