//! Reading a `RunnerAttempt` the way every scenario asserts on it: its journal's state and
//! outcome, with an attempt no one has written a status to yet counting as `Pending`.

use std::path::PathBuf;

use runner_manager_crds::attempt::{AttemptJournal, RunnerAttempt, RunnerRegistration};
use runner_manager_crds::outcome::Outcome;
use runner_manager_crds::state::AttemptState;

/// The attempt's name.
pub fn name(a: &RunnerAttempt) -> String {
    a.metadata
        .name
        .clone()
        .unwrap_or_else(|| panic!("an attempt without a name: {a:?}"))
}

/// The attempt's journal, once it has a status.
pub fn journal_of(a: &RunnerAttempt) -> &AttemptJournal {
    &a.status
        .as_ref()
        .unwrap_or_else(|| panic!("{:?} has no status", a.metadata.name))
        .journal
}

/// The attempt's journalled state (`Pending` before it has a status).
pub fn state(a: &RunnerAttempt) -> AttemptState {
    a.status
        .as_ref()
        .map(|s| s.journal.state())
        .unwrap_or_default()
}

/// The attempt's journalled outcome, once it has one.
pub fn outcome(a: &RunnerAttempt) -> Option<Outcome> {
    a.status.as_ref().and_then(|s| s.journal.outcome())
}

/// The runner registration the attempt journalled (it has taken its JIT).
pub fn registration(a: &RunnerAttempt) -> RunnerRegistration {
    a.status
        .as_ref()
        .and_then(|s| s.journal.runner())
        .cloned()
        .unwrap_or_else(|| panic!("{:?} journalled no runner", a.metadata.name))
}

/// Where the attempt's runtime (or slot) is on the host, from its journalled workspace.
pub fn runtime_path(a: &RunnerAttempt) -> PathBuf {
    let workspace = a
        .status
        .as_ref()
        .and_then(|s| s.journal.workspace())
        .unwrap_or_else(|| panic!("{:?} journalled no workspace", a.metadata.name));
    PathBuf::from(workspace.runtime_path())
}

/// The pid of the runner process the attempt journalled.
pub fn pid_of(a: &RunnerAttempt) -> u32 {
    a.status
        .as_ref()
        .and_then(|s| s.journal.process())
        .unwrap_or_else(|| panic!("{:?} journalled no process", a.metadata.name))
        .pid
}

/// Whether process `pid` is alive: it exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}
