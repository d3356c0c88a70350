//! Workflow jobs queued through the admin API, and their lifecycle.

use serde::{Deserialize, Serialize};

use crate::standin_runner::behaviour::JobBehaviour;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    Queued,
    InProgress,
    Completed,
}

impl JobStatus {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::InProgress => "in_progress",
            Self::Completed => "completed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Conclusion {
    Success,
    Failure,
    Cancelled,
}

impl Conclusion {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Failure => "failure",
            Self::Cancelled => "cancelled",
        }
    }
}

/// The runner a job was assigned to, kept after the runner itself is gone.
#[derive(Debug, Clone)]
pub struct AssignedRunner {
    pub id: u64,
    pub name: String,
    pub group_id: u64,
    pub group_name: String,
}

#[derive(Debug, Clone)]
pub struct Job {
    pub id: u64,
    pub run_id: u64,
    pub owner: String,
    pub repo: String,
    pub name: String,
    pub workflow_name: String,
    pub head_sha: String,
    pub labels: Vec<String>,
    pub status: JobStatus,
    pub conclusion: Option<Conclusion>,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub runner: Option<AssignedRunner>,
    pub behaviour: JobBehaviour,
    /// The run's origin: `None` for a push to the repository itself.
    pub pull_request: Option<PullRequestOrigin>,
}

/// A run of a pull request, and where its head lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PullRequestOrigin {
    /// `OWNER/REPO` of the head: the repository itself, a fork, or `None` (a deleted fork,
    /// which GitHub shows as a `null` head repository).
    pub head_repository: Option<String>,
}

/// What the stand-in runner receives when it acquires a job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AcquiredJob {
    pub job_id: u64,
    pub run_id: u64,
    pub name: String,
    pub repository: String,
    pub behaviour: JobBehaviour,
}
