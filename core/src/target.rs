//! A policy's GitHub URL, parsed: which host, which scope, which names. Pure, shared by
//! validation (persistent workspaces need a repository) and the operator's GitHub client.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The scope of a GitHub target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum TargetScope {
    Repository,
    Organization,
    Enterprise,
}

/// A parsed GitHub target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GitHubTarget {
    /// `github.com` or a GitHub Enterprise Server host (with `:port` when given).
    pub host: String,
    pub kind: TargetKind,
}

/// Repository, organization or enterprise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetKind {
    Repository { owner: String, repo: String },
    Organization { org: String },
    Enterprise { enterprise: String },
}

/// Why a URL is not a GitHub target. Messages never echo the URL: it may carry a credential.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("must start with https:// (http and other schemes are refused)")]
    NotHttps,
    #[error(
        "carries credentials before the host (user:token@); remove them and put the token in the credentials Secret"
    )]
    CarriesCredentials,
    #[error(
        "has a query or fragment; give only https://HOST/OWNER[/REPO] or https://HOST/enterprises/NAME"
    )]
    QueryOrFragment,
    #[error("has no host")]
    NoHost,
    #[error(
        "path must be /OWNER/REPO (repository), /ORG (organization) or /enterprises/NAME (enterprise)"
    )]
    BadPath,
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 100
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s != "."
        && s != ".."
}

impl GitHubTarget {
    pub fn parse(url: &str) -> Result<Self, TargetError> {
        let rest = url.strip_prefix("https://").ok_or(TargetError::NotHttps)?;
        if rest.contains(['?', '#']) {
            return Err(TargetError::QueryOrFragment);
        }
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        if authority.contains('@') {
            return Err(TargetError::CarriesCredentials);
        }
        if authority.is_empty() {
            return Err(TargetError::NoHost);
        }
        let host = authority.to_ascii_lowercase();
        let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
        let kind = match segments.as_slice() {
            ["enterprises", name] if is_name(name) => TargetKind::Enterprise {
                enterprise: (*name).to_owned(),
            },
            [org] if is_name(org) && *org != "enterprises" => TargetKind::Organization {
                org: (*org).to_owned(),
            },
            [owner, repo] if is_name(owner) && is_name(repo) && *owner != "enterprises" => {
                TargetKind::Repository {
                    owner: (*owner).to_owned(),
                    repo: (*repo).to_owned(),
                }
            }
            _ => return Err(TargetError::BadPath),
        };
        Ok(Self { host, kind })
    }

    pub fn scope(&self) -> TargetScope {
        match self.kind {
            TargetKind::Repository { .. } => TargetScope::Repository,
            TargetKind::Organization { .. } => TargetScope::Organization,
            TargetKind::Enterprise { .. } => TargetScope::Enterprise,
        }
    }

    /// `https://api.github.com` for github.com, `https://HOST/api/v3` for Enterprise Server.
    pub fn api_base(&self) -> String {
        if self.host == "github.com" || self.host == "www.github.com" {
            "https://api.github.com".to_owned()
        } else {
            format!("https://{}/api/v3", self.host)
        }
    }

    /// The REST path prefix of the target's self-hosted runner endpoints.
    pub fn runners_path(&self) -> String {
        match &self.kind {
            TargetKind::Repository { owner, repo } => {
                format!("/repos/{owner}/{repo}/actions/runners")
            }
            TargetKind::Organization { org } => format!("/orgs/{org}/actions/runners"),
            TargetKind::Enterprise { enterprise } => {
                format!("/enterprises/{enterprise}/actions/runners")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_scopes_on_github_and_ghes() {
        let t = GitHubTarget::parse("https://github.com/acme/web").unwrap();
        assert_eq!(t.scope(), TargetScope::Repository);
        assert_eq!(t.api_base(), "https://api.github.com");
        assert_eq!(t.runners_path(), "/repos/acme/web/actions/runners");
        let t = GitHubTarget::parse("https://github.com/acme/").unwrap();
        assert_eq!(t.scope(), TargetScope::Organization);
        assert_eq!(t.runners_path(), "/orgs/acme/actions/runners");
        let t = GitHubTarget::parse("https://GHES.example.com:8443/enterprises/big").unwrap();
        assert_eq!(t.scope(), TargetScope::Enterprise);
        assert_eq!(t.api_base(), "https://ghes.example.com:8443/api/v3");
        assert_eq!(t.runners_path(), "/enterprises/big/actions/runners");
    }

    #[test]
    fn refuses_bad_urls_without_echoing_them() {
        let secret = "ghp_SECRETSECRET";
        let cases = [
            (
                format!("https://x:{secret}@github.com/acme/web"),
                TargetError::CarriesCredentials,
            ),
            (
                "http://github.com/acme/web".to_owned(),
                TargetError::NotHttps,
            ),
            ("https://github.com/a/b/c".to_owned(), TargetError::BadPath),
            ("https://github.com/".to_owned(), TargetError::BadPath),
            (
                "https://github.com/enterprises".to_owned(),
                TargetError::BadPath,
            ),
            (
                "https://github.com/a/b?x=1".to_owned(),
                TargetError::QueryOrFragment,
            ),
            ("https:///a/b".to_owned(), TargetError::NoHost),
            ("https://github.com/a/..".to_owned(), TargetError::BadPath),
        ];
        for (url, want) in cases {
            let err = GitHubTarget::parse(&url).unwrap_err();
            assert_eq!(err, want, "{url}");
            assert!(!err.to_string().contains(secret));
        }
    }
}
