//! The shapes the client reads, from GitHub's official description (only the fields we use;
//! unknown fields are ignored so GitHub can add to them).

use secrecy::SecretString;
use serde::Deserialize;

/// A self-hosted runner.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Runner {
    pub id: i64,
    pub name: String,
    /// `online` or `offline`.
    pub status: String,
    pub busy: bool,
    #[serde(default)]
    pub labels: Vec<RunnerLabel>,
}

impl Runner {
    pub fn has_label(&self, name: &str) -> bool {
        self.labels
            .iter()
            .any(|l| l.name.eq_ignore_ascii_case(name))
    }
}

/// A runner label.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct RunnerLabel {
    pub name: String,
}

/// `GET …/actions/runners`.
#[derive(Debug, Deserialize)]
pub struct RunnerPage {
    pub total_count: i64,
    pub runners: Vec<Runner>,
}

/// A runner group.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct RunnerGroup {
    pub id: i64,
    pub name: String,
}

/// `GET …/actions/runner-groups`.
#[derive(Debug, Deserialize)]
pub struct RunnerGroupPage {
    pub total_count: i64,
    pub runner_groups: Vec<RunnerGroup>,
}

/// A minted JIT: the registration and the one-shot config.
pub struct JitConfig {
    pub runner: Runner,
    pub encoded_jit_config: SecretString,
}

impl std::fmt::Debug for JitConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JitConfig")
            .field("runner", &self.runner)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
pub(crate) struct JitConfigWire {
    pub runner: Runner,
    pub encoded_jit_config: SecretString,
}

/// A runner package GitHub lists for download.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct RunnerDownload {
    pub os: String,
    pub architecture: String,
    pub download_url: String,
    pub filename: String,
    #[serde(default)]
    pub sha256_checksum: Option<String>,
}

/// An installation.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Installation {
    pub id: u64,
}

#[derive(Deserialize)]
pub(crate) struct InstallationTokenWire {
    pub token: SecretString,
    pub expires_at: String,
}

/// A workflow run.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct WorkflowRun {
    pub id: i64,
    pub status: Option<String>,
    /// ISO 8601, e.g. `2026-11-30T17:00:00Z`.
    #[serde(default)]
    pub created_at: Option<String>,
}

impl WorkflowRun {
    /// Whether the run was created less than `settle` before `now` (an unreadable time: no).
    /// Pure.
    pub fn is_younger_than(
        &self,
        now: k8s_openapi::jiff::Timestamp,
        settle: std::time::Duration,
    ) -> bool {
        let Some(created) = self
            .created_at
            .as_deref()
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        else {
            return false;
        };
        let age_ms = now
            .as_millisecond()
            .saturating_sub(created.as_millisecond());
        age_ms < i64::try_from(settle.as_millis()).unwrap_or(i64::MAX)
    }
}

/// A run's origin, as `GET …/actions/runs/{run_id}` gives it (the job gate).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct RunOrigin {
    pub repository: RepositoryName,
    /// `null` when the head's repository is gone (a deleted fork).
    #[serde(default)]
    pub head_repository: Option<RepositoryName>,
    /// What triggered the run (`push`, `pull_request`, …).
    #[serde(default)]
    pub event: String,
    #[serde(default)]
    pub head_branch: Option<String>,
}

/// A repository's `full_name`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct RepositoryName {
    pub full_name: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct WorkflowRunPage {
    pub workflow_runs: Vec<WorkflowRun>,
}

/// A workflow job.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Job {
    pub id: i64,
    pub run_id: i64,
    pub status: String,
    #[serde(default)]
    pub conclusion: Option<String>,
    #[serde(default)]
    pub labels: Vec<String>,
    #[serde(default)]
    pub runner_name: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct JobPage {
    pub jobs: Vec<Job>,
}

/// A repository, as an organization's listing gives it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Repository {
    /// `owner/name`.
    pub full_name: String,
    #[serde(default)]
    pub archived: bool,
}

/// The GraphQL answer to the enterprise-organizations query.
#[derive(Debug, Deserialize)]
pub(crate) struct EnterpriseOrgsAnswer {
    pub data: Option<EnterpriseOrgsData>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct EnterpriseOrgsData {
    pub enterprise: Option<EnterpriseOrgsEnterprise>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct EnterpriseOrgsEnterprise {
    pub organizations: EnterpriseOrgsConnection,
}

#[derive(Debug, Deserialize)]
pub(crate) struct EnterpriseOrgsConnection {
    pub nodes: Vec<OrgLogin>,
    #[serde(rename = "pageInfo")]
    pub page_info: PageInfo,
}

#[derive(Debug, Deserialize)]
pub(crate) struct OrgLogin {
    pub login: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct PageInfo {
    #[serde(rename = "hasNextPage")]
    pub has_next_page: bool,
    #[serde(rename = "endCursor")]
    pub end_cursor: Option<String>,
}
