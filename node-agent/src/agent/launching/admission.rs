//! Admission (DESIGN §3, §4 rule 9): the agent's own count of what holds capacity on its node is
//! the authority. An attempt that would overfill the node, or whose snapshot this node cannot
//! run, is concluded `Rejected` from `Pending` with nothing allocated.

use std::collections::BTreeSet;

use runner_manager_crds::arch::Arch;
use runner_manager_crds::attempt::AttemptSnapshot;
use runner_manager_crds::outcome::RejectReason;
use runner_manager_crds::policy::{ExecutionMode, WorkspaceMode};
use runner_manager_crds::state::AttemptState;

/// What admission decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    Admit,
    Reject(RejectReason),
}

/// Whether this agent can run a snapshot at all: a pinned package digest it can verify, a
/// workspace mode it knows, and a provider that admits it (`provider_admits`: the registry's
/// `Providers::admits`: the execution mode offered here, and the provider's own check: native
/// always, OCI only with `--oci` and an image pinned by digest). A native-only agent rejects an
/// OCI attempt (`SnapshotUnusable`): it never runs it natively instead. An agent whose systemd
/// launcher was refused at start (its runner sandbox not proven) rejects native attempts the
/// same way. A package of another architecture than this
/// agent's own is rejected too (a mislabelled Node, or an operator that placed by a label it
/// should not have trusted): its binaries could not run here, and the runner would fail at
/// registration, after a JIT was minted for it.
pub fn usable(snapshot: &AttemptSnapshot, provider_admits: bool) -> bool {
    let digest_ok = snapshot.runner.sha256.len() == 64
        && snapshot
            .runner
            .sha256
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let workspace_ok = matches!(
        snapshot.workspace,
        WorkspaceMode::Ephemeral | WorkspaceMode::Persistent
    );
    let arch_ok = snapshot
        .runner
        .architecture
        .is_none_or(|a| Arch::of_host() == Some(a));
    provider_admits && digest_ok && workspace_ok && arch_ok
}

/// The pure decision: `held` attempts already count against `capacity`.
pub fn decide(held: usize, capacity: u32, snapshot_usable: bool) -> Admission {
    if !snapshot_usable {
        Admission::Reject(RejectReason::SnapshotUnusable)
    } else if held >= capacity as usize {
        Admission::Reject(RejectReason::NodeFull)
    } else {
        Admission::Admit
    }
}

/// The agent's count: every admitted attempt whose state may still hold a process.
#[derive(Clone, Debug, Default)]
pub struct CapacityBook {
    held: BTreeSet<String>,
}

impl CapacityBook {
    /// Keeps the book in step with a state seen in the journal: an admitted attempt counts while
    /// `counts_against_capacity`, a `Pending` one is not in the book until admitted.
    pub fn observe(&mut self, attempt: &str, state: AttemptState, execution: ExecutionMode) {
        if state != AttemptState::Pending && state.counts_against_capacity(execution) {
            self.held.insert(attempt.to_owned());
        } else {
            self.held.remove(attempt);
        }
    }

    /// Decides for a `Pending` attempt and, when admitted, counts it at once (the caller holds
    /// the book's lock across the decision, so two admissions never see the same count).
    pub fn admit(&mut self, attempt: &str, capacity: u32, snapshot_usable: bool) -> Admission {
        if self.held.contains(attempt) {
            return Admission::Admit;
        }
        let decision = decide(self.held.len(), capacity, snapshot_usable);
        if decision == Admission::Admit {
            self.held.insert(attempt.to_owned());
        }
        decision
    }

    /// Forgets an attempt (its admission CAS lost, or it is gone).
    pub fn forget(&mut self, attempt: &str) {
        self.held.remove(attempt);
    }

    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// What counts against capacity: the admitted attempts, and the `Pending` ones (by uid) not
    /// admitted yet. An attempt admitted a moment ago may still be `Pending` in the watch: it
    /// counts once, or a burst would advertise the node full while it has room.
    pub fn counted_with(&self, pending: &BTreeSet<String>) -> usize {
        self.held.len() + pending.iter().filter(|p| !self.held.contains(*p)).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_admitted_attempt_still_pending_in_the_watch_counts_once() {
        let mut b = CapacityBook::default();
        assert_eq!(b.admit("a", 4, true), Admission::Admit);
        let pending: BTreeSet<String> = ["a".to_owned(), "b".to_owned()].into();
        assert_eq!(b.counted_with(&pending), 2, "a admitted, b waiting");
        assert_eq!(b.counted_with(&BTreeSet::new()), 1);
    }

    #[test]
    fn the_surplus_over_capacity_is_rejected_and_a_conclusion_frees_a_place() {
        let mut b = CapacityBook::default();
        assert_eq!(b.admit("a", 2, true), Admission::Admit);
        assert_eq!(b.admit("b", 2, true), Admission::Admit);
        assert_eq!(
            b.admit("c", 2, true),
            Admission::Reject(RejectReason::NodeFull)
        );
        assert_eq!(b.admit("a", 2, true), Admission::Admit, "idempotent");
        b.observe("a", AttemptState::Finished, ExecutionMode::Native);
        assert_eq!(b.admit("c", 2, true), Admission::Admit);
        assert_eq!(b.held(), 2);
    }

    #[test]
    fn what_may_hold_a_process_counts_after_a_restart() {
        let mut b = CapacityBook::default();
        b.observe("idle", AttemptState::Idle, ExecutionMode::Native);
        b.observe("pending", AttemptState::Pending, ExecutionMode::Native);
        b.observe("cleaned", AttemptState::Cleaned, ExecutionMode::Native);
        b.observe("oci-failed", AttemptState::Failed, ExecutionMode::Oci);
        assert_eq!(b.held(), 2);
        assert_eq!(
            b.admit("x", 2, true),
            Admission::Reject(RejectReason::NodeFull)
        );
    }

    #[test]
    fn an_unusable_snapshot_is_rejected_even_with_room() {
        assert_eq!(
            decide(0, 4, false),
            Admission::Reject(RejectReason::SnapshotUnusable)
        );
        assert_eq!(decide(3, 4, true), Admission::Admit);
        assert_eq!(
            decide(4, 4, true),
            Admission::Reject(RejectReason::NodeFull)
        );
    }

    fn snapshot(mode: &str, image: Option<&str>) -> AttemptSnapshot {
        serde_json::from_value(serde_json::json!({
            "policyUid": "p", "target": {"url": "https://github.com/o/r", "scope": "Repository"},
            "labels": [], "runnerGroupId": 1, "workspace": "Ephemeral", "maxSlots": 1,
            "execution": {"mode": mode, "image": image},
            "runner": {"version": "2.330.0", "url": "https://example.invalid/r.tgz", "sha256": "0".repeat(64)},
            "timeouts": {"registration": "5m", "idle": "5m", "jitHandoff": "2m"}
        }))
        .expect("a valid snapshot")
    }

    #[test]
    fn an_oci_snapshot_is_usable_only_with_the_oci_provider_and_a_pinned_image() {
        use crate::providers::provider::oci_admits;
        let pinned = format!("registry.local/runner@sha256:{}", "a".repeat(64));
        // What the registry answers (`Providers::admits`): offered, and the kind's own check.
        let admits = |s: &AttemptSnapshot, oci_offered: bool, native_offered: bool| {
            usable(
                s,
                match s.execution.mode {
                    ExecutionMode::Native => native_offered,
                    ExecutionMode::Oci => oci_offered && oci_admits(s),
                },
            )
        };
        assert!(admits(&snapshot("Native", None), false, true));
        assert!(admits(&snapshot("Native", None), true, true));
        assert!(
            !admits(&snapshot("Native", None), true, false),
            "native refused: the sandbox is not proven on this node"
        );
        assert!(
            !admits(&snapshot("Oci", Some(&pinned)), false, true),
            "a native-only agent never runs an OCI attempt natively"
        );
        assert!(admits(&snapshot("Oci", Some(&pinned)), true, true));
        assert!(!admits(
            &snapshot("Oci", Some("registry.local/runner:latest")),
            true,
            true
        ));
        assert!(!admits(&snapshot("Oci", None), true, true));
    }

    #[test]
    fn a_package_of_another_architecture_is_unusable() {
        let host = Arch::of_host().expect("the tests run on x64, arm64 or arm");
        let mut s = snapshot("Native", None);
        assert!(usable(&s, true), "no architecture named: x64's era");
        s.runner.architecture = Some(host);
        assert!(usable(&s, true));
        for other in Arch::ALL.into_iter().filter(|a| *a != host) {
            s.runner.architecture = Some(other);
            assert!(!usable(&s, true), "{other} on {host}");
        }
    }
}
