//! Observability a platform team can alert on (issue 17), against the real processes: one job
//! delivered by webhook runs on a runner the operator created and the agent launched, with both
//! exporting OTLP traces to a receiver here. Then both binaries are scraped and their families
//! and values checked against what happened, both binaries' probes are asked, and the receiver's
//! spans must show the launch as one trace from the webhook delivery that queued the job: the
//! operator's `webhook.delivery` (the root), `runner.create` under it (linked to the reconcile
//! that decided it), the broker's `broker.exchange` and its GitHub call (`github.request`, the
//! JIT mint) under that, the agent's `launch` and each launch step.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kube::api::Api;
use runner_manager_crds::conditions::ConditionStatus;
use runner_manager_crds::outcome::Outcome;
use runner_manager_crds::policy::{PolicyConditionType, ScalePolicy};
use runner_manager_crds::state::AttemptState;
use runner_manager_e2e::harness::product::{Product, ProductOptions, STEP};
use runner_manager_e2e::harness::telemetry::{
    OtlpReceiver, ReceivedSpan, agent_health, families, get, sample,
};
use runner_manager_e2e::harness::wait;
use serde_json::json;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[tokio::test]
async fn one_launch_is_one_trace_and_both_binaries_report_what_happened() {
    let receiver = OtlpReceiver::start().await.unwrap();
    let options = ProductOptions {
        env: receiver
            .env()
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect(),
        ..ProductOptions::default()
    };
    let Some(p) = Product::start_with("observability", options).await else {
        return;
    };
    p.policy("web", json!({"minIdle": 0, "maxRunners": 3}))
        .await
        .unwrap();
    // Only a Ready policy takes a delivery: queued before, the job would reach the ledger
    // through the poll (the origin would be the poll's span, a link, not the delivery).
    let policies: Api<ScalePolicy> = Api::namespaced(p.kube.clone(), &p.team);
    wait::until(STEP, "the policy to be Ready", || async {
        let policy = policies.get("web").await.ok()?;
        policy
            .status?
            .conditions
            .iter()
            .any(|c| c.type_ == PolicyConditionType::Ready && c.status == ConditionStatus::True)
            .then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs in {}", p.logs().display()));
    p.run_job(300, Duration::from_secs(180)).await.unwrap();
    let done = wait::until(
        STEP,
        "the attempt Cleaned with its job completed",
        || async {
            let list = p.all_attempts().await;
            (list.len() == 1
                && list.iter().all(|a| {
                    a.status.as_ref().is_some_and(|s| {
                        s.journal.state() == AttemptState::Cleaned
                            && s.journal.outcome() == Some(Outcome::CompletedJob)
                    })
                }))
            .then_some(list)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; logs in {}", p.logs().display()));
    let attempt = &done[0];
    let attempt_name = attempt.metadata.name.clone().unwrap();
    let attempt_uid = attempt.metadata.uid.clone().unwrap();
    let traceparent = attempt
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("runner-manager.dev/traceparent"))
        .cloned()
        .expect("the operator wrote the attempt's traceparent");

    // The operator's exposition.
    let op = get(&p.operators[0].health, "/metrics").await.unwrap();
    assert_eq!(op.status, 200);
    assert_eq!(op.content_type, OPENMETRICS);
    assert!(op.body.ends_with("# EOF\n"));
    let policy = format!("namespace=\"{}\",policy=\"web\"", p.team);
    let v = |name: &str, labels: &str| sample(&op.body, name, labels);
    assert_eq!(v("runner_manager_policy_max_runners", &policy), Some(3.0));
    assert_eq!(v("runner_manager_policy_min_runners", &policy), Some(0.0));
    for g in [
        "desired_runners",
        "idle_runners",
        "busy_runners",
        "starting_runners",
        "pending_jobs",
    ] {
        assert!(
            v(&format!("runner_manager_policy_{g}"), &policy).is_some(),
            "{g}: {}",
            op.body
        );
    }
    let (_, counters) = p.operator_github_calls().await.unwrap();
    let mints = counters["generate_jitconfig"]["201"].as_u64().unwrap_or(0) as f64;
    assert_eq!(v("runner_manager_jit_mints_total", ""), Some(mints));
    assert_eq!(mints, 1.0, "one runner, one JIT");
    assert_eq!(
        v(
            "runner_manager_attempts_created_total",
            "reason=\"scale_up\""
        ),
        Some(1.0)
    );
    // Job metrics name the policy that took the job and, once completed, how it ended.
    for (action, result) in [("queued", "none"), ("completed", "success")] {
        assert!(
            v(
                "runner_manager_jobs_total",
                &format!("{policy},action=\"{action}\",result=\"{result}\"")
            )
            .is_some_and(|n| n >= 1.0),
            "{action}: {}",
            op.body
        );
    }
    assert!(
        v("runner_manager_job_startup_duration_seconds_count", &policy).is_some_and(|n| n >= 1.0)
    );
    assert!(
        v(
            "runner_manager_job_execution_duration_seconds_count",
            &format!("{policy},result=\"success\"")
        )
        .is_some_and(|n| n >= 1.0)
    );
    assert!(v("runner_manager_reconcile_duration_seconds_count", "").is_some_and(|n| n >= 1.0));
    assert_eq!(v("runner_manager_leader", ""), Some(1.0));
    let op_ready = get(&p.operators[0].health, "/readyz").await.unwrap();
    assert_eq!(op_ready.status, 200, "{}", op_ready.body);
    assert!(op.body.contains("runner_manager_build_info{version=\""));

    // The agent's exposition and probes.
    let agent = p.agents[0].process.as_ref().unwrap();
    let health = agent_health(&agent.lines()).expect("the agent logged its health address");
    assert_eq!(get(&health, "/healthz").await.unwrap().status, 200);
    let ready = get(&health, "/readyz").await.unwrap();
    assert_eq!(ready.status, 200, "{}", ready.body);
    let ag = get(&health, "/metrics").await.unwrap();
    assert_eq!(ag.content_type, OPENMETRICS);
    let a = |name: &str, labels: &str| sample(&ag.body, name, labels);
    assert_eq!(
        a("runner_manager_agent_launches_total", "outcome=\"started\""),
        Some(1.0)
    );
    assert_eq!(
        a(
            "runner_manager_agent_attempts_concluded_total",
            "outcome=\"CompletedJob\",reason=\"\""
        ),
        Some(1.0)
    );
    for step in ["materialize", "prepare", "register", "spawn", "total"] {
        assert_eq!(
            a(
                "runner_manager_agent_launch_step_duration_seconds_count",
                &format!("step=\"{step}\"")
            ),
            Some(1.0),
            "{step}"
        );
    }
    assert_eq!(
        a("runner_manager_agent_package_downloads_total", ""),
        Some(1.0)
    );
    assert_eq!(
        a("runner_manager_agent_slots", "state=\"capacity\""),
        Some(4.0)
    );
    assert_eq!(a("runner_manager_agent_slots", "state=\"used\""), Some(0.0));
    assert_eq!(a("runner_manager_agent_recovery_complete", ""), Some(1.0));
    assert_eq!(a("runner_manager_agent_ready", ""), Some(1.0));
    assert!(
        a("runner_manager_agent_heartbeat_age_seconds", "")
            .is_some_and(|s| (0.0..5.0).contains(&s))
    );
    assert!(
        a(
            "runner_manager_agent_lease_renewals_total",
            "outcome=\"ok\""
        )
        .is_some_and(|n| n >= 1.0)
    );
    for family in [
        "runner_manager_agent_build",
        "runner_manager_agent_cleanup_deferrals",
        "runner_manager_agent_slot_quarantines",
        "runner_manager_agent_events",
        "runner_manager_agent_cached_packages",
    ] {
        assert!(families(&ag.body).iter().any(|f| f == family), "{family}");
    }

    // The launch's span tree, from both processes.
    let trace_id = traceparent.split('-').nth(1).unwrap().to_owned();
    let steps = ["admit", "materialize", "prepare", "register", "spawn"];
    let spans = wait::until(STEP, "the launch's spans at the receiver", || async {
        let spans: Vec<ReceivedSpan> = receiver
            .spans()
            .into_iter()
            .filter(|s| s.trace_id == trace_id)
            .collect();
        let launch = spans.iter().find(|s| s.name == "launch")?;
        steps
            .iter()
            .all(|step| {
                spans
                    .iter()
                    .any(|s| s.name == *step && s.parent_span_id == launch.span_id)
            })
            .then_some(spans)
    })
    .await
    .unwrap_or_else(|e| {
        let names: Vec<String> = receiver
            .spans()
            .iter()
            .map(|s| format!("{}:{} in {}", s.service, s.name, s.trace_id))
            .collect();
        panic!("{e}: {names:?}; logs in {}", p.logs().display())
    });
    let create = spans
        .iter()
        .find(|s| s.name == "runner.create")
        .expect("the operator's runner.create span in the trace");
    assert_eq!(create.service, "runner-manager-operator");
    // The origin: the webhook delivery that recorded the job is the trace's root.
    let delivery = wait::until(STEP, "the webhook delivery that queued the job", || async {
        receiver
            .spans()
            .into_iter()
            .find(|s| s.trace_id == trace_id && s.name == "webhook.delivery")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {create:?}"));
    assert_eq!(delivery.service, "runner-manager-operator");
    assert!(
        delivery.parent_span_id.is_empty(),
        "the delivery is the root"
    );
    assert_eq!(
        delivery.attributes.get("outcome").map(String::as_str),
        Some("accepted"),
        "{delivery:?}"
    );
    assert_eq!(
        create.parent_span_id, delivery.span_id,
        "runner.create under the delivery"
    );
    assert_eq!(
        create.attributes.get("attempt.name"),
        Some(&attempt_name),
        "{create:?}"
    );
    let launch = spans.iter().find(|s| s.name == "launch").unwrap();
    assert_eq!(launch.service, "runner-manager-node-agent");
    assert_eq!(
        launch.parent_span_id, create.span_id,
        "launch joins runner.create"
    );
    assert_eq!(launch.attributes.get("attempt.uid"), Some(&attempt_uid));
    // The broker's side of the JIT exchange, joined through the attempt's annotation, and the
    // GitHub call it made: a route template, never a URL.
    let (exchange, mint) = wait::until(STEP, "the broker's exchange and its mint", || async {
        let all = receiver.spans();
        let exchange = all
            .iter()
            .find(|s| s.trace_id == trace_id && s.name == "broker.exchange")?
            .clone();
        let mint = all
            .iter()
            .find(|s| s.name == "github.request" && s.parent_span_id == exchange.span_id)?
            .clone();
        Some((exchange, mint))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?}", receiver.spans()));
    assert_eq!(exchange.service, "runner-manager-operator");
    assert_eq!(exchange.parent_span_id, create.span_id, "{exchange:?}");
    assert_eq!(exchange.attributes.get("attempt.uid"), Some(&attempt_uid));
    assert_eq!(
        exchange.attributes.get("outcome").map(String::as_str),
        Some("issued")
    );
    let attr = |s: &ReceivedSpan, k: &str| s.attributes.get(k).cloned().unwrap_or_default();
    assert_eq!(
        attr(&mint, "http.route"),
        "/{scope}/actions/runners/generate-jitconfig",
        "{mint:?}"
    );
    assert_eq!(attr(&mint, "http.request.method"), "POST");
    assert_eq!(attr(&mint, "http.response.status_code"), "201");
    assert_eq!(attr(&mint, "github.endpoint"), "generate_jitconfig");
    assert!(
        attr(&mint, "github.ratelimit.remaining")
            .parse::<i64>()
            .is_ok(),
        "{mint:?}"
    );
    // No GitHub span anywhere carries a URL or the repository's path.
    for s in receiver
        .spans()
        .iter()
        .filter(|s| s.name == "github.request")
    {
        assert!(attr(s, "http.route").starts_with('/'), "{s:?}");
        assert!(
            s.attributes
                .values()
                .all(|v| !v.contains("://") && !v.contains("acme/web")),
            "{s:?}"
        );
    }
    // The reconcile that decided the runner, linked from runner.create.
    wait::until(
        STEP,
        "the reconcile span runner.create links to",
        || async {
            let all = receiver.spans();
            create
                .links
                .iter()
                .any(|l| all.iter().any(|s| s.span_id == *l && s.name == "reconcile"))
                .then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {create:?}"));
    let tree: Vec<String> = spans
        .iter()
        .map(|s| {
            format!(
                "{} {} (span {}, parent {})",
                s.service,
                s.name,
                s.span_id,
                if s.parent_span_id.is_empty() {
                    "-"
                } else {
                    &s.parent_span_id
                }
            )
        })
        .collect();
    eprintln!("SPANS of trace {trace_id}:\n{}", tree.join("\n"));
    eprintln!(
        "SAMPLE operator metrics:\n{}",
        op.body
            .lines()
            .filter(
                |l| l.starts_with("runner_manager_policy_") || l.starts_with("runner_manager_jit")
            )
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!(
        "SAMPLE agent metrics:\n{}",
        ag.body
            .lines()
            .filter(|l| l.starts_with("runner_manager_agent_launch")
                || l.starts_with("runner_manager_agent_slots"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
