//! What the orphan sweep remembers between passes: the attempts whose object went away while
//! the agent held things for them (`agent::orphans` releases them once nothing of them runs).
//! Below the agent's context (`node`), which holds it.

use std::collections::HashMap;

use crate::workspace::slot_table::SlotKey;

/// An attempt whose object went away while the agent held things for it: released by the sweep
/// once nothing of it runs any more (the account must not serve another runner before then).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Abandoned {
    pub uid: String,
    pub slot: Option<(SlotKey, String)>,
}

/// The sweep's memory between passes.
#[derive(Debug, Default)]
pub struct OrphanState {
    /// By attempt name (12 hex).
    abandoned: std::sync::Mutex<HashMap<String, Abandoned>>,
}

impl OrphanState {
    /// Records an attempt whose object is gone, so its account, package lease and slot lease
    /// are released once the sweep has proven its runner stopped.
    pub fn abandon(&self, short: String, what: Abandoned) {
        self.lock().insert(short, what);
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Abandoned>> {
        self.abandoned.lock().unwrap_or_else(|p| p.into_inner())
    }
}
