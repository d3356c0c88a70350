//! Simulated nodes: there is no kubelet on the test control plane, so a "node" is a Node object
//! (with labels, so `nodeSelector` works), the agents' service account, one agent Pod bound to the
//! node (it stays Pending forever) and a service-account token bound to that Pod with the broker's
//! audience — exactly what the broker checks (DESIGN §5: "the harness creates a Pod object per
//! simulated node and hands each agent a token bound to it").
//!
//! The broker also requires the pod to be controlled by the agent DaemonSet (by uid) and the
//! request to come from the pod's IP. So the harness creates that DaemonSet object too, makes it
//! the controller of every agent Pod, and reports each Pod's IP as 127.0.0.1 (through the status
//! subresource, as a kubelet would), where the agent processes of the tests run. The test control
//! plane runs no DaemonSet controller (`e2e/control-plane/start.sh`): without kubelets it could
//! only delete or disown these hand-made pods.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec, PodTemplateSpec, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use runner_manager_crds::broker::BROKER_AUDIENCE;

use super::cluster::ClusterError;

/// The agents' service account, as the chart names it (the operator's default
/// `--agent-service-account`).
pub const AGENT_SA: &str = "runner-manager-node-agent";

/// The agent DaemonSet, as the chart names it (the operator's default `--agent-daemonset`).
pub const AGENT_DAEMONSET: &str = "runner-manager-node-agent";

/// Where the tests' agent processes run, so what their pods report as `status.podIP`.
pub const AGENT_POD_IP: &str = "127.0.0.1";

/// Labels every agent Pod carries (the operator's default `--agent-pod-selector`).
pub fn agent_pod_labels() -> BTreeMap<String, String> {
    [(
        "app.kubernetes.io/component".to_owned(),
        "node-agent".to_owned(),
    )]
    .into()
}

/// A Node object with `labels`. Nodes are cluster-scoped: callers give unique names (see
/// [`unique_node_name`]).
pub async fn create_node(
    kube: &Client,
    name: &str,
    labels: BTreeMap<String, String>,
) -> Result<Node, ClusterError> {
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    Ok(Api::<Node>::all(kube.clone())
        .create(&PostParams::default(), &node)
        .await?)
}

/// `<prefix>-<8 hex>`: a node name no other test run uses.
pub fn unique_node_name(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// The agents' service account in the system namespace (idempotent).
pub async fn ensure_agent_service_account(kube: &Client, system: &str) -> Result<(), ClusterError> {
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(AGENT_SA.into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    match Api::<ServiceAccount>::namespaced(kube.clone(), system)
        .create(&PostParams::default(), &sa)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A DaemonSet named `name` in `ns` whose pods carry `labels` (idempotent: an existing one is
/// returned). Its nodeSelector matches no node: it is an owner to point pods at, never a
/// creator of pods.
pub async fn ensure_daemonset(
    kube: &Client,
    ns: &str,
    name: &str,
    labels: BTreeMap<String, String>,
) -> Result<DaemonSet, ClusterError> {
    let api = Api::<DaemonSet>::namespaced(kube.clone(), ns);
    let ds = DaemonSet {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    node_selector: Some(
                        [(
                            "runner-manager.dev/e2e-no-such-node".to_owned(),
                            "true".to_owned(),
                        )]
                        .into(),
                    ),
                    service_account_name: Some(AGENT_SA.into()),
                    containers: vec![agent_container()],
                    ..PodSpec::default()
                }),
            },
            ..DaemonSetSpec::default()
        }),
        ..DaemonSet::default()
    };
    match api.create(&PostParams::default(), &ds).await {
        Ok(ds) => Ok(ds),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(api.get(name).await?),
        Err(e) => Err(e.into()),
    }
}

/// The agent DaemonSet in the system namespace (idempotent).
pub async fn ensure_agent_daemonset(
    kube: &Client,
    system: &str,
) -> Result<DaemonSet, ClusterError> {
    ensure_daemonset(kube, system, AGENT_DAEMONSET, agent_pod_labels()).await
}

/// The controller reference a DaemonSet's pods carry.
pub fn controller_ref(ds: &DaemonSet) -> Result<OwnerReference, ClusterError> {
    Ok(OwnerReference {
        api_version: "apps/v1".into(),
        kind: "DaemonSet".into(),
        name: ds.metadata.name.clone().unwrap_or_default(),
        uid: ds
            .metadata
            .uid
            .clone()
            .ok_or_else(|| ClusterError::Config("the DaemonSet has no uid".into()))?,
        controller: Some(true),
        block_owner_deletion: None,
    })
}

/// Reports `ip` as the pod's IP, as the kubelet would once the pod runs.
pub async fn set_pod_ip(kube: &Client, pod: &Pod, ip: &str) -> Result<Pod, ClusterError> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let patch = serde_json::json!({"status": {"podIP": ip, "podIPs": [{"ip": ip}]}});
    Ok(Api::<Pod>::namespaced(kube.clone(), &ns)
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?)
}

/// The agent Pod of `node` (`agent-<node>`), bound to the node, with the agents' labels,
/// controlled by the agent DaemonSet and reporting [`AGENT_POD_IP`].
pub async fn create_agent_pod(
    kube: &Client,
    system: &str,
    node: &str,
) -> Result<Pod, ClusterError> {
    let ds = ensure_agent_daemonset(kube, system).await?;
    agent_pod(
        kube,
        system,
        &agent_pod_name(node),
        node,
        AGENT_SA,
        agent_pod_labels(),
        Some(&ds),
    )
    .await
}

/// A pod `name` in `ns` as the harness makes agents' pods — bound to `node`, running as `sa`,
/// with `labels`, controlled by `owner` (when given) — reporting [`AGENT_POD_IP`], the address
/// the tests' agents call from. The broker suite makes impostors with it.
pub async fn agent_pod(
    kube: &Client,
    ns: &str,
    name: &str,
    node: &str,
    sa: &str,
    labels: BTreeMap<String, String>,
    owner: Option<&DaemonSet>,
) -> Result<Pod, ClusterError> {
    let owner_references = match owner {
        Some(ds) => Some(vec![controller_ref(ds)?]),
        None => None,
    };
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels),
            owner_references,
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            service_account_name: Some(sa.into()),
            containers: vec![agent_container()],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    let created = Api::<Pod>::namespaced(kube.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await?;
    set_pod_ip(kube, &created, AGENT_POD_IP).await
}

/// `agent-<node>`.
pub fn agent_pod_name(node: &str) -> String {
    format!("agent-{node}")
}

/// The (never run) agent container of the DaemonSet and of the simulated agent pods.
fn agent_container() -> Container {
    Container {
        name: "agent".into(),
        image: Some("runner-manager/node-agent:test".into()),
        ..Container::default()
    }
}

/// A token for `sa`, bound to `pod`, for `audience` (one hour).
pub async fn bound_token(
    kube: &Client,
    system: &str,
    pod: &Pod,
    sa: &str,
    audience: &str,
) -> Result<String, ClusterError> {
    token_bound_to(kube, system, pod, sa, vec![audience.into()]).await
}

/// A token for `sa`, bound to `pod`, for `audiences` (none: the API server's own), one hour.
pub async fn token_bound_to(
    kube: &Client,
    system: &str,
    pod: &Pod,
    sa: &str,
    audiences: Vec<String>,
) -> Result<String, ClusterError> {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences,
            bound_object_ref: Some(BoundObjectReference {
                kind: Some("Pod".into()),
                api_version: Some("v1".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
            expiration_seconds: Some(3600),
        },
        ..TokenRequest::default()
    };
    Api::<ServiceAccount>::namespaced(kube.clone(), system)
        .create_token_request(sa, &PostParams::default(), &request)
        .await?
        .status
        .map(|s| s.token)
        .ok_or_else(|| ClusterError::Config("TokenRequest answered without a token".into()))
}

/// One simulated node: its Node object, its agent Pod and a broker token file for its agent.
#[derive(Debug)]
pub struct SimNode {
    pub name: String,
    pub pod: Pod,
    /// The agent's `--broker-token-file` (0600).
    pub token_file: PathBuf,
}

impl SimNode {
    /// Create the Node (with `labels`), the agents' service account if missing, the agent Pod,
    /// and write a bound broker token to `<dir>/broker-token`.
    pub async fn create(
        kube: &Client,
        system: &str,
        name: &str,
        labels: BTreeMap<String, String>,
        dir: &Path,
    ) -> Result<Self, ClusterError> {
        create_node(kube, name, labels).await?;
        ensure_agent_service_account(kube, system).await?;
        let pod = create_agent_pod(kube, system, name).await?;
        let token = bound_token(kube, system, &pod, AGENT_SA, BROKER_AUDIENCE).await?;
        std::fs::create_dir_all(dir).map_err(|e| ClusterError::Config(e.to_string()))?;
        let token_file = dir.join("broker-token");
        write_private(&token_file, token.as_bytes())
            .map_err(|e| ClusterError::Config(format!("{}: {e}", token_file.display())))?;
        Ok(Self {
            name: name.to_owned(),
            pod,
            token_file,
        })
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}
