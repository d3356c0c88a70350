//! Which persistent slots are taken: the agent's own table, rebuilt at start from the journal
//! (every uncleaned attempt with a persistent placement, concluded ones included) and updated
//! only after the CAS that records a lease. The disk is never consulted: a directory on disk
//! says nothing about who owns it.

use std::collections::BTreeMap;

use runner_manager_crds::attempt::RunnerAttempt;

/// A policy's slots on this node: the attempt's namespace and its snapshot's policy uid.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotKey {
    pub namespace: String,
    pub policy_uid: String,
}

/// One journalled lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalledLease {
    pub key: SlotKey,
    pub slot: u32,
    /// The attempt object's name.
    pub attempt: String,
}

impl JournalledLease {
    /// The lease an attempt's journal holds, if any: a persistent placement on an attempt that is
    /// not yet `Cleaned` (a concluded attempt keeps its slot, not its capacity).
    pub fn of(attempt: &RunnerAttempt) -> Option<Self> {
        let journal = &attempt.status.as_ref()?.journal;
        if !journal.holds_slot_lease() {
            return None;
        }
        Some(Self {
            key: SlotKey {
                namespace: attempt.metadata.namespace.clone()?,
                policy_uid: attempt.spec.snapshot.policy_uid.clone(),
            },
            slot: journal.workspace()?.slot_number()?,
            attempt: attempt.metadata.name.clone()?,
        })
    }
}

/// Why no slot can be handed out.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SlotChoiceError {
    /// Never `s<ceiling + 1>`.
    #[error(
        "every persistent slot s1 to s{ceiling} of the policy is leased by an uncleaned attempt; raise maxRunners or wait for cleanup"
    )]
    AllLeased { ceiling: u32 },
    #[error("slot s{slot} is already leased by another attempt")]
    AlreadyLeased { slot: u32 },
}

/// The agent's slot table.
#[derive(Clone, Debug, Default)]
pub struct SlotTable {
    leases: BTreeMap<SlotKey, BTreeMap<u32, String>>,
}

impl SlotTable {
    /// The table at agent start, from the journal alone.
    pub fn rebuild(leases: impl IntoIterator<Item = JournalledLease>) -> Self {
        let mut table = Self::default();
        for lease in leases {
            table
                .leases
                .entry(lease.key)
                .or_default()
                .insert(lease.slot, lease.attempt);
        }
        table
    }

    /// The lowest positive slot nobody holds, at most `ceiling`. Fills gaps before the tail.
    pub fn lowest_free(&self, key: &SlotKey, ceiling: u32) -> Result<u32, SlotChoiceError> {
        let taken = self.leases.get(key);
        (1..=ceiling)
            .find(|n| taken.is_none_or(|t| !t.contains_key(n)))
            .ok_or(SlotChoiceError::AllLeased { ceiling })
    }

    /// Records a lease, after the CAS that journalled it succeeded. A slot held by another
    /// attempt is refused: two attempts in one slot is the one thing this table exists to stop.
    pub fn record(&mut self, lease: JournalledLease) -> Result<(), SlotChoiceError> {
        let slots = self.leases.entry(lease.key).or_default();
        match slots.get(&lease.slot) {
            Some(holder) if *holder != lease.attempt => {
                Err(SlotChoiceError::AlreadyLeased { slot: lease.slot })
            }
            _ => {
                slots.insert(lease.slot, lease.attempt);
                Ok(())
            }
        }
    }

    /// Releases an attempt's lease, after the CAS that journalled it `Cleaned`. Idempotent.
    pub fn release(&mut self, key: &SlotKey, attempt: &str) {
        if let Some(slots) = self.leases.get_mut(key) {
            slots.retain(|_, holder| holder != attempt);
        }
    }

    /// The slot `attempt` holds of a policy's.
    pub fn slot_of(&self, key: &SlotKey, attempt: &str) -> Option<u32> {
        self.leases
            .get(key)?
            .iter()
            .find_map(|(n, holder)| (holder == attempt).then_some(*n))
    }

    /// The slots a policy holds, lowest first.
    pub fn leased(&self, key: &SlotKey) -> Vec<u32> {
        self.leases
            .get(key)
            .map(|s| s.keys().copied().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_manager_crds::state::AttemptState;

    fn key() -> SlotKey {
        SlotKey {
            namespace: "team".into(),
            policy_uid: "uid-1".into(),
        }
    }

    fn lease(slot: u32, attempt: &str) -> JournalledLease {
        JournalledLease {
            key: key(),
            slot,
            attempt: attempt.into(),
        }
    }

    #[test]
    fn slot_selection_fills_the_lowest_gap_and_stops_at_the_ceiling() {
        assert_eq!(SlotTable::default().lowest_free(&key(), 1), Ok(1));
        let one = SlotTable::rebuild([lease(1, "a")]);
        assert_eq!(one.lowest_free(&key(), 4), Ok(2));
        let gap = SlotTable::rebuild([lease(1, "a"), lease(3, "c")]);
        assert_eq!(gap.lowest_free(&key(), 4), Ok(2));
        assert_eq!(
            one.lowest_free(&key(), 1),
            Err(SlotChoiceError::AllLeased { ceiling: 1 })
        );
        let two = SlotTable::rebuild([lease(1, "a"), lease(2, "b")]);
        assert_eq!(
            two.lowest_free(&key(), 2),
            Err(SlotChoiceError::AllLeased { ceiling: 2 })
        );
        let other = SlotKey {
            namespace: "team".into(),
            policy_uid: "uid-2".into(),
        };
        assert_eq!(two.lowest_free(&other, 1), Ok(1), "per policy");
    }

    #[test]
    fn lowering_capacity_leaves_higher_slots_leased_and_raising_it_permits_them_again() {
        let table = SlotTable::rebuild([lease(1, "a")]);
        assert!(table.lowest_free(&key(), 1).is_err());
        assert_eq!(table.lowest_free(&key(), 2), Ok(2));
    }

    #[test]
    fn the_table_changes_only_by_record_and_release() {
        let mut table = SlotTable::default();
        let first = table.lowest_free(&key(), 2).expect("free");
        // Choosing is not leasing: until the CAS is recorded the slot is still free.
        assert_eq!(table.lowest_free(&key(), 2), Ok(first));
        table.record(lease(first, "a")).expect("recorded");
        assert_eq!(table.lowest_free(&key(), 2), Ok(2));
        assert_eq!(
            table.record(lease(1, "b")),
            Err(SlotChoiceError::AlreadyLeased { slot: 1 })
        );
        table
            .record(lease(1, "a"))
            .expect("same holder is idempotent");
        table.release(&key(), "a");
        table.release(&key(), "a");
        assert_eq!(table.leased(&key()), Vec::<u32>::new());
    }

    #[test]
    fn a_concluded_but_uncleaned_attempt_keeps_its_slot_and_a_cleaned_one_does_not() {
        let attempt = |state| {
            runner_manager_crds::fixtures::AttemptBuilder::new("web-1", "web")
                .namespace("team")
                .policy_uid("uid-1")
                .slot(2, 2)
                .state(state)
                .build()
        };
        assert_eq!(
            JournalledLease::of(&attempt(AttemptState::Failed)),
            Some(lease(2, "web-1"))
        );
        assert_eq!(JournalledLease::of(&attempt(AttemptState::Cleaned)), None);
    }
}
