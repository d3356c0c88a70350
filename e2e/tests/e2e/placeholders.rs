//! Placeholder pods beside native runners (issue 16 item 4, docs/placeholder-pods.md), with the
//! agent as a process on the real control plane. The development control plane has no kubelet:
//! a pod bound by `nodeName` stays `Pending`, which is what the second scenario uses — a
//! placeholder the kubelet never runs must keep the runner from starting. Runs as root with the
//! runner accounts of `e2e/setup-runner-accounts.sh`. Skipped without KUBECONFIG.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, PostParams};
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::outcome::{FailureReason, Outcome};
use runner_manager_crds::pods::{PlaceholderSpec, SAFE_TO_EVICT, placeholder_pod};
use runner_manager_crds::policy::RunnerResources;
use runner_manager_crds::state::AttemptState;
use runner_manager_e2e::harness::agent::AgentWorld;
use runner_manager_e2e::harness::attempt::{journal_of, name};
use runner_manager_e2e::harness::wait;
use runner_manager_e2e::harness::world::World;
use runner_manager_node_agent::pods::{self, PodRole};

/// The pause image the real node imports (e2e/cluster/images.sh); never pulled here.
const PAUSE: &str = "runner-manager.local/pause:1";

fn placeholder_name(a: &RunnerAttempt) -> String {
    pods::pod_name(&name(a), PodRole::Placeholder)
}

/// The attempt's placeholder pod, while it stands.
async fn placeholder_of(pods_api: &Api<Pod>, a: &RunnerAttempt) -> Option<Pod> {
    pods_api.get_opt(&placeholder_name(a)).await.unwrap()
}

/// Stop attempt `a` in order (the test plays the operator) and wait until it is `Cleaned`.
async fn stop_to_cleaned(w: &AgentWorld, a: &RunnerAttempt) -> RunnerAttempt {
    let n = name(a);
    w.request_termination(&n, "ScaleDown").await.unwrap();
    w.deregister(a).await.unwrap();
    w.wait_state(&n, AttemptState::Cleaned).await.unwrap()
}

/// Delete pod `name` at once: without a kubelet a graceful deletion never ends.
async fn delete_now(pods_api: &Api<Pod>, name: &str) {
    pods_api
        .delete(name, &kube::api::DeleteParams::default().grace_period(0))
        .await
        .unwrap();
}

fn with_resources(s: &mut runner_manager_crds::attempt::AttemptSnapshot) {
    s.execution.resources = Some(RunnerResources {
        cpu: Some(Quantity("1".into())),
        memory: Some(Quantity("1Gi".into())),
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placeholder_stands_beside_a_native_runner_and_goes_after_its_cleanup() {
    let Some(w) = AgentWorld::start("placeholder_lifecycle").await else {
        return;
    };
    let agent = w
        .recovered(w.placeholder_agent("0", &[("RM_ORPHAN_SWEEP_SECONDS", "1")]))
        .await;
    let pods_api = w.pods();

    let a = w.pending_attempt_with(with_resources).await.unwrap();
    let n = name(&a);
    // Seen while it stands (a runner that fails fast would take it with its cleanup).
    let pod = wait::until(Duration::from_secs(60), "the placeholder", || async {
        pods_api.get_opt(&placeholder_name(&a)).await.ok().flatten()
    })
    .await
    .unwrap();
    let started = w
        .wait_for(&n, "Starting or later", |s| {
            s.journal.state() >= AttemptState::Starting
        })
        .await
        .unwrap();
    // The placeholder exists once the runner started, owned by the attempt, on its node, with
    // the policy's resources as requests and the autoscalers' annotation.
    assert_eq!(
        pods::owner_attempt(&pod.metadata),
        Some((n.as_str(), a.metadata.uid.as_deref().unwrap()))
    );
    assert_eq!(pods::role_of(&pod.metadata), Some(PodRole::Placeholder));
    assert_eq!(
        pod.metadata.annotations.as_ref().unwrap()[SAFE_TO_EVICT],
        "false"
    );
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.node_name.as_deref(), Some(w.node().name.as_str()));
    assert_eq!(spec.automount_service_account_token, Some(false));
    let requests = World::container_requests(&pod);
    assert_eq!(requests["cpu"], Quantity("1".into()));
    assert_eq!(requests["memory"], Quantity("1Gi".into()));
    // Created before the JIT was received (second granularity on both sides).
    let created = pod.metadata.creation_timestamp.clone().unwrap().0;
    let jit_at = journal_of(&started)
        .timestamps()
        .jit_received_at
        .clone()
        .unwrap()
        .0;
    assert!(
        created <= jit_at,
        "placeholder {created} after the JIT {jit_at}"
    );
    if let Some(l) = journal_of(&started).launch.as_ref() {
        println!(
            "status.launch (with placeholder): materializeMs={} prepareMs={} registerMs={} spawnMs={}",
            l.materialize_ms, l.prepare_ms, l.register_ms, l.spawn_ms
        );
    }

    // Stopped (terminated while it starts): once Cleaned, the placeholder is gone.
    let done = stop_to_cleaned(&w, &a).await;
    println!("concluded {:?}", journal_of(&done).outcome());
    assert!(
        placeholder_of(&pods_api, &a).await.is_none(),
        "the placeholder outlived its attempt's cleanup"
    );

    // A placeholder no attempt of the node claims (its attempt is gone) is swept.
    let mut gone = a.clone();
    gone.metadata.name = Some("web-00000000dead".into());
    gone.metadata.uid = Some("00000000-0000-0000-0000-00000000dead".into());
    let made = PlaceholderSpec {
        image: PAUSE.into(),
        priority_class: None,
    };
    let orphan = placeholder_pod(&gone, &w.node().name, &made).unwrap();
    pods_api
        .create(&PostParams::default(), &orphan)
        .await
        .unwrap();
    let orphan_name = orphan.metadata.name.clone().unwrap();
    wait::until(
        Duration::from_secs(60),
        "the orphan sweep removes the unclaimed placeholder",
        || async {
            pods_api
                .get_opt(&orphan_name)
                .await
                .ok()
                .and_then(|p| p.is_none().then_some(()))
        },
    )
    .await
    .unwrap();
    drop(agent);
}

/// The order's proof: with a wait for the kubelet and no kubelet (the placeholder stays
/// `Pending`), the launch concludes before any JIT is asked for and no runner ever starts. Were
/// the runner started before its placeholder was admitted, the attempt would reach `Starting`
/// and the broker would have minted a JIT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placeholder_the_kubelet_never_runs_keeps_the_runner_from_starting() {
    let Some(w) = AgentWorld::start("placeholder_refused").await else {
        return;
    };
    let agent = w.recovered(w.placeholder_agent("2", &[])).await;
    let a = w.pending_attempt_with(with_resources).await.unwrap();
    let n = name(&a);
    let pods_api = w.pods();
    let done = w
        .wait_concluded(&n, Outcome::Failed(FailureReason::ProcessStartFailed))
        .await;
    let journal = journal_of(&done);
    assert!(journal.process().is_none(), "a runner was started");
    assert!(journal.runner().is_none(), "a runner was registered");
    let (_, mints) = w.second_sessions_and_mints().await.unwrap();
    assert_eq!(mints, 0, "a JIT was minted before the placeholder stood");
    assert!(
        placeholder_of(&pods_api, &a).await.is_none(),
        "the refused placeholder was left"
    );
    assert!(w.runtimes().is_empty(), "runtimes left: {:?}", w.runtimes());
    drop(agent);
}

/// The placeholder's uid, once one of `a`'s exists that is not `not`.
async fn placeholder_other_than(pods_api: &Api<Pod>, a: &RunnerAttempt, not: &str) -> Pod {
    wait::until(
        Duration::from_secs(60),
        "a placeholder of the attempt other than the one deleted",
        || async {
            pods_api
                .get_opt(&placeholder_name(a))
                .await
                .ok()
                .flatten()
                .filter(|p| p.metadata.uid.as_deref() != Some(not))
        },
    )
    .await
    .unwrap()
}

/// Issue 16, placeholders while runners run: a placeholder deleted under a running native
/// runner is recreated (the scheduler keeps counting the runner), with a `PlaceholderLost`
/// event, and the runner runs on. Then the deletes' uid precondition: a same-named pod someone
/// else made in the placeholder's place is never deleted, neither while the runner runs nor by
/// its cleanup, and the attempt is cleaned as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placeholder_deleted_under_a_running_runner_is_recreated_and_an_impostor_survives() {
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use kube::api::DeleteParams;
    let Some(w) = AgentWorld::start("placeholder_kept").await else {
        return;
    };
    let agent = w.recovered(w.placeholder_agent("0", &[])).await;
    let pods_api = w.pods();
    // No resources: a memory limit needs the memory controller delegated to the runner cgroups,
    // which the development machine does not, and this runner must run.
    let a = w.pending_attempt_with(|_| {}).await.unwrap();
    let n = name(&a);
    let Some(first) = wait::until(Duration::from_secs(60), "the placeholder", || async {
        pods_api.get_opt(&placeholder_name(&a)).await.ok().flatten()
    })
    .await
    .ok() else {
        for l in agent.lines() {
            println!("{l}");
        }
        panic!("no placeholder");
    };
    w.wait_for(&n, "the runner running", |s| {
        let state = s.journal.state();
        state.is_live() && state >= AttemptState::Starting
    })
    .await
    .unwrap();

    // Deleted by someone while the runner runs: recreated, owned by the attempt.
    let first_uid = first.metadata.uid.clone().unwrap();
    if let Err(e) = pods_api
        .delete(
            &placeholder_name(&a),
            &DeleteParams::default().grace_period(0),
        )
        .await
    {
        for l in agent.lines() {
            println!("{l}");
        }
        panic!("{e}");
    }
    let second = tokio::select! {
        p = placeholder_other_than(&pods_api, &a, &first_uid) => p,
        () = tokio::time::sleep(Duration::from_secs(30)) => {
            for l in agent.lines() {
                println!("{l}");
            }
            panic!("not recreated");
        }
    };
    assert_eq!(
        pods::owner_attempt(&second.metadata),
        Some((n.as_str(), a.metadata.uid.as_deref().unwrap()))
    );
    w.event_on(&n, "PlaceholderLost", Duration::from_secs(30))
        .await
        .unwrap();
    let now = w.attempts().get(&n).await.unwrap();
    let state = journal_of(&now).state();
    assert!(
        state.is_live() && state >= AttemptState::Starting,
        "the runner was stopped for its placeholder: {state:?}"
    );

    // An impostor in its place: a pod of the placeholder's name that is not the attempt's.
    // (The agent waits before recreating again, so ours is soon the one standing; should the
    // agent win a round, its placeholder is deleted and ours made again.)
    let impostor = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some(placeholder_name(&a)),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "impostor".into(),
                image: Some(PAUSE.into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    };
    let made = wait::until(Duration::from_secs(60), "the impostor made", || async {
        if let Ok(Some(p)) = pods_api.get_opt(&placeholder_name(&a)).await {
            if pods::owner_attempt(&p.metadata).is_none() {
                return Some(p);
            }
            let _ = pods_api
                .delete(
                    &placeholder_name(&a),
                    &DeleteParams::default().grace_period(0),
                )
                .await;
        }
        pods_api
            .create(&PostParams::default(), &impostor)
            .await
            .ok()
    })
    .await
    .unwrap();
    let impostor_uid = made.metadata.uid.clone().unwrap();

    // The runner is stopped and cleaned; the impostor is left as it was.
    let done = stop_to_cleaned(&w, &a).await;
    println!(
        "concluded {:?} beside an impostor placeholder",
        journal_of(&done).outcome()
    );
    let left = placeholder_of(&pods_api, &a).await;
    assert_eq!(
        left.and_then(|p| p.metadata.uid),
        Some(impostor_uid),
        "the impostor was deleted (or replaced)"
    );
    drop(agent);
}

/// What the agent's Lease advertises for a node's pods of other workloads (the operator's
/// placement takes it from the node's room): a pod bound to the node without the role label
/// counts, ours (role-labelled) do not, and a deleted one stops counting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_workloads_pods_on_the_node_are_advertised_and_cleared() {
    use k8s_openapi::api::coordination::v1::Lease;
    use runner_manager_crds::lease::FOREIGN_REQUESTS;
    let Some(w) = AgentWorld::start("foreign_requests").await else {
        return;
    };
    let agent = w.recovered(w.agent(2, &[])).await;
    let pods_api = w.pods();
    let leases = Api::<Lease>::namespaced(w.kube.clone(), &w.system);
    let lease_name = runner_manager_crds::names::agent_lease_name(&w.node().name);
    let advertised = |want: &'static str| {
        let (leases, lease_name) = (leases.clone(), lease_name.clone());
        async move {
            wait::until(Duration::from_secs(60), want, || async {
                let l = leases.get_opt(&lease_name).await.ok().flatten()?;
                let v = l.metadata.annotations?.get(FOREIGN_REQUESTS)?.clone();
                (v == want).then_some(())
            })
            .await
            .unwrap();
        }
    };
    advertised("cpu=0,memory=0").await;
    let bound = |name: &str, cpu: &str, role: bool| -> Pod {
        let labels = if role {
            serde_json::json!({ pods::ROLE_LABEL: "placeholder" })
        } else {
            serde_json::json!({})
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": w.node().name, "containers": [{"name": "c", "image": PAUSE,
                "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}
        }))
        .unwrap()
    };
    // Ours first: were it counted, the advert would never read 1500 alone.
    pods_api
        .create(&PostParams::default(), &bound("ours", "1", true))
        .await
        .unwrap();
    pods_api
        .create(&PostParams::default(), &bound("database", "1500m", false))
        .await
        .unwrap();
    advertised("cpu=1500,memory=1073741824").await;
    // Gone at once: without a kubelet a graceful deletion never ends, and a terminating pod
    // still counts (as it does for the scheduler).
    delete_now(&pods_api, "database").await;
    advertised("cpu=0,memory=0").await;
    drop(agent);
}

/// Placement counts what the scheduler counts: with another workload's pod taking 3 of a node's
/// 4 CPUs, a runner requesting 2 goes to the other node (by name the busy one would win).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_workloads_pod_sends_the_runner_to_the_node_with_room() {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Patch, PatchParams};
    use runner_manager_crds::lease::FOREIGN_REQUESTS;
    use runner_manager_e2e::harness::product::{NodeOptions, Product, ProductOptions};
    // Only a label the node cannot set on itself may select a pool.
    const POOL: &str = "node-restriction.kubernetes.io/runner-pool";
    let options = ProductOptions {
        nodes: vec![
            NodeOptions::new("busy", 4, &[(POOL, "fit")]),
            NodeOptions::new("idle", 4, &[(POOL, "fit")]),
        ],
        ..ProductOptions::default()
    };
    let Some(p) = Product::start_with("foreign_placement", options).await else {
        return;
    };
    let (busy, idle) = (p.agents[0].node.name.clone(), p.agents[1].node.name.clone());
    let nodes = Api::<Node>::all(p.kube.clone());
    for n in [&busy, &idle] {
        nodes
            .patch_status(
                n,
                &PatchParams::default(),
                &Patch::Merge(
                    serde_json::json!({"status": {"allocatable": {"cpu": "4", "memory": "8Gi"}}}),
                ),
            )
            .await
            .unwrap();
    }
    let pods_api = p.pods();
    let foreign: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "database"},
        "spec": {"nodeName": busy, "containers": [{"name": "c", "image": PAUSE,
            "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}}]}
    }))
    .unwrap();
    pods_api
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let leases =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(p.kube.clone(), &p.system);
    let lease_name = runner_manager_crds::names::agent_lease_name(&busy);
    wait::until(
        Duration::from_secs(60),
        "the busy node's advert",
        || async {
            let l = leases.get_opt(&lease_name).await.ok().flatten()?;
            (l.metadata.annotations?.get(FOREIGN_REQUESTS)? == "cpu=3000,memory=1073741824")
                .then_some(())
        },
    )
    .await
    .unwrap();
    p.policy(
        "web",
        serde_json::json!({"minIdle": 1, "nodeSelector": {POOL: "fit"},
            "execution": {"mode": "Native", "resources": {"cpu": "2", "memory": "1Gi"}}}),
    )
    .await
    .unwrap();
    let placed = wait::until(Duration::from_secs(60), "an attempt", || async {
        let list = p.attempts().list(&Default::default()).await.ok()?;
        list.items.into_iter().next()
    })
    .await;
    let placed = match placed {
        Ok(a) => a,
        Err(e) => panic!(
            "{e}: {:?}",
            p.policies().get("web").await.map(|sp| sp.status)
        ),
    };
    assert_eq!(placed.spec.node_name, idle, "the busy node has 1 CPU left");
    delete_now(&pods_api, "database").await;
}
