//! Where a self-hosted runner is registered: a repository, an organization or an enterprise.

use std::fmt;

/// Registration scope. Names are kept lower-case because GitHub compares them without case.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    Repo { owner: String, repo: String },
    Org { org: String },
    Enterprise { enterprise: String },
}

impl Scope {
    #[must_use]
    pub fn repo(owner: &str, repo: &str) -> Self {
        Self::Repo {
            owner: owner.to_ascii_lowercase(),
            repo: repo.to_ascii_lowercase(),
        }
    }

    #[must_use]
    pub fn org(org: &str) -> Self {
        Self::Org {
            org: org.to_ascii_lowercase(),
        }
    }

    #[must_use]
    pub fn enterprise(enterprise: &str) -> Self {
        Self::Enterprise {
            enterprise: enterprise.to_ascii_lowercase(),
        }
    }

    /// The URL path prefix of this scope's REST endpoints, without a leading slash.
    #[must_use]
    pub fn path(&self) -> String {
        match self {
            Self::Repo { owner, repo } => format!("repos/{owner}/{repo}"),
            Self::Org { org } => format!("orgs/{org}"),
            Self::Enterprise { enterprise } => format!("enterprises/{enterprise}"),
        }
    }

    /// The account whose runner groups this scope uses: a repository uses its owner's.
    #[must_use]
    pub fn group_owner(&self) -> Scope {
        match self {
            Self::Repo { owner, .. } => Self::org(owner),
            other => other.clone(),
        }
    }

    /// Whether a runner registered here may take a job queued in `owner/repo`.
    /// The fake has no enterprise membership model: an enterprise covers every repository.
    #[must_use]
    pub fn covers_repo(&self, owner: &str, repo: &str) -> bool {
        match self {
            Self::Repo { owner: o, repo: r } => {
                o.eq_ignore_ascii_case(owner) && r.eq_ignore_ascii_case(repo)
            }
            Self::Org { org } => org.eq_ignore_ascii_case(owner),
            Self::Enterprise { .. } => true,
        }
    }

    /// The login this scope belongs to, for matching installations and App accounts.
    #[must_use]
    pub fn account(&self) -> &str {
        match self {
            Self::Repo { owner, .. } => owner,
            Self::Org { org } => org,
            Self::Enterprise { enterprise } => enterprise,
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.path())
    }
}
