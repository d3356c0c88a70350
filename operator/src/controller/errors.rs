//! What can go wrong reconciling one policy, typed by the stage it happened in (the stackable
//! operators' shape: dereference → validate → build → apply → status), and the per-policy
//! backoff after a failed reconcile. The stage is the `stage` label of
//! `runner_manager_reconcile_errors_total`: a closed vocabulary. Building an attempt is a stage
//! that cannot fail: it reads the policy's validated view (`validate::ValidatedPolicy`), whose
//! target was parsed once, at resolution.

use std::time::Duration;

use runner_manager_crds::policy::PolicyReason;
use tokio::time::Instant;

use super::writes::WriteKind;
use crate::github::errors::GitHubError;

/// Where in a policy's reconcile an error happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Reading what the plan depends on: the credentials Secret, GitHub's runner listing and
    /// queued jobs, the live object before a termination.
    Dereference,
    /// The policy cannot be resolved into something runnable (its `Ready` condition says why).
    Validate,
    /// Carrying out the plan: creates, terminations, deletions, finalizers, the job ledger.
    Apply,
    /// Writing the policy's status.
    Status,
}

impl Stage {
    pub const ALL: [Stage; 4] = [Self::Dereference, Self::Validate, Self::Apply, Self::Status];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dereference => "dereference",
            Self::Validate => "validate",
            Self::Apply => "apply",
            Self::Status => "status",
        }
    }
}

/// What GitHub was asked when a read failed (closed: it reaches logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GitHubRead {
    Runners,
    QueuedJobs,
    RepositoryWalk,
    RunnerLookup,
}

impl std::fmt::Display for GitHubRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Runners => "listing the target's runners",
            Self::QueuedJobs => "polling queued runs",
            Self::RepositoryWalk => "walking the target's repositories",
            Self::RunnerLookup => "looking up a runner before its termination",
        })
    }
}

/// One failure of a policy's reconcile. Messages name objects and fields, never a secret.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("resolving the policy: {reason:?}: {message}")]
    Unresolved {
        reason: PolicyReason,
        message: String,
    },
    #[error("the policy is not valid: {reason:?}: {message}")]
    Invalid {
        reason: PolicyReason,
        message: String,
    },
    #[error("{what}: {source}")]
    GitHubRead {
        what: GitHubRead,
        #[source]
        source: GitHubError,
    },
    #[error("reading attempt {attempt} before its termination: {source}")]
    ReadAttempt {
        attempt: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing {}: {source}", kind.as_str())]
    Write {
        kind: WriteKind,
        #[source]
        source: kube::Error,
    },
    #[error("deregistering runner {runner_id}: {source}")]
    Deregister {
        runner_id: i64,
        #[source]
        source: GitHubError,
    },
    #[error("writing the policy status: {0}")]
    Status(#[source] kube::Error),
}

impl ReconcileError {
    pub fn stage(&self) -> Stage {
        match self {
            Self::Unresolved { .. } | Self::GitHubRead { .. } | Self::ReadAttempt { .. } => {
                Stage::Dereference
            }
            Self::Invalid { .. } => Stage::Validate,
            Self::Write { .. } | Self::Deregister { .. } => Stage::Apply,
            Self::Status(_) => Stage::Status,
        }
    }

    /// Whether the policy waits its backoff before the next reconcile. Reads already run at
    /// their own intervals (the resolution's TTL, the observe and poll intervals) and an
    /// invalid policy waits for a person, so only failed writes back off: those are
    /// what a pass woken by every watch event would otherwise repeat several times a second.
    pub fn backs_off(&self) -> bool {
        matches!(self.stage(), Stage::Apply | Stage::Status)
    }

    pub fn write(kind: WriteKind) -> impl FnOnce(kube::Error) -> Self {
        move |source| Self::Write { kind, source }
    }
}

/// First wait after a failed reconcile; doubles per consecutive failure up to [`BACKOFF_MAX`].
/// Small, because the commonest failure is a conflict with a write the cache has not shown yet.
pub const BACKOFF_BASE: Duration = Duration::from_millis(500);
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// A policy's failed reconciles in a row and when it may be reconciled again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub failures: u32,
    pub generation: i64,
    pub retry_at: Instant,
}

impl Backoff {
    /// The wait after `failures` failed reconciles in a row. Pure.
    pub fn delay(failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(16));
        BACKOFF_BASE.saturating_mul(factor).min(BACKOFF_MAX)
    }

    /// After a reconcile of `generation` at `now`: the next backoff, or None when nothing in
    /// `errors` backs off (the count starts again).
    pub fn after(
        previous: Option<Backoff>,
        errors: &[ReconcileError],
        generation: i64,
        now: Instant,
    ) -> Option<Backoff> {
        if !errors.iter().any(ReconcileError::backs_off) {
            return None;
        }
        let failures = previous
            .filter(|b| b.generation == generation)
            .map_or(0, |b| b.failures)
            .saturating_add(1);
        Some(Backoff {
            failures,
            generation,
            retry_at: now + Self::delay(failures),
        })
    }

    /// Whether a reconcile of `generation` waits at `now`. A changed spec is reconciled at once,
    /// and so is a policy being deleted (its drain must not stall behind a failure).
    pub fn holds(&self, generation: i64, deleting: bool, now: Instant) -> bool {
        !deleting && self.generation == generation && now < self.retry_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conflict() -> ReconcileError {
        ReconcileError::Write {
            kind: WriteKind::AttemptCreate,
            source: kube::Error::Api(
                kube::core::Status::failure("conflict", "Conflict")
                    .with_code(409)
                    .boxed(),
            ),
        }
    }

    #[test]
    fn every_error_has_its_stage_and_only_writes_back_off() {
        let cases = [
            (
                ReconcileError::Unresolved {
                    reason: PolicyReason::GitHubUnreachable,
                    message: "x".into(),
                },
                Stage::Dereference,
                false,
            ),
            (
                ReconcileError::Invalid {
                    reason: PolicyReason::InvalidSpec,
                    message: "x".into(),
                },
                Stage::Validate,
                false,
            ),
            (conflict(), Stage::Apply, true),
        ];
        for (e, stage, backs_off) in cases {
            assert_eq!(e.stage(), stage, "{e}");
            assert_eq!(e.backs_off(), backs_off, "{e}");
        }
        let labels: Vec<&str> = Stage::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(labels, ["dereference", "validate", "apply", "status"]);
    }

    #[test]
    fn backoff_doubles_per_failure_resets_on_success_and_on_a_new_generation() {
        let now = Instant::now();
        assert_eq!(Backoff::delay(1), BACKOFF_BASE);
        assert_eq!(Backoff::delay(3), BACKOFF_BASE * 4);
        assert_eq!(Backoff::delay(40), BACKOFF_MAX);
        let first = Backoff::after(None, &[conflict()], 1, now).unwrap();
        assert_eq!(first.failures, 1);
        assert_eq!(first.retry_at, now + BACKOFF_BASE);
        assert!(first.holds(1, false, now));
        assert!(!first.holds(1, false, now + BACKOFF_BASE), "elapsed");
        assert!(!first.holds(2, false, now), "a changed spec goes at once");
        assert!(!first.holds(1, true, now), "a drain goes at once");
        let second = Backoff::after(Some(first), &[conflict()], 1, now).unwrap();
        assert_eq!(second.failures, 2);
        assert_eq!(
            Backoff::after(Some(second), &[conflict()], 2, now)
                .unwrap()
                .failures,
            1,
            "a new generation counts afresh"
        );
        assert_eq!(Backoff::after(Some(second), &[], 1, now), None, "success");
        let read_only = [ReconcileError::Unresolved {
            reason: PolicyReason::GitHubUnreachable,
            message: "x".into(),
        }];
        assert_eq!(Backoff::after(Some(second), &read_only, 1, now), None);
    }
}
