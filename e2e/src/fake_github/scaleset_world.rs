//! The scale-set service's state in the simulated GitHub's world (`scaleset.rs` serves the
//! protocol over it): data only, below both the world (`state.rs`) and the protocol.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Deserialize;
use serde_json::Value;

use super::scope::Scope;

/// Settings of the scale-set service (admin API).
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// How long an admin token lives.
    pub admin_token_secs: i64,
    /// How long a message-queue token lives.
    pub queue_token_secs: i64,
    /// A long poll ends with 202 after this long without a message.
    pub long_poll_ms: u64,
    /// A session with no poll for this long is gone (its scale set takes a new one).
    pub session_idle_secs: i64,
    /// The next this many `JobStarted` events are lost: marked told, never sent.
    pub drop_job_started: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            admin_token_secs: 3600,
            queue_token_secs: 3600,
            long_poll_ms: 50_000,
            session_idle_secs: 120,
            drop_job_started: 0,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ScaleSet {
    pub id: u64,
    pub name: String,
    pub group_id: u64,
    pub labels: Vec<String>,
    pub scope: Scope,
    /// Runners minted through this set.
    pub runners: BTreeSet<u64>,
    /// Jobs this set acquired.
    pub acquired: BTreeSet<u64>,
    /// Job events already put in a message, by kind.
    pub told: BTreeSet<(u8, u64)>,
    /// The message given and not yet deleted: (id, body).
    pub unacked: Option<(u64, Value)>,
    pub next_message: u64,
}

#[derive(Debug, Clone)]
pub struct Session {
    pub set: u64,
    pub owner: String,
    pub token_hash: String,
    pub token_expires: i64,
    pub last_seen: i64,
}

#[derive(Debug, Default)]
pub struct ScaleSetWorld {
    pub settings: Settings,
    /// Registration tokens handed out, by hash: their scope.
    pub registration_tokens: HashMap<String, (Scope, i64)>,
    /// Admin tokens by hash: their scope and expiry.
    pub admin_tokens: HashMap<String, (Scope, i64)>,
    pub sets: BTreeMap<u64, ScaleSet>,
    pub sessions: HashMap<String, Session>,
    /// Sessions opened, ever (counters for tests).
    pub sessions_opened: u64,
    /// Jobs acquired: job → set (a job is acquired once).
    pub acquired_by: BTreeMap<u64, u64>,
}
