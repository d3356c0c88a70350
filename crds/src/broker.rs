//! The JIT broker's wire types (DESIGN §5): `POST /v1/attempts/{namespace}/{name}/jit`.
//!
//! The response carries the one-shot JIT config in a [`SecretString`]: it is never printed by
//! `Debug`, and it is exposed only where it is written to the restrictive handoff file.

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize, Serializer};

use crate::attempt::RunnerRegistration;

/// The audience of the bound service-account token an agent presents.
pub const BROKER_AUDIENCE: &str = "runner-manager-broker";

/// The request path of an attempt's JIT.
pub fn jit_path(namespace: &str, name: &str) -> String {
    format!("/v1/attempts/{namespace}/{name}/jit")
}

/// The request body: which attempt, exactly (a name can be reused after deletion; a uid cannot).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JitRequest {
    pub attempt_uid: String,
    /// The spec hash the agent admitted; the broker refuses a mismatch.
    pub spec_hash: String,
}

/// The answer: the registration (already journalled) and the JIT config.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JitResponse {
    pub runner: RunnerRegistration,
    pub encoded_jit_config: SecretString,
}

impl Serialize for JitResponse {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Serialized exactly once, into the broker's HTTPS response body.
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Wire<'a> {
            runner: &'a RunnerRegistration,
            encoded_jit_config: &'a str,
        }
        Wire {
            runner: &self.runner,
            encoded_jit_config: self.encoded_jit_config.expose_secret(),
        }
        .serialize(s)
    }
}

/// Why the broker refused. Closed, so agents can act on it without parsing text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BrokerErrorCode {
    /// 401: no token, or the TokenReview refused it (wrong audience, expired, unbound).
    Unauthenticated,
    /// 403: the token's pod is not an agent pod on the attempt's node.
    WrongNode,
    /// 429: the caller's address sent too many tokens the broker could not prove; nothing was
    /// asked of the API server for this one. Try again later.
    Throttled,
    /// 404: no such attempt (or its uid differs).
    UnknownAttempt,
    /// 409: the attempt is not `Prepared`, its spec hash differs, or a concurrent CAS won.
    NotPrepared,
    /// 410: a JIT was already issued for this attempt; it is lost, conclude `JitExpired`.
    AlreadyIssued,
    /// 502/503: GitHub refused or could not be reached; the attempt stays `Prepared`.
    GitHubUnavailable,
    /// 500: the journal write failed; no JIT left the broker.
    Internal,
}

impl BrokerErrorCode {
    pub fn http_status(self) -> u16 {
        match self {
            Self::Unauthenticated => 401,
            Self::WrongNode => 403,
            Self::Throttled => 429,
            Self::UnknownAttempt => 404,
            Self::NotPrepared => 409,
            Self::AlreadyIssued => 410,
            Self::GitHubUnavailable => 503,
            Self::Internal => 500,
        }
    }
}

/// An error body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerError {
    pub code: BrokerErrorCode,
    /// For people; never carries a token or a JIT.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_prints_the_jit() {
        let r = JitResponse {
            runner: RunnerRegistration {
                name: "runner-manager-x".into(),
                id: 7,
            },
            encoded_jit_config: SecretString::from("SUPERSECRETJIT"),
        };
        assert!(!format!("{r:?}").contains("SUPERSECRETJIT"));
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("SUPERSECRETJIT"), "the wire carries it once");
        let back: JitResponse = serde_json::from_str(&json).unwrap();
        assert_eq!(back.encoded_jit_config.expose_secret(), "SUPERSECRETJIT");
        assert_eq!(jit_path("team", "web-abc"), "/v1/attempts/team/web-abc/jit");
        assert_eq!(BrokerErrorCode::AlreadyIssued.http_status(), 410);
    }
}
