//! The operator applies its own CRDs at start with server-side apply under its field manager,
//! so `helm upgrade` (which never upgrades a chart's `crds/`) cannot leave old ones behind.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::api::{Api, Patch, PatchParams};
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::policy::ScalePolicy;

/// Why the CRDs could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    #[error("applying CRD {0}: {1}")]
    Apply(String, kube::Error),
    #[error("CRD {0} did not become Established within {1:?}")]
    NotEstablished(String, Duration),
}

/// Apply both CRDs as `field_manager` (forcing ownership of the fields it sets) and wait until
/// the API server serves them.
pub async fn apply_crds(
    client: &kube::Client,
    field_manager: &str,
    within: Duration,
) -> Result<(), CrdError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(field_manager).force();
    for crd in [ScalePolicy::crd(), RunnerAttempt::crd()] {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(&crd))
            .await
            .map_err(|e| CrdError::Apply(name.clone(), e))?;
        let established = kube::runtime::wait::conditions::is_crd_established();
        let wait = kube::runtime::wait::await_condition(api.clone(), &name, established);
        match tokio::time::timeout(within, wait).await {
            Ok(Ok(_)) => {}
            _ => return Err(CrdError::NotEstablished(name, within)),
        }
    }
    Ok(())
}
