//! Whether a job ran, from the runner's own `_diag` (DESIGN §4 rule 4, behaviours H): a
//! `Worker_*.log` means the worker started for a job; `Runner_*.log` alone means the listener
//! ran but no job; neither, or a `_diag` that cannot be read within the deadline, is unknown.
//! Names are listed, never opened: no content is read, no link is followed (a link named like a
//! log does not count), and the listing stops at a bound, so a hostile `_diag` with millions of
//! entries cannot stall supervision. Plus what the listener's exit code says.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use runner_manager_crds::outcome::{FailureReason, Outcome};
use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};

/// How long the read may take (lifecycle spec §10 `EVIDENCE_DEADLINE`).
pub const EVIDENCE_DEADLINE: Duration = Duration::from_secs(2);
/// Entries of `_diag` looked at before giving up.
pub const MAX_DIAG_ENTRIES: usize = 10_000;
/// The listener's exit code for "GitHub no longer accepts this runner version" (with
/// `ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE=1`, set by the platform defaults).
pub const EXIT_VERSION_DEPRECATED: i32 = 7;

/// What `_diag` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JobEvidence {
    RanAJob,
    NoJob,
    Unknown,
}

fn is_log(name: &[u8], prefix: &[u8]) -> bool {
    name.starts_with(prefix) && name.ends_with(b".log")
}

/// Reads `<runtime>/_diag` with [`EVIDENCE_DEADLINE`].
pub fn job_evidence(runtime: &Path) -> JobEvidence {
    job_evidence_within(runtime.to_path_buf(), EVIDENCE_DEADLINE)
}

/// Reads `<runtime>/_diag`, giving `Unknown` if it takes longer than `deadline` (a hung
/// filesystem must not stall supervision; the reading thread is abandoned).
pub fn job_evidence_within(runtime: PathBuf, deadline: Duration) -> JobEvidence {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(read_diag(&runtime));
    });
    rx.recv_timeout(deadline).unwrap_or(JobEvidence::Unknown)
}

fn read_diag(runtime: &Path) -> JobEvidence {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let Ok(rt) = rustix::fs::open(runtime, flags, Mode::empty()) else {
        return JobEvidence::Unknown;
    };
    let Ok(diag) = rustix::fs::openat(&rt, "_diag", flags, Mode::empty()) else {
        return JobEvidence::Unknown;
    };
    let Ok(mut listing) = Dir::read_from(&diag) else {
        return JobEvidence::Unknown;
    };
    let mut runner_log = false;
    for _ in 0..MAX_DIAG_ENTRIES {
        let Some(entry) = listing.read() else {
            return if runner_log {
                JobEvidence::NoJob
            } else {
                JobEvidence::Unknown
            };
        };
        let Ok(entry) = entry else {
            return JobEvidence::Unknown;
        };
        let name = entry.file_name().to_bytes();
        let worker = is_log(name, b"Worker_");
        if !worker && !is_log(name, b"Runner_") {
            continue;
        }
        // Only a real file counts: a link or directory named like a log is not evidence.
        let file_type = match entry.file_type() {
            FileType::Unknown => {
                rustix::fs::statat(diag.as_fd(), entry.file_name(), AtFlags::SYMLINK_NOFOLLOW)
                    .map(|s| FileType::from_raw_mode(s.st_mode))
                    .unwrap_or(FileType::Unknown)
            }
            t => t,
        };
        if file_type != FileType::RegularFile {
            continue;
        }
        if worker {
            return JobEvidence::RanAJob;
        }
        runner_log = true;
    }
    // Bound reached without a worker log: cannot say.
    JobEvidence::Unknown
}

/// What the listener's exit says on its own, before GitHub's witness and the journal's state
/// are weighed by supervision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExitReading {
    /// Exit 0.
    Clean,
    /// Exit 7: GitHub refuses this runner version. Concluded `Failed(RunnerVersionRejected)`
    /// whatever else is seen, and never retried with the same version.
    VersionRejected,
    /// Any other code, a signal, or no status (a process this agent did not start).
    Other,
}

impl ExitReading {
    pub fn of(status: Option<ExitStatus>) -> Self {
        match status.and_then(|s| s.code()) {
            Some(0) => Self::Clean,
            Some(EXIT_VERSION_DEPRECATED) => Self::VersionRejected,
            _ => Self::Other,
        }
    }

    /// An outcome the exit decides by itself, if any.
    pub fn decided_outcome(self) -> Option<Outcome> {
        match self {
            Self::VersionRejected => Some(Outcome::Failed(FailureReason::RunnerVersionRejected)),
            Self::Clean | Self::Other => None,
        }
    }
}
