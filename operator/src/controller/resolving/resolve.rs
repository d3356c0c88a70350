//! What a policy needs beyond its own spec before anything is created: the semantic checks, the
//! credentials Secret, the runner group id, the pinned runner package and the runner.env. Each
//! failure becomes a `Ready=False` reason with a message naming the field and the fix.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::Api;
use runner_manager_crds::arch::Arch;
use runner_manager_crds::attempt::RunnerPackage;
use runner_manager_crds::policy::{PolicyReason, ScalePolicy};
use runner_manager_crds::target::GitHubTarget;
use runner_manager_crds::validate::{ValidatedPolicy, parse_runner_env, validated};

use crate::github::client::GitHubClient;
use crate::github::errors::{GitHubError, Terminal};
use crate::github::registry::{ClientError, Clients};
use crate::github::types::RunnerDownload;
use crate::policy::tenancy::OwnerBindings;
use runner_manager_crds::hosts::{HostList, check_scheme, url_host};

/// The key of the runner.env in the ConfigMap of `spec.runner.envFrom`.
pub const RUNNER_ENV_KEY: &str = "runner.env";

/// Everything resolved for one generation of a policy.
#[derive(Clone)]
pub struct Resolved {
    /// The policy as validated for this generation (its parsed target). Shared: a reconcile
    /// clones its resolution every pass, and the view holds the whole spec.
    pub policy: Arc<ValidatedPolicy>,
    pub client: Arc<GitHubClient>,
    pub runner_group_id: i64,
    pub packages: RunnerPackages,
    pub env: BTreeMap<String, String>,
}

/// Why a policy is not Ready.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub reason: PolicyReason,
    pub message: String,
}

impl Invalid {
    fn new(reason: PolicyReason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }

    /// Whether waiting may fix it without a person (GitHub or the API server was unavailable).
    pub fn is_transient(&self) -> bool {
        self.reason == PolicyReason::GitHubUnreachable
    }
}

/// The runner version in a downloads-listing filename (`actions-runner-linux-x64-2.330.0.tar.gz`).
pub fn version_of_filename(filename: &str) -> Option<&str> {
    let stem = filename
        .strip_suffix(".tar.gz")
        .or_else(|| filename.strip_suffix(".zip"))?;
    let v = stem.rsplit('-').next()?;
    (v.split('.').count() == 3 && v.split('.').all(|p| p.parse::<u32>().is_ok())).then_some(v)
}

/// The pinned runner package of each architecture GitHub publishes for one version (issue 31
/// item 5). Never empty; every package is of the same version. Placement sends an attempt only
/// to a node whose architecture has one, and the attempt's snapshot pins that one.
#[derive(Clone, Debug, PartialEq)]
pub struct RunnerPackages {
    version: String,
    by_arch: BTreeMap<Arch, RunnerPackage>,
}

impl RunnerPackages {
    /// One package (its `architecture`, or x64 when it names none). For tests and callers
    /// that resolve a single package.
    pub fn single(package: RunnerPackage) -> Self {
        let arch = package.architecture.unwrap_or(Arch::X64);
        Self {
            version: package.version.clone(),
            by_arch: BTreeMap::from([(arch, package)]),
        }
    }

    /// Packages of one version, each under its `architecture` (x64 when it names none).
    /// `None` when there are none or their versions differ.
    pub fn of(packages: impl IntoIterator<Item = RunnerPackage>) -> Option<Self> {
        let mut packages = packages.into_iter();
        let mut all = Self::single(packages.next()?);
        for p in packages {
            if p.version != all.version {
                return None;
            }
            all.by_arch.insert(p.architecture.unwrap_or(Arch::X64), p);
        }
        Some(all)
    }

    pub fn version(&self) -> &str {
        &self.version
    }

    /// The package for nodes of `arch`, if GitHub publishes one.
    pub fn get(&self, arch: Arch) -> Option<&RunnerPackage> {
        self.by_arch.get(&arch)
    }

    pub fn iter(&self) -> impl Iterator<Item = (Arch, &RunnerPackage)> {
        self.by_arch.iter().map(|(a, p)| (*a, p))
    }

    /// The packages a runner with `labels` may run: when the labels name architectures
    /// (GitHub's words, any case: `x64`, `ARM64`), only theirs — a runner labelled `x64` on an
    /// arm64 node would take the jobs that asked for x64. `None` when no published architecture
    /// is left.
    pub fn for_labels(&self, labels: &[String]) -> Option<Self> {
        let named: Vec<Arch> = labels
            .iter()
            .filter_map(|l| Arch::from_github(&l.to_ascii_lowercase()))
            .collect();
        if named.is_empty() {
            return Some(self.clone());
        }
        let by_arch: BTreeMap<Arch, RunnerPackage> = self
            .by_arch
            .iter()
            .filter(|(a, _)| named.contains(a))
            .map(|(a, p)| (*a, p.clone()))
            .collect();
        (!by_arch.is_empty()).then(|| Self {
            version: self.version.clone(),
            by_arch,
        })
    }

    /// `x64, arm64` — for messages.
    pub fn architectures(&self) -> String {
        self.by_arch
            .keys()
            .map(|a| a.github())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Pick the Linux packages of `wanted` (`latest` = what the listing offers), one per
/// architecture runner-manager places (x64, arm64, arm), and pin version, URL and sha256 of each.
/// An architecture whose entry has no usable sha256 is left out (its nodes get no runner; a
/// digest is never guessed). With a mirror, the URLs are the mirror's (admins run it; tenants
/// never name URLs) and the digests still come from GitHub's listing. Pure.
pub fn pin_packages(
    listing: &[RunnerDownload],
    wanted: &str,
    mirror: Option<&str>,
) -> Result<RunnerPackages, Invalid> {
    let unresolvable = |why: String| Invalid::new(PolicyReason::RunnerVersionUnresolvable, why);
    let linux: Vec<(Arch, &RunnerDownload)> = listing
        .iter()
        .filter(|d| d.os == "linux")
        .filter_map(|d| Some((Arch::from_github(&d.architecture)?, d)))
        .collect();
    // GitHub lists one release; its x64 entry names the version when there is one.
    let first = linux
        .iter()
        .min_by_key(|(a, _)| *a)
        .map(|(_, d)| *d)
        .ok_or_else(|| {
            unresolvable(
                "spec.runner.version: GitHub's runner downloads listing has no Linux package for x64, arm64 or arm"
                    .into(),
            )
        })?;
    let version = version_of_filename(&first.filename).ok_or_else(|| {
        unresolvable("spec.runner.version: the downloads listing names no version".into())
    })?;
    if wanted != "latest" && wanted != version {
        return Err(unresolvable(format!(
            "spec.runner.version: {wanted} has no published checksum (GitHub lists {version}); use `latest` or {version}"
        )));
    }
    let by_arch: BTreeMap<Arch, RunnerPackage> = linux
        .iter()
        .filter(|(_, d)| version_of_filename(&d.filename) == Some(version))
        .filter_map(|(arch, d)| {
            let sha256 = d
                .sha256_checksum
                .as_deref()
                .map(str::to_ascii_lowercase)
                .filter(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()))?;
            let url = match mirror {
                Some(m) => format!("{}/{}", m.trim_end_matches('/'), d.filename),
                None => d.download_url.clone(),
            };
            Some((
                *arch,
                RunnerPackage {
                    version: version.to_owned(),
                    url,
                    sha256,
                    architecture: Some(*arch),
                },
            ))
        })
        .collect();
    if by_arch.is_empty() {
        return Err(unresolvable(
            "spec.runner.version: the downloads listing has no sha256".into(),
        ));
    }
    Ok(RunnerPackages {
        version: version.to_owned(),
        by_arch,
    })
}

fn github_invalid(e: &GitHubError, field: &str) -> Invalid {
    match e {
        GitHubError::Terminal {
            reason: Terminal::BadCredentials | Terminal::MissingPermission,
            ..
        } => Invalid::new(
            PolicyReason::CredentialsRejected,
            format!("spec.github.credentialsSecretRef: {e}"),
        ),
        GitHubError::Terminal {
            reason: Terminal::RunnerGroupUnusable,
            ..
        } => Invalid::new(PolicyReason::RunnerGroupNotFound, format!("{field}: {e}")),
        GitHubError::Terminal {
            reason: Terminal::NotFound,
            ..
        } => Invalid::new(PolicyReason::InvalidSpec, format!("spec.github.url: {e}")),
        _ => Invalid::new(
            PolicyReason::GitHubUnreachable,
            format!("GitHub could not be asked ({field}); retrying: {e}"),
        ),
    }
}

/// The admin's host settings (issue 13, finding 8): which GitHub hosts policies may name, which
/// hosts runner packages may come from, which hosts may be spoken to over plain http.
#[derive(Clone, Debug, Default)]
pub struct HostPolicy {
    /// `--github-hosts`.
    pub github_hosts: HostList,
    /// `--download-hosts`.
    pub download_hosts: HostList,
    /// `--allow-http-hosts`.
    pub http_hosts: HostList,
    /// `--runner-mirror-url` (its host is the admin's own).
    pub mirror: Option<String>,
}

fn host_refused(message: String) -> Invalid {
    Invalid::new(PolicyReason::HostNotAllowed, message)
}

impl HostPolicy {
    /// `Err` when the policy's GitHub host is not on `--github-hosts`. Pure.
    pub fn github_host_allowed(&self, target: &GitHubTarget) -> Result<(), Invalid> {
        if self.github_hosts.contains(&target.host) {
            return Ok(());
        }
        Err(host_refused(format!(
            "spec.github.url: the host {} is not one the operator may talk to (its --github-hosts, chart value operator.githubHosts, lists {}); an admin must add the host, or name an allowed one",
            target.host,
            if self.github_hosts.is_empty() {
                "none".to_owned()
            } else {
                self.github_hosts.to_string()
            },
        )))
    }

    /// `Err` when the pinned package URL is on a host the admin did not allow (the policy's own
    /// GitHub host, the mirror's, or `--download-hosts`), or plain http to a host not on
    /// `--allow-http-hosts`. Pure.
    pub fn package_allowed(&self, package_url: &str, github_host: &str) -> Result<(), Invalid> {
        let field = "spec.runner.version";
        let h = check_scheme(package_url, &self.http_hosts).map_err(|e| {
            host_refused(format!(
                "{field}: the runner package URL {e} (chart value operator.allowHttpHosts)"
            ))
        })?;
        let mirror_host = self
            .mirror
            .as_deref()
            .and_then(|m| url_host(m).ok())
            .map(|m| m.authority);
        let own = HostList::parse(github_host).unwrap_or_default();
        if own.contains(&h.authority)
            || mirror_host.as_deref() == Some(h.authority.as_str())
            || self.download_hosts.contains(&h.authority)
        {
            return Ok(());
        }
        Err(host_refused(format!(
            "{field}: GitHub's downloads listing puts the runner package on {}, which is neither the policy's GitHub host nor in the operator's --download-hosts (chart value operator.downloadHosts); an admin must add it, or set --runner-mirror-url",
            h.authority
        )))
    }
}

/// Resolve one policy. Reads its Secret (and ConfigMap) and asks GitHub; call once per
/// generation (and again after a transient failure), not per pass.
pub async fn resolve(
    kube: &kube::Client,
    clients: &Clients,
    policy: &ScalePolicy,
    hosts: &HostPolicy,
    bindings: &OwnerBindings,
) -> Result<Resolved, Invalid> {
    let valid = validated(policy).map_err(|problems| {
        let message = problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        Invalid::new(PolicyReason::InvalidSpec, message)
    })?;
    let namespace = valid.namespace.as_str();
    // Before the Secret is read: a namespace the admin did not bind gets nothing done with
    // its credentials for that owner, valid or not.
    owner_allowed(bindings, &valid.target, namespace)?;
    // Before the Secret is read and before GitHub is asked: a host the admin did not list gets
    // no request, and its listing never chooses a package.
    hosts.github_host_allowed(&valid.target)?;
    let secret_name = &policy.spec.github.credentials_secret_ref.name;
    let secret = clients
        .secret(namespace, secret_name)
        .await
        .map_err(|e| {
            Invalid::new(
                PolicyReason::GitHubUnreachable,
                format!("reading spec.github.credentialsSecretRef: {e}"),
            )
        })?
        .ok_or_else(|| {
            Invalid::new(
                PolicyReason::SecretNotFound,
                format!(
                    "spec.github.credentialsSecretRef.name: Secret {secret_name} not found in namespace {namespace}; create it with appId + privateKey (GitHub App) or token"
                ),
            )
        })?;
    let client = clients
        .for_secret(namespace, &policy.spec.github.url, &secret)
        .map_err(|e| match e {
            ClientError::BadSecret { .. } => Invalid::new(
                PolicyReason::SecretKeyMissing,
                format!("spec.github.credentialsSecretRef: {e}"),
            ),
            ClientError::BadUrl(_) => Invalid::new(PolicyReason::InvalidSpec, e.to_string()),
            other => Invalid::new(PolicyReason::GitHubUnreachable, other.to_string()),
        })?;
    let runner_group_id = match &policy.spec.github.runner_group {
        Some(IntOrString::Int(id)) => i64::from(*id),
        Some(IntOrString::String(group)) => client
            .runner_group_id(group)
            .await
            .map_err(|e| github_invalid(&e, "spec.github.runnerGroup"))?,
        None => client
            .runner_group_id("Default")
            .await
            .map_err(|e| github_invalid(&e, "spec.github.runnerGroup"))?,
    };
    // Policies of one target resolve within moments of each other (a restart, a Secret
    // rotation): one listing serves them all.
    let listing = client
        .recent_downloads(std::time::Duration::from_secs(60))
        .await
        .map_err(|e| github_invalid(&e, "spec.runner.version"))?;
    let packages = pin_packages(
        &listing,
        &policy.spec.runner.version,
        hosts.mirror.as_deref(),
    )?;
    for (_, package) in packages.iter() {
        hosts.package_allowed(&package.url, &client.target().host)?;
    }
    let env = match &policy.spec.runner.env_from {
        None => BTreeMap::new(),
        Some(from) => runner_env(kube, namespace, &from.config_map_ref.name).await?,
    };
    Ok(Resolved {
        policy: Arc::new(valid),
        client,
        runner_group_id,
        packages,
        env,
    })
}

/// `Err` when the URL's owner is bound to other namespaces. Pure.
pub fn owner_allowed(
    bindings: &OwnerBindings,
    target: &GitHubTarget,
    namespace: &str,
) -> Result<(), Invalid> {
    match bindings.refuses(&target.kind, namespace) {
        None => Ok(()),
        Some(bound) => Err(Invalid::new(
            PolicyReason::OwnerBoundElsewhere,
            OwnerBindings::refusal_message(&target.kind, namespace, bound),
        )),
    }
}

async fn runner_env(
    kube: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<BTreeMap<String, String>, Invalid> {
    let field = "spec.runner.envFrom.configMapRef";
    let cm = Api::<ConfigMap>::namespaced(kube.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|e| Invalid::new(PolicyReason::GitHubUnreachable, format!("{field}: {e}")))?
        .ok_or_else(|| {
            Invalid::new(
                PolicyReason::RunnerEnvInvalid,
                format!("{field}: ConfigMap {name} not found in namespace {namespace}"),
            )
        })?;
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(RUNNER_ENV_KEY))
        .ok_or_else(|| {
            Invalid::new(
                PolicyReason::RunnerEnvInvalid,
                format!("{field}: ConfigMap {name} has no key {RUNNER_ENV_KEY}"),
            )
        })?;
    // Problems name the file and the line, never a value (DESIGN §4 rule 12).
    parse_runner_env(text).map_err(|problems| {
        let lines = problems
            .iter()
            .map(|p| format!("{RUNNER_ENV_KEY} line {} {}", p.line, p.message))
            .collect::<Vec<_>>()
            .join("; ");
        Invalid::new(
            PolicyReason::RunnerEnvInvalid,
            format!("{field} ({name}): {lines}"),
        )
    })
}

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolved").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(file: &str, sha: Option<&str>) -> Vec<RunnerDownload> {
        vec![
            RunnerDownload {
                os: "osx".into(),
                architecture: "arm64".into(),
                download_url: "https://x/osx".into(),
                filename: "actions-runner-osx-arm64-2.330.0.tar.gz".into(),
                sha256_checksum: None,
            },
            RunnerDownload {
                os: "linux".into(),
                architecture: "x64".into(),
                download_url: format!(
                    "https://github.com/actions/runner/releases/download/v2.330.0/{file}"
                ),
                filename: file.into(),
                sha256_checksum: sha.map(str::to_owned),
            },
        ]
    }

    fn target(url: &str) -> GitHubTarget {
        GitHubTarget::parse(url).unwrap()
    }

    const SHA: &str = "ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789";

    #[test]
    fn a_bound_owner_is_refused_elsewhere_with_a_message_naming_the_setting() {
        let b = OwnerBindings::parse("acme=team").unwrap();
        assert!(owner_allowed(&b, &target("https://github.com/acme/web"), "team").is_ok());
        assert!(owner_allowed(&b, &target("https://github.com/other/web"), "aaa").is_ok());
        let e = owner_allowed(&b, &target("https://github.com/acme/web"), "aaa").unwrap_err();
        assert_eq!(e.reason, PolicyReason::OwnerBoundElsewhere);
        assert!(!e.is_transient());
        assert!(e.message.contains("--owner-namespaces"), "{}", e.message);
        let org = owner_allowed(&b, &target("https://github.com/ACME"), "aaa").unwrap_err();
        assert_eq!(org.reason, PolicyReason::OwnerBoundElsewhere);
    }

    #[test]
    fn hosts_outside_the_admin_lists_are_refused_naming_the_setting() {
        let hosts = HostPolicy {
            github_hosts: HostList::parse("github.com,ghes.corp.example").unwrap(),
            download_hosts: HostList::parse("objects.corp.example,127.0.0.1").unwrap(),
            http_hosts: HostList::parse("127.0.0.1").unwrap(),
            mirror: Some("https://mirror.corp.example/runner".into()),
        };
        assert!(
            hosts
                .github_host_allowed(&target("https://github.com/a/b"))
                .is_ok()
        );
        assert!(
            hosts
                .github_host_allowed(&target("https://GHES.corp.example/a"))
                .is_ok()
        );
        let e = hosts
            .github_host_allowed(&target("https://evil.example/a/b"))
            .unwrap_err();
        assert_eq!(e.reason, PolicyReason::HostNotAllowed);
        assert!(e.message.contains("--github-hosts"), "{}", e.message);
        assert!(e.message.contains("operator.githubHosts"), "{}", e.message);
        for ok in [
            "https://github.com/actions/runner/releases/x.tar.gz",
            "https://objects.corp.example/x.tar.gz",
            "https://mirror.corp.example/runner/x.tar.gz",
            "http://127.0.0.1:9000/x.tar.gz",
        ] {
            assert!(hosts.package_allowed(ok, "github.com").is_ok(), "{ok}");
        }
        let e = hosts
            .package_allowed("https://evil.example/x.tar.gz", "github.com")
            .unwrap_err();
        assert!(e.message.contains("--download-hosts"), "{}", e.message);
        let e = hosts
            .package_allowed("http://github.com/x.tar.gz", "github.com")
            .unwrap_err();
        assert!(e.message.contains("--allow-http-hosts"), "{}", e.message);
        // The policy's own host is allowed, with its port.
        assert!(
            hosts
                .package_allowed("https://ghes.corp.example:8443/x", "ghes.corp.example:8443")
                .is_ok()
        );
    }

    #[test]
    fn versions_from_filenames() {
        assert_eq!(
            version_of_filename("actions-runner-linux-x64-2.330.0.tar.gz"),
            Some("2.330.0")
        );
        assert_eq!(version_of_filename("actions-runner-linux-x64.tar.gz"), None);
        assert_eq!(version_of_filename("nonsense"), None);
    }

    #[test]
    fn pins_latest_and_the_named_version_with_the_listed_digest() {
        let l = listing("actions-runner-linux-x64-2.330.0.tar.gz", Some(SHA));
        let p = pin_packages(&l, "latest", None).unwrap();
        assert_eq!(p.version(), "2.330.0");
        let x64 = p.get(Arch::X64).unwrap();
        assert_eq!(x64.sha256, SHA.to_ascii_lowercase());
        assert_eq!(x64.architecture, Some(Arch::X64));
        assert!(x64.url.ends_with("actions-runner-linux-x64-2.330.0.tar.gz"));
        // The osx arm64 entry is not a Linux package.
        assert_eq!(p.get(Arch::Arm64), None);
        assert_eq!(pin_packages(&l, "2.330.0", None).unwrap(), p);
        let m = pin_packages(&l, "latest", Some("https://mirror.local/runner/")).unwrap();
        assert_eq!(
            m.get(Arch::X64).unwrap().url,
            "https://mirror.local/runner/actions-runner-linux-x64-2.330.0.tar.gz"
        );
        let other = pin_packages(&l, "2.300.0", None).unwrap_err();
        assert_eq!(other.reason, PolicyReason::RunnerVersionUnresolvable);
        assert!(other.message.starts_with("spec.runner.version"));
        let no_sha = listing("actions-runner-linux-x64-2.330.0.tar.gz", None);
        assert!(pin_packages(&no_sha, "latest", None).is_err());
    }

    fn linux(arch: &str, version: &str, sha: Option<&str>) -> RunnerDownload {
        let filename = format!("actions-runner-linux-{arch}-{version}.tar.gz");
        RunnerDownload {
            os: "linux".into(),
            architecture: arch.into(),
            download_url: format!(
                "https://github.com/actions/runner/releases/download/v{version}/{filename}"
            ),
            filename,
            sha256_checksum: sha.map(str::to_owned),
        }
    }

    #[test]
    fn every_linux_architecture_with_a_digest_is_pinned_and_no_other() {
        let (a, b, c) = ("a".repeat(64), "b".repeat(64), "c".repeat(64));
        let l = vec![
            linux("arm", "2.330.0", Some(&c)),
            linux("arm64", "2.330.0", Some(&b)),
            linux("x64", "2.330.0", Some(&a)),
            // Not an architecture runner-manager places.
            linux("s390x", "2.330.0", Some(&a)),
        ];
        let p = pin_packages(&l, "latest", None).unwrap();
        assert_eq!(p.architectures(), "x64, arm64, arm");
        assert_eq!(p.get(Arch::Arm64).unwrap().sha256, b);
        assert!(
            p.get(Arch::Arm64)
                .unwrap()
                .url
                .ends_with("linux-arm64-2.330.0.tar.gz")
        );
        assert_eq!(p.get(Arch::Arm).unwrap().architecture, Some(Arch::Arm));
        // An architecture without a digest is left out; its nodes get nothing.
        let l = vec![
            linux("x64", "2.330.0", Some(&a)),
            linux("arm64", "2.330.0", None),
        ];
        let p = pin_packages(&l, "latest", None).unwrap();
        assert_eq!(p.architectures(), "x64");
        // An arm64-only listing pins arm64 alone.
        let p = pin_packages(&[linux("arm64", "2.331.0", Some(&b))], "2.331.0", None).unwrap();
        assert_eq!(
            (p.version(), p.architectures().as_str()),
            ("2.331.0", "arm64")
        );
        // A runner whose labels name an architecture runs only its package.
        let both = pin_packages(
            &[
                linux("x64", "2.330.0", Some(&a)),
                linux("arm64", "2.330.0", Some(&b)),
            ],
            "latest",
            None,
        )
        .unwrap();
        let labels = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            both.for_labels(&labels(&["self-hosted", "ARM64"]))
                .map(|p| p.architectures()),
            Some("arm64".to_owned())
        );
        assert_eq!(
            both.for_labels(&labels(&["self-hosted", "linux"])),
            Some(both.clone())
        );
        assert_eq!(both.for_labels(&labels(&["arm"])), None);
        // A listing with no Linux package says so.
        let e = pin_packages(&[], "latest", None).unwrap_err();
        assert!(e.message.contains("x64, arm64 or arm"), "{}", e.message);
    }
}
