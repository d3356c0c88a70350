//! GitHub clients per policy: the policy's target and the credentials of its Secret. A client is
//! reused while the Secret's resourceVersion and the URL stay the same, so its installation token
//! cache and ETags survive from one call to the next.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use runner_manager_crds::policy::ScalePolicy;
use runner_manager_crds::target::GitHubTarget;

use super::auth::{Credentials, CredentialsError};
use super::client::{GitHubClient, GitHubConfig};
use super::errors::GitHubError;

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

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    namespace: String,
    policy: String,
}

struct Entry {
    url: String,
    secret_version: String,
    client: Arc<GitHubClient>,
}

/// The clients of every policy seen.
pub struct Clients {
    kube: kube::Client,
    config: GitHubConfig,
    cache: Mutex<HashMap<Key, Entry>>,
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
            cache: Mutex::new(HashMap::new()),
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
        self.for_secret(namespace, policy, &policy_obj.spec.github.url, &secret)
    }

    /// The client for a policy whose URL and credentials Secret the caller has already read (the
    /// controllers hold the policy in their cache and read the Secret once per resolution).
    pub fn for_secret(
        &self,
        namespace: &str,
        policy: &str,
        url: &str,
        secret: &Secret,
    ) -> Result<Arc<GitHubClient>, ClientError> {
        let secret_name = secret.metadata.name.clone().unwrap_or_default();
        let version = secret.metadata.resource_version.clone().unwrap_or_default();
        let url = url.to_owned();
        let key = Key {
            namespace: namespace.to_owned(),
            policy: policy.to_owned(),
        };
        {
            let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(e) = cache.get(&key)
                && e.url == url
                && e.secret_version == version
            {
                return Ok(e.client.clone());
            }
        }
        let credentials = Credentials::from_secret_data(&secret.data.clone().unwrap_or_default())
            .map_err(|error| ClientError::BadSecret {
            secret: secret_name,
            error,
        })?;
        let target = GitHubTarget::parse(&url).map_err(|e| ClientError::BadUrl(e.to_string()))?;
        let client = Arc::new(GitHubClient::new(target, credentials, self.config.clone())?);
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                key,
                Entry {
                    url,
                    secret_version: version,
                    client: client.clone(),
                },
            );
        Ok(client)
    }
}
