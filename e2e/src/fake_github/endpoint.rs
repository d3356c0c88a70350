//! The closed vocabulary of endpoints the fake answers; faults, counters and rate-limit buckets
//! are keyed by it, and it is what reaches logs.

use axum::http::Method;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    ListRunners,
    GetRunner,
    DeleteRunner,
    GenerateJitconfig,
    RegistrationToken,
    RunnerDownloads,
    RunnerGroups,
    ListRuns,
    ListRunJobs,
    GetJob,
    GetRun,
    ListOrgRepos,
    Graphql,
    ScaleSetRegistration,
    ScaleSets,
    ScaleSetSessions,
    ScaleSetMessages,
    ScaleSetAcquire,
    ScaleSetJit,
    Installation,
    AccessTokens,
    RateLimit,
    ReleasesLatest,
    DownloadPackage,
    RunnerSession,
    RunnerPoll,
    RunnerComplete,
}

/// A GitHub rate-limit bucket (`x-ratelimit-resource`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resource {
    Core,
    ActionsRunnerRegistration,
    Graphql,
}

impl Resource {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Core => "core",
            Self::ActionsRunnerRegistration => "actions_runner_registration",
            Self::Graphql => "graphql",
        }
    }
}

impl Endpoint {
    /// Which bucket a call draws from; `None` for calls GitHub does not charge (`/rate_limit`)
    /// and for the runner's own protocol and downloads, which are not REST API calls.
    #[must_use]
    pub fn resource(self) -> Option<Resource> {
        match self {
            Self::GenerateJitconfig | Self::RegistrationToken => {
                Some(Resource::ActionsRunnerRegistration)
            }
            Self::Graphql => Some(Resource::Graphql),
            Self::ScaleSetRegistration
            | Self::ScaleSets
            | Self::ScaleSetSessions
            | Self::ScaleSetMessages
            | Self::ScaleSetAcquire
            | Self::ScaleSetJit => None,
            Self::RateLimit
            | Self::DownloadPackage
            | Self::RunnerSession
            | Self::RunnerPoll
            | Self::RunnerComplete => None,
            _ => Some(Resource::Core),
        }
    }

    /// Classifies a matched route template (axum's `MatchedPath`) and method.
    #[must_use]
    pub fn classify(method: &Method, template: &str) -> Option<Self> {
        let runner_scope = template.starts_with("/repos/{owner}/{repo}/actions/runners")
            || template.starts_with("/orgs/{org}/actions/runners")
            || template.starts_with("/enterprises/{enterprise}/actions/runners");
        if runner_scope {
            return Some(if template.ends_with("/generate-jitconfig") {
                Self::GenerateJitconfig
            } else if template.ends_with("/registration-token") {
                Self::RegistrationToken
            } else if template.ends_with("/downloads") {
                Self::RunnerDownloads
            } else if template.ends_with("{runner_id}") {
                if method == Method::DELETE {
                    Self::DeleteRunner
                } else {
                    Self::GetRunner
                }
            } else {
                Self::ListRunners
            });
        }
        let found = match template {
            "/orgs/{org}/actions/runner-groups"
            | "/enterprises/{enterprise}/actions/runner-groups" => Self::RunnerGroups,
            "/repos/{owner}/{repo}/actions/runs" => Self::ListRuns,
            "/repos/{owner}/{repo}/actions/runs/{run_id}/jobs" => Self::ListRunJobs,
            "/repos/{owner}/{repo}/actions/jobs/{job_id}" => Self::GetJob,
            "/repos/{owner}/{repo}/actions/runs/{run_id}" => Self::GetRun,
            "/orgs/{org}/repos" => Self::ListOrgRepos,
            "/actions/runner-registration" => Self::ScaleSetRegistration,
            "/_actions/_apis/runtime/runnerscalesets"
            | "/_actions/_apis/runtime/runnerscalesets/{id}" => Self::ScaleSets,
            "/_actions/_apis/runtime/runnerscalesets/{id}/sessions"
            | "/_actions/_apis/runtime/runnerscalesets/{id}/sessions/{session}" => {
                Self::ScaleSetSessions
            }
            "/_actions/_apis/runtime/runnerscalesets/{id}/acquirejobs"
            | "/_actions/_apis/runtime/runnerscalesets/{id}/acquirablejobs" => {
                Self::ScaleSetAcquire
            }
            "/_actions/_apis/runtime/runnerscalesets/{id}/generatejitconfig" => Self::ScaleSetJit,
            "/_actions/message-queues/{session}"
            | "/_actions/message-queues/{session}/{message}" => Self::ScaleSetMessages,
            "/graphql" => Self::Graphql,
            "/repos/{owner}/{repo}/installation" | "/orgs/{org}/installation" => Self::Installation,
            "/app/installations/{installation_id}/access_tokens" => Self::AccessTokens,
            "/rate_limit" => Self::RateLimit,
            "/repos/{owner}/{repo}/releases/latest" => Self::ReleasesLatest,
            "/_downloads/{file}" => Self::DownloadPackage,
            "/_runner/sessions" | "/_runner/sessions/{session}" => Self::RunnerSession,
            "/_runner/jobs/next" => Self::RunnerPoll,
            "/_runner/jobs/{job_id}/complete" => Self::RunnerComplete,
            _ => return None,
        };
        Some(found)
    }
}
