//! Registered self-hosted runners as the fake keeps them.

use secrecy::SecretString;

use super::scope::Scope;

/// Connection state reported in the `status` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunnerStatus {
    Online,
    Offline,
}

impl RunnerStatus {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Online => "online",
            Self::Offline => "offline",
        }
    }
}

/// One registration. Every runner the fake creates is a JIT (ephemeral) runner.
#[derive(Debug)]
pub struct Runner {
    pub id: u64,
    pub name: String,
    pub scope: Scope,
    pub group_id: u64,
    pub group_name: String,
    pub labels: Vec<String>,
    pub work_folder: String,
    /// Set once the runner has opened a session: its software version.
    pub version: Option<String>,
    /// The runner's OAuth client id from its `.credentials`.
    pub client_id: String,
    /// The secret the runner proves itself with (carried in `.credentials_rsaparams`).
    pub client_secret: SecretString,
    /// A JIT configuration is good for one session, ever.
    pub jit_used: bool,
    /// Hash of the current session token, while the listener is connected.
    pub session: Option<String>,
    /// The job it holds, while busy.
    pub job: Option<u64>,
}

impl Runner {
    #[must_use]
    pub fn busy(&self) -> bool {
        self.job.is_some()
    }

    #[must_use]
    pub fn status(&self) -> RunnerStatus {
        if self.session.is_some() {
            RunnerStatus::Online
        } else {
            RunnerStatus::Offline
        }
    }

    /// GitHub reports `unknown` until the runner has connected once.
    #[must_use]
    pub fn os(&self) -> &'static str {
        if self.version.is_some() {
            "Linux"
        } else {
            "unknown"
        }
    }

    /// Whether this runner's labels cover every label a job asks for (case-insensitive).
    #[must_use]
    pub fn covers_labels(&self, wanted: &[String]) -> bool {
        wanted
            .iter()
            .all(|w| self.labels.iter().any(|l| l.eq_ignore_ascii_case(w)))
    }
}

/// A runner group of an organization or enterprise.
#[derive(Debug, Clone)]
pub struct RunnerGroup {
    pub id: u64,
    pub name: String,
    pub default: bool,
    /// A group that exists but this caller may not register runners to (GitHub answers 403).
    pub usable: bool,
}
