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

/// With `--apply-crds=false` another owner applies the CRDs (Argo CD syncing the chart,
/// `kubectl apply -f crds/`; issue 33 item 5: one owner): the operator only reads them, once at
/// start, and says whether they can hold what it writes. A CRD older than the operator lacks the
/// fields this version added, and the API server prunes those from every object written —
/// silently, so nothing else would tell. Each problem names the CRD and the field.
pub async fn check_crds(client: &kube::Client) -> Result<Vec<String>, kube::Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut problems = Vec::new();
    for ours in [ScalePolicy::crd(), RunnerAttempt::crd()] {
        let name = ours.metadata.name.clone().unwrap_or_default();
        match api.get_opt(&name).await? {
            None => problems.push(format!("CRD {name} is not installed")),
            Some(served) => problems.extend(
                stale_fields(&served, &ours)
                    .into_iter()
                    .map(|f| format!("{name}: {f}")),
            ),
        }
    }
    Ok(problems)
}

/// What `ours` has that `served` lacks: a version it does not serve, or a field path of a
/// version's schema (`v1alpha1 .spec.snapshot.runner.architecture`). Pure.
pub fn stale_fields(
    served: &CustomResourceDefinition,
    ours: &CustomResourceDefinition,
) -> Vec<String> {
    let schema = |v: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinitionVersion| {
        v.schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .and_then(|s| serde_json::to_value(s).ok())
            .unwrap_or(serde_json::Value::Null)
    };
    let mut missing = Vec::new();
    for version in &ours.spec.versions {
        match served.spec.versions.iter().find(|v| v.name == version.name) {
            None => missing.push(format!("version {} is not served", version.name)),
            Some(s) => {
                let mut paths = Vec::new();
                missing_paths(&schema(s), &schema(version), "", &mut paths);
                missing.extend(paths.into_iter().map(|p| format!("{} {p}", version.name)));
            }
        }
    }
    missing
}

/// The property paths of schema `ours` that schema `served` would prune. Under
/// `x-kubernetes-preserve-unknown-fields` nothing is pruned.
fn missing_paths(
    served: &serde_json::Value,
    ours: &serde_json::Value,
    at: &str,
    out: &mut Vec<String>,
) {
    if served
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(serde_json::Value::as_bool)
        == Some(true)
    {
        return;
    }
    if let Some(props) = ours
        .get("properties")
        .and_then(serde_json::Value::as_object)
    {
        for (key, sub) in props {
            let path = format!("{at}.{key}");
            match served.get("properties").and_then(|p| p.get(key)) {
                None => out.push(path),
                Some(theirs) => missing_paths(theirs, sub, &path, out),
            }
        }
    }
    for nested in ["items", "additionalProperties"] {
        if let (Some(sub), Some(theirs)) = (ours.get(nested), served.get(nested))
            && sub.is_object()
        {
            missing_paths(theirs, sub, &format!("{at}[]"), out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crd_older_than_the_operator_names_each_field_it_would_prune() {
        let ours = RunnerAttempt::crd();
        assert!(
            stale_fields(&ours, &ours).is_empty(),
            "the same CRD is current"
        );
        // An older CRD: its runner package has no `architecture`.
        let mut old = serde_json::to_value(&ours).unwrap();
        let runner = old
            .pointer_mut(
                "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/snapshot/properties/runner/properties",
            )
            .and_then(serde_json::Value::as_object_mut)
            .unwrap();
        assert!(runner.remove("architecture").is_some());
        let old: CustomResourceDefinition = serde_json::from_value(old).unwrap();
        assert_eq!(
            stale_fields(&old, &ours),
            ["v1alpha1 .spec.snapshot.runner.architecture"]
        );
        // Newer than the operator is fine: nothing the operator writes is pruned.
        assert!(stale_fields(&ours, &old).is_empty());
        // A version the served CRD lacks.
        let mut other = old.clone();
        other.spec.versions[0].name = "v1beta1".into();
        assert_eq!(
            stale_fields(&other, &ours),
            ["version v1alpha1 is not served"]
        );
    }

    #[test]
    fn nothing_is_pruned_under_preserve_unknown_fields() {
        let served = serde_json::json!({"properties": {"a": {"x-kubernetes-preserve-unknown-fields": true}}});
        let ours = serde_json::json!({"properties": {"a": {"properties": {"b": {}}}, "c": {}}});
        let mut out = Vec::new();
        missing_paths(&served, &ours, "", &mut out);
        assert_eq!(out, [".c"]);
    }
}
