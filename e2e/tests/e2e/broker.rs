//! The JIT broker on the real control plane with the simulated GitHub: the right agent gets the
//! JIT once, everyone else is refused with the right status, a leftover registration is deleted
//! before minting, CAS conflicts are re-decided (retried while still Prepared, the fresh
//! registration deleted otherwise), two replicas serve, and after an exchange the JIT is found in
//! no object of the API server, no event and no log line. A pod posing as an agent (labels,
//! node and service account right, but not controlled by the agent DaemonSet) and an agent token
//! used from another address than its pod's are refused (issue 13). Skipped without `KUBECONFIG`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams, PostParams,
};
use kube::discovery::{Discovery, verbs};
use runner_manager_crds::attempt::{RunnerAttempt, Transition, WorkspacePlacement, spec_hash};
use runner_manager_crds::broker::{
    BROKER_AUDIENCE, JitRequest, OrderedPod, PodOrder, PodRemoval, jit_path, pod_removal_path,
    pods_path,
};
use runner_manager_crds::names::runner_name;
use runner_manager_crds::outcome::{FailureReason, Outcome};
use runner_manager_crds::pods::{PlaceholderSpec, RunnerPodInputs, placeholder_pod, runner_pod};
use runner_manager_crds::policy::ExecutionMode;
use runner_manager_crds::policy::ScalePolicy;
use runner_manager_crds::state::{Actor, AttemptState};
use runner_manager_e2e::harness;
use runner_manager_e2e::harness::attempt::{journal_of, runtime_path};
use runner_manager_e2e::harness::cluster::list_all;
use runner_manager_e2e::harness::fixtures::native_attempt;
use runner_manager_e2e::harness::github::pat_credentials;
use runner_manager_e2e::harness::node::{
    AGENT_DAEMONSET, AGENT_POD_IP, AGENT_SA, agent_pod_labels, bound_token, ensure_agent_daemonset,
    ensure_agent_service_account, ensure_daemonset, set_pod_ip,
};
use runner_manager_e2e::harness::wait;
use runner_manager_node_agent::journal::{self, Decision};
use runner_manager_operator::broker::authn::AgentIdentity;
use runner_manager_operator::broker::server::{Broker, start};
use runner_manager_operator::broker::tls;
use runner_manager_operator::github::registry::Clients;
use runner_manager_operator::github::{GitHubConfig, retry::RetryPolicy};
use serde_json::{Value, json};

/// Everything a broker test needs.
struct World {
    world: harness::world::World,
    brokers: Vec<String>,
    http: reqwest::Client,
    ownership: String,
}

impl std::ops::Deref for World {
    type Target = harness::world::World;
    fn deref(&self) -> &harness::world::World {
        &self.world
    }
}

async fn world(test: &str, replicas: usize) -> Option<World> {
    // The team's policy and its GitHub App Secret (no installationId: looked up).
    let world = harness::world::World::builder(test)
        .app_secret()
        .web_policy()
        .build()
        .await
        .unwrap()?;
    let (kube, system) = (world.kube.clone(), world.system.clone());

    // The agents' service account and one agent pod per simulated node (Pending forever: no kubelet).
    ensure_agent_service_account(&kube, &system).await.unwrap();
    let agents = ensure_agent_daemonset(&kube, &system).await.unwrap();
    for node in ["node-a", "node-b"] {
        harness::node::agent_pod(
            &kube,
            &system,
            &format!("agent-{node}"),
            node,
            AGENT_SA,
            agent_pod_labels(),
            Some(&agents),
        )
        .await
        .unwrap();
    }

    let ownership = world.ownership_label().await.unwrap();
    let mut brokers = Vec::new();
    let mut first_cert = None;
    for _ in 0..replicas {
        // The first replica makes the certificate; the others load it from the Secret.
        let stored = tls::ensure(
            &kube,
            &system,
            tls::serving_names(&system, "runner-manager-broker"),
            tls::DEFAULT_LIFETIME,
        )
        .await
        .unwrap();
        // Each replica serves its own short-lived certificate, all from one kept CA.
        let ca = first_cert.get_or_insert_with(|| stored.ca_pem.clone());
        assert_eq!(&stored.ca_pem, ca, "one CA for every replica");
        let broker = Arc::new(Broker {
            kube: kube.clone(),
            agents: AgentIdentity::new(
                system.clone(),
                AGENT_SA.into(),
                agent_pod_labels(),
                AGENT_DAEMONSET.into(),
            ),
            clients: Arc::new(Clients::new(
                kube.clone(),
                GitHubConfig {
                    api_base: Some(world.fake.base_url().to_owned()),
                    retry: RetryPolicy {
                        attempts: 3,
                        base: Duration::from_millis(20),
                        max_wait: Duration::from_secs(5),
                    },
                    http_hosts: runner_manager_e2e::harness::github::loopback_hosts(),
                    ..GitHubConfig::default()
                },
            )),
            ownership_label: ownership.clone(),
            metrics: None,
            placeholders: Some(runner_manager_crds::pods::PlaceholderSpec {
                image: runner_manager_e2e::harness::world::PLACEHOLDER_IMAGE.into(),
                priority_class: None,
            }),
        });
        let (addr, _task) = start(
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            tls::server_config(&stored).unwrap(),
            broker,
        )
        .await
        .unwrap();
        brokers.push(format!("https://127.0.0.1:{}", addr.port()));
    }
    let mut world = World {
        world,
        brokers,
        http: reqwest::Client::new(),
        ownership,
    };
    if replicas > 0 {
        world.trust_published_ca().await;
    }
    Some(world)
}

impl World {
    /// Trust the CA the operator published in its ConfigMap, as agents do.
    async fn trust_published_ca(&mut self) {
        let ca = self.broker_ca(Duration::from_secs(30)).await.unwrap();
        self.http = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap())
            .build()
            .unwrap();
    }

    /// A token bound to `pod`, for `audience`.
    async fn token(&self, pod: &str, sa: &str, audience: &str) -> String {
        let p = Api::<Pod>::namespaced(self.kube.clone(), &self.system)
            .get(pod)
            .await
            .unwrap();
        bound_token(&self.kube, &self.system, &p, sa, audience)
            .await
            .unwrap()
    }

    /// A pod `pod` bound to node-a under service account `sa`, with `labels` and controlled
    /// by `owner`, and a broker token bound to it: a caller that is not (all of) an agent.
    async fn pod_token_on_node_a(
        &self,
        pod: &str,
        sa: &str,
        labels: BTreeMap<String, String>,
        owner: Option<&DaemonSet>,
    ) -> String {
        harness::node::agent_pod(&self.kube, &self.system, pod, "node-a", sa, labels, owner)
            .await
            .unwrap();
        self.token(pod, sa, BROKER_AUDIENCE).await
    }

    /// The broker refuses `token` for `attempt`: it is not the agent of the attempt's node.
    /// The answer's body.
    async fn assert_wrong_node(&self, attempt: &RunnerAttempt, token: &str) -> Value {
        let (status, body) = self.ask(attempt, Some(token)).await;
        assert_eq!((status, code(&body)), (403, "WrongNode"), "{body}");
        body
    }

    async fn agent_token(&self, node: &str) -> String {
        self.token(&format!("agent-{node}"), AGENT_SA, BROKER_AUDIENCE)
            .await
    }

    fn attempts(&self) -> Api<RunnerAttempt> {
        Api::namespaced(self.kube.clone(), &self.team)
    }

    /// A new attempt on `node`, walked by the agent to `Prepared`.
    async fn prepared_attempt(&self, node: &str) -> RunnerAttempt {
        let a = self.attempt_in(node, AttemptState::Prepared).await;
        assert_eq!(journal_of(&a).state(), AttemptState::Prepared);
        a
    }

    async fn attempt_in(&self, node: &str, state: AttemptState) -> RunnerAttempt {
        self.attempt_with(node, state, |_| {}).await
    }

    /// Like [`Self::attempt_in`], the attempt edited before it is created.
    async fn attempt_with(
        &self,
        node: &str,
        state: AttemptState,
        edit: impl FnOnce(&mut RunnerAttempt),
    ) -> RunnerAttempt {
        let id = uuid::Uuid::new_v4();
        let policy = Api::<ScalePolicy>::namespaced(self.kube.clone(), &self.team)
            .get("web")
            .await
            .unwrap();
        let mut fresh = native_attempt(id, "web", policy.metadata.uid.as_deref().unwrap(), node);
        edit(&mut fresh);
        let name = fresh.metadata.name.clone().unwrap();
        let created = self
            .attempts()
            .create(&PostParams::default(), &fresh)
            .await
            .unwrap();
        let mut steps = vec![];
        if state >= AttemptState::Allocated {
            steps.push(Transition::Admit {
                placement: WorkspacePlacement::ephemeral(format!(
                    "/var/lib/runner-manager/runners/{name}"
                )),
                spec_hash: spec_hash(&created.spec),
            });
        }
        if state == AttemptState::Preparing {
            steps.push(Transition::BeginPrepare);
        }
        if state >= AttemptState::Prepared {
            steps.push(Transition::MarkPrepared { environment: None });
        }
        let mut current = created;
        for t in steps {
            let mut t = Some(t);
            current = journal::Journal::default()
                .advance(&self.attempts(), &name, Actor::Agent, |_| {
                    t.take().map_or(Decision::Nothing, Decision::Take)
                })
                .await
                .unwrap()
                .unwrap();
        }
        current
    }

    /// Ask broker replica `replica` for the JIT of `attempt` with `token`.
    async fn ask_via(
        &self,
        replica: usize,
        attempt: &RunnerAttempt,
        token: Option<&str>,
    ) -> (u16, Value) {
        let journal = attempt
            .status
            .as_ref()
            .map(|s| s.journal.clone())
            .unwrap_or_default();
        let body = JitRequest {
            attempt_uid: attempt.metadata.uid.clone().unwrap(),
            spec_hash: journal.spec_hash().unwrap_or_default().to_owned(),
        };
        let url = format!(
            "{}{}",
            self.brokers[replica],
            jit_path(&self.team, attempt.metadata.name.as_deref().unwrap())
        );
        let mut req = self.http.post(url).json(&body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn ask(&self, attempt: &RunnerAttempt, token: Option<&str>) -> (u16, Value) {
        self.ask_via(0, attempt, token).await
    }

    /// Ask for the JIT while GitHub holds the mint (a latency fault), and run `during` once the
    /// mint is in flight: the broker has read the attempt, so a write in `during` makes its CAS
    /// stale.
    async fn ask_while_minting(
        &self,
        attempt: &RunnerAttempt,
        token: &str,
        during: impl std::future::Future<Output = ()>,
    ) -> (u16, Value) {
        self.fake
            .fault(json!({"endpoint": "generate_jitconfig", "count": 1, "latency_ms": 1500}))
            .await
            .unwrap();
        let interfere = async {
            wait_for_mint_in_flight(self).await;
            during.await;
        };
        let (answer, ()) = tokio::join!(self.ask(attempt, Some(token)), interfere);
        answer
    }

    /// `POST` `body` to the broker's `path` with `token`: (status, body).
    async fn post(
        &self,
        path: &str,
        body: &impl serde::Serialize,
        token: Option<&str>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .post(format!("{}{path}", self.brokers[0]))
            .json(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// Orders `pod` for `attempt` with `token`.
    async fn order(
        &self,
        attempt: &RunnerAttempt,
        pod: OrderedPod,
        token: Option<&str>,
    ) -> (u16, Value) {
        let body = PodOrder {
            attempt_uid: attempt.metadata.uid.clone().unwrap(),
            pod,
        };
        self.post(
            &pods_path(&self.team, attempt.metadata.name.as_deref().unwrap()),
            &body,
            token,
        )
        .await
    }

    /// Orders the removal of pod `name` of `uid` with `token`.
    async fn remove(&self, name: &str, uid: &str, token: &str) -> (u16, Value) {
        let body = PodRemoval {
            uid: uid.to_owned(),
        };
        self.post(&pod_removal_path(&self.team, name), &body, Some(token))
            .await
    }

    async fn reread(&self, attempt: &RunnerAttempt) -> RunnerAttempt {
        self.attempts()
            .get(attempt.metadata.name.as_deref().unwrap())
            .await
            .unwrap()
    }

    async fn registrations_named(&self, name: &str) -> Vec<Value> {
        self.fake.runners_named(name).await.unwrap()
    }
}

fn code(body: &Value) -> &str {
    body["code"].as_str().unwrap_or("")
}

#[tokio::test]
async fn the_right_agent_gets_the_jit_once_and_the_runner_id_is_journalled_first() {
    let Some(w) = world("the_right_agent_gets_the_jit_once", 1).await else {
        return;
    };
    let attempt = w.prepared_attempt("node-a").await;
    let token = w.agent_token("node-a").await;
    let started = Instant::now();
    let (status, body) = w.ask(&attempt, Some(&token)).await;
    let first_latency = started.elapsed();
    assert_eq!(status, 200, "{body}");
    let jit = body["encodedJitConfig"].as_str().unwrap().to_owned();
    assert!(!jit.is_empty());
    let name = runner_name(attempt.spec.attempt_uuid().unwrap());
    assert_eq!(body["runner"]["name"], name.as_str());

    let after = w.reread(&attempt).await;
    let journal = after.status.unwrap().journal;
    assert_eq!(journal.state(), AttemptState::JitReceived);
    assert_eq!(
        journal.runner().map(|r| r.id),
        body["runner"]["id"].as_i64()
    );
    assert!(journal.timestamps().jit_received_at.is_some());
    // Registered on GitHub with the snapshot's labels plus this cluster's ownership label.
    let regs = w.registrations_named(&name).await;
    assert_eq!(regs.len(), 1);
    let listed = w
        .fake
        .client("https://github.com/acme/web", pat_credentials())
        .find_runner(
            &name,
            runner_manager_operator::github::ratelimit::Priority::Observe,
        )
        .await
        .unwrap()
        .unwrap();
    assert!(listed.has_label(&w.ownership), "{listed:?}");
    assert!(listed.has_label("self-hosted") && listed.has_label("linux"));

    // A second request: the first JIT is lost as far as the broker knows. 410, nothing minted.
    let mints = w.fake.calls("generate_jitconfig").await.unwrap();
    let (status, body) = w
        .ask(&after_attempt(&w, &attempt).await, Some(&token))
        .await;
    assert_eq!(status, 410, "{body}");
    assert_eq!(code(&body), "AlreadyIssued");
    assert_eq!(w.fake.calls("generate_jitconfig").await.unwrap(), mints);

    // Latency with a warm installation token: a second attempt's exchange.
    let second = w.prepared_attempt("node-a").await;
    let started = Instant::now();
    let (status, _) = w.ask(&second, Some(&token)).await;
    assert_eq!(status, 200);
    eprintln!(
        "broker exchange latency: first {:?} (installation lookup + token), warm {:?}",
        first_latency,
        started.elapsed()
    );
}

async fn after_attempt(w: &World, a: &RunnerAttempt) -> RunnerAttempt {
    w.reread(a).await
}

#[tokio::test]
async fn callers_that_are_not_the_attempts_agent_are_refused() {
    let Some(w) = world("callers_that_are_not_the_attempts_agent_are_refused", 1).await else {
        return;
    };
    let attempt = w.prepared_attempt("node-a").await;
    // No token.
    let (status, body) = w.ask(&attempt, None).await;
    assert_eq!((status, code(&body)), (401, "Unauthenticated"), "{body}");
    // The agent of another node.
    w.assert_wrong_node(&attempt, &w.agent_token("node-b").await)
        .await;
    // A token for another audience (the API server's own).
    let wrong_aud = w
        .token(
            "agent-node-a",
            AGENT_SA,
            "https://kubernetes.default.svc.cluster.local",
        )
        .await;
    let (status, body) = w.ask(&attempt, Some(&wrong_aud)).await;
    assert_eq!((status, code(&body)), (401, "Unauthenticated"), "{body}");
    // A pod on the right node under another service account.
    Api::<ServiceAccount>::namespaced(w.kube.clone(), &w.system)
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: ObjectMeta {
                    name: Some("intruder".into()),
                    ..ObjectMeta::default()
                },
                ..ServiceAccount::default()
            },
        )
        .await
        .unwrap();
    let intruder = w
        .pod_token_on_node_a(
            "intruder-node-a",
            "intruder",
            agent_pod_labels(),
            Some(&agent_daemonset(&w).await),
        )
        .await;
    w.assert_wrong_node(&attempt, &intruder).await;
    // A pod of the agent's account but not an agent (no agent labels).
    let stray = w
        .pod_token_on_node_a(
            "stray-node-a",
            AGENT_SA,
            BTreeMap::new(),
            Some(&agent_daemonset(&w).await),
        )
        .await;
    w.assert_wrong_node(&attempt, &stray).await;
    // The token of a deleted agent pod.
    let token = w.agent_token("node-a").await;
    Api::<Pod>::namespaced(w.kube.clone(), &w.system)
        .delete("agent-node-a", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let pods = Api::<Pod>::namespaced(w.kube.clone(), &w.system);
    wait::gone(
        &pods,
        "agent-node-a",
        Duration::from_secs(30),
        "the agent pod is gone",
    )
    .await
    .unwrap();
    let (status, body) = w.ask(&attempt, Some(&token)).await;
    assert_eq!((status, code(&body)), (401, "Unauthenticated"), "{body}");
    // Nothing was minted for any of them, and the attempt is still Prepared.
    assert_eq!(w.fake.calls("generate_jitconfig").await.unwrap(), 0);
    assert_eq!(
        w.reread(&attempt).await.status.unwrap().journal.state(),
        AttemptState::Prepared
    );
}

async fn agent_daemonset(w: &World) -> DaemonSet {
    Api::<DaemonSet>::namespaced(w.kube.clone(), &w.system)
        .get(AGENT_DAEMONSET)
        .await
        .unwrap()
}

/// Issue 13: with the pods right an agent token once had (or any other way into the system
/// namespace), an attacker makes a pod with the agents' labels, service account and node Y and
/// so receives node Y's JITs. Such a pod is not controlled by the agent DaemonSet (an admin's
/// object, compared by uid), and is refused; so is a real agent's token used from an address
/// that is not its pod's. The real agent still gets its JIT.
#[tokio::test]
async fn a_pod_posing_as_an_agent_or_a_token_used_from_elsewhere_gets_no_jit() {
    let Some(w) = world(
        "a_pod_posing_as_an_agent_or_a_token_used_from_elsewhere_gets_no_jit",
        1,
    )
    .await
    else {
        return;
    };
    let attempt = w.prepared_attempt("node-a").await;

    // (a) Everything the old broker checked is right — service account, agent labels, node,
    // pod IP — but no controller at all.
    let token = w
        .pod_token_on_node_a("forged-no-owner", AGENT_SA, agent_pod_labels(), None)
        .await;
    let body = w.assert_wrong_node(&attempt, &token).await;
    assert!(
        !body.to_string().contains("DaemonSet"),
        "the answer does not say which check failed: {body}"
    );

    // (a) Controlled by a DaemonSet with the same selector in the same namespace, which is not
    // the agent DaemonSet.
    let decoy = ensure_daemonset(&w.kube, &w.system, "decoy-node-agent", agent_pod_labels())
        .await
        .unwrap();
    let token = w
        .pod_token_on_node_a(
            "forged-decoy-owner",
            AGENT_SA,
            agent_pod_labels(),
            Some(&decoy),
        )
        .await;
    w.assert_wrong_node(&attempt, &token).await;

    // (b) The real agent pod of node-a, but its IP is not the address the request comes from
    // (a token copied off the node and replayed from elsewhere).
    let pods = Api::<Pod>::namespaced(w.kube.clone(), &w.system);
    let agent = pods.get("agent-node-a").await.unwrap();
    set_pod_ip(&w.kube, &agent, "10.255.0.7").await.unwrap();
    let token = w.agent_token("node-a").await;
    w.assert_wrong_node(&attempt, &token).await;

    // Nothing was minted for any of them, and the attempt is still Prepared.
    assert_eq!(w.fake.calls("generate_jitconfig").await.unwrap(), 0);
    assert_eq!(
        w.reread(&attempt).await.status.unwrap().journal.state(),
        AttemptState::Prepared
    );

    // (c) The same pod and token, from its own address: the JIT.
    set_pod_ip(&w.kube, &agent, AGENT_POD_IP).await.unwrap();
    let (status, body) = w.ask(&attempt, Some(&token)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(w.fake.calls("generate_jitconfig").await.unwrap(), 1);
}

/// A JIT for an attempt its agent admitted and prepared: a native one from `Allocated` (the
/// request is the agent's claim, and the broker's one CAS takes `Allocated → JitReceived`), an
/// OCI one only from `Prepared`, where its pod is journalled. Nothing is minted for the others.
#[tokio::test]
async fn only_a_prepared_attempt_gets_a_jit_and_a_leftover_registration_is_replaced() {
    let Some(w) = world("only_a_prepared_attempt_gets_a_jit", 1).await else {
        return;
    };
    let token = w.agent_token("node-a").await;
    let mints = w.fake.calls("generate_jitconfig").await.unwrap();
    let pending = w.attempt_in("node-a", AttemptState::Pending).await;
    let (status, body) = w.ask(&pending, Some(&token)).await;
    assert_eq!((status, code(&body)), (409, "NotPrepared"), "{body}");
    let image = format!("registry.local/runner@sha256:{}", "a".repeat(64));
    for state in [AttemptState::Allocated, AttemptState::Preparing] {
        let oci = w
            .attempt_with("node-a", state, |a| {
                a.spec.snapshot.execution.mode = ExecutionMode::Oci;
                a.spec.snapshot.execution.image = Some(image.clone());
            })
            .await;
        let (status, body) = w.ask(&oci, Some(&token)).await;
        assert_eq!(
            (status, code(&body)),
            (409, "NotPrepared"),
            "{state:?}: {body}"
        );
    }
    assert_eq!(w.fake.calls("generate_jitconfig").await.unwrap(), mints);

    let allocated = w.attempt_in("node-a", AttemptState::Allocated).await;
    let (status, body) = w.ask(&allocated, Some(&token)).await;
    assert_eq!(status, 200, "{body}");
    let journal = w.reread(&allocated).await.status.unwrap().journal;
    assert_eq!(journal.state(), AttemptState::JitReceived);
    assert_eq!(
        journal.runner().map(|r| r.id),
        body["runner"]["id"].as_i64()
    );

    // A registration with the attempt's runner name, left by a broker that crashed after
    // GitHub's 201: it is deleted and a fresh one minted.
    let attempt = w.prepared_attempt("node-a").await;
    let name = runner_name(attempt.spec.attempt_uuid().unwrap());
    let gh = w
        .fake
        .client("https://github.com/acme/web", pat_credentials());
    let leftover = gh
        .generate_jit(&name, 1, &["self-hosted".into()], "_work")
        .await
        .unwrap();
    let (status, body) = w.ask(&attempt, Some(&token)).await;
    assert_eq!(status, 200, "{body}");
    let regs = w.registrations_named(&name).await;
    assert_eq!(regs.len(), 1, "{regs:?}");
    assert_ne!(
        regs[0]["id"].as_i64(),
        Some(leftover.runner.id),
        "the leftover was deleted"
    );
    assert_eq!(regs[0]["id"].as_i64(), body["runner"]["id"].as_i64());
}

#[tokio::test]
async fn a_concurrent_status_write_is_retried_and_a_concluded_attempt_gets_nothing() {
    let Some(w) = world("a_concurrent_status_write_is_retried", 1).await else {
        return;
    };

    // 1. The operator writes a fact while the mint is in flight: the broker's CAS conflicts,
    //    it re-reads, finds the attempt still Prepared without a runner id, and writes again.
    let attempt = w.prepared_attempt("node-a").await;
    let name = attempt.metadata.name.clone().unwrap();
    let token = w.agent_token("node-a").await;
    let fact = json!({"status": {"github": {"status": "absent", "busy": false, "generation": 1}}});
    let (status, body) = w
        .ask_while_minting(&attempt, &token, async {
            w.attempts()
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&fact))
                .await
                .unwrap();
        })
        .await;
    assert_eq!(status, 200, "{body}");
    let after = w.reread(&attempt).await.status.unwrap();
    assert_eq!(after.journal.state(), AttemptState::JitReceived);
    assert_eq!(
        after.facts.github.unwrap().generation,
        1,
        "the fact survived"
    );

    // 2. The agent concludes the attempt while the mint is in flight: the broker's CAS
    //    conflicts, the attempt is no longer Prepared, the fresh registration is deleted, 409.
    let attempt = w.prepared_attempt("node-a").await;
    let name = attempt.metadata.name.clone().unwrap();
    let runner = runner_name(attempt.spec.attempt_uuid().unwrap());
    let (status, body) = w
        .ask_while_minting(&attempt, &token, async {
            journal::Journal::default()
                .advance(&w.attempts(), &name, Actor::Agent, |_| {
                    Decision::Take(Transition::Conclude(Outcome::Failed(
                        FailureReason::JitRequestFailed,
                    )))
                })
                .await
                .unwrap();
        })
        .await;
    assert_eq!((status, code(&body)), (409, "NotPrepared"), "{body}");
    assert!(
        w.registrations_named(&runner).await.is_empty(),
        "the fresh registration was deleted"
    );
    assert_eq!(
        w.reread(&attempt).await.status.unwrap().journal.state(),
        AttemptState::Failed
    );
}

/// Parity row 32 (`jit_retry_stops_with_demand_and_a_terminal_403_never_retries`): the mint's
/// tries against the simulated GitHub (the broker's client: 3 tries, 20 ms doubling). Two
/// transient failures, then the JIT: three mints. A 403 is terminal: one mint. A transient
/// failure while the attempt was terminated, or deleted, meanwhile: one mint and no second
/// (the attempt is read again between tries), 409 `NotPrepared`, and nothing left registered.
#[tokio::test]
async fn the_mint_retries_only_while_its_attempt_wants_it_and_never_after_a_403() {
    let Some(w) = world("the_mint_retries_only_while_wanted", 1).await else {
        return;
    };
    let token = w.agent_token("node-a").await;
    let fake = &w.fake;
    let fault = |f: Value| async move { fake.admin("POST", "faults", f).await.unwrap() };

    // 1. Two 502s, then a 201: three mints, the JIT issued.
    fault(json!({"endpoint": "generate_jitconfig", "count": 2, "status": 502})).await;
    let attempt = w.prepared_attempt("node-a").await;
    let before = w.fake.calls("generate_jitconfig").await.unwrap();
    let (status, body) = w.ask(&attempt, Some(&token)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        w.fake.calls("generate_jitconfig").await.unwrap() - before,
        3
    );

    // 2. A 403 (a permission, not a rate limit): one mint, refused.
    fault(json!({"endpoint": "generate_jitconfig", "count": 1, "status": 403})).await;
    let attempt = w.prepared_attempt("node-a").await;
    let before = w.fake.calls("generate_jitconfig").await.unwrap();
    let (_, body) = w.ask(&attempt, Some(&token)).await;
    assert_eq!(code(&body), "GitHubUnavailable", "{body}");
    assert_eq!(
        w.fake.calls("generate_jitconfig").await.unwrap() - before,
        1
    );

    // 3. Demand goes while the first try is held by GitHub (and fails): terminated, then
    //    deleted. Without the re-read the broker would spend all three tries.
    for gone in ["terminated", "deleted"] {
        let attempt = w.prepared_attempt("node-a").await;
        let name = attempt.metadata.name.clone().unwrap();
        let runner = runner_name(attempt.spec.attempt_uuid().unwrap());
        fault(json!({"endpoint": "generate_jitconfig", "count": 1, "status": 502, "latency_ms": 1500})).await;
        fault(json!({"endpoint": "generate_jitconfig", "count": 2, "status": 502})).await;
        let before = w.fake.calls("generate_jitconfig").await.unwrap();
        let interfere = async {
            wait_for_faults_left(&w, 2).await;
            if gone == "terminated" {
                let body = json!({"spec": {"termination": {
                    "reason": "ScaleDown",
                    "requestedAt": k8s_openapi::jiff::Timestamp::now().to_string()}}});
                w.attempts()
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
                    .await
                    .unwrap();
            } else {
                w.attempts()
                    .delete(&name, &DeleteParams::default())
                    .await
                    .unwrap();
            }
        };
        let ((status, body), ()) = tokio::join!(w.ask(&attempt, Some(&token)), interfere);
        assert_eq!(
            (status, code(&body)),
            (409, "NotPrepared"),
            "{gone}: {body}"
        );
        assert_eq!(
            w.fake.calls("generate_jitconfig").await.unwrap() - before,
            1,
            "{gone}: a mint after demand went"
        );
        assert!(w.registrations_named(&runner).await.is_empty(), "{gone}");
        w.fake.admin("DELETE", "faults", Value::Null).await.unwrap();
    }
}

/// The first of the queued mint faults was taken (the mint reached the fake); `left` remain.
async fn wait_for_faults_left(w: &World, left: usize) {
    use runner_manager_e2e::fake_github::endpoint::Endpoint;
    let fake = w.fake.running.fake.clone();
    wait::until(Duration::from_secs(10), "the mint to reach GitHub", || {
        let fake = fake.clone();
        async move {
            let pending = fake
                .world()
                .faults
                .get(&Endpoint::GenerateJitconfig)
                .map_or(0, |q| q.len());
            (pending == left).then_some(())
        }
    })
    .await
    .unwrap();
}

/// The mint has reached the fake and is held by its latency fault (the fault is taken from the
/// queue when the request arrives): the broker has read the attempt, so a write now makes its
/// CAS stale.
async fn wait_for_mint_in_flight(w: &World) {
    wait_for_faults_left(w, 0).await;
}

#[tokio::test]
async fn two_replicas_serve_and_the_jit_is_found_nowhere_after_the_exchange() {
    let logs = capture_logs();
    let Some(w) = world("two_replicas_serve", 2).await else {
        return;
    };
    let token = w.agent_token("node-a").await;
    let mut jits = Vec::new();
    for replica in 0..2 {
        let attempt = w.prepared_attempt("node-a").await;
        let (status, body) = w.ask_via(replica, &attempt, Some(&token)).await;
        assert_eq!(status, 200, "replica {replica}: {body}");
        jits.push(body["encodedJitConfig"].as_str().unwrap().to_owned());
    }
    // Every object of every listable resource in the API server, and every event.
    let discovery = Discovery::new(w.kube.clone()).run().await.unwrap();
    let mut searched = 0;
    for group in discovery.groups() {
        for (ar, caps) in group.recommended_resources() {
            if !caps.supports_operation(verbs::LIST) {
                continue;
            }
            let api: Api<DynamicObject> = Api::all_with(w.kube.clone(), &ar);
            let Ok(list) = api.list(&ListParams::default()).await else {
                continue;
            };
            let text = serde_json::to_string(&list.items).unwrap();
            for jit in &jits {
                assert!(
                    !text.contains(jit.as_str()),
                    "the JIT is stored in {}",
                    ar.plural
                );
            }
            searched += list.items.len();
        }
    }
    assert!(searched > 20, "searched {searched} objects");
    let captured = logs.lock().unwrap().clone();
    let captured = String::from_utf8_lossy(&captured);
    assert!(
        captured.contains("broker request"),
        "logs were captured: {captured}"
    );
    for jit in &jits {
        assert!(!captured.contains(jit.as_str()), "the JIT is in a log line");
    }
}

/// Capture this process's tracing output.
fn capture_logs() -> Arc<Mutex<Vec<u8>>> {
    #[derive(Clone)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Arc::new(Mutex::new(Vec::new()));
    let sink = Sink(buf.clone());
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || sink.clone())
        .finish();
    let _ = tracing::subscriber::set_global_default(subscriber);
    buf
}

/// The operator binary as a real process: it applies the CRDs, makes the broker certificate,
/// serves the broker, stops on SIGTERM, and a restarted operator serves with the same
/// certificate (the agents' trust in the published CA survives restarts).
#[tokio::test]
async fn the_operator_process_serves_the_broker_across_restarts() {
    use runner_manager_e2e::harness::process::{Running, binary};
    let Some(mut w) = world("the_operator_process_serves_the_broker", 0).await else {
        return;
    };
    let start_operator = |w: &World| {
        let mut cmd = std::process::Command::new(binary("runner-manager-operator").unwrap());
        cmd.args([
            "--namespace",
            &w.system,
            "--broker-addr",
            "127.0.0.1:0",
            "--admission-addr",
            "127.0.0.1:0",
            "--webhook-addr",
            "127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
            "--github-api-url",
            w.fake.base_url(),
            "--log-format",
            "json",
            // The broker alone: controllers would reconcile every namespace of the shared cluster.
            "--controllers",
            "false",
        ]);
        Running::spawn("runner-manager-operator", cmd).unwrap()
    };
    for round in 0..2 {
        let operator = start_operator(&w);
        let (broker, health) = wait::until(
            Duration::from_secs(60),
            "the operator to serve the broker",
            || {
                let lines = operator.lines();
                async move {
                    lines.iter().find_map(|l| {
                        let v: Value = serde_json::from_str(l).ok()?;
                        let f = &v["fields"];
                        Some((
                            f["broker"].as_str()?.to_owned(),
                            f["health"].as_str()?.to_owned(),
                        ))
                    })
                }
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}: {:?}", operator.lines()));
        w.brokers = vec![format!("https://{broker}")];
        // Trusting the CA published in round 0 also proves round 1 serves the same certificate.
        if round == 0 {
            w.trust_published_ca().await;
        }
        let attempt = w.prepared_attempt("node-a").await;
        let (status, body) = w.ask(&attempt, Some(&w.agent_token("node-a").await)).await;
        assert_eq!(status, 200, "round {round}: {body}");
        // The exchange is counted: one issued request, one JIT mint (warm or not, one call).
        let metrics = reqwest::get(format!("http://{health}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        for line in [
            "runner_manager_broker_requests_total{outcome=\"issued\"} 1",
            "runner_manager_github_calls_total{endpoint=\"generate_jitconfig\",status=\"201\"} 1",
        ] {
            assert!(
                metrics.contains(line),
                "round {round}: no `{line}` in\n{metrics}"
            );
        }
        assert!(
            metrics.contains("runner_manager_github_rate_limit_remaining{"),
            "{metrics}"
        );
        operator.terminate().unwrap();
        let mut operator = operator;
        let exit = wait::until(
            Duration::from_secs(30),
            "the operator to exit on SIGTERM",
            || {
                let status = operator.child.try_wait().ok().flatten();
                async move { status }
            },
        )
        .await
        .unwrap();
        assert!(exit.success(), "round {round}: {exit:?}");
        let logs = operator.lines().join("\n");
        assert!(
            !logs.contains(body["encodedJitConfig"].as_str().unwrap()),
            "the JIT in a log line"
        );
    }
}

/// The first field of `expected` that `actual` lacks or holds with another value (objects by
/// key, arrays element by element), as a path: the API server adds its defaults, never changes
/// what was asked. A `false` it drops (`hostNetwork: false` is stored as absent) counts as kept.
fn first_difference(expected: &Value, actual: &Value, path: &str) -> Option<String> {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => e.iter().find_map(|(k, v)| match a.get(k) {
            Some(x) => first_difference(v, x, &format!("{path}.{k}")),
            None if *v == Value::Bool(false) => None,
            None => Some(format!("{path}.{k} is missing")),
        }),
        (Value::Array(e), Value::Array(a)) if e.len() == a.len() => e
            .iter()
            .zip(a)
            .enumerate()
            .find_map(|(i, (v, x))| first_difference(v, x, &format!("{path}[{i}]"))),
        _ if expected == actual => None,
        _ => Some(format!("{path}: {expected} asked, {actual} stored")),
    }
}

/// Asserts that `stored` holds every field of `built`'s metadata and spec.
fn assert_built(built: &Pod, stored: &Value) {
    let built = serde_json::to_value(built).unwrap();
    for part in ["metadata", "spec"] {
        if let Some(d) = first_difference(&built[part], &stored[part], part) {
            panic!("the stored pod is not the builder's: {d}");
        }
    }
}

/// Issue 28 item 1: the agent holds no pod write right; it orders its attempts' pods from the
/// broker, which makes exactly what the builder makes, for the caller's own node only. Each
/// attack is made with a real bound agent token on the real API server: another node's attempt
/// (403), a stale uid (404), no token (401), a runner pod for a native attempt, a runner pod
/// mounting another host path or running as root (422), removing another node's pod or a pod no
/// attempt owns (403). What is made is the builder's pod, field for field, on the caller's node,
/// and an order repeated after a lost answer meets it (200, same uid).
#[tokio::test]
async fn pods_are_made_only_for_the_callers_own_attempts_and_as_the_builder_makes_them() {
    let Some(mut w) = world("broker_pods", 1).await else {
        return;
    };
    w.trust_published_ca().await;
    let (token_a, token_b) = (w.agent_token("node-a").await, w.agent_token("node-b").await);
    let pods = w.pods();
    let on_a = w.attempt_in("node-a", AttemptState::Allocated).await;
    let on_b = w.attempt_in("node-b", AttemptState::Allocated).await;
    let none = || async { list_all(&pods).await.is_empty() };

    // Refused, and nothing made.
    let (status, body) = w
        .order(&on_b, OrderedPod::Placeholder, Some(&token_a))
        .await;
    assert_eq!((status, code(&body)), (403, "WrongNode"), "{body}");
    let (status, _) = w.order(&on_a, OrderedPod::Placeholder, None).await;
    assert_eq!(status, 401);
    let mut stale = on_a.clone();
    stale.metadata.uid = Some("00000000-0000-0000-0000-000000000000".into());
    let (status, body) = w
        .order(&stale, OrderedPod::Placeholder, Some(&token_a))
        .await;
    assert_eq!((status, code(&body)), (404, "UnknownAttempt"), "{body}");
    let runtime = |a: &RunnerAttempt| runtime_path(a).to_string_lossy().into_owned();
    let runner_order = |host_runtime: String, run_as_user: u32| OrderedPod::Runner {
        host_runtime,
        run_as_user,
        run_as_group: 20000,
        environment: BTreeMap::from([("FOO".to_owned(), "bar".to_owned())]),
        await_handoff_seconds: 300,
    };
    let (status, body) = w
        .order(&on_a, runner_order(runtime(&on_a), 20001), Some(&token_a))
        .await;
    assert_eq!(
        (status, code(&body)),
        (422, "PodRefused"),
        "a native attempt's runner pod: {body}"
    );
    assert!(none().await, "a refused order made a pod");

    // Its own attempt's placeholder: the builder's, on its node (201); asked again, the same (200).
    let (status, body) = w
        .order(&on_a, OrderedPod::Placeholder, Some(&token_a))
        .await;
    assert_eq!(status, 201, "{body}");
    let made: Pod = serde_json::from_value(body).unwrap();
    let expected = placeholder_pod(
        &on_a,
        "node-a",
        &PlaceholderSpec {
            image: runner_manager_e2e::harness::world::PLACEHOLDER_IMAGE.into(),
            priority_class: None,
        },
    )
    .unwrap();
    let stored = pods
        .get(made.metadata.name.as_deref().unwrap())
        .await
        .unwrap();
    let stored_json = serde_json::to_value(&stored).unwrap();
    assert_built(&expected, &stored_json);
    let labels = stored.metadata.labels.as_ref().unwrap();
    assert_eq!(
        labels.len(),
        4,
        "the convention's labels and no other: {labels:?}"
    );
    let (status, body) = w
        .order(&on_a, OrderedPod::Placeholder, Some(&token_a))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["metadata"]["uid"], stored_json["metadata"]["uid"]);

    // Removal: node B's placeholder and a pod no attempt owns are not node A's to remove.
    let (status, body) = w
        .order(&on_b, OrderedPod::Placeholder, Some(&token_b))
        .await;
    assert_eq!(status, 201, "{body}");
    let b_name = body["metadata"]["name"].as_str().unwrap().to_owned();
    let b_uid = body["metadata"]["uid"].as_str().unwrap().to_owned();
    let (status, body) = w.remove(&b_name, &b_uid, &token_a).await;
    assert_eq!((status, code(&body)), (403, "NotYourPod"), "{body}");
    let mut bystander = stored.clone();
    bystander.metadata = ObjectMeta {
        name: Some("bystander".into()),
        ..ObjectMeta::default()
    };
    bystander.spec.as_mut().unwrap().node_name = Some("node-a".into());
    let bystander = pods
        .create(&PostParams::default(), &bystander)
        .await
        .unwrap();
    let (status, body) = w
        .remove(
            "bystander",
            bystander.metadata.uid.as_deref().unwrap(),
            &token_a,
        )
        .await;
    assert_eq!((status, code(&body)), (403, "NotYourPod"), "{body}");
    assert!(pods.get_opt(&b_name).await.unwrap().is_some());
    assert!(pods.get_opt("bystander").await.unwrap().is_some());
    // Its own: removed (and removing it again is done).
    let own = stored.metadata.name.clone().unwrap();
    let own_uid = stored.metadata.uid.clone().unwrap();
    assert_eq!(w.remove(&own, &own_uid, &token_a).await.0, 200);
    assert!(pods.get_opt(&own).await.unwrap().is_none());
    assert_eq!(w.remove(&own, &own_uid, &token_a).await.0, 200);

    // An OCI attempt preparing on node A: a runner pod mounting another host path, or running
    // as root, is refused; the journalled runtime as its runner account is the builder's pod.
    let image = format!("registry.local/runner@sha256:{}", "a".repeat(64));
    let oci = w
        .attempt_with("node-a", AttemptState::Preparing, |a| {
            a.spec.snapshot.execution.mode = ExecutionMode::Oci;
            a.spec.snapshot.execution.image = Some(image.clone());
        })
        .await;
    for hostile in [
        runner_order("/".into(), 20001),
        runner_order(runtime(&oci), 0),
    ] {
        let (status, body) = w.order(&oci, hostile, Some(&token_a)).await;
        assert_eq!((status, code(&body)), (422, "PodRefused"), "{body}");
    }
    let (status, body) = w
        .order(&oci, runner_order(runtime(&oci), 20001), Some(&token_a))
        .await;
    assert_eq!(status, 201, "{body}");
    let env = BTreeMap::from([("FOO".to_owned(), "bar".to_owned())]);
    let rt = runtime(&oci);
    let expected = runner_pod(
        &oci,
        &RunnerPodInputs {
            node: "node-a",
            host_runtime: &rt,
            run_as_user: 20001,
            run_as_group: 20000,
            environment: &env,
            await_handoff_seconds: 300,
        },
    )
    .unwrap();
    assert_built(&expected, &body);
}
