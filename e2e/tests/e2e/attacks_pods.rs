//! Issue 16 item 2: the node agent creates pods (OCI runners, placeholders of native runners),
//! and its pod rights are confined to exactly those pods on its own node. The chart's RBAC (read
//! from `deploy/manifests`) gives the agent ServiceAccount create and delete on pods; the chart's
//! agent-pods ValidatingAdmissionPolicy (also from `deploy/manifests`, rewritten for this test's
//! system namespace) confines them. The requests are made with a token bound to simulated agent
//! pod A, as a compromised node A would make them: every pod but the convention's on node A is
//! refused, and A cannot delete pods that are not its own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, HostPathVolumeSource, Pod, SecurityContext, Volume, VolumeMount,
};
use kube::api::{Api, DeleteParams, PostParams};
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_e2e::harness::admission::{
    agent_client, grant_agent_rbac, install_agent_pod_policy,
};
use runner_manager_e2e::harness::fixtures::native_attempt;
use runner_manager_e2e::harness::wait;
use runner_manager_e2e::harness::world::World;
use runner_manager_node_agent::agent::placeholder::{Settings, placeholder_pod};
use runner_manager_node_agent::pods::{self, PodRole};

/// The API server's answer to a refused request: (code, message).
fn refusal<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> (u16, String) {
    match r {
        Err(kube::Error::Api(s)) => (s.code, s.message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Create `pod` as the agent and expect the policy to refuse it, naming `why`.
async fn refused(api: &Api<Pod>, pod: &Pod, why: &str) {
    let (code, message) = refusal(api.create(&PostParams::default(), pod).await);
    assert_eq!(code, 403, "{why}: {message}");
    assert!(
        message.contains("ValidatingAdmissionPolicy") && message.contains(why),
        "expected a refusal naming {why:?}: {message}"
    );
}

fn container(pod: &mut Pod) -> &mut Container {
    &mut pod.spec.as_mut().expect("spec").containers[0]
}

#[tokio::test]
async fn an_agent_token_creates_and_deletes_only_its_own_nodes_convention_pods() {
    let Some(w) = World::builder("attacks_pods")
        .namespaces("rm-podsys", "rm-pods")
        .build()
        .await
        .unwrap()
    else {
        return;
    };
    let (kube, sys, ns) = (w.kube.clone(), w.system.clone(), w.team.clone());
    let a = w.add_node("pods-a", BTreeMap::new()).await.unwrap().node;
    let b = w.add_node("pods-b", BTreeMap::new()).await.unwrap().node;
    let (node_a, node_b) = (a.name.clone(), b.name.clone());
    grant_agent_rbac(&kube, &sys).await.unwrap();
    let policy = install_agent_pod_policy(&kube, &sys).await.unwrap();
    let settings = Settings {
        image: "runner-manager.local/pause:1".into(),
        priority_class: Some(policy.priority_class.clone()),
        wait: Duration::ZERO,
    };
    let attempts = Api::<RunnerAttempt>::namespaced(kube.clone(), &ns);
    let create_attempt = |node: String| {
        let attempts = attempts.clone();
        async move {
            attempts
                .create(
                    &PostParams::default(),
                    &native_attempt(uuid::Uuid::new_v4(), "web", "uid-web", &node),
                )
                .await
                .unwrap()
        }
    };
    let on_a = create_attempt(node_a.clone()).await;
    let on_b = create_attempt(node_b.clone()).await;

    let as_a = Api::<Pod>::namespaced(agent_client(&kube, &sys, &a.pod).await.unwrap(), &ns);
    let admin = Api::<Pod>::namespaced(kube.clone(), &ns);
    let good = placeholder_pod(&on_a, &node_a, &settings).unwrap();

    // The policy takes a moment to be enforced: wait until another node's placeholder is refused.
    let elsewhere = placeholder_pod(&on_b, &node_b, &settings).unwrap();
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    wait::until(
        Duration::from_secs(30),
        "the agent-pods policy is enforced",
        || async {
            as_a.create(&dry, &elsewhere)
                .await
                .err()
                .filter(|e| e.to_string().contains("ValidatingAdmissionPolicy"))
                .map(|_| ())
        },
    )
    .await
    .unwrap();

    // 1. Another node: a placeholder for node B's attempt, and node A's own placeholder moved to
    //    node B (nodeName, then the node label).
    refused(&as_a, &elsewhere, "on its own node only").await;
    let mut moved = good.clone();
    moved.spec.as_mut().unwrap().node_name = Some(node_b.clone());
    refused(&as_a, &moved, "on its own node only").await;
    let mut relabelled = good.clone();
    relabelled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(runner_manager_crds::NODE_LABEL.into(), node_b.clone());
    refused(&as_a, &relabelled, "on its own node only").await;
    // 2. No owner, and an owner that is not the attempt its label names.
    let mut orphan = good.clone();
    orphan.metadata.owner_references = None;
    refused(&as_a, &orphan, "owned by the RunnerAttempt").await;
    let mut foreign = good.clone();
    foreign.metadata.owner_references.as_mut().unwrap()[0].name = "someone-else".into();
    refused(&as_a, &foreign, "owned by the RunnerAttempt").await;
    // 3. A role outside the closed set.
    let mut debug = good.clone();
    debug
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(pods::ROLE_LABEL.into(), "debug".into());
    refused(&as_a, &debug, "pod-role runner or placeholder").await;
    // 4. Privileged, root, added capabilities.
    let mut privileged = good.clone();
    container(&mut privileged).security_context = Some(SecurityContext {
        privileged: Some(true),
        ..SecurityContext::default()
    });
    refused(&as_a, &privileged, "not privileged").await;
    let mut root = good.clone();
    root.spec
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .run_as_user = Some(0);
    refused(&as_a, &root, "non-root").await;
    let mut caps = good.clone();
    container(&mut caps).security_context = Some(SecurityContext {
        capabilities: Some(k8s_openapi::api::core::v1::Capabilities {
            add: Some(vec!["SYS_ADMIN".into()]),
            drop: None,
        }),
        ..SecurityContext::default()
    });
    refused(&as_a, &caps, "adds no capability").await;
    // A container that may escalate, keeps its capabilities or writes its root: each refused.
    for loosen in [
        |c: &mut SecurityContext| c.allow_privilege_escalation = Some(true),
        |c: &mut SecurityContext| c.read_only_root_filesystem = Some(false),
        |c: &mut SecurityContext| c.capabilities = None,
    ] {
        let mut loose = good.clone();
        loosen(
            container(&mut loose)
                .security_context
                .get_or_insert_with(SecurityContext::default),
        );
        refused(&as_a, &loose, "forbids privilege escalation, drops ALL").await;
    }
    // 5. Host namespaces.
    for set in [
        |s: &mut k8s_openapi::api::core::v1::PodSpec| s.host_pid = Some(true),
        |s: &mut k8s_openapi::api::core::v1::PodSpec| s.host_network = Some(true),
        |s: &mut k8s_openapi::api::core::v1::PodSpec| s.host_ipc = Some(true),
    ] {
        let mut host = good.clone();
        set(host.spec.as_mut().unwrap());
        refused(&as_a, &host, "no host network, PID or IPC").await;
    }
    // 6. A service account token: mounted, or run as another account.
    let mut token = good.clone();
    token.spec.as_mut().unwrap().automount_service_account_token = Some(true);
    refused(&as_a, &token, "no service account token").await;
    let mut other_sa = good.clone();
    other_sa.spec.as_mut().unwrap().service_account_name = Some("builder".into());
    refused(&as_a, &other_sa, "no service account token").await;
    // 7. Host paths: `/` in a placeholder, `/` or the whole host root in a runner pod, and a
    //    runtime-shaped path in a placeholder (only a runner mounts its runtime). A path with
    //    `..` never reaches admission: the API server's validation refuses it.
    let host_path = |pod: &Pod, path: &str, role: PodRole| {
        let mut p = pod.clone();
        p.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(pods::ROLE_LABEL.into(), role.as_str().into());
        let spec = p.spec.as_mut().unwrap();
        spec.volumes = Some(vec![Volume {
            name: "host".into(),
            host_path: Some(HostPathVolumeSource {
                path: path.into(),
                type_: Some("Directory".into()),
            }),
            ..Volume::default()
        }]);
        spec.containers[0].volume_mounts = Some(vec![VolumeMount {
            name: "host".into(),
            mount_path: "/host".into(),
            ..VolumeMount::default()
        }]);
        p
    };
    let runtime = "/var/lib/runner-manager/runners/3f2a9c0177aa";
    for (path, role) in [
        ("/", PodRole::Placeholder),
        ("/", PodRole::Runner),
        ("/var/lib/runner-manager", PodRole::Runner),
        (runtime, PodRole::Placeholder),
    ] {
        refused(
            &as_a,
            &host_path(&good, path, role),
            "mounts only emptyDir volumes",
        )
        .await;
    }
    // 8. A priority class other than the chart's.
    let mut critical = good.clone();
    critical.spec.as_mut().unwrap().priority_class_name = Some("system-node-critical".into());
    let (code, _) = refusal(as_a.create(&PostParams::default(), &critical).await);
    assert_eq!(code, 403);

    // Nothing of the above exists.
    assert!(
        admin
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // The convention's pods on node A pass: the placeholder, and a runner pod mounting exactly
    // its runtime directory (dry run: the OCI provider owns real runner pods).
    as_a.create(&PostParams::default(), &good).await.unwrap();
    let mut runner = host_path(&good, runtime, PodRole::Runner);
    runner.metadata.name = Some(pods::pod_name(
        &on_a.metadata.name.clone().unwrap(),
        PodRole::Runner,
    ));
    as_a.create(&dry, &runner).await.unwrap();

    // Deletion: a pod that is not the agent's own (an ordinary pod of the namespace, and node
    // B's placeholder made by the admin) is refused; its own placeholder goes.
    let mut bystander = good.clone();
    bystander.metadata = kube::api::ObjectMeta {
        name: Some("bystander".into()),
        ..Default::default()
    };
    bystander.spec.as_mut().unwrap().node_name = Some(node_a.clone());
    admin
        .create(&PostParams::default(), &bystander)
        .await
        .unwrap();
    admin
        .create(&PostParams::default(), &elsewhere)
        .await
        .unwrap();
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let (code, message) = refusal(as_a.delete("bystander", &now).await);
    assert_eq!(code, 403, "{message}");
    let b_name = elsewhere.metadata.name.clone().unwrap();
    let (code, message) = refusal(as_a.delete(&b_name, &now).await);
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("on its own node only"), "{message}");
    let good_name = good.metadata.name.clone().unwrap();
    as_a.delete(&good_name, &now).await.unwrap();
    assert!(admin.get_opt(&good_name).await.unwrap().is_none());
    assert!(admin.get_opt("bystander").await.unwrap().is_some());
    assert!(admin.get_opt(&b_name).await.unwrap().is_some());
    drop(policy);
}
