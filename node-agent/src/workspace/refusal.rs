//! The eight closed refusal classes of a persistent-slot scrub (DESIGN §4 rule 5). A refusal
//! quarantines the slot: nothing after it is removed and the attempt keeps its lease.

use std::fmt;

use runner_manager_crds::attempt::AttemptReason;

/// Why a scrub refused. Closed: this reaches conditions, events and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SlotRefusal {
    /// Check 1: the runtime path is not `<parent>/s<journalled N>`.
    NotTheJournalledSlot,
    /// Check 2: the slot's parent is not the derived root of the attempt's policy.
    PolicyRootDisagrees,
    /// Check 3: the slot resolves outside its root (a link planted in its place or above it).
    Containment,
    /// Check 4: the slot is a file, a link or something else that is not a directory.
    SlotNotADirectory,
    /// Check 5: the slot's entries could not be listed.
    Enumeration,
    /// Check 6: `_work` is a link or a file.
    WorkNotADirectory,
    /// Check 6: an entry could not be removed.
    Deletion,
    /// Check 7: runner state survived the removal.
    Residue,
}

impl SlotRefusal {
    pub const ALL: [Self; 8] = [
        Self::NotTheJournalledSlot,
        Self::PolicyRootDisagrees,
        Self::Containment,
        Self::SlotNotADirectory,
        Self::Enumeration,
        Self::WorkNotADirectory,
        Self::Deletion,
        Self::Residue,
    ];

    /// The event class: fixed, lowercase, what alerts and dashboards match on.
    pub fn event_class(self) -> &'static str {
        match self {
            Self::NotTheJournalledSlot => "slot_path_is_not_the_journalled_slot",
            Self::PolicyRootDisagrees => "slot_root_disagrees_with_policy",
            Self::Containment => "slot_escapes_its_root",
            Self::SlotNotADirectory => "slot_is_not_a_directory",
            Self::Enumeration => "slot_could_not_be_enumerated",
            Self::WorkNotADirectory => "retained_work_is_not_a_directory",
            Self::Deletion => "slot_entry_could_not_be_removed",
            Self::Residue => "slot_still_holds_runner_state",
        }
    }

    /// What a person should do. Path-free, and every one says the lease is kept, because the
    /// slot is not handed to another attempt until someone (or a later pass) resolves it.
    pub fn remediation(self) -> &'static str {
        match self {
            Self::NotTheJournalledSlot | Self::PolicyRootDisagrees | Self::Containment => {
                "the journalled path does not match the slot the agent derives; fix the configuration or remove the slot by hand; the attempt keeps its slot lease until then"
            }
            Self::SlotNotADirectory | Self::WorkNotADirectory => {
                "a job replaced the slot or its `_work` with a link or a file; inspect it and treat its contents as untrusted, then remove it by hand; the attempt keeps its slot lease until then"
            }
            Self::Enumeration | Self::Deletion | Self::Residue => {
                "cleanup is retried on a later pass with backoff, and a tree of any depth or width is removable, so a failure that persists is the filesystem's: read the error kind in the detail (PermissionDenied: an immutable or append-only attribute, shown by `lsattr -d` and cleared by `chattr -i -a`; ReadOnlyFilesystem; ResourceBusy: a mount inside the slot) and fix that; the next pass then finishes on its own; the attempt keeps its slot lease until then"
            }
        }
    }

    /// The `Quarantined` condition's reason: one per class.
    pub fn reason(self) -> AttemptReason {
        match self {
            Self::NotTheJournalledSlot => AttemptReason::SlotNotJournalled,
            Self::PolicyRootDisagrees => AttemptReason::PolicyRootMismatch,
            Self::Containment => AttemptReason::OutsideSlotsRoot,
            Self::SlotNotADirectory => AttemptReason::SlotNotADirectory,
            Self::WorkNotADirectory => AttemptReason::RetainedWorkNotADirectory,
            Self::Enumeration => AttemptReason::EnumerationFailed,
            Self::Deletion => AttemptReason::DeletionFailed,
            Self::Residue => AttemptReason::VerificationFailed,
        }
    }
}

impl fmt::Display for SlotRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.event_class())
    }
}

/// A quarantined slot: the class and a detail that holds only agent-derived paths,
/// `io::ErrorKind` names, counts and names from [`super::SENSITIVE_SLOT_ENTRIES`] — never a
/// name a workflow chose, since a job can name a file after a secret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{refusal}: {detail}; {}", refusal.remediation())]
pub struct Quarantine {
    pub refusal: SlotRefusal,
    pub detail: String,
}

impl Quarantine {
    pub(crate) fn new(refusal: SlotRefusal, detail: impl Into<String>) -> Self {
        Self {
            refusal,
            detail: detail.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn every_slot_refusal_names_a_distinct_event_class_and_keeps_the_lease() {
        let classes: HashSet<_> = SlotRefusal::ALL.iter().map(|r| r.event_class()).collect();
        assert_eq!(classes.len(), 8);
        for refusal in SlotRefusal::ALL {
            let class = refusal.event_class();
            assert!(
                class.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{class}"
            );
            assert!(
                refusal.remediation().contains("keeps its slot lease"),
                "{refusal:?}"
            );
            assert!(
                !refusal.remediation().contains('/'),
                "path-free: {refusal:?}"
            );
        }
        let families: HashSet<_> = SlotRefusal::ALL.iter().map(|r| r.remediation()).collect();
        assert_eq!(
            families.len(),
            3,
            "fix configuration, inspect a link, retry"
        );
    }

    #[test]
    fn a_quarantine_renders_class_detail_and_remediation() {
        let q = Quarantine::new(SlotRefusal::Deletion, "1 entry could not be removed");
        let text = q.to_string();
        assert!(text.starts_with("slot_entry_could_not_be_removed: 1 entry"));
        assert!(text.contains("keeps its slot lease"));
    }
}
