//! What can go wrong reconciling one policy, typed by the stage it happened in. A policy's
//! reconcile is a pipeline of stages (stackable's dereference → validate → build → apply →
//! status, `controller::policy`): housekeeping of its attempts → resolve → observe → demand →
//! plan → apply → status. Each stage that can fail has its own error type here, and
//! [`ReconcileError`] is one of them with its stage; [`Stage::needs_client`] says which stages
//! reach the API server or GitHub (all but the plan, which is pure and cannot fail; building an
//! attempt is part of it and reads the policy's validated view, whose target was parsed once, at
//! resolution). The stage is the `stage` label of `runner_manager_reconcile_errors_total`: a
//! closed vocabulary. The per-policy backoff after a failed reconcile is here too.

use std::time::Duration;

use runner_manager_crds::policy::PolicyReason;
use tokio::time::Instant;

use super::writes::WriteKind;
use crate::github::errors::GitHubError;

/// The stages of a policy's reconcile, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// The housekeeping plan of the policy's attempts (`core::housekeeping`), carried out:
    /// finalizers, the abandon annotation, the operator's two edges, history.
    Housekeeping,
    /// Dereference and validate: the credentials Secret, the GitHub target, the runner package;
    /// a policy that cannot be resolved into something runnable (its `Ready` condition says why).
    Resolve,
    /// GitHub's runner listing of the target: the attempts' facts, concluded registrations,
    /// orphans.
    Observe,
    /// A pass of the policy's demand source and its job-ledger change.
    Demand,
    /// The decisions (`plan::plan`, `plan::place`): pure, cannot fail.
    Plan,
    /// Carrying out the plan: the finalizer, creates, terminations, deletions.
    Apply,
    /// Writing the policy's status.
    Status,
}

impl Stage {
    pub const ALL: [Stage; 7] = [
        Self::Housekeeping,
        Self::Resolve,
        Self::Observe,
        Self::Demand,
        Self::Plan,
        Self::Apply,
        Self::Status,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Housekeeping => "housekeeping",
            Self::Resolve => "resolve",
            Self::Observe => "observe",
            Self::Demand => "demand",
            Self::Plan => "plan",
            Self::Apply => "apply",
            Self::Status => "status",
        }
    }

    /// Its place in [`Stage::ALL`] (the declaration order, which `ALL` follows).
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Whether the stage reaches the API server or GitHub (the others are pure, tested without
    /// either, and cannot fail).
    pub const fn needs_client(self) -> bool {
        !matches!(self, Self::Plan)
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

/// A write to the API server that failed, by what it wrote.
#[derive(Debug, thiserror::Error)]
#[error("writing {}: {source}", kind.as_str())]
pub struct WriteFailed {
    pub kind: WriteKind,
    #[source]
    pub source: kube::Error,
}

impl WriteFailed {
    pub fn of(kind: WriteKind) -> impl FnOnce(kube::Error) -> Self {
        move |source| Self { kind, source }
    }
}

/// A read from GitHub that failed.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct ReadFailed {
    pub what: GitHubRead,
    #[source]
    pub source: GitHubError,
}

/// A runner registration GitHub would not delete.
#[derive(Debug, thiserror::Error)]
#[error("deregistering runner {runner_id}: {source}")]
pub struct DeregisterFailed {
    pub runner_id: i64,
    #[source]
    pub source: GitHubError,
}

/// The housekeeping stage: a write that carries a step out.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct HousekeepingError(#[from] pub WriteFailed);

/// The resolve stage. Messages name objects and fields, never a secret.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// Not resolvable now (GitHub or the Secret could not be read): retried soon.
    #[error("resolving the policy: {reason:?}: {message}")]
    Unresolved {
        reason: PolicyReason,
        message: String,
    },
    /// Resolved, and not runnable: waits for a person.
    #[error("the policy is not valid: {reason:?}: {message}")]
    Invalid {
        reason: PolicyReason,
        message: String,
    },
}

/// The observe stage.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    #[error(transparent)]
    Read(#[from] ReadFailed),
    #[error(transparent)]
    Write(#[from] WriteFailed),
    #[error(transparent)]
    Deregister(#[from] DeregisterFailed),
}

/// The demand stage: the source's reads, and the ledger write.
#[derive(Debug, thiserror::Error)]
pub enum DemandError {
    #[error(transparent)]
    Read(#[from] ReadFailed),
    #[error(transparent)]
    Write(#[from] WriteFailed),
}

/// The apply stage: the termination's reads (the live attempt, its runner on GitHub), its
/// deregistration, and every write.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("reading attempt {attempt} before its termination: {source}")]
    ReadAttempt {
        attempt: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Read(#[from] ReadFailed),
    #[error(transparent)]
    Write(#[from] WriteFailed),
    #[error(transparent)]
    Deregister(#[from] DeregisterFailed),
}

/// The status stage.
#[derive(Debug, thiserror::Error)]
#[error("writing the policy status: {0}")]
pub struct StatusError(#[source] pub kube::Error);

/// One failure of a policy's reconcile, with the stage it happened in.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("housekeeping: {0}")]
    Housekeeping(#[from] HousekeepingError),
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error("observing: {0}")]
    Observe(#[from] ObserveError),
    #[error("demand: {0}")]
    Demand(#[from] DemandError),
    #[error("applying: {0}")]
    Apply(#[from] ApplyError),
    #[error(transparent)]
    Status(#[from] StatusError),
}

impl ReconcileError {
    pub fn stage(&self) -> Stage {
        match self {
            Self::Housekeeping(_) => Stage::Housekeeping,
            Self::Resolve(_) => Stage::Resolve,
            Self::Observe(_) => Stage::Observe,
            Self::Demand(_) => Stage::Demand,
            Self::Apply(_) => Stage::Apply,
            Self::Status(_) => Stage::Status,
        }
    }

    /// Whether the policy waits its backoff before the next reconcile. Reads already run at
    /// their own intervals (the resolution's TTL, the observe and poll intervals) and an
    /// invalid policy waits for a person, so only failed writes and deregistrations back off:
    /// those are what a pass woken by every watch event would otherwise repeat several times a
    /// second. Housekeeping's never do: one attempt whose write keeps failing must not hold the
    /// policy's scale-up and its other attempts to once a minute (it is retried with the next
    /// reconcile anyway).
    pub fn backs_off(&self) -> bool {
        match self {
            Self::Housekeeping(_) | Self::Resolve(_) => false,
            Self::Observe(e) => !matches!(e, ObserveError::Read(_)),
            Self::Demand(e) => matches!(e, DemandError::Write(_)),
            Self::Apply(e) => !matches!(e, ApplyError::Read(_) | ApplyError::ReadAttempt { .. }),
            Self::Status(_) => true,
        }
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

    fn conflict() -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("conflict", "Conflict")
                .with_code(409)
                .boxed(),
        )
    }

    fn write(kind: WriteKind) -> WriteFailed {
        WriteFailed::of(kind)(conflict())
    }

    fn down() -> GitHubError {
        GitHubError::Transport {
            endpoint: crate::github::endpoint::Endpoint::ListRunners,
            kind: crate::github::errors::TransportKind::Connect,
        }
    }

    fn read() -> ReadFailed {
        ReadFailed {
            what: GitHubRead::Runners,
            source: down(),
        }
    }

    fn created() -> ReconcileError {
        ApplyError::from(write(WriteKind::AttemptCreate)).into()
    }

    /// Every stage that can fail has its error type; only writes and deregistrations back off,
    /// and never housekeeping's; the plan is the one stage without a client.
    #[test]
    fn every_error_has_its_stage_and_only_writes_back_off() {
        let unresolved = ResolveError::Unresolved {
            reason: PolicyReason::GitHubUnreachable,
            message: "x".into(),
        };
        let invalid = ResolveError::Invalid {
            reason: PolicyReason::InvalidSpec,
            message: "x".into(),
        };
        let cases: [(ReconcileError, Stage, bool); 11] = [
            (
                HousekeepingError(write(WriteKind::AttemptFinalizer)).into(),
                Stage::Housekeeping,
                false,
            ),
            (unresolved.into(), Stage::Resolve, false),
            (invalid.into(), Stage::Resolve, false),
            (ObserveError::from(read()).into(), Stage::Observe, false),
            (
                ObserveError::from(write(WriteKind::AttemptFacts)).into(),
                Stage::Observe,
                true,
            ),
            (DemandError::from(read()).into(), Stage::Demand, false),
            (
                DemandError::from(write(WriteKind::PendingJobs)).into(),
                Stage::Demand,
                true,
            ),
            (created(), Stage::Apply, true),
            (
                ApplyError::ReadAttempt {
                    attempt: "web-1".into(),
                    source: conflict(),
                }
                .into(),
                Stage::Apply,
                false,
            ),
            (
                ApplyError::from(DeregisterFailed {
                    runner_id: 7,
                    source: down(),
                })
                .into(),
                Stage::Apply,
                true,
            ),
            (StatusError(conflict()).into(), Stage::Status, true),
        ];
        for (e, stage, backs_off) in cases {
            assert_eq!(e.stage(), stage, "{e}");
            assert_eq!(e.backs_off(), backs_off, "{e}");
        }
        let labels: Vec<&str> = Stage::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            labels,
            [
                "housekeeping",
                "resolve",
                "observe",
                "demand",
                "plan",
                "apply",
                "status"
            ]
        );
        let pure: Vec<Stage> = Stage::ALL
            .into_iter()
            .filter(|s| !s.needs_client())
            .collect();
        assert_eq!(pure, [Stage::Plan]);
        for (i, stage) in Stage::ALL.into_iter().enumerate() {
            assert_eq!(stage.index(), i, "{stage:?}");
        }
    }

    #[test]
    fn backoff_doubles_per_failure_resets_on_success_and_on_a_new_generation() {
        let now = Instant::now();
        assert_eq!(Backoff::delay(1), BACKOFF_BASE);
        assert_eq!(Backoff::delay(3), BACKOFF_BASE * 4);
        assert_eq!(Backoff::delay(40), BACKOFF_MAX);
        let first = Backoff::after(None, &[created()], 1, now).unwrap();
        assert_eq!(first.failures, 1);
        assert_eq!(first.retry_at, now + BACKOFF_BASE);
        assert!(first.holds(1, false, now));
        assert!(!first.holds(1, false, now + BACKOFF_BASE), "elapsed");
        assert!(!first.holds(2, false, now), "a changed spec goes at once");
        assert!(!first.holds(1, true, now), "a drain goes at once");
        let second = Backoff::after(Some(first), &[created()], 1, now).unwrap();
        assert_eq!(second.failures, 2);
        assert_eq!(
            Backoff::after(Some(second), &[created()], 2, now)
                .unwrap()
                .failures,
            1,
            "a new generation counts afresh"
        );
        assert_eq!(Backoff::after(Some(second), &[], 1, now), None, "success");
        let read_only = [ReconcileError::from(ResolveError::Unresolved {
            reason: PolicyReason::GitHubUnreachable,
            message: "x".into(),
        })];
        assert_eq!(Backoff::after(Some(second), &read_only, 1, now), None);
        let housekeeping = [ReconcileError::from(HousekeepingError(write(
            WriteKind::AttemptDelete,
        )))];
        assert_eq!(Backoff::after(Some(second), &housekeeping, 1, now), None);
    }
}
