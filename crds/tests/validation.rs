//! Semantic validation: every problem at once, each with its field path and a fix, and never the
//! URL's credentials.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use runner_manager_crds::duration::ManifestDuration;
use runner_manager_crds::policy::{ExecutionMode, RunnerResources, ScalePolicySpec, WorkspaceMode};
use runner_manager_crds::validate::{parse_runner_env, validate_policy};

fn valid() -> ScalePolicySpec {
    serde_json::from_value(serde_json::json!({
        "github": {"url": "https://github.com/acme/web", "credentialsSecretRef": {"name": "github-app"}},
        "labels": ["self-hosted", "linux", "x64"],
        "minIdle": 1,
        "maxRunners": 4
    }))
    .unwrap()
}

fn fields(spec: &ScalePolicySpec) -> Vec<String> {
    validate_policy(spec).into_iter().map(|p| p.field).collect()
}

#[test]
fn a_valid_policy_has_no_problems_and_gets_the_documented_defaults() {
    let spec = valid();
    assert!(
        validate_policy(&spec).is_empty(),
        "{:?}",
        validate_policy(&spec)
    );
    assert_eq!(spec.workspace.mode, WorkspaceMode::Ephemeral);
    assert_eq!(spec.execution.mode, ExecutionMode::Native);
    assert_eq!(spec.runner.version, "latest");
    assert_eq!(spec.timeouts.registration, ManifestDuration::from_secs(300));
    assert_eq!(spec.timeouts.idle, ManifestDuration::from_secs(600));
    assert!(spec.scaling.webhook);
}

#[test]
fn persistent_workspace_needs_a_repository() {
    let mut spec = valid();
    spec.workspace.mode = WorkspaceMode::Persistent;
    assert!(validate_policy(&spec).is_empty());
    for url in [
        "https://github.com/acme",
        "https://github.com/enterprises/acme",
    ] {
        spec.github.url = url.into();
        let problems = validate_policy(&spec);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].field, "spec.workspace.mode");
        assert!(
            problems[0].message.contains("Ephemeral"),
            "the fix is named"
        );
    }
}

#[test]
fn oci_needs_an_image_pinned_by_digest() {
    let mut spec = valid();
    spec.execution.mode = ExecutionMode::Oci;
    assert_eq!(fields(&spec), ["spec.execution.image"]);
    spec.execution.image = Some("ghcr.io/acme/runner:latest".into());
    assert_eq!(fields(&spec), ["spec.execution.image"]);
    spec.execution.image = Some(format!("ghcr.io/acme/runner@sha256:{}", "a".repeat(64)));
    assert!(fields(&spec).is_empty());
    spec.execution.image = Some(format!("ghcr.io/acme/runner@sha256:{}", "A".repeat(64)));
    assert_eq!(
        fields(&spec),
        ["spec.execution.image"],
        "upper-case hex is not a digest"
    );
    spec.execution.mode = ExecutionMode::Native;
    spec.execution.image = Some(format!("r@sha256:{}", "a".repeat(64)));
    assert_eq!(
        fields(&spec),
        ["spec.execution.image"],
        "an image on a native policy"
    );
}

#[test]
fn min_idle_above_max_runners_names_both() {
    let mut spec = valid();
    spec.min_idle = 5;
    let problems = validate_policy(&spec);
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].field, "spec.minIdle");
    assert!(problems[0].message.contains("maxRunners"));
}

#[test]
fn a_url_with_credentials_is_refused_and_never_echoed() {
    let mut spec = valid();
    spec.github.url = "https://x-access-token:ghs_TOPSECRET@github.com/acme/web".into();
    let problems = validate_policy(&spec);
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].field, "spec.github.url");
    let shown = problems[0].to_string();
    assert!(
        !shown.contains("TOPSECRET") && !shown.contains("x-access-token"),
        "{shown}"
    );
    assert!(shown.contains("Secret"), "the fix is named: {shown}");
}

#[test]
fn every_problem_is_reported_at_once() {
    let mut spec = valid();
    spec.github.url = "http://github.com/acme/web".into();
    spec.labels = vec![
        "linux".into(),
        "Linux".into(),
        "rm-123".into(),
        "has space".into(),
    ];
    spec.min_idle = 9;
    spec.github.runner_group = Some(IntOrString::Int(0));
    spec.node_selector.insert("bad key!".into(), "v".into());
    spec.execution.resources = Some(RunnerResources {
        cpu: Some(Quantity("0".into())),
        memory: Some(Quantity("1Ki".into())),
    });
    spec.timeouts.registration = ManifestDuration::from_secs(1);
    spec.scaling.poll_interval = ManifestDuration::from_secs(99_999);
    let got = fields(&spec);
    for want in [
        "spec.github.url",
        "spec.github.runnerGroup",
        "spec.labels[1]",
        "spec.labels[2]",
        "spec.labels[3]",
        "spec.minIdle",
        "spec.nodeSelector",
        "spec.execution.resources.cpu",
        "spec.execution.resources.memory",
        "spec.timeouts.registration",
        "spec.scaling.pollInterval",
    ] {
        assert!(got.iter().any(|f| f == want), "missing {want} in {got:?}");
    }
    assert_eq!(got.len(), 11, "{got:?}");
}

#[test]
fn pool_labels_must_be_ones_a_kubelet_cannot_set_on_itself() {
    let mut spec = valid();
    spec.node_selector.insert(
        "node-restriction.kubernetes.io/runner-pool".into(),
        "ci".into(),
    );
    assert!(
        validate_policy(&spec).is_empty(),
        "{:?}",
        validate_policy(&spec)
    );
    for key in ["runner-manager.dev/pool", "pool", "kubernetes.io/arch"] {
        let mut spec = valid();
        spec.node_selector.insert(key.into(), "ci".into());
        let problems = validate_policy(&spec);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].field, format!("spec.nodeSelector.{key}"));
        assert!(
            problems[0]
                .message
                .contains("node-restriction.kubernetes.io/"),
            "the fix is named: {}",
            problems[0].message
        );
    }
}

#[test]
fn runner_env_names_the_line_never_the_value() {
    let ok = parse_runner_env("# comment\n\nFOO=bar\nEMPTY=\nPATHY=/a=b\n").unwrap();
    assert_eq!(ok.get("PATHY").map(String::as_str), Some("/a=b"));
    assert_eq!(ok.len(), 3);
    let err = parse_runner_env(
        "GOOD=1\nnot a line\n1BAD=x\nACTIONS_RUNNER_INPUT_JITCONFIG=s3cr3t\nGOOD=2\n",
    )
    .unwrap_err();
    let lines: Vec<usize> = err.iter().map(|p| p.line).collect();
    assert_eq!(lines, [2, 3, 4, 5]);
    assert!(err.iter().all(|p| !p.message.contains("s3cr3t")));
}
