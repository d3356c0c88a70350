//! The control plane under test: a client from `KUBECONFIG` (or why the test is skipped), the
//! project's CRDs installed by server-side apply, and a fresh namespace per test.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

/// Field manager of everything the harness applies.
pub const FIELD_MANAGER: &str = "runner-manager-e2e";

/// Why the harness could not set up.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("{0}")]
    Config(String),
    #[error("API server: {0}")]
    Kube(#[from] kube::Error),
}

/// A client for the API server `KUBECONFIG` points at, or `None` (with the reason printed) when
/// it is unset, so a bare `cargo test` passes on a machine without a control plane.
pub async fn client_or_skip(test: &str) -> Result<Option<Client>, ClusterError> {
    if std::env::var_os("KUBECONFIG").is_none() {
        eprintln!(
            "SKIP {test}: KUBECONFIG is not set (run `make test`, or start e2e/control-plane/up.sh and export KUBECONFIG)"
        );
        return Ok(None);
    }
    install_crypto_provider();
    let config = kube::Config::infer()
        .await
        .map_err(|e| ClusterError::Config(e.to_string()))?;
    Ok(Some(Client::try_from(config)?))
}

/// Select aws-lc-rs as the process's TLS crypto provider. The workspace builds rustls with it
/// alone, but a dependency enabling a second provider would make rustls refuse to choose, so
/// every entry point says which. Installing twice is a no-op.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// The project's CRDs, applied server-side the way the operator applies them at start, and
/// waited on until Established.
pub async fn install_crds(client: &Client) -> Result<(), ClusterError> {
    runner_manager_operator::crd_apply::apply_crds(client, FIELD_MANAGER, Duration::from_secs(30))
        .await
        .map_err(|e| ClusterError::Config(e.to_string()))
}

/// A new namespace named after the test, unique per run.
/// `object` created through `api` (the test's own objects: RBAC, service accounts).
pub async fn created<K>(api: Api<K>, object: &K) -> Result<K, kube::Error>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.create(&PostParams::default(), object).await
}

pub async fn fresh_namespace(client: &Client, prefix: &str) -> Result<String, ClusterError> {
    let name = format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    Ok(name)
}

/// Every object `api` lists (a failed list fails the test).
pub async fn list_all<K>(api: &kube::Api<K>) -> Vec<K>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&kube::api::ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("listing: {e}"))
        .items
}
