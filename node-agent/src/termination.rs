//! Ordered termination (DESIGN §4 rule 3, lifecycle spec §2.4 `Terminate`, behaviours I): a
//! durable intent file *with its reason* before any signal; the stop through the launcher
//! (whole cgroup or unit, never a pid by number); death proven by re-inspection; only then the
//! outcome. The reason is recorded so a crash between signal and conclusion is concluded with
//! the right outcome on restart (the predecessor always wrote `registration-timeout`, which
//! turned an interrupted idle stop into a failure with a replacement).

use std::io;
use std::path::Path;

use runner_manager_crds::attempt::TerminationReason;
use runner_manager_crds::outcome::Outcome;
use runner_manager_crds::recovery::{TerminateReason, requested_termination_outcome};
use runner_manager_crds::state::AttemptState;

// Why a termination did not conclude is the providers' vocabulary (a stop or a look that failed):
// it lives with them, below this module.
pub use crate::providers::provider::TerminationError;
use crate::providers::{NativeProvider, Provider, RunnerLauncher, RunnerRef, StopError};
use runner_manager_crds::attempt::StartedIdentity;

/// The intent file's name in the attempt's runtime.
pub const INTENT_FILE: &str = ".terminate-intent";
const MAX_INTENT_BYTES: usize = 64;

/// Why the agent is stopping a runner: its own deadline (recovery's `Terminate`), or the
/// operator's `spec.termination` (including deletion of the attempt).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IntentReason {
    Deadline(TerminateReason),
    Requested(TerminationReason),
}

impl From<TerminateReason> for IntentReason {
    fn from(r: TerminateReason) -> Self {
        Self::Deadline(r)
    }
}

impl From<TerminationReason> for IntentReason {
    fn from(r: TerminationReason) -> Self {
        Self::Requested(r)
    }
}

const TOKENS: [(IntentReason, &str); 8] = {
    use IntentReason::{Deadline, Requested};
    use TerminateReason as Due;
    use TerminationReason as Asked;
    [
        (Deadline(Due::RegistrationTimeout), "registration-timeout"),
        (Deadline(Due::IdleTimeout), "idle-timeout"),
        (
            Requested(Asked::RegistrationTimeout),
            "requested:registration-timeout",
        ),
        (Requested(Asked::IdleTimeout), "requested:idle-timeout"),
        (Requested(Asked::PolicyDeleted), "requested:policy-deleted"),
        (Requested(Asked::Drain), "requested:drain"),
        (Requested(Asked::Deleted), "requested:deleted"),
        (Requested(Asked::ScaleDown), "requested:scale-down"),
    ]
};

impl IntentReason {
    /// The file's content.
    pub fn token(self) -> &'static str {
        TOKENS
            .iter()
            .find(|(r, _)| *r == self)
            .map_or("registration-timeout", |(_, t)| t)
    }

    pub fn from_token(token: &str) -> Option<Self> {
        TOKENS.iter().find(|(_, t)| *t == token).map(|(r, _)| *r)
    }

    /// The outcome once the runner is proven gone. The agent's own deadlines follow
    /// `TerminateReason::outcome`; a request for a registered runner that was deregistered
    /// first (idle timeout, scale-down) is an idle exit; deletion, drain and policy deletion
    /// are `TerminationRequested`.
    /// The outcome once the runner is proven stopped, from the state it was stopped in (an
    /// idle runner stopped on request exited idle; see `crds::recovery`).
    pub fn outcome(self, state: AttemptState) -> Outcome {
        match self {
            Self::Deadline(r) => r.outcome(),
            Self::Requested(r) => requested_termination_outcome(r, state),
        }
    }
}

/// Durably records the intent (temp file, fsync, rename, directory fsync).
pub fn record_intent(runtime: &Path, reason: IntentReason) -> io::Result<()> {
    crate::durable::write_file(
        runtime,
        INTENT_FILE,
        format!("{}\n", reason.token()).as_bytes(),
    )
}

/// The recorded intent, if any. An unreadable or unknown one reads as the registration
/// timeout, the reason that stays true of a dead process (lifecycle spec §2.4 rule 9).
pub fn read_intent(runtime: &Path) -> io::Result<Option<IntentReason>> {
    use std::io::Read;
    use std::os::fd::AsFd;
    let dir = crate::durable::open_dir(runtime)?;
    let fd = match rustix::fs::openat(
        dir.as_fd(),
        INTENT_FILE,
        rustix::fs::OFlags::RDONLY
            | rustix::fs::OFlags::NOFOLLOW
            | rustix::fs::OFlags::CLOEXEC
            | rustix::fs::OFlags::NONBLOCK,
        rustix::fs::Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut text = String::new();
    let read = std::fs::File::from(fd)
        .take(MAX_INTENT_BYTES as u64)
        .read_to_string(&mut text);
    Ok(Some(
        read.ok()
            .and_then(|_| IntentReason::from_token(text.trim()))
            .unwrap_or(IntentReason::Deadline(TerminateReason::RegistrationTimeout)),
    ))
}

/// Removes the intent once the conclusion is journalled.
pub fn clear_intent(runtime: &Path) -> io::Result<()> {
    crate::durable::remove_file(runtime, INTENT_FILE)
}

/// Terminates `runner` through its provider: intent, stop, proof of death, outcome. The caller
/// then deregisters (if GitHub still lists it), journals the outcome and cleans.
pub async fn terminate_with(
    provider: &dyn Provider,
    runner: RunnerRef<'_>,
    runtime: &Path,
    reason: IntentReason,
    state: AttemptState,
) -> Result<Outcome, TerminationError> {
    // 1. Durable intent, or no signal at all.
    record_intent(runtime, reason).map_err(|e| TerminationError::IntentNotDurable(e.kind()))?;
    // 2. Stop through the provider (a native launcher stops the whole cgroup or unit and never
    //    signals a pid by number, so a recycled pid is never touched; OCI deletes the pod of the
    //    journalled uid).
    provider.stop(runner).await?;
    // 3. Death proven by looking again, whatever the stop said.
    if provider.look(runner).await?.alive {
        return Err(TerminationError::Deferred(StopError::StillRunning));
    }
    Ok(reason.outcome(state))
}

/// [`terminate_with`] a native launcher, for callers without an async runtime (the launchers'
/// own tests): the native provider's steps never wait, so the future completes when first
/// polled.
pub fn terminate<L: RunnerLauncher + ?Sized>(
    launcher: &L,
    identity: &runner_manager_crds::attempt::ProcessIdentity,
    runtime: &Path,
    reason: IntentReason,
    state: AttemptState,
) -> Result<Outcome, TerminationError> {
    use futures_util::FutureExt;
    let identity = StartedIdentity::Process(identity.clone());
    terminate_with(
        &NativeProvider(launcher),
        RunnerRef {
            namespace: "",
            identity: &identity,
        },
        runtime,
        reason,
        state,
    )
    .now_or_never()
    .unwrap_or(Err(TerminationError::Deferred(StopError::StillRunning)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_manager_crds::outcome::FailureReason;

    #[test]
    fn every_reason_round_trips_and_has_its_outcome() {
        for (r, t) in TOKENS {
            assert_eq!(IntentReason::from_token(t), Some(r));
            assert_eq!(r.token(), t);
        }
        assert_eq!(
            IntentReason::Deadline(TerminateReason::IdleTimeout).outcome(AttemptState::Idle),
            Outcome::ExitedIdleWithoutWork
        );
        assert_eq!(
            IntentReason::Deadline(TerminateReason::RegistrationTimeout)
                .outcome(AttemptState::Starting),
            Outcome::Failed(FailureReason::TerminatedAfterRegistrationTimeout)
        );
        assert_eq!(
            IntentReason::Requested(TerminationReason::ScaleDown).outcome(AttemptState::Idle),
            Outcome::ExitedIdleWithoutWork
        );
        assert_eq!(
            IntentReason::Requested(TerminationReason::Deleted).outcome(AttemptState::Busy),
            Outcome::Failed(FailureReason::TerminationRequested)
        );
        assert_eq!(
            IntentReason::Requested(TerminationReason::Deleted).outcome(AttemptState::Idle),
            Outcome::ExitedIdleWithoutWork
        );
        assert!(
            !IntentReason::Requested(TerminationReason::Drain)
                .outcome(AttemptState::Idle)
                .wants_replacement()
        );
        assert!(
            IntentReason::Deadline(TerminateReason::RegistrationTimeout)
                .outcome(AttemptState::Starting)
                .wants_replacement()
        );
        assert!(
            !IntentReason::Deadline(TerminateReason::IdleTimeout)
                .outcome(AttemptState::Idle)
                .wants_replacement()
        );
    }
}
