//! Where a package's share of a launch went, for the attempt's `status.launch`.

use std::time::Duration;

/// Package timings of one materialization. A step never reached is zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PackageTimings {
    /// Waiting for the shared or exclusive hold (behind an install or a prune).
    pub wait: Duration,
    /// Download (when needed), archive check and extraction.
    pub install: Duration,
    /// Of `install`: the download (with the extraction streaming beside it).
    pub download: Duration,
    /// Of `install`: the extraction after the download ended (all of it from a kept archive).
    pub extract: Duration,
    /// Fingerprints and the full contents check of the copy.
    pub verify: Duration,
    /// Laying the package out in the runtime.
    pub copy: Duration,
    /// Whether this launch downloaded the archive.
    pub downloaded: bool,
    /// How this launch's install proved its tree (`None`: it installed nothing).
    pub installed: Option<InstallProof>,
}

/// How an install proved the tree it put in the cache (closed: it reaches the log's `outcome`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstallProof {
    /// Extracted while it downloaded, and proven by construction in this process.
    StreamedByConstruction,
    /// Extracted from the kept archive and proven by construction.
    ByConstruction,
    /// To be proven by reading it before its first use.
    Pending,
}

impl InstallProof {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::StreamedByConstruction => "streamed_proven_by_construction",
            Self::ByConstruction => "proven_by_construction",
            Self::Pending => "proof_pending",
        }
    }
}

impl PackageTimings {
    /// `download` and `extract` are parts of `install`, not added again.
    pub fn total(&self) -> Duration {
        self.wait + self.install + self.verify + self.copy
    }

    /// Milliseconds, for `status.launch.materializeMs`.
    pub fn total_ms(&self) -> u64 {
        u64::try_from(self.total().as_millis()).unwrap_or(u64::MAX)
    }
}
