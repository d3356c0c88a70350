//! Errors from GitHub, classified: terminal (a person must fix something; never retried) or
//! retryable (5xx, timeouts, 429, a rate-limit 403). Messages name the fix and never carry a
//! token, a key or a JIT.

use std::time::Duration;

use super::endpoint::Endpoint;

/// Why a terminal error is terminal, with the fix a person can apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Terminal {
    /// 401: the credentials were refused.
    BadCredentials,
    /// 403: the App (or token) lacks a permission.
    MissingPermission,
    /// 403/404 from a runner-group operation: the group does not exist or the target may not use it.
    RunnerGroupUnusable,
    /// 404: the target does not exist, or the App is not installed on it.
    NotFound,
    /// 409: a runner with this name exists (a JIT mint).
    NameTaken,
    /// 422: GitHub refused the request as invalid.
    Unprocessable,
    /// Any other 4xx.
    Refused,
}

impl Terminal {
    /// What a person should do.
    pub fn remediation(self) -> &'static str {
        match self {
            Self::BadCredentials => {
                "GitHub refused the credentials: check the Secret's appId and privateKey (or token) and that the App is not suspended"
            }
            Self::MissingPermission => {
                "GitHub refused for lack of permission: grant the App 'Administration: read & write' (repository targets) or 'Self-hosted runners: read & write' (organization and enterprise targets), and accept the new permissions on the installation; a token needs the repo / admin:org / manage_runners:enterprise scope"
            }
            Self::RunnerGroupUnusable => {
                "the runner group does not exist or this target may not use it: check spec.github.runnerGroup and the group's repository access"
            }
            Self::NotFound => {
                "GitHub answered 404: check spec.github.url, and that the App is installed on that repository, organization or enterprise"
            }
            Self::NameTaken => "a runner with this name is already registered",
            Self::Unprocessable => "GitHub refused the request as invalid (422)",
            Self::Refused => "GitHub refused the request",
        }
    }
}

/// A failed GitHub call.
#[derive(Debug, thiserror::Error)]
pub enum GitHubError {
    #[error("{endpoint}: {} (HTTP {status})", reason.remediation())]
    Terminal {
        endpoint: Endpoint,
        status: u16,
        reason: Terminal,
    },
    #[error(
        "{endpoint}: GitHub is unavailable or rate limited (HTTP {status}); retry after {retry_after:?}"
    )]
    Retryable {
        endpoint: Endpoint,
        status: u16,
        retry_after: Option<Duration>,
    },
    #[error("{endpoint}: {kind}")]
    Transport {
        endpoint: Endpoint,
        kind: TransportKind,
    },
    #[error("{endpoint}: the response did not have the documented shape")]
    Malformed { endpoint: Endpoint },
    /// GitHub answered with a success status but its body never arrived whole: the request
    /// took effect and what it returned is lost.
    #[error("{endpoint}: GitHub answered {status} but the body was lost")]
    BodyLost { endpoint: Endpoint, status: u16 },
    #[error("credentials: {0}")]
    Credentials(#[from] super::auth::CredentialsError),
    /// The answer's body was longer than the operator reads (`--github-max-response-bytes`).
    #[error(
        "{endpoint}: GitHub's answer (HTTP {status}) was longer than {limit} bytes and was refused; raise --github-max-response-bytes if this host is trusted"
    )]
    TooLarge {
        endpoint: Endpoint,
        status: u16,
        limit: u64,
    },
    /// The request was given up between tries: what it was for is gone (a mint for an attempt
    /// concluded, terminated or deleted meanwhile).
    #[error("{endpoint}: given up between tries: what it was for is gone")]
    NoLongerWanted { endpoint: Endpoint },
    /// The API base is plain http and its host is not on `--allow-http-hosts`.
    #[error(
        "{endpoint}: the GitHub API URL is http, which is refused unless the admin allows http for its host (--allow-http-hosts)"
    )]
    InsecureUrl { endpoint: Endpoint },
}

/// A failure before an HTTP status: closed, so no URL or header leaks into a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransportKind {
    #[error("timed out")]
    Timeout,
    #[error("could not connect")]
    Connect,
    #[error("the connection broke")]
    Broken,
}

impl GitHubError {
    /// Whether trying again later can succeed without a person.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Retryable { .. } | Self::Transport { .. } | Self::BodyLost { .. }
        )
    }

    /// The HTTP status, when there was one.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Terminal { status, .. }
            | Self::Retryable { status, .. }
            | Self::BodyLost { status, .. }
            | Self::TooLarge { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Classify a non-success answer. `message` is GitHub's `message` field (read, never echoed).
pub fn classify(
    endpoint: Endpoint,
    status: u16,
    message: &str,
    retry_after: Option<Duration>,
) -> GitHubError {
    let lower = message.to_ascii_lowercase();
    let rate_limited = lower.contains("rate limit");
    let terminal = |reason| GitHubError::Terminal {
        endpoint,
        status,
        reason,
    };
    match status {
        429 => GitHubError::Retryable {
            endpoint,
            status,
            retry_after,
        },
        // A 403 is never retried unless GitHub says it is a rate limit (primary or secondary).
        403 if rate_limited || retry_after.is_some() => GitHubError::Retryable {
            endpoint,
            status,
            retry_after,
        },
        403 if lower.contains("runner group") => terminal(Terminal::RunnerGroupUnusable),
        403 => terminal(Terminal::MissingPermission),
        401 => terminal(Terminal::BadCredentials),
        404 if lower.contains("runner group") => terminal(Terminal::RunnerGroupUnusable),
        404 => terminal(Terminal::NotFound),
        409 => terminal(Terminal::NameTaken),
        422 => terminal(Terminal::Unprocessable),
        500..=599 => GitHubError::Retryable {
            endpoint,
            status,
            retry_after,
        },
        _ => terminal(Terminal::Refused),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        let e = Endpoint::ListRunners;
        assert!(classify(e, 500, "", None).is_retryable());
        assert!(classify(e, 502, "", None).is_retryable());
        assert!(classify(e, 429, "", Some(Duration::from_secs(3))).is_retryable());
        assert!(classify(e, 403, "API rate limit exceeded for installation", None).is_retryable());
        assert!(classify(e, 403, "You have exceeded a secondary rate limit", None).is_retryable());
        assert!(!classify(e, 403, "Resource not accessible by integration", None).is_retryable());
        assert!(matches!(
            classify(e, 403, "Resource not accessible by integration", None),
            GitHubError::Terminal {
                reason: Terminal::MissingPermission,
                ..
            }
        ));
        assert!(matches!(
            classify(
                Endpoint::GenerateJitConfig,
                404,
                "No runner group found",
                None
            ),
            GitHubError::Terminal {
                reason: Terminal::RunnerGroupUnusable,
                ..
            }
        ));
        assert!(matches!(
            classify(e, 404, "Not Found", None),
            GitHubError::Terminal {
                reason: Terminal::NotFound,
                ..
            }
        ));
        assert!(!classify(e, 422, "Validation Failed", None).is_retryable());
        assert!(!classify(e, 401, "Bad credentials", None).is_retryable());
    }

    #[test]
    fn messages_name_the_fix_and_not_the_input() {
        let e = classify(
            Endpoint::GenerateJitConfig,
            403,
            "secret-ish text ghs_abc",
            None,
        );
        let shown = e.to_string();
        assert!(shown.contains("Administration"), "{shown}");
        assert!(!shown.contains("ghs_abc"));
    }
}
