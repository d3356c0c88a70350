//! The operator's GitHub client against the simulated GitHub: App auth end to end with a cached
//! installation token, pagination, retry discipline (429 + retry-after honoured, 403 terminal
//! without a retry), a mint never resent blindly, and the contract test: every request the client
//! sent is one GitHub's official description defines (method, path, query, body schema).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use runner_manager_e2e::fake_github::conformance::{Conformance, github_testdata_dir};
use runner_manager_e2e::harness::github::{
    ORG, SimulatedGitHub, app_credentials as harness_app_credentials, app_secret_data,
    pat_credentials,
};
use runner_manager_operator::github::auth::Credentials;
use runner_manager_operator::github::client::{Deleted, SentRequest};
use runner_manager_operator::github::errors::Terminal;
use runner_manager_operator::github::ratelimit::Priority;
use runner_manager_operator::github::{GitHubClient, GitHubError};
use serde_json::{Value, json};

fn app_credentials(installation: Option<u64>) -> Credentials {
    harness_app_credentials(installation).unwrap()
}

fn pat() -> Credentials {
    pat_credentials()
}

fn client(fake: &SimulatedGitHub, url: &str, credentials: Credentials) -> GitHubClient {
    fake.client(url, credentials)
}

fn labels() -> Vec<String> {
    vec![
        "self-hosted".into(),
        "linux".into(),
        "rm-0123456789ab".into(),
    ]
}

/// A JIT for runner `name` in runner group 1 with the usual [`labels`].
async fn mint_jit(
    gh: &GitHubClient,
    name: &str,
) -> Result<runner_manager_operator::github::types::JitConfig, GitHubError> {
    gh.generate_jit(name, 1, &labels(), "_work").await
}

#[tokio::test]
async fn app_auth_end_to_end_with_one_token_for_many_calls() {
    let fake = SimulatedGitHub::start().await.unwrap();
    // No installationId in the Secret: the client looks it up with the App's JWT.
    let gh = client(
        &fake,
        &format!("https://github.com/{ORG}/web"),
        app_credentials(None),
    );
    let jit = mint_jit(&gh, "runner-manager-a").await.unwrap();
    assert!(jit.runner.id > 0);
    assert!(
        !format!("{jit:?}").contains(secrecy::ExposeSecret::expose_secret(
            &jit.encoded_jit_config
        ))
    );
    let listed = gh.list_runners().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].has_label("rm-0123456789ab"));
    assert_eq!(
        gh.find_runner("runner-manager-a", Priority::Observe)
            .await
            .unwrap()
            .map(|r| r.id),
        Some(jit.runner.id)
    );
    assert_eq!(
        gh.delete_runner(jit.runner.id, Priority::Observe)
            .await
            .unwrap(),
        Deleted::Deleted
    );
    assert_eq!(
        gh.delete_runner(jit.runner.id, Priority::Observe)
            .await
            .unwrap(),
        Deleted::AlreadyGone
    );
    // One installation lookup and one token for all of it: the token is cached.
    assert_eq!(fake.calls("installation").await.unwrap(), 1);
    assert_eq!(fake.calls("access_tokens").await.unwrap(), 1);
    // With a warm token a JIT mint costs exactly one GitHub call.
    let before = fake.counters().await.unwrap();
    mint_jit(&gh, "runner-manager-b").await.unwrap();
    let after = fake.counters().await.unwrap();
    assert_eq!(total(&after) - total(&before), 1, "{before} -> {after}");
    check_contract(&gh.sent());
}

fn total(counters: &Value) -> u64 {
    counters
        .as_object()
        .unwrap()
        .values()
        .flat_map(|m| m.as_object().unwrap().values())
        .filter_map(Value::as_u64)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_calls_on_a_cold_client_refresh_the_token_once() {
    let fake = SimulatedGitHub::start().await.unwrap();
    let gh = std::sync::Arc::new(client(
        &fake,
        &format!("https://github.com/{ORG}/web"),
        app_credentials(Some(777)),
    ));
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let gh = gh.clone();
            tokio::spawn(async move { gh.list_runners().await })
        })
        .collect();
    for c in calls {
        c.await.unwrap().unwrap();
    }
    assert_eq!(
        fake.calls("access_tokens").await.unwrap(),
        1,
        "one refresh at a time"
    );
    assert_eq!(fake.calls("list_runners").await.unwrap(), 8);
}

#[tokio::test]
async fn a_token_works_at_organization_scope_and_pages_are_all_read() {
    let fake = SimulatedGitHub::start().await.unwrap();
    let gh = client(&fake, &format!("https://github.com/{ORG}"), pat());
    for i in 0..250 {
        mint_jit(&gh, &format!("runner-manager-{i:03}"))
            .await
            .unwrap();
    }
    let before = fake.calls("list_runners").await.unwrap();
    let all = gh.list_runners().await.unwrap();
    assert_eq!(all.len(), 250);
    let names: std::collections::BTreeSet<_> = all.iter().map(|r| r.name.clone()).collect();
    assert_eq!(names.len(), 250, "no runner twice");
    assert_eq!(
        fake.calls("list_runners").await.unwrap() - before,
        3,
        "100 + 100 + 50"
    );
    // The second pass is conditional: unchanged pages answer 304 and are served from the cache.
    let again = gh.list_runners().await.unwrap();
    assert_eq!(again.len(), 250);
    assert_eq!(again, all);
    let counters = fake.counters().await.unwrap();
    assert_eq!(
        counters["list_runners"]["304"].as_u64(),
        Some(3),
        "{counters}"
    );
    // A change is seen: the page that changed answers 200 with the new content.
    mint_jit(&gh, "runner-manager-new").await.unwrap();
    assert_eq!(gh.list_runners().await.unwrap().len(), 251);

    check_contract(&gh.sent());
}

#[tokio::test]
async fn retry_after_is_honoured_and_a_permission_403_is_not_retried() {
    let fake = SimulatedGitHub::start().await.unwrap();
    let gh = client(&fake, &format!("https://github.com/{ORG}/web"), pat());
    fake.fault(
        json!({"endpoint": "list_runners", "count": 1, "status": 429, "retry_after_secs": 1}),
    )
    .await
    .unwrap();
    let started = Instant::now();
    assert!(gh.list_runners().await.unwrap().is_empty());
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "retry-after: 1 was honoured"
    );
    assert_eq!(fake.calls("list_runners").await.unwrap(), 2);

    // 5xx twice, then success.
    fake.fault(json!({"endpoint": "list_runners", "count": 2, "status": 502}))
        .await
        .unwrap();
    assert!(gh.list_runners().await.unwrap().is_empty());
    assert_eq!(fake.calls("list_runners").await.unwrap(), 5);

    // A 403 that is not a rate limit is terminal: one call, an error naming the permission.
    fake.fault(json!({"endpoint": "list_runners", "count": 3, "status": 403}))
        .await
        .unwrap();
    let err = gh.list_runners().await.unwrap_err();
    assert!(
        matches!(
            err,
            GitHubError::Terminal {
                reason: Terminal::MissingPermission,
                status: 403,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("Administration"), "{err}");
    assert_eq!(
        fake.calls("list_runners").await.unwrap(),
        6,
        "no retry after a 403"
    );
    fake.admin("DELETE", "faults", Value::Null).await.unwrap();
    check_contract(&gh.sent());
}

#[tokio::test]
async fn an_ambiguous_mint_failure_is_resolved_by_name_never_by_a_blind_resend() {
    let fake = SimulatedGitHub::start().await.unwrap();
    let gh = client(&fake, &format!("https://github.com/{ORG}/web"), pat());
    // A 502 on the mint: the client looks the name up before minting again.
    fake.fault(json!({"endpoint": "generate_jitconfig", "count": 1, "status": 502}))
        .await
        .unwrap();
    let jit = mint_jit(&gh, "runner-manager-x").await.unwrap();
    let sent: Vec<_> = gh
        .sent()
        .into_iter()
        .map(|r| (r.method, r.path, r.query))
        .collect();
    let mint = "/repos/acme/web/actions/runners/generate-jitconfig".to_owned();
    let lookup = "/repos/acme/web/actions/runners".to_owned();
    let order: Vec<&str> = sent
        .iter()
        .filter_map(|(m, p, q)| {
            if *p == mint && m == "POST" {
                Some("mint")
            } else if *p == lookup
                && q.iter()
                    .any(|(k, v)| k == "name" && v == "runner-manager-x")
            {
                Some("lookup")
            } else {
                None
            }
        })
        .collect();
    assert_eq!(order, ["mint", "lookup", "mint"], "{sent:?}");
    let ours = fake.runners_named("runner-manager-x").await.unwrap();
    assert_eq!(ours.len(), 1);
    assert_eq!(ours[0]["id"].as_i64(), Some(jit.runner.id));

    // A dropped connection before GitHub answered: the lookup finds nothing to delete and the
    // next mint succeeds under the same name.
    fake.fault(json!({"endpoint": "generate_jitconfig", "count": 1, "drop_connection": true}))
        .await
        .unwrap();
    let again = mint_jit(&gh, "runner-manager-y").await.unwrap();
    let ys = fake.runners_named("runner-manager-y").await.unwrap();
    assert_eq!(ys.len(), 1, "exactly one registration: {ys:?}");
    assert_eq!(ys[0]["id"].as_i64(), Some(again.runner.id));
    check_contract(&gh.sent());
}

#[tokio::test]
async fn runner_groups_resolve_by_name_and_unknown_groups_name_the_fix() {
    let fake = SimulatedGitHub::start().await.unwrap();
    let group = json!({"owner": format!("orgs/{ORG}"), "name": "linux-big"});
    let made = fake.admin("POST", "runner-groups", group).await.unwrap();
    let org = format!("https://github.com/{ORG}");
    let gh = client(&fake, &org, app_credentials(Some(777)));
    let id = gh.runner_group_id("linux-big").await.unwrap();
    assert_eq!(Some(id), made["id"].as_i64());
    let calls = fake.calls("runner_groups").await.unwrap();
    assert_eq!(gh.runner_group_id("linux-big").await.unwrap(), id);
    assert_eq!(
        fake.calls("runner_groups").await.unwrap(),
        calls,
        "cached per target"
    );
    let err = gh.runner_group_id("nope").await.unwrap_err();
    assert!(err.to_string().contains("spec.github.runnerGroup"), "{err}");
    let repo = client(&fake, &format!("https://github.com/{ORG}/web"), pat());
    assert_eq!(repo.runner_group_id("Default").await.unwrap(), 1);
    check_contract(&gh.sent());
}

#[tokio::test]
async fn queued_runs_and_their_jobs_are_read_for_polling_and_enterprise_targets_mint() {
    let fake = SimulatedGitHub::start().await.unwrap();
    let queued = fake
        .admin(
            "POST",
            "jobs",
            json!({"owner": ORG, "repo": "web", "labels": ["self-hosted", "linux"], "name": "build"}),
        )
        .await
        .unwrap();
    let gh = client(&fake, &format!("https://github.com/{ORG}/web"), pat());
    let runs = gh.queued_runs().await.unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(Some(runs[0].id), queued["run_id"].as_i64());
    let jobs = gh.run_jobs(runs[0].id).await.unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(Some(jobs[0].id), queued["job_id"].as_i64());
    assert_eq!(jobs[0].status, "queued");
    assert_eq!(jobs[0].labels, ["self-hosted", "linux"]);
    let job = gh.job(ORG, "web", jobs[0].id).await.unwrap();
    assert_eq!(job, jobs[0]);
    // Organization targets have no run listing: polling is for repository targets.
    let org = client(&fake, &format!("https://github.com/{ORG}"), pat());
    assert!(org.queued_runs().await.unwrap().is_empty());

    // Enterprise scope: mint, list, delete.
    let ent = client(&fake, "https://github.com/enterprises/big", pat());
    let jit = ent
        .generate_jit("runner-manager-ent", 1, &labels(), "_work")
        .await
        .unwrap();
    assert_eq!(ent.list_runners().await.unwrap().len(), 1);
    assert_eq!(
        ent.delete_runner(jit.runner.id, Priority::Observe)
            .await
            .unwrap(),
        Deleted::Deleted
    );
    check_contract(&gh.sent());
    check_contract(&ent.sent());
}

#[tokio::test]
async fn a_created_registration_whose_answer_was_lost_is_deleted_and_never_reminted() {
    let fake = SimulatedGitHub::start().await.unwrap();
    let gh = client(&fake, &format!("https://github.com/{ORG}/web"), pat());
    // GitHub registers the runner and answers 201, but the body never arrives: the JIT is lost.
    fake.fault(json!({"endpoint": "generate_jitconfig", "count": 1, "lose_body": true}))
        .await
        .unwrap();
    let err = mint_jit(&gh, "runner-manager-lost").await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    let mints = gh
        .sent()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/generate-jitconfig"))
        .count();
    assert_eq!(mints, 1, "never minted again after a 201");
    assert!(
        fake.runners()
            .await
            .unwrap()
            .iter()
            .all(|r| r["name"] != "runner-manager-lost"),
        "the registration whose JIT was lost is deleted"
    );
    check_contract(&gh.sent());
}

#[tokio::test]
async fn an_enterprise_server_target_uses_its_api_v3_base() {
    let fake = SimulatedGitHub::start().await.unwrap();
    let url = format!("https://ghes.example.com/{ORG}/web");
    let target = runner_manager_crds::target::GitHubTarget::parse(&url).unwrap();
    assert_eq!(target.api_base(), "https://ghes.example.com/api/v3");
    // The fake stands in for the GHES host: same base shape, `<host>/api/v3`.
    let config = runner_manager_operator::github::GitHubConfig {
        api_base: Some(format!("{}/api/v3", fake.base_url())),
        record: true,
        http_hosts: runner_manager_e2e::harness::github::loopback_hosts(),
        ..Default::default()
    };
    let gh = GitHubClient::new(target, pat(), config).unwrap();
    let jit = mint_jit(&gh, "runner-manager-ghes").await.unwrap();
    let listed = gh.list_runners().await.unwrap();
    assert_eq!(
        listed.iter().map(|r| r.id).collect::<Vec<_>>(),
        [jit.runner.id]
    );
    // Every call went under the prefix: the fake counts only calls at its root, so a client
    // that dropped `/api/v3` would show up here.
    assert_eq!(fake.calls("generate_jitconfig").await.unwrap(), 0);
    assert_eq!(fake.calls("list_runners").await.unwrap(), 0);
    check_contract(&gh.sent());
}

/// Issue 33 item 5: a GitHub Enterprise Server whose certificate a private CA signed. The
/// simulated GitHub serves HTTPS with such a certificate. The operator's client reaches it only
/// when given that CA (`--github-ca-file`, the chart's `caBundle`); without it the call fails
/// at the handshake and nothing reaches the server — no credential leaves.
#[tokio::test]
async fn an_enterprise_server_signed_by_a_private_ca_is_reached_only_with_its_ca() {
    let fake = SimulatedGitHub::start_tls_with_package(None).await.unwrap();
    assert!(
        fake.base_url().starts_with("https://"),
        "{}",
        fake.base_url()
    );
    let url = format!("https://ghes.example.com/{ORG}/web");
    let client = |extra_roots: Vec<reqwest::Certificate>| {
        let config = runner_manager_operator::github::GitHubConfig {
            api_base: Some(fake.base_url().to_owned()),
            retry: runner_manager_operator::github::retry::RetryPolicy {
                attempts: 1,
                base: Duration::from_millis(20),
                max_wait: Duration::from_secs(1),
            },
            extra_roots,
            ..Default::default()
        };
        let target = runner_manager_crds::target::GitHubTarget::parse(&url).unwrap();
        GitHubClient::new(target, pat(), config).unwrap()
    };
    let untrusted = client(vec![]).list_runners().await.unwrap_err();
    assert!(
        matches!(untrusted, GitHubError::Transport { .. }),
        "{untrusted}"
    );
    assert_eq!(
        fake.calls("list_runners").await.unwrap(),
        0,
        "a request passed an unverified handshake"
    );
    let ca = reqwest::Certificate::from_pem(fake.ca_pem.as_deref().unwrap().as_bytes()).unwrap();
    client(vec![ca]).list_runners().await.unwrap();
    assert_eq!(fake.calls("list_runners").await.unwrap(), 1);
}

/// Every request sent matches an operation of the official description: the method exists on a
/// path template that matches the path, every query parameter is declared for it, and the body
/// validates against its request schema.
fn check_contract(sent: &[SentRequest]) {
    let text = std::fs::read_to_string(github_testdata_dir().join("openapi-runners-subset.json"))
        .expect("GitHub's description is in the repository (e2e/testdata/github)");
    let openapi: Value = serde_json::from_str(&text).unwrap();
    let conformance = Conformance::load().unwrap();
    let paths = openapi["paths"].as_object().unwrap();
    assert!(!sent.is_empty());
    for req in sent {
        let segments: Vec<&str> = req.path.trim_start_matches('/').split('/').collect();
        let template = paths
            .keys()
            .filter(|t| {
                let ts: Vec<&str> = t.trim_start_matches('/').split('/').collect();
                ts.len() == segments.len()
                    && ts.iter().zip(&segments).all(|(t, s)| {
                        (t.starts_with('{') && t.ends_with('}') && !s.is_empty()) || t == s
                    })
            })
            // A literal segment beats a parameter (generate-jitconfig vs {runner_id}).
            .min_by_key(|t| t.matches('{').count())
            .unwrap_or_else(|| {
                panic!("{} {} is not in GitHub's description", req.method, req.path)
            });
        let op = &paths[template][req.method.to_ascii_lowercase()];
        assert!(
            op.is_object(),
            "{} {template} is not an operation",
            req.method
        );
        let declared: Vec<&str> = op["parameters"]
            .as_array()
            .map(|ps| {
                ps.iter()
                    .filter(|p| p["in"] == "query")
                    .filter_map(|p| p["name"].as_str())
                    .collect()
            })
            .unwrap_or_default();
        for (name, _) in &req.query {
            assert!(
                declared.contains(&name.as_str()),
                "{} {template}: query `{name}` is not declared",
                req.method
            );
        }
        if let Some(body) = &req.body {
            conformance
                .check_request(&req.method, template, body)
                .unwrap_or_else(|e| panic!("{} {template}: {e}", req.method));
        }
    }
}

/// DESIGN §10's "GitHub calls per runner" at policy scale: policies of one Secret share one
/// installation token (per installation, so also across targets of one owner) and one rate-limit
/// budget; policies of one target share one client and one runner list per interval; a rotated
/// Secret gets new clients and a new token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_of_one_secret_share_a_token_and_one_target_shares_one_listing() {
    use k8s_openapi::api::core::v1::Secret;
    use runner_manager_operator::github::registry::Clients;
    let fake = SimulatedGitHub::start().await.unwrap();
    // The registry reads nothing from the API server for `for_secret`: a client that points
    // nowhere proves it.
    let kube =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let config = runner_manager_operator::github::GitHubConfig {
        api_base: Some(fake.base_url().to_owned()),
        timeout: Duration::from_secs(10),
        http_hosts: runner_manager_e2e::harness::github::loopback_hosts(),
        ..Default::default()
    };
    let clients = Clients::new(kube, config);
    let secret = |version: &str| Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("github-app".into()),
            resource_version: Some(version.into()),
            ..Default::default()
        },
        data: Some(app_secret_data(None).unwrap()),
        ..Default::default()
    };
    let web = format!("https://github.com/{ORG}/web");
    let org = format!("https://github.com/{ORG}");
    let v1 = secret("1");
    let a = clients.for_secret("team", &web, &v1).unwrap();
    let b = clients.for_secret("team", &web, &v1).unwrap();
    let c = clients.for_secret("team", &org, &v1).unwrap();
    assert!(
        std::sync::Arc::ptr_eq(&a, &b),
        "one client per Secret and target"
    );
    assert!(
        !std::sync::Arc::ptr_eq(&a, &c),
        "another target, another client"
    );

    // Ten policies of `web` observing at once, and the org-scoped policy: two lists, one token.
    let web_lists =
        futures_util::future::join_all((0..10).map(|_| a.recent_runners(Duration::from_secs(60))));
    let (web_lists, org_list) = tokio::join!(web_lists, c.list_runners());
    assert!(web_lists.iter().all(Result::is_ok));
    org_list.unwrap();
    assert_eq!(fake.calls("list_runners").await.unwrap(), 2);
    assert_eq!(
        fake.calls("access_tokens").await.unwrap(),
        1,
        "one installation token for every client of the Secret at that owner"
    );

    // A rotated Secret: new clients, a new token.
    let v2 = secret("2");
    let d = clients.for_secret("team", &web, &v2).unwrap();
    assert!(!std::sync::Arc::ptr_eq(&a, &d));
    d.list_runners().await.unwrap();
    assert_eq!(fake.calls("access_tokens").await.unwrap(), 2);
}
