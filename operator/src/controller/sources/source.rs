//! The seam every pull source implements ([`DemandSource`]) and what a pass carries.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use runner_manager_crds::policy::ScalePolicy;
use serde_json::{Map, Value};

use super::candidates::Candidates;
use crate::controller::errors::DemandError;
use crate::controller::resolve::Resolved;

/// Closed vocabulary of pull sources (the `kind` of the "demand source chosen" log line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    RepositoryPoll,
    OrganizationWalk,
    ScaleSet,
}

impl SourceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RepositoryPoll => "repository_poll",
            Self::OrganizationWalk => "organization_walk",
            Self::ScaleSet => "scale_set",
        }
    }
}

/// What one pass of a source reads besides its own state.
pub struct Pass<'a> {
    pub policy: &'a ScalePolicy,
    pub resolved: &'a Resolved,
    /// The ledger as this pass read it.
    pub ledger: &'a BTreeMap<String, Time>,
    /// The policies a job could belong to, built on first use and shared by the pass.
    pub candidates: &'a (dyn Fn() -> Arc<Candidates> + Send + Sync),
    pub grace: std::time::Duration,
    pub now: Timestamp,
}

impl std::fmt::Debug for Pass<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pass")
            .field("ledger", &self.ledger.len())
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

/// What one pass of a source found: the ledger change to write (job id → queued time, or null
/// to remove) and what failed (the rest went on).
#[derive(Debug, Default)]
pub struct Observed {
    pub change: Map<String, Value>,
    pub errors: Vec<DemandError>,
}

/// A pull source of one policy's demand. Object-safe: the reconcile holds it as
/// `Box<dyn DemandSource>` in the policy's memory and never names the source behind it.
pub trait DemandSource: Send + Sync {
    fn kind(&self) -> SourceKind;

    /// Read GitHub as far as the source's clocks say is due, and say what the ledger should
    /// change. No write: the caller writes the change through the one writer.
    fn pass<'a>(&'a mut self, pass: Pass<'a>) -> BoxFuture<'a, Observed>;
}

/// A source and the policy generation it was chosen for.
pub struct Chosen {
    pub generation: i64,
    pub source: Box<dyn DemandSource>,
}

impl std::fmt::Debug for Chosen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chosen")
            .field("generation", &self.generation)
            .field("kind", &self.source.kind())
            .finish()
    }
}
