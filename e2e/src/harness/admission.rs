//! The operator's admission webhook in a shared test cluster (issue 13, finding 3).
//!
//! The chart registers one cluster-wide `ValidatingWebhookConfiguration`. Every e2e test shares
//! one API server and runs its own operators, so a configuration registered for one test must
//! not reach another's objects: [`register`] scopes it by a `namespaceSelector` on a label only
//! this test's namespaces carry, points it at this test's operator replica by URL (the API
//! server runs on loopback beside it) with the broker CA as `caBundle`, and [`unregister`]
//! removes it. Only DELETE is never intercepted, so a leaked configuration (a failed test) holds
//! up nothing but writes to that test's own namespaces, and those namespaces still delete.
//!
//! [`agent_client`] makes requests as the agent ServiceAccount with a token bound to a
//! simulated agent pod, after [`grant_agent_rbac`] gave that account exactly the chart's rights
//! on a current server (read from `e2e/testdata/chart-agent.yaml`, rendered from the chart), or
//! [`grant_plain_manifests_agent_rbac`] those of `deploy/manifests`: the tests' agent processes use the
//! admin kubeconfig, so this is how an attack is made with a real agent token.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ServiceReference, ValidatingWebhook, ValidatingWebhookConfiguration,
    WebhookClientConfig,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Client;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};

use super::cluster::{ClusterError, created};
use super::node::{AGENT_SA, token_bound_to};

/// The label scoping a test's webhook configuration to its namespaces.
pub const SCOPE_LABEL: &str = "runner-manager.dev/e2e-admission";

fn err(e: impl std::fmt::Display) -> ClusterError {
    ClusterError::Config(e.to_string())
}

/// Label `namespaces` with `SCOPE_LABEL=scope`.
pub async fn label_namespaces(
    kube: &Client,
    namespaces: &[&str],
    scope: &str,
) -> Result<(), ClusterError> {
    let api = Api::<Namespace>::all(kube.clone());
    for ns in namespaces {
        let patch = serde_json::json!({"metadata": {"labels": {SCOPE_LABEL: scope}}});
        api.patch(ns, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(())
}

/// A registered configuration, removed when dropped (also when the test fails), from a thread
/// of its own with a client of its own: the test's runtime may be the one unwinding.
#[derive(Debug)]
pub struct Registered {
    pub name: String,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                if let Ok(config) = kube::Config::infer().await
                    && let Ok(kube) = Client::try_from(config)
                {
                    let _ = unregister(&kube, &name).await;
                }
            });
        })
        .join();
    }
}

/// Register `name`: the operator's two webhooks at `https://<admission>/admission/…` (the
/// replica's admission listener), `failurePolicy: Fail`, the broker CA (from `system`'s CA ConfigMap) as
/// `caBundle`, for namespaces labelled `SCOPE_LABEL=scope` only. Waits until it answers.
pub async fn register(
    kube: &Client,
    name: &str,
    system: &str,
    admission: &str,
    scope: &str,
) -> Result<Registered, ClusterError> {
    let ca = Api::<ConfigMap>::namespaced(kube.clone(), system)
        .get(runner_manager_operator::broker::tls::CA_CONFIGMAP)
        .await?
        .data
        .and_then(|d| d.get("ca.crt").cloned())
        .ok_or_else(|| err("the broker CA ConfigMap has no ca.crt"))?;
    let selector = LabelSelector {
        match_labels: Some([(SCOPE_LABEL.to_owned(), scope.to_owned())].into()),
        ..LabelSelector::default()
    };
    let hook = |hook: &str, path: &str, group: &str, resources: Vec<String>| ValidatingWebhook {
        name: hook.to_owned(),
        admission_review_versions: vec!["v1".to_owned()],
        side_effects: "None".to_owned(),
        failure_policy: Some("Fail".to_owned()),
        timeout_seconds: Some(5),
        client_config: WebhookClientConfig {
            url: Some(format!("https://{admission}{path}")),
            ca_bundle: Some(ByteString(ca.clone().into_bytes())),
            service: None::<ServiceReference>,
        },
        rules: Some(vec![RuleWithOperations {
            api_groups: Some(vec![group.to_owned()]),
            api_versions: Some(vec!["*".to_owned()]),
            resources: Some(resources),
            operations: Some(vec!["CREATE".to_owned(), "UPDATE".to_owned()]),
            scope: Some("Namespaced".to_owned()),
        }]),
        namespace_selector: Some(selector.clone()),
        ..ValidatingWebhook::default()
    };
    let config = ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![
            hook(
                "runnerattempts.runner-manager.dev",
                "/admission/runnerattempts",
                "runner-manager.dev",
                vec!["runnerattempts".into(), "runnerattempts/status".into()],
            ),
            hook(
                "leases.runner-manager.dev",
                "/admission/leases",
                "coordination.k8s.io",
                vec!["leases".into()],
            ),
        ]),
    };
    Api::<ValidatingWebhookConfiguration>::all(kube.clone())
        .create(&PostParams::default(), &config)
        .await?;
    Ok(Registered {
        name: name.to_owned(),
    })
}

/// Remove `name` (idempotent).
pub async fn unregister(kube: &Client, name: &str) -> Result<(), ClusterError> {
    match Api::<ValidatingWebhookConfiguration>::all(kube.clone())
        .delete(name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The chart's agent rights and agent-pods policy as a current (1.30+) server renders them
/// (`e2e/render-manifests.sh` writes it from the chart).
const CHART_AGENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/chart-agent.yaml");
/// The plain manifests (`deploy/manifests`), rendered for the oldest supported server.
const PLAIN_MANIFESTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../deploy/manifests/runner-manager.yaml"
);

fn chart_rules(path: &str, kind: &str, name_suffix: &str) -> Result<Vec<PolicyRule>, ClusterError> {
    let text = std::fs::read_to_string(path).map_err(err)?;
    for doc in serde_norway::Deserializer::from_str(&text) {
        let v: serde_json::Value = match serde::Deserialize::deserialize(doc) {
            Ok(v) => v,
            Err(_) => continue,
        };
        let name = v["metadata"]["name"].as_str().unwrap_or_default();
        if v["kind"] == kind && name.ends_with(name_suffix) {
            return serde_json::from_value(v["rules"].clone()).map_err(err);
        }
    }
    Err(err(format!("no {kind} *{name_suffix} in {path}")))
}

/// Give the agent ServiceAccount of `system` exactly the chart's node-agent rights on a current
/// server (its ClusterRole and its Role in the system namespace, as `e2e/testdata/chart-agent.yaml`
/// renders them), under names unique to `system`.
pub async fn grant_agent_rbac(kube: &Client, system: &str) -> Result<(), ClusterError> {
    grant_agent_rbac_from(kube, system, CHART_AGENT).await
}

/// The same with the rights of the plain manifests (`deploy/manifests`).
pub async fn grant_plain_manifests_agent_rbac(
    kube: &Client,
    system: &str,
) -> Result<(), ClusterError> {
    grant_agent_rbac_from(kube, system, PLAIN_MANIFESTS).await
}

async fn grant_agent_rbac_from(
    kube: &Client,
    system: &str,
    path: &str,
) -> Result<(), ClusterError> {
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: AGENT_SA.into(),
        namespace: Some(system.into()),
        ..Subject::default()
    };
    let name = format!("e2e-agent-{system}");
    let meta = |ns: Option<&str>| ObjectMeta {
        name: Some(name.clone()),
        namespace: ns.map(str::to_owned),
        ..ObjectMeta::default()
    };
    let role_ref = |kind: &str| RoleRef {
        api_group: "rbac.authorization.k8s.io".into(),
        kind: kind.into(),
        name: name.clone(),
    };
    let cluster_role = ClusterRole {
        metadata: meta(None),
        rules: Some(chart_rules(path, "ClusterRole", "-system-node-agent")?),
        ..ClusterRole::default()
    };
    created(Api::all(kube.clone()), &cluster_role).await?;
    let cluster_binding = ClusterRoleBinding {
        metadata: meta(None),
        role_ref: role_ref("ClusterRole"),
        subjects: Some(vec![subject.clone()]),
    };
    created(Api::all(kube.clone()), &cluster_binding).await?;
    let role = Role {
        metadata: meta(Some(system)),
        rules: Some(chart_rules(path, "Role", "runner-manager-node-agent")?),
    };
    created(Api::namespaced(kube.clone(), system), &role).await?;
    let binding = RoleBinding {
        metadata: meta(Some(system)),
        role_ref: role_ref("Role"),
        subjects: Some(vec![subject]),
    };
    created(Api::namespaced(kube.clone(), system), &binding).await?;
    Ok(())
}

/// A client that authenticates as `sa` of `system` with a token bound to `pod` for the API
/// server's own audience — what an agent pod's projected token is.
pub async fn pod_bound_client(
    kube: &Client,
    system: &str,
    sa: &str,
    pod: &Pod,
) -> Result<Client, ClusterError> {
    let token = token_bound_to(kube, system, pod, sa, Vec::new()).await?;
    token_client(&token).await
}

/// A client with the kubeconfig's cluster and `token` as its only credential.
pub async fn token_client(token: &str) -> Result<Client, ClusterError> {
    let mut config = kube::Config::infer().await.map_err(err)?;
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.to_owned().into()),
        ..kube::config::AuthInfo::default()
    };
    Ok(Client::try_from(config)?)
}

/// The agent ServiceAccount's client for `pod` (a simulated agent pod of `system`).
pub async fn agent_client(kube: &Client, system: &str, pod: &Pod) -> Result<Client, ClusterError> {
    pod_bound_client(kube, system, AGENT_SA, pod).await
}

/// `labels` as a map (helper for callers building objects).
pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}
