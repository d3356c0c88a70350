//! Is the recorded runner alive? Alive only if a process has the recorded pid, the recorded
//! start time, is not an unreaped exit, and sits in the recorded cgroup. Anything else is gone,
//! and the reason says whether the pid now belongs to someone else: a recycled pid is never
//! adopted and never signalled.

use std::io;

use runner_manager_crds::attempt::ProcessIdentity;
use runner_manager_crds::recovery::ProcessObservation;

use super::stat::{read_cgroup_v2, read_stat};

/// What inspection found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inspection {
    Alive,
    Gone(GoneBecause),
}

/// Why the recorded runner counts as gone. Closed: reaches logs as a kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GoneBecause {
    /// No process has the pid.
    NoProcess,
    /// The process exited and waits to be reaped.
    Exited,
    /// Another process has the pid now (different start time).
    PidRecycled,
    /// The pid and start time match but the process is not in the recorded cgroup: not ours
    /// (a forged identity file), so never touched.
    OutsideCgroup,
}

impl Inspection {
    pub fn is_alive(self) -> bool {
        self == Self::Alive
    }

    /// What `crds::recovery::recovery_decision` takes.
    pub fn observation(self) -> ProcessObservation {
        match self {
            Self::Alive => ProcessObservation::Alive,
            Self::Gone(_) => ProcessObservation::Gone,
        }
    }
}

/// Inspects the process an identity records (launcher-independent; the launchers add their
/// unit or cgroup checks on top).
pub fn inspect(identity: &ProcessIdentity) -> io::Result<Inspection> {
    let Some(stat) = read_stat(identity.pid)? else {
        return Ok(Inspection::Gone(GoneBecause::NoProcess));
    };
    if stat.start_time != identity.start_time {
        return Ok(Inspection::Gone(GoneBecause::PidRecycled));
    }
    if stat.is_exited() {
        return Ok(Inspection::Gone(GoneBecause::Exited));
    }
    match read_cgroup_v2(identity.pid)? {
        // Exited between the two reads.
        None => Ok(Inspection::Gone(GoneBecause::NoProcess)),
        Some(cgroup) if cgroup == identity.cgroup => {
            // The start time again: the pid could have been recycled between the reads.
            match read_stat(identity.pid)? {
                Some(again) if again.start_time == identity.start_time && !again.is_exited() => {
                    Ok(Inspection::Alive)
                }
                Some(again) if again.start_time == identity.start_time => {
                    Ok(Inspection::Gone(GoneBecause::Exited))
                }
                Some(_) => Ok(Inspection::Gone(GoneBecause::PidRecycled)),
                None => Ok(Inspection::Gone(GoneBecause::NoProcess)),
            }
        }
        Some(_) => Ok(Inspection::Gone(GoneBecause::OutsideCgroup)),
    }
}
