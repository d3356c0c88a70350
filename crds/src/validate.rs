//! Semantic validation of a ScalePolicy: what the CRD schema cannot say. Returns every problem at
//! once, each with the field path and how to fix it, so one `kubectl describe` shows them all.
//! Messages never echo a value that may be secret (the URL) or chosen by a workflow.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// An attempt's validated view (`validate::attempt`): a child of this module that needs its
/// `Problem`, so nothing here names it (the module-cycle check).
pub mod attempt;

use crate::attempt::TargetScope;
use crate::policy::{ExecutionMode, MAX_RUNNERS_CEILING, ScalePolicySpec, WorkspaceMode};
use runner_manager_core::target::GitHubTarget;

/// One problem: where, and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The field path, e.g. `spec.workspace.mode`.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// The label prefix a kubelet may not set on its own Node (NodeRestriction admission): the only
/// keys a policy's `nodeSelector` may route by.
pub const RESTRICTED_NODE_LABEL_PREFIX: &str = "node-restriction.kubernetes.io/";

/// Labels the cluster reserves: the ownership label (`rm-<12 hex>`) is added by the broker.
const RESERVED_LABEL_PREFIX: &str = "rm-";

/// A policy that passed [`validate_policy`], with what validation parsed (stackable's
/// dereference → validate → build): its identity and its GitHub target. Built once per
/// generation, at resolution; nothing after it parses the URL again, and a stage that holds one
/// cannot meet a policy without a target.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidatedPolicy {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub generation: i64,
    pub target: GitHubTarget,
    /// The spec this view was validated from.
    pub spec: crate::policy::ScalePolicySpec,
}

/// The policy's validated view, or every problem of it.
pub fn validated(policy: &crate::policy::ScalePolicy) -> Result<ValidatedPolicy, Vec<Problem>> {
    let mut problems = validate_policy(&policy.spec);
    let meta = &policy.metadata;
    for (field, value) in [
        ("metadata.namespace", &meta.namespace),
        ("metadata.name", &meta.name),
        ("metadata.uid", &meta.uid),
    ] {
        if value.as_deref().is_none_or(str::is_empty) {
            problems.push(Problem {
                field: field.to_owned(),
                message: "missing: a policy read from the API server always has one".to_owned(),
            });
        }
    }
    let target = GitHubTarget::parse(&policy.spec.github.url);
    match target {
        Ok(target) if problems.is_empty() => Ok(ValidatedPolicy {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            generation: meta.generation.unwrap_or(0),
            target,
            spec: policy.spec.clone(),
        }),
        // validate_policy reported a URL that does not parse.
        _ => Err(problems),
    }
}

/// Every problem of a policy spec; empty when it is valid.
pub fn validate_policy(spec: &ScalePolicySpec) -> Vec<Problem> {
    let mut out = Vec::new();
    let mut problem = |field: &str, message: String| {
        out.push(Problem {
            field: field.to_owned(),
            message,
        })
    };

    let target = match GitHubTarget::parse(&spec.github.url) {
        Ok(t) => Some(t),
        Err(e) => {
            problem("spec.github.url", format!("the URL {e}"));
            None
        }
    };

    if spec.github.credentials_secret_ref.name.is_empty() {
        problem(
            "spec.github.credentialsSecretRef.name",
            "name the Secret holding the GitHub App (appId, privateKey) or token".into(),
        );
    }
    match &spec.github.runner_group {
        Some(IntOrString::Int(id)) if *id < 1 => problem(
            "spec.github.runnerGroup",
            "a runner group id is a positive integer; or give the group's name".into(),
        ),
        Some(IntOrString::String(name)) if name.trim().is_empty() => problem(
            "spec.github.runnerGroup",
            "give the runner group's name (e.g. Default) or its numeric id".into(),
        ),
        _ => {}
    }

    check_labels(&spec.labels, &mut problem);

    if spec.max_runners == 0 || spec.max_runners > MAX_RUNNERS_CEILING {
        problem(
            "spec.maxRunners",
            format!("must be between 1 and {MAX_RUNNERS_CEILING}"),
        );
    }
    if spec.min_idle > spec.max_runners {
        problem(
            "spec.minIdle",
            format!(
                "is {} but maxRunners is {}; lower minIdle or raise maxRunners",
                spec.min_idle, spec.max_runners
            ),
        );
    }

    for (key, value) in &spec.node_selector {
        if is_label_key(key) && !key.starts_with(RESTRICTED_NODE_LABEL_PREFIX) {
            problem(
                &format!("spec.nodeSelector.{key}"),
                format!(
                    "routes runners by a label a node can set on itself; use a key with the {RESTRICTED_NODE_LABEL_PREFIX} prefix (e.g. {RESTRICTED_NODE_LABEL_PREFIX}runner-pool: ci), which only an admin can put on a Node"
                ),
            );
        }
        if !is_label_key(key) {
            problem(
                "spec.nodeSelector",
                "a key is not a valid Kubernetes label key ([prefix/]name, name of 1-63 alphanumerics, '-', '_', '.')".into(),
            );
        }
        if !is_label_value(value) {
            problem(
                &format!("spec.nodeSelector.{key}"),
                "is not a valid label value (0-63 alphanumerics, '-', '_', '.')".into(),
            );
        }
    }

    if spec.workspace.mode == WorkspaceMode::Persistent
        && let Some(t) = &target
        && t.scope() != TargetScope::Repository
    {
        problem(
            "spec.workspace.mode",
            format!(
                "Persistent needs a repository target (a retained workspace is shared only by jobs of one repository) but the URL names an {}; use Ephemeral, or one policy per repository",
                match t.scope() {
                    TargetScope::Organization => "organization",
                    _ => "enterprise",
                }
            ),
        );
    }

    if spec.execution.mode == ExecutionMode::Oci
        && spec.workspace.fork_rule() == crate::policy::ForkPullRequests::Refuse
    {
        problem(
            "spec.workspace.forkPullRequests",
            format!(
                "Refuse{} is checked by native runners only (an OCI runner pod has no job gate); set spec.workspace.forkPullRequests: Allow to let fork pull requests run here knowingly, or use spec.execution.mode: Native",
                if spec.workspace.fork_pull_requests.is_none() {
                    " (the default of a Persistent workspace)"
                } else {
                    ""
                }
            ),
        );
    }

    if let Some(caches) = &spec.caches {
        if spec.execution.mode == ExecutionMode::Oci {
            problem(
                "spec.caches",
                "is kept for native runners only (an OCI runner pod mounts nothing of the node); remove spec.caches or use spec.execution.mode: Native".into(),
            );
        }
        if let Some(t) = &target
            && let Err(e) = cache_namespace(caches, "namespace", t)
        {
            let field = match e {
                crate::caches::CacheSpecError::SharedNameMissing
                | crate::caches::CacheSpecError::SharedNameUnused
                | crate::caches::CacheSpecError::BadSharedName => "spec.caches.sharedName",
                _ => "spec.caches.scope",
            };
            problem(field, e.to_string());
        }
        for (i, event) in caches.write_back.events.iter().enumerate() {
            if event == crate::caches::NEVER_TRUSTED_EVENT {
                problem(
                    &format!("spec.caches.writeBack.events[{i}]"),
                    "pull_request_target never writes back (it runs with the base repository's rights and is how a fork's code reaches a trusted job); remove it".into(),
                );
            }
        }
    }

    if spec.docker.enabled && spec.execution.mode == ExecutionMode::Oci {
        problem(
            "spec.docker.enabled",
            "gives native runners an engine of their own; an OCI runner pod gets none of the node's (use spec.execution.mode: Native, or set spec.docker.enabled: false)".into(),
        );
    }

    match (spec.execution.mode, spec.execution.image.as_deref()) {
        (ExecutionMode::Oci, None) => problem(
            "spec.execution.image",
            "Oci needs an image pinned by digest, e.g. ghcr.io/acme/runner@sha256:<64 hex>".into(),
        ),
        (ExecutionMode::Oci, Some(image)) if !is_digest_pinned(image) => problem(
            "spec.execution.image",
            "must be pinned by digest (NAME@sha256:<64 lower-case hex>); a tag can change under running jobs".into(),
        ),
        (ExecutionMode::Native, Some(_)) => problem(
            "spec.execution.image",
            "is only used with mode Oci; remove it or set spec.execution.mode: Oci".into(),
        ),
        _ => {}
    }
    if let Some(res) = &spec.execution.resources {
        if let Some(cpu) = &res.cpu
            && parse_cpu_millis(cpu).is_none_or(|m| m == 0)
        {
            problem(
                "spec.execution.resources.cpu",
                "must be a positive CPU quantity such as 4, 0.5 or 1500m".into(),
            );
        }
        if let Some(mem) = &res.memory
            && parse_memory_bytes(mem).is_none_or(|b| b < 64 * 1024 * 1024)
        {
            problem(
                "spec.execution.resources.memory",
                "must be a memory quantity of at least 64Mi, such as 8Gi or 512Mi".into(),
            );
        }
    }

    if spec.github.demand == crate::policy::DemandMode::ScaleSet {
        if spec.webhook.is_some() {
            problem(
                "spec.webhook",
                "a ScaleSet policy takes no webhook deliveries: remove spec.webhook, or set spec.github.demand to Webhook".into(),
            );
        }
        if spec.workspace.mode == WorkspaceMode::Persistent {
            problem(
                "spec.workspace.mode",
                "a ScaleSet policy's runners are ephemeral scale-set runners: use Ephemeral".into(),
            );
        }
    }

    let bounds = [
        (
            "spec.timeouts.registration",
            spec.timeouts.registration.as_duration(),
            Duration::from_secs(30),
            Duration::from_secs(3600),
        ),
        (
            "spec.timeouts.idle",
            spec.timeouts.idle.as_duration(),
            Duration::from_secs(30),
            Duration::from_secs(7 * 24 * 3600),
        ),
        (
            "spec.scaling.pollInterval",
            spec.scaling.poll_interval.as_duration(),
            Duration::from_secs(10),
            Duration::from_secs(3600),
        ),
    ];
    for (field, value, min, max) in bounds {
        if value < min || value > max {
            problem(
                field,
                format!(
                    "must be between {} and {}",
                    runner_manager_core::duration::ManifestDuration::from_secs(min.as_secs()),
                    runner_manager_core::duration::ManifestDuration::from_secs(max.as_secs())
                ),
            );
        }
    }
    out
}

fn check_labels(labels: &[String], problem: &mut impl FnMut(&str, String)) {
    if labels.is_empty() || labels.len() > 99 {
        problem(
            "spec.labels",
            format!(
                "has {} labels; give 1 to 99 (GitHub allows 100 and the cluster's ownership label takes one)",
                labels.len()
            ),
        );
    }
    let mut seen = BTreeSet::new();
    for (i, label) in labels.iter().enumerate() {
        let field = format!("spec.labels[{i}]");
        if label.is_empty()
            || label.len() > 100
            || label.chars().any(|c| c.is_whitespace() || c == ',')
        {
            problem(
                &field,
                "a label is 1-100 characters without spaces or commas".into(),
            );
        }
        if label
            .to_ascii_lowercase()
            .starts_with(RESERVED_LABEL_PREFIX)
        {
            problem(
                &field,
                "labels starting with rm- are reserved for the cluster's ownership label; rename it".into(),
            );
        }
        // GitHub compares labels case-insensitively.
        if !seen.insert(label.to_ascii_lowercase()) {
            problem(
                &field,
                "repeats an earlier label (labels compare case-insensitively)".into(),
            );
        }
    }
}

fn is_label_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && v.as_bytes()[0].is_ascii_alphanumeric()
            && v.as_bytes()[v.len() - 1].is_ascii_alphanumeric())
}

fn is_label_key(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            })
    });
    prefix_ok && !name.is_empty() && is_label_value(name)
}

/// `NAME@sha256:<64 lower-case hex>`.
pub fn is_digest_pinned(image: &str) -> bool {
    image.rsplit_once("@sha256:").is_some_and(|(name, digest)| {
        !name.is_empty()
            && digest.len() == 64
            && digest
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// A CPU quantity in millicores: `4`, `0.5`, `1500m`.
pub fn parse_cpu_millis(q: &Quantity) -> Option<u64> {
    runner_manager_core::quantity::cpu_millis(&q.0)
}

/// A memory quantity in bytes: `8Gi`, `512Mi`, `1G`, `1048576`.
pub fn parse_memory_bytes(q: &Quantity) -> Option<u64> {
    runner_manager_core::quantity::memory_bytes(&q.0)
}

/// A problem in a `runner.env` file: the line and what is wrong; never the value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvProblem {
    /// 1-based line number.
    pub line: usize,
    pub message: &'static str,
}

/// Names the agent sets itself; a `runner.env` may not override them.
const RESERVED_ENV_PREFIXES: &[&str] = &["ACTIONS_RUNNER_INPUT_", "RUNNER_MANAGER_"];
/// Set by the agent to the runner's own temporary directory.
const TMP_ENV_NAMES: &[&str] = &["TMPDIR", "TEMP", "TMP"];
/// Read by the dynamic loader of every program the runner starts.
const LOADER_ENV_PREFIX: &str = "LD_";
/// Read by the C library itself (glibc drops each of them for setuid programs for the same
/// reason): character-set modules, tunables, the allocator, message catalogues, the resolver,
/// locale and time-zone data.
const LIBC_ENV_NAMES: &[&str] = &[
    "GCONV_PATH",
    "GETCONF_DIR",
    "GLIBC_TUNABLES",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "LOCPATH",
    "NIS_PATH",
    "NLSPATH",
    "RESOLV_HOST_CONF",
    "RES_OPTIONS",
    "TZDIR",
];
const LIBC_ENV_PREFIXES: &[&str] = &["MALLOC_"];

/// Why a `runner.env` name is refused whatever its value. Closed: both the operator (this
/// module) and the node agent classify names with it, so the two never disagree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReservedEnvName {
    /// `ACTIONS_RUNNER_INPUT_*` (the JIT handoff) or `RUNNER_MANAGER_*` (the agent's own).
    Agent,
    /// `TMPDIR`, `TEMP`, `TMP`: the runner's temporary directory.
    TempDir,
    /// `LD_*`: the dynamic loader.
    DynamicLoader,
    /// `GCONV_PATH`, `GLIBC_TUNABLES`, `MALLOC_*`, `NLSPATH`, …: the C library.
    CLibrary,
}

impl ReservedEnvName {
    /// What is wrong and how to fix it; names the class, never a value.
    pub fn message(self) -> &'static str {
        match self {
            Self::Agent => {
                "sets a variable reserved for the runner's JIT handoff or the agent (ACTIONS_RUNNER_INPUT_*, RUNNER_MANAGER_*); remove the line"
            }
            Self::TempDir => {
                "sets TMPDIR, TEMP or TMP, which the agent points at the runner's own temporary directory; remove the line"
            }
            Self::DynamicLoader => {
                "sets a dynamic-loader variable (LD_*), which the loader would apply to every program the runner starts; remove the line, and set library paths inside the job's own steps if it needs them"
            }
            Self::CLibrary => {
                "sets a C-library variable (GCONV_PATH, GETCONF_DIR, GLIBC_TUNABLES, HOSTALIASES, LOCALDOMAIN, LOCPATH, MALLOC_*, NIS_PATH, NLSPATH, RES_OPTIONS, RESOLV_HOST_CONF, TZDIR), which changes how the C library of every program behaves; remove the line, and set it inside the job's own steps if it needs it"
            }
        }
    }
}

fn starts_with_ignore_case(name: &str, prefix: &str) -> bool {
    name.len() >= prefix.len()
        && name.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

/// The class of a name `runner.env` may not set, or `None`. Compared without regard to case:
/// the C library reads only the upper-case spellings, but nothing legitimate needs the others.
pub fn reserved_env_name(name: &str) -> Option<ReservedEnvName> {
    let one_of = |names: &[&str]| names.iter().any(|n| n.eq_ignore_ascii_case(name));
    let prefixed = |prefixes: &[&str]| prefixes.iter().any(|p| starts_with_ignore_case(name, p));
    if prefixed(RESERVED_ENV_PREFIXES) {
        Some(ReservedEnvName::Agent)
    } else if one_of(TMP_ENV_NAMES) {
        Some(ReservedEnvName::TempDir)
    } else if starts_with_ignore_case(name, LOADER_ENV_PREFIX) {
        Some(ReservedEnvName::DynamicLoader)
    } else if one_of(LIBC_ENV_NAMES) || prefixed(LIBC_ENV_PREFIXES) {
        Some(ReservedEnvName::CLibrary)
    } else {
        None
    }
}

/// Parse `runner.env`: `NAME=value` lines, `#` comments, blank lines. Returns every problem.
pub fn parse_runner_env(text: &str) -> Result<BTreeMap<String, String>, Vec<EnvProblem>> {
    let mut vars = BTreeMap::new();
    let mut problems = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let n = i + 1;
        let Some((name, value)) = line.split_once('=') else {
            problems.push(EnvProblem {
                line: n,
                message: "is not NAME=value",
            });
            continue;
        };
        let name = name.trim_end();
        let valid_name = name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid_name {
            problems.push(EnvProblem {
                line: n,
                message: "has a name that is not [A-Za-z_][A-Za-z0-9_]*",
            });
        } else if let Some(class) = reserved_env_name(name) {
            problems.push(EnvProblem {
                line: n,
                message: class.message(),
            });
        } else if value.contains('\0') {
            problems.push(EnvProblem {
                line: n,
                message: "has a NUL byte in its value",
            });
        } else if vars.insert(name.to_owned(), value.to_owned()).is_some() {
            problems.push(EnvProblem {
                line: n,
                message: "sets a name an earlier line already set",
            });
        }
    }
    if problems.is_empty() {
        Ok(vars)
    } else {
        Err(problems)
    }
}

/// The namespace path of `spec` for a policy in Kubernetes namespace `k8s_namespace` with
/// `target`. Pure.
pub fn cache_namespace(
    spec: &crate::caches::CacheSpec,
    k8s_namespace: &str,
    target: &GitHubTarget,
) -> Result<String, crate::caches::CacheSpecError> {
    let host = target.host.to_ascii_lowercase().replace(':', "_");
    let tail = match (spec.scope, &target.kind) {
        (
            crate::caches::CacheScope::Repository,
            runner_manager_core::target::TargetKind::Repository { owner, repo },
        ) => {
            format!("{owner}/{repo}")
        }
        (crate::caches::CacheScope::Repository, _) => {
            return Err(crate::caches::CacheSpecError::RepositoryScopeNeedsRepository);
        }
        (
            crate::caches::CacheScope::Organization,
            runner_manager_core::target::TargetKind::Repository { owner: org, .. },
        )
        | (
            crate::caches::CacheScope::Organization,
            runner_manager_core::target::TargetKind::Organization { org },
        ) => format!("_org/{org}"),
        (
            crate::caches::CacheScope::Organization,
            runner_manager_core::target::TargetKind::Enterprise { .. },
        ) => {
            return Err(crate::caches::CacheSpecError::OrganizationScopeNeedsOrganization);
        }
        (crate::caches::CacheScope::Shared, _) => {
            let name = spec
                .shared_name
                .as_deref()
                .ok_or(crate::caches::CacheSpecError::SharedNameMissing)?;
            if name.len() > 63 || !crate::caches::is_namespace_component(name) {
                return Err(crate::caches::CacheSpecError::BadSharedName);
            }
            format!("_shared/{name}")
        }
    };
    if spec.scope != crate::caches::CacheScope::Shared && spec.shared_name.is_some() {
        return Err(crate::caches::CacheSpecError::SharedNameUnused);
    }
    Ok(format!("{k8s_namespace}/{host}/{tail}").to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_validated_view_holds_the_parsed_target_and_no_view_exists_for_a_bad_url_or_identity() {
        let policy = |url: &str, uid: Option<&str>| -> crate::policy::ScalePolicy {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "runner-manager.dev/v1alpha1", "kind": "ScalePolicy",
                "metadata": {"namespace": "team", "name": "web", "uid": uid, "generation": 4},
                "spec": {"github": {"url": url, "credentialsSecretRef": {"name": "gh"}},
                         "labels": ["linux"], "maxRunners": 3}
            }))
            .unwrap()
        };
        let v = validated(&policy("https://github.com/acme/web", Some("u-1"))).unwrap();
        assert_eq!(
            (
                v.namespace.as_str(),
                v.name.as_str(),
                v.uid.as_str(),
                v.generation
            ),
            ("team", "web", "u-1", 4)
        );
        assert_eq!(v.target.scope(), TargetScope::Repository);
        assert_eq!(v.spec.max_runners, 3);
        let bad = validated(&policy("not a url", Some("u-1"))).unwrap_err();
        assert!(bad.iter().any(|p| p.field == "spec.github.url"), "{bad:?}");
        let anonymous = validated(&policy("https://github.com/acme/web", None)).unwrap_err();
        assert_eq!(anonymous.len(), 1);
        assert_eq!(anonymous[0].field, "metadata.uid");
    }

    #[test]
    fn a_scale_set_policy_takes_no_webhook_and_no_persistent_workspace() {
        let spec = |extra: serde_json::Value| -> ScalePolicySpec {
            let mut v = serde_json::json!({
                "github": {"url": "https://github.com/acme", "credentialsSecretRef": {"name": "gh"},
                           "demand": "ScaleSet"},
                "labels": ["linux"], "maxRunners": 3,
            });
            if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            serde_json::from_value(v).unwrap()
        };
        assert!(validate_policy(&spec(serde_json::json!({}))).is_empty());
        let fields: Vec<String> = validate_policy(&spec(serde_json::json!({
            "webhook": {"secretRef": {"name": "hook"}},
            "workspace": {"mode": "Persistent"},
        })))
        .into_iter()
        .map(|p| p.field)
        .collect();
        assert!(fields.contains(&"spec.webhook".to_owned()), "{fields:?}");
        assert!(
            fields.contains(&"spec.workspace.mode".to_owned()),
            "{fields:?}"
        );
        assert_eq!(crate::policy::scale_set_name("team", "linux"), "team-linux");
        assert_eq!(
            crate::policy::scale_set_name("a", &"x".repeat(200)).len(),
            128
        );
    }

    #[test]
    fn docker_is_refused_for_oci_runners_with_the_field_and_the_fix() {
        let spec = |oci: bool| -> ScalePolicySpec {
            let image = format!("registry.local/runner@sha256:{}", "a".repeat(64));
            serde_json::from_value(serde_json::json!({
                "github": {"url": "https://github.com/acme/web", "credentialsSecretRef": {"name": "gh"}},
                "labels": ["linux"], "maxRunners": 3, "docker": {"enabled": true},
                "execution": if oci { serde_json::json!({"mode": "Oci", "image": image}) } else { serde_json::json!({}) },
            }))
            .unwrap()
        };
        assert!(validate_policy(&spec(false)).is_empty());
        let problems = validate_policy(&spec(true));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].field, "spec.docker.enabled");
        assert!(
            problems[0].message.contains("Native"),
            "{}",
            problems[0].message
        );
    }

    #[test]
    fn caches_are_refused_where_they_cannot_be_kept_with_the_field_and_the_fix() {
        let spec = |url: &str, caches: serde_json::Value, oci: bool| -> ScalePolicySpec {
            let image = format!("registry.local/runner@sha256:{}", "a".repeat(64));
            serde_json::from_value(serde_json::json!({
                "github": {"url": url, "credentialsSecretRef": {"name": "gh"}},
                "labels": ["linux"], "maxRunners": 3, "caches": caches,
                "execution": if oci { serde_json::json!({"mode": "Oci", "image": image}) } else { serde_json::json!({}) },
            }))
            .unwrap()
        };
        let problems = |s: &ScalePolicySpec| -> Vec<(String, String)> {
            validate_policy(s)
                .into_iter()
                .map(|p| (p.field, p.message))
                .collect()
        };
        let repo = "https://github.com/acme/web";
        assert!(problems(&spec(repo, serde_json::json!({}), false)).is_empty());
        assert!(
            problems(&spec(
                "https://github.com/acme",
                serde_json::json!({"scope": "Organization", "writeBack": {"branches": ["main"], "events": ["push"]}}),
                false
            ))
            .is_empty()
        );
        let one = |s: ScalePolicySpec| {
            let p = problems(&s);
            assert_eq!(p.len(), 1, "{p:?}");
            p.into_iter().next().unwrap()
        };
        let (field, message) = one(spec(repo, serde_json::json!({}), true));
        assert_eq!(field, "spec.caches");
        assert!(message.contains("Native"), "{message}");
        let (field, message) = one(spec(
            "https://github.com/acme",
            serde_json::json!({}),
            false,
        ));
        assert_eq!(field, "spec.caches.scope");
        assert!(message.contains("Organization or Shared"), "{message}");
        let (field, _) = one(spec(repo, serde_json::json!({"scope": "Shared"}), false));
        assert_eq!(field, "spec.caches.sharedName");
        let (field, message) = one(spec(
            repo,
            serde_json::json!({"writeBack": {"events": ["push", "pull_request_target"]}}),
            false,
        ));
        assert_eq!(field, "spec.caches.writeBack.events[1]");
        assert!(message.contains("remove it"), "{message}");
    }

    #[test]
    fn an_oci_policy_must_allow_fork_pull_requests_and_the_rule_defaults_by_mode() {
        let spec = |workspace: serde_json::Value, mode: &str| -> ScalePolicySpec {
            let image = format!("registry.local/runner@sha256:{}", "a".repeat(64));
            serde_json::from_value(serde_json::json!({
                "github": {"url": "https://github.com/acme/web", "credentialsSecretRef": {"name": "gh"}},
                "labels": ["linux"], "maxRunners": 3, "workspace": workspace,
                "execution": if mode == "Oci" { serde_json::json!({"mode": "Oci", "image": image}) } else { serde_json::json!({}) },
            }))
            .unwrap()
        };
        let fields = |s: &ScalePolicySpec| -> Vec<String> {
            validate_policy(s).into_iter().map(|p| p.field).collect()
        };
        let persistent = serde_json::json!({"mode": "Persistent"});
        assert_eq!(
            spec(persistent.clone(), "Native").workspace.fork_rule(),
            crate::policy::ForkPullRequests::Refuse
        );
        assert_eq!(
            spec(serde_json::json!({}), "Native").workspace.fork_rule(),
            crate::policy::ForkPullRequests::Allow
        );
        assert!(fields(&spec(persistent.clone(), "Native")).is_empty());
        let refused = validate_policy(&spec(persistent, "Oci"));
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0].field, "spec.workspace.forkPullRequests");
        assert!(
            refused[0].message.contains("Allow"),
            "{}",
            refused[0].message
        );
        assert!(
            fields(&spec(
                serde_json::json!({"mode": "Persistent", "forkPullRequests": "Allow"}),
                "Oci"
            ))
            .is_empty()
        );
        assert!(
            !fields(&spec(
                serde_json::json!({"forkPullRequests": "Refuse"}),
                "Oci"
            ))
            .is_empty()
        );
    }

    #[test]
    fn loader_and_libc_names_are_refused_by_line_and_class_never_by_value() {
        let text = "\
GOOD=1
LD_PRELOAD=/tmp/x.so
# a comment
ld_library_path=/tmp
GCONV_PATH=/tmp/gconv
GLIBC_TUNABLES=glibc.malloc.check=3
MALLOC_ARENA_MAX=2
NLSPATH=/tmp/%N
HOSTALIASES=/tmp/hosts
RESOLV_HOST_CONF=/tmp/h
LOCALDOMAIN=evil
RES_OPTIONS=debug
TZDIR=/tmp/tz
LOCPATH=/tmp/loc
NIS_PATH=/tmp/nis
TMPDIR=/tmp
ACTIONS_RUNNER_INPUT_JITCONFIG=x
RUNNER_MANAGER_RUNNER_ENV=x
LDFLAGS=-L/opt/lib
MALLOCATOR=jemalloc
";
        let problems = parse_runner_env(text).unwrap_err();
        let by_line: Vec<(usize, &str)> = problems.iter().map(|p| (p.line, p.message)).collect();
        let loader = ReservedEnvName::DynamicLoader.message();
        let libc = ReservedEnvName::CLibrary.message();
        assert_eq!(
            by_line,
            vec![
                (2, loader),
                (4, loader),
                (5, libc),
                (6, libc),
                (7, libc),
                (8, libc),
                (9, libc),
                (10, libc),
                (11, libc),
                (12, libc),
                (13, libc),
                (14, libc),
                (15, libc),
                (16, ReservedEnvName::TempDir.message()),
                (17, ReservedEnvName::Agent.message()),
                (18, ReservedEnvName::Agent.message()),
            ]
        );
        for p in &problems {
            assert!(!p.message.contains("/tmp/x.so") && !p.message.contains("evil"));
            assert!(p.message.contains("remove the line"), "{}", p.message);
        }
        // Near misses are ordinary names: LDFLAGS is not LD_*, MALLOCATOR is not MALLOC_*.
        let ok =
            parse_runner_env("LDFLAGS=-L/opt/lib\nMALLOCATOR=jemalloc\nLANG=C.UTF-8\n").unwrap();
        assert_eq!(ok.len(), 3);
    }

    #[test]
    fn names_are_classified_without_regard_to_case() {
        for (name, class) in [
            ("LD_PRELOAD", Some(ReservedEnvName::DynamicLoader)),
            ("LD_AUDIT", Some(ReservedEnvName::DynamicLoader)),
            ("Ld_Library_Path", Some(ReservedEnvName::DynamicLoader)),
            ("malloc_perturb_", Some(ReservedEnvName::CLibrary)),
            ("glibc_tunables", Some(ReservedEnvName::CLibrary)),
            ("Temp", Some(ReservedEnvName::TempDir)),
            ("actions_runner_input_x", Some(ReservedEnvName::Agent)),
            ("LD", None),
            ("OLD_PATH", None),
            ("PATH", None),
            ("HOME", None),
        ] {
            assert_eq!(reserved_env_name(name), class, "{name}");
        }
    }

    fn cache_target(url: &str) -> GitHubTarget {
        GitHubTarget::parse(url).unwrap()
    }

    #[test]
    fn namespaces_never_cross_kubernetes_namespaces_or_hosts() {
        let repo = crate::caches::CacheSpec::default();
        assert_eq!(
            cache_namespace(
                &repo,
                "team-a",
                &cache_target("https://github.com/Acme/Web")
            ),
            Ok("team-a/github.com/acme/web".into())
        );
        assert_eq!(
            cache_namespace(
                &repo,
                "team-a",
                &cache_target("https://ghe.example.com:8443/acme/web")
            ),
            Ok("team-a/ghe.example.com_8443/acme/web".into())
        );
        let org = crate::caches::CacheSpec {
            scope: crate::caches::CacheScope::Organization,
            ..crate::caches::CacheSpec::default()
        };
        assert_eq!(
            cache_namespace(&org, "t", &cache_target("https://github.com/acme")),
            Ok("t/github.com/_org/acme".into())
        );
        let shared = crate::caches::CacheSpec {
            scope: crate::caches::CacheScope::Shared,
            shared_name: Some("builds".into()),
            ..crate::caches::CacheSpec::default()
        };
        assert_eq!(
            cache_namespace(
                &shared,
                "t",
                &cache_target("https://github.com/enterprises/e")
            ),
            Ok("t/github.com/_shared/builds".into())
        );
    }

    #[test]
    fn a_scope_the_target_cannot_fill_is_refused() {
        let repo = crate::caches::CacheSpec::default();
        assert_eq!(
            cache_namespace(&repo, "t", &cache_target("https://github.com/acme")),
            Err(crate::caches::CacheSpecError::RepositoryScopeNeedsRepository)
        );
        let org = crate::caches::CacheSpec {
            scope: crate::caches::CacheScope::Organization,
            ..crate::caches::CacheSpec::default()
        };
        assert_eq!(
            cache_namespace(&org, "t", &cache_target("https://github.com/enterprises/e")),
            Err(crate::caches::CacheSpecError::OrganizationScopeNeedsOrganization)
        );
        let shared = crate::caches::CacheSpec {
            scope: crate::caches::CacheScope::Shared,
            ..crate::caches::CacheSpec::default()
        };
        assert_eq!(
            cache_namespace(&shared, "t", &cache_target("https://github.com/acme")),
            Err(crate::caches::CacheSpecError::SharedNameMissing)
        );
        for bad in ["..", "Builds", "a/b", ""] {
            let s = crate::caches::CacheSpec {
                shared_name: Some(bad.into()),
                ..shared.clone()
            };
            assert_eq!(
                cache_namespace(&s, "t", &cache_target("https://github.com/acme")),
                Err(crate::caches::CacheSpecError::BadSharedName),
                "{bad}"
            );
        }
        let unused = crate::caches::CacheSpec {
            shared_name: Some("x".into()),
            ..crate::caches::CacheSpec::default()
        };
        assert_eq!(
            cache_namespace(&unused, "t", &cache_target("https://github.com/acme/web")),
            Err(crate::caches::CacheSpecError::SharedNameUnused)
        );
    }
}
