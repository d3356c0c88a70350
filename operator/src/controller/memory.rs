//! What the leader remembers of each policy between reconciles ([`PolicyMemory`]): rebuilt after
//! a failover, needed only to space out work.

use std::collections::HashMap;

use tokio::time::Instant;

use super::errors;
use super::resolve::{Invalid, Resolved};
use super::sources::Chosen;
use crate::github::types::Runner;

/// A resolution and when it was made.
pub struct ResolvedEntry {
    pub generation: i64,
    pub at: Instant,
    pub result: Result<Resolved, Invalid>,
}

/// What the leader remembers of one policy between reconciles (rebuilt after failover; nothing
/// here is needed for safety, only to space out work).
#[derive(Default)]
pub struct PolicyMemory {
    pub resolved: Option<ResolvedEntry>,
    pub last_observe: Option<Instant>,
    /// The last runner listing of the policy's target, by runner name.
    pub listing: Option<HashMap<String, Runner>>,
    /// Orphan registrations by runner id: when first seen orphaned.
    pub orphans: HashMap<i64, Instant>,
    /// Attempts created for the policy and not yet in the cache, by name: when created.
    pub created: HashMap<String, Instant>,
    /// The status fields last written, and when.
    pub status_written: Option<(serde_json::Value, Instant)>,
    /// The policy's demand source and its clocks (dropped with this memory: leadership lost,
    /// policy gone; a scale-set source's session is deleted with it).
    pub demand: Option<Chosen>,
    /// After a failed reconcile: when the policy may be reconciled again.
    pub backoff: Option<errors::Backoff>,
}

impl std::fmt::Debug for ResolvedEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedEntry").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for PolicyMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyMemory").finish_non_exhaustive()
    }
}
