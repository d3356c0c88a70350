//! Where a policy's demand comes from: its **sources** (docs/demand-modes.md), each feeding the
//! one job ledger (`status.pendingJobs`) that demand, placement and the broker read.
//!
//! - [`webhook`]: the `workflow_job` receiver's sink, the push source every mode but `ScaleSet`
//!   may have beside its pull source. [`candidates`]: which policy a job belongs to. The
//!   ledger's own rules are pure and live in `crate::policy::ledger`.
//! - A pull source per policy, a [`DemandSource`], [`choose`]n once per generation from what
//!   resolution found (the policy's mode and its target's scope): [`poll`] (repository target),
//!   [`walk`] (organization or enterprise target), [`scale_set`] (the scale set's message
//!   session). Each keeps its own clocks; the reconcile calls [`DemandSource::pass`] once per pass
//!   and writes the change it returns through the one writer. The scale-set session long-polls in
//!   a task of its own and writes through the same writer.
//!
//! Adding a source: a module with a type implementing [`DemandSource`], and its line in
//! [`choose`] (docs/architecture.md, "Seams: a new provider, a new demand source, a new per-policy
//! metric").

pub mod candidates;
pub mod checks;
pub mod poll;
pub mod scale_set;
pub mod source;
pub mod walk;
pub mod webhook;

use runner_manager_crds::policy::{DemandMode, ScalePolicy};
use runner_manager_crds::target::TargetKind;

pub use source::{Chosen, DemandSource, Observed, Pass, SourceKind};

use super::Ctx;
use super::resolve::Resolved;

/// The policy's pull source, from its mode and its target's scope: the one registry of sources.
pub fn choose(ctx: &Ctx, policy: &ScalePolicy, resolved: &Resolved) -> Box<dyn DemandSource> {
    let generation = policy.metadata.generation.unwrap_or(0);
    let settle = poll::settle(policy);
    match (&policy.spec.github.demand, &resolved.client.target().kind) {
        (DemandMode::ScaleSet, _) => Box::new(scale_set::Listener::for_policy(
            ctx, policy, resolved, generation,
        )),
        (_, TargetKind::Repository { .. }) => Box::new(poll::RepositoryPoll::new(settle)),
        (_, TargetKind::Organization { .. } | TargetKind::Enterprise { .. }) => {
            Box::new(walk::OrganizationWalk::new(settle))
        }
    }
}
