//! Attacks on the trust boundaries (issue 13), each performed against the real API server with
//! the real operator process, node agents and the simulated GitHub, and each refused with nothing
//! changed. Skipped without `KUBECONFIG`.
//!
//! A hostile tenant (finding 4): a policy in another namespace naming the victim's repository
//! with a junk Secret, and one naming an owner the admin bound to the victim's namespace. A
//! forged or replayed delivery (finding 5): one team's hook secret signing for another team's
//! repository, and a captured delivery replayed under a fresh GUID.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::conditions::{ConditionStatus, find};
use runner_manager_crds::policy::{PolicyConditionType, PolicyReason, ScalePolicy};
use runner_manager_e2e::harness::product::{Product, ProductOptions, STEP, WEBHOOK_SECRET};
use runner_manager_e2e::harness::wait;
use runner_manager_e2e::harness::webhook::post_workflow_job;
use runner_manager_operator::webhook::sign;
use secrecy::SecretString;
use serde_json::json;

/// How long "nothing changed" is watched: many reconcile passes (the worlds resync every
/// second) and more than a webhook batch.
const QUIET: Duration = Duration::from_secs(12);

async fn get_policy(p: &Product, ns: &str, name: &str) -> Option<ScalePolicy> {
    Api::<ScalePolicy>::namespaced(p.kube.clone(), ns)
        .get(name)
        .await
        .ok()
}

/// Wait until policy `ns/name`'s condition `t` has `status` for its current generation; return
/// the policy.
async fn wait_condition(
    p: &Product,
    ns: &str,
    name: &str,
    t: PolicyConditionType,
    status: ConditionStatus,
) -> ScalePolicy {
    wait::until(STEP, &format!("{ns}/{name} {t:?}={status:?}"), || async {
        let sp = get_policy(p, ns, name).await?;
        let c = find(&sp.status.as_ref()?.conditions, t)?;
        (c.status == status && c.observed_generation == sp.metadata.generation).then_some(sp)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs in {}", p.logs().display()))
}

/// Wait until policy `ns`/`name` is `Ready=status` for its generation.
async fn ready_in(p: &Product, ns: &str, name: &str, status: ConditionStatus) -> ScalePolicy {
    wait_condition(p, ns, name, PolicyConditionType::Ready, status).await
}

/// A product with a second tenant namespace (`rm-aaa-…`, sorting before the victim's); the
/// product and that namespace.
async fn with_second_tenant(test: &str) -> Option<(Product, String)> {
    let p = Product::start_with(test, ProductOptions::extra_namespace("rm-aaa")).await?;
    let other = p.extra[0].clone();
    Some((p, other))
}

fn condition(
    sp: &ScalePolicy,
    t: PolicyConditionType,
) -> runner_manager_crds::conditions::Condition<PolicyConditionType, PolicyReason> {
    find(&sp.status.as_ref().unwrap().conditions, t)
        .unwrap()
        .clone()
}

fn pending_jobs(sp: &ScalePolicy) -> Vec<String> {
    sp.status
        .as_ref()
        .map(|s| s.pending_jobs.keys().cloned().collect())
        .unwrap_or_default()
}

async fn attempts_in(p: &Product, ns: &str) -> Vec<RunnerAttempt> {
    Api::<RunnerAttempt>::namespaced(p.kube.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

/// Events of reason `reason` about policy `ns/name`.
async fn events_about(p: &Product, ns: &str, name: &str, reason: &str) -> Vec<Event> {
    Api::<Event>::namespaced(p.kube.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .collect()
}

/// Hold `check` true for [`QUIET`]; panic naming `what` the first time it is false.
async fn stays<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let start = Instant::now();
    while start.elapsed() < QUIET {
        if let Err(why) = check().await {
            panic!("{what}: {why}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A `workflow_job` delivery body as GitHub's receiver parses it.
fn delivery(action: &str, job_id: u64, repository: &str, labels: &[&str]) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "action": action,
        "workflow_job": {
            "id": job_id, "run_id": job_id + 1, "labels": labels, "runner_name": null,
            "status": action,
        },
        "repository": {
            "full_name": repository,
            "html_url": format!("https://github.com/{repository}"),
        },
    }))
    .unwrap()
}

/// POST `body` to `path` of operator 0's webhook listener with `signature` and `guid`.
async fn post(p: &Product, path: &str, guid: &str, signature: &str, body: Vec<u8>) -> u16 {
    let url = format!("http://{}{path}", p.operators[0].webhook);
    post_workflow_job(&url, guid, signature, body).await
}

/// Finding 4: namespace `rm-aaa-…` sorts before the victim's `rm-team-…` and names the same
/// repository and labels, with a Secret GitHub rejects. Matching ties by namespace, so without
/// the Ready filter its ledger takes every job of the victim (and polling defers to it too): the
/// victim's jobs would never run. With it, the victim's runners take them, and both policies say
/// `Conflict`.
#[tokio::test]
async fn a_foreign_policy_with_a_junk_secret_never_takes_the_victims_jobs() {
    let Some((p, attacker)) = with_second_tenant("attack_junk_secret_steals_jobs").await else {
        return;
    };
    p.secret(&attacker, "junk", &[("token", "ghp_junkjunkjunkjunk")])
        .await
        .unwrap();
    p.policy_in(
        &attacker,
        "steal",
        json!({"github": {"credentialsSecretRef": {"name": "junk"}}}),
    )
    .await
    .unwrap();
    p.policy("web", json!({"minIdle": 0})).await.unwrap();
    ready_in(&p, &p.team, "web", ConditionStatus::True).await;
    let steal = ready_in(&p, &attacker, "steal", ConditionStatus::False).await;
    assert_eq!(
        condition(&steal, PolicyConditionType::Ready).reason,
        PolicyReason::CredentialsRejected
    );

    let jobs = p.queue_jobs(2, 200).await.unwrap();
    p.wait_jobs_completed(&jobs, Duration::from_secs(180))
        .await
        .unwrap();
    let victims: Vec<String> = attempts_in(&p, &p.team)
        .await
        .iter()
        .map(|a| runner_manager_crds::names::runner_name(a.spec.attempt_uuid().unwrap()))
        .collect();
    for id in &jobs {
        let job = p.job(*id).await.unwrap();
        let runner = job["runner_name"].as_str().unwrap_or_default().to_owned();
        assert!(
            victims.contains(&runner),
            "job {id} ran on {runner}, not the victim's"
        );
    }
    let steal = get_policy(&p, &attacker, "steal").await.unwrap();
    for id in &jobs {
        assert!(
            !pending_jobs(&steal).contains(&id.to_string()),
            "the attacker's ledger holds job {id}"
        );
    }
    assert!(attempts_in(&p, &attacker).await.is_empty());

    // Both namespaces are told, each naming the other, and an Event says so on each.
    let web = wait_condition(
        &p,
        &p.team,
        "web",
        PolicyConditionType::Conflict,
        ConditionStatus::True,
    )
    .await;
    let c = condition(&web, PolicyConditionType::Conflict);
    assert_eq!(c.reason, PolicyReason::TargetClaimedElsewhere);
    assert!(
        c.message.contains(&format!("{attacker}/steal")),
        "{}",
        c.message
    );
    let steal = wait_condition(
        &p,
        &attacker,
        "steal",
        PolicyConditionType::Conflict,
        ConditionStatus::True,
    )
    .await;
    let c = condition(&steal, PolicyConditionType::Conflict);
    assert!(
        c.message.contains(&format!("{}/web", p.team)),
        "{}",
        c.message
    );
    for (ns, name) in [(p.team.as_str(), "web"), (attacker.as_str(), "steal")] {
        wait::until(STEP, "a TargetConflict event", || async {
            (!events_about(&p, ns, name, "TargetConflict")
                .await
                .is_empty())
            .then_some(())
        })
        .await
        .unwrap();
    }
}

/// Finding 4: the admin binds owner `acme` to the victim's namespace. A policy elsewhere naming
/// `acme/web` — with the same, valid App credentials, so it would resolve — is not Ready, says
/// which setting refuses it and how to fix it, and takes no job.
#[tokio::test]
async fn an_owner_bound_to_a_namespace_is_refused_elsewhere_even_with_valid_credentials() {
    let options = ProductOptions {
        extra_namespaces: vec!["rm-aaa".into()],
        operator_flags: vec![("--owner-namespaces".into(), "acme={team}".into())],
        ..ProductOptions::default()
    };
    let Some(p) = Product::start_with("attack_bound_owner", options).await else {
        return;
    };
    let attacker = p.extra[0].clone();
    p.policy_in(&attacker, "steal", json!({})).await.unwrap();
    p.policy("web", json!({"minIdle": 0})).await.unwrap();
    ready_in(&p, &p.team, "web", ConditionStatus::True).await;
    let steal = ready_in(&p, &attacker, "steal", ConditionStatus::False).await;
    let ready = condition(&steal, PolicyConditionType::Ready);
    assert_eq!(ready.reason, PolicyReason::OwnerBoundElsewhere, "{ready:?}");
    for part in [
        "acme",
        "--owner-namespaces",
        "ownerNamespaces",
        &p.team,
        &attacker,
    ] {
        assert!(
            ready.message.contains(part),
            "{part} not in {}",
            ready.message
        );
    }

    let job = p.run_job(200, Duration::from_secs(180)).await.unwrap();
    let steal = get_policy(&p, &attacker, "steal").await.unwrap();
    assert!(!pending_jobs(&steal).contains(&job.to_string()));
    assert!(attempts_in(&p, &attacker).await.is_empty());
    // Still refused: the policy did not become Ready meanwhile.
    assert_eq!(
        condition(&steal, PolicyConditionType::Ready).status,
        ConditionStatus::False
    );
}

/// Finding 5: team A (namespace `rm-aaa-…`) has its own hook secret for its repository
/// `acme/api`. Signing a `queued` of the victim's repository `acme/web` with it — on team A's
/// own route, or on the cluster route — is refused, and the victim's ledger and attempts do not
/// move. The same delivery about team A's own repository is taken on its route (the route works;
/// the refusal is about whose secret it is).
#[tokio::test]
async fn a_delivery_signed_with_one_teams_secret_for_another_teams_repository_is_refused() {
    let Some((p, team_a)) = with_second_tenant("attack_foreign_hook_secret").await else {
        return;
    };
    let a_secret = SecretString::from("team-a-hook-secret");
    p.secret(&team_a, "hook", &[("secret", "team-a-hook-secret")])
        .await
        .expect("team A's webhook secret");
    p.policy_in(
        &team_a,
        "api",
        json!({
            "github": {"url": "https://github.com/acme/api"},
            "labels": ["self-hosted", "api"],
            "minIdle": 0,
            "webhook": {"secretRef": {"name": "hook"}},
        }),
    )
    .await
    .unwrap();
    p.policy("web", json!({"minIdle": 0})).await.unwrap();
    for (ns, name) in [(p.team.as_str(), "web"), (team_a.as_str(), "api")] {
        ready_in(&p, ns, name, ConditionStatus::True).await;
    }
    let forged_job = 990_000_001_u64;
    let forged = delivery("queued", forged_job, "acme/web", &["self-hosted", "linux"]);
    let signature = sign(&a_secret, &forged);
    let route = format!("/webhook/{team_a}/api");
    assert_eq!(
        post(&p, &route, "forged-1", &signature, forged.clone()).await,
        403,
        "team A's secret on team A's route, about the victim's repository"
    );
    assert_eq!(
        post(&p, "/webhook", "forged-2", &signature, forged.clone()).await,
        401,
        "team A's secret is not the cluster's"
    );
    assert_eq!(
        post(
            &p,
            &format!("/webhook/{}/web", p.team),
            "forged-3",
            &signature,
            forged.clone()
        )
        .await,
        401,
        "the victim sets no hook of its own: its route verifies nothing"
    );
    let team = p.team.clone();
    stays("the victim's demand is unchanged", || async {
        let web = get_policy(&p, &team, "web").await.ok_or("victim gone")?;
        if pending_jobs(&web).contains(&forged_job.to_string()) {
            return Err(format!(
                "the forged job is in the victim's ledger: {:?}",
                pending_jobs(&web)
            ));
        }
        let attempts = attempts_in(&p, &team).await;
        if !attempts.is_empty() {
            return Err(format!(
                "{} attempt(s) created for the victim",
                attempts.len()
            ));
        }
        Ok(())
    })
    .await;

    // Control: the same secret about its own repository is taken on its own route.
    let own_job = 990_000_002_u64;
    let own = delivery("queued", own_job, "acme/api", &["self-hosted", "api"]);
    assert_eq!(
        post(&p, &route, "own-1", &sign(&a_secret, &own), own).await,
        202
    );
    wait::until(STEP, "team A's own job in its ledger", || async {
        let api = get_policy(&p, &team_a, "api").await?;
        pending_jobs(&api)
            .contains(&own_job.to_string())
            .then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs in {}", p.logs().display()));
}

/// Finding 5: the GUID is a header the signature does not cover. A captured `queued` delivery
/// (body and signature exactly as GitHub sent them) replayed with a fresh GUID after its job ran
/// is acknowledged as a duplicate and puts nothing back into the ledger: no runner is launched
/// for a job that is done.
#[tokio::test]
async fn a_replayed_delivery_with_a_fresh_guid_changes_nothing() {
    let Some(p) = Product::start("attack_replay_fresh_guid").await else {
        return;
    };
    p.policy("web", json!({"minIdle": 0})).await.unwrap();
    ready_in(&p, &p.team, "web", ConditionStatus::True).await;
    let job = p.run_job(200, Duration::from_secs(180)).await.unwrap();
    // The genuine `queued` delivery, as captured on the wire.
    let deliveries = p.fake.deliveries().await.unwrap();
    let captured = deliveries
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["job_id"].as_u64() == Some(job) && d["action"] == "queued")
        .cloned()
        .unwrap();
    assert!(
        captured["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["status"] == 202),
        "the genuine delivery was accepted: {captured}"
    );
    let body = captured["body"].as_str().unwrap().as_bytes().to_vec();
    // HMAC is deterministic: this is the signature GitHub sent with it.
    let signature = sign(&SecretString::from(WEBHOOK_SECRET), &body);
    // Its job ran: wait until the ledger and the live attempts have settled.
    let team = p.team.clone();
    wait::until(STEP, "the ledger empty", || async {
        let web = get_policy(&p, &team, "web").await?;
        pending_jobs(&web).is_empty().then_some(())
    })
    .await
    .unwrap();
    let before: Vec<String> = attempts_in(&p, &team)
        .await
        .iter()
        .filter_map(|a| a.metadata.name.clone())
        .collect();

    let fresh = uuid::Uuid::new_v4().to_string();
    assert_eq!(
        post(&p, "/webhook", &fresh, &signature, body.clone()).await,
        200,
        "acknowledged as a duplicate"
    );
    stays("the replay changes nothing", || async {
        let web = get_policy(&p, &team, "web").await.ok_or("policy gone")?;
        if pending_jobs(&web).contains(&job.to_string()) {
            return Err(format!("the done job {job} is pending again"));
        }
        let new: Vec<String> = attempts_in(&p, &team)
            .await
            .iter()
            .filter_map(|a| a.metadata.name.clone())
            .filter(|n| !before.contains(n))
            .collect();
        if !new.is_empty() {
            return Err(format!("attempts launched for the replay: {new:?}"));
        }
        Ok(())
    })
    .await;
}

/// Finding 3: a node agent's token reaches only its own node's attempts and Lease. The operator's
/// admission webhook is registered for this test's namespaces only (a `namespaceSelector` on a
/// label no other test's namespaces carry, see `harness::admission`), and the requests are made
/// as the agent ServiceAccount — with exactly the chart's RBAC — by a token bound to simulated
/// agent pod A, as a compromised node A would make them.
mod node_confinement {
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};

    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
    use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
    use runner_manager_crds::attempt::RunnerAttempt;
    use runner_manager_crds::names::agent_lease_name;
    use runner_manager_e2e::harness::admission::{
        agent_client, grant_agent_rbac, label_namespaces, register, token_client, unregister,
    };
    use runner_manager_e2e::harness::cluster::{created, fresh_namespace, list_all};
    use runner_manager_e2e::harness::fixtures::native_attempt;
    use runner_manager_e2e::harness::product::{Product, ProductOptions};
    use runner_manager_e2e::harness::wait;
    use serde_json::{Value, json};

    /// The API server's answer to a refused write: (code, message).
    fn refusal<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> (u16, String) {
        match r {
            Err(kube::Error::Api(s)) => (s.code, s.message),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// The API server refused the write (403) with a message `saying` this.
    fn assert_forbidden_saying<T: std::fmt::Debug>(r: Result<T, kube::Error>, saying: &str) {
        let (code, message) = refusal(r);
        assert_eq!(code, 403, "{message}");
        assert!(message.contains(saying), "{message}");
    }

    /// Ask `attempts` to move attempt `name` to `node`: a change of its spec.
    async fn move_to(
        attempts: &Api<RunnerAttempt>,
        name: &str,
        node: &str,
    ) -> Result<RunnerAttempt, kube::Error> {
        let patch = Patch::Merge(json!({"spec": {"nodeName": node}}));
        attempts.patch(name, &PatchParams::default(), &patch).await
    }

    fn status_patch(v: Value) -> Patch<Value> {
        Patch::Merge(json!({ "status": v }))
    }

    async fn attempt_on(kube: &kube::Client, ns: &str, node: &str) -> RunnerAttempt {
        let id = uuid::Uuid::new_v4();
        let a = native_attempt(id, "web", "uid-web", node);
        let api = Api::<RunnerAttempt>::namespaced(kube.clone(), ns);
        let created = api.create(&PostParams::default(), &a).await.unwrap();
        let name = created.metadata.name.clone().unwrap();
        let runner = runner_manager_crds::names::runner_name(id);
        api.patch_status(
            &name,
            &PatchParams::default(),
            &status_patch(json!({"state": "Idle", "runner": {"id": 7, "name": runner}})),
        )
        .await
        .unwrap()
    }

    fn status_of(a: &RunnerAttempt) -> Value {
        serde_json::to_value(a.status.as_ref().unwrap()).unwrap()
    }

    /// A token of a tenant account that an admin (wrongly) granted write rights on attempts.
    async fn overprivileged_tenant(kube: &kube::Client, ns: &str) -> kube::Client {
        let pp = PostParams::default();
        let meta = || ObjectMeta {
            name: Some("tenant".into()),
            ..ObjectMeta::default()
        };
        let account = ServiceAccount {
            metadata: meta(),
            ..ServiceAccount::default()
        };
        let role = Role {
            metadata: meta(),
            rules: Some(vec![PolicyRule {
                api_groups: Some(vec!["runner-manager.dev".into()]),
                resources: Some(vec!["runnerattempts".into()]),
                verbs: vec![
                    "get".into(),
                    "create".into(),
                    "update".into(),
                    "patch".into(),
                ],
                ..PolicyRule::default()
            }]),
        };
        let binding = RoleBinding {
            metadata: meta(),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: "tenant".into(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: "tenant".into(),
                namespace: Some(ns.into()),
                ..Subject::default()
            }]),
        };
        created(Api::namespaced(kube.clone(), ns), &account)
            .await
            .unwrap();
        created(Api::namespaced(kube.clone(), ns), &role)
            .await
            .unwrap();
        created(Api::namespaced(kube.clone(), ns), &binding)
            .await
            .unwrap();
        let token = Api::<ServiceAccount>::namespaced(kube.clone(), ns)
            .create_token_request("tenant", &pp, &Default::default())
            .await
            .unwrap()
            .status
            .unwrap()
            .token;
        token_client(&token).await.unwrap()
    }

    fn percentile(sorted: &[Duration], p: f64) -> Duration {
        let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
        sorted[i]
    }

    /// `n` status writes by agent A to its own attempt, each timed.
    async fn timed_writes(api: &Api<RunnerAttempt>, name: &str, n: usize) -> Vec<Duration> {
        let mut took = Vec::with_capacity(n);
        for i in 0..n {
            let state = if i % 2 == 0 { "Busy" } else { "Idle" };
            let started = Instant::now();
            api.patch_status(
                name,
                &PatchParams::default(),
                &status_patch(json!({"state": state})),
            )
            .await
            .unwrap();
            took.push(started.elapsed());
        }
        took.sort();
        took
    }

    #[tokio::test]
    async fn an_agent_token_of_one_node_cannot_write_another_nodes_attempts_or_leases() {
        let options = ProductOptions {
            nodes: vec![],
            ..ProductOptions::default()
        };
        let Some(p) = Product::start_with("agent_confinement", options).await else {
            return;
        };
        let kube = p.kube.clone();
        let sys = p.system.clone();
        // The attempts live in a namespace the operator does not reconcile: only its webhook
        // acts on them, so every change seen below is the attacker's or the test's.
        let ns = fresh_namespace(&kube, "rm-conf").await.unwrap();
        let scope = uuid::Uuid::new_v4().simple().to_string();
        label_namespaces(&kube, &[&sys, &ns], &scope).await.unwrap();
        let a = p.add_node("conf-a", BTreeMap::new()).await.unwrap().node;
        let b = p.add_node("conf-b", BTreeMap::new()).await.unwrap().node;
        let (node_a, node_b) = (a.name.clone(), b.name.clone());
        grant_agent_rbac(&kube, &sys).await.unwrap();
        let ra_a = attempt_on(&kube, &ns, &a.name).await;
        let ra_b = attempt_on(&kube, &ns, &b.name).await;
        let (name_a, name_b) = (
            ra_a.metadata.name.clone().unwrap(),
            ra_b.metadata.name.clone().unwrap(),
        );
        let leader = wait::until(
            Duration::from_secs(60),
            "the operator holds its leader Lease",
            || async { p.leader().await },
        )
        .await
        .unwrap();

        let config = format!("rm-e2e-{scope}");
        let registered = register(&kube, &config, &sys, &p.operators[0].admission, &scope)
            .await
            .unwrap();
        let as_a = agent_client(&kube, &sys, &a.pod).await.unwrap();
        let attempts_a = Api::<RunnerAttempt>::namespaced(as_a.clone(), &ns);
        let leases_a = Api::<Lease>::namespaced(as_a.clone(), &sys);
        // The API server picks the configuration up within a moment: probe with a dry run.
        let dry = PatchParams {
            dry_run: true,
            ..PatchParams::default()
        };
        wait::until(Duration::from_secs(30), "the webhook answers", || async {
            attempts_a
                .patch_status(&name_b, &dry, &status_patch(json!({"state": "Busy"})))
                .await
                .err()
                .filter(|e| e.to_string().contains("admission webhook"))
                .map(|_| ())
        })
        .await
        .unwrap();

        // 1. Node A concludes node B's busy attempt: refused, B's status unchanged.
        assert_forbidden_saying(
            attempts_a
                .patch_status(
                    &name_b,
                    &PatchParams::default(),
                    &status_patch(json!({"state": "Finished"})),
                )
                .await,
            &format!("bound to node {node_b}"),
        );
        // 2. Node A forges the runner of its own attempt (so the operator would deregister
        //    someone else's runner): refused.
        assert_forbidden_saying(
            attempts_a
                .patch_status(
                    &name_a,
                    &PatchParams::default(),
                    &status_patch(
                        json!({"runner": {"id": 424242, "name": "runner-manager-victim"}}),
                    ),
                )
                .await,
            "status.runner is not the agent's",
        );
        // 3. Node A writes node B's Lease (forged capacity, recoveryComplete): refused; and the
        //    operator's leader Lease: refused, the holder unchanged.
        let forged = Lease {
            metadata: ObjectMeta {
                name: Some(agent_lease_name(&node_b)),
                annotations: Some(
                    [("runner-manager.dev/capacity".to_owned(), "999".to_owned())].into(),
                ),
                ..ObjectMeta::default()
            },
            ..Lease::default()
        };
        assert_forbidden_saying(
            leases_a.create(&PostParams::default(), &forged).await,
            "an agent writes only its own node's Lease",
        );
        let (code, message) = refusal(
            leases_a
                .patch(
                    "runner-manager-operator",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"holderIdentity": "node-a-attacker", "leaseDurationSeconds": 3600}})),
                )
                .await,
        );
        assert_eq!(code, 403, "{message}");
        // 4. Creating an attempt, or changing a spec: refused for the agent (RBAC and webhook)
        //    and, by the webhook, for a tenant account an admin granted too much.
        let extra = native_attempt(uuid::Uuid::new_v4(), "web", "uid-web", &node_a);
        let (code, _) = refusal(attempts_a.create(&PostParams::default(), &extra).await);
        assert_eq!(code, 403);
        let (code, _) = refusal(move_to(&attempts_a, &name_b, &node_a).await);
        assert_eq!(code, 403);
        let tenant = Api::<RunnerAttempt>::namespaced(overprivileged_tenant(&kube, &ns).await, &ns);
        assert_forbidden_saying(
            tenant.create(&PostParams::default(), &extra).await,
            "only the operator creates RunnerAttempts",
        );
        assert_forbidden_saying(
            move_to(&tenant, &name_b, &node_a).await,
            "only the operator changes an attempt's spec",
        );

        // Nothing changed.
        let admin_attempts = Api::<RunnerAttempt>::namespaced(kube.clone(), &ns);
        let now_b = admin_attempts.get(&name_b).await.unwrap();
        assert_eq!(status_of(&now_b), status_of(&ra_b), "B's status changed");
        assert_eq!(now_b.spec, ra_b.spec, "B's spec changed");
        assert_eq!(
            status_of(&admin_attempts.get(&name_a).await.unwrap())["runner"],
            status_of(&ra_a)["runner"]
        );
        assert_eq!(list_all(&admin_attempts).await.len(), 2);
        let leases = Api::<Lease>::namespaced(kube.clone(), &sys);
        assert!(
            leases
                .get_opt(&agent_lease_name(&node_b))
                .await
                .unwrap()
                .is_none()
        );
        assert_eq!(p.leader().await.as_deref(), Some(leader.as_str()));

        // Node A's own writes pass: its attempt's status, its own Lease.
        attempts_a
            .patch_status(
                &name_a,
                &PatchParams::default(),
                &status_patch(json!({"state": "Busy"})),
            )
            .await
            .unwrap();
        let own = Lease {
            metadata: ObjectMeta {
                name: Some(agent_lease_name(&node_a)),
                ..ObjectMeta::default()
            },
            ..Lease::default()
        };
        leases_a.create(&PostParams::default(), &own).await.unwrap();
        leases_a
            .patch(
                &agent_lease_name(&node_a),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"holderIdentity": node_a}})),
            )
            .await
            .unwrap();

        // The webhook's cost per agent status write (docs/benchmarks.md): 200 writes with it,
        // then 200 once the configuration is gone.
        let with = timed_writes(&attempts_a, &name_a, 200).await;
        unregister(&kube, &config).await.unwrap();
        drop(registered);
        wait::until(Duration::from_secs(30), "the webhook is gone", || async {
            attempts_a
                .patch_status(&name_b, &dry, &status_patch(json!({"state": "Busy"})))
                .await
                .ok()
                .map(|_| ())
        })
        .await
        .unwrap();
        let without = timed_writes(&attempts_a, &name_a, 200).await;
        eprintln!(
            "admission latency per agent status write (200 each): with webhook p50 {:?} p95 {:?}; without p50 {:?} p95 {:?}",
            percentile(&with, 0.5),
            percentile(&with, 0.95),
            percentile(&without, 0.5),
            percentile(&without, 0.95),
        );
    }
}
