//! The broker protocol of DESIGN §5, for one request from a proven caller:
//! only for `Prepared` (a native attempt: `Allocated` too, docs/architecture.md deviation 38)
//! without a runner id; mint, and if GitHub refuses the name because a
//! crashed exchange left a registration behind, delete it and mint again; CAS-write
//! `JitReceived` with the runner id (re-read and retried while the attempt is still issuable
//! without one, otherwise the fresh registration is deleted and the answer is 409); only then
//! does the JIT leave. An attempt that already has a runner id gets 410: its JIT is lost and it
//! concludes `JitExpired`.

use std::future::Future;

use kube::api::Api;
use runner_manager_crds::attempt::{RunnerAttempt, RunnerRegistration, Transition, spec_hash};
use runner_manager_crds::broker::{BrokerError, BrokerErrorCode, JitRequest, JitResponse};
use runner_manager_crds::names::runner_name;
use runner_manager_crds::policy::ExecutionMode;
use runner_manager_crds::state::{Actor, AttemptState};
use runner_manager_crds::writer::{Decision, JournalError, JournalWriter};

use super::authn::Caller;
use crate::github::GitHubError;
use crate::github::client::MintDemand;
use crate::github::types::JitConfig;

/// The GitHub operations the broker needs (the GitHub client; a test double in unit tests).
pub trait Registrar: Send + Sync {
    /// Delete any registration of that name; its id if there was one.
    fn discard(&self, name: &str) -> impl Future<Output = Result<Option<i64>, GitHubError>> + Send;
    /// Mint a JIT; a mint that retries asks `demand` between its tries.
    fn mint(
        &self,
        name: &str,
        runner_group_id: i64,
        labels: &[String],
        demand: &impl MintDemand,
    ) -> impl Future<Output = Result<JitConfig, GitHubError>> + Send;
}

impl Registrar for crate::github::GitHubClient {
    async fn discard(&self, name: &str) -> Result<Option<i64>, GitHubError> {
        self.discard_registration(name).await
    }

    async fn mint(
        &self,
        name: &str,
        group: i64,
        labels: &[String],
        demand: &impl MintDemand,
    ) -> Result<JitConfig, GitHubError> {
        self.generate_jit_while(name, group, labels, "_work", demand)
            .await
    }
}

/// The demand behind a mint (parity row 32): the attempt, read again between the mint's tries,
/// is still the one asked for, still issuable, not terminated and not being deleted. A read
/// that fails says nothing: the mint goes on, and the CAS refuses the JIT of an attempt that
/// changed.
struct AttemptDemand<'a> {
    attempts: &'a Api<RunnerAttempt>,
    name: &'a str,
    request: &'a JitRequest,
}

impl MintDemand for AttemptDemand<'_> {
    async fn still_wanted(&self) -> bool {
        match self.attempts.get_opt(self.name).await {
            Ok(Some(a)) => {
                a.metadata.uid.as_deref() == Some(self.request.attempt_uid.as_str())
                    && a.metadata.deletion_timestamp.is_none()
                    && a.spec.termination.is_none()
                    && check_issuable(&a, self.request).is_ok()
            }
            Ok(None) => false,
            Err(_) => true,
        }
    }
}

fn github_unavailable(e: &GitHubError) -> BrokerError {
    // GitHub's error text names the fix (permission, group) and never a secret.
    super::refused(BrokerErrorCode::GitHubUnavailable, e.to_string())
}

/// Serve one JIT request for `attempt`, as just read by the caller.
pub async fn issue<R: Registrar>(
    attempts: &Api<RunnerAttempt>,
    registrar: &R,
    ownership_label: &str,
    attempt: RunnerAttempt,
    request: &JitRequest,
    caller: &Caller,
) -> Result<JitResponse, BrokerError> {
    let name = attempt.metadata.name.clone().unwrap_or_default();
    super::confine(&attempt, &request.attempt_uid, caller)?;
    check_issuable(&attempt, request)?;

    let uuid = attempt_uuid(&attempt)?;
    let runner = runner_name(uuid);
    let mut labels = attempt.spec.snapshot.labels.clone();
    labels.push(ownership_label.to_owned());
    let group = attempt.spec.snapshot.runner_group_id;
    let demand = AttemptDemand {
        attempts,
        name: &name,
        request,
    };
    let minted = match registrar.mint(&runner, group, &labels, &demand).await {
        // A registration under this name was left by a broker that crashed between GitHub's
        // 201 and its CAS, or by a request that lost its CAS: its JIT never reached a runner.
        // GitHub refuses the name (409); delete the leftover and mint once more. Minting first
        // and looking up only on a refusal keeps a mint at one GitHub call.
        Err(e) if is_name_taken(&e) => {
            registrar
                .discard(&runner)
                .await
                .map_err(|e| github_unavailable(&e))?;
            registrar.mint(&runner, group, &labels, &demand).await
        }
        other => other,
    }
    .map_err(|e| match e {
        // The mint already deleted what its failed tries may have registered.
        GitHubError::NoLongerWanted { .. } => super::refused(
            BrokerErrorCode::NotPrepared,
            "the attempt was concluded, terminated or deleted during the mint; no JIT was issued",
        ),
        e => github_unavailable(&e),
    })?;
    // A crash here leaves a registration no JIT reached; the agent concludes the attempt
    // `JitExpired` without a runner id and the supervisor deregisters it by its derived name.
    crate::fault::at(crate::fault::Boundary::AfterMintBeforeJournal);
    let registration = RunnerRegistration {
        name: minted.runner.name.clone(),
        id: minted.runner.id,
    };

    // The CAS through the one journal writer, re-read and re-decided while the attempt is still
    // issuable; anything else and the fresh registration must not outlive this answer.
    let mut refused = None;
    let written = JournalWriter::new(attempts.clone(), Actor::Broker)
        .advance(&name, Some(&attempt), |current| {
            refused = check_issuable(current, request).err();
            if refused.is_some() {
                return Decision::Nothing;
            }
            Decision::Take(Transition::ReceiveJit {
                runner: registration.clone(),
            })
        })
        .await;
    match written {
        Ok(Some(_)) => Ok(JitResponse {
            runner: registration,
            encoded_jit_config: minted.encoded_jit_config,
        }),
        other => {
            let _ = registrar.discard(&runner).await;
            Err(match other {
                Ok(_) => refused.unwrap_or_else(|| {
                    super::refused(BrokerErrorCode::NotPrepared, "the attempt changed")
                }),
                Err(e) if e.is_gone() => {
                    super::refused(BrokerErrorCode::UnknownAttempt, "the attempt is gone")
                }
                Err(JournalError::Patch(_)) => {
                    super::refused(BrokerErrorCode::NotPrepared, "the attempt changed")
                }
                Err(JournalError::Contended) => super::refused(
                    BrokerErrorCode::Internal,
                    "the journal write kept conflicting; no JIT was issued",
                ),
                Err(_) => super::refused(
                    BrokerErrorCode::Internal,
                    "the journal write failed; no JIT was issued",
                ),
            })
        }
    }
}

fn is_name_taken(e: &GitHubError) -> bool {
    matches!(
        e,
        GitHubError::Terminal {
            reason: crate::github::errors::Terminal::NameTaken,
            ..
        }
    )
}

/// Whether a JIT may be issued for the attempt as it is.
fn check_issuable(attempt: &RunnerAttempt, request: &JitRequest) -> Result<(), BrokerError> {
    let journal = attempt.status.as_ref().map(|s| &s.journal);
    if journal.and_then(|j| j.runner()).is_some() {
        return Err(super::refused(
            BrokerErrorCode::AlreadyIssued,
            "a JIT was already issued for this attempt; it is lost: conclude JitExpired",
        ));
    }
    // A native attempt is asked for from `Allocated`: the agent's request is its claim that the
    // preparation is done, and the CAS below takes `Allocated → JitReceived` (one write, not the
    // agent's `Prepared` and then this one). An OCI attempt only from `Prepared`, where its pod
    // is journalled. The state machine refuses anything else in the CAS too; this is the clear
    // answer before a mint.
    let state = journal.map(|j| j.state()).unwrap_or_default();
    let native = attempt.spec.snapshot.execution.mode == ExecutionMode::Native;
    if !(state == AttemptState::Prepared || (native && state == AttemptState::Allocated)) {
        return Err(super::refused(
            BrokerErrorCode::NotPrepared,
            if native {
                "the attempt is neither Allocated nor Prepared"
            } else {
                "the attempt is not Prepared (an OCI attempt's pod is journalled first)"
            },
        ));
    }
    let admitted = journal.and_then(|j| j.spec_hash());
    if admitted != Some(request.spec_hash.as_str())
        || admitted != Some(spec_hash(&attempt.spec).as_str())
    {
        return Err(super::refused(
            BrokerErrorCode::NotPrepared,
            "the spec hash differs from the one admitted",
        ));
    }
    Ok(())
}

fn attempt_uuid(attempt: &RunnerAttempt) -> Result<uuid::Uuid, BrokerError> {
    attempt
        .spec
        .attempt_uuid()
        .ok_or_else(|| super::refused(BrokerErrorCode::Internal, "the attempt has no valid id"))
}
