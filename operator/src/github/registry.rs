//! GitHub clients for policies: one per target and credentials Secret (policies of one repository
//! and one Secret share it, with its ETags and its shared runner list), reused while the Secret's
//! resourceVersion stays the same. Every client shares the process's one HTTP client, and every
//! client of one Secret at one installation (an organisation, user or enterprise) shares its
//! installation token and its rate-limit budget.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use runner_manager_crds::policy::ScalePolicy;
use runner_manager_crds::target::{GitHubTarget, TargetKind};

use super::auth::{Credentials, CredentialsError};
use super::client::{GitHubClient, GitHubConfig, SharedCredential, http_client};
use super::errors::GitHubError;
use super::recent::Recent;
use super::scaleset::{ScaleSetClient, ScaleSetError};

/// Why a policy has no usable client. Messages name the object and key, never a value.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("ScalePolicy {0} not found")]
    NoPolicy(String),
    #[error("Secret {0} (spec.github.credentialsSecretRef) not found in the policy's namespace")]
    NoSecret(String),
    #[error("Secret {secret}: {error}")]
    BadSecret {
        secret: String,
        error: CredentialsError,
    },
    #[error("spec.github.url: {0}")]
    BadUrl(String),
    #[error("API server: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    GitHub(#[from] GitHubError),
}

/// Which Secret, at which version: a changed Secret makes new clients and a new token.
#[derive(Clone, PartialEq, Eq, Hash)]
struct SecretKey {
    namespace: String,
    secret: String,
    version: String,
}

/// The clients made so far and the credential state they share.
#[derive(Default)]
struct Made {
    /// By Secret and target URL.
    clients: HashMap<(SecretKey, String), Arc<GitHubClient>>,
    /// By Secret and installation owner (GitHub mints installation tokens per installation).
    credentials: HashMap<(SecretKey, String), Arc<SharedCredential>>,
}

/// The clients of every policy seen.
pub struct Clients {
    kube: kube::Client,
    config: GitHubConfig,
    /// Built on first use (TLS roots are loaded then), then shared by every client.
    http: Mutex<Option<reqwest::Client>>,
    made: Mutex<Made>,
    /// Credentials Secrets by namespace and name, each read at most once per `SECRET_MAX_AGE`.
    secrets: Mutex<HashMap<(String, String), Arc<SecretRead>>>,
    /// `--github-hosts`: where an Actions service URL GitHub returns may be (None: unchecked).
    github_hosts: Option<runner_manager_crds::hosts::HostList>,
    /// Scale-set clients by REST client and scale-set name, with the set's id once known.
    scale_sets: Mutex<ScaleSets>,
}

/// A scale set's id once found, behind an async lock so concurrent first users (the broker's
/// first mints of a burst) look it up once.
type SetId = Arc<tokio::sync::Mutex<Option<i64>>>;
type ScaleSets = HashMap<(usize, String), (Arc<ScaleSetClient>, SetId)>;

/// The last read of one Secret (None: not found).
type SecretRead = Recent<Option<Secret>>;

/// How long a Secret read serves every policy that names it: the policies of one Secret resolve
/// within moments of each other (a start, a failover), and a rotation is seen seconds later.
const SECRET_MAX_AGE: Duration = Duration::from_secs(5);

/// The installation a target's calls authenticate against.
fn installation_owner(target: &GitHubTarget) -> String {
    match &target.kind {
        TargetKind::Repository { owner, .. } => format!("owner/{}", owner.to_ascii_lowercase()),
        TargetKind::Organization { org } => format!("owner/{}", org.to_ascii_lowercase()),
        TargetKind::Enterprise { enterprise } => {
            format!("enterprise/{}", enterprise.to_ascii_lowercase())
        }
    }
}

impl std::fmt::Debug for Clients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clients")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Clients {
    pub fn new(kube: kube::Client, config: GitHubConfig) -> Self {
        Self {
            kube,
            config,
            http: Mutex::new(None),
            made: Mutex::new(Made::default()),
            secrets: Mutex::new(HashMap::new()),
            github_hosts: None,
            scale_sets: Mutex::new(HashMap::new()),
        }
    }

    /// Check every Actions service and message-queue URL against `--github-hosts`.
    pub fn with_github_hosts(mut self, hosts: runner_manager_crds::hosts::HostList) -> Self {
        self.github_hosts = Some(hosts);
        self
    }

    /// The scale-set client of `gh` (sharing its admin token with every user in this process)
    /// and the id of its scale set `name`, found or created with `labels` in `group` once.
    pub async fn scale_set(
        &self,
        gh: &Arc<GitHubClient>,
        name: &str,
        group: i64,
        labels: &[String],
    ) -> Result<(Arc<ScaleSetClient>, i64), ScaleSetError> {
        let (client, cell) = self.scale_set_entry(gh, name);
        let mut id = cell.lock().await;
        if let Some(id) = *id
            && !client.is_missing(id)
        {
            return Ok((client, id));
        }
        let set = client.ensure_scale_set(name, group, labels).await?;
        client.found(set.id);
        *id = Some(set.id);
        Ok((client, set.id))
    }

    fn scale_set_entry(&self, gh: &Arc<GitHubClient>, name: &str) -> (Arc<ScaleSetClient>, SetId) {
        let key = (Arc::as_ptr(gh) as usize, name.to_owned());
        let mut sets = lock(&self.scale_sets);
        // A client made for an older REST client (a rotated Secret) goes with it.
        sets.retain(|(_, n), (c, _)| n != name || Arc::ptr_eq(c.rest(), gh));
        sets.entry(key)
            .or_insert_with(|| {
                let mut c = ScaleSetClient::new(gh.clone());
                if let Some(hosts) = &self.github_hosts {
                    c = c.with_hosts(hosts.clone(), self.config.http_hosts.clone());
                }
                (Arc::new(c), SetId::default())
            })
            .clone()
    }

    /// The scale-set client of `gh` for set `name`, without finding or creating the set (its
    /// deletion).
    pub fn scale_set_client(&self, gh: &Arc<GitHubClient>, name: &str) -> Arc<ScaleSetClient> {
        self.scale_set_entry(gh, name).0
    }

    /// The listener's start: the policy's scale set made to match the policy. The set recorded
    /// on the policy (`known`) is read by id, else found by group and name or created; a set
    /// whose labels or runner group differ from the policy's is updated in place (`PATCH`, as
    /// actions-runner-controller does), keeping its id, runners and queue. Returns the set's id.
    pub async fn reconcile_scale_set(
        &self,
        gh: &Arc<GitHubClient>,
        name: &str,
        group: i64,
        labels: &[String],
        known: Option<i64>,
    ) -> Result<(Arc<ScaleSetClient>, i64), ScaleSetError> {
        let (client, cell) = self.scale_set_entry(gh, name);
        let mut id = cell.lock().await;
        // The recorded id is only a hint: a set of another name is never this policy's.
        let mut set = match known.or(*id) {
            Some(k) => client.own_scale_set(k, name).await?,
            None => None,
        };
        if set.is_none() {
            set = Some(client.ensure_scale_set(name, group, labels).await?);
        }
        let Some(mut set) = set else {
            return Err(ScaleSetError::Malformed);
        };
        // A set found by name carries its labels only when GitHub lists them; read it whole.
        if set.labels.is_empty()
            && let Some(full) = client.get_scale_set(set.id).await?
        {
            set = full;
        }
        if !set.matches(group, labels) {
            tracing::info!(
                scale_set = set.id,
                "the policy's labels or runner group changed: updating its scale set"
            );
            set = client.update_scale_set(set.id, name, group, labels).await?;
        }
        client.found(set.id);
        *id = Some(set.id);
        Ok((client, set.id))
    }

    /// Forget a scale set's id (it was deleted on GitHub's side: the next use finds or creates
    /// it again).
    pub fn forget_scale_set(&self, gh: &Arc<GitHubClient>, name: &str) {
        if let Some(e) =
            lock(&self.scale_sets).get_mut(&(Arc::as_ptr(gh) as usize, name.to_owned()))
        {
            e.1 = SetId::default();
        }
    }

    /// The client of a policy, made or reused.
    pub async fn for_policy(
        &self,
        namespace: &str,
        policy: &str,
    ) -> Result<Arc<GitHubClient>, ClientError> {
        let policy_obj = Api::<ScalePolicy>::namespaced(self.kube.clone(), namespace)
            .get_opt(policy)
            .await?
            .ok_or_else(|| ClientError::NoPolicy(policy.to_owned()))?;
        let secret_name = policy_obj.spec.github.credentials_secret_ref.name.clone();
        let secret = Api::<Secret>::namespaced(self.kube.clone(), namespace)
            .get_opt(&secret_name)
            .await?
            .ok_or_else(|| ClientError::NoSecret(secret_name.clone()))?;
        self.for_secret(namespace, &policy_obj.spec.github.url, &secret)
    }

    /// A credentials Secret (None: not found), shared by every policy that names it.
    pub async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, kube::Error> {
        let slot = lock(&self.secrets)
            .entry((namespace.to_owned(), name.to_owned()))
            .or_default()
            .clone();
        let secret = slot
            .get(SECRET_MAX_AGE, || async {
                Api::<Secret>::namespaced(self.kube.clone(), namespace)
                    .get_opt(name)
                    .await
            })
            .await?;
        Ok(secret.as_ref().clone())
    }

    /// The client for a policy whose URL and credentials Secret the caller has already read (the
    /// controllers hold the policy in their cache and read the Secret once per resolution).
    pub fn for_secret(
        &self,
        namespace: &str,
        url: &str,
        secret: &Secret,
    ) -> Result<Arc<GitHubClient>, ClientError> {
        let secret_name = secret.metadata.name.clone().unwrap_or_default();
        let key = SecretKey {
            namespace: namespace.to_owned(),
            secret: secret_name.clone(),
            version: secret.metadata.resource_version.clone().unwrap_or_default(),
        };
        let client_key = (key.clone(), url.to_owned());
        if let Some(c) = lock(&self.made).clients.get(&client_key) {
            return Ok(c.clone());
        }
        let credentials = Credentials::from_secret_data(&secret.data.clone().unwrap_or_default())
            .map_err(|error| ClientError::BadSecret {
            secret: secret_name,
            error,
        })?;
        let target = GitHubTarget::parse(url).map_err(|e| ClientError::BadUrl(e.to_string()))?;
        let http = {
            let mut http = lock(&self.http);
            match http.as_ref() {
                Some(h) => h.clone(),
                None => {
                    let h = http_client(&self.config)?;
                    *http = Some(h.clone());
                    h
                }
            }
        };
        let mut made = lock(&self.made);
        // Entries of an older version of this Secret are dropped with it.
        made.clients.retain(|(k, _), _| {
            k.namespace != key.namespace || k.secret != key.secret || k.version == key.version
        });
        made.credentials.retain(|(k, _), _| {
            k.namespace != key.namespace || k.secret != key.secret || k.version == key.version
        });
        let shared = made
            .credentials
            .entry((key, installation_owner(&target)))
            .or_insert_with(|| Arc::new(SharedCredential::new(&credentials)))
            .clone();
        let client = made
            .clients
            .entry(client_key)
            .or_insert_with(|| {
                Arc::new(GitHubClient::sharing(
                    target,
                    credentials,
                    self.config.clone(),
                    http,
                    shared,
                ))
            })
            .clone();
        Ok(client)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
