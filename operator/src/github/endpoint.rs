//! The closed list of GitHub endpoints the client calls: metric labels, rate-limit buckets and
//! the contract test all speak this vocabulary, never a raw URL.

use std::fmt;

/// One GitHub operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Endpoint {
    CreateInstallationToken,
    GetInstallation,
    ListRunners,
    GetRunner,
    DeleteRunner,
    GenerateJitConfig,
    ListRunnerDownloads,
    ListRunnerGroups,
    ListQueuedRuns,
    ListRunJobs,
    GetJob,
    /// `GET /repos/{owner}/{repo}/actions/runs/{run_id}`: a run's head repository (the job gate).
    GetRun,
    /// `GET /orgs/{org}/repos`: the repositories an organization walk reads.
    ListOrgRepos,
    /// `POST /graphql`, the enterprise's organizations (REST has no such listing).
    ListEnterpriseOrgs,
    /// `POST …/actions/runners/registration-token`: the scale-set exchange's first step.
    CreateRegistrationToken,
    RateLimit,
}

impl Endpoint {
    pub const ALL: [Self; 16] = [
        Self::CreateInstallationToken,
        Self::GetInstallation,
        Self::ListRunners,
        Self::GetRunner,
        Self::DeleteRunner,
        Self::GenerateJitConfig,
        Self::ListRunnerDownloads,
        Self::ListRunnerGroups,
        Self::ListQueuedRuns,
        Self::ListRunJobs,
        Self::GetJob,
        Self::GetRun,
        Self::ListOrgRepos,
        Self::ListEnterpriseOrgs,
        Self::CreateRegistrationToken,
        Self::RateLimit,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CreateInstallationToken => "create_installation_token",
            Self::GetInstallation => "get_installation",
            Self::ListRunners => "list_runners",
            Self::GetRunner => "get_runner",
            Self::DeleteRunner => "delete_runner",
            Self::GenerateJitConfig => "generate_jitconfig",
            Self::ListRunnerDownloads => "list_runner_downloads",
            Self::ListRunnerGroups => "list_runner_groups",
            Self::ListQueuedRuns => "list_queued_runs",
            Self::ListRunJobs => "list_run_jobs",
            Self::GetJob => "get_job",
            Self::GetRun => "get_run",
            Self::ListOrgRepos => "list_org_repos",
            Self::ListEnterpriseOrgs => "list_enterprise_orgs",
            Self::CreateRegistrationToken => "create_registration_token",
            Self::RateLimit => "rate_limit",
        }
    }

    /// The route template (the HTTP span's `http.route`): path parameters stay placeholders,
    /// so no owner, repository, id or token reaches a span. `{scope}` is
    /// `repos/{owner}/{repo}`, `orgs/{org}` or `enterprises/{enterprise}`.
    pub fn route(self) -> &'static str {
        match self {
            Self::CreateInstallationToken => "/app/installations/{installation_id}/access_tokens",
            Self::GetInstallation => "/{scope}/installation",
            Self::ListRunners => "/{scope}/actions/runners",
            Self::GetRunner | Self::DeleteRunner => "/{scope}/actions/runners/{runner_id}",
            Self::GenerateJitConfig => "/{scope}/actions/runners/generate-jitconfig",
            Self::ListRunnerDownloads => "/{scope}/actions/runners/downloads",
            Self::ListRunnerGroups => "/{scope}/actions/runner-groups",
            Self::ListQueuedRuns => "/repos/{owner}/{repo}/actions/runs",
            Self::ListRunJobs => "/repos/{owner}/{repo}/actions/runs/{run_id}/jobs",
            Self::GetJob => "/repos/{owner}/{repo}/actions/jobs/{job_id}",
            Self::GetRun => "/repos/{owner}/{repo}/actions/runs/{run_id}",
            Self::ListOrgRepos => "/orgs/{org}/repos",
            Self::ListEnterpriseOrgs => "/graphql",
            Self::CreateRegistrationToken => "/{scope}/actions/runners/registration-token",
            Self::RateLimit => "/rate_limit",
        }
    }

    /// Whether the call is authenticated with the App's JWT rather than an installation token.
    pub fn uses_app_jwt(self) -> bool {
        matches!(self, Self::CreateInstallationToken | Self::GetInstallation)
    }

    /// Whether sending it twice is harmless. A JIT mint is not: a second one registers a second
    /// runner, so an ambiguous failure is resolved by looking the name up, never by resending.
    pub fn is_idempotent(self) -> bool {
        !matches!(
            self,
            Self::GenerateJitConfig | Self::CreateInstallationToken
        )
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
