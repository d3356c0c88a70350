//! Dependency caches on the node (`spec.caches`, issue 31 item 2): the policy's field, what an
//! attempt carries of it, the tool table (which variables point a tool at its cache) and the
//! trust tier's vocabulary. The decisions live beside what they read: which jobs may write back
//! in [`crate::job_admission::write_back`] (GitHub's facts of the run), the namespace in
//! [`crate::validate::cache_namespace`] (the parsed target).
//!
//! A runner reads its namespace's newest generation through an overlay; what the job writes goes
//! to a private upper layer. Only a job whose run GitHub shows to be of the repository itself,
//! with an event and head branch the policy trusts, has its writes committed as the next
//! generation; everything else is discarded with the runner. The verdict is the broker's, from
//! GitHub's record of the run (the same read the fork gate makes), never the job's.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `spec.caches`: dependency caches kept on each node, shared by the policy's runners.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheSpec {
    /// Whose cache the runners share: `Repository` (the default: the target repository's own;
    /// repository targets only), `Organization` (every repository of the organization) or
    /// `Shared` (the one named in `sharedName`, across this namespace's policies that name it).
    /// Namespaces never cross Kubernetes namespaces or GitHub hosts.
    #[serde(default)]
    pub scope: CacheScope,
    /// With `scope: Shared`: the shared cache's name (1-63 of `a-z`, `0-9`, `-`, `_`, `.`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_name: Option<String>,
    /// The tools whose caches are kept (their variables point into the cache); empty: the
    /// default set (every tool but poetry, cargo, gradle, maven, pub, bundler and git). A tool
    /// any of whose variables `runner.env` sets is left alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<CacheTool>,
    /// Which jobs' writes are kept for the next job; every other job reads the cache but writes
    /// to a private copy that is discarded.
    #[serde(default)]
    pub write_back: CacheWriteBack,
}

/// Whose cache a policy's runners share.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum CacheScope {
    /// The target repository's own cache.
    #[default]
    Repository,
    /// One cache for every repository of the target organization.
    Organization,
    /// The cache named by `sharedName`.
    Shared,
}

/// The trust tier: which jobs' cache writes are kept. A job must always be of a run whose head
/// is the repository itself (never a fork's pull request), and never `pull_request_target` (a
/// base-branch workflow that commonly checks out a fork's code).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheWriteBack {
    /// Head branches whose jobs may write back (`main`, `release/*`; `*` matches any run of
    /// characters); empty: every branch of the repository.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1, max = 255)))]
    pub branches: Vec<String>,
    /// Events whose jobs may write back (`push`, `schedule`, `workflow_dispatch`, …); empty:
    /// every event but `pull_request_target` and `workflow_run` (which runs after a fork's run,
    /// often on its artifacts). `pull_request_target` never writes back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1, max = 64)))]
    pub events: Vec<String>,
}

/// What an attempt carries of `spec.caches`: resolved by the operator, frozen for the attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheSnapshot {
    /// The cache namespace's path under the node's cache root: `<Kubernetes namespace>/<GitHub
    /// host>/<owner>/<repo>`, `…/_org/<org>` or `…/_shared/<name>`, lower-case.
    pub namespace: String,
    /// The tools, resolved (the default set when the policy named none).
    pub tools: Vec<CacheTool>,
    /// Which jobs may write back.
    #[serde(default)]
    pub write_back: CacheWriteBack,
}

/// A tool whose cache is kept. Closed: it names a directory of the cache and reaches the docs.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum CacheTool {
    Xdg,
    ToolCache,
    Npm,
    Pnpm,
    Yarn,
    Bun,
    Deno,
    NodeGyp,
    Electron,
    ElectronBuilder,
    Playwright,
    Cypress,
    Nuget,
    Pip,
    Uv,
    Go,
    Composer,
    Cocoapods,
    Ccache,
    Poetry,
    Cargo,
    Gradle,
    Maven,
    Pub,
    Bundler,
    Git,
}

impl CacheTool {
    pub const ALL: [Self; 26] = [
        Self::Xdg,
        Self::ToolCache,
        Self::Npm,
        Self::Pnpm,
        Self::Yarn,
        Self::Bun,
        Self::Deno,
        Self::NodeGyp,
        Self::Electron,
        Self::ElectronBuilder,
        Self::Playwright,
        Self::Cypress,
        Self::Nuget,
        Self::Pip,
        Self::Uv,
        Self::Go,
        Self::Composer,
        Self::Cocoapods,
        Self::Ccache,
        Self::Poetry,
        Self::Cargo,
        Self::Gradle,
        Self::Maven,
        Self::Pub,
        Self::Bundler,
        Self::Git,
    ];

    /// The variables that point the tool at its cache, each with its directory under the cache
    /// mount.
    pub fn variables(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Self::Xdg => &[("XDG_CACHE_HOME", "xdg")],
            Self::ToolCache => &[
                ("RUNNER_TOOL_CACHE", "tool-cache"),
                ("AGENT_TOOLSDIRECTORY", "tool-cache"),
            ],
            Self::Npm => &[("npm_config_cache", "npm")],
            Self::Pnpm => &[("npm_config_store_dir", "pnpm-store")],
            Self::Yarn => &[("YARN_CACHE_FOLDER", "yarn")],
            Self::Bun => &[("BUN_INSTALL_CACHE_DIR", "bun")],
            Self::Deno => &[("DENO_DIR", "deno")],
            Self::NodeGyp => &[("npm_config_devdir", "node-gyp")],
            Self::Electron => &[("electron_config_cache", "electron")],
            Self::ElectronBuilder => &[("ELECTRON_BUILDER_CACHE", "electron-builder")],
            Self::Playwright => &[("PLAYWRIGHT_BROWSERS_PATH", "playwright")],
            Self::Cypress => &[("CYPRESS_CACHE_FOLDER", "cypress")],
            Self::Nuget => &[("NUGET_PACKAGES", "nuget")],
            Self::Pip => &[("PIP_CACHE_DIR", "pip")],
            Self::Uv => &[("UV_CACHE_DIR", "uv")],
            Self::Go => &[("GOMODCACHE", "go/mod"), ("GOCACHE", "go/build")],
            Self::Composer => &[("COMPOSER_CACHE_DIR", "composer")],
            Self::Cocoapods => &[("CP_HOME_DIR", "cocoapods")],
            Self::Ccache => &[("CCACHE_DIR", "ccache")],
            Self::Poetry => &[("POETRY_CACHE_DIR", "poetry")],
            Self::Cargo => &[("CARGO_HOME", "cargo")],
            Self::Gradle => &[("GRADLE_USER_HOME", "gradle")],
            Self::Maven => &[("MAVEN_OPTS", "maven")],
            Self::Pub => &[("PUB_CACHE", "pub")],
            Self::Bundler => &[("BUNDLE_USER_CACHE", "bundler")],
            Self::Git => &[("RUNNER_MANAGER_GIT_CACHE_DIR", "git")],
        }
    }

    /// Whether the tool is kept when the policy names no tools. Off: tools whose "cache" is a
    /// home holding configuration or credentials (cargo, gradle), or whose layout is a
    /// per-project install (poetry, maven, pub, bundler), and the git mirror (large, opt-in).
    pub fn on_by_default(self) -> bool {
        !matches!(
            self,
            Self::Poetry
                | Self::Cargo
                | Self::Gradle
                | Self::Maven
                | Self::Pub
                | Self::Bundler
                | Self::Git
        )
    }

    /// The default set.
    pub fn defaults() -> Vec<Self> {
        Self::ALL
            .into_iter()
            .filter(|t| t.on_by_default())
            .collect()
    }
}

/// The environment pointing `tools` at the cache mounted at `mount`, leaving alone every tool any
/// of whose variables `theirs` (the policy's `runner.env`) sets. Pure.
pub fn cache_environment(
    tools: &[CacheTool],
    mount: &std::path::Path,
    theirs: &std::collections::BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for tool in tools {
        let vars = tool.variables();
        if vars.iter().any(|(v, _)| theirs.contains_key(*v)) {
            continue;
        }
        for (var, dir) in vars {
            let path = mount.join(dir).display().to_string();
            let value = if *tool == CacheTool::Maven {
                format!("-Dmaven.repo.local={path}")
            } else {
                path
            };
            out.push(((*var).to_owned(), value));
        }
    }
    out
}

/// Why `spec.caches` cannot be resolved for a target.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CacheSpecError {
    #[error(
        "Repository needs a repository target (a runner of an organization or enterprise policy learns its repository only when its job starts, after its cache is mounted); use scope: Organization or Shared"
    )]
    RepositoryScopeNeedsRepository,
    #[error(
        "Organization needs a repository or organization target (an enterprise's runners may take a job of any of its organizations); use scope: Shared"
    )]
    OrganizationScopeNeedsOrganization,
    #[error("Shared needs spec.caches.sharedName (1-63 of a-z, 0-9, '-', '_', '.')")]
    SharedNameMissing,
    #[error("is only read with scope: Shared; remove it or set scope: Shared")]
    SharedNameUnused,
    #[error("must be 1-63 of a-z, 0-9, '-', '_', '.' and not '.' or '..'")]
    BadSharedName,
}

/// Whether `s` is a safe single path component of a cache namespace: what GitHub allows in an
/// owner or repository name (lower-cased), a DNS-label namespace, a host with its port's `:`
/// replaced. Never `.` or `..`, nothing overlay options cannot carry.
pub fn is_namespace_component(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 100
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
}

/// Whether `namespace` is a well-formed namespace path (four safe components): the agent checks
/// it before it names a directory.
pub fn is_namespace_path(namespace: &str) -> bool {
    let parts: Vec<&str> = namespace.split('/').collect();
    parts.len() == 4 && parts.iter().all(|p| is_namespace_component(p))
}

/// Why a job's cache writes are discarded. Closed: it reaches the job's log and the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Discarded {
    /// GitHub does not show this runner on the claimed run.
    NotAssigned,
    /// The run's head is a fork (or a deleted one).
    ForkPullRequest,
    /// The run's event is not one the policy trusts.
    Event,
    /// The run's head branch is not one the policy trusts.
    Branch,
    /// GitHub could not be asked.
    Unconfirmed,
}

impl Discarded {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotAssigned => "NotAssigned",
            Self::ForkPullRequest => "ForkPullRequest",
            Self::Event => "Event",
            Self::Branch => "Branch",
            Self::Unconfirmed => "Unconfirmed",
        }
    }
}

/// The event that is never trusted to write back: it runs with the base repository's secrets
/// and is the usual way a fork's code reaches a privileged job ("pwn request").
pub const NEVER_TRUSTED_EVENT: &str = "pull_request_target";

/// Events not trusted unless `writeBack.events` names them: a `workflow_run` runs the base
/// repository's workflow after another run, commonly on artifacts a fork's pull request uploaded
/// (artifact poisoning); a policy that vets its `workflow_run` workflows lists it.
pub const UNTRUSTED_BY_DEFAULT: [&str; 2] = [NEVER_TRUSTED_EVENT, "workflow_run"];

/// `pattern` with `*` matching any run of characters (slashes too) against `text`, whole. One
/// metacharacter and no classes or escapes: a branch rule needs no more, and a glob crate's path
/// semantics (`*` stopping at `/`) would surprise here.
pub fn wildcard(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::path::Path;

    #[test]
    fn wildcards_match_whole_names() {
        assert!(wildcard("main", "main"));
        assert!(!wildcard("main", "main2"));
        assert!(wildcard("release/*", "release/1.2/x"));
        assert!(!wildcard("release/*", "releases/1"));
        assert!(wildcard("*", ""));
        assert!(wildcard("a*b*c", "aXXbYc"));
        assert!(!wildcard("a*b*c", "aXXbY"));
    }

    #[test]
    fn namespace_paths_are_four_safe_components() {
        for ns in [
            "team-a/github.com/acme/web",
            "t/github.com/_org/acme",
            "t/github.com/_shared/builds",
        ] {
            assert!(is_namespace_path(ns), "{ns}");
        }
        for bad in ["a/b/c", "a/b/c/d/e", "a/../c/d", "a/b/C/d", "a/b/c,d/e"] {
            assert!(!is_namespace_path(bad), "{bad}");
        }
    }

    #[test]
    fn runner_env_wins_over_a_whole_tool() {
        let theirs: BTreeMap<String, String> = [("GOCACHE".to_owned(), "/x".to_owned())].into();
        let env = cache_environment(
            &[CacheTool::Go, CacheTool::Npm, CacheTool::Maven],
            Path::new("/c"),
            &theirs,
        );
        assert_eq!(
            env,
            vec![
                ("npm_config_cache".to_owned(), "/c/npm".to_owned()),
                (
                    "MAVEN_OPTS".to_owned(),
                    "-Dmaven.repo.local=/c/maven".to_owned()
                ),
            ],
            "go is left alone whole: GOMODCACHE is not set either"
        );
        assert!(CacheTool::defaults().contains(&CacheTool::Npm));
        assert!(!CacheTool::defaults().contains(&CacheTool::Cargo));
    }
}
