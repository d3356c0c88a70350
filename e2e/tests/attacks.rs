//! Attacks on the trust boundaries (issue 13), each performed against the real API server with
//! the real operator process, node agents and the simulated GitHub, and each refused with nothing
//! changed. Skipped without `KUBECONFIG`.
//!
//! A hostile tenant (finding 4): a policy in another namespace naming the victim's repository
//! with a junk Secret, and one naming an owner the admin bound to the victim's namespace. A
//! forged or replayed delivery (finding 5): one team's hook secret signing for another team's
//! repository, and a captured delivery replayed under a fresh GUID.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::conditions::{ConditionStatus, find};
use runner_manager_crds::policy::{PolicyConditionType, PolicyReason, ScalePolicy};
use runner_manager_e2e::harness::product::{Product, ProductOptions, STEP, WEBHOOK_SECRET};
use runner_manager_e2e::harness::wait;
use runner_manager_operator::webhook::sign;
use secrecy::SecretString;
use serde_json::{Value, json};

/// How long "nothing changed" is watched: many reconcile passes (the worlds resync every
/// second) and more than a webhook batch.
const QUIET: Duration = Duration::from_secs(12);

async fn create_secret(p: &Product, ns: &str, name: &str, data: &[(&str, &str)]) {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(p.kube.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

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
    reqwest::Client::new()
        .post(format!("http://{}{path}", p.operators[0].webhook))
        .header("content-type", "application/json")
        .header("x-github-event", "workflow_job")
        .header("x-github-delivery", guid)
        .header("x-hub-signature-256", signature)
        .body(body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Finding 4: namespace `rm-aaa-…` sorts before the victim's `rm-team-…` and names the same
/// repository and labels, with a Secret GitHub rejects. Matching ties by namespace, so without
/// the Ready filter its ledger takes every job of the victim (and polling defers to it too): the
/// victim's jobs would never run. With it, the victim's runners take them, and both policies say
/// `Conflict`.
#[tokio::test]
async fn a_foreign_policy_with_a_junk_secret_never_takes_the_victims_jobs() {
    let options = ProductOptions {
        extra_namespaces: vec!["rm-aaa".into()],
        ..ProductOptions::default()
    };
    let Some(p) = Product::start("attack_junk_secret_steals_jobs", options)
        .await
        .unwrap()
    else {
        return;
    };
    let attacker = p.extra[0].clone();
    create_secret(&p, &attacker, "junk", &[("token", "ghp_junkjunkjunkjunk")]).await;
    p.policy_in(
        &attacker,
        "steal",
        json!({"github": {"credentialsSecretRef": {"name": "junk"}}}),
    )
    .await
    .unwrap();
    p.policy("web", json!({"minIdle": 0})).await.unwrap();
    wait_condition(
        &p,
        &p.team,
        "web",
        PolicyConditionType::Ready,
        ConditionStatus::True,
    )
    .await;
    let steal = wait_condition(
        &p,
        &attacker,
        "steal",
        PolicyConditionType::Ready,
        ConditionStatus::False,
    )
    .await;
    assert_eq!(
        condition(&steal, PolicyConditionType::Ready).reason,
        PolicyReason::CredentialsRejected
    );

    let jobs = vec![
        p.queue_job(&["self-hosted", "linux"], json!({"duration_ms": 200}))
            .await
            .unwrap(),
        p.queue_job(&["self-hosted", "linux"], json!({"duration_ms": 200}))
            .await
            .unwrap(),
    ];
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
    let Some(p) = Product::start("attack_bound_owner", options).await.unwrap() else {
        return;
    };
    let attacker = p.extra[0].clone();
    p.policy_in(&attacker, "steal", json!({})).await.unwrap();
    p.policy("web", json!({"minIdle": 0})).await.unwrap();
    wait_condition(
        &p,
        &p.team,
        "web",
        PolicyConditionType::Ready,
        ConditionStatus::True,
    )
    .await;
    let steal = wait_condition(
        &p,
        &attacker,
        "steal",
        PolicyConditionType::Ready,
        ConditionStatus::False,
    )
    .await;
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

    let job = p
        .queue_job(&["self-hosted", "linux"], json!({"duration_ms": 200}))
        .await
        .unwrap();
    p.wait_jobs_completed(&[job], Duration::from_secs(180))
        .await
        .unwrap();
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
    let options = ProductOptions {
        extra_namespaces: vec!["rm-aaa".into()],
        ..ProductOptions::default()
    };
    let Some(p) = Product::start("attack_foreign_hook_secret", options)
        .await
        .unwrap()
    else {
        return;
    };
    let team_a = p.extra[0].clone();
    let a_secret = SecretString::from("team-a-hook-secret");
    create_secret(&p, &team_a, "hook", &[("secret", "team-a-hook-secret")]).await;
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
        wait_condition(
            &p,
            ns,
            name,
            PolicyConditionType::Ready,
            ConditionStatus::True,
        )
        .await;
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
    let Some(p) = Product::start("attack_replay_fresh_guid", ProductOptions::default())
        .await
        .unwrap()
    else {
        return;
    };
    p.policy("web", json!({"minIdle": 0})).await.unwrap();
    wait_condition(
        &p,
        &p.team,
        "web",
        PolicyConditionType::Ready,
        ConditionStatus::True,
    )
    .await;
    let job = p
        .queue_job(&["self-hosted", "linux"], json!({"duration_ms": 200}))
        .await
        .unwrap();
    p.wait_jobs_completed(&[job], Duration::from_secs(180))
        .await
        .unwrap();
    // The genuine `queued` delivery, as captured on the wire.
    let deliveries = p
        .fake
        .admin("GET", "deliveries", Value::Null)
        .await
        .unwrap();
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
