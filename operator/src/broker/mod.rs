//! The JIT broker (DESIGN §5): HTTPS, caller proven by a bound service-account token to run on
//! the attempt's node, the runner id journalled before the JIT leaves, one JIT per attempt.

pub mod authn;
pub mod job;
pub mod pods;
pub mod protocol;
pub mod scaleset;
pub mod server;
pub mod tls;

use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::broker::{BrokerError, BrokerErrorCode};

/// A refusal with its closed code and a message for people (never a token or a JIT).
pub(crate) fn refused(code: BrokerErrorCode, message: impl Into<String>) -> BrokerError {
    BrokerError {
        code,
        message: message.into(),
    }
}

/// Every request about an attempt (a JIT, a pod order) is about exactly that attempt (its uid:
/// a name can be reused after deletion) and comes from the agent of its node.
pub(crate) fn confine(
    attempt: &RunnerAttempt,
    attempt_uid: &str,
    caller: &authn::Caller,
) -> Result<(), BrokerError> {
    if attempt.metadata.uid.as_deref() != Some(attempt_uid) {
        return Err(refused(
            BrokerErrorCode::UnknownAttempt,
            "no attempt with that uid",
        ));
    }
    if attempt.spec.node_name != caller.node_name {
        return Err(refused(
            BrokerErrorCode::WrongNode,
            "the caller's pod does not run on the attempt's node",
        ));
    }
    Ok(())
}
