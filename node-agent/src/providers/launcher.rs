//! The launcher trait: start the entry helper for one attempt with its handoff, inspect and stop
//! what it started, by identity.
//!
//! `start` returns only once the handoff file is gone and the identity is durable in
//! `.runner-process.json` (DESIGN §4 rule 1, lifecycle spec §2.7 item 4), so the caller may
//! journal `Starting` with it. A failure says whether a child ever existed: only a failure
//! before any child existed may be retried, because a child may have consumed the one-shot JIT
//! (lifecycle spec §2.3).

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::process::ExitStatus;

use runner_manager_crds::attempt::{Launcher, ProcessIdentity};

use super::cgroup::{CgroupError, CgroupLimits};
use crate::account::RunnerAccount;
use crate::docker::engine::EngineSpec;
use crate::entry::EntryFailure;
use crate::handoff::RestrictiveHandoff;
use crate::process::Inspection;
use crate::process::identity_file::IdentityFileError;

/// What one launch needs. Holds no secret: the JIT is in the handoff file only.
#[derive(Clone, Debug)]
pub struct LaunchSpec<'a> {
    /// The attempt's uuid: names its cgroup or unit.
    pub attempt: uuid::Uuid,
    /// The attempt's runtime: a 0700 directory owned by `account`, holding `bin/Runner.Listener`.
    pub runtime: &'a Path,
    /// The account the listener runs as.
    pub account: RunnerAccount,
    /// The listener's environment but for the JIT
    /// ([`crate::process::environment::layered_environment`]).
    pub environment: BTreeMap<String, String>,
    /// From the snapshot's resources.
    pub limits: CgroupLimits,
    /// The runner's dependency cache mount (`crate::caches`), writable like the runtime.
    pub cache: Option<&'a Path>,
}

/// Why a start failed. Closed: reaches journal conditions and logs as a kind.
#[derive(Debug, thiserror::Error)]
pub enum StartFailure {
    #[error("bin/Runner.Listener is missing or not an executable file")]
    ListenerMissing,
    #[error("cgroup: {0}")]
    Cgroup(#[from] CgroupError),
    #[error("the entry helper could not be started: {0}")]
    Spawn(io::ErrorKind),
    #[error("the entry helper failed: {0}")]
    Entry(EntryFailure),
    #[error("the entry helper did not report in time")]
    NotReadyInTime,
    #[error("the entry helper's report was not understood")]
    BadReport,
    #[error("the handoff file survived the start")]
    HandoffSurvived,
    #[error("the listener's environment file could not be written")]
    EnvironmentFile,
    #[error("the runner is not in its cgroup")]
    NotInCgroup,
    #[error("the runner's start time could not be read")]
    NoStartTime,
    #[error("the identity file could not be written: {0}")]
    IdentityFile(#[from] IdentityFileError),
    #[error("the transient unit could not be started")]
    Unit,
    #[error("the runner could not be recorded among the launcher's children")]
    NotTracked,
}

/// A failed start.
#[derive(Debug, thiserror::Error)]
#[error("{failure}")]
pub struct StartError {
    pub failure: StartFailure,
    /// Whether a child process ever existed. Only a start with none may be retried.
    pub child_existed: bool,
    /// A child that could not be proven dead after the failure: its identity (made durable
    /// where possible) must be journalled as `Starting` so supervision keeps fencing its
    /// capacity and proves it dead later.
    pub live: Option<ProcessIdentity>,
}

impl StartError {
    pub(crate) fn before_child(failure: impl Into<StartFailure>) -> Self {
        Self {
            failure: failure.into(),
            child_existed: false,
            live: None,
        }
    }

    /// May the caller try again (with the same JIT, which no process can have seen)?
    pub fn retryable(&self) -> bool {
        !self.child_existed
    }
}

/// A runner's entry helper started before its JIT existed (`--await-handoff`), waiting for the
/// handoff to be offered: the unit's start (70-170 ms of systemd's sandbox on a node) runs while
/// the JIT is minted instead of after it (issue 32). Nothing of a secret is in it: the listener's
/// environment file is the runner account's and the JIT does not exist yet. Dropped without
/// [`RunnerLauncher::start_prestarted`], the helper waits out its bound and ends, and the
/// attempt's cleanup stops its unit by name ([`RunnerLauncher::stop_prestarted`]).
#[derive(Debug)]
pub struct Prestart {
    /// The unit (or cgroup) it runs in.
    pub(crate) unit: String,
    /// The listener's environment, read (and deleted) by the helper as it starts.
    pub(crate) environment_file: RestrictiveHandoff,
    /// The submission, running beside the JIT request: whether the unit started.
    pub(crate) submitted: std::thread::JoinHandle<bool>,
}

impl Prestart {
    /// Waits for the submission to end, whatever it gave: what it started is then there for
    /// [`RunnerLauncher::stop_prestarted`] to find.
    pub fn settled(self) {
        let _ = self.submitted.join();
    }
}

/// Why [`RunnerLauncher::start_prestarted`] did not start the runner.
#[derive(Debug)]
pub enum PrestartedStart {
    /// Nothing took the handoff, and nothing can any more (the unit never started, or its helper
    /// ended without taking it): the JIT is unseen, and the caller starts the runner the
    /// ordinary way with the handoff it gets back.
    Unseen(RestrictiveHandoff),
    /// The helper may have taken the JIT: never tried again.
    Failed(StartError),
}

/// How a stop ended: only ever returned once death is proven by re-inspection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// Nothing was running any more.
    AlreadyGone,
    /// The launcher stopped it, and re-inspection shows it gone.
    Stopped,
}

/// Why a stop did not end in proven death.
#[derive(Debug, thiserror::Error)]
pub enum StopError {
    #[error("the runner is still running after the stop")]
    StillRunning,
    #[error("the identity names a cgroup or unit that is not ours")]
    NotOurs,
    #[error("the identity is another launcher's")]
    WrongLauncher,
    #[error("cgroup: {0}")]
    Cgroup(CgroupError),
    #[error("inspection failed: {0}")]
    Inspect(io::ErrorKind),
    #[error("the unit could not be stopped")]
    Unit,
}

impl From<CgroupError> for StopError {
    fn from(e: CgroupError) -> Self {
        match e {
            CgroupError::NotOurs => Self::NotOurs,
            e => Self::Cgroup(e),
        }
    }
}

/// One way of running native runners.
pub trait RunnerLauncher: Send + Sync {
    /// Which launcher this is (recorded in the identity).
    fn kind(&self) -> Launcher;

    /// Starts the entry helper for `spec`, which takes the JIT from `handoff`. Returns once the
    /// handoff is gone and the identity is durable.
    fn start(
        &self,
        spec: &LaunchSpec<'_>,
        handoff: RestrictiveHandoff,
    ) -> Result<ProcessIdentity, StartError>;

    /// Starts the entry helper for `spec` before its JIT exists, waiting for the handoff to be
    /// offered; returns at once (the submission runs on a thread of its own, beside the JIT
    /// request). `None`: this launcher starts a runner only with its handoff ([`Self::start`]).
    fn prestart(&self, _spec: &LaunchSpec<'_>) -> Option<Prestart> {
        None
    }

    /// Offers `handoff` to the helper [`Self::prestart`] started and returns as [`Self::start`]
    /// does: once the handoff is gone and the identity is durable.
    fn start_prestarted(
        &self,
        _spec: &LaunchSpec<'_>,
        _prestart: Prestart,
        handoff: RestrictiveHandoff,
    ) -> Result<ProcessIdentity, PrestartedStart> {
        Err(PrestartedStart::Unseen(handoff))
    }

    /// Stops what [`Self::prestart`] may have started for attempt `short` (12 hex) when no
    /// runner identity was journalled for it (the JIT was refused, the launch failed or the agent
    /// crashed before `Starting`): by its name, which only this attempt derives. Nothing started
    /// is `AlreadyGone`.
    fn stop_prestarted(&self, _short: &str) -> Result<Stopped, StopError> {
        Ok(Stopped::AlreadyGone)
    }

    /// Is the runner alive? A recycled pid or a process outside the recorded cgroup or unit is
    /// gone.
    fn inspect(&self, identity: &ProcessIdentity) -> io::Result<Inspection>;

    /// Stops everything of the runner (its whole cgroup or unit) and proves it gone by
    /// re-inspection. Never signals a pid by number.
    fn stop(&self, identity: &ProcessIdentity) -> Result<Stopped, StopError>;

    /// The exit status, when this launcher owns the child and it has exited.
    fn exit_status(&self, identity: &ProcessIdentity) -> Option<ExitStatus>;

    /// The attempt names (the first 12 hex of an attempt uuid) of every cgroup or unit this
    /// launcher holds, live or left over: what the orphan sweep compares with the journal. Only
    /// names this launcher derives (`rm-<12hex>` under its own parent or as its units) are
    /// listed, so nothing else on the host can be taken for an orphan.
    fn leftovers(&self) -> io::Result<Vec<String>> {
        Ok(Vec::new())
    }

    /// Stops and removes what runs under the attempt name `short` (12 hex) with no identity to
    /// check it against: the whole cgroup or unit, never a pid by number, proven empty before it
    /// is removed. Only for a name no attempt claims.
    fn stop_leftover(&self, _short: &str) -> Result<Stopped, StopError> {
        Err(StopError::NotOurs)
    }

    /// Starts the Docker engine of `spec.attempt` beside its runner (`crate::docker`). A
    /// launcher that runs none says why, and the job's Docker socket answers with that.
    fn start_engine(&self, _spec: &EngineSpec<'_>) -> Result<(), String> {
        Err(
            "this node's agent runs runners without systemd (the direct launcher), which starts no Docker engine"
                .to_owned(),
        )
    }

    /// Stops the engine of attempt `short` (12 hex) and every container in it, proven gone.
    /// None running is `AlreadyGone`.
    fn stop_engine(&self, _short: &str) -> Result<Stopped, StopError> {
        Ok(Stopped::AlreadyGone)
    }

    /// The attempt names of the engine units this launcher holds, live or left over.
    fn engine_leftovers(&self) -> io::Result<Vec<String>> {
        Ok(Vec::new())
    }
}

/// Whether `s` is an attempt name: 12 lowercase hex digits.
pub fn is_attempt_short(s: &str) -> bool {
    s.len() == 12
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The entries of `dir` named like an attempt (12 hex): what the orphan sweep compares with the
/// journal. Entries of any other name are not listed (nor ever removed). A missing `dir` holds
/// none.
pub fn attempt_names_in(dir: &std::path::Path) -> std::io::Result<Vec<String>> {
    let mut found = Vec::new();
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            for e in entries {
                if let Some(name) = e?.file_name().to_str().filter(|n| is_attempt_short(n)) {
                    found.push(name.to_owned());
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    Ok(found)
}
