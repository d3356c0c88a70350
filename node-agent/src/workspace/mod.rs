//! Workspaces on the host (DESIGN §4 rule 5, §6): ephemeral runtimes removed whole, and
//! persistent slots chosen from the agent's own table, created or validated, scrubbed by seven
//! ordered checks, and quarantined on any refusal.
//!
//! Pure: [`slot_table`] (slot choice), [`scrub_plan`] (checks 1–2, the allow-list, residue
//! wording), [`refusal`], [`backoff`], [`slot_path`]. Filesystem: [`remove`] (fd-relative,
//! never following), [`ephemeral`], [`prepare`], [`scrub`].

pub mod allocation;
pub mod backoff;
pub mod ephemeral;
pub mod prepare;
pub mod refusal;
pub mod remove;
pub mod remove_parallel;
pub mod scrub;
pub mod scrub_plan;
pub mod slot_path;
pub mod slot_table;

pub use refusal::{Quarantine, SlotRefusal};
pub use slot_path::{SENSITIVE_SLOT_ENTRIES, WORK_DIR};
