//! The startup recovery gate (DESIGN §4 rule 8): after a restart nothing launches on the node
//! until every attempt the agent found there has been reconciled by the same code supervision
//! uses. `recoveryComplete` on the Lease is this gate; the operator places nothing before it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use runner_manager_crds::lease::RecoveryBlocked;

#[derive(Debug, Default)]
struct State {
    /// `None` until the first list of the node's attempts succeeded.
    expected: Option<BTreeSet<String>>,
    /// Attempts whose recovery cannot finish, and why.
    blocked: BTreeMap<String, RecoveryBlocked>,
    /// Why the first list has not succeeded, if it failed.
    list_failed: bool,
    complete: bool,
}

/// The gate.
#[derive(Debug, Default)]
pub struct RecoveryGate {
    state: Mutex<State>,
}

impl RecoveryGate {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The attempts found at start that must be reconciled first.
    pub fn expect(&self, attempts: impl IntoIterator<Item = String>) {
        let mut s = self.state();
        s.list_failed = false;
        s.expected = Some(attempts.into_iter().collect());
        Self::settle(&mut s);
    }

    pub fn list_failed(&self) {
        self.state().list_failed = true;
    }

    /// One attempt's first reconciliation finished.
    pub fn reconciled(&self, attempt: &str) {
        let mut s = self.state();
        s.blocked.remove(attempt);
        if let Some(e) = s.expected.as_mut() {
            e.remove(attempt);
        }
        Self::settle(&mut s);
    }

    /// One attempt's recovery cannot finish (said on the Lease and in an event).
    pub fn block(&self, attempt: &str, why: RecoveryBlocked) {
        let mut s = self.state();
        if !s.complete {
            s.blocked.insert(attempt.to_owned(), why);
        }
    }

    fn settle(s: &mut State) {
        if s.expected.as_ref().is_some_and(BTreeSet::is_empty) && s.blocked.is_empty() {
            // A latch: once recovered, later trouble with one attempt is that attempt's own.
            s.complete = true;
        }
    }

    pub fn is_complete(&self) -> bool {
        self.state().complete
    }

    /// Why recovery is not complete, if something blocks it.
    pub fn blocked(&self) -> Option<RecoveryBlocked> {
        let s = self.state();
        if s.complete {
            None
        } else if s.list_failed {
            Some(RecoveryBlocked::ListFailed)
        } else {
            s.blocked.values().min().copied()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complete_only_once_every_expected_attempt_is_reconciled() {
        let g = RecoveryGate::default();
        assert!(!g.is_complete(), "nothing listed yet");
        g.list_failed();
        assert_eq!(g.blocked(), Some(RecoveryBlocked::ListFailed));
        g.expect(["a".to_owned(), "b".to_owned()]);
        assert_eq!(g.blocked(), None);
        g.reconciled("a");
        g.block("b", RecoveryBlocked::IdentityUnreadable);
        assert!(!g.is_complete());
        assert_eq!(g.blocked(), Some(RecoveryBlocked::IdentityUnreadable));
        g.reconciled("b");
        assert!(g.is_complete());
        assert_eq!(g.blocked(), None);
    }

    #[test]
    fn an_empty_node_is_recovered_at_once() {
        let g = RecoveryGate::default();
        g.expect([]);
        assert!(g.is_complete());
    }
}
