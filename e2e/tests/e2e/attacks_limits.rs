//! Attacks on the size, host, load, certificate and placement limits (issue 13, findings 8-11),
//! each against the real API server with the real operator process, node agents and the
//! simulated GitHub (or a hostile server standing in for a GitHub host). Skipped without
//! `KUBECONFIG`.
//!
//! Finding 8: an oversized GitHub answer and an oversized package download are refused while
//! they stream; plain http is refused without the admin flag; a policy naming a host the admin
//! did not list is not Ready, nor is one whose package comes from an unlisted host. Finding 9:
//! slow-loris connections to the webhook receiver and the broker are closed by the header
//! timeout while legitimate requests succeed; an oversized unsigned body is refused (413) before
//! its signature is looked at. Finding 10: the broker's certificate is short-lived and rotates
//! while an agent keeps getting JITs. Finding 11: a pool label a kubelet could set on itself is
//! refused; the admin's per-node cap bounds what an agent advertises.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use runner_manager_crds::attempt::{AttemptConditionType, AttemptReason};
use runner_manager_crds::conditions::{ConditionStatus, find};
use runner_manager_crds::policy::{PolicyConditionType, PolicyReason, ScalePolicy};
use runner_manager_crds::state::AttemptState;
use runner_manager_e2e::harness::attempt::state;
use runner_manager_e2e::harness::process::{Running, operator_addrs};
use runner_manager_e2e::harness::product::{
    NodeOptions, Product, ProductOptions, STEP, WEBHOOK_SECRET,
};
use runner_manager_e2e::harness::wait;
use runner_manager_e2e::harness::webhook::post_workflow_job;
use runner_manager_e2e::harness::world::World;
use runner_manager_operator::webhook::sign;
use secrecy::SecretString;
use serde_json::json;

/// Wait until policy `name` (team namespace) is `Ready=status` for its generation.
async fn ready(p: &Product, name: &str, status: ConditionStatus) -> ScalePolicy {
    wait::until(STEP, &format!("{name} Ready={status:?}"), || async {
        let sp = p.policies().get(name).await.ok()?;
        let c = find(&sp.status.as_ref()?.conditions, PolicyConditionType::Ready)?;
        (c.status == status && c.observed_generation == sp.metadata.generation).then_some(sp)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs in {}", p.logs().display()))
}

fn ready_condition(
    sp: &ScalePolicy,
) -> runner_manager_crds::conditions::Condition<PolicyConditionType, PolicyReason> {
    find(
        &sp.status.as_ref().unwrap().conditions,
        PolicyConditionType::Ready,
    )
    .unwrap()
    .clone()
}

/// Wait until an attempt of the team says `PackageRefused` with `reason`; its message.
async fn package_refused(p: &Product, reason: AttemptReason) -> String {
    wait::until(STEP, &format!("PackageRefused {reason:?}"), || async {
        p.all_attempts().await.into_iter().find_map(|a| {
            let c = find(
                &a.status.as_ref()?.journal.conditions,
                AttemptConditionType::PackageRefused,
            )?;
            (c.status == ConditionStatus::True && c.reason == reason).then(|| c.message.clone())
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs in {}", p.logs().display()))
}

/// The serving certificate the broker at `addr` presents, checked against the published CA:
/// (serial, notAfter as Unix seconds).
async fn served_certificate(p: &Product, addr: &str) -> (Vec<u8>, i64) {
    let ca = Api::<ConfigMap>::namespaced(p.kube.clone(), &p.system)
        .get("runner-manager-broker-ca")
        .await
        .unwrap()
        .data
        .unwrap()["ca.crt"]
        .clone();
    let addr = addr.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(
            rustls::pki_types::pem::PemObject::pem_slice_iter(ca.as_bytes())
                .map(Result::unwrap)
                .collect::<Vec<rustls::pki_types::CertificateDer<'static>>>(),
        );
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
        let mut sock = std::net::TcpStream::connect(&addr).unwrap();
        // The handshake verifies the chain to the published CA.
        while conn.is_handshaking() {
            conn.complete_io(&mut sock).unwrap();
        }
        let der = conn.peer_certificates().unwrap()[0].clone();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        (
            cert.raw_serial().to_vec(),
            cert.validity().not_after.timestamp(),
        )
    })
    .await
    .unwrap()
}

fn now_unix() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap()
}

/// A connection that sends `prefix` one byte every `every`, never finishing; returns how long
/// the server kept it open (until EOF or a reset).
fn slow_loris(addr: String, prefix: &'static [u8], every: Duration) -> Duration {
    let start = Instant::now();
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(every)).unwrap();
    let mut buf = [0u8; 512];
    for b in prefix.iter().cycle() {
        if sock.write_all(&[*b]).is_err() {
            break;
        }
        match sock.read(&mut buf) {
            // Closed (or answered 408 and closed).
            Ok(0) | Err(_) if start.elapsed() < every => {}
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
        if start.elapsed() > Duration::from_secs(60) {
            break;
        }
    }
    start.elapsed()
}

async fn post_delivery(p: &Product, body: Vec<u8>, signature: &str) -> u16 {
    let url = format!("http://{}/webhook", p.operators[0].webhook);
    let guid = uuid::Uuid::new_v4().to_string();
    post_workflow_job(&url, &guid, signature, body).await
}

/// Finding 9: two slow-loris connections (one on each listener) that never finish their request
/// are closed by the header timeout (3 s here, 10 s by default), while a signed delivery is
/// answered and an agent gets its JIT through the broker at the same time. An unsigned 100 KiB
/// body is answered 413 — before the signature (401) is looked at. The broker's default
/// certificate lives at most 90 days (finding 10).
#[tokio::test]
async fn slow_loris_connections_are_closed_while_legitimate_requests_succeed() {
    let options = ProductOptions::operator_flag("--listener-header-timeout", "3s");
    let Some(p) = Product::start_with("attack_slow_loris", options).await else {
        return;
    };
    let webhook = p.operators[0].webhook.clone();
    let broker = p.operators[0].broker.clone();
    // The webhook gets a request line and headers one byte per second; the broker gets the first
    // bytes of a TLS ClientHello the same way (it never completes its handshake).
    let hook_loris = std::thread::spawn(move || {
        slow_loris(
            webhook,
            b"POST /webhook HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            Duration::from_secs(1),
        )
    });
    let broker_loris = std::thread::spawn(move || {
        slow_loris(
            broker,
            &[
                0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
            ],
            Duration::from_secs(1),
        )
    });
    // Meanwhile: legitimate traffic on both listeners.
    p.policy("web", json!({"minIdle": 1})).await.unwrap();
    let body = serde_json::to_vec(&json!({
        "action": "queued",
        "workflow_job": {"id": 991, "run_id": 992, "labels": ["self-hosted", "linux"], "runner_name": null, "status": "queued"},
        "repository": {"full_name": "acme/web", "html_url": "https://github.com/acme/web"},
    }))
    .unwrap();
    let signature = sign(&SecretString::from(WEBHOOK_SECRET), &body);
    let status = post_delivery(&p, body, &signature).await;
    assert!((200..300).contains(&status), "a signed delivery: {status}");
    p.wait_attempts(
        "an idle runner (its JIT came through the broker)",
        STEP,
        |list| list.iter().any(|a| state(a) == AttemptState::Idle),
    )
    .await;
    let hook_held = hook_loris.join().unwrap();
    let broker_held = broker_loris.join().unwrap();
    for (what, held) in [("webhook", hook_held), ("broker", broker_held)] {
        assert!(
            held < Duration::from_secs(10),
            "the {what} kept a slow-loris connection {held:?} (header timeout 3 s)"
        );
    }
    // An oversized body without a valid signature: refused for its size, unread past 64 KiB.
    let status = post_delivery(&p, vec![b' '; 100 * 1024], "sha256=00").await;
    assert_eq!(status, 413, "an oversized unsigned body");
    // The default serving certificate: at most 90 days.
    let (_, not_after) = served_certificate(&p, &p.operators[0].broker).await;
    let left = not_after - now_unix();
    assert!(
        left > 0 && left <= 90 * 24 * 3600,
        "the broker certificate expires in {left} s"
    );
}

/// Finding 10: with a 15 s lifetime the serving certificate is re-issued every 10 s; an agent
/// keeps launching runners (each a JIT through the broker) across several rotations.
#[tokio::test]
async fn the_broker_certificate_rotates_while_an_agent_keeps_getting_jits() {
    let options = ProductOptions::operator_flag("--broker-cert-lifetime", "15s");
    let Some(p) = Product::start_with("attack_cert_rotation", options).await else {
        return;
    };
    let broker = &p.operators[0].broker;
    let (first_serial, not_after) = served_certificate(&p, broker).await;
    assert!(
        not_after - now_unix() <= 20,
        "a 15 s certificate expires in {} s",
        not_after - now_unix()
    );
    p.policy("web", json!({"minIdle": 1})).await.unwrap();
    let mut jobs = Vec::new();
    let start = Instant::now();
    // Jobs for 35 s: each takes an ephemeral runner, and each runner after it is a new JIT.
    while start.elapsed() < Duration::from_secs(35) {
        let id = p.queue_linux_job(300).await.unwrap();
        p.wait_jobs_completed(&[id], STEP).await.unwrap();
        jobs.push(id);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let (last_serial, not_after) = served_certificate(&p, broker).await;
    assert_ne!(first_serial, last_serial, "the certificate was rotated");
    assert!(not_after - now_unix() <= 20);
    assert!(jobs.len() >= 3, "jobs ran across the rotations: {jobs:?}");
    // Ephemeral runners take one job each: every job above ran on a runner whose JIT was
    // minted after the one before, so across every rotation. None failed for lack of one.
    let failed: Vec<String> = p
        .all_attempts()
        .await
        .iter()
        .filter(|a| state(a) == AttemptState::Failed)
        .map(|a| {
            format!(
                "{}: {:?}",
                a.metadata.name.clone().unwrap_or_default(),
                a.status.as_ref().and_then(|s| s.journal.outcome())
            )
        })
        .collect();
    assert!(failed.is_empty(), "failed across rotations: {failed:?}");
}

/// Finding 8: a policy naming a GitHub host the admin did not list is not Ready, naming the
/// flag; with the package host dropped from `--download-hosts`, a policy on an allowed host is
/// not Ready either (its listing would choose the package's URL). Nothing is created for either.
#[tokio::test]
async fn a_policy_naming_a_foreign_host_is_refused() {
    let options = ProductOptions::operator_flag("--download-hosts", "");
    let Some(p) = Product::start_with("attack_foreign_host", options).await else {
        return;
    };
    p.policy(
        "foreign",
        json!({"github": {"url": "https://ghes.attacker.example/acme/web"}, "minIdle": 1}),
    )
    .await
    .unwrap();
    let sp = ready(&p, "foreign", ConditionStatus::False).await;
    let c = ready_condition(&sp);
    assert_eq!(c.reason, PolicyReason::HostNotAllowed, "{}", c.message);
    assert!(c.message.contains("--github-hosts"), "{}", c.message);
    // The simulated GitHub lists its package on 127.0.0.1, which is no longer a download host.
    p.policy("package", json!({"minIdle": 1})).await.unwrap();
    let sp = ready(&p, "package", ConditionStatus::False).await;
    let c = ready_condition(&sp);
    assert_eq!(c.reason, PolicyReason::HostNotAllowed, "{}", c.message);
    assert!(c.message.contains("--download-hosts"), "{}", c.message);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(p.all_attempts().await.is_empty(), "nothing was created");
}

/// Finding 11: a policy routing by a label a kubelet may set on itself is not Ready, naming the
/// field and the prefix; the admin's `--max-runners-per-node 1` holds a node advertising 4 to one
/// runner.
#[tokio::test]
async fn pool_labels_must_be_restricted_and_the_node_cap_holds() {
    let options = ProductOptions {
        nodes: vec![NodeOptions::new(
            "capped",
            4,
            &[
                ("node-restriction.kubernetes.io/runner-pool", "ci"),
                ("pool", "ci"),
            ],
        )],
        operator_flags: vec![("--max-runners-per-node".into(), "1".into())],
        ..ProductOptions::default()
    };
    let Some(p) = Product::start_with("attack_pool_labels", options).await else {
        return;
    };
    p.policy(
        "selfset",
        json!({"minIdle": 1, "nodeSelector": {"pool": "ci"}}),
    )
    .await
    .unwrap();
    let sp = ready(&p, "selfset", ConditionStatus::False).await;
    let c = ready_condition(&sp);
    assert_eq!(c.reason, PolicyReason::InvalidSpec, "{}", c.message);
    assert!(
        c.message.contains("spec.nodeSelector.pool"),
        "{}",
        c.message
    );
    assert!(
        c.message.contains("node-restriction.kubernetes.io/"),
        "{}",
        c.message
    );
    p.policy(
        "web",
        json!({"minIdle": 3, "nodeSelector": {"node-restriction.kubernetes.io/runner-pool": "ci"}}),
    )
    .await
    .unwrap();
    p.wait_attempts("one idle runner", STEP, |list| {
        list.iter().any(|a| state(a) == AttemptState::Idle)
    })
    .await;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        let live = p
            .all_attempts()
            .await
            .iter()
            .filter(|a| !state(a).is_terminal())
            .count();
        assert!(live <= 1, "{live} live attempts on a node capped at 1");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Finding 8, on the node: a download past `--package-max-download-bytes` is refused while it
/// streams, and a plain-http package URL is refused without `--allow-http-hosts`; each says so
/// on the attempt (`PackageRefused`) naming the flag.
#[tokio::test]
async fn the_agent_refuses_an_oversized_download_and_plain_http() {
    let options = ProductOptions {
        nodes: vec![NodeOptions::new("dl", 2, &[])],
        ..ProductOptions::default()
    };
    let Some(mut p) = Product::start_with("attack_download_limits", options).await else {
        return;
    };
    p.kill_agent(0);
    p.start_agent_with(0, &[("RM_PACKAGE_MAX_DOWNLOAD_BYTES", "4096")])
        .unwrap();
    p.policy("web", json!({"minIdle": 1})).await.unwrap();
    let message = package_refused(&p, AttemptReason::PackageCapExceeded).await;
    assert!(
        message.contains("--package-max-download-bytes"),
        "{message}"
    );
    p.kill_agent(0);
    p.start_agent_with(0, &[("RM_ALLOW_HTTP_HOSTS", "")])
        .unwrap();
    let message = package_refused(&p, AttemptReason::PackageUnsafe).await;
    assert!(message.contains("--allow-http-hosts"), "{message}");
}

/// A server standing in for a hostile GitHub host: every answer is 16 MiB, streamed without a
/// Content-Length.
async fn flood_server() -> String {
    use axum::body::Body;
    let app = axum::Router::new().fallback(|| async {
        let chunks = futures_util::stream::iter(
            (0..256).map(|_| Ok::<_, std::io::Error>(vec![b'['; 64 * 1024])),
        );
        axum::response::Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(Body::from_stream(chunks))
            .unwrap()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// Finding 8, in the operator: a GitHub host that answers with an endless body is refused once
/// `--github-max-response-bytes` is passed (the policy names the flag); and an operator told to
/// use a plain-http API without `--allow-http-hosts` does not start, naming the flag.
#[tokio::test]
async fn an_oversized_github_answer_and_plain_http_are_refused() {
    let github = flood_server().await;
    let Some(w) = World::builder("attack_github_limits")
        .team_secret("github-app", &[("token", "ghp_not_a_real_token")])
        .policy_defaults(json!({}))
        .build()
        .await
        .unwrap()
    else {
        return;
    };
    let command = |api: &str| {
        w.operator_command(&[
            ("--github-api-url", api),
            ("--leader-election", "false"),
            ("--github-max-response-bytes", "1048576"),
            ("--resync-interval", "1s"),
        ])
        .unwrap()
    };
    // No --allow-http-hosts: the operator refuses the plain-http API URL at start.
    let mut cmd = command(&github);
    cmd.env("RM_ALLOW_HTTP_HOSTS", "");
    let mut refused = Running::spawn("runner-manager-operator", cmd).unwrap();
    let deadline = Instant::now() + STEP;
    let code = loop {
        if let Some(code) = refused.child.try_wait().unwrap() {
            break code;
        }
        assert!(Instant::now() < deadline, "the operator did not exit");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(!code.success(), "started with a plain-http GitHub API");
    let said = refused.lines().join("\n");
    assert!(said.contains("--allow-http-hosts"), "{said}");
    // With it: the endless answer is refused at 1 MiB.
    let operator = Running::spawn("runner-manager-operator", command(&github)).unwrap();
    operator_addrs(&operator, STEP).await.unwrap();
    w.policy(
        "web",
        json!({"github": {"url": "https://github.com/acme/web", "credentialsSecretRef": {"name": "github-app"}},
               "labels": ["self-hosted"], "maxRunners": 1}),
    )
    .await
    .unwrap();
    let policies = w.policies();
    let message = wait::until(STEP, "web Ready=False", || async {
        let sp = policies.get("web").await.ok()?;
        let c = find(&sp.status.as_ref()?.conditions, PolicyConditionType::Ready)?;
        (c.status == ConditionStatus::False).then(|| c.message.clone())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", operator.lines().join("\n")));
    assert!(message.contains("--github-max-response-bytes"), "{message}");
}

/// Counts of the statuses a flood was answered with.
type Answers = std::collections::BTreeMap<u16, u64>;

/// `total` requests from `workers` at once, every one from `source` (a loopback address of its
/// own, as a pod of its own would be), each made by `request`; the statuses they got.
async fn flood(
    source: std::net::IpAddr,
    workers: usize,
    total: usize,
    request: impl Fn(&reqwest::Client, usize) -> reqwest::RequestBuilder + Send + Sync + 'static,
) -> Answers {
    let client = reqwest::Client::builder()
        .local_address(source)
        // The attacker does not care whose certificate it is.
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let request = std::sync::Arc::new(request);
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (client, request, next) = (client.clone(), request.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut answers = Answers::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= total {
                    return answers;
                }
                let status = match request(&client, i).send().await {
                    Ok(r) => r.status().as_u16(),
                    Err(_) => 0,
                };
                *answers.entry(status).or_default() += 1;
            }
        }));
    }
    let mut all = Answers::new();
    for t in tasks {
        for (k, v) in t.await.unwrap() {
            *all.entry(k).or_default() += v;
        }
    }
    all
}

/// A token shaped exactly like the agent's (its account, the broker's audience, unexpired) but
/// signed by the attacker: only a TokenReview can tell it from a real one.
fn forged_agent_token(system: &str, i: usize) -> String {
    let claims = json!({
        "sub": format!("system:serviceaccount:{system}:{}", runner_manager_e2e::harness::node::AGENT_SA),
        "aud": [runner_manager_crds::broker::BROKER_AUDIENCE],
        "exp": now_unix() + 3600,
        "jti": i,
    });
    jsonwebtoken::EncodingKey::from_secret(b"the attacker's own key")
        .and_then(|key| jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key))
        .unwrap()
}

/// Issue 28 item 5: a flood from one address — forged agent tokens at the broker, forged
/// AdmissionReviews naming made-up agent pods at the admission webhook — leaves a launch, agent
/// Lease renewals and attempt writes through the webhook working, and costs the API server a
/// bounded number of TokenReviews: the broker reviews a token that could be the agent's only
/// while the flooding address has budget (`REVIEW_BURST`, then `REVIEW_PER_SECOND`), and
/// answers the rest 429 at once. Without the budget every forged token is a TokenReview (all
/// answered 401), and the bound below fails.
#[tokio::test]
async fn a_flood_from_one_address_leaves_launches_and_lease_writes_working() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Patch, PatchParams};
    use runner_manager_e2e::harness::admission::{label_namespaces, register};
    use runner_manager_operator::broker::authn::{REVIEW_BURST, REVIEW_PER_SECOND};

    let Some(p) = Product::start("flood_one_address").await else {
        return;
    };
    // Every agent Lease and attempt write of this world goes through the webhook.
    let scope = uuid::Uuid::new_v4().simple().to_string();
    label_namespaces(&p.kube, &[&p.system, &p.team], &scope)
        .await
        .unwrap();
    let config = format!("rm-e2e-flood-{scope}");
    let _registered = register(
        &p.kube,
        &config,
        &p.system,
        &p.operators[0].admission,
        &scope,
    )
    .await
    .unwrap();
    p.policy("web", json!({"minIdle": 0, "maxRunners": 2}))
        .await
        .unwrap();
    ready(&p, "web", ConditionStatus::True).await;

    let source: std::net::IpAddr = "127.0.0.77".parse().unwrap();
    let broker = format!(
        "https://{}/v1/attempts/{}/nothing/jit",
        p.operators[0].broker, p.team
    );
    let system = p.system.clone();
    let started = Instant::now();
    let forged = tokio::spawn(flood(source, 16, 1500, move |c, i| {
        c.post(&broker)
            .bearer_auth(forged_agent_token(&system, i))
            .json(&json!({"attemptUid": "x", "specHash": "y"}))
    }));
    let admission = format!("https://{}/admission/leases", p.operators[0].admission);
    let (system, namespace) = (p.system.clone(), p.system.clone());
    let reviews = tokio::spawn(flood(source, 96, 3000, move |c, i| {
        c.post(&admission).json(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": format!("forged-{i}"),
                "kind": {"group": "coordination.k8s.io", "version": "v1", "kind": "Lease"},
                "resource": {"group": "coordination.k8s.io", "version": "v1", "resource": "leases"},
                "operation": "UPDATE", "namespace": namespace, "name": format!("forged-{i}"),
                "userInfo": {
                    "username": format!("system:serviceaccount:{system}:{}", runner_manager_e2e::harness::node::AGENT_SA),
                    "extra": {
                        "authentication.kubernetes.io/pod-name": [format!("agent-{i}")],
                        "authentication.kubernetes.io/pod-uid": [uuid::Uuid::new_v4().to_string()],
                    },
                },
                "object": {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": format!("forged-{i}")}},
            }
        }))
    }));

    // Meanwhile: a job is launched and runs, and writes through the webhook pass.
    let job = p.queue_linux_job(300).await.unwrap();
    let leases = Api::<Lease>::namespaced(p.kube.clone(), &p.system);
    let probe = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("flood-probe-{scope}")),
            ..Default::default()
        },
        ..Lease::default()
    };
    leases
        .create(&Default::default(), &probe)
        .await
        .expect("a Lease write through the webhook during the flood");
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let t = Instant::now();
        leases
            .patch(
                probe.metadata.name.as_deref().unwrap(),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"holderIdentity": format!("probe-{i}")}})),
            )
            .await
            .expect("a Lease write through the webhook during the flood");
        slowest = slowest.max(t.elapsed());
    }
    p.wait_jobs_completed(&[job], Duration::from_secs(120))
        .await
        .expect("the launch during the flood");
    let forged = forged.await.unwrap();
    let reviews = reviews.await.unwrap();
    let elapsed = started.elapsed();
    eprintln!(
        "flood from {source} over {:.1}s: broker answers {forged:?}, admission answers {reviews:?}; slowest Lease write through the webhook {slowest:?}",
        elapsed.as_secs_f64()
    );
    // Each 401 is a forged token the API server was asked to review; the rest were refused
    // before costing anything.
    let reviewed = forged.get(&401).copied().unwrap_or(0);
    let bound = u64::from(REVIEW_BURST) + u64::from(REVIEW_PER_SECOND) * (elapsed.as_secs() + 1);
    assert!(
        reviewed <= bound,
        "{reviewed} TokenReviews of forged tokens, bound {bound}: {forged:?}"
    );
    assert!(forged.get(&429).copied().unwrap_or(0) > 0, "{forged:?}");
    assert!(
        slowest < Duration::from_secs(5),
        "a Lease write took {slowest:?}"
    );
    leases
        .delete(probe.metadata.name.as_deref().unwrap(), &Default::default())
        .await
        .unwrap();
}
