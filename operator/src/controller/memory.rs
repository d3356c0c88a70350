//! What the leader remembers of each policy between reconciles ([`PolicyMemory`]): rebuilt after
//! a failover, needed only to space out work.

use std::collections::HashMap;

use tokio::time::Instant;

use super::errors;
use super::resolve::{Invalid, Resolved};
use super::scaleset_listener;
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
    pub last_poll: Option<Instant>,
    /// The last runner listing of the policy's target, by runner name.
    pub listing: Option<HashMap<String, Runner>>,
    /// Orphan registrations by runner id: when first seen orphaned.
    pub orphans: HashMap<i64, Instant>,
    /// Pending jobs by id: when last checked with GitHub.
    pub job_checks: HashMap<String, Instant>,
    /// Jobs the organization walk recorded lately, by id: not written again while the cache
    /// catches up with the write.
    pub walk_added: HashMap<String, Instant>,
    /// Attempts created for the policy and not yet in the cache, by name: when created.
    pub created: HashMap<String, Instant>,
    /// The status fields last written, and when.
    pub status_written: Option<(serde_json::Value, Instant)>,
    /// `ScaleSet` policies: the message-session listener (dropped, and its session deleted,
    /// with this memory: leadership lost, policy gone).
    pub scale_set_listener: Option<scaleset_listener::Listener>,
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
